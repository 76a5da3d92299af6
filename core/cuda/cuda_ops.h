/* cuda_ops.h — the CUDA backend (core/cuda/, docs/cuda.md): the functions behind its op table
 * (ps_backend_cuda, backend_cuda.c). Each ps_cuda_X implements the ops.h op ps_X on the context's stream;
 * the CPU backend (core/cpu/) is the reference the tests compare them with. C declarations: the .cu files
 * define them with C linkage. */
#ifndef PS_CUDA_OPS_H
#define PS_CUDA_OPS_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "core/ops.h"

/* memory and context (backend_cuda_mem.cu) */
void *ps_cuda_alloc(ps_ctx *c, int64_t bytes);
void ps_cuda_free(ps_ctx *c, void *p);
int ps_cuda_to_host(ps_ctx *c, void *host, const void *buf, int64_t bytes);
int ps_cuda_from_host(ps_ctx *c, void *buf, const void *host, int64_t bytes);
int ps_cuda_init(ps_ctx *c);
void ps_cuda_fini(ps_ctx *c);
/* Number of CUDA devices this process can use (0 when there is none or no driver; *why gets the
 * runtime's reason then, when why is not NULL). */
int ps_cuda_device_count(const char **why);
/* One line about the context's device and libraries ("NVIDIA H200, sm_90, 132 SMs, 139.8 GiB; CUDA
 * runtime 13.0, cuBLAS 13.1, cuDNN 9.19.0"), for benches and logs. */
void ps_cuda_describe(ps_ctx *c, char *out, size_t n);
/* Wait until every op queued on the context's stream has run (benches time with this); -1 with the
 * context failed when one of them failed. */
int ps_cuda_sync(ps_ctx *c);

/* Benches: x[n] = std · N(0, 1) from a counter-based generator (seed, index), on the device; the free
 * and total bytes of the context's device. */
int ps_cuda_fill_normal(ps_ctx *c, float *x, int64_t n, uint64_t seed, float std);
int ps_cuda_mem_info(ps_ctx *c, int64_t *free_bytes, int64_t *total_bytes);

/* the ops */
int ps_cuda_matmul(ps_ctx *ctx, float *out, const float *inp, const float *w, int64_t M, int64_t K, int64_t N, int
    accumulate);
int ps_cuda_embed(ps_ctx *ctx, float *out, const int32_t *tok, const float *table, int64_t n_tok, int64_t C);
int ps_cuda_rmsnorm(ps_ctx *ctx, float *out, float *rstd, const float *inp, const float *weight, int64_t n_rows,
    int64_t C, float eps);
int ps_cuda_rope_table(ps_ctx *ctx, float *cos_t, float *sin_t, int64_t n_pos, int64_t hd, double theta);
int ps_cuda_rope(ps_ctx *ctx, float *x, const float *cos_t, const float *sin_t, int64_t n_seq, int64_t rows_per_seq,
    int64_t n_heads, int64_t hd, int64_t pos_step);
int ps_cuda_rope_backward(ps_ctx *ctx, float *dx, const float *cos_t, const float *sin_t, int64_t n_seq, int64_t
    rows_per_seq, int64_t n_heads, int64_t hd, int64_t pos_step);
int ps_cuda_swiglu(ps_ctx *ctx, float *h, const float *g, const float *u, int64_t n);
int ps_cuda_add(ps_ctx *ctx, float *out, const float *a, const float *b, int64_t n);
int ps_cuda_gate_base(ps_ctx *ctx, float *z, float *alpha, const float *a, const float *u, const float *c, int64_t B,
    int64_t T, int64_t d, int64_t nW, int64_t W, int64_t S, int64_t nkv);
int ps_cuda_payload_base(ps_ctx *ctx, float *P, const float *a, const float *C, int shared, float *scratch, int64_t B,
    int64_t T, int64_t d, int64_t nW, int64_t W, int64_t S, int64_t nkvhd);
/* The op table's compressor ops over a window table (grid.cu): a base grid runs compressor.cu's *_base
 * kernels, any other table one kernel family over the table (grid_bodies.h). */
int ps_cuda_gate(ps_ctx *c, float *z, float *alpha, const float *a, const float *u, const float *bias, int64_t d,
    const ps_windows *w);
int ps_cuda_payload(ps_ctx *c, float *P, const float *a, const float *C, int shared, float *scratch, int64_t d, int64_t hd,
    const ps_windows *w);
int ps_cuda_rope_windows(ps_ctx *c, float *x, const float *cos_t, const float *sin_t, int64_t hd, const ps_windows *w,
    int inverse);
