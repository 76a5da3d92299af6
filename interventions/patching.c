#include "interventions/patching.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fileio.h"
#include "core/forward.h"

/* A forward of acts `a` with a cache watching names (the hooks are the cache's only). */
static int forward_cached(const ps_model *m, ps_acts *a, const int32_t *tokens, const char *const *names, int n,
                          ps_cache *cache, ps_error *err) {
    ps_hooks h;
    ps_hooks_init(&h);
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) rc = ps_cache_watch(cache, &h, &m->cfg, names[i], err);
    if (!rc) rc = ps_forward(m, a, tokens, &h, err);
    ps_hooks_free(&h);
    return rc;
}

int ps_run_with_cache(const ps_model *m, const int32_t *tokens, int64_t B, int64_t T, const char *const *names, int n,
                      ps_cache *cache, ps_error *err) {
    if (n < 0 || (n > 0 && !names)) return ps_fail(err, "run_with_cache: %d hook names", n);
    ps_acts a;
    if (ps_acts_create(&a, m->ctx, &m->cfg, B, T, false, err)) return -1;
    int rc = forward_cached(m, &a, tokens, names, n, cache, err);
    ps_acts_free(&a);
    return rc;
}

double ps_patch_default_budget(void) {
    double b = 1024.0 * 1024.0 * 1024.0, avail = (double)ps_mem_available();
    if (avail > 0 && avail / 4 < b) b = avail / 4;
    return b;
}

void ps_patch_result_free(ps_patch_result *r) {
    free(r->layers);
    free(r->heads);
    free(r->cells);
    memset(r, 0, sizeof *r);
}

/* log-softmax of row x[V] at token y, in double (as ps_score_queries) */
static double log_prob(const float *x, int64_t V, int32_t y) {
    float mx = x[0];
    for (int64_t i = 1; i < V; i++)
        if (x[i] > mx) mx = x[i];
    double sum = 0;
    for (int64_t i = 0; i < V; i++) sum += exp((double)(x[i] - mx));
    return (double)(x[y] - mx) - log(sum);
}

double ps_patch_metric_value(ps_patch_metric metric, const ps_batch *clean, const ps_batch *corrupted,
                             const float *logits, int64_t V) {
    double acc = 0;
    int64_t nq = 0, T = clean->T;
    for (int64_t b = 0; b < clean->B; b++)
        for (int64_t qi = 0; qi < clean->n_q[b]; qi++) {
            const ps_query *q = &clean->queries[b * clean->max_q + qi];
            nq++;
            if (metric == PS_PATCH_LOGIT_DIFF) {
                const float *x = logits + (b * T + q->answer_pos) * V;
                acc += (double)x[clean->tokens[b * T + q->answer_src]] - (double)x[corrupted->tokens[b * T + q->answer_src]];
            } else {
                double nll = 0;
                for (int64_t k = 0; k < q->answer_len; k++)
                    nll -= log_prob(logits + (b * T + q->answer_pos + k) * V, V, clean->tokens[b * T + q->answer_src + k]);
                acc += nll;
            }
        }
    return nq ? acc / (double)nq : 0.0;
}

