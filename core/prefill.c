#include "core/prefill.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fileio.h"
#include "core/ops.h"
#include "core/select.h"
#include "core/windows.h"

/* ---- size table: per layer the carried state, then one chunk's working set ---- */

typedef struct {
    float **ptr;
    int64_t n;
} pf_spec;

static int prefill_specs(pf_spec *s, ps_prefill *p, const ps_config *c, int64_t T_max, int64_t C, int64_t nW_max,
                         int64_t hk, int64_t ha) {
    int comp = c->kind == PS_ATTN_COMPRESSED, sel = c->kind == PS_ATTN_SELECT;
    int64_t d = c->d_model, hd = c->head_dim, nh = c->n_heads, nkv = c->n_kv_heads, W = c->window, S = c->stride,
            dff = c->d_ff, V = c->vocab_size, ks = nkv * hd;
    ps_select_cfg sc = ps_config_select(c);
    int64_t N1 = sel ? ps_select_n_windows(T_max, W, S) : 0, N2 = sel ? ps_select_n_windows(T_max, 4 * W, 4 * S) : 0,
            nb = sel ? ps_select_n_blocks(&sc, T_max) : 0, ns = sel ? ps_select_slots(&sc) : 0;
    int64_t krows = comp ? hk + C : T_max;
    /* windows completed inside one chunk: at most those ending in it (offset grids: per head, from the fewest
     * done to the most, one more) */
    int offs = comp && c->any_head_offset;
    int64_t nwin = comp ? C / S + 2 + offs : 0;
    int k = 0;
#define SPEC(field, count) s[k++] = (pf_spec){&(field), (count)}
    for (int64_t l = 0; l < c->n_layers; l++) {
        ps_prefill_layer *L = &p->layers[l];
        SPEC(L->k, krows * ks);
        SPEC(L->v, krows * ks);
        SPEC(L->ck, comp ? nW_max * ks : 0);
        SPEC(L->cv, comp ? nW_max * ks : 0);
        SPEC(L->a, comp ? (ha + C) * d : 0);
        SPEC(L->k1, N1 * ks);
        SPEC(L->k2, N2 * ks);
    }
    SPEC(p->sel_P, C * nkv * N1);
    SPEC(p->sel_bs, C * nkv * nb);
    SPEC(p->sel_blocks, C * nkv * ns);
    SPEC(p->x, C * d);
    SPEC(p->q_pre, C * nh * hd);
    SPEC(p->q, C * nh * hd);
    SPEC(p->k_pre, C * ks);
    SPEC(p->rstd, C * (nh > nkv ? nh : nkv) + (ha + C) + nwin * nkv);
    SPEC(p->z, C * nh * hd);
    SPEC(p->attn_out, C * d);
    SPEC(p->mid, C * d);
    SPEC(p->ln2, C * d);
    SPEC(p->a_full, comp ? 0 : C * d);
    SPEC(p->g, C * dff);
    SPEC(p->u, C * dff);
    SPEC(p->h, C * dff);
    SPEC(p->mlp_out, C * d);
    SPEC(p->gz_k, nwin * nkv * W);
    SPEC(p->ga_k, nwin * nkv * W);
    SPEC(p->gz_v, nwin * nkv * W);
    SPEC(p->ga_v, nwin * nkv * W);
    SPEC(p->pk, nwin * W * ks);
    SPEC(p->pv, nwin * W * ks);
    SPEC(p->ck_pre, nwin * ks);
    SPEC(p->ck_new, offs ? nwin * ks : 0);
    SPEC(p->cv_new, offs ? nwin * ks : 0);
    SPEC(p->pscratch, comp && c->payload == PS_PAYLOAD_SHARED ? (ha + C) * ks : 0);
    SPEC(p->tmp, comp ? (hk * ks > ha * d ? hk * ks : ha * d) + 1 : 0);
    SPEC(p->rope_cos, c->rope ? T_max * (hd / 2) : 0);
    SPEC(p->rope_sin, c->rope ? T_max * (hd / 2) : 0);
    int64_t R = C < PS_PREFILL_ROWS ? C : PS_PREFILL_ROWS;
    SPEC(p->rows_x, R * d);
    SPEC(p->rows_ln, R * d);
    SPEC(p->rows_logits, R * V);
    SPEC(p->rows_rstd, R);
#undef SPEC
    return k;
}

