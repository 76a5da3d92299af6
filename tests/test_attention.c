/* test_attention.c — the CPU backend's O(T)-memory attention kernels (core/cpu/attention.c) against a
 * plain double-precision loop reference that materialises the probability matrix: forward z and lse,
 * backward dq (=) and dk, dv, dck, dcv (+=), on full and compressed geometries (GQA, overlapping and
 * gapped windows, local window shorter and longer than the sequence, no window ended, T = 1, several
 * query blocks with a partial last one, head sizes that are not a multiple of 16), and the probability
 * rows a pattern hook materialises (attn_probs + attn_out give the forward's z bit for bit); the
 * backward against central finite differences of a scalar loss; bit-identical results on 1 and 2
 * threads; scratch read only where written (NaN-filled workspace); the workspace is O(block × ncols)
 * per thread; bad geometry and a failed workspace are reported through the context. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/cpu/cpu_attention.h"
#include "core/ops.h"
#include "core/rng.h"

static ps_rng rng_;

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

/* ---- geometry ---- */

typedef struct {
    int64_t B, T, nh, nkv, hd, W, S, local_window;
    int comp;
} geo;

/* The op's geometry: nW windows that fit in T, LW = min(local_window, T). */
static ps_attn_geom to_geom(const geo *g) {
    ps_attn_geom a = {.B = g->B, .T = g->T, .nh = g->nh, .nkv = g->nkv, .hd = g->hd, .compressed = g->comp};
    if (g->comp) {
        a.W = g->W, a.S = g->S;
        a.LW = g->local_window < g->T ? g->local_window : g->T;
        a.nW = g->T >= g->W ? (g->T - g->W) / g->S + 1 : 0;
        a.ncols = a.nW + a.LW;
    } else
        a.ncols = g->T;
    return a;
}

/* ---- the reference: double precision, probabilities materialised ---- */

/* Entry (column) c of query t's probability row, in the compact layout of ps_attn_probs: full — raw
 * position c (seen when c <= t); compressed — window c (c < nW, seen when c < windows_seen(t)), else raw
 * position t-LW+1+(c-nW) (seen when >= 0). Returns 1 when seen, with the key/value row in *row and
 * whether it is a window in *win. */
static int column(const ps_attn_geom *g, int64_t t, int64_t c, int64_t *row, int *win) {
    if (!g->compressed) {
        *row = c, *win = 0;
        return c <= t;
    }
    if (c < g->nW) {
        *row = c, *win = 1;
        return c < ps_windows_seen(t, g->W, g->S, g->nW);
    }
    *row = t - g->LW + 1 + (c - g->nW), *win = 0;
    return *row >= 0;
}

typedef struct {
    double *z, *lse, *dq, *dk, *dv, *dck, *dcv;
    double *P; /* [B, nh, T, ncols] (may be NULL) */
} ref_out;

/* Forward: P[b, n, t, c] = softmax over seen columns of q·key/sqrt(hd), z = P·values, lse. With dz,
 * the gradients from P: dP = dz·value, dS = P(dP - Σ P dP)/sqrt(hd); dq (=), dk, dv, dck, dcv (+=). */
