/* results_check.c — the validator for result JSON; the rules are written out in docs/results-schema.md
 * ("Validation"). Each check names the path of the field at fault (curve.residues[3].correct) and stops at
 * the first fault, in the order the fields appear in the schema. */
#include "viz/results_check.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fileio.h"
#include "interventions/fillers.h" /* the periodicity statistic of text filler experiments */
#include "gates/gates.h"  /* the gate labels */
#include "interventions/stats.h"
#include "gates/theory.h" /* the idealised model's limits */

/* writer limits (results_check.h; the interventions, core/config.c, gates/theory.h) */
#define MAX_PERIOD PS_RESULT_MAX_PERIOD   /* --period */
#define MAX_PROMPTS PS_RESULT_MAX_PROMPTS /* --n */
#define MAX_COUNT ((int64_t)1000000000000000) /* a count of scored queries: far above what a run scores */
#define MAX_INDEX ((int64_t)1 << 24)  /* layers, heads (PS_MAX_DIM) */
#define MAX_WINDOW 4096               /* attention.window */
#define MAX_SHIFT PS_RESULT_MAX_SHIFT /* gatecycle --shift, --layer, --head */
#define TOL 1e-6                      /* "within rounding": results are written with 10 significant digits */

typedef struct {
    const char *file;
    ps_error *err;
    char path[512];
    size_t len;
} ck;

/* ---- the path of the field being checked ---- */

static size_t push(ck *c, const char *fmt, ...) {
    size_t old = c->len;
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(c->path + c->len, sizeof c->path - c->len, fmt, ap);
    va_end(ap);
    if (w > 0) c->len = c->len + (size_t)w < sizeof c->path ? c->len + (size_t)w : sizeof c->path - 1;
    return old;
}
static size_t key(ck *c, const char *k) { return push(c, c->len ? ".%s" : "%s", k); }
static size_t idx(ck *c, size_t i) { return push(c, "[%zu]", i); }
static void pop(ck *c, size_t old) {
    c->len = old;
    c->path[old] = '\0';
}

static int bad(ck *c, const char *fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return ps_fail(c->err, "%s: %s: %s", c->file, c->len ? c->path : "(top level)", msg);
}

static const char *type_name(const json_t *v) {
    if (!v) return "nothing (the field is missing)";
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a fractional number";
    case JSON_TRUE: return "true";
    case JSON_FALSE: return "false";
    default: return "null";
    }
}

static int close_to(double a, double b, double scale) { return fabs(a - b) <= TOL * fmax(1.0, scale); }

/* ---- typed fields: each pushes the key, checks, and pops on success (on failure the path stays) ---- */

static int field(ck *c, json_t *o, const char *k, json_t **v) {
    key(c, k);
    *v = json_object_get(o, k);
    if (!*v) return bad(c, "missing");
    return 0;
}

static int want_type(ck *c, json_t *v, int ok, const char *what) {
    if (!ok) return bad(c, "expected %s, got %s", what, type_name(v));
    return 0;
}

static int get_obj(ck *c, json_t *o, const char *k, json_t **v) {
    size_t old = c->len;
    if (field(c, o, k, v) || want_type(c, *v, json_is_object(*v), "an object")) return -1;
    pop(c, old);
    return 0;
}

/* an array of exactly n entries (n < 0: any length within [lo, hi]) */
static int get_arr(ck *c, json_t *o, const char *k, int64_t lo, int64_t hi, json_t **v, int64_t *n) {
    size_t old = c->len;
    if (field(c, o, k, v) || want_type(c, *v, json_is_array(*v), "an array")) return -1;
    int64_t m = (int64_t)json_array_size(*v);
    if (m < lo || m > hi) {
        if (lo == hi) return bad(c, "%lld entries, expected %lld", (long long)m, (long long)lo);
        return bad(c, "%lld entries, expected %lld to %lld", (long long)m, (long long)lo, (long long)hi);
    }
    if (n) *n = m;
    pop(c, old);
    return 0;
}

static int int_value(ck *c, json_t *v, int64_t lo, int64_t hi, int64_t *out) {
    if (json_is_real(v)) {
        double d = json_real_value(v);
        return bad(c, "%.10g is not an integer", d);
    }
    if (want_type(c, v, json_is_integer(v), "an integer")) return -1;
    int64_t x = (int64_t)json_integer_value(v);
    if (x < lo || x > hi) {
        if (lo == 0 && x < 0) return bad(c, "%lld is negative", (long long)x);
        return bad(c, "%lld is out of range [%lld, %lld]", (long long)x, (long long)lo, (long long)hi);
    }
    if (out) *out = x;
    return 0;
}

static int get_int(ck *c, json_t *o, const char *k, int64_t lo, int64_t hi, int64_t *out) {
    size_t old = c->len;
    json_t *v;
    if (field(c, o, k, &v) || int_value(c, v, lo, hi, out)) return -1;
    pop(c, old);
    return 0;
}

static int num_value(ck *c, json_t *v, double lo, double hi, double *out) {
    if (want_type(c, v, json_is_number(v), "a number")) return -1;
    double x = json_number_value(v);
    if (!isfinite(x)) return bad(c, "%g is not finite", x);
    if (x < lo || x > hi) {
        if (lo == 0 && x < 0) return bad(c, "%.10g is negative", x);
        if (isinf(hi)) return bad(c, "%.10g is less than %g", x, lo);
        if (isinf(lo)) return bad(c, "%.10g is more than %g", x, hi);
        return bad(c, "%.10g is out of range [%g, %g]", x, lo, hi);
    }
    if (out) *out = x;
    return 0;
}

static int get_num(ck *c, json_t *o, const char *k, double lo, double hi, double *out) {
    size_t old = c->len;
    json_t *v;
    if (field(c, o, k, &v) || num_value(c, v, lo, hi, out)) return -1;
    pop(c, old);
    return 0;
}

/* a fraction in [0, 1] (rounding may overshoot by TOL; the value is clamped) */
static int get_frac(ck *c, json_t *o, const char *k, double *out) {
    double x = 0;
    size_t old = c->len;
    json_t *v;
    if (field(c, o, k, &v) || want_type(c, v, json_is_number(v), "a number")) return -1;
    x = json_number_value(v);
    if (!(x >= -TOL && x <= 1 + TOL)) return bad(c, "%.10g is out of range [0, 1]", x);
    pop(c, old);
    if (out) *out = fmin(1, fmax(0, x));
    return 0;
}

static int get_str(ck *c, json_t *o, const char *k, const char **out) {
    size_t old = c->len;
    json_t *v;
    if (field(c, o, k, &v) || want_type(c, v, json_is_string(v), "a string")) return -1;
    if (out) *out = json_string_value(v);
    pop(c, old);
    return 0;
}

/* a string that must be one of the NULL-terminated opts */
static int get_enum(ck *c, json_t *o, const char *k, const char *const *opts, const char **out) {
    const char *s;
    if (get_str(c, o, k, &s)) return -1;
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
    key(c, k);
    return bad(c, "\"%.100s\" is not one of %s", s, list);
}

/* optional: absent is fine; present must have the type */
static int opt_str(ck *c, json_t *o, const char *k) { return json_object_get(o, k) ? get_str(c, o, k, NULL) : 0; }
static int opt_int(ck *c, json_t *o, const char *k, int64_t lo, int64_t hi) {
    return json_object_get(o, k) ? get_int(c, o, k, lo, hi, NULL) : 0;
}

/* ---- provenance ---- */

typedef struct {
    int64_t n_prompts, period; /* eval (0 when the kind has none) */
} prov_info;

