/* patching.c — run_with_cache and activation patching as a spec over the grid engine (patching.h). */
#include "interventions/patching.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/forward.h"
#include "interventions/grid.h"

int ps_run_with_cache(const ps_model *m, const int32_t *tokens, int64_t B, int64_t T, const char *const *names, int n,
                      ps_cache *cache, ps_error *err) {
    if (n < 0 || (n > 0 && !names)) return ps_fail(err, "run_with_cache: %d hook names", n);
    ps_acts a;
    if (ps_acts_create(&a, m->ctx, &m->cfg, B, T, false, err)) return -1;
    ps_hooks h;
    ps_hooks_init(&h);
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) rc = ps_cache_watch(cache, &h, &m->cfg, names[i], err);
    if (!rc) rc = ps_forward(m, &a, tokens, &h, err);
    ps_hooks_free(&h);
    ps_acts_free(&a);
    return rc;
}

double ps_patch_default_budget(void) { return ps_grid_default_budget(); }

void ps_patch_result_free(ps_patch_result *r) {
    free(r->layers);
    free(r->heads);
    free(r->cells);
    memset(r, 0, sizeof *r);
}

/* log-softmax of row x[V] at token y, in double (as ps_score_queries) */
static double log_prob(const float *x, int64_t V, int32_t y) {
    float mx = x[0];
    for (int64_t i = 1; i < V; i++)
        if (x[i] > mx) mx = x[i];
    double sum = 0;
    for (int64_t i = 0; i < V; i++) sum += exp((double)(x[i] - mx));
    return (double)(x[y] - mx) - log(sum);
}

/* The metric's value for query qi of prompt b (clean's queries and answers), from that prompt's logits
 * lg [T, V]. */
static double query_value(ps_patch_metric metric, const ps_batch *clean, const ps_batch *corrupted, int64_t b, int64_t qi,
                          const float *lg, int64_t V) {
    int64_t T = clean->T;
    const ps_query *q = &clean->queries[b * clean->max_q + qi];
    if (metric == PS_PATCH_LOGIT_DIFF) {
        const float *x = lg + q->answer_pos * V;
        const ps_query *cq = &corrupted->queries[b * corrupted->max_q + qi]; /* a prompt set: its own answer */
        int32_t alt = q->answer_src < 0 ? ps_query_answer(cq, corrupted->tokens + b * T, 0) : corrupted->tokens[b * T + q->answer_src];
        return (double)x[ps_query_answer(q, clean->tokens + b * T, 0)] - (double)x[alt];
    }
    double nll = 0;
    for (int64_t k = 0; k < q->answer_len; k++) nll -= log_prob(lg + (q->answer_pos + k) * V, V, ps_query_answer(q, clean->tokens + b * T, k));
    return nll;
}

double ps_patch_metric_value(ps_patch_metric metric, const ps_batch *clean, const ps_batch *corrupted,
                             const float *logits, int64_t V) {
    double acc = 0;
    int64_t nq = 0, T = clean->T;
    for (int64_t b = 0; b < clean->B; b++)
        for (int64_t qi = 0; qi < clean->n_q[b]; qi++, nq++) acc += query_value(metric, clean, corrupted, b, qi, logits + b * T * V, V);
    return nq ? acc / (double)nq : 0.0;
}

/* ---- the spec: the source run's activation at every patched point of every selected layer, cells
 * PS_ACT_PATCH actions from it ---- */

/* one patched point of one selected layer: the source run's activation [N, npos, <inner>] collected on the
 * host (seen sequences so far), then on the model's context */
typedef struct {
    struct patch_spec *P;
    char name[96];
    int64_t npos, per_seq, seen;
    float *host, *src;
} patch_slot;

typedef struct patch_spec {
    int points[PS_KO_MAX_ARRAYS], n_points;
    const int *heads;
    int64_t n_pos;
    int per_position;
    void (*score)(void *user, const ps_grid_shift *sh, const ps_shifted *set, int64_t prompt0, const float *logits, int64_t V,
                  int *ok, double *lp);
    void *score_user;
    int64_t N;
    int n_layers;
    patch_slot *slot; /* [n_layers · n_points], layer index major */
} patch_spec;

