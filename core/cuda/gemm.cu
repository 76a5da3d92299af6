/* gemm.cu — matrix products on the device: one row-major wrapper over cuBLASLt (cu_gemm) that every
 * product of the backend goes through (linear layers, their backward, the compressor's payloads), with
 * descriptors and the heuristic's algorithm cached by shape, and cuBLAS's strided-batched GEMM as the
 * fallback when cuBLASLt offers no algorithm. The context's precision picks the compute type: fp32
 * (CUBLAS_COMPUTE_32F), tf32 (..._FAST_TF32) or bf16 (..._FAST_16BF); storage is fp32 throughout. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/cuda/cuda_internal.cuh"

typedef struct {
    int ta, tb, prec, beta0;
    int64_t m, n, k, lda, ldb, ldc, sA, sB, sC, batch;
    uint32_t alA, alB, alC;
} gemm_key;

typedef struct {
    gemm_key key;
    int used, have_algo;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, cc;
    cublasLtMatmulAlgo_t algo;
} gemm_entry;

#define GEMM_CACHE 512
struct ps_gemm_cache {
    gemm_entry e[GEMM_CACHE];
    int n;
};

static void entry_destroy(gemm_entry *e) {
    if (e->desc) cublasLtMatmulDescDestroy(e->desc);
    if (e->a) cublasLtMatrixLayoutDestroy(e->a);
    if (e->b) cublasLtMatrixLayoutDestroy(e->b);
    if (e->cc) cublasLtMatrixLayoutDestroy(e->cc);
    memset(e, 0, sizeof *e);
}

void cu_gemm_cache_free(ps_cuda *cu) {
    if (!cu->gemm) return;
    for (int i = 0; i < cu->gemm->n; i++) entry_destroy(&cu->gemm->e[i]);
    free(cu->gemm);
    cu->gemm = NULL;
}

/* the largest power of two (<= 256) that divides the address, the leading dimension's bytes and (batched)
 * the batch stride's bytes: every row of every batch entry starts that aligned */
static uint32_t align_of(const void *p, int64_t ld, int64_t stride, int64_t batch) {
    uintptr_t a = (uintptr_t)p;
    uint32_t al = 256;
    while (al > 4 && (a % al || ((uint64_t)ld * 4) % al || (batch > 1 && ((uint64_t)stride * 4) % al))) al /= 2;
    return al;
}

static cublasComputeType_t compute_type(int prec) {
    return prec == PS_PREC_TF32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : prec == PS_PREC_BF16 ? CUBLAS_COMPUTE_32F_FAST_16BF : CUBLAS_COMPUTE_32F;
}

/* A cuBLAS(Lt) call's status: 0, or -1 with why = "CALL: STATUS (n)" (the first failure kept). */
static int lt_ok(cublasStatus_t st, const char *call, char *why, size_t nwhy) {
    if (st == CUBLAS_STATUS_SUCCESS) return 0;
    if (!why[0]) snprintf(why, nwhy, "%s: %s (%d)", call, cublasGetStatusString(st), (int)st);
    return -1;
}

/* A matrix layout (NULL with why filled when a call fails). */
static cublasLtMatrixLayout_t layout(const char *which, int64_t rows, int64_t cols, int64_t ld, int64_t batch, int64_t stride,
                                     char *why, size_t nwhy) {
    cublasLtMatrixLayout_t l = NULL;
    char call[96];
    snprintf(call, sizeof call, "cublasLtMatrixLayoutCreate (%s)", which);
    if (lt_ok(cublasLtMatrixLayoutCreate(&l, CUDA_R_32F, (uint64_t)rows, (uint64_t)cols, ld), call, why, nwhy)) return NULL;
    if (batch > 1) {
        int32_t bc = (int32_t)batch;
        snprintf(call, sizeof call, "cublasLtMatrixLayoutSetAttribute (%s: BATCH_COUNT %d)", which, (int)bc);
        int bad = lt_ok(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof bc), call, why, nwhy);
        snprintf(call, sizeof call, "cublasLtMatrixLayoutSetAttribute (%s: STRIDED_BATCH_OFFSET %lld)", which, (long long)stride);
        bad = bad || lt_ok(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride),
                           call, why, nwhy);
        if (bad) {
            cublasLtMatrixLayoutDestroy(l);
            return NULL;
        }
    }
    return l;
}

/* Descriptors and algorithm for a column-major problem (filled entry; have_algo 0 when the heuristic had
 * none). -1 with why naming the cuBLASLt call and its status when one fails. */