static int check_provenance(ck *c, json_t *doc, int instrument, const char *mode_kind, prov_info *pi) {
    static const char *const ATTN[] = {"full", "compressed", "channel", "v4", "deepseek_v4", NULL}, *const MODES[] = {"pad", "move", NULL};
    static const char *const V4MODE[] = {"csa", "hca", NULL};
    json_t *p, *v;
    memset(pi, 0, sizeof *pi);
    if (get_obj(c, doc, "provenance", &p)) return -1;
    size_t old = key(c, "provenance");
    if (get_str(c, p, "command", NULL) || get_str(c, p, "model", NULL) || get_str(c, p, "version", NULL) ||
        get_int(c, p, "seed", 0, INT64_MAX, NULL) || opt_str(c, p, "config_hash") || opt_int(c, p, "model_step", 0, INT64_MAX))
        return -1;
    if (instrument || json_object_get(p, "config")) {
        json_t *cfg, *att;
        const char *kind;
        if (get_obj(c, p, "config", &cfg)) return -1;
        size_t o2 = key(c, "config");
        if (get_obj(c, cfg, "attention", &att)) return -1;
        size_t o3 = key(c, "attention");
        if (get_enum(c, att, "kind", ATTN, &kind)) return -1;
        if (!strcmp(kind, "compressed")) {
            int64_t w;
            if (get_int(c, att, "window", 1, MAX_WINDOW, &w) || get_int(c, att, "stride", 1, w, NULL) || opt_str(c, att, "gate"))
                return -1;
        } else if (!strcmp(kind, "channel") || !strcmp(kind, "v4")) {
            if (get_int(c, att, "rate", 1, MAX_WINDOW, NULL) || get_enum(c, att, "mode", V4MODE, NULL) ||
                get_int(c, att, "local_window", 1, MAX_INDEX, NULL))
                return -1;
        } else if (!strcmp(kind, "deepseek_v4")) {
            json_t *lt, *cr;
            int64_t nl;
            if (get_arr(c, att, "layer_types", 1, MAX_INDEX, &lt, &nl) || get_arr(c, att, "compress_rates", nl, nl, &cr, NULL)) return -1;
            size_t o4 = key(c, "compress_rates");
            for (int64_t i = 0; i < nl; i++) {
                size_t o5 = idx(c, (size_t)i);
                if (int_value(c, json_array_get(cr, (size_t)i), 0, MAX_INDEX, NULL)) return -1;
                pop(c, o5);
            }
            pop(c, o4);
        }
        pop(c, o3);
        if ((v = json_object_get(cfg, "rope")) && !json_is_boolean(v)) {
            key(c, "rope");
            return bad(c, "expected true or false, got %s", type_name(v));
        }
        pop(c, o2);
    }
    if ((v = json_object_get(p, "task")) && !json_is_object(v)) {
        key(c, "task");
        return bad(c, "expected an object, got %s", type_name(v));
    }
    if (instrument) {
        json_t *ev;
        if (get_obj(c, p, "eval", &ev)) return -1;
        size_t o2 = key(c, "eval");
        if (get_int(c, ev, "n_prompts", 1, MAX_PROMPTS, &pi->n_prompts) || get_int(c, ev, "period", 1, MAX_PERIOD, &pi->period) ||
            get_str(c, ev, "family", NULL))
            return -1;
        if (mode_kind || json_object_get(ev, "mode"))
            if (get_enum(c, ev, "mode", MODES, NULL)) return -1;
        pop(c, o2);
    }
    pop(c, old);
    return 0;
}

/* ---- curves (sweep.curve, gatecycle.before/after, knockout.grid.clean) ---- */

typedef struct {
    int64_t P;
    int64_t *n, *k;
    double *acc, *lp;
} curve_info;

static void curve_free(curve_info *ci) {
    free(ci->n);
    free(ci->k);
    free(ci->acc);
    free(ci->lp);
    memset(ci, 0, sizeof *ci);
}

/* want_P: the period the provenance declares (eval.period) */
static int check_curve(ck *c, json_t *parent, const char *name, int64_t want_P, curve_info *ci) {
    json_t *cv, *res, *v;
    memset(ci, 0, sizeof *ci);
    if (get_obj(c, parent, name, &cv)) return -1;
    size_t old = key(c, name);
    /* period: the number of residues (null is accepted and means "as many as listed") */
    int64_t P;
    v = json_object_get(cv, "period");
    if (!v) {
        key(c, "period");
        return bad(c, "missing");
    }
    if (!json_is_null(v)) {
        size_t o1 = key(c, "period");
        if (int_value(c, v, 1, MAX_PERIOD, &P)) return -1;
        if (P != want_P) return bad(c, "%lld, but provenance.eval.period is %lld", (long long)P, (long long)want_P);
        pop(c, o1);
    }
    if (get_arr(c, cv, "residues", want_P, want_P, &res, NULL)) return -1;
    P = want_P;
    ci->P = P;
    ci->n = calloc((size_t)P, sizeof(int64_t));
    ci->k = calloc((size_t)P, sizeof(int64_t));
    ci->acc = calloc((size_t)P, sizeof(double));
    ci->lp = calloc((size_t)P, sizeof(double));
    if (!ci->n || !ci->k || !ci->acc || !ci->lp) return ps_fail(c->err, "out of memory");
    size_t o2 = key(c, "residues");
    int64_t N = 0, K = 0, used = 0;
    double mn = INFINITY, mx = -INFINITY;
    for (int64_t r = 0; r < P; r++) {
        json_t *e = json_array_get(res, (size_t)r);
        size_t o3 = idx(c, (size_t)r);
        if (want_type(c, e, json_is_object(e), "an object")) return -1;
        int64_t rho, n, k;
        double a, lo, hi, wlo, whi;
        if (get_int(c, e, "rho", INT64_MIN, INT64_MAX, &rho)) return -1;
        if (rho != r) {
            key(c, "rho");
            return bad(c, "%lld, expected %lld (the residues 0..P-1 = 0..%lld, each once, in order)", (long long)rho, (long long)r,
                       (long long)(P - 1));
        }
        if (get_int(c, e, "n", 0, MAX_COUNT, &n) || get_int(c, e, "correct", 0, MAX_COUNT, &k)) return -1;
        if (k > n) {
            key(c, "correct");
            return bad(c, "%lld > n = %lld", (long long)k, (long long)n);
        }
        if (get_frac(c, e, "accuracy", &a)) return -1;
        double want = n ? (double)k / (double)n : 0.0;
        if (!close_to(a, want, 0)) {
            key(c, "accuracy");
            return bad(c, "%.10g, but correct/n = %lld/%lld = %.10g", json_number_value(json_object_get(e, "accuracy")), (long long)k,
                       (long long)n, want);
        }
        if (get_frac(c, e, "wilson_lo", &lo) || get_frac(c, e, "wilson_hi", &hi)) return -1;
        ps_wilson(k, n, 1.96, &wlo, &whi);
        if (!close_to(lo, wlo, 0) || !close_to(hi, whi, 0)) {
            key(c, close_to(lo, wlo, 0) ? "wilson_hi" : "wilson_lo");
            return bad(c, "[%.10g, %.10g] is not the 95%% Wilson interval of %lld/%lld, [%.10g, %.10g]", lo, hi, (long long)k,
                       (long long)n, wlo, whi);
        }
        if (get_num(c, e, "mean_logprob", -INFINITY, TOL, &ci->lp[r])) return -1;
        ci->n[r] = n;
        ci->k[r] = k;
        ci->acc[r] = want;
        N += n;
        K += k;
        if (n) {
            used++;
            mn = fmin(mn, want);
            mx = fmax(mx, want);
        }
        pop(c, o3);
    }
    pop(c, o2);
    int64_t tn;
    double m;
    if (get_int(c, cv, "n", 0, INT64_MAX, &tn)) return -1;
    if (tn != N) {
        key(c, "n");
        return bad(c, "%lld, but the residues' n add up to %lld", (long long)tn, (long long)N);
    }
    if (N == 0) {
        key(c, "n");
        return bad(c, "0: nothing was measured (every residue has n = 0)");
    }
    const char *sk[3] = {"mean_accuracy", "min_accuracy", "max_accuracy"};
    double sv[3] = {(double)K / (double)N, mn, mx};
    const char *why[3] = {"correct/n over all residues", "the lowest residue accuracy", "the highest residue accuracy"};
    for (int i = 0; i < 3; i++) {
        if (get_frac(c, cv, sk[i], &m)) return -1;
        if (!close_to(m, sv[i], 0)) {
            key(c, sk[i]);
            return bad(c, "%.10g, but %s is %.10g", m, why[i], sv[i]);
        }
    }
    if (get_num(c, cv, "gap_pp", -TOL, 100 + TOL, &m)) return -1;
    if (!close_to(m, 100 * (mx - mn), 100)) {
        key(c, "gap_pp");
        return bad(c, "%.10g, but max - min accuracy is %.10g pp", m, 100 * (mx - mn));
    }
    /* chi-square: recomputed from the counts */
    json_t *cs;
    double chi2, p, st, pv;
    int64_t df, wdf;
    ps_chi_square(ci->k, ci->n, P, &chi2, &wdf, &p);
    if (get_obj(c, cv, "chi_square", &cs)) return -1;
    size_t o4 = key(c, "chi_square");
    if (get_num(c, cs, "statistic", 0, INFINITY, &st) || get_int(c, cs, "df", 0, MAX_PERIOD, &df) ||
        get_num(c, cs, "p_value", 0, 1, &pv))
        return -1;
    if (!close_to(st, chi2, chi2)) {
        key(c, "statistic");
        return bad(c, "%.10g, but the counts give %.10g", st, chi2);
    }
    if (df != wdf) {
        key(c, "df");
        return bad(c, "%lld, but %lld residues have n > 0 (df = %lld)", (long long)df, (long long)used, (long long)wdf);
    }
    if (!close_to(pv, p, 0) && fabs(pv - p) > 1e-3 * p) {
        key(c, "p_value");
        return bad(c, "%.10g, but the counts give %.10g", pv, p);
    }
    pop(c, o4);
    /* dominant period: null (flat, or not significant) or P / frequency */
    v = json_object_get(cv, "dominant_period");
    if (!v) {
        key(c, "dominant_period");
        return bad(c, "missing");
    }
    if (!json_is_null(v)) {
        size_t o5 = key(c, "dominant_period");
        if (want_type(c, v, json_is_object(v), "an object or null")) return -1;
        int64_t fk;
        if (get_int(c, v, "frequency", 0, P / 2, &fk) || get_frac(c, v, "power_fraction", NULL)) return -1;
        json_t *dp = json_object_get(v, "period");
        if (!dp) {
            key(c, "period");
            return bad(c, "missing");
        }
        if (!json_is_null(dp)) {
            key(c, "period");
            double d;
            if (num_value(c, dp, 1, (double)P, &d)) return -1;
            if (fk < 1) return bad(c, "%.10g, but frequency is %lld (no period)", d, (long long)fk);
            if (!close_to(d, (double)P / (double)fk, (double)P))
                return bad(c, "%.10g, but P / frequency = %lld / %lld = %.10g", d, (long long)P, (long long)fk, (double)P / (double)fk);
        }
        pop(c, o5);
    }
    /* repeat period by folding (written since the deep-stride models; absent in older files): null or the
     * smallest divisor of P whose folding explains PS_FOLD_R2_MIN of the curve, recomputed here */
    v = json_object_get(cv, "repeat_period");
    if (v && !json_is_null(v)) {
        size_t o6 = key(c, "repeat_period");
        if (want_type(c, v, json_is_object(v), "an object or null")) return -1;
        json_t *rp = json_object_get(v, "period");
        if (rp && !json_is_null(rp)) {
            key(c, "period");
            int64_t d;
            if (want_type(c, rp, json_is_integer(rp), "an integer or null")) return -1;
            d = json_integer_value(rp);
            double r2;
            int64_t want = ps_fold_period(ci->acc, P, &r2);
            if (d != want)
                return bad(c, "%lld, but folding the residues' accuracies gives %lld (the smallest divisor of P = %lld explaining %.2f of the curve)",
                           (long long)d, (long long)want, (long long)P, PS_FOLD_R2_MIN);
        }
        pop(c, o6);
    }
    pop(c, old);
    return 0;
}

