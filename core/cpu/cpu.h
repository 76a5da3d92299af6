/* cpu.h — the CPU backend (the reference implementation of core/ops.h): OpenBLAS sgemm for matrix
 * products (called outside OpenMP regions, or inside them single-threaded), OpenMP loops for the rest.
 * Each function implements the ops.h op of the same name (ps_cpu_X ↔ ps_X); the table that hands
 * them to a context is ps_backend_cpu (backend_cpu.c). ps_cpu_attn_backward_probs is the backward
 * from stored probabilities (the path before flash attention), kept as the naive reference the
 * tests compare the recomputing backward with. */
#ifndef PS_CPU_H
#define PS_CPU_H

#include "core/ops.h"

/* core/cpu/ops_cpu.c and ops_cpu_backward.c */
int ps_cpu_matmul(ps_ctx *ctx, float *out, const float *inp, const float *w, int64_t M, int64_t K, int64_t N, int
    accumulate);
int ps_cpu_embed(ps_ctx *ctx, float *out, const int32_t *tok, const float *table, int64_t n_tok, int64_t C);
int ps_cpu_rmsnorm(ps_ctx *ctx, float *out, float *rstd, const float *inp, const float *weight, int64_t n_rows,
    int64_t C, float eps);
int ps_cpu_rope_table(ps_ctx *ctx, float *cos_t, float *sin_t, int64_t n_pos, int64_t hd, double theta);
int ps_cpu_rope(ps_ctx *ctx, float *x, const float *cos_t, const float *sin_t, int64_t n_seq, int64_t rows_per_seq,
    int64_t n_heads, int64_t hd, int64_t pos_step);
int ps_cpu_rope_backward(ps_ctx *ctx, float *dx, const float *cos_t, const float *sin_t, int64_t n_seq, int64_t
    rows_per_seq, int64_t n_heads, int64_t hd, int64_t pos_step);
int ps_cpu_swiglu(ps_ctx *ctx, float *h, const float *g, const float *u, int64_t n);
int ps_cpu_add(ps_ctx *ctx, float *out, const float *a, const float *b, int64_t n);
/* core/cpu/windows.c: the compressor over a window table (base grid, staggered grids, content chunks) */
int ps_cpu_gate(ps_ctx *ctx, float *z, float *alpha, const float *a, const float *u, const float *c, int64_t d,
                const ps_windows *win);
int ps_cpu_payload(ps_ctx *ctx, float *P, const float *a, const float *C, int shared, float *scratch, int64_t d, int64_t hd,
                   const ps_windows *win);
int ps_cpu_rope_windows(ps_ctx *ctx, float *x, const float *cos_t, const float *sin_t, int64_t hd, const ps_windows *win,
                        int inverse);
int ps_cpu_gate_backward(ps_ctx *ctx, float *da, float *du, float *dc, float *dalpha, const float *alpha, const float *a,
                         const float *u, int64_t d, const ps_windows *win);
int ps_cpu_payload_backward(ps_ctx *ctx, float *da, float *dC, const float *dP, const float *a, const float *C, int shared,
                            float *scratch, int64_t d, int64_t hd, const ps_windows *win);
/* core/cpu/grid.c: the gate regulariser */
int ps_cpu_gate_entropy(ps_ctx *ctx, double *value, float *dalpha, const float *alpha, int64_t B, int64_t nW, int64_t nkv,
                        int64_t W, double weight);
int ps_cpu_pool(ps_ctx *ctx, float *out, const float *alpha, const float *P, int64_t B, int64_t nW, int64_t W, int64_t
    nkv, int64_t hd);
int ps_cpu_attn_rows(ps_ctx *ctx, float *z_rows, const int64_t *rows, int64_t n, const float *q, const float *k, const
    float *v, const float *ck, const float *cv, const ps_attn_geom *g);
int ps_cpu_matmul_backward(ps_ctx *ctx, float *dinp, float *dw, const float *dout, const float *inp, const float *w,
    int64_t M, int64_t K, int64_t N);
int ps_cpu_rmsnorm_backward(ps_ctx *ctx, float *dinp, float *dweight, const float *dout, const float *inp, const float
    *weight, const float *rstd, int64_t n_rows, int64_t C);
int ps_cpu_swiglu_backward(ps_ctx *ctx, float *dg, float *du, const float *dh, const float *g, const float *u, int64_t
    n);
int ps_cpu_pool_backward(ps_ctx *ctx, float *dalpha, float *dP, const float *dout, const float *alpha, const float *P,
    int64_t B, int64_t nW, int64_t W, int64_t nkv, int64_t hd);
