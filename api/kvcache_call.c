/* kvcache_call.c — the KV cache of include/phasescope.h (ps_api_cache_*): core's inference-time cache
 * (core/kvcache.h) on a model handle's runtime, its sequences grown by appends that return the logits of
 * the new positions, the hook list fired during an append (registered as for a forward:
 * ps_api_hooks_register, api/run_pass.c), and the cache's entries read and edited by their hook point's
 * name (blocks.{l}.attn.cache_ck / cache_cv; DeepSeek-V4's layers.{L}.attn.cache_kv / cache_ik). */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/run_hooks.h"
#include "core/ctx.h"
#include "core/kvcache.h"

struct ps_api_cache {
    ps_api_model *m;
    ps_kvcache kv;
};

/* rows run through the layers at once in an append (a longer append runs in pieces of this many) */
#define API_CACHE_CHUNK 64

PS_API int ps_api_cache_new(ps_api_model *m, ps_api_cache **out, char *err, size_t errlen) {
    if (!m || !out) return ps_api_say(err, errlen, PS_API_EINPUT, "ps_api_cache_new: no model or no out");
    *out = NULL;
    if (m->n_run >= 0)
        return ps_api_say(err, errlen, PS_API_EINPUT,
                          "ps_api_cache_new: the model stops after layer %d (ps_api_open_ex's \"layers\"): an append has no logits",
                          m->n_run - 1);
    ps_api_cache *c = calloc(1, sizeof *c);
    if (!c) return ps_api_say(err, errlen, PS_API_EFAIL, "out of memory for a KV cache");
    ps_error e = {0};
    ps_kvcache_opts o = {.chunk = API_CACHE_CHUNK};
    if (ps_kvcache_create_rt(&c->kv, &m->rt, &o, &e)) {
        free(c);
        e.usage = 1; /* a family without a cache */
        return ps_api_report(&e, err, errlen);
    }
    c->m = m;
    *out = c;
    return PS_API_OK;
}

PS_API void ps_api_cache_free(ps_api_cache *c) {
    if (!c) return;
    ps_kvcache_free(&c->kv);
    free(c);
}

/* a live sequence, else a usage error naming it */
static int live(ps_api_cache *c, int seq, ps_error *e) {
    if (!ps_kvcache_seq(&c->kv, seq, e)) {
        e->usage = 1;
        return -1;
    }
    return 0;
}

PS_API int ps_api_cache_add(ps_api_cache *c, int *seq, char *err, size_t errlen) {
    if (!c || !seq) return ps_api_say(err, errlen, PS_API_EINPUT, "ps_api_cache_add: no cache or no seq");
    ps_error e = {0};
    int s = ps_kvcache_add(&c->kv, &e);
    if (s < 0) return ps_api_report(&e, err, errlen);
    *seq = s;
    return PS_API_OK;
}

PS_API int ps_api_cache_fork(ps_api_cache *c, int src, int *seq, char *err, size_t errlen) {
    if (!c || !seq) return ps_api_say(err, errlen, PS_API_EINPUT, "ps_api_cache_fork: no cache or no seq");
    ps_error e = {0};
    if (live(c, src, &e)) return ps_api_report(&e, err, errlen);
    int s = ps_kvcache_fork(&c->kv, src, &e);
    if (s < 0) return ps_api_report(&e, err, errlen);
    *seq = s;
    return PS_API_OK;
}

PS_API int ps_api_cache_drop(ps_api_cache *c, int seq, char *err, size_t errlen) {
    if (!c) return ps_api_say(err, errlen, PS_API_EINPUT, "ps_api_cache_drop: no cache");
    ps_error e = {0};
    if (live(c, seq, &e)) return ps_api_report(&e, err, errlen);
    ps_kvcache_drop(&c->kv, seq);
    return PS_API_OK;
}

PS_API int ps_api_cache_truncate(ps_api_cache *c, int seq, int64_t T, char *err, size_t errlen) {
    if (!c) return ps_api_say(err, errlen, PS_API_EINPUT, "ps_api_cache_truncate: no cache");
    ps_error e = {0};
    if (live(c, seq, &e)) return ps_api_report(&e, err, errlen);
    if (ps_kvcache_truncate(&c->kv, seq, T, &e)) {
        e.usage = 1; /* T out of range, or further back than the cache holds */
        return ps_api_report(&e, err, errlen);
    }
    return PS_API_OK;
}

PS_API int64_t ps_api_cache_len(const ps_api_cache *c, int seq) {
    if (!c || seq < 0 || seq >= c->kv.n_seq || !c->kv.seqs[seq].live) return -1;
    return ps_kvcache_len(&c->kv, seq);
}

PS_API int64_t ps_api_cache_bytes(const ps_api_cache *c) { return c ? ps_kvcache_bytes(&c->kv) : -1; }

