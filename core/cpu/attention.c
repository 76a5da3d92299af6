/* attention.c — CPU attention in O(T) memory (flash style): the forward (z and the row log-sum-exp), the
 * backward that recomputes the probabilities from it, and the two ops that materialise the probability
 * rows for a pattern hook (attn_probs, attn_out); see cpu_attention.h.
 *
 * Geometry (ps_attn_geom): full attention — query t sees raw positions 0..t; compressed — query t sees
 * windows j < ps_windows_seen(t) (keys ck, values cv) and raw positions max(0, t-LW+1)..t; one softmax
 * over all of them, scores q·key/sqrt(hd). Query head n reads KV head n / (nh/nkv).
 *
 * A task is one (sequence, head) in the forward and one (sequence, KV head) in the backward (the query
 * heads of a group add into the same dK/dV slices, so they run in order inside one task). A task walks
 * its query rows in blocks of PS_CPU_ATTN_BLOCK (the backward: bwd_rows). A block's scores
 * S [m, nc] (row stride nc = ncols, the column layout of a probability row) live in the thread's scratch;
 * only the columns the block's rows can see are computed:
 *   full        columns 0..r1-1 (raw positions; one sgemm, the upper triangle masked);
 *   compressed  columns 0..nWb-1: the windows the block's last row has seen (one sgemm against ck), and
 *               nW..nc-1: the local band, raw position t-LW+1+i in column nW+i (ps_dot).
 * attn_probs writes the same blocks into the probability matrix and attn_out multiplies them like the
 * forward does, so probs + out give the forward's z bit for bit (a read-only pattern hook changes
 * nothing).
 *
 * sgemm runs single-threaded inside the OpenMP region (single_threaded_blas), so the cores split the
 * tasks; every sum has a fixed order: results do not depend on the thread count. */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <string.h>

#include "core/cpu/cpu.h"
#include "core/cpu/cpu_attention.h"

#define BLK PS_CPU_ATTN_BLOCK
/* Query rows per block of the backward. Full attention at training lengths (T <= 4·BLK): BBLK_SHORT,
 * fewer than the forward's. The three products per block (dV, dQ, dK) run over every column the
 * block's last row sees, the masked upper triangle of the diagonal block included, and at T 72..160 BLK
 * rows would be the whole sequence: 32 rows do 35-40% fewer products there, and fewer exponentials and
 * zeros (16 gains no more). At long T the masked part is small and BLK rows are faster (T = 4096: 32 rows
 * cost 8-10% more), and compressed attention has no triangle to save (its blocks only read the windows
 * the last row has seen; 32 rows cost 0-5% more at T 72..160): BLK there. Depends on the geometry
 * alone: the sums' order does not depend on the thread count. */
#define BBLK_SHORT 32
static int64_t bwd_rows(const ps_attn_geom *g) { return !g->compressed && g->T <= 4 * BLK ? BBLK_SHORT : BLK; }

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

/* ---------------- threads and scratch ---------------- */

/* Called first in each thread of a kernel's parallel region: sgemm runs single-threaded in there, as the
 * cores already split the tasks. OpenBLAS's OpenMP build goes single-threaded by itself inside an
 * active region (omp_in_parallel); a one-thread region (ctx->threads = 1, or OMP_NUM_THREADS=1) is
 * inactive, and OpenBLAS 0.3.21 then splits each sgemm for omp_get_max_threads() threads — which gives
 * other bits than one sgemm, so results would depend on the thread count. Setting the task's own
 * thread count (it ends with the region) makes it one. */
static void single_threaded_blas(void) { omp_set_num_threads(1); }

/* The team of a kernel: the context's thread count, else the runtime's. The team is not cut down to the
 * number of tasks (a team of two or more is an active region, where BLAS stays single-threaded on any
 * OpenBLAS version); the scratch is (scratch_slices). */
static int kernel_threads(const ps_ctx *c) {
    int nt = c->threads > 0 ? c->threads : omp_get_max_threads();
    return nt < 1 ? 1 : nt;
}