int ps_cpu_attn_backward_probs(ps_ctx *ctx, float *dq, float *dk, float *dv, float *dck, float *dcv, float *dprobs,
    const float *dz, const float *probs, const float *q, const float *k, const float *v, const float *ck, const float
    *cv, const ps_attn_geom *g);
int ps_cpu_cross_entropy(ps_ctx *ctx, double *loss_sum, int64_t *n_targets, float *dlogits, const float *logits, const
    int32_t *targets, int64_t n_rows, int64_t V, float scale);

/* core/cpu/kv.c: the KV cache's ops */
int ps_cpu_kv_attend(ps_ctx *ctx, float *z, const float *q, const ps_kv_attn *a);
int ps_cpu_kv_gate(ps_ctx *ctx, float *alpha, const float *u, const float *bias, int learned, const ps_kv_close *w);
int ps_cpu_kv_pool(ps_ctx *ctx, float *out, const float *alpha, const float *C, int shared, const float *pre, int64_t hd,
                   const ps_kv_close *w);
int ps_cpu_kv_gather(ps_ctx *ctx, float *out, const ps_kv_pages *p, const int64_t *rows, int64_t n);
int ps_cpu_kv_attend_sink(ps_ctx *ctx, float *z, const float *q, const float *sink, const ps_kv_attn *a);
int ps_cpu_kv_slots(ps_ctx *ctx, float *alpha, const float *ape, const ps_kv_chan *k);
int ps_cpu_kv_slot_pool(ps_ctx *ctx, float *out, const float *alpha, const ps_kv_chan *k);

/* core/cpu/select_cpu.c: block-sparse selection (core/select.c's fast paths per sequence) */
int ps_cpu_select_compress(ps_ctx *ctx, float *ck, const float *k, int64_t B, int64_t L, int64_t Hkv, int64_t D, int64_t K,
                           int64_t S);
int ps_cpu_select_scores(ps_ctx *ctx, float *P, const float *q, const float *k1, const float *k2, const ps_sel_geom *g);
int ps_cpu_select_block_scores(ps_ctx *ctx, float *bs, const float *P, const ps_sel_geom *g);
int ps_cpu_select_topk(ps_ctx *ctx, float *blocks, const float *bs, const ps_sel_geom *g);
int ps_cpu_select_attn(ps_ctx *ctx, float *z, float *lse, const float *q, const float *k, const float *v, const float *blocks,
                       const ps_sel_geom *g);
int ps_cpu_select_backward(ps_ctx *ctx, float *dq, float *dk, float *dv, const float *dz, const float *z, const float *lse,
                           const float *q, const float *k, const float *v, const float *blocks, const ps_sel_geom *g);

/* core/cpu/ops_cpu_misc.c: data movement, hook actions, embedding backward, optimizer */
int ps_cpu_copy(ps_ctx *ctx, float *dst, const float *src, int64_t n);
int ps_cpu_fill(ps_ctx *ctx, float *x, float value, int64_t n);
int ps_cpu_gather_rows(ps_ctx *ctx, float *out, const float *in, const float *add, const int64_t *rows, int64_t n,
    int64_t width);
int ps_cpu_scatter_rows(ps_ctx *ctx, float *out, const float *in, const int64_t *rows, int64_t n, int64_t width);
int ps_cpu_pattern_expand(ps_ctx *ctx, float *full, const float *probs, const ps_attn_geom *g);
int ps_cpu_pattern_compact(ps_ctx *ctx, float *probs, const float *full, const ps_attn_geom *g);
int ps_cpu_head_set(ps_ctx *ctx, float *x, const float *src, int64_t src_stride, int64_t n_seq, int64_t npos,
    int64_t nh, int64_t hd, int64_t head, int64_t seq0, int64_t seq1);
int ps_cpu_add_vector(ps_ctx *ctx, float *x, const float *vec, float scale, int64_t n_rows, int64_t width);
int ps_cpu_roll_blocks(ps_ctx *ctx, float *x, int64_t W, int64_t stride, int64_t off, int64_t len, int64_t k);
int ps_cpu_copy_blocks(ps_ctx *ctx, float *dst, int64_t dst_s0, int64_t dst_s1, const float *src, int64_t src_s0,
    int64_t src_s1, int64_t n0, int64_t n1, int64_t width, int accumulate, float scale);
