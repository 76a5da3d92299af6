/* generate.c — generation through the KV cache (generate.h). */
#include "core/generate.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ps_generate_edit_parse(const ps_config *c, const char *spec, ps_generate_edit *e, ps_error *err) {
    memset(e, 0, sizeof *e);
    char point[96], mode[16];
    long g, j;
    int off = 0;
    if (sscanf(spec, "%95[^:]:%ld:%ld:%15[a-z]%n", point, &g, &j, mode, &off) != 4 || spec[off] != '\0')
        return ps_fail(err, "edit \"%s\": expected blocks.L.attn.cache_ck:HEAD:ENTRY:zero|mean (or cache_cv)", spec);
    if (ps_kvcache_point_parse(c, point, &e->layer, &e->value, err)) return ps_fail_prefix(err, "edit \"%s\": ", spec), -1;
    if (g < 0 || g >= c->n_kv_heads)
        return ps_fail(err, "edit \"%s\": KV head %ld is outside the model's %lld KV heads", spec, g, (long long)c->n_kv_heads);
    if (j < 0) return ps_fail(err, "edit \"%s\": entry %ld must be >= 0", spec, j);
    if (strcmp(mode, "zero") && strcmp(mode, "mean")) return ps_fail(err, "edit \"%s\": mode \"%s\": expected zero or mean", spec, mode);
    e->head = (int)g;
    e->entry = j;
    e->mean = !strcmp(mode, "mean");
    return 0;
}

int ps_generate_edit_parse_kv(const ps_kvcache *kv, const char *spec, ps_generate_edit *e, ps_error *err) {
    memset(e, 0, sizeof *e);
    char point[96], mode[16];
    long g, j;
    int off = 0;
    const ps_kvcache_ops *ops = kv->ops;
    if (sscanf(spec, "%95[^:]:%ld:%ld:%15[a-z]%n", point, &g, &j, mode, &off) != 4 || spec[off] != '\0')
        return ps_fail(err, "edit \"%s\": expected %s", spec, ops->edit_form);
    if (ps_kvcache_point_parse_kv(kv, point, &e->layer, &e->value, err)) return ps_fail_prefix(err, "edit \"%s\": ", spec), -1;
    int64_t nh = ps_kvcache_entry_heads(kv);
    if (g < 0 || g >= nh) {
        if (ops->one_head) return ps_fail(err, "edit \"%s\": head %ld: %s", spec, g, ops->one_head);
        return ps_fail(err, "edit \"%s\": KV head %ld is outside the model's %lld KV heads", spec, g, (long long)nh);
    }
    if (j < 0) return ps_fail(err, "edit \"%s\": entry %ld must be >= 0", spec, j);
    if (strcmp(mode, "zero") && strcmp(mode, "mean")) return ps_fail(err, "edit \"%s\": mode \"%s\": expected zero or mean", spec, mode);
    e->head = (int)g;
    e->entry = j;
    e->mean = !strcmp(mode, "mean");
    return 0;
}

typedef struct {
    float v;
    int32_t i;
} cand;

static int cand_desc(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->v != y->v) return x->v < y->v ? 1 : -1;
    return x->i < y->i ? -1 : x->i > y->i;
}

/* A draw from softmax(x / T) over every token, in token order (no sort, no allocation); z: the sum of
 * exp((x - mx) / T). */
static int32_t sample_all(const float *x, int64_t V, float mx, double T, double z, ps_rng *r) {
    double u = ps_rng_uniform(r) * z, run = 0;
    for (int64_t i = 0; i < V; i++) {
        run += exp(((double)x[i] - mx) / T);
        if (run > u) return (int32_t)i;
    }
    return (int32_t)(V - 1);
}

