/* test_kernels.c — the fast CPU kernels of ops.h (and the optimizer) against plain double-precision loops
 * written here from their definitions: attention forward and backward (full and compressed, GQA,
 * overlapping and non-overlapping windows, odd sizes), compressor payloads (the batched T = nW·S path and
 * the per-sequence path), RMSNorm backward, SwiGLU, cross-entropy, ps_expf, the gradient norm and AdamW;
 * and the kernels whose reductions are split over threads give the same bits with 1 and 2 threads. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/model.h"
#include "core/cpu/cpu.h"
#include "train/optim.h"
#include "core/rng.h"

static ps_rng rng_;
static ps_ctx *ctx; /* the CPU context every op of this test runs on */

static float *randv(int64_t n, double sd) {
    float *x = malloc((size_t)(n ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++) x[i] = (float)(sd * ps_rng_normal(&rng_));
    return x;
}

static double *zerod(int64_t n) { return calloc((size_t)(n ? n : 1), sizeof(double)); }

/* max |a - b| / max |b| */
static double rel_err(const float *a, const double *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= num)) num = d;
        if (fabs(b[i]) > den) den = fabs(b[i]);
    }
    return den > 0 ? num / den : num;
}

/* ---- ps_expf ---- */

static void test_expf(void) {
    double worst = 0;
    for (int i = 0; i <= 200000; i++) {
        float x = -87.0f + 175.0f * (float)i / 200000.0f;
        double r = exp((double)x), e = fabs((double)ps_expf(x) - r) / r;
        if (e > worst) worst = e;
    }
    CHECK(worst < 3e-7, "ps_expf worst relative error %.3g over [-87, 88]", worst);
    CHECK(ps_expf(0.0f) == 1.0f, "ps_expf(0) = %.9g", ps_expf(0.0f));
    CHECK(ps_expf(-1000.0f) >= 0.0f && ps_expf(-1000.0f) < 2e-38f, "ps_expf(-1000) = %g", ps_expf(-1000.0f));
    CHECK(isnan(ps_expf(NAN)), "ps_expf(NaN) = %g", ps_expf(NAN));
    /* ps_expf_v: ps_expf's float, bit for bit, on every 4999th bit pattern (all signs and exponents: NaNs,
     * ±inf, denormals, both clamps) and the edges; a loop, as the kernels call it */
    enum { NS = 860 * 1024 + 16 };
    static float xs[NS], ys[NS];
    int64_t n = 0;
    for (uint64_t u = 0; u < (1ull << 32) && n < NS - 16; u += 4999, n++) {
        uint32_t b = (uint32_t)u;
        memcpy(&xs[n], &b, 4);
    }
    const float edge[] = {-87.0f, nextafterf(-87.0f, 0), nextafterf(-87.0f, -100), 88.0f, nextafterf(88.0f, 0),
                          nextafterf(88.0f, 100), 0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN};
    for (size_t i = 0; i < sizeof edge / sizeof edge[0]; i++) xs[n++] = edge[i];
    for (int64_t i = 0; i < n; i++) ys[i] = ps_expf_v(xs[i]);
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        float r = ps_expf(xs[i]);
        if (memcmp(&r, &ys[i], 4)) bad++;
    }
    CHECK(bad == 0, "ps_expf_v differs from ps_expf on %lld of %lld inputs", (long long)bad, (long long)n);
}

/* ---- attention: reference forward and backward over explicit entry lists ---- */

typedef struct {
    int64_t B, T, nh, nkv, hd, W, S, LW, nW;
    int comp;
} geo;

static ps_attn_geom to_geom(const geo *g) {
    ps_attn_geom a = {.B = g->B, .T = g->T, .nh = g->nh, .nkv = g->nkv, .hd = g->hd, .compressed = g->comp,
                      .W = g->W, .S = g->S, .LW = g->comp ? (g->LW < g->T ? g->LW : g->T) : 0, .nW = g->nW};
    a.ncols = g->comp ? a.nW + a.LW : g->T;
    return a;
}

/* Entry e of query t: compressed windows j < seen(t) (key ck/cv row j), then raw t' in [lo, t]. Returns the
 * count; fills is_c and idx. */
