/* grid_bodies.h — the arithmetic of the CUDA backend's offset-grid, content-chunk and gate-regulariser ops
 * (core/cuda/grid.cu; docs/cuda.md), as per-element and per-row "bodies" that are valid C11 and CUDA C++.
 * The kernels in grid.cu are grid-stride loops that call one body per index; tests/test_cuda_grid_bodies.c
 * runs the same bodies over the same index spaces in plain host loops and compares them with the CPU
 * backend (core/cpu/windows.c, core/cpu/grid.c), so the arithmetic is checked on machines without a GPU.
 *
 * Geometry (core/ops.h): window j of KV head g in sequence b covers positions jS + o + i, o = woff[b*nkv + g]
 * (woff NULL: 0), and exists when jS + o + W <= T; content chunk j of sequence b covers cs[bj] + i,
 * i < L = cl[bj] (bj = b*nC + j; L = 0: absent). Arrays are row-major as in ops.h; woff/cs/cl are device
 * copies on the device and host arrays in the host test.
 *
 * Every body writes only its own output element (or row), reads nothing another body of the same launch
 * writes, and sums in a fixed sequential order — the CPU's order wherever the CPU sums in a loop of its own
 * (gate gradients, scatters, the regulariser), so those agree with it to the last bit apart from expf
 * (libm/CUDA expf here, ps_expf on the CPU); sums the CPU hands to sgemm (per-offset payloads) are
 * sequential here and agree to rounding. No atomics: a parameter gradient summed over many rows is one
 * body per parameter element looping over the rows in the CPU's order. */
#ifndef PS_CUDA_GRID_BODIES_H
#define PS_CUDA_GRID_BODIES_H

#include <math.h>
#include <stdint.h>

#include "core/hd_math.h"

/* ---------------- shared helpers ---------------- */

/* does window j of a grid at offset o fit in T? */
static inline PS_HD int ps_gb_fits(int64_t j, int64_t o, int64_t W, int64_t S, int64_t T) { return j * S + o + W <= T; }

/* ---------------- gate (forward) ---------------- */

/* Gate logit wi = (b, j, g, i) of a grid, wi < B*nW*nkv*W: z = bias[i, g] + u[i, g, :] · a[b, jS + o + i, :]
 * (0 for an absent window). Only with a learned gate (u, bias not NULL). */
static inline PS_HD void ps_gb_gate_grid_logit(float *z, const float *a, const float *u, const float *bias, int64_t T,
                                               int64_t d, int64_t nW, int64_t W, int64_t S, int64_t nkv,
                                               const int64_t *woff, int64_t wi) {
    int64_t row = wi / W, i = wi % W, b = row / (nW * nkv), j = (row / nkv) % nW, g = row % nkv;
    int64_t o = ps_woff(woff, b, nkv, g);
    if (!ps_gb_fits(j, o, W, S, T)) {
        z[wi] = 0.0f;
        return;
    }
    z[wi] = bias[i * nkv + g] + ps_dot(u + (i * nkv + g) * d, a + (b * T + j * S + o + i) * d, d);
}

/* Gate logit wi = (b, j, g, i) of the chunks, wi < B*nC*nkv*W (0 at i >= L and for absent chunks). */
static inline PS_HD void ps_gb_gate_chunks_logit(float *z, const float *a, const float *u, const float *bias, int64_t T,
                                                 int64_t d, int64_t nC, int64_t W, int64_t nkv, const int64_t *cs,
                                                 const int64_t *cl, int64_t wi) {
    int64_t row = wi / W, i = wi % W, bj = row / nkv, g = row % nkv, b = bj / nC;
    if (i >= cl[bj]) {
        z[wi] = 0.0f;
        return;
    }
    z[wi] = bias[i * nkv + g] + ps_dot(u + (i * nkv + g) * d, a + (b * T + cs[bj] + i) * d, d);
}

