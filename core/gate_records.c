/* gate_records.c — the controlled model's gate statistics as data (runtime.h: ps_gate_info, ps_gate_tap and the
 * family's gates / gate_taps entries), which interventions/' one gate-records path (units.h, ps_gate_units) and the
 * gates instrument read: the per-head gates of the compressed attention (records of three ints: layer, branch,
 * windows) and the channel attention's per-channel compressor gates (records of four ints: layer, branch,
 * sequences, windows, with the accumulator's layout, ps_gate_layout_new). DeepSeek-V4's are
 * core/v4/v4_gate_records.c. */
#include <stdio.h>
#include <string.h>

#include "core/runtime.h"
#include "core/family_entries.h"

/* The layout of per-channel gates (gates/chgates.h's accumulator, as interventions/units.h's
 * ps_chgate_layout_acc reads it back): {"model", "branches": [names], "n_layers", "gates": [[layer, branch,
 * S, d, skip_first, rate, attention], ...]} in layer, then branch order. */
json_t *ps_gate_layout_new(const char *model, const char *const *branches, int n_branches, int n_layers) {
    json_t *br = json_array();
    for (int b = 0; b < n_branches; b++) json_array_append_new(br, json_string(branches[b]));
    return json_pack("{s:s, s:o, s:i, s:o}", "model", model, "branches", br, "n_layers", n_layers, "gates", json_array());
}

void ps_gate_layout_add(json_t *layout, int l, int b, int64_t S, int64_t d, int skip_first, int64_t rate, const char *attention) {
    json_array_append_new(json_object_get(layout, "gates"),
                          json_pack("[i, i, I, I, i, I, s]", l, b, (json_int_t)S, (json_int_t)d, skip_first, (json_int_t)rate, attention));
}

/* ---- the controlled model ---- */

static const ps_config *cfg_of(const ps_runtime *rt) { return &((const ps_model *)rt->model)->cfg; }

int ps_model_gates(const ps_runtime *rt, ps_gate_info *g, char *why, size_t n) {
    const ps_config *c = cfg_of(rt);
    memset(g, 0, sizeof *g);
    if (c->kind != PS_ATTN_COMPRESSED && c->kind != PS_ATTN_CHANNEL) {
        snprintf(why, n, "gate statistics need a compressed-attention model (this one has full attention)");
        return 1;
    }
    if (c->kind == PS_ATTN_COMPRESSED) { /* per-head gates: the finish makes their accumulator from the config */
        *g = (ps_gate_info){.records = "events", .ints = PS_GATE_REC_WINDOWS, .log = PS_GATE_LOG_HEADS,
                            .log_layers = c->n_layers, .log_heads = c->n_kv_heads};
        return 0;
    }
    /* the channel attention: one compressor per layer ("gates.model" "v4", as the results have always said) */
    static const char *const BR[] = {"compressor"};
    int csa = c->v4_mode == PS_V4_MODE_CSA;
    *g = (ps_gate_info){.records = "ch_events", .ints = PS_GATE_REC_SEQ_WINDOWS, .log = PS_GATE_LOG_CHANNELS,
                        .layout = ps_gate_layout_new("v4", BR, 1, (int)c->n_layers)};
    for (int l = 0; l < c->n_layers && g->layout; l++)
        ps_gate_layout_add(g->layout, l, 0, ps_config_v4_slots(c), c->head_dim, csa, c->rate, csa ? "csa" : "hca");
    return 0;
}

int ps_model_gate_taps(const ps_runtime *rt, int64_t n, int64_t T, ps_gate_tap *taps) {
    const ps_config *c = cfg_of(rt);
    int64_t nW = ps_config_n_windows(c, T);
    int k = 0;
    for (int l = 0; l < c->n_layers; l++) {
        if (c->kind == PS_ATTN_CHANNEL) { /* fires only when the layer has windows */
            if (nW > 0) taps[k++] = (ps_gate_tap){l, PS_HOOK_GATE_K, 0, n * nW * ps_config_v4_slots(c) * c->head_dim};
        } else if (c->kind == PS_ATTN_COMPRESSED) {
            int64_t f = n * nW * c->n_kv_heads * c->window;
            taps[k++] = (ps_gate_tap){l, PS_HOOK_GATE_K, 0, f}; /* branch: ps_branch's key 0, value 1 */
            taps[k++] = (ps_gate_tap){l, PS_HOOK_GATE_V, 1, f};
        }
    }
    return k;
}

