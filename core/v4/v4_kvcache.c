/* v4_kvcache.c — DeepSeek-V4's KV cache (v4_kvcache.h). The per-position steps are the forward's own
 * (ps_v4_hc_site, ps_v4_moe, the backend's matmul / rmsnorm / rope / slot softmax / indexer scores / top-k
 * ops on the piece's rows); what reads other positions — the windows that close, the attention over the
 * raw window and the entries, the indexer keys' gather — is the backend's ops over the sequence's pages
 * (ps_v4_kv_slots, ps_kv_slot_pool, ps_v4_kv_attend, ps_kv_gather; on the CPU core/cpu/kv_v4.c and kv.c, the
 * loops this file ran on host memory before, the same arithmetic in the same order). Pages and step buffers
 * are buffers of the model's context: the cache runs on any backend. */
#include "core/v4/v4_kvcache.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/hd_math.h"
#include "core/ops.h"
#include "core/v4/v4_hooks.h"
#include "core/runtime.h"
#include "core/v4/v4_pass.h"


/* ---- sizes ---- */

static int comp_layer(const ps_v4_config *c, int l) { return c->attn_type[l] != PS_V4_SLIDING; }
static int csa_layer(const ps_v4_config *c, int l) { return c->attn_type[l] == PS_V4_CSA; }
/* slots of a window (S) and the open rows a layer keeps (S - 1) */
static int64_t slots(const ps_v4_config *c, int l) { return csa_layer(c, l) ? 2 * c->compress_rate[l] : c->compress_rate[l]; }

double ps_v4_kvcache_bytes_per_token(const ps_v4_config *c) {
    double b = 0;
    for (int l = 0; l < c->n_layers; l++) {
        if (!comp_layer(c, l)) continue;
        double w = (double)c->head_dim + (csa_layer(c, l) ? (double)c->index_head_dim : 0.0);
        b += w * 4.0 / (double)c->compress_rate[l];
    }
    return b;
}

double ps_v4_kvcache_fixed_bytes(const ps_v4_config *c) {
    double b = 0;
    for (int l = 0; l < c->n_layers; l++) {
        b += (double)(c->sliding_window - 1) * (double)c->head_dim * 4.0;
        if (!comp_layer(c, l)) continue;
        int64_t cc = csa_layer(c, l) ? 2 : 1;
        b += (double)(slots(c, l) - 1) * 2.0 * (double)(cc * c->head_dim) * 4.0;
        if (csa_layer(c, l)) b += (double)(slots(c, l) - 1) * 2.0 * (double)(2 * c->index_head_dim) * 4.0;
    }
    return b;
}

static const ps_v4_config *cfg_of(const ps_kvcache *kv) { return &((struct ps_v4_kvcache *)kv->impl)->m->cfg; }
int64_t ps_v4_kvcache_max_len(const ps_kvcache *kv) { return cfg_of(kv)->max_position_embeddings; }
int64_t ps_v4_kvcache_vocab(const ps_kvcache *kv) { return cfg_of(kv)->vocab_size; }

/* ---- create / sequences ---- */

void ps_v4_kvcache_free(ps_kvcache *kv) {
    struct ps_v4_kvcache *v = ((struct ps_v4_kvcache *)kv->impl);
    for (int s = 0; s < kv->n_seq; s++) ps_v4_kvcache_drop(kv, s);
    free(kv->seqs);
    for (int i = 0; i < kv->n_edits; i++) free(kv->edits[i].vec);
    free(kv->edits);
    if (v) {
        ps_v4_acts_free(&v->a);
        if (v->scratch) ps_buf_free(kv->ctx, v->scratch, v->scratch_floats * (int64_t)sizeof(float));
        if (v->ik) ps_buf_free(kv->ctx, v->ik, v->ik_cap * (int64_t)sizeof(float));
        if (v->scores) ps_buf_free(kv->ctx, v->scores, v->sc_cap * (int64_t)sizeof(float));
        free(v->hscratch);
        free(v->host_idx);
        free(v->tok);
        free(v->rows);
        free(v);
    }
    memset(kv, 0, sizeof *kv);
}

