#include "interventions/gatecycle.h"

#include "core/ops.h"
#include "interventions/stats.h"
#include "tasks/tasks.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

double ps_task_chance(const ps_task *t) {
    if (t->kind == PS_TASK_BIGRAM) return t->n_context > 0 ? 1.0 / (double)t->n_context : 0.0;
    if (t->n_values <= 0) return 0.0;
    return pow(1.0 / (double)t->n_values, (double)(t->value_len > 0 ? t->value_len : 1));
}

void ps_cycle_analysis_free(ps_cycle_analysis *a) {
    free(a->moves);
    free(a->new_dips);
    free(a->excluded);
    memset(a, 0, sizeof *a);
}

/* dips of a curve: residues at or below the midpoint of a curve whose gap is at least 5 pp */
static int64_t find_dips(const double *y, int64_t P, int *is_dip) {
    double mn = INFINITY, mx = -INFINITY;
    for (int64_t r = 0; r < P; r++) {
        mn = fmin(mn, y[r]);
        mx = fmax(mx, y[r]);
    }
    int64_t n = 0;
    for (int64_t r = 0; r < P; r++) {
        is_dip[r] = mx - mn >= PS_PHASE_GAP_MIN_PP / 100.0 && y[r] <= (mx + mn) / 2;
        n += is_dip[r];
    }
    return n;
}

/* indices with flag set, deepest (lowest y) first, ties by index */
static int64_t sorted_by_depth(const double *y, const int *flag, int64_t P, int64_t *out) {
    int64_t n = 0;
    for (int64_t r = 0; r < P; r++)
        if (flag[r]) out[n++] = r;
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = i + 1; j < n; j++)
            if (y[out[j]] < y[out[i]] || (y[out[j]] == y[out[i]] && out[j] < out[i])) {
                int64_t t = out[i];
                out[i] = out[j];
                out[j] = t;
            }
    return n;
}

int ps_cycle_analyse(const double *before, const double *after, int64_t P, double chance, ps_cycle_analysis *out,
                     ps_error *err) {
    memset(out, 0, sizeof *out);
    out->P = P;
    out->chance = chance;
    int *db = calloc((size_t)P, sizeof(int)), *da = calloc((size_t)P, sizeof(int)), *fresh = calloc((size_t)P, sizeof(int));
    int *keep = calloc((size_t)P, sizeof(int));
    int64_t *ob = malloc((size_t)P * sizeof(int64_t)), *oa = malloc((size_t)P * sizeof(int64_t));
    out->moves = calloc((size_t)P, sizeof *out->moves);
    out->new_dips = malloc((size_t)P * sizeof(int64_t));
    out->excluded = malloc((size_t)P * sizeof(int64_t));
    int rc = 0;
    if (!db || !da || !fresh || !keep || !ob || !oa || !out->moves || !out->new_dips || !out->excluded) {
        rc = ps_fail(err, "out of memory for the comparison of two curves of %lld residues", (long long)P);
        ps_cycle_analysis_free(out);
        goto done;
    }
    double thr = chance + PS_NEAR_CHANCE_PP / 100.0, mb = 0, ma = 0;
    for (int64_t r = 0; r < P; r++) {
        mb += before[r] / (double)P;
        ma += after[r] / (double)P;
        keep[r] = !(before[r] <= thr && after[r] <= thr);
        if (!keep[r]) out->excluded[out->n_excluded++] = r;
    }
    out->before_near_chance = mb <= thr;
    out->after_near_chance = ma <= thr;
    find_dips(before, P, db);
    find_dips(after, P, da);
    for (int64_t r = 0; r < P; r++) fresh[r] = da[r] && !db[r];
    int64_t nb = sorted_by_depth(before, db, P, ob), na = sorted_by_depth(after, fresh, P, oa);
    for (int64_t i = 0; i < nb; i++) {
        ps_dip_move *mv = &out->moves[out->n_moves++];
        mv->before = ob[i];
        mv->acc_before = before[ob[i]];
        mv->still_dips = da[ob[i]];
        mv->after = i < na ? oa[i] : -1;
        mv->acc_after = i < na ? after[oa[i]] : after[ob[i]];
    }
    for (int64_t i = nb; i < na; i++) out->new_dips[out->n_new++] = oa[i];
    out->best_shift = ps_best_shift_masked(before, after, out->n_excluded ? keep : NULL, P, &out->best_shift_correlation);
    out->best_shift_signed = out->best_shift > P / 2 ? out->best_shift - P : out->best_shift;
done:
    free(db);
    free(da);
    free(fresh);
    free(keep);
    free(ob);
    free(oa);
    return rc;
}

