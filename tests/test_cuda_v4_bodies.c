/* test_cuda_v4_bodies.c — the CUDA backend's DeepSeek-V4 kernels checked without a GPU: every body of
 * core/cuda/v4_bodies.h (the arithmetic of the kernels of core/cuda/v4.cu) is run on the host over the
 * whole index space of its kernel, exactly as the kernel partitions it (one call per output element or
 * per row, the same index arithmetic and scratch layout), and compared with the CPU backend's op through
 * a "cpu" context and the wrappers of core/ops.h, on seeded random inputs over several geometries: CSA
 * and HCA compressors (overlapping and not, a partial last window, no window at all), rows_per_seq and
 * pos_step of the rope, inverse rope, K equal to the columns and above the visible ones, ties and NaN in
 * top-k, bias on and off, both router scorings, learned and hash routing (a repeated expert), scatter-add
 * with repeated rows, sliding / HCA / CSA attention with empty and out-of-range top-k slots, sinkp on and
 * off, the attention backward with and without compressed entries and dsink.
 *
 * Tolerances: the bodies follow the CPU's order of operations, so 1e-5 relative elementwise (with a floor
 * of 1e-3 of the tensor's largest magnitude, for values that cancel); the grouped linear (BLAS on the CPU)
 * 1e-4; selected indices and top-k gaps exactly. Built in every build (it needs no CUDA toolkit). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/cuda/v4_bodies.h"
#include "core/ops.h"
#include "core/rng.h"

static ps_rng rng_;
static ps_ctx *ctx;

#define OK(call) CHECK((call) == 0, "%s", ctx->err.msg)

static float *randv(int64_t n, double sd) {
    float *x = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++) x[i] = (float)(sd * ps_rng_normal(&rng_));
    return x;
}
static float *dup(const float *x, int64_t n) {
    float *y = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    if (n > 0) memcpy(y, x, (size_t)n * sizeof(float));
    return y;
}
static float *zerof(int64_t n) { return calloc((size_t)(n > 0 ? n : 1), sizeof(float)); }

/* got vs want elementwise: equal (infinities, NaN with NaN), or |got - want| <= tol · (|want| + 1e-3 · max|want|);
 * tol 0: the same value. */
static void cmp(const char *what, const char *geo, const float *got, const float *want, int64_t n, double tol) {
    double big = 0;
    for (int64_t i = 0; i < n; i++)
        if (isfinite(want[i]) && fabs(want[i]) > big) big = fabs(want[i]);
    int64_t bad = -1;
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
        float a = got[i], b = want[i];
        if (a == b || (isnan(a) && isnan(b))) continue;
        double d = fabs((double)a - (double)b), lim = tol * (fabs((double)b) + 1e-3 * big);
        if (!(d <= lim) && (bad < 0 || !(d <= worst))) {
            bad = i;
            worst = d;
        }
    }
    CHECK(bad < 0, "%s [%s]: element %lld of %lld: body %.9g, cpu %.9g", what, geo, (long long)bad, (long long)n,
          bad >= 0 ? (double)got[bad] : 0.0, bad >= 0 ? (double)want[bad] : 0.0);
}

/* ---------------- rope ---------------- */

