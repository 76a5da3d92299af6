/* select_bodies.h — the arithmetic of the CUDA backend's block-sparse selection ops (core/cuda/select.cu; the ops'
 * semantics in core/ops.h, "block-sparse selection"), one output element or one independent row per call, in a
 * header that is both C11 and CUDA C++: the kernels of select.cu call these bodies from a grid-stride loop, and
 * tests/test_cuda_select_bodies.c calls the same bodies from plain host loops over the same index spaces and
 * compares them with the CPU backend (core/cpu/select_cpu.c over core/select.c) and with core/select.c's naive
 * references, so the index math of every kernel is checked without a GPU.
 *
 * Naive by design (correctness first): one thread per compressed-key element, per (row, KV head) of the scores
 * and the top-k, per block score, per query head of the attention and of dq, and per (key, KV head) of dk / dv
 * (each thread owns its output rows: no atomics, the same sums in the same order on every run). The attention
 * bodies take two passes over the row's keys (the maximum, then the weights), in ps_select_slot_keys's order;
 * the CPU's fast path runs an online softmax over chunks, so the two agree to rounding. Not a public header. */
#ifndef PS_SELECT_BODIES_H
#define PS_SELECT_BODIES_H

#include <math.h>
#include <stdint.h>

#include "core/backend.h"
#include "core/hd_math.h"

/* slots per blocks row: topk + local_blocks */
static inline PS_HD int64_t ps_selb_slots(const ps_sel_geom *g) { return g->sel.topk + g->sel.local_blocks; }

/* keys of a level (windows of K every S, N of them) visible to position t: jS + K - 1 <= t */
static inline PS_HD int64_t ps_selb_visible(int64_t t, int64_t N, int64_t K, int64_t S) {
    if (t < K - 1) return 0;
    int64_t v = (t - K + 1) / S + 1;
    return v < N ? v : N;
}

/* ps_select_slot_keys: the keys [*j0, *j1) slot r of a blocks row gives position t (empty for -1, a repeated id,
 * keys after t) */
static inline PS_HD void ps_selb_slot_keys(const float *row, int64_t r, int64_t t, int64_t block, int64_t *j0, int64_t *j1) {
    int64_t b = (int64_t)row[r];
    *j0 = *j1 = 0;
    if (b < 0) return;
    for (int64_t e = 0; e < r; e++)
        if ((int64_t)row[e] == b) return;
    int64_t a = b * block, z = a + block;
    z = z > t + 1 ? t + 1 : z;
    if (a < z) *j0 = a, *j1 = z;
}

/* ---------------- compress: element e of ck [B, N, Hkv, D] (W = Hkv·D), the CPU's order of additions ---------------- */
static inline PS_HD void ps_selb_compress(float *ck, const float *k, int64_t L, int64_t W, int64_t N, int64_t K, int64_t S,
                                          int64_t e) {
    int64_t c = e % W, j = e / W % N, b = e / (W * N);
    const float *x = k + (b * L + j * S) * W + c;
    float s = 0;
    for (int64_t r = 0; r < K; r++) s += x[r * W];
    ck[e] = s / (float)K;
}

/* ---------------- stage-1 scores: row ih = (b, i, h) of P [B, n, Hkv, N1] ---------------- */
static inline PS_HD void ps_selb_scores_row(float *P, const float *q, const float *k1, const float *k2, const ps_sel_geom *g,
                                            int64_t ih) {
    int64_t Hkv = g->Hkv, H = g->H, D = g->D, G = H / Hkv, K = g->sel.kernel, S = g->sel.stride;
    int64_t h = ih % Hkv, i = ih / Hkv % g->n, b = ih / (Hkv * g->n), t = g->pos0 + i;
    int64_t v1 = ps_selb_visible(t, g->N1, K, S), v2 = ps_selb_visible(t, g->N2, 4 * K, 4 * S);
    float sc = 1.0f / sqrtf((float)D), *p = P + ih * g->N1;
    const float *k1b = k1 + b * g->N1 * Hkv * D, *k2b = k2 + b * g->N2 * Hkv * D;
    for (int64_t j = 0; j < g->N1; j++) p[j] = 0;
    if (!v2) return;
    for (int64_t qh = h * G; qh < (h + 1) * G; qh++) {
        const float *qg = q + ((b * g->n + i) * H + qh) * D;
        float mx = -INFINITY, sum = 0;
        for (int64_t v = 0; v < v2; v++) {
            float s = ps_dot(qg, k2b + (v * Hkv + h) * D, D) * sc;
            mx = s > mx ? s : mx;
        }
        for (int64_t v = 0; v < v2; v++) sum += expf(ps_dot(qg, k2b + (v * Hkv + h) * D, D) * sc - mx);
        float lse = mx + logf(sum);
        for (int64_t j = 0; j < v1; j++) p[j] += expf(ps_dot(qg, k1b + (j * Hkv + h) * D, D) * sc - lse);
    }
}

