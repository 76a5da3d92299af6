/* kind_fillers.c — result kind "fillers": text filler experiments (interventions/fillers.h), the answer's
 * probability margin against the filler length L, with a periodicity test per family and pooled. Its
 * validation and its figure, fillers.png. */
#include "viz/kinds.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "interventions/fillers.h" /* the periodicity statistic of text filler experiments */
#include "viz/check_common.h"
#include "viz/fig_common.h"

/* ---- validation (kind "fillers", docs/results-schema.md) ---- */

static int opt_null_or_num(ps_ck *c, json_t *o, const char *k, double lo, double hi, double *out, int *is_null) {
    json_t *v = json_object_get(o, k);
    size_t old = ps_ck_key(c, k);
    if (!v) return ps_ck_bad(c, "missing");
    *is_null = json_is_null(v);
    if (!*is_null && ps_ck_num_value(c, v, lo, hi, out)) return -1;
    ps_ck_pop(c, old);
    return 0;
}

/* a periodicity test: n, groups, eta2 (recomputed from the points), F, permutations, p_value */
static int check_phase_test(ps_ck *c, json_t *t, const double *y, const int64_t *x, const int *strat, int64_t n, int64_t P,
                            int detrend, int64_t perms) {
    int64_t tn, tg, tp;
    double eta2, F = 0, pv;
    int fnull = 0;
    if (ps_ck_want_type(c, t, json_is_object(t), "an object") || ps_ck_get_int(c, t, "n", 0, MAX_COUNT, &tn) ||
        ps_ck_get_int(c, t, "groups", 0, MAX_PERIOD, &tg) || ps_ck_get_num(c, t, "eta2", -TOL, 1 + TOL, &eta2) ||
        opt_null_or_num(c, t, "F", 0, INFINITY, &F, &fnull) || ps_ck_get_int(c, t, "permutations", 0, PS_FILLERS_MAX_PERMUTATIONS, &tp) ||
        ps_ck_get_num(c, t, "p_value", 0, 1 + TOL, &pv))
        return -1;
    if (tn != n) {
        ps_ck_key(c, "n");
        return ps_ck_bad(c, "%lld, but there are %lld points", (long long)tn, (long long)n);
    }
    if (tp != perms) {
        ps_ck_key(c, "permutations");
        return ps_ck_bad(c, "%lld, but statistic.permutations is %lld", (long long)tp, (long long)perms);
    }
    if (pv < 1.0 / (double)(perms + 1) - TOL) {
        ps_ck_key(c, "p_value");
        return ps_ck_bad(c, "%.10g is below 1/(permutations + 1), the smallest a permutation test gives", pv);
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
        ps_ck_key(c, "groups");
        return ps_ck_bad(c, "%lld, but the points fall in %lld residues", (long long)tg, (long long)w_g);
    }
    /* the points are written with 10 significant digits: recomputed only where that rounding cannot
     * decide the residuals (their spread above 1e-5 of the values) */
    if (emax > 1e-5 * ymax && fabs(eta2 - w_eta2) > 1e-4) {
        ps_ck_key(c, "eta2");
        return ps_ck_bad(c, "%.10g, but the points give %.10g", eta2, w_eta2);
    }
    return 0;
}