static void ref_attention(const ps_attn_geom *g, const float *q, const float *k, const float *v, const float *ck,
                          const float *cv, const float *dz, ref_out *o) {
    int64_t T = g->T, nh = g->nh, nkv = g->nkv, hd = g->hd, nc = g->ncols, grp = nh / nkv;
    double *P = zerod(g->B * nh * T * nc), *dP = zerod(nc);
    double scale = 1.0 / sqrt((double)hd);
    for (int64_t b = 0; b < g->B; b++)
        for (int64_t n = 0; n < nh; n++) {
            int64_t kv = n / grp;
            for (int64_t t = 0; t < T; t++) {
                const float *qt = q + ((b * T + t) * nh + n) * hd;
                double *pr = P + ((b * nh + n) * T + t) * nc, mx = -INFINITY, sum = 0;
                int64_t row;
                int win;
#define KEY(r, w) ((w) ? ck + ((b * g->nW + (r)) * nkv + kv) * hd : k + ((b * T + (r)) * nkv + kv) * hd)
#define VAL(r, w) ((w) ? cv + ((b * g->nW + (r)) * nkv + kv) * hd : v + ((b * T + (r)) * nkv + kv) * hd)
                for (int64_t c = 0; c < nc; c++) {
                    if (!column(g, t, c, &row, &win)) continue;
                    const float *key = KEY(row, win);
                    double s = 0;
                    for (int64_t e = 0; e < hd; e++) s += (double)qt[e] * key[e];
                    pr[c] = s * scale;
                    if (pr[c] > mx) mx = pr[c];
                }
                for (int64_t c = 0; c < nc; c++)
                    if (column(g, t, c, &row, &win)) sum += exp(pr[c] - mx);
                double lse = mx + log(sum);
                o->lse[(b * nh + n) * T + t] = lse;
                for (int64_t c = 0; c < nc; c++) pr[c] = column(g, t, c, &row, &win) ? exp(pr[c] - lse) : 0.0;
                if (o->P) memcpy(o->P + ((b * nh + n) * T + t) * nc, pr, (size_t)nc * sizeof(double));
                double *zt = o->z + ((b * T + t) * nh + n) * hd;
                for (int64_t e = 0; e < hd; e++) zt[e] = 0;
                for (int64_t c = 0; c < nc; c++)
                    if (column(g, t, c, &row, &win))
                        for (int64_t e = 0; e < hd; e++) zt[e] += pr[c] * VAL(row, win)[e];
                if (!dz) continue;
                const float *dzt = dz + ((b * T + t) * nh + n) * hd;
                double Dsum = 0;
                for (int64_t c = 0; c < nc; c++) {
                    dP[c] = 0;
                    if (!column(g, t, c, &row, &win)) continue;
                    for (int64_t e = 0; e < hd; e++) dP[c] += (double)dzt[e] * VAL(row, win)[e];
                    Dsum += pr[c] * dP[c];
                }
                double *dqt = o->dq + ((b * T + t) * nh + n) * hd;
                for (int64_t c = 0; c < nc; c++) {
                    if (!column(g, t, c, &row, &win)) continue;
                    double ds = pr[c] * (dP[c] - Dsum) * scale;
                    double *dkey = win ? o->dck + ((b * g->nW + row) * nkv + kv) * hd : o->dk + ((b * T + row) * nkv + kv) * hd;
                    double *dval = win ? o->dcv + ((b * g->nW + row) * nkv + kv) * hd : o->dv + ((b * T + row) * nkv + kv) * hd;
                    for (int64_t e = 0; e < hd; e++) {
                        dqt[e] += ds * KEY(row, win)[e];
                        dkey[e] += ds * qt[e];
                        dval[e] += pr[c] * dzt[e];
                    }
                }
#undef KEY
#undef VAL
            }
        }
    free(P), free(dP);
}

/* Σ z·R of the reference forward (the loss of the finite-difference check). */
static double ref_loss(const ps_attn_geom *g, const float *q, const float *k, const float *v, const float *ck,
                       const float *cv, const float *R) {
    int64_t nq = g->B * g->T * g->nh * g->hd;
    ref_out o = {.z = zerod(nq), .lse = zerod(g->B * g->nh * g->T)};
    ref_attention(g, q, k, v, ck, cv, NULL, &o);
    double L = 0;
    for (int64_t i = 0; i < nq; i++) L += o.z[i] * R[i];
    free(o.z), free(o.lse);
    return L;
}

/* ---- the kernels' inputs and outputs for one geometry ---- */

typedef struct {
    ps_attn_geom g;
    int64_t nq, nk, nc, nl;
    float *q, *k, *v, *ck, *cv, *dz;
    float *z, *lse, *dq, *dk, *dv, *dck, *dcv;
    float *dk0, *dv0, *dck0, *dcv0; /* the gradients' starting values (the kernel adds to them) */
} attn_case;

