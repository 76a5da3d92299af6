/* ops_cpu_misc.c — CPU ops that move data (copies, row gathers, pattern layouts), the hook actions, the
 * embedding backward and the optimizer steps. */
#ifdef __AVX512F__
#include <immintrin.h>
#endif
#include <math.h>
#include <string.h>

#include "core/cpu/cpu.h"

int ps_cpu_copy(ps_ctx *ctx, float *dst, const float *src, int64_t n) {
    (void)ctx;
    if (n > 0 && dst != src) memcpy(dst, src, (size_t)n * sizeof(float));
    return 0;
}

int ps_cpu_fill(ps_ctx *ctx, float *x, float value, int64_t n) {
    (void)ctx;
    if (value == 0.0f) {
        if (n > 0) memset(x, 0, (size_t)n * sizeof(float));
        return 0;
    }
    for (int64_t i = 0; i < n; i++) x[i] = value;
    return 0;
}

int ps_cpu_gather_rows(ps_ctx *ctx, float *out, const float *in, const float *add, const int64_t *rows, int64_t n,
                       int64_t width) {
    (void)ctx;
#pragma omp parallel for schedule(static) if (n * width > 65536)
    for (int64_t i = 0; i < n; i++) {
        const float *src = in + rows[i] * width;
        float *dst = out + i * width;
        if (add)
            for (int64_t e = 0; e < width; e++) dst[e] = src[e] + add[i * width + e];
        else
            memcpy(dst, src, (size_t)width * sizeof(float));
    }
    return 0;
}

int ps_cpu_scatter_rows(ps_ctx *ctx, float *out, const float *in, const int64_t *rows, int64_t n, int64_t width) {
    (void)ctx;
    for (int64_t i = 0; i < n; i++) memcpy(out + rows[i] * width, in + i * width, (size_t)width * sizeof(float));
    return 0;
}

/* Raw column range of query t in a compressed row: columns nW+m for m in [m0, LW). */
static inline int64_t local_first(int64_t t, int64_t LW) { return t - LW + 1 < 0 ? LW - 1 - t : 0; }

int ps_cpu_pattern_expand(ps_ctx *ctx, float *full, const float *probs, const ps_attn_geom *g) {
    (void)ctx;
    int64_t rows = g->B * g->nh * g->T, T = g->T;
    if (!g->compressed) {
        if (full != probs) memcpy(full, probs, (size_t)(rows * T) * sizeof(float));
        return 0;
    }
    int64_t nW = g->nW, LW = g->LW, wide = nW + T;
#pragma omp parallel for schedule(static) if (rows * wide > 65536)
    for (int64_t r = 0; r < rows; r++) {
        int64_t t = r % T;
        const float *src = probs + r * g->ncols;
        float *dst = full + r * wide;
        memset(dst, 0, (size_t)wide * sizeof(float));
        memcpy(dst, src, (size_t)nW * sizeof(float));
        for (int64_t m = local_first(t, LW); m < LW; m++) dst[nW + t - LW + 1 + m] = src[nW + m];
    }
    return 0;
}

int ps_cpu_pattern_compact(ps_ctx *ctx, float *probs, const float *full, const ps_attn_geom *g) {
    (void)ctx;
    int64_t rows = g->B * g->nh * g->T, T = g->T;
    if (!g->compressed) { /* in place on the wide rows: unseen (future) entries back to 0 */
        if (full != probs) memcpy(probs, full, (size_t)(rows * T) * sizeof(float));
#pragma omp parallel for schedule(static) if (rows * T > 65536)
        for (int64_t r = 0; r < rows; r++) {
            int64_t t = r % T;
            memset(probs + r * T + t + 1, 0, (size_t)(T - t - 1) * sizeof(float));
        }
        return 0;
    }
    int64_t nW = g->nW, LW = g->LW, wide = nW + T;
#pragma omp parallel for schedule(static) if (rows * wide > 65536)
    for (int64_t r = 0; r < rows; r++) {
        int64_t t = r % T, b = r / (T * g->nh), kv = (r / T) % g->nh / (g->nh / g->nkv);
        int64_t nc = ps_geom_seen(g, b, kv, t);
        float *dst = probs + r * g->ncols;
        const float *src = full + r * wide;
        memcpy(dst, src, (size_t)nc * sizeof(float));
        for (int64_t c = nc; c < nW; c++) dst[c] = 0.0f;
        for (int64_t m = 0; m < LW; m++) {
            int64_t tp = t - LW + 1 + m;
            dst[nW + m] = tp >= 0 ? src[nW + tp] : 0.0f;
        }
    }
    return 0;
}

