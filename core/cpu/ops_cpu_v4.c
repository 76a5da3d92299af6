/* ops_cpu_v4.c — CPU implementation of the DeepSeek-V4 ops of core/ops.h (SPEC-v4): interleaved rope
 * with precomputed (YaRN) frequencies, mHC weights / collapse / expand, the compressor's slot gate,
 * per-channel slot softmax and pooling, the lightning indexer's scores and top-k, MoE routing, the
 * clamped SwiGLU, attention with a per-head sink (flash style, and the materialised path the pattern
 * hooks use), and the grouped output projection. OpenBLAS only outside OpenMP regions. */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "core/cpu/cpu.h"

int ps_cpu_v4_rope_table(ps_ctx *ctx, float *cos_t, float *sin_t, int64_t n_pos, int64_t half, const double *inv_freq,
                         float mscale) {
    (void)ctx;
#pragma omp parallel for schedule(static) if (n_pos * half > 65536)
    for (int64_t p = 0; p < n_pos; p++)
        for (int64_t i = 0; i < half; i++) {
            double a = (double)p * inv_freq[i];
            cos_t[p * half + i] = (float)(cos(a) * (double)mscale);
            sin_t[p * half + i] = (float)(sin(a) * (double)mscale);
        }
    return 0;
}

int ps_cpu_v4_rope(ps_ctx *ctx, float *x, const float *cos_t, const float *sin_t, int64_t n_seq, int64_t rows_per_seq,
                   int64_t n_heads, int64_t hd, int64_t rd, int64_t pos_step, int inverse) {
    (void)ctx;
    int64_t half = rd / 2, n_rows = n_seq * rows_per_seq;
    float dir = inverse ? -1.0f : 1.0f;
#pragma omp parallel for schedule(static) if (n_rows * n_heads * rd > 32768)
    for (int64_t r = 0; r < n_rows; r++) {
        int64_t pos = (r % rows_per_seq) * pos_step;
        const float *c = cos_t + pos * half, *s = sin_t + pos * half;
        for (int64_t h = 0; h < n_heads; h++) {
            float *v = x + (r * n_heads + h) * hd + (hd - rd);
            for (int64_t i = 0; i < half; i++) {
                float a = v[2 * i], b = v[2 * i + 1], sn = dir * s[i];
                v[2 * i] = a * c[i] - b * sn;
                v[2 * i + 1] = b * c[i] + a * sn;
            }
        }
    }
    return 0;
}

static double sigmoid_d(double x) { return 1.0 / (1.0 + exp(-x)); }

int ps_cpu_v4_hc_weights(ps_ctx *ctx, float *pre, float *post, float *comb, const float *mix, const float *x,
                         const float *scale, const float *base, int64_t n, int64_t N, int64_t D, int64_t iters,
                         float hc_eps, float norm_eps) {
    if (N > 64) return ps_ctx_fail(ctx, "v4_hc_weights: %lld streams (at most 64)", (long long)N);
    int head = post == NULL;
    int64_t width = head ? N : (2 + N) * N;
#pragma omp parallel for schedule(static) if (n * N * D > 65536)
    for (int64_t r = 0; r < n; r++) {
        double rs = 1.0 / sqrt(ps_dot_d(x + r * N * D, x + r * N * D, N * D) / (double)(N * D) + (double)norm_eps);
        const float *mx = mix + r * width;
        double eps = hc_eps;
        for (int64_t j = 0; j < N; j++)
            pre[r * N + j] = (float)(sigmoid_d((double)mx[j] * rs * scale[0] + base[j]) + eps);
        if (head) continue;
        for (int64_t j = 0; j < N; j++)
            post[r * N + j] = (float)(2.0 * sigmoid_d((double)mx[N + j] * rs * scale[1] + base[N + j]));
        double cm[64 * 64];
        for (int64_t j = 0; j < N; j++) {
            double mmax = -INFINITY, sum = 0;
            for (int64_t k = 0; k < N; k++) {
                double v = (double)mx[2 * N + j * N + k] * rs * scale[2] + base[2 * N + j * N + k];
                cm[j * N + k] = v;
                if (v > mmax) mmax = v;
            }
            for (int64_t k = 0; k < N; k++) sum += (cm[j * N + k] = exp(cm[j * N + k] - mmax));
            for (int64_t k = 0; k < N; k++) cm[j * N + k] = cm[j * N + k] / sum + eps;
        }
        for (int64_t it = 0; it < iters; it++) {
            if (it > 0) /* rows */
                for (int64_t j = 0; j < N; j++) {
                    double s = 0;
                    for (int64_t k = 0; k < N; k++) s += cm[j * N + k];
                    for (int64_t k = 0; k < N; k++) cm[j * N + k] /= s + eps;
                }
            for (int64_t k = 0; k < N; k++) { /* columns */
                double s = 0;
                for (int64_t j = 0; j < N; j++) s += cm[j * N + k];
                for (int64_t j = 0; j < N; j++) cm[j * N + k] /= s + eps;
            }
        }
        for (int64_t i = 0; i < N * N; i++) comb[r * N * N + i] = (float)cm[i];
    }
    return 0;
}

