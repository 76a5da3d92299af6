/* test_backend_ops.c — every op of the op enums (core/backend.h: ps_op, and the DeepSeek-V4 extension's
 * ps_v4_op) on every backend this build has and can open — cpu-staged always, cuda when built and a device
 * is present — against the CPU reference, at several shapes each. One case per op, in tables indexed by
 * the enums: an op of an enum without a case is a failure (the check cannot pass by forgetting one).
 *
 * A case builds its inputs from a seeded generator (the same numbers on every backend), runs its op, and
 * hands back its outputs; the harness runs it on a "cpu" context and on the backend's and compares every
 * output. cpu-staged runs the CPU's code on buffers declared not host-visible, so its outputs must be the
 * same bits; other backends agree within the case's tolerance (relative to the largest reference value).
 * The window ops run the base grid, a staggered grid of 75 windows (two 64-wide tiles), and content chunks
 * with one and with two tiles of real chunks (T 400); the attention ops full attention, the base grid with
 * 75 windows, a staggered grid and content chunks of two tiles; the KV cache's ops page lists of several
 * pages (raw rows after dropped pages, entries in pages of 5), per-row and blocked attention; the DeepSeek-V4
 * cache's a sliding, an HCA and a CSA layer's piece; the block-sparse selection ops a whole pass of two sequences,
 * one of 70 rows and a prefill chunk, with top-k ties / NaN and attention over blocks a hook might write
 * (test_select_refs also holds the CPU's selection ops to core/select.c's naive references). */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "core/chunks.h"
#include "core/config.h"
#include "core/ctx.h"
#include "core/ops.h"
#include "core/rng.h"
#include "testutil.h"

/* ---------------- the harness: one run of a case on one context ---------------- */

enum { MAX_OUT = 12, MAX_BUF = 160 };
typedef struct {
    ps_ctx *c;
    uint64_t seed; /* next input's seed: the same sequence on every backend */
    int n_out;
    struct {
        char name[40];
        double *v;
        int64_t n;
    } out[MAX_OUT];
    void *buf[MAX_BUF];
    int n_buf;
} run_t;

static run_t R; /* the run in progress */

static void *alloc_(int64_t bytes) {
    ps_error err;
    void *p = ps_buf_alloc(R.c, bytes > 0 ? bytes : 4, "test_backend_ops input", &err);
    if (!p) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
    if (R.n_buf < MAX_BUF) R.buf[R.n_buf++] = p;
    return p;
}