/* Floats of one thread's slice: the forward one score block of BLK × ncols, the backward two of
 * bwd_rows × ncols (S and dP), rounded up to 64 bytes. */
static int64_t slice_floats(const ps_attn_geom *g, int backward) {
    int64_t n = (backward ? 2 * bwd_rows(g) : BLK) * (g->ncols > 0 ? g->ncols : 1);
    return (n + 15) / 16 * 16;
}

/* Slices of scratch for nt threads and `tasks` tasks: one per thread, but never more than tasks. With
 * fewer tasks than threads the kernels schedule statically, one task per thread (thread i runs task i),
 * so the threads that run a task are 0..tasks-1 and own slices 0..tasks-1. */
static int64_t scratch_slices(int nt, int64_t tasks) { return tasks < nt ? tasks : nt; }

int64_t ps_cpu_attn_workspace(const ps_attn_geom *g, int threads, int backward) {
    int64_t tasks = g->B * (backward ? g->nkv : g->nh);
    return scratch_slices(threads < 1 ? 1 : threads, tasks > 0 ? tasks : 1) * slice_floats(g, backward);
}

/* Everything a task reads or writes (the op's arguments). */
typedef struct {
    const ps_attn_geom *g;
    float *z, *lse, *probs;                 /* forward outputs */
    float *dq, *dk, *dv, *dck, *dcv;        /* backward outputs */
    const float *dz, *zin, *lse_in, *q, *k, *v, *ck, *cv, *probs_in;
    int64_t slice; /* floats of a thread's scratch slice */
} attn_args;

typedef void (*task_fn)(const attn_args *a, int64_t task, float *scratch);

/* Tasks 0..tasks-1 on nt threads, thread i with scratch ws + i·slice (ws may be NULL). */
static void run_tasks(int nt, int64_t tasks, float *ws, task_fn f, const attn_args *a) {
#pragma omp parallel num_threads(nt)
    {
        single_threaded_blas();
        float *scratch = ws ? ws + omp_get_thread_num() * a->slice : NULL;
        if (tasks < nt) {
#pragma omp for schedule(static, 1)
            for (int64_t i = 0; i < tasks; i++) f(a, i, scratch);
        } else {
#pragma omp for schedule(dynamic, 1)
            for (int64_t i = 0; i < tasks; i++) f(a, i, scratch);
        }
    }
}

/* ---------------- one head, one block of query rows ---------------- */

/* The rows of one (sequence, query head): row t of q/z/dz/dq at +t·qs, of k/v/dk/dv at +t·ks, window j
 * of ck/cv/dck/dcv at +j·ks (NULL without windows). */
typedef struct {
    const float *q, *k, *v, *ck, *cv, *dz, *z;
    float *zo, *dq, *dk, *dv, *dck, *dcv;
    int64_t qs, ks;
    int64_t b, kv; /* the sequence and KV head (their window grid or chunks: ps_geom_seen) */
} head;

static head head_of(const attn_args *a, int64_t b, int64_t n) {
    const ps_attn_geom *g = a->g;
    int64_t T = g->T, nW = g->nW, kv = n / (g->nh / g->nkv), qs = g->nh * g->hd, ks = g->nkv * g->hd;
    int64_t qo = b * T * qs + n * g->hd, ko = b * T * ks + kv * g->hd, co = b * nW * ks + kv * g->hd;
    int win = g->compressed && nW > 0;
    head h = {.qs = qs, .ks = ks, .b = b, .kv = kv};
    h.q = a->q ? a->q + qo : NULL, h.k = a->k ? a->k + ko : NULL, h.v = a->v ? a->v + ko : NULL;
    h.ck = win && a->ck ? a->ck + co : NULL, h.cv = win && a->cv ? a->cv + co : NULL;
    h.dz = a->dz ? a->dz + qo : NULL, h.z = a->zin ? a->zin + qo : NULL;
    h.zo = a->z ? a->z + qo : NULL, h.dq = a->dq ? a->dq + qo : NULL;
    h.dk = a->dk ? a->dk + ko : NULL, h.dv = a->dv ? a->dv + ko : NULL;
    h.dck = win && a->dck ? a->dck + co : NULL, h.dcv = win && a->dcv ? a->dcv + co : NULL;
    return h;
}