/* ---- kinds ---- */

static int check_sweep(ck *c, json_t *doc) {
    prov_info pi;
    curve_info ci;
    if (check_provenance(c, doc, 1, "sweep", &pi)) return -1;
    int rc = check_curve(c, doc, "curve", pi.period, &ci);
    curve_free(&ci);
    return rc;
}

/* gatecycle.json "per_head" (--measure knockout): the profiles, each head's shifts and their consistency
 * with the worst residues and K, and the summary recomputed from the heads. */
static int64_t smod(int64_t d, int64_t P) {
    int64_t m = ((d % P) + P) % P;
    return m > P / 2 ? m - P : m;
}

static int check_per_head(ck *c, json_t *ph, int64_t P, int64_t K) {
    static const char *const MEAS[] = {"knockout", NULL}, *const TG[] = {"compressed", "raw", "both", NULL},
                             *const ST[] = {"measured", "no_profile", "lost", NULL};
    json_t *ex, *heads, *sum;
    int64_t nex, nh;
    size_t old = key(c, "per_head");
    if (want_type(c, ph, json_is_object(ph), "an object") || get_enum(c, ph, "measure", MEAS, NULL) ||
        get_enum(c, ph, "target", TG, NULL) || get_num(c, ph, "min_hurt_pp", 0, 100, NULL) ||
        get_arr(c, ph, "excluded_residues", 0, P, &ex, &nex) || get_arr(c, ph, "heads", 1, MAX_SHIFT, &heads, &nh) ||
        get_obj(c, ph, "summary", &sum))
        return -1;
    for (int64_t i = 0; i < nex; i++) {
        size_t o = key(c, "excluded_residues");
        idx(c, (size_t)i);
        if (int_value(c, json_array_get(ex, (size_t)i), 0, P - 1, NULL)) return -1;
        pop(c, o);
    }
    int64_t n_meas = 0, n_lost = 0, n_none = 0, ex_w = 0, ex_x = 0;
    double abs_w = 0, abs_x = 0;
    for (int64_t i = 0; i < nh; i++) {
        json_t *e = json_array_get(heads, (size_t)i), *pr;
        size_t o1 = key(c, "heads");
        idx(c, (size_t)i);
        const char *st;
        if (want_type(c, e, json_is_object(e), "an object") || get_int(c, e, "head", 0, MAX_SHIFT, NULL) ||
            get_enum(c, e, "status", ST, &st))
            return -1;
        for (int b = 0; b < 2; b++) {
            const char *pk = b ? "hurt_after_pp" : "hurt_before_pp";
            if (get_arr(c, e, pk, P, P, &pr, NULL)) return -1;
            for (int64_t r = 0; r < P; r++) {
                size_t o2 = key(c, pk);
                idx(c, (size_t)r);
                if (num_value(c, json_array_get(pr, (size_t)r), -100 - TOL, 100 + TOL, NULL)) return -1;
                pop(c, o2);
            }
        }
        int m = !strcmp(st, "measured");
        int64_t wb = -1, wa = -1, sw = 0, ew = 0, sx = 0, exx = 0;
        static const char *const WK[] = {"worst_before", "worst_after"};
        for (int b = 0; b < 2; b++) {
            json_t *w = json_object_get(e, WK[b]);
            size_t o2 = key(c, WK[b]);
            if (!w) return bad(c, "missing");
            if (!json_is_null(w) && int_value(c, w, 0, P - 1, b ? &wa : &wb)) return -1;
            if (m && json_is_null(w)) return bad(c, "null, but the head is measured");
            pop(c, o2);
        }
        static const char *const SK[] = {"shift_worst", "error_worst", "shift_xcorr", "error_xcorr"};
        int64_t *sv[] = {&sw, &ew, &sx, &exx};
        for (int q = 0; q < 4; q++) {
            json_t *w = json_object_get(e, SK[q]);
            size_t o2 = key(c, SK[q]);
            if (!w) return bad(c, "missing");
            if (!m) {
                if (!json_is_null(w)) return bad(c, "expected null (the head's status is %s)", st);
            } else if (int_value(c, w, -P, P, sv[q]))
                return -1;
            else if (*sv[q] != smod(*sv[q], P))
                return bad(c, "%lld is not in (-P/2, P/2]", (long long)*sv[q]);
            pop(c, o2);
        }
        if (m) {
            if (sw != smod(wa - wb, P)) {
                key(c, "shift_worst");
                return bad(c, "%lld, but worst_after - worst_before = %lld (mod P)", (long long)sw, (long long)smod(wa - wb, P));
            }
            if (ew != smod(sw - K, P)) {
                key(c, "error_worst");
                return bad(c, "%lld, but shift_worst - cycle.shift = %lld (mod P)", (long long)ew, (long long)smod(sw - K, P));
            }
            if (exx != smod(sx - K, P)) {
                key(c, "error_xcorr");
                return bad(c, "%lld, but shift_xcorr - cycle.shift = %lld (mod P)", (long long)exx, (long long)smod(sx - K, P));
            }
            n_meas++;
            abs_w += (double)llabs(ew);
            abs_x += (double)llabs(exx);
            ex_w += ew == 0;
            ex_x += exx == 0;
        }
        n_lost += !strcmp(st, "lost");
        n_none += !strcmp(st, "no_profile");
        pop(c, o1);
    }
    size_t o1 = key(c, "summary");
    int64_t v;
    const char *const CK[] = {"n_heads", "n_measured", "n_lost", "n_no_profile"};
    int64_t want[] = {nh, n_meas, n_lost, n_none};
    for (int q = 0; q < 4; q++) {
        if (get_int(c, sum, CK[q], 0, MAX_SHIFT, &v)) return -1;
        if (v != want[q]) {
            key(c, CK[q]);
            return bad(c, "%lld, but the heads say %lld", (long long)v, (long long)want[q]);
        }
    }
    const char *const SK2[] = {"mean_abs_error_worst", "fraction_exact_worst", "mean_abs_error_xcorr", "fraction_exact_xcorr"};
    double w2[] = {n_meas ? abs_w / (double)n_meas : 0, n_meas ? (double)ex_w / (double)n_meas : 0,
                   n_meas ? abs_x / (double)n_meas : 0, n_meas ? (double)ex_x / (double)n_meas : 0};
    for (int q = 0; q < 4; q++) {
        json_t *w = json_object_get(sum, SK2[q]);
        size_t o2 = key(c, SK2[q]);
        if (!w) return bad(c, "missing");
        if (!n_meas) {
            if (!json_is_null(w)) return bad(c, "expected null (no head measured)");
        } else {
            double x;
            if (num_value(c, w, 0, (double)P, &x)) return -1;
            if (fabs(x - w2[q]) > 1e-6 * fmax(1, fabs(w2[q])))
                return bad(c, "%.10g, but the heads give %.10g", x, w2[q]);
        }
        pop(c, o2);
    }
    pop(c, o1);
    pop(c, old);
    return 0;
}