PS_API int ps_api_cache_append(ps_api_cache *c, int seq, const int32_t *tokens, int64_t n, ps_api_hooks *hooks,
                               float *logits_out, char *err, size_t errlen) {
    if (!c) return ps_api_say(err, errlen, PS_API_EINPUT, "ps_api_cache_append: no cache");
    if (!tokens || n < 1)
        return ps_api_say(err, errlen, PS_API_EINPUT, "ps_api_cache_append: need at least one token (n = %lld)", (long long)n);
    ps_error e = {0};
    if (live(c, seq, &e)) return ps_api_report(&e, err, errlen);
    /* the request's checks (the length within the model's, every token in the vocabulary) are usage errors */
    int64_t n1 = n;
    if (ps_kvcache_check_request(&c->kv, 1, &seq, &n1, tokens, &e)) {
        e.usage = 1;
        return ps_api_report(&e, err, errlen);
    }
    ps_hooks h;
    ps_hooks_init(&h);
    int rc = ps_api_hooks_register(c->m, &h, hooks, 1, n, &e);
    if (!rc) rc = ps_kvcache_append(&c->kv, 1, &seq, &n1, tokens, &h, logits_out, false, &e);
    if (rc) { /* the model stays usable: a failed op's state is cleared */
        ps_error dummy = {0};
        ps_ctx_check(c->m->rt.ctx, &dummy);
    }
    ps_hooks_free(&h);
    return rc ? ps_api_report(&e, err, errlen) : PS_API_OK;
}

/* the cache point `name` as (layer, value), a usage error listing the form otherwise */
static int point(const ps_api_cache *c, const char *name, int *l, int *value, ps_error *e) {
    if (!name) {
        ps_fail(e, "no cache point name given");
        e->usage = 1;
        return -1;
    }
    if (ps_kvcache_point_parse_kv(&c->kv, name, l, value, e)) {
        e->usage = 1;
        return -1;
    }
    return 0;
}

static int head_ok(const ps_api_cache *c, const char *name, int g, ps_error *e) {
    int64_t nh = ps_kvcache_entry_heads(&c->kv);
    if (g >= 0 && g < nh) return 0;
    if (!nh) ps_fail(e, "%s: this model's cache has no compressed entries (full attention)", name);
    else ps_fail(e, "%s: head %d is outside the cache's KV heads 0..%lld", name, g, (long long)nh - 1);
    e->usage = 1;
    return -1;
}

PS_API int64_t ps_api_cache_n_entries(const ps_api_cache *c, int seq, int layer, int head) {
    if (!c || seq < 0 || seq >= c->kv.n_seq || !c->kv.seqs[seq].live) return -1;
    return ps_kvcache_n_entries(&c->kv, seq, layer, head);
}

PS_API int64_t ps_api_cache_entry_width(const ps_api_cache *c, const char *point_name) {
    if (!c) return -1;
    int l, value;
    ps_error e = {0};
    if (point(c, point_name, &l, &value, &e)) return -1;
    return ps_kvcache_entry_width(&c->kv, l, value);
}

PS_API int ps_api_cache_entry(ps_api_cache *c, int seq, const char *point_name, int head, int64_t j, float *out, char *err,
                              size_t errlen) {
    if (!c || !out) return ps_api_say(err, errlen, PS_API_EINPUT, "ps_api_cache_entry: no cache or no out");
    ps_error e = {0};
    int l, value;
    if (point(c, point_name, &l, &value, &e) || head_ok(c, point_name, head, &e) || live(c, seq, &e))
        return ps_api_report(&e, err, errlen);
    int64_t ne = ps_kvcache_n_entries(&c->kv, seq, l, head);
    if (j < 0 || j >= ne)
        return ps_api_say(err, errlen, PS_API_EINPUT, "%s: entry j = %lld of head %d: sequence %d holds %lld entries (0..%lld)", point_name,
                          (long long)j, head, seq, (long long)ne, (long long)ne - 1);
    if (ps_kvcache_entry(&c->kv, seq, l, head, value, j, out, &e)) return ps_api_report(&e, err, errlen);
    return PS_API_OK;
}

PS_API int ps_api_cache_edit(ps_api_cache *c, int seq, const char *point_name, int head, int64_t j, const char *kind,
                             const float *vec, char *err, size_t errlen) {
    if (!c) return ps_api_say(err, errlen, PS_API_EINPUT, "ps_api_cache_edit: no cache");
    ps_error e = {0};
    int l, value;
    if (point(c, point_name, &l, &value, &e) || head_ok(c, point_name, head, &e) || (seq != -1 && live(c, seq, &e)))
        return ps_api_report(&e, err, errlen);
    ps_kv_edit_kind k;
    if (kind && !strcmp(kind, "zero")) k = PS_KV_EDIT_ZERO;
    else if (kind && !strcmp(kind, "set")) k = PS_KV_EDIT_SET;
    else
        return ps_api_say(err, errlen, PS_API_EINPUT, "%s: edit kind \"%s\": must be \"zero\" or \"set\"", point_name,
                          kind ? kind : "(null)");
    if (j < 0) return ps_api_say(err, errlen, PS_API_EINPUT, "%s: entry j = %lld must be >= 0", point_name, (long long)j);
    if (k == PS_KV_EDIT_SET && !vec)
        return ps_api_say(err, errlen, PS_API_EINPUT, "%s: a \"set\" edit needs vec (%lld floats)", point_name,
                          (long long)ps_kvcache_entry_width(&c->kv, l, value));
    if (ps_kvcache_edit(&c->kv, seq, l, head, value, j, k, vec, &e)) return ps_api_report(&e, err, errlen);
    return PS_API_OK;
}