static int entry_make(ps_cuda *cu, gemm_entry *e, const gemm_key *k, char *why, size_t nwhy) {
    memset(e, 0, sizeof *e);
    why[0] = 0;
    e->key = *k;
    cublasOperation_t opA = k->ta ? CUBLAS_OP_T : CUBLAS_OP_N, opB = k->tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    if (lt_ok(cublasLtMatmulDescCreate(&e->desc, compute_type(k->prec), CUDA_R_32F), "cublasLtMatmulDescCreate", why, nwhy) ||
        lt_ok(cublasLtMatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opA, sizeof opA),
              "cublasLtMatmulDescSetAttribute (TRANSA)", why, nwhy) ||
        lt_ok(cublasLtMatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opB, sizeof opB),
              "cublasLtMatmulDescSetAttribute (TRANSB)", why, nwhy))
        return -1;
    /* stored shapes (column-major): A is m x k (k x m when transposed), B is k x n (n x k), C is m x n */
    e->a = layout("A", k->ta ? k->k : k->m, k->ta ? k->m : k->k, k->lda, k->batch, k->sA, why, nwhy);
    if (!e->a) return -1;
    e->b = layout("B", k->tb ? k->n : k->k, k->tb ? k->k : k->n, k->ldb, k->batch, k->sB, why, nwhy);
    if (!e->b) return -1;
    e->cc = layout("C", k->m, k->n, k->ldc, k->batch, k->sC, why, nwhy);
    if (!e->cc) return -1;
    cublasLtMatmulPreference_t pref = NULL;
    if (lt_ok(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate", why, nwhy)) return -1;
    uint64_t ws = cu->lt_ws_bytes;
    int bad = lt_ok(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws),
                    "cublasLtMatmulPreferenceSetAttribute (MAX_WORKSPACE_BYTES)", why, nwhy) ||
              lt_ok(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &k->alA, sizeof k->alA),
                    "cublasLtMatmulPreferenceSetAttribute (MIN_ALIGNMENT_A_BYTES)", why, nwhy) ||
              lt_ok(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &k->alB, sizeof k->alB),
                    "cublasLtMatmulPreferenceSetAttribute (MIN_ALIGNMENT_B_BYTES)", why, nwhy) ||
              lt_ok(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &k->alC, sizeof k->alC),
                    "cublasLtMatmulPreferenceSetAttribute (MIN_ALIGNMENT_C_BYTES)", why, nwhy) ||
              lt_ok(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &k->alC, sizeof k->alC),
                    "cublasLtMatmulPreferenceSetAttribute (MIN_ALIGNMENT_D_BYTES)", why, nwhy);
    if (bad) {
        cublasLtMatmulPreferenceDestroy(pref);
        return -1;
    }
    cublasLtMatmulHeuristicResult_t res;
    int nres = 0;
    /* no algorithm (a status other than success, or none returned) is not an error: cuBLAS is the fallback */
    if (cublasLtMatmulAlgoGetHeuristic(cu->lt, e->desc, e->a, e->b, e->cc, e->cc, pref, 1, &res, &nres) ==
            CUBLAS_STATUS_SUCCESS &&
        nres > 0 && res.state == CUBLAS_STATUS_SUCCESS) {
        e->algo = res.algo;
        e->have_algo = 1;
    }
    cublasLtMatmulPreferenceDestroy(pref);
    return 0;
}

__global__ void k_scale2d(float *C, int64_t M, int64_t N, int64_t ldc, float beta) {
    GS_LOOP(i, M * N) {
        float *p = C + (i / N) * ldc + i % N;
        *p = beta == 0.0f ? 0.0f : beta * *p;
    }
}

