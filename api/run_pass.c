/* run_pass.c — run_with_hooks and run_with_cache (include/phasescope.h): the tokens checked, the hook list
 * and the cache registered on one core hook set (core/hooks.h), the family's forward (core/runtime.h),
 * and, with grads, the backward with its hooks (core/backward.h) caching the gradients at the same
 * points; what comes out is copied into a ps_api_output the caller owns. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/run_hooks.h"
#include "core/backward.h"
#include "core/forward.h"
#include "core/hooks.h"

typedef struct {
    char *name;
    int rank;
    int64_t shape[4];
    float *data, *grad;
} out_item;

struct ps_api_output {
    float *logits;
    int64_t logits_shape[3];
    int n;
    out_item *items;
    double loss;
    int64_t n_targets;
};

PS_API void ps_api_output_free(ps_api_output *o) {
    if (!o) return;
    for (int i = 0; i < o->n; i++) {
        free(o->items[i].name);
        free(o->items[i].data);
        free(o->items[i].grad);
    }
    free(o->items);
    free(o->logits);
    free(o);
}

PS_API const float *ps_api_output_logits(const ps_api_output *o, int64_t shape[3]) {
    if (shape)
        for (int k = 0; k < 3; k++) shape[k] = o->logits_shape[k];
    return o->logits;
}
PS_API int ps_api_output_count(const ps_api_output *o) { return o->n; }
PS_API const char *ps_api_output_name(const ps_api_output *o, int i) { return i >= 0 && i < o->n ? o->items[i].name : NULL; }
PS_API const float *ps_api_output_data(const ps_api_output *o, int i) { return i >= 0 && i < o->n ? o->items[i].data : NULL; }
PS_API const float *ps_api_output_grad(const ps_api_output *o, int i) { return i >= 0 && i < o->n ? o->items[i].grad : NULL; }
PS_API const int64_t *ps_api_output_shape(const ps_api_output *o, int i, int *rank) {
    if (i < 0 || i >= o->n) {
        if (rank) *rank = 0;
        return NULL;
    }
    if (rank) *rank = o->items[i].rank;
    return o->items[i].shape;
}
PS_API int ps_api_output_find(const ps_api_output *o, const char *name) {
    for (int i = 0; name && i < o->n; i++)
        if (!strcmp(o->items[i].name, name)) return i;
    return -1;
}
PS_API double ps_api_output_loss(const ps_api_output *o) { return o->loss; }
PS_API int64_t ps_api_output_n_targets(const ps_api_output *o) { return o->n_targets; }

/* ---- the hook list on a core hook set ---- */

static int trampoline(const ps_hook_event *ev, void *user, ps_error *err) {
    ps_api_hook_entry *e = user;
    int r = e->fn(ev->name, ev->data, ev->shape, ev->ndim, e->user);
    if (!r) return 0;
    if (e->list->fail_msg[0]) return ps_fail(err, "hook %s: %s", ev->name, e->list->fail_msg);
    return ps_fail(err, "hook %s: the callback returned %d", ev->name, r);
}

static int same_dims(const int64_t *a, const int64_t *b, int n) {
    for (int k = 0; k < n; k++)
        if (a[k] != b[k]) return 0;
    return 1;
}

static void dims_text(char *buf, size_t n, const int64_t *d, int r) {
    size_t o = (size_t)snprintf(buf, n, "[");
    for (int k = 0; k < r && o < n; k++) o += (size_t)snprintf(buf + o, n - o, "%s%lld", k ? ", " : "", (long long)d[k]);
    if (o < n) snprintf(buf + o, n - o, "]");
}

