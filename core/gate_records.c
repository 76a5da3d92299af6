/* gate_records.c — the two shipped families' gate statistics as data (runtime.h: ps_gate_info, ps_gate_tap and
 * the family's gates / gate_taps entries), which interventions/' one gate-records path (units.h, ps_gate_units)
 * and the gates instrument read: the controlled model's per-head gates of the compressed attention (records of
 * three ints: layer, branch, windows), the channel attention's per-channel compressor gates, and DeepSeek-V4's
 * compressor and indexer gates (records of four ints: layer, branch, sequences, windows, with the
 * accumulator's layout). */
#include <stdio.h>
#include <string.h>

#include "core/runtime.h"
#include "core/v4/v4_config.h"
#include "core/v4/v4_hooks.h"
#include "core/v4/v4_model.h"

/* The layout of per-channel gates (gates/chgates.h's accumulator, as interventions/units.h's
 * ps_chgate_layout_acc reads it back): {"model", "branches": [names], "n_layers", "gates": [[layer, branch,
 * S, d, skip_first, rate, attention], ...]} in layer, then branch order. */
static json_t *layout_new(const char *model, const char *const *branches, int n_branches, int n_layers) {
    json_t *br = json_array();
    for (int b = 0; b < n_branches; b++) json_array_append_new(br, json_string(branches[b]));
    return json_pack("{s:s, s:o, s:i, s:o}", "model", model, "branches", br, "n_layers", n_layers, "gates", json_array());
}

static void layout_add(json_t *layout, int l, int b, int64_t S, int64_t d, int skip_first, int64_t rate, const char *attention) {
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
                        .layout = layout_new("v4", BR, 1, (int)c->n_layers)};
    for (int l = 0; l < c->n_layers && g->layout; l++)
        layout_add(g->layout, l, 0, ps_config_v4_slots(c), c->head_dim, csa, c->rate, csa ? "csa" : "hca");
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

/* ---- DeepSeek-V4: per compressed layer its compressor's gates (branch 0) and, CSA, its indexer's (1) ---- */

static const ps_v4_config *v4_of(const ps_runtime *rt) { return &((const ps_v4_model *)rt->model)->cfg; }

int ps_v4_gates(const ps_runtime *rt, ps_gate_info *g, char *why, size_t n) {
    const ps_v4_model *m = rt->model;
    const ps_v4_config *c = &m->cfg;
    memset(g, 0, sizeof *g);
    int any = 0;
    for (int l = 0; l < c->n_layers; l++) any |= c->attn_type[l] != PS_V4_SLIDING;
    if (!any) {
        snprintf(why, n, "%s: no CSA or HCA layer (every layer is sliding-window attention): there are no gates", m->dir);
        return 1;
    }
    static const char *const BR[] = {"compressor", "indexer"};
    *g = (ps_gate_info){.records = "v4_events", .ints = PS_GATE_REC_SEQ_WINDOWS, .log = PS_GATE_LOG_NONE,
                        .layout = layout_new("deepseek_v4", BR, 2, (int)c->n_layers)};
    for (int l = 0; l < c->n_layers && g->layout; l++) {
        if (c->attn_type[l] == PS_V4_SLIDING) continue;
        int csa = c->attn_type[l] == PS_V4_CSA;
        int64_t mr = c->compress_rate[l];
        const char *an = csa ? "csa" : "hca";
        layout_add(g->layout, l, 0, csa ? 2 * mr : mr, c->head_dim, csa, mr, an);
        if (csa) layout_add(g->layout, l, 1, 2 * mr, c->index_head_dim, 1, mr, an);
    }
    return 0;
}

int ps_v4_gate_taps(const ps_runtime *rt, int64_t n, int64_t T, ps_gate_tap *taps) {
    const ps_v4_config *c = v4_of(rt);
    int k = 0;
    for (int l = 0; l < c->n_layers; l++) {
        if (c->attn_type[l] == PS_V4_SLIDING) continue;
        int csa = c->attn_type[l] == PS_V4_CSA;
        int64_t mr = c->compress_rate[l], nW = ps_v4_n_windows(c, l, T);
        taps[k++] = (ps_gate_tap){l, PS_V4H_C_ALPHA, 0, n * nW * (csa ? 2 * mr : mr) * c->head_dim};
        if (csa) taps[k++] = (ps_gate_tap){l, PS_V4H_I_C_ALPHA, 1, n * nW * 2 * mr * c->index_head_dim};
    }
    return k;
}
