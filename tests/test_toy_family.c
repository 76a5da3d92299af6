/* test_toy_family.c — the "add a model family" recipe (docs/design.md) proven on a third family defined
 * here: a bigram-table model (next-token logits = a row of a [V, V] table, one hook point per layer:
 * blocks.{L}.hook_row, the rows [B, T, V] that are the logits). It is opened through core's family table
 * (ps_runtime_open_family), given the instruments' table (ps_runtime_ops: its evaluation and one
 * knockout target, mean replacement of the rows), and run through the shipped code paths: the sweep's
 * work units (ps_sweep_units) and a knockout (ps_knockout_run, the grid engine's naive path). Both are
 * checked against the same numbers computed by plain loops over the table. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/ops.h"
#include "core/runtime.h"
#include "interventions/knockout.h"
#include "interventions/units.h"

/* ---- the family: a bigram table ---- */

enum { TOY_V = 24, TOY_MAX_POS = 64 };

typedef struct {
    ps_ctx *ctx;
    float w[TOY_V * TOY_V]; /* [V, V]: row a holds the logits of the token after a */
} toy_model;

typedef struct {
    ps_ctx *ctx;
    int64_t B, T;
    float *row; /* [B, T, V], a buffer of the context: the logits */
} toy_acts;

static float toy_weight(int64_t a, int64_t b) { return (float)((a * 7 + b * 13) % 17 - 8) * 0.25f; }

static void toy_point_name(char *buf, size_t n, int slot, int point) {
    (void)point;
    snprintf(buf, n, "blocks.%d.hook_row", slot);
}
static const ps_hook_family TOY_HOOKS = {"toy_bigram", toy_point_name};
static const ps_point_info TOY_POINTS[] = {
    {"blocks.{L}.hook_row", "[B, T, V]", -1, "every layer", 0, "the table row of each token: its next-token logits"}};

static int toy_open(ps_runtime *rt, void *model, const char *dir, const ps_runtime_opts *o, ps_error *err) {
    (void)dir;
    toy_model *m = model;
    for (int64_t a = 0; a < TOY_V; a++)
        for (int64_t b = 0; b < TOY_V; b++) m->w[a * TOY_V + b] = toy_weight(a, b);
    if (ps_ctx_create(&m->ctx, o && o->backend ? o->backend : "cpu", err)) return -1;
    rt->ctx = m->ctx, rt->max_pos = TOY_MAX_POS, rt->n_layers = 1;
    snprintf(rt->config_hash, sizeof rt->config_hash, "00000000b16a3a00");
    return 0;
}
static void toy_free(void *model) { ps_ctx_free(((toy_model *)model)->ctx); }

static void *toy_acts_create(const ps_runtime *rt, int64_t B, int64_t T, int keep_all, ps_error *err) {
    (void)keep_all;
    toy_acts *a = calloc(1, sizeof *a);
    if (!a) return ps_fail(err, "out of memory"), NULL;
    *a = (toy_acts){rt->ctx, B, T, ps_buf_alloc(rt->ctx, B * T * TOY_V * (int64_t)sizeof(float), "toy rows", err)};
    if (!a->row) return free(a), NULL;
    return a;
}
static void toy_acts_free(void *acts) {
    toy_acts *a = acts;
    if (a) ps_buf_free(a->ctx, a->row, a->B * a->T * TOY_V * (int64_t)sizeof(float));
    free(a);
}

/* rows [B, T, V] = the table rows of the tokens, then the hooks of blocks.0.hook_row */
static int toy_forward(const ps_runtime *rt, void *acts, const int32_t *tokens, const ps_hooks *h, int n_run, ps_error *err) {
    (void)n_run;
    const toy_model *m = rt->model;
    toy_acts *a = acts;
    for (int64_t i = 0; i < a->B * a->T; i++) {
        if (tokens[i] < 0 || tokens[i] >= TOY_V) return ps_fail(err, "token %d outside the toy vocabulary", tokens[i]);
        memcpy(a->row + i * TOY_V, m->w + tokens[i] * TOY_V, TOY_V * sizeof(float));
    }
    int64_t shape[3] = {a->B, a->T, TOY_V};
    return ps_hooks_on_point(h, &TOY_HOOKS, 0, 0) ? ps_hooks_fire_point(rt->ctx, h, 0, 0, a->row, 3, shape, err) : 0;
}
static const float *toy_logits(void *acts, ps_error *err) {
    (void)err;
    return ((toy_acts *)acts)->row;
}

