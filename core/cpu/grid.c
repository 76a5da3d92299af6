/* grid.c — the CPU compressor ops on window grids with start offsets (staggered grids, phase augmentation;
 * docs/mitigations.md) and the gate regulariser. Window j of KV head g in sequence b covers positions
 * jS + o + i with o = woff[b*nkv + g] (NULL: 0); a window that does not fit in T (jS + o + W > T) is absent
 * for that head: z = alpha = 0, P = 0, and no gradient flows through it. With woff NULL these ops give the
 * same numbers as ps_cpu_gate / ps_cpu_payload / ps_cpu_rope (the base ops stay the fast path the base
 * model uses; the tests compare both).
 *
 * The per-offset payload is one sgemm per (offset i, KV head g) over the gathered rows a[b, jS + o + i]
 * of every (sequence, window) — each head may read different rows — and the loops run serially in a fixed
 * order (deterministic; sgemm may use its own threads). */
#include <cblas.h>
#include <math.h>
#include <string.h>

#include "core/cpu/cpu.h"

/* Does window j of a grid at offset o fit in T? */
static inline int win_fits(int64_t j, int64_t o, int64_t W, int64_t S, int64_t T) { return j * S + o + W <= T; }

static int check_woff(ps_ctx *ctx, const char *op, const int64_t *woff, int64_t B, int64_t nkv, int64_t S) {
    if (!woff) return 0;
    for (int64_t i = 0; i < B * nkv; i++)
        if (woff[i] < 0 || woff[i] >= S)
            return ps_ctx_fail(ctx, "%s: window offset %lld of sequence %lld, KV head %lld is outside [0, S = %lld)", op,
                               (long long)woff[i], (long long)(i / nkv), (long long)(i % nkv), (long long)S);
    return 0;
}

int ps_cpu_gate_grid(ps_ctx *ctx, float *z, float *alpha, const float *a, const float *u, const float *c, int64_t B,
                     int64_t T, int64_t d, int64_t nW, int64_t W, int64_t S, int64_t nkv, const int64_t *woff) {
    if (check_woff(ctx, "gate_grid", woff, B, nkv, S)) return -1;
    int64_t n = B * nW * nkv;
#pragma omp parallel for schedule(static) if (n * W * d > 32768)
    for (int64_t idx = 0; idx < n; idx++) {
        int64_t b = idx / (nW * nkv), j = (idx / nkv) % nW, g = idx % nkv, o = ps_woff(woff, b, nkv, g);
        float *zz = z + idx * W, *al = alpha + idx * W;
        if (!win_fits(j, o, W, S, T)) {
            for (int64_t i = 0; i < W; i++) zz[i] = al[i] = 0.0f;
            continue;
        }
        if (!u) {
            for (int64_t i = 0; i < W; i++) zz[i] = 0.0f, al[i] = 1.0f / (float)W;
            continue;
        }
        float mx = -INFINITY;
        for (int64_t i = 0; i < W; i++) {
            const float *x = a + (b * T + j * S + o + i) * d, *w = u + (i * nkv + g) * d;
            float s = c[i * nkv + g] + ps_dot(w, x, d);
            zz[i] = s;
            if (s > mx) mx = s;
        }
        float sum = 0.0f;
        for (int64_t i = 0; i < W; i++) sum += (al[i] = ps_expf_v(zz[i] - mx));
        for (int64_t i = 0; i < W; i++) al[i] /= sum;
    }
    return 0;
}

/* Gather the rows a[b, jS + o(b,g) + i] of every (b, j) into A [B*nW, d] (0 for absent windows). */
static void gather_rows_ig(float *A, const float *a, int64_t B, int64_t T, int64_t d, int64_t nW, int64_t W, int64_t S,
                           int64_t nkv, int64_t i, int64_t g, const int64_t *woff) {
    for (int64_t b = 0; b < B; b++) {
        int64_t o = ps_woff(woff, b, nkv, g);
        for (int64_t j = 0; j < nW; j++) {
            float *dst = A + (b * nW + j) * d;
            if (win_fits(j, o, W, S, T)) memcpy(dst, a + (b * T + j * S + o + i) * d, (size_t)d * sizeof(float));
            else memset(dst, 0, (size_t)d * sizeof(float));
        }
    }
}

