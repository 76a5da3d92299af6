#include "interventions/v4_instr.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/fileio.h"
#include "core/ops.h"
#include "core/v4/v4_forward.h"
#include "core/v4/v4_hooks.h"
#include "interventions/gatecycle.h"
#include "tasks/tasks.h"

/* ---- the task ---- */

void ps_v4_task_free(ps_v4_task *t) {
    free(t->ids);
    memset(t, 0, sizeof *t);
}

static int id_list(json_t *ids, const char *key, int64_t want, int64_t vocab, int32_t *out, const char *src, ps_error *err) {
    json_t *a = json_object_get(ids, key);
    if (!json_is_array(a) || (int64_t)json_array_size(a) != want)
        return ps_fail(err, "%s: key \"ids.%s\" must be a list of %lld token ids (the task's n_%s)", src, key, (long long)want, key);
    for (int64_t i = 0; i < want; i++) {
        json_t *x = json_array_get(a, (size_t)i);
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) >= vocab)
            return ps_fail(err, "%s: key \"ids.%s[%lld]\" must be a token id in [0, %lld)", src, key, (long long)i, (long long)vocab);
        out[i] = (int32_t)json_integer_value(x);
    }
    return 0;
}

static int one_id(json_t *ids, const char *key, int64_t vocab, int32_t *out, const char *src, ps_error *err) {
    json_t *x = json_object_get(ids, key);
    if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) >= vocab)
        return ps_fail(err, "%s: key \"ids.%s\" must be a token id in [0, %lld)", src, key, (long long)vocab);
    *out = (int32_t)json_integer_value(x);
    return 0;
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return x < y ? -1 : x > y;
}

int ps_v4_task_load(ps_v4_task *t, const char *task_path, const char *model_dir, int64_t vocab, int64_t max_pos, ps_error *err) {
    memset(t, 0, sizeof *t);
    struct stat st;
    if (task_path) snprintf(t->source, sizeof t->source, "%s", task_path);
    else {
        snprintf(t->source, sizeof t->source, "%s/phasescope_task.json", model_dir);
        if (stat(t->source, &st) != 0)
            return ps_fail(err, "%s is a DeepSeek-V4 checkpoint, which carries no phasescope task: give the prompts' task with "
                                "--task FILE.json ({\"task\": {...}, \"ids\": {...}}; docs/results-schema.md, \"DeepSeek-V4\"), "
                                "or put it in %s",
                           model_dir, t->source);
    }
    char *text;
    size_t len;
    if (ps_read_file(t->source, 1 << 20, &text, &len, err)) return -1;
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    free(text);
    if (!root) return ps_fail(err, "%s: not valid JSON (line %d: %s)", t->source, je.line, je.text);
    int rc = -1;
    json_t *tj = json_object_get(root, "task"), *ids = json_object_get(root, "ids");
    if (!json_is_object(root)) {
        ps_fail(err, "%s: expected an object {\"task\": {...}, \"ids\": {...}}", t->source);
        goto done;
    }
    if (!tj) tj = root, ids = NULL; /* a bare task */
    else {
        const char *k;
        json_t *v;
        json_object_foreach(root, k, v) if (strcmp(k, "task") && strcmp(k, "ids")) {
            ps_fail(err, "%s: unknown key \"%s\" (valid: task, ids)", t->source, k);
            goto done;
        }
    }
    if (ps_task_from_json(tj, t->source, &t->task, err)) goto done;
    int64_t need = ps_task_vocab_needed(&t->task);
    if (ps_task_validate(&t->task, ids ? need : vocab, max_pos, t->source, err)) goto done;
    t->n_ids = need;
    t->ids = malloc((size_t)need * sizeof(int32_t));
    if (!t->ids) {
        ps_fail(err, "out of memory for %lld token ids", (long long)need);
        goto done;
    }
    if (!ids) {
        for (int64_t i = 0; i < need; i++) t->ids[i] = (int32_t)i;
        rc = 0;
        goto done;
    }
    t->mapped = 1;
    if (!json_is_object(ids)) {
        ps_fail(err, "%s: key \"ids\" must be an object {\"bos\", \"marker\", \"keys\", \"values\", \"fillers\"}", t->source);
        goto done;
    }
    const char *k;
    json_t *v;
    json_object_foreach(ids, k, v) if (strcmp(k, "bos") && strcmp(k, "marker") && strcmp(k, "keys") && strcmp(k, "values") &&
                                       strcmp(k, "fillers")) {
        ps_fail(err, "%s: unknown key \"ids.%s\" (valid: bos, marker, keys, values, fillers)", t->source, k);
        goto done;
    }
    const ps_task *tk = &t->task;
    if (one_id(ids, "bos", vocab, &t->ids[PS_BOS], t->source, err) || one_id(ids, "marker", vocab, &t->ids[PS_MARKER], t->source, err) ||
        id_list(ids, "keys", tk->n_keys, vocab, t->ids + ps_task_key0(tk), t->source, err) ||
        (tk->n_values > 0 && id_list(ids, "values", tk->n_values, vocab, t->ids + ps_task_val0(tk), t->source, err)) ||
        id_list(ids, "fillers", tk->n_fillers, vocab, t->ids + ps_task_fill0(tk), t->source, err))
        goto done;
    /* one role per token: a token both key and value (or filler) would make the answers ambiguous */
    int32_t *sorted = malloc((size_t)need * sizeof(int32_t));
    if (!sorted) {
        ps_fail(err, "out of memory");
        goto done;
    }
    memcpy(sorted, t->ids, (size_t)need * sizeof(int32_t));
    qsort(sorted, (size_t)need, sizeof(int32_t), cmp_i32);
    for (int64_t i = 1; i < need; i++)
        if (sorted[i] == sorted[i - 1]) {
            ps_fail(err, "%s: token id %d appears twice in \"ids\" (every task token needs its own id)", t->source, sorted[i]);
            free(sorted);
            goto done;
        }
    free(sorted);
    rc = 0;
done:
    json_decref(root);
    if (rc) ps_v4_task_free(t);
    return rc;
}

