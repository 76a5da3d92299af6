/* sweep_table.c — the summary table of several sweep results (viz/sweep_table.h; `phasescope table`). */
#include "viz/sweep_table.h"

#include <jansson.h>
#include <libgen.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fileio.h"
#include "core/runtime.h"
#include "viz/draw.h"
#include "viz/results_check.h"
#include "viz/tradeoff.h"

char *ps_sweep_table(const char *const *pos, int npos, const char *fig, size_t *len_out, ps_error *err) {
    size_t cap = 65536, len = 0;
    char *out = malloc(cap);
    int rc = 1;
    if (!out) {
        ps_fail(err, "out of memory for the table");
        goto done;
    }
    if (npos == 0) {
        ps_fail(err, "no sweep result given");
        err->usage = 1;
        goto done;
    }
    len += (size_t)snprintf(out + len, cap - len,
                            "| model | attention | period P | mean accuracy | min over residues | gap (pp) | repeats every | "
                            "dominant period | chi-square p |\n|---|---|---|---|---|---|---|---|---|\n");
    if (fig && npos > 64) {
        ps_fail(err, "--figure: at most 64 sweep results");
        err->usage = 1;
        goto done;
    }
    ps_tradeoff_point pts[64];
    int64_t period = 0; /* the sweeps' common period P, -1 when they differ */
    char groups[64][256]; /* 16 KiB on the stack: the points name their group here */
    for (int i = 0; i < npos; i++) {
        json_t *d;
        if (ps_results_load(pos[i], "sweep", &d, err)) goto done;
        json_t *prov = json_object_get(d, "provenance"), *c = json_object_get(d, "curve");
        json_t *att = json_object_get(json_object_get(prov, "config"), "attention");
        ps_model_desc desc;
        char model[1024], attn[sizeof desc.label];
        snprintf(model, sizeof model, "%s", json_string_value(json_object_get(prov, "model")) ?: "?");
        size_t ml = strlen(model);
        while (ml > 1 && model[ml - 1] == '/') model[--ml] = '\0';
        /* the model's label from core (its family reads provenance.config); a served model has no config */
        ps_error derr = {0};
        int described = !ps_model_desc_from_provenance(prov, &desc, &derr);
        if (described) snprintf(attn, sizeof attn, "%s", desc.label);
        else if (!att && json_object_get(prov, "endpoint")) snprintf(attn, sizeof attn, "served (probe)"); /* docs/served-models.md */
        else snprintf(attn, sizeof attn, "? (%.200s)", derr.msg);
        if (fig) { /* the trade-off point: KV bytes per token from the model config of the provenance */
            json_t *cf = json_object_get(prov, "config");
            double per = 2.0 * 4.0 * (double)json_integer_value(json_object_get(cf, "n_layers")) *
                         (double)json_integer_value(json_object_get(cf, "n_kv_heads")) *
                         (double)json_integer_value(json_object_get(cf, "head_dim"));
            if (described) per *= desc.kv_factor;
            int hollow = ps_tradeoff_group(groups[i], sizeof groups[i], basename(model));
            pts[i] = (ps_tradeoff_point){.group = groups[i], .mean = json_number_value(json_object_get(c, "mean_accuracy")),
                                         .gap_pp = json_number_value(json_object_get(c, "gap_pp")), .kv_bytes = per,
                                         .hollow = hollow};
            int64_t np = (int64_t)json_array_size(json_object_get(c, "residues"));
            period = i == 0 || period == np ? np : -1;
        }
        json_t *dp = json_object_get(json_object_get(c, "dominant_period"), "period");
        json_t *rp = json_object_get(json_object_get(c, "repeat_period"), "period");
        char per[32], rep[32];
        if (json_is_number(dp)) snprintf(per, sizeof per, "%.3g", json_number_value(dp));
        else snprintf(per, sizeof per, "none");
        if (json_is_integer(rp)) snprintf(rep, sizeof rep, "%lld", (long long)json_integer_value(rp));
        else snprintf(rep, sizeof rep, json_object_get(c, "repeat_period") ? "none" : "-");
        if (cap - len < 4096) {
            cap *= 2;
            char *grown = realloc(out, cap);
            if (!grown) {
                json_decref(d);
                ps_fail(err, "out of memory for the table");
                goto done;
            }
            out = grown;
        }
        char ptext[32];
        ps_format_p(ptext, sizeof ptext, json_number_value(json_object_get(json_object_get(c, "chi_square"), "p_value")));
        len += (size_t)snprintf(out + len, cap - len, "| %s | %s | %lld | %.3f | %.3f | %.1f | %s | %s | %s |\n", basename(model), attn,
                                (long long)json_array_size(json_object_get(c, "residues")),
                                json_number_value(json_object_get(c, "mean_accuracy")),
                                json_number_value(json_object_get(c, "min_accuracy")), json_number_value(json_object_get(c, "gap_pp")),
                                rep, per, ptext);
        json_decref(d);
    }
    char title[128];
    if (period > 0) snprintf(title, sizeof title, "The weak phase: gap against mean accuracy at P = %lld", (long long)period);
    else snprintf(title, sizeof title, "The weak phase: gap against mean accuracy (several periods)");
    if (fig && ps_fig_tradeoff(fig, title, "phasescope table --figure", pts, npos, err)) goto done;
    rc = 0;
done:
    if (rc) {
        free(out);
        return NULL;
    }
    *len_out = len;
    return out;
}