/* n floats of the context from host values (host NULL: zeros) */
static float *UP(const float *h, int64_t n) {
    float *d = alloc_(n * 4);
    ps_error err;
    if (h && n > 0 && ps_buf_from_host(R.c, d, h, n * 4, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
    return d;
}

/* random normals times scale (host), the next seed of the run */
static float *host_rnd(int64_t n, float scale) {
    float *h = malloc((size_t)(n > 0 ? n : 1) * 4);
    ps_rng r;
    ps_rng_seed(&r, 1000 + R.seed++);
    for (int64_t i = 0; i < n; i++) h[i] = (float)(ps_rng_normal(&r) * scale);
    return h;
}

static float *IN(int64_t n, float scale) {
    float *h = host_rnd(n, scale), *d = UP(h, n);
    free(h);
    return d;
}
static float *ZERO(int64_t n) { return UP(NULL, n); }

/* n doubles of the context from host values */
static double *UPD(const double *h, int64_t n) {
    double *d = alloc_(n * 8);
    ps_error err;
    if (n > 0 && ps_buf_from_host(R.c, d, h, n * 8, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
    return d;
}

static double *out_slot(const char *name, int64_t n) {
    if (R.n_out >= MAX_OUT) {
        fprintf(stderr, "too many outputs\n");
        exit(1);
    }
    snprintf(R.out[R.n_out].name, sizeof R.out[0].name, "%s", name);
    R.out[R.n_out].n = n;
    return R.out[R.n_out++].v = calloc((size_t)(n > 0 ? n : 1), sizeof(double));
}

/* an output: n floats of the context */
static void OUT(const char *name, const float *d, int64_t n) {
    double *v = out_slot(name, n);
    float *h = malloc((size_t)(n > 0 ? n : 1) * 4);
    ps_error err;
    if (n > 0 && ps_buf_to_host(R.c, h, d, n * 4, &err)) memset(h, 0, (size_t)n * 4);
    for (int64_t i = 0; i < n; i++) v[i] = h[i];
    free(h);
}
/* an output: n doubles of the context, or host values */
static void OUTD(const char *name, const double *d, int64_t n) {
    double *v = out_slot(name, n);
    ps_error err;
    if (n > 0 && ps_buf_to_host(R.c, v, d, n * 8, &err)) memset(v, 0, (size_t)n * 8);
}
static void OUTH(const char *name, const double *h, int64_t n) { memcpy(out_slot(name, n), h, (size_t)n * 8); }

static void run_free(run_t *r) {
    for (int i = 0; i < r->n_out; i++) free(r->out[i].v);
    for (int i = 0; i < r->n_buf; i++) ps_buf_free(r->c, r->buf[i], 0);
    memset(r, 0, sizeof *r);
}

/* ---------------- shapes: window tables and attention geometries ---------------- */

/* content chunks of B random sequences from the real chunker (W, S, chunk_min m); returns the largest
 * count of real chunks of a sequence; cs/cl/cend [B, nC] */
static int64_t chunker(int64_t B, int64_t T, int64_t W, int64_t S, int64_t m, int64_t *nC, int64_t **cs, int64_t **cl,
                       int64_t **cend) {
    ps_config c = tu_config(PS_ATTN_COMPRESSED);
    c.window = W, c.stride = S, c.local_window = W, c.boundaries = PS_BOUNDARIES_CONTENT, c.chunk_min = m;
    *nC = ps_config_n_windows(&c, T);
    *cs = calloc((size_t)(B * *nC + 1), 8), *cl = calloc((size_t)(B * *nC + 1), 8), *cend = calloc((size_t)(B * *nC + 1), 8);
    int32_t *tok = malloc((size_t)T * 4);
    int64_t most = 0;
    for (int64_t b = 0; b < B; b++) {
        tu_random_tokens(tok, T, 11, 300 + (uint64_t)b);
        int64_t k = ps_content_chunks(&c, tok, T, *nC, *cs + b * *nC, *cl + b * *nC);
        for (int64_t j = 0; j < *nC; j++) (*cend)[b * *nC + j] = j < k ? (*cs)[b * *nC + j] + (*cl)[b * *nC + j] - 1 : INT64_MAX;
        most = k > most ? k : most;
    }
    free(tok);
    return most;
}

/* window table shape s: base grid W5/S3 (overlapping); staggered grid W8/S8 T 600 (75 windows, two tiles);
 * content chunks T 150 (one tile); content chunks T 400 (two tiles); base grid W8/S8 T 600 (two tiles) */
enum { N_WIN_SHAPES = 5 };
typedef struct {
    ps_windows w;
    int64_t d, hd, tab[2 * 2 * 200 * 4];
    const char *label;
} win_shape;

static int win_make(int s, win_shape *ws) {
    static const int64_t woff[2] = {3, 5};
    memset(ws, 0, sizeof *ws);
    ws->d = 12, ws->hd = 8;
    if (s == 0 || s == 4) {
        int64_t B = s ? 1 : 2, T = s ? 600 : 37, W = s ? 8 : 5, S = s ? 8 : 3, nW = (T - W) / S + 1;
        ws->w = ps_windows_grid(ws->tab, ws->tab + B * nW, B, T, nW, W, S, 2, NULL);
        ws->label = s ? "base grid W8/S8 T600 (75 windows)" : "base grid W5/S3 T37";
        return 1;
    }
    if (s == 1) {
        int64_t B = 1, T = 600, W = 8, S = 8, nW = (T - W) / S + 1;
        ws->w = ps_windows_grid(ws->tab, ws->tab + B * nW * 2, B, T, nW, W, S, 2, woff);
        ws->label = "staggered W8/S8 T600 (75 windows)";
        return 1;
    }
    if (s == 2 || s == 3) {
        int64_t B = s == 2 ? 2 : 1, T = s == 2 ? 150 : 400, nC, *cs, *cl, *cend;
        int64_t real = chunker(B, T, 8, 4, 2, &nC, &cs, &cl, &cend);
        if (s == 3) CHECK(real > 64, "content chunks T400: %lld real chunks, not two 64-wide tiles", (long long)real);
        ws->w = ps_windows_chunks(ws->tab, ws->tab + B * nC, cs, cl, B, T, nC, 8, 2);
        ws->label = s == 2 ? "content chunks T150" : "content chunks T400 (two tiles)";
        free(cs), free(cl), free(cend);
        return 1;
    }
    return 0;
}

/* attention shape s: full; W4/S4; base grid W8/S8 T600 (75 windows); staggered W6/S3; content chunks T400 */
enum { N_ATTN_SHAPES = 5 };
typedef struct {
    ps_attn_geom g;
    int64_t woff[4], *cend;
} attn_shape;

static ps_attn_geom geom(int64_t B, int64_t T, int64_t nh, int64_t nkv, int64_t hd, int comp, int64_t W, int64_t S, int64_t LW) {
    ps_attn_geom g = {.B = B, .T = T, .nh = nh, .nkv = nkv, .hd = hd, .compressed = comp};
    if (comp) {
        g.W = W, g.S = S, g.LW = LW < T ? LW : T;
        g.nW = T >= W ? (T - W) / S + 1 : 0;
        g.ncols = g.nW + g.LW;
    } else
        g.ncols = T;
    return g;
}

static int attn_make(int s, attn_shape *as) {
    memset(as, 0, sizeof *as);
    if (s == 0) as->g = geom(2, 70, 4, 2, 16, 0, 0, 0, 0);
    else if (s == 1) as->g = geom(2, 70, 4, 2, 16, 1, 4, 4, 4);
    else if (s == 2) as->g = geom(1, 600, 2, 1, 16, 1, 8, 8, 8);
    else if (s == 3) {
        as->g = geom(2, 75, 4, 2, 8, 1, 6, 3, 5);
        as->woff[0] = 0, as->woff[1] = 1, as->woff[2] = 2, as->woff[3] = 0;
        as->g.woff = as->woff;
    } else if (s == 4) {
        int64_t nC, *cs, *cl;
        int64_t real = chunker(1, 400, 8, 4, 2, &nC, &cs, &cl, &as->cend);
        CHECK(real > 64, "attention content chunks T400: %lld real chunks", (long long)real);
        as->g = geom(1, 400, 4, 2, 8, 1, 8, 4, 6);
        as->g.nW = nC, as->g.ncols = nC + as->g.LW, as->g.cend = as->cend;
        free(cs), free(cl);
    } else
        return 0;
    return 1;
}

/* ---------------- the core ops ---------------- */

typedef int (*case_fn)(int s); /* runs shape s into R; 0: no such shape */

static int c_matmul(int s) {
    int64_t M = s ? 130 : 7, K = s ? 96 : 5, N = s ? 70 : 3;
    if (s > 1) return 0;
    float *out = IN(M * N, 1), *inp = IN(M * K, 1), *w = IN(N * K, 1);
    ps_matmul(R.c, out, inp, w, M, K, N, s);
    OUT("out", out, M * N);
    return 1;
}
static int c_embed(int s) {
    if (s > 1) return 0;
    int64_t n = s ? 300 : 5, C = s ? 48 : 4, V = 17;
    int32_t tok[300];
    tu_random_tokens(tok, n, V, 7);
    float *out = ZERO(n * C), *t = IN(V * C, 1);
    ps_embed(R.c, out, tok, t, n, C);
    OUT("out", out, n * C);
    return 1;
}
static int c_rmsnorm(int s) {
    if (s > 1) return 0;
    int64_t n = s ? 200 : 3, C = s ? 96 : 8;
    float *out = ZERO(n * C), *rstd = ZERO(n), *x = IN(n * C, 2), *w = IN(C, 1);
    ps_rmsnorm(R.c, out, rstd, x, w, n, C, 1e-6f);
    OUT("out", out, n * C), OUT("rstd", rstd, n);
    return 1;
}
static int c_rope_table(int s) {
    if (s > 1) return 0;
    int64_t n = s ? 600 : 9, hd = s ? 64 : 8;
    float *ct = ZERO(n * hd / 2), *st = ZERO(n * hd / 2);
    ps_rope_table(R.c, ct, st, n, hd, s ? 1e6 : 1e4);
    OUT("cos", ct, n * hd / 2), OUT("sin", st, n * hd / 2);
    return 1;
}
static int rope_case(int s, int backward) {
    if (s > 1) return 0;
    int64_t ns = 2, rps = s ? 50 : 6, nh = 3, hd = 16, step = s ? 3 : 1, np = rps * step;
    float *ct = ZERO(np * hd / 2), *st = ZERO(np * hd / 2), *x = IN(ns * rps * nh * hd, 1);
    ps_rope_table(R.c, ct, st, np, hd, 1e4);
    if (backward) ps_rope_backward(R.c, x, ct, st, ns, rps, nh, hd, step);
    else ps_rope(R.c, x, ct, st, ns, rps, nh, hd, step);
    OUT("x", x, ns * rps * nh * hd);
    return 1;
}
static int c_rope(int s) { return rope_case(s, 0); }
static int c_rope_backward(int s) { return rope_case(s, 1); }
static int c_swiglu(int s) {
    if (s > 1) return 0;
    int64_t n = s ? 70000 : 9;
    float *h = ZERO(n), *g = IN(n, 3), *u = IN(n, 1);
    ps_swiglu(R.c, h, g, u, n);
    OUT("h", h, n);
    return 1;
}
static int c_add(int s) {
    if (s > 1) return 0;
    int64_t n = s ? 70000 : 9;
    float *o = ZERO(n), *a = IN(n, 1), *b = IN(n, 1);
    ps_add(R.c, o, a, b, n);
    OUT("out", o, n);
    return 1;
}
static int c_copy(int s) {
    if (s > 1) return 0;
    int64_t n = s ? 70000 : 9;
    float *o = ZERO(n), *a = IN(n, 1);
    ps_copy(R.c, o, a, n);
    OUT("dst", o, n);
    return 1;
}
static int c_fill(int s) {
    if (s > 1) return 0;
    int64_t n = s ? 70000 : 9;
    float *o = IN(n, 1);
    ps_fill(R.c, o, s ? -2.5f : 0.0f, n);
    OUT("x", o, n);
    return 1;
}

/* the window ops: every window-table shape */
static int c_gate(int s) {
    win_shape ws;
    if (!win_make(s, &ws)) return 0;
    const ps_windows *w = &ws.w;
    int64_t n = w->B * w->nW * w->nkv * w->W, d = ws.d;
    float *a = IN(w->B * w->T * d, 1), *u = IN(w->W * w->nkv * d, 0.3f), *b = IN(w->W * w->nkv, 0.3f);
    float *z = IN(n, 1), *al = IN(n, 1), *z2 = IN(n, 1), *al2 = IN(n, 1);
    ps_gate(R.c, z, al, a, u, b, d, w);
    ps_gate(R.c, z2, al2, a, NULL, NULL, d, w);
    OUT("z", z, n), OUT("alpha", al, n), OUT("z (uniform)", z2, n), OUT("alpha (uniform)", al2, n);
    return 1;
}
static int c_gate_backward(int s) {
    win_shape ws;
    if (!win_make(s, &ws)) return 0;
    const ps_windows *w = &ws.w;
    int64_t n = w->B * w->nW * w->nkv * w->W, d = ws.d;
    float *a = IN(w->B * w->T * d, 1), *u = IN(w->W * w->nkv * d, 0.3f), *b = IN(w->W * w->nkv, 0.3f);
    float *z = ZERO(n), *al = ZERO(n), *dal = IN(n, 1), *da = IN(w->B * w->T * d, 1), *du = IN(w->W * w->nkv * d, 1),
          *db = IN(w->W * w->nkv, 1);
    ps_gate(R.c, z, al, a, u, b, d, w);
    ps_gate_backward(R.c, da, du, db, dal, al, a, u, d, w);
    OUT("da", da, w->B * w->T * d), OUT("du", du, w->W * w->nkv * d), OUT("dbias", db, w->W * w->nkv), OUT("dz", dal, n);
    return 1;
}
static int payload_case(int s, int backward) {
    win_shape ws;
    if (!win_make(s / 2, &ws)) return 0;
    int shared = s % 2;
    const ps_windows *w = &ws.w;
    int64_t d = ws.d, hd = ws.hd, nk = w->nkv * hd, nP = w->B * w->nW * w->W * nk, nC = shared ? nk * d : w->W * nk * d;
    float *a = IN(w->B * w->T * d, 1), *C = IN(nC, 0.3f), *P = IN(nP, 1), *scr = ZERO(w->B * w->T * nk);
    if (!backward) {
        ps_payload(R.c, P, a, C, shared, scr, d, hd, w);
        OUT("P", P, nP);
        return 1;
    }
    float *dP = IN(nP, 1), *da = IN(w->B * w->T * d, 1), *dC = IN(nC, 1);
    ps_payload_backward(R.c, da, dC, dP, a, C, shared, scr, d, hd, w);
    OUT("da", da, w->B * w->T * d), OUT("dC", dC, nC);
    return 1;
}
static int c_payload(int s) { return payload_case(s, 0); }
static int c_payload_backward(int s) { return payload_case(s, 1); }
static int c_rope_windows(int s) {
    win_shape ws;
    if (!win_make(s / 2, &ws)) return 0;
    const ps_windows *w = &ws.w;
    int64_t hd = ws.hd, n = w->B * w->nW * w->nkv * hd;
    float *ct = ZERO(w->T * hd / 2), *st = ZERO(w->T * hd / 2), *x = IN(n, 1);
    ps_rope_table(R.c, ct, st, w->T, hd, 1e4);
    ps_rope_windows(R.c, x, ct, st, hd, w, s % 2);
    OUT("x", x, n);
    return 1;
}
static int pool_case(int s, int backward) {
    if (s > 1) return 0;
    int64_t B = 2, nW = s ? 70 : 3, W = s ? 8 : 4, nkv = 2, hd = 8, n = B * nW * nkv;
    float *al = IN(n * W, 1), *P = IN(B * nW * W * nkv * hd, 1);
    if (!backward) {
        float *o = ZERO(n * hd);
        ps_pool(R.c, o, al, P, B, nW, W, nkv, hd);
        OUT("out", o, n * hd);
        return 1;
    }
    float *dal = IN(n * W, 1), *dP = IN(B * nW * W * nkv * hd, 1), *dout = IN(n * hd, 1);
    ps_pool_backward(R.c, dal, dP, dout, al, P, B, nW, W, nkv, hd);
    OUT("dalpha", dal, n * W), OUT("dP", dP, B * nW * W * nkv * hd);
    return 1;
}
static int c_pool(int s) { return pool_case(s, 0); }
static int c_pool_backward(int s) { return pool_case(s, 1); }
static int c_gate_entropy(int s) {
    win_shape ws;
    if (!win_make(s, &ws)) return 0;
    const ps_windows *w = &ws.w;
    int64_t n = w->B * w->nW * w->nkv * w->W, d = ws.d;
    float *a = IN(w->B * w->T * d, 1), *u = IN(w->W * w->nkv * d, 0.3f), *b = IN(w->W * w->nkv, 0.3f);
    float *z = ZERO(n), *al = ZERO(n), *dal = IN(n, 1);
    ps_gate(R.c, z, al, a, u, b, d, w); /* absent windows: alpha rows of 0, which the regulariser skips */
    double v = 0.25;
    ps_gate_entropy(R.c, &v, dal, al, w->B, w->nW, w->nkv, w->W, 0.3);
    OUTH("value", &v, 1), OUT("dalpha", dal, n);
    return 1;
}

/* the attention ops: every attention shape */
typedef struct {
    attn_shape as;
    float *q, *k, *v, *ck, *cv;
    int64_t nq, nk, nc;
} attn_in;

static int attn_inputs(int s, attn_in *ai) {
    if (!attn_make(s, &ai->as)) return 0;
    const ps_attn_geom *g = &ai->as.g;
    ai->nq = g->B * g->T * g->nh * g->hd, ai->nk = g->B * g->T * g->nkv * g->hd, ai->nc = g->B * g->nW * g->nkv * g->hd;
    ai->q = IN(ai->nq, 1), ai->k = IN(ai->nk, 1), ai->v = IN(ai->nk, 1);
    ai->ck = g->compressed ? IN(ai->nc, 1) : NULL, ai->cv = g->compressed ? IN(ai->nc, 1) : NULL;
    return 1;
}
static void attn_done(attn_in *ai) { free(ai->as.cend); }

static int c_attn_forward(int s) {
    attn_in ai;
    if (!attn_inputs(s, &ai)) return 0;
    const ps_attn_geom *g = &ai.as.g;
    float *z = ZERO(ai.nq), *lse = ZERO(g->B * g->nh * g->T);
    ps_attn_forward(R.c, z, lse, ai.q, ai.k, ai.v, ai.ck, ai.cv, g);
    OUT("z", z, ai.nq), OUT("lse", lse, g->B * g->nh * g->T);
    attn_done(&ai);
    return 1;
}
static int c_attn_probs(int s) {
    attn_in ai;
    if (!attn_inputs(s, &ai)) return 0;
    const ps_attn_geom *g = &ai.as.g;
    int64_t np = g->B * g->nh * g->T * g->ncols;
    float *p = ZERO(np);
    ps_attn_probs(R.c, p, ai.q, ai.k, ai.ck, g);
    OUT("probs", p, np);
    attn_done(&ai);
    return 1;
}
static int c_attn_out(int s) {
    attn_in ai;
    if (!attn_inputs(s, &ai)) return 0;
    const ps_attn_geom *g = &ai.as.g;
    int64_t np = g->B * g->nh * g->T * g->ncols;
    float *p = ZERO(np), *z = ZERO(ai.nq);
    ps_attn_probs(R.c, p, ai.q, ai.k, ai.ck, g);
    ps_attn_out(R.c, z, p, ai.v, ai.cv, g);
    OUT("z", z, ai.nq);
    attn_done(&ai);
    return 1;
}
static int c_attn_rows(int s) {
    attn_in ai;
    if (!attn_inputs(s, &ai)) return 0;
    const ps_attn_geom *g = &ai.as.g;
    int64_t rows[5] = {0, g->T - 1, g->B * g->T - 1, g->T / 2, g->B * g->T / 3}, n = 5;
    float *z = ZERO(n * g->nh * g->hd);
    ps_attn_rows(R.c, z, rows, n, ai.q, ai.k, ai.v, ai.ck, ai.cv, g);
    OUT("z_rows", z, n * g->nh * g->hd);
    attn_done(&ai);
    return 1;
}
static int pattern_case(int s, int compact) {
    attn_in ai;
    if (!attn_inputs(s, &ai)) return 0;
    const ps_attn_geom *g = &ai.as.g;
    int64_t np = g->B * g->nh * g->T * g->ncols, nf = g->B * g->nh * g->T * (g->nW + g->T);
    float *p = ZERO(np), *full = ZERO(nf);
    ps_attn_probs(R.c, p, ai.q, ai.k, ai.ck, g);
    ps_pattern_expand(R.c, full, p, g);
    if (!compact) OUT("full", full, nf);
    else {
        float *p2 = IN(np, 1);
        ps_pattern_compact(R.c, g->compressed ? p2 : full, full, g);
        if (g->compressed) OUT("probs", p2, np);
        else OUT("probs (in place)", full, nf);
    }
    attn_done(&ai);
    return 1;
}
static int c_pattern_expand(int s) { return pattern_case(s, 0); }
static int c_pattern_compact(int s) { return pattern_case(s, 1); }
static int c_attn_backward(int s) {
    attn_in ai;
    if (!attn_inputs(s, &ai)) return 0;
    const ps_attn_geom *g = &ai.as.g;
    float *z = ZERO(ai.nq), *lse = ZERO(g->B * g->nh * g->T), *dz = IN(ai.nq, 1), *dq = ZERO(ai.nq), *dk = IN(ai.nk, 1),
          *dv = IN(ai.nk, 1), *dck = g->compressed ? IN(ai.nc, 1) : NULL, *dcv = g->compressed ? IN(ai.nc, 1) : NULL;
    ps_attn_forward(R.c, z, lse, ai.q, ai.k, ai.v, ai.ck, ai.cv, g);
    ps_attn_backward(R.c, dq, dk, dv, dck, dcv, dz, z, lse, ai.q, ai.k, ai.v, ai.ck, ai.cv, g);
    OUT("dq", dq, ai.nq), OUT("dk", dk, ai.nk), OUT("dv", dv, ai.nk);
    if (g->compressed) OUT("dck", dck, ai.nc), OUT("dcv", dcv, ai.nc);
    attn_done(&ai);
    return 1;
}
static int c_attn_chunk(int s) {
    if (s > 1) return 0;
    int comp = s == 1;
    int64_t nh = 4, nkv = 2, hd = 16, Tq = 16;
    ps_attn_frame f = {.nh = nh, .nkv = nkv, .hd = hd, .compressed = comp, .Tq = Tq};
    if (comp) /* query rows at 48..63, the key frame from 40 (a local window of 8), the 8 windows ended by 63 */
        f.W = 8, f.S = 8, f.LW = 8, f.nW = 8, f.Tk = 24, f.q_off = 8, f.pos0 = 40;
    else /* full attention: every key row up to the query's, rows 40..55 of a frame from 0 */
        f.Tk = 56, f.q_off = 40, f.pos0 = 0;
    float *q = IN(Tq * nh * hd, 1), *k = IN(f.Tk * nkv * hd, 1), *v = IN(f.Tk * nkv * hd, 1);
    float *ck = comp ? IN(f.nW * nkv * hd, 1) : NULL, *cv = comp ? IN(f.nW * nkv * hd, 1) : NULL, *z = ZERO(Tq * nh * hd);
    ps_attn_chunk(R.c, z, q, k, v, ck, cv, &f);
    OUT("z", z, Tq * nh * hd);
    return 1;
}

static int rows_case(int s, int scatter) {
    if (s > 1) return 0;
    int64_t rows[6] = {4, 0, 9, 2, 7, 5}, n = s ? 6 : 3, width = s ? 70 : 5, nr = 10;
    float *in = IN((scatter ? n : nr) * width, 1), *out = IN((scatter ? nr : n) * width, 1);
    if (scatter) ps_scatter_rows(R.c, out, in, rows, n, width);
    else ps_gather_rows(R.c, out, in, s ? IN(n * width, 1) : NULL, rows, n, width);
    OUT("out", out, (scatter ? nr : n) * width);
    return 1;
}
static int c_gather_rows(int s) { return rows_case(s, 0); }
static int c_scatter_rows(int s) { return rows_case(s, 1); }

/* the KV cache's ops: page lists of random rows in buffers of the context, their tables host arrays */

/* rows [base, rows) of width floats in pages of pr rows; tab (host) receives the pages */
static ps_kv_pages pages_in(float **tab, int64_t base, int64_t rows, int64_t width, int64_t pr) {
    int64_t np = (rows - base + pr - 1) / pr;
    for (int64_t i = 0; i < np; i++) tab[i] = IN(pr * width, 1);
    ps_kv_pages p = {.page = tab, .base = base, .rows = rows, .width = width, .page_rows = pr};
    return p;
}

/* full attention per row and blocked; the base grid's entries with a local window, per row and blocked
 * (pages of 5 entries, raw rows from 40 after dropped pages); one KV head of 32 channels (the long dot
 * products), a local window of 1 */
static int c_kv_attend(int s) {
    if (s > 3) return 0;
    static const struct {
        int64_t nh, nkv, hd, LW, t0, nr, kbase, ne;
        int comp, blocked;
    } S[4] = {{4, 2, 8, 0, 37, 5, 0, 0, 0, 0},
              {4, 2, 16, 6, 50, 20, 40, 12, 1, 1},
              {2, 1, 32, 1, 70, 3, 64, 9, 1, 0},
              {2, 2, 8, 0, 0, 17, 0, 0, 0, 1}};
    int64_t nh = S[s].nh, nkv = S[s].nkv, hd = S[s].hd, nr = S[s].nr, t1 = S[s].t0 + nr, ks = nkv * hd;
    float *kt[16], *vt[16], *ct[4][4];
    ps_kv_pages ck[2], cv[2];
    int64_t nvis[64];
    ps_kv_attn a = {.nh = nh, .nkv = nkv, .hd = hd, .compressed = S[s].comp, .LW = S[s].LW, .t0 = S[s].t0, .nr = nr,
                    .blocked = S[s].blocked};
    a.k = pages_in(kt, S[s].kbase, t1, ks, 8);
    a.v = pages_in(vt, S[s].kbase, t1, ks, 8);
    if (S[s].comp) {
        for (int64_t g = 0; g < nkv; g++) ck[g] = pages_in(ct[2 * g], 0, S[s].ne, hd, 5), cv[g] = pages_in(ct[2 * g + 1], 0, S[s].ne, hd, 5);
        for (int64_t i = 0; i < nr; i++) /* entries seen grow with the row, head 1 a step behind */
            for (int64_t g = 0; g < nkv; g++) nvis[i * nkv + g] = (S[s].ne - 1) * (i + 1) / nr + (g == 0);
        a.ck = ck, a.cv = cv, a.nvis = nvis;
    }
    float *q = IN(nr * nh * hd, 1), *z = IN(nr * nh * hd, 1);
    ps_kv_attend(R.c, z, q, &a);
    OUT("z", z, nr * nh * hd);
    return 1;
}

/* windows closing at one position: heads 0 and 2 close (lengths 5 and 3), head 1 not; the layer inputs from
 * row 8 in pages of 8; d 12 and 40 (the long dot products) */
static ps_kv_close close_in(int s, float **tab, int64_t *start, int64_t *len) {
    int64_t st[3] = {12, -1, 20}, ln[3] = {5, 0, 3};
    memcpy(start, st, sizeof st), memcpy(len, ln, sizeof ln);
    ps_kv_close w = {.nkv = 3, .W = 5, .d = s == 1 ? 40 : 12, .start = start, .len = len};
    w.ln = pages_in(tab, 8, 30, w.d, 8);
    return w;
}

static int c_kv_gate(int s) {
    if (s > 2) return 0;
    float *tab[8];
    int64_t st[3], ln[3];
    ps_kv_close w = close_in(s, tab, st, ln);
    float *u = IN(w.W * w.nkv * w.d, 0.3f), *b = IN(w.W * w.nkv, 1), *al = IN(w.nkv * w.W, 1);
    ps_kv_gate(R.c, al, u, b, s != 2, &w);
    OUT("alpha", al, w.nkv * w.W);
    return 1;
}

/* payloads per offset, shared, and given (pre) */
static int c_kv_pool(int s) {
    if (s > 2) return 0;
    float *tab[8];
    int64_t st[3], ln[3], hd = 4;
    ps_kv_close w = close_in(s, tab, st, ln);
    int64_t ks = w.nkv * hd;
    float *al = IN(w.nkv * w.W, 1), *C = IN((s == 1 ? 1 : w.W) * ks * w.d, 0.3f), *pre = s == 2 ? IN(w.W * ks, 1) : NULL,
          *out = IN(ks, 1);
    ps_kv_pool(R.c, out, al, C, s == 1, pre, hd, &w);
    OUT("out", out, ks);
    return 1;
}

static int c_kv_gather(int s) {
    if (s > 1) return 0;
    float *tab[8];
    int64_t rows[5] = {9, 29, 12, 8, 16}, n = s ? 5 : 3, width = s ? 40 : 7;
    ps_kv_pages p = pages_in(tab, 8, 30, width, 8);
    float *out = IN(n * width, 1);
    ps_kv_gather(R.c, out, &p, rows, n);
    OUT("out", out, n * width);
    return 1;
}

/* the channel attention: one K = V head of 8 (per row) or of 32 (a piece of 20 rows), the sliding window's
 * raw rows after dropped pages, entries every 4 tokens in pages of 5, a sink per head */
static int c_kv_attend_sink(int s) {
    if (s > 1) return 0;
    int64_t nh = s ? 3 : 2, hd = s ? 32 : 8, nr = s ? 20 : 3, t0 = s ? 41 : 70, LW = s ? 9 : 5, rate = 4, t1 = t0 + nr;
    float *kt[16], *ct[8];
    int64_t nvis[32];
    ps_kv_attn a = {.nh = nh, .nkv = 1, .hd = hd, .compressed = 1, .LW = LW, .t0 = t0, .nr = nr};
    a.k = pages_in(kt, 32, t1, hd, 8);
    a.v = a.k;
    ps_kv_pages ck = pages_in(ct, 0, t1 / rate, hd, 5);
    for (int64_t i = 0; i < nr; i++) nvis[i] = (t0 + i + 1) / rate;
    a.ck = &ck, a.cv = &ck, a.nvis = nvis;
    float *q = IN(nr * nh * hd, 1), *z = IN(nr * nh * hd, 1), *sink = IN(nh, 1);
    ps_kv_attend_sink(R.c, z, q, sink, &a);
    OUT("z", z, nr * nh * hd);
    return 1;
}

/* the compressor rows (kv, z) of rate 4 from row 8 in pages of 8: HCA window 5, CSA window 5 (two windows'
 * slots) and CSA window 0 (the first window's missing half) */
static ps_kv_chan slots_in(int s, float **tab) {
    ps_kv_chan k = {.hd = 6, .rate = 4, .csa = s > 0, .wi = s == 2 ? 0 : 5};
    k.cw = (k.csa ? 2 : 1) * k.hd;
    k.ln = pages_in(tab, s == 2 ? 0 : 8, 26, 2 * k.cw, 8);
    return k;
}

static int c_kv_slots(int s) {
    if (s > 2) return 0;
    float *tab[8];
    ps_kv_chan k = slots_in(s, tab);
    int64_t SL = (k.csa ? 2 : 1) * k.rate;
    float *ape = IN(k.rate * k.cw, 1), *al = IN(SL * k.hd, 1);
    ps_kv_slots(R.c, al, ape, &k);
    OUT("alpha", al, SL * k.hd);
    return 1;
}

static int c_kv_slot_pool(int s) {
    if (s > 2) return 0;
    float *tab[8];
    ps_kv_chan k = slots_in(s, tab);
    int64_t SL = (k.csa ? 2 : 1) * k.rate;
    float *al = IN(SL * k.hd, 1), *out = IN(k.hd, 1);
    ps_kv_slot_pool(R.c, out, al, &k);
    OUT("out", out, k.hd);
    return 1;
}

/* hook actions */
static int c_head_set(int s) {
    if (s > 2) return 0;
    int64_t ns = 3, np = 9, nh = 4, hd = 8;
    float *x = IN(ns * np * nh * hd, 1), *src = s == 2 ? NULL : IN(np * hd, 1);
    ps_head_set(R.c, x, src, s == 1 ? 0 : hd, ns, np, nh, hd, 2, 1, 3);
    OUT("x", x, ns * np * nh * hd);
    return 1;
}
static int c_add_vector(int s) {
    if (s > 1) return 0;
    int64_t n = s ? 300 : 3, w = s ? 64 : 5;
    float *x = IN(n * w, 1), *v = IN(w, 1);
    ps_add_vector(R.c, x, v, -0.75f, n, w);
    OUT("x", x, n * w);
    return 1;
}
static int c_roll_blocks(int s) {
    if (s > 1) return 0;
    int64_t W = 8, stride = 12, off = s ? 2 : 0, len = s ? 7 : 12, k = s ? -3 : 5;
    float *x = IN(W * stride, 1);
    ps_roll_blocks(R.c, x, W, stride, off, len, k);
    OUT("x", x, W * stride);
    return 1;
}
static int c_copy_blocks(int s) {
    if (s > 2) return 0;
    float *dst = IN(4 * 6 * 10, 1), *src = IN(4 * 6 * 10, 1);
    /* s 0: copy a head's blocks; 1: accumulate a broadcast vector; 2: zero blocks */
    if (s == 0) ps_copy_blocks(R.c, dst, 60, 10, src, 60, 10, 3, 5, 7, 0, 1.0f);
    else if (s == 1) ps_copy_blocks(R.c, dst, 60, 10, src, 0, 0, 4, 6, 10, 1, 0.5f);
    else ps_copy_blocks(R.c, dst + 3, 60, 10, NULL, 0, 0, 2, 6, 4, 0, 1.0f);
    OUT("dst", dst, 4 * 6 * 10);
    return 1;
}
static int c_accumulate_seqs(int s) {
    if (s > 1) return 0;
    int64_t ns = s ? 9 : 2, n = s ? 5000 : 7;
    double *h = malloc((size_t)n * 8);
    for (int64_t i = 0; i < n; i++) h[i] = 0.125 * (double)i;
    double *sum = UPD(h, n);
    free(h);
    float *x = IN(ns * n, 1);
    ps_accumulate_seqs(R.c, sum, x, ns, n);
    OUTD("sum", sum, n);
    return 1;
}
static int c_sum_to_mean(int s) {
    if (s > 1) return 0;
    int64_t n = s ? 5000 : 7;
    double *h = malloc((size_t)n * 8);
    for (int64_t i = 0; i < n; i++) h[i] = 0.37 * (double)i - 3.0;
    double *sum = UPD(h, n);
    free(h);
    float *m = ZERO(n);
    ps_sum_to_mean(R.c, m, sum, s ? 9.0 : 2.0, n);
    OUT("mean", m, n);
    return 1;
}
static int c_delta_dot(int s) {
    if (s > 2) return 0;
    int64_t B = 3, np = 11, nh = 4, X = 16, src_n = s == 1 ? 1 : B;
    double zero[12] = {0};
    double *out = UPD(zero, B * nh);
    float *g = IN(B * np * nh * X, 1), *x = s == 2 ? NULL : IN(B * np * nh * X, 1), *src = IN(src_n * np * nh * X, 1);
    ps_delta_dot(R.c, out, g, x, src, src_n, B, np, nh, X);
    OUTD("out", out, B * nh);
    return 1;
}

/* backward and optimizer */
static int c_matmul_backward(int s) {
    if (s > 2) return 0;
    int64_t M = s ? 130 : 7, K = s ? 96 : 5, N = s ? 70 : 3;
    float *dout = IN(M * N, 1), *inp = IN(M * K, 1), *w = IN(N * K, 1), *di = IN(M * K, 1), *dw = IN(N * K, 1);
    ps_matmul_backward(R.c, di, s == 2 ? NULL : dw, dout, inp, w, M, K, N);
    OUT("dinp", di, M * K);
    if (s != 2) OUT("dw", dw, N * K);
    return 1;
}
static int c_embed_backward(int s) {
    if (s > 1) return 0;
    int64_t n = s ? 300 : 5, C = s ? 48 : 4, V = 17;
    int32_t tok[300];
    tu_random_tokens(tok, n, V, 9);
    float *dt = IN(V * C, 1), *dout = IN(n * C, 1);
    ps_embed_backward(R.c, dt, dout, tok, n, C);
    OUT("dtable", dt, V * C);
    return 1;
}
static int c_rmsnorm_backward(int s) {
    if (s > 1) return 0;
    int64_t n = s ? 200 : 3, C = s ? 96 : 8;
    float *out = ZERO(n * C), *rstd = ZERO(n), *x = IN(n * C, 2), *w = IN(C, 1), *dout = IN(n * C, 1), *di = IN(n * C, 1),
          *dw = IN(C, 1);
    ps_rmsnorm(R.c, out, rstd, x, w, n, C, 1e-6f);
    ps_rmsnorm_backward(R.c, di, dw, dout, x, w, rstd, n, C);
    OUT("dinp", di, n * C), OUT("dweight", dw, C);
    return 1;
}
static int c_swiglu_backward(int s) {
    if (s > 1) return 0;
    int64_t n = s ? 70000 : 9;
    float *dg = ZERO(n), *du = ZERO(n), *dh = IN(n, 1), *g = IN(n, 3), *u = IN(n, 1);
    ps_swiglu_backward(R.c, dg, du, dh, g, u, n);
    OUT("dg", dg, n), OUT("du", du, n);
    return 1;
}
static int c_cross_entropy(int s) {
    if (s > 1) return 0;
    int64_t n = s ? 40 : 3, V = s ? 3001 : 11;
    int32_t tg[40];
    for (int64_t i = 0; i < n; i++) tg[i] = i % 4 == 1 ? -1 : (int32_t)((i * 997) % V);
    float *lg = IN(n * V, 3), *dl = IN(n * V, 1);
    double loss = 0.5;
    int64_t nt = 2;
    ps_cross_entropy(R.c, &loss, &nt, dl, lg, tg, n, V, 0.25f);
    double h[2] = {loss, (double)nt};
    OUTH("loss_sum, n_targets", h, 2), OUT("dlogits", dl, n * V);
    return 1;
}
static int c_sumsq(int s) {
    if (s > 1) return 0;
    int64_t n = s ? 200003 : 9;
    float *x = IN(n, 1);
    double v = 0.0;
    ps_sumsq(R.c, &v, x, n);
    OUTH("sumsq", &v, 1);
    return 1;
}
static int c_adamw(int s) {
    if (s > 1) return 0;
    int64_t n = s ? 5000 : 20;
    ps_adamw_seg segs[2] = {{0, n / 2, 1e-3f, 0.1f}, {n / 2, n - n / 2, 3e-4f, 0.0f}};
    ps_adamw_hyper h = {.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .clip_scale = 0.7f, .inv_bc1 = 1 / 0.19f, .inv_bc2 = 1 / 0.0975f};
    float *w = IN(n, 1), *m1 = IN(n, 0.1f), *m2 = IN(n, 0.1f), *g = IN(n, 1);
    ps_fill(R.c, m2, 0.01f, n); /* second moments are non-negative */
    ps_adamw(R.c, w, m1, m2, g, segs, 2, &h);
    OUT("w", w, n), OUT("m1", m1, n), OUT("m2", m2, n);
    return 1;
}

/* ---------------- the DeepSeek-V4 extension ---------------- */

static int c_v4_rope_table(int s) {
    if (s > 1) return 0;
    int64_t n = s ? 300 : 7, half = 4;
    double inv[4] = {1.0, 0.3, 0.05, 0.001};
    float *ct = ZERO(n * half), *st = ZERO(n * half);
    ps_v4_rope_table(R.c, ct, st, n, half, inv, s ? 1.25f : 1.0f);
    OUT("cos", ct, n * half), OUT("sin", st, n * half);
    return 1;
}
static int c_v4_rope(int s) {
    if (s > 1) return 0;
    int64_t ns = 2, rps = 5, nh = 3, hd = 16, rd = 8, half = 4, step = s ? 3 : 1, np = rps * step;
    double inv[4] = {1.0, 0.3, 0.05, 0.001};
    float *ct = ZERO(np * half), *st = ZERO(np * half), *x = IN(ns * rps * nh * hd, 1);
    ps_v4_rope_table(R.c, ct, st, np, half, inv, 1.25f);
    ps_v4_rope(R.c, x, ct, st, ns, rps, nh, hd, rd, step, s);
    OUT("x", x, ns * rps * nh * hd);
    return 1;
}
static int hc_case(int s, int what) {
    if (s > 1) return 0;
    int head = s == 1 && what == 0;
    int64_t n = 7, N = 4, D = 24, width = head ? N : (2 + N) * N;
    float *mix = IN(n * width, 3), *x = IN(n * N * D, 1), *sc = IN(3, 1), *base = IN(width, 1);
    float *pre = ZERO(n * N), *post = ZERO(n * N), *comb = ZERO(n * N * N);
    ps_v4_hc_weights(R.c, pre, head ? NULL : post, head ? NULL : comb, mix, x, sc, base, n, N, D, head ? 0 : 20, 1e-6f, 1e-6f);
    if (what == 0) {
        OUT("pre", pre, n * N);
        if (!head) OUT("post", post, n * N), OUT("comb", comb, n * N * N);
    } else if (what == 1) {
        float *out = ZERO(n * D);
        ps_v4_hc_collapse(R.c, out, pre, x, n, N, D);
        OUT("out", out, n * D);
    } else {
        float *blk = IN(n * D, 1), *hout = ZERO(n * N * D);
        ps_v4_hc_expand(R.c, hout, post, comb, blk, x, n, N, D);
        OUT("hout", hout, n * N * D);
    }
    return 1;
}
static int c_v4_hc_weights(int s) { return hc_case(s, 0); }
static int c_v4_hc_collapse(int s) { return hc_case(s, 1); }
static int c_v4_hc_expand(int s) { return hc_case(s, 2); }

/* the V4 compressor: shape s = (B, T, m, d, overlap) */
static const int64_t V4C[4][5] = {{2, 16, 4, 8, 0}, {2, 16, 4, 8, 1}, {1, 27, 4, 20, 1}, {2, 3, 4, 5, 1}};
static int v4c_case(int s, int what) {
    if (s > 3) return 0;
    int64_t B = V4C[s][0], T = V4C[s][1], m = V4C[s][2], d = V4C[s][3], ov = V4C[s][4];
    int64_t nW = T / m, S = ov ? 2 * m : m, c = ov ? 2 : 1, ng = B * nW * S * d, nz = B * T * c * d, np = B * nW * d;
    float *z = IN(nz, 2), *ape = IN(m * c * d, 1), *kv = IN(nz, 1), *gate = ZERO(ng), *alpha = ZERO(ng);
    ps_v4_comp_slots(R.c, gate, z, ape, B, T, nW, m, d, (int)ov);
    ps_v4_slot_softmax(R.c, alpha, gate, B * nW, S, d);
    if (what == 0) OUT("gate", gate, ng);
    if (what == 1) OUT("alpha", alpha, ng);
    if (what == 2) {
        float *pool = ZERO(np);
        ps_v4_comp_pool(R.c, pool, alpha, kv, B, T, nW, m, d, (int)ov);
        OUT("pooled", pool, np);
    }
    if (what == 3) {
        float *dg = IN(ng, 1), *dz = IN(nz, 1), *dape = IN(m * c * d, 1);
        ps_v4_comp_slots_backward(R.c, dz, dape, dg, B, T, nW, m, d, (int)ov);
        OUT("dz", dz, nz), OUT("dape", dape, m * c * d);
    }
    if (what == 4) {
        float *dal = IN(ng, 1), *dgt = ZERO(ng);
        ps_v4_slot_softmax_backward(R.c, dgt, dal, alpha, B * nW, S, d);
        OUT("dgate", dgt, ng);
    }
    if (what == 5) {
        float *dp = IN(np, 1), *da = IN(ng, 1), *dk = IN(nz, 1);
        ps_v4_comp_pool_backward(R.c, da, dk, dp, alpha, kv, B, T, nW, m, d, (int)ov);
        OUT("dalpha", da, ng), OUT("dkv", dk, nz);
    }
    return 1;
}
static int c_v4_comp_slots(int s) { return v4c_case(s, 0); }
static int c_v4_slot_softmax(int s) { return v4c_case(s, 1); }
static int c_v4_comp_pool(int s) { return v4c_case(s, 2); }
static int c_v4_comp_slots_backward(int s) { return v4c_case(s, 3); }
static int c_v4_slot_softmax_backward(int s) { return v4c_case(s, 4); }
static int c_v4_comp_pool_backward(int s) { return v4c_case(s, 5); }

static int c_v4_indexer_scores(int s) {
    if (s > 1) return 0;
    int64_t B = 2, T = s ? 70 : 12, nW = T / 2, Hi = 3, Di = 20;
    float *iq = IN(B * T * Hi * Di, 1), *ik = IN(B * nW * Di, 1), *w = IN(B * T * Hi, 1), *sc = ZERO(B * T * nW);
    ps_v4_indexer_scores(R.c, sc, iq, ik, w, B, T, nW, Hi, Di, 0.25f);
    OUT("scores", sc, B * T * nW);
    return 1;
}
static int c_v4_topk(int s) {
    if (s > 3) return 0;
    int64_t B = 2, T = 12, nW = 6, m = s == 1 ? 0 : 2, K = s == 0 ? 3 : s == 1 ? nW : s == 2 ? 2 : 0;
    float *h = host_rnd(B * T * nW, 1), *hb = host_rnd(nW, 1);
    if (s == 2) /* ties: rounded scores and bias */
        for (int64_t i = 0; i < B * T * nW; i++) h[i] = roundf(h[i]), hb[i % nW] = roundf(hb[i % nW]);
    float *sc = UP(h, B * T * nW), *bias = s == 2 ? UP(hb, nW) : NULL, *idx = ZERO(B * T * K), *gap = ZERO(B * T);
    free(h), free(hb);
    ps_v4_topk(R.c, idx, gap, sc, bias, B * T, nW, K, T, m);
    OUT("idx", idx, B * T * K), OUT("gap", gap, B * T);
    return 1;
}
static int c_v4_router_scores(int s) {
    if (s > 1) return 0;
    int64_t n = 9 * 8;
    float *lg = IN(n, 8), *sc = ZERO(n);
    ps_v4_router_scores(R.c, sc, lg, n, s);
    OUT("scores", sc, n);
    return 1;
}
static int c_v4_route_weights(int s) {
    if (s > 1) return 0;
    int64_t n = 9, E = 8, k = 3;
    float ix[27];
    for (int64_t i = 0; i < n * k; i++) ix[i] = (float)((i * 5 + s) % (i % 4 ? E : 2)); /* a repeated expert in some rows */
    float *lg = IN(n * E, 8), *sc = ZERO(n * E), *idx = UP(ix, n * k), *w = ZERO(n * k);
    ps_v4_router_scores(R.c, sc, lg, n * E, s);
    ps_v4_route_weights(R.c, w, sc, idx, n, E, k, 1.5f);
    OUT("weights", w, n * k);
    return 1;
}
static int c_v4_swiglu_clamp(int s) {
    if (s > 1) return 0;
    int64_t n = s ? 70000 : 9;
    float *g = IN(n, 6), *u = IN(n, 6), *h = ZERO(n);
    ps_v4_swiglu_clamp(R.c, h, g, u, n, 3.0f);
    OUT("h", h, n);
    return 1;
}
static int c_v4_scatter_add_rows(int s) {
    if (s > 1) return 0;
    int64_t rows[7] = {4, 1, 4, 0, 2, 1, 4}, n = 7, width = s ? 100 : 33;
    float rw[7] = {0.5f, -1.0f, 2.0f, 0.25f, 1.0f, 3.0f, -0.5f};
    float *in = IN(n * width, 1), *out = IN(5 * width, 1);
    ps_v4_scatter_add_rows(R.c, out, in, rows, rw, n, width);
    OUT("out", out, 5 * width);
    return 1;
}
static int c_v4_grouped_linear(int s) {
    if (s > 1) return 0;
    int64_t M = s ? 30 : 6, G = 4, Kg = 40, Ng = 5;
    float *in = IN(M * G * Kg, 1), *w = IN(G * Ng * Kg, 1), *o = ZERO(M * G * Ng);
    ps_v4_grouped_linear(R.c, o, in, w, M, G, Kg, Ng);
    OUT("out", o, M * G * Ng);
    return 1;
}
static int c_v4_scale(int s) {
    if (s > 1) return 0;
    int64_t n = s ? 70000 : 9;
    float *x = IN(n, 1);
    ps_v4_scale(R.c, x, 0.37f, n);
    OUT("x", x, n);
    return 1;
}

/* V4 attention: s 0 sliding, 1 HCA (every visible entry), 2 CSA (top-k with an empty and an out-of-range
 * slot), 3 HCA over more tokens */
typedef struct {
    ps_v4_attn_geom g;
    float *q, *kv, *ckv, *sink, *topk;
    int64_t no, ns, C;
} v4a_in;
static int v4a_inputs(int s, v4a_in *a) {
    if (s > 3) return 0;
    int type = s == 3 ? 1 : s;
    int64_t B = 2, T = s == 3 ? 90 : 37, H = 4, Dh = 40, W = 8, m = type == 0 ? 0 : type == 1 ? 4 : 2, nW = m ? T / m : 0,
            K = type == 2 ? 5 : 0;
    a->g = (ps_v4_attn_geom){.B = B, .T = T, .H = H, .Dh = Dh, .nW = nW, .K = K, .W = W, .m = m, .scale = 0.16f};
    a->no = B * T * H * Dh, a->ns = B * H * T, a->C = T + nW;
    a->q = IN(a->no, 1), a->kv = IN(B * T * Dh, 1), a->ckv = nW ? IN(B * nW * Dh, 1) : NULL, a->sink = IN(H, 1);
    a->topk = NULL;
    if (K) { /* the selection from top-k of random scores (host, the same on both sides), with two odd slots */
        float *hs = host_rnd(B * T * nW, 1);
        ps_ctx *cpu;
        ps_error err;
        float *tk = calloc((size_t)(B * T * K), 4);
        if (ps_ctx_create(&cpu, "cpu", &err) == 0) {
            ps_v4_topk(cpu, tk, NULL, hs, NULL, B * T, nW, K, T, m);
            ps_ctx_free(cpu);
        }
        tk[K * 20 + 1] = (float)nW, tk[K * 30] = -1.0f;
        a->topk = UP(tk, B * T * K);
        free(hs), free(tk);
    }
    return 1;
}
static int c_v4_attn(int s) {
    v4a_in a;
    if (!v4a_inputs(s, &a)) return 0;
    float *out = ZERO(a.no), *sp = ZERO(a.ns);
    ps_v4_attn(R.c, out, sp, a.q, a.kv, a.ckv, a.topk, a.sink, &a.g);
    OUT("out", out, a.no), OUT("sinkp", sp, a.ns);
    return 1;
}
static int c_v4_attn_bias(int s) {
    v4a_in a;
    if (!v4a_inputs(s, &a)) return 0;
    int64_t nb = a.g.B * a.g.T * a.C;
    float *bias = ZERO(nb);
    ps_v4_attn_bias(R.c, bias, a.topk, &a.g);
    OUT("bias", bias, nb);
    return 1;
}
static int v4a_chain(int s, int upto) {
    v4a_in a;
    if (!v4a_inputs(s, &a)) return 0;
    int64_t nb = a.g.B * a.g.T * a.C, nl = a.g.B * a.g.H * a.g.T * a.C;
    float *bias = ZERO(nb), *lg = ZERO(nl), *sp = ZERO(a.ns), *o = ZERO(a.no);
    ps_v4_attn_bias(R.c, bias, a.topk, &a.g);
    ps_v4_attn_logits(R.c, lg, a.q, a.kv, a.ckv, bias, &a.g);
    if (upto == 0) {
        OUT("logits", lg, nl);
        return 1;
    }
    ps_v4_attn_softmax(R.c, lg, sp, lg, a.sink, &a.g); /* in place, as the runtime calls it */
    if (upto == 1) {
        OUT("pattern", lg, nl), OUT("sinkp", sp, a.ns);
        return 1;
    }
    ps_v4_attn_apply(R.c, o, lg, a.kv, a.ckv, &a.g);
    OUT("out", o, a.no);
    return 1;
}
static int c_v4_attn_logits(int s) { return v4a_chain(s, 0); }
static int c_v4_attn_softmax(int s) { return v4a_chain(s, 1); }
static int c_v4_attn_apply(int s) { return v4a_chain(s, 2); }
static int c_v4_sink_rescale(int s) {
    v4a_in a;
    if (!v4a_inputs(s, &a)) return 0;
    float *out = ZERO(a.no), *sp = ZERO(a.ns), *snew = ZERO(a.ns);
    ps_v4_attn(R.c, out, sp, a.q, a.kv, a.ckv, a.topk, a.sink, &a.g);
    ps_copy(R.c, snew, sp, a.ns);
    ps_v4_scale(R.c, snew, 0.5f, a.ns);
    ps_v4_sink_rescale(R.c, out, sp, snew, &a.g);
    OUT("out", out, a.no);
    return 1;
}
static int c_v4_attn_backward(int s) {
    /* the backward takes every visible entry (no selection): sliding, HCA, HCA over more tokens */
    v4a_in a;
    if (s > 2 || !v4a_inputs(s == 2 ? 3 : s, &a)) return 0;
    int64_t nkv = a.g.B * a.g.T * a.g.Dh, nc = a.g.B * a.g.nW * a.g.Dh;
    float *out = ZERO(a.no), *dout = IN(a.no, 1), *dq = ZERO(a.no), *dkv = IN(nkv, 1), *dckv = nc ? IN(nc, 1) : NULL,
          *dsink = IN(a.g.H, 1);
    ps_v4_attn(R.c, out, NULL, a.q, a.kv, a.ckv, NULL, a.sink, &a.g);
    ps_v4_attn_backward(R.c, dq, dkv, dckv, dsink, dout, out, a.q, a.kv, a.ckv, a.sink, &a.g);
    OUT("dq", dq, a.no), OUT("dkv", dkv, nkv), OUT("dsink", dsink, a.g.H);
    if (nc) OUT("dckv", dckv, nc);
    return 1;
}

/* the DeepSeek-V4 KV cache: a piece of query rows over the raw K = V rows (after dropped pages, pages of 8)
 * and the entries (pages of 5) — a sliding layer (no entries), an HCA layer (every visible entry; a head of 32:
 * the long dot products; 20 rows), a CSA layer (the entries topk lists, with empty slots and an index past
 * the entries held, which reads nothing) */
static int c_v4_kv_attend(int s) {
    if (s > 2) return 0;
    static const struct {
        int64_t H, Dh, W, m, K, t0, n, kbase;
    } S[3] = {{2, 8, 5, 0, 0, 70, 3, 64}, {3, 32, 9, 4, 0, 41, 20, 32}, {2, 16, 6, 4, 3, 50, 6, 40}};
    int64_t H = S[s].H, Dh = S[s].Dh, n = S[s].n, t1 = S[s].t0 + n, K = S[s].K;
    float *kt[16], *et[8], hk[32];
    ps_v4_kv_attn a = {.H = H, .Dh = Dh, .W = S[s].W, .m = S[s].m, .K = K, .t0 = S[s].t0, .n = n,
                       .scale = (float)(1.0 / sqrt((double)Dh))};
    a.kv = pages_in(kt, S[s].kbase, t1, Dh, 8);
    if (a.m > 0) a.nE = t1 / a.m, a.ent = pages_in(et, 0, a.nE, Dh, 5);
    for (int64_t r = 0; r < n * K; r++) { /* row r: entries it sees, then an empty slot, then one past the held */
        int64_t row = r / K, i = r % K, vis = (S[s].t0 + row + 1) / a.m;
        hk[r] = i == 0 ? (float)(vis - 1 - row % 3) : i == 1 ? (row % 2 ? -1.0f : (float)(row % 5)) : (float)(row == 2 ? a.nE : 5 + row % 3);
    }
    float *q = IN(n * H * Dh, 1), *sink = IN(H, 1), *topk = K ? UP(hk, n * K) : NULL, *out = IN(n * H * Dh, 1), *sp = IN(H * n, 1);
    ps_v4_kv_attend(R.c, out, sp, q, topk, sink, &a);
    OUT("out", out, n * H * Dh), OUT("sinkp", sp, H * n);
    return 1;
}

/* a closing window's gates over the compressor rows (slots_in: HCA window 5, CSA window 5, CSA window 0) */
static int c_v4_kv_slots(int s) {
    if (s > 2) return 0;
    float *tab[8];
    ps_kv_chan k = slots_in(s, tab);
    int64_t SL = (k.csa ? 2 : 1) * k.rate;
    float *ape = IN(k.rate * k.cw, 1), *gate = IN(SL * k.hd, 1);
    ps_v4_kv_slots(R.c, gate, ape, &k);
    OUT("gate", gate, SL * k.hd);
    return 1;
}

/* ---------------- block-sparse selection (InfLLM-v2; core/select.h) ---------------- */

/* B, n rows from position pos0, extra blocks scored past the keys (a prefill chunk's nb counts the whole prompt), H,
 * Hkv, D, K, S, block, init, local, topk: a whole pass of two sequences, one of 70 rows (two tiles of 64), and a
 * chunk of 9 rows at 30 with blocks past its keys */
static const int64_t SELC[3][13] = {{2, 40, 0, 0, 4, 2, 8, 4, 2, 8, 1, 1, 2},
                                    {1, 70, 0, 0, 2, 1, 16, 8, 4, 16, 1, 1, 1},
                                    {1, 9, 30, 3, 4, 2, 8, 4, 2, 4, 0, 1, 3}};
static int sel_make(int s, ps_sel_geom *g) {
    if (s >= 3) return 0;
    const int64_t *x = SELC[s];
    ps_select_cfg sc = {.kernel = x[7], .stride = x[8], .block = x[9], .init_blocks = x[10], .local_blocks = x[11], .topk = x[12]};
    int64_t L = x[2] + x[1];
    *g = (ps_sel_geom){.B = x[0], .n = x[1], .pos0 = x[2], .L = L, .H = x[4], .Hkv = x[5], .D = x[6], .sel = sc,
                       .N1 = ps_select_n_windows(L, sc.kernel, sc.stride), .N2 = ps_select_n_windows(L, 4 * sc.kernel, 4 * sc.stride),
                       .nb = ps_select_n_blocks(&sc, L) + x[3]};
    return 1;
}
/* blocks [B, n, Hkv, slots] as a hook might leave them: ids in [-1, nb), repeats and ids past the row's block */
static float *sel_blocks_host(const ps_sel_geom *g) {
    int64_t ns = ps_select_slots(&g->sel), cnt = g->B * g->n * g->Hkv * ns;
    float *h = malloc((size_t)cnt * sizeof(float));
    ps_rng r;
    ps_rng_seed(&r, 1000 + R.seed++);
    for (int64_t i = 0; i < cnt; i++) h[i] = (float)((int64_t)(ps_rng_uniform(&r) * (double)(g->nb + 1)) - 1);
    return h;
}
static int c_select_compress(int s) {
    ps_sel_geom g;
    if (!sel_make(s, &g)) return 0;
    int64_t ks = g.Hkv * g.D, K = g.sel.kernel, S = g.sel.stride;
    float *k = IN(g.B * g.L * ks, 1), *c1 = ZERO(g.B * g.N1 * ks), *c2 = ZERO(g.B * g.N2 * ks);
    ps_select_compress(R.c, c1, k, g.B, g.L, g.Hkv, g.D, K, S);
    ps_select_compress(R.c, c2, k, g.B, g.L, g.Hkv, g.D, 4 * K, 4 * S);
    OUT("k1", c1, g.B * g.N1 * ks), OUT("k2", c2, g.B * g.N2 * ks);
    return 1;
}
static int c_select_scores(int s) {
    ps_sel_geom g;
    if (!sel_make(s, &g)) return 0;
    int64_t ks = g.Hkv * g.D, nP = g.B * g.n * g.Hkv * g.N1;
    float *q = IN(g.B * g.n * g.H * g.D, 1), *k1 = IN(g.B * g.N1 * ks, 1), *k2 = IN(g.B * g.N2 * ks, 1), *P = ZERO(nP);
    ps_select_scores(R.c, P, q, k1, k2, &g);
    OUT("P", P, nP);
    return 1;
}
static int c_select_block_scores(int s) {
    ps_sel_geom g;
    if (!sel_make(s, &g)) return 0;
    int64_t nbs = g.B * g.n * g.Hkv * g.nb;
    float *P = IN(g.B * g.n * g.Hkv * g.N1, 1), *bs = ZERO(nbs);
    ps_select_block_scores(R.c, bs, P, &g);
    OUT("bs", bs, nbs);
    return 1;
}
static int c_select_topk(int s) {
    ps_sel_geom g;
    if (!sel_make(s, &g)) return 0;
    int64_t nbs = g.B * g.n * g.Hkv * g.nb, nbl = g.B * g.n * g.Hkv * ps_select_slots(&g.sel);
    float *h = host_rnd(nbs, 2);
    for (int64_t i = 0; i < nbs; i++) h[i] = i % 7 == 3 ? INFINITY : i % 11 == 5 ? NAN : roundf(h[i]); /* ties, forced, NaN */
    float *bs = UP(h, nbs), *blk = ZERO(nbl);
    free(h);
    ps_select_topk(R.c, blk, bs, &g);
    OUT("blocks", blk, nbl);
    return 1;
}
static int c_select_attn(int s) {
    ps_sel_geom g;
    if (!sel_make(s, &g)) return 0;
    int64_t nq = g.B * g.n * g.H * g.D, nk = g.B * g.L * g.Hkv * g.D, nl = g.B * g.n * g.H;
    float *hb = sel_blocks_host(&g), *blk = UP(hb, g.B * g.n * g.Hkv * ps_select_slots(&g.sel));
    free(hb);
    float *q = IN(nq, 1), *k = IN(nk, 1), *v = IN(nk, 1), *z = ZERO(nq), *lse = ZERO(nl), *zd = ZERO(nq), *lsed = ZERO(nl);
    ps_select_attn(R.c, z, lse, q, k, v, blk, &g);
    ps_select_attn(R.c, zd, lsed, q, k, v, NULL, &g);
    OUT("z", z, nq), OUT("lse", lse, nl), OUT("z dense", zd, nq), OUT("lse dense", lsed, nl);
    return 1;
}
static int c_select_backward(int s) {
    ps_sel_geom g;
    if (!sel_make(s, &g)) return 0;
    int64_t nq = g.B * g.n * g.H * g.D, nk = g.B * g.L * g.Hkv * g.D, nl = g.B * g.n * g.H;
    float *hb = sel_blocks_host(&g), *blk = UP(hb, g.B * g.n * g.Hkv * ps_select_slots(&g.sel));
    free(hb);
    float *q = IN(nq, 1), *k = IN(nk, 1), *v = IN(nk, 1), *dz = IN(nq, 1), *z = ZERO(nq), *lse = ZERO(nl);
    for (int dense = 0; dense < 2; dense++) {
        const float *b = dense ? NULL : blk;
        float *dq = IN(nq, 1), *dk = IN(nk, 1), *dv = IN(nk, 1); /* accumulated into */
        ps_select_attn(R.c, z, lse, q, k, v, b, &g);
        ps_select_backward(R.c, dq, dk, dv, dz, z, lse, q, k, v, b, &g);
        OUT(dense ? "dq dense" : "dq", dq, nq), OUT(dense ? "dk dense" : "dk", dk, nk), OUT(dense ? "dv dense" : "dv", dv, nk);
    }
    return 1;
}

/* The CPU's selection ops (batched, through a "cpu" context) against core/select.c's naive references per sequence:
 * compressed keys, stage-1 scores, block scores and attention within 1e-5 of the largest value (the references in
 * double), top-k exactly (ties, forced blocks, NaN). */
static double sel_ref_diff(const float *got, const double *want, int64_t n) {
    double big = 0, worst = 0;
    for (int64_t i = 0; i < n; i++)
        if (isfinite(want[i])) big = fmax(big, fabs(want[i]));
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(want[i]) || !isfinite(got[i])) {
            if (!((double)got[i] == want[i])) return INFINITY;
            continue;
        }
        worst = fmax(worst, fabs(got[i] - want[i]));
    }
    return big > 0 ? worst / big : worst;
}
static void test_select_refs(void) {
    ps_ctx *c;
    ps_error err;
    REQUIRE_OK(ps_ctx_create(&c, "cpu", &err), &err);
    ps_sel_geom g;
    for (int s = 0; sel_make(s, &g); s++) {
        memset(&R, 0, sizeof R);
        R.c = c;
        int64_t ks = g.Hkv * g.D, K = g.sel.kernel, S = g.sel.stride, ns = ps_select_slots(&g.sel), qs = g.n * g.H * g.D;
        int64_t nq = g.B * qs, nk = g.B * g.L * ks, nP = g.n * g.Hkv * g.N1, nbs = g.n * g.Hkv * g.nb, nbl = g.n * g.Hkv * ns;
        float *q = host_rnd(nq, 1), *k = host_rnd(nk, 1), *v = host_rnd(nk, 1), *k1 = calloc((size_t)(g.B * g.N1 * ks + 1), 4),
              *k2 = calloc((size_t)(g.B * g.N2 * ks + 1), 4), *P = calloc((size_t)(g.B * nP + 1), 4),
              *bs = calloc((size_t)(g.B * nbs + 1), 4), *blk = calloc((size_t)(g.B * nbl + 1), 4), *z = calloc((size_t)nq, 4);
        double *ref = calloc((size_t)(nq + g.B * (nP + nbs + nk) + 1), 8);
        int64_t *iblk = calloc((size_t)(nbl + 1), 8);
        CHECK(!ps_select_compress(c, k1, k, g.B, g.L, g.Hkv, g.D, K, S) &&
                  !ps_select_compress(c, k2, k, g.B, g.L, g.Hkv, g.D, 4 * K, 4 * S) && !ps_select_scores(c, P, q, k1, k2, &g) &&
                  !ps_select_block_scores(c, bs, P, &g) && !ps_select_topk(c, blk, bs, &g),
              "selection ops on the cpu: %s", c->err.msg);
        for (int64_t b = 0; b < g.B; b++) {
            const float *kb = k + b * g.L * ks, *qb = q + b * qs;
            ps_select_compress_ref(ref, kb, g.L, g.Hkv, g.D, K, S);
            CHECK(sel_ref_diff(k1 + b * g.N1 * ks, ref, g.N1 * ks) <= 1e-5, "shape %d seq %lld: select_compress vs its ref", s, (long long)b);
            ps_select_compress_ref(ref, kb, g.L, g.Hkv, g.D, 4 * K, 4 * S);
            CHECK(sel_ref_diff(k2 + b * g.N2 * ks, ref, g.N2 * ks) <= 1e-5, "shape %d seq %lld: level 2 vs its ref", s, (long long)b);
            ps_select_scores_ref(ref, qb, g.n, g.pos0, k1 + b * g.N1 * ks, g.N1, k2 + b * g.N2 * ks, g.N2, g.H, g.Hkv, g.D, K, S);
            double d = sel_ref_diff(P + b * nP, ref, nP);
            CHECK(d <= 1e-5, "shape %d seq %lld: select_scores vs its ref: %.3g", s, (long long)b, d);
            ps_select_block_scores_ref(ref, P + b * nP, g.n, g.pos0, g.N1, g.nb, g.Hkv, &g.sel);
            CHECK(sel_ref_diff(bs + b * nbs, ref, nbs) == 0, "shape %d seq %lld: select_block_scores vs its ref", s, (long long)b);
            ps_select_topk_ref(iblk, bs + b * nbs, g.n, g.pos0, g.nb, g.Hkv, &g.sel);
            int same = 1;
            for (int64_t i = 0; i < nbl; i++) same &= (double)blk[b * nbl + i] == (double)iblk[i];
            CHECK(same, "shape %d seq %lld: select_topk vs its ref", s, (long long)b);
        }
        for (int dense = 0; dense < 2; dense++) {
            const float *bl = dense ? NULL : blk;
            CHECK(!ps_select_attn(c, z, NULL, q, k, v, bl, &g), "select_attn: %s", c->err.msg);
            for (int64_t b = 0; b < g.B; b++) {
                ps_select_attn_ref(ref, q + b * qs, k + b * g.L * ks, v + b * g.L * ks, bl ? bl + b * nbl : NULL, ns, g.n, g.pos0,
                                   g.L, g.sel.block, g.H, g.Hkv, g.D);
                double d = sel_ref_diff(z + b * qs, ref, qs);
                CHECK(d <= 1e-5, "shape %d seq %lld%s: select_attn vs its ref: %.3g", s, (long long)b, dense ? " dense" : "", d);
            }
        }
        free(q), free(k), free(v), free(k1), free(k2), free(P), free(bs), free(blk), free(z), free(ref), free(iblk);
    }
    /* a bad geometry fails in the wrapper, naming the op */
    g.Hkv = 3;
    float x[4] = {0};
    CHECK(ps_select_attn(c, x, NULL, x, x, x, NULL, &g) != 0 && strstr(c->err.msg, "select_attn: bad geometry"), "bad geometry: %s",
          c->err.msg);
    memset(&R, 0, sizeof R);
    ps_ctx_free(c);
}

/* ---------------- the case tables, indexed by the enums ---------------- */

typedef struct {
    case_fn fn;
    double tol; /* relative, for backends other than cpu-staged (which must give the CPU's bits) */
} op_case;

static const op_case CORE[PS_OP_COUNT] = {
    [PS_OP_MATMUL] = {c_matmul, 1e-5},
    [PS_OP_EMBED] = {c_embed, 0},
    [PS_OP_RMSNORM] = {c_rmsnorm, 1e-5},
    [PS_OP_ROPE_TABLE] = {c_rope_table, 1e-6},
    [PS_OP_ROPE] = {c_rope, 1e-5},
    [PS_OP_SWIGLU] = {c_swiglu, 1e-5},
    [PS_OP_ADD] = {c_add, 0},
    [PS_OP_COPY] = {c_copy, 0},
    [PS_OP_FILL] = {c_fill, 0},
    [PS_OP_GATE] = {c_gate, 1e-5},
    [PS_OP_PAYLOAD] = {c_payload, 1e-4},
    [PS_OP_ROPE_WINDOWS] = {c_rope_windows, 1e-5},
    [PS_OP_POOL] = {c_pool, 1e-5},
    [PS_OP_ATTN_FORWARD] = {c_attn_forward, 1e-5},
    [PS_OP_ATTN_PROBS] = {c_attn_probs, 1e-5},
    [PS_OP_ATTN_OUT] = {c_attn_out, 1e-5},
    [PS_OP_ATTN_CHUNK] = {c_attn_chunk, 1e-5},
    [PS_OP_ATTN_ROWS] = {c_attn_rows, 1e-5},
    [PS_OP_PATTERN_EXPAND] = {c_pattern_expand, 1e-5},
    [PS_OP_PATTERN_COMPACT] = {c_pattern_compact, 1e-5},
    [PS_OP_GATHER_ROWS] = {c_gather_rows, 0},
    [PS_OP_SCATTER_ROWS] = {c_scatter_rows, 0},
    [PS_OP_KV_ATTEND] = {c_kv_attend, 1e-5},
    [PS_OP_KV_GATE] = {c_kv_gate, 1e-5},
    [PS_OP_KV_POOL] = {c_kv_pool, 1e-5},
    [PS_OP_KV_GATHER] = {c_kv_gather, 0},
    [PS_OP_KV_ATTEND_SINK] = {c_kv_attend_sink, 1e-5},
    [PS_OP_KV_SLOTS] = {c_kv_slots, 1e-5},
    [PS_OP_KV_SLOT_POOL] = {c_kv_slot_pool, 1e-5},
    [PS_OP_SELECT_COMPRESS] = {c_select_compress, 1e-6},
    [PS_OP_SELECT_SCORES] = {c_select_scores, 1e-5},
    [PS_OP_SELECT_BLOCK_SCORES] = {c_select_block_scores, 0},
    [PS_OP_SELECT_TOPK] = {c_select_topk, 0},
    [PS_OP_SELECT_ATTN] = {c_select_attn, 1e-5},
    [PS_OP_HEAD_SET] = {c_head_set, 0},
    [PS_OP_ADD_VECTOR] = {c_add_vector, 1e-6},
    [PS_OP_ROLL_BLOCKS] = {c_roll_blocks, 0},
    [PS_OP_COPY_BLOCKS] = {c_copy_blocks, 1e-6},
    [PS_OP_ACCUMULATE_SEQS] = {c_accumulate_seqs, 1e-12},
    [PS_OP_SUM_TO_MEAN] = {c_sum_to_mean, 0},
    [PS_OP_DELTA_DOT] = {c_delta_dot, 1e-12},
    [PS_OP_MATMUL_BACKWARD] = {c_matmul_backward, 1e-5},
    [PS_OP_EMBED_BACKWARD] = {c_embed_backward, 1e-6},
    [PS_OP_RMSNORM_BACKWARD] = {c_rmsnorm_backward, 1e-5},
    [PS_OP_ROPE_BACKWARD] = {c_rope_backward, 1e-5},
    [PS_OP_SWIGLU_BACKWARD] = {c_swiglu_backward, 1e-5},
    [PS_OP_GATE_BACKWARD] = {c_gate_backward, 1e-5},
    [PS_OP_PAYLOAD_BACKWARD] = {c_payload_backward, 1e-4},
    [PS_OP_GATE_ENTROPY] = {c_gate_entropy, 1e-5},
    [PS_OP_POOL_BACKWARD] = {c_pool_backward, 1e-5},
    [PS_OP_ATTN_BACKWARD] = {c_attn_backward, 1e-4},
    [PS_OP_SELECT_BACKWARD] = {c_select_backward, 1e-4},
    [PS_OP_CROSS_ENTROPY] = {c_cross_entropy, 1e-5},
    [PS_OP_SUMSQ] = {c_sumsq, 1e-9},
    [PS_OP_ADAMW] = {c_adamw, 1e-5},
};

static const op_case V4[PS_V4_OP_COUNT] = {
    [PS_V4_OP_ROPE_TABLE] = {c_v4_rope_table, 1e-6},
    [PS_V4_OP_ROPE] = {c_v4_rope, 1e-5},
    [PS_V4_OP_HC_WEIGHTS] = {c_v4_hc_weights, 1e-5},
    [PS_V4_OP_HC_COLLAPSE] = {c_v4_hc_collapse, 1e-5},
    [PS_V4_OP_HC_EXPAND] = {c_v4_hc_expand, 1e-5},
    [PS_V4_OP_COMP_SLOTS] = {c_v4_comp_slots, 0},
    [PS_V4_OP_SLOT_SOFTMAX] = {c_v4_slot_softmax, 1e-5},
    [PS_V4_OP_COMP_POOL] = {c_v4_comp_pool, 1e-5},
    [PS_V4_OP_INDEXER_SCORES] = {c_v4_indexer_scores, 1e-5},
    [PS_V4_OP_TOPK] = {c_v4_topk, 0},
    [PS_V4_OP_ROUTER_SCORES] = {c_v4_router_scores, 1e-5},
    [PS_V4_OP_ROUTE_WEIGHTS] = {c_v4_route_weights, 1e-5},
    [PS_V4_OP_SWIGLU_CLAMP] = {c_v4_swiglu_clamp, 1e-5},
    [PS_V4_OP_SCATTER_ADD_ROWS] = {c_v4_scatter_add_rows, 1e-6},
    [PS_V4_OP_ATTN] = {c_v4_attn, 1e-5},
    [PS_V4_OP_ATTN_BIAS] = {c_v4_attn_bias, 0},
    [PS_V4_OP_ATTN_LOGITS] = {c_v4_attn_logits, 1e-5},
    [PS_V4_OP_ATTN_SOFTMAX] = {c_v4_attn_softmax, 1e-5},
    [PS_V4_OP_ATTN_APPLY] = {c_v4_attn_apply, 1e-5},
    [PS_V4_OP_SINK_RESCALE] = {c_v4_sink_rescale, 1e-5},
    [PS_V4_OP_GROUPED_LINEAR] = {c_v4_grouped_linear, 1e-4},
    [PS_V4_OP_SCALE] = {c_v4_scale, 0},
    [PS_V4_OP_COMP_SLOTS_BACKWARD] = {c_v4_comp_slots_backward, 1e-6},
    [PS_V4_OP_SLOT_SOFTMAX_BACKWARD] = {c_v4_slot_softmax_backward, 1e-5},
    [PS_V4_OP_COMP_POOL_BACKWARD] = {c_v4_comp_pool_backward, 1e-5},
    [PS_V4_OP_ATTN_BACKWARD] = {c_v4_attn_backward, 1e-4},
    [PS_V4_OP_KV_ATTEND] = {c_v4_kv_attend, 1e-5},
    [PS_V4_OP_KV_SLOTS] = {c_v4_kv_slots, 0},
};

/* ---------------- running and comparing ---------------- */

/* Runs case fn at shape s on ctx c into *r; 0: no such shape. */
static int run_on(ps_ctx *c, case_fn fn, int s, run_t *r) {
    memset(&R, 0, sizeof R);
    R.c = c;
    int ran = fn(s);
    *r = R;
    memset(&R, 0, sizeof R);
    return ran;
}

/* max |x - y| over max |y| (NaN and inf compared bit for bit: both the same, or a failure) */
static double rel_diff(const double *x, const double *y, int64_t n) {
    double big = 0, worst = 0;
    for (int64_t i = 0; i < n; i++)
        if (isfinite(y[i])) big = fmax(big, fabs(y[i]));
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(x[i]) || !isfinite(y[i])) {
            if (!(x[i] == y[i] || (isnan(x[i]) && isnan(y[i])))) return INFINITY;
            continue;
        }
        worst = fmax(worst, fabs(x[i] - y[i]));
    }
    return big > 0 ? worst / big : worst;
}