/* The softmax of one gate row over its first L offsets (L = 0: absent, all 0; uniform: z = 0, alpha = 1/L);
 * offsets i >= L get z = alpha = 0. zz holds the logits of the row already (learned gate). */
static inline PS_HD void ps_gb_gate_softmax_row(float *zz, float *al, int64_t W, int64_t L, int uniform) {
    for (int64_t i = L; i < W; i++) zz[i] = al[i] = 0.0f;
    if (L <= 0) return;
    if (uniform) {
        for (int64_t i = 0; i < L; i++) zz[i] = 0.0f, al[i] = 1.0f / (float)L;
        return;
    }
    float mx = -INFINITY;
    for (int64_t i = 0; i < L; i++)
        if (zz[i] > mx) mx = zz[i];
    float sum = 0.0f;
    for (int64_t i = 0; i < L; i++) sum += (al[i] = expf(zz[i] - mx));
    for (int64_t i = 0; i < L; i++) al[i] /= sum;
}

/* Row (b, j, g) of a grid, row < B*nW*nkv. */
static inline PS_HD void ps_gb_gate_grid_row(float *z, float *alpha, int64_t T, int64_t nW, int64_t W, int64_t S,
                                             int64_t nkv, const int64_t *woff, int uniform, int64_t row) {
    int64_t b = row / (nW * nkv), j = (row / nkv) % nW, g = row % nkv;
    int64_t L = ps_gb_fits(j, ps_woff(woff, b, nkv, g), W, S, T) ? W : 0;
    ps_gb_gate_softmax_row(z + row * W, alpha + row * W, W, L, uniform);
}

/* Row (b, j, g) of the chunks, row < B*nC*nkv. */
static inline PS_HD void ps_gb_gate_chunks_row(float *z, float *alpha, int64_t W, int64_t nkv, const int64_t *cl, int uniform,
                                               int64_t row) {
    ps_gb_gate_softmax_row(z + row * W, alpha + row * W, W, cl[row / nkv], uniform);
}

/* ---------------- gate (backward) ---------------- */

/* Row `row` of dalpha becomes the logit gradient alpha ⊙ (dalpha − Σ alpha·dalpha) (cpu.h
 * ps_cpu_softmax_rows_backward, term for term; rows of alpha = 0 give 0). */
static inline PS_HD void ps_gb_softmax_backward_row(float *dalpha, const float *alpha, int64_t W, int64_t row) {
    const float *al = alpha + row * W;
    float *dal = dalpha + row * W;
    double dot = 0;
    for (int64_t i = 0; i < W; i++) dot += (double)al[i] * dal[i];
    for (int64_t i = 0; i < W; i++) dal[i] = al[i] * (dal[i] - (float)dot);
}

/* du[i, g, e] += Σ_{b, j present} dz[b, j, g, i] · a[b, jS + o + i, e] (b, then j: the CPU's order);
 * idx < W*nkv*d. dz is dalpha after the softmax backward. */
static inline PS_HD void ps_gb_gate_grid_du(float *du, const float *dz, const float *a, int64_t B, int64_t T, int64_t d,
                                            int64_t nW, int64_t W, int64_t S, int64_t nkv, const int64_t *woff, int64_t idx) {
    int64_t ig = idx / d, e = idx % d, i = ig / nkv, g = ig % nkv;
    float acc = du[idx];
    for (int64_t b = 0; b < B; b++) {
        int64_t o = ps_woff(woff, b, nkv, g);
        for (int64_t j = 0; j < nW; j++) {
            if (!ps_gb_fits(j, o, W, S, T)) continue;
            acc += dz[((b * nW + j) * nkv + g) * W + i] * a[(b * T + j * S + o + i) * d + e];
        }
    }
    du[idx] = acc;
}

