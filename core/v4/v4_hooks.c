#include "core/v4/v4_hooks.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const SUFFIX[PS_V4H_NPOINTS] = {
    "attn_hc.pre", "attn_hc.post", "attn_hc.comb", "attn_in",
    "attn.q_lora", "attn.q", "attn.kv",
    "attn.compressor.gate", "attn.compressor.alpha", "attn.compressor.pooled", "attn.compressor.kv",
    "attn.indexer.compressor.gate", "attn.indexer.compressor.alpha", "attn.indexer.compressor.pooled",
    "attn.indexer.compressor.kv",
    "attn.indexer.q", "attn.indexer.weights", "attn.indexer.scores", "attn.indexer.topk", "attn.indexer.gap",
    "attn.bias", "attn.logits", "attn.pattern", "attn.sink", "attn.out_heads", "attn.out",
    "mid",
    "ffn_hc.pre", "ffn_hc.post", "ffn_hc.comb", "ffn_in",
    "ffn.router_logits", "ffn.experts", "ffn.weights", "ffn.route_gap", "ffn.routed", "ffn.shared", "ffn.out",
    "out",
    "embed", "hc_head.pre", "final_hidden", "logits",
};

void ps_v4_hook_name(char *buf, size_t n, int slot, int point) {
    if (point >= PS_V4H_N_LAYER_POINTS) snprintf(buf, n, "%s", SUFFIX[point]);
    else snprintf(buf, n, "layers.%d.%s", slot, SUFFIX[point]);
}

const ps_hook_family ps_v4_hook_family = {"deepseek_v4", ps_v4_hook_name};

/* 0: on every layer; 1: compressed layers (CSA, HCA); 2: CSA layers */
static int needs(int p) {
    if (p >= PS_V4H_C_GATE && p <= PS_V4H_C_KV) return 1;
    if (p >= PS_V4H_I_C_GATE && p <= PS_V4H_I_GAP) return 2;
    return 0;
}

static int invalid(const ps_v4_config *cfg, const char *name, const char *why, ps_error *err) {
    char nm[120];
    size_t k = 0;
    for (; name[k] && k + 4 < sizeof nm; k++) nm[k] = (unsigned char)name[k] < 0x20 || (unsigned char)name[k] >= 0x7f ? '?' : name[k];
    nm[k] = '\0';
    return ps_fail(err,
                   "hook \"%s%s\": %s; valid hooks (l = 0..%lld): embed, hc_head.pre, final_hidden, logits; layers.{l}. + "
                   "attn_hc.{pre,post,comb}, attn_in, attn.{q_lora,q,kv,bias,logits,pattern,sink,out_heads,out}, "
                   "attn.compressor.{gate,alpha,pooled,kv} (CSA/HCA layers), attn.indexer.{q,weights,scores,topk,gap} and "
                   "attn.indexer.compressor.{gate,alpha,pooled,kv} (CSA layers), mid, ffn_hc.{pre,post,comb}, ffn_in, "
                   "ffn.{router_logits,experts,weights,route_gap,routed,shared,out}, out",
                   nm, name[k] ? "..." : "", why, (long long)cfg->n_layers - 1);
}

