/* backend.h — what a backend provides: memory, the op table behind ops.h, the DeepSeek-V4 extension table
 * and supports(op, params); the ops named in an enum (ps_op, ps_v4_op) with a name table.
 *
 * A backend fills one ps_backend (the CPU backend: core/cpu/backend_cpu.c) and registers it in
 * core/ctx.c. Every entry of its op table (ps_backend_ops, one per ps_op) is required, and so is every
 * entry of its extension table when it has one (ps_ctx_create refuses a backend with a NULL entry, naming
 * the op); the ops a backend cannot run for some parameters it declines in supports(). Each op gets the context first, returns 0, or fails through
 * ps_ctx_fail (message naming the op and the size that failed) and returns -1. Ops may take scratch
 * from ps_ctx_workspace and must not allocate otherwise; arrays are the backend's buffers; index arrays
 * (tokens, targets, rows, AdamW segments) are host arrays. The semantics of every op are stated in
 * core/ops.h; the CPU implementation is the reference the tests compare a backend with. */
#ifndef PS_BACKEND_H
#define PS_BACKEND_H

#include <stdint.h>

#include "core/ctx.h"
#include "core/select.h"


/* Attention geometry shared by the attention ops. */
typedef struct {
    int64_t B, T, nh, nkv, hd;
    int compressed;
    int64_t W, S, LW; /* compressed only: window, stride, effective local window min(local_window, T) */
    int64_t nW;       /* compressed windows (0 for full attention) */
    int64_t ncols;    /* columns of a probability row: T (full) or nW + LW (compressed) */
    /* compressed only: window start offsets [B, nkv] (host array; NULL = all 0, the base model). Window j of
     * KV head g in sequence b covers positions j*S + woff[b*nkv + g] + i, 0 <= woff < S; it exists when it
     * fits in T, and query t sees it when j*S + woff + W - 1 <= t (staggered grids, phase augmentation:
     * docs/mitigations.md). A backend's supports() may refuse a non-NULL woff. */
    const int64_t *woff;
    /* compressed only: content-defined chunks (attention.boundaries "content", docs/mitigations.md §4):
     * cend [B, nW] (host array; NULL = windows on the grid) holds the last position of chunk j of sequence b,
     * increasing in j, INT64_MAX for a chunk the sequence does not have; query t sees chunk j when
     * cend[b*nW + j] <= t (every KV head alike). A backend's supports() may refuse it. */
    const int64_t *cend;
} ps_attn_geom;

/* One chunk of a long sequence (prefill, one sequence): Tq query rows against a key frame of Tk raw
 * rows; query row i stands at key row q_off + i; key row 0 is absolute position pos0. Compressed: the
 * first nW windows of the sequence are in the cache, and query row i sees the windows ended by its
 * absolute position and the raw rows of its local window inside the frame. Full: every key row up to
 * its own. */
typedef struct {
    int64_t nh, nkv, hd;
    int compressed;
    int64_t W, S, LW;     /* compressed: window, stride, local window (min(local_window, T) of the pass) */
    int64_t nW;           /* windows in ck/cv */
    int64_t Tq, Tk, q_off, pos0;
    /* compressed: the sequence's window grid offsets [nkv] (KV head g's window j covers jS + woff[g] + i and is
     * seen from position jS + woff[g] + W - 1 on; 0 <= woff[g] < S: staggered and per-layer grids); NULL: the
     * base grid. A host array. */
    const int64_t *woff;
} ps_attn_frame;

/* ---------------- the KV cache (core/kvcache.h) ---------------- */
/* A page list of a KV cache as its ops see it: row i (base <= i < rows) of width floats lives at
 * page[(i - base) / page_rows] + ((i - base) % page_rows) * width. page is a host array of the backend's
 * buffers (a page table, staged like the other ops' index arrays); rows before base were dropped. */
typedef struct {
    float *const *page;
    int64_t base, rows, width, page_rows;
} ps_kv_pages;

/* kv_attend: the nr query rows of one sequence at positions t0 .. t0 + nr - 1 against its cache (SPEC §2).
 * Compressed: query t, head h (KV head g = h / (nh / nkv)) sees the first nvis[i, g] entries of ck[g] / cv[g]
 * and the raw rows of its local window max(0, t - LW + 1) .. t of k, v; full attention: every raw row
 * 0 .. t. One softmax over both, scale hd^-0.5. */
