/* v4.cu — the CUDA backend's DeepSeek-V4 ops (core/ops.h, "DeepSeek-V4"; reference core/cpu/ops_cpu_v4.c and
 * ops_cpu_v4_train.c). Thin kernels: a grid-stride loop over an op's index space calling the body of
 * core/cuda/v4_bodies.h for each index (one output element, or one independent row: softmax rows, top-k
 * rows, attention query rows, mHC rows, one thread each). The bodies are checked against the CPU on the
 * host by tests/test_cuda_v4_bodies.c; these launchers add the staging of host arrays (rope frequencies,
 * scatter rows and weights), the scratch (ps_ctx_workspace) and the argument checks the CPU makes.
 * Naive by design (correctness first; docs/cuda.md). */
#include <stdlib.h>

#include "core/cuda/cuda_internal.cuh"
#include "core/cuda/v4_bodies.h"

#define TE 256 /* threads per block of the elementwise kernels */
#define TR 64  /* of the row kernels (one thread per row: more blocks over the SMs) */

#define LAUNCH(kernel, n, threads, ...) kernel<<<cu_grid((n), (threads)), (threads), 0, STREAM(c)>>>(__VA_ARGS__)

/* ---------------- rope ---------------- */

__global__ void k_v4_rope_table(float *cos_t, float *sin_t, const double *inv_freq, int64_t n, int64_t half, float mscale) {
    GS_LOOP(i, n) ps_v4b_rope_table(cos_t, sin_t, inv_freq, half, mscale, i);
}

extern "C" int ps_cuda_v4_rope_table(ps_ctx *c, float *cos_t, float *sin_t, int64_t n_pos, int64_t half,
                                     const double *inv_freq, float mscale) {
    int64_t n = n_pos * half;
    if (n <= 0) return 0;
    const void *h[1] = {inv_freq};
    int64_t by[1] = {half * (int64_t)sizeof(double)};
    void *d[1];
    if (cu_stage(c, 1, h, by, d)) return -1;
    LAUNCH(k_v4_rope_table, n, TE, cos_t, sin_t, (const double *)d[0], n, half, mscale);
    return CU_LAUNCHED(c, "v4_rope_table");
}

__global__ void k_v4_rope(float *x, const float *cos_t, const float *sin_t, int64_t n, int64_t rows_per_seq, int64_t n_heads,
                          int64_t hd, int64_t rd, int64_t pos_step, int inverse) {
    GS_LOOP(i, n) ps_v4b_rope(x, cos_t, sin_t, rows_per_seq, n_heads, hd, rd, pos_step, inverse, i);
}

extern "C" int ps_cuda_v4_rope(ps_ctx *c, float *x, const float *cos_t, const float *sin_t, int64_t n_seq,
                               int64_t rows_per_seq, int64_t n_heads, int64_t hd, int64_t rd, int64_t pos_step, int inverse) {
    int64_t n = n_seq * rows_per_seq * n_heads * (rd / 2);
    if (n <= 0) return 0;
    LAUNCH(k_v4_rope, n, TE, x, cos_t, sin_t, n, rows_per_seq, n_heads, hd, rd, pos_step, inverse);
    return CU_LAUNCHED(c, "v4_rope");
}

/* ---------------- mHC ---------------- */

__global__ void k_v4_hc_weights(float *pre, float *post, float *comb, const float *mix, const float *x, const float *scale,
                                const float *base, int64_t n, int64_t N, int64_t D, int64_t iters, float hc_eps,
                                float norm_eps, double *cm) {
    GS_LOOP(r, n)
    ps_v4b_hc_weights_row(pre, post, comb, mix, x, scale, base, N, D, iters, hc_eps, norm_eps, cm ? cm + r * N * N : cm, r);
}