int ps_v4_kvcache_create(ps_kvcache *kv, ps_v4_model *m, const ps_kvcache_opts *o, ps_error *err) {
    memset(kv, 0, sizeof *kv);
    const ps_v4_config *c = &m->cfg;
    if (!m->ctx) return ps_fail(err, "%s: the weights are not loaded", m->dir);
    if (o && (o->chunk < 0 || o->history < 0))
        return ps_fail(err, "KV cache options: chunk %lld and history %lld must be >= 0", (long long)o->chunk, (long long)o->history);
    kv->ctx = m->ctx;
    kv->o.chunk = o && o->chunk > 0 ? o->chunk : 256;
    if (kv->o.chunk > c->max_position_embeddings) kv->o.chunk = c->max_position_embeddings;
    kv->o.history = o && o->history > 0 ? o->history : 0;
    struct ps_v4_kvcache *v = calloc(1, sizeof *v);
    if (!v) return ps_fail(err, "out of memory for a DeepSeek-V4 KV cache");
    kv->impl = v;
    kv->ops = &ps_v4_kvcache_ops;
    v->m = m;
    int host = ps_ctx_host_visible(m->ctx);
    int64_t R = kv->o.chunk, half = c->rope_dim / 2, Dh = c->head_dim, Di = c->index_head_dim;
    int64_t dmax = Dh > Di ? Dh : Di, smax = 1, K = c->index_topk > 0 ? c->index_topk : 1;
    for (int l = 0; l < c->n_layers; l++)
        if (comp_layer(c, l) && slots(c, l) > smax) smax = slots(c, l);
    v->half = half;
    ps_v4_rope_inv_freq(&c->rope_main, c->rope_dim, v->inv_main);
    ps_v4_rope_inv_freq(&c->rope_compress, c->rope_dim, v->inv_comp);
    if (ps_v4_acts_create(&v->a, m, 1, R, err)) {
        ps_v4_kvcache_free(kv);
        return -1;
    }
    /* the step's buffers, one allocation on the model's context */
    int64_t sizes[] = {R * half, R * half, R * half, R * half, half, half, smax * dmax, smax * dmax, dmax, dmax, 4 * dmax, R * K, R};
    float **ptrs[] = {&v->cos_m, &v->sin_m, &v->cos_c, &v->sin_c, &v->ecos, &v->esin, &v->gate, &v->alpha,
                      &v->pooled, &v->ent, &v->row, &v->topk, &v->gap};
    int n = (int)(sizeof sizes / sizeof sizes[0]);
    int64_t tot = 0;
    for (int i = 0; i < n; i++) tot += sizes[i] > 0 ? sizes[i] : 1;
    v->scratch = ps_buf_alloc(kv->ctx, tot * (int64_t)sizeof(float), "the DeepSeek-V4 KV cache's step buffers", err);
    if (!v->scratch) {
        ps_v4_kvcache_free(kv);
        return -1;
    }
    v->scratch_floats = tot;
    float *p = v->scratch;
    for (int i = 0; i < n; i++) {
        *ptrs[i] = p;
        p += sizes[i] > 0 ? sizes[i] : 1;
    }
    /* host arrays: the RoPE rows the host computes (on a host-visible context the buffers themselves), the
     * tokens, a hooked top-k's copy */
    int64_t hsz = host ? 0 : 4 * (R * half + 1) + 2 * (half + 1);
    v->hscratch = hsz ? malloc((size_t)hsz * sizeof(float)) : NULL;
    v->tok = malloc((size_t)R * sizeof *v->tok);
    v->host_idx = malloc((size_t)(R * K) * sizeof(float));
    if ((hsz && !v->hscratch) || !v->tok || !v->host_idx) {
        ps_v4_kvcache_free(kv);
        return ps_fail(err, "out of memory for the DeepSeek-V4 KV cache's host buffers");
    }
    float *hp = v->hscratch;
    float **hptr[] = {&v->hcos_m, &v->hsin_m, &v->hcos_c, &v->hsin_c, &v->hecos, &v->hesin};
    float *dptr[] = {v->cos_m, v->sin_m, v->cos_c, v->sin_c, v->ecos, v->esin};
    for (int i = 0; i < 6; i++) {
        *hptr[i] = host ? dptr[i] : hp;
        if (!host) hp += (i < 4 ? R * half : half) + 1;
    }
    return 0;
}


void ps_v4_kvcache_drop(ps_kvcache *kv, int seq) {
    if (seq < 0 || seq >= kv->n_seq || !kv->seqs[seq].live) return;
    ps_kv_seq *q = &kv->seqs[seq];
    const ps_v4_config *c = cfg_of(kv);
    for (int64_t l = 0; q->layers && l < c->n_layers; l++) {
        ps_kv_layer *L = &q->layers[l];
        ps_kv_rows_free(kv, &L->k);
        ps_kv_rows_free(kv, &L->v);
        ps_kv_rows_free(kv, &L->ln);
        if (L->ck) ps_kv_rows_free(kv, &L->ck[0]);
        if (L->cv) ps_kv_rows_free(kv, &L->cv[0]);
        free(L->ck);
        free(L->cv);
    }
    free(q->layers);
    memset(q, 0, sizeof *q);
}

int ps_v4_kvcache_add(ps_kvcache *kv, ps_error *err) {
    const ps_v4_config *c = cfg_of(kv);
    int s = -1;
    for (int i = 0; i < kv->n_seq && s < 0; i++)
        if (!kv->seqs[i].live) s = i;
    if (s < 0) {
        if (kv->n_seq == kv->cap_seq) {
            int cap = kv->cap_seq ? 2 * kv->cap_seq : 8;
            ps_kv_seq *ns = realloc(kv->seqs, (size_t)cap * sizeof *ns);
            if (!ns) return ps_fail(err, "out of memory for %d KV cache sequences", cap);
            kv->seqs = ns;
            kv->cap_seq = cap;
        }
        s = kv->n_seq++;
    }
    ps_kv_seq *q = &kv->seqs[s];
    memset(q, 0, sizeof *q);
    if (!(q->layers = calloc((size_t)c->n_layers, sizeof *q->layers))) return ps_fail(err, "out of memory for a KV cache sequence");
    q->live = true;
    int64_t Dh = c->head_dim, Di = c->index_head_dim;
    for (int l = 0; l < c->n_layers; l++) {
        ps_kv_layer *L = &q->layers[l];
        int64_t cc = csa_layer(c, l) ? 2 : 1;
        ps_kv_rows_init(&L->k, Dh, PS_KV_SLIDE_ROWS);
        ps_kv_rows_init(&L->ln, comp_layer(c, l) ? 2 * cc * Dh : 1, PS_KV_SLIDE_ROWS);
        ps_kv_rows_init(&L->v, csa_layer(c, l) ? 4 * Di : 1, PS_KV_SLIDE_ROWS);
        if (!comp_layer(c, l)) continue;
        L->ck = calloc(1, sizeof *L->ck);
        L->cv = calloc(1, sizeof *L->cv);
        if (!L->ck || !L->cv) {
            ps_v4_kvcache_drop(kv, s);
            return ps_fail(err, "out of memory for a KV cache sequence");
        }
        ps_kv_rows_init(L->ck, Dh, PS_KV_PAGE_ROWS);
        ps_kv_rows_init(L->cv, csa_layer(c, l) ? Di : 1, PS_KV_PAGE_ROWS);
    }
    return s;
}

int ps_v4_kvcache_fork(ps_kvcache *kv, int src, ps_error *err) {
    const ps_v4_config *c = cfg_of(kv);
    if (!ps_kvcache_seq(kv, src, err)) return -1;
    int s = ps_v4_kvcache_add(kv, err);
    if (s < 0) return -1;
    ps_kv_seq *a = &kv->seqs[src], *b = &kv->seqs[s]; /* (add may have moved the table: take both after it) */
    int rc = 0;
    b->T = a->T;
    for (int l = 0; l < c->n_layers; l++) {
        ps_kv_layer *A = &a->layers[l], *B = &b->layers[l];
        rc |= ps_kv_rows_fork(&B->k, &A->k) | ps_kv_rows_fork(&B->ln, &A->ln) | ps_kv_rows_fork(&B->v, &A->v);
        if (A->ck) rc |= ps_kv_rows_fork(B->ck, A->ck) | ps_kv_rows_fork(B->cv, A->cv);
    }
    if (rc) {
        ps_v4_kvcache_drop(kv, s);
        return ps_fail(err, "out of memory forking KV cache sequence %d", src);
    }
    return s;
}

