/* ops_cpu.c — CPU implementation of ops.h: OpenBLAS sgemm for matrix products (always called outside
 * OpenMP regions, so the BLAS threads and ours never oversubscribe), OpenMP loops for the rest. */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/cpu/cpu.h"

int ps_cpu_matmul(ps_ctx *ctx, float *out, const float *inp, const float *w, int64_t M, int64_t K, int64_t N, int accumulate) {
    (void)ctx;
    if (M == 0 || N == 0) return 0;
    if (K == 0) {
        if (!accumulate) memset(out, 0, (size_t)(M * N) * sizeof(float));
        return 0;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)M, (blasint)N, (blasint)K, 1.0f, inp, (blasint)K, w,
                (blasint)K, accumulate ? 1.0f : 0.0f, out, (blasint)N);
    return 0;
}

int ps_cpu_embed(ps_ctx *ctx, float *out, const int32_t *tok, const float *table, int64_t n_tok, int64_t C) {
    (void)ctx;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n_tok; i++) memcpy(out + i * C, table + (int64_t)tok[i] * C, (size_t)C * sizeof(float));
    return 0;
}

int ps_cpu_rmsnorm(ps_ctx *ctx, float *out, float *rstd, const float *inp, const float *weight, int64_t n_rows, int64_t C, float eps) {
    (void)ctx;
#pragma omp parallel for schedule(static) if (n_rows * C > 32768)
    for (int64_t r = 0; r < n_rows; r++) {
        const float *x = inp + r * C;
        float *o = out + r * C;
        double ss = ps_dot_d(x, x, C);
        float s = (float)(1.0 / sqrt(ss / (double)C + (double)eps));
        if (rstd) rstd[r] = s;
        for (int64_t i = 0; i < C; i++) o[i] = x[i] * s * weight[i];
    }
    return 0;
}

int ps_cpu_rope_table(ps_ctx *ctx, float *cos_t, float *sin_t, int64_t n_pos, int64_t hd, double theta) {
    (void)ctx;
    int64_t half = hd / 2;
    for (int64_t p = 0; p < n_pos; p++)
        for (int64_t i = 0; i < half; i++) {
            double f = pow(theta, -2.0 * (double)i / (double)hd), ang = (double)p * f;
            cos_t[p * half + i] = (float)cos(ang);
            sin_t[p * half + i] = (float)sin(ang);
        }
    return 0;
}

/* Rotate each (x_i, x_{i+hd/2}) pair by +angle (dir = 1, the forward) or -angle (dir = -1, which is
 * the transpose: the gradient through the forward rotation). */
static void rope_rotate(float *x, const float *cos_t, const float *sin_t, int64_t n_seq, int64_t rows_per_seq,
                        int64_t n_heads, int64_t hd, int64_t pos_step, float dir) {
    int64_t half = hd / 2, n_rows = n_seq * rows_per_seq;
#pragma omp parallel for schedule(static) if (n_rows * n_heads * hd > 32768)
    for (int64_t r = 0; r < n_rows; r++) {
        int64_t pos = (r % rows_per_seq) * pos_step;
        const float *c = cos_t + pos * half, *s = sin_t + pos * half;
        for (int64_t h = 0; h < n_heads; h++) {
            float *v = x + (r * n_heads + h) * hd;
            for (int64_t i = 0; i < half; i++) {
                float a = v[i], b = v[i + half], sn = dir * s[i];
                v[i] = a * c[i] - b * sn;
                v[i + half] = b * c[i] + a * sn;
            }
        }
    }
}

int ps_cpu_rope(ps_ctx *ctx, float *x, const float *cos_t, const float *sin_t, int64_t n_seq, int64_t rows_per_seq, int64_t n_heads,
             int64_t hd, int64_t pos_step) {
    (void)ctx;
    rope_rotate(x, cos_t, sin_t, n_seq, rows_per_seq, n_heads, hd, pos_step, 1.0f);
    return 0;
}

