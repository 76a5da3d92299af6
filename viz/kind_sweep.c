/* kind_sweep.c — result kinds "sweep" and "gatecycle": accuracy per phase residue (one curve; gate cycling
 * a curve before and after the edit, with the per-head knockout profiles of --measure knockout). Their
 * validation (docs/results-schema.md) and their figure, phase_curve.png / gatecycle_curve.png (several sweeps
 * share one figure). */
#include "viz/kinds.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/runtime.h"
#include "viz/check_common.h"
#include "viz/fig_common.h"

/* ---- validation ---- */

int ps_check_sweep(ps_ck *c, json_t *doc) {
    ps_prov_info pi;
    ps_curve_info ci;
    if (ps_ck_provenance(c, doc, 1, "sweep", &pi)) return -1;
    int rc = ps_ck_curve(c, doc, "curve", pi.period, &ci);
    ps_ck_curve_free(&ci);
    return rc;
}

/* gatecycle.json "per_head" (--measure knockout): the profiles, each head's shifts and their consistency
 * with the worst residues and K, and the summary recomputed from the heads. */
static int64_t smod(int64_t d, int64_t P) {
    int64_t m = ((d % P) + P) % P;
    return m > P / 2 ? m - P : m;
}

static int check_per_head(ps_ck *c, json_t *ph, int64_t P, int64_t K) {
    static const char *const MEAS[] = {"knockout", NULL}, *const TG[] = {"compressed", "raw", "both", NULL},
                             *const ST[] = {"measured", "no_profile", "lost", NULL};
    json_t *ex, *heads, *sum;
    int64_t nex, nh;
    size_t old = ps_ck_key(c, "per_head");
    if (ps_ck_want_type(c, ph, json_is_object(ph), "an object") || ps_ck_get_enum(c, ph, "measure", MEAS, NULL) ||
        ps_ck_get_enum(c, ph, "target", TG, NULL) || ps_ck_get_num(c, ph, "min_hurt_pp", 0, 100, NULL) ||
        ps_ck_get_arr(c, ph, "excluded_residues", 0, P, &ex, &nex) || ps_ck_get_arr(c, ph, "heads", 1, MAX_SHIFT, &heads, &nh) ||
        ps_ck_get_obj(c, ph, "summary", &sum))
        return -1;
    for (int64_t i = 0; i < nex; i++) {
        size_t o = ps_ck_key(c, "excluded_residues");
        ps_ck_idx(c, (size_t)i);
        if (ps_ck_int_value(c, json_array_get(ex, (size_t)i), 0, P - 1, NULL)) return -1;
        ps_ck_pop(c, o);
    }
    int64_t n_meas = 0, n_lost = 0, n_none = 0, ex_w = 0, ex_x = 0;
    double abs_w = 0, abs_x = 0;
    for (int64_t i = 0; i < nh; i++) {
        json_t *e = json_array_get(heads, (size_t)i), *pr;
        size_t o1 = ps_ck_key(c, "heads");
        ps_ck_idx(c, (size_t)i);
        const char *st;
        if (ps_ck_want_type(c, e, json_is_object(e), "an object") || ps_ck_get_int(c, e, "head", 0, MAX_SHIFT, NULL) ||
            ps_ck_get_enum(c, e, "status", ST, &st))
            return -1;
        for (int b = 0; b < 2; b++) {
            const char *pk = b ? "hurt_after_pp" : "hurt_before_pp";
            if (ps_ck_get_arr(c, e, pk, P, P, &pr, NULL)) return -1;
            for (int64_t r = 0; r < P; r++) {
                size_t o2 = ps_ck_key(c, pk);
                ps_ck_idx(c, (size_t)r);
                if (ps_ck_num_value(c, json_array_get(pr, (size_t)r), -100 - TOL, 100 + TOL, NULL)) return -1;
                ps_ck_pop(c, o2);
            }
        }
        int m = !strcmp(st, "measured");
        int64_t wb = -1, wa = -1, sw = 0, ew = 0, sx = 0, exx = 0;
        static const char *const WK[] = {"worst_before", "worst_after"};
        for (int b = 0; b < 2; b++) {
            json_t *w = json_object_get(e, WK[b]);
            size_t o2 = ps_ck_key(c, WK[b]);
            if (!w) return ps_ck_bad(c, "missing");
            if (!json_is_null(w) && ps_ck_int_value(c, w, 0, P - 1, b ? &wa : &wb)) return -1;
            if (m && json_is_null(w)) return ps_ck_bad(c, "null, but the head is measured");
            ps_ck_pop(c, o2);
        }
        static const char *const SK[] = {"shift_worst", "error_worst", "shift_xcorr", "error_xcorr"};
        int64_t *sv[] = {&sw, &ew, &sx, &exx};
        for (int q = 0; q < 4; q++) {
            json_t *w = json_object_get(e, SK[q]);
            size_t o2 = ps_ck_key(c, SK[q]);
            if (!w) return ps_ck_bad(c, "missing");
            if (!m) {
                if (!json_is_null(w)) return ps_ck_bad(c, "expected null (the head's status is %s)", st);
            } else if (ps_ck_int_value(c, w, -P, P, sv[q]))
                return -1;
            else if (*sv[q] != smod(*sv[q], P))
                return ps_ck_bad(c, "%lld is not in (-P/2, P/2]", (long long)*sv[q]);
            ps_ck_pop(c, o2);
        }
        if (m) {
            if (sw != smod(wa - wb, P)) {
                ps_ck_key(c, "shift_worst");
                return ps_ck_bad(c, "%lld, but worst_after - worst_before = %lld (mod P)", (long long)sw, (long long)smod(wa - wb, P));
            }
            if (ew != smod(sw - K, P)) {
                ps_ck_key(c, "error_worst");
                return ps_ck_bad(c, "%lld, but shift_worst - cycle.shift = %lld (mod P)", (long long)ew, (long long)smod(sw - K, P));
            }
            if (exx != smod(sx - K, P)) {
                ps_ck_key(c, "error_xcorr");
                return ps_ck_bad(c, "%lld, but shift_xcorr - cycle.shift = %lld (mod P)", (long long)exx, (long long)smod(sx - K, P));
            }
            n_meas++;
            abs_w += (double)llabs(ew);
            abs_x += (double)llabs(exx);
            ex_w += ew == 0;
            ex_x += exx == 0;
        }
        n_lost += !strcmp(st, "lost");
        n_none += !strcmp(st, "no_profile");
        ps_ck_pop(c, o1);
    }
    size_t o1 = ps_ck_key(c, "summary");
    int64_t v;
    const char *const CK[] = {"n_heads", "n_measured", "n_lost", "n_no_profile"};
    int64_t want[] = {nh, n_meas, n_lost, n_none};
    for (int q = 0; q < 4; q++) {
        if (ps_ck_get_int(c, sum, CK[q], 0, MAX_SHIFT, &v)) return -1;
        if (v != want[q]) {
            ps_ck_key(c, CK[q]);
            return ps_ck_bad(c, "%lld, but the heads say %lld", (long long)v, (long long)want[q]);
        }
    }
    const char *const SK2[] = {"mean_abs_error_worst", "fraction_exact_worst", "mean_abs_error_xcorr", "fraction_exact_xcorr"};
    double w2[] = {n_meas ? abs_w / (double)n_meas : 0, n_meas ? (double)ex_w / (double)n_meas : 0,
                   n_meas ? abs_x / (double)n_meas : 0, n_meas ? (double)ex_x / (double)n_meas : 0};
    for (int q = 0; q < 4; q++) {
        json_t *w = json_object_get(sum, SK2[q]);
        size_t o2 = ps_ck_key(c, SK2[q]);
        if (!w) return ps_ck_bad(c, "missing");
        if (!n_meas) {
            if (!json_is_null(w)) return ps_ck_bad(c, "expected null (no head measured)");
        } else {
            double x;
            if (ps_ck_num_value(c, w, 0, (double)P, &x)) return -1;
            if (fabs(x - w2[q]) > 1e-6 * fmax(1, fabs(w2[q])))
                return ps_ck_bad(c, "%.10g, but the heads give %.10g", x, w2[q]);
        }
        ps_ck_pop(c, o2);
    }
    ps_ck_pop(c, o1);
    ps_ck_pop(c, old);
    return 0;
}