/* One op on one backend: every shape of its case, compared with the CPU; returns the shapes run. */
static int check_op(ps_ctx *cpu, ps_ctx *dev, const char *op, const op_case *oc, int exact, int *n_cmp) {
    int shapes = 0;
    for (int s = 0;; s++) {
        run_t ref, got;
        memset(&got, 0, sizeof got);
        int a = run_on(cpu, oc->fn, s, &ref);
        int b = a ? run_on(dev, oc->fn, s, &got) : 0;
        if (!a) {
            run_free(&ref);
            break;
        }
        shapes++;
        ps_error e1, e2;
        int ok1 = ps_ctx_check(cpu, &e1) == 0, ok2 = ps_ctx_check(dev, &e2) == 0;
        CHECK(ok1, "%s shape %d: the cpu failed: %s", op, s, e1.msg);
        CHECK(ok2, "%s shape %d on %s: %s", op, s, ps_ctx_backend_name(dev), e2.msg);
        CHECK(b && got.n_out == ref.n_out && ref.n_out > 0, "%s shape %d: %d outputs on %s, %d on the cpu", op, s, got.n_out,
              ps_ctx_backend_name(dev), ref.n_out);
        for (int i = 0; ok1 && ok2 && b && i < ref.n_out && i < got.n_out; i++) {
            double tol = exact ? 0 : oc->tol;
            int same = ref.out[i].n == got.out[i].n;
            double d = same ? rel_diff(got.out[i].v, ref.out[i].v, ref.out[i].n) : INFINITY;
            if (exact && same) /* the same bits, -0 and +0 apart */
                same = memcmp(got.out[i].v, ref.out[i].v, (size_t)ref.out[i].n * sizeof(double)) == 0;
            CHECK(same && d <= tol, "%s shape %d, output %s on %s: relative difference %.3g (tolerance %.1g)%s", op, s,
                  ref.out[i].name, ps_ctx_backend_name(dev), d, tol, same ? "" : ", not the same bits");
            (*n_cmp)++;
        }
        run_free(&ref);
        run_free(&got);
        /* a failed context stays failed: start the next shape on fresh ones */
        if (!ok1 || !ok2) return shapes;
    }
    return shapes;
}