static void case_init(attn_case *a, const geo *gg) {
    memset(a, 0, sizeof *a);
    a->g = to_geom(gg);
    const ps_attn_geom *g = &a->g;
    a->nq = g->B * g->T * g->nh * g->hd, a->nk = g->B * g->T * g->nkv * g->hd;
    a->nc = g->B * g->nW * g->nkv * g->hd, a->nl = g->B * g->nh * g->T;
    a->q = randv(a->nq, 1), a->k = randv(a->nk, 1), a->v = randv(a->nk, 1);
    a->ck = randv(a->nc, 1), a->cv = randv(a->nc, 1), a->dz = randv(a->nq, 1);
    a->dk0 = randv(a->nk, 1), a->dv0 = randv(a->nk, 1), a->dck0 = randv(a->nc, 1), a->dcv0 = randv(a->nc, 1);
    a->z = randv(a->nq, 1), a->lse = randv(a->nl, 1), a->dq = randv(a->nq, 1); /* garbage: written with = */
    a->dk = malloc((size_t)(a->nk ? a->nk : 1) * 4), a->dv = malloc((size_t)(a->nk ? a->nk : 1) * 4);
    a->dck = malloc((size_t)(a->nc ? a->nc : 1) * 4), a->dcv = malloc((size_t)(a->nc ? a->nc : 1) * 4);
}

static void case_free(attn_case *a) {
    float *p[] = {a->q, a->k, a->v, a->ck, a->cv, a->dz, a->z, a->lse, a->dq, a->dk, a->dv, a->dck, a->dcv,
                  a->dk0, a->dv0, a->dck0, a->dcv0};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) free(p[i]);
}

/* Fill the context's workspace with NaN: a kernel that reads scratch it did not write poisons its output. */
static void poison_workspace(ps_ctx *c, const ps_attn_geom *g) {
    int64_t n = ps_cpu_attn_workspace(g, omp_get_max_threads(), 1);
    float *ws = ps_ctx_workspace(c, n);
    for (int64_t i = 0; ws && i < c->ws_floats; i++) ws[i] = NAN;
}

/* Forward then backward (gradients start from dk0, ...). Returns 0, or -1 with the context's message. */
static int case_run(ps_ctx *c, attn_case *a, const float *dz) {
    memcpy(a->dk, a->dk0, (size_t)a->nk * 4), memcpy(a->dv, a->dv0, (size_t)a->nk * 4);
    if (a->nc) memcpy(a->dck, a->dck0, (size_t)a->nc * 4), memcpy(a->dcv, a->dcv0, (size_t)a->nc * 4);
    poison_workspace(c, &a->g);
    if (ps_cpu_attn_forward(c, a->z, a->lse, a->q, a->k, a->v, a->ck, a->cv, &a->g)) return -1;
    poison_workspace(c, &a->g);
    return ps_cpu_attn_backward(c, a->dq, a->dk, a->dv, a->dck, a->dcv, dz, a->z, a->lse, a->q, a->k, a->v, a->ck,
                                a->cv, &a->g);
}

/* ---- against the reference ---- */

