/* elementwise.cu — the CUDA backend's row and elementwise ops: embedding (and its deterministic
 * backward), RMSNorm (forward and backward; weight gradients summed in fixed blocks, then in block order),
 * RoPE (tables in double, rotation, its transpose), SwiGLU, add/copy/fill, row gathers and scatters,
 * the pattern-hook layouts and the hook actions (head set, add vector, roll, strided block copies, sums
 * over sequences). Semantics: core/ops.h; reference: core/cpu/. */
#include <stdlib.h>
#include <string.h>

#include "core/cuda/cuda_internal.cuh"
#include "core/cuda/grid_bodies.h"

#define T256 256

/* ---------------- embedding ---------------- */

__global__ void k_embed(float *out, const int32_t *tok, const float *table, int64_t n_tok, int64_t C) {
    GS_LOOP(i, n_tok * C) out[i] = table[(int64_t)tok[i / C] * C + i % C];
}

extern "C" int ps_cuda_embed(ps_ctx *c, float *out, const int32_t *tok, const float *table, int64_t n_tok, int64_t C) {
    if (n_tok <= 0 || C <= 0) return 0;
    const void *h[1] = {tok};
    int64_t by[1] = {n_tok * (int64_t)sizeof(int32_t)};
    void *d[1];
    if (cu_stage(c, 1, h, by, d)) return -1;
    k_embed<<<cu_grid(n_tok * C, T256), T256, 0, STREAM(c)>>>(out, (const int32_t *)d[0], table, n_tok, C);
    return CU_LAUNCHED(c, "embed");
}

/* dtable[u, e] += dout[i, e] for the rows i of token u, in token order (the CPU's order: bit-identical).
 * Tokens are grouped on the host: uniq[U], start[U + 1], idx[n_tok]. */
__global__ void k_embed_backward(float *dtable, const float *dout, const int32_t *uniq, const int32_t *start,
                                 const int32_t *idx, int64_t U, int64_t C) {
    GS_LOOP(i, U * C) {
        int64_t u = i / C, e = i % C;
        float *p = dtable + (int64_t)uniq[u] * C + e;
        float acc = *p;
        for (int32_t k = start[u]; k < start[u + 1]; k++) acc += dout[(int64_t)idx[k] * C + e];
        *p = acc;
    }
}

typedef struct {
    int32_t tok, i;
} tok_pos;

static int cmp_tok_pos(const void *a, const void *b) {
    const tok_pos *x = (const tok_pos *)a, *y = (const tok_pos *)b;
    if (x->tok != y->tok) return x->tok < y->tok ? -1 : 1;
    return x->i < y->i ? -1 : x->i > y->i;
}

extern "C" int ps_cuda_embed_backward(ps_ctx *c, float *dtable, const float *dout, const int32_t *tok, int64_t n_tok,
                                      int64_t C) {
    if (n_tok <= 0 || C <= 0) return 0;
    if (n_tok > INT32_MAX) return ps_ctx_fail(c, "cuda embed backward: %lld tokens (at most 2^31 - 1)", (long long)n_tok);
    tok_pos *tp = (tok_pos *)malloc((size_t)n_tok * sizeof *tp);
    int32_t *buf = (int32_t *)malloc((size_t)(3 * n_tok + 1) * sizeof(int32_t));
    if (!tp || !buf) {
        free(tp);
        free(buf);
        return ps_ctx_fail(c, "cuda embed backward: out of host memory for %lld tokens", (long long)n_tok);
    }
    for (int64_t i = 0; i < n_tok; i++) tp[i].tok = tok[i], tp[i].i = (int32_t)i;
    qsort(tp, (size_t)n_tok, sizeof *tp, cmp_tok_pos);
    int32_t *uniq = buf, *start = buf + n_tok, *idx = buf + 2 * n_tok + 1;
    int64_t U = 0;
    for (int64_t k = 0; k < n_tok; k++) {
        if (k == 0 || tp[k].tok != tp[k - 1].tok) {
            uniq[U] = tp[k].tok;
            start[U++] = (int32_t)k;
        }
        idx[k] = tp[k].i;
    }
    start[U] = (int32_t)n_tok;
    const void *h[3] = {uniq, start, idx};
    int64_t by[3] = {U * 4, (U + 1) * 4, n_tok * 4};
    void *d[3];
    int rc = cu_stage(c, 3, h, by, d);
    free(tp);
    free(buf);
    if (rc) return -1;
    k_embed_backward<<<cu_grid(U * C, T256), T256, 0, STREAM(c)>>>(dtable, dout, (const int32_t *)d[0], (const int32_t *)d[1],
                                                                 (const int32_t *)d[2], U, C);
    return CU_LAUNCHED(c, "embed backward");
}

