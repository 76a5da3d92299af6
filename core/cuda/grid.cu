/* grid.cu — the op table's compressor ops over a window table (core/backend.h ps_windows: the base grid,
 * staggered grids and content chunks alike) and the gate regulariser, on the device (docs/cuda.md,
 * docs/mitigations.md; semantics core/ops.h; reference core/cpu/windows.c, core/cpu/grid.c).
 *
 * A table that is the base grid (ps_windows_is_base_grid) runs compressor.cu's kernels (the fast path, as the
 * CPU keeps its batched sgemm for it); every other table runs one kernel family over the table itself. The
 * arithmetic lives in core/cuda/grid_bodies.h (valid C and CUDA, checked on the host against the CPU backend
 * by tests/test_cuda_grid_bodies.c); each kernel here is a grid-stride loop calling one body per element or
 * row, in the index space the test walks. The host tables start/len [B, nW, H] (checked by the ops.h
 * wrapper) and, for the input gradients, the windows holding each position (jr [B, T, 2],
 * ps_gb_win_ranges) are staged with cu_stage. Parameter gradients are one body per parameter element
 * looping over the rows in the CPU's order (no atomics: deterministic). The shared payload is one GEMM
 * (ps_cuda_matmul) and a gather, its backward a scatter and ps_cuda_matmul_backward. */
#include <stdlib.h>

#include "core/cuda/cuda_internal.cuh"
#include "core/cuda/grid_bodies.h"

#define T256 256

/* ---------------- staging (host) ---------------- */

/* the device copies of the table (and with ranges, of jr) */
typedef struct {
    const int64_t *start, *len, *jr;
} win_dev;

static int win_prep(ps_ctx *c, const ps_windows *w, int ranges, win_dev *dv) {
    dv->start = dv->len = dv->jr = NULL;
    if (c->failed) return -1;
    int64_t ne = w->B * w->nW * w->H, nr = ranges ? 2 * w->B * w->T : 0;
    if (ne <= 0) return 0;
    int64_t *jr = NULL;
    if (nr > 0) {
        if (!(jr = (int64_t *)malloc((size_t)nr * sizeof(int64_t))))
            return ps_ctx_fail(c, "cuda window table: out of host memory for %lld position ranges", (long long)(nr / 2));
        ps_gb_win_ranges(jr, w->B, w->T, w->nW, w->H, w->start, w->len);
    }
    const void *h[3] = {w->start, w->len, jr};
    int64_t by[3] = {ne * (int64_t)sizeof(int64_t), ne * (int64_t)sizeof(int64_t), nr * (int64_t)sizeof(int64_t)};
    void *d[3];
    int rc = cu_stage(c, nr > 0 ? 3 : 2, h, by, d); /* pageable host memory: copied before cudaMemcpyAsync returns */
    free(jr);
    if (rc) return -1;
    dv->start = (const int64_t *)d[0], dv->len = (const int64_t *)d[1], dv->jr = nr > 0 ? (const int64_t *)d[2] : NULL;
    return 0;
}

#define LAUNCH(n) <<<cu_grid((n), T256), T256, 0, STREAM(c)>>>
#define TAB w->nW, w->W, w->nkv, w->H /* the table's sizes, in the bodies' order */

/* ---------------- kernels: one body per index ---------------- */

