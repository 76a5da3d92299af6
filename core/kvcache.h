/* kvcache.h — the inference-time KV cache of the controlled model (SPEC §2; issue 36): sequences that grow
 * by appends (a prompt is one long append, a decode step an append of one token), each append returning the
 * logits of the new positions, equal to the whole-sequence ps_forward at those positions up to float
 * rounding (tests/test_kvcache.c).
 *
 * What one sequence keeps, per layer (docs/kvcache.md):
 *   full attention: the raw keys and values of every position (k, v: [T, nkv, hd]);
 *   compressed: per KV head g, the compressed key and value of every window (or content chunk) that has
 *     ended (ck, cv: [n_g, hd]; n_g grows by one every S tokens), as attended (after norm and RoPE), plus
 *     the raw keys and values of the last local_window - 1 positions (the next query's local window) and
 *     the RMSNorm'd layer input of the last W - 1 positions (the compressor's open window, pooled when its
 *     last token arrives);
 *   channel attention: the K = V rows of the sliding window, one entry per `rate` tokens, and the compressor's
 *     kv and gate rows of the last 2m - 1 (CSA) or m - 1 (HCA) positions;
 *   content chunks: also the chunk ends (shared by every layer and head) and the last token (the boundary
 *     hash reads the pair (x[t-1], x[t]));
 *   select (InfLLM-v2 block selection, core/select.h): the raw keys and values of every position, and the
 *     level-1 (K every S) and level-2 (4K every 4S) pooled keys of every complete window, each pooled when its
 *     last token arrives (k1, k2). A row scores the N1 level-1 keys it sees (stage 1), picks its blocks and
 *     attends to the selected blocks' raw keys only: a decode step costs O(N1 + (topk + local_blocks)·block)
 *     per KV head. The append's final length L decides dense or sparse for all its rows, as ps_forward over L
 *     tokens does (dense_len): a generation that crosses dense_len keeps the rows its dense appends computed
 *     (docs/kvcache.md "Select models"). Hooks hook_ck / hook_ck2 fire per window as it is pooled ([1, 1,
 *     nkv, hd]), hook_select_scores / hook_block_scores / hook_blocks per piece ([1, T, nkv, *]), all on the
 *     sparse path only; the cache has no cache_ck / cache_cv points. CPU backend only.
 * Every growing array is a list of pages of PS_KV_PAGE_ROWS rows (PS_KV_SLIDE_ROWS for what slides) allocated as the sequence grows (never a
 * T_max-sized buffer); rows that fall out of the window are freed a page at a time. Pages are reference
 * counted: ps_kvcache_fork shares every page of its source and copies one only when either sequence writes
 * into it (copy on write), so a shared prefix is stored once.
 *
 * Kinds: full; compressed W/S (S <= W: overlapping windows too), learned or uniform gates, per-offset or
 * shared payloads, with or without RoPE and qk-norm; staggered grids (attention.head_offsets: each KV
 * head's windows on its own grid); content-defined chunks (attention.boundaries "content"); the channel
 * attention (attention.kind "v4": one K = V head, a sliding window of local_window raw rows, one entry per
 * `rate` tokens pooled per channel over m (HCA) or 2m (CSA) slots, a sink per head; what the sequence keeps
 * of the open windows is the compressor's kv and gate rows, and its entries are cache_ck only).
 * The functions below are the same for every family: each goes through the cache's table (ps_kvcache_ops, kv->ops),
 * which the family supplies in its family table (core/runtime.h: ps_family.kvcache; NULL: the family has no cache,
 * and generate and serve say so). This file implements the controlled model's (ps_kvcache_model_ops); DeepSeek-V4's
 * is core/v4/v4_kvcache.h (its layout and cache points are described there); MiniCPM4's is core/minicpm/minicpm_family.c
 * (one ps_minicpm_cache per sequence, its cache point blocks.{l}.attn.cache_ck read-only: docs/minicpm.md); a family defined outside the library
 * brings its own (tests/toy_family.c). A family's own state hangs on kv->impl.
 *
 * Backend: any (docs/kvcache.md "Backends"): the pages and step buffers are buffers of the model's context;
 * the matrix products and norms go through the backend's ops, and so do the attention of the new rows
 * (ps_kv_attend over the page tables: blocked over a gathered frame on the CPU for a long piece,
 * PS_KV_BLOCKED_MIN rows, per row otherwise — a decode step; and the reference: opts.plain_attention) and
 * the compressor of a closing window (ps_kv_gate, ps_kv_pool; the channel attention: ps_kv_attend_sink,
 * ps_kv_slots, ps_kv_slot_pool).
 *
 * Hooks during an append fire with the same names as in ps_forward, per sequence of the batch and per
 * piece of at most `chunk` tokens: T is the piece's tokens ([1, T, ...]); attn.hook_gate_k/gate_v/ck/cv
 * fire when a window closes, one entry at a time ([1, 1, n_kv, W] / [1, 1, n_kv, hd]; heads whose grid
 * has no entry closing there are 0 and ignored), and ps_kvcache_event() says which sequence, position and
 * entry index the firing belongs to. attn.hook_pattern is not available during an append (an error).
 *
 * The cache as hook points of its own, blocks.{l}.attn.cache_ck / cache_cv: ps_kvcache_entry reads an
 * entry of a sequence; ps_kvcache_edit sets (mean replacement: the mean given) or zeroes entry j of KV head
 * g of layer l, now when it exists and when it is made otherwise, for the rest of the cache's life (every
 * sequence, or one). */
