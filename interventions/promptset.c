/* promptset.c — a caller's prompt set (promptset.h): JSON lines or a JSON list in, checked against the
 * model, out as the grid engine's one-shift prompt set. */
#define _POSIX_C_SOURCE 200809L
#include "interventions/promptset.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fileio.h"

void ps_promptset_free(ps_promptset *s) {
    free(s->tokens);
    free(s->query);
    free(s->answer);
    free(s->residue);
    free(s->alt);
    free(s->needle);
    memset(s, 0, sizeof *s);
}

/* Room for n prompts of T tokens (the columns grow as records come). */
static int grow(ps_promptset *s, int64_t *cap, int64_t need, int with_alt, int with_needle, ps_error *err) {
    if (need <= *cap) return 0;
    int64_t c = *cap ? 2 * *cap : 64;
    while (c < need) c *= 2;
    int32_t *t = realloc(s->tokens, (size_t)(c * s->T) * sizeof *t);
    if (t) s->tokens = t;
    int64_t *q = realloc(s->query, (size_t)c * sizeof *q);
    if (q) s->query = q;
    int64_t *a = realloc(s->answer, (size_t)c * sizeof *a);
    if (a) s->answer = a;
    int64_t *r = realloc(s->residue, (size_t)c * sizeof *r);
    if (r) s->residue = r;
    int64_t *al = with_alt ? realloc(s->alt, (size_t)c * sizeof *al) : NULL;
    if (al) s->alt = al;
    int64_t *nd = with_needle ? realloc(s->needle, (size_t)c * sizeof *nd) : NULL;
    if (nd) s->needle = nd;
    if (!t || !q || !a || !r || (with_alt && !al) || (with_needle && !nd)) return ps_fail(err, "out of memory for %lld prompts of %lld tokens", (long long)c, (long long)s->T);
    *cap = c;
    return 0;
}

/* One integer member: present, an integer, >= lo. */
static int int_key(const json_t *o, const char *key, int64_t lo, int64_t *v, const char *where, ps_error *err) {
    json_t *x = json_object_get(o, key);
    if (!x) return ps_fail(err, "%s: missing key \"%s\"", where, key);
    if (!json_is_integer(x)) return ps_fail(err, "%s: key \"%s\" is not an integer", where, key);
    *v = (int64_t)json_integer_value(x);
    if (*v < lo) return ps_fail(err, "%s: key \"%s\" = %lld must be >= %lld", where, key, (long long)*v, (long long)lo);
    return 0;
}

static const char *const KEYS[] = {"tokens", "query", "answer", "residue", "alt", "needle", NULL};

