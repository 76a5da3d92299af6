/* attention.c — INTERIM: attention forward with the row log-sum-exp, and a backward that rebuilds the
 * probabilities from it into workspace (O(T·ncols) scratch). Replaced by the blockwise flash kernels. */
#include <math.h>
#include <string.h>

#include "cpu.h"

int ps_cpu_attn_forward(ps_ctx *ctx, float *z, float *lse, const float *q, const float *k, const float *v,
                        const float *ck, const float *cv, const ps_attn_geom *g) {
    int64_t B = g->B, T = g->T, nh = g->nh, nc = g->ncols;
    float *P = ps_ctx_workspace(ctx, B * nh * T * nc);
    if (!P) return -1;
    if (ps_cpu_attn_probs(ctx, P, q, k, ck, g) || ps_cpu_attn_out(ctx, z, P, v, cv, g)) return -1;
    float scale = 1.0f / sqrtf((float)g->hd);
    for (int64_t bn = 0; bn < B * nh; bn++) {
        int64_t b = bn / nh, n = bn % nh, kv = n / (nh / g->nkv);
        for (int64_t t = 0; t < T; t++) {
            /* lse from one visible entry: s - log p */
            const float *row = P + (bn * T + t) * nc;
            int64_t c = 0;
            while (c < nc && row[c] == 0.0f) c++;
            const float *key = g->compressed && c < g->nW ? ck + ((b * g->nW + c) * g->nkv + kv) * g->hd
                               : k + ((b * T + (g->compressed ? t - g->LW + 1 + (c - g->nW) : c)) * g->nkv + kv) * g->hd;
            float s = ps_dot(q + ((b * T + t) * nh + n) * g->hd, key, g->hd) * scale;
            lse[bn * T + t] = c < nc ? s - logf(row[c]) : 0.0f;
        }
    }
    return 0;
}

int ps_cpu_attn_backward(ps_ctx *ctx, float *dq, float *dk, float *dv, float *dck, float *dcv, const float *dz,
                         const float *z, const float *lse, const float *q, const float *k, const float *v,
                         const float *ck, const float *cv, const ps_attn_geom *g) {
    (void)z, (void)lse;
    int64_t n = g->B * g->nh * g->T * g->ncols;
    float *P = ps_ctx_workspace(ctx, 2 * n);
    if (!P) return -1;
    if (ps_cpu_attn_probs(ctx, P, q, k, ck, g)) return -1;
    return ps_cpu_attn_backward_probs(ctx, dq, dk, dv, dck, dcv, P + n, dz, P, q, k, v, ck, cv, g);
}
