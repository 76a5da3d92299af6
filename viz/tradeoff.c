#include "viz/tradeoff.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "viz/draw.h"

#define TW 980.0
#define TH 620.0
#define PL 90.0  /* plot area */
#define PT 80.0
#define PW 560.0
#define PH 440.0

static double px(double mean, double lo, double hi) { return PL + (mean - lo) / (hi - lo) * PW; }
static double py(double gap) { return PT + PH - gap / 100.0 * PH; }

int ps_tradeoff_group(char *g, size_t n, const char *name) {
    snprintf(g, n, "%s", name);
    size_t gl = strlen(g), k;
    int rule = gl > 5 && !strcmp(g + gl - 5, "_rule");
    if (rule) g[gl -= 5] = '\0';
    k = gl;
    while (k > 0 && g[k - 1] >= '0' && g[k - 1] <= '9') k--;
    if (k < gl && k >= 2 && g[k - 1] == 's' && g[k - 2] == '_') g[k - 2] = '\0';
    return rule;
}

/* the x axis: the points' means on a 0.1 grid with a margin, at least 0.2 wide, inside [0, 1] */
static void mean_range(const ps_tradeoff_point *pts, int n, double *lo_out, double *hi_out) {
    double lo = 1, hi = 0;
    for (int i = 0; i < n; i++) lo = fmin(lo, pts[i].mean), hi = fmax(hi, pts[i].mean);
    lo = floor(lo * 10 - 0.5) / 10, hi = ceil(hi * 10 + 0.5) / 10;
    if (lo < 0) lo = 0;
    if (hi > 1) hi = 1;
    if (hi - lo < 0.2) hi = fmin(1, lo + 0.2), lo = hi - 0.2;
    *lo_out = lo, *hi_out = hi;
}

void ps_tradeoff_xy(const ps_tradeoff_point *pts, int n, int i, double *x, double *y) {
    double lo, hi;
    mean_range(pts, n, &lo, &hi);
    *x = px(pts[i].mean, lo, hi), *y = py(pts[i].gap_pp);
}

/* a marker's rim: its group colour at 75 %, so that the light colours (yellow) stand out on white */
static ps_rgb rim(ps_rgb c) { return (ps_rgb){0.75 * c.r, 0.75 * c.g, 0.75 * c.b}; }

/* marker radius: area proportional to bytes, the smallest of the figure at radius 6 */
static double radius(double b, double bmin) { return 6.0 * sqrt(b / bmin); }

double ps_tradeoff_radius(const ps_tradeoff_point *pts, int n, int i) {
    double bmin = INFINITY;
    for (int k = 0; k < n; k++) bmin = fmin(bmin, pts[k].kv_bytes);
    return radius(pts[i].kv_bytes, bmin);
}

