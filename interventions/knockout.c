#include "interventions/knockout.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fileio.h"
#include "core/ops.h"
#include "interventions/atp.h"
#include "interventions/patching.h"
#include "interventions/units.h"
#include "tasks/tasks.h"

void ps_knockout_result_free(ps_knockout_result *r) { ps_grid_result_free(r); }

double ps_knockout_default_budget(void) { return ps_grid_default_budget(); }

int64_t ps_knockout_n_units(int64_t N, int64_t batch, int64_t P, int n_layers) { return ps_grid_n_units(N, batch, P, n_layers); }

/* ---- any family ---- */

const char *const *ps_knockout_targets(const ps_runtime *rt) { return rt->family->ko.targets; }
int ps_knockout_default_target(const ps_runtime *rt) { return rt->family->ko.default_target(rt); }
int64_t ps_knockout_target_heads(const ps_runtime *rt, int target) { return rt->family->ko.heads(rt, target); }
const char *ps_knockout_layer_missing(const ps_runtime *rt, int target, int layer, char *buf, size_t n) {
    return rt->family->ko.missing ? rt->family->ko.missing(rt, target, layer, buf, n) : NULL;
}
int ps_knockout_default_target_at(const ps_runtime *rt, int64_t T) {
    return rt->family->ko.default_at ? rt->family->ko.default_at(rt, T) : ps_knockout_default_target(rt);
}
const char *ps_knockout_layer_missing_at(const ps_runtime *rt, int target, int layer, int64_t T, char *buf, size_t n) {
    return rt->family->ko.missing_at ? rt->family->ko.missing_at(rt, target, layer, T, buf, n)
                                     : ps_knockout_layer_missing(rt, target, layer, buf, n);
}
const char *ps_knockout_layer_missing_in(const ps_runtime *rt, int target, int layer, int64_t T0, int64_t T1, char *buf, size_t n) {
    if (!rt->family->ko.missing_at) return ps_knockout_layer_missing(rt, target, layer, buf, n);
    for (int64_t T = T0; T <= T1; T++) {
        const char *m = rt->family->ko.missing_at(rt, target, layer, T, buf, n);
        if (m) return m;
    }
    return NULL;
}
const char *ps_knockout_unit(const ps_runtime *rt, int target) {
    return rt->family->ko.unit ? rt->family->ko.unit(rt, target) : NULL;
}
const char *ps_knockout_heads_what(const ps_runtime *rt) { return rt->family->ko.heads_what ? rt->family->ko.heads_what : "heads"; }

int ps_knockout_run(const ps_knockout_spec *k, ps_knockout_result *out, ps_error *err) {
    memset(out, 0, sizeof *out);
    const ps_runtime *rt = k->rt;
    const ps_family *f = rt->family;
    if (!f->ko.targets) return ps_fail(err, "knockout: the %s family has no knockout targets", f->name);
    int nt = 0;
    while (f->ko.targets[nt]) nt++;
    if (k->target < 0 || k->target >= nt) return ps_fail(err, "knockout: target %d out of range", k->target);
    char why[256];
    /* the lengths the shifts run: a prompt set's T, or the sweep's base.T + p for p < P (prefix padding) */
    int64_t T0 = k->prompts ? k->prompts->b.T : k->base ? k->base->T : 0, T1 = k->prompts || !k->base ? T0 : T0 + k->P - 1;
    for (int i = 0; i < k->n_layers; i++) {
        const char *m = T0 > 0 ? ps_knockout_layer_missing_in(rt, k->target, k->layers[i], T0, T1, why, sizeof why)
                               : ps_knockout_layer_missing(rt, k->target, k->layers[i], why, sizeof why);
        if (m) return ps_fail(err, "%s", m);
    }
    int64_t nh_max = f->ko.heads(rt, k->target);
    static const int ONE[1] = {0};
    const int *heads = k->heads;
    int n_heads = k->n_heads;
    if (!nh_max) heads = ONE, n_heads = 1; /* a per-layer target: one cell per layer */
    for (int i = 0; nh_max && i < n_heads; i++)
        if (heads[i] < 0 || heads[i] >= nh_max) return ps_fail(err, "knockout grid: head %d out of range", heads[i]);
    ps_grid_spec spec;
    int atp = k->opts.atp, patch = k->corrupt != NULL;
    if (patch && (atp || !k->prompts))
        return ps_fail(err, "activation patching runs exactly (no attribution estimate) on a prompt set (its clean prompts)");
    if (patch ? ps_patch_target_spec(rt, k->target, heads, n_heads, &spec, err)
        : atp ? ps_atp_spec(rt, k->target, heads, n_heads, k->opts.atp_fix, &spec, err)
              : ps_ko_spec(rt, k->target, heads, n_heads, &spec, err))
        return -1;
    ps_grid g = {.rt = rt, .base = k->base, .task = k->task, .fam = k->fam, .prompts = k->prompts, .P = k->P, .seed = k->seed, .batch = k->batch,
                 .layers = k->layers, .n_layers = k->n_layers, .cells = heads, .n_cells = n_heads, .spec = &spec,
                 .naive = k->opts.naive, .max_cells = k->opts.max_cells, .mem_bytes = k->opts.mem_bytes,
                 .cell_mask = k->opts.cell_mask, .unit0 = k->opts.unit0, .unit1 = k->opts.unit1, .record = k->opts.record,
                 .record_user = k->opts.record_user, .progress = k->progress, .progress_user = k->progress_user,
                 .ref_tokens = k->corrupt};
    int rc = ps_grid_run(&g, out, err);
    if (patch) ps_patch_spec_free(rt, &spec);
    else if (atp) ps_atp_spec_free(rt, &spec);
    else ps_ko_spec_free(&spec);
    return rc;
}