static int check_gatecycle(ck *c, json_t *doc) {
    static const char *const BR[] = {"key", "value", "both", "compressor", "indexer", NULL},
                             *const PA[] = {"gate", "payload", "all", NULL};
    prov_info pi;
    curve_info b = {0}, a = {0};
    json_t *cy, *v;
    int rc = -1;
    if (check_provenance(c, doc, 1, NULL, &pi) || get_obj(c, doc, "cycle", &cy)) goto done;
    size_t old = key(c, "cycle"), in_cycle = c->len;
    int64_t K;
    if (get_int(c, cy, "layer", 0, MAX_SHIFT, NULL) || get_int(c, cy, "shift", -MAX_SHIFT, MAX_SHIFT, &K)) goto done;
    if (field(c, cy, "head", &v)) goto done;
    if (json_is_string(v)) {
        if (strcmp(json_string_value(v), "all")) {
            bad(c, "\"%.100s\": expected \"all\" or a head number", json_string_value(v));
            goto done;
        }
    } else if (int_value(c, v, 0, MAX_SHIFT, NULL))
        goto done;
    pop(c, in_cycle);
    if (get_enum(c, cy, "branch", BR, NULL) || get_enum(c, cy, "params", PA, NULL)) goto done;
    pop(c, old);
    if (check_curve(c, doc, "before", pi.period, &b) || check_curve(c, doc, "after", pi.period, &a)) goto done;
    /* the shift statistic may leave residues out (those near chance), so it is checked for range and
     * consistency, not recomputed */
    int64_t P = pi.period, s, ss;
    if (get_int(c, doc, "best_shift", 0, P - 1, &s) || get_int(c, doc, "best_shift_signed", -P, P, &ss)) goto done;
    if (ss != (s > P / 2 ? s - P : s)) {
        key(c, "best_shift_signed");
        bad(c, "%lld, but best_shift %lld maps to %lld in (-P/2, P/2]", (long long)ss, (long long)s, (long long)(s > P / 2 ? s - P : s));
        goto done;
    }
    if (get_num(c, doc, "best_shift_correlation", -1 - TOL, 1 + TOL, NULL)) goto done;
    if ((v = json_object_get(doc, "per_head")) && check_per_head(c, v, P, K)) goto done;
    rc = 0;
done:
    curve_free(&b);
    curve_free(&a);
    return rc;
}

static int cmp_i64(const void *x, const void *y) {
    int64_t a = *(const int64_t *)x, b = *(const int64_t *)y;
    return a < b ? -1 : a > b;
}

static int check_knockout(ck *c, json_t *doc) {
    static const char *const TGT[] = {"raw", "compressed", "both", "heads", "indexer", "sink", NULL};
    prov_info pi;
    curve_info cl = {0};
    json_t *g, *cells;
    int64_t P, nc, *pairs = NULL;
    int rc = -1;
    if (check_provenance(c, doc, 1, NULL, &pi) || get_obj(c, doc, "grid", &g)) goto done;
    size_t old = key(c, "grid");
    if (get_int(c, g, "period", 1, MAX_PERIOD, &P)) goto done;
    if (P != pi.period) {
        key(c, "period");
        bad(c, "%lld, but provenance.eval.period is %lld", (long long)P, (long long)pi.period);
        goto done;
    }
    if (get_enum(c, g, "target", TGT, NULL) || check_curve(c, g, "clean", P, &cl)) goto done;
    if (get_arr(c, g, "cells", 1, MAX_WINDOW * (int64_t)MAX_WINDOW, &cells, &nc)) goto done;
    pairs = malloc((size_t)nc * sizeof *pairs);
    if (!pairs) {
        ps_fail(c->err, "out of memory");
        goto done;
    }
    size_t o2 = key(c, "cells");
    for (int64_t i = 0; i < nc; i++) {
        json_t *cell = json_array_get(cells, (size_t)i), *res;
        size_t o3 = idx(c, (size_t)i);
        int64_t layer, head;
        if (want_type(c, cell, json_is_object(cell), "an object") || get_int(c, cell, "layer", 0, MAX_INDEX - 1, &layer) ||
            get_int(c, cell, "head", 0, MAX_INDEX - 1, &head) || get_arr(c, cell, "residues", P, P, &res, NULL))
            goto done;
        pairs[i] = layer << 32 | head;
        size_t o4 = key(c, "residues");
        double sum_da = 0, sum_dn = 0, m;
        int64_t used = 0;
        for (int64_t r = 0; r < P; r++) {
            json_t *e = json_array_get(res, (size_t)r);
            size_t o5 = idx(c, (size_t)r);
            int64_t rho, n;
            double a, nll, da, dn;
            if (want_type(c, e, json_is_object(e), "an object") || get_int(c, e, "rho", INT64_MIN, INT64_MAX, &rho)) goto done;
            if (rho != r) {
                key(c, "rho");
                bad(c, "%lld, expected %lld (the residues 0..P-1 = 0..%lld, each once, in order)", (long long)rho, (long long)r,
                    (long long)(P - 1));
                goto done;
            }
            if (get_int(c, e, "n", 0, MAX_COUNT, &n)) goto done;
            if (n != cl.n[r]) {
                key(c, "n");
                bad(c, "%lld, but grid.clean has n = %lld at residue %lld (a knocked-out cell scores the same queries)", (long long)n,
                    (long long)cl.n[r], (long long)r);
                goto done;
            }
            if (get_frac(c, e, "accuracy", &a)) goto done;
            double k = n ? round(a * (double)n) : 0, want = n ? k / (double)n : 0;
            if (!close_to(a, want, 0)) {
                key(c, "accuracy");
                bad(c, "%.10g is not a count of correct answers out of n = %lld", a, (long long)n);
                goto done;
            }
            if (get_num(c, e, "mean_nll", -TOL, INFINITY, &nll) || get_num(c, e, "delta_accuracy_pp", -100 - TOL, 100 + TOL, &da) ||
                get_num(c, e, "delta_nll", -INFINITY, INFINITY, &dn))
                goto done;
            if (!close_to(da, 100 * (a - cl.acc[r]), 100)) {
                key(c, "delta_accuracy_pp");
                bad(c, "%.10g, but accuracy - clean accuracy = %.10g pp", da, 100 * (a - cl.acc[r]));
                goto done;
            }
            double cn = -cl.lp[r];
            if (!close_to(dn, nll - cn, fmax(nll, cn))) {
                key(c, "delta_nll");
                bad(c, "%.10g, but mean_nll - clean mean NLL = %.10g", dn, nll - cn);
                goto done;
            }
            if (n) {
                sum_da += da;
                sum_dn += dn;
                used++;
            }
            pop(c, o5);
        }
        pop(c, o4);
        double wda = used ? sum_da / (double)used : 0, wdn = used ? sum_dn / (double)used : 0;
        if (get_num(c, cell, "mean_delta_accuracy_pp", -100 - TOL, 100 + TOL, &m)) goto done;
        if (!close_to(m, wda, 100)) {
            key(c, "mean_delta_accuracy_pp");
            bad(c, "%.10g, but the residues' mean is %.10g", m, wda);
            goto done;
        }
        if (get_num(c, cell, "mean_delta_nll", -INFINITY, INFINITY, &m)) goto done;
        if (!close_to(m, wdn, fabs(wdn))) {
            key(c, "mean_delta_nll");
            bad(c, "%.10g, but the residues' mean is %.10g", m, wdn);
            goto done;
        }
        pop(c, o3);
    }
    pop(c, o2);
    int64_t *sorted = malloc((size_t)nc * sizeof *sorted);
    if (!sorted) {
        ps_fail(c->err, "out of memory");
        goto done;
    }
    memcpy(sorted, pairs, (size_t)nc * sizeof *sorted);
    qsort(sorted, (size_t)nc, sizeof *sorted, cmp_i64);
    for (int64_t i = 1; i < nc; i++)
        if (sorted[i] == sorted[i - 1]) {
            int64_t dup = sorted[i], first = -1;
            for (int64_t j = 0; j < nc; j++)
                if (pairs[j] == dup) {
                    if (first < 0) first = j;
                    else {
                        key(c, "cells");
                        idx(c, (size_t)j);
                        bad(c, "layer %lld head %lld again (first at cells[%lld]); each cell once", (long long)(dup >> 32),
                            (long long)(dup & 0xffffffff), (long long)first);
                        break;
                    }
                }
            free(sorted);
            goto done;
        }
    free(sorted);
    pop(c, old);
    rc = 0;
done:
    free(pairs);
    curve_free(&cl);
    return rc;
}

/* gates.json "training": one entry per (layer, head, branch) of the model (each exactly once), each with the
 * same increasing steps and per step N_static, N_input in [1, W] and a peak offset (what gate_training.png
 * and the concentration summary read). */
