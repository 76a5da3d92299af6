/* cycle.c — gate offset cycling (cycle.h): the controlled model's roll of its per-offset gate parameters and
 * its family entries (check, cycle, meta); DeepSeek-V4's are core/v4/v4_cycle.c. */
#include "core/cycle.h"

#include <stdio.h>
#include <string.h>

#include "core/names.h"
#include "core/ops.h"

/* The channel attention: the compressor's only per-slot parameter is its position bias ape [m, c·hd] (the
 * gate and payload projections are shared by the slots); rolling its rows by k moves the bias of token
 * offset r in a window to offset r + k (mod m), in both of CSA's series. */
static int channel_cycle(ps_model *m, int layer, int head, int branches, int params, int64_t k, ps_error *err) {
    const ps_config *c = &m->cfg;
    if (layer < 0 || layer >= c->n_layers)
        return ps_fail(err, "--layer %d: out of range (the model has %lld layers, 0..%lld)", layer, (long long)c->n_layers,
                       (long long)c->n_layers - 1);
    if (head < -1 || head >= c->n_kv_heads)
        return ps_fail(err, "--head %d: out of range (the model has %lld KV heads, 0..%lld)", head, (long long)c->n_kv_heads,
                       (long long)c->n_kv_heads - 1);
    if (!(branches & PS_CYCLE_KEY))
        return ps_fail(err, "--branch value: the channel attention has one compressor (K = V); use --branch key or both");
    if (params & PS_CYCLE_PAYLOAD)
        return ps_fail(err, "--params %s: the v4 compressor's payload projection is shared by the slots; only its position bias "
                            "(gate) is per slot",
                       params == PS_CYCLE_PAYLOAD ? "payload" : "all");
    int64_t mr = c->rate, w = ps_config_v4_series(c) * c->head_dim;
    k = ((k % mr) + mr) % mr;
    ps_layer_params p = ps_model_layer(m, m->params, layer);
    if (ps_roll_blocks(m->ctx, p.c_ape, mr, w, 0, w, k)) {
        ps_ctx_check(m->ctx, err);
        return ps_fail_prefix(err, "cycling layer %d's position bias (m = %lld): ", layer, (long long)mr);
    }
    return 0;
}

int ps_gate_cycle(ps_model *m, int layer, int head, int branches, int params, int64_t k, ps_error *err) {
    const ps_config *c = &m->cfg;
    if (c->kind == PS_ATTN_CHANNEL) return channel_cycle(m, layer, head, branches, params, k, err);
    if (c->kind != PS_ATTN_COMPRESSED) return ps_fail(err, "the model has full attention: there is no gate to cycle");
    if (layer < 0 || layer >= c->n_layers)
        return ps_fail(err, "--layer %d: out of range (the model has %lld layers, 0..%lld)", layer, (long long)c->n_layers,
                       (long long)c->n_layers - 1);
    if (head < -1 || head >= c->n_kv_heads)
        return ps_fail(err, "--head %d: out of range (the model has %lld KV heads, 0..%lld)", head,
                       (long long)c->n_kv_heads, (long long)c->n_kv_heads - 1);
    if ((params & PS_CYCLE_GATE) && c->gate == PS_GATE_UNIFORM)
        return ps_fail(err, "--params %s: the model's gate is uniform; it has no per-offset gate parameters to cycle",
                       params == PS_CYCLE_GATE ? "gate" : "all");
    if ((params & PS_CYCLE_PAYLOAD) && c->payload == PS_PAYLOAD_SHARED)
        return ps_fail(err, "--params %s: the model's payload is shared across offsets; there is nothing to cycle",
                       params == PS_CYCLE_PAYLOAD ? "payload" : "all");
    int64_t W = c->window, nkv = c->n_kv_heads, d = c->d_model, hd = c->head_dim;
    k = ((k % W) + W) % W;
    ps_layer_params p = ps_model_layer(m, m->params, layer);
    int g0 = head < 0 ? 0 : head, g1 = head < 0 ? (int)nkv : head + 1;
    /* the parameters live on the model's context: the roll is an op there (ps_roll_blocks) */
    ps_ctx *ctx = m->ctx;
    for (int br = 0; br < 2; br++) {
        if (!(branches & (br ? PS_CYCLE_VALUE : PS_CYCLE_KEY))) continue;
        for (int g = g0; g < g1; g++) {
            int bad = 0;
            if (params & PS_CYCLE_GATE)
                bad = ps_roll_blocks(ctx, br ? p.value_gate_w : p.key_gate_w, W, nkv * d, g * d, d, k) ||
                      ps_roll_blocks(ctx, br ? p.value_gate_b : p.key_gate_b, W, nkv, g, 1, k);
            if (!bad && (params & PS_CYCLE_PAYLOAD))
                bad = ps_roll_blocks(ctx, br ? p.value_payload : p.key_payload, W, nkv * hd * d, g * hd * d, hd * d, k);
            if (bad) {
                ps_ctx_check(ctx, err);
                return ps_fail_prefix(err, "cycling layer %d's per-offset parameters (W = %lld): ", layer, (long long)W);
            }
        }
    }
    return 0;
}