extern "C" int ps_cuda_v4_hc_weights(ps_ctx *c, float *pre, float *post, float *comb, const float *mix, const float *x,
                                     const float *scale, const float *base, int64_t n, int64_t N, int64_t D, int64_t iters,
                                     float hc_eps, float norm_eps) {
    if (N > 64) return ps_ctx_fail(c, "v4_hc_weights: %lld streams (at most 64)", (long long)N);
    if (n <= 0) return 0;
    double *cm = NULL;
    if (post) { /* the Sinkhorn matrices, N·N doubles per row */
        cm = (double *)ps_ctx_workspace(c, 2 * n * N * N);
        if (!cm) return -1;
    }
    LAUNCH(k_v4_hc_weights, n, TR, pre, post, comb, mix, x, scale, base, n, N, D, iters, hc_eps, norm_eps, cm);
    return CU_LAUNCHED(c, "v4_hc_weights");
}

__global__ void k_v4_hc_collapse(float *out, const float *pre, const float *h, int64_t n, int64_t N, int64_t D) {
    GS_LOOP(i, n) ps_v4b_hc_collapse(out, pre, h, N, D, i);
}

extern "C" int ps_cuda_v4_hc_collapse(ps_ctx *c, float *out, const float *pre, const float *h, int64_t n, int64_t N,
                                      int64_t D) {
    if (n * D <= 0) return 0;
    LAUNCH(k_v4_hc_collapse, n * D, TE, out, pre, h, n * D, N, D);
    return CU_LAUNCHED(c, "v4_hc_collapse");
}

__global__ void k_v4_hc_expand(float *hout, const float *post, const float *comb, const float *blk, const float *h, int64_t n,
                               int64_t N, int64_t D) {
    GS_LOOP(i, n) ps_v4b_hc_expand(hout, post, comb, blk, h, N, D, i);
}

extern "C" int ps_cuda_v4_hc_expand(ps_ctx *c, float *hout, const float *post, const float *comb, const float *blk,
                                    const float *h, int64_t n, int64_t N, int64_t D) {
    if (n * N * D <= 0) return 0;
    LAUNCH(k_v4_hc_expand, n * N * D, TE, hout, post, comb, blk, h, n * N * D, N, D);
    return CU_LAUNCHED(c, "v4_hc_expand");
}

/* ---------------- compressor ---------------- */

__global__ void k_v4_comp_slots(float *gate, const float *z, const float *ape, int64_t n, int64_t T, int64_t nW, int64_t m,
                                int64_t d, int overlap) {
    GS_LOOP(i, n) ps_v4b_comp_slots(gate, z, ape, T, nW, m, d, overlap, i);
}

extern "C" int ps_cuda_v4_comp_slots(ps_ctx *c, float *gate, const float *z, const float *ape, int64_t B, int64_t T,
                                     int64_t nW, int64_t m, int64_t d, int overlap) {
    int64_t n = B * nW * (overlap ? 2 * m : m) * d;
    if (n <= 0) return 0;
    LAUNCH(k_v4_comp_slots, n, TE, gate, z, ape, n, T, nW, m, d, overlap);
    return CU_LAUNCHED(c, "v4_comp_slots");
}

__global__ void k_v4_slot_softmax(float *alpha, const float *gate, int64_t n, int64_t S, int64_t d) {
    GS_LOOP(i, n) ps_v4b_slot_softmax_col(alpha, gate, S, d, i);
}

extern "C" int ps_cuda_v4_slot_softmax(ps_ctx *c, float *alpha, const float *gate, int64_t n_groups, int64_t S, int64_t d) {
    if (n_groups * d <= 0 || S <= 0) return 0;
    LAUNCH(k_v4_slot_softmax, n_groups * d, TE, alpha, gate, n_groups * d, S, d);
    return CU_LAUNCHED(c, "v4_slot_softmax");
}

__global__ void k_v4_comp_pool(float *pooled, const float *alpha, const float *kv, int64_t n, int64_t T, int64_t nW,
                               int64_t m, int64_t d, int overlap) {
    GS_LOOP(i, n) ps_v4b_comp_pool(pooled, alpha, kv, T, nW, m, d, overlap, i);
}