static void geometry(const ps_config *c, int64_t T_max, int64_t *nW_max, int64_t *hk, int64_t *ha) {
    int comp = c->kind == PS_ATTN_COMPRESSED;
    *nW_max = ps_config_n_windows(c, T_max);
    *hk = comp ? c->local_window - 1 : 0;
    *ha = comp ? c->window - 1 : 0;
}

double ps_prefill_bytes(const ps_config *c, int64_t T_max, int64_t chunk) {
    int64_t nW_max, hk, ha;
    geometry(c, T_max, &nW_max, &hk, &ha);
    ps_prefill p;
    memset(&p, 0, sizeof p);
    ps_prefill_layer *layers = calloc((size_t)c->n_layers, sizeof *layers);
    if (!layers) return -1;
    p.layers = layers;
    pf_spec *s = malloc((size_t)(7 * c->n_layers + 42) * sizeof *s);
    double tot = 0;
    if (s) {
        int n = prefill_specs(s, &p, c, T_max, chunk, nW_max, hk, ha);
        for (int i = 0; i < n; i++) tot += (double)s[i].n;
    }
    free(s);
    free(layers);
    return tot * 4.0;
}

void ps_prefill_free(ps_prefill *p) {
    if (p->ctx) ps_buf_free(p->ctx, p->buf, p->n_floats * (int64_t)sizeof(float));
    free(p->layers);
    free(p->woff);
    memset(p, 0, sizeof *p);
}

int ps_prefill_create(ps_prefill *p, const ps_model *m, int64_t T_max, int64_t chunk, ps_error *err) {
    memset(p, 0, sizeof *p);
    const ps_config *c = &m->cfg;
    if (T_max < 1 || chunk < 1)
        return ps_fail(err, "prefill of %lld tokens in chunks of %lld: both must be >= 1", (long long)T_max, (long long)chunk);
    if (T_max > c->max_seq_len)
        return ps_fail(err, "sequence of %lld tokens exceeds max_seq_len %lld", (long long)T_max, (long long)c->max_seq_len);
    if (c->kind == PS_ATTN_CHANNEL) return ps_fail(err, "the chunked prefill does not support the channel attention (run prompts whole)");
    if (c->kind == PS_ATTN_COMPRESSED && c->boundaries == PS_BOUNDARIES_CONTENT)
        return ps_fail(err, "the chunked prefill does not support content chunk boundaries (attention.boundaries \"content\"; run prompts whole)");
    if (chunk > T_max) chunk = T_max;
    p->m = m;
    p->ctx = m->ctx;
    p->T_max = T_max;
    p->chunk = chunk;
    geometry(c, T_max, &p->nW_max, &p->hist_k, &p->hist_a);
    p->layers = calloc((size_t)c->n_layers, sizeof *p->layers);
    pf_spec *s = malloc((size_t)(7 * c->n_layers + 42) * sizeof *s);
    if (c->kind == PS_ATTN_COMPRESSED && c->any_head_offset) { /* each layer's grid offsets */
        p->woff = malloc((size_t)(c->n_layers * c->n_kv_heads) * sizeof *p->woff);
        for (int64_t l = 0; p->woff && l < c->n_layers; l++)
            for (int64_t g = 0; g < c->n_kv_heads; g++) p->woff[l * c->n_kv_heads + g] = ps_config_grid_offset(c, l, g);
    }
    if (!p->layers || !s || (c->kind == PS_ATTN_COMPRESSED && c->any_head_offset && !p->woff)) {
        free(s);
        ps_prefill_free(p);
        return ps_fail(err, "out of memory for the prefill tables of %lld layers", (long long)c->n_layers);
    }
    int n = prefill_specs(s, p, c, T_max, chunk, p->nW_max, p->hist_k, p->hist_a);
    double tot = 0;
    for (int i = 0; i < n; i++) tot += (double)s[i].n;
    uint64_t avail = ps_ctx_mem_free(m->ctx);
    if (avail && tot * 4 > (double)avail) {
        free(s);
        ps_prefill_free(p);
        return ps_fail(err, "prefill of %lld tokens needs %.2f GiB (%s) but only %.2f GiB of memory is available",
                       (long long)T_max, tot * 4 / 1073741824.0,
                       c->kind == PS_ATTN_FULL ? "the keys and values of every position, every layer" : "caches and one chunk",
                       (double)avail / 1073741824.0);
    }
    char what[96];
    snprintf(what, sizeof what, "prefill state for %lld tokens", (long long)T_max);
    p->n_floats = (int64_t)tot;
    p->buf = ps_buf_alloc(p->ctx, p->n_floats * (int64_t)sizeof(float), what, err);
    if (!p->buf) {
        free(s);
        free(p->layers);
        p->layers = NULL;
        return -1;
    }
    int64_t off = 0;
    for (int i = 0; i < n; i++) {
        *s[i].ptr = s[i].n ? p->buf + off : NULL;
        off += s[i].n;
    }
    free(s);
    if (c->rope && ps_rope_table(p->ctx, p->rope_cos, p->rope_sin, T_max, c->head_dim, c->rope_theta)) {
        ps_prefill_free(p);
        return ps_ctx_check(m->ctx, err);
    }
    return 0;
}

