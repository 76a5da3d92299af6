/* ops.h — the compute seam: every numeric kernel the model calls, over plain float arrays.
 * The CPU implementation (ops_cpu.c) uses OpenBLAS sgemm and OpenMP; a CUDA backend will provide
 * the same functions later. Shapes are row-major and stated per function; all sizes are int64. */
#ifndef PS_OPS_H
#define PS_OPS_H

#include <stdint.h>
#include <string.h>

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

/* Dot product of a[n] and b[n] in float with 16 interleaved partial sums added in a fixed order: the same
 * result on every call and thread count, and the loop vectorises (an in-order float sum does not). */
static inline float ps_dot(const float *a, const float *b, int64_t n) {
    float acc[16] = {0};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++) acc[l] += a[i + l] * b[i + l];
    for (int l = 0; i < n; i++, l++) acc[l] += a[i] * b[i];
    for (int w = 8; w >= 1; w /= 2)
        for (int l = 0; l < w; l++) acc[l] += acc[l + w];
    return acc[0];
}

/* Σ a[i]·b[i] in double with 8 interleaved accumulators added in a fixed order (vectorises; the same
 * result on every call). */
static inline double ps_dot_d(const float *a, const float *b, int64_t n) {
    double acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) acc[l] += (double)a[i + l] * b[i + l];
    for (int l = 0; i < n; i++, l++) acc[l] += (double)a[i] * b[i];
    return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

/* out[M, N] (= or +=) inp[M, K] · w[N, K]^T  (a linear layer without bias). */
void ps_matmul(float *out, const float *inp, const float *w, int64_t M, int64_t K, int64_t N, int accumulate);

/* out[b, t, :] = table[tok[b, t], :]; table: [V, C]. Tokens are validated by the caller. */
void ps_embed(float *out, const int32_t *tok, const float *table, int64_t n_tok, int64_t C);

/* RMSNorm over rows of C: out = inp / sqrt(mean(inp^2) + eps) * weight; rstd[n_rows] is kept for the
 * backward. out may alias inp. */
void ps_rmsnorm(float *out, float *rstd, const float *inp, const float *weight, int64_t n_rows, int64_t C, float eps);

/* Rotate-half RoPE tables: cos/sin [n_pos, hd/2] with angles p·theta^(-2i/hd) in double precision. */
void ps_rope_table(float *cos_t, float *sin_t, int64_t n_pos, int64_t hd, double theta);

/* In-place RoPE on x: [n_seq, rows_per_seq, n_heads, hd]; row r of a sequence sits at position r·pos_step. */
void ps_rope(float *x, const float *cos_t, const float *sin_t, int64_t n_seq, int64_t rows_per_seq, int64_t n_heads,
             int64_t hd, int64_t pos_step);

/* SwiGLU: h = silu(g) ⊙ u, all [n]. */
void ps_swiglu(float *h, const float *g, const float *u, int64_t n);

/* out = a + b, all [n]. out may alias a. */
void ps_add(float *out, const float *a, const float *b, int64_t n);

/* Compressor gate for one branch (SPEC §2). a: [B, T, d]; u: [W, nkv, d] and c: [W, nkv], or u = NULL
 * for the uniform gate. Writes logits z and alpha = softmax_i(z): both [B, nW, nkv, W]. */
void ps_gate(float *z, float *alpha, const float *a, const float *u, const float *c, int64_t B, int64_t T, int64_t d,
             int64_t nW, int64_t W, int64_t S, int64_t nkv);

/* Compressor payloads for one branch: P[b, j, i, :] = C_i a[b, jS+i, :]. per_offset: C is [W, nkvhd, d];
 * shared: C is [nkvhd, d] (scratch: [B, T, nkvhd], only for shared). P: [B, nW, W, nkvhd]. */
void ps_payload(float *P, const float *a, const float *C, int shared, float *scratch, int64_t B, int64_t T, int64_t d,
                int64_t nW, int64_t W, int64_t S, int64_t nkvhd);

/* Pooling: out[b, j, g, :] = sum_i alpha[b, j, g, i] P[b, j, i, g*hd : (g+1)*hd]. out: [B, nW, nkv, hd]. */
void ps_pool(float *out, const float *alpha, const float *P, int64_t B, int64_t nW, int64_t W, int64_t nkv, int64_t hd);

/* Attention geometry shared by the probability and output kernels. */
typedef struct {
    int64_t B, T, nh, nkv, hd;
    int compressed;
    int64_t W, S, LW; /* compressed only: window, stride, effective local window min(local_window, T) */
    int64_t nW;       /* compressed windows (0 for full attention) */
    int64_t ncols;    /* columns of a probability row: T (full) or nW + LW (compressed) */
} ps_attn_geom;

