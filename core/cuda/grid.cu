/* grid.cu — the compressor ops on window grids with start offsets (staggered grids, phase augmentation), on
 * content-defined chunks (attention.boundaries "content") and the gate regulariser, on the device
 * (docs/cuda.md, docs/mitigations.md; semantics core/ops.h; reference core/cpu/windows.c, core/cpu/grid.c).
 *
 * The arithmetic lives in core/cuda/grid_bodies.h (valid C and CUDA, checked on the host against the CPU
 * backend by tests/test_cuda_grid_bodies.c); each kernel here is a grid-stride loop calling one body per
 * element or row, in the index space the test walks. The host arrays woff [B, nkv], cs/cl [B, nC] are
 * validated as on the CPU (same messages) and staged with cu_stage. Parameter gradients are one body per
 * parameter element looping over the rows in the CPU's order (no atomics: deterministic). The shared
 * payload is one GEMM (ps_cuda_matmul) and a gather, its backward a scatter and ps_cuda_matmul_backward.
 *
 * The op table's compressor ops (ps_cuda_gate, _payload, _rope_windows and the backward; core/backend.h
 * ps_windows) are at the end: a window table that is the base grid runs compressor.cu's kernels, a table the
 * heads share (content chunks, any starts and lengths) the chunk kernels over the table itself, and a table
 * per head that is an offset grid the grid kernels with the offsets read off the table; backend_cuda.c's
 * supports() declines any other per-head table. */
#include <stdlib.h>

#include "core/cuda/cuda_internal.cuh"
#include "core/cuda/grid_bodies.h"

#define T256 256

/* ---------------- checks and staging (host) ---------------- */

static int check_woff(ps_ctx *c, const char *op, const int64_t *woff, int64_t B, int64_t nkv, int64_t S) {
    if (!woff) return 0;
    for (int64_t i = 0; i < B * nkv; i++)
        if (woff[i] < 0 || woff[i] >= S)
            return ps_ctx_fail(c, "%s: window offset %lld of sequence %lld, KV head %lld is outside [0, S = %lld)", op,
                               (long long)woff[i], (long long)(i / nkv), (long long)(i % nkv), (long long)S);
    return 0;
}

static int check_chunks(ps_ctx *c, const char *op, const int64_t *cs, const int64_t *cl, int64_t B, int64_t T, int64_t nC,
                        int64_t W) {
    if (!cs || !cl) return ps_ctx_fail(c, "%s: no chunk table (content boundaries need the tokens of the batch)", op);
    for (int64_t i = 0; i < B * nC; i++)
        if (cl[i] < 0 || cl[i] > W || (cl[i] > 0 && (cs[i] < 0 || cs[i] + cl[i] > T)))
            return ps_ctx_fail(c, "%s: chunk %lld of sequence %lld (start %lld, length %lld) is outside [0, T = %lld) or longer than W = %lld",
                               op, (long long)(i % nC), (long long)(i / nC), (long long)cs[i], (long long)cl[i], (long long)T,
                               (long long)W);
    return 0;
}

/* validate woff and stage it (NULL stays NULL) */
static int grid_prep(ps_ctx *c, const char *op, const int64_t *woff, int64_t B, int64_t nkv, int64_t S, const int64_t **dw) {
    *dw = NULL;
    if (c->failed) return -1;
    if (check_woff(c, op, woff, B, nkv, S)) return -1;
    if (!woff || B * nkv <= 0) return 0;
    const void *h[1] = {woff};
    int64_t by[1] = {B * nkv * (int64_t)sizeof(int64_t)};
    void *d[1];
    if (cu_stage(c, 1, h, by, d)) return -1;
    *dw = (const int64_t *)d[0];
    return 0;
}

/* validate the chunk table and stage it */
static int chunks_prep(ps_ctx *c, const char *op, const int64_t *cs, const int64_t *cl, int64_t B, int64_t T, int64_t nC,
                       int64_t W, const int64_t **dcs, const int64_t **dcl) {
    *dcs = *dcl = NULL;
    if (c->failed) return -1;
    if (check_chunks(c, op, cs, cl, B, T, nC, W)) return -1;
    if (B * nC <= 0) return 0;
    const void *h[2] = {cs, cl};
    int64_t by[2] = {B * nC * (int64_t)sizeof(int64_t), B * nC * (int64_t)sizeof(int64_t)};
    void *d[2];
    if (cu_stage(c, 2, h, by, d)) return -1;
    *dcs = (const int64_t *)d[0];
    *dcl = (const int64_t *)d[1];
    return 0;
}