static int64_t entries(const geo *g, int64_t t, int *is_c, int64_t *idx) {
    int64_t n = 0, lo = 0;
    if (g->comp) {
        int64_t seen = ps_windows_seen(t, g->W, g->S, g->nW);
        for (int64_t j = 0; j < seen; j++) is_c[n] = 1, idx[n++] = j;
        lo = t - g->LW + 1 > 0 ? t - g->LW + 1 : 0;
    }
    for (int64_t tp = lo; tp <= t; tp++) is_c[n] = 0, idx[n++] = tp;
    return n;
}

/* z = softmax(q·keys / sqrt(hd)) · values per (b, head, t); with dz given, also the gradients (+=). */
static void ref_attention(const geo *g, const float *q, const float *k, const float *v, const float *ck,
                          const float *cv, double *z, const float *dz, double *dq, double *dk, double *dv, double *dck,
                          double *dcv) {
    int64_t T = g->T, nh = g->nh, nkv = g->nkv, hd = g->hd, grp = nh / nkv, ne_max = g->nW + T;
    int *is_c = malloc((size_t)ne_max * sizeof(int));
    int64_t *idx = malloc((size_t)ne_max * sizeof(int64_t));
    double *p = malloc((size_t)ne_max * sizeof(double)), *dp = malloc((size_t)ne_max * sizeof(double));
    double scale = 1.0 / sqrt((double)hd);
    for (int64_t b = 0; b < g->B; b++)
        for (int64_t n = 0; n < nh; n++)
            for (int64_t t = 0; t < T; t++) {
                int64_t kv = n / grp, ne = entries(g, t, is_c, idx);
                const float *qt = q + ((b * T + t) * nh + n) * hd;
#define KEY(e) (is_c[e] ? ck + ((b * g->nW + idx[e]) * nkv + kv) * hd : k + ((b * T + idx[e]) * nkv + kv) * hd)
#define VAL(e) (is_c[e] ? cv + ((b * g->nW + idx[e]) * nkv + kv) * hd : v + ((b * T + idx[e]) * nkv + kv) * hd)
                double mx = -1e300, sum = 0;
                for (int64_t e = 0; e < ne; e++) {
                    double s = 0;
                    for (int64_t i = 0; i < hd; i++) s += (double)qt[i] * KEY(e)[i];
                    p[e] = s * scale;
                    if (p[e] > mx) mx = p[e];
                }
                for (int64_t e = 0; e < ne; e++) sum += (p[e] = exp(p[e] - mx));
                for (int64_t e = 0; e < ne; e++) p[e] /= sum;
                double *zt = z + ((b * T + t) * nh + n) * hd;
                for (int64_t i = 0; i < hd; i++) {
                    double s = 0;
                    for (int64_t e = 0; e < ne; e++) s += p[e] * VAL(e)[i];
                    zt[i] = s;
                }
                if (!dz) continue;
                const float *dzt = dz + ((b * T + t) * nh + n) * hd;
                double dot = 0;
                for (int64_t e = 0; e < ne; e++) {
                    double s = 0;
                    for (int64_t i = 0; i < hd; i++) s += (double)dzt[i] * VAL(e)[i];
                    dp[e] = s;
                    dot += p[e] * s;
                }
                for (int64_t e = 0; e < ne; e++) {
                    double ds = p[e] * (dp[e] - dot) * scale;
                    double *dkey = is_c[e] ? dck + ((b * g->nW + idx[e]) * nkv + kv) * hd : dk + ((b * T + idx[e]) * nkv + kv) * hd;
                    double *dval = is_c[e] ? dcv + ((b * g->nW + idx[e]) * nkv + kv) * hd : dv + ((b * T + idx[e]) * nkv + kv) * hd;
                    for (int64_t i = 0; i < hd; i++) {
                        dq[((b * T + t) * nh + n) * hd + i] += ds * KEY(e)[i];
                        dkey[i] += ds * qt[i];
                        dval[i] += p[e] * dzt[i];
                    }
                }
#undef KEY
#undef VAL
            }
    free(is_c), free(idx), free(p), free(dp);
}

