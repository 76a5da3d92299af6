/* test_v4_kernels.c — the DeepSeek-V4 ops of core/ops.h (CPU backend) against plain double-precision
 * loops written here from their definitions in SPEC-v4.md: the interleaved rope and its tables (and
 * YaRN's frequencies against transformers' formula), mHC weights with Sinkhorn / collapse / expand, the
 * compressor's slot gate, per-channel slot softmax and pooling (CSA and HCA), indexer scores, top-k with
 * ties / NaN / visibility, router scores and weights (hash rows with a repeated expert), the clamped
 * SwiGLU, scatter-add, attention with a sink (flash and materialised, sliding / HCA / CSA), the sink
 * rescale, the grouped linear and scale; and the reductions give the same bits with 1 and 2 threads. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/cpu/cpu.h"
#include "core/rng.h"
#include "core/v4/v4_config.h"

static ps_rng rng_;
static ps_ctx *ctx;

static float *randv(int64_t n, double sd) {
    float *x = malloc((size_t)(n ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++) x[i] = (float)(sd * ps_rng_normal(&rng_));
    return x;
}
static float *zerof(int64_t n) { return calloc((size_t)(n ? n : 1), sizeof(float)); }
static double *zerod(int64_t n) { return calloc((size_t)(n ? n : 1), sizeof(double)); }

static double rel_err(const float *a, const double *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (b[i] == a[i]) d = 0; /* infinities of the same sign */
        if (!(d <= num)) num = d;
        if (isfinite(b[i]) && fabs(b[i]) > den) den = fabs(b[i]);
    }
    return den > 0 ? num / den : num;
}

#define OK(call) CHECK((call) == 0, "%s", ctx->err.msg)

/* ---- rope ---- */