#define LAUNCH(n) <<<cu_grid((n), T256), T256, 0, STREAM(c)>>>

/* ---------------- kernels: one body per index ---------------- */

__global__ void k_gate_grid_logit(float *z, const float *a, const float *u, const float *bias, int64_t n, int64_t T, int64_t d,
                                  int64_t nW, int64_t W, int64_t S, int64_t nkv, const int64_t *woff) {
    GS_LOOP(wi, n) ps_gb_gate_grid_logit(z, a, u, bias, T, d, nW, W, S, nkv, woff, wi);
}
__global__ void k_gate_grid_row(float *z, float *alpha, int64_t n, int64_t T, int64_t nW, int64_t W, int64_t S, int64_t nkv,
                                const int64_t *woff, int uniform) {
    GS_LOOP(row, n) ps_gb_gate_grid_row(z, alpha, T, nW, W, S, nkv, woff, uniform, row);
}
__global__ void k_gate_chunks_logit(float *z, const float *a, const float *u, const float *bias, int64_t n, int64_t T,
                                    int64_t d, int64_t nC, int64_t W, int64_t nkv, const int64_t *cs, const int64_t *cl) {
    GS_LOOP(wi, n) ps_gb_gate_chunks_logit(z, a, u, bias, T, d, nC, W, nkv, cs, cl, wi);
}
__global__ void k_gate_chunks_row(float *z, float *alpha, int64_t n, int64_t W, int64_t nkv, const int64_t *cl, int uniform) {
    GS_LOOP(row, n) ps_gb_gate_chunks_row(z, alpha, W, nkv, cl, uniform, row);
}
__global__ void k_softmax_backward(float *dalpha, const float *alpha, int64_t n, int64_t W) {
    GS_LOOP(row, n) ps_gb_softmax_backward_row(dalpha, alpha, W, row);
}
__global__ void k_gate_grid_du(float *du, const float *dz, const float *a, int64_t n, int64_t B, int64_t T, int64_t d,
                               int64_t nW, int64_t W, int64_t S, int64_t nkv, const int64_t *woff) {
    GS_LOOP(idx, n) ps_gb_gate_grid_du(du, dz, a, B, T, d, nW, W, S, nkv, woff, idx);
}
__global__ void k_gate_grid_dbias(float *dc, const float *dz, int64_t n, int64_t B, int64_t T, int64_t nW, int64_t W, int64_t S,
                                  int64_t nkv, const int64_t *woff) {
    GS_LOOP(ig, n) ps_gb_gate_grid_dbias(dc, dz, B, T, nW, W, S, nkv, woff, ig);
}
__global__ void k_gate_grid_da(float *da, const float *dz, const float *u, int64_t n, int64_t T, int64_t d, int64_t nW,
                               int64_t W, int64_t S, int64_t nkv, const int64_t *woff) {
    GS_LOOP(idx, n) ps_gb_gate_grid_da(da, dz, u, T, d, nW, W, S, nkv, woff, idx);
}
__global__ void k_gate_chunks_du(float *du, const float *dz, const float *a, int64_t n, int64_t B, int64_t T, int64_t d,
                                 int64_t nC, int64_t W, int64_t nkv, const int64_t *cs, const int64_t *cl) {
    GS_LOOP(idx, n) ps_gb_gate_chunks_du(du, dz, a, B, T, d, nC, W, nkv, cs, cl, idx);
}
__global__ void k_gate_chunks_dbias(float *dc, const float *dz, int64_t n, int64_t B, int64_t nC, int64_t W, int64_t nkv,
                                    const int64_t *cl) {
    GS_LOOP(ig, n) ps_gb_gate_chunks_dbias(dc, dz, B, nC, W, nkv, cl, ig);
}
__global__ void k_gate_chunks_da(float *da, const float *dz, const float *u, int64_t n, int64_t T, int64_t d, int64_t nC,
                                 int64_t W, int64_t nkv, const int64_t *cs, const int64_t *cl) {
    GS_LOOP(idx, n) ps_gb_gate_chunks_da(da, dz, u, T, d, nC, W, nkv, cs, cl, idx);
}
__global__ void k_payload_grid_gather(float *P, const float *scratch, int64_t n, int64_t T, int64_t nW, int64_t W, int64_t S,
                                      int64_t nkv, int64_t hd, const int64_t *woff) {
    GS_LOOP(idx, n) ps_gb_payload_grid_gather(P, scratch, T, nW, W, S, nkv, hd, woff, idx);
}
__global__ void k_payload_grid_elem(float *P, const float *a, const float *C, int64_t n, int64_t T, int64_t d, int64_t nW,
                                    int64_t W, int64_t S, int64_t nkv, int64_t hd, const int64_t *woff) {
    GS_LOOP(idx, n) ps_gb_payload_grid_elem(P, a, C, T, d, nW, W, S, nkv, hd, woff, idx);
}
__global__ void k_payload_chunks_gather(float *P, const float *scratch, int64_t n, int64_t T, int64_t nC, int64_t W, int64_t nk,
                                        const int64_t *cs, const int64_t *cl) {
    GS_LOOP(idx, n) ps_gb_payload_chunks_gather(P, scratch, T, nC, W, nk, cs, cl, idx);
}
__global__ void k_payload_chunks_elem(float *P, const float *a, const float *C, int64_t n, int64_t T, int64_t d, int64_t nC,
                                      int64_t W, int64_t nk, const int64_t *cs, const int64_t *cl) {
    GS_LOOP(idx, n) ps_gb_payload_chunks_elem(P, a, C, T, d, nC, W, nk, cs, cl, idx);
}
__global__ void k_payload_grid_scatter(float *scratch, const float *dP, int64_t n, int64_t T, int64_t nW, int64_t W, int64_t S,
                                       int64_t nkv, int64_t hd, const int64_t *woff) {
    GS_LOOP(idx, n) ps_gb_payload_grid_scatter(scratch, dP, T, nW, W, S, nkv, hd, woff, idx);
}
__global__ void k_payload_grid_dC(float *dC, const float *dP, const float *a, int64_t n, int64_t B, int64_t T, int64_t d,
                                  int64_t nW, int64_t W, int64_t S, int64_t nkv, int64_t hd, const int64_t *woff) {
    GS_LOOP(idx, n) ps_gb_payload_grid_dC(dC, dP, a, B, T, d, nW, W, S, nkv, hd, woff, idx);
}
__global__ void k_payload_grid_da(float *da, const float *dP, const float *C, int64_t n, int64_t T, int64_t d, int64_t nW,
                                  int64_t W, int64_t S, int64_t nkv, int64_t hd, const int64_t *woff) {
    GS_LOOP(idx, n) ps_gb_payload_grid_da(da, dP, C, T, d, nW, W, S, nkv, hd, woff, idx);
}
__global__ void k_payload_chunks_scatter(float *scratch, const float *dP, int64_t n, int64_t T, int64_t nC, int64_t W,
                                         int64_t nk, const int64_t *cs, const int64_t *cl) {
    GS_LOOP(idx, n) ps_gb_payload_chunks_scatter(scratch, dP, T, nC, W, nk, cs, cl, idx);
}
__global__ void k_payload_chunks_dC(float *dC, const float *dP, const float *a, int64_t n, int64_t B, int64_t T, int64_t d,
                                    int64_t nC, int64_t W, int64_t nk, const int64_t *cs, const int64_t *cl) {
    GS_LOOP(idx, n) ps_gb_payload_chunks_dC(dC, dP, a, B, T, d, nC, W, nk, cs, cl, idx);
}
__global__ void k_payload_chunks_da(float *da, const float *dP, const float *C, int64_t n, int64_t T, int64_t d, int64_t nC,
                                    int64_t W, int64_t nk, const int64_t *cs, const int64_t *cl) {
    GS_LOOP(idx, n) ps_gb_payload_chunks_da(da, dP, C, T, d, nC, W, nk, cs, cl, idx);
}
__global__ void k_rope_grid(float *x, const float *cos_t, const float *sin_t, int64_t n, int64_t T, int64_t nW, int64_t nkv,
                            int64_t hd, int64_t S, const int64_t *woff, float dir) {
    GS_LOOP(idx, n) ps_gb_rope_grid_pair(x, cos_t, sin_t, T, nW, nkv, hd, S, woff, dir, idx);
}
__global__ void k_rope_chunks(float *x, const float *cos_t, const float *sin_t, int64_t n, int64_t nkv, int64_t hd,
                              const int64_t *cs, const int64_t *cl, float dir) {
    GS_LOOP(idx, n) ps_gb_rope_chunks_pair(x, cos_t, sin_t, nkv, hd, cs, cl, dir, idx);
}
__global__ void k_entropy_mean(double *m, double *cnt, const float *alpha, int64_t n, int64_t nbj, int64_t nkv, int64_t W) {
    GS_LOOP(idx, n) ps_gb_entropy_mean(m, cnt, alpha, nbj, nkv, W, idx);
}
__global__ void k_entropy_value(double *val, const double *m, const double *cnt, int64_t nkv, int64_t W, double weight) {
    GS_LOOP(g, nkv) ps_gb_entropy_value(val, m, cnt, W, weight, g);
}
__global__ void k_entropy_grad(float *dalpha, const float *alpha, const double *m, const double *cnt, int64_t n, int64_t nkv,
                               int64_t W, double weight) {
    GS_LOOP(idx, n) ps_gb_entropy_grad(dalpha, alpha, m, cnt, nkv, W, weight, idx);
}