json_t *ps_v4_task_source_json(const ps_v4_task *t) {
    json_t *o = json_object();
    json_object_set_new(o, "file", json_string(t->source));
    if (!t->mapped) {
        json_object_set_new(o, "ids", json_string("identity"));
        return o;
    }
    json_t *ids = json_object(), *a;
    const ps_task *tk = &t->task;
    json_object_set_new(ids, "bos", json_integer(t->ids[PS_BOS]));
    json_object_set_new(ids, "marker", json_integer(t->ids[PS_MARKER]));
    struct { const char *k; int64_t off, n; } L[] = {{"keys", ps_task_key0(tk), tk->n_keys},
                                                   {"values", ps_task_val0(tk), tk->n_values},
                                                   {"fillers", ps_task_fill0(tk), tk->n_fillers}};
    for (int i = 0; i < 3; i++) {
        if (!L[i].n) continue;
        a = json_array();
        for (int64_t j = 0; j < L[i].n; j++) json_array_append_new(a, json_integer(t->ids[L[i].off + j]));
        json_object_set_new(ids, L[i].k, a);
    }
    json_object_set_new(o, "ids", ids);
    return o;
}

/* ---- evaluation ---- */

int ps_v4_eval(ps_v4_model *m, const ps_v4_task *t, const ps_batch *b, int64_t batch, const ps_hooks *hooks, int *correct,
               double *logprob, ps_error *err) {
    int64_t N = b->B, T = b->T;
    if (batch < 1) return ps_fail(err, "batch %lld must be >= 1", (long long)batch);
    if (N == 0) return 0;
    /* the mapped copy: tokens (and the answer tokens scoring reads from them) in the model's ids */
    ps_batch mb;
    if (ps_batch_alloc(&mb, N, T, b->max_q, err)) return -1;
    for (int64_t i = 0; i < N * T; i++) {
        int32_t x = b->tokens[i], y = b->targets[i];
        if (x < 0 || x >= t->n_ids) {
            ps_batch_free(&mb);
            return ps_fail(err, "token %d outside the task's %lld ids", x, (long long)t->n_ids);
        }
        mb.tokens[i] = t->ids[x];
        mb.targets[i] = y >= 0 && y < t->n_ids ? t->ids[y] : -1;
    }
    memcpy(mb.n_q, b->n_q, (size_t)N * sizeof *b->n_q);
    memcpy(mb.queries, b->queries, (size_t)(N * b->max_q) * sizeof *b->queries);
    /* the family's one batching loop (core/runtime.c: its score) */
    ps_runtime rt;
    ps_v4_runtime(&rt, m, t);
    int rc = rt.family->score(&rt, &mb, batch, hooks, correct, logprob, err);
    ps_batch_free(&mb);
    return rc;
}

static const char *const BRANCHES[] = {"compressor", "indexer"};

/* ---- gates as work units (units.h's layout: per event three ints and its alpha floats) ---- */

