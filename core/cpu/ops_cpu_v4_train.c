/* ops_cpu_v4_train.c — CPU implementation of the backward ops of the trainable V4 compressor (core/ops.h,
 * "DeepSeek-V4 backward"): the compressor's slot layout, its per-channel slot softmax and pooling, and
 * the attention with a per-head sink over raw K=V entries and every visible compressed entry.
 *
 * Every output element is accumulated by one thread in a fixed order, so the results do not depend on
 * the thread count. The attention backward recomputes each row's probabilities from q, the keys and the
 * sink (nothing is stored by the forward but its output). */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "core/cpu/cpu.h"

/* The token row and channel offset that slot s of window w reads (CSA: slot s < m is token (w-1)m + s's
 * first half, slot m + s token wm + s's second half; HCA: token wm + s); -1: a dead slot of window 0. */
static inline int64_t slot_token(int64_t w, int64_t s, int64_t m, int64_t d, int overlap, int64_t *ch) {
    if (!overlap) {
        *ch = 0;
        return w * m + s;
    }
    if (s < m) {
        *ch = 0;
        return w == 0 ? -1 : (w - 1) * m + s;
    }
    *ch = d;
    return w * m + (s - m);
}

int ps_cpu_v4_comp_slots_backward(ps_ctx *ctx, float *dz, float *dape, const float *dgate, int64_t B, int64_t T,
                                  int64_t nW, int64_t m, int64_t d, int overlap) {
    (void)ctx;
    int64_t S = overlap ? 2 * m : m, c = overlap ? 2 : 1;
    memset(dz, 0, (size_t)(B * T * c * d) * sizeof(float));
    /* dz: every (token, channel) is read by at most one live slot (CSA: a token's first half by window
     * w + 1, its second half by window w), so each is written once */
#pragma omp parallel for schedule(static) if (B * nW * S * d > 65536)
    for (int64_t bw = 0; bw < B * nW; bw++) {
        int64_t b = bw / nW, w = bw % nW;
        for (int64_t s = 0; s < S; s++) {
            int64_t ch, tok = slot_token(w, s, m, d, overlap, &ch);
            if (tok < 0) continue;
            float *o = dz + (b * T + tok) * c * d + ch;
            const float *g = dgate + (bw * S + s) * d;
            for (int64_t i = 0; i < d; i++) o[i] = g[i];
        }
    }
    /* dape[s % m, half] += sum over sequences and windows, in order */
#pragma omp parallel for schedule(static) if (B * nW * S * d > 65536)
    for (int64_t si = 0; si < S * d; si++) {
        int64_t s = si / d, i = si % d, ch;
        (void)slot_token(0, s, m, d, overlap, &ch);
        double acc = 0;
        for (int64_t bw = 0; bw < B * nW; bw++) {
            if (slot_token(bw % nW, s, m, d, overlap, &ch) < 0) continue;
            acc += dgate[(bw * S + s) * d + i];
        }
        dape[(s % m) * c * d + ch + i] += (float)acc;
    }
    return 0;
}

int ps_cpu_v4_slot_softmax_backward(ps_ctx *ctx, float *dgate, const float *dalpha, const float *alpha, int64_t n_groups,
                                    int64_t S, int64_t d) {
    (void)ctx;
#pragma omp parallel for schedule(static) if (n_groups * S * d > 65536)
    for (int64_t g = 0; g < n_groups; g++) {
        const float *a = alpha + g * S * d, *da = dalpha + g * S * d;
        float *o = dgate + g * S * d;
        for (int64_t i = 0; i < d; i++) {
            double dot = 0;
            for (int64_t s = 0; s < S; s++) dot += (double)a[s * d + i] * da[s * d + i];
            for (int64_t s = 0; s < S; s++) o[s * d + i] = a[s * d + i] == 0.0f ? 0.0f : (float)(a[s * d + i] * (da[s * d + i] - dot));
        }
    }
    return 0;
}

int ps_cpu_v4_comp_pool_backward(ps_ctx *ctx, float *dalpha, float *dkv, const float *dpooled, const float *alpha,
                                 const float *kv, int64_t B, int64_t T, int64_t nW, int64_t m, int64_t d, int overlap) {
    (void)ctx;
    int64_t S = overlap ? 2 * m : m, c = overlap ? 2 : 1;
    memset(dkv, 0, (size_t)(B * T * c * d) * sizeof(float));
#pragma omp parallel for schedule(static) if (B * nW * S * d > 65536)
    for (int64_t bw = 0; bw < B * nW; bw++) {
        int64_t b = bw / nW, w = bw % nW;
        const float *dp = dpooled + bw * d;
        for (int64_t s = 0; s < S; s++) {
            int64_t ch, tok = slot_token(w, s, m, d, overlap, &ch);
            float *da = dalpha + (bw * S + s) * d;
            if (tok < 0) {
                for (int64_t i = 0; i < d; i++) da[i] = 0.0f;
                continue;
            }
            const float *src = kv + (b * T + tok) * c * d + ch, *a = alpha + (bw * S + s) * d;
            float *dk = dkv + (b * T + tok) * c * d + ch;
            for (int64_t i = 0; i < d; i++) {
                da[i] = dp[i] * src[i];
                dk[i] = a[i] * dp[i];
            }
        }
    }
    return 0;
}

/* ---- attention with a sink ---- */

static inline int64_t n_visible(const ps_v4_attn_geom *g, int64_t t) {
    if (g->m <= 0 || g->nW <= 0) return 0;
    int64_t n = (t + 1) / g->m;
    return n < g->nW ? n : g->nW;
}

