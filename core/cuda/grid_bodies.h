/* grid_bodies.h — the arithmetic of the CUDA backend's compressor ops over a window table and the gate
 * regulariser (core/cuda/grid.cu; docs/cuda.md), as per-element and per-row "bodies" that are valid C11 and
 * CUDA C++. The kernels in grid.cu are grid-stride loops that call one body per index; tests/test_cuda_grid_bodies.c
 * runs the same bodies over the same index spaces in plain host loops and compares them with the CPU
 * backend (core/cpu/windows.c, core/cpu/grid.c), so the arithmetic is checked on machines without a GPU.
 *
 * Windows (core/backend.h ps_windows): window j of KV head g in sequence b covers positions start[e] + i,
 * i < len[e], e = (b*nW + j)*H + (H == 1 ? 0 : g) (len 0: absent) — the base grid, staggered grids and
 * content chunks alike. The input gradients find the windows holding a position t through jr [B, T, 2]
 * (ps_gb_win_ranges, on the host): the first and last window j of any head that holds t (j1 < j0: none).
 * Arrays are row-major as in ops.h; start/len/jr are device copies on the device and host arrays in the
 * host test.
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

/* ---------------- the window table ---------------- */

/* the table entry of window j of KV head g in sequence b */
static inline PS_HD int64_t ps_gb_e(int64_t nW, int64_t H, int64_t b, int64_t j, int64_t g) {
    return (b * nW + j) * H + (H == 1 ? 0 : g);
}

/* Host: jr [B, T, 2] = the first and last window j (of any head) holding each position (j1 < j0: none). */
static inline void ps_gb_win_ranges(int64_t *jr, int64_t B, int64_t T, int64_t nW, int64_t H, const int64_t *start,
                                    const int64_t *len) {
    for (int64_t r = 0; r < B * T; r++) jr[2 * r] = nW, jr[2 * r + 1] = -1;
    for (int64_t b = 0; b < B; b++)
        for (int64_t j = 0; j < nW; j++)
            for (int64_t h = 0; h < H; h++) {
                int64_t e = (b * nW + j) * H + h;
                for (int64_t i = 0; i < len[e]; i++) {
                    int64_t *r = jr + 2 * (b * T + start[e] + i);
                    if (j < r[0]) r[0] = j;
                    if (j > r[1]) r[1] = j;
                }
            }
}

/* ---------------- gate (forward) ---------------- */

/* Gate logit wi = (b, j, g, i), wi < B*nW*nkv*W: z = bias[i, g] + u[i, g, :] · a[b, start + i, :] (0 at
 * i >= len). Only with a learned gate (u, bias not NULL). */
