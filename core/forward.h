/* forward.h — activations and the forward pass (SPEC §2) with hooks (SPEC §4).
 *
 * All activations of a run live in one contiguous buffer laid out by a size table (see
 * ps_acts_create). With keep_all (training), every layer keeps its own activations for the backward
 * pass; otherwise the per-layer scratch is shared across layers and only the residual stream of every
 * layer boundary is kept — enough to restart the pass at any layer (ps_forward_from), which is how a
 * knockout grid avoids recomputing the layers below the one it changes. */
#ifndef PS_FORWARD_H
#define PS_FORWARD_H

#include <stdbool.h>
#include <stdint.h>

#include "core/error.h"
#include "core/hooks.h"
#include "core/model.h"
#include "core/ops.h"
#include "core/batch.h"

typedef struct {
    float *resid;          /* [L+1, B, T, d]   input of layer l (l = L: the final residual) */
    /* per layer (L slots when keep_all, else 1): */
    float *ln1, *ln1_rstd; /* [B,T,d], [B,T] */
    float *q_pre, *q, *q_rstd; /* [B,T,nh,hd] before norm/RoPE, after; [B,T,nh] */
    float *k_pre, *k, *k_rstd; /* [B,T,nkv,hd], [B,T,nkv] */
    float *v;              /* [B,T,nkv,hd] */
    float *gz_k, *ga_k, *gz_v, *ga_v; /* gate logits and alpha [B,nW,nkv,W] */
    float *pk, *pv;        /* payloads [B,nW,W,nkv*hd] */
    float *ck_pre, *ck, *ck_rstd, *cv; /* [B,nW,nkv,hd] pooled key before norm/RoPE, after; [B,nW,nkv]; value */
    float *lse;            /* [B,nh,T] attention row log-sum-exp (the backward recomputes probabilities) */
    float *z;              /* [B,T,nh,hd] */
    float *attn_out, *resid_mid, *ln2, *ln2_rstd; /* [B,T,d] ([B,T] rstd) */
    float *mlp_g, *mlp_u, *mlp_h; /* [B,T,d_ff] */
    float *mlp_out;        /* [B,T,d] */
    /* final */
    float *lnf, *lnf_rstd; /* [B,T,d], [B,T] */
    float *logits;         /* [B,T,V]; with logit rows: [n_rows, V] (the rows set by ps_acts_set_rows) */
    float *lnf_rows;       /* [max_rows, d] the final-norm rows the logits are computed from (rows mode) */
    /* scratch */
    float *rope_cos, *rope_sin; /* [T, hd/2] */
    float *payload_scratch;     /* [B,T,nkv*hd] (shared payload) */
    /* attention kind v4, per layer (k is the raw K=V entry, ck_pre the pooled entry, ck the entry after
     * its norm and rope; v, cv and the gate/payload arrays above are absent) */
    float *c_kv_raw, *c_z;      /* [B,T,c*hd] the compressor's payload and gate logits (c = 2 CSA, 1 HCA) */
    float *c_gate, *c_alpha;    /* [B,nW,S,hd] slot logits with the position bias; per-channel softmax */
    float *z_pre;               /* [B,T,nh,hd] attention output before the inverse rope */
    float *sinkp;               /* [B,nh,T] probability mass on the sink */
    /* attention kind select (core/select.h; N1 / N2 level-1 / level-2 windows, nb blocks, ns = topk + local_blocks) */
    float *sel_k1, *sel_k2;     /* [B,N1,nkv,hd], [B,N2,nkv,hd] compressed keys */
    float *sel_P, *sel_bs;      /* [B,T,nkv,N1] stage-1 scores, [B,T,nkv,nb] block scores */
    float *sel_blocks;          /* [B,T,nkv,ns] the blocks attended (kept per layer: the backward reads them) */
} ps_act_ptrs;

/* Optional per-op timing (bench programs): process CPU seconds (all threads) by category, [0] forward,
 * [1] backward. */
typedef enum {
    PS_PROF_MATMUL = 0, /* linear layers (q/k/v/o, MLP, logits) */
    PS_PROF_ATTENTION,  /* scores, softmax, weighted sums */
    PS_PROF_COMPRESSOR, /* gates, payloads, pooling */
    PS_PROF_NORM_ROPE,  /* RMSNorm, RoPE */
    PS_PROF_OTHER,      /* embedding, SwiGLU, residual adds, loss */
    PS_PROF_N
} ps_prof_cat;

typedef struct {
    double seconds[2][PS_PROF_N];
} ps_profile;