/* ---------------- window grids with offsets ---------------- */

extern "C" int ps_cuda_gate_grid(ps_ctx *c, float *z, float *alpha, const float *a, const float *u, const float *bias,
                                 int64_t B, int64_t T, int64_t d, int64_t nW, int64_t W, int64_t S, int64_t nkv,
                                 const int64_t *woff) {
    const int64_t *dw;
    if (grid_prep(c, "gate_grid", woff, B, nkv, S, &dw)) return -1;
    int64_t n = B * nW * nkv;
    if (n <= 0 || W <= 0) return 0;
    if (u) {
        k_gate_grid_logit LAUNCH(n * W)(z, a, u, bias, n * W, T, d, nW, W, S, nkv, dw);
        if (CU_LAUNCHED(c, "gate_grid")) return -1;
    }
    k_gate_grid_row LAUNCH(n)(z, alpha, n, T, nW, W, S, nkv, dw, !u);
    return CU_LAUNCHED(c, "gate_grid softmax");
}

extern "C" int ps_cuda_payload_grid(ps_ctx *c, float *P, const float *a, const float *C, int shared, float *scratch, int64_t B,
                                    int64_t T, int64_t d, int64_t nW, int64_t W, int64_t S, int64_t nkv, int64_t hd,
                                    const int64_t *woff) {
    const int64_t *dw;
    if (grid_prep(c, "payload_grid", woff, B, nkv, S, &dw)) return -1;
    int64_t nk = nkv * hd, n = B * nW * W * nk;
    if (n <= 0) return 0;
    if (shared) {
        if (ps_cuda_matmul(c, scratch, a, C, B * T, d, nk, 0)) return -1;
        k_payload_grid_gather LAUNCH(n)(P, scratch, n, T, nW, W, S, nkv, hd, dw);
        return CU_LAUNCHED(c, "payload_grid (shared)");
    }
    k_payload_grid_elem LAUNCH(n)(P, a, C, n, T, d, nW, W, S, nkv, hd, dw);
    return CU_LAUNCHED(c, "payload_grid");
}