static void slots_free(patch_spec *P, const ps_runtime *rt) {
    for (int i = 0; P->slot && i < P->n_layers * P->n_points; i++) {
        patch_slot *x = &P->slot[i];
        if (x->src) ps_buf_free(rt->ctx, x->src, P->N * x->per_seq * (int64_t)sizeof(float));
        free(x->host);
        x->src = x->host = NULL;
        x->per_seq = x->npos = x->seen = 0;
    }
}

/* The reference pass (the source prompts, in order, batch by batch): a copy of each batch's activation. */
static int patch_collect(const ps_hook_event *ev, void *user, ps_error *err) {
    patch_slot *x = user;
    int64_t B = ev->shape[0];
    if (x->seen + B > x->P->N)
        return ps_fail(err, "activation patching: %s fired for more than the %lld source prompts", ev->name, (long long)x->P->N);
    memcpy(x->host + x->seen * x->per_seq, ev->data, (size_t)(B * x->per_seq) * sizeof(float));
    x->seen += B;
    return 0;
}

static int patch_sources(void *self, const ps_runtime *rt, const ps_grid_shift *sh, ps_hooks *ref, ps_error *err) {
    patch_spec *P = self;
    if (!P->slot) {
        P->slot = calloc((size_t)sh->n_layers * (size_t)P->n_points, sizeof *P->slot);
        if (!P->slot) return ps_fail(err, "out of memory");
        P->n_layers = sh->n_layers;
    }
    slots_free(P, rt);
    P->N = sh->N;
    for (int li = 0; li < sh->n_layers; li++)
        for (int a = 0; a < P->n_points; a++) {
            patch_slot *x = &P->slot[li * P->n_points + a];
            int i = ps_runtime_point_index(rt, P->points[a]);
            int64_t d[4];
            int r = i < 0 ? 0 : rt->family->point_shape(rt, i, sh->layers[li], 1, sh->T, d);
            x->P = P;
            if (r < 2 || d[1] < 1) continue; /* nothing at this length (compressed entries of fewer tokens than a window) */
            ps_runtime_point_name(rt, i, sh->layers[li], x->name, sizeof x->name);
            x->npos = d[1];
            x->per_seq = 1;
            for (int k = 1; k < r; k++) x->per_seq *= d[k];
            if (!(x->host = malloc((size_t)(sh->N * x->per_seq) * sizeof(float))))
                return ps_fail(err, "out of memory for the source activation %s (%lld floats)", x->name, (long long)(sh->N * x->per_seq));
            if (rt->family->hook_add(rt, ref, x->name, patch_collect, x, err)) return -1;
        }
    return 0;
}

static int patch_sources_done(void *self, const ps_runtime *rt, const ps_grid_shift *sh, ps_error *err) {
    patch_spec *P = self;
    for (int i = 0; i < P->n_layers * P->n_points; i++) {
        patch_slot *x = &P->slot[i];
        if (!x->host) continue;
        int64_t bytes = P->N * x->per_seq * (int64_t)sizeof(float);
        if (x->seen != P->N)
            return ps_fail(err, "activation patching: the source run gave %lld of %lld prompts at %s", (long long)x->seen,
                           (long long)P->N, x->name);
        if (!(x->src = ps_buf_alloc(rt->ctx, bytes, "a layer's source activation", err))) return -1;
        if (ps_buf_from_host(rt->ctx, x->src, x->host, bytes, err)) return -1;
        free(x->host);
        x->host = NULL;
    }
    (void)sh;
    return 0;
}

static void patch_shift_end(void *self, const ps_runtime *rt) { slots_free(self, rt); }

/* Cell ci = head index ci / n_pos, position ci % n_pos: the source activation of the prompts the sequences
 * hold, patched into them at that head (and position), at every patched point of the layer. */