/* ---------------- RMSNorm ---------------- */

__global__ void k_rmsnorm(float *out, float *rstd, const float *inp, const float *w, int64_t n_rows, int64_t C, float eps) {
    __shared__ double sh[32];
    for (int64_t r = blockIdx.x; r < n_rows; r += gridDim.x) {
        const float *x = inp + r * C;
        float *o = out + r * C;
        double ss = 0;
        for (int64_t i = threadIdx.x; i < C; i += blockDim.x) ss += (double)x[i] * x[i];
        ss = block_sum(ss, sh);
        float s = (float)(1.0 / sqrt(ss / (double)C + (double)eps));
        if (rstd && threadIdx.x == 0) rstd[r] = s;
        for (int64_t i = threadIdx.x; i < C; i += blockDim.x) o[i] = x[i] * s * w[i];
        __syncthreads();
    }
}

extern "C" int ps_cuda_rmsnorm(ps_ctx *c, float *out, float *rstd, const float *inp, const float *weight, int64_t n_rows,
                               int64_t C, float eps) {
    if (n_rows <= 0 || C <= 0) return 0;
    int t = cu_row_threads(C);
    k_rmsnorm<<<cu_grid(n_rows, 1), t, 0, STREAM(c)>>>(out, rstd, inp, weight, n_rows, C, eps);
    return CU_LAUNCHED(c, "rmsnorm");
}

#define RMS_RB 16 /* rows per block of the backward (the weight-gradient partials) */

__global__ void k_rmsnorm_backward(float *dinp, float *part, const float *dout, const float *inp, const float *w,
                                   const float *rstd, int64_t n_rows, int64_t C) {
    __shared__ double sh[32];
    int64_t blk = blockIdx.x, r0 = blk * RMS_RB, r1 = r0 + RMS_RB < n_rows ? r0 + RMS_RB : n_rows;
    float *pp = part + blk * C;
    for (int64_t i = threadIdx.x; i < C; i += blockDim.x) pp[i] = 0.0f;
    for (int64_t r = r0; r < r1; r++) {
        const float *x = inp + r * C, *dy = dout + r * C;
        float s = rstd[r];
        double dot = 0;
        for (int64_t i = threadIdx.x; i < C; i += blockDim.x) dot += (double)dy[i] * w[i] * x[i];
        dot = block_sum(dot, sh);
        float coef = (float)(dot * (double)s * s * s / (double)C);
        float *dx = dinp + r * C;
        for (int64_t i = threadIdx.x; i < C; i += blockDim.x) {
            dx[i] += s * w[i] * dy[i] - coef * x[i];
            pp[i] += dy[i] * x[i] * s;
        }
    }
}

/* out[i] += Σ_b part[b, i] (b = 0 … nb - 1) in a fixed tree: one block per column. */
__global__ void k_colsum(float *out, const float *part, int64_t nb, int64_t C) {
    __shared__ double sh[32];
    for (int64_t i = blockIdx.x; i < C; i += gridDim.x) {
        double acc = 0;
        for (int64_t b = threadIdx.x; b < nb; b += blockDim.x) acc += part[b * C + i];
        acc = block_sum(acc, sh);
        if (threadIdx.x == 0) out[i] += (float)acc;
    }
}