typedef struct {
    int64_t nh, nkv, hd;
    int compressed;
    int64_t LW;              /* compressed: the local window */
    int64_t t0, nr;
    const int64_t *nvis;     /* compressed: [nr, nkv] (host) entries row i sees of KV head g */
    ps_kv_pages k, v;        /* raw keys and values [*, nkv*hd] holding the rows the queries reach */
    const ps_kv_pages *ck, *cv; /* compressed: [nkv] (host) entries [*, hd] per KV head, at least max nvis rows */
    int blocked;             /* a hint: the CPU gathers one transposed frame per KV head (a long piece) instead of
                              * reading the pages per row; the same function, another summation order */
} ps_kv_attn;

/* kv_gate / kv_pool: the windows that close at one position of one sequence, per KV head g: start[g], len[g]
 * (start < 0: no window of head g closes there) over the layer inputs ln [*, d] (rows start .. start+len-1). */
typedef struct {
    int64_t nkv, W, d;
    ps_kv_pages ln;
    const int64_t *start, *len; /* [nkv] (host) */
} ps_kv_close;
/* kv_slots / kv_slot_pool: the channel attention's entry of window wi (attention.kind "v4", SPEC §2) closing:
 * slot s (of m, or 2m for CSA) reads token wi*m + s (CSA: slots s < m token (wi-1)*m + s of channel block 0,
 * none for wi = 0; slots s >= m token wi*m + s - m of block hd) of the compressor's rows ln [*, 2*cw] (kv
 * [cw], then the gate logits z [cw]; cw = hd or 2*hd for CSA). */
typedef struct {
    int64_t hd, rate, cw;
    int csa;
    int64_t wi;
    ps_kv_pages ln;
} ps_kv_chan;
/* ---------------- end KV cache ---------------- */

/* Settings of one AdamW segment (a run of parameters with one learning rate and decay). */
typedef struct {
    int64_t offset, n;    /* floats into the parameter buffer */
    float lr, weight_decay;
} ps_adamw_seg;

typedef struct {
    float beta1, beta2, eps;
    float clip_scale;     /* gradients are multiplied by this first */
    float inv_bc1, inv_bc2; /* 1 / (1 - beta^t) */
} ps_adamw_hyper;

/* ---------------- DeepSeek-V4 (SPEC-v4; core/v4/) ---------------- */
/* Attention of one V4 layer: queries [B, T, H, Dh] against the raw K=V entries kv [B, T, Dh] of the
 * sliding window (raw j visible to t iff t - W < j <= t) and the compressed entries ckv [B, nW, Dh]
 * (entry w visible iff w < (t + 1) / m; CSA: only those the indexer selected, topk [B, T, K]). */
typedef struct {
    int64_t B, T, H, Dh;
    int64_t nW;   /* compressed entries per sequence (0: sliding layer) */
    int64_t K;    /* CSA: selected entries per query (topk [B, T, K], -1 = empty); 0: every visible entry */
    int64_t W;    /* sliding window */
    int64_t m;    /* compression rate (0: sliding layer) */
    float scale;  /* logit scale, Dh^-0.5 */
} ps_v4_attn_geom;

/* v4_kv_attend: the attention of one sequence's piece of n query rows at positions t0 .. t0 + n - 1 over its
 * KV cache pages (core/v4/v4_kvcache.h): query t reads the raw K = V rows max(0, t - W + 1) .. t of kv, then
 * (m > 0) its entries of ent — CSA (K > 0): the ones topk [n, K] (a buffer; -1 or an index >= nE: none)
 * lists, in its order; HCA (K = 0): the first min((t + 1) / m, nE) — with the head's sink column. */
typedef struct {
    int64_t H, Dh;   /* query heads, head dim (the one K = V head's too) */
    int64_t W;       /* sliding window */
    int64_t m;       /* compression rate (0: a sliding layer, no entries) */
    int64_t K;       /* CSA: entries selected per query (topk [n, K]); 0: every visible entry */
    int64_t nE;      /* entries held (ent's rows) */
    int64_t t0, n;   /* the queries' positions */
    float scale;     /* logit scale, Dh^-0.5 */
    ps_kv_pages kv;  /* the raw K = V rows [*, Dh], holding max(0, t0 - W + 1) .. t0 + n - 1 */
    ps_kv_pages ent; /* the compressed entries [nE, Dh] (base 0) */
} ps_v4_kv_attn;
/* ---------------- end DeepSeek-V4 ---------------- */

