/* check_common.c — the validators' shared pieces (viz/check_common.h): the field path, typed getters, the
 * provenance block and phase curves. */
#include "viz/check_common.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/runtime.h"
#include "interventions/stats.h" /* Wilson intervals, chi-square, the folding period of a curve */

/* ---- the path of the field being checked ---- */

static size_t push(ps_ck *c, const char *fmt, ...) {
    size_t old = c->len;
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(c->path + c->len, sizeof c->path - c->len, fmt, ap);
    va_end(ap);
    if (w > 0) c->len = c->len + (size_t)w < sizeof c->path ? c->len + (size_t)w : sizeof c->path - 1;
    return old;
}
size_t ps_ck_key(ps_ck *c, const char *k) { return push(c, c->len ? ".%s" : "%s", k); }
size_t ps_ck_idx(ps_ck *c, size_t i) { return push(c, "[%zu]", i); }
void ps_ck_pop(ps_ck *c, size_t old) {
    c->len = old;
    c->path[old] = '\0';
}

int ps_ck_bad(ps_ck *c, const char *fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return ps_fail(c->err, "%s: %s: %s", c->file, c->len ? c->path : "(top level)", msg);
}

const char *ps_ck_type_name(const json_t *v) { return ps_config_type_name(v); }

int ps_ck_close_to(double a, double b, double scale) { return fabs(a - b) <= TOL * fmax(1.0, scale); }

/* ---- typed fields: each pushes the key, checks, and pops on success (on failure the path stays) ---- */

int ps_ck_field(ps_ck *c, json_t *o, const char *k, json_t **v) {
    ps_ck_key(c, k);
    *v = json_object_get(o, k);
    if (!*v) return ps_ck_bad(c, "missing");
    return 0;
}

int ps_ck_want_type(ps_ck *c, json_t *v, int ok, const char *what) {
    if (!ok) return ps_ck_bad(c, "expected %s, got %s", what, ps_ck_type_name(v));
    return 0;
}

int ps_ck_get_obj(ps_ck *c, json_t *o, const char *k, json_t **v) {
    size_t old = c->len;
    if (ps_ck_field(c, o, k, v) || ps_ck_want_type(c, *v, json_is_object(*v), "an object")) return -1;
    ps_ck_pop(c, old);
    return 0;
}

/* an array of exactly n entries (n < 0: any length within [lo, hi]) */
int ps_ck_get_arr(ps_ck *c, json_t *o, const char *k, int64_t lo, int64_t hi, json_t **v, int64_t *n) {
    size_t old = c->len;
    if (ps_ck_field(c, o, k, v) || ps_ck_want_type(c, *v, json_is_array(*v), "an array")) return -1;
    int64_t m = (int64_t)json_array_size(*v);
    if (m < lo || m > hi) {
        if (lo == hi) return ps_ck_bad(c, "%lld entries, expected %lld", (long long)m, (long long)lo);
        return ps_ck_bad(c, "%lld entries, expected %lld to %lld", (long long)m, (long long)lo, (long long)hi);
    }
    if (n) *n = m;
    ps_ck_pop(c, old);
    return 0;
}

int ps_ck_int_value(ps_ck *c, json_t *v, int64_t lo, int64_t hi, int64_t *out) {
    if (json_is_real(v)) {
        double d = json_real_value(v);
        return ps_ck_bad(c, "%.10g is not an integer", d);
    }
    if (ps_ck_want_type(c, v, json_is_integer(v), "an integer")) return -1;
    int64_t x = (int64_t)json_integer_value(v);
    if (x < lo || x > hi) {
        if (lo == 0 && x < 0) return ps_ck_bad(c, "%lld is negative", (long long)x);
        return ps_ck_bad(c, "%lld is out of range [%lld, %lld]", (long long)x, (long long)lo, (long long)hi);
    }
    if (out) *out = x;
    return 0;
}

