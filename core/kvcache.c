/* kvcache.c — the controlled model's KV cache (kvcache.h). An append runs in steps of at most opts.chunk
 * rows (the new tokens of every sequence of the append, piece after piece): the matrix products, norms and
 * the MLP go through the backend's ops over all rows of a step at once; then, per row in position order,
 * its key, value and layer input enter the sequence's pages, the windows that close at its position are
 * pooled (the backend's kv_gate and kv_pool), and the number of entries its query sees is noted; then the
 * piece's queries attend (the backend's kv_attend over the page tables; on the CPU blocked over a gathered
 * frame for a long piece, per row for a short one: a decode step, and the reference) — so a query sees
 * exactly the entries that exist at its position, as in ps_forward (the channel attention: kv_slots,
 * kv_slot_pool, kv_attend_sink). Pages and step buffers are buffers of the model's context. */
#include "core/kvcache.h"

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/chunks.h"
#include "core/ops.h"
#include "core/runtime.h"
#include "core/select.h"

#define PR (r->page_rows)

/* ---- pages ----
 * A list holds its pages' buffers in `data` (the page table the backend's kv ops read). A page belongs to
 * one list until a fork shares it: then both lists point at one reference count (`refs`, a table made at
 * the first fork; a NULL entry: the page is the list's alone), and the last holder frees it. A page is
 * counted as its rows plus 4 bytes (one count). */

static int64_t page_data_bytes(const ps_kv_rows *r) { return PR * r->width * (int64_t)sizeof(float); }
static int64_t page_bytes(const ps_kv_rows *r) { return (int64_t)sizeof(int) + page_data_bytes(r); }

/* a new page's rows (a buffer of the context; host memory on a host list), counted */
static float *page_new(ps_kvcache *kv, const ps_kv_rows *r) {
    float *d = r->host ? malloc((size_t)page_data_bytes(r)) : ps_buf_alloc(kv->ctx, page_data_bytes(r), "a KV cache page", NULL);
    if (!d) return NULL;
    kv->page_bytes_live += page_bytes(r);
    if (kv->page_bytes_live > kv->page_bytes_peak) kv->page_bytes_peak = kv->page_bytes_live;
    return d;
}

static void page_free(ps_kvcache *kv, const ps_kv_rows *r, float *d) {
    kv->page_bytes_live -= page_bytes(r);
    if (r->host) free(d);
    else ps_buf_free(kv->ctx, d, page_data_bytes(r));
}

/* the list lets go of its page i: freed unless another list still holds it */
static void page_release(ps_kvcache *kv, ps_kv_rows *r, int64_t i) {
    int *cnt = r->refs ? r->refs[i] : NULL;
    if (cnt) {
        r->refs[i] = NULL;
        if (--*cnt > 0) return;
        free(cnt);
    }
    page_free(kv, r, r->data[i]);
}

/* n floats from src to dst, both the cache's buffers (or both host memory on a host list / context) */
static int kv_copy(ps_kvcache *kv, const ps_kv_rows *r, float *dst, const float *src, int64_t n) {
    if (r->host || ps_ctx_host_visible(kv->ctx)) {
        memcpy(dst, src, (size_t)n * sizeof(float));
        return 0;
    }
    return ps_copy(kv->ctx, dst, src, n);
}

static void rows_init(ps_kv_rows *r, int64_t width, int64_t page_rows) {
    memset(r, 0, sizeof *r);
    r->width = width;
    r->page_rows = page_rows;
}

static void rows_init_host(ps_kv_rows *r, int64_t width, int64_t page_rows) {
    rows_init(r, width, page_rows);
    r->host = 1;
}

static void rows_free(ps_kvcache *kv, ps_kv_rows *r) {
    for (int64_t i = 0; i < r->n_pages; i++) page_release(kv, r, i);
    free(r->data);
    free(r->refs);
    int64_t w = r->width, pr = r->page_rows;
    int host = r->host;
    rows_init(r, w, pr);
    r->host = host;
}

/* row i: a host pointer on a host list or context, else a pointer into a backend buffer */
static inline const float *rows_at(const ps_kv_rows *r, int64_t i) {
    int64_t k = i - r->base;
    return r->data[k / PR] + (k % PR) * r->width;
}

/* The page list as the backend's kv ops see it. */
static inline ps_kv_pages rows_view(const ps_kv_rows *r) {
    return (ps_kv_pages){.page = r->data, .base = r->base, .rows = r->rows, .width = r->width, .page_rows = r->page_rows};
}

/* Page pg made private to this list (copy on write). */
static int page_own(ps_kvcache *kv, ps_kv_rows *r, int64_t pg) {
    int *cnt = r->refs ? r->refs[pg] : NULL;
    if (!cnt) return 0;
    if (*cnt == 1) { /* the other holders have let go */
        free(cnt);
        r->refs[pg] = NULL;
        return 0;
    }
    float *cd = page_new(kv, r);
    if (!cd) return -1;
    if (kv_copy(kv, r, cd, r->data[pg], PR * r->width)) {
        page_free(kv, r, cd);
        return -1;
    }
    --*cnt;
    r->refs[pg] = NULL;
    r->data[pg] = cd;
    kv->n_page_copies++;
    return 0;
}

static float *rows_mut(ps_kvcache *kv, ps_kv_rows *r, int64_t i) {
    int64_t k = i - r->base;
    if (page_own(kv, r, k / PR)) return NULL;
    return r->data[k / PR] + (k % PR) * r->width;
}

/* The tables at capacity cap (>= n_pages): both or neither (they keep one capacity). */
static int rows_tables(ps_kv_rows *r, int64_t cap) {
    float **nd = malloc((size_t)cap * sizeof *nd);
    int **nr = r->refs ? malloc((size_t)cap * sizeof *nr) : NULL;
    if (!nd || (r->refs && !nr)) {
        free(nd), free(nr);
        return -1;
    }
    if (r->n_pages) memcpy(nd, r->data, (size_t)r->n_pages * sizeof *nd);
    if (nr && r->n_pages) memcpy(nr, r->refs, (size_t)r->n_pages * sizeof *nr);
    free(r->data), free(r->refs);
    r->data = nd, r->refs = nr, r->cap_pages = cap;
    return 0;
}

/* A new row at the end: its pointer (in the list's memory), NULL when out of memory. */
static float *rows_append(ps_kvcache *kv, ps_kv_rows *r) {
    int64_t k = r->rows - r->base, pg = k / PR;
    if (pg == r->n_pages) {
        if (r->n_pages == r->cap_pages && rows_tables(r, r->cap_pages ? 2 * r->cap_pages : 4)) return NULL;
        if (!(r->data[pg] = page_new(kv, r))) return NULL;
        if (r->refs) r->refs[pg] = NULL;
        r->n_pages++;
    } else if (page_own(kv, r, pg))
        return NULL;
    r->rows++;
    return r->data[pg] + (k % PR) * r->width;
}

/* One row at the end from row (the list's kind of memory: a buffer of the context, or host memory). */
static int rows_push(ps_kvcache *kv, ps_kv_rows *r, const float *row) {
    float *dst = rows_append(kv, r);
    if (!dst) return -1;
    return kv_copy(kv, r, dst, row, r->width);
}

/* Free the whole pages of rows before `from` (rows < from are no longer needed). */
static void rows_drop_front(ps_kvcache *kv, ps_kv_rows *r, int64_t from) {
    int64_t drop = 0;
    while (drop < r->n_pages - 1 && r->base + (drop + 1) * PR <= from) drop++;
    if (!drop) return;
    for (int64_t i = 0; i < drop; i++) page_release(kv, r, i);
    memmove(r->data, r->data + drop, (size_t)(r->n_pages - drop) * sizeof *r->data);
    if (r->refs) memmove(r->refs, r->refs + drop, (size_t)(r->n_pages - drop) * sizeof *r->refs);
    r->n_pages -= drop;
    r->base += drop * PR;
    if (r->cap_pages > 8 && r->n_pages < r->cap_pages / 4) { /* a long append grew the tables: give them back */
        int64_t cap = r->cap_pages;
        while (cap > 8 && r->n_pages < cap / 4) cap /= 2;
        rows_tables(r, cap); /* (kept as they are when memory runs out) */
    }
}

/* Keep rows [base, n) (n >= base). */
static void rows_truncate(ps_kvcache *kv, ps_kv_rows *r, int64_t n) {
    int64_t keep = (n - r->base + PR - 1) / PR;
    for (int64_t i = keep; i < r->n_pages; i++) page_release(kv, r, i);
    if (r->n_pages > keep) r->n_pages = keep;
    r->rows = n;
}

/* dst shares every page of src (dst: an empty list): one count per page, made now where there is none. */
static int rows_fork(ps_kv_rows *dst, ps_kv_rows *src) {
    int64_t w = src->width, pr = src->page_rows;
    int host = src->host;
    if (src->n_pages && !src->refs) {
        if (!(src->refs = calloc((size_t)src->cap_pages, sizeof *src->refs))) return -1;
    }
    for (int64_t i = 0; i < src->n_pages; i++)
        if (!src->refs[i]) {
            int *cnt = malloc(sizeof *cnt);
            if (!cnt) return -1;
            *cnt = 1;
            src->refs[i] = cnt;
        }
    *dst = *src;
    dst->data = NULL, dst->refs = NULL, dst->cap_pages = 0, dst->n_pages = 0;
    if (src->n_pages && rows_tables(dst, src->n_pages)) {
        rows_init(dst, w, pr);
        dst->host = host;
        return -1;
    }
    if (src->n_pages && !(dst->refs = malloc((size_t)src->n_pages * sizeof *dst->refs))) {
        free(dst->data);
        rows_init(dst, w, pr);
        dst->host = host;
        return -1;
    }
    dst->n_pages = src->n_pages;
    for (int64_t i = 0; i < src->n_pages; i++) {
        dst->data[i] = src->data[i];
        dst->refs[i] = src->refs[i];
        ++*src->refs[i];
    }
    return 0;
}

static int64_t rows_i64(const ps_kv_rows *r, int64_t i) {
    int64_t v;
    memcpy(&v, rows_at(r, i), sizeof v);
    return v;
}

static int32_t rows_tok(const ps_kv_rows *r, int64_t i) {
    int32_t v;
    memcpy(&v, rows_at(r, i), sizeof v);
    return v;
}

/* A page operation failed: the context's error when a copy on it failed, else out of memory (msg). */
static int page_fail(ps_kvcache *kv, ps_error *err, const char *msg) {
    if (kv->ctx->failed) return ps_ctx_check(kv->ctx, err);
    return ps_fail(err, "%s", msg);
}

/* An edit written into a row of the cache's memory (a host row on a host-visible context). */
static int edit_apply_buf(ps_kvcache *kv, const ps_kv_edit *e, float *row, int64_t d, ps_error *err) {
    if (ps_ctx_host_visible(kv->ctx)) {
        ps_kvcache_edit_apply(e, row, d);
        return 0;
    }
    if (e->kind == PS_KV_EDIT_ZERO) return ps_fill(kv->ctx, row, 0.0f, d) ? ps_ctx_check(kv->ctx, err) : 0;
    return ps_buf_from_host(kv->ctx, row, e->vec, d * (int64_t)sizeof(float), err);
}

/* ---- sizes ---- */