static void test_case(ps_ctx *c, const char *name, geo gg) {
    attn_case a;
    case_init(&a, &gg);
    const ps_attn_geom *g = &a.g;
    ref_out r = {.z = zerod(a.nq), .lse = zerod(a.nl), .dq = zerod(a.nq), .dk = zerod(a.nk), .dv = zerod(a.nk),
                 .dck = zerod(a.nc), .dcv = zerod(a.nc)};
    for (int64_t i = 0; i < a.nk; i++) r.dk[i] = a.dk0[i], r.dv[i] = a.dv0[i];
    for (int64_t i = 0; i < a.nc; i++) r.dck[i] = a.dck0[i], r.dcv[i] = a.dcv0[i];
    ref_attention(g, a.q, a.k, a.v, a.ck, a.cv, a.dz, &r);
    int rc = case_run(c, &a, a.dz);
    CHECK(rc == 0, "%s: %s", name, c->err.msg);
    ps_ctx_check(c, NULL);
    CHECK(rel_err(a.z, r.z, a.nq) < 1e-5, "%s: z rel. error %.3g", name, rel_err(a.z, r.z, a.nq));
    CHECK(rel_err(a.lse, r.lse, a.nl) < 1e-5, "%s: lse rel. error %.3g", name, rel_err(a.lse, r.lse, a.nl));
    CHECK(rel_err(a.dq, r.dq, a.nq) < 1e-4, "%s: dq rel. error %.3g", name, rel_err(a.dq, r.dq, a.nq));
    CHECK(rel_err(a.dk, r.dk, a.nk) < 1e-4, "%s: dk rel. error %.3g", name, rel_err(a.dk, r.dk, a.nk));
    CHECK(rel_err(a.dv, r.dv, a.nk) < 1e-4, "%s: dv rel. error %.3g", name, rel_err(a.dv, r.dv, a.nk));
    if (a.nc) {
        CHECK(rel_err(a.dck, r.dck, a.nc) < 1e-4, "%s: dck rel. error %.3g", name, rel_err(a.dck, r.dck, a.nc));
        CHECK(rel_err(a.dcv, r.dcv, a.nc) < 1e-4, "%s: dcv rel. error %.3g", name, rel_err(a.dcv, r.dcv, a.nc));
    }
    /* the materialised rows (pattern hooks): the reference probabilities, unseen entries exactly 0 (the
     * matrix starts as NaN), and probs + out give the forward's z bit for bit */
    {
        int64_t np = a.nl * g->ncols;
        float *probs = malloc((size_t)(np ? np : 1) * 4), *z2 = malloc((size_t)(a.nq ? a.nq : 1) * 4);
        for (int64_t i = 0; i < np; i++) probs[i] = NAN;
        r.P = zerod(np);
        ref_attention(g, a.q, a.k, a.v, a.ck, a.cv, NULL, &r);
        CHECK(ps_cpu_attn_probs(c, probs, a.q, a.k, a.ck, g) == 0 && ps_cpu_attn_out(c, z2, probs, a.v, a.cv, g) == 0,
              "%s: %s", name, c->err.msg);
        ps_ctx_check(c, NULL);
        CHECK(rel_err(probs, r.P, np) < 1e-5, "%s: probs rel. error %.3g", name, rel_err(probs, r.P, np));
        int64_t nonzero = 0;
        for (int64_t i = 0; i < np; i++) nonzero += r.P[i] == 0.0 && probs[i] != 0.0f;
        CHECK(nonzero == 0, "%s: %lld unseen entries of probs are not 0", name, (long long)nonzero);
        CHECK(!memcmp(z2, a.z, (size_t)a.nq * 4), "%s: probs + out differ from the forward's z (rel. %.3g)", name,
              rel_err(z2, r.z, a.nq));
        free(probs), free(z2), free(r.P);
    }
    /* the gradients that start at 0 are the kernel's own (the += above could hide a wrong small term) */
    double gd = 0, gr = 0;
    for (int64_t i = 0; i < a.nk; i++) {
        double d = fabs((double)a.dk[i] - a.dk0[i] - (r.dk[i] - a.dk0[i]));
        if (d > gd) gd = d;
        if (fabs(r.dk[i] - a.dk0[i]) > gr) gr = fabs(r.dk[i] - a.dk0[i]);
    }
    CHECK(gd <= 1e-4 * gr + 1e-6, "%s: dk increment error %.3g (scale %.3g)", name, gd, gr);
    free(r.z), free(r.lse), free(r.dq), free(r.dk), free(r.dv), free(r.dck), free(r.dcv);
    case_free(&a);
}