/* Every list of q cut back to what position T needs (T <= the rows held). */
static void cut(ps_kvcache *kv, ps_kv_seq *q, int64_t T) {
    const ps_v4_config *c = cfg_of(kv);
    for (int l = 0; l < c->n_layers; l++) {
        ps_kv_layer *L = &q->layers[l];
        ps_kv_rows_truncate(kv, &L->k, T);
        if (!comp_layer(c, l)) continue;
        int64_t nw = T / c->compress_rate[l];
        ps_kv_rows_truncate(kv, &L->ln, T);
        ps_kv_rows_truncate(kv, L->ck, nw);
        if (!csa_layer(c, l)) continue;
        ps_kv_rows_truncate(kv, &L->v, T);
        ps_kv_rows_truncate(kv, L->cv, nw);
    }
    q->T = T;
}

int ps_v4_kvcache_truncate(ps_kvcache *kv, int seq, int64_t T, ps_error *err) {
    const ps_v4_config *c = cfg_of(kv);
    ps_kv_seq *q = ps_kvcache_seq(kv, seq, err);
    if (!q) return -1;
    if (T < 0 || T > q->T)
        return ps_fail(err, "truncating sequence %d of %lld tokens to %lld: must be in [0, %lld]", seq, (long long)q->T, (long long)T,
                       (long long)q->T);
    if (T == q->T) return 0;
    for (int l = 0; l < c->n_layers; l++) {
        ps_kv_layer *L = &q->layers[l];
        int64_t need_k = T - (c->sliding_window - 1), need_a = T - (comp_layer(c, l) ? slots(c, l) - 1 : 0);
        if (need_k < 0) need_k = 0;
        if (need_a < 0) need_a = 0;
        if (need_k < L->k.base || (comp_layer(c, l) && (need_a < L->ln.base || (csa_layer(c, l) && need_a < L->v.base))))
            return ps_fail(err,
                           "truncating sequence %d from %lld to %lld tokens: the cache no longer holds the sliding window and open windows of position %lld (it keeps %lld positions of history: ps_kvcache_opts.history)",
                           seq, (long long)q->T, (long long)T, (long long)T, (long long)kv->o.history);
    }
    cut(kv, q, T);
    return 0;
}

int64_t ps_v4_kvcache_bytes(const ps_kvcache *kv) {
    const ps_v4_config *c = cfg_of(kv);
    int64_t tab = 0;
    for (int s = 0; s < kv->n_seq; s++) {
        const ps_kv_seq *q = &kv->seqs[s];
        if (!q->live) continue;
        tab += c->n_layers * (int64_t)sizeof(ps_kv_layer);
        for (int l = 0; l < c->n_layers; l++) {
            const ps_kv_layer *L = &q->layers[l];
            tab += (L->k.cap_pages + L->v.cap_pages + L->ln.cap_pages) * (int64_t)sizeof(void *);
            if (L->ck) tab += 2 * (int64_t)sizeof(ps_kv_rows) + (L->ck->cap_pages + L->cv->cap_pages) * (int64_t)sizeof(void *);
        }
    }
    return kv->page_bytes_live + tab;
}

/* ---- the cache as hook points ---- */

int ps_v4_kvcache_point_parse(const ps_v4_config *c, const char *name, int *layer, int *value, ps_error *err) {
    int l, off = 0;
    char what[16];
    if (sscanf(name, "layers.%d.attn.%15[a-z_]%n", &l, what, &off) != 2 || name[off] != '\0' ||
        (strcmp(what, "cache_kv") && strcmp(what, "cache_ik")))
        return ps_fail(err, "\"%s\" is not a cache point: expected layers.{L}.attn.cache_kv or layers.{L}.attn.cache_ik", name);
    if (l < 0 || l >= c->n_layers)
        return ps_fail(err, "\"%s\": layer %d is outside the model's %lld layers", name, l, (long long)c->n_layers);
    if (!comp_layer(c, l)) return ps_fail(err, "\"%s\": layer %d is a sliding-window layer: it has no compressed entries", name, l);
    if (!strcmp(what, "cache_ik") && !csa_layer(c, l))
        return ps_fail(err, "\"%s\": layer %d has no indexer (only CSA layers have one)", name, l);
    *layer = l;
    *value = !strcmp(what, "cache_ik");
    return 0;
}

static int entry_check(const ps_kvcache *kv, int l, int g, int value, ps_error *err) {
    const ps_v4_config *c = cfg_of(kv);
    if (l < 0 || l >= c->n_layers) return ps_fail(err, "KV cache entries: layer %d is outside the model's %lld layers", l, (long long)c->n_layers);
    if (!comp_layer(c, l)) return ps_fail(err, "KV cache entries: layer %d is a sliding-window layer (no compressed entries)", l);
    if (g != 0) return ps_fail(err, "KV cache entries: head %d: a DeepSeek-V4 layer has one K = V head (0)", g);
    if (value != 0 && value != 1) return ps_fail(err, "KV cache entries: value must be 0 (cache_kv) or 1 (cache_ik)");
    if (value == 1 && !csa_layer(c, l)) return ps_fail(err, "KV cache entries: layer %d has no indexer keys (not a CSA layer)", l);
    return 0;
}

static const char *point_word(int value) { return value ? "cache_ik" : "cache_kv"; }

int64_t ps_v4_kvcache_n_entries(const ps_kvcache *kv, int seq, int l, int g) {
    if (seq < 0 || seq >= kv->n_seq || !kv->seqs[seq].live || entry_check(kv, l, g, 0, NULL)) return 0;
    return kv->seqs[seq].layers[l].ck->rows;
}

