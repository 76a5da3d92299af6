#include "core/backward.h"

#include <stdlib.h>


#include "core/ops.h"

/* The options of this backward (ps_backward_opts; all zero for a training step). */
typedef struct {
    const ps_backward_opts *o;
    ps_error *err;
} bw_opts;

/* A linear layer's weight gradient, or NULL when the backward skips them (attribution). */
#define DW(x) (bo->o->no_weight_grads ? NULL : (x))

/* Fire the gradient hooks on (layer l, point pt) with the gradient `data` of the given shape. */
#define GRAD_FIRE(pt, data, nd, ...)                                                                          \
    do {                                                                                                      \
        if (ps_hooks_on(bo->o->grad_hooks, l, pt)) {                                                           \
            int64_t shp_[4] = {__VA_ARGS__};                                                                  \
            if (ps_hooks_fire(ctx, bo->o->grad_hooks, l, pt, (data), (nd), shp_, bo->err)) return -2;          \
        }                                                                                                     \
    } while (0)

/* Run ops (chained with ||); a failure returns -1 with the context failed. */
#define OPB(cat, expr)                                                                       \
    do {                                                                                     \
        int rc_;                                                                             \
        PROF(1, cat, rc_ = (expr));                                                          \
        if (rc_) return -1;                                                                  \
    } while (0)

/* The attention part of a channel-attention layer (attention.kind "channel", docs/training.md), from
 * dh = d resid_mid: o_proj, the inverse rope of the output, the attention with sinks, q / K=V entries
 * (norms, rope, projections), the compressor (rope at w·m, norm, pooling, per-channel softmax, slot
 * layout with the position bias, its projections). Accumulates d ln1 into G.ln1 (zeroed here). */
