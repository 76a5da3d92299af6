#include "core/v4/v4_forward.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fileio.h"
#include "core/ops.h"
#include "core/v4/v4_hooks.h"
#include "core/v4/v4_pass.h"

/* ---- sizes ---- */

typedef struct {
    int64_t gate, pooled, i_gate, i_pooled, scores, topk; /* the largest over the layers */
    int csa, comp;
} layer_max;

static layer_max maxima(const ps_v4_config *c, int64_t B, int64_t T) {
    layer_max x = {0};
    for (int l = 0; l < c->n_layers; l++) {
        int64_t nW = ps_v4_n_windows(c, l, T), m = c->compress_rate[l];
        if (c->attn_type[l] == PS_V4_SLIDING) continue;
        x.comp = 1;
        int64_t S = c->attn_type[l] == PS_V4_CSA ? 2 * m : m;
        if (B * nW * S * c->head_dim > x.gate) x.gate = B * nW * S * c->head_dim;
        if (B * nW * c->head_dim > x.pooled) x.pooled = B * nW * c->head_dim;
        if (c->attn_type[l] != PS_V4_CSA) continue;
        x.csa = 1;
        int64_t K = c->index_topk < nW ? c->index_topk : nW;
        if (B * nW * 2 * m * c->index_head_dim > x.i_gate) x.i_gate = B * nW * 2 * m * c->index_head_dim;
        if (B * nW * c->index_head_dim > x.i_pooled) x.i_pooled = B * nW * c->index_head_dim;
        if (B * T * nW > x.scores) x.scores = B * T * nW;
        if (B * T * K > x.topk) x.topk = B * T * K;
    }
    return x;
}

typedef struct {
    float **ptr;
    int64_t n;
} spec;

static int build_specs(spec *s, ps_v4_acts *a, const ps_v4_config *c, int64_t B, int64_t T) {
    int64_t BT = B * T, D = c->hidden_size, N = c->hc_mult, H = c->n_heads, Dh = c->head_dim, Q = c->q_lora_rank,
            E = c->n_routed_experts, k = c->experts_per_tok, I = c->moe_inter, Is = c->n_shared_experts * c->moe_inter,
            Di = c->index_head_dim, Hi = c->index_n_heads, half = c->rope_dim / 2;
    layer_max x = maxima(c, B, T);
    int n = 0;
#define SPEC(f, cnt) s[n++] = (spec){&a->f, (cnt)}
    SPEC(h, BT * N * D);
    SPEC(h2, BT * N * D);
    SPEC(mix, BT * (2 + N) * N);
    SPEC(pre, BT * N);
    SPEC(post, BT * N);
    SPEC(comb, BT * N * N);
    SPEC(x, BT * D);
    SPEC(xin, BT * D);
    SPEC(q_lora, BT * Q);
    SPEC(q, BT * H * Dh);
    SPEC(kv, BT * Dh);
    SPEC(c_kv_raw, x.comp ? BT * 2 * Dh : 0);
    SPEC(c_z, x.comp ? BT * 2 * Dh : 0);
    SPEC(c_gate, x.gate);
    SPEC(c_alpha, x.gate);
    SPEC(c_pooled, x.pooled);
    SPEC(c_kv, x.pooled);
    SPEC(i_kv_raw, x.csa ? BT * 2 * Di : 0);
    SPEC(i_z, x.csa ? BT * 2 * Di : 0);
    SPEC(i_gate, x.i_gate);
    SPEC(i_alpha, x.i_gate);
    SPEC(i_pooled, x.i_pooled);
    SPEC(i_k, x.i_pooled);
    SPEC(i_q, x.csa ? BT * Hi * Di : 0);
    SPEC(i_w, x.csa ? BT * Hi : 0);
    SPEC(i_scores, x.scores);
    SPEC(topk, x.topk);
    SPEC(i_gap, x.csa ? BT : 0);
    SPEC(heads, BT * H * Dh);
    SPEC(sinkp, B * H * T);
    SPEC(sink_old, B * H * T);
    SPEC(oa, BT * c->o_groups * c->o_lora_rank);
    SPEC(attn_out, BT * D);
    SPEC(router_logits, BT * E);
    SPEC(router_scores, BT * E);
    SPEC(experts, BT * k);
    SPEC(weights, BT * k);
    SPEC(route_gap, BT);
    SPEC(routed, BT * D);
    SPEC(shared, BT * D);
    SPEC(ffn_out, BT * D);
    SPEC(xe, BT * D);
    SPEC(ge, BT * I);
    SPEC(ue, BT * I);
    SPEC(he, BT * I);
    SPEC(ye, BT * D);
    SPEC(sg, BT * Is);
    SPEC(su, BT * Is);
    SPEC(sh, BT * Is);
    SPEC(final_x, BT * D);
    SPEC(final_hidden, BT * D);
    SPEC(logits, BT * c->vocab_size);
    SPEC(cos_main, T * half);
    SPEC(sin_main, T * half);
    SPEC(cos_comp, T * half);
    SPEC(sin_comp, T * half);
    SPEC(ones, Dh > Di ? Dh : Di);
#undef SPEC
    return n;
}