int ps_check_gatecycle(ps_ck *c, json_t *doc) {
    static const char *const BR[] = {"key", "value", "both", "compressor", "indexer", NULL},
                             *const PA[] = {"gate", "payload", "all", NULL};
    ps_prov_info pi;
    ps_curve_info b = {0}, a = {0};
    json_t *cy, *v;
    int rc = -1;
    if (ps_ck_provenance(c, doc, 1, NULL, &pi) || ps_ck_get_obj(c, doc, "cycle", &cy)) goto done;
    size_t old = ps_ck_key(c, "cycle"), in_cycle = c->len;
    int64_t K;
    if (ps_ck_get_int(c, cy, "layer", 0, MAX_SHIFT, NULL) || ps_ck_get_int(c, cy, "shift", -MAX_SHIFT, MAX_SHIFT, &K)) goto done;
    if (ps_ck_field(c, cy, "head", &v)) goto done;
    if (json_is_string(v)) {
        if (strcmp(json_string_value(v), "all")) {
            ps_ck_bad(c, "\"%.100s\": expected \"all\" or a head number", json_string_value(v));
            goto done;
        }
    } else if (ps_ck_int_value(c, v, 0, MAX_SHIFT, NULL))
        goto done;
    ps_ck_pop(c, in_cycle);
    if (ps_ck_get_enum(c, cy, "branch", BR, NULL) || ps_ck_get_enum(c, cy, "params", PA, NULL)) goto done;
    ps_ck_pop(c, old);
    if (ps_ck_curve(c, doc, "before", pi.period, &b) || ps_ck_curve(c, doc, "after", pi.period, &a)) goto done;
    /* the shift statistic may leave residues out (those near chance), so it is checked for range and
     * consistency, not recomputed */
    int64_t P = pi.period, s, ss;
    if (ps_ck_get_int(c, doc, "best_shift", 0, P - 1, &s) || ps_ck_get_int(c, doc, "best_shift_signed", -P, P, &ss)) goto done;
    if (ss != (s > P / 2 ? s - P : s)) {
        ps_ck_key(c, "best_shift_signed");
        ps_ck_bad(c, "%lld, but best_shift %lld maps to %lld in (-P/2, P/2]", (long long)ss, (long long)s, (long long)(s > P / 2 ? s - P : s));
        goto done;
    }
    if (ps_ck_get_num(c, doc, "best_shift_correlation", -1 - TOL, 1 + TOL, NULL)) goto done;
    if ((v = json_object_get(doc, "per_head")) && check_per_head(c, v, P, K)) goto done;
    rc = 0;
done:
    ps_ck_curve_free(&b);
    ps_ck_curve_free(&a);
    return rc;
}

