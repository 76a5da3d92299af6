/* ctx.h — the compute context every op runs in, and the buffers a backend owns.
 *
 * A ps_ctx names the backend that runs the ops (its op table, core/backend.h), the threads the ops may
 * use, the backend's own state (for a device: a stream and BLAS/cuDNN handles), a workspace arena that
 * kernels take their scratch from (no kernel allocates), and the first error an op reported. Every
 * tensor the model touches — parameters, gradients, AdamW moments, activations, caches — is allocated
 * with ps_buf_alloc on the context of the model that uses it; host code reads or writes a buffer only
 * through ps_buf_to_host / ps_buf_from_host (on the CPU backend these are plain copies and a buffer
 * pointer is a host pointer, so existing host code that reads activations keeps working there).
 *
 * One context is not shared between threads that run ops at the same time (its workspace and error
 * are per context); a CPU context's ops parallelise inside with OpenMP. */
#ifndef PS_CTX_H
#define PS_CTX_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

typedef struct ps_backend ps_backend; /* the op table: core/backend.h */

typedef struct ps_ctx {
    const ps_backend *be; /* the backend's op table */
    int threads;          /* CPU: OpenMP threads the ops may use (0: the runtime's default) */
    void *impl;           /* backend state (CUDA: stream, cuBLAS/cuBLASLt/cuDNN handles); NULL on the CPU */
    float *ws;            /* workspace arena: ps_ctx_workspace */
    int64_t ws_floats;
    int64_t ws_peak;      /* the most floats the arena ever held (bench) */
    int64_t live_bytes, peak_bytes; /* bytes of ps_buf_alloc buffers alive now / at most (bench) */
    int failed;           /* an op failed: err holds its message; later ops return -1 at once */
    ps_error err;
    int precision;        /* PS_PREC_*: the matrix products of a device backend (the CPU: always fp32) */
} ps_ctx;

/* Precision of a device backend's matrix products (cuBLASLt compute type): fp32 (the default and the
 * parity mode), tf32 (tensor cores, fp32 storage and accumulation), bf16 (bf16 inputs, fp32 storage and
 * accumulation). Every other op computes in fp32. The CPU backend computes in fp32 only. */
enum { PS_PREC_FP32 = 0, PS_PREC_TF32 = 1, PS_PREC_BF16 = 2 };
/* "fp32" / "tf32" / "bf16" → *out; -1 for anything else. */
int ps_precision_parse(const char *name, int *out);
const char *ps_precision_name(int precision);
/* The precision contexts created from now on start with (the --precision flag sets it once). */
void ps_ctx_default_precision(int precision);

/* A context on the named backend ("cpu"; NULL means "cpu"). Unknown names are an error that lists the
 * backends this build has. It also knows the test backend "cpu-staged" (the cpu's ops on buffers it
 * declares not host-visible, so the device paths run on the CPU; docs/backends.md), which is not listed. */
int ps_ctx_create(ps_ctx **out, const char *backend, ps_error *err);
void ps_ctx_free(ps_ctx *c);
const char *ps_ctx_backend_name(const ps_ctx *c);
/* The backends this build has, comma-separated ("cpu" or "cpu, cuda"), as a compile-time string (help
 * texts) and at run time. */
#ifdef PS_HAVE_CUDA
#define PS_BACKENDS_TEXT "cpu, cuda"
#else
#define PS_BACKENDS_TEXT "cpu"
#endif
const char *ps_ctx_backends(void);

/* Record an op's failure (the first message is kept). Returns -1. */
int ps_ctx_fail(ps_ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* 0 when no op failed; else -1 with the first op error copied into err, and the context cleared for
 * the next pass. */
int ps_ctx_check(ps_ctx *c, ps_error *err);

/* Workspace: at least n floats, valid until the next ps_ctx_workspace call on this context (a kernel
 * asks once, before its parallel region; ops do not nest). NULL (with the context failed) when memory
 * runs out. */
float *ps_ctx_workspace(ps_ctx *c, int64_t n_floats);

/* Buffers on the context's backend, zero-filled. `name` is for the error message ("parameters",
 * "activations B=4 T=512", ...). */
void *ps_buf_alloc(ps_ctx *c, int64_t bytes, const char *name, ps_error *err);
void ps_buf_free(ps_ctx *c, void *buf, int64_t bytes);
/* Copies between a backend buffer and host memory (bytes). */
int ps_buf_to_host(ps_ctx *c, void *host, const void *buf, int64_t bytes, ps_error *err);
int ps_buf_from_host(ps_ctx *c, void *buf, const void *host, int64_t bytes, ps_error *err);
/* 1 when a buffer of this context is a host pointer (CPU backend): host code may read it in place. */
int ps_ctx_host_visible(const ps_ctx *c);
/* Free and total bytes of the memory the context's buffers live in: the device's (cudaMemGetInfo) or, for the
 * cpu, the host's (MemAvailable; total from sysconf). 0, or -1 with the reason in err. */
int ps_ctx_mem_info(ps_ctx *c, int64_t *free_bytes, int64_t *total_bytes, ps_error *err);
/* The free bytes of that memory, or 0 when they cannot be told (for size checks before an allocation). */
uint64_t ps_ctx_mem_free(ps_ctx *c);

#endif
