/* backend_cpu.c — the CPU backend's table: host memory (calloc/free, copies are memcpy) and the ops. */
#include <stdlib.h>
#include <string.h>

#include "core/cpu/cpu.h"

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

/* The ops (and everything else but the name and host visibility) of both tables below. */
#define PS_CPU_TABLE                                              \
    .init = NULL,                                                 \
    .fini = NULL,                                                 \
    .matmul = ps_cpu_matmul,                                      \
    .embed = ps_cpu_embed,                                        \
    .rmsnorm = ps_cpu_rmsnorm,                                    \
    .rope_table = ps_cpu_rope_table,                              \
    .rope = ps_cpu_rope,                                          \
    .swiglu = ps_cpu_swiglu,                                      \
    .add = ps_cpu_add,                                            \
    .copy = ps_cpu_copy,                                          \
    .fill = ps_cpu_fill,                                          \
    .grid_offsets = 1,                                            \
    .gate_grid = ps_cpu_gate_grid,                                \
    .payload_grid = ps_cpu_payload_grid,                          \
    .rope_grid = ps_cpu_rope_grid,                                \
    .gate_grid_backward = ps_cpu_gate_grid_backward,              \
    .payload_grid_backward = ps_cpu_payload_grid_backward,        \
    .gate_chunks = ps_cpu_gate_chunks,                            \
    .payload_chunks = ps_cpu_payload_chunks,                      \
    .rope_chunks = ps_cpu_rope_chunks,                            \
    .gate_chunks_backward = ps_cpu_gate_chunks_backward,          \
    .payload_chunks_backward = ps_cpu_payload_chunks_backward,    \
    .gate_entropy = ps_cpu_gate_entropy,                          \
    .gate = ps_cpu_gate,                                          \
    .payload = ps_cpu_payload,                                    \
    .pool = ps_cpu_pool,                                          \
    .attn_forward = ps_cpu_attn_forward,                          \
    .attn_probs = ps_cpu_attn_probs,                              \
    .attn_out = ps_cpu_attn_out,                                  \
    .attn_chunk = ps_cpu_attn_chunk,                              \
    .attn_rows = ps_cpu_attn_rows,                                \
    .pattern_expand = ps_cpu_pattern_expand,                      \
    .pattern_compact = ps_cpu_pattern_compact,                    \
    .gather_rows = ps_cpu_gather_rows,                            \
    .scatter_rows = ps_cpu_scatter_rows,                          \
    .head_set = ps_cpu_head_set,                                  \
    .add_vector = ps_cpu_add_vector,                              \
    .roll_blocks = ps_cpu_roll_blocks,                            \
    .copy_blocks = ps_cpu_copy_blocks,                            \
    .accumulate_seqs = ps_cpu_accumulate_seqs,                    \
    .delta_dot = ps_cpu_delta_dot,                                \
    .sum_to_mean = ps_cpu_sum_to_mean,                            \
    .matmul_backward = ps_cpu_matmul_backward,                    \
    .embed_backward = ps_cpu_embed_backward,                      \
    .rmsnorm_backward = ps_cpu_rmsnorm_backward,                  \
    .rope_backward = ps_cpu_rope_backward,                        \
    .swiglu_backward = ps_cpu_swiglu_backward,                    \
    .gate_backward = ps_cpu_gate_backward,                        \
    .payload_backward = ps_cpu_payload_backward,                  \
    .pool_backward = ps_cpu_pool_backward,                        \
    .attn_backward = ps_cpu_attn_backward,                        \
    .cross_entropy = ps_cpu_cross_entropy,                        \
    .sumsq = ps_cpu_sumsq,                                        \
    .adamw = ps_cpu_adamw,                                        \
    /* ---------------- DeepSeek-V4 (SPEC-v4) ---------------- */ \
    .v4_rope_table = ps_cpu_v4_rope_table,                        \
    .v4_rope = ps_cpu_v4_rope,                                    \
    .v4_hc_weights = ps_cpu_v4_hc_weights,                        \
    .v4_hc_collapse = ps_cpu_v4_hc_collapse,                      \
    .v4_hc_expand = ps_cpu_v4_hc_expand,                          \
    .v4_comp_slots = ps_cpu_v4_comp_slots,                        \
    .v4_slot_softmax = ps_cpu_v4_slot_softmax,                    \
    .v4_comp_pool = ps_cpu_v4_comp_pool,                          \
    .v4_indexer_scores = ps_cpu_v4_indexer_scores,                \
    .v4_topk = ps_cpu_v4_topk,                                    \
    .v4_router_scores = ps_cpu_v4_router_scores,                  \
    .v4_route_weights = ps_cpu_v4_route_weights,                  \
    .v4_swiglu_clamp = ps_cpu_v4_swiglu_clamp,                    \
    .v4_scatter_add_rows = ps_cpu_v4_scatter_add_rows,            \
    .v4_attn = ps_cpu_v4_attn,                                    \
    .v4_attn_bias = ps_cpu_v4_attn_bias,                          \
    .v4_attn_logits = ps_cpu_v4_attn_logits,                      \
    .v4_attn_softmax = ps_cpu_v4_attn_softmax,                    \
    .v4_attn_apply = ps_cpu_v4_attn_apply,                        \
    .v4_sink_rescale = ps_cpu_v4_sink_rescale,                    \
    .v4_grouped_linear = ps_cpu_v4_grouped_linear,                \
    .v4_scale = ps_cpu_v4_scale,                                  \
    .v4_comp_slots_backward = ps_cpu_v4_comp_slots_backward,      \
    .v4_slot_softmax_backward = ps_cpu_v4_slot_softmax_backward,  \
    .v4_comp_pool_backward = ps_cpu_v4_comp_pool_backward,        \
    .v4_attn_backward = ps_cpu_v4_attn_backward /* ------ end DeepSeek-V4 ------ */

const ps_backend ps_backend_cpu = {
    .name = "cpu",
    .alloc = cpu_alloc,
    .free = cpu_free,
    .to_host = cpu_copy_bytes,
    .from_host = cpu_copy_bytes,
    .host_visible = 1,
    PS_CPU_TABLE
};

/* "cpu-staged": a TEST backend (docs/backends.md), not listed by ps_ctx_backends() nor offered by the CLI.
 * The same host memory and ops, but it declares its buffers not host-visible, so code that branches on
 * ps_ctx_host_visible takes the device path (ps_buf_to_host / ps_buf_from_host copies) while the numbers
 * stay the cpu's bit for bit: tests compare a run on it with the same run on "cpu". */
const ps_backend ps_backend_cpu_staged = {
    .name = "cpu-staged",
    .alloc = cpu_alloc,
    .free = cpu_free,
    .to_host = cpu_copy_bytes,
    .from_host = cpu_copy_bytes,
    .host_visible = 0,
    PS_CPU_TABLE
};