/* KV heads with compressed entries: the grid's KV heads, one for the channel attention (K = V), none for full. */
static int64_t entry_heads(const ps_config *c) {
    return c->kind == PS_ATTN_COMPRESSED ? c->n_kv_heads : c->kind == PS_ATTN_CHANNEL ? 1 : 0;
}

double ps_select_kv_factor(int64_t stride) { /* raw k and v of every token, a pooled key every S and 4S */
    return 1.0 + 0.5 * (1.0 / (double)stride + 1.0 / (4.0 * (double)stride));
}

double ps_kvcache_bytes_per_token(const ps_config *c) {
    if (c->kind == PS_ATTN_CHANNEL) return (double)c->n_layers * (double)c->head_dim * 4.0 / (double)c->rate;
    double full = (double)c->n_layers * 2.0 * (double)(c->n_kv_heads * c->head_dim) * 4.0;
    if (c->kind == PS_ATTN_SELECT) return full * ps_select_kv_factor(c->stride);
    if (c->kind != PS_ATTN_COMPRESSED) return full;
    if (c->boundaries == PS_BOUNDARIES_CONTENT) return full / ps_chunk_expected_len(c);
    return full / (double)c->stride;
}

double ps_kvcache_fixed_bytes(const ps_config *c) {
    double L = (double)c->n_layers;
    if (c->kind == PS_ATTN_CHANNEL) /* the sliding window of K = V rows; the compressor's kv and z rows of the open windows */
        return L * 4.0 * ((double)(c->local_window - 1) * (double)c->head_dim +
                          (double)(ps_config_v4_slots(c) - 1) * 2.0 * (double)(ps_config_v4_series(c) * c->head_dim));
    if (c->kind != PS_ATTN_COMPRESSED) return 0;
    return L * 4.0 * (2.0 * (double)(c->local_window - 1) * (double)(c->n_kv_heads * c->head_dim) +
                      (double)(c->window - 1) * (double)c->d_model);
}

/* a list's page tables: the buffers', and the counts' once a fork shared its pages */
static int64_t table_bytes(const ps_kv_rows *r) { return r->cap_pages * (int64_t)sizeof(void *) * (r->refs ? 2 : 1); }

static int64_t model_bytes(const ps_kvcache *kv) {
    int64_t tab = 0;
    const ps_config *c = &kv->m->cfg;
    for (int s = 0; s < kv->n_seq; s++) {
        const ps_kv_seq *q = &kv->seqs[s];
        if (!q->live) continue;
        tab += c->n_layers * (int64_t)sizeof(ps_kv_layer);
        for (int64_t l = 0; l < c->n_layers; l++) {
            const ps_kv_layer *L = &q->layers[l];
            tab += table_bytes(&L->k) + table_bytes(&L->v) + table_bytes(&L->ln) ;
            if (L->k1) tab += 2 * (int64_t)sizeof(ps_kv_rows) + table_bytes(L->k1) + table_bytes(L->k2);
            if (L->ck)
                for (int64_t g = 0; g < entry_heads(c); g++)
                    tab += 2 * (int64_t)sizeof(ps_kv_rows) + table_bytes(&L->ck[g]) + table_bytes(&L->cv[g]);
        }
    }
    return kv->page_bytes_live + tab;
}

/* ---- create / sequences ---- */

static void seq_free(ps_kvcache *kv, ps_kv_seq *q) {
    const ps_config *c = &kv->m->cfg;
    if (q->layers)
        for (int64_t l = 0; l < c->n_layers; l++) {
            ps_kv_layer *L = &q->layers[l];
            rows_free(kv, &L->k);
            rows_free(kv, &L->v);
            rows_free(kv, &L->ln);
            if (L->k1) {
                rows_free(kv, L->k1);
                rows_free(kv, L->k2);
                free(L->k1);
            }
            for (int64_t g = 0; L->ck && g < entry_heads(c); g++) {
                rows_free(kv, &L->ck[g]);
                rows_free(kv, &L->cv[g]);
            }
            free(L->ck);
            free(L->cv);
        }
    free(q->layers);
    rows_free(kv, &q->tok);
    rows_free(kv, &q->cend);
    memset(q, 0, sizeof *q);
}

static void model_free(ps_kvcache *kv) {
    for (int s = 0; s < kv->n_seq; s++)
        if (kv->seqs[s].live) seq_free(kv, &kv->seqs[s]);
    free(kv->seqs);
    for (int i = 0; i < kv->n_edits; i++) free(kv->edits[i].vec);
    free(kv->edits);
    if (kv->scratch) ps_buf_free(kv->ctx, kv->scratch, kv->scratch_floats * (int64_t)sizeof(float));
    free(kv->hscratch);
    free(kv->ckp);
    free(kv->ev_t);
    if (kv->ev_pay) ps_buf_free(kv->ctx, kv->ev_pay, kv->ev_pay_cap * (int64_t)sizeof(float));
    free(kv->cstart);
    free(kv->nvis);
    free(kv->sel);
    memset(kv, 0, sizeof *kv);
}

int ps_kvcache_create(ps_kvcache *kv, const ps_model *m, const ps_kvcache_opts *o, ps_error *err) {
    memset(kv, 0, sizeof *kv);
    const ps_config *c = &m->cfg;
    int host = ps_ctx_host_visible(m->ctx);
    kv->ops = &ps_kvcache_model_ops;
    kv->m = m;
    kv->ctx = m->ctx;
    kv->o.chunk = o && o->chunk > 0 ? o->chunk : 256;
    kv->o.history = o && o->history > 0 ? o->history : 0;
    kv->o.plain_attention = o ? o->plain_attention : 0;
    if (o && (o->chunk < 0 || o->history < 0))
        return ps_fail(err, "KV cache options: chunk %lld and history %lld must be >= 0", (long long)o->chunk, (long long)o->history);
    if (c->kind == PS_ATTN_SELECT && !host)
        return ps_fail(err, "the KV cache of the select attention (attention.kind \"select\") runs on the cpu backend only (this model is on %s)",
                       ps_ctx_backend_name(m->ctx));
    int64_t R = kv->o.chunk, d = c->d_model, nh = c->n_heads, hd = c->head_dim, ks = c->n_kv_heads * hd, dff = c->d_ff,
            V = c->vocab_size, W = c->window > 0 ? c->window : 1, qd = nh * hd, nkv = c->n_kv_heads;
    int64_t nlog = R < 64 ? R : 64;
    int64_t cw = c->kind == PS_ATTN_CHANNEL ? ps_config_v4_series(c) * hd : 0, SL = c->kind == PS_ATTN_CHANNEL ? ps_config_v4_slots(c) : 0;
    /* the step's buffers, one allocation on the model's context */
    int64_t sizes[] = {hd / 2 + 1, hd / 2 + 1, R * cw, R * cw, 2 * SL * hd, R * d, R * d, R * qd, R * ks, R * ks, R * (nh > 1 ? nh : 1) + W, R * qd, R * d, R * d, R * d,
                       R * dff, R * dff, R * dff, R * d, nlog * V + nlog * 2 * d, R * hd / 2 + 1, R * hd / 2 + 1};
    float **ptrs[] = {&kv->ecos, &kv->esin, &kv->ckv, &kv->cz, &kv->calpha, &kv->x, &kv->ln1, &kv->q, &kv->kk, &kv->vv, &kv->rstd, &kv->z, &kv->attn_out, &kv->mid, &kv->ln2,
                      &kv->g, &kv->u, &kv->h, &kv->mlp_out, &kv->logit_rows, &kv->cos_t, &kv->sin_t};
    int n = (int)(sizeof sizes / sizeof sizes[0]);
    /* entry scratch: alpha of both branches [2, nkv, W], the pooled ck, cv [2, ks], a row [ks] (channel: a
     * compressor row [2, c*hd] after one entry [hd]) */
    int64_t ent = 2 * nkv * W + 3 * ks, ent_ch = hd + 2 * cw;
    if (ent_ch > ent) ent = ent_ch;
    int64_t tot = ent;
    for (int i = 0; i < n; i++) tot += sizes[i];
    kv->scratch_floats = tot;
    if (!(kv->scratch = ps_buf_alloc(kv->ctx, tot * (int64_t)sizeof(float), "the KV cache's step buffers", err))) return -1;
    float *p = kv->scratch;
    for (int i = 0; i < n; i++) {
        *ptrs[i] = p;
        p += sizes[i];
    }
    kv->ent = p;
    /* host arrays: what the host computes and stages for the ops (RoPE rows; on a host-visible context the
     * buffers themselves), the entries each row sees, the closing windows, the page tables of kv_attend */
    int64_t hsz = host ? 0 : 2 * (hd / 2 + 1) + 2 * (R * hd / 2 + 1);
    kv->hscratch = hsz ? malloc((size_t)hsz * sizeof(float)) : NULL;
    if (hsz && !kv->hscratch) {
        ps_kvcache_free(kv);
        return ps_fail(err, "out of memory for the KV cache's host buffers");
    }
    kv->hecos = host ? kv->ecos : kv->hscratch;
    kv->hesin = host ? kv->esin : kv->hecos + hd / 2 + 1;
    kv->hcos_t = host ? kv->cos_t : kv->hesin + hd / 2 + 1;
    kv->hsin_t = host ? kv->sin_t : kv->hcos_t + R * hd / 2 + 1;
    kv->nvis = malloc((size_t)(R * nkv) * sizeof *kv->nvis);
    kv->ckp = malloc((size_t)(2 * nkv) * sizeof *kv->ckp);
    if (!kv->nvis || !kv->ckp || !(kv->cstart = malloc((size_t)(2 * nkv) * sizeof *kv->cstart))) {
        ps_kvcache_free(kv);
        return ps_fail(err, "out of memory for the KV cache's tables");
    }
    return 0;
}

ps_kv_seq *ps_kvcache_seq(ps_kvcache *kv, int seq, ps_error *err) {
    if (seq < 0 || seq >= kv->n_seq || !kv->seqs[seq].live) {
        ps_fail(err, "KV cache: no sequence %d", seq);
        return NULL;
    }
    return &kv->seqs[seq];
}

static int seq_slot(ps_kvcache *kv, ps_error *err) {
    for (int s = 0; s < kv->n_seq; s++)
        if (!kv->seqs[s].live) return s;
    if (kv->n_seq == kv->cap_seq) {
        int cap = kv->cap_seq ? 2 * kv->cap_seq : 8;
        ps_kv_seq *ns = realloc(kv->seqs, (size_t)cap * sizeof *ns);
        if (!ns) return ps_fail(err, "out of memory for %d KV cache sequences", cap);
        kv->seqs = ns;
        kv->cap_seq = cap;
    }
    memset(&kv->seqs[kv->n_seq], 0, sizeof kv->seqs[0]);
    return kv->n_seq++;
}

