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

/* ---- the spec: sources the clean run's activation at the point of every selected layer, cells
 * PS_ACT_PATCH actions from it on the corrupted prompts, scoring the metric per query ---- */

typedef struct patch_spec patch_spec;

typedef struct {
    patch_spec *P;
    int li;           /* the engine's layer index (top-down) */
} patch_layer;

struct patch_spec {
    ps_hook_point pt;
    const ps_batch *clean, *corrupted;
    ps_patch_metric metric;
    const int *heads;       /* [nh] the result's heads (-1: the point has none) */
    int nl;
    int64_t n_pos;          /* cells per head: the point's positions with per_position, else 1 */
    int per_position;
    int64_t N, npos, per_seq; /* prompts; the point's positions and floats of one sequence */
    float **host;           /* [nl] the clean activation [N, npos, inner], collected batch by batch */
    int64_t *seen;          /* [nl] sequences collected */
    float **src;            /* [nl] the same on the model's context: the patch actions' sources */
    patch_layer *pl;        /* [nl] the collecting hooks' user data */
};

/* The reference pass (the clean prompts, in order, batch by batch): a copy of each batch's activation. */
static int patch_collect(const ps_hook_event *ev, void *user, ps_error *err) {
    patch_layer *x = user;
    patch_spec *P = x->P;
    int64_t B = ev->shape[0];
    if (P->seen[x->li] + B > P->N)
        return ps_fail(err, "activation patching: %s fired for more than the %lld clean prompts", ev->name, (long long)P->N);
    memcpy(P->host[x->li] + P->seen[x->li] * P->per_seq, ev->data, (size_t)(B * P->per_seq) * sizeof(float));
    P->seen[x->li] += B;
    return 0;
}

static int patch_sources(void *self, const ps_runtime *rt, const ps_grid_shift *sh, ps_hooks *ref, ps_error *err) {
    patch_spec *P = self;
    for (int li = 0; li < sh->n_layers; li++) {
        char name[96];
        ps_hook_name(name, sizeof name, sh->layers[li], P->pt);
        P->seen[li] = 0;
        P->pl[li] = (patch_layer){.P = P, .li = li};
        if (ps_hooks_add(ref, &ps_runtime_controlled(rt)->cfg, name, patch_collect, &P->pl[li], err)) return -1;
    }
    return 0;
}

static int patch_sources_done(void *self, const ps_runtime *rt, const ps_grid_shift *sh, ps_error *err) {
    patch_spec *P = self;
    int64_t bytes = P->N * P->per_seq * (int64_t)sizeof(float);
    for (int li = 0; li < sh->n_layers; li++) {
        if (P->seen[li] != P->N)
            return ps_fail(err, "activation patching: the clean run gave %lld of %lld prompts at layer %d", (long long)P->seen[li],
                           (long long)P->N, sh->layers[li]);
        if (!(P->src[li] = ps_buf_alloc(rt->ctx, bytes, "a layer's clean activation", err))) return -1;
        if (ps_buf_from_host(rt->ctx, P->src[li], P->host[li], bytes, err)) return -1;
    }
    return 0;
}

static void patch_shift_end(void *self, const ps_runtime *rt) {
    patch_spec *P = self;
    for (int li = 0; li < P->nl; li++) {
        if (P->src[li]) ps_buf_free(rt->ctx, P->src[li], P->N * P->per_seq * (int64_t)sizeof(float));
        P->src[li] = NULL;
    }
}

/* Cell ci = head index ci / n_pos, position ci % n_pos: the clean activation of the prompts the
 * sequences hold, patched into them at that head (and position). */
static int patch_cell(void *self, const ps_runtime *rt, const ps_grid_shift *sh, int li, int ci, int64_t seq0, int64_t seq1,
                      int64_t prompt0, ps_hooks *h, ps_error *err) {
    patch_spec *P = self;
    int64_t hi = ci / P->n_pos, t = ci % P->n_pos;
    char name[96];
    ps_hook_name(name, sizeof name, sh->layers[li], P->pt);
    ps_hook_action act = {.kind = PS_ACT_PATCH, .head = P->heads[hi], .seq0 = seq0, .seq1 = seq1,
                          .pos0 = P->per_position ? t : 0, .pos1 = P->per_position ? t + 1 : 0, .src = P->src[li],
                          .src_npos = P->npos, .src_nseq = P->N, .src_seq0 = prompt0};
    return rt->family->hook_add_action(rt, h, name, &act, err);
}

/* Per query its metric value (the engine's mean over queries is the metric); no accuracy. */
static void patch_score(void *self, const ps_grid_shift *sh, const ps_shifted *set, int64_t prompt0, const float *logits,
                        int64_t V, int *ok, double *lp) {
    (void)sh;
    patch_spec *P = self;
    int64_t T = set->b.T, maxq = set->b.max_q;
    for (int64_t b = 0; b < set->b.B; b++)
        for (int64_t qi = 0; qi < set->b.n_q[b]; qi++) {
            ok[b * maxq + qi] = 0;
            lp[b * maxq + qi] = query_value(P->metric, P->clean, P->corrupted, prompt0 + b, qi, logits + b * T * V, V);
        }
}

static void patch_spec_free(patch_spec *P) {
    for (int li = 0; P->host && li < P->nl; li++) free(P->host[li]);
    free(P->host);
    free(P->seen);
    free(P->src);
    free(P->pl);
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
    patch_spec P = {.pt = pt, .clean = clean, .corrupted = corrupted, .metric = opts->metric, .heads = out->heads,
                    .nl = nl, .n_pos = out->n_pos, .per_position = opts->per_position, .N = N, .npos = npos,
                    .per_seq = npos * inner};
    ps_shifted run = {.b = *clean, .p = 0, .P = 1};
    run.b.tokens = corrupted->tokens;
    run.b.targets = corrupted->targets;
    run.residue = malloc((size_t)(N * clean->max_q) * sizeof(int64_t));
    int *cell_ids = malloc((size_t)per_layer * sizeof(int));
    P.host = calloc((size_t)nl, sizeof(float *));
    P.seen = calloc((size_t)nl, sizeof(int64_t));
    P.src = calloc((size_t)nl, sizeof(float *));
    P.pl = calloc((size_t)nl, sizeof(patch_layer));
    int rc = 0;
    if (!run.residue || !cell_ids || !P.host || !P.seen || !P.src || !P.pl)
        rc = ps_fail(err, "out of memory for the patching of %d layers x %lld cells", nl, (long long)per_layer);
    for (int li = 0; li < nl && !rc; li++)
        if (!(P.host[li] = malloc((size_t)(N * P.per_seq > 0 ? N * P.per_seq : 1) * sizeof(float))))
            rc = ps_fail(err, "out of memory for a layer's clean activation (%lld floats)", (long long)(N * P.per_seq));
    for (int64_t i = 0; !rc && i < N * clean->max_q; i++) run.residue[i] = i % clean->max_q < clean->n_q[i / clean->max_q] ? 0 : -1;
    for (int64_t i = 0; !rc && i < per_layer; i++) cell_ids[i] = (int)i;
    ps_grid_spec spec = {.self = &P, .restart = PS_GRID_RESTART_LAYER, .sources = patch_sources, .sources_done = patch_sources_done,
                         .cell = patch_cell, .shift_end = patch_shift_end, .score = patch_score};
    ps_runtime rt;
    ps_runtime_model(&rt, m);
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
    patch_spec_free(&P);
    free(run.residue);
    free(cell_ids);
    return rc;
}
