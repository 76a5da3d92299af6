/* kind_theory.c — result kind "theory": the idealised bigram-induction model (gates/theory.h) trained over
 * log-spaced steps. Its validation and its figure, theory.png. */
#include "viz/kinds.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gates/gates.h"  /* ps_effective_offsets */
#include "gates/theory.h" /* the idealised model's limits */
#include "viz/check_common.h"
#include "viz/fig_common.h"

/* ---- validation ---- */

/* params: heads (*ph), window (*pw), chunks, steps, batch and the two switches */
static int ck_theory_params(ps_ck *c, json_t *doc, int64_t *ph, int64_t *pw) {
    json_t *pr, *v;
    if (ps_ck_get_obj(c, doc, "params", &pr)) return -1;
    size_t old = ps_ck_key(c, "params");
    if (ps_ck_get_int(c, pr, "heads", 1, PS_THEORY_MAX_HEADS, ph) || ps_ck_get_int(c, pr, "window", PS_THEORY_MIN_WINDOW, PS_THEORY_MAX_WINDOW, pw) ||
        ps_ck_get_int(c, pr, "chunks", 1, PS_THEORY_MAX_CHUNKS, NULL) || ps_ck_get_int(c, pr, "steps", 1, PS_THEORY_MAX_STEPS, NULL) ||
        ps_ck_get_int(c, pr, "batch", 0, PS_THEORY_MAX_BATCH, NULL))
        return -1;
    for (int i = 0; i < 2; i++) {
        const char *bk = i ? "within_chunk" : "learn_temperature";
        size_t o = ps_ck_key(c, bk);
        v = json_object_get(pr, bk);
        if (ps_ck_want_type(c, v, json_is_boolean(v), "true or false")) return -1;
        ps_ck_pop(c, o);
    }
    ps_ck_pop(c, old);
    return 0;
}

/* the records over time (*n of them): steps increasing, loss, accuracy and the two scales in range */
static int ck_theory_records(ps_ck *c, json_t *doc, int64_t *np) {
    json_t *st, *loss, *acc, *sc[2];
    int64_t n;
    if (ps_ck_get_arr(c, doc, "steps", 1, 100000, &st, &n) || ps_ck_get_arr(c, doc, "loss", n, n, &loss, NULL) ||
        ps_ck_get_arr(c, doc, "accuracy", n, n, &acc, NULL) || ps_ck_get_arr(c, doc, "score_scale", n, n, &sc[0], NULL) ||
        ps_ck_get_arr(c, doc, "logit_scale", n, n, &sc[1], NULL))
        return -1;
    int64_t prev = -1, s;
    for (int64_t k = 0; k < n; k++) {
        size_t o = ps_ck_key(c, "steps");
        ps_ck_idx(c, (size_t)k);
        if (ps_ck_int_value(c, json_array_get(st, (size_t)k), 0, INT64_MAX, &s)) return -1;
        if (s <= prev) return ps_ck_bad(c, "%lld after step %lld (steps increase)", (long long)s, (long long)prev);
        prev = s;
        ps_ck_pop(c, o);
        ps_ck_key(c, "loss");
        ps_ck_idx(c, (size_t)k);
        if (ps_ck_num_value(c, json_array_get(loss, (size_t)k), 0, INFINITY, NULL)) return -1;
        ps_ck_pop(c, o);
        ps_ck_key(c, "accuracy");
        ps_ck_idx(c, (size_t)k);
        if (ps_ck_num_value(c, json_array_get(acc, (size_t)k), -TOL, 1 + TOL, NULL)) return -1;
        ps_ck_pop(c, o);
        for (int i = 0; i < 2; i++) {
            ps_ck_key(c, i ? "logit_scale" : "score_scale");
            ps_ck_idx(c, (size_t)k);
            if (ps_ck_num_value(c, json_array_get(sc[i], (size_t)k), 1e-300, INFINITY, NULL)) return -1;
            ps_ck_pop(c, o);
        }
    }
    *np = n;
    return 0;
}