static void test_rope(void) {
    /* YaRN frequencies: transformers' _compute_yarn_parameters written out (truncate = True) */
    ps_v4_rope_cfg r = {.theta = 160000, .yarn = 1, .factor = 16, .original_max = 65536, .beta_fast = 32, .beta_slow = 1,
                        .truncate = 1, .attention_factor = 1};
    int64_t dim = 16, half = 8;
    double inv[8];
    ps_v4_rope_inv_freq(&r, dim, inv);
    double lo = floor(dim * log(65536 / (32 * 2 * M_PI)) / (2 * log(160000.0)));
    double hi = ceil(dim * log(65536 / (1 * 2 * M_PI)) / (2 * log(160000.0)));
    CHECK(lo == 3 && hi == 7, "correction range %g..%g", lo, hi);
    for (int64_t i = 0; i < half; i++) {
        double pos = pow(160000.0, (double)(2 * i) / (double)dim), ramp = fmin(fmax((i - lo) / (hi - lo), 0), 1);
        double want = (1.0 / (16 * pos)) * ramp + (1.0 / pos) * (1 - ramp);
        CHECK(fabs(inv[i] - want) <= 1e-15 * want, "yarn inv_freq[%lld] %g vs %g", (long long)i, inv[i], want);
    }
    ps_v4_rope_cfg plain = {.theta = 10000, .attention_factor = 1};
    ps_v4_rope_inv_freq(&plain, dim, inv);
    for (int64_t i = 0; i < half; i++) CHECK(fabs(inv[i] - pow(10000.0, -2.0 * i / dim)) < 1e-15, "plain inv_freq %lld", (long long)i);

    int64_t T = 37, H = 3, hd = 24, rd = 16;
    float *cs = zerof(T * half), *sn = zerof(T * half);
    OK(ps_v4_rope_table(ctx, cs, sn, T, half, inv, 1.25f));
    double worst = 0;
    for (int64_t p = 0; p < T; p++)
        for (int64_t i = 0; i < half; i++) {
            worst = fmax(worst, fabs(cs[p * half + i] - 1.25 * cos(p * inv[i])));
            worst = fmax(worst, fabs(sn[p * half + i] - 1.25 * sin(p * inv[i])));
        }
    CHECK(worst < 1e-6, "rope table error %g", worst);
    float *x = randv(2 * T * H * hd, 1), *y = malloc((size_t)(2 * T * H * hd) * sizeof(float));
    memcpy(y, x, (size_t)(2 * T * H * hd) * sizeof(float));
    OK(ps_v4_rope_table(ctx, cs, sn, T, half, inv, 1.0f));
    OK(ps_v4_rope(ctx, y, cs, sn, 2, T, H, hd, rd, 1, 0));
    double *ref = zerod(2 * T * H * hd);
    for (int64_t r0 = 0; r0 < 2 * T; r0++)
        for (int64_t h = 0; h < H; h++) {
            const float *v = x + (r0 * H + h) * hd;
            double *o = ref + (r0 * H + h) * hd;
            for (int64_t c = 0; c < hd; c++) o[c] = v[c];
            for (int64_t i = 0; i < half; i++) {
                double a = (double)(r0 % T) * inv[i], c0 = v[hd - rd + 2 * i], c1 = v[hd - rd + 2 * i + 1];
                o[hd - rd + 2 * i] = c0 * cos(a) - c1 * sin(a);
                o[hd - rd + 2 * i + 1] = c1 * cos(a) + c0 * sin(a);
            }
        }
    CHECK(rel_err(y, ref, 2 * T * H * hd) < 1e-6, "rope: %g", rel_err(y, ref, 2 * T * H * hd));
    OK(ps_v4_rope(ctx, y, cs, sn, 2, T, H, hd, rd, 1, 1)); /* the inverse undoes it */
    double *xd = zerod(2 * T * H * hd);
    for (int64_t i = 0; i < 2 * T * H * hd; i++) xd[i] = x[i];
    CHECK(rel_err(y, xd, 2 * T * H * hd) < 1e-6, "inverse rope: %g", rel_err(y, xd, 2 * T * H * hd));
    /* pos_step: rows at positions 0, 4, 8, ... */
    memcpy(y, x, (size_t)(T * hd) * sizeof(float));
    OK(ps_v4_rope(ctx, y, cs, sn, 1, 9, 1, hd, rd, 4, 0));
    for (int64_t r0 = 0; r0 < 9; r0++) {
        double a = (double)(r0 * 4) * inv[0], c0 = x[r0 * hd + hd - rd], c1 = x[r0 * hd + hd - rd + 1];
        CHECK(fabs(y[r0 * hd + hd - rd] - (c0 * cos(a) - c1 * sin(a))) < 1e-5, "pos_step row %lld", (long long)r0);
    }
    free(cs), free(sn), free(x), free(y), free(ref), free(xd);
}

/* ---- mHC ---- */

static void hc_ref(double *pre, double *post, double *comb, const float *mix, const float *x, const float *scale,
                   const float *base, int64_t N, int64_t D, int64_t iters, double eps, double neps, int head) {
    double ss = 0;
    for (int64_t i = 0; i < N * D; i++) ss += (double)x[i] * x[i];
    double rs = 1 / sqrt(ss / (N * D) + neps);
    for (int64_t j = 0; j < N; j++) pre[j] = 1 / (1 + exp(-(mix[j] * rs * scale[0] + base[j]))) + eps;
    if (head) return;
    for (int64_t j = 0; j < N; j++) post[j] = 2 / (1 + exp(-(mix[N + j] * rs * scale[1] + base[N + j])));
    for (int64_t j = 0; j < N; j++) {
        double s = 0;
        for (int64_t k = 0; k < N; k++) s += exp(mix[2 * N + j * N + k] * rs * scale[2] + base[2 * N + j * N + k]);
        for (int64_t k = 0; k < N; k++) comb[j * N + k] = exp(mix[2 * N + j * N + k] * rs * scale[2] + base[2 * N + j * N + k]) / s + eps;
    }
    for (int64_t k = 0; k < N; k++) {
        double s = 0;
        for (int64_t j = 0; j < N; j++) s += comb[j * N + k];
        for (int64_t j = 0; j < N; j++) comb[j * N + k] /= s + eps;
    }
    for (int64_t it = 1; it < iters; it++) {
        for (int64_t j = 0; j < N; j++) {
            double s = 0;
            for (int64_t k = 0; k < N; k++) s += comb[j * N + k];
            for (int64_t k = 0; k < N; k++) comb[j * N + k] /= s + eps;
        }
        for (int64_t k = 0; k < N; k++) {
            double s = 0;
            for (int64_t j = 0; j < N; j++) s += comb[j * N + k];
            for (int64_t j = 0; j < N; j++) comb[j * N + k] /= s + eps;
        }
    }
}