int ps_v4_kvcache_entry(const ps_kvcache *kv, int seq, int l, int g, int value, int64_t j, float *out, ps_error *err) {
    if (entry_check(kv, l, g, value, err)) return -1;
    if (seq < 0 || seq >= kv->n_seq || !kv->seqs[seq].live) return ps_fail(err, "KV cache: no sequence %d", seq);
    const ps_kv_rows *r = value ? kv->seqs[seq].layers[l].cv : kv->seqs[seq].layers[l].ck;
    if (j < 0 || j >= r->rows)
        return ps_fail(err, "layers.%d.attn.%s: sequence %d holds entries 0..%lld, not %lld", l, point_word(value), seq,
                       (long long)r->rows - 1, (long long)j);
    return ps_buf_to_host(kv->ctx, out, ps_kv_rows_at(r, j), r->width * (int64_t)sizeof(float), err);
}

/* An edit written into a row of the cache's memory (a buffer of the context; a host row on a host-visible one). */
static int edit_row(ps_kvcache *kv, const ps_kv_edit *e, float *row, int64_t d, ps_error *err) {
    if (ps_ctx_host_visible(kv->ctx)) {
        ps_kvcache_edit_apply(e, row, d);
        return 0;
    }
    if (e->kind == PS_KV_EDIT_ZERO) return ps_fill(kv->ctx, row, 0.0f, d) ? ps_ctx_check(kv->ctx, err) : 0;
    return ps_buf_from_host(kv->ctx, row, e->vec, d * (int64_t)sizeof(float), err);
}

/* A page operation failed: the context's error when a copy on it failed, else out of memory (what). */
static int page_fail(ps_kvcache *kv, ps_error *err, const char *what) {
    if (kv->ctx->failed) return ps_ctx_check(kv->ctx, err);
    return ps_fail(err, "out of memory for %s", what);
}


int ps_v4_kvcache_edit(ps_kvcache *kv, int seq, int l, int g, int value, int64_t j, ps_kv_edit_kind kind, const float *vec,
                       ps_error *err) {
    const ps_v4_config *c = cfg_of(kv);
    if (entry_check(kv, l, g, value, err)) return -1;
    int64_t d = value ? c->index_head_dim : c->head_dim;
    char point[64];
    snprintf(point, sizeof point, "layers.%d.attn.%s", l, point_word(value));
    const ps_kv_edit *e = ps_kvcache_edit_push(kv, seq, l, g, value, j, kind, vec, d, point, err);
    if (!e) return -1;
    for (int s = 0; s < kv->n_seq; s++) {
        if (!kv->seqs[s].live || (seq != -1 && s != seq)) continue;
        ps_kv_rows *r = value ? kv->seqs[s].layers[l].cv : kv->seqs[s].layers[l].ck;
        if (j >= r->rows) continue;
        float *row = ps_kv_rows_mut(kv, r, j);
        if (!row) return page_fail(kv, err, "editing a KV cache entry");
        if (edit_row(kv, e, row, d, err)) return -1;
    }
    return 0;
}

/* ---- append ---- */

/* cos/sin of positions p0.. p0+n-1 [n, half]: the formula of the backend's rope table. */
static void rope_rows(float *cs, float *sn, int64_t p0, int64_t n, int64_t half, const double *inv, double mscale) {
    for (int64_t r = 0; r < n; r++)
        for (int64_t i = 0; i < half; i++) {
            double a = (double)(p0 + r) * inv[i];
            cs[r * half + i] = (float)(cos(a) * (double)(float)mscale);
            sn[r * half + i] = (float)(sin(a) * (double)(float)mscale);
        }
}

/* A buffer of the context of at least `want` floats (its contents not kept when it grows). */
static float *buf_grow(ps_kvcache *kv, float **buf, int64_t *cap, int64_t want, const char *what, ps_error *err) {
    if (want < 1) want = 1;
    if (want <= *cap) return *buf;
    int64_t c = *cap ? *cap : 64;
    while (c < want) c *= 2;
    if (*buf) ps_buf_free(kv->ctx, *buf, *cap * (int64_t)sizeof(float));
    *buf = NULL, *cap = 0;
    if (!(*buf = ps_buf_alloc(kv->ctx, c * (int64_t)sizeof(float), what, err))) return NULL;
    *cap = c;
    return *buf;
}

/* n floats of rows computed on the host (h) into the buffer d (the same memory on a host-visible context) */
static int upload(ps_kvcache *kv, float *d, const float *h, int64_t n, ps_error *err) {
    if (d == h) return 0;
    return ps_buf_from_host(kv->ctx, d, h, n * (int64_t)sizeof(float), err);
}

/* n floats from src to dst, both buffers of the context */
static int buf_copy(ps_kvcache *kv, float *dst, const float *src, int64_t n) {
    if (ps_ctx_host_visible(kv->ctx)) {
        memcpy(dst, src, (size_t)n * sizeof(float));
        return 0;
    }
    return ps_copy(kv->ctx, dst, src, n);
}

/* A page list as the backend's kv ops see it. */
static ps_kv_pages pages_of(const ps_kv_rows *r) {
    return (ps_kv_pages){.page = r->data, .base = r->base, .rows = r->rows, .width = r->width, .page_rows = r->page_rows};
}

/* Window w of layer l closes: from the open rows `open` (kv | z of each position, c·d each) the gate, alpha,
 * pooled and entry (hooks pt_gate..pt_gate+3), the cache's edits of (l, value), and the entry pushed onto
 * `ents`. The backend's ops: v4_kv_slots (the gate in slot layout, as ps_cpu_v4_comp_slots), slot softmax,
 * kv_slot_pool (as comp_pool), then rmsnorm and rope. */
