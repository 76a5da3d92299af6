/* instr_gatecycle.c — the gatecycle instrument's run (instrument.h, ps_gatecycle_command): the model and
 * the family's check of the cycle (its core entries cycle_check, cycle, cycle_meta: core/cycle.h), the work units split
 * over shards and ranks, --save, and the finish that adds the parts up, analyses the curves (and, with
 * --measure knockout, each cycled head's knockout profiles), writes gatecycle.json and its figures and
 * prints the summary (also phasescope merge's). The flags are cmd_gatecycle.c's.
 *
 * Work units, in the one-process order (interventions/units.h, grid.h): before the cycle, the per-head
 * measure's knockout grid (--measure knockout: the family's "compressed" target on the cycled layer's
 * cycled heads; nk units of the grid engine) and then the sweep (P · n_batches units); after it, the same
 * two again. A process whose range reaches past the first half cycles its copy of the model first. The
 * partial result holds the sweeps' outcomes (arrays ok, logprob, rho: empty on the grids' units) and the
 * grids' (the knockout's layout, knockout.h, under "ko_" names: empty on the sweeps' units). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "scaleout/dist.h"
#include "instruments/instrument.h"
#include "interventions/gatecycle.h"
#include "interventions/knockout.h"
#include "interventions/stats.h"
#include "interventions/units.h"
#include "tasks/tasks.h"

/* the partial result's arrays: the sweeps', then the grids' (knockout.h's five, in its order) */
enum { GC_OK, GC_LP, GC_RHO, GC_KO, GC_N_ARR = GC_KO + 5 };

/* The grid's arrays of one half (its units from `base`) seen as a knockout grid's partial result, which
 * ps_knockout_record fills and ps_knockout_from_partial reads (no copy: the offsets shifted by base). */
static void ko_view(const ps_partial *p, int64_t base, int64_t nk, json_t *meta, ps_partial *v) {
    memset(v, 0, sizeof *v);
    snprintf(v->command, sizeof v->command, "knockout");
    v->n_units = nk;
    v->u1 = nk;
    v->n_shards = 1;
    v->meta = meta;
    v->n_arr = 5;
    for (int a = 0; a < 5; a++) {
        v->arr[a] = p->arr[GC_KO + a];
        v->arr[a].off += base;
    }
}

/* The partial result's arrays over nu = 2 (nk + half) units (half: one sweep's units, nk: one grid's). */
static int gc_layout(const ps_instr *in, ps_partial *part, int64_t nk, int64_t half, int nh, int last_first, ps_error *err) {
    int64_t N = in->base.B, maxq = in->base.max_q, nb = ps_sweep_n_batches(N, in->batch), nu = 2 * (nk + half);
    int64_t *w = calloc((size_t)(nu ? nu : 1), sizeof *w);
    ps_partial ko = {0};
    int rc = -1;
    if (!w) return ps_fail(err, "out of memory for %lld work units", (long long)nu);
    for (int h = 0; h < 2; h++) /* the sweeps' units: a batch's queries */
        for (int64_t u = 0; u < half; u++) {
            int64_t j = u % nb;
            w[h * (nk + half) + nk + u] = (N - j * in->batch < in->batch ? N - j * in->batch : in->batch) * maxq;
        }
    if (ps_partial_add(part, "ok", PS_PART_I32, w, err) < 0 || ps_partial_add(part, "logprob", PS_PART_F64, w, err) < 0 ||
        ps_partial_add(part, "rho", PS_PART_I32, w, err) < 0)
        goto done;
    if (nk) { /* the grids' units: the knockout's layout, its sizes per unit */
        if (ps_partial_init(&ko, "knockout", nk, json_object(), err) ||
            ps_knockout_partial_layout(&ko, N, in->batch, in->P, 1, nh, maxq, last_first, err))
            goto done;
        if (ko.n_arr != 5 || ko.n_units != nk) {
            ps_fail(err, "internal error: a knockout grid's partial layout has %d arrays over %lld units", ko.n_arr, (long long)ko.n_units);
            goto done;
        }
        memset(w, 0, (size_t)nu * sizeof *w);
        for (int a = 0; a < 5; a++) {
            for (int h = 0; h < 2; h++)
                for (int64_t u = 0; u < nk; u++) w[h * (nk + half) + u] = ps_partial_count(&ko, a, u);
            char name[32];
            snprintf(name, sizeof name, "ko_%.24s", ko.arr[a].name);
            if (ps_partial_add(part, name, ko.arr[a].type, w, err) < 0) goto done;
        }
    }
    rc = 0;
done:
    free(w);
    ps_partial_free(&ko);
    return rc;
}

