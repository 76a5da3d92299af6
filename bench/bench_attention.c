/* bench_attention.c — time and memory of the CPU attention kernels: the O(T)-memory forward and
 * backward (core/cpu/attention.c) against the old probability-matrix path (probs + out forward, a
 * backward that reads the stored probabilities), for full attention and compressed W8/S8 (local window
 * 8), B = 1, nh = 8, nkv = 4, hd = 64, at T = 4096, 16384, 65536.
 *
 * Each configuration runs in its own child process (fork), so its peak resident memory (getrusage
 * ru_maxrss) is its own: "RSS growth" is the child's peak minus its resident size at start. "Attention
 * memory" is computed: the arrays the op owns (q, k, v, ck, cv, dz, z, dq, dk, dv, dck, dcv; the new
 * path adds lse [B, nh, T]) plus, new: the workspace the kernels took (ctx->ws_peak floats), old: the
 * probability matrix and its gradient, [B, nh, T, ncols] each. The old path runs only where it fits in
 * the memory available (with a margin) and where it is timed by default; elsewhere its memory is
 * computed, not run. CPU time (CLOCK_PROCESS_CPUTIME_ID, all threads) is the stable figure on a shared
 * machine; wall time is printed next to it.
 *
 *   bench_attention [--quick] [--long] [--old-full-16k]
 *   bench_attention --train-shapes REPS [SHAPE]   the training shapes instead (T = 72..160, B·nh = 32..256
 *                    tasks), in-process, best of REPS calls (train_shapes); SHAPE: the rows whose name starts so
 *     --quick          T = 4096 and 16384 only
 *     --long           also the new full-attention backward at T = 65536 (about 140 CPU-seconds; by
 *                      default that row is forward only)
 *     --old-full-16k   also run the old path for full attention at T = 16384 (17 GB)
 * Prints a markdown table; asserts nothing but the old and new outputs agreeing where both run. */
#define _POSIX_C_SOURCE 200809L
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_common.h"
#include "core/cpu/cpu_attention.h"
#include "core/cpu_env.h"
#include "core/ops.h"
#include "core/rng.h"

/* ================= old path, for comparison =================
 * Copied from core/ops_cpu.c (ps_attn_probs, ps_attn_out) and core/ops_cpu_backward.c (ps_attn_backward)
 * as of commit 9faea36, renamed; they store probs and dprobs [B, nh, T, ncols]. */

static inline int64_t old_local_first(int64_t t, int64_t LW) { return t - LW + 1 < 0 ? LW - 1 - t : 0; }

#define OLD_ATTN_BLOCK 64

static void old_sgemm_nt(int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda, const float *B,
                         int64_t ldb, float beta, float *C, int64_t ldc) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)M, (blasint)N, (blasint)K, alpha, A, (blasint)lda, B,
                (blasint)ldb, beta, C, (blasint)ldc);
}

static void old_sgemm_nn(int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda, const float *B,
                         int64_t ldb, float beta, float *C, int64_t ldc) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)M, (blasint)N, (blasint)K, alpha, A, (blasint)lda, B,
                (blasint)ldb, beta, C, (blasint)ldc);
}

static void old_softmax_row(float *row, int64_t nc, int64_t n_comp, int64_t lo, int64_t hi) {
    float mx = -INFINITY;
    for (int64_t c = 0; c < n_comp; c++) mx = row[c] > mx ? row[c] : mx;
    for (int64_t c = lo; c < hi; c++) mx = row[c] > mx ? row[c] : mx;
    float sum = 0.0f;
    for (int64_t c = 0; c < n_comp; c++) sum += (row[c] = ps_expf(row[c] - mx));
    for (int64_t c = lo; c < hi; c++) sum += (row[c] = ps_expf(row[c] - mx));
    float inv = 1.0f / sum;
    for (int64_t c = 0; c < n_comp; c++) row[c] *= inv;
    for (int64_t c = n_comp; c < lo; c++) row[c] = 0.0f;
    for (int64_t c = lo; c < hi; c++) row[c] *= inv;
    for (int64_t c = hi > lo ? hi : lo; c < nc; c++) row[c] = 0.0f;
}