static void test_hc(void) {
    int64_t n = 13, N = 4, D = 10, W = (2 + N) * N;
    float *mix = randv(n * W, 1), *x = randv(n * N * D, 2), *scale = randv(3, 1), *base = randv(W, 0.5);
    float *pre = zerof(n * N), *post = zerof(n * N), *comb = zerof(n * N * N);
    double *rp = zerod(n * N), *rq = zerod(n * N), *rc = zerod(n * N * N);
    OK(ps_v4_hc_weights(ctx, pre, post, comb, mix, x, scale, base, n, N, D, 20, 1e-6f, 1e-6f));
    for (int64_t r = 0; r < n; r++)
        hc_ref(rp + r * N, rq + r * N, rc + r * N * N, mix + r * W, x + r * N * D, scale, base, N, D, 20, 1e-6, 1e-6, 0);
    CHECK(rel_err(pre, rp, n * N) < 1e-6 && rel_err(post, rq, n * N) < 1e-6 && rel_err(comb, rc, n * N * N) < 1e-6,
          "hc weights: %g %g %g", rel_err(pre, rp, n * N), rel_err(post, rq, n * N), rel_err(comb, rc, n * N * N));
    double colmax = 0; /* doubly stochastic after Sinkhorn */
    for (int64_t k = 0; k < N; k++) {
        double s = 0;
        for (int64_t j = 0; j < N; j++) s += comb[j * N + k];
        colmax = fmax(colmax, fabs(s - 1));
    }
    CHECK(colmax < 1e-4, "comb columns sum to 1 (%g)", colmax);
    float *mixh = randv(n * N, 1);
    OK(ps_v4_hc_weights(ctx, pre, NULL, NULL, mixh, x, scale, base, n, N, D, 0, 1e-6f, 1e-6f));
    for (int64_t r = 0; r < n; r++) hc_ref(rp + r * N, NULL, NULL, mixh + r * N, x + r * N * D, scale, base, N, D, 0, 1e-6, 1e-6, 1);
    CHECK(rel_err(pre, rp, n * N) < 1e-6, "hc head weights: %g", rel_err(pre, rp, n * N));
    /* collapse and expand */
    float *out = zerof(n * D), *blk = randv(n * D, 1), *hout = zerof(n * N * D);
    double *ro = zerod(n * D), *rh = zerod(n * N * D);
    OK(ps_v4_hc_weights(ctx, pre, post, comb, mix, x, scale, base, n, N, D, 20, 1e-6f, 1e-6f));
    OK(ps_v4_hc_collapse(ctx, out, pre, x, n, N, D));
    OK(ps_v4_hc_expand(ctx, hout, post, comb, blk, x, n, N, D));
    for (int64_t r = 0; r < n; r++)
        for (int64_t d = 0; d < D; d++) {
            for (int64_t j = 0; j < N; j++) ro[r * D + d] += (double)pre[r * N + j] * x[(r * N + j) * D + d];
            for (int64_t k = 0; k < N; k++) {
                double v = (double)post[r * N + k] * blk[r * D + d];
                for (int64_t j = 0; j < N; j++) v += (double)comb[(r * N + j) * N + k] * x[(r * N + j) * D + d];
                rh[(r * N + k) * D + d] = v;
            }
        }
    CHECK(rel_err(out, ro, n * D) < 1e-6 && rel_err(hout, rh, n * N * D) < 1e-6, "hc collapse %g expand %g",
          rel_err(out, ro, n * D), rel_err(hout, rh, n * N * D));
    free(mix), free(x), free(scale), free(base), free(pre), free(post), free(comb), free(rp), free(rq), free(rc), free(mixh);
    free(out), free(blk), free(hout), free(ro), free(rh);
}