static void test_attention_case(const char *name, geo g) {
    g.nW = g.comp && g.T >= g.W ? (g.T - g.W) / g.S + 1 : 0;
    ps_attn_geom ag = to_geom(&g);
    int64_t nq = g.B * g.T * g.nh * g.hd, nk = g.B * g.T * g.nkv * g.hd, nc = g.B * g.nW * g.nkv * g.hd;
    float *q = randv(nq, 1), *k = randv(nk, 1), *v = randv(nk, 1), *ck = randv(nc, 1), *cv = randv(nc, 1);
    float *dz = randv(nq, 1);
    int64_t np = g.B * g.nh * g.T * ag.ncols;
    float *probs = randv(np, 1), *dprobs = randv(np, 1), *z = randv(nq, 1);
    /* the gradient scratch starts as NaN: a backward that reads a cell it never wrote poisons its row
     * (the compressed backward once left the raw columns before the sequence start unwritten) */
    for (int64_t i = 0; i < np; i++) dprobs[i] = NAN;
    float *dq = randv(nq, 1), *dk = calloc((size_t)nk, 4), *dv = calloc((size_t)nk, 4);
    float *dck = calloc((size_t)(nc ? nc : 1), 4), *dcv = calloc((size_t)(nc ? nc : 1), 4);
    double *rz = zerod(nq), *rdq = zerod(nq), *rdk = zerod(nk), *rdv = zerod(nk), *rdck = zerod(nc), *rdcv = zerod(nc);
    ref_attention(&g, q, k, v, ck, cv, rz, dz, rdq, rdk, rdv, rdck, rdcv);
    /* the materialised path (pattern hooks): probabilities, output, backward from stored probabilities */
    CHECK(!ps_attn_probs(ctx, probs, q, k, ck, &ag) && !ps_attn_out(ctx, z, probs, v, cv, &ag), "%s: probs path failed", name);
    CHECK(rel_err(z, rz, nq) < 1e-5, "%s: attention output rel. error %.3g", name, rel_err(z, rz, nq));
    ps_cpu_attn_backward_probs(ctx, dq, dk, dv, dck, dcv, dprobs, dz, probs, q, k, v, ck, cv, &ag);
    CHECK(rel_err(dq, rdq, nq) < 1e-4, "%s: dq rel. error %.3g", name, rel_err(dq, rdq, nq));
    CHECK(rel_err(dk, rdk, nk) < 1e-4, "%s: dk rel. error %.3g", name, rel_err(dk, rdk, nk));
    CHECK(rel_err(dv, rdv, nk) < 1e-4, "%s: dv rel. error %.3g", name, rel_err(dv, rdv, nk));
    if (nc) {
        CHECK(rel_err(dck, rdck, nc) < 1e-4, "%s: dck rel. error %.3g", name, rel_err(dck, rdck, nc));
        CHECK(rel_err(dcv, rdcv, nc) < 1e-4, "%s: dcv rel. error %.3g", name, rel_err(dcv, rdcv, nc));
    }
    /* the O(T)-memory path the model runs: output + row log-sum-exp, backward recomputing probabilities */
    float *lse = malloc((size_t)(g.B * g.nh * g.T) * 4);
    memset(dk, 0, (size_t)nk * 4), memset(dv, 0, (size_t)nk * 4);
    if (nc) memset(dck, 0, (size_t)nc * 4), memset(dcv, 0, (size_t)nc * 4);
    CHECK(!ps_attn_forward(ctx, z, lse, q, k, v, ck, cv, &ag), "%s: attention forward failed: %s", name, ctx->err.msg);
    CHECK(rel_err(z, rz, nq) < 1e-5, "%s: flash attention output rel. error %.3g", name, rel_err(z, rz, nq));
    CHECK(!ps_attn_backward(ctx, dq, dk, dv, dck, dcv, dz, z, lse, q, k, v, ck, cv, &ag), "%s: attention backward failed", name);
    CHECK(rel_err(dq, rdq, nq) < 1e-4, "%s: flash dq rel. error %.3g", name, rel_err(dq, rdq, nq));
    CHECK(rel_err(dk, rdk, nk) < 1e-4, "%s: flash dk rel. error %.3g", name, rel_err(dk, rdk, nk));
    CHECK(rel_err(dv, rdv, nk) < 1e-4, "%s: flash dv rel. error %.3g", name, rel_err(dv, rdv, nk));
    if (nc) {
        CHECK(rel_err(dck, rdck, nc) < 1e-4, "%s: flash dck rel. error %.3g", name, rel_err(dck, rdck, nc));
        CHECK(rel_err(dcv, rdcv, nc) < 1e-4, "%s: flash dcv rel. error %.3g", name, rel_err(dcv, rdcv, nc));
    }
    free(lse);
    /* the rows kernel computes the same function */
    int64_t rows[3] = {0, g.T / 2, g.B * g.T - 1}, nr = 3;
    float *zr = malloc((size_t)(nr * g.nh * g.hd) * 4);
    double *want = zerod(nr * g.nh * g.hd);
    for (int64_t i = 0; i < nr; i++) memcpy(want + i * g.nh * g.hd, rz + rows[i] * g.nh * g.hd, (size_t)(g.nh * g.hd) * 8);
    ps_attn_rows(ctx, zr, rows, nr, q, k, v, ck, cv, &ag);
    CHECK(rel_err(zr, want, nr * g.nh * g.hd) < 1e-5, "%s: attention rows rel. error %.3g", name,
          rel_err(zr, want, nr * g.nh * g.hd));
    free(zr), free(want);
    free(q), free(k), free(v), free(ck), free(cv), free(dz), free(probs), free(dprobs), free(z);
    free(dq), free(dk), free(dv), free(dck), free(dcv);
    free(rz), free(rdq), free(rdk), free(rdv), free(rdck), free(rdcv);
}