/* The compressor's windows as data (SPEC §2, docs/mitigations.md): a table of starts and lengths. Window j of
 * KV head g in sequence b covers positions start[e] + i, 0 <= i < len[e], of its sequence, with
 * e = (b*nW + j)*H + (H == 1 ? 0 : g): H = 1 when every KV head has the same windows (the base grid, content
 * chunks), H = nkv when each head has its own (staggered grids, phase augmentation). len[e] = 0: the window
 * is absent (its gate, payload and pooled entry are 0, no gradient flows through it; its start may lie
 * anywhere, and the RoPE of the compressed keys rotates its zero entry when the start lies in [0, T), as it
 * does every present window's); otherwise 1 <= len <= W and [start, start + len) lies in [0, T). Offsets i >= len of a window are 0 like an absent
 * one. The caller builds the table (core/windows.h: ps_windows_grid, ps_windows_chunks); host arrays.
 * S > 0 says the table is a window grid of stride S: start = j*S + o with 0 <= o < S per (sequence, head),
 * len = W where the window fits in T and 0 where it does not — a hint the backends verify before using it
 * (ps_windows_is_base_grid: the base grid's fast paths, the CPU's strided sgemm and compressor.cu). */
typedef struct {
    int64_t B, T;      /* sequences, positions per sequence */
    int64_t nW;        /* windows per sequence (entries of the compressed cache) */
    int64_t nkv, W;    /* KV heads; slots per window (the gate and payload's offsets) */
    int64_t H;         /* 1 (heads share the windows) or nkv */
    int64_t S;         /* > 0: the table is a grid of stride S (see above); 0: no such claim */
    const int64_t *start, *len; /* [B, nW, H] */
} ps_windows;

/* ---------------- block-sparse selection (InfLLM-v2; attention.kind "select"; core/select.h) ---------------- */
/* The geometry of the selection ops over B sequences (each array's leading dimension): n query rows per
 * sequence at positions pos0 .. pos0 + n - 1 against L raw keys (a whole forward: pos0 = 0, n = L = T; a
 * chunk of a prefill: pos0 = t0, L = t1), H query heads reading KV head g / (H / Hkv), head dim D; N1, N2
 * compressed keys per sequence at level 1 (windows of K every S) and level 2 (4K every 4S); nb blocks scored
 * per row (ceil(T / block) of the pass, which may exceed the blocks of L keys); sel the selection's settings
 * (slots per row: sel.topk + sel.local_blocks). */
typedef struct {
    int64_t B, n, pos0, L;
    int64_t H, Hkv, D;
    int64_t N1, N2, nb;
    ps_select_cfg sel;
} ps_sel_geom;
/* ---------------- end selection ---------------- */

/* Parameters supports() sees: the geometry of the op (NULL where the op has none of that kind). */
typedef struct {
    const ps_attn_geom *attn;   /* attention ops over a whole batch */
    const ps_attn_frame *frame; /* attn_chunk */
    const ps_windows *win;      /* the compressor ops over a window table */
    const ps_sel_geom *sel;  /* the selection ops (select_scores .. select_backward) */
} ps_op_params;

/* The core ops, in the op table's order: X(ENUM_NAME, field). ps_op's values are PS_OP_<ENUM_NAME>;
 * ps_op_name() gives the field's name. */
