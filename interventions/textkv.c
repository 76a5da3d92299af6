/* textkv.c — the phase sweep's text key-value prompts (textkv.h). */
#include "interventions/textkv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ps_textkv_shift_fill(ps_sweep_mode mode, int64_t P, int64_t p, int64_t *pre, int64_t *before, int64_t *after) {
    *pre = mode == PS_SWEEP_PAD ? p : 0;
    *before = mode == PS_SWEEP_MOVE ? p : 0;
    *after = mode == PS_SWEEP_MOVE ? P - 1 - p : 0;
}

int ps_textkv_shifted(const ps_textkv *kv, ps_sweep_mode mode, int64_t P, int64_t p, uint64_t seed, int64_t N,
                      int64_t max_seq_len, ps_shifted *out, ps_error *err) {
    memset(out, 0, sizeof *out);
    if (P < 1 || p < 0 || p >= P || N < 1) return ps_fail(err, "text-kv: shift %lld of period %lld", (long long)p, (long long)P);
    int64_t pre, before, after, nq = kv->n_queries;
    ps_textkv_shift_fill(mode, P, p, &pre, &before, &after);
    ps_ids *pr = calloc((size_t)N, sizeof *pr);
    ps_query *qs = malloc((size_t)(N * nq) * sizeof *qs);
    int rc = pr && qs ? 0 : ps_fail(err, "out of memory for %lld text-kv prompts", (long long)N);
    int64_t T = 0;
    for (int64_t i = 0; i < N && !rc; i++) {
        rc = ps_textkv_prompt(kv, ps_textkv_prompt_seed(seed, i), pre, before, after, &pr[i], qs + i * nq, err);
        T = pr[i].n > T ? pr[i].n : T;
    }
    if (!rc && T > max_seq_len)
        rc = ps_fail(err, "text-kv prompts of up to %lld tokens (shift %lld) exceed the model's max_seq_len %lld by %lld (use "
                          "fewer --pairs)",
                     (long long)T, (long long)p, (long long)max_seq_len, (long long)(T - max_seq_len));
    if (!rc) rc = ps_batch_alloc(&out->b, N, T, nq, err);
    if (!rc && !(out->residue = malloc((size_t)(N * nq) * sizeof *out->residue)))
        rc = ps_fail(err, "out of memory for the residues of %lld prompts", (long long)N);
    for (int64_t i = 0; i < N && !rc; i++) {
        int32_t *dst = out->b.tokens + i * T, pad = ps_textkv_pad(kv, &pr[i]);
        memcpy(dst, pr[i].v, (size_t)pr[i].n * sizeof *dst);
        for (int64_t t = pr[i].n; t < T; t++) dst[t] = pad;
        for (int64_t t = 0; t < T; t++) out->b.targets[i * T + t] = -1;
        out->b.n_q[i] = nq;
        for (int64_t k = 0; k < nq; k++) {
            ps_query q = qs[i * nq + k];
            out->b.queries[i * nq + k] = q;
            out->residue[i * nq + k] = mode == PS_SWEEP_MOVE && k > 0 ? -1 : q.key_pos % P;
            for (int64_t a = 0; a < q.answer_len; a++) out->b.targets[i * T + q.answer_pos + a] = dst[q.answer_src + a];
        }
    }
    out->p = p;
    out->P = P;
    if (pr)
        for (int64_t i = 0; i < N; i++) ps_ids_free(&pr[i]);
    free(pr);
    free(qs);
    if (rc) ps_shifted_free(out);
    return rc;
}


static int task_from_meta(const char *js, const char *dir, ps_textkv_task *t, ps_error *err) {
    if (!js) return 0;
    json_t *o = json_loads(js, 0, NULL);
    if (!o || !ps_textkv_task_is(o)) {
        json_decref(o);
        return 0;
    }
    char src[4200];
    snprintf(src, sizeof src, "%s/model.safetensors (phasescope.task)", dir);
    int rc = ps_textkv_task_from_json(o, src, NULL, t, err);
    json_decref(o);
    return rc ? -1 : 1;
}

int ps_textkv_checkpoint_task(const ps_model *m, const char *dir, ps_textkv_task *t, ps_error *err) {
    return task_from_meta(ps_model_get_meta(m, "phasescope.task"), dir, t, err);
}

int ps_textkv_runtime_task(const ps_runtime *rt, const char *dir, ps_textkv_task *t, ps_error *err) {
    return task_from_meta(rt->family->meta(rt, "phasescope.task"), dir, t, err);
}