int64_t ps_v4_acts_bytes(const ps_v4_config *c, int64_t B, int64_t T, int materialise) {
    spec s[80];
    ps_v4_acts a;
    int n = build_specs(s, &a, c, B, T);
    double tot = 0;
    for (int i = 0; i < n; i++) tot += (double)s[i].n;
    if (materialise) {
        layer_max x = maxima(c, B, T);
        int64_t nWmax = x.pooled / (B * c->head_dim > 0 ? B * c->head_dim : 1);
        tot += (double)B * c->n_heads * T * (T + nWmax) + (double)B * T * (T + nWmax);
    }
    return (int64_t)(tot * 4);
}

int ps_v4_acts_create(ps_v4_acts *a, ps_v4_model *m, int64_t B, int64_t T, ps_error *err) {
    memset(a, 0, sizeof *a);
    const ps_v4_config *c = &m->cfg;
    a->ctx = m->ctx;
    a->cfg = c;
    if (!m->ctx) return ps_fail(err, "%s: the weights are not loaded", m->dir);
    if (B < 1 || T < 1) return ps_fail(err, "batch of %lld sequences of %lld tokens: both must be >= 1", (long long)B, (long long)T);
    if (T > c->max_position_embeddings)
        return ps_fail(err, "sequence of %lld tokens exceeds max_position_embeddings %lld by %lld", (long long)T,
                       (long long)c->max_position_embeddings, (long long)(T - c->max_position_embeddings));
    /* the widest rows in double first: the int64 sizes below cannot overflow past this check */
    double per_tok = 2.0 * c->hc_mult * c->hidden_size + 4.0 * c->n_heads * c->head_dim + (double)c->vocab_size +
                     2.0 * c->n_routed_experts + (double)c->index_n_heads * c->index_head_dim + 4.0 * c->moe_inter * (c->n_shared_experts + 1) +
                     (double)T + 8.0 * c->head_dim + 16.0 * c->hidden_size;
    if ((double)B * (double)T * per_tok > 1e12)
        return ps_fail(err, "activations for B=%lld, T=%lld would need about %.3g GB; refusing", (long long)B, (long long)T,
                       (double)B * (double)T * per_tok * 4 / 1e9);
    a->B = B;
    a->T = T;
    spec s[80];
    int n = build_specs(s, a, c, B, T);
    double tot = 0;
    for (int i = 0; i < n; i++) tot += (double)s[i].n;
    uint64_t avail = ps_ctx_mem_free(a->ctx);
    if (tot * 4 > 256e9 || (avail && tot * 4 > (double)avail))
        return ps_fail(err, "activations for B=%lld, T=%lld need %.2f GiB%s", (long long)B, (long long)T, tot * 4 / 1073741824.0,
                       avail ? " (more than the memory available)" : "; refusing");
    a->n_floats = (int64_t)tot;
    char what[96];
    snprintf(what, sizeof what, "DeepSeek-V4 activations for B=%lld, T=%lld", (long long)B, (long long)T);
    a->buf = ps_buf_alloc(a->ctx, a->n_floats * (int64_t)sizeof(float), what, err);
    if (!a->buf) return -1;
    int64_t off = 0;
    for (int i = 0; i < n; i++) {
        *s[i].ptr = s[i].n ? a->buf + off : NULL;
        off += s[i].n;
    }
    int64_t BT = B * T, k = c->experts_per_tok;
    a->host_experts = malloc((size_t)(BT * k) * sizeof(float));
    a->host_weights = malloc((size_t)(BT * k) * sizeof(float));
    a->rows = malloc((size_t)(BT * k) * sizeof(int64_t));
    a->row_w = malloc((size_t)(BT * k) * sizeof(float));
    a->rows_bcast = malloc((size_t)(BT * c->hc_mult) * sizeof(int64_t));
    if (!a->host_experts || !a->host_weights || !a->rows || !a->row_w || !a->rows_bcast) {
        ps_v4_acts_free(a);
        return ps_fail(err, "out of memory for the routing tables of %lld tokens", (long long)BT);
    }
    for (int64_t i = 0; i < BT * c->hc_mult; i++) a->rows_bcast[i] = i / c->hc_mult;
    /* rotary tables: main (sliding layers) and compress (CSA/HCA layers, compressors, indexer) */
    double inv[PS_V4_MAX_HALF_ROPE];
    int64_t half = c->rope_dim / 2;
    ps_v4_rope_inv_freq(&c->rope_main, c->rope_dim, inv);
    int rc = ps_v4_rope_table(a->ctx, a->cos_main, a->sin_main, T, half, inv, (float)c->rope_main.attention_factor);
    ps_v4_rope_inv_freq(&c->rope_compress, c->rope_dim, inv);
    rc = rc || ps_v4_rope_table(a->ctx, a->cos_comp, a->sin_comp, T, half, inv, (float)c->rope_compress.attention_factor);
    rc = rc || ps_fill(a->ctx, a->ones, 1.0f, c->head_dim > c->index_head_dim ? c->head_dim : c->index_head_dim);
    if (rc) {
        ps_v4_acts_free(a);
        return ps_ctx_check(m->ctx, err);
    }
    return 0;
}