static int patch_cell(void *self, const ps_runtime *rt, const ps_grid_shift *sh, int li, int ci, int64_t seq0, int64_t seq1,
                      int64_t prompt0, ps_hooks *h, ps_error *err) {
    (void)sh;
    patch_spec *P = self;
    int64_t hi = ci / P->n_pos, t = ci % P->n_pos;
    for (int a = 0; a < P->n_points; a++) {
        const patch_slot *x = &P->slot[li * P->n_points + a];
        if (!x->src) continue;
        ps_hook_action act = {.kind = PS_ACT_PATCH, .head = P->heads[hi], .seq0 = seq0, .seq1 = seq1,
                              .pos0 = P->per_position ? t : 0, .pos1 = P->per_position ? t + 1 : 0, .src = x->src,
                              .src_npos = x->npos, .src_nseq = P->N, .src_seq0 = prompt0};
        if (rt->family->hook_add_action(rt, h, x->name, &act, err)) return -1;
    }
    return 0;
}

static void patch_score(void *self, const ps_grid_shift *sh, const ps_shifted *set, int64_t prompt0, const float *logits,
                        int64_t V, int *ok, double *lp) {
    patch_spec *P = self;
    P->score(P->score_user, sh, set, prompt0, logits, V, ok, lp);
}

int ps_patch_spec(const ps_runtime *rt, const ps_patch_spec_opts *o, ps_grid_spec *spec, ps_error *err) {
    (void)rt; /* the points are resolved against the runtime as the grid runs */
    if (o->n_points < 1 || o->n_points > PS_KO_MAX_ARRAYS)
        return ps_fail(err, "activation patching: %d points per cell (1 to %d)", o->n_points, PS_KO_MAX_ARRAYS);
    if (o->n_heads < 1 || !o->heads) return ps_fail(err, "activation patching: no heads");
    if (o->per_position && (o->n_points != 1 || o->n_pos < 1))
        return ps_fail(err, "activation patching: per position needs one point and its positions");
    patch_spec *P = calloc(1, sizeof *P);
    if (!P) return ps_fail(err, "out of memory");
    memcpy(P->points, o->points, (size_t)o->n_points * sizeof(int));
    P->n_points = o->n_points;
    P->heads = o->heads;
    P->per_position = o->per_position;
    P->n_pos = o->per_position ? o->n_pos : 1;
    P->score = o->score;
    P->score_user = o->score_user;
    *spec = (ps_grid_spec){.self = P, .restart = o->restart, .sources = patch_sources, .sources_done = patch_sources_done,
                           .cell = patch_cell, .shift_end = patch_shift_end, .score = o->score ? patch_score : NULL};
    return 0;
}

int ps_patch_target_spec(const ps_runtime *rt, int target, const int *heads, int n_heads, ps_grid_spec *spec, ps_error *err) {
    const ps_family *f = rt->family;
    if (!f->ko.targets || !f->ko.arrays) return ps_fail(err, "activation patching: the %s family has no targets", f->name);
    ps_ko_array arr[PS_KO_MAX_ARRAYS];
    int restart = PS_KO_RESTART_NONE, n = f->ko.arrays(rt, target, arr, &restart), pts[PS_KO_MAX_ARRAYS], np = 0;
    if (n < 1 || n > PS_KO_MAX_ARRAYS)
        return ps_fail(err, "activation patching: target %s of the %s family has %d arrays", f->ko.targets[target], f->name, n);
    for (int a = 0; a < n; a++) { /* the points its cells set, each once */
        int dup = 0;
        for (int b = 0; b < np; b++) dup |= pts[b] == arr[a].set_point;
        if (!dup) pts[np++] = arr[a].set_point;
    }
    static const int WHOLE[1] = {-1};
    int per_head = f->ko.heads(rt, target) > 0;
    ps_patch_spec_opts o = {.points = pts, .n_points = np, .heads = per_head ? heads : WHOLE, .n_heads = per_head ? n_heads : 1,
                            .restart = restart == PS_KO_RESTART_ATTENTION ? PS_GRID_RESTART_ATTENTION : PS_GRID_RESTART_NONE};
    return ps_patch_spec(rt, &o, spec, err);
}

void ps_patch_spec_free(const ps_runtime *rt, ps_grid_spec *spec) {
    patch_spec *P = spec->self;
    if (P) {
        slots_free(P, rt);
        free(P->slot);
    }
    free(P);
    spec->self = NULL;
}