int ps_fig_tradeoff(const char *path, const char *title, const char *command, const ps_tradeoff_point *pts, int n,
                    ps_error *err) {
    if (n < 1 || n > 64) return ps_fail(err, "%s: a trade-off figure shows 1 to 64 points, got %d", path, n);
    const char *groups[8];
    int ng = 0, gi[64], any_hollow = 0;
    double bmin = INFINITY, lo, hi;
    for (int i = 0; i < n; i++) {
        if (!(pts[i].kv_bytes > 0) || !isfinite(pts[i].mean) || !isfinite(pts[i].gap_pp))
            return ps_fail(err, "%s: point %d (%s) has no finite mean, gap or positive KV bytes", path, i, pts[i].group);
        int g = 0;
        while (g < ng && strcmp(groups[g], pts[i].group)) g++;
        if (g == ng) {
            if (ng == 8) return ps_fail(err, "%s: more than 8 groups (the 9th: %s)", path, pts[i].group);
            groups[ng++] = pts[i].group;
        }
        gi[i] = g;
        any_hollow |= pts[i].hollow;
        bmin = fmin(bmin, pts[i].kv_bytes);
    }
    mean_range(pts, n, &lo, &hi);
    ps_fig f;
    if (ps_fig_begin(&f, TW, TH, PS_FMT_PNG, path, err)) return -1;
    cairo_t *cr = f.cr;
    ps_text(cr, 20, 24, title, 17, 0, 0.5, 0, 1);
    ps_text(cr, 20, 48, "one point per model and seed; marker area = KV-cache bytes per token", 12, 0, 0.5, 0, 0);
    cairo_set_line_width(cr, 1);
    for (int k = 0; k <= 5; k++) { /* gap grid: 0..100 pp */
        double y = round(py(k * 20.0)) + 0.5;
        cairo_set_source_rgb(cr, 0.88, 0.88, 0.88);
        cairo_move_to(cr, PL, y), cairo_line_to(cr, PL + PW, y), cairo_stroke(cr);
        cairo_set_source_rgb(cr, 0, 0, 0);
        char b[16];
        snprintf(b, sizeof b, "%d", k * 20);
        ps_text(cr, PL - 8, y, b, 12, 1, 0.5, 0, 0);
    }
    int nt = (int)lround((hi - lo) / 0.1);
    int step = nt > 8 ? 2 : 1;
    for (int k = 0; k <= nt; k += step) {
        double v = lo + k * 0.1, x = round(px(v, lo, hi)) + 0.5;
        cairo_set_source_rgb(cr, 0.88, 0.88, 0.88);
        cairo_move_to(cr, x, PT), cairo_line_to(cr, x, PT + PH), cairo_stroke(cr);
        cairo_set_source_rgb(cr, 0, 0, 0);
        char b[16];
        snprintf(b, sizeof b, "%.1f", v);
        ps_text(cr, x, PT + PH + 8, b, 12, 0.5, 0, 0, 0);
    }
    /* the target region of issue 28: gap <= 10 pp */
    double dash[2] = {5, 4};
    cairo_set_source_rgb(cr, 0.2, 0.6, 0.3);
    cairo_set_dash(cr, dash, 2, 0);
    cairo_move_to(cr, PL, py(10)), cairo_line_to(cr, PL + PW, py(10)), cairo_stroke(cr);
    cairo_set_dash(cr, NULL, 0, 0);
    ps_text(cr, PL + PW - 4, py(10) - 4, "gap 10 pp", 11, 1, 1, 0, 0);
    cairo_set_source_rgb(cr, 0, 0, 0);
    cairo_rectangle(cr, PL + 0.5, PT + 0.5, PW, PH);
    cairo_stroke(cr);
    ps_text(cr, PL + PW / 2, PT + PH + 34, "mean accuracy over residues (top-1)", 13, 0.5, 0, 0, 0);
    ps_text(cr, PL - 50, PT + PH / 2, "gap: max − min accuracy over residues (pp)", 13, 0.5, 0.5, -M_PI / 2, 0);
    for (int i = 0; i < n; i++) {
        double x = px(pts[i].mean, lo, hi), y = py(pts[i].gap_pp), r = radius(pts[i].kv_bytes, bmin);
        ps_rgb c = ps_okabe_ito(gi[i]);
        cairo_set_source_rgba(cr, c.r, c.g, c.b, pts[i].hollow ? 0.08 : 0.55);
        cairo_arc(cr, x, y, r, 0, 2 * M_PI);
        cairo_fill_preserve(cr);
        ps_set_rgb(cr, rim(c));
        cairo_set_line_width(cr, pts[i].hollow ? 2.6 : 1.6);
        cairo_stroke(cr);
    }
    /* legends: groups, then marker sizes */
    double lx = PL + PW + 30, ly = PT + 6;
    cairo_set_source_rgb(cr, 0, 0, 0);
    ps_text(cr, lx, ly, "model", 13, 0, 0.5, 0, 1);
    for (int g = 0; g < ng; g++) {
        ps_rgb c = ps_okabe_ito(g);
        double y = ly + 24 + g * 24;
        cairo_set_source_rgba(cr, c.r, c.g, c.b, 0.55);
        cairo_arc(cr, lx + 8, y, 6, 0, 2 * M_PI);
        cairo_fill_preserve(cr);
        ps_set_rgb(cr, rim(c));
        cairo_set_line_width(cr, 1.6);
        cairo_stroke(cr);
        cairo_set_source_rgb(cr, 0, 0, 0);
        ps_text(cr, lx + 22, y, groups[g], 12, 0, 0.5, 0, 0);
    }
    double sy = ly + 24 + ng * 24 + 20;
    if (any_hollow) { /* the two checkpoints of a run */
        for (int k = 0; k < 2; k++) {
            double y = sy + k * 22;
            cairo_arc(cr, lx + 8, y, 6, 0, 2 * M_PI);
            cairo_set_source_rgba(cr, 0.4, 0.4, 0.4, k ? 0.08 : 0.55);
            cairo_fill_preserve(cr);
            cairo_set_source_rgb(cr, 0.4, 0.4, 0.4);
            cairo_set_line_width(cr, k ? 2.6 : 1.6);
            cairo_stroke(cr);
            cairo_set_source_rgb(cr, 0, 0, 0);
            ps_text(cr, lx + 22, y, k ? "at the held-out-0.6 rule" : "end of training", 12, 0, 0.5, 0, 0);
        }
        sy += 2 * 22 + 14;
    }
    ps_text(cr, lx, sy, "KV bytes / token", 13, 0, 0.5, 0, 1);
    double seen[64] = {0};
    int ns = 0;
    for (int i = 0; i < n; i++) {
        int dup = 0;
        for (int k = 0; k < ns; k++) dup |= fabs(seen[k] - pts[i].kv_bytes) < 1e-9;
        if (!dup && ns < 6) seen[ns++] = pts[i].kv_bytes;
    }
    for (int a = 1; a < ns; a++) /* ascending */
        for (int k = a; k > 0 && seen[k] < seen[k - 1]; k--) {
            double t = seen[k];
            seen[k] = seen[k - 1], seen[k - 1] = t;
        }
    double y = sy + 16;
    for (int k = 0; k < ns; k++) {
        double r = radius(seen[k], bmin);
        y += r + 6;
        cairo_set_source_rgb(cr, 0.4, 0.4, 0.4);
        cairo_set_line_width(cr, 1.4);
        cairo_arc(cr, lx + 30, y, r, 0, 2 * M_PI);
        cairo_stroke(cr);
        char b[32];
        snprintf(b, sizeof b, "%.0f", seen[k]);
        cairo_set_source_rgb(cr, 0, 0, 0);
        ps_text(cr, lx + 66, y, b, 12, 0, 0.5, 0, 0);
        y += r;
    }
    const char *keys[] = {"Title", "Software", "Command"};
    const char *vals[] = {title, "phasescope " PS_VERSION, command ? command : ""};
    return ps_fig_end(&f, keys, vals, 3, err);
}