extern "C" int ps_cuda_v4_comp_pool(ps_ctx *c, float *pooled, const float *alpha, const float *kv, int64_t B, int64_t T,
                                    int64_t nW, int64_t m, int64_t d, int overlap) {
    int64_t n = B * nW * d;
    if (n <= 0) return 0;
    LAUNCH(k_v4_comp_pool, n, TE, pooled, alpha, kv, n, T, nW, m, d, overlap);
    return CU_LAUNCHED(c, "v4_comp_pool");
}

/* ---------------- indexer, top-k, routing, experts ---------------- */

__global__ void k_v4_indexer_scores(float *scores, const float *iq, const float *ik, const float *w, int64_t n, int64_t T,
                                    int64_t nW, int64_t Hi, int64_t Di, float scale) {
    GS_LOOP(i, n) ps_v4b_indexer_scores(scores, iq, ik, w, T, nW, Hi, Di, scale, i);
}

extern "C" int ps_cuda_v4_indexer_scores(ps_ctx *c, float *scores, const float *iq, const float *ik, const float *w,
                                         int64_t B, int64_t T, int64_t nW, int64_t Hi, int64_t Di, float scale) {
    int64_t n = B * T * nW;
    if (n <= 0) return 0;
    LAUNCH(k_v4_indexer_scores, n, TE, scores, iq, ik, w, n, T, nW, Hi, Di, scale);
    return CU_LAUNCHED(c, "v4_indexer_scores");
}

__global__ void k_v4_topk(float *idx, float *gap, const float *scores, const float *bias, int64_t n_rows, int64_t n_cols,
                          int64_t K, int64_t rows_per_seq, int64_t m) {
    GS_LOOP(r, n_rows) ps_v4b_topk_row(idx, gap, scores, bias, n_cols, K, rows_per_seq, m, r);
}

extern "C" int ps_cuda_v4_topk(ps_ctx *c, float *idx, float *gap, const float *scores, const float *bias, int64_t n_rows,
                               int64_t n_cols, int64_t K, int64_t rows_per_seq, int64_t m) {
    if (K < 0) return ps_ctx_fail(c, "v4_topk: K = %lld", (long long)K);
    if (m > 0 && rows_per_seq <= 0) return ps_ctx_fail(c, "v4_topk: rows_per_seq = %lld", (long long)rows_per_seq);
    if (n_rows <= 0) return 0;
    LAUNCH(k_v4_topk, n_rows, TR, idx, gap, scores, bias, n_rows, n_cols, K, rows_per_seq, m);
    return CU_LAUNCHED(c, "v4_topk");
}

__global__ void k_v4_router_scores(float *scores, const float *logits, int64_t n, int scoring) {
    GS_LOOP(i, n) ps_v4b_router_scores(scores, logits, scoring, i);
}

extern "C" int ps_cuda_v4_router_scores(ps_ctx *c, float *scores, const float *logits, int64_t n, int scoring) {
    if (n <= 0) return 0;
    LAUNCH(k_v4_router_scores, n, TE, scores, logits, n, scoring);
    return CU_LAUNCHED(c, "v4_router_scores");
}

__global__ void k_v4_route_weights(float *weights, const float *scores, const float *idx, int64_t n, int64_t E, int64_t k,
                                   float scale) {
    GS_LOOP(r, n) ps_v4b_route_weights_row(weights, scores, idx, E, k, scale, r);
}

extern "C" int ps_cuda_v4_route_weights(ps_ctx *c, float *weights, const float *scores, const float *idx, int64_t n,
                                        int64_t E, int64_t k, float scale) {
    if (n * k <= 0) return 0;
    /* the CPU's check of the indices, on a host copy (the runtime has just read them back itself) */
    float *hx = (float *)malloc((size_t)(n * k) * sizeof(float));
    if (!hx) return ps_ctx_fail(c, "v4_route_weights: out of host memory for %lld indices", (long long)(n * k));
    if (ps_cuda_to_host(c, hx, idx, n * k * (int64_t)sizeof(float))) {
        free(hx);
        return -1;
    }
    for (int64_t i = 0; i < n * k; i++)
        if (!(hx[i] >= 0 && hx[i] < (float)E) || hx[i] != floorf(hx[i])) {
            double v = hx[i];
            free(hx);
            return ps_ctx_fail(c, "v4_route_weights: expert index %g at row %lld is not in [0, %lld)", v, (long long)(i / k),
                               (long long)E);
        }
    free(hx);
    LAUNCH(k_v4_route_weights, n, TR, weights, scores, idx, n, E, k, scale);
    return CU_LAUNCHED(c, "v4_route_weights");
}