int ps_ck_get_int(ps_ck *c, json_t *o, const char *k, int64_t lo, int64_t hi, int64_t *out) {
    size_t old = c->len;
    json_t *v;
    if (ps_ck_field(c, o, k, &v) || ps_ck_int_value(c, v, lo, hi, out)) return -1;
    ps_ck_pop(c, old);
    return 0;
}

int ps_ck_num_value(ps_ck *c, json_t *v, double lo, double hi, double *out) {
    if (ps_ck_want_type(c, v, json_is_number(v), "a number")) return -1;
    double x = json_number_value(v);
    if (!isfinite(x)) return ps_ck_bad(c, "%g is not finite", x);
    if (x < lo || x > hi) {
        if (lo == 0 && x < 0) return ps_ck_bad(c, "%.10g is negative", x);
        if (isinf(hi)) return ps_ck_bad(c, "%.10g is less than %g", x, lo);
        if (isinf(lo)) return ps_ck_bad(c, "%.10g is more than %g", x, hi);
        return ps_ck_bad(c, "%.10g is out of range [%g, %g]", x, lo, hi);
    }
    if (out) *out = x;
    return 0;
}

int ps_ck_get_num(ps_ck *c, json_t *o, const char *k, double lo, double hi, double *out) {
    size_t old = c->len;
    json_t *v;
    if (ps_ck_field(c, o, k, &v) || ps_ck_num_value(c, v, lo, hi, out)) return -1;
    ps_ck_pop(c, old);
    return 0;
}

/* a fraction in [0, 1] (rounding may overshoot by TOL; the value is clamped) */
int ps_ck_get_frac(ps_ck *c, json_t *o, const char *k, double *out) {
    double x = 0;
    size_t old = c->len;
    json_t *v;
    if (ps_ck_field(c, o, k, &v) || ps_ck_want_type(c, v, json_is_number(v), "a number")) return -1;
    x = json_number_value(v);
    if (!(x >= -TOL && x <= 1 + TOL)) return ps_ck_bad(c, "%.10g is out of range [0, 1]", x);
    ps_ck_pop(c, old);
    if (out) *out = fmin(1, fmax(0, x));
    return 0;
}

int ps_ck_get_str(ps_ck *c, json_t *o, const char *k, const char **out) {
    size_t old = c->len;
    json_t *v;
    if (ps_ck_field(c, o, k, &v) || ps_ck_want_type(c, v, json_is_string(v), "a string")) return -1;
    if (out) *out = json_string_value(v);
    ps_ck_pop(c, old);
    return 0;
}

/* a string that must be one of the NULL-terminated opts */
int ps_ck_get_enum(ps_ck *c, json_t *o, const char *k, const char *const *opts, const char **out) {
    const char *s;
    if (ps_ck_get_str(c, o, k, &s)) return -1;
    for (int i = 0; opts[i]; i++)
        if (!strcmp(s, opts[i])) {
            if (out) *out = s;
            return 0;
        }
    char list[256] = "";
    for (int i = 0; opts[i]; i++) {
        size_t l = strlen(list);
        snprintf(list + l, sizeof list - l, "%s%s", i ? ", " : "", opts[i]);
    }
    ps_ck_key(c, k);
    return ps_ck_bad(c, "\"%.100s\" is not one of %s", s, list);
}

/* optional: absent is fine; present must have the type */
int ps_ck_opt_str(ps_ck *c, json_t *o, const char *k) { return json_object_get(o, k) ? ps_ck_get_str(c, o, k, NULL) : 0; }
int ps_ck_opt_int(ps_ck *c, json_t *o, const char *k, int64_t lo, int64_t hi) {
    return json_object_get(o, k) ? ps_ck_get_int(c, o, k, lo, hi, NULL) : 0;
}

/* ---- provenance ---- */