void ps_v4_acts_free(ps_v4_acts *a) {
    if (a->ctx) {
        ps_buf_free(a->ctx, a->buf, a->n_floats * (int64_t)sizeof(float));
        ps_buf_free(a->ctx, a->att, a->att_n * (int64_t)sizeof(float));
        ps_buf_free(a->ctx, a->att_bias, a->att_bias_n * (int64_t)sizeof(float));
    }
    free(a->host_experts);
    free(a->host_weights);
    free(a->rows);
    free(a->row_w);
    free(a->rows_bcast);
    free(a->logits_host);
    memset(a, 0, sizeof *a);
}

static float *grow(ps_v4_acts *a, float **buf, int64_t *have, int64_t want, const char *what, ps_error *err) {
    if (want <= *have) return *buf;
    ps_buf_free(a->ctx, *buf, *have * (int64_t)sizeof(float));
    *have = 0;
    *buf = ps_buf_alloc(a->ctx, (want ? want : 1) * (int64_t)sizeof(float), what, err);
    if (*buf) *have = want;
    return *buf;
}

const float *ps_v4_logits_host(ps_v4_acts *a, ps_error *err) {
    if (ps_ctx_host_visible(a->ctx)) return a->logits;
    int64_t n = a->B * a->T * a->cfg->vocab_size;
    if (!a->logits_host && !(a->logits_host = malloc((size_t)n * sizeof(float)))) {
        ps_fail(err, "out of memory for a host copy of %lld logits", (long long)n);
        return NULL;
    }
    return ps_buf_to_host(a->ctx, a->logits_host, a->logits, n * (int64_t)sizeof(float), err) ? NULL : a->logits_host;
}

/* ---- the pass ---- */

/* HOOKED, FIRE, OPS: core/v4/v4_pass.h (shared with the KV cache) */

/* Host copy of selected indices [n] (floats) checked to be integers in [lo, hi) (or -1 when allow_empty),
 * each row of k without repeats when no_repeat. */
static int check_indices(ps_v4_acts *a, float *host, const float *buf, int64_t n, int64_t k, int64_t hi, int allow_empty,
                         int no_repeat, const char *hook, ps_error *err) {
    if (ps_buf_to_host(a->ctx, host, buf, n * (int64_t)sizeof(float), err)) return -1;
    for (int64_t i = 0; i < n; i++) {
        float v = host[i];
        if (v != floorf(v) || !(v >= (allow_empty ? -1.0f : 0.0f)) || !(v < (float)hi))
            return ps_fail(err, "hook \"%s\": entry %lld of row %lld is %g, not an index in [%s, %lld)", hook,
                           (long long)(i % k), (long long)(i / k), (double)v, allow_empty ? "-1" : "0", (long long)hi);
        if (no_repeat && v >= 0)
            for (int64_t j = i - i % k; j < i; j++)
                if (host[j] == v)
                    return ps_fail(err, "hook \"%s\": row %lld lists entry %g twice", hook, (long long)(i / k), (double)v);
    }
    return 0;
}