static void test_rope(void) {
    int64_t geo[][7] = {/* n_seq, rows_per_seq, n_heads, hd, rd, pos_step, inverse */
                        {2, 5, 3, 16, 8, 1, 0}, {2, 5, 3, 16, 8, 1, 1}, {1, 4, 1, 8, 8, 4, 0},
                        {3, 2, 2, 6, 2, 2, 1},  {1, 1, 1, 4, 4, 1, 0},  {2, 7, 4, 12, 12, 3, 1}};
    for (size_t gi = 0; gi < sizeof geo / sizeof geo[0]; gi++) {
        int64_t *G = geo[gi], n_seq = G[0], rps = G[1], nh = G[2], hd = G[3], rd = G[4], ps = G[5], half = rd / 2;
        int64_t n_pos = rps * ps;
        char nm[96];
        snprintf(nm, sizeof nm, "geometry %zu", gi);
        double inv[16];
        for (int64_t i = 0; i < half; i++) inv[i] = pow(10000.0, -(double)(2 * i) / (double)rd) * (1 + 0.1 * (double)gi);
        float mscale = gi % 2 ? 1.25f : 1.0f;
        float *c0 = zerof(n_pos * half), *s0 = zerof(n_pos * half), *c1 = zerof(n_pos * half), *s1 = zerof(n_pos * half);
        OK(ps_v4_rope_table(ctx, c0, s0, n_pos, half, inv, mscale));
        for (int64_t e = 0; e < n_pos * half; e++) ps_v4b_rope_table(c1, s1, inv, half, mscale, e);
        cmp("v4_rope_table cos", nm, c1, c0, n_pos * half, 1e-5);
        cmp("v4_rope_table sin", nm, s1, s0, n_pos * half, 1e-5);
        int64_t nx = n_seq * rps * nh * hd;
        float *x0 = randv(nx, 1.0), *x1 = dup(x0, nx);
        OK(ps_v4_rope(ctx, x0, c0, s0, n_seq, rps, nh, hd, rd, ps, (int)G[6]));
        for (int64_t e = 0; e < n_seq * rps * nh * half; e++) ps_v4b_rope(x1, c0, s0, rps, nh, hd, rd, ps, (int)G[6], e);
        cmp("v4_rope", nm, x1, x0, nx, 1e-5);
        free(c0), free(s0), free(c1), free(s1), free(x0), free(x1);
    }
}

/* ---------------- mHC ---------------- */

static void test_hc(void) {
    int64_t geo[][5] = {/* n, N, D, iters, head */ {5, 4, 8, 20, 0}, {3, 1, 5, 1, 0}, {4, 3, 17, 0, 0}, {6, 4, 8, 0, 1},
                        {2, 2, 33, 3, 1}};
    for (size_t gi = 0; gi < sizeof geo / sizeof geo[0]; gi++) {
        int64_t n = geo[gi][0], N = geo[gi][1], D = geo[gi][2], iters = geo[gi][3], head = geo[gi][4];
        int64_t width = head ? N : (2 + N) * N;
        char nm[96];
        snprintf(nm, sizeof nm, "n %lld N %lld D %lld iters %lld%s", (long long)n, (long long)N, (long long)D,
                 (long long)iters, head ? " head" : "");
        float *mix = randv(n * width, 3.0), *x = randv(n * N * D, 1.0), *scale = randv(3, 1.0), *base = randv(width, 1.0);
        float *pre0 = zerof(n * N), *post0 = zerof(n * N), *comb0 = zerof(n * N * N);
        float *pre1 = zerof(n * N), *post1 = zerof(n * N), *comb1 = zerof(n * N * N);
        double *cm = calloc((size_t)(n * N * N), sizeof(double));
        OK(ps_v4_hc_weights(ctx, pre0, head ? NULL : post0, head ? NULL : comb0, mix, x, scale, base, n, N, D, iters, 1e-6f,
                            1e-6f));
        for (int64_t r = 0; r < n; r++)
            ps_v4b_hc_weights_row(pre1, head ? NULL : post1, head ? NULL : comb1, mix, x, scale, base, N, D, iters, 1e-6f,
                                  1e-6f, head ? NULL : cm + r * N * N, r);
        cmp("v4_hc_weights pre", nm, pre1, pre0, n * N, 1e-5);
        cmp("v4_hc_weights post", nm, post1, post0, n * N, 1e-5);
        cmp("v4_hc_weights comb", nm, comb1, comb0, n * N * N, 1e-5);
        /* collapse and expand */
        float *h = randv(n * N * D, 1.0), *blk = randv(n * D, 1.0), *o0 = zerof(n * D), *o1 = zerof(n * D);
        float *ho0 = zerof(n * N * D), *ho1 = zerof(n * N * D);
        OK(ps_v4_hc_collapse(ctx, o0, pre0, h, n, N, D));
        for (int64_t e = 0; e < n * D; e++) ps_v4b_hc_collapse(o1, pre0, h, N, D, e);
        cmp("v4_hc_collapse", nm, o1, o0, n * D, 1e-5);
        float *post = randv(n * N, 1.0), *comb = randv(n * N * N, 1.0);
        OK(ps_v4_hc_expand(ctx, ho0, post, comb, blk, h, n, N, D));
        for (int64_t e = 0; e < n * N * D; e++) ps_v4b_hc_expand(ho1, post, comb, blk, h, N, D, e);
        cmp("v4_hc_expand", nm, ho1, ho0, n * N * D, 1e-5);
        free(mix), free(x), free(scale), free(base), free(pre0), free(post0), free(comb0), free(pre1), free(post1),
            free(comb1), free(cm), free(h), free(blk), free(o0), free(o1), free(ho0), free(ho1), free(post), free(comb);
    }
}