/* Work weights (1/64 of a prompt's forward, as the grid engine's) and snap points (a grid's shifts). */
static int gc_weights(const ps_instr *in, int64_t nk, int64_t half, int layer, int nh, int64_t *w, unsigned char *snap, ps_error *err) {
    int64_t N = in->base.B, T = in->base.T > 0 ? in->base.T : 1;
    int64_t *ws = malloc((size_t)(half ? half : 1) * sizeof *ws), *wk = malloc((size_t)(nk ? nk : 1) * sizeof *wk);
    unsigned char *sk = calloc((size_t)(nk ? nk : 1), 1);
    if (!ws || !wk || !sk) {
        free(ws), free(wk), free(sk);
        return ps_fail(err, "out of memory for the weights of %lld work units", (long long)(2 * (nk + half)));
    }
    ps_sweep_unit_weights(N, in->batch, in->P, in->base.T, PS_SWEEP_PAD, ws);
    if (nk) ps_grid_unit_weights(&in->rt, N, in->batch, in->P, &layer, 1, nh, in->rt.n_layers, wk, sk);
    for (int h = 0; h < 2; h++) {
        int64_t at = h * (nk + half);
        for (int64_t u = 0; u < nk; u++) w[at + u] = wk[u], snap[at + u] = sk[u];
        /* a sweep unit: n prompts of T + p tokens (ws), one forward each: about 64 n; alone, as the sweep's */
        for (int64_t u = 0; u < half; u++) {
            w[at + nk + u] = nk ? (64 * ws[u] + T - 1) / T : ws[u];
            snap[at + nk + u] = 0;
        }
    }
    free(ws), free(wk), free(sk);
    return 0;
}

/* The knockout grid's units [g0, g1) of one half (its grid units from `base` in the partial result). */
static int gc_grid(ps_instr *in, ps_partial *part, json_t *ko_meta, int64_t base, int64_t nk, int64_t g0, int64_t g1, int layer,
                   const int *heads, int nh, int target, double mem_bytes, ps_error *err) {
    if (g1 <= g0) return 0; /* an empty range runs nothing (unit1 = 0 would mean every unit) */
    ps_partial view;
    ko_view(part, base, nk, ko_meta, &view);
    ps_knockout_recorder rec = {.p = &view, .nh = nh};
    ps_knockout_result r = {0};
    ps_knockout_spec ks = {.rt = &in->rt, .base = &in->base, .task = &in->task, .fam = in->fam, .P = in->P, .seed = in->seed,
                           .batch = in->batch, .layers = &layer, .n_layers = 1, .heads = heads, .n_heads = nh, .target = target,
                           .opts = {.mem_bytes = mem_bytes, .unit0 = g0, .unit1 = g1, .record = ps_knockout_record,
                                    .record_user = &rec},
                           .progress = ps_instr_progress, .progress_user = in};
    int rc = ps_knockout_run(&ks, &r, err);
    ps_progress_end(&in->bar);
    ps_knockout_result_free(&r);
    return rc;
}

/* The sweep's units [s0, s1) of one half (its outcomes from unit `base` of the partial result). */
static int gc_sweep(ps_instr *in, ps_partial *part, int64_t base, int64_t s0, int64_t s1, ps_error *err) {
    if (s1 <= s0) return 0;
    int rc = ps_sweep_units(&in->rt, &in->base, &in->task, in->fam, PS_SWEEP_PAD, in->P, in->seed, in->batch, s0, s1,
                            ps_partial_at(part, GC_OK, base), ps_partial_at(part, GC_LP, base), ps_partial_at(part, GC_RHO, base),
                            ps_instr_progress, in, err);
    ps_progress_end(&in->bar);
    return rc;
}