/* experiment: its lengths [min, max] and its candidates (nc of them), each a list of token ids */
static int ck_experiment(ps_ck *c, json_t *doc, int64_t *Lmin, int64_t *Lmax, int64_t *nc) {
    json_t *ex, *ln, *cands, *v;
    if (ps_ck_get_obj(c, doc, "experiment", &ex)) return -1;
    size_t old = ps_ck_key(c, "experiment");
    if (ps_ck_get_arr(c, ex, "lengths", 2, 2, &ln, NULL)) return -1;
    size_t o1 = ps_ck_key(c, "lengths");
    for (int i = 0; i < 2; i++) {
        size_t o2 = ps_ck_idx(c, (size_t)i);
        if (ps_ck_int_value(c, json_array_get(ln, (size_t)i), 0, PS_FILLERS_MAX_L, i ? Lmax : Lmin)) return -1;
        ps_ck_pop(c, o2);
    }
    if (*Lmin > *Lmax) return ps_ck_bad(c, "min %lld > max %lld", (long long)*Lmin, (long long)*Lmax);
    ps_ck_pop(c, o1);
    if (ps_ck_get_arr(c, ex, "candidates", 2, PS_FILLERS_MAX_CANDIDATES, &cands, nc)) return -1;
    o1 = ps_ck_key(c, "candidates");
    for (int64_t i = 0; i < *nc; i++) {
        json_t *co = json_array_get(cands, (size_t)i), *ids;
        size_t o2 = ps_ck_idx(c, (size_t)i);
        int64_t ni;
        if (ps_ck_want_type(c, co, json_is_object(co), "an object") || ps_ck_get_arr(c, co, "ids", 1, 4096, &ids, &ni)) return -1;
        size_t o3 = ps_ck_key(c, "ids");
        for (int64_t j = 0; j < ni; j++) {
            size_t o4 = ps_ck_idx(c, (size_t)j);
            if (ps_ck_int_value(c, json_array_get(ids, (size_t)j), 0, INT32_MAX, NULL)) return -1;
            ps_ck_pop(c, o4);
        }
        ps_ck_pop(c, o3);
        if ((v = json_object_get(co, "text")) && !json_is_null(v) && !json_is_string(v)) {
            ps_ck_key(c, "text");
            return ps_ck_bad(c, "expected a string or null, got %s", ps_ck_type_name(v));
        }
        ps_ck_pop(c, o2);
    }
    ps_ck_pop(c, o1);
    ps_ck_pop(c, old);
    return 0;
}

/* a point's candidates (nc of them): p = exp(logprob), all_top1 a boolean; pr: the first two p */
static int ck_point_candidates(ps_ck *c, json_t *pc, int64_t nc, double pr[2]) {
    size_t o5 = ps_ck_key(c, "candidates");
    for (int64_t k = 0; k < nc; k++) {
        json_t *co = json_array_get(pc, (size_t)k), *v;
        size_t o6 = ps_ck_idx(c, (size_t)k);
        double lp, p;
        if (ps_ck_want_type(c, co, json_is_object(co), "an object") || ps_ck_get_num(c, co, "logprob", -INFINITY, TOL, &lp) ||
            ps_ck_get_frac(c, co, "p", &p))
            return -1;
        if (!ps_ck_close_to(p, exp(lp), 0)) {
            ps_ck_key(c, "p");
            return ps_ck_bad(c, "%.10g, but exp(logprob) = %.10g", p, exp(lp));
        }
        v = json_object_get(co, "all_top1");
        ps_ck_key(c, "all_top1");
        if (ps_ck_want_type(c, v, json_is_boolean(v), "true or false")) return -1;
        ps_ck_pop(c, o6);
        if (k < 2) pr[k] = p;
    }
    ps_ck_pop(c, o5);
    return 0;
}