int ps_cpu_accumulate_seqs(ps_ctx *ctx, double *sum, const float *x, int64_t n_seq, int64_t n);
int ps_cpu_delta_dot(ps_ctx *ctx, double *out, const float *g, const float *x, const float *src, int64_t src_nseq, int64_t B,
                     int64_t npos, int64_t nh, int64_t X);
int ps_cpu_sum_to_mean(ps_ctx *ctx, float *mean, const double *sum, double count, int64_t n);
int ps_cpu_embed_backward(ps_ctx *ctx, float *dtable, const float *dout, const int32_t *tok, int64_t n_tok, int64_t C);
int ps_cpu_sumsq(ps_ctx *ctx, double *out, const float *x, int64_t n);
int ps_cpu_adamw(ps_ctx *ctx, float *w, float *m1, float *m2, const float *g, const ps_adamw_seg *segs, int n_segs,
    const ps_adamw_hyper *h);

/* core/cpu/attn_chunk.c: one chunk of a long sequence against a key frame and the compressed cache */
int ps_cpu_attn_chunk(ps_ctx *ctx, float *z, const float *q, const float *k, const float *v, const float *ck,
    const float *cv, const ps_attn_frame *f);

/* core/cpu/attention.c: attention in O(T) memory (flash style), and the probability rows a pattern hook
 * materialises (attn_probs, attn_out: the forward's blocks, so they give its z bit for bit) */
#include "core/cpu/cpu_attention.h"

/* ---------------- DeepSeek-V4 (SPEC-v4): core/cpu/ops_cpu_v4.c ---------------- */
/* one query row's heads against its listed keys and the sink (the forward's and the cache's attention) */
void ps_cpu_v4_attend_keys(float *out, float *sinkp, int64_t sink_stride, const float *q, const float *const *key, int64_t nk,
                           const float *sink, int64_t H, int64_t Dh, float scale, float *sc);
int ps_cpu_v4_rope_table(ps_ctx *ctx, float *cos_t, float *sin_t, int64_t n_pos, int64_t half, const double *inv_freq,
    float mscale);
int ps_cpu_v4_rope(ps_ctx *ctx, float *x, const float *cos_t, const float *sin_t, int64_t n_seq, int64_t rows_per_seq,
    int64_t n_heads, int64_t hd, int64_t rd, int64_t pos_step, int inverse);
int ps_cpu_v4_hc_weights(ps_ctx *ctx, float *pre, float *post, float *comb, const float *mix, const float *x,
    const float *scale, const float *base, int64_t n, int64_t N, int64_t D, int64_t iters, float hc_eps, float norm_eps);
int ps_cpu_v4_hc_collapse(ps_ctx *ctx, float *out, const float *pre, const float *h, int64_t n, int64_t N, int64_t D);
int ps_cpu_v4_hc_expand(ps_ctx *ctx, float *hout, const float *post, const float *comb, const float *blk, const float *h,
    int64_t n, int64_t N, int64_t D);
int ps_cpu_v4_comp_slots(ps_ctx *ctx, float *gate, const float *z, const float *ape, int64_t B, int64_t T, int64_t nW,
    int64_t m, int64_t d, int overlap);
int ps_cpu_v4_slot_softmax(ps_ctx *ctx, float *alpha, const float *gate, int64_t n_groups, int64_t S, int64_t d);
int ps_cpu_v4_comp_pool(ps_ctx *ctx, float *pooled, const float *alpha, const float *kv, int64_t B, int64_t T,
    int64_t nW, int64_t m, int64_t d, int overlap);
int ps_cpu_v4_indexer_scores(ps_ctx *ctx, float *scores, const float *iq, const float *ik, const float *w, int64_t B,
    int64_t T, int64_t nW, int64_t Hi, int64_t Di, float scale);
int ps_cpu_v4_topk(ps_ctx *ctx, float *idx, float *gap, const float *scores, const float *bias, int64_t n_rows,
    int64_t n_cols, int64_t K, int64_t rows_per_seq, int64_t m);
int ps_cpu_v4_router_scores(ps_ctx *ctx, float *scores, const float *logits, int64_t n, int scoring);
int ps_cpu_v4_route_weights(ps_ctx *ctx, float *weights, const float *scores, const float *idx, int64_t n, int64_t E,
    int64_t k, float scale);
int ps_cpu_v4_swiglu_clamp(ps_ctx *ctx, float *h, const float *g, const float *u, int64_t n, float limit);
int ps_cpu_v4_scatter_add_rows(ps_ctx *ctx, float *out, const float *in, const int64_t *rows, const float *w, int64_t n,
    int64_t width);