__global__ void k_v4_swiglu_clamp(float *h, const float *g, const float *u, int64_t n, float limit) {
    GS_LOOP(i, n) ps_v4b_swiglu_clamp(h, g, u, limit, i);
}

extern "C" int ps_cuda_v4_swiglu_clamp(ps_ctx *c, float *h, const float *g, const float *u, int64_t n, float limit) {
    if (n <= 0) return 0;
    LAUNCH(k_v4_swiglu_clamp, n, TE, h, g, u, n, limit);
    return CU_LAUNCHED(c, "v4_swiglu_clamp");
}

__global__ void k_v4_scatter_add(float *out, const float *in, const int64_t *rows, const float *w, const int64_t *order,
                                 const int64_t *off, int64_t n, int64_t width) {
    GS_LOOP(i, n) ps_v4b_scatter_add(out, in, rows, w, order, off, width, i);
}

extern "C" int ps_cuda_v4_scatter_add_rows(ps_ctx *c, float *out, const float *in, const int64_t *rows, const float *w,
                                           int64_t n, int64_t width) {
    if (n <= 0 || width <= 0) return 0;
    /* sources grouped by destination row on the host (one thread per destination element adds its sources
     * in the order of i: no atomics, the CPU's order) */
    int64_t *o = (int64_t *)malloc((size_t)(3 * n + 1) * sizeof(int64_t));
    if (!o) return ps_ctx_fail(c, "v4_scatter_add_rows: out of host memory for %lld rows", (long long)n);
    int64_t ng = ps_v4b_group_rows(rows, n, o); /* order [n], off [ng + 1] */
    const void *h[3] = {rows, w, o};
    int64_t by[3] = {n * 8, n * (int64_t)sizeof(float), (n + ng + 1) * 8};
    void *d[3];
    int rc = cu_stage(c, 3, h, by, d);
    free(o);
    if (rc) return -1;
    const int64_t *dord = (const int64_t *)d[2];
    LAUNCH(k_v4_scatter_add, ng * width, TE, out, in, (const int64_t *)d[0], (const float *)d[1], dord, dord + n, ng * width,
           width);
    return CU_LAUNCHED(c, "v4_scatter_add_rows");
}

/* ---------------- attention ---------------- */

__global__ void k_v4_attn(float *out, float *sinkp, const float *q, const float *kv, const float *ckv, const float *topk,
                          const float *sink, ps_v4_attn_geom g, int64_t n) {
    GS_LOOP(i, n) ps_v4b_attn_row(out, sinkp, q, kv, ckv, topk, sink, &g, i);
}

extern "C" int ps_cuda_v4_attn(ps_ctx *c, float *out, float *sinkp, const float *q, const float *kv, const float *ckv,
                               const float *topk, const float *sink, const ps_v4_attn_geom *g) {
    int64_t n = g->B * g->T * g->H;
    if (n <= 0) return 0;
    LAUNCH(k_v4_attn, n, TR, out, sinkp, q, kv, ckv, topk, sink, *g, n);
    return CU_LAUNCHED(c, "v4_attn");
}

__global__ void k_v4_attn_bias(float *bias, const float *topk, ps_v4_attn_geom g, int64_t n) {
    GS_LOOP(i, n) ps_v4b_attn_bias(bias, topk, &g, i);
}