/* Probability rows. q: [B, T, nh, hd]; k: [B, T, nkv, hd]; ck: [B, nW, nkv, hd] (compressed).
 * probs: [B, nh, T, ncols]. Full: column t' = raw position. Compressed: columns 0..nW-1 are the
 * windows, column nW+m the raw position t-LW+1+m. Entries a query does not see are 0. */
void ps_attn_probs(float *probs, const float *q, const float *k, const float *ck, const ps_attn_geom *g);

/* z[b, t, n, :] = sum over columns of probs · value (raw v: [B, T, nkv, hd], compressed cv: [B, nW, nkv, hd]). */
void ps_attn_out(float *z, const float *probs, const float *v, const float *cv, const ps_attn_geom *g);

/* Number of compressed windows ended by position t: windows j with jS + W - 1 <= t, capped at nW. */
static inline int64_t ps_windows_seen(int64_t t, int64_t W, int64_t S, int64_t nW) {
    if (t < W - 1) return 0;
    int64_t n = (t - W + 1) / S + 1;
    return n < nW ? n : nW;
}

/* ---- backward kernels: each accumulates (+=) into its gradient outputs unless stated ---- */

/* out = inp · w^T: dinp[M, K] += dout · w (skipped when dinp is NULL); dw[N, K] += dout^T · inp. */
void ps_matmul_backward(float *dinp, float *dw, const float *dout, const float *inp, const float *w, int64_t M,
                        int64_t K, int64_t N);

/* dinp[n_rows, C] += ∂/∂inp, dweight[C] += ∂/∂weight of out = rmsnorm(inp) * weight. */
void ps_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp, const float *weight,
                         const float *rstd, int64_t n_rows, int64_t C);

/* In place: the gradient through ps_rope (the transpose rotation). Same layout as ps_rope. */
void ps_rope_backward(float *dx, const float *cos_t, const float *sin_t, int64_t n_seq, int64_t rows_per_seq,
                      int64_t n_heads, int64_t hd, int64_t pos_step);

/* h = silu(g) ⊙ u: writes dg and du (=, not +=). */
void ps_swiglu_backward(float *dg, float *du, const float *dh, const float *g, const float *u, int64_t n);

/* Gate backward for one branch. dalpha, alpha: [B, nW, nkv, W] (dalpha is overwritten with the logit
 * gradient). da [B, T, d] +=, du [W, nkv, d] +=, dc [W, nkv] +=. (Uniform gates have no parameters
 * and pass no gradient to a: not called.) */
void ps_gate_backward(float *da, float *du, float *dc, float *dalpha, const float *alpha, const float *a,
                      const float *u, int64_t B, int64_t T, int64_t d, int64_t nW, int64_t W, int64_t S, int64_t nkv);

/* Payload backward: dP [B, nW, W, nkvhd] → da [B, T, d] +=, dC +=. scratch: [B, T, nkvhd] (shared only). */
void ps_payload_backward(float *da, float *dC, const float *dP, const float *a, const float *C, int shared,
                         float *scratch, int64_t B, int64_t T, int64_t d, int64_t nW, int64_t W, int64_t S,
                         int64_t nkvhd);

/* Pooling backward: writes dalpha [B, nW, nkv, W] and dP [B, nW, W, nkv*hd] (=). */
void ps_pool_backward(float *dalpha, float *dP, const float *dout, const float *alpha, const float *P, int64_t B,
                      int64_t nW, int64_t W, int64_t nkv, int64_t hd);

/* Attention backward given the stored probabilities. Writes dq (=) and accumulates dk, dv, dck, dcv
 * (+=; dck/dcv only for compressed). dprobs: scratch of the probs layout. O(T·ncols·hd) per head. */
void ps_attn_backward(float *dq, float *dk, float *dv, float *dck, float *dcv, float *dprobs, const float *dz,
                      const float *probs, const float *q, const float *k, const float *v, const float *ck,
                      const float *cv, const ps_attn_geom *g);

/* Softmax cross-entropy over rows of V logits. For rows with target >= 0: adds -log p[target] to
 * *loss_sum and writes dlogits = (softmax - onehot) * scale; other rows get dlogits = 0. Returns the
 * number of target rows, or -1 when its per-row scratch cannot be allocated (nothing added then). */
int64_t ps_cross_entropy(double *loss_sum, float *dlogits, const float *logits, const int32_t *targets, int64_t n_rows,
                         int64_t V, float scale);

/* Attention output for chosen query rows only (row r = b·T + t): z_rows[n, nh·hd] from the kept q, k, v
 * (and ck, cv when compressed), the same math as ps_attn_probs + ps_attn_out. */
void ps_attn_rows(float *z_rows, const int64_t *rows, int64_t n, const float *q, const float *k, const float *v,
                  const float *ck, const float *cv, const ps_attn_geom *g);

#endif