static void old_attn_probs(float *probs, const float *q, const float *k, const float *ck, const ps_attn_geom *g) {
    int64_t B = g->B, T = g->T, nh = g->nh, nkv = g->nkv, hd = g->hd, nc = g->ncols, grp = nh / nkv, nW = g->nW;
    float scale = 1.0f / sqrtf((float)hd);
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t bn = 0; bn < B * nh; bn++) {
        int64_t b = bn / nh, n = bn % nh, kv = n / grp;
        float *P = probs + bn * T * nc;
        const float *Q = q + b * T * nh * hd + n * hd;
        if (!g->compressed) {
            const float *K = k + b * T * nkv * hd + kv * hd;
            for (int64_t r0 = 0; r0 < T; r0 += OLD_ATTN_BLOCK) {
                int64_t r1 = r0 + OLD_ATTN_BLOCK < T ? r0 + OLD_ATTN_BLOCK : T;
                old_sgemm_nt(r1 - r0, r1, hd, scale, Q + r0 * nh * hd, nh * hd, K, nkv * hd, 0.0f, P + r0 * nc, nc);
                for (int64_t t = r0; t < r1; t++) old_softmax_row(P + t * nc, nc, 0, 0, t + 1);
            }
            continue;
        }
        if (nW > 0) old_sgemm_nt(T, nW, hd, scale, Q, nh * hd, ck + b * nW * nkv * hd + kv * hd, nkv * hd, 0.0f, P, nc);
        for (int64_t t = 0; t < T; t++) {
            float *row = P + t * nc;
            const float *qt = Q + t * nh * hd;
            int64_t lo = nW + old_local_first(t, g->LW);
            for (int64_t c = lo; c < nc; c++) {
                const float *kt = k + ((b * T + t - g->LW + 1 + (c - nW)) * nkv + kv) * hd;
                row[c] = ps_dot(qt, kt, hd) * scale;
            }
            old_softmax_row(row, nc, ps_windows_seen(t, g->W, g->S, nW), lo, nc);
        }
    }
}

static void old_attn_out(float *z, const float *probs, const float *v, const float *cv, const ps_attn_geom *g) {
    int64_t B = g->B, T = g->T, nh = g->nh, nkv = g->nkv, hd = g->hd, nc = g->ncols, grp = nh / nkv, nW = g->nW;
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t bn = 0; bn < B * nh; bn++) {
        int64_t b = bn / nh, n = bn % nh, kv = n / grp;
        const float *P = probs + bn * T * nc;
        float *Z = z + b * T * nh * hd + n * hd;
        if (!g->compressed) {
            const float *V = v + b * T * nkv * hd + kv * hd;
            for (int64_t r0 = 0; r0 < T; r0 += OLD_ATTN_BLOCK) {
                int64_t r1 = r0 + OLD_ATTN_BLOCK < T ? r0 + OLD_ATTN_BLOCK : T;
                old_sgemm_nn(r1 - r0, hd, r1, 1.0f, P + r0 * nc, nc, V, nkv * hd, 0.0f, Z + r0 * nh * hd, nh * hd);
            }
            continue;
        }
        if (nW > 0) old_sgemm_nn(T, hd, nW, 1.0f, P, nc, cv + b * nW * nkv * hd + kv * hd, nkv * hd, 0.0f, Z, nh * hd);
        else
            for (int64_t t = 0; t < T; t++) memset(Z + t * nh * hd, 0, (size_t)hd * sizeof(float));
        for (int64_t t = 0; t < T; t++) {
            const float *row = P + t * nc;
            float *zt = Z + t * nh * hd;
            for (int64_t c = nW + old_local_first(t, g->LW); c < nc; c++) {
                const float *vt = v + ((b * T + t - g->LW + 1 + (c - nW)) * nkv + kv) * hd;
                float p = row[c];
                for (int64_t i = 0; i < hd; i++) zt[i] += p * vt[i];
            }
        }
    }
}

static void old_gemm(int ta, int tb, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const float *B,
                     int64_t ldb, float beta, float *C, int64_t ldc) {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (blasint)M, (blasint)N,
                (blasint)K, 1.0f, A, (blasint)lda, B, (blasint)ldb, beta, C, (blasint)ldc);
}

static void old_softmax_row_backward(float *dr, const float *pr, int64_t nc, float scale) {
    float fd = (float)ps_dot_d(pr, dr, nc);
    for (int64_t c = 0; c < nc; c++) dr[c] = pr[c] * (dr[c] - fd) * scale;
}