/* A cell's effect by its worst residue: the largest increase of mean target NLL over the residues with
 * prompts (-inf when none has any). */
static double cell_effect(const ps_knockout_result *r, int64_t ci) {
    double best = -INFINITY;
    for (int64_t rho = 0; rho < r->P; rho++) {
        const ps_residue_stats *cs = &r->cells[ci];
        if (!cs->n[rho] || !r->clean.n[rho]) continue;
        double d = -cs->lp[rho] / (double)cs->n[rho] + r->clean.lp[rho] / (double)r->clean.n[rho];
        if (d > best) best = d;
    }
    return best;
}

void ps_knockout_top_cells(const ps_knockout_result *r, int64_t K, unsigned char *mask) {
    int64_t nc = (int64_t)r->n_layers * r->n_heads;
    memset(mask, 0, (size_t)nc);
    for (int64_t k = 0; k < K && k < nc; k++) {
        int64_t best = -1;
        double bv = -INFINITY;
        for (int64_t ci = 0; ci < nc; ci++) {
            double e = cell_effect(r, ci);
            if (!mask[ci] && (best < 0 || e > bv)) best = ci, bv = e;
        }
        if (best >= 0) mask[best] = 1;
    }
}

#define SET(o, key, v) (bad |= json_object_set_new((o), (key), (v)) != 0)

/* One cell's object: {"layer", "head", "residues", "mean_delta_accuracy_pp", "mean_delta_nll",
 * "worst_residue"}. est: the statistics are an estimate (no accuracy: nulls; the worst residue is the largest
 * estimated NLL increase). NULL when memory runs out. */