int ps_gatecycle_command(const ps_args *a, const ps_gatecycle_request *rq, ps_error *err) {
    ps_instr in = {0};
    ps_partial part = {0};
    ps_instr_work wk = {0};
    int64_t *w = NULL;
    unsigned char *snap = NULL;
    int *heads = NULL;
    json_t *meta = NULL, *ko_meta = NULL;
    int rc = -1, r = 0;
    char note[4600];
    ps_cli_default_model_note(ps_args_get(a, "--model"), note, sizeof note);
    ps_cycle_req q = {.layer = rq->layer, .shift = rq->shift, .head = rq->head, .branch = rq->branch, .params = rq->params,
                      .save = rq->save != NULL, .per_head = rq->measure_knockout, .note = note};
    /* the model, and the cycle's flags and preconditions checked by its family (every rank alike) */
    int bad = ps_instr_setup(&in, a, 1, err);
    const ps_runtime *rt = &in.rt;
    q.model_dir = in.model_dir;
    const ps_family *f = rt->family;
    if (!bad && !(f->cycle.check && f->cycle.roll && f->cycle.meta))
        bad = ps_fail(err, "%s: phasescope does not cycle the gates of %s checkpoints (the family has no cycle entries)", in.model_dir,
                      f->name);
    if (!bad) bad = f->cycle.check(rt, &q, err);
    /* the per-head measure: the family's "compressed" knockout of the cycled heads */
    int target = -1, nh = 0;
    if (!bad && q.per_head) {
        const char *const *tg = ps_knockout_targets(rt);
        for (int i = 0; tg && tg[i] && target < 0; i++)
            if (!strcmp(tg[i], "compressed")) target = i;
        int64_t n_all = target >= 0 ? ps_knockout_target_heads(rt, target) : 0;
        nh = q.head >= 0 ? 1 : (int)n_all;
        if (target < 0 || nh < 1 || q.head >= n_all)
            bad = ps_fail(err, "--measure knockout: the %s runtime has no per-head compressed knockout", rt->family->name);
        else if (!(heads = malloc((size_t)nh * sizeof(int))))
            bad = ps_fail(err, "out of memory for %d heads", nh);
        for (int i = 0; !bad && i < nh; i++) heads[i] = q.head >= 0 ? (int)q.head : i;
    }
    if (ps_dist_agree(bad, err)) goto done;
    int layer = (int)q.layer, last_first = ps_grid_last_first(rt);
    int64_t N = in.base.B, maxq = in.base.max_q, nb = ps_sweep_n_batches(N, in.batch), half = in.P * nb;
    int64_t nk = q.per_head ? ps_grid_n_units(N, in.batch, in.P, 1) : 0, mid = nk + half, nu = 2 * mid;
    /* what the finish needs: provenance, the period, chance, the family's cycle block and summary line, the grids */
    meta = json_pack("{s:o, s:I, s:f}", "provenance", ps_instr_provenance(&in, "pad"), "period", (json_int_t)in.P, "chance",
                     ps_task_chance(&in.task));
    if (!meta) {
        r = ps_fail(err, "out of memory for the run's description");
        goto run_done;
    }
    r = f->cycle.meta(rt, &q, meta, err);
    if (!r && nk) {
        json_t *jh = json_array();
        for (int i = 0; i < nh; i++) json_array_append_new(jh, json_integer(heads[i]));
        ko_meta = json_pack("{s:I, s:[i], s:o, s:I, s:s, s:b, s:f, s:I}", "period", (json_int_t)in.P, "layers", layer, "heads", jh,
                            "max_q", (json_int_t)maxq, "target", ps_knockout_targets(rt)[target], "last_first", last_first,
                            "min_hurt_pp", rq->min_hurt, "units", (json_int_t)nk);
        if (!ko_meta || json_object_set_new(meta, "per_head_grid", ko_meta))
            r = ps_fail(err, "out of memory for the run's description");
    }
    if (r) goto run_done;
    w = malloc((size_t)(nu ? nu : 1) * sizeof *w);
    snap = calloc((size_t)(nu ? nu : 1), 1);
    if (!w || !snap) {
        r = ps_fail(err, "out of memory for %lld work units", (long long)nu);
        goto run_done;
    }
    json_incref(meta);
    if (ps_instr_partial_init(&in, &part, nu, meta, err) || gc_layout(&in, &part, nk, half, nh, last_first, err) ||
        gc_weights(&in, nk, half, layer, nh, w, snap, err)) {
        r = -1;
        goto run_done;
    }
    if (ps_instr_split(&in, w, nk ? snap : NULL, nu, nk ? 64 * N : 0, &wk, err)) goto done;
    /* every rank groups its cells as rank 0 would alone: rank 0's memory budget */
    double mem = ps_knockout_default_budget();
    if (nk && ps_dist_bcast(&mem, sizeof mem, 0, err)) goto done;
    const char *save = rq->save;
    int saver = save && ps_dist_rank() == 0 && in.shard == 0; /* one process writes the cycled checkpoint */
    int64_t u0 = wk.u0, u1 = wk.u1;
#define CLIP(lo, hi, x) ((x) < (lo) ? (lo) : (x) > (hi) ? (hi) : (x))
    /* before the cycle: the grid's units [0, nk), the sweep's [nk, mid) */
    r = gc_grid(&in, &part, ko_meta, 0, nk, CLIP(0, nk, u0), CLIP(0, nk, u1), layer, heads, nh, target, mem, err);
    if (!r) r = gc_sweep(&in, &part, nk, CLIP(nk, mid, u0) - nk, CLIP(nk, mid, u1) - nk, err);
    if (!r && (u1 > mid || saver)) r = f->cycle.roll(rt, &q, q.shift, err);
    /* after it: the grid's units [mid, mid + nk), the sweep's [mid + nk, nu) */
    if (!r)
        r = gc_grid(&in, &part, ko_meta, mid, nk, CLIP(mid, mid + nk, u0) - mid, CLIP(mid, mid + nk, u1) - mid, layer, heads, nh,
                    target, mem, err);
    if (!r) r = gc_sweep(&in, &part, mid + nk, CLIP(mid + nk, nu, u0) - mid - nk, CLIP(mid + nk, nu, u1) - mid - nk, err);
#undef CLIP
    if (!r && saver) {
        char what[96];
        snprintf(what, sizeof what, "layer %lld shift %lld", (long long)q.layer, (long long)q.shift);
        if (!rt->family->save) /* the family's cycle_check refuses --save where it cannot write a checkpoint */
            r = ps_fail(err, "--save: writing %s checkpoints is not supported", rt->family->name);
        else
            r = rt->family->save(rt, save, "phasescope.gatecycle", what, err);
        if (!r) ps_say(&in.out, "wrote the cycled checkpoint to %s\n", save);
    }
run_done:;
    int fin = ps_instr_collect(&in, &part, &wk, r, err);
    if (fin < 0 || (fin == 1 && ps_gatecycle_finish(&part, &in.out, err))) goto done;
    rc = 0;
done:
    json_decref(meta);
    free(w);
    free(snap);
    free(heads);
    ps_instr_work_free(&wk);
    ps_partial_free(&part);
    ps_instr_free(&in);
    return rc;
}