static int model_add(ps_kvcache *kv, ps_error *err) {
    const ps_config *c = &kv->m->cfg;
    int s = seq_slot(kv, err);
    if (s < 0) return -1;
    ps_kv_seq *q = &kv->seqs[s];
    memset(q, 0, sizeof *q);
    int64_t ch = c->kind == PS_ATTN_CHANNEL, ks = ch ? c->head_dim : c->n_kv_heads * c->head_dim, ne = entry_heads(c);
    /* the open windows' inputs: the layer input (grid, chunks) or the compressor's kv and gate rows (channel) */
    int64_t aw = ch ? 2 * ps_config_v4_series(c) * c->head_dim : c->d_model;
    if (!(q->layers = calloc((size_t)c->n_layers, sizeof *q->layers))) return ps_fail(err, "out of memory for a KV cache sequence");
    q->live = true;
    /* rows that slide out of a window (raw rows of a local window, the open windows' inputs, the tokens of
     * content chunks) in small pages, so that what is held stays close to the window; the rest in pages of
     * PS_KV_PAGE_ROWS */
    int64_t slide = ne ? PS_KV_SLIDE_ROWS : PS_KV_PAGE_ROWS;
    rows_init_host(&q->tok, 1, PS_KV_SLIDE_ROWS);
    rows_init_host(&q->cend, 2, PS_KV_PAGE_ROWS);
    for (int64_t l = 0; l < c->n_layers; l++) {
        ps_kv_layer *L = &q->layers[l];
        rows_init(&L->k, ks, slide);
        rows_init(&L->v, ks, slide);
        rows_init(&L->ln, aw, PS_KV_SLIDE_ROWS);
        if (c->kind == PS_ATTN_SELECT) {
            if (!(L->k1 = calloc(2, sizeof *L->k1))) {
                seq_free(kv, q);
                return ps_fail(err, "out of memory for a KV cache sequence");
            }
            L->k2 = L->k1 + 1;
            rows_init(L->k1, ks, PS_KV_PAGE_ROWS);
            rows_init(L->k2, ks, PS_KV_PAGE_ROWS);
        }
        if (!ne) continue;
        L->ck = calloc((size_t)ne, sizeof *L->ck);
        L->cv = calloc((size_t)ne, sizeof *L->cv);
        if (!L->ck || !L->cv) {
            seq_free(kv, q);
            return ps_fail(err, "out of memory for a KV cache sequence");
        }
        for (int64_t g = 0; g < ne; g++) {
            rows_init(&L->ck[g], c->head_dim, PS_KV_PAGE_ROWS);
            rows_init(&L->cv[g], c->head_dim, PS_KV_PAGE_ROWS);
        }
    }
    return s;
}

static int model_fork(ps_kvcache *kv, int src, ps_error *err) {
    const ps_config *c = &kv->m->cfg;
    if (!ps_kvcache_seq(kv, src, err)) return -1;
    int s = ps_kvcache_add(kv, err);
    if (s < 0) return -1;
    ps_kv_seq *a = &kv->seqs[src], *b = &kv->seqs[s]; /* (add may have moved the table: take both after it) */
    int rc = 0;
    b->T = a->T;
    b->chunk_start = a->chunk_start;
    rows_free(kv, &b->tok);
    rows_free(kv, &b->cend);
    rc |= rows_fork(&b->tok, &a->tok) | rows_fork(&b->cend, &a->cend);
    for (int64_t l = 0; l < c->n_layers; l++) {
        ps_kv_layer *A = &a->layers[l], *B = &b->layers[l];
        rc |= rows_fork(&B->k, &A->k) | rows_fork(&B->v, &A->v) | rows_fork(&B->ln, &A->ln);
        if (A->k1) rc |= rows_fork(B->k1, A->k1) | rows_fork(B->k2, A->k2);
        for (int64_t g = 0; A->ck && g < entry_heads(c); g++) rc |= rows_fork(&B->ck[g], &A->ck[g]) | rows_fork(&B->cv[g], &A->cv[g]);
    }
    if (rc) {
        ps_kvcache_drop(kv, s);
        return ps_fail(err, "out of memory forking KV cache sequence %d", src);
    }
    return s;
}

static void model_drop(ps_kvcache *kv, int seq) {
    if (seq >= 0 && seq < kv->n_seq && kv->seqs[seq].live) seq_free(kv, &kv->seqs[seq]);
}

/* Entries of KV head g in layer l (its grid offset) that have ended by position t (t = -1: none). */
static int64_t grid_entries(const ps_config *c, int64_t l, int64_t g, int64_t t) {
    if (t < 0) return 0;
    return ps_windows_seen_at(t, ps_config_grid_offset(c, l, g), c->window, c->stride, INT64_MAX);
}

static int model_truncate(ps_kvcache *kv, int seq, int64_t T, ps_error *err) {
    const ps_config *c = &kv->m->cfg;
    ps_kv_seq *q = ps_kvcache_seq(kv, seq, err);
    if (!q) return -1;
    if (T < 0 || T > q->T)
        return ps_fail(err, "truncating sequence %d of %lld tokens to %lld: must be in [0, %lld]", seq, (long long)q->T, (long long)T,
                       (long long)q->T);
    if (T == q->T) return 0;
    int comp = c->kind == PS_ATTN_COMPRESSED, content = comp && c->boundaries == PS_BOUNDARIES_CONTENT,
        chn = c->kind == PS_ATTN_CHANNEL;
    if (comp || chn) {
        ps_kv_layer *L = &q->layers[0];
        int64_t need_k = T - (c->local_window - 1), need_a = T - (chn ? ps_config_v4_slots(c) - 1 : c->window - 1);
        if ((need_k > 0 && need_k < L->k.base) || (need_a > 0 && need_a < L->ln.base) || (content && T > 0 && T - 1 < q->tok.base))
            return ps_fail(err,
                           "truncating sequence %d from %lld to %lld tokens: the cache no longer holds the local window and open windows of position %lld (it keeps %lld positions of history: ps_kvcache_opts.history)",
                           seq, (long long)q->T, (long long)T, (long long)T, (long long)kv->o.history);
    }
    int64_t nc = 0;
    if (content) {
        while (nc < q->cend.rows && rows_i64(&q->cend, nc) <= T - 1) nc++;
        rows_truncate(kv, &q->cend, nc);
        q->chunk_start = nc ? rows_i64(&q->cend, nc - 1) + 1 : 0;
        rows_truncate(kv, &q->tok, T);
    }
    for (int64_t l = 0; l < c->n_layers; l++) {
        ps_kv_layer *L = &q->layers[l];
        rows_truncate(kv, &L->k, T);
        if (chn) { /* K = V: no v rows; the entries of every window of rate tokens that has ended */
            rows_truncate(kv, &L->ln, T);
            rows_truncate(kv, &L->ck[0], T / c->rate);
            continue;
        }
        rows_truncate(kv, &L->v, T);
        if (c->kind == PS_ATTN_SELECT) { /* the pooled keys of the windows that still complete in T tokens */
            rows_truncate(kv, L->k1, ps_select_n_windows(T, c->window, c->stride));
            rows_truncate(kv, L->k2, ps_select_n_windows(T, 4 * c->window, 4 * c->stride));
        }
        if (!comp) continue;
        rows_truncate(kv, &L->ln, T);
        for (int64_t g = 0; g < c->n_kv_heads; g++) {
            int64_t n = content ? nc : grid_entries(c, l, g, T - 1);
            rows_truncate(kv, &L->ck[g], n);
            rows_truncate(kv, &L->cv[g], n);
        }
    }
    q->T = T;
    return 0;
}

/* ---- the cache as hook points: read and edit entries ---- */

int ps_kvcache_point_parse(const ps_config *c, const char *name, int *layer, int *value, ps_error *err) {
    int l, off = 0;
    char what[16];
    if (sscanf(name, "blocks.%d.attn.%15[a-z_]%n", &l, what, &off) != 2 || name[off] != '\0' ||
        (strcmp(what, "cache_ck") && strcmp(what, "cache_cv")))
        return ps_fail(err, "\"%s\" is not a cache point: expected blocks.{l}.attn.cache_ck or blocks.{l}.attn.cache_cv", name);
    if (l < 0 || l >= c->n_layers)
        return ps_fail(err, "\"%s\": layer %d is outside the model's %lld layers", name, l, (long long)c->n_layers);
    if (c->kind == PS_ATTN_FULL) return ps_fail(err, "\"%s\": a full-attention model has no compressed entries in its cache", name);
    if (c->kind == PS_ATTN_SELECT)
        return ps_fail(err, "\"%s\": a select-attention model's cache has no entries to read or edit (its pooled keys only choose blocks: hook blocks.{l}.attn.hook_ck)", name);
    if (c->kind == PS_ATTN_CHANNEL && !strcmp(what, "cache_cv"))
        return ps_fail(err, "\"%s\": the channel attention's entries are keys and values at once (K = V): use cache_ck", name);
    *layer = l;
    *value = !strcmp(what, "cache_cv");
    return 0;
}

static int entry_check(const ps_kvcache *kv, int l, int g, int value, ps_error *err) {
    const ps_config *c = &kv->m->cfg;
    if (c->kind == PS_ATTN_FULL) return ps_fail(err, "KV cache entries: a full-attention model has no compressed entries");
    if (c->kind == PS_ATTN_SELECT)
        return ps_fail(err, "KV cache entries: a select-attention model's cache has no entries to read or edit (its pooled keys only choose blocks)");
    if (l < 0 || l >= c->n_layers) return ps_fail(err, "KV cache entries: layer %d is outside the model's %lld layers", l, (long long)c->n_layers);
    if (g < 0 || g >= entry_heads(c)) return ps_fail(err, "KV cache entries: KV head %d is outside the model's %lld", g, (long long)entry_heads(c));
    if (value != 0 && value != 1) return ps_fail(err, "KV cache entries: value must be 0 (cache_ck) or 1 (cache_cv)");
    if (value == 1 && c->kind == PS_ATTN_CHANNEL)
        return ps_fail(err, "KV cache entries: the channel attention's entries are keys and values at once (K = V): use cache_ck");
    return 0;
}

static int64_t model_n_entries(const ps_kvcache *kv, int seq, int l, int g) {
    if (seq < 0 || seq >= kv->n_seq || !kv->seqs[seq].live || entry_check(kv, l, g, 0, NULL)) return 0;
    return kv->seqs[seq].layers[l].ck[g].rows;
}

static int model_entry(const ps_kvcache *kv, int seq, int l, int g, int value, int64_t j, float *out, ps_error *err) {
    if (entry_check(kv, l, g, value, err)) return -1;
    if (seq < 0 || seq >= kv->n_seq || !kv->seqs[seq].live) return ps_fail(err, "KV cache: no sequence %d", seq);
    const ps_kv_rows *r = value ? &kv->seqs[seq].layers[l].cv[g] : &kv->seqs[seq].layers[l].ck[g];
    if (j < 0 || j >= r->rows)
        return ps_fail(err, "blocks.%d.attn.%s: sequence %d holds entries 0..%lld of KV head %d, not %lld", l, value ? "cache_cv" : "cache_ck",
                       seq, (long long)r->rows - 1, g, (long long)j);
    return ps_buf_to_host(kv->ctx, out, rows_at(r, j), r->width * (int64_t)sizeof(float), err);
}

void ps_kvcache_edit_apply(const ps_kv_edit *e, float *row, int64_t d) {
    if (e->kind == PS_KV_EDIT_ZERO) memset(row, 0, (size_t)d * sizeof(float));
    else memcpy(row, e->vec, (size_t)d * sizeof(float));
}

