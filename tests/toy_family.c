/* toy_family.c — a third model family defined outside core (toy_family.h): a bigram table, the recipe "add a
 * model family" of docs/design.md carried out in a few dozen lines. */
#include "toy_family.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/kvcache.h"
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

/* ---- its KV cache (core/kvcache.h ps_kvcache_ops): a bigram's next logits need only the last token, so a
 * sequence keeps its length (kv->seqs[s].T) and its last token (impl); no entries, no cache points ---- */

typedef struct {
    const toy_model *m;
    int32_t *last; /* [cap_seq] */
} toy_cache;

static int toy_kv_create(ps_kvcache *kv, const ps_runtime *rt, const ps_kvcache_opts *o, ps_error *err) {
    (void)o;
    toy_cache *c = calloc(1, sizeof *c);
    if (!c) return ps_fail(err, "out of memory for the toy's cache");
    c->m = rt->model;
    kv->impl = c;
    kv->ops = &toy_kv_ops;
    kv->ctx = rt->ctx;
    return 0;
}
static void toy_kv_free(ps_kvcache *kv) {
    toy_cache *c = kv->impl;
    if (c) free(c->last);
    free(c);
    free(kv->seqs);
    memset(kv, 0, sizeof *kv);
}
static int toy_kv_add(ps_kvcache *kv, ps_error *err) {
    toy_cache *c = kv->impl;
    int s = 0;
    while (s < kv->n_seq && kv->seqs[s].live) s++;
    if (s == kv->n_seq) {
        ps_kv_seq *q = realloc(kv->seqs, (size_t)(s + 1) * sizeof *q);
        int32_t *l = q ? realloc(c->last, (size_t)(s + 1) * sizeof *l) : NULL;
        if (q) kv->seqs = q;
        if (l) c->last = l;
        if (!q || !l) return ps_fail(err, "out of memory for a toy cache sequence");
        kv->n_seq++;
    }
    memset(&kv->seqs[s], 0, sizeof kv->seqs[s]);
    kv->seqs[s].live = true;
    c->last[s] = -1;
    return s;
}
static int toy_kv_fork(ps_kvcache *kv, int src, ps_error *err) {
    if (!ps_kvcache_seq(kv, src, err)) return -1;
    int s = toy_kv_add(kv, err);
    if (s < 0) return -1;
    kv->seqs[s].T = kv->seqs[src].T;
    ((toy_cache *)kv->impl)->last[s] = ((toy_cache *)kv->impl)->last[src];
    return s;
}
static void toy_kv_drop(ps_kvcache *kv, int seq) {
    if (seq >= 0 && seq < kv->n_seq) kv->seqs[seq].live = false;
}
static int toy_kv_truncate(ps_kvcache *kv, int seq, int64_t T, ps_error *err) {
    ps_kv_seq *q = ps_kvcache_seq(kv, seq, err);
    if (!q) return -1;
    if (T != q->T) return ps_fail(err, "the toy's cache keeps the last token only: it cannot go back to %lld tokens", (long long)T);
    return 0;
}
/* logits of every new position (or each sequence's last): row w[token]; blocks.0.hook_row fires per sequence */
static int toy_kv_append(ps_kvcache *kv, int n_seq, const int *seqs, const int64_t *n, const int32_t *tokens, const ps_hooks *hooks,
                         float *logits, bool last_only, ps_error *err) {
    toy_cache *c = kv->impl;
    if (ps_kvcache_check_request(kv, n_seq, seqs, n, tokens, err)) return -1;
    int64_t off = 0;
    for (int i = 0; i < n_seq; off += n[i], i++) {
        float *rows = malloc((size_t)(n[i] > 0 ? n[i] : 1) * TOY_V * sizeof(float));
        if (!rows) return ps_fail(err, "out of memory");
        for (int64_t t = 0; t < n[i]; t++) memcpy(rows + t * TOY_V, c->m->w + tokens[off + t] * TOY_V, TOY_V * sizeof(float));
        int64_t shape[3] = {1, n[i], TOY_V};
        int rc = n[i] && ps_hooks_on_point(hooks, &TOY_HOOKS, 0, 0) ? ps_hooks_fire_point(kv->ctx, hooks, 0, 0, rows, 3, shape, err) : 0;
        if (!rc && logits && n[i]) {
            if (last_only) memcpy(logits + (int64_t)i * TOY_V, rows + (n[i] - 1) * TOY_V, TOY_V * sizeof(float));
            else memcpy(logits + off * TOY_V, rows, (size_t)(n[i] * TOY_V) * sizeof(float));
        }
        free(rows);
        if (rc) return -1;
        kv->seqs[seqs[i]].T += n[i];
        if (n[i]) c->last[seqs[i]] = tokens[off + n[i] - 1];
    }
    return 0;
}
static int64_t toy_kv_n_entries(const ps_kvcache *kv, int seq, int l, int g) { return (void)kv, (void)seq, (void)l, (void)g, 0; }
static int toy_kv_entry(const ps_kvcache *kv, int seq, int l, int g, int value, int64_t j, float *out, ps_error *err) {
    (void)kv, (void)seq, (void)l, (void)g, (void)value, (void)j, (void)out;
    return ps_fail(err, "the toy's cache holds no entries");
}
static int toy_kv_edit(ps_kvcache *kv, int seq, int l, int g, int value, int64_t j, ps_kv_edit_kind kind, const float *vec, ps_error *err) {
    (void)kv, (void)seq, (void)l, (void)g, (void)value, (void)j, (void)kind, (void)vec;
    return ps_fail(err, "the toy's cache holds no entries to edit");
}
static int64_t toy_kv_bytes(const ps_kvcache *kv) { return kv->n_seq * (int64_t)(sizeof(ps_kv_seq) + sizeof(int32_t)); }
static int toy_kv_point_parse(const ps_kvcache *kv, const char *name, int *layer, int *value, ps_error *err) {
    (void)kv, (void)layer, (void)value;
    return ps_fail(err, "%s: the toy's cache has no cache points", name);
}
static void toy_kv_point_name(const ps_kvcache *kv, int layer, int value, char *buf, size_t n) {
    (void)kv, (void)layer, (void)value;
    snprintf(buf, n, "(none)");
}
static int64_t toy_kv_vocab(const ps_kvcache *kv) { return (void)kv, TOY_V; }
static int64_t toy_kv_max_len(const ps_kvcache *kv) { return (void)kv, TOY_MAX_POS; }
static int64_t toy_kv_entry_heads(const ps_kvcache *kv) { return (void)kv, 0; }
static int64_t toy_kv_entry_width(const ps_kvcache *kv, int l, int value) { return (void)kv, (void)l, (void)value, 1; }