extern "C" int ps_cuda_rope_grid(ps_ctx *c, float *x, const float *cos_t, const float *sin_t, int64_t B, int64_t T, int64_t nW,
                                 int64_t nkv, int64_t hd, int64_t S, const int64_t *woff, int inverse) {
    const int64_t *dw;
    if (grid_prep(c, "rope_grid", woff, B, nkv, S, &dw)) return -1;
    int64_t n = B * nW * nkv * (hd / 2);
    if (n <= 0) return 0;
    k_rope_grid LAUNCH(n)(x, cos_t, sin_t, n, T, nW, nkv, hd, S, dw, inverse ? -1.0f : 1.0f);
    return CU_LAUNCHED(c, "rope_grid");
}

extern "C" int ps_cuda_gate_grid_backward(ps_ctx *c, float *da, float *du, float *dbias, float *dalpha, const float *alpha,
                                          const float *a, const float *u, int64_t B, int64_t T, int64_t d, int64_t nW,
                                          int64_t W, int64_t S, int64_t nkv, const int64_t *woff) {
    const int64_t *dw;
    if (grid_prep(c, "gate_grid_backward", woff, B, nkv, S, &dw)) return -1;
    int64_t n = B * nW * nkv;
    if (n <= 0 || W <= 0) return 0;
    /* softmax backward in place (absent windows: alpha = 0, so dz = 0), then the three sums */
    k_softmax_backward LAUNCH(n)(dalpha, alpha, n, W);
    if (CU_LAUNCHED(c, "gate_grid_backward (softmax)")) return -1;
    k_gate_grid_du LAUNCH(W * nkv * d)(du, dalpha, a, W * nkv * d, B, T, d, nW, W, S, nkv, dw);
    if (CU_LAUNCHED(c, "gate_grid_backward (weight)")) return -1;
    k_gate_grid_dbias LAUNCH(W * nkv)(dbias, dalpha, W * nkv, B, T, nW, W, S, nkv, dw);
    if (CU_LAUNCHED(c, "gate_grid_backward (bias)")) return -1;
    k_gate_grid_da LAUNCH(B * T * d)(da, dalpha, u, B * T * d, T, d, nW, W, S, nkv, dw);
    return CU_LAUNCHED(c, "gate_grid_backward (input)");
}