int ps_cpu_v4_hc_collapse(ps_ctx *ctx, float *out, const float *pre, const float *h, int64_t n, int64_t N, int64_t D) {
    (void)ctx;
#pragma omp parallel for schedule(static) if (n * N * D > 65536)
    for (int64_t r = 0; r < n; r++) {
        float *o = out + r * D;
        for (int64_t d = 0; d < D; d++) o[d] = 0.0f;
        for (int64_t j = 0; j < N; j++) {
            float p = pre[r * N + j];
            const float *hj = h + (r * N + j) * D;
            for (int64_t d = 0; d < D; d++) o[d] += p * hj[d];
        }
    }
    return 0;
}

int ps_cpu_v4_hc_expand(ps_ctx *ctx, float *hout, const float *post, const float *comb, const float *blk, const float *h,
                        int64_t n, int64_t N, int64_t D) {
    (void)ctx;
#pragma omp parallel for schedule(static) if (n * N * N * D > 65536)
    for (int64_t r = 0; r < n; r++)
        for (int64_t k = 0; k < N; k++) {
            float *o = hout + (r * N + k) * D;
            float p = post[r * N + k];
            const float *b = blk + r * D;
            for (int64_t d = 0; d < D; d++) o[d] = p * b[d];
            for (int64_t j = 0; j < N; j++) {
                float c = comb[(r * N + j) * N + k];
                const float *hj = h + (r * N + j) * D;
                for (int64_t d = 0; d < D; d++) o[d] += c * hj[d];
            }
        }
    return 0;
}

/* The source row and channel offset of slot s of window w (NULL: a dead slot of window 0). */
static inline const float *slot_src(const float *base, int64_t b, int64_t T, int64_t w, int64_t s, int64_t m, int64_t d,
                                    int overlap, int64_t *ch) {
    int64_t c = overlap ? 2 : 1, tok;
    if (!overlap) {
        tok = w * m + s;
        *ch = 0;
    } else if (s < m) {
        if (w == 0) return NULL;
        tok = (w - 1) * m + s;
        *ch = 0;
    } else {
        tok = w * m + (s - m);
        *ch = d;
    }
    return base + (b * T + tok) * c * d;
}

int ps_cpu_v4_comp_slots(ps_ctx *ctx, float *gate, const float *z, const float *ape, int64_t B, int64_t T, int64_t nW,
                         int64_t m, int64_t d, int overlap) {
    (void)ctx;
    int64_t S = overlap ? 2 * m : m, c = overlap ? 2 : 1;
#pragma omp parallel for schedule(static) if (B * nW * S * d > 65536)
    for (int64_t bw = 0; bw < B * nW; bw++) {
        int64_t b = bw / nW, w = bw % nW;
        for (int64_t s = 0; s < S; s++) {
            float *o = gate + (bw * S + s) * d;
            int64_t ch;
            const float *src = slot_src(z, b, T, w, s, m, d, overlap, &ch);
            const float *a = ape + (s % m) * c * d + ch;
            if (!src)
                for (int64_t i = 0; i < d; i++) o[i] = -INFINITY;
            else
                for (int64_t i = 0; i < d; i++) o[i] = src[ch + i] + a[i];
        }
    }
    return 0;
}

