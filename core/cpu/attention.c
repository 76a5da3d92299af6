/* attention.c — CPU attention forward and backward in O(T) memory (flash style); see cpu_attention.h.
 *
 * Geometry (ps_attn_geom): full attention — query t sees raw positions 0..t; compressed — query t sees
 * windows j < ps_windows_seen(t) (keys ck, values cv) and raw positions max(0, t-LW+1)..t; one softmax
 * over all of them, scores q·key/sqrt(hd). Query head n reads KV head n / (nh/nkv).
 *
 * A task is one (sequence, head) in the forward and one (sequence, KV head) in the backward (the query
 * heads of a group add into the same dK/dV slices, so they run in order inside one task). A task walks
 * its query rows in blocks of PS_CPU_ATTN_BLOCK; the block's score matrix S [m, ld] lives in the
 * thread's scratch, ld = the columns the block's last row sees:
 *   full        columns 0..r1-1 (raw positions; one sgemm, the upper triangle masked);
 *   compressed  columns 0..nWb-1 the windows the last row has seen (one sgemm against ck), then LW
 *               columns of the local band (raw position t-LW+1+i in column nWb+i, ps_dot).
 * sgemm runs single-threaded inside the OpenMP region (single_threaded_blas), so the cores split the
 * tasks; every sum has a fixed order: results do not depend on the thread count. */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <string.h>

#include "cpu_attention.h"
#include "ops.h"

#define BLK PS_CPU_ATTN_BLOCK

/* First local-band column (0..LW) that query t sees: the band starts before position 0 for t < LW-1. */
static inline int64_t local_first(int64_t t, int64_t LW) { return t - LW + 1 < 0 ? LW - 1 - t : 0; }

/* C[M, N] = alpha · op(A) · op(B) + beta · C, row-major. */
static void gemm(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                 const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (blasint)M, (blasint)N,
                (blasint)K, alpha, A, (blasint)lda, B, (blasint)ldb, beta, C, (blasint)ldc);
}

static int check_geom(ps_ctx *c, const char *op, const ps_attn_geom *g) {
    int ok = g->B >= 0 && g->T >= 0 && g->nh >= 1 && g->nkv >= 1 && g->hd >= 1 && g->nh % g->nkv == 0;
    if (ok && g->compressed)
        ok = g->W >= 1 && g->S >= 1 && g->LW >= 1 && g->nW >= 0 && g->ncols == g->nW + g->LW;
    else if (ok)
        ok = g->ncols == g->T;
    /* sgemm takes int sizes */
    if (ok) ok = g->ncols < INT32_MAX && g->T < INT32_MAX && g->nh * g->hd < INT32_MAX;
    if (!ok)
        return ps_ctx_fail(c,
                           "%s: invalid geometry B=%lld T=%lld nh=%lld nkv=%lld hd=%lld compressed=%d W=%lld S=%lld "
                           "LW=%lld nW=%lld ncols=%lld",
                           op, (long long)g->B, (long long)g->T, (long long)g->nh, (long long)g->nkv, (long long)g->hd,
                           g->compressed, (long long)g->W, (long long)g->S, (long long)g->LW, (long long)g->nW,
                           (long long)g->ncols);
    return 0;
}

/* Called first in each thread of a kernel's parallel region: sgemm runs single-threaded in there, as the
 * cores already split the tasks. OpenBLAS's OpenMP build goes single-threaded by itself inside an
 * active region (omp_in_parallel); a one-thread region (ctx->threads = 1, or OMP_NUM_THREADS=1) is
 * inactive, and OpenBLAS 0.3.21 then splits each sgemm for omp_get_max_threads() threads — which gives
 * other bits than one sgemm, so results would depend on the thread count. Setting the task's own
 * thread count (it ends with the region) makes it one. */
static void single_threaded_blas(void) { omp_set_num_threads(1); }

