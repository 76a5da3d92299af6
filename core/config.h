/* config.h — the model configuration (SPEC §2): parsing config.json (phasescope's own schema or a
 * Hugging Face Qwen3 config), validation with one-line errors naming the key and the file, writing it
 * back, and a stable hash used in result provenance. */
#ifndef PS_CONFIG_H
#define PS_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#include "core/error.h"
#include "core/select.h"

/* PS_ATTN_CHANNEL: DeepSeek-V4's compressor as an attention variant of this model (docs/training.md, "The v4
 * attention"): one K=V head, a per-channel gate softmax over window slots with a learned position bias,
 * CSA's two overlapping half-window series or HCA's plain windows, a sliding raw window and a per-head
 * attention sink. */
/* PS_ATTN_SELECT: InfLLM-v2 block-sparse selection (core/select.h, docs/models.md "The select attention"): full
 * attention's parameters; each query attends the raw keys of the blocks its KV head selects from mean-pooled
 * compressed keys (window W = kernel, stride S), the initial and local blocks always among them. */
typedef enum { PS_ATTN_FULL = 0, PS_ATTN_COMPRESSED = 1, PS_ATTN_CHANNEL = 2, PS_ATTN_SELECT = 3 } ps_attn_kind;
typedef enum { PS_V4_MODE_CSA = 0, PS_V4_MODE_HCA = 1 } ps_v4_mode;
typedef enum { PS_GATE_LEARNED = 0, PS_GATE_UNIFORM = 1 } ps_gate_kind;
typedef enum { PS_PAYLOAD_PER_OFFSET = 0, PS_PAYLOAD_SHARED = 1 } ps_payload_kind;
/* Where compressed windows start (docs/mitigations.md §4): the fixed grid of SPEC §2, or content-defined
 * chunks (core/chunks.h). */
typedef enum { PS_BOUNDARIES_GRID = 0, PS_BOUNDARIES_CONTENT = 1 } ps_boundaries;

/* Most KV heads whose window grids may be offset (attention.head_offsets). */
#define PS_MAX_GRID_HEADS 256
/* Most (layer, KV head) offsets of a per-layer grid (attention.head_offsets "staggered_layers" or a
 * [n_layers][n_kv_heads] list): n_layers * n_kv_heads must not exceed it. */
#define PS_MAX_GRID_OFFSETS 4096

/* Upper bound on every integer dimension; keeps all size products far from int64 overflow. */
#define PS_MAX_DIM ((int64_t)1 << 24)

typedef struct {
    int64_t vocab_size, d_model, n_layers, n_heads, n_kv_heads, head_dim, d_ff, max_seq_len;
    bool rope;
    double rope_theta;
    bool qk_norm;
    double rms_eps;
    bool tie_embeddings;
    ps_attn_kind kind;
    int64_t window;       /* W */
    int64_t stride;       /* S, 1 <= S <= W */
    int64_t local_window; /* raw tokens each query sees, >= 1 */
    ps_gate_kind gate;
    ps_payload_kind payload;
    /* Staggered grids (docs/mitigations.md): window j of KV head g covers positions j*S + head_offsets[g] + i,
     * 0 <= head_offsets[g] < S. All 0 (the default, and the base model of SPEC §2) unless
     * attention.head_offsets is given; any_head_offset says whether one is non-zero. */
    int64_t head_offsets[PS_MAX_GRID_HEADS];
    int64_t n_grid_offsets; /* entries given (per layer: must be n_kv_heads); -1 while "staggered" is unresolved */
    bool any_head_offset;   /* some offset (of any layer) is non-zero */
    /* Per-layer grids (docs/mitigations.md, "Per-layer grids"): window j of KV head g in layer l covers
     * j*S + layer_offsets[l*n_kv_heads + g] + i. n_offset_layers is n_layers when the layers' offsets differ
     * (head_offsets is then all 0 and unused), 0 when one row is shared by every layer (head_offsets holds
     * it), -1 while "staggered_layers" is unresolved. Read offsets through ps_config_grid_offset. */
    int32_t layer_offsets[PS_MAX_GRID_OFFSETS];
    int64_t n_offset_layers;
    /* Content-defined chunk boundaries (docs/mitigations.md §4; attention.boundaries "content"): chunks of
     * chunk_min .. W tokens whose ends depend on the token ids, mean length S (core/chunks.h). GRID (the
     * default) is SPEC §2; chunk_min is 0 then. */
    ps_boundaries boundaries;
    int64_t chunk_min;
    /* kind v4 (local_window above is its sliding raw window) */
    int64_t rate;         /* compression rate m: one compressed entry per m tokens */
    ps_v4_mode v4_mode;   /* csa: entries pool 2m slots (two overlapping half-window series), hca: m slots */
    /* kind select (window / stride above are the level-1 kernel and stride) */
    int64_t block;        /* tokens per block, a multiple of stride */
    int64_t topk;         /* blocks selected by score; a row attends topk + local_blocks slots */
    int64_t init_blocks;  /* blocks 0 .. init_blocks-1 always attended */
    int64_t local_blocks; /* the query's block and the local_blocks before it always attended */
    int64_t dense_len;    /* a forward over fewer tokens is ordinary causal attention (<= 0: never) */
} ps_config;