/* one action of the list as a core action on a point of shape dims (rank r) for this run */
static int add_action(const ps_api_model *M, ps_hooks *h, const ps_api_hook_entry *e, const int64_t *dims, int r,
                      ps_error *err) {
    const ps_runtime *rt = &M->rt;
    ps_hook_action a = {.head = e->head, .seq0 = e->seq0, .seq1 = e->seq1, .pos0 = e->pos0, .pos1 = e->pos1, .scale = e->scale};
    const int64_t *inner = dims + 2;
    int ni = r - 2 > 0 ? r - 2 : 0;
    int64_t inner_n = 1;
    for (int k = 0; k < ni; k++) inner_n *= inner[k];
    char want[96], got[96];
    dims_text(got, sizeof got, e->src_shape, e->src_rank);
    dims_text(want, sizeof want, inner, ni);
    float *mean = NULL;
    switch (e->kind) {
    case PS_API_ZERO: a.kind = PS_ACT_ZERO; break;
    case PS_API_SET:
    case PS_API_ADD:
        a.kind = e->kind == PS_API_SET ? PS_ACT_SET : PS_ACT_ADD;
        if (e->src_rank == ni && same_dims(e->src_shape, inner, ni)) a.every_pos = 1;
        else if (e->src_rank == ni + 1 && same_dims(e->src_shape + 1, inner, ni)) a.src_npos = e->src_shape[0];
        else {
            ps_fail(err, "hook %s: the source is %s; %s takes [positions%s%s or one position %s", e->name, got,
                    e->kind == PS_API_SET ? "set" : "add", ni ? ", " : "", want + 1, want);
            err->usage = 1;
            return -1;
        }
        break;
    case PS_API_MEAN_REPLACE:
    case PS_API_PATCH:
        if (e->src_rank != ni + 2 || !same_dims(e->src_shape + 2, inner, ni)) {
            ps_fail(err, "hook %s: the source is %s; %s takes [sequences, positions%s%s", e->name, got,
                    e->kind == PS_API_PATCH ? "patch" : "mean_replace", ni ? ", " : "", want + 1);
            err->usage = 1;
            return -1;
        }
        a.src_npos = e->src_shape[1];
        if (e->kind == PS_API_PATCH) {
            a.kind = PS_ACT_PATCH;
            a.src_nseq = e->src_shape[0];
        } else { /* the mean over the source's sequences, in double, in order */
            a.kind = PS_ACT_SET;
            int64_t S = e->src_shape[0], per = e->src_shape[1] * inner_n;
            if (!(mean = malloc((size_t)per * sizeof(float)))) return ps_fail(err, "out of memory");
            for (int64_t j = 0; j < per; j++) {
                double s = 0;
                for (int64_t b = 0; b < S; b++) s += e->src[b * per + j];
                mean[j] = (float)(s / (double)S);
            }
        }
        break;
    }
    if (e->src) {
        int64_t n = 1;
        for (int k = 0; k < e->src_rank; k++) n *= e->src_shape[k];
        if (mean) n /= e->src_shape[0];
        a.src = ps_hooks_upload(h, rt->ctx, mean ? mean : e->src, n, err);
        free(mean);
        if (!a.src) return -1;
    }
    if (rt->family->hook_add_action(rt, h, e->name, &a, err)) {
        err->usage = 1;
        return -1;
    }
    return 0;
}

int ps_api_hooks_register(const ps_api_model *M, ps_hooks *h, ps_api_hooks *list, int64_t B, int64_t T, ps_error *err) {
    const ps_runtime *rt = &M->rt;
    if (!list) return 0;
    list->fail_msg[0] = '\0';
    for (int k = 0; k < list->n; k++) {
        ps_api_hook_entry *e = &list->e[k];
        int i, l;
        if (ps_api_point_of(M, e->name, &i, &l, err)) return -1;
        int64_t dims[4];
        int r = rt->family->point_shape(rt, i, l, B, T, dims);
        if (!r) {
            ps_fail(err, "hook %s: this checkpoint does not have that point", e->name);
            err->usage = 1;
            return -1;
        }
        if (e->fn) {
            if (rt->family->hook_add(rt, h, e->name, trampoline, e, err)) {
                err->usage = 1;
                return -1;
            }
        } else if (add_action(M, h, e, dims, r, err))
            return -1;
    }
    return 0;
}

/* ---- progress: a callback on the first point of each layer (it reads nothing and changes nothing) ---- */

typedef struct {
    ps_api_progress *p;
    int layer, n_layers;
} layer_mark;

static int layer_started(const ps_hook_event *ev, void *user, ps_error *err) {
    (void)ev;
    layer_mark *k = user;
    if (ps_api_progress_call(k->layer, k->n_layers, k->p))
        return ps_fail(err, "cancelled after %d of %d layers", k->layer, k->n_layers);
    return 0;
}

/* marks[0..L) on the first concrete point of each layer that runs (M->names is in firing order) */
static int watch_layers(const ps_api_model *M, ps_hooks *h, ps_api_progress *p, layer_mark *marks, int L, ps_error *err) {
    const ps_runtime *rt = &M->rt;
    int next = 0;
    for (int k = 0; k < M->n_names && next < L; k++) {
        int i, l;
        if (ps_api_point_of(M, M->names[k], &i, &l, err)) return -1;
        if (l != next) continue;
        marks[next] = (layer_mark){.p = p, .layer = next, .n_layers = L};
        if (rt->family->hook_add(rt, h, M->names[k], layer_started, &marks[next], err)) return -1;
        next++;
    }
    return 0;
}