/* ---- compressor ---- */

static void test_compressor(int overlap) {
    int64_t B = 2, T = 23, m = 4, d = 6, nW = T / m, c = overlap ? 2 : 1, S = overlap ? 2 * m : m;
    float *z = randv(B * T * c * d, 1), *ape = randv(m * c * d, 1), *kv = randv(B * T * c * d, 1);
    float *gate = zerof(B * nW * S * d), *alpha = zerof(B * nW * S * d), *pooled = zerof(B * nW * d);
    OK(ps_v4_comp_slots(ctx, gate, z, ape, B, T, nW, m, d, overlap));
    OK(ps_v4_slot_softmax(ctx, alpha, gate, B * nW, S, d));
    OK(ps_v4_comp_pool(ctx, pooled, alpha, kv, B, T, nW, m, d, overlap));
    double *rg = zerod(B * nW * S * d), *ra = zerod(B * nW * S * d), *rp = zerod(B * nW * d);
    for (int64_t b = 0; b < B; b++)
        for (int64_t w = 0; w < nW; w++) {
            double val[64][8], zz[64][8];
            for (int64_t s = 0; s < S; s++)
                for (int64_t i = 0; i < d; i++) {
                    int64_t tok, off;
                    if (!overlap) tok = w * m + s, off = i;
                    else if (s < m) tok = (w - 1) * m + s, off = i;       /* Ca of the previous window */
                    else tok = w * m + s - m, off = d + i;                /* Cb of this window */
                    int dead = overlap && s < m && w == 0;
                    zz[s][i] = dead ? -INFINITY : (double)z[(b * T + tok) * c * d + off] + ape[(s % m) * c * d + off];
                    val[s][i] = dead ? 0 : kv[(b * T + tok) * c * d + off];
                    rg[((b * nW + w) * S + s) * d + i] = zz[s][i];
                }
            for (int64_t i = 0; i < d; i++) {
                double mx = -INFINITY, sum = 0;
                for (int64_t s = 0; s < S; s++) mx = fmax(mx, zz[s][i]);
                for (int64_t s = 0; s < S; s++) sum += exp(zz[s][i] - mx);
                for (int64_t s = 0; s < S; s++) {
                    double a = exp(zz[s][i] - mx) / sum;
                    ra[((b * nW + w) * S + s) * d + i] = a;
                    rp[(b * nW + w) * d + i] += a * val[s][i];
                }
            }
        }
    CHECK(rel_err(gate, rg, B * nW * S * d) < 1e-6, "comp slots (overlap %d): %g", overlap, rel_err(gate, rg, B * nW * S * d));
    CHECK(rel_err(alpha, ra, B * nW * S * d) < 1e-6, "slot softmax (overlap %d): %g", overlap, rel_err(alpha, ra, B * nW * S * d));
    CHECK(rel_err(pooled, rp, B * nW * d) < 1e-6, "comp pool (overlap %d): %g", overlap, rel_err(pooled, rp, B * nW * d));
    free(z), free(ape), free(kv), free(gate), free(alpha), free(pooled), free(rg), free(ra), free(rp);
}

/* ---- indexer, top-k, routing ---- */