static int close_window(ps_kvcache *kv, int seq, int l, int64_t w, int64_t d, int overlap, const float *ape, const float *norm_w,
                        ps_kv_rows *open, ps_kv_rows *ents, int value, int pt_gate, const ps_hooks *hooks, ps_error *err) {
    struct ps_v4_kvcache *v = ((struct ps_v4_kvcache *)kv->impl);
    ps_ctx *ctx = kv->ctx;
    const ps_v4_config *c = cfg_of(kv);
    int64_t m = c->compress_rate[l], S = overlap ? 2 * m : m, cc = overlap ? 2 : 1;
    kv->ev = (ps_kv_event){.seq = seq, .t0 = (w + 1) * m - 1, .entry = w};
    ps_kv_chan ch = {.hd = d, .rate = m, .cw = cc * d, .csa = overlap, .wi = w, .ln = pages_of(open)};
    OPS(ps_v4_kv_slots(ctx, v->gate, ape, &ch));
    FIRE(l, pt_gate, v->gate, 4, 1, 1, S, d);
    OPS(ps_v4_slot_softmax(ctx, v->alpha, v->gate, 1, S, d));
    FIRE(l, pt_gate + 1, v->alpha, 4, 1, 1, S, d);
    OPS(ps_kv_slot_pool(ctx, v->pooled, v->alpha, &ch));
    FIRE(l, pt_gate + 2, v->pooled, 3, 1, 1, d);
    rope_rows(v->hecos, v->hesin, w * m, 1, v->half, v->inv_comp, c->rope_compress.attention_factor);
    if (upload(kv, v->ecos, v->hecos, v->half, err) || upload(kv, v->esin, v->hesin, v->half, err)) return -1;
    OPS(ps_rmsnorm(ctx, v->ent, NULL, v->pooled, norm_w, 1, d, (float)c->rms_eps) ||
        ps_v4_rope(ctx, v->ent, v->ecos, v->esin, 1, 1, 1, d, c->rope_dim, 1, 0));
    FIRE(l, pt_gate + 3, v->ent, 3, 1, 1, d);
    for (int i = 0; i < kv->n_edits; i++) {
        const ps_kv_edit *e = &kv->edits[i];
        if (e->layer == l && e->value == value && e->entry == w && (e->seq == -1 || e->seq == seq) && edit_row(kv, e, v->ent, d, err))
            return -1;
    }
    if (ps_kv_rows_push(kv, ents, v->ent)) return page_fail(kv, err, "a KV cache page");
    return 0;
}

/* The compressor rows of the piece (kv_raw | z, [n, c·d] each) onto `open`, then the windows that close in
 * the piece. */
static int compress_piece(ps_kvcache *kv, int seq, int l, int64_t p0, int64_t n, int64_t d, int overlap, const float *kv_raw,
                          const float *z, const float *ape, const float *norm_w, ps_kv_rows *open, ps_kv_rows *ents, int value,
                          int pt_gate, const ps_hooks *hooks, ps_error *err) {
    struct ps_v4_kvcache *v = ((struct ps_v4_kvcache *)kv->impl);
    int64_t cd = (overlap ? 2 : 1) * d, m = cfg_of(kv)->compress_rate[l];
    for (int64_t r = 0; r < n; r++)
        if (buf_copy(kv, v->row, kv_raw + r * cd, cd) || buf_copy(kv, v->row + cd, z + r * cd, cd) || ps_kv_rows_push(kv, open, v->row))
            return page_fail(kv, err, "a KV cache page");
    for (int64_t t = p0; t < p0 + n; t++)
        if ((t + 1) % m == 0 &&
            close_window(kv, seq, l, (t + 1) / m - 1, d, overlap, ape, norm_w, open, ents, value, pt_gate, hooks, err))
            return -1;
    return 0;
}

/* The attention of layer l for the piece of sequence seq at positions p0..p0+n-1 (input a->xin; output
 * a->attn_out), as the forward's attention() with the keys from the sequence's pages. */