/* points[i] of a family (po): its length L = Lmin + i, phase L mod P, candidates and delta (*L, *ph, *d) */
static int ck_point(ps_ck *c, json_t *po, int64_t i, int64_t Lmin, int64_t P, int64_t nc, int64_t *Lp, int64_t *php, double *dp) {
    json_t *pc, *t1;
    int64_t L, ph, pt;
    double d, pr[2] = {0, 0};
    if (ps_ck_want_type(c, po, json_is_object(po), "an object") || ps_ck_get_int(c, po, "L", 0, PS_FILLERS_MAX_L, &L)) return -1;
    if (L != Lmin + i) {
        ps_ck_key(c, "L");
        return ps_ck_bad(c, "%lld, expected %lld (lengths min..max, each once, in order)", (long long)L, (long long)(Lmin + i));
    }
    if (ps_ck_get_int(c, po, "phase", 0, P - 1, &ph)) return -1;
    if (ph != L % P) {
        ps_ck_key(c, "phase");
        return ps_ck_bad(c, "%lld, but L mod P = %lld mod %lld = %lld", (long long)ph, (long long)L, (long long)P, (long long)(L % P));
    }
    if (ps_ck_get_int(c, po, "prompt_tokens", L, INT64_MAX, &pt) || ps_ck_get_arr(c, po, "candidates", nc, nc, &pc, NULL)) return -1;
    if (ck_point_candidates(c, pc, nc, pr)) return -1;
    if (ps_ck_get_num(c, po, "delta", -1 - TOL, 1 + TOL, &d)) return -1;
    if (!ps_ck_close_to(d, pr[0] - pr[1], 0)) {
        ps_ck_key(c, "delta");
        return ps_ck_bad(c, "%.10g, but candidates[0].p - candidates[1].p = %.10g", d, pr[0] - pr[1]);
    }
    if (ps_ck_get_obj(c, po, "top1", &t1)) return -1;
    size_t o7 = ps_ck_key(c, "top1");
    if (ps_ck_get_int(c, t1, "id", 0, INT32_MAX, NULL)) return -1;
    ps_ck_pop(c, o7);
    *Lp = L, *php = ph, *dp = d;
    return 0;
}

/* a family's residues: each one's n and mean delta against its points' (cnt, sum per phase) */
static int ck_family_residues(ps_ck *c, json_t *fo, int64_t P, int64_t nL, const int64_t *cnt, const double *sum) {
    json_t *res;
    if (ps_ck_get_arr(c, fo, "residues", P, P, &res, NULL)) return -1;
    size_t o3 = ps_ck_key(c, "residues");
    for (int64_t r = 0; r < P; r++) {
        json_t *ro = json_array_get(res, (size_t)r);
        size_t o4 = ps_ck_idx(c, (size_t)r);
        int64_t rho, n;
        double md = 0;
        int isnull = 0;
        if (ps_ck_want_type(c, ro, json_is_object(ro), "an object") || ps_ck_get_int(c, ro, "rho", r, r, &rho) ||
            ps_ck_get_int(c, ro, "n", 0, nL, &n) || opt_null_or_num(c, ro, "mean_delta", -1 - TOL, 1 + TOL, &md, &isnull))
            return -1;
        if (n != cnt[r]) {
            ps_ck_key(c, "n");
            return ps_ck_bad(c, "%lld, but %lld points have phase %lld", (long long)n, (long long)cnt[r], (long long)r);
        }
        if (isnull != (n == 0) || (n && !ps_ck_close_to(md, sum[r] / (double)n, 0))) {
            ps_ck_key(c, "mean_delta");
            if (n)
                return ps_ck_bad(c, "%s, but the mean delta of its %lld points is %.10g", isnull ? "null" : "a different value", (long long)n,
                           sum[r] / (double)n);
            return ps_ck_bad(c, "a number, but no point has this phase (null expected)");
        }
        ps_ck_pop(c, o4);
    }
    ps_ck_pop(c, o3);
    return 0;
}

