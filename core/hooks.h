/* hooks.h — named hook points on the forward pass (SPEC §4, TransformerLens names), callbacks that
 * read or overwrite an activation in place, and a cache helper that keeps copies of chosen ones.
 *
 * Layouts (B = batch, T = tokens, nW = compressed windows):
 *   blocks.{l}.hook_resid_pre / hook_attn_out / hook_resid_mid / hook_mlp_out / hook_resid_post [B, T, d]
 *   blocks.{l}.attn.hook_q, hook_z [B, T, n_heads, hd]     blocks.{l}.attn.hook_k, hook_v [B, T, n_kv, hd]
 *   blocks.{l}.attn.hook_gate_k, hook_gate_v [B, nW, n_kv, W]   (compressed only)
 *   blocks.{l}.attn.hook_ck, hook_cv [B, nW, n_kv, hd]          (compressed only)
 *   blocks.{l}.attn.hook_pattern [B, n_heads, T, nW + T] (compressed: windows first, then raw positions)
 *                                [B, n_heads, T, T] (full); unseen entries are 0, and overwrites of
 *                                unseen entries are ignored. */
#ifndef PS_HOOKS_H
#define PS_HOOKS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "ctx.h"
#include "error.h"

typedef enum {
    PS_HOOK_RESID_PRE = 0, PS_HOOK_Q, PS_HOOK_K, PS_HOOK_V, PS_HOOK_GATE_K, PS_HOOK_GATE_V, PS_HOOK_CK, PS_HOOK_CV,
    PS_HOOK_PATTERN, PS_HOOK_Z, PS_HOOK_ATTN_OUT, PS_HOOK_RESID_MID, PS_HOOK_MLP_OUT, PS_HOOK_RESID_POST,
    PS_HOOK_NPOINTS
} ps_hook_point;

typedef struct {
    const char *name; /* e.g. "blocks.1.attn.hook_q" */
    int layer;
    ps_hook_point point;
    float *data;      /* the activation; a hook may overwrite it in place (same shape) */
    int ndim;
    int64_t shape[4];
} ps_hook_event;

/* Return 0 to continue, -1 (with err filled) to abort the forward pass. */
typedef int (*ps_hook_fn)(const ps_hook_event *ev, void *user, ps_error *err);

typedef struct {
    int layer;
    ps_hook_point point;
    ps_hook_fn fn;
    void *user;
} ps_hook_entry;

typedef struct {
    int n, cap;
    ps_hook_entry *e;
    int64_t n_layers;
    uint32_t *mask; /* per layer: bit p set when some hook is on point p */
} ps_hooks;

void ps_hooks_init(ps_hooks *h);
void ps_hooks_free(ps_hooks *h);

/* Register fn on a hook name (valid for cfg); hooks on one point fire in registration order. */
int ps_hooks_add(ps_hooks *h, const ps_config *cfg, const char *name, ps_hook_fn fn, void *user, ps_error *err);

/* Parse a hook name; an unknown or invalid one is an error listing the valid names. */
int ps_hook_parse(const ps_config *cfg, const char *name, int *layer, ps_hook_point *pt, ps_error *err);
void ps_hook_name(char *buf, size_t n, int layer, ps_hook_point pt);
const char *ps_hook_suffix(ps_hook_point pt); /* "attn.hook_q", "hook_resid_pre", ... */

static inline bool ps_hooks_on(const ps_hooks *h, int layer, ps_hook_point pt) {
    return h && h->mask && layer < h->n_layers && (h->mask[layer] >> pt) & 1u;
}

/* Fire every hook on (layer, pt); data is a buffer of ctx (a callback gets a host copy on a device). */
int ps_hooks_fire(ps_ctx *ctx, const ps_hooks *h, int layer, ps_hook_point pt, float *data, int ndim,
                  const int64_t *shape, ps_error *err);

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

#endif
