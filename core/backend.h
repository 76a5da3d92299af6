/* backend.h — what a backend provides: memory and the op table behind ops.h.
 *
 * A backend fills one ps_backend (the CPU backend: core/cpu/backend_cpu.c) and registers it in
 * core/ctx.c. Every entry is required. Each op gets the context first, returns 0, or fails through
 * ps_ctx_fail (message naming the op and the size that failed) and returns -1. Ops may take scratch
 * from ps_ctx_workspace and must not allocate otherwise; arrays are the backend's buffers; index arrays
 * (tokens, targets, rows, AdamW segments) are host arrays. The semantics of every op are stated in
 * core/ops.h; the CPU implementation is the reference the tests compare a backend with. */
#ifndef PS_BACKEND_H
#define PS_BACKEND_H

#include <stdint.h>

#include "core/ctx.h"

/* Attention geometry shared by the attention ops. */
typedef struct {
    int64_t B, T, nh, nkv, hd;
    int compressed;
    int64_t W, S, LW; /* compressed only: window, stride, effective local window min(local_window, T) */
    int64_t nW;       /* compressed windows (0 for full attention) */
    int64_t ncols;    /* columns of a probability row: T (full) or nW + LW (compressed) */
    /* compressed only: window start offsets [B, nkv] (host array; NULL = all 0, the base model). Window j of
     * KV head g in sequence b covers positions j*S + woff[b*nkv + g] + i, 0 <= woff < S; it exists when it
     * fits in T, and query t sees it when j*S + woff + W - 1 <= t (staggered grids, phase augmentation:
     * docs/mitigations.md). A backend whose grid_offsets flag is 0 refuses a non-NULL woff. */
    const int64_t *woff;
    /* compressed only: content-defined chunks (attention.boundaries "content", docs/mitigations.md §4):
     * cend [B, nW] (host array; NULL = windows on the grid) holds the last position of chunk j of sequence b,
     * increasing in j, INT64_MAX for a chunk the sequence does not have; query t sees chunk j when
     * cend[b*nW + j] <= t (every KV head alike). A backend whose grid_offsets flag is 0 refuses it. */
    const int64_t *cend;
} ps_attn_geom;

/* One chunk of a long sequence (prefill, one sequence): Tq query rows against a key frame of Tk raw
 * rows; query row i stands at key row q_off + i; key row 0 is absolute position pos0. Compressed: the
 * first nW windows of the sequence are in the cache, and query row i sees the windows ended by its
 * absolute position and the raw rows of its local window inside the frame. Full: every key row up to
 * its own. */
typedef struct {
    int64_t nh, nkv, hd;
    int compressed;
    int64_t W, S, LW;     /* compressed: window, stride, local window (min(local_window, T) of the pass) */
    int64_t nW;           /* windows in ck/cv */
    int64_t Tq, Tk, q_off, pos0;
} ps_attn_frame;

/* Settings of one AdamW segment (a run of parameters with one learning rate and decay). */
typedef struct {
    int64_t offset, n;    /* floats into the parameter buffer */
    float lr, weight_decay;
} ps_adamw_seg;

typedef struct {
    float beta1, beta2, eps;
    float clip_scale;     /* gradients are multiplied by this first */
    float inv_bc1, inv_bc2; /* 1 / (1 - beta^t) */
} ps_adamw_hyper;

/* ---------------- DeepSeek-V4 (SPEC-v4; core/v4/) ---------------- */
/* Attention of one V4 layer: queries [B, T, H, Dh] against the raw K=V entries kv [B, T, Dh] of the
 * sliding window (raw j visible to t iff t - W < j <= t) and the compressed entries ckv [B, nW, Dh]
 * (entry w visible iff w < (t + 1) / m; CSA: only those the indexer selected, topk [B, T, K]). */
typedef struct {
    int64_t B, T, H, Dh;
    int64_t nW;   /* compressed entries per sequence (0: sliding layer) */
    int64_t K;    /* CSA: selected entries per query (topk [B, T, K], -1 = empty); 0: every visible entry */
    int64_t W;    /* sliding window */
    int64_t m;    /* compression rate (0: sliding layer) */
    float scale;  /* logit scale, Dh^-0.5 */
} ps_v4_attn_geom;
/* ---------------- end DeepSeek-V4 ---------------- */