static char *dup_str(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

int ps_textkv_set_open(ps_textkv_set *s, const ps_textkv_layout *lay, int64_t P, ps_error *err) {
    memset(s, 0, sizeof *s);
    ps_textkv_defaults(&s->kv);
    s->P = P;
    const char *tok_path = lay->tokenizer, *words_path = lay->words, *family = lay->family;
    int64_t pairs = 8;
    const ps_textkv_task *tr = lay->trained;
    if (!tok_path && tr) { /* the trained layout: tokenizer, words, values, pairs, queries, filler family */
        s->from_checkpoint = 1;
        tok_path = tr->tokenizer_path;
        if (!words_path) words_path = tr->words_path;
        if (!family) family = tr->filler_family;
        pairs = tr->n_pairs;
        s->value_words = tr->value_words;
        s->kv.value_digits = tr->value_digits;
        s->kv.n_queries = tr->n_queries;
    }
    if (!tok_path) {
        ps_fail(err, "--task text-kv needs --tokenizer (the model's tokenizer.json)");
        if (err) err->usage = 1;
        return -1;
    }
    if (lay->pairs > 0) pairs = lay->pairs;
    if (lay->values >= 0) s->value_words = lay->values;
    if (lay->value_digits > 0) s->kv.value_digits = lay->value_digits;
    if (P < 1) return ps_fail(err, "text-kv: period %lld must be >= 1", (long long)P);
    if (!words_path) words_path = PS_SOURCE_DIR "/data/text/kv_keys.txt";
    if (!(s->tok_path = dup_str(tok_path)) || !(s->words_path = dup_str(words_path))) {
        ps_textkv_set_free(s);
        return ps_fail(err, "out of memory");
    }
    int rc = ps_text_families_load(PS_SOURCE_DIR "/data/text/fillers.json", &s->fams, &s->n_fams, err);
    if (!rc && ps_text_family_find(s->fams, s->n_fams, family, &s->fam, err)) {
        if (err) err->usage = 1;
        rc = -1;
    }
    if (!rc) rc = ps_text_read_lines(words_path, &s->words, &s->n_words, err);
    if (!rc) rc = ps_tokenizer_load(tok_path, &s->tok, err);
    if (!rc) rc = ps_text_family_ids(s->fam, s->tok, P - 1, &s->fill, err);
    if (!rc && s->value_words && s->n_words < 2 * pairs)
        rc = ps_fail(err, "%s: %lld words for %lld pairs with --values words: keys and values must all differ (%lld words needed)",
                     words_path, (long long)s->n_words, (long long)pairs, (long long)(2 * pairs));
    if (!rc) {
        s->kv.keys = s->words;
        s->kv.n_keys = s->n_words;
        if (s->value_words) {
            s->kv.value_words = s->words;
            s->kv.n_value_words = s->n_words;
        }
        s->kv.n_pairs = pairs;
        s->kv.filler = s->fill.v;
        s->kv.n_filler = s->fill.n;
        if (ps_textkv_init(&s->kv, s->tok, err)) rc = ps_fail_prefix(err, "%s: ", words_path);
    }
    if (rc) ps_textkv_set_free(s);
    return rc;
}

void ps_textkv_set_free(ps_textkv_set *s) {
    ps_textkv_free(&s->kv);
    ps_ids_free(&s->fill);
    ps_text_lines_free(s->words, s->n_words);
    ps_text_families_free(s->fams, s->n_fams);
    ps_tokenizer_free(s->tok);
    free(s->tok_path);
    free(s->words_path);
    memset(s, 0, sizeof *s);
}

int ps_textkv_set_prompt(const ps_textkv_set *s, ps_sweep_mode mode, int64_t p, uint64_t seed, int64_t i, ps_ids *out,
                         ps_query *q, int64_t *rho, ps_error *err) {
    int64_t pre, before, after;
    ps_textkv_shift_fill(mode, s->P, p, &pre, &before, &after);
    if (ps_textkv_prompt(&s->kv, ps_textkv_prompt_seed(seed, i), pre, before, after, out, q, err)) return -1;
    for (int64_t k = 0; k < s->kv.n_queries; k++) rho[k] = mode == PS_SWEEP_MOVE && k > 0 ? -1 : q[k].key_pos % s->P;
    return 0;
}

int64_t ps_textkv_set_prompt_len(const ps_textkv_set *s, const ps_query *q) {
    const ps_query *last = &q[s->kv.n_queries - 1];
    return last->answer_src + last->answer_len + s->kv.qe_ids.n;
}

json_t *ps_textkv_set_task_json(const ps_textkv_set *s, int64_t tmin, int64_t tmax) {
    json_t *task = json_object(), *tl = json_object();
    json_object_set_new(task, "kind", json_string("text-kv"));
    json_object_set_new(task, "tokenizer", json_string(s->tok_path));
    json_object_set_new(task, "tokenizer_ids", json_integer(ps_tokenizer_vocab_size(s->tok)));
    json_object_set_new(task, "pairs", json_integer(s->kv.n_pairs));
    json_object_set_new(task, "queries", json_integer(s->kv.n_queries));
    json_object_set_new(task, "keys", json_string(s->words_path));
    json_object_set_new(task, "n_keys", json_integer(s->n_words));
    json_object_set_new(task, "values", json_string(s->value_words ? "words" : "numbers"));
    if (!s->value_words) json_object_set_new(task, "value_digits", json_integer(s->kv.value_digits));
    json_object_set_new(task, "filler_family", json_string(s->fam->name));
    json_object_set_new(task, "filler_source", json_string(s->fam->source));
    json_object_set_new(task, "layout", json_string(s->from_checkpoint ? "checkpoint" : "flags"));
    json_object_set_new(tl, "min", json_integer(tmin));
    json_object_set_new(tl, "max", json_integer(tmax));
    json_object_set_new(task, "prompt_tokens", tl);
    return task;
}

int ps_textkv_sweep_lengths(const ps_textkv_set *s, ps_sweep_mode mode, uint64_t seed, int64_t N, int64_t max_seq_len, int64_t *T,
                            int64_t *tmin, int64_t *tmax, ps_error *err) {
    *tmin = INT64_MAX, *tmax = 0;
    for (int64_t p = 0; p < s->P; p++) {
        ps_shifted sh;
        if (ps_textkv_shifted(&s->kv, mode, s->P, p, seed, N, max_seq_len, &sh, err)) return -1;
        T[p] = sh.b.T;
        for (int64_t i = 0; i < sh.b.B; i++) {
            int64_t n = ps_textkv_set_prompt_len(s, &sh.b.queries[i * sh.b.max_q]);
            *tmin = n < *tmin ? n : *tmin;
            *tmax = n > *tmax ? n : *tmax;
        }
        ps_shifted_free(&sh);
    }
    return 0;
}
