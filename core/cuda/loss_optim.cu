/* loss_optim.cu — cross-entropy (one block per row; the per-row losses are summed on the host in row
 * order, as the CPU does), the sum of squares for gradient clipping (fixed blocks, then a fixed tree over
 * the block sums: the same value on every run) and AdamW (every segment in one launch; the CPU's
 * operations in its order, without fused multiply-adds: bit-identical updates). */
#include <stdlib.h>
#include <string.h>

#include "core/cuda/cuda_internal.cuh"

__global__ void k_cross_entropy(double *row_loss, float *dlogits, const float *logits, const int32_t *tg, int64_t n_rows,
                                int64_t V, float scale) {
    __shared__ double shd[32];
    __shared__ float shf[32];
    for (int64_t r = blockIdx.x; r < n_rows; r += gridDim.x) {
        const float *x = logits + r * V;
        float *dx = dlogits ? dlogits + r * V : NULL;
        int32_t y = tg[r];
        if (y < 0) {
            if (dx)
                for (int64_t i = threadIdx.x; i < V; i += blockDim.x) dx[i] = 0.0f;
            if (threadIdx.x == 0) row_loss[r] = 0;
            continue;
        }
        float mx = -INFINITY;
        for (int64_t i = threadIdx.x; i < V; i += blockDim.x) mx = fmaxf(mx, x[i]);
        mx = block_max(mx, shf);
        double acc = 0;
        for (int64_t i = threadIdx.x; i < V; i += blockDim.x) {
            float e = expf(x[i] - mx);
            if (dx) dx[i] = e;
            acc += (double)e;
        }
        double sum = block_sum(acc, shd);
        if (threadIdx.x == 0) row_loss[r] = log(sum) + (double)mx - (double)x[y];
        if (dx) {
            float fs = (float)(1.0 / sum) * scale;
            for (int64_t i = threadIdx.x; i < V; i += blockDim.x) dx[i] = i == y ? dx[i] * fs - scale : dx[i] * fs;
        }
        __syncthreads();
    }
}

extern "C" int ps_cuda_cross_entropy(ps_ctx *c, double *loss_sum, int64_t *n_targets, float *dlogits, const float *logits,
                                     const int32_t *targets, int64_t n_rows, int64_t V, float scale) {
    if (n_rows <= 0) return 0;
    double *row_loss = (double *)ps_ctx_workspace(c, 2 * n_rows);
    if (!row_loss) return -1;
    const void *h[1] = {targets};
    int64_t by[1] = {n_rows * 4};
    void *d[1];
    if (cu_stage(c, 1, h, by, d)) return -1;
    k_cross_entropy<<<cu_grid(n_rows, 1), 512, 0, STREAM(c)>>>(row_loss, dlogits, logits, (const int32_t *)d[0], n_rows, V,
                                                              scale);
    if (CU_LAUNCHED(c, "cross entropy")) return -1;
    double *host = (double *)malloc((size_t)n_rows * sizeof(double));
    if (!host) return ps_ctx_fail(c, "cuda cross entropy: out of host memory for %lld row losses", (long long)n_rows);
    if (ps_cuda_to_host(c, host, row_loss, n_rows * (int64_t)sizeof(double))) {
        free(host);
        return -1;
    }
    int64_t count = 0;
    for (int64_t r = 0; r < n_rows; r++)
        if (targets[r] >= 0) {
            *loss_sum += host[r];
            count++;
        }
    free(host);
    if (n_targets) *n_targets += count;
    return 0;
}

#define SUMSQ_BLK 4096

__global__ void k_sumsq_blocks(double *part, const float *x, int64_t n) {
    __shared__ double sh[32];
    for (int64_t b = blockIdx.x; b * SUMSQ_BLK < n; b += gridDim.x) {
        int64_t i0 = b * SUMSQ_BLK, i1 = i0 + SUMSQ_BLK < n ? i0 + SUMSQ_BLK : n;
        double acc = 0;
        for (int64_t i = i0 + threadIdx.x; i < i1; i += blockDim.x) acc += (double)x[i] * x[i];
        acc = block_sum(acc, sh);
        if (threadIdx.x == 0) part[b] = acc;
    }
}

__global__ void k_sum_parts(double *out, const double *part, int64_t nb) {
    __shared__ double sh[32];
    double acc = 0;
    for (int64_t b = threadIdx.x; b < nb; b += blockDim.x) acc += part[b];
    acc = block_sum(acc, sh);
    if (threadIdx.x == 0) *out = acc;
}