/* Windows the block's rows read: those its last row r1-1 has seen (0 for full attention). */
static int64_t block_windows(const ps_attn_geom *g, const head *h, int64_t r1) {
    return g->compressed ? ps_geom_seen(g, h->b, h->kv, r1 - 1) : 0;
}

/* ps_dot(a, b, n), the same sums in the same order — 16 lanes, lane l adds the products of elements
 * i ≡ l (mod 16) in order, a tail of 8 into lanes 0..7; then the lanes folded 8, 4, 2, 1 — so the same
 * float, bit for bit. For n a multiple of 8 (head dims 8, 16, 32, 64) the lanes are two fixed arrays of 8,
 * which gcc keeps in vector registers; ps_dot's variable tail loop and fold loop keep them in memory and
 * cost more than the products for the short rows of a band. Other n: ps_dot itself. */
static inline float band_dot(const float *restrict a, const float *restrict b, int64_t n) {
    if (n == 8) { /* lanes 8..15 stay 0 and 0 + x is never -0: the fold adds nothing there */
        float p[8];
        for (int l = 0; l < 8; l++) p[l] = 0.0f + a[l] * b[l];
        return ((p[0] + p[4]) + (p[2] + p[6])) + ((p[1] + p[5]) + (p[3] + p[7]));
    }
    if (n % 8) return ps_dot(a, b, n);
    float lo[8] = {0}, hi[8] = {0};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        for (int l = 0; l < 8; l++) lo[l] += a[i + l] * b[i + l];
        for (int l = 0; l < 8; l++) hi[l] += a[i + 8 + l] * b[i + 8 + l];
    }
    if (i < n) /* 8 left */
        for (int l = 0; l < 8; l++) lo[l] += a[i + l] * b[i + l];
    for (int l = 0; l < 8; l++) lo[l] += hi[l];
    for (int l = 0; l < 4; l++) lo[l] += lo[l + 4];
    lo[0] += lo[2], lo[1] += lo[3];
    return lo[0] + lo[1];
}

/* Scaled scores of rows r0..r1 into S (row t at S + (t-r0)·nc): full — columns [0, r1); compressed —
 * windows [0, nWb) and the band [nW + local_first(t), nc). Other columns are not written. With
 * dz (backward), also dP = dz·value over the same columns into dP. */
static void scores_block(float *S, float *dP, const head *h, const ps_attn_geom *g, int64_t r0, int64_t r1) {
    int64_t nc = g->ncols, hd = g->hd, qs = h->qs, ks = h->ks, m = r1 - r0;
    float scale = 1.0f / sqrtf((float)hd);
    if (!g->compressed) {
        gemm(0, 1, m, r1, hd, scale, h->q + r0 * qs, qs, h->k, ks, 0.0f, S, nc);
        if (dP) gemm(0, 1, m, r1, hd, 1.0f, h->dz + r0 * qs, qs, h->v, ks, 0.0f, dP, nc);
        return;
    }
    int64_t nW = g->nW, LW = g->LW, nWb = block_windows(g, h, r1);
    if (nWb > 0) {
        gemm(0, 1, m, nWb, hd, scale, h->q + r0 * qs, qs, h->ck, ks, 0.0f, S, nc);
        if (dP) gemm(0, 1, m, nWb, hd, 1.0f, h->dz + r0 * qs, qs, h->cv, ks, 0.0f, dP, nc);
    }
    for (int64_t t = r0; t < r1; t++) {
        const float *qt = h->q + t * qs;
        for (int64_t i = local_first(t, LW); i < LW; i++) {
            int64_t tp = t - LW + 1 + i;
            S[(t - r0) * nc + nW + i] = band_dot(qt, h->k + tp * ks, hd) * scale;
            if (dP) dP[(t - r0) * nc + nW + i] = band_dot(h->dz + t * qs, h->v + tp * ks, hd);
        }
    }
}