/* ---- the run ---- */

static int check_tokens(const ps_api_model *M, const int32_t *tokens, int64_t B, int64_t T, const int32_t *targets,
                        ps_error *err) {
    const ps_runtime *rt = &M->rt;
    int64_t V = rt->family->vocab(rt);
    err->usage = 0;
    if (!tokens) ps_fail(err, "no tokens given");
    else if (B < 1 || T < 1) ps_fail(err, "tokens [%lld, %lld]: need at least one sequence of at least one token", (long long)B, (long long)T);
    else if (T > rt->max_pos)
        ps_fail(err, "%lld tokens per sequence, more than %s %lld by %lld", (long long)T, rt->family->max_pos_name,
                (long long)rt->max_pos, (long long)(T - rt->max_pos));
    else {
        for (int64_t j = 0; j < B * T; j++)
            if (tokens[j] < 0 || tokens[j] >= V) {
                ps_fail(err, "token %d at sequence %lld, position %lld is outside the vocabulary [0, %lld)", tokens[j],
                        (long long)(j / T), (long long)(j % T), (long long)V);
                break;
            }
        for (int64_t j = 0; targets && !err->msg[0] && j < B * T; j++)
            if (targets[j] < -1 || targets[j] >= V)
                ps_fail(err, "targets[%lld][%lld] = %d: out of range [-1, %lld)", (long long)(j / T), (long long)(j % T),
                        targets[j], (long long)V);
        if (!err->msg[0]) return 0;
    }
    err->usage = 1;
    return -1;
}

/* the run's cache item becomes the output's: its array is moved, not copied (the run's cache is this
 * call's own), so the activations are held once, not twice, at the end of the run */
static int take_item(out_item *it, ps_cache_item *c, ps_error *err) {
    it->rank = c->ndim;
    for (int k = 0; k < c->ndim; k++) it->shape[k] = c->shape[k];
    if (!(it->name = strdup(c->name))) return ps_fail(err, "out of memory for the cache of %s", c->name);
    it->data = c->data;
    c->data = NULL;
    return 0;
}

/* the points whose gradients the backward hooks reach (core/backward.h) */
static const char *const GRAD_POINTS = "blocks.{L}.attn.hook_z, hook_k, hook_v, hook_ck and hook_cv";

/* The cache of the pass (and, with grads, of its gradients): the names asked for (names, n_names), or the
 * model's points that filter keeps, or all of them; each is watched on h (gh) in that order. */
static int watch_cache(ps_api_model *M, const char *const *names, int n_names, ps_api_filter_fn filter, void *filter_user,
                       int all, int grads, ps_hooks *h, ps_hooks *gh, ps_cache *cache, ps_cache *gcache, ps_error *err) {
    const ps_runtime *rt = &M->rt;
    const ps_family *f = rt->family;
    int explicit = names != NULL;
    int n_watch = explicit ? n_names : (filter || all) ? M->n_names : 0;
    for (int k = 0; k < n_watch; k++) {
        const char *nm = explicit ? names[k] : M->names[k];
        if (!nm) {
            ps_fail(err, "names[%d] is NULL", k);
            err->usage = 1;
            return -1;
        }
        if (!explicit && filter && !filter(nm, filter_user)) continue;
        if (ps_cache_get(cache, nm)) continue; /* named twice */
        int i, l;
        if (ps_api_point_of(M, nm, &i, &l, err)) return -1;
        if (!ps_api_point_runs(M, i, l)) {
            ps_fail(err, "hook \"%s\" is past the layers this model runs (0..%d)", nm, M->n_run - 1);
            err->usage = 1;
            return -1;
        }
        if (f->cache_watch(rt, cache, h, nm, err) || (grads && f->cache_watch(rt, gcache, gh, nm, err))) {
            err->usage = 1;
            return -1;
        }
    }
    return 0;
}

