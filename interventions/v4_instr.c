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

/* ---- evaluation ---- */

int ps_v4_eval(ps_v4_model *m, const ps_v4_task *t, const ps_batch *b, int64_t batch, const ps_hooks *hooks, int *correct,
               double *logprob, ps_error *err) {
    ps_runtime rt;
    ps_v4_runtime(&rt, m, t);
    return ps_eval_mapped(&rt, b, batch, hooks, correct, logprob, err);
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

int ps_v4_gates_units(ps_v4_model *m, const int32_t *ids, int64_t n_ids, const ps_shifted *s, int64_t batch, int64_t u0, int64_t u1,
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
        ps_runtime rt;
        ps_v4_runtime(&rt, m, NULL);
        rt.token_map = ids, rt.n_token_map = n_ids;
        rc = ps_eval_mapped(&rt, &view, n, &h, ok, lp, err);
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

/* ---- the DeepSeek-V4 runtime (its knockout targets are core's data: core/ko_targets.c) ---- */

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
    return ps_v4_gates_units(rt->model, rt->token_map, rt->n_token_map, s, batch, u0, u1, ev_off, al_off, events, alpha, err);
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

const ps_runtime_ops ps_v4_runtime_ops = {
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
    rt->ops = &ps_v4_runtime_ops;
    rt->ctx = m->ctx;
    rt->max_pos = m->cfg.max_position_embeddings;
    rt->n_layers = m->cfg.n_layers;
    rt->model = m;
    rt->token_map = t ? t->ids : NULL;
    rt->n_token_map = t ? t->n_ids : 0;
    rt->family = &ps_family_v4;
}