/* Move the last `keep` rows (of `width` floats) of a frame holding `have` rows to its front. */
static int keep_tail(ps_ctx *ctx, float *frame, float *tmp, int64_t have, int64_t keep, int64_t width) {
    if (keep <= 0 || have == keep) return 0;
    return ps_copy(ctx, tmp, frame + (have - keep) * width, keep * width) || ps_copy(ctx, frame, tmp, keep * width);
}

/* The select attention of the chunk [t0, t1) of a prefill of T tokens (the selection ops of core/ops.h): the windows
 * of both levels completed by t1 pooled (nw_done[0], [1]: those done before), then as ps_forward over T tokens:
 * dense below dense_len, else stage 1, block scores over the blocks of T tokens, top-k and attention over the
 * selected blocks — the chunk's rows of the whole forward's select_attention. 0, or -1 with the context failed. */
static int select_chunk(ps_prefill *p, int l, int64_t t0, int64_t t1, int64_t T, int64_t *nw_done) {
    const ps_config *c = &p->m->cfg;
    ps_ctx *ctx = p->ctx;
    ps_prefill_layer *L = &p->layers[l];
    ps_select_cfg sc = ps_config_select(c);
    int64_t C = t1 - t0, nh = c->n_heads, nkv = c->n_kv_heads, hd = c->head_dim, ks = nkv * hd, K = c->window, S = c->stride;
    int64_t N1 = ps_select_n_windows(t1, K, S), N2 = ps_select_n_windows(t1, 4 * K, 4 * S), nb = ps_select_n_blocks(&sc, T);
    ps_sel_geom g = {.B = 1, .n = C, .pos0 = t0, .L = t1, .H = nh, .Hkv = nkv, .D = hd, .N1 = N1, .N2 = N2, .nb = nb, .sel = sc};
    /* windows j0.. of a level: ps_select_compress over the keys from window j0's first position */
    if (N1 > nw_done[0] &&
        ps_select_compress(ctx, L->k1 + nw_done[0] * ks, L->k + nw_done[0] * S * ks, 1, t1 - nw_done[0] * S, nkv, hd, K, S))
        return -1;
    if (N2 > nw_done[1] && ps_select_compress(ctx, L->k2 + nw_done[1] * ks, L->k + nw_done[1] * 4 * S * ks, 1,
                                              t1 - nw_done[1] * 4 * S, nkv, hd, 4 * K, 4 * S))
        return -1;
    nw_done[0] = N1 > nw_done[0] ? N1 : nw_done[0];
    nw_done[1] = N2 > nw_done[1] ? N2 : nw_done[1];
    if (!ps_select_sparse(c, T)) return ps_select_attn(ctx, p->z, NULL, p->q, L->k, L->v, NULL, &g);
    return ps_select_scores(ctx, p->sel_P, p->q, L->k1, L->k2, &g) || ps_select_block_scores(ctx, p->sel_bs, p->sel_P, &g) ||
                   ps_select_topk(ctx, p->sel_blocks, p->sel_bs, &g) ||
                   ps_select_attn(ctx, p->z, NULL, p->q, L->k, L->v, p->sel_blocks, &g)
               ? -1
               : 0;
}