#define PS_CORE_OPS(X)                                                                                       \
    X(MATMUL, matmul) X(EMBED, embed) X(RMSNORM, rmsnorm) X(ROPE_TABLE, rope_table) X(ROPE, rope)             \
    X(SWIGLU, swiglu) X(ADD, add) X(COPY, copy) X(FILL, fill)                                                 \
    X(GATE, gate) X(PAYLOAD, payload) X(ROPE_WINDOWS, rope_windows) X(POOL, pool)                             \
    X(ATTN_FORWARD, attn_forward) X(ATTN_PROBS, attn_probs) X(ATTN_OUT, attn_out) X(ATTN_CHUNK, attn_chunk)    \
    X(ATTN_ROWS, attn_rows) X(PATTERN_EXPAND, pattern_expand) X(PATTERN_COMPACT, pattern_compact)             \
    X(GATHER_ROWS, gather_rows) X(SCATTER_ROWS, scatter_rows)                                                 \
    X(KV_ATTEND, kv_attend) X(KV_GATE, kv_gate) X(KV_POOL, kv_pool) X(KV_GATHER, kv_gather)                   \
    X(KV_ATTEND_SINK, kv_attend_sink) X(KV_SLOTS, kv_slots) X(KV_SLOT_POOL, kv_slot_pool)                     \
    X(SELECT_COMPRESS, select_compress) X(SELECT_SCORES, select_scores)                                       \
    X(SELECT_BLOCK_SCORES, select_block_scores) X(SELECT_TOPK, select_topk) X(SELECT_ATTN, select_attn)       \
    X(HEAD_SET, head_set) X(ADD_VECTOR, add_vector) X(ROLL_BLOCKS, roll_blocks) X(COPY_BLOCKS, copy_blocks)   \
    X(ACCUMULATE_SEQS, accumulate_seqs) X(SUM_TO_MEAN, sum_to_mean) X(DELTA_DOT, delta_dot)                   \
    X(MATMUL_BACKWARD, matmul_backward) X(EMBED_BACKWARD, embed_backward)                                     \
    X(RMSNORM_BACKWARD, rmsnorm_backward) X(ROPE_BACKWARD, rope_backward) X(SWIGLU_BACKWARD, swiglu_backward) \
    X(GATE_BACKWARD, gate_backward) X(PAYLOAD_BACKWARD, payload_backward) X(GATE_ENTROPY, gate_entropy)       \
    X(POOL_BACKWARD, pool_backward) X(ATTN_BACKWARD, attn_backward) X(SELECT_BACKWARD, select_backward)       \
    X(CROSS_ENTROPY, cross_entropy)                                                                           \
    X(SUMSQ, sumsq) X(ADAMW, adamw)

/* The DeepSeek-V4 extension ops, in the extension table's order: PS_V4_OP_<ENUM_NAME>. */
#define PS_V4_OPS(X)                                                                                          \
    X(ROPE_TABLE, v4_rope_table) X(ROPE, v4_rope) X(HC_WEIGHTS, v4_hc_weights) X(HC_COLLAPSE, v4_hc_collapse)  \
    X(HC_EXPAND, v4_hc_expand) X(COMP_SLOTS, v4_comp_slots) X(SLOT_SOFTMAX, v4_slot_softmax)                  \
    X(COMP_POOL, v4_comp_pool) X(INDEXER_SCORES, v4_indexer_scores) X(TOPK, v4_topk)                          \
    X(ROUTER_SCORES, v4_router_scores) X(ROUTE_WEIGHTS, v4_route_weights) X(SWIGLU_CLAMP, v4_swiglu_clamp)     \
    X(SCATTER_ADD_ROWS, v4_scatter_add_rows) X(ATTN, v4_attn) X(ATTN_BIAS, v4_attn_bias)                       \
    X(ATTN_LOGITS, v4_attn_logits) X(ATTN_SOFTMAX, v4_attn_softmax) X(ATTN_APPLY, v4_attn_apply)               \
    X(SINK_RESCALE, v4_sink_rescale) X(GROUPED_LINEAR, v4_grouped_linear) X(SCALE, v4_scale)                   \
    X(COMP_SLOTS_BACKWARD, v4_comp_slots_backward) X(SLOT_SOFTMAX_BACKWARD, v4_slot_softmax_backward)          \
    X(COMP_POOL_BACKWARD, v4_comp_pool_backward) X(ATTN_BACKWARD, v4_attn_backward)                          \
    X(KV_ATTEND, v4_kv_attend) X(KV_SLOTS, v4_kv_slots)

#define PS_OP_ENUM_(E, f) PS_OP_##E,
typedef enum { PS_CORE_OPS(PS_OP_ENUM_) PS_OP_COUNT } ps_op;
#undef PS_OP_ENUM_
#define PS_V4_OP_ENUM_(E, f) PS_V4_OP_##E,
typedef enum { PS_V4_OPS(PS_V4_OP_ENUM_) PS_V4_OP_COUNT } ps_v4_op;
#undef PS_V4_OP_ENUM_

