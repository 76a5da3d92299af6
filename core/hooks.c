#include "core/hooks.h"

#include "core/ops.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const SUFFIX[PS_HOOK_NPOINTS] = {
    "hook_resid_pre",   "attn.hook_q",      "attn.hook_k",  "attn.hook_v",      "attn.hook_gate_k",
    "attn.hook_gate_v", "attn.hook_ck",     "attn.hook_cv", "attn.hook_pattern", "attn.hook_z",
    "hook_attn_out",    "hook_resid_mid",   "hook_mlp_out", "hook_resid_post",
    "attn.hook_ck2",    "attn.hook_select_scores", "attn.hook_block_scores", "attn.hook_blocks",
};

const char *ps_hook_suffix(ps_hook_point pt) { return SUFFIX[pt]; }

static bool compressed_only(ps_hook_point pt) {
    return pt == PS_HOOK_GATE_K || pt == PS_HOOK_GATE_V || pt == PS_HOOK_CK || pt == PS_HOOK_CV;
}

void ps_hook_name(char *buf, size_t n, int layer, ps_hook_point pt) { snprintf(buf, n, "blocks.%d.%s", layer, SUFFIX[pt]); }

/* Points a config does not have: the compressor's on full attention; on the channel attention (K = V, one
 * compressor, per-channel gate) v, gate_v, cv and, for now, the pattern. NULL: the point exists. */
static const char *point_missing(const ps_config *cfg, ps_hook_point pt) {
    int sel_only = pt == PS_HOOK_CK2 || pt == PS_HOOK_SELECT_SCORES || pt == PS_HOOK_BLOCK_SCORES || pt == PS_HOOK_BLOCKS;
    if (sel_only && cfg->kind != PS_ATTN_SELECT) return "exists only on select-attention models";
    if (cfg->kind == PS_ATTN_CHANNEL) {
        if (pt == PS_HOOK_V || pt == PS_HOOK_CV) return "does not exist on the channel attention (K = V: use hook_k / hook_ck)";
        if (pt == PS_HOOK_GATE_V) return "does not exist on the channel attention (one compressor: its per-channel gate is hook_gate_k)";
        if (pt == PS_HOOK_PATTERN) return "is not available on the channel attention";
        return NULL;
    }
    if (cfg->kind == PS_ATTN_SELECT) { /* hook_ck: the level-1 compressed keys */
        if (pt == PS_HOOK_PATTERN) return "is not available on the select attention (its probabilities are never materialised)";
        if (compressed_only(pt) && pt != PS_HOOK_CK) return "exists only on compressed-attention models";
        return NULL;
    }
    if (compressed_only(pt) && cfg->kind != PS_ATTN_COMPRESSED) return "exists only on compressed-attention models";
    return NULL;
}

static int invalid(const ps_config *cfg, const char *name, const char *why, ps_error *err) {
    char list[700];
    size_t w = 0;
    for (int p = 0; p < PS_HOOK_NPOINTS; p++) {
        if (point_missing(cfg, (ps_hook_point)p)) continue;
        w += (size_t)snprintf(list + w, sizeof list - w, "%sblocks.{l}.%s", w ? ", " : "", SUFFIX[p]);
        if (w >= sizeof list) break;
    }
    return ps_fail(err, "hook \"%s\": %s; valid hooks (l = 0..%lld): %s", name, why, (long long)cfg->n_layers - 1, list);
}

int ps_hook_parse(const ps_config *cfg, const char *name, int *layer, ps_hook_point *pt, ps_error *err) {
    if (strncmp(name, "blocks.", 7) != 0) return invalid(cfg, name, "unknown hook name", err);
    const char *p = name + 7;
    if (*p < '0' || *p > '9') return invalid(cfg, name, "unknown hook name", err);
    char *end;
    long l = strtol(p, &end, 10);
    if (*end != '.') return invalid(cfg, name, "unknown hook name", err);
    for (int k = 0; k < PS_HOOK_NPOINTS; k++)
        if (!strcmp(end + 1, SUFFIX[k])) {
            if (l < 0 || l >= cfg->n_layers) {
                char why[96];
                snprintf(why, sizeof why, "layer %ld out of range (the model has %lld layers)", l,
                         (long long)cfg->n_layers);
                return invalid(cfg, name, why, err);
            }
            if (point_missing(cfg, (ps_hook_point)k)) return invalid(cfg, name, point_missing(cfg, (ps_hook_point)k), err);
            *layer = (int)l;
            *pt = (ps_hook_point)k;
            return 0;
        }
    return invalid(cfg, name, "unknown hook name", err);
}

