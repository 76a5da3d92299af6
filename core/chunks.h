/* chunks.h — content-defined chunk boundaries (attention.boundaries "content", docs/mitigations.md §4): where
 * the compressed windows of a sequence start and end, as a function of its token ids alone.
 *
 * With m = chunk_min, W = window (the longest chunk) and S = stride (the mean chunk length): a chunk that
 * started at position s ends at t (its last token) at the first t >= s + m − 1 with
 *     h(x[t−1], x[t]) < θ     or     t − s + 1 = W,
 * h the 32-bit hash below (x[−1] := −1) and θ the threshold that makes the mean chunk length S for hash
 * values uniform and independent across positions: with q = θ / 2^32,
 *     E[L] = m + Σ_{k=1}^{W−m} (1 − q)^k = S.
 * The boundary after t depends on tokens up to t only (causal). The first chunk starts at 0; chunk j+1
 * starts after chunk j's last token; a chunk exists when it ends inside the sequence (its last token < T),
 * so the tokens after the last boundary belong to no chunk yet (as the tokens after the last whole window
 * of SPEC §2). */
#ifndef PS_CHUNKS_H
#define PS_CHUNKS_H

#include <stdint.h>

#include "core/config.h"

/* The boundary hash of the token pair (prev, cur); prev = -1 at position 0. */
uint32_t ps_chunk_hash(int32_t prev, int32_t cur);

/* θ (in [0, 2^32]) for a content-boundary config: q solves E[L] = S by bisection, θ = round(q · 2^32). */
uint64_t ps_chunk_threshold(const ps_config *c);

/* E[L] of the config with q = θ / 2^32 (θ rounded as above): the expected chunk length, so 1 / E[L] is the
 * expected compressed entries per token (per KV head and layer) on hash values uniform and independent. */
double ps_chunk_expected_len(const ps_config *c);

/* The chunks of one sequence tok[0..T): start cs[j] and length cl[j] for j < n (returned), then cs = cl = 0
 * for n <= j < nC (absent chunks). n never exceeds nC when nC >= floor(T / chunk_min)
 * (ps_config_n_windows). */
int64_t ps_content_chunks(const ps_config *c, const int32_t *tok, int64_t T, int64_t nC, int64_t *cs, int64_t *cl);

#endif