static int channel_attention_backward(const ps_model *m, const ps_acts *a, ps_acts *g, int l, float *grads, const float *dh,
                                 const bw_opts *bo) {
    ps_ctx *ctx = a->ctx;
    ps_profile *prof = a->prof;
    const ps_config *c = &m->cfg;
    ps_layer_params w = ps_model_layer(m, m->params, l), dw = ps_model_layer(m, grads, l);
    ps_act_ptrs p = ps_acts_layer(a, l), G = g->p;
    int64_t B = a->B, T = a->T, BT = B * T, d = c->d_model, hd = c->head_dim, nh = c->n_heads, nW = a->nW, mr = c->rate;
    int64_t cs = ps_config_v4_series(c), S = ps_config_v4_slots(c);
    int csa = c->v4_mode == PS_V4_MODE_CSA;
    OPB(PS_PROF_OTHER, ps_fill(ctx, G.z, 0.0f, BT * nh * hd) || ps_fill(ctx, G.k, 0.0f, BT * hd));
    OPB(PS_PROF_MATMUL, ps_matmul_backward(ctx, G.z, DW(dw.wo), dh, p.z, w.wo, BT, nh * hd, d));
    GRAD_FIRE(PS_HOOK_Z, G.z, 4, B, T, nh, hd);
    /* z = R(-t) z_pre: d z_pre = R(t) dz */
    if (c->rope) OPB(PS_PROF_NORM_ROPE, ps_rope(ctx, G.z, a->p.rope_cos, a->p.rope_sin, B, T, nh, hd, 1));
    if (nW > 0) OPB(PS_PROF_OTHER, ps_fill(ctx, G.ck, 0.0f, B * nW * hd));
    OPB(PS_PROF_ATTENTION, ps_v4_attn_backward(ctx, G.q, G.k, nW > 0 ? G.ck : NULL, dw.sinks, G.z, p.z_pre, p.q, p.k,
                                               nW > 0 ? p.ck : NULL, w.sinks, &a->geom4));
    GRAD_FIRE(PS_HOOK_K, G.k, 4, B, T, 1, hd);
    if (nW > 0) GRAD_FIRE(PS_HOOK_CK, G.ck, 4, B, nW, 1, hd);
    if (c->rope)
        OPB(PS_PROF_NORM_ROPE, ps_rope_backward(ctx, G.q, a->p.rope_cos, a->p.rope_sin, B, T, nh, hd, 1) ||
                                   ps_rope_backward(ctx, G.k, a->p.rope_cos, a->p.rope_sin, B, T, 1, hd, 1));
    if (c->qk_norm) {
        OPB(PS_PROF_OTHER, ps_fill(ctx, G.q_pre, 0.0f, BT * nh * hd) || ps_fill(ctx, G.k_pre, 0.0f, BT * hd));
        OPB(PS_PROF_NORM_ROPE, ps_rmsnorm_backward(ctx, G.q_pre, dw.qnorm, G.q, p.q_pre, w.qnorm, p.q_rstd, BT * nh, hd) ||
                                   ps_rmsnorm_backward(ctx, G.k_pre, dw.knorm, G.k, p.k_pre, w.knorm, p.k_rstd, BT, hd));
    } else
        OPB(PS_PROF_OTHER, ps_copy(ctx, G.q_pre, G.q, BT * nh * hd) || ps_copy(ctx, G.k_pre, G.k, BT * hd));
    OPB(PS_PROF_OTHER, ps_fill(ctx, G.ln1, 0.0f, BT * d));
    OPB(PS_PROF_MATMUL, ps_matmul_backward(ctx, G.ln1, DW(dw.wq), G.q_pre, p.ln1, w.wq, BT, d, nh * hd) ||
                            ps_matmul_backward(ctx, G.ln1, DW(dw.wk), G.k_pre, p.ln1, w.wk, BT, d, hd));
    if (nW > 0) {
        if (c->rope) OPB(PS_PROF_NORM_ROPE, ps_rope_backward(ctx, G.ck, a->p.rope_cos, a->p.rope_sin, B, nW, 1, hd, mr));
        OPB(PS_PROF_OTHER, ps_fill(ctx, G.ck_pre, 0.0f, B * nW * hd));
        OPB(PS_PROF_NORM_ROPE, ps_rmsnorm_backward(ctx, G.ck_pre, dw.c_norm, G.ck, p.ck_pre, w.c_norm, p.ck_rstd, B * nW, hd));
        OPB(PS_PROF_COMPRESSOR,
            ps_v4_comp_pool_backward(ctx, G.c_alpha, G.c_kv_raw, G.ck_pre, p.c_alpha, p.c_kv_raw, B, T, nW, mr, hd, csa) ||
                ps_v4_slot_softmax_backward(ctx, G.c_gate, G.c_alpha, p.c_alpha, B * nW, S, hd) ||
                ps_v4_comp_slots_backward(ctx, G.c_z, dw.c_ape, G.c_gate, B, T, nW, mr, hd, csa));
        OPB(PS_PROF_MATMUL, ps_matmul_backward(ctx, G.ln1, DW(dw.c_wkv), G.c_kv_raw, p.ln1, w.c_wkv, BT, d, cs * hd) ||
                                ps_matmul_backward(ctx, G.ln1, DW(dw.c_wgate), G.c_z, p.ln1, w.c_wgate, BT, d, cs * hd));
    }
    return 0;
}