extern "C" int ps_cuda_rmsnorm_backward(ps_ctx *c, float *dinp, float *dweight, const float *dout, const float *inp,
                                        const float *weight, const float *rstd, int64_t n_rows, int64_t C) {
    if (n_rows <= 0 || C <= 0) return 0;
    int64_t nb = (n_rows + RMS_RB - 1) / RMS_RB;
    if (nb > 2147483647) return ps_ctx_fail(c, "cuda rmsnorm backward: %lld rows", (long long)n_rows);
    float *part = ps_ctx_workspace(c, nb * C);
    if (!part) return -1;
    k_rmsnorm_backward<<<(unsigned)nb, cu_row_threads(C), 0, STREAM(c)>>>(dinp, part, dout, inp, weight, rstd, n_rows, C);
    if (CU_LAUNCHED(c, "rmsnorm backward")) return -1;
    k_colsum<<<cu_grid(C, 1), cu_row_threads(nb), 0, STREAM(c)>>>(dweight, part, nb, C);
    return CU_LAUNCHED(c, "rmsnorm backward (weight)");
}

/* ---------------- RoPE ---------------- */

__global__ void k_rope_table(float *cs, float *sn, int64_t n_pos, int64_t hd, double theta) {
    int64_t half = hd / 2;
    GS_LOOP(idx, n_pos * half) {
        int64_t p = idx / half, i = idx % half;
        double f = pow(theta, -2.0 * (double)i / (double)hd), ang = (double)p * f;
        cs[idx] = (float)cos(ang);
        sn[idx] = (float)sin(ang);
    }
}

extern "C" int ps_cuda_rope_table(ps_ctx *c, float *cos_t, float *sin_t, int64_t n_pos, int64_t hd, double theta) {
    if (n_pos <= 0 || hd < 2) return 0;
    k_rope_table<<<cu_grid(n_pos * (hd / 2), T256), T256, 0, STREAM(c)>>>(cos_t, sin_t, n_pos, hd, theta);
    return CU_LAUNCHED(c, "rope table");
}

__global__ void k_rope(float *x, const float *cs, const float *sn, int64_t n_rows, int64_t rows_per_seq, int64_t nh,
                       int64_t hd, int64_t pos_step, float dir) {
    int64_t half = hd / 2;
    GS_LOOP(idx, n_rows * nh * half) {
        int64_t i = idx % half, rh = idx / half, r = rh / nh;
        int64_t pos = (r % rows_per_seq) * pos_step;
        float *v = x + rh * hd;
        float a = v[i], b = v[i + half], co = cs[pos * half + i], s = dir * sn[pos * half + i];
        v[i] = a * co - b * s;
        v[i + half] = b * co + a * s;
    }
}

static int rope(ps_ctx *c, float *x, const float *cos_t, const float *sin_t, int64_t n_seq, int64_t rows_per_seq,
                int64_t n_heads, int64_t hd, int64_t pos_step, float dir, const char *what) {
    int64_t n = n_seq * rows_per_seq * n_heads * (hd / 2);
    if (n <= 0) return 0;
    k_rope<<<cu_grid(n, T256), T256, 0, STREAM(c)>>>(x, cos_t, sin_t, n_seq * rows_per_seq, rows_per_seq, n_heads, hd,
                                                    pos_step, dir);
    return CU_LAUNCHED(c, what);
}

extern "C" int ps_cuda_rope(ps_ctx *c, float *x, const float *cos_t, const float *sin_t, int64_t n_seq,
                            int64_t rows_per_seq, int64_t n_heads, int64_t hd, int64_t pos_step) {
    return rope(c, x, cos_t, sin_t, n_seq, rows_per_seq, n_heads, hd, pos_step, 1.0f, "rope");
}

