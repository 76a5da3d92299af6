/* select.cu — the CUDA backend's block-sparse selection ops (InfLLM-v2, attention.kind "select"; core/ops.h
 * "block-sparse selection", reference core/cpu/select_cpu.c over core/select.c). Thin kernels: a grid-stride loop
 * over an op's index space calling the body of core/cuda/select_bodies.h for each index (a compressed-key element,
 * a (row, KV head) of the scores and the top-k, a block score, a query head of the attention and of dq, a (key,
 * KV head) of dk / dv). The bodies are checked against the CPU and core/select.c's references on the host by
 * tests/test_cuda_select_bodies.c. The geometry is passed by value; no host array is staged, no scratch taken.
 * Naive by design (correctness first; docs/cuda.md). */
#include "core/cuda/cuda_internal.cuh"
#include "core/cuda/select_bodies.h"

#define TE 256 /* threads per block of the elementwise kernels */
#define TR 64  /* of the row kernels (one thread per row: more blocks over the SMs) */

__global__ void k_select_compress(float *ck, const float *k, int64_t n, int64_t L, int64_t W, int64_t N, int64_t K, int64_t S) {
    GS_LOOP(e, n) ps_selb_compress(ck, k, L, W, N, K, S, e);
}

extern "C" int ps_cuda_select_compress(ps_ctx *c, float *ck, const float *k, int64_t B, int64_t L, int64_t Hkv, int64_t D,
                                       int64_t K, int64_t S) {
    int64_t N = ps_select_n_windows(L, K, S), n = B * N * Hkv * D;
    if (n <= 0) return 0;
    return cu_launch(c, "select_compress", k_select_compress, n, TE, ck, k, n, L, Hkv * D, N, K, S);
}

__global__ void k_select_scores(float *P, const float *q, const float *k1, const float *k2, ps_sel_geom g, int64_t n) {
    GS_LOOP(ih, n) ps_selb_scores_row(P, q, k1, k2, &g, ih);
}

extern "C" int ps_cuda_select_scores(ps_ctx *c, float *P, const float *q, const float *k1, const float *k2, const ps_sel_geom *g) {
    int64_t n = g->B * g->n * g->Hkv;
    if (n <= 0 || g->N1 <= 0) return 0;
    return cu_launch(c, "select_scores", k_select_scores, n, TR, P, q, k1, k2, *g, n);
}

__global__ void k_select_block_scores(float *bs, const float *P, ps_sel_geom g, int64_t n) {
    GS_LOOP(e, n) ps_selb_block_score(bs, P, &g, e);
}

extern "C" int ps_cuda_select_block_scores(ps_ctx *c, float *bs, const float *P, const ps_sel_geom *g) {
    int64_t n = g->B * g->n * g->Hkv * g->nb;
    if (n <= 0) return 0;
    return cu_launch(c, "select_block_scores", k_select_block_scores, n, TE, bs, P, *g, n);
}

__global__ void k_select_topk(float *blocks, const float *bs, ps_sel_geom g, int64_t n) {
    GS_LOOP(r, n) ps_selb_topk_row(blocks, bs, &g, r);
}

extern "C" int ps_cuda_select_topk(ps_ctx *c, float *blocks, const float *bs, const ps_sel_geom *g) {
    int64_t n = g->B * g->n * g->Hkv;
    if (n <= 0) return 0;
    return cu_launch(c, "select_topk", k_select_topk, n, TR, blocks, bs, *g, n);
}

__global__ void k_select_attn(float *z, float *lse, const float *q, const float *k, const float *v, const float *blocks,
                              ps_sel_geom g, int64_t n) {
    GS_LOOP(r, n) ps_selb_attn_row(z, lse, q, k, v, blocks, &g, r);
}

extern "C" int ps_cuda_select_attn(ps_ctx *c, float *z, float *lse, const float *q, const float *k, const float *v,
                                   const float *blocks, const ps_sel_geom *g) {
    int64_t n = g->B * g->n * g->H;
    if (n <= 0) return 0;
    return cu_launch(c, "select_attn", k_select_attn, n, TR, z, lse, q, k, v, blocks, *g, n);
}

__global__ void k_select_dq(float *dq, const float *dz, const float *z, const float *lse, const float *q, const float *k,
                            const float *v, const float *blocks, ps_sel_geom g, int64_t n) {
    GS_LOOP(r, n) ps_selb_dq_row(dq, dz, z, lse, q, k, v, blocks, &g, r);
}

__global__ void k_select_dkv(float *dk, float *dv, const float *dz, const float *z, const float *lse, const float *q,
                             const float *k, const float *v, const float *blocks, ps_sel_geom g, int64_t n) {
    GS_LOOP(e, n) ps_selb_dkv_row(dk, dv, dz, z, lse, q, k, v, blocks, &g, e);
}

extern "C" int ps_cuda_select_backward(ps_ctx *c, float *dq, float *dk, float *dv, const float *dz, const float *z,
                                       const float *lse, const float *q, const float *k, const float *v, const float *blocks,
                                       const ps_sel_geom *g) {
    int64_t nq = g->B * g->n * g->H, nk = g->B * g->L * g->Hkv;
    if (nq > 0 && cu_launch(c, "select_backward (dq)", k_select_dq, nq, TR, dq, dz, z, lse, q, k, v, blocks, *g, nq)) return -1;
    if (nk > 0 && cu_launch(c, "select_backward (dk, dv)", k_select_dkv, nk, TR, dk, dv, dz, z, lse, q, k, v, blocks, *g, nk))
        return -1;
    return 0;
}