/* dbias[i, g] += Σ_{b, j present} dz[b, j, g, i]; ig < W*nkv. */
static inline PS_HD void ps_gb_gate_grid_dbias(float *dc, const float *dz, int64_t B, int64_t T, int64_t nW, int64_t W,
                                               int64_t S, int64_t nkv, const int64_t *woff, int64_t ig) {
    int64_t i = ig / nkv, g = ig % nkv;
    float acc = dc[ig];
    for (int64_t b = 0; b < B; b++) {
        int64_t o = ps_woff(woff, b, nkv, g);
        for (int64_t j = 0; j < nW; j++)
            if (ps_gb_fits(j, o, W, S, T)) acc += dz[((b * nW + j) * nkv + g) * W + i];
    }
    dc[ig] = acc;
}

/* da[b, t, e] += Σ dz[b, j, g, i] · u[i, g, e] over the present windows (j, g) holding t at offset
 * i = t − jS − o_g, in the CPU's order (j, then i, then g); idx < B*T*d. The windows that can hold t for
 * some o in [0, S) are j in [ceil((t − W − S + 2) / S), t / S]. */
static inline PS_HD void ps_gb_gate_grid_da(float *da, const float *dz, const float *u, int64_t T, int64_t d, int64_t nW,
                                            int64_t W, int64_t S, int64_t nkv, const int64_t *woff, int64_t idx) {
    int64_t e = idx % d, t = (idx / d) % T, b = idx / (d * T);
    int64_t lo = t - W - S + 2, j0 = lo > 0 ? (lo + S - 1) / S : 0, j1 = t / S < nW - 1 ? t / S : nW - 1;
    float acc = da[idx];
    for (int64_t j = j0; j <= j1; j++) {
        int64_t base = t - j * S; /* i + o */
        int64_t i0 = base - (S - 1) > 0 ? base - (S - 1) : 0, i1 = base < W - 1 ? base : W - 1;
        for (int64_t i = i0; i <= i1; i++)
            for (int64_t g = 0; g < nkv; g++) {
                int64_t o = ps_woff(woff, b, nkv, g);
                if (o != base - i || !ps_gb_fits(j, o, W, S, T)) continue;
                acc += dz[((b * nW + j) * nkv + g) * W + i] * u[(i * nkv + g) * d + e];
            }
    }
    da[idx] = acc;
}

/* Content chunks: du[i, g, e] += Σ_{bj: i < L} dz[bj, g, i] · a[b, cs + i, e] (bj in order); idx < W*nkv*d. */
static inline PS_HD void ps_gb_gate_chunks_du(float *du, const float *dz, const float *a, int64_t B, int64_t T, int64_t d,
                                              int64_t nC, int64_t W, int64_t nkv, const int64_t *cs, const int64_t *cl,
                                              int64_t idx) {
    int64_t ig = idx / d, e = idx % d, i = ig / nkv, g = ig % nkv;
    float acc = du[idx];
    for (int64_t bj = 0; bj < B * nC; bj++) {
        if (i >= cl[bj]) continue;
        acc += dz[(bj * nkv + g) * W + i] * a[((bj / nC) * T + cs[bj] + i) * d + e];
    }
    du[idx] = acc;
}

/* Content chunks: dbias[i, g] += Σ_{bj: i < L} dz[bj, g, i]; ig < W*nkv. */
static inline PS_HD void ps_gb_gate_chunks_dbias(float *dc, const float *dz, int64_t B, int64_t nC, int64_t W, int64_t nkv,
                                                 const int64_t *cl, int64_t ig) {
    int64_t i = ig / nkv, g = ig % nkv;
    float acc = dc[ig];
    for (int64_t bj = 0; bj < B * nC; bj++)
        if (i < cl[bj]) acc += dz[(bj * nkv + g) * W + i];
    dc[ig] = acc;
}

/* Content chunks: da[b, t, e] += Σ over the chunks j holding t (i = t − cs, i < L), then heads g:
 * dz · u[i, g, e] (the CPU's order); idx < B*T*d. */
