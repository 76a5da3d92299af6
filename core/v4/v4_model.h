/* v4_model.h — a DeepSeek-V4 checkpoint's weights (SPEC-v4.md "Checkpoint format"): both tensor-name
 * schemes (DeepSeek's own, as on the hub, and transformers' module names with stacked experts), one
 * model.safetensors or a shard index (core/safetensors.h ps_st_set), dtypes F32 / BF16 / F16 / I32 / I64,
 * and the quantised weights of real checkpoints: FP8 e4m3 with e8m0 block scales (128 x 128 in V4) and
 * FP4 e2m1 (two per byte, low nibble first; safetensors dtype F4, or packed in I8/U8 with half the
 * columns) with e8m0 scales per block of 32 inputs. Everything is dequantised to float32 on load. A
 * scale grid [ceil(R/br), ceil(C/bc)] of a weight [R, C] (leading dims shared) uses the format's block
 * (128 x 128 for FP8, 1 x 32 for FP4) when the grid fits it, else the block ceil(R/rows) x ceil(C/cols)
 * the grid implies. A weight's scale is found under NAME.scale (NAME
 * without ".weight"), NAME.weight_scale_inv, or NAME_scale_inv / NAME.scale for stacked HF experts.
 *
 * Weights live in buffers of the model's context: one for the global tensors and one per layer, so that
 * layers can be loaded lazily (ps_v4_layer_acquire / release) and a forward holds one layer at a time.
 * Errors name the file and the tensor (and the key for config errors). `mtp.*` tensors are ignored. */
#ifndef PS_V4_MODEL_H
#define PS_V4_MODEL_H

#include <stdint.h>

#include "core/ctx.h"
#include "core/error.h"
#include "core/safetensors.h"
#include "core/v4/v4_config.h"

typedef enum {
    /* global */
    PS_V4_T_EMBED = 0, PS_V4_T_HEAD, PS_V4_T_NORM, PS_V4_T_HC_HEAD_FN, PS_V4_T_HC_HEAD_BASE, PS_V4_T_HC_HEAD_SCALE,
    /* per layer */
    PS_V4_T_ATTN_NORM, PS_V4_T_FFN_NORM,
    PS_V4_T_HC_ATTN_FN, PS_V4_T_HC_ATTN_BASE, PS_V4_T_HC_ATTN_SCALE,
    PS_V4_T_HC_FFN_FN, PS_V4_T_HC_FFN_BASE, PS_V4_T_HC_FFN_SCALE,
    PS_V4_T_SINK, PS_V4_T_WQ_A, PS_V4_T_Q_NORM, PS_V4_T_WQ_B, PS_V4_T_WKV, PS_V4_T_KV_NORM, PS_V4_T_WO_A, PS_V4_T_WO_B,
    PS_V4_T_C_WKV, PS_V4_T_C_WGATE, PS_V4_T_C_APE, PS_V4_T_C_NORM,
    PS_V4_T_I_WQ_B, PS_V4_T_I_WP, PS_V4_T_I_WKV, PS_V4_T_I_WGATE, PS_V4_T_I_APE, PS_V4_T_I_NORM,
    PS_V4_T_GATE_W, PS_V4_T_GATE_BIAS, PS_V4_T_TID2EID,
    PS_V4_T_W1, PS_V4_T_W3, PS_V4_T_W2, /* routed experts, stacked [E, I, D] / [E, I, D] / [E, D, I] */
    PS_V4_T_SW1, PS_V4_T_SW3, PS_V4_T_SW2,
    PS_V4_T_NKINDS
} ps_v4_tensor_kind;

#define PS_V4_FIRST_LAYER_KIND PS_V4_T_ATTN_NORM

typedef enum { PS_V4_NAMES_NATIVE = 0, PS_V4_NAMES_HF = 1 } ps_v4_names;

/* Pointers into a layer's buffer (NULL where the layer has no such tensor). Shapes: D hidden, N hc_mult,
 * H heads, Dh head_dim, Q q_lora_rank, G o_groups, OR o_lora_rank, m the layer's rate, c = 2 (CSA) or
 * 1 (HCA), Hi/Di indexer heads/dim, E experts, I expert width, Is = n_shared_experts * I. */