int64_t ps_signed_mod(int64_t d, int64_t P) {
    int64_t m = ((d % P) + P) % P;
    return m > P / 2 ? m - P : m;
}

/* the live residue with the largest hurt (ties: the smallest rho); -1 when none is live */
static int64_t worst_live(const double *hurt, const unsigned char *dead, int64_t P) {
    int64_t w = -1;
    for (int64_t r = 0; r < P; r++)
        if (!(dead && dead[r]) && (w < 0 || hurt[r] > hurt[w])) w = r;
    return w;
}

void ps_head_shift_measure(const double *hurt_before, const double *hurt_after, const unsigned char *dead, int64_t P, int64_t k,
                           double min_hurt, ps_head_shift *out) {
    memset(out, 0, sizeof *out);
    out->worst_before = worst_live(hurt_before, dead, P);
    out->worst_after = worst_live(hurt_after, dead, P);
    out->hurt_before = out->worst_before >= 0 ? hurt_before[out->worst_before] : 0;
    out->hurt_after = out->worst_after >= 0 ? hurt_after[out->worst_after] : 0;
    if (out->worst_before < 0 || !(out->hurt_before >= min_hurt)) {
        out->status = PS_HEAD_NO_PROFILE;
        return;
    }
    if (out->worst_after < 0 || !(out->hurt_after >= min_hurt)) {
        out->status = PS_HEAD_LOST;
        return;
    }
    out->status = PS_HEAD_MEASURED;
    out->shift_worst = ps_signed_mod(out->worst_after - out->worst_before, P);
    double best = -1;
    int64_t bs = 0;
    /* candidate shifts in the order 0, 1, -1, 2, -2, ...: ties go to the smallest |s|, then the positive */
    for (int64_t i = 0; i < P; i++) {
        int64_t s = (i + 1) / 2 * (i % 2 ? 1 : -1);
        s = ps_signed_mod(s, P);
        double c = 0;
        for (int64_t r = 0; r < P; r++) {
            int64_t q = ((r - s) % P + P) % P;
            if (dead && (dead[r] || dead[q])) continue;
            c += fmax(0, hurt_after[r]) * fmax(0, hurt_before[q]);
        }
        if (c > best + 1e-12) {
            best = c;
            bs = s;
        }
    }
    out->shift_xcorr = bs;
    out->error_worst = ps_signed_mod(out->shift_worst - k, P);
    out->error_xcorr = ps_signed_mod(out->shift_xcorr - k, P);
}

/* ---- the per-head measure (--measure knockout) ---- */

