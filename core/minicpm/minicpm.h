/* minicpm.h — the MiniCPM4 family (docs/minicpm.md): Hugging Face `MiniCPMForCausalLM` checkpoints whose
 * config.json carries a `sparse_config` (InfLLM-v2 block-sparse attention). Owns: the config (parsed and
 * checked, every refusal naming the key and the file), the weights (bf16 / f16 / f32, one file or shards with
 * an index, converted to float32), the float32 forward over a batch of sequences with its hook points, and its
 * ps_family table (ps_family_minicpm, registered in core/runtime.c). The attention's math is core/select.h's.
 *
 * Forward (per sequence of T tokens; L = T): h = embed[ids]·scale_emb; per layer
 *   h += o_proj(attn(RMSNorm(h)))·scale_depth/√n_layers, h += down(silu(gate(x))⊙up(x))·scale_depth/√n_layers
 * with x = RMSNorm(h); logits = lm_head(RMSNorm(h) / (hidden_size / dim_model_base)). Attention: T < dense_len
 * → ordinary causal attention; else InfLLM-v2 selection over blocks (select.h). A KV cache (ps_minicpm_cache,
 * below) decodes one token at a time; it is the family table's kvcache (minicpm_family.c), so generate and serve run it.
 *
 * Hook points per layer l (slot l; B sequences of T tokens; N1 / N2 the level-1 / level-2 windows complete in
 * T tokens, nb = ⌈T / block⌉, k + Lb the slots): blocks.l.hook_resid_pre [B,T,d], attn.hook_q [B,T,H,D] (roped),
 * attn.hook_k / hook_v [B,T,Hkv,D], attn.hook_ck [B,N1,Hkv,D], attn.hook_ck2 [B,N2,Hkv,D],
 * attn.hook_select_scores [B,T,Hkv,N1], attn.hook_block_scores [B,T,Hkv,nb], attn.hook_blocks [B,T,Hkv,k+Lb]
 * (ids as floats, -1 empty), attn.hook_z [B,T,H,D], hook_attn_out / hook_mlp_out [B,T,d] (what is added to the
 * residual: scaled by scale_depth/√n_layers), hook_resid_post [B,T,d]. Each may be overwritten: the forward goes
 * on from what it leaves (an overwritten hook_blocks is checked: integers in [-1, nb)). The selection points
 * (ck .. blocks) fire only on the sparse path. */
#ifndef PS_MINICPM_H
#define PS_MINICPM_H

#include <stddef.h>
#include <stdint.h>

#include "core/ctx.h"
#include "core/error.h"
#include "core/hooks.h"
#include "core/safetensors.h"
#include "core/select.h"

#define PS_MINICPM_MAX_HALF 512 /* head_dim / 2 at most (the longrope factors) */

typedef struct {
    int64_t vocab_size, hidden_size, intermediate_size, n_layers, n_heads, n_kv_heads, head_dim, max_position_embeddings;
    double rms_norm_eps, rope_theta, scale_emb, scale_depth, dim_model_base;
    int tie_word_embeddings;
    /* rope_scaling longrope (longrope 0: plain RoPE) */
    int longrope;
    int64_t original_max;
    double short_factor[PS_MINICPM_MAX_HALF], long_factor[PS_MINICPM_MAX_HALF];
    /* sparse_config */
    ps_select_cfg sel;      /* kernel_size, kernel_stride, block_size, init_blocks, window_size / block_size, topk */
    int64_t window_size;
    int use_nope;
    int64_t dense_len;      /* <= 0: always sparse */
} ps_minicpm_config;

/* 1 when the JSON text is a MiniCPM config (architectures holds MiniCPMForCausalLM, or model_type "minicpm"). */
int ps_minicpm_config_detect(const char *text, size_t len);
int ps_minicpm_config_detect_file(const char *path);
/* Parse and check; src names the file in errors. */
int ps_minicpm_config_parse(const char *text, size_t len, const char *src, ps_minicpm_config *c, ps_error *err);
int ps_minicpm_config_load(const char *path, ps_minicpm_config *c, ps_error *err);
/* The rotary tables of positions p0 .. p0 + n - 1 in a sequence of L tokens (L picks longrope's short or long
 * factors): cos / sin [n, head_dim / 2], the longrope scale applied. */
