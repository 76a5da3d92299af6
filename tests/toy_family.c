/* toy_family.c — a third model family defined outside core (toy_family.h): a bigram table, the recipe "add a
 * model family" of docs/design.md carried out in a few dozen lines. */
#include "toy_family.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/ops.h"

/* ---- the family: a bigram table ---- */

typedef struct {
    ps_ctx *ctx;
    float w[TOY_V * TOY_V]; /* [V, V]: row a holds the logits of the token after a */
} toy_model;

typedef struct {
    ps_ctx *ctx;
    int64_t B, T;
    float *row; /* [B, T, V], a buffer of the context: the logits */
} toy_acts;

int toy_opens; /* checkpoints opened (the test's count: whether a call reused an open model) */

float toy_weight(int64_t a, int64_t b) { return (float)((a * 7 + b * 13) % 17 - 8) * 0.25f; }

static void toy_point_name(char *buf, size_t n, int slot, int point) {
    (void)point;
    snprintf(buf, n, "blocks.%d.hook_row", slot);
}
static const ps_hook_family TOY_HOOKS = {"toy_bigram", toy_point_name};
static const ps_point_info TOY_POINTS[] = {
    {"blocks.{L}.hook_row", "[B, T, V]", -1, "every layer", 0, "the table row of each token: its next-token logits"}};

/* DIR/config.json names the toy ({"model_type": "toy_bigram"}) */
static int toy_detect(const char *dir) {
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_t *c = json_load_file(path, 0, NULL);
    const char *t = json_string_value(json_object_get(c, "model_type"));
    int yes = t && !strcmp(t, "toy_bigram");
    json_decref(c);
    return yes;
}

static int toy_open(ps_runtime *rt, void *model, const char *dir, const ps_runtime_opts *o, ps_error *err) {
    (void)dir;
    toy_model *m = model;
    toy_opens++;
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

/* the rows at each sequence's answer rows, one sequence at a time (what serve scores and generates with) */
static int toy_rows(const ps_runtime *rt, const ps_batch *b, int64_t batch, double mem_bytes, ps_rows_fn fn, void *user, ps_error *err) {
    (void)batch, (void)mem_bytes;
    const toy_model *m = rt->model;
    int64_t *pos = malloc((size_t)(b->T > 0 ? b->T : 1) * sizeof *pos);
    float *rows = malloc((size_t)(b->T > 0 ? b->T : 1) * TOY_V * sizeof(float));
    int rc = pos && rows ? 0 : ps_fail(err, "out of memory");
    for (int64_t s = 0; s < b->B && !rc; s++) {
        int64_t n = ps_answer_rows(b, s, pos);
        for (int64_t k = 0; k < n && !rc; k++) {
            int32_t tok = b->tokens[s * b->T + pos[k]];
            if (tok < 0 || tok >= TOY_V) rc = ps_fail(err, "token %d outside the toy vocabulary", tok);
            else memcpy(rows + k * TOY_V, m->w + tok * TOY_V, TOY_V * sizeof(float));
        }
        if (!rc && n) rc = fn(b, s, rows, n, user, err);
    }
    free(pos);
    free(rows);
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
static int toy_cache_watch(const ps_runtime *rt, ps_cache *c, ps_hooks *h, const char *name, ps_error *err) {
    int slot;
    return toy_parse(name, &slot, err) ? -1 : ps_cache_watch_at(c, h, &TOY_HOOKS, rt->n_layers, slot, 0, err);
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

/* its one knockout target as data: the rows, replaced by their mean over the shift's prompts (one cell per layer) */
static const char *const TOY_TARGETS[] = {"row", NULL};
static int ko_default(const ps_runtime *rt) { return (void)rt, 0; }
static int64_t ko_heads(const ps_runtime *rt, int t) { return (void)rt, (void)t, 0; }
static const char *ko_unit(const ps_runtime *rt, int t) { return (void)rt, (void)t, "layer"; }
static int ko_arrays(const ps_runtime *rt, int t, ps_ko_array arr[PS_KO_MAX_ARRAYS], int *restart) {
    (void)rt, (void)t;
    arr[0] = (ps_ko_array){0, 0, 0};
    *restart = PS_KO_RESTART_NONE;
    return 1;
}

const ps_family ps_toy_family = {
    .name = "toy_bigram", .model_size = sizeof(toy_model), .detect = toy_detect, .open = toy_open, .free_model = toy_free,
    .acts_create = toy_acts_create, .acts_free = toy_acts_free, .forward = toy_forward, .logits = toy_logits,
    .score = toy_score, .rows = toy_rows, .points = TOY_POINTS, .n_points = 1, .hook_family = &TOY_HOOKS, .point_shape = toy_point_shape,
    .hook_add = toy_hook_add, .hook_add_action = toy_hook_add_action, .cache_watch = toy_cache_watch, .hook_parse = toy_hook_parse,
    .config_json = toy_config_json, .config_hash = toy_config_hash, .step = toy_step, .default_period = toy_period,
    .vocab = toy_vocab, .meta = toy_meta, .max_pos_name = "max_pos", .describe_config = toy_describe_config,
    .kinds = TOY_KINDS, .ko_targets = TOY_TARGETS, .ko_heads_what = "layers", .ko_default = ko_default, .ko_heads = ko_heads,
    .ko_unit = ko_unit, .ko_arrays = ko_arrays, .task_file = 1};


/* the toy first: the controlled model's detector takes every directory */
static const ps_family *const TOY_FAMILIES[] = {&ps_toy_family, &ps_family_v4, &ps_family_model, NULL};
const ps_family *const *toy_family_list(void) { return TOY_FAMILIES; }

/* the toy's greedy next token after a (lowest index on ties); *unique: the maximum is unique */
static int toy_argmax(int a, int *unique) {
    int best = 0, n = 0;
    for (int b = 1; b < TOY_V; b++)
        if (toy_weight(a, b) > toy_weight(a, best)) best = b;
    for (int b = 0; b < TOY_V; b++) n += toy_weight(a, b) == toy_weight(a, best);
    *unique = n == 1;
    return best;
}

int toy_greedy_pair(int *a, int *g1, int *g2) {
    for (int x = 0; x < TOY_V; x++) {
        int u1, u2, b = toy_argmax(x, &u1), c = toy_argmax(b, &u2);
        if (u1 && u2) {
            *a = x, *g1 = b, *g2 = c;
            return 0;
        }
    }
    return -1;
}

double toy_logprob(int a, int b) {
    double mx = -1e30, z = 0;
    for (int v = 0; v < TOY_V; v++) mx = fmax(mx, toy_weight(a, v));
    for (int v = 0; v < TOY_V; v++) z += exp(toy_weight(a, v) - mx);
    return toy_weight(a, b) - mx - log(z);
}