extern "C" int ps_cuda_rope_backward(ps_ctx *c, float *dx, const float *cos_t, const float *sin_t, int64_t n_seq,
                                     int64_t rows_per_seq, int64_t n_heads, int64_t hd, int64_t pos_step) {
    return rope(c, dx, cos_t, sin_t, n_seq, rows_per_seq, n_heads, hd, pos_step, -1.0f, "rope backward");
}

/* ---------------- elementwise ---------------- */

__global__ void k_swiglu(float *h, const float *g, const float *u, int64_t n) {
    GS_LOOP(i, n) {
        float x = g[i];
        h[i] = x / (1.0f + expf(-x)) * u[i];
    }
}

extern "C" int ps_cuda_swiglu(ps_ctx *c, float *h, const float *g, const float *u, int64_t n) {
    if (n <= 0) return 0;
    k_swiglu<<<cu_grid(n, T256), T256, 0, STREAM(c)>>>(h, g, u, n);
    return CU_LAUNCHED(c, "swiglu");
}

__global__ void k_swiglu_backward(float *dg, float *du, const float *dh, const float *g, const float *u, int64_t n) {
    GS_LOOP(i, n) {
        float x = g[i], sg = 1.0f / (1.0f + expf(-x)), silu = x * sg;
        du[i] = dh[i] * silu;
        dg[i] = dh[i] * u[i] * sg * (1.0f + x * (1.0f - sg));
    }
}

extern "C" int ps_cuda_swiglu_backward(ps_ctx *c, float *dg, float *du, const float *dh, const float *g, const float *u,
                                       int64_t n) {
    if (n <= 0) return 0;
    k_swiglu_backward<<<cu_grid(n, T256), T256, 0, STREAM(c)>>>(dg, du, dh, g, u, n);
    return CU_LAUNCHED(c, "swiglu backward");
}

__global__ void k_add(float *out, const float *a, const float *b, int64_t n) { GS_LOOP(i, n) out[i] = a[i] + b[i]; }

extern "C" int ps_cuda_add(ps_ctx *c, float *out, const float *a, const float *b, int64_t n) {
    if (n <= 0) return 0;
    k_add<<<cu_grid(n, T256), T256, 0, STREAM(c)>>>(out, a, b, n);
    return CU_LAUNCHED(c, "add");
}

extern "C" int ps_cuda_copy(ps_ctx *c, float *dst, const float *src, int64_t n) {
    if (n <= 0 || dst == src) return 0;
    return cu_check(c, cudaMemcpyAsync(dst, src, (size_t)n * sizeof(float), cudaMemcpyDeviceToDevice, STREAM(c)), "copy");
}

__global__ void k_fill(float *x, float v, int64_t n) { GS_LOOP(i, n) x[i] = v; }

extern "C" int ps_cuda_fill(ps_ctx *c, float *x, float value, int64_t n) {
    if (n <= 0) return 0;
    if (value == 0.0f)
        return cu_check(c, cudaMemsetAsync(x, 0, (size_t)n * sizeof(float), STREAM(c)), "fill");
    k_fill<<<cu_grid(n, T256), T256, 0, STREAM(c)>>>(x, value, n);
    return CU_LAUNCHED(c, "fill");
}

/* ---------------- rows ---------------- */

__global__ void k_gather_rows(float *out, const float *in, const float *add, const int64_t *rows, int64_t n, int64_t width) {
    GS_LOOP(i, n * width) {
        int64_t r = i / width, e = i % width;
        float v = in[rows[r] * width + e];
        out[i] = add ? v + add[i] : v;
    }
}

extern "C" int ps_cuda_gather_rows(ps_ctx *c, float *out, const float *in, const float *add, const int64_t *rows, int64_t n,
                                   int64_t width) {
    if (n <= 0 || width <= 0) return 0;
    const void *h[1] = {rows};
    int64_t by[1] = {n * 8};
    void *d[1];
    if (cu_stage(c, 1, h, by, d)) return -1;
    k_gather_rows<<<cu_grid(n * width, T256), T256, 0, STREAM(c)>>>(out, in, add, (const int64_t *)d[0], n, width);
    return CU_LAUNCHED(c, "gather rows");
}

