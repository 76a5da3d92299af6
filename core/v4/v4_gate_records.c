/* v4_gate_records.c — DeepSeek-V4's gate statistics as data (the family's gates / gate_taps entries, in its table
 * core/v4/v4_family.c): per compressed layer its compressor's gates and, CSA, its indexer's. */
#include <stdio.h>
#include <string.h>

#include "core/family_entries.h"
#include "core/runtime.h"
#include "core/v4/v4_config.h"
#include "core/v4/v4_hooks.h"
#include "core/v4/v4_model.h"

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
                        .layout = ps_gate_layout_new("deepseek_v4", BR, 2, (int)c->n_layers)};
    for (int l = 0; l < c->n_layers && g->layout; l++) {
        if (c->attn_type[l] == PS_V4_SLIDING) continue;
        int csa = c->attn_type[l] == PS_V4_CSA;
        int64_t mr = c->compress_rate[l];
        const char *an = csa ? "csa" : "hca";
        ps_gate_layout_add(g->layout, l, 0, csa ? 2 * mr : mr, c->head_dim, csa, mr, an);
        if (csa) ps_gate_layout_add(g->layout, l, 1, 2 * mr, c->index_head_dim, 1, mr, an);
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