int cu_gemm(ps_ctx *c, const char *what, int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
            int64_t lda, int64_t sA, const float *B, int64_t ldb, int64_t sB, float beta, float *C, int64_t ldc,
            int64_t sC, int64_t batch) {
    if (c->failed) return -1;
    if (M <= 0 || N <= 0 || batch <= 0) return 0;
    if (K <= 0) {
        if (beta == 1.0f) return 0;
        for (int64_t b = 0; b < batch; b++) k_scale2d<<<cu_grid(M * N, 256), 256, 0, STREAM(c)>>>(C + b * sC, M, N, ldc, beta);
        return CU_LAUNCHED(c, what);
    }
    ps_cuda *cu = CU(c);
    /* row-major C = op(A)·op(B) is column-major C^T = op(B)^T·op(A)^T: swap the operands */
    gemm_key k;
    memset(&k, 0, sizeof k);
    k.ta = tb, k.tb = ta, k.prec = c->precision, k.beta0 = beta == 0.0f;
    k.m = N, k.n = M, k.k = K, k.lda = ldb, k.ldb = lda, k.ldc = ldc;
    k.sA = sB, k.sB = sA, k.sC = sC, k.batch = batch;
    k.alA = align_of(B, ldb, sB, batch), k.alB = align_of(A, lda, sA, batch), k.alC = align_of(C, ldc, sC, batch);
    if (!cu->gemm) cu->gemm = (struct ps_gemm_cache *)calloc(1, sizeof *cu->gemm);
    gemm_entry *e = NULL, tmp;
    char why[256] = "";
    if (cu->gemm) {
        for (int i = 0; i < cu->gemm->n && !e; i++)
            if (!memcmp(&cu->gemm->e[i].key, &k, sizeof k)) e = &cu->gemm->e[i];
        if (!e && cu->gemm->n < GEMM_CACHE) {
            e = &cu->gemm->e[cu->gemm->n];
            if (entry_make(cu, e, &k, why, sizeof why)) {
                entry_destroy(e);
                return ps_ctx_fail(c, "cuda %s: cuBLASLt descriptors for a %lld x %lld x %lld product (batch %lld) could not be made: %s",
                                   what, (long long)M, (long long)N, (long long)K, (long long)batch, why);
            }
            cu->gemm->n++;
        }
    }
    int own = 0;
    if (!e) { /* the cache is full: descriptors for this call only */
        e = &tmp;
        own = 1;
        if (entry_make(cu, e, &k, why, sizeof why)) {
            entry_destroy(e);
            return ps_ctx_fail(c, "cuda %s: cuBLASLt descriptors for a %lld x %lld x %lld product (batch %lld) could not be made: %s",
                               what, (long long)M, (long long)N, (long long)K, (long long)batch, why);
        }
    }
    cublasStatus_t st = CUBLAS_STATUS_NOT_SUPPORTED;
    const int e_had_algo = e->have_algo;
    if (e->have_algo)
        st = cublasLtMatmul(cu->lt, e->desc, &alpha, B, e->a, A, e->b, &beta, C, e->cc, C, e->cc, &e->algo, cu->lt_ws,
                            cu->lt_ws_bytes, cu->stream);
    if (own) entry_destroy(e);
    const cublasStatus_t lt_st = st; /* NOT_SUPPORTED: the heuristic had no algorithm for this shape */
    if (st != CUBLAS_STATUS_SUCCESS) {
        /* cuBLAS (int sizes) */
        if (M > INT32_MAX || N > INT32_MAX || K > INT32_MAX || lda > INT32_MAX || ldb > INT32_MAX || ldc > INT32_MAX ||
            batch > INT32_MAX)
            return ps_ctx_fail(c, "cuda %s: cuBLASLt failed (%s) and the product is too large for cuBLAS", what,
                               cublasGetStatusString(st));
        st = cublasGemmStridedBatchedEx(cu->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, (int)N,
                                        (int)M, (int)K, &alpha, B, CUDA_R_32F, (int)ldb, sB, A, CUDA_R_32F, (int)lda, sA,
                                        &beta, C, CUDA_R_32F, (int)ldc, sC, (int)batch, compute_type(c->precision),
                                        CUBLAS_GEMM_DEFAULT);
        if (st != CUBLAS_STATUS_SUCCESS)
            return ps_ctx_fail(c, "cuda %s: GEMM %lld x %lld x %lld (batch %lld) failed: cublasGemmStridedBatchedEx %s (cuBLASLt: %s)",
                               what, (long long)M, (long long)N, (long long)K, (long long)batch, cublasGetStatusString(st),
                               e_had_algo ? cublasGetStatusString(lt_st) : "no algorithm for this shape and alignment");
    }
    return CU_LAUNCHED(c, what);
}

extern "C" int ps_cuda_matmul(ps_ctx *c, float *out, const float *inp, const float *w, int64_t M, int64_t K, int64_t N,
                              int accumulate) {
    /* out[M, N] = inp[M, K] · w[N, K]^T */
    return cu_gemm(c, "matmul", 0, 1, M, N, K, 1.0f, inp, K, 0, w, K, 0, accumulate ? 1.0f : 0.0f, out, N, 0, 1);
}

extern "C" int ps_cuda_matmul_backward(ps_ctx *c, float *dinp, float *dw, const float *dout, const float *inp,
                                       const float *w, int64_t M, int64_t K, int64_t N) {
    if (M == 0 || N == 0 || K == 0) return 0;
    /* dinp[M, K] += dout[M, N] · w[N, K];  dw[N, K] += dout^T · inp[M, K] */
    if (dinp && cu_gemm(c, "matmul backward (input)", 0, 0, M, K, N, 1.0f, dout, N, 0, w, K, 0, 1.0f, dinp, K, 0, 1))
        return -1;
    if (!dw) return 0;
    return cu_gemm(c, "matmul backward (weight)", 1, 0, N, K, M, 1.0f, dout, N, 0, inp, K, 0, 1.0f, dw, K, 0, 1);
}