static void test_attention(void) {
    /* full: odd T (several query blocks, a partial last one), GQA */
    test_attention_case("full T=133 nh=6 nkv=2 hd=12", (geo){.B = 2, .T = 133, .nh = 6, .nkv = 2, .hd = 12});
    test_attention_case("full T=5 nh=3 nkv=3 hd=7", (geo){.B = 3, .T = 5, .nh = 3, .nkv = 3, .hd = 7});
    /* compressed: W = S (T = nW·S and not), overlapping windows W > S, local window > T, no window ended */
    test_attention_case("compressed W8/S8 T=64", (geo){.B = 3, .T = 64, .nh = 4, .nkv = 2, .hd = 16, .W = 8, .S = 8, .LW = 8, .comp = 1});
    test_attention_case("compressed W5/S3 LW4 T=37", (geo){.B = 2, .T = 37, .nh = 6, .nkv = 3, .hd = 10, .W = 5, .S = 3, .LW = 4, .comp = 1});
    test_attention_case("compressed W4/S6 LW50 T=31", (geo){.B = 2, .T = 31, .nh = 2, .nkv = 1, .hd = 9, .W = 4, .S = 6, .LW = 50, .comp = 1});
    test_attention_case("compressed W16 T=9", (geo){.B = 1, .T = 9, .nh = 2, .nkv = 2, .hd = 8, .W = 16, .S = 16, .LW = 4, .comp = 1});
}

/* ---- compressor payloads (per-offset and shared) ---- */

static void test_payload_case(const char *name, int64_t B, int64_t T, int64_t d, int64_t W, int64_t S, int64_t nkvhd, int shared) {
    int64_t nW = T >= W ? (T - W) / S + 1 : 0;
    int64_t nC = shared ? nkvhd * d : W * nkvhd * d, nP = B * nW * W * nkvhd;
    float *a = randv(B * T * d, 1), *C = randv(nC, 0.3), *P = randv(nP ? nP : 1, 1), *scratch = malloc((size_t)(B * T * nkvhd) * 4);
    float *dP = randv(nP ? nP : 1, 1), *da = randv(B * T * d, 1), *dC = randv(nC, 1);
    double *rP = zerod(nP), *rda = zerod(B * T * d), *rdC = zerod(nC);
    for (int64_t i = 0; i < B * T * d; i++) rda[i] = da[i];
    for (int64_t i = 0; i < nC; i++) rdC[i] = dC[i];
    for (int64_t b = 0; b < B; b++)
        for (int64_t j = 0; j < nW; j++)
            for (int64_t i = 0; i < W; i++) {
                const float *x = a + (b * T + j * S + i) * d, *Ci = shared ? C : C + i * nkvhd * d;
                int64_t pr = ((b * nW + j) * W + i) * nkvhd;
                double *dCi = shared ? rdC : rdC + i * nkvhd * d;
                for (int64_t e = 0; e < nkvhd; e++) {
                    double s = 0;
                    for (int64_t c = 0; c < d; c++) {
                        s += (double)Ci[e * d + c] * x[c];
                        rda[(b * T + j * S + i) * d + c] += (double)dP[pr + e] * Ci[e * d + c];
                        dCi[e * d + c] += (double)dP[pr + e] * x[c];
                    }
                    rP[pr + e] = s;
                }
            }
    int64_t *wtab = malloc((size_t)(2 * B * nW + 1) * sizeof *wtab); /* the base grid's window table, one KV head of nkvhd */
    ps_windows win = ps_windows_grid(wtab, wtab + B * nW, B, T, nW, W, S, 1, NULL);
    ps_payload(ctx, P, a, C, shared, scratch, d, nkvhd, &win);
    CHECK(rel_err(P, rP, nP) < 1e-5, "%s: payload rel. error %.3g", name, rel_err(P, rP, nP));
    ps_payload_backward(ctx, da, dC, dP, a, C, shared, scratch, d, nkvhd, &win);
    free(wtab);
    CHECK(rel_err(da, rda, B * T * d) < 1e-5, "%s: payload d(input) rel. error %.3g", name, rel_err(da, rda, B * T * d));
    CHECK(rel_err(dC, rdC, nC) < 1e-5, "%s: payload d(weights) rel. error %.3g", name, rel_err(dC, rdC, nC));
    free(a), free(C), free(P), free(scratch), free(dP), free(da), free(dC), free(rP), free(rda), free(rdC);
}