#ifndef PS_KVCACHE_H
#define PS_KVCACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "core/hooks.h"
#include "core/backend.h"
#include "core/model.h"

#define PS_KV_PAGE_ROWS 64 /* rows per page of what grows with the sequence */
#define PS_KV_SLIDE_ROWS 8 /* rows per page of what slides with it (local window, open windows) */

/* A list of pages of rows (width floats each): row i lives in page (i - base) / page_rows of the
 * rows still held (rows < base were dropped from the front, whole pages at a time). */
typedef struct {
    float **data;  /* [cap_pages]: the pages' buffers, in order (the page table the backend's kv ops read) */
    int **refs;    /* [cap_pages]: a shared page's count of holders (NULL: the list's alone); NULL until a fork */
    int64_t n_pages, cap_pages;
    int64_t base;  /* first row held (a multiple of PS_KV_PAGE_ROWS) */
    int64_t rows;  /* rows pushed so far (base included) */
    int64_t width; /* floats per row */
    int64_t page_rows;
    int host;      /* pages in host memory (what the host reads: tokens, chunk ends); else the backend's buffers */
} ps_kv_rows;

typedef struct {
    ps_kv_rows k, v;   /* raw keys (after norm, RoPE) and values [*, nkv*hd] */
    ps_kv_rows ln;     /* compressed: the RMSNorm'd layer input [*, d] (the open windows) */
    ps_kv_rows *ck, *cv; /* compressed: per KV head, [n_g, hd] */
    ps_kv_rows *k1, *k2; /* select: the level-1 and level-2 pooled keys of every complete window [N, nkv*hd] (one
                          * allocation of two lists, k2 = k1 + 1; NULL on the other kinds) */
} ps_kv_layer;

typedef struct {
    bool live;
    int64_t T;          /* tokens so far */
    ps_kv_layer *layers; /* [n_layers] */
    ps_kv_rows tok;     /* content chunks: the tokens (one float slot each, int32 bits) */
    ps_kv_rows cend;    /* content chunks: end position of every chunk so far (int64 in two floats) */
    int64_t chunk_start; /* content chunks: start of the open chunk */
} ps_kv_seq;

typedef enum { PS_KV_EDIT_ZERO = 1, PS_KV_EDIT_SET } ps_kv_edit_kind;
typedef struct {
    int layer, head;
    int value;         /* 0: cache_ck, 1: cache_cv */
    int64_t entry;     /* j */
    int seq;           /* a sequence id, or -1: every sequence */
    ps_kv_edit_kind kind;
    float *vec;        /* SET: [hd] (owned) */
} ps_kv_edit;

/* What the hook firing in progress belongs to (ps_kvcache_event). */
typedef struct {
    int seq;        /* the sequence id */
    int64_t t0;     /* first position of the rows fired (a piece), or the closing position of an entry */
    int64_t entry;  /* attn.hook_gate_* / hook_ck / hook_cv: the entry index j; -1 otherwise */
} ps_kv_event;

typedef struct {
    int64_t chunk;   /* rows run through the layers at once (all sequences of an append together) */
    int64_t history; /* positions kept beyond the windows, so ps_kvcache_truncate can go back that far */
    int plain_attention; /* 1: every appended row attends alone (the per-row reference), also in a long append */
} ps_kvcache_opts;

