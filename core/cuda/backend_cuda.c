/* backend_cuda.c — the CUDA backend's op table (docs/cuda.md). Memory lives on the device (cudaMalloc,
 * zero-filled on the context's stream); every op is queued on the context's stream, and host copies
 * (ps_buf_to_host / ps_buf_from_host) wait for it. The kernels are in the .cu files beside this one.
 *
 * The DeepSeek-V4 extension table is in v4.cu (naive kernels over the bodies of v4_bodies.h); the compressor
 * ops over window tables, the gate regulariser in grid.cu (over the bodies of grid_bodies.h). */
#include "core/cuda/cuda_ops.h"

/* What the device kernels cannot run: head_dim above 128 in the attention kernels (attention.cu). */
static int cuda_supports(ps_op op, const ps_op_params *p, const char **why) {
    int64_t hd = p->attn ? p->attn->hd : p->frame ? p->frame->hd : 0;
    if (hd > 128) {
        *why = "head_dim above 128 (the device attention kernels take at most 128)";
        return 0;
    }
    (void)op;
    return 1;
}

/* The op tables, one entry per op of the enums (core/backend.h): op f is ps_cuda_<f>. */
#define PS_CUDA_OP_(E, f) .f = ps_cuda_##f,
static const ps_backend_v4_ops cuda_v4_ops = {PS_V4_OPS(PS_CUDA_OP_)};

const ps_backend ps_backend_cuda = {
    .name = "cuda",
    .alloc = ps_cuda_alloc,
    .free = ps_cuda_free,
    .to_host = ps_cuda_to_host,
    .from_host = ps_cuda_from_host,
    .mem_info = ps_cuda_mem_info,
    .host_visible = 0,
    .init = ps_cuda_init,
    .fini = ps_cuda_fini,
    .supports = cuda_supports,
    .ops = {PS_CORE_OPS(PS_CUDA_OP_)},
    .v4 = &cuda_v4_ops, /* v4.cu: naive kernels over the bodies of v4_bodies.h */
};