extern "C" int ps_cuda_v4_attn_bias(ps_ctx *c, float *bias, const float *topk, const ps_v4_attn_geom *g) {
    int64_t n = g->B * g->T * (g->T + g->nW);
    if (n <= 0) return 0;
    LAUNCH(k_v4_attn_bias, n, TE, bias, topk, *g, n);
    return CU_LAUNCHED(c, "v4_attn_bias");
}

__global__ void k_v4_attn_logits(float *logits, const float *q, const float *kv, const float *ckv, const float *bias,
                                 ps_v4_attn_geom g, int64_t n) {
    GS_LOOP(i, n) ps_v4b_attn_logits(logits, q, kv, ckv, bias, &g, i);
}

extern "C" int ps_cuda_v4_attn_logits(ps_ctx *c, float *logits, const float *q, const float *kv, const float *ckv,
                                      const float *bias, const ps_v4_attn_geom *g) {
    int64_t n = g->B * g->H * g->T * (g->T + g->nW);
    if (n <= 0) return 0;
    LAUNCH(k_v4_attn_logits, n, TE, logits, q, kv, ckv, bias, *g, n);
    return CU_LAUNCHED(c, "v4_attn_logits");
}

__global__ void k_v4_attn_softmax(float *pattern, float *sinkp, const float *logits, const float *sink, ps_v4_attn_geom g,
                                  int64_t n) {
    GS_LOOP(r, n) ps_v4b_attn_softmax_row(pattern, sinkp, logits, sink, &g, r);
}

extern "C" int ps_cuda_v4_attn_softmax(ps_ctx *c, float *pattern, float *sinkp, const float *logits, const float *sink,
                                       const ps_v4_attn_geom *g) {
    int64_t n = g->B * g->H * g->T;
    if (n <= 0) return 0;
    LAUNCH(k_v4_attn_softmax, n, TR, pattern, sinkp, logits, sink, *g, n);
    return CU_LAUNCHED(c, "v4_attn_softmax");
}

__global__ void k_v4_attn_apply(float *out, const float *pattern, const float *kv, const float *ckv, ps_v4_attn_geom g,
                                int64_t n) {
    GS_LOOP(i, n) ps_v4b_attn_apply(out, pattern, kv, ckv, &g, i);
}

extern "C" int ps_cuda_v4_attn_apply(ps_ctx *c, float *out, const float *pattern, const float *kv, const float *ckv,
                                     const ps_v4_attn_geom *g) {
    int64_t n = g->B * g->H * g->T * g->Dh;
    if (n <= 0) return 0;
    LAUNCH(k_v4_attn_apply, n, TE, out, pattern, kv, ckv, *g, n);
    return CU_LAUNCHED(c, "v4_attn_apply");
}

__global__ void k_v4_sink_rescale(float *out, const float *sink_old, const float *sink_new, ps_v4_attn_geom g, int64_t n) {
    GS_LOOP(i, n) ps_v4b_sink_rescale(out, sink_old, sink_new, &g, i);
}

extern "C" int ps_cuda_v4_sink_rescale(ps_ctx *c, float *out, const float *sink_old, const float *sink_new,
                                       const ps_v4_attn_geom *g) {
    int64_t n = g->B * g->T * g->H * g->Dh;
    if (n <= 0) return 0;
    LAUNCH(k_v4_sink_rescale, n, TE, out, sink_old, sink_new, *g, n);
    return CU_LAUNCHED(c, "v4_sink_rescale");
}

__global__ void k_v4_grouped_linear(float *out, const float *inp, const float *w, int64_t n, int64_t G, int64_t Kg,
                                    int64_t Ng) {
    GS_LOOP(i, n) ps_v4b_grouped_linear(out, inp, w, G, Kg, Ng, i);
}

extern "C" int ps_cuda_v4_grouped_linear(ps_ctx *c, float *out, const float *inp, const float *w, int64_t M, int64_t G,
                                         int64_t Kg, int64_t Ng) {
    int64_t n = M * G * Ng;
    if (n <= 0) return 0;
    LAUNCH(k_v4_grouped_linear, n, TE, out, inp, w, n, G, Kg, Ng);
    return CU_LAUNCHED(c, "v4_grouped_linear");
}