extern "C" int ps_cuda_payload_grid_backward(ps_ctx *c, float *da, float *dC, const float *dP, const float *a, const float *C,
                                             int shared, float *scratch, int64_t B, int64_t T, int64_t d, int64_t nW,
                                             int64_t W, int64_t S, int64_t nkv, int64_t hd, const int64_t *woff) {
    const int64_t *dw;
    if (grid_prep(c, "payload_grid_backward", woff, B, nkv, S, &dw)) return -1;
    int64_t nk = nkv * hd;
    if (nW <= 0 || B <= 0 || W <= 0 || nk <= 0) return 0;
    if (shared) {
        k_payload_grid_scatter LAUNCH(B * T * nk)(scratch, dP, B * T * nk, T, nW, W, S, nkv, hd, dw);
        if (CU_LAUNCHED(c, "payload_grid_backward (shared)")) return -1;
        return ps_cuda_matmul_backward(c, da, dC, scratch, a, C, B * T, d, nk);
    }
    k_payload_grid_dC LAUNCH(W * nk * d)(dC, dP, a, W * nk * d, B, T, d, nW, W, S, nkv, hd, dw);
    if (CU_LAUNCHED(c, "payload_grid_backward (weight)")) return -1;
    k_payload_grid_da LAUNCH(B * T * d)(da, dP, C, B * T * d, T, d, nW, W, S, nkv, hd, dw);
    return CU_LAUNCHED(c, "payload_grid_backward (input)");
}

/* ---------------- the gate regulariser ---------------- */

extern "C" int ps_cuda_gate_entropy(ps_ctx *c, double *value, float *dalpha, const float *alpha, int64_t B, int64_t nW,
                                    int64_t nkv, int64_t W, double weight) {
    if (c->failed) return -1;
    int64_t nbj = B * nW;
    if (nkv <= 0 || W <= 0) return 0;
    /* device doubles: m [nkv, W], then cnt [nkv] and val [nkv] (copied back together) */
    double *m = (double *)(void *)ps_ctx_workspace(c, 2 * (nkv * W + 2 * nkv));
    if (!m) return -1;
    double *cnt = m + nkv * W, *val = cnt + nkv;
    k_entropy_mean LAUNCH(nkv * W)(m, cnt, alpha, nkv * W, nbj, nkv, W);
    if (CU_LAUNCHED(c, "gate_entropy (means)")) return -1;
    k_entropy_value LAUNCH(nkv)(val, m, cnt, nkv, W, weight);
    if (CU_LAUNCHED(c, "gate_entropy (value)")) return -1;
    if (dalpha && nbj > 0) {
        k_entropy_grad LAUNCH(nbj * nkv * W)(dalpha, alpha, m, cnt, nbj * nkv * W, nkv, W, weight);
        if (CU_LAUNCHED(c, "gate_entropy (gradient)")) return -1;
    }
    double *h = (double *)malloc((size_t)(2 * nkv) * sizeof(double));
    if (!h) return ps_ctx_fail(c, "gate_entropy: out of host memory for %lld KV heads", (long long)nkv);
    if (ps_cuda_to_host(c, h, cnt, 2 * nkv * (int64_t)sizeof(double))) {
        free(h);
        return -1;
    }
    for (int64_t g = 0; g < nkv; g++) /* the heads in order, as the CPU adds them */
        if (h[g] > 0) value[0] += h[nkv + g];
    free(h);
    return 0;
}