/* pairs (destination row, source row), one per destination */
__global__ void k_scatter_rows(float *out, const float *in, const int64_t *pairs, int64_t n, int64_t width) {
    GS_LOOP(i, n * width) {
        int64_t k = i / width, e = i % width;
        out[pairs[2 * k] * width + e] = in[pairs[2 * k + 1] * width + e];
    }
}

static int cmp_pair(const void *a, const void *b) {
    const int64_t *x = (const int64_t *)a, *y = (const int64_t *)b;
    if (x[0] != y[0]) return x[0] < y[0] ? -1 : 1;
    return x[1] < y[1] ? -1 : x[1] > y[1];
}

extern "C" int ps_cuda_scatter_rows(ps_ctx *c, float *out, const float *in, const int64_t *rows, int64_t n, int64_t width) {
    if (n <= 0 || width <= 0) return 0;
    /* a row listed twice gets its last source (the CPU's serial loop): keep the last pair of each */
    int64_t *pr = (int64_t *)malloc((size_t)n * 2 * sizeof(int64_t));
    if (!pr) return ps_ctx_fail(c, "cuda scatter rows: out of host memory");
    for (int64_t i = 0; i < n; i++) pr[2 * i] = rows[i], pr[2 * i + 1] = i;
    qsort(pr, (size_t)n, 2 * sizeof(int64_t), cmp_pair);
    int64_t m = 0;
    for (int64_t i = 0; i < n; i++) {
        if (i + 1 < n && pr[2 * (i + 1)] == pr[2 * i]) continue;
        pr[2 * m] = pr[2 * i], pr[2 * m + 1] = pr[2 * i + 1];
        m++;
    }
    const void *h[1] = {pr};
    int64_t by[1] = {m * 16};
    void *d[1];
    int rc = cu_stage(c, 1, h, by, d);
    free(pr);
    if (rc) return -1;
    k_scatter_rows<<<cu_grid(m * width, T256), T256, 0, STREAM(c)>>>(out, in, (const int64_t *)d[0], m, width);
    return CU_LAUNCHED(c, "scatter rows");
}

/* ---------------- pattern-hook layouts ---------------- */

__global__ void k_pattern_expand(float *full, const float *probs, int64_t rows, int64_t T, int64_t nW, int64_t LW,
                                 int64_t nc) {
    int64_t wide = nW + T;
    GS_LOOP(i, rows * wide) {
        int64_t r = i / wide, col = i % wide, t = r % T;
        float v = 0.0f;
        if (col < nW) v = probs[r * nc + col];
        else {
            int64_t m = (col - nW) - (t - LW + 1);
            if (m >= 0 && m < LW) v = probs[r * nc + nW + m];
        }
        full[i] = v;
    }
}

extern "C" int ps_cuda_pattern_expand(ps_ctx *c, float *full, const float *probs, const ps_attn_geom *g) {
    if (cu_geom_check(c, "pattern expand", g)) return -1; /* ncols: the row stride of probs */
    int64_t rows = g->B * g->nh * g->T, T = g->T;
    if (rows <= 0) return 0;
    if (!g->compressed) return full == probs ? 0 : ps_cuda_copy(c, full, probs, rows * T);
    k_pattern_expand<<<cu_grid(rows * (g->nW + T), T256), T256, 0, STREAM(c)>>>(full, probs, rows, T, g->nW, g->LW, g->ncols);
    return CU_LAUNCHED(c, "pattern expand");
}

__global__ void k_pattern_compact_full(float *probs, const float *full, int64_t rows, int64_t T) {
    GS_LOOP(i, rows * T) {
        int64_t t = (i / T) % T, col = i % T;
        probs[i] = col <= t ? full[i] : 0.0f;
    }
}