/* ps_activation_patching's metric per query (the engine's mean over queries is the metric); no accuracy. */
typedef struct {
    ps_patch_metric metric;
    const ps_batch *clean, *corrupted;
} metric_scorer;

static void metric_score(void *user, const ps_grid_shift *sh, const ps_shifted *set, int64_t prompt0, const float *logits,
                         int64_t V, int *ok, double *lp) {
    (void)sh;
    metric_scorer *M = user;
    int64_t T = set->b.T, maxq = set->b.max_q;
    for (int64_t b = 0; b < set->b.B; b++)
        for (int64_t qi = 0; qi < set->b.n_q[b]; qi++) {
            ok[b * maxq + qi] = 0;
            lp[b * maxq + qi] = query_value(M->metric, M->clean, M->corrupted, prompt0 + b, qi, logits + b * T * V, V);
        }
}

/* the engine's progress (cells done of 1 + n_layers · n_cells per shift) as patching cells */
typedef struct {
    ps_progress_fn fn;
    void *user;
    int64_t n_cells;
} patch_progress;

static int patch_progress_fn(int64_t done, int64_t total, void *user) {
    patch_progress *p = user;
    return p->fn(done >= total ? p->n_cells : done * p->n_cells / total, p->n_cells, p->user);
}

static double mean_of(const ps_residue_stats *r) { return r->n[0] ? r->lp[0] / (double)r->n[0] : 0.0; }

