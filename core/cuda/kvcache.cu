/* kvcache.cu — the KV cache's ops on the device (core/ops.h: ps_kv_attend, ps_kv_gate, ps_kv_pool, ps_kv_gather;
 * the CPU's core/cpu/kv.c is the reference). The page lists live in device memory; their page tables (host
 * arrays of device pointers) and the small index arrays are staged with cu_stage. Exactness over speed: one
 * thread per (query row, head) with sequential loops over the entries and the raw rows (three passes: the
 * maximum, the sum of exponentials, the weighted values), one thread per KV head for a closing window's
 * gates, one per (KV head, channel) for its pooled entry; the channel attention likewise (kv_attend_sink,
 * kv_slots, kv_slot_pool). */
#include <string.h>

#include "core/cuda/cuda_internal.cuh"

#define KV_MAX_HEADS 32 /* KV heads whose page tables one kv_attend launch carries */

/* row i of a page list on the device: tab is its staged page table */
__device__ __forceinline__ const float *kv_row(float *const *tab, int64_t base, int64_t page_rows, int64_t width, int64_t i) {
    int64_t k = i - base;
    return tab[k / page_rows] + (k % page_rows) * width;
}

__device__ __forceinline__ float kv_dot(const float *a, const float *b, int64_t n) {
    float s = 0.0f;
    for (int64_t x = 0; x < n; x++) s += a[x] * b[x];
    return s;
}

typedef struct {
    float *const *tab;
    int64_t base, rows, width, page_rows;
} kv_dpages;

typedef struct {
    int64_t nh, nkv, hd, LW, t0, nr;
    int compressed;
    const int64_t *nvis;
    kv_dpages k, v;
    kv_dpages ck[KV_MAX_HEADS], cv[KV_MAX_HEADS];
} kv_attn_args;

__device__ __forceinline__ const float *dp_row(const kv_dpages &p, int64_t i) {
    return kv_row(p.tab, p.base, p.page_rows, p.width, i);
}

/* z row i, head h: the three passes over the entries [0, ne) of KV head g and the raw rows [lo, t] */
__global__ void k_kv_attend(float *z, const float *q, kv_attn_args a) {
    GS_LOOP(task, a.nr * a.nh) {
        int64_t i = task / a.nh, h = task % a.nh, t = a.t0 + i, hd = a.hd, g = h / (a.nh / a.nkv);
        int64_t ne = a.compressed ? a.nvis[i * a.nkv + g] : 0;
        int64_t lo = a.compressed ? (t - a.LW + 1 > 0 ? t - a.LW + 1 : 0) : 0;
        const float *qr = q + (i * a.nh + h) * hd;
        float *zr = z + (i * a.nh + h) * hd;
        float scale = 1.0f / sqrtf((float)hd), mx = -INFINITY;
        for (int64_t j = 0; j < ne; j++) mx = fmaxf(mx, kv_dot(qr, dp_row(a.ck[g], j), hd) * scale);
        for (int64_t p = lo; p <= t; p++) mx = fmaxf(mx, kv_dot(qr, dp_row(a.k, p) + g * hd, hd) * scale);
        float sum = 0.0f;
        for (int64_t j = 0; j < ne; j++) sum += expf(kv_dot(qr, dp_row(a.ck[g], j), hd) * scale - mx);
        for (int64_t p = lo; p <= t; p++) sum += expf(kv_dot(qr, dp_row(a.k, p) + g * hd, hd) * scale - mx);
        float inv = 1.0f / sum;
        for (int64_t x = 0; x < hd; x++) zr[x] = 0.0f;
        for (int64_t j = 0; j < ne; j++) {
            float w = expf(kv_dot(qr, dp_row(a.ck[g], j), hd) * scale - mx) * inv;
            const float *e = dp_row(a.cv[g], j);
            for (int64_t x = 0; x < hd; x++) zr[x] += w * e[x];
        }
        for (int64_t p = lo; p <= t; p++) {
            float w = expf(kv_dot(qr, dp_row(a.k, p) + g * hd, hd) * scale - mx) * inv;
            const float *e = dp_row(a.v, p) + g * hd;
            for (int64_t x = 0; x < hd; x++) zr[x] += w * e[x];
        }
    }
}

static kv_dpages dpages(const ps_kv_pages *p, void *tab) {
    kv_dpages d = {(float *const *)tab, p->base, p->rows, p->width, p->page_rows};
    return d;
}