int ps_hook_shape(const ps_config *cfg, ps_hook_point pt, int64_t B, int64_t T, int64_t shape[4]) {
    int64_t d = cfg->d_model, hd = cfg->head_dim, nh = cfg->n_heads, nkv = cfg->n_kv_heads;
    int comp = cfg->kind == PS_ATTN_COMPRESSED;
    int64_t nW = ps_config_n_windows(cfg, T), W = comp ? cfg->window : 0;
    shape[0] = B;
    shape[3] = 0;
    switch (pt) {
    case PS_HOOK_Q:
    case PS_HOOK_Z: shape[1] = T, shape[2] = nh, shape[3] = hd; return 4;
    case PS_HOOK_K:
    case PS_HOOK_V: shape[1] = T, shape[2] = nkv, shape[3] = hd; return 4;
    case PS_HOOK_GATE_K:
    case PS_HOOK_GATE_V:
        if (cfg->kind == PS_ATTN_CHANNEL) { /* the per-channel gate: [B, nW, slots, hd] */
            shape[1] = nW, shape[2] = ps_config_v4_slots(cfg), shape[3] = hd;
            return 4;
        }
        shape[1] = nW, shape[2] = nkv, shape[3] = W;
        return 4;
    case PS_HOOK_CK:
    case PS_HOOK_CV:
    case PS_HOOK_CK2:
        shape[1] = nW, shape[2] = nkv, shape[3] = hd;
        if (cfg->kind == PS_ATTN_SELECT) shape[1] = pt == PS_HOOK_CK2 ? ps_select_n_windows(T, 4 * cfg->window, 4 * cfg->stride)
                                                                       : ps_select_n_windows(T, cfg->window, cfg->stride);
        return 4;
    case PS_HOOK_SELECT_SCORES:
    case PS_HOOK_BLOCK_SCORES:
    case PS_HOOK_BLOCKS: {
        ps_select_cfg sc = ps_config_select(cfg);
        shape[1] = T, shape[2] = nkv;
        shape[3] = pt == PS_HOOK_SELECT_SCORES ? ps_select_n_windows(T, cfg->window, cfg->stride)
                   : pt == PS_HOOK_BLOCK_SCORES ? ps_select_n_blocks(&sc, T)
                                                : ps_select_slots(&sc);
        return 4;
    }
    case PS_HOOK_PATTERN: shape[1] = nh, shape[2] = T, shape[3] = comp ? nW + T : T; return 4;
    default: shape[1] = T, shape[2] = d; return 3;
    }
}

/* Heads of a point's axis 2 (0: the point has no head axis an action may pick from). */
static int64_t point_heads(const ps_config *cfg, ps_hook_point pt) {
    switch (pt) {
    case PS_HOOK_Q:
    case PS_HOOK_Z: return cfg->n_heads;
    case PS_HOOK_GATE_K:
    case PS_HOOK_GATE_V:
        if (cfg->kind == PS_ATTN_CHANNEL) return ps_config_v4_slots(cfg); /* axis 2 is the slot */
        return cfg->n_kv_heads;
    case PS_HOOK_K:
    case PS_HOOK_V:
    case PS_HOOK_CK:
    case PS_HOOK_CV:
    case PS_HOOK_CK2:
    case PS_HOOK_SELECT_SCORES:
    case PS_HOOK_BLOCK_SCORES:
    case PS_HOOK_BLOCKS: return cfg->n_kv_heads;
    default: return 0;
    }
}

void ps_hooks_init(ps_hooks *h) { memset(h, 0, sizeof *h); }