int ps_activation_patching(const ps_model *m, const ps_batch *clean, const ps_batch *corrupted,
                           const ps_patch_opts *opts, ps_patch_result *out, ps_progress_fn progress, void *user,
                           ps_error *err) {
    memset(out, 0, sizeof *out);
    const ps_config *c = &m->cfg;
    int64_t N = clean->B, T = clean->T;
    if (!opts || !opts->point) return ps_fail(err, "activation patching: no hook point given (e.g. \"attn.hook_z\")");
    if (corrupted->B != N || corrupted->T != T)
        return ps_fail(err, "activation patching: the clean batch is %lldx%lld tokens, the corrupted one %lldx%lld; they must match",
                       (long long)N, (long long)T, (long long)corrupted->B, (long long)corrupted->T);
    int64_t nq = 0;
    for (int64_t b = 0; b < N; b++) nq += clean->n_q[b];
    if (nq == 0) return ps_fail(err, "activation patching: the clean batch has no queries to measure");
    if (opts->metric != PS_PATCH_LOGIT_DIFF && opts->metric != PS_PATCH_ANSWER_NLL)
        return ps_fail(err, "activation patching: unknown metric %d", (int)opts->metric);
    /* the point, by its suffix (parsed on layer 0, so the error lists the valid names) */
    char name[96];
    snprintf(name, sizeof name, "blocks.0.%s", opts->point);
    int l0;
    ps_hook_point pt;
    if (ps_hook_parse(c, name, &l0, &pt, err)) return -1;
    if (pt == PS_HOOK_PATTERN)
        return ps_fail(err, "activation patching: attn.hook_pattern is not supported (patch attn.hook_z or the keys and values)");
    int64_t shape[4];
    int ndim = ps_hook_shape(c, pt, N, T, shape);
    int64_t point_heads = ndim == 4 ? shape[2] : 0, npos = shape[1], inner = 1;
    for (int i = 2; i < ndim; i++) inner *= shape[i];
    /* layers and heads */
    int nl = opts->layers && opts->n_layers > 0 ? opts->n_layers : (int)c->n_layers;
    int nh = point_heads == 0 ? 1 : opts->heads && opts->n_heads > 0 ? opts->n_heads : (int)point_heads;
    out->n_layers = nl;
    out->n_heads = nh;
    out->n_pos = opts->per_position ? npos : 1;
    out->layers = malloc((size_t)nl * sizeof(int));
    out->heads = malloc((size_t)nh * sizeof(int));
    int64_t n_cells = (int64_t)nl * nh * out->n_pos;
    out->cells = calloc((size_t)(n_cells ? n_cells : 1), sizeof(double));
    if (!out->layers || !out->heads || !out->cells)
        return ps_fail(err, "out of memory for %lld patching cells", (long long)n_cells);
    for (int i = 0; i < nl; i++) {
        int l = opts->layers && opts->n_layers > 0 ? opts->layers[i] : i;
        if (l < 0 || l >= c->n_layers)
            return ps_fail(err, "activation patching: layer %d out of range (the model has %lld layers)", l, (long long)c->n_layers);
        out->layers[i] = l;
    }
    for (int i = 0; i < nh; i++) {
        int h = point_heads == 0 ? -1 : opts->heads && opts->n_heads > 0 ? opts->heads[i] : i;
        if (point_heads && (h < 0 || h >= point_heads))
            return ps_fail(err, "activation patching: head %d out of range (%s has %lld heads)", h, opts->point, (long long)point_heads);
        out->heads[i] = h;
    }
    if (n_cells == 0) return 0; /* e.g. per position on a point with no windows */
    int64_t per_layer = (int64_t)nh * out->n_pos;
    if (per_layer > 1 << 30) return ps_fail(err, "activation patching: %lld cells per layer are too many", (long long)per_layer);

    /* the grid: the corrupted prompts (the clean batch's queries) as one prompt set of one residue,
     * the clean tokens as the reference pass */
    ps_shifted run = {.b = *clean, .p = 0, .P = 1};
    run.b.tokens = corrupted->tokens;
    run.b.targets = corrupted->targets;
    run.residue = malloc((size_t)(N * clean->max_q) * sizeof(int64_t));
    int *cell_ids = malloc((size_t)per_layer * sizeof(int));
    int rc = 0;
    if (!run.residue || !cell_ids) rc = ps_fail(err, "out of memory for the patching of %d layers x %lld cells", nl, (long long)per_layer);
    for (int64_t i = 0; !rc && i < N * clean->max_q; i++) run.residue[i] = i % clean->max_q < clean->n_q[i / clean->max_q] ? 0 : -1;
    for (int64_t i = 0; !rc && i < per_layer; i++) cell_ids[i] = (int)i;
    metric_scorer ms = {.metric = opts->metric, .clean = clean, .corrupted = corrupted};
    int point = (int)pt;
    ps_patch_spec_opts so = {.points = &point, .n_points = 1, .heads = out->heads, .n_heads = nh, .per_position = opts->per_position,
                             .n_pos = out->n_pos, .restart = PS_GRID_RESTART_LAYER, .score = metric_score, .score_user = &ms};
    ps_grid_spec spec = {0};
    ps_runtime rt;
    ps_runtime_model(&rt, m);
    if (!rc) rc = ps_patch_spec(&rt, &so, &spec, err);
    patch_progress pp = {.fn = progress, .user = user, .n_cells = n_cells};
    ps_grid g = {.rt = &rt, .prompts = &run, .ref_tokens = clean->tokens, .P = 1, .batch = N, .layers = out->layers,
                 .n_layers = nl, .cells = cell_ids, .n_cells = (int)per_layer, .spec = &spec, .naive = opts->naive,
                 .max_cells = opts->max_cells, .mem_bytes = opts->mem_bytes, .progress = progress ? patch_progress_fn : NULL,
                 .progress_user = &pp};
    ps_grid_result r;
    memset(&r, 0, sizeof r);
    if (!rc) rc = ps_grid_run(&g, &r, err);
    if (!rc) {
        out->clean = mean_of(&r.ref);
        out->corrupted = mean_of(&r.clean);
        out->cells_per_forward = r.cells_per_forward > 0 ? r.cells_per_forward : 1;
        for (int i = 0; i < nl; i++) { /* the engine's layers run top-down; the result keeps the caller's order */
            int li = 0;
            while (r.layers[li] != out->layers[i]) li++;
            for (int64_t k = 0; k < per_layer; k++) out->cells[(int64_t)i * per_layer + k] = mean_of(&r.cells[(int64_t)li * per_layer + k]);
        }
    }
    ps_grid_result_free(&r);
    ps_patch_spec_free(&rt, &spec);
    free(run.residue);
    free(cell_ids);
    return rc;
}