int ps_check_fillers(ps_ck *c, json_t *doc) {
    ps_prov_info pi;
    json_t *st, *fams, *v;
    int64_t Lmin, Lmax, nc, P, perms, nf;
    int rc = -1, detrend;
    double *y = NULL;
    int64_t *x = NULL;
    int *strat = NULL;
    if (ps_ck_provenance(c, doc, 1, NULL, &pi) || ck_experiment(c, doc, &Lmin, &Lmax, &nc)) return -1;
    if (ps_ck_get_int(c, doc, "period", 1, MAX_PERIOD, &P)) return -1;
    if (P != pi.period) {
        ps_ck_key(c, "period");
        return ps_ck_bad(c, "%lld, but provenance.eval.period is %lld", (long long)P, (long long)pi.period);
    }
    if (ps_ck_get_obj(c, doc, "statistic", &st)) return -1;
    size_t old = ps_ck_key(c, "statistic");
    if (ps_ck_get_int(c, st, "permutations", 0, PS_FILLERS_MAX_PERMUTATIONS, &perms)) return -1;
    v = json_object_get(st, "detrend");
    ps_ck_key(c, "detrend");
    if (ps_ck_want_type(c, v, json_is_boolean(v), "true or false")) return -1;
    detrend = json_is_true(v);
    ps_ck_pop(c, old);
    int64_t nL = Lmax - Lmin + 1;
    if (ps_ck_get_arr(c, doc, "families", 1, PS_FILLERS_MAX_POINTS / nL > 0 ? PS_FILLERS_MAX_POINTS / nL : 1, &fams, &nf)) return -1;
    y = malloc((size_t)(nf * nL) * sizeof *y);
    x = malloc((size_t)(nf * nL) * sizeof *x);
    strat = malloc((size_t)(nf * nL) * sizeof *strat);
    int64_t *cnt = calloc((size_t)P, sizeof *cnt);
    double *sum = calloc((size_t)P, sizeof *sum);
    if (!y || !x || !strat || !cnt || !sum) {
        ps_fail(c->err, "out of memory");
        goto done;
    }
    size_t of = ps_ck_key(c, "families");
    for (int64_t f = 0; f < nf; f++) {
        json_t *fo = json_array_get(fams, (size_t)f), *pts;
        size_t o2 = ps_ck_idx(c, (size_t)f);
        if (ps_ck_want_type(c, fo, json_is_object(fo), "an object") || ps_ck_get_str(c, fo, "name", NULL) ||
            ps_ck_get_arr(c, fo, "points", nL, nL, &pts, NULL))
            goto done;
        memset(cnt, 0, (size_t)P * sizeof *cnt);
        memset(sum, 0, (size_t)P * sizeof *sum);
        size_t o3 = ps_ck_key(c, "points");
        for (int64_t i = 0; i < nL; i++) {
            size_t o4 = ps_ck_idx(c, (size_t)i);
            int64_t L = 0, ph = 0;
            double d = 0;
            if (ck_point(c, json_array_get(pts, (size_t)i), i, Lmin, P, nc, &L, &ph, &d)) goto done;
            y[f * nL + i] = d;
            x[f * nL + i] = L;
            strat[f * nL + i] = (int)f;
            cnt[ph]++;
            sum[ph] += d;
            ps_ck_pop(c, o4);
        }
        ps_ck_pop(c, o3);
        if (ck_family_residues(c, fo, P, nL, cnt, sum)) goto done;
        json_t *t = json_object_get(fo, "test");
        size_t o8 = ps_ck_key(c, "test");
        if (check_phase_test(c, t, y + f * nL, x + f * nL, NULL, nL, P, detrend, perms)) goto done;
        ps_ck_pop(c, o8);
        ps_ck_pop(c, o2);
    }
    ps_ck_pop(c, of);
    ps_ck_key(c, "pooled");
    if (check_phase_test(c, json_object_get(doc, "pooled"), y, x, strat, nf * nL, P, detrend, perms)) goto done;
    ps_ck_pop(c, 0);
    rc = 0;
done:
    free(y);
    free(x);
    free(strat);
    free(cnt);
    free(sum);
    return rc;
}

/* ---- figure (fillers.png): delta against L, residues marked, families side by side ---- */

#define FL_MAX_FAMILIES 16
#define FL_COLS 4
#define FL_PW 330.0 /* plot area of one panel */
#define FL_PH 260.0
#define FL_CELL_H 372.0
#define FL_TOP 84.0