int ps_ck_provenance(ps_ck *c, json_t *doc, int instrument, const char *mode_kind, ps_prov_info *pi) {
    static const char *const MODES[] = {"pad", "move", NULL};
    json_t *p, *v;
    memset(pi, 0, sizeof *pi);
    if (ps_ck_get_obj(c, doc, "provenance", &p)) return -1;
    size_t old = ps_ck_key(c, "provenance");
    if (ps_ck_get_str(c, p, "command", NULL) || ps_ck_get_str(c, p, "model", NULL) || ps_ck_get_str(c, p, "version", NULL) ||
        ps_ck_get_int(c, p, "seed", 0, INT64_MAX, NULL) || ps_ck_opt_str(c, p, "config_hash") || ps_ck_opt_int(c, p, "model_step", 0, INT64_MAX) ||
        ps_ck_opt_str(c, p, "label") || ps_ck_opt_str(c, p, "kind"))
        return -1;
    /* a served model (`phasescope probe`: provenance.endpoint) has no config phasescope could read */
    if ((instrument && !json_object_get(p, "endpoint")) || json_object_get(p, "config")) {
        json_t *cfg, *att;
        if (ps_ck_get_obj(c, p, "config", &cfg)) return -1;
        size_t o2 = ps_ck_key(c, "config");
        if (ps_ck_get_obj(c, cfg, "attention", &att)) return -1;
        size_t o3 = ps_ck_key(c, "attention");
        if (ps_ck_get_str(c, att, "kind", NULL)) return -1;
        ps_ck_pop(c, o3);
        /* the attention's fields: core's families know their configs (core/runtime.h); a bad one is
         * "KEY: what is wrong" with KEY under provenance.config. A kind no shipped family knows is the model of
         * a family its user defined: the provenance's label and kind describe it */
        ps_model_desc md;
        ps_error de;
        if (ps_model_desc_from_provenance(p, &md, &de)) {
            const char *sep = strstr(de.msg, ": ");
            if (!sep) return ps_ck_bad(c, "%s", de.msg);
            char key[160];
            snprintf(key, sizeof key, "%.*s", (int)(sep - de.msg), de.msg);
            ps_ck_key(c, key);
            return ps_ck_bad(c, "%s", sep + 2);
        }
        if ((v = json_object_get(cfg, "rope")) && !json_is_boolean(v)) {
            ps_ck_key(c, "rope");
            return ps_ck_bad(c, "expected true or false, got %s", ps_ck_type_name(v));
        }
        ps_ck_pop(c, o2);
    }
    if ((v = json_object_get(p, "task")) && !json_is_object(v)) {
        ps_ck_key(c, "task");
        return ps_ck_bad(c, "expected an object, got %s", ps_ck_type_name(v));
    }
    if (instrument) {
        json_t *ev;
        if (ps_ck_get_obj(c, p, "eval", &ev)) return -1;
        size_t o2 = ps_ck_key(c, "eval");
        if (ps_ck_get_int(c, ev, "n_prompts", 1, MAX_PROMPTS, &pi->n_prompts) || ps_ck_get_int(c, ev, "period", 1, MAX_PERIOD, &pi->period))
            return -1;
        json_t *pr = json_object_get(ev, "prompts"); /* a caller's prompt set instead of the task's fillers */
        if (pr) {
            json_t *ps;
            int64_t n, T;
            if (ps_ck_get_obj(c, ev, "prompts", &ps)) return -1;
            size_t o3 = ps_ck_key(c, "prompts");
            if (ps_ck_get_str(c, ps, "source", NULL) || ps_ck_get_int(c, ps, "n", 1, MAX_PROMPTS, &n) ||
                ps_ck_get_int(c, ps, "T", 1, INT64_MAX, &T) || ps_ck_get_str(c, ps, "tokens_hash", NULL))
                return -1;
            if (n != pi->n_prompts) {
                ps_ck_key(c, "n");
                return ps_ck_bad(c, "%lld, but eval.n_prompts is %lld", (long long)n, (long long)pi->n_prompts);
            }
            ps_ck_pop(c, o3);
        } else if (ps_ck_get_str(c, ev, "family", NULL))
            return -1;
        if ((mode_kind && !pr) || json_object_get(ev, "mode"))
            if (ps_ck_get_enum(c, ev, "mode", MODES, NULL)) return -1;
        ps_ck_pop(c, o2);
    }
    ps_ck_pop(c, old);
    return 0;
}