/* ---- the controlled model's entries (runtime.c's table) ---- */

int ps_model_cycle_check(const ps_runtime *rt, ps_cycle_req *q, ps_error *err) {
    static const char *const BRANCHES[] = {"key", "value", "both", NULL}, *const PARAMS[] = {"gate", "payload", "all", NULL};
    ps_model *m = rt->model;
    const ps_config *c = &m->cfg;
    int bi = 2, pi = -1;
    if ((q->branch && ps_choice("--branch", q->branch, BRANCHES, &bi, err)) || (q->params && ps_choice("--params", q->params, PARAMS, &pi, err)))
        return -1;
    int64_t layer = q->layer, head = q->head;
    int branches = bi == 0 ? PS_CYCLE_KEY : bi == 1 ? PS_CYCLE_VALUE : PS_CYCLE_KEY | PS_CYCLE_VALUE;
    int params = pi < 0 ? 0 : pi == 0 ? PS_CYCLE_GATE : pi == 1 ? PS_CYCLE_PAYLOAD : PS_CYCLE_GATE | PS_CYCLE_PAYLOAD;
    /* a layer or head the model does not have is a usage error; without --model, say which model that is */
    const char *note = q->note ? q->note : "";
    if (c->kind != PS_ATTN_FULL && (layer < 0 || layer >= c->n_layers)) {
        if (note[0]) {
            char valid[64];
            if (c->n_layers == 1) snprintf(valid, sizeof valid, "--layer 0");
            else snprintf(valid, sizeof valid, "--layer 0..%lld", (long long)c->n_layers - 1);
            return ps_fail_usage(err, "--layer %lld: out of range: no --model given, so this is %s, which has %lld layer%s: valid %s (or "
                                      "pass --model DIR)",
                                 (long long)layer, note, (long long)c->n_layers, c->n_layers == 1 ? "" : "s", valid);
        }
        return ps_fail_usage(err, "--layer %lld: out of range (the model has %lld layers, 0..%lld)", (long long)layer,
                             (long long)c->n_layers, (long long)c->n_layers - 1);
    }
    if (c->kind != PS_ATTN_FULL && head >= c->n_kv_heads) {
        if (note[0])
            return ps_fail_usage(err, "--head %lld: out of range: no --model given, so this is %s, which has %lld KV heads: valid --head "
                                      "0..%lld (or pass --model DIR)",
                                 (long long)head, note, (long long)c->n_kv_heads, (long long)c->n_kv_heads - 1);
        return ps_fail_usage(err, "--head %lld: out of range (the model has %lld KV heads, 0..%lld)", (long long)head,
                             (long long)c->n_kv_heads, (long long)c->n_kv_heads - 1);
    }
    /* default: every per-offset parameter the model has (gates and payloads move together) */
    if (!params && c->kind == PS_ATTN_COMPRESSED) {
        if (c->gate != PS_GATE_UNIFORM) params |= PS_CYCLE_GATE;
        if (c->payload != PS_PAYLOAD_SHARED) params |= PS_CYCLE_PAYLOAD;
        if (!params)
            return ps_fail(err, "--model %s: the model's gate is uniform and its payload shared: it has no per-offset parameters to cycle",
                           q->model_dir);
    }
    if (!params) params = PS_CYCLE_GATE;
    /* the cycle's preconditions (a bad model fails before any sweep): cycling by 0 checks them and changes nothing */
    if (ps_gate_cycle(m, (int)layer, (int)head, branches, params, 0, err)) {
        if (strncmp(err->msg, "--", 2)) return ps_fail_prefix(err, "--model %s: ", q->model_dir);
        err->usage = 1; /* the message names the flag at fault */
        return -1;
    }
    if (q->per_head && c->kind != PS_ATTN_COMPRESSED) {
        return ps_fail_usage(err, "--measure knockout: the model has no compressed cache to cycle");
    }
    q->branches = branches;
    q->params_mask = params;
    return 0;
}