extern "C" int ps_cuda_kv_attend(ps_ctx *c, float *z, const float *q, const ps_kv_attn *a) {
    if (ps_kv_attn_check(c, a)) return -1;
    if (a->nr == 0) return 0;
    int64_t ne = a->compressed ? a->nkv : 0;
    if (ne > KV_MAX_HEADS) return ps_ctx_fail(c, "cuda kv_attend: %lld KV heads (at most %d)", (long long)ne, KV_MAX_HEADS);
    /* staged: the raw rows' page tables, then ck and cv of each KV head, then nvis */
    const void *h[CU_STAGE_MAX];
    int64_t by[CU_STAGE_MAX];
    void *d[CU_STAGE_MAX];
    int n = 0;
    h[n] = a->k.page, by[n++] = cu_kv_n_pages(&a->k) * (int64_t)sizeof(float *);
    h[n] = a->v.page, by[n++] = cu_kv_n_pages(&a->v) * (int64_t)sizeof(float *);
    for (int64_t g = 0; g < ne; g++) {
        h[n] = a->ck[g].page, by[n++] = cu_kv_n_pages(&a->ck[g]) * (int64_t)sizeof(float *);
        h[n] = a->cv[g].page, by[n++] = cu_kv_n_pages(&a->cv[g]) * (int64_t)sizeof(float *);
    }
    h[n] = a->nvis, by[n++] = a->compressed ? a->nr * a->nkv * (int64_t)sizeof(int64_t) : 0;
    if (cu_stage(c, n, h, by, d)) return -1;
    kv_attn_args x;
    memset(&x, 0, sizeof x);
    x.nh = a->nh, x.nkv = a->nkv, x.hd = a->hd, x.LW = a->LW, x.t0 = a->t0, x.nr = a->nr, x.compressed = a->compressed;
    x.k = dpages(&a->k, d[0]), x.v = dpages(&a->v, d[1]);
    for (int64_t g = 0; g < ne; g++) x.ck[g] = dpages(&a->ck[g], d[2 + 2 * g]), x.cv[g] = dpages(&a->cv[g], d[3 + 2 * g]);
    x.nvis = a->compressed ? (const int64_t *)d[n - 1] : NULL;
    return cu_launch(c, "kv_attend", k_kv_attend, a->nr * a->nh, 64, z, q, x);
}

/* alpha [nkv, W]: one thread per KV head (its window's gates, then their softmax in place) */
__global__ void k_kv_gate(float *alpha, const float *u, const float *bias, int learned, int64_t nkv, int64_t W, int64_t d,
                          float *const *tab, int64_t base, int64_t page_rows, const int64_t *start, const int64_t *len) {
    GS_LOOP(g, nkv) {
        float *al = alpha + g * W;
        for (int64_t i = 0; i < W; i++) al[i] = 0.0f;
        int64_t st = start[g], ln = len[g];
        if (st < 0) continue;
        if (!learned) {
            for (int64_t i = 0; i < ln; i++) al[i] = 1.0f / (float)ln;
            continue;
        }
        float mx = -INFINITY, sum = 0.0f;
        for (int64_t i = 0; i < ln; i++) {
            al[i] = bias[i * nkv + g] + kv_dot(u + (i * nkv + g) * d, kv_row(tab, base, page_rows, d, st + i), d);
            mx = fmaxf(mx, al[i]);
        }
        for (int64_t i = 0; i < ln; i++) sum += (al[i] = expf(al[i] - mx));
        for (int64_t i = 0; i < ln; i++) al[i] /= sum;
    }
}

/* the window table: the layer inputs' page table, start, len */
static int stage_close(ps_ctx *c, const ps_kv_close *w, void **d) {
    const void *h[3] = {w->ln.page, w->start, w->len};
    int64_t by[3] = {cu_kv_n_pages(&w->ln) * (int64_t)sizeof(float *), w->nkv * 8, w->nkv * 8};
    return cu_stage(c, 3, h, by, d);
}

extern "C" int ps_cuda_kv_gate(ps_ctx *c, float *alpha, const float *u, const float *bias, int learned, const ps_kv_close *w) {
    if (ps_kv_close_check(c, "kv_gate", w)) return -1;
    void *d[3];
    if (stage_close(c, w, d)) return -1;
    return cu_launch(c, "kv_gate", k_kv_gate, w->nkv, 32, alpha, u, bias, learned, w->nkv, w->W, w->d, (float *const *)d[0],
                  w->ln.base, w->ln.page_rows, (const int64_t *)d[1], (const int64_t *)d[2]);
}

/* out [nkv, hd]: one thread per (KV head, channel) */
__global__ void k_kv_pool(float *out, const float *alpha, const float *C, int shared, const float *pre, int64_t nkv, int64_t hd,
                          int64_t W, int64_t d, float *const *tab, int64_t base, int64_t page_rows, const int64_t *start,
                          const int64_t *len) {
    GS_LOOP(task, nkv * hd) {
        int64_t g = task / hd, e = task % hd, ks = nkv * hd, st = start[g];
        float o = 0.0f;
        if (st >= 0)
            for (int64_t i = 0; i < len[g]; i++) {
                float P;
                if (pre) P = pre[i * ks + g * hd + e];
                else P = kv_dot((shared ? C : C + i * ks * d) + (g * hd + e) * d, kv_row(tab, base, page_rows, d, st + i), d);
                o += alpha[g * W + i] * P;
            }
        out[task] = o;
    }
}

