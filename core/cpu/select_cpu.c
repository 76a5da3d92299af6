/* select_cpu.c — the CPU backend's block-sparse selection ops (core/ops.h "block-sparse selection"): each op runs
 * core/select.c's fast path once per sequence of the batch (the per-sequence math, its naive references and its
 * threading live there), and the geometry check every backend's wrapper makes first. */
#include <inttypes.h>

#include "core/cpu/cpu.h"
#include "core/select.h"

int ps_sel_geom_check(ps_ctx *c, const char *op, const ps_sel_geom *g) {
    const ps_select_cfg *s = &g->sel;
    if (g->B < 0 || g->n < 0 || g->pos0 < 0 || g->L < g->pos0 + g->n || g->H < 1 || g->Hkv < 1 || g->H % g->Hkv || g->D < 1 ||
        g->N1 < 0 || g->N2 < 0 || g->nb < 0)
        return ps_ctx_fail(c,
                           "%s: bad geometry (B %" PRId64 ", n %" PRId64 " rows from position %" PRId64 ", L %" PRId64
                           " keys (at least pos0 + n), H %" PRId64 " heads over Hkv %" PRId64 " (a divisor), D %" PRId64
                           ", N1 %" PRId64 ", N2 %" PRId64 ", nb %" PRId64 ")",
                           op, g->B, g->n, g->pos0, g->L, g->H, g->Hkv, g->D, g->N1, g->N2, g->nb);
    if (s->stride < 1 || s->kernel < s->stride || s->block < 1 || s->block % s->stride || s->init_blocks < 0 ||
        s->local_blocks < 0 || s->topk < 0 || s->topk + s->local_blocks < 1)
        return ps_ctx_fail(c,
                           "%s: bad selection settings (kernel %" PRId64 ", stride %" PRId64 ", block %" PRId64 ", init %" PRId64
                           ", local %" PRId64 ", topk %" PRId64 ")",
                           op, s->kernel, s->stride, s->block, s->init_blocks, s->local_blocks, s->topk);
    return 0;
}

int ps_cpu_select_compress(ps_ctx *c, float *ck, const float *k, int64_t B, int64_t L, int64_t Hkv, int64_t D, int64_t K,
                           int64_t S) {
    (void)c;
    int64_t N = ps_select_n_windows(L, K, S), W = Hkv * D;
    for (int64_t b = 0; b < B && N > 0; b++) ps_select_compress_forward(ck + b * N * W, k + b * L * W, L, Hkv, D, K, S);
    return 0;
}

int ps_cpu_select_scores(ps_ctx *c, float *P, const float *q, const float *k1, const float *k2, const ps_sel_geom *g) {
    (void)c;
    int64_t qs = g->n * g->H * g->D, cs = g->Hkv * g->D, ps = g->n * g->Hkv * g->N1;
    for (int64_t b = 0; b < g->B && ps > 0; b++)
        ps_select_scores_forward(P + b * ps, q + b * qs, g->n, g->pos0, k1 + b * g->N1 * cs, g->N1, k2 ? k2 + b * g->N2 * cs : k2,
                                 g->N2, g->H, g->Hkv, g->D, g->sel.kernel, g->sel.stride);
    return 0;
}

int ps_cpu_select_block_scores(ps_ctx *c, float *bs, const float *P, const ps_sel_geom *g) {
    (void)c;
    int64_t rows = g->n * g->Hkv;
    for (int64_t b = 0; b < g->B && rows * g->nb > 0; b++)
        ps_select_block_scores_forward(bs + b * rows * g->nb, P + b * rows * g->N1, g->n, g->pos0, g->N1, g->nb, g->Hkv, &g->sel);
    return 0;
}

int ps_cpu_select_topk(ps_ctx *c, float *blocks, const float *bs, const ps_sel_geom *g) {
    (void)c;
    int64_t rows = g->n * g->Hkv, ns = ps_select_slots(&g->sel);
    for (int64_t b = 0; b < g->B && rows > 0; b++)
        ps_select_topk_forward(blocks + b * rows * ns, bs + b * rows * g->nb, g->n, g->pos0, g->nb, g->Hkv, &g->sel);
    return 0;
}

int ps_cpu_select_attn(ps_ctx *c, float *z, float *lse, const float *q, const float *k, const float *v, const float *blocks,
                       const ps_sel_geom *g) {
    (void)c;
    int64_t qs = g->n * g->H * g->D, ks = g->L * g->Hkv * g->D, ns = ps_select_slots(&g->sel);
    for (int64_t b = 0; b < g->B; b++)
        ps_select_attn_forward(z + b * qs, lse ? lse + b * g->n * g->H : NULL, q + b * qs, k + b * ks, v + b * ks,
                               blocks ? blocks + b * g->n * g->Hkv * ns : NULL, ns, g->n, g->pos0, g->L, g->sel.block, g->H,
                               g->Hkv, g->D);
    return 0;
}

int ps_cpu_select_backward(ps_ctx *c, float *dq, float *dk, float *dv, const float *dz, const float *z, const float *lse,
                           const float *q, const float *k, const float *v, const float *blocks, const ps_sel_geom *g) {
    (void)c;
    int64_t qs = g->n * g->H * g->D, ks = g->L * g->Hkv * g->D, ns = ps_select_slots(&g->sel);
    for (int64_t b = 0; b < g->B; b++)
        ps_select_attn_backward(dq + b * qs, dk + b * ks, dv + b * ks, dz + b * qs, z + b * qs, lse + b * g->n * g->H, q + b * qs,
                                k + b * ks, v + b * ks, blocks ? blocks + b * g->n * g->Hkv * ns : NULL, ns, g->n, g->pos0, g->L,
                                g->sel.block, g->H, g->Hkv, g->D);
    return 0;
}