/* Record i (where: "FILE line L" or "what item I") into s. */
static int add_record(ps_promptset *s, int64_t *cap, const json_t *o, const char *where, ps_error *err) {
    if (!json_is_object(o)) return ps_fail(err, "%s: not a JSON object ({\"tokens\": [...], \"query\": t, \"answer\": id, \"residue\": r})", where);
    const char *k;
    json_t *x;
    json_object_foreach((json_t *)o, k, x) {
        int known = 0;
        for (int i = 0; KEYS[i]; i++) known |= !strcmp(k, KEYS[i]);
        if (!known) return ps_fail(err, "%s: unknown key \"%s\" (the keys: tokens, query, answer, residue, alt, needle)", where, k);
    }
    json_t *tok = json_object_get(o, "tokens");
    if (!tok) return ps_fail(err, "%s: missing key \"tokens\"", where);
    if (!json_is_array(tok) || json_array_size(tok) == 0) return ps_fail(err, "%s: key \"tokens\" is not a non-empty list of token ids", where);
    int64_t T = (int64_t)json_array_size(tok), i = s->N;
    int has_alt = json_object_get(o, "alt") != NULL, has_needle = json_object_get(o, "needle") != NULL;
    if (i == 0) s->T = T;
    else if (T != s->T)
        return ps_fail(err, "%s: key \"tokens\": %lld tokens, but the first prompt has %lld (one length per set)", where, (long long)T,
                       (long long)s->T);
    if (i > 0 && has_alt != (s->alt != NULL))
        return ps_fail(err, "%s: key \"alt\" %s, but the first prompt has %s (every prompt or none)", where, has_alt ? "given" : "missing",
                       has_alt ? "none" : "one");
    if (i > 0 && has_needle != (s->needle != NULL))
        return ps_fail(err, "%s: key \"needle\" %s, but the first prompt has %s (every prompt or none)", where,
                       has_needle ? "given" : "missing", has_needle ? "none" : "one");
    if (grow(s, cap, i + 1, has_alt, has_needle, err)) return -1;
    for (int64_t t = 0; t < T; t++) {
        json_t *v = json_array_get(tok, (size_t)t);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
            return ps_fail(err, "%s: key \"tokens\": item %lld is not a token id (a non-negative integer)", where, (long long)t);
        s->tokens[i * T + t] = (int32_t)json_integer_value(v);
    }
    if (int_key(o, "query", 0, &s->query[i], where, err) || int_key(o, "answer", 0, &s->answer[i], where, err) ||
        int_key(o, "residue", 0, &s->residue[i], where, err) || (has_alt && int_key(o, "alt", 0, &s->alt[i], where, err)) ||
        (has_needle && int_key(o, "needle", 0, &s->needle[i], where, err)))
        return -1;
    if (s->query[i] >= T)
        return ps_fail(err, "%s: key \"query\" = %lld is past the tokens (0 <= query < %lld)", where, (long long)s->query[i], (long long)T);
    if (has_needle && s->needle[i] > s->query[i])
        return ps_fail(err, "%s: key \"needle\" = %lld is after the query (0 <= needle <= query = %lld)", where, (long long)s->needle[i],
                       (long long)s->query[i]);
    if (s->residue[i] > s->max_residue) s->max_residue = s->residue[i];
    s->N = i + 1;
    return 0;
}

/* Each non-blank line of the JSON-lines file `path` parsed and handed to add(user, &cap, object, "PATH line L", err),
 * in order, until one fails. */
static int each_json_line(const char *path, int (*add)(void *, int64_t *, const json_t *, const char *, ps_error *), void *user,
                          ps_error *err) {
    char *data = NULL;
    size_t len = 0;
    if (ps_read_file(path, (size_t)1 << 34, &data, &len, err)) return -1;
    int64_t cap = 0, line = 0;
    int rc = 0;
    for (char *p = data, *next; p && p < data + len && !rc; p = next) {
        char *nl = memchr(p, '\n', (size_t)(data + len - p));
        next = nl ? nl + 1 : NULL;
        if (nl) *nl = '\0';
        line++;
        char *q = p;
        while (*q == ' ' || *q == '\t' || *q == '\r') q++;
        if (!*q) continue;
        char where[600];
        snprintf(where, sizeof where, "%s line %lld", path, (long long)line);
        json_error_t je;
        json_t *o = json_loads(p, JSON_REJECT_DUPLICATES, &je);
        if (!o) rc = ps_fail(err, "%s: not JSON: %s", where, je.text);
        else rc = add(user, &cap, o, where, err);
        json_decref(o);
    }
    free(data);
    return rc;
}

static int add_record_cb(void *s, int64_t *cap, const json_t *o, const char *where, ps_error *err) {
    return add_record(s, cap, o, where, err);
}

int ps_promptset_read(const char *path, ps_promptset *s, ps_error *err) {
    memset(s, 0, sizeof *s);
    snprintf(s->source, sizeof s->source, "%s", path);
    int rc = each_json_line(path, add_record_cb, s, err);
    if (!rc && s->N == 0) rc = ps_fail(err, "%s: no prompts (one JSON object a line)", path);
    if (rc) ps_promptset_free(s);
    return rc;
}

