/* cmd_knockout.c — `phasescope knockout`: the mean-replacement KV-head knockout grid. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "experiments/cmd_v4.h"
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

/* Outcomes into the partial result: a batch's clean run (with the residues) in its unit with li = 0, a
 * cell's in its (shift, batch, layer) unit, head after head. */
typedef struct {
    ps_partial *p;
    int nh;
} ko_rec;

enum { KO_RHO, KO_CLEAN_OK, KO_CLEAN_LP, KO_CELL_OK, KO_CELL_LP };

static void ko_record(void *user, int64_t unit, int cell, int64_t first, const ps_shifted *set, const int *ok,
                      const double *lp) {
    ko_rec *r = user;
    int64_t maxq = set->b.max_q;
    if (cell < 0) {
        int32_t *rho = ps_partial_at(r->p, KO_RHO, unit), *cok = ps_partial_at(r->p, KO_CLEAN_OK, unit);
        double *clp = ps_partial_at(r->p, KO_CLEAN_LP, unit);
        for (int64_t i = 0; i < set->b.B; i++)
            for (int64_t q = 0; q < maxq; q++) {
                int64_t k = i * maxq + q, o = first * maxq + k;
                int scored = q < set->b.n_q[i] && set->residue[k] >= 0;
                rho[o] = scored ? (int32_t)set->residue[k] : -1;
                cok[o] = scored ? ok[k] : 0;
                clp[o] = scored ? lp[k] : 0.0;
            }
        return;
    }
    int64_t n_unit = ps_partial_count(r->p, KO_CELL_OK, unit) / (r->nh * maxq), hi = cell % r->nh;
    int32_t *cok = (int32_t *)ps_partial_at(r->p, KO_CELL_OK, unit) + (hi * n_unit + first) * maxq;
    double *clp = (double *)ps_partial_at(r->p, KO_CELL_LP, unit) + (hi * n_unit + first) * maxq;
    for (int64_t i = 0; i < set->b.B; i++)
        for (int64_t q = 0; q < maxq; q++) {
            int64_t k = i * maxq + q;
            int scored = q < set->b.n_q[i] && set->residue[k] >= 0;
            cok[k] = scored ? ok[k] : 0;
            clp[k] = scored ? lp[k] : 0.0;
        }
}

/* The grid's work: units (shift, batch, layer) of ps_knockout_grid_opts; a split run gathers the outcomes
 * and ps_knockout_finish adds them up in the one-process order. */
