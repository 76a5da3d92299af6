/* cuda_internal.cuh — what the CUDA backend's .cu files share: the context state (c->impl), error
 * reporting, launch helpers, staging of host index arrays, the row-major GEMM wrapper (gemm.cu) and
 * the deterministic block reductions. Not a public header. */
#ifndef PS_CUDA_INTERNAL_CUH
#define PS_CUDA_INTERNAL_CUH

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "core/cuda/cuda_ops.h"

struct ps_gemm_cache; /* gemm.cu */

/* The backend state of one context (c->impl). */
typedef struct {
    int device;
    cudaStream_t stream;
    cublasLtHandle_t lt;
    cublasHandle_t blas;        /* the fallback when cuBLASLt's heuristic offers no algorithm */
    void *lt_ws;                /* cuBLASLt workspace */
    size_t lt_ws_bytes;
    void *stage;                /* device copies of host index arrays (tokens, rows, segments) */
    size_t stage_bytes;
    double *dscal;              /* a few device doubles for scalar results */
    struct ps_gemm_cache *gemm; /* descriptors and algorithms by shape (gemm.cu) */
    char name[400];
    int sm_count;
    size_t smem_optin;          /* the most dynamic shared memory a block may opt in to */
} ps_cuda;

static inline ps_cuda *CU(ps_ctx *c) { return (ps_cuda *)c->impl; }
static inline cudaStream_t STREAM(ps_ctx *c) { return CU(c)->stream; }

/* Fail the context with the runtime's message when a launch or call went wrong. */
static inline int cu_check(ps_ctx *c, cudaError_t e, const char *what) {
    if (e == cudaSuccess) return 0;
    return ps_ctx_fail(c, "cuda %s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}
#define CU_LAUNCHED(c, what) cu_check((c), cudaGetLastError(), (what))

/* The attention geometry a device attention op trusts (the CPU's check_geom in core/cpu/attention.c):
 * nh a multiple of nkv (the kernels divide by nkv and by nh / nkv), and ncols, the row stride of the
 * probability rows, nW + LW (compressed) or T (full). An op refuses anything else before it divides or
 * launches. */
static inline int cu_geom_check(ps_ctx *c, const char *op, const ps_attn_geom *g) {
    int ok = g->B >= 0 && g->T >= 0 && g->nh >= 1 && g->nkv >= 1 && g->hd >= 1 && g->nh % g->nkv == 0;
    if (ok && g->compressed)
        ok = g->W >= 1 && g->S >= 1 && g->LW >= 1 && g->nW >= 0 && g->ncols == g->nW + g->LW;
    else if (ok)
        ok = g->ncols == g->T;
    if (ok) return 0;
    return ps_ctx_fail(c,
                       "cuda %s: invalid geometry B=%lld T=%lld nh=%lld nkv=%lld hd=%lld compressed=%d W=%lld S=%lld LW=%lld "
                       "nW=%lld ncols=%lld (want nh %% nkv == 0 and ncols == %s)",
                       op, (long long)g->B, (long long)g->T, (long long)g->nh, (long long)g->nkv, (long long)g->hd, g->compressed,
                       (long long)g->W, (long long)g->S, (long long)g->LW, (long long)g->nW, (long long)g->ncols,
                       g->compressed ? "nW + LW" : "T");
}

/* A 1-D grid for n items in blocks of `threads` (grid-stride loops cover the rest). */
static inline unsigned cu_grid(int64_t n, int threads) {
    int64_t b = (n + threads - 1) / threads;
    if (b < 1) b = 1;
    if (b > 65536) b = 65536;
    return (unsigned)b;
}

#define GS_LOOP(i, n) \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)

/* Copy host arrays to the device staging area (one buffer, each array 256-byte aligned, grown as needed;
 * stream-ordered, so a later op may reuse the area). n arrays: host[i] of bytes[i]; dev[i] receives the
 * device pointers. 0, or -1 with the context failed. */
#define CU_STAGE_MAX 136 /* arrays per call: kv_attend stages 2 page tables per KV head, up to 32 heads (kvcache.cu) */
int cu_stage(ps_ctx *c, int n, const void *const *host, const int64_t *bytes, void **dev);

/* The KV cache's page lists (core/backend.h ps_kv_pages): pages p holds, and its page table (a host array of
 * device pointers) staged on the device (*d), 0 or -1 with the context failed. */
static inline int64_t cu_kv_n_pages(const ps_kv_pages *p) {
    return p->rows > p->base ? (p->rows - p->base + p->page_rows - 1) / p->page_rows : 0;
}
static inline int cu_stage_pages(ps_ctx *c, const ps_kv_pages *p, void **d) {
    const void *h[1] = {p->page};
    int64_t by[1] = {cu_kv_n_pages(p) * (int64_t)sizeof(float *)};
    return cu_stage(c, 1, h, by, d);
}

/* kernel k over n items (its grid-stride loop) in blocks of `threads` on the context's stream; a launch
 * error fails the context, naming the op */
template <typename... P, typename... A>
static int cu_launch(ps_ctx *c, const char *op, void (*k)(P...), int64_t n, int threads, A... args) {
    k<<<cu_grid(n, threads), threads, 0, STREAM(c)>>>(args...);
    return CU_LAUNCHED(c, op);
}

/* Row-major GEMM, batched with strides (floats): for every batch index
 *   C[M, N] (ld ldc) = alpha · op(A) · op(B) + beta · C,  op(A) [M, K] (ta: A is stored [K, M]),
 *   op(B) [K, N] (tb: B is stored [N, K]);
 * through cuBLASLt at the context's precision (one wrapper turns the row-major problem into cuBLAS's
 * column-major one), with cuBLAS as the fallback. K = 0 gives beta · C. */
int cu_gemm(ps_ctx *c, const char *what, int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
            int64_t lda, int64_t sA, const float *B, int64_t ldb, int64_t sB, float beta, float *C, int64_t ldc,
            int64_t sC, int64_t batch);
void cu_gemm_cache_free(ps_cuda *cu);

/* ---- deterministic block reductions (a fixed tree: the same result on every run) ----
 * Every thread of the block calls them; blockDim.x is a multiple of 32 and at most 1024; sh holds 32. */
template <typename T> __device__ __forceinline__ T warp_sum(T v) {
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
template <typename T> __device__ __forceinline__ T block_sum(T v, T *sh) {
    v = warp_sum(v);
    int w = threadIdx.x >> 5, l = threadIdx.x & 31, nw = (blockDim.x + 31) >> 5;
    __syncthreads(); /* sh may still be read from the previous call */
    if (l == 0) sh[w] = v;
    __syncthreads();
    if (w == 0) {
        v = l < nw ? sh[l] : T(0);
        v = warp_sum(v);
        if (l == 0) sh[0] = v;
    }
    __syncthreads();
    return sh[0];
}
__device__ __forceinline__ float block_max(float v, float *sh) {
    v = warp_max(v);
    int w = threadIdx.x >> 5, l = threadIdx.x & 31, nw = (blockDim.x + 31) >> 5;
    __syncthreads();
    if (l == 0) sh[w] = v;
    __syncthreads();
    if (w == 0) {
        v = l < nw ? sh[l] : -INFINITY;
        v = warp_max(v);
        if (l == 0) sh[0] = v;
    }
    __syncthreads();
    return sh[0];
}

/* Threads per block for a row of C elements (a multiple of 32, at most 256). */
static inline int cu_row_threads(int64_t C) {
    int t = 32;
    while (t < 256 && t < C) t *= 2;
    return t;
}

#endif