static int layer_backward(const ps_model *m, const ps_acts *a, ps_acts *g, int l, float *grads, float *dh, const bw_opts *bo) {
    ps_ctx *ctx = a->ctx;
    ps_profile *prof = a->prof;
    const ps_config *c = &m->cfg;
    ps_layer_params w = ps_model_layer(m, m->params, l), dw = ps_model_layer(m, grads, l);
    ps_act_ptrs p = ps_acts_layer(a, l), G = g->p;
    int64_t B = a->B, T = a->T, BT = B * T, d = c->d_model, hd = c->head_dim, nh = c->n_heads, nkv = c->n_kv_heads;
    int64_t nW = a->nW, W = c->window, dff = c->d_ff;
    const float *h_in = a->p.resid + (int64_t)l * BT * d;

    /* MLP: resid_post = resid_mid + down(silu(gate m) ⊙ up m), m = rmsnorm(resid_mid) */
    OPB(PS_PROF_OTHER, ps_fill(ctx, G.mlp_h, 0.0f, BT * dff));
    OPB(PS_PROF_MATMUL, ps_matmul_backward(ctx, G.mlp_h, DW(dw.mlp_down), dh, p.mlp_h, w.mlp_down, BT, dff, d));
    OPB(PS_PROF_OTHER, ps_swiglu_backward(ctx, G.mlp_g, G.mlp_u, G.mlp_h, p.mlp_g, p.mlp_u, BT * dff));
    OPB(PS_PROF_OTHER, ps_fill(ctx, G.ln2, 0.0f, BT * d));
    OPB(PS_PROF_MATMUL, ps_matmul_backward(ctx, G.ln2, DW(dw.mlp_gate), G.mlp_g, p.ln2, w.mlp_gate, BT, d, dff) ||
                            ps_matmul_backward(ctx, G.ln2, DW(dw.mlp_up), G.mlp_u, p.ln2, w.mlp_up, BT, d, dff));
    /* dh = d resid_mid */
    OPB(PS_PROF_NORM_ROPE, ps_rmsnorm_backward(ctx, dh, dw.post_norm, G.ln2, p.resid_mid, w.post_norm, p.ln2_rstd, BT, d));

    if (c->kind == PS_ATTN_CHANNEL) {
        int r4 = channel_attention_backward(m, a, g, l, grads, dh, bo);
        if (r4) return r4;
        if (l == bo->o->stop_layer && l > 0) return 0;
        OPB(PS_PROF_NORM_ROPE, ps_rmsnorm_backward(ctx, dh, dw.in_norm, G.ln1, h_in, w.in_norm, p.ln1_rstd, BT, d));
        return 0;
    }
    /* attention: resid_mid = h + W_o z */
    OPB(PS_PROF_OTHER, ps_fill(ctx, G.z, 0.0f, BT * nh * hd) || ps_fill(ctx, G.k, 0.0f, BT * nkv * hd) ||
                           ps_fill(ctx, G.v, 0.0f, BT * nkv * hd));
    OPB(PS_PROF_MATMUL, ps_matmul_backward(ctx, G.z, DW(dw.wo), dh, p.z, w.wo, BT, nh * hd, d));
    GRAD_FIRE(PS_HOOK_Z, G.z, 4, B, T, nh, hd);
    if (nW > 0) OPB(PS_PROF_OTHER, ps_fill(ctx, G.ck, 0.0f, B * nW * nkv * hd) || ps_fill(ctx, G.cv, 0.0f, B * nW * nkv * hd));
    if (c->kind == PS_ATTN_SELECT) { /* over the forward's blocks (kept per layer): no gradient through the choice */
        ps_select_cfg sc = ps_config_select(c);
        ps_sel_geom sg = {.B = B, .n = T, .pos0 = 0, .L = T, .H = nh, .Hkv = nkv, .D = hd, .sel = sc,
                          .N1 = ps_select_n_windows(T, c->window, c->stride),
                          .N2 = ps_select_n_windows(T, 4 * c->window, 4 * c->stride), .nb = ps_select_n_blocks(&sc, T)};
        OPB(PS_PROF_OTHER, ps_fill(ctx, G.q, 0.0f, BT * nh * hd));
        OPB(PS_PROF_ATTENTION, ps_select_backward(ctx, G.q, G.k, G.v, G.z, p.z, p.lse, p.q, p.k, p.v,
                                                  ps_select_sparse(c, T) ? p.sel_blocks : NULL, &sg));
    } else {
        const ps_attn_geom gl = ps_acts_geom(a, l); /* layer l's window grid */
        OPB(PS_PROF_ATTENTION,
            ps_attn_backward(ctx, G.q, G.k, G.v, G.ck, G.cv, G.z, p.z, p.lse, p.q, p.k, p.v, p.ck, p.cv, &gl));
    }
    /* the gradients at the hook points k, v, ck, cv (before the rope backward rotates k and ck in place) */
    GRAD_FIRE(PS_HOOK_K, G.k, 4, B, T, nkv, hd);
    GRAD_FIRE(PS_HOOK_V, G.v, 4, B, T, nkv, hd);
    if (nW > 0) {
        GRAD_FIRE(PS_HOOK_CK, G.ck, 4, B, nW, nkv, hd);
        GRAD_FIRE(PS_HOOK_CV, G.cv, 4, B, nW, nkv, hd);
    }
    /* below the stop layer nothing is wanted: its input gradient is not computed */
    if (l == bo->o->stop_layer && l > 0) return 0;
    if (c->rope)
        OPB(PS_PROF_NORM_ROPE, ps_rope_backward(ctx, G.q, a->p.rope_cos, a->p.rope_sin, B, T, nh, hd, 1) ||
                                   ps_rope_backward(ctx, G.k, a->p.rope_cos, a->p.rope_sin, B, T, nkv, hd, 1));
    if (c->qk_norm) {
        OPB(PS_PROF_OTHER, ps_fill(ctx, G.q_pre, 0.0f, BT * nh * hd) || ps_fill(ctx, G.k_pre, 0.0f, BT * nkv * hd));
        OPB(PS_PROF_NORM_ROPE,
            ps_rmsnorm_backward(ctx, G.q_pre, dw.qnorm, G.q, p.q_pre, w.qnorm, p.q_rstd, BT * nh, hd) ||
                ps_rmsnorm_backward(ctx, G.k_pre, dw.knorm, G.k, p.k_pre, w.knorm, p.k_rstd, BT * nkv, hd));
    } else
        OPB(PS_PROF_OTHER, ps_copy(ctx, G.q_pre, G.q, BT * nh * hd) || ps_copy(ctx, G.k_pre, G.k, BT * nkv * hd));
    OPB(PS_PROF_OTHER, ps_fill(ctx, G.ln1, 0.0f, BT * d));
    OPB(PS_PROF_MATMUL, ps_matmul_backward(ctx, G.ln1, DW(dw.wq), G.q_pre, p.ln1, w.wq, BT, d, nh * hd) ||
                            ps_matmul_backward(ctx, G.ln1, DW(dw.wk), G.k_pre, p.ln1, w.wk, BT, d, nkv * hd) ||
                            ps_matmul_backward(ctx, G.ln1, DW(dw.wv), G.v, p.ln1, w.wv, BT, d, nkv * hd));

    if (c->kind == PS_ATTN_COMPRESSED && nW > 0) {
        int shared = c->payload == PS_PAYLOAD_SHARED;
        const ps_windows wt = ps_acts_windows(a, l), *win = &wt; /* the forward's windows of layer l */
        if (c->rope) OPB(PS_PROF_NORM_ROPE, ps_rope_windows(ctx, G.ck, a->p.rope_cos, a->p.rope_sin, hd, win, 1));
        if (c->qk_norm) {
            OPB(PS_PROF_OTHER, ps_fill(ctx, G.ck_pre, 0.0f, B * nW * nkv * hd));
            OPB(PS_PROF_NORM_ROPE,
                ps_rmsnorm_backward(ctx, G.ck_pre, dw.knorm, G.ck, p.ck_pre, w.knorm, p.ck_rstd, B * nW * nkv, hd));
        } else
            OPB(PS_PROF_OTHER, ps_copy(ctx, G.ck_pre, G.ck, B * nW * nkv * hd));
        OPB(PS_PROF_COMPRESSOR,
            ps_pool_backward(ctx, G.ga_k, G.pk, G.ck_pre, p.ga_k, p.pk, B, nW, W, nkv, hd) ||
                ps_pool_backward(ctx, G.ga_v, G.pv, G.cv, p.ga_v, p.pv, B, nW, W, nkv, hd));
        OPB(PS_PROF_COMPRESSOR,
            ps_payload_backward(ctx, G.ln1, dw.key_payload, G.pk, p.ln1, w.key_payload, shared, G.payload_scratch, d, hd, win) ||
                ps_payload_backward(ctx, G.ln1, dw.value_payload, G.pv, p.ln1, w.value_payload, shared, G.payload_scratch, d,
                                    hd, win));
        /* the gate regulariser adds its gradient to d alpha (both branches) before the softmax backward */
        if (g->gate_reg_weight > 0 && c->gate == PS_GATE_LEARNED)
            OPB(PS_PROF_COMPRESSOR, ps_gate_entropy(ctx, &g->gate_reg_value, G.ga_k, p.ga_k, B, nW, nkv, W, g->gate_reg_weight) ||
                                        ps_gate_entropy(ctx, &g->gate_reg_value, G.ga_v, p.ga_v, B, nW, nkv, W, g->gate_reg_weight));
        if (c->gate == PS_GATE_LEARNED)
            OPB(PS_PROF_COMPRESSOR,
                ps_gate_backward(ctx, G.ln1, dw.key_gate_w, dw.key_gate_b, G.ga_k, p.ga_k, p.ln1, w.key_gate_w, d, win) ||
                    ps_gate_backward(ctx, G.ln1, dw.value_gate_w, dw.value_gate_b, G.ga_v, p.ga_v, p.ln1, w.value_gate_w, d,
                                     win));
    }
    /* dh = d resid_pre */
    OPB(PS_PROF_NORM_ROPE, ps_rmsnorm_backward(ctx, dh, dw.in_norm, G.ln1, h_in, w.in_norm, p.ln1_rstd, BT, d));
    return 0;
}