void ps_minicpm_rope_table(const ps_minicpm_config *c, int64_t p0, int64_t n, int64_t L, float *cos_t, float *sin_t);

typedef struct {
    float *wq, *wk, *wv, *wo, *w_in, *w_post, *gate, *up, *down;
} ps_minicpm_layer;

typedef struct {
    ps_minicpm_config cfg;
    char dir[4096], cpath[4200];
    ps_ctx *ctx;            /* a cpu context: the ops and the hooks' firing */
    ps_st_set files;        /* the weight files (open after ps_minicpm_model_open) */
    int files_open, loaded;
    float *embed, *norm, *lm_head; /* lm_head == embed when tied */
    ps_minicpm_layer *layers;
    int64_t n_params;
    int stored_dtype;       /* the first weight's dtype (ps_dtype), for info */
} ps_minicpm_model;

/* Read the config and check that every tensor the config needs is in the weight files with its shape (no
 * data read); then ps_minicpm_model_load_weights converts them. ps_minicpm_model_load does both. */
int ps_minicpm_model_open(ps_minicpm_model *m, const char *dir, ps_error *err);
int ps_minicpm_model_load_weights(ps_minicpm_model *m, ps_error *err);
int ps_minicpm_model_load(ps_minicpm_model *m, const char *dir, ps_error *err);
void ps_minicpm_model_free(ps_minicpm_model *m);

/* Activations of a forward over B sequences of T tokens (one layer's buffers reused by every layer). */
typedef struct {
    int64_t B, T;
    float *h, *x, *q, *k, *v, *qn, *kn, *k1, *k2, *P, *bs, *blocks, *z, *lse, *ao, *g, *u, *mo, *logits, *cos_t, *sin_t;
} ps_minicpm_acts;
int ps_minicpm_acts_create(ps_minicpm_acts *a, const ps_minicpm_model *m, int64_t B, int64_t T, ps_error *err);
void ps_minicpm_acts_free(ps_minicpm_acts *a);
int64_t ps_minicpm_acts_bytes(const ps_minicpm_config *c, int64_t B, int64_t T);
/* Whether a forward of L tokens takes the sparse path (L >= dense_len, or dense_len <= 0). */
static inline int ps_minicpm_sparse(const ps_minicpm_config *c, int64_t L) { return c->dense_len <= 0 || L >= c->dense_len; }
/* tokens [B, T]; n_run layers (-1: all and the logits [B, T, V] in a->logits). */
int ps_minicpm_forward(const ps_minicpm_model *m, ps_minicpm_acts *a, const int32_t *tokens, const ps_hooks *h, int n_run,
                       ps_error *err);

/* ---- the KV cache (one sequence): a prefill over the prompt at once, then one token at a time ----
 * Each call decides dense or sparse by its total length L (docs/minicpm.md, "Decode"): a decode step on the sparse
 * path equals the last row of a whole forward over the L tokens; one that crossed dense_len keeps the keys its
 * dense calls computed. The compressed keys grow as windows complete. */
typedef struct {
    int64_t cap, L, nb_cap;      /* positions it holds, tokens so far, blocks of cap */
    int64_t n1, n2;              /* complete windows of both levels so far */
    float *k, *v, *kn;           /* per layer [cap, Hkv, D]: roped keys, values, un-roped keys (use_nope) */
    float *k1, *k2;              /* per layer [N1(cap), Hkv, D], [N2(cap), Hkv, D] */
    float *P;                    /* [Hkv, N1(cap)] the new row's stage-1 scores */
    float *bs, *blocks;          /* per layer (slots of Hkv·nb_cap, Hkv·(k + Lb)) the last row's block scores [Hkv, nb(L)]
                                  * and blocks [Hkv, k + Lb] (sparse calls) */
    ps_minicpm_acts row;         /* one row's activations */
} ps_minicpm_cache;
int ps_minicpm_cache_create(ps_minicpm_cache *kv, const ps_minicpm_model *m, int64_t cap, ps_error *err);
void ps_minicpm_cache_free(ps_minicpm_cache *kv);
/* The bytes a cache holding L tokens has written (what is resident: its arrays are sized for cap positions but
 * only the first L are touched): per layer the keys and values (and the un-roped keys under use_nope) of L
 * positions and the compressed keys of both levels complete in L, the last row's block scores and blocks, the
 * stage-1 row, and the one-row activations. `phasescope info` prints it; bench/bench_select_decode measures it. */
