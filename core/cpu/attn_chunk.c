/* attn_chunk.c — attention of one chunk of a long sequence (prefill) against a key frame and the
 * compressed cache. Query rows in blocks of CHUNK_BLK; per (head, block) one sgemm for the scores against
 * the windows the block's last row sees, one against the raw key rows the block reaches, a masked
 * softmax per row, and two sgemms for the output. Scratch: CHUNK_BLK rows of (windows + raw columns) per
 * thread — O(T) per thread, nothing of size T² anywhere. */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <string.h>

#include "core/cpu/cpu.h"

#define CHUNK_BLK 64

static void gemm_nt(int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda, const float *B,
                    int64_t ldb, float beta, float *C, int64_t ldc) {
    if (M <= 0 || N <= 0) return;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)M, (blasint)N, (blasint)K, alpha, A, (blasint)lda, B,
                (blasint)ldb, beta, C, (blasint)ldc);
}

static void gemm_nn(int64_t M, int64_t N, int64_t K, float beta, const float *A, int64_t lda, const float *B,
                    int64_t ldb, float *C, int64_t ldc) {
    if (M <= 0 || N <= 0 || K <= 0) return;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)M, (blasint)N, (blasint)K, 1.0f, A, (blasint)lda, B,
                (blasint)ldb, beta, C, (blasint)ldc);
}

int ps_cpu_attn_chunk(ps_ctx *ctx, float *z, const float *q, const float *k, const float *v, const float *ck,
                      const float *cv, const ps_attn_frame *f) {
    int64_t nh = f->nh, nkv = f->nkv, hd = f->hd, grp = nh / nkv, Tq = f->Tq, qs = nh * hd, ks = nkv * hd;
    if (Tq <= 0) return 0;
    if (f->q_off < 0 || f->q_off + Tq > f->Tk)
        return ps_ctx_fail(ctx, "attention chunk: query rows [%lld, %lld) outside the key frame of %lld rows",
                           (long long)f->q_off, (long long)(f->q_off + Tq), (long long)f->Tk);
    for (int64_t g = 0; f->compressed && f->woff && g < nkv; g++)
        if (f->woff[g] < 0 || f->woff[g] >= f->S)
            return ps_ctx_fail(ctx, "attention chunk: KV head %lld's grid offset %lld is outside [0, S = %lld)", (long long)g,
                               (long long)f->woff[g], (long long)f->S);
    int64_t nblk = (Tq + CHUNK_BLK - 1) / CHUNK_BLK;
    /* widest row of scores: compressed — every window plus the local band of a block; full — every key */
    int64_t width = f->compressed ? f->nW + f->LW + CHUNK_BLK : f->Tk;
    int nthr = omp_get_max_threads();
    float *ws = ps_ctx_workspace(ctx, (int64_t)nthr * CHUNK_BLK * width);
    if (!ws) return -1;
    float scale = 1.0f / sqrtf((float)hd);
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t task = 0; task < nh * nblk; task++) {
        int64_t n = task / nblk, blk = task % nblk, kv = n / grp;
        int64_t r0 = blk * CHUNK_BLK, r1 = r0 + CHUNK_BLK < Tq ? r0 + CHUNK_BLK : Tq, m = r1 - r0;
        float *P = ws + (int64_t)omp_get_thread_num() * CHUNK_BLK * width;
        const float *Q = q + r0 * qs + n * hd;
        /* columns: [0, ncw) windows, then raw key rows [lo, hi) */
        int64_t hi = f->q_off + r1, lo = 0, ncw = 0, off = f->compressed && f->woff ? f->woff[kv] : 0; /* KV head kv's grid */
        if (f->compressed) {
            lo = f->q_off + r0 - f->LW + 1 > 0 ? f->q_off + r0 - f->LW + 1 : 0;
            ncw = ps_windows_seen_at(f->pos0 + f->q_off + r1 - 1, off, f->W, f->S, f->nW);
        }
        int64_t nc = ncw + (hi - lo);
        gemm_nt(m, ncw, hd, scale, Q, qs, ck + kv * hd, ks, 0.0f, P, nc);
        gemm_nt(m, hi - lo, hd, scale, Q, qs, k + lo * ks + kv * hd, ks, 0.0f, P + ncw, nc);
        for (int64_t i = 0; i < m; i++) {
            float *row = P + i * nc;
            int64_t kr = f->q_off + r0 + i; /* the query's own key row */
            int64_t seen = f->compressed ? ps_windows_seen_at(f->pos0 + kr, off, f->W, f->S, f->nW) : 0;
            int64_t c_lo = ncw + ((f->compressed && kr - f->LW + 1 > lo) ? kr - f->LW + 1 - lo : 0);
            int64_t c_hi = ncw + (kr + 1 - lo);
            float mx = -INFINITY;
            for (int64_t c = 0; c < seen; c++) mx = row[c] > mx ? row[c] : mx;
            for (int64_t c = c_lo; c < c_hi; c++) mx = row[c] > mx ? row[c] : mx;
            float sum = 0.0f;
            for (int64_t c = 0; c < seen; c++) sum += (row[c] = ps_expf_v(row[c] - mx));
            for (int64_t c = c_lo; c < c_hi; c++) sum += (row[c] = ps_expf_v(row[c] - mx));
            float inv = 1.0f / sum;
            for (int64_t c = 0; c < seen; c++) row[c] *= inv;
            for (int64_t c = seen; c < c_lo; c++) row[c] = 0.0f;
            for (int64_t c = c_lo; c < c_hi; c++) row[c] *= inv;
            for (int64_t c = c_hi; c < nc; c++) row[c] = 0.0f;
        }
        float *Z = z + r0 * qs + n * hd;
        if (ncw > 0)
            gemm_nn(m, hd, ncw, 0.0f, P, nc, cv + kv * hd, ks, Z, qs);
        else
            for (int64_t i = 0; i < m; i++) memset(Z + i * qs, 0, (size_t)hd * sizeof(float));
        gemm_nn(m, hd, hi - lo, 1.0f, P + ncw, nc, v + lo * ks + kv * hd, ks, Z, qs);
    }
    return 0;
}
