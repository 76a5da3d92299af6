/* windows.c — the CPU compressor ops over a window table (core/backend.h ps_windows; semantics core/ops.h):
 * the gate, the payloads, the RoPE of the compressed keys and their backward, one op each for the base grid,
 * staggered grids (per-head start offsets) and content chunks alike. Window e = (b, j, h) covers
 * a[b, start[e] + i], i < len[e]; h is the KV head g when each head has its own windows (H = nkv), else 0.
 *
 * Loops whose sums the CPU runs itself (gate, gate gradients, scatters) are one loop for every table, in
 * the order (b, j, i, g). The per-offset payloads hand their products to sgemm, in one of three ways picked
 * from the table (each the arithmetic of the layout-specific op it replaces, bit for bit):
 *   - the base grid (ps_windows_is_base_grid: every head at j*S, every window present): strided sgemm
 *     straight on a, one per offset (and sequence, unless T = nW·S), run in parallel;
 *   - heads sharing their windows (H = 1, e.g. content chunks): per offset i, the rows a[b, start + i] of
 *     every (sequence, window) gathered (zero where i >= len), one sgemm over all KV heads;
 *   - a window per head (H = nkv): per (offset i, head g) the same with that head's rows, one sgemm of hd
 *     columns.
 * The gathered loops run serially in a fixed order (deterministic; sgemm may use its own threads). */
#include <cblas.h>
#include <math.h>
#include <string.h>

#include "core/cpu/cpu.h"

/* the table entry of (sequence b, window j, KV head g) */
static inline int64_t win_e(const ps_windows *w, int64_t b, int64_t j, int64_t g) {
    return (b * w->nW + j) * w->H + (w->H == 1 ? 0 : g);
}

/* ---------------- gate ---------------- */

int ps_cpu_gate(ps_ctx *ctx, float *z, float *alpha, const float *a, const float *u, const float *c, int64_t d,
                const ps_windows *win) {
    (void)ctx;
    int64_t T = win->T, nW = win->nW, nkv = win->nkv, W = win->W, n = win->B * nW * nkv;
#pragma omp parallel for schedule(static) if (n * W * d > 32768)
    for (int64_t idx = 0; idx < n; idx++) {
        int64_t b = idx / (nW * nkv), j = (idx / nkv) % nW, g = idx % nkv, e = win_e(win, b, j, g);
        int64_t L = win->len[e], s0 = win->start[e];
        float *zz = z + idx * W, *al = alpha + idx * W;
        for (int64_t i = 0; i < W; i++) zz[i] = al[i] = 0.0f;
        if (L == 0) continue;
        if (!u) {
            for (int64_t i = 0; i < L; i++) al[i] = 1.0f / (float)L;
            continue;
        }
        float mx = -INFINITY;
        for (int64_t i = 0; i < L; i++) {
            const float *x = a + (b * T + s0 + i) * d, *w = u + (i * nkv + g) * d;
            float s = c[i * nkv + g] + ps_dot(w, x, d);
            zz[i] = s;
            if (s > mx) mx = s;
        }
        float sum = 0.0f;
        for (int64_t i = 0; i < L; i++) sum += (al[i] = ps_expf_v(zz[i] - mx));
        for (int64_t i = 0; i < L; i++) al[i] /= sum;
    }
    return 0;
}