/* mHC weights (hooks pre / post / comb) and the collapsed, normed block input (hook `in`) of the streams
 * h for one site. */
int ps_v4_hc_site(ps_v4_acts *a, int l, const float *fn, const float *base, const float *scale, const float *norm_w,
                   int pt_pre, int pt_in, const ps_hooks *hooks, ps_error *err) {
    ps_ctx *ctx = a->ctx;
    const ps_v4_config *c = a->cfg;
    int64_t B = a->B, T = a->T, BT = B * T, N = c->hc_mult, D = c->hidden_size;
    OPS(ps_matmul(ctx, a->mix, a->h, fn, BT, N * D, (2 + N) * N, 0) ||
        ps_v4_hc_weights(ctx, a->pre, a->post, a->comb, a->mix, a->h, scale, base, BT, N, D, c->hc_sinkhorn_iters,
                         (float)c->hc_eps, (float)c->rms_eps));
    FIRE(l, pt_pre, a->pre, 3, B, T, N);
    FIRE(l, pt_pre + 1, a->post, 3, B, T, N);
    FIRE(l, pt_pre + 2, a->comb, 4, B, T, N, N);
    OPS(ps_v4_hc_collapse(ctx, a->x, a->pre, a->h, BT, N, D) ||
        ps_rmsnorm(ctx, a->xin, NULL, a->x, norm_w, BT, D, (float)c->rms_eps));
    FIRE(l, pt_in, a->xin, 3, B, T, D);
    return 0;
}

/* One compressor (the attention's or the indexer's) of layer l: gate, alpha, pooled, entries (hooks
 * pt_gate..pt_gate+3). Input a->xin; output ent [B, nW, d]. */
static int compressor(ps_v4_acts *a, int l, int64_t d, int overlap, const float *wkv, const float *wgate, const float *ape,
                      const float *norm_w, float *kv_raw, float *z, float *gate, float *alpha, float *pooled, float *ent,
                      int pt_gate, const ps_hooks *hooks, ps_error *err) {
    ps_ctx *ctx = a->ctx;
    const ps_v4_config *c = a->cfg;
    int64_t B = a->B, T = a->T, BT = B * T, D = c->hidden_size, m = c->compress_rate[l], nW = ps_v4_n_windows(c, l, T);
    int64_t cc = overlap ? 2 : 1, S = overlap ? 2 * m : m;
    OPS(ps_matmul(ctx, kv_raw, a->xin, wkv, BT, D, cc * d, 0) || ps_matmul(ctx, z, a->xin, wgate, BT, D, cc * d, 0) ||
        ps_v4_comp_slots(ctx, gate, z, ape, B, T, nW, m, d, overlap));
    FIRE(l, pt_gate, gate, 4, B, nW, S, d);
    OPS(ps_v4_slot_softmax(ctx, alpha, gate, B * nW, S, d));
    FIRE(l, pt_gate + 1, alpha, 4, B, nW, S, d);
    OPS(ps_v4_comp_pool(ctx, pooled, alpha, kv_raw, B, T, nW, m, d, overlap));
    FIRE(l, pt_gate + 2, pooled, 3, B, nW, d);
    OPS(ps_rmsnorm(ctx, ent, NULL, pooled, norm_w, B * nW, d, (float)c->rms_eps) ||
        (nW > 0 && ps_v4_rope(ctx, ent, a->cos_comp, a->sin_comp, B, nW, 1, d, c->rope_dim, m, 0)));
    FIRE(l, pt_gate + 3, ent, 3, B, nW, d);
    return 0;
}