/* ---- figures ---- */

/* "0–3, 5, 7–15" from a sorted list of ints */
static void fmt_ranges(char *buf, size_t n, const int64_t *v, int k) {
    size_t o = 0;
    buf[0] = '\0';
    for (int i = 0; i < k && o < n;) {
        int j = i;
        while (j + 1 < k && v[j + 1] == v[j] + 1) j++;
        int w;
        if (j > i) w = snprintf(buf + o, n - o, "%s%lld–%lld", i ? ", " : "", (long long)v[i], (long long)v[j]);
        else w = snprintf(buf + o, n - o, "%s%lld", i ? ", " : "", (long long)v[i]);
        if (w < 0) break;
        o += (size_t)w;
        i = j + 1;
    }
}

/* ---- phase curves ---- */

#define CURVE_W 1000.0
#define CURVE_L 80.0
#define CURVE_R 340.0
#define CURVE_T 104.0
#define CURVE_PH 400.0
#define CURVE_Y0 (-0.04) /* accuracy range drawn: a little beyond [0, 1], so no curve hides under the frame */
#define CURVE_Y1 1.05

ps_rect ps_curve_area(void) { return (ps_rect){CURVE_L, CURVE_T, CURVE_W - CURVE_L - CURVE_R, CURVE_PH}; }
double ps_curve_x(int64_t P, int64_t r) {
    ps_rect a = ps_curve_area();
    return a.x + a.w / (double)(P > 0 ? P : 1) * ((double)r + 0.5); /* residue r sits at the centre of its slot */
}
double ps_curve_y(double acc) {
    ps_rect a = ps_curve_area();
    return a.y + a.h * (1 - (acc - CURVE_Y0) / (CURVE_Y1 - CURVE_Y0));
}

typedef struct {
    char label[256], stats[256], stats2[256];
    int64_t P;
    double *acc, *lo, *hi, mean;
    int64_t argmin;
    int flat; /* max == min: no worst residue to ring */
} curve;

typedef struct {
    int n;
    curve *c;
    double chance; /* gate cycling: the task's chance accuracy, drawn dotted (NaN: none) */
    char title[1024], headline[1024], subtitle[1024], xlabel[128];
} curves_ctx;

static void free_curves(curves_ctx *x) {
    for (int i = 0; i < x->n; i++) {
        free(x->c[i].acc);
        free(x->c[i].lo);
        free(x->c[i].hi);
    }
    free(x->c);
}

/* A curve object's period: no period when "dominant_period" or its "period" is null or missing, or when
 * the curve or its period is flagged non-significant ("significant": false). */
static int has_period(json_t *cj) {
    json_t *dp = json_object_get(cj, "dominant_period");
    if (!json_is_number(json_object_get(dp, "period"))) return 0;
    if (json_is_false(json_object_get(dp, "significant")) || json_is_false(json_object_get(cj, "significant")) ||
        json_is_false(json_object_get(cj, "phase_sensitive")))
        return 0;
    return 1;
}

static int fill_curve(curve *c, json_t *cj, const char *label, const char *path, const char *field, ps_error *err) {
    snprintf(c->label, sizeof c->label, "%s", label);
    json_t *res = json_object_get(cj, "residues");
    size_t nres = json_array_size(res);
    if (nres < 1) return ps_fail(err, "%s: %s.residues is missing or empty", path, field);
    if (nres > MAX_RESIDUES)
        return ps_fail(err, "%s: %s.residues has %zu entries; a figure shows at most %d", path, field, nres, MAX_RESIDUES);
    c->P = (int64_t)nres;
    c->acc = calloc(nres, sizeof(double));
    c->lo = calloc(nres, sizeof(double));
    c->hi = calloc(nres, sizeof(double));
    if (!c->acc || !c->lo || !c->hi) return ps_fail(err, "%s: out of memory", path);
    double min = 2, max = -1;
    c->argmin = 0;
    for (int64_t r = 0; r < c->P; r++) {
        json_t *e = json_array_get(res, (size_t)r);
        c->acc[r] = ps_fig_num(e, "accuracy");
        c->lo[r] = ps_fig_num(e, "wilson_lo");
        c->hi[r] = ps_fig_num(e, "wilson_hi");
        if (json_integer_value(json_object_get(e, "n")) > 0 && c->acc[r] < min) {
            min = c->acc[r];
            c->argmin = r;
        }
        if (json_integer_value(json_object_get(e, "n")) > 0) max = fmax(max, c->acc[r]);
    }
    c->flat = !(max - min > 1e-12);
    c->mean = ps_fig_num(cj, "mean_accuracy");
    json_t *dp = json_object_get(cj, "dominant_period"), *cs = json_object_get(cj, "chi_square");
    snprintf(c->stats, sizeof c->stats, "mean %.3f, min %.3f, gap %.1f pp", c->mean, ps_fig_num(cj, "min_accuracy"), ps_fig_num(cj, "gap_pp"));
    double p = json_is_number(json_object_get(cs, "p_value")) ? ps_fig_num(cs, "p_value") : NAN;
    json_t *rp = json_object_get(json_object_get(cj, "repeat_period"), "period");
    if (json_is_integer(rp) && has_period(cj)) { /* the folding period when the file has one (docs/results-schema.md) */
        char pb[32];
        ps_format_p(pb, sizeof pb, p);
        snprintf(c->stats2, sizeof c->stats2, "repeats every %lld, χ² p %s%s", (long long)json_integer_value(rp),
                 pb[0] == '<' ? "" : "= ", pb);
    } else
        ps_period_text(c->stats2, sizeof c->stats2, has_period(cj), ps_fig_num(dp, "period"), p);
    return 0;
}