static void old_attn_backward(float *dq, float *dk, float *dv, float *dck, float *dcv, float *dprobs, const float *dz,
                              const float *probs, const float *q, const float *k, const float *v, const float *ck,
                              const float *cv, const ps_attn_geom *g) {
    int64_t B = g->B, T = g->T, nh = g->nh, nkv = g->nkv, hd = g->hd, nc = g->ncols, grp = nh / nkv, nW = g->nW;
    int64_t LW = g->LW, qs = nh * hd, ks = nkv * hd;
    float scale = 1.0f / sqrtf((float)hd);
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t bk = 0; bk < B * nkv; bk++) {
        int64_t b = bk / nkv, kv = bk % nkv;
        const float *K = k + b * T * ks + kv * hd, *Vv = v + b * T * ks + kv * hd;
        float *dK = dk + b * T * ks + kv * hd, *dV = dv + b * T * ks + kv * hd;
        for (int64_t n = kv * grp; n < (kv + 1) * grp; n++) {
            const float *P = probs + (b * nh + n) * T * nc, *dZ = dz + b * T * qs + n * hd, *Q = q + b * T * qs + n * hd;
            float *dP = dprobs + (b * nh + n) * T * nc, *dQ = dq + b * T * qs + n * hd;
            if (!g->compressed) {
                for (int64_t r0 = 0; r0 < T; r0 += OLD_ATTN_BLOCK) {
                    int64_t r1 = r0 + OLD_ATTN_BLOCK < T ? r0 + OLD_ATTN_BLOCK : T, m = r1 - r0;
                    old_gemm(0, 1, m, r1, hd, dZ + r0 * qs, qs, Vv, ks, 0.0f, dP + r0 * nc, nc);
                    old_gemm(1, 0, r1, hd, m, P + r0 * nc, nc, dZ + r0 * qs, qs, 1.0f, dV, ks);
                    for (int64_t t = r0; t < r1; t++) old_softmax_row_backward(dP + t * nc, P + t * nc, r1, scale);
                    old_gemm(0, 0, m, hd, r1, dP + r0 * nc, nc, K, ks, 0.0f, dQ + r0 * qs, qs);
                    old_gemm(1, 0, r1, hd, m, dP + r0 * nc, nc, Q + r0 * qs, qs, 1.0f, dK, ks);
                }
                continue;
            }
            const float *CK = ck + b * nW * ks + kv * hd, *CV = cv + b * nW * ks + kv * hd;
            float *dCK = dck + b * nW * ks + kv * hd, *dCV = dcv + b * nW * ks + kv * hd;
            if (nW > 0) {
                old_gemm(0, 1, T, nW, hd, dZ, qs, CV, ks, 0.0f, dP, nc);
                old_gemm(1, 0, nW, hd, T, P, nc, dZ, qs, 1.0f, dCV, ks);
            }
            for (int64_t t = 0; t < T; t++) {
                for (int64_t c = nW; c < nW + old_local_first(t, LW); c++) dP[t * nc + c] = 0.0f;
                for (int64_t c = nW + old_local_first(t, LW); c < nc; c++) {
                    int64_t tp = t - LW + 1 + (c - nW);
                    const float *dzt = dZ + t * qs, *vt = Vv + tp * ks;
                    float *dvt = dV + tp * ks, p = P[t * nc + c];
                    for (int64_t e = 0; e < hd; e++) dvt[e] += p * dzt[e];
                    dP[t * nc + c] = ps_dot(dzt, vt, hd);
                }
            }
            for (int64_t t = 0; t < T; t++) old_softmax_row_backward(dP + t * nc, P + t * nc, nc, scale);
            if (nW > 0) {
                old_gemm(0, 0, T, hd, nW, dP, nc, CK, ks, 0.0f, dQ, qs);
                old_gemm(1, 0, nW, hd, T, dP, nc, Q, qs, 1.0f, dCK, ks);
            } else
                for (int64_t t = 0; t < T; t++) memset(dQ + t * qs, 0, (size_t)hd * sizeof(float));
            for (int64_t t = 0; t < T; t++)
                for (int64_t c = nW + old_local_first(t, LW); c < nc; c++) {
                    int64_t tp = t - LW + 1 + (c - nW);
                    float ds = dP[t * nc + c];
                    const float *kt = K + tp * ks, *qt = Q + t * qs;
                    float *dqt = dQ + t * qs, *dkt = dK + tp * ks;
                    for (int64_t e = 0; e < hd; e++) {
                        dqt[e] += ds * kt[e];
                        dkt[e] += ds * qt[e];
                    }
                }
        }
    }
}

/* ================= the bench ================= */