static int attention(ps_v4_acts *a, int l, const ps_v4_layer *w, const ps_hooks *hooks, ps_error *err) {
    ps_ctx *ctx = a->ctx;
    const ps_v4_config *c = a->cfg;
    int64_t B = a->B, T = a->T, BT = B * T, D = c->hidden_size, H = c->n_heads, Dh = c->head_dim, Q = c->q_lora_rank,
            R = c->rope_dim, m = c->compress_rate[l], nW = ps_v4_n_windows(c, l, T);
    ps_v4_attn_type at = c->attn_type[l];
    float eps = (float)c->rms_eps;
    const float *cs = at == PS_V4_SLIDING ? a->cos_main : a->cos_comp, *sn = at == PS_V4_SLIDING ? a->sin_main : a->sin_comp;
    /* queries and the raw K=V entries */
    OPS(ps_matmul(ctx, a->q_lora, a->xin, w->wq_a, BT, D, Q, 0) || ps_rmsnorm(ctx, a->q_lora, NULL, a->q_lora, w->q_norm, BT, Q, eps));
    FIRE(l, PS_V4H_Q_LORA, a->q_lora, 3, B, T, Q);
    OPS(ps_matmul(ctx, a->q, a->q_lora, w->wq_b, BT, Q, H * Dh, 0) || ps_rmsnorm(ctx, a->q, NULL, a->q, a->ones, BT * H, Dh, eps) ||
        ps_v4_rope(ctx, a->q, cs, sn, B, T, H, Dh, R, 1, 0));
    FIRE(l, PS_V4H_Q, a->q, 4, B, T, H, Dh);
    OPS(ps_matmul(ctx, a->kv, a->xin, w->wkv, BT, D, Dh, 0) || ps_rmsnorm(ctx, a->kv, NULL, a->kv, w->kv_norm, BT, Dh, eps) ||
        ps_v4_rope(ctx, a->kv, cs, sn, B, T, 1, Dh, R, 1, 0));
    FIRE(l, PS_V4H_KV, a->kv, 3, B, T, Dh);
    /* compressed entries, and for CSA the indexer's selection */
    int64_t K = 0;
    if (at != PS_V4_SLIDING &&
        compressor(a, l, Dh, at == PS_V4_CSA, w->c_wkv, w->c_wgate, w->c_ape, w->c_norm, a->c_kv_raw, a->c_z, a->c_gate,
                   a->c_alpha, a->c_pooled, a->c_kv, PS_V4H_C_GATE, hooks, err))
        return -1;
    if (at == PS_V4_CSA) {
        int64_t Hi = c->index_n_heads, Di = c->index_head_dim;
        K = c->index_topk < nW ? c->index_topk : nW;
        if (compressor(a, l, Di, 1, w->i_wkv, w->i_wgate, w->i_ape, w->i_norm, a->i_kv_raw, a->i_z, a->i_gate, a->i_alpha,
                       a->i_pooled, a->i_k, PS_V4H_I_C_GATE, hooks, err))
            return -1;
        OPS(ps_matmul(ctx, a->i_q, a->q_lora, w->i_wq_b, BT, Q, Hi * Di, 0) ||
            ps_v4_rope(ctx, a->i_q, a->cos_comp, a->sin_comp, B, T, Hi, Di, R, 1, 0));
        FIRE(l, PS_V4H_I_Q, a->i_q, 4, B, T, Hi, Di);
        OPS(ps_matmul(ctx, a->i_w, a->xin, w->i_wp, BT, D, Hi, 0) || ps_v4_scale(ctx, a->i_w, (float)(1.0 / sqrt((double)Hi)), BT * Hi));
        FIRE(l, PS_V4H_I_WEIGHTS, a->i_w, 3, B, T, Hi);
        OPS(ps_v4_indexer_scores(ctx, a->i_scores, a->i_q, a->i_k, a->i_w, B, T, nW, Hi, Di, (float)(1.0 / sqrt((double)Di))));
        FIRE(l, PS_V4H_I_SCORES, a->i_scores, 3, B, T, nW);
        OPS(ps_v4_topk(ctx, a->topk, a->i_gap, a->i_scores, NULL, BT, nW, K, T, m));
        if (HOOKED(l, PS_V4H_I_TOPK)) {
            int64_t shp[3] = {B, T, K};
            char nm[96];
            ps_v4_hook_name(nm, sizeof nm, l, PS_V4H_I_TOPK);
            float *host = malloc((size_t)(BT * K > 0 ? BT * K : 1) * sizeof(float));
            if (!host) return ps_fail(err, "hook \"%s\": out of memory", nm);
            int rc = ps_hooks_fire_point(ctx, hooks, l, PS_V4H_I_TOPK, a->topk, 3, shp, err) ||
                     check_indices(a, host, a->topk, BT * K, K > 0 ? K : 1, nW, 1, 1, nm, err);
            free(host);
            if (rc) return -1;
        }
        FIRE(l, PS_V4H_I_GAP, a->i_gap, 2, B, T);
    }
    /* attention */
    ps_v4_attn_geom g = {.B = B, .T = T, .H = H, .Dh = Dh, .nW = nW, .K = K, .W = c->sliding_window,
                         .m = at == PS_V4_SLIDING ? 0 : m, .scale = (float)(1.0 / sqrt((double)Dh))};
    const float *ckv = at == PS_V4_SLIDING ? NULL : a->c_kv, *topk = K > 0 ? a->topk : NULL;
    if (HOOKED(l, PS_V4H_BIAS) || HOOKED(l, PS_V4H_LOGITS) || HOOKED(l, PS_V4H_PATTERN)) {
        int64_t C = T + nW;
        float *bias = grow(a, &a->att_bias, &a->att_bias_n, BT * C, "attention bias", err),
              *lg = bias ? grow(a, &a->att, &a->att_n, B * H * T * C, "attention logits", err) : NULL;
        if (!lg) return -1;
        OPS(ps_v4_attn_bias(ctx, bias, topk, &g));
        FIRE(l, PS_V4H_BIAS, bias, 3, B, T, C);
        OPS(ps_v4_attn_logits(ctx, lg, a->q, a->kv, ckv, bias, &g));
        FIRE(l, PS_V4H_LOGITS, lg, 4, B, H, T, C);
        OPS(ps_v4_attn_softmax(ctx, lg, a->sinkp, lg, w->sink, &g));
        FIRE(l, PS_V4H_PATTERN, lg, 4, B, H, T, C);
        OPS(ps_v4_attn_apply(ctx, a->heads, lg, a->kv, ckv, &g));
    } else
        OPS(ps_v4_attn(ctx, a->heads, a->sinkp, a->q, a->kv, ckv, topk, w->sink, &g));
    if (HOOKED(l, PS_V4H_SINK)) {
        OPS(ps_copy(ctx, a->sink_old, a->sinkp, B * H * T));
        FIRE(l, PS_V4H_SINK, a->sinkp, 3, B, H, T);
        OPS(ps_v4_sink_rescale(ctx, a->heads, a->sink_old, a->sinkp, &g));
    }
    OPS(ps_v4_rope(ctx, a->heads, cs, sn, B, T, H, Dh, R, 1, 1));
    FIRE(l, PS_V4H_OUT_HEADS, a->heads, 4, B, T, H, Dh);
    int64_t G = c->o_groups, OR = c->o_lora_rank;
    OPS(ps_v4_grouped_linear(ctx, a->oa, a->heads, w->wo_a, BT, G, H * Dh / G, OR) ||
        ps_matmul(ctx, a->attn_out, a->oa, w->wo_b, BT, G * OR, D, 0));
    FIRE(l, PS_V4H_ATTN_OUT, a->attn_out, 3, B, T, D);
    return 0;
}