typedef struct {
    ps_ctx *ctx;           /* the context the buffers live on (the model's) */
    const ps_config *cfg;
    int64_t B, T, nW;
    bool keep_all;
    ps_profile *prof; /* NULL (the default): no timing */
    ps_attn_geom geom;
    ps_v4_attn_geom geom4; /* attention kind v4 */
    ps_act_ptrs p;
    /* per-layer strides (floats) of each per-layer array; 0 when shared across layers */
    int64_t layer_stride[sizeof(ps_act_ptrs) / sizeof(float *)];
    float *buf;            /* one ps_buf_alloc buffer holding every array above */
    int64_t n_floats;
    /* grown on demand: the pattern hook's probabilities (compact + wide rows) and the answer-row pass */
    float *pattern, *rows_buf;
    int64_t pattern_n, rows_n;
    float *logits_host;    /* host copy of the logits (device backends only) */
    int64_t max_rows, n_rows; /* rows mode (max_rows > 0): logits only at rows[0..n_rows) (row = b·T + t) */
    int64_t *rows;
    /* Window grid offsets [woff_layers, B, nkv] (host; compressed models only): NULL for the base grid, else
     * (o_{l,g} + shift[b]) mod S with o_{l,g} = ps_config_grid_offset (attention.head_offsets), shift from
     * ps_acts_set_phase (0 unless set). woff_layers is n_layers for a per-layer grid, else 1 (every layer's).
     * geom.woff points at layer 0's table: a layer's pass takes ps_acts_geom(a, l). */
    int64_t *woff;
    int64_t woff_layers;
    /* Content chunk boundaries (attention.boundaries "content", docs/mitigations.md §4; host, else NULL):
     * chunk starts cs, lengths cl (0: absent) and last positions cend (INT64_MAX: absent) [B, nW], set from
     * the tokens by ps_forward (ps_acts_set_chunks); geom.cend points at cend. chunks_set: they are. */
    int64_t *cs, *cl, *cend;
    bool chunks_set;
    /* The compressor's window table (core/backend.h ps_windows; compressed models only), built from woff or
     * the chunk tables by ps_acts_windows before each use: win_start / win_len [B, nW, nkv] (host). */
    int64_t *win_start, *win_len;
    /* Gate regulariser (docs/mitigations.md), read by ps_backward on its scratch acts: weight (0: off) and
     * the value it added, summed over layers (not part of the cross-entropy loss_sum). */
    double gate_reg_weight, gate_reg_value;
} ps_acts;

/* Floats a run needs (for memory estimates before allocating); pattern_hook adds the probability
 * scratch a pattern hook allocates on first use. */
int64_t ps_acts_size(const ps_config *cfg, int64_t B, int64_t T, bool keep_all, bool pattern_hook);

/* Activations for B sequences of T tokens on ctx (the model's context: m->ctx). */
int ps_acts_create(ps_acts *a, ps_ctx *ctx, const ps_config *cfg, int64_t B, int64_t T, bool keep_all, ps_error *err);
void ps_acts_free(ps_acts *a);

/* The same with logits at chosen rows only (max_rows > 0: the logits buffer is [max_rows, V] instead
 * of [B·T, V]; set the rows with ps_acts_set_rows before each forward). The backward then takes the
 * loss at those rows only (targets elsewhere must be -1). For large vocabularies: a 151,936-token
 * vocabulary costs B·T·V·4 bytes per batch otherwise. */
int ps_acts_create_rows(ps_acts *a, ps_ctx *ctx, const ps_config *cfg, int64_t B, int64_t T, bool keep_all,
                        int64_t max_rows, ps_error *err);
int ps_acts_set_rows(ps_acts *a, const int64_t *rows, int64_t n, ps_error *err);
/* Rows = the answer rows of the batch view (sequence by sequence, in ps_answer_rows order). */
int ps_acts_set_answer_rows(ps_acts *a, const ps_batch *view, ps_error *err);

/* Phase augmentation (docs/mitigations.md): shift[b] in [0, S) moves sequence b's window grid by shift[b]
 * (window j of KV head g in layer l at jS + (o_{l,g} + shift[b]) mod S + i) for the next passes; shift NULL
 * restores the config's grid. Compressed models only; an error on any other, or for a shift outside [0, S). */
int ps_acts_set_phase(ps_acts *a, const int64_t *shift, ps_error *err);

/* Layer l's window offsets [B, nkv] as the activations stand (NULL: the base grid), and a->geom with them: the
 * geometry layer l's attention ops take (a per-layer grid differs by layer; any other, the same for all). */
const int64_t *ps_acts_woff(const ps_acts *a, int64_t l);
ps_attn_geom ps_acts_geom(const ps_acts *a, int64_t l);