void ps_period_text(char *buf, size_t n, int has, double period, double p) {
    char pb[32];
    ps_format_p(pb, sizeof pb, p);
    const char *eq = pb[0] == '<' ? "" : "= ";
    if (has) snprintf(buf, n, "period %.3g, χ² p %s%s", period, eq, pb);
    else snprintf(buf, n, "no period, χ² p %s%s", eq, pb);
}

static void draw_curves(cairo_t *cr, void *vctx) {
    curves_ctx *x = vctx;
    ps_rect a = ps_curve_area();
    double L = a.x, T = a.y, pw = a.w, ph = a.h;
    int64_t P = x->c[0].P;
    ps_text(cr, 20, 22, x->title, ps_fig_fit(cr, x->title, 17, CURVE_W - 40, 1), 0, 0.5, 0, 1);
    ps_text(cr, 20, 46, x->headline, ps_fig_fit(cr, x->headline, 14, CURVE_W - 40, 1), 0, 0.5, 0, 1);
    ps_text(cr, 20, 68, x->subtitle, ps_fig_fit(cr, x->subtitle, 12, CURVE_W - 40, 0), 0, 0.5, 0, 0);
    /* grid */
    cairo_set_line_width(cr, 1);
    for (int i = 0; i <= 5; i++) {
        double yv = i / 5.0, y = round(ps_curve_y(yv)) + 0.5;
        cairo_set_source_rgb(cr, 0.88, 0.88, 0.88);
        ps_fig_line(cr, L, y, L + pw, y);
        cairo_set_source_rgb(cr, 0, 0, 0);
        ps_fig_line(cr, L - 5, y, L, y);
        char buf[16];
        snprintf(buf, sizeof buf, "%.1f", yv);
        ps_text(cr, L - 8, y, buf, 12, 1, 0.5, 0, 0);
    }
    double dx = pw / (double)P;
    int step = ps_tick_step(dx, ps_text_width(cr, "0000", 12, 0) + 6);
    for (int64_t r = 0; r < P; r += step) {
        double xx = ps_curve_x(P, r);
        cairo_set_source_rgb(cr, 0, 0, 0);
        ps_fig_line(cr, round(xx) + 0.5, T + ph, round(xx) + 0.5, T + ph + 5);
        char buf[32];
        snprintf(buf, sizeof buf, "%lld", (long long)r);
        ps_text(cr, xx, T + ph + 9, buf, 12, 0.5, 0, 0, 0);
    }
    /* frame first, curves on top of it */
    cairo_set_source_rgb(cr, 0, 0, 0);
    cairo_rectangle(cr, L + 0.5, T + 0.5, pw, ph);
    cairo_stroke(cr);
    ps_text(cr, L + pw / 2, T + ph + 32, x->xlabel, 13, 0.5, 0, 0, 0);
    ps_text(cr, L - 52, T + ph / 2, "accuracy (top-1), 95% Wilson interval", 13, 0.5, 0.5, -M_PI / 2, 0);
    static const double dots[2] = {1.5, 3};
    if (!isnan(x->chance)) {
        cairo_set_source_rgb(cr, 0.35, 0.35, 0.35);
        cairo_set_line_width(cr, 1.5);
        cairo_set_dash(cr, dots, 2, 0);
        ps_fig_line(cr, L, ps_curve_y(x->chance), L + pw, ps_curve_y(x->chance));
        cairo_set_dash(cr, NULL, 0, 0);
    }
    for (int i = 0; i < x->n; i++) {
        curve *c = &x->c[i];
        ps_rgb col = ps_okabe_ito(i);
        double off = x->n > 1 ? (i - (x->n - 1) / 2.0) * fmin(4, dx / (x->n + 2)) : 0;
        ps_set_rgb(cr, col);
        cairo_set_line_width(cr, 1.2);
        for (int64_t r = 0; r < c->P; r++) { /* error bars */
            double xx = ps_curve_x(P, r) + off;
            ps_fig_line(cr, xx, ps_curve_y(c->lo[r]), xx, ps_curve_y(c->hi[r]));
            ps_fig_line(cr, xx - 3, ps_curve_y(c->lo[r]), xx + 3, ps_curve_y(c->lo[r]));
            ps_fig_line(cr, xx - 3, ps_curve_y(c->hi[r]), xx + 3, ps_curve_y(c->hi[r]));
        }
        double dash_i[2] = {7, 3};
        if (i % 2) cairo_set_dash(cr, dash_i, 2, 0); /* alternate curves dashed: colour is not the only cue */
        cairo_set_line_width(cr, 2);
        for (int64_t r = 0; r < c->P; r++) {
            double xx = ps_curve_x(P, r) + off, yy = ps_curve_y(c->acc[r]);
            if (r == 0) cairo_move_to(cr, xx, yy);
            else cairo_line_to(cr, xx, yy);
        }
        cairo_stroke(cr);
        cairo_set_dash(cr, NULL, 0, 0);
        for (int64_t r = 0; r < c->P; r++) {
            double xx = ps_curve_x(P, r) + off, yy = ps_curve_y(c->acc[r]);
            if (i % 2) cairo_rectangle(cr, xx - 3.2, yy - 3.2, 6.4, 6.4);
            else cairo_arc(cr, xx, yy, 3.4, 0, 2 * M_PI);
            cairo_fill(cr);
        }
        /* mean: dashed line; min: open ring */
        double dash[2] = {6, 4};
        cairo_set_dash(cr, dash, 2, 0);
        cairo_set_line_width(cr, 1.3);
        ps_fig_line(cr, L, ps_curve_y(c->mean), L + pw, ps_curve_y(c->mean));
        cairo_set_dash(cr, NULL, 0, 0);
        if (!c->flat) {
            double mx = ps_curve_x(P, c->argmin) + off, my = ps_curve_y(c->acc[c->argmin]);
            cairo_set_line_width(cr, 2);
            cairo_arc(cr, mx, my, 8, 0, 2 * M_PI);
            cairo_stroke(cr);
        }
        /* legend */
        double lx = L + pw + 20, ly = T + 8 + i * 74, tw = CURVE_W - (lx + 32) - 10;
        ps_set_rgb(cr, col);
        cairo_set_line_width(cr, 2);
        if (i % 2) cairo_set_dash(cr, dash_i, 2, 0);
        ps_fig_line(cr, lx, ly + 6, lx + 24, ly + 6);
        cairo_set_dash(cr, NULL, 0, 0);
        if (i % 2) cairo_rectangle(cr, lx + 12 - 3.2, ly + 6 - 3.2, 6.4, 6.4);
        else cairo_arc(cr, lx + 12, ly + 6, 3.4, 0, 2 * M_PI);
        cairo_fill(cr);
        cairo_set_source_rgb(cr, 0, 0, 0);
        double lsz = ps_fig_fit(cr, c->label, 13, tw, 1);
        char lab[sizeof c->label + 4];
        ps_fig_ellipsize(cr, c->label, lsz, tw, 1, lab, sizeof lab);
        ps_text(cr, lx + 32, ly + 6, lab, lsz, 0, 0.5, 0, 1);
        ps_text(cr, lx + 32, ly + 25, c->stats, ps_fig_fit(cr, c->stats, 12, tw, 0), 0, 0.5, 0, 0);
        ps_text(cr, lx + 32, ly + 42, c->stats2, ps_fig_fit(cr, c->stats2, 12, tw, 0), 0, 0.5, 0, 0);
    }
    double lx = L + pw + 20, ky = T + 8 + x->n * 74 + 6;
    cairo_set_source_rgb(cr, 0.2, 0.2, 0.2);
    double dash[2] = {6, 4};
    cairo_set_dash(cr, dash, 2, 0);
    cairo_set_line_width(cr, 1.3);
    ps_fig_line(cr, lx, ky, lx + 24, ky);
    cairo_set_dash(cr, NULL, 0, 0);
    ps_text(cr, lx + 32, ky, "mean accuracy (curve's colour)", 12, 0, 0.5, 0, 0);
    cairo_set_line_width(cr, 2);
    cairo_arc(cr, lx + 12, ky + 22, 7, 0, 2 * M_PI);
    cairo_stroke(cr);
    ps_text(cr, lx + 32, ky + 22, "worst residue (min)", 12, 0, 0.5, 0, 0);
    if (!isnan(x->chance)) {
        char buf[64];
        snprintf(buf, sizeof buf, "chance accuracy (%.3g)", x->chance);
        cairo_set_source_rgb(cr, 0.35, 0.35, 0.35);
        cairo_set_line_width(cr, 1.5);
        cairo_set_dash(cr, dots, 2, 0);
        ps_fig_line(cr, lx, ky + 44, lx + 24, ky + 44);
        cairo_set_dash(cr, NULL, 0, 0);
        cairo_set_source_rgb(cr, 0, 0, 0);
        ps_text(cr, lx + 32, ky + 44, buf, 12, 0, 0.5, 0, 0);
    }
}