static void test_indexer(void) {
    int64_t B = 2, T = 11, nW = 5, Hi = 3, Di = 8;
    float *iq = randv(B * T * Hi * Di, 1), *ik = randv(B * nW * Di, 1), *w = randv(B * T * Hi, 1), *sc = zerof(B * T * nW);
    double *ref = zerod(B * T * nW);
    OK(ps_v4_indexer_scores(ctx, sc, iq, ik, w, B, T, nW, Hi, Di, 0.25f));
    for (int64_t bt = 0; bt < B * T; bt++)
        for (int64_t s = 0; s < nW; s++)
            for (int64_t h = 0; h < Hi; h++) {
                double dot = 0;
                for (int64_t i = 0; i < Di; i++) dot += (double)iq[(bt * Hi + h) * Di + i] * ik[((bt / T) * nW + s) * Di + i];
                ref[bt * nW + s] += (double)w[bt * Hi + h] * fmax(dot, 0) * 0.25;
            }
    CHECK(rel_err(sc, ref, B * T * nW) < 1e-6, "indexer scores: %g", rel_err(sc, ref, B * T * nW));
    free(iq), free(ik), free(w), free(sc), free(ref);
}

static void test_topk(void) {
    int64_t rows = 40, cols = 9, K = 4, rps = 20, m = 2;
    float *s = zerof(rows * cols), *bias = randv(cols, 0.1), *idx = zerof(rows * K), *gap = zerof(rows);
    for (int64_t i = 0; i < rows * cols; i++) s[i] = (float)ps_rng_below(&rng_, 5) * 0.5f; /* many ties */
    s[3] = NAN;
    for (int pass = 0; pass < 2; pass++) {
        const float *bb = pass ? bias : NULL;
        OK(ps_v4_topk(ctx, idx, gap, s, bb, rows, cols, K, rps, pass ? 0 : m));
        for (int64_t r = 0; r < rows; r++) {
            int64_t v = pass ? cols : ((r % rps) + 1) / m;
            if (v > cols) v = cols;
            /* reference: selection by repeated scans, best value then lowest index; NaN last */
            int used[16] = {0};
            double vals[16];
            int64_t got = 0, order[16];
            for (int64_t j = 0; j < v && j <= K; j++) {
                int64_t best = -1;
                double bv = 0;
                for (int64_t c = 0; c < v; c++) {
                    if (used[c]) continue;
                    double x = (double)s[r * cols + c] + (bb ? bb[c] : 0);
                    if (isnan(x)) x = -INFINITY;
                    if (best < 0 || x > bv) best = c, bv = x;
                }
                used[best] = 1;
                order[got] = best;
                vals[got++] = (double)(s[r * cols + best] + (bb ? bb[best] : 0.0f));
            }
            int ok = 1;
            for (int64_t j = 0; j < K; j++) ok &= idx[r * K + j] == (j < v ? (float)order[j] : -1.0f);
            CHECK(ok, "topk row %lld (pass %d)", (long long)r, pass);
            double wg = v > K ? vals[K - 1] - vals[K] : INFINITY;
            CHECK(gap[r] == (float)wg || (isnan(gap[r]) && isnan(wg)), "topk gap row %lld: %g vs %g", (long long)r,
                  (double)gap[r], wg);
        }
    }
    free(s), free(bias), free(idx), free(gap);
}