static void test_payload(void) {
    test_payload_case("per-offset W8/S8 T=64 (batched)", 3, 64, 24, 8, 8, 20, 0);
    test_payload_case("per-offset W8/S8 T=67 (per sequence)", 3, 67, 24, 8, 8, 20, 0);
    test_payload_case("per-offset W5/S3 T=37 (overlapping)", 2, 37, 13, 5, 3, 11, 0);
    test_payload_case("per-offset W3/S5 T=35 (gaps, batched)", 2, 35, 13, 3, 5, 7, 0);
    test_payload_case("shared W6/S4 T=30", 2, 30, 9, 6, 4, 10, 1);
    test_payload_case("per-offset W8 T=5 (no window)", 2, 5, 8, 8, 8, 8, 0);
}

/* ---- gates (learned softmax over offsets) ---- */

static void test_gate(void) {
    int64_t B = 2, T = 37, d = 11, W = 5, S = 3, nkv = 3, nW = (T - W) / S + 1, n = B * nW * nkv * W;
    float *a = randv(B * T * d, 1), *u = randv(W * nkv * d, 0.5), *c = randv(W * nkv, 0.5);
    float *z = malloc((size_t)n * 4), *al = malloc((size_t)n * 4);
    double *rz = zerod(n), *ral = zerod(n);
    for (int64_t b = 0; b < B; b++)
        for (int64_t j = 0; j < nW; j++)
            for (int64_t g = 0; g < nkv; g++) {
                int64_t base = ((b * nW + j) * nkv + g) * W;
                double mx = -1e300, sum = 0;
                for (int64_t i = 0; i < W; i++) {
                    double s = c[i * nkv + g];
                    for (int64_t e = 0; e < d; e++) s += (double)u[(i * nkv + g) * d + e] * a[(b * T + j * S + i) * d + e];
                    rz[base + i] = s;
                    if (s > mx) mx = s;
                }
                for (int64_t i = 0; i < W; i++) sum += (ral[base + i] = exp(rz[base + i] - mx));
                for (int64_t i = 0; i < W; i++) ral[base + i] /= sum;
            }
    int64_t wtab[2 * 2 * 11];
    ps_windows win = ps_windows_grid(wtab, wtab + B * nW, B, T, nW, W, S, nkv, NULL);
    ps_gate(ctx, z, al, a, u, c, d, &win);
    CHECK(rel_err(z, rz, n) < 1e-5, "gate logits rel. error %.3g", rel_err(z, rz, n));
    CHECK(rel_err(al, ral, n) < 1e-5, "gate alpha rel. error %.3g", rel_err(al, ral, n));
    free(a), free(u), free(c), free(z), free(al), free(rz), free(ral);
}

/* ---- RMSNorm backward, SwiGLU, cross-entropy ---- */