/* The first of several keys present in o (fields named by the gate-cycling result, tolerant of spelling). */
static json_t *get_any(json_t *o, const char *const *keys) {
    for (int i = 0; keys[i]; i++) {
        json_t *v = json_object_get(o, keys[i]);
        if (v && !json_is_null(v)) return v;
    }
    return NULL;
}

static int64_t wrap_signed(int64_t d, int64_t P) {
    if (P < 1) return d;
    d %= P;
    if (d < 0) d += P;
    if (d > P / 2) d -= P;
    return d;
}

/* Residues where a curve dips (accuracy < 0.5 with prompts), as "ρ 1, ρ 7"; returns the count. */
static int dips_text(char *buf, size_t n, json_t *cj) {
    json_t *res = json_object_get(cj, "residues");
    size_t o = 0, cnt = 0;
    buf[0] = '\0';
    for (size_t r = 0; r < json_array_size(res) && o < n; r++) {
        json_t *e = json_array_get(res, r);
        if (json_integer_value(json_object_get(e, "n")) > 0 && ps_fig_num(e, "accuracy") < 0.5) {
            int w = snprintf(buf + o, n - o, "%sρ %zu", cnt ? ", " : "", r);
            if (w < 0) break;
            o += (size_t)w;
            cnt++;
        }
    }
    return (int)cnt;
}