/* Layer l's window table of the compressor as the activations stand (the base grid, woff's offset grid of
 * layer l, or the content chunks of ps_acts_set_chunks), for the compressor ops; a grid is written into
 * win_start / win_len (the table points there, or at cs / cl), so it holds until the next call. */
ps_windows ps_acts_windows(const ps_acts *a, int64_t l);

/* Content chunk boundaries (docs/mitigations.md §4): the chunk tables of tokens [B, T] (ps_forward calls it;
 * a pass that starts from a kept residual, ps_forward_from, uses the tables of the last ps_forward). A no-op
 * for any other model. */
int ps_acts_set_chunks(ps_acts *a, const int32_t *tokens, ps_error *err);

/* The chunk tables of src's sequences [src_b0, src_b0 + n) into dst's [dst_b0, dst_b0 + n), for a pass on
 * dst that starts from copied activations (a restart: ps_forward_from, ps_forward_from_attention*); dst
 * may be shorter (T' <= T: the chunks that end inside T' are kept). A no-op for any other model. */
int ps_acts_copy_chunks(ps_acts *dst, int64_t dst_b0, const ps_acts *src, int64_t src_b0, int64_t n, ps_error *err);

/* Vocabularies of at least this many tokens make ps_forward_batches compute logits at the answer rows
 * only (scores are the same up to float rounding of a matrix product of another shape). */
#define PS_ROWS_VOCAB 4096

/* Pointers to layer l's slot of the per-layer arrays. */
ps_act_ptrs ps_acts_layer(const ps_acts *a, int l);

/* The logits [B, T, V] readable on the host: the buffer itself on a host-visible backend, else a host
 * copy made now (kept with the acts). NULL with err set when the copy cannot be made. */
const float *ps_acts_logits_host(ps_acts *a, ps_error *err);

/* Full forward: tokens [B, T] (each in [0, vocab)). Fills logits. hooks may be NULL. */
int ps_forward(const ps_model *m, ps_acts *a, const int32_t *tokens, const ps_hooks *hooks, ps_error *err);

/* Forward from layer `from` on, given a->p.resid[from] (already computed by an earlier pass). */
int ps_forward_from(const ps_model *m, ps_acts *a, int from, const ps_hooks *hooks, ps_error *err);

/* Forward from the attention scores of layer l on, reusing layer l's kept q, k, v, ck, cv (which the
 * caller may have changed, e.g. copied from another run) — needs keep_all activations of an earlier
 * pass. The hooks on layer l's q, k, v, ck, cv fire first, on the kept arrays (in forward order: a
 * knockout registers its actions there, as on a full forward), then those of layer l's attention on and
 * of the later layers; resid_pre and the gates of layer l are not recomputed and do not fire. */
int ps_forward_from_attention(const ps_model *m, ps_acts *a, int l, const ps_hooks *hooks, ps_error *err);

/* The same, but only the logits of the given rows (row = b·T + t) are computed: the last layer's
 * attention output, MLP and the logits run for those rows alone (scoring answers needs nothing else).
 * Other rows of the logits are left stale. hooks (may be NULL) fire as above up to the last layer's
 * compressed keys and values; a hook on the last layer's pattern or later points is an error. */
int ps_forward_from_attention_rows(const ps_model *m, ps_acts *a, int l, const ps_hooks *hooks, const int64_t *rows,
                                   int64_t n, ps_error *err);

/* The one batching loop of every instrument: the sequences of b in batches of at most `batch` (one
 * activation set for the full batches, one made once for a last partial batch), each run forward with
 * hooks and handed to fn with its view (b restricted to sequences [i0, i0 + n)). keep_all keeps every
 * layer's activations (for a restart or a backward). Stops at the first failure. */
typedef int (*ps_batch_fn)(const ps_batch *view, int64_t i0, ps_acts *a, void *user, ps_error *err);
int ps_forward_batches(const ps_model *m, const ps_batch *b, int64_t batch, bool keep_all, const ps_hooks *hooks,
                       ps_batch_fn fn, void *user, ps_error *err);

/* Score the queries of view (the batch the acts were run on) from its logits: ps_score_queries, with the
 * logits read on the host (see ps_acts_logits_host). */
int ps_acts_score(ps_acts *a, const ps_batch *view, int *correct, double *logprob, ps_error *err);

/* Time `stmt` into prof->seconds[dir][cat] when a profile is attached (`prof` in scope). */
double ps_prof_now(void);
#define PROF(dir, cat, stmt)                                    \
    do {                                                        \
        if (prof) {                                             \
            double t0_ = ps_prof_now();                         \
            stmt;                                               \
            prof->seconds[dir][cat] += ps_prof_now() - t0_;     \
        } else {                                                \
            stmt;                                               \
        }                                                       \
    } while (0)

#endif
