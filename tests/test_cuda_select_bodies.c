/* test_cuda_select_bodies.c — the CUDA backend's block-sparse selection kernels checked without a GPU: every body
 * of core/cuda/select_bodies.h (the arithmetic of core/cuda/select.cu) is run on the host over the whole index
 * space of its kernel, exactly as the kernel partitions it (one call per compressed-key element, per (row, KV
 * head), per block score, per query head, per (key, KV head)), and compared with the CPU backend's op through a
 * "cpu" context and core/ops.h, on seeded inputs over several geometries: a whole pass of two sequences with
 * grouped heads, one of 70 rows, a prefill chunk at position 30 with blocks scored past its keys, and rows too
 * early to see any compressed key; top-k with ties, forced (+inf) and NaN scores; attention and its backward
 * dense and over blocks a hook might write (repeated ids, -1, ids past the row's block). The backward bodies
 * compute dk / dv per key (gathering over rows) where the CPU scatters per row: a different order of the same sums.
 *
 * Tolerances: compressed keys, block scores and top-k exactly; scores and attention 1e-5 relative elementwise
 * (with a floor of 1e-2 of the tensor's largest magnitude: outputs near zero are sums that cancel), the backward
 * 1e-4. Built in every build (no CUDA toolkit needed). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/cuda/select_bodies.h"
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

/* got vs want elementwise: equal (infinities, NaN with NaN), or |got - want| <= tol · (|want| + 1e-2 · max|want|) */
static void cmp(const char *what, const char *geo, const float *got, const float *want, int64_t n, double tol) {
    double big = 0;
    for (int64_t i = 0; i < n; i++)
        if (isfinite(want[i]) && fabs(want[i]) > big) big = fabs(want[i]);
    int64_t bad = -1;
    for (int64_t i = 0; i < n && bad < 0; i++) {
        float a = got[i], b = want[i];
        if (a == b || (isnan(a) && isnan(b))) continue;
        double d = fabs((double)a - (double)b), lim = tol * (fabs((double)b) + 1e-2 * big);
        if (!(d <= lim)) bad = i;
    }
    CHECK(bad < 0, "%s [%s]: element %lld of %lld: body %.9g, cpu %.9g", what, geo, (long long)bad, (long long)n,
          bad >= 0 ? (double)got[bad] : 0.0, bad >= 0 ? (double)want[bad] : 0.0);
}

/* B, n, pos0, extra blocks, H, Hkv, D, K, S, block, init, local, topk */
static const int64_t GEO[][13] = {{2, 40, 0, 0, 4, 2, 8, 4, 2, 8, 1, 1, 2}, {1, 70, 0, 0, 2, 1, 16, 8, 4, 16, 1, 1, 1},
                                  {1, 9, 30, 3, 4, 2, 8, 4, 2, 4, 0, 1, 3},  {2, 6, 0, 0, 3, 3, 5, 4, 4, 4, 2, 0, 2},
                                  {1, 33, 0, 1, 2, 2, 20, 8, 2, 8, 1, 2, 3}};