static ps_attn_geom geometry(int comp, int64_t T) {
    ps_attn_geom g = {.B = 1, .T = T, .nh = 8, .nkv = 4, .hd = 64, .compressed = comp};
    if (comp) {
        g.W = 8, g.S = 8, g.LW = 8 < T ? 8 : T;
        g.nW = T >= g.W ? (T - g.W) / g.S + 1 : 0;
        g.ncols = g.nW + g.LW;
    } else
        g.ncols = T;
    return g;
}

/* Floats of the arrays the op owns (inputs, outputs, gradients); lse counted separately. */
static int64_t array_floats(const ps_attn_geom *g) {
    int64_t nq = g->B * g->T * g->nh * g->hd, nk = g->B * g->T * g->nkv * g->hd, nc = g->B * g->nW * g->nkv * g->hd;
    return 4 * nq + 4 * nk + 4 * nc;
}

static int64_t probs_floats(const ps_attn_geom *g) { return g->B * g->nh * g->T * g->ncols; }

/* What a child reports through its pipe. */
typedef struct {
    int ok;
    char msg[200];
    double fwd_cpu, fwd_wall, bwd_cpu, bwd_wall;
    int reps;
    int64_t mem_bytes;  /* computed attention memory */
    int64_t rss_growth; /* bytes: peak RSS minus RSS at start */
    double diff_z, diff_dq, diff_dk, diff_dv, diff_dck, diff_dcv; /* old child: max rel. diff new vs old */
} result;

static long maxrss_kb(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss;
}

static float *alloc_fill(int64_t n, ps_rng *r, double sd) {
    float *x = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    if (!x) return NULL;
    for (int64_t i = 0; i < n; i++) x[i] = sd > 0 ? (float)(sd * ps_rng_normal(r)) : 0.0f;
    return x;
}

/* max |a - b| / max |b| */
static double rel_diff(const float *a, const float *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= num)) num = d;
        if (fabs((double)b[i]) > den) den = fabs((double)b[i]);
    }
    return den > 0 ? num / den : num;
}

typedef struct {
    float *q, *k, *v, *ck, *cv, *dz, *z, *lse, *dq, *dk, *dv, *dck, *dcv;
} arrays;

static int arrays_alloc(arrays *a, const ps_attn_geom *g) {
    ps_rng r;
    ps_rng_seed(&r, 5);
    int64_t nq = g->B * g->T * g->nh * g->hd, nk = g->B * g->T * g->nkv * g->hd, nc = g->B * g->nW * g->nkv * g->hd;
    a->q = alloc_fill(nq, &r, 1), a->k = alloc_fill(nk, &r, 1), a->v = alloc_fill(nk, &r, 1);
    a->ck = alloc_fill(nc, &r, 1), a->cv = alloc_fill(nc, &r, 1), a->dz = alloc_fill(nq, &r, 1);
    a->z = alloc_fill(nq, &r, 0), a->lse = alloc_fill(g->B * g->nh * g->T, &r, 0), a->dq = alloc_fill(nq, &r, 0);
    a->dk = alloc_fill(nk, &r, 0), a->dv = alloc_fill(nk, &r, 0), a->dck = alloc_fill(nc, &r, 0), a->dcv = alloc_fill(nc, &r, 0);
    return a->q && a->k && a->v && a->ck && a->cv && a->dz && a->z && a->lse && a->dq && a->dk && a->dv && a->dck && a->dcv
               ? 0
               : -1;
}

/* (forward, backward) once untimed when warm (the first call faults in fresh pages: probs for the old
 * path, the workspace for the new one), then repeated until min_s of wall time (at least once, at most
 * 9 times): the median wall and CPU time of each. With backward = 0 the forward only. Gradients
 * accumulate across repetitions (as in training). */
typedef int (*step_fn)(void *st, int backward);

static void time_steps(step_fn f, void *st, int warm, int backward, double min_s, result *res) {
    enum { MAXR = 9 };
    double fw[MAXR], bw[MAXR], fc[MAXR], bc[MAXR], t_start;
    int n = 0;
    if (warm && (f(st, 0) || (backward && f(st, 1)))) return;
    t_start = now();
    do {
        double w0 = now(), c0 = cpu_now();
        if (f(st, 0)) return;
        double w1 = now(), c1 = cpu_now();
        if (backward && f(st, 1)) return;
        double w2 = now(), c2 = cpu_now();
        fw[n] = w1 - w0, bw[n] = w2 - w1, fc[n] = c1 - c0, bc[n] = c2 - c1;
        n++;
    } while (now() - t_start < min_s && n < MAXR);
    res->reps = n;
    res->fwd_cpu = median(fc, n), res->fwd_wall = median(fw, n);
    res->bwd_cpu = backward ? median(bc, n) : NAN, res->bwd_wall = backward ? median(bw, n) : NAN;
    res->ok = 1;
}