void ps_hooks_free(ps_hooks *h) {
    for (int i = 0; i < h->n_bufs; i++) ps_buf_free(h->bufs[i].ctx, h->bufs[i].buf, h->bufs[i].bytes);
    free(h->bufs);
    free(h->e);
    free(h->mask);
    memset(h, 0, sizeof *h);
}

static void model_point_name(char *buf, size_t n, int slot, int point) { ps_hook_name(buf, n, slot, (ps_hook_point)point); }

const ps_hook_family ps_model_hook_family = {"phasescope", model_point_name};

static const char *action_name(ps_hook_action_kind k) {
    switch (k) {
    case PS_ACT_SET: return "set";
    case PS_ACT_ZERO: return "zero";
    case PS_ACT_PATCH: return "patch";
    case PS_ACT_ADD: return "add";
    case PS_ACT_ROLL: return "roll";
    case PS_ACT_SUM: return "sum";
    case PS_ACT_DOT: return "dot";
    }
    return "?";
}

/* The registration checks of an action on a point with `nh` heads on axis 2 (0: none; -1: whole-tensor
 * actions only). */
static int check_action(const char *name, const ps_hook_action *act, int64_t nh, ps_error *err) {
    if (!act || act->kind < PS_ACT_SET || act->kind > PS_ACT_DOT)
        return ps_fail(err, "hook \"%s\": unknown action kind %d (set, zero, patch, add, roll, sum or dot)", name, act ? (int)act->kind : -1);
    const char *k = action_name(act->kind);
    int64_t heads = nh < 0 ? 0 : nh;
    if (act->head < -1 || (act->head >= 0 && act->head >= heads)) {
        if (!heads) return ps_fail(err, "hook \"%s\": %s action on head %d, but this point has no head axis (use head -1)", name, k, act->head);
        return ps_fail(err, "hook \"%s\": %s action on head %d: out of range (the point has %lld heads, 0..%lld; -1: whole positions)",
                       name, k, act->head, (long long)heads, (long long)heads - 1);
    }
    if (nh < 0 && (act->head != -1 || act->pos0 != 0 || act->pos1 != 0))
        return ps_fail(err, "hook \"%s\": a %s action on the pattern must cover the whole tensor of its sequences (head -1, every position); use a callback for parts of it", name, k);
    if (act->seq0 < 0 || act->pos0 < 0 || act->seq1 < 0 || act->pos1 < 0 || (act->seq1 && act->seq1 <= act->seq0) ||
        (act->pos1 && act->pos1 <= act->pos0))
        return ps_fail(err, "hook \"%s\": %s action on sequences [%lld, %lld) and positions [%lld, %lld): empty or negative range (0 as the end: to the end)",
                       name, k, (long long)act->seq0, (long long)act->seq1, (long long)act->pos0, (long long)act->pos1);
    if (act->kind == PS_ACT_SUM) {
        if (!act->acc || act->acc_n < 1)
            return ps_fail(err, "hook \"%s\": sum action without an accumulator (acc of acc_n >= 1 doubles)", name);
        if (act->head != -1 || act->pos0 != 0 || act->pos1 != 0)
            return ps_fail(err, "hook \"%s\": a sum action adds whole sequences (head -1, every position)", name);
        return 0;
    }
    if (act->kind == PS_ACT_DOT) {
        if (!act->acc || act->acc_n < 1 || !act->src)
            return ps_fail(err, "hook \"%s\": dot action without an accumulator (acc of acc_n >= 1 doubles) or a source (src)", name);
        if (act->head != -1 || act->pos0 != 0 || act->pos1 != 0 || nh < 0)
            return ps_fail(err, "hook \"%s\": a dot action covers every head and position of its sequences (head -1, not on the pattern)", name);
        if (act->src_nseq < 0 || act->src_seq0 < 0)
            return ps_fail(err, "hook \"%s\": dot action: src_nseq %lld and src_seq0 %lld must be >= 0", name,
                           (long long)act->src_nseq, (long long)act->src_seq0);
        return 0;
    }
    if (act->kind == PS_ACT_ZERO || act->kind == PS_ACT_ROLL) return 0;
    if (!act->src) return ps_fail(err, "hook \"%s\": %s action without a source (src)", name, k);
    if (!(act->every_pos && act->kind != PS_ACT_PATCH) && act->src_npos < 1)
        return ps_fail(err, "hook \"%s\": %s action: the source holds %lld positions (src_npos must be >= 1)", name, k, (long long)act->src_npos);
    if (act->kind == PS_ACT_PATCH && (act->every_pos || act->src_nseq < 1 || act->src_seq0 < 0))
        return ps_fail(err, "hook \"%s\": patch action: the source must hold sequences (src_nseq %lld >= 1, src_seq0 %lld >= 0) of whole positions (every_pos is for set and add)",
                       name, (long long)act->src_nseq, (long long)act->src_seq0);
    return 0;
}