int ps_v4_gates_acc_init(ps_chgate_acc *acc, int n_layers, const ps_v4_attn_type *types, const int64_t *rates, int64_t head_dim,
                         int64_t index_head_dim, ps_error *err) {
    if (ps_chgate_acc_init(acc, n_layers, 2, BRANCHES, err)) return -1;
    for (int l = 0; l < n_layers; l++) {
        if (types[l] == PS_V4_SLIDING) continue;
        int csa = types[l] == PS_V4_CSA;
        int64_t mr = rates[l];
        const char *an = csa ? "csa" : "hca";
        if (ps_chgate_acc_set(acc, l, 0, csa ? 2 * mr : mr, head_dim, csa, mr, an, err) ||
            (csa && ps_chgate_acc_set(acc, l, 1, 2 * mr, index_head_dim, 1, mr, an, err))) {
            ps_chgate_acc_free(acc);
            return -1;
        }
    }
    return 0;
}

void ps_v4_gates_unit_size(const ps_v4_config *c, int64_t n, int64_t T, int64_t *n_events, int64_t *n_floats) {
    *n_events = 0, *n_floats = 0;
    for (int l = 0; l < c->n_layers; l++) {
        if (c->attn_type[l] == PS_V4_SLIDING) continue;
        int csa = c->attn_type[l] == PS_V4_CSA;
        int64_t mr = c->compress_rate[l], nW = ps_v4_n_windows(c, l, T);
        *n_events += csa ? 2 : 1;
        *n_floats += n * nW * (csa ? 2 * mr : mr) * c->head_dim + (csa ? n * nW * 2 * mr * c->index_head_dim : 0);
    }
}

typedef struct {
    int32_t *events;
    float *alpha;
    int64_t ev, at, ev_end, at_end;
} v4_rec;

typedef struct {
    v4_rec *rec;
    int layer, branch;
} v4_rec_tap;

static int v4_rec_hook(const ps_hook_event *ev, void *user, ps_error *err) {
    const v4_rec_tap *t = user;
    v4_rec *r = t->rec;
    int64_t n = 1;
    for (int i = 0; i < ev->ndim; i++) n *= ev->shape[i];
    if (r->ev >= r->ev_end || r->at + n > r->at_end)
        return ps_fail(err, "hook \"%s\": more gate records than the unit holds", ev->name);
    int32_t *e = r->events + r->ev * PS_V4_GATES_EVENT_INTS;
    e[0] = t->layer, e[1] = t->branch, e[2] = (int32_t)ev->shape[0], e[3] = (int32_t)ev->shape[1];
    memcpy(r->alpha + r->at, ev->data, (size_t)n * sizeof(float));
    r->ev++;
    r->at += n;
    return 0;
}

int ps_v4_gates_units(ps_v4_model *m, const ps_v4_task *t, const ps_shifted *s, int64_t batch, int64_t u0, int64_t u1,
                      const int64_t *ev_off, const int64_t *al_off, int32_t *events, float *alpha, ps_error *err) {
    const ps_v4_config *c = &m->cfg;
    int L = (int)c->n_layers, rc = 0;
    int64_t N = s->b.B, B = batch < N ? batch : N, maxq = s->b.max_q;
    v4_rec rec = {.events = events, .alpha = alpha};
    v4_rec_tap *taps = calloc((size_t)(2 * L > 0 ? 2 * L : 1), sizeof *taps);
    int *ok = malloc((size_t)(B * maxq > 0 ? B * maxq : 1) * sizeof(int));
    double *lp = malloc((size_t)(B * maxq > 0 ? B * maxq : 1) * sizeof(double));
    ps_hooks h;
    ps_hooks_init(&h);
    if (!taps || !ok || !lp) rc = ps_fail(err, "out of memory");
    for (int l = 0; l < L && !rc; l++) {
        if (c->attn_type[l] == PS_V4_SLIDING) continue;
        char name[96];
        taps[2 * l] = (v4_rec_tap){&rec, l, 0};
        ps_v4_hook_name(name, sizeof name, l, PS_V4H_C_ALPHA);
        rc = ps_v4_hooks_add(&h, c, name, v4_rec_hook, &taps[2 * l], err);
        if (!rc && c->attn_type[l] == PS_V4_CSA) {
            taps[2 * l + 1] = (v4_rec_tap){&rec, l, 1};
            ps_v4_hook_name(name, sizeof name, l, PS_V4H_I_C_ALPHA);
            rc = ps_v4_hooks_add(&h, c, name, v4_rec_hook, &taps[2 * l + 1], err);
        }
    }
    for (int64_t u = u0; u < u1 && !rc; u++) {
        int64_t i0 = u * B, n = N - i0 < B ? N - i0 : B;
        rec.ev = ev_off[u], rec.ev_end = ev_off[u + 1], rec.at = al_off[u], rec.at_end = al_off[u + 1];
        ps_batch view = ps_batch_view(&s->b, i0, n);
        rc = ps_v4_eval(m, t, &view, n, &h, ok, lp, err);
        if (!rc && (rec.ev != rec.ev_end || rec.at != rec.at_end))
            rc = ps_fail(err, "gate records of batch %lld: %lld events, expected %lld", (long long)u, (long long)(rec.ev - ev_off[u]),
                         (long long)(ev_off[u + 1] - ev_off[u]));
    }
    ps_hooks_free(&h);
    free(taps);
    free(ok);
    free(lp);
    return rc;
}

