/* v4_kvcache.h — DeepSeek-V4's KV cache at inference (issue 36; SPEC-v4.md "The computation"): sequences
 * of a V4 checkpoint that grow by appends, each append returning the logits of the new positions, equal to
 * the whole-sequence ps_v4_forward at those positions up to float rounding (tests/test_v4_kvcache.c). It is
 * the DeepSeek-V4 family's cache table (ps_v4_kvcache_ops, in its family table: ps_kvcache_create_rt on a
 * DeepSeek-V4 runtime creates it and every ps_kvcache_* call comes here through kv->ops; its state is kv->impl),
 * so generate and serve drive it as they drive the controlled model's.
 *
 * Only the attention carries anything from one position to the next (the mHC streams, the norms and the
 * MoE are per position), so a sequence keeps, per layer, in ps_kv_seq's lists (docs/kvcache.md):
 *   k   the raw K = V rows of the sliding window: the last sliding_window - 1 positions [*, Dh];
 *   ln  (CSA / HCA) the compressor's open windows: its kv and gate rows (x·wkv^T | x·wgate^T, before ape) of
 *       the last 2m - 1 (CSA) or m - 1 (HCA) positions [*, 2·c·Dh];
 *   v   (CSA) the same for the indexer's compressor [*, 2·2·Di];
 *   ck[0] (CSA / HCA) the compressed entries as attended (normed, roped at w·m) [n_w, Dh]: one per m tokens;
 *   cv[0] (CSA) the indexer's keys [n_w, Di].
 * The sliding rows go in pages of PS_KV_SLIDE_ROWS that are freed as they leave the window (plus
 * opts.history positions kept for ps_kvcache_truncate), the entries in pages of PS_KV_PAGE_ROWS; fork shares
 * every page (copy on write). Bytes per token in the long run: Σ over CSA/HCA layers (Dh + [CSA] Di)·4 / m;
 * fixed: per layer (W - 1)·Dh·4 and the open windows' rows (`phasescope info` prints both).
 *
 * An append runs each sequence's new tokens in pieces of at most opts.chunk tokens through the layers
 * (ps_v4_hc_site and ps_v4_moe of the forward on the piece's rows; the attention here): within a piece, the
 * raw rows and the compressor rows enter the sequence first, the windows that close in the piece are pooled
 * (in position order), then every query of the piece attends to the raw window, and to the HCA entries it
 * sees or the CSA entries the indexer selects among the ones it sees ((t + 1) / m of them), the indexer's
 * top-k recomputed per query over the entries existing at the piece's end (those it cannot see are not
 * candidates), with the forward's kernels and tie rule (higher score, then lower index). The sequences of
 * an append run one after the other (a decode step of several sequences is several one-row pieces). An
 * append that fails (a hook's error, no memory) keeps what ran before the failing piece: ps_kvcache_len
 * says how far each sequence got, and the failing piece leaves nothing behind.
 *
 * Hooks during an append: the V4 hook names (core/v4/v4_hooks.h), fired per sequence and per piece with T
 * the piece's tokens ([1, T, ...]); the compressor and indexer-compressor points fire when a window closes,
 * one entry at a time ([1, 1, S, d] / [1, 1, d]; ps_kvcache_event gives the entry index); indexer.scores
 * [1, T, n] over the n entries existing at the piece's end, indexer.topk [1, T, min(index_topk, n)].
 * attn.bias / attn.logits / attn.pattern are not available during an append (an error).
 *
 * The cache as hook points: layers.{L}.attn.cache_kv (the compressed entries, value 0) and
 * layers.{L}.attn.cache_ik (the indexer's keys, value 1; CSA layers), one head (g = 0): read with
 * ps_kvcache_entry, zeroed or set (mean replacement) with ps_kvcache_edit, as for the controlled model. */
#ifndef PS_V4_KVCACHE_H
#define PS_V4_KVCACHE_H

#include <stdbool.h>
#include <stdint.h>

#include "core/error.h"
#include "core/hooks.h"
#include "core/kvcache.h"
#include "core/v4/v4_forward.h"
#include "core/v4/v4_model.h"