/* ---------------- content-defined chunks ---------------- */

extern "C" int ps_cuda_gate_chunks(ps_ctx *c, float *z, float *alpha, const float *a, const float *u, const float *bias,
                                   int64_t B, int64_t T, int64_t d, int64_t nC, int64_t W, int64_t nkv, const int64_t *cs,
                                   const int64_t *cl) {
    const int64_t *dcs, *dcl;
    if (chunks_prep(c, "gate_chunks", cs, cl, B, T, nC, W, &dcs, &dcl)) return -1;
    int64_t n = B * nC * nkv;
    if (n <= 0 || W <= 0) return 0;
    if (u) {
        k_gate_chunks_logit LAUNCH(n * W)(z, a, u, bias, n * W, T, d, nC, W, nkv, dcs, dcl);
        if (CU_LAUNCHED(c, "gate_chunks")) return -1;
    }
    k_gate_chunks_row LAUNCH(n)(z, alpha, n, W, nkv, dcl, !u);
    return CU_LAUNCHED(c, "gate_chunks softmax");
}

extern "C" int ps_cuda_payload_chunks(ps_ctx *c, float *P, const float *a, const float *C, int shared, float *scratch,
                                      int64_t B, int64_t T, int64_t d, int64_t nC, int64_t W, int64_t nkv, int64_t hd,
                                      const int64_t *cs, const int64_t *cl) {
    const int64_t *dcs, *dcl;
    if (chunks_prep(c, "payload_chunks", cs, cl, B, T, nC, W, &dcs, &dcl)) return -1;
    int64_t nk = nkv * hd, n = B * nC * W * nk;
    if (n <= 0) return 0;
    if (shared) {
        if (ps_cuda_matmul(c, scratch, a, C, B * T, d, nk, 0)) return -1;
        k_payload_chunks_gather LAUNCH(n)(P, scratch, n, T, nC, W, nk, dcs, dcl);
        return CU_LAUNCHED(c, "payload_chunks (shared)");
    }
    k_payload_chunks_elem LAUNCH(n)(P, a, C, n, T, d, nC, W, nk, dcs, dcl);
    return CU_LAUNCHED(c, "payload_chunks");
}

extern "C" int ps_cuda_rope_chunks(ps_ctx *c, float *x, const float *cos_t, const float *sin_t, int64_t B, int64_t T,
                                   int64_t nC, int64_t nkv, int64_t hd, const int64_t *cs, const int64_t *cl, int inverse) {
    const int64_t *dcs, *dcl;
    if (chunks_prep(c, "rope_chunks", cs, cl, B, T, nC, INT64_MAX, &dcs, &dcl)) return -1;
    int64_t n = B * nC * nkv * (hd / 2);
    if (n <= 0) return 0;
    k_rope_chunks LAUNCH(n)(x, cos_t, sin_t, n, nkv, hd, dcs, dcl, inverse ? -1.0f : 1.0f);
    return CU_LAUNCHED(c, "rope_chunks");
}

