/* backend_cpu.c — the CPU backend's table: host memory (calloc/free, copies are memcpy) and the ops. */
#include <stdlib.h>
#include <string.h>

#include "cpu.h"

static void *cpu_alloc(ps_ctx *c, int64_t bytes) {
    (void)c;
    return calloc(1, (size_t)(bytes > 0 ? bytes : 1));
}

static void cpu_free(ps_ctx *c, void *p) {
    (void)c;
    free(p);
}

static int cpu_copy_bytes(ps_ctx *c, void *dst, const void *src, int64_t bytes) {
    (void)c;
    if (bytes > 0 && dst != src) memcpy(dst, src, (size_t)bytes);
    return 0;
}

const ps_backend ps_backend_cpu = {
    .name = "cpu",
    .alloc = cpu_alloc,
    .free = cpu_free,
    .to_host = cpu_copy_bytes,
    .from_host = cpu_copy_bytes,
    .host_visible = 1,
    .init = NULL,
    .fini = NULL,
    .matmul = ps_cpu_matmul,
    .embed = ps_cpu_embed,
    .rmsnorm = ps_cpu_rmsnorm,
    .rope_table = ps_cpu_rope_table,
    .rope = ps_cpu_rope,
    .swiglu = ps_cpu_swiglu,
    .add = ps_cpu_add,
    .copy = ps_cpu_copy,
    .fill = ps_cpu_fill,
    .gate = ps_cpu_gate,
    .payload = ps_cpu_payload,
    .pool = ps_cpu_pool,
    .attn_forward = ps_cpu_attn_forward,
    .attn_probs = ps_cpu_attn_probs,
    .attn_out = ps_cpu_attn_out,
    .attn_chunk = ps_cpu_attn_chunk,
    .attn_rows = ps_cpu_attn_rows,
    .pattern_expand = ps_cpu_pattern_expand,
    .pattern_compact = ps_cpu_pattern_compact,
    .gather_rows = ps_cpu_gather_rows,
    .scatter_rows = ps_cpu_scatter_rows,
    .head_set = ps_cpu_head_set,
    .add_vector = ps_cpu_add_vector,
    .roll_blocks = ps_cpu_roll_blocks,
    .matmul_backward = ps_cpu_matmul_backward,
    .embed_backward = ps_cpu_embed_backward,
    .rmsnorm_backward = ps_cpu_rmsnorm_backward,
    .rope_backward = ps_cpu_rope_backward,
    .swiglu_backward = ps_cpu_swiglu_backward,
    .gate_backward = ps_cpu_gate_backward,
    .payload_backward = ps_cpu_payload_backward,
    .pool_backward = ps_cpu_pool_backward,
    .attn_backward = ps_cpu_attn_backward,
    .cross_entropy = ps_cpu_cross_entropy,
    .sumsq = ps_cpu_sumsq,
    .adamw = ps_cpu_adamw,
};