int ps_hooks_add_at(ps_hooks *h, const ps_hook_family *family, int64_t n_slots, int slot, int point, const char *name,
                    ps_hook_fn fn, void *user, const ps_hook_action *act, int64_t heads, ps_error *err) {
    if (!family || slot < 0 || slot >= n_slots || point < 0 || point >= 64)
        return ps_fail(err, "hook \"%s\": point out of range", name);
    if (!fn && check_action(name, act, heads, err)) return -1;
    if (!h->mask) {
        h->mask = calloc((size_t)n_slots, sizeof *h->mask);
        if (!h->mask) return ps_fail(err, "out of memory");
        h->n_layers = n_slots;
        h->family = family;
    } else if (h->family != family)
        return ps_fail(err, "hook \"%s\": this hook set holds %s hooks, not %s ones", name, h->family->name, family->name);
    else if (h->n_layers != n_slots)
        return ps_fail(err, "hook \"%s\": hook set was built for a model with %lld layers", name, (long long)h->n_layers);
    if (h->n == h->cap) {
        int cap = h->cap ? 2 * h->cap : 8;
        ps_hook_entry *ne = realloc(h->e, (size_t)cap * sizeof *ne);
        if (!ne) return ps_fail(err, "out of memory");
        h->e = ne;
        h->cap = cap;
    }
    ps_hook_entry e = {.layer = slot, .point = point, .fn = fn, .user = user};
    if (!fn) e.act = *act;
    h->e[h->n++] = e;
    h->mask[slot] |= (uint64_t)1 << point;
    return 0;
}

int ps_hooks_add(ps_hooks *h, const ps_config *cfg, const char *name, ps_hook_fn fn, void *user, ps_error *err) {
    int layer;
    ps_hook_point pt;
    if (ps_hook_parse(cfg, name, &layer, &pt, err)) return -1;
    if (!fn) return ps_fail(err, "hook \"%s\": no function (an action is registered with ps_hooks_add_action)", name);
    return ps_hooks_add_at(h, &ps_model_hook_family, cfg->n_layers, layer, (int)pt, name, fn, user, NULL, 0, err);
}

int ps_hooks_add_action(ps_hooks *h, const ps_config *cfg, const char *name, const ps_hook_action *act, ps_error *err) {
    int layer;
    ps_hook_point pt;
    if (ps_hook_parse(cfg, name, &layer, &pt, err)) return -1;
    if (!act) return ps_fail(err, "hook \"%s\": no action", name);
    int64_t nh = pt == PS_HOOK_PATTERN ? -1 : point_heads(cfg, pt);
    return ps_hooks_add_at(h, &ps_model_hook_family, cfg->n_layers, layer, (int)pt, name, NULL, NULL, act, nh, err);
}

const float *ps_hooks_upload(ps_hooks *h, ps_ctx *ctx, const float *host, int64_t n, ps_error *err) {
    if (n < 0) {
        ps_fail(err, "hook source of %lld floats: negative size", (long long)n);
        return NULL;
    }
    if (h->n_bufs == h->cap_bufs) {
        int cap = h->cap_bufs ? 2 * h->cap_bufs : 4;
        ps_hook_buffer *nb = realloc(h->bufs, (size_t)cap * sizeof *nb);
        if (!nb) {
            ps_fail(err, "out of memory");
            return NULL;
        }
        h->bufs = nb;
        h->cap_bufs = cap;
    }
    int64_t bytes = n * (int64_t)sizeof(float);
    float *buf = ps_buf_alloc(ctx, bytes, "a hook action's source", err);
    if (!buf) return NULL;
    if (ps_buf_from_host(ctx, buf, host, bytes, err)) {
        ps_buf_free(ctx, buf, bytes);
        return NULL;
    }
    h->bufs[h->n_bufs++] = (ps_hook_buffer){ctx, buf, bytes};
    return buf;
}