int ps_promptset_from_json(const json_t *list, const char *what, ps_promptset *s, ps_error *err) {
    memset(s, 0, sizeof *s);
    snprintf(s->source, sizeof s->source, "request");
    if (!json_is_array(list) || json_array_size(list) == 0)
        return ps_fail(err, "%s: expected a non-empty list of prompts ({\"tokens\": [...], \"query\": t, \"answer\": id, \"residue\": r})", what);
    int64_t cap = 0;
    for (size_t i = 0; i < json_array_size(list); i++) {
        char where[600];
        snprintf(where, sizeof where, "%s: item %zu", what, i);
        if (add_record(s, &cap, json_array_get(list, i), where, err)) {
            ps_promptset_free(s);
            return -1;
        }
    }
    return 0;
}

int ps_promptset_check(const ps_promptset *s, int64_t vocab, int64_t max_pos, int64_t *P, ps_error *err) {
    const char *src = s->source;
    if (s->T > max_pos)
        return ps_fail(err, "%s: the prompts have %lld tokens, more than the model's %lld", src, (long long)s->T, (long long)max_pos);
    for (int64_t i = 0; i < s->N; i++) {
        for (int64_t t = 0; t < s->T; t++)
            if (s->tokens[i * s->T + t] >= vocab)
                return ps_fail(err, "%s: prompt %lld: key \"tokens\": id %d at position %lld is outside the vocabulary (%lld ids)", src,
                               (long long)i, s->tokens[i * s->T + t], (long long)t, (long long)vocab);
        if (s->answer[i] >= vocab)
            return ps_fail(err, "%s: prompt %lld: key \"answer\" = %lld is outside the vocabulary (%lld ids)", src, (long long)i,
                           (long long)s->answer[i], (long long)vocab);
        if (s->alt && s->alt[i] >= vocab)
            return ps_fail(err, "%s: prompt %lld: key \"alt\" = %lld is outside the vocabulary (%lld ids)", src, (long long)i,
                           (long long)s->alt[i], (long long)vocab);
    }
    if (*P <= 0) *P = s->max_residue + 1;
    else if (s->max_residue >= *P)
        for (int64_t i = 0; i < s->N; i++)
            if (s->residue[i] >= *P)
                return ps_fail(err, "%s: prompt %lld: key \"residue\" = %lld is not below the period %lld", src, (long long)i,
                               (long long)s->residue[i], (long long)*P);
    return 0;
}

int ps_promptset_shifted(const ps_promptset *s, int64_t P, ps_shifted *out, ps_error *err) {
    memset(out, 0, sizeof *out);
    int64_t N = s->N, T = s->T, mq = s->alt ? 2 : 1;
    if (ps_batch_alloc(&out->b, N, T, mq, err)) return -1;
    out->residue = malloc((size_t)(N * mq) * sizeof *out->residue);
    if (!out->residue) {
        ps_shifted_free(out);
        return ps_fail(err, "out of memory for the residues of %lld prompts", (long long)N);
    }
    out->p = 0;
    out->P = P;
    memcpy(out->b.tokens, s->tokens, (size_t)(N * T) * sizeof *s->tokens);
    for (int64_t i = 0; i < N * T; i++) out->b.targets[i] = -1;
    for (int64_t i = 0; i < N; i++) {
        out->b.n_q[i] = mq;
        for (int64_t q = 0; q < mq; q++) {
            int32_t id = (int32_t)(q == 0 ? s->answer[i] : s->alt[i]);
            out->b.queries[i * mq + q] =
                (ps_query){.key_pos = s->needle ? s->needle[i] : s->query[i], .answer_pos = s->query[i], .answer_len = 1, .answer_src = -1, .answer_id = id};
            out->residue[i * mq + q] = s->residue[i] + q * P; /* the alt query: outside [0, P) */
        }
        out->b.targets[i * T + s->query[i]] = (int32_t)s->answer[i];
    }
    return 0;
}

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++) h = (h ^ c[i]) * 0x100000001b3ULL;
    return h;
}

