/* instr_knockout.c — the knockout instrument (instrument.h, ps_knockout_command): the set-up and
 * cmd_knockout.c's flags checked against the model (target, layers, heads, method), the grid engine's work
 * units split over shards and ranks, an estimate and its verification, and the finish that adds the parts
 * up, writes knockout.json and its figure, and prints the summary (also phasescope merge's). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "scaleout/dist.h"
#include "instruments/instrument.h"
#include "interventions/atp.h"
#include "interventions/knockout.h"
#include "interventions/units.h"

static int knockout_run(ps_instr *inp, const ps_knockout_request *rq, ps_error *err);

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

/* The flags of cmd_knockout.c (or cmd_patch.c: patch), checked against the model, then the run (knockout_run). */
static int grid_command(const ps_args *a, int patch, ps_error *err);
int ps_knockout_command(const ps_args *a, ps_error *err) { return grid_command(a, 0, err); }
int ps_patch_command(const ps_args *a, ps_error *err) { return grid_command(a, 1, err); }

/* patch: the clean prompt set (--prompts, or the API's inline set) and its corrupt tokens (--corrupt FILE, or the
 * API's inline "corrupt"), of the same N and T, ids below the vocabulary */
static int patch_inputs(const ps_instr *in, const ps_args *a, ps_token_set *cs, int *own, ps_error *err) {
    if (!in->prompts)
        return ps_cli_usage(err, "patch needs the clean prompts: --prompts CLEAN.jsonl (docs/prompt-sets.md; Python: clean=ps.PromptSet)");
    const char *file = ps_args_get(a, "--corrupt");
    if (a->corrupt && file) return ps_cli_usage(err, "--corrupt: given twice (a file and the request's token list)");
    if (a->corrupt) *cs = *a->corrupt;
    else if (!file)
        return ps_cli_usage(err, "patch needs the corrupt tokens: --corrupt CORRUPT.jsonl ({\"tokens\": [...]} a line, the clean set's N and T)");
    else if (ps_token_set_read(file, cs, err)) return ps_fail_prefix(err, "--corrupt: "), ps_cli_mark_usage(err);
    else *own = 1;
    if (ps_token_set_check(cs, in->pset.N, in->pset.T, "the clean prompts", in->rt.family->vocab(&in->rt), err))
        return ps_fail_prefix(err, "--corrupt: "), ps_cli_mark_usage(err);
    return 0;
}