int ps_cuda_gate_backward(ps_ctx *c, float *da, float *du, float *dbias, float *dalpha, const float *alpha, const float *a,
    const float *u, int64_t d, const ps_windows *w);
int ps_cuda_payload_backward(ps_ctx *c, float *da, float *dC, const float *dP, const float *a, const float *C, int shared,
    float *scratch, int64_t d, int64_t hd, const ps_windows *w);
/* the gate regulariser (grid.cu) */
int ps_cuda_gate_entropy(ps_ctx *c, double *value, float *dalpha, const float *alpha, int64_t B, int64_t nW,
    int64_t nkv, int64_t W, double weight);
int ps_cuda_pool(ps_ctx *ctx, float *out, const float *alpha, const float *P, int64_t B, int64_t nW, int64_t W,
    int64_t nkv, int64_t hd);
int ps_cuda_attn_probs(ps_ctx *ctx, float *probs, const float *q, const float *k, const float *ck, const ps_attn_geom
    *g);
int ps_cuda_attn_out(ps_ctx *ctx, float *z, const float *probs, const float *v, const float *cv, const ps_attn_geom
    *g);
int ps_cuda_attn_rows(ps_ctx *ctx, float *z_rows, const int64_t *rows, int64_t n, const float *q, const float *k,
    const float *v, const float *ck, const float *cv, const ps_attn_geom *g);
int ps_cuda_matmul_backward(ps_ctx *ctx, float *dinp, float *dw, const float *dout, const float *inp, const float *w,
    int64_t M, int64_t K, int64_t N);
int ps_cuda_rmsnorm_backward(ps_ctx *ctx, float *dinp, float *dweight, const float *dout, const float *inp, const
    float *weight, const float *rstd, int64_t n_rows, int64_t C);
int ps_cuda_swiglu_backward(ps_ctx *ctx, float *dg, float *du, const float *dh, const float *g, const float *u,
    int64_t n);
int ps_cuda_gate_base_backward(ps_ctx *ctx, float *da, float *du, float *dc, float *dalpha, const float *alpha, const float
    *a, const float *u, int64_t B, int64_t T, int64_t d, int64_t nW, int64_t W, int64_t S, int64_t nkv);
int ps_cuda_payload_base_backward(ps_ctx *ctx, float *da, float *dC, const float *dP, const float *a, const float *C, int
    shared, float *scratch, int64_t B, int64_t T, int64_t d, int64_t nW, int64_t W, int64_t S, int64_t nkvhd);
int ps_cuda_pool_backward(ps_ctx *ctx, float *dalpha, float *dP, const float *dout, const float *alpha, const float
    *P, int64_t B, int64_t nW, int64_t W, int64_t nkv, int64_t hd);
int ps_cuda_cross_entropy(ps_ctx *ctx, double *loss_sum, int64_t *n_targets, float *dlogits, const float *logits,
    const int32_t *targets, int64_t n_rows, int64_t V, float scale);
int ps_cuda_copy(ps_ctx *ctx, float *dst, const float *src, int64_t n);
int ps_cuda_fill(ps_ctx *ctx, float *x, float value, int64_t n);
/* the KV cache's ops (kvcache.cu) */
int ps_cuda_kv_attend(ps_ctx *c, float *z, const float *q, const ps_kv_attn *a);
int ps_cuda_kv_gate(ps_ctx *c, float *alpha, const float *u, const float *bias, int learned, const ps_kv_close *w);
int ps_cuda_kv_pool(ps_ctx *c, float *out, const float *alpha, const float *C, int shared, const float *pre, int64_t hd,
                    const ps_kv_close *w);
int ps_cuda_kv_gather(ps_ctx *c, float *out, const ps_kv_pages *p, const int64_t *rows, int64_t n);
int ps_cuda_kv_attend_sink(ps_ctx *c, float *z, const float *q, const float *sink, const ps_kv_attn *a);
int ps_cuda_kv_slots(ps_ctx *c, float *alpha, const float *ape, const ps_kv_chan *k);
int ps_cuda_kv_slot_pool(ps_ctx *c, float *out, const float *alpha, const ps_kv_chan *k);
int ps_cuda_gather_rows(ps_ctx *ctx, float *out, const float *in, const float *add, const int64_t *rows, int64_t n,
    int64_t width);