static void test_rmsnorm_backward(int64_t R, int64_t C) {
    float *x = randv(R * C, 1), *w = randv(C, 1), *dy = randv(R * C, 1), *rstd = malloc((size_t)R * 4), *y = malloc((size_t)(R * C) * 4);
    float *dx = randv(R * C, 1), *dw = randv(C, 1);
    double *rdx = zerod(R * C), *rdw = zerod(C);
    for (int64_t i = 0; i < R * C; i++) rdx[i] = dx[i];
    for (int64_t i = 0; i < C; i++) rdw[i] = dw[i];
    ps_rmsnorm(ctx, y, rstd, x, w, R, C, 1e-6f);
    for (int64_t r = 0; r < R; r++) {
        double ss = 0, dot = 0;
        for (int64_t i = 0; i < C; i++) ss += (double)x[r * C + i] * x[r * C + i];
        double s = 1.0 / sqrt(ss / (double)C + 1e-6);
        for (int64_t i = 0; i < C; i++) dot += (double)dy[r * C + i] * w[i] * x[r * C + i];
        for (int64_t i = 0; i < C; i++) {
            rdx[r * C + i] += s * w[i] * dy[r * C + i] - dot * s * s * s / (double)C * x[r * C + i];
            rdw[i] += (double)dy[r * C + i] * x[r * C + i] * s;
        }
    }
    ps_rmsnorm_backward(ctx, dx, dw, dy, x, w, rstd, R, C);
    CHECK(rel_err(dx, rdx, R * C) < 1e-5, "rmsnorm backward %lldx%lld: dx rel. error %.3g", (long long)R, (long long)C,
          rel_err(dx, rdx, R * C));
    CHECK(rel_err(dw, rdw, C) < 1e-5, "rmsnorm backward %lldx%lld: dweight rel. error %.3g", (long long)R, (long long)C,
          rel_err(dw, rdw, C));
    free(x), free(w), free(dy), free(rstd), free(y), free(dx), free(dw), free(rdx), free(rdw);
}

static void test_swiglu(void) {
    int64_t n = 70001;
    float *g = randv(n, 4), *u = randv(n, 1), *dh = randv(n, 1), *h = malloc((size_t)n * 4), *dg = malloc((size_t)n * 4), *du = malloc((size_t)n * 4);
    g[0] = -100.0f, g[1] = 100.0f, g[2] = 0.0f;
    double *rh = zerod(n), *rdg = zerod(n), *rdu = zerod(n);
    for (int64_t i = 0; i < n; i++) {
        double x = g[i], sg = 1.0 / (1.0 + exp(-x));
        rh[i] = x * sg * u[i];
        rdu[i] = dh[i] * x * sg;
        rdg[i] = dh[i] * u[i] * sg * (1.0 + x * (1.0 - sg));
    }
    ps_swiglu(ctx, h, g, u, n);
    ps_swiglu_backward(ctx, dg, du, dh, g, u, n);
    CHECK(rel_err(h, rh, n) < 1e-6, "swiglu rel. error %.3g", rel_err(h, rh, n));
    CHECK(rel_err(dg, rdg, n) < 1e-6, "swiglu dg rel. error %.3g", rel_err(dg, rdg, n));
    CHECK(rel_err(du, rdu, n) < 1e-6, "swiglu du rel. error %.3g", rel_err(du, rdu, n));
    free(g), free(u), free(dh), free(h), free(dg), free(du), free(rh), free(rdg), free(rdu);
}

static void test_cross_entropy(void) {
    int64_t R = 37, V = 101;
    float *x = randv(R * V, 3), *dx = malloc((size_t)(R * V) * 4);
    int32_t *y = malloc((size_t)R * sizeof(int32_t));
    for (int64_t r = 0; r < R; r++) y[r] = r % 5 == 2 ? -1 : (int32_t)((r * 7) % V);
    double loss = 0, rloss = 0, *rdx = zerod(R * V);
    float scale = 0.25f;
    for (int64_t r = 0; r < R; r++) {
        if (y[r] < 0) continue;
        double mx = -1e300, s = 0;
        for (int64_t i = 0; i < V; i++) mx = x[r * V + i] > mx ? x[r * V + i] : mx;
        for (int64_t i = 0; i < V; i++) s += exp(x[r * V + i] - mx);
        rloss += log(s) + mx - x[r * V + y[r]];
        for (int64_t i = 0; i < V; i++) rdx[r * V + i] = exp(x[r * V + i] - mx) / s * scale - (i == y[r] ? scale : 0);
    }
    int64_t n = 0;
    CHECK(!ps_cross_entropy(ctx, &loss, &n, dx, x, y, R, V, scale), "cross-entropy failed");
    CHECK(n == R - 7, "cross-entropy counted %lld targets, want %lld", (long long)n, (long long)(R - 7));
    CHECK(fabs(loss - rloss) < 1e-5 * fabs(rloss), "cross-entropy loss %.9g vs %.9g", loss, rloss);
    CHECK(rel_err(dx, rdx, R * V) < 1e-5, "cross-entropy dlogits rel. error %.3g", rel_err(dx, rdx, R * V));
    free(x), free(dx), free(y), free(rdx);
}

