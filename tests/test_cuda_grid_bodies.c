/* test_cuda_grid_bodies.c — the arithmetic of the CUDA backend's compressor ops over window tables (offset
 * grids, base grids, content chunks) and the gate-regulariser ops (core/cuda/grid_bodies.h, launched by core/cuda/grid.cu) on the host, against the CPU
 * backend's compressor ops over window tables (core/cpu/windows.c, core/cpu/grid.c) through a "cpu" context. Built in every build (the
 * bodies are plain C; no CUDA needed), so the device code's arithmetic is checked where there is no GPU.
 *
 * Each body runs over the whole index space of its kernel in a plain loop, partitioned as grid.cu launches
 * it (one call per element or row, launches in grid.cu's order; the shared payload's GEMMs are the CPU's
 * ps_matmul / ps_matmul_backward where grid.cu calls ps_cuda_matmul / ps_cuda_matmul_backward). Outputs
 * start as random garbage (every element must be written) and gradients as random values (they
 * accumulate). Tolerance: max|x − ref| / max|ref| <= 1e-5 where the bodies sum in the CPU's order (gates,
 * scatters, RoPE, the regulariser; only expf differs), 1e-4 where the CPU sums through sgemm (per-offset
 * payloads). Geometries: staggered offsets per head and per sequence (windows that do not fit are absent),
 * base grids (woff NULL), overlapping windows, d not a multiple of 16, shared and per-offset payloads,
 * learned and uniform gates, inverse RoPE, two entropy weights; chunk tables from the real chunker
 * (core/chunks.h, chunk_min < W, absent chunks at the end) and a hand-made table with overlapping chunks.
 * The attention kernels' visibility (ps_gb_seen, ps_gb_first_seen) is checked against ops.h ps_geom_seen on
 * the same grids and chunk tables. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/chunks.h"
#include "core/config.h"
#include "core/cuda/grid_bodies.h"
#include "core/ops.h"
#include "core/rng.h"
#include "testutil.h"

static ps_ctx *CPU;

#define TOL_ORDER 1e-5 /* the CPU's summation order */
#define TOL_GEMM 1e-4  /* the CPU sums through sgemm */

static float *rnd(int64_t n, uint64_t seed, float scale) {
    float *x = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    ps_rng r;
    ps_rng_seed(&r, seed);
    for (int64_t i = 0; i < n; i++) x[i] = (float)(ps_rng_normal(&r) * scale);
    return x;
}

static float *dup(const float *x, int64_t n) {
    float *y = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    if (n > 0) memcpy(y, x, (size_t)n * sizeof(float));
    return y;
}

static void cmp(const char *label, const char *what, const float *x, const float *ref, int64_t n, double tol) {
    double r = rel_err_f(x, ref, n);
    CHECK(r <= tol, "%s: %s: relative error %.3g (tolerance %.0e)", label, what, r, tol);
}

static void ctx_ok(const char *label) {
    ps_error err;
    CHECK(ps_ctx_check(CPU, &err) == 0, "%s: cpu ops: %s", label, err.msg);
}

/* ---------------- window grids with offsets ---------------- */