/* The family's logits of the pass, copied into o */
static int copy_logits(const ps_runtime *rt, void *acts, int64_t B, int64_t T, ps_api_output *o, ps_error *err) {
    const ps_family *f = rt->family;
    const float *lg = f->logits(acts, err);
    if (!lg) return -1;
    int64_t V = f->vocab(rt), nl = B * T * V;
    if (!(o->logits = malloc((size_t)nl * sizeof(float))))
        return ps_fail(err, "out of memory for the logits [%lld, %lld, %lld]", (long long)B, (long long)T, (long long)V);
    memcpy(o->logits, lg, (size_t)nl * sizeof(float));
    o->logits_shape[0] = B, o->logits_shape[1] = T, o->logits_shape[2] = V;
    return 0;
}

/* The mean cross-entropy over the targets (NULL: the next tokens), back through the backward hooks gh
 * (the controlled model's backward: run refuses other families first): o's loss and target count; with
 * explicit names, each cached point must have been reached. */
static int backward_pass(const ps_runtime *rt, void *acts, const int32_t *tokens, const int32_t *targets, int64_t B, int64_t T,
                         ps_hooks *gh, const ps_cache *cache, const ps_cache *gcache, int explicit, ps_api_output *o, ps_error *err) {
    const ps_model *m = ps_runtime_controlled(rt);
    int32_t *tg = NULL;
    float *pgrads = NULL;
    ps_acts g;
    int have_g = 0, rc = -1;
    if (!targets) {
        if (!(tg = malloc((size_t)(B * T) * sizeof *tg))) {
            ps_fail(err, "out of memory");
            goto done;
        }
        for (int64_t b = 0; b < B; b++)
            for (int64_t t = 0; t < T; t++) tg[b * T + t] = t + 1 < T ? tokens[b * T + t + 1] : -1;
        targets = tg;
    }
    int64_t total = 0;
    for (int64_t j = 0; j < B * T; j++) total += targets[j] >= 0;
    if (!total) {
        ps_fail(err, "gradients: no target positions (T = 1 without targets, or every target -1)");
        err->usage = 1;
        goto done;
    }
    if (ps_acts_create(&g, rt->ctx, &m->cfg, B, T, false, err)) goto done;
    have_g = 1;
    if (!(pgrads = calloc((size_t)m->n_params, sizeof(float)))) {
        ps_fail(err, "out of memory for the parameter gradients");
        goto done;
    }
    double loss_sum = 0;
    int64_t n_t = 0;
    ps_backward_opts bo = {.grad_hooks = gh, .no_weight_grads = 1, .stop_layer = 0};
    if (ps_backward_ex(m, (const ps_acts *)acts, &g, tokens, targets, 1.0f / (float)total, pgrads, &loss_sum, &n_t, &bo, err))
        goto done;
    o->loss = loss_sum / (double)n_t;
    o->n_targets = n_t;
    if (explicit)
        for (int k = 0; k < cache->n; k++) {
            const ps_cache_item *gi = ps_cache_get(gcache, cache->items[k]->name);
            if (!gi || !gi->data) {
                ps_fail(err, "gradients: the backward does not reach %s (it reaches %s)", cache->items[k]->name, GRAD_POINTS);
                err->usage = 1;
                goto done;
            }
        }
    rc = 0;
done:
    free(pgrads);
    free(tg);
    if (have_g) ps_acts_free(&g);
    return rc;
}

/* The cached activations (and gradients) move into o's items, in the cache's order */
static int take_items(ps_cache *cache, ps_cache *gcache, int grads, ps_api_output *o, ps_error *err) {
    if (cache->n && !(o->items = calloc((size_t)cache->n, sizeof *o->items))) return ps_fail(err, "out of memory");
    for (int k = 0; k < cache->n; k++) {
        o->n++;
        if (!cache->items[k]->data) return ps_fail(err, "hook %s did not fire in the pass", cache->items[k]->name);
        ps_cache_item *gi = grads ? (ps_cache_item *)ps_cache_get(gcache, cache->items[k]->name) : NULL;
        if (gi && gi->data) { /* NULL: the backward did not reach it */
            o->items[k].grad = gi->data;
            gi->data = NULL;
        }
        if (take_item(&o->items[k], cache->items[k], err)) return -1;
    }
    return 0;
}