/* Softmax of one score row in place over the entries it sees, [0, n0) ∪ [lo, hi); [n0, nz) set to 0 (the
 * masked columns the block's sgemm reads). Returns the row's log-sum-exp. (A row always sees itself:
 * the sum is >= 1.) */
static float softmax_lse(float *row, int64_t n0, int64_t nz, int64_t lo, int64_t hi) {
    /* plain compares instead of fmaxf (a libm call that stops vectorisation) */
    float mx = -INFINITY;
    for (int64_t c = 0; c < n0; c++) mx = row[c] > mx ? row[c] : mx;
    for (int64_t c = lo; c < hi; c++) mx = row[c] > mx ? row[c] : mx;
    float sum = ps_cpu_exp_sum(row, 0, n0, mx) + ps_cpu_exp_sum(row, lo, hi, mx);
    float inv = 1.0f / sum;
    for (int64_t c = 0; c < n0; c++) row[c] *= inv;
    for (int64_t c = n0; c < nz; c++) row[c] = 0.0f;
    for (int64_t c = lo; c < hi; c++) row[c] *= inv;
    return mx + logf(sum);
}

/* The entries row t sees as [0, *n0) ∪ [*lo, *hi), and *nz: the end of the masked columns the block's
 * sgemms read, [n0, nz). */
static void row_columns(const ps_attn_geom *g, const head *h, int64_t t, int64_t r1, int64_t *n0, int64_t *nz, int64_t *lo,
                        int64_t *hi) {
    if (!g->compressed) {
        *n0 = t + 1, *nz = r1, *lo = *hi = r1;
        return;
    }
    *n0 = ps_geom_seen(g, h->b, h->kv, t), *nz = block_windows(g, h, r1);
    *lo = g->nW + local_first(t, g->LW), *hi = g->ncols;
}

/* Scores of rows r0..r1 (scores_block) into probabilities in place; each row's lse into L[t] (L may be NULL). */
static void softmax_block(float *P, float *L, const head *h, const ps_attn_geom *g, int64_t r0, int64_t r1) {
    for (int64_t t = r0; t < r1; t++) {
        int64_t n0, nz, lo, hi;
        row_columns(g, h, t, r1, &n0, &nz, &lo, &hi);
        float l = softmax_lse(P + (t - r0) * g->ncols, n0, nz, lo, hi);
        if (L) L[t] = l;
    }
}

/* z rows r0..r1 (=) from the block's probabilities P (row stride nc) over the columns the block reads:
 * full — P[:, 0:r1] · v[0:r1]; compressed — P[:, 0:nWb] · cv[0:nWb], then the band row by row. */
static void out_block(float *Z, const float *P, const head *h, const ps_attn_geom *g, int64_t r0, int64_t r1) {
    int64_t nc = g->ncols, hd = g->hd, qs = h->qs, ks = h->ks, m = r1 - r0;
    if (!g->compressed) {
        gemm(0, 0, m, hd, r1, 1.0f, P, nc, h->v, ks, 0.0f, Z + r0 * qs, qs);
        return;
    }
    int64_t nW = g->nW, LW = g->LW, nWb = block_windows(g, h, r1);
    if (nWb > 0) gemm(0, 0, m, hd, nWb, 1.0f, P, nc, h->cv, ks, 0.0f, Z + r0 * qs, qs);
    else
        for (int64_t t = r0; t < r1; t++) memset(Z + t * qs, 0, (size_t)hd * sizeof(float));
    for (int64_t t = r0; t < r1; t++) {
        const float *row = P + (t - r0) * nc;
        float *zt = Z + t * qs;
        for (int64_t i = local_first(t, LW); i < LW; i++) {
            const float *vt = h->v + (t - LW + 1 + i) * ks;
            float p = row[nW + i];
            for (int64_t e = 0; e < hd; e++) zt[e] += p * vt[e];
        }
    }
}