static int attention_piece(ps_kvcache *kv, int seq, int l, const ps_v4_layer *w, int64_t p0, int64_t n, const ps_hooks *hooks,
                           ps_error *err) {
    struct ps_v4_kvcache *v = ((struct ps_v4_kvcache *)kv->impl);
    ps_v4_acts *a = &v->a;
    ps_ctx *ctx = kv->ctx;
    const ps_v4_config *c = cfg_of(kv);
    ps_kv_layer *L = &kv->seqs[seq].layers[l];
    int64_t D = c->hidden_size, H = c->n_heads, Dh = c->head_dim, Q = c->q_lora_rank, R = c->rope_dim, m = c->compress_rate[l],
            Wn = c->sliding_window, half = v->half;
    ps_v4_attn_type at = c->attn_type[l];
    float eps = (float)c->rms_eps;
    const float *cs = at == PS_V4_SLIDING ? v->cos_m : v->cos_c, *sn = at == PS_V4_SLIDING ? v->sin_m : v->sin_c;
    (void)half;
    kv->ev = (ps_kv_event){.seq = seq, .t0 = p0, .entry = -1};
    OPS(ps_matmul(ctx, a->q_lora, a->xin, w->wq_a, n, D, Q, 0) || ps_rmsnorm(ctx, a->q_lora, NULL, a->q_lora, w->q_norm, n, Q, eps));
    FIRE(l, PS_V4H_Q_LORA, a->q_lora, 3, 1, n, Q);
    OPS(ps_matmul(ctx, a->q, a->q_lora, w->wq_b, n, Q, H * Dh, 0) || ps_rmsnorm(ctx, a->q, NULL, a->q, a->ones, n * H, Dh, eps) ||
        ps_v4_rope(ctx, a->q, cs, sn, 1, n, H, Dh, R, 1, 0));
    FIRE(l, PS_V4H_Q, a->q, 4, 1, n, H, Dh);
    OPS(ps_matmul(ctx, a->kv, a->xin, w->wkv, n, D, Dh, 0) || ps_rmsnorm(ctx, a->kv, NULL, a->kv, w->kv_norm, n, Dh, eps) ||
        ps_v4_rope(ctx, a->kv, cs, sn, 1, n, 1, Dh, R, 1, 0));
    FIRE(l, PS_V4H_KV, a->kv, 3, 1, n, Dh);
    for (int64_t r = 0; r < n; r++)
        if (ps_kv_rows_push(kv, &L->k, a->kv + r * Dh)) return page_fail(kv, err, "a KV cache page");
    /* compressed entries, and for CSA the indexer's keys and selection */
    int64_t K = 0, nE = 0;
    if (at != PS_V4_SLIDING) {
        int64_t cc = at == PS_V4_CSA ? 2 : 1;
        OPS(ps_matmul(ctx, a->c_kv_raw, a->xin, w->c_wkv, n, D, cc * Dh, 0) || ps_matmul(ctx, a->c_z, a->xin, w->c_wgate, n, D, cc * Dh, 0));
        if (compress_piece(kv, seq, l, p0, n, Dh, at == PS_V4_CSA, a->c_kv_raw, a->c_z, w->c_ape, w->c_norm, &L->ln, L->ck, 0,
                           PS_V4H_C_GATE, hooks, err))
            return -1;
        nE = L->ck->rows;
        kv->ev = (ps_kv_event){.seq = seq, .t0 = p0, .entry = -1};
    }
    if (at == PS_V4_CSA) {
        int64_t Hi = c->index_n_heads, Di = c->index_head_dim;
        OPS(ps_matmul(ctx, a->i_kv_raw, a->xin, w->i_wkv, n, D, 2 * Di, 0) || ps_matmul(ctx, a->i_z, a->xin, w->i_wgate, n, D, 2 * Di, 0));
        if (compress_piece(kv, seq, l, p0, n, Di, 1, a->i_kv_raw, a->i_z, w->i_ape, w->i_norm, &L->v, L->cv, 1, PS_V4H_I_C_GATE,
                           hooks, err))
            return -1;
        kv->ev = (ps_kv_event){.seq = seq, .t0 = p0, .entry = -1};
        K = c->index_topk < nE ? c->index_topk : nE;
        OPS(ps_matmul(ctx, a->i_q, a->q_lora, w->i_wq_b, n, Q, Hi * Di, 0) || ps_v4_rope(ctx, a->i_q, v->cos_c, v->sin_c, 1, n, Hi, Di, R, 1, 0));
        FIRE(l, PS_V4H_I_Q, a->i_q, 4, 1, n, Hi, Di);
        OPS(ps_matmul(ctx, a->i_w, a->xin, w->i_wp, n, D, Hi, 0) || ps_v4_scale(ctx, a->i_w, (float)(1.0 / sqrt((double)Hi)), n * Hi));
        FIRE(l, PS_V4H_I_WEIGHTS, a->i_w, 3, 1, n, Hi);
        if (!buf_grow(kv, &v->ik, &v->ik_cap, nE * Di, "the indexer keys", err) ||
            !buf_grow(kv, &v->scores, &v->sc_cap, n * nE, "the indexer's scores", err))
            return -1;
        if (nE > v->rows_cap) { /* the rows 0 .. nE - 1 of the keys' gather */
            int64_t cap = v->rows_cap ? 2 * v->rows_cap : 64;
            while (cap < nE) cap *= 2;
            int64_t *nr = realloc(v->rows, (size_t)cap * sizeof *nr);
            if (!nr) return ps_fail(err, "out of memory for the indexer's scores over %lld entries", (long long)nE);
            for (int64_t i = v->rows_cap; i < cap; i++) nr[i] = i;
            v->rows = nr, v->rows_cap = cap;
        }
        ps_kv_pages ikp = pages_of(L->cv);
        OPS(ps_kv_gather(ctx, v->ik, &ikp, v->rows, nE));
        OPS(ps_v4_indexer_scores(ctx, v->scores, a->i_q, v->ik, a->i_w, 1, n, nE, Hi, Di, (float)(1.0 / sqrt((double)Di))));
        FIRE(l, PS_V4H_I_SCORES, v->scores, 3, 1, n, nE);
        /* per query, the top K among the entries it sees: ps_v4_topk over the row's first (t + 1) / m columns */
        for (int64_t r = 0; r < n; r++) {
            int64_t vis = (p0 + r + 1) / m;
            if (vis > nE) vis = nE;
            OPS(ps_v4_topk(ctx, v->topk + r * K, v->gap + r, v->scores + r * nE, NULL, 1, vis, K, 1, 0));
        }
        if (HOOKED(l, PS_V4H_I_TOPK)) {
            int64_t shp[3] = {1, n, K};
            if (ps_hooks_fire_point(ctx, hooks, l, PS_V4H_I_TOPK, v->topk, 3, shp, err)) return -1;
            const float *ti = v->topk; /* what the hook left, read on the host */
            if (!ps_ctx_host_visible(ctx)) {
                if (ps_buf_to_host(ctx, v->host_idx, v->topk, n * K * (int64_t)sizeof(float), err)) return -1;
                ti = v->host_idx;
            }
            for (int64_t i = 0; i < n * K; i++) {
                float f = ti[i];
                int bad = f != floorf(f) || !(f >= -1.0f) || !(f < (float)nE);
                for (int64_t j = i - i % K; j < i && !bad; j++) bad = f >= 0 && ti[j] == f;
                if (bad)
                    return ps_fail(err, "hook \"layers.%d.attn.indexer.topk\": entry %lld of row %lld is %g: not an index in [-1, %lld) or a repeat",
                                   l, (long long)(i % K), (long long)(i / K), (double)f, (long long)nE);
            }
        }
        FIRE(l, PS_V4H_I_GAP, v->gap, 2, 1, n);
    }
    /* attention (the backend's v4_kv_attend over the pages; as ps_cpu_v4_attn): query t over the raw rows
     * t-W+1..t, then its entries, with the sink */
    float scale = (float)(1.0 / sqrt((double)Dh));
    ps_v4_kv_attn ka = {.H = H, .Dh = Dh, .W = Wn, .m = at == PS_V4_SLIDING ? 0 : m, .K = K, .nE = nE, .t0 = p0, .n = n,
                        .scale = scale, .kv = pages_of(&L->k)};
    if (at != PS_V4_SLIDING) ka.ent = pages_of(L->ck);
    OPS(ps_v4_kv_attend(ctx, a->heads, a->sinkp, a->q, K > 0 ? v->topk : NULL, w->sink, &ka));
    if (HOOKED(l, PS_V4H_SINK)) {
        ps_v4_attn_geom g = {.B = 1, .T = n, .H = H, .Dh = Dh, .nW = nE, .K = K, .W = Wn, .m = at == PS_V4_SLIDING ? 0 : m, .scale = scale};
        OPS(ps_copy(ctx, a->sink_old, a->sinkp, H * n));
        FIRE(l, PS_V4H_SINK, a->sinkp, 3, 1, H, n);
        OPS(ps_v4_sink_rescale(ctx, a->heads, a->sink_old, a->sinkp, &g));
    }
    OPS(ps_v4_rope(ctx, a->heads, cs, sn, 1, n, H, Dh, R, 1, 1));
    FIRE(l, PS_V4H_OUT_HEADS, a->heads, 4, 1, n, H, Dh);
    int64_t G = c->o_groups, OR = c->o_lora_rank;
    OPS(ps_v4_grouped_linear(ctx, a->oa, a->heads, w->wo_a, n, G, H * Dh / G, OR) ||
        ps_matmul(ctx, a->attn_out, a->oa, w->wo_b, n, G * OR, D, 0));
    FIRE(l, PS_V4H_ATTN_OUT, a->attn_out, 3, 1, n, D);
    return 0;
}