static int grid_command(const ps_args *a, int patch, ps_error *err) {
    ps_instr in = {0};
    ps_token_set cs = {0};
    int own_cs = 0;
    int rc = 1, *layers = NULL, *heads = NULL, nl = 0, nh = 0, target = 0;
    int bad = ps_instr_setup(&in, a, 1, err);
    const ps_runtime *rt = &in.rt;
    int64_t L = 0, nh_max = 0, T0 = 0, T1 = 0;
    char why[256];
    int atp = 0, fix = 0;
    if (!bad && !patch) {
        static const char *const METHODS[] = {"exact", "atp", NULL};
        if (ps_args_get(a, "--method") && ps_args_choice(a, "--method", METHODS, &atp, err)) bad = -1;
    }
    if (!bad) {
        L = rt->n_layers;
        /* the prompts' lengths: a prompt set's T, or the task sweep's seq_len .. seq_len + P - 1 (prefix padding);
         * the default target is the family's at the shortest */
        T0 = in.prompts ? in.prompts->b.T : in.base.T;
        T1 = in.prompts ? T0 : T0 + in.P - 1;
        target = ps_knockout_default_target_at(rt, T0);
        const char *tv = ps_args_get(a, "--target");
        if (tv && ps_args_choice(a, "--target", ps_knockout_targets(rt), &target, err)) bad = -1;
        /* --method atp on a target it cannot estimate (the select attention's compressed keys choose blocks: no
         * gradient): refused when asked for, else the first target it can (select: raw) */
        if (!bad && atp && ps_atp_target_missing(rt, target, why, sizeof why)) {
            if (tv) bad = ps_cli_usage(err, "%s", why);
            else {
                int found = -1;
                for (int t = 0; found < 0 && ps_knockout_targets(rt)[t]; t++)
                    if (!ps_atp_target_missing(rt, t, why, sizeof why) && !ps_knockout_layer_missing(rt, t, -1, why, sizeof why)) found = t;
                if (found < 0) bad = ps_fail(err, "--method atp: no knockout target of this model can be estimated from gradients");
                else target = found;
            }
        }
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
            const char *m = ps_knockout_layer_missing_in(rt, target, layers[i], T0, T1, why, sizeof why);
            if (m) bad = ps_cli_usage(err, "--layers: %s", m);
        }
    } else if (!bad) { /* every layer that has what the target replaces */
        const char *first = NULL;
        for (int l = 0; l < L; l++) {
            const char *m = ps_knockout_layer_missing_in(rt, target, l, T0, T1, why, sizeof why);
            if (!m) layers[nl++] = l;
            else if (!first) first = m;
        }
        if (!nl) bad = ps_cli_usage(err, "%s", first ? why : "no layer has what the target replaces");
    }
    if (!bad && nh_max > 0)
        bad = model_list(a, "--heads", nh_max, ps_knockout_heads_what(rt), heads, &nh, err);
    else if (!bad) {
        if (ps_args_get(a, "--heads"))
            bad = ps_cli_usage(err, "--heads: --target %s replaces whole layers (--heads goes with --target heads)", tname);
        heads[0] = 0, nh = 1;
    }
    int64_t verify = 0;
    if (!bad && patch) bad = patch_inputs(&in, a, &cs, &own_cs, err);
    if (!bad && !patch) {
        fix = ps_atp_default_fix(rt);
        if (ps_args_get(a, "--atp-fix") && ps_args_choice(a, "--atp-fix", ps_atp_fix_names, &fix, err)) bad = -1;
        else if (!atp && ps_args_get(a, "--atp-fix")) bad = ps_cli_usage(err, "--atp-fix goes with --method atp");
        else if (atp && ps_atp_fix_missing(rt, fix, why, sizeof why))
            bad = ps_args_get(a, "--atp-fix") ? ps_cli_usage(err, "%s", why) : ps_fail(err, "%s", why);
    }
    if (!bad && !patch && ps_args_get(a, "--verify")) {
        if (!atp) bad = ps_cli_usage(err, "--verify goes with --method atp (an exact grid is exact already)");
        else if (in.n_shards > 1)
            bad = ps_cli_usage(err, "--verify needs the whole estimate to choose its cells: run it without --shard (MPI ranks split both passes)");
        else if (ps_args_int(a, "--verify", 0, (int64_t)nl * (nh > 0 ? nh : 1), &verify, err)) bad = -1;
    }
    if (ps_dist_agree(bad, err)) goto done;
    ps_knockout_request rq = {.layers = layers, .n_layers = nl, .heads = heads, .n_heads = nh, .target = target,
                              .target_name = tname, .atp = atp, .atp_fix = fix, .verify = verify, .corrupt = patch ? &cs : NULL};
    if (knockout_run(&in, &rq, err)) goto done;
    rc = 0;
done:
    if (own_cs) ps_token_set_free(&cs);
    free(layers);
    free(heads);
    ps_instr_free(&in);
    return rc;
}

/* What one pass of the grid runs (grid_pass). */
typedef struct {
    ps_instr *in;
    const int *layers, *heads; /* layers top-down */
    int nl, nh, target, atp, fix;
    const char *tname;
    const ps_token_set *corrupt; /* activation patching's corrupt tokens, or NULL */
} ko_pass;
static int grid_pass(const ko_pass *ps, ps_partial *part, const unsigned char *mask, ps_error *err);
static int knockout_top_cells(const ps_partial *p, int64_t K, unsigned char *mask, ps_error *err);
static int knockout_finish(const ps_partial *p, const ps_partial *v, const unsigned char *mask, const ps_out *out, ps_error *err);