/* The team of a kernel: the context's thread count, else the runtime's. The team is not cut down to the
 * number of tasks (a team of two or more is an active region, where BLAS stays single-threaded on any
 * OpenBLAS version); the scratch is: min(threads, tasks) slices (scratch_slot). */
static int kernel_threads(const ps_ctx *c) {
    int nt = c->threads > 0 ? c->threads : omp_get_max_threads();
    return nt < 1 ? 1 : nt;
}

/* Floats of one thread's slice: `bufs` score blocks of BLK × ncols, rounded up to 64 bytes. */
static int64_t slice_floats(const ps_attn_geom *g, int bufs) {
    int64_t n = (int64_t)bufs * BLK * (g->ncols > 0 ? g->ncols : 1);
    return (n + 15) / 16 * 16;
}

/* Slices of scratch for nt threads and `tasks` tasks: one per thread, but never more than tasks. With
 * fewer tasks than threads the kernels schedule statically, one task per thread (thread i runs task i),
 * so the threads that run a task are 0..tasks-1 and own slices 0..tasks-1. */
static int64_t scratch_slices(int nt, int64_t tasks) { return tasks < nt ? tasks : nt; }

int64_t ps_cpu_attn_workspace(const ps_attn_geom *g, int threads, int backward) {
    int64_t tasks = g->B * (backward ? g->nkv : g->nh);
    return scratch_slices(threads < 1 ? 1 : threads, tasks > 0 ? tasks : 1) * slice_floats(g, backward ? 2 : 1);
}

/* Σ_c (row[c] = exp(row[c] - mx)) over [lo, hi): 16 interleaved sums added in a fixed order (vectorises). */
static float exp_sum(float *row, int64_t lo, int64_t hi, float mx) {
    float acc[16] = {0};
    int64_t c = lo;
    for (; c + 16 <= hi; c += 16)
        for (int l = 0; l < 16; l++) acc[l] += (row[c + l] = ps_expf(row[c + l] - mx));
    for (int l = 0; c < hi; c++, l++) acc[l] += (row[c] = ps_expf(row[c] - mx));
    for (int w = 8; w >= 1; w /= 2)
        for (int l = 0; l < w; l++) acc[l] += acc[l + w];
    return acc[0];
}

/* Softmax of one score row in place over the entries it sees, [0, n0) ∪ [lo, hi); [n0, nz) set to 0 (the
 * masked columns the block's sgemm reads). Returns the row's log-sum-exp. (A row always sees itself:
 * the sum is >= 1.) */
static float softmax_lse(float *row, int64_t n0, int64_t nz, int64_t lo, int64_t hi) {
    /* plain compares instead of fmaxf (a libm call that stops vectorisation) */
    float mx = -INFINITY;
    for (int64_t c = 0; c < n0; c++) mx = row[c] > mx ? row[c] : mx;
    for (int64_t c = lo; c < hi; c++) mx = row[c] > mx ? row[c] : mx;
    float sum = exp_sum(row, 0, n0, mx) + exp_sum(row, lo, hi, mx);
    float inv = 1.0f / sum;
    for (int64_t c = 0; c < n0; c++) row[c] *= inv;
    for (int64_t c = n0; c < nz; c++) row[c] = 0.0f;
    for (int64_t c = lo; c < hi; c++) row[c] *= inv;
    return mx + logf(sum);
}

/* Softmax backward of one row from its scores: s becomes P = exp(s - lse), dp becomes
 * dS = P ⊙ (dP − D) · scale over [0, n0) ∪ [lo, hi); both 0 over [n0, nz). */
static void softmax_backward_row(float *s, float *dp, int64_t n0, int64_t nz, int64_t lo, int64_t hi, float lse, float D,
                                 float scale) {
    for (int64_t c = 0; c < n0; c++) {
        float p = ps_expf(s[c] - lse);
        s[c] = p;
        dp[c] = p * (dp[c] - D) * scale;
    }
    for (int64_t c = n0; c < nz; c++) s[c] = dp[c] = 0.0f;
    for (int64_t c = lo; c < hi; c++) {
        float p = ps_expf(s[c] - lse);
        s[c] = p;
        dp[c] = p * (dp[c] - D) * scale;
    }
}

