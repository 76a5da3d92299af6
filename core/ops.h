/* ops.h — the compute seam: every numeric step the model, its training and the instruments take over
 * activations or parameters, as ops on a context (core/ctx.h). Each op dispatches to the context's
 * backend (the op table in core/backend.h: the CPU backend in core/cpu/ is the reference) and returns
 * 0, or -1 with the context failed (ps_ctx_check hands the first message on). After a failure, later
 * ops return -1 at once, so a caller may chain a whole layer and check once.
 *
 * Array arguments are buffers of the context (ps_buf_alloc); index arrays (tokens, targets, rows) are
 * host arrays that the backend stages when it needs to. Shapes are row-major and stated per op; all
 * sizes are int64. Backward ops accumulate (+=) into gradient outputs unless stated. */
#ifndef PS_OPS_H
#define PS_OPS_H

#include <stdint.h>
#include <string.h>

#include "core/backend.h"
#include "core/ctx.h"
#include "core/hd_math.h"
#include "core/windows.h"

/* expf for the kernels' inner loops: Cephes' range reduction and degree-6 polynomial, written so that
 * gcc vectorises the loops that call it (libm's expf is a call, which stops vectorisation). Relative
 * error <= 2e-7 (a few ulp) over [-87, 88]; arguments are clamped to that range (below: about 1.6e-38
 * instead of a denormal or 0; above: about 1.7e38 instead of +inf). NaN stays NaN. */
static inline float ps_expf(float x) {
    float xc = x > -87.0f ? x : -87.0f; /* NaN → -87 here (no NaN reaches the integer conversion)… */
    xc = xc < 88.0f ? xc : 88.0f;
    float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round to nearest (1.5·2^23 trick) */
    float r = xc - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    uint32_t e = (uint32_t)((int32_t)n + 127) << 23; /* n in [-126, 127]: a normal power of two */
    float scale;
    memcpy(&scale, &e, sizeof scale);
    return x == x ? p * scale : x; /* …and NaN in, NaN out */
}

/* ps_expf(x), the same float for every x (NaN, ±inf and the clamps included; checked over all 2^32 bit
 * patterns once, sampled in test_kernels), written so that gcc 12 vectorises the loops that call it:
 * ps_expf's float compares (the clamps to [-87, 88], the NaN test) keep gcc from if-converting a loop
 * under the default -ftrapping-math, so loops calling ps_expf stay scalar. Here the clamps compare the
 * bit patterns as integers (mapped so that integer order is float order; NaNs land outside the range and
 * are clamped like ps_expf clamps them) and NaN is passed through with an integer mask. Every CPU kernel
 * calls this one; ps_expf stays as its readable reference (test_kernels compares the two). */
static inline float ps_expf_v(float x) {
    int32_t xi;
    memcpy(&xi, &x, sizeof xi);
    int32_t key = xi >= 0 ? xi : xi ^ 0x7fffffff;                        /* float order as integer order */
    const int32_t lo = (int32_t)(0xc2ae0000u ^ 0x7fffffffu), hi = 0x42b00000; /* keys of -87.0f and 88.0f */
    key = key > lo ? key : lo;
    key = key < hi ? key : hi;
    int32_t ci = key >= 0 ? key : key ^ 0x7fffffff;
    float xc;
    memcpy(&xc, &ci, sizeof xc);
    /* from here ps_expf's arithmetic, term for term */
    float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = xc - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    uint32_t e = (uint32_t)((int32_t)n + 127) << 23;
    float scale, y = 0.0f;
    memcpy(&scale, &e, sizeof scale);
    y = p * scale;
    int32_t yi, nan_mask = -(int32_t)((xi & 0x7fffffff) > 0x7f800000); /* all ones for NaN */
    memcpy(&yi, &y, sizeof yi);
    yi = (xi & nan_mask) | (yi & ~nan_mask);
    memcpy(&y, &yi, sizeof y);
    return y;
}

/* Compressed entries query t of sequence b (KV head kv) sees under geometry g: the chunks that have ended
 * (g->cend), else the windows of the (offset) grid that have ended. */
static inline int64_t ps_geom_seen(const ps_attn_geom *g, int64_t b, int64_t kv, int64_t t) {
    return ps_entries_seen(g->cend ? g->cend + b * g->nW : NULL, ps_woff(g->woff, b, g->nkv, kv), g->W, g->S, g->nW, t);
}

/* A backend with a guard (the test backend cpu-staged) makes its buffers reachable only while one of its
 * ops or copies runs: every op call is bracketed by ps_op_open / ps_op_close. */
static inline void ps_op_open(ps_ctx *c) {
    if (c->be->guard) c->be->guard(c, 1);
}
static inline int ps_op_close(ps_ctx *c, int rc) {
    if (c->be->guard) c->be->guard(c, 0);
    return rc;
}
/* Call a backend entry fn(c, ...) inside the guard. */
#define PS_BE_RUN(c, fn, ...) (ps_op_open(c), ps_op_close((c), (fn)((c), __VA_ARGS__)))

/* Dispatch through the backend's op table (core/backend.h): a failed context fails at once. */
#define PS_OP_CALL(c, op, ...) ((c)->failed ? -1 : PS_BE_RUN((c), (c)->be->ops.op, __VA_ARGS__))

/* Ops with parameters ask the backend first (supports(op, params)) and fail naming the op, the backend and
 * why when it declines. */
