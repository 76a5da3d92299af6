/* instr_recall.c — the selection-recall instrument (instrument.h, ps_recall_command; interventions/recall.h): the
 * set-up and cmd_recall.c's flags checked against the model, the sweep's units with each scored query's selected
 * blocks read, split over shards and ranks, and the finish (rank 0, or `phasescope merge`): recall.json, its figure
 * and the summary. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "instruments/instrument.h"
#include "interventions/recall.h"
#include "interventions/units.h"
#include "scaleout/dist.h"

/* The layers of --layers, or every layer that selects blocks at T tokens; a usage error names the layer (and the
 * family's reason) that selects none. */
static int recall_layers(const ps_instr *in, const ps_args *a, int64_t T, int **out, int *n, ps_error *err) {
    const ps_runtime *rt = &in->rt;
    const ps_family *f = rt->family;
    int64_t L = rt->n_layers;
    const char *title = f->title ? f->title : f->name;
    if (!f->sel.layer) return ps_cli_usage(err, "%s checkpoints select no blocks: recall needs a model with block selection (the select attention kind, MiniCPM4)", title);
    int *l = malloc((size_t)(L > 0 ? L : 1) * sizeof *l);
    if (!l) return ps_fail(err, "out of memory for %lld layers", (long long)L);
    *out = l, *n = 0;
    char why[512] = "";
    ps_select_geom g;
    if (ps_args_get(a, "--layers")) {
        if (ps_cli_int_list("--layers", ps_args_get(a, "--layers"), 0, L - 1, l, (int)L, n, err)) return ps_cli_mark_usage(err);
        for (int i = 0; i < *n; i++)
            if (!f->sel.layer(rt, l[i], T, &g, why, sizeof why))
                return ps_cli_usage(err, "--layers: layer %d selects no blocks at %lld tokens: %s", l[i], (long long)T, why);
        return 0;
    }
    for (int i = 0; i < L; i++)
        if (f->sel.layer(rt, i, T, &g, why, sizeof why)) l[(*n)++] = i;
    if (!*n) return ps_cli_usage(err, "no layer of this %s model selects blocks at %lld tokens: %s", title, (long long)T, why);
    return 0;
}

/* The run: units of the sweep (shift, batch) or of the prompt set's batches, with the codes (recall.h). */
static int recall_run(ps_instr *in, ps_sweep_mode mode, const ps_recall_spec *sp, ps_error *err) {
    ps_partial part = {0};
    ps_instr_work wk = {0};
    int rc = -1;
    const ps_batch *pb = in->prompts ? &in->prompts->b : &in->base;
    int64_t N = pb->B, maxq = pb->max_q, nb = ps_sweep_n_batches(N, in->batch), n_shifts = in->prompts ? 1 : in->P, nu = n_shifts * nb;
    int64_t nc = (int64_t)sp->n_layers * sp->n_kv, B = in->batch < N ? in->batch : N;
    int64_t *w = malloc((size_t)(nu ? nu : 1) * sizeof *w), *wc = malloc((size_t)(nu ? nu : 1) * sizeof *wc);
    json_t *jl = json_array();
    for (int i = 0; i < sp->n_layers; i++) json_array_append_new(jl, json_integer(sp->layers[i]));
    const ps_select_cfg *c = &sp->geom.cfg;
    json_t *sel = json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "kernel", (json_int_t)c->kernel, "stride", (json_int_t)c->stride, "block",
                            (json_int_t)c->block, "topk", (json_int_t)c->topk, "init_blocks", (json_int_t)c->init_blocks, "local_blocks",
                            (json_int_t)c->local_blocks, "n_kv_heads", (json_int_t)sp->n_kv);
    json_t *meta = json_pack("{s:o, s:I, s:o, s:I, s:I, s:o}", "provenance",
                             ps_instr_provenance(in, in->prompts ? NULL : mode == PS_SWEEP_PAD ? "pad" : "move"), "period", (json_int_t)in->P,
                             "layers", jl, "n_kv", (json_int_t)sp->n_kv, "needle_offset", (json_int_t)sp->offset, "selection", sel);
    if (!w || !wc || !meta) {
        json_decref(meta);
        ps_fail(err, "out of memory for %lld work units", (long long)nu);
        goto done;
    }
    for (int64_t u = 0; u < nu; u++) {
        int64_t n = N - u % nb * B < B ? N - u % nb * B : B;
        w[u] = n * maxq;
        wc[u] = n * maxq * nc;
    }
    if (ps_instr_partial_init(in, &part, nu, meta, err) || ps_partial_add(&part, "ok", PS_PART_I32, w, err) < 0 ||
        ps_partial_add(&part, "logprob", PS_PART_F64, w, err) < 0 || ps_partial_add(&part, "rho", PS_PART_I32, w, err) < 0 ||
        ps_partial_add(&part, "codes", PS_PART_I32, wc, err) < 0)
        goto done;
    ps_sweep_unit_weights(N, in->batch, n_shifts, pb->T, mode, w);
    if (ps_instr_split(in, w, NULL, nu, 0, &wk, err)) goto done;
    int r = ps_recall_units(&in->rt, sp, &in->base, &in->task, in->fam, mode, in->P, in->seed, in->prompts, in->batch, wk.u0, wk.u1,
                            part.arr[0].data, part.arr[1].data, part.arr[2].data, part.arr[3].data, ps_instr_progress, in, err);
    ps_progress_end(&in->bar);
    int fin = ps_instr_collect(in, &part, &wk, r, err);
    if (fin < 0 || (fin == 1 && ps_recall_finish(&part, &in->out, err))) goto done;
    rc = 0;