int ps_cpu_head_set(ps_ctx *ctx, float *x, const float *src, int64_t src_stride, int64_t n_seq, int64_t npos,
                    int64_t nh, int64_t hd, int64_t head, int64_t seq0, int64_t seq1) {
    if (head < 0 || head >= nh || seq0 < 0 || seq1 > n_seq || seq0 > seq1)
        return ps_ctx_fail(ctx, "head_set: head %lld of %lld, sequences [%lld, %lld) of %lld: out of range",
                           (long long)head, (long long)nh, (long long)seq0, (long long)seq1, (long long)n_seq);
#pragma omp parallel for schedule(static) if ((seq1 - seq0) * npos * hd > 65536)
    for (int64_t b = seq0; b < seq1; b++)
        for (int64_t t = 0; t < npos; t++) {
            float *dst = x + ((b * npos + t) * nh + head) * hd;
            if (src)
                memcpy(dst, src + t * src_stride, (size_t)hd * sizeof(float));
            else
                memset(dst, 0, (size_t)hd * sizeof(float));
        }
    return 0;
}

int ps_cpu_add_vector(ps_ctx *ctx, float *x, const float *vec, float scale, int64_t n_rows, int64_t width) {
    (void)ctx;
#pragma omp parallel for schedule(static) if (n_rows * width > 65536)
    for (int64_t r = 0; r < n_rows; r++)
        for (int64_t e = 0; e < width; e++) x[r * width + e] += scale * vec[e];
    return 0;
}

int ps_cpu_roll_blocks(ps_ctx *ctx, float *x, int64_t W, int64_t stride, int64_t off, int64_t len, int64_t k) {
    float *tmp = ps_ctx_workspace(ctx, W * len); /* [W, len] the blocks before the roll */
    if (!tmp) return -1;
    for (int64_t i = 0; i < W; i++) memcpy(tmp + i * len, x + i * stride + off, (size_t)len * sizeof(float));
    for (int64_t i = 0; i < W; i++) {
        int64_t src = ((i - k) % W + W) % W;
        memcpy(x + i * stride + off, tmp + src * len, (size_t)len * sizeof(float));
    }
    return 0;
}

int ps_cpu_copy_blocks(ps_ctx *ctx, float *dst, int64_t dst_s0, int64_t dst_s1, const float *src, int64_t src_s0,
                       int64_t src_s1, int64_t n0, int64_t n1, int64_t width, int accumulate, float scale) {
    if (n0 < 0 || n1 < 0 || width < 0 || (accumulate && !src))
        return ps_ctx_fail(ctx, "copy_blocks: %lld x %lld blocks of %lld floats%s: invalid", (long long)n0, (long long)n1,
                           (long long)width, accumulate && !src ? " accumulated from no source" : "");
#pragma omp parallel for collapse(2) schedule(static) if (n0 * n1 * width > 65536)
    for (int64_t i = 0; i < n0; i++)
        for (int64_t j = 0; j < n1; j++) {
            float *y = dst + i * dst_s0 + j * dst_s1;
            const float *s = src ? src + i * src_s0 + j * src_s1 : NULL;
            if (accumulate)
                for (int64_t e = 0; e < width; e++) y[e] += scale * s[e];
            else if (s)
                memcpy(y, s, (size_t)width * sizeof(float));
            else
                memset(y, 0, (size_t)width * sizeof(float));
        }
    return 0;
}