/* One action on the activation x (a buffer of ctx, the event's shape). */
static int run_action(ps_ctx *ctx, const ps_hook_action *a, const char *name, float *x, int ndim, const int64_t *shape,
                      ps_error *err) {
    int64_t B = shape[0], npos = ndim > 1 ? shape[1] : 1, inner = 1;
    for (int i = 2; i < ndim; i++) inner *= shape[i];
    int64_t nh = 1, unit = inner, off = 0;
    if (a->head >= 0) {
        if (ndim != 4 || a->head >= shape[2])
            return ps_fail(err, "hook \"%s\": %s action on head %d of an activation without it", name, action_name(a->kind), a->head);
        nh = shape[2];
        unit = inner / nh;
        off = a->head * unit;
    }
    int64_t s0 = a->seq0, s1 = a->seq1 ? a->seq1 : B, p0 = a->pos0, p1 = a->pos1 ? a->pos1 : npos;
    if (s1 > B || s0 > s1 || p1 > npos || p0 > p1)
        return ps_fail(err, "hook \"%s\": %s action on sequences [%lld, %lld) and positions [%lld, %lld) of an activation of %lld sequences x %lld positions",
                       name, action_name(a->kind), (long long)s0, (long long)s1, (long long)p0, (long long)p1, (long long)B,
                       (long long)npos);
    int whole = p0 == 0 && p1 == npos, broadcast = a->every_pos && a->kind != PS_ACT_PATCH;
    if (a->kind == PS_ACT_SUM) {
        if (a->acc_n != npos * inner)
            return ps_fail(err, "hook \"%s\": sum action: the accumulator holds %lld values, a sequence of the activation %lld", name,
                           (long long)a->acc_n, (long long)(npos * inner));
        if (s0 < s1 && ps_accumulate_seqs(ctx, a->acc, x + s0 * npos * inner, s1 - s0, npos * inner)) {
            ps_ctx_check(ctx, err);
            return ps_fail_prefix(err, "hook \"%s\": sum action: ", name);
        }
        return 0;
    }
    if (a->kind == PS_ACT_DOT) {
        int64_t H = ndim == 4 ? shape[2] : 1, X = inner / H, xs = npos * inner;
        if (a->acc_n != (s1 - s0) * H)
            return ps_fail(err, "hook \"%s\": dot action: the accumulator holds %lld values, the range %lld sequences x %lld heads", name,
                           (long long)a->acc_n, (long long)(s1 - s0), (long long)H);
        if (a->src_npos < npos)
            return ps_fail(err, "hook \"%s\": dot action reaches position %lld, but its source holds %lld positions", name,
                           (long long)npos - 1, (long long)a->src_npos);
        if (a->src_nseq > 0 && a->src_seq0 + (s1 - s0) > a->src_nseq)
            return ps_fail(err, "hook \"%s\": dot action reads source sequences [%lld, %lld), but the source holds %lld", name,
                           (long long)a->src_seq0, (long long)(a->src_seq0 + s1 - s0), (long long)a->src_nseq);
        if (s0 < s1 && ps_delta_dot(ctx, a->acc, x + s0 * xs, a->ref ? a->ref + s0 * xs : NULL,
                                    a->src + (a->src_nseq > 0 ? a->src_seq0 * xs : 0), a->src_nseq > 0 ? s1 - s0 : 1, s1 - s0,
                                    npos, H, X)) {
            ps_ctx_check(ctx, err);
            return ps_fail_prefix(err, "hook \"%s\": dot action: ", name);
        }
        return 0;
    }
    if (a->kind == PS_ACT_ROLL) {
        int64_t n = p1 - p0, k = n > 0 ? ((a->shift % n) + n) % n : 0;
        for (int64_t b = s0; b < s1 && k; b++)
            if (ps_roll_blocks(ctx, x + b * npos * inner + p0 * inner, n, inner, off, unit, k)) {
                ps_ctx_check(ctx, err);
                return ps_fail_prefix(err, "hook \"%s\": roll action: ", name);
            }
        return 0;
    }
    if (a->kind != PS_ACT_ZERO && !broadcast && p1 > a->src_npos)
        return ps_fail(err, "hook \"%s\": %s action reaches position %lld, but its source holds %lld positions", name,
                       action_name(a->kind), (long long)p1 - 1, (long long)a->src_npos);
    if (a->kind == PS_ACT_PATCH && a->src_seq0 + (s1 - s0) > a->src_nseq)
        return ps_fail(err, "hook \"%s\": patch action reads source sequences [%lld, %lld), but the source holds %lld", name,
                       (long long)a->src_seq0, (long long)(a->src_seq0 + s1 - s0), (long long)a->src_nseq);
    if (s0 == s1 || p0 == p1) return 0;
    int64_t xs = npos * inner; /* floats per sequence */
    float *y = x + s0 * xs + p0 * inner + off;
    int rc;
    switch (a->kind) {
    case PS_ACT_SET:
    case PS_ACT_ZERO: {
        const float *src = a->kind == PS_ACT_ZERO ? NULL : a->src + off + (broadcast ? 0 : p0 * inner);
        int64_t ss = broadcast ? 0 : inner;
        if (whole) /* every position: the head-set op (a whole position is head 0 of one) */
            rc = ps_head_set(ctx, x, src, ss, B, npos, a->head >= 0 ? nh : 1, unit, a->head >= 0 ? a->head : 0, s0, s1);
        else
            rc = ps_copy_blocks(ctx, y, xs, inner, src, 0, ss, s1 - s0, p1 - p0, unit, 0, 0.0f);
        break;
    }
    case PS_ACT_PATCH: {
        int64_t src_xs = a->src_npos * inner;
        rc = ps_copy_blocks(ctx, y, xs, inner, a->src + a->src_seq0 * src_xs + p0 * inner + off, src_xs, inner, s1 - s0,
                            p1 - p0, unit, 0, 0.0f);
        break;
    }
    default: { /* PS_ACT_ADD */
        if (whole && broadcast && a->head < 0)
            rc = ps_add_vector(ctx, x + s0 * xs, a->src, a->scale, (s1 - s0) * npos, inner);
        else
            rc = ps_copy_blocks(ctx, y, xs, inner, a->src + off + (broadcast ? 0 : p0 * inner), 0, broadcast ? 0 : inner,
                                s1 - s0, p1 - p0, unit, 1, a->scale);
        break;
    }
    }
    if (rc) {
        ps_ctx_check(ctx, err);
        return ps_fail_prefix(err, "hook \"%s\": %s action: ", name, action_name(a->kind));
    }
    return 0;
}