done:
    free(w);
    free(wc);
    ps_instr_work_free(&wk);
    ps_partial_free(&part);
    return rc;
}

int ps_recall_command(const ps_args *a, ps_error *err) {
    ps_instr in = {0};
    ps_recall_spec sp = {0};
    int rc = -1, *layers = NULL, nl = 0, mi = 0;
    int64_t offset = 0;
    static const char *const MODES[] = {"pad", "move", NULL};
    int bad = ps_instr_setup(&in, a, 1, err);
    if (!bad && ps_args_choice(a, "--mode", MODES, &mi, err)) bad = -1;
    if (!bad && in.prompts && ps_args_get(a, "--mode")) bad = ps_cli_usage(err, "--mode: a prompt set is run as given (no shifts)");
    if (!bad && in.prompts && ps_args_get(a, "--family"))
        bad = ps_cli_usage(err, "--family: a prompt set has no fillers (its prompts are as given)");
    if (!bad && in.prompts && !in.pset.needle)
        bad = ps_cli_usage(err, "--prompts %s: selection recall needs each prompt's \"needle\" (the position of the fact its query retrieves)",
                           in.pset.source);
    if (!bad && ps_args_int(a, "--needle-offset", -((int64_t)1 << 30), (int64_t)1 << 30, &offset, err)) bad = -1;
    /* the longest prompts the run makes: every shift of a sweep is at most P - 1 tokens longer than the base */
    int64_t T = bad ? 0 : in.prompts ? in.prompts->b.T : in.base.T + in.P - 1;
    if (!bad) bad = recall_layers(&in, a, T, &layers, &nl, err);
    if (!bad) bad = ps_recall_spec_init(&sp, &in.rt, layers, nl, T, offset, err);
    if (ps_dist_agree(bad, err)) goto done;
    rc = recall_run(&in, mi ? PS_SWEEP_MOVE : PS_SWEEP_PAD, &sp, err) ? -1 : 0;
done:
    ps_recall_spec_free(&sp);
    free(layers);
    ps_instr_free(&in);
    return rc;
}

/* the summary: accuracy, then per layer the residue where the fewest queries have their needle's block found by
 * any head, and the head with the widest recall gap */
