/* kvcache_v4.cu — the DeepSeek-V4 KV cache's ops on the device (core/ops.h: ps_v4_kv_attend, ps_v4_kv_slots;
 * the CPU's core/cpu/kv_v4.c is the reference). The page lists live in device memory; their page tables (host
 * arrays of device pointers) are staged with cu_stage. Exactness over speed: one thread per (query row, head)
 * with sequential loops over its keys — the raw rows of its sliding window, then the entries the indexer
 * selected (topk, a device buffer) or every visible one — in three passes (the maximum with the sink logit,
 * the sum of exponentials in double, the weighted keys: K = V), the dot products as the CPU's (ps_dot); one
 * thread per channel for a closing window's gates. Not yet run on a GPU (docs/kvcache.md). */
#include <string.h>

#include "core/cuda/cuda_internal.cuh"
#include "core/hd_math.h"

typedef struct {
    float *const *tab;
    int64_t base, rows, width, page_rows;
} v4k_pages;

typedef struct {
    int64_t H, Dh, W, m, K, nE, t0, n;
    float scale;
    v4k_pages kv, ent;
} v4k_args;

/* row i of a page list on the device (tab: its staged page table) */
__device__ __forceinline__ const float *v4k_row(const v4k_pages &p, int64_t i) {
    int64_t k = i - p.base;
    return p.tab[k / p.page_rows] + (k % p.page_rows) * p.width;
}

/* key i of query row r (position t): raw row j0 + i for i < nraw, then entry slot i - nraw (CSA: the topk
 * slot's entry, NULL for an empty slot; HCA: entry i - nraw) */
__device__ __forceinline__ const float *v4k_key(const v4k_args &a, const float *topk, int64_t r, int64_t j0, int64_t nraw, int64_t i) {
    if (i < nraw) return v4k_row(a.kv, j0 + i);
    i -= nraw;
    if (a.K > 0) {
        float f = topk[r * a.K + i];
        return f >= 0 && f < (float)a.nE ? v4k_row(a.ent, (int64_t)f) : NULL;
    }
    return v4k_row(a.ent, i);
}

__global__ void k_v4_kv_attend(float *out, float *sinkp, const float *q, const float *topk, const float *sink, v4k_args a) {
    GS_LOOP(task, a.n * a.H) {
        int64_t r = task / a.H, h = task % a.H, t = a.t0 + r, Dh = a.Dh;
        int64_t j0 = t - a.W + 1 < 0 ? 0 : t - a.W + 1, nraw = t - j0 + 1, ns = nraw;
        if (a.K > 0) ns += a.K;
        else if (a.m > 0) ns += (t + 1) / a.m < a.nE ? (t + 1) / a.m : a.nE;
        const float *qh = q + (r * a.H + h) * Dh;
        float *o = out + (r * a.H + h) * Dh, mx = sink[h];
        for (int64_t i = 0; i < ns; i++) {
            const float *k = v4k_key(a, topk, r, j0, nraw, i);
            if (k) mx = fmaxf(mx, ps_dot(qh, k, Dh) * a.scale);
        }
        double sum = exp((double)sink[h] - mx);
        for (int64_t i = 0; i < ns; i++) {
            const float *k = v4k_key(a, topk, r, j0, nraw, i);
            if (k) sum += expf(ps_dot(qh, k, Dh) * a.scale - mx);
        }
        float inv = (float)(1.0 / sum);
        for (int64_t d = 0; d < Dh; d++) o[d] = 0.0f;
        for (int64_t i = 0; i < ns; i++) {
            const float *k = v4k_key(a, topk, r, j0, nraw, i);
            if (!k) continue;
            float p = expf(ps_dot(qh, k, Dh) * a.scale - mx) * inv;
            for (int64_t d = 0; d < Dh; d++) o[d] += p * k[d];
        }
        sinkp[h * a.n + r] = (float)(exp((double)sink[h] - mx) / sum);
    }
}

static int64_t v4k_n_pages(const ps_kv_pages *p) {
    return p->rows > p->base ? (p->rows - p->base + p->page_rows - 1) / p->page_rows : 0;
}

static v4k_pages v4k_dpages(const ps_kv_pages *p, void *tab) {
    v4k_pages d = {(float *const *)tab, p->base, p->rows, p->width, p->page_rows};
    return d;
}

extern "C" int ps_cuda_v4_kv_attend(ps_ctx *c, float *out, float *sinkp, const float *q, const float *topk, const float *sink,
                                    const ps_v4_kv_attn *a) {
    if (ps_v4_kv_attn_check(c, a)) return -1;
    if (a->K > 0 && !topk) return ps_ctx_fail(c, "v4_kv_attend: K = %lld entries per query and no topk", (long long)a->K);
    if (a->n == 0) return 0;
    const void *h[2] = {a->kv.page, a->ent.page};
    int64_t by[2] = {v4k_n_pages(&a->kv) * (int64_t)sizeof(float *), a->nE > 0 ? v4k_n_pages(&a->ent) * (int64_t)sizeof(float *) : 0};
    void *d[2];
    if (cu_stage(c, 2, h, by, d)) return -1;
    v4k_args x;
    memset(&x, 0, sizeof x);
    x.H = a->H, x.Dh = a->Dh, x.W = a->W, x.m = a->m, x.K = a->K, x.nE = a->nE, x.t0 = a->t0, x.n = a->n, x.scale = a->scale;
    x.kv = v4k_dpages(&a->kv, d[0]);
    if (a->nE > 0) x.ent = v4k_dpages(&a->ent, d[1]);
    k_v4_kv_attend<<<cu_grid(a->n * a->H, 64), 64, 0, STREAM(c)>>>(out, sinkp, q, topk, sink, x);
    return CU_LAUNCHED(c, "v4_kv_attend");
}

/* gate [S, hd]: one thread per channel (core/cpu/kv_v4.c's slot layout) */
__global__ void k_v4_kv_slots(float *gate, const float *ape, int64_t hd, int64_t m, int64_t cw, int csa, int64_t w, v4k_pages ln) {
    int64_t S = csa ? 2 * m : m;
    GS_LOOP(i, hd) {
        for (int64_t s = 0; s < S; s++) {
            int64_t tok, ch;
            if (!csa) tok = w * m + s, ch = 0;
            else if (s < m) tok = (w - 1) * m + s, ch = 0;
            else tok = w * m + (s - m), ch = hd;
            gate[s * hd + i] = tok < 0 ? -INFINITY : v4k_row(ln, tok)[cw + ch + i] + ape[(s % m) * cw + ch + i];
        }
    }
}

extern "C" int ps_cuda_v4_kv_slots(ps_ctx *c, float *gate, const float *ape, const ps_kv_chan *k) {
    if (ps_kv_slots_check(c, "v4_kv_slots", k)) return -1;
    const void *h[1] = {k->ln.page};
    int64_t by[1] = {v4k_n_pages(&k->ln) * (int64_t)sizeof(float *)};
    void *d[1];
    if (cu_stage(c, 1, h, by, d)) return -1;
    k_v4_kv_slots<<<cu_grid(k->hd, 64), 64, 0, STREAM(c)>>>(gate, ape, k->hd, k->rate, k->cw, k->csa, k->wi, v4k_dpages(&k->ln, d[0]));
    return CU_LAUNCHED(c, "v4_kv_slots");
}