int ps_check_theory(ps_ck *c, json_t *doc) {
    ps_prov_info pi;
    json_t *heads;
    int64_t n = 0, H, W = -1, ph, pw;
    if (ps_ck_provenance(c, doc, 0, NULL, &pi) || ck_theory_params(c, doc, &ph, &pw) || ck_theory_records(c, doc, &n)) return -1;
    if (ps_ck_get_arr(c, doc, "heads", ph, ph, &heads, &H)) return -1;
    int64_t aligned = 0, wa, onehot = 0, cover[PS_THEORY_MAX_WINDOW] = {0};
    double tol = 1e-3 * (double)pw;
    size_t o2 = ps_ck_key(c, "heads");
    for (int64_t h = 0; h < H; h++) {
        json_t *ho = json_array_get(heads, (size_t)h);
        size_t o3 = ps_ck_idx(c, (size_t)h);
        int64_t hi, kp, vp;
        if (ps_ck_want_type(c, ho, json_is_object(ho), "an object") || ps_ck_get_int(c, ho, "head", 0, PS_THEORY_MAX_HEADS - 1, &hi)) return -1;
        if (hi != h) {
            ps_ck_key(c, "head");
            return ps_ck_bad(c, "%lld, expected %lld (heads 0..H-1 in order)", (long long)hi, (long long)h);
        }
        for (int b = 0; b < 2; b++) {
            json_t *gs;
            const char *gn = b ? "value_gate" : "key_gate";
            if (ps_ck_get_arr(c, ho, gn, n, n, &gs, NULL)) return -1;
            size_t o4 = ps_ck_key(c, gn);
            for (int64_t k = 0; k < n; k++) {
                json_t *gk = json_array_get(gs, (size_t)k);
                size_t o5 = ps_ck_idx(c, (size_t)k);
                if (ps_ck_want_type(c, gk, json_is_array(gk), "an array")) return -1;
                if ((int64_t)json_array_size(gk) != pw)
                    return ps_ck_bad(c, "%zu entries, expected params.window = %lld", json_array_size(gk), (long long)pw);
                W = pw;
                for (int64_t i = 0; i < W; i++) {
                    size_t o6 = ps_ck_idx(c, (size_t)i);
                    if (ps_ck_num_value(c, json_array_get(gk, (size_t)i), -TOL, 1 + TOL, NULL)) return -1;
                    ps_ck_pop(c, o6);
                }
                ps_ck_pop(c, o5);
            }
            ps_ck_pop(c, o4);
            const char *nn = b ? "N_value_over_time" : "N_key_over_time";
            if (ps_ck_get_arr(c, ho, nn, n, n, &gs, NULL)) return -1;
            o4 = ps_ck_key(c, nn);
            for (int64_t k = 0; k < n; k++) {
                size_t o5 = ps_ck_idx(c, (size_t)k);
                if (ps_ck_num_value(c, json_array_get(gs, (size_t)k), 1 - tol, (double)pw + tol, NULL)) return -1;
                ps_ck_pop(c, o5);
            }
            ps_ck_pop(c, o4);
        }
        double nk, nv;
        if (ps_ck_get_int(c, ho, "key_peak", 0, pw - 1, &kp) || ps_ck_get_int(c, ho, "value_peak", 0, pw - 1, &vp)) return -1;
        if (ps_ck_get_num(c, ho, "N_key", 1 - tol, (double)pw + tol, &nk) || ps_ck_get_num(c, ho, "N_value", 1 - tol, (double)pw + tol, &nv))
            return -1;
        for (int b = 0; b < 2; b++) { /* the final N is the last record's */
            double last = json_number_value(json_array_get(json_object_get(ho, b ? "N_value_over_time" : "N_key_over_time"), (size_t)n - 1));
            if (fabs(last - (b ? nv : nk)) > 1e-6 * (double)pw) {
                ps_ck_key(c, b ? "N_value" : "N_key");
                return ps_ck_bad(c, "%.10g, but the last record of %s is %.10g", b ? nv : nk, b ? "N_value_over_time" : "N_key_over_time", last);
            }
        }
        aligned += vp == kp + 1;
        if (vp == kp + 1 && kp < PS_THEORY_MAX_WINDOW) cover[kp]++;
        onehot += nk <= PS_THEORY_ONE_HOT_N && nv <= PS_THEORY_ONE_HOT_N;
        ps_ck_pop(c, o3);
    }
    ps_ck_pop(c, o2);
    if (ps_ck_get_int(c, doc, "heads_with_value_peak_after_key_peak", 0, H, &wa)) return -1;
    if (wa != aligned) {
        ps_ck_key(c, "heads_with_value_peak_after_key_peak");
        return ps_ck_bad(c, "%lld, but %lld heads have value_peak = key_peak + 1", (long long)wa, (long long)aligned);
    }
    for (int64_t h = 0; h < H; h++) { /* each head's flag agrees with its peaks */
        json_t *ho = json_array_get(heads, (size_t)h), *f = json_object_get(ho, "value_peak_is_key_peak_plus_1");
        size_t o3 = ps_ck_key(c, "heads");
        ps_ck_idx(c, (size_t)h);
        ps_ck_key(c, "value_peak_is_key_peak_plus_1");
        if (ps_ck_want_type(c, f, json_is_boolean(f), "true or false")) return -1;
        int al = json_integer_value(json_object_get(ho, "value_peak")) == json_integer_value(json_object_get(ho, "key_peak")) + 1;
        if (json_is_true(f) != al) return ps_ck_bad(c, "%s, but value_peak %s key_peak + 1", al ? "false" : "true", al ? "=" : "!=");
        ps_ck_pop(c, o3);
    }
    int64_t oh, cp, nc, ns;
    json_t *cov, *shared;
    if (ps_ck_get_int(c, doc, "heads_one_hot", 0, H, &oh)) return -1;
    if (oh != onehot) {
        ps_ck_key(c, "heads_one_hot");
        return ps_ck_bad(c, "%lld, but %lld heads have N_key and N_value <= %g", (long long)oh, (long long)onehot, PS_THEORY_ONE_HOT_N);
    }
    if (ps_ck_get_num(c, doc, "max_final_N", 1 - tol, (double)pw + tol, NULL) || ps_ck_get_int(c, doc, "coverable_phases", pw - 1, pw - 1, &cp) ||
        ps_ck_get_arr(c, doc, "covered_phases", 0, pw - 1, &cov, &nc) || ps_ck_get_arr(c, doc, "phases_covered_twice_or_more", 0, pw - 1, &shared, &ns))
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
        size_t o = ps_ck_key(c, an);
        for (int64_t k = 0, prevk = -1; k < m; k++) {
            int64_t ph_k;
            size_t o5 = ps_ck_idx(c, (size_t)k);
            if (ps_ck_int_value(c, json_array_get(arr, (size_t)k), 0, pw - 2, &ph_k)) return -1;
            if (ph_k <= prevk) return ps_ck_bad(c, "%lld after %lld (phases increase)", (long long)ph_k, (long long)prevk);
            prevk = ph_k;
            if (cover[ph_k] < (b ? 2 : 1))
                return ps_ck_bad(c, "%lld, but %s heads have key_peak %lld and value_peak %lld", (long long)ph_k, b ? "fewer than two" : "no",
                           (long long)ph_k, (long long)ph_k + 1);
            ps_ck_pop(c, o5);
        }
        if (m != exp_m) return ps_ck_bad(c, "%lld entries, but %lld phases qualify", (long long)m, (long long)exp_m);
        ps_ck_pop(c, o);
    }
    return 0;
}