static void test_reference(ps_ctx *c) {
    /* full: several query blocks with a partial last one, GQA 4/2, hd not a multiple of 16 */
    test_case(c, "full B2 T300 nh4/nkv2 hd20", (geo){.B = 2, .T = 300, .nh = 4, .nkv = 2, .hd = 20});
    test_case(c, "full B2 T70 nh2/nkv2 hd7", (geo){.B = 2, .T = 70, .nh = 2, .nkv = 2, .hd = 7});
    test_case(c, "full B1 T128 nh2/nkv1 hd32 (one exact block)", (geo){.B = 1, .T = 128, .nh = 2, .nkv = 1, .hd = 32});
    test_case(c, "full T1", (geo){.B = 2, .T = 1, .nh = 2, .nkv = 2, .hd = 16});
    /* compressed: W/S = 4/4 (T = nW·S and not), 8/4 and 3/2 (overlapping), windows past one block */
    test_case(c, "compressed W4/S4 LW4 B2 T300 nh4/nkv2 hd12",
              (geo){.B = 2, .T = 300, .nh = 4, .nkv = 2, .hd = 12, .W = 4, .S = 4, .local_window = 4, .comp = 1});
    test_case(c, "compressed W4/S4 LW8 B2 T64 nh2/nkv2 hd16",
              (geo){.B = 2, .T = 64, .nh = 2, .nkv = 2, .hd = 16, .W = 4, .S = 4, .local_window = 8, .comp = 1});
    test_case(c, "compressed W8/S4 LW6 B2 T133 nh2/nkv2 hd16",
              (geo){.B = 2, .T = 133, .nh = 2, .nkv = 2, .hd = 16, .W = 8, .S = 4, .local_window = 6, .comp = 1});
    test_case(c, "compressed W3/S2 LW5 B1 T301 nh4/nkv2 hd33 (150 windows)",
              (geo){.B = 1, .T = 301, .nh = 4, .nkv = 2, .hd = 33, .W = 3, .S = 2, .local_window = 5, .comp = 1});
    /* local window longer than the sequence (LW = T), and one window ended by no query but the last */
    test_case(c, "compressed W4/S4 LW200 B2 T70 (LW > T)",
              (geo){.B = 2, .T = 70, .nh = 4, .nkv = 2, .hd = 9, .W = 4, .S = 4, .local_window = 200, .comp = 1});
    test_case(c, "compressed W8/S8 LW8 B2 T8 (one window)",
              (geo){.B = 2, .T = 8, .nh = 2, .nkv = 2, .hd = 16, .W = 8, .S = 8, .local_window = 8, .comp = 1});
    /* no window ended (nW = 0), and T = 1 */
    test_case(c, "compressed W16 LW4 B2 T9 (nW = 0)",
              (geo){.B = 2, .T = 9, .nh = 4, .nkv = 2, .hd = 8, .W = 16, .S = 16, .local_window = 4, .comp = 1});
    test_case(c, "compressed W4/S4 LW8 T1",
              (geo){.B = 2, .T = 1, .nh = 2, .nkv = 2, .hd = 5, .W = 4, .S = 4, .local_window = 8, .comp = 1});
    /* the training shape of deep_w8s8 (hd 8: the band's two-array dot), and T > 4·block, where the backward
     * takes the forward's block of rows instead of its short one */
    test_case(c, "compressed W8/S8 LW8 B2 T72 nh8/nkv8 hd8 (deep_w8s8)",
              (geo){.B = 2, .T = 72, .nh = 8, .nkv = 8, .hd = 8, .W = 8, .S = 8, .local_window = 8, .comp = 1});
    test_case(c, "full B1 T600 nh2/nkv1 hd8 (long blocks)", (geo){.B = 1, .T = 600, .nh = 2, .nkv = 1, .hd = 8});
    test_case(c, "compressed W8/S8 LW8 B1 T700 nh2/nkv2 hd24 (long blocks)",
              (geo){.B = 1, .T = 700, .nh = 2, .nkv = 2, .hd = 24, .W = 8, .S = 8, .local_window = 8, .comp = 1});
}

/* ---- backward against central finite differences of L = Σ z·R ---- */