const ps_kv_edit *ps_kvcache_edit_push(ps_kvcache *kv, int seq, int l, int g, int value, int64_t j, ps_kv_edit_kind kind,
                                       const float *vec, int64_t d, const char *point, ps_error *err) {
    if (j < 0) {
        ps_fail(err, "%s: entry %lld must be >= 0", point, (long long)j);
        return NULL;
    }
    if (kind != PS_KV_EDIT_ZERO && kind != PS_KV_EDIT_SET) {
        ps_fail(err, "KV cache edit: unknown kind %d", (int)kind);
        return NULL;
    }
    if (kind == PS_KV_EDIT_SET && !vec) {
        ps_fail(err, "KV cache edit: SET needs a vector of %lld floats", (long long)d);
        return NULL;
    }
    if (seq != -1 && !ps_kvcache_seq(kv, seq, err)) return NULL;
    ps_kv_edit *ne = realloc(kv->edits, (size_t)(kv->n_edits + 1) * sizeof *ne);
    if (!ne) {
        ps_fail(err, "out of memory for a KV cache edit");
        return NULL;
    }
    kv->edits = ne;
    ps_kv_edit *e = &kv->edits[kv->n_edits];
    *e = (ps_kv_edit){.layer = l, .head = g, .value = value, .entry = j, .seq = seq, .kind = kind, .vec = NULL};
    if (kind == PS_KV_EDIT_SET) {
        if (!(e->vec = malloc((size_t)d * sizeof(float)))) {
            ps_fail(err, "out of memory for a KV cache edit");
            return NULL;
        }
        memcpy(e->vec, vec, (size_t)d * sizeof(float));
    }
    kv->n_edits++;
    return e;
}

static int model_edit(ps_kvcache *kv, int seq, int l, int g, int value, int64_t j, ps_kv_edit_kind kind, const float *vec,
                      ps_error *err) {
    const ps_config *c = &kv->m->cfg;
    int64_t hd = c->head_dim;
    if (entry_check(kv, l, g, value, err)) return -1;
    char point[64];
    snprintf(point, sizeof point, "blocks.%d.attn.%s", l, value ? "cache_cv" : "cache_ck");
    const ps_kv_edit *e = ps_kvcache_edit_push(kv, seq, l, g, value, j, kind, vec, hd, point, err);
    if (!e) return -1;
    for (int s = 0; s < kv->n_seq; s++) {
        if (!kv->seqs[s].live || (seq != -1 && s != seq)) continue;
        ps_kv_rows *r = value ? &kv->seqs[s].layers[l].cv[g] : &kv->seqs[s].layers[l].ck[g];
        if (j >= r->rows) continue;
        float *row = rows_mut(kv, r, j);
        if (!row) return page_fail(kv, err, "out of memory editing a KV cache entry");
        if (edit_apply_buf(kv, e, row, hd, err)) return -1;
    }
    return 0;
}

/* ---- append ---- */

/* RoPE cos/sin of position p: the formula of the backend's rope table (angles in double). */
static void rope_row(float *cs, float *sn, int64_t p, int64_t hd, double theta) {
    for (int64_t i = 0; i < hd / 2; i++) {
        double f = pow(theta, -2.0 * (double)i / (double)hd), ang = (double)p * f;
        cs[i] = (float)cos(ang);
        sn[i] = (float)sin(ang);
    }
}

/* out[M, N] (= or +=) inp[M, K] · w[N, K]^T: the backend's ps_matmul, except one row on a backend whose
 * matmul is the CPU's (cpu, and the test backend cpu-staged, whose buffers are host memory it calls not
 * host-visible: the same bits on both), which is cblas_sgemv (a decode step of one sequence): OpenBLAS
 * 0.3.21's sgemm packs the whole weight matrix even for one row — measured 2.5-3.4x the CPU time of sgemv
 * on the Qwen3-0.6B shape's logits head [151936, 1024] and MLP matrices [3072, 1024]. */
static int kv_matmul(ps_kvcache *kv, float *out, const float *inp, const float *w, int64_t M, int64_t K, int64_t N, int accumulate) {
    if (M == 1 && K > 0 && N > 0 && kv->ctx->be->ops.matmul == ps_backend_cpu.ops.matmul && !kv->ctx->failed) {
        ps_op_open(kv->ctx); /* it runs as an op: cpu-staged's buffers are reachable only inside one */
        cblas_sgemv(CblasRowMajor, CblasNoTrans, (blasint)N, (blasint)K, 1.0f, w, (blasint)K, inp, 1, accumulate ? 1.0f : 0.0f, out, 1);
        return ps_op_close(kv->ctx, 0);
    }
    return ps_matmul(kv->ctx, out, inp, w, M, K, N, accumulate);
}

typedef struct {
    int seq;       /* sequence id */
    int64_t t0, n; /* positions [t0, t0 + n) */
    int64_t r0;    /* first row of the step */
    int64_t out;   /* logits row of its first position (all rows), or the sequence's index (last_only) */
    bool last;     /* holds the sequence's last new token */
    int64_t tend;  /* the sequence's length at the end of the append (select: it decides dense or sparse, and the blocks) */
} kv_piece;

#define FIRE_P(pt, data, nd, ...)                                                            \
    do {                                                                                     \
        if (ps_hooks_on(hooks, l, pt)) {                                                     \
            int64_t shp_[4] = {__VA_ARGS__};                                                 \
            if (ps_hooks_fire(ctx, hooks, l, pt, (data), (nd), shp_, err)) return -1;       \
        }                                                                                    \
    } while (0)

#define CK(expr)                                                                             \
    do {                                                                                     \
        if (expr) return ps_ctx_check(ctx, err);                                             \
    } while (0)

/* RoPE cos/sin of n rows computed on the host (hc, hs) into the buffers dc, ds (the same memory on a
 * host-visible context). */
static int rope_upload(ps_kvcache *kv, float *dc, float *ds, const float *hc, const float *hs, int64_t n, ps_error *err) {
    if (dc == hc) return 0;
    return ps_buf_from_host(kv->ctx, dc, hc, n * (int64_t)sizeof(float), err) ||
           ps_buf_from_host(kv->ctx, ds, hs, n * (int64_t)sizeof(float), err);
}

/* The entries of layer l that close at position t of sequence q (row r of the step): the gates, payloads
 * and pooling of every KV head with a window ending there (start[g], len[g]; start -1: none; the backend's
 * kv_gate and kv_pool), the norm and RoPE of the keys, hooks, edits, and the push into the pages. pre_k,
 * pre_v: the window's payloads [W, nkv*hd] when computed already (a batch of windows: payloads_batched),
 * else NULL (kv_pool computes them). */
static int close_entries(ps_kvcache *kv, ps_kv_seq *q, int seq, int l, int64_t t, const int64_t *start, const int64_t *len,
                         const float *pre_k, const float *pre_v, const ps_hooks *hooks, ps_error *err) {
    const ps_model *m = kv->m;
    const ps_config *c = &m->cfg;
    ps_ctx *ctx = kv->ctx;
    ps_layer_params w = ps_model_layer(m, m->params, l);
    ps_kv_layer *L = &q->layers[l];
    int64_t nkv = c->n_kv_heads, hd = c->head_dim, ks = nkv * hd, W = c->window, d = c->d_model;
    int learned = c->gate == PS_GATE_LEARNED, shared = c->payload == PS_PAYLOAD_SHARED;
    float *ga_k = kv->ent, *ga_v = ga_k + nkv * W, *ck = ga_v + nkv * W, *cv = ck + ks;
    ps_kv_close win = {.nkv = nkv, .W = W, .d = d, .ln = rows_view(&L->ln), .start = start, .len = len};
    int64_t j = -1;
    for (int64_t g = 0; g < nkv; g++)
        if (start[g] >= 0) j = L->ck[g].rows;
    CK(ps_kv_gate(ctx, ga_k, w.key_gate_w, w.key_gate_b, learned, &win) ||
       ps_kv_gate(ctx, ga_v, w.value_gate_w, w.value_gate_b, learned, &win));
    kv->ev.t0 = t;
    kv->ev.entry = j; /* heads closing together share the index (one grid); staggered heads close alone */
    FIRE_P(PS_HOOK_GATE_K, ga_k, 4, 1, 1, nkv, W);
    FIRE_P(PS_HOOK_GATE_V, ga_v, 4, 1, 1, nkv, W);
    CK(ps_kv_pool(ctx, ck, ga_k, w.key_payload, shared, pre_k, hd, &win) ||
       ps_kv_pool(ctx, cv, ga_v, w.value_payload, shared, pre_v, hd, &win));
    for (int64_t g = 0; g < nkv; g++) {
        if (start[g] < 0) continue;
        float *k = ck + g * hd;
        if (c->qk_norm) CK(ps_rmsnorm(ctx, k, NULL, k, w.knorm, 1, hd, (float)c->rms_eps));
        if (c->rope) {
            rope_row(kv->hecos, kv->hesin, start[g], hd, c->rope_theta);
            if (rope_upload(kv, kv->ecos, kv->esin, kv->hecos, kv->hesin, hd / 2, err)) return -1;
            CK(ps_rope(ctx, k, kv->ecos, kv->esin, 1, 1, 1, hd, 1));
        }
    }
    FIRE_P(PS_HOOK_CK, ck, 4, 1, 1, nkv, hd);
    FIRE_P(PS_HOOK_CV, cv, 4, 1, 1, nkv, hd);
    for (int64_t g = 0; g < nkv; g++) {
        if (start[g] < 0) continue;
        int64_t jg = L->ck[g].rows;
        for (int i = 0; i < kv->n_edits; i++) {
            const ps_kv_edit *e = &kv->edits[i];
            if (e->layer == l && e->head == g && e->entry == jg && (e->seq == -1 || e->seq == seq) &&
                edit_apply_buf(kv, e, (e->value ? cv : ck) + g * hd, hd, err))
                return -1;
        }
        if (rows_push(kv, &L->ck[g], ck + g * hd) || rows_push(kv, &L->cv[g], cv + g * hd))
            return page_fail(kv, err, "out of memory for the KV cache's compressed entries");
    }
    return 0;
}

/* Whether a piece of nr rows attends blocked (attend_blocked): long enough, a grid kind (full, compressed,
 * staggered, content chunks), and not the per-row reference by request. */
static int blocked_fits(const ps_kvcache *kv, int64_t nr) {
    return !kv->o.plain_attention && nr >= PS_KV_BLOCKED_MIN && kv->m->cfg.kind != PS_ATTN_CHANNEL;
}

/* Room for the windows closing in a piece of n rows (every KV head together): their end, start and length,
 * and their payloads [2, W, nkv*hd] each, with one offset's gathered inputs and products. */
static int events_reserve(ps_kvcache *kv, int64_t n, ps_error *err) {
    const ps_config *c = &kv->m->cfg;
    int64_t W = c->window, ks = c->n_kv_heads * c->head_dim, need = n * 2 * W * ks + n * c->d_model + n * ks;
    if (n > kv->ev_cap) {
        int64_t *a = realloc(kv->ev_t, (size_t)(4 * n) * sizeof *a);
        if (!a) return ps_fail(err, "out of memory for the windows closing in an append of %lld rows", (long long)n);
        kv->ev_t = a, kv->ev_start = a + n, kv->ev_len = a + 2 * n, kv->ev_rows = a + 3 * n, kv->ev_cap = n;
    }
    if (need > kv->ev_pay_cap) {
        if (kv->ev_pay) ps_buf_free(kv->ctx, kv->ev_pay, kv->ev_pay_cap * (int64_t)sizeof(float));
        kv->ev_pay = NULL, kv->ev_pay_cap = 0;
        if (!(kv->ev_pay = ps_buf_alloc(kv->ctx, need * (int64_t)sizeof(float), "the payloads of the windows closing in an append", err)))
            return -1;
        kv->ev_pay_cap = need;
    }
    return 0;
}

