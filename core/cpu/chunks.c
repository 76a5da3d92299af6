/* chunks.c — the CPU compressor ops on content-defined chunks (attention.boundaries "content",
 * docs/mitigations.md §4). Chunk j of sequence b covers positions cs[b*nC + j] + i, i < L = cl[b*nC + j]
 * (L = 0: absent); every KV head shares the chunks. Offsets i >= L and absent chunks get z = alpha = 0 and
 * P = 0, and no gradient flows through them.
 *
 * The per-offset payload is one sgemm per offset i over the gathered rows a[b, cs + i] of every (sequence,
 * chunk) and all KV heads at once (zero rows where i >= L); loops run in a fixed order (deterministic). */
#include <cblas.h>
#include <math.h>
#include <string.h>

#include "core/cpu/cpu.h"

static int check_chunks(ps_ctx *ctx, const char *op, const int64_t *cs, const int64_t *cl, int64_t B, int64_t T, int64_t nC,
                        int64_t W) {
    if (!cs || !cl) return ps_ctx_fail(ctx, "%s: no chunk table (content boundaries need the tokens of the batch)", op);
    for (int64_t i = 0; i < B * nC; i++)
        if (cl[i] < 0 || cl[i] > W || (cl[i] > 0 && (cs[i] < 0 || cs[i] + cl[i] > T)))
            return ps_ctx_fail(ctx, "%s: chunk %lld of sequence %lld (start %lld, length %lld) is outside [0, T = %lld) or longer than W = %lld",
                               op, (long long)(i % nC), (long long)(i / nC), (long long)cs[i], (long long)cl[i], (long long)T,
                               (long long)W);
    return 0;
}

int ps_cpu_gate_chunks(ps_ctx *ctx, float *z, float *alpha, const float *a, const float *u, const float *c, int64_t B,
                       int64_t T, int64_t d, int64_t nC, int64_t W, int64_t nkv, const int64_t *cs, const int64_t *cl) {
    if (check_chunks(ctx, "gate_chunks", cs, cl, B, T, nC, W)) return -1;
    int64_t n = B * nC * nkv;
#pragma omp parallel for schedule(static) if (n * W * d > 32768)
    for (int64_t idx = 0; idx < n; idx++) {
        int64_t bj = idx / nkv, b = bj / nC, g = idx % nkv, L = cl[bj], s0 = cs[bj];
        float *zz = z + idx * W, *al = alpha + idx * W;
        for (int64_t i = 0; i < W; i++) zz[i] = al[i] = 0.0f;
        if (L == 0) continue;
        if (!u) {
            for (int64_t i = 0; i < L; i++) al[i] = 1.0f / (float)L;
            continue;
        }
        float mx = -INFINITY;
        for (int64_t i = 0; i < L; i++) {
            const float *x = a + (b * T + s0 + i) * d, *w = u + (i * nkv + g) * d;
            float s = c[i * nkv + g] + ps_dot(w, x, d);
            zz[i] = s;
            if (s > mx) mx = s;
        }
        float sum = 0.0f;
        for (int64_t i = 0; i < L; i++) sum += (al[i] = ps_expf_v(zz[i] - mx));
        for (int64_t i = 0; i < L; i++) al[i] /= sum;
    }
    return 0;
}

/* Gather the rows a[b, cs + i] of every (b, j) into A [B*nC, d] (0 where i >= L). */
static void gather_rows_i(float *A, const float *a, int64_t B, int64_t T, int64_t d, int64_t nC, int64_t i, const int64_t *cs,
                          const int64_t *cl) {
    for (int64_t bj = 0; bj < B * nC; bj++) {
        float *dst = A + bj * d;
        if (i < cl[bj]) memcpy(dst, a + ((bj / nC) * T + cs[bj] + i) * d, (size_t)d * sizeof(float));
        else memset(dst, 0, (size_t)d * sizeof(float));
    }
}

int ps_cpu_payload_chunks(ps_ctx *ctx, float *P, const float *a, const float *C, int shared, float *scratch, int64_t B,
                          int64_t T, int64_t d, int64_t nC, int64_t W, int64_t nkv, int64_t hd, const int64_t *cs,
                          const int64_t *cl) {
    if (check_chunks(ctx, "payload_chunks", cs, cl, B, T, nC, W)) return -1;
    if (nC == 0) return 0;
    int64_t nkvhd = nkv * hd;
    if (shared) {
        ps_cpu_matmul(ctx, scratch, a, C, B * T, d, nkvhd, 0);
        for (int64_t bj = 0; bj < B * nC; bj++)
            for (int64_t i = 0; i < W; i++) {
                float *dst = P + (bj * W + i) * nkvhd;
                if (i < cl[bj]) memcpy(dst, scratch + ((bj / nC) * T + cs[bj] + i) * nkvhd, (size_t)nkvhd * sizeof(float));
                else memset(dst, 0, (size_t)nkvhd * sizeof(float));
            }
        return 0;
    }
    float *A = ps_ctx_workspace(ctx, B * nC * d);
    if (!A) return -1;
    for (int64_t i = 0; i < W; i++) {
        gather_rows_i(A, a, B, T, d, nC, i, cs, cl);
        /* P[(b, j), i, :] = A · C_i^T */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)(B * nC), (blasint)nkvhd, (blasint)d, 1.0f, A, (blasint)d,
                    C + i * nkvhd * d, (blasint)d, 0.0f, P + i * nkvhd, (blasint)(W * nkvhd));
    }
    return 0;
}