static int toy_score(const ps_runtime *rt, const ps_batch *b, int64_t batch, const ps_hooks *h, int *ok, double *lp, ps_error *err) {
    int rc = 0;
    for (int64_t i0 = 0; i0 < b->B && !rc; i0 += batch) {
        ps_batch v = ps_batch_view(b, i0, b->B - i0 < batch ? b->B - i0 : batch);
        toy_acts *a = toy_acts_create(rt, v.B, v.T, 0, err);
        if (!a) return -1;
        rc = toy_forward(rt, a, v.tokens, h, -1, err);
        if (!rc) ps_score_queries(&v, a->row, TOY_V, ok + i0 * b->max_q, lp + i0 * b->max_q);
        toy_acts_free(a);
    }
    return rc;
}

static int toy_parse(const char *name, int *slot, ps_error *err) {
    int l = -1, n = 0;
    if (sscanf(name, "blocks.%d.hook_row%n", &l, &n) != 1 || name[n] || l != 0)
        return ps_fail(err, "%s: not a hook of the toy bigram model (it has blocks.0.hook_row)", name);
    *slot = l;
    return 0;
}
static int toy_hook_add(const ps_runtime *rt, ps_hooks *h, const char *name, ps_hook_fn fn, void *user, ps_error *err) {
    int slot;
    return toy_parse(name, &slot, err) ? -1 : ps_hooks_add_at(h, &TOY_HOOKS, rt->n_layers, slot, 0, name, fn, user, NULL, 0, err);
}
static int toy_hook_add_action(const ps_runtime *rt, ps_hooks *h, const char *name, const ps_hook_action *act, ps_error *err) {
    int slot;
    return toy_parse(name, &slot, err) ? -1 : ps_hooks_add_at(h, &TOY_HOOKS, rt->n_layers, slot, 0, name, NULL, NULL, act, 0, err);
}
static int toy_hook_parse(const ps_runtime *rt, const char *name, int *slot, int *point, ps_error *err) {
    (void)rt;
    *point = 0;
    return toy_parse(name, slot, err);
}
static int toy_point_shape(const ps_runtime *rt, int i, int layer, int64_t B, int64_t T, int64_t d[4]) {
    (void)rt, (void)i;
    if (layer != 0) return 0;
    d[0] = B, d[1] = T, d[2] = TOY_V;
    return 3;
}

static json_t *toy_config_json(const ps_runtime *rt) {
    (void)rt;
    return json_pack("{s:s, s:i, s:{s:s}}", "model_type", "toy_bigram", "vocab_size", TOY_V, "attention", "kind", "bigram");
}
static void toy_config_hash(const ps_runtime *rt, char out[17]) { memcpy(out, rt->config_hash, 17); }
static int64_t toy_step(const ps_runtime *rt) { return (void)rt, -1; }
static int64_t toy_period(const ps_runtime *rt) { return (void)rt, 4; }
static int64_t toy_vocab(const ps_runtime *rt) { return (void)rt, TOY_V; }
static const char *toy_meta(const ps_runtime *rt, const char *key) { return (void)rt, (void)key, NULL; }
static int toy_describe_config(const json_t *cfg, ps_model_desc *d, ps_error *err) {
    (void)err;
    const char *kind = json_string_value(json_object_get(json_object_get(cfg, "attention"), "kind"));
    if (!kind || strcmp(kind, "bigram")) return 0;
    memset(d, 0, sizeof *d);
    snprintf(d->kind, sizeof d->kind, "bigram");
    snprintf(d->label, sizeof d->label, "bigram table, vocab %lld", (long long)json_integer_value(json_object_get(cfg, "vocab_size")));
    return 1;
}
static const char *const TOY_KINDS[] = {"bigram", NULL};

