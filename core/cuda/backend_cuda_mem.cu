/* backend_cuda_mem.cu — the CUDA backend's context and memory: device selection, the stream, the
 * cuBLASLt/cuBLAS handles and workspace (c->impl), device buffers (zero-filled), host copies, and the
 * staging area for host index arrays. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/cuda/cuda_internal.cuh"
#ifdef PS_HAVE_CUDNN
#include <cudnn.h>
#endif
#ifdef PS_HAVE_NCCL
#include <nccl.h>
#endif

extern "C" int ps_cuda_device_count(const char **why) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        if (why) *why = cudaGetErrorString(e);
        cudaGetLastError(); /* clear the sticky-free error so later calls do not report it */
        return 0;
    }
    if (n == 0 && why) *why = "the CUDA runtime reports 0 devices";
    return n;
}

extern "C" int ps_cuda_init(ps_ctx *c) {
    const char *why = "";
    int n = ps_cuda_device_count(&why);
    if (n <= 0) return ps_ctx_fail(c, "no CUDA device (%s)", why);
    int dev = 0;
    const char *env = getenv("PS_CUDA_DEVICE");
    if (env && *env) {
        dev = atoi(env);
        if (dev < 0 || dev >= n) return ps_ctx_fail(c, "PS_CUDA_DEVICE=%s: this machine has %d CUDA device(s)", env, n);
    }
    ps_cuda *cu = (ps_cuda *)calloc(1, sizeof *cu);
    if (!cu) return ps_ctx_fail(c, "out of memory for the CUDA context");
    cu->device = dev;
    c->impl = cu;
    cudaDeviceProp prop;
    if (cu_check(c, cudaSetDevice(dev), "cudaSetDevice") || cu_check(c, cudaGetDeviceProperties(&prop, dev), "cudaGetDeviceProperties") ||
        cu_check(c, cudaStreamCreateWithFlags(&cu->stream, cudaStreamNonBlocking), "cudaStreamCreate")) {
        ps_cuda_fini(c);
        return -1;
    }
    cu->sm_count = prop.multiProcessorCount;
    cu->smem_optin = prop.sharedMemPerBlockOptin;
    snprintf(cu->name, sizeof cu->name, "%s, sm_%d%d, %d SMs, %.1f GiB", prop.name, prop.major, prop.minor,
             prop.multiProcessorCount, (double)prop.totalGlobalMem / 1073741824.0);
    if (prop.major < 8) {
        ps_ctx_fail(c, "%s: compute capability %d.%d; the cuda backend is built for sm_90 (and PTX for newer)", prop.name,
                    prop.major, prop.minor);
        ps_cuda_fini(c);
        return -1;
    }
    cublasStatus_t s1 = cublasLtCreate(&cu->lt), s2 = cublasCreate(&cu->blas);
    if (s1 != CUBLAS_STATUS_SUCCESS || s2 != CUBLAS_STATUS_SUCCESS) {
        ps_ctx_fail(c, "cuBLAS handles could not be created (cublasLtCreate %d, cublasCreate %d)", (int)s1, (int)s2);
        ps_cuda_fini(c);
        return -1;
    }
    cublasStatus_t s3 = cublasSetStream(cu->blas, cu->stream);
    if (s3 != CUBLAS_STATUS_SUCCESS) {
        ps_ctx_fail(c, "cublasSetStream: %s (%d)", cublasGetStatusString(s3), (int)s3);
        ps_cuda_fini(c);
        return -1;
    }
    cu->lt_ws_bytes = (size_t)64 << 20;
    if (cu_check(c, cudaMalloc(&cu->lt_ws, cu->lt_ws_bytes), "cudaMalloc (cuBLASLt workspace)") ||
        cu_check(c, cudaMalloc((void **)&cu->dscal, 64 * sizeof(double)), "cudaMalloc (scalars)")) {
        ps_cuda_fini(c);
        return -1;
    }
    cublasStatus_t s4 = cublasSetWorkspace(cu->blas, cu->lt_ws, cu->lt_ws_bytes);
    if (s4 != CUBLAS_STATUS_SUCCESS) {
        ps_ctx_fail(c, "cublasSetWorkspace (%zu bytes): %s (%d)", cu->lt_ws_bytes, cublasGetStatusString(s4), (int)s4);
        ps_cuda_fini(c);
        return -1;
    }
    return 0;
}

extern "C" void ps_cuda_fini(ps_ctx *c) {
    ps_cuda *cu = CU(c);
    if (!cu) return;
    if (cu->stream) cudaStreamSynchronize(cu->stream);
    cu_gemm_cache_free(cu);
    if (cu->blas) cublasDestroy(cu->blas);
    if (cu->lt) cublasLtDestroy(cu->lt);
    if (cu->lt_ws) cudaFree(cu->lt_ws);
    if (cu->stage) cudaFree(cu->stage);
    if (cu->dscal) cudaFree(cu->dscal);
    if (cu->stream) cudaStreamDestroy(cu->stream);
    free(cu);
    c->impl = NULL;
}