#define MAX_GATE_RECORDS 100000
static int check_gates_training(ck *c, json_t *v, int64_t W, int64_t L, int64_t H) {
    static const char *const BR[] = {"key", "value", NULL};
    size_t old = key(c, "training");
    if (want_type(c, v, json_is_array(v), "an array")) return -1;
    int64_t ne = (int64_t)json_array_size(v), S = -1;
    if (ne != 2 * L * H) return bad(c, "%lld entries, expected %lld (every layer, KV head and branch once)", (long long)ne, (long long)(2 * L * H));
    unsigned char *seen = calloc((size_t)ne, 1);
    json_t *steps0 = NULL;
    int rc = -1;
    if (!seen) return bad(c, "out of memory");
    for (int64_t e = 0; e < ne; e++) {
        json_t *en = json_array_get(v, (size_t)e), *st, *ns, *ni, *pk, *cs;
        size_t o1 = idx(c, (size_t)e);
        int64_t l, h, n;
        const char *br;
        if (want_type(c, en, json_is_object(en), "an object") || get_int(c, en, "layer", 0, L - 1, &l) ||
            get_int(c, en, "head", 0, H - 1, &h) || get_enum(c, en, "branch", BR, &br))
            goto done;
        size_t slot = (size_t)((l * H + h) * 2 + !strcmp(br, "value"));
        if (seen[slot]) {
            bad(c, "layer %lld head %lld %s appears twice", (long long)l, (long long)h, br);
            goto done;
        }
        seen[slot] = 1;
        if (get_arr(c, en, "steps", S < 0 ? 1 : S, S < 0 ? MAX_GATE_RECORDS : S, &st, &n)) goto done;
        S = n;
        if (get_arr(c, en, "N_static", S, S, &ns, NULL) || get_arr(c, en, "N_input", S, S, &ni, NULL) ||
            get_arr(c, en, "peak", S, S, &pk, NULL))
            goto done;
        double tol = 1e-3 * (double)W;
        for (int64_t t = 0; t < S; t++) {
            int64_t sv, pv;
            size_t o2 = key(c, "steps");
            idx(c, (size_t)t);
            if (int_value(c, json_array_get(st, (size_t)t), 0, INT64_MAX, &sv)) goto done;
            if (t > 0 && sv <= json_integer_value(json_array_get(st, (size_t)t - 1))) {
                bad(c, "%lld does not increase on the step before", (long long)sv);
                goto done;
            }
            if (steps0 && sv != json_integer_value(json_array_get(steps0, (size_t)t))) {
                bad(c, "%lld, but entry 0 has step %lld here (every entry has the same steps)", (long long)sv,
                    (long long)json_integer_value(json_array_get(steps0, (size_t)t)));
                goto done;
            }
            pop(c, o2);
            key(c, "N_static");
            idx(c, (size_t)t);
            if (num_value(c, json_array_get(ns, (size_t)t), 1 - tol, (double)W + tol, NULL)) goto done;
            pop(c, o2);
            key(c, "N_input");
            idx(c, (size_t)t);
            if (num_value(c, json_array_get(ni, (size_t)t), 1 - tol, (double)W + tol, NULL)) goto done;
            pop(c, o2);
            key(c, "peak");
            idx(c, (size_t)t);
            if (int_value(c, json_array_get(pk, (size_t)t), 0, W - 1, &pv)) goto done;
            pop(c, o2);
        }
        if (!steps0) steps0 = st;
        cs = json_object_get(en, "concentrated_at_step");
        if (cs && !json_is_null(cs)) {
            size_t o2 = key(c, "concentrated_at_step");
            if (int_value(c, cs, 0, INT64_MAX, NULL)) goto done;
            pop(c, o2);
        }
        if (get_int(c, en, "final_peak", 0, W - 1, NULL)) goto done;
        pop(c, o1);
    }
    pop(c, old);
    rc = 0;
done:
    free(seen);
    return rc;
}

/* one gate distribution over S slots: weights in [0, 1] adding up to 1 */
static int check_dist(ck *c, json_t *o, const char *k, int64_t S) {
    json_t *mg;
    if (get_arr(c, o, k, S, S, &mg, NULL)) return -1;
    size_t o1 = key(c, k);
    double sum = 0, x = 0;
    for (int64_t i = 0; i < S; i++) {
        size_t o2 = idx(c, (size_t)i);
        if (num_value(c, json_array_get(mg, (size_t)i), -TOL, 1 + TOL, &x)) return -1;
        sum += x;
        pop(c, o2);
    }
    if (fabs(sum - 1) > 1e-3) return bad(c, "the weights add up to %.10g, not 1", sum);
    pop(c, o1);
    return 0;
}

/* gates.gate "per_channel" (DeepSeek-V4's compressor; gates/chgates.h) */
static int check_chgates(ck *c, json_t *g) {
    static const char *const ATT[] = {"csa", "hca", NULL}, *const BR[] = {"compressor", "indexer", NULL};
    const char *const *LABEL = ps_gate_labels;
    json_t *layers;
    int64_t L, prev = -1;
    if (get_arr(c, g, "layers", 1, MAX_INDEX, &layers, &L)) return -1;
    size_t o1 = key(c, "layers");
    for (int64_t l = 0; l < L; l++) {
        json_t *lo = json_array_get(layers, (size_t)l), *brs;
        size_t o2 = idx(c, (size_t)l);
        int64_t li, S, nb;
        if (want_type(c, lo, json_is_object(lo), "an object") || get_int(c, lo, "layer", 0, MAX_INDEX, &li)) return -1;
        if (li <= prev) {
            key(c, "layer");
            return bad(c, "%lld, expected more than %lld (layers in increasing order, each once)", (long long)li, (long long)prev);
        }
        prev = li;
        if (get_enum(c, lo, "attention", ATT, NULL) || get_int(c, lo, "rate", 1, MAX_WINDOW, NULL) ||
            get_int(c, lo, "slots", 1, 2 * MAX_WINDOW, &S) || get_arr(c, lo, "branches", 1, 2, &brs, &nb))
            return -1;
        size_t o3 = key(c, "branches");
        for (int64_t b = 0; b < nb; b++) {
            json_t *bo = json_array_get(brs, (size_t)b), *po, *per, *arr;
            size_t o4 = idx(c, (size_t)b);
            int64_t d;
            double tol = 1e-3 * (double)S;
            if (want_type(c, bo, json_is_object(bo), "an object") || get_enum(c, bo, "branch", BR, NULL) ||
                get_int(c, bo, "channels", 1, MAX_INDEX, &d) || get_int(c, bo, "n_windows", 0, MAX_COUNT, NULL) ||
                get_obj(c, bo, "pooled", &po))
                return -1;
            size_t o5 = key(c, "pooled");
            if (check_dist(c, po, "mean_gate", S) || get_num(c, po, "N_static", 1 - tol, (double)S + tol, NULL) ||
                get_num(c, po, "N_input", 1 - tol, (double)S + tol, NULL) || get_int(c, po, "peak", 0, S - 1, NULL) ||
                get_enum(c, po, "label", LABEL, NULL))
                return -1;
            pop(c, o5);
            if (get_obj(c, bo, "per_channel", &per)) return -1;
            size_t o6 = key(c, "per_channel");
            if (get_arr(c, per, "mean_gate", d, d, &arr, NULL)) return -1;
            size_t o7 = key(c, "mean_gate");
            for (int64_t i = 0; i < d; i++) {
                json_t *wrap = json_object();
                json_object_set(wrap, "x", json_array_get(arr, (size_t)i));
                size_t o8 = idx(c, (size_t)i);
                int r = check_dist(c, wrap, "x", S);
                json_decref(wrap);
                if (r) return -1;
                pop(c, o8);
            }
            pop(c, o7);
            const char *nk[2] = {"N_static", "N_input"};
            for (int k = 0; k < 2; k++) {
                if (get_arr(c, per, nk[k], d, d, &arr, NULL)) return -1;
                size_t o9 = key(c, nk[k]);
                for (int64_t i = 0; i < d; i++) {
                    size_t o10 = idx(c, (size_t)i);
                    if (num_value(c, json_array_get(arr, (size_t)i), 1 - tol, (double)S + tol, NULL)) return -1;
                    pop(c, o10);
                }
                pop(c, o9);
            }
            if (get_arr(c, per, "peak", d, d, &arr, NULL)) return -1;
            size_t o11 = key(c, "peak");
            for (int64_t i = 0; i < d; i++) {
                size_t o12 = idx(c, (size_t)i);
                if (int_value(c, json_array_get(arr, (size_t)i), 0, S - 1, NULL)) return -1;
                pop(c, o12);
            }
            pop(c, o11);
            pop(c, o6);
            pop(c, o4);
        }
        pop(c, o3);
        pop(c, o2);
    }
    pop(c, o1);
    return 0;
}