/* The payloads of the nev windows recorded (kv->ev_start, ev_len) of layer l, both branches, into
 * kv->ev_pay [nev, 2, W, nkv*hd]: per offset i, one matrix product of the windows' inputs at offset i
 * ([m, d], the windows longer than i, gathered from the pages) with C_i ([nkv*hd, d]; shared payloads: C)
 * — what kv_pool computes per window with dot products, here with each C_i read once for the batch. */
static int payloads_batched(ps_kvcache *kv, const ps_kv_layer *L, int l, int64_t nev, ps_error *err) {
    const ps_model *m = kv->m;
    const ps_config *c = &m->cfg;
    ps_ctx *ctx = kv->ctx;
    ps_layer_params w = ps_model_layer(m, m->params, l);
    int64_t W = c->window, d = c->d_model, ks = c->n_kv_heads * c->head_dim;
    int shared = c->payload == PS_PAYLOAD_SHARED;
    float *A = kv->ev_pay + nev * 2 * W * ks, *O = A + nev * d;
    ps_kv_pages ln = rows_view(&L->ln);
    int64_t *rows = kv->ev_rows;
    for (int64_t i = 0; i < W; i++) {
        int64_t mi = 0;
        for (int64_t e = 0; e < nev; e++)
            if (kv->ev_len[e] > i) rows[mi++] = kv->ev_start[e] + i;
        if (!mi) continue;
        CK(ps_kv_gather(ctx, A, &ln, rows, mi));
        for (int br = 0; br < 2; br++) {
            const float *C = br ? w.value_payload : w.key_payload;
            CK(kv_matmul(kv, O, A, shared ? C : C + i * ks * d, mi, d, ks, 0));
            int64_t k = 0; /* O's row k goes to row (e·2 + br)·W + i of ev_pay ([*, ks]) */
            for (int64_t e = 0; e < nev; e++)
                if (kv->ev_len[e] > i) rows[k++] = (e * 2 + br) * W + i;
            CK(ps_scatter_rows(ctx, kv->ev_pay, O, rows, k, ks));
        }
    }
    (void)err;
    return 0;
}

/* Layer l's queries, keys and values of the step's rows (kv->q, kk, vv: norm, products, qk-norm, RoPE at
 * each row's position), and the hooks q, k, v per piece. */
static int qkv_rows(ps_kvcache *kv, int l, const kv_piece *P, int np, int64_t R, const ps_hooks *hooks, ps_error *err) {
    const ps_model *m = kv->m;
    const ps_config *c = &m->cfg;
    ps_ctx *ctx = kv->ctx;
    ps_layer_params w = ps_model_layer(m, m->params, l);
    int64_t d = c->d_model, nh = c->n_heads, nkv = c->n_kv_heads, hd = c->head_dim, ks = nkv * hd, qd = nh * hd;
    float eps = (float)c->rms_eps;
    CK(ps_rmsnorm(ctx, kv->ln1, NULL, kv->x, w.in_norm, R, d, eps) || kv_matmul(kv, kv->q, kv->ln1, w.wq, R, d, qd, 0) ||
       kv_matmul(kv, kv->kk, kv->ln1, w.wk, R, d, ks, 0) || kv_matmul(kv, kv->vv, kv->ln1, w.wv, R, d, ks, 0));
    if (c->qk_norm)
        CK(ps_rmsnorm(ctx, kv->q, NULL, kv->q, w.qnorm, R * nh, hd, eps) || ps_rmsnorm(ctx, kv->kk, NULL, kv->kk, w.knorm, R * nkv, hd, eps));
    if (c->rope) {
        for (int i = 0; i < np; i++)
            for (int64_t r = 0; r < P[i].n; r++)
                rope_row(kv->hcos_t + (P[i].r0 + r) * (hd / 2), kv->hsin_t + (P[i].r0 + r) * (hd / 2), P[i].t0 + r, hd, c->rope_theta);
        if (rope_upload(kv, kv->cos_t, kv->sin_t, kv->hcos_t, kv->hsin_t, R * (hd / 2), err)) return -1;
        CK(ps_rope(ctx, kv->q, kv->cos_t, kv->sin_t, 1, R, nh, hd, 1) || ps_rope(ctx, kv->kk, kv->cos_t, kv->sin_t, 1, R, nkv, hd, 1));
    }
    for (int i = 0; i < np; i++) {
        kv->ev = (ps_kv_event){.seq = P[i].seq, .t0 = P[i].t0, .entry = -1};
        FIRE_P(PS_HOOK_Q, kv->q + P[i].r0 * qd, 4, 1, P[i].n, nh, hd);
        FIRE_P(PS_HOOK_K, kv->kk + P[i].r0 * ks, 4, 1, P[i].n, nkv, hd);
        FIRE_P(PS_HOOK_V, kv->vv + P[i].r0 * ks, 4, 1, P[i].n, nkv, hd);
    }
    return 0;
}

/* Layer l's attention over the step's rows, full or compressed (grid, staggered grid, content chunks): from
 * kv->x to kv->z, the new rows entering the cache. */
static int attn_grid(ps_kvcache *kv, int l, const kv_piece *P, int np, int64_t R, const int64_t *chunk_len, const ps_hooks *hooks,
                     ps_error *err) {
    const ps_model *m = kv->m;
    const ps_config *c = &m->cfg;
    ps_ctx *ctx = kv->ctx;
    int comp = c->kind == PS_ATTN_COMPRESSED, content = comp && c->boundaries == PS_BOUNDARIES_CONTENT;
    int64_t d = c->d_model, nh = c->n_heads, nkv = c->n_kv_heads, hd = c->head_dim, ks = nkv * hd, qd = nh * hd, W = c->window,
            S = c->stride;
    if (qkv_rows(kv, l, P, np, R, hooks, err)) return -1;
    int64_t *start = kv->cstart, *len = kv->cstart + nkv;
    for (int i = 0; i < np; i++) {
        ps_kv_seq *q = &kv->seqs[P[i].seq];
        ps_kv_layer *L = &q->layers[l];
        kv->ev = (ps_kv_event){.seq = P[i].seq, .t0 = P[i].t0, .entry = -1};
        /* the rows enter the cache in order, and the windows closing at each position are pooled (a long
         * piece of the base grid or content chunks: after its rows, their payloads in matrix products) ... */
        int defer = comp && !c->any_head_offset && blocked_fits(kv, P[i].n);
        int64_t nev = 0;
        if (defer && events_reserve(kv, P[i].n, err)) return -1;
        for (int64_t r = P[i].r0; r < P[i].r0 + P[i].n; r++) {
            int64_t t = P[i].t0 + (r - P[i].r0);
            if (rows_push(kv, &L->k, kv->kk + r * ks) || rows_push(kv, &L->v, kv->vv + r * ks) ||
                (comp && rows_push(kv, &L->ln, kv->ln1 + r * d)))
                return page_fail(kv, err, "out of memory for the KV cache's pages");
            if (comp) {
                int any = 0;
                for (int64_t g = 0; g < nkv; g++) {
                    start[g] = -1;
                    if (content) {
                        if (chunk_len[r]) start[g] = t - chunk_len[r] + 1, len[g] = chunk_len[r];
                    } else {
                        int64_t off = ps_config_grid_offset(c, l, g), u = t - off - W + 1; /* = jS for window j (layer l's grid) */
                        if (u >= 0 && u % S == 0) start[g] = u + off, len[g] = W;
                    }
                    any |= start[g] >= 0;
                }
                if (any && defer) { /* every KV head closes the same window here: pooled after the piece's rows */
                    kv->ev_start[nev] = start[0], kv->ev_len[nev] = len[0], kv->ev_t[nev] = t;
                    nev++;
                } else if (any && close_entries(kv, q, P[i].seq, l, t, start, len, NULL, NULL, hooks, err))
                    return -1;
                kv->ev = (ps_kv_event){.seq = P[i].seq, .t0 = P[i].t0, .entry = -1};
                for (int64_t g = 0; g < nkv; g++) kv->nvis[r * nkv + g] = L->ck[g].rows + nev; /* what query t sees */
            }
        }
        if (nev > 0) {
            if (payloads_batched(kv, L, l, nev, err)) return -1;
            for (int64_t e = 0; e < nev; e++) {
                for (int64_t g = 0; g < nkv; g++) start[g] = kv->ev_start[e], len[g] = kv->ev_len[e];
                const float *pk = kv->ev_pay + e * 2 * W * ks;
                if (close_entries(kv, q, P[i].seq, l, kv->ev_t[e], start, len, pk, pk + W * ks, hooks, err)) return -1;
                kv->ev = (ps_kv_event){.seq = P[i].seq, .t0 = P[i].t0, .entry = -1};
            }
        }
        /* ... then every row's query attends to what existed at its position: the backend's kv_attend over the
         * page lists (the CPU: per row, or blocked over a gathered frame for a long piece) */
        int64_t t1 = P[i].t0 + P[i].n, r0 = P[i].r0, nr = P[i].n;
        ps_kv_pages *ckp = kv->ckp, *cvp = kv->ckp + nkv;
        for (int64_t g = 0; comp && g < nkv; g++) ckp[g] = rows_view(&L->ck[g]), cvp[g] = rows_view(&L->cv[g]);
        ps_kv_attn a = {.nh = nh, .nkv = nkv, .hd = hd, .compressed = comp, .LW = comp ? c->local_window : 0, .t0 = P[i].t0,
                        .nr = nr, .nvis = comp ? kv->nvis + r0 * nkv : NULL, .k = rows_view(&L->k), .v = rows_view(&L->v),
                        .ck = comp ? ckp : NULL, .cv = comp ? cvp : NULL, .blocked = blocked_fits(kv, nr)};
        CK(ps_kv_attend(ctx, kv->z + r0 * qd, kv->q + r0 * qd, &a));
        kv->n_blocked += a.blocked;
        if (comp) {
            rows_drop_front(kv, &L->k, t1 - (c->local_window - 1) - kv->o.history);
            rows_drop_front(kv, &L->v, t1 - (c->local_window - 1) - kv->o.history);
            rows_drop_front(kv, &L->ln, t1 - (W - 1) - kv->o.history);
        }
    }
    return 0;
}

/* The channel attention's entry of window wi (rate m tokens) of layer l, closing now: per channel, a softmax
 * over the slots of (gate + position bias), the pooled kv rows, the norm, RoPE at wi·m (ps_forward's
 * v4_layer_pre on one window: ps_v4_comp_slots, ps_v4_slot_softmax, ps_v4_comp_pool term for term). */