/* ---- curves (sweep.curve, gatecycle.before/after, knockout.grid.clean) ---- */

void ps_ck_curve_free(ps_curve_info *ci) {
    free(ci->n);
    free(ci->k);
    free(ci->acc);
    free(ci->lp);
    memset(ci, 0, sizeof *ci);
}

/* residues[r] of a curve (e, at key index r of "residues"): its counts, accuracy, Wilson interval and
 * mean log-probability, kept in ci at r */
static int ck_residue(ps_ck *c, json_t *e, int64_t r, int64_t P, ps_curve_info *ci) {
    if (ps_ck_want_type(c, e, json_is_object(e), "an object")) return -1;
    int64_t rho, n, k;
    double a, lo, hi, wlo, whi;
    if (ps_ck_get_int(c, e, "rho", INT64_MIN, INT64_MAX, &rho)) return -1;
    if (rho != r) {
        ps_ck_key(c, "rho");
        return ps_ck_bad(c, "%lld, expected %lld (the residues 0..P-1 = 0..%lld, each once, in order)", (long long)rho, (long long)r,
                   (long long)(P - 1));
    }
    if (ps_ck_get_int(c, e, "n", 0, MAX_COUNT, &n) || ps_ck_get_int(c, e, "correct", 0, MAX_COUNT, &k)) return -1;
    if (k > n) {
        ps_ck_key(c, "correct");
        return ps_ck_bad(c, "%lld > n = %lld", (long long)k, (long long)n);
    }
    if (ps_ck_get_frac(c, e, "accuracy", &a)) return -1;
    double want = n ? (double)k / (double)n : 0.0;
    if (!ps_ck_close_to(a, want, 0)) {
        ps_ck_key(c, "accuracy");
        return ps_ck_bad(c, "%.10g, but correct/n = %lld/%lld = %.10g", json_number_value(json_object_get(e, "accuracy")), (long long)k,
                   (long long)n, want);
    }
    if (ps_ck_get_frac(c, e, "wilson_lo", &lo) || ps_ck_get_frac(c, e, "wilson_hi", &hi)) return -1;
    ps_wilson(k, n, 1.96, &wlo, &whi);
    if (!ps_ck_close_to(lo, wlo, 0) || !ps_ck_close_to(hi, whi, 0)) {
        ps_ck_key(c, ps_ck_close_to(lo, wlo, 0) ? "wilson_hi" : "wilson_lo");
        return ps_ck_bad(c, "[%.10g, %.10g] is not the 95%% Wilson interval of %lld/%lld, [%.10g, %.10g]", lo, hi, (long long)k,
                   (long long)n, wlo, whi);
    }
    /* null: not measured (a served model scored by greedy answers: docs/served-models.md) */
    if (json_is_null(json_object_get(e, "mean_logprob"))) ci->lp[r] = NAN;
    else if (ps_ck_get_num(c, e, "mean_logprob", -INFINITY, TOL, &ci->lp[r])) return -1;
    ci->n[r] = n;
    ci->k[r] = k;
    ci->acc[r] = want;
    return 0;
}