/* rows (b, n, t); the windows t sees through KV head n / grp of sequence b: ops.h ps_geom_seen (woff [B, nkv],
 * cend [B, nW]: device copies, NULL for the base grid) */
__global__ void k_pattern_compact(float *probs, const float *full, int64_t rows, int64_t T, int64_t nW, int64_t W,
                                  int64_t S, int64_t LW, int64_t nc, int64_t nh, int64_t nkv, const int64_t *woff,
                                  const int64_t *cend) {
    int64_t wide = nW + T;
    GS_LOOP(i, rows * nc) {
        int64_t r = i / nc, col = i % nc, t = r % T, b = r / (nh * T), kvh = (r / T) % nh / (nh / nkv);
        float v = 0.0f;
        if (col < nW) {
            if (col < ps_entries_seen(cend ? cend + b * nW : NULL, woff ? woff[b * nkv + kvh] : 0, W, S, nW, t))
                v = full[r * wide + col];
        } else {
            int64_t tp = t - LW + 1 + (col - nW);
            if (tp >= 0) v = full[r * wide + nW + tp];
        }
        probs[i] = v;
    }
}

extern "C" int ps_cuda_pattern_compact(ps_ctx *c, float *probs, const float *full, const ps_attn_geom *g) {
    if (cu_geom_check(c, "pattern compact", g)) return -1; /* the kernel divides by nh / nkv; ncols: probs' row stride */
    int64_t rows = g->B * g->nh * g->T, T = g->T;
    if (rows <= 0) return 0;
    if (!g->compressed)
        k_pattern_compact_full<<<cu_grid(rows * T, T256), T256, 0, STREAM(c)>>>(probs, full, rows, T);
    else {
        const void *h[2];
        int64_t by[2];
        void *d[2] = {NULL, NULL};
        int n = 0, iw = -1, ic = -1;
        if (g->woff) iw = n, h[n] = g->woff, by[n++] = g->B * g->nkv * (int64_t)sizeof(int64_t);
        if (g->cend) ic = n, h[n] = g->cend, by[n++] = g->B * g->nW * (int64_t)sizeof(int64_t);
        if (n && cu_stage(c, n, h, by, d)) return -1;
        k_pattern_compact<<<cu_grid(rows * g->ncols, T256), T256, 0, STREAM(c)>>>(
            probs, full, rows, T, g->nW, g->W, g->S, g->LW, g->ncols, g->nh, g->nkv,
            iw >= 0 ? (const int64_t *)d[iw] : NULL, ic >= 0 ? (const int64_t *)d[ic] : NULL);
    }
    return CU_LAUNCHED(c, "pattern compact");
}

/* ---------------- hook actions ---------------- */

__global__ void k_head_set(float *x, const float *src, int64_t src_stride, int64_t npos, int64_t nh, int64_t hd,
                           int64_t head, int64_t seq0, int64_t nseq) {
    GS_LOOP(i, nseq * npos * hd) {
        int64_t e = i % hd, t = (i / hd) % npos, b = seq0 + i / (hd * npos);
        x[((b * npos + t) * nh + head) * hd + e] = src ? src[t * src_stride + e] : 0.0f;
    }
}

extern "C" int ps_cuda_head_set(ps_ctx *c, float *x, const float *src, int64_t src_stride, int64_t n_seq, int64_t npos,
                                int64_t nh, int64_t hd, int64_t head, int64_t seq0, int64_t seq1) {
    if (head < 0 || head >= nh || seq0 < 0 || seq1 > n_seq || seq0 > seq1)
        return ps_ctx_fail(c, "head_set: head %lld of %lld, sequences [%lld, %lld) of %lld: out of range", (long long)head,
                           (long long)nh, (long long)seq0, (long long)seq1, (long long)n_seq);
    int64_t n = (seq1 - seq0) * npos * hd;
    if (n <= 0) return 0;
    k_head_set<<<cu_grid(n, T256), T256, 0, STREAM(c)>>>(x, src, src_stride, npos, nh, hd, head, seq0, seq1 - seq0);
    return CU_LAUNCHED(c, "head_set");
}