__global__ void k_gate_logit(float *z, const float *a, const float *u, const float *bias, int64_t n, int64_t T, int64_t d,
                             int64_t nW, int64_t W, int64_t nkv, int64_t H, const int64_t *st, const int64_t *ln) {
    GS_LOOP(wi, n) ps_gb_win_gate_logit(z, a, u, bias, T, d, nW, W, nkv, H, st, ln, wi);
}
__global__ void k_gate_row(float *z, float *alpha, int64_t n, int64_t nW, int64_t W, int64_t nkv, int64_t H, const int64_t *ln,
                           int uniform) {
    GS_LOOP(row, n) ps_gb_win_gate_row(z, alpha, nW, W, nkv, H, ln, uniform, row);
}
__global__ void k_softmax_backward(float *dalpha, const float *alpha, int64_t n, int64_t W) {
    GS_LOOP(row, n) ps_gb_softmax_backward_row(dalpha, alpha, W, row);
}
__global__ void k_gate_du(float *du, const float *dz, const float *a, int64_t n, int64_t B, int64_t T, int64_t d, int64_t nW,
                          int64_t W, int64_t nkv, int64_t H, const int64_t *st, const int64_t *ln) {
    GS_LOOP(idx, n) ps_gb_win_gate_du(du, dz, a, B, T, d, nW, W, nkv, H, st, ln, idx);
}
__global__ void k_gate_dbias(float *dc, const float *dz, int64_t n, int64_t B, int64_t nW, int64_t W, int64_t nkv, int64_t H,
                             const int64_t *ln) {
    GS_LOOP(ig, n) ps_gb_win_gate_dbias(dc, dz, B, nW, W, nkv, H, ln, ig);
}
__global__ void k_gate_da(float *da, const float *dz, const float *u, int64_t n, int64_t T, int64_t d, int64_t nW, int64_t W,
                          int64_t nkv, int64_t H, const int64_t *st, const int64_t *ln, const int64_t *jr) {
    GS_LOOP(idx, n) ps_gb_win_gate_da(da, dz, u, T, d, nW, W, nkv, H, st, ln, jr, idx);
}
__global__ void k_payload_gather(float *P, const float *scratch, int64_t n, int64_t T, int64_t nW, int64_t W, int64_t nkv,
                                 int64_t hd, int64_t H, const int64_t *st, const int64_t *ln) {
    GS_LOOP(idx, n) ps_gb_win_payload_gather(P, scratch, T, nW, W, nkv, hd, H, st, ln, idx);
}
__global__ void k_payload_elem(float *P, const float *a, const float *C, int64_t n, int64_t T, int64_t d, int64_t nW, int64_t W,
                               int64_t nkv, int64_t hd, int64_t H, const int64_t *st, const int64_t *ln) {
    GS_LOOP(idx, n) ps_gb_win_payload_elem(P, a, C, T, d, nW, W, nkv, hd, H, st, ln, idx);
}
__global__ void k_payload_scatter(float *scratch, const float *dP, int64_t n, int64_t T, int64_t nW, int64_t W, int64_t nkv,
                                  int64_t hd, int64_t H, const int64_t *st, const int64_t *ln, const int64_t *jr) {
    GS_LOOP(idx, n) ps_gb_win_payload_scatter(scratch, dP, T, nW, W, nkv, hd, H, st, ln, jr, idx);
}
__global__ void k_payload_dC(float *dC, const float *dP, const float *a, int64_t n, int64_t B, int64_t T, int64_t d, int64_t nW,
                             int64_t W, int64_t nkv, int64_t hd, int64_t H, const int64_t *st, const int64_t *ln) {
    GS_LOOP(idx, n) ps_gb_win_payload_dC(dC, dP, a, B, T, d, nW, W, nkv, hd, H, st, ln, idx);
}
__global__ void k_payload_da(float *da, const float *dP, const float *C, int64_t n, int64_t T, int64_t d, int64_t nW, int64_t W,
                             int64_t nkv, int64_t hd, int64_t H, const int64_t *st, const int64_t *ln, const int64_t *jr) {
    GS_LOOP(idx, n) ps_gb_win_payload_da(da, dP, C, T, d, nW, W, nkv, hd, H, st, ln, jr, idx);
}
__global__ void k_rope(float *x, const float *cos_t, const float *sin_t, int64_t n, int64_t T, int64_t nW, int64_t nkv,
                       int64_t hd, int64_t H, const int64_t *st, float dir) {
    GS_LOOP(idx, n) ps_gb_win_rope_pair(x, cos_t, sin_t, T, nW, nkv, hd, H, st, dir, idx);
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

/* ---------------- the op table's compressor ops ---------------- */

extern "C" int ps_cuda_gate(ps_ctx *c, float *z, float *alpha, const float *a, const float *u, const float *bias, int64_t d,
                            const ps_windows *w) {
    if (ps_windows_is_base_grid(w)) return ps_cuda_gate_base(c, z, alpha, a, u, bias, w->B, w->T, d, w->nW, w->W, w->S, w->nkv);
    win_dev t;
    if (win_prep(c, w, 0, &t)) return -1;
    int64_t n = w->B * w->nW * w->nkv;
    if (n <= 0) return 0;
    if (u) {
        k_gate_logit LAUNCH(n * w->W)(z, a, u, bias, n * w->W, w->T, d, TAB, t.start, t.len);
        if (CU_LAUNCHED(c, "gate")) return -1;
    }
    k_gate_row LAUNCH(n)(z, alpha, n, TAB, t.len, !u);
    return CU_LAUNCHED(c, "gate softmax");
}

extern "C" int ps_cuda_gate_backward(ps_ctx *c, float *da, float *du, float *dbias, float *dalpha, const float *alpha,
                                     const float *a, const float *u, int64_t d, const ps_windows *w) {
    if (ps_windows_is_base_grid(w))
        return ps_cuda_gate_base_backward(c, da, du, dbias, dalpha, alpha, a, u, w->B, w->T, d, w->nW, w->W, w->S, w->nkv);
    win_dev t;
    if (win_prep(c, w, 1, &t)) return -1;
    int64_t n = w->B * w->nW * w->nkv, W = w->W, nkv = w->nkv;
    if (n <= 0) return 0;
    /* softmax backward in place (offsets i >= len and absent windows: alpha = 0, so dz = 0), then the three sums */
    k_softmax_backward LAUNCH(n)(dalpha, alpha, n, W);
    if (CU_LAUNCHED(c, "gate_backward (softmax)")) return -1;
    k_gate_du LAUNCH(W * nkv * d)(du, dalpha, a, W * nkv * d, w->B, w->T, d, TAB, t.start, t.len);
    if (CU_LAUNCHED(c, "gate_backward (weight)")) return -1;
    k_gate_dbias LAUNCH(W * nkv)(dbias, dalpha, W * nkv, w->B, TAB, t.len);
    if (CU_LAUNCHED(c, "gate_backward (bias)")) return -1;
    k_gate_da LAUNCH(w->B * w->T * d)(da, dalpha, u, w->B * w->T * d, w->T, d, TAB, t.start, t.len, t.jr);
    return CU_LAUNCHED(c, "gate_backward (input)");
}

extern "C" int ps_cuda_payload(ps_ctx *c, float *P, const float *a, const float *C, int shared, float *scratch, int64_t d,
                               int64_t hd, const ps_windows *w) {
    if (ps_windows_is_base_grid(w))
        return ps_cuda_payload_base(c, P, a, C, shared, scratch, w->B, w->T, d, w->nW, w->W, w->S, w->nkv * hd);
    win_dev t;
    if (win_prep(c, w, 0, &t)) return -1;
    int64_t nk = w->nkv * hd, n = w->B * w->nW * w->W * nk;
    if (n <= 0) return 0;
    if (shared) {
        if (ps_cuda_matmul(c, scratch, a, C, w->B * w->T, d, nk, 0)) return -1;
        k_payload_gather LAUNCH(n)(P, scratch, n, w->T, w->nW, w->W, w->nkv, hd, w->H, t.start, t.len);
        return CU_LAUNCHED(c, "payload (shared)");
    }
    k_payload_elem LAUNCH(n)(P, a, C, n, w->T, d, w->nW, w->W, w->nkv, hd, w->H, t.start, t.len);
    return CU_LAUNCHED(c, "payload");
}

extern "C" int ps_cuda_payload_backward(ps_ctx *c, float *da, float *dC, const float *dP, const float *a, const float *C,
                                        int shared, float *scratch, int64_t d, int64_t hd, const ps_windows *w) {
    if (ps_windows_is_base_grid(w))
        return ps_cuda_payload_base_backward(c, da, dC, dP, a, C, shared, scratch, w->B, w->T, d, w->nW, w->W, w->S,
                                             w->nkv * hd);
    win_dev t;
    if (win_prep(c, w, 1, &t)) return -1;
    int64_t nk = w->nkv * hd, B = w->B, T = w->T;
    if (w->nW <= 0 || B <= 0 || nk <= 0) return 0;
    if (shared) {
        k_payload_scatter LAUNCH(B * T * nk)(scratch, dP, B * T * nk, T, w->nW, w->W, w->nkv, hd, w->H, t.start, t.len, t.jr);
        if (CU_LAUNCHED(c, "payload_backward (shared)")) return -1;
        return ps_cuda_matmul_backward(c, da, dC, scratch, a, C, B * T, d, nk);
    }
    k_payload_dC LAUNCH(w->W * nk * d)(dC, dP, a, w->W * nk * d, B, T, d, w->nW, w->W, w->nkv, hd, w->H, t.start, t.len);
    if (CU_LAUNCHED(c, "payload_backward (weight)")) return -1;
    k_payload_da LAUNCH(B * T * d)(da, dP, C, B * T * d, T, d, w->nW, w->W, w->nkv, hd, w->H, t.start, t.len, t.jr);
    return CU_LAUNCHED(c, "payload_backward (input)");
}

extern "C" int ps_cuda_rope_windows(ps_ctx *c, float *x, const float *cos_t, const float *sin_t, int64_t hd, const ps_windows *w,
                                    int inverse) {
    if (ps_windows_is_base_grid(w))
        return inverse ? ps_cuda_rope_backward(c, x, cos_t, sin_t, w->B, w->nW, w->nkv, hd, w->S)
                       : ps_cuda_rope(c, x, cos_t, sin_t, w->B, w->nW, w->nkv, hd, w->S);
    win_dev t;
    if (win_prep(c, w, 0, &t)) return -1;
    int64_t n = w->B * w->nW * w->nkv * (hd / 2);
    if (n <= 0) return 0;
    k_rope LAUNCH(n)(x, cos_t, sin_t, n, w->T, w->nW, w->nkv, hd, w->H, t.start, inverse ? -1.0f : 1.0f);
    return CU_LAUNCHED(c, "rope_windows");
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

