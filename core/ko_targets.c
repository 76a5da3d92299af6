/* ko_targets.c — the controlled model's knockout targets as data (runtime.h: ps_ko_array and the family's ko_*
 * entries), which interventions/' one mean-replacement spec (interventions/ko_spec.c) reads: raw / compressed /
 * both (a KV head's k/v, ck/cv or all four; K = V on the channel attention). DeepSeek-V4's are
 * core/v4/v4_ko_targets.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/chunks.h"
#include "core/runtime.h"

/* ---- the controlled model: target index t = raw 0, compressed 1, both 2 (bits of t + 1: 1 raw, 2 compressed) ---- */

const char *const ps_model_ko_target_names[] = {"raw", "compressed", "both", NULL};

static const ps_config *cfg_of(const ps_runtime *rt) { return &((const ps_model *)rt->model)->cfg; }

int ps_model_ko_default(const ps_runtime *rt) { return cfg_of(rt)->kind != PS_ATTN_FULL ? 1 : 0; }

int64_t ps_model_ko_heads(const ps_runtime *rt, int target) {
    (void)target;
    return cfg_of(rt)->n_kv_heads;
}

const char *ps_model_ko_unit(const ps_runtime *rt, int target) {
    (void)rt, (void)target;
    return NULL;
}

const char *ps_model_ko_missing(const ps_runtime *rt, int target, int layer, char *buf, size_t n) {
    (void)layer;
    if (((target + 1) & 2) && cfg_of(rt)->kind == PS_ATTN_FULL) {
        snprintf(buf, n, "--target %s: a full-attention model has no compressed entries (use --target raw)",
                 ps_model_ko_target_names[target]);
        return buf;
    }
    return NULL;
}

/* k, v, ck, cv in the order the forward fires them (the channel attention: K = V, hook_k / hook_ck only; the
 * select attention: its level-1 pooled keys hook_ck are the compressed target, which changes the blocks a head
 * selects; it has no hook_cv); the compressed entries of content chunks are finished on the host (their counts,
 * ps_model_ko_mean). The channel and select attentions have no answer-row restart: a forward per cell. */
int ps_model_ko_arrays(const ps_runtime *rt, int target, ps_ko_array arr[PS_KO_MAX_ARRAYS], int *restart) {
    const ps_config *c = cfg_of(rt);
    int bits = target + 1, kv_shared = c->kind == PS_ATTN_CHANNEL, sel = c->kind == PS_ATTN_SELECT, n = 0;
    int content = c->kind == PS_ATTN_COMPRESSED && c->boundaries == PS_BOUNDARIES_CONTENT;
    if (bits & 1) {
        arr[n++] = (ps_ko_array){PS_HOOK_K, PS_HOOK_K, 0};
        if (!kv_shared) arr[n++] = (ps_ko_array){PS_HOOK_V, PS_HOOK_V, 0};
    }
    if (bits & 2) {
        arr[n++] = (ps_ko_array){PS_HOOK_CK, PS_HOOK_CK, content};
        if (!kv_shared && !sel) arr[n++] = (ps_ko_array){PS_HOOK_CV, PS_HOOK_CV, content};
    }
    *restart = kv_shared || sel ? PS_KO_RESTART_NONE : PS_KO_RESTART_ATTENTION;
    return n;
}

/* Content chunk boundaries: chunk entry j of the compressed arrays is present in only the prompts that have
 * a (j+1)-th chunk (the others hold zeros there), so its mean is over those prompts: the means over all N
 * are rescaled by N / count_j (entries no prompt has stay 0). mean [nC, nkv, hd]. */
int ps_model_ko_mean(const ps_runtime *rt, int target, const ps_ko_array *a, int layer, const int32_t *tokens, int64_t N,
                     int64_t T, const double *sum, int64_t n_sum, float *mean, int64_t n_mean, ps_error *err) {
    (void)target, (void)a, (void)layer, (void)sum, (void)n_sum;
    const ps_config *c = cfg_of(rt);
    int64_t nC = ps_config_n_windows(c, T), per = nC > 0 ? n_mean / nC : 0;
    int64_t *cnt = calloc((size_t)(nC > 0 ? nC : 1), sizeof *cnt), *cs = malloc((size_t)(nC > 0 ? nC : 1) * sizeof *cs),
            *cl = malloc((size_t)(nC > 0 ? nC : 1) * sizeof *cl);
    int rc = cnt && cs && cl ? 0 : ps_fail(err, "out of memory for the knockout's chunk counts (%lld entries)", (long long)nC);
    for (int64_t i = 0; !rc && i < N; i++) {
        int64_t n = ps_content_chunks(c, tokens + i * T, T, nC, cs, cl);
        for (int64_t j = 0; j < n; j++) cnt[j]++;
    }
    for (int64_t j = 0; !rc && j < nC; j++) {
        double f = cnt[j] > 0 ? (double)N / (double)cnt[j] : 0.0;
        for (int64_t e = 0; e < per; e++) mean[j * per + e] = (float)((double)mean[j * per + e] * f);
    }
    free(cnt);
    free(cs);
    free(cl);
    return rc;
}