/* Free what no position from T on needs any more (beyond opts.history). */
static void slide(ps_kvcache *kv, ps_kv_seq *q) {
    const ps_v4_config *c = cfg_of(kv);
    int64_t T = q->T, hist = kv->o.history;
    for (int l = 0; l < c->n_layers; l++) {
        ps_kv_layer *L = &q->layers[l];
        ps_kv_rows_drop_front(kv, &L->k, T - (c->sliding_window - 1) - hist);
        if (!comp_layer(c, l)) continue;
        ps_kv_rows_drop_front(kv, &L->ln, T - (slots(c, l) - 1) - hist);
        if (csa_layer(c, l)) ps_kv_rows_drop_front(kv, &L->v, T - (slots(c, l) - 1) - hist);
    }
}

/* One piece of n tokens of sequence seq through the model; logits [n, V] (or the last row only) to out. */
static int run_piece(ps_kvcache *kv, int seq, const int32_t *tokens, int64_t n, const ps_hooks *hooks, float *out, bool last_only,
                     ps_error *err) {
    struct ps_v4_kvcache *v = ((struct ps_v4_kvcache *)kv->impl);
    ps_v4_model *m = v->m;
    ps_v4_acts *a = &v->a;
    ps_ctx *ctx = kv->ctx;
    const ps_v4_config *c = &m->cfg;
    ps_kv_seq *q = &kv->seqs[seq];
    int64_t p0 = q->T, N = c->hc_mult, D = c->hidden_size, V = c->vocab_size, L = c->n_layers;
    int gslot = (int)L;
    a->T = n;
    memcpy(v->tok, tokens, (size_t)n * sizeof *v->tok);
    rope_rows(v->hcos_m, v->hsin_m, p0, n, v->half, v->inv_main, c->rope_main.attention_factor);
    rope_rows(v->hcos_c, v->hsin_c, p0, n, v->half, v->inv_comp, c->rope_compress.attention_factor);
    if (upload(kv, v->cos_m, v->hcos_m, n * v->half, err) || upload(kv, v->sin_m, v->hsin_m, n * v->half, err) ||
        upload(kv, v->cos_c, v->hcos_c, n * v->half, err) || upload(kv, v->sin_c, v->hsin_c, n * v->half, err))
        return -1;
    kv->ev = (ps_kv_event){.seq = seq, .t0 = p0, .entry = -1};
    OPS(ps_embed(ctx, a->x, v->tok, ps_v4_global(m, PS_V4_T_EMBED), n, D));
    FIRE(gslot, PS_V4H_EMBED, a->x, 3, 1, n, D);
    OPS(ps_gather_rows(ctx, a->h, a->x, NULL, a->rows_bcast, n * N, D));
    for (int l = 0; l < L; l++) {
        ps_v4_layer w;
        if (ps_v4_layer_acquire(m, l, &w, err)) return -1;
        float *t;
        kv->ev = (ps_kv_event){.seq = seq, .t0 = p0, .entry = -1};
        int rc = ps_v4_hc_site(a, l, w.hc_attn_fn, w.hc_attn_base, w.hc_attn_scale, w.attn_norm, PS_V4H_ATTN_HC_PRE, PS_V4H_ATTN_IN,
                               hooks, err) ||
                 attention_piece(kv, seq, l, &w, p0, n, hooks, err);
        if (!rc) {
            kv->ev = (ps_kv_event){.seq = seq, .t0 = p0, .entry = -1};
            rc = ps_v4_hc_expand(ctx, a->h2, a->post, a->comb, a->attn_out, a->h, n, N, D) ? ps_ctx_check(ctx, err) : 0;
        }
        if (!rc) {
            t = a->h, a->h = a->h2, a->h2 = t;
            if (HOOKED(l, PS_V4H_MID)) {
                int64_t shp[4] = {1, n, N, D};
                rc = ps_hooks_fire_point(ctx, hooks, l, PS_V4H_MID, a->h, 4, shp, err);
            }
        }
        if (!rc)
            rc = ps_v4_hc_site(a, l, w.hc_ffn_fn, w.hc_ffn_base, w.hc_ffn_scale, w.ffn_norm, PS_V4H_FFN_HC_PRE, PS_V4H_FFN_IN, hooks,
                               err) ||
                 ps_v4_moe(a, l, &w, v->tok, hooks, err);
        if (!rc) rc = ps_v4_hc_expand(ctx, a->h2, a->post, a->comb, a->ffn_out, a->h, n, N, D) ? ps_ctx_check(ctx, err) : 0;
        if (!rc) {
            t = a->h, a->h = a->h2, a->h2 = t;
            if (HOOKED(l, PS_V4H_OUT)) {
                int64_t shp[4] = {1, n, N, D};
                rc = ps_hooks_fire_point(ctx, hooks, l, PS_V4H_OUT, a->h, 4, shp, err);
            }
        }
        ps_v4_layer_release(m, l);
        if (rc) return ps_fail_prefix(err, "layer %d: ", l);
    }
    OPS(ps_matmul(ctx, a->mix, a->h, ps_v4_global(m, PS_V4_T_HC_HEAD_FN), n, N * D, N, 0) ||
        ps_v4_hc_weights(ctx, a->pre, NULL, NULL, a->mix, a->h, ps_v4_global(m, PS_V4_T_HC_HEAD_SCALE),
                         ps_v4_global(m, PS_V4_T_HC_HEAD_BASE), n, N, D, 0, (float)c->hc_eps, (float)c->rms_eps));
    FIRE(gslot, PS_V4H_HC_HEAD_PRE, a->pre, 3, 1, n, N);
    OPS(ps_v4_hc_collapse(ctx, a->final_x, a->pre, a->h, n, N, D) ||
        ps_rmsnorm(ctx, a->final_hidden, NULL, a->final_x, ps_v4_global(m, PS_V4_T_NORM), n, D, (float)c->rms_eps));
    FIRE(gslot, PS_V4H_FINAL_HIDDEN, a->final_hidden, 3, 1, n, D);
    OPS(ps_matmul(ctx, a->logits, a->final_hidden, ps_v4_global(m, PS_V4_T_HEAD), n, D, V, 0));
    FIRE(gslot, PS_V4H_LOGITS_OUT, a->logits, 3, 1, n, V);
    if (out) {
        const float *src = last_only ? a->logits + (n - 1) * V : a->logits;
        int64_t cnt = last_only ? V : n * V;
        if (ps_ctx_host_visible(ctx)) memcpy(out, src, (size_t)cnt * sizeof(float));
        else if (ps_buf_to_host(ctx, out, src, cnt * (int64_t)sizeof(float), err)) return -1;
    }
    q->T = p0 + n;
    slide(kv, q);
    return 0;
}