int ps_v4_hook_parse(const ps_v4_config *cfg, const char *name, int *slot, ps_v4_hook_point *pt, ps_error *err) {
    for (int p = PS_V4H_N_LAYER_POINTS; p < PS_V4H_NPOINTS; p++)
        if (!strcmp(name, SUFFIX[p])) {
            *slot = (int)cfg->n_layers;
            *pt = (ps_v4_hook_point)p;
            return 0;
        }
    if (strncmp(name, "layers.", 7) || name[7] < '0' || name[7] > '9') return invalid(cfg, name, "unknown hook name", err);
    char *end;
    long l = strtol(name + 7, &end, 10);
    if (*end != '.') return invalid(cfg, name, "unknown hook name", err);
    for (int p = 0; p < PS_V4H_N_LAYER_POINTS; p++) {
        if (strcmp(end + 1, SUFFIX[p])) continue;
        char why[160];
        if (l < 0 || l >= cfg->n_layers) {
            snprintf(why, sizeof why, "layer %ld out of range (the model has %lld layers)", l, (long long)cfg->n_layers);
            return invalid(cfg, name, why, err);
        }
        ps_v4_attn_type t = cfg->attn_type[l];
        if ((needs(p) == 1 && t == PS_V4_SLIDING) || (needs(p) == 2 && t != PS_V4_CSA)) {
            snprintf(why, sizeof why, "layer %ld is %s, which has no %s", l, ps_v4_attn_type_name(t),
                     needs(p) == 2 ? "indexer (CSA layers only)" : "compressor (CSA and HCA layers only)");
            return invalid(cfg, name, why, err);
        }
        *slot = (int)l;
        *pt = (ps_v4_hook_point)p;
        return 0;
    }
    return invalid(cfg, name, "unknown hook name", err);
}

/* The heads of a point's axis 2 an action may pick (ps_hooks_add_at): query and indexer heads, a
 * compressor's slots, the mHC streams; the attention's bias, logits and pattern ([B, H, T, C]: axis 1 is
 * the head) take whole-tensor actions only. */
static int64_t point_heads(const ps_v4_config *c, int slot, int p) {
    switch (p) {
    case PS_V4H_Q:
    case PS_V4H_OUT_HEADS: return c->n_heads;
    case PS_V4H_I_Q: return c->index_n_heads;
    case PS_V4H_ATTN_HC_COMB:
    case PS_V4H_FFN_HC_COMB:
    case PS_V4H_MID:
    case PS_V4H_OUT: return c->hc_mult;
    case PS_V4H_C_GATE:
    case PS_V4H_C_ALPHA: return (c->attn_type[slot] == PS_V4_CSA ? 2 : 1) * c->compress_rate[slot];
    case PS_V4H_I_C_GATE:
    case PS_V4H_I_C_ALPHA: return 2 * c->compress_rate[slot];
    case PS_V4H_LOGITS:
    case PS_V4H_PATTERN: return -1;
    default: return 0;
    }
}

int ps_v4_hooks_add(ps_hooks *h, const ps_v4_config *cfg, const char *name, ps_hook_fn fn, void *user, ps_error *err) {
    int slot;
    ps_v4_hook_point pt;
    if (ps_v4_hook_parse(cfg, name, &slot, &pt, err)) return -1;
    if (!fn) return ps_fail(err, "hook \"%s\": no function (an action is registered with ps_v4_hooks_add_action)", name);
    return ps_hooks_add_at(h, &ps_v4_hook_family, cfg->n_layers + 1, slot, (int)pt, name, fn, user, NULL, 0, err);
}

int ps_v4_hooks_add_action(ps_hooks *h, const ps_v4_config *cfg, const char *name, const ps_hook_action *act, ps_error *err) {
    int slot;
    ps_v4_hook_point pt;
    if (ps_v4_hook_parse(cfg, name, &slot, &pt, err)) return -1;
    if (!act) return ps_fail(err, "hook \"%s\": no action", name);
    return ps_hooks_add_at(h, &ps_v4_hook_family, cfg->n_layers + 1, slot, (int)pt, name, NULL, NULL, act,
                           point_heads(cfg, slot, (int)pt), err);
}

int ps_v4_cache_watch(ps_cache *c, ps_hooks *h, const ps_v4_config *cfg, const char *name, ps_error *err) {
    int slot;
    ps_v4_hook_point pt;
    if (ps_v4_hook_parse(cfg, name, &slot, &pt, err)) return -1;
    return ps_cache_watch_at(c, h, &ps_v4_hook_family, cfg->n_layers + 1, slot, (int)pt, err);
}