extern "C" void *ps_cuda_alloc(ps_ctx *c, int64_t bytes) {
    void *p = NULL;
    size_t n = (size_t)(bytes > 0 ? bytes : 1);
    cudaError_t e = cudaMalloc(&p, n);
    if (e != cudaSuccess) {
        cudaGetLastError(); /* clear it: an out-of-memory is reported by the caller (ps_buf_alloc), not sticky */
        /* anything else (an earlier kernel's fault, a lost device) is not an out-of-memory: say what it was */
        if (e != cudaErrorMemoryAllocation) cu_check(c, e, "cudaMalloc of a buffer");
        return NULL;
    }
    e = cudaMemsetAsync(p, 0, n, STREAM(c));
    if (e != cudaSuccess) {
        /* the zero-fill of a new buffer failed (an earlier op's fault shows up here first): clear the error,
         * which would otherwise be reported by the next unrelated call, and fail the context with its name */
        cudaGetLastError();
        cudaFree(p);
        cu_check(c, e, "cudaMemsetAsync (zero-fill of a new buffer)");
        return NULL;
    }
    return p;
}

extern "C" void ps_cuda_free(ps_ctx *c, void *p) {
    (void)c;
    if (p) cudaFree(p); /* waits for the work queued before it */
}

extern "C" int ps_cuda_to_host(ps_ctx *c, void *host, const void *buf, int64_t bytes) {
    if (bytes <= 0) return 0;
    return cu_check(c, cudaMemcpyAsync(host, buf, (size_t)bytes, cudaMemcpyDeviceToHost, STREAM(c)), "copy to the host") ||
                   cu_check(c, cudaStreamSynchronize(STREAM(c)), "copy to the host (an earlier op may have failed)")
               ? -1
               : 0;
}

extern "C" int ps_cuda_from_host(ps_ctx *c, void *buf, const void *host, int64_t bytes) {
    if (bytes <= 0) return 0;
    return cu_check(c, cudaMemcpyAsync(buf, host, (size_t)bytes, cudaMemcpyHostToDevice, STREAM(c)), "copy from the host") ||
                   cu_check(c, cudaStreamSynchronize(STREAM(c)), "copy from the host (an earlier op may have failed)")
               ? -1
               : 0;
}

extern "C" int ps_cuda_sync(ps_ctx *c) {
    if (c->failed) return -1;
    return cu_check(c, cudaStreamSynchronize(STREAM(c)), "stream");
}

int cu_stage(ps_ctx *c, int n, const void *const *host, const int64_t *bytes, void **dev) {
    ps_cuda *cu = CU(c);
    size_t total = 0, off[CU_STAGE_MAX];
    if (n > CU_STAGE_MAX) return ps_ctx_fail(c, "cuda staging: %d arrays (at most %d)", n, CU_STAGE_MAX);
    for (int i = 0; i < n; i++) {
        off[i] = total;
        total += ((size_t)(bytes[i] > 0 ? bytes[i] : 0) + 255) & ~(size_t)255;
    }
    if (total > cu->stage_bytes) {
        size_t want = total < ((size_t)1 << 20) ? ((size_t)1 << 20) : total + total / 2;
        if (cu->stage) cudaFree(cu->stage);
        cu->stage = NULL;
        cu->stage_bytes = 0;
        if (cudaMalloc(&cu->stage, want) != cudaSuccess) {
            cudaGetLastError();
            return ps_ctx_fail(c, "out of device memory: %.1f MB to stage index arrays", (double)want / 1e6);
        }
        cu->stage_bytes = want;
    }
    for (int i = 0; i < n; i++) {
        dev[i] = (char *)cu->stage + off[i];
        if (bytes[i] > 0 &&
            cu_check(c, cudaMemcpyAsync(dev[i], host[i], (size_t)bytes[i], cudaMemcpyHostToDevice, cu->stream), "staging"))
            return -1;
    }
    return 0;
}

extern "C" void ps_cuda_describe(ps_ctx *c, char *out, size_t n) {
    ps_cuda *cu = CU(c);
    int rt = 0, drv = 0, blas = 0;
    cudaRuntimeGetVersion(&rt);
    cudaDriverGetVersion(&drv);
    if (cu && cu->blas) cublasGetVersion(cu->blas, &blas);
    size_t len = (size_t)snprintf(out, n, "%s; CUDA runtime %d.%d, driver %d.%d, cuBLAS %d.%d.%d", cu ? cu->name : "(no device)",
                                  rt / 1000, rt % 1000 / 10, drv / 1000, drv % 1000 / 10, blas / 10000, blas % 10000 / 100,
                                  blas % 100);
#ifdef PS_HAVE_CUDNN
    if (len < n) {
        size_t v = cudnnGetVersion();
        len += (size_t)snprintf(out + len, n - len, ", cuDNN %zu.%zu.%zu", v / 10000, v % 10000 / 100, v % 100);
    }
#endif
#ifdef PS_HAVE_NCCL
    int nv = 0;
    if (len < n && ncclGetVersion(&nv) == ncclSuccess)
        len += (size_t)snprintf(out + len, n - len, ", NCCL %d.%d.%d", nv / 10000, nv % 10000 / 100, nv % 100);
#endif
    if (len < n) snprintf(out + len, n - len, "; precision %s", ps_precision_name(c->precision));
}