static int knockout_run(ps_instr *inp, const ps_knockout_request *rq, ps_error *err) {
    ps_partial part = {0}, vpart = {0};
    unsigned char *mask = NULL;
    int rc = -1, nl = rq->n_layers, nh = rq->n_heads, target = rq->target, atp = rq->atp, fix = rq->atp_fix;
    int64_t verify = rq->verify;
    const char *tname = rq->target_name;
    int *layers = malloc((size_t)(nl > 0 ? nl : 1) * sizeof(int));
    const int *heads = rq->heads;
    if (!layers) return ps_fail(err, "out of memory for %d layers", nl);
    memcpy(layers, rq->layers, (size_t)nl * sizeof(int));
    ps_grid_sort_topdown(layers, nl); /* the partial result lists them as the grid visits them */
    ko_pass ps = {.in = inp, .layers = layers, .nl = nl, .heads = heads, .nh = nh, .target = target, .tname = tname, .atp = atp,
                  .fix = fix, .corrupt = rq->corrupt};
    int fin = grid_pass(&ps, &part, NULL, err);
    if (fin < 0) goto done;
    if (verify > 0) { /* the K cells the estimate ranks first, exactly (every rank takes part) */
        mask = calloc((size_t)nl * (size_t)nh, 1);
        if (!mask) {
            ps_fail(err, "out of memory for the cell mask");
            goto done;
        }
        int rv = fin == 1 ? knockout_top_cells(&part, verify, mask, err) : 0;
        if (ps_dist_agree(rv, err) || ps_dist_bcast(mask, (int64_t)nl * nh, 0, err)) goto done;
        ko_pass pv = ps;
        pv.atp = 0;
        int fv = grid_pass(&pv, &vpart, mask, err);
        if (fv < 0) goto done;
        if (fv == 1 && knockout_finish(&part, &vpart, mask, &inp->out, err)) goto done;
    } else if (fin == 1 && ps_knockout_finish(&part, &inp->out, err))
        goto done;
    rc = 0;
done:
    free(mask);
    free(layers);
    ps_partial_free(&part);
    ps_partial_free(&vpart);
    return rc;
}

/* One split pass of the grid (the exact knockout, an estimate, or the exact knockout of the masked
 * cells): this process's units, gathered; 1 when this process finishes the result, 0 when not, -1 on an
 * error. */
static int grid_pass(const ko_pass *ps, ps_partial *part, const unsigned char *mask, ps_error *err) {
    ps_instr *in = ps->in;
    const ps_runtime *rt = &in->rt;
    ps_instr_work wk = {0};
    ps_knockout_result r = {0};
    int64_t *w = NULL, L = rt->n_layers;
    unsigned char *snap = NULL;
    int ret = -1, nl = ps->nl, nh = ps->nh;
    /* every rank groups its cells as rank 0 would alone: rank 0's memory budget */
    ps_knockout_opts opts = {.mem_bytes = ps_knockout_default_budget(), .atp = ps->atp, .atp_fix = ps->fix, .cell_mask = mask};
    if (ps_dist_bcast(&opts.mem_bytes, sizeof opts.mem_bytes, 0, err)) return -1;
    /* the task's prompts over P shifts, or a caller's prompt set: one shift of N prompts, P residues */
    const ps_batch *pb = in->prompts ? &in->prompts->b : &in->base;
    int64_t N = pb->B, maxq = pb->max_q, n_shifts = in->prompts ? 1 : in->P;
    int64_t nu = ps_knockout_n_units(N, in->batch, n_shifts, nl);
    int last_first = ps_grid_last_first(rt);
    json_t *jl = json_array(), *jh = json_array();
    for (int i = 0; i < nl; i++) json_array_append_new(jl, json_integer(ps->layers[i]));
    for (int i = 0; i < nh; i++) json_array_append_new(jh, json_integer(ps->heads[i]));
    const char *unit = ps_knockout_unit(rt, ps->target);
    json_t *prov = ps_instr_provenance(in, "pad");
    if (prov && ps->corrupt) /* activation patching: the corrupt tokens beside the clean set */
        json_object_set_new(json_object_get(prov, "eval"), "corrupt", ps_token_set_json(ps->corrupt));
    json_t *meta = json_pack("{s:o, s:I, s:s, s:o, s:o, s:I, s:b, s:s}", "provenance", prov, "period",
                             (json_int_t)in->P, "target", ps->tname, "layers", jl, "heads", jh, "max_q", (json_int_t)maxq,
                             "last_first", last_first, "method", ps->corrupt ? "patch" : ps->atp ? "atp" : "exact");
    if (meta && unit) json_object_set_new(meta, "unit", json_string(unit));
    if (meta && ps->atp) json_object_set_new(meta, "atp_fix", json_string(ps_atp_fix_names[ps->fix]));
    w = malloc((size_t)(nu ? nu : 1) * sizeof *w);
    snap = calloc((size_t)(nu ? nu : 1), 1);
    if (!w || !snap) {
        json_decref(meta);
        ps_fail(err, "out of memory for %lld work units", (long long)nu);
        goto done;
    }
    if (ps_instr_partial_init(in, part, nu, meta, err)) goto done;
    if ((ps->corrupt ? ps_patch_partial_layout : ps_knockout_partial_layout)(part, N, in->batch, n_shifts, nl, nh, maxq, last_first, err))
        goto done;
    if (ps->atp) ps_grid_unit_weights_estimate(N, in->batch, n_shifts, nl, w, snap);
    else ps_grid_unit_weights(rt, N, in->batch, n_shifts, ps->layers, nl, nh, L, w, snap);
    if (ps_instr_split(in, w, snap, nu, 64 * N, &wk, err)) goto done;
    ps_knockout_recorder rec = {.p = part, .nh = nh};
    opts.unit0 = wk.u0;
    opts.unit1 = wk.u1;
    opts.record = ps_knockout_record;
    opts.record_user = &rec;
    int rr = 0;
    if (wk.u1 > wk.u0) { /* an empty range runs nothing (unit1 = 0 would mean every unit) */
        ps_knockout_spec ks = {.rt = rt, .base = &in->base, .task = &in->task, .fam = in->fam, .prompts = in->prompts, .P = in->P, .seed = in->seed,
                               .batch = in->batch, .layers = ps->layers, .n_layers = nl, .heads = ps->heads, .n_heads = nh,
                               .target = ps->target, .opts = opts, .progress = ps_instr_progress, .progress_user = in,
                               .corrupt = ps->corrupt ? ps->corrupt->tokens : NULL};
        rr = ps_knockout_run(&ks, &r, err);
        ps_progress_end(&in->bar);
    }
    ret = ps_instr_collect(in, part, &wk, rr, err);
done:
    free(w);
    free(snap);
    ps_instr_work_free(&wk);
    ps_knockout_result_free(&r);
    return ret;
}

