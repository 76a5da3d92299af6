/* backend_cuda.c — the CUDA backend's op table (docs/cuda.md). Memory lives on the device (cudaMalloc,
 * zero-filled on the context's stream); every op is queued on the context's stream, and host copies
 * (ps_buf_to_host / ps_buf_from_host) wait for it. The kernels are in the .cu files beside this one.
 *
 * The DeepSeek-V4 block of ops is in v4.cu (naive kernels over the bodies of v4_bodies.h). */
#include "core/cuda/cuda_ops.h"

/* Window grids with start offsets (staggered grids, phase augmentation) and the gate regulariser are CPU-only
 * for now: grid_offsets is 0 (the attention ops refuse a geometry with offsets before reaching the device) and
 * these entries fail with "op X is not implemented on the cuda backend". */
#define GRID_MISSING(op) return ps_ctx_fail(c, "op %s (window grids with offsets, gate regulariser) is not implemented on the cuda backend", op)

static int ps_cuda_gate_grid(ps_ctx *c, float *z, float *alpha, const float *a, const float *u, const float *bias, int64_t B,
    int64_t T, int64_t d, int64_t nW, int64_t W, int64_t S, int64_t nkv, const int64_t *woff) {
    (void)z; (void)alpha; (void)a; (void)u; (void)bias; (void)B; (void)T; (void)d; (void)nW; (void)W; (void)S; (void)nkv;
    (void)woff;
    GRID_MISSING("gate_grid");
}

static int ps_cuda_payload_grid(ps_ctx *c, float *P, const float *a, const float *C, int shared, float *scratch, int64_t B,
    int64_t T, int64_t d, int64_t nW, int64_t W, int64_t S, int64_t nkv, int64_t hd, const int64_t *woff) {
    (void)P; (void)a; (void)C; (void)shared; (void)scratch; (void)B; (void)T; (void)d; (void)nW; (void)W; (void)S;
    (void)nkv; (void)hd; (void)woff;
    GRID_MISSING("payload_grid");
}

static int ps_cuda_rope_grid(ps_ctx *c, float *x, const float *cos_t, const float *sin_t, int64_t B, int64_t T, int64_t nW,
    int64_t nkv, int64_t hd, int64_t S, const int64_t *woff, int inverse) {
    (void)x; (void)cos_t; (void)sin_t; (void)B; (void)T; (void)nW; (void)nkv; (void)hd; (void)S; (void)woff; (void)inverse;
    GRID_MISSING("rope_grid");
}

static int ps_cuda_gate_grid_backward(ps_ctx *c, float *da, float *du, float *dbias, float *dalpha, const float *alpha,
    const float *a, const float *u, int64_t B, int64_t T, int64_t d, int64_t nW, int64_t W, int64_t S, int64_t nkv,
    const int64_t *woff) {
    (void)da; (void)du; (void)dbias; (void)dalpha; (void)alpha; (void)a; (void)u; (void)B; (void)T; (void)d; (void)nW;
    (void)W; (void)S; (void)nkv; (void)woff;
    GRID_MISSING("gate_grid_backward");
}

static int ps_cuda_payload_grid_backward(ps_ctx *c, float *da, float *dC, const float *dP, const float *a, const float *C,
    int shared, float *scratch, int64_t B, int64_t T, int64_t d, int64_t nW, int64_t W, int64_t S, int64_t nkv, int64_t hd,
    const int64_t *woff) {
    (void)da; (void)dC; (void)dP; (void)a; (void)C; (void)shared; (void)scratch; (void)B; (void)T; (void)d; (void)nW;
    (void)W; (void)S; (void)nkv; (void)hd; (void)woff;
    GRID_MISSING("payload_grid_backward");
}

static int ps_cuda_gate_entropy(ps_ctx *c, double *value, float *dalpha, const float *alpha, int64_t B, int64_t nW,
    int64_t nkv, int64_t W, double weight) {
    (void)value; (void)dalpha; (void)alpha; (void)B; (void)nW; (void)nkv; (void)W; (void)weight;
    GRID_MISSING("gate_entropy");
}