int ps_cpu_v4_slot_softmax(ps_ctx *ctx, float *alpha, const float *gate, int64_t n_groups, int64_t S, int64_t d) {
    (void)ctx;
#pragma omp parallel for schedule(static) if (n_groups * S * d > 65536)
    for (int64_t g = 0; g < n_groups; g++) {
        const float *z = gate + g * S * d;
        float *a = alpha + g * S * d;
        for (int64_t i = 0; i < d; i++) {
            float mx = -INFINITY;
            for (int64_t s = 0; s < S; s++)
                if (z[s * d + i] > mx) mx = z[s * d + i];
            if (mx == -INFINITY || isnan(mx)) {
                for (int64_t s = 0; s < S; s++) a[s * d + i] = mx == -INFINITY ? 0.0f : NAN;
                continue;
            }
            double sum = 0;
            for (int64_t s = 0; s < S; s++) {
                float e = expf(z[s * d + i] - mx);
                a[s * d + i] = e;
                sum += e;
            }
            float inv = (float)(1.0 / sum);
            for (int64_t s = 0; s < S; s++) a[s * d + i] *= inv;
        }
    }
    return 0;
}

int ps_cpu_v4_comp_pool(ps_ctx *ctx, float *pooled, const float *alpha, const float *kv, int64_t B, int64_t T,
                        int64_t nW, int64_t m, int64_t d, int overlap) {
    (void)ctx;
    int64_t S = overlap ? 2 * m : m;
#pragma omp parallel for schedule(static) if (B * nW * S * d > 65536)
    for (int64_t bw = 0; bw < B * nW; bw++) {
        int64_t b = bw / nW, w = bw % nW;
        float *o = pooled + bw * d;
        for (int64_t i = 0; i < d; i++) o[i] = 0.0f;
        for (int64_t s = 0; s < S; s++) {
            int64_t ch;
            const float *src = slot_src(kv, b, T, w, s, m, d, overlap, &ch);
            if (!src) continue;
            const float *a = alpha + (bw * S + s) * d;
            for (int64_t i = 0; i < d; i++) o[i] += a[i] * src[ch + i];
        }
    }
    return 0;
}

int ps_cpu_v4_indexer_scores(ps_ctx *ctx, float *scores, const float *iq, const float *ik, const float *w, int64_t B,
                             int64_t T, int64_t nW, int64_t Hi, int64_t Di, float scale) {
    (void)ctx;
#pragma omp parallel for schedule(static) if (B * T * nW * Hi * Di > 65536)
    for (int64_t bt = 0; bt < B * T; bt++) {
        int64_t b = bt / T;
        for (int64_t s = 0; s < nW; s++) {
            const float *k = ik + (b * nW + s) * Di;
            float acc = 0.0f;
            for (int64_t h = 0; h < Hi; h++) {
                float dot = ps_dot(iq + (bt * Hi + h) * Di, k, Di);
                if (dot > 0.0f) acc += w[bt * Hi + h] * (dot * scale);
            }
            scores[bt * nW + s] = acc;
        }
    }
    return 0;
}

/* (value, index) better than the other: larger value, then lower index; NaN ranks lowest. */
static inline int better(float va, int64_t ia, float vb, int64_t ib) {
    if (isnan(va)) return isnan(vb) && ia < ib;
    if (isnan(vb)) return 1;
    return va > vb || (va == vb && ia < ib);
}

