#include "tasks/tasks.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"

static const char *const KEYS[] = {"kind",  "seq_len",   "n_keys",  "n_values",  "n_fillers", "n_pairs",   "key_len",
                                   "value_len", "n_context", "gap_min", "gap_max", "query_gap", "n_queries", "loss"};

int ps_task_from_json(json_t *o, const char *src, ps_task *t, ps_error *err) {
    memset(t, 0, sizeof *t);
    t->key_len = 1;
    t->value_len = 1;
    t->n_queries = 1;
    if (!json_is_object(o)) return ps_fail(err, "%s: task must be an object", src);
    const char *k;
    json_t *v;
    int have_kind = 0;
    json_object_foreach(o, k, v) {
        size_t i = 0;
        while (i < sizeof KEYS / sizeof KEYS[0] && strcmp(KEYS[i], k)) i++;
        if (i == sizeof KEYS / sizeof KEYS[0])
            return ps_fail(err,
                           "%s: unknown key \"task.%s\" (valid: kind, seq_len, n_keys, n_values, n_fillers, n_pairs, key_len, "
                           "value_len, n_context, gap_min, gap_max, query_gap, n_queries, loss)",
                           src, k);
        if (!strcmp(k, "kind")) {
            const char *s = json_is_string(v) ? json_string_value(v) : "";
            if (!strcmp(s, "kv-retrieval")) t->kind = PS_TASK_KV;
            else if (!strcmp(s, "bigram-induction")) t->kind = PS_TASK_BIGRAM;
            else return ps_fail(err, "%s: key \"task.kind\" must be \"kv-retrieval\" or \"bigram-induction\"", src);
            have_kind = 1;
        } else if (!strcmp(k, "loss")) {
            const char *s = json_is_string(v) ? json_string_value(v) : "";
            if (!strcmp(s, "answers")) t->loss_all = 0;
            else if (!strcmp(s, "all")) t->loss_all = 1;
            else return ps_fail(err, "%s: key \"task.loss\" must be \"answers\" or \"all\"", src);
        } else {
            if (!json_is_integer(v)) return ps_fail(err, "%s: key \"task.%s\" must be a JSON integer", src, k);
            int64_t x = (int64_t)json_integer_value(v);
            int64_t *slots[] = {NULL,          &t->seq_len, &t->n_keys,    &t->n_values, &t->n_fillers,
                                &t->n_pairs,   &t->key_len, &t->value_len, &t->n_context, &t->gap_min,
                                &t->gap_max,   &t->query_gap, &t->n_queries};
            *slots[i] = x;
        }
    }
    if (!have_kind) return ps_fail(err, "%s: missing key \"task.kind\"", src);
    return 0;
}