int ps_cpu_payload_grid(ps_ctx *ctx, float *P, const float *a, const float *C, int shared, float *scratch, int64_t B,
                        int64_t T, int64_t d, int64_t nW, int64_t W, int64_t S, int64_t nkv, int64_t hd,
                        const int64_t *woff) {
    if (check_woff(ctx, "payload_grid", woff, B, nkv, S)) return -1;
    if (nW == 0) return 0;
    int64_t nkvhd = nkv * hd;
    if (shared) {
        ps_cpu_matmul(ctx, scratch, a, C, B * T, d, nkvhd, 0);
        for (int64_t b = 0; b < B; b++)
            for (int64_t j = 0; j < nW; j++)
                for (int64_t i = 0; i < W; i++)
                    for (int64_t g = 0; g < nkv; g++) {
                        int64_t o = ps_woff(woff, b, nkv, g);
                        float *dst = P + ((b * nW + j) * W + i) * nkvhd + g * hd;
                        if (win_fits(j, o, W, S, T))
                            memcpy(dst, scratch + (b * T + j * S + o + i) * nkvhd + g * hd, (size_t)hd * sizeof(float));
                        else
                            memset(dst, 0, (size_t)hd * sizeof(float));
                    }
        return 0;
    }
    float *A = ps_ctx_workspace(ctx, B * nW * d);
    if (!A) return -1;
    for (int64_t i = 0; i < W; i++)
        for (int64_t g = 0; g < nkv; g++) {
            gather_rows_ig(A, a, B, T, d, nW, W, S, nkv, i, g, woff);
            /* P[(b, j), i, g*hd : (g+1)*hd] = A · C_i[g*hd : (g+1)*hd]^T */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)(B * nW), (blasint)hd, (blasint)d, 1.0f, A,
                        (blasint)d, C + (i * nkvhd + g * hd) * d, (blasint)d, 0.0f, P + i * nkvhd + g * hd,
                        (blasint)(W * nkvhd));
        }
    return 0;
}

int ps_cpu_rope_grid(ps_ctx *ctx, float *x, const float *cos_t, const float *sin_t, int64_t B, int64_t T, int64_t nW,
                     int64_t nkv, int64_t hd, int64_t S, const int64_t *woff, int inverse) {
    if (check_woff(ctx, "rope_grid", woff, B, nkv, S)) return -1;
    int64_t half = hd / 2;
    float dir = inverse ? -1.0f : 1.0f;
    for (int64_t b = 0; b < B; b++)
        for (int64_t j = 0; j < nW; j++)
            for (int64_t g = 0; g < nkv; g++) {
                int64_t pos = j * S + ps_woff(woff, b, nkv, g);
                if (pos >= T) continue; /* an absent window (its entry is 0) */
                const float *c = cos_t + pos * half, *s = sin_t + pos * half;
                float *v = x + ((b * nW + j) * nkv + g) * hd;
                for (int64_t i = 0; i < half; i++) { /* the rotation of ps_cpu_rope, term for term */
                    float p = v[i], q = v[i + half], sn = dir * s[i];
                    v[i] = p * c[i] - q * sn;
                    v[i + half] = q * c[i] + p * sn;
                }
            }
    return 0;
}

int ps_cpu_gate_grid_backward(ps_ctx *ctx, float *da, float *du, float *dc, float *dalpha, const float *alpha,
                              const float *a, const float *u, int64_t B, int64_t T, int64_t d, int64_t nW, int64_t W,
                              int64_t S, int64_t nkv, const int64_t *woff) {
    if (check_woff(ctx, "gate_grid_backward", woff, B, nkv, S)) return -1;
    int64_t n = B * nW * nkv;
    /* softmax backward in place (absent windows: alpha = 0, so dz = 0) */
    ps_cpu_softmax_rows_backward(dalpha, alpha, n, W);
#pragma omp parallel for schedule(static)
    for (int64_t ig = 0; ig < W * nkv; ig++) {
        int64_t i = ig / nkv, g = ig % nkv;
        float *dw = du + ig * d;
        for (int64_t b = 0; b < B; b++) {
            int64_t o = ps_woff(woff, b, nkv, g);
            for (int64_t j = 0; j < nW; j++) {
                if (!win_fits(j, o, W, S, T)) continue;
                float dz = dalpha[((b * nW + j) * nkv + g) * W + i];
                const float *x = a + (b * T + j * S + o + i) * d;
                dc[ig] += dz;
                for (int64_t e = 0; e < d; e++) dw[e] += dz * x[e];
            }
        }
    }
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < B; b++)
        for (int64_t j = 0; j < nW; j++)
            for (int64_t i = 0; i < W; i++)
                for (int64_t g = 0; g < nkv; g++) {
                    int64_t o = ps_woff(woff, b, nkv, g);
                    if (!win_fits(j, o, W, S, T)) continue;
                    float dz = dalpha[((b * nW + j) * nkv + g) * W + i];
                    float *dx = da + (b * T + j * S + o + i) * d;
                    const float *w = u + (i * nkv + g) * d;
                    for (int64_t e = 0; e < d; e++) dx[e] += dz * w[e];
                }
    return 0;
}