typedef struct {
    ps_ctx *c;
    arrays *a;
    const ps_attn_geom *g;
    float *probs, *dprobs; /* old path only */
} step_state;

static int new_step(void *p, int backward) {
    step_state *s = p;
    arrays *a = s->a;
    if (!backward) return ps_cpu_attn_forward(s->c, a->z, a->lse, a->q, a->k, a->v, a->ck, a->cv, s->g);
    return ps_cpu_attn_backward(s->c, a->dq, a->dk, a->dv, a->dck, a->dcv, a->dz, a->z, a->lse, a->q, a->k, a->v, a->ck,
                                a->cv, s->g);
}

static int old_step(void *p, int backward) {
    step_state *s = p;
    arrays *a = s->a;
    if (!backward) {
        old_attn_probs(s->probs, a->q, a->k, a->ck, s->g);
        old_attn_out(a->z, s->probs, a->v, a->cv, s->g);
    } else
        old_attn_backward(a->dq, a->dk, a->dv, a->dck, a->dcv, s->dprobs, a->dz, s->probs, a->q, a->k, a->v, a->ck,
                          a->cv, s->g);
    return 0;
}

/* The child's work: one path on one geometry. */
static void run_child(int old, const ps_attn_geom *g, int warm, int backward, double min_s, result *res) {
    long rss0 = maxrss_kb();
    arrays a;
    ps_error err;
    ps_ctx *c = NULL;
    if (arrays_alloc(&a, g) || ps_ctx_create(&c, "cpu", &err)) {
        snprintf(res->msg, sizeof res->msg, "out of memory for the arrays");
        return;
    }
    step_state st = {.c = c, .a = &a, .g = g};
    if (old) {
        int64_t np = probs_floats(g);
        st.probs = malloc((size_t)np * sizeof(float)), st.dprobs = malloc((size_t)np * sizeof(float));
        if (!st.probs || !st.dprobs) {
            snprintf(res->msg, sizeof res->msg, "out of memory for probs/dprobs");
            return;
        }
        time_steps(old_step, &st, warm, backward, min_s, res);
        res->mem_bytes = 4 * (array_floats(g) + 2 * np);
    } else {
        time_steps(new_step, &st, warm, backward, min_s, res);
        if (!res->ok) snprintf(res->msg, sizeof res->msg, "%.190s", c->err.msg);
        res->mem_bytes = 4 * (array_floats(g) + g->B * g->nh * g->T + c->ws_peak);
    }
    res->rss_growth = (maxrss_kb() - rss0) * 1024;
    if (old && res->ok) {
        /* the new kernels on the same inputs, one pass from zeroed gradients each: max rel. difference */
        int64_t nq = g->B * g->T * g->nh * g->hd, nk = g->B * g->T * g->nkv * g->hd, nc = g->B * g->nW * g->nkv * g->hd;
        arrays o = a, n = a;
        memset(a.dk, 0, (size_t)nk * 4), memset(a.dv, 0, (size_t)nk * 4);
        memset(a.dck, 0, (size_t)(nc ? nc : 1) * 4), memset(a.dcv, 0, (size_t)(nc ? nc : 1) * 4);
        old_step(&st, 0), old_step(&st, 1);
        free(st.probs), free(st.dprobs);
        n.z = alloc_fill(nq, NULL, 0), n.lse = alloc_fill(g->B * g->nh * g->T, NULL, 0), n.dq = alloc_fill(nq, NULL, 0);
        n.dk = alloc_fill(nk, NULL, 0), n.dv = alloc_fill(nk, NULL, 0);
        n.dck = alloc_fill(nc, NULL, 0), n.dcv = alloc_fill(nc, NULL, 0);
        step_state sn = {.c = c, .a = &n, .g = g};
        new_step(&sn, 0), new_step(&sn, 1);
        res->diff_z = rel_diff(n.z, o.z, nq), res->diff_dq = rel_diff(n.dq, o.dq, nq);
        res->diff_dk = rel_diff(n.dk, o.dk, nk), res->diff_dv = rel_diff(n.dv, o.dv, nk);
        res->diff_dck = nc ? rel_diff(n.dck, o.dck, nc) : 0, res->diff_dcv = nc ? rel_diff(n.dcv, o.dcv, nc) : 0;
    }
    ps_ctx_free(c);
}

