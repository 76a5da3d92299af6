#include "backward.h"

#include <string.h>

#include "ops.h"

#define ZERO(ptr, n) memset((ptr), 0, (size_t)(n) * sizeof(float))

static void layer_backward(const ps_model *m, const ps_acts *a, ps_acts *g, int l, float *grads, float *dh) {
    ps_profile *prof = a->prof;
    const ps_config *c = &m->cfg;
    ps_layer_params w = ps_model_layer(m, m->params, l), dw = ps_model_layer(m, grads, l);
    ps_act_ptrs p = ps_acts_layer(a, l), G = g->p;
    int64_t B = a->B, T = a->T, BT = B * T, d = c->d_model, hd = c->head_dim, nh = c->n_heads, nkv = c->n_kv_heads;
    int64_t nW = a->nW, W = c->window, S = c->stride, dff = c->d_ff;
    const float *h_in = a->p.resid + (int64_t)l * BT * d;

    /* MLP: resid_post = resid_mid + down(silu(gate m) ⊙ up m), m = rmsnorm(resid_mid) */
    ZERO(G.mlp_h, BT * dff);
    PROF(1, PS_PROF_MATMUL, ps_matmul_backward(G.mlp_h, dw.mlp_down, dh, p.mlp_h, w.mlp_down, BT, dff, d));
    PROF(1, PS_PROF_OTHER, ps_swiglu_backward(G.mlp_g, G.mlp_u, G.mlp_h, p.mlp_g, p.mlp_u, BT * dff));
    ZERO(G.ln2, BT * d);
    PROF(1, PS_PROF_MATMUL, ps_matmul_backward(G.ln2, dw.mlp_gate, G.mlp_g, p.ln2, w.mlp_gate, BT, d, dff));
    PROF(1, PS_PROF_MATMUL, ps_matmul_backward(G.ln2, dw.mlp_up, G.mlp_u, p.ln2, w.mlp_up, BT, d, dff));
    PROF(1, PS_PROF_NORM_ROPE, ps_rmsnorm_backward(dh, dw.post_norm, G.ln2, p.resid_mid, w.post_norm, p.ln2_rstd, BT, d)); /* dh = d resid_mid */

    /* attention: resid_mid = h + W_o z */
    ZERO(G.z, BT * nh * hd);
    PROF(1, PS_PROF_MATMUL, ps_matmul_backward(G.z, dw.wo, dh, p.z, w.wo, BT, nh * hd, d));
    ZERO(G.k, BT * nkv * hd);
    ZERO(G.v, BT * nkv * hd);
    if (nW > 0) {
        ZERO(G.ck, B * nW * nkv * hd);
        ZERO(G.cv, B * nW * nkv * hd);
    }
    PROF(1, PS_PROF_ATTENTION, ps_attn_backward(G.q, G.k, G.v, G.ck, G.cv, G.probs, G.z, p.probs, p.q, p.k, p.v, p.ck, p.cv, &a->geom));
    if (c->rope) {
        PROF(1, PS_PROF_NORM_ROPE, ps_rope_backward(G.q, a->p.rope_cos, a->p.rope_sin, B, T, nh, hd, 1));
        PROF(1, PS_PROF_NORM_ROPE, ps_rope_backward(G.k, a->p.rope_cos, a->p.rope_sin, B, T, nkv, hd, 1));
    }
    if (c->qk_norm) {
        ZERO(G.q_pre, BT * nh * hd);
        ZERO(G.k_pre, BT * nkv * hd);
        PROF(1, PS_PROF_NORM_ROPE, ps_rmsnorm_backward(G.q_pre, dw.qnorm, G.q, p.q_pre, w.qnorm, p.q_rstd, BT * nh, hd));
        PROF(1, PS_PROF_NORM_ROPE, ps_rmsnorm_backward(G.k_pre, dw.knorm, G.k, p.k_pre, w.knorm, p.k_rstd, BT * nkv, hd));
    } else {
        memcpy(G.q_pre, G.q, (size_t)(BT * nh * hd) * sizeof(float));
        memcpy(G.k_pre, G.k, (size_t)(BT * nkv * hd) * sizeof(float));
    }
    ZERO(G.ln1, BT * d);
    PROF(1, PS_PROF_MATMUL, ps_matmul_backward(G.ln1, dw.wq, G.q_pre, p.ln1, w.wq, BT, d, nh * hd));
    PROF(1, PS_PROF_MATMUL, ps_matmul_backward(G.ln1, dw.wk, G.k_pre, p.ln1, w.wk, BT, d, nkv * hd));
    PROF(1, PS_PROF_MATMUL, ps_matmul_backward(G.ln1, dw.wv, G.v, p.ln1, w.wv, BT, d, nkv * hd));

    if (c->kind == PS_ATTN_COMPRESSED && nW > 0) {
        int shared = c->payload == PS_PAYLOAD_SHARED;
        if (c->rope) PROF(1, PS_PROF_NORM_ROPE, ps_rope_backward(G.ck, a->p.rope_cos, a->p.rope_sin, B, nW, nkv, hd, S));
        if (c->qk_norm) {
            ZERO(G.ck_pre, B * nW * nkv * hd);
            PROF(1, PS_PROF_NORM_ROPE, ps_rmsnorm_backward(G.ck_pre, dw.knorm, G.ck, p.ck_pre, w.knorm, p.ck_rstd, B * nW * nkv, hd));
        } else
            memcpy(G.ck_pre, G.ck, (size_t)(B * nW * nkv * hd) * sizeof(float));
        PROF(1, PS_PROF_COMPRESSOR, ps_pool_backward(G.ga_k, G.pk, G.ck_pre, p.ga_k, p.pk, B, nW, W, nkv, hd));
        PROF(1, PS_PROF_COMPRESSOR, ps_pool_backward(G.ga_v, G.pv, G.cv, p.ga_v, p.pv, B, nW, W, nkv, hd));
        PROF(1, PS_PROF_COMPRESSOR, ps_payload_backward(G.ln1, dw.key_payload, G.pk, p.ln1, w.key_payload, shared, G.payload_scratch, B, T, d, nW, W, S, nkv * hd));
        PROF(1, PS_PROF_COMPRESSOR, ps_payload_backward(G.ln1, dw.value_payload, G.pv, p.ln1, w.value_payload, shared, G.payload_scratch, B, T, d, nW, W, S, nkv * hd));
        if (c->gate == PS_GATE_LEARNED) {
            PROF(1, PS_PROF_COMPRESSOR, ps_gate_backward(G.ln1, dw.key_gate_w, dw.key_gate_b, G.ga_k, p.ga_k, p.ln1, w.key_gate_w, B, T, d, nW, W, S, nkv));
            PROF(1, PS_PROF_COMPRESSOR, ps_gate_backward(G.ln1, dw.value_gate_w, dw.value_gate_b, G.ga_v, p.ga_v, p.ln1, w.value_gate_w, B, T, d, nW, W, S, nkv));
        }
    }
    PROF(1, PS_PROF_NORM_ROPE, ps_rmsnorm_backward(dh, dw.in_norm, G.ln1, h_in, w.in_norm, p.ln1_rstd, BT, d)); /* dh = d resid_pre */
}