int ps_model_cycle(const ps_runtime *rt, const ps_cycle_req *q, int64_t k, ps_error *err) {
    return ps_gate_cycle(rt->model, (int)q->layer, (int)q->head, q->branches, q->params_mask, k, err);
}

int ps_model_cycle_meta(const ps_runtime *rt, const ps_cycle_req *q, json_t *meta, ps_error *err) {
    const ps_config *c = &((const ps_model *)rt->model)->cfg;
    int64_t layer = q->layer, head = q->head, nkv = c->n_kv_heads;
    int branches = q->branches, params = q->params_mask;
    json_t *hl = json_array();
    for (int64_t g = head < 0 ? 0 : head; g < (head < 0 ? nkv : head + 1); g++) json_array_append_new(hl, json_integer(g));
    const char *br = branches == 3 ? "both" : branches == 1 ? "key" : "value";
    const char *pa = params == 3 ? "all" : params == 1 ? "gate" : "payload";
    json_t *cy = json_pack("{s:I, s:I, s:o, s:o, s:s, s:s}", "layer", (json_int_t)layer, "shift", (json_int_t)q->shift, "head",
                           head < 0 ? json_string("all") : json_integer(head), "heads", hl, "branch", br, "params", pa);
    /* the summary line: what was cycled */
    char line[512], hs[64];
    if (head >= 0) snprintf(hs, sizeof hs, "KV head %lld", (long long)head);
    else if (nkv == 1) snprintf(hs, sizeof hs, "KV head 0 (all)");
    else snprintf(hs, sizeof hs, "KV heads 0-%lld (all)", (long long)nkv - 1);
    if (c->kind == PS_ATTN_CHANNEL) /* the channel attention: its position bias is the per-slot parameter */
        snprintf(line, sizeof line, "cycled layer %lld: the compressor's position bias (ape) rolled by %lld (mod the rate %lld)",
                 (long long)layer, (long long)q->shift, (long long)c->rate);
    else
        snprintf(line, sizeof line, "cycled layer %lld, %s, %s %s by %lld", (long long)layer, hs, branches == 3 ? "key and value" : br,
                 params == 3 ? "gates and payloads" : params == 1 ? "gates" : "payloads", (long long)q->shift);
    if (!cy || json_object_set_new(meta, "cycle", cy) || json_object_set_new(meta, "summary", json_string(line)) ||
        json_object_set_new(meta, "summary_means", json_false()) ||
        json_object_set_new(meta, "gates_without_payloads",
                            json_boolean(params == PS_CYCLE_GATE && c->kind == PS_ATTN_COMPRESSED && c->payload != PS_PAYLOAD_SHARED)))
        return ps_fail(err, "out of memory for the cycle's description");
    return 0;
}
