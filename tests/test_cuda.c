/* test_cuda.c — the CUDA backend against the CPU reference (docs/cuda.md; ctest label `cuda`).
 *
 * Without a CUDA device (no driver, the stub libcuda, or 0 devices) it checks that a cuda context fails
 * cleanly — one line naming the reason, the model staying usable on the CPU — prints "skipped: no CUDA
 * device" and passes (CI). As a device check (PS_REQUIRE_DEVICE=1 or --require-device; scripts/gpu_check.sh
 * sets it) seeing no device is a failure: it prints "FAIL: no CUDA device ..." and exits 1. With a device:
 *   - every op of the table on random inputs, CPU vs CUDA (fp32: 1e-5 elementwise, 1e-4 where the
 *     summation order differs: products, attention); the DeepSeek-V4 block op by op (core/cuda/v4.cu:
 *     rope, mHC, CSA/HCA compressors and their backward, indexer, top-k, routing, experts, attention
 *     flash and materialised with its backward; 1e-5, 1e-4 for the grouped linear and the attention
 *     backward, indices exactly);
 *   - forward and gradients of small random models of every variant (full, compressed learned and
 *     uniform gates, per-offset and shared payloads, overlapping windows, no RoPE / qk-norm, untied
 *     head; B = 2) and of the conformance models: logits < 1e-4, gradients < 1e-3 relative per tensor;
 *   - the DeepSeek-V4 conformance models (hub3, mix4) moved to the device (ps_v4_model_to_backend):
 *     logits < 1e-4 relative, plain and through the materialised attention with host hooks;
 *   - the knockout and gate instruments through hooks (mean replacement) on both devices;
 *   - the sweep command on both devices (same result JSON apart from provenance), and tf32/bf16 runs
 *     of a forward against fp32 at their stated tolerances;
 *   - a short training run on the device against the cpu (first losses < 1e-4 relative), stopped and
 *     resumed on the device (train --device, train/train.c).
 * usage: test_cuda [BUILD_DIR] (the sweep check runs BUILD_DIR/phasescope). */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "core/backward.h"
#include "core/chunks.h"
#include "check.h"
#include "core/cuda/cuda_ops.h"
#include "core/forward.h"
#include "core/hooks.h"
#include "core/model.h"
#include "core/rng.h"
#include "testutil.h"
#include "core/tokens.h"
#include "train/train.h"
#include "core/v4/v4_forward.h"
#include "core/v4/v4_hooks.h"
#include "core/v4/v4_model.h"

static ps_ctx *CPU, *GPU;
/* PS_TEST_CUDA_DRY_RUN=1: the "device" is a context of the test backend cpu-staged (checks the test's own code and the
 * device-side paths on a machine without a GPU; every comparison is then cpu against cpu) */
static const char *DEV = "cuda";

