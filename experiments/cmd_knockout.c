/* cmd_knockout.c — `phasescope knockout`: the mean-replacement KV-head knockout grid. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/dist.h"
#include "experiments/instrument.h"
#include "interventions/knockout.h"
#include "interventions/units.h"

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

/* The grid's work: units (shift, batch, layer) of the grid engine (interventions/grid.h), on whatever
 * family the checkpoint is; a split run gathers the outcomes and ps_knockout_finish adds them up in the
 * one-process order. */
static int run(const ps_args *a, ps_error *err) {
    ps_instr in = {0};
    ps_partial part = {0};
    ps_instr_work wk = {0};
    ps_knockout_result r = {0};
    int rc = 1, *layers = NULL, *heads = NULL, nl = 0, nh = 0, target = 0;
    int64_t *w = NULL;
    unsigned char *snap = NULL;
    int bad = ps_instr_setup(&in, a, 1, err);
    const ps_runtime *rt = &in.rt;
    int64_t L = 0, nh_max = 0;
    char why[256];
    if (!bad) {
        L = rt->n_layers;
        target = ps_knockout_default_target(rt);
        const char *tv = ps_args_get(a, "--target");
        if (tv && ps_args_choice(a, "--target", ps_knockout_targets(rt), &target, err)) bad = -1;
    }
    if (!bad) {
        nh_max = ps_knockout_target_heads(rt, target);
        /* a config may have up to 2^24 layers or heads: the lists are sized to the model */
        layers = malloc((size_t)L * sizeof(int));
        heads = malloc((size_t)(nh_max > 0 ? nh_max : 1) * sizeof(int));
        if (!layers || !heads)
            bad = ps_fail(err, "out of memory for the lists of %lld layers and %lld heads", (long long)L, (long long)nh_max);
    }
    const char *tname = bad ? "" : ps_knockout_targets(rt)[target];
    if (!bad && ps_knockout_layer_missing(rt, target, -1, why, sizeof why)) bad = ps_fail(err, "%s", why); /* the model has none */
    if (!bad && ps_args_get(a, "--layers")) {
        bad = model_list(a, "--layers", L, "layers", layers, &nl, err);
        for (int i = 0; i < nl && !bad; i++) {
            const char *m = ps_knockout_layer_missing(rt, target, layers[i], why, sizeof why);
            if (m) bad = ps_cli_usage(err, "--layers: %s", m);
        }
    } else if (!bad) { /* every layer that has what the target replaces */
        const char *first = NULL;
        for (int l = 0; l < L; l++) {
            const char *m = ps_knockout_layer_missing(rt, target, l, why, sizeof why);
            if (!m) layers[nl++] = l;
            else if (!first) first = m;
        }
        if (!nl) bad = ps_cli_usage(err, "%s", first ? why : "no layer has what the target replaces");
    }
    if (!bad && nh_max > 0)
        bad = model_list(a, "--heads", nh_max, rt->ops->ko_heads_what, heads, &nh, err);
    else if (!bad) {
        if (ps_args_get(a, "--heads"))
            bad = ps_cli_usage(err, "--heads: --target %s replaces whole layers (--heads goes with --target heads)", tname);
        heads[0] = 0, nh = 1;
    }
    if (ps_dist_agree(bad, err)) goto done;
    /* every rank groups its cells as rank 0 would alone: rank 0's memory budget */
    ps_knockout_opts opts = {.mem_bytes = ps_knockout_default_budget()};
    if (ps_dist_bcast(&opts.mem_bytes, sizeof opts.mem_bytes, 0, err)) goto done;
    int64_t N = in.base.B, maxq = in.base.max_q;
    int64_t nu = ps_knockout_n_units(N, in.batch, in.P, nl);
    int last_first = ps_grid_last_first(rt);
    /* the layers as the grid visits them: top-down */
    for (int i = 0; i < nl; i++)
        for (int j = i + 1; j < nl; j++)
            if (layers[j] > layers[i]) {
                int t = layers[i];
                layers[i] = layers[j];
                layers[j] = t;
            }
    json_t *jl = json_array(), *jh = json_array();
    for (int i = 0; i < nl; i++) json_array_append_new(jl, json_integer(layers[i]));
    for (int i = 0; i < nh; i++) json_array_append_new(jh, json_integer(heads[i]));
    const char *unit = rt->ops->ko_unit(rt, target);
    json_t *meta = json_pack("{s:o, s:I, s:s, s:o, s:o, s:I, s:b}", "provenance", ps_instr_provenance(&in, "pad"), "period",
                             (json_int_t)in.P, "target", tname, "layers", jl, "heads", jh, "max_q", (json_int_t)maxq,
                             "last_first", last_first);
    if (meta && unit) json_object_set_new(meta, "unit", json_string(unit));
    w = malloc((size_t)(nu ? nu : 1) * sizeof *w);
    snap = calloc((size_t)(nu ? nu : 1), 1);
    if (!w || !snap) {
        json_decref(meta);
        ps_fail(err, "out of memory for %lld work units", (long long)nu);
        goto done;
    }
    if (ps_instr_partial_init(&in, &part, nu, meta, err)) goto done;
    if (ps_knockout_partial_layout(&part, N, in.batch, in.P, nl, nh, maxq, last_first, err)) goto done;
    ps_grid_unit_weights(rt, N, in.batch, in.P, layers, nl, nh, L, w, snap);
    if (ps_instr_split(&in, w, snap, nu, 64 * N, &wk, err)) goto done;
    ps_knockout_recorder rec = {.p = &part, .nh = nh};
    opts.unit0 = wk.u0;
    opts.unit1 = wk.u1;
    opts.record = ps_knockout_record;
    opts.record_user = &rec;
    int rr = 0;
    if (wk.u1 > wk.u0) { /* an empty range runs nothing (unit1 = 0 would mean every unit) */
        ps_knockout_spec ks = {.rt = rt, .base = &in.base, .task = &in.task, .fam = in.fam, .P = in.P, .seed = in.seed,
                               .batch = in.batch, .layers = layers, .n_layers = nl, .heads = heads, .n_heads = nh,
                               .target = target, .opts = opts, .progress = ps_instr_progress, .progress_user = &in};
        rr = ps_knockout_run(&ks, &r, err);
        ps_progress_end(&in.bar);
    }
    int fin = ps_instr_collect(&in, &part, &wk, rr, err);
    if (fin < 0 || (fin == 1 && ps_knockout_finish(&part, in.out_dir, err))) goto done;
    rc = 0;
done:
    free(w);
    free(snap);
    free(layers);
    free(heads);
    ps_instr_work_free(&wk);
    ps_partial_free(&part);
    ps_knockout_result_free(&r);
    ps_instr_free(&in);
    return rc;
}

int ps_knockout_finish(const ps_partial *p, const char *out_dir, ps_error *err) {
    ps_knockout_result r = {0};
    json_t *res = NULL;
    int rc = -1, *order = NULL;
    const char *tg = json_string_value(json_object_get(p->meta, "target")), *unit = json_string_value(json_object_get(p->meta, "unit"));
    if (ps_knockout_from_partial(p, &r, err)) return -1;
    res = json_object();
    json_object_set_new(res, "kind", json_string("knockout"));
    json_object_set(res, "provenance", json_object_get(p->meta, "provenance"));
    json_t *grid = ps_knockout_json(&r, tg, unit, err);
    if (!grid) goto done;
    json_object_set_new(res, "grid", grid);
    if (ps_result_write(out_dir, "knockout.json", res, err)) goto done;
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
    json_decref(res);
    ps_knockout_result_free(&r);
    return rc;
}