static inline PS_HD void ps_gb_gate_chunks_da(float *da, const float *dz, const float *u, int64_t T, int64_t d, int64_t nC,
                                              int64_t W, int64_t nkv, const int64_t *cs, const int64_t *cl, int64_t idx) {
    int64_t e = idx % d, t = (idx / d) % T, b = idx / (d * T);
    float acc = da[idx];
    for (int64_t j = 0; j < nC; j++) {
        int64_t bj = b * nC + j, i = t - cs[bj];
        if (i < 0 || i >= cl[bj]) continue;
        for (int64_t g = 0; g < nkv; g++) acc += dz[(bj * nkv + g) * W + i] * u[(i * nkv + g) * d + e];
    }
    da[idx] = acc;
}

/* ---------------- payloads (forward) ---------------- */

/* Shared payload, grid: P[b, j, i, n] = scratch[b, jS + o_g + i, n] (g = n / hd; 0 for an absent window),
 * scratch = a · C^T [B, T, nkv*hd]; idx < B*nW*W*nkv*hd. */
static inline PS_HD void ps_gb_payload_grid_gather(float *P, const float *scratch, int64_t T, int64_t nW, int64_t W,
                                                   int64_t S, int64_t nkv, int64_t hd, const int64_t *woff, int64_t idx) {
    int64_t nk = nkv * hd, n = idx % nk, i = (idx / nk) % W, bj = idx / (nk * W), b = bj / nW, j = bj % nW;
    int64_t o = ps_woff(woff, b, nkv, n / hd);
    P[idx] = ps_gb_fits(j, o, W, S, T) ? scratch[(b * T + j * S + o + i) * nk + n] : 0.0f;
}

/* Shared payload, chunks: P[b, j, i, n] = scratch[b, cs + i, n] (0 at i >= L); idx < B*nC*W*nkv*hd. */
static inline PS_HD void ps_gb_payload_chunks_gather(float *P, const float *scratch, int64_t T, int64_t nC, int64_t W,
                                                     int64_t nk, const int64_t *cs, const int64_t *cl, int64_t idx) {
    int64_t n = idx % nk, i = (idx / nk) % W, bj = idx / (nk * W);
    P[idx] = i < cl[bj] ? scratch[((bj / nC) * T + cs[bj] + i) * nk + n] : 0.0f;
}

/* Per-offset payload, grid: P[b, j, i, n] = C[i, n, :] · a[b, jS + o_g + i, :] (0 for an absent window);
 * idx < B*nW*W*nkv*hd. */
static inline PS_HD void ps_gb_payload_grid_elem(float *P, const float *a, const float *C, int64_t T, int64_t d, int64_t nW,
                                                 int64_t W, int64_t S, int64_t nkv, int64_t hd, const int64_t *woff,
                                                 int64_t idx) {
    int64_t nk = nkv * hd, n = idx % nk, i = (idx / nk) % W, bj = idx / (nk * W), b = bj / nW, j = bj % nW;
    int64_t o = ps_woff(woff, b, nkv, n / hd);
    P[idx] = ps_gb_fits(j, o, W, S, T) ? ps_dot(C + (i * nk + n) * d, a + (b * T + j * S + o + i) * d, d) : 0.0f;
}

/* Per-offset payload, chunks: P[b, j, i, n] = C[i, n, :] · a[b, cs + i, :] (0 at i >= L);
 * idx < B*nC*W*nkv*hd. */
static inline PS_HD void ps_gb_payload_chunks_elem(float *P, const float *a, const float *C, int64_t T, int64_t d, int64_t nC,
                                                   int64_t W, int64_t nk, const int64_t *cs, const int64_t *cl, int64_t idx) {
    int64_t n = idx % nk, i = (idx / nk) % W, bj = idx / (nk * W);
    P[idx] = i < cl[bj] ? ps_dot(C + (i * nk + n) * d, a + ((bj / nC) * T + cs[bj] + i) * d, d) : 0.0f;
}

