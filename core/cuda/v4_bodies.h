/* v4_bodies.h — the arithmetic of the CUDA backend's DeepSeek-V4 ops (core/cuda/v4.cu), one output
 * element or one independent row per call, in a header that is both C11 and CUDA C++: the kernels of
 * v4.cu call these bodies from a grid-stride loop, and tests/test_cuda_v4_bodies.c calls the same bodies
 * from a plain host loop over the same index space and compares them with the CPU backend
 * (core/cpu/ops_cpu_v4.c, ops_cpu_v4_train.c), so the index math of every kernel is checked without a GPU.
 *
 * Each body loops sequentially in the CPU reference's order (dot products with ps_dot's 16 interleaved
 * partial sums, ps_dot_d's 8 in double), so on the host a body gives the CPU's numbers; on the device
 * expf/exp and fused multiply-adds may change the last bits. Naive by design (correctness first): the
 * row bodies (softmax rows, top-k rows, attention query rows, mHC rows) run one thread per row.
 * Not a public header. Semantics: core/ops.h. */
#ifndef PS_V4_BODIES_H
#define PS_V4_BODIES_H

#include <math.h>
#include <stdint.h>

#include "core/backend.h"

#include "core/hd_math.h"

/* ---------------- rope ---------------- */

/* element e of [n_pos, half] */
static inline PS_HD void ps_v4b_rope_table(float *cos_t, float *sin_t, const double *inv_freq, int64_t half, float mscale,
                                           int64_t e) {
    int64_t p = e / half, i = e % half;
    double a = (double)p * inv_freq[i];
    cos_t[e] = (float)(cos(a) * (double)mscale);
    sin_t[e] = (float)(sin(a) * (double)mscale);
}

/* pair e of [n_seq · rows_per_seq, n_heads, rd / 2] (in place) */
static inline PS_HD void ps_v4b_rope(float *x, const float *cos_t, const float *sin_t, int64_t rows_per_seq,
                                     int64_t n_heads, int64_t hd, int64_t rd, int64_t pos_step, int inverse, int64_t e) {
    int64_t half = rd / 2, i = e % half, rh = e / half, h = rh % n_heads, r = rh / n_heads;
    int64_t pos = (r % rows_per_seq) * pos_step;
    float dir = inverse ? -1.0f : 1.0f, c = cos_t[pos * half + i], sn = dir * sin_t[pos * half + i];
    float *v = x + (r * n_heads + h) * hd + (hd - rd);
    float a = v[2 * i], b = v[2 * i + 1];
    v[2 * i] = a * c - b * sn;
    v[2 * i + 1] = b * c + a * sn;
}

/* ---------------- mHC ---------------- */

static inline PS_HD double ps_v4b_sigmoid_d(double x) { return 1.0 / (1.0 + exp(-x)); }