int ps_cpu_gate_backward(ps_ctx *ctx, float *da, float *du, float *dc, float *dalpha, const float *alpha, const float *a,
                         const float *u, int64_t d, const ps_windows *win) {
    (void)ctx;
    int64_t B = win->B, T = win->T, nW = win->nW, nkv = win->nkv, W = win->W, n = B * nW * nkv;
    /* softmax backward, in place (offsets i >= len and absent windows: alpha = 0, so dz = 0) */
#pragma omp parallel for schedule(static) if (n * W > 32768)
    for (int64_t idx = 0; idx < n; idx++) ps_cpu_softmax_rows_backward(dalpha + idx * W, alpha + idx * W, 1, W);
    /* parameter gradients: each (offset, head) owns its row of du and its dc entry; windows in order */
#pragma omp parallel for schedule(static)
    for (int64_t ig = 0; ig < W * nkv; ig++) {
        int64_t i = ig / nkv, g = ig % nkv;
        float *dw = du + ig * d;
        for (int64_t b = 0; b < B; b++)
            for (int64_t j = 0; j < nW; j++) {
                int64_t e = win_e(win, b, j, g);
                if (i >= win->len[e]) continue;
                float dz = dalpha[((b * nW + j) * nkv + g) * W + i];
                const float *x = a + (b * T + win->start[e] + i) * d;
                dc[ig] += dz;
                for (int64_t k = 0; k < d; k++) dw[k] += dz * x[k];
            }
    }
    /* input gradients: each sequence owns its rows (windows may overlap within it) */
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < B; b++)
        for (int64_t j = 0; j < nW; j++)
            for (int64_t i = 0; i < W; i++)
                for (int64_t g = 0; g < nkv; g++) {
                    int64_t e = win_e(win, b, j, g);
                    if (i >= win->len[e]) continue;
                    float dz = dalpha[((b * nW + j) * nkv + g) * W + i];
                    float *dx = da + (b * T + win->start[e] + i) * d;
                    const float *w = u + (i * nkv + g) * d;
                    for (int64_t k = 0; k < d; k++) dx[k] += dz * w[k];
                }
    return 0;
}

/* ---------------- payloads ---------------- */

/* Gather the rows a[b, start + i] of table column h (every (b, j)) into A [B*nW, d] (0 where i >= len). */
static void gather_rows(float *A, const float *a, int64_t d, const ps_windows *win, int64_t i, int64_t h) {
    for (int64_t bj = 0; bj < win->B * win->nW; bj++) {
        int64_t e = bj * win->H + h;
        float *dst = A + bj * d;
        if (i < win->len[e]) memcpy(dst, a + ((bj / win->nW) * win->T + win->start[e] + i) * d, (size_t)d * sizeof(float));
        else memset(dst, 0, (size_t)d * sizeof(float));
    }
}

/* the base grid, per offset: strided sgemm on a (no gather) */
static void payload_base(float *P, const float *a, const float *C, int64_t B, int64_t T, int64_t d, int64_t nW, int64_t W,
                         int64_t S, int64_t nkvhd) {
    /* When T = nW·S, the rows a[b, jS+i] of every (sequence, window) are S·d apart across sequences too:
     * one strided sgemm per offset with M = B·nW. Otherwise one per (offset, sequence). The calls run in
     * parallel, each single-threaded. */
    int batched = T == nW * S;
    int64_t n_calls = batched ? W : W * B, M = batched ? B * nW : nW;
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t ib = 0; ib < n_calls; ib++) {
        int64_t i = batched ? ib : ib / B, b = batched ? 0 : ib % B;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)M, (blasint)nkvhd, (blasint)d, 1.0f,
                    a + (b * T + i) * d, (blasint)(S * d), C + i * nkvhd * d, (blasint)d, 0.0f,
                    P + (b * nW * W + i) * nkvhd, (blasint)(W * nkvhd));
    }
}