/* The gate-cycling headline: what was cycled (k, layer, heads, branch, params) and what the dips did.
 * Reads the cycled heads from cycle.heads / cycled_heads and each dip's movement from dips / dip_moves
 * (objects with from/to or before/after residues, and optionally moved_by) when the result has them;
 * otherwise it states where the curves dip before and after. */
static void gatecycle_text(json_t *doc, int64_t P, char *title, size_t tn, char *headline, size_t hn, char *sub, size_t sn,
                           char *after_label, size_t an) {
    json_t *cy = json_object_get(doc, "cycle"), *prov = json_object_get(doc, "provenance");
    char name[400];
    ps_fig_model_name(name, sizeof name, prov);
    long long k = (long long)json_integer_value(json_object_get(cy, "shift"));
    long long layer = (long long)json_integer_value(json_object_get(cy, "layer"));
    static const char *const hk[] = {"heads", "cycled_heads", NULL};
    json_t *heads = get_any(cy, hk);
    if (!heads) heads = get_any(doc, hk);
    char hs[512];
    long long nkv = (long long)json_integer_value(json_object_get(json_object_get(prov, "config"), "n_kv_heads"));
    if (json_is_array(heads) && json_array_size(heads) > 0) {
        size_t nh = json_array_size(heads);
        int64_t *v = calloc(nh, sizeof(int64_t));
        if (v) {
            for (size_t i = 0; i < nh; i++) v[i] = (int64_t)json_integer_value(json_array_get(heads, i));
            for (size_t i = 1; i < nh; i++) /* insertion sort: a handful of heads */
                for (size_t j = i; j > 0 && v[j - 1] > v[j]; j--) {
                    int64_t t = v[j];
                    v[j] = v[j - 1];
                    v[j - 1] = t;
                }
            char rg[400];
            fmt_ranges(rg, sizeof rg, v, (int)(nh < 4096 ? nh : 4096));
            snprintf(hs, sizeof hs, "%s %s", nh == 1 ? "head" : "heads", rg);
            free(v);
        } else
            snprintf(hs, sizeof hs, "%zu heads", nh);
    } else {
        json_t *h1 = json_object_get(cy, "head");
        if (json_is_integer(h1)) snprintf(hs, sizeof hs, "head %lld", (long long)json_integer_value(h1));
        else if (nkv > 0) snprintf(hs, sizeof hs, "all %lld KV heads (0–%lld)", nkv, nkv - 1);
        else snprintf(hs, sizeof hs, "all KV heads");
    }
    const char *br = json_string_value(json_object_get(cy, "branch")), *pa = json_string_value(json_object_get(cy, "params"));
    const char *what = pa && !strcmp(pa, "gate") ? "gates" : pa && !strcmp(pa, "payload") ? "payloads" : "gates and payloads";
    const char *bw = br && !strcmp(br, "key") ? "key " : br && !strcmp(br, "value") ? "value " : "";
    ps_model_desc md;
    ps_error de;
    int have = !ps_model_desc_from_provenance(prov, &md, &de);
    if (have && md.slot_bias) /* V4's compressor: its position bias is the per-slot parameter */
        snprintf(title, tn, "Gate cycling — %s: layer %lld; %sposition bias (ape) rolled by k = %+lld", name, layer,
                 br && !strcmp(br, "indexer") ? "the indexer's " : br && !strcmp(br, "both") && md.indexer ? "compressor and indexer " : "", k);
    else
        snprintf(title, tn, "Gate cycling — %s: layer %lld, %s; %s%s rolled by k = %+lld", name, layer, hs, bw, what, k);
    static const char *const dk[] = {"dips", "dip_moves", "dip_movement", "dip_shifts", NULL};
    static const char *const fk[] = {"from", "before", "rho_before", "from_rho", NULL};
    static const char *const tk[] = {"to", "after", "rho_after", "to_rho", NULL};
    static const char *const mk[] = {"moved_by", "movement", "shift", "delta", NULL};
    json_t *dips = get_any(doc, dk);
    if (!dips) dips = get_any(cy, dk);
    size_t o = 0;
    headline[0] = '\0';
    if (json_is_array(dips) && json_array_size(dips) > 0) {
        json_t *after = json_object_get(json_object_get(doc, "after"), "residues");
        o += (size_t)snprintf(headline, hn, "Measured: ");
        for (size_t i = 0; i < json_array_size(dips) && o < hn; i++) {
            json_t *d = json_array_get(dips, i), *f = get_any(d, fk), *t = get_any(d, tk), *m = get_any(d, mk);
            if (!json_is_integer(f)) continue;
            long long fr = (long long)json_integer_value(f);
            json_t *still = json_object_get(d, "still_dips_after");
            int stays = json_is_boolean(still) ? json_is_true(still) : 0;
            char tail[128] = "";
            if (stays) {
                double acc = ps_fig_num(json_array_get(after, (size_t)fr), "accuracy");
                snprintf(tail, sizeof tail, ", ρ %lld still dips after (%.2f)", fr, acc);
            }
            int w;
            if (json_is_integer(t) && json_integer_value(t) >= 0) {
                long long mv = json_is_integer(m) ? (long long)json_integer_value(m)
                                                  : (long long)wrap_signed(json_integer_value(t) - json_integer_value(f), P);
                w = snprintf(headline + o, hn - o, "%sdip at ρ %lld moved to ρ %lld (%+lld)%s", i ? "; " : "", fr,
                             (long long)json_integer_value(t), mv, tail);
            } else
                w = snprintf(headline + o, hn - o, "%sdip at ρ %lld: no new dip took its place%s", i ? "; " : "", fr,
                             stays ? " (it still dips)" : " (it is gone)");
            if (w < 0) break;
            o += (size_t)w;
        }
        json_t *nd = json_object_get(doc, "new_dips");
        for (size_t i = 0; i < json_array_size(nd) && o > 10 && o < hn; i++) {
            int w = snprintf(headline + o, hn - o, "%s ρ %lld", i ? "," : "; new dip at", (long long)json_integer_value(json_array_get(nd, i)));
            if (w < 0) break;
            o += (size_t)w;
        }
        if (o <= 10) o = 0; /* no usable entries: fall back to the curves */
    }
    if (!o || o >= hn) {
        char b[256], a[256];
        int nb = dips_text(b, sizeof b, json_object_get(doc, "before")), na = dips_text(a, sizeof a, json_object_get(doc, "after"));
        snprintf(headline, hn, "Measured dips (accuracy < 0.5): before cycling at %s; after at %s", nb ? b : "none", na ? a : "none");
    }
    size_t so = (size_t)snprintf(sub, sn, "best-aligning shift of the whole curves (highest correlation): %+lld, correlation %.2f",
                                 (long long)json_integer_value(json_object_get(doc, "best_shift_signed")),
                                 ps_fig_num(doc, "best_shift_correlation"));
    json_t *ex = json_object_get(doc, "excluded_residues");
    for (size_t i = 0; i < json_array_size(ex) && so < sn; i++) {
        int w = snprintf(sub + so, sn - so, "%s %lld", i ? "," : " (residues near chance in both curves left out: ρ",
                         (long long)json_integer_value(json_array_get(ex, i)));
        if (w < 0) break;
        so += (size_t)w;
        if (i + 1 == json_array_size(ex) && so < sn) so += (size_t)snprintf(sub + so, sn - so, ")");
    }
    json_t *wn = json_object_get(doc, "warnings");
    for (size_t i = 0; i < json_array_size(wn) && so < sn; i++) {
        const char *ws = json_string_value(json_array_get(wn, i));
        if (!ws) continue;
        int w = snprintf(sub + so, sn - so, "; warning: %s", ws);
        if (w < 0) break;
        so += (size_t)w;
    }
    snprintf(after_label, an, "after cycling (k = %+lld)", k);
}