int ps_cuda_scatter_rows(ps_ctx *ctx, float *out, const float *in, const int64_t *rows, int64_t n, int64_t width);
int ps_cuda_pattern_expand(ps_ctx *ctx, float *full, const float *probs, const ps_attn_geom *g);
int ps_cuda_pattern_compact(ps_ctx *ctx, float *probs, const float *full, const ps_attn_geom *g);
int ps_cuda_head_set(ps_ctx *ctx, float *x, const float *src, int64_t src_stride, int64_t n_seq, int64_t npos, int64_t
    nh, int64_t hd, int64_t head, int64_t seq0, int64_t seq1);
int ps_cuda_add_vector(ps_ctx *ctx, float *x, const float *vec, float scale, int64_t n_rows, int64_t width);
int ps_cuda_roll_blocks(ps_ctx *ctx, float *x, int64_t W, int64_t stride, int64_t off, int64_t len, int64_t k);
int ps_cuda_copy_blocks(ps_ctx *ctx, float *dst, int64_t dst_s0, int64_t dst_s1, const float *src, int64_t src_s0,
    int64_t src_s1, int64_t n0, int64_t n1, int64_t width, int accumulate, float scale);
int ps_cuda_accumulate_seqs(ps_ctx *ctx, double *sum, const float *x, int64_t n_seq, int64_t n);
int ps_cuda_delta_dot(ps_ctx *ctx, double *out, const float *g, const float *x, const float *src, int64_t src_nseq,
                      int64_t B, int64_t npos, int64_t nh, int64_t X);
int ps_cuda_sum_to_mean(ps_ctx *ctx, float *mean, const double *sum, double count, int64_t n);
int ps_cuda_embed_backward(ps_ctx *ctx, float *dtable, const float *dout, const int32_t *tok, int64_t n_tok, int64_t
    C);
int ps_cuda_sumsq(ps_ctx *ctx, double *out, const float *x, int64_t n);
int ps_cuda_adamw(ps_ctx *ctx, float *w, float *m1, float *m2, const float *g, const ps_adamw_seg *segs, int n_segs,
    const ps_adamw_hyper *h);
int ps_cuda_attn_chunk(ps_ctx *ctx, float *z, const float *q, const float *k, const float *v, const float *ck, const
    float *cv, const ps_attn_frame *f);
int ps_cuda_attn_forward(ps_ctx *ctx, float *z, float *lse, const float *q, const float *k, const float *v, const
    float *ck, const float *cv, const ps_attn_geom *g);
int ps_cuda_attn_backward(ps_ctx *ctx, float *dq, float *dk, float *dv, float *dck, float *dcv, const float *dz, const
    float *z, const float *lse, const float *q, const float *k, const float *v, const float *ck, const float *cv,
    const ps_attn_geom *g);

/* block-sparse selection (select.cu; the arithmetic in select_bodies.h) */
int ps_cuda_select_compress(ps_ctx *c, float *ck, const float *k, int64_t B, int64_t L, int64_t Hkv, int64_t D, int64_t K,
    int64_t S);
int ps_cuda_select_scores(ps_ctx *c, float *P, const float *q, const float *k1, const float *k2, const ps_sel_geom *g);
int ps_cuda_select_block_scores(ps_ctx *c, float *bs, const float *P, const ps_sel_geom *g);
int ps_cuda_select_topk(ps_ctx *c, float *blocks, const float *bs, const ps_sel_geom *g);
int ps_cuda_select_attn(ps_ctx *c, float *z, float *lse, const float *q, const float *k, const float *v, const float *blocks,
    const ps_sel_geom *g);
int ps_cuda_select_backward(ps_ctx *c, float *dq, float *dk, float *dv, const float *dz, const float *z, const float *lse,
    const float *q, const float *k, const float *v, const float *blocks, const ps_sel_geom *g);
/* DeepSeek-V4 (v4.cu; the arithmetic in v4_bodies.h) */
int ps_cuda_v4_rope_table(ps_ctx *c, float *cos_t, float *sin_t, int64_t n_pos, int64_t half, const double *inv_freq,
    float mscale);
int ps_cuda_v4_rope(ps_ctx *c, float *x, const float *cos_t, const float *sin_t, int64_t n_seq, int64_t rows_per_seq,
    int64_t n_heads, int64_t hd, int64_t rd, int64_t pos_step, int inverse);
int ps_cuda_v4_hc_weights(ps_ctx *c, float *pre, float *post, float *comb, const float *mix, const float *x,
    const float *scale, const float *base, int64_t n, int64_t N, int64_t D, int64_t iters, float hc_eps, float norm_eps);