json_t *ps_promptset_json(const ps_promptset *s) {
    uint64_t h = 0xcbf29ce484222325ULL;
    h = fnv(h, s->tokens, (size_t)(s->N * s->T) * sizeof *s->tokens);
    h = fnv(h, s->query, (size_t)s->N * sizeof *s->query);
    h = fnv(h, s->answer, (size_t)s->N * sizeof *s->answer);
    h = fnv(h, s->residue, (size_t)s->N * sizeof *s->residue);
    if (s->alt) h = fnv(h, s->alt, (size_t)s->N * sizeof *s->alt);
    if (s->needle) h = fnv(h, s->needle, (size_t)s->N * sizeof *s->needle);
    char hex[17];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)h);
    json_t *o = json_pack("{s:s, s:I, s:I, s:b, s:s}", "source", s->source, "n", (json_int_t)s->N, "T", (json_int_t)s->T, "alt",
                          s->alt != NULL, "tokens_hash", hex);
    if (o && s->needle) json_object_set_new(o, "needle", json_true());
    return o;
}

void ps_promptset_logit_diff(const double *lp, const int32_t *rho, int64_t n_items, int64_t P, double *sum, int64_t *n) {
    for (int64_t i = 1; i < n_items; i++)
        if (rho[i] >= P && rho[i] < 2 * P && rho[i - 1] == rho[i] - P) {
            sum[rho[i] - P] += lp[i - 1] - lp[i];
            n[rho[i] - P]++;
        }
}


void ps_promptset_put_logit_diff(json_t *residues, const double *sum, const int64_t *n, int64_t P, const double *base, double *mean) {
    const char *key = "mean_logit_diff", *dkey = "delta_logit_diff";
    for (int64_t r = 0; r < P; r++) {
        double m = n[r] ? sum[r] / (double)n[r] : 0.0;
        if (mean) mean[r] = m;
        json_t *o = json_array_get(residues, (size_t)r);
        if (!o) continue;
        json_object_set_new(o, key, n[r] ? json_real(m) : json_null());
        if (base) json_object_set_new(o, dkey, n[r] ? json_real(m - base[r]) : json_null());
    }
}

int ps_promptset_residue_logit_diff(json_t *residues, const double *lp, const int32_t *rho, int64_t n_items, int64_t P,
                                    const double *base, double *mean, ps_error *err) {
    int any = 0;
    for (int64_t i = 0; i < n_items && !any; i++) any = rho[i] >= P && rho[i] < 2 * P;
    if (!any) return 0;
    double *sum = calloc((size_t)P, sizeof *sum);
    int64_t *n = calloc((size_t)P, sizeof *n);
    if (!sum || !n) {
        free(sum);
        free(n);
        return ps_fail(err, "out of memory for %lld residues", (long long)P);
    }
    ps_promptset_logit_diff(lp, rho, n_items, P, sum, n);
    ps_promptset_put_logit_diff(residues, sum, n, P, base, mean);
    free(sum);
    free(n);
    return 1;
}