int ps_v4_gates_replay(ps_chgate_acc *acc, const int32_t *events, int64_t n_events, const float *alpha, int64_t n_floats,
                       ps_error *err) {
    int64_t at = 0;
    for (int64_t i = 0; i < n_events; i++) {
        const int32_t *e = events + i * PS_V4_GATES_EVENT_INTS;
        if (e[0] < 0 || e[0] >= acc->n_layers || e[1] < 0 || e[1] >= acc->n_branches || e[2] < 0 || e[3] < 0)
            return ps_fail(err, "gate record %lld (layer %d, branch %d) does not fit the model", (long long)i, e[0], e[1]);
        const ps_chgate_slot *g = &acc->g[e[0] * acc->n_branches + e[1]];
        int64_t nf = (int64_t)e[2] * e[3] * g->S * g->d;
        if (g->S <= 0 || at + nf > n_floats)
            return ps_fail(err, "gate record %lld (layer %d, branch %d, %d x %d windows) does not fit the model or the data",
                           (long long)i, e[0], e[1], e[2], e[3]);
        ps_chgate_acc_add(acc, e[0], e[1], alpha + at, e[2], e[3]);
        at += nf;
    }
    if (at != n_floats) return ps_fail(err, "gate records: %lld floats left over", (long long)(n_floats - at));
    return 0;
}

/* ---- gate cycling ---- */

int ps_v4_gate_cycle(ps_v4_model *m, int layer, int branches, int64_t k, ps_error *err) {
    const ps_v4_config *c = &m->cfg;
    if (layer < 0 || layer >= c->n_layers)
        return ps_fail(err, "--layer %d: out of range (the model has %lld layers, 0..%lld)", layer, (long long)c->n_layers,
                       (long long)c->n_layers - 1);
    ps_v4_attn_type at = c->attn_type[layer];
    if (at == PS_V4_SLIDING) {
        char list[256] = "";
        size_t w = 0;
        for (int l = 0; l < c->n_layers && w + 12 < sizeof list; l++)
            if (c->attn_type[l] != PS_V4_SLIDING) w += (size_t)snprintf(list + w, sizeof list - w, " %d", l);
        return ps_fail(err, "--layer %d: a sliding-window layer has no compressor to cycle (compressed layers:%s)", layer,
                       w ? list : " none");
    }
    if ((branches & PS_V4_CYCLE_INDEXER) && !(branches & PS_V4_CYCLE_COMPRESSOR) && at != PS_V4_CSA)
        return ps_fail(err, "--branch indexer: layer %d is %s, which has no indexer (CSA layers only)", layer, ps_v4_attn_type_name(at));
    int64_t mr = c->compress_rate[layer], cw = (at == PS_V4_CSA ? 2 : 1) * c->head_dim, iw = 2 * c->index_head_dim;
    k = ((k % mr) + mr) % mr;
    ps_v4_layer w;
    if (ps_v4_layer_acquire(m, layer, &w, err)) return -1;
    int bad = 0;
    if (branches & PS_V4_CYCLE_COMPRESSOR) bad = ps_roll_blocks(m->ctx, w.c_ape, mr, cw, 0, cw, k);
    if (!bad && (branches & PS_V4_CYCLE_INDEXER) && at == PS_V4_CSA) bad = ps_roll_blocks(m->ctx, w.i_ape, mr, iw, 0, iw, k);
    /* a lazily loaded model keeps the cycled layer pinned (its reference is not released), so the roll is not
     * lost when the forward drops the layer; freed with the model */
    if (!m->lazy) ps_v4_layer_release(m, layer);
    if (bad) {
        ps_ctx_check(m->ctx, err);
        return ps_fail_prefix(err, "cycling layer %d's position bias (m = %lld): ", layer, (long long)mr);
    }
    return 0;
}

/* ---- knockout ---- */

const char *const ps_v4_ko_targets[] = {"heads", "compressed", "raw", "indexer", "sink", NULL};

int ps_v4_ko_layer_ok(const ps_v4_config *c, int l, ps_v4_ko_target target) {
    if (target == PS_V4KO_COMPRESSED) return c->attn_type[l] != PS_V4_SLIDING;
    if (target == PS_V4KO_INDEXER) return c->attn_type[l] == PS_V4_CSA;
    return 1;
}