int ps_v4_moe(ps_v4_acts *a, int l, const ps_v4_layer *w, const int32_t *tokens, const ps_hooks *hooks, ps_error *err) {
    ps_ctx *ctx = a->ctx;
    const ps_v4_config *c = a->cfg;
    int64_t B = a->B, T = a->T, BT = B * T, D = c->hidden_size, E = c->n_routed_experts, k = c->experts_per_tok,
            I = c->moe_inter, Is = c->n_shared_experts * c->moe_inter;
    OPS(ps_matmul(ctx, a->router_logits, a->xin, w->gate_w, BT, D, E, 0));
    FIRE(l, PS_V4H_ROUTER_LOGITS, a->router_logits, 3, B, T, E);
    OPS(ps_v4_router_scores(ctx, a->router_scores, a->router_logits, BT * E, (int)c->scoring));
    if (c->mlp_type[l] == PS_V4_HASH_MOE) {
        for (int64_t r = 0; r < BT; r++)
            for (int64_t j = 0; j < k; j++) a->host_experts[r * k + j] = (float)w->tid2eid[(int64_t)tokens[r] * k + j];
        if (ps_buf_from_host(ctx, a->experts, a->host_experts, BT * k * (int64_t)sizeof(float), err)) return -1;
        OPS(ps_fill(ctx, a->route_gap, INFINITY, BT));
    } else
        OPS(ps_v4_topk(ctx, a->experts, a->route_gap, a->router_scores, w->gate_bias, BT, E, k, T, 0));
    FIRE(l, PS_V4H_EXPERTS, a->experts, 3, B, T, k);
    char nm[96];
    ps_v4_hook_name(nm, sizeof nm, l, PS_V4H_EXPERTS);
    if (check_indices(a, a->host_experts, a->experts, BT * k, k, E, 0, 0, nm, err)) return -1;
    OPS(ps_v4_route_weights(ctx, a->weights, a->router_scores, a->experts, BT, E, k, (float)c->routed_scaling_factor));
    FIRE(l, PS_V4H_WEIGHTS, a->weights, 3, B, T, k);
    FIRE(l, PS_V4H_ROUTE_GAP, a->route_gap, 2, B, T);
    if (ps_buf_to_host(ctx, a->host_weights, a->weights, BT * k * (int64_t)sizeof(float), err)) return -1;
    /* routed experts, one at a time over the rows routed to it (a repeated expert counts once) */
    OPS(ps_fill(ctx, a->routed, 0.0f, BT * D));
    for (int64_t e = 0; e < E; e++) {
        int64_t n = 0;
        for (int64_t r = 0; r < BT; r++)
            for (int64_t j = 0; j < k; j++) {
                const float *ex = a->host_experts + r * k;
                if ((int64_t)ex[j] != e) continue;
                int dup = 0;
                for (int64_t i = 0; i < j; i++) dup |= ex[i] == ex[j];
                if (dup) continue;
                a->rows[n] = r;
                a->row_w[n++] = a->host_weights[r * k + j];
            }
        if (!n) continue;
        OPS(ps_gather_rows(ctx, a->xe, a->xin, NULL, a->rows, n, D) ||
            ps_matmul(ctx, a->ge, a->xe, w->w1 + e * I * D, n, D, I, 0) ||
            ps_matmul(ctx, a->ue, a->xe, w->w3 + e * I * D, n, D, I, 0) ||
            ps_v4_swiglu_clamp(ctx, a->he, a->ge, a->ue, n * I, (float)c->swiglu_limit) ||
            ps_matmul(ctx, a->ye, a->he, w->w2 + e * D * I, n, I, D, 0) ||
            ps_v4_scatter_add_rows(ctx, a->routed, a->ye, a->rows, a->row_w, n, D));
    }
    FIRE(l, PS_V4H_ROUTED, a->routed, 3, B, T, D);
    if (Is > 0)
        OPS(ps_matmul(ctx, a->sg, a->xin, w->sw1, BT, D, Is, 0) || ps_matmul(ctx, a->su, a->xin, w->sw3, BT, D, Is, 0) ||
            ps_v4_swiglu_clamp(ctx, a->sh, a->sg, a->su, BT * Is, (float)c->swiglu_limit) ||
            ps_matmul(ctx, a->shared, a->sh, w->sw2, BT, Is, D, 0));
    else
        OPS(ps_fill(ctx, a->shared, 0.0f, BT * D));
    FIRE(l, PS_V4H_SHARED, a->shared, 3, B, T, D);
    OPS(ps_add(ctx, a->ffn_out, a->routed, a->shared, BT * D));
    FIRE(l, PS_V4H_FFN_OUT, a->ffn_out, 3, B, T, D);
    return 0;
}