/* ---------------- forward ---------------- */

/* Task (sequence, head): blocks of scores → probabilities and lse → z. S: BLK × nc scratch. */
static void forward_task(const attn_args *a, int64_t bn, float *S) {
    const ps_attn_geom *g = a->g;
    int64_t b = bn / g->nh, n = bn % g->nh, T = g->T;
    head h = head_of(a, b, n);
    float *L = a->lse + bn * T;
    for (int64_t r0 = 0; r0 < T; r0 += BLK) {
        int64_t r1 = r0 + BLK < T ? r0 + BLK : T;
        scores_block(S, NULL, &h, g, r0, r1);
        softmax_block(S, L, &h, g, r0, r1);
        out_block(h.zo, S, &h, g, r0, r1);
    }
}

int ps_cpu_attn_forward(ps_ctx *c, float *z, float *lse, const float *q, const float *k, const float *v,
                        const float *ck, const float *cv, const ps_attn_geom *g) {
    if (c->failed) return -1;
    if (check_geom(c, "attn_forward", g)) return -1;
    int64_t tasks = g->B * g->nh;
    if (tasks == 0 || g->T == 0) return 0;
    int nt = kernel_threads(c);
    attn_args a = {.g = g, .z = z, .lse = lse, .q = q, .k = k, .v = v, .ck = ck, .cv = cv, .slice = slice_floats(g, 0)};
    float *ws = ps_ctx_workspace(c, scratch_slices(nt, tasks) * a.slice);
    if (!ws) return -1;
    run_tasks(nt, tasks, ws, forward_task, &a);
    return 0;
}

/* ---------------- materialised probabilities (pattern hooks) ---------------- */

/* Task (sequence, head): the forward's blocks written into probs [T, nc], the columns no row of a block
 * reads set to 0. */
static void probs_task(const attn_args *a, int64_t bn, float *unused) {
    (void)unused;
    const ps_attn_geom *g = a->g;
    int64_t b = bn / g->nh, n = bn % g->nh, T = g->T, nc = g->ncols;
    head h = head_of(a, b, n);
    for (int64_t r0 = 0; r0 < T; r0 += BLK) {
        int64_t r1 = r0 + BLK < T ? r0 + BLK : T;
        float *P = a->probs + (bn * T + r0) * nc;
        scores_block(P, NULL, &h, g, r0, r1);
        softmax_block(P, NULL, &h, g, r0, r1);
        for (int64_t t = r0; t < r1; t++) {
            float *row = P + (t - r0) * nc;
            if (!g->compressed) {
                memset(row + r1, 0, (size_t)(nc - r1) * sizeof(float));
                continue;
            }
            int64_t nWb = block_windows(g, &h, r1), lf = local_first(t, g->LW);
            memset(row + nWb, 0, (size_t)(g->nW - nWb + lf) * sizeof(float)); /* [nWb, nW + lf) */
        }
    }
}

int ps_cpu_attn_probs(ps_ctx *c, float *probs, const float *q, const float *k, const float *ck, const ps_attn_geom *g) {
    if (c->failed) return -1;
    if (check_geom(c, "attn_probs", g)) return -1;
    int64_t tasks = g->B * g->nh;
    if (tasks == 0 || g->T == 0) return 0;
    attn_args a = {.g = g, .probs = probs, .q = q, .k = k, .ck = ck};
    run_tasks(kernel_threads(c), tasks, NULL, probs_task, &a);
    return 0;
}