typedef struct {
    float *attn_norm, *ffn_norm;                    /* [D] */
    float *hc_attn_fn, *hc_attn_base, *hc_attn_scale; /* [(2+N)N, N*D], [(2+N)N], [3] */
    float *hc_ffn_fn, *hc_ffn_base, *hc_ffn_scale;
    float *sink;                                    /* [H] */
    float *wq_a, *q_norm, *wq_b;                    /* [Q, D], [Q], [H*Dh, Q] */
    float *wkv, *kv_norm;                           /* [Dh, D], [Dh] */
    float *wo_a, *wo_b;                             /* [G*OR, H*Dh/G], [D, G*OR] */
    float *c_wkv, *c_wgate, *c_ape, *c_norm;        /* [c*Dh, D] x2, [m, c*Dh], [Dh] */
    float *i_wq_b, *i_wp, *i_wkv, *i_wgate, *i_ape, *i_norm; /* [Hi*Di, Q], [Hi, D], [2Di, D] x2, [m, 2Di], [Di] */
    float *gate_w, *gate_bias;                      /* [E, D], [E] (moe layers) */
    const int32_t *tid2eid;                         /* host [V, k] (hash layers) */
    float *w1, *w3, *w2;                            /* [E, I, D], [E, I, D], [E, D, I] */
    float *sw1, *sw3, *sw2;                         /* [Is, D], [Is, D], [D, Is] (n_shared_experts > 0) */
} ps_v4_layer;

typedef struct {
    ps_v4_tensor_kind kind;
    int layer;        /* -1: global */
    int ndim;
    int64_t shape[3];
    int64_t numel, offset; /* floats into the global or the layer's buffer */
} ps_v4_tensor;

typedef struct {
    int64_t n_tensors[6]; /* stored tensors by dtype: F32/F16/BF16, FP8, FP4, integer, scales, other */
    int64_t bytes[6];
} ps_v4_storage;

typedef struct {
    ps_v4_config cfg;
    char dir[4096], cpath[4096];
    ps_v4_names names;
    ps_ctx *ctx;
    int owns_ctx;
    ps_st_set files;
    int lazy;                  /* layers loaded on acquire and dropped on release */
    int n_tensors;
    ps_v4_tensor *table;       /* globals first, then every layer's */
    int64_t global_floats;
    int64_t *layer_floats;     /* [L] */
    float *global;             /* buffer of ctx */
    float **layer_buf;         /* [L] buffers of ctx (NULL while a lazy layer is not loaded) */
    int32_t **tid2eid;         /* [L] host arrays (hash layers) */
    int *layer_refs;           /* [L] */
    ps_v4_storage storage;     /* what the checkpoint stores (filled by ps_v4_model_open) */
    int64_t n_params;          /* float32 parameters of the whole model */
    char backend[32];          /* the runtime's: where ps_runtime's load moves the weights ("" = cpu) */
} ps_v4_model;

/* Open DIR: config.json (ps_v4_config_load), the weight files, and check every tensor's name, shape and
 * dtype (and its scale's) against the config without reading weight data: unknown tensors, missing
 * ones, wrong shapes, unsupported dtypes and missing or misshapen scales are errors naming the file and
 * the tensor. Nothing is allocated for weights yet. */
int ps_v4_model_open(ps_v4_model *m, const char *dir, ps_error *err);
/* Allocate and read the weights on a CPU context of the model's own: the global tensors, and every
 * layer unless lazy (then ps_v4_layer_acquire loads a layer when the forward reaches it). */
int ps_v4_model_load_weights(ps_v4_model *m, int lazy, ps_error *err);
/* Both. */
int ps_v4_model_load(ps_v4_model *m, const char *dir, int lazy, ps_error *err);
void ps_v4_model_free(ps_v4_model *m);
/* Move the loaded weights to a context of `backend` of the model's own (NULL or the current backend:
 * nothing to do): every layer must be in memory (not lazy); the hash routing tables stay on the host. On
 * failure the model stays where it was, usable. */
int ps_v4_model_to_backend(ps_v4_model *m, const char *backend, ps_error *err);

/* Layer l's weights (loading them first when lazy and absent). Pair with ps_v4_layer_release, which
 * frees a lazy layer once nobody holds it. */
int ps_v4_layer_acquire(ps_v4_model *m, int l, ps_v4_layer *w, ps_error *err);
void ps_v4_layer_release(ps_v4_model *m, int l);

float *ps_v4_global(const ps_v4_model *m, ps_v4_tensor_kind k); /* EMBED, HEAD (the embedding when tied), ... */

/* The tensor's name in a scheme (experts: `expert` selects one of the native per-expert tensors; the HF
 * scheme stacks them). */
void ps_v4_tensor_name(char *buf, size_t n, ps_v4_names names, ps_v4_tensor_kind k, int layer, int expert);
/* Float32 parameters of one layer / of the global tensors. */
int64_t ps_v4_layer_params(const ps_v4_config *c, int l);
int64_t ps_v4_global_params(const ps_v4_config *c);

/* Element decoders of the quantised formats (FP8 e4m3 "fn": no infinities, S.1111.111 is NaN; FP4 e2m1;
 * e8m0: 2^(e-127), 0xff is NaN). */
float ps_v4_fp8_e4m3_to_f32(uint8_t b);
float ps_v4_fp4_e2m1_to_f32(uint8_t nibble);
float ps_v4_e8m0_to_f32(uint8_t b);

#endif