int ps_task_validate(const ps_task *t, int64_t vocab_size, int64_t max_seq_len, const char *src, ps_error *err) {
    const struct { const char *name; int64_t v, lo; } pos[] = {
        {"seq_len", t->seq_len, 2},     {"n_fillers", t->n_fillers, 1}, {"gap_min", t->gap_min, 0},
        {"gap_max", t->gap_max, 0},     {"query_gap", t->query_gap, 0}, {"n_queries", t->n_queries, 1},
        {"n_keys", t->n_keys, 1},
    };
    for (size_t i = 0; i < sizeof pos / sizeof pos[0]; i++)
        if (pos[i].v < pos[i].lo || pos[i].v > ((int64_t)1 << 30))
            return ps_fail(err, "%s: key \"task.%s\" must be in [%lld, 2^30], got %lld", src, pos[i].name,
                           (long long)pos[i].lo, (long long)pos[i].v);
    if (t->gap_max < t->gap_min)
        return ps_fail(err, "%s: key \"task.gap_max\" (%lld) is below task.gap_min (%lld)", src, (long long)t->gap_max,
                       (long long)t->gap_min);
    int64_t worst;
    if (t->kind == PS_TASK_KV) {
        if (t->n_values < 1) return ps_fail(err, "%s: key \"task.n_values\" must be >= 1", src);
        if (t->n_pairs < 1) return ps_fail(err, "%s: key \"task.n_pairs\" must be >= 1", src);
        if (t->key_len < 1 || t->value_len < 1) return ps_fail(err, "%s: keys \"task.key_len\" and \"task.value_len\" must be >= 1", src);
        if (t->n_queries > t->n_pairs)
            return ps_fail(err, "%s: key \"task.n_queries\" (%lld) exceeds task.n_pairs (%lld): queries use distinct pairs",
                           src, (long long)t->n_queries, (long long)t->n_pairs);
        double distinct = pow((double)t->n_keys, (double)t->key_len);
        if (distinct < 2.0 * (double)t->n_pairs)
            return ps_fail(err, "%s: key \"task.n_keys\" (%lld) is too small for %lld distinct keys of %lld tokens", src,
                           (long long)t->n_keys, (long long)t->n_pairs, (long long)t->key_len);
        worst = 1 + (t->n_pairs + 1) * t->gap_max + t->n_pairs * (t->key_len + t->value_len) + t->query_gap +
                t->n_queries * (1 + t->key_len + t->value_len);
    } else {
        if (t->n_context < 2) return ps_fail(err, "%s: key \"task.n_context\" must be >= 2", src);
        if (t->n_keys < t->n_context)
            return ps_fail(err, "%s: key \"task.n_keys\" (%lld) must be >= task.n_context (%lld) for distinct context tokens",
                           src, (long long)t->n_keys, (long long)t->n_context);
        if (t->n_queries > t->n_context - 1)
            return ps_fail(err, "%s: key \"task.n_queries\" (%lld) exceeds n_context - 1 distinct targets", src,
                           (long long)t->n_queries);
        worst = 1 + t->gap_max + t->n_context + t->query_gap + t->n_queries;
    }
    if (worst > t->seq_len)
        return ps_fail(err, "%s: key \"task.seq_len\" (%lld) is too short: the task needs up to %lld tokens", src,
                       (long long)t->seq_len, (long long)worst);
    if (t->seq_len > max_seq_len)
        return ps_fail(err, "%s: key \"task.seq_len\" (%lld) exceeds the model's max_seq_len (%lld) by %lld", src,
                       (long long)t->seq_len, (long long)max_seq_len, (long long)(t->seq_len - max_seq_len));
    if (ps_task_vocab_needed(t) > vocab_size)
        return ps_fail(err, "%s: the task needs %lld token ids (BOS, marker, keys, values, fillers) but vocab_size is %lld",
                       src, (long long)ps_task_vocab_needed(t), (long long)vocab_size);
    return 0;
}

json_t *ps_task_to_json(const ps_task *t) {
    json_t *o = json_object();
    json_object_set_new(o, "kind", json_string(t->kind == PS_TASK_KV ? "kv-retrieval" : "bigram-induction"));
    int64_t vals[] = {t->seq_len, t->n_keys, t->n_values, t->n_fillers, t->n_pairs, t->key_len, t->value_len,
                      t->n_context, t->gap_min, t->gap_max, t->query_gap, t->n_queries};
    for (int i = 0; i < 12; i++) json_object_set_new(o, KEYS[i + 1], json_integer(vals[i]));
    json_object_set_new(o, "loss", json_string(t->loss_all ? "all" : "answers"));
    return o;
}

static void fill(const ps_task *t, ps_rng *r, int32_t *dst, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = (int32_t)(ps_task_fill0(t) + ps_rng_below(r, t->n_fillers));
}

/* Partial Fisher–Yates: the first k entries of perm become a uniform sample without replacement. */
static void sample_distinct(ps_rng *r, int64_t *perm, int64_t n, int64_t k) {
    for (int64_t i = 0; i < n; i++) perm[i] = i;
    for (int64_t i = 0; i < k; i++) {
        int64_t j = i + ps_rng_below(r, n - i), x = perm[i];
        perm[i] = perm[j];
        perm[j] = x;
    }
}

/* scratch: the generators' working arrays, sized by scratch_count (int64 elements) */
static int64_t scratch_count(const ps_task *t) {
    if (t->kind == PS_TASK_KV) return t->n_pairs * (t->key_len + t->value_len) + 2 * t->n_pairs; /* keys, vals, kpos, perm */
    return t->n_keys > t->n_context ? t->n_keys : t->n_context;                                  /* perm */
}