static int close_channel(ps_kvcache *kv, ps_kv_seq *q, int seq, int l, int64_t t, int64_t wi, const ps_hooks *hooks, ps_error *err) {
    const ps_model *m = kv->m;
    const ps_config *c = &m->cfg;
    ps_ctx *ctx = kv->ctx;
    ps_layer_params w = ps_model_layer(m, m->params, l);
    ps_kv_layer *L = &q->layers[l];
    int64_t hd = c->head_dim, mr = c->rate, SL = ps_config_v4_slots(c);
    float *al = kv->calpha + SL * hd, *ck = kv->ent;
    ps_kv_chan sl = {.hd = hd, .rate = mr, .cw = ps_config_v4_series(c) * hd, .csa = c->v4_mode == PS_V4_MODE_CSA, .wi = wi,
                      .ln = rows_view(&L->ln)};
    CK(ps_kv_slots(ctx, al, w.c_ape, &sl));
    kv->ev.t0 = t;
    kv->ev.entry = wi;
    FIRE_P(PS_HOOK_GATE_K, al, 4, 1, 1, SL, hd);
    CK(ps_kv_slot_pool(ctx, ck, al, &sl));
    CK(ps_rmsnorm(ctx, ck, NULL, ck, w.c_norm, 1, hd, (float)c->rms_eps));
    if (c->rope) {
        rope_row(kv->hecos, kv->hesin, wi * mr, hd, c->rope_theta);
        if (rope_upload(kv, kv->ecos, kv->esin, kv->hecos, kv->hesin, hd / 2, err)) return -1;
        CK(ps_rope(ctx, ck, kv->ecos, kv->esin, 1, 1, 1, hd, 1));
    }
    FIRE_P(PS_HOOK_CK, ck, 4, 1, 1, 1, hd);
    for (int i = 0; i < kv->n_edits; i++) {
        const ps_kv_edit *e = &kv->edits[i];
        if (e->layer == l && e->head == 0 && e->value == 0 && e->entry == wi && (e->seq == -1 || e->seq == seq) &&
            edit_apply_buf(kv, e, ck, hd, err))
            return -1;
    }
    if (rows_push(kv, &L->ck[0], ck)) return page_fail(kv, err, "out of memory for the KV cache's compressed entries");
    return 0;
}

/* Layer l's channel attention (attention.kind "v4") over the step's rows: kv->x to kv->z. */
static int attn_channel(ps_kvcache *kv, int l, const kv_piece *P, int np, int64_t R, const ps_hooks *hooks, ps_error *err) {
    const ps_model *m = kv->m;
    const ps_config *c = &m->cfg;
    ps_ctx *ctx = kv->ctx;
    ps_layer_params w = ps_model_layer(m, m->params, l);
    int64_t d = c->d_model, nh = c->n_heads, hd = c->head_dim, qd = nh * hd, cw = ps_config_v4_series(c) * hd, mr = c->rate,
            SL = ps_config_v4_slots(c);
    float eps = (float)c->rms_eps;
    CK(ps_rmsnorm(ctx, kv->ln1, NULL, kv->x, w.in_norm, R, d, eps) || kv_matmul(kv, kv->q, kv->ln1, w.wq, R, d, qd, 0) ||
       kv_matmul(kv, kv->kk, kv->ln1, w.wk, R, d, hd, 0));
    if (c->qk_norm)
        CK(ps_rmsnorm(ctx, kv->q, NULL, kv->q, w.qnorm, R * nh, hd, eps) || ps_rmsnorm(ctx, kv->kk, NULL, kv->kk, w.knorm, R, hd, eps));
    if (c->rope) {
        for (int i = 0; i < np; i++)
            for (int64_t r = 0; r < P[i].n; r++)
                rope_row(kv->hcos_t + (P[i].r0 + r) * (hd / 2), kv->hsin_t + (P[i].r0 + r) * (hd / 2), P[i].t0 + r, hd, c->rope_theta);
        if (rope_upload(kv, kv->cos_t, kv->sin_t, kv->hcos_t, kv->hsin_t, R * (hd / 2), err)) return -1;
        CK(ps_rope(ctx, kv->q, kv->cos_t, kv->sin_t, 1, R, nh, hd, 1) || ps_rope(ctx, kv->kk, kv->cos_t, kv->sin_t, 1, R, 1, hd, 1));
    }
    for (int i = 0; i < np; i++) {
        kv->ev = (ps_kv_event){.seq = P[i].seq, .t0 = P[i].t0, .entry = -1};
        FIRE_P(PS_HOOK_Q, kv->q + P[i].r0 * qd, 4, 1, P[i].n, nh, hd);
        FIRE_P(PS_HOOK_K, kv->kk + P[i].r0 * hd, 4, 1, P[i].n, 1, hd);
    }
    CK(kv_matmul(kv, kv->ckv, kv->ln1, w.c_wkv, R, d, cw, 0) || kv_matmul(kv, kv->cz, kv->ln1, w.c_wgate, R, d, cw, 0));
    for (int i = 0; i < np; i++) {
        ps_kv_seq *q = &kv->seqs[P[i].seq];
        ps_kv_layer *L = &q->layers[l];
        kv->ev = (ps_kv_event){.seq = P[i].seq, .t0 = P[i].t0, .entry = -1};
        for (int64_t r = P[i].r0; r < P[i].r0 + P[i].n; r++) {
            int64_t t = P[i].t0 + (r - P[i].r0);
            float *row = rows_push(kv, &L->k, kv->kk + r * hd) ? NULL : rows_append(kv, &L->ln); /* the compressor's row: kv, z */
            if (!row || kv_copy(kv, &L->ln, row, kv->ckv + r * cw, cw) || kv_copy(kv, &L->ln, row + cw, kv->cz + r * cw, cw))
                return page_fail(kv, err, "out of memory for the KV cache's pages");
            if ((t + 1) % mr == 0) {
                if (close_channel(kv, q, P[i].seq, l, t, (t + 1) / mr - 1, hooks, err)) return -1;
                kv->ev = (ps_kv_event){.seq = P[i].seq, .t0 = P[i].t0, .entry = -1};
            }
        }
        /* the rows' queries over the sliding window and the entries ended at their positions (the backend's
         * kv_attend_sink; K = V: the raw rows and the entries are both keys and values) */
        int64_t t1 = P[i].t0 + P[i].n, r0 = P[i].r0, nr = P[i].n;
        for (int64_t r = 0; r < nr; r++) kv->nvis[r0 + r] = (P[i].t0 + r + 1) / mr;
        kv->ckp[0] = rows_view(&L->ck[0]);
        ps_kv_attn a = {.nh = nh, .nkv = 1, .hd = hd, .compressed = 1, .LW = c->local_window, .t0 = P[i].t0, .nr = nr,
                        .nvis = kv->nvis + r0, .k = rows_view(&L->k), .v = rows_view(&L->k), .ck = kv->ckp, .cv = kv->ckp};
        CK(ps_kv_attend_sink(ctx, kv->z + r0 * qd, kv->q + r0 * qd, w.sinks, &a));
        rows_drop_front(kv, &L->k, t1 - (c->local_window - 1) - kv->o.history);
        rows_drop_front(kv, &L->ln, t1 - (SL - 1) - kv->o.history);
    }
    if (c->rope) CK(ps_rope_backward(ctx, kv->z, kv->cos_t, kv->sin_t, 1, R, nh, hd, 1));
    return 0;
}

/* ---- the select attention (InfLLM-v2 block selection, core/select.h; CPU only: host pointers) ---- */

/* kv->sel at least n floats (host memory; its old contents are not kept). */
static float *sel_reserve(ps_kvcache *kv, int64_t n, ps_error *err) {
    if (n > kv->sel_cap) {
        free(kv->sel);
        kv->sel_cap = 0;
        if (!(kv->sel = malloc((size_t)n * sizeof(float)))) {
            ps_fail(err, "out of memory for the select attention's working set (%lld floats)", (long long)n);
            return NULL;
        }
        kv->sel_cap = n;
    }
    return kv->sel;
}

/* rows [a, b) of a page list into dst [b - a, width] */
static void rows_gather(float *dst, const ps_kv_rows *r, int64_t a, int64_t b) {
    for (int64_t i = a; i < b; i++) memcpy(dst + (i - a) * r->width, rows_at(r, i), (size_t)r->width * sizeof(float));
}

/* The pooled key of the window of kernel K over positions [start, start + K) of layer l's keys (a mean, by
 * ps_select_compress_forward as the whole forward pools it), its hook (level 1: hook_ck, level 2: hook_ck2; only
 * on the sparse path) and its push. frame: room for K·nkv·hd + nkv·hd floats. */
static int close_select(ps_kvcache *kv, ps_kv_layer *L, ps_kv_rows *dst, int l, int64_t start, int64_t K, ps_hook_point pt, int sparse,
                        int64_t t, float *frame, const ps_hooks *hooks, ps_error *err) {
    const ps_config *c = &kv->m->cfg;
    ps_ctx *ctx = kv->ctx;
    int64_t nkv = c->n_kv_heads, hd = c->head_dim, ks = nkv * hd;
    float *ck = frame + K * ks;
    rows_gather(frame, &L->k, start, start + K);
    ps_select_compress_forward(ck, frame, K, nkv, hd, K, K);
    if (sparse) {
        kv->ev.t0 = t;
        kv->ev.entry = dst->rows;
        FIRE_P(pt, ck, 4, 1, 1, nkv, hd);
    }
    if (rows_push(kv, dst, ck)) return page_fail(kv, err, "out of memory for the KV cache's pooled keys");
    return 0;
}

/* Layer l's select attention over the step's rows: kv->x to kv->z. Per piece: its keys and values enter the
 * pages and the windows completing at its positions are pooled (both levels); then, on the sparse path (the
 * append's final length tend >= dense_len), stage 1 over the pooled keys, block scores over the blocks of tend
 * tokens, top-k and attention over the selected blocks' raw keys — a long piece over a frame of every key so far
 * (ps_select_attn_forward with its blocks), a short one (a decode step) per row and KV head over a frame of its
 * selected keys only; on the dense path ordinary causal attention over every key. */