static json_t *cell_json(const ps_residue_stats *clean, const ps_residue_stats *cs, int64_t P, int layer, int head, int est) {
    int bad = 0;
    json_t *cell = json_object(), *res = json_array();
    if (!cell || !res) {
        json_decref(cell);
        json_decref(res);
        return NULL;
    }
    SET(cell, "layer", json_integer(layer));
    SET(cell, "head", json_integer(head));
    double sum_da = 0, sum_dn = 0, worst_da = INFINITY, worst_dn = 0, worst_ac = 0, worst_ak = 0;
    int64_t used = 0, worst = -1;
    for (int64_t rho = 0; rho < P; rho++) {
        json_t *e = json_object();
        double ac = ps_residue_accuracy(clean, rho), ak = ps_residue_accuracy(cs, rho);
        double nc = clean->n[rho] ? -clean->lp[rho] / (double)clean->n[rho] : 0;
        double nk = cs->n[rho] ? -cs->lp[rho] / (double)cs->n[rho] : 0;
        SET(e, "rho", json_integer(rho));
        SET(e, "n", json_integer(cs->n[rho]));
        SET(e, "accuracy", est ? json_null() : json_real(ak));
        SET(e, "mean_nll", json_real(nk));
        SET(e, "delta_accuracy_pp", est ? json_null() : json_real(100.0 * (ak - ac)));
        SET(e, "delta_nll", json_real(nk - nc));
        bad |= json_array_append_new(res, e) != 0;
        if (cs->n[rho]) {
            double da = 100.0 * (ak - ac), dn = nk - nc;
            sum_da += da;
            sum_dn += dn;
            used++;
            /* the residue the head hurts most: largest accuracy drop, ties by the larger NLL increase (an
             * estimate: the largest NLL increase) */
            int better = est ? worst < 0 || dn > worst_dn + 1e-12
                             : worst < 0 || da < worst_da - 1e-9 || (fabs(da - worst_da) <= 1e-9 && dn > worst_dn);
            if (better) {
                worst = rho;
                worst_da = da;
                worst_dn = dn;
                worst_ac = ac;
                worst_ak = ak;
            }
        }
    }
    SET(cell, "residues", res);
    SET(cell, "mean_delta_accuracy_pp", est ? json_null() : json_real(used ? sum_da / (double)used : 0));
    SET(cell, "mean_delta_nll", json_real(used ? sum_dn / (double)used : 0));
    if (worst >= 0) {
        json_t *w = json_object();
        SET(w, "rho", json_integer(worst));
        SET(w, "clean_accuracy", json_real(worst_ac));
        SET(w, "accuracy", est ? json_null() : json_real(worst_ak));
        SET(w, "delta_accuracy_pp", est ? json_null() : json_real(worst_da));
        SET(w, "delta_nll", json_real(worst_dn));
        SET(cell, "worst_residue", w);
    } else
        SET(cell, "worst_residue", json_null());
    if (bad) {
        json_decref(cell);
        return NULL;
    }
    return cell;
}

json_t *ps_knockout_json(const ps_knockout_result *r, const char *target, const char *unit, ps_error *err) {
    return ps_knockout_json_ex(r, target, unit, NULL, err);
}

json_t *ps_knockout_json_ex(const ps_knockout_result *r, const char *target, const char *unit, const ps_knockout_atp_json *atp,
                            ps_error *err) {
    int bad = 0;
    json_t *o = json_object(), *cells = json_array(), *clean = ps_residue_stats_json(&r->clean, err);
    if (!o || !cells || !clean) {
        json_decref(o);
        json_decref(cells);
        json_decref(clean);
        if (o && cells) return NULL; /* err already names what failed */
        ps_fail(err, "out of memory for the knockout summary");
        return NULL;
    }
    SET(o, "period", json_integer(r->P));
    SET(o, "target", json_string(target));
    if (unit) SET(o, "unit", json_string(unit));
    SET(o, "method", json_string(atp ? "atp" : "exact"));
    if (atp) {
        int nv = 0;
        for (int64_t i = 0; atp->verified && i < (int64_t)r->n_layers * r->n_heads; i++) nv += atp->verified[i] != 0;
        SET(o, "atp", json_pack("{s:s, s:i, s:s}", "fix", atp->fix, "verified", nv, "rank", "worst_residue.delta_nll"));
    }
    SET(o, "clean", clean);
    /* cells in ascending layer order */
    for (int want = -1;;) {
        int next = 1 << 30;
        for (int li = 0; li < r->n_layers; li++)
            if (r->layers[li] > want && r->layers[li] < next) next = r->layers[li];
        if (next == 1 << 30) break;
        want = next;
        int li = 0;
        while (r->layers[li] != want) li++;
        for (int hi = 0; hi < r->n_heads; hi++) {
            int64_t ci = (int64_t)li * r->n_heads + hi;
            json_t *cell = cell_json(&r->clean, &r->cells[ci], r->P, want, r->heads[hi], atp != NULL);
            if (!cell) {
                bad = 1;
                break;
            }
            if (atp) { /* the cell's exact knockout when it was verified */
                json_t *ex = atp->verified && atp->verified[ci] ? cell_json(&r->clean, &atp->exact->cells[ci], r->P, want, r->heads[hi], 0)
                                                                 : json_null();
                if (ex && json_is_object(ex)) {
                    json_object_del(ex, "layer");
                    json_object_del(ex, "head");
                }
                if (!ex) bad = 1;
                else SET(cell, "exact", ex);
            }
            bad |= json_array_append_new(cells, cell) != 0;
        }
    }
    SET(o, "cells", cells);
    if (bad) {
        json_decref(o);
        ps_fail(err, "out of memory while building the knockout summary");
        return NULL;
    }
    return o;
}