int ps_v4_kvcache_append(ps_kvcache *kv, int n_seq, const int *seqs, const int64_t *n, const int32_t *tokens,
                         const ps_hooks *hooks, float *logits, bool last_only, ps_error *err) {
    const ps_v4_config *c = cfg_of(kv);
    if (hooks && hooks->mask && (hooks->family != &ps_v4_hook_family || hooks->n_layers != c->n_layers + 1))
        return ps_fail(err, "the hooks were registered for another model (use ps_v4_hooks_add with this model's config)");
    for (int l = 0; l < c->n_layers; l++) {
        int pts[] = {PS_V4H_BIAS, PS_V4H_LOGITS, PS_V4H_PATTERN};
        for (int i = 0; i < 3; i++)
            if (HOOKED(l, pts[i])) {
                char nm[96];
                ps_v4_hook_name(nm, sizeof nm, l, pts[i]);
                return ps_fail(err, "hook \"%s\" is not available during a KV cache append (run the sequence whole with the forward)", nm);
            }
    }
    if (ps_kvcache_check_request(kv, n_seq, seqs, n, tokens, err)) return -1;
    int64_t R = kv->o.chunk, V = c->vocab_size, off = 0;
    for (int i = 0; i < n_seq; i++) {
        for (int64_t done = 0; done < n[i]; done += R) {
            int64_t np = n[i] - done < R ? n[i] - done : R;
            float *out = NULL;
            bool last = false;
            if (logits && !last_only) out = logits + (off + done) * V;
            else if (logits && done + np == n[i]) out = logits + (int64_t)i * V, last = true;
            if (run_piece(kv, seqs[i], tokens + off + done, np, hooks, out, last, err)) {
                cut(kv, &kv->seqs[seqs[i]], kv->seqs[seqs[i]].T); /* the failed piece's rows out again */
                return ps_fail_prefix(err, "KV cache append (sequence %d, positions %lld..%lld): ", seqs[i],
                                      (long long)kv->seqs[seqs[i]].T, (long long)(kv->seqs[seqs[i]].T + np - 1));
            }
        }
        off += n[i];
    }
    return 0;
}

/* ---- the cache as the DeepSeek-V4 family's table (core/kvcache.h ps_kvcache_ops) ---- */

static int v4_create_rt(ps_kvcache *kv, const struct ps_runtime *rt, const ps_kvcache_opts *o, ps_error *err) {
    return ps_v4_kvcache_create(kv, (ps_v4_model *)rt->model, o, err);
}
static int v4_point_parse(const ps_kvcache *kv, const char *name, int *layer, int *value, ps_error *err) {
    return ps_v4_kvcache_point_parse(cfg_of(kv), name, layer, value, err);
}
static void v4_point_name(const ps_kvcache *kv, int layer, int value, char *buf, size_t n) {
    (void)kv;
    snprintf(buf, n, "layers.%d.attn.%s", layer, value ? "cache_ik" : "cache_kv");
}
static int64_t v4_entry_heads(const ps_kvcache *kv) {
    (void)kv;
    return 1;
}
static int64_t v4_entry_width(const ps_kvcache *kv, int l, int value) {
    (void)l;
    return value ? cfg_of(kv)->index_head_dim : cfg_of(kv)->head_dim;
}

const ps_kvcache_ops ps_v4_kvcache_ops = {
    .name = "deepseek_v4",
    .create = v4_create_rt,
    .free = ps_v4_kvcache_free,
    .add = ps_v4_kvcache_add,
    .fork = ps_v4_kvcache_fork,
    .drop = ps_v4_kvcache_drop,
    .truncate = ps_v4_kvcache_truncate,
    .append = ps_v4_kvcache_append,
    .n_entries = ps_v4_kvcache_n_entries,
    .entry = ps_v4_kvcache_entry,
    .edit = ps_v4_kvcache_edit,
    .bytes = ps_v4_kvcache_bytes,
    .point_parse = v4_point_parse,
    .point_name = v4_point_name,
    .vocab = ps_v4_kvcache_vocab,
    .max_len = ps_v4_kvcache_max_len,
    .entry_heads = v4_entry_heads,
    .entry_width = v4_entry_width,
    .max_len_name = "max_position_embeddings",
    .edit_form = "layers.L.attn.cache_kv:0:ENTRY:zero|mean (or cache_ik)",
    .one_head = "a DeepSeek-V4 layer has one K = V head (0)",
};