/* dL/dx[i] by central differences of the double reference forward (the step actually taken in float). */
static double fd_grad(const ps_attn_geom *g, attn_case *a, float *x, int64_t i, const float *R) {
    float x0 = x[i], h = 1e-3f;
    x[i] = x0 + h;
    double up = (double)x[i], lp = ref_loss(g, a->q, a->k, a->v, a->ck, a->cv, R);
    x[i] = x0 - h;
    double dn = (double)x[i], lm = ref_loss(g, a->q, a->k, a->v, a->ck, a->cv, R);
    x[i] = x0;
    return (lp - lm) / (up - dn);
}

static void test_fd_case(ps_ctx *c, const char *name, geo gg) {
    attn_case a;
    case_init(&a, &gg);
    const ps_attn_geom *g = &a.g;
    memset(a.dk0, 0, (size_t)a.nk * 4), memset(a.dv0, 0, (size_t)a.nk * 4);
    if (a.nc) memset(a.dck0, 0, (size_t)a.nc * 4), memset(a.dcv0, 0, (size_t)a.nc * 4);
    float *R = randv(a.nq, 1);
    int rc = case_run(c, &a, R);
    CHECK(rc == 0, "%s: %s", name, c->err.msg);
    ps_ctx_check(c, NULL);
    int64_t T = g->T, nh = g->nh, nkv = g->nkv, hd = g->hd;
    /* entries: q of a row past the first block, k/v of a raw position the local band and later rows
     * see, the first and last window */
    struct {
        const char *what;
        float *x, *grad;
        int64_t i;
    } pts[] = {
        {"q", a.q, a.dq, ((0 * T + T - 3) * nh + 1) * hd + 2},
        {"q", a.q, a.dq, ((1 * T + T / 2) * nh + nh - 1) * hd + hd - 1},
        {"k", a.k, a.dk, ((0 * T + T - 2) * nkv + nkv - 1) * hd + 1},
        {"v", a.v, a.dv, ((1 * T + T - 4) * nkv + 0) * hd + 3},
        {"ck", a.ck, a.dck, ((0 * g->nW + 0) * nkv + 0) * hd + 1},
        {"cv", a.cv, a.dcv, ((1 * g->nW + g->nW - 1) * nkv + nkv - 1) * hd + 2},
    };
    for (size_t p = 0; p < sizeof pts / sizeof pts[0]; p++) {
        if (pts[p].x == a.ck || pts[p].x == a.cv) {
            if (!g->compressed || g->nW == 0) continue;
        }
        double fd = fd_grad(g, &a, pts[p].x, pts[p].i, R), an = pts[p].grad[pts[p].i];
        double err = fabs(fd - an) / fmax(fabs(fd), 1e-2);
        CHECK(err < 1e-4, "%s: d%s[%lld] = %.6g, finite differences %.6g (rel. %.3g)", name, pts[p].what,
              (long long)pts[p].i, an, fd, err);
    }
    free(R);
    case_free(&a);
}

static void test_finite_differences(ps_ctx *c) {
    test_fd_case(c, "fd full B2 T150 nh4/nkv2 hd12", (geo){.B = 2, .T = 150, .nh = 4, .nkv = 2, .hd = 12});
    test_fd_case(c, "fd compressed W8/S4 LW6 B2 T160 nh4/nkv2 hd12",
                 (geo){.B = 2, .T = 160, .nh = 4, .nkv = 2, .hd = 12, .W = 8, .S = 4, .local_window = 6, .comp = 1});
    test_fd_case(c, "fd compressed W3/S2 LW5 B2 T70 nh2/nkv2 hd10",
                 (geo){.B = 2, .T = 70, .nh = 2, .nkv = 2, .hd = 10, .W = 3, .S = 2, .local_window = 5, .comp = 1});
}

/* ---- thread-count independence ---- */