typedef struct {
    int nf, cols, rows;
    int64_t P, nL, Lmin;
    double *d; /* [nf × nL] */
    double y0, y1, left; /* left: room for the y tick labels and the axis label */
    char (*name)[160], (*stats)[200];
    char title[512], headline[512], subtitle[512];
} fl_ctx;

/* A tick label with as many digits as the tick step needs: fixed point, or scientific for ticks below 1e-3
 * or from 1e5 (Δ of a random model spans 1e-8). big: the largest |tick| of the axis. */
static int fl_digits(double step) {
    int dec = step > 0 ? (int)fmax(0, ceil(-log10(step) - 1e-9)) : 2;
    while (step > 0 && dec < 14 && fabs(step * pow(10, dec) - round(step * pow(10, dec))) > 1e-6) dec++; /* 2.5e-6: 7 */
    return dec;
}

static void fl_tick(char *buf, size_t n, double v, double step, double big) {
    if (fabs(v) < step * 1e-6) v = 0;
    if (big > 0 && (big < 1e-3 || big >= 1e5)) {
        double ex = floor(log10(big));
        snprintf(buf, n, "%.*e", fl_digits(step / pow(10, ex)), v);
    } else
        snprintf(buf, n, "%.*f", fl_digits(step), v);
}

/* axes of one panel: integer L on x, Δ on y; returns the y tick labels' width */
static double fl_axes(cairo_t *cr, double x, double y, double w, double h, double x0, double x1, double y0, double y1, const char *yl) {
    double t[32], tw = 0, big = 0;
    int n = ps_nice_ticks(y0, y1, 5, t, 32);
    double step = n > 1 ? t[1] - t[0] : 1;
    for (int i = 0; i < n; i++) big = fmax(big, fabs(t[i]));
    cairo_set_line_width(cr, 1);
    for (int i = 0; i < n; i++) {
        if (t[i] > y1 || t[i] < y0) continue;
        double yy = round(y + h * (1 - (t[i] - y0) / (y1 - y0))) + 0.5;
        cairo_set_source_rgb(cr, 0.88, 0.88, 0.88);
        ps_fig_line(cr, x, yy, x + w, yy);
        cairo_set_source_rgb(cr, 0, 0, 0);
        ps_fig_line(cr, x - 4, yy, x, yy);
        char buf[48];
        fl_tick(buf, sizeof buf, t[i], step, big);
        ps_text(cr, x - 6, yy, buf, 11, 1, 0.5, 0, 0);
        tw = fmax(tw, ps_text_width(cr, buf, 11, 0));
    }
    n = ps_nice_ticks(x0, x1, 6, t, 32);
    step = n > 1 ? t[1] - t[0] : 1;
    if (step < 1) { /* integer lengths only */
        n = 0;
        for (double v = ceil(x0); v <= x1 && n < 32; v++) t[n++] = v;
    }
    for (int i = 0; i < n; i++) {
        if (t[i] < x0 || t[i] > x1 || t[i] != floor(t[i])) continue;
        double xx = round(x + w * (t[i] - x0) / (x1 - x0)) + 0.5;
        ps_fig_line(cr, xx, y + h, xx, y + h + 4);
        char buf[32];
        snprintf(buf, sizeof buf, "%.0f", t[i]);
        ps_text(cr, xx, y + h + 6, buf, 11, 0.5, 0, 0, 0);
    }
    cairo_rectangle(cr, x + 0.5, y + 0.5, w, h);
    cairo_stroke(cr);
    ps_text(cr, x + w / 2, y + h + 24, "filler length L (tokens)", 12, 0.5, 0, 0, 0);
    if (yl) ps_text(cr, x - tw - 16, y + h / 2, yl, 12, 0.5, 1, -M_PI / 2, 0);
    return tw;
}

static double fl_cell_w(const fl_ctx *x) { return FL_PW + 40.0 + x->left; }