int ps_cpu_v4_topk(ps_ctx *ctx, float *idx, float *gap, const float *scores, const float *bias, int64_t n_rows,
                   int64_t n_cols, int64_t K, int64_t rows_per_seq, int64_t m) {
    if (K < 0) return ps_ctx_fail(ctx, "v4_topk: K = %lld", (long long)K);
    int nt = omp_get_max_threads();
    int64_t per = (K + 2) / 2 * 2; /* >= K + 1, even: the int64 indices after the values stay aligned */
    float *ws = ps_ctx_workspace(ctx, (int64_t)nt * per * 3);
    if (!ws) return -1;
#pragma omp parallel for schedule(dynamic, 16) if (n_rows * n_cols > 16384)
    for (int64_t r = 0; r < n_rows; r++) {
        int tid = omp_get_thread_num();
        float *hv = ws + (int64_t)tid * per * 3;           /* heap values */
        int64_t *hi = (int64_t *)(void *)(hv + per);        /* heap indices (2 floats each) */
        int64_t v = m > 0 ? ((r % rows_per_seq) + 1) / m : n_cols;
        if (v > n_cols) v = n_cols;
        int64_t cap = K + 1 < v ? K + 1 : v, n = 0;
        const float *sc = scores + r * n_cols;
        /* a min-heap (worst at the root) of the best `cap` columns */
        for (int64_t c = 0; c < v; c++) {
            float val = sc[c] + (bias ? bias[c] : 0.0f);
            if (n < cap) {
                int64_t i = n++;
                while (i > 0 && better(hv[(i - 1) / 2], hi[(i - 1) / 2], val, c)) {
                    hv[i] = hv[(i - 1) / 2];
                    hi[i] = hi[(i - 1) / 2];
                    i = (i - 1) / 2;
                }
                hv[i] = val;
                hi[i] = c;
            } else if (cap > 0 && better(val, c, hv[0], hi[0])) {
                int64_t i = 0;
                for (;;) {
                    int64_t l = 2 * i + 1, rr = l + 1, w = i;
                    float wv = val;
                    int64_t wi = c;
                    if (l < n && better(wv, wi, hv[l], hi[l])) {
                        w = l;
                        wv = hv[l];
                        wi = hi[l];
                    }
                    if (rr < n && better(wv, wi, hv[rr], hi[rr])) w = rr;
                    if (w == i) break;
                    hv[i] = hv[w];
                    hi[i] = hi[w];
                    i = w;
                }
                hv[i] = val;
                hi[i] = c;
            }
        }
        /* sort best first (n <= K + 1: insertion sort) */
        for (int64_t a = 1; a < n; a++) {
            float tv = hv[a];
            int64_t ti = hi[a], b = a;
            while (b > 0 && better(tv, ti, hv[b - 1], hi[b - 1])) {
                hv[b] = hv[b - 1];
                hi[b] = hi[b - 1];
                b--;
            }
            hv[b] = tv;
            hi[b] = ti;
        }
        int64_t kk = K < v ? K : v;
        for (int64_t j = 0; j < K; j++) idx[r * K + j] = j < kk ? (float)hi[j] : -1.0f;
        if (gap) gap[r] = v > K && K > 0 ? hv[K - 1] - hv[K] : INFINITY;
    }
    return 0;
}

int ps_cpu_v4_router_scores(ps_ctx *ctx, float *scores, const float *logits, int64_t n, int scoring) {
    (void)ctx;
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; i++) {
        double x = logits[i];
        if (scoring == 1) scores[i] = (float)(1.0 / (1.0 + exp(-x)));
        else scores[i] = (float)sqrt(x > 20.0 ? x : log1p(exp(x)));
    }
    return 0;
}