/* channel attention: slots per compressed entry (CSA 2m, HCA m) and the compressor's projection width factor
 * (CSA 2: the two series, HCA 1). */
static inline int64_t ps_config_v4_slots(const ps_config *c) { return c->v4_mode == PS_V4_MODE_CSA ? 2 * c->rate : c->rate; }
static inline int64_t ps_config_v4_series(const ps_config *c) { return c->v4_mode == PS_V4_MODE_CSA ? 2 : 1; }

/* kind select: the geometry of core/select.h (kernel = window, stride, block, initial / local blocks, topk). */
static inline ps_select_cfg ps_config_select(const ps_config *c) {
    return (ps_select_cfg){.kernel = c->window, .stride = c->stride, .block = c->block, .init_blocks = c->init_blocks,
                           .local_blocks = c->local_blocks, .topk = c->topk};
}

/* kind select: whether a forward over T tokens takes the sparse path (T >= dense_len, or dense_len <= 0). */
static inline int ps_select_sparse(const ps_config *c, int64_t T) { return c->dense_len <= 0 || T >= c->dense_len; }

/* Defaults for every optional key; the required ones are left 0. */
void ps_config_defaults(ps_config *c);

/* Parse a JSON text; `source` names the file in error messages. */
int ps_config_parse(const char *json_text, size_t len, const char *source, ps_config *out, ps_error *err);

/* Read and parse a config.json file. */
int ps_config_load(const char *path, ps_config *out, ps_error *err);

/* Check the invariants of SPEC §2 (also run by the parser). `source` names the file. */
int ps_config_validate(const ps_config *c, const char *source, ps_error *err);

/* Serialise as phasescope's own schema (pretty JSON, fixed key order). Caller frees. */
char *ps_config_to_json(const ps_config *c);

/* Write config.json atomically. */
int ps_config_save(const ps_config *c, const char *path, ps_error *err);

/* Serialise as a Hugging Face Qwen3 config (transformers 5 keys, plus rope_theta and torch_dtype for
 * 4.x readers; a compressed model adds phasescope's "attention" object). `dtype` is the weights'
 * storage ("float32", "bfloat16", "float16"). Fails (NULL) when rope or qk_norm is off. Caller frees. */
char *ps_config_to_hf_json(const ps_config *c, const char *dtype, ps_error *err);
int ps_config_save_hf(const ps_config *c, const char *dtype, const char *path, ps_error *err);

/* 16 hex digits: FNV-1a 64 over the canonical JSON of the config. */
void ps_config_hash(const ps_config *c, char out[17]);

/* Start offset of KV head g's window grid in layer l (0 unless attention.head_offsets is given). */
static inline int64_t ps_config_grid_offset(const ps_config *c, int64_t l, int64_t g) {
    if (!c->any_head_offset || g < 0 || g >= PS_MAX_GRID_HEADS) return 0;
    if (c->n_offset_layers > 0)
        return l >= 0 && l < c->n_offset_layers && g < c->n_kv_heads ? c->layer_offsets[l * c->n_kv_heads + g] : 0;
    return c->head_offsets[g];
}

/* Whether the layers' grids differ (a per-layer grid: attention.head_offsets "staggered_layers" or a 2-D list). */
static inline bool ps_config_per_layer_offsets(const ps_config *c) { return c->any_head_offset && c->n_offset_layers > 0; }

/* The multiplier k of "staggered_layers", o_{l,g} = (floor(g*S/n_kv) + l*k) mod S: the integer in [1, S) coprime
 * with S nearest (2 - phi)*S ~ 0.382*S (ties to the smaller; S = 8: k = 3; S = 1: 0). */
int64_t ps_config_layer_stagger(int64_t S);

/* Set the grid offsets of a compressed config: o [rows][n_kv_heads], rows 1 (one row for every layer) or
 * n_layers (a per-layer grid); each in [0, stride). Normalised as the parser does (identical rows become one,
 * all zero the base grid). An error names attention.head_offsets. */
int ps_config_set_grid_offsets(ps_config *c, const int64_t *o, int64_t rows, ps_error *err);

/* Number of compressed windows wholly inside a sequence of T tokens (0 for full attention). With content
 * boundaries: the most chunks a sequence of T tokens can have, floor(T / chunk_min) (the padded chunk axis). */
int64_t ps_config_n_windows(const ps_config *c, int64_t T);

#endif