static inline PS_HD void ps_gb_win_gate_logit(float *z, const float *a, const float *u, const float *bias, int64_t T,
                                              int64_t d, int64_t nW, int64_t W, int64_t nkv, int64_t H, const int64_t *start,
                                              const int64_t *len, int64_t wi) {
    int64_t row = wi / W, i = wi % W, b = row / (nW * nkv), j = (row / nkv) % nW, g = row % nkv, e = ps_gb_e(nW, H, b, j, g);
    if (i >= len[e]) {
        z[wi] = 0.0f;
        return;
    }
    z[wi] = bias[i * nkv + g] + ps_dot(u + (i * nkv + g) * d, a + (b * T + start[e] + i) * d, d);
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

/* Row (b, j, g), row < B*nW*nkv: the softmax over the window's len offsets. */
static inline PS_HD void ps_gb_win_gate_row(float *z, float *alpha, int64_t nW, int64_t W, int64_t nkv, int64_t H,
                                            const int64_t *len, int uniform, int64_t row) {
    int64_t b = row / (nW * nkv), j = (row / nkv) % nW, g = row % nkv;
    ps_gb_gate_softmax_row(z + row * W, alpha + row * W, W, len[ps_gb_e(nW, H, b, j, g)], uniform);
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

/* du[i, g, k] += Σ_{b, j: i < len} dz[b, j, g, i] · a[b, start + i, k] (b, then j: the CPU's order);
 * idx < W*nkv*d. dz is dalpha after the softmax backward. */
static inline PS_HD void ps_gb_win_gate_du(float *du, const float *dz, const float *a, int64_t B, int64_t T, int64_t d,
                                           int64_t nW, int64_t W, int64_t nkv, int64_t H, const int64_t *start,
                                           const int64_t *len, int64_t idx) {
    int64_t ig = idx / d, k = idx % d, i = ig / nkv, g = ig % nkv;
    float acc = du[idx];
    for (int64_t b = 0; b < B; b++)
        for (int64_t j = 0; j < nW; j++) {
            int64_t e = ps_gb_e(nW, H, b, j, g);
            if (i < len[e]) acc += dz[((b * nW + j) * nkv + g) * W + i] * a[(b * T + start[e] + i) * d + k];
        }
    du[idx] = acc;
}

/* dbias[i, g] += Σ_{b, j: i < len} dz[b, j, g, i]; ig < W*nkv. */
static inline PS_HD void ps_gb_win_gate_dbias(float *dc, const float *dz, int64_t B, int64_t nW, int64_t W, int64_t nkv,
                                              int64_t H, const int64_t *len, int64_t ig) {
    int64_t i = ig / nkv, g = ig % nkv;
    float acc = dc[ig];
    for (int64_t b = 0; b < B; b++)
        for (int64_t j = 0; j < nW; j++)
            if (i < len[ps_gb_e(nW, H, b, j, g)]) acc += dz[((b * nW + j) * nkv + g) * W + i];
    dc[ig] = acc;
}

/* da[b, t, k] += Σ dz[b, j, g, i] · u[i, g, k] over the windows (j, g) holding t at offset i = t − start, in
 * the CPU's order (j, then i, then g; j from jr); idx < B*T*d. */
static inline PS_HD void ps_gb_win_gate_da(float *da, const float *dz, const float *u, int64_t T, int64_t d, int64_t nW,
                                           int64_t W, int64_t nkv, int64_t H, const int64_t *start, const int64_t *len,
                                           const int64_t *jr, int64_t idx) {
    int64_t k = idx % d, t = (idx / d) % T, b = idx / (d * T), j0 = jr[2 * (b * T + t)], j1 = jr[2 * (b * T + t) + 1];
    float acc = da[idx];
    for (int64_t j = j0; j <= j1; j++)
        for (int64_t i = 0; i < W; i++)
            for (int64_t g = 0; g < nkv; g++) {
                int64_t e = ps_gb_e(nW, H, b, j, g);
                if (i < len[e] && start[e] + i == t) acc += dz[((b * nW + j) * nkv + g) * W + i] * u[(i * nkv + g) * d + k];
            }
    da[idx] = acc;
}

/* ---------------- payloads (forward) ---------------- */

/* Shared payload: P[b, j, i, n] = scratch[b, start + i, n] (the window of head g = n / hd; 0 at i >= len),
 * scratch = a · C^T [B, T, nkv*hd]; idx < B*nW*W*nkv*hd. */
static inline PS_HD void ps_gb_win_payload_gather(float *P, const float *scratch, int64_t T, int64_t nW, int64_t W,
                                                  int64_t nkv, int64_t hd, int64_t H, const int64_t *start, const int64_t *len,
                                                  int64_t idx) {
    int64_t nk = nkv * hd, n = idx % nk, i = (idx / nk) % W, bj = idx / (nk * W), e = ps_gb_e(nW, H, bj / nW, bj % nW, n / hd);
    P[idx] = i < len[e] ? scratch[((bj / nW) * T + start[e] + i) * nk + n] : 0.0f;
}

/* Per-offset payload: P[b, j, i, n] = C[i, n, :] · a[b, start + i, :] (0 at i >= len); idx < B*nW*W*nkv*hd. */
static inline PS_HD void ps_gb_win_payload_elem(float *P, const float *a, const float *C, int64_t T, int64_t d, int64_t nW,
                                                int64_t W, int64_t nkv, int64_t hd, int64_t H, const int64_t *start,
                                                const int64_t *len, int64_t idx) {
    int64_t nk = nkv * hd, n = idx % nk, i = (idx / nk) % W, bj = idx / (nk * W), e = ps_gb_e(nW, H, bj / nW, bj % nW, n / hd);
    P[idx] = i < len[e] ? ps_dot(C + (i * nk + n) * d, a + ((bj / nW) * T + start[e] + i) * d, d) : 0.0f;
}

/* ---------------- payloads (backward) ---------------- */

/* Shared payload: scratch[b, t, n] = Σ over the windows j of head g = n / hd holding t (j in order):
 * dP[b, j, t − start, n]; idx < B*T*nkv*hd. Then da, dC come from matmul_backward. */
static inline PS_HD void ps_gb_win_payload_scatter(float *scratch, const float *dP, int64_t T, int64_t nW, int64_t W,
                                                   int64_t nkv, int64_t hd, int64_t H, const int64_t *start, const int64_t *len,
                                                   const int64_t *jr, int64_t idx) {
    int64_t nk = nkv * hd, n = idx % nk, t = (idx / nk) % T, b = idx / (nk * T);
    float acc = 0.0f;
    for (int64_t j = jr[2 * (b * T + t)]; j <= jr[2 * (b * T + t) + 1]; j++) {
        int64_t e = ps_gb_e(nW, H, b, j, n / hd), i = t - start[e];
        if (i >= 0 && i < len[e]) acc += dP[((b * nW + j) * W + i) * nk + n];
    }
    scratch[idx] = acc;
}

/* Per-offset payload: dC[i, n, k] += Σ_{b, j: i < len} dP[b, j, i, n] · a[b, start + i, k] (b, then j);
 * idx < W*nkv*hd*d. */
static inline PS_HD void ps_gb_win_payload_dC(float *dC, const float *dP, const float *a, int64_t B, int64_t T, int64_t d,
                                              int64_t nW, int64_t W, int64_t nkv, int64_t hd, int64_t H, const int64_t *start,
                                              const int64_t *len, int64_t idx) {
    int64_t nk = nkv * hd, k = idx % d, n = (idx / d) % nk, i = idx / (d * nk);
    float acc = dC[idx];
    for (int64_t b = 0; b < B; b++)
        for (int64_t j = 0; j < nW; j++) {
            int64_t e = ps_gb_e(nW, H, b, j, n / hd);
            if (i < len[e]) acc += dP[((b * nW + j) * W + i) * nk + n] * a[(b * T + start[e] + i) * d + k];
        }
    dC[idx] = acc;
}

/* Per-offset payload: da[b, t, k] += Σ over offsets i, then table columns h (a head, or all heads when H = 1),
 * then windows j holding t at offset i (t = start + i): Σ_c dP[b, j, i, h·cols + c] · C[i, h·cols + c, k]
 * (cols = nkv·hd / H; the CPU's (i, h) order, each inner sum its own partial as the CPU's per-(i, h)
 * product); idx < B*T*d. */
static inline PS_HD void ps_gb_win_payload_da(float *da, const float *dP, const float *C, int64_t T, int64_t d, int64_t nW,
                                              int64_t W, int64_t nkv, int64_t hd, int64_t H, const int64_t *start,
                                              const int64_t *len, const int64_t *jr, int64_t idx) {
    int64_t nk = nkv * hd, cols = nk / H, k = idx % d, t = (idx / d) % T, b = idx / (d * T);
    int64_t j0 = jr[2 * (b * T + t)], j1 = jr[2 * (b * T + t) + 1];
    float acc = da[idx];
    for (int64_t i = 0; i < W; i++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t j = j0; j <= j1; j++) {
                int64_t e = (b * nW + j) * H + h;
                if (i >= len[e] || start[e] + i != t) continue;
                const float *dp = dP + ((b * nW + j) * W + i) * nk + h * cols, *cc = C + (i * nk + h * cols) * d + k;
                float s = 0.0f;
                for (int64_t c = 0; c < cols; c++) s += dp[c] * cc[c * d];
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

/* Pair i of entry (b, j, g) of x [B, nW, nkv, hd] by R(start) (left alone when start is outside [0, T):
 * ops.h ps_rope_windows); idx < B*nW*nkv*(hd/2). */
static inline PS_HD void ps_gb_win_rope_pair(float *x, const float *cos_t, const float *sin_t, int64_t T, int64_t nW,
                                             int64_t nkv, int64_t hd, int64_t H, const int64_t *start, float dir, int64_t idx) {
    int64_t half = hd / 2, i = idx % half, row = idx / half, pos = start[ps_gb_e(nW, H, row / (nkv * nW), (row / nkv) % nW, row % nkv)];
    if (pos < 0 || pos >= T) return;
    ps_gb_rotate(x + row * hd, cos_t, sin_t, pos, half, i, dir);
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