static int test_backend(const char *name) {
    ps_ctx *cpu, *dev;
    ps_error err;
    if (ps_ctx_create(&dev, name, &err)) {
        printf("%s: not tested (%s)\n", name, err.msg);
        return 0;
    }
    if (ps_ctx_create(&cpu, "cpu", &err)) {
        CHECK(0, "cpu context: %s", err.msg);
        ps_ctx_free(dev);
        return 0;
    }
    int exact = !strcmp(name, "cpu-staged"), n_cmp = 0, n_shapes = 0;
    for (int op = 0; op < PS_OP_COUNT; op++) {
        if (!CORE[op].fn) continue; /* reported by test_complete */
        int k = check_op(cpu, dev, ps_op_name((ps_op)op), &CORE[op], exact, &n_cmp);
        CHECK(k >= 2, "%s: %d shapes, at least 2 wanted", ps_op_name((ps_op)op), k);
        n_shapes += k;
        if (ps_ctx_check(cpu, &err) || ps_ctx_check(dev, &err)) { /* fresh contexts after a failure */
            ps_ctx_free(cpu), ps_ctx_free(dev);
            if (ps_ctx_create(&cpu, "cpu", &err) || ps_ctx_create(&dev, name, &err)) {
                CHECK(0, "%s", err.msg);
                return 0;
            }
        }
    }
    for (int op = 0; op < PS_V4_OP_COUNT; op++) {
        if (!V4[op].fn) continue;
        int k = check_op(cpu, dev, ps_v4_op_name((ps_v4_op)op), &V4[op], exact, &n_cmp);
        CHECK(k >= 2, "%s: %d shapes, at least 2 wanted", ps_v4_op_name((ps_v4_op)op), k);
        n_shapes += k;
        if (ps_ctx_check(cpu, &err) || ps_ctx_check(dev, &err)) {
            ps_ctx_free(cpu), ps_ctx_free(dev);
            if (ps_ctx_create(&cpu, "cpu", &err) || ps_ctx_create(&dev, name, &err)) {
                CHECK(0, "%s", err.msg);
                return 0;
            }
        }
    }
    printf("%s: %d ops + %d DeepSeek-V4 ops, %d shapes, %d outputs against the cpu%s\n", name, PS_OP_COUNT, PS_V4_OP_COUNT,
           n_shapes, n_cmp, exact ? " (bit for bit)" : "");
    ps_ctx_free(cpu), ps_ctx_free(dev);
    return 1;
}

