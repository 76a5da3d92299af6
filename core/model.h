/* model.h — a model's parameters: one contiguous float buffer described by a size table of named
 * tensors (SPEC §3 names), loading and saving checkpoints (config.json + model.safetensors),
 * and random initialisation. The same table lays out gradient and optimizer buffers. */
#ifndef PS_MODEL_H
#define PS_MODEL_H

#include <stdint.h>

#include "core/config.h"
#include "core/ctx.h"
#include "core/error.h"
#include "core/safetensors.h"

/* Parameter kinds; per-layer kinds repeat for every layer. */
typedef enum {
    PS_P_EMBED = 0,
    PS_P_IN_NORM, PS_P_WQ, PS_P_WK, PS_P_WV, PS_P_WO, PS_P_QNORM, PS_P_KNORM,
    PS_P_KEY_PAYLOAD, PS_P_VALUE_PAYLOAD, PS_P_KEY_GATE_W, PS_P_KEY_GATE_B, PS_P_VALUE_GATE_W, PS_P_VALUE_GATE_B,
    PS_P_POST_NORM, PS_P_MLP_GATE, PS_P_MLP_UP, PS_P_MLP_DOWN,
    PS_P_FINAL_NORM, PS_P_LM_HEAD,
    /* attention kind v4 (SPEC-v4's transformers names): the compressor and the sinks; its raw K=V
     * projection and norm are PS_P_WK / PS_P_KNORM, named self_attn.kv_proj / self_attn.kv_norm */
    PS_P_V4_C_WKV, PS_P_V4_C_WGATE, PS_P_V4_C_APE, PS_P_V4_C_NORM, PS_P_V4_SINKS,
    PS_P_NKINDS
} ps_param_kind;

typedef struct {
    char name[128];
    ps_param_kind kind;
    int layer; /* -1 for global tensors */
    int ndim;
    int64_t shape[3];
    int64_t numel;
    int64_t offset; /* into the parameter buffer, in floats */
} ps_param_info;

/* Pointers into a buffer laid out by the table (parameters, gradients, moments alike). NULL where the
 * config has no such tensor. Shapes in comments. */
typedef struct {
    float *in_norm;      /* [d] */
    float *wq;           /* [nh*hd, d] */
    float *wk, *wv;      /* [nkv*hd, d] */
    float *wo;           /* [d, nh*hd] */
    float *qnorm, *knorm;/* [hd] */
    float *key_payload, *value_payload;  /* [W, nkv*hd, d] per_offset or [nkv*hd, d] shared */
    float *key_gate_w, *value_gate_w;    /* [W, nkv, d] */
    float *key_gate_b, *value_gate_b;    /* [W, nkv] */
    float *post_norm;    /* [d] */
    float *mlp_gate, *mlp_up; /* [d_ff, d] */
    float *mlp_down;     /* [d, d_ff] */
    /* attention kind v4 (wk, knorm: the raw K=V projection [hd, d] and its norm; no wv) */
    float *c_wkv, *c_wgate; /* [c*hd, d] (c = 2 for CSA, 1 for HCA) */
    float *c_ape;        /* [m, c*hd] the position bias */
    float *c_norm;       /* [hd] */
    float *sinks;        /* [nh] */
} ps_layer_params;

typedef struct {
    ps_config cfg;
    int n_tensors;
    ps_param_info *table;
    int64_t n_params;
    float *params;       /* n_params floats, a buffer of ctx */
    ps_ctx *ctx;         /* the backend the parameters live on and the model runs on */
    int owns_ctx;        /* ctx was made by create/load (a CPU context) and goes with ps_model_free */
    /* metadata carried with the checkpoint (task layout etc.), "format" excluded */
    int n_meta;
    char **meta_keys, **meta_vals;
    int n_shards;        /* weight files read by ps_model_load: 1, or the shards it opened */
} ps_model;

/* Build the table for cfg and allocate zeroed parameters on a CPU context of the model's own. */
int ps_model_create(ps_model *m, const ps_config *cfg, ps_error *err);
/* Move the parameters to another context (the caller's; it must outlive the model). Loading,
 * initialisation and saving run on the host: move a model after loading it. */
int ps_model_to(ps_model *m, ps_ctx *ctx, ps_error *err);
/* The same onto a new context of the named backend, which the model then owns (no-op when the model is
 * already on that backend). */
int ps_model_to_backend(ps_model *m, const char *backend, ps_error *err);
void ps_model_free(ps_model *m);

/* Pointers into `base` (m->params or a buffer of the same layout). */
ps_layer_params ps_model_layer(const ps_model *m, float *base, int l);
float *ps_model_embed(const ps_model *m, float *base);
float *ps_model_final_norm(const ps_model *m, float *base);
float *ps_model_lm_head(const ps_model *m, float *base); /* the embedding when tied */
const ps_param_info *ps_model_find(const ps_model *m, const char *name);

/* Initialise: norms = 1, gates = 0, embedding N(0, 0.02), projections N(0, 0.02), output
 * projections (o_proj, down_proj) N(0, 0.02/sqrt(2L)), payloads N(0, 0.02) like k/v_proj. */
void ps_model_init(ps_model *m, uint64_t seed);
/* The same with another base standard deviation (0.02 above). */
void ps_model_init_std(ps_model *m, uint64_t seed, double std);

/* Load DIR/config.json (phasescope's schema or a Hugging Face Qwen3 config) and the weights:
 * DIR/model.safetensors, or when there is none, the shards named by DIR/model.safetensors.index.json
 * (opened lazily: only shards holding a needed tensor). Files are memory-mapped and converted tensor by
 * tensor (F32, BF16, F16) into the float32 parameter buffer, each tensor's file pages dropped after
 * it, so the peak is the float32 parameters plus about one tensor. Errors name the file and the tensor. */
int ps_model_load(ps_model *m, const char *dir, ps_error *err);

/* Save atomically: DIR/config.json and DIR/model.safetensors (F32, "__metadata__" with the model's
 * metadata). DIR is created if missing. */
int ps_model_save(const ps_model *m, const char *dir, ps_error *err);

typedef enum { PS_LAYOUT_PHASESCOPE = 0, PS_LAYOUT_HF = 1 } ps_layout;
typedef struct {
    ps_layout layout;          /* config.json schema: phasescope's own, or Hugging Face Qwen3 */
    int dtype_set;             /* 0: F32 */
    ps_dtype dtype;            /* PS_DT_F32, PS_DT_BF16 or PS_DT_F16 (rounded to nearest even) */
    uint64_t max_shard_bytes;  /* 0: one model.safetensors; else shards model-0000i-of-0000n.safetensors of at
                                  most this many bytes (a bigger tensor gets a shard of its own) + the index */
} ps_save_opts;
/* Save with a layout, a storage dtype and sharding (o NULL: as ps_model_save). Each file is atomic; the
 * other layout's weight files (model.safetensors, the index, stale model-*-of-*.safetensors) are removed
 * afterwards, so the directory holds one checkpoint. The model's metadata goes into every file. */
int ps_model_save_as(const ps_model *m, const char *dir, const ps_save_opts *o, ps_error *err);

/* Set (or replace) a metadata string. */
int ps_model_set_meta(ps_model *m, const char *key, const char *val, ps_error *err);
const char *ps_model_get_meta(const ps_model *m, const char *key);

#endif
