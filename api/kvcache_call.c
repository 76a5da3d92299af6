/* kvcache_call.c — the KV cache of include/phasescope.h (ps_api_cache_*): core's inference-time cache
 * (core/kvcache.h) on a model handle's runtime, its sequences grown by appends that return the logits of
 * the new positions, the hook list fired during an append (registered as for a forward:
 * ps_api_hooks_register, api/run_pass.c), and the cache's entries read and edited by their hook point's
 * name (blocks.{l}.attn.cache_ck / cache_cv; DeepSeek-V4's layers.{L}.attn.cache_kv / cache_ik); and generation
 * on a cache of its own (ps_api_generate: core/generate.h, the CLI's `generate`, its options as JSON). */
#define _POSIX_C_SOURCE 200809L
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/run_hooks.h"
#include "core/ctx.h"
#include "core/generate.h"
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

/* ---- generation (core/generate.h) on a cache of its own ---- */

typedef struct {
    const ps_kvcache *kv;
    ps_generate_opts *o;
    ps_generate_edit *edits;
    float **vecs; /* [n_alloc] the "value" lists of object edits (NULL for the others), owned here */
    int32_t *stop; /* the "stop" ids, owned here */
    int n_edits, n_alloc;
} gen_options;

static int gen_number(const char *k, json_t *v, double lo, double hi, double *out, char *err, size_t errlen) {
    if (!json_is_number(v) || !(json_number_value(v) >= lo && json_number_value(v) <= hi))
        return ps_api_say(err, errlen, PS_API_EINPUT, "options: \"%s\": expected a number in [%g, %g]", k, lo, hi);
    *out = json_number_value(v);
    return 0;
}

/* one edit of "edits": a string "POINT:HEAD:ENTRY:zero|mean", or {"point", "head", "entry", "value"} */
static int gen_edit(gen_options *G, size_t i, json_t *v, ps_generate_edit *e, char *err, size_t errlen) {
    ps_error pe = {0};
    memset(e, 0, sizeof *e);
    if (json_is_string(v)) {
        if (ps_generate_edit_parse_kv(G->kv, json_string_value(v), e, &pe))
            return ps_api_say(err, errlen, PS_API_EINPUT, "options: \"edits\"[%zu]: %s", i, pe.msg);
        return 0;
    }
    json_t *p = json_object_get(v, "point"), *h = json_object_get(v, "head"), *j = json_object_get(v, "entry"),
           *val = json_object_get(v, "value");
    if (!json_is_object(v) || !json_is_string(p) || !json_is_integer(h) || !json_is_integer(j) || !json_is_array(val) ||
        json_object_size(v) != 4)
        return ps_api_say(err, errlen, PS_API_EINPUT,
                          "options: \"edits\"[%zu]: expected \"POINT:HEAD:ENTRY:zero|mean\" or {\"point\": POINT, \"head\": G, "
                          "\"entry\": J, \"value\": [floats]}",
                          i);
    const char *pn = json_string_value(p);
    if (ps_kvcache_point_parse_kv(G->kv, pn, &e->layer, &e->value, &pe))
        return ps_api_say(err, errlen, PS_API_EINPUT, "options: \"edits\"[%zu]: %s", i, pe.msg);
    int64_t nh = ps_kvcache_entry_heads(G->kv), w = ps_kvcache_entry_width(G->kv, e->layer, e->value);
    json_int_t g = json_integer_value(h), jj = json_integer_value(j);
    if (g < 0 || g >= nh)
        return ps_api_say(err, errlen, PS_API_EINPUT, "options: \"edits\"[%zu]: %s: head %lld is outside the cache's KV heads 0..%lld", i,
                          pn, (long long)g, (long long)nh - 1);
    if (jj < 0) return ps_api_say(err, errlen, PS_API_EINPUT, "options: \"edits\"[%zu]: %s: entry %lld must be >= 0", i, pn, (long long)jj);
    if ((int64_t)json_array_size(val) != w)
        return ps_api_say(err, errlen, PS_API_EINPUT, "options: \"edits\"[%zu]: %s: \"value\" has %zu numbers, an entry %lld", i, pn,
                          json_array_size(val), (long long)w);
    float *vec = malloc((size_t)w * sizeof *vec);
    if (!vec) return ps_api_say(err, errlen, PS_API_EFAIL, "out of memory for an edit");
    G->vecs[i] = vec;
    for (int64_t x = 0; x < w; x++) {
        json_t *f = json_array_get(val, (size_t)x);
        if (!json_is_number(f))
            return ps_api_say(err, errlen, PS_API_EINPUT, "options: \"edits\"[%zu]: %s: \"value\"[%lld] is not a number", i, pn, (long long)x);
        vec[x] = (float)json_number_value(f);
    }
    e->head = (int)g;
    e->entry = jj;
    e->vec = vec;
    return 0;
}