__global__ void k_add_vector(float *x, const float *vec, float scale, int64_t n_rows, int64_t width) {
    GS_LOOP(i, n_rows * width) x[i] += scale * vec[i % width];
}

extern "C" int ps_cuda_add_vector(ps_ctx *c, float *x, const float *vec, float scale, int64_t n_rows, int64_t width) {
    if (n_rows <= 0 || width <= 0) return 0;
    k_add_vector<<<cu_grid(n_rows * width, T256), T256, 0, STREAM(c)>>>(x, vec, scale, n_rows, width);
    return CU_LAUNCHED(c, "add_vector");
}

/* dir 0: tmp[i, :] = block i; dir 1: block i = tmp[(i - k) mod W, :] */
__global__ void k_roll(float *x, float *tmp, int64_t W, int64_t stride, int64_t off, int64_t len, int64_t k, int dir) {
    GS_LOOP(idx, W * len) {
        int64_t i = idx / len, e = idx % len;
        if (dir == 0) tmp[idx] = x[i * stride + off + e];
        else {
            int64_t s = ((i - k) % W + W) % W;
            x[i * stride + off + e] = tmp[s * len + e];
        }
    }
}

extern "C" int ps_cuda_roll_blocks(ps_ctx *c, float *x, int64_t W, int64_t stride, int64_t off, int64_t len, int64_t k) {
    if (W <= 0 || len <= 0) return 0;
    float *tmp = ps_ctx_workspace(c, W * len);
    if (!tmp) return -1;
    k_roll<<<cu_grid(W * len, T256), T256, 0, STREAM(c)>>>(x, tmp, W, stride, off, len, k, 0);
    k_roll<<<cu_grid(W * len, T256), T256, 0, STREAM(c)>>>(x, tmp, W, stride, off, len, k, 1);
    return CU_LAUNCHED(c, "roll_blocks");
}

__global__ void k_copy_blocks(float *dst, int64_t d0, int64_t d1, const float *src, int64_t s0, int64_t s1, int64_t n0,
                              int64_t n1, int64_t width, int accumulate, float scale) {
    GS_LOOP(idx, n0 * n1 * width) {
        int64_t e = idx % width, j = (idx / width) % n1, i = idx / (width * n1);
        float *y = dst + i * d0 + j * d1 + e;
        const float *s = src ? src + i * s0 + j * s1 + e : NULL;
        if (accumulate) *y += scale * *s;
        else *y = s ? *s : 0.0f;
    }
}

extern "C" int ps_cuda_copy_blocks(ps_ctx *c, float *dst, int64_t dst_s0, int64_t dst_s1, const float *src, int64_t src_s0,
                                   int64_t src_s1, int64_t n0, int64_t n1, int64_t width, int accumulate, float scale) {
    if (n0 < 0 || n1 < 0 || width < 0 || (accumulate && !src))
        return ps_ctx_fail(c, "copy_blocks: %lld x %lld blocks of %lld floats%s: invalid", (long long)n0, (long long)n1,
                           (long long)width, accumulate && !src ? " accumulated from no source" : "");
    int64_t n = n0 * n1 * width;
    if (n <= 0) return 0;
    k_copy_blocks<<<cu_grid(n, T256), T256, 0, STREAM(c)>>>(dst, dst_s0, dst_s1, src, src_s0, src_s1, n0, n1, width,
                                                           accumulate, scale);
    return CU_LAUNCHED(c, "copy_blocks");
}

__global__ void k_accumulate_seqs(double *sum, const float *x, int64_t n_seq, int64_t n) {
    GS_LOOP(i, n) {
        double acc = sum[i];
        for (int64_t b = 0; b < n_seq; b++) acc += x[b * n + i];
        sum[i] = acc;
    }
}