const ps_kvcache_ops toy_kv_ops = {
    .name = "toy_bigram", .create = toy_kv_create, .free = toy_kv_free, .add = toy_kv_add, .fork = toy_kv_fork, .drop = toy_kv_drop,
    .truncate = toy_kv_truncate, .append = toy_kv_append, .n_entries = toy_kv_n_entries, .entry = toy_kv_entry, .edit = toy_kv_edit,
    .bytes = toy_kv_bytes, .point_parse = toy_kv_point_parse, .point_name = toy_kv_point_name, .vocab = toy_kv_vocab,
    .max_len = toy_kv_max_len, .entry_heads = toy_kv_entry_heads, .entry_width = toy_kv_entry_width, .max_len_name = "max_pos",
    .edit_form = "(the toy's cache has no cache points)", .one_head = "the toy's cache has no heads"};

const ps_family ps_toy_family = {
    .kvcache = &toy_kv_ops,
    .name = "toy_bigram", .model_size = sizeof(toy_model), .detect = toy_detect, .open = toy_open, .free_model = toy_free,
    .acts_create = toy_acts_create, .acts_free = toy_acts_free, .forward = toy_forward, .logits = toy_logits,
    .score = toy_score, .rows = toy_rows, .points = TOY_POINTS, .n_points = 1, .hook_family = &TOY_HOOKS, .point_shape = toy_point_shape,
    .hook_add = toy_hook_add, .hook_add_action = toy_hook_add_action, .cache_watch = toy_cache_watch, .hook_parse = toy_hook_parse,
    .config_json = toy_config_json, .config_hash = toy_config_hash, .step = toy_step, .default_period = toy_period,
    .vocab = toy_vocab, .meta = toy_meta, .max_pos_name = "max_pos", .describe_config = toy_describe_config,
    .kinds = TOY_KINDS, .ko.targets = TOY_TARGETS, .ko.heads_what = "layers", .ko.default_target = ko_default, .ko.heads = ko_heads,
    .ko.unit = ko_unit, .ko.arrays = ko_arrays, .task_file = 1};


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