int ps_cpu_v4_attn(ps_ctx *ctx, float *out, float *sinkp, const float *q, const float *kv, const float *ckv,
    const float *topk, const float *sink, const ps_v4_attn_geom *g);
int ps_cpu_v4_attn_bias(ps_ctx *ctx, float *bias, const float *topk, const ps_v4_attn_geom *g);
int ps_cpu_v4_attn_logits(ps_ctx *ctx, float *logits, const float *q, const float *kv, const float *ckv,
    const float *bias, const ps_v4_attn_geom *g);
int ps_cpu_v4_attn_softmax(ps_ctx *ctx, float *pattern, float *sinkp, const float *logits, const float *sink,
    const ps_v4_attn_geom *g);
int ps_cpu_v4_attn_apply(ps_ctx *ctx, float *out, const float *pattern, const float *kv, const float *ckv,
    const ps_v4_attn_geom *g);
int ps_cpu_v4_sink_rescale(ps_ctx *ctx, float *out, const float *sink_old, const float *sink_new,
    const ps_v4_attn_geom *g);
int ps_cpu_v4_grouped_linear(ps_ctx *ctx, float *out, const float *inp, const float *w, int64_t M, int64_t G,
    int64_t Kg, int64_t Ng);
int ps_cpu_v4_scale(ps_ctx *ctx, float *x, float s, int64_t n);
/* core/cpu/ops_cpu_v4_train.c: the trainable V4 compressor's backward */
int ps_cpu_v4_comp_slots_backward(ps_ctx *ctx, float *dz, float *dape, const float *dgate, int64_t B, int64_t T,
    int64_t nW, int64_t m, int64_t d, int overlap);
int ps_cpu_v4_slot_softmax_backward(ps_ctx *ctx, float *dgate, const float *dalpha, const float *alpha, int64_t n_groups,
    int64_t S, int64_t d);
int ps_cpu_v4_comp_pool_backward(ps_ctx *ctx, float *dalpha, float *dkv, const float *dpooled, const float *alpha,
    const float *kv, int64_t B, int64_t T, int64_t nW, int64_t m, int64_t d, int overlap);
int ps_cpu_v4_attn_backward(ps_ctx *ctx, float *dq, float *dkv, float *dckv, float *dsink, const float *dout,
    const float *out, const float *q, const float *kv, const float *ckv, const float *sink, const ps_v4_attn_geom *g);
/* core/cpu/kv_v4.c: the DeepSeek-V4 KV cache's ops */
int ps_cpu_v4_kv_attend(ps_ctx *ctx, float *out, float *sinkp, const float *q, const float *topk, const float *sink,
    const ps_v4_kv_attn *a);
int ps_cpu_v4_kv_slots(ps_ctx *ctx, float *gate, const float *ape, const ps_kv_chan *k);
/* ---------------- end DeepSeek-V4 ---------------- */

/* Σ_c (row[c] = exp(row[c] - mx)) over [lo, hi) (ps_expf_v): 16 interleaved sums added in a fixed order
 * (vectorises; the same float for any thread count). The softmax of the attention's score rows
 * (attention.c) and of the KV cache's decode rows (kv.c). */
static inline float ps_cpu_exp_sum(float *row, int64_t lo, int64_t hi, float mx) {
    float acc[16] = {0};
    int64_t c = lo;
    for (; c + 16 <= hi; c += 16)
        for (int l = 0; l < 16; l++) acc[l] += (row[c + l] = ps_expf_v(row[c + l] - mx));
    for (int l = 0; c < hi; c++, l++) acc[l] += (row[c] = ps_expf_v(row[c] - mx));
    for (int w = 8; w >= 1; w /= 2)
        for (int l = 0; l < w; l++) acc[l] += acc[l + w];
    return acc[0];
}

/* The gates' softmax backward in place, row by row (n rows of W; a row whose alpha is 0 gets dz = 0):
 * dz_i = alpha_i (d alpha_i - sum_j alpha_j d alpha_j), the sum in double. The offset-grid and
 * content-chunk gate backwards share it. */
static inline void ps_cpu_softmax_rows_backward(float *dalpha, const float *alpha, int64_t n, int64_t W) {
    for (int64_t idx = 0; idx < n; idx++) {
        const float *al = alpha + idx * W;
        float *dal = dalpha + idx * W;
        double dot = 0;
        for (int64_t i = 0; i < W; i++) dot += (double)al[i] * dal[i];
        for (int64_t i = 0; i < W; i++) dal[i] = al[i] * (dal[i] - (float)dot);
    }
}

#endif