struct ps_v4_kvcache {
    ps_v4_model *m;
    ps_v4_acts a;          /* one piece's activations: B = 1, T = opts.chunk (a.T is set to the piece's tokens) */
    int64_t half;          /* rope_dim / 2 */
    double inv_main[PS_V4_MAX_HALF_ROPE], inv_comp[PS_V4_MAX_HALF_ROPE];
    /* the step's buffers: one buffer of the model's context (`scratch`), every fixed one below a piece of it */
    float *scratch;
    int64_t scratch_floats;
    float *cos_m, *sin_m, *cos_c, *sin_c; /* [chunk, half]: the piece's positions, main and compress rope */
    float *ecos, *esin;    /* [half]: one entry's position (compress rope) */
    float *gate, *alpha;   /* one closing window: [S_max, d_max] */
    float *pooled, *ent;   /* [d_max] */
    float *row;            /* one open-window row [2·2·d_max] */
    float *topk, *gap;     /* [chunk, index_topk], [chunk] */
    float *ik, *scores;    /* buffers of the context (grown): the indexer keys gathered [n, Di], the piece's scores [chunk, n] */
    int64_t ik_cap, sc_cap;
    /* host arrays */
    float *hcos_m, *hsin_m, *hcos_c, *hsin_c, *hecos, *hesin; /* the RoPE rows computed on the host (a host-visible
                                                               * context: the buffers above themselves) */
    float *hscratch;       /* their allocation on a device context */
    float *host_idx;       /* a hooked indexer.topk's check [chunk·index_topk] */
    int32_t *tok;          /* the piece's tokens [chunk] */
    int64_t *rows;         /* 0, 1, …: the rows of the indexer keys' gather (grown) */
    int64_t rows_cap;
};

/* A DeepSeek-V4 cache on kv for model m (loaded, on any backend: its pages and step buffers are buffers of the
 * model's context, and every step that reads them is a backend op — ps_v4_kv_attend, ps_v4_kv_slots,
 * ps_kv_slot_pool, ps_kv_gather; docs/kvcache.md "Backends"). */
int ps_v4_kvcache_create(ps_kvcache *kv, ps_v4_model *m, const ps_kvcache_opts *o, ps_error *err);

/* Bytes per token the cache grows by in the long run (the compressed entries and the indexer's keys, float32),
 * and the fixed part (the sliding window's raw rows and the open windows' compressor rows, before page
 * rounding), as `phasescope info` states them. */
double ps_v4_kvcache_bytes_per_token(const ps_v4_config *c);
double ps_v4_kvcache_fixed_bytes(const ps_v4_config *c);

/* Parse "layers.{L}.attn.cache_kv" (value 0) / "layers.{L}.attn.cache_ik" (value 1, CSA layers). */
int ps_v4_kvcache_point_parse(const ps_v4_config *c, const char *name, int *layer, int *value, ps_error *err);

/* The cache's table (core/kvcache.h), and its functions (kv->impl a struct ps_v4_kvcache). */
extern const ps_kvcache_ops ps_v4_kvcache_ops;
void ps_v4_kvcache_free(ps_kvcache *kv);
int ps_v4_kvcache_add(ps_kvcache *kv, ps_error *err);
int ps_v4_kvcache_fork(ps_kvcache *kv, int src, ps_error *err);
void ps_v4_kvcache_drop(ps_kvcache *kv, int seq);
int ps_v4_kvcache_truncate(ps_kvcache *kv, int seq, int64_t T, ps_error *err);
int ps_v4_kvcache_append(ps_kvcache *kv, int n_seq, const int *seqs, const int64_t *n, const int32_t *tokens,
                         const ps_hooks *hooks, float *logits, bool last_only, ps_error *err);
int64_t ps_v4_kvcache_n_entries(const ps_kvcache *kv, int seq, int l, int g);
int ps_v4_kvcache_entry(const ps_kvcache *kv, int seq, int l, int g, int value, int64_t j, float *out, ps_error *err);
int ps_v4_kvcache_edit(ps_kvcache *kv, int seq, int l, int g, int value, int64_t j, ps_kv_edit_kind kind, const float *vec,
                       ps_error *err);
int64_t ps_v4_kvcache_bytes(const ps_kvcache *kv);
int64_t ps_v4_kvcache_max_len(const ps_kvcache *kv); /* max_position_embeddings */
int64_t ps_v4_kvcache_vocab(const ps_kvcache *kv);

#endif