/* ---------------- payloads (backward) ---------------- */

/* Shared payload, grid: scratch[b, t, n] = Σ over the present windows j of head g = n / hd holding t
 * (j in order): dP[b, j, t − jS − o_g, n]; idx < B*T*nkv*hd. Then da, dC come from matmul_backward. */
static inline PS_HD void ps_gb_payload_grid_scatter(float *scratch, const float *dP, int64_t T, int64_t nW, int64_t W,
                                                    int64_t S, int64_t nkv, int64_t hd, const int64_t *woff, int64_t idx) {
    int64_t nk = nkv * hd, n = idx % nk, t = (idx / nk) % T, b = idx / (nk * T);
    int64_t r = t - ps_woff(woff, b, nkv, n / hd); /* = jS + i */
    float acc = 0.0f;
    if (r >= 0) {
        int64_t lo = r - W + 1, j0 = lo > 0 ? (lo + S - 1) / S : 0, j1 = r / S < nW - 1 ? r / S : nW - 1;
        for (int64_t j = j0; j <= j1; j++)
            if (ps_gb_fits(j, t - r, W, S, T)) acc += dP[((b * nW + j) * W + (r - j * S)) * nk + n];
    }
    scratch[idx] = acc;
}

/* Shared payload, chunks: scratch[b, t, n] = Σ over the chunks j holding t (j in order): dP[b, j, t − cs, n];
 * idx < B*T*nk. */
static inline PS_HD void ps_gb_payload_chunks_scatter(float *scratch, const float *dP, int64_t T, int64_t nC, int64_t W,
                                                      int64_t nk, const int64_t *cs, const int64_t *cl, int64_t idx) {
    int64_t n = idx % nk, t = (idx / nk) % T, b = idx / (nk * T);
    float acc = 0.0f;
    for (int64_t j = 0; j < nC; j++) {
        int64_t bj = b * nC + j, i = t - cs[bj];
        if (i >= 0 && i < cl[bj]) acc += dP[(bj * W + i) * nk + n];
    }
    scratch[idx] = acc;
}

/* Per-offset payload, grid: dC[i, n, k] += Σ_{b, j present} dP[b, j, i, n] · a[b, jS + o_g + i, k] (b, then j);
 * idx < W*nkv*hd*d. */
static inline PS_HD void ps_gb_payload_grid_dC(float *dC, const float *dP, const float *a, int64_t B, int64_t T, int64_t d,
                                               int64_t nW, int64_t W, int64_t S, int64_t nkv, int64_t hd,
                                               const int64_t *woff, int64_t idx) {
    int64_t nk = nkv * hd, k = idx % d, n = (idx / d) % nk, i = idx / (d * nk), g = n / hd;
    float acc = dC[idx];
    for (int64_t b = 0; b < B; b++) {
        int64_t o = ps_woff(woff, b, nkv, g);
        for (int64_t j = 0; j < nW; j++)
            if (ps_gb_fits(j, o, W, S, T)) acc += dP[((b * nW + j) * W + i) * nk + n] * a[(b * T + j * S + o + i) * d + k];
    }
    dC[idx] = acc;
}

/* Per-offset payload, grid: da[b, t, k] += Σ over offsets i, then heads g whose present window j holds t at
 * offset i (t = jS + o_g + i): Σ_e dP[b, j, i, g*hd + e] · C[i, g*hd + e, k] (the CPU's (i, g) order; the
 * inner sum over e is its own partial, as the CPU's per-(i, g) product); idx < B*T*d. */