extern "C" int ps_cuda_gate_chunks_backward(ps_ctx *c, float *da, float *du, float *dbias, float *dalpha, const float *alpha,
                                            const float *a, const float *u, int64_t B, int64_t T, int64_t d, int64_t nC,
                                            int64_t W, int64_t nkv, const int64_t *cs, const int64_t *cl) {
    const int64_t *dcs, *dcl;
    if (chunks_prep(c, "gate_chunks_backward", cs, cl, B, T, nC, W, &dcs, &dcl)) return -1;
    int64_t n = B * nC * nkv;
    if (n <= 0 || W <= 0) return 0;
    k_softmax_backward LAUNCH(n)(dalpha, alpha, n, W);
    if (CU_LAUNCHED(c, "gate_chunks_backward (softmax)")) return -1;
    k_gate_chunks_du LAUNCH(W * nkv * d)(du, dalpha, a, W * nkv * d, B, T, d, nC, W, nkv, dcs, dcl);
    if (CU_LAUNCHED(c, "gate_chunks_backward (weight)")) return -1;
    k_gate_chunks_dbias LAUNCH(W * nkv)(dbias, dalpha, W * nkv, B, nC, W, nkv, dcl);
    if (CU_LAUNCHED(c, "gate_chunks_backward (bias)")) return -1;
    k_gate_chunks_da LAUNCH(B * T * d)(da, dalpha, u, B * T * d, T, d, nC, W, nkv, dcs, dcl);
    return CU_LAUNCHED(c, "gate_chunks_backward (input)");
}

extern "C" int ps_cuda_payload_chunks_backward(ps_ctx *c, float *da, float *dC, const float *dP, const float *a,
                                               const float *C, int shared, float *scratch, int64_t B, int64_t T, int64_t d,
                                               int64_t nC, int64_t W, int64_t nkv, int64_t hd, const int64_t *cs,
                                               const int64_t *cl) {
    const int64_t *dcs, *dcl;
    if (chunks_prep(c, "payload_chunks_backward", cs, cl, B, T, nC, W, &dcs, &dcl)) return -1;
    int64_t nk = nkv * hd;
    if (nC <= 0 || B <= 0 || W <= 0 || nk <= 0) return 0;
    if (shared) {
        k_payload_chunks_scatter LAUNCH(B * T * nk)(scratch, dP, B * T * nk, T, nC, W, nk, dcs, dcl);
        if (CU_LAUNCHED(c, "payload_chunks_backward (shared)")) return -1;
        return ps_cuda_matmul_backward(c, da, dC, scratch, a, C, B * T, d, nk);
    }
    k_payload_chunks_dC LAUNCH(W * nk * d)(dC, dP, a, W * nk * d, B, T, d, nC, W, nk, dcs, dcl);
    if (CU_LAUNCHED(c, "payload_chunks_backward (weight)")) return -1;
    k_payload_chunks_da LAUNCH(B * T * d)(da, dP, C, B * T * d, T, d, nC, W, nk, dcs, dcl);
    return CU_LAUNCHED(c, "payload_chunks_backward (input)");
}

/* ---------------- the op table's compressor ops over a window table ---------------- */

/* Which kernels run the table: 0 the base grid, 1 a table the heads share, 2 a per-head offset grid (woff, a
 * host array of B*nkv, gets the offsets; the caller frees it), -1 none (supports() declined it already). */
static int win_kind(ps_ctx *c, const ps_windows *w, int64_t **woff) {
    *woff = NULL;
    if (ps_windows_is_base_grid(w)) return 0;
    if (w->H == 1) return 1;
    int64_t n = w->B * w->nkv > 0 ? w->B * w->nkv : 1;
    if (!(*woff = (int64_t *)malloc((size_t)n * sizeof(int64_t))))
        return ps_ctx_fail(c, "cuda window table: out of host memory for %lld offsets", (long long)n), -1;
    if (ps_windows_grid_offsets(w, *woff)) return 2;
    free(*woff);
    *woff = NULL;
    return ps_ctx_fail(c, "cuda: a window table per KV head that is not an offset grid is not supported"), -1;
}

extern "C" int ps_cuda_gate(ps_ctx *c, float *z, float *alpha, const float *a, const float *u, const float *bias, int64_t d,
                            const ps_windows *w) {
    int64_t *wo;
    int k = win_kind(c, w, &wo), rc = -1;
    if (k == 0) rc = ps_cuda_gate_base(c, z, alpha, a, u, bias, w->B, w->T, d, w->nW, w->W, w->S, w->nkv);
    if (k == 1) rc = ps_cuda_gate_chunks(c, z, alpha, a, u, bias, w->B, w->T, d, w->nW, w->W, w->nkv, w->start, w->len);
    if (k == 2) rc = ps_cuda_gate_grid(c, z, alpha, a, u, bias, w->B, w->T, d, w->nW, w->W, w->S, w->nkv, wo);
    free(wo);
    return rc;
}