/* ---------------- compressor, forward and backward ---------------- */

static void test_compressor(void) {
    int64_t geo[][5] = {/* B, T, m, d, overlap */ {2, 16, 4, 5, 0}, {2, 16, 4, 5, 1}, {1, 7, 3, 4, 1}, {1, 7, 3, 4, 0},
                        {2, 3, 4, 3, 1},  {1, 8, 1, 3, 1},  {3, 10, 2, 20, 1}};
    for (size_t gi = 0; gi < sizeof geo / sizeof geo[0]; gi++) {
        int64_t B = geo[gi][0], T = geo[gi][1], m = geo[gi][2], d = geo[gi][3];
        int ov = (int)geo[gi][4];
        int64_t nW = T / m, S = ov ? 2 * m : m, c = ov ? 2 : 1, ng = B * nW * S * d, nz = B * T * c * d;
        char nm[96];
        snprintf(nm, sizeof nm, "B %lld T %lld m %lld d %lld %s", (long long)B, (long long)T, (long long)m, (long long)d,
                 ov ? "CSA" : "HCA");
        float *z = randv(nz, 2.0), *ape = randv(m * c * d, 1.0), *kv = randv(nz, 1.0);
        float *g0 = zerof(ng), *g1 = zerof(ng), *a0 = zerof(ng), *a1 = zerof(ng), *p0 = zerof(B * nW * d),
              *p1 = zerof(B * nW * d);
        OK(ps_v4_comp_slots(ctx, g0, z, ape, B, T, nW, m, d, ov));
        for (int64_t e = 0; e < ng; e++) ps_v4b_comp_slots(g1, z, ape, T, nW, m, d, ov, e);
        cmp("v4_comp_slots", nm, g1, g0, ng, 1e-5);
        OK(ps_v4_slot_softmax(ctx, a0, g0, B * nW, S, d));
        for (int64_t e = 0; e < B * nW * d; e++) ps_v4b_slot_softmax_col(a1, g0, S, d, e);
        cmp("v4_slot_softmax", nm, a1, a0, ng, 1e-5);
        OK(ps_v4_comp_pool(ctx, p0, a0, kv, B, T, nW, m, d, ov));
        for (int64_t e = 0; e < B * nW * d; e++) ps_v4b_comp_pool(p1, a0, kv, T, nW, m, d, ov, e);
        cmp("v4_comp_pool", nm, p1, p0, B * nW * d, 1e-5);
        /* backward: dz (=, zero where no live slot reads), dape (+=), dgate, dalpha, dkv */
        float *dg = randv(ng, 1.0), *dz0 = randv(nz, 1.0), *dz1 = randv(nz, 1.0), *dape0 = randv(m * c * d, 1.0),
              *dape1 = dup(dape0, m * c * d);
        OK(ps_v4_comp_slots_backward(ctx, dz0, dape0, dg, B, T, nW, m, d, ov));
        for (int64_t e = 0; e < nz; e++) ps_v4b_comp_slots_bwd_dz(dz1, dg, T, nW, m, d, ov, e);
        if (B * nW > 0)
            for (int64_t e = 0; e < S * d; e++) ps_v4b_comp_slots_bwd_dape(dape1, dg, B, nW, m, d, ov, e);
        cmp("v4_comp_slots_backward dz", nm, dz1, dz0, nz, 1e-5);
        cmp("v4_comp_slots_backward dape", nm, dape1, dape0, m * c * d, 1e-5);
        float *dal = randv(ng, 1.0), *dgt0 = zerof(ng), *dgt1 = zerof(ng);
        OK(ps_v4_slot_softmax_backward(ctx, dgt0, dal, a0, B * nW, S, d));
        for (int64_t e = 0; e < B * nW * d; e++) ps_v4b_slot_softmax_bwd_col(dgt1, dal, a0, S, d, e);
        cmp("v4_slot_softmax_backward", nm, dgt1, dgt0, ng, 1e-5);
        float *dp = randv(B * nW * d, 1.0), *da0 = randv(ng, 1.0), *da1 = randv(ng, 1.0), *dk0 = randv(nz, 1.0),
              *dk1 = randv(nz, 1.0);
        OK(ps_v4_comp_pool_backward(ctx, da0, dk0, dp, a0, kv, B, T, nW, m, d, ov));
        for (int64_t e = 0; e < ng; e++) ps_v4b_comp_pool_bwd_dalpha(da1, dp, kv, T, nW, m, d, ov, e);
        for (int64_t e = 0; e < nz; e++) ps_v4b_comp_pool_bwd_dkv(dk1, dp, a0, T, nW, m, d, ov, e);
        cmp("v4_comp_pool_backward dalpha", nm, da1, da0, ng, 1e-5);
        cmp("v4_comp_pool_backward dkv", nm, dk1, dk0, nz, 1e-5);
        free(z), free(ape), free(kv), free(g0), free(g1), free(a0), free(a1), free(p0), free(p1), free(dg), free(dz0),
            free(dz1), free(dape0), free(dape1), free(dal), free(dgt0), free(dgt1), free(dp), free(da0), free(da1),
            free(dk0), free(dk1);
    }
    /* slot softmax on its own: columns all -inf (0), a NaN (NaN), a -inf among finite values */
    int64_t G = 3, S = 4, d = 5;
    float *g = randv(G * S * d, 2.0), *a0 = zerof(G * S * d), *a1 = zerof(G * S * d);
    for (int64_t s = 0; s < S; s++) g[(0 * S + s) * d + 1] = -INFINITY;
    g[(1 * S + 2) * d + 3] = NAN;
    g[(2 * S + 1) * d + 0] = -INFINITY;
    OK(ps_v4_slot_softmax(ctx, a0, g, G, S, d));
    for (int64_t e = 0; e < G * d; e++) ps_v4b_slot_softmax_col(a1, g, S, d, e);
    cmp("v4_slot_softmax", "-inf and NaN columns", a1, a0, G * S * d, 1e-5);
    free(g), free(a0), free(a1);
}

