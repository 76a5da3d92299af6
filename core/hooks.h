/* hooks.h — named hook points on the forward pass (SPEC §4, TransformerLens names), callbacks that
 * read or overwrite an activation in place, and a cache helper that keeps copies of chosen ones.
 *
 * Layouts (B = batch, T = tokens, nW = compressed windows):
 *   blocks.{l}.hook_resid_pre / hook_attn_out / hook_resid_mid / hook_mlp_out / hook_resid_post [B, T, d]
 *   blocks.{l}.attn.hook_q, hook_z [B, T, n_heads, hd]     blocks.{l}.attn.hook_k, hook_v [B, T, n_kv, hd]
 *   blocks.{l}.attn.hook_gate_k, hook_gate_v [B, nW, n_kv, W]   (compressed only)
 *   blocks.{l}.attn.hook_ck, hook_cv [B, nW, n_kv, hd]          (compressed only)
 *   select only (N1 / N2 level-1 / level-2 windows, nb blocks, ns = topk + local_blocks; docs/models.md):
 *   blocks.{l}.attn.hook_ck [B, N1, n_kv, hd], hook_ck2 [B, N2, n_kv, hd], hook_select_scores [B, T, n_kv, N1],
 *   hook_block_scores [B, T, n_kv, nb], hook_blocks [B, T, n_kv, ns] (block ids as floats, -1 empty)
 *   blocks.{l}.attn.hook_pattern [B, n_heads, T, nW + T] (compressed: windows first, then raw positions)
 *                                [B, n_heads, T, T] (full); unseen entries are 0, and overwrites of
 *                                unseen entries are ignored. */
#ifndef PS_HOOKS_H
#define PS_HOOKS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/config.h"
#include "core/ctx.h"
#include "core/error.h"

typedef enum {
    PS_HOOK_RESID_PRE = 0, PS_HOOK_Q, PS_HOOK_K, PS_HOOK_V, PS_HOOK_GATE_K, PS_HOOK_GATE_V, PS_HOOK_CK, PS_HOOK_CV,
    PS_HOOK_PATTERN, PS_HOOK_Z, PS_HOOK_ATTN_OUT, PS_HOOK_RESID_MID, PS_HOOK_MLP_OUT, PS_HOOK_RESID_POST,
    /* attention kind select only (core/select.h): hook_ck is its level-1 compressed keys */
    PS_HOOK_CK2, PS_HOOK_SELECT_SCORES, PS_HOOK_BLOCK_SCORES, PS_HOOK_BLOCKS,
    PS_HOOK_NPOINTS
} ps_hook_point;

typedef struct {
    const char *name; /* e.g. "blocks.1.attn.hook_q" */
    int layer;
    ps_hook_point point;
    float *data;      /* the activation; a hook may overwrite it in place (same shape) */
    int ndim;
    int64_t shape[4];
    int point_id;     /* another family's hooks (ps_hooks_fire_point): the point in that family's table */
} ps_hook_event;

/* Return 0 to continue, -1 (with err filled) to abort the forward pass. */
typedef int (*ps_hook_fn)(const ps_hook_event *ev, void *user, ps_error *err);

