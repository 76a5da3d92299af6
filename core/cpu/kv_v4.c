/* kv_v4.c — the DeepSeek-V4 KV cache's ops on the CPU (core/ops.h: ps_v4_kv_attend, ps_v4_kv_slots): the
 * reference. These are the loops core/v4/v4_kvcache.c ran on host memory before its cache went through the
 * backend's ops, unchanged (the same arithmetic in the same order: the numbers on the cpu backend are the
 * same bits), reading the page lists in place. Each query row is computed alone, so the numbers do not depend
 * on the thread count. */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "core/cpu/cpu.h"
#include "core/hd_math.h"

/* row i of a page list */
static inline const float *pg_at(const ps_kv_pages *r, int64_t i) {
    int64_t k = i - r->base;
    return r->page[k / r->page_rows] + (k % r->page_rows) * r->width;
}

int ps_v4_kv_attn_check(ps_ctx *ctx, const ps_v4_kv_attn *a) {
    int64_t t1 = a->t0 + a->n, lo = a->t0 - a->W + 1 > 0 ? a->t0 - a->W + 1 : 0;
    int ok = a->H >= 1 && a->Dh >= 1 && a->W >= 1 && a->m >= 0 && a->K >= 0 && a->nE >= 0 && a->t0 >= 0 && a->n >= 0 &&
             (a->m > 0 || (a->K == 0 && a->nE == 0));
    if (ok && a->n > 0) ok = a->kv.page && a->kv.width == a->Dh && a->kv.base <= lo && a->kv.rows >= t1;
    if (ok && a->nE > 0) ok = a->ent.page && a->ent.width == a->Dh && a->ent.base == 0 && a->ent.rows >= a->nE;
    if (ok) return 0;
    return ps_ctx_fail(ctx,
                       "v4_kv_attend: invalid geometry H=%lld Dh=%lld W=%lld m=%lld K=%lld entries %lld, rows %lld..%lld (raw rows held "
                       "%lld..%lld, entries %lld)",
                       (long long)a->H, (long long)a->Dh, (long long)a->W, (long long)a->m, (long long)a->K, (long long)a->nE,
                       (long long)a->t0, (long long)t1 - 1, (long long)a->kv.base, (long long)a->kv.rows - 1, (long long)a->ent.rows);
}

/* Query row r (position t = t0 + r): its keys (K = V) — the raw rows t-W+1..t, then the entries topk lists
 * (CSA) or every visible one (HCA) — into key[], their count returned. */
static int64_t row_keys(const ps_v4_kv_attn *a, const float *topk, int64_t r, const float **key) {
    int64_t t = a->t0 + r, nk = 0, j0 = t - a->W + 1 < 0 ? 0 : t - a->W + 1;
    for (int64_t j = j0; j <= t; j++) key[nk++] = pg_at(&a->kv, j);
    if (a->K > 0) {
        for (int64_t i = 0; i < a->K; i++) {
            float f = topk[r * a->K + i];
            if (f >= 0 && f < (float)a->nE) key[nk++] = pg_at(&a->ent, (int64_t)f);
        }
    } else if (a->m > 0) {
        int64_t nv = (t + 1) / a->m < a->nE ? (t + 1) / a->m : a->nE;
        for (int64_t e = 0; e < nv; e++) key[nk++] = pg_at(&a->ent, e);
    }
    return nk;
}

int ps_cpu_v4_kv_attend(ps_ctx *ctx, float *out, float *sinkp, const float *q, const float *topk, const float *sink,
                        const ps_v4_kv_attn *a) {
    if (ps_v4_kv_attn_check(ctx, a)) return -1;
    if (a->K > 0 && !topk) return ps_ctx_fail(ctx, "v4_kv_attend: K = %lld entries per query and no topk", (long long)a->K);
    int64_t n = a->n, H = a->H, Dh = a->Dh, t1 = a->t0 + n;
    if (n == 0) return 0;
    /* per thread: the scores and the key pointers of one row (at most W raw rows and max(K, nE) entries) */
    int64_t want = (a->W < t1 ? a->W : t1) + (a->K > 0 ? a->K : a->nE) + 1, even = want + (want & 1);
    int64_t per = even + 2 * want; /* scores, then the pointers (two floats' room each; every offset 8-byte aligned) */
    int th = omp_get_max_threads();
    float *ws = ps_ctx_workspace(ctx, per * th);
    if (!ws) return -1;
    float scale = a->scale;
#pragma omp parallel for schedule(dynamic, 1) if (n > 1 && n * want * H * Dh > 65536)
    for (int64_t r = 0; r < n; r++) {
        float *sc = ws + per * (int64_t)omp_get_thread_num();
        const float **key = (const float **)(void *)(sc + even);
        int64_t nk = row_keys(a, topk, r, key);
        ps_cpu_v4_attend_keys(out + r * H * Dh, sinkp + r, n, q + r * H * Dh, key, nk, sink, H, Dh, scale, sc);
    }
    return 0;
}

int ps_cpu_v4_kv_slots(ps_ctx *ctx, float *gate, const float *ape, const ps_kv_chan *k) {
    if (ps_kv_slots_check(ctx, "v4_kv_slots", k)) return -1;
    int64_t d = k->hd, m = k->rate, cw = k->cw, S = k->csa ? 2 * m : m, w = k->wi;
    for (int64_t s = 0; s < S; s++) {
        int64_t tok, ch;
        float *o = gate + s * d;
        if (!k->csa) tok = w * m + s, ch = 0;
        else if (s < m) tok = (w - 1) * m + s, ch = 0;
        else tok = w * m + (s - m), ch = d;
        if (tok < 0) {
            for (int64_t i = 0; i < d; i++) o[i] = -INFINITY;
            continue;
        }
        const float *z = pg_at(&k->ln, tok) + cw + ch, *ap = ape + (s % m) * cw + ch;
        for (int64_t i = 0; i < d; i++) o[i] = z[i] + ap[i];
    }
    return 0;
}