int64_t ps_minicpm_cache_bytes(const ps_minicpm_config *c, int64_t L);
/* The prompt's T tokens at once into an empty cache; logits [V] of its last row. */
int ps_minicpm_prefill(const ps_minicpm_model *m, ps_minicpm_cache *kv, const int32_t *tokens, int64_t T, float *logits,
                       ps_error *err);
/* One token at position kv->L; logits [V] of it. */
int ps_minicpm_decode(const ps_minicpm_model *m, ps_minicpm_cache *kv, int32_t token, float *logits, ps_error *err);
/* The same with hooks h (NULL: none) and, prefill, every row's logits [T, V] when all_rows (logits NULL: none). A
 * prefill fires every point as a whole forward over its T tokens does (hook_ck [1, N1, Hkv, D] once); a decode
 * step fires each point on its row ([1, 1, ...]; the selection points [1, 1, Hkv, N1 / nb / k + Lb]) and hook_ck /
 * hook_ck2 once per window that completes at it ([1, 1, Hkv, D]; *ev_entry, when given, holds the window's index
 * while it fires, else -1), the selection points on the sparse path only. What the hooks leave is what the cache
 * keeps (keys, values, pooled keys) and what the step goes on from. */
int ps_minicpm_prefill_ex(const ps_minicpm_model *m, ps_minicpm_cache *kv, const int32_t *tokens, int64_t T, const ps_hooks *h,
                          float *logits, int all_rows, ps_error *err);
int ps_minicpm_decode_ex(const ps_minicpm_model *m, ps_minicpm_cache *kv, int32_t token, const ps_hooks *h, int64_t *ev_entry,
                         float *logits, ps_error *err);
/* fork: dst (uninitialised) a copy of everything src has written (its own arrays of src's capacity). truncate: back to
 * the first T tokens (T <= L): positions and complete windows beyond T are forgotten; what is kept is what the longer
 * sequence computed (dense or sparse as its calls were: docs/minicpm.md "Fork and truncate"). */
int ps_minicpm_cache_copy(ps_minicpm_cache *dst, const ps_minicpm_cache *src, const ps_minicpm_model *m, ps_error *err);
int ps_minicpm_cache_truncate(const ps_minicpm_config *c, ps_minicpm_cache *kv, int64_t T, ps_error *err);

/* ---- hook points ---- */
typedef enum {
    PS_MCH_RESID_PRE = 0, PS_MCH_Q, PS_MCH_K, PS_MCH_V, PS_MCH_CK, PS_MCH_CK2, PS_MCH_SELECT_SCORES, PS_MCH_BLOCK_SCORES,
    PS_MCH_BLOCKS, PS_MCH_Z, PS_MCH_ATTN_OUT, PS_MCH_MLP_OUT, PS_MCH_RESID_POST,
    PS_MCH_NPOINTS
} ps_minicpm_hook_point;
extern const ps_hook_family ps_minicpm_hook_family;
void ps_minicpm_hook_name(char *buf, size_t n, int slot, int point);
/* The shape of point p at T tokens and its rank (every layer has every point; the selection points fire only on
 * the sparse path, with 0 entries before the first complete window: N1 = 0 while T < kernel_size). */
int ps_minicpm_point_shape(const ps_minicpm_config *c, int p, int64_t B, int64_t T, int64_t d[4]);
int ps_minicpm_hook_parse(const ps_minicpm_config *c, const char *name, int *slot, int *point, ps_error *err);
int ps_minicpm_hooks_add(ps_hooks *h, const ps_minicpm_config *c, const char *name, ps_hook_fn fn, void *user, ps_error *err);
int ps_minicpm_hooks_add_action(ps_hooks *h, const ps_minicpm_config *c, const char *name, const ps_hook_action *act,
                                ps_error *err);
int ps_minicpm_cache_watch(ps_cache *cache, ps_hooks *h, const ps_minicpm_config *c, const char *name, ps_error *err);

#endif