/* Runs: 1 OpenMP thread; 2 threads; 2 threads with the context limited to 1 (ctx->threads). */
static void test_threads_case(ps_ctx *c, const char *name, geo gg) {
    attn_case a[3];
    int saved = omp_get_max_threads();
    for (int t = 0; t < 3; t++) {
        ps_rng_seed(&rng_, 99); /* the same inputs for every run */
        case_init(&a[t], &gg);
        omp_set_num_threads(t == 0 ? 1 : 2);
        c->threads = t == 2 ? 1 : 0;
        CHECK(case_run(c, &a[t], a[t].dz) == 0, "%s: %s", name, c->err.msg);
        ps_ctx_check(c, NULL);
        /* the kernels set BLAS to one thread inside their region only */
        CHECK(omp_get_max_threads() == (t == 0 ? 1 : 2), "%s: the caller's thread count changed to %d", name,
              omp_get_max_threads());
    }
    c->threads = 0;
    omp_set_num_threads(saved);
    static const char *const runs[] = {"", "2 threads", "ctx->threads = 1"};
    for (int t = 1; t < 3; t++) {
        struct {
            const char *what;
            const float *x0, *x1;
            int64_t n;
        } outs[] = {{"z", a[0].z, a[t].z, a[0].nq},       {"lse", a[0].lse, a[t].lse, a[0].nl},
                    {"dq", a[0].dq, a[t].dq, a[0].nq},    {"dk", a[0].dk, a[t].dk, a[0].nk},
                    {"dv", a[0].dv, a[t].dv, a[0].nk},    {"dck", a[0].dck, a[t].dck, a[0].nc},
                    {"dcv", a[0].dcv, a[t].dcv, a[0].nc}};
        for (size_t i = 0; i < sizeof outs / sizeof outs[0]; i++)
            CHECK(!memcmp(outs[i].x0, outs[i].x1, (size_t)outs[i].n * 4), "%s: %s differs between 1 thread and %s",
                  name, outs[i].what, runs[t]);
    }
    for (int t = 0; t < 3; t++) case_free(&a[t]);
}

static void test_threads(ps_ctx *c) {
    test_threads_case(c, "threads full B2 T200 nh4/nkv2", (geo){.B = 2, .T = 200, .nh = 4, .nkv = 2, .hd = 24});
    test_threads_case(c, "threads full B1 T260 nh2/nkv1 (one backward task)",
                      (geo){.B = 1, .T = 260, .nh = 2, .nkv = 1, .hd = 16});
    test_threads_case(c, "threads compressed W8/S4 B2 T300",
                      (geo){.B = 2, .T = 300, .nh = 4, .nkv = 2, .hd = 20, .W = 8, .S = 4, .local_window = 8, .comp = 1});
}

/* ---- memory: O(block × ncols) per thread, never [T, ncols] per head ---- */

static void test_memory(void) {
    ps_error err;
    geo gs[2] = {{.B = 1, .T = 2048, .nh = 4, .nkv = 2, .hd = 16},
                 {.B = 1, .T = 4096, .nh = 4, .nkv = 2, .hd = 16, .W = 8, .S = 8, .local_window = 8, .comp = 1}};
    for (int i = 0; i < 2; i++) {
        ps_ctx *c;
        if (ps_ctx_create(&c, "cpu", &err)) {
            CHECK(0, "context: %s", err.msg);
            return;
        }
        attn_case a;
        case_init(&a, &gs[i]);
        const ps_attn_geom *g = &a.g;
        memset(a.dk0, 0, (size_t)a.nk * 4), memset(a.dv0, 0, (size_t)a.nk * 4);
        if (a.nc) memset(a.dck0, 0, (size_t)a.nc * 4), memset(a.dcv0, 0, (size_t)a.nc * 4);
        CHECK(ps_cpu_attn_forward(c, a.z, a.lse, a.q, a.k, a.v, a.ck, a.cv, g) == 0, "%s", c->err.msg);
        CHECK(ps_cpu_attn_backward(c, a.dq, a.dk, a.dv, a.dck, a.dcv, a.dz, a.z, a.lse, a.q, a.k, a.v, a.ck, a.cv, g) == 0,
              "%s", c->err.msg);
        int64_t want = ps_cpu_attn_workspace(g, omp_get_max_threads(), 1);
        int64_t bound = (int64_t)omp_get_max_threads() * 2 * PS_CPU_ATTN_BLOCK * g->ncols + 64;
        int64_t probs = g->B * g->nh * g->T * g->ncols; /* one probability matrix of the old path */
        CHECK(c->ws_peak == want && want <= bound, "%s: workspace peak %lld floats, expected %lld (bound %lld)",
              g->compressed ? "compressed" : "full", (long long)c->ws_peak, (long long)want, (long long)bound);
        CHECK(c->ws_peak * 4 <= probs, "%s: workspace %lld floats is not below one probability matrix (%lld)",
              g->compressed ? "compressed" : "full", (long long)c->ws_peak, (long long)probs);
        case_free(&a);
        ps_ctx_free(c);
    }
}