/* ---------------- block scores: element e of bs [B, n, Hkv, nb] (exact: a max and the forced blocks) ---------------- */
static inline PS_HD void ps_selb_block_score(float *bs, const float *P, const ps_sel_geom *g, int64_t e) {
    int64_t nb = g->nb, blk = e % nb, row = e / nb, i = row / g->Hkv % g->n, m = g->sel.block / g->sel.stride;
    int64_t t = g->pos0 + i, qb = t / g->sel.block, lo = m * blk - 1, hi = m * blk + m;
    lo = lo < 0 ? 0 : lo;
    hi = hi > g->N1 ? g->N1 : hi;
    const float *p = P + row * g->N1;
    float mx = 0;
    for (int64_t j = lo; j < hi; j++) mx = p[j] > mx ? p[j] : mx;
    int forced = blk < g->sel.init_blocks || (blk >= qb - g->sel.local_blocks && blk <= qb);
    bs[e] = forced ? INFINITY : mx;
}

/* ---------------- top-k: row r = (b, i, h) of blocks [B, n, Hkv, slots] (exact) ---------------- */

/* a ranks before b: the higher score, then the lower index (NaN as the lowest score) */
static inline PS_HD int ps_selb_before(float sa, int64_t ia, float sb, int64_t ib) {
    if (isnan(sa)) sa = -INFINITY;
    if (isnan(sb)) sb = -INFINITY;
    return sa > sb || (sa == sb && ia < ib);
}

static inline PS_HD void ps_selb_topk_row(float *blocks, const float *bs, const ps_sel_geom *g, int64_t r) {
    int64_t nb = g->nb, K = ps_selb_slots(g), keep = K < nb ? K : nb, qb = (g->pos0 + r / g->Hkv % g->n) / g->sel.block;
    const float *s = bs + r * nb;
    float *o = blocks + r * K;
    /* o[0..cnt) holds the best blocks so far in rank order (insertion into a sorted list) */
    int64_t cnt = 0;
    for (int64_t b = 0; b < nb && keep > 0; b++) {
        if (cnt == keep && !ps_selb_before(s[b], b, s[(int64_t)o[cnt - 1]], (int64_t)o[cnt - 1])) continue;
        int64_t at = cnt < keep ? cnt++ : keep - 1;
        while (at > 0 && ps_selb_before(s[b], b, s[(int64_t)o[at - 1]], (int64_t)o[at - 1])) {
            o[at] = o[at - 1];
            at--;
        }
        o[at] = (float)b;
    }
    int64_t w = 0;
    for (int64_t x = 0; x < cnt; x++)
        if ((int64_t)o[x] <= qb) o[w++] = o[x];
    for (int64_t x = 1; x < w; x++) { /* ascending (distinct ids) */
        float v = o[x];
        int64_t y = x;
        for (; y > 0 && o[y - 1] > v; y--) o[y] = o[y - 1];
        o[y] = v;
    }
    for (; w < K; w++) o[w] = -1.0f;
}

/* ---------------- attention: query head r = (b, i, qh) of z [B, n, H, D] and lse [B, n, H] ---------------- */

/* the row's blocks (NULL: dense) and its key range through slot s (dense: one slot, every key up to t) */
static inline PS_HD const float *ps_selb_row(const float *blocks, const ps_sel_geom *g, int64_t b, int64_t i, int64_t h) {
    return blocks ? blocks + ((b * g->n + i) * g->Hkv + h) * ps_selb_slots(g) : (const float *)0;
}
static inline PS_HD void ps_selb_keys(const float *row, const ps_sel_geom *g, int64_t s, int64_t t, int64_t *j0, int64_t *j1) {
    if (row) ps_selb_slot_keys(row, s, t, g->sel.block, j0, j1);
    else *j0 = 0, *j1 = t + 1;
}