int ps_cpu_payload(ps_ctx *ctx, float *P, const float *a, const float *C, int shared, float *scratch, int64_t d, int64_t hd,
                   const ps_windows *win) {
    int64_t B = win->B, T = win->T, nW = win->nW, nkv = win->nkv, W = win->W, nkvhd = nkv * hd;
    if (nW == 0 || B == 0) return 0;
    if (shared) { /* one product for every row, then each window's rows copied (0 where i >= len) */
        ps_cpu_matmul(ctx, scratch, a, C, B * T, d, nkvhd, 0);
#pragma omp parallel for schedule(static)
        for (int64_t bj = 0; bj < B * nW; bj++)
            for (int64_t i = 0; i < W; i++)
                for (int64_t g = 0; g < nkv; g++) {
                    int64_t e = bj * win->H + (win->H == 1 ? 0 : g);
                    float *dst = P + (bj * W + i) * nkvhd + g * hd;
                    if (i < win->len[e])
                        memcpy(dst, scratch + ((bj / nW) * T + win->start[e] + i) * nkvhd + g * hd, (size_t)hd * sizeof(float));
                    else
                        memset(dst, 0, (size_t)hd * sizeof(float));
                }
        return 0;
    }
    if (ps_windows_is_base_grid(win)) {
        payload_base(P, a, C, B, T, d, nW, W, win->S, nkvhd);
        return 0;
    }
    float *A = ps_ctx_workspace(ctx, B * nW * d);
    if (!A) return -1;
    int64_t nh = win->H, cols = win->H == 1 ? nkvhd : hd; /* table columns; output columns per sgemm */
    for (int64_t i = 0; i < W; i++)
        for (int64_t h = 0; h < nh; h++) {
            gather_rows(A, a, d, win, i, h);
            /* P[(b, j), i, h*cols : (h+1)*cols] = A · C_i[h*cols : (h+1)*cols]^T */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)(B * nW), (blasint)cols, (blasint)d, 1.0f, A,
                        (blasint)d, C + (i * nkvhd + h * cols) * d, (blasint)d, 0.0f, P + i * nkvhd + h * cols,
                        (blasint)(W * nkvhd));
        }
    return 0;
}

/* the base grid's per-offset backward: strided sgemm on a and da */
static void payload_base_backward(float *da, float *dC, const float *dP, const float *a, const float *C, int64_t B, int64_t T,
                                  int64_t d, int64_t nW, int64_t W, int64_t S, int64_t nkvhd) {
    /* When T = nW·S the (sequence, window) rows of one offset are evenly strided across sequences, so each
     * offset is one sgemm with B·nW rows (see payload_base); otherwise one per (offset, sequence). */
    int batched = T == nW * S;
    int64_t nb = batched ? 1 : B, M = batched ? B * nW : nW;
    /* dC_i += dP_i^T · A_i: each offset owns its payload matrix */
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t i = 0; i < W; i++)
        for (int64_t b = 0; b < nb; b++)
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (blasint)nkvhd, (blasint)d, (blasint)M, 1.0f,
                        dP + (b * nW * W + i) * nkvhd, (blasint)(W * nkvhd), a + (b * T + i) * d, (blasint)(S * d), 1.0f,
                        dC + i * nkvhd * d, (blasint)d);
    /* da rows += dP_i · C_i. Windows that do not overlap (W <= S): offsets own disjoint rows, one task
     * each; overlapping windows: each sequence owns its rows, offsets in order inside it. */
    if (W <= S) {
#pragma omp parallel for schedule(dynamic, 1)
        for (int64_t i = 0; i < W; i++)
            for (int64_t b = 0; b < nb; b++)
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)M, (blasint)d, (blasint)nkvhd, 1.0f,
                            dP + (b * nW * W + i) * nkvhd, (blasint)(W * nkvhd), C + i * nkvhd * d, (blasint)d, 1.0f,
                            da + (b * T + i) * d, (blasint)(S * d));
        return;
    }
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < W; i++)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)nW, (blasint)d, (blasint)nkvhd, 1.0f,
                        dP + (b * nW * W + i) * nkvhd, (blasint)(W * nkvhd), C + i * nkvhd * d, (blasint)d, 1.0f,
                        da + (b * T + i) * d, (blasint)(S * d));
}