/* ---- optimizer ---- */

static void test_optim(void) {
    int64_t n = 300001;
    float *g = randv(n, 1);
    double r = 0;
    for (int64_t i = 0; i < n; i++) r += (double)g[i] * g[i];
    double gn = 0;
    ps_error err;
    CHECK(!ps_grad_norm(ctx, g, n, &gn, &err), "grad norm failed");
    CHECK(fabs(gn - sqrt(r)) < 1e-12 * sqrt(r), "grad norm %.17g vs %.17g", gn, sqrt(r));
    free(g);

    ps_config c;
    ps_config_defaults(&c);
    c.vocab_size = 37, c.d_model = 24, c.n_layers = 2, c.n_heads = 2, c.n_kv_heads = 1, c.head_dim = 12, c.d_ff = 40;
    c.max_seq_len = 32, c.kind = PS_ATTN_COMPRESSED, c.window = 4, c.stride = 4, c.local_window = 4;
    ps_model m;
    if (ps_model_create(&m, &c, &err)) {
        CHECK(0, "%s", err.msg);
        return;
    }
    ps_model_init(&m, 1);
    int64_t np = m.n_params;
    float *gr = randv(np, 1), *m1 = randv(np, 0.1), *m2 = randv(np, 0.1), *w0 = malloc((size_t)np * 4);
    for (int64_t i = 0; i < np; i++) m2[i] = fabsf(m2[i]);
    double *rw = zerod(np), *rm1 = zerod(np), *rm2 = zerod(np);
    memcpy(w0, m.params, (size_t)np * 4);
    ps_optim_cfg oc;
    ps_optim_defaults(&oc);
    oc.gate_lr_mult = 3, oc.gate_weight_decay = 0.01;
    double lr = 1e-2, cs = 0.5, t = 3, bc1 = 1 - pow(oc.beta1, t), bc2 = 1 - pow(oc.beta2, t);
    /* the plain float loop of the optimizer, operation for operation: the fast path must match it bit for bit */
    float *fw = malloc((size_t)np * 4), *fm1 = malloc((size_t)np * 4), *fm2 = malloc((size_t)np * 4);
    for (int i = 0; i < m.n_tensors; i++) {
        const ps_param_info *p = &m.table[i];
        int gate = p->kind == PS_P_KEY_GATE_W || p->kind == PS_P_KEY_GATE_B || p->kind == PS_P_VALUE_GATE_W ||
                   p->kind == PS_P_VALUE_GATE_B;
        double plr = gate ? lr * oc.gate_lr_mult : lr, wd = gate ? oc.gate_weight_decay : p->ndim >= 2 ? oc.weight_decay : 0;
        for (int64_t j = p->offset; j < p->offset + p->numel; j++) {
            double gj = gr[j] * cs;
            rm1[j] = oc.beta1 * m1[j] + (1 - oc.beta1) * gj;
            rm2[j] = oc.beta2 * m2[j] + (1 - oc.beta2) * gj * gj;
            rw[j] = w0[j] - plr * (rm1[j] / bc1 / (sqrt(rm2[j] / bc2) + oc.eps) + wd * w0[j]);
            float fg = gr[j] * (float)cs, b1 = (float)oc.beta1, b2 = (float)oc.beta2;
            fm1[j] = b1 * m1[j] + (1.0f - b1) * fg;
            fm2[j] = b2 * m2[j] + (1.0f - b2) * fg * fg;
            float mh = fm1[j] * (float)(1.0 / bc1), vh = fm2[j] * (float)(1.0 / bc2);
            fw[j] = w0[j] - (float)plr * (mh / (sqrtf(vh) + (float)oc.eps) + (float)wd * w0[j]);
        }
    }
    CHECK(!ps_adamw_update(&m, gr, m1, m2, (int64_t)t, lr, cs, &oc, &err), "adamw failed: %s", err.msg);
    CHECK(rel_err(m.params, rw, np) < 1e-5, "adamw weights rel. error %.3g", rel_err(m.params, rw, np));
    CHECK(rel_err(m1, rm1, np) < 1e-5, "adamw m1 rel. error %.3g", rel_err(m1, rm1, np));
    CHECK(rel_err(m2, rm2, np) < 1e-5, "adamw m2 rel. error %.3g", rel_err(m2, rm2, np));
    CHECK(!memcmp(m.params, fw, (size_t)np * 4) && !memcmp(m1, fm1, (size_t)np * 4) && !memcmp(m2, fm2, (size_t)np * 4),
          "adamw differs from the plain float loop");
    free(fw), free(fm1), free(fm2);
    free(gr), free(m1), free(m2), free(w0), free(rw), free(rm1), free(rm2);
    ps_model_free(&m);
}