static ps_v4_hook_point target_point(ps_v4_ko_target t, int sum_pass) {
    switch (t) {
    case PS_V4KO_HEADS: return PS_V4H_Q;
    case PS_V4KO_COMPRESSED: return PS_V4H_C_KV;
    case PS_V4KO_RAW: return PS_V4H_KV;
    case PS_V4KO_INDEXER: return sum_pass ? PS_V4H_I_SCORES : PS_V4H_I_TOPK;
    default: return PS_V4H_SINK;
    }
}

/* The summed / mean array of one layer, on the model's context: [n] values per sequence (positions ×
 * inner). The sums are a sum action on the clean pass, the replacement a set action: both run in the
 * backend, no host copy of a hooked tensor (the indexer's mean-pattern choice reads the mean scores once
 * per shift). */
typedef struct {
    double *sum;      /* [n] */
    float *mean;      /* [n_mean] (indexer: the mean-pattern top-k [T, K]) */
    int64_t n, n_mean;
    int64_t npos;     /* positions of the replaced array (its axis 1) */
} layer_mean;

static void layer_mean_free(ps_ctx *ctx, layer_mean *x) {
    if (x->sum) ps_buf_free(ctx, x->sum, x->n * (int64_t)sizeof(double));
    if (x->mean) ps_buf_free(ctx, x->mean, x->n_mean * (int64_t)sizeof(float));
    memset(x, 0, sizeof *x);
}

void ps_v4_mean_topk(const double *ms, int64_t T, int64_t nW, int64_t K, int64_t m, float *topk) {
    for (int64_t t = 0; t < T; t++) {
        int64_t nv = m > 0 ? (t + 1) / m : nW;
        if (nv > nW) nv = nW;
        const double *row = ms + t * nW;
        float *o = topk + t * K;
        for (int64_t i = 0; i < K; i++) {
            int64_t best = -1;
            for (int64_t w = 0; w < nv; w++) {
                int taken = 0;
                for (int64_t j = 0; j < i && !taken; j++) taken = o[j] == (float)w;
                if (taken) continue;
                if (best < 0 || row[w] > row[best]) best = w; /* strict: ties to the lower index */
            }
            o[i] = (float)best;
        }
    }
}

/* ---- the knockout spec (grid.h): sum actions on the reference pass, set actions per cell ---- */

typedef struct {
    ps_v4_ko_target target;
    const int *heads;
    int n_layers;
    layer_mean *lm; /* [n_layers] */
} v4_ko;

static void v4_ko_shift_end(void *self, const ps_runtime *rt) {
    v4_ko *k = self;
    for (int li = 0; li < k->n_layers; li++) layer_mean_free(rt->ctx, &k->lm[li]);
}

static int v4_ko_sources(void *self, const ps_runtime *rt, const ps_grid_shift *sh, ps_hooks *ref, ps_error *err) {
    v4_ko *k = self;
    const ps_v4_model *m = rt->model;
    const ps_v4_config *c = &m->cfg;
    int64_t T = sh->T, H = c->n_heads, Dh = c->head_dim;
    if (!k->lm) {
        k->lm = calloc((size_t)sh->n_layers, sizeof *k->lm);
        if (!k->lm) return ps_fail(err, "out of memory");
        k->n_layers = sh->n_layers;
    }
    for (int li = 0; li < sh->n_layers; li++) {
        int l = sh->layers[li];
        int64_t nW = ps_v4_n_windows(c, l, T), K = c->index_topk < nW ? c->index_topk : nW;
        layer_mean *x = &k->lm[li];
        layer_mean_free(rt->ctx, x);
        switch (k->target) {
        case PS_V4KO_HEADS: x->n = T * H * Dh, x->npos = T; break;
        case PS_V4KO_COMPRESSED: x->n = nW * Dh, x->npos = nW; break;
        case PS_V4KO_RAW: x->n = T * Dh, x->npos = T; break;
        case PS_V4KO_INDEXER: x->n = T * nW, x->npos = T; break;
        default: x->n = H * T, x->npos = H; break; /* the sink [B, H, T]: axis 1 is the head */
        }
        x->n_mean = k->target == PS_V4KO_INDEXER ? T * K : x->n;
        if (x->n < 1 || x->n_mean < 1)
            return ps_fail(err, "layer %d: nothing to replace for --target %s at %lld tokens", l, ps_v4_ko_targets[k->target], (long long)T);
        x->sum = ps_buf_alloc(rt->ctx, x->n * (int64_t)sizeof(double), "the knockout sums", err); /* zero-filled */
        x->mean = x->sum ? ps_buf_alloc(rt->ctx, x->n_mean * (int64_t)sizeof(float), "the knockout means", err) : NULL;
        if (!x->mean) return -1;
        char name[96];
        ps_v4_hook_name(name, sizeof name, l, target_point(k->target, 1));
        ps_hook_action act = {.kind = PS_ACT_SUM, .head = -1, .acc = x->sum, .acc_n = x->n};
        if (rt->family->hook_add_action(rt, ref, name, &act, err)) return -1;
    }
    return 0;
}

