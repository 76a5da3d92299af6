/* kv.c — the KV cache's ops on the CPU (core/ops.h: ps_kv_attend, ps_kv_gate, ps_kv_pool, ps_kv_gather): the
 * reference. The attention of a piece's rows reads the page lists in place, per row (attend_row: a decode
 * step, and the reference) or over one transposed frame per KV head gathered once (attend_blocked: a long
 * piece, vectorised along the columns). The compressor of a closing window is plain loops. These are the
 * loops core/kvcache.c ran on host memory before the cache went through the backend's ops, unchanged: the
 * numbers on the cpu backend are the same bits. */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "core/cpu/cpu.h"

/* row i of a page list */
static inline const float *pg_at(const ps_kv_pages *r, int64_t i) {
    int64_t k = i - r->base;
    return r->page[k / r->page_rows] + (k % r->page_rows) * r->width;
}

/* Rows [i, end) of a page list as contiguous spans: *n rows from the returned pointer. */
static inline const float *pg_span(const ps_kv_pages *r, int64_t i, int64_t end, int64_t *n) {
    int64_t k = i - r->base, off = k % r->page_rows, left = r->page_rows - off;
    *n = end - i < left ? end - i : left;
    return r->page[k / r->page_rows] + off * r->width;
}

/* A workspace of at least n floats, rounded up to a power of two (a cache that grows by a row per step asks
 * for a little more each time; the arena then grows log-many times). */
static float *ws_round(ps_ctx *c, int64_t n) {
    int64_t w = 1024;
    while (w < n) w *= 2;
    return ps_ctx_workspace(c, w);
}

/* The dot products of the cache: in order for short vectors (a head of 8), ps_dot's 16 partial sums in a
 * fixed order for long ones (a layer input of d; vectorises). */