/* Elements in parallel, sequences in order for each element: the sum does not depend on the threads. */
int ps_cpu_accumulate_seqs(ps_ctx *ctx, double *sum, const float *x, int64_t n_seq, int64_t n) {
    (void)ctx;
#pragma omp parallel for schedule(static) if (n_seq * n > 65536)
    for (int64_t i = 0; i < n; i++) {
        double acc = sum[i];
        for (int64_t b = 0; b < n_seq; b++) acc += x[b * n + i];
        sum[i] = acc;
    }
    return 0;
}

int ps_cpu_delta_dot(ps_ctx *ctx, double *out, const float *g, const float *x, const float *src, int64_t src_nseq, int64_t B,
                     int64_t npos, int64_t nh, int64_t X) {
    (void)ctx;
#pragma omp parallel for schedule(static) if (B * npos * nh * X > 65536)
    for (int64_t bh = 0; bh < B * nh; bh++) {
        int64_t b = bh / nh, h = bh % nh, sb = src_nseq > 1 ? b : 0;
        double acc = 0;
        for (int64_t t = 0; t < npos; t++) {
            int64_t o = ((b * npos + t) * nh + h) * X, os = ((sb * npos + t) * nh + h) * X;
            for (int64_t i = 0; i < X; i++) acc += (double)g[o + i] * ((double)src[os + i] - (x ? (double)x[o + i] : 0.0));
        }
        out[bh] += acc;
    }
    return 0;
}

int ps_cpu_sum_to_mean(ps_ctx *ctx, float *mean, const double *sum, double count, int64_t n) {
    if (!(count > 0)) return ps_ctx_fail(ctx, "sum_to_mean: count %g must be positive", count);
    for (int64_t i = 0; i < n; i++) mean[i] = (float)(sum[i] / count);
    return 0;
}

/* Columns in blocks: each thread owns a block of columns and adds the tokens' rows in token order, so the
 * sum does not depend on the thread count. */
int ps_cpu_embed_backward(ps_ctx *ctx, float *dtable, const float *dout, const int32_t *tok, int64_t n_tok, int64_t C) {
    (void)ctx;
    enum { CB = 64 };
    int64_t nb = (C + CB - 1) / CB;
#pragma omp parallel for schedule(static) if (n_tok * C > 65536)
    for (int64_t cb = 0; cb < nb; cb++) {
        int64_t c0 = cb * CB, c1 = c0 + CB < C ? c0 + CB : C;
        for (int64_t i = 0; i < n_tok; i++) {
            float *row = dtable + (int64_t)tok[i] * C;
            const float *src = dout + i * C;
            for (int64_t e = c0; e < c1; e++) row[e] += src[e];
        }
    }
    return 0;
}

/* Fixed blocks; the block sums added in block order: the same value for any thread count (the blocks run
 * in parallel; only their partial sums are shared). */
int ps_cpu_sumsq(ps_ctx *ctx, double *out, const float *x, int64_t n) {
    enum { BLK = 4096 };
    int64_t nb = (n + BLK - 1) / BLK;
    double *part = (double *)ps_ctx_workspace(ctx, 2 * (nb ? nb : 1));
    if (!part) return -1;
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t b = 0; b < nb; b++) part[b] = ps_dot_d(x + b * BLK, x + b * BLK, ((b + 1) * BLK < n ? (b + 1) * BLK : n) - b * BLK);
    double total = 0;
    for (int64_t b = 0; b < nb; b++) total += part[b];
    *out = total;
    return 0;
}

/* AdamW over elements [j0, j1): the plain-loop kernel (elementwise, so any split of the range gives the
 * same numbers). */
static void adamw_range_plain(float *w, float *mm, float *vv, const float *g, int64_t j0, int64_t j1,
                              const ps_adamw_hyper *h, float plr, float wd) {
    float b1 = h->beta1, b2 = h->beta2, eps = h->eps, cs = h->clip_scale, ib1 = h->inv_bc1, ib2 = h->inv_bc2;
    for (int64_t j = j0; j < j1; j++) {
        float gj = g[j] * cs;
        mm[j] = b1 * mm[j] + (1.0f - b1) * gj;
        vv[j] = b2 * vv[j] + (1.0f - b2) * gj * gj;
        float mh = mm[j] * ib1, vh = vv[j] * ib2;
        w[j] -= plr * (mh / (sqrtf(vh) + eps) + wd * w[j]);
    }
}