/* ---------------- forward ---------------- */

/* One (sequence b, head n) of full attention. S: scratch of BLK × T floats. */
static void forward_full(float *z, float *lse, const float *q, const float *k, const float *v, const ps_attn_geom *g,
                         int64_t b, int64_t n, float *S) {
    int64_t T = g->T, nh = g->nh, hd = g->hd, kv = n / (nh / g->nkv), qs = nh * hd, ks = g->nkv * hd;
    float scale = 1.0f / sqrtf((float)hd);
    const float *Q = q + b * T * qs + n * hd, *K = k + b * T * ks + kv * hd, *V = v + b * T * ks + kv * hd;
    float *Z = z + b * T * qs + n * hd, *L = lse + (b * nh + n) * T;
    for (int64_t r0 = 0; r0 < T; r0 += BLK) {
        int64_t r1 = r0 + BLK < T ? r0 + BLK : T, m = r1 - r0, ld = r1;
        /* S[m, r1] = Q[r0:r1] · K[0:r1]^T / sqrt(hd) */
        gemm(0, 1, m, r1, hd, scale, Q + r0 * qs, qs, K, ks, 0.0f, S, ld);
        for (int64_t t = r0; t < r1; t++) L[t] = softmax_lse(S + (t - r0) * ld, t + 1, r1, r1, r1);
        /* Z[r0:r1] = P[m, r1] · V[0:r1] */
        gemm(0, 0, m, hd, r1, 1.0f, S, ld, V, ks, 0.0f, Z + r0 * qs, qs);
    }
}

/* One (sequence b, head n) of compressed attention. S: scratch of BLK × (nW + LW) floats. */
static void forward_compressed(float *z, float *lse, const float *q, const float *k, const float *v, const float *ck,
                               const float *cv, const ps_attn_geom *g, int64_t b, int64_t n, float *S) {
    int64_t T = g->T, nh = g->nh, hd = g->hd, kv = n / (nh / g->nkv), qs = nh * hd, ks = g->nkv * hd;
    int64_t nW = g->nW, LW = g->LW;
    float scale = 1.0f / sqrtf((float)hd);
    const float *Q = q + b * T * qs + n * hd, *K = k + b * T * ks + kv * hd, *V = v + b * T * ks + kv * hd;
    const float *CK = nW > 0 ? ck + b * nW * ks + kv * hd : NULL, *CV = nW > 0 ? cv + b * nW * ks + kv * hd : NULL;
    float *Z = z + b * T * qs + n * hd, *L = lse + (b * nh + n) * T;
    for (int64_t r0 = 0; r0 < T; r0 += BLK) {
        int64_t r1 = r0 + BLK < T ? r0 + BLK : T, m = r1 - r0;
        int64_t nWb = ps_windows_seen(r1 - 1, g->W, g->S, nW), ld = nWb + LW; /* windows the block sees */
        /* S[:, 0:nWb] = Q[r0:r1] · CK[0:nWb]^T / sqrt(hd); S[:, nWb + i] = q_t · k_{t-LW+1+i} / sqrt(hd) */
        if (nWb > 0) gemm(0, 1, m, nWb, hd, scale, Q + r0 * qs, qs, CK, ks, 0.0f, S, ld);
        for (int64_t t = r0; t < r1; t++) {
            float *row = S + (t - r0) * ld;
            const float *qt = Q + t * qs;
            int64_t lf = local_first(t, LW);
            for (int64_t i = lf; i < LW; i++) row[nWb + i] = ps_dot(qt, K + (t - LW + 1 + i) * ks, hd) * scale;
            L[t] = softmax_lse(row, ps_windows_seen(t, g->W, g->S, nW), nWb, nWb + lf, ld);
        }
        /* Z[r0:r1] = P[:, 0:nWb] · CV[0:nWb] + Σ band P · v */
        if (nWb > 0) gemm(0, 0, m, hd, nWb, 1.0f, S, ld, CV, ks, 0.0f, Z + r0 * qs, qs);
        else
            for (int64_t t = r0; t < r1; t++) memset(Z + t * qs, 0, (size_t)hd * sizeof(float));
        for (int64_t t = r0; t < r1; t++) {
            const float *row = S + (t - r0) * ld;
            float *zt = Z + t * qs;
            for (int64_t i = local_first(t, LW); i < LW; i++) {
                const float *vt = V + (t - LW + 1 + i) * ks;
                float p = row[nWb + i];
                for (int64_t e = 0; e < hd; e++) zt[e] += p * vt[e];
            }
        }
    }
}