static int gen_option(const char *k, json_t *v, void *user, char *err, size_t errlen) {
    gen_options *G = user;
    double x = 0;
    if (!strcmp(k, "temperature")) {
        if (gen_number(k, v, 0, 100, &x, err, errlen)) return PS_API_EINPUT;
        G->o->temperature = x;
    } else if (!strcmp(k, "top_p")) {
        if (gen_number(k, v, 1e-9, 1, &x, err, errlen)) return PS_API_EINPUT;
        G->o->top_p = x;
    } else if (!strcmp(k, "seed")) {
        if (!json_is_integer(v) || json_integer_value(v) < 0)
            return ps_api_say(err, errlen, PS_API_EINPUT, "options: \"seed\": expected an integer >= 0");
        G->o->seed = (uint64_t)json_integer_value(v);
    } else if (!strcmp(k, "stop")) {
        size_t n = json_is_array(v) ? json_array_size(v) : 0;
        int64_t V = ps_kvcache_vocab(G->kv);
        if (!json_is_array(v) || n > 1024) return ps_api_say(err, errlen, PS_API_EINPUT, "options: \"stop\": expected a list of at most 1024 token ids");
        free(G->stop);
        if (!(G->stop = malloc((n ? n : 1) * sizeof *G->stop))) return ps_api_say(err, errlen, PS_API_EFAIL, "out of memory");
        for (size_t i = 0; i < n; i++) {
            json_t *x = json_array_get(v, i);
            if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) >= V)
                return ps_api_say(err, errlen, PS_API_EINPUT, "options: \"stop\"[%zu]: expected a token id in [0, %lld)", i, (long long)V);
            G->stop[i] = (int32_t)json_integer_value(x);
        }
        G->o->stop = G->stop, G->o->n_stop = (int)n;
    } else if (!strcmp(k, "edits")) {
        if (!json_is_array(v)) return ps_api_say(err, errlen, PS_API_EINPUT, "options: \"edits\": expected a list");
        size_t n = json_array_size(v);
        if (n > 1 << 20) return ps_api_say(err, errlen, PS_API_EINPUT, "options: \"edits\": %zu edits (at most %d)", n, 1 << 20);
        G->edits = calloc(n ? n : 1, sizeof *G->edits);
        G->vecs = calloc(n ? n : 1, sizeof *G->vecs);
        if (!G->edits || !G->vecs) return ps_api_say(err, errlen, PS_API_EFAIL, "out of memory for the edits");
        G->n_alloc = (int)n;
        for (size_t i = 0; i < n; i++) {
            int rc = gen_edit(G, i, json_array_get(v, i), &G->edits[i], err, errlen);
            if (rc) return rc;
        }
        G->n_edits = (int)n;
    } else
        return ps_api_say(err, errlen, PS_API_EINPUT, "options: \"%s\": unknown (temperature, top_p, seed, stop, edits)", k);
    return 0;
}