/* ---- the finish ---- */

/* The per-head measure's summary on stdout, from the "per_head" object. */
static void print_per_head(const ps_out *o, json_t *out, int64_t layer, int64_t k) {
    ps_say(o, "per-head knockout measure (layer %lld, shift %lld; hurt = accuracy drop when the head is knocked out):\n", (long long)layer,
           (long long)k);
    json_t *hl = json_object_get(out, "heads"), *e;
    size_t i;
    json_array_foreach(hl, i, e) {
        const char *st = json_string_value(json_object_get(e, "status"));
        json_int_t wb = json_integer_value(json_object_get(e, "worst_before")), wa = json_integer_value(json_object_get(e, "worst_after"));
        double hb = json_is_integer(json_object_get(e, "worst_before"))
                        ? json_number_value(json_array_get(json_object_get(e, "hurt_before_pp"), (size_t)wb)) : 0;
        double ha = json_is_integer(json_object_get(e, "worst_after"))
                        ? json_number_value(json_array_get(json_object_get(e, "hurt_after_pp"), (size_t)wa)) : 0;
        /* print a tiny negative hurt as 0.0, not -0.0 */
        double shb = fabs(hb) < 0.05 ? 0 : hb, sha = fabs(ha) < 0.05 ? 0 : ha;
        ps_say(o, "  head %lld: ", (long long)json_integer_value(json_object_get(e, "head")));
        if (!strcmp(st, "no_profile")) ps_say(o, "owns no residue before (largest hurt %.1f pp at rho %lld)\n", shb, (long long)wb);
        else if (!strcmp(st, "lost")) ps_say(o, "rho %lld (%.1f pp) -> lost after cycling (largest hurt %.1f pp)\n", (long long)wb, shb, sha);
        else
            ps_say(o, "rho %lld (%.1f pp) -> rho %lld (%.1f pp): shift %+lld, shift - k %+lld; profile xcorr shift %+lld, - k %+lld\n",
                   (long long)wb, hb, (long long)wa, ha, (long long)json_integer_value(json_object_get(e, "shift_worst")),
                   (long long)json_integer_value(json_object_get(e, "error_worst")),
                   (long long)json_integer_value(json_object_get(e, "shift_xcorr")),
                   (long long)json_integer_value(json_object_get(e, "error_xcorr")));
    }
    json_t *sum = json_object_get(out, "summary");
    int n_meas = (int)json_integer_value(json_object_get(sum, "n_measured")), nh = (int)json_integer_value(json_object_get(sum, "n_heads"));
    int n_lost = (int)json_integer_value(json_object_get(sum, "n_lost")), n_none = (int)json_integer_value(json_object_get(sum, "n_no_profile"));
    if (n_meas)
        ps_say(o, "  summary: %d of %d heads measured (%d lost, %d own no residue); mean |shift - k| %.3f (worst residue), %.3f "
               "(xcorr); exact %d/%d, %d/%d\n",
               n_meas, nh, n_lost, n_none, json_number_value(json_object_get(sum, "mean_abs_error_worst")),
               json_number_value(json_object_get(sum, "mean_abs_error_xcorr")),
               (int)lround(json_number_value(json_object_get(sum, "fraction_exact_worst")) * n_meas), n_meas,
               (int)lround(json_number_value(json_object_get(sum, "fraction_exact_xcorr")) * n_meas), n_meas);
    else
        ps_say(o, "  summary: no head measured (%d lost, %d own no residue)\n", n_lost, n_none);
}