static int run(ps_api_model *M, const int32_t *tokens, int64_t B, int64_t T, const char *const *names, int n_names,
               ps_api_filter_fn filter, void *filter_user, int all, ps_api_hooks *list, int grads, const int32_t *targets,
               ps_api_output **out, ps_error *err) {
    const ps_runtime *rt = &M->rt;
    const ps_family *f = rt->family;
    ps_hooks h, gh;
    ps_cache cache, gcache;
    ps_hooks_init(&h);
    ps_hooks_init(&gh);
    ps_cache_init(&cache);
    ps_cache_init(&gcache);
    void *acts = NULL;
    int rc = -1;
    ps_api_progress pr = {.fn = M->progress, .user = M->progress_user};
    int L = M->n_run >= 0 ? M->n_run : (int)rt->n_layers;
    layer_mark *marks = NULL;
    ps_api_output *o = calloc(1, sizeof *o);
    if (!o) {
        ps_fail(err, "out of memory");
        goto done;
    }
    if (check_tokens(M, tokens, B, T, targets, err) || ps_api_hooks_register(M, &h, list, B, T, err)) goto done;
    if (grads && M->n_run >= 0) {
        ps_fail(err, "gradients: the model stops after layer %d (no logits, no loss)", M->n_run - 1);
        err->usage = 1;
        goto done;
    }
    if (grads && !ps_runtime_controlled(rt)) {
        ps_fail(err, "gradients at hook points: the %s family has no backward hooks (the phasescope family has them)", f->name);
        err->usage = 1;
        goto done;
    }
    /* the cache: after the hook list, so that each copy is what later layers saw */
    if (watch_cache(M, names, n_names, filter, filter_user, all, grads, &h, &gh, &cache, &gcache, err)) goto done;
    if (pr.fn) { /* last, after the list and the cache */
        if (!(marks = calloc((size_t)(L > 0 ? L : 1), sizeof *marks))) {
            ps_fail(err, "out of memory");
            goto done;
        }
        if (watch_layers(M, &h, &pr, marks, L, err)) goto done;
    }
    if (!(acts = f->acts_create(rt, B, T, grads, err))) goto done;
    if (f->forward(rt, acts, tokens, &h, M->n_run, err)) goto done;
    if (pr.fn && ps_api_progress_call(L, L, &pr)) {
        ps_fail(err, "cancelled after %d of %d layers", L, L);
        goto done;
    }
    if (M->n_run < 0 && copy_logits(rt, acts, B, T, o, err)) goto done;
    if (grads && backward_pass(rt, acts, tokens, targets, B, T, &gh, &cache, &gcache, names != NULL, o, err)) goto done;
    if (take_items(&cache, &gcache, grads, o, err)) goto done;
    rc = 0;
done:
    if (rc) { /* the model stays usable: a failed op's state is cleared */
        ps_error dummy = {0};
        ps_ctx_check(rt->ctx, &dummy);
    }
    free(marks);
    if (acts) f->acts_free(acts);
    ps_cache_free(&cache);
    ps_cache_free(&gcache);
    ps_hooks_free(&h);
    ps_hooks_free(&gh);
    if (rc) ps_api_output_free(o);
    else *out = o;
    if (rc && pr.stopped) return -2; /* cancelled */
    return rc;
}

/* run's status as the API's: PS_API_ECANCELLED when the progress callback stopped it */
static int status(int rc, const ps_error *e, char *err, size_t errlen) {
    if (!rc) return PS_API_OK;
    int code = ps_api_report(e, err, errlen);
    return rc == -2 ? PS_API_ECANCELLED : code;
}

PS_API int ps_api_run_with_hooks(ps_api_model *m, const int32_t *tokens, int64_t B, int64_t T, ps_api_hooks *hooks,
                                 ps_api_output **out, char *err, size_t errlen) {
    if (!m || !out) return ps_api_say(err, errlen, PS_API_EINPUT, "ps_api_run_with_hooks: no model or no out");
    *out = NULL;
    ps_error e = {0};
    return status(run(m, tokens, B, T, NULL, 0, NULL, NULL, 0, hooks, 0, NULL, out, &e), &e, err, errlen);
}

PS_API int ps_api_run_with_cache(ps_api_model *m, const int32_t *tokens, int64_t B, int64_t T, const char *const *names,
                                 int n_names, ps_api_filter_fn filter, void *filter_user, ps_api_hooks *hooks, int grads,
                                 const int32_t *targets, ps_api_output **out, char *err, size_t errlen) {
    if (!m || !out) return ps_api_say(err, errlen, PS_API_EINPUT, "ps_api_run_with_cache: no model or no out");
    *out = NULL;
    if (names && n_names < 0) return ps_api_say(err, errlen, PS_API_EINPUT, "n_names %d: negative", n_names);
    ps_error e = {0};
    return status(run(m, tokens, B, T, names, n_names, filter, filter_user, !names && !filter, hooks, grads, targets, out, &e),
                  &e, err, errlen);
}