/* ---- built-in actions: interventions that run inside the backend (no host copy) ----
 *
 * An action sees the activation as [B, npos, <inner>]: axis 0 the sequences, axis 1 the positions
 * (tokens T, or compressed windows nW for gate/ck/cv), the rest one position's values. On a 4-d point
 * ([B, npos, heads, X]: q, k, v, z, gate_k, gate_v, ck, cv) `head` >= 0 picks one head (the unit is
 * its X floats); head = -1 (and every 3-d point) acts on the whole position. It touches sequences
 * [seq0, seq1) and positions [pos0, pos1) only (seq1 = 0: to the end of the batch; pos1 = 0: to the
 * last position). On attn.hook_pattern (axis 1 is the head there) only whole-tensor actions are
 * allowed (head -1, every position).
 *
 *   PS_ACT_SET    x[b, t, head] = src[0, t, head]: one source sequence written into every sequence of
 *                 the range — mean replacement (src = the mean over prompts, [src_npos, <inner>]), or
 *                 setting a head to any vector per position. every_pos: src is one position
 *                 ([<inner>]) written at every position.
 *   PS_ACT_ZERO   x[b, t, head] = 0 (zero ablation). src unused.
 *   PS_ACT_PATCH  x[b, t, head] = src[src_seq0 + b − seq0, t, head]: activation patching from another
 *                 run's activation at the same point (src: [src_nseq, src_npos, <inner>], the point's
 *                 layout, e.g. a cached clean run). head -1 patches whole positions (the whole tensor
 *                 with the default ranges).
 *   PS_ACT_ADD    x[b, t, head] += scale · src[t, head] (src: [src_npos, <inner>]), or with every_pos
 *                 += scale · src[head] (src: [<inner>]) — a steering vector.
 *   (ROLL and SUM: below.)
 *
 * src is a buffer of the model's context (ps_buf_alloc on m->ctx, or ps_hooks_upload); the hook set
 * does not own it unless it came from ps_hooks_upload, and it must live while the hooks are used. The
 * sizes (src_npos, src_nseq) are checked against the ranges each time the action fires: a position or
 * sequence the source does not hold is an error naming the hook, not a read past the buffer. The
 * ranges are checked against the activation's shape then too (the batch size is known only then).
 *
 *   PS_ACT_ROLL   positions [pos0, pos1) of every sequence in the range rolled by `shift`:
 *                 x'[b, pos0 + (i + shift) mod n, head] = x[b, pos0 + i, head] (n = pos1 − pos0). src unused.
 *   PS_ACT_SUM    acc[t, head...] += Σ_b x[b, t, ...] over the sequences of the range, in double, added in
 *                 sequence order (ps_accumulate_seqs): the clean run's sum a mean replacement divides
 *                 (acc: acc_n doubles of the model's context, one sequence's values; whole positions of
 *                 every position, head -1). The activation is not changed.
 *
 *   PS_ACT_DOT    acc[(b − seq0)·H + h] += Σ_{t, i} x[b, t, h, i] · (src[sb, t, h, i] − ref[b, t, h, i]) for every
 *                 sequence b of the range and every head h (H the point's axis-2 heads; 1 on a 3-d point), over
 *                 every position, in double (ps_delta_dot): sb = src_seq0 + b − seq0 when src_nseq > 0 (a
 *                 source of sequences, [src_nseq, npos, <inner>]) else 0 (one sequence, [npos, <inner>]); ref:
 *                 a buffer of the activation's own layout (the batch's sequences), or NULL for 0; src_npos:
 *                 the positions src holds (at least the activation's). acc: acc_n =
 *                 (seq1 − seq0)·H doubles of the context. The activation is not changed. Attribution patching
 *                 reads gradients this way (backward.h, ps_backward_opts.grad_hooks: x the gradient, src the
 *                 replacement, ref the clean activation); head -1 and every position only.
 *
 * Every family's points take every action (ps_hooks_add_at): the family says which axis-2 heads a
 * point has. */
typedef enum { PS_ACT_SET = 1, PS_ACT_ZERO, PS_ACT_PATCH, PS_ACT_ADD, PS_ACT_ROLL, PS_ACT_SUM, PS_ACT_DOT } ps_hook_action_kind;

typedef struct {
    ps_hook_action_kind kind;
    int head;             /* a head of a 4-d point, or -1: whole positions */
    int64_t seq0, seq1;   /* sequences [seq0, seq1) of the batch; seq1 = 0: to the end */
    int64_t pos0, pos1;   /* positions [pos0, pos1) of axis 1; pos1 = 0: to the end */
    const float *src;     /* SET, PATCH, ADD: a buffer of the model's context */
    int64_t src_npos;     /* positions src holds (its axis 1); SET and ADD ignore it with every_pos */
    int64_t src_nseq;     /* PATCH: sequences src holds */
    int64_t src_seq0;     /* PATCH: the source sequence of sequence seq0 */
    int every_pos;        /* SET, ADD: src is one position's values, used at every position */
    float scale;          /* ADD */
    int64_t shift;        /* ROLL */
    double *acc;          /* SUM, DOT: acc_n doubles of the context */
    const float *ref;     /* DOT: the clean activation (the point's layout), or NULL */
    int64_t acc_n;
} ps_hook_action;

typedef struct {
    int layer;            /* the slot: a layer, or a family's slot of global points */
    int point;            /* the point in the family's table (ps_hook_point for the controlled model) */
    ps_hook_fn fn;        /* a host callback, or NULL for an action */
    void *user;
    ps_hook_action act;   /* the action when fn is NULL */
} ps_hook_entry;

typedef struct {
    ps_ctx *ctx;
    void *buf;
    int64_t bytes;
} ps_hook_buffer;

typedef struct {
    int n, cap;
    ps_hook_entry *e;
    int64_t n_layers;
    uint64_t *mask; /* per layer: bit p set when some hook is on point p */
    int n_bufs, cap_bufs;
    ps_hook_buffer *bufs; /* buffers from ps_hooks_upload, freed with the set */
    const struct ps_hook_family *family; /* whose points (set by the first registration) */
} ps_hooks;

/* A model family's hook points (the controlled model's: ps_model_hook_family, below; DeepSeek-V4's:
 * core/v4/v4_hooks.h). Points are numbered per slot (at most 64 per slot; a family's global points
 * take a slot of their own); a hook set holds the points of one family. */
typedef struct ps_hook_family {
    const char *name;                                              /* "phasescope", "deepseek_v4" */
    void (*point_name)(char *buf, size_t n, int slot, int point);  /* the canonical hook name */
} ps_hook_family;
extern const ps_hook_family ps_model_hook_family;

void ps_hooks_init(ps_hooks *h);
void ps_hooks_free(ps_hooks *h);