__global__ void k_v4_scale(float *x, float s, int64_t n) {
    GS_LOOP(i, n) ps_v4b_scale(x, s, i);
}

extern "C" int ps_cuda_v4_scale(ps_ctx *c, float *x, float s, int64_t n) {
    if (n <= 0) return 0;
    LAUNCH(k_v4_scale, n, TE, x, s, n);
    return CU_LAUNCHED(c, "v4_scale");
}

/* ---------------- backward of the trainable compressor ---------------- */

__global__ void k_v4_comp_slots_bwd_dz(float *dz, const float *dgate, int64_t n, int64_t T, int64_t nW, int64_t m, int64_t d,
                                       int overlap) {
    GS_LOOP(i, n) ps_v4b_comp_slots_bwd_dz(dz, dgate, T, nW, m, d, overlap, i);
}

__global__ void k_v4_comp_slots_bwd_dape(float *dape, const float *dgate, int64_t n, int64_t B, int64_t nW, int64_t m,
                                         int64_t d, int overlap) {
    GS_LOOP(i, n) ps_v4b_comp_slots_bwd_dape(dape, dgate, B, nW, m, d, overlap, i);
}

extern "C" int ps_cuda_v4_comp_slots_backward(ps_ctx *c, float *dz, float *dape, const float *dgate, int64_t B, int64_t T,
                                              int64_t nW, int64_t m, int64_t d, int overlap) {
    int64_t nz = B * T * (overlap ? 2 : 1) * d, na = (overlap ? 2 * m : m) * d;
    if (nz > 0) {
        LAUNCH(k_v4_comp_slots_bwd_dz, nz, TE, dz, dgate, nz, T, nW, m, d, overlap);
        if (CU_LAUNCHED(c, "v4_comp_slots_backward dz")) return -1;
    }
    if (na > 0 && B * nW > 0) {
        LAUNCH(k_v4_comp_slots_bwd_dape, na, TR, dape, dgate, na, B, nW, m, d, overlap);
        if (CU_LAUNCHED(c, "v4_comp_slots_backward dape")) return -1;
    }
    return 0;
}

__global__ void k_v4_slot_softmax_bwd(float *dgate, const float *dalpha, const float *alpha, int64_t n, int64_t S, int64_t d) {
    GS_LOOP(i, n) ps_v4b_slot_softmax_bwd_col(dgate, dalpha, alpha, S, d, i);
}

extern "C" int ps_cuda_v4_slot_softmax_backward(ps_ctx *c, float *dgate, const float *dalpha, const float *alpha,
                                                int64_t n_groups, int64_t S, int64_t d) {
    if (n_groups * d <= 0 || S <= 0) return 0;
    LAUNCH(k_v4_slot_softmax_bwd, n_groups * d, TE, dgate, dalpha, alpha, n_groups * d, S, d);
    return CU_LAUNCHED(c, "v4_slot_softmax_backward");
}

__global__ void k_v4_comp_pool_bwd_dalpha(float *dalpha, const float *dpooled, const float *kv, int64_t n, int64_t T,
                                          int64_t nW, int64_t m, int64_t d, int overlap) {
    GS_LOOP(i, n) ps_v4b_comp_pool_bwd_dalpha(dalpha, dpooled, kv, T, nW, m, d, overlap, i);
}

__global__ void k_v4_comp_pool_bwd_dkv(float *dkv, const float *dpooled, const float *alpha, int64_t n, int64_t T, int64_t nW,
                                       int64_t m, int64_t d, int overlap) {
    GS_LOOP(i, n) ps_v4b_comp_pool_bwd_dkv(dkv, dpooled, alpha, T, nW, m, d, overlap, i);
}