extern "C" int ps_cuda_kv_pool(ps_ctx *c, float *out, const float *alpha, const float *C, int shared, const float *pre, int64_t hd,
                               const ps_kv_close *w) {
    if (ps_kv_close_check(c, "kv_pool", w)) return -1;
    void *d[3];
    if (stage_close(c, w, d)) return -1;
    return cu_launch(c, "kv_pool", k_kv_pool, w->nkv * hd, 64, out, alpha, C, shared, pre, w->nkv, hd, w->W, w->d,
                  (float *const *)d[0], w->ln.base, w->ln.page_rows, (const int64_t *)d[1], (const int64_t *)d[2]);
}

__global__ void k_kv_gather(float *out, float *const *tab, int64_t base, int64_t page_rows, int64_t width, const int64_t *rows,
                            int64_t n) {
    GS_LOOP(i, n * width) {
        int64_t r = i / width, e = i % width;
        out[i] = kv_row(tab, base, page_rows, width, rows[r])[e];
    }
}

extern "C" int ps_cuda_kv_gather(ps_ctx *c, float *out, const ps_kv_pages *p, const int64_t *rows, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (rows[i] < p->base || rows[i] >= p->rows)
            return ps_ctx_fail(c, "kv_gather: row %lld outside the rows held %lld..%lld", (long long)rows[i], (long long)p->base,
                               (long long)p->rows - 1);
    if (n <= 0 || p->width <= 0) return 0;
    const void *h[2] = {p->page, rows};
    int64_t by[2] = {cu_kv_n_pages(p) * (int64_t)sizeof(float *), n * 8};
    void *d[2];
    if (cu_stage(c, 2, h, by, d)) return -1;
    return cu_launch(c, "kv_gather", k_kv_gather, n * p->width, 256, out, (float *const *)d[0], p->base, p->page_rows, p->width,
                  (const int64_t *)d[1], n);
}

/* ---- the channel attention (attention.kind "v4") ---- */

/* z row i, head h: the sliding window's raw K = V rows, then the entries; a softmax with the head's sink */
__global__ void k_kv_attend_sink(float *z, const float *q, const float *sink, kv_attn_args a) {
    GS_LOOP(task, a.nr * a.nh) {
        int64_t i = task / a.nh, h = task % a.nh, t = a.t0 + i, hd = a.hd, ne = a.nvis[i];
        int64_t lo = t - a.LW + 1 > 0 ? t - a.LW + 1 : 0;
        const float *qr = q + (i * a.nh + h) * hd;
        float *zr = z + (i * a.nh + h) * hd;
        float scale = (float)(1.0 / sqrt((double)hd)), mx = sink[h];
        for (int64_t p = lo; p <= t; p++) mx = fmaxf(mx, kv_dot(qr, dp_row(a.k, p), hd) * scale);
        for (int64_t j = 0; j < ne; j++) mx = fmaxf(mx, kv_dot(qr, dp_row(a.ck[0], j), hd) * scale);
        double sum = exp((double)sink[h] - mx);
        for (int64_t p = lo; p <= t; p++) sum += expf(kv_dot(qr, dp_row(a.k, p), hd) * scale - mx);
        for (int64_t j = 0; j < ne; j++) sum += expf(kv_dot(qr, dp_row(a.ck[0], j), hd) * scale - mx);
        float inv = (float)(1.0 / sum);
        for (int64_t x = 0; x < hd; x++) zr[x] = 0.0f;
        for (int64_t p = lo; p <= t; p++) {
            const float *e = dp_row(a.k, p);
            float w = expf(kv_dot(qr, e, hd) * scale - mx) * inv;
            for (int64_t x = 0; x < hd; x++) zr[x] += w * e[x];
        }
        for (int64_t j = 0; j < ne; j++) {
            const float *e = dp_row(a.ck[0], j);
            float w = expf(kv_dot(qr, e, hd) * scale - mx) * inv;
            for (int64_t x = 0; x < hd; x++) zr[x] += w * e[x];
        }
    }
}