int ps_cpu_payload_grid_backward(ps_ctx *ctx, float *da, float *dC, const float *dP, const float *a, const float *C,
                                 int shared, float *scratch, int64_t B, int64_t T, int64_t d, int64_t nW, int64_t W,
                                 int64_t S, int64_t nkv, int64_t hd, const int64_t *woff) {
    if (check_woff(ctx, "payload_grid_backward", woff, B, nkv, S)) return -1;
    if (nW == 0) return 0;
    int64_t nkvhd = nkv * hd;
    if (shared) {
        memset(scratch, 0, (size_t)(B * T * nkvhd) * sizeof(float));
        for (int64_t b = 0; b < B; b++)
            for (int64_t j = 0; j < nW; j++)
                for (int64_t i = 0; i < W; i++)
                    for (int64_t g = 0; g < nkv; g++) {
                        int64_t o = ps_woff(woff, b, nkv, g);
                        if (!win_fits(j, o, W, S, T)) continue;
                        const float *src = dP + ((b * nW + j) * W + i) * nkvhd + g * hd;
                        float *dst = scratch + (b * T + j * S + o + i) * nkvhd + g * hd;
                        for (int64_t e = 0; e < hd; e++) dst[e] += src[e];
                    }
        ps_cpu_matmul_backward(ctx, da, dC, scratch, a, C, B * T, d, nkvhd);
        return 0;
    }
    int64_t M = B * nW;
    float *A = ps_ctx_workspace(ctx, 2 * M * d);
    if (!A) return -1;
    float *dA = A + M * d;
    for (int64_t i = 0; i < W; i++)
        for (int64_t g = 0; g < nkv; g++) {
            gather_rows_ig(A, a, B, T, d, nW, W, S, nkv, i, g, woff);
            const float *dPig = dP + i * nkvhd + g * hd; /* rows (b, j), stride W*nkvhd; absent windows: dP = 0 */
            const float *Cig = C + (i * nkvhd + g * hd) * d;
            /* dC_i[g rows] += dP_ig^T · A */
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (blasint)hd, (blasint)d, (blasint)M, 1.0f, dPig,
                        (blasint)(W * nkvhd), A, (blasint)d, 1.0f, dC + (i * nkvhd + g * hd) * d, (blasint)d);
            /* dA = dP_ig · C_ig, scattered back to the rows it came from */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)M, (blasint)d, (blasint)hd, 1.0f, dPig,
                        (blasint)(W * nkvhd), Cig, (blasint)d, 0.0f, dA, (blasint)d);
            for (int64_t b = 0; b < B; b++) {
                int64_t o = ps_woff(woff, b, nkv, g);
                for (int64_t j = 0; j < nW; j++) {
                    if (!win_fits(j, o, W, S, T)) continue;
                    float *dx = da + (b * T + j * S + o + i) * d;
                    const float *src = dA + (b * nW + j) * d;
                    for (int64_t e = 0; e < d; e++) dx[e] += src[e];
                }
            }
        }
    return 0;
}

int ps_cpu_gate_entropy(ps_ctx *ctx, double *value, float *dalpha, const float *alpha, int64_t B, int64_t nW, int64_t nkv,
                        int64_t W, double weight) {
    double *m = (double *)(void *)ps_ctx_workspace(ctx, 2 * W); /* 2W floats: room for W doubles */
    if (!m) return -1;
    for (int64_t g = 0; g < nkv; g++) {
        memset(m, 0, (size_t)W * sizeof(double));
        int64_t n = 0;
        for (int64_t bj = 0; bj < B * nW; bj++) {
            const float *al = alpha + (bj * nkv + g) * W;
            double s = 0;
            for (int64_t i = 0; i < W; i++) s += al[i];
            if (s <= 0) continue; /* an absent window */
            for (int64_t i = 0; i < W; i++) m[i] += al[i];
            n++;
        }
        if (n == 0) continue;
        double H = 0;
        for (int64_t i = 0; i < W; i++) {
            m[i] /= (double)n;
            if (m[i] > 0) H -= m[i] * log(m[i]);
        }
        value[0] += weight * (log((double)W) - H);
        if (!dalpha) continue;
        for (int64_t i = 0; i < W; i++) m[i] = weight * (log(m[i] > 1e-30 ? m[i] : 1e-30) + 1.0) / (double)n;
        for (int64_t bj = 0; bj < B * nW; bj++) {
            const float *al = alpha + (bj * nkv + g) * W;
            double s = 0;
            for (int64_t i = 0; i < W; i++) s += al[i];
            if (s <= 0) continue;
            float *dal = dalpha + (bj * nkv + g) * W;
            for (int64_t i = 0; i < W; i++) dal[i] += (float)m[i];
        }
    }
    return 0;
}
