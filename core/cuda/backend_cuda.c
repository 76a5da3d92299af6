/* backend_cuda.c — the CUDA backend's op table (docs/cuda.md). Memory lives on the device (cudaMalloc,
 * zero-filled on the context's stream); every op is queued on the context's stream, and host copies
 * (ps_buf_to_host / ps_buf_from_host) wait for it. The kernels are in the .cu files beside this one.
 *
 * The DeepSeek-V4 block of ops is not implemented on the device yet (the V4 runtime is CPU-only): each of
 * those entries fails with "DeepSeek-V4 op X is not implemented on the cuda backend". */
#include "core/cuda/cuda_ops.h"

#define V4_MISSING(op) return ps_ctx_fail(c, "DeepSeek-V4 op %s is not implemented on the cuda backend", op)

static int ps_cuda_v4_rope_table(ps_ctx *c, float *cos_t, float *sin_t, int64_t n_pos, int64_t half, const double
    *inv_freq, float mscale) {
    (void)cos_t; (void)sin_t; (void)n_pos; (void)half; (void)inv_freq; (void)mscale;
    V4_MISSING("v4_rope_table");
}

static int ps_cuda_v4_rope(ps_ctx *c, float *x, const float *cos_t, const float *sin_t, int64_t n_seq, int64_t
    rows_per_seq, int64_t n_heads, int64_t hd, int64_t rd, int64_t pos_step, int inverse) {
    (void)x; (void)cos_t; (void)sin_t; (void)n_seq; (void)rows_per_seq; (void)n_heads; (void)hd; (void)rd;
    (void)pos_step; (void)inverse;
    V4_MISSING("v4_rope");
}

static int ps_cuda_v4_hc_weights(ps_ctx *c, float *pre, float *post, float *comb, const float *mix, const float *x,
    const float *scale, const float *base, int64_t n, int64_t N, int64_t D, int64_t iters, float hc_eps, float
    norm_eps) {
    (void)pre; (void)post; (void)comb; (void)mix; (void)x; (void)scale; (void)base; (void)n; (void)N; (void)D;
    (void)iters; (void)hc_eps; (void)norm_eps;
    V4_MISSING("v4_hc_weights");
}

static int ps_cuda_v4_hc_collapse(ps_ctx *c, float *out, const float *pre, const float *h, int64_t n, int64_t N,
    int64_t D) {
    (void)out; (void)pre; (void)h; (void)n; (void)N; (void)D;
    V4_MISSING("v4_hc_collapse");
}

static int ps_cuda_v4_hc_expand(ps_ctx *c, float *hout, const float *post, const float *comb, const float *blk, const
    float *h, int64_t n, int64_t N, int64_t D) {
    (void)hout; (void)post; (void)comb; (void)blk; (void)h; (void)n; (void)N; (void)D;
    V4_MISSING("v4_hc_expand");
}

static int ps_cuda_v4_comp_slots(ps_ctx *c, float *gate, const float *z, const float *ape, int64_t B, int64_t T,
    int64_t nW, int64_t m, int64_t d, int overlap) {
    (void)gate; (void)z; (void)ape; (void)B; (void)T; (void)nW; (void)m; (void)d; (void)overlap;
    V4_MISSING("v4_comp_slots");
}

static int ps_cuda_v4_slot_softmax(ps_ctx *c, float *alpha, const float *gate, int64_t n_groups, int64_t S, int64_t d)
    {
    (void)alpha; (void)gate; (void)n_groups; (void)S; (void)d;
    V4_MISSING("v4_slot_softmax");
}

static int ps_cuda_v4_comp_pool(ps_ctx *c, float *pooled, const float *alpha, const float *kv, int64_t B, int64_t T,
    int64_t nW, int64_t m, int64_t d, int overlap) {
    (void)pooled; (void)alpha; (void)kv; (void)B; (void)T; (void)nW; (void)m; (void)d; (void)overlap;
    V4_MISSING("v4_comp_pool");
}

static int ps_cuda_v4_indexer_scores(ps_ctx *c, float *scores, const float *iq, const float *ik, const float *w,
    int64_t B, int64_t T, int64_t nW, int64_t Hi, int64_t Di, float scale) {
    (void)scores; (void)iq; (void)ik; (void)w; (void)B; (void)T; (void)nW; (void)Hi; (void)Di; (void)scale;
    V4_MISSING("v4_indexer_scores");
}

static int ps_cuda_v4_topk(ps_ctx *c, float *idx, float *gap, const float *scores, const float *bias, int64_t n_rows,
    int64_t n_cols, int64_t K, int64_t rows_per_seq, int64_t m) {
    (void)idx; (void)gap; (void)scores; (void)bias; (void)n_rows; (void)n_cols; (void)K; (void)rows_per_seq;
    (void)m;
    V4_MISSING("v4_topk");
}

static int ps_cuda_v4_router_scores(ps_ctx *c, float *scores, const float *logits, int64_t n, int scoring) {
    (void)scores; (void)logits; (void)n; (void)scoring;
    V4_MISSING("v4_router_scores");
}

