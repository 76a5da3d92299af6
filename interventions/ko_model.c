/* ko_model.c — the controlled model's mean-replacement knockout spec (ko_model.h). */
#include "interventions/ko_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/chunks.h"
#include "core/ops.h"

const char *ps_ko_target_name(ps_ko_target t) { return t == PS_KO_RAW ? "raw" : t == PS_KO_COMPRESSED ? "compressed" : "both"; }

/* ---- the controlled model's spec: mean replacement of a KV head's k/v, ck/cv or all four ---- */

const char *const ps_model_ko_target_names[] = {"raw", "compressed", "both", NULL}; /* index i: ps_ko_target i + 1 */
#define MODEL_TARGETS ps_model_ko_target_names

/* Means of one shift: per selected layer and replaced array (k/v, ck/cv or all four), [npos, nkv, hd] on
 * the model's context: summed over the prompts in double by sum actions on the reference pass, then
 * divided into floats. */
typedef struct {
    ps_ko_target target;
    const int *heads;
    int n_arr;            /* 2 (k/v or ck/cv) or 4 */
    ps_hook_point pt[4];  /* which arrays, in the order the forward fires them */
    int64_t npos[4];
    int64_t off[4];       /* floats into one layer's block of sums / means */
    int64_t per_layer;    /* floats of one layer's block (all arrays) */
    int64_t n_mean;
    double *sum;          /* [n_layers, per_layer] */
    float *mean;          /* [n_layers, per_layer] */
} model_ko;

static void model_ko_shift_end(void *self, const ps_runtime *rt) {
    model_ko *k = self;
    if (k->mean) ps_buf_free(rt->ctx, k->mean, k->n_mean * (int64_t)sizeof(float));
    if (k->sum) ps_buf_free(rt->ctx, k->sum, k->n_mean * (int64_t)sizeof(double));
    k->mean = NULL;
    k->sum = NULL;
}

static int model_ko_sources(void *self, const ps_runtime *rt, const ps_grid_shift *sh, ps_hooks *ref, ps_error *err) {
    model_ko *k = self;
    const ps_config *c = &ps_runtime_controlled(rt)->cfg;
    int v4 = c->kind == PS_ATTN_CHANNEL; /* K = V: hook_k / hook_ck only */
    int64_t nW = ps_config_n_windows(c, sh->T), nkv = c->n_kv_heads, hd = c->head_dim;
    k->n_arr = 0;
    k->per_layer = 0;
    if (k->target & PS_KO_RAW) {
        k->pt[k->n_arr] = PS_HOOK_K, k->npos[k->n_arr++] = sh->T;
        if (!v4) k->pt[k->n_arr] = PS_HOOK_V, k->npos[k->n_arr++] = sh->T;
    }
    if (k->target & PS_KO_COMPRESSED) {
        k->pt[k->n_arr] = PS_HOOK_CK, k->npos[k->n_arr++] = nW;
        if (!v4) k->pt[k->n_arr] = PS_HOOK_CV, k->npos[k->n_arr++] = nW;
    }
    for (int a = 0; a < k->n_arr; a++) {
        k->off[a] = k->per_layer;
        k->per_layer += k->npos[a] * nkv * hd;
    }
    k->n_mean = (int64_t)sh->n_layers * k->per_layer;
    k->sum = ps_buf_alloc(rt->ctx, k->n_mean * (int64_t)sizeof(double), "the knockout sums", err);
    k->mean = k->sum ? ps_buf_alloc(rt->ctx, k->n_mean * (int64_t)sizeof(float), "the knockout means", err) : NULL;
    if (!k->mean) return -1;
    /* the clean run's sums, added by sum actions as each layer fires (the arrays the restart keeps) */
    for (int li = 0; li < sh->n_layers; li++)
        for (int a = 0; a < k->n_arr; a++) {
            if (k->npos[a] < 1) continue;
            char name[96];
            ps_hook_name(name, sizeof name, sh->layers[li], k->pt[a]);
            ps_hook_action act = {.kind = PS_ACT_SUM, .head = -1, .acc = k->sum + (int64_t)li * k->per_layer + k->off[a],
                                  .acc_n = k->npos[a] * nkv * hd};
            if (rt->family->hook_add_action(rt, ref, name, &act, err)) return -1;
        }
    return 0;
}

/* Content chunk boundaries: chunk entry j of the compressed arrays is present in only the prompts that have
 * a (j+1)-th chunk (the others hold zeros there), so its mean is over those prompts: the means over all N
 * are rescaled by N / count_j on the host (entries no prompt has stay 0). */