/* Every body over window table w against the CPU's op (core/cpu/windows.c) with the same table. */
static void test_table(const char *label, const ps_windows *w, int64_t d, int64_t hd, uint64_t seed) {
    const int64_t B = w->B, T = w->T, nW = w->nW, W = w->W, nkv = w->nkv, H = w->H, n = B * nW * nkv, nk = nkv * hd,
                  half = hd / 2;
    const int64_t *st = w->start, *ln = w->len;
    float *a = rnd(B * T * d, seed + 1, 1.0f), *u = rnd(W * nkv * d, seed + 2, 0.3f), *bias = rnd(W * nkv, seed + 3, 0.3f);
    int64_t *jr = malloc((size_t)(2 * B * T + 1) * sizeof *jr);
    ps_gb_win_ranges(jr, B, T, nW, H, st, ln);
    char what[200];

    /* gate (learned, then uniform) */
    float *z = rnd(n * W, seed + 4, 9), *al = rnd(n * W, seed + 5, 9);
    for (int learned = 0; learned < 2; learned++) {
        const float *uu = learned ? u : NULL, *bb = learned ? bias : NULL;
        float *zr = dup(z, n * W), *alr = dup(al, n * W);
        ps_gate(CPU, zr, alr, a, uu, bb, d, w);
        if (uu)
            for (int64_t wi = 0; wi < n * W; wi++) ps_gb_win_gate_logit(z, a, uu, bb, T, d, nW, W, nkv, H, st, ln, wi);
        for (int64_t row = 0; row < n; row++) ps_gb_win_gate_row(z, al, nW, W, nkv, H, ln, !uu, row);
        snprintf(what, sizeof what, "gate%s logits", learned ? "" : " (uniform)");
        cmp(label, what, z, zr, n * W, TOL_ORDER);
        snprintf(what, sizeof what, "gate%s alpha", learned ? "" : " (uniform)");
        cmp(label, what, al, alr, n * W, TOL_ORDER);
        free(zr), free(alr);
    }
    /* al now holds the learned gate of the CPU's numbers to 1e-5; use the CPU's own below */
    float *zc = rnd(n * W, 6, 1), *alc = rnd(n * W, 7, 1);
    ps_gate(CPU, zc, alc, a, u, bias, d, w);

    /* gate backward */
    float *dal0 = rnd(n * W, seed + 8, 1), *da0 = rnd(B * T * d, seed + 9, 1), *du0 = rnd(W * nkv * d, seed + 10, 1);
    float *db0 = rnd(W * nkv, seed + 11, 1);
    float *dalr = dup(dal0, n * W), *dar = dup(da0, B * T * d), *dur = dup(du0, W * nkv * d), *dbr = dup(db0, W * nkv);
    ps_gate_backward(CPU, dar, dur, dbr, dalr, alc, a, u, d, w);
    float *dal = dup(dal0, n * W), *da = dup(da0, B * T * d), *du = dup(du0, W * nkv * d), *db = dup(db0, W * nkv);
    for (int64_t row = 0; row < n; row++) ps_gb_softmax_backward_row(dal, alc, W, row);
    for (int64_t idx = 0; idx < W * nkv * d; idx++) ps_gb_win_gate_du(du, dal, a, B, T, d, nW, W, nkv, H, st, ln, idx);
    for (int64_t ig = 0; ig < W * nkv; ig++) ps_gb_win_gate_dbias(db, dal, B, nW, W, nkv, H, ln, ig);
    for (int64_t idx = 0; idx < B * T * d; idx++) ps_gb_win_gate_da(da, dal, u, T, d, nW, W, nkv, H, st, ln, jr, idx);
    cmp(label, "gate_backward dz", dal, dalr, n * W, TOL_ORDER);
    cmp(label, "gate_backward du", du, dur, W * nkv * d, TOL_ORDER);
    cmp(label, "gate_backward dbias", db, dbr, W * nkv, TOL_ORDER);
    cmp(label, "gate_backward da", da, dar, B * T * d, TOL_ORDER);

    /* payloads, per offset and shared */
    for (int shared = 0; shared < 2; shared++) {
        int64_t nCw = shared ? nk * d : W * nk * d, nP = B * nW * W * nk;
        float *C = rnd(nCw, seed + 12 + (uint64_t)shared, 0.3f), *P = rnd(nP, seed + 14, 9), *Pr = dup(P, nP);
        float *scr = rnd(B * T * nk, seed + 15, 9), *scrr = dup(scr, B * T * nk);
        ps_payload(CPU, Pr, a, C, shared, scrr, d, hd, w);
        if (shared) {
            ps_matmul(CPU, scr, a, C, B * T, d, nk, 0);
            for (int64_t idx = 0; idx < nP; idx++) ps_gb_win_payload_gather(P, scr, T, nW, W, nkv, hd, H, st, ln, idx);
        } else
            for (int64_t idx = 0; idx < nP; idx++) ps_gb_win_payload_elem(P, a, C, T, d, nW, W, nkv, hd, H, st, ln, idx);
        snprintf(what, sizeof what, "payload%s", shared ? " (shared)" : "");
        cmp(label, what, P, Pr, nP, shared ? TOL_ORDER : TOL_GEMM);
        /* backward: dP zero at offsets past a window's length, as the pool backward leaves it (alpha = 0 there) */
        float *dP = rnd(nP, seed + 16, 1);
        for (int64_t idx = 0; idx < nP; idx++) {
            int64_t i = (idx / nk) % W, bj = idx / (nk * W), n_ = idx % nk;
            if (i >= ln[ps_gb_e(nW, H, bj / nW, bj % nW, n_ / hd)]) dP[idx] = 0.0f;
        }
        float *gda0 = rnd(B * T * d, seed + 17, 1), *gdC0 = rnd(nCw, seed + 18, 1);
        float *gdar = dup(gda0, B * T * d), *gdCr = dup(gdC0, nCw), *gda = dup(gda0, B * T * d), *gdC = dup(gdC0, nCw);
        ps_payload_backward(CPU, gdar, gdCr, dP, a, C, shared, scrr, d, hd, w);
        if (nW == 0) {
            /* grid.cu launches nothing (as the CPU returns at once) */
        } else if (shared) {
            for (int64_t idx = 0; idx < B * T * nk; idx++) ps_gb_win_payload_scatter(scr, dP, T, nW, W, nkv, hd, H, st, ln, jr, idx);
            cmp(label, "payload_backward (shared) scatter", scr, scrr, B * T * nk, TOL_ORDER);
            ps_matmul_backward(CPU, gda, gdC, scr, a, C, B * T, d, nk);
        } else {
            for (int64_t idx = 0; idx < W * nk * d; idx++) ps_gb_win_payload_dC(gdC, dP, a, B, T, d, nW, W, nkv, hd, H, st, ln, idx);
            for (int64_t idx = 0; idx < B * T * d; idx++) ps_gb_win_payload_da(gda, dP, C, T, d, nW, W, nkv, hd, H, st, ln, jr, idx);
        }
        snprintf(what, sizeof what, "payload_backward%s da", shared ? " (shared)" : "");
        cmp(label, what, gda, gdar, B * T * d, shared ? TOL_ORDER : TOL_GEMM);
        snprintf(what, sizeof what, "payload_backward%s dC", shared ? " (shared)" : "");
        cmp(label, what, gdC, gdCr, nCw, shared ? TOL_ORDER : TOL_GEMM);
        free(C), free(P), free(Pr), free(scr), free(scrr), free(dP), free(gda0), free(gdC0), free(gdar), free(gdCr), free(gda);
        free(gdC);
    }

    /* RoPE of the compressed keys, forward and inverse */
    float *cs_t = malloc((size_t)(T * half + 1) * sizeof(float)), *sn_t = malloc((size_t)(T * half + 1) * sizeof(float));
    ps_rope_table(CPU, cs_t, sn_t, T, hd, 10000.0);
    for (int inverse = 0; inverse < 2; inverse++) {
        float *x = rnd(n * hd, seed + 20 + (uint64_t)inverse, 1), *xr = dup(x, n * hd);
        ps_rope_windows(CPU, xr, cs_t, sn_t, hd, w, inverse);
        for (int64_t idx = 0; idx < n * half; idx++) ps_gb_win_rope_pair(x, cs_t, sn_t, T, nW, nkv, hd, H, st, inverse ? -1.0f : 1.0f, idx);
        cmp(label, inverse ? "rope_windows (inverse)" : "rope_windows", x, xr, n * hd, TOL_ORDER);
        free(x), free(xr);
    }

    /* the gate regulariser on the learned gate (absent windows: alpha rows of 0, skipped) */
    for (int wk = 0; wk < 2; wk++) {
        double weight = wk ? 0.05 : 0.7, vr = 0.25, v = 0.25;
        float *gr = rnd(n * W, seed + 30, 1), *gg = dup(gr, n * W);
        ps_gate_entropy(CPU, &vr, gr, alc, B, nW, nkv, W, weight);
        double *m = malloc((size_t)(nkv * W + 2 * nkv) * sizeof(double)), *cnt = m + nkv * W, *val = cnt + nkv;
        for (int64_t idx = 0; idx < nkv * W; idx++) ps_gb_entropy_mean(m, cnt, alc, B * nW, nkv, W, idx);
        for (int64_t g = 0; g < nkv; g++) ps_gb_entropy_value(val, m, cnt, W, weight, g);
        for (int64_t idx = 0; idx < n * W; idx++) ps_gb_entropy_grad(gg, alc, m, cnt, nkv, W, weight, idx);
        for (int64_t g = 0; g < nkv; g++)
            if (cnt[g] > 0) v += val[g];
        CHECK(fabs(v - vr) <= 1e-9 * fabs(vr), "%s: gate_entropy (weight %g) value %.12g, cpu %.12g", label, weight, v, vr);
        int64_t present = 0;
        for (int64_t e = 0; e < B * nW * H; e++) present += ln[e] > 0;
        CHECK(present == 0 ? vr == 0.25 : vr > 0.25, "%s: gate_entropy (weight %g) adds a positive value when there are windows (%.12g)", label, weight, vr);
        snprintf(what, sizeof what, "gate_entropy (weight %g) dalpha", weight);
        cmp(label, what, gg, gr, n * W, TOL_ORDER);
        free(m), free(gr), free(gg);
    }
    ctx_ok(label);
    free(jr), free(a), free(u), free(bias), free(z), free(al), free(zc), free(alc), free(dal0), free(da0), free(du0), free(db0);
    free(dalr), free(dar), free(dur), free(dbr), free(dal), free(da), free(du), free(db), free(cs_t), free(sn_t);
}