struct ps_backend {
    const char *name;
    /* memory: bytes, zero-filled; copies between host and buffers */
    void *(*alloc)(ps_ctx *c, int64_t bytes);
    void (*free)(ps_ctx *c, void *p);
    int (*to_host)(ps_ctx *c, void *host, const void *buf, int64_t bytes);
    int (*from_host)(ps_ctx *c, void *buf, const void *host, int64_t bytes);
    int host_visible; /* buffers are host pointers */
    int grid_offsets; /* the attention ops honour ps_attn_geom.woff and .cend, the *_grid and *_chunks ops are implemented */
    /* free and total bytes of the backend's memory (NULL: host memory, /proc/meminfo's MemAvailable) */
    int (*mem_info)(ps_ctx *c, int64_t *free_bytes, int64_t *total_bytes);
    int (*init)(ps_ctx *c);   /* backend state into c->impl (may be NULL) */
    void (*fini)(ps_ctx *c);  /* (may be NULL) */

    /* forward */
    int (*matmul)(ps_ctx *c, float *out, const float *inp, const float *w, int64_t M, int64_t K, int64_t N, int accumulate);
    int (*embed)(ps_ctx *c, float *out, const int32_t *tok, const float *table, int64_t n_tok, int64_t C);
    int (*rmsnorm)(ps_ctx *c, float *out, float *rstd, const float *inp, const float *weight, int64_t n_rows, int64_t C,
                   float eps);
    int (*rope_table)(ps_ctx *c, float *cos_t, float *sin_t, int64_t n_pos, int64_t hd, double theta);
    int (*rope)(ps_ctx *c, float *x, const float *cos_t, const float *sin_t, int64_t n_seq, int64_t rows_per_seq,
                int64_t n_heads, int64_t hd, int64_t pos_step);
    int (*swiglu)(ps_ctx *c, float *h, const float *g, const float *u, int64_t n);
    int (*add)(ps_ctx *c, float *out, const float *a, const float *b, int64_t n);
    int (*copy)(ps_ctx *c, float *dst, const float *src, int64_t n);
    int (*fill)(ps_ctx *c, float *x, float value, int64_t n);
    int (*gate)(ps_ctx *c, float *z, float *alpha, const float *a, const float *u, const float *bias, int64_t B,
                int64_t T, int64_t d, int64_t nW, int64_t W, int64_t S, int64_t nkv);
    int (*payload)(ps_ctx *c, float *P, const float *a, const float *C, int shared, float *scratch, int64_t B, int64_t T,
                   int64_t d, int64_t nW, int64_t W, int64_t S, int64_t nkvhd);
    int (*pool)(ps_ctx *c, float *out, const float *alpha, const float *P, int64_t B, int64_t nW, int64_t W, int64_t nkv,
                int64_t hd);
    int (*attn_forward)(ps_ctx *c, float *z, float *lse, const float *q, const float *k, const float *v, const float *ck,
                        const float *cv, const ps_attn_geom *g);
    int (*attn_probs)(ps_ctx *c, float *probs, const float *q, const float *k, const float *ck, const ps_attn_geom *g);
    int (*attn_out)(ps_ctx *c, float *z, const float *probs, const float *v, const float *cv, const ps_attn_geom *g);
    int (*attn_chunk)(ps_ctx *c, float *z, const float *q, const float *k, const float *v, const float *ck,
                      const float *cv, const ps_attn_frame *f);
    int (*attn_rows)(ps_ctx *c, float *z_rows, const int64_t *rows, int64_t n, const float *q, const float *k,
                     const float *v, const float *ck, const float *cv, const ps_attn_geom *g);
    int (*pattern_expand)(ps_ctx *c, float *full, const float *probs, const ps_attn_geom *g);
    int (*pattern_compact)(ps_ctx *c, float *probs, const float *full, const ps_attn_geom *g);
    int (*gather_rows)(ps_ctx *c, float *out, const float *in, const float *add, const int64_t *rows, int64_t n,
                       int64_t width);
    int (*scatter_rows)(ps_ctx *c, float *out, const float *in, const int64_t *rows, int64_t n, int64_t width);
    /* window grids with start offsets (docs/mitigations.md): the compressor ops with woff [B, nkv] */
    int (*gate_grid)(ps_ctx *c, float *z, float *alpha, const float *a, const float *u, const float *bias, int64_t B,
                     int64_t T, int64_t d, int64_t nW, int64_t W, int64_t S, int64_t nkv, const int64_t *woff);
    int (*payload_grid)(ps_ctx *c, float *P, const float *a, const float *C, int shared, float *scratch, int64_t B,
                        int64_t T, int64_t d, int64_t nW, int64_t W, int64_t S, int64_t nkv, int64_t hd,
                        const int64_t *woff);
    int (*rope_grid)(ps_ctx *c, float *x, const float *cos_t, const float *sin_t, int64_t B, int64_t T, int64_t nW,
                     int64_t nkv, int64_t hd, int64_t S, const int64_t *woff, int inverse);
    /* content-defined chunks (docs/mitigations.md §4): the compressor ops with chunk starts cs and lengths cl [B, nC] */
    int (*gate_chunks)(ps_ctx *c, float *z, float *alpha, const float *a, const float *u, const float *bias, int64_t B,
                       int64_t T, int64_t d, int64_t nC, int64_t W, int64_t nkv, const int64_t *cs, const int64_t *cl);
    int (*payload_chunks)(ps_ctx *c, float *P, const float *a, const float *C, int shared, float *scratch, int64_t B,
                          int64_t T, int64_t d, int64_t nC, int64_t W, int64_t nkv, int64_t hd, const int64_t *cs,
                          const int64_t *cl);
    int (*rope_chunks)(ps_ctx *c, float *x, const float *cos_t, const float *sin_t, int64_t B, int64_t T, int64_t nC,
                       int64_t nkv, int64_t hd, const int64_t *cs, const int64_t *cl, int inverse);
    /* hook actions */
    int (*head_set)(ps_ctx *c, float *x, const float *src, int64_t src_stride, int64_t n_seq, int64_t npos, int64_t nh,
                    int64_t hd, int64_t head, int64_t seq0, int64_t seq1);
    int (*add_vector)(ps_ctx *c, float *x, const float *vec, float scale, int64_t n_rows, int64_t width);
    int (*roll_blocks)(ps_ctx *c, float *x, int64_t W, int64_t stride, int64_t off, int64_t len, int64_t k);
    int (*copy_blocks)(ps_ctx *c, float *dst, int64_t dst_s0, int64_t dst_s1, const float *src, int64_t src_s0,
                       int64_t src_s1, int64_t n0, int64_t n1, int64_t width, int accumulate, float scale);
    int (*accumulate_seqs)(ps_ctx *c, double *sum, const float *x, int64_t n_seq, int64_t n);
    int (*sum_to_mean)(ps_ctx *c, float *mean, const double *sum, double count, int64_t n);
    int (*delta_dot)(ps_ctx *c, double *out, const float *g, const float *x, const float *src, int64_t src_nseq, int64_t B,
                     int64_t npos, int64_t nh, int64_t X);
    /* backward */
    int (*matmul_backward)(ps_ctx *c, float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                           int64_t M, int64_t K, int64_t N);
    int (*embed_backward)(ps_ctx *c, float *dtable, const float *dout, const int32_t *tok, int64_t n_tok, int64_t C);
    int (*rmsnorm_backward)(ps_ctx *c, float *dinp, float *dweight, const float *dout, const float *inp,
                            const float *weight, const float *rstd, int64_t n_rows, int64_t C);
    int (*rope_backward)(ps_ctx *c, float *dx, const float *cos_t, const float *sin_t, int64_t n_seq,
                         int64_t rows_per_seq, int64_t n_heads, int64_t hd, int64_t pos_step);
    int (*swiglu_backward)(ps_ctx *c, float *dg, float *du, const float *dh, const float *g, const float *u, int64_t n);
    int (*gate_backward)(ps_ctx *c, float *da, float *du, float *dbias, float *dalpha, const float *alpha,
                         const float *a, const float *u, int64_t B, int64_t T, int64_t d, int64_t nW, int64_t W,
                         int64_t S, int64_t nkv);
    int (*payload_backward)(ps_ctx *c, float *da, float *dC, const float *dP, const float *a, const float *C, int shared,
                            float *scratch, int64_t B, int64_t T, int64_t d, int64_t nW, int64_t W, int64_t S,
                            int64_t nkvhd);
    int (*gate_grid_backward)(ps_ctx *c, float *da, float *du, float *dbias, float *dalpha, const float *alpha,
                              const float *a, const float *u, int64_t B, int64_t T, int64_t d, int64_t nW, int64_t W,
                              int64_t S, int64_t nkv, const int64_t *woff);
    int (*payload_grid_backward)(ps_ctx *c, float *da, float *dC, const float *dP, const float *a, const float *C,
                                 int shared, float *scratch, int64_t B, int64_t T, int64_t d, int64_t nW, int64_t W,
                                 int64_t S, int64_t nkv, int64_t hd, const int64_t *woff);
    int (*gate_chunks_backward)(ps_ctx *c, float *da, float *du, float *dbias, float *dalpha, const float *alpha,
                                const float *a, const float *u, int64_t B, int64_t T, int64_t d, int64_t nC, int64_t W,
                                int64_t nkv, const int64_t *cs, const int64_t *cl);
    int (*payload_chunks_backward)(ps_ctx *c, float *da, float *dC, const float *dP, const float *a, const float *C,
                                   int shared, float *scratch, int64_t B, int64_t T, int64_t d, int64_t nC, int64_t W,
                                   int64_t nkv, int64_t hd, const int64_t *cs, const int64_t *cl);
    int (*gate_entropy)(ps_ctx *c, double *value, float *dalpha, const float *alpha, int64_t B, int64_t nW, int64_t nkv,
                        int64_t W, double weight);
    int (*pool_backward)(ps_ctx *c, float *dalpha, float *dP, const float *dout, const float *alpha, const float *P,
                         int64_t B, int64_t nW, int64_t W, int64_t nkv, int64_t hd);
    int (*attn_backward)(ps_ctx *c, float *dq, float *dk, float *dv, float *dck, float *dcv, const float *dz,
                         const float *z, const float *lse, const float *q, const float *k, const float *v,
                         const float *ck, const float *cv, const ps_attn_geom *g);
    int (*cross_entropy)(ps_ctx *c, double *loss_sum, int64_t *n_targets, float *dlogits, const float *logits,
                         const int32_t *targets, int64_t n_rows, int64_t V, float scale);
    /* optimizer */
    int (*sumsq)(ps_ctx *c, double *out, const float *x, int64_t n);
    int (*adamw)(ps_ctx *c, float *w, float *m1, float *m2, const float *g, const ps_adamw_seg *segs, int n_segs,
                 const ps_adamw_hyper *h);
    /* ---------------- DeepSeek-V4 (SPEC-v4; core/v4/) ---------------- */
    int (*v4_rope_table)(ps_ctx *c, float *cos_t, float *sin_t, int64_t n_pos, int64_t half, const double *inv_freq,
                         float mscale);
    int (*v4_rope)(ps_ctx *c, float *x, const float *cos_t, const float *sin_t, int64_t n_seq, int64_t rows_per_seq,
                   int64_t n_heads, int64_t hd, int64_t rd, int64_t pos_step, int inverse);
    int (*v4_hc_weights)(ps_ctx *c, float *pre, float *post, float *comb, const float *mix, const float *x,
                         const float *scale, const float *base, int64_t n, int64_t N, int64_t D, int64_t iters,
                         float hc_eps, float norm_eps);
    int (*v4_hc_collapse)(ps_ctx *c, float *out, const float *pre, const float *h, int64_t n, int64_t N, int64_t D);
    int (*v4_hc_expand)(ps_ctx *c, float *hout, const float *post, const float *comb, const float *blk, const float *h,
                        int64_t n, int64_t N, int64_t D);
    int (*v4_comp_slots)(ps_ctx *c, float *gate, const float *z, const float *ape, int64_t B, int64_t T, int64_t nW,
                         int64_t m, int64_t d, int overlap);
    int (*v4_slot_softmax)(ps_ctx *c, float *alpha, const float *gate, int64_t n_groups, int64_t S, int64_t d);
    int (*v4_comp_pool)(ps_ctx *c, float *pooled, const float *alpha, const float *kv, int64_t B, int64_t T, int64_t nW,
                        int64_t m, int64_t d, int overlap);
    int (*v4_indexer_scores)(ps_ctx *c, float *scores, const float *iq, const float *ik, const float *w, int64_t B,
                             int64_t T, int64_t nW, int64_t Hi, int64_t Di, float scale);
    int (*v4_topk)(ps_ctx *c, float *idx, float *gap, const float *scores, const float *bias, int64_t n_rows,
                   int64_t n_cols, int64_t K, int64_t rows_per_seq, int64_t m);
    int (*v4_router_scores)(ps_ctx *c, float *scores, const float *logits, int64_t n, int scoring);
    int (*v4_route_weights)(ps_ctx *c, float *weights, const float *scores, const float *idx, int64_t n, int64_t E,
                            int64_t k, float scale);
    int (*v4_swiglu_clamp)(ps_ctx *c, float *h, const float *g, const float *u, int64_t n, float limit);
    int (*v4_scatter_add_rows)(ps_ctx *c, float *out, const float *in, const int64_t *rows, const float *w, int64_t n,
                               int64_t width);
    int (*v4_attn)(ps_ctx *c, float *out, float *sinkp, const float *q, const float *kv, const float *ckv,
                   const float *topk, const float *sink, const ps_v4_attn_geom *g);
    int (*v4_attn_bias)(ps_ctx *c, float *bias, const float *topk, const ps_v4_attn_geom *g);
    int (*v4_attn_logits)(ps_ctx *c, float *logits, const float *q, const float *kv, const float *ckv, const float *bias,
                          const ps_v4_attn_geom *g);
    int (*v4_attn_softmax)(ps_ctx *c, float *pattern, float *sinkp, const float *logits, const float *sink,
                           const ps_v4_attn_geom *g);
    int (*v4_attn_apply)(ps_ctx *c, float *out, const float *pattern, const float *kv, const float *ckv,
                         const ps_v4_attn_geom *g);
    int (*v4_sink_rescale)(ps_ctx *c, float *out, const float *sink_old, const float *sink_new, const ps_v4_attn_geom *g);
    int (*v4_grouped_linear)(ps_ctx *c, float *out, const float *inp, const float *w, int64_t M, int64_t G, int64_t Kg,
                             int64_t Ng);
    int (*v4_scale)(ps_ctx *c, float *x, float s, int64_t n);
    /* the trainable V4 compressor's backward */
    int (*v4_comp_slots_backward)(ps_ctx *c, float *dz, float *dape, const float *dgate, int64_t B, int64_t T, int64_t nW,
                                  int64_t m, int64_t d, int overlap);
    int (*v4_slot_softmax_backward)(ps_ctx *c, float *dgate, const float *dalpha, const float *alpha, int64_t n_groups,
                                    int64_t S, int64_t d);
    int (*v4_comp_pool_backward)(ps_ctx *c, float *dalpha, float *dkv, const float *dpooled, const float *alpha,
                                 const float *kv, int64_t B, int64_t T, int64_t nW, int64_t m, int64_t d, int overlap);
    int (*v4_attn_backward)(ps_ctx *c, float *dq, float *dkv, float *dckv, float *dsink, const float *dout, const float *out,
                            const float *q, const float *kv, const float *ckv, const float *sink, const ps_v4_attn_geom *g);
    /* ---------------- end DeepSeek-V4 ---------------- */
};

/* The CPU backend (the reference). */
extern const ps_backend ps_backend_cpu;
/* "cpu-staged": the CPU backend declaring its buffers not host-visible (a test backend: ps_ctx_create
 * knows it, ps_ctx_backends() and the CLI do not; docs/backends.md). */
extern const ps_backend ps_backend_cpu_staged;

#endif