int ps_cpu_v4_attn_backward(ps_ctx *ctx, float *dq, float *dkv, float *dckv, float *dsink, const float *dout,
                            const float *out, const float *q, const float *kv, const float *ckv, const float *sink,
                            const ps_v4_attn_geom *g) {
    int64_t B = g->B, T = g->T, H = g->H, Dh = g->Dh, nW = g->nW, W = g->W;
    if (g->K > 0) return ps_ctx_fail(ctx, "v4_attn_backward: the indexer's selection (K = %lld) has no backward", (long long)g->K);
    int64_t rows = B * T * H, per = (W < T ? W : T) + nW + 2;
    int nt = omp_get_max_threads();
    /* workspace: lse, D = dout·out and the sink term of every row, then per-thread scores */
    float *ws = ps_ctx_workspace(ctx, 3 * rows + (int64_t)nt * per);
    if (!ws) return -1;
    float *lse = ws, *Dr = ws + rows, *es = ws + 2 * rows;
    /* pass 1, per row (b, t, h): the log-sum-exp, D, dq and the row's share of dsink */
#pragma omp parallel for schedule(dynamic, 4) if (rows * per * Dh > 65536)
    for (int64_t bt = 0; bt < B * T; bt++) {
        int64_t b = bt / T, t = bt % T, j0 = t - W + 1 < 0 ? 0 : t - W + 1, nv = n_visible(g, t);
        float *sc = ws + 3 * rows + (int64_t)omp_get_thread_num() * per;
        for (int64_t h = 0; h < H; h++) {
            int64_t r = bt * H + h;
            const float *qh = q + r * Dh, *dh = dout + r * Dh;
            int64_t nk = 0;
            float mx = sink[h];
            for (int64_t j = j0; j <= t; j++) {
                sc[nk] = ps_dot(qh, kv + (b * T + j) * Dh, Dh) * g->scale;
                if (sc[nk] > mx) mx = sc[nk];
                nk++;
            }
            for (int64_t w = 0; w < nv; w++) {
                sc[nk] = ps_dot(qh, ckv + (b * nW + w) * Dh, Dh) * g->scale;
                if (sc[nk] > mx) mx = sc[nk];
                nk++;
            }
            double sum = exp((double)sink[h] - mx);
            for (int64_t i = 0; i < nk; i++) sum += exp((double)sc[i] - mx);
            float L = (float)((double)mx + log(sum));
            float D = ps_dot(dh, out + r * Dh, Dh);
            lse[r] = L;
            Dr[r] = D;
            es[r] = -(float)(exp((double)sink[h] - L)) * D;
            float *o = dq + r * Dh;
            for (int64_t e = 0; e < Dh; e++) o[e] = 0.0f;
            for (int64_t i = 0; i < nk; i++) {
                const float *k = i < t - j0 + 1 ? kv + (b * T + j0 + i) * Dh : ckv + (b * nW + (i - (t - j0 + 1))) * Dh;
                float p = expf(sc[i] - L), ds = p * (ps_dot(dh, k, Dh) - D) * g->scale;
                for (int64_t e = 0; e < Dh; e++) o[e] += ds * k[e];
            }
        }
    }
    /* pass 2a, per raw key (b, j): the queries t in [j, j + W) that see it, all heads */
#pragma omp parallel for schedule(dynamic, 4) if (rows * per * Dh > 65536)
    for (int64_t bj = 0; bj < B * T; bj++) {
        int64_t b = bj / T, j = bj % T, t1 = j + W - 1 < T - 1 ? j + W - 1 : T - 1;
        const float *k = kv + bj * Dh;
        float *o = dkv + bj * Dh;
        for (int64_t t = j; t <= t1; t++)
            for (int64_t h = 0; h < H; h++) {
                int64_t r = (b * T + t) * H + h;
                const float *qh = q + r * Dh, *dh = dout + r * Dh;
                float p = expf(ps_dot(qh, k, Dh) * g->scale - lse[r]);
                float ds = p * (ps_dot(dh, k, Dh) - Dr[r]) * g->scale;
                for (int64_t e = 0; e < Dh; e++) o[e] += ds * qh[e] + p * dh[e];
            }
    }
    /* pass 2b, per compressed entry (b, w): the queries t >= (w + 1)m - 1 */
    if (nW > 0 && dckv)
#pragma omp parallel for schedule(dynamic, 1) if (rows * per * Dh > 65536)
        for (int64_t bw = 0; bw < B * nW; bw++) {
            int64_t b = bw / nW, w = bw % nW, t0 = (w + 1) * g->m - 1;
            const float *k = ckv + bw * Dh;
            float *o = dckv + bw * Dh;
            for (int64_t t = t0; t < T; t++) {
                if (n_visible(g, t) <= w) continue;
                for (int64_t h = 0; h < H; h++) {
                    int64_t r = (b * T + t) * H + h;
                    const float *qh = q + r * Dh, *dh = dout + r * Dh;
                    float p = expf(ps_dot(qh, k, Dh) * g->scale - lse[r]);
                    float ds = p * (ps_dot(dh, k, Dh) - Dr[r]) * g->scale;
                    for (int64_t e = 0; e < Dh; e++) o[e] += ds * qh[e] + p * dh[e];
                }
            }
        }
    /* dsink[h]: the rows' shares in row order */
    if (dsink)
        for (int64_t h = 0; h < H; h++) {
            double acc = 0;
            for (int64_t bt = 0; bt < B * T; bt++) acc += es[bt * H + h];
            dsink[h] += (float)acc;
        }
    return 0;
}