static int v4_ko_sources_done(void *self, const ps_runtime *rt, const ps_grid_shift *sh, ps_error *err) {
    v4_ko *k = self;
    const ps_v4_config *c = &((const ps_v4_model *)rt->model)->cfg;
    for (int li = 0; li < sh->n_layers; li++) {
        layer_mean *x = &k->lm[li];
        int l = sh->layers[li];
        if (k->target != PS_V4KO_INDEXER) {
            if (ps_sum_to_mean(rt->ctx, x->mean, x->sum, (double)sh->N, x->n)) return ps_ctx_check(rt->ctx, err);
            continue;
        }
        /* the indexer: the mean pattern's choice, from the mean scores (one host copy per shift) */
        int64_t nW = ps_v4_n_windows(c, l, sh->T), K = c->index_topk < nW ? c->index_topk : nW;
        double *hs = malloc((size_t)x->n * sizeof(double));
        float *tk = malloc((size_t)x->n_mean * sizeof(float));
        int rc = hs && tk ? 0 : ps_fail(err, "out of memory for the indexer's mean scores of layer %d", l);
        if (!rc) rc = ps_buf_to_host(rt->ctx, hs, x->sum, x->n * (int64_t)sizeof(double), err);
        if (!rc) {
            for (int64_t i = 0; i < x->n; i++) hs[i] /= (double)sh->N;
            ps_v4_mean_topk(hs, sh->T, nW, K, c->compress_rate[l], tk);
            rc = ps_buf_from_host(rt->ctx, x->mean, tk, x->n_mean * (int64_t)sizeof(float), err);
        }
        free(hs);
        free(tk);
        if (rc) return -1;
    }
    return 0;
}

static int v4_ko_cell(void *self, const ps_runtime *rt, const ps_grid_shift *sh, int li, int ci, int64_t seq0, int64_t seq1,
                      int64_t prompt0, ps_hooks *h, ps_error *err) {
    (void)prompt0; /* one mean for every prompt */
    v4_ko *k = self;
    const layer_mean *x = &k->lm[li];
    char name[96];
    ps_v4_hook_name(name, sizeof name, sh->layers[li], target_point(k->target, 0));
    ps_hook_action act = {.kind = PS_ACT_SET, .head = k->target == PS_V4KO_HEADS ? k->heads[ci] : -1, .seq0 = seq0,
                          .seq1 = seq1, .src = x->mean, .src_npos = x->npos};
    return rt->family->hook_add_action(rt, h, name, &act, err);
}

/* ---- the DeepSeek-V4 runtime ---- */

static int v4_rt_eval(const ps_runtime *rt, const ps_batch *view, const ps_hooks *h, int *ok, double *lp, ps_error *err) {
    return ps_v4_eval(rt->model, rt->aux, view, view->B > 0 ? view->B : 1, h, ok, lp, err);
}

static int v4_rt_ko_default(const ps_runtime *rt) {
    (void)rt;
    return PS_V4KO_COMPRESSED;
}

static int64_t v4_rt_ko_heads(const ps_runtime *rt, int target) {
    return target == PS_V4KO_HEADS ? ((const ps_v4_model *)rt->model)->cfg.n_heads : 0;
}

static const char *v4_rt_ko_unit(const ps_runtime *rt, int target) {
    (void)rt;
    return target == PS_V4KO_HEADS ? "query head" : "layer";
}

static const char *v4_rt_ko_missing(const ps_runtime *rt, int target, int l, char *buf, size_t n) {
    const ps_v4_config *c = &((const ps_v4_model *)rt->model)->cfg;
    if (l == -1) return NULL; /* the model as a whole: every target exists on some layer type */
    if (l < 0 || l >= c->n_layers) {
        snprintf(buf, n, "knockout grid: layer %d out of range", l);
        return buf;
    }
    if (ps_v4_ko_layer_ok(c, l, (ps_v4_ko_target)target)) return NULL;
    snprintf(buf, n, "--target %s: layer %d is %s, which has no %s", ps_v4_ko_targets[target], l, ps_v4_attn_type_name(c->attn_type[l]),
             target == PS_V4KO_INDEXER ? "indexer (CSA layers only)" : "compressed entries (CSA and HCA layers only)");
    return buf;
}

