/* cpu_attention.h — the CPU backend's attention kernels in O(T) memory (flash style): the
 * attn_forward and attn_backward entries of the op table (core/backend.h). Semantics: ps_attn_forward
 * and ps_attn_backward in core/ops.h.
 *
 * Query rows run in blocks of PS_CPU_ATTN_BLOCK; a block's scores against every entry its rows can see
 * live in per-thread scratch from ps_ctx_workspace (forward: block × ncols floats per thread; backward:
 * twice that), so no [T, ncols] matrix is ever stored. The backward recomputes the probabilities of a
 * block from the forward's row log-sum-exp (P = exp(s - lse)) and takes the softmax backward from
 * D = rowsum(dz ∘ z). Results do not depend on the thread count. */
#ifndef PS_CPU_ATTENTION_H
#define PS_CPU_ATTENTION_H

#include <stdint.h>

#include "core/backend.h"
#include "core/ctx.h"

/* Query rows per block (the rows of one score block). 128 rather than 64: the backward's sgemms that
 * add into dK/dV have this inner size, and measured 3-5% faster on the whole backward (T = 4096). */
#define PS_CPU_ATTN_BLOCK 128

/* z: [B, T, nh, hd] (=); lse: [B, nh, T] (=), natural-log log-sum-exp of the scaled scores q·key/sqrt(hd)
 * over the entries each query sees. q: [B, T, nh, hd]; k, v: [B, T, nkv, hd]; ck, cv: [B, nW, nkv, hd]
 * (compressed only; may be NULL when nW = 0 or for full attention). */
int ps_cpu_attn_forward(ps_ctx *c, float *z, float *lse, const float *q, const float *k, const float *v,
                        const float *ck, const float *cv, const ps_attn_geom *g);

/* From the forward's z and lse and the output gradient dz [B, T, nh, hd]: dq (=) [B, T, nh, hd]; dk, dv
 * (+=) [B, T, nkv, hd]; dck, dcv (+=) [B, nW, nkv, hd] (compressed only). */
int ps_cpu_attn_backward(ps_ctx *c, float *dq, float *dk, float *dv, float *dck, float *dcv, const float *dz,
                         const float *z, const float *lse, const float *q, const float *k, const float *v,
                         const float *ck, const float *cv, const ps_attn_geom *g);

/* The probability rows, materialised (only for a pattern hook): probs [B, nh, T, ncols] (=), the
 * forward's blocks with every entry a query does not see 0; and z (=) from such rows, multiplied block
 * by block as the forward does (so attn_probs + attn_out give the forward's z bit for bit). attn_out
 * reads only the columns a block's rows can see: unseen entries must be 0 (ps_pattern_compact). */
int ps_cpu_attn_probs(ps_ctx *c, float *probs, const float *q, const float *k, const float *ck, const ps_attn_geom *g);
int ps_cpu_attn_out(ps_ctx *c, float *z, const float *probs, const float *v, const float *cv, const ps_attn_geom *g);

/* Floats of workspace the kernels take for this geometry with `threads` OpenMP threads (bench, tests). */
int64_t ps_cpu_attn_workspace(const ps_attn_geom *g, int threads, int backward);

#endif
