/* ops_cpu_backward.c — CPU implementation of the backward kernels of ops.h (ps_rope_backward shares
 * its rotation with ps_rope in ops_cpu.c). As in ops_cpu.c, sgemm is
 * never called inside an OpenMP region; reductions into shared gradients run serially or per thread. */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/cpu/cpu.h"

int ps_cpu_matmul_backward(ps_ctx *ctx, float *dinp, float *dw, const float *dout, const float *inp, const float *w, int64_t M,
                        int64_t K, int64_t N) {
    (void)ctx;
    if (M == 0 || N == 0 || K == 0) return 0;
    if (dinp)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)M, (blasint)K, (blasint)N, 1.0f, dout,
                    (blasint)N, w, (blasint)K, 1.0f, dinp, (blasint)K);
    if (dw)
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (blasint)N, (blasint)K, (blasint)M, 1.0f, dout, (blasint)N, inp,
                    (blasint)K, 1.0f, dw, (blasint)K);
    return 0;
}

/* Rows in blocks of RMS_BLK: each block's weight-gradient partial is summed over its rows in order, and
 * the partials are added in block order, so dweight does not depend on the thread count. One pass over
 * the rows computes dinp and the partials together. */
#define RMS_BLK 64

/* Σ a·b·c in double, 8 interleaved accumulators in a fixed order (vectorises) */
static double dot3(const float *a, const float *b, const float *c, int64_t n) {
    double acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) acc[l] += (double)a[i + l] * b[i + l] * c[i + l];
    for (int l = 0; i < n; i++, l++) acc[l] += (double)a[i] * b[i] * c[i];
    return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

static void rmsnorm_backward_rows(float *dinp, float *part, const float *dout, const float *inp, const float *weight,
                                  const float *rstd, int64_t r0, int64_t r1, int64_t C) {
    for (int64_t i = 0; i < C; i++) part[i] = 0.0f;
    for (int64_t r = r0; r < r1; r++) {
        const float *x = inp + r * C, *dy = dout + r * C;
        float s = rstd[r];
        double dot = dot3(dy, weight, x, C);
        float coef = (float)(dot * (double)s * s * s / (double)C);
        float *dx = dinp + r * C;
        for (int64_t i = 0; i < C; i++) {
            dx[i] += s * weight[i] * dy[i] - coef * x[i];
            part[i] += dy[i] * x[i] * s;
        }
    }
}

int ps_cpu_rmsnorm_backward(ps_ctx *ctx, float *dinp, float *dweight, const float *dout, const float *inp,
                            const float *weight, const float *rstd, int64_t n_rows, int64_t C) {
    int64_t nb = (n_rows + RMS_BLK - 1) / RMS_BLK;
    float *part = ps_ctx_workspace(ctx, nb * C); /* [nb, C] per-block partial sums of dweight */
    if (!part) return -1;
#pragma omp parallel for schedule(static) if (n_rows * C > 32768)
    for (int64_t b = 0; b < nb; b++) {
        int64_t r1 = (b + 1) * RMS_BLK < n_rows ? (b + 1) * RMS_BLK : n_rows;
        rmsnorm_backward_rows(dinp, part + b * C, dout, inp, weight, rstd, b * RMS_BLK, r1, C);
    }
    for (int64_t b = 0; b < nb; b++)
        for (int64_t i = 0; i < C; i++) dweight[i] += part[b * C + i];
    return 0;
}

int ps_cpu_swiglu_backward(ps_ctx *ctx, float *dg, float *du, const float *dh, const float *g, const float *u, int64_t n) {
    (void)ctx;
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; i++) {
        float x = g[i], sg = 1.0f / (1.0f + ps_expf_v(-x)), silu = x * sg;
        du[i] = dh[i] * silu;
        dg[i] = dh[i] * u[i] * sg * (1.0f + x * (1.0f - sg));
    }
    return 0;
}

int ps_cpu_pool_backward(ps_ctx *ctx, float *dalpha, float *dP, const float *dout, const float *alpha, const float *P, int64_t B,
                      int64_t nW, int64_t W, int64_t nkv, int64_t hd) {
    (void)ctx;
    int64_t n = B * nW * nkv;
#pragma omp parallel for schedule(static) if (n * W * hd > 32768)
    for (int64_t idx = 0; idx < n; idx++) {
        int64_t bj = idx / nkv, g = idx % nkv;
        const float *dy = dout + idx * hd, *al = alpha + idx * W;
        for (int64_t i = 0; i < W; i++) {
            const float *p = P + (bj * W + i) * nkv * hd + g * hd;
            float *dp = dP + (bj * W + i) * nkv * hd + g * hd;
            for (int64_t e = 0; e < hd; e++) dp[e] = al[i] * dy[e];
            dalpha[idx * W + i] = ps_dot(dy, p, hd);
        }
    }
    return 0;
}