static int v4_rt_ko_spec(const ps_runtime *rt, int target, const int *heads, int n_heads, ps_grid_spec *spec, ps_error *err) {
    (void)rt, (void)n_heads;
    v4_ko *k = calloc(1, sizeof *k);
    if (!k) return ps_fail(err, "out of memory");
    k->target = (ps_v4_ko_target)target;
    k->heads = heads;
    /* the V4 forward has no restart: a full forward per cell (the engine's naive path) */
    *spec = (ps_grid_spec){.self = k, .restart = PS_GRID_RESTART_NONE, .sources = v4_ko_sources, .sources_done = v4_ko_sources_done,
                           .cell = v4_ko_cell, .shift_end = v4_ko_shift_end};
    return 0;
}

static void v4_rt_ko_spec_free(ps_grid_spec *spec) {
    v4_ko *k = spec->self;
    if (k) free(k->lm);
    free(k);
    spec->self = NULL;
}

/* gates (instr_gates.c): the compressors' per-channel gates as units (ps_v4_gates_units) */
static const char *v4_rt_gates_missing(const ps_runtime *rt, char *buf, size_t n) {
    const ps_v4_model *m = rt->model;
    for (int l = 0; l < m->cfg.n_layers; l++)
        if (m->cfg.attn_type[l] != PS_V4_SLIDING) return NULL;
    snprintf(buf, n, "%s: no CSA or HCA layer (every layer is sliding-window attention): there are no gates", m->dir);
    return buf;
}

static const char *v4_rt_gates_records(const ps_runtime *rt, int *ints_per_record) {
    (void)rt;
    *ints_per_record = PS_V4_GATES_EVENT_INTS;
    return "v4_events";
}

static void v4_rt_gates_unit_size(const ps_runtime *rt, int64_t n, int64_t T, int64_t *n_records, int64_t *n_floats) {
    ps_v4_gates_unit_size(&((const ps_v4_model *)rt->model)->cfg, n, T, n_records, n_floats);
}

static int v4_rt_gates_units(const ps_runtime *rt, const ps_shifted *s, int64_t batch, int64_t u0, int64_t u1, const int64_t *ev_off,
                             const int64_t *al_off, int32_t *events, float *alpha, ps_error *err) {
    return ps_v4_gates_units(rt->model, rt->aux, s, batch, u0, u1, ev_off, al_off, events, alpha, err);
}

static int v4_rt_gates_chacc(const ps_runtime *rt, ps_chgate_acc *acc, const char **model, ps_error *err) {
    const ps_v4_config *c = &((const ps_v4_model *)rt->model)->cfg;
    *model = "deepseek_v4"; /* the result's "gates.model", as the results have always said */
    return ps_v4_gates_acc_init(acc, (int)c->n_layers, c->attn_type, c->compress_rate, c->head_dim, c->index_head_dim, err) ? -1 : 1;
}

static json_t *v4_rt_gates_log(const ps_runtime *rt, const char *path, ps_error *err) {
    (void)rt, (void)path;
    ps_fail(err, "a DeepSeek-V4 checkpoint has no phasescope training log");
    if (err) err->usage = 1;
    return NULL;
}

/* ---- gate cycling as the runtime's ops (gatecycle.h, ps_cycle_req): a compressor's position bias ---- */