extern "C" int ps_cuda_kv_attend_sink(ps_ctx *c, float *z, const float *q, const float *sink, const ps_kv_attn *a) {
    if (ps_kv_attn_check(c, a)) return -1;
    if (a->nkv != 1 || !a->compressed) return ps_ctx_fail(c, "kv_attend_sink: one K = V head with entries (nkv %lld)", (long long)a->nkv);
    if (a->nr == 0) return 0;
    const void *h[3] = {a->k.page, a->ck[0].page, a->nvis};
    int64_t by[3] = {cu_kv_n_pages(&a->k) * (int64_t)sizeof(float *), cu_kv_n_pages(&a->ck[0]) * (int64_t)sizeof(float *),
                     a->nr * (int64_t)sizeof(int64_t)};
    void *d[3];
    if (cu_stage(c, 3, h, by, d)) return -1;
    kv_attn_args x;
    memset(&x, 0, sizeof x);
    x.nh = a->nh, x.nkv = 1, x.hd = a->hd, x.LW = a->LW, x.t0 = a->t0, x.nr = a->nr, x.compressed = 1;
    x.k = dpages(&a->k, d[0]), x.v = x.k, x.ck[0] = dpages(&a->ck[0], d[1]), x.cv[0] = x.ck[0];
    x.nvis = (const int64_t *)d[2];
    return cu_launch(c, "kv_attend_sink", k_kv_attend_sink, a->nr * a->nh, 64, z, q, sink, x);
}

/* slot s of window wi: its token (-1: none) and channel block (core/cpu/kv.c's slot_src) */
__device__ __forceinline__ int64_t kv_slot_src(int csa, int64_t mr, int64_t wi, int64_t hd, int64_t s, int64_t *chb) {
    *chb = 0;
    if (!csa) return wi * mr + s;
    if (s < mr) return wi > 0 ? (wi - 1) * mr + s : -1;
    *chb = hd;
    return wi * mr + (s - mr);
}

/* alpha [S, hd]: one thread per channel (the slots' gates into alpha, then their softmax in place) */
__global__ void k_kv_slots(float *alpha, const float *ape, int64_t hd, int64_t mr, int64_t cw, int csa, int64_t wi, float *const *tab,
                           int64_t base, int64_t page_rows) {
    int64_t SL = csa ? 2 * mr : mr;
    GS_LOOP(i, hd) {
        float mx = -INFINITY;
        for (int64_t s = 0; s < SL; s++) {
            int64_t chb, tok = kv_slot_src(csa, mr, wi, hd, s, &chb);
            float g = -INFINITY;
            if (tok >= 0) g = kv_row(tab, base, page_rows, 2 * cw, tok)[cw + chb + i] + ape[(s % mr) * cw + chb + i];
            alpha[s * hd + i] = g;
            mx = fmaxf(mx, g);
        }
        double sum = 0;
        for (int64_t s = 0; s < SL; s++) sum += (alpha[s * hd + i] = expf(alpha[s * hd + i] - mx));
        float inv = (float)(1.0 / sum);
        for (int64_t s = 0; s < SL; s++) alpha[s * hd + i] *= inv;
    }
}

extern "C" int ps_cuda_kv_slots(ps_ctx *c, float *alpha, const float *ape, const ps_kv_chan *k) {
    if (ps_kv_slots_check(c, "kv_slots", k)) return -1;
    void *d[1];
    if (cu_stage_pages(c, &k->ln, d)) return -1;
    return cu_launch(c, "kv_slots", k_kv_slots, k->hd, 64, alpha, ape, k->hd, k->rate, k->cw, k->csa, k->wi, (float *const *)d[0],
                  k->ln.base, k->ln.page_rows);
}

/* out [hd]: one thread per channel */
__global__ void k_kv_slot_pool(float *out, const float *alpha, int64_t hd, int64_t mr, int64_t cw, int csa, int64_t wi,
                               float *const *tab, int64_t base, int64_t page_rows) {
    int64_t SL = csa ? 2 * mr : mr;
    GS_LOOP(i, hd) {
        float o = 0.0f;
        for (int64_t s = 0; s < SL; s++) {
            int64_t chb, tok = kv_slot_src(csa, mr, wi, hd, s, &chb);
            if (tok >= 0) o += alpha[s * hd + i] * kv_row(tab, base, page_rows, 2 * cw, tok)[chb + i];
        }
        out[i] = o;
    }
}

extern "C" int ps_cuda_kv_slot_pool(ps_ctx *c, float *out, const float *alpha, const ps_kv_chan *k) {
    if (ps_kv_slots_check(c, "kv_slot_pool", k)) return -1;
    void *d[1];
    if (cu_stage_pages(c, &k->ln, d)) return -1;
    return cu_launch(c, "kv_slot_pool", k_kv_slot_pool, k->hd, 64, out, alpha, k->hd, k->rate, k->cw, k->csa, k->wi,
                  (float *const *)d[0], k->ln.base, k->ln.page_rows);
}