/* the curve's totals against its residues (ci): n, mean / min / max accuracy, gap_pp */
static int ck_curve_totals(ps_ck *c, json_t *cv, const ps_curve_info *ci) {
    int64_t N = 0, K = 0, tn;
    double mn = INFINITY, mx = -INFINITY, m;
    for (int64_t r = 0; r < ci->P; r++) {
        N += ci->n[r];
        K += ci->k[r];
        if (ci->n[r]) {
            mn = fmin(mn, ci->acc[r]);
            mx = fmax(mx, ci->acc[r]);
        }
    }
    if (ps_ck_get_int(c, cv, "n", 0, INT64_MAX, &tn)) return -1;
    if (tn != N) {
        ps_ck_key(c, "n");
        return ps_ck_bad(c, "%lld, but the residues' n add up to %lld", (long long)tn, (long long)N);
    }
    if (N == 0) {
        ps_ck_key(c, "n");
        return ps_ck_bad(c, "0: nothing was measured (every residue has n = 0)");
    }
    const char *sk[3] = {"mean_accuracy", "min_accuracy", "max_accuracy"};
    double sv[3] = {(double)K / (double)N, mn, mx};
    const char *why[3] = {"correct/n over all residues", "the lowest residue accuracy", "the highest residue accuracy"};
    for (int i = 0; i < 3; i++) {
        if (ps_ck_get_frac(c, cv, sk[i], &m)) return -1;
        if (!ps_ck_close_to(m, sv[i], 0)) {
            ps_ck_key(c, sk[i]);
            return ps_ck_bad(c, "%.10g, but %s is %.10g", m, why[i], sv[i]);
        }
    }
    if (ps_ck_get_num(c, cv, "gap_pp", -TOL, 100 + TOL, &m)) return -1;
    if (!ps_ck_close_to(m, 100 * (mx - mn), 100)) {
        ps_ck_key(c, "gap_pp");
        return ps_ck_bad(c, "%.10g, but max - min accuracy is %.10g pp", m, 100 * (mx - mn));
    }
    return 0;
}

/* chi_square: recomputed from the residues' counts (ci) */
static int ck_chi_square(ps_ck *c, json_t *cv, const ps_curve_info *ci) {
    json_t *cs;
    double chi2, p, st, pv;
    int64_t df, wdf, used = 0;
    for (int64_t r = 0; r < ci->P; r++) used += ci->n[r] > 0;
    ps_chi_square(ci->k, ci->n, ci->P, &chi2, &wdf, &p);
    if (ps_ck_get_obj(c, cv, "chi_square", &cs)) return -1;
    size_t o4 = ps_ck_key(c, "chi_square");
    if (ps_ck_get_num(c, cs, "statistic", 0, INFINITY, &st) || ps_ck_get_int(c, cs, "df", 0, MAX_PERIOD, &df) ||
        ps_ck_get_num(c, cs, "p_value", 0, 1, &pv))
        return -1;
    if (!ps_ck_close_to(st, chi2, chi2)) {
        ps_ck_key(c, "statistic");
        return ps_ck_bad(c, "%.10g, but the counts give %.10g", st, chi2);
    }
    if (df != wdf) {
        ps_ck_key(c, "df");
        return ps_ck_bad(c, "%lld, but %lld residues have n > 0 (df = %lld)", (long long)df, (long long)used, (long long)wdf);
    }
    if (!ps_ck_close_to(pv, p, 0) && fabs(pv - p) > 1e-3 * p) {
        ps_ck_key(c, "p_value");
        return ps_ck_bad(c, "%.10g, but the counts give %.10g", pv, p);
    }
    ps_ck_pop(c, o4);
    return 0;
}

/* dominant_period: null (flat, or not significant) or P / frequency */
static int ck_dominant_period(ps_ck *c, json_t *cv, int64_t P) {
    json_t *v = json_object_get(cv, "dominant_period");
    if (!v) {
        ps_ck_key(c, "dominant_period");
        return ps_ck_bad(c, "missing");
    }
    if (json_is_null(v)) return 0;
    size_t o5 = ps_ck_key(c, "dominant_period");
    if (ps_ck_want_type(c, v, json_is_object(v), "an object or null")) return -1;
    int64_t fk;
    if (ps_ck_get_int(c, v, "frequency", 0, P / 2, &fk) || ps_ck_get_frac(c, v, "power_fraction", NULL)) return -1;
    json_t *dp = json_object_get(v, "period");
    if (!dp) {
        ps_ck_key(c, "period");
        return ps_ck_bad(c, "missing");
    }
    if (!json_is_null(dp)) {
        ps_ck_key(c, "period");
        double d;
        if (ps_ck_num_value(c, dp, 1, (double)P, &d)) return -1;
        if (fk < 1) return ps_ck_bad(c, "%.10g, but frequency is %lld (no period)", d, (long long)fk);
        if (!ps_ck_close_to(d, (double)P / (double)fk, (double)P))
            return ps_ck_bad(c, "%.10g, but P / frequency = %lld / %lld = %.10g", d, (long long)P, (long long)fk, (double)P / (double)fk);
    }
    ps_ck_pop(c, o5);
    return 0;
}