static int run(const ps_args *a, ps_error *err) {
    if (ps_v4_instr_wanted(a)) { /* DeepSeek-V4 checkpoint: experiments/cmd_v4_instr.c, whole on rank 0 */
        int r = ps_instr_whole_begin(a, "the knockout grid of a DeepSeek-V4 checkpoint", err);
        return ps_instr_whole_end(r == 1 ? ps_v4_cmd_knockout(a, err) : r, err) ? 1 : 0;
    }
    ps_instr in = {0};
    ps_partial part = {0};
    ps_instr_work wk = {0};
    ps_knockout_result r = {0};
    int rc = 1, *layers = NULL, *heads = NULL, nl = 0, nh = 0;
    int64_t *w = NULL;
    unsigned char *snap = NULL;
    int bad = ps_instr_setup(&in, a, 1, err);
    const ps_config *c = &in.m.cfg;
    ps_ko_target target = PS_KO_COMPRESSED;
    if (!bad) {
        /* a config may have up to 2^24 layers or KV heads: the lists are sized to the model */
        layers = malloc((size_t)c->n_layers * sizeof(int));
        heads = malloc((size_t)c->n_kv_heads * sizeof(int));
        if (!layers || !heads)
            bad = ps_fail(err, "out of memory for the lists of %lld layers and %lld KV heads", (long long)c->n_layers,
                          (long long)c->n_kv_heads);
    }
    if (!bad) {
        static const char *const TARGETS[] = {"raw", "compressed", "both", NULL};
        static const ps_ko_target TARGET_OF[] = {PS_KO_RAW, PS_KO_COMPRESSED, PS_KO_BOTH};
        int ti = c->kind != PS_ATTN_FULL ? 1 : 0;
        bad = ps_args_choice(a, "--target", TARGETS, &ti, err) ||
              model_list(a, "--layers", c->n_layers, "layers", layers, &nl, err) ||
              model_list(a, "--heads", c->n_kv_heads, "KV heads", heads, &nh, err);
        target = TARGET_OF[ti];
        if (!bad && (target & PS_KO_COMPRESSED) && c->kind == PS_ATTN_FULL)
            bad = ps_fail(err, "--target %s: a full-attention model has no compressed entries (use --target raw)",
                          target == PS_KO_BOTH ? "both" : "compressed");
    }
    if (ps_dist_agree(bad, err)) goto done;
    /* layers top-down, the order the grid visits them */
    for (int i = 0; i < nl; i++)
        for (int j = i + 1; j < nl; j++)
            if (layers[j] > layers[i]) {
                int t = layers[i];
                layers[i] = layers[j];
                layers[j] = t;
            }
    /* every rank groups its cells as rank 0 would alone: rank 0's memory budget */
    ps_knockout_opts opts = {.mem_bytes = ps_knockout_default_budget()};
    if (ps_dist_bcast(&opts.mem_bytes, sizeof opts.mem_bytes, 0, err)) goto done;
    int64_t N = in.base.B, maxq = in.base.max_q, B = in.batch < N ? in.batch : N;
    int64_t nu = ps_knockout_n_units(N, in.batch, in.P, nl), L = c->n_layers;
    json_t *jl = json_array(), *jh = json_array();
    for (int i = 0; i < nl; i++) json_array_append_new(jl, json_integer(layers[i]));
    for (int i = 0; i < nh; i++) json_array_append_new(jh, json_integer(heads[i]));
    json_t *meta = json_pack("{s:o, s:I, s:s, s:o, s:o, s:I}", "provenance", ps_instr_provenance(&in, "pad"), "period",
                             (json_int_t)in.P, "target",
                             target == PS_KO_RAW ? "raw" : target == PS_KO_COMPRESSED ? "compressed" : "both", "layers", jl,
                             "heads", jh, "max_q", (json_int_t)maxq);
    w = malloc((size_t)(nu ? nu : 1) * sizeof *w);
    snap = calloc((size_t)(nu ? nu : 1), 1);
    if (!w || !snap) {
        json_decref(meta);
        ps_fail(err, "out of memory for %lld work units", (long long)nu);
        goto done;
    }
    if (ps_instr_partial_init(&in, &part, nu, meta, err)) goto done;
    int64_t p_, i0, n;
    int li;
    for (int64_t u = 0; u < nu; u++) {
        ps_knockout_unit(N, in.batch, nl, u, &p_, &i0, &n, &li);
        w[u] = li == 0 ? n * maxq : 0;
    }
    if (ps_partial_add(&part, "rho", PS_PART_I32, w, err) < 0 || ps_partial_add(&part, "clean_ok", PS_PART_I32, w, err) < 0 ||
        ps_partial_add(&part, "clean_logprob", PS_PART_F64, w, err) < 0)
        goto done;
    for (int64_t u = 0; u < nu; u++) {
        ps_knockout_unit(N, in.batch, nl, u, &p_, &i0, &n, &li);
        w[u] = nh * n * maxq;
    }
    if (ps_partial_add(&part, "cell_ok", PS_PART_I32, w, err) < 0 || ps_partial_add(&part, "cell_logprob", PS_PART_F64, w, err) < 0)
        goto done;
    /* weights in 1/64 of a prompt's forward: a shift's mean pass (its first unit: every prompt), a batch's
     * clean forward (its li = 0 unit), a cell restarted at layer l about (L - 1 - l) / L of a forward plus
     * its answer rows; a range that begins inside a shift pays its mean pass again: boundaries move to a
     * shift start when that costs less */
    for (int64_t u = 0; u < nu; u++) {
        ps_knockout_unit(N, in.batch, nl, u, &p_, &i0, &n, &li);
        int64_t cell = 64 * (L - 1 - layers[li]) / L + 8;
        w[u] = n * nh * cell + (li == 0 ? 64 * n : 0);
        if (li == 0 && i0 == (N - 1) / B * B) {
            w[u] += 64 * N;
            snap[u] = 1;
        }
    }
    if (ps_instr_split(&in, w, snap, nu, 64 * N, &wk, err)) goto done;
    ko_rec rec = {.p = &part, .nh = nh};
    opts.unit0 = wk.u0;
    opts.unit1 = wk.u1;
    opts.record = ko_record;
    opts.record_user = &rec;
    int rr = 0;
    if (wk.u1 > wk.u0) { /* an empty range runs nothing (unit1 = 0 would mean every unit) */
        rr = ps_knockout_grid_opts(&in.m, &in.base, &in.task, in.fam, in.P, in.seed, in.batch, layers, nl, heads, nh, target,
                                   &opts, &r, ps_instr_progress, &in, err);
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
    json_t *res = NULL, *jl = json_object_get(p->meta, "layers"), *jh = json_object_get(p->meta, "heads");
    int rc = -1, *layers = NULL, *heads = NULL, *order = NULL;
    int nl = (int)json_array_size(jl), nh = (int)json_array_size(jh);
    int64_t P = json_integer_value(json_object_get(p->meta, "period")), maxq = json_integer_value(json_object_get(p->meta, "max_q"));
    const char *tg = json_string_value(json_object_get(p->meta, "target"));
    ps_ko_target target = tg && !strcmp(tg, "raw") ? PS_KO_RAW : tg && !strcmp(tg, "both") ? PS_KO_BOTH : PS_KO_COMPRESSED;
    if (nl < 1 || nh < 1 || P < 1 || maxq < 1 || !tg || p->n_arr != 5 || p->n_units % nl)
        return ps_fail(err, "a knockout grid's partial result lacks its layers, heads, period or outcomes");
    layers = malloc((size_t)nl * sizeof(int));
    heads = malloc((size_t)nh * sizeof(int));
    if (!layers || !heads) {
        ps_fail(err, "out of memory");
        goto done;
    }
    for (int i = 0; i < nl; i++) layers[i] = (int)json_integer_value(json_array_get(jl, (size_t)i));
    for (int i = 0; i < nh; i++) heads[i] = (int)json_integer_value(json_array_get(jh, (size_t)i));
    if (ps_knockout_result_init(&r, P, layers, nl, heads, nh, err)) goto done;
    /* the one-process order: shifts, batches from the last, the clean run, then each layer's cells */
    const int32_t *rho = NULL;
    int64_t n_items = 0;
    for (int64_t u = 0; u < p->n_units; u++) {
        int li = (int)(u % nl);
        if (li == 0) {
            rho = ps_partial_at(p, KO_RHO, u);
            n_items = ps_partial_count(p, KO_RHO, u);
            ps_residue_stats_add_items(&r.clean, ps_partial_at(p, KO_CLEAN_OK, u), ps_partial_at(p, KO_CLEAN_LP, u), rho, n_items);
        }
        if (ps_partial_count(p, KO_CELL_OK, u) != nh * n_items) {
            ps_fail(err, "a knockout grid's partial result: unit %lld has %lld cell outcomes, expected %lld", (long long)u,
                    (long long)ps_partial_count(p, KO_CELL_OK, u), (long long)(nh * n_items));
            goto done;
        }
        for (int hi = 0; hi < nh; hi++)
            ps_residue_stats_add_items(&r.cells[li * nh + hi], (const int32_t *)ps_partial_at(p, KO_CELL_OK, u) + hi * n_items,
                                       (const double *)ps_partial_at(p, KO_CELL_LP, u) + hi * n_items, rho, n_items);
    }
    res = json_object();
    json_object_set_new(res, "kind", json_string("knockout"));
    json_object_set(res, "provenance", json_object_get(p->meta, "provenance"));
    json_t *grid = ps_knockout_json(&r, target, err);
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
    free(layers);
    free(heads);
    json_decref(res);
    ps_knockout_result_free(&r);
    return rc;
}