/* Content-defined chunk boundaries (attention.boundaries "content", docs/mitigations.md §4): CPU-only too. */
#define CHUNKS_MISSING(op) return ps_ctx_fail(c, "op %s (content chunk boundaries, attention.boundaries \"content\") is not implemented on the cuda backend", op)

static int ps_cuda_gate_chunks(ps_ctx *c, float *z, float *alpha, const float *a, const float *u, const float *bias, int64_t B,
    int64_t T, int64_t d, int64_t nC, int64_t W, int64_t nkv, const int64_t *cs, const int64_t *cl) {
    (void)z; (void)alpha; (void)a; (void)u; (void)bias; (void)B; (void)T; (void)d; (void)nC; (void)W; (void)nkv; (void)cs;
    (void)cl;
    CHUNKS_MISSING("gate_chunks");
}

static int ps_cuda_payload_chunks(ps_ctx *c, float *P, const float *a, const float *C, int shared, float *scratch, int64_t B,
    int64_t T, int64_t d, int64_t nC, int64_t W, int64_t nkv, int64_t hd, const int64_t *cs, const int64_t *cl) {
    (void)P; (void)a; (void)C; (void)shared; (void)scratch; (void)B; (void)T; (void)d; (void)nC; (void)W; (void)nkv;
    (void)hd; (void)cs; (void)cl;
    CHUNKS_MISSING("payload_chunks");
}

static int ps_cuda_rope_chunks(ps_ctx *c, float *x, const float *cos_t, const float *sin_t, int64_t B, int64_t T, int64_t nC,
    int64_t nkv, int64_t hd, const int64_t *cs, const int64_t *cl, int inverse) {
    (void)x; (void)cos_t; (void)sin_t; (void)B; (void)T; (void)nC; (void)nkv; (void)hd; (void)cs; (void)cl; (void)inverse;
    CHUNKS_MISSING("rope_chunks");
}

static int ps_cuda_gate_chunks_backward(ps_ctx *c, float *da, float *du, float *dbias, float *dalpha, const float *alpha,
    const float *a, const float *u, int64_t B, int64_t T, int64_t d, int64_t nC, int64_t W, int64_t nkv, const int64_t *cs,
    const int64_t *cl) {
    (void)da; (void)du; (void)dbias; (void)dalpha; (void)alpha; (void)a; (void)u; (void)B; (void)T; (void)d; (void)nC;
    (void)W; (void)nkv; (void)cs; (void)cl;
    CHUNKS_MISSING("gate_chunks_backward");
}

static int ps_cuda_payload_chunks_backward(ps_ctx *c, float *da, float *dC, const float *dP, const float *a, const float *C,
    int shared, float *scratch, int64_t B, int64_t T, int64_t d, int64_t nC, int64_t W, int64_t nkv, int64_t hd,
    const int64_t *cs, const int64_t *cl) {
    (void)da; (void)dC; (void)dP; (void)a; (void)C; (void)shared; (void)scratch; (void)B; (void)T; (void)d; (void)nC;
    (void)W; (void)nkv; (void)hd; (void)cs; (void)cl;
    CHUNKS_MISSING("payload_chunks_backward");
}

