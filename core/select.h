/* select.h — block-sparse selection attention (InfLLM-v2, docs/minicpm.md): the layer math as plain-array
 * CPU functions over ONE sequence, shared by the MiniCPM4 family (core/minicpm/) and the controlled model's
 * `select` attention kind. Owns: the compressed keys (mean pooling over complete windows, level 1 and the
 * level-2 normaliser), the stage-1 score P, the block scores (max pooling, forced blocks), the top-k block
 * selection, and exact softmax attention over the raw keys of the selected blocks (the dense path: every
 * block), with its backward. Each step has a naive reference (*_ref: double precision, written from the
 * definition a different way) that the tests compare the fast path with.
 *
 * Notation (one sequence): L keys (positions 0..L-1), queries at positions pos0 .. pos0+n-1 (a whole forward:
 * pos0 = 0, n = L; a decode row: pos0 = L-1, n = 1), H query heads, Hkv KV heads, G = H / Hkv (query head i
 * reads KV head i / G), D head dim, windows of K tokens every S (level 2: 4K every 4S), blocks of Bk tokens
 * (a multiple of S; m = Bk / S), I initial blocks, Lb local blocks, k top blocks: k + Lb slots per row.
 *
 * Layouts (row-major):
 *   q [n, H, D], k / v [L, Hkv, D], ck [N, Hkv, D], P [n, Hkv, N1], block scores [n, Hkv, nb],
 *   blocks [n, Hkv, k + Lb] (selected ids ascending as floats, -1 = empty slot), z [n, H, D]. */
#ifndef PS_SELECT_H
#define PS_SELECT_H

#include <stdint.h>

#include "core/error.h"

typedef struct {
    int64_t kernel;      /* K: tokens per level-1 window */
    int64_t stride;      /* S: level-1 stride */
    int64_t block;       /* Bk: tokens per block (a multiple of S) */
    int64_t init_blocks; /* I: blocks 0..I-1 always selected */
    int64_t local_blocks;/* Lb: blocks q_blk-Lb .. q_blk always selected */
    int64_t topk;        /* k: top blocks beyond the local ones (slots = k + Lb) */
} ps_select_cfg;

/* Windows of kernel K and stride S complete in L tokens: floor((L - K) / S) + 1, 0 when L < K. */
int64_t ps_select_n_windows(int64_t L, int64_t K, int64_t S);
/* Blocks of L tokens: ceil(L / Bk). */
int64_t ps_select_n_blocks(const ps_select_cfg *c, int64_t L);
/* Slots per row: k + Lb. */
static inline int64_t ps_select_slots(const ps_select_cfg *c) { return c->topk + c->local_blocks; }
/* Check a geometry: K >= S >= 1, Bk a positive multiple of S, I >= 0, Lb >= 0, k >= 0; the key at fault
 * (its name as given in names[6], in the order kernel, stride, block, init_blocks, local_blocks, topk) and
 * src named in the error. */
int ps_select_cfg_check(const ps_select_cfg *c, const char *src, const char *const names[6], ps_error *err);

/* ---- forward (fast paths) ---- */

/* ck[N, Hkv, D] = mean of k over window j: tokens [jS, jS + K) (N = ps_select_n_windows(L, K, S)). */
void ps_select_compress_forward(float *ck, const float *k, int64_t L, int64_t Hkv, int64_t D, int64_t K, int64_t S);
/* Stage 1: P[i, h, j] = sum over the G query heads g of h of exp(q_g·k1_j/√D − LSE_v(q_g·k2_v/√D)) for the
 * keys visible to row i's position t (level 1: jS + K − 1 <= t; level 2: 4Sv + 4K − 1 <= t), 0 otherwise
 * (and 0 in a row without a visible level-2 key). */
void ps_select_scores_forward(float *P, const float *q, int64_t n, int64_t pos0, const float *k1, int64_t N1,
                              const float *k2, int64_t N2, int64_t H, int64_t Hkv, int64_t D, int64_t K, int64_t S);
/* Block scores bs[i, h, b] = max over j in [m·b − 1, m·b + m − 1] ∩ [0, N1) of P[i, h, j] (an empty range:
 * 0); +inf where forced: b < I, or q_blk − Lb <= b <= q_blk (q_blk = t / Bk). */