struct ps_kvcache_ops;
/* A sequence's piece of an append of at least this many rows attends blocked (every grid kind: per KV
 * head, the entries and the raw rows the piece reaches gathered once into a transposed frame, each row's
 * scores and weighted sums vectorised along it); shorter pieces (a decode step) and the channel attention
 * run per row. */
#define PS_KV_BLOCKED_MIN 16

typedef struct ps_kvcache {
    const struct ps_kvcache_ops *ops; /* the family's cache (below) */
    const ps_model *m;       /* the controlled model's cache: its model (NULL for another family's) */
    void *impl;              /* another family's cache: its state (DeepSeek-V4: struct ps_v4_kvcache) */
    ps_ctx *ctx;
    ps_kvcache_opts o;
    int n_seq, cap_seq;
    ps_kv_seq *seqs;
    int n_edits;
    ps_kv_edit *edits;
    int64_t page_bytes_live;  /* bytes of pages alive now (each shared page once) */
    int64_t page_bytes_peak;
    int64_t n_page_copies;    /* copy-on-write copies made */
    ps_kv_event ev;
    /* one step's working set (chunk rows): buffers of ctx (one allocation, `scratch`) */
    float *ecos, *esin;      /* RoPE of one compressed entry [hd/2] each */
    float *ckv, *cz, *calpha; /* channel attention: the compressor's kv and gate rows [chunk, c*hd], slots [2, S, hd] */
    float *x, *ln1, *q, *kk, *vv, *rstd, *z, *attn_out, *mid, *ln2, *g, *u, *h, *mlp_out, *logit_rows, *cos_t, *sin_t;
    float *ent;              /* one closing position's entries: gates [2, nkv, W], pooled ck, cv [2, nkv*hd], a row */
    float *scratch;          /* every buffer above is a piece of this allocation */
    int64_t scratch_floats;
    /* host arrays */
    float *hecos, *hesin, *hcos_t, *hsin_t; /* the RoPE rows computed on the host (host-visible: ecos, … themselves) */
    float *hscratch;         /* their allocation on a device context */
    int64_t *nvis;           /* [chunk, nkv]: entries each row's query sees */
    int64_t *cstart;         /* [2, nkv]: start and length of the entry each KV head closes at a position */
    ps_kv_pages *ckp;        /* [2, nkv]: the page tables of ck and cv handed to kv_attend */
    int64_t n_blocked;       /* pieces (per layer) that attended blocked so far; the rest per row */
    int64_t *ev_t, *ev_start, *ev_len, *ev_rows; /* a long piece's closing windows: end, start, length; rows [ev_cap] each */
    int64_t ev_cap;
    float *ev_pay;           /* (a buffer) their payloads [n, 2, W, nkv*hd], then one offset's inputs [n, d] and products [n, nkv*hd] */
    int64_t ev_pay_cap;
    float *sel;              /* select: a piece's host working set (pooled-key frames, P, block scores, blocks, gathered keys) */
    int64_t sel_cap;         /* its floats (grown as sequences grow) */
} ps_kvcache;

/* A family's KV cache: what every ps_kvcache_* function below does on it. create fills kv (zeroed by the caller)
 * for the opened checkpoint rt and sets kv->ops; the rest are the functions below with the same names.
 * point_parse / point_name: the cache's hook points (their names: "blocks.{l}.attn.cache_ck", ...);
 * max_len_name: what bounds a sequence, as the config names it; edit_form: how an edit is written
 * ("blocks.L.attn.cache_ck:HEAD:ENTRY:zero|mean (or cache_cv)"); one_head: for a cache whose entries have one
 * head, why (the message for another head; NULL: heads are KV heads). */