int ps_render_curves(json_t *const *docs, const char *const *paths, int n, const char *out, const ps_render_opts *o,
                     int verbose, ps_error *err) {
    const char *kind = json_string_value(json_object_get(docs[0], "kind"));
    int gc = !strcmp(kind, "gatecycle");
    if (gc && n > 1) return ps_fail(err, "render: gate-cycling results are drawn one at a time");
    curves_ctx x = {0};
    x.chance = gc && json_is_number(json_object_get(docs[0], "chance")) ? ps_fig_num(docs[0], "chance") : NAN;
    x.c = calloc((size_t)(gc ? 2 : n), sizeof *x.c);
    if (!x.c) return ps_fail(err, "%s: out of memory", paths[0]);
    int rc = 0;
    int64_t P = -1;
    /* several sweeps that differ in how they were run (mode, filler, prompts): each curve's label says its own,
     * and the headline names only what they share */
    int diff_mode = 0, diff_fam = 0, diff_n = 0;
    json_t *ev0 = json_object_get(json_object_get(docs[0], "provenance"), "eval");
    const char *mode0 = json_string_value(json_object_get(ev0, "mode")) ?: "pad", *fam0 = json_string_value(json_object_get(ev0, "family")) ?: "";
    json_int_t n0 = json_integer_value(json_object_get(ev0, "n_prompts"));
    for (int i = 1; i < n && !gc; i++) {
        json_t *ev = json_object_get(json_object_get(docs[i], "provenance"), "eval");
        diff_mode |= strcmp(json_string_value(json_object_get(ev, "mode")) ?: "pad", mode0) != 0;
        diff_fam |= strcmp(json_string_value(json_object_get(ev, "family")) ?: "", fam0) != 0;
        diff_n |= json_integer_value(json_object_get(ev, "n_prompts")) != n0;
    }
    for (int i = 0; i < n && !rc; i++) {
        json_t *prov = json_object_get(docs[i], "provenance");
        char name[400];
        ps_fig_model_name(name, sizeof name, prov);
        char run[160] = ""; /* what differs from the other sweeps, in front of the curve's statistics */
        if (!gc && (diff_mode || diff_fam || diff_n)) {
            json_t *ev = json_object_get(prov, "eval");
            size_t w = 0;
            if (diff_mode)
                w += (size_t)snprintf(run + w, sizeof run - w, "%s mode", json_string_value(json_object_get(ev, "mode")) ?: "pad");
            if (diff_fam && w < sizeof run)
                w += (size_t)snprintf(run + w, sizeof run - w, "%s%s filler", w ? ", " : "", json_string_value(json_object_get(ev, "family")) ?: "");
            if (diff_n && w < sizeof run)
                snprintf(run + w, sizeof run - w, "%s%lld prompts", w ? ", " : "", (long long)json_integer_value(json_object_get(ev, "n_prompts")));
        }
        if (gc) {
            char lb[256];
            x.n++;
            rc = fill_curve(&x.c[0], json_object_get(docs[i], "before"), "before cycling", paths[i], "before", err);
            if (rc) break;
            gatecycle_text(docs[i], x.c[0].P, x.title, sizeof x.title, x.headline, sizeof x.headline, x.subtitle, sizeof x.subtitle,
                           lb, sizeof lb);
            x.n++;
            rc = fill_curve(&x.c[1], json_object_get(docs[i], "after"), lb, paths[i], "after", err);
            if (rc) break;
            if (x.c[1].P != x.c[0].P)
                rc = ps_fail(err, "%s: after.residues has %lld entries, before.residues %lld", paths[i], (long long)x.c[1].P,
                             (long long)x.c[0].P);
        } else {
            x.n++;
            rc = fill_curve(&x.c[i], json_object_get(docs[i], "curve"), name, paths[i], "curve", err);
            if (rc) break;
            if (run[0]) {
                char st[sizeof x.c[i].stats + sizeof run + 2];
                snprintf(st, sizeof st, "%s: %s", run, x.c[i].stats);
                snprintf(x.c[i].stats, sizeof x.c[i].stats, "%.*s", (int)(sizeof x.c[i].stats - 1), st);
            }
            json_t *ev = json_object_get(prov, "eval");
            if (n == 1) snprintf(x.title, sizeof x.title, "Phase sweep — %s", name);
            else snprintf(x.title, sizeof x.title, "Phase sweep — %d models", n);
            char hm[48] = "", hf[80] = "", hn[64] = "";
            if (!diff_mode) snprintf(hm, sizeof hm, "%s mode", json_string_value(json_object_get(ev, "mode")) ?: "pad");
            if (!diff_fam) snprintf(hf, sizeof hf, "%s%s filler", hm[0] ? ", " : "", json_string_value(json_object_get(ev, "family")) ?: "");
            if (!diff_n)
                snprintf(hn, sizeof hn, "%s%lld prompts per shift", hm[0] || hf[0] ? ", " : "",
                         (long long)json_integer_value(json_object_get(ev, "n_prompts")));
            if (hm[0] || hf[0] || hn[0])
                snprintf(x.headline, sizeof x.headline, "Accuracy per phase residue ρ (%s%s%s)", hm, hf, hn);
            else
                snprintf(x.headline, sizeof x.headline, "Accuracy per phase residue ρ (mode, filler and prompts: per curve)");
            snprintf(x.subtitle, sizeof x.subtitle,
                     "dots: accuracy at each residue with its 95%% Wilson interval; dashed: the mean; ring: the worst residue");
        }
        if (!rc && P >= 0 && x.c[x.n - 1].P != P)
            rc = ps_fail(err, "%s: period %lld differs from the first file's %lld; curves share one axis", paths[i],
                         (long long)x.c[x.n - 1].P, (long long)P);
        if (!rc) P = x.c[x.n - 1].P;
    }
    if (!rc) {
        snprintf(x.xlabel, sizeof x.xlabel, "phase residue ρ = t_K mod %lld", (long long)P);
        ps_fig_chunks ch;
        ps_fig_make_chunks(&ch, json_object_get(docs[0], "provenance"), x.title);
        ps_fig f;
        for (int k = 0; !rc && k < ps_fig_n_files(o); k++)
            if (!(rc = ps_fig_file_open(&f, out, gc ? "gatecycle_curve" : "phase_curve", CURVE_W, fmax(580, CURVE_T + 8 + x.n * 74 + 60), o, k, err))) {
                draw_curves(f.cr, &x);
                rc = ps_fig_file_close(&f, &ch, verbose, err);
            }
    }
    free_curves(&x);
    return rc;
}