int ps_activation_patching(const ps_model *m, const ps_batch *clean, const ps_batch *corrupted,
                           const ps_patch_opts *opts, ps_patch_result *out, ps_progress_fn progress, void *user,
                           ps_error *err) {
    memset(out, 0, sizeof *out);
    const ps_config *c = &m->cfg;
    ps_ctx *ctx = m->ctx;
    int64_t N = clean->B, T = clean->T, V = c->vocab_size;
    if (!opts || !opts->point) return ps_fail(err, "activation patching: no hook point given (e.g. \"attn.hook_z\")");
    if (corrupted->B != N || corrupted->T != T)
        return ps_fail(err, "activation patching: the clean batch is %lldx%lld tokens, the corrupted one %lldx%lld; they must match",
                       (long long)N, (long long)T, (long long)corrupted->B, (long long)corrupted->T);
    int64_t nq = 0;
    for (int64_t b = 0; b < N; b++) nq += clean->n_q[b];
    if (nq == 0) return ps_fail(err, "activation patching: the clean batch has no queries to measure");
    if (opts->metric != PS_PATCH_LOGIT_DIFF && opts->metric != PS_PATCH_ANSWER_NLL)
        return ps_fail(err, "activation patching: unknown metric %d", (int)opts->metric);
    /* the point, by its suffix (parsed on layer 0, so the error lists the valid names) */
    char name[96];
    snprintf(name, sizeof name, "blocks.0.%s", opts->point);
    int l0;
    ps_hook_point pt;
    if (ps_hook_parse(c, name, &l0, &pt, err)) return -1;
    if (pt == PS_HOOK_PATTERN)
        return ps_fail(err, "activation patching: attn.hook_pattern is not supported (patch attn.hook_z or the keys and values)");
    int64_t shape[4];
    int ndim = ps_hook_shape(c, pt, N, T, shape);
    int64_t point_heads = ndim == 4 ? shape[2] : 0, npos = shape[1], inner = 1;
    for (int i = 2; i < ndim; i++) inner *= shape[i];
    /* layers and heads */
    int nl = opts->layers && opts->n_layers > 0 ? opts->n_layers : (int)c->n_layers;
    int nh = point_heads == 0 ? 1 : opts->heads && opts->n_heads > 0 ? opts->n_heads : (int)point_heads;
    out->n_layers = nl;
    out->n_heads = nh;
    out->n_pos = opts->per_position ? npos : 1;
    out->layers = malloc((size_t)nl * sizeof(int));
    out->heads = malloc((size_t)nh * sizeof(int));
    int64_t n_cells = (int64_t)nl * nh * out->n_pos;
    out->cells = calloc((size_t)(n_cells ? n_cells : 1), sizeof(double));
    if (!out->layers || !out->heads || !out->cells)
        return ps_fail(err, "out of memory for %lld patching cells", (long long)n_cells);
    for (int i = 0; i < nl; i++) {
        int l = opts->layers && opts->n_layers > 0 ? opts->layers[i] : i;
        if (l < 0 || l >= c->n_layers)
            return ps_fail(err, "activation patching: layer %d out of range (the model has %lld layers)", l, (long long)c->n_layers);
        out->layers[i] = l;
    }
    for (int i = 0; i < nh; i++) {
        int h = point_heads == 0 ? -1 : opts->heads && opts->n_heads > 0 ? opts->heads[i] : i;
        if (point_heads && (h < 0 || h >= point_heads))
            return ps_fail(err, "activation patching: head %d out of range (%s has %lld heads)", h, opts->point, (long long)point_heads);
        out->heads[i] = h;
    }
    if (n_cells == 0) return 0; /* e.g. per position on a point with no windows */
    /* cells per forward: replicas of N sequences of T tokens within the budget (at least one) */
    double budget = opts->mem_bytes > 0 ? opts->mem_bytes : ps_patch_default_budget();
    double one = 4.0 * (double)(ps_acts_size(c, 2 * N, T, false, false) - ps_acts_size(c, N, T, false, false));
    double fixed = 4.0 * (double)ps_acts_size(c, N, T, false, false) - one;
    double fit = floor((budget - fixed) / one);
    int64_t per_layer = (int64_t)nh * out->n_pos;
    int64_t k_max = fit < 1 ? 1 : fit > (double)per_layer ? per_layer : (int64_t)fit;
    if (opts->max_cells > 0 && k_max > opts->max_cells) k_max = opts->max_cells;

    /* the clean run: its activation at the point of every chosen layer (cached, then a buffer of the
     * context: the patch actions' source) and its metric; then the corrupted run, whose residual stream
     * every cell restarts from */
    ps_acts corr = {0}, rep = {0};
    int have_corr = 0, have_rep = 0, rc = 0;
    float **src = calloc((size_t)nl, sizeof(float *));
    char **names = calloc((size_t)nl, sizeof(char *));
    char *name_buf = malloc((size_t)nl * 96);
    int64_t src_floats = N * npos * inner;
    ps_cache cache;
    ps_cache_init(&cache);
    if (!src || !names || !name_buf) rc = ps_fail(err, "out of memory for %d layers' patch sources", nl);
    for (int i = 0; i < nl && !rc; i++) {
        names[i] = name_buf + (size_t)i * 96;
        ps_hook_name(names[i], 96, out->layers[i], pt);
    }
    if (!rc) {
        rc = ps_acts_create(&corr, ctx, c, N, T, false, err);
        have_corr = !rc;
    }
    const float *lg;
    if (!rc && !(rc = forward_cached(m, &corr, clean->tokens, (const char *const *)names, nl, &cache, err))) {
        if (!(lg = ps_acts_logits_host(&corr, err))) rc = -1;
        else out->clean = ps_patch_metric_value(opts->metric, clean, corrupted, lg, V);
    }
    for (int i = 0; i < nl && !rc; i++) {
        const ps_cache_item *it = ps_cache_get(&cache, names[i]);
        if (!(src[i] = ps_buf_alloc(ctx, src_floats * (int64_t)sizeof(float), "a layer's clean activation", err))) rc = -1;
        else rc = ps_buf_from_host(ctx, src[i], it->data, src_floats * (int64_t)sizeof(float), err);
    }
    ps_cache_free(&cache);
    if (!rc && !(rc = ps_forward(m, &corr, corrupted->tokens, NULL, err))) {
        if (!(lg = ps_acts_logits_host(&corr, err))) rc = -1;
        else out->corrupted = ps_patch_metric_value(opts->metric, clean, corrupted, lg, V);
    }
    /* the cells, layer by layer, in groups of at most k_max */
    int64_t done = 0;
    for (int li = 0; li < nl && !rc; li++) {
        int l = out->layers[li];
        for (int64_t g0 = 0; g0 < per_layer && !rc; g0 += k_max) {
            int64_t k = per_layer - g0 < k_max ? per_layer - g0 : k_max, Bp = k * N;
            if (have_rep && rep.B != Bp) {
                ps_acts_free(&rep);
                have_rep = 0;
            }
            if (!have_rep) {
                if ((rc = ps_acts_create(&rep, ctx, c, Bp, T, false, err))) break;
                have_rep = 1;
            }
            if ((int)k > out->cells_per_forward) out->cells_per_forward = (int)k;
            /* every replica starts as the corrupted run at layer l's input */
            for (int64_t r = 0; r < k && !rc; r++)
                if (ps_copy(ctx, rep.p.resid + (int64_t)l * Bp * T * c->d_model + r * N * T * c->d_model,
                            corr.p.resid + (int64_t)l * N * T * c->d_model, N * T * c->d_model))
                    rc = ps_ctx_check(ctx, err);
                else rc = ps_acts_copy_chunks(&rep, r * N, &corr, 0, N, err); /* content chunk boundaries */
            ps_hooks h;
            ps_hooks_init(&h);
            for (int64_t r = 0; r < k && !rc; r++) {
                int64_t cell = g0 + r, hi = cell / out->n_pos, t = cell % out->n_pos;
                ps_hook_action act = {.kind = PS_ACT_PATCH, .head = out->heads[hi], .seq0 = r * N, .seq1 = (r + 1) * N,
                                      .pos0 = opts->per_position ? t : 0, .pos1 = opts->per_position ? t + 1 : 0,
                                      .src = src[li], .src_npos = npos, .src_nseq = N, .src_seq0 = 0};
                rc = ps_hooks_add_action(&h, c, names[li], &act, err);
            }
            if (!rc) rc = ps_forward_from(m, &rep, l, &h, err);
            ps_hooks_free(&h);
            if (!rc && !(lg = ps_acts_logits_host(&rep, err))) rc = -1;
            for (int64_t r = 0; r < k && !rc; r++)
                out->cells[(int64_t)li * per_layer + g0 + r] =
                    ps_patch_metric_value(opts->metric, clean, corrupted, lg + r * N * T * V, V);
            done += k;
            if (!rc && progress) progress(done, n_cells, user);
        }
    }
    if (have_rep) ps_acts_free(&rep);
    if (have_corr) ps_acts_free(&corr);
    for (int i = 0; src && i < nl; i++) ps_buf_free(ctx, src[i], src_floats * (int64_t)sizeof(float));
    free(src);
    free(names);
    free(name_buf);
    return rc;
}