/* Task (sequence, head): z from probs [T, nc], block by block as the forward multiplies. */
static void out_task(const attn_args *a, int64_t bn, float *unused) {
    (void)unused;
    const ps_attn_geom *g = a->g;
    int64_t b = bn / g->nh, n = bn % g->nh, T = g->T, nc = g->ncols;
    head h = head_of(a, b, n);
    for (int64_t r0 = 0; r0 < T; r0 += BLK) {
        int64_t r1 = r0 + BLK < T ? r0 + BLK : T;
        out_block(h.zo, a->probs_in + (bn * T + r0) * nc, &h, g, r0, r1);
    }
}

int ps_cpu_attn_out(ps_ctx *c, float *z, const float *probs, const float *v, const float *cv, const ps_attn_geom *g) {
    if (c->failed) return -1;
    if (check_geom(c, "attn_out", g)) return -1;
    int64_t tasks = g->B * g->nh;
    if (tasks == 0 || g->T == 0) return 0;
    attn_args a = {.g = g, .z = z, .probs_in = probs, .v = v, .cv = cv};
    run_tasks(kernel_threads(c), tasks, NULL, out_task, &a);
    return 0;
}

/* ---------------- backward ---------------- */

/* Softmax backward of one row from its scores: s becomes P = exp(s - lse), dp becomes
 * dS = P ⊙ (dP − D) · scale over [0, n0) ∪ [lo, hi); both 0 over [n0, nz). */
static void softmax_backward_row(float *restrict s, float *restrict dp, int64_t n0, int64_t nz, int64_t lo, int64_t hi,
                                 float lse, float D, float scale) {
    /* the exponentials first (ps_expf_v: ps_expf's floats), then dS: each loop vectorises */
    for (int64_t c = 0; c < n0; c++) s[c] = ps_expf_v(s[c] - lse);
    for (int64_t c = lo; c < hi; c++) s[c] = ps_expf_v(s[c] - lse);
    for (int64_t c = 0; c < n0; c++) dp[c] = s[c] * (dp[c] - D) * scale;
    for (int64_t c = n0; c < nz; c++) s[c] = dp[c] = 0.0f;
    for (int64_t c = lo; c < hi; c++) dp[c] = s[c] * (dp[c] - D) * scale;
}

/* One band entry (query row t, key row tp) of the backward: dv[tp] += p·dz[t]; dq[t] += ds·k[tp];
 * dk[tp] += ds·q[t], element by element (the rows are of different arrays: restrict lets gcc vectorise). */
static inline void band_update(float *restrict dvt, float *restrict dqt, float *restrict dkt, const float *restrict dzt,
                               const float *restrict kt, const float *restrict qt, float p, float ds, int64_t hd) {
    for (int64_t e = 0; e < hd; e++) {
        dvt[e] += p * dzt[e];
        dqt[e] += ds * kt[e];
        dkt[e] += ds * qt[e];
    }
}

/* One (sequence, query head), block by block (bwd_rows rows): S and dP (scores_block, the forward's
 * scores), P and dS from lse and D = dz·z, then
 *   full        dV[0:r1] += P^T·dZ_blk ; dQ_blk = dS·K[0:r1] ; dK[0:r1] += dS^T·Q_blk
 *   compressed  the same against the windows [0, nWb) (dCV, dCK), then the band row by row.
 * S, dP: bwd_rows × nc scratch each. */