int ps_promptset_from_shifts(const ps_shifted *const *shifts, int n_shifts, const int32_t *token_map, int64_t n_map, int32_t pad,
                             ps_promptset *out, ps_error *err) {
    memset(out, 0, sizeof *out);
    snprintf(out->source, sizeof out->source, "sweep");
    int64_t T = 0, n = 0;
    for (int k = 0; k < n_shifts; k++) {
        const ps_shifted *s = shifts[k];
        if (s->b.T > T) T = s->b.T;
        for (int64_t i = 0; i < s->b.B; i++)
            for (int64_t q = 0; q < s->b.n_q[i]; q++) {
                const ps_query *qq = &s->b.queries[i * s->b.max_q + q];
                if (s->residue[i * s->b.max_q + q] < 0) continue;
                if (qq->answer_len != 1)
                    return ps_fail(err, "a prompt set scores one answer token per prompt; this task's answers have %lld tokens",
                                   (long long)qq->answer_len);
                n++;
            }
    }
    out->N = n, out->T = T;
    out->tokens = malloc((size_t)(n * T) * sizeof *out->tokens);
    out->query = malloc((size_t)n * sizeof *out->query);
    out->answer = malloc((size_t)n * sizeof *out->answer);
    out->residue = malloc((size_t)n * sizeof *out->residue);
    out->needle = malloc((size_t)n * sizeof *out->needle);
    if (!out->tokens || !out->query || !out->answer || !out->residue || !out->needle) {
        ps_promptset_free(out);
        return ps_fail(err, "out of memory for %lld prompts of %lld tokens", (long long)n, (long long)T);
    }
#define MAP(x) (token_map ? ((x) >= 0 && (x) < n_map ? token_map[(x)] : -1) : (x))
    int64_t r = 0;
    for (int k = 0; k < n_shifts; k++) {
        const ps_shifted *s = shifts[k];
        for (int64_t i = 0; i < s->b.B; i++) {
            const int32_t *seq = s->b.tokens + i * s->b.T;
            for (int64_t q = 0; q < s->b.n_q[i]; q++) {
                const ps_query *qq = &s->b.queries[i * s->b.max_q + q];
                int64_t rho = s->residue[i * s->b.max_q + q];
                if (rho < 0) continue;
                int32_t *dst = out->tokens + r * T;
                for (int64_t t = 0; t < T; t++) dst[t] = MAP(t < s->b.T ? seq[t] : pad); /* padded after: rows <= query unchanged */
                out->query[r] = qq->answer_pos;
                out->answer[r] = MAP(ps_query_answer(qq, seq, 0));
                out->residue[r] = rho;
                out->needle[r] = qq->key_pos; /* t_K: the position whose residue the query carries */
                if (rho > out->max_residue) out->max_residue = rho;
                r++;
            }
        }
    }
#undef MAP
    for (int64_t i = 0; i < n * T; i++)
        if (out->tokens[i] < 0) {
            ps_promptset_free(out);
            return ps_fail(err, "a task token outside the task file's ids");
        }
    return 0;
}

int ps_promptset_save(const ps_promptset *s, const char *path, ps_error *err) {
    ps_atomic_file af;
    if (ps_atomic_open(&af, path, err)) return -1;
    for (int64_t i = 0; i < s->N; i++) {
        fputs("{\"tokens\": [", af.f);
        for (int64_t t = 0; t < s->T; t++) fprintf(af.f, "%s%d", t ? ", " : "", s->tokens[i * s->T + t]);
        fprintf(af.f, "], \"query\": %lld, \"answer\": %lld, \"residue\": %lld", (long long)s->query[i], (long long)s->answer[i],
                (long long)s->residue[i]);
        if (s->alt) fprintf(af.f, ", \"alt\": %lld", (long long)s->alt[i]);
        if (s->needle) fprintf(af.f, ", \"needle\": %lld", (long long)s->needle[i]);
        fputs("}\n", af.f);
    }
    return ps_atomic_commit(&af, err);
}

/* ---- token sets: activation patching's corrupt tokens ---- */

void ps_token_set_free(ps_token_set *s) {
    free(s->tokens);
    memset(s, 0, sizeof *s);
}

/* One record (a prompt-set record with "tokens", or a bare list of ids) as row N of s (where: "FILE line L" or
 * "what: item I"). */