/* Register fn on a hook name (valid for cfg); hooks on one point fire in registration order. */
int ps_hooks_add(ps_hooks *h, const ps_config *cfg, const char *name, ps_hook_fn fn, void *user, ps_error *err);

/* Register a built-in action on a hook name. Callbacks and actions on one point fire in registration
 * order, each seeing what the earlier ones wrote. The action is copied (src is not). Errors (naming the
 * hook): an unknown kind, a head out of range for the point (n_heads for q/z, n_kv for k/v/gates/ck/cv),
 * a head on a 3-d point, anything but a whole-tensor action on the pattern, a missing src, negative or
 * empty ranges, a PATCH without source sequences. */
int ps_hooks_add_action(ps_hooks *h, const ps_config *cfg, const char *name, const ps_hook_action *act, ps_error *err);

/* A buffer of ctx holding a copy of n host floats, owned by the hook set (freed by ps_hooks_free): the
 * src of an action made from host data (a mean computed on the host, a ps_cache item). NULL with err
 * set when it cannot be made. */
const float *ps_hooks_upload(ps_hooks *h, ps_ctx *ctx, const float *host, int64_t n, ps_error *err);

/* Parse a hook name; an unknown or invalid one is an error listing the valid names. */
int ps_hook_parse(const ps_config *cfg, const char *name, int *layer, ps_hook_point *pt, ps_error *err);
void ps_hook_name(char *buf, size_t n, int layer, ps_hook_point pt);
const char *ps_hook_suffix(ps_hook_point pt); /* "attn.hook_q", "hook_resid_pre", ... */
/* The shape of a point's activation for B sequences of T tokens (the table above); returns ndim. */
int ps_hook_shape(const ps_config *cfg, ps_hook_point pt, int64_t B, int64_t T, int64_t shape[4]);

/* Whether some hook of family's is on (slot, point). */
static inline bool ps_hooks_on_point(const ps_hooks *h, const ps_hook_family *family, int slot, int point) {
    return h && h->mask && h->family == family && slot >= 0 && slot < h->n_layers && (h->mask[slot] >> point) & 1u;
}
static inline bool ps_hooks_on(const ps_hooks *h, int layer, ps_hook_point pt) {
    return ps_hooks_on_point(h, &ps_model_hook_family, layer, (int)pt);
}

/* Fire every hook on (slot, point) of the set's family in registration order; data is a buffer of ctx.
 * Actions run as ops on ctx (no host copy); a callback gets a host copy on a device backend (made only
 * when a callback is registered there, written back before the next action and at the end). The one
 * firing path of every family. */
int ps_hooks_fire_point(ps_ctx *ctx, const ps_hooks *h, int slot, int point, float *data, int ndim, const int64_t *shape,
                        ps_error *err);
static inline int ps_hooks_fire(ps_ctx *ctx, const ps_hooks *h, int layer, ps_hook_point pt, float *data, int ndim,
                                const int64_t *shape, ps_error *err) {
    return ps_hooks_fire_point(ctx, h, layer, (int)pt, data, ndim, shape, err);
}

/* Register a callback (fn) or an action (act, copied; fn NULL) on point `point` of slot `slot` of a
 * family with n_slots slots — what ps_hooks_add / ps_hooks_add_action do for the controlled model and
 * ps_v4_hooks_add / ps_v4_hooks_add_action for DeepSeek-V4, after parsing the name. heads: the heads
 * of the point's axis 2 an action may pick (0: no head axis; -1: whole-tensor actions only, e.g. an
 * attention pattern whose axis 1 is the head). The action checks of ps_hooks_add_action apply. */
int ps_hooks_add_at(ps_hooks *h, const ps_hook_family *family, int64_t n_slots, int slot, int point, const char *name,
                    ps_hook_fn fn, void *user, const ps_hook_action *act, int64_t heads, ps_error *err);

/* ---- cache helper: keeps a copy of each named activation ---- */
typedef struct {
    char name[96];
    int ndim;
    int64_t shape[4];
    float *data;
} ps_cache_item;

typedef struct {
    int n, cap;
    ps_cache_item **items; /* each item allocated on its own: its address never changes */
} ps_cache;

void ps_cache_init(ps_cache *c);
void ps_cache_free(ps_cache *c);
/* Register a caching hook for name (repeated runs overwrite the earlier copy). */
int ps_cache_watch(ps_cache *c, ps_hooks *h, const ps_config *cfg, const char *name, ps_error *err);
/* The item for name, or NULL. The item pointer stays valid until ps_cache_free (watching more names
 * does not move it); item->data until the next run in which that activation's shape changes. */
const ps_cache_item *ps_cache_get(const ps_cache *c, const char *name);

/* The cache helper on any family's point (ps_cache_watch and ps_v4_cache_watch, after parsing). */
int ps_cache_watch_at(ps_cache *c, ps_hooks *h, const ps_hook_family *family, int64_t n_slots, int slot, int point,
                      ps_error *err);


#endif