/* "matmul", "gate", …; "v4_rope_table", …; NULL outside the enum (core/backend.c). */
const char *ps_op_name(ps_op op);
const char *ps_v4_op_name(ps_v4_op op);
/* The backend's entry for op / V4 op is not NULL (a V4 op: the backend has the extension table and the entry). */
int ps_backend_has_op(const ps_backend *be, ps_op op);
int ps_backend_has_v4_op(const ps_backend *be, ps_v4_op op);
/* 1 when the backend runs op with these parameters (a NULL supports() runs every op); *why (may be NULL)
 * gets the reason when it does not. */
int ps_backend_supports(const ps_backend *be, ps_op op, const ps_op_params *p, const char **why);

/* The op table every backend fills: one entry per ps_op, in PS_CORE_OPS's order (checked at compile time
 * in core/backend.c). */
typedef struct {
    /* forward */
    int (*matmul)(ps_ctx *c, float *out, const float *inp, const float *w, int64_t M, int64_t K, int64_t N, int accumulate);
    int (*embed)(ps_ctx *c, float *out, const int32_t *tok, const float *table, int64_t n_tok, int64_t C);
    int (*rmsnorm)(ps_ctx *c, float *out, float *rstd, const float *inp, const float *weight, int64_t n_rows, int64_t C,
                   float eps);
    int (*rope_table)(ps_ctx *c, float *cos_t, float *sin_t, int64_t n_pos, int64_t hd, double theta);
    int (*rope)(ps_ctx *c, float *x, const float *cos_t, const float *sin_t, int64_t n_seq, int64_t rows_per_seq,
                int64_t n_heads, int64_t hd, int64_t pos_step);
    int (*swiglu)(ps_ctx *c, float *h, const float *g, const float *u, int64_t n);
    int (*add)(ps_ctx *c, float *out, const float *a, const float *b, int64_t n);
    int (*copy)(ps_ctx *c, float *dst, const float *src, int64_t n);
    int (*fill)(ps_ctx *c, float *x, float value, int64_t n);
    /* the compressor over a window table (fixed grid, staggered grids, content chunks alike) */
    int (*gate)(ps_ctx *c, float *z, float *alpha, const float *a, const float *u, const float *bias, int64_t d,
                const ps_windows *win);
    int (*payload)(ps_ctx *c, float *P, const float *a, const float *C, int shared, float *scratch, int64_t d, int64_t hd,
                   const ps_windows *win);
    int (*rope_windows)(ps_ctx *c, float *x, const float *cos_t, const float *sin_t, int64_t hd, const ps_windows *win,
                        int inverse);
    int (*pool)(ps_ctx *c, float *out, const float *alpha, const float *P, int64_t B, int64_t nW, int64_t W, int64_t nkv,
                int64_t hd);
    int (*attn_forward)(ps_ctx *c, float *z, float *lse, const float *q, const float *k, const float *v, const float *ck,
                        const float *cv, const ps_attn_geom *g);
    int (*attn_probs)(ps_ctx *c, float *probs, const float *q, const float *k, const float *ck, const ps_attn_geom *g);
    int (*attn_out)(ps_ctx *c, float *z, const float *probs, const float *v, const float *cv, const ps_attn_geom *g);
    int (*attn_chunk)(ps_ctx *c, float *z, const float *q, const float *k, const float *v, const float *ck,
                      const float *cv, const ps_attn_frame *f);
    int (*attn_rows)(ps_ctx *c, float *z_rows, const int64_t *rows, int64_t n, const float *q, const float *k,
                     const float *v, const float *ck, const float *cv, const ps_attn_geom *g);
    int (*pattern_expand)(ps_ctx *c, float *full, const float *probs, const ps_attn_geom *g);
    int (*pattern_compact)(ps_ctx *c, float *probs, const float *full, const ps_attn_geom *g);
    int (*gather_rows)(ps_ctx *c, float *out, const float *in, const float *add, const int64_t *rows, int64_t n,
                       int64_t width);
    int (*scatter_rows)(ps_ctx *c, float *out, const float *in, const int64_t *rows, int64_t n, int64_t width);
    /* the KV cache (core/kvcache.h): attention of a piece's rows over the pages, the compressor of a closing
     * window (gates; payloads and pooling), rows of a page list */
    int (*kv_attend)(ps_ctx *c, float *z, const float *q, const ps_kv_attn *a);
    int (*kv_gate)(ps_ctx *c, float *alpha, const float *u, const float *bias, int learned, const ps_kv_close *w);
    int (*kv_pool)(ps_ctx *c, float *out, const float *alpha, const float *C, int shared, const float *pre, int64_t hd,
                   const ps_kv_close *w);
    int (*kv_gather)(ps_ctx *c, float *out, const ps_kv_pages *p, const int64_t *rows, int64_t n);
    int (*kv_attend_sink)(ps_ctx *c, float *z, const float *q, const float *sink, const ps_kv_attn *a);
    int (*kv_slots)(ps_ctx *c, float *alpha, const float *ape, const ps_kv_chan *k);
    int (*kv_slot_pool)(ps_ctx *c, float *out, const float *alpha, const ps_kv_chan *k);
    /* block-sparse selection (InfLLM-v2, core/select.h; shapes in core/ops.h) */
    int (*select_compress)(ps_ctx *c, float *ck, const float *k, int64_t B, int64_t L, int64_t Hkv, int64_t D, int64_t K,
                           int64_t S);
    int (*select_scores)(ps_ctx *c, float *P, const float *q, const float *k1, const float *k2, const ps_sel_geom *g);
    int (*select_block_scores)(ps_ctx *c, float *bs, const float *P, const ps_sel_geom *g);
    int (*select_topk)(ps_ctx *c, float *blocks, const float *bs, const ps_sel_geom *g);
    int (*select_attn)(ps_ctx *c, float *z, float *lse, const float *q, const float *k, const float *v, const float *blocks,
                       const ps_sel_geom *g);
    /* hook actions */
    int (*head_set)(ps_ctx *c, float *x, const float *src, int64_t src_stride, int64_t n_seq, int64_t npos, int64_t nh,
                    int64_t hd, int64_t head, int64_t seq0, int64_t seq1);
    int (*add_vector)(ps_ctx *c, float *x, const float *vec, float scale, int64_t n_rows, int64_t width);
    int (*roll_blocks)(ps_ctx *c, float *x, int64_t W, int64_t stride, int64_t off, int64_t len, int64_t k);
    int (*copy_blocks)(ps_ctx *c, float *dst, int64_t dst_s0, int64_t dst_s1, const float *src, int64_t src_s0,
                       int64_t src_s1, int64_t n0, int64_t n1, int64_t width, int accumulate, float scale);
    int (*accumulate_seqs)(ps_ctx *c, double *sum, const float *x, int64_t n_seq, int64_t n);
    int (*sum_to_mean)(ps_ctx *c, float *mean, const double *sum, double count, int64_t n);
    int (*delta_dot)(ps_ctx *c, double *out, const float *g, const float *x, const float *src, int64_t src_nseq, int64_t B,
                     int64_t npos, int64_t nh, int64_t X);
    /* backward */
    int (*matmul_backward)(ps_ctx *c, float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                           int64_t M, int64_t K, int64_t N);
    int (*embed_backward)(ps_ctx *c, float *dtable, const float *dout, const int32_t *tok, int64_t n_tok, int64_t C);
    int (*rmsnorm_backward)(ps_ctx *c, float *dinp, float *dweight, const float *dout, const float *inp,
                            const float *weight, const float *rstd, int64_t n_rows, int64_t C);
    int (*rope_backward)(ps_ctx *c, float *dx, const float *cos_t, const float *sin_t, int64_t n_seq,
                         int64_t rows_per_seq, int64_t n_heads, int64_t hd, int64_t pos_step);
    int (*swiglu_backward)(ps_ctx *c, float *dg, float *du, const float *dh, const float *g, const float *u, int64_t n);
    int (*gate_backward)(ps_ctx *c, float *da, float *du, float *dbias, float *dalpha, const float *alpha, const float *a,
                         const float *u, int64_t d, const ps_windows *win);
    int (*payload_backward)(ps_ctx *c, float *da, float *dC, const float *dP, const float *a, const float *C, int shared,
                            float *scratch, int64_t d, int64_t hd, const ps_windows *win);
    int (*gate_entropy)(ps_ctx *c, double *value, float *dalpha, const float *alpha, int64_t B, int64_t nW, int64_t nkv,
                        int64_t W, double weight);
    int (*pool_backward)(ps_ctx *c, float *dalpha, float *dP, const float *dout, const float *alpha, const float *P,
                         int64_t B, int64_t nW, int64_t W, int64_t nkv, int64_t hd);
    int (*attn_backward)(ps_ctx *c, float *dq, float *dk, float *dv, float *dck, float *dcv, const float *dz,
                         const float *z, const float *lse, const float *q, const float *k, const float *v,
                         const float *ck, const float *cv, const ps_attn_geom *g);
    int (*select_backward)(ps_ctx *c, float *dq, float *dk, float *dv, const float *dz, const float *z, const float *lse,
                           const float *q, const float *k, const float *v, const float *blocks, const ps_sel_geom *g);
    int (*cross_entropy)(ps_ctx *c, double *loss_sum, int64_t *n_targets, float *dlogits, const float *logits,
                         const int32_t *targets, int64_t n_rows, int64_t V, float scale);
    /* optimizer */
    int (*sumsq)(ps_ctx *c, double *out, const float *x, int64_t n);
    int (*adamw)(ps_ctx *c, float *w, float *m1, float *m2, const float *g, const ps_adamw_seg *segs, int n_segs,
                 const ps_adamw_hyper *h);
} ps_backend_ops;