/* a grid of stride S: per head with offsets woff [B, nkv] (windows that do not fit are absent), else the base grid */
static void test_grid(const char *label, int64_t B, int64_t T, int64_t d, int64_t W, int64_t S, int64_t nkv, int64_t hd,
                      const int64_t *woff, uint64_t seed) {
    int64_t nW = T >= W ? (T - W) / S + 1 : 0, absent = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t j = 0; j < nW; j++)
            for (int64_t g = 0; g < nkv; g++) absent += j * S + ps_woff(woff, b, nkv, g) + W > T;
    CHECK(!woff || absent > 0 || nW == 0, "%s: the geometry should have absent windows", label);
    int64_t *tab = malloc((size_t)(2 * B * nW * nkv + 1) * sizeof *tab);
    ps_windows w = ps_windows_grid(tab, tab + B * nW * (woff ? nkv : 1), B, T, nW, W, S, nkv, woff);
    test_table(label, &w, d, hd, seed);
    free(tab);
}

/* a chunk table cs/cl [B, nC] */
static void test_chunks(const char *label, int64_t B, int64_t T, int64_t d, int64_t nC, int64_t W, int64_t nkv, int64_t hd,
                        const int64_t *cs, const int64_t *cl, uint64_t seed) {
    int64_t *tab = malloc((size_t)(2 * B * nC + 1) * sizeof *tab);
    ps_windows w = ps_windows_chunks(tab, tab + B * nC, cs, cl, B, T, nC, W, nkv);
    test_table(label, &w, d, hd, seed);
    free(tab);
}