int ps_cpu_rope_backward(ps_ctx *ctx, float *dx, const float *cos_t, const float *sin_t, int64_t n_seq, int64_t rows_per_seq,
                      int64_t n_heads, int64_t hd, int64_t pos_step) {
    (void)ctx;
    rope_rotate(dx, cos_t, sin_t, n_seq, rows_per_seq, n_heads, hd, pos_step, -1.0f);
    return 0;
}

int ps_cpu_swiglu(ps_ctx *ctx, float *h, const float *g, const float *u, int64_t n) {
    (void)ctx;
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; i++) {
        float x = g[i];
        h[i] = x / (1.0f + ps_expf_v(-x)) * u[i];
    }
    return 0;
}

int ps_cpu_add(ps_ctx *ctx, float *out, const float *a, const float *b, int64_t n) {
    (void)ctx;
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i];
    return 0;
}

int ps_cpu_pool(ps_ctx *ctx, float *out, const float *alpha, const float *P, int64_t B, int64_t nW, int64_t W, int64_t nkv, int64_t hd) {
    (void)ctx;
    int64_t n = B * nW * nkv;
#pragma omp parallel for schedule(static) if (n * W * hd > 32768)
    for (int64_t idx = 0; idx < n; idx++) {
        int64_t bj = idx / nkv, g = idx % nkv;
        float *o = out + idx * hd;
        const float *al = alpha + idx * W;
        memset(o, 0, (size_t)hd * sizeof(float));
        for (int64_t i = 0; i < W; i++) {
            const float *p = P + (bj * W + i) * nkv * hd + g * hd;
            for (int64_t k = 0; k < hd; k++) o[k] += al[i] * p[k];
        }
    }
    return 0;
}

int ps_cpu_attn_rows(ps_ctx *ctx, float *z_rows, const int64_t *rows, int64_t n, const float *q, const float *k, const float *v,
                  const float *ck, const float *cv, const ps_attn_geom *g) {
    (void)ctx;
    int64_t T = g->T, nh = g->nh, nkv = g->nkv, hd = g->hd, grp = nh / nkv;
    float scale = 1.0f / sqrtf((float)hd);
    /* one pass per row with a running maximum (online softmax): no scratch, nothing allocated */
#pragma omp parallel for schedule(static)
    for (int64_t rn = 0; rn < n * nh; rn++) {
        int64_t r = rows[rn / nh], hn = rn % nh, b = r / T, t = r % T, kv = hn / grp;
        const float *qt = q + (r * nh + hn) * hd;
        float *zt = z_rows + (rn / nh) * nh * hd + hn * hd;
        /* entries: compressed windows ended by t, then raw positions [lo, t] */
        int64_t nc = g->compressed ? ps_geom_seen(g, b, kv, t) : 0;
        int64_t lo = g->compressed ? (t - g->LW + 1 > 0 ? t - g->LW + 1 : 0) : 0, ne = nc + (t - lo + 1);
        float mx = -INFINITY, sum = 0;
        memset(zt, 0, (size_t)hd * sizeof(float));
        for (int64_t e = 0; e < ne; e++) {
            const float *key = e < nc ? ck + ((b * g->nW + e) * nkv + kv) * hd : k + ((b * T + lo + e - nc) * nkv + kv) * hd;
            const float *val = e < nc ? cv + ((b * g->nW + e) * nkv + kv) * hd : v + ((b * T + lo + e - nc) * nkv + kv) * hd;
            float sc = ps_dot(qt, key, hd) * scale; /* the same dot and exp as ps_attn_probs */
            if (sc > mx) { /* rescale what was accumulated under the old maximum */
                float f = ps_expf_v(mx - sc);
                sum *= f;
                for (int64_t i = 0; i < hd; i++) zt[i] *= f;
                mx = sc;
            }
            float p = ps_expf_v(sc - mx);
            sum += p;
            for (int64_t i = 0; i < hd; i++) zt[i] += p * val[i];
        }
        for (int64_t i = 0; i < hd; i++) zt[i] /= sum;
    }
    return 0;
}
