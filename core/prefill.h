/* prefill.h — long prompts in chunks: the forward pass of one sequence run `chunk` tokens at a time,
 * with the logits computed only at the positions asked for (never [T, vocab]).
 *
 * Carried from chunk to chunk, per layer:
 *   compressed attention: the compressed cache (ck, cv of every window completed so far), the raw keys
 *     and values of the last local_window - 1 positions (the local window of the next chunk's first
 *     query), and the compressor's partial-window state: the RMSNorm'd layer input of the last W - 1
 *     positions (a window that straddles two chunks is pooled once its last position arrives);
 *   full attention: the raw keys and values of every position so far (that is O(T) per layer, and the
 *     reason full attention at 128K tokens does not fit a 0.6B model in 24 GiB: ps_prefill_bytes);
 *   select attention (core/select.h; cpu backend): the same raw keys and values, and the level-1 and level-2
 *     pooled keys of every window completed so far (pooled when the chunk holding its last token runs). Every
 *     chunk takes the path a whole forward over the T tokens takes (dense below dense_len) and chooses blocks
 *     among the blocks of T tokens, so the chunks equal the whole forward.
 * Offset grids (staggered and per-layer, attention.head_offsets): each KV head's windows close on its own grid
 * (layer l's offsets), pooled from the compressor frame when their last position arrives.
 * Everything else (q, the MLP, the residual) lives for one chunk. Attention per chunk is ps_attn_chunk:
 * scratch O(T) per thread. Memory: ps_prefill_bytes, linear in T.
 *
 * The numbers are those of one unchunked ps_forward pass at the same positions, up to float rounding
 * (the chunk's matrix products have other shapes): tests/test_prefill.c. Hooks do not fire here. */
#ifndef PS_PREFILL_H
#define PS_PREFILL_H

#include <stdint.h>

#include "core/error.h"
#include "core/model.h"

/* Logits are computed for at most this many asked-for positions at a time. */
#define PS_PREFILL_ROWS 64

typedef struct {
    float *k, *v;         /* raw key frame [rows, nkv, hd]: compressed local_window - 1 + chunk rows; full T_max */
    float *ck, *cv;       /* compressed cache [nW_max, nkv, hd] */
    float *a;             /* compressor input frame [W - 1 + chunk, d] */
    float *k1, *k2;       /* select: the level-1 and level-2 pooled keys [N1(T_max) / N2(T_max), nkv, hd] */
} ps_prefill_layer;

typedef struct {
    const ps_model *m;
    ps_ctx *ctx;
    int64_t T_max, chunk, nW_max, hist_k, hist_a;
    ps_prefill_layer *layers; /* [n_layers] */
    /* one chunk's working set */
    float *x, *q_pre, *q, *k_pre, *rstd, *z, *attn_out, *mid, *ln2, *g, *u, *h, *mlp_out;
    float *gz_k, *ga_k, *gz_v, *ga_v, *pk, *pv, *ck_pre, *pscratch, *tmp;
    float *rope_cos, *rope_sin; /* [T_max, hd/2] */
    float *sel_P, *sel_bs, *sel_blocks; /* select: one chunk's stage-1 scores, block scores, blocks [chunk, nkv, *] */
    float *a_full;        /* full attention: the chunk's RMSNorm'd input [chunk, d] */
    float *rows_x, *rows_ln, *rows_logits, *rows_rstd; /* [R, d] ×2, [R, V], [R]: R = PS_PREFILL_ROWS */
    /* offset grids (attention.head_offsets; compressed): each layer's offsets woff [n_layers, nkv] (host; NULL:
     * the base grid), and the chunk's new entries before they enter ck / cv: cv_new, ck_new [windows, nkv, hd] */
    int64_t *woff;
    float *ck_new, *cv_new;
    float *buf;
    int64_t n_floats;
} ps_prefill;

/* Bytes ps_prefill_create allocates for T_max tokens in chunks of `chunk` (not counting the weights). */
double ps_prefill_bytes(const ps_config *c, int64_t T_max, int64_t chunk);

int ps_prefill_create(ps_prefill *p, const ps_model *m, int64_t T_max, int64_t chunk, ps_error *err);
void ps_prefill_free(ps_prefill *p);

/* Run tokens[0, T) (T <= T_max; each token in [0, vocab)) from the start; the logits at positions
 * pos[0..n) (any order, each in [0, T)) go to out[n, vocab] on the host. */
int ps_prefill_logits(ps_prefill *p, const int32_t *tokens, int64_t T, const int64_t *pos, int64_t n, float *out,
                      ps_error *err);

#endif