/* Forward task bn = (sequence, head). */
static void forward_task(float *z, float *lse, const float *q, const float *k, const float *v, const float *ck,
                         const float *cv, const ps_attn_geom *g, int64_t bn, float *S) {
    if (g->compressed) forward_compressed(z, lse, q, k, v, ck, cv, g, bn / g->nh, bn % g->nh, S);
    else forward_full(z, lse, q, k, v, g, bn / g->nh, bn % g->nh, S);
}

int ps_cpu_attn_forward(ps_ctx *c, float *z, float *lse, const float *q, const float *k, const float *v,
                        const float *ck, const float *cv, const ps_attn_geom *g) {
    if (c->failed) return -1;
    if (check_geom(c, "attn_forward", g)) return -1;
    int64_t tasks = g->B * g->nh;
    if (tasks == 0 || g->T == 0) return 0;
    int nt = kernel_threads(c);
    int64_t slice = slice_floats(g, 1);
    float *ws = ps_ctx_workspace(c, scratch_slices(nt, tasks) * slice);
    if (!ws) return -1;
#pragma omp parallel num_threads(nt)
    {
        single_threaded_blas();
        float *S = ws + omp_get_thread_num() * slice;
        if (tasks < nt) {
#pragma omp for schedule(static, 1)
            for (int64_t bn = 0; bn < tasks; bn++) forward_task(z, lse, q, k, v, ck, cv, g, bn, S);
        } else {
#pragma omp for schedule(dynamic, 1)
            for (int64_t bn = 0; bn < tasks; bn++) forward_task(z, lse, q, k, v, ck, cv, g, bn, S);
        }
    }
    return 0;
}

/* ---------------- backward ---------------- */

typedef struct {
    float *dq, *dk, *dv, *dck, *dcv;
    const float *dz, *z, *lse, *q, *k, *v, *ck, *cv;
} attn_bw_args;

/* One (sequence b, query head n) of full attention. S, dP: scratch of BLK × T floats each. */
static void backward_full(const attn_bw_args *a, const ps_attn_geom *g, int64_t b, int64_t n, float *S, float *dP) {
    int64_t T = g->T, nh = g->nh, hd = g->hd, kv = n / (nh / g->nkv), qs = nh * hd, ks = g->nkv * hd;
    float scale = 1.0f / sqrtf((float)hd);
    const float *Q = a->q + b * T * qs + n * hd, *K = a->k + b * T * ks + kv * hd, *V = a->v + b * T * ks + kv * hd;
    const float *dZ = a->dz + b * T * qs + n * hd, *Z = a->z + b * T * qs + n * hd, *L = a->lse + (b * nh + n) * T;
    float *dQ = a->dq + b * T * qs + n * hd, *dK = a->dk + b * T * ks + kv * hd, *dV = a->dv + b * T * ks + kv * hd;
    for (int64_t r0 = 0; r0 < T; r0 += BLK) {
        int64_t r1 = r0 + BLK < T ? r0 + BLK : T, m = r1 - r0, ld = r1;
        /* S = Q_blk·K^T / sqrt(hd) (the forward's sgemm: the same scores); dP = dZ_blk·V^T   [m, r1] */
        gemm(0, 1, m, r1, hd, scale, Q + r0 * qs, qs, K, ks, 0.0f, S, ld);
        gemm(0, 1, m, r1, hd, 1.0f, dZ + r0 * qs, qs, V, ks, 0.0f, dP, ld);
        for (int64_t t = r0; t < r1; t++) {
            float D = (float)ps_dot_d(dZ + t * qs, Z + t * qs, hd); /* Σ_c P·dP = dz·z */
            softmax_backward_row(S + (t - r0) * ld, dP + (t - r0) * ld, t + 1, r1, r1, r1, L[t], D, scale);
        }
        /* dV[0:r1] += P^T·dZ_blk ; dQ_blk = dS·K[0:r1] ; dK[0:r1] += dS^T·Q_blk */
        gemm(1, 0, r1, hd, m, 1.0f, S, ld, dZ + r0 * qs, qs, 1.0f, dV, ks);
        gemm(0, 0, m, hd, r1, 1.0f, dP, ld, K, ks, 0.0f, dQ + r0 * qs, qs);
        gemm(1, 0, r1, hd, m, 1.0f, dP, ld, Q + r0 * qs, qs, 1.0f, dK, ks);
    }
}