static inline int64_t local_first(int64_t t, int64_t LW) { return t - LW + 1 < 0 ? LW - 1 - t : 0; }

#define PS_ATTN_BLOCK 64

static void gemm(int ta, int tb, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const float *B, int64_t ldb,
                 float beta, float *C, int64_t ldc) {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (blasint)M, (blasint)N,
                (blasint)K, 1.0f, A, (blasint)lda, B, (blasint)ldb, beta, C, (blasint)ldc);
}

/* softmax backward of row t in place: dS = P ⊙ (dP − Σ P·dP) · scale; unseen entries (P = 0) get 0.
 * Branch-free (an unseen entry's P = 0 adds nothing and zeroes its output), so both loops vectorise. */
static void softmax_row_backward(float *dr, const float *pr, int64_t nc, float scale) {
    float fd = (float)ps_dot_d(pr, dr, nc);
    for (int64_t c = 0; c < nc; c++) dr[c] = pr[c] * (dr[c] - fd) * scale;
}

/* Parallel over (sequence, KV head): the query heads of one group write the same dK/dV slices, so they
 * run in order inside one task. sgemm inside the region runs single-threaded. */
int ps_cpu_attn_backward_probs(ps_ctx *ctx, float *dq, float *dk, float *dv, float *dck, float *dcv, float *dprobs, const float *dz,
                      const float *probs, const float *q, const float *k, const float *v, const float *ck,
                      const float *cv, const ps_attn_geom *g) {
    (void)ctx;
    int64_t B = g->B, T = g->T, nh = g->nh, nkv = g->nkv, hd = g->hd, nc = g->ncols, grp = nh / nkv, nW = g->nW;
    int64_t LW = g->LW, qs = nh * hd, ks = nkv * hd;
    float scale = 1.0f / sqrtf((float)hd);
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t bk = 0; bk < B * nkv; bk++) {
        int64_t b = bk / nkv, kv = bk % nkv;
        const float *K = k + b * T * ks + kv * hd, *Vv = v + b * T * ks + kv * hd;
        float *dK = dk + b * T * ks + kv * hd, *dV = dv + b * T * ks + kv * hd;
        for (int64_t n = kv * grp; n < (kv + 1) * grp; n++) {
            const float *P = probs + (b * nh + n) * T * nc, *dZ = dz + b * T * qs + n * hd, *Q = q + b * T * qs + n * hd;
            float *dP = dprobs + (b * nh + n) * T * nc, *dQ = dq + b * T * qs + n * hd;
            if (!g->compressed) {
                for (int64_t r0 = 0; r0 < T; r0 += PS_ATTN_BLOCK) {
                    int64_t r1 = r0 + PS_ATTN_BLOCK < T ? r0 + PS_ATTN_BLOCK : T, m = r1 - r0;
                    /* dP = dZ·V^T ; dV += P^T·dZ ; dS ; dQ = dS·K ; dK += dS^T·Q   (columns [0, r1) only) */
                    gemm(0, 1, m, r1, hd, dZ + r0 * qs, qs, Vv, ks, 0.0f, dP + r0 * nc, nc);
                    gemm(1, 0, r1, hd, m, P + r0 * nc, nc, dZ + r0 * qs, qs, 1.0f, dV, ks);
                    for (int64_t t = r0; t < r1; t++) softmax_row_backward(dP + t * nc, P + t * nc, r1, scale);
                    gemm(0, 0, m, hd, r1, dP + r0 * nc, nc, K, ks, 0.0f, dQ + r0 * qs, qs);
                    gemm(1, 0, r1, hd, m, dP + r0 * nc, nc, Q + r0 * qs, qs, 1.0f, dK, ks);
                }
                continue;
            }
            const float *CK = ck + b * nW * ks + kv * hd, *CV = cv + b * nW * ks + kv * hd;
            float *dCK = dck + b * nW * ks + kv * hd, *dCV = dcv + b * nW * ks + kv * hd;
            if (nW > 0) {
                gemm(0, 1, T, nW, hd, dZ, qs, CV, ks, 0.0f, dP, nc);
                gemm(1, 0, nW, hd, T, P, nc, dZ, qs, 1.0f, dCV, ks);
            }
            for (int64_t t = 0; t < T; t++) {
                /* raw columns before the sequence start hold no entry: dP must be a real 0 there, since
                 * the branch-free softmax backward multiplies it by P = 0 (stale bytes could be Inf/NaN) */
                for (int64_t c = nW; c < nW + local_first(t, LW); c++) dP[t * nc + c] = 0.0f;
                for (int64_t c = nW + local_first(t, LW); c < nc; c++) {
                    int64_t tp = t - LW + 1 + (c - nW);
                    const float *dzt = dZ + t * qs, *vt = Vv + tp * ks;
                    float *dvt = dV + tp * ks, p = P[t * nc + c];
                    for (int64_t e = 0; e < hd; e++) dvt[e] += p * dzt[e];
                    dP[t * nc + c] = ps_dot(dzt, vt, hd);
                }
            }
            for (int64_t t = 0; t < T; t++) softmax_row_backward(dP + t * nc, P + t * nc, nc, scale);
            if (nW > 0) {
                gemm(0, 0, T, hd, nW, dP, nc, CK, ks, 0.0f, dQ, qs);
                gemm(1, 0, nW, hd, T, dP, nc, Q, qs, 1.0f, dCK, ks);
            } else
                for (int64_t t = 0; t < T; t++) memset(dQ + t * qs, 0, (size_t)hd * sizeof(float));
            for (int64_t t = 0; t < T; t++)
                for (int64_t c = nW + local_first(t, LW); c < nc; c++) {
                    int64_t tp = t - LW + 1 + (c - nW);
                    float ds = dP[t * nc + c];
                    const float *kt = K + tp * ks, *qt = Q + t * qs;
                    float *dqt = dQ + t * qs, *dkt = dK + tp * ks;
                    for (int64_t e = 0; e < hd; e++) {
                        dqt[e] += ds * kt[e];
                        dkt[e] += ds * qt[e];
                    }
                }
        }
    }
    return 0;
}