static int add_tokens(ps_token_set *s, int64_t *cap, const json_t *o, const char *where, ps_error *err) {
    const json_t *tok = o;
    const char *key = json_is_object(o) ? "key \"tokens\"" : "the record";
    if (json_is_object(o)) {
        const char *k;
        json_t *x;
        json_object_foreach((json_t *)o, k, x) {
            int known = 0;
            for (int i = 0; KEYS[i]; i++) known |= !strcmp(k, KEYS[i]);
            if (!known) return ps_fail(err, "%s: unknown key \"%s\" (a record's tokens are its key \"tokens\")", where, k);
        }
        if (!(tok = json_object_get(o, "tokens"))) return ps_fail(err, "%s: missing key \"tokens\"", where);
    }
    if (!json_is_array(tok) || json_array_size(tok) == 0)
        return ps_fail(err, "%s: %s is not a non-empty list of token ids ({\"tokens\": [...]} a line)", where, key);
    int64_t T = (int64_t)json_array_size(tok), i = s->N;
    if (i == 0) s->T = T;
    else if (T != s->T)
        return ps_fail(err, "%s: %s: %lld tokens, but the first has %lld (one length per set)", where, key, (long long)T, (long long)s->T);
    if (i + 1 > *cap) {
        int64_t c = *cap ? 2 * *cap : 64;
        int32_t *t = realloc(s->tokens, (size_t)(c * T) * sizeof *t);
        if (!t) return ps_fail(err, "out of memory for %lld sequences of %lld tokens", (long long)c, (long long)T);
        s->tokens = t, *cap = c;
    }
    for (int64_t t = 0; t < T; t++) {
        json_t *v = json_array_get(tok, (size_t)t);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
            return ps_fail(err, "%s: %s: item %lld is not a token id (a non-negative integer)", where, key, (long long)t);
        s->tokens[i * T + t] = (int32_t)json_integer_value(v);
    }
    s->N = i + 1;
    return 0;
}

static int add_tokens_cb(void *s, int64_t *cap, const json_t *o, const char *where, ps_error *err) {
    return add_tokens(s, cap, o, where, err);
}

int ps_token_set_read(const char *path, ps_token_set *s, ps_error *err) {
    memset(s, 0, sizeof *s);
    snprintf(s->source, sizeof s->source, "%s", path);
    int rc = each_json_line(path, add_tokens_cb, s, err);
    if (!rc && s->N == 0) rc = ps_fail(err, "%s: no token sequences (one JSON object {\"tokens\": [...]} a line)", path);
    if (rc) ps_token_set_free(s);
    return rc;
}

int ps_token_set_from_json(const json_t *list, const char *what, ps_token_set *s, ps_error *err) {
    memset(s, 0, sizeof *s);
    snprintf(s->source, sizeof s->source, "request");
    if (!json_is_array(list) || json_array_size(list) == 0)
        return ps_fail(err, "%s: expected a non-empty list of token lists [N, T]", what);
    int64_t cap = 0;
    for (size_t i = 0; i < json_array_size(list); i++) {
        char where[600];
        snprintf(where, sizeof where, "%s: item %zu", what, i);
        if (add_tokens(s, &cap, json_array_get(list, i), where, err)) {
            ps_token_set_free(s);
            return -1;
        }
    }
    return 0;
}

int ps_token_set_check(const ps_token_set *s, int64_t N, int64_t T, const char *what, int64_t vocab, ps_error *err) {
    if (s->N != N)
        return ps_fail(err, "%s: %lld token sequences, but %s are %lld (one corrupt sequence per prompt, in order)", s->source,
                       (long long)s->N, what, (long long)N);
    if (s->T != T)
        return ps_fail(err, "%s: key \"tokens\": %lld tokens, but %s have %lld (the same positions)", s->source, (long long)s->T, what,
                       (long long)T);
    for (int64_t i = 0; i < N * T; i++)
        if (s->tokens[i] >= vocab)
            return ps_fail(err, "%s: sequence %lld: key \"tokens\": id %d at position %lld is outside the vocabulary (%lld ids)", s->source,
                           (long long)(i / T), s->tokens[i], (long long)(i % T), (long long)vocab);
    return 0;
}

json_t *ps_token_set_json(const ps_token_set *s) {
    uint64_t h = fnv(0xcbf29ce484222325ULL, s->tokens, (size_t)(s->N * s->T) * sizeof *s->tokens);
    char hex[17];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)h);
    return json_pack("{s:s, s:I, s:I, s:s}", "source", s->source, "n", (json_int_t)s->N, "T", (json_int_t)s->T, "tokens_hash", hex);
}