/* ---- figure ---- */

/* The idealised model: loss, accuracy and the two temperatures over log-spaced steps (log step axis);
 * each head's effective offsets N_eff = exp(H(gate)) of its key and value gate over the same axis, one
 * colour per head; and the final gates, head × offset, with each head's key peak r and value peak. */
typedef struct {
    int n, H, W;
    double *lx, *loss, *acc, *lam, *mu; /* lx = log10(step + 1) */
    double *mg;                         /* [n][H][2][W] */
    double *ne, *nl;                    /* [n][H][2]: N_eff, log10(N_eff − 1) clipped at nlo */
    double nlo, nhi;                    /* log10 range of N_eff − 1 drawn */
    double fig_w, lxmax;
    int learn;
    char title[1024], subtitle[1024], verdict[1024];
} theory_ctx;

#define TH_TOP 84.0
#define TH_ROW1_H 180.0
#define TH_ROW2 (TH_TOP + TH_ROW1_H + 92.0)
#define TH_ROW2_H 250.0
#define TH_ROW3 (TH_ROW2 + TH_ROW2_H + 110.0)

static void free_theory(theory_ctx *x) {
    free(x->lx);
    free(x->loss);
    free(x->acc);
    free(x->lam);
    free(x->mu);
    free(x->mg);
    free(x->ne);
    free(x->nl);
}