static ps_rgb fl_color(int64_t rho, int64_t P) {
    if (P <= 6) return ps_okabe_ito((int)rho); /* blue, orange, bluish green, vermillion, reddish purple, sky blue */
    return ps_viridis(P > 1 ? 0.92 * (double)rho / (double)(P - 1) : 0);
}

static void draw_fillers(cairo_t *cr, void *vctx) {
    fl_ctx *x = vctx;
    double W = 40 + x->cols * fl_cell_w(x);
    ps_text(cr, 20, 22, x->title, ps_fig_fit(cr, x->title, 17, W - 40, 1), 0, 0.5, 0, 1);
    ps_text(cr, 20, 46, x->headline, ps_fig_fit(cr, x->headline, 14, W - 40, 1), 0, 0.5, 0, 1);
    ps_text(cr, 20, 68, x->subtitle, ps_fig_fit(cr, x->subtitle, 12, W - 40, 0), 0, 0.5, 0, 0);
    double x0 = (double)x->Lmin - 0.5, x1 = (double)(x->Lmin + x->nL - 1) + 0.5;
    for (int f = 0; f < x->nf; f++) {
        double px = 40 + x->left + (f % x->cols) * fl_cell_w(x), py = FL_TOP + 44 + (f / x->cols) * FL_CELL_H;
        cairo_set_source_rgb(cr, 0, 0, 0);
        ps_text(cr, px, py - 30, x->name[f], ps_fig_fit(cr, x->name[f], 14, FL_PW, 1), 0, 0.5, 0, 1);
        ps_text(cr, px, py - 12, x->stats[f], ps_fig_fit(cr, x->stats[f], 12, FL_PW, 0), 0, 0.5, 0, 0);
        /* L ≡ 0 (mod P): faint vertical lines, where a new period starts */
        cairo_set_source_rgb(cr, 0.80, 0.80, 0.80);
        cairo_set_line_width(cr, 1);
        static const double dots[2] = {2, 3};
        cairo_set_dash(cr, dots, 2, 0);
        for (int64_t i = 0; i < x->nL; i++)
            if ((x->Lmin + i) % x->P == 0) {
                double xx = round(px + FL_PW * ((double)(x->Lmin + i) - x0) / (x1 - x0)) + 0.5;
                ps_fig_line(cr, xx, py, xx, py + FL_PH);
            }
        cairo_set_dash(cr, NULL, 0, 0);
        cairo_set_source_rgb(cr, 0, 0, 0);
        fl_axes(cr, px, py, FL_PW, FL_PH, x0, x1, x->y0, x->y1, "Δ = P(first) − P(second)");
        if (x->y0 < 0 && x->y1 > 0) { /* Δ = 0 */
            double yy = round(py + FL_PH * (1 - (0 - x->y0) / (x->y1 - x->y0))) + 0.5;
            cairo_set_source_rgb(cr, 0.45, 0.45, 0.45);
            cairo_set_line_width(cr, 1);
            ps_fig_line(cr, px, yy, px + FL_PW, yy);
        }
        double xs[4096];
        int n = (int)(x->nL < 4096 ? x->nL : 4096);
        for (int i = 0; i < n; i++) xs[i] = (double)(x->Lmin + i);
        cairo_set_source_rgb(cr, 0.55, 0.55, 0.55);
        cairo_set_line_width(cr, 1.2);
        ps_fig_polyline(cr, xs, x->d + f * x->nL, 1, n, px, py, FL_PW, FL_PH, x0, x1, x->y0, x->y1);
        double dx = FL_PW / (double)x->nL, r = fmax(1.5, fmin(4.5, dx / 2.5));
        int label = dx >= 9;
        for (int i = 0; i < n; i++) {
            int64_t rho = (x->Lmin + i) % x->P;
            double xx = px + FL_PW * (xs[i] - x0) / (x1 - x0), yy = py + FL_PH * (1 - (x->d[f * x->nL + i] - x->y0) / (x->y1 - x->y0));
            ps_set_rgb(cr, fl_color(rho, x->P));
            cairo_arc(cr, xx, yy, r, 0, 2 * M_PI);
            cairo_fill_preserve(cr);
            cairo_set_source_rgb(cr, 0, 0, 0);
            cairo_set_line_width(cr, 0.6);
            cairo_stroke(cr);
            if (label) { /* the residue as a number too: colour is not the only cue */
                char b[24];
                snprintf(b, sizeof b, "%lld", (long long)rho);
                ps_text(cr, xx, yy - r - 2, b, 9, 0.5, 1, 0, 0);
            }
        }
    }
    /* legend: the residues' colours */
    double ly = FL_TOP + x->rows * FL_CELL_H + 10, lx = 40;
    cairo_set_source_rgb(cr, 0, 0, 0);
    char lab[64];
    snprintf(lab, sizeof lab, "phase ρ = L mod %lld:", (long long)x->P);
    ps_text(cr, lx, ly, lab, 12, 0, 0.5, 0, 1);
    lx += ps_text_width(cr, lab, 12, 1) + 12;
    int64_t step = x->P <= 24 ? 1 : (x->P + 23) / 24;
    for (int64_t rho = 0; rho < x->P; rho += step) {
        ps_set_rgb(cr, fl_color(rho, x->P));
        cairo_arc(cr, lx + 5, ly, 5, 0, 2 * M_PI);
        cairo_fill(cr);
        cairo_set_source_rgb(cr, 0, 0, 0);
        char b[24];
        snprintf(b, sizeof b, "%lld", (long long)rho);
        ps_text(cr, lx + 13, ly, b, 11, 0, 0.5, 0, 0);
        lx += 13 + ps_text_width(cr, b, 11, 0) + 10;
    }
}