/* One (sequence b, query head n) of compressed attention. S, dP: scratch of BLK × (nW + LW) floats each. */
static void backward_compressed(const attn_bw_args *a, const ps_attn_geom *g, int64_t b, int64_t n, float *S,
                                float *dP) {
    int64_t T = g->T, nh = g->nh, hd = g->hd, kv = n / (nh / g->nkv), qs = nh * hd, ks = g->nkv * hd;
    int64_t nW = g->nW, LW = g->LW;
    float scale = 1.0f / sqrtf((float)hd);
    const float *Q = a->q + b * T * qs + n * hd, *K = a->k + b * T * ks + kv * hd, *V = a->v + b * T * ks + kv * hd;
    const float *dZ = a->dz + b * T * qs + n * hd, *Z = a->z + b * T * qs + n * hd, *L = a->lse + (b * nh + n) * T;
    const float *CK = nW > 0 ? a->ck + b * nW * ks + kv * hd : NULL, *CV = nW > 0 ? a->cv + b * nW * ks + kv * hd : NULL;
    float *dQ = a->dq + b * T * qs + n * hd, *dK = a->dk + b * T * ks + kv * hd, *dV = a->dv + b * T * ks + kv * hd;
    float *dCK = nW > 0 ? a->dck + b * nW * ks + kv * hd : NULL, *dCV = nW > 0 ? a->dcv + b * nW * ks + kv * hd : NULL;
    for (int64_t r0 = 0; r0 < T; r0 += BLK) {
        int64_t r1 = r0 + BLK < T ? r0 + BLK : T, m = r1 - r0;
        int64_t nWb = ps_windows_seen(r1 - 1, g->W, g->S, nW), ld = nWb + LW;
        /* windows: S = Q_blk·CK^T / sqrt(hd), dP = dZ_blk·CV^T   [m, nWb] */
        if (nWb > 0) {
            gemm(0, 1, m, nWb, hd, scale, Q + r0 * qs, qs, CK, ks, 0.0f, S, ld);
            gemm(0, 1, m, nWb, hd, 1.0f, dZ + r0 * qs, qs, CV, ks, 0.0f, dP, ld);
        }
        for (int64_t t = r0; t < r1; t++) {
            float *srow = S + (t - r0) * ld, *dprow = dP + (t - r0) * ld;
            const float *qt = Q + t * qs, *dzt = dZ + t * qs;
            int64_t lf = local_first(t, LW);
            for (int64_t i = lf; i < LW; i++) { /* the local band: the forward's dot products */
                int64_t tp = t - LW + 1 + i;
                srow[nWb + i] = ps_dot(qt, K + tp * ks, hd) * scale;
                dprow[nWb + i] = ps_dot(dzt, V + tp * ks, hd);
            }
            float D = (float)ps_dot_d(dzt, Z + t * qs, hd);
            softmax_backward_row(srow, dprow, ps_windows_seen(t, g->W, g->S, nW), nWb, nWb + lf, ld, L[t], D, scale);
        }
        /* windows: dCV += P^T·dZ_blk ; dQ_blk = dS·CK ; dCK += dS^T·Q_blk */
        if (nWb > 0) {
            gemm(1, 0, nWb, hd, m, 1.0f, S, ld, dZ + r0 * qs, qs, 1.0f, dCV, ks);
            gemm(0, 0, m, hd, nWb, 1.0f, dP, ld, CK, ks, 0.0f, dQ + r0 * qs, qs);
            gemm(1, 0, nWb, hd, m, 1.0f, dP, ld, Q + r0 * qs, qs, 1.0f, dCK, ks);
        } else
            for (int64_t t = r0; t < r1; t++) memset(dQ + t * qs, 0, (size_t)hd * sizeof(float));
        /* the local band, rows in order: dV += P·dz ; dQ += dS·k ; dK += dS·q */
        for (int64_t t = r0; t < r1; t++) {
            const float *srow = S + (t - r0) * ld, *dsrow = dP + (t - r0) * ld;
            const float *qt = Q + t * qs, *dzt = dZ + t * qs;
            float *dqt = dQ + t * qs;
            for (int64_t i = local_first(t, LW); i < LW; i++) {
                int64_t tp = t - LW + 1 + i;
                float p = srow[nWb + i], ds = dsrow[nWb + i];
                const float *kt = K + tp * ks;
                float *dkt = dK + tp * ks, *dvt = dV + tp * ks;
                for (int64_t e = 0; e < hd; e++) {
                    dvt[e] += p * dzt[e];
                    dqt[e] += ds * kt[e];
                    dkt[e] += ds * qt[e];
                }
            }
        }
    }
}