extern "C" int ps_cuda_accumulate_seqs(ps_ctx *c, double *sum, const float *x, int64_t n_seq, int64_t n) {
    if (n <= 0) return 0;
    k_accumulate_seqs<<<cu_grid(n, T256), T256, 0, STREAM(c)>>>(sum, x, n_seq, n);
    return CU_LAUNCHED(c, "accumulate_seqs");
}

/* one block per (sequence, head): its threads stride over the head's npos·X values, then a block sum */
__global__ void k_delta_dot(double *out, const float *g, const float *x, const float *src, int64_t src_nseq, int64_t B,
                            int64_t npos, int64_t nh, int64_t X) {
    __shared__ double sh[32];
    for (int64_t bh = blockIdx.x; bh < B * nh; bh += gridDim.x) {
        int64_t b = bh / nh, h = bh % nh, sb = src_nseq > 1 ? b : 0;
        double acc = 0;
        for (int64_t j = threadIdx.x; j < npos * X; j += blockDim.x) {
            int64_t t = j / X, i = j % X, o = ((b * npos + t) * nh + h) * X + i, os = ((sb * npos + t) * nh + h) * X + i;
            acc += (double)g[o] * ((double)src[os] - (x ? (double)x[o] : 0.0));
        }
        acc = block_sum(acc, sh);
        if (threadIdx.x == 0) out[bh] += acc;
        __syncthreads();
    }
}

extern "C" int ps_cuda_delta_dot(ps_ctx *c, double *out, const float *g, const float *x, const float *src, int64_t src_nseq,
                                 int64_t B, int64_t npos, int64_t nh, int64_t X) {
    if (B * nh <= 0) return 0;
    k_delta_dot<<<cu_grid(B * nh, 1), T256, 0, STREAM(c)>>>(out, g, x, src, src_nseq, B, npos, nh, X);
    return CU_LAUNCHED(c, "delta_dot");
}

__global__ void k_sum_to_mean(float *mean, const double *sum, double count, int64_t n) {
    GS_LOOP(i, n) mean[i] = (float)(sum[i] / count);
}

extern "C" int ps_cuda_sum_to_mean(ps_ctx *c, float *mean, const double *sum, double count, int64_t n) {
    if (!(count > 0)) return ps_ctx_fail(c, "sum_to_mean: count %g must be positive", count);
    if (n <= 0) return 0;
    k_sum_to_mean<<<cu_grid(n, T256), T256, 0, STREAM(c)>>>(mean, sum, count, n);
    return CU_LAUNCHED(c, "sum_to_mean");
}

/* ---------------- benches: random fill, memory ---------------- */

__device__ __forceinline__ uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

__global__ void k_fill_normal(float *x, int64_t n, uint64_t seed, float std) {
    GS_LOOP(i, n) {
        uint64_t h = mix64(seed * 0x9e3779b97f4a7c15ull + (uint64_t)i);
        float u1 = ((float)(h >> 40) + 0.5f) * (1.0f / 16777216.0f), u2 = (float)((h >> 16) & 0xffffff) * (1.0f / 16777216.0f);
        x[i] = std * sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
    }
}

extern "C" int ps_cuda_fill_normal(ps_ctx *c, float *x, int64_t n, uint64_t seed, float std) {
    if (n <= 0) return 0;
    k_fill_normal<<<cu_grid(n, T256), T256, 0, STREAM(c)>>>(x, n, seed, std);
    return CU_LAUNCHED(c, "fill normal");
}

extern "C" int ps_cuda_mem_info(ps_ctx *c, int64_t *free_bytes, int64_t *total_bytes) {
    size_t f = 0, t = 0;
    if (cu_check(c, cudaMemGetInfo(&f, &t), "cudaMemGetInfo")) return -1;
    *free_bytes = (int64_t)f, *total_bytes = (int64_t)t;
    return 0;
}