extern "C" int ps_cuda_v4_comp_pool_backward(ps_ctx *c, float *dalpha, float *dkv, const float *dpooled, const float *alpha,
                                             const float *kv, int64_t B, int64_t T, int64_t nW, int64_t m, int64_t d,
                                             int overlap) {
    int64_t na = B * nW * (overlap ? 2 * m : m) * d, nk = B * T * (overlap ? 2 : 1) * d;
    if (na > 0) {
        LAUNCH(k_v4_comp_pool_bwd_dalpha, na, TE, dalpha, dpooled, kv, na, T, nW, m, d, overlap);
        if (CU_LAUNCHED(c, "v4_comp_pool_backward dalpha")) return -1;
    }
    if (nk > 0) {
        LAUNCH(k_v4_comp_pool_bwd_dkv, nk, TE, dkv, dpooled, alpha, nk, T, nW, m, d, overlap);
        if (CU_LAUNCHED(c, "v4_comp_pool_backward dkv")) return -1;
    }
    return 0;
}

/* ---------------- backward of the attention with a sink ---------------- */

__global__ void k_v4_attn_bwd_row(float *dq, float *lse, float *Dr, float *es, const float *dout, const float *out,
                                  const float *q, const float *kv, const float *ckv, const float *sink, ps_v4_attn_geom g,
                                  int64_t n) {
    GS_LOOP(i, n) ps_v4b_attn_bwd_row(dq, lse, Dr, es, dout, out, q, kv, ckv, sink, &g, i);
}

__global__ void k_v4_attn_bwd_dkv(float *dkv, const float *lse, const float *Dr, const float *dout, const float *q,
                                  const float *kv, ps_v4_attn_geom g, int64_t n) {
    GS_LOOP(i, n) ps_v4b_attn_bwd_dkv_row(dkv, lse, Dr, dout, q, kv, &g, i);
}

__global__ void k_v4_attn_bwd_dckv(float *dckv, const float *lse, const float *Dr, const float *dout, const float *q,
                                   const float *ckv, ps_v4_attn_geom g, int64_t n) {
    GS_LOOP(i, n) ps_v4b_attn_bwd_dckv_row(dckv, lse, Dr, dout, q, ckv, &g, i);
}

__global__ void k_v4_attn_bwd_dsink(float *dsink, const float *es, ps_v4_attn_geom g) {
    GS_LOOP(h, g.H) ps_v4b_attn_bwd_dsink(dsink, es, &g, h);
}

extern "C" int ps_cuda_v4_attn_backward(ps_ctx *c, float *dq, float *dkv, float *dckv, float *dsink, const float *dout,
                                        const float *out, const float *q, const float *kv, const float *ckv,
                                        const float *sink, const ps_v4_attn_geom *g) {
    if (g->K > 0)
        return ps_ctx_fail(c, "v4_attn_backward: the indexer's selection (K = %lld) has no backward", (long long)g->K);
    int64_t rows = g->B * g->T * g->H;
    if (rows <= 0) return 0;
    /* workspace: lse, D = dout·out and the sink term of every row */
    float *ws = ps_ctx_workspace(c, 3 * rows);
    if (!ws) return -1;
    float *lse = ws, *Dr = ws + rows, *es = ws + 2 * rows;
    LAUNCH(k_v4_attn_bwd_row, rows, TR, dq, lse, Dr, es, dout, out, q, kv, ckv, sink, *g, rows);
    if (CU_LAUNCHED(c, "v4_attn_backward rows")) return -1;
    LAUNCH(k_v4_attn_bwd_dkv, g->B * g->T, TR, dkv, lse, Dr, dout, q, kv, *g, g->B * g->T);
    if (CU_LAUNCHED(c, "v4_attn_backward dkv")) return -1;
    if (g->nW > 0 && dckv) {
        LAUNCH(k_v4_attn_bwd_dckv, g->B * g->nW, TR, dckv, lse, Dr, dout, q, ckv, *g, g->B * g->nW);
        if (CU_LAUNCHED(c, "v4_attn_backward dckv")) return -1;
    }
    if (dsink) {
        LAUNCH(k_v4_attn_bwd_dsink, g->H, 32, dsink, es, *g);
        if (CU_LAUNCHED(c, "v4_attn_backward dsink")) return -1;
    }
    return 0;
}