int ps_cpu_payload_backward(ps_ctx *ctx, float *da, float *dC, const float *dP, const float *a, const float *C, int shared,
                            float *scratch, int64_t d, int64_t hd, const ps_windows *win) {
    int64_t B = win->B, T = win->T, nW = win->nW, nkv = win->nkv, W = win->W, nkvhd = nkv * hd;
    if (nW == 0 || B == 0) return 0;
    if (shared) {
        /* dP back to token rows (overlapping windows add up, windows in order), then one matmul backward */
        memset(scratch, 0, (size_t)(B * T * nkvhd) * sizeof(float));
        for (int64_t bj = 0; bj < B * nW; bj++)
            for (int64_t i = 0; i < W; i++)
                for (int64_t g = 0; g < nkv; g++) {
                    int64_t e = bj * win->H + (win->H == 1 ? 0 : g);
                    if (i >= win->len[e]) continue;
                    const float *src = dP + (bj * W + i) * nkvhd + g * hd;
                    float *dst = scratch + ((bj / nW) * T + win->start[e] + i) * nkvhd + g * hd;
                    for (int64_t k = 0; k < hd; k++) dst[k] += src[k];
                }
        ps_cpu_matmul_backward(ctx, da, dC, scratch, a, C, B * T, d, nkvhd);
        return 0;
    }
    if (ps_windows_is_base_grid(win)) {
        payload_base_backward(da, dC, dP, a, C, B, T, d, nW, W, win->S, nkvhd);
        return 0;
    }
    int64_t M = B * nW;
    float *A = ps_ctx_workspace(ctx, 2 * M * d);
    if (!A) return -1;
    float *dA = A + M * d;
    int64_t nh = win->H, cols = win->H == 1 ? nkvhd : hd;
    for (int64_t i = 0; i < W; i++)
        for (int64_t h = 0; h < nh; h++) {
            gather_rows(A, a, d, win, i, h);
            const float *dPih = dP + i * nkvhd + h * cols; /* rows (b, j), stride W*nkvhd; i >= len: dP = 0 */
            const float *Cih = C + (i * nkvhd + h * cols) * d;
            /* dC_i[h's rows] += dP_ih^T · A */
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (blasint)cols, (blasint)d, (blasint)M, 1.0f, dPih,
                        (blasint)(W * nkvhd), A, (blasint)d, 1.0f, dC + (i * nkvhd + h * cols) * d, (blasint)d);
            /* dA = dP_ih · C_ih, scattered back to the rows it came from */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)M, (blasint)d, (blasint)cols, 1.0f, dPih,
                        (blasint)(W * nkvhd), Cih, (blasint)d, 0.0f, dA, (blasint)d);
            for (int64_t bj = 0; bj < M; bj++) {
                int64_t e = bj * nh + h;
                if (i >= win->len[e]) continue;
                float *dx = da + ((bj / nW) * T + win->start[e] + i) * d;
                const float *src = dA + bj * d;
                for (int64_t k = 0; k < d; k++) dx[k] += src[k];
            }
        }
    return 0;
}

/* ---------------- RoPE of the compressed keys ---------------- */

int ps_cpu_rope_windows(ps_ctx *ctx, float *x, const float *cos_t, const float *sin_t, int64_t hd, const ps_windows *win,
                        int inverse) {
    (void)ctx;
    int64_t half = hd / 2, nkv = win->nkv, n = win->B * win->nW * nkv;
    float dir = inverse ? -1.0f : 1.0f;
#pragma omp parallel for schedule(static) if (n * hd > 32768)
    for (int64_t r = 0; r < n; r++) { /* entry (b, j, g) */
        int64_t e = (r / nkv) * win->H + (win->H == 1 ? 0 : r % nkv);
        if (win->start[e] < 0 || win->start[e] >= win->T) continue; /* no position to rotate by (ops.h) */
        const float *c = cos_t + win->start[e] * half, *s = sin_t + win->start[e] * half;
        float *v = x + r * hd;
        for (int64_t i = 0; i < half; i++) { /* the rotation of ps_cpu_rope, term for term */
            float p = v[i], q = v[i + half], sn = dir * s[i];
            v[i] = p * c[i] - q * sn;
            v[i + half] = q * c[i] + p * sn;
        }
    }
    return 0;
}