int ps_hooks_fire_point(ps_ctx *ctx, const ps_hooks *h, int layer, int pt, float *data, int ndim, const int64_t *shape,
                        ps_error *err) {
    char name[96];
    h->family->point_name(name, sizeof name, layer, pt);
    int own = h->family == &ps_model_hook_family;
    ps_hook_event ev = {.name = name, .layer = layer, .point = own ? (ps_hook_point)pt : PS_HOOK_NPOINTS, .data = data,
                        .ndim = ndim, .point_id = pt};
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= (ev.shape[i] = shape[i]);
    /* A host callback on a device backend gets a host copy of the hooked tensor (made only here, only
     * when such a callback is registered): fetched before a callback that follows an action (or comes
     * first), written back before an action that follows a callback and at the end. */
    int host_side = !ps_ctx_host_visible(ctx), host_fresh = 0, host_dirty = 0;
    int64_t bytes = n * (int64_t)sizeof(float);
    float *host = NULL;
    int rc = 0;
    for (int i = 0; i < h->n && !rc; i++) {
        const ps_hook_entry *e = &h->e[i];
        if (e->layer != layer || e->point != pt) continue;
        if (!e->fn) {
            if (host_dirty) {
                rc = ps_buf_from_host(ctx, data, host, bytes, err);
                host_dirty = 0;
            }
            if (!rc) rc = run_action(ctx, &e->act, name, data, ndim, shape, err);
            host_fresh = 0;
            continue;
        }
        if (host_side && !host_fresh) {
            if (!host && !(host = malloc((size_t)(n > 0 ? n : 1) * sizeof(float))))
                return ps_fail(err, "hook \"%s\": out of memory for a host copy of %lld floats", name, (long long)n);
            rc = ps_buf_to_host(ctx, host, data, bytes, err);
            ev.data = host;
            host_fresh = 1;
        }
        if (!rc) rc = e->fn(&ev, e->user, err);
        host_dirty = host_side;
    }
    if (host_dirty && !rc) rc = ps_buf_from_host(ctx, data, host, bytes, err);
    free(host);
    return rc;
}