static inline float dotf(const float *a, const float *b, int64_t n) {
    if (n >= 32) return ps_dot(a, b, n);
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* sc[u] = (q · e[u·stride ..]) · scale over n rows, four rows at a time (four independent sums, each in
 * dotf's order: the same numbers as one row at a time). */
static inline void dot_rows(float *sc, const float *q, float scale, const float *e, int64_t stride, int64_t n, int64_t hd) {
    int64_t u = 0;
    if (hd < 32)
        for (; u + 4 <= n; u += 4) {
            const float *e0 = e + u * stride, *e1 = e0 + stride, *e2 = e1 + stride, *e3 = e2 + stride;
            float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
            for (int64_t x = 0; x < hd; x++) {
                s0 += q[x] * e0[x];
                s1 += q[x] * e1[x];
                s2 += q[x] * e2[x];
                s3 += q[x] * e3[x];
            }
            sc[u] = s0 * scale, sc[u + 1] = s1 * scale, sc[u + 2] = s2 * scale, sc[u + 3] = s3 * scale;
        }
    for (; u < n; u++) sc[u] = dotf(q, e + u * stride, hd) * scale;
}

/* z[x] += Σ_u p[u] · e[u·stride + x] over n rows, four rows at a time (one store per four rows: the
 * accumulation is not a chain of stores through z; the sum's order is fixed). */
static inline void axpy_rows(float *z, const float *p, float scale, const float *e, int64_t stride, int64_t n, int64_t hd) {
    int64_t u = 0;
    for (; u + 4 <= n; u += 4) {
        float p0 = p[u] * scale, p1 = p[u + 1] * scale, p2 = p[u + 2] * scale, p3 = p[u + 3] * scale;
        const float *e0 = e + u * stride, *e1 = e0 + stride, *e2 = e1 + stride, *e3 = e2 + stride;
        for (int64_t x = 0; x < hd; x++) z[x] += (p0 * e0[x] + p1 * e1[x]) + (p2 * e2[x] + p3 * e3[x]);
    }
    for (; u < n; u++) {
        float pu = p[u] * scale;
        for (int64_t x = 0; x < hd; x++) z[x] += pu * e[u * stride + x];
    }
}

/* The attention of one query row at position t (q_row [nh, hd]) into z_row [nh, hd]: KV head g's first
 * nvis[g] compressed entries, then the raw rows of the local window (full attention: every row up to t);
 * one softmax over both (SPEC §2). sc: scratch of the row's entries. */
static void attend_row(const ps_kv_attn *a, int64_t t, const int64_t *nvis, const float *q_row, float *z_row, float *sc) {
    int comp = a->compressed;
    int64_t nh = a->nh, nkv = a->nkv, hd = a->hd, grp = nh / nkv, ks = nkv * hd, n;
    int64_t lo = comp ? (t - a->LW + 1 > 0 ? t - a->LW + 1 : 0) : 0;
    float scale = 1.0f / sqrtf((float)hd);
    for (int64_t h = 0; h < nh; h++) {
        int64_t g = h / grp, ne = comp ? nvis[g] : 0, tot = ne + (t - lo + 1);
        const float *qn = q_row + h * hd;
        float mx = -INFINITY, sum = 0.0f;
        for (int64_t j = 0; j < ne; j += n) {
            const float *e = pg_span(&a->ck[g], j, ne, &n);
            dot_rows(sc + j, qn, scale, e, hd, n, hd);
        }
        for (int64_t p = lo; p <= t; p += n) {
            const float *e = pg_span(&a->k, p, t + 1, &n);
            dot_rows(sc + ne + p - lo, qn, scale, e + g * hd, ks, n, hd);
        }
        for (int64_t j = 0; j < tot; j++) mx = sc[j] > mx ? sc[j] : mx;
        for (int64_t j = 0; j < tot; j++) sum += (sc[j] = ps_expf_v(sc[j] - mx));
        float inv = 1.0f / sum, *zn = z_row + h * hd;
        memset(zn, 0, (size_t)hd * sizeof(float));
        for (int64_t j = 0; j < ne; j += n) {
            const float *e = pg_span(&a->cv[g], j, ne, &n);
            axpy_rows(zn, sc + j, inv, e, hd, n, hd);
        }
        for (int64_t p = lo; p <= t; p += n) {
            const float *e = pg_span(&a->v, p, t + 1, &n);
            axpy_rows(zn, sc + ne + p - lo, inv, e + g * hd, ks, n, hd);
        }
    }
}

/* The order key of a float: integers ordered as the floats are (NaN aside); max over keys vectorises
 * where a float max does not (gcc keeps float max reductions scalar without -ffinite-math-only). */
static inline int32_t fkey(float x) {
    int32_t i;
    memcpy(&i, &x, sizeof i);
    return i >= 0 ? i : i ^ 0x7fffffff;
}
static inline float fkey_inv(int32_t k) {
    int32_t i = k >= 0 ? k : k ^ 0x7fffffff;
    float x;
    memcpy(&x, &i, sizeof x);
    return x;
}
/* max(m, the keys of row[lo, hi)) */
static inline int32_t max_keys(const float *row, int64_t lo, int64_t hi, int32_t m) {
    for (int64_t c = lo; c < hi; c++) {
        int32_t k = fkey(row[c]);
        m = k > m ? k : m;
    }
    return m;
}

/* The attention of the piece's rows, blocked: per KV head g one frame of columns — its entries [0, ne_g),
 * then the raw rows [lo, t0 + nr) the piece reaches (the local windows; full attention: every row) —
 * gathered from the pages once, keys and values transposed ([hd, ncol]), so that a row's scores and its
 * weighted sum run along the columns (vectorised) with the frame in cache for the rows of the head
 * (head-major tasks). Row t reads the columns [0, nvis) and its local window; one softmax over both
 * (attend_row's function; test_kvcache compares the two). Each row alone: the numbers do not depend on
 * the thread count. */
static int attend_blocked(ps_ctx *ctx, const ps_kv_attn *a, const float *q, float *z) {
    int comp = a->compressed;
    int64_t t0 = a->t0, nr = a->nr;
    int64_t nh = a->nh, nkv = a->nkv, hd = a->hd, grp = nh / nkv, ks = nkv * hd, qd = nh * hd, t1 = t0 + nr;
    int64_t LW = comp ? a->LW : t1 + 1;
    int64_t lo = t0 - LW + 1 > 0 ? t0 - LW + 1 : 0, nraw = t1 - lo, nemax = 0;
    for (int64_t g = 0; comp && g < nkv; g++) nemax = a->ck[g].rows > nemax ? a->ck[g].rows : nemax;
    int64_t ncol = nemax + nraw, th = omp_get_max_threads(), need = 2 * nkv * hd * ncol + th * ncol;
    float *frame = ws_round(ctx, need);
    if (!frame) return -1;
    float *scores = frame + 2 * nkv * hd * ncol;
    /* the frames: KV head g's keys at frame + 2g·hd·ncol, its values hd·ncol further, [hd, ncol] each */
    for (int64_t g = 0; g < nkv; g++) {
        float *Kt = frame + 2 * g * hd * ncol, *Vt = Kt + hd * ncol;
        int64_t ne = comp ? a->ck[g].rows : 0, n;
        for (int br = 0; br < 2 && ne > 0; br++) {
            const ps_kv_pages *r = br ? &a->cv[g] : &a->ck[g];
            float *F = br ? Vt : Kt;
            for (int64_t j = 0; j < ne; j += n) {
                const float *e = pg_span(r, j, ne, &n);
                for (int64_t u = 0; u < n; u++)
                    for (int64_t x = 0; x < hd; x++) F[x * ncol + j + u] = e[u * hd + x];
            }
        }
        for (int br = 0; br < 2; br++) {
            const ps_kv_pages *r = br ? &a->v : &a->k;
            float *F = (br ? Vt : Kt) + ne;
            for (int64_t p = lo; p < t1; p += n) {
                const float *e = pg_span(r, p, t1, &n);
                for (int64_t u = 0; u < n; u++)
                    for (int64_t x = 0; x < hd; x++) F[x * ncol + p - lo + u] = e[u * ks + g * hd + x];
            }
        }
    }
    float scale = 1.0f / sqrtf((float)hd);
    const int64_t *nvis = a->nvis;
#pragma omp parallel for schedule(dynamic, 8) if (nr * nh * ncol * hd > 65536)
    for (int64_t task = 0; task < nh * nr; task++) {
        int64_t h = task / nr, i = task % nr, g = h / grp, t = t0 + i;
        int64_t ne = comp ? a->ck[g].rows : 0, nv = comp ? nvis[i * nkv + g] : 0;
        int64_t c_lo = ne + (t - LW + 1 > lo ? t - LW + 1 - lo : 0), c_hi = ne + t - lo + 1;
        const float *Kt = frame + 2 * g * hd * ncol, *Vt = Kt + hd * ncol, *qr = q + i * qd + h * hd;
        float *sc = scores + (int64_t)omp_get_thread_num() * ncol, *zr = z + i * qd + h * hd;
        /* scores along the columns: sc = q · K over [0, nv) and [c_lo, c_hi) */
        for (int rg = 0; rg < 2; rg++) {
            int64_t a0 = rg ? c_lo : 0, a1 = rg ? c_hi : nv;
            for (int64_t cc = a0; cc < a1; cc++) sc[cc] = qr[0] * Kt[cc];
            for (int64_t x = 1; x < hd; x++) {
                const float *kx = Kt + x * ncol;
                float qx = qr[x];
                for (int64_t cc = a0; cc < a1; cc++) sc[cc] += qx * kx[cc];
            }
            for (int64_t cc = a0; cc < a1; cc++) sc[cc] *= scale;
        }
        float mx = fkey_inv(max_keys(sc, c_lo, c_hi, max_keys(sc, 0, nv, fkey(-INFINITY))));
        float inv = 1.0f / (ps_cpu_exp_sum(sc, 0, nv, mx) + ps_cpu_exp_sum(sc, c_lo, c_hi, mx));
        for (int64_t x = 0; x < hd; x++) {
            const float *vx = Vt + x * ncol;
            zr[x] = (ps_dot(sc, vx, nv) + ps_dot(sc + c_lo, vx + c_lo, c_hi - c_lo)) * inv;
        }
    }
    return 0;
}

/* The geometry every kv op trusts: positive sizes, nh a multiple of nkv, and page lists that hold the rows
 * read (the raw rows from the first local window's start, the entries the rows see). */
int ps_kv_attn_check(ps_ctx *ctx, const ps_kv_attn *a) {
    int ok = a->nh >= 1 && a->nkv >= 1 && a->hd >= 1 && a->nh % a->nkv == 0 && a->t0 >= 0 && a->nr >= 0 &&
             (!a->compressed || (a->LW >= 1 && a->nvis && a->ck && a->cv));
    int64_t t1 = a->t0 + a->nr, lo = a->compressed ? (a->t0 - a->LW + 1 > 0 ? a->t0 - a->LW + 1 : 0) : 0;
    if (ok && a->nr > 0)
        ok = a->k.base <= lo && a->v.base <= lo && a->k.rows >= t1 && a->v.rows >= t1 && a->k.width == a->nkv * a->hd &&
             a->v.width == a->nkv * a->hd;
    for (int64_t i = 0; ok && a->compressed && i < a->nr; i++)
        for (int64_t g = 0; ok && g < a->nkv; g++)
            ok = a->nvis[i * a->nkv + g] >= 0 && a->nvis[i * a->nkv + g] <= a->ck[g].rows && a->ck[g].rows == a->cv[g].rows &&
                 a->ck[g].base == 0 && a->cv[g].base == 0 && a->ck[g].width == a->hd && a->cv[g].width == a->hd;
    if (ok) return 0;
    return ps_ctx_fail(ctx, "kv_attend: invalid geometry nh=%lld nkv=%lld hd=%lld compressed=%d LW=%lld rows %lld..%lld (raw rows held %lld..%lld)",
                       (long long)a->nh, (long long)a->nkv, (long long)a->hd, a->compressed, (long long)a->LW, (long long)a->t0,
                       (long long)t1 - 1, (long long)a->k.base, (long long)a->k.rows - 1);
}

int ps_cpu_kv_attend(ps_ctx *ctx, float *z, const float *q, const ps_kv_attn *a) {
    if (ps_kv_attn_check(ctx, a)) return -1;
    if (a->nr == 0) return 0;
    if (a->blocked) return attend_blocked(ctx, a, q, z);
    int64_t nh = a->nh, hd = a->hd, qd = nh * hd, nkv = a->nkv, t0 = a->t0, nr = a->nr;
    int64_t need = t0 + nr + 1; /* full attention: every row */
    if (a->compressed) { /* the most entries of a head, and the local window */
        need = 0;
        for (int64_t g = 0; g < nkv; g++) need = a->ck[g].rows > need ? a->ck[g].rows : need;
        need += a->LW + 1;
    }
    int th = omp_get_max_threads();
    float *sc = ws_round(ctx, need * th);
    if (!sc) return -1;
#pragma omp parallel for schedule(dynamic, 1) if (nr > 1 && nr * need * nh * hd > 65536)
    for (int64_t i = 0; i < nr; i++)
        attend_row(a, t0 + i, a->compressed ? a->nvis + i * nkv : NULL, q + i * qd, z + i * qd,
                   sc + (int64_t)omp_get_thread_num() * need);
    return 0;
}

int ps_kv_close_check(ps_ctx *ctx, const char *op, const ps_kv_close *w) {
    int ok = w->nkv >= 1 && w->W >= 1 && w->d >= 1 && w->start && w->len && w->ln.width == w->d;
    for (int64_t g = 0; ok && g < w->nkv; g++)
        if (w->start[g] >= 0)
            ok = w->len[g] >= 1 && w->len[g] <= w->W && w->start[g] >= w->ln.base && w->start[g] + w->len[g] <= w->ln.rows;
    if (ok) return 0;
    return ps_ctx_fail(ctx, "%s: invalid windows (nkv=%lld W=%lld d=%lld, layer inputs held %lld..%lld)", op, (long long)w->nkv,
                       (long long)w->W, (long long)w->d, (long long)w->ln.base, (long long)w->ln.rows - 1);
}

int ps_cpu_kv_gate(ps_ctx *ctx, float *alpha, const float *u, const float *bias, int learned, const ps_kv_close *w) {
    if (ps_kv_close_check(ctx, "kv_gate", w)) return -1;
    int64_t nkv = w->nkv, W = w->W, d = w->d;
    float *zz = ps_ctx_workspace(ctx, W);
    if (!zz) return -1;
    memset(alpha, 0, (size_t)(nkv * W) * sizeof(float));
    for (int64_t g = 0; g < nkv; g++) {
        int64_t st = w->start[g], len = w->len[g];
        if (st < 0) continue;
        float *al = alpha + g * W;
        if (!learned) {
            for (int64_t i = 0; i < len; i++) al[i] = 1.0f / (float)len;
            continue;
        }
        float mx = -INFINITY, sum = 0.0f;
        for (int64_t i = 0; i < len; i++) {
            zz[i] = bias[i * nkv + g] + dotf(u + (i * nkv + g) * d, pg_at(&w->ln, st + i), d);
            mx = zz[i] > mx ? zz[i] : mx;
        }
        for (int64_t i = 0; i < len; i++) sum += (al[i] = ps_expf_v(zz[i] - mx));
        for (int64_t i = 0; i < len; i++) al[i] /= sum;
    }
    return 0;
}

int ps_cpu_kv_pool(ps_ctx *ctx, float *out, const float *alpha, const float *C, int shared, const float *pre, int64_t hd,
                   const ps_kv_close *w) {
    if (ps_kv_close_check(ctx, "kv_pool", w)) return -1;
    int64_t nkv = w->nkv, W = w->W, d = w->d, ks = nkv * hd;
    float *P = pre ? NULL : ps_ctx_workspace(ctx, W * hd);
    if (!pre && !P) return -1;
    memset(out, 0, (size_t)ks * sizeof(float));
    for (int64_t g = 0; g < nkv; g++) {
        int64_t st = w->start[g], len = w->len[g];
        if (st < 0) continue;
        const float *al = alpha + g * W;
        float *o = out + g * hd;
        if (pre) { /* the payloads computed for a batch of windows: [W, ks] */
            for (int64_t i = 0; i < len; i++)
                for (int64_t e = 0; e < hd; e++) o[e] += al[i] * pre[i * ks + g * hd + e];
            continue;
        }
        for (int64_t i = 0; i < len; i++) {
            const float *a = pg_at(&w->ln, st + i), *Cg = (shared ? C : C + i * ks * d) + g * hd * d;
            float *Pi = P + i * hd;
            for (int64_t e = 0; e < hd; e++) Pi[e] = dotf(Cg + e * d, a, d);
        }
        for (int64_t i = 0; i < len; i++)
            for (int64_t e = 0; e < hd; e++) o[e] += al[i] * P[i * hd + e];
    }
    return 0;
}

int ps_cpu_kv_gather(ps_ctx *ctx, float *out, const ps_kv_pages *p, const int64_t *rows, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (rows[i] < p->base || rows[i] >= p->rows)
            return ps_ctx_fail(ctx, "kv_gather: row %lld outside the rows held %lld..%lld", (long long)rows[i], (long long)p->base,
                               (long long)p->rows - 1);
    for (int64_t i = 0; i < n; i++) memcpy(out + i * p->width, pg_at(p, rows[i]), (size_t)p->width * sizeof(float));
    return 0;
}

/* ---- the channel attention (attention.kind "v4") ---- */

/* The channel attention of query row t (ps_cpu_v4_attn for one query, K = 0): the raw K = V rows of the
 * sliding window, then the ne entries the row sees; a softmax with the head's sink. sc: the row's scratch. */
static void attend_sink_row(const ps_kv_attn *a, const float *sink, int64_t t, int64_t ne, const float *q_row, float *z_row,
                            float *sc) {
    int64_t nh = a->nh, hd = a->hd, lo = t - a->LW + 1 > 0 ? t - a->LW + 1 : 0, nraw = t - lo + 1, tot = nraw + ne, n;
    float scale = (float)(1.0 / sqrt((double)hd));
    for (int64_t h = 0; h < nh; h++) {
        const float *qh = q_row + h * hd;
        float mx = sink[h];
        for (int64_t p = lo; p <= t; p += n) {
            const float *e = pg_span(&a->k, p, t + 1, &n);
            dot_rows(sc + p - lo, qh, scale, e, hd, n, hd);
        }
        for (int64_t j = 0; j < ne; j += n) {
            const float *e = pg_span(&a->ck[0], j, ne, &n);
            dot_rows(sc + nraw + j, qh, scale, e, hd, n, hd);
        }
        for (int64_t i = 0; i < tot; i++) mx = sc[i] > mx ? sc[i] : mx;
        double sum = exp((double)sink[h] - mx);
        for (int64_t i = 0; i < tot; i++) sum += (sc[i] = expf(sc[i] - mx));
        float inv = (float)(1.0 / sum), *o = z_row + h * hd;
        memset(o, 0, (size_t)hd * sizeof(float));
        for (int64_t p = lo; p <= t; p += n) {
            const float *e = pg_span(&a->k, p, t + 1, &n);
            axpy_rows(o, sc + p - lo, inv, e, hd, n, hd);
        }
        for (int64_t j = 0; j < ne; j += n) {
            const float *e = pg_span(&a->ck[0], j, ne, &n);
            axpy_rows(o, sc + nraw + j, inv, e, hd, n, hd);
        }
    }
}

int ps_cpu_kv_attend_sink(ps_ctx *ctx, float *z, const float *q, const float *sink, const ps_kv_attn *a) {
    if (ps_kv_attn_check(ctx, a)) return -1;
    if (a->nkv != 1 || !a->compressed) return ps_ctx_fail(ctx, "kv_attend_sink: one K = V head with entries (nkv %lld)", (long long)a->nkv);
    if (a->nr == 0) return 0;
    int64_t nh = a->nh, hd = a->hd, qd = nh * hd, nr = a->nr, need = a->ck[0].rows + a->LW + 1;
    int th = omp_get_max_threads();
    float *sc = ws_round(ctx, need * th);
    if (!sc) return -1;
#pragma omp parallel for schedule(dynamic, 1) if (nr > 1 && nr * need * nh * hd > 65536)
    for (int64_t i = 0; i < nr; i++)
        attend_sink_row(a, sink, a->t0 + i, a->nvis[i], q + i * qd, z + i * qd, sc + (int64_t)omp_get_thread_num() * need);
    return 0;
}

int ps_kv_slots_check(ps_ctx *ctx, const char *op, const ps_kv_chan *k) {
    int64_t need = (k->wi + 1) * k->rate, first = k->csa && k->wi > 0 ? (k->wi - 1) * k->rate : k->wi * k->rate;
    if (k->hd >= 1 && k->rate >= 1 && k->wi >= 0 && k->cw == (k->csa ? 2 : 1) * k->hd && k->ln.width == 2 * k->cw &&
        k->ln.base <= first && k->ln.rows >= need)
        return 0;
    return ps_ctx_fail(ctx, "%s: invalid slots (hd %lld, rate %lld, window %lld, rows held %lld..%lld)", op, (long long)k->hd,
                       (long long)k->rate, (long long)k->wi, (long long)k->ln.base, (long long)k->ln.rows - 1);
}

/* slot s of window wi: its token (-1: none), and its channel block in *chb (ps_cpu_v4_comp_slots' slot_src) */
static inline int64_t slot_src(const ps_kv_chan *k, int64_t s, int64_t *chb) {
    int64_t mr = k->rate, wi = k->wi;
    *chb = 0;
    if (!k->csa) return wi * mr + s;
    if (s < mr) return wi > 0 ? (wi - 1) * mr + s : -1;
    *chb = k->hd;
    return wi * mr + (s - mr);
}

int ps_cpu_kv_slots(ps_ctx *ctx, float *alpha, const float *ape, const ps_kv_chan *k) {
    if (ps_kv_slots_check(ctx, "kv_slots", k)) return -1;
    int64_t hd = k->hd, mr = k->rate, cw = k->cw, SL = k->csa ? 2 * mr : mr;
    float *gate = ps_ctx_workspace(ctx, SL * hd), *al = alpha;
    if (!gate) return -1;
    for (int64_t s = 0; s < SL; s++) {
        int64_t chb, tok = slot_src(k, s, &chb);
        const float *zr = tok >= 0 ? pg_at(&k->ln, tok) + cw : NULL, *a = ape + (s % mr) * cw + chb;
        for (int64_t i = 0; i < hd; i++) gate[s * hd + i] = zr ? zr[chb + i] + a[i] : -INFINITY;
    }
    for (int64_t i = 0; i < hd; i++) {
        float mx = -INFINITY;
        for (int64_t s = 0; s < SL; s++) mx = gate[s * hd + i] > mx ? gate[s * hd + i] : mx;
        double sum = 0;
        for (int64_t s = 0; s < SL; s++) {
            float e = expf(gate[s * hd + i] - mx);
            al[s * hd + i] = e;
            sum += e;
        }
        float inv = (float)(1.0 / sum);
        for (int64_t s = 0; s < SL; s++) al[s * hd + i] *= inv;
    }
    return 0;
}

int ps_cpu_kv_slot_pool(ps_ctx *ctx, float *out, const float *alpha, const ps_kv_chan *k) {
    if (ps_kv_slots_check(ctx, "kv_slot_pool", k)) return -1;
    int64_t hd = k->hd, SL = k->csa ? 2 * k->rate : k->rate;
    memset(out, 0, (size_t)hd * sizeof(float));
    for (int64_t s = 0; s < SL; s++) {
        int64_t chb, tok = slot_src(k, s, &chb);
        if (tok < 0) continue;
        const float *src = pg_at(&k->ln, tok) + chb;
        for (int64_t i = 0; i < hd; i++) out[i] += alpha[s * hd + i] * src[i];
    }
    return 0;
}