/* ---------------- indexer, top-k, routing, experts ---------------- */

static void test_indexer(void) {
    int64_t geo[][5] = {/* B, T, nW, Hi, Di */ {2, 6, 3, 4, 16}, {1, 5, 2, 3, 20}, {2, 9, 4, 1, 7}};
    for (size_t gi = 0; gi < sizeof geo / sizeof geo[0]; gi++) {
        int64_t B = geo[gi][0], T = geo[gi][1], nW = geo[gi][2], Hi = geo[gi][3], Di = geo[gi][4];
        char nm[64];
        snprintf(nm, sizeof nm, "geometry %zu", gi);
        float *iq = randv(B * T * Hi * Di, 1.0), *ik = randv(B * nW * Di, 1.0), *w = randv(B * T * Hi, 1.0);
        float *s0 = zerof(B * T * nW), *s1 = zerof(B * T * nW);
        OK(ps_v4_indexer_scores(ctx, s0, iq, ik, w, B, T, nW, Hi, Di, 0.25f));
        for (int64_t e = 0; e < B * T * nW; e++) ps_v4b_indexer_scores(s1, iq, ik, w, T, nW, Hi, Di, 0.25f, e);
        cmp("v4_indexer_scores", nm, s1, s0, B * T * nW, 1e-5);
        free(iq), free(ik), free(w), free(s0), free(s1);
    }
}

