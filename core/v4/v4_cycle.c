/* v4_cycle.c — DeepSeek-V4's gate cycling (core/cycle.h): the roll of a compressed layer's position bias and
 * the family's entries (check, cycle, meta). */
#include "core/cycle.h"

#include <stdio.h>
#include <string.h>

#include "core/names.h"
#include "core/ops.h"
#include "core/v4/v4_config.h"
#include "core/v4/v4_model.h"

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

/* ---- the family entries (runtime.c's table; cycle.h, ps_cycle_req): a compressor's position bias ---- */

/* --branch compressor|indexer|both; no --head, --save, --params but gate, no per-head measure */
int ps_v4_cycle_check(const ps_runtime *rt, ps_cycle_req *q, ps_error *err) {
    ps_v4_model *m = rt->model;
    const ps_v4_config *c = &m->cfg;
    if (q->head >= 0)
        return ps_fail_usage(err, "--head: a DeepSeek-V4 compressor has one K=V head; its position bias is rolled for every channel");
    if (q->save) return ps_fail_usage(err, "--save: writing DeepSeek-V4 checkpoints is not supported");
    if (q->params && strcmp(q->params, "gate"))
        return ps_fail_usage(err, "--params %s: a DeepSeek-V4 compressor's only per-slot parameter is its position bias (ape): "
                                  "use --params gate (the default)",
                             q->params);
    if (q->per_head)
        return ps_fail_usage(err, "--measure knockout: the per-head measure cycles one KV head of a phasescope compressed model (a "
                                  "DeepSeek-V4 compressor has one K=V head)");
    static const char *const BR[] = {"compressor", "indexer", "both", NULL};
    int bi = 2;
    if (q->branch && ps_choice("--branch", q->branch, BR, &bi, err)) return ps_fail_prefix(err, "DeepSeek-V4: ");
    int branches = bi == 0 ? PS_V4_CYCLE_COMPRESSOR : bi == 1 ? PS_V4_CYCLE_INDEXER : PS_V4_CYCLE_COMPRESSOR | PS_V4_CYCLE_INDEXER;
    if (q->layer < 0 || q->layer >= c->n_layers)
        return ps_fail_usage(err, "--layer %lld: out of range (the model has %lld layers, 0..%lld)", (long long)q->layer,
                             (long long)c->n_layers, (long long)c->n_layers - 1);
    if (ps_v4_gate_cycle(m, (int)q->layer, branches, 0, err)) { /* the preconditions: cycling by 0 changes nothing */
        err->usage = 1;
        return -1;
    }
    q->branches = branches;
    q->params_mask = 1; /* the position bias: the gate's per-slot parameter */
    return 0;
}

int ps_v4_cycle(const ps_runtime *rt, const ps_cycle_req *q, int64_t k, ps_error *err) {
    return ps_v4_gate_cycle(rt->model, (int)q->layer, q->branches, k, err);
}

/* the cycle block and what the result says (docs/results-schema.md, "DeepSeek-V4") */
int ps_v4_cycle_meta(const ps_runtime *rt, const ps_cycle_req *q, json_t *meta, ps_error *err) {
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