/* ---- thread-count independence of the split reductions ---- */

static void test_threads(void) {
    int64_t R = 1000, C = 48, B = 3, T = 64, d = 24, W = 8, S = 8, nkvhd = 20, nW = (T - W) / S + 1;
    float *x = randv(R * C, 1), *w = randv(C, 1), *dy = randv(R * C, 1), *rstd = malloc((size_t)R * 4), *y = malloc((size_t)(R * C) * 4);
    ps_rmsnorm(ctx, y, rstd, x, w, R, C, 1e-6f);
    float *a = randv(B * T * d, 1), *Cw = randv(W * nkvhd * d, 1), *dP = randv(B * nW * W * nkvhd, 1);
    float *g = randv(200003, 1);
    float *dw[2], *dx[2], *dC[2], *da[2];
    double gn[2];
    int saved = omp_get_max_threads();
    for (int k = 0; k < 2; k++) {
        omp_set_num_threads(k + 1);
        dw[k] = calloc((size_t)C, 4), dx[k] = calloc((size_t)(R * C), 4);
        dC[k] = calloc((size_t)(W * nkvhd * d), 4), da[k] = calloc((size_t)(B * T * d), 4);
        ps_rmsnorm_backward(ctx, dx[k], dw[k], dy, x, w, rstd, R, C);
        int64_t wtab[2 * 3 * 8];
        ps_windows win = ps_windows_grid(wtab, wtab + B * nW, B, T, nW, W, S, 1, NULL);
        ps_payload_backward(ctx, da[k], dC[k], dP, a, Cw, 0, NULL, d, nkvhd, &win);
        ps_error err;
        CHECK(!ps_grad_norm(ctx, g, 200003, &gn[k], &err), "grad norm failed");
    }
    omp_set_num_threads(saved);
    CHECK(!memcmp(dw[0], dw[1], (size_t)C * 4), "rmsnorm dweight differs between 1 and 2 threads");
    CHECK(!memcmp(dx[0], dx[1], (size_t)(R * C) * 4), "rmsnorm dx differs between 1 and 2 threads");
    CHECK(!memcmp(dC[0], dC[1], (size_t)(W * nkvhd * d) * 4), "payload dC differs between 1 and 2 threads");
    CHECK(!memcmp(da[0], da[1], (size_t)(B * T * d) * 4), "payload da differs between 1 and 2 threads");
    CHECK(gn[0] == gn[1], "grad norm %.17g (1 thread) vs %.17g (2 threads)", gn[0], gn[1]);
    for (int k = 0; k < 2; k++) free(dw[k]), free(dx[k]), free(dC[k]), free(da[k]);
    free(x), free(w), free(dy), free(rstd), free(y), free(a), free(Cw), free(dP), free(g);
}

int main(void) {
    ps_error cerr;
    if (ps_ctx_create(&ctx, "cpu", &cerr)) {
        fprintf(stderr, "%s\n", cerr.msg);
        return 1;
    }
    ps_rng_seed(&rng_, 7);
    test_expf();
    test_attention();
    test_payload();
    test_gate();
    test_rmsnorm_backward(1, 7);
    test_rmsnorm_backward(131, 37);
    test_rmsnorm_backward(4096, 64);
    test_swiglu();
    test_cross_entropy();
    test_optim();
    test_threads();
    ps_ctx_free(ctx);
    CHECK_DONE();
}