static void test_geometry(int gi) {
    const int64_t *x = GEO[gi];
    ps_select_cfg sc = {.kernel = x[7], .stride = x[8], .block = x[9], .init_blocks = x[10], .local_blocks = x[11], .topk = x[12]};
    int64_t L = x[2] + x[1];
    ps_sel_geom g = {.B = x[0], .n = x[1], .pos0 = x[2], .L = L, .H = x[4], .Hkv = x[5], .D = x[6], .sel = sc,
                     .N1 = ps_select_n_windows(L, sc.kernel, sc.stride), .N2 = ps_select_n_windows(L, 4 * sc.kernel, 4 * sc.stride),
                     .nb = ps_select_n_blocks(&sc, L) + x[3]};
    char nm[160];
    snprintf(nm, sizeof nm, "geometry %d: B %lld n %lld pos0 %lld L %lld H %lld Hkv %lld D %lld N1 %lld N2 %lld nb %lld", gi,
             (long long)g.B, (long long)g.n, (long long)g.pos0, (long long)L, (long long)g.H, (long long)g.Hkv, (long long)g.D,
             (long long)g.N1, (long long)g.N2, (long long)g.nb);
    int64_t ks = g.Hkv * g.D, ns = ps_select_slots(&sc), nq = g.B * g.n * g.H * g.D, nk = g.B * L * ks, nl = g.B * g.n * g.H;
    int64_t nP = g.B * g.n * g.Hkv * g.N1, nbs = g.B * g.n * g.Hkv * g.nb, nbl = g.B * g.n * g.Hkv * ns;
    float *q = randv(nq, 1), *k = randv(nk, 1), *v = randv(nk, 1), *dz = randv(nq, 1);

    /* compressed keys, both levels */
    float *c1 = zerof(g.B * g.N1 * ks), *c2 = zerof(g.B * g.N2 * ks), *b1 = zerof(g.B * g.N1 * ks), *b2 = zerof(g.B * g.N2 * ks);
    OK(ps_select_compress(ctx, c1, k, g.B, L, g.Hkv, g.D, sc.kernel, sc.stride));
    OK(ps_select_compress(ctx, c2, k, g.B, L, g.Hkv, g.D, 4 * sc.kernel, 4 * sc.stride));
    for (int64_t e = 0; e < g.B * g.N1 * ks; e++) ps_selb_compress(b1, k, L, ks, g.N1, sc.kernel, sc.stride, e);
    for (int64_t e = 0; e < g.B * g.N2 * ks; e++) ps_selb_compress(b2, k, L, ks, g.N2, 4 * sc.kernel, 4 * sc.stride, e);
    cmp("select_compress level 1", nm, b1, c1, g.B * g.N1 * ks, 0);
    cmp("select_compress level 2", nm, b2, c2, g.B * g.N2 * ks, 0);

    /* stage-1 scores over the CPU's compressed keys (a row before any level-2 key: zeros) */
    float *P0 = zerof(nP), *P1 = randv(nP, 1);
    OK(ps_select_scores(ctx, P0, q, c1, c2, &g));
    for (int64_t ih = 0; ih < g.B * g.n * g.Hkv && g.N1 > 0; ih++) ps_selb_scores_row(P1, q, c1, c2, &g, ih);
    cmp("select_scores", nm, P1, P0, nP, 1e-5);

    /* block scores and top-k, over scores with ties, forced blocks and NaN */
    float *bs0 = zerof(nbs), *bs1 = zerof(nbs);
    OK(ps_select_block_scores(ctx, bs0, P0, &g));
    for (int64_t e = 0; e < nbs; e++) ps_selb_block_score(bs1, P0, &g, e);
    cmp("select_block_scores", nm, bs1, bs0, nbs, 0);
    float *sc2 = randv(nbs, 2);
    for (int64_t i = 0; i < nbs; i++) sc2[i] = i % 7 == 3 ? INFINITY : i % 11 == 5 ? NAN : roundf(sc2[i]);
    for (int pass = 0; pass < 2; pass++) {
        const float *src = pass ? sc2 : bs0;
        float *t0 = zerof(nbl), *t1 = zerof(nbl);
        OK(ps_select_topk(ctx, t0, src, &g));
        for (int64_t r = 0; r < g.B * g.n * g.Hkv; r++) ps_selb_topk_row(t1, src, &g, r);
        cmp(pass ? "select_topk (ties, NaN)" : "select_topk", nm, t1, t0, nbl, 0);
        free(t0), free(t1);
    }

    /* attention and its backward: the top-k's blocks, blocks as a hook might write them, and dense */
    float *blk = zerof(nbl), *hook = zerof(nbl);
    OK(ps_select_topk(ctx, blk, bs0, &g));
    for (int64_t i = 0; i < nbl; i++) hook[i] = (float)((int64_t)(ps_rng_uniform(&rng_) * (double)(g.nb + 1)) - 1);
    for (int w = 0; w < 3; w++) {
        const float *bl = w == 0 ? blk : w == 1 ? hook : NULL;
        char nw[200];
        snprintf(nw, sizeof nw, "%s, %s", nm, w == 0 ? "top-k blocks" : w == 1 ? "hook blocks" : "dense");
        float *z0 = zerof(nq), *z1 = zerof(nq), *l0 = zerof(nl), *l1 = zerof(nl);
        OK(ps_select_attn(ctx, z0, l0, q, k, v, bl, &g));
        for (int64_t r = 0; r < nl; r++) ps_selb_attn_row(z1, l1, q, k, v, bl, &g, r);
        cmp("select_attn z", nw, z1, z0, nq, 1e-5);
        cmp("select_attn lse", nw, l1, l0, nl, 1e-5);
        float *dq0 = randv(nq, 1), *dk0 = randv(nk, 1), *dv0 = randv(nk, 1), *dq1 = dup(dq0, nq), *dk1 = dup(dk0, nk),
              *dv1 = dup(dv0, nk);
        OK(ps_select_backward(ctx, dq0, dk0, dv0, dz, z0, l0, q, k, v, bl, &g));
        for (int64_t r = 0; r < nl; r++) ps_selb_dq_row(dq1, dz, z0, l0, q, k, v, bl, &g, r);
        for (int64_t e = 0; e < g.B * L * g.Hkv; e++) ps_selb_dkv_row(dk1, dv1, dz, z0, l0, q, k, v, bl, &g, e);
        cmp("select_backward dq", nw, dq1, dq0, nq, 1e-4);
        cmp("select_backward dk", nw, dk1, dk0, nk, 1e-4);
        cmp("select_backward dv", nw, dv1, dv0, nk, 1e-4);
        free(z0), free(z1), free(l0), free(l1), free(dq0), free(dk0), free(dv0), free(dq1), free(dk1), free(dv1);
    }
    free(q), free(k), free(v), free(dz), free(c1), free(c2), free(b1), free(b2), free(P0), free(P1), free(bs0), free(bs1),
        free(sc2), free(blk), free(hook);
}

int main(void) {
    ps_error err;
    ps_rng_seed(&rng_, 20261207);
    if (ps_ctx_create(&ctx, "cpu", &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    for (int gi = 0; gi < (int)(sizeof GEO / sizeof GEO[0]); gi++) test_geometry(gi);
    ps_ctx_free(ctx);
    CHECK_DONE();
}