static int check_gates(ck *c, json_t *doc) {
    static const char *const GATE[] = {"learned", "uniform", NULL};
    const char *const *LABEL = ps_gate_labels;
    prov_info pi;
    json_t *g, *layers, *v;
    int64_t W, L, H = -1;
    if (check_provenance(c, doc, 1, NULL, &pi)) return -1;
    if ((v = json_object_get(doc, "thresholds")) && !json_is_object(v)) {
        key(c, "thresholds");
        return bad(c, "expected an object, got %s", type_name(v));
    }
    if (get_obj(c, doc, "gates", &g)) return -1;
    size_t old = key(c, "gates");
    if ((v = json_object_get(g, "gate")) && json_is_string(v) && !strcmp(json_string_value(v), "per_channel")) {
        if (check_chgates(c, g)) return -1;
        pop(c, old);
        if ((v = json_object_get(doc, "training")) && !json_is_array(v)) {
            key(c, "training");
            return bad(c, "expected an array, got %s", type_name(v));
        }
        return 0;
    }
    if (get_int(c, g, "window", 1, MAX_WINDOW, &W) || get_int(c, g, "stride", 1, W, NULL) || get_enum(c, g, "gate", GATE, NULL) ||
        get_arr(c, g, "layers", 1, MAX_INDEX, &layers, &L))
        return -1;
    size_t o2 = key(c, "layers");
    for (int64_t l = 0; l < L; l++) {
        json_t *lo = json_array_get(layers, (size_t)l), *heads;
        size_t o3 = idx(c, (size_t)l);
        int64_t li, nh;
        if (want_type(c, lo, json_is_object(lo), "an object") || get_int(c, lo, "layer", 0, MAX_INDEX, &li)) return -1;
        if (li != l) {
            key(c, "layer");
            return bad(c, "%lld, expected %lld (layers 0..L-1 in order)", (long long)li, (long long)l);
        }
        if (get_arr(c, lo, "heads", H < 0 ? 1 : H, H < 0 ? MAX_INDEX : H, &heads, &nh)) return -1;
        H = nh;
        size_t o4 = key(c, "heads");
        for (int64_t h = 0; h < H; h++) {
            json_t *ho = json_array_get(heads, (size_t)h);
            size_t o5 = idx(c, (size_t)h);
            int64_t hi;
            if (want_type(c, ho, json_is_object(ho), "an object") || get_int(c, ho, "head", 0, MAX_INDEX, &hi)) return -1;
            if (hi != h) {
                key(c, "head");
                return bad(c, "%lld, expected %lld (KV heads 0..H-1 in order)", (long long)hi, (long long)h);
            }
            for (int b = 0; b < 2; b++) {
                json_t *bo, *mg;
                const char *bn = b ? "value" : "key";
                if (get_obj(c, ho, bn, &bo)) return -1;
                size_t o6 = key(c, bn);
                if (get_arr(c, bo, "mean_gate", W, W, &mg, NULL)) return -1;
                size_t o7 = key(c, "mean_gate");
                double sum = 0, x;
                for (int64_t i = 0; i < W; i++) {
                    size_t o8 = idx(c, (size_t)i);
                    if (num_value(c, json_array_get(mg, (size_t)i), -TOL, 1 + TOL, &x)) return -1;
                    sum += x;
                    pop(c, o8);
                }
                if (fabs(sum - 1) > 1e-3) return bad(c, "the weights add up to %.10g, not 1", sum);
                pop(c, o7);
                double tol = 1e-3 * (double)W;
                if (get_num(c, bo, "N_static", 1 - tol, (double)W + tol, NULL) || get_num(c, bo, "N_input", 1 - tol, (double)W + tol, NULL) ||
                    get_int(c, bo, "peak", 0, W - 1, NULL) || get_int(c, bo, "n_windows", 0, MAX_COUNT, NULL) ||
                    get_enum(c, bo, "label", LABEL, NULL))
                    return -1;
                pop(c, o6);
            }
            pop(c, o5);
        }
        pop(c, o4);
        pop(c, o3);
    }
    pop(c, o2);
    pop(c, old);
    if ((v = json_object_get(doc, "training"))) return check_gates_training(c, v, W, L, H);
    return 0;
}

static int check_theory(ck *c, json_t *doc) {
    prov_info pi;
    json_t *pr, *st, *loss, *acc, *heads, *v;
    int64_t n, H, W = -1, ph, pw;
    if (check_provenance(c, doc, 0, NULL, &pi) || get_obj(c, doc, "params", &pr)) return -1;
    size_t old = key(c, "params");
    if (get_int(c, pr, "heads", 1, PS_THEORY_MAX_HEADS, &ph) || get_int(c, pr, "window", PS_THEORY_MIN_WINDOW, PS_THEORY_MAX_WINDOW, &pw) ||
        get_int(c, pr, "chunks", 1, PS_THEORY_MAX_CHUNKS, NULL) || get_int(c, pr, "steps", 1, PS_THEORY_MAX_STEPS, NULL) ||
        get_int(c, pr, "batch", 0, PS_THEORY_MAX_BATCH, NULL))
        return -1;
    for (int i = 0; i < 2; i++) {
        const char *bk = i ? "within_chunk" : "learn_temperature";
        size_t o = key(c, bk);
        v = json_object_get(pr, bk);
        if (want_type(c, v, json_is_boolean(v), "true or false")) return -1;
        pop(c, o);
    }
    pop(c, old);
    json_t *sc[2];
    if (get_arr(c, doc, "steps", 1, 100000, &st, &n) || get_arr(c, doc, "loss", n, n, &loss, NULL) ||
        get_arr(c, doc, "accuracy", n, n, &acc, NULL) || get_arr(c, doc, "score_scale", n, n, &sc[0], NULL) ||
        get_arr(c, doc, "logit_scale", n, n, &sc[1], NULL))
        return -1;
    int64_t prev = -1, s;
    for (int64_t k = 0; k < n; k++) {
        size_t o = key(c, "steps");
        idx(c, (size_t)k);
        if (int_value(c, json_array_get(st, (size_t)k), 0, INT64_MAX, &s)) return -1;
        if (s <= prev) return bad(c, "%lld after step %lld (steps increase)", (long long)s, (long long)prev);
        prev = s;
        pop(c, o);
        key(c, "loss");
        idx(c, (size_t)k);
        if (num_value(c, json_array_get(loss, (size_t)k), 0, INFINITY, NULL)) return -1;
        pop(c, o);
        key(c, "accuracy");
        idx(c, (size_t)k);
        if (num_value(c, json_array_get(acc, (size_t)k), -TOL, 1 + TOL, NULL)) return -1;
        pop(c, o);
        for (int i = 0; i < 2; i++) {
            key(c, i ? "logit_scale" : "score_scale");
            idx(c, (size_t)k);
            if (num_value(c, json_array_get(sc[i], (size_t)k), 1e-300, INFINITY, NULL)) return -1;
            pop(c, o);
        }
    }
    if (get_arr(c, doc, "heads", ph, ph, &heads, &H)) return -1;
    int64_t aligned = 0, wa, onehot = 0, cover[PS_THEORY_MAX_WINDOW] = {0};
    double tol = 1e-3 * (double)pw;
    size_t o2 = key(c, "heads");
    for (int64_t h = 0; h < H; h++) {
        json_t *ho = json_array_get(heads, (size_t)h);
        size_t o3 = idx(c, (size_t)h);
        int64_t hi, kp, vp;
        if (want_type(c, ho, json_is_object(ho), "an object") || get_int(c, ho, "head", 0, PS_THEORY_MAX_HEADS - 1, &hi)) return -1;
        if (hi != h) {
            key(c, "head");
            return bad(c, "%lld, expected %lld (heads 0..H-1 in order)", (long long)hi, (long long)h);
        }
        for (int b = 0; b < 2; b++) {
            json_t *gs;
            const char *gn = b ? "value_gate" : "key_gate";
            if (get_arr(c, ho, gn, n, n, &gs, NULL)) return -1;
            size_t o4 = key(c, gn);
            for (int64_t k = 0; k < n; k++) {
                json_t *gk = json_array_get(gs, (size_t)k);
                size_t o5 = idx(c, (size_t)k);
                if (want_type(c, gk, json_is_array(gk), "an array")) return -1;
                if ((int64_t)json_array_size(gk) != pw)
                    return bad(c, "%zu entries, expected params.window = %lld", json_array_size(gk), (long long)pw);
                W = pw;
                for (int64_t i = 0; i < W; i++) {
                    size_t o6 = idx(c, (size_t)i);
                    if (num_value(c, json_array_get(gk, (size_t)i), -TOL, 1 + TOL, NULL)) return -1;
                    pop(c, o6);
                }
                pop(c, o5);
            }
            pop(c, o4);
            const char *nn = b ? "N_value_over_time" : "N_key_over_time";
            if (get_arr(c, ho, nn, n, n, &gs, NULL)) return -1;
            o4 = key(c, nn);
            for (int64_t k = 0; k < n; k++) {
                size_t o5 = idx(c, (size_t)k);
                if (num_value(c, json_array_get(gs, (size_t)k), 1 - tol, (double)pw + tol, NULL)) return -1;
                pop(c, o5);
            }
            pop(c, o4);
        }
        double nk, nv;
        if (get_int(c, ho, "key_peak", 0, pw - 1, &kp) || get_int(c, ho, "value_peak", 0, pw - 1, &vp)) return -1;
        if (get_num(c, ho, "N_key", 1 - tol, (double)pw + tol, &nk) || get_num(c, ho, "N_value", 1 - tol, (double)pw + tol, &nv))
            return -1;
        for (int b = 0; b < 2; b++) { /* the final N is the last record's */
            double last = json_number_value(json_array_get(json_object_get(ho, b ? "N_value_over_time" : "N_key_over_time"), (size_t)n - 1));
            if (fabs(last - (b ? nv : nk)) > 1e-6 * (double)pw) {
                key(c, b ? "N_value" : "N_key");
                return bad(c, "%.10g, but the last record of %s is %.10g", b ? nv : nk, b ? "N_value_over_time" : "N_key_over_time", last);
            }
        }
        aligned += vp == kp + 1;
        if (vp == kp + 1 && kp < PS_THEORY_MAX_WINDOW) cover[kp]++;
        onehot += nk <= PS_THEORY_ONE_HOT_N && nv <= PS_THEORY_ONE_HOT_N;
        pop(c, o3);
    }
    pop(c, o2);
    if (get_int(c, doc, "heads_with_value_peak_after_key_peak", 0, H, &wa)) return -1;
    if (wa != aligned) {
        key(c, "heads_with_value_peak_after_key_peak");
        return bad(c, "%lld, but %lld heads have value_peak = key_peak + 1", (long long)wa, (long long)aligned);
    }
    for (int64_t h = 0; h < H; h++) { /* each head's flag agrees with its peaks */
        json_t *ho = json_array_get(heads, (size_t)h), *f = json_object_get(ho, "value_peak_is_key_peak_plus_1");
        size_t o3 = key(c, "heads");
        idx(c, (size_t)h);
        key(c, "value_peak_is_key_peak_plus_1");
        if (want_type(c, f, json_is_boolean(f), "true or false")) return -1;
        int al = json_integer_value(json_object_get(ho, "value_peak")) == json_integer_value(json_object_get(ho, "key_peak")) + 1;
        if (json_is_true(f) != al) return bad(c, "%s, but value_peak %s key_peak + 1", al ? "false" : "true", al ? "=" : "!=");
        pop(c, o3);
    }
    int64_t oh, cp, nc, ns;
    json_t *cov, *shared;
    if (get_int(c, doc, "heads_one_hot", 0, H, &oh)) return -1;
    if (oh != onehot) {
        key(c, "heads_one_hot");
        return bad(c, "%lld, but %lld heads have N_key and N_value <= %g", (long long)oh, (long long)onehot, PS_THEORY_ONE_HOT_N);
    }
    if (get_num(c, doc, "max_final_N", 1 - tol, (double)pw + tol, NULL) || get_int(c, doc, "coverable_phases", pw - 1, pw - 1, &cp) ||
        get_arr(c, doc, "covered_phases", 0, pw - 1, &cov, &nc) || get_arr(c, doc, "phases_covered_twice_or_more", 0, pw - 1, &shared, &ns))
        return -1;
    int64_t want = 0, want2 = 0;
    for (int64_t i = 0; i < pw - 1 && i < PS_THEORY_MAX_WINDOW; i++) {
        want += cover[i] > 0;
        want2 += cover[i] > 1;
    }
    for (int b = 0; b < 2; b++) {
        json_t *arr = b ? shared : cov;
        const char *an = b ? "phases_covered_twice_or_more" : "covered_phases";
        int64_t m = b ? ns : nc, exp_m = b ? want2 : want;
        size_t o = key(c, an);
        for (int64_t k = 0, prevk = -1; k < m; k++) {
            int64_t ph_k;
            size_t o5 = idx(c, (size_t)k);
            if (int_value(c, json_array_get(arr, (size_t)k), 0, pw - 2, &ph_k)) return -1;
            if (ph_k <= prevk) return bad(c, "%lld after %lld (phases increase)", (long long)ph_k, (long long)prevk);
            prevk = ph_k;
            if (cover[ph_k] < (b ? 2 : 1))
                return bad(c, "%lld, but %s heads have key_peak %lld and value_peak %lld", (long long)ph_k, b ? "fewer than two" : "no",
                           (long long)ph_k, (long long)ph_k + 1);
            pop(c, o5);
        }
        if (m != exp_m) return bad(c, "%lld entries, but %lld phases qualify", (long long)m, (long long)exp_m);
        pop(c, o);
    }
    return 0;
}