static const ps_family TOY_FAMILY = {
    .name = "toy_bigram", .model_size = sizeof(toy_model), .open = toy_open, .free_model = toy_free,
    .acts_create = toy_acts_create, .acts_free = toy_acts_free, .forward = toy_forward, .logits = toy_logits,
    .score = toy_score, .points = TOY_POINTS, .n_points = 1, .hook_family = &TOY_HOOKS, .point_shape = toy_point_shape,
    .hook_add = toy_hook_add, .hook_add_action = toy_hook_add_action, .hook_parse = toy_hook_parse,
    .config_json = toy_config_json, .config_hash = toy_config_hash, .step = toy_step, .default_period = toy_period,
    .vocab = toy_vocab, .meta = toy_meta, .max_pos_name = "max_pos", .describe_config = toy_describe_config,
    .kinds = TOY_KINDS};

/* ---- the instruments' table: evaluation and one knockout target (the rows, replaced by their mean) ---- */

typedef struct {
    int64_t n, total; /* floats per layer: T · V; in all */
    double *sum;
    float *mean;
} toy_ko;

static int toy_eval(const ps_runtime *rt, const ps_batch *view, const ps_hooks *h, int *ok, double *lp, ps_error *err) {
    return rt->family->score(rt, view, view->B > 0 ? view->B : 1, h, ok, lp, err);
}
static int ko_sources(void *self, const ps_runtime *rt, const ps_grid_shift *sh, ps_hooks *ref, ps_error *err) {
    toy_ko *k = self;
    k->n = sh->T * TOY_V;
    k->total = sh->n_layers * k->n;
    k->sum = ps_buf_alloc(rt->ctx, k->total * (int64_t)sizeof(double), "toy sums", err);
    k->mean = k->sum ? ps_buf_alloc(rt->ctx, k->total * (int64_t)sizeof(float), "toy means", err) : NULL;
    if (!k->mean) return -1;
    for (int li = 0; li < sh->n_layers; li++) {
        char name[64];
        snprintf(name, sizeof name, "blocks.%d.hook_row", sh->layers[li]);
        ps_hook_action act = {.kind = PS_ACT_SUM, .head = -1, .acc = k->sum + li * k->n, .acc_n = k->n};
        if (rt->family->hook_add_action(rt, ref, name, &act, err)) return -1;
    }
    return 0;
}
static int ko_sources_done(void *self, const ps_runtime *rt, const ps_grid_shift *sh, ps_error *err) {
    toy_ko *k = self;
    return ps_sum_to_mean(rt->ctx, k->mean, k->sum, (double)sh->N, k->total) ? ps_ctx_check(rt->ctx, err) : 0;
}
static int ko_cell(void *self, const ps_runtime *rt, const ps_grid_shift *sh, int li, int ci, int64_t seq0, int64_t seq1,
                   int64_t prompt0, ps_hooks *h, ps_error *err) {
    (void)ci, (void)prompt0;
    toy_ko *k = self;
    char name[64];
    snprintf(name, sizeof name, "blocks.%d.hook_row", sh->layers[li]);
    ps_hook_action act = {.kind = PS_ACT_SET, .head = -1, .seq0 = seq0, .seq1 = seq1, .src = k->mean + li * k->n, .src_npos = sh->T};
    return rt->family->hook_add_action(rt, h, name, &act, err);
}
static void ko_shift_end(void *self, const ps_runtime *rt) {
    toy_ko *k = self;
    if (k->mean) ps_buf_free(rt->ctx, k->mean, k->total * (int64_t)sizeof(float));
    if (k->sum) ps_buf_free(rt->ctx, k->sum, k->total * (int64_t)sizeof(double));
    k->mean = NULL, k->sum = NULL;
}
static const char *const TOY_TARGETS[] = {"row", NULL};
static int ko_default(const ps_runtime *rt) { return (void)rt, 0; }
static int64_t ko_heads(const ps_runtime *rt, int t) { return (void)rt, (void)t, 0; }
static const char *ko_unit(const ps_runtime *rt, int t) { return (void)rt, (void)t, "layer"; }
static const char *ko_missing(const ps_runtime *rt, int t, int l, char *buf, size_t n) { return (void)rt, (void)t, (void)l, (void)buf, (void)n, NULL; }
static int ko_spec(const ps_runtime *rt, int t, const int *heads, int nh, ps_grid_spec *spec, ps_error *err) {
    (void)rt, (void)t, (void)heads, (void)nh;
    toy_ko *k = calloc(1, sizeof *k);
    if (!k) return ps_fail(err, "out of memory");
    *spec = (ps_grid_spec){.self = k, .restart = PS_GRID_RESTART_NONE, .sources = ko_sources, .sources_done = ko_sources_done,
                           .cell = ko_cell, .shift_end = ko_shift_end};
    return 0;
}
static void ko_spec_free(ps_grid_spec *spec) {
    free(spec->self);
    spec->self = NULL;
}
static const ps_runtime_ops TOY_OPS = {.eval = toy_eval, .ko_targets = TOY_TARGETS, .ko_heads_what = "layers",
                                       .ko_default_target = ko_default, .ko_target_heads = ko_heads, .ko_unit = ko_unit,
                                       .ko_layer_missing = ko_missing, .ko_spec = ko_spec, .ko_spec_free = ko_spec_free};