static inline int ps_op_check(ps_ctx *c, ps_op op, const ps_op_params *p) {
    if (c->failed) return -1;
    const char *why = NULL;
    if (!ps_backend_supports(c->be, op, p, &why))
        return ps_ctx_fail(c, "%s: not supported on the %s backend: %s", ps_op_name(op), c->be->name, why);
    return 0;
}
static inline int ps_op_check_attn(ps_ctx *c, ps_op op, const ps_attn_geom *g) {
    ps_op_params p = {NULL, NULL, NULL, NULL};
    p.attn = g;
    return ps_op_check(c, op, &p);
}
static inline int ps_op_check_win(ps_ctx *c, ps_op op, const ps_windows *w) {
    if (c->failed || ps_windows_check(c, ps_op_name(op), w)) return -1;
    ps_op_params p = {NULL, NULL, NULL, NULL};
    p.win = w;
    return ps_op_check(c, op, &p);
}
static inline int ps_op_check_frame(ps_ctx *c, const ps_attn_frame *f) {
    ps_op_params p = {NULL, NULL, NULL, NULL};
    p.frame = f;
    return ps_op_check(c, PS_OP_ATTN_CHUNK, &p);
}
/* The selection ops: the geometry is checked (ps_sel_geom_check) before the backend is asked. */
int ps_sel_geom_check(ps_ctx *c, const char *op, const ps_sel_geom *g);
static inline int ps_op_check_sel(ps_ctx *c, ps_op op, const ps_sel_geom *g) {
    if (c->failed || ps_sel_geom_check(c, ps_op_name(op), g)) return -1;
    ps_op_params p = {NULL, NULL, NULL, NULL};
    p.sel = g;
    return ps_op_check(c, op, &p);
}
#define PS_SEL_CALL(c, g, op, E, ...) (ps_op_check_sel((c), PS_OP_##E, (g)) ? -1 : PS_BE_RUN((c), (c)->be->ops.op, __VA_ARGS__))
#define PS_ATTN_CALL(c, g, op, E, ...) (ps_op_check_attn((c), PS_OP_##E, (g)) ? -1 : PS_BE_RUN((c), (c)->be->ops.op, __VA_ARGS__))
/* The compressor ops: the window table is checked (core/windows.h) before the backend sees it. */
#define PS_WIN_CALL(c, w, op, E, ...) (ps_op_check_win((c), PS_OP_##E, (w)) ? -1 : PS_BE_RUN((c), (c)->be->ops.op, __VA_ARGS__))
/* The DeepSeek-V4 extension ops: the backend must have the extension table. */
#define PS_V4_CALL(c, op, ...)                                                                                 \
    ((c)->failed ? -1                                                                                          \
     : !(c)->be->v4 ? ps_ctx_fail((c), "%s: the %s backend has no DeepSeek-V4 ops", #op, (c)->be->name)         \
                    : PS_BE_RUN((c), (c)->be->v4->op, __VA_ARGS__))

/* ---------------- forward ---------------- */

/* out[M, N] (= or +=) inp[M, K] · w[N, K]^T  (a linear layer without bias). */
static inline int ps_matmul(ps_ctx *c, float *out, const float *inp, const float *w, int64_t M, int64_t K, int64_t N,
                            int accumulate) {
    return PS_OP_CALL(c, matmul, out, inp, w, M, K, N, accumulate);
}

/* out[i, :] = table[tok[i], :]; table: [V, C]. Tokens are validated by the caller. */
static inline int ps_embed(ps_ctx *c, float *out, const int32_t *tok, const float *table, int64_t n_tok, int64_t C) {
    return PS_OP_CALL(c, embed, out, tok, table, n_tok, C);
}

/* RMSNorm over rows of C: out = inp / sqrt(mean(inp^2) + eps) * weight; rstd[n_rows] (may be NULL) is
 * kept for the backward. out may alias inp. */
static inline int ps_rmsnorm(ps_ctx *c, float *out, float *rstd, const float *inp, const float *weight, int64_t n_rows,
                             int64_t C, float eps) {
    return PS_OP_CALL(c, rmsnorm, out, rstd, inp, weight, n_rows, C, eps);
}

/* Rotate-half RoPE tables: cos/sin [n_pos, hd/2] with angles p·theta^(-2i/hd) in double precision. */
static inline int ps_rope_table(ps_ctx *c, float *cos_t, float *sin_t, int64_t n_pos, int64_t hd, double theta) {
    return PS_OP_CALL(c, rope_table, cos_t, sin_t, n_pos, hd, theta);
}

/* In-place RoPE on x: [n_seq, rows_per_seq, n_heads, hd]; row r of a sequence sits at position r·pos_step. */
static inline int ps_rope(ps_ctx *c, float *x, const float *cos_t, const float *sin_t, int64_t n_seq,
                          int64_t rows_per_seq, int64_t n_heads, int64_t hd, int64_t pos_step) {
    return PS_OP_CALL(c, rope, x, cos_t, sin_t, n_seq, rows_per_seq, n_heads, hd, pos_step);
}

/* SwiGLU: h = silu(g) ⊙ u, all [n]. */
static inline int ps_swiglu(ps_ctx *c, float *h, const float *g, const float *u, int64_t n) {
    return PS_OP_CALL(c, swiglu, h, g, u, n);
}

/* out = a + b, all [n]. out may alias a or b. */
static inline int ps_add(ps_ctx *c, float *out, const float *a, const float *b, int64_t n) {
    return PS_OP_CALL(c, add, out, a, b, n);
}

/* dst[n] = src[n] (n floats; the arrays do not overlap). */
static inline int ps_copy(ps_ctx *c, float *dst, const float *src, int64_t n) { return PS_OP_CALL(c, copy, dst, src, n); }

/* x[n] = value. */
static inline int ps_fill(ps_ctx *c, float *x, float value, int64_t n) { return PS_OP_CALL(c, fill, x, value, n); }

/* ---- the compressor over a window table (core/backend.h ps_windows: fixed grid, staggered grids and content
 * chunks are tables the caller builds, core/windows.h). Window w = (b, j, g) covers a[b, start + i, :],
 * i < L = len (L = 0: absent). Arrays: z, alpha [B, nW, nkv, W]; P [B, nW, W, nkv*hd]; compressed keys
 * [B, nW, nkv, hd]. Offsets i >= L and absent windows get z = alpha = 0 and P = 0, so ps_pool and its
 * backward apply unchanged. ---- */

/* Compressor gate for one branch (SPEC §2). a: [B, T, d]; u: [W, nkv, d] and bias: [W, nkv], or u = NULL
 * for the uniform gate. Writes logits z = bias[i, g] + u[i, g, :]·a[b, start + i, :] and alpha =
 * softmax_i(z) over the window's L offsets (uniform: z = 0, alpha = 1/L). */
static inline int ps_gate(ps_ctx *c, float *z, float *alpha, const float *a, const float *u, const float *bias, int64_t d,
                          const ps_windows *win) {
    return PS_WIN_CALL(c, win, gate, GATE, z, alpha, a, u, bias, d, win);
}

/* Compressor payloads for one branch: P[b, j, i, g*hd : (g+1)*hd] = C_i[g*hd : (g+1)*hd] a[b, start + i, :].
 * per offset: C is [W, nkv*hd, d]; shared: C is [nkv*hd, d] (scratch: [B, T, nkv*hd], only for shared). */
static inline int ps_payload(ps_ctx *c, float *P, const float *a, const float *C, int shared, float *scratch, int64_t d,
                             int64_t hd, const ps_windows *win) {
    return PS_WIN_CALL(c, win, payload, PAYLOAD, P, a, C, shared, scratch, d, hd, win);
}

/* In-place RoPE of compressed keys x [B, nW, nkv, hd]: entry (b, j, g) rotated by R(start) (inverse: by
 * R(-start), the backward) when start lies in [0, T) — present windows, and absent ones whose start lies in
 * the sequence (a grid's windows that do not fit; ps_windows_chunks gives absent chunks start -1); other
 * entries are left alone (cos/sin tables: [T, hd/2]). */
static inline int ps_rope_windows(ps_ctx *c, float *x, const float *cos_t, const float *sin_t, int64_t hd,
                                  const ps_windows *win, int inverse) {
    return PS_WIN_CALL(c, win, rope_windows, ROPE_WINDOWS, x, cos_t, sin_t, hd, win, inverse);
}

/* Pooling: out[b, j, g, :] = sum_i alpha[b, j, g, i] P[b, j, i, g*hd : (g+1)*hd]. out: [B, nW, nkv, hd]. */
static inline int ps_pool(ps_ctx *c, float *out, const float *alpha, const float *P, int64_t B, int64_t nW, int64_t W,
                          int64_t nkv, int64_t hd) {
    return PS_OP_CALL(c, pool, out, alpha, P, B, nW, W, nkv, hd);
}

/* Attention in O(T) memory (flash style): z[b, t, n, :] = softmax(q·keys/sqrt(hd)) · values over the
 * entries query t sees, and lse[b, n, t] = the row's log-sum-exp of the scaled scores (kept for the
 * backward). q: [B, T, nh, hd]; k, v: [B, T, nkv, hd]; ck, cv: [B, nW, nkv, hd] (compressed). No
 * probability matrix is stored. */
static inline int ps_attn_forward(ps_ctx *c, float *z, float *lse, const float *q, const float *k, const float *v,
                                  const float *ck, const float *cv, const ps_attn_geom *g) {
    return PS_ATTN_CALL(c, g, attn_forward, ATTN_FORWARD, z, lse, q, k, v, ck, cv, g);
}

/* Probability rows, materialised (only for a registered pattern hook). probs: [B, nh, T, ncols].
 * Full: column t' = raw position. Compressed: columns 0..nW-1 are the windows, column nW+m the raw
 * position t-LW+1+m. Entries a query does not see are 0. */
static inline int ps_attn_probs(ps_ctx *c, float *probs, const float *q, const float *k, const float *ck,
                                const ps_attn_geom *g) {
    return PS_ATTN_CALL(c, g, attn_probs, ATTN_PROBS, probs, q, k, ck, g);
}

/* z[b, t, n, :] = sum over columns of probs · value (raw v: [B, T, nkv, hd], compressed cv: [B, nW, nkv, hd]). */
static inline int ps_attn_out(ps_ctx *c, float *z, const float *probs, const float *v, const float *cv,
                              const ps_attn_geom *g) {
    return PS_ATTN_CALL(c, g, attn_out, ATTN_OUT, z, probs, v, cv, g);
}

/* Attention of one chunk of a long sequence (prefill): q [Tq, nh, hd] against the key frame k, v
 * [Tk, nkv, hd] and the compressed cache ck, cv [nW, nkv, hd] (see ps_attn_frame); z [Tq, nh, hd]. The
 * same function as ps_attn_forward on the whole sequence, row for row. Scratch O(Tk) per thread. */
static inline int ps_attn_chunk(ps_ctx *c, float *z, const float *q, const float *k, const float *v, const float *ck,
                                const float *cv, const ps_attn_frame *f) {
    return ps_op_check_frame(c, f) ? -1 : PS_BE_RUN(c, c->be->ops.attn_chunk, z, q, k, v, ck, cv, f);
}

/* Attention output for chosen query rows only (row r = b·T + t): z_rows[n, nh·hd], the same math as
 * ps_attn_forward. */
static inline int ps_attn_rows(ps_ctx *c, float *z_rows, const int64_t *rows, int64_t n, const float *q, const float *k,
                               const float *v, const float *ck, const float *cv, const ps_attn_geom *g) {
    return PS_ATTN_CALL(c, g, attn_rows, ATTN_ROWS, z_rows, rows, n, q, k, v, ck, cv, g);
}

/* Pattern hook layout: expand compact probability rows [B, nh, T, ncols] into [B, nh, T, nW + T]
 * (compressed: windows, then raw positions; unseen entries 0), and back (entries a query does not see
 * are dropped). Full attention rows already have the wide layout: compact re-zeroes the unseen entries
 * in place (full = probs). */
static inline int ps_pattern_expand(ps_ctx *c, float *full, const float *probs, const ps_attn_geom *g) {
    return PS_ATTN_CALL(c, g, pattern_expand, PATTERN_EXPAND, full, probs, g);
}
static inline int ps_pattern_compact(ps_ctx *c, float *probs, const float *full, const ps_attn_geom *g) {
    return PS_ATTN_CALL(c, g, pattern_compact, PATTERN_COMPACT, probs, full, g);
}

/* out[i, :] = in[rows[i], :] (+ add[i, :] when add is not NULL); width floats per row. */
static inline int ps_gather_rows(ps_ctx *c, float *out, const float *in, const float *add, const int64_t *rows,
                                 int64_t n, int64_t width) {
    return PS_OP_CALL(c, gather_rows, out, in, add, rows, n, width);
}

/* out[rows[i], :] = in[i, :]; width floats per row. */
static inline int ps_scatter_rows(ps_ctx *c, float *out, const float *in, const int64_t *rows, int64_t n, int64_t width) {
    return PS_OP_CALL(c, scatter_rows, out, in, rows, n, width);
}

/* ---- the KV cache's ops (core/kvcache.h; the geometry structs in core/backend.h) ---- */

/* The checks every backend's kv ops make first (core/cpu/kv.c): sizes, and page lists that hold the rows the
 * op reads; 0, or -1 with the context failed naming the op. */
int ps_kv_attn_check(ps_ctx *c, const ps_kv_attn *a);
int ps_kv_close_check(ps_ctx *c, const char *op, const ps_kv_close *w);

/* z [nr, nh, hd] = the attention of the queries q [nr, nh, hd] of one sequence's rows t0 .. t0 + nr - 1 over
 * its page lists (ps_kv_attn: compressed entries the row sees plus its local window, or every raw row up to
 * it; one softmax). The CPU's per-row loops are the reference (a->blocked: the same function over a gathered
 * frame, the cache's long pieces). */
static inline int ps_kv_attend(ps_ctx *c, float *z, const float *q, const ps_kv_attn *a) {
    return PS_OP_CALL(c, kv_attend, z, q, a);
}
/* alpha [nkv, W]: the gate weights of the windows closing (ps_kv_close): learned, per head g with a window,
 * softmax_i(bias[i*nkv + g] + u[(i*nkv + g), :] · ln[start[g] + i]) over i < len[g]; uniform (learned 0),
 * 1 / len[g]; 0 for offsets i >= len[g] and heads without a window. u [W*nkv, d], bias [W*nkv]. */
static inline int ps_kv_gate(ps_ctx *c, float *alpha, const float *u, const float *bias, int learned, const ps_kv_close *w) {
    return PS_OP_CALL(c, kv_gate, alpha, u, bias, learned, w);
}
/* out [nkv, hd]: the pooled entries of the windows closing, Σ_i alpha[g, i] · P_i[g] with the payload
 * P_i[g] = C_i[g*hd .. g*hd + hd) · ln[start[g] + i] (C_i = C + i*nkv*hd*d per offset, C when shared;
 * [nkv*hd, d] each), or P_i[g] = pre[i*nkv*hd + g*hd ..] when pre [W, nkv*hd] holds them already; 0 for
 * heads without a window. */
static inline int ps_kv_pool(ps_ctx *c, float *out, const float *alpha, const float *C, int shared, const float *pre, int64_t hd,
                             const ps_kv_close *w) {
    return PS_OP_CALL(c, kv_pool, out, alpha, C, shared, pre, hd, w);
}
/* The channel attention (one K = V head: a->nkv 1, a->k the raw rows, a->ck the entries; a->v, a->cv the same
 * lists): z [nr, nh, hd] of the queries q, row t over its sliding window's raw rows max(0, t - LW + 1) .. t,
 * then its first nvis[i] entries; one softmax with the head's sink logit sink[h] (a column of value 0). */
static inline int ps_kv_attend_sink(ps_ctx *c, float *z, const float *q, const float *sink, const ps_kv_attn *a) {
    return PS_OP_CALL(c, kv_attend_sink, z, q, sink, a);
}
/* alpha [S, hd] (S = m, 2m for CSA): per channel i, softmax over the slots s of z[tok_s, chb_s + i] +
 * ape[(s % m)*cw + chb_s + i] (-inf for a slot without a token); ape [m, cw]. */
static inline int ps_kv_slots(ps_ctx *c, float *alpha, const float *ape, const ps_kv_chan *k) {
    return PS_OP_CALL(c, kv_slots, alpha, ape, k);
}
/* out [hd]: Σ_s alpha[s, i] · kv[tok_s, chb_s + i] over the slots with a token. */
static inline int ps_kv_slot_pool(ps_ctx *c, float *out, const float *alpha, const ps_kv_chan *k) {
    return PS_OP_CALL(c, kv_slot_pool, out, alpha, k);
}
int ps_kv_slots_check(ps_ctx *c, const char *op, const ps_kv_chan *k);

/* ---- block-sparse selection attention (InfLLM-v2, attention.kind "select"; the math in core/select.h, the
 * geometry ps_sel_geom in core/backend.h). B sequences, each array's leading dimension; per sequence:
 * q, z [n, H, D] (rows at positions pos0 ..), k, v [L, Hkv, D], k1 [N1, Hkv, D], k2 [N2, Hkv, D], P [n, Hkv, N1],
 * bs [n, Hkv, nb], blocks [n, Hkv, slots] (block ids ascending as floats, -1 an empty slot), lse [n, H]. The
 * order of the ops is the layer's: compress both levels, scores, block scores, top-k, attention; a hook may
 * rewrite each result before the next op reads it. ---- */

/* ck [B, N, Hkv, D] = the mean of k [B, L, Hkv, D] over window j of each sequence: rows [jS, jS + K),
 * N = ps_select_n_windows(L, K, S) (level 1: K, S; level 2: 4K, 4S). */
static inline int ps_select_compress(ps_ctx *c, float *ck, const float *k, int64_t B, int64_t L, int64_t Hkv, int64_t D,
                                     int64_t K, int64_t S) {
    if (c->failed) return -1;
    if (B < 0 || L < 0 || Hkv < 1 || D < 1 || K < 1 || S < 1)
        return ps_ctx_fail(c, "select_compress: bad sizes (B %lld, L %lld, Hkv %lld, D %lld, K %lld, S %lld)", (long long)B,
                           (long long)L, (long long)Hkv, (long long)D, (long long)K, (long long)S);
    return PS_OP_CALL(c, select_compress, ck, k, B, L, Hkv, D, K, S);
}

/* Stage 1: P [B, n, Hkv, N1]: for row i (position t = pos0 + i) and KV head h, the sum over h's G query heads
 * of exp(q·k1_j/√D − LSE_v(q·k2_v/√D)) over the level-1 keys j visible at t (jS + K − 1 <= t) and the level-2
 * keys v visible at t (4Sv + 4K − 1 <= t); 0 for the keys t does not see, and the whole row 0 when no level-2
 * key is visible. */
static inline int ps_select_scores(ps_ctx *c, float *P, const float *q, const float *k1, const float *k2,
                                   const ps_sel_geom *g) {
    return PS_SEL_CALL(c, g, select_scores, SELECT_SCORES, P, q, k1, k2, g);
}

/* Block scores bs [B, n, Hkv, nb] = max over j in [m·b − 1, m·b + m − 1] ∩ [0, N1) of P (m = block / S; an
 * empty range 0), +inf for the forced blocks: b < init_blocks, or q_blk − local_blocks <= b <= q_blk
 * (q_blk = t / block). */
static inline int ps_select_block_scores(ps_ctx *c, float *bs, const float *P, const ps_sel_geom *g) {
    return PS_SEL_CALL(c, g, select_block_scores, SELECT_BLOCK_SCORES, bs, P, g);
}

/* blocks [B, n, Hkv, slots]: the top `slots` blocks of each bs row (the higher score first, ties to the lower
 * id, NaN the lowest), those after q_blk dropped, the rest in ascending order, then -1. */
static inline int ps_select_topk(ps_ctx *c, float *blocks, const float *bs, const ps_sel_geom *g) {
    return PS_SEL_CALL(c, g, select_topk, SELECT_TOPK, blocks, bs, g);
}

/* z [B, n, H, D] = softmax(q·k_j/√D) · v_j over the keys j <= t (j < L) whose block j / block is among the
 * row's blocks of its KV head (blocks NULL: every key j <= t, plain causal attention); lse [B, n, H] (may be
 * NULL) the row's log-sum-exp of the scaled logits (-inf, and z = 0, for a row without a key). Blocks must
 * hold ids in [-1, nb) (ps_select_blocks_check: the caller checks blocks a hook wrote). */
static inline int ps_select_attn(ps_ctx *c, float *z, float *lse, const float *q, const float *k, const float *v,
                                 const float *blocks, const ps_sel_geom *g) {
    return PS_SEL_CALL(c, g, select_attn, SELECT_ATTN, z, lse, q, k, v, blocks, g);
}

/* out [n, width]: rows rows[i] (host array, base <= rows[i] < p->rows) of the page list p. */
static inline int ps_kv_gather(ps_ctx *c, float *out, const ps_kv_pages *p, const int64_t *rows, int64_t n) {
    return PS_OP_CALL(c, kv_gather, out, p, rows, n);
}

/* ---------------- hook actions (interventions inside the backend) ---------------- */

/* x: [n_seq, npos, nh, hd]. For sequences [seq0, seq1) and head `head`, position t, for t < npos:
 * x[b, t, head, :] = src[t·src_stride ... + hd] (src_stride 0: one vector for every position),
 * or 0 when src is NULL. Mean replacement, zero ablation and patching from a cache are this op. */
static inline int ps_head_set(ps_ctx *c, float *x, const float *src, int64_t src_stride, int64_t n_seq, int64_t npos,
                              int64_t nh, int64_t hd, int64_t head, int64_t seq0, int64_t seq1) {
    return PS_OP_CALL(c, head_set, x, src, src_stride, n_seq, npos, nh, hd, head, seq0, seq1);
}

/* x[i·width ... + width] += scale · vec[width] for every row i < n_rows (add a steering vector). */
static inline int ps_add_vector(ps_ctx *c, float *x, const float *vec, float scale, int64_t n_rows, int64_t width) {
    return PS_OP_CALL(c, add_vector, x, vec, scale, n_rows, width);
}

/* Strided blocks: for i < n0 and j < n1, the `width` floats at y = dst + i·dst_s0 + j·dst_s1 become
 * those at s = src + i·src_s0 + j·src_s1 (accumulate 0; src NULL: zeros), or get scale · s added
 * (accumulate 1). A stride of 0 reuses one source block (a vector broadcast over sequences or
 * positions). Patching one head, or a range of positions, from another run's activation is this op
 * (dst_s0 / src_s0: a sequence, dst_s1 / src_s1: a position); so is steering one head. The blocks of
 * dst do not overlap each other or src. */
static inline int ps_copy_blocks(ps_ctx *c, float *dst, int64_t dst_s0, int64_t dst_s1, const float *src, int64_t src_s0,
                                 int64_t src_s1, int64_t n0, int64_t n1, int64_t width, int accumulate, float scale) {
    return PS_OP_CALL(c, copy_blocks, dst, dst_s0, dst_s1, src, src_s0, src_s1, n0, n1, width, accumulate, scale);
}

/* sum[i] += Σ_b x[b·n + i] over sequences b = 0 … n_seq − 1, in double, added in sequence order (the
 * same value for any thread count; a mean over prompts is this, then ps_sum_to_mean). sum: [n]
 * doubles, x: [n_seq, n]. */
static inline int ps_accumulate_seqs(ps_ctx *c, double *sum, const float *x, int64_t n_seq, int64_t n) {
    return PS_OP_CALL(c, accumulate_seqs, sum, x, n_seq, n);
}

/* Attribution patching's first-order term per (sequence, head): out[b·nh + h] += Σ_{t < npos} Σ_{i < X}
 * g[b, t, h, i] · (src[sb, t, h, i] − x[b, t, h, i]) with sb = b when src_nseq > 1 (src: [B, npos, nh, X],
 * e.g. an exactly recomputed attention output) else 0 (src: [npos, nh, X], e.g. a mean over prompts); g
 * (a gradient) and x: [B, npos, nh, X] (x NULL: 0). out: B·nh doubles of the context; each term a double sum over
 * t then i in order (the same bits on any thread count). */
static inline int ps_delta_dot(ps_ctx *c, double *out, const float *g, const float *x, const float *src, int64_t src_nseq,
                               int64_t B, int64_t npos, int64_t nh, int64_t X) {
    return PS_OP_CALL(c, delta_dot, out, g, x, src, src_nseq, B, npos, nh, X);
}

/* mean[i] = (float)(sum[i] / count), all [n]. */
static inline int ps_sum_to_mean(ps_ctx *c, float *mean, const double *sum, double count, int64_t n) {
    return PS_OP_CALL(c, sum_to_mean, mean, sum, count, n);
}

/* Roll blocks: x holds W blocks of `stride` floats; in every block i the `len` floats at `off` move to
 * block (i + k) mod W (gate offset cycling: u'_i = u_{(i-k) mod W}). */
static inline int ps_roll_blocks(ps_ctx *c, float *x, int64_t W, int64_t stride, int64_t off, int64_t len, int64_t k) {
    return PS_OP_CALL(c, roll_blocks, x, W, stride, off, len, k);
}

/* ---------------- backward ---------------- */

/* Gate regulariser (docs/mitigations.md): for alpha [B, nW, nkv, W] (windows whose alpha sums to 0 — those
 * that do not fit — are skipped), per KV head g the pooled gate m_g = mean of alpha over the windows,
 * value[0] += weight · Σ_g (log W − H(m_g)) (host double; natural log, 0·log 0 = 0), and dalpha +=
 * its gradient weight · (−∂H/∂alpha) = weight · (log m_g,i + 1) / n_g (m_g,i clamped at 1e-30). */
static inline int ps_gate_entropy(ps_ctx *c, double *value, float *dalpha, const float *alpha, int64_t B, int64_t nW,
                                  int64_t nkv, int64_t W, double weight) {
    return PS_OP_CALL(c, gate_entropy, value, dalpha, alpha, B, nW, nkv, W, weight);
}

/* out = inp · w^T: dinp[M, K] += dout · w (skipped when dinp is NULL); dw[N, K] += dout^T · inp (skipped
 * when dw is NULL: activation gradients only). */
static inline int ps_matmul_backward(ps_ctx *c, float *dinp, float *dw, const float *dout, const float *inp,
                                     const float *w, int64_t M, int64_t K, int64_t N) {
    return PS_OP_CALL(c, matmul_backward, dinp, dw, dout, inp, w, M, K, N);
}

/* dtable[tok[i], :] += dout[i, :] (rows with the same token add in token order: deterministic). */
static inline int ps_embed_backward(ps_ctx *c, float *dtable, const float *dout, const int32_t *tok, int64_t n_tok,
                                    int64_t C) {
    return PS_OP_CALL(c, embed_backward, dtable, dout, tok, n_tok, C);
}

/* dinp[n_rows, C] += ∂/∂inp, dweight[C] += ∂/∂weight of out = rmsnorm(inp) * weight. */
static inline int ps_rmsnorm_backward(ps_ctx *c, float *dinp, float *dweight, const float *dout, const float *inp,
                                      const float *weight, const float *rstd, int64_t n_rows, int64_t C) {
    return PS_OP_CALL(c, rmsnorm_backward, dinp, dweight, dout, inp, weight, rstd, n_rows, C);
}

/* In place: the gradient through ps_rope (the transpose rotation). Same layout as ps_rope. */
static inline int ps_rope_backward(ps_ctx *c, float *dx, const float *cos_t, const float *sin_t, int64_t n_seq,
                                   int64_t rows_per_seq, int64_t n_heads, int64_t hd, int64_t pos_step) {
    return PS_OP_CALL(c, rope_backward, dx, cos_t, sin_t, n_seq, rows_per_seq, n_heads, hd, pos_step);
}

/* h = silu(g) ⊙ u: writes dg and du (=, not +=). */
static inline int ps_swiglu_backward(ps_ctx *c, float *dg, float *du, const float *dh, const float *g, const float *u,
                                     int64_t n) {
    return PS_OP_CALL(c, swiglu_backward, dg, du, dh, g, u, n);
}

/* Gate backward for one branch over the window table of the forward. dalpha, alpha: [B, nW, nkv, W]
 * (dalpha is overwritten with the logit gradient). da [B, T, d] +=, du [W, nkv, d] +=, dbias [W, nkv] +=.
 * (Uniform gates have no parameters and pass no gradient to a: not called.) */
static inline int ps_gate_backward(ps_ctx *c, float *da, float *du, float *dbias, float *dalpha, const float *alpha,
                                   const float *a, const float *u, int64_t d, const ps_windows *win) {
    return PS_WIN_CALL(c, win, gate_backward, GATE_BACKWARD, da, du, dbias, dalpha, alpha, a, u, d, win);
}

/* Payload backward: dP [B, nW, W, nkv*hd] → da [B, T, d] +=, dC +=. scratch: [B, T, nkv*hd] (shared only). */
static inline int ps_payload_backward(ps_ctx *c, float *da, float *dC, const float *dP, const float *a, const float *C,
                                      int shared, float *scratch, int64_t d, int64_t hd, const ps_windows *win) {
    return PS_WIN_CALL(c, win, payload_backward, PAYLOAD_BACKWARD, da, dC, dP, a, C, shared, scratch, d, hd, win);
}

/* Pooling backward: writes dalpha [B, nW, nkv, W] and dP [B, nW, W, nkv*hd] (=). */
static inline int ps_pool_backward(ps_ctx *c, float *dalpha, float *dP, const float *dout, const float *alpha,
                                   const float *P, int64_t B, int64_t nW, int64_t W, int64_t nkv, int64_t hd) {
    return PS_OP_CALL(c, pool_backward, dalpha, dP, dout, alpha, P, B, nW, W, nkv, hd);
}

/* Attention backward from the forward's output z and row log-sum-exp (probabilities recomputed block
 * by block; memory O(T) per thread). Writes dq (=) and accumulates dk, dv, dck, dcv (+=; dck/dcv only
 * for compressed). */
static inline int ps_attn_backward(ps_ctx *c, float *dq, float *dk, float *dv, float *dck, float *dcv, const float *dz,
                                   const float *z, const float *lse, const float *q, const float *k, const float *v,
                                   const float *ck, const float *cv, const ps_attn_geom *g) {
    return PS_ATTN_CALL(c, g, attn_backward, ATTN_BACKWARD, dq, dk, dv, dck, dcv, dz, z, lse, q, k, v, ck, cv, g);
}

/* Backward of ps_select_attn over the same blocks (the selection is a discrete choice: no gradient flows
 * through P, the block scores or the top-k): from dz [B, n, H, D], the forward's z and lse, accumulates
 * (+=) dq [B, n, H, D] and dk, dv [B, L, Hkv, D]; probabilities recomputed from lse. */
static inline int ps_select_backward(ps_ctx *c, float *dq, float *dk, float *dv, const float *dz, const float *z,
                                     const float *lse, const float *q, const float *k, const float *v, const float *blocks,
                                     const ps_sel_geom *g) {
    return PS_SEL_CALL(c, g, select_backward, SELECT_BACKWARD, dq, dk, dv, dz, z, lse, q, k, v, blocks, g);
}

/* Softmax cross-entropy over rows of V logits. For rows with target >= 0: adds -log p[target] to
 * *loss_sum and 1 to *n_targets, and writes dlogits = (softmax - onehot) * scale (dlogits may be NULL:
 * loss only); other rows get dlogits = 0. The sum runs in row order: the same for any thread count. */
static inline int ps_cross_entropy(ps_ctx *c, double *loss_sum, int64_t *n_targets, float *dlogits, const float *logits,
                                   const int32_t *targets, int64_t n_rows, int64_t V, float scale) {
    return PS_OP_CALL(c, cross_entropy, loss_sum, n_targets, dlogits, logits, targets, n_rows, V, scale);
}

/* ---------------- optimizer ---------------- */

/* *out = Σ x[i]² in double, in fixed blocks added in order (the same for any thread count). */
static inline int ps_sumsq(ps_ctx *c, double *out, const float *x, int64_t n) { return PS_OP_CALL(c, sumsq, out, x, n); }

/* One AdamW step over segments of a parameter buffer (w, moments m1/m2 and gradients g share its
 * layout): m1 = b1·m1 + (1-b1)·g', m2 = b2·m2 + (1-b2)·g'², w -= lr·(m̂/(sqrt(v̂)+eps) + wd·w), g' = g·clip. */
static inline int ps_adamw(ps_ctx *c, float *w, float *m1, float *m2, const float *g, const ps_adamw_seg *segs,
                           int n_segs, const ps_adamw_hyper *h) {
    return PS_OP_CALL(c, adamw, w, m1, m2, g, segs, n_segs, h);
}

/* ---------------- DeepSeek-V4 (SPEC-v4; core/v4/) ----------------
 * Layouts: B sequences of T tokens; H heads of Dh; N hc streams of D; nW compressed entries of a layer
 * with rate m; index arrays (rows) and the rotary frequencies are host arrays. Selected indices (topk,
 * experts) are floats holding small integers, -1 for an empty slot. */

/* Rotary tables of the interleaved rope: cos/sin [n_pos, half] = mscale · cos/sin(p · inv_freq[i]), the
 * angle in double (inv_freq: host array [half], plain or YaRN, see ps_v4_rope_inv_freq). */
static inline int ps_v4_rope_table(ps_ctx *c, float *cos_t, float *sin_t, int64_t n_pos, int64_t half,
                                   const double *inv_freq, float mscale) {
    return PS_V4_CALL(c, v4_rope_table, cos_t, sin_t, n_pos, half, inv_freq, mscale);
}

/* In place on x [n_seq, rows_per_seq, n_heads, hd]: the trailing rd channels of every head rotated in
 * interleaved pairs (2i, 2i+1) by the angle of position (row % rows_per_seq) · pos_step:
 * (a, b) -> (a·cos - b·sin, b·cos + a·sin); inverse: by minus the angle (sin negated, cos kept). */
static inline int ps_v4_rope(ps_ctx *c, float *x, const float *cos_t, const float *sin_t, int64_t n_seq,
                             int64_t rows_per_seq, int64_t n_heads, int64_t hd, int64_t rd, int64_t pos_step,
                             int inverse) {
    return PS_V4_CALL(c, v4_rope, x, cos_t, sin_t, n_seq, rows_per_seq, n_heads, hd, rd, pos_step, inverse);
}

/* mHC weights of n rows: mix [n, (2+N)N] = x · fn^T (not yet normalised), x [n, N·D] the streams; the
 * row is divided by rms(x) (eps norm_eps, over N·D). pre = σ(mix·scale[0] + base) + hc_eps, post =
 * 2σ(mix·scale[1] + base), comb [n, N, N] = row softmax(mix·scale[2] + base) + hc_eps, then columns
 * normalised and (iters - 1) × (rows, columns), each x / (sum + hc_eps). Head form (post = comb = NULL):
 * mix [n, N], pre only. Internal arithmetic in double. */
static inline int ps_v4_hc_weights(ps_ctx *c, float *pre, float *post, float *comb, const float *mix, const float *x,
                                   const float *scale, const float *base, int64_t n, int64_t N, int64_t D, int64_t iters,
                                   float hc_eps, float norm_eps) {
    return PS_V4_CALL(c, v4_hc_weights, pre, post, comb, mix, x, scale, base, n, N, D, iters, hc_eps, norm_eps);
}

/* out [n, D] = Σ_j pre[n, j] · h[n, j, :]. */
static inline int ps_v4_hc_collapse(ps_ctx *c, float *out, const float *pre, const float *h, int64_t n, int64_t N,
                                    int64_t D) {
    return PS_V4_CALL(c, v4_hc_collapse, out, pre, h, n, N, D);
}

/* hout [n, N, D]: hout[k] = post[k] · blk + Σ_j comb[j, k] · h[j] (hout must not alias h). */
static inline int ps_v4_hc_expand(ps_ctx *c, float *hout, const float *post, const float *comb, const float *blk,
                                  const float *h, int64_t n, int64_t N, int64_t D) {
    return PS_V4_CALL(c, v4_hc_expand, hout, post, comb, blk, h, n, N, D);
}

/* Compressor gate logits in slot layout: z [B, T, c·d] (c = 2 overlapping, else 1), ape [m, c·d] ->
 * gate [B, nW, S, d]. Overlapping (CSA, S = 2m): slot s < m is token (w-1)m + s's first half (-inf for
 * w = 0), slot m + s token wm + s's second half, each + ape[s, half]. Else (HCA, S = m): token wm + s. */
static inline int ps_v4_comp_slots(ps_ctx *c, float *gate, const float *z, const float *ape, int64_t B, int64_t T,
                                   int64_t nW, int64_t m, int64_t d, int overlap) {
    return PS_V4_CALL(c, v4_comp_slots, gate, z, ape, B, T, nW, m, d, overlap);
}

/* alpha [G, S, d] = softmax over the S slots, per group and channel, of gate [G, S, d] (all -inf: 0). */
static inline int ps_v4_slot_softmax(ps_ctx *c, float *alpha, const float *gate, int64_t n_groups, int64_t S, int64_t d) {
    return PS_V4_CALL(c, v4_slot_softmax, alpha, gate, n_groups, S, d);
}

/* pooled [B, nW, d] = Σ_s alpha[b, w, s, :] · (the slot's kv, laid out as for ps_v4_comp_slots from
 * kv [B, T, c·d]; 0 in the dead slots of window 0). */
static inline int ps_v4_comp_pool(ps_ctx *c, float *pooled, const float *alpha, const float *kv, int64_t B, int64_t T,
                                  int64_t nW, int64_t m, int64_t d, int overlap) {
    return PS_V4_CALL(c, v4_comp_pool, pooled, alpha, kv, B, T, nW, m, d, overlap);
}

/* Lightning-indexer scores [B, T, nW] = Σ_h w[b, t, h] · relu(iq[b, t, h, :] · ik[b, s, :]) · scale
 * (iq [B, T, Hi, Di], ik [B, nW, Di], w [B, T, Hi]); every entry, visible or not. */
static inline int ps_v4_indexer_scores(ps_ctx *c, float *scores, const float *iq, const float *ik, const float *w,
                                       int64_t B, int64_t T, int64_t nW, int64_t Hi, int64_t Di, float scale) {
    return PS_V4_CALL(c, v4_indexer_scores, scores, iq, ik, w, B, T, nW, Hi, Di, scale);
}

/* Top-K of each row of scores [n_rows, n_cols] (+ bias[n_cols] when not NULL) among its visible columns
 * (m > 0: the first min(n_cols, ((row % rows_per_seq) + 1) / m); m = 0: all): idx [n_rows, K] in
 * descending value, ties to the lower column, -1 after the visible ones run out; gap [n_rows] = K-th
 * minus (K+1)-th visible value (+inf when none is left out). NaN ranks lowest. */
static inline int ps_v4_topk(ps_ctx *c, float *idx, float *gap, const float *scores, const float *bias, int64_t n_rows,
                             int64_t n_cols, int64_t K, int64_t rows_per_seq, int64_t m) {
    return PS_V4_CALL(c, v4_topk, idx, gap, scores, bias, n_rows, n_cols, K, rows_per_seq, m);
}

/* Router scores [n] from logits: scoring 0 sqrt(softplus(x)) (torch softplus: x above 20 stays x),
 * 1 sigmoid(x). */
static inline int ps_v4_router_scores(ps_ctx *c, float *scores, const float *logits, int64_t n, int scoring) {
    return PS_V4_CALL(c, v4_router_scores, scores, logits, n, scoring);
}

/* Routing weights [n, k] = scores[e] / (Σ + 1e-20) · scale over the row's experts idx [n, k] (scores
 * [n, E]); an expert listed twice in a row counts once (its later copies get weight 0). An index outside
 * [0, E) fails. */
static inline int ps_v4_route_weights(ps_ctx *c, float *weights, const float *scores, const float *idx, int64_t n,
                                      int64_t E, int64_t k, float scale) {
    return PS_V4_CALL(c, v4_route_weights, weights, scores, idx, n, E, k, scale);
}

/* h = silu(min(g, L)) · clamp(u, -L, L) (no clamp when limit <= 0), all [n]. */
static inline int ps_v4_swiglu_clamp(ps_ctx *c, float *h, const float *g, const float *u, int64_t n, float limit) {
    return PS_V4_CALL(c, v4_swiglu_clamp, h, g, u, n, limit);
}

/* out[rows[i], :] += w[i] · in[i, :], in order of i (rows and w: host arrays). */
static inline int ps_v4_scatter_add_rows(ps_ctx *c, float *out, const float *in, const int64_t *rows, const float *w,
                                         int64_t n, int64_t width) {
    return PS_V4_CALL(c, v4_scatter_add_rows, out, in, rows, w, n, width);
}

/* V4 attention in O(T) memory: out [B, T, H, Dh] = Σ p · value over the entries query t sees (geometry:
 * core/backend.h), the softmax taken over [scaled logits | sink[h]] with the sink column dropped;
 * sinkp [B, H, T] (may be NULL) = the probability mass on the sink. */
static inline int ps_v4_attn(ps_ctx *c, float *out, float *sinkp, const float *q, const float *kv, const float *ckv,
                             const float *topk, const float *sink, const ps_v4_attn_geom *g) {
    return PS_V4_CALL(c, v4_attn, out, sinkp, q, kv, ckv, topk, sink, g);
}

/* The materialised path (only for hooks on bias, logits or pattern): bias [B, T, T + nW] (0 where query t
 * sees the column, -inf elsewhere; raw columns first); logits [B, H, T, T + nW] = q·key·scale + bias;
 * pattern (may alias logits) and sinkp [B, H, T] the softmax over [logits | sink] split; out = pattern ·
 * values. */
static inline int ps_v4_attn_bias(ps_ctx *c, float *bias, const float *topk, const ps_v4_attn_geom *g) {
    return PS_V4_CALL(c, v4_attn_bias, bias, topk, g);
}
static inline int ps_v4_attn_logits(ps_ctx *c, float *logits, const float *q, const float *kv, const float *ckv,
                                    const float *bias, const ps_v4_attn_geom *g) {
    return PS_V4_CALL(c, v4_attn_logits, logits, q, kv, ckv, bias, g);
}
static inline int ps_v4_attn_softmax(ps_ctx *c, float *pattern, float *sinkp, const float *logits, const float *sink,
                                     const ps_v4_attn_geom *g) {
    return PS_V4_CALL(c, v4_attn_softmax, pattern, sinkp, logits, sink, g);
}
static inline int ps_v4_attn_apply(ps_ctx *c, float *out, const float *pattern, const float *kv, const float *ckv,
                                   const ps_v4_attn_geom *g) {
    return PS_V4_CALL(c, v4_attn_apply, out, pattern, kv, ckv, g);
}

/* After a hook changed the sink mass [B, H, T]: out[b, t, h, :] *= (1 - new) / (1 - old) where they differ. */
static inline int ps_v4_sink_rescale(ps_ctx *c, float *out, const float *sink_old, const float *sink_new,
                                     const ps_v4_attn_geom *g) {
    return PS_V4_CALL(c, v4_sink_rescale, out, sink_old, sink_new, g);
}

/* Block-diagonal linear: out [M, G·Ng], group g = inp[:, g·Kg : (g+1)·Kg] · w[g·Ng : (g+1)·Ng, :]^T
 * (inp [M, G·Kg], w [G·Ng, Kg]). */
static inline int ps_v4_grouped_linear(ps_ctx *c, float *out, const float *inp, const float *w, int64_t M, int64_t G,
                                       int64_t Kg, int64_t Ng) {
    return PS_V4_CALL(c, v4_grouped_linear, out, inp, w, M, G, Kg, Ng);
}

/* x[n] *= s. */
static inline int ps_v4_scale(ps_ctx *c, float *x, float s, int64_t n) { return PS_V4_CALL(c, v4_scale, x, s, n); }
/* ---- the trainable V4 compressor (attention kind "v4" of the controlled model, docs/training.md): the
 * backward ops. Each writes (=) its input gradients unless it says += ---- */

/* Backward of ps_v4_comp_slots: dz [B, T, c·d] (=; 0 for the channels of tokens no live slot reads) from
 * dgate [B, nW, S, d] (dead slots ignored); dape [m, c·d] += the slot's sum over sequences and windows. */
static inline int ps_v4_comp_slots_backward(ps_ctx *c, float *dz, float *dape, const float *dgate, int64_t B, int64_t T,
                                            int64_t nW, int64_t m, int64_t d, int overlap) {
    return PS_V4_CALL(c, v4_comp_slots_backward, dz, dape, dgate, B, T, nW, m, d, overlap);
}

/* Backward of ps_v4_slot_softmax: dgate [G, S, d] = alpha ⊙ (dalpha − Σ_s alpha·dalpha) per group and
 * channel (0 where alpha is 0: dead slots). */
static inline int ps_v4_slot_softmax_backward(ps_ctx *c, float *dgate, const float *dalpha, const float *alpha,
                                              int64_t n_groups, int64_t S, int64_t d) {
    return PS_V4_CALL(c, v4_slot_softmax_backward, dgate, dalpha, alpha, n_groups, S, d);
}

/* Backward of ps_v4_comp_pool: dalpha [B, nW, S, d] (=; 0 in dead slots) and dkv [B, T, c·d] (=; 0 where
 * no live slot reads) from dpooled [B, nW, d]. */
static inline int ps_v4_comp_pool_backward(ps_ctx *c, float *dalpha, float *dkv, const float *dpooled, const float *alpha,
                                           const float *kv, int64_t B, int64_t T, int64_t nW, int64_t m, int64_t d,
                                           int overlap) {
    return PS_V4_CALL(c, v4_comp_pool_backward, dalpha, dkv, dpooled, alpha, kv, B, T, nW, m, d, overlap);
}

/* Backward of ps_v4_attn over every visible entry (g->K must be 0: the indexer's selection has no
 * backward): out is the forward's output and dout its gradient [B, T, H, Dh]. Writes dq (=); dkv [B, T, Dh]
 * += (keys and values alike: K = V), dckv [B, nW, Dh] += (may be NULL when nW = 0), dsink [H] += (may be
 * NULL). Probabilities are recomputed row by row (O(T) scratch). */
static inline int ps_v4_attn_backward(ps_ctx *c, float *dq, float *dkv, float *dckv, float *dsink, const float *dout,
                                      const float *out, const float *q, const float *kv, const float *ckv,
                                      const float *sink, const ps_v4_attn_geom *g) {
    return PS_V4_CALL(c, v4_attn_backward, dq, dkv, dckv, dsink, dout, out, q, kv, ckv, sink, g);
}
/* ---- the DeepSeek-V4 KV cache's ops (core/v4/v4_kvcache.h; the geometry in core/backend.h) ---- */
/* The check every backend's v4_kv_attend makes first (core/cpu/kv_v4.c): sizes, and page lists that hold the
 * rows it reads; 0, or -1 with the context failed. */
int ps_v4_kv_attn_check(ps_ctx *c, const ps_v4_kv_attn *a);
/* out [n, H, Dh] and sinkp [H, n] (the sink's probability) of the queries q [n, H, Dh] over the pages
 * (ps_v4_kv_attn): per row and head, the scaled dot products with the raw rows then the entries, a softmax
 * over them and the sink logit sink[h] (a column without a value), out = Σ p · key (K = V). topk: [n, a->K]
 * (a buffer; NULL when a->K = 0). As ps_v4_attn's arithmetic per query (the CPU: the same loops). */
static inline int ps_v4_kv_attend(ps_ctx *c, float *out, float *sinkp, const float *q, const float *topk, const float *sink,
                                  const ps_v4_kv_attn *a) {
    return PS_V4_CALL(c, v4_kv_attend, out, sinkp, q, topk, sink, a);
}
/* gate [S, hd] (S = m, 2m for CSA) of the window k->wi closing: slot s, channel i is z[tok_s, chb_s + i] +
 * ape[(s % m)*cw + chb_s + i], -inf for a slot without a token (ps_kv_chan; ps_kv_slots before its softmax). */
static inline int ps_v4_kv_slots(ps_ctx *c, float *gate, const float *ape, const ps_kv_chan *k) {
    return PS_V4_CALL(c, v4_kv_slots, gate, ape, k);
}
/* ---------------- end DeepSeek-V4 ---------------- */

#endif