static inline PS_HD void ps_gb_payload_grid_da(float *da, const float *dP, const float *C, int64_t T, int64_t d, int64_t nW,
                                               int64_t W, int64_t S, int64_t nkv, int64_t hd, const int64_t *woff,
                                               int64_t idx) {
    int64_t nk = nkv * hd, k = idx % d, t = (idx / d) % T, b = idx / (d * T);
    float acc = da[idx];
    for (int64_t i = 0; i < W; i++)
        for (int64_t g = 0; g < nkv; g++) {
            int64_t o = ps_woff(woff, b, nkv, g), r = t - o - i;
            if (r < 0 || r % S != 0) continue;
            int64_t j = r / S;
            if (j >= nW || !ps_gb_fits(j, o, W, S, T)) continue;
            const float *dp = dP + ((b * nW + j) * W + i) * nk + g * hd, *cc = C + (i * nk + g * hd) * d + k;
            float s = 0.0f;
            for (int64_t e = 0; e < hd; e++) s += dp[e] * cc[e * d];
            acc += s;
        }
    da[idx] = acc;
}

/* Per-offset payload, chunks: dC[i, n, k] += Σ_{bj: i < L} dP[bj, i, n] · a[b, cs + i, k] (bj in order);
 * idx < W*nk*d. */
static inline PS_HD void ps_gb_payload_chunks_dC(float *dC, const float *dP, const float *a, int64_t B, int64_t T, int64_t d,
                                                 int64_t nC, int64_t W, int64_t nk, const int64_t *cs, const int64_t *cl,
                                                 int64_t idx) {
    int64_t k = idx % d, n = (idx / d) % nk, i = idx / (d * nk);
    float acc = dC[idx];
    for (int64_t bj = 0; bj < B * nC; bj++)
        if (i < cl[bj]) acc += dP[(bj * W + i) * nk + n] * a[((bj / nC) * T + cs[bj] + i) * d + k];
    dC[idx] = acc;
}

/* Per-offset payload, chunks: da[b, t, k] += Σ over offsets i, then chunks j with t = cs + i, i < L:
 * Σ_n dP[bj, i, n] · C[i, n, k] (the CPU's (i, bj) order); idx < B*T*d. */
static inline PS_HD void ps_gb_payload_chunks_da(float *da, const float *dP, const float *C, int64_t T, int64_t d, int64_t nC,
                                                 int64_t W, int64_t nk, const int64_t *cs, const int64_t *cl, int64_t idx) {
    int64_t k = idx % d, t = (idx / d) % T, b = idx / (d * T);
    float acc = da[idx];
    for (int64_t i = 0; i < W; i++)
        for (int64_t j = 0; j < nC; j++) {
            int64_t bj = b * nC + j;
            if (i >= cl[bj] || cs[bj] + i != t) continue;
            const float *dp = dP + (bj * W + i) * nk, *cc = C + i * nk * d + k;
            float s = 0.0f;
            for (int64_t n = 0; n < nk; n++) s += dp[n] * cc[n * d];
            acc += s;
        }
    da[idx] = acc;
}

/* ---------------- RoPE of compressed keys ---------------- */

/* Rotate the pair (p, q) = (v[i], v[i + half]) of one entry by the angle of position pos (dir −1: inverse;
 * the rotation of ps_cpu_rope, term for term). */
static inline PS_HD void ps_gb_rotate(float *v, const float *cos_t, const float *sin_t, int64_t pos, int64_t half, int64_t i,
                                      float dir) {
    float c = cos_t[pos * half + i], sn = dir * sin_t[pos * half + i];
    float p = v[i], q = v[i + half];
    v[i] = p * c - q * sn;
    v[i + half] = q * c + p * sn;
}

/* Grid: pair i of entry (b, j, g) of x [B, nW, nkv, hd] by R(jS + o_g) (left alone when jS + o_g >= T);
 * idx < B*nW*nkv*(hd/2). */
static inline PS_HD void ps_gb_rope_grid_pair(float *x, const float *cos_t, const float *sin_t, int64_t T, int64_t nW,
                                              int64_t nkv, int64_t hd, int64_t S, const int64_t *woff, float dir, int64_t idx) {
    int64_t half = hd / 2, i = idx % half, row = idx / half, b = row / (nW * nkv), j = (row / nkv) % nW, g = row % nkv;
    int64_t pos = j * S + ps_woff(woff, b, nkv, g);
    if (pos >= T) return;
    ps_gb_rotate(x + row * hd, cos_t, sin_t, pos, half, i, dir);
}