static void test_topk(void) {
    /* n_rows, n_cols, K, rows_per_seq, m, ties (scores rounded to a few values), NaN, bias */
    int64_t geo[][8] = {{18, 4, 2, 9, 2, 0, 0, 0},   {18, 4, 4, 9, 2, 1, 0, 0},   {10, 8, 8, 10, 0, 0, 0, 1},
                        {10, 8, 3, 10, 0, 1, 1, 1},  {10, 8, 3, 10, 0, 1, 1, 0},  {12, 6, 0, 6, 1, 0, 0, 0},
                        {16, 5, 7, 16, 3, 1, 1, 0},  {7, 16, 6, 7, 0, 1, 0, 1},   {20, 3, 3, 5, 1, 1, 1, 0}};
    for (size_t gi = 0; gi < sizeof geo / sizeof geo[0]; gi++) {
        int64_t *G = geo[gi], n_rows = G[0], n_cols = G[1], K = G[2], rps = G[3], m = G[4];
        char nm[128];
        snprintf(nm, sizeof nm, "rows %lld cols %lld K %lld rows_per_seq %lld m %lld%s%s%s", (long long)n_rows,
                 (long long)n_cols, (long long)K, (long long)rps, (long long)m, G[5] ? " ties" : "", G[6] ? " NaN" : "",
                 G[7] ? " bias" : "");
        float *sc = randv(n_rows * n_cols, 1.0), *bias = G[7] ? randv(n_cols, 0.5) : NULL;
        if (G[5])
            for (int64_t i = 0; i < n_rows * n_cols; i++) sc[i] = roundf(sc[i] * 1.5f);
        if (G[5] && bias)
            for (int64_t i = 0; i < n_cols; i++) bias[i] = roundf(bias[i]);
        if (G[6])
            for (int64_t i = 0; i < n_rows * n_cols; i += 5) sc[i] = NAN;
        float *i0 = zerof(n_rows * K), *i1 = zerof(n_rows * K), *gp0 = zerof(n_rows), *gp1 = zerof(n_rows);
        OK(ps_v4_topk(ctx, i0, gp0, sc, bias, n_rows, n_cols, K, rps, m));
        for (int64_t r = 0; r < n_rows; r++) ps_v4b_topk_row(i1, gp1, sc, bias, n_cols, K, rps, m, r);
        cmp("v4_topk idx", nm, i1, i0, n_rows * K, 0);
        cmp("v4_topk gap", nm, gp1, gp0, n_rows, 0);
        /* gap NULL */
        OK(ps_v4_topk(ctx, i0, NULL, sc, bias, n_rows, n_cols, K, rps, m));
        for (int64_t r = 0; r < n_rows; r++) ps_v4b_topk_row(i1, NULL, sc, bias, n_cols, K, rps, m, r);
        cmp("v4_topk idx (no gap)", nm, i1, i0, n_rows * K, 0);
        free(sc), free(bias), free(i0), free(i1), free(gp0), free(gp1);
    }
}

