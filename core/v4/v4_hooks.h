/* v4_hooks.h — the DeepSeek-V4 hook points (SPEC-v4.md "Hooks"): a point table of their own, registered
 * in an ordinary ps_hooks set (ps_hooks_add_at, family ps_v4_hook_family) so that callbacks, the
 * backend-side actions (ps_v4_hooks_add_action: set, zero, patch, add, roll, sum; no host copy), caching
 * (ps_v4_cache_watch) and overwriting work as for the controlled model, through the one firing path. Per-layer points use slot l;
 * the global ones (embed, hc_head.pre, final_hidden, logits) slot n_layers.
 *
 * Shapes (batch axis first): see the table in docs/hooks.md. Integer hooks (indexer.topk, ffn.experts)
 * carry exact small integers as floats (-1 = empty slot). A hook may overwrite its tensor: the forward
 * goes on from what it leaves (topk / experts are validated as indices); indexer.gap and ffn.route_gap
 * are diagnostics, and an overwritten attn.sink rescales the row's attention to the other keys. */
#ifndef PS_V4_HOOKS_H
#define PS_V4_HOOKS_H

#include <stddef.h>

#include "core/hooks.h"
#include "core/v4/v4_config.h"

typedef enum {
    /* per layer */
    PS_V4H_ATTN_HC_PRE = 0, PS_V4H_ATTN_HC_POST, PS_V4H_ATTN_HC_COMB, PS_V4H_ATTN_IN,
    PS_V4H_Q_LORA, PS_V4H_Q, PS_V4H_KV,
    PS_V4H_C_GATE, PS_V4H_C_ALPHA, PS_V4H_C_POOLED, PS_V4H_C_KV,
    PS_V4H_I_C_GATE, PS_V4H_I_C_ALPHA, PS_V4H_I_C_POOLED, PS_V4H_I_C_KV,
    PS_V4H_I_Q, PS_V4H_I_WEIGHTS, PS_V4H_I_SCORES, PS_V4H_I_TOPK, PS_V4H_I_GAP,
    PS_V4H_BIAS, PS_V4H_LOGITS, PS_V4H_PATTERN, PS_V4H_SINK, PS_V4H_OUT_HEADS, PS_V4H_ATTN_OUT,
    PS_V4H_MID,
    PS_V4H_FFN_HC_PRE, PS_V4H_FFN_HC_POST, PS_V4H_FFN_HC_COMB, PS_V4H_FFN_IN,
    PS_V4H_ROUTER_LOGITS, PS_V4H_EXPERTS, PS_V4H_WEIGHTS, PS_V4H_ROUTE_GAP, PS_V4H_ROUTED, PS_V4H_SHARED, PS_V4H_FFN_OUT,
    PS_V4H_OUT,
    PS_V4H_N_LAYER_POINTS,
    /* global (slot n_layers) */
    PS_V4H_EMBED = PS_V4H_N_LAYER_POINTS, PS_V4H_HC_HEAD_PRE, PS_V4H_FINAL_HIDDEN, PS_V4H_LOGITS_OUT,
    PS_V4H_NPOINTS
} ps_v4_hook_point;

extern const ps_hook_family ps_v4_hook_family;

/* "layers.1.attn.q", "embed", ... */
void ps_v4_hook_name(char *buf, size_t n, int slot, int point);
/* Parse a V4 hook name valid for cfg (compressor hooks only on CSA/HCA layers, indexer hooks only on
 * CSA layers); an unknown or invalid one is an error listing the valid names. */
int ps_v4_hook_parse(const ps_v4_config *cfg, const char *name, int *slot, ps_v4_hook_point *pt, ps_error *err);
int ps_v4_hooks_add(ps_hooks *h, const ps_v4_config *cfg, const char *name, ps_hook_fn fn, void *user, ps_error *err);
/* A backend-side action (hooks.h, ps_hook_action) on a V4 point: `head` picks a query / indexer head,
 * a compressor slot or an mHC stream on the 4-d points; the attention's logits and pattern take
 * whole-tensor actions only. */
int ps_v4_hooks_add_action(ps_hooks *h, const ps_v4_config *cfg, const char *name, const ps_hook_action *act, ps_error *err);
int ps_v4_cache_watch(ps_cache *c, ps_hooks *h, const ps_v4_config *cfg, const char *name, ps_error *err);

#endif