/* Offset grids (layer l's offsets woff [nkv]): the windows of each KV head that end in the chunk [t0, t1),
 * pooled from the compressor frame L->a (ha history rows, then the chunk) into ck / cv at their indices. Head
 * g has done[g] windows before the chunk and tot[g] after; the table spans indices [j0, j1) (the fewest done,
 * the most after), with the windows a head has not got here (done already, or not ended yet) absent: their
 * pooled entries are 0 and only those of a head's new windows are copied. */
static int offset_windows(ps_prefill *p, int l, const int64_t *woff, int64_t t0, int64_t t1, int64_t ha) {
    const ps_model *m = p->m;
    const ps_config *c = &m->cfg;
    ps_ctx *ctx = p->ctx;
    ps_layer_params w = ps_model_layer(m, m->params, l);
    ps_prefill_layer *L = &p->layers[l];
    int64_t nkv = c->n_kv_heads, hd = c->head_dim, ks = nkv * hd, d = c->d_model, W = c->window, S = c->stride, half = hd / 2;
    int64_t j0 = INT64_MAX, j1 = 0, fs = t0 - ha, Tw = ha + (t1 - t0); /* fs: the frame's first position */
    for (int64_t g = 0; g < nkv; g++) {
        int64_t dn = t0 > 0 ? ps_windows_seen_at(t0 - 1, woff[g], W, S, p->nW_max) : 0, tt = ps_windows_seen_at(t1 - 1, woff[g], W, S, p->nW_max);
        j0 = dn < j0 ? dn : j0;
        j1 = tt > j1 ? tt : j1;
    }
    int64_t nn = j1 - j0;
    if (nn <= 0) return 0;
    if (nn > (t1 - t0) / S + 3)
        return ps_ctx_fail(ctx, "prefill: %lld windows of an offset grid in a chunk of %lld tokens (at most %lld)", (long long)nn,
                           (long long)(t1 - t0), (long long)((t1 - t0) / S + 3));
    int64_t *tab = malloc((size_t)(2 * nn * nkv) * sizeof *tab);
    char *fresh = malloc((size_t)(nn * nkv));
    if (!tab || !fresh) {
        free(tab);
        free(fresh);
        return ps_ctx_fail(ctx, "prefill: out of memory for the window table of %lld windows", (long long)nn);
    }
    int64_t *start = tab, *len = tab + nn * nkv;
    for (int64_t j = 0; j < nn; j++)
        for (int64_t g = 0; g < nkv; g++) {
            int64_t J = j0 + j, e = j * nkv + g, s0 = J * S + woff[g]; /* window J of head g: positions s0 .. s0 + W - 1 */
            int64_t dn = t0 > 0 ? ps_windows_seen_at(t0 - 1, woff[g], W, S, p->nW_max) : 0;
            fresh[e] = J >= dn; /* not pooled before: this chunk writes its entry (0 while it has not ended) */
            int ends = J >= dn && s0 + W - 1 <= t1 - 1 && J < p->nW_max;
            start[e] = ends ? s0 - fs : -1, len[e] = ends ? W : 0;
        }
    ps_windows wt = {.B = 1, .T = Tw, .nW = nn, .nkv = nkv, .W = W, .H = nkv, .S = 0, .start = start, .len = len};
    int learned = c->gate == PS_GATE_LEARNED, shared = c->payload == PS_PAYLOAD_SHARED;
    const float *cos_f = c->rope ? p->rope_cos + fs * half : NULL, *sin_f = c->rope ? p->rope_sin + fs * half : NULL;
    int rc = ps_gate(ctx, p->gz_k, p->ga_k, L->a, learned ? w.key_gate_w : NULL, w.key_gate_b, d, &wt) ||
             ps_gate(ctx, p->gz_v, p->ga_v, L->a, learned ? w.value_gate_w : NULL, w.value_gate_b, d, &wt) ||
             ps_payload(ctx, p->pk, L->a, w.key_payload, shared, p->pscratch, d, hd, &wt) ||
             ps_payload(ctx, p->pv, L->a, w.value_payload, shared, p->pscratch, d, hd, &wt) ||
             ps_pool(ctx, p->ck_pre, p->ga_k, p->pk, 1, nn, W, nkv, hd) || ps_pool(ctx, p->cv_new, p->ga_v, p->pv, 1, nn, W, nkv, hd) ||
             (c->qk_norm ? ps_rmsnorm(ctx, p->ck_new, p->rstd, p->ck_pre, w.knorm, nn * nkv, hd, (float)c->rms_eps)
                         : ps_copy(ctx, p->ck_new, p->ck_pre, nn * ks)) ||
             (c->rope && ps_rope_windows(ctx, p->ck_new, cos_f, sin_f, hd, &wt, 0));
    for (int64_t e = 0; e < nn * nkv && !rc; e++) {
        int64_t J = j0 + e / nkv, g = e % nkv;
        if (!fresh[e] || J >= p->nW_max) continue;
        rc = ps_copy(ctx, L->ck + J * ks + g * hd, p->ck_new + e * hd, hd) || ps_copy(ctx, L->cv + J * ks + g * hd, p->cv_new + e * hd, hd);
    }
    free(tab);
    free(fresh);
    return rc ? -1 : 0;
}