/* The DeepSeek-V4 extension table (SPEC-v4; core/v4/): one entry per ps_v4_op, in PS_V4_OPS's order. A
 * backend without it leaves ps_backend.v4 NULL and the V4 ops fail naming the backend. */
typedef struct {
    int (*v4_rope_table)(ps_ctx *c, float *cos_t, float *sin_t, int64_t n_pos, int64_t half, const double *inv_freq,
                         float mscale);
    int (*v4_rope)(ps_ctx *c, float *x, const float *cos_t, const float *sin_t, int64_t n_seq, int64_t rows_per_seq,
                   int64_t n_heads, int64_t hd, int64_t rd, int64_t pos_step, int inverse);
    int (*v4_hc_weights)(ps_ctx *c, float *pre, float *post, float *comb, const float *mix, const float *x,
                         const float *scale, const float *base, int64_t n, int64_t N, int64_t D, int64_t iters,
                         float hc_eps, float norm_eps);
    int (*v4_hc_collapse)(ps_ctx *c, float *out, const float *pre, const float *h, int64_t n, int64_t N, int64_t D);
    int (*v4_hc_expand)(ps_ctx *c, float *hout, const float *post, const float *comb, const float *blk, const float *h,
                        int64_t n, int64_t N, int64_t D);
    int (*v4_comp_slots)(ps_ctx *c, float *gate, const float *z, const float *ape, int64_t B, int64_t T, int64_t nW,
                         int64_t m, int64_t d, int overlap);
    int (*v4_slot_softmax)(ps_ctx *c, float *alpha, const float *gate, int64_t n_groups, int64_t S, int64_t d);
    int (*v4_comp_pool)(ps_ctx *c, float *pooled, const float *alpha, const float *kv, int64_t B, int64_t T, int64_t nW,
                        int64_t m, int64_t d, int overlap);
    int (*v4_indexer_scores)(ps_ctx *c, float *scores, const float *iq, const float *ik, const float *w, int64_t B,
                             int64_t T, int64_t nW, int64_t Hi, int64_t Di, float scale);
    int (*v4_topk)(ps_ctx *c, float *idx, float *gap, const float *scores, const float *bias, int64_t n_rows,
                   int64_t n_cols, int64_t K, int64_t rows_per_seq, int64_t m);
    int (*v4_router_scores)(ps_ctx *c, float *scores, const float *logits, int64_t n, int scoring);
    int (*v4_route_weights)(ps_ctx *c, float *weights, const float *scores, const float *idx, int64_t n, int64_t E,
                            int64_t k, float scale);
    int (*v4_swiglu_clamp)(ps_ctx *c, float *h, const float *g, const float *u, int64_t n, float limit);
    int (*v4_scatter_add_rows)(ps_ctx *c, float *out, const float *in, const int64_t *rows, const float *w, int64_t n,
                               int64_t width);
    int (*v4_attn)(ps_ctx *c, float *out, float *sinkp, const float *q, const float *kv, const float *ckv,
                   const float *topk, const float *sink, const ps_v4_attn_geom *g);
    int (*v4_attn_bias)(ps_ctx *c, float *bias, const float *topk, const ps_v4_attn_geom *g);
    int (*v4_attn_logits)(ps_ctx *c, float *logits, const float *q, const float *kv, const float *ckv, const float *bias,
                          const ps_v4_attn_geom *g);
    int (*v4_attn_softmax)(ps_ctx *c, float *pattern, float *sinkp, const float *logits, const float *sink,
                           const ps_v4_attn_geom *g);
    int (*v4_attn_apply)(ps_ctx *c, float *out, const float *pattern, const float *kv, const float *ckv,
                         const ps_v4_attn_geom *g);
    int (*v4_sink_rescale)(ps_ctx *c, float *out, const float *sink_old, const float *sink_new, const ps_v4_attn_geom *g);
    int (*v4_grouped_linear)(ps_ctx *c, float *out, const float *inp, const float *w, int64_t M, int64_t G, int64_t Kg,
                             int64_t Ng);
    int (*v4_scale)(ps_ctx *c, float *x, float s, int64_t n);
    /* the trainable V4 compressor's backward */
    int (*v4_comp_slots_backward)(ps_ctx *c, float *dz, float *dape, const float *dgate, int64_t B, int64_t T, int64_t nW,
                                  int64_t m, int64_t d, int overlap);
    int (*v4_slot_softmax_backward)(ps_ctx *c, float *dgate, const float *dalpha, const float *alpha, int64_t n_groups,
                                    int64_t S, int64_t d);
    int (*v4_comp_pool_backward)(ps_ctx *c, float *dalpha, float *dkv, const float *dpooled, const float *alpha,
                                 const float *kv, int64_t B, int64_t T, int64_t nW, int64_t m, int64_t d, int overlap);
    int (*v4_attn_backward)(ps_ctx *c, float *dq, float *dkv, float *dckv, float *dsink, const float *dout, const float *out,
                            const float *q, const float *kv, const float *ckv, const float *sink, const ps_v4_attn_geom *g);
    /* the DeepSeek-V4 KV cache (core/v4/v4_kvcache.h): the attention over the pages, a closing window's gates */
    int (*v4_kv_attend)(ps_ctx *c, float *out, float *sinkp, const float *q, const float *topk, const float *sink,
                        const ps_v4_kv_attn *a);
    int (*v4_kv_slots)(ps_ctx *c, float *gate, const float *ape, const ps_kv_chan *k);
} ps_backend_v4_ops;