/* repeat_period by folding (written since the deep-stride models; absent in older files): null or the
 * smallest divisor of P whose folding explains PS_FOLD_R2_MIN of the curve, recomputed here */
static int ck_repeat_period(ps_ck *c, json_t *cv, const ps_curve_info *ci) {
    json_t *v = json_object_get(cv, "repeat_period");
    if (!v || json_is_null(v)) return 0;
    size_t o6 = ps_ck_key(c, "repeat_period");
    if (ps_ck_want_type(c, v, json_is_object(v), "an object or null")) return -1;
    json_t *rp = json_object_get(v, "period");
    if (rp && !json_is_null(rp)) {
        ps_ck_key(c, "period");
        int64_t d;
        if (ps_ck_want_type(c, rp, json_is_integer(rp), "an integer or null")) return -1;
        d = json_integer_value(rp);
        double r2;
        int64_t want = ps_fold_period(ci->acc, ci->P, &r2);
        if (d != want)
            return ps_ck_bad(c, "%lld, but folding the residues' accuracies gives %lld (the smallest divisor of P = %lld explaining %.2f of the curve)",
                       (long long)d, (long long)want, (long long)ci->P, PS_FOLD_R2_MIN);
    }
    ps_ck_pop(c, o6);
    return 0;
}

/* want_P: the period the provenance declares (eval.period) */
int ps_ck_curve(ps_ck *c, json_t *parent, const char *name, int64_t want_P, ps_curve_info *ci) {
    json_t *cv, *res, *v;
    memset(ci, 0, sizeof *ci);
    if (ps_ck_get_obj(c, parent, name, &cv)) return -1;
    size_t old = ps_ck_key(c, name);
    /* period: the number of residues (null is accepted and means "as many as listed") */
    int64_t P;
    v = json_object_get(cv, "period");
    if (!v) {
        ps_ck_key(c, "period");
        return ps_ck_bad(c, "missing");
    }
    if (!json_is_null(v)) {
        size_t o1 = ps_ck_key(c, "period");
        if (ps_ck_int_value(c, v, 1, MAX_PERIOD, &P)) return -1;
        if (P != want_P) return ps_ck_bad(c, "%lld, but provenance.eval.period is %lld", (long long)P, (long long)want_P);
        ps_ck_pop(c, o1);
    }
    if (ps_ck_get_arr(c, cv, "residues", want_P, want_P, &res, NULL)) return -1;
    P = want_P;
    ci->P = P;
    ci->n = calloc((size_t)P, sizeof(int64_t));
    ci->k = calloc((size_t)P, sizeof(int64_t));
    ci->acc = calloc((size_t)P, sizeof(double));
    ci->lp = calloc((size_t)P, sizeof(double));
    if (!ci->n || !ci->k || !ci->acc || !ci->lp) return ps_fail(c->err, "out of memory");
    size_t o2 = ps_ck_key(c, "residues");
    for (int64_t r = 0; r < P; r++) {
        size_t o3 = ps_ck_idx(c, (size_t)r);
        if (ck_residue(c, json_array_get(res, (size_t)r), r, P, ci)) return -1;
        ps_ck_pop(c, o3);
    }
    ps_ck_pop(c, o2);
    if (ck_curve_totals(c, cv, ci) || ck_chi_square(c, cv, ci) || ck_dominant_period(c, cv, P) || ck_repeat_period(c, cv, ci)) return -1;
    ps_ck_pop(c, old);
    return 0;
}
