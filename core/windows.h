/* windows.h — building and checking the compressor's window tables (ps_windows, core/backend.h): the grid of
 * every W positions every S (with per-head start offsets: staggered grids, phase augmentation) and content
 * chunks (core/chunks.h finds them) are tables the caller builds; the compressor ops take the table. */
#ifndef PS_WINDOWS_H
#define PS_WINDOWS_H

#include <stdint.h>

#include "core/backend.h"

/* The grid: window j of head g in sequence b starts at j*S + o, o = woff[b*nkv + g] (woff NULL: 0 for every
 * head, and the table is shared by the heads, H = 1), and has W positions when it fits in T, else it is
 * absent. start and len hold B*nW*H entries (H = woff ? nkv : 1). */
ps_windows ps_windows_grid(int64_t *start, int64_t *len, int64_t B, int64_t T, int64_t nW, int64_t W, int64_t S, int64_t nkv,
                           const int64_t *woff);

/* Content chunks: chunk j of sequence b starts at cs[b*nC + j] and has cl[b*nC + j] positions (0: absent);
 * every head alike (H = 1). Copied into start and len (B*nC entries each), an absent chunk with start -1
 * (outside the sequence: ps_rope_windows leaves its entry alone). */
ps_windows ps_windows_chunks(int64_t *start, int64_t *len, const int64_t *cs, const int64_t *cl, int64_t B, int64_t T,
                             int64_t nC, int64_t W, int64_t nkv);

/* Fails c naming op and the first bad entry (a start or length outside [0, T) or longer than W, H neither
 * 1 nor nkv, a NULL table with windows) and returns -1; else 0. The ops.h wrappers call it. */
int ps_windows_check(ps_ctx *c, const char *op, const ps_windows *w);

/* Is the table the base grid (H = 1, S > 0, window j at j*S with W positions, every window present)? */
int ps_windows_is_base_grid(const ps_windows *w);

#endif