PS_API int ps_api_generate(ps_api_model *m, const int32_t *tokens, const int64_t *lens, int n, int64_t max_tokens,
                           const char *options_json, ps_api_hooks *hooks, int32_t *tokens_out, double *logprobs_out,
                           int64_t *n_gen, char *err, size_t errlen) {
    if (!m || !tokens || !lens || !tokens_out || !n_gen)
        return ps_api_say(err, errlen, PS_API_EINPUT, "ps_api_generate: no model, tokens, lens, tokens_out or n_gen");
    if (n < 1) return ps_api_say(err, errlen, PS_API_EINPUT, "ps_api_generate: n = %d prompts (at least one)", n);
    if (max_tokens < 0)
        return ps_api_say(err, errlen, PS_API_EINPUT, "ps_api_generate: max_tokens = %lld must be >= 0", (long long)max_tokens);
    ps_api_cache *c = NULL;
    int rc = ps_api_cache_new(m, &c, err, errlen);
    if (rc) return rc;
    int64_t V = ps_kvcache_vocab(&c->kv), max_len = ps_kvcache_max_len(&c->kv), off = 0;
    for (int i = 0; i < n && !rc; off += lens[i], i++) {
        if (lens[i] < 1 || lens[i] > max_len)
            rc = ps_api_say(err, errlen, PS_API_EINPUT, "ps_api_generate: prompt %d has %lld tokens (1..%lld, %s)", i,
                            (long long)lens[i], (long long)max_len, ps_api_context_length_name(m));
        for (int64_t t = 0; t < lens[i] && !rc; t++)
            if (tokens[off + t] < 0 || tokens[off + t] >= V)
                rc = ps_api_say(err, errlen, PS_API_EINPUT, "ps_api_generate: token %d (prompt %d, position %lld) is outside the vocabulary [0, %lld)",
                                tokens[off + t], i, (long long)t, (long long)V);
    }
    ps_api_progress pr = {.fn = m->progress, .user = m->progress_user};
    ps_generate_opts o = {.max_tokens = max_tokens, .top_p = 1, .progress = pr.fn ? ps_api_progress_call : NULL, .progress_user = &pr};
    gen_options G = {.kv = &c->kv, .o = &o};
    if (!rc) rc = ps_api_options(options_json, gen_option, &G, err, errlen);
    int32_t **prompt = rc ? NULL : malloc((size_t)n * sizeof *prompt);
    if (!rc && !prompt) rc = ps_api_say(err, errlen, PS_API_EFAIL, "out of memory");
    off = 0;
    for (int i = 0; i < n && !rc; off += lens[i], i++) prompt[i] = (int32_t *)(tokens + off);
    ps_hooks h;
    ps_hooks_init(&h);
    ps_error e = {0};
    ps_generate_result res = {0};
    if (!rc) {
        int f = ps_api_hooks_register(m, &h, hooks, 1, 1, &e) || ps_generate(&c->kv, n, prompt, lens, &o, G.edits, G.n_edits, &h, &res, &e);
        if (f) {
            ps_error dummy = {0};
            ps_ctx_check(m->rt.ctx, &dummy); /* the model stays usable */
            rc = ps_api_report(&e, err, errlen);
            if (pr.stopped) rc = PS_API_ECANCELLED;
        }
    }
    for (int i = 0; i < n && !rc; i++) {
        n_gen[i] = res.n_gen[i];
        for (int64_t t = 0; t < max_tokens; t++) {
            tokens_out[i * max_tokens + t] = t < res.n_gen[i] ? res.tok[i][t] : -1;
            if (logprobs_out) logprobs_out[i * max_tokens + t] = t < res.n_gen[i] ? res.logprob[i][t] : 0;
        }
    }
    ps_generate_result_free(&res);
    ps_hooks_free(&h);
    for (int k = 0; k < G.n_alloc; k++) free(G.vecs[k]);
    free(G.vecs);
    free(G.edits);
    free(G.stop);
    free(prompt);
    ps_api_cache_free(c);
    return rc;
}
