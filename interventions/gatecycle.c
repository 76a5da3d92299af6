#include "gatecycle.h"

#include <stdlib.h>
#include <string.h>

/* roll rows: x holds W blocks of `stride` floats; for each block i the `len` floats at `off` move to block
 * (i + k) mod W */
static int roll(float *x, int64_t W, int64_t stride, int64_t off, int64_t len, int64_t k) {
    float *tmp = malloc((size_t)(W * len) * sizeof(float));
    if (!tmp) return -1;
    for (int64_t i = 0; i < W; i++) memcpy(tmp + i * len, x + i * stride + off, (size_t)len * sizeof(float));
    for (int64_t i = 0; i < W; i++) {
        int64_t src = ((i - k) % W + W) % W;
        memcpy(x + i * stride + off, tmp + src * len, (size_t)len * sizeof(float));
    }
    free(tmp);
    return 0;
}

int ps_gate_cycle(ps_model *m, int layer, int head, int branches, int params, int64_t k, ps_error *err) {
    const ps_config *c = &m->cfg;
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
    for (int br = 0; br < 2; br++) {
        if (!(branches & (br ? PS_CYCLE_VALUE : PS_CYCLE_KEY))) continue;
        for (int g = g0; g < g1; g++) {
            int bad = 0;
            if (params & PS_CYCLE_GATE) {
                bad |= roll(br ? p.value_gate_w : p.key_gate_w, W, nkv * d, g * d, d, k);
                bad |= roll(br ? p.value_gate_b : p.key_gate_b, W, nkv, g, 1, k);
            }
            if (params & PS_CYCLE_PAYLOAD) bad |= roll(br ? p.value_payload : p.key_payload, W, nkv * hd * d, g * hd * d, hd * d, k);
            if (bad) return ps_fail(err, "out of memory");
        }
    }
    return 0;
}