/* Per-head line: seven Okabe-Ito colours (yellow left out: too pale on white), then the same with dashes. */
static void theory_head_style(cairo_t *cr, int h, double width) {
    static const double dashes[3][2] = {{1, 0}, {7, 3}, {2, 2.5}};
    static const int col[7] = {0, 1, 2, 3, 4, 5, 7};
    int d = (h / 7) % 3;
    ps_set_rgb(cr, ps_okabe_ito(col[h % 7]));
    cairo_set_line_width(cr, width);
    cairo_set_dash(cr, dashes[d], d ? 2 : 0, 0);
}

/* A plot frame with y ticks (ps_nice_ticks) and a log10 step axis: decades 1, 10, 100, 1e3 … at x = 0 .. lxmax. */
static void theory_axes(cairo_t *cr, double x, double y, double w, double h, double lxmax, double y0, double y1, const char *yl,
                        int logy) {
    double t[32];
    int n = 0;
    if (logy) /* y0, y1 in log10 units: a tick at every decade (every second one past 8) */
        for (int e = (int)ceil(y0 - 1e-9), st = y1 - y0 > 8 ? 2 : 1; e <= y1 + 1e-9 && n < 32; e += st) t[n++] = e;
    else
        n = ps_nice_ticks(y0, y1, 5, t, 32);
    cairo_set_line_width(cr, 1);
    cairo_set_dash(cr, NULL, 0, 0);
    char buf[32];
    for (int i = 0; i < n; i++) {
        if (t[i] > y1 || t[i] < y0) continue;
        double yy = round(y + h * (1 - (t[i] - y0) / (y1 - y0))) + 0.5;
        cairo_set_source_rgb(cr, 0.88, 0.88, 0.88);
        ps_fig_line(cr, x, yy, x + w, yy);
        cairo_set_source_rgb(cr, 0, 0, 0);
        ps_fig_line(cr, x - 4, yy, x, yy);
        if (logy && (t[i] < -2 || t[i] > 2)) snprintf(buf, sizeof buf, "1e%d", (int)t[i]);
        else ps_fmt_num(buf, sizeof buf, logy ? pow(10, t[i]) : t[i]);
        ps_text(cr, x - 6, yy, buf, 11, 1, 0.5, 0, 0);
    }
    for (int d = 0; d <= (int)floor(lxmax + 1e-9); d++) {
        double xx = round(x + w * d / lxmax) + 0.5;
        cairo_set_source_rgb(cr, 0.88, 0.88, 0.88);
        if (d > 0) ps_fig_line(cr, xx, y, xx, y + h);
        cairo_set_source_rgb(cr, 0, 0, 0);
        ps_fig_line(cr, xx, y + h, xx, y + h + 4);
        if (d < 3) snprintf(buf, sizeof buf, "%d", d == 0 ? 1 : d == 1 ? 10 : 100);
        else snprintf(buf, sizeof buf, "1e%d", d);
        ps_text(cr, xx, y + h + 6, buf, 11, 0.5, 0, 0, 0);
        for (int m = 2; m < 10 && d + log10(m) < lxmax; m++) { /* minor ticks */
            double mx = round(x + w * (d + log10(m)) / lxmax) + 0.5;
            ps_fig_line(cr, mx, y + h, mx, y + h + 2);
        }
    }
    cairo_rectangle(cr, x + 0.5, y + 0.5, w, h);
    cairo_stroke(cr);
    ps_text(cr, x + w / 2, y + h + 24, "gradient step + 1 (log scale)", 12, 0.5, 0, 0, 0);
    if (yl) ps_text(cr, x - 44, y + h / 2, yl, 12, 0.5, 0.5, -M_PI / 2, 0);
}