static void test_routing(void) {
    int64_t n = 7, E = 6, k = 3;
    float *lg = randv(n * E, 4), *sc = zerof(n * E), *idx = zerof(n * k), *w = zerof(n * k);
    lg[0] = 30.0f; /* past torch's softplus threshold */
    for (int scoring = 0; scoring < 2; scoring++) {
        OK(ps_v4_router_scores(ctx, sc, lg, n * E, scoring));
        double *ref = zerod(n * E);
        for (int64_t i = 0; i < n * E; i++) {
            double x = lg[i];
            ref[i] = scoring ? 1 / (1 + exp(-x)) : sqrt(x > 20 ? x : log(1 + exp(x)));
        }
        CHECK(rel_err(sc, ref, n * E) < 1e-6, "router scores (%d): %g", scoring, rel_err(sc, ref, n * E));
        free(ref);
    }
    for (int64_t r = 0; r < n; r++)
        for (int64_t j = 0; j < k; j++) idx[r * k + j] = (float)((r + 2 * j) % E);
    idx[2 * k + 2] = idx[2 * k + 0]; /* row 2 repeats an expert (a hash row): counted once */
    OK(ps_v4_route_weights(ctx, w, sc, idx, n, E, k, 1.5f));
    for (int64_t r = 0; r < n; r++) {
        double sum = 0;
        for (int64_t j = 0; j < k; j++)
            if (!(r == 2 && j == 2)) sum += sc[r * E + (int64_t)idx[r * k + j]];
        for (int64_t j = 0; j < k; j++) {
            double want = r == 2 && j == 2 ? 0 : sc[r * E + (int64_t)idx[r * k + j]] / (sum + 1e-20) * 1.5;
            CHECK(fabs(w[r * k + j] - want) < 1e-6, "route weight %lld,%lld: %g vs %g", (long long)r, (long long)j,
                  (double)w[r * k + j], want);
        }
    }
    idx[4] = (float)E;
    CHECK(ps_v4_route_weights(ctx, w, sc, idx, n, E, k, 1.5f) != 0 && strstr(ctx->err.msg, "not in [0, 6)"), "bad index refused");
    ps_error e;
    ps_ctx_check(ctx, &e);
    free(lg), free(sc), free(idx), free(w);
}

static void test_elementwise(void) {
    int64_t n = 200;
    float *g = randv(n, 8), *u = randv(n, 8), *h = zerof(n);
    for (int pass = 0; pass < 2; pass++) {
        float L = pass ? 0.0f : 3.0f;
        OK(ps_v4_swiglu_clamp(ctx, h, g, u, n, L));
        double *ref = zerod(n);
        for (int64_t i = 0; i < n; i++) {
            double a = g[i], b = u[i];
            if (L > 0) a = fmin(a, L), b = fmax(fmin(b, L), -L);
            ref[i] = a / (1 + exp(-a)) * b;
        }
        CHECK(rel_err(h, ref, n) < 1e-6, "swiglu clamp (limit %g): %g", (double)L, rel_err(h, ref, n));
        free(ref);
    }
    int64_t rows[5] = {3, 0, 3, 1, 4}, width = 6;
    float wts[5] = {0.5f, -1, 2, 1, 0.25f}, *in = randv(5 * width, 1), *out = randv(5 * width, 1);
    double *ref = zerod(5 * width);
    for (int64_t i = 0; i < 5 * width; i++) ref[i] = out[i];
    for (int64_t i = 0; i < 5; i++)
        for (int64_t e = 0; e < width; e++) ref[rows[i] * width + e] += (double)wts[i] * in[i * width + e];
    OK(ps_v4_scatter_add_rows(ctx, out, in, rows, wts, 5, width));
    CHECK(rel_err(out, ref, 5 * width) < 1e-6, "scatter add: %g", rel_err(out, ref, 5 * width));
    OK(ps_v4_scale(ctx, out, -2.0f, 5 * width));
    for (int64_t i = 0; i < 5 * width; i++) ref[i] *= -2;
    CHECK(rel_err(out, ref, 5 * width) < 1e-6, "scale");
    /* grouped linear */
    int64_t M = 5, G = 3, Kg = 7, Ng = 4;
    float *inp = randv(M * G * Kg, 1), *w = randv(G * Ng * Kg, 1), *o = zerof(M * G * Ng);
    double *ro = zerod(M * G * Ng);
    for (int64_t r = 0; r < M; r++)
        for (int64_t gi = 0; gi < G; gi++)
            for (int64_t j = 0; j < Ng; j++)
                for (int64_t i = 0; i < Kg; i++) ro[r * G * Ng + gi * Ng + j] += (double)inp[r * G * Kg + gi * Kg + i] * w[(gi * Ng + j) * Kg + i];
    OK(ps_v4_grouped_linear(ctx, o, inp, w, M, G, Kg, Ng));
    CHECK(rel_err(o, ro, M * G * Ng) < 1e-6, "grouped linear: %g", rel_err(o, ro, M * G * Ng));
    free(g), free(u), free(h), free(in), free(out), free(ref), free(inp), free(w), free(o), free(ro);
}