/* every op of the enums has a case, and every backend this build can open has every op */
static void test_complete(void) {
    for (int op = 0; op < PS_OP_COUNT; op++)
        CHECK(CORE[op].fn != NULL, "op \"%s\" (ps_op %d) has no case in test_backend_ops", ps_op_name((ps_op)op), op);
    for (int op = 0; op < PS_V4_OP_COUNT; op++)
        CHECK(V4[op].fn != NULL, "DeepSeek-V4 op \"%s\" (ps_v4_op %d) has no case in test_backend_ops", ps_v4_op_name((ps_v4_op)op),
              op);
    CHECK(ps_op_name(PS_OP_COUNT) == NULL && ps_v4_op_name(PS_V4_OP_COUNT) == NULL, "names past the enums");
    CHECK(!strcmp(ps_op_name(PS_OP_GATE), "gate") && !strcmp(ps_v4_op_name(PS_V4_OP_ATTN_BACKWARD), "v4_attn_backward"),
          "name table order");
}

/* supports(): the ops.h wrappers ask it, and a declined op fails naming the op and the backend */
static void test_supports(void) {
    ps_ctx *c;
    ps_error err;
    REQUIRE_OK(ps_ctx_create(&c, "cpu", &err), &err);
    ps_attn_geom g = geom(1, 8, 2, 1, 256, 0, 0, 0, 0);
    ps_op_params p = {.attn = &g};
    const char *why = "unset";
    CHECK(ps_backend_supports(c->be, PS_OP_ATTN_FORWARD, &p, &why) && why == NULL, "the cpu runs every op");
    /* a table that breaks its own rules fails in the wrapper, naming the op and the window */
    int64_t st[2] = {0, 7}, ln[2] = {4, 4};
    ps_windows w = {.B = 1, .T = 10, .nW = 2, .nkv = 1, .W = 4, .H = 1, .S = 0, .start = st, .len = ln};
    float z[8], al[8], a[40] = {0}, u[16] = {0}, b[4] = {0};
    CHECK(ps_gate(c, z, al, a, u, b, 4, &w) != 0 && strstr(c->err.msg, "gate: window 1 of sequence 0"), "bad table: %s",
          c->err.msg);
    ps_ctx_free(c);
#ifdef PS_HAVE_CUDA
    extern const ps_backend ps_backend_cuda;
    CHECK(!ps_backend_supports(&ps_backend_cuda, PS_OP_ATTN_FORWARD, &p, &why) && why && strstr(why, "head_dim"),
          "cuda declines head_dim 256: %s", why ? why : "(accepted)");
    int64_t st2[4] = {0, 1, 5, 6}, ln2[4] = {4, 4, 4, 4}; /* per head, not a grid: the table kernels run it */
    ps_windows w2 = {.B = 1, .T = 12, .nW = 2, .nkv = 2, .W = 4, .H = 2, .S = 0, .start = st2, .len = ln2};
    ps_op_params p2 = {.win = &w2};
    CHECK(ps_backend_supports(&ps_backend_cuda, PS_OP_GATE, &p2, &why), "cuda runs any window table: %s", why ? why : "");
#endif
}