/* mask: the K cells (of the partial's order, layer index major) with the largest estimated effect. */
static int knockout_top_cells(const ps_partial *p, int64_t K, unsigned char *mask, ps_error *err) {
    ps_knockout_result r;
    if (ps_knockout_from_partial(p, &r, err)) return -1;
    ps_knockout_top_cells(&r, K, mask);
    ps_knockout_result_free(&r);
    return 0;
}

int ps_knockout_finish(const ps_partial *p, const ps_out *out, ps_error *err) { return knockout_finish(p, NULL, NULL, out, err); }

/* The result of the grid's partial result p (an exact grid or an estimate) and, for a verified estimate,
 * the exact partial result v of the masked cells. */
static int knockout_finish(const ps_partial *p, const ps_partial *v, const unsigned char *mask, const ps_out *out, ps_error *err) {
    ps_knockout_result r = {0}, rv = {0};
    json_t *res = NULL;
    int rc = -1, *order = NULL;
    const char *tg = json_string_value(json_object_get(p->meta, "target")), *unit = json_string_value(json_object_get(p->meta, "unit"));
    const char *method = json_string_value(json_object_get(p->meta, "method"));
    int atp = method && !strcmp(method, "atp"), patch = method && !strcmp(method, "patch");
    if (patch && p->n_arr != 7) return ps_fail(err, "an activation-patching grid's partial result lacks the corrupt run's outcomes");
    if (ps_knockout_from_partial(p, &r, err)) return -1;
    if (v && ps_knockout_from_partial(v, &rv, err)) goto done;
    res = json_object();
    json_object_set_new(res, "kind", json_string(patch ? "patch" : "knockout"));
    json_object_set(res, "provenance", json_object_get(p->meta, "provenance"));
    ps_knockout_atp_json aj = {.fix = json_string_value(json_object_get(p->meta, "atp_fix")), .verified = v ? mask : NULL,
                               .exact = v ? &rv : NULL};
    if (atp && !aj.fix) aj.fix = "none";
    json_t *grid = ps_knockout_json_ex(&r, tg, unit, atp ? &aj : NULL, err);
    if (!grid) goto done;
    if (patch) { /* the knockout's grid with the corrupt run beside the clean one (each cell's deltas: patched - clean) */
        json_t *corr = ps_residue_stats_json(&r.ref, err);
        if (!corr || json_object_set_new(grid, "method", json_string("patch")) || json_object_set_new(grid, "corrupt", corr)) {
            json_decref(grid);
            if (corr) ps_fail(err, "out of memory for the patching grid");
            goto done;
        }
    }
    if (ps_knockout_logit_diff(p, grid, err) < 0) {
        json_decref(grid);
        goto done;
    }
    json_object_set_new(res, "grid", grid);
    if (ps_result_write(out, patch ? "patch.json" : "knockout.json", res, err)) goto done;
    /* every head with the residue it hurts most (a head that kills one residue can have a small mean),
     * worst first (an estimate: by its worst residue's estimated NLL increase) */
    json_t *cells = json_object_get(grid, "cells");
    size_t ncell = json_array_size(cells);
    order = malloc((ncell ? ncell : 1) * sizeof(int));
    if (!order) {
        ps_fail(err, "out of memory for the order of %zu cells", ncell);
        goto done;
    }
    for (size_t i = 0; i < ncell; i++) order[i] = (int)i;
#define CELL(i) json_array_get(cells, (size_t)order[i])
#define WORST(i, k) json_number_value(json_object_get(json_object_get(CELL(i), "worst_residue"), k))
#define MEAN_DNLL(i) json_number_value(json_object_get(CELL(i), "mean_delta_nll"))
    for (size_t i = 1; i < ncell; i++) /* insertion sort: worst-residue drop, then mean dNLL */
        for (size_t j = i; j > 0 && (atp ? WORST(j, "delta_nll") > WORST(j - 1, "delta_nll")
                                         : WORST(j, "delta_accuracy_pp") < WORST(j - 1, "delta_accuracy_pp") - 1e-9 ||
                                               (fabs(WORST(j, "delta_accuracy_pp") - WORST(j - 1, "delta_accuracy_pp")) <= 1e-9 &&
                                                MEAN_DNLL(j) > MEAN_DNLL(j - 1)));
             j--) {
            int t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    if (patch)
        ps_say(out, "clean mean accuracy %.3f, corrupt %.3f; per cell patched from the corrupt run, the residue it hurts most (worst first):\n",
               json_number_value(json_object_get(json_object_get(grid, "clean"), "mean_accuracy")),
               json_number_value(json_object_get(json_object_get(grid, "corrupt"), "mean_accuracy")));
    else
        ps_say(out, "clean mean accuracy %.3f; per head, the residue it hurts most (worst first%s):\n",
               json_number_value(json_object_get(json_object_get(grid, "clean"), "mean_accuracy")),
               atp ? "; attribution patching: estimated NLL changes" : "");
    size_t show = ncell < 32 ? ncell : 32;
    for (size_t i = 0; i < show; i++) {
        json_t *cell = CELL(i), *w = json_object_get(cell, "worst_residue"), *ex = json_object_get(cell, "exact");
        long long layer = (long long)json_integer_value(json_object_get(cell, "layer")),
                  head = (long long)json_integer_value(json_object_get(cell, "head")), rho = (long long)json_integer_value(json_object_get(w, "rho"));
        if (atp) {
            ps_say(out, "  layer %lld head %lld: worst rho %lld: estimated dNLL %+.3f; mean estimated dNLL %+.3f", layer, head, rho,
                   json_number_value(json_object_get(w, "delta_nll")), MEAN_DNLL(i));
            if (json_is_object(ex)) {
                json_t *xw = json_object_get(ex, "worst_residue");
                ps_say(out, "; exact: worst rho %lld %+.1f pp, dNLL %+.3f (at rho %lld: dNLL %+.3f)",
                       (long long)json_integer_value(json_object_get(xw, "rho")), json_number_value(json_object_get(xw, "delta_accuracy_pp")),
                       json_number_value(json_object_get(xw, "delta_nll")), rho,
                       json_number_value(json_object_get(json_array_get(json_object_get(ex, "residues"), (size_t)rho), "delta_nll")));
            }
            ps_say(out, "\n");
            continue;
        }
        ps_say(out, "  layer %lld head %lld: worst rho %lld: %.3f -> %.3f (%+.1f pp, dNLL %+.3f); mean dacc %+.1f pp, mean dNLL %+.3f\n",
               layer, head, rho, json_number_value(json_object_get(w, "clean_accuracy")),
               json_number_value(json_object_get(w, "accuracy")), json_number_value(json_object_get(w, "delta_accuracy_pp")),
               json_number_value(json_object_get(w, "delta_nll")),
               json_number_value(json_object_get(cell, "mean_delta_accuracy_pp")), MEAN_DNLL(i));
    }
    if (show < ncell) ps_say(out, "  ... %zu more heads in %s\n", ncell - show, patch ? "patch.json" : "knockout.json");
    rc = 0;
done:
    free(order);
    json_decref(res);
    ps_knockout_result_free(&r);
    ps_knockout_result_free(&rv);
    return rc;
}