static int layer(ps_v4_acts *a, int l, const ps_v4_layer *w, const int32_t *tokens, const ps_hooks *hooks, ps_error *err) {
    ps_ctx *ctx = a->ctx;
    const ps_v4_config *c = a->cfg;
    int64_t B = a->B, T = a->T, BT = B * T, N = c->hc_mult, D = c->hidden_size;
    float *t;
    if (ps_v4_hc_site(a, l, w->hc_attn_fn, w->hc_attn_base, w->hc_attn_scale, w->attn_norm, PS_V4H_ATTN_HC_PRE, PS_V4H_ATTN_IN,
                hooks, err) ||
        attention(a, l, w, hooks, err))
        return -1;
    OPS(ps_v4_hc_expand(ctx, a->h2, a->post, a->comb, a->attn_out, a->h, BT, N, D));
    t = a->h, a->h = a->h2, a->h2 = t;
    FIRE(l, PS_V4H_MID, a->h, 4, B, T, N, D);
    if (ps_v4_hc_site(a, l, w->hc_ffn_fn, w->hc_ffn_base, w->hc_ffn_scale, w->ffn_norm, PS_V4H_FFN_HC_PRE, PS_V4H_FFN_IN, hooks,
                err) ||
        ps_v4_moe(a, l, w, tokens, hooks, err))
        return -1;
    OPS(ps_v4_hc_expand(ctx, a->h2, a->post, a->comb, a->ffn_out, a->h, BT, N, D));
    t = a->h, a->h = a->h2, a->h2 = t;
    FIRE(l, PS_V4H_OUT, a->h, 4, B, T, N, D);
    return 0;
}