/* The per-head measure from the two grids' units (the halves' first nk units). */
static json_t *per_head_measure(const ps_partial *p, json_t *ko_meta, int64_t nk, int64_t mid, int64_t k, double chance, ps_error *err) {
    ps_partial vb, va;
    ps_knockout_result kb = {0}, ka = {0};
    json_t *out = NULL;
    ko_view(p, 0, nk, ko_meta, &vb);
    ko_view(p, mid, nk, ko_meta, &va);
    if (!ps_knockout_from_partial(&vb, &kb, err) && !ps_knockout_from_partial(&va, &ka, err))
        out = ps_gatecycle_per_head_json(&kb, &ka, k, chance, json_number_value(json_object_get(ko_meta, "min_hurt_pp")), err);
    ps_knockout_result_free(&kb);
    ps_knockout_result_free(&ka);
    return out;
}

int ps_gatecycle_finish(const ps_partial *p, const ps_out *out, ps_error *err) {
    ps_residue_stats before = {0}, after = {0};
    ps_cycle_analysis an = {0};
    json_t *res = NULL, *meta = p->meta, *cy = json_object_get(meta, "cycle"), *per_head = NULL;
    json_t *ko_meta = json_object_get(meta, "per_head_grid");
    double *ab = NULL, *aa = NULL;
    int rc = -1;
    int64_t P = json_integer_value(json_object_get(meta, "period"));
    int64_t layer = json_integer_value(json_object_get(cy, "layer")), shift = json_integer_value(json_object_get(cy, "shift"));
    const char *summary = json_string_value(json_object_get(meta, "summary"));
    int64_t nk = ko_meta ? json_integer_value(json_object_get(ko_meta, "units")) : 0, rest = p->n_units - 2 * nk;
    if (P < 1 || !json_is_object(cy) || !summary || nk < 0 || rest < 0 || rest % 2 || p->n_arr != (nk ? GC_N_ARR : GC_KO))
        return ps_fail(err, "a gate cycle's partial result lacks its cycle, period or outcomes");
    int64_t half = rest / 2, mid = nk + half;
    /* the sweeps' outcomes: units [nk, mid) before, [mid + nk, n_units) after */
    const int32_t *okb = ps_partial_at(p, GC_OK, nk), *rhob = ps_partial_at(p, GC_RHO, nk);
    const int32_t *oka = ps_partial_at(p, GC_OK, mid + nk), *rhoa = ps_partial_at(p, GC_RHO, mid + nk);
    const double *lpb = ps_partial_at(p, GC_LP, nk), *lpa = ps_partial_at(p, GC_LP, mid + nk);
    int64_t nib = p->arr[GC_OK].off[mid] - p->arr[GC_OK].off[nk], nia = p->arr[GC_OK].off[p->n_units] - p->arr[GC_OK].off[mid + nk];
    double chance = json_number_value(json_object_get(meta, "chance"));
    if (nk) { /* --measure knockout: each cycled head's knockout profile before and after */
        if (!(per_head = per_head_measure(p, ko_meta, nk, mid, shift, chance, err))) return -1;
        print_per_head(out, per_head, layer, shift);
    }
    if (ps_residue_stats_init(&before, P, err) || ps_residue_stats_init(&after, P, err)) goto done;
    ps_residue_stats_add_items(&before, okb, lpb, rhob, nib);
    ps_residue_stats_add_items(&after, oka, lpa, rhoa, nia);
    ab = malloc((size_t)P * sizeof(double));
    aa = malloc((size_t)P * sizeof(double));
    if (!ab || !aa) {
        ps_fail(err, "out of memory for two curves of %lld residues", (long long)P);
        goto done;
    }
    for (int64_t r = 0; r < P; r++) {
        ab[r] = ps_residue_accuracy(&before, r);
        aa[r] = ps_residue_accuracy(&after, r);
    }
    if (ps_cycle_analyse(ab, aa, P, chance, &an, err)) goto done;
    json_t *jb = ps_residue_stats_json(&before, err), *ja = jb ? ps_residue_stats_json(&after, err) : NULL;
    if (!ja) {
        json_decref(jb);
        goto done;
    }
    char warning[600] = "";
    const char *nc_warning = json_string_value(json_object_get(meta, "near_chance_warning"));
    if (an.after_near_chance && nc_warning)
        snprintf(warning, sizeof warning, "%s", nc_warning);
    else if (an.after_near_chance)
        snprintf(warning, sizeof warning,
                 "after cycling, accuracy is near chance (mean %.3f, chance %.3f): the cycled heads no longer work, "
                 "so the shift statistic means nothing%s",
                 json_number_value(json_object_get(ja, "mean_accuracy")), an.chance, /* the curve's own mean */
                 json_is_true(json_object_get(meta, "gates_without_payloads"))
                     ? " (the gates were rolled without their per-offset payloads; try --params all)"
                     : "");
    res = json_object();
    json_object_set_new(res, "kind", json_string("gatecycle"));
    json_object_set(res, "provenance", json_object_get(meta, "provenance"));
    json_object_set(res, "cycle", cy);
    json_object_set_new(res, "before", jb);
    json_object_set_new(res, "after", ja);
    json_object_set_new(res, "chance", json_real(an.chance));
    json_object_set_new(res, "after_near_chance", json_boolean(an.after_near_chance));
    json_t *dips = json_array(), *nd = json_array(), *ex = json_array(), *warns = json_array();
    for (int64_t i = 0; i < an.n_moves; i++) {
        const ps_dip_move *mv = &an.moves[i];
        json_t *d = json_object();
        json_object_set_new(d, "before", json_integer(mv->before));
        json_object_set_new(d, "after", mv->after >= 0 ? json_integer(mv->after) : json_null());
        int64_t mb = mv->after >= 0 ? ((mv->after - mv->before) % P + P) % P : 0;
        if (mb > P / 2) mb -= P;
        json_object_set_new(d, "moved_by", mv->after >= 0 ? json_integer(mb) : json_null());
        json_object_set_new(d, "accuracy_before", json_real(mv->acc_before));
        json_object_set_new(d, "accuracy_after", json_real(mv->acc_after));
        json_object_set_new(d, "still_dips_after", json_boolean(mv->still_dips));
        json_array_append_new(dips, d);
    }
    for (int64_t i = 0; i < an.n_new; i++) json_array_append_new(nd, json_integer(an.new_dips[i]));
    for (int64_t i = 0; i < an.n_excluded; i++) json_array_append_new(ex, json_integer(an.excluded[i]));
    if (warning[0]) json_array_append_new(warns, json_string(warning));
    json_object_set_new(res, "dips", dips);
    json_object_set_new(res, "new_dips", nd);
    json_object_set_new(res, "excluded_residues", ex);
    json_object_set_new(res, "best_shift", json_integer(an.best_shift));
    json_object_set_new(res, "best_shift_signed", json_integer(an.best_shift_signed));
    json_object_set_new(res, "best_shift_correlation", json_real(an.best_shift_correlation));
    json_object_set_new(res, "warnings", warns);
    if (per_head) json_object_set(res, "per_head", per_head); /* --measure knockout */
    if (ps_result_write(out, "gatecycle.json", res, err)) goto done;
    if (warning[0]) fprintf(stderr, "phasescope gatecycle: warning: %s\n", warning);
    /* the family's line (what was cycled), with the curves' means where it asks for them */
    ps_say(out, "%s", summary);
    if (json_is_true(json_object_get(meta, "summary_means")))
        ps_say(out, "; mean accuracy %.3f -> %.3f", json_number_value(json_object_get(jb, "mean_accuracy")),
               json_number_value(json_object_get(ja, "mean_accuracy")));
    ps_say(out, "\n");
    for (int64_t i = 0; i < an.n_moves; i++) {
        const ps_dip_move *mv = &an.moves[i];
        if (mv->after >= 0)
            ps_say(out, "  dip at rho %lld (%.3f) -> rho %lld (%.3f)", (long long)mv->before, mv->acc_before, (long long)mv->after,
                   mv->acc_after);
        else if (an.after_near_chance)
            ps_say(out, "  dip at rho %lld (%.3f) -> nowhere: every residue is near chance after cycling", (long long)mv->before,
                   mv->acc_before);
        else
            ps_say(out, "  dip at rho %lld (%.3f) -> %s", (long long)mv->before, mv->acc_before,
                   mv->still_dips ? "stays (no new dip)" : "gone (no new dip)");
        if (mv->still_dips) ps_say(out, "; rho %lld still dips after (%.3f)", (long long)mv->before, aa[mv->before]);
        else if (mv->after >= 0) ps_say(out, "; rho %lld recovers (%.3f)", (long long)mv->before, aa[mv->before]);
        ps_say(out, "\n");
    }
    if (!an.n_moves) ps_say(out, "  no dip before cycling\n");
    for (int64_t i = 0; i < an.n_new; i++)
        ps_say(out, "  new dip at rho %lld (%.3f)\n", (long long)an.new_dips[i], aa[an.new_dips[i]]);
    ps_say(out, "whole-curve best-aligning shift %lld (signed %+lld, correlation %.3f)%s", (long long)an.best_shift,
           (long long)an.best_shift_signed, an.best_shift_correlation,
           an.after_near_chance ? " [meaningless: the cycled curve is near chance]" : "");
    if (an.n_excluded) {
        ps_say(out, "; left out %lld residue%s near chance in both curves:", (long long)an.n_excluded, an.n_excluded == 1 ? "" : "s");
        for (int64_t i = 0; i < an.n_excluded; i++) ps_say(out, " %lld", (long long)an.excluded[i]);
    }
    ps_say(out, "\n");
    rc = 0;
done:
    free(ab);
    free(aa);
    ps_cycle_analysis_free(&an);
    json_decref(res);
    json_decref(per_head);
    ps_residue_stats_free(&before);
    ps_residue_stats_free(&after);
    return rc;
}