/* Fork, run, read the result back. */
static int run_forked(int old, const ps_attn_geom *g, int warm, int backward, double min_s, result *res) {
    memset(res, 0, sizeof *res);
    int fd[2];
    if (pipe(fd)) return -1;
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        close(fd[0]);
        result r;
        memset(&r, 0, sizeof r);
        run_child(old, g, warm, backward, min_s, &r);
        ssize_t w = write(fd[1], &r, sizeof r);
        _exit(w == (ssize_t)sizeof r ? 0 : 1);
    }
    close(fd[1]);
    ssize_t got = 0, n;
    while (got < (ssize_t)sizeof *res && (n = read(fd[0], (char *)res + got, sizeof *res - (size_t)got)) > 0) got += n;
    close(fd[0]);
    int status;
    waitpid(pid, &status, 0);
    if (got != (ssize_t)sizeof *res) {
        snprintf(res->msg, sizeof res->msg, "child ended without a result (status %d)", status);
        res->ok = 0;
    }
    return 0;
}

static int64_t mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %lld kB", &kb) == 1) break;
    fclose(f);
    return (int64_t)kb * 1024;
}

static void fmt_bytes(char *out, size_t n, double b) {
    if (b >= 1e9) snprintf(out, n, "%.2f GB", b / 1e9);
    else if (b >= 1e6) snprintf(out, n, "%.1f MB", b / 1e6);
    else snprintf(out, n, "%.0f kB", b / 1e3);
}

/* One table row: the path's times (backward "-" when not run) and memory. */
static void print_row(const char *kind, int64_t T, const char *path, const result *r, const char *mem,
                      const char *rss) {
    char bc[32] = "-", bw[32] = "-";
    if (!isnan(r->bwd_cpu)) snprintf(bc, sizeof bc, "%.3f", r->bwd_cpu), snprintf(bw, sizeof bw, "%.3f", r->bwd_wall);
    printf("| %s | %lld | %s | %.3f | %.3f | %s | %s | %s | %s |\n", kind, (long long)T, path, r->fwd_cpu, r->fwd_wall,
           bc, bw, mem, rss);
}

/* --train-shapes: the training shapes (short sequences, many (sequence, head) tasks), in this process: one
 * untimed forward + backward, then `reps` of each; the best (minimum) CPU and wall time of each call.
 * Fixed work, so an instruction count (valgrind --tool=callgrind --toggle-collect=ps_cpu_attn_backward)
 * compares builds; the hash of the first call's outputs shows whether two builds give the same bits. */