/* One layer over the chunk [t0, t1) of T tokens: p->x is its input and becomes its output. */
static int layer_chunk(ps_prefill *p, int l, int64_t t0, int64_t t1, int64_t T, int64_t *nw_done) {
    const ps_model *m = p->m;
    const ps_config *c = &m->cfg;
    ps_ctx *ctx = p->ctx;
    ps_layer_params w = ps_model_layer(m, m->params, l);
    ps_prefill_layer *L = &p->layers[l];
    int comp = c->kind == PS_ATTN_COMPRESSED;
    int64_t C = t1 - t0, d = c->d_model, hd = c->head_dim, nh = c->n_heads, nkv = c->n_kv_heads, ks = nkv * hd,
            dff = c->d_ff, W = c->window, S = c->stride, half = hd / 2;
    float eps = (float)c->rms_eps;
    /* history rows of the frames before this chunk (what the previous chunk left at their ends) */
    int64_t hk = comp ? (t0 < p->hist_k ? t0 : p->hist_k) : t0;
    int64_t ha = comp ? (t0 < p->hist_a ? t0 : p->hist_a) : 0;
    if (comp && t0 > 0) {
        int64_t prev_c = t0 - (t0 - 1) / p->chunk * p->chunk; /* rows of the previous chunk */
        int64_t hk_prev = t0 - prev_c < p->hist_k ? t0 - prev_c : p->hist_k;
        int64_t ha_prev = t0 - prev_c < p->hist_a ? t0 - prev_c : p->hist_a;
        if (keep_tail(ctx, L->k, p->tmp, hk_prev + prev_c, hk, ks) || keep_tail(ctx, L->v, p->tmp, hk_prev + prev_c, hk, ks) ||
            keep_tail(ctx, L->a, p->tmp, ha_prev + prev_c, ha, d))
            return -1;
    }
    float *a = comp ? L->a + ha * d : p->a_full; /* this chunk's RMSNorm'd input [C, d] */
    float *kdst = L->k + hk * ks, *vdst = L->v + hk * ks;
    const float *cos_t = c->rope ? p->rope_cos + t0 * half : NULL, *sin_t = c->rope ? p->rope_sin + t0 * half : NULL;
    if (ps_rmsnorm(ctx, a, p->rstd, p->x, w.in_norm, C, d, eps) ||
        ps_matmul(ctx, p->q_pre, a, w.wq, C, d, nh * hd, 0) || ps_matmul(ctx, p->k_pre, a, w.wk, C, d, ks, 0) ||
        ps_matmul(ctx, vdst, a, w.wv, C, d, ks, 0))
        return -1;
    if (c->qk_norm) {
        if (ps_rmsnorm(ctx, p->q, p->rstd, p->q_pre, w.qnorm, C * nh, hd, eps) ||
            ps_rmsnorm(ctx, kdst, p->rstd, p->k_pre, w.knorm, C * nkv, hd, eps))
            return -1;
    } else if (ps_copy(ctx, p->q, p->q_pre, C * nh * hd) || ps_copy(ctx, kdst, p->k_pre, C * ks))
        return -1;
    if (c->rope && (ps_rope(ctx, p->q, cos_t, sin_t, 1, C, nh, hd, 1) || ps_rope(ctx, kdst, cos_t, sin_t, 1, C, nkv, hd, 1)))
        return -1;
    ps_attn_frame f = {.nh = nh, .nkv = nkv, .hd = hd, .compressed = comp, .Tq = C, .Tk = hk + C, .q_off = hk, .pos0 = t0 - hk};
    const int64_t *woff = comp && p->woff ? p->woff + (int64_t)l * nkv : NULL; /* layer l's grid offsets */
    if (woff) {
        if (offset_windows(p, l, woff, t0, t1, ha)) return -1;
        int64_t nw = 0;
        for (int64_t g = 0; g < nkv; g++) {
            int64_t e = ps_windows_seen_at(t1 - 1, woff[g], W, S, p->nW_max);
            nw = e > nw ? e : nw;
        }
        f.W = W, f.S = S, f.LW = c->local_window, f.nW = nw, f.woff = woff;
    } else if (comp) {
        /* windows completed by t1 that were not before: pooled from the frame's rows */
        int64_t nw_tot = ps_windows_seen(t1 - 1, W, S, p->nW_max), j0 = *nw_done, nn = nw_tot - j0;
        if (nn > 0) {
            int learned = c->gate == PS_GATE_LEARNED, shared = c->payload == PS_PAYLOAD_SHARED;
            int64_t r0 = j0 * S - (t0 - ha); /* frame row of window j0's first position */
            const float *aw = L->a + r0 * d;
            int64_t Tw = ha + C - r0;        /* frame rows from there on */
            float *ckd = L->ck + j0 * ks, *cvd = L->cv + j0 * ks;
            /* the nn windows as a table over the frame rows from r0 (the base grid: window j at j*S) */
            int64_t *wtab = malloc((size_t)(2 * nn) * sizeof *wtab);
            if (!wtab) return ps_ctx_fail(ctx, "prefill: out of memory for the window table of %lld windows", (long long)nn);
            ps_windows wt = ps_windows_grid(wtab, wtab + nn, 1, Tw, nn, W, S, nkv, NULL);
            int rc = ps_gate(ctx, p->gz_k, p->ga_k, aw, learned ? w.key_gate_w : NULL, w.key_gate_b, d, &wt) ||
                     ps_gate(ctx, p->gz_v, p->ga_v, aw, learned ? w.value_gate_w : NULL, w.value_gate_b, d, &wt) ||
                     ps_payload(ctx, p->pk, aw, w.key_payload, shared, p->pscratch, d, hd, &wt) ||
                     ps_payload(ctx, p->pv, aw, w.value_payload, shared, p->pscratch, d, hd, &wt);
            free(wtab);
            if (rc || ps_pool(ctx, p->ck_pre, p->ga_k, p->pk, 1, nn, W, nkv, hd) || ps_pool(ctx, cvd, p->ga_v, p->pv, 1, nn, W, nkv, hd))
                return -1;
            if (c->qk_norm ? ps_rmsnorm(ctx, ckd, p->rstd, p->ck_pre, w.knorm, nn * nkv, hd, eps)
                           : ps_copy(ctx, ckd, p->ck_pre, nn * ks))
                return -1;
            if (c->rope && ps_rope(ctx, ckd, p->rope_cos + j0 * S * half, p->rope_sin + j0 * S * half, 1, nn, nkv, hd, S))
                return -1;
            *nw_done = nw_tot;
        }
        f.W = W, f.S = S, f.LW = c->local_window, f.nW = *nw_done;
    } else {
        f.Tk = t1, f.q_off = t0, f.pos0 = 0;
    }
    if ((c->kind == PS_ATTN_SELECT ? select_chunk(p, l, t0, t1, T, nw_done)
                                   : ps_attn_chunk(ctx, p->z, p->q, L->k, L->v, L->ck, L->cv, &f)) ||
        ps_matmul(ctx, p->attn_out, p->z, w.wo, C, nh * hd, d, 0) || ps_add(ctx, p->mid, p->x, p->attn_out, C * d) ||
        ps_rmsnorm(ctx, p->ln2, p->rstd, p->mid, w.post_norm, C, d, eps) ||
        ps_matmul(ctx, p->g, p->ln2, w.mlp_gate, C, d, dff, 0) || ps_matmul(ctx, p->u, p->ln2, w.mlp_up, C, d, dff, 0) ||
        ps_swiglu(ctx, p->h, p->g, p->u, C * dff) || ps_matmul(ctx, p->mlp_out, p->h, w.mlp_down, C, dff, d, 0) ||
        ps_add(ctx, p->x, p->mid, p->mlp_out, C * d))
        return -1;
    return 0;
}