int ps_cpu_v4_route_weights(ps_ctx *ctx, float *weights, const float *scores, const float *idx, int64_t n, int64_t E,
                            int64_t k, float scale) {
    for (int64_t i = 0; i < n * k; i++)
        if (!(idx[i] >= 0 && idx[i] < (float)E) || idx[i] != floorf(idx[i]))
            return ps_ctx_fail(ctx, "v4_route_weights: expert index %g at row %lld is not in [0, %lld)", (double)idx[i],
                               (long long)(i / k), (long long)E);
#pragma omp parallel for schedule(static) if (n * k > 65536)
    for (int64_t r = 0; r < n; r++) {
        const float *ix = idx + r * k;
        double sum = 0;
        for (int64_t j = 0; j < k; j++) {
            int dup = 0;
            for (int64_t i = 0; i < j; i++) dup |= ix[i] == ix[j];
            if (!dup) sum += scores[r * E + (int64_t)ix[j]];
        }
        for (int64_t j = 0; j < k; j++) {
            int dup = 0;
            for (int64_t i = 0; i < j; i++) dup |= ix[i] == ix[j];
            weights[r * k + j] = dup ? 0.0f : (float)(scores[r * E + (int64_t)ix[j]] / (sum + 1e-20) * scale);
        }
    }
    return 0;
}

int ps_cpu_v4_swiglu_clamp(ps_ctx *ctx, float *h, const float *g, const float *u, int64_t n, float limit) {
    (void)ctx;
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; i++) {
        float x = g[i], y = u[i];
        if (limit > 0) {
            x = x < limit ? x : limit;
            y = y < -limit ? -limit : y > limit ? limit : y;
        }
        h[i] = x / (1.0f + expf(-x)) * y;
    }
    return 0;
}

int ps_cpu_v4_scatter_add_rows(ps_ctx *ctx, float *out, const float *in, const int64_t *rows, const float *w, int64_t n,
                               int64_t width) {
    (void)ctx;
    for (int64_t i = 0; i < n; i++) {
        float *o = out + rows[i] * width;
        const float *x = in + i * width;
        float s = w[i];
        for (int64_t e = 0; e < width; e++) o[e] += s * x[e];
    }
    return 0;
}

/* ---- attention ---- */

/* The compressed entries query (b, t) sees: CSA from its top-k row (valid, in range), else 0..n-1. */
static inline int64_t visible_entries(const ps_v4_attn_geom *g, int64_t t) {
    if (g->m <= 0 || g->nW <= 0) return 0;
    int64_t n = (t + 1) / g->m;
    return n < g->nW ? n : g->nW;
}

/* One query row's H heads against its nk keys (K = V rows, key[i]) and the sink: out [H, Dh] the heads,
 * sinkp[h · sink_stride] (sinkp NULL: not written) the sink's probability; sc [nk] scratch. The forward
 * (ps_cpu_v4_attn) and the KV cache (ps_cpu_v4_kv_attend, kv_v4.c) differ only in how they list the keys. */
void ps_cpu_v4_attend_keys(float *out, float *sinkp, int64_t sink_stride, const float *q, const float *const *key, int64_t nk,
                           const float *sink, int64_t H, int64_t Dh, float scale, float *sc) {
    for (int64_t h = 0; h < H; h++) {
        const float *qh = q + h * Dh;
        float mx = sink[h];
        for (int64_t i = 0; i < nk; i++) {
            sc[i] = ps_dot(qh, key[i], Dh) * scale;
            if (sc[i] > mx) mx = sc[i];
        }
        double sum = exp((double)sink[h] - mx);
        for (int64_t i = 0; i < nk; i++) sum += (sc[i] = expf(sc[i] - mx));
        float inv = (float)(1.0 / sum);
        float *o = out + h * Dh;
        for (int64_t d = 0; d < Dh; d++) o[d] = 0.0f;
        for (int64_t i = 0; i < nk; i++) {
            float p = sc[i] * inv;
            const float *k = key[i];
            for (int64_t d = 0; d < Dh; d++) o[d] += p * k[d];
        }
        if (sinkp) sinkp[h * sink_stride] = (float)(exp((double)sink[h] - mx) / sum);
    }
}