static void draw_theory(cairo_t *cr, void *vctx) {
    theory_ctx *x = vctx;
    ps_text(cr, 20, 22, x->title, ps_fig_fit(cr, x->title, 17, x->fig_w - 40, 1), 0, 0.5, 0, 1);
    ps_text(cr, 20, 46, x->subtitle, ps_fig_fit(cr, x->subtitle, 12.5, x->fig_w - 40, 0), 0, 0.5, 0, 0);
    /* row 1: loss, accuracy, temperatures */
    double pw = (x->fig_w - 80 - 2 * 90) / 3, y = TH_TOP, h = TH_ROW1_H;
    double lmax = 0, tmax = 0;
    for (int k = 0; k < x->n; k++) {
        if (isfinite(x->loss[k])) lmax = fmax(lmax, x->loss[k]);
        tmax = fmax(tmax, fmax(x->lam[k], x->mu[k]));
    }
    lmax = lmax > 0 ? lmax * 1.06 : 1;
    tmax = tmax > 0 ? tmax * 1.08 : 1;
    double px[3] = {70, 70 + pw + 90, 70 + 2 * (pw + 90)};
    theory_axes(cr, px[0], y, pw, h, x->lxmax, -0.03 * lmax, lmax, "loss (nats)", 0);
    ps_set_rgb(cr, ps_okabe_ito(0));
    cairo_set_line_width(cr, 2);
    ps_fig_polyline(cr, x->lx, x->loss, 1, x->n, px[0], y, pw, h, 0, x->lxmax, -0.03 * lmax, lmax);
    cairo_set_source_rgb(cr, 0, 0, 0);
    theory_axes(cr, px[1], y, pw, h, x->lxmax, -0.03, 1.05, "accuracy (top-1)", 0);
    ps_set_rgb(cr, ps_okabe_ito(3));
    cairo_set_line_width(cr, 2);
    ps_fig_polyline(cr, x->lx, x->acc, 1, x->n, px[1], y, pw, h, 0, x->lxmax, -0.03, 1.05);
    cairo_set_source_rgb(cr, 0, 0, 0);
    theory_axes(cr, px[2], y, pw, h, x->lxmax, 0, tmax, x->learn ? "learned scale" : "scale (fixed)", 0);
    for (int b = 0; b < 2; b++) {
        ps_set_rgb(cr, ps_okabe_ito(b ? 2 : 5));
        cairo_set_line_width(cr, b ? 2 : 3.5);
        ps_fig_polyline(cr, x->lx, b ? x->mu : x->lam, 1, x->n, px[2], y, pw, h, 0, x->lxmax, 0, tmax);
        double ly = y + h - 40 + 18 * b;
        ps_fig_line(cr, px[2] + pw - 150, ly, px[2] + pw - 126, ly);
        cairo_set_source_rgb(cr, 0, 0, 0);
        ps_text(cr, px[2] + pw - 120, ly, b ? "μ (logit scale)" : "λ (score scale)", 11, 0, 0.5, 0, 0);
    }
    /* row 2: N_eff − 1 per head, key and value, log-log (a power law in time is a straight line) */
    double w2 = (x->fig_w - 70 - 80 - 330) / 2, y2 = TH_ROW2;
    ps_text(cr, 20, y2 - 48,
            "Effective offsets of every head over log time: N_eff − 1, N_eff = exp(H(gate)) (0 = one-hot, W − 1 = uniform), log scale", 15,
            0, 0.5, 0, 1);
    ps_text(cr, 20, y2 - 28, x->verdict, ps_fig_fit(cr, x->verdict, 12, x->fig_w - 40, 0), 0, 0.5, 0, 0);
    for (int b = 0; b < 2; b++) {
        double ax = 70 + b * (w2 + 80);
        theory_axes(cr, ax, y2, w2, TH_ROW2_H, x->lxmax, x->nlo, x->nhi, b ? "N_eff − 1, value gate" : "N_eff − 1, key gate", 1);
        for (int hd = 0; hd < x->H; hd++) {
            theory_head_style(cr, hd, 2.2);
            ps_fig_polyline(cr, x->lx, x->nl + (size_t)hd * 2 + (size_t)b, (ptrdiff_t)x->H * 2, x->n, ax, y2, w2, TH_ROW2_H, 0, x->lxmax, x->nlo,
                     x->nhi);
        }
        cairo_set_dash(cr, NULL, 0, 0);
        cairo_set_source_rgb(cr, 0, 0, 0);
    }
    /* legend: one line per head with its final peaks and N_eff */
    double lx = 70 + 2 * (w2 + 80) - 20, ly = y2 + 4;
    ps_text(cr, lx, ly, "head: key r → value peak; final N_key / N_value", ps_fig_fit(cr, "head: key r → value peak; final N_key / N_value", 11, x->fig_w - lx - 8, 1), 0, 0.5, 0, 1);
    int per = (int)fmin(x->H, floor((TH_ROW2_H + 60) / 17.0));
    for (int hd = 0; hd < x->H && hd < per; hd++) {
        const double *g = x->mg + ((size_t)(x->n - 1) * (size_t)x->H + (size_t)hd) * 2 * (size_t)x->W;
        int pk = 0, pv = 0;
        for (int i = 1; i < x->W; i++) {
            if (g[i] > g[pk]) pk = i;
            if (g[x->W + i] > g[x->W + pv]) pv = i;
        }
        const double *ne = x->ne + ((size_t)(x->n - 1) * (size_t)x->H + (size_t)hd) * 2;
        double yy = ly + 20 + 17 * hd;
        theory_head_style(cr, hd, 2.6);
        ps_fig_line(cr, lx, yy, lx + 26, yy);
        cairo_set_dash(cr, NULL, 0, 0);
        cairo_set_source_rgb(cr, 0, 0, 0);
        char buf[160];
        snprintf(buf, sizeof buf, "head %d: r = %d → %d%s   %.4f / %.4f", hd, pk, pv, pv == pk + 1 ? " ✓" : " ✗", ne[0], ne[1]);
        ps_text(cr, lx + 32, yy, buf, 11, 0, 0.5, 0, 0);
    }
    if (per < x->H) {
        char buf[64];
        snprintf(buf, sizeof buf, "(%d more heads in the gate maps below)", x->H - per);
        ps_text(cr, lx, ly + 20 + 17 * per, buf, 11, 0, 0.5, 0, 0);
    }
    /* row 3: final gates, head × offset */
    double y3 = TH_ROW3, hw = fmin(420, (x->fig_w - 300) / 2), hh = fmin(300, fmax(60, 22.0 * x->H));
    ps_text(cr, 20, y3 - 40, "Final gates (rows: heads, columns: offsets 0 .. W − 1; ○ key peak r, □ value peak)", 15, 0, 0.5, 0, 1);
    for (int b = 0; b < 2; b++) {
        double hx = 80 + b * (hw + 80);
        const double *g0 = x->mg + (size_t)(x->n - 1) * (size_t)x->H * 2 * (size_t)x->W + (size_t)b * (size_t)x->W;
        ps_heatmap_strided(cr, hx, y3, hw, hh, g0, x->H, x->W, 2 * (ptrdiff_t)x->W, 1, ps_viridis, 0, 1);
        cairo_set_source_rgb(cr, 0, 0, 0);
        ps_text(cr, hx + hw / 2, y3 - 14, b ? "value gate β" : "key gate α", 12, 0.5, 0.5, 0, 1);
        double cw = hw / x->W, ch = hh / x->H;
        char buf[32];
        int sx = ps_tick_step(cw, 18), sy = ps_tick_step(ch, 12);
        for (int i = 0; i < x->W; i += sx) {
            snprintf(buf, sizeof buf, "%d", i);
            ps_text(cr, hx + (i + 0.5) * cw, y3 + hh + 4, buf, 10, 0.5, 0, 0, 0);
        }
        ps_text(cr, hx + hw / 2, y3 + hh + 20, "offset", 11, 0.5, 0, 0, 0);
        for (int hd = 0; hd < x->H; hd += sy) {
            snprintf(buf, sizeof buf, "%d", hd);
            ps_text(cr, hx - 4, y3 + (hd + 0.5) * ch, buf, 10, 1, 0.5, 0, 0);
        }
        ps_text(cr, hx - 28, y3 + hh / 2, "head", 11, 0.5, 0.5, -M_PI / 2, 0);
        if (cw >= 8 && ch >= 8)
            for (int hd = 0; hd < x->H; hd++) {
                const double *g = x->mg + ((size_t)(x->n - 1) * (size_t)x->H + (size_t)hd) * 2 * (size_t)x->W;
                int pk = 0, pv = 0;
                for (int i = 1; i < x->W; i++) {
                    if (g[i] > g[pk]) pk = i;
                    if (g[x->W + i] > g[x->W + pv]) pv = i;
                }
                double r = fmin(cw, ch) * 0.3, cy = y3 + (hd + 0.5) * ch;
                cairo_set_line_width(cr, 1.5);
                cairo_set_source_rgb(cr, 1, 1, 1);
                cairo_arc(cr, hx + (pk + 0.5) * cw, cy, r, 0, 2 * M_PI);
                cairo_stroke(cr);
                cairo_rectangle(cr, hx + (pv + 0.5) * cw - r, cy - r, 2 * r, 2 * r);
                cairo_stroke(cr);
            }
        cairo_set_source_rgb(cr, 0, 0, 0);
    }
    ps_colorbar(cr, 80 + 2 * (hw + 80) - 40, y3, 16, hh, ps_viridis, 0, 1, "gate weight");
}