static void gen_kv(const ps_task *t, ps_rng *r, int64_t *scratch, int32_t *tok, int32_t *tgt, ps_query *q, int64_t *nq) {
    int64_t T = t->seq_len, kl = t->key_len, vl = t->value_len, P = t->n_pairs, pos = 0;
    int64_t *kpos = scratch, *perm = scratch + P;
    int32_t *keys = (int32_t *)(scratch + 2 * P), *vals = keys + P * kl;
    for (int64_t p = 0; p < P; p++) {
        int dup;
        do { /* distinct keys within the sequence */
            for (int64_t i = 0; i < kl; i++) keys[p * kl + i] = (int32_t)(ps_task_key0(t) + ps_rng_below(r, t->n_keys));
            dup = 0;
            for (int64_t o = 0; o < p && !dup; o++) dup = !memcmp(keys + o * kl, keys + p * kl, (size_t)kl * sizeof(int32_t));
        } while (dup);
        for (int64_t i = 0; i < vl; i++) vals[p * vl + i] = (int32_t)(ps_task_val0(t) + ps_rng_below(r, t->n_values));
    }
    tok[pos++] = PS_BOS;
    for (int64_t p = 0; p < P; p++) {
        int64_t g = t->gap_min + ps_rng_below(r, t->gap_max - t->gap_min + 1);
        fill(t, r, tok + pos, g);
        pos += g;
        kpos[p] = pos;
        memcpy(tok + pos, keys + p * kl, (size_t)kl * sizeof(int32_t));
        pos += kl;
        memcpy(tok + pos, vals + p * vl, (size_t)vl * sizeof(int32_t));
        pos += vl;
    }
    int64_t qlen = t->n_queries * (1 + kl + vl), gap = T - pos - qlen; /* >= query_gap by validation */
    fill(t, r, tok + pos, gap);
    pos += gap;
    sample_distinct(r, perm, P, t->n_queries);
    for (int64_t i = 0; i < t->n_queries; i++) {
        int64_t p = perm[i];
        tok[pos++] = PS_MARKER;
        memcpy(tok + pos, keys + p * kl, (size_t)kl * sizeof(int32_t));
        pos += kl;
        q[i] = (ps_query){.key_pos = kpos[p], .answer_pos = pos - 1, .answer_len = vl, .answer_src = pos};
        memcpy(tok + pos, vals + p * vl, (size_t)vl * sizeof(int32_t));
        for (int64_t k = 0; k < vl; k++) tgt[pos - 1 + k] = vals[p * vl + k];
        pos += vl;
    }
    *nq = t->n_queries;
}

static void gen_bigram(const ps_task *t, ps_rng *r, int64_t *perm, int32_t *tok, int32_t *tgt, ps_query *q, int64_t *nq) {
    int64_t T = t->seq_len, C = t->n_context, pos = 0;
    tok[pos++] = PS_BOS;
    int64_t g = t->gap_min + ps_rng_below(r, t->gap_max - t->gap_min + 1);
    fill(t, r, tok + pos, g);
    pos += g;
    int64_t ctx0 = pos;
    sample_distinct(r, perm, t->n_keys, C);
    for (int64_t i = 0; i < C; i++) tok[pos++] = (int32_t)(ps_task_key0(t) + perm[i]);
    int64_t gap = T - pos - t->n_queries;
    fill(t, r, tok + pos, gap);
    pos += gap;
    sample_distinct(r, perm, C - 1, t->n_queries); /* earlier occurrences 0..C-2 have a successor */
    for (int64_t i = 0; i < t->n_queries; i++) {
        int64_t p = ctx0 + perm[i];
        tok[pos] = tok[p];
        tgt[pos] = tok[p + 1];
        q[i] = (ps_query){.key_pos = p, .answer_pos = pos, .answer_len = 1, .answer_src = p + 1};
        pos++;
    }
    *nq = t->n_queries;
}

int ps_task_generate(const ps_task *t, uint64_t seed, ps_batch *b, ps_error *err) {
    int64_t *scratch = malloc((size_t)(scratch_count(t) + 1) * sizeof(int64_t));
    if (!scratch) return ps_fail(err, "out of memory generating a batch of the task (%lld scratch entries)", (long long)scratch_count(t));
    for (int64_t s = 0; s < b->B; s++) {
        /* one stream per sequence: sequence s of a batch does not depend on B */
        ps_rng r;
        ps_rng_seed(&r, seed * 0x9e3779b97f4a7c15ULL + (uint64_t)s);
        int32_t *tok = b->tokens + s * b->T, *tgt = b->targets + s * b->T;
        for (int64_t i = 0; i < b->T; i++) tgt[i] = -1;
        if (t->kind == PS_TASK_KV) gen_kv(t, &r, scratch, tok, tgt, b->queries + s * b->max_q, &b->n_q[s]);
        else gen_bigram(t, &r, scratch, tok, tgt, b->queries + s * b->max_q, &b->n_q[s]);
        if (t->loss_all) { /* next-token targets everywhere, answers where a query asks */
            for (int64_t i = 0; i + 1 < b->T; i++) tgt[i] = tok[i + 1];
            for (int64_t qi = 0; qi < b->n_q[s]; qi++) {
                const ps_query *q = &b->queries[s * b->max_q + qi];
                for (int64_t k = 0; k < q->answer_len; k++) tgt[q->answer_pos + k] = tok[q->answer_src + k];
            }
        }
    }
    free(scratch);
    return 0;
}