/* A draw from the nucleus of top_p: the tokens by logit, highest first (ties: the lower id first), the
 * smallest prefix whose probability reaches top_p, then one uniform draw over that prefix. Sorting the
 * vocabulary for every token costs about 28 ms at 152K tokens, so only the tokens within d of the maximum
 * (in units of T) are sorted, with d widened (to every token at last) until their sorted prefix reaches
 * top_p: that prefix is the full sort's, so the draw is the same. -1: out of memory. */
static int32_t sample_nucleus(const float *x, int64_t V, float mx, double T, double top_p, double z, ps_rng *r) {
    cand small[256], *c = small, *big = NULL;
    int64_t cap = 256;
    int32_t y = -1;
    for (double d = 4; y < 0; d *= 2) {
        int every = d > 256; /* exp(-256) is below any double probability the prefix could still need */
        double xt = every ? -INFINITY : (double)mx - d * T;
        int64_t n = 0;
        for (int64_t i = 0; i < V; i++) n += (double)x[i] >= xt;
        if (n > cap) {
            cand *nb = realloc(big, (size_t)n * sizeof *nb);
            if (!nb) break;
            big = c = nb, cap = n;
        }
        for (int64_t i = 0, k = 0; i < V; i++)
            if ((double)x[i] >= xt) c[k].v = x[i], c[k++].i = (int32_t)i;
        qsort(c, (size_t)n, sizeof *c, cand_desc);
        int64_t k = 0;
        double acc = 0;
        while (k < n) {
            acc += exp(((double)c[k].v - mx) / T) / z;
            k++;
            if (acc >= top_p) break;
        }
        if (acc < top_p && !every) continue; /* the prefix may go on past the tokens taken: widen */
        double u = ps_rng_uniform(r) * acc, run = 0;
        y = c[k - 1].i;
        for (int64_t i = 0; i < k; i++) {
            run += exp(((double)c[i].v - mx) / T) / z;
            if (run > u) {
                y = c[i].i;
                break;
            }
        }
    }
    free(big);
    return y;
}

int32_t ps_generate_pick(const float *x, int64_t V, double temperature, double top_p, ps_rng *r, double *logprob) {
    float mx = x[0];
    int64_t arg = 0;
    for (int64_t i = 1; i < V; i++)
        if (x[i] > mx) mx = x[i], arg = i;
    int32_t y = (int32_t)arg;
    if (temperature > 0) {
        double z = 0;
        for (int64_t i = 0; i < V; i++) z += exp(((double)x[i] - mx) / temperature);
        int32_t s = top_p >= 1 ? sample_all(x, V, mx, temperature, z, r) : sample_nucleus(x, V, mx, temperature, top_p, z, r);
        if (s >= 0) y = s; /* (out of memory for a wide nucleus: the greedy token) */
    }
    if (logprob) {
        double sum = 0;
        for (int64_t i = 0; i < V; i++) sum += exp((double)x[i] - mx);
        *logprob = (double)x[y] - mx - log(sum);
    }
    return y;
}

void ps_generate_result_free(ps_generate_result *r) {
    for (int i = 0; i < r->n; i++) {
        if (r->tok) free(r->tok[i]);
        if (r->logprob) free(r->logprob[i]);
    }
    free(r->tok);
    free(r->logprob);
    free(r->n_gen);
    memset(r, 0, sizeof *r);
}