static int ps_cuda_v4_route_weights(ps_ctx *c, float *weights, const float *scores, const float *idx, int64_t n,
    int64_t E, int64_t k, float scale) {
    (void)weights; (void)scores; (void)idx; (void)n; (void)E; (void)k; (void)scale;
    V4_MISSING("v4_route_weights");
}

static int ps_cuda_v4_swiglu_clamp(ps_ctx *c, float *h, const float *g, const float *u, int64_t n, float limit) {
    (void)h; (void)g; (void)u; (void)n; (void)limit;
    V4_MISSING("v4_swiglu_clamp");
}

static int ps_cuda_v4_scatter_add_rows(ps_ctx *c, float *out, const float *in, const int64_t *rows, const float *w,
    int64_t n, int64_t width) {
    (void)out; (void)in; (void)rows; (void)w; (void)n; (void)width;
    V4_MISSING("v4_scatter_add_rows");
}

static int ps_cuda_v4_attn(ps_ctx *c, float *out, float *sinkp, const float *q, const float *kv, const float *ckv,
    const float *topk, const float *sink, const ps_v4_attn_geom *g) {
    (void)out; (void)sinkp; (void)q; (void)kv; (void)ckv; (void)topk; (void)sink; (void)g;
    V4_MISSING("v4_attn");
}

static int ps_cuda_v4_attn_bias(ps_ctx *c, float *bias, const float *topk, const ps_v4_attn_geom *g) {
    (void)bias; (void)topk; (void)g;
    V4_MISSING("v4_attn_bias");
}

static int ps_cuda_v4_attn_logits(ps_ctx *c, float *logits, const float *q, const float *kv, const float *ckv, const
    float *bias, const ps_v4_attn_geom *g) {
    (void)logits; (void)q; (void)kv; (void)ckv; (void)bias; (void)g;
    V4_MISSING("v4_attn_logits");
}

static int ps_cuda_v4_attn_softmax(ps_ctx *c, float *pattern, float *sinkp, const float *logits, const float *sink,
    const ps_v4_attn_geom *g) {
    (void)pattern; (void)sinkp; (void)logits; (void)sink; (void)g;
    V4_MISSING("v4_attn_softmax");
}

static int ps_cuda_v4_attn_apply(ps_ctx *c, float *out, const float *pattern, const float *kv, const float *ckv, const
    ps_v4_attn_geom *g) {
    (void)out; (void)pattern; (void)kv; (void)ckv; (void)g;
    V4_MISSING("v4_attn_apply");
}

static int ps_cuda_v4_sink_rescale(ps_ctx *c, float *out, const float *sink_old, const float *sink_new, const
    ps_v4_attn_geom *g) {
    (void)out; (void)sink_old; (void)sink_new; (void)g;
    V4_MISSING("v4_sink_rescale");
}

static int ps_cuda_v4_grouped_linear(ps_ctx *c, float *out, const float *inp, const float *w, int64_t M, int64_t G,
    int64_t Kg, int64_t Ng) {
    (void)out; (void)inp; (void)w; (void)M; (void)G; (void)Kg; (void)Ng;
    V4_MISSING("v4_grouped_linear");
}

static int ps_cuda_v4_scale(ps_ctx *c, float *x, float s, int64_t n) {
    (void)x; (void)s; (void)n;
    V4_MISSING("v4_scale");
}

static int ps_cuda_v4_comp_slots_backward(ps_ctx *c, float *dz, float *dape, const float *dgate, int64_t B, int64_t T,
    int64_t nW, int64_t m, int64_t d, int overlap) {
    (void)dz; (void)dape; (void)dgate; (void)B; (void)T; (void)nW; (void)m; (void)d; (void)overlap;
    V4_MISSING("v4_comp_slots_backward");
}

static int ps_cuda_v4_slot_softmax_backward(ps_ctx *c, float *dgate, const float *dalpha, const float *alpha,
    int64_t n_groups, int64_t S, int64_t d) {
    (void)dgate; (void)dalpha; (void)alpha; (void)n_groups; (void)S; (void)d;
    V4_MISSING("v4_slot_softmax_backward");
}

static int ps_cuda_v4_comp_pool_backward(ps_ctx *c, float *dalpha, float *dkv, const float *dpooled, const float *alpha,
    const float *kv, int64_t B, int64_t T, int64_t nW, int64_t m, int64_t d, int overlap) {
    (void)dalpha; (void)dkv; (void)dpooled; (void)alpha; (void)kv; (void)B; (void)T; (void)nW; (void)m; (void)d;
    (void)overlap;
    V4_MISSING("v4_comp_pool_backward");
}

static int ps_cuda_v4_attn_backward(ps_ctx *c, float *dq, float *dkv, float *dckv, float *dsink, const float *dout,
    const float *out, const float *q, const float *kv, const float *ckv, const float *sink, const ps_v4_attn_geom *g) {
    (void)dq; (void)dkv; (void)dckv; (void)dsink; (void)dout; (void)out; (void)q; (void)kv; (void)ckv; (void)sink; (void)g;
    V4_MISSING("v4_attn_backward");
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
    .grid_offsets = 1, /* attention.cu honours woff / cend; the *_grid and *_chunks ops are in grid.cu */
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
    /* ---------------- DeepSeek-V4 (SPEC-v4): not on the device yet ---------------- */
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