static inline PS_HD void ps_selb_attn_row(float *z, float *lse, const float *q, const float *k, const float *v,
                                          const float *blocks, const ps_sel_geom *g, int64_t r) {
    int64_t H = g->H, Hkv = g->Hkv, D = g->D, qh = r % H, i = r / H % g->n, b = r / (H * g->n), h = qh / (H / Hkv);
    int64_t t = g->pos0 + i, ns = blocks ? ps_selb_slots(g) : 1, ks = Hkv * D;
    const float *row = ps_selb_row(blocks, g, b, i, h), *qg = q + r * D, *kb = k + b * g->L * ks + h * D,
                *vb = v + b * g->L * ks + h * D;
    float sc = 1.0f / sqrtf((float)D), mx = -INFINITY, sum = 0, *o = z + r * D;
    for (int64_t d = 0; d < D; d++) o[d] = 0;
    for (int64_t s = 0; s < ns; s++) {
        int64_t j0, j1;
        ps_selb_keys(row, g, s, t, &j0, &j1);
        for (int64_t j = j0; j < j1; j++) {
            float x = ps_dot(qg, kb + j * ks, D) * sc;
            mx = x > mx ? x : mx;
        }
    }
    for (int64_t s = 0; s < ns && mx > -INFINITY; s++) {
        int64_t j0, j1;
        ps_selb_keys(row, g, s, t, &j0, &j1);
        for (int64_t j = j0; j < j1; j++) {
            float p = expf(ps_dot(qg, kb + j * ks, D) * sc - mx);
            const float *vj = vb + j * ks;
            sum += p;
            for (int64_t d = 0; d < D; d++) o[d] += p * vj[d];
        }
    }
    if (sum > 0)
        for (int64_t d = 0; d < D; d++) o[d] /= sum;
    if (lse) lse[r] = sum > 0 ? mx + logf(sum) : -INFINITY;
}

/* ---------------- backward: dq of query head r (+=), and dk, dv of key row e = (b, j, h) (+=) ---------------- */

static inline PS_HD void ps_selb_dq_row(float *dq, const float *dz, const float *z, const float *lse, const float *q,
                                        const float *k, const float *v, const float *blocks, const ps_sel_geom *g, int64_t r) {
    int64_t H = g->H, Hkv = g->Hkv, D = g->D, qh = r % H, i = r / H % g->n, b = r / (H * g->n), h = qh / (H / Hkv);
    int64_t t = g->pos0 + i, ns = blocks ? ps_selb_slots(g) : 1, ks = Hkv * D;
    float l = lse[r];
    if (!(l > -INFINITY)) return;
    const float *row = ps_selb_row(blocks, g, b, i, h), *qg = q + r * D, *dzg = dz + r * D, *kb = k + b * g->L * ks + h * D,
                *vb = v + b * g->L * ks + h * D;
    float sc = 1.0f / sqrtf((float)D), Di = ps_dot(dzg, z + r * D, D), *dqg = dq + r * D;
    for (int64_t s = 0; s < ns; s++) {
        int64_t j0, j1;
        ps_selb_keys(row, g, s, t, &j0, &j1);
        for (int64_t j = j0; j < j1; j++) {
            const float *kj = kb + j * ks;
            float p = expf(ps_dot(qg, kj, D) * sc - l), ds = p * (ps_dot(dzg, vb + j * ks, D) - Di) * sc;
            for (int64_t d = 0; d < D; d++) dqg[d] += ds * kj[d];
        }
    }
}

static inline PS_HD void ps_selb_dkv_row(float *dk, float *dv, const float *dz, const float *z, const float *lse,
                                         const float *q, const float *k, const float *v, const float *blocks,
                                         const ps_sel_geom *g, int64_t e) {
    int64_t H = g->H, Hkv = g->Hkv, D = g->D, G = H / Hkv, h = e % Hkv, j = e / Hkv % g->L, b = e / (Hkv * g->L);
    int64_t ns = ps_selb_slots(g), i0 = j - g->pos0 > 0 ? j - g->pos0 : 0, jb = j / g->sel.block;
    const float *kj = k + e * D, *vj = v + e * D;
    float sc = 1.0f / sqrtf((float)D), *dkj = dk + e * D, *dvj = dv + e * D;
    for (int64_t i = i0; i < g->n; i++) {
        const float *row = ps_selb_row(blocks, g, b, i, h);
        int in = !row;
        for (int64_t s = 0; row && s < ns && !in; s++) in = (int64_t)row[s] == jb;
        if (!in) continue;
        for (int64_t qh = h * G; qh < (h + 1) * G; qh++) {
            int64_t r = (b * g->n + i) * H + qh;
            float l = lse[r];
            if (!(l > -INFINITY)) continue;
            const float *qg = q + r * D, *dzg = dz + r * D;
            float Di = ps_dot(dzg, z + r * D, D), p = expf(ps_dot(qg, kj, D) * sc - l),
                  ds = p * (ps_dot(dzg, vj, D) - Di) * sc;
            for (int64_t d = 0; d < D; d++) {
                dkj[d] += ds * qg[d];
                dvj[d] += p * dzg[d];
            }
        }
    }
}

#endif
