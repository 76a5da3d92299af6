/* v4_forward.h — the DeepSeek-V4 prefill forward on the runtime's compute seam (SPEC-v4.md "The
 * computation"): embedding into hc_mult streams, per layer mHC(attn) -> sliding / CSA / HCA attention
 * with a sink -> mHC(ffn) -> MoE, then the hc_head collapse, the final norm and the head, every step an
 * op on the model's context (core/ops.h) and every SPEC-v4 hook fired (read and overwrite; v4_hooks.h).
 *
 * Activations are one set of buffers of the context, shared by all layers (nothing is kept for a
 * backward); the probability matrices of a layer are materialised only when a hook on its attn.bias,
 * attn.logits or attn.pattern asks for them, so memory is O(T) per layer otherwise. */
#ifndef PS_V4_FORWARD_H
#define PS_V4_FORWARD_H

#include <stdint.h>

#include "core/error.h"
#include "core/hooks.h"
#include "core/v4/v4_model.h"

typedef struct {
    ps_ctx *ctx;
    const ps_v4_config *cfg;
    int64_t B, T;
    float *buf;          /* one buffer of ctx holding everything below */
    int64_t n_floats;
    /* streams and mHC */
    float *h, *h2;       /* [B*T, N, D] */
    float *mix;          /* [B*T, (2+N)N] */
    float *pre, *post, *comb; /* [B*T, N], [B*T, N], [B*T, N, N] */
    float *x, *xin;      /* [B*T, D] collapsed, normed */
    /* attention */
    float *q_lora, *q, *kv; /* [B*T, Q], [B*T, H*Dh], [B*T, Dh] */
    float *c_kv_raw, *c_z, *c_gate, *c_alpha, *c_pooled, *c_kv; /* [B*T, 2Dh] x2, [B, nW, S, Dh] x2, [B, nW, Dh] x2 */
    float *i_kv_raw, *i_z, *i_gate, *i_alpha, *i_pooled, *i_k;  /* same at Di */
    float *i_q, *i_w, *i_scores, *topk, *i_gap; /* [B*T, Hi*Di], [B*T, Hi], [B*T, nW], [B*T, K], [B*T] */
    float *heads, *sinkp, *sink_old; /* [B*T, H*Dh], [B, H, T] x2 */
    float *oa, *attn_out;  /* [B*T, G*OR], [B*T, D] */
    /* MoE */
    float *router_logits, *router_scores; /* [B*T, E] */
    float *experts, *weights, *route_gap; /* [B*T, k] x2, [B*T] */
    float *routed, *shared, *ffn_out;     /* [B*T, D] */
    float *xe, *ge, *ue, *he, *ye;        /* expert scratch [B*T, D], [B*T, I] x3, [B*T, D] */
    float *sg, *su, *sh;                  /* shared expert [B*T, Is] */
    /* head */
    float *final_x, *final_hidden, *logits; /* [B*T, D] x2, [B*T, V] */
    float *cos_main, *sin_main, *cos_comp, *sin_comp; /* [T, R/2] */
    float *ones;         /* [max(Dh, Di)] */
    /* the materialised attention (grown on demand) */
    float *att, *att_bias;
    int64_t att_n, att_bias_n;
    /* host staging */
    float *host_experts, *host_weights;
    int64_t *rows, *rows_bcast;
    float *row_w;
    float *logits_host;
} ps_v4_acts;

/* Bytes of the activations a forward of B x T tokens needs (one set of buffers shared by the layers:
 * the largest layer's scratch, the streams, the logits); materialise_attention adds a bias / logits /
 * pattern hook's [B, H, T, T + nW] matrices. */
int64_t ps_v4_acts_bytes(const ps_v4_config *c, int64_t B, int64_t T, int materialise_attention);

/* Activations for B sequences of T tokens (T <= max_position_embeddings). */
int ps_v4_acts_create(ps_v4_acts *a, ps_v4_model *m, int64_t B, int64_t T, ps_error *err);
void ps_v4_acts_free(ps_v4_acts *a);

/* Forward of tokens [B, T] (each in [0, vocab)). hooks: a V4 hook set (ps_v4_hooks_add /
 * ps_v4_cache_watch) or NULL. n_run: run layers 0..n_run-1 only (n_run < n_layers stops early: no
 * hc_head, final norm or logits); -1 or n_layers: the whole model. Lazy models load each layer when it
 * runs and drop it after. */
int ps_v4_forward(ps_v4_model *m, ps_v4_acts *a, const int32_t *tokens, const ps_hooks *hooks, int n_run, ps_error *err);

/* The per-position steps of a layer on the a->B x a->T rows of a (the KV cache, core/v4/v4_kvcache.c, runs
 * them on the rows of an append with a->T set to the piece's tokens): one mHC site (hooks pt_pre..pt_pre+2
 * and pt_in; input the streams a->h, output a->pre/post/comb and the normed block input a->xin), and the
 * MoE (input a->xin, output a->ffn_out; tokens [B*T] for the hash layers). */
int ps_v4_hc_site(ps_v4_acts *a, int l, const float *fn, const float *base, const float *scale, const float *norm_w,
                  int pt_pre, int pt_in, const ps_hooks *hooks, ps_error *err);
int ps_v4_moe(ps_v4_acts *a, int l, const ps_v4_layer *w, const int32_t *tokens, const ps_hooks *hooks, ps_error *err);

/* The logits [B, T, V] readable on the host (a copy on a device backend). */
const float *ps_v4_logits_host(ps_v4_acts *a, ps_error *err);

#endif