int ps_prefill_logits(ps_prefill *p, const int32_t *tokens, int64_t T, const int64_t *pos, int64_t n, float *out,
                      ps_error *err) {
    const ps_model *m = p->m;
    const ps_config *c = &m->cfg;
    ps_ctx *ctx = p->ctx;
    int64_t d = c->d_model, V = c->vocab_size;
    if (T < 1 || T > p->T_max)
        return ps_fail(err, "prefill of %lld tokens: the state was made for 1..%lld", (long long)T, (long long)p->T_max);
    for (int64_t i = 0; i < T; i++)
        if (tokens[i] < 0 || tokens[i] >= c->vocab_size)
            return ps_fail(err, "token %d at position %lld is outside the vocabulary [0, %lld)", tokens[i], (long long)i,
                           (long long)c->vocab_size);
    for (int64_t i = 0; i < n; i++)
        if (pos[i] < 0 || pos[i] >= T)
            return ps_fail(err, "position %lld asked for is outside the %lld tokens", (long long)pos[i], (long long)T);
    int64_t *nw_done = calloc((size_t)(2 * c->n_layers), sizeof *nw_done), *rows = malloc((size_t)p->chunk * sizeof *rows),
            *which = malloc((size_t)p->chunk * sizeof *which);
    int rc = nw_done && rows && which ? 0 : ps_fail(err, "out of memory for the prefill bookkeeping");
    for (int64_t t0 = 0; t0 < T && !rc; t0 += p->chunk) {
        int64_t t1 = t0 + p->chunk < T ? t0 + p->chunk : T, C = t1 - t0;
        rc = ps_embed(ctx, p->x, tokens + t0, ps_model_embed(m, m->params), C, d);
        for (int l = 0; l < c->n_layers && !rc; l++) rc = layer_chunk(p, l, t0, t1, T, &nw_done[2 * l]);
        /* the asked-for positions in this chunk: final norm and logits for those rows only */
        int64_t k = 0;
        for (int64_t i = 0; i < n && !rc; i++)
            if (pos[i] >= t0 && pos[i] < t1) {
                rows[k] = pos[i] - t0;
                which[k++] = i;
            }
        for (int64_t j0 = 0; j0 < k && !rc; j0 += PS_PREFILL_ROWS) {
            int64_t kk = k - j0 < PS_PREFILL_ROWS ? k - j0 : PS_PREFILL_ROWS;
            rc = ps_gather_rows(ctx, p->rows_x, p->x, NULL, rows + j0, kk, d) ||
                 ps_rmsnorm(ctx, p->rows_ln, p->rows_rstd, p->rows_x, ps_model_final_norm(m, m->params), kk, d,
                            (float)c->rms_eps) ||
                 ps_matmul(ctx, p->rows_logits, p->rows_ln, ps_model_lm_head(m, m->params), kk, d, V, 0);
            for (int64_t j = 0; j < kk && !rc; j++)
                rc = ps_buf_to_host(ctx, out + which[j0 + j] * V, p->rows_logits + j * V, V * (int64_t)sizeof(float), err);
        }
        if (rc && ctx->failed) ps_ctx_check(ctx, err);
    }
    free(nw_done);
    free(rows);
    free(which);
    return rc ? -1 : 0;
}