int ps_cpu_rope_chunks(ps_ctx *ctx, float *x, const float *cos_t, const float *sin_t, int64_t B, int64_t T, int64_t nC,
                       int64_t nkv, int64_t hd, const int64_t *cs, const int64_t *cl, int inverse) {
    if (check_chunks(ctx, "rope_chunks", cs, cl, B, T, nC, INT64_MAX)) return -1;
    int64_t half = hd / 2;
    float dir = inverse ? -1.0f : 1.0f;
    for (int64_t bj = 0; bj < B * nC; bj++) {
        if (cl[bj] == 0) continue; /* an absent chunk (its entry is 0) */
        const float *c = cos_t + cs[bj] * half, *s = sin_t + cs[bj] * half;
        for (int64_t g = 0; g < nkv; g++) {
            float *v = x + (bj * nkv + g) * hd;
            for (int64_t i = 0; i < half; i++) { /* the rotation of ps_cpu_rope, term for term */
                float p = v[i], q = v[i + half], sn = dir * s[i];
                v[i] = p * c[i] - q * sn;
                v[i + half] = q * c[i] + p * sn;
            }
        }
    }
    return 0;
}

int ps_cpu_gate_chunks_backward(ps_ctx *ctx, float *da, float *du, float *dc, float *dalpha, const float *alpha,
                                const float *a, const float *u, int64_t B, int64_t T, int64_t d, int64_t nC, int64_t W,
                                int64_t nkv, const int64_t *cs, const int64_t *cl) {
    if (check_chunks(ctx, "gate_chunks_backward", cs, cl, B, T, nC, W)) return -1;
    int64_t n = B * nC * nkv;
    /* softmax backward in place (offsets i >= L and absent chunks: alpha = 0, so dz = 0) */
    ps_cpu_softmax_rows_backward(dalpha, alpha, n, W);
#pragma omp parallel for schedule(static)
    for (int64_t ig = 0; ig < W * nkv; ig++) {
        int64_t i = ig / nkv, g = ig % nkv;
        float *dw = du + ig * d;
        for (int64_t bj = 0; bj < B * nC; bj++) {
            if (i >= cl[bj]) continue;
            float dz = dalpha[(bj * nkv + g) * W + i];
            const float *x = a + ((bj / nC) * T + cs[bj] + i) * d;
            dc[ig] += dz;
            for (int64_t e = 0; e < d; e++) dw[e] += dz * x[e];
        }
    }
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < B; b++)
        for (int64_t j = 0; j < nC; j++) {
            int64_t bj = b * nC + j;
            for (int64_t i = 0; i < cl[bj]; i++)
                for (int64_t g = 0; g < nkv; g++) {
                    float dz = dalpha[(bj * nkv + g) * W + i];
                    float *dx = da + (b * T + cs[bj] + i) * d;
                    const float *w = u + (i * nkv + g) * d;
                    for (int64_t e = 0; e < d; e++) dx[e] += dz * w[e];
                }
        }
    return 0;
}

int ps_cpu_payload_chunks_backward(ps_ctx *ctx, float *da, float *dC, const float *dP, const float *a, const float *C,
                                   int shared, float *scratch, int64_t B, int64_t T, int64_t d, int64_t nC, int64_t W,
                                   int64_t nkv, int64_t hd, const int64_t *cs, const int64_t *cl) {
    if (check_chunks(ctx, "payload_chunks_backward", cs, cl, B, T, nC, W)) return -1;
    if (nC == 0) return 0;
    int64_t nkvhd = nkv * hd;
    if (shared) {
        memset(scratch, 0, (size_t)(B * T * nkvhd) * sizeof(float));
        for (int64_t bj = 0; bj < B * nC; bj++)
            for (int64_t i = 0; i < cl[bj]; i++) {
                const float *src = dP + (bj * W + i) * nkvhd;
                float *dst = scratch + ((bj / nC) * T + cs[bj] + i) * nkvhd;
                for (int64_t e = 0; e < nkvhd; e++) dst[e] += src[e];
            }
        ps_cpu_matmul_backward(ctx, da, dC, scratch, a, C, B * T, d, nkvhd);
        return 0;
    }
    int64_t M = B * nC;
    float *A = ps_ctx_workspace(ctx, 2 * M * d);
    if (!A) return -1;
    float *dA = A + M * d;
    for (int64_t i = 0; i < W; i++) {
        gather_rows_i(A, a, B, T, d, nC, i, cs, cl);
        const float *dPi = dP + i * nkvhd; /* rows (b, j), stride W*nkvhd; i >= L: dP = 0 and A = 0 */
        /* dC_i += dP_i^T · A */
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (blasint)nkvhd, (blasint)d, (blasint)M, 1.0f, dPi,
                    (blasint)(W * nkvhd), A, (blasint)d, 1.0f, dC + i * nkvhd * d, (blasint)d);
        /* dA = dP_i · C_i, scattered back to the rows it came from */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)M, (blasint)d, (blasint)nkvhd, 1.0f, dPi,
                    (blasint)(W * nkvhd), C + i * nkvhd * d, (blasint)d, 0.0f, dA, (blasint)d);
        for (int64_t bj = 0; bj < M; bj++) {
            if (i >= cl[bj]) continue;
            float *dx = da + ((bj / nC) * T + cs[bj] + i) * d;
            const float *src = dA + bj * d;
            for (int64_t e = 0; e < d; e++) dx[e] += src[e];
        }
    }
    return 0;
}