json_t *ps_gatecycle_per_head_json(const ps_grid_result *kb, const ps_grid_result *ka, int64_t k, double chance,
                                   double min_hurt, ps_error *err) {
    int nh = kb->n_heads;
    const int *heads = kb->heads;
    json_t *out = NULL;
    int64_t P = kb->P;
    if (ka->n_heads != nh || ka->P != P || kb->n_layers != 1 || ka->n_layers != 1) {
        ps_fail(err, "the per-head measure's two knockout grids differ in their heads or period");
        return NULL;
    }
    double *hb = malloc((size_t)P * sizeof(double)), *ha = malloc((size_t)P * sizeof(double));
    unsigned char *dead = calloc((size_t)P, 1);
    if (!hb || !ha || !dead) {
        ps_fail(err, "out of memory for the per-head measure");
        goto done;
    }
    json_t *ex = json_array(), *hl = json_array();
    for (int64_t r = 0; r < P; r++) {
        double cb = ps_residue_accuracy(&kb->clean, r), ca = ps_residue_accuracy(&ka->clean, r);
        int db = !(cb > chance + PS_NEAR_CHANCE_PP / 100), da = !(ca > chance + PS_NEAR_CHANCE_PP / 100);
        dead[r] = (unsigned char)(db && da);
        if (dead[r]) json_array_append_new(ex, json_integer(r));
    }
    int n_meas = 0, n_lost = 0, n_none = 0, exact_w = 0, exact_x = 0;
    double abs_w = 0, abs_x = 0;
    for (int i = 0; i < nh; i++) {
        for (int64_t r = 0; r < P; r++) {
            double v = -100 * (ps_residue_accuracy(&kb->cells[i], r) - ps_residue_accuracy(&kb->clean, r));
            hb[r] = isfinite(v) ? v : 0;
            v = -100 * (ps_residue_accuracy(&ka->cells[i], r) - ps_residue_accuracy(&ka->clean, r));
            ha[r] = isfinite(v) ? v : 0;
        }
        ps_head_shift hs;
        ps_head_shift_measure(hb, ha, dead, P, k, min_hurt, &hs);
        json_t *e = json_object(), *pb = json_array(), *pa = json_array();
        for (int64_t r = 0; r < P; r++) {
            json_array_append_new(pb, json_real(hb[r]));
            json_array_append_new(pa, json_real(ha[r]));
        }
        static const char *const ST[] = {"measured", "no_profile", "lost"};
        json_object_set_new(e, "head", json_integer(heads[i]));
        json_object_set_new(e, "status", json_string(ST[hs.status]));
        json_object_set_new(e, "hurt_before_pp", pb);
        json_object_set_new(e, "hurt_after_pp", pa);
        json_object_set_new(e, "worst_before", hs.worst_before >= 0 ? json_integer(hs.worst_before) : json_null());
        json_object_set_new(e, "worst_after", hs.worst_after >= 0 ? json_integer(hs.worst_after) : json_null());
        int m = hs.status == PS_HEAD_MEASURED;
        json_object_set_new(e, "shift_worst", m ? json_integer(hs.shift_worst) : json_null());
        json_object_set_new(e, "error_worst", m ? json_integer(hs.error_worst) : json_null());
        json_object_set_new(e, "shift_xcorr", m ? json_integer(hs.shift_xcorr) : json_null());
        json_object_set_new(e, "error_xcorr", m ? json_integer(hs.error_xcorr) : json_null());
        json_array_append_new(hl, e);
        if (m) {
            n_meas++;
            abs_w += llabs(hs.error_worst);
            abs_x += llabs(hs.error_xcorr);
            exact_w += hs.error_worst == 0;
            exact_x += hs.error_xcorr == 0;
        }
        n_lost += hs.status == PS_HEAD_LOST;
        n_none += hs.status == PS_HEAD_NO_PROFILE;
    }
    json_t *sum = json_object();
    json_object_set_new(sum, "n_heads", json_integer(nh));
    json_object_set_new(sum, "n_measured", json_integer(n_meas));
    json_object_set_new(sum, "n_lost", json_integer(n_lost));
    json_object_set_new(sum, "n_no_profile", json_integer(n_none));
    json_object_set_new(sum, "mean_abs_error_worst", n_meas ? json_real(abs_w / n_meas) : json_null());
    json_object_set_new(sum, "fraction_exact_worst", n_meas ? json_real((double)exact_w / n_meas) : json_null());
    json_object_set_new(sum, "mean_abs_error_xcorr", n_meas ? json_real(abs_x / n_meas) : json_null());
    json_object_set_new(sum, "fraction_exact_xcorr", n_meas ? json_real((double)exact_x / n_meas) : json_null());
    out = json_object();
    json_object_set_new(out, "measure", json_string("knockout"));
    json_object_set_new(out, "target", json_string("compressed"));
    json_object_set_new(out, "min_hurt_pp", json_real(min_hurt));
    json_object_set_new(out, "excluded_residues", ex);
    json_object_set_new(out, "heads", hl);
    json_object_set_new(out, "summary", sum);
done:
    free(hb);
    free(ha);
    free(dead);
    return out;
}