/* a usage error (a flag the checkpoint cannot take) */
static int v4_gc_usage(ps_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int v4_gc_usage(ps_error *err, const char *fmt, ...) {
    if (!err) return -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    err->usage = 1;
    return -1;
}

/* --branch compressor|indexer|both; no --head, --save, --params but gate, no per-head measure */
static int v4_gc_check(const ps_runtime *rt, ps_cycle_req *q, ps_error *err) {
    ps_v4_model *m = rt->model;
    const ps_v4_config *c = &m->cfg;
    if (q->head >= 0)
        return v4_gc_usage(err, "--head: a DeepSeek-V4 compressor has one K=V head; its position bias is rolled for every channel");
    if (q->save) return v4_gc_usage(err, "--save: writing DeepSeek-V4 checkpoints is not supported");
    if (q->params && strcmp(q->params, "gate"))
        return v4_gc_usage(err, "--params %s: a DeepSeek-V4 compressor's only per-slot parameter is its position bias (ape): "
                                "use --params gate (the default)",
                           q->params);
    if (q->per_head)
        return v4_gc_usage(err, "--measure knockout: the per-head measure cycles one KV head of a phasescope compressed model (a "
                                "DeepSeek-V4 compressor has one K=V head)");
    static const char *const BR[] = {"compressor", "indexer", "both", NULL};
    int bi = 2;
    if (q->branch && ps_cycle_choice("--branch", q->branch, BR, &bi, err)) return ps_fail_prefix(err, "DeepSeek-V4: ");
    int branches = bi == 0 ? PS_V4_CYCLE_COMPRESSOR : bi == 1 ? PS_V4_CYCLE_INDEXER : PS_V4_CYCLE_COMPRESSOR | PS_V4_CYCLE_INDEXER;
    if (q->layer < 0 || q->layer >= c->n_layers)
        return v4_gc_usage(err, "--layer %lld: out of range (the model has %lld layers, 0..%lld)", (long long)q->layer,
                           (long long)c->n_layers, (long long)c->n_layers - 1);
    if (ps_v4_gate_cycle(m, (int)q->layer, branches, 0, err)) { /* the preconditions: cycling by 0 changes nothing */
        err->usage = 1;
        return -1;
    }
    q->branches = branches;
    q->params_mask = 1; /* the position bias: the gate's per-slot parameter */
    return 0;
}

static int v4_gc_cycle(const ps_runtime *rt, const ps_cycle_req *q, int64_t k, ps_error *err) {
    return ps_v4_gate_cycle(rt->model, (int)q->layer, q->branches, k, err);
}

/* the cycle block and what the result says (docs/results-schema.md, "DeepSeek-V4") */
static int v4_gc_meta(const ps_runtime *rt, const ps_cycle_req *q, json_t *meta, ps_error *err) {
    const ps_v4_config *c = &((const ps_v4_model *)rt->model)->cfg;
    int64_t layer = q->layer, rate = c->compress_rate[layer];
    int has_ix = c->attn_type[layer] == PS_V4_CSA && (q->branches & PS_V4_CYCLE_INDEXER);
    const char *br = (q->branches & PS_V4_CYCLE_COMPRESSOR) && has_ix ? "both" : has_ix ? "indexer" : "compressor";
    json_t *cy = json_pack("{s:I, s:I, s:s, s:[i], s:s, s:s, s:s, s:I}", "layer", (json_int_t)layer, "shift", (json_int_t)q->shift,
                           "head", "all", "heads", 0, "branch", br, "params", "gate", "rolled",
                           "position bias (ape) rows, by shift mod the layer's rate", "rate", (json_int_t)rate);
    char line[512];
    snprintf(line, sizeof line, "cycled layer %lld (%s, rate %lld): %s position bias rolled by %lld", (long long)layer,
             ps_v4_attn_type_name(c->attn_type[layer]), (long long)rate, br, (long long)q->shift);
    if (!cy || json_object_set_new(meta, "cycle", cy) || json_object_set_new(meta, "summary", json_string(line)) ||
        json_object_set_new(meta, "summary_means", json_true()) || json_object_set_new(meta, "gates_without_payloads", json_false()) ||
        json_object_set_new(meta, "near_chance_warning",
                            json_string("after cycling, accuracy is near chance: the shift statistic means nothing")))
        return ps_fail(err, "out of memory for the cycle's description");
    return 0;
}

static const ps_runtime_ops V4_OPS = {
                                      .eval = v4_rt_eval,
                                      .ko_targets = ps_v4_ko_targets,
                                      .ko_heads_what = "query heads",
                                      .ko_default_target = v4_rt_ko_default,
                                      .ko_target_heads = v4_rt_ko_heads,
                                      .ko_unit = v4_rt_ko_unit,
                                      .ko_layer_missing = v4_rt_ko_missing,
                                      .ko_spec = v4_rt_ko_spec,
                                      .ko_spec_free = v4_rt_ko_spec_free,
                                      /* gates (instr_gates.c) */
                                      .gates_missing = v4_rt_gates_missing,
                                      .gates_records = v4_rt_gates_records,
                                      .gates_unit_size = v4_rt_gates_unit_size,
                                      .gates_units = v4_rt_gates_units,
                                      .gates_log = v4_rt_gates_log,
                                      .gates_chacc = v4_rt_gates_chacc,
                                      /* gate cycling */
                                      .gc_check = v4_gc_check,
                                      .gc_cycle = v4_gc_cycle,
                                      .gc_meta = v4_gc_meta};

void ps_v4_runtime(ps_runtime *rt, ps_v4_model *m, const ps_v4_task *t) {
    memset(rt, 0, sizeof *rt);
    rt->ops = &V4_OPS;
    rt->ctx = m->ctx;
    rt->max_pos = m->cfg.max_position_embeddings;
    rt->n_layers = m->cfg.n_layers;
    rt->model = m;
    rt->aux = t;
    rt->family = &ps_family_v4;
}