static int render_fillers(json_t *doc, const char *path, const char *out, const ps_render_opts *o, int verbose, ps_error *err) {
    json_t *prov = json_object_get(doc, "provenance"), *fams = json_object_get(doc, "families"), *ex = json_object_get(doc, "experiment");
    fl_ctx x = {0};
    x.nf = (int)json_array_size(fams);
    x.P = json_integer_value(json_object_get(doc, "period"));
    json_t *ln = json_object_get(ex, "lengths");
    x.Lmin = json_integer_value(json_array_get(ln, 0));
    x.nL = json_integer_value(json_array_get(ln, 1)) - x.Lmin + 1;
    int all_f = x.nf;
    if (x.nf < 1) return ps_fail(err, "%s: families: no entries; the figure shows 1 to %d families", path, FL_MAX_FAMILIES);
    if (x.nf > FL_MAX_FAMILIES) x.nf = FL_MAX_FAMILIES; /* the first 16 are drawn; the subtitle says so */
    if (x.nL < 1 || x.nL > 4096)
        return ps_fail(err, "%s: experiment.lengths: %lld lengths; the figure shows 1 to 4096", path, (long long)x.nL);
    if (x.P < 1 || x.P > MAX_RESIDUES) return ps_fail(err, "%s: period: %lld; the figure shows 1 to %d residues", path, (long long)x.P, MAX_RESIDUES);
    x.cols = x.nf < FL_COLS ? x.nf : FL_COLS;
    x.rows = (x.nf + x.cols - 1) / x.cols;
    x.d = malloc((size_t)(x.nf * x.nL) * sizeof *x.d);
    x.name = calloc((size_t)x.nf, sizeof *x.name);
    x.stats = calloc((size_t)x.nf, sizeof *x.stats);
    if (!x.d || !x.name || !x.stats) {
        free(x.d), free(x.name), free(x.stats);
        return ps_fail(err, "%s: out of memory", path);
    }
    double mn = INFINITY, mx = -INFINITY;
    for (int f = 0; f < x.nf; f++) {
        json_t *fo = json_array_get(fams, (size_t)f), *pts = json_object_get(fo, "points"), *t = json_object_get(fo, "test");
        for (int64_t i = 0; i < x.nL; i++) {
            double d = ps_fig_num(json_array_get(pts, (size_t)i), "delta");
            x.d[f * x.nL + i] = d;
            mn = fmin(mn, d);
            mx = fmax(mx, d);
        }
        char pt[32];
        ps_format_p(pt, sizeof pt, ps_fig_num(t, "p_value"));
        snprintf(x.name[f], sizeof x.name[f], "%s", json_string_value(json_object_get(fo, "name")) ?: "");
        snprintf(x.stats[f], sizeof x.stats[f], "η² %.2f across residues, permutation p %s%s", ps_fig_num(t, "eta2"), pt,
                 json_is_true(json_object_get(t, "detrended")) ? " (detrended)" : "");
    }
    double pad = (mx - mn) * 0.08;
    if (!(pad > 0)) pad = fmax(1e-3, fabs(mx) * 0.1);
    x.y0 = mn - pad;
    x.y1 = mx + pad;
    { /* the widest y tick label sets the panels' left margin */
        double t[32];
        int nt = ps_nice_ticks(x.y0, x.y1, 5, t, 32);
        double w = 0, big = 0;
        for (int i = 0; i < nt; i++) big = fmax(big, fabs(t[i]));
        for (int i = 0; i < nt; i++) {
            char buf[48];
            fl_tick(buf, sizeof buf, t[i], nt > 1 ? t[1] - t[0] : 1, big);
            w = fmax(w, ps_fig_measure(buf, 11, 0));
        }
        x.left = w + 40;
    }
    char name[400], c0[64] = "first", c1[64] = "second", pt[32];
    ps_fig_model_name(name, sizeof name, prov);
    json_t *cands = json_object_get(ex, "candidates");
    for (int k = 0; k < 2; k++) {
        const char *t = json_string_value(json_object_get(json_array_get(cands, (size_t)k), "text"));
        if (t) snprintf(k ? c1 : c0, sizeof c0, "\"%.56s\"", t);
    }
    json_t *pl = json_object_get(doc, "pooled");
    ps_format_p(pt, sizeof pt, ps_fig_num(pl, "p_value"));
    snprintf(x.title, sizeof x.title, "Filler experiment %s — %s", json_string_value(json_object_get(ex, "name")) ?: "", name);
    snprintf(x.headline, sizeof x.headline, "Δ = P(%s) − P(%s) against the filler length L, coloured by phase ρ = L mod %lld", c0, c1,
             (long long)x.P);
    char shown[64] = "";
    if (all_f > x.nf) snprintf(shown, sizeof shown, " (the first %d drawn)", x.nf);
    snprintf(x.subtitle, sizeof x.subtitle,
             "pooled over the %d families%s: η² %.2f, permutation p %s (%lld permutations); dotted lines: L ≡ 0 (mod %lld)", all_f,
             shown, ps_fig_num(pl, "eta2"), pt, (long long)json_integer_value(json_object_get(pl, "permutations")), (long long)x.P);
    ps_fig_chunks ch;
    ps_fig_make_chunks(&ch, prov, x.title);
    int rc = 0;
    ps_fig f;
    for (int k = 0; !rc && k < ps_fig_n_files(o); k++)
        if (!(rc = ps_fig_file_open(&f, out, "fillers", 40 + x.cols * fl_cell_w(&x), FL_TOP + x.rows * FL_CELL_H + 40, o, k, err))) {
            draw_fillers(f.cr, &x);
            rc = ps_fig_file_close(&f, &ch, verbose, err);
        }
    free(x.d);
    free(x.name);
    free(x.stats);
    return rc;
}

int ps_render_fillers(json_t *const *docs, const char *const *paths, int n, const char *out, const ps_render_opts *o, int verbose,
                      ps_error *err) {
    (void)n; /* one at a time (viz/kinds.c) */
    return render_fillers(docs[0], paths[0], out, o, verbose, err);
}