/* ---- errors through the context ---- */

static void *null_alloc(ps_ctx *c, int64_t bytes) {
    (void)c, (void)bytes;
    return NULL;
}
static void null_free(ps_ctx *c, void *p) { (void)c, (void)p; }

/* The kernels, with the context's message handed to err (and the context cleared) on failure. */
static int fwd(ps_ctx *c, attn_case *a, const ps_attn_geom *g, ps_error *err) {
    int rc = ps_cpu_attn_forward(c, a->z, a->lse, a->q, a->k, a->v, a->ck, a->cv, g);
    ps_ctx_check(c, err);
    return rc;
}
static int bwd(ps_ctx *c, attn_case *a, const ps_attn_geom *g, ps_error *err) {
    int rc = ps_cpu_attn_backward(c, a->dq, a->dk, a->dv, a->dck, a->dcv, a->dz, a->z, a->lse, a->q, a->k, a->v,
                                  a->ck, a->cv, g);
    ps_ctx_check(c, err);
    return rc;
}

static void test_errors(ps_ctx *c) {
    geo gg = {.B = 1, .T = 20, .nh = 2, .nkv = 2, .hd = 8};
    attn_case a;
    case_init(&a, &gg);
    ps_error err;
    /* query heads not a multiple of the KV heads; columns that do not match the geometry */
    ps_attn_geom bad = a.g;
    bad.nh = 3;
    CHECK_ERR(fwd(c, &a, &bad, &err), &err, "attn_forward", "invalid geometry", "nh=3");
    bad = a.g;
    bad.ncols = 19;
    CHECK_ERR(bwd(c, &a, &bad, &err), &err, "attn_backward", "invalid geometry", "ncols=19");
    /* the workspace cannot be had: -1, the context failed with the message */
    const ps_backend failing = {.name = "failing", .alloc = null_alloc, .free = null_free, .host_visible = 1};
    ps_ctx fc = {.be = &failing};
    CHECK_ERR(fwd(&fc, &a, &a.g, &err), &err, "out of memory", "workspace");
    CHECK_ERR(bwd(&fc, &a, &a.g, &err), &err, "out of memory", "workspace");
    /* a context that already failed: -1 at once, the first message kept */
    ps_ctx_fail(c, "an earlier op failed");
    CHECK_ERR(fwd(c, &a, &a.g, &err), &err, "an earlier op failed");
    /* T = 0: nothing to do */
    ps_attn_geom empty = a.g;
    empty.T = 0, empty.ncols = 0;
    CHECK(fwd(c, &a, &empty, &err) == 0 && bwd(c, &a, &empty, &err) == 0, "T = 0: %s", err.msg);
    case_free(&a);
}

int main(void) {
    ps_rng_seed(&rng_, 11);
    ps_error err;
    ps_ctx *c;
    if (ps_ctx_create(&c, "cpu", &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    test_reference(c);
    test_finite_differences(c);
    test_threads(c);
    test_memory();
    test_errors(c);
    ps_ctx_free(c);
    CHECK_DONE();
}