static void backward_head(const attn_args *a, int64_t b, int64_t n, float *S, float *dP) {
    const ps_attn_geom *g = a->g;
    int64_t T = g->T, nc = g->ncols, hd = g->hd, nW = g->nW, LW = g->LW;
    float scale = 1.0f / sqrtf((float)hd);
    head h = head_of(a, b, n);
    int64_t qs = h.qs, ks = h.ks;
    const float *L = a->lse_in + (b * g->nh + n) * T;
    int64_t rows = bwd_rows(g);
    for (int64_t r0 = 0; r0 < T; r0 += rows) {
        int64_t r1 = r0 + rows < T ? r0 + rows : T, m = r1 - r0;
        scores_block(S, dP, &h, g, r0, r1);
        for (int64_t t = r0; t < r1; t++) {
            int64_t n0, nz, lo, hi;
            row_columns(g, &h, t, r1, &n0, &nz, &lo, &hi);
            float D = (float)ps_dot_d(h.dz + t * qs, h.z + t * qs, hd); /* Σ_c P·dP = dz·z */
            softmax_backward_row(S + (t - r0) * nc, dP + (t - r0) * nc, n0, nz, lo, hi, L[t], D, scale);
        }
        if (!g->compressed) {
            gemm(1, 0, r1, hd, m, 1.0f, S, nc, h.dz + r0 * qs, qs, 1.0f, h.dv, ks);
            gemm(0, 0, m, hd, r1, 1.0f, dP, nc, h.k, ks, 0.0f, h.dq + r0 * qs, qs);
            gemm(1, 0, r1, hd, m, 1.0f, dP, nc, h.q + r0 * qs, qs, 1.0f, h.dk, ks);
            continue;
        }
        int64_t nWb = block_windows(g, &h, r1);
        if (nWb > 0) {
            gemm(1, 0, nWb, hd, m, 1.0f, S, nc, h.dz + r0 * qs, qs, 1.0f, h.dcv, ks);
            gemm(0, 0, m, hd, nWb, 1.0f, dP, nc, h.ck, ks, 0.0f, h.dq + r0 * qs, qs);
            gemm(1, 0, nWb, hd, m, 1.0f, dP, nc, h.q + r0 * qs, qs, 1.0f, h.dck, ks);
        } else
            for (int64_t t = r0; t < r1; t++) memset(h.dq + t * qs, 0, (size_t)hd * sizeof(float));
        /* the band, rows in order: dV += P·dz ; dQ += dS·k ; dK += dS·q */
        for (int64_t t = r0; t < r1; t++) {
            const float *srow = S + (t - r0) * nc, *dsrow = dP + (t - r0) * nc;
            for (int64_t i = local_first(t, LW); i < LW; i++) {
                int64_t tp = t - LW + 1 + i;
                band_update(h.dv + tp * ks, h.dq + t * qs, h.dk + tp * ks, h.dz + t * qs, h.k + tp * ks, h.q + t * qs,
                            srow[nW + i], dsrow[nW + i], hd);
            }
        }
    }
}

/* Task (sequence, KV head): the group's query heads in order (they add into the same dK, dV, dCK, dCV
 * slices). Scratch: S and dP, bwd_rows × nc each (the two halves of the slice). */
static void backward_task(const attn_args *a, int64_t bk, float *scratch) {
    const ps_attn_geom *g = a->g;
    int64_t b = bk / g->nkv, kv = bk % g->nkv, grp = g->nh / g->nkv;
    for (int64_t n = kv * grp; n < (kv + 1) * grp; n++) backward_head(a, b, n, scratch, scratch + a->slice / 2);
}

int ps_cpu_attn_backward(ps_ctx *c, float *dq, float *dk, float *dv, float *dck, float *dcv, const float *dz,
                         const float *z, const float *lse, const float *q, const float *k, const float *v,
                         const float *ck, const float *cv, const ps_attn_geom *g) {
    if (c->failed) return -1;
    if (check_geom(c, "attn_backward", g)) return -1;
    int64_t tasks = g->B * g->nkv;
    if (tasks == 0 || g->T == 0) return 0;
    int nt = kernel_threads(c);
    attn_args a = {.g = g, .dq = dq, .dk = dk, .dv = dv, .dck = dck, .dcv = dcv, .dz = dz, .zin = z,
                   .lse_in = lse, .q = q, .k = k, .v = v, .ck = ck, .cv = cv, .slice = slice_floats(g, 1)};
    float *ws = ps_ctx_workspace(c, scratch_slices(nt, tasks) * a.slice);
    if (!ws) return -1;
    run_tasks(nt, tasks, ws, backward_task, &a);
    return 0;
}
