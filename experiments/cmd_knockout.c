/* cmd_knockout.c — `phasescope knockout`: the mean-replacement KV-head knockout grid. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd_v4.h"
#include "instrument.h"
#include "knockout.h"

static int run(const ps_args *a, ps_error *err);

static const ps_flag_spec FLAGS[] = {
    {"--layers", "LIST", "layers, e.g. 0,2-3 (default: all)", 0},
    {"--heads", "LIST", "KV heads (default: all); DeepSeek-V4 --target heads: query heads", 0},
    {"--target", "raw|compressed|both",
     "compressed (default for compressed models): hook_ck and hook_cv; raw (default for\n"
     "full attention): hook_k and hook_v; both. DeepSeek-V4 checkpoints: heads, compressed\n"
     "(default), raw, indexer or sink (docs/results-schema.md)",
     0},
    PS_INSTR_FLAGS,
    PS_V4_TASK_FLAG,
    {0},
};

const ps_command ps_cmd_knockout = {
    .name = "knockout",
    .summary = "mean-replacement KV-head knockout grid, per residue",
    .description =
        "Mean-replacement KV-head knockout (docs/results-schema.md, `knockout.json`): for every chosen layer l and KV head g, that head's entries\n"
        "are replaced by their mean over the evaluation prompts of the same shift, position by position, and the\n"
        "prefix-padding sweep is run. Reports per (layer, head, residue) the change in accuracy (pp) and in mean\n"
        "target NLL against the clean run, and each head's worst residue (the largest accuracy drop). Writes\n"
        "OUT/knockout.json.\n",
    .flags = FLAGS,
    .run = run,
};

/* A list flag sized to the model; the error adds how many the model has ("(the model has 2 layers)"). */
static int model_list(const ps_args *a, const char *flag, int64_t count, const char *what, int *out, int *n, ps_error *err) {
    const char *v = ps_args_get(a, flag);
    if (!v) {
        for (*n = 0; *n < count; (*n)++) out[*n] = *n;
        return 0;
    }
    if (!ps_cli_int_list(flag, v, 0, count - 1, out, (int)count, n, err)) return 0;
    char m[PS_ERROR_MAX];
    snprintf(m, sizeof m, "%s", err->msg);
    return ps_cli_usage(err, "%.900s (the model has %lld %s)", m, (long long)count, what);
}

static int run(const ps_args *a, ps_error *err) {
    if (ps_v4_instr_wanted(a)) return ps_v4_cmd_knockout(a, err); /* DeepSeek-V4 checkpoint: experiments/cmd_v4_instr.c */
    ps_instr in = {0};
    ps_knockout_result r = {0};
    json_t *res = NULL;
    int rc = 1, *layers = NULL, *heads = NULL, nl = 0, nh = 0, *order = NULL;
    if (ps_instr_setup(&in, a, 1, err)) goto done;
    const ps_config *c = &in.m.cfg;
    /* a config may have up to 2^24 layers or KV heads: the lists are sized to the model */
    layers = malloc((size_t)c->n_layers * sizeof(int));
    heads = malloc((size_t)c->n_kv_heads * sizeof(int));
    if (!layers || !heads) {
        ps_fail(err, "out of memory for the lists of %lld layers and %lld KV heads", (long long)c->n_layers, (long long)c->n_kv_heads);
        goto done;
    }
    static const char *const TARGETS[] = {"raw", "compressed", "both", NULL};
    static const ps_ko_target TARGET_OF[] = {PS_KO_RAW, PS_KO_COMPRESSED, PS_KO_BOTH};
    int ti = c->kind != PS_ATTN_FULL ? 1 : 0;
    if (ps_args_choice(a, "--target", TARGETS, &ti, err)) goto done;
    ps_ko_target target = TARGET_OF[ti];
    if (model_list(a, "--layers", c->n_layers, "layers", layers, &nl, err) ||
        model_list(a, "--heads", c->n_kv_heads, "KV heads", heads, &nh, err))
        goto done;
    if (ps_knockout_grid(&in.m, &in.base, &in.task, in.fam, in.P, in.seed, in.batch, layers, nl, heads, nh, target, 0, &r,
                         ps_instr_progress, &in, err)) {
        ps_progress_end(&in.bar);
        goto done;
    }
    ps_progress_end(&in.bar);
    res = json_object();
    json_object_set_new(res, "kind", json_string("knockout"));
    json_object_set_new(res, "provenance", ps_instr_provenance(&in, "pad"));
    json_t *grid = ps_knockout_json(&r, target, err);
    if (!grid) goto done;
    json_object_set_new(res, "grid", grid);
    if (ps_instr_write(&in, "knockout.json", res, err)) goto done;
    /* every head with the residue it hurts most (a head that kills one residue can have a small mean),
     * worst first */
    json_t *cells = json_object_get(grid, "cells");
    size_t ncell = json_array_size(cells);
    order = malloc((ncell ? ncell : 1) * sizeof(int));
    if (!order) {
        ps_fail(err, "out of memory for the order of %zu cells", ncell);
        goto done;
    }
    for (size_t i = 0; i < ncell; i++) order[i] = (int)i;
#define WORST_DA(i) json_number_value(json_object_get(json_object_get(json_array_get(cells, (size_t)order[i]), "worst_residue"), "delta_accuracy_pp"))
#define MEAN_DNLL(i) json_number_value(json_object_get(json_array_get(cells, (size_t)order[i]), "mean_delta_nll"))
    for (size_t i = 1; i < ncell; i++) /* insertion sort: worst-residue drop, then mean dNLL */
        for (size_t j = i; j > 0 && (WORST_DA(j) < WORST_DA(j - 1) - 1e-9 ||
                                     (fabs(WORST_DA(j) - WORST_DA(j - 1)) <= 1e-9 && MEAN_DNLL(j) > MEAN_DNLL(j - 1)));
             j--) {
            int t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    printf("clean mean accuracy %.3f; per head, the residue it hurts most (worst first):\n",
           json_number_value(json_object_get(json_object_get(grid, "clean"), "mean_accuracy")));
    size_t show = ncell < 32 ? ncell : 32;
    for (size_t i = 0; i < show; i++) {
        json_t *cell = json_array_get(cells, (size_t)order[i]), *w = json_object_get(cell, "worst_residue");
        printf("  layer %lld head %lld: worst rho %lld: %.3f -> %.3f (%+.1f pp, dNLL %+.3f); mean dacc %+.1f pp, mean dNLL %+.3f\n",
               (long long)json_integer_value(json_object_get(cell, "layer")),
               (long long)json_integer_value(json_object_get(cell, "head")),
               (long long)json_integer_value(json_object_get(w, "rho")), json_number_value(json_object_get(w, "clean_accuracy")),
               json_number_value(json_object_get(w, "accuracy")), json_number_value(json_object_get(w, "delta_accuracy_pp")),
               json_number_value(json_object_get(w, "delta_nll")),
               json_number_value(json_object_get(cell, "mean_delta_accuracy_pp")),
               json_number_value(json_object_get(cell, "mean_delta_nll")));
    }
    if (show < ncell) printf("  ... %zu more heads in knockout.json\n", ncell - show);
    rc = 0;
done:
    free(order);
    free(layers);
    free(heads);
    json_decref(res);
    ps_knockout_result_free(&r);
    ps_instr_free(&in);
    return rc;
}