/* ---------------- attention visibility ---------------- */

/* ps_gb_seen against ops.h ps_geom_seen at every (sequence, KV head, position), and ps_gb_first_seen as the
 * first position that sees entry j (the dck/dcv kernel starts a tile of entries there); woff or cend. */
static void test_visibility(const char *label, int64_t B, int64_t T, int64_t W, int64_t S, int64_t nW, int64_t nkv,
                            const int64_t *woff, const int64_t *cend) {
    ps_attn_geom g = {.B = B, .T = T, .nh = nkv, .nkv = nkv, .hd = 4, .compressed = 1, .W = W, .S = S, .LW = W, .nW = nW};
    g.ncols = nW + W, g.woff = woff, g.cend = cend;
    int64_t bad_seen = 0, bad_first = 0, checked = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t kv = 0; kv < nkv; kv++) {
            const int64_t *e = cend ? cend + b * nW : NULL;
            int64_t o = ps_woff(woff, b, nkv, kv);
            for (int64_t t = -2; t < T + 3; t++, checked++)
                bad_seen += ps_entries_seen(e, o, W, S, nW, t) != ps_geom_seen(&g, b, kv, t);
            for (int64_t j = 0; j < nW; j++) {
                int64_t f = ps_entry_first_seen(e, o, W, S, j);
                if (f == INT64_MAX) bad_first += ps_geom_seen(&g, b, kv, T - 1) > j; /* an absent chunk: never seen */
                else bad_first += !(ps_geom_seen(&g, b, kv, f) > j && ps_geom_seen(&g, b, kv, f - 1) <= j);
            }
        }
    CHECK(bad_seen == 0, "%s: ps_gb_seen differs from ps_geom_seen at %lld of %lld positions", label, (long long)bad_seen,
          (long long)checked);
    CHECK(bad_first == 0, "%s: ps_gb_first_seen is not the first position that sees the entry for %lld entries", label,
          (long long)bad_first);
}