/* REQUIRE_OK for main: the test cannot go on */
#define REQUIRE_OK_MAIN(call, errp)                                                  \
    do {                                                                             \
        if ((call) != 0) {                                                           \
            fprintf(stderr, "FAIL %s:%d: %s: %s\n", __FILE__, __LINE__, #call, (errp)->msg); \
            printf("%d passed, %d failed\n", check_pass_, check_fail_ + 1);          \
            return 1;                                                                \
        }                                                                            \
    } while (0)

/* ---------------- helpers ---------------- */

static float *rnd(int64_t n, uint64_t seed, float scale) {
    float *x = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    ps_rng r;
    ps_rng_seed(&r, seed);
    for (int64_t i = 0; i < n; i++) x[i] = (float)(ps_rng_normal(&r) * scale);
    return x;
}

static float *dup(const float *x, int64_t n) {
    float *y = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    memcpy(y, x, (size_t)n * sizeof(float));
    return y;
}

/* a device copy of host floats (NULL stays NULL) */
static float *up(const float *h, int64_t n) {
    if (!h) return NULL;
    ps_error err;
    float *d = ps_buf_alloc(GPU, (n > 0 ? n : 1) * (int64_t)sizeof(float), "test input", &err);
    if (!d) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
    if (n > 0 && ps_buf_from_host(GPU, d, h, n * (int64_t)sizeof(float), &err)) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
    return d;
}

static void dfree(void *d) {
    if (d) ps_buf_free(GPU, d, 0);
}

/* compare a device array with the CPU's result; frees nothing */
static void cmp_dev(const char *what, const float *dev, const float *ref, int64_t n, double tol) {
    ps_error err;
    float *h = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    int ok = ps_buf_to_host(GPU, h, dev, n * (int64_t)sizeof(float), &err) == 0;
    CHECK(ok, "%s: copy back failed: %s", what, err.msg);
    if (ok) {
        double r = rel_err_f(h, ref, n);
        CHECK(r <= tol, "%s: relative error %.3g (tolerance %.1g)", what, r, tol);
    }
    free(h);
}

/* both contexts healthy after the ops */
static void ops_ok(const char *what) {
    ps_error err;
    CHECK(ps_ctx_check(CPU, &err) == 0, "%s (cpu): %s", what, err.msg);
    CHECK(ps_ctx_check(GPU, &err) == 0, "%s (cuda): %s", what, err.msg);
}

static ps_attn_geom geom(int64_t B, int64_t T, int64_t nh, int64_t nkv, int64_t hd, int compressed, int64_t W, int64_t S,
                         int64_t LWin) {
    ps_attn_geom g = {.B = B, .T = T, .nh = nh, .nkv = nkv, .hd = hd, .compressed = compressed};
    if (compressed) {
        g.W = W, g.S = S, g.LW = LWin < T ? LWin : T;
        g.nW = T >= W ? (T - W) / S + 1 : 0;
        g.ncols = g.nW + g.LW;
    } else
        g.ncols = T;
    return g;
}

/* ---------------- ops ---------------- */

static void test_linear(void) {
    int64_t M = 37, K = 70, N = 29;
    float *x = rnd(M * K, 1, 1), *w = rnd(N * K, 2, 1), *o = rnd(M * N, 3, 1), *o2 = dup(o, M * N);
    float *dx = up(x, M * K), *dw = up(w, N * K), *dout = up(o, M * N);
    for (int acc = 0; acc < 2; acc++) {
        ps_matmul(CPU, o2, x, w, M, K, N, acc);
        ps_matmul(GPU, dout, dx, dw, M, K, N, acc);
        cmp_dev(acc ? "matmul (accumulate)" : "matmul", dout, o2, M * N, 1e-5);
    }
    /* backward: dinp and dw accumulate */
    float *g = rnd(M * N, 4, 1), *di = rnd(M * K, 5, 1), *dwt = rnd(N * K, 6, 1);
    float *dg = up(g, M * N), *ddi = up(di, M * K), *ddw = up(dwt, N * K);
    ps_matmul_backward(CPU, di, dwt, g, x, w, M, K, N);
    ps_matmul_backward(GPU, ddi, ddw, dg, dx, dw, M, K, N);
    cmp_dev("matmul backward (input)", ddi, di, M * K, 1e-5);
    cmp_dev("matmul backward (weight)", ddw, dwt, N * K, 1e-5);
    ps_matmul_backward(CPU, NULL, dwt, g, x, w, M, K, N);
    ps_matmul_backward(GPU, NULL, ddw, dg, dx, dw, M, K, N);
    cmp_dev("matmul backward (weight only)", ddw, dwt, N * K, 1e-5);
    ops_ok("linear");
    free(x), free(w), free(o), free(o2), free(g), free(di), free(dwt);
    dfree(dx), dfree(dw), dfree(dout), dfree(dg), dfree(ddi), dfree(ddw);
}

static void test_rows_ops(void) {
    ps_error err;
    int64_t V = 50, C = 33, n = 45;
    int32_t tok[45];
    for (int i = 0; i < n; i++) tok[i] = (i * 7 + i / 3) % 11; /* repeated tokens */
    float *table = rnd(V * C, 10, 1), *out = rnd(n * C, 11, 1), *dtab = up(table, V * C), *dout = up(out, n * C);
    ps_embed(CPU, out, tok, table, n, C);
    ps_embed(GPU, dout, tok, dtab, n, C);
    cmp_dev("embed", dout, out, n * C, 0);
    float *g = rnd(n * C, 12, 1), *dt = rnd(V * C, 13, 1), *dg = up(g, n * C), *ddt = up(dt, V * C);
    ps_embed_backward(CPU, dt, g, tok, n, C);
    ps_embed_backward(GPU, ddt, dg, tok, n, C);
    cmp_dev("embed backward (bit-identical)", ddt, dt, V * C, 0);
    /* RMSNorm: C = 33 and a wide row */
    for (int wide = 0; wide < 2; wide++) {
        int64_t R = wide ? 9 : 70, CC = wide ? 1500 : 33;
        float *x = rnd(R * CC, 14, 2), *w = rnd(CC, 15, 1), *y = rnd(R * CC, 16, 1), *rs = rnd(R, 17, 1);
        float *dx = up(x, R * CC), *dw = up(w, CC), *dy = up(y, R * CC), *drs = up(rs, R);
        ps_rmsnorm(CPU, y, rs, x, w, R, CC, 1e-6f);
        ps_rmsnorm(GPU, dy, drs, dx, dw, R, CC, 1e-6f);
        cmp_dev("rmsnorm", dy, y, R * CC, 1e-5);
        cmp_dev("rmsnorm rstd", drs, rs, R, 1e-5);
        float *go = rnd(R * CC, 18, 1), *gi = rnd(R * CC, 19, 1), *gw = rnd(CC, 20, 1);
        float *dgo = up(go, R * CC), *dgi = up(gi, R * CC), *dgw = up(gw, CC);
        ps_rmsnorm_backward(CPU, gi, gw, go, x, w, rs, R, CC);
        ps_rmsnorm_backward(GPU, dgi, dgw, dgo, dx, dw, drs, R, CC);
        cmp_dev("rmsnorm backward (input)", dgi, gi, R * CC, 1e-5);
        cmp_dev("rmsnorm backward (weight)", dgw, gw, CC, 1e-5);
        /* in place: out aliases inp */
        ps_rmsnorm(CPU, x, NULL, x, w, R, CC, 1e-5f);
        ps_rmsnorm(GPU, dx, NULL, dx, dw, R, CC, 1e-5f);
        cmp_dev("rmsnorm in place", dx, x, R * CC, 1e-5);
        free(x), free(w), free(y), free(rs), free(go), free(gi), free(gw);
        dfree(dx), dfree(dw), dfree(dy), dfree(drs), dfree(dgo), dfree(dgi), dfree(dgw);
    }
    /* RoPE */
    int64_t npos = 40, hd = 12, ns = 2, rps = 20, nh = 3;
    float *cs = rnd(npos * hd / 2, 21, 1), *sn = rnd(npos * hd / 2, 22, 1), *dcs = up(cs, npos * hd / 2), *dsn = up(sn, npos * hd / 2);
    ps_rope_table(CPU, cs, sn, npos, hd, 10000.0);
    ps_rope_table(GPU, dcs, dsn, npos, hd, 10000.0);
    cmp_dev("rope table cos", dcs, cs, npos * hd / 2, 1e-6);
    cmp_dev("rope table sin", dsn, sn, npos * hd / 2, 1e-6);
    ps_buf_from_host(GPU, dcs, cs, npos * hd / 2 * 4, &err);
    ps_buf_from_host(GPU, dsn, sn, npos * hd / 2 * 4, &err);
    float *x = rnd(ns * rps * nh * hd, 23, 1), *dx = up(x, ns * rps * nh * hd);
    ps_rope(CPU, x, cs, sn, ns, rps, nh, hd, 2);
    ps_rope(GPU, dx, dcs, dsn, ns, rps, nh, hd, 2);
    cmp_dev("rope", dx, x, ns * rps * nh * hd, 1e-5);
    ps_rope_backward(CPU, x, cs, sn, ns, rps, nh, hd, 1);
    ps_rope_backward(GPU, dx, dcs, dsn, ns, rps, nh, hd, 1);
    cmp_dev("rope backward", dx, x, ns * rps * nh * hd, 1e-5);
    /* SwiGLU, add, copy, fill */
    int64_t m = 1000;
    float *a = rnd(m, 24, 3), *b = rnd(m, 25, 1), *h = rnd(m, 26, 1), *h2 = rnd(m, 27, 1);
    float *da = up(a, m), *db = up(b, m), *dh = up(h, m), *dh2 = up(h2, m);
    ps_swiglu(CPU, h, a, b, m);
    ps_swiglu(GPU, dh, da, db, m);
    cmp_dev("swiglu", dh, h, m, 1e-5);
    ps_swiglu_backward(CPU, h2, h, b, a, b, m); /* dg -> h2, du -> h (in: dh = b) */
    ps_swiglu_backward(GPU, dh2, dh, db, da, db, m);
    cmp_dev("swiglu backward (g)", dh2, h2, m, 1e-5);
    cmp_dev("swiglu backward (u)", dh, h, m, 1e-5);
    ps_add(CPU, a, a, b, m);
    ps_add(GPU, da, da, db, m);
    cmp_dev("add (aliased)", da, a, m, 0);
    ps_copy(CPU, h, a, m);
    ps_copy(GPU, dh, da, m);
    cmp_dev("copy", dh, h, m, 0);
    ps_fill(CPU, h, 0.0f, m);
    ps_fill(GPU, dh, 0.0f, m);
    cmp_dev("fill 0", dh, h, m, 0);
    ps_fill(CPU, h, 2.5f, m - 3);
    ps_fill(GPU, dh, 2.5f, m - 3);
    cmp_dev("fill", dh, h, m, 0);
    /* gather / scatter (a row listed twice: the last one wins) */
    int64_t rows[6] = {3, 0, 7, 3, 9, 1}, W = 17, nr = 12;
    float *in = rnd(nr * W, 28, 1), *add = rnd(6 * W, 29, 1), *o = rnd(6 * W, 30, 1), *sc = rnd(nr * W, 31, 1);
    float *din = up(in, nr * W), *dadd = up(add, 6 * W), *dout2 = up(o, 6 * W), *dsc = up(sc, nr * W);
    ps_gather_rows(CPU, o, in, add, rows, 6, W);
    ps_gather_rows(GPU, dout2, din, dadd, rows, 6, W);
    cmp_dev("gather rows (+add)", dout2, o, 6 * W, 0);
    ps_gather_rows(CPU, o, in, NULL, rows, 6, W);
    ps_gather_rows(GPU, dout2, din, NULL, rows, 6, W);
    cmp_dev("gather rows", dout2, o, 6 * W, 0);
    ps_scatter_rows(CPU, sc, add, rows, 6, W);
    ps_scatter_rows(GPU, dsc, dadd, rows, 6, W);
    cmp_dev("scatter rows", dsc, sc, nr * W, 0);
    ops_ok("rows and elementwise");
    free(table), free(out), free(g), free(dt), free(cs), free(sn), free(x), free(a), free(b), free(h), free(h2);
    free(in), free(add), free(o), free(sc);
    dfree(dtab), dfree(dout), dfree(dg), dfree(ddt), dfree(dcs), dfree(dsn), dfree(dx), dfree(da), dfree(db), dfree(dh);
    dfree(dh2), dfree(din), dfree(dadd), dfree(dout2), dfree(dsc);
}

static void test_hook_ops(void) {
    int64_t B = 3, npos = 10, nh = 4, hd = 6, n = B * npos * nh * hd;
    float *x = rnd(n, 40, 1), *src = rnd(npos * hd, 41, 1), *dx = up(x, n), *dsrc = up(src, npos * hd);
    ps_head_set(CPU, x, src, hd, B, npos, nh, hd, 2, 1, 3);
    ps_head_set(GPU, dx, dsrc, hd, B, npos, nh, hd, 2, 1, 3);
    cmp_dev("head_set", dx, x, n, 0);
    ps_head_set(CPU, x, src, 0, B, npos, nh, hd, 1, 0, 2);
    ps_head_set(GPU, dx, dsrc, 0, B, npos, nh, hd, 1, 0, 2);
    cmp_dev("head_set (broadcast)", dx, x, n, 0);
    ps_head_set(CPU, x, NULL, 0, B, npos, nh, hd, 0, 0, 3);
    ps_head_set(GPU, dx, NULL, 0, B, npos, nh, hd, 0, 0, 3);
    cmp_dev("head_set (zero)", dx, x, n, 0);
    ps_error err;
    CHECK(ps_head_set(GPU, dx, NULL, 0, B, npos, nh, hd, 7, 0, 3) != 0 && ps_ctx_check(GPU, &err) != 0 &&
              strstr(err.msg, "out of range"),
          "head_set out of range must fail");
    ps_add_vector(CPU, x, src, 0.5f, B * npos, nh * hd / 2);
    ps_add_vector(GPU, dx, dsrc, 0.5f, B * npos, nh * hd / 2);
    cmp_dev("add_vector", dx, x, n, 1e-6);
    ps_roll_blocks(CPU, x, 5, 12, 3, 4, 2);
    ps_roll_blocks(GPU, dx, 5, 12, 3, 4, 2);
    cmp_dev("roll_blocks", dx, x, n, 0);
    ps_copy_blocks(CPU, x + 5, 40, 8, src, 0, 6, 3, 4, 6, 0, 0.0f);
    ps_copy_blocks(GPU, dx + 5, 40, 8, dsrc, 0, 6, 3, 4, 6, 0, 0.0f);
    cmp_dev("copy_blocks", dx, x, n, 0);
    ps_copy_blocks(CPU, x + 1, 50, 7, src, 6, 0, 4, 3, 5, 1, -1.5f);
    ps_copy_blocks(GPU, dx + 1, 50, 7, dsrc, 6, 0, 4, 3, 5, 1, -1.5f);
    cmp_dev("copy_blocks (accumulate)", dx, x, n, 1e-6);
    ps_copy_blocks(CPU, x + 2, 60, 9, NULL, 0, 0, 2, 5, 4, 0, 0.0f);
    ps_copy_blocks(GPU, dx + 2, 60, 9, NULL, 0, 0, 2, 5, 4, 0, 0.0f);
    cmp_dev("copy_blocks (zero)", dx, x, n, 0);
    /* sums over sequences, in double */
    int64_t m = npos * nh * hd;
    double *sum = calloc((size_t)m, sizeof(double)), *hsum = calloc((size_t)m, sizeof(double));
    double *dsum = ps_buf_alloc(GPU, m * 8, "sums", &err);
    float *mean = rnd(m, 42, 1), *dmean = up(mean, m);
    for (int k = 0; k < 2; k++) {
        ps_accumulate_seqs(CPU, sum, x, B, m);
        ps_accumulate_seqs(GPU, dsum, dx, B, m);
    }
    ps_buf_to_host(GPU, hsum, dsum, m * 8, &err);
    double worst = 0;
    for (int64_t i = 0; i < m; i++) worst = fmax(worst, fabs(hsum[i] - sum[i]));
    CHECK(worst == 0, "accumulate_seqs: differs by %g", worst);
    ps_sum_to_mean(CPU, mean, sum, 6.0, m);
    ps_sum_to_mean(GPU, dmean, dsum, 6.0, m);
    cmp_dev("sum_to_mean", dmean, mean, m, 0);
    CHECK(ps_sum_to_mean(GPU, dmean, dsum, 0.0, m) != 0 && ps_ctx_check(GPU, &err) != 0, "sum_to_mean with count 0 must fail");
    /* attribution patching's dot products: a shared source (a mean) and a per-sequence one, accumulated */
    {
        float *gg = rnd(n, 43, 1), *dgg = up(gg, n), *xs = rnd(n, 44, 1), *dxs = up(xs, n);
        /* [2, B*nh] in one block, as the device buffer is laid out */
        int64_t nd = B * nh;
        double *dd = calloc((size_t)(2 * nd), sizeof(double)), *hd2 = calloc((size_t)(2 * nd), sizeof(double));
        double *ddd = ps_buf_alloc(GPU, 2 * B * nh * 8, "dots", &err);
        ps_buf_from_host(GPU, ddd, dd, 2 * B * nh * 8, &err);
        for (int k = 0; k < 2; k++) {
            ps_delta_dot(CPU, dd, gg, x, mean, 1, B, npos, nh, hd);
            ps_delta_dot(GPU, ddd, dgg, dx, dmean, 1, B, npos, nh, hd);
        }
        ps_delta_dot(CPU, dd + nd, gg, x, xs, B, B, npos, nh, hd);
        ps_delta_dot(GPU, ddd + B * nh, dgg, dx, dxs, B, B, npos, nh, hd);
        ps_buf_to_host(GPU, hd2, ddd, 2 * B * nh * 8, &err);
        double w2 = 0;
        for (int j = 0; j < 2; j++)
            for (int64_t i = 0; i < nd; i++) w2 = fmax(w2, fabs(hd2[j * nd + i] - dd[j * nd + i]) / (1 + fabs(dd[j * nd + i])));
        CHECK(w2 < 1e-9, "delta_dot: differs by %g (relative)", w2);
        free(gg), free(xs), free(dd), free(hd2);
        dfree(dgg), dfree(dxs);
        ps_buf_free(GPU, ddd, 2 * B * nh * 8);
    }
    ops_ok("hook actions");
    free(x), free(src), free(sum), free(hsum), free(mean);
    dfree(dx), dfree(dsrc), dfree(dsum), dfree(dmean);
}

static void test_compressor_ops(int64_t B, int64_t T, int64_t d, int64_t W, int64_t S, int64_t nkv, int64_t hd, int shared) {
    char what[160];
    int64_t nW = T >= W ? (T - W) / S + 1 : 0, n = B * nW * nkv, nk = nkv * hd;
    snprintf(what, sizeof what, "compressor B%lld T%lld d%lld W%lld S%lld nkv%lld hd%lld%s", (long long)B, (long long)T,
             (long long)d, (long long)W, (long long)S, (long long)nkv, (long long)hd, shared ? " shared" : "");
    float *a = rnd(B * T * d, 50, 1), *u = rnd(W * nkv * d, 51, 0.3f), *bias = rnd(W * nkv, 52, 0.3f);
    float *z = rnd(n * W, 53, 1), *al = rnd(n * W, 54, 1);
    float *da_ = up(a, B * T * d), *du = up(u, W * nkv * d), *dbias = up(bias, W * nkv), *dz = up(z, n * W), *dal = up(al, n * W);
    char w2[200];
    int64_t *wtab = malloc((size_t)(2 * B * nW + 1) * sizeof *wtab); /* the base grid's window table */
    ps_windows wt = ps_windows_grid(wtab, wtab + B * nW, B, T, nW, W, S, nkv, NULL);
    for (int uni = 0; uni < 2; uni++) {
        ps_gate(CPU, z, al, a, uni ? NULL : u, uni ? NULL : bias, d, &wt);
        ps_gate(GPU, dz, dal, da_, uni ? NULL : du, uni ? NULL : dbias, d, &wt);
        snprintf(w2, sizeof w2, "%s: gate%s logits", what, uni ? " (uniform)" : "");
        cmp_dev(w2, dz, z, n * W, 1e-5);
        snprintf(w2, sizeof w2, "%s: gate%s alpha", what, uni ? " (uniform)" : "");
        cmp_dev(w2, dal, al, n * W, 1e-5);
    }
    ps_gate(CPU, z, al, a, u, bias, d, &wt);
    ps_gate(GPU, dz, dal, da_, du, dbias, d, &wt);
    /* gate backward */
    float *gal = rnd(n * W, 55, 1), *ga = rnd(B * T * d, 56, 1), *gu = rnd(W * nkv * d, 57, 1), *gb = rnd(W * nkv, 58, 1);
    float *dgal = up(gal, n * W), *dga = up(ga, B * T * d), *dgu = up(gu, W * nkv * d), *dgb = up(gb, W * nkv);
    ps_gate_backward(CPU, ga, gu, gb, gal, al, a, u, d, &wt);
    ps_gate_backward(GPU, dga, dgu, dgb, dgal, dal, da_, du, d, &wt);
    snprintf(w2, sizeof w2, "%s: gate backward da", what);
    cmp_dev(w2, dga, ga, B * T * d, 1e-5);
    snprintf(w2, sizeof w2, "%s: gate backward du", what);
    cmp_dev(w2, dgu, gu, W * nkv * d, 1e-5);
    snprintf(w2, sizeof w2, "%s: gate backward dbias", what);
    cmp_dev(w2, dgb, gb, W * nkv, 1e-5);
    snprintf(w2, sizeof w2, "%s: gate backward dz", what);
    cmp_dev(w2, dgal, gal, n * W, 1e-5);
    /* payloads */
    int64_t nC = shared ? nk * d : W * nk * d, nP = B * nW * W * nk;
    float *Cw = rnd(nC, 60, 0.3f), *P = rnd(nP, 61, 1), *scr = rnd(B * T * nk, 62, 1);
    float *dC = up(Cw, nC), *dP = up(P, nP), *dscr = up(scr, B * T * nk);
    ps_payload(CPU, P, a, Cw, shared, scr, d, hd, &wt);
    ps_payload(GPU, dP, da_, dC, shared, dscr, d, hd, &wt);
    snprintf(w2, sizeof w2, "%s: payload", what);
    cmp_dev(w2, dP, P, nP, 1e-5);
    float *gP = rnd(nP, 63, 1), *gC = rnd(nC, 64, 1), *dgP = up(gP, nP), *dgC = up(gC, nC);
    ps_payload_backward(CPU, ga, gC, gP, a, Cw, shared, scr, d, hd, &wt);
    ps_payload_backward(GPU, dga, dgC, dgP, da_, dC, shared, dscr, d, hd, &wt);
    snprintf(w2, sizeof w2, "%s: payload backward da", what);
    cmp_dev(w2, dga, ga, B * T * d, 1e-5);
    snprintf(w2, sizeof w2, "%s: payload backward dC", what);
    cmp_dev(w2, dgC, gC, nC, 1e-5);
    /* pooling */
    float *po = rnd(n * hd, 65, 1), *dpo = up(po, n * hd);
    ps_pool(CPU, po, al, P, B, nW, W, nkv, hd);
    ps_pool(GPU, dpo, dal, dP, B, nW, W, nkv, hd);
    snprintf(w2, sizeof w2, "%s: pool", what);
    cmp_dev(w2, dpo, po, n * hd, 1e-5);
    float *gpo = rnd(n * hd, 66, 1), *dgpo = up(gpo, n * hd);
    ps_pool_backward(CPU, gal, gP, gpo, al, P, B, nW, W, nkv, hd);
    ps_pool_backward(GPU, dgal, dgP, dgpo, dal, dP, B, nW, W, nkv, hd);
    snprintf(w2, sizeof w2, "%s: pool backward dalpha", what);
    cmp_dev(w2, dgal, gal, n * W, 1e-5);
    snprintf(w2, sizeof w2, "%s: pool backward dP", what);
    cmp_dev(w2, dgP, gP, nP, 1e-5);
    ops_ok(what);
    free(a), free(u), free(bias), free(z), free(al), free(gal), free(ga), free(gu), free(gb), free(Cw), free(P), free(scr);
    free(gP), free(gC), free(po), free(gpo), free(wtab);
    dfree(da_), dfree(du), dfree(dbias), dfree(dz), dfree(dal), dfree(dgal), dfree(dga), dfree(dgu), dfree(dgb), dfree(dC);
    dfree(dP), dfree(dscr), dfree(dgP), dfree(dgC), dfree(dpo), dfree(dgpo);
}

/* Window grids with offsets (woff, may be NULL) or content chunks (cs/cl [B, nC], when cs is given) and the
 * gate regulariser (grid.cu): every op against the CPU's (1e-5 where the device sums in the CPU's order,
 * 1e-4 for the per-offset payload products, which the CPU hands to sgemm). */
static void test_grid_ops(const char *label, int64_t B, int64_t T, int64_t d, int64_t W, int64_t S, int64_t nkv, int64_t hd,
                          const int64_t *woff, const int64_t *cs, const int64_t *cl, int64_t nC) {
    const int chunks = cs != NULL;
    const int64_t nW = chunks ? nC : (T >= W ? (T - W) / S + 1 : 0), n = B * nW * nkv, nk = nkv * hd;
    /* the window table: the chunks, or the grid (per head with woff, else the base grid) */
    int64_t *wtab = malloc((size_t)(2 * B * nW * nkv + 1) * sizeof *wtab);
    const ps_windows wt = chunks ? ps_windows_chunks(wtab, wtab + B * nW, cs, cl, B, T, nW, W, nkv)
                                 : ps_windows_grid(wtab, wtab + B * nW * (woff ? nkv : 1), B, T, nW, W, S, nkv, woff);
#define GATE(ctx, z, al, a, u, b) ps_gate(ctx, z, al, a, u, b, d, &wt)
#define GATE_BWD(ctx, da, du, db, dal, al, a, u) ps_gate_backward(ctx, da, du, db, dal, al, a, u, d, &wt)
#define PAYLOAD(ctx, P, a, C, sh, scr) ps_payload(ctx, P, a, C, sh, scr, d, hd, &wt)
#define PAYLOAD_BWD(ctx, da, dC, dP, a, C, sh, scr) ps_payload_backward(ctx, da, dC, dP, a, C, sh, scr, d, hd, &wt)
#define ROPE(ctx, x, ct, st, inv) ps_rope_windows(ctx, x, ct, st, hd, &wt, inv)
    char w2[240];
    float *a = rnd(B * T * d, 150, 1), *u = rnd(W * nkv * d, 151, 0.3f), *bias = rnd(W * nkv, 152, 0.3f);
    float *z = rnd(n * W, 153, 1), *al = rnd(n * W, 154, 1);
    float *da_ = up(a, B * T * d), *du = up(u, W * nkv * d), *dbias = up(bias, W * nkv), *dz = up(z, n * W), *dal = up(al, n * W);
    for (int uni = 0; uni < 2; uni++) {
        GATE(CPU, z, al, a, uni ? NULL : u, uni ? NULL : bias);
        GATE(GPU, dz, dal, da_, uni ? NULL : du, uni ? NULL : dbias);
        snprintf(w2, sizeof w2, "%s: gate%s logits", label, uni ? " (uniform)" : "");
        cmp_dev(w2, dz, z, n * W, 1e-5);
        snprintf(w2, sizeof w2, "%s: gate%s alpha", label, uni ? " (uniform)" : "");
        cmp_dev(w2, dal, al, n * W, 1e-5);
    }
    GATE(CPU, z, al, a, u, bias);
    GATE(GPU, dz, dal, da_, du, dbias);
    /* gate backward */
    float *gal = rnd(n * W, 155, 1), *ga = rnd(B * T * d, 156, 1), *gu = rnd(W * nkv * d, 157, 1), *gb = rnd(W * nkv, 158, 1);
    float *dgal = up(gal, n * W), *dga = up(ga, B * T * d), *dgu = up(gu, W * nkv * d), *dgb = up(gb, W * nkv);
    GATE_BWD(CPU, ga, gu, gb, gal, al, a, u);
    GATE_BWD(GPU, dga, dgu, dgb, dgal, dal, da_, du);
    snprintf(w2, sizeof w2, "%s: gate backward da", label);
    cmp_dev(w2, dga, ga, B * T * d, 1e-5);
    snprintf(w2, sizeof w2, "%s: gate backward du", label);
    cmp_dev(w2, dgu, gu, W * nkv * d, 1e-5);
    snprintf(w2, sizeof w2, "%s: gate backward dbias", label);
    cmp_dev(w2, dgb, gb, W * nkv, 1e-5);
    snprintf(w2, sizeof w2, "%s: gate backward dz", label);
    cmp_dev(w2, dgal, gal, n * W, 1e-5);
    /* the gate regulariser: value (host double) and dalpha */
    double v_cpu = 0.5, v_gpu = 0.5;
    ps_gate_entropy(CPU, &v_cpu, gal, al, B, nW, nkv, W, 0.3);
    ps_gate_entropy(GPU, &v_gpu, dgal, dal, B, nW, nkv, W, 0.3);
    CHECK(fabs(v_gpu - v_cpu) <= 1e-9 * fabs(v_cpu), "%s: gate_entropy value %.12g, cpu %.12g", label, v_gpu, v_cpu);
    snprintf(w2, sizeof w2, "%s: gate_entropy dalpha", label);
    cmp_dev(w2, dgal, gal, n * W, 1e-5);
    /* payloads, per offset and shared, and their backward */
    for (int shared = 0; shared < 2; shared++) {
        int64_t nCw = shared ? nk * d : W * nk * d, nP = B * nW * W * nk;
        double tol = shared ? 1e-5 : 1e-4;
        float *Cw = rnd(nCw, 160 + (uint64_t)shared, 0.3f), *P = rnd(nP, 162, 1), *scr = rnd(B * T * nk, 163, 1);
        float *dC = up(Cw, nCw), *dP = up(P, nP), *dscr = up(scr, B * T * nk);
        PAYLOAD(CPU, P, a, Cw, shared, scr);
        PAYLOAD(GPU, dP, da_, dC, shared, dscr);
        snprintf(w2, sizeof w2, "%s: payload%s", label, shared ? " (shared)" : "");
        cmp_dev(w2, dP, P, nP, tol);
        float *gP = rnd(nP, 164, 1), *gC = rnd(nCw, 165, 1), *dgP = up(gP, nP), *dgC = up(gC, nCw);
        PAYLOAD_BWD(CPU, ga, gC, gP, a, Cw, shared, scr);
        PAYLOAD_BWD(GPU, dga, dgC, dgP, da_, dC, shared, dscr);
        snprintf(w2, sizeof w2, "%s: payload%s backward da", label, shared ? " (shared)" : "");
        cmp_dev(w2, dga, ga, B * T * d, tol);
        snprintf(w2, sizeof w2, "%s: payload%s backward dC", label, shared ? " (shared)" : "");
        cmp_dev(w2, dgC, gC, nCw, tol);
        free(Cw), free(P), free(scr), free(gP), free(gC);
        dfree(dC), dfree(dP), dfree(dscr), dfree(dgP), dfree(dgC);
    }
    /* RoPE of the compressed keys, forward and inverse (each device's own table) */
    int64_t half = hd / 2;
    float *ct = rnd(T * half, 170, 1), *st = rnd(T * half, 171, 1), *dct = up(ct, T * half), *dst = up(st, T * half);
    ps_rope_table(CPU, ct, st, T, hd, 10000.0);
    ps_rope_table(GPU, dct, dst, T, hd, 10000.0);
    for (int inv = 0; inv < 2; inv++) {
        float *x = rnd(n * hd, 172 + (uint64_t)inv, 1), *dx = up(x, n * hd);
        ROPE(CPU, x, ct, st, inv);
        ROPE(GPU, dx, dct, dst, inv);
        snprintf(w2, sizeof w2, "%s: rope%s", label, inv ? " (inverse)" : "");
        cmp_dev(w2, dx, x, n * hd, 1e-5);
        free(x);
        dfree(dx);
    }
#undef GATE
#undef GATE_BWD
#undef PAYLOAD
#undef PAYLOAD_BWD
#undef ROPE
    ops_ok(label);
    free(a), free(u), free(bias), free(z), free(al), free(gal), free(ga), free(gu), free(gb), free(ct), free(st), free(wtab);
    dfree(da_), dfree(du), dfree(dbias), dfree(dz), dfree(dal), dfree(dgal), dfree(dga), dfree(dgu), dfree(dgb), dfree(dct);
    dfree(dst);
}

/* content chunks of B random sequences from the real chunker (chunk_min < W: short and absent chunks) */
static void test_chunk_ops(const char *label, int64_t B, int64_t T, int64_t d, int64_t W, int64_t S, int64_t m, int64_t nkv,
                           int64_t hd) {
    ps_config c = tu_config(PS_ATTN_COMPRESSED);
    c.window = W, c.stride = S, c.local_window = W, c.boundaries = PS_BOUNDARIES_CONTENT, c.chunk_min = m;
    int64_t nC = ps_config_n_windows(&c, T);
    int64_t *cs = calloc((size_t)(B * nC + 1), sizeof(int64_t)), *cl = calloc((size_t)(B * nC + 1), sizeof(int64_t));
    int32_t *tok = malloc((size_t)T * sizeof(int32_t));
    for (int64_t b = 0; b < B; b++) {
        tu_random_tokens(tok, T, 11, 180 + (uint64_t)b);
        ps_content_chunks(&c, tok, T, nC, cs + b * nC, cl + b * nC);
    }
    test_grid_ops(label, B, T, d, W, S, nkv, hd, NULL, cs, cl, nC);
    free(cs), free(cl), free(tok);
}

static void test_attention(ps_attn_geom g, const char *label) {
    char what[200], w2[260];
    ps_error err;
    snprintf(what, sizeof what, "attention %s (B%lld T%lld h%lld/%lld hd%lld%s)", label, (long long)g.B, (long long)g.T,
             (long long)g.nh, (long long)g.nkv, (long long)g.hd, g.compressed ? " compressed" : "");
    int64_t B = g.B, T = g.T, nq = B * T * g.nh * g.hd, nk = B * T * g.nkv * g.hd, nc = B * g.nW * g.nkv * g.hd;
    float *q = rnd(nq, 70, 1), *k = rnd(nk, 71, 1), *v = rnd(nk, 72, 1), *ck = rnd(nc, 73, 1), *cv = rnd(nc, 74, 1);
    float *z = rnd(nq, 75, 1), *lse = rnd(B * g.nh * T, 76, 1);
    float *dq_ = up(q, nq), *dk_ = up(k, nk), *dv_ = up(v, nk), *dck = up(ck, nc), *dcv = up(cv, nc), *dz = up(z, nq),
          *dlse = up(lse, B * g.nh * T);
    ps_attn_forward(CPU, z, lse, q, k, v, ck, cv, &g);
    ps_attn_forward(GPU, dz, dlse, dq_, dk_, dv_, dck, dcv, &g);
    snprintf(w2, sizeof w2, "%s: forward z", what);
    cmp_dev(w2, dz, z, nq, 1e-4);
    snprintf(w2, sizeof w2, "%s: forward lse", what);
    cmp_dev(w2, dlse, lse, B * g.nh * T, 1e-5);
    /* backward: dq written, the rest accumulated */
    float *gz = rnd(nq, 77, 1), *gq = rnd(nq, 78, 1), *gk = rnd(nk, 79, 1), *gv = rnd(nk, 80, 1), *gck = rnd(nc, 81, 1),
          *gcv = rnd(nc, 82, 1);
    float *dgz = up(gz, nq), *dgq = up(gq, nq), *dgk = up(gk, nk), *dgv = up(gv, nk), *dgck = up(gck, nc), *dgcv = up(gcv, nc);
    ps_attn_backward(CPU, gq, gk, gv, gck, gcv, gz, z, lse, q, k, v, ck, cv, &g);
    ps_attn_backward(GPU, dgq, dgk, dgv, dgck, dgcv, dgz, dz, dlse, dq_, dk_, dv_, dck, dcv, &g);
    const char *names[5] = {"dq", "dk", "dv", "dck", "dcv"};
    float *dev[5] = {dgq, dgk, dgv, dgck, dgcv}, *ref[5] = {gq, gk, gv, gck, gcv};
    int64_t ns[5] = {nq, nk, nk, nc, nc};
    for (int i = 0; i < (g.compressed && g.nW ? 5 : 3); i++) {
        snprintf(w2, sizeof w2, "%s: backward %s", what, names[i]);
        cmp_dev(w2, dev[i], ref[i], ns[i], 1e-4);
    }
    /* the materialised path and the layouts */
    int64_t np = B * g.nh * T * g.ncols, wide = B * g.nh * T * (g.compressed ? g.nW + T : T);
    float *pr = rnd(np, 83, 1), *full = rnd(wide, 84, 1), *dpr = up(pr, np), *dfull = up(full, wide);
    ps_attn_probs(CPU, pr, q, k, ck, &g);
    ps_attn_probs(GPU, dpr, dq_, dk_, dck, &g);
    snprintf(w2, sizeof w2, "%s: probabilities", what);
    cmp_dev(w2, dpr, pr, np, 1e-5);
    ps_attn_out(CPU, z, pr, v, cv, &g);
    ps_attn_out(GPU, dz, dpr, dv_, dcv, &g);
    snprintf(w2, sizeof w2, "%s: output from probabilities", what);
    cmp_dev(w2, dz, z, nq, 1e-4);
    if (g.compressed) {
        ps_pattern_expand(CPU, full, pr, &g);
        ps_pattern_expand(GPU, dfull, dpr, &g);
        snprintf(w2, sizeof w2, "%s: pattern expand", what);
        cmp_dev(w2, dfull, full, wide, 1e-5);
        for (int64_t i = 0; i < wide; i += 3) full[i] += 0.25f; /* a hook's edit, seen and unseen entries */
        ps_buf_from_host(GPU, dfull, full, wide * 4, &err);
        ps_pattern_compact(CPU, pr, full, &g);
        ps_pattern_compact(GPU, dpr, dfull, &g);
    } else {
        for (int64_t i = 0; i < np; i += 3) pr[i] += 0.25f;
        ps_buf_from_host(GPU, dpr, pr, np * 4, &err);
        ps_pattern_compact(CPU, pr, pr, &g);
        ps_pattern_compact(GPU, dpr, dpr, &g);
    }
    snprintf(w2, sizeof w2, "%s: pattern compact", what);
    cmp_dev(w2, dpr, pr, np, 1e-5);
    /* chosen rows */
    int64_t rows[5] = {0, T - 1, T / 2, B * T - 1, B * T / 2 + 1};
    float *zr = rnd(5 * g.nh * g.hd, 85, 1), *dzr = up(zr, 5 * g.nh * g.hd);
    ps_attn_rows(CPU, zr, rows, 5, q, k, v, ck, cv, &g);
    ps_attn_rows(GPU, dzr, rows, 5, dq_, dk_, dv_, dck, dcv, &g);
    snprintf(w2, sizeof w2, "%s: rows", what);
    cmp_dev(w2, dzr, zr, 5 * g.nh * g.hd, 1e-4);
    /* prefill chunks of sequence 0 against the whole frame: rows [q_off, q_off + Tq) */
    for (int64_t q_off = 0; q_off < T; q_off += T / 3 + 1) {
        int64_t Tq = T - q_off < T / 3 + 1 ? T - q_off : T / 3 + 1;
        ps_attn_frame f = {.nh = g.nh, .nkv = g.nkv, .hd = g.hd, .compressed = g.compressed, .W = g.W, .S = g.S, .LW = g.LW,
                           .nW = g.nW, .Tq = Tq, .Tk = T, .q_off = q_off, .pos0 = 0,
                           .woff = g.compressed && !g.cend ? g.woff : NULL}; /* sequence 0's grid offsets [nkv] */
        int64_t nz = Tq * g.nh * g.hd;
        float *zc = rnd(nz, 86, 1), *dzc = up(zc, nz);
        ps_attn_chunk(CPU, zc, q + q_off * g.nh * g.hd, k, v, ck, cv, &f);
        ps_attn_chunk(GPU, dzc, dq_ + q_off * g.nh * g.hd, dk_, dv_, dck, dcv, &f);
        snprintf(w2, sizeof w2, "%s: prefill chunk at %lld", what, (long long)q_off);
        cmp_dev(w2, dzc, zc, nz, 1e-4);
        free(zc);
        dfree(dzc);
    }
    ops_ok(what);
    free(q), free(k), free(v), free(ck), free(cv), free(z), free(lse), free(gz), free(gq), free(gk), free(gv), free(gck);
    free(gcv), free(pr), free(full), free(zr);
    dfree(dq_), dfree(dk_), dfree(dv_), dfree(dck), dfree(dcv), dfree(dz), dfree(dlse), dfree(dgz), dfree(dgq), dfree(dgk);
    dfree(dgv), dfree(dgck), dfree(dgcv), dfree(dpr), dfree(dfull), dfree(dzr);
}

/* attention on window grids with offsets (woff [B, nkv]) and on content chunks (cend [B, nC] from the real
 * chunker): every attention op through test_attention */
static void test_grid_attention(void) {
    int64_t wo1[4] = {0, 1, 2, 0}, wo2[2] = {3, 5};
    ps_attn_geom g = geom(2, 75, 4, 2, 8, 1, 6, 3, 5);
    g.woff = wo1;
    test_attention(g, "W6/S3 overlapping, staggered offsets");
    g = geom(1, 600, 2, 2, 16, 1, 8, 8, 8);
    g.woff = wo2;
    test_attention(g, "W8/S8 staggered, two tiles of windows");
    ps_config c = tu_config(PS_ATTN_COMPRESSED);
    c.window = 8, c.stride = 4, c.local_window = 6, c.boundaries = PS_BOUNDARIES_CONTENT, c.chunk_min = 2;
    int64_t B = 2, T = 400, nC = ps_config_n_windows(&c, T), real = 0; /* T 400: about 115 real chunks, two 64-wide tiles */
    int64_t *cs = calloc((size_t)(B * nC), sizeof(int64_t)), *cl = calloc((size_t)(B * nC), sizeof(int64_t));
    int64_t *cend = malloc((size_t)(B * nC) * sizeof(int64_t));
    int32_t *tok = malloc((size_t)T * sizeof(int32_t));
    for (int64_t b = 0; b < B; b++) {
        tu_random_tokens(tok, T, 11, 190 + (uint64_t)b);
        int64_t k = ps_content_chunks(&c, tok, T, nC, cs + b * nC, cl + b * nC);
        for (int64_t j = 0; j < nC; j++) cend[b * nC + j] = j < k ? cs[b * nC + j] + cl[b * nC + j] - 1 : INT64_MAX;
        real = k > real ? k : real;
    }
    CHECK(real > 64, "content chunks W8/S4/min2 at T %lld: %lld real chunks, not two 64-wide tiles", (long long)T, (long long)real);
    g = geom(B, T, 4, 2, 8, 1, 8, 4, 6);
    g.nW = nC, g.ncols = nC + g.LW, g.cend = cend;
    test_attention(g, "content chunks W8/S4/min2, two tiles of chunks");
    free(cs), free(cl), free(cend), free(tok);
}

static void test_loss_optim(void) {
    int64_t R = 13, V = 3001;
    float *lg = rnd(R * V, 90, 3), *dl = rnd(R * V, 91, 1), *dlg = up(lg, R * V), *ddl = up(dl, R * V);
    int32_t tg[13];
    for (int i = 0; i < R; i++) tg[i] = i % 4 == 1 ? -1 : (i * 997) % V;
    double l1 = 0.5, l2 = 0.5;
    int64_t n1 = 1, n2 = 1;
    ps_cross_entropy(CPU, &l1, &n1, dl, lg, tg, R, V, 0.1f);
    ps_cross_entropy(GPU, &l2, &n2, ddl, dlg, tg, R, V, 0.1f);
    CHECK(n1 == n2 && fabs(l1 - l2) <= 1e-6 * fabs(l1), "cross entropy: loss %.9g vs %.9g, targets %lld vs %lld", l2, l1,
          (long long)n2, (long long)n1);
    cmp_dev("cross entropy gradient", ddl, dl, R * V, 1e-5);
    l2 = 0;
    ps_cross_entropy(GPU, &l2, NULL, NULL, dlg, tg, R, V, 1.0f);
    CHECK(fabs(0.5 + l2 - l1) <= 1e-6 * fabs(l1), "cross entropy without gradient: %.9g", l2);
    /* sum of squares: the same value on every call */
    int64_t n = 1000003;
    float *x = rnd(n, 92, 1), *dx = up(x, n);
    double s1, s2, s3;
    ps_sumsq(CPU, &s1, x, n);
    ps_sumsq(GPU, &s2, dx, n);
    ps_sumsq(GPU, &s3, dx, n);
    CHECK(fabs(s1 - s2) <= 1e-12 * s1 && s2 == s3, "sumsq %.17g vs %.17g (again %.17g)", s2, s1, s3);
    /* AdamW over three segments, bit-identical */
    int64_t P = 70000;
    float *w = rnd(P, 93, 1), *m1 = rnd(P, 94, 0.1f), *m2 = rnd(P, 95, 0.1f), *g = rnd(P, 96, 1);
    for (int64_t i = 0; i < P; i++) m2[i] = fabsf(m2[i]);
    float *dw = up(w, P), *dm1 = up(m1, P), *dm2 = up(m2, P), *dg = up(g, P);
    ps_adamw_seg segs[3] = {{0, 1000, 1e-3f, 0.1f}, {1000, 50000, 3e-4f, 0.0f}, {51000, 19000, 1e-2f, 0.01f}};
    ps_adamw_hyper h = {0.9f, 0.95f, 1e-8f, 0.7f, 1.0f / (1.0f - 0.9f * 0.9f), 1.0f / (1.0f - 0.95f * 0.95f)};
    ps_adamw(CPU, w, m1, m2, g, segs, 3, &h);
    ps_adamw(GPU, dw, dm1, dm2, dg, segs, 3, &h);
    cmp_dev("adamw weights (bit-identical)", dw, w, P, 0);
    cmp_dev("adamw first moment", dm1, m1, P, 0);
    cmp_dev("adamw second moment", dm2, m2, P, 0);
    ops_ok("loss and optimizer");
    free(lg), free(dl), free(x), free(w), free(m1), free(m2), free(g);
    dfree(dlg), dfree(ddl), dfree(dx), dfree(dw), dfree(dm1), dfree(dm2), dfree(dg);
}

/* ---------------- DeepSeek-V4 ops (core/cuda/v4.cu) ---------------- */

#define V4_DEV(name, n) float *name##_d = up(name, (n))
/* allocate a zeroed device buffer of n floats */
static float *dzero(int64_t n) {
    float *z = calloc((size_t)(n > 0 ? n : 1), sizeof(float));
    float *d = up(z, n);
    free(z);
    return d;
}

/* a device array equal to the CPU's elementwise (infinities included, NaN where the CPU has NaN): indices,
 * masks, selections */
static void cmp_dev_exact(const char *what, const float *dev, const float *ref, int64_t n) {
    ps_error err;
    float *h = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    int ok = ps_buf_to_host(GPU, h, dev, n * (int64_t)sizeof(float), &err) == 0;
    CHECK(ok, "%s: copy back failed: %s", what, err.msg);
    int64_t bad = -1;
    for (int64_t i = 0; ok && i < n && bad < 0; i++)
        if (!(h[i] == ref[i] || (isnan(h[i]) && isnan(ref[i])))) bad = i;
    CHECK(!ok || bad < 0, "%s: element %lld: %g, cpu %g", what, (long long)bad, bad >= 0 ? (double)h[bad] : 0.0,
          bad >= 0 ? (double)ref[bad] : 0.0);
    free(h);
}

static void test_v4_rope_hc(void) {
    ps_error err;
    /* rope tables and the rope (rows_per_seq, pos_step, inverse) */
    int64_t n_seq = 2, rps = 5, nh = 3, hd = 16, rd = 8, half = 4;
    for (int v = 0; v < 2; v++) {
        int64_t ps = v ? 3 : 1, n_pos = rps * ps, nx = n_seq * rps * nh * hd;
        double inv[4] = {1.0, 0.3, 0.05, 0.001};
        float *c0 = calloc((size_t)(n_pos * half), 4), *s0 = calloc((size_t)(n_pos * half), 4);
        float *c1 = dzero(n_pos * half), *s1 = dzero(n_pos * half);
        ps_v4_rope_table(CPU, c0, s0, n_pos, half, inv, 1.25f);
        ps_v4_rope_table(GPU, c1, s1, n_pos, half, inv, 1.25f);
        cmp_dev("v4_rope_table cos", c1, c0, n_pos * half, 1e-6);
        cmp_dev("v4_rope_table sin", s1, s0, n_pos * half, 1e-6);
        float *x = rnd(nx, 501 + v, 1.0f);
        V4_DEV(x, nx);
        ps_v4_rope(CPU, x, c0, s0, n_seq, rps, nh, hd, rd, ps, v);
        ps_v4_rope(GPU, x_d, c1, s1, n_seq, rps, nh, hd, rd, ps, v);
        cmp_dev(v ? "v4_rope (pos_step 3, inverse)" : "v4_rope", x_d, x, nx, 1e-5);
        free(c0), free(s0), free(x);
        dfree(c1), dfree(s1), dfree(x_d);
    }
    /* mHC weights (full and head form), collapse, expand */
    int64_t n = 7, N = 4, D = 24;
    for (int head = 0; head < 2; head++) {
        int64_t width = head ? N : (2 + N) * N;
        float *mix = rnd(n * width, 511 + head, 3.0f), *x = rnd(n * N * D, 512, 1.0f), *sc = rnd(3, 513, 1.0f),
              *base = rnd(width, 514, 1.0f);
        float *pre = calloc((size_t)(n * N), 4), *post = calloc((size_t)(n * N), 4), *comb = calloc((size_t)(n * N * N), 4);
        V4_DEV(mix, n * width);
        V4_DEV(x, n * N * D);
        V4_DEV(sc, 3);
        V4_DEV(base, width);
        float *pre_d = dzero(n * N), *post_d = dzero(n * N), *comb_d = dzero(n * N * N);
        ps_v4_hc_weights(CPU, pre, head ? NULL : post, head ? NULL : comb, mix, x, sc, base, n, N, D, head ? 0 : 20, 1e-6f,
                         1e-6f);
        ps_v4_hc_weights(GPU, pre_d, head ? NULL : post_d, head ? NULL : comb_d, mix_d, x_d, sc_d, base_d, n, N, D,
                         head ? 0 : 20, 1e-6f, 1e-6f);
        cmp_dev("v4_hc_weights pre", pre_d, pre, n * N, 1e-5);
        cmp_dev("v4_hc_weights post", post_d, post, n * N, 1e-5);
        cmp_dev("v4_hc_weights comb", comb_d, comb, n * N * N, 1e-5);
        float *out = calloc((size_t)(n * D), 4), *out_d = dzero(n * D), *blk = rnd(n * D, 515, 1.0f),
              *hout = calloc((size_t)(n * N * D), 4), *hout_d = dzero(n * N * D);
        V4_DEV(blk, n * D);
        ps_v4_hc_collapse(CPU, out, pre, x, n, N, D);
        ps_v4_hc_collapse(GPU, out_d, pre_d, x_d, n, N, D);
        cmp_dev("v4_hc_collapse", out_d, out, n * D, 1e-5);
        if (!head) {
            ps_v4_hc_expand(CPU, hout, post, comb, blk, x, n, N, D);
            ps_v4_hc_expand(GPU, hout_d, post_d, comb_d, blk_d, x_d, n, N, D);
            cmp_dev("v4_hc_expand", hout_d, hout, n * N * D, 1e-5);
        }
        free(mix), free(x), free(sc), free(base), free(pre), free(post), free(comb), free(out), free(blk), free(hout);
        dfree(mix_d), dfree(x_d), dfree(sc_d), dfree(base_d), dfree(pre_d), dfree(post_d), dfree(comb_d), dfree(out_d),
            dfree(blk_d), dfree(hout_d);
    }
    (void)err;
    ops_ok("v4 rope and mHC");
}

static void test_v4_compressor(int64_t B, int64_t T, int64_t m, int64_t d, int ov) {
    char nm[160];
    int64_t nW = T / m, S = ov ? 2 * m : m, c = ov ? 2 : 1, ng = B * nW * S * d, nz = B * T * c * d, np = B * nW * d;
    float *z = rnd(nz, 521, 2.0f), *ape = rnd(m * c * d, 522, 1.0f), *kv = rnd(nz, 523, 1.0f);
    V4_DEV(z, nz);
    V4_DEV(ape, m * c * d);
    V4_DEV(kv, nz);
    float *gate = calloc((size_t)ng + 1, 4), *alpha = calloc((size_t)ng + 1, 4), *pool = calloc((size_t)np + 1, 4);
    float *gate_d = dzero(ng), *alpha_d = dzero(ng), *pool_d = dzero(np);
    ps_v4_comp_slots(CPU, gate, z, ape, B, T, nW, m, d, ov);
    ps_v4_comp_slots(GPU, gate_d, z_d, ape_d, B, T, nW, m, d, ov);
    snprintf(nm, sizeof nm, "v4_comp_slots (B %lld T %lld m %lld d %lld %s)", (long long)B, (long long)T, (long long)m,
             (long long)d, ov ? "CSA" : "HCA");
    cmp_dev_exact(nm, gate_d, gate, ng);
    ps_v4_slot_softmax(CPU, alpha, gate, B * nW, S, d);
    ps_v4_slot_softmax(GPU, alpha_d, gate_d, B * nW, S, d);
    cmp_dev("v4_slot_softmax", alpha_d, alpha, ng, 1e-5);
    ps_v4_comp_pool(CPU, pool, alpha, kv, B, T, nW, m, d, ov);
    ps_v4_comp_pool(GPU, pool_d, alpha_d, kv_d, B, T, nW, m, d, ov);
    cmp_dev("v4_comp_pool", pool_d, pool, np, 1e-5);
    /* backward */
    float *dg = rnd(ng, 524, 1.0f), *dz = rnd(nz, 525, 1.0f), *dape = rnd(m * c * d, 526, 1.0f);
    V4_DEV(dg, ng);
    V4_DEV(dz, nz);
    V4_DEV(dape, m * c * d);
    ps_v4_comp_slots_backward(CPU, dz, dape, dg, B, T, nW, m, d, ov);
    ps_v4_comp_slots_backward(GPU, dz_d, dape_d, dg_d, B, T, nW, m, d, ov);
    cmp_dev_exact("v4_comp_slots_backward dz", dz_d, dz, nz);
    cmp_dev("v4_comp_slots_backward dape", dape_d, dape, m * c * d, 1e-6);
    float *dal = rnd(ng, 527, 1.0f), *dgt = calloc((size_t)ng + 1, 4), *dgt_d = dzero(ng);
    V4_DEV(dal, ng);
    ps_v4_slot_softmax_backward(CPU, dgt, dal, alpha, B * nW, S, d);
    ps_v4_slot_softmax_backward(GPU, dgt_d, dal_d, alpha_d, B * nW, S, d);
    cmp_dev("v4_slot_softmax_backward", dgt_d, dgt, ng, 1e-5);
    float *dp = rnd(np, 528, 1.0f), *da = rnd(ng, 529, 1.0f), *dk = rnd(nz, 530, 1.0f);
    V4_DEV(dp, np);
    V4_DEV(da, ng);
    V4_DEV(dk, nz);
    ps_v4_comp_pool_backward(CPU, da, dk, dp, alpha, kv, B, T, nW, m, d, ov);
    ps_v4_comp_pool_backward(GPU, da_d, dk_d, dp_d, alpha_d, kv_d, B, T, nW, m, d, ov);
    cmp_dev("v4_comp_pool_backward dalpha", da_d, da, ng, 1e-5);
    cmp_dev("v4_comp_pool_backward dkv", dk_d, dk, nz, 1e-5);
    ops_ok(nm);
    free(z), free(ape), free(kv), free(gate), free(alpha), free(pool), free(dg), free(dz), free(dape), free(dal), free(dgt),
        free(dp), free(da), free(dk);
    dfree(z_d), dfree(ape_d), dfree(kv_d), dfree(gate_d), dfree(alpha_d), dfree(pool_d), dfree(dg_d), dfree(dz_d),
        dfree(dape_d), dfree(dal_d), dfree(dgt_d), dfree(dp_d), dfree(da_d), dfree(dk_d);
}

static void test_v4_select_route(void) {
    ps_error err;
    /* indexer scores, then top-k of them with visibility (rows_per_seq, m), ties and a bias */
    int64_t B = 2, T = 12, nW = 6, Hi = 3, Di = 20, m = 2;
    float *iq = rnd(B * T * Hi * Di, 541, 1.0f), *ik = rnd(B * nW * Di, 542, 1.0f), *w = rnd(B * T * Hi, 543, 1.0f);
    float *sc = calloc((size_t)(B * T * nW), 4), *sc_d = dzero(B * T * nW);
    V4_DEV(iq, B * T * Hi * Di);
    V4_DEV(ik, B * nW * Di);
    V4_DEV(w, B * T * Hi);
    ps_v4_indexer_scores(CPU, sc, iq, ik, w, B, T, nW, Hi, Di, 0.25f);
    ps_v4_indexer_scores(GPU, sc_d, iq_d, ik_d, w_d, B, T, nW, Hi, Di, 0.25f);
    cmp_dev("v4_indexer_scores", sc_d, sc, B * T * nW, 1e-5);
    /* top-k on the same (host) scores on both sides, so the selection must agree exactly */
    for (int v = 0; v < 4; v++) {
        int64_t K = v == 0 ? 3 : v == 1 ? nW : v == 2 ? 2 : 0, mm = v == 1 ? 0 : m;
        float *s = dup(sc, B * T * nW), *bias = v == 2 ? rnd(nW, 544, 1.0f) : NULL;
        if (v == 2)
            for (int64_t i = 0; i < B * T * nW; i++) s[i] = roundf(s[i]), bias[i % nW] = roundf(bias[i % nW]);
        V4_DEV(s, B * T * nW);
        V4_DEV(bias, nW);
        float *idx = calloc((size_t)(B * T * K) + 1, 4), *gap = calloc((size_t)(B * T), 4), *idx_d = dzero(B * T * K),
              *gap_d = dzero(B * T);
        ps_v4_topk(CPU, idx, gap, s, bias, B * T, nW, K, T, mm);
        ps_v4_topk(GPU, idx_d, gap_d, s_d, bias_d, B * T, nW, K, T, mm);
        char nm[64];
        snprintf(nm, sizeof nm, "v4_topk idx (variant %d)", v);
        cmp_dev_exact(nm, idx_d, idx, B * T * K);
        snprintf(nm, sizeof nm, "v4_topk gap (variant %d)", v);
        cmp_dev_exact(nm, gap_d, gap, B * T);
        free(s), free(bias), free(idx), free(gap);
        dfree(s_d), dfree(bias_d), dfree(idx_d), dfree(gap_d);
    }
    /* router scores (both scorings), route weights (learned and hash rows with a repeat), bad index */
    int64_t n = 9, E = 8, k = 3;
    float *lg = rnd(n * E, 545, 8.0f);
    V4_DEV(lg, n * E);
    for (int scoring = 0; scoring < 2; scoring++) {
        float *rs = calloc((size_t)(n * E), 4), *rs_d = dzero(n * E);
        ps_v4_router_scores(CPU, rs, lg, n * E, scoring);
        ps_v4_router_scores(GPU, rs_d, lg_d, n * E, scoring);
        cmp_dev(scoring ? "v4_router_scores sigmoid" : "v4_router_scores sqrtsoftplus", rs_d, rs, n * E, 1e-5);
        float *ix = calloc((size_t)(n * k), 4), *wt = calloc((size_t)(n * k), 4), *wt_d = dzero(n * k);
        for (int64_t i = 0; i < n * k; i++) ix[i] = (float)((i * 5 + scoring) % (i % 4 ? E : 2));
        V4_DEV(ix, n * k);
        ps_v4_route_weights(CPU, wt, rs, ix, n, E, k, 1.5f);
        ps_v4_route_weights(GPU, wt_d, rs_d, ix_d, n, E, k, 1.5f);
        cmp_dev("v4_route_weights", wt_d, wt, n * k, 1e-5);
        ops_ok("v4 routing");
        float bad[3] = {0, 9, 1};
        float *bad_d = up(bad, 3);
        CHECK(ps_v4_route_weights(GPU, wt_d, rs_d, bad_d, 1, E, 3, 1.0f) != 0 && ps_ctx_check(GPU, &err) != 0 &&
                  strstr(err.msg, "v4_route_weights: expert index 9 at row 0"),
              "bad expert index: %s", err.msg);
        free(rs), free(ix), free(wt);
        dfree(rs_d), dfree(ix_d), dfree(wt_d), dfree(bad_d);
    }
    /* clamped SwiGLU, scatter-add (host rows and weights, a repeated row), grouped linear, scale */
    int64_t ne = 1000;
    float *g = rnd(ne, 546, 6.0f), *u = rnd(ne, 547, 6.0f), *h = calloc((size_t)ne, 4), *h_d = dzero(ne);
    V4_DEV(g, ne);
    V4_DEV(u, ne);
    ps_v4_swiglu_clamp(CPU, h, g, u, ne, 3.0f);
    ps_v4_swiglu_clamp(GPU, h_d, g_d, u_d, ne, 3.0f);
    cmp_dev("v4_swiglu_clamp", h_d, h, ne, 1e-5);
    int64_t rows[7] = {4, 1, 4, 0, 2, 1, 4}, ns = 7, width = 33;
    float *in = rnd(ns * width, 548, 1.0f), *rw = rnd(ns, 549, 1.0f), *out = rnd(5 * width, 550, 1.0f);
    V4_DEV(in, ns * width);
    V4_DEV(out, 5 * width);
    ps_v4_scatter_add_rows(CPU, out, in, rows, rw, ns, width);
    ps_v4_scatter_add_rows(GPU, out_d, in_d, rows, rw, ns, width);
    cmp_dev("v4_scatter_add_rows", out_d, out, 5 * width, 1e-6);
    int64_t M = 6, G = 4, Kg = 40, Ng = 5;
    float *gi = rnd(M * G * Kg, 551, 1.0f), *gw = rnd(G * Ng * Kg, 552, 1.0f), *go = calloc((size_t)(M * G * Ng), 4),
          *go_d = dzero(M * G * Ng);
    V4_DEV(gi, M * G * Kg);
    V4_DEV(gw, G * Ng * Kg);
    ps_v4_grouped_linear(CPU, go, gi, gw, M, G, Kg, Ng);
    ps_v4_grouped_linear(GPU, go_d, gi_d, gw_d, M, G, Kg, Ng);
    cmp_dev("v4_grouped_linear", go_d, go, M * G * Ng, 1e-4);
    ps_v4_scale(CPU, gi, 0.37f, M * G * Kg);
    ps_v4_scale(GPU, gi_d, 0.37f, M * G * Kg);
    cmp_dev_exact("v4_scale", gi_d, gi, M * G * Kg);
    ops_ok("v4 selection, routing, experts");
    free(iq), free(ik), free(w), free(sc), free(lg), free(g), free(u), free(h), free(in), free(rw), free(out), free(gi),
        free(gw), free(go);
    dfree(iq_d), dfree(ik_d), dfree(w_d), dfree(sc_d), dfree(lg_d), dfree(g_d), dfree(u_d), dfree(h_d), dfree(in_d),
        dfree(out_d), dfree(gi_d), dfree(gw_d), dfree(go_d);
}

/* type 0 sliding, 1 HCA (every visible entry), 2 CSA (top-k with an empty and an out-of-range slot) */
static void test_v4_attention(int type) {
    ps_error err;
    int64_t B = 2, T = 37, H = 4, Dh = 40, W = 8, m = type == 0 ? 0 : type == 1 ? 4 : 2, nW = m ? T / m : 0,
            K = type == 2 ? 5 : 0, C = T + nW;
    ps_v4_attn_geom g = {.B = B, .T = T, .H = H, .Dh = Dh, .nW = nW, .K = K, .W = W, .m = m, .scale = 0.16f};
    const char *nm = type == 0 ? "sliding" : type == 1 ? "HCA" : "CSA";
    int64_t no = B * T * H * Dh, ns = B * H * T, nl = B * H * T * C;
    float *q = rnd(no, 561 + type, 1.0f), *kv = rnd(B * T * Dh, 564, 1.0f), *ckv = rnd(B * nW * Dh, 565, 1.0f),
          *sink = rnd(H, 566, 1.0f), *topk = NULL;
    if (K) {
        float *s = rnd(B * T * nW, 567, 1.0f);
        topk = calloc((size_t)(B * T * K), 4);
        ps_v4_topk(CPU, topk, NULL, s, NULL, B * T, nW, K, T, m);
        topk[K * 20 + 1] = (float)nW, topk[K * 30] = -1.0f;
        free(s);
    }
    V4_DEV(q, no);
    V4_DEV(kv, B * T * Dh);
    V4_DEV(ckv, B * nW * Dh);
    V4_DEV(sink, H);
    V4_DEV(topk, B * T * K);
    char what[96];
    float *out = calloc((size_t)no, 4), *sp = calloc((size_t)ns, 4), *out_d = dzero(no), *sp_d = dzero(ns);
    ps_v4_attn(CPU, out, sp, q, kv, ckv, topk, sink, &g);
    ps_v4_attn(GPU, out_d, sp_d, q_d, kv_d, nW ? ckv_d : NULL, topk_d, sink_d, &g);
    snprintf(what, sizeof what, "v4_attn out (%s)", nm);
    cmp_dev(what, out_d, out, no, 1e-5);
    snprintf(what, sizeof what, "v4_attn sinkp (%s)", nm);
    cmp_dev(what, sp_d, sp, ns, 1e-5);
    /* materialised path; softmax in place as the runtime calls it */
    float *bias = calloc((size_t)(B * T * C), 4), *lg = calloc((size_t)nl, 4), *sp2 = calloc((size_t)ns, 4),
          *o2 = calloc((size_t)no, 4);
    float *bias_d = dzero(B * T * C), *lg_d = dzero(nl), *sp2_d = dzero(ns), *o2_d = dzero(no);
    ps_v4_attn_bias(CPU, bias, topk, &g);
    ps_v4_attn_bias(GPU, bias_d, topk_d, &g);
    snprintf(what, sizeof what, "v4_attn_bias (%s)", nm);
    cmp_dev_exact(what, bias_d, bias, B * T * C);
    ps_v4_attn_logits(CPU, lg, q, kv, ckv, bias, &g);
    ps_v4_attn_logits(GPU, lg_d, q_d, kv_d, ckv_d, bias_d, &g);
    {
        /* -inf entries compare equal; the rest within 1e-5 */
        float *hl = malloc((size_t)nl * 4);
        int okc = ps_buf_to_host(GPU, hl, lg_d, nl * 4, &err) == 0;
        int64_t bad = -1;
        double big = 0;
        for (int64_t i = 0; i < nl; i++)
            if (isfinite(lg[i])) big = fmax(big, fabs(lg[i]));
        for (int64_t i = 0; okc && i < nl && bad < 0; i++)
            if (!(hl[i] == lg[i] || fabs((double)hl[i] - lg[i]) <= 1e-5 * big)) bad = i;
        CHECK(okc && bad < 0, "v4_attn_logits (%s): element %lld", nm, (long long)bad);
        free(hl);
    }
    ps_v4_attn_softmax(CPU, lg, sp2, lg, sink, &g);
    ps_v4_attn_softmax(GPU, lg_d, sp2_d, lg_d, sink_d, &g);
    snprintf(what, sizeof what, "v4_attn_softmax pattern (%s)", nm);
    cmp_dev(what, lg_d, lg, nl, 1e-5);
    snprintf(what, sizeof what, "v4_attn_softmax sinkp (%s)", nm);
    cmp_dev(what, sp2_d, sp2, ns, 1e-5);
    ps_v4_attn_apply(CPU, o2, lg, kv, ckv, &g);
    ps_v4_attn_apply(GPU, o2_d, lg_d, kv_d, ckv_d, &g);
    snprintf(what, sizeof what, "v4_attn_apply (%s)", nm);
    cmp_dev(what, o2_d, o2, no, 1e-5);
    float *snew = dup(sp, ns);
    for (int64_t i = 0; i < ns; i += 3) snew[i] = 0.5f * sp[i];
    V4_DEV(snew, ns);
    ps_v4_sink_rescale(CPU, out, sp, snew, &g);
    ps_v4_sink_rescale(GPU, out_d, sp_d, snew_d, &g);
    snprintf(what, sizeof what, "v4_sink_rescale (%s)", nm);
    cmp_dev(what, out_d, out, no, 1e-5);
    ops_ok(what);
    /* backward (every visible entry: K = 0) */
    if (K == 0) {
        ps_v4_attn(CPU, out, NULL, q, kv, ckv, NULL, sink, &g);
        ps_v4_attn(GPU, out_d, NULL, q_d, kv_d, ckv_d, NULL, sink_d, &g);
        float *dout = rnd(no, 568, 1.0f), *dq = calloc((size_t)no, 4), *dkv = rnd(B * T * Dh, 569, 1.0f),
              *dckv = rnd(B * nW * Dh, 570, 1.0f), *dsink = rnd(H, 571, 1.0f);
        V4_DEV(dout, no);
        V4_DEV(dkv, B * T * Dh);
        V4_DEV(dckv, B * nW * Dh);
        V4_DEV(dsink, H);
        float *dq_d = dzero(no);
        ps_v4_attn_backward(CPU, dq, dkv, nW ? dckv : NULL, dsink, dout, out, q, kv, ckv, sink, &g);
        ps_v4_attn_backward(GPU, dq_d, dkv_d, nW ? dckv_d : NULL, dsink_d, dout_d, out_d, q_d, kv_d, ckv_d, sink_d, &g);
        snprintf(what, sizeof what, "v4_attn_backward dq (%s)", nm);
        cmp_dev(what, dq_d, dq, no, 1e-4);
        snprintf(what, sizeof what, "v4_attn_backward dkv (%s)", nm);
        cmp_dev(what, dkv_d, dkv, B * T * Dh, 1e-4);
        snprintf(what, sizeof what, "v4_attn_backward dckv (%s)", nm);
        cmp_dev(what, dckv_d, dckv, B * nW * Dh, 1e-4);
        snprintf(what, sizeof what, "v4_attn_backward dsink (%s)", nm);
        cmp_dev(what, dsink_d, dsink, H, 1e-4);
        ops_ok(what);
        free(dout), free(dq), free(dkv), free(dckv), free(dsink);
        dfree(dout_d), dfree(dq_d), dfree(dkv_d), dfree(dckv_d), dfree(dsink_d);
    } else {
        float *x_d = dzero(no);
        CHECK(ps_v4_attn_backward(GPU, x_d, x_d, x_d, NULL, x_d, x_d, q_d, kv_d, ckv_d, sink_d, &g) != 0 &&
                  ps_ctx_check(GPU, &err) != 0 && strstr(err.msg, "v4_attn_backward: the indexer's selection"),
              "attention backward with a selection: %s", err.msg);
        dfree(x_d);
    }
    free(q), free(kv), free(ckv), free(sink), free(topk), free(out), free(sp), free(bias), free(lg), free(sp2), free(o2),
        free(snew);
    dfree(q_d), dfree(kv_d), dfree(ckv_d), dfree(sink_d), dfree(topk_d), dfree(out_d), dfree(sp_d), dfree(bias_d),
        dfree(lg_d), dfree(sp2_d), dfree(o2_d), dfree(snew_d);
}

static void test_v4_ops(void) {
    test_v4_rope_hc();
    test_v4_compressor(2, 16, 4, 8, 0);
    test_v4_compressor(2, 16, 4, 8, 1);
    test_v4_compressor(1, 27, 4, 20, 1); /* a partial last window */
    test_v4_compressor(2, 3, 4, 5, 1);   /* no window */
    test_v4_select_route();
    for (int t = 0; t < 3; t++) test_v4_attention(t);
}

/* ---------------- models ---------------- */

/* forward + backward of one model on both devices: logits < 1e-4, loss and per-tensor gradients < 1e-3 */
static void model_parity(const char *label, ps_model *mc, ps_model *mg, const int32_t *tok, const int32_t *tgt, int64_t B,
                         int64_t T) {
    ps_error err;
    ps_acts ac, gc, ag, gg;
    REQUIRE_OK(ps_acts_create(&ac, mc->ctx, &mc->cfg, B, T, true, &err), &err);
    REQUIRE_OK(ps_acts_create(&gc, mc->ctx, &mc->cfg, B, T, false, &err), &err);
    REQUIRE_OK(ps_acts_create(&ag, mg->ctx, &mg->cfg, B, T, true, &err), &err);
    REQUIRE_OK(ps_acts_create(&gg, mg->ctx, &mg->cfg, B, T, false, &err), &err);
    CHECK_OK(ps_forward(mc, &ac, tok, NULL, &err), &err);
    CHECK_OK(ps_forward(mg, &ag, tok, NULL, &err), &err);
    int64_t V = mc->cfg.vocab_size;
    const float *lc = ps_acts_logits_host(&ac, &err), *lg = ps_acts_logits_host(&ag, &err);
    CHECK(lc && lg, "%s: logits: %s", label, err.msg);
    if (lc && lg) {
        double r = rel_err_f(lg, lc, B * T * V);
        CHECK(r < 1e-4, "%s: logits relative error %.3g", label, r);
    }
    int64_t np = mc->n_params, nt = 0;
    for (int64_t i = 0; i < B * T; i++) nt += tgt[i] >= 0;
    float *grc = calloc((size_t)np, sizeof(float)), *grg_h = malloc((size_t)np * sizeof(float));
    float *grg = ps_buf_alloc(mg->ctx, np * 4, "gradients", &err);
    double lsc = 0, lsg = 0;
    int64_t cc = 0, cg = 0;
    CHECK_OK(ps_backward(mc, &ac, &gc, tok, tgt, 1.0f / (float)nt, grc, &lsc, &cc, &err), &err);
    CHECK_OK(ps_backward(mg, &ag, &gg, tok, tgt, 1.0f / (float)nt, grg, &lsg, &cg, &err), &err);
    CHECK(cc == cg && fabs(lsc - lsg) < 1e-4 * fabs(lsc), "%s: loss %.9g vs %.9g", label, lsg, lsc);
    CHECK_OK(ps_buf_to_host(mg->ctx, grg_h, grg, np * 4, &err), &err);
    for (int i = 0; i < mc->n_tensors; i++) {
        const ps_param_info *p = &mc->table[i];
        double r = rel_err_f(grg_h + p->offset, grc + p->offset, p->numel);
        CHECK(r < 1e-3, "%s: gradient of %s relative error %.3g", label, p->name, r);
    }
    free(grc), free(grg_h);
    ps_buf_free(mg->ctx, grg, np * 4);
    ps_acts_free(&ac), ps_acts_free(&gc), ps_acts_free(&ag), ps_acts_free(&gg);
}

static void test_random_models(void) {
    struct {
        const char *name;
        int kind, gate, payload, W, S, LW, rope, qk, tie, nh, nkv, hd;
    } v[] = {
        {"full attention", PS_ATTN_FULL, 0, 0, 0, 0, 0, 1, 1, 1, 4, 2, 4},
        {"full, MHA, hd 40, no rope/qk-norm, untied", PS_ATTN_FULL, 0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 40},
        {"compressed W4/S4 learned per-offset", PS_ATTN_COMPRESSED, PS_GATE_LEARNED, PS_PAYLOAD_PER_OFFSET, 4, 4, 4, 1, 1, 1, 4, 2, 4},
        {"compressed W6/S3 overlapping", PS_ATTN_COMPRESSED, PS_GATE_LEARNED, PS_PAYLOAD_PER_OFFSET, 6, 3, 5, 1, 1, 1, 4, 2, 4},
        {"compressed W4/S2 uniform gate shared payload", PS_ATTN_COMPRESSED, PS_GATE_UNIFORM, PS_PAYLOAD_SHARED, 4, 2, 3, 1, 1, 1, 4, 4, 4},
        {"compressed W8/S8 hd 72 untied", PS_ATTN_COMPRESSED, PS_GATE_LEARNED, PS_PAYLOAD_PER_OFFSET, 8, 8, 8, 1, 0, 0, 2, 1, 72},
        {"compressed W5/S5 shared, no rope", PS_ATTN_COMPRESSED, PS_GATE_LEARNED, PS_PAYLOAD_SHARED, 5, 5, 2, 0, 1, 1, 4, 2, 4},
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        ps_config c = tu_config(v[i].kind);
        c.n_layers = 2;
        c.rope = v[i].rope, c.qk_norm = v[i].qk, c.tie_embeddings = v[i].tie;
        c.n_heads = v[i].nh, c.n_kv_heads = v[i].nkv, c.head_dim = v[i].hd;
        if (v[i].kind == PS_ATTN_COMPRESSED) {
            c.window = v[i].W, c.stride = v[i].S, c.local_window = v[i].LW;
            c.gate = v[i].gate, c.payload = v[i].payload;
        }
        int64_t B = 2, T = c.max_seq_len < 37 ? c.max_seq_len : 37;
        ps_model mc, mg;
        ps_error err;
        tu_random_model(&mc, &c, 500 + i, 0.5f);
        tu_random_model(&mg, &c, 500 + i, 0.5f);
        if (ps_model_to_backend(&mg, DEV, &err)) {
            CHECK(0, "%s: model to cuda: %s", v[i].name, err.msg);
            ps_model_free(&mc), ps_model_free(&mg);
            continue;
        }
        int32_t *tok = malloc((size_t)(B * T) * sizeof(int32_t)), *tgt = malloc((size_t)(B * T) * sizeof(int32_t));
        tu_random_tokens(tok, B * T, c.vocab_size, 600 + i);
        tu_random_tokens(tgt, B * T, c.vocab_size, 700 + i);
        for (int64_t t = 0; t < B * T; t += 4) tgt[t] = -1;
        model_parity(v[i].name, &mc, &mg, tok, tgt, B, T);
        free(tok), free(tgt);
        ps_model_free(&mc), ps_model_free(&mg);
    }
}

/* staggered grids and content chunks end to end: forward and gradients of 2-layer models */
static void test_grid_models(void) {
    for (int i = 0; i < 3; i++) {
        ps_config c = tu_config(PS_ATTN_COMPRESSED);
        c.n_layers = 2;
        const char *name;
        if (i == 0) {
            name = "staggered W6/S3 learned per-offset";
            c.window = 6, c.stride = 3, c.local_window = 5, c.n_heads = 4, c.n_kv_heads = 2;
            c.gate = PS_GATE_LEARNED, c.payload = PS_PAYLOAD_PER_OFFSET;
            c.n_grid_offsets = 2, c.head_offsets[0] = 0, c.head_offsets[1] = 2, c.any_head_offset = true;
        } else if (i == 1) {
            name = "staggered W4/S4 shared payload, 4 KV heads";
            c.window = 4, c.stride = 4, c.local_window = 4, c.n_heads = 4, c.n_kv_heads = 4;
            c.gate = PS_GATE_LEARNED, c.payload = PS_PAYLOAD_SHARED;
            c.n_grid_offsets = 4, c.any_head_offset = true;
            for (int g = 0; g < 4; g++) c.head_offsets[g] = g;
        } else {
            name = "content chunks W8/S4/min2 learned per-offset";
            c.window = 8, c.stride = 4, c.local_window = 6, c.n_heads = 4, c.n_kv_heads = 2;
            c.gate = PS_GATE_LEARNED, c.payload = PS_PAYLOAD_PER_OFFSET;
            c.boundaries = PS_BOUNDARIES_CONTENT, c.chunk_min = 2;
        }
        int64_t B = 2, T = c.max_seq_len < 37 ? c.max_seq_len : 37;
        ps_model mc, mg;
        ps_error err;
        tu_random_model(&mc, &c, 800 + (uint64_t)i, 0.5f);
        tu_random_model(&mg, &c, 800 + (uint64_t)i, 0.5f);
        if (ps_model_to_backend(&mg, DEV, &err)) {
            CHECK(0, "%s: model to cuda: %s", name, err.msg);
            ps_model_free(&mc), ps_model_free(&mg);
            continue;
        }
        int32_t *tok = malloc((size_t)(B * T) * sizeof(int32_t)), *tgt = malloc((size_t)(B * T) * sizeof(int32_t));
        tu_random_tokens(tok, B * T, c.vocab_size, 810 + (uint64_t)i);
        tu_random_tokens(tgt, B * T, c.vocab_size, 820 + (uint64_t)i);
        for (int64_t t = 0; t < B * T; t += 4) tgt[t] = -1;
        model_parity(name, &mc, &mg, tok, tgt, B, T);
        free(tok), free(tgt);
        ps_model_free(&mc), ps_model_free(&mg);
    }
}

static void test_conformance_models(void) {
    const char *names[] = {"full_gqa", "compressed_w8s8", "compressed_w6s3_overlap", "qwen3_published"};
    for (int i = 0; i < 4; i++) {
        char dir[2048], path[4096];
        snprintf(dir, sizeof dir, "%s/%s", tu_conformance_dir(), names[i]);
        ps_error err;
        ps_model mc, mg;
        ps_token_lists toks, tg = {0};
        REQUIRE_OK(ps_model_load(&mc, dir, &err), &err);
        REQUIRE_OK(ps_model_load(&mg, dir, &err), &err);
        REQUIRE_OK(ps_model_to_backend(&mg, DEV, &err), &err);
        snprintf(path, sizeof path, "%s/tokens.json", dir);
        REQUIRE_OK(ps_tokens_load(path, 0, 0, &toks, &err), &err);
        snprintf(path, sizeof path, "%s/targets.json", dir);
        int have_tg = ps_tokens_load(path, 1, -1, &tg, &err) == 0;
        for (int s = 0; s < toks.n; s++) {
            int32_t *tgt = malloc((size_t)toks.len[s] * sizeof(int32_t));
            for (int64_t t = 0; t < toks.len[s]; t++)
                tgt[t] = have_tg && s < tg.n && t < tg.len[s] ? tg.seq[s][t] : (t + 1 < toks.len[s] ? toks.seq[s][t + 1] : -1);
            char label[256];
            snprintf(label, sizeof label, "conformance %s, sequence %d", names[i], s);
            model_parity(label, &mc, &mg, toks.seq[s], tgt, 1, toks.len[s]);
            free(tgt);
        }
        ps_tokens_free(&toks);
        if (have_tg) ps_tokens_free(&tg);
        ps_model_free(&mc), ps_model_free(&mg);
    }
}

/* a V4 host hook: the pattern as it is (its host copy goes back), the sink mass halved (the output rescaled) */
static int v4_hook_cb(const ps_hook_event *ev, void *user, ps_error *err) {
    (void)err;
    int64_t n = 1;
    for (int i = 0; i < ev->ndim; i++) n *= ev->shape[i];
    if (strstr(ev->name, "sink"))
        for (int64_t i = 0; i < n; i += 2) ev->data[i] *= 0.5f;
    (*(int *)user)++;
    return 0;
}

/* logits [T, V] of one sequence through the materialised attention (pattern hooks on every layer, the sink
 * hook on the odd ones), as a malloc'd host copy */
static float *v4_hooked_logits(ps_v4_model *m, const int32_t *tok, int64_t T, int *calls) {
    ps_error err;
    ps_hooks h;
    ps_hooks_init(&h);
    float *out = NULL;
    int ok = 1;
    for (int l = 0; ok && l < m->cfg.n_layers; l++) {
        char nm[96];
        ps_v4_hook_name(nm, sizeof nm, l, PS_V4H_PATTERN);
        ok = ps_v4_hooks_add(&h, &m->cfg, nm, v4_hook_cb, calls, &err) == 0;
        if (ok && l % 2) {
            ps_v4_hook_name(nm, sizeof nm, l, PS_V4H_SINK);
            ok = ps_v4_hooks_add(&h, &m->cfg, nm, v4_hook_cb, calls, &err) == 0;
        }
    }
    ps_v4_acts a;
    if (ok && ps_v4_acts_create(&a, m, 1, T, &err) == 0) {
        const float *lg = ps_v4_forward(m, &a, tok, &h, -1, &err) == 0 ? ps_v4_logits_host(&a, &err) : NULL;
        if (lg && (out = malloc((size_t)(T * m->cfg.vocab_size) * sizeof(float))))
            memcpy(out, lg, (size_t)(T * m->cfg.vocab_size) * sizeof(float));
        ps_v4_acts_free(&a);
    }
    CHECK(out != NULL, "V4 hooked forward on %s: %s", ps_ctx_backend_name(m->ctx), err.msg);
    ps_hooks_free(&h);
    return out;
}

/* the DeepSeek-V4 conformance models (tests/conformance/v4): the forward on the device against the CPU,
 * logits < 1e-4 relative, every sequence of tokens.json; and the materialised attention with host hooks */
static void test_v4_models(void) {
    const char *names[] = {"hub3", "mix4"};
    for (int i = 0; i < 2; i++) {
        char dir[2048], path[4096];
        snprintf(dir, sizeof dir, "%s/v4/%s", tu_conformance_dir(), names[i]);
        ps_error err;
        ps_v4_model mc, mg;
        ps_token_lists toks;
        REQUIRE_OK(ps_v4_model_load(&mc, dir, 0, &err), &err);
        REQUIRE_OK(ps_v4_model_load(&mg, dir, 0, &err), &err);
        REQUIRE_OK(ps_v4_model_to_backend(&mg, DEV, &err), &err);
        CHECK(!strcmp(ps_ctx_backend_name(mg.ctx), DEV), "V4 model on %s", ps_ctx_backend_name(mg.ctx));
        snprintf(path, sizeof path, "%s/tokens.json", dir);
        REQUIRE_OK(ps_tokens_load(path, 0, 0, &toks, &err), &err);
        for (int sq = 0; sq < toks.n; sq++) {
            int64_t T = toks.len[sq], V = mc.cfg.vocab_size;
            ps_v4_acts ac, ag;
            if (ps_v4_acts_create(&ac, &mc, 1, T, &err) || ps_v4_acts_create(&ag, &mg, 1, T, &err)) {
                CHECK(0, "V4 %s activations: %s", names[i], err.msg);
                break;
            }
            int okc = ps_v4_forward(&mc, &ac, toks.seq[sq], NULL, -1, &err) == 0;
            CHECK(okc, "V4 %s forward (cpu): %s", names[i], err.msg);
            int okg = ps_v4_forward(&mg, &ag, toks.seq[sq], NULL, -1, &err) == 0;
            CHECK(okg, "V4 %s forward (%s): %s", names[i], DEV, err.msg);
            const float *lc = okc ? ps_v4_logits_host(&ac, &err) : NULL, *lg = okg ? ps_v4_logits_host(&ag, &err) : NULL;
            if (lc && lg) {
                double r = rel_err_f(lg, lc, T * V);
                CHECK(r < 1e-4, "V4 %s sequence %d: logits differ by %.3g (relative)", names[i], sq, r);
            } else
                CHECK(0, "V4 %s sequence %d: no logits: %s", names[i], sq, err.msg);
            ps_v4_acts_free(&ac);
            ps_v4_acts_free(&ag);
            if (sq == 0) { /* the materialised path: bias, logits, softmax, apply, sink rescale on the device */
                int cc = 0, cg = 0;
                float *hc = v4_hooked_logits(&mc, toks.seq[sq], T, &cc), *hg = v4_hooked_logits(&mg, toks.seq[sq], T, &cg);
                if (hc && hg) {
                    double r = rel_err_f(hg, hc, T * V);
                    CHECK(r < 1e-4 && cc == cg && cc > 0, "V4 %s hooked forward: logits differ by %.3g, %d and %d hook calls",
                          names[i], r, cc, cg);
                }
                free(hc), free(hg);
            }
        }
        ps_tokens_free(&toks);
        ps_v4_model_free(&mc);
        ps_v4_model_free(&mg);
    }
    if (strcmp(DEV, "cpu")) { /* a lazy model stays on the cpu */
        char dir[2048];
        snprintf(dir, sizeof dir, "%s/v4/hub3", tu_conformance_dir());
        ps_error err;
        ps_v4_model m;
        REQUIRE_OK(ps_v4_model_load(&m, dir, 1, &err), &err);
        CHECK_ERR(ps_v4_model_to_backend(&m, DEV, &err), &err, "--lazy", "stay on the cpu backend");
        ps_v4_model_free(&m);
    }
}

/* hooks on the device: a mean-replacement action and a host callback on the same point */
static int scale_cb(const ps_hook_event *ev, void *user, ps_error *err) {
    (void)user, (void)err;
    int64_t n = 1;
    for (int i = 0; i < ev->ndim; i++) n *= ev->shape[i];
    for (int64_t i = 0; i < n; i++) ev->data[i] *= 0.5f;
    return 0;
}

static void test_hooks(void) {
    ps_config c = tu_config(PS_ATTN_COMPRESSED);
    c.n_layers = 2;
    ps_model mc, mg;
    ps_error err;
    tu_random_model(&mc, &c, 900, 0.5f);
    tu_random_model(&mg, &c, 900, 0.5f);
    REQUIRE_OK(ps_model_to_backend(&mg, DEV, &err), &err);
    int64_t B = 2, T = 30;
    int32_t tok[60];
    tu_random_tokens(tok, B * T, c.vocab_size, 901);
    int64_t nsrc = T * c.n_kv_heads * c.head_dim; /* one sequence of hook_v: [T, nkv, hd] */
    float *mean = rnd(nsrc, 902, 1);
    float *dmean = up(mean, nsrc);
    ps_acts ac, ag;
    REQUIRE_OK(ps_acts_create(&ac, mc.ctx, &c, B, T, false, &err), &err);
    REQUIRE_OK(ps_acts_create(&ag, mg.ctx, &c, B, T, false, &err), &err);
    for (int pass = 0; pass < 2; pass++) {
        ps_hooks hc, hg;
        ps_hooks_init(&hc);
        ps_hooks_init(&hg);
        ps_hook_action act = {.kind = PS_ACT_SET, .head = 1, .src_npos = T};
        act.src = mean;
        CHECK_OK(ps_hooks_add_action(&hc, &c, "blocks.1.attn.hook_v", &act, &err), &err);
        act.src = dmean;
        CHECK_OK(ps_hooks_add_action(&hg, &c, "blocks.1.attn.hook_v", &act, &err), &err);
        if (pass) {
            CHECK_OK(ps_hooks_add(&hc, &c, "blocks.0.attn.hook_z", scale_cb, NULL, &err), &err);
            CHECK_OK(ps_hooks_add(&hg, &c, "blocks.0.attn.hook_z", scale_cb, NULL, &err), &err);
            CHECK_OK(ps_hooks_add(&hc, &c, "blocks.1.attn.hook_pattern", scale_cb, NULL, &err), &err);
            CHECK_OK(ps_hooks_add(&hg, &c, "blocks.1.attn.hook_pattern", scale_cb, NULL, &err), &err);
        }
        CHECK_OK(ps_forward(&mc, &ac, tok, &hc, &err), &err);
        CHECK_OK(ps_forward(&mg, &ag, tok, &hg, &err), &err);
        const float *lc = ps_acts_logits_host(&ac, &err), *lg = ps_acts_logits_host(&ag, &err);
        if (lc && lg) {
            double r = rel_err_f(lg, lc, B * T * c.vocab_size);
            CHECK(r < 1e-4, "hooks pass %d: logits relative error %.3g", pass, r);
        }
        ps_hooks_free(&hc), ps_hooks_free(&hg);
    }
    free(mean);
    dfree(dmean);
    ps_acts_free(&ac), ps_acts_free(&ag);
    ps_model_free(&mc), ps_model_free(&mg);
}

/* tf32 and bf16 matrix products: the forward of a random model against fp32 at their tolerances */
static void test_precisions(void) {
    ps_config c = tu_config(PS_ATTN_COMPRESSED);
    c.n_layers = 2, c.d_model = 64, c.d_ff = 96;
    ps_error err;
    ps_model m32, mlow;
    tu_random_model(&m32, &c, 950, 0.3f);
    REQUIRE_OK(ps_model_to_backend(&m32, DEV, &err), &err);
    int64_t B = 2, T = 40, V = c.vocab_size;
    int32_t tok[80];
    tu_random_tokens(tok, B * T, V, 951);
    ps_acts a32;
    REQUIRE_OK(ps_acts_create(&a32, m32.ctx, &c, B, T, false, &err), &err);
    CHECK_OK(ps_forward(&m32, &a32, tok, NULL, &err), &err);
    float *ref = malloc((size_t)(B * T * V) * sizeof(float));
    memcpy(ref, ps_acts_logits_host(&a32, &err), (size_t)(B * T * V) * sizeof(float));
    const char *names[2] = {"tf32", "bf16"};
    double tol[2] = {2e-2, 6e-2};
    for (int p = 1; p <= 2; p++) {
        ps_ctx_default_precision(p);
        tu_random_model(&mlow, &c, 950, 0.3f);
        int ok = ps_model_to_backend(&mlow, DEV, &err) == 0;
        ps_ctx_default_precision(PS_PREC_FP32);
        CHECK(ok, "%s: %s", names[p - 1], err.msg);
        if (!ok) {
            ps_model_free(&mlow);
            continue;
        }
        CHECK(mlow.ctx->precision == p, "%s: the context's precision is %d", names[p - 1], mlow.ctx->precision);
        ps_acts a;
        REQUIRE_OK(ps_acts_create(&a, mlow.ctx, &c, B, T, false, &err), &err);
        CHECK_OK(ps_forward(&mlow, &a, tok, NULL, &err), &err);
        const float *lg = ps_acts_logits_host(&a, &err);
        if (lg) {
            double r = rel_err_f(lg, ref, B * T * V);
            CHECK(r < tol[p - 1], "%s: logits differ from fp32 by %.3g (tolerance %.0e)", names[p - 1], r, tol[p - 1]);
            printf("  %s logits vs fp32: relative error %.2e (tolerance %.0e)\n", names[p - 1], r, tol[p - 1]);
        }
        ps_acts_free(&a);
        ps_model_free(&mlow);
    }
    free(ref);
    ps_acts_free(&a32);
    ps_model_free(&m32);
}

/* the sweep command on both devices: the same result JSON apart from provenance and timing */
static void test_sweep_json(const char *build_dir) {
    char tmp[512], cmd[4096];
    tu_tempdir(tmp, sizeof tmp, "cuda_sweep");
    const char *model = PS_SOURCE_DIR "/data/models/default";
    for (int d = 0; d < 2; d++) {
        snprintf(cmd, sizeof cmd, "%s/phasescope sweep --model %s --n 16 --out %s/%s --device %s > %s/%s.log 2>&1", build_dir,
                 model, tmp, d ? "cuda" : "cpu", d && strcmp(DEV, "cpu-staged") ? DEV : "cpu", tmp, d ? "cuda" : "cpu");
        int rc = system(cmd);
        CHECK(rc == 0, "sweep on %s failed (rc %d): see %s/%s.log", d ? "cuda" : "cpu", rc, tmp, d ? "cuda" : "cpu");
    }
    /* the curves: the same counts per residue, log-probabilities within 1e-3 (provenance differs) */
    json_t *cv[2] = {NULL, NULL};
    for (int d = 0; d < 2; d++) {
        char path[700];
        snprintf(path, sizeof path, "%s/%s/sweep.json", tmp, d ? "cuda" : "cpu");
        json_error_t je;
        json_t *root = json_load_file(path, 0, &je);
        CHECK(root != NULL, "%s: %s", path, je.text);
        if (root) {
            cv[d] = json_incref(json_object_get(root, "curve"));
            json_decref(root);
        }
    }
    if (cv[0] && cv[1]) {
        json_t *r0 = json_object_get(cv[0], "residues"), *r1 = json_object_get(cv[1], "residues");
        CHECK(json_array_size(r0) > 0 && json_array_size(r0) == json_array_size(r1), "sweep: residue lists differ in length");
        for (size_t i = 0; i < json_array_size(r0) && i < json_array_size(r1); i++) {
            json_t *a = json_array_get(r0, i), *b = json_array_get(r1, i);
            long long n0 = json_integer_value(json_object_get(a, "n")), n1 = json_integer_value(json_object_get(b, "n"));
            long long c0 = json_integer_value(json_object_get(a, "correct")), c1 = json_integer_value(json_object_get(b, "correct"));
            double l0 = json_number_value(json_object_get(a, "mean_logprob")), l1 = json_number_value(json_object_get(b, "mean_logprob"));
            CHECK(n0 == n1 && c0 == c1, "sweep residue %zu: cpu %lld/%lld correct, cuda %lld/%lld", i, c0, n0, c1, n1);
            CHECK(fabs(l0 - l1) <= 1e-3 * fabs(l0) + 1e-6, "sweep residue %zu: mean log-probability %.9g (cpu) vs %.9g (cuda)", i,
                  l0, l1);
        }
        const char *v0 = json_string_value(json_object_get(cv[0], "verdict")), *v1 = json_string_value(json_object_get(cv[1], "verdict"));
        CHECK(v0 && v1 && !strcmp(v0, v1), "sweep: the verdicts differ");
    }
    json_decref(cv[0]);
    json_decref(cv[1]);
}

/* train --device (train/train.c): a tiny compressed model trained 10 steps on the device and on the cpu.
 * The losses of the first 3 steps agree within 1e-4 relative (later ones drift apart as the updates follow
 * different roundings; eps 1e-5 keeps AdamW's first step, ~lr·sign(g), from amplifying the sign of a
 * gradient that is zero up to rounding); a run stopped at step 5 and resumed on the device (moments
 * uploaded from the checkpoint) logs the uninterrupted device run's losses within 1e-4; its checkpoint
 * loads. The dry run trains on the test backend "cpu-staged" (the same paths, with the cpu's numbers). */
static int train_losses(const char *dir, double *loss, int n) {
    char path[1200];
    snprintf(path, sizeof path, "%s/train.jsonl", dir);
    FILE *f = fopen(path, "r");
    int k = 0;
    char line[65536];
    while (f && k < n && fgets(line, sizeof line, f)) {
        json_t *o = json_loads(line, 0, NULL);
        if (o && !strcmp(json_string_value(json_object_get(o, "type")), "train")) loss[k++] = json_number_value(json_object_get(o, "loss"));
        json_decref(o);
    }
    if (f) fclose(f);
    return k;
}

static void test_train_device(void) {
    const char *dev = strcmp(DEV, "cpu") ? DEV : "cpu-staged";
    const char *text =
        "{\"model\": {\"vocab_size\": 32, \"d_model\": 32, \"n_layers\": 2, \"n_heads\": 2, \"n_kv_heads\": 2, \"head_dim\": 16,"
        " \"d_ff\": 64, \"max_seq_len\": 32, \"attention\": {\"kind\": \"compressed\", \"window\": 4, \"stride\": 2, \"local_window\": 3}},"
        " \"task\": {\"kind\": \"kv-retrieval\", \"seq_len\": 28, \"n_keys\": 8, \"n_values\": 8, \"n_fillers\": 4,"
        " \"n_pairs\": 3, \"gap_min\": 0, \"gap_max\": 2, \"query_gap\": 1, \"n_queries\": 3},"
        " \"train\": {\"steps\": 10, \"batch_size\": 16, \"seed\": 3, \"lr\": 1e-2, \"eps\": 1e-5, \"log_every\": 1, \"eval_every\": 5,"
        " \"eval_size\": 32, \"gates_every\": 5, \"checkpoint_every\": 5}}";
    ps_train_cfg c;
    ps_error err;
    if (ps_train_cfg_parse(text, strlen(text), "train_device.json", &c, &err)) {
        CHECK(0, "%s", err.msg);
        return;
    }
    char tmp[512], a[1024], b[1024], r[1024];
    tu_tempdir(tmp, sizeof tmp, "cuda_train");
    snprintf(a, sizeof a, "%s/cpu", tmp);
    snprintf(b, sizeof b, "%s/dev", tmp);
    snprintf(r, sizeof r, "%s/resumed", tmp);
    CHECK_OK(ps_train(&c, a, 0, -1, NULL, NULL, &err), &err);
    c.backend = dev;
    CHECK_OK(ps_train(&c, b, 0, -1, NULL, NULL, &err), &err);
    CHECK_OK(ps_train(&c, r, 0, 5, NULL, NULL, &err), &err);
    CHECK_OK(ps_train(&c, r, 1, -1, NULL, NULL, &err), &err);
    double la[10] = {0}, lb[10] = {0}, lr[10] = {0};
    int na = train_losses(a, la, 10), nb = train_losses(b, lb, 10), nr = train_losses(r, lr, 10);
    CHECK(na == 10 && nb == 10 && nr == 10, "train records: cpu %d, %s %d, resumed %d (want 10)", na, dev, nb, nr);
    for (int i = 0; i < 3; i++)
        CHECK(la[i] > 0 && fabs(la[i] - lb[i]) <= 1e-4 * la[i], "train step %d: loss %.9g (cpu) vs %.9g (%s)", i + 1, la[i], lb[i], dev);
    for (int i = 0; i < 10; i++)
        CHECK(fabs(lb[i] - lr[i]) <= 1e-4 * lb[i], "train step %d: loss %.9g (%s) vs %.9g (stopped at 5, resumed)", i + 1, lb[i], dev, lr[i]);
    ps_model m;
    int loaded = ps_model_load(&m, b, &err) == 0;
    CHECK(loaded, "the %s run's checkpoint: %s", dev, err.msg);
    if (loaded) {
        const char *step = ps_model_get_meta(&m, "phasescope.step");
        CHECK(step && !strcmp(step, "10") && m.n_params > 0, "the %s run's checkpoint: step %s", dev, step ? step : "(none)");
        int finite = 1;
        for (int64_t i = 0; i < m.n_params; i++) finite &= isfinite(m.params[i]) != 0;
        CHECK(finite, "the %s run's checkpoint holds non-finite weights", dev);
        ps_model_free(&m);
    }
    ps_train_cfg_free(&c);
    printf("train on %s: first losses %.6f %.6f %.6f (cpu %.6f %.6f %.6f)\n", dev, lb[0], lb[1], lb[2], la[0], la[1], la[2]);
}

int main(int argc, char **argv) {
    ps_error err;
    const char *why = "";
    int n_dev = ps_cuda_device_count(&why);
    const char *dry = getenv("PS_TEST_CUDA_DRY_RUN"), *req = getenv("PS_REQUIRE_DEVICE");
    /* a device check (the GPU run): no device is a FAIL there, never a pass */
    int require_device = req && *req == '1';
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--require-device")) require_device = 1;
    /* the dry run's "device": the test backend cpu-staged (the cpu's ops behind buffers that are not host
     * pointers, so every device-side path is taken; the CLI refuses it, so the sweep command runs on the cpu) */
    if (dry && *dry == '1') {
        if (require_device) {
            printf("FAIL: PS_TEST_CUDA_DRY_RUN=1 in a device check: the dry run compares the cpu with itself\n");
            return 1;
        }
        DEV = "cpu-staged", n_dev = 1;
    }
    CHECK(strstr(ps_ctx_backends(), "cuda") != NULL, "this build lists its backends as \"%s\"", ps_ctx_backends());
    if (n_dev <= 0) {
        /* no device: the context must fail cleanly, with one line naming the reason */
        ps_ctx *c = NULL;
        err.msg[0] = '\0';
        int rc = ps_ctx_create(&c, "cuda", &err);
        CHECK(rc != 0 && c == NULL, "ps_ctx_create(cuda) succeeded without a device");
        CHECK(strstr(err.msg, "cuda backend: no CUDA device") && !strchr(err.msg, '\n'), "message: \"%s\"", err.msg);
        ps_config cfg = tu_config(PS_ATTN_COMPRESSED);
        ps_model m;
        tu_random_model(&m, &cfg, 7, 0.5f);
        CHECK(ps_model_to_backend(&m, "cuda", &err) != 0 && strstr(err.msg, "no CUDA device"), "model move: %s", err.msg);
        ps_acts a;
        int32_t tok[8] = {1, 2, 3, 4, 5, 6, 7, 8};
        CHECK(ps_acts_create(&a, m.ctx, &cfg, 1, 8, false, &err) == 0 && ps_forward(&m, &a, tok, NULL, &err) == 0,
              "the model stays usable on the cpu after a failed move: %s", err.msg);
        ps_acts_free(&a);
        ps_model_free(&m);
        /* the same for a DeepSeek-V4 model */
        char dir[2048];
        snprintf(dir, sizeof dir, "%s/v4/hub3", tu_conformance_dir());
        ps_v4_model vm;
        if (ps_v4_model_load(&vm, dir, 0, &err) == 0) {
            CHECK(ps_v4_model_to_backend(&vm, "cuda", &err) != 0 && strstr(err.msg, "no CUDA device"), "V4 model move: %s",
                  err.msg);
            ps_v4_acts va;
            CHECK(ps_v4_acts_create(&va, &vm, 1, 8, &err) == 0 && ps_v4_forward(&vm, &va, tok, NULL, -1, &err) == 0,
                  "the V4 model stays usable on the cpu after a failed move: %s", err.msg);
            ps_v4_acts_free(&va);
            ps_v4_model_free(&vm);
        } else
            CHECK(0, "%s", err.msg);
        if (require_device) {
            fprintf(stderr, "FAIL: no CUDA device (%s), and this run is a device check (%s): nothing was compared on a GPU\n",
                    why, req && *req == '1' ? "PS_REQUIRE_DEVICE=1" : "--require-device");
            printf("FAIL: no CUDA device (%s); %d passed, %d failed\n", why, check_pass_, check_fail_ + 1);
            return 1;
        }
        printf("skipped: no CUDA device (%s)\n", why);
        CHECK_DONE();
    }
    REQUIRE_OK_MAIN(ps_ctx_create(&CPU, "cpu", &err), &err);
    REQUIRE_OK_MAIN(ps_ctx_create(&GPU, DEV, &err), &err);
    char desc[512] = "cpu (dry run)";
    if (!ps_ctx_host_visible(GPU)) ps_cuda_describe(GPU, desc, sizeof desc);
    printf("device: %s\n", desc);
    test_linear();
    test_rows_ops();
    test_hook_ops();
    test_loss_optim();
    test_v4_ops();
    test_compressor_ops(2, 24, 16, 4, 4, 2, 4, 0);
    test_compressor_ops(2, 26, 16, 4, 4, 2, 4, 0);  /* T != nW·S: per-sequence products */
    test_compressor_ops(2, 27, 20, 6, 3, 2, 5, 0);  /* overlapping windows */
    test_compressor_ops(2, 27, 20, 6, 3, 2, 5, 1);  /* shared payload */
    test_compressor_ops(1, 64, 64, 8, 8, 4, 16, 0); /* W = S = 8 */
    int64_t wo1[4] = {0, 1, 2, 0}, wo2[4] = {0, 2, 4, 6}, wo3[6] = {1, 0, 1, 0, 0, 1};
    test_grid_ops("grid W6/S3 overlapping, staggered", 2, 27, 20, 6, 3, 2, 4, wo1, NULL, NULL, 0);
    test_grid_ops("grid W6/S3 overlapping, base (woff NULL)", 2, 27, 20, 6, 3, 2, 4, NULL, NULL, NULL, 0);
    test_grid_ops("grid W8/S8, 4 staggered heads, d 33", 1, 40, 33, 8, 8, 4, 6, wo2, NULL, NULL, 0);
    test_grid_ops("grid W5/S2, 2 sequences x 3 heads", 2, 23, 12, 5, 2, 3, 4, wo3, NULL, NULL, 0);
    test_grid_ops("grid W8/S8, T 300, hd 16", 1, 300, 64, 8, 8, 4, 16, wo2, NULL, NULL, 0);
    test_chunk_ops("chunks W8/S4/min2", 3, 40, 20, 8, 4, 2, 2, 4);
    test_chunk_ops("chunks W6/S3/min1, d 33", 2, 31, 33, 6, 3, 1, 3, 6);
    test_chunk_ops("chunks W8/S5/min3, T 200", 2, 200, 48, 8, 5, 3, 2, 16);
    test_grid_attention();
    test_attention(geom(2, 70, 4, 2, 4, 0, 0, 0, 0), "full");
    test_attention(geom(2, 150, 4, 1, 48, 0, 0, 0, 0), "full, hd 48");
    test_attention(geom(1, 130, 2, 2, 128, 0, 0, 0, 0), "full, hd 128");
    test_attention(geom(2, 70, 4, 2, 4, 1, 4, 4, 4), "W4/S4");
    test_attention(geom(2, 75, 4, 2, 8, 1, 6, 3, 5), "W6/S3 overlapping");
    test_attention(geom(1, 600, 4, 2, 16, 1, 8, 8, 8), "W8/S8 T 600 (75 windows), two tiles of windows");
    test_attention(geom(1, 200, 2, 1, 128, 1, 8, 4, 70), "W8/S4, local window 70, hd 128");
    test_attention(geom(2, 5, 2, 2, 4, 1, 8, 8, 8), "T < W (no windows)");
    test_random_models();
    test_grid_models();
    test_conformance_models();
    test_v4_models();
    test_hooks();
    test_precisions();
    test_train_device();
    const char *build_dir = NULL; /* the first argument that is not a flag */
    for (int i = 1; i < argc && !build_dir; i++)
        if (strncmp(argv[i], "--", 2)) build_dir = argv[i];
    if (build_dir) test_sweep_json(build_dir);
    ps_ctx_free(GPU);
    ps_ctx_free(CPU);
    CHECK_DONE();
}