int ps_cpu_v4_attn(ps_ctx *ctx, float *out, float *sinkp, const float *q, const float *kv, const float *ckv,
                   const float *topk, const float *sink, const ps_v4_attn_geom *g) {
    int64_t B = g->B, T = g->T, H = g->H, Dh = g->Dh, nW = g->nW, K = g->K, W = g->W;
    int64_t per = ((W < T ? W : T) + (K > 0 ? K : nW) + 2) / 2 * 2; /* even: the pointers stay aligned */
    int nt = omp_get_max_threads();
    float *ws = ps_ctx_workspace(ctx, (int64_t)nt * per * 3);
    if (!ws) return -1;
#pragma omp parallel for schedule(dynamic, 4) if (B * T * H * Dh * per > 65536)
    for (int64_t bt = 0; bt < B * T; bt++) {
        int64_t b = bt / T, t = bt % T;
        float *sc = ws + (int64_t)omp_get_thread_num() * per * 3;
        const float **key = (const float **)(void *)(sc + per); /* per pointers in 2 * per floats */
        int64_t nk = 0, j0 = t - W + 1 < 0 ? 0 : t - W + 1;
        for (int64_t j = j0; j <= t; j++) key[nk++] = kv + (b * T + j) * Dh;
        if (K > 0) {
            for (int64_t i = 0; i < K; i++) {
                float f = topk[bt * K + i];
                if (f >= 0 && f < (float)nW) key[nk++] = ckv + (b * nW + (int64_t)f) * Dh;
            }
        } else {
            int64_t nv = visible_entries(g, t);
            for (int64_t w = 0; w < nv; w++) key[nk++] = ckv + (b * nW + w) * Dh;
        }
        ps_cpu_v4_attend_keys(out + bt * H * Dh, sinkp ? sinkp + b * H * T + t : NULL, T, q + bt * H * Dh, key, nk, sink, H, Dh,
                              g->scale, sc);
    }
    return 0;
}

int ps_cpu_v4_attn_bias(ps_ctx *ctx, float *bias, const float *topk, const ps_v4_attn_geom *g) {
    (void)ctx;
    int64_t B = g->B, T = g->T, nW = g->nW, K = g->K, C = T + nW;
#pragma omp parallel for schedule(static) if (B * T * C > 65536)
    for (int64_t bt = 0; bt < B * T; bt++) {
        int64_t t = bt % T;
        float *row = bias + bt * C;
        for (int64_t j = 0; j < T; j++) row[j] = j <= t && j > t - g->W ? 0.0f : -INFINITY;
        for (int64_t w = 0; w < nW; w++) row[T + w] = -INFINITY;
        if (K > 0) {
            for (int64_t i = 0; i < K; i++) {
                float f = topk[bt * K + i];
                if (f >= 0 && f < (float)nW) row[T + (int64_t)f] = 0.0f;
            }
        } else
            for (int64_t w = 0; w < visible_entries(g, t); w++) row[T + w] = 0.0f;
    }
    return 0;
}

static inline const float *col_key(const ps_v4_attn_geom *g, const float *kv, const float *ckv, int64_t b, int64_t c) {
    return c < g->T ? kv + (b * g->T + c) * g->Dh : ckv + (b * g->nW + (c - g->T)) * g->Dh;
}

int ps_cpu_v4_attn_logits(ps_ctx *ctx, float *logits, const float *q, const float *kv, const float *ckv,
                          const float *bias, const ps_v4_attn_geom *g) {
    (void)ctx;
    int64_t B = g->B, T = g->T, H = g->H, Dh = g->Dh, C = T + g->nW;
#pragma omp parallel for schedule(static) if (B * H * T * C * Dh > 65536)
    for (int64_t r = 0; r < B * H * T; r++) {
        int64_t b = r / (H * T), h = (r / T) % H, t = r % T;
        const float *qh = q + ((b * T + t) * H + h) * Dh, *bi = bias + (b * T + t) * C;
        float *o = logits + r * C;
        for (int64_t c = 0; c < C; c++)
            o[c] = bi[c] == -INFINITY ? -INFINITY : ps_dot(qh, col_key(g, kv, ckv, b, c), Dh) * g->scale + bi[c];
    }
    return 0;
}