/* ---- the checks: plain loops over the table ---- */

static ps_task toy_task(void) {
    ps_task t = {.kind = PS_TASK_KV, .seq_len = 30, .n_keys = 6, .n_values = 6, .n_fillers = 3, .n_pairs = 3,
                 .key_len = 1, .value_len = 2, .gap_min = 0, .gap_max = 3, .query_gap = 4, .n_queries = 2};
    return t;
}

/* the outcomes of shift p's prompts from logits made here: rows of the table, or (mean = 1) the rows'
 * mean over the shift's prompts at each position (summed in double, as the knockout's sum action) */
static void expected(const ps_shifted *s, int mean, int *ok, double *lp) {
    int64_t N = s->b.B, T = s->b.T;
    float *lg = malloc((size_t)(N * T * TOY_V) * sizeof(float));
    for (int64_t t = 0; t < T; t++)
        for (int64_t v = 0; v < TOY_V; v++) {
            double acc = 0;
            for (int64_t i = 0; i < N; i++) acc += toy_weight(s->b.tokens[i * T + t], v);
            for (int64_t i = 0; i < N; i++)
                lg[(i * T + t) * TOY_V + v] = mean ? (float)(acc / (double)N) : toy_weight(s->b.tokens[i * T + t], v);
        }
    ps_score_queries(&s->b, lg, TOY_V, ok, lp);
    free(lg);
}