/* chunk tables of B random sequences from the real chunker */
static void chunker_case(const char *label, int64_t B, int64_t T, int64_t d, int64_t W, int64_t S, int64_t m, int64_t nkv,
                         int64_t hd, uint64_t seed) {
    ps_config c = tu_config(PS_ATTN_COMPRESSED);
    c.window = W, c.stride = S, c.local_window = W, c.boundaries = PS_BOUNDARIES_CONTENT, c.chunk_min = m;
    int64_t nC = ps_config_n_windows(&c, T);
    int64_t *cs = calloc((size_t)(B * nC + 1), sizeof(int64_t)), *cl = calloc((size_t)(B * nC + 1), sizeof(int64_t));
    int32_t *tok = malloc((size_t)T * sizeof(int32_t));
    int64_t present = 0, shorter = 0;
    for (int64_t b = 0; b < B; b++) {
        tu_random_tokens(tok, T, 11, seed + (uint64_t)b);
        int64_t k = ps_content_chunks(&c, tok, T, nC, cs + b * nC, cl + b * nC);
        present += k;
        for (int64_t j = 0; j < k; j++) shorter += cl[b * nC + j] < W;
    }
    CHECK(present > 0 && present < B * nC && shorter > 0,
          "%s: the table should have present, absent and short chunks (%lld of %lld present, %lld shorter than W)", label,
          (long long)present, (long long)(B * nC), (long long)shorter);
    test_chunks(label, B, T, d, nC, W, nkv, hd, cs, cl, seed);
    int64_t *cend = malloc((size_t)(B * nC + 1) * sizeof(int64_t)); /* as core/forward.c builds it */
    for (int64_t i = 0; i < B * nC; i++) cend[i] = cl[i] > 0 ? cs[i] + cl[i] - 1 : INT64_MAX;
    test_visibility(label, B, T, W, S, nC, nkv, NULL, cend);
    free(cs), free(cl), free(tok), free(cend);
}

int main(void) {
    ps_error err;
    if (ps_ctx_create(&CPU, "cpu", &err)) {
        fprintf(stderr, "cpu context: %s\n", err.msg);
        return 1;
    }
    /* staggered offsets per head (floor(g*S/nkv)) shifted per sequence: phase augmentation */
    int64_t wo1[2 * 2] = {0, 1, 2, 0}; /* S = 3 */
    test_grid("grid W6/S3 overlapping, staggered", 2, 27, 20, 6, 3, 2, 4, wo1, 100);
    test_visibility("grid W6/S3 staggered", 2, 27, 6, 3, 8, 2, wo1, NULL);
    test_visibility("grid W6/S3 base", 2, 27, 6, 3, 8, 2, NULL, NULL);
    test_grid("grid W6/S3 overlapping, base", 2, 27, 20, 6, 3, 2, 4, NULL, 200);
    int64_t wo2[1 * 4] = {0, 2, 4, 6}; /* S = 8 */
    test_grid("grid W8/S8, 4 staggered heads, d 33", 1, 40, 33, 8, 8, 4, 6, wo2, 300);
    test_visibility("grid W8/S8 staggered", 1, 40, 8, 8, 5, 4, wo2, NULL);
    int64_t wo3[3 * 3] = {1, 0, 1, 0, 0, 0, 1, 1, 1}; /* S = 2 */
    test_grid("grid W5/S2 overlapping, 3 sequences", 3, 23, 12, 5, 2, 3, 4, wo3, 400);
    test_visibility("grid W5/S2 staggered", 3, 23, 5, 2, 10, 3, wo3, NULL);
    int64_t wo4[2 * 2] = {3, 1}; /* S = 4, B = 1 */
    test_grid("grid W4/S4, T = nW*S", 1, 24, 16, 4, 4, 2, 4, wo4, 500);
    int64_t wo5[2 * 2] = {7, 0, 3, 5}; /* S = 8 */
    test_grid("grid T < W (no windows)", 2, 5, 8, 8, 8, 2, 4, wo5, 600);

    chunker_case("chunks W8/S4/min2", 3, 40, 20, 8, 4, 2, 2, 4, 700);
    chunker_case("chunks W6/S3/min1, d 33", 2, 31, 33, 6, 3, 1, 3, 6, 800);
    chunker_case("chunks W8/S5/min3", 2, 64, 16, 8, 5, 3, 2, 8, 900);
    /* a hand-made table: overlapping chunks, one out of order, short ones, an absent one */
    int64_t cs[2 * 4] = {0, 2, 5, 0, 6, 1, 10, 0}, cl[2 * 4] = {4, 5, 3, 0, 4, 6, 2, 0};
    test_chunks("chunks hand-made, overlapping", 2, 14, 12, 4, 6, 2, 4, cs, cl, 1000);
    ps_ctx_free(CPU);
    CHECK_DONE();
}