int ps_v4_forward(ps_v4_model *m, ps_v4_acts *a, const int32_t *tokens, const ps_hooks *hooks, int n_run, ps_error *err) {
    const ps_v4_config *c = &m->cfg;
    ps_ctx *ctx = a->ctx;
    if (ctx != m->ctx) return ps_fail(err, "the activations were made on another context than the model's");
    if (a->cfg != c) return ps_fail(err, "the activations were made for another model");
    int L = (int)c->n_layers, gslot = L;
    if (n_run < 0) n_run = L;
    if (n_run > L) return ps_fail(err, "run %d layers: the model has %d", n_run, L);
    if (hooks && hooks->mask && (hooks->family != &ps_v4_hook_family || hooks->n_layers != L + 1))
        return ps_fail(err, "the hooks were registered for another model (use ps_v4_hooks_add with this model's config)");
    int64_t B = a->B, T = a->T, BT = B * T, N = c->hc_mult, D = c->hidden_size, V = c->vocab_size;
    for (int64_t i = 0; i < BT; i++)
        if (tokens[i] < 0 || tokens[i] >= V)
            return ps_fail(err, "token %d at sequence %lld, position %lld is outside the vocabulary [0, %lld)", tokens[i],
                           (long long)(i / T), (long long)(i % T), (long long)V);
    OPS(ps_embed(ctx, a->x, tokens, ps_v4_global(m, PS_V4_T_EMBED), BT, D));
    FIRE(gslot, PS_V4H_EMBED, a->x, 3, B, T, D);
    OPS(ps_gather_rows(ctx, a->h, a->x, NULL, a->rows_bcast, BT * N, D));
    for (int l = 0; l < n_run; l++) {
        ps_v4_layer w;
        if (ps_v4_layer_acquire(m, l, &w, err)) return -1;
        int rc = layer(a, l, &w, tokens, hooks, err);
        ps_v4_layer_release(m, l);
        if (rc) return ps_fail_prefix(err, "layer %d: ", l);
    }
    if (n_run < L) return 0;
    OPS(ps_matmul(ctx, a->mix, a->h, ps_v4_global(m, PS_V4_T_HC_HEAD_FN), BT, N * D, N, 0) ||
        ps_v4_hc_weights(ctx, a->pre, NULL, NULL, a->mix, a->h, ps_v4_global(m, PS_V4_T_HC_HEAD_SCALE),
                         ps_v4_global(m, PS_V4_T_HC_HEAD_BASE), BT, N, D, 0, (float)c->hc_eps, (float)c->rms_eps));
    FIRE(gslot, PS_V4H_HC_HEAD_PRE, a->pre, 3, B, T, N);
    OPS(ps_v4_hc_collapse(ctx, a->final_x, a->pre, a->h, BT, N, D) ||
        ps_rmsnorm(ctx, a->final_hidden, NULL, a->final_x, ps_v4_global(m, PS_V4_T_NORM), BT, D, (float)c->rms_eps));
    FIRE(gslot, PS_V4H_FINAL_HIDDEN, a->final_hidden, 3, B, T, D);
    OPS(ps_matmul(ctx, a->logits, a->final_hidden, ps_v4_global(m, PS_V4_T_HEAD), BT, D, V, 0));
    FIRE(gslot, PS_V4H_LOGITS_OUT, a->logits, 3, B, T, V);
    return 0;
}
