/* kvcache_v4_bodies.h — the arithmetic of the CUDA backend's DeepSeek-V4 KV cache ops (core/cuda/kvcache_v4.cu),
 * one (query row, head) or one channel per call, in a header that is both C11 and CUDA C++: the kernels call
 * these bodies from a grid-stride loop, and tests/test_v4_kvcache.c calls the same bodies from a plain host
 * loop over the same index space with host page tables and compares them with the CPU backend
 * (core/cpu/kv_v4.c), so the index and page arithmetic of the kernels is checked without a GPU.
 *
 * The bodies read the page lists through the ps_kv_pages of the op's geometry (core/backend.h), whose
 * `page` the launcher points at the staged copy of the page table. They follow the CPU's order of
 * operations (ps_dot's 16 partial sums, the sink's exponential and the sum in double), so on the host a
 * body gives the CPU's numbers; on the device expf/exp and fused multiply-adds may change the last bits.
 * Naive by design: three passes over a row's keys (the maximum, the sum, the weighted keys), recomputing
 * the dot products, no scratch. Not a public header. Semantics: core/ops.h. */
#ifndef PS_KVCACHE_V4_BODIES_H
#define PS_KVCACHE_V4_BODIES_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "core/backend.h"
#include "core/hd_math.h"

/* row i of a page list */
static inline PS_HD const float *ps_v4kb_row(const ps_kv_pages *p, int64_t i) {
    int64_t k = i - p->base;
    return p->page[k / p->page_rows] + (k % p->page_rows) * p->width;
}

/* key slot i of query row r (position t, raw rows j0 .. j0 + nraw - 1): the raw row j0 + i for i < nraw,
 * then entry slot i - nraw — CSA: the entry topk lists there (NULL for an empty slot or an index past the
 * entries held), HCA: entry i - nraw */
static inline PS_HD const float *ps_v4kb_key(const ps_v4_kv_attn *a, const float *topk, int64_t r, int64_t j0, int64_t nraw,
                                             int64_t i) {
    if (i < nraw) return ps_v4kb_row(&a->kv, j0 + i);
    i -= nraw;
    if (a->K > 0) {
        float f = topk[r * a->K + i];
        return f >= 0 && f < (float)a->nE ? ps_v4kb_row(&a->ent, (int64_t)f) : NULL;
    }
    return ps_v4kb_row(&a->ent, i);
}

/* v4_kv_attend, task = r·H + h: out [n, H, Dh] row r head h and sinkp [H, n] */
static inline PS_HD void ps_v4kb_kv_attend(float *out, float *sinkp, const float *q, const float *topk, const float *sink,
                                           const ps_v4_kv_attn *a, int64_t task) {
    int64_t r = task / a->H, h = task % a->H, t = a->t0 + r, Dh = a->Dh;
    int64_t j0 = t - a->W + 1 < 0 ? 0 : t - a->W + 1, nraw = t - j0 + 1, ns = nraw;
    if (a->K > 0) ns += a->K;
    else if (a->m > 0) ns += (t + 1) / a->m < a->nE ? (t + 1) / a->m : a->nE;
    const float *qh = q + (r * a->H + h) * Dh;
    float *o = out + (r * a->H + h) * Dh, mx = sink[h];
    for (int64_t i = 0; i < ns; i++) {
        const float *k = ps_v4kb_key(a, topk, r, j0, nraw, i);
        if (!k) continue;
        float s = ps_dot(qh, k, Dh) * a->scale;
        if (s > mx) mx = s;
    }
    double sum = exp((double)sink[h] - mx);
    for (int64_t i = 0; i < ns; i++) {
        const float *k = ps_v4kb_key(a, topk, r, j0, nraw, i);
        if (k) sum += expf(ps_dot(qh, k, Dh) * a->scale - mx);
    }
    float inv = (float)(1.0 / sum);
    for (int64_t d = 0; d < Dh; d++) o[d] = 0.0f;
    for (int64_t i = 0; i < ns; i++) {
        const float *k = ps_v4kb_key(a, topk, r, j0, nraw, i);
        if (!k) continue;
        float p = expf(ps_dot(qh, k, Dh) * a->scale - mx) * inv;
        for (int64_t d = 0; d < Dh; d++) o[d] += p * k[d];
    }
    sinkp[h * a->n + r] = (float)(exp((double)sink[h] - mx) / sum);
}

/* v4_kv_slots, channel i: gate [S, hd] column i (slot s: token and channel block as core/cpu/kv_v4.c) */
static inline PS_HD void ps_v4kb_kv_slots(float *gate, const float *ape, const ps_kv_chan *k, int64_t i) {
    int64_t d = k->hd, m = k->rate, cw = k->cw, S = k->csa ? 2 * m : m, w = k->wi;
    for (int64_t s = 0; s < S; s++) {
        int64_t tok, ch;
        if (!k->csa) tok = w * m + s, ch = 0;
        else if (s < m) tok = (w - 1) * m + s, ch = 0;
        else tok = w * m + (s - m), ch = d;
        gate[s * d + i] = tok < 0 ? -INFINITY : ps_v4kb_row(&k->ln, tok)[cw + ch + i] + ape[(s % m) * cw + ch + i];
    }
}

#endif