int ps_backward(const ps_model *m, const ps_acts *a, ps_acts *g, const int32_t *tokens, const int32_t *targets,
                float scale, float *grads, double *loss_sum, int64_t *n_targets, ps_error *err) {
    ps_backward_opts o = {0};
    return ps_backward_ex(m, a, g, tokens, targets, scale, grads, loss_sum, n_targets, &o, err);
}

int ps_backward_ex(const ps_model *m, const ps_acts *a, ps_acts *g, const int32_t *tokens, const int32_t *targets,
                   float scale, float *grads, double *loss_sum, int64_t *n_targets, const ps_backward_opts *o,
                   ps_error *err) {
    const ps_config *c = &m->cfg;
    if (o->stop_layer < 0 || o->stop_layer >= c->n_layers)
        return ps_fail(err, "backward: stop layer %d outside the model's layers [0, %lld)", o->stop_layer, (long long)c->n_layers);
    bw_opts bo = {.o = o, .err = err};
    if (!a->keep_all) return ps_fail(err, "backward needs the activations of every layer (ps_acts with keep_all)");
    if (g->B != a->B || g->T != a->T) return ps_fail(err, "backward scratch was made for another batch shape");
    if (a->ctx != m->ctx || g->ctx != m->ctx) return ps_fail(err, "backward: the activations live on another context than the model");
    int64_t BT = a->B * a->T, d = c->d_model, V = c->vocab_size;
    for (int64_t i = 0; i < BT; i++)
        if (targets[i] < -1 || targets[i] >= V)
            return ps_fail(err, "target %d at sequence %lld, position %lld is outside the vocabulary [0, %lld)", targets[i],
                           (long long)(i / a->T), (long long)(i % a->T), (long long)V);
    ps_ctx *ctx = a->ctx;
    ps_profile *prof = a->prof;
    float *dh = g->p.resid; /* [B, T, d], the running gradient of the residual stream */
    int rc = 0;
    if (a->max_rows) {
        /* rows mode: the loss at the logit rows only; every target elsewhere must be -1 */
        if (g->max_rows < a->n_rows) return ps_fail(err, "backward scratch holds %lld logit rows, the pass had %lld", (long long)g->max_rows, (long long)a->n_rows);
        int32_t *rt = malloc((size_t)(a->n_rows ? a->n_rows : 1) * sizeof *rt);
        char *in_rows = calloc((size_t)BT, 1);
        if (!rt || !in_rows) {
            free(rt);
            free(in_rows);
            return ps_fail(err, "out of memory for the targets of %lld logit rows", (long long)a->n_rows);
        }
        for (int64_t i = 0; i < a->n_rows; i++) {
            rt[i] = targets[a->rows[i]];
            in_rows[a->rows[i]] = 1;
        }
        for (int64_t i = 0; i < BT && !rc; i++)
            if (targets[i] >= 0 && !in_rows[i])
                rc = ps_fail(err, "target at sequence %lld, position %lld has no logit row (the pass computed %lld rows)",
                             (long long)(i / a->T), (long long)(i % a->T), (long long)a->n_rows);
        if (!rc) {
            PROF(1, PS_PROF_OTHER, rc = ps_cross_entropy(ctx, loss_sum, n_targets, g->p.logits, a->p.logits, rt, a->n_rows, V, scale));
            if (!rc)
                PROF(1, PS_PROF_MATMUL, rc = ps_fill(ctx, g->p.lnf_rows, 0.0f, a->n_rows * d) ||
                                             ps_matmul_backward(ctx, g->p.lnf_rows, o->no_weight_grads ? NULL : ps_model_lm_head(m, grads), g->p.logits,
                                                                a->p.lnf_rows, ps_model_lm_head(m, m->params), a->n_rows, d, V) ||
                                             ps_fill(ctx, g->p.lnf, 0.0f, BT * d) ||
                                             ps_scatter_rows(ctx, g->p.lnf, g->p.lnf_rows, a->rows, a->n_rows, d));
            if (rc && ctx->failed) ps_ctx_check(ctx, err);
        }
        free(rt);
        free(in_rows);
        if (rc) return -1;
    } else {
        PROF(1, PS_PROF_OTHER, rc = ps_cross_entropy(ctx, loss_sum, n_targets, g->p.logits, a->p.logits, targets, BT, V, scale));
        if (!rc) rc = ps_fill(ctx, g->p.lnf, 0.0f, BT * d);
        if (!rc)
            PROF(1, PS_PROF_MATMUL, rc = ps_matmul_backward(ctx, g->p.lnf, o->no_weight_grads ? NULL : ps_model_lm_head(m, grads), g->p.logits, a->p.lnf,
                                                             ps_model_lm_head(m, m->params), BT, d, V));
    }
    if (!rc) rc = ps_fill(ctx, dh, 0.0f, BT * d);
    if (!rc)
        PROF(1, PS_PROF_NORM_ROPE,
             rc = ps_rmsnorm_backward(ctx, dh, ps_model_final_norm(m, grads), g->p.lnf, a->p.resid + c->n_layers * BT * d,
                                      ps_model_final_norm(m, m->params), a->p.lnf_rstd, BT, d));
    for (int l = (int)c->n_layers - 1; l >= o->stop_layer && !rc; l--) rc = layer_backward(m, a, g, l, grads, dh, &bo);
    if (rc == -2) return -1; /* a gradient hook failed: err already says why */
    if (!rc && o->stop_layer == 0 && !o->no_weight_grads) /* the embedding's gradient is a weight gradient */
        PROF(1, PS_PROF_OTHER, rc = ps_embed_backward(ctx, ps_model_embed(m, grads), dh, tokens, BT, d));
    return rc ? ps_ctx_check(ctx, err) : 0;
}
