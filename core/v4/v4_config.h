/* v4_config.h — the configuration of a DeepSeek-V4 checkpoint (SPEC-v4.md): config.json in either form
 * (transformers' `layer_types` / `compress_rates` / `mlp_layer_types` / `rope_parameters`, or the hub's
 * `compress_ratios` / `num_hash_layers` / `qk_rope_head_dim` / `rope_scaling`; the HF keys take
 * precedence where both are present), validated with one-line errors naming the file and the key, and
 * the rotary tables' frequencies (plain, or YaRN as transformers' `_compute_yarn_parameters`). */
#ifndef PS_V4_CONFIG_H
#define PS_V4_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

#define PS_V4_MAX_LAYERS 512
#define PS_V4_MAX_HALF_ROPE 1024 /* rope_dim / 2 */

typedef enum { PS_V4_SLIDING = 0, PS_V4_CSA = 1, PS_V4_HCA = 2 } ps_v4_attn_type;
typedef enum { PS_V4_MOE = 0, PS_V4_HASH_MOE = 1 } ps_v4_mlp_type;
typedef enum { PS_V4_SCORE_SQRTSOFTPLUS = 0, PS_V4_SCORE_SIGMOID = 1 } ps_v4_scoring;

/* One rotary embedding ("main": sliding layers; "compress": CSA/HCA layers, their compressors and the
 * indexer). */
typedef struct {
    double theta;
    int yarn;                   /* 0: plain RoPE */
    double factor, original_max, beta_fast, beta_slow;
    int truncate;
    double attention_factor;    /* cos/sin are multiplied by it (1 for plain RoPE) */
} ps_v4_rope_cfg;

typedef struct {
    int64_t vocab_size, hidden_size, n_layers, n_heads, head_dim, rope_dim, q_lora_rank, o_groups, o_lora_rank;
    int64_t sliding_window, max_position_embeddings;
    int64_t index_n_heads, index_head_dim, index_topk;
    int64_t hc_mult, hc_sinkhorn_iters;
    double hc_eps, rms_eps;
    int64_t n_routed_experts, n_shared_experts, experts_per_tok, moe_inter;
    double routed_scaling_factor, swiglu_limit;
    ps_v4_scoring scoring;
    int tie_embeddings;
    ps_v4_attn_type attn_type[PS_V4_MAX_LAYERS];
    int64_t compress_rate[PS_V4_MAX_LAYERS]; /* m of the layer (0 for sliding layers) */
    ps_v4_mlp_type mlp_type[PS_V4_MAX_LAYERS];
    ps_v4_rope_cfg rope_main, rope_compress;
    int config_form;            /* bit 0: HF keys seen, bit 1: hub keys seen (for `info`) */
} ps_v4_config;

/* Does this parsed JSON text look like a DeepSeek-V4 config? (model_type "deepseek_v4", an
 * architectures entry "DeepseekV4ForCausalLM", or hc_mult together with compress_ratios /
 * compress_rates / layer_types.) Malformed JSON: 0. */
int ps_v4_config_detect(const char *json_text, size_t len);
/* The same for a config.json file (0 when it cannot be read). */
int ps_v4_config_detect_file(const char *path);

/* Parse and validate; `source` names the file in errors. */
int ps_v4_config_parse(const char *json_text, size_t len, const char *source, ps_v4_config *out, ps_error *err);
int ps_v4_config_load(const char *path, ps_v4_config *out, ps_error *err);
int ps_v4_config_validate(const ps_v4_config *c, const char *source, ps_error *err);

/* Rotary frequencies of r: inv_freq[rope_dim / 2] (double), and the factor cos/sin are scaled by. */
void ps_v4_rope_inv_freq(const ps_v4_rope_cfg *r, int64_t rope_dim, double *inv_freq);

const char *ps_v4_attn_type_name(ps_v4_attn_type t);   /* "sliding_attention", ... */
/* Number of complete compression windows in T tokens for layer l (0 for sliding layers). */
int64_t ps_v4_n_windows(const ps_v4_config *c, int l, int64_t T);

/* Knockout targets (core/ko_targets.c; mean replacement over the prompts of the same shift, position by
 * position):
 *   heads       layers.L.attn.q, one query head at a time (cells: layer x head)
 *   compressed  layers.L.attn.compressor.kv, the layer's compressed entries (CSA / HCA layers)
 *   raw         layers.L.attn.kv, the layer's raw K=V entries
 *   indexer     layers.L.attn.indexer.topk replaced by the mean-pattern choice: the top-k of the
 *               indexer's scores averaged over the prompts (visible entries, ties to the lower index)
 *   sink        layers.L.attn.sink, every head's sink mass */
typedef enum { PS_V4KO_HEADS = 0, PS_V4KO_COMPRESSED, PS_V4KO_RAW, PS_V4KO_INDEXER, PS_V4KO_SINK } ps_v4_ko_target;
extern const char *const ps_v4_ko_targets[]; /* names, NULL-terminated */
/* Whether layer l has what the target (a ps_v4_ko_target) replaces. */
int ps_v4_ko_layer_ok(const ps_v4_config *c, int l, int target);
/* The mean-pattern choice of the indexer: for every query row t of mean scores [T, nW], the top K of its
 * visible entries (w < (t + 1) / m) by score, ties to the lower index, -1 past the visible ones. */
void ps_v4_mean_topk(const double *mean_scores, int64_t T, int64_t nW, int64_t K, int64_t m, float *topk);

#endif