/* FNV-1a over the bytes of x[n]: compares the outputs of two builds bit for bit. */
static uint64_t fnv(uint64_t h, const float *x, int64_t n) {
    const unsigned char *b = (const unsigned char *)x;
    for (int64_t i = 0; i < n * 4; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

static int train_shapes(int reps, const char *only) {
    struct { const char *name; int64_t B, T, nh, nkv, hd; int comp; } sh[] = {
        {"deep_w8s8 (d=64 h=8 hd=8)", 32, 72, 8, 8, 8, 1},   {"deep full (d=64 h=8 hd=8)", 32, 72, 8, 8, 8, 0},
        {"W8/S8 T=96 h=8 hd=16", 8, 96, 8, 8, 16, 1},          {"full T=96 h=8 hd=16", 8, 96, 8, 8, 16, 0},
        {"W8/S8 T=128 h=16/8 hd=32", 4, 128, 16, 8, 32, 1},    {"full T=128 h=16/8 hd=32", 4, 128, 16, 8, 32, 0},
        {"W8/S8 T=160 h=8 hd=64", 4, 160, 8, 8, 64, 1},        {"full T=160 h=8 hd=64", 4, 160, 8, 8, 64, 0},
        /* only by name (SHAPE "long"): the default table's T = 4096 shape, for the block size at long T */
        {"long W8/S8 T=4096 h=8/4 hd=64", 1, 4096, 8, 4, 64, 1}, {"long full T=4096 h=8/4 hd=64", 1, 4096, 8, 4, 64, 0},
    };
    printf("| shape | B | fwd CPU ms | fwd wall ms | bwd CPU ms | bwd wall ms | bits of z lse dq dk dv dck dcv |\n"
           "|---|---:|---:|---:|---:|---:|---|\n");
    for (size_t i = 0; i < sizeof sh / sizeof sh[0]; i++) {
        if (only ? strncmp(sh[i].name, only, strlen(only)) != 0 : !strncmp(sh[i].name, "long", 4)) continue;
        ps_attn_geom g = geometry(sh[i].comp, sh[i].T);
        g.B = sh[i].B, g.nh = sh[i].nh, g.nkv = sh[i].nkv, g.hd = sh[i].hd;
        arrays a;
        ps_error err;
        ps_ctx *c = NULL;
        if (arrays_alloc(&a, &g) || ps_ctx_create(&c, "cpu", &err)) return 1;
        step_state st = {.c = c, .a = &a, .g = &g};
        double best[4] = {INFINITY, INFINITY, INFINITY, INFINITY};
        uint64_t hash = 14695981039346656037ull;
        for (int r = -1; r < reps; r++)
            for (int bw = 0; bw < 2; bw++) {
                double w0 = now(), c0 = cpu_now();
                if (new_step(&st, bw)) {
                    fprintf(stderr, "%s\n", c->err.msg);
                    return 1;
                }
                double dw = now() - w0, dc = cpu_now() - c0;
                if (r < 0 && bw) { /* the outputs of the first forward + backward (gradients from zero) */
                    int64_t nq = g.B * g.T * g.nh * g.hd, nk = g.B * g.T * g.nkv * g.hd, nc = g.B * g.nW * g.nkv * g.hd;
                    hash = fnv(fnv(fnv(fnv(fnv(fnv(fnv(hash, a.z, nq), a.lse, g.B * g.nh * g.T), a.dq, nq), a.dk, nk), a.dv, nk),
                                   a.dck, nc), a.dcv, nc);
                }
                if (r < 0) continue;
                if (dc < best[2 * bw]) best[2 * bw] = dc;
                if (dw < best[2 * bw + 1]) best[2 * bw + 1] = dw;
            }
        printf("| %s | %lld | %.3f | %.3f | %.3f | %.3f | %016llx |\n", sh[i].name, (long long)g.B, best[0] * 1e3,
               best[1] * 1e3, best[2] * 1e3, best[3] * 1e3, (unsigned long long)hash);
        fflush(stdout);
        ps_ctx_free(c);
        free(a.q), free(a.k), free(a.v), free(a.ck), free(a.cv), free(a.dz), free(a.z), free(a.lse);
        free(a.dq), free(a.dk), free(a.dv), free(a.dck), free(a.dcv);
    }
    return 0;
}

int main(int argc, char **argv) {
    char warning[256], blas[320];
    ps_cpu_env_prepare(argv, warning, sizeof warning); /* first: may re-exec with the right BLAS kernels */
    if (warning[0]) fprintf(stderr, "%s\n", warning);
    int quick = 0, old_full_16k = 0, long_run = 0, shapes_reps = 0;
    const char *shapes_only = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = 1;
        else if (!strcmp(argv[i], "--long")) long_run = 1;
        else if (!strcmp(argv[i], "--old-full-16k")) old_full_16k = 1;
        else if (!strcmp(argv[i], "--train-shapes") && i + 1 < argc) {
            shapes_reps = atoi(argv[++i]);
            if (i + 1 < argc) shapes_only = argv[++i];
        }
        else {
            fprintf(stderr, "usage: %s [--quick] [--long] [--old-full-16k] | --train-shapes REPS [SHAPE]\n", argv[0]);
            return 2;
        }
    }
    if (shapes_reps > 0) {
        ps_cpu_env_describe(blas, sizeof blas);
        printf("bench_attention --train-shapes: best of %d calls after one untimed; %d thread(s)\nBLAS: %s\n\n",
               shapes_reps, omp_get_max_threads(), blas);
        return train_shapes(shapes_reps, shapes_only);
    }
    ps_cpu_env_describe(blas, sizeof blas);
    printf("phasescope bench_attention (attention forward + backward, float32, CPU)\nBLAS: %s\n", blas);
    printf("B=1 nh=8 nkv=4 hd=64; compressed: W=8 S=8 local window 8; query block %d rows; %d thread(s)\n",
           PS_CPU_ATTN_BLOCK, omp_get_max_threads());
    printf("times: median over repetitions after one untimed call where a call is short (T=4096; compressed "
           "T=16384), else one call; CPU = all threads\n\n");
    int64_t Ts[] = {4096, 16384, 65536};
    int nT = quick ? 2 : 3;
    int64_t avail = mem_available();
    printf("| attention | T | path | fwd CPU s | fwd wall s | bwd CPU s | bwd wall s | attention memory | RSS growth |\n");
    printf("|---|---:|---|---:|---:|---:|---:|---:|---:|\n");
    char notes[8][400];
    int n_notes = 0;
    for (int comp = 1; comp >= 0; comp--)
        for (int i = 0; i < nT; i++) {
            ps_attn_geom g = geometry(comp, Ts[i]);
            const char *kind = comp ? "compressed W8/S8" : "full";
            int short_call = Ts[i] <= 4096 || (comp && Ts[i] <= 16384);
            double min_s = Ts[i] <= 4096 ? 1.0 : 0.0; /* repeat only the short runs */
            /* full T=65536: forward only unless --long (the backward alone is ~140 CPU-seconds) */
            int backward = comp || Ts[i] < 65536 || long_run;
            result rn, ro;
            char mem[32], rss[32], omem[32];
            run_forked(0, &g, short_call, backward, min_s, &rn);
            if (!backward) /* what the backward would add: its workspace is twice the forward's */
                rn.mem_bytes += 4 * (ps_cpu_attn_workspace(&g, omp_get_max_threads(), 1) -
                                     ps_cpu_attn_workspace(&g, omp_get_max_threads(), 0));
            fmt_bytes(mem, sizeof mem, (double)rn.mem_bytes);
            fmt_bytes(rss, sizeof rss, (double)rn.rss_growth);
            if (rn.ok) print_row(kind, Ts[i], "new", &rn, mem, rss);
            else printf("| %s | %lld | new | failed: %s | | | | | |\n", kind, (long long)Ts[i], rn.msg);
            /* the old path: run where it fits and is timed by default (T = 4096; compressed also 16384) */
            int64_t old_bytes = 4 * (array_floats(&g) + 2 * probs_floats(&g));
            fmt_bytes(omem, sizeof omem, (double)old_bytes);
            int timed = Ts[i] <= 4096 || (comp && Ts[i] <= 16384) || (!comp && Ts[i] == 16384 && old_full_16k);
            int fits = old_bytes < avail * 0.8;
            if (timed && fits) {
                run_forked(1, &g, short_call, 1, min_s, &ro);
                fmt_bytes(rss, sizeof rss, (double)ro.rss_growth);
                if (ro.ok) {
                    print_row(kind, Ts[i], "old", &ro, omem, rss);
                    char cdiff[64] = "";
                    if (comp) snprintf(cdiff, sizeof cdiff, ", dck %.1e, dcv %.1e", ro.diff_dck, ro.diff_dcv);
                    if (n_notes < 8)
                        snprintf(notes[n_notes++], sizeof notes[0],
                                 "%s T=%lld: new/old CPU time forward %.2fx, backward %.2fx, both %.2fx; max rel. "
                                 "difference new vs old: z %.1e, dq %.1e, dk %.1e, dv %.1e%s",
                                 kind, (long long)Ts[i], rn.fwd_cpu / ro.fwd_cpu, rn.bwd_cpu / ro.bwd_cpu,
                                 (rn.fwd_cpu + rn.bwd_cpu) / (ro.fwd_cpu + ro.bwd_cpu), ro.diff_z, ro.diff_dq,
                                 ro.diff_dk, ro.diff_dv, cdiff);
                } else
                    printf("| %s | %lld | old | failed: %s | | | | %s | |\n", kind, (long long)Ts[i], ro.msg, omem);
            } else
                printf("| %s | %lld | old | not run | | | | %s (computed) | |\n", kind, (long long)Ts[i], omem);
            fflush(stdout);
        }
    printf("\n");
    for (int i = 0; i < n_notes; i++) printf("- %s\n", notes[i]);
    printf("- attention memory: arrays (q k v ck cv dz z dq dk dv dck dcv; new: + lse) + new: workspace (ctx ws_peak; "
           "%d thread(s)) / old: probs + dprobs [B, nh, T, ncols]; RSS growth: the child's peak resident memory minus "
           "its size at start (forward only where the backward was not run)\n",
           omp_get_max_threads());
    printf("- not run: the old path for full T >= 16384 (17+ GB; --old-full-16k runs T=16384) and compressed "
           "T=65536 (35 GB)%s; memory available now: %.1f GB\n",
           long_run ? "" : "; the new full-attention backward at T=65536 (--long runs it)", (double)avail / 1e9);
    return 0;
}
