#include "hooks.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const SUFFIX[PS_HOOK_NPOINTS] = {
    "hook_resid_pre",   "attn.hook_q",      "attn.hook_k",  "attn.hook_v",      "attn.hook_gate_k",
    "attn.hook_gate_v", "attn.hook_ck",     "attn.hook_cv", "attn.hook_pattern", "attn.hook_z",
    "hook_attn_out",    "hook_resid_mid",   "hook_mlp_out", "hook_resid_post",
};

const char *ps_hook_suffix(ps_hook_point pt) { return SUFFIX[pt]; }

static bool compressed_only(ps_hook_point pt) {
    return pt == PS_HOOK_GATE_K || pt == PS_HOOK_GATE_V || pt == PS_HOOK_CK || pt == PS_HOOK_CV;
}

void ps_hook_name(char *buf, size_t n, int layer, ps_hook_point pt) { snprintf(buf, n, "blocks.%d.%s", layer, SUFFIX[pt]); }

static int invalid(const ps_config *cfg, const char *name, const char *why, ps_error *err) {
    char list[700];
    size_t w = 0;
    for (int p = 0; p < PS_HOOK_NPOINTS; p++) {
        if (compressed_only((ps_hook_point)p) && cfg->kind != PS_ATTN_COMPRESSED) continue;
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
            if (compressed_only((ps_hook_point)k) && cfg->kind != PS_ATTN_COMPRESSED)
                return invalid(cfg, name, "exists only on compressed-attention models", err);
            *layer = (int)l;
            *pt = (ps_hook_point)k;
            return 0;
        }
    return invalid(cfg, name, "unknown hook name", err);
}

void ps_hooks_init(ps_hooks *h) { memset(h, 0, sizeof *h); }

void ps_hooks_free(ps_hooks *h) {
    free(h->e);
    free(h->mask);
    memset(h, 0, sizeof *h);
}

int ps_hooks_add(ps_hooks *h, const ps_config *cfg, const char *name, ps_hook_fn fn, void *user, ps_error *err) {
    int layer;
    ps_hook_point pt;
    if (ps_hook_parse(cfg, name, &layer, &pt, err)) return -1;
    if (!h->mask) {
        h->mask = calloc((size_t)cfg->n_layers, sizeof *h->mask);
        if (!h->mask) return ps_fail(err, "out of memory");
        h->n_layers = cfg->n_layers;
    } else if (h->n_layers != cfg->n_layers)
        return ps_fail(err, "hook \"%s\": hook set was built for a model with %lld layers", name, (long long)h->n_layers);
    if (h->n == h->cap) {
        int cap = h->cap ? 2 * h->cap : 8;
        ps_hook_entry *e = realloc(h->e, (size_t)cap * sizeof *e);
        if (!e) return ps_fail(err, "out of memory");
        h->e = e;
        h->cap = cap;
    }
    h->e[h->n++] = (ps_hook_entry){layer, pt, fn, user};
    h->mask[layer] |= 1u << pt;
    return 0;
}

int ps_hooks_fire(ps_ctx *ctx, const ps_hooks *h, int layer, ps_hook_point pt, float *data, int ndim,
                  const int64_t *shape, ps_error *err) {
    char name[96];
    ps_hook_name(name, sizeof name, layer, pt);
    ps_hook_event ev = {.name = name, .layer = layer, .point = pt, .data = data, .ndim = ndim};
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= (ev.shape[i] = shape[i]);
    /* A host callback on a device backend gets a host copy of the hooked tensor (made only here, only
     * when such a callback is registered), and what it wrote goes back. */
    float *host = NULL;
    int rc = 0;
    for (int i = 0; i < h->n && !rc; i++) {
        if (h->e[i].layer != layer || h->e[i].point != pt) continue;
        if (!ps_ctx_host_visible(ctx) && !host) {
            host = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
            if (!host) return ps_fail(err, "hook \"%s\": out of memory for a host copy of %lld floats", name, (long long)n);
            rc = ps_buf_to_host(ctx, host, data, n * (int64_t)sizeof(float), err);
            ev.data = host;
        }
        if (!rc) rc = h->e[i].fn(&ev, h->e[i].user, err);
    }
    if (host) {
        if (!rc) rc = ps_buf_from_host(ctx, data, host, n * (int64_t)sizeof(float), err);
        free(host);
    }
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
    if (n != old) {
        float *d = realloc(it->data, (size_t)(n ? n : 1) * sizeof(float));
        if (!d) return ps_fail(err, "hook \"%s\": out of memory caching %lld floats", ev->name, (long long)n);
        it->data = d;
    }
    it->ndim = ev->ndim;
    for (int i = 0; i < ev->ndim; i++) it->shape[i] = ev->shape[i];
    memcpy(it->data, ev->data, (size_t)n * sizeof(float));
    return 0;
}

int ps_cache_watch(ps_cache *c, ps_hooks *h, const ps_config *cfg, const char *name, ps_error *err) {
    int layer;
    ps_hook_point pt;
    if (ps_hook_parse(cfg, name, &layer, &pt, err)) return -1;
    if (ps_cache_get(c, name)) return 0;
    if (c->n == c->cap) {
        int cap = c->cap ? 2 * c->cap : 8;
        ps_cache_item **items = realloc(c->items, (size_t)cap * sizeof *items);
        if (!items) return ps_fail(err, "hook \"%s\": out of memory growing the cache", name);
        c->items = items;
        c->cap = cap;
    }
    /* each item is its own allocation, so pointers from ps_cache_get survive the cache growing */
    ps_cache_item *it = calloc(1, sizeof *it);
    if (!it) return ps_fail(err, "hook \"%s\": out of memory", name);
    c->items[c->n++] = it;
    ps_hook_name(it->name, sizeof it->name, layer, pt);
    return ps_hooks_add(h, cfg, name, cache_hook, c, err);
}