struct ps_backend {
    const char *name;
    /* memory: bytes, zero-filled; copies between host and buffers */
    void *(*alloc)(ps_ctx *c, int64_t bytes);
    void (*free)(ps_ctx *c, void *p);
    int (*to_host)(ps_ctx *c, void *host, const void *buf, int64_t bytes);
    int (*from_host)(ps_ctx *c, void *buf, const void *host, int64_t bytes);
    int host_visible; /* buffers are host pointers */
    /* free and total bytes of the backend's memory (NULL: host memory, /proc/meminfo's MemAvailable) */
    int (*mem_info)(ps_ctx *c, int64_t *free_bytes, int64_t *total_bytes);
    /* (may be NULL) called with open = 1 before and open = 0 after every op and copy (core/ops.h's
     * ps_op_open / ps_op_close; nested calls count): a backend whose buffers the host must not touch
     * between ops can make them unreachable there (the test backend cpu-staged does). */
    void (*guard)(ps_ctx *c, int open);
    int (*init)(ps_ctx *c);   /* backend state into c->impl (may be NULL) */
    void (*fini)(ps_ctx *c);  /* (may be NULL) */
    /* Can this backend run op with these parameters? (NULL: every op with any parameters.) ops.h asks
     * before each op that has parameters (p->attn, p->frame, p->win, p->sel) and fails naming the op, the backend
     * and why (*why, a static string) when the answer is 0. */
    int (*supports)(ps_op op, const ps_op_params *p, const char **why);
    ps_backend_ops ops;           /* every entry required */
    const ps_backend_v4_ops *v4;  /* DeepSeek-V4 extension (NULL: this backend has none) */
};

/* The CPU backend (the reference). */
extern const ps_backend ps_backend_cpu;
/* "cpu-staged": the CPU backend declaring its buffers not host-visible (a test backend: ps_ctx_create
 * knows it, ps_ctx_backends() and the CLI do not; docs/backends.md). */
extern const ps_backend ps_backend_cpu_staged;

#endif