/* cpu-staged's guard: its buffers are readable inside an op or copy and fault outside, as a device pointer
 * read on the host would on CUDA. A child process reads one between ops (it must die by the signal, or by
 * ASan's report of it: exit status 1); the same read inside ps_op_open / ps_op_close, and the ops and
 * copies themselves, work. */
static void test_staged_guard(void) {
    ps_error err;
    ps_ctx *c = NULL;
    REQUIRE_OK(ps_ctx_create(&c, "cpu-staged", &err), &err);
    float *b = ps_buf_alloc(c, 3000 * sizeof(float), "guard test", &err), host[3] = {1, 2, 3}, back[3] = {0};
    REQUIRE_OK(b == NULL, &err);
    CHECK(ps_fill(c, b, 0.5f, 3000) == 0, "fill");
    CHECK_OK(ps_buf_from_host(c, b + 2997, host, sizeof host, &err), &err);
    CHECK_OK(ps_buf_to_host(c, back, b + 2997, sizeof back, &err), &err);
    CHECK(back[0] == 1 && back[2] == 3, "copies through the guard: %g %g", back[0], back[2]);
    ps_op_open(c);
    float inside = b[10];
    ps_op_close(c, 0);
    CHECK(inside == 0.5f, "a read inside the guard: %g", inside);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        volatile float x = b[10]; /* between ops: must fault */
        (void)x;
        _exit(0);
    }
    int st = 0;
    CHECK(pid > 0 && waitpid(pid, &st, 0) == pid, "fork");
    CHECK(!(WIFEXITED(st) && WEXITSTATUS(st) == 0), "a host read of a cpu-staged buffer between ops did not fault");
    ps_buf_free(c, b, 3000 * sizeof(float));
    /* a freed block is reused zero-filled, as calloc's */
    float *z = ps_buf_alloc(c, 3000 * sizeof(float), "guard test 2", &err);
    REQUIRE_OK(z == NULL, &err);
    CHECK_OK(ps_buf_to_host(c, back, z + 9, sizeof back, &err), &err);
    CHECK(back[0] == 0 && back[1] == 0 && back[2] == 0, "a reused block reads %g %g %g, not zero", back[0], back[1], back[2]);
    ps_buf_free(c, z, 3000 * sizeof(float));
    ps_ctx_free(c);
}

int main(void) {
    test_complete();
    test_staged_guard();
    test_supports();
    test_select_refs();
    test_backend("cpu-staged");
    /* "not tested" where the build has no cuda backend or the machine no device — a failure when the run asks
     * for the device (PS_REQUIRE_CUDA=1: a GPU check must never pass without one) */
    int cuda = test_backend("cuda");
    const char *req = getenv("PS_REQUIRE_CUDA");
    CHECK(cuda || !req || !*req || !strcmp(req, "0"), "PS_REQUIRE_CUDA is set and the cuda backend could not be tested");
    CHECK_DONE();
}