int ps_cpu_cross_entropy(ps_ctx *ctx, double *loss_sum, int64_t *n_targets, float *dlogits, const float *logits,
                         const int32_t *targets, int64_t n_rows, int64_t V, float scale) {
    /* per-row losses, summed serially afterwards: bit-identical for any thread count */
    double *row_loss = (double *)ps_ctx_workspace(ctx, 2 * (n_rows ? n_rows : 1));
    if (!row_loss) return -1;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < n_rows; r++) {
        const float *x = logits + r * V;
        float *dx = dlogits ? dlogits + r * V : NULL;
        int32_t y = targets[r];
        row_loss[r] = 0;
        if (y < 0) {
            if (dx) memset(dx, 0, (size_t)V * sizeof(float));
            continue;
        }
        float mx = -INFINITY;
        for (int64_t i = 0; i < V; i++) mx = x[i] > mx ? x[i] : mx;
        /* exponentials in float (x - mx <= 0, so no overflow), their sum and the log in double */
        /* with a gradient buffer the exponentials are kept in it and scaled afterwards (one exp per logit) */
        double acc[8] = {0};
        int64_t k = 0;
        if (dx) {
            for (int64_t i = 0; i < V; i++) dx[i] = ps_expf_v(x[i] - mx);
            for (; k + 8 <= V; k += 8)
                for (int l = 0; l < 8; l++) acc[l] += (double)dx[k + l];
            for (int l = 0; k < V; k++, l++) acc[l] += (double)dx[k];
        } else {
            for (; k + 8 <= V; k += 8)
                for (int l = 0; l < 8; l++) acc[l] += (double)ps_expf_v(x[k + l] - mx);
            for (int l = 0; k < V; k++, l++) acc[l] += (double)ps_expf_v(x[k] - mx);
        }
        double sum = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
        double lse = log(sum) + mx;
        row_loss[r] = lse - x[y];
        if (dx) {
            float fs = (float)(1.0 / sum) * scale;
            for (int64_t i = 0; i < V; i++) dx[i] *= fs;
            dx[y] -= scale;
        }
    }
    int64_t count = 0;
    for (int64_t r = 0; r < n_rows; r++)
        if (targets[r] >= 0) {
            *loss_sum += row_loss[r];
            count++;
        }
    if (n_targets) *n_targets += count;
    return 0;
}