extern "C" int ps_cuda_sumsq(ps_ctx *c, double *out, const float *x, int64_t n) {
    if (n <= 0) {
        *out = 0;
        return 0;
    }
    int64_t nb = (n + SUMSQ_BLK - 1) / SUMSQ_BLK;
    double *part = (double *)ps_ctx_workspace(c, 2 * nb);
    if (!part) return -1;
    k_sumsq_blocks<<<cu_grid(nb, 1), 256, 0, STREAM(c)>>>(part, x, n);
    k_sum_parts<<<1, 1024, 0, STREAM(c)>>>(CU(c)->dscal, part, nb);
    if (CU_LAUNCHED(c, "sumsq")) return -1;
    return ps_cuda_to_host(c, out, CU(c)->dscal, (int64_t)sizeof(double));
}

typedef struct {
    int64_t offset, n, first_chunk;
    float lr, wd;
} adam_seg;

#define ADAM_CH 4096

__global__ void k_adamw(float *w, float *m1, float *m2, const float *g, const adam_seg *segs, int n_segs, int64_t n_chunks,
                        float b1, float b2, float eps, float cs, float ib1, float ib2) {
    for (int64_t k = blockIdx.x; k < n_chunks; k += gridDim.x) {
        int lo = 0, hi = n_segs - 1; /* the last segment whose first chunk is <= k */
        while (lo < hi) {
            int mid = (lo + hi + 1) / 2;
            if (segs[mid].first_chunk <= k) lo = mid;
            else hi = mid - 1;
        }
        const adam_seg s = segs[lo];
        int64_t j0 = (k - s.first_chunk) * ADAM_CH, j1 = j0 + ADAM_CH < s.n ? j0 + ADAM_CH : s.n;
        float *ww = w + s.offset, *mm = m1 + s.offset, *vv = m2 + s.offset;
        const float *gg = g + s.offset;
        for (int64_t j = j0 + threadIdx.x; j < j1; j += blockDim.x) {
            /* the CPU's expression, term by term (no contraction into fused multiply-adds) */
            float gj = __fmul_rn(gg[j], cs);
            float m = __fadd_rn(__fmul_rn(b1, mm[j]), __fmul_rn(__fsub_rn(1.0f, b1), gj));
            float v = __fadd_rn(__fmul_rn(b2, vv[j]), __fmul_rn(__fmul_rn(__fsub_rn(1.0f, b2), gj), gj));
            mm[j] = m;
            vv[j] = v;
            float mh = __fmul_rn(m, ib1), vh = __fmul_rn(v, ib2), wj = ww[j];
            float upd = __fadd_rn(__fdiv_rn(mh, __fadd_rn(__fsqrt_rn(vh), eps)), __fmul_rn(s.wd, wj));
            ww[j] = __fsub_rn(wj, __fmul_rn(s.lr, upd));
        }
    }
}

extern "C" int ps_cuda_adamw(ps_ctx *c, float *w, float *m1, float *m2, const float *g, const ps_adamw_seg *segs, int n_segs,
                             const ps_adamw_hyper *h) {
    if (n_segs <= 0) return 0;
    adam_seg *as = (adam_seg *)malloc((size_t)n_segs * sizeof *as);
    if (!as) return ps_ctx_fail(c, "cuda adamw: out of host memory for %d segments", n_segs);
    int64_t chunks = 0;
    int m = 0;
    for (int i = 0; i < n_segs; i++) {
        if (segs[i].n <= 0) continue;
        as[m].offset = segs[i].offset, as[m].n = segs[i].n, as[m].first_chunk = chunks;
        as[m].lr = segs[i].lr, as[m].wd = segs[i].weight_decay;
        chunks += (segs[i].n + ADAM_CH - 1) / ADAM_CH;
        m++;
    }
    if (!m) {
        free(as);
        return 0;
    }
    const void *hs[1] = {as};
    int64_t by[1] = {(int64_t)m * (int64_t)sizeof *as};
    void *d[1];
    int rc = cu_stage(c, 1, hs, by, d);
    free(as);
    if (rc) return -1;
    k_adamw<<<cu_grid(chunks, 1), 256, 0, STREAM(c)>>>(w, m1, m2, g, (const adam_seg *)d[0], m, chunks, h->beta1, h->beta2,
                                                      h->eps, h->clip_scale, h->inv_bc1, h->inv_bc2);
    return CU_LAUNCHED(c, "adamw");
}