/* The same with AVX-512 where the build has it: gcc does not vectorise the plain loop (sqrtf may set errno,
 * and the build keeps -fmath-errno). Every lane does the plain loop's operations in its order, without
 * fused multiply-adds, and sqrt and division are correctly rounded, so the results are bit-identical. */
static void adamw_range(float *w, float *mm, float *vv, const float *g, int64_t j0, int64_t j1, const ps_adamw_hyper *h,
                        float plr, float wd) {
#ifdef __AVX512F__
    const __m512 vb1 = _mm512_set1_ps(h->beta1), vb2 = _mm512_set1_ps(h->beta2), v1b1 = _mm512_set1_ps(1.0f - h->beta1),
                 v1b2 = _mm512_set1_ps(1.0f - h->beta2), veps = _mm512_set1_ps(h->eps),
                 vcs = _mm512_set1_ps(h->clip_scale), vib1 = _mm512_set1_ps(h->inv_bc1),
                 vib2 = _mm512_set1_ps(h->inv_bc2), vlr = _mm512_set1_ps(plr), vwd = _mm512_set1_ps(wd);
    for (; j0 + 16 <= j1; j0 += 16) {
        __m512 gj = _mm512_mul_ps(_mm512_loadu_ps(g + j0), vcs);
        __m512 m = _mm512_add_ps(_mm512_mul_ps(vb1, _mm512_loadu_ps(mm + j0)), _mm512_mul_ps(v1b1, gj));
        __m512 v = _mm512_add_ps(_mm512_mul_ps(vb2, _mm512_loadu_ps(vv + j0)), _mm512_mul_ps(_mm512_mul_ps(v1b2, gj), gj));
        _mm512_storeu_ps(mm + j0, m);
        _mm512_storeu_ps(vv + j0, v);
        __m512 mh = _mm512_mul_ps(m, vib1), vh = _mm512_mul_ps(v, vib2), wj = _mm512_loadu_ps(w + j0);
        __m512 upd = _mm512_add_ps(_mm512_div_ps(mh, _mm512_add_ps(_mm512_sqrt_ps(vh), veps)), _mm512_mul_ps(vwd, wj));
        _mm512_storeu_ps(w + j0, _mm512_sub_ps(wj, _mm512_mul_ps(vlr, upd)));
    }
#endif
    adamw_range_plain(w, mm, vv, g, j0, j1, h, plr, wd);
}

/* One parallel region for every segment: each segment is cut into chunks of CH elements, and the threads
 * share out all chunks of all segments (one fork/join per step). */
int ps_cpu_adamw(ps_ctx *ctx, float *w, float *m1, float *m2, const float *g, const ps_adamw_seg *segs, int n_segs,
                 const ps_adamw_hyper *h) {
    (void)ctx;
    enum { CH = 16384 };
    int64_t n_chunks = 0, total = 0;
    for (int i = 0; i < n_segs; i++) {
        n_chunks += (segs[i].n + CH - 1) / CH;
        total += segs[i].n;
    }
#pragma omp parallel if (total > 65536)
    {
        int i = 0;
        int64_t first = 0; /* chunk index of segment i's first chunk */
#pragma omp for schedule(static)
        for (int64_t k = 0; k < n_chunks; k++) {
            while (i < n_segs && k >= first + (segs[i].n + CH - 1) / CH) {
                first += (segs[i].n + CH - 1) / CH;
                i++;
            }
            const ps_adamw_seg *s = &segs[i];
            int64_t j0 = (k - first) * CH, j1 = j0 + CH < s->n ? j0 + CH : s->n;
            adamw_range(w + s->offset, m1 + s->offset, m2 + s->offset, g + s->offset, j0, j1, h, s->lr, s->weight_decay);
        }
    }
    return 0;
}