static void test_routing(void) {
    int64_t n = 11, E = 8;
    float *lg = randv(n * E, 8.0);
    lg[0] = 25.0f, lg[1] = -30.0f, lg[2] = 20.0f, lg[3] = 0.0f;
    for (int scoring = 0; scoring < 2; scoring++) {
        float *s0 = zerof(n * E), *s1 = zerof(n * E);
        OK(ps_v4_router_scores(ctx, s0, lg, n * E, scoring));
        for (int64_t e = 0; e < n * E; e++) ps_v4b_router_scores(s1, lg, scoring, e);
        cmp("v4_router_scores", scoring ? "sigmoid" : "sqrtsoftplus", s1, s0, n * E, 1e-5);
        /* learned routing (top-k of the scores, distinct) and hash routing (a table with repeats) */
        for (int hash = 0; hash < 2; hash++)
            for (int64_t k = 1; k <= 4; k += 3) {
                float *idx = zerof(n * k), *w0 = zerof(n * k), *w1 = zerof(n * k);
                if (hash)
                    for (int64_t i = 0; i < n * k; i++) idx[i] = (float)ps_rng_below(&rng_, i % 3 ? E : 2);
                else
                    OK(ps_v4_topk(ctx, idx, NULL, s0, NULL, n, E, k, n, 0));
                OK(ps_v4_route_weights(ctx, w0, s0, idx, n, E, k, 1.5f));
                for (int64_t r = 0; r < n; r++) ps_v4b_route_weights_row(w1, s0, idx, E, k, 1.5f, r);
                char nm[64];
                snprintf(nm, sizeof nm, "%s scoring %d k %lld", hash ? "hash" : "learned", scoring, (long long)k);
                cmp("v4_route_weights", nm, w1, w0, n * k, 1e-5);
                free(idx), free(w0), free(w1);
            }
        free(s0), free(s1);
    }
    free(lg);
    /* clamped SwiGLU, without and with the limit */
    int64_t ne = 301;
    float *g = randv(ne, 6.0), *u = randv(ne, 6.0);
    for (int lim = 0; lim < 2; lim++) {
        float L = lim ? 3.0f : 0.0f, *h0 = zerof(ne), *h1 = zerof(ne);
        OK(ps_v4_swiglu_clamp(ctx, h0, g, u, ne, L));
        for (int64_t e = 0; e < ne; e++) ps_v4b_swiglu_clamp(h1, g, u, L, e);
        cmp("v4_swiglu_clamp", lim ? "limit 3" : "no limit", h1, h0, ne, 1e-5);
        free(h0), free(h1);
    }
    free(g), free(u);
    /* scatter-add with repeated and unordered rows, as the kernel groups them */
    int64_t cases[][3] = {/* n sources, out rows, width */ {9, 5, 7}, {1, 3, 4}, {16, 2, 3}, {6, 12, 1}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        int64_t ns = cases[ci][0], no = cases[ci][1], wd = cases[ci][2];
        int64_t *rows = malloc((size_t)ns * sizeof(int64_t)), *ord = malloc((size_t)(3 * ns + 1) * sizeof(int64_t));
        for (int64_t i = 0; i < ns; i++) rows[i] = ps_rng_below(&rng_, no);
        float *in = randv(ns * wd, 1.0), *w = randv(ns, 1.0), *o0 = randv(no * wd, 1.0), *o1 = dup(o0, no * wd);
        OK(ps_v4_scatter_add_rows(ctx, o0, in, rows, w, ns, wd));
        int64_t ng = ps_v4b_group_rows(rows, ns, ord); /* the launcher's buffer: order [ns], off [ng + 1] */
        int grouped = ng >= 1 && ng <= ns;
        for (int64_t q = 0; q + 1 < ns; q++)
            grouped &= rows[ord[q]] < rows[ord[q + 1]] || (rows[ord[q]] == rows[ord[q + 1]] && ord[q] < ord[q + 1]);
        CHECK(grouped, "scatter-add grouping sorted by (row, i), case %zu", ci);
        /* what the launcher stages: the first ns + ng + 1 entries */
        int64_t *staged = malloc((size_t)(ns + ng + 1) * sizeof(int64_t));
        memcpy(staged, ord, (size_t)(ns + ng + 1) * sizeof(int64_t));
        for (int64_t e = 0; e < ng * wd; e++) ps_v4b_scatter_add(o1, in, rows, w, staged, staged + ns, wd, e);
        free(staged);
        char nm[32];
        snprintf(nm, sizeof nm, "case %zu", ci);
        cmp("v4_scatter_add_rows", nm, o1, o0, no * wd, 1e-5);
        free(rows), free(ord), free(in), free(w), free(o0), free(o1);
    }
    /* grouped linear (BLAS on the CPU: another order) and scale */
    int64_t gl[][4] = {{5, 2, 20, 3}, {3, 4, 7, 5}, {1, 1, 33, 2}};
    for (size_t gi = 0; gi < sizeof gl / sizeof gl[0]; gi++) {
        int64_t M = gl[gi][0], G = gl[gi][1], Kg = gl[gi][2], Ng = gl[gi][3];
        float *inp = randv(M * G * Kg, 1.0), *w = randv(G * Ng * Kg, 1.0), *o0 = zerof(M * G * Ng), *o1 = zerof(M * G * Ng);
        OK(ps_v4_grouped_linear(ctx, o0, inp, w, M, G, Kg, Ng));
        for (int64_t e = 0; e < M * G * Ng; e++) ps_v4b_grouped_linear(o1, inp, w, G, Kg, Ng, e);
        char nm[32];
        snprintf(nm, sizeof nm, "geometry %zu", gi);
        cmp("v4_grouped_linear", nm, o1, o0, M * G * Ng, 1e-4);
        free(inp), free(w), free(o0), free(o1);
    }
    float *x0 = randv(77, 1.0), *x1 = dup(x0, 77);
    OK(ps_v4_scale(ctx, x0, 0.37f, 77));
    for (int64_t e = 0; e < 77; e++) ps_v4b_scale(x1, 0.37f, e);
    cmp("v4_scale", "77", x1, x0, 77, 1e-5);
    free(x0), free(x1);
}