static void test_toy(void) {
    enum { N = 10, P = 4, BATCH = 3 };
    ps_error err = {0};
    ps_runtime rt;
    ps_runtime_opts o = {.backend = "cpu", .weights = 1};
    REQUIRE_OK(ps_runtime_open_family(&rt, &TOY_FAMILY, "toy", &o, &err), &err);
    rt.ops = &TOY_OPS;
    char lab[128];
    CHECK(!strcmp(ps_runtime_label(&rt, lab, sizeof lab), "bigram table, vocab 24"), "the toy's label: \"%s\"", lab);
    CHECK(ps_runtime_default_period(&rt) == 4, "the toy's default period");
    ps_task t = toy_task();
    ps_batch base;
    REQUIRE_OK(ps_batch_alloc(&base, N, t.seq_len, t.n_queries, &err), &err);
    CHECK(ps_task_generate(&t, 3, &base, NULL) == 0, "task generation");
    ps_filler_family fam = {.name = "repeat", .n_pattern = 1, .pattern = {0}};
    /* the expected clean and knocked-out statistics, shift by shift */
    ps_residue_stats want, want_ko;
    REQUIRE_OK(ps_residue_stats_init(&want, P, &err), &err);
    REQUIRE_OK(ps_residue_stats_init(&want_ko, P, &err), &err);
    int *ok = malloc((size_t)(N * t.n_queries) * sizeof(int));
    double *lp = malloc((size_t)(N * t.n_queries) * sizeof(double));
    for (int64_t p = 0; p < P; p++) {
        ps_shifted s;
        REQUIRE_OK(ps_make_shifted(&base, &t, &fam, PS_SWEEP_PAD, P, p, 0, rt.max_pos, &s, &err), &err);
        expected(&s, 0, ok, lp);
        ps_residue_stats_add(&want, &s, ok, lp);
        expected(&s, 1, ok, lp);
        ps_residue_stats_add(&want_ko, &s, ok, lp);
        ps_shifted_free(&s);
    }
    /* the sweep: its work units in two slices on the toy runtime */
    int64_t nu = P * ps_sweep_n_batches(N, BATCH), n = P * N * base.max_q;
    int32_t *uok = calloc((size_t)n, 4), *rho = calloc((size_t)n, 4);
    double *ulp = calloc((size_t)n, 8);
    CHECK_OK(ps_sweep_units(&rt, &base, &t, &fam, PS_SWEEP_PAD, P, 0, BATCH, 0, nu / 2, uok, ulp, rho, NULL, NULL, &err), &err);
    CHECK_OK(ps_sweep_units(&rt, &base, &t, &fam, PS_SWEEP_PAD, P, 0, BATCH, nu / 2, nu, uok, ulp, rho, NULL, NULL, &err), &err);
    ps_residue_stats got;
    REQUIRE_OK(ps_residue_stats_init(&got, P, &err), &err);
    ps_residue_stats_add_items(&got, uok, ulp, rho, n);
    int same = 1;
    for (int64_t r = 0; r < P; r++) {
        same &= got.n[r] == want.n[r] && got.k[r] == want.k[r] && fabs(got.lp[r] - want.lp[r]) <= 1e-9 * fabs(want.lp[r]);
    }
    CHECK(same && want.n[0] > 0, "toy sweep = the table's plain-loop outcomes per residue");
    /* the knockout of layer 0's rows (a per-layer target: one cell) through the grid engine */
    int layers[] = {0};
    ps_knockout_spec k = {.rt = &rt, .base = &base, .task = &t, .fam = &fam, .P = P, .batch = BATCH, .layers = layers,
                          .n_layers = 1, .target = 0};
    ps_knockout_result res;
    REQUIRE_OK(ps_knockout_run(&k, &res, &err), &err);
    int same_clean = 1, same_cell = 1, moved = 0;
    for (int64_t r = 0; r < P; r++) {
        same_clean &= res.clean.n[r] == want.n[r] && res.clean.k[r] == want.k[r] && fabs(res.clean.lp[r] - want.lp[r]) <= 1e-9 * fabs(want.lp[r]);
        same_cell &= res.cells[0].n[r] == want_ko.n[r] && res.cells[0].k[r] == want_ko.k[r] &&
                     fabs(res.cells[0].lp[r] - want_ko.lp[r]) <= 1e-6 * fabs(want_ko.lp[r]);
        moved |= fabs(want_ko.lp[r] - want.lp[r]) > 1e-3;
    }
    CHECK(same_clean, "toy knockout: the clean run = the plain loop");
    CHECK(same_cell, "toy knockout: the cell (rows replaced by their mean over the shift's prompts) = the plain loop");
    CHECK(moved, "the knockout changes the outcomes (the check can tell them apart)");
    /* a bad hook name is the family's error */
    ps_hooks h;
    ps_hooks_init(&h);
    ps_hook_action act = {.kind = PS_ACT_ZERO, .head = -1};
    CHECK_ERR(rt.family->hook_add_action(&rt, &h, "blocks.1.hook_row", &act, &err), &err, "not a hook of the toy bigram model");
    ps_hooks_free(&h);
    ps_knockout_result_free(&res);
    ps_residue_stats_free(&got);
    ps_residue_stats_free(&want);
    ps_residue_stats_free(&want_ko);
    free(uok), free(rho), free(ulp), free(ok), free(lp);
    ps_batch_free(&base);
    ps_runtime_free(&rt);
}

int main(void) {
    test_toy();
    CHECK_DONE();
}