static void recall_summary(const ps_out *out, json_t *res) {
    json_t *curve = json_object_get(res, "curve"), *cells = json_object_get(res, "cells"), *lays = json_object_get(res, "layers");
    ps_say(out, "accuracy: mean %.3f, min %.3f, gap %.1f pp\n", json_number_value(json_object_get(curve, "mean_accuracy")),
           json_number_value(json_object_get(curve, "min_accuracy")), json_number_value(json_object_get(curve, "gap_pp")));
    size_t i, k;
    json_t *ly, *c;
    double amn = INFINITY, amx = -INFINITY;
    json_t *e;
    json_array_foreach(json_object_get(res, "any_cell"), i, e) {
        json_t *v = json_object_get(e, "any_cell");
        if (!json_is_number(v)) continue;
        amn = fmin(amn, json_number_value(v));
        amx = fmax(amx, json_number_value(v));
    }
    if (amn <= amx) ps_say(out, "needle's block attended by some recorded head of some layer: %.3f to %.3f over the residues\n", amn, amx);
    json_array_foreach(lays, i, ly) {
        double mn = INFINITY, mx = -INFINITY;
        int64_t at = -1;
        json_t *r;
        json_array_foreach(json_object_get(ly, "residues"), k, r) {
            json_t *v = json_object_get(r, "any_head");
            if (!json_is_number(v)) continue;
            if (json_number_value(v) < mn) mn = json_number_value(v), at = (int64_t)k;
            if (json_number_value(v) > mx) mx = json_number_value(v);
        }
        int64_t layer = json_integer_value(json_object_get(ly, "layer"));
        double gap = -1;
        int64_t head = -1;
        json_array_foreach(cells, k, c) {
            json_t *gp = json_object_get(c, "gap_pp");
            if (json_integer_value(json_object_get(c, "layer")) == layer && json_is_number(gp) && json_number_value(gp) > gap)
                gap = json_number_value(gp), head = json_integer_value(json_object_get(c, "head"));
        }
        if (at < 0) continue;
        ps_say(out, "layer %lld: needle's block found by some head %.3f to %.3f (lowest at ρ %lld); widest head gap h%lld %.1f pp\n",
               (long long)layer, mn, mx, (long long)at, (long long)head, gap);
    }
}

int ps_recall_finish(const ps_partial *p, const ps_out *out, ps_error *err) {
    ps_residue_stats st = {0};
    json_t *res = NULL, *stats = NULL;
    int rc = -1, *layers = NULL;
    int64_t P = json_integer_value(json_object_get(p->meta, "period")), n_kv = json_integer_value(json_object_get(p->meta, "n_kv"));
    json_t *jl = json_object_get(p->meta, "layers");
    int iok = ps_partial_find(p, "ok"), ilp = ps_partial_find(p, "logprob"), irho = ps_partial_find(p, "rho"), ic = ps_partial_find(p, "codes");
    int nl = (int)json_array_size(jl);
    if (iok < 0 || ilp < 0 || irho < 0 || ic < 0 || P < 1 || n_kv < 1 || nl < 1)
        return ps_fail(err, "a recall's partial result lacks its outcomes, codes, period, layers or heads");
    int64_t n_items = p->arr[iok].off[p->n_units];
    if (p->arr[ic].off[p->n_units] != n_items * nl * n_kv)
        return ps_fail(err, "a recall's partial result has %lld codes for %lld queries of %d layers x %lld heads",
                       (long long)p->arr[ic].off[p->n_units], (long long)n_items, nl, (long long)n_kv);
    if (!(layers = malloc((size_t)nl * sizeof *layers))) return ps_fail(err, "out of memory for %d layers", nl);
    for (int i = 0; i < nl; i++) layers[i] = (int)json_integer_value(json_array_get(jl, (size_t)i));
    if (ps_residue_stats_init(&st, P, err)) goto done;
    ps_residue_stats_add_items(&st, p->arr[iok].data, p->arr[ilp].data, p->arr[irho].data, n_items);
    json_t *curve = ps_residue_stats_json(&st, err);
    if (!curve) goto done;
    if (!(stats = ps_recall_stats_json(p->arr[ic].data, p->arr[irho].data, n_items, layers, nl, n_kv, P, NULL, err))) {
        json_decref(curve);
        goto done;
    }
    res = json_object();
    json_object_set_new(res, "kind", json_string("recall"));
    json_object_set(res, "provenance", json_object_get(p->meta, "provenance"));
    json_object_set(res, "period", json_object_get(p->meta, "period"));
    json_object_set(res, "needle_offset", json_object_get(p->meta, "needle_offset"));
    json_object_set(res, "selection", json_object_get(p->meta, "selection"));
    json_object_set_new(res, "curve", curve);
    json_object_set(res, "cells", json_object_get(stats, "cells"));
    json_object_set(res, "layers", json_object_get(stats, "layers"));
    json_object_set(res, "any_cell", json_object_get(stats, "any_cell"));
    if (ps_result_write(out, "recall.json", res, err)) goto done;
    recall_summary(out, res);
    rc = 0;
done:
    json_decref(res);
    json_decref(stats);
    free(layers);
    ps_residue_stats_free(&st);
    return rc;
}