const ps_backend ps_backend_cuda = {
    .name = "cuda",
    .alloc = ps_cuda_alloc,
    .free = ps_cuda_free,
    .to_host = ps_cuda_to_host,
    .from_host = ps_cuda_from_host,
    .host_visible = 0,
    .init = ps_cuda_init,
    .fini = ps_cuda_fini,
    .matmul = ps_cuda_matmul,
    .embed = ps_cuda_embed,
    .rmsnorm = ps_cuda_rmsnorm,
    .rope_table = ps_cuda_rope_table,
    .rope = ps_cuda_rope,
    .rope_backward = ps_cuda_rope_backward,
    .swiglu = ps_cuda_swiglu,
    .add = ps_cuda_add,
    .grid_offsets = 0,
    .gate_grid = ps_cuda_gate_grid,
    .payload_grid = ps_cuda_payload_grid,
    .rope_grid = ps_cuda_rope_grid,
    .gate_grid_backward = ps_cuda_gate_grid_backward,
    .payload_grid_backward = ps_cuda_payload_grid_backward,
    .gate_entropy = ps_cuda_gate_entropy,
    .gate_chunks = ps_cuda_gate_chunks,
    .payload_chunks = ps_cuda_payload_chunks,
    .rope_chunks = ps_cuda_rope_chunks,
    .gate_chunks_backward = ps_cuda_gate_chunks_backward,
    .payload_chunks_backward = ps_cuda_payload_chunks_backward,
    .gate = ps_cuda_gate,
    .payload = ps_cuda_payload,
    .pool = ps_cuda_pool,
    .attn_probs = ps_cuda_attn_probs,
    .attn_out = ps_cuda_attn_out,
    .attn_rows = ps_cuda_attn_rows,
    .matmul_backward = ps_cuda_matmul_backward,
    .rmsnorm_backward = ps_cuda_rmsnorm_backward,
    .swiglu_backward = ps_cuda_swiglu_backward,
    .gate_backward = ps_cuda_gate_backward,
    .payload_backward = ps_cuda_payload_backward,
    .pool_backward = ps_cuda_pool_backward,
    .cross_entropy = ps_cuda_cross_entropy,
    .copy = ps_cuda_copy,
    .fill = ps_cuda_fill,
    .gather_rows = ps_cuda_gather_rows,
    .scatter_rows = ps_cuda_scatter_rows,
    .pattern_expand = ps_cuda_pattern_expand,
    .pattern_compact = ps_cuda_pattern_compact,
    .head_set = ps_cuda_head_set,
    .add_vector = ps_cuda_add_vector,
    .roll_blocks = ps_cuda_roll_blocks,
    .copy_blocks = ps_cuda_copy_blocks,
    .accumulate_seqs = ps_cuda_accumulate_seqs,
    .delta_dot = ps_cuda_delta_dot,
    .sum_to_mean = ps_cuda_sum_to_mean,
    .embed_backward = ps_cuda_embed_backward,
    .sumsq = ps_cuda_sumsq,
    .adamw = ps_cuda_adamw,
    .attn_chunk = ps_cuda_attn_chunk,
    .attn_forward = ps_cuda_attn_forward,
    .attn_backward = ps_cuda_attn_backward,
    /* ---------------- DeepSeek-V4 (SPEC-v4): v4.cu ---------------- */
    .v4_rope_table = ps_cuda_v4_rope_table,
    .v4_rope = ps_cuda_v4_rope,
    .v4_hc_weights = ps_cuda_v4_hc_weights,
    .v4_hc_collapse = ps_cuda_v4_hc_collapse,
    .v4_hc_expand = ps_cuda_v4_hc_expand,
    .v4_comp_slots = ps_cuda_v4_comp_slots,
    .v4_slot_softmax = ps_cuda_v4_slot_softmax,
    .v4_comp_pool = ps_cuda_v4_comp_pool,
    .v4_indexer_scores = ps_cuda_v4_indexer_scores,
    .v4_topk = ps_cuda_v4_topk,
    .v4_router_scores = ps_cuda_v4_router_scores,
    .v4_route_weights = ps_cuda_v4_route_weights,
    .v4_swiglu_clamp = ps_cuda_v4_swiglu_clamp,
    .v4_scatter_add_rows = ps_cuda_v4_scatter_add_rows,
    .v4_attn = ps_cuda_v4_attn,
    .v4_attn_bias = ps_cuda_v4_attn_bias,
    .v4_attn_logits = ps_cuda_v4_attn_logits,
    .v4_attn_softmax = ps_cuda_v4_attn_softmax,
    .v4_attn_apply = ps_cuda_v4_attn_apply,
    .v4_sink_rescale = ps_cuda_v4_sink_rescale,
    .v4_grouped_linear = ps_cuda_v4_grouped_linear,
    .v4_scale = ps_cuda_v4_scale,
    .v4_comp_slots_backward = ps_cuda_v4_comp_slots_backward,
    .v4_slot_softmax_backward = ps_cuda_v4_slot_softmax_backward,
    .v4_comp_pool_backward = ps_cuda_v4_comp_pool_backward,
    .v4_attn_backward = ps_cuda_v4_attn_backward,
    /* ---------------- end DeepSeek-V4 ---------------- */
};