static int content_means(const ps_runtime *rt, model_ko *k, const ps_grid_shift *sh, ps_error *err) {
    const ps_config *c = &ps_runtime_controlled(rt)->cfg;
    int64_t T = sh->T, N = sh->N, nC = ps_config_n_windows(c, T), nkv = c->n_kv_heads, hd = c->head_dim;
    int64_t *cnt = calloc((size_t)(nC > 0 ? nC : 1), sizeof *cnt), *cs = malloc((size_t)(nC > 0 ? nC : 1) * sizeof *cs),
            *cl = malloc((size_t)(nC > 0 ? nC : 1) * sizeof *cl);
    float *host = malloc((size_t)(k->n_mean > 0 ? k->n_mean : 1) * sizeof *host);
    int rc = 0;
    if (!cnt || !cs || !cl || !host) rc = ps_fail(err, "out of memory for the knockout's chunk counts (%lld entries)", (long long)nC);
    for (int64_t i = 0; !rc && i < N; i++) {
        int64_t n = ps_content_chunks(c, sh->s->b.tokens + i * T, T, nC, cs, cl);
        for (int64_t j = 0; j < n; j++) cnt[j]++;
    }
    if (!rc) rc = ps_buf_to_host(rt->ctx, host, k->mean, k->n_mean * (int64_t)sizeof(float), err);
    for (int li = 0; !rc && li < sh->n_layers; li++)
        for (int a = 0; a < k->n_arr; a++) {
            if (k->pt[a] != PS_HOOK_CK && k->pt[a] != PS_HOOK_CV) continue;
            float *m = host + (int64_t)li * k->per_layer + k->off[a];
            for (int64_t j = 0; j < k->npos[a]; j++) {
                double f = cnt[j] > 0 ? (double)N / (double)cnt[j] : 0.0;
                for (int64_t e = 0; e < nkv * hd; e++) m[j * nkv * hd + e] = (float)((double)m[j * nkv * hd + e] * f);
            }
        }
    if (!rc) rc = ps_buf_from_host(rt->ctx, k->mean, host, k->n_mean * (int64_t)sizeof(float), err);
    free(cnt);
    free(cs);
    free(cl);
    free(host);
    return rc;
}

static int model_ko_sources_done(void *self, const ps_runtime *rt, const ps_grid_shift *sh, ps_error *err) {
    model_ko *k = self;
    if (ps_sum_to_mean(rt->ctx, k->mean, k->sum, (double)sh->N, k->n_mean)) return ps_ctx_check(rt->ctx, err);
    if (ps_runtime_controlled(rt)->cfg.kind == PS_ATTN_COMPRESSED && ps_runtime_controlled(rt)->cfg.boundaries == PS_BOUNDARIES_CONTENT && (k->target & PS_KO_COMPRESSED))
        return content_means(rt, k, sh, err);
    return 0;
}

/* The mean-replacement action of KV head heads[ci] on sequences [seq0, seq1) for every replaced array of
 * layer index li: the same public action a user registers (PS_ACT_SET from the mean [npos, nkv, hd]). */
static int model_ko_cell(void *self, const ps_runtime *rt, const ps_grid_shift *sh, int li, int ci, int64_t seq0,
                         int64_t seq1, int64_t prompt0, ps_hooks *h, ps_error *err) {
    (void)prompt0; /* one mean for every prompt */
    model_ko *k = self;
    for (int a = 0; a < k->n_arr; a++) {
        char name[96];
        ps_hook_name(name, sizeof name, sh->layers[li], k->pt[a]);
        ps_hook_action act = {.kind = PS_ACT_SET, .head = k->heads[ci], .seq0 = seq0, .seq1 = seq1,
                              .src = k->mean + (int64_t)li * k->per_layer + k->off[a], .src_npos = k->npos[a]};
        if (rt->family->hook_add_action(rt, h, name, &act, err)) return -1;
    }
    return 0;
}

int ps_model_ko_default_target(const ps_runtime *rt) { return ps_runtime_controlled(rt)->cfg.kind != PS_ATTN_FULL ? 1 : 0; }

int64_t ps_model_ko_target_heads(const ps_runtime *rt, int target) {
    (void)target;
    return ps_runtime_controlled(rt)->cfg.n_kv_heads;
}

const char *ps_model_ko_unit(const ps_runtime *rt, int target) {
    (void)rt, (void)target;
    return NULL;
}

const char *ps_model_ko_layer_missing(const ps_runtime *rt, int target, int layer, char *buf, size_t n) {
    (void)layer;
    if (((target + 1) & PS_KO_COMPRESSED) && ps_runtime_controlled(rt)->cfg.kind == PS_ATTN_FULL) {
        snprintf(buf, n, "--target %s: a full-attention model has no compressed entries (use --target raw)", MODEL_TARGETS[target]);
        return buf;
    }
    return NULL;
}

int ps_model_ko_spec(const ps_runtime *rt, int target, const int *heads, int n_heads, ps_grid_spec *spec, ps_error *err) {
    (void)n_heads;
    model_ko *k = calloc(1, sizeof *k);
    if (!k) return ps_fail(err, "out of memory");
    k->target = (ps_ko_target)(target + 1);
    k->heads = heads;
    *spec = (ps_grid_spec){.self = k, .restart = ps_runtime_controlled(rt)->cfg.kind != PS_ATTN_CHANNEL ? PS_GRID_RESTART_ATTENTION : PS_GRID_RESTART_NONE, .sources = model_ko_sources,
                           .sources_done = model_ko_sources_done, .cell = model_ko_cell, .shift_end = model_ko_shift_end};
    return 0;
}

const float *ps_model_ko_mean(const ps_grid_spec *spec, int li, ps_hook_point pt) {
    const model_ko *k = spec->self;
    for (int a = 0; a < k->n_arr; a++)
        if (k->pt[a] == pt && k->mean && k->npos[a] > 0) return k->mean + (int64_t)li * k->per_layer + k->off[a];
    return NULL;
}

void ps_model_ko_spec_free(ps_grid_spec *spec) {
    free(spec->self);
    spec->self = NULL;
}