int ps_cpu_v4_attn_softmax(ps_ctx *ctx, float *pattern, float *sinkp, const float *logits, const float *sink,
                           const ps_v4_attn_geom *g) {
    (void)ctx;
    int64_t B = g->B, T = g->T, H = g->H, C = T + g->nW;
#pragma omp parallel for schedule(static) if (B * H * T * C > 65536)
    for (int64_t r = 0; r < B * H * T; r++) {
        int64_t h = (r / T) % H;
        const float *x = logits + r * C;
        float *p = pattern + r * C;
        float mx = sink[h];
        for (int64_t c = 0; c < C; c++)
            if (x[c] > mx) mx = x[c];
        double sum = exp((double)sink[h] - mx);
        for (int64_t c = 0; c < C; c++) {
            float e = x[c] == -INFINITY ? 0.0f : expf(x[c] - mx);
            p[c] = e;
            sum += e;
        }
        float inv = (float)(1.0 / sum);
        for (int64_t c = 0; c < C; c++) p[c] *= inv;
        if (sinkp) sinkp[r] = (float)(exp((double)sink[h] - mx) / sum);
    }
    return 0;
}

int ps_cpu_v4_attn_apply(ps_ctx *ctx, float *out, const float *pattern, const float *kv, const float *ckv,
                         const ps_v4_attn_geom *g) {
    (void)ctx;
    int64_t B = g->B, T = g->T, H = g->H, Dh = g->Dh, C = T + g->nW;
#pragma omp parallel for schedule(static) if (B * H * T * C * Dh > 65536)
    for (int64_t r = 0; r < B * H * T; r++) {
        int64_t b = r / (H * T), h = (r / T) % H, t = r % T;
        const float *p = pattern + r * C;
        float *o = out + ((b * T + t) * H + h) * Dh;
        for (int64_t d = 0; d < Dh; d++) o[d] = 0.0f;
        for (int64_t c = 0; c < C; c++) {
            if (p[c] == 0.0f) continue;
            const float *k = col_key(g, kv, ckv, b, c);
            for (int64_t d = 0; d < Dh; d++) o[d] += p[c] * k[d];
        }
    }
    return 0;
}

int ps_cpu_v4_sink_rescale(ps_ctx *ctx, float *out, const float *sink_old, const float *sink_new,
                           const ps_v4_attn_geom *g) {
    (void)ctx;
    int64_t B = g->B, T = g->T, H = g->H, Dh = g->Dh;
#pragma omp parallel for schedule(static) if (B * T * H * Dh > 65536)
    for (int64_t r = 0; r < B * T * H; r++) {
        int64_t b = r / (T * H), t = (r / H) % T, h = r % H, s = (b * H + h) * T + t;
        if (sink_old[s] == sink_new[s]) continue;
        float f = (float)((1.0 - (double)sink_new[s]) / (1.0 - (double)sink_old[s]));
        for (int64_t d = 0; d < Dh; d++) out[r * Dh + d] *= f;
    }
    return 0;
}

int ps_cpu_v4_grouped_linear(ps_ctx *ctx, float *out, const float *inp, const float *w, int64_t M, int64_t G, int64_t Kg,
                             int64_t Ng) {
    (void)ctx;
    if (M == 0 || Ng == 0) return 0;
    for (int64_t gi = 0; gi < G; gi++)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)M, (blasint)Ng, (blasint)Kg, 1.0f, inp + gi * Kg,
                    (blasint)(G * Kg), w + gi * Ng * Kg, (blasint)Kg, 0.0f, out + gi * Ng, (blasint)(G * Ng));
    return 0;
}

int ps_cpu_v4_scale(ps_ctx *ctx, float *x, float s, int64_t n) {
    (void)ctx;
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; i++) x[i] *= s;
    return 0;
}