static int render_theory(json_t *doc, const char *path, const char *out, const ps_render_opts *o, int verbose, ps_error *err) {
    json_t *st = json_object_get(doc, "steps"), *heads = json_object_get(doc, "heads"), *pr = json_object_get(doc, "params");
    theory_ctx x = {0};
    size_t n = json_array_size(st), H = json_array_size(heads),
           W = json_array_size(json_array_get(json_object_get(json_array_get(heads, 0), "key_gate"), 0));
    if (n < 1 || n > 100000) return ps_fail(err, "%s: steps has %zu entries; a figure shows 1 to 100000", path, n);
    if (H < 1 || H > MAX_TRAIN_PANELS) return ps_fail(err, "%s: heads has %zu entries; a figure shows 1 to %d", path, H, MAX_TRAIN_PANELS);
    if (W < 1 || W > MAX_WINDOW)
        return ps_fail(err, "%s: heads[0].key_gate[0] has %zu offsets; a figure shows 1 to %d", path, W, MAX_WINDOW);
    if ((int64_t)n * (int64_t)H * 2 * (int64_t)W > MAX_GATE_VALUES)
        return ps_fail(err, "%s: %zu steps × %zu heads × window %zu are more than a figure draws", path, n, H, W);
    x.n = (int)n;
    x.H = (int)H;
    x.W = (int)W;
    x.lx = calloc(n, sizeof(double));
    x.loss = calloc(n, sizeof(double));
    x.acc = calloc(n, sizeof(double));
    x.lam = calloc(n, sizeof(double));
    x.mu = calloc(n, sizeof(double));
    x.mg = calloc(n * H * 2 * W, sizeof(double));
    x.ne = calloc(n * H * 2, sizeof(double));
    x.nl = calloc(n * H * 2, sizeof(double));
    if (!x.lx || !x.loss || !x.acc || !x.lam || !x.mu || !x.mg || !x.ne || !x.nl) {
        free_theory(&x);
        return ps_fail(err, "%s: out of memory", path);
    }
    double temp = ps_fig_num(pr, "temperature");
    json_t *lj = json_object_get(doc, "score_scale"), *mj = json_object_get(doc, "logit_scale");
    for (size_t k = 0; k < n; k++) {
        x.lx[k] = log10(fmax(0, (double)json_integer_value(json_array_get(st, k))) + 1);
        x.loss[k] = json_number_value(json_array_get(json_object_get(doc, "loss"), k));
        x.acc[k] = json_number_value(json_array_get(json_object_get(doc, "accuracy"), k));
        x.lam[k] = lj ? json_number_value(json_array_get(lj, k)) : temp;
        x.mu[k] = mj ? json_number_value(json_array_get(mj, k)) : temp;
        for (int h = 0; h < x.H; h++)
            for (int b = 0; b < 2; b++) {
                json_t *g = json_array_get(json_object_get(json_array_get(heads, (size_t)h), b ? "value_gate" : "key_gate"), k);
                size_t idx = (k * H + (size_t)h) * 2 + (size_t)b;
                for (int i = 0; i < x.W; i++) x.mg[idx * W + (size_t)i] = json_number_value(json_array_get(g, (size_t)i));
                x.ne[idx] = ps_effective_offsets(x.mg + idx * W, x.W);
            }
    }
    x.lxmax = fmax(1, x.lx[n - 1]);
    /* N_eff − 1 from the decade below its smallest value (at most 1e-8 below) to the decade above W − 1 */
    double nmin = (double)W;
    for (size_t k = 0; k < n * H * 2; k++) nmin = fmin(nmin, fmax(x.ne[k] - 1, 1e-8));
    x.nlo = fmin(-1, floor(log10(nmin)));
    x.nhi = fmax(x.nlo + 1, ceil(log10(fmax((double)W - 1, 1e-8)) + 1e-9));
    for (size_t k = 0; k < n * H * 2; k++) x.nl[k] = log10(fmax(x.ne[k] - 1, pow(10, x.nlo)));
    x.learn = json_is_true(json_object_get(pr, "learn_temperature"));
    int within = json_is_true(json_object_get(pr, "within_chunk"));
    long long S = (long long)json_integer_value(json_object_get(pr, "window"));
    snprintf(x.title, sizeof x.title, "Idealised bigram induction (phasescope theory): %d heads, W = S = %lld, %lld chunks, %lld steps",
             x.H, S, (long long)json_integer_value(json_object_get(pr, "chunks")),
             (long long)json_integer_value(json_object_get(pr, "steps")));
    char lr[32];
    ps_fmt_num(lr, sizeof lr, ps_fig_num(pr, "lr"));
    snprintf(x.subtitle, sizeof x.subtitle,
             "one-hot embeddings, static gates; %s gradient descent (lr %s) from gate logits N(0, 0.01²); λ = μ %s %g; queries: %s",
             json_integer_value(json_object_get(pr, "batch")) > 0 ? "stochastic" : "exact (population)", lr,
             x.learn ? "learned from" : "fixed at", temp,
             within ? "phases 0 .. S − 2 (successor in the query's own chunk)" : "every phase (phase S − 1's successor lies in the next chunk)");
    json_t *cov = json_object_get(doc, "covered_phases");
    double maxn = 0;
    for (size_t k = 0; k < H * 2; k++) maxn = fmax(maxn, x.ne[(n - 1) * H * 2 + k]);
    snprintf(x.verdict, sizeof x.verdict,
             "%lld of %d heads end with value peak = key peak + 1; phases answered: %zu of %lld (0 .. %lld); largest final N_eff %.4f",
             (long long)json_integer_value(json_object_get(doc, "heads_with_value_peak_after_key_peak")), x.H, json_array_size(cov), S - 1,
             S - 2, maxn);
    ps_fig_chunks ch;
    ps_fig_make_chunks(&ch, json_object_get(doc, "provenance"), x.title);
    double hh = fmin(300, fmax(60, 22.0 * x.H));
    x.fig_w = 1320;
    int rc = 0;
    ps_fig f;
    for (int k = 0; !rc && k < ps_fig_n_files(o); k++)
        if (!(rc = ps_fig_file_open(&f, out, "theory", x.fig_w, TH_ROW3 + hh + 50, o, k, err))) {
            draw_theory(f.cr, &x);
            rc = ps_fig_file_close(&f, &ch, verbose, err);
        }
    free_theory(&x);
    return rc;
}

int ps_render_theory(json_t *const *docs, const char *const *paths, int n, const char *out, const ps_render_opts *o, int verbose,
                     ps_error *err) {
    (void)n; /* one at a time (viz/kinds.c) */
    return render_theory(docs[0], paths[0], out, o, verbose, err);
}