/* Backward task bk = (sequence, KV head): the group's query heads in order (they add into the same dK,
 * dV, dCK, dCV slices). S, dP: the thread's two score blocks. */
static void backward_task(const attn_bw_args *a, const ps_attn_geom *g, int64_t bk, float *S, float *dP) {
    int64_t b = bk / g->nkv, kv = bk % g->nkv, grp = g->nh / g->nkv;
    for (int64_t n = kv * grp; n < (kv + 1) * grp; n++) {
        if (g->compressed) backward_compressed(a, g, b, n, S, dP);
        else backward_full(a, g, b, n, S, dP);
    }
}

int ps_cpu_attn_backward(ps_ctx *c, float *dq, float *dk, float *dv, float *dck, float *dcv, const float *dz,
                         const float *z, const float *lse, const float *q, const float *k, const float *v,
                         const float *ck, const float *cv, const ps_attn_geom *g) {
    if (c->failed) return -1;
    if (check_geom(c, "attn_backward", g)) return -1;
    int64_t tasks = g->B * g->nkv;
    if (tasks == 0 || g->T == 0) return 0;
    int nt = kernel_threads(c);
    int64_t slice = slice_floats(g, 2);
    float *ws = ps_ctx_workspace(c, scratch_slices(nt, tasks) * slice);
    if (!ws) return -1;
    attn_bw_args a = {dq, dk, dv, dck, dcv, dz, z, lse, q, k, v, ck, cv};
#pragma omp parallel num_threads(nt)
    {
        single_threaded_blas();
        float *S = ws + omp_get_thread_num() * slice;
        if (tasks < nt) {
#pragma omp for schedule(static, 1)
            for (int64_t bk = 0; bk < tasks; bk++) backward_task(&a, g, bk, S, S + slice / 2);
        } else {
#pragma omp for schedule(dynamic, 1)
            for (int64_t bk = 0; bk < tasks; bk++) backward_task(&a, g, bk, S, S + slice / 2);
        }
    }
    return 0;
}