/* row r of n; cm: N·N doubles of scratch for this row (unused in the head form, post = comb = NULL) */
static inline PS_HD void ps_v4b_hc_weights_row(float *pre, float *post, float *comb, const float *mix, const float *x,
                                               const float *scale, const float *base, int64_t N, int64_t D,
                                               int64_t iters, float hc_eps, float norm_eps, double *cm, int64_t r) {
    int head = post == NULL;
    int64_t width = head ? N : (2 + N) * N;
    double rs = 1.0 / sqrt(ps_dot_d(x + r * N * D, x + r * N * D, N * D) / (double)(N * D) + (double)norm_eps);
    const float *mx = mix + r * width;
    double eps = hc_eps;
    for (int64_t j = 0; j < N; j++) pre[r * N + j] = (float)(ps_v4b_sigmoid_d((double)mx[j] * rs * scale[0] + base[j]) + eps);
    if (head) return;
    for (int64_t j = 0; j < N; j++)
        post[r * N + j] = (float)(2.0 * ps_v4b_sigmoid_d((double)mx[N + j] * rs * scale[1] + base[N + j]));
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

/* element e of out [n, D] */
static inline PS_HD void ps_v4b_hc_collapse(float *out, const float *pre, const float *h, int64_t N, int64_t D, int64_t e) {
    int64_t r = e / D, d = e % D;
    float o = 0.0f;
    for (int64_t j = 0; j < N; j++) o += pre[r * N + j] * h[(r * N + j) * D + d];
    out[e] = o;
}

/* element e of hout [n, N, D] */
static inline PS_HD void ps_v4b_hc_expand(float *hout, const float *post, const float *comb, const float *blk, const float *h,
                                          int64_t N, int64_t D, int64_t e) {
    int64_t d = e % D, rk = e / D, k = rk % N, r = rk / N;
    float o = post[r * N + k] * blk[r * D + d];
    for (int64_t j = 0; j < N; j++) o += comb[(r * N + j) * N + k] * h[(r * N + j) * D + d];
    hout[e] = o;
}

/* ---------------- compressor ---------------- */

/* The token that slot s of window w reads and its channel offset (CSA: slot s < m is token (w-1)m + s's
 * first half, slot m + s token wm + s's second half; HCA: token wm + s); -1: a dead slot of window 0. */
static inline PS_HD int64_t ps_v4b_slot_token(int64_t w, int64_t s, int64_t m, int64_t d, int overlap, int64_t *ch) {
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

/* The inverse: the live slot (window *w, slot *s) that reads channel chan (of c·d) of token tok, 0 when
 * none does (a token past the last window, or CSA's first half of a token of the last window). */
static inline PS_HD int ps_v4b_slot_of(int64_t tok, int64_t chan, int64_t nW, int64_t m, int64_t d, int overlap,
                                       int64_t *w, int64_t *s) {
    if (m <= 0) return 0;
    if (!overlap) {
        *w = tok / m;
        *s = tok % m;
    } else if (chan < d) {
        *w = tok / m + 1;
        *s = tok % m;
    } else {
        *w = tok / m;
        *s = m + tok % m;
    }
    return *w < nW;
}

/* element e of gate [B, nW, S, d] */
static inline PS_HD void ps_v4b_comp_slots(float *gate, const float *z, const float *ape, int64_t T, int64_t nW, int64_t m,
                                           int64_t d, int overlap, int64_t e) {
    int64_t S = overlap ? 2 * m : m, c = overlap ? 2 : 1;
    int64_t i = e % d, bws = e / d, s = bws % S, bw = bws / S, b = bw / nW, w = bw % nW, ch;
    int64_t tok = ps_v4b_slot_token(w, s, m, d, overlap, &ch);
    gate[e] = tok < 0 ? -INFINITY : z[(b * T + tok) * c * d + ch + i] + ape[(s % m) * c * d + ch + i];
}

/* column e of [n_groups, d]: the softmax over the S slots */
static inline PS_HD void ps_v4b_slot_softmax_col(float *alpha, const float *gate, int64_t S, int64_t d, int64_t e) {
    int64_t g = e / d, i = e % d;
    const float *z = gate + g * S * d;
    float *a = alpha + g * S * d;
    float mx = -INFINITY;
    for (int64_t s = 0; s < S; s++)
        if (z[s * d + i] > mx) mx = z[s * d + i];
    if (mx == -INFINITY || isnan(mx)) {
        for (int64_t s = 0; s < S; s++) a[s * d + i] = mx == -INFINITY ? 0.0f : NAN;
        return;
    }
    double sum = 0;
    for (int64_t s = 0; s < S; s++) {
        float ex = expf(z[s * d + i] - mx);
        a[s * d + i] = ex;
        sum += ex;
    }
    float inv = (float)(1.0 / sum);
    for (int64_t s = 0; s < S; s++) a[s * d + i] *= inv;
}

/* element e of pooled [B, nW, d] */
static inline PS_HD void ps_v4b_comp_pool(float *pooled, const float *alpha, const float *kv, int64_t T, int64_t nW,
                                          int64_t m, int64_t d, int overlap, int64_t e) {
    int64_t S = overlap ? 2 * m : m, c = overlap ? 2 : 1;
    int64_t i = e % d, bw = e / d, b = bw / nW, w = bw % nW;
    float o = 0.0f;
    for (int64_t s = 0; s < S; s++) {
        int64_t ch, tok = ps_v4b_slot_token(w, s, m, d, overlap, &ch);
        if (tok < 0) continue;
        o += alpha[(bw * S + s) * d + i] * kv[(b * T + tok) * c * d + ch + i];
    }
    pooled[e] = o;
}

/* ---------------- indexer, top-k, routing ---------------- */

/* element e of scores [B, T, nW] */
static inline PS_HD void ps_v4b_indexer_scores(float *scores, const float *iq, const float *ik, const float *w, int64_t T,
                                               int64_t nW, int64_t Hi, int64_t Di, float scale, int64_t e) {
    int64_t s = e % nW, bt = e / nW, b = bt / T;
    const float *k = ik + (b * nW + s) * Di;
    float acc = 0.0f;
    for (int64_t h = 0; h < Hi; h++) {
        float dot = ps_dot(iq + (bt * Hi + h) * Di, k, Di);
        if (dot > 0.0f) acc += w[bt * Hi + h] * (dot * scale);
    }
    scores[e] = acc;
}

/* (value, index) better than the other: larger value, then lower index; NaN ranks lowest (a strict total
 * order over distinct indices). */
static inline PS_HD int ps_v4b_better(float va, int64_t ia, float vb, int64_t ib) {
    if (isnan(va)) return isnan(vb) && ia < ib;
    if (isnan(vb)) return 1;
    return va > vb || (va == vb && ia < ib);
}

/* row r of scores [n_rows, n_cols]: the K best visible columns best first, and the gap. Without scratch:
 * pick j is the best column worse than pick j - 1 (O((K + 1) · visible) per row). */
static inline PS_HD void ps_v4b_topk_row(float *idx, float *gap, const float *scores, const float *bias, int64_t n_cols,
                                         int64_t K, int64_t rows_per_seq, int64_t m, int64_t r) {
    int64_t v = m > 0 ? ((r % rows_per_seq) + 1) / m : n_cols;
    if (v > n_cols) v = n_cols;
    int64_t cap = K + 1 < v ? K + 1 : v, kk = K < v ? K : v, pi = -1;
    const float *sc = scores + r * n_cols;
    float pv = 0.0f, kth = 0.0f, next = 0.0f;
    for (int64_t j = 0; j < cap; j++) {
        int64_t bi = -1;
        float bv = 0.0f;
        for (int64_t c = 0; c < v; c++) {
            float val = sc[c] + (bias ? bias[c] : 0.0f);
            if (pi >= 0 && !ps_v4b_better(pv, pi, val, c)) continue;
            if (bi < 0 || ps_v4b_better(val, c, bv, bi)) {
                bv = val;
                bi = c;
            }
        }
        if (j < K) idx[r * K + j] = (float)bi;
        if (j == K - 1) kth = bv;
        if (j == K) next = bv;
        pv = bv;
        pi = bi;
    }
    for (int64_t j = kk; j < K; j++) idx[r * K + j] = -1.0f;
    if (gap) gap[r] = v > K && K > 0 ? kth - next : INFINITY;
}

/* element e of scores [n] */
static inline PS_HD void ps_v4b_router_scores(float *scores, const float *logits, int scoring, int64_t e) {
    double x = logits[e];
    if (scoring == 1) scores[e] = (float)(1.0 / (1.0 + exp(-x)));
    else scores[e] = (float)sqrt(x > 20.0 ? x : log1p(exp(x)));
}

/* row r of weights [n, k] (the indices were checked on the host: in [0, E), whole) */
static inline PS_HD void ps_v4b_route_weights_row(float *weights, const float *scores, const float *idx, int64_t E, int64_t k,
                                                  float scale, int64_t r) {
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

/* element e of h [n] */
static inline PS_HD void ps_v4b_swiglu_clamp(float *h, const float *g, const float *u, float limit, int64_t e) {
    float x = g[e], y = u[e];
    if (limit > 0) {
        x = x < limit ? x : limit;
        y = y < -limit ? -limit : y > limit ? limit : y;
    }
    h[e] = x / (1.0f + expf(-x)) * y;
}

/* element e of [n_groups, width]: destination row group g = e / width (its sources order[off[g] ..
 * off[g + 1]), ascending i, all with the same rows[i]), channel e % width; out[rows[i], :] += w[i] · in[i, :]
 * in the order of i, as the CPU's serial loop (grouping: ps_v4b_group_rows). */
static inline PS_HD void ps_v4b_scatter_add(float *out, const float *in, const int64_t *rows, const float *w,
                                            const int64_t *order, const int64_t *off, int64_t width, int64_t e) {
    int64_t g = e / width, x = e % width;
    for (int64_t q = off[g]; q < off[g + 1]; q++) {
        int64_t i = order[q];
        out[rows[i] * width + x] += w[i] * in[i * width + x];
    }
}

/* Host only: group the n sources by destination row in one buffer of 3n + 1 int64 (the launcher stages
 * its first n + ng + 1): order [n] the sources sorted by (row, i), then off [ng + 1] the group starts,
 * then n of scratch (a merge sort over (row, i) keys: insertion would be O(n²)). Returns ng. */
static inline int64_t ps_v4b_group_rows(const int64_t *rows, int64_t n, int64_t *buf) {
    int64_t *order = buf, *off = buf + n, *tmp = buf + 2 * n + 1;
    for (int64_t i = 0; i < n; i++) order[i] = i;
    for (int64_t wd = 1; wd < n; wd *= 2) {
        for (int64_t lo = 0; lo < n; lo += 2 * wd) {
            int64_t mid = lo + wd < n ? lo + wd : n, hi = lo + 2 * wd < n ? lo + 2 * wd : n, a = lo, b = mid, o = lo;
            while (a < mid || b < hi) {
                if (b >= hi || (a < mid && rows[order[a]] <= rows[order[b]])) tmp[o++] = order[a++];
                else tmp[o++] = order[b++];
            }
        }
        for (int64_t i = 0; i < n; i++) order[i] = tmp[i];
    }
    int64_t ng = 0;
    for (int64_t q = 0; q < n; q++)
        if (q == 0 || rows[order[q]] != rows[order[q - 1]]) off[ng++] = q;
    off[ng] = n;
    return ng;
}

/* ---------------- attention ---------------- */

/* Compressed entries query t sees without a selection: min(nW, (t + 1) / m); 0 for a sliding layer. */
static inline PS_HD int64_t ps_v4b_visible(const ps_v4_attn_geom *g, int64_t t) {
    if (g->m <= 0 || g->nW <= 0) return 0;
    int64_t n = (t + 1) / g->m;
    return n < g->nW ? n : g->nW;
}

/* Entry i of query (b, t)'s key list: the raw window j0..t first (n_raw of them), then the selected
 * compressed entries in top-k order (NULL: an empty or out-of-range slot) or the visible ones in order. */
static inline PS_HD const float *ps_v4b_attn_key(const ps_v4_attn_geom *g, const float *kv, const float *ckv,
                                                 const float *topk, int64_t b, int64_t bt, int64_t j0, int64_t n_raw,
                                                 int64_t i) {
    if (i < n_raw) return kv + (b * g->T + j0 + i) * g->Dh;
    i -= n_raw;
    if (g->K > 0) {
        float f = topk[bt * g->K + i];
        return f >= 0 && f < (float)g->nW ? ckv + (b * g->nW + (int64_t)f) * g->Dh : (const float *)0;
    }
    return ckv + (b * g->nW + i) * g->Dh;
}

/* query row e of [B, T, H]: out [B, T, H, Dh] and sinkp [B, H, T] (may be NULL); three passes over the
 * keys (max, sum, output) recompute each logit instead of storing it (identical floats each time). */
static inline PS_HD void ps_v4b_attn_row(float *out, float *sinkp, const float *q, const float *kv, const float *ckv,
                                         const float *topk, const float *sink, const ps_v4_attn_geom *g, int64_t e) {
    int64_t H = g->H, T = g->T, Dh = g->Dh, bt = e / H, h = e % H, b = bt / T, t = bt % T;
    int64_t j0 = t - g->W + 1 < 0 ? 0 : t - g->W + 1, n_raw = t - j0 + 1;
    int64_t nk = n_raw + (g->K > 0 ? g->K : ps_v4b_visible(g, t));
    const float *qh = q + e * Dh;
    float mx = sink[h];
    for (int64_t i = 0; i < nk; i++) {
        const float *k = ps_v4b_attn_key(g, kv, ckv, topk, b, bt, j0, n_raw, i);
        if (!k) continue;
        float s = ps_dot(qh, k, Dh) * g->scale;
        if (s > mx) mx = s;
    }
    double sum = exp((double)sink[h] - mx);
    for (int64_t i = 0; i < nk; i++) {
        const float *k = ps_v4b_attn_key(g, kv, ckv, topk, b, bt, j0, n_raw, i);
        if (!k) continue;
        sum += expf(ps_dot(qh, k, Dh) * g->scale - mx);
    }
    float inv = (float)(1.0 / sum);
    float *o = out + e * Dh;
    for (int64_t d = 0; d < Dh; d++) o[d] = 0.0f;
    for (int64_t i = 0; i < nk; i++) {
        const float *k = ps_v4b_attn_key(g, kv, ckv, topk, b, bt, j0, n_raw, i);
        if (!k) continue;
        float p = expf(ps_dot(qh, k, Dh) * g->scale - mx) * inv;
        for (int64_t d = 0; d < Dh; d++) o[d] += p * k[d];
    }
    if (sinkp) sinkp[(b * H + h) * T + t] = (float)(exp((double)sink[h] - mx) / sum);
}

/* element e of bias [B, T, T + nW] */
static inline PS_HD void ps_v4b_attn_bias(float *bias, const float *topk, const ps_v4_attn_geom *g, int64_t e) {
    int64_t T = g->T, C = T + g->nW, bt = e / C, c = e % C, t = bt % T;
    if (c < T) {
        bias[e] = c <= t && c > t - g->W ? 0.0f : -INFINITY;
        return;
    }
    int64_t w = c - T;
    int vis = 0;
    if (g->K > 0) {
        for (int64_t i = 0; i < g->K; i++) {
            float f = topk[bt * g->K + i];
            if (f >= 0 && f < (float)g->nW && (int64_t)f == w) vis = 1;
        }
    } else
        vis = w < ps_v4b_visible(g, t);
    bias[e] = vis ? 0.0f : -INFINITY;
}

/* column c of [B, T + nW]'s keys: raw rows first, then the compressed entries */
static inline PS_HD const float *ps_v4b_col_key(const ps_v4_attn_geom *g, const float *kv, const float *ckv, int64_t b,
                                                int64_t c) {
    return c < g->T ? kv + (b * g->T + c) * g->Dh : ckv + (b * g->nW + (c - g->T)) * g->Dh;
}

/* element e of logits [B, H, T, T + nW] */
static inline PS_HD void ps_v4b_attn_logits(float *logits, const float *q, const float *kv, const float *ckv,
                                            const float *bias, const ps_v4_attn_geom *g, int64_t e) {
    int64_t H = g->H, T = g->T, C = T + g->nW, r = e / C, c = e % C, b = r / (H * T), h = (r / T) % H, t = r % T;
    float bi = bias[(b * T + t) * C + c];
    logits[e] = bi == -INFINITY ? -INFINITY
                                : ps_dot(q + ((b * T + t) * H + h) * g->Dh, ps_v4b_col_key(g, kv, ckv, b, c), g->Dh) *
                                          g->scale +
                                      bi;
}

/* row r of [B, H, T]: pattern (may alias logits) and sinkp (may be NULL) */
static inline PS_HD void ps_v4b_attn_softmax_row(float *pattern, float *sinkp, const float *logits, const float *sink,
                                                 const ps_v4_attn_geom *g, int64_t r) {
    int64_t C = g->T + g->nW, h = (r / g->T) % g->H;
    const float *x = logits + r * C;
    float *p = pattern + r * C;
    float mx = sink[h];
    for (int64_t c = 0; c < C; c++)
        if (x[c] > mx) mx = x[c];
    double sum = exp((double)sink[h] - mx);
    for (int64_t c = 0; c < C; c++) {
        float ex = x[c] == -INFINITY ? 0.0f : expf(x[c] - mx);
        p[c] = ex;
        sum += ex;
    }
    float inv = (float)(1.0 / sum);
    for (int64_t c = 0; c < C; c++) p[c] *= inv;
    if (sinkp) sinkp[r] = (float)(exp((double)sink[h] - mx) / sum);
}

/* element e of [B, H, T, Dh] (written to out [B, T, H, Dh]) */
static inline PS_HD void ps_v4b_attn_apply(float *out, const float *pattern, const float *kv, const float *ckv,
                                           const ps_v4_attn_geom *g, int64_t e) {
    int64_t H = g->H, T = g->T, Dh = g->Dh, C = T + g->nW, r = e / Dh, d = e % Dh, b = r / (H * T), h = (r / T) % H,
            t = r % T;
    const float *p = pattern + r * C;
    float o = 0.0f;
    for (int64_t c = 0; c < C; c++) {
        if (p[c] == 0.0f) continue;
        o += p[c] * ps_v4b_col_key(g, kv, ckv, b, c)[d];
    }
    out[((b * T + t) * H + h) * Dh + d] = o;
}

/* element e of out [B, T, H, Dh] */
static inline PS_HD void ps_v4b_sink_rescale(float *out, const float *sink_old, const float *sink_new,
                                             const ps_v4_attn_geom *g, int64_t e) {
    int64_t H = g->H, T = g->T, r = e / g->Dh, b = r / (T * H), t = (r / H) % T, h = r % H, s = (b * H + h) * T + t;
    if (sink_old[s] == sink_new[s]) return;
    float f = (float)((1.0 - (double)sink_new[s]) / (1.0 - (double)sink_old[s]));
    out[e] *= f;
}

/* element e of out [M, G·Ng] */
static inline PS_HD void ps_v4b_grouped_linear(float *out, const float *inp, const float *w, int64_t G, int64_t Kg,
                                               int64_t Ng, int64_t e) {
    int64_t row = e / (G * Ng), col = e % (G * Ng), gi = col / Ng;
    out[e] = ps_dot(inp + row * G * Kg + gi * Kg, w + col * Kg, Kg);
}

/* element e of x [n] (in place) */
static inline PS_HD void ps_v4b_scale(float *x, float s, int64_t e) { x[e] *= s; }

/* ---------------- backward of the trainable compressor ---------------- */

/* element e of dz [B, T, c·d] (=) */
static inline PS_HD void ps_v4b_comp_slots_bwd_dz(float *dz, const float *dgate, int64_t T, int64_t nW, int64_t m, int64_t d,
                                                  int overlap, int64_t e) {
    int64_t S = overlap ? 2 * m : m, cd = (overlap ? 2 : 1) * d, chan = e % cd, bt = e / cd, b = bt / T, tok = bt % T, w, s;
    dz[e] = ps_v4b_slot_of(tok, chan, nW, m, d, overlap, &w, &s) ? dgate[((b * nW + w) * S + s) * d + chan % d] : 0.0f;
}

/* element e of [S, d]: dape[s % m, half, i] += the live slots' sum over sequences and windows, in order */
static inline PS_HD void ps_v4b_comp_slots_bwd_dape(float *dape, const float *dgate, int64_t B, int64_t nW, int64_t m,
                                                    int64_t d, int overlap, int64_t e) {
    int64_t S = overlap ? 2 * m : m, c = overlap ? 2 : 1, s = e / d, i = e % d, ch;
    (void)ps_v4b_slot_token(0, s, m, d, overlap, &ch);
    double acc = 0;
    for (int64_t bw = 0; bw < B * nW; bw++) {
        if (ps_v4b_slot_token(bw % nW, s, m, d, overlap, &ch) < 0) continue;
        acc += dgate[(bw * S + s) * d + i];
    }
    dape[(s % m) * c * d + ch + i] += (float)acc;
}

/* column e of [n_groups, d] */
static inline PS_HD void ps_v4b_slot_softmax_bwd_col(float *dgate, const float *dalpha, const float *alpha, int64_t S,
                                                     int64_t d, int64_t e) {
    int64_t g = e / d, i = e % d;
    const float *a = alpha + g * S * d, *da = dalpha + g * S * d;
    float *o = dgate + g * S * d;
    double dot = 0;
    for (int64_t s = 0; s < S; s++) dot += (double)a[s * d + i] * da[s * d + i];
    for (int64_t s = 0; s < S; s++)
        o[s * d + i] = a[s * d + i] == 0.0f ? 0.0f : (float)(a[s * d + i] * (da[s * d + i] - dot));
}

/* element e of dalpha [B, nW, S, d] (=) */
static inline PS_HD void ps_v4b_comp_pool_bwd_dalpha(float *dalpha, const float *dpooled, const float *kv, int64_t T,
                                                     int64_t nW, int64_t m, int64_t d, int overlap, int64_t e) {
    int64_t S = overlap ? 2 * m : m, c = overlap ? 2 : 1, i = e % d, bws = e / d, s = bws % S, bw = bws / S, b = bw / nW,
            w = bw % nW, ch, tok = ps_v4b_slot_token(w, s, m, d, overlap, &ch);
    dalpha[e] = tok < 0 ? 0.0f : dpooled[bw * d + i] * kv[(b * T + tok) * c * d + ch + i];
}

/* element e of dkv [B, T, c·d] (=) */
static inline PS_HD void ps_v4b_comp_pool_bwd_dkv(float *dkv, const float *dpooled, const float *alpha, int64_t T, int64_t nW,
                                                  int64_t m, int64_t d, int overlap, int64_t e) {
    int64_t S = overlap ? 2 * m : m, cd = (overlap ? 2 : 1) * d, chan = e % cd, bt = e / cd, b = bt / T, tok = bt % T, w, s;
    if (!ps_v4b_slot_of(tok, chan, nW, m, d, overlap, &w, &s)) {
        dkv[e] = 0.0f;
        return;
    }
    int64_t bw = b * nW + w, i = chan % d;
    dkv[e] = alpha[(bw * S + s) * d + i] * dpooled[bw * d + i];
}

/* ---------------- backward of the attention with a sink (g->K = 0) ---------------- */

/* pass 1, row e of [B, T, H]: lse, D = dout·out and the row's sink term es (scratch [B·T·H] each), dq (=) */
static inline PS_HD void ps_v4b_attn_bwd_row(float *dq, float *lse, float *Dr, float *es, const float *dout, const float *out,
                                             const float *q, const float *kv, const float *ckv, const float *sink,
                                             const ps_v4_attn_geom *g, int64_t e) {
    int64_t H = g->H, T = g->T, Dh = g->Dh, bt = e / H, h = e % H, b = bt / T, t = bt % T;
    int64_t j0 = t - g->W + 1 < 0 ? 0 : t - g->W + 1, n_raw = t - j0 + 1, nk = n_raw + ps_v4b_visible(g, t);
    const float *qh = q + e * Dh, *dh = dout + e * Dh;
    float mx = sink[h];
    for (int64_t i = 0; i < nk; i++) {
        float s = ps_dot(qh, ps_v4b_attn_key(g, kv, ckv, (const float *)0, b, bt, j0, n_raw, i), Dh) * g->scale;
        if (s > mx) mx = s;
    }
    double sum = exp((double)sink[h] - mx);
    for (int64_t i = 0; i < nk; i++) {
        float s = ps_dot(qh, ps_v4b_attn_key(g, kv, ckv, (const float *)0, b, bt, j0, n_raw, i), Dh) * g->scale;
        sum += exp((double)s - mx);
    }
    float L = (float)((double)mx + log(sum));
    float D = ps_dot(dh, out + e * Dh, Dh);
    lse[e] = L;
    Dr[e] = D;
    es[e] = -(float)(exp((double)sink[h] - L)) * D;
    float *o = dq + e * Dh;
    for (int64_t x = 0; x < Dh; x++) o[x] = 0.0f;
    for (int64_t i = 0; i < nk; i++) {
        const float *k = ps_v4b_attn_key(g, kv, ckv, (const float *)0, b, bt, j0, n_raw, i);
        float s = ps_dot(qh, k, Dh) * g->scale;
        float p = expf(s - L), ds = p * (ps_dot(dh, k, Dh) - D) * g->scale;
        for (int64_t x = 0; x < Dh; x++) o[x] += ds * k[x];
    }
}

/* pass 2a, raw key row e of [B, T]: dkv (+=) over the queries t in [j, j + W) that see it, all heads */
static inline PS_HD void ps_v4b_attn_bwd_dkv_row(float *dkv, const float *lse, const float *Dr, const float *dout,
                                                 const float *q, const float *kv, const ps_v4_attn_geom *g, int64_t e) {
    int64_t H = g->H, T = g->T, Dh = g->Dh, b = e / T, j = e % T, t1 = j + g->W - 1 < T - 1 ? j + g->W - 1 : T - 1;
    const float *k = kv + e * Dh;
    float *o = dkv + e * Dh;
    for (int64_t t = j; t <= t1; t++)
        for (int64_t h = 0; h < H; h++) {
            int64_t r = (b * T + t) * H + h;
            const float *qh = q + r * Dh, *dh = dout + r * Dh;
            float p = expf(ps_dot(qh, k, Dh) * g->scale - lse[r]);
            float ds = p * (ps_dot(dh, k, Dh) - Dr[r]) * g->scale;
            for (int64_t x = 0; x < Dh; x++) o[x] += ds * qh[x] + p * dh[x];
        }
}

/* pass 2b, compressed entry row e of [B, nW]: dckv (+=) over the queries that see it */
static inline PS_HD void ps_v4b_attn_bwd_dckv_row(float *dckv, const float *lse, const float *Dr, const float *dout,
                                                  const float *q, const float *ckv, const ps_v4_attn_geom *g, int64_t e) {
    int64_t H = g->H, T = g->T, Dh = g->Dh, b = e / g->nW, w = e % g->nW, t0 = (w + 1) * g->m - 1;
    const float *k = ckv + e * Dh;
    float *o = dckv + e * Dh;
    for (int64_t t = t0; t < T; t++) {
        if (ps_v4b_visible(g, t) <= w) continue;
        for (int64_t h = 0; h < H; h++) {
            int64_t r = (b * T + t) * H + h;
            const float *qh = q + r * Dh, *dh = dout + r * Dh;
            float p = expf(ps_dot(qh, k, Dh) * g->scale - lse[r]);
            float ds = p * (ps_dot(dh, k, Dh) - Dr[r]) * g->scale;
            for (int64_t x = 0; x < Dh; x++) o[x] += ds * qh[x] + p * dh[x];
        }
    }
}

/* head h: dsink[h] += the rows' sink terms in row order */
static inline PS_HD void ps_v4b_attn_bwd_dsink(float *dsink, const float *es, const ps_v4_attn_geom *g, int64_t h) {
    double acc = 0;
    for (int64_t bt = 0; bt < g->B * g->T; bt++) acc += es[bt * g->H + h];
    dsink[h] += (float)acc;
}

#endif