/* ---- text filler experiments (kind "fillers", docs/results-schema.md) ---- */

static int opt_null_or_num(ck *c, json_t *o, const char *k, double lo, double hi, double *out, int *is_null) {
    json_t *v = json_object_get(o, k);
    size_t old = key(c, k);
    if (!v) return bad(c, "missing");
    *is_null = json_is_null(v);
    if (!*is_null && num_value(c, v, lo, hi, out)) return -1;
    pop(c, old);
    return 0;
}

/* a periodicity test: n, groups, eta2 (recomputed from the points), F, permutations, p_value */
static int check_phase_test(ck *c, json_t *t, const double *y, const int64_t *x, const int *strat, int64_t n, int64_t P,
                            int detrend, int64_t perms) {
    int64_t tn, tg, tp;
    double eta2, F = 0, pv;
    int fnull = 0;
    if (want_type(c, t, json_is_object(t), "an object") || get_int(c, t, "n", 0, MAX_COUNT, &tn) ||
        get_int(c, t, "groups", 0, MAX_PERIOD, &tg) || get_num(c, t, "eta2", -TOL, 1 + TOL, &eta2) ||
        opt_null_or_num(c, t, "F", 0, INFINITY, &F, &fnull) || get_int(c, t, "permutations", 0, PS_FILLERS_MAX_PERMUTATIONS, &tp) ||
        get_num(c, t, "p_value", 0, 1 + TOL, &pv))
        return -1;
    if (tn != n) {
        key(c, "n");
        return bad(c, "%lld, but there are %lld points", (long long)tn, (long long)n);
    }
    if (tp != perms) {
        key(c, "permutations");
        return bad(c, "%lld, but statistic.permutations is %lld", (long long)tp, (long long)perms);
    }
    if (pv < 1.0 / (double)(perms + 1) - TOL) {
        key(c, "p_value");
        return bad(c, "%.10g is below 1/(permutations + 1), the smallest a permutation test gives", pv);
    }
    double *e = malloc((size_t)(n ? n : 1) * sizeof *e);
    if (!e) return ps_fail(c->err, "out of memory");
    int all;
    double w_eta2, w_F, ymax = 0, emax = 0;
    int64_t w_g;
    ps_phase_residuals(y, x, strat, n, detrend, e, &all);
    ps_phase_eta2(e, x, n, P, &w_eta2, &w_F, &w_g);
    for (int64_t i = 0; i < n; i++) {
        ymax = fmax(ymax, fabs(y[i]));
        emax = fmax(emax, fabs(e[i]));
    }
    free(e);
    if (tg != w_g) {
        key(c, "groups");
        return bad(c, "%lld, but the points fall in %lld residues", (long long)tg, (long long)w_g);
    }
    /* the points are written with 10 significant digits: recomputed only where that rounding cannot
     * decide the residuals (their spread above 1e-5 of the values) */
    if (emax > 1e-5 * ymax && fabs(eta2 - w_eta2) > 1e-4) {
        key(c, "eta2");
        return bad(c, "%.10g, but the points give %.10g", eta2, w_eta2);
    }
    return 0;
}