/* ---- attention ---- */

static void test_attention(int type) { /* 0 sliding, 1 HCA, 2 CSA */
    int64_t B = 2, T = 19, H = 3, Dh = 8, m = type ? 3 : 0, nW = type ? T / m : 0, W = 5, K = type == 2 ? 3 : 0, C = T + nW;
    ps_v4_attn_geom g = {.B = B, .T = T, .H = H, .Dh = Dh, .nW = nW, .K = K, .W = W, .m = m, .scale = 0.35f};
    float *q = randv(B * T * H * Dh, 1), *kv = randv(B * T * Dh, 1), *ckv = randv(B * nW * Dh, 1), *sink = randv(H, 1);
    float *topk = zerof(B * T * (K ? K : 1));
    for (int64_t bt = 0; bt < B * T; bt++) { /* a selection among the visible entries, -1 for the rest */
        int64_t t = bt % T, nv = type ? ((t + 1) / m < nW ? (t + 1) / m : nW) : 0;
        for (int64_t j = 0; j < K; j++) topk[bt * K + j] = j < nv ? (float)((t + 2 * j) % nv) : -1.0f;
        if (K == 3 && nv >= 3) topk[bt * K + 0] = 0, topk[bt * K + 1] = (float)(nv - 1), topk[bt * K + 2] = (float)(nv / 2 == 0 || nv / 2 == nv - 1 ? -1 : nv / 2);
        if (K == 3 && nv == 2) topk[bt * K + 0] = 1, topk[bt * K + 1] = -1, topk[bt * K + 2] = 0;
    }
    double *rout = zerod(B * T * H * Dh), *rsink = zerod(B * H * T), *rpat = zerod(B * H * T * C);
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++)
            for (int64_t h = 0; h < H; h++) {
                double lg[64], mx = sink[h], sum = 0;
                int vis[64];
                for (int64_t c = 0; c < C; c++) {
                    vis[c] = 0;
                    if (c < T) vis[c] = c <= t && c > t - W;
                    else if (type == 1) vis[c] = c - T < (t + 1) / m;
                    else if (type == 2)
                        for (int64_t j = 0; j < K; j++) vis[c] |= topk[(b * T + t) * K + j] == (float)(c - T);
                    if (!vis[c]) continue;
                    const float *key = c < T ? kv + (b * T + c) * Dh : ckv + (b * nW + c - T) * Dh;
                    double d = 0;
                    for (int64_t i = 0; i < Dh; i++) d += (double)q[((b * T + t) * H + h) * Dh + i] * key[i];
                    lg[c] = d * 0.35f;
                    mx = fmax(mx, lg[c]);
                }
                for (int64_t c = 0; c < C; c++) sum += vis[c] ? exp(lg[c] - mx) : 0;
                sum += exp(sink[h] - mx);
                rsink[(b * H + h) * T + t] = exp(sink[h] - mx) / sum;
                for (int64_t c = 0; c < C; c++) {
                    if (!vis[c]) continue;
                    double p = exp(lg[c] - mx) / sum;
                    rpat[((b * H + h) * T + t) * C + c] = p;
                    const float *key = c < T ? kv + (b * T + c) * Dh : ckv + (b * nW + c - T) * Dh;
                    for (int64_t i = 0; i < Dh; i++) rout[((b * T + t) * H + h) * Dh + i] += p * key[i];
                }
            }
    float *out = zerof(B * T * H * Dh), *sp = zerof(B * H * T), *bias = zerof(B * T * C), *lgt = zerof(B * H * T * C),
          *out2 = zerof(B * T * H * Dh), *sp2 = zerof(B * H * T);
    const float *tk = K ? topk : NULL;
    OK(ps_v4_attn(ctx, out, sp, q, kv, ckv, tk, sink, &g));
    CHECK(rel_err(out, rout, B * T * H * Dh) < 1e-5, "attention %d: %g", type, rel_err(out, rout, B * T * H * Dh));
    CHECK(rel_err(sp, rsink, B * H * T) < 1e-5, "sink mass %d: %g", type, rel_err(sp, rsink, B * H * T));
    OK(ps_v4_attn_bias(ctx, bias, tk, &g));
    OK(ps_v4_attn_logits(ctx, lgt, q, kv, ckv, bias, &g));
    OK(ps_v4_attn_softmax(ctx, lgt, sp2, lgt, sink, &g));
    CHECK(rel_err(lgt, rpat, B * H * T * C) < 1e-5, "pattern %d: %g", type, rel_err(lgt, rpat, B * H * T * C));
    CHECK(rel_err(sp2, rsink, B * H * T) < 1e-5, "materialised sink mass %d", type);
    OK(ps_v4_attn_apply(ctx, out2, lgt, kv, ckv, &g));
    CHECK(rel_err(out2, rout, B * T * H * Dh) < 1e-5, "materialised attention %d: %g", type, rel_err(out2, rout, B * T * H * Dh));
    int masked_ok = 1;
    for (int64_t i = 0; i < B * H * T * C; i++) masked_ok &= (rpat[i] == 0) == (lgt[i] == 0.0f);
    CHECK(masked_ok, "pattern zero exactly where unseen (%d)", type);
    /* sink rescale: new mass s' scales the row by (1 - s') / (1 - s) */
    for (int64_t i = 0; i < B * H * T; i++) sp2[i] = i % 2 ? sp[i] : 0.5f;
    memcpy(out2, out, (size_t)(B * T * H * Dh) * sizeof(float));
    OK(ps_v4_sink_rescale(ctx, out2, sp, sp2, &g));
    double worst = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++)
            for (int64_t h = 0; h < H; h++) {
                int64_t s = (b * H + h) * T + t;
                double f = (1 - (double)sp2[s]) / (1 - (double)sp[s]);
                for (int64_t i = 0; i < Dh; i++) {
                    int64_t o = ((b * T + t) * H + h) * Dh + i;
                    worst = fmax(worst, fabs(out2[o] - f * out[o]));
                }
            }
    CHECK(worst < 1e-5, "sink rescale: %g", worst);
    /* the same bits with 1 and 2 threads */
    omp_set_num_threads(1);
    OK(ps_v4_attn(ctx, out2, NULL, q, kv, ckv, tk, sink, &g));
    omp_set_num_threads(2);
    CHECK(!memcmp(out, out2, (size_t)(B * T * H * Dh) * sizeof(float)), "attention thread-count independent (%d)", type);
    free(q), free(kv), free(ckv), free(sink), free(topk), free(rout), free(rsink), free(rpat);
    free(out), free(sp), free(bias), free(lgt), free(out2), free(sp2);
}

int main(void) {
    ps_error err;
    ps_rng_seed(&rng_, 4);
    if (ps_ctx_create(&ctx, "cpu", &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    test_rope();
    test_hc();
    test_compressor(0);
    test_compressor(1);
    test_indexer();
    test_topk();
    test_routing();
    test_elementwise();
    for (int t = 0; t < 3; t++) test_attention(t);
    ps_ctx_free(ctx);
    CHECK_DONE();
}