/* ---------------- attention ---------------- */

static void test_attention(int type) {
    /* 0 sliding, 1 HCA (every visible entry), 2 CSA (a selection with empty and out-of-range slots),
     * 3 CSA with K larger than nW's visible entries (early rows) and W beyond T */
    int64_t B = 2, T = 9, H = 3, Dh = 20, W = type == 3 ? 12 : 4, m = type == 0 ? 0 : type == 1 ? 4 : 2;
    int64_t nW = m ? T / m : 0, K = type >= 2 ? 3 : 0, C = T + nW;
    ps_v4_attn_geom g = {.B = B, .T = T, .H = H, .Dh = Dh, .nW = nW, .K = K, .W = W, .m = m, .scale = 0.3f};
    char nm[32];
    snprintf(nm, sizeof nm, "%s", type == 0 ? "sliding" : type == 1 ? "HCA" : type == 2 ? "CSA" : "CSA wide");
    float *q = randv(B * T * H * Dh, 1.0), *kv = randv(B * T * Dh, 1.0), *ckv = randv(B * nW * Dh, 1.0),
          *sink = randv(H, 1.0), *topk = NULL;
    if (K) {
        topk = zerof(B * T * K);
        float *sc = randv(B * T * nW, 1.0);
        OK(ps_v4_topk(ctx, topk, NULL, sc, NULL, B * T, nW, K, T, m));
        topk[1] = (float)nW; /* out of range: skipped */
        topk[K + 2] = -1.0f;
        free(sc);
    }
    int64_t no = B * T * H * Dh, ns = B * H * T, nl = B * H * T * C;
    for (int with_sinkp = 0; with_sinkp < 2; with_sinkp++) {
        float *o0 = zerof(no), *o1 = randv(no, 1.0), *sp0 = zerof(ns), *sp1 = zerof(ns);
        OK(ps_v4_attn(ctx, o0, with_sinkp ? sp0 : NULL, q, kv, ckv, topk, sink, &g));
        for (int64_t e = 0; e < B * T * H; e++) ps_v4b_attn_row(o1, with_sinkp ? sp1 : NULL, q, kv, ckv, topk, sink, &g, e);
        cmp("v4_attn out", nm, o1, o0, no, 1e-5);
        cmp("v4_attn sinkp", nm, sp1, sp0, ns, 1e-5);
        free(o0), free(o1), free(sp0), free(sp1);
    }
    /* the materialised path */
    float *b0 = zerof(B * T * C), *b1 = zerof(B * T * C), *l0 = zerof(nl), *l1 = zerof(nl), *p0 = zerof(nl),
          *p1 = zerof(nl), *sp0 = zerof(ns), *sp1 = zerof(ns), *o0 = zerof(no), *o1 = randv(no, 1.0);
    OK(ps_v4_attn_bias(ctx, b0, topk, &g));
    for (int64_t e = 0; e < B * T * C; e++) ps_v4b_attn_bias(b1, topk, &g, e);
    cmp("v4_attn_bias", nm, b1, b0, B * T * C, 0);
    OK(ps_v4_attn_logits(ctx, l0, q, kv, ckv, b0, &g));
    for (int64_t e = 0; e < nl; e++) ps_v4b_attn_logits(l1, q, kv, ckv, b0, &g, e);
    cmp("v4_attn_logits", nm, l1, l0, nl, 1e-5);
    OK(ps_v4_attn_softmax(ctx, p0, sp0, l0, sink, &g));
    for (int64_t r = 0; r < ns; r++) ps_v4b_attn_softmax_row(p1, sp1, l0, sink, &g, r);
    cmp("v4_attn_softmax pattern", nm, p1, p0, nl, 1e-5);
    cmp("v4_attn_softmax sinkp", nm, sp1, sp0, ns, 1e-5);
    /* in place (pattern aliases logits), no sinkp */
    memcpy(l1, l0, (size_t)nl * sizeof(float));
    for (int64_t r = 0; r < ns; r++) ps_v4b_attn_softmax_row(l1, NULL, l1, sink, &g, r);
    cmp("v4_attn_softmax in place", nm, l1, p0, nl, 1e-5);
    OK(ps_v4_attn_apply(ctx, o0, p0, kv, ckv, &g));
    for (int64_t e = 0; e < B * H * T * Dh; e++) ps_v4b_attn_apply(o1, p0, kv, ckv, &g, e);
    cmp("v4_attn_apply", nm, o1, o0, no, 1e-5);
    /* sink rescale: half the rows get a new mass */
    float *snew = dup(sp0, ns), *r1 = dup(o0, no);
    for (int64_t i = 0; i < ns; i += 2) snew[i] = 0.5f * sp0[i];
    OK(ps_v4_sink_rescale(ctx, o0, sp0, snew, &g));
    for (int64_t e = 0; e < no; e++) ps_v4b_sink_rescale(r1, sp0, snew, &g, e);
    cmp("v4_sink_rescale", nm, r1, o0, no, 1e-5);
    free(b0), free(b1), free(l0), free(l1), free(p0), free(p1), free(sp0), free(sp1), free(o0), free(o1), free(snew),
        free(r1);
    /* the backward (K = 0 only): dq (=), dkv / dckv / dsink (+=), with and without dckv and dsink */
    if (K == 0)
        for (int opt = 0; opt < 2; opt++) {
            float *out = zerof(no), *dout = randv(no, 1.0);
            OK(ps_v4_attn(ctx, out, NULL, q, kv, ckv, NULL, sink, &g));
            float *dq0 = randv(no, 1.0), *dq1 = randv(no, 1.0), *dkv0 = randv(B * T * Dh, 1.0), *dkv1 = dup(dkv0, B * T * Dh),
                  *dc0 = randv(B * nW * Dh, 1.0), *dc1 = dup(dc0, B * nW * Dh), *ds0 = randv(H, 1.0), *ds1 = dup(ds0, H);
            float *ws = zerof(3 * ns), *lse = ws, *Dr = ws + ns, *es = ws + 2 * ns;
            int use_c = opt == 0 && nW > 0, use_s = opt == 0;
            OK(ps_v4_attn_backward(ctx, dq0, dkv0, use_c ? dc0 : NULL, use_s ? ds0 : NULL, dout, out, q, kv, ckv, sink, &g));
            for (int64_t e = 0; e < ns; e++) ps_v4b_attn_bwd_row(dq1, lse, Dr, es, dout, out, q, kv, ckv, sink, &g, e);
            for (int64_t e = 0; e < B * T; e++) ps_v4b_attn_bwd_dkv_row(dkv1, lse, Dr, dout, q, kv, &g, e);
            if (use_c)
                for (int64_t e = 0; e < B * nW; e++) ps_v4b_attn_bwd_dckv_row(dc1, lse, Dr, dout, q, ckv, &g, e);
            if (use_s)
                for (int64_t h = 0; h < H; h++) ps_v4b_attn_bwd_dsink(ds1, es, &g, h);
            char nm2[64];
            snprintf(nm2, sizeof nm2, "%s%s", nm, opt ? ", no dckv / dsink" : "");
            cmp("v4_attn_backward dq", nm2, dq1, dq0, no, 1e-5);
            cmp("v4_attn_backward dkv", nm2, dkv1, dkv0, B * T * Dh, 1e-5);
            cmp("v4_attn_backward dckv", nm2, dc1, dc0, B * nW * Dh, 1e-5);
            cmp("v4_attn_backward dsink", nm2, ds1, ds0, H, 1e-5);
            free(out), free(dout), free(dq0), free(dq1), free(dkv0), free(dkv1), free(dc0), free(dc1), free(ds0), free(ds1),
                free(ws);
        }
    free(q), free(kv), free(ckv), free(sink), free(topk);
}

int main(void) {
    ps_error err;
    ps_rng_seed(&rng_, 20261203);
    if (ps_ctx_create(&ctx, "cpu", &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    test_rope();
    test_hc();
    test_compressor();
    test_indexer();
    test_topk();
    test_routing();
    for (int t = 0; t < 4; t++) test_attention(t);
    ps_ctx_free(ctx);
    CHECK_DONE();
}