int ps_backward(const ps_model *m, const ps_acts *a, ps_acts *g, const int32_t *tokens, const int32_t *targets,
                float scale, float *grads, double *loss_sum, int64_t *n_targets, ps_error *err) {
    const ps_config *c = &m->cfg;
    if (!a->keep_all) return ps_fail(err, "backward needs the activations of every layer (ps_acts with keep_all)");
    if (g->B != a->B || g->T != a->T) return ps_fail(err, "backward scratch was made for another batch shape");
    int64_t BT = a->B * a->T, d = c->d_model, V = c->vocab_size;
    for (int64_t i = 0; i < BT; i++)
        if (targets[i] < -1 || targets[i] >= V)
            return ps_fail(err, "target %d at sequence %lld, position %lld is outside the vocabulary [0, %lld)", targets[i],
                           (long long)(i / a->T), (long long)(i % a->T), (long long)V);
    ps_profile *prof = a->prof;
    int64_t n_t = 0;
    PROF(1, PS_PROF_OTHER, n_t = ps_cross_entropy(loss_sum, g->p.logits, a->p.logits, targets, BT, V, scale));
    if (n_t < 0) return ps_fail(err, "out of memory for the per-row losses of %lld rows", (long long)BT);
    *n_targets += n_t;
    float *dh = g->p.resid; /* [B, T, d], the running gradient of the residual stream */
    ZERO(g->p.lnf, BT * d);
    PROF(1, PS_PROF_MATMUL, ps_matmul_backward(g->p.lnf, ps_model_lm_head(m, grads), g->p.logits, a->p.lnf, ps_model_lm_head(m, m->params), BT, d, V));
    ZERO(dh, BT * d);
    PROF(1, PS_PROF_NORM_ROPE, ps_rmsnorm_backward(dh, ps_model_final_norm(m, grads), g->p.lnf, a->p.resid + c->n_layers * BT * d, ps_model_final_norm(m, m->params), a->p.lnf_rstd, BT, d));
    for (int l = (int)c->n_layers - 1; l >= 0; l--) layer_backward(m, a, g, l, grads, dh);
    float *dE = ps_model_embed(m, grads);
    for (int64_t i = 0; i < BT; i++) {
        float *row = dE + (int64_t)tokens[i] * d;
        const float *src = dh + i * d;
        for (int64_t e = 0; e < d; e++) row[e] += src[e];
    }
    return 0;
}