static int attn_select(ps_kvcache *kv, int l, const kv_piece *P, int np, int64_t R, const ps_hooks *hooks, ps_error *err) {
    const ps_model *m = kv->m;
    const ps_config *c = &m->cfg;
    ps_ctx *ctx = kv->ctx;
    ps_select_cfg sc = ps_config_select(c);
    int64_t nh = c->n_heads, nkv = c->n_kv_heads, hd = c->head_dim, ks = nkv * hd, qd = nh * hd, K = c->window, S = c->stride,
            Bk = c->block, ns = ps_select_slots(&sc), G = nh / nkv;
    if (qkv_rows(kv, l, P, np, R, hooks, err)) return -1;
    for (int i = 0; i < np; i++) {
        ps_kv_seq *q = &kv->seqs[P[i].seq];
        ps_kv_layer *L = &q->layers[l];
        int64_t t0 = P[i].t0, n = P[i].n, t1 = t0 + n, r0 = P[i].r0;
        /* (opts.plain_attention: every sparse row alone, over its selected keys) */
        int sparse = ps_select_sparse(c, P[i].tend), frame_all = !sparse || (n >= PS_KV_BLOCKED_MIN && !kv->o.plain_attention);
        int64_t N1 = ps_select_n_windows(t1, K, S), N2 = ps_select_n_windows(t1, 4 * K, 4 * S), nb = ps_select_n_blocks(&sc, P[i].tend);
        /* the working set: a window being pooled, then (sparse) the pooled-key frames, P, block scores, blocks,
         * then the key and value frames (every key so far, or one row's selected keys) */
        int64_t pool = 4 * K * ks + ks, sel = sparse ? (N1 + N2) * ks + n * nkv * (N1 + nb + ns) : 0,
                fr = frame_all ? t1 * ks : ns * Bk * hd;
        float *buf = sel_reserve(kv, pool + sel + 2 * fr, err);
        if (!buf) return -1;
        float *k1f = buf + pool, *k2f = k1f + N1 * ks, *Pm = k2f + N2 * ks, *bs = Pm + n * nkv * N1, *blk = bs + n * nkv * nb,
              *kf = buf + pool + sel, *vf = kf + fr;
        kv->ev = (ps_kv_event){.seq = P[i].seq, .t0 = t0, .entry = -1};
        for (int64_t r = r0; r < r0 + n; r++) {
            int64_t t = t0 + (r - r0);
            if (rows_push(kv, &L->k, kv->kk + r * ks) || rows_push(kv, &L->v, kv->vv + r * ks))
                return page_fail(kv, err, "out of memory for the KV cache's pages");
            /* windows ending at t: level 1 (K every S) and level 2 (4K every 4S) */
            if (t >= K - 1 && (t - K + 1) % S == 0 &&
                close_select(kv, L, L->k1, l, t - K + 1, K, PS_HOOK_CK, sparse, t, buf, hooks, err))
                return -1;
            if (t >= 4 * K - 1 && (t - 4 * K + 1) % (4 * S) == 0 &&
                close_select(kv, L, L->k2, l, t - 4 * K + 1, 4 * K, PS_HOOK_CK2, sparse, t, buf, hooks, err))
                return -1;
        }
        kv->ev = (ps_kv_event){.seq = P[i].seq, .t0 = t0, .entry = -1};
        float *qp = kv->q + r0 * qd, *zp = kv->z + r0 * qd;
        if (frame_all) {
            rows_gather(kf, &L->k, 0, t1);
            rows_gather(vf, &L->v, 0, t1);
        }
        if (!sparse) { /* ordinary causal attention, as ps_forward below dense_len */
            ps_select_attn_forward(zp, NULL, qp, kf, vf, NULL, ns, n, t0, t1, Bk, nh, nkv, hd);
            continue;
        }
        rows_gather(k1f, L->k1, 0, N1);
        rows_gather(k2f, L->k2, 0, N2);
        ps_select_scores_forward(Pm, qp, n, t0, k1f, N1, k2f, N2, nh, nkv, hd, K, S);
        FIRE_P(PS_HOOK_SELECT_SCORES, Pm, 4, 1, n, nkv, N1);
        ps_select_block_scores_forward(bs, Pm, n, t0, N1, nb, nkv, &sc);
        FIRE_P(PS_HOOK_BLOCK_SCORES, bs, 4, 1, n, nkv, nb);
        ps_select_topk_forward(blk, bs, n, t0, nb, nkv, &sc);
        if (ps_hooks_on(hooks, l, PS_HOOK_BLOCKS)) {
            char what[96];
            ps_hook_name(what, sizeof what, l, PS_HOOK_BLOCKS);
            FIRE_P(PS_HOOK_BLOCKS, blk, 4, 1, n, nkv, ns);
            if (ps_select_blocks_check(blk, n, nkv, ns, nb, what, err)) return -1;
        }
        if (frame_all) {
            ps_select_attn_forward(zp, NULL, qp, kf, vf, blk, ns, n, t0, t1, Bk, nh, nkv, hd);
            continue;
        }
        /* a short piece: per row and KV head, the selected keys gathered in the order ps_select_attn_forward
         * visits them, then attention over that frame (the same terms in the same order) */
        for (int64_t r = 0; r < n; r++) {
            int64_t t = t0 + r;
            for (int64_t h = 0; h < nkv; h++) {
                const float *row = blk + (r * nkv + h) * ns;
                int64_t nk = 0;
                for (int64_t s = 0; s < ns; s++) {
                    int64_t j0, j1;
                    ps_select_slot_keys(row, s, t, Bk, &j0, &j1);
                    for (int64_t j = j0; j < j1; j++, nk++) {
                        memcpy(kf + nk * hd, rows_at(&L->k, j) + h * hd, (size_t)hd * sizeof(float));
                        memcpy(vf + nk * hd, rows_at(&L->v, j) + h * hd, (size_t)hd * sizeof(float));
                    }
                }
                float *zh = zp + (r * nh + h * G) * hd;
                if (!nk) memset(zh, 0, (size_t)(G * hd) * sizeof(float));
                else ps_select_attn_forward(zh, NULL, qp + (r * nh + h * G) * hd, kf, vf, NULL, 1, 1, nk - 1, nk, Bk, G, 1, hd);
            }
        }
    }
    (void)ctx;
    return 0;
}

/* Layer l over the step's rows (kv->x in, out). */
/* Fire a residual-width (or, with h2 > 0, a [h1, h2]-per-row) point once per piece: its rows
 * [r0, r0 + n) of buf ([R, row] floats), shape [1, n, h1] or [1, n, h1, h2], with the piece's event. */
static int fire_pieces(ps_kvcache *kv, int l, ps_hook_point pt, const kv_piece *P, int np, float *buf, int64_t h1, int64_t h2,
                       const ps_hooks *hooks, ps_error *err) {
    if (!ps_hooks_on(hooks, l, pt)) return 0;
    int64_t row = h2 > 0 ? h1 * h2 : h1;
    for (int i = 0; i < np; i++) {
        kv->ev = (ps_kv_event){.seq = P[i].seq, .t0 = P[i].t0, .entry = -1};
        int64_t shp[4] = {1, P[i].n, h1, h2};
        if (ps_hooks_fire(kv->ctx, hooks, l, pt, buf + P[i].r0 * row, h2 > 0 ? 4 : 3, shp, err)) return -1;
    }
    return 0;
}

static int layer_step(ps_kvcache *kv, int l, const kv_piece *P, int np, int64_t R, const int64_t *chunk_len,
                      const ps_hooks *hooks, ps_error *err) {
    const ps_model *m = kv->m;
    const ps_config *c = &m->cfg;
    ps_ctx *ctx = kv->ctx;
    ps_layer_params w = ps_model_layer(m, m->params, l);
    int64_t d = c->d_model, nh = c->n_heads, hd = c->head_dim, qd = nh * hd, dff = c->d_ff;
    float eps = (float)c->rms_eps;
    if (fire_pieces(kv, l, PS_HOOK_RESID_PRE, P, np, kv->x, d, 0, hooks, err)) return -1;
    if (c->kind == PS_ATTN_CHANNEL  ? attn_channel(kv, l, P, np, R, hooks, err)
        : c->kind == PS_ATTN_SELECT ? attn_select(kv, l, P, np, R, hooks, err)
                                    : attn_grid(kv, l, P, np, R, chunk_len, hooks, err))
        return -1;
    if (fire_pieces(kv, l, PS_HOOK_Z, P, np, kv->z, nh, hd, hooks, err)) return -1;
    CK(kv_matmul(kv, kv->attn_out, kv->z, w.wo, R, qd, d, 0));
    if (fire_pieces(kv, l, PS_HOOK_ATTN_OUT, P, np, kv->attn_out, d, 0, hooks, err)) return -1;
    CK(ps_add(ctx, kv->mid, kv->x, kv->attn_out, R * d));
    if (fire_pieces(kv, l, PS_HOOK_RESID_MID, P, np, kv->mid, d, 0, hooks, err)) return -1;
    CK(ps_rmsnorm(ctx, kv->ln2, NULL, kv->mid, w.post_norm, R, d, eps) || kv_matmul(kv, kv->g, kv->ln2, w.mlp_gate, R, d, dff, 0) ||
       kv_matmul(kv, kv->u, kv->ln2, w.mlp_up, R, d, dff, 0) || ps_swiglu(ctx, kv->h, kv->g, kv->u, R * dff) ||
       kv_matmul(kv, kv->mlp_out, kv->h, w.mlp_down, R, dff, d, 0));
    if (fire_pieces(kv, l, PS_HOOK_MLP_OUT, P, np, kv->mlp_out, d, 0, hooks, err)) return -1;
    CK(ps_add(ctx, kv->x, kv->mid, kv->mlp_out, R * d));
    if (fire_pieces(kv, l, PS_HOOK_RESID_POST, P, np, kv->x, d, 0, hooks, err)) return -1;
    return 0;
}

/* The logits of the step's rows rows[0..k) (k <= 64) into the host rows dst[j] of logits [*, V]. */
static int logit_rows(ps_kvcache *kv, const int64_t *rows, const int64_t *dst, int64_t k, float *logits, ps_error *err) {
    const ps_model *m = kv->m;
    const ps_config *c = &m->cfg;
    ps_ctx *ctx = kv->ctx;
    int64_t d = c->d_model, V = c->vocab_size, nl = kv->o.chunk < 64 ? kv->o.chunk : 64;
    float *lg = kv->logit_rows, *xr = lg + nl * V, *ln = xr + nl * d;
    if (ps_ctx_host_visible(ctx))
        for (int64_t j = 0; j < k; j++) memcpy(xr + j * d, kv->x + rows[j] * d, (size_t)d * sizeof(float));
    else
        CK(ps_gather_rows(ctx, xr, kv->x, NULL, rows, k, d));
    CK(ps_rmsnorm(ctx, ln, NULL, xr, ps_model_final_norm(m, m->params), k, d, (float)c->rms_eps) ||
       kv_matmul(kv, lg, ln, ps_model_lm_head(m, m->params), k, d, V, 0));
    if (ps_ctx_host_visible(ctx)) {
        for (int64_t j = 0; j < k; j++) memcpy(logits + dst[j] * V, lg + j * V, (size_t)V * sizeof(float));
        return 0;
    }
    for (int64_t j = 0; j < k; j++)
        if (ps_buf_to_host(ctx, logits + dst[j] * V, lg + j * V, V * (int64_t)sizeof(float), err)) return -1;
    return 0;
}

/* One step: the pieces' tokens through every layer, then the logits asked for. */
static int run_step(ps_kvcache *kv, const kv_piece *P, int np, int64_t R, const int32_t *tok, int64_t *chunk_len,
                    const ps_hooks *hooks, float *logits, bool last_only, ps_error *err) {
    const ps_model *m = kv->m;
    const ps_config *c = &m->cfg;
    ps_ctx *ctx = kv->ctx;
    int64_t d = c->d_model;
    int content = c->kind == PS_ATTN_COMPRESSED && c->boundaries == PS_BOUNDARIES_CONTENT;
    /* content chunks: where a chunk closes (the tokens alone decide it; core/chunks.h) */
    if (content) {
        uint64_t th = ps_chunk_threshold(c);
        for (int i = 0; i < np; i++) {
            ps_kv_seq *q = &kv->seqs[P[i].seq];
            for (int64_t r = P[i].r0; r < P[i].r0 + P[i].n; r++) {
                int64_t t = P[i].t0 + (r - P[i].r0), ln = t - q->chunk_start + 1;
                int32_t prev = t > 0 ? rows_tok(&q->tok, t - 1) : -1;
                chunk_len[r] = 0;
                if (ln >= c->chunk_min && (ln >= c->window || (uint64_t)ps_chunk_hash(prev, tok[r]) < th)) {
                    int64_t e = t;
                    float slot[2];
                    memcpy(slot, &e, sizeof e);
                    if (rows_push(kv, &q->cend, slot)) return ps_fail(err, "out of memory for the KV cache's chunk table");
                    chunk_len[r] = ln;
                    q->chunk_start = t + 1;
                }
                float ts;
                memcpy(&ts, &tok[r], sizeof ts);
                if (rows_push(kv, &q->tok, &ts)) return ps_fail(err, "out of memory for the KV cache's tokens");
                rows_drop_front(kv, &q->tok, t - kv->o.history);
            }
        }
    }
    CK(ps_embed(ctx, kv->x, tok, ps_model_embed(m, m->params), R, d));
    for (int l = 0; l < c->n_layers; l++)
        if (layer_step(kv, l, P, np, R, chunk_len, hooks, err)) return -1;
    for (int i = 0; i < np; i++) kv->seqs[P[i].seq].T = P[i].t0 + P[i].n;
    if (!logits) return 0;
    /* the rows asked for, at most 64 at a time */
    int64_t nl = R < 64 ? R : 64;
    int64_t rows[64], dst[64], k = 0;
    for (int i = 0; i < np; i++)
        for (int64_t r = 0; r < P[i].n; r++) {
            if (last_only && !(P[i].last && r == P[i].n - 1)) continue;
            rows[k] = P[i].r0 + r;
            dst[k++] = last_only ? P[i].out : P[i].out + r;
            int flush = k == nl || (i == np - 1 && r == P[i].n - 1);
            if (!flush) {
                /* a later piece may still add rows: flush at the very end */
                continue;
            }
            if (logit_rows(kv, rows, dst, k, logits, err)) return -1;
            k = 0;
        }
    if (k > 0 && logit_rows(kv, rows, dst, k, logits, err)) return -1;
    return 0;
}