static int check_fillers(ck *c, json_t *doc) {
    prov_info pi;
    json_t *ex, *ln, *cands, *st, *fams, *v;
    int64_t Lmin, Lmax, nc, P, perms, nf;
    int rc = -1, detrend;
    double *y = NULL;
    int64_t *x = NULL;
    int *strat = NULL;
    if (check_provenance(c, doc, 1, NULL, &pi) || get_obj(c, doc, "experiment", &ex)) return -1;
    size_t old = key(c, "experiment");
    if (get_arr(c, ex, "lengths", 2, 2, &ln, NULL)) return -1;
    size_t o1 = key(c, "lengths");
    for (int i = 0; i < 2; i++) {
        size_t o2 = idx(c, (size_t)i);
        if (int_value(c, json_array_get(ln, (size_t)i), 0, PS_FILLERS_MAX_L, i ? &Lmax : &Lmin)) return -1;
        pop(c, o2);
    }
    if (Lmin > Lmax) return bad(c, "min %lld > max %lld", (long long)Lmin, (long long)Lmax);
    pop(c, o1);
    if (get_arr(c, ex, "candidates", 2, PS_FILLERS_MAX_CANDIDATES, &cands, &nc)) return -1;
    o1 = key(c, "candidates");
    for (int64_t i = 0; i < nc; i++) {
        json_t *co = json_array_get(cands, (size_t)i), *ids;
        size_t o2 = idx(c, (size_t)i);
        int64_t ni;
        if (want_type(c, co, json_is_object(co), "an object") || get_arr(c, co, "ids", 1, 4096, &ids, &ni)) return -1;
        size_t o3 = key(c, "ids");
        for (int64_t j = 0; j < ni; j++) {
            size_t o4 = idx(c, (size_t)j);
            if (int_value(c, json_array_get(ids, (size_t)j), 0, INT32_MAX, NULL)) return -1;
            pop(c, o4);
        }
        pop(c, o3);
        if ((v = json_object_get(co, "text")) && !json_is_null(v) && !json_is_string(v)) {
            key(c, "text");
            return bad(c, "expected a string or null, got %s", type_name(v));
        }
        pop(c, o2);
    }
    pop(c, o1);
    pop(c, old);
    if (get_int(c, doc, "period", 1, MAX_PERIOD, &P)) return -1;
    if (P != pi.period) {
        key(c, "period");
        return bad(c, "%lld, but provenance.eval.period is %lld", (long long)P, (long long)pi.period);
    }
    if (get_obj(c, doc, "statistic", &st)) return -1;
    old = key(c, "statistic");
    if (get_int(c, st, "permutations", 0, PS_FILLERS_MAX_PERMUTATIONS, &perms)) return -1;
    v = json_object_get(st, "detrend");
    key(c, "detrend");
    if (want_type(c, v, json_is_boolean(v), "true or false")) return -1;
    detrend = json_is_true(v);
    pop(c, old);
    int64_t nL = Lmax - Lmin + 1;
    if (get_arr(c, doc, "families", 1, PS_FILLERS_MAX_POINTS / nL > 0 ? PS_FILLERS_MAX_POINTS / nL : 1, &fams, &nf)) return -1;
    y = malloc((size_t)(nf * nL) * sizeof *y);
    x = malloc((size_t)(nf * nL) * sizeof *x);
    strat = malloc((size_t)(nf * nL) * sizeof *strat);
    int64_t *cnt = calloc((size_t)P, sizeof *cnt);
    double *sum = calloc((size_t)P, sizeof *sum);
    if (!y || !x || !strat || !cnt || !sum) {
        ps_fail(c->err, "out of memory");
        goto done;
    }
    size_t of = key(c, "families");
    for (int64_t f = 0; f < nf; f++) {
        json_t *fo = json_array_get(fams, (size_t)f), *pts, *res;
        size_t o2 = idx(c, (size_t)f);
        if (want_type(c, fo, json_is_object(fo), "an object") || get_str(c, fo, "name", NULL) ||
            get_arr(c, fo, "points", nL, nL, &pts, NULL))
            goto done;
        memset(cnt, 0, (size_t)P * sizeof *cnt);
        memset(sum, 0, (size_t)P * sizeof *sum);
        size_t o3 = key(c, "points");
        for (int64_t i = 0; i < nL; i++) {
            json_t *po = json_array_get(pts, (size_t)i), *pc, *t1;
            size_t o4 = idx(c, (size_t)i);
            int64_t L, ph, pt;
            double d, pr[2] = {0, 0};
            if (want_type(c, po, json_is_object(po), "an object") || get_int(c, po, "L", 0, PS_FILLERS_MAX_L, &L)) goto done;
            if (L != Lmin + i) {
                key(c, "L");
                bad(c, "%lld, expected %lld (lengths min..max, each once, in order)", (long long)L, (long long)(Lmin + i));
                goto done;
            }
            if (get_int(c, po, "phase", 0, P - 1, &ph)) goto done;
            if (ph != L % P) {
                key(c, "phase");
                bad(c, "%lld, but L mod P = %lld mod %lld = %lld", (long long)ph, (long long)L, (long long)P, (long long)(L % P));
                goto done;
            }
            if (get_int(c, po, "prompt_tokens", L, INT64_MAX, &pt) || get_arr(c, po, "candidates", nc, nc, &pc, NULL)) goto done;
            size_t o5 = key(c, "candidates");
            for (int64_t k = 0; k < nc; k++) {
                json_t *co = json_array_get(pc, (size_t)k);
                size_t o6 = idx(c, (size_t)k);
                double lp, p;
                if (want_type(c, co, json_is_object(co), "an object") || get_num(c, co, "logprob", -INFINITY, TOL, &lp) ||
                    get_frac(c, co, "p", &p))
                    goto done;
                if (!close_to(p, exp(lp), 0)) {
                    key(c, "p");
                    bad(c, "%.10g, but exp(logprob) = %.10g", p, exp(lp));
                    goto done;
                }
                v = json_object_get(co, "all_top1");
                key(c, "all_top1");
                if (want_type(c, v, json_is_boolean(v), "true or false")) goto done;
                pop(c, o6);
                if (k < 2) pr[k] = p;
            }
            pop(c, o5);
            if (get_num(c, po, "delta", -1 - TOL, 1 + TOL, &d)) goto done;
            if (!close_to(d, pr[0] - pr[1], 0)) {
                key(c, "delta");
                bad(c, "%.10g, but candidates[0].p - candidates[1].p = %.10g", d, pr[0] - pr[1]);
                goto done;
            }
            if (get_obj(c, po, "top1", &t1)) goto done;
            size_t o7 = key(c, "top1");
            if (get_int(c, t1, "id", 0, INT32_MAX, NULL)) goto done;
            pop(c, o7);
            y[f * nL + i] = d;
            x[f * nL + i] = L;
            strat[f * nL + i] = (int)f;
            cnt[ph]++;
            sum[ph] += d;
            pop(c, o4);
        }
        pop(c, o3);
        if (get_arr(c, fo, "residues", P, P, &res, NULL)) goto done;
        o3 = key(c, "residues");
        for (int64_t r = 0; r < P; r++) {
            json_t *ro = json_array_get(res, (size_t)r);
            size_t o4 = idx(c, (size_t)r);
            int64_t rho, n;
            double md = 0;
            int isnull = 0;
            if (want_type(c, ro, json_is_object(ro), "an object") || get_int(c, ro, "rho", r, r, &rho) ||
                get_int(c, ro, "n", 0, nL, &n) || opt_null_or_num(c, ro, "mean_delta", -1 - TOL, 1 + TOL, &md, &isnull))
                goto done;
            if (n != cnt[r]) {
                key(c, "n");
                bad(c, "%lld, but %lld points have phase %lld", (long long)n, (long long)cnt[r], (long long)r);
                goto done;
            }
            if (isnull != (n == 0) || (n && !close_to(md, sum[r] / (double)n, 0))) {
                key(c, "mean_delta");
                if (n) bad(c, "%s, but the mean delta of its %lld points is %.10g", isnull ? "null" : "a different value", (long long)n,
                           sum[r] / (double)n);
                else bad(c, "a number, but no point has this phase (null expected)");
                goto done;
            }
            pop(c, o4);
        }
        pop(c, o3);
        json_t *t = json_object_get(fo, "test");
        size_t o8 = key(c, "test");
        if (check_phase_test(c, t, y + f * nL, x + f * nL, NULL, nL, P, detrend, perms)) goto done;
        pop(c, o8);
        pop(c, o2);
    }
    pop(c, of);
    key(c, "pooled");
    if (check_phase_test(c, json_object_get(doc, "pooled"), y, x, strat, nf * nL, P, detrend, perms)) goto done;
    pop(c, 0);
    rc = 0;
done:
    free(y);
    free(x);
    free(strat);
    free(cnt);
    free(sum);
    return rc;
}

/* ---- entry points ---- */

int ps_results_check(json_t *doc, const char *path, ps_error *err) {
    ck c = {.file = path, .err = err};
    json_t *k = json_is_object(doc) ? json_object_get(doc, "kind") : NULL;
    if (!k) return ps_fail(err, "%s: not a phasescope result file (no \"kind\")", path);
    key(&c, "kind");
    if (want_type(&c, k, json_is_string(k), "a string")) return -1;
    const char *kind = json_string_value(k);
    pop(&c, 0);
    if (!strcmp(kind, "sweep")) return check_sweep(&c, doc);
    if (!strcmp(kind, "gatecycle")) return check_gatecycle(&c, doc);
    if (!strcmp(kind, "knockout")) return check_knockout(&c, doc);
    if (!strcmp(kind, "gates")) return check_gates(&c, doc);
    if (!strcmp(kind, "theory")) return check_theory(&c, doc);
    if (!strcmp(kind, "fillers")) return check_fillers(&c, doc);
    key(&c, "kind");
    return bad(&c, "\"%.100s\" is not a result kind (sweep, knockout, gatecycle, gates, theory, fillers)", kind);
}

int ps_results_load(const char *path, const char *want_kind, json_t **doc, ps_error *err) {
    char *text;
    size_t len;
    *doc = NULL;
    if (ps_read_file(path, PS_RESULT_MAX_BYTES, &text, &len, err)) return -1;
    json_error_t je;
    json_t *o = json_loadb(text, len, 0, &je);
    free(text);
    if (!o) return ps_fail(err, "%s: not valid JSON (line %d: %s)", path, je.line, je.text);
    if (want_kind && json_is_object(o) && json_is_string(json_object_get(o, "kind")) &&
        strcmp(json_string_value(json_object_get(o, "kind")), want_kind)) {
        ps_fail(err, "%s: kind: \"%.100s\", expected \"%s\"", path, json_string_value(json_object_get(o, "kind")), want_kind);
        json_decref(o);
        return -1;
    }
    if (ps_results_check(o, path, err)) {
        json_decref(o);
        return -1;
    }
    *doc = o;
    return 0;
}