extern "C" int ps_cuda_payload(ps_ctx *c, float *P, const float *a, const float *C, int shared, float *scratch, int64_t d,
                               int64_t hd, const ps_windows *w) {
    int64_t *wo;
    int k = win_kind(c, w, &wo), rc = -1;
    if (k == 0) rc = ps_cuda_payload_base(c, P, a, C, shared, scratch, w->B, w->T, d, w->nW, w->W, w->S, w->nkv * hd);
    if (k == 1)
        rc = ps_cuda_payload_chunks(c, P, a, C, shared, scratch, w->B, w->T, d, w->nW, w->W, w->nkv, hd, w->start, w->len);
    if (k == 2) rc = ps_cuda_payload_grid(c, P, a, C, shared, scratch, w->B, w->T, d, w->nW, w->W, w->S, w->nkv, hd, wo);
    free(wo);
    return rc;
}

extern "C" int ps_cuda_rope_windows(ps_ctx *c, float *x, const float *cos_t, const float *sin_t, int64_t hd, const ps_windows *w,
                                    int inverse) {
    int64_t *wo;
    int k = win_kind(c, w, &wo), rc = -1;
    if (k == 0)
        rc = inverse ? ps_cuda_rope_backward(c, x, cos_t, sin_t, w->B, w->nW, w->nkv, hd, w->S)
                     : ps_cuda_rope(c, x, cos_t, sin_t, w->B, w->nW, w->nkv, hd, w->S);
    if (k == 1) rc = ps_cuda_rope_chunks(c, x, cos_t, sin_t, w->B, w->T, w->nW, w->nkv, hd, w->start, w->len, inverse);
    if (k == 2) rc = ps_cuda_rope_grid(c, x, cos_t, sin_t, w->B, w->T, w->nW, w->nkv, hd, w->S, wo, inverse);
    free(wo);
    return rc;
}

extern "C" int ps_cuda_gate_backward(ps_ctx *c, float *da, float *du, float *dbias, float *dalpha, const float *alpha,
                                     const float *a, const float *u, int64_t d, const ps_windows *w) {
    int64_t *wo;
    int k = win_kind(c, w, &wo), rc = -1;
    if (k == 0) rc = ps_cuda_gate_base_backward(c, da, du, dbias, dalpha, alpha, a, u, w->B, w->T, d, w->nW, w->W, w->S, w->nkv);
    if (k == 1)
        rc = ps_cuda_gate_chunks_backward(c, da, du, dbias, dalpha, alpha, a, u, w->B, w->T, d, w->nW, w->W, w->nkv, w->start,
                                          w->len);
    if (k == 2)
        rc = ps_cuda_gate_grid_backward(c, da, du, dbias, dalpha, alpha, a, u, w->B, w->T, d, w->nW, w->W, w->S, w->nkv, wo);
    free(wo);
    return rc;
}

extern "C" int ps_cuda_payload_backward(ps_ctx *c, float *da, float *dC, const float *dP, const float *a, const float *C,
                                        int shared, float *scratch, int64_t d, int64_t hd, const ps_windows *w) {
    int64_t *wo;
    int k = win_kind(c, w, &wo), rc = -1;
    if (k == 0)
        rc = ps_cuda_payload_base_backward(c, da, dC, dP, a, C, shared, scratch, w->B, w->T, d, w->nW, w->W, w->S, w->nkv * hd);
    if (k == 1)
        rc = ps_cuda_payload_chunks_backward(c, da, dC, dP, a, C, shared, scratch, w->B, w->T, d, w->nW, w->W, w->nkv, hd,
                                             w->start, w->len);
    if (k == 2)
        rc = ps_cuda_payload_grid_backward(c, da, dC, dP, a, C, shared, scratch, w->B, w->T, d, w->nW, w->W, w->S, w->nkv, hd,
                                           wo);
    free(wo);
    return rc;
}