/* ---- cache ---- */

void ps_cache_init(ps_cache *c) { memset(c, 0, sizeof *c); }

void ps_cache_free(ps_cache *c) {
    for (int i = 0; i < c->n; i++) {
        free(c->items[i]->data);
        free(c->items[i]);
    }
    free(c->items);
    memset(c, 0, sizeof *c);
}

const ps_cache_item *ps_cache_get(const ps_cache *c, const char *name) {
    for (int i = 0; i < c->n; i++)
        if (!strcmp(c->items[i]->name, name)) return c->items[i];
    return NULL;
}

static int cache_hook(const ps_hook_event *ev, void *user, ps_error *err) {
    ps_cache *c = user;
    ps_cache_item *it = (ps_cache_item *)ps_cache_get(c, ev->name);
    if (!it) return ps_fail(err, "hook \"%s\": not watched by this cache", ev->name);
    int64_t n = 1, old = it->data ? 1 : 0;
    for (int i = 0; i < ev->ndim; i++) n *= ev->shape[i];
    for (int i = 0; old && i < it->ndim; i++) old *= it->shape[i];
    if (n != old || !it->data) { /* an event of 0 floats (no windows yet) is cached too: an empty array */
        float *d = realloc(it->data, (size_t)(n ? n : 1) * sizeof(float));
        if (!d) return ps_fail(err, "hook \"%s\": out of memory caching %lld floats", ev->name, (long long)n);
        it->data = d;
    }
    it->ndim = ev->ndim;
    for (int i = 0; i < ev->ndim; i++) it->shape[i] = ev->shape[i];
    memcpy(it->data, ev->data, (size_t)n * sizeof(float));
    return 0;
}

int ps_cache_watch_at(ps_cache *c, ps_hooks *h, const ps_hook_family *family, int64_t n_slots, int slot, int point,
                      ps_error *err) {
    char canon[96];
    family->point_name(canon, sizeof canon, slot, point);
    if (ps_cache_get(c, canon)) return 0;
    if (c->n == c->cap) {
        int cap = c->cap ? 2 * c->cap : 8;
        ps_cache_item **items = realloc(c->items, (size_t)cap * sizeof *items);
        if (!items) return ps_fail(err, "hook \"%s\": out of memory growing the cache", canon);
        c->items = items;
        c->cap = cap;
    }
    /* each item is its own allocation, so pointers from ps_cache_get survive the cache growing */
    ps_cache_item *it = calloc(1, sizeof *it);
    if (!it) return ps_fail(err, "hook \"%s\": out of memory", canon);
    c->items[c->n++] = it;
    snprintf(it->name, sizeof it->name, "%s", canon);
    return ps_hooks_add_at(h, family, n_slots, slot, point, canon, cache_hook, c, NULL, 0, err);
}

int ps_cache_watch(ps_cache *c, ps_hooks *h, const ps_config *cfg, const char *name, ps_error *err) {
    int layer;
    ps_hook_point pt;
    if (ps_hook_parse(cfg, name, &layer, &pt, err)) return -1;
    return ps_cache_watch_at(c, h, &ps_model_hook_family, cfg->n_layers, layer, (int)pt, err);
}