int ps_kvcache_check_request(ps_kvcache *kv, int n_seq, const int *seqs, const int64_t *n, const int32_t *tokens, ps_error *err) {
    if (n_seq < 0) return ps_fail(err, "KV cache append: %d sequences", n_seq);
    int64_t max_len = ps_kvcache_max_len(kv), vocab = ps_kvcache_vocab(kv);
    const char *max_name = kv->ops->max_len_name;
    int64_t tot = 0;
    for (int i = 0; i < n_seq; tot += n[i], i++) {
        ps_kv_seq *q = ps_kvcache_seq(kv, seqs[i], err);
        if (!q) return -1;
        for (int k = 0; k < i; k++)
            if (seqs[k] == seqs[i]) return ps_fail(err, "KV cache append: sequence %d is given twice", seqs[i]);
        if (n[i] < 0) return ps_fail(err, "KV cache append: %lld tokens for sequence %d", (long long)n[i], seqs[i]);
        if (q->T + n[i] > max_len)
            return ps_fail(err, "KV cache append: sequence %d would grow to %lld tokens, past %s %lld by %lld", seqs[i],
                           (long long)(q->T + n[i]), max_name, (long long)max_len, (long long)(q->T + n[i] - max_len));
        for (int64_t t = 0; t < n[i]; t++)
            if (tokens[tot + t] < 0 || tokens[tot + t] >= vocab)
                return ps_fail(err, "token %d (sequence %d, new position %lld) is outside the vocabulary [0, %lld)", tokens[tot + t],
                               seqs[i], (long long)t, (long long)vocab);
    }
    return 0;
}

static int model_append(ps_kvcache *kv, int n_seq, const int *seqs, const int64_t *n, const int32_t *tokens,
                        const ps_hooks *hooks, float *logits, bool last_only, ps_error *err) {
    const ps_config *c = &kv->m->cfg;
    if (hooks && hooks->mask && hooks->family != &ps_model_hook_family)
        return ps_fail(err, "the hooks were registered for a %s model, not this phasescope model", hooks->family->name);
    if (hooks && hooks->mask && hooks->n_layers != c->n_layers)
        return ps_fail(err, "hooks were registered for a model with %lld layers, this one has %lld", (long long)hooks->n_layers,
                       (long long)c->n_layers);
    for (int l = 0; l < c->n_layers; l++)
        if (ps_hooks_on(hooks, l, PS_HOOK_PATTERN))
            return ps_fail(err, "hook \"blocks.%d.attn.hook_pattern\" is not available during a KV cache append (run the sequence whole with ps_forward)", l);
    if (ps_kvcache_check_request(kv, n_seq, seqs, n, tokens, err)) return -1;
    int64_t R = kv->o.chunk;
    kv_piece *P = malloc((size_t)(n_seq > 0 ? n_seq : 1) * sizeof *P);
    int32_t *tok = malloc((size_t)R * sizeof *tok);
    int64_t *chunk_len = calloc((size_t)R, sizeof *chunk_len);
    int rc = P && tok && chunk_len ? 0 : ps_fail(err, "out of memory for a KV cache append");
    int np = 0, i = 0;
    int64_t rows = 0, done_i = 0, off = 0, out_row = 0;
    while (!rc && i < n_seq) {
        /* fill the step: pieces of the sequences in order */
        int64_t left = n[i] - done_i, take = left < R - rows ? left : R - rows;
        if (take > 0) {
            P[np] = (kv_piece){.seq = seqs[i], .t0 = kv->seqs[seqs[i]].T, .n = take, .r0 = rows,
                               .out = last_only ? i : out_row, .last = done_i + take == n[i],
                               .tend = kv->seqs[seqs[i]].T + left};
            memcpy(tok + rows, tokens + off, (size_t)take * sizeof *tok);
            np++, rows += take, done_i += take, off += take, out_row += take;
        }
        if (done_i == n[i]) i++, done_i = 0;
        if (rows == R || (i == n_seq && rows > 0)) {
            /* a sequence has one piece per step: its next piece starts where this step leaves its T */
            rc = run_step(kv, P, np, rows, tok, chunk_len, hooks, logits, last_only, err);
            np = 0, rows = 0;
        }
    }
    free(P);
    free(tok);
    free(chunk_len);
    return rc;
}

int ps_kvcache_create_rt(ps_kvcache *kv, const ps_runtime *rt, const ps_kvcache_opts *o, ps_error *err) {
    memset(kv, 0, sizeof *kv);
    const ps_kvcache_ops *ops = rt->family ? rt->family->kvcache : NULL;
    if (!ops)
        return ps_fail(err, "the KV cache is not implemented for the %s family (the whole-sequence path runs)",
                       rt->family ? rt->family->name : "?");
    return ops->create(kv, rt, o, err);
}

/* ---- every family's cache: its table's functions ---- */

void ps_kvcache_free(ps_kvcache *kv) {
    if (kv->ops) kv->ops->free(kv);
}
int ps_kvcache_add(ps_kvcache *kv, ps_error *err) { return kv->ops->add(kv, err); }
int ps_kvcache_fork(ps_kvcache *kv, int src, ps_error *err) { return kv->ops->fork(kv, src, err); }
void ps_kvcache_drop(ps_kvcache *kv, int seq) { kv->ops->drop(kv, seq); }
int ps_kvcache_truncate(ps_kvcache *kv, int seq, int64_t T, ps_error *err) { return kv->ops->truncate(kv, seq, T, err); }
int ps_kvcache_append(ps_kvcache *kv, int n_seq, const int *seqs, const int64_t *n, const int32_t *tokens, const ps_hooks *hooks,
                      float *logits, bool last_only, ps_error *err) {
    return kv->ops->append(kv, n_seq, seqs, n, tokens, hooks, logits, last_only, err);
}
int64_t ps_kvcache_n_entries(const ps_kvcache *kv, int seq, int l, int g) { return kv->ops->n_entries(kv, seq, l, g); }
int ps_kvcache_entry(const ps_kvcache *kv, int seq, int l, int g, int value, int64_t j, float *out, ps_error *err) {
    return kv->ops->entry(kv, seq, l, g, value, j, out, err);
}
int ps_kvcache_edit(ps_kvcache *kv, int seq, int l, int g, int value, int64_t j, ps_kv_edit_kind kind, const float *vec,
                    ps_error *err) {
    return kv->ops->edit(kv, seq, l, g, value, j, kind, vec, err);
}
int64_t ps_kvcache_bytes(const ps_kvcache *kv) { return kv->ops->bytes(kv); }
int ps_kvcache_point_parse_kv(const ps_kvcache *kv, const char *name, int *layer, int *value, ps_error *err) {
    return kv->ops->point_parse(kv, name, layer, value, err);
}
void ps_kvcache_point_name(const ps_kvcache *kv, int layer, int value, char *buf, size_t n) { kv->ops->point_name(kv, layer, value, buf, n); }
int64_t ps_kvcache_vocab(const ps_kvcache *kv) { return kv->ops->vocab(kv); }
int64_t ps_kvcache_max_len(const ps_kvcache *kv) { return kv->ops->max_len(kv); }
int64_t ps_kvcache_entry_heads(const ps_kvcache *kv) { return kv->ops->entry_heads(kv); }
int64_t ps_kvcache_entry_width(const ps_kvcache *kv, int l, int value) { return kv->ops->entry_width(kv, l, value); }

/* ---- the page lists for the other families' caches ---- */

void ps_kv_rows_init(ps_kv_rows *r, int64_t width, int64_t page_rows) { rows_init(r, width, page_rows); }
void ps_kv_rows_free(ps_kvcache *kv, ps_kv_rows *r) { rows_free(kv, r); }
const float *ps_kv_rows_at(const ps_kv_rows *r, int64_t i) { return rows_at(r, i); }
float *ps_kv_rows_mut(ps_kvcache *kv, ps_kv_rows *r, int64_t i) { return rows_mut(kv, r, i); }
int ps_kv_rows_push(ps_kvcache *kv, ps_kv_rows *r, const float *row) { return rows_push(kv, r, row); }
void ps_kv_rows_drop_front(ps_kvcache *kv, ps_kv_rows *r, int64_t from) { rows_drop_front(kv, r, from); }
void ps_kv_rows_truncate(ps_kvcache *kv, ps_kv_rows *r, int64_t n) { rows_truncate(kv, r, n); }
int ps_kv_rows_fork(ps_kv_rows *dst, ps_kv_rows *src) { return rows_fork(dst, src); }

/* ---- the controlled model's cache as its family's table ---- */

static int model_create_rt(ps_kvcache *kv, const ps_runtime *rt, const ps_kvcache_opts *o, ps_error *err) {
    return ps_kvcache_create(kv, (const ps_model *)rt->model, o, err);
}
static int model_point_parse(const ps_kvcache *kv, const char *name, int *layer, int *value, ps_error *err) {
    return ps_kvcache_point_parse(&kv->m->cfg, name, layer, value, err);
}
static void model_point_name(const ps_kvcache *kv, int layer, int value, char *buf, size_t n) {
    (void)kv;
    snprintf(buf, n, "blocks.%d.attn.%s", layer, value ? "cache_cv" : "cache_ck");
}
static int64_t model_vocab(const ps_kvcache *kv) { return kv->m->cfg.vocab_size; }
static int64_t model_max_len(const ps_kvcache *kv) { return kv->m->cfg.max_seq_len; }
static int64_t model_entry_heads(const ps_kvcache *kv) { return entry_heads(&kv->m->cfg); }
static int64_t model_entry_width(const ps_kvcache *kv, int l, int value) {
    (void)l, (void)value;
    return kv->m->cfg.head_dim;
}

const ps_kvcache_ops ps_kvcache_model_ops = {
    .name = "phasescope",
    .create = model_create_rt,
    .free = model_free,
    .add = model_add,
    .fork = model_fork,
    .drop = model_drop,
    .truncate = model_truncate,
    .append = model_append,
    .n_entries = model_n_entries,
    .entry = model_entry,
    .edit = model_edit,
    .bytes = model_bytes,
    .point_parse = model_point_parse,
    .point_name = model_point_name,
    .vocab = model_vocab,
    .max_len = model_max_len,
    .entry_heads = model_entry_heads,
    .entry_width = model_entry_width,
    .max_len_name = "max_seq_len",
    .edit_form = "blocks.L.attn.cache_ck:HEAD:ENTRY:zero|mean (or cache_cv)",
};