struct ps_runtime;
typedef struct ps_kvcache_ops {
    const char *name;
    int (*create)(ps_kvcache *kv, const struct ps_runtime *rt, const ps_kvcache_opts *o, ps_error *err);
    void (*free)(ps_kvcache *kv);
    int (*add)(ps_kvcache *kv, ps_error *err);
    int (*fork)(ps_kvcache *kv, int src, ps_error *err);
    void (*drop)(ps_kvcache *kv, int seq);
    int (*truncate)(ps_kvcache *kv, int seq, int64_t T, ps_error *err);
    int (*append)(ps_kvcache *kv, int n_seq, const int *seqs, const int64_t *n, const int32_t *tokens, const ps_hooks *hooks,
                  float *logits, bool last_only, ps_error *err);
    int64_t (*n_entries)(const ps_kvcache *kv, int seq, int l, int g);
    int (*entry)(const ps_kvcache *kv, int seq, int l, int g, int value, int64_t j, float *out, ps_error *err);
    int (*edit)(ps_kvcache *kv, int seq, int l, int g, int value, int64_t j, ps_kv_edit_kind kind, const float *vec, ps_error *err);
    int64_t (*bytes)(const ps_kvcache *kv);
    int (*point_parse)(const ps_kvcache *kv, const char *name, int *layer, int *value, ps_error *err);
    void (*point_name)(const ps_kvcache *kv, int layer, int value, char *buf, size_t n);
    int64_t (*vocab)(const ps_kvcache *kv);
    int64_t (*max_len)(const ps_kvcache *kv);
    int64_t (*entry_heads)(const ps_kvcache *kv);
    int64_t (*entry_width)(const ps_kvcache *kv, int l, int value);
    /* a sequence's length (NULL: kv->seqs[seq].T) */
    int64_t (*len)(const ps_kvcache *kv, int seq);
    const char *max_len_name, *edit_form, *one_head;
} ps_kvcache_ops;

/* The controlled model's cache (this file). */
extern const ps_kvcache_ops ps_kvcache_model_ops;

/* Bytes per token the cache grows by in the long run, as `phasescope info` states it (float32): full
 * attention n_layers·2·nkv·hd·4; compressed that over S (content chunks: over E[chunk length]); select the
 * full attention's plus the pooled keys, n_layers·nkv·hd·4·(1/S + 1/(4S)). */
double ps_kvcache_bytes_per_token(const ps_config *c);
/* The select kind's cache bytes per token over full attention's at stride S: the raw keys and values of
 * every token plus a pooled key every S (level 1) and every 4S tokens (level 2). */
double ps_select_kv_factor(int64_t stride);
/* The fixed part: the raw local window (local_window rows of k and v per layer) and the open windows'
 * layer inputs (W - 1 rows of d per layer), before page rounding; 0 for full attention and select. */
double ps_kvcache_fixed_bytes(const ps_config *c);

int ps_kvcache_create(ps_kvcache *kv, const ps_model *m, const ps_kvcache_opts *o, ps_error *err);
/* The same for an opened checkpoint of any family (core/runtime.h): its family table's cache (ps_family.kvcache)
 * creates it; a family without one fails with a message naming the family. */
int ps_kvcache_create_rt(ps_kvcache *kv, const struct ps_runtime *rt, const ps_kvcache_opts *o, ps_error *err);
void ps_kvcache_free(ps_kvcache *kv);

/* A new empty sequence: its id (>= 0), or -1 with err. */
int ps_kvcache_add(ps_kvcache *kv, ps_error *err);
/* A new sequence sharing everything of sequence src (copy on write): its id, or -1. */
int ps_kvcache_fork(ps_kvcache *kv, int src, ps_error *err);
/* Drop a sequence and its pages (its id may be reused by a later add). */
void ps_kvcache_drop(ps_kvcache *kv, int seq);
/* Cut sequence seq back to its first T tokens (T <= its length). Possible while the cache still holds
 * what position T needs: back by at most opts.history tokens for a compressed model (full attention and
 * select: any T; select drops the pooled keys of the windows that no longer complete). */
int ps_kvcache_truncate(ps_kvcache *kv, int seq, int64_t T, ps_error *err);
static inline int64_t ps_kvcache_len(const ps_kvcache *kv, int seq) { return kv->ops && kv->ops->len ? kv->ops->len(kv, seq) : kv->seqs[seq].T; }

/* Append n[i] tokens (concatenated in `tokens`, sequence by sequence) to sequences seqs[0..n_seq) (ids
 * distinct) and run them. logits: [Σ n[i], V] on the host (every new position, in the same order) when
 * last_only is false, else [n_seq, V] (each sequence's last new position); NULL for none. */
int ps_kvcache_append(ps_kvcache *kv, int n_seq, const int *seqs, const int64_t *n, const int32_t *tokens,
                      const ps_hooks *hooks, float *logits, bool last_only, ps_error *err);

/* The hook firing in progress (valid inside a hook callback during ps_kvcache_append). */
static inline const ps_kv_event *ps_kvcache_event(const ps_kvcache *kv) { return &kv->ev; }

