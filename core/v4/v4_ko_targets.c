/* v4_ko_targets.c — DeepSeek-V4's knockout targets as data (runtime.h: ps_ko_array and the family's ko_* entries,
 * in its table core/v4/v4_family.c): heads / compressed / raw / indexer / sink. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/runtime.h"
#include "core/v4/v4_config.h"
#include "core/v4/v4_hooks.h"
#include "core/v4/v4_model.h"

/* ---- DeepSeek-V4: heads 0, compressed 1, raw 2, indexer 3, sink 4 (core/v4/v4_config.h: PS_V4KO_*) ---- */

const char *const ps_v4_ko_targets[] = {"heads", "compressed", "raw", "indexer", "sink", NULL};

static const ps_v4_config *v4cfg_of(const ps_runtime *rt) { return &((const ps_v4_model *)rt->model)->cfg; }

int ps_v4_ko_layer_ok(const ps_v4_config *c, int l, int target) {
    if (target == PS_V4KO_COMPRESSED) return c->attn_type[l] != PS_V4_SLIDING;
    if (target == PS_V4KO_INDEXER) return c->attn_type[l] == PS_V4_CSA;
    return 1;
}

int ps_v4_ko_default(const ps_runtime *rt) {
    (void)rt;
    return PS_V4KO_COMPRESSED;
}

int64_t ps_v4_ko_heads(const ps_runtime *rt, int target) { return target == PS_V4KO_HEADS ? v4cfg_of(rt)->n_heads : 0; }

const char *ps_v4_ko_unit(const ps_runtime *rt, int target) {
    (void)rt;
    return target == PS_V4KO_HEADS ? "query head" : "layer";
}

const char *ps_v4_ko_missing(const ps_runtime *rt, int target, int l, char *buf, size_t n) {
    const ps_v4_config *c = v4cfg_of(rt);
    if (l == -1) return NULL; /* the model as a whole: every target exists on some layer type */
    if (l < 0 || l >= c->n_layers) {
        snprintf(buf, n, "knockout grid: layer %d out of range", l);
        return buf;
    }
    if (ps_v4_ko_layer_ok(c, l, target)) return NULL;
    snprintf(buf, n, "--target %s: layer %d is %s, which has no %s", ps_v4_ko_targets[target], l,
             ps_v4_attn_type_name(c->attn_type[l]),
             target == PS_V4KO_INDEXER ? "indexer (CSA layers only)" : "compressed entries (CSA and HCA layers only)");
    return buf;
}

/* one array per target; the indexer's cells set its top-k from the mean scores' choice (ps_v4_ko_mean); the V4
 * forward has no restart: a full forward per cell */
int ps_v4_ko_arrays(const ps_runtime *rt, int target, ps_ko_array arr[PS_KO_MAX_ARRAYS], int *restart) {
    (void)rt;
    static const int POINT[] = {PS_V4H_Q, PS_V4H_C_KV, PS_V4H_KV, PS_V4H_I_SCORES, PS_V4H_SINK};
    arr[0] = (ps_ko_array){POINT[target], target == PS_V4KO_INDEXER ? PS_V4H_I_TOPK : POINT[target], target == PS_V4KO_INDEXER};
    *restart = PS_KO_RESTART_NONE;
    return 1;
}

void ps_v4_mean_topk(const double *ms, int64_t T, int64_t nW, int64_t K, int64_t m, float *topk) {
    for (int64_t t = 0; t < T; t++) {
        int64_t nv = m > 0 ? (t + 1) / m : nW;
        if (nv > nW) nv = nW;
        const double *row = ms + t * nW;
        float *o = topk + t * K;
        for (int64_t i = 0; i < K; i++) {
            int64_t best = -1;
            for (int64_t w = 0; w < nv; w++) {
                int taken = 0;
                for (int64_t j = 0; j < i && !taken; j++) taken = o[j] == (float)w;
                if (taken) continue;
                if (best < 0 || row[w] > row[best]) best = w; /* strict: ties to the lower index */
            }
            o[i] = (float)best;
        }
    }
}

/* the indexer: the mean pattern's choice (the top-k of the scores averaged over the prompts) */
int ps_v4_ko_mean(const ps_runtime *rt, int target, const ps_ko_array *a, int layer, const int32_t *tokens, int64_t N,
                  int64_t T, const double *sum, int64_t n_sum, float *mean, int64_t n_mean, ps_error *err) {
    (void)target, (void)a, (void)tokens, (void)n_mean;
    const ps_v4_config *c = v4cfg_of(rt);
    int64_t nW = ps_v4_n_windows(c, layer, T), K = c->index_topk < nW ? c->index_topk : nW;
    double *hs = malloc((size_t)(n_sum > 0 ? n_sum : 1) * sizeof(double));
    if (!hs) return ps_fail(err, "out of memory for the indexer's mean scores of layer %d", layer);
    for (int64_t i = 0; i < n_sum; i++) hs[i] = sum[i] / (double)N;
    ps_v4_mean_topk(hs, T, nW, K, c->compress_rate[layer], mean);
    free(hs);
    return 0;
}