int ps_generate(ps_kvcache *kv, int n, int32_t *const *prompt, const int64_t *len, const ps_generate_opts *o,
                const ps_generate_edit *edits, int n_edits, const ps_hooks *hooks, ps_generate_result *out, ps_error *err) {
    int64_t V = ps_kvcache_vocab(kv), hd = ps_kvcache_entry_width(kv, 0, 0), tot = 0, max_len = ps_kvcache_max_len(kv);
    for (int k = 0; k < n_edits; k++)
        if (ps_kvcache_entry_width(kv, edits[k].layer, edits[k].value) > hd) hd = ps_kvcache_entry_width(kv, edits[k].layer, edits[k].value);
    memset(out, 0, sizeof *out);
    if (n < 1) return ps_fail(err, "generate: no prompts");
    if (o->max_tokens < 0) return ps_fail(err, "generate: max_tokens %lld must be >= 0", (long long)o->max_tokens);
    if (o->temperature < 0 || !(o->top_p > 0 && o->top_p <= 1))
        return ps_fail(err, "generate: temperature %g must be >= 0 and top_p %g in (0, 1]", o->temperature, o->top_p);
    for (int k = 0; k < o->n_stop; k++)
        if (o->stop[k] < 0 || o->stop[k] >= V)
            return ps_fail(err, "generate: stop token %d is outside the vocabulary [0, %lld)", o->stop[k], (long long)V);
    for (int i = 0; i < n; i++) {
        if (len[i] < 1) return ps_fail(err, "generate: prompt %d is empty", i);
        tot += len[i];
    }
    int *ids = malloc((size_t)n * sizeof *ids), *act = malloc((size_t)n * sizeof *act);
    int64_t *nn = malloc((size_t)n * sizeof *nn);
    int32_t *cat = malloc((size_t)tot * sizeof *cat), *next = malloc((size_t)n * sizeof *next);
    float *lg = malloc((size_t)(n * V) * sizeof *lg), *vec = malloc((size_t)hd * sizeof *vec), *tmp = malloc((size_t)hd * sizeof *tmp);
    out->n = n;
    out->n_gen = calloc((size_t)n, sizeof *out->n_gen);
    out->tok = calloc((size_t)n, sizeof *out->tok);
    out->logprob = calloc((size_t)n, sizeof *out->logprob);
    int rc = ids && act && nn && cat && next && lg && vec && tmp && out->n_gen && out->tok && out->logprob ? 0 : -1;
    for (int i = 0; i < n && !rc; i++) {
        int64_t cap = o->max_tokens > 0 ? o->max_tokens : 1;
        out->tok[i] = malloc((size_t)cap * sizeof(int32_t));
        out->logprob[i] = malloc((size_t)cap * sizeof(double));
        if (!out->tok[i] || !out->logprob[i]) rc = -1;
    }
    if (rc) ps_fail(err, "out of memory for generating from %d prompts", n);
    /* prefill: every prompt in one append. With edits, every prompt but its last token first, then the
     * edits, then the last tokens in one append, so that the first token picked sees the edited cache too
     * (what an edit means: from the first generated token on). */
    int64_t off = 0;
    for (int i = 0; i < n && !rc; i++)
        if ((ids[i] = ps_kvcache_add(kv, err)) < 0) rc = -1;
    if (!rc && !n_edits) {
        for (int i = 0; i < n; off += len[i], i++) memcpy(cat + off, prompt[i], (size_t)len[i] * sizeof *cat);
        rc = ps_kvcache_append(kv, n, ids, len, cat, hooks, lg, true, err);
    } else if (!rc) {
        int nh = 0;
        for (int i = 0; i < n; i++) {
            if (len[i] < 2) continue;
            act[nh] = ids[i];
            nn[nh++] = len[i] - 1;
            memcpy(cat + off, prompt[i], (size_t)(len[i] - 1) * sizeof *cat);
            off += len[i] - 1;
        }
        if (nh) rc = ps_kvcache_append(kv, nh, act, nn, cat, hooks, NULL, true, err);
    }
    /* the edits: zero, a given vector, or the mean of the entry over the prompts that hold it now */
    for (int k = 0; k < n_edits && !rc; k++) {
        const ps_generate_edit *e = &edits[k];
        if (!e->mean) {
            rc = ps_kvcache_edit(kv, -1, e->layer, e->head, e->value, e->entry, e->vec ? PS_KV_EDIT_SET : PS_KV_EDIT_ZERO, e->vec, err);
            continue;
        }
        int have = 0;
        int64_t ew = ps_kvcache_entry_width(kv, e->layer, e->value);
        double *acc = calloc((size_t)ew, sizeof *acc);
        if (!acc) rc = ps_fail(err, "out of memory for an edit");
        for (int i = 0; i < n && !rc; i++) {
            if (ps_kvcache_n_entries(kv, ids[i], e->layer, e->head) <= e->entry) continue;
            rc = ps_kvcache_entry(kv, ids[i], e->layer, e->head, e->value, e->entry, tmp, err);
            for (int64_t x = 0; x < ew && !rc; x++) acc[x] += tmp[x];
            have++;
        }
        char pn[96];
        ps_kvcache_point_name(kv, e->layer, e->value, pn, sizeof pn);
        if (!rc && !have)
            rc = ps_fail(err, "edit %s:%d:%lld:mean: no prompt holds entry %lld before its last token (nothing to average)", pn, e->head,
                         (long long)e->entry, (long long)e->entry);
        for (int64_t x = 0; x < ew && !rc; x++) vec[x] = (float)(acc[x] / have);
        if (!rc) rc = ps_kvcache_edit(kv, -1, e->layer, e->head, e->value, e->entry, PS_KV_EDIT_SET, vec, err);
        free(acc);
    }
    if (!rc && n_edits) { /* the prompts' last tokens, after the edits: the logits of the first pick */
        for (int i = 0; i < n; i++) {
            act[i] = ids[i];
            nn[i] = 1;
            next[i] = prompt[i][len[i] - 1];
        }
        rc = ps_kvcache_append(kv, n, act, nn, next, hooks, lg, true, err);
    }
    ps_rng r;
    ps_rng_seed(&r, o->seed);
    /* decode: the last logits of every live sequence pick its next token; one append for all. A sequence
     * at max_seq_len still picks the token its last logits predict, and stops there. */
    char *alive = malloc((size_t)n);
    float *lg2 = malloc((size_t)(n * V) * sizeof *lg2); /* a step's logits, in the order of act */
    if (!rc && (!alive || !lg2)) rc = ps_fail(err, "out of memory for generating from %d prompts", n);
    for (int i = 0; i < n && !rc; i++) alive[i] = 1;
    if (!rc && o->progress && o->progress(0, o->max_tokens, o->progress_user))
        rc = ps_fail(err, "cancelled after 0 of %lld tokens", (long long)o->max_tokens);
    for (int64_t step = 0; step < o->max_tokens && !rc; step++) {
        int na = 0;
        for (int i = 0; i < n; i++) {
            if (!alive[i]) continue;
            double lp;
            int32_t y = ps_generate_pick(lg + (int64_t)i * V, V, o->temperature, o->top_p, &r, &lp);
            out->tok[i][step] = y;
            out->logprob[i][step] = lp;
            out->n_gen[i]++;
            int stop = 0;
            for (int k = 0; k < o->n_stop && !stop; k++) stop = y == o->stop[k];
            if (!stop && step + 1 < o->max_tokens && ps_kvcache_len(kv, ids[i]) < max_len) {
                act[na] = ids[i];
                next[na] = y;
                nn[na++] = 1;
            } else
                alive[i] = 0;
        }
        if (o->progress && o->progress(step + 1, o->max_tokens, o->progress_user)) {
            rc = ps_fail(err, "cancelled after %lld of %lld tokens", (long long)(step + 1), (long long)o->max_tokens);
            break;
        }
        if (!na) break;
        rc = ps_kvcache_append(kv, na, act, nn, next, hooks, lg2, true, err);
        /* the append's logits come in the order of act: back to the sequences' rows */
        for (int k = 0, i = 0; k < na && !rc; k++) {
            while (ids[i] != act[k]) i++;
            memcpy(lg + (int64_t)i * V, lg2 + (int64_t)k * V, (size_t)V * sizeof *lg);
        }
    }
    free(alive);
    free(lg2);
    free(ids), free(act), free(nn), free(cat), free(next), free(lg), free(vec), free(tmp);
    if (rc) ps_generate_result_free(out);
    return rc;
}