int ps_cuda_v4_hc_collapse(ps_ctx *c, float *out, const float *pre, const float *h, int64_t n, int64_t N, int64_t D);
int ps_cuda_v4_hc_expand(ps_ctx *c, float *hout, const float *post, const float *comb, const float *blk, const float *h,
    int64_t n, int64_t N, int64_t D);
int ps_cuda_v4_comp_slots(ps_ctx *c, float *gate, const float *z, const float *ape, int64_t B, int64_t T, int64_t nW,
    int64_t m, int64_t d, int overlap);
int ps_cuda_v4_slot_softmax(ps_ctx *c, float *alpha, const float *gate, int64_t n_groups, int64_t S, int64_t d);
int ps_cuda_v4_comp_pool(ps_ctx *c, float *pooled, const float *alpha, const float *kv, int64_t B, int64_t T,
    int64_t nW, int64_t m, int64_t d, int overlap);
int ps_cuda_v4_indexer_scores(ps_ctx *c, float *scores, const float *iq, const float *ik, const float *w, int64_t B,
    int64_t T, int64_t nW, int64_t Hi, int64_t Di, float scale);
int ps_cuda_v4_topk(ps_ctx *c, float *idx, float *gap, const float *scores, const float *bias, int64_t n_rows,
    int64_t n_cols, int64_t K, int64_t rows_per_seq, int64_t m);
int ps_cuda_v4_router_scores(ps_ctx *c, float *scores, const float *logits, int64_t n, int scoring);
int ps_cuda_v4_route_weights(ps_ctx *c, float *weights, const float *scores, const float *idx, int64_t n, int64_t E,
    int64_t k, float scale);
int ps_cuda_v4_swiglu_clamp(ps_ctx *c, float *h, const float *g, const float *u, int64_t n, float limit);
int ps_cuda_v4_scatter_add_rows(ps_ctx *c, float *out, const float *in, const int64_t *rows, const float *w, int64_t n,
    int64_t width);
int ps_cuda_v4_attn(ps_ctx *c, float *out, float *sinkp, const float *q, const float *kv, const float *ckv,
    const float *topk, const float *sink, const ps_v4_attn_geom *g);
int ps_cuda_v4_attn_bias(ps_ctx *c, float *bias, const float *topk, const ps_v4_attn_geom *g);
int ps_cuda_v4_attn_logits(ps_ctx *c, float *logits, const float *q, const float *kv, const float *ckv,
    const float *bias, const ps_v4_attn_geom *g);
int ps_cuda_v4_attn_softmax(ps_ctx *c, float *pattern, float *sinkp, const float *logits, const float *sink,
    const ps_v4_attn_geom *g);
int ps_cuda_v4_attn_apply(ps_ctx *c, float *out, const float *pattern, const float *kv, const float *ckv,
    const ps_v4_attn_geom *g);
int ps_cuda_v4_sink_rescale(ps_ctx *c, float *out, const float *sink_old, const float *sink_new,
    const ps_v4_attn_geom *g);
int ps_cuda_v4_grouped_linear(ps_ctx *c, float *out, const float *inp, const float *w, int64_t M, int64_t G,
    int64_t Kg, int64_t Ng);
int ps_cuda_v4_scale(ps_ctx *c, float *x, float s, int64_t n);
int ps_cuda_v4_comp_slots_backward(ps_ctx *c, float *dz, float *dape, const float *dgate, int64_t B, int64_t T,
    int64_t nW, int64_t m, int64_t d, int overlap);
int ps_cuda_v4_slot_softmax_backward(ps_ctx *c, float *dgate, const float *dalpha, const float *alpha,
    int64_t n_groups, int64_t S, int64_t d);
int ps_cuda_v4_comp_pool_backward(ps_ctx *c, float *dalpha, float *dkv, const float *dpooled, const float *alpha,
    const float *kv, int64_t B, int64_t T, int64_t nW, int64_t m, int64_t d, int overlap);
int ps_cuda_v4_attn_backward(ps_ctx *c, float *dq, float *dkv, float *dckv, float *dsink, const float *dout,
    const float *out, const float *q, const float *kv, const float *ckv, const float *sink, const ps_v4_attn_geom *g);
/* kvcache_v4.cu: the DeepSeek-V4 KV cache's ops */
int ps_cuda_v4_kv_attend(ps_ctx *c, float *out, float *sinkp, const float *q, const float *topk, const float *sink,
    const ps_v4_kv_attn *a);
int ps_cuda_v4_kv_slots(ps_ctx *c, float *gate, const float *ape, const ps_kv_chan *k);

#ifdef __cplusplus
}
#endif

#endif