/* Chunks: pair i of entry (b, j, g) of x [B, nC, nkv, hd] by R(cs[b, j]) (absent chunks left alone);
 * idx < B*nC*nkv*(hd/2). */
static inline PS_HD void ps_gb_rope_chunks_pair(float *x, const float *cos_t, const float *sin_t, int64_t nkv, int64_t hd,
                                                const int64_t *cs, const int64_t *cl, float dir, int64_t idx) {
    int64_t half = hd / 2, i = idx % half, row = idx / half, bj = row / nkv;
    if (cl[bj] == 0) return;
    ps_gb_rotate(x + row * hd, cos_t, sin_t, cs[bj], half, i, dir);
}

/* ---------------- gate regulariser ---------------- */

/* Is row (bj, g) of alpha [B*nW, nkv, W] a present window (its alpha sums, in double, to more than 0)? */
static inline PS_HD int ps_gb_entropy_present(const float *al, int64_t W) {
    double s = 0;
    for (int64_t i = 0; i < W; i++) s += al[i];
    return s > 0;
}

/* Stage 1, idx = (g, i) < nkv*W: m[g, i] = mean over the present windows of head g of alpha[., g, i]
 * (summed in double, windows in order, then divided by their count n_g; 0 when n_g = 0), and at i = 0
 * cnt[g] = n_g. nbj = B*nW. */
static inline PS_HD void ps_gb_entropy_mean(double *m, double *cnt, const float *alpha, int64_t nbj, int64_t nkv, int64_t W,
                                            int64_t idx) {
    int64_t g = idx / W, i = idx % W, n = 0;
    double acc = 0;
    for (int64_t bj = 0; bj < nbj; bj++) {
        const float *al = alpha + (bj * nkv + g) * W;
        if (!ps_gb_entropy_present(al, W)) continue;
        acc += al[i];
        n++;
    }
    m[idx] = n ? acc / (double)n : 0.0;
    if (i == 0) cnt[g] = (double)n;
}

/* Stage 2, g < nkv: val[g] = weight · (log W − H(m_g)) (0 when head g has no present window; the host adds
 * val[g] for the heads with cnt[g] > 0, in order). */
static inline PS_HD void ps_gb_entropy_value(double *val, const double *m, const double *cnt, int64_t W, double weight,
                                             int64_t g) {
    if (cnt[g] <= 0) {
        val[g] = 0.0;
        return;
    }
    double H = 0;
    for (int64_t i = 0; i < W; i++) {
        double mi = m[g * W + i];
        if (mi > 0) H -= mi * log(mi);
    }
    val[g] = weight * (log((double)W) - H);
}

/* Stage 3, idx = (bj, g, i) < B*nW*nkv*W: dalpha += weight · (log max(m_g,i, 1e-30) + 1) / n_g on the
 * present windows. */
static inline PS_HD void ps_gb_entropy_grad(float *dalpha, const float *alpha, const double *m, const double *cnt,
                                            int64_t nkv, int64_t W, double weight, int64_t idx) {
    int64_t row = idx / W, i = idx % W, g = row % nkv;
    if (cnt[g] <= 0 || !ps_gb_entropy_present(alpha + row * W, W)) return;
    double mi = m[g * W + i];
    dalpha[idx] += (float)(weight * (log(mi > 1e-30 ? mi : 1e-30) + 1.0) / cnt[g]);
}

/* The attention kernels' visibility (attention.cu, elementwise.cu pattern_compact) is hd_math.h's
 * ps_entries_seen / ps_entry_first_seen, the functions ops.h's ps_geom_seen calls. */

#endif