/* Entries of layer l, KV head g held by a sequence (compressed models). */
int64_t ps_kvcache_n_entries(const ps_kvcache *kv, int seq, int l, int g);
/* Copy entry j of layer l, KV head g (value 0: cache_ck, 1: cache_cv) into out[hd]. */
int ps_kvcache_entry(const ps_kvcache *kv, int seq, int l, int g, int value, int64_t j, float *out, ps_error *err);
/* Edit entry j of (layer l, KV head g, ck or cv) of sequence seq (-1: every sequence, now and later):
 * ZERO, or SET to vec[hd] (mean replacement with the mean given). Applied now to the entries that exist
 * and, for the rest of the cache's life, to that entry when a window closes. */
int ps_kvcache_edit(ps_kvcache *kv, int seq, int l, int g, int value, int64_t j, ps_kv_edit_kind kind, const float *vec,
                    ps_error *err);
/* Parse "blocks.{l}.attn.cache_ck" / "cache_cv" into layer and value (0/1). */
int ps_kvcache_point_parse(const ps_config *c, const char *name, int *layer, int *value, ps_error *err);

/* The same for any family's cache (its table's: the controlled model's points above, DeepSeek-V4's
 * layers.{L}.attn.cache_kv / cache_ik: core/v4/v4_kvcache.h); and the point's name. */
int ps_kvcache_point_parse_kv(const ps_kvcache *kv, const char *name, int *layer, int *value, ps_error *err);
void ps_kvcache_point_name(const ps_kvcache *kv, int layer, int value, char *buf, size_t n);
/* The cache's model: its vocabulary, the longest sequence it takes, the KV heads of its entries (0: none)
 * and the floats of one entry of layer l's point `value`. */
int64_t ps_kvcache_vocab(const ps_kvcache *kv);
int64_t ps_kvcache_max_len(const ps_kvcache *kv);
int64_t ps_kvcache_entry_heads(const ps_kvcache *kv);
int64_t ps_kvcache_entry_width(const ps_kvcache *kv, int l, int value);

/* Bytes the cache holds now: pages (each shared page once) and the tables. */
int64_t ps_kvcache_bytes(const ps_kvcache *kv);

/* The page lists, for the other families' caches (core/v4/v4_kvcache.c): pages are counted in kv's
 * page_bytes_live / page_bytes_peak / n_page_copies. init: an empty list of rows of `width` floats in
 * pages of page_rows; at: row i (base <= i < rows); mut: row i made private (copy on write; NULL when out
 * of memory); push: one row at the end; drop_front: free the whole pages before row `from`; truncate: keep
 * rows [base, n); fork: dst shares src's pages. */
void ps_kv_rows_init(ps_kv_rows *r, int64_t width, int64_t page_rows);
void ps_kv_rows_free(ps_kvcache *kv, ps_kv_rows *r);
const float *ps_kv_rows_at(const ps_kv_rows *r, int64_t i);
float *ps_kv_rows_mut(ps_kvcache *kv, ps_kv_rows *r, int64_t i);
int ps_kv_rows_push(ps_kvcache *kv, ps_kv_rows *r, const float *row);
void ps_kv_rows_drop_front(ps_kvcache *kv, ps_kv_rows *r, int64_t from);
void ps_kv_rows_truncate(ps_kvcache *kv, ps_kv_rows *r, int64_t n);
int ps_kv_rows_fork(ps_kv_rows *dst, ps_kv_rows *src);

/* What both families' caches share beside the pages: ps_kvcache_seq, a live sequence (NULL and a message
 * naming it otherwise); ps_kvcache_edit_push, checks an edit of entry j (d floats; `point` names the cache
 * point in messages, e.g. "blocks.3.attn.cache_ck") and records it for the rest of the cache's life (the
 * recorded edit, NULL and err otherwise); ps_kvcache_edit_apply writes it into a row of d floats. */
ps_kv_seq *ps_kvcache_seq(ps_kvcache *kv, int seq, ps_error *err);
const ps_kv_edit *ps_kvcache_edit_push(ps_kvcache *kv, int seq, int l, int g, int value, int64_t j, ps_kv_edit_kind kind,
                                       const float *vec, int64_t d, const char *point, ps_error *err);
void ps_kvcache_edit_apply(const ps_kv_edit *e, float *row, int64_t d);
/* An append's request, for every family: live sequences, each once, no negative counts, lengths within the
 * model's (max_seq_len / max_position_embeddings), tokens in its vocabulary. 0 or -1 and err. */
int ps_kvcache_check_request(ps_kvcache *kv, int n_seq, const int *seqs, const int64_t *n, const int32_t *tokens, ps_error *err);

#endif