void ps_select_block_scores_forward(float *bs, const float *P, int64_t n, int64_t pos0, int64_t N1, int64_t nb, int64_t Hkv,
                                    const ps_select_cfg *c);
/* The top k + Lb blocks of each row by score (ties to the lower index; NaN scores rank lowest), those after
 * q_blk dropped, the rest ascending then -1. */
void ps_select_topk_forward(float *blocks, const float *bs, int64_t n, int64_t pos0, int64_t nb, int64_t Hkv,
                            const ps_select_cfg *c);
/* Blocks written by a caller (an overwritten hook): every entry an integer in [-1, nb); else an error naming
 * `what`, the row and the value. */
int ps_select_blocks_check(const float *blocks, int64_t n, int64_t Hkv, int64_t slots, int64_t nb, const char *what,
                           ps_error *err);
/* Attention: z[i, g] = softmax over the keys j <= t whose block j / Bk is among row i's blocks (KV head g / G)
 * of q·k_j/√D, times v_j. blocks NULL: every key j <= t (ordinary causal attention; the dense path). lse
 * [n, H] (may be NULL): each row's log-sum-exp of the scaled logits, kept for the backward (-inf: no key).
 * A row without any key gives z = 0. Blocks must have passed ps_select_blocks_check. Runs over tiles of 64 rows and
 * one KV head with an online softmax over key chunks in ascending order (the selected blocks; 64 keys dense), each
 * chunk read once per tile; a row's result does not depend on the other rows of the call, so a decode row
 * (n = 1) equals the last row of a whole pass bit for bit. */
void ps_select_attn_forward(float *z, float *lse, const float *q, const float *k, const float *v, const float *blocks,
                            int64_t slots, int64_t n, int64_t pos0, int64_t L, int64_t block, int64_t H, int64_t Hkv,
                            int64_t D);

/* The keys slot r of a blocks row (one query, one KV head) gives the query at position t: [*j0, *j1) — empty
 * for -1, for an id an earlier slot of the row holds, and for keys after t. ps_select_attn_forward visits these
 * ranges slot by slot in this order; a cache that gathers them into one frame in the same order and attends to
 * the whole frame (blocks NULL) adds the same terms in the same order (core/kvcache.c's decode row). */
void ps_select_slot_keys(const float *row, int64_t r, int64_t t, int64_t block, int64_t *j0, int64_t *j1);

/* ---- backward (the selection is a discrete choice: no gradient through it) ---- */

/* Given dz [n, H, D] and the forward's z and lse: dq [n, H, D], dk, dv [L, Hkv, D] accumulated (+=). */
void ps_select_attn_backward(float *dq, float *dk, float *dv, const float *dz, const float *z, const float *lse,
                             const float *q, const float *k, const float *v, const float *blocks, int64_t slots, int64_t n,
                             int64_t pos0, int64_t L, int64_t block, int64_t H, int64_t Hkv, int64_t D);

/* ---- naive references (double precision, from the definitions; outputs as the fast paths') ---- */

void ps_select_compress_ref(double *ck, const float *k, int64_t L, int64_t Hkv, int64_t D, int64_t K, int64_t S);
void ps_select_scores_ref(double *P, const float *q, int64_t n, int64_t pos0, const float *k1, int64_t N1, const float *k2,
                          int64_t N2, int64_t H, int64_t Hkv, int64_t D, int64_t K, int64_t S);
void ps_select_block_scores_ref(double *bs, const float *P, int64_t n, int64_t pos0, int64_t N1, int64_t nb, int64_t Hkv,
                                const ps_select_cfg *c);
void ps_select_topk_ref(int64_t *blocks, const float *bs, int64_t n, int64_t pos0, int64_t nb, int64_t Hkv,
                        const ps_select_cfg *c);
void ps_select_attn_ref(double *z, const float *q, const float *k, const float *v, const float *blocks, int64_t slots,
                        int64_t n, int64_t pos0, int64_t L, int64_t block, int64_t H, int64_t Hkv, int64_t D);

#endif
