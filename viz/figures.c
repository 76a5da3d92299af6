#define _POSIX_C_SOURCE 200809L
#include "viz/figures.h"

#include <jansson.h>
#include <libgen.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fileio.h"
#include "gates/gates.h" /* ps_effective_offsets: viz -> gates -> core, no cycle (docs/design.md, "Layers") */

/* What a figure can show: larger inputs are refused (the renderer names the file and the field). */
#define MAX_RESIDUES 4096    /* a phase curve's residues (sweep --period goes up to 4096) */
#define MAX_KO_PERIOD 4096   /* knockout columns */
#define MAX_KO_ROWS 4096     /* knockout rows (layer × head) per panel: down to 1 px each */
#define MAX_KO_PANELS 8      /* knockout files side by side */
#define MAX_LAYERS 128       /* gates */
#define MAX_HEADS 256        /* gates, training logs */
#define MAX_GATE_ROWS 1024   /* gates: layers × heads */
#define MAX_WINDOW 4096      /* gates, training logs, theory: offsets in a window */
#define MAX_TRAIN_PANELS 64  /* training: (layer, head) panels drawn (the first 64 when there are more) */
#define PS_GATE_CONCENTRATED_FIG 2.0 /* gates.h PS_GATE_CONCENTRATED */
#define MAX_GATE_VALUES ((int64_t)1 << 26) /* training / theory: records × layers × heads × 2 × window */

/* ---- helpers ---- */

static double num(json_t *o, const char *k) { return json_number_value(json_object_get(o, k)); }

typedef void (*draw_fn)(cairo_t *cr, void *ctx);

typedef struct {
    char command[2048], model[2048], title[1024];
} chunks;

static void make_chunks(chunks *c, json_t *prov, const char *title) {
    snprintf(c->command, sizeof c->command, "%s", json_string_value(json_object_get(prov, "command")) ?: "");
    snprintf(c->model, sizeof c->model, "%s", json_string_value(json_object_get(prov, "model")) ?: "");
    snprintf(c->title, sizeof c->title, "%s", title);
}

/* Draw into OUT/name.png (and .pdf/.svg when asked). */
static int emit(const char *out_dir, const char *name, double w, double h, draw_fn fn, void *ctx, const chunks *ch,
                const ps_render_opts *o, int verbose, ps_error *err) {
    if (ps_mkdir(out_dir, err)) return -1;
    for (int pass = 0; pass < (o && o->vector ? 2 : 1); pass++) {
        ps_fig_format fmt = pass ? o->format : PS_FMT_PNG;
        char file[600], path[4800];
        snprintf(file, sizeof file, "%s.%s", name, fmt == PS_FMT_PNG ? "png" : fmt == PS_FMT_PDF ? "pdf" : "svg");
        if (ps_path_join(path, sizeof path, out_dir, file, err)) return -1;
        ps_fig f;
        if (ps_fig_begin(&f, w, h, fmt, path, err)) return -1;
        fn(f.cr, ctx);
        const char *keys[] = {"Title", "Software", "Command", "Model"};
        const char *vals[] = {ch->title, "phasescope " PS_VERSION, ch->command, ch->model};
        if (ps_fig_end(&f, keys, vals, 4, err)) return -1;
        if (verbose) printf("wrote %s\n", path);
    }
    return 0;
}

/* Text width before a figure exists (for sizing the canvas). */
static double measure(const char *s, double size, int bold) {
    cairo_surface_t *sf = cairo_image_surface_create(CAIRO_FORMAT_ARGB32, 1, 1);
    cairo_t *cr = cairo_create(sf);
    double w = cairo_status(cr) == CAIRO_STATUS_SUCCESS ? ps_text_width(cr, s, size, bold) : 0.6 * size * (double)strlen(s);
    cairo_destroy(cr);
    cairo_surface_destroy(sf);
    return w;
}

/* The largest font size <= size (down to 8) at which s fits in maxw. */
static double fit(cairo_t *cr, const char *s, double size, double maxw, int bold) {
    while (size > 8 && ps_text_width(cr, s, size, bold) > maxw) size -= 0.5;
    return size;
}

static void model_name(char *buf, size_t n, json_t *prov) {
    char tmp[2048];
    snprintf(tmp, sizeof tmp, "%s", json_string_value(json_object_get(prov, "model")) ?: "model");
    size_t l = strlen(tmp);
    while (l > 1 && tmp[l - 1] == '/') tmp[--l] = '\0';
    const char *b = basename(tmp);
    json_t *cfg = json_object_get(prov, "config"), *att = json_object_get(cfg, "attention");
    const char *kind = json_string_value(json_object_get(att, "kind"));
    if (kind && !strcmp(kind, "compressed")) {
        const char *gate = json_string_value(json_object_get(att, "gate"));
        snprintf(buf, n, "%s (W%lld/S%lld%s%s)", b, (long long)json_integer_value(json_object_get(att, "window")),
                 (long long)json_integer_value(json_object_get(att, "stride")),
                 gate && !strcmp(gate, "uniform") ? ", uniform gate" : "",
                 json_is_false(json_object_get(cfg, "rope")) ? ", no RoPE" : "");
    } else if (kind && (!strcmp(kind, "channel") || !strcmp(kind, "v4"))) {
        const char *mode = json_string_value(json_object_get(att, "mode"));
        snprintf(buf, n, "%s (V4 compressor: %s, rate %lld, window %lld%s)", b, mode && !strcmp(mode, "hca") ? "HCA" : "CSA",
                 (long long)json_integer_value(json_object_get(att, "rate")),
                 (long long)json_integer_value(json_object_get(att, "local_window")),
                 json_is_false(json_object_get(cfg, "rope")) ? ", no RoPE" : "");
    } else if (kind && !strcmp(kind, "deepseek_v4")) {
        json_t *cr = json_object_get(att, "compress_rates");
        char rates[200] = "";
        size_t w = 0;
        for (size_t i = 0; i < json_array_size(cr) && w + 16 < sizeof rates; i++)
            w += (size_t)snprintf(rates + w, sizeof rates - w, "%s%lld", i ? "," : "", (long long)json_integer_value(json_array_get(cr, i)));
        snprintf(buf, n, "%s (DeepSeek-V4, compress rates %s)", b, rates);
    } else if (kind)
        snprintf(buf, n, "%s (full attention)", b);
    else
        snprintf(buf, n, "%s", b);
}

static void line(cairo_t *cr, double x0, double y0, double x1, double y1) {
    cairo_move_to(cr, x0, y0);
    cairo_line_to(cr, x1, y1);
    cairo_stroke(cr);
}

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
        c->acc[r] = num(e, "accuracy");
        c->lo[r] = num(e, "wilson_lo");
        c->hi[r] = num(e, "wilson_hi");
        if (json_integer_value(json_object_get(e, "n")) > 0 && c->acc[r] < min) {
            min = c->acc[r];
            c->argmin = r;
        }
        if (json_integer_value(json_object_get(e, "n")) > 0) max = fmax(max, c->acc[r]);
    }
    c->flat = !(max - min > 1e-12);
    c->mean = num(cj, "mean_accuracy");
    json_t *dp = json_object_get(cj, "dominant_period"), *cs = json_object_get(cj, "chi_square");
    snprintf(c->stats, sizeof c->stats, "mean %.3f, min %.3f, gap %.1f pp", c->mean, num(cj, "min_accuracy"), num(cj, "gap_pp"));
    double p = json_is_number(json_object_get(cs, "p_value")) ? num(cs, "p_value") : NAN;
    json_t *rp = json_object_get(json_object_get(cj, "repeat_period"), "period");
    if (json_is_integer(rp) && has_period(cj)) { /* the folding period when the file has one (docs/results-schema.md) */
        char pb[32];
        ps_format_p(pb, sizeof pb, p);
        snprintf(c->stats2, sizeof c->stats2, "repeats every %lld, χ² p %s%s", (long long)json_integer_value(rp),
                 pb[0] == '<' ? "" : "= ", pb);
    } else
        ps_period_text(c->stats2, sizeof c->stats2, has_period(cj), num(dp, "period"), p);
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
    ps_text(cr, 20, 22, x->title, fit(cr, x->title, 17, CURVE_W - 40, 1), 0, 0.5, 0, 1);
    ps_text(cr, 20, 46, x->headline, fit(cr, x->headline, 14, CURVE_W - 40, 1), 0, 0.5, 0, 1);
    ps_text(cr, 20, 68, x->subtitle, fit(cr, x->subtitle, 12, CURVE_W - 40, 0), 0, 0.5, 0, 0);
    /* grid */
    cairo_set_line_width(cr, 1);
    for (int i = 0; i <= 5; i++) {
        double yv = i / 5.0, y = round(ps_curve_y(yv)) + 0.5;
        cairo_set_source_rgb(cr, 0.88, 0.88, 0.88);
        line(cr, L, y, L + pw, y);
        cairo_set_source_rgb(cr, 0, 0, 0);
        line(cr, L - 5, y, L, y);
        char buf[16];
        snprintf(buf, sizeof buf, "%.1f", yv);
        ps_text(cr, L - 8, y, buf, 12, 1, 0.5, 0, 0);
    }
    double dx = pw / (double)P;
    int step = ps_tick_step(dx, ps_text_width(cr, "0000", 12, 0) + 6);
    for (int64_t r = 0; r < P; r += step) {
        double xx = ps_curve_x(P, r);
        cairo_set_source_rgb(cr, 0, 0, 0);
        line(cr, round(xx) + 0.5, T + ph, round(xx) + 0.5, T + ph + 5);
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
        line(cr, L, ps_curve_y(x->chance), L + pw, ps_curve_y(x->chance));
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
            line(cr, xx, ps_curve_y(c->lo[r]), xx, ps_curve_y(c->hi[r]));
            line(cr, xx - 3, ps_curve_y(c->lo[r]), xx + 3, ps_curve_y(c->lo[r]));
            line(cr, xx - 3, ps_curve_y(c->hi[r]), xx + 3, ps_curve_y(c->hi[r]));
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
        line(cr, L, ps_curve_y(c->mean), L + pw, ps_curve_y(c->mean));
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
        line(cr, lx, ly + 6, lx + 24, ly + 6);
        cairo_set_dash(cr, NULL, 0, 0);
        if (i % 2) cairo_rectangle(cr, lx + 12 - 3.2, ly + 6 - 3.2, 6.4, 6.4);
        else cairo_arc(cr, lx + 12, ly + 6, 3.4, 0, 2 * M_PI);
        cairo_fill(cr);
        cairo_set_source_rgb(cr, 0, 0, 0);
        ps_text(cr, lx + 32, ly + 6, c->label, fit(cr, c->label, 13, tw, 1), 0, 0.5, 0, 1);
        ps_text(cr, lx + 32, ly + 25, c->stats, fit(cr, c->stats, 12, tw, 0), 0, 0.5, 0, 0);
        ps_text(cr, lx + 32, ly + 42, c->stats2, fit(cr, c->stats2, 12, tw, 0), 0, 0.5, 0, 0);
    }
    double lx = L + pw + 20, ky = T + 8 + x->n * 74 + 6;
    cairo_set_source_rgb(cr, 0.2, 0.2, 0.2);
    double dash[2] = {6, 4};
    cairo_set_dash(cr, dash, 2, 0);
    cairo_set_line_width(cr, 1.3);
    line(cr, lx, ky, lx + 24, ky);
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
        line(cr, lx, ky + 44, lx + 24, ky + 44);
        cairo_set_dash(cr, NULL, 0, 0);
        cairo_set_source_rgb(cr, 0, 0, 0);
        ps_text(cr, lx + 32, ky + 44, buf, 12, 0, 0.5, 0, 0);
    }
}

/* ---- knockout heatmaps ---- */

#define KO_TOP 124.0 /* heatmaps start here: title, subtitle (2 lines), panel name and target above */
#define KO_BAR_GAP 16.0
#define KO_BAR_W 16.0
#define KO_BAR_ROOM 96.0 /* bar ticks and label */

static double ko_left(double ch) { return ch >= 10 ? 110 : 80; }
/* panels 24 px a row, at least 240 and at most 900 px tall, unless the rows need more (1 px each); grids of
 * up to 100 rows (12 layers × 8 KV heads) get 12 px a row, so each head keeps its label */
static double ko_panel_h(int maxrows) {
    return fmin(fmax(240, maxrows * 24.0), fmax(fmax(900, (double)maxrows), fmin(1200, maxrows * 12.0)));
}
/* cells 10 to 36 px wide, narrower (down to 1 px) when n panels of maxcols would pass ~12000 px */
static double ko_cell_w(int maxcols, int n) {
    double cw = fmax(10, fmin(36, 560.0 / maxcols / (n > 1 ? 1.4 : 1)));
    if (cw * maxcols * n > 12000) cw = fmax(1, 12000.0 / ((double)maxcols * n));
    return cw;
}

int ps_knockout_layout(int n, const int *rows, const int *cols, ps_rect *heat, double *fig_w, double *fig_h,
                       ps_error *err) {
    int maxrows = 1, maxcols = 1;
    if (n < 1 || n > MAX_KO_PANELS) return ps_fail(err, "knockout: %d grids side by side; a figure shows 1 to %d", n, MAX_KO_PANELS);
    for (int k = 0; k < n; k++) {
        if (rows[k] < 1 || rows[k] > MAX_KO_ROWS || cols[k] < 1 || cols[k] > MAX_KO_PERIOD)
            return ps_fail(err, "knockout: a %d x %d grid is beyond a figure (1 to %d rows, 1 to %d residues)", rows[k], cols[k],
                           MAX_KO_ROWS, MAX_KO_PERIOD);
        maxrows = rows[k] > maxrows ? rows[k] : maxrows;
        maxcols = cols[k] > maxcols ? cols[k] : maxcols;
    }
    double hp = ko_panel_h(maxrows), cw = ko_cell_w(maxcols, n), x = 20;
    for (int k = 0; k < n; k++) {
        double ch = hp / rows[k];
        x += ko_left(ch);
        heat[k] = (ps_rect){x, KO_TOP, cols[k] * cw, hp};
        x += cols[k] * cw + KO_BAR_GAP + KO_BAR_W + KO_BAR_ROOM + 24;
    }
    *fig_w = fmax(x, 900);
    *fig_h = KO_TOP + hp + 62;
    if (*fig_w > PS_FIG_MAX_SIDE || *fig_h > PS_FIG_MAX_SIDE)
        return ps_fail(err, "knockout: %d grids would need a %.0f x %.0f px figure (at most %.0f a side)", n, *fig_w, *fig_h,
                       PS_FIG_MAX_SIDE);
    return 0;
}

ps_rgb ps_knockout_color(double v, double vmax, int acc) {
    double t = vmax > 0 ? (v + vmax) / (2 * vmax) : 0.5;
    return acc ? ps_diverging_rev(t) : ps_diverging(t);
}

typedef struct {
    char name[512], target[256];
    int rows, cols;
    int *layer, *head;
    double *v, vmax;
} grid;

typedef struct {
    int n;
    grid *g;
    ps_rect *heat;
    int acc;
    double fig_w;
    char title[1024], subtitle[1024], subtitle2[1024];
} ko_ctx;

static void draw_knockout(cairo_t *cr, void *vctx) {
    ko_ctx *x = vctx;
    ps_text(cr, 20, 22, x->title, fit(cr, x->title, 17, x->fig_w - 40, 1), 0, 0.5, 0, 1);
    ps_text(cr, 20, 46, x->subtitle, fit(cr, x->subtitle, 12.5, x->fig_w - 40, 0), 0, 0.5, 0, 0);
    ps_text(cr, 20, 64, x->subtitle2, fit(cr, x->subtitle2, 12.5, x->fig_w - 40, 0), 0, 0.5, 0, 0);
    ps_rgb (*cmap)(double) = x->acc ? ps_diverging_rev : ps_diverging;
    for (int k = 0; k < x->n; k++) {
        grid *g = &x->g[k];
        ps_rect hr = x->heat[k];
        double px = hr.x, T = hr.y, w = hr.w, h = hr.h, ch = h / g->rows, cw = w / g->cols;
        double room = w + KO_BAR_GAP + KO_BAR_W + KO_BAR_ROOM; /* the panel's width right of its labels */
        double cx = px + (w + KO_BAR_GAP + KO_BAR_W) / 2;
        cairo_set_source_rgb(cr, 0, 0, 0);
        ps_text(cr, cx, T - 34, g->name, fit(cr, g->name, 13, room + 60, 1), 0.5, 0.5, 0, 1);
        ps_text(cr, cx, T - 16, g->target, fit(cr, g->target, 12, room + 60, 0), 0.5, 0.5, 0, 0);
        ps_heatmap(cr, px, T, w, h, g->v, g->rows, g->cols, cmap, -g->vmax, g->vmax);
        /* layer groups: separators and labels; head labels when they fit */
        cairo_set_source_rgb(cr, 0, 0, 0);
        int r0 = 0;
        for (int r = 1; r <= g->rows; r++)
            if (r == g->rows || g->layer[r] != g->layer[r0]) {
                double yc = T + (r0 + r) / 2.0 * ch;
                char buf[32];
                snprintf(buf, sizeof buf, "layer %d", g->layer[r0]);
                if ((r - r0) * ch >= 9 || r0 == 0 || g->rows <= 64)
                    ps_text(cr, px - (ch >= 10 ? 34 : 6), yc, buf, ch >= 10 ? 12 : 10, 1, 0.5, 0, 1);
                if (r < g->rows) {
                    cairo_set_line_width(cr, 2);
                    line(cr, px - 4, round(T + r * ch), px + w, round(T + r * ch));
                }
                r0 = r;
            }
        if (ch >= 10)
            for (int r = 0; r < g->rows; r++) {
                char buf[16];
                snprintf(buf, sizeof buf, "h%d", g->head[r]);
                ps_text(cr, px - 4, T + (r + 0.5) * ch, buf, fmin(12, ch - 1), 1, 0.5, 0, 0);
            }
        int step = ps_tick_step(cw, ps_text_width(cr, "000", 12, 0) + 4);
        for (int c = 0; c < g->cols; c += step) {
            char buf[16];
            snprintf(buf, sizeof buf, "%d", c);
            ps_text(cr, px + (c + 0.5) * cw, T + h + 6, buf, 12, 0.5, 0, 0, 0);
        }
        ps_text(cr, px + w / 2, T + h + 28, "phase residue ρ", 13, 0.5, 0, 0, 0);
        ps_colorbar(cr, px + w + KO_BAR_GAP, T, KO_BAR_W, h, cmap, -g->vmax, g->vmax,
                    x->acc ? "Δ accuracy (pp)" : "Δ mean target NLL (nats)");
    }
}

static const char *target_text(const char *t) {
    if (!t) return "knocked out: (target not recorded)";
    if (!strcmp(t, "raw")) return "knocked out: raw keys and values (hook_k, hook_v)";
    if (!strcmp(t, "compressed")) return "knocked out: compressed keys and values (hook_ck, hook_cv)";
    if (!strcmp(t, "both")) return "knocked out: raw and compressed keys and values";
    if (!strcmp(t, "heads")) return "knocked out: query heads (layers.L.attn.q, one head per cell)";
    if (!strcmp(t, "indexer")) return "knocked out: the indexer's selection, replaced by the mean-pattern top-k";
    if (!strcmp(t, "sink")) return "knocked out: every head's sink mass (layers.L.attn.sink)";
    return NULL;
}

static void free_grids(ko_ctx *x) {
    if (x->g)
        for (int k = 0; k < x->n; k++) {
            free(x->g[k].layer);
            free(x->g[k].head);
            free(x->g[k].v);
        }
    free(x->g);
    free(x->heat);
}

static int render_knockout(json_t *const *docs, const char *const *paths, int n, const char *out, const ps_render_opts *o,
                           int verbose, ps_error *err) {
    if (n > MAX_KO_PANELS) return ps_fail(err, "%s: %d knockout grids side by side; a figure shows at most %d", paths[0], n, MAX_KO_PANELS);
    ko_ctx x = {0};
    x.n = n;
    x.acc = o && o->measure && !strcmp(o->measure, "acc");
    x.g = calloc((size_t)n, sizeof *x.g);
    x.heat = calloc((size_t)n, sizeof *x.heat);
    int *rows = calloc((size_t)n, sizeof(int)), *cols = calloc((size_t)n, sizeof(int));
    int rc = 0;
    if (!x.g || !x.heat || !rows || !cols) rc = ps_fail(err, "%s: out of memory", paths[0]);
    for (int k = 0; k < n && !rc; k++) {
        json_t *grid_j = json_object_get(docs[k], "grid"), *cells = json_object_get(grid_j, "cells");
        grid *g = &x.g[k];
        model_name(g->name, sizeof g->name, json_object_get(docs[k], "provenance"));
        const char *tg = json_string_value(json_object_get(grid_j, "target")), *tt = target_text(tg);
        const char *akind = json_string_value(
            json_object_get(json_object_get(json_object_get(json_object_get(docs[k], "provenance"), "config"), "attention"), "kind"));
        if (akind && tg && (!strcmp(akind, "channel") || !strcmp(akind, "v4") || !strcmp(akind, "deepseek_v4"))) { /* K = V */
            int rt = !strcmp(akind, "deepseek_v4");
            if (!strcmp(tg, "raw")) tt = rt ? "knocked out: the raw K=V window (layers.L.attn.kv)" : "knocked out: the raw K=V entries (hook_k)";
            else if (!strcmp(tg, "compressed"))
                tt = rt ? "knocked out: the compressed entries (layers.L.attn.compressor.kv)" : "knocked out: the compressed K=V entries (hook_ck)";
        }
        if (tt) snprintf(g->target, sizeof g->target, "%s", tt);
        else snprintf(g->target, sizeof g->target, "knocked out: %s", tg);
        size_t nrows = json_array_size(cells);
        json_int_t period = json_integer_value(json_object_get(grid_j, "period"));
        if (nrows < 1 || nrows > MAX_KO_ROWS) {
            rc = ps_fail(err, "%s: grid.cells has %zu rows; a figure shows 1 to %d", paths[k], nrows, MAX_KO_ROWS);
            break;
        }
        if (period < 1 || period > MAX_KO_PERIOD) {
            rc = ps_fail(err, "%s: grid.period = %lld; a figure shows 1 to %d residues", paths[k], (long long)period, MAX_KO_PERIOD);
            break;
        }
        g->rows = rows[k] = (int)nrows;
        g->cols = cols[k] = (int)period;
        g->layer = calloc((size_t)g->rows, sizeof(int));
        g->head = calloc((size_t)g->rows, sizeof(int));
        g->v = calloc((size_t)g->rows * (size_t)g->cols, sizeof(double));
        if (!g->layer || !g->head || !g->v) {
            rc = ps_fail(err, "%s: out of memory", paths[k]);
            break;
        }
        for (int r = 0; r < g->rows; r++) {
            json_t *cell = json_array_get(cells, (size_t)r), *res = json_object_get(cell, "residues");
            g->layer[r] = (int)json_integer_value(json_object_get(cell, "layer"));
            g->head[r] = (int)json_integer_value(json_object_get(cell, "head"));
            for (int c = 0; c < g->cols; c++) {
                json_t *e = json_array_get(res, (size_t)c);
                double v = json_integer_value(json_object_get(e, "n")) > 0 ? num(e, x.acc ? "delta_accuracy_pp" : "delta_nll") : NAN;
                if (!isfinite(v)) v = NAN;
                g->v[(size_t)r * (size_t)g->cols + (size_t)c] = v;
                if (!isnan(v)) g->vmax = fmax(g->vmax, fabs(v));
            }
        }
        if (!(g->vmax > 0)) g->vmax = 1; /* all zero: a scale of ±1 shows them white */
    }
    double W = 0, H = 0;
    if (!rc) rc = ps_knockout_layout(n, rows, cols, x.heat, &W, &H, err);
    if (!rc) {
        x.fig_w = W;
        snprintf(x.title, sizeof x.title, "KV-head knockout (mean replacement): change in %s per layer × KV head and phase residue",
                 x.acc ? "accuracy" : "mean target NLL");
        snprintf(x.subtitle, sizeof x.subtitle,
                 "each KV head's entries (named over each panel) replaced by their mean over the prompts of the same shift; "
                 "%s",
                 x.acc ? "change = knocked out − clean accuracy, in percentage points" : "change = knocked out − clean NLL, in nats");
        snprintf(x.subtitle2, sizeof x.subtitle2, "orange = knockout hurts (%s), blue = knockout helps, white = no change, grey = no prompts%s",
                 x.acc ? "accuracy falls" : "NLL rises", n > 1 ? "; each panel has its own colour scale" : "");
        chunks ch;
        make_chunks(&ch, json_object_get(docs[0], "provenance"), x.title);
        rc = emit(out, x.acc ? "knockout_heatmap_acc" : "knockout_heatmap", W, H, draw_knockout, &x, &ch, o, verbose, err);
    }
    free_grids(&x);
    free(rows);
    free(cols);
    return rc;
}

/* ---- gate concentration ---- */

typedef struct {
    int L, H, W;
    double *mg;      /* [L][H][2][W] */
    double *ns, *ni; /* [L][H][2] */
    int *peak;       /* [L][H][2] */
    char title[1024], subtitle[1024];
    double cw, ch, left, textw, gap, top, rowh, fig_w;
} gates_ctx;

#define GATES_STATS_FMT "N_s %.2f   N_i %.2f   r = %d"

static double gates_stats_font(double ch) { return fmin(13, ch - 1); }

static void draw_gates(cairo_t *cr, void *vctx) {
    gates_ctx *x = vctx;
    ps_text(cr, 20, 24, x->title, fit(cr, x->title, 18, x->fig_w - 40, 1), 0, 0.5, 0, 1);
    ps_text(cr, 20, 50, x->subtitle, fit(cr, x->subtitle, 13, x->fig_w - 40, 0), 0, 0.5, 0, 0);
    double T = x->top, left = x->left, bw = x->W * x->cw, hh = x->H * x->ch, block = bw + 10 + x->textw + x->gap;
    for (int b = 0; b < 2; b++)
        ps_text(cr, left + b * block + bw / 2, T - 18, b ? "value gate" : "key gate", 15, 0.5, 0.5, 0, 1);
    double fs = gates_stats_font(x->ch);
    for (int l = 0; l < x->L; l++) {
        double y = T + l * x->rowh;
        char buf[96];
        snprintf(buf, sizeof buf, "layer %d", l);
        cairo_set_source_rgb(cr, 0, 0, 0);
        ps_text(cr, 16, y + hh / 2, buf, 14, 0, 0.5, 0, 1);
        for (int b = 0; b < 2; b++) {
            double px = left + b * block;
            ps_heatmap_strided(cr, px, y, bw, hh, x->mg + ((size_t)l * (size_t)x->H * 2 + (size_t)b) * (size_t)x->W, x->H, x->W,
                               (ptrdiff_t)2 * x->W, 1, ps_viridis, 0, 1);
            cairo_set_source_rgb(cr, 0, 0, 0);
            for (int h = 0; h < x->H; h++) {
                size_t k = ((size_t)l * (size_t)x->H + (size_t)h) * 2 + (size_t)b;
                if (x->ch < 9) break;
                snprintf(buf, sizeof buf, "h%d", h);
                ps_text(cr, px - 5, y + (h + 0.5) * x->ch, buf, fs, 1, 0.5, 0, 0);
                snprintf(buf, sizeof buf, GATES_STATS_FMT, x->ns[k], x->ni[k], x->peak[k]);
                ps_text(cr, px + bw + 10, y + (h + 0.5) * x->ch, buf, fs, 0, 0.5, 0, 0);
            }
            int step = ps_tick_step(x->cw, ps_text_width(cr, "000", 12, 0) + 3);
            for (int i = 0; i < x->W; i += step) {
                snprintf(buf, sizeof buf, "%d", i);
                ps_text(cr, px + (i + 0.5) * x->cw, y + hh + 5, buf, 12, 0.5, 0, 0, 0);
            }
            ps_text(cr, px + bw / 2, y + hh + 24, "offset i in the window", 13, 0.5, 0, 0, 0);
        }
    }
    ps_colorbar(cr, left + 2 * block - x->gap + 24, T, 18, fmin(hh, 600), ps_viridis, 0, 1, "mean gate weight E[α_i]");
}

static void free_gates(gates_ctx *x) {
    free(x->mg);
    free(x->ns);
    free(x->ni);
    free(x->peak);
}

static int render_gate_training(json_t *doc, const char *path, const char *out, const ps_render_opts *o, int verbose,
                                ps_error *err);
static int render_gates(json_t *doc, const char *path, const char *out, const ps_render_opts *o, int verbose, ps_error *err) {
    json_t *gj = json_object_get(doc, "gates"), *layers = json_object_get(gj, "layers");
    size_t L = json_array_size(layers), H = json_array_size(json_object_get(json_array_get(layers, 0), "heads"));
    json_int_t W = json_integer_value(json_object_get(gj, "window"));
    if (L < 1 || L > MAX_LAYERS)
        return ps_fail(err, "%s: gates.layers has %zu entries; a figure shows 1 to %d layers", path, L, MAX_LAYERS);
    if (H < 1 || H > MAX_HEADS)
        return ps_fail(err, "%s: gates.layers[0].heads has %zu entries; a figure shows 1 to %d heads", path, H, MAX_HEADS);
    if (W < 1 || W > MAX_WINDOW)
        return ps_fail(err, "%s: gates.window = %lld; a figure shows 1 to %d offsets", path, (long long)W, MAX_WINDOW);
    if ((int64_t)L * (int64_t)H > MAX_GATE_ROWS)
        return ps_fail(err, "%s: gates.layers × heads = %zu × %zu rows; a figure shows at most %d", path, L, H, MAX_GATE_ROWS);
    gates_ctx x = {0};
    x.L = (int)L;
    x.H = (int)H;
    x.W = (int)W;
    size_t nb = L * H * 2; /* <= 2048, so nb * W <= 2^23 */
    x.mg = calloc(nb * (size_t)x.W, sizeof(double));
    x.ns = calloc(nb, sizeof(double));
    x.ni = calloc(nb, sizeof(double));
    x.peak = calloc(nb, sizeof(int));
    if (!x.mg || !x.ns || !x.ni || !x.peak) {
        free_gates(&x);
        return ps_fail(err, "%s: out of memory", path);
    }
    int64_t nwin = 0;
    for (int l = 0; l < x.L; l++)
        for (int h = 0; h < x.H; h++)
            for (int b = 0; b < 2; b++) {
                json_t *bo = json_object_get(json_array_get(json_object_get(json_array_get(layers, (size_t)l), "heads"), (size_t)h),
                                             b ? "value" : "key");
                size_t k = ((size_t)l * (size_t)x.H + (size_t)h) * 2 + (size_t)b;
                for (int i = 0; i < x.W; i++) x.mg[k * (size_t)x.W + (size_t)i] = json_number_value(json_array_get(json_object_get(bo, "mean_gate"), (size_t)i));
                x.ns[k] = num(bo, "N_static");
                x.ni[k] = num(bo, "N_input");
                x.peak[k] = (int)json_integer_value(json_object_get(bo, "peak"));
                nwin = json_integer_value(json_object_get(bo, "n_windows"));
            }
    char name[400];
    model_name(name, sizeof name, json_object_get(doc, "provenance"));
    snprintf(x.title, sizeof x.title, "Gate concentration — %s", name);
    snprintf(x.subtitle, sizeof x.subtitle,
             "mean gate weight per KV head and offset, pooled over %lld windows; N_s = exp(H(mean gate)), N_i = E[exp(H(α))], "
             "r = peak offset",
             (long long)nwin);
    /* fill the canvas: cells as big as a ~440 px square allows, stats text and the colour bar right beside */
    x.cw = x.W <= 33 ? fmax(12, fmin(56, 400.0 / x.W)) : fmax(1, 400.0 / x.W); /* wide windows: cells down to 1 px */
    x.ch = fmax(6, fmin(30, 460.0 / x.H));
    x.left = 16 + measure("layer 000", 14, 1) + 12 + (x.ch >= 9 ? measure("h000", gates_stats_font(x.ch), 0) + 8 : 0);
    char wide[96];
    snprintf(wide, sizeof wide, GATES_STATS_FMT, 8.88, 8.88, x.W > 100 ? 888 : 88);
    x.textw = x.ch >= 9 ? measure(wide, gates_stats_font(x.ch), 0) : 0;
    x.top = 104;
    x.rowh = x.H * x.ch + 62;
    x.gap = 40 + (x.ch >= 9 ? measure("h000", gates_stats_font(x.ch), 0) : 0);
    double block = x.W * x.cw + 10 + x.textw + x.gap;
    double W_px = x.left + 2 * block - x.gap + 24 + 18 + 14 + measure("0.8", 12, 0) + 30;
    x.fig_w = fmax(W_px, measure(x.subtitle, 13, 0) + 40);
    double H_px = x.top + x.L * x.rowh + 6;
    chunks ch;
    make_chunks(&ch, json_object_get(doc, "provenance"), x.title);
    int rc;
    if (x.fig_w > PS_FIG_MAX_SIDE || H_px > PS_FIG_MAX_SIDE)
        rc = ps_fail(err, "%s: %zu layers x %zu heads x window %lld need a %.0f x %.0f px figure (at most %.0f a side)", path, L,
                     H, (long long)W, x.fig_w, H_px, PS_FIG_MAX_SIDE);
    else
        rc = emit(out, "gate_concentration", x.fig_w, H_px, draw_gates, &x, &ch, o, verbose, err);
    free_gates(&x);
    if (!rc && json_array_size(json_object_get(doc, "training"))) rc = render_gate_training(doc, path, out, o, verbose, err);
    return rc;
}

/* ---- gate concentration over training (gates.json "training") ---- */

#define GT_TOP 112.0
#define GT_ROWH 26.0 /* a layer's row */
#define GT_MAX_STEPS 4096

typedef struct {
    int L, S, W;
    double *v; /* [stat 0 mean, 1 min][branch][L][S] */
    int64_t *steps;
    double cw, left, pw, ph, fig_w;
    char title[1024], subtitle[1024], subtitle2[1024];
} gt_ctx;

/* one-hot (N = 1) bright, uniform (N = W) dark */
static ps_rgb viridis_rev(double t) { return ps_viridis(1 - t); }

static void draw_gate_training(cairo_t *cr, void *vctx) {
    gt_ctx *x = vctx;
    cairo_set_source_rgb(cr, 0, 0, 0);
    ps_text(cr, 20, 22, x->title, fit(cr, x->title, 17, x->fig_w - 40, 1), 0, 0.5, 0, 1);
    ps_text(cr, 20, 46, x->subtitle, fit(cr, x->subtitle, 12.5, x->fig_w - 40, 0), 0, 0.5, 0, 0);
    ps_text(cr, 20, 64, x->subtitle2, fit(cr, x->subtitle2, 12.5, x->fig_w - 40, 0), 0, 0.5, 0, 0);
    static const char *const STAT[] = {"mean over KV heads", "min over KV heads (most concentrated head)"};
    for (int s = 0; s < 2; s++)
        for (int b = 0; b < 2; b++) {
            double px = x->left + b * (x->pw + x->left), py = GT_TOP + s * (x->ph + 96);
            char buf[160];
            snprintf(buf, sizeof buf, "%s gate — N_static, %s", b ? "value" : "key", STAT[s]);
            cairo_set_source_rgb(cr, 0, 0, 0);
            ps_text(cr, px + x->pw / 2, py - 16, buf, fit(cr, buf, 13, x->pw + x->left - 20, 1), 0.5, 0.5, 0, 1);
            ps_heatmap(cr, px, py, x->pw, x->ph, x->v + ((size_t)(s * 2 + b) * (size_t)x->L) * (size_t)x->S, x->L, x->S,
                       viridis_rev, 0, log2(x->W > 1 ? x->W : 2));
            cairo_set_source_rgb(cr, 0, 0, 0);
            double rh = x->ph / x->L;
            int rstep = ps_tick_step(rh, 12);
            for (int l = 0; l < x->L; l += rstep) {
                snprintf(buf, sizeof buf, "layer %d", l);
                ps_text(cr, px - 6, py + (l + 0.5) * rh, buf, fmin(12, rh), 1, 0.5, 0, 0);
            }
            /* the values where the cells are big enough to read */
            if (x->cw >= 30 && rh >= 14)
                for (int l = 0; l < x->L; l++)
                    for (int t = 0; t < x->S; t++) {
                        double v = x->v[((size_t)(s * 2 + b) * (size_t)x->L + (size_t)l) * (size_t)x->S + (size_t)t];
                        double u = v / log2(x->W > 1 ? x->W : 2);
                        if (u > 0.55) cairo_set_source_rgb(cr, 1, 1, 1);
                        else cairo_set_source_rgb(cr, 0, 0, 0);
                        snprintf(buf, sizeof buf, "%.1f", exp2(v));
                        ps_text(cr, px + (t + 0.5) * x->cw, py + (l + 0.5) * rh, buf, fmin(10, rh - 3), 0.5, 0.5, 0, 0);
                    }
            cairo_set_source_rgb(cr, 0, 0, 0);
            char w0[32];
            snprintf(w0, sizeof w0, "%lld", (long long)x->steps[x->S - 1]);
            int step = ps_tick_step(x->cw, ps_text_width(cr, w0, 11, 0) + 6);
            for (int t = 0; t < x->S; t += step) {
                snprintf(buf, sizeof buf, "%lld", (long long)x->steps[t]);
                ps_text(cr, px + (t + 0.5) * x->cw, py + x->ph + 5, buf, 11, 0.5, 0, 0, 0);
            }
            ps_text(cr, px + x->pw / 2, py + x->ph + 24, "training step (logged gate records)", 12.5, 0.5, 0, 0, 0);
        }
    ps_colorbar(cr, x->left + 2 * x->pw + x->left + 10, GT_TOP, 16, x->ph * 2 + 96, viridis_rev, 0, log2(x->W > 1 ? x->W : 2),
                "log2 N_static");
}

/* OUT/gate_training.png from gates.json's "training" entries (validated: every (layer, head, branch) once,
 * the same steps in each). */
static int render_gate_training(json_t *doc, const char *path, const char *out, const ps_render_opts *o, int verbose,
                                ps_error *err) {
    json_t *tr = json_object_get(doc, "training"), *gj = json_object_get(doc, "gates");
    size_t ne = json_array_size(tr);
    json_int_t W = json_integer_value(json_object_get(gj, "window"));
    size_t L = json_array_size(json_object_get(gj, "layers"));
    size_t S = json_array_size(json_object_get(json_array_get(tr, 0), "steps"));
    if (!ne || !S) return 0;
    if (S > GT_MAX_STEPS) return ps_fail(err, "%s: training has %zu gate records; a figure shows at most %d", path, S, GT_MAX_STEPS);
    gt_ctx x = {0};
    x.L = (int)L;
    x.S = (int)S;
    x.W = (int)W;
    x.v = malloc(4 * L * S * sizeof(double));
    x.steps = malloc(S * sizeof(int64_t));
    int *cnt = calloc(2 * L, sizeof(int));
    if (!x.v || !x.steps || !cnt) {
        free(x.v);
        free(x.steps);
        free(cnt);
        return ps_fail(err, "%s: out of memory", path);
    }
    for (size_t i = 0; i < 2 * L * S; i++) {
        x.v[i] = 0;            /* mean */
        x.v[2 * L * S + i] = INFINITY; /* min */
    }
    for (size_t t = 0; t < S; t++) x.steps[t] = json_integer_value(json_array_get(json_object_get(json_array_get(tr, 0), "steps"), t));
    int H = 0;
    for (size_t e = 0; e < ne; e++) {
        json_t *en = json_array_get(tr, e), *ns = json_object_get(en, "N_static");
        int l = (int)json_integer_value(json_object_get(en, "layer")), h = (int)json_integer_value(json_object_get(en, "head"));
        int b = !strcmp(json_string_value(json_object_get(en, "branch")), "value");
        H = h + 1 > H ? h + 1 : H;
        cnt[b * L + (size_t)l]++;
        for (size_t t = 0; t < S; t++) {
            double v = json_number_value(json_array_get(ns, t));
            size_t k = ((size_t)b * L + (size_t)l) * S + t;
            x.v[k] += v;
            x.v[2 * L * S + k] = fmin(x.v[2 * L * S + k], v);
        }
    }
    for (size_t bl = 0; bl < 2 * L; bl++)
        for (size_t t = 0; t < S; t++) x.v[bl * S + t] = cnt[bl] ? x.v[bl * S + t] / cnt[bl] : NAN;
    free(cnt);
    /* colour on a log scale: log2 N_static, 0 = one-hot … log2 W = uniform (concentration below 2 offsets is
     * where the differences matter) */
    for (size_t i = 0; i < 4 * L * S; i++) x.v[i] = isfinite(x.v[i]) ? log2(fmax(x.v[i], 1)) : NAN;
    x.cw = fmax(4, fmin(40, 520.0 / (double)S));
    x.pw = x.cw * (double)S;
    x.ph = fmax(60, fmin(GT_ROWH * (double)L, 420));
    x.left = 80;
    char name[400];
    model_name(name, sizeof name, json_object_get(doc, "provenance"));
    snprintf(x.title, sizeof x.title, "Gate concentration over training — %s", name);
    snprintf(x.subtitle, sizeof x.subtitle,
             "N_static = exp(H(mean gate)) per layer at each logged gate record (%zu records, steps %lld–%lld), W = %lld; "
             "%d KV heads per layer",
             S, (long long)x.steps[0], (long long)x.steps[S - 1], (long long)W, H);
    snprintf(x.subtitle2, sizeof x.subtitle2,
             "colour: log2 N_static (0 = one-hot, 1 = two offsets, log2 W = uniform); top: averaged over the layer's KV heads; bottom: the minimum over them (a layer "
             "where one head goes one-hot shows there); bright = concentrated");
    x.fig_w = fmax(x.left + 2 * (x.pw + x.left) + 100, measure(x.subtitle, 12.5, 0) + 40);
    double H_px = GT_TOP + 2 * x.ph + 96 + 50;
    chunks ch;
    make_chunks(&ch, json_object_get(doc, "provenance"), x.title);
    int rc;
    if (x.fig_w > PS_FIG_MAX_SIDE || H_px > PS_FIG_MAX_SIDE)
        rc = ps_fail(err, "%s: gate training figure would be %.0f x %.0f px (at most %.0f a side)", path, x.fig_w, H_px,
                     PS_FIG_MAX_SIDE);
    else
        rc = emit(out, "gate_training", x.fig_w, H_px, draw_gate_training, &x, &ch, o, verbose, err);
    free(x.v);
    free(x.steps);
    return rc;
}

/* ---- per-channel gates (gates.gate "per_channel": DeepSeek-V4's compressor, gates/chgates.h) ---- */

typedef struct {
    int layer, S, d, rate;
    char attention[16], branch[16];
    double *mg;       /* [d][S] */
    double *ns, *ni;  /* [d] */
    double *pooled;   /* [S] */
    double p_ns, p_ni, cm_ns, cm_ni;
    int p_peak, nl[3];
    char p_label[32];
    long long n_windows;
} chg_panel;

typedef struct {
    int n, cols;
    chg_panel *p;
    int *row, *col;   /* grid position of each panel */
    double cw, ch, heat_w, heat_h, panel_w, panel_h, top, fig_w;
    char title[1024], subtitle[1024];
} chg_ctx;

#define CHG_NPLOT_W 190.0
#define CHG_BARS_H 56.0
#define CHG_HEAD_H 46.0

static void draw_chgates(cairo_t *cr, void *vctx) {
    chg_ctx *x = vctx;
    ps_text(cr, 20, 24, x->title, fit(cr, x->title, 18, x->fig_w - 40, 1), 0, 0.5, 0, 1);
    ps_text(cr, 20, 50, x->subtitle, fit(cr, x->subtitle, 13, x->fig_w - 40, 0), 0, 0.5, 0, 0);
    char buf[400];
    for (int k = 0; k < x->n; k++) {
        const chg_panel *p = &x->p[k];
        double px = 20 + x->col[k] * x->panel_w + 56, py = x->top + x->row[k] * x->panel_h;
        double hw = p->S * x->cw, hh = p->d * x->ch;
        snprintf(buf, sizeof buf, "layer %d · %s (%s, rate %d, %d slots, %d channels)", p->layer, p->branch,
                 !strcmp(p->attention, "csa") ? "CSA" : "HCA", p->rate, p->S, p->d);
        cairo_set_source_rgb(cr, 0, 0, 0);
        ps_text(cr, px - 50, py, buf, 14, 0, 0, 0, 1);
        snprintf(buf, sizeof buf, "pooled: N_s %.2f, N_i %.2f, peak slot %d (%s); per channel: mean N_s %.2f, N_i %.2f; %d static, %d input-dep., %d diffuse",
                 p->p_ns, p->p_ni, p->p_peak, p->p_label, p->cm_ns, p->cm_ni, p->nl[0], p->nl[1], p->nl[2]);
        ps_text(cr, px - 50, py + 20, buf, fit(cr, buf, 12, x->panel_w - 30, 0), 0, 0, 0, 0);
        double y0 = py + CHG_HEAD_H;
        ps_heatmap_strided(cr, px, y0, hw, hh, p->mg, p->d, p->S, p->S, 1, ps_viridis, 0, 1);
        cairo_set_source_rgb(cr, 0, 0, 0);
        ps_text(cr, px - 30, y0 + hh / 2, "channel", 12, 0.5, 1, -M_PI / 2, 0);
        int cstep = ps_tick_step(x->ch, 12);
        for (int c = 0; c < p->d; c += cstep) {
            snprintf(buf, sizeof buf, "%d", c);
            if (x->ch >= 4 || c == 0) ps_text(cr, px - 2, y0 + (c + 0.5) * x->ch, buf, fmin(11, fmax(7, x->ch)), 1, 0.5, 0, 0);
        }
        /* the pooled mean gate under the heatmap, on the same slot axis */
        double by = y0 + hh + 8, mx = 0;
        for (int i = 0; i < p->S; i++) mx = fmax(mx, p->pooled[i]);
        if (!(mx > 0)) mx = 1;
        cairo_set_source_rgb(cr, 0.93, 0.93, 0.93);
        cairo_rectangle(cr, px, by, hw, CHG_BARS_H);
        cairo_fill(cr);
        ps_set_rgb(cr, ps_okabe_ito(0));
        for (int i = 0; i < p->S; i++) {
            double bh = CHG_BARS_H * p->pooled[i] / mx;
            cairo_rectangle(cr, px + i * x->cw + (x->cw > 3 ? 1 : 0), by + CHG_BARS_H - bh, fmax(0.5, x->cw - (x->cw > 3 ? 2 : 0)), bh);
            cairo_fill(cr);
        }
        cairo_set_source_rgb(cr, 0, 0, 0);
        snprintf(buf, sizeof buf, "pooled (max %.2f)", mx);
        ps_text(cr, px + hw + 4, by + CHG_BARS_H / 2, buf, 10, 0, 0.5, 0, 0);
        int sstep = ps_tick_step(x->cw, ps_text_width(cr, "000", 11, 0) + 3);
        for (int i = 0; i < p->S; i += sstep) {
            snprintf(buf, sizeof buf, "%d", i);
            ps_text(cr, px + (i + 0.5) * x->cw, by + CHG_BARS_H + 3, buf, 11, 0.5, 0, 0, 0);
        }
        ps_text(cr, px + hw / 2, by + CHG_BARS_H + 18,
                !strcmp(p->attention, "csa") ? "slot (0..m−1: the previous window's series; m..2m−1: this window's)"
                                             : "slot = token offset in the window",
                11, 0.5, 0, 0, 0);
        /* per-channel N_static (dot) and N_input (cross) on 1..S */
        double nx = px + hw + 24, nw = CHG_NPLOT_W - 30;
        cairo_set_source_rgb(cr, 0.5, 0.5, 0.5);
        cairo_set_line_width(cr, 1);
        cairo_rectangle(cr, nx + 0.5, y0 + 0.5, nw, hh);
        cairo_stroke(cr);
        double lo = 1, hi = p->S > 1 ? p->S : 2;
#define CHG_X(v) (nx + nw * ((v) - lo) / (hi - lo))
        double dash[2] = {3, 3};
        cairo_set_dash(cr, dash, 2, 0);
        line(cr, CHG_X(PS_GATE_CONCENTRATED_FIG), y0, CHG_X(PS_GATE_CONCENTRATED_FIG), y0 + hh);
        cairo_stroke(cr);
        cairo_set_dash(cr, NULL, 0, 0);
        double r = fmax(1.2, fmin(3, x->ch / 2.5));
        for (int c = 0; c < p->d; c++) {
            double yy = y0 + (c + 0.5) * x->ch;
            ps_set_rgb(cr, ps_okabe_ito(0));
            cairo_arc(cr, CHG_X(fmin(hi, fmax(lo, p->ns[c]))), yy, r, 0, 2 * M_PI);
            cairo_fill(cr);
            ps_set_rgb(cr, ps_okabe_ito(1));
            double cx = CHG_X(fmin(hi, fmax(lo, p->ni[c])));
            line(cr, cx - r, yy - r, cx + r, yy + r);
            line(cr, cx - r, yy + r, cx + r, yy - r);
            cairo_stroke(cr);
        }
#undef CHG_X
        cairo_set_source_rgb(cr, 0, 0, 0);
        snprintf(buf, sizeof buf, "%d", (int)lo);
        ps_text(cr, nx, y0 + hh + 3, buf, 11, 0.5, 0, 0, 0);
        snprintf(buf, sizeof buf, "%d", (int)hi);
        ps_text(cr, nx + nw, y0 + hh + 3, buf, 11, 0.5, 0, 0, 0);
        ps_text(cr, nx + nw / 2, y0 + hh + 18, "effective slots per channel", 11, 0.5, 0, 0, 0);
        ps_set_rgb(cr, ps_okabe_ito(0));
        ps_text(cr, nx + nw / 2 - 4, y0 - 4, "● N_static", 11, 1, 1, 0, 0);
        ps_set_rgb(cr, ps_okabe_ito(1));
        ps_text(cr, nx + nw / 2 + 4, y0 - 4, "× N_input", 11, 0, 1, 0, 0);
    }
    double cbx = 20 + x->cols * x->panel_w;
    ps_colorbar(cr, cbx, x->top + CHG_HEAD_H, 18, fmin(fmax(x->heat_h, 120), 600), ps_viridis, 0, 1, "mean gate weight E[α]");
}

static void free_chg(chg_ctx *x) {
    if (x->p)
        for (int k = 0; k < x->n; k++) {
            free(x->p[k].mg);
            free(x->p[k].ns);
            free(x->p[k].ni);
            free(x->p[k].pooled);
        }
    free(x->p);
    free(x->row);
    free(x->col);
}

static int render_chgates(json_t *doc, const char *path, const char *out, const ps_render_opts *o, int verbose, ps_error *err) {
    json_t *gj = json_object_get(doc, "gates"), *layers = json_object_get(gj, "layers");
    size_t L = json_array_size(layers);
    if (L < 1 || L > MAX_LAYERS)
        return ps_fail(err, "%s: gates.layers has %zu entries; a figure shows 1 to %d layers", path, L, MAX_LAYERS);
    chg_ctx x = {0};
    int cap = (int)L * 2, rc = 0;
    x.p = calloc((size_t)cap, sizeof *x.p);
    x.row = calloc((size_t)cap, sizeof(int));
    x.col = calloc((size_t)cap, sizeof(int));
    if (!x.p || !x.row || !x.col) {
        free_chg(&x);
        return ps_fail(err, "%s: out of memory", path);
    }
    int maxS = 1, maxd = 1;
    for (size_t l = 0; l < L && !rc; l++) {
        json_t *lo = json_array_get(layers, l), *brs = json_object_get(lo, "branches");
        for (size_t b = 0; b < json_array_size(brs) && b < 2 && !rc; b++) {
            json_t *bo = json_array_get(brs, b), *po = json_object_get(bo, "pooled"), *per = json_object_get(bo, "per_channel");
            chg_panel *p = &x.p[x.n];
            p->layer = (int)json_integer_value(json_object_get(lo, "layer"));
            p->S = (int)json_integer_value(json_object_get(lo, "slots"));
            p->d = (int)json_integer_value(json_object_get(bo, "channels"));
            p->rate = (int)json_integer_value(json_object_get(lo, "rate"));
            snprintf(p->attention, sizeof p->attention, "%s", json_string_value(json_object_get(lo, "attention")) ?: "");
            snprintf(p->branch, sizeof p->branch, "%s", json_string_value(json_object_get(bo, "branch")) ?: "");
            if (p->S < 1 || p->S > MAX_WINDOW || p->d < 1 || p->d > 8192) {
                rc = ps_fail(err, "%s: layer %d has %d slots x %d channels; a figure shows up to %d x 8192", path, p->layer, p->S, p->d, MAX_WINDOW);
                break;
            }
            p->mg = calloc((size_t)p->S * (size_t)p->d, sizeof(double));
            p->ns = calloc((size_t)p->d, sizeof(double));
            p->ni = calloc((size_t)p->d, sizeof(double));
            p->pooled = calloc((size_t)p->S, sizeof(double));
            x.row[x.n] = (int)l;
            x.col[x.n] = (int)b;
            x.n++;
            if (!p->mg || !p->ns || !p->ni || !p->pooled) {
                rc = ps_fail(err, "%s: out of memory", path);
                break;
            }
            json_t *mg = json_object_get(per, "mean_gate");
            for (int c = 0; c < p->d; c++) {
                for (int i = 0; i < p->S; i++)
                    p->mg[(size_t)c * p->S + i] = json_number_value(json_array_get(json_array_get(mg, (size_t)c), (size_t)i));
                p->ns[c] = json_number_value(json_array_get(json_object_get(per, "N_static"), (size_t)c));
                p->ni[c] = json_number_value(json_array_get(json_object_get(per, "N_input"), (size_t)c));
            }
            for (int i = 0; i < p->S; i++) p->pooled[i] = json_number_value(json_array_get(json_object_get(po, "mean_gate"), (size_t)i));
            p->p_ns = num(po, "N_static");
            p->p_ni = num(po, "N_input");
            p->p_peak = (int)json_integer_value(json_object_get(po, "peak"));
            snprintf(p->p_label, sizeof p->p_label, "%s", json_string_value(json_object_get(po, "label")) ?: "");
            json_t *cm = json_object_get(bo, "channel_mean"), *lab = json_object_get(bo, "labels");
            p->cm_ns = num(cm, "N_static");
            p->cm_ni = num(cm, "N_input");
            for (int k2 = 0; k2 < 3; k2++) p->nl[k2] = (int)json_integer_value(json_object_get(lab, ps_gate_labels[k2]));
            p->n_windows = json_integer_value(json_object_get(bo, "n_windows"));
            if (p->S > maxS) maxS = p->S;
            if (p->d > maxd) maxd = p->d;
            if ((int)b + 1 > x.cols) x.cols = (int)b + 1;
        }
    }
    if (!rc && x.n == 0) rc = ps_fail(err, "%s: no gates to draw", path);
    if (!rc) {
        x.cw = maxS <= 32 ? fmax(10, fmin(40, 320.0 / maxS)) : fmax(1, 320.0 / maxS);
        x.ch = fmax(1, fmin(14, 320.0 / maxd));
        x.heat_w = maxS * x.cw;
        x.heat_h = maxd * x.ch;
        x.panel_w = fmax(56 + x.heat_w + 24 + CHG_NPLOT_W + 110, 720);
        x.panel_h = CHG_HEAD_H + x.heat_h + 8 + CHG_BARS_H + 44;
        x.top = 84;
        char name[400];
        model_name(name, sizeof name, json_object_get(doc, "provenance"));
        snprintf(x.title, sizeof x.title, "Per-channel gate concentration — %s", name);
        snprintf(x.subtitle, sizeof x.subtitle,
                 "each channel's mean gate weight over the slots of its window (pooled over %lld windows); N_s = exp(H(mean gate)), "
                 "N_i = E[exp(H(α))]; dashed: N = 2 (concentrated)",
                 x.p[0].n_windows);
        x.fig_w = fmax(20 + x.cols * x.panel_w + 90, measure(x.subtitle, 13, 0) + 40);
        double H_px = x.top + (double)L * x.panel_h + 10;
        chunks ch;
        make_chunks(&ch, json_object_get(doc, "provenance"), x.title);
        if (x.fig_w > PS_FIG_MAX_SIDE || H_px > PS_FIG_MAX_SIDE)
            rc = ps_fail(err, "%s: %zu layers of per-channel gates need a %.0f x %.0f px figure (at most %.0f a side)", path, L, x.fig_w,
                         H_px, PS_FIG_MAX_SIDE);
        else
            rc = emit(out, "gate_concentration", x.fig_w, H_px, draw_chgates, &x, &ch, o, verbose, err);
    }
    free_chg(&x);
    return rc;
}

/* ---- training ---- */

typedef struct {
    int n_train, n_eval, n_gates;
    double *ts, *loss, *es, *acc, *gs;
    int L, H, W, sel; /* sel: (layer, head) panels drawn: every head, up to MAX_TRAIN_PANELS */
    double *mg;       /* [n_gates][L][H][2][W] */
    double *ns, *ni;  /* [n_gates][L][H][2] */
    double fig_w;
    char title[1024], subtitle[1024], section[256];
    int perch; /* per-channel gate records (V4's compressor): branch 0 = the pooled mean gate, branch 1 = where the
                  channels peak (the fraction of channels per slot); N: pooled / channel-mean N_static, N_input */
} train_ctx;

#define TR_TOP 84.0
#define TR_PLOT_H 200.0
#define TR_GATES (TR_TOP + TR_PLOT_H + 104.0) /* first row of gate panels */
#define TR_PW 600.0                           /* a (layer, head) panel */
#define TR_PH 172.0
#define TR_HM_H 90.0
#define TR_HM_W 150.0

static int train_cols(int sel) { return sel >= 2 ? 2 : 1; }

static void axes(cairo_t *cr, double x, double y, double w, double h, double x0, double x1, double y0, double y1,
                 double fs, const char *xl, const char *yl) {
    double t[32];
    int n = ps_nice_ticks(y0, y1, h < 150 ? 4 : 5, t, 32);
    cairo_set_line_width(cr, 1);
    for (int i = 0; i < n; i++) {
        if (t[i] > y1 || t[i] < y0) continue;
        double yy = round(y + h * (1 - (t[i] - y0) / (y1 - y0))) + 0.5;
        cairo_set_source_rgb(cr, 0.88, 0.88, 0.88);
        line(cr, x, yy, x + w, yy);
        cairo_set_source_rgb(cr, 0, 0, 0);
        line(cr, x - 4, yy, x, yy);
        char buf[32];
        ps_fmt_num(buf, sizeof buf, t[i]);
        ps_text(cr, x - 6, yy, buf, fs, 1, 0.5, 0, 0);
    }
    n = ps_nice_ticks(x0, x1, w < 250 ? 4 : 6, t, 32);
    /* (y ticks below y0 are skipped above: ranges padded below 0 keep 0 as their lowest tick) */
    for (int i = 0; i < n; i++) {
        double xx = round(x + w * (t[i] - x0) / (x1 - x0)) + 0.5;
        line(cr, xx, y + h, xx, y + h + 4);
        char buf[32];
        ps_fmt_num(buf, sizeof buf, t[i]);
        ps_text(cr, xx, y + h + 6, buf, fs, 0.5, 0, 0, 0);
    }
    cairo_rectangle(cr, x + 0.5, y + 0.5, w, h);
    cairo_stroke(cr);
    if (xl) ps_text(cr, x + w / 2, y + h + 8 + fs * 1.5, xl, fs + 1, 0.5, 0, 0, 0);
    if (yl) ps_text(cr, x - 50, y + h / 2, yl, fs + 1, 0.5, 0.5, -M_PI / 2, 0);
}

/* A polyline in data coordinates, clipped a few pixels outside the plot area (so values on its edge
 * stay visible on top of the frame). xs, ys: n values with strides. */
static void polyline(cairo_t *cr, const double *xs, const double *ys, ptrdiff_t ystride, int n, double x, double y, double w,
                     double h, double x0, double x1, double y0, double y1) {
    cairo_save(cr);
    cairo_rectangle(cr, x - 4, y - 4, w + 8, h + 8);
    cairo_clip(cr);
    for (int i = 0; i < n; i++) {
        double xx = x + w * (xs[i] - x0) / (x1 - x0), yy = y + h * (1 - (ys[i * ystride] - y0) / (y1 - y0));
        if (i == 0) cairo_move_to(cr, xx, yy);
        else cairo_line_to(cr, xx, yy);
    }
    cairo_stroke(cr);
    cairo_restore(cr);
}

/* key: filled circle; value: open square */
static void marker(cairo_t *cr, int kind, double x, double y) {
    if (kind == 0) {
        cairo_arc(cr, x, y, 3.2, 0, 2 * M_PI);
        cairo_fill(cr);
    } else {
        cairo_set_line_width(cr, 1.4);
        cairo_rectangle(cr, x - 4, y - 4, 8, 8);
        cairo_stroke(cr);
    }
}

static void nline_style(cairo_t *cr, int b, int q) {
    static const double dash[2] = {6, 3.5};
    ps_set_rgb(cr, ps_okabe_ito(b ? 3 : 0));
    cairo_set_line_width(cr, b ? 1.6 : 3.4); /* key drawn wide under the value line: both stay visible where they meet */
    cairo_set_dash(cr, q ? dash : NULL, q ? 2 : 0, 0);
}

static void draw_training(cairo_t *cr, void *vctx) {
    train_ctx *x = vctx;
    ps_text(cr, 20, 22, x->title, fit(cr, x->title, 17, x->fig_w - 40, 1), 0, 0.5, 0, 1);
    ps_text(cr, 20, 46, x->subtitle, fit(cr, x->subtitle, 12.5, x->fig_w - 40, 0), 0, 0.5, 0, 0);
    double smax = 1;
    for (int i = 0; i < x->n_train; i++) smax = fmax(smax, x->ts[i]);
    for (int i = 0; i < x->n_eval; i++) smax = fmax(smax, x->es[i]);
    double lmax = 0;
    for (int i = 0; i < x->n_train; i++)
        if (isfinite(x->loss[i])) lmax = fmax(lmax, x->loss[i]);
    /* y ranges padded a little beyond the data (0 and 1 included), so no curve runs along the frame */
    double ltop = lmax > 0 ? lmax * 1.06 : 1, lbot = -0.03 * ltop, abot = -0.03, atop = 1.05;
    double y = TR_TOP, h = TR_PLOT_H, w = 520, ax = 80, bx = 80 + w + 110;
    axes(cr, ax, y, w, h, 0, smax, lbot, ltop, 12, "training step", "training loss (nats)");
    ps_set_rgb(cr, ps_okabe_ito(0));
    cairo_set_line_width(cr, 2);
    polyline(cr, x->ts, x->loss, 1, x->n_train, ax, y, w, h, 0, smax, lbot, ltop);
    cairo_set_source_rgb(cr, 0, 0, 0);
    axes(cr, bx, y, w, h, 0, smax, abot, atop, 12, "training step", "held-out accuracy");
    ps_set_rgb(cr, ps_okabe_ito(3));
    cairo_set_line_width(cr, 2);
    polyline(cr, x->es, x->acc, 1, x->n_eval, bx, y, w, h, 0, smax, abot, atop);
    for (int i = 0; i < x->n_eval; i++) {
        cairo_arc(cr, bx + w * x->es[i] / smax, y + h * (1 - (x->acc[i] - abot) / (atop - abot)), 3, 0, 2 * M_PI);
        cairo_fill(cr);
    }
    cairo_set_source_rgb(cr, 0, 0, 0);
    if (!x->n_gates) return;
    /* gate evolution: per (layer, head): key and value offset × step heatmaps, then N_static / N_input */
    int ncol = train_cols(x->sel), ng = x->n_gates;
    double gmax = x->gs[ng - 1] > x->gs[0] ? x->gs[ng - 1] : x->gs[0] + 1, nmax = x->W * 1.08;
    ps_text(cr, 20, TR_GATES - 50, x->section, 15, 0, 0.5, 0, 1);
    const char *expl = x->perch ? "per layer: the channels' mean gate pooled over channels, and the fraction of channels peaking at each "
                                  "slot, over slots (rows) and logged steps (columns); N_static of the pooled gate and of the "
                                  "channels (mean), N_input"
                                : "per head: mean gate over offsets (rows) and logged steps (columns), key and value branch; effective "
                                  "offsets N_static = exp(H(mean gate)) and N_input = E[exp(H(α))]";
    ps_text(cr, 20, TR_GATES - 30, expl, fit(cr, expl, 12, x->fig_w - 40, 0), 0, 0.5, 0, 0);
    double cwk = TR_HM_W / ng;
    double st_t[32];
    int nst = ng > 1 ? ps_nice_ticks(x->gs[0], x->gs[ng - 1], 3, st_t, 32) : 0;
    int mstep = ng > 10 ? (ng + 9) / 10 : 1;
    ptrdiff_t kst = (ptrdiff_t)x->L * x->H * 2 * x->W; /* one record to the next in mg */
    for (int s = 0; s < x->sel; s++) {
        int l = s / x->H, hd = s % x->H;
        double px = 40 + (s % ncol) * TR_PW, py = TR_GATES + (s / ncol) * TR_PH, hy = py + 30;
        char buf[64];
        if (x->perch) snprintf(buf, sizeof buf, "layer %d (per-channel gate)", l);
        else snprintf(buf, sizeof buf, "layer %d, head %d", l, hd);
        cairo_set_source_rgb(cr, 0, 0, 0);
        ps_text(cr, px, py + 4, buf, 13, 0, 0.5, 0, 1);
        for (int b = 0; b < 2; b++) {
            double hx = px + 44 + b * (TR_HM_W + 16);
            size_t base = (((size_t)l * (size_t)x->H + (size_t)hd) * 2 + (size_t)b) * (size_t)x->W;
            ps_heatmap_strided(cr, hx, hy, TR_HM_W, TR_HM_H, x->mg + base, x->W, ng, 1, kst, ps_viridis, 0, 1);
            cairo_set_source_rgb(cr, 0, 0, 0);
            ps_text(cr, hx + TR_HM_W / 2, py + 20, x->perch ? (b ? "channels' peaks" : "pooled gate") : b ? "value gate" : "key gate", 12,
                    0.5, 0.5, 0, 0);
            if (b == 0) {
                int st = ps_tick_step(TR_HM_H / x->W, 11);
                for (int i = 0; i < x->W; i += st) {
                    snprintf(buf, sizeof buf, "%d", i);
                    ps_text(cr, hx - 4, hy + (i + 0.5) * TR_HM_H / x->W, buf, 10, 1, 0.5, 0, 0);
                }
                ps_text(cr, hx - 30, hy + TR_HM_H / 2, x->perch ? "slot" : "offset", 11, 0.5, 0.5, -M_PI / 2, 0);
            }
            for (int i = 0; i < nst; i++) { /* step ticks at round steps, placed between the logged columns */
                double fi = 0;
                for (int k = 0; k + 1 < ng; k++)
                    if (st_t[i] >= x->gs[k] && st_t[i] <= x->gs[k + 1]) {
                        fi = k + (x->gs[k + 1] > x->gs[k] ? (st_t[i] - x->gs[k]) / (x->gs[k + 1] - x->gs[k]) : 0);
                        break;
                    } else if (st_t[i] > x->gs[k + 1])
                        fi = k + 1;
                double cx = hx + (fi + 0.5) * cwk;
                line(cr, round(cx) + 0.5, hy + TR_HM_H, round(cx) + 0.5, hy + TR_HM_H + 3);
                ps_fmt_num(buf, sizeof buf, st_t[i]);
                ps_text(cr, cx, hy + TR_HM_H + 5, buf, 10, 0.5, 0, 0, 0);
            }
            ps_text(cr, hx + TR_HM_W / 2, hy + TR_HM_H + 20, "training step", 11, 0.5, 0, 0, 0);
        }
        double nx = px + 44 + 2 * (TR_HM_W + 16) + 32, nw = TR_PW - (nx - px) - 30;
        ps_text(cr, nx + nw / 2, py + 20, "effective offsets", 12, 0.5, 0.5, 0, 0);
        axes(cr, nx, hy, nw, TR_HM_H, fmin(0, x->gs[0]), gmax, 0, nmax, 10, "training step", NULL);
        for (int b = 0; b < 2; b++)
            for (int q = 0; q < 2; q++) {
                size_t idx = (((size_t)l * (size_t)x->H + (size_t)hd) * 2 + (size_t)b);
                const double *ys = (q ? x->ni : x->ns) + idx;
                ptrdiff_t yst = (ptrdiff_t)x->L * x->H * 2;
                nline_style(cr, b, q);
                polyline(cr, x->gs, ys, yst, ng, nx, hy, nw, TR_HM_H, fmin(0, x->gs[0]), gmax, 0, nmax);
                cairo_set_dash(cr, NULL, 0, 0);
                for (int k = 0; k < ng; k += mstep)
                    marker(cr, b, nx + nw * (x->gs[k] - fmin(0, x->gs[0])) / (gmax - fmin(0, x->gs[0])),
                           hy + TR_HM_H * (1 - ys[k * yst] / nmax));
            }
        cairo_set_source_rgb(cr, 0, 0, 0);
    }
    /* legend and colour bar, right of the first row */
    double lx = 40 + ncol * TR_PW + 6, ly = TR_GATES + 10;
    const char *nm[4] = {"key N_static", "key N_input", "value N_static", "value N_input"};
    if (x->perch) nm[0] = "pooled N_static", nm[1] = "N_input", nm[2] = "channel-mean N_static", nm[3] = "N_input";
    for (int b = 0; b < 2; b++)
        for (int q = 0; q < 2; q++) {
            double yy = ly + (b * 2 + q) * 22;
            nline_style(cr, b, q);
            line(cr, lx, yy, lx + 34, yy);
            cairo_set_dash(cr, NULL, 0, 0);
            marker(cr, b, lx + 17, yy);
            cairo_set_source_rgb(cr, 0, 0, 0);
            ps_text(cr, lx + 42, yy, nm[b * 2 + q], 12, 0, 0.5, 0, 0);
        }
    ps_colorbar(cr, lx, ly + 110, 16, 180, ps_viridis, 0, 1, "mean gate weight");
}

static void free_train(train_ctx *x) {
    free(x->ts);
    free(x->loss);
    free(x->es);
    free(x->acc);
    free(x->gs);
    free(x->mg);
    free(x->ns);
    free(x->ni);
}

static void train_size(train_ctx *x, double *w, double *h) {
    int ncol = train_cols(x->sel);
    *w = fmax(1290, 40 + ncol * TR_PW + 190);
    *h = x->n_gates ? TR_GATES + ((x->sel + ncol - 1) / ncol) * TR_PH + 4 : TR_TOP + TR_PLOT_H + 60;
    if (x->n_gates && *h < TR_GATES + 10 + 110 + 180 + 40) *h = TR_GATES + 10 + 110 + 180 + 40; /* the legend and colour bar (one row of panels) */
    x->fig_w = *w;
}

/* ---- loading ---- */

static json_t *load(const char *path, ps_error *err) {
    char *text;
    size_t len;
    if (ps_read_file(path, (size_t)1 << 30, &text, &len, err)) return NULL;
    json_error_t je;
    json_t *o = json_loadb(text, len, 0, &je);
    free(text);
    if (!o) ps_fail(err, "%s: not valid JSON (line %d: %s)", path, je.line, je.text);
    else if (!json_is_object(o) || !json_is_string(json_object_get(o, "kind"))) {
        json_decref(o);
        o = NULL;
        ps_fail(err, "%s: not a phasescope result file (no \"kind\")", path);
    }
    return o;
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
        if (json_integer_value(json_object_get(e, "n")) > 0 && num(e, "accuracy") < 0.5) {
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
    model_name(name, sizeof name, prov);
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
    const char *ak = json_string_value(json_object_get(json_object_get(json_object_get(prov, "config"), "attention"), "kind"));
    if (ak && (!strcmp(ak, "channel") || !strcmp(ak, "v4") || !strcmp(ak, "deepseek_v4"))) /* V4's compressor: its position bias is the per-slot parameter */
        snprintf(title, tn, "Gate cycling — %s: layer %lld; %sposition bias (ape) rolled by k = %+lld", name, layer,
                 br && !strcmp(br, "indexer") ? "the indexer's " : br && !strcmp(br, "both") && !strcmp(ak, "deepseek_v4") ? "compressor and indexer " : "", k);
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
                double acc = num(json_array_get(after, (size_t)fr), "accuracy");
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
                                 num(doc, "best_shift_correlation"));
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

static int render_curves(json_t *const *docs, const char *const *paths, int n, const char *out, const ps_render_opts *o,
                         int verbose, ps_error *err) {
    const char *kind = json_string_value(json_object_get(docs[0], "kind"));
    int gc = !strcmp(kind, "gatecycle");
    if (gc && n > 1) return ps_fail(err, "render: gate-cycling results are drawn one at a time");
    curves_ctx x = {0};
    x.chance = gc && json_is_number(json_object_get(docs[0], "chance")) ? num(docs[0], "chance") : NAN;
    x.c = calloc((size_t)(gc ? 2 : n), sizeof *x.c);
    if (!x.c) return ps_fail(err, "%s: out of memory", paths[0]);
    int rc = 0;
    int64_t P = -1;
    for (int i = 0; i < n && !rc; i++) {
        json_t *prov = json_object_get(docs[i], "provenance");
        char name[400];
        model_name(name, sizeof name, prov);
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
            json_t *ev = json_object_get(prov, "eval");
            if (n == 1) snprintf(x.title, sizeof x.title, "Phase sweep — %s", name);
            else snprintf(x.title, sizeof x.title, "Phase sweep — %d models", n);
            snprintf(x.headline, sizeof x.headline, "Accuracy per phase residue ρ (%s mode, %s filler, %lld prompts per shift)",
                     json_string_value(json_object_get(ev, "mode")) ?: "pad", json_string_value(json_object_get(ev, "family")) ?: "",
                     (long long)json_integer_value(json_object_get(ev, "n_prompts")));
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
        chunks ch;
        make_chunks(&ch, json_object_get(docs[0], "provenance"), x.title);
        rc = emit(out, gc ? "gatecycle_curve" : "phase_curve", CURVE_W, fmax(580, CURVE_T + 8 + x.n * 74 + 60), draw_curves, &x,
                  &ch, o, verbose, err);
    }
    free_curves(&x);
    return rc;
}

/* A training log's model: RUN/config.json next to the log, when there is one. */
static void run_name(char *buf, size_t n, const char *log_path) {
    char dir[4096], cfgp[4200];
    snprintf(dir, sizeof dir, "%s", log_path);
    char *d = dirname(dir);
    snprintf(cfgp, sizeof cfgp, "%s/config.json", d);
    char *text = NULL;
    size_t len = 0;
    ps_error e;
    json_t *cfg = NULL;
    if (!ps_read_file(cfgp, (size_t)1 << 20, &text, &len, &e)) {
        cfg = json_loadb(text, len, 0, NULL);
        free(text);
    }
    char abs[4096];
    snprintf(abs, sizeof abs, "%s", d);
    if (!strcmp(abs, ".")) {
        char *cwd = realpath(".", NULL);
        if (cwd) {
            snprintf(abs, sizeof abs, "%s", cwd);
            free(cwd);
        }
    }
    json_t *prov = json_object();
    if (prov) {
        json_object_set_new(prov, "model", json_string(abs));
        if (cfg) json_object_set(prov, "config", cfg);
        model_name(buf, n, prov);
        json_t *c = json_object_get(prov, "config");
        long long L = (long long)json_integer_value(json_object_get(c, "n_layers")), H = (long long)json_integer_value(json_object_get(c, "n_kv_heads"));
        if (L > 0 && H > 0) {
            size_t l = strlen(buf);
            snprintf(buf + l, n - l, ", %lld layer%s × %lld KV heads", L, L == 1 ? "" : "s", H);
        }
        json_decref(prov);
    } else
        snprintf(buf, n, "training run");
    json_decref(cfg);
}

static int render_training(const char *path, const char *out, const ps_render_opts *o, int verbose, ps_error *err) {
    char *text;
    size_t len;
    if (ps_read_file(path, (size_t)1 << 32, &text, &len, err)) return -1;
    train_ctx x = {0};
    size_t lines = 1;
    for (size_t i = 0; i < len; i++) lines += text[i] == '\n';
    x.ts = calloc(lines, sizeof(double));
    x.loss = calloc(lines, sizeof(double));
    x.es = calloc(lines, sizeof(double));
    x.acc = calloc(lines, sizeof(double));
    x.gs = calloc(lines, sizeof(double));
    json_t **gates = calloc(lines, sizeof(json_t *));
    int line_no = 0, rc = 0;
    if (!x.ts || !x.loss || !x.es || !x.acc || !x.gs || !gates) rc = ps_fail(err, "%s: out of memory", path);
    for (char *ln = rc ? NULL : strtok(text, "\n"); ln; ln = strtok(NULL, "\n")) {
        line_no++;
        json_error_t je;
        json_t *r = json_loads(ln, 0, &je);
        if (!r) {
            rc = ps_fail(err, "%s: line %d is not valid JSON (%s)", path, line_no, je.text);
            break;
        }
        const char *type = json_string_value(json_object_get(r, "type"));
        double step = (double)json_integer_value(json_object_get(r, "step"));
        if (type && !strcmp(type, "train")) {
            x.ts[x.n_train] = step;
            x.loss[x.n_train++] = num(r, "loss");
        } else if (type && !strcmp(type, "eval")) {
            x.es[x.n_eval] = step;
            x.acc[x.n_eval++] = num(r, "accuracy");
        } else if (type && !strcmp(type, "gates")) { /* per-head records, or per-channel ones ("gate": "per_channel") */
            int pc = json_object_get(r, "gate") != NULL;
            if (x.n_gates == 0) x.perch = pc;
            if (pc == x.perch) {
                x.gs[x.n_gates] = step;
                gates[x.n_gates++] = json_incref(r);
            }
        }
        json_decref(r);
    }
    free(text);
    if (!rc && x.n_train + x.n_eval == 0) rc = ps_fail(err, "%s: no train or eval records", path);
    if (!rc && x.n_gates) {
        json_t *layers = json_object_get(gates[0], "layers");
        json_t *h0 = json_array_get(json_object_get(json_array_get(layers, 0), "heads"), 0);
        size_t L = json_array_size(layers), H = json_array_size(json_object_get(json_array_get(layers, 0), "heads")),
               W = json_array_size(json_object_get(json_object_get(h0, "key"), "mean_gate"));
        if (x.perch) { /* one panel per layer: its first branch (the attention's compressor) */
            H = 1;
            W = (size_t)json_integer_value(json_object_get(json_array_get(layers, 0), "slots"));
        }
        if (L < 1 || L > MAX_LAYERS)
            rc = ps_fail(err, "%s: the first gates record's layers has %zu entries; a figure shows 1 to %d", path, L, MAX_LAYERS);
        else if (H < 1 || H > MAX_HEADS)
            rc = ps_fail(err, "%s: the first gates record's layers[0].heads has %zu entries; a figure shows 1 to %d", path, H, MAX_HEADS);
        else if (W < 1 || W > MAX_WINDOW)
            rc = ps_fail(err, "%s: the first gates record's mean_gate has %zu offsets; a figure shows 1 to %d", path, W, MAX_WINDOW);
        else if ((int64_t)x.n_gates * (int64_t)L * (int64_t)H * 2 * (int64_t)W > MAX_GATE_VALUES)
            rc = ps_fail(err, "%s: %d gates records × %zu layers × %zu heads × window %zu are more than a figure draws", path,
                         x.n_gates, L, H, W);
        if (!rc) {
            x.L = (int)L;
            x.H = (int)H;
            x.W = (int)W;
            x.sel = x.L * x.H < MAX_TRAIN_PANELS ? x.L * x.H : MAX_TRAIN_PANELS;
            size_t nb = (size_t)x.n_gates * L * H * 2; /* bounded above */
            x.mg = calloc(nb * W, sizeof(double));
            x.ns = calloc(nb, sizeof(double));
            x.ni = calloc(nb, sizeof(double));
            if (!x.mg || !x.ns || !x.ni) rc = ps_fail(err, "%s: out of memory", path);
        }
        for (int k = 0; k < x.n_gates && !rc && x.perch; k++)
            for (int l = 0; l < x.L; l++) {
                json_t *lo = json_array_get(json_object_get(gates[k], "layers"), (size_t)l);
                json_t *bo = json_array_get(json_object_get(lo, "branches"), 0), *po = json_object_get(bo, "pooled");
                json_t *pc = json_object_get(bo, "peak_counts");
                double d = (double)json_integer_value(json_object_get(bo, "channels"));
                if (json_integer_value(json_object_get(lo, "slots")) != x.W) {
                    rc = ps_fail(err, "%s: gates record %d, layer %d: %lld slots, the first record's layer 0 has %d", path, k, l,
                                 (long long)json_integer_value(json_object_get(lo, "slots")), x.W);
                    break;
                }
                for (int b = 0; b < 2; b++) {
                    size_t idx = ((size_t)k * (size_t)x.L + (size_t)l) * 2 + (size_t)b;
                    for (int i = 0; i < x.W; i++)
                        x.mg[idx * (size_t)x.W + (size_t)i] = b ? (d > 0 ? (double)json_integer_value(json_array_get(pc, (size_t)i)) / d : 0)
                                                                : json_number_value(json_array_get(json_object_get(po, "mean_gate"), (size_t)i));
                    x.ns[idx] = b ? num(json_object_get(bo, "channel_mean"), "N_static") : num(po, "N_static");
                    x.ni[idx] = num(po, "N_input");
                }
            }
        for (int k = 0; k < x.n_gates && !rc && !x.perch; k++)
            for (int l = 0; l < x.L; l++)
                for (int h = 0; h < x.H; h++)
                    for (int b = 0; b < 2; b++) {
                        json_t *bo = json_object_get(json_array_get(json_object_get(json_array_get(json_object_get(gates[k], "layers"), (size_t)l), "heads"), (size_t)h),
                                                     b ? "value" : "key");
                        size_t idx = (((size_t)k * (size_t)x.L + (size_t)l) * (size_t)x.H + (size_t)h) * 2 + (size_t)b;
                        for (int i = 0; i < x.W; i++) x.mg[idx * (size_t)x.W + (size_t)i] = json_number_value(json_array_get(json_object_get(bo, "mean_gate"), (size_t)i));
                        x.ns[idx] = num(bo, "N_static");
                        x.ni[idx] = num(bo, "N_input");
                    }
    }
    for (int k = 0; k < x.n_gates; k++) json_decref(gates[k]);
    free(gates);
    if (!rc) {
        char name[900];
        run_name(name, sizeof name, path);
        snprintf(x.title, sizeof x.title, "Training run — %s", name);
        snprintf(x.subtitle, sizeof x.subtitle, "loss of each logged batch; held-out accuracy (top-1, every answer token)%s",
                 x.n_gates ? "; gate statistics on held-out windows" : "");
        if (x.sel < x.L * x.H)
            snprintf(x.section, sizeof x.section, "Gate concentration during training: the first %d of %d (layer, KV head) pairs", x.sel,
                     x.L * x.H);
        else
            snprintf(x.section, sizeof x.section, "Gate concentration during training: every KV head (%d)", x.sel);
        if (x.perch) snprintf(x.section, sizeof x.section, "Per-channel gate concentration during training: %d layer%s", x.sel, x.sel == 1 ? "" : "s");
        chunks ch;
        snprintf(ch.command, sizeof ch.command, "phasescope train (log %s)", path);
        snprintf(ch.model, sizeof ch.model, "%s", path);
        snprintf(ch.title, sizeof ch.title, "%s", x.title);
        double W, H;
        train_size(&x, &W, &H);
        rc = emit(out, "training", W, H, draw_training, &x, &ch, o, verbose, err);
    }
    free_train(&x);
    return rc;
}

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
        line(cr, x, yy, x + w, yy);
        cairo_set_source_rgb(cr, 0, 0, 0);
        line(cr, x - 4, yy, x, yy);
        if (logy && (t[i] < -2 || t[i] > 2)) snprintf(buf, sizeof buf, "1e%d", (int)t[i]);
        else ps_fmt_num(buf, sizeof buf, logy ? pow(10, t[i]) : t[i]);
        ps_text(cr, x - 6, yy, buf, 11, 1, 0.5, 0, 0);
    }
    for (int d = 0; d <= (int)floor(lxmax + 1e-9); d++) {
        double xx = round(x + w * d / lxmax) + 0.5;
        cairo_set_source_rgb(cr, 0.88, 0.88, 0.88);
        if (d > 0) line(cr, xx, y, xx, y + h);
        cairo_set_source_rgb(cr, 0, 0, 0);
        line(cr, xx, y + h, xx, y + h + 4);
        if (d < 3) snprintf(buf, sizeof buf, "%d", d == 0 ? 1 : d == 1 ? 10 : 100);
        else snprintf(buf, sizeof buf, "1e%d", d);
        ps_text(cr, xx, y + h + 6, buf, 11, 0.5, 0, 0, 0);
        for (int m = 2; m < 10 && d + log10(m) < lxmax; m++) { /* minor ticks */
            double mx = round(x + w * (d + log10(m)) / lxmax) + 0.5;
            line(cr, mx, y + h, mx, y + h + 2);
        }
    }
    cairo_rectangle(cr, x + 0.5, y + 0.5, w, h);
    cairo_stroke(cr);
    ps_text(cr, x + w / 2, y + h + 24, "gradient step + 1 (log scale)", 12, 0.5, 0, 0, 0);
    if (yl) ps_text(cr, x - 44, y + h / 2, yl, 12, 0.5, 0.5, -M_PI / 2, 0);
}

static void draw_theory(cairo_t *cr, void *vctx) {
    theory_ctx *x = vctx;
    ps_text(cr, 20, 22, x->title, fit(cr, x->title, 17, x->fig_w - 40, 1), 0, 0.5, 0, 1);
    ps_text(cr, 20, 46, x->subtitle, fit(cr, x->subtitle, 12.5, x->fig_w - 40, 0), 0, 0.5, 0, 0);
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
    polyline(cr, x->lx, x->loss, 1, x->n, px[0], y, pw, h, 0, x->lxmax, -0.03 * lmax, lmax);
    cairo_set_source_rgb(cr, 0, 0, 0);
    theory_axes(cr, px[1], y, pw, h, x->lxmax, -0.03, 1.05, "accuracy (top-1)", 0);
    ps_set_rgb(cr, ps_okabe_ito(3));
    cairo_set_line_width(cr, 2);
    polyline(cr, x->lx, x->acc, 1, x->n, px[1], y, pw, h, 0, x->lxmax, -0.03, 1.05);
    cairo_set_source_rgb(cr, 0, 0, 0);
    theory_axes(cr, px[2], y, pw, h, x->lxmax, 0, tmax, x->learn ? "learned scale" : "scale (fixed)", 0);
    for (int b = 0; b < 2; b++) {
        ps_set_rgb(cr, ps_okabe_ito(b ? 2 : 5));
        cairo_set_line_width(cr, b ? 2 : 3.5);
        polyline(cr, x->lx, b ? x->mu : x->lam, 1, x->n, px[2], y, pw, h, 0, x->lxmax, 0, tmax);
        double ly = y + h - 40 + 18 * b;
        line(cr, px[2] + pw - 150, ly, px[2] + pw - 126, ly);
        cairo_set_source_rgb(cr, 0, 0, 0);
        ps_text(cr, px[2] + pw - 120, ly, b ? "μ (logit scale)" : "λ (score scale)", 11, 0, 0.5, 0, 0);
    }
    /* row 2: N_eff − 1 per head, key and value, log-log (a power law in time is a straight line) */
    double w2 = (x->fig_w - 70 - 80 - 330) / 2, y2 = TH_ROW2;
    ps_text(cr, 20, y2 - 48,
            "Effective offsets of every head over log time: N_eff − 1, N_eff = exp(H(gate)) (0 = one-hot, W − 1 = uniform), log scale", 15,
            0, 0.5, 0, 1);
    ps_text(cr, 20, y2 - 28, x->verdict, fit(cr, x->verdict, 12, x->fig_w - 40, 0), 0, 0.5, 0, 0);
    for (int b = 0; b < 2; b++) {
        double ax = 70 + b * (w2 + 80);
        theory_axes(cr, ax, y2, w2, TH_ROW2_H, x->lxmax, x->nlo, x->nhi, b ? "N_eff − 1, value gate" : "N_eff − 1, key gate", 1);
        for (int hd = 0; hd < x->H; hd++) {
            theory_head_style(cr, hd, 2.2);
            polyline(cr, x->lx, x->nl + (size_t)hd * 2 + (size_t)b, (ptrdiff_t)x->H * 2, x->n, ax, y2, w2, TH_ROW2_H, 0, x->lxmax, x->nlo,
                     x->nhi);
        }
        cairo_set_dash(cr, NULL, 0, 0);
        cairo_set_source_rgb(cr, 0, 0, 0);
    }
    /* legend: one line per head with its final peaks and N_eff */
    double lx = 70 + 2 * (w2 + 80) - 20, ly = y2 + 4;
    ps_text(cr, lx, ly, "head: key r → value peak; final N_key / N_value", fit(cr, "head: key r → value peak; final N_key / N_value", 11, x->fig_w - lx - 8, 1), 0, 0.5, 0, 1);
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
        line(cr, lx, yy, lx + 26, yy);
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
    double temp = num(pr, "temperature");
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
    ps_fmt_num(lr, sizeof lr, num(pr, "lr"));
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
    chunks ch;
    make_chunks(&ch, json_object_get(doc, "provenance"), x.title);
    double hh = fmin(300, fmax(60, 22.0 * x.H));
    x.fig_w = 1320;
    int rc = emit(out, "theory", x.fig_w, TH_ROW3 + hh + 50, draw_theory, &x, &ch, o, verbose, err);
    free_theory(&x);
    return rc;
}

/* ---- text filler experiments (fillers.json): delta against L, residues marked, families side by side ---- */

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
        line(cr, x, yy, x + w, yy);
        cairo_set_source_rgb(cr, 0, 0, 0);
        line(cr, x - 4, yy, x, yy);
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
        line(cr, xx, y + h, xx, y + h + 4);
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
    ps_text(cr, 20, 22, x->title, fit(cr, x->title, 17, W - 40, 1), 0, 0.5, 0, 1);
    ps_text(cr, 20, 46, x->headline, fit(cr, x->headline, 14, W - 40, 1), 0, 0.5, 0, 1);
    ps_text(cr, 20, 68, x->subtitle, fit(cr, x->subtitle, 12, W - 40, 0), 0, 0.5, 0, 0);
    double x0 = (double)x->Lmin - 0.5, x1 = (double)(x->Lmin + x->nL - 1) + 0.5;
    for (int f = 0; f < x->nf; f++) {
        double px = 40 + x->left + (f % x->cols) * fl_cell_w(x), py = FL_TOP + 44 + (f / x->cols) * FL_CELL_H;
        cairo_set_source_rgb(cr, 0, 0, 0);
        ps_text(cr, px, py - 30, x->name[f], fit(cr, x->name[f], 14, FL_PW, 1), 0, 0.5, 0, 1);
        ps_text(cr, px, py - 12, x->stats[f], fit(cr, x->stats[f], 12, FL_PW, 0), 0, 0.5, 0, 0);
        /* L ≡ 0 (mod P): faint vertical lines, where a new period starts */
        cairo_set_source_rgb(cr, 0.80, 0.80, 0.80);
        cairo_set_line_width(cr, 1);
        static const double dots[2] = {2, 3};
        cairo_set_dash(cr, dots, 2, 0);
        for (int64_t i = 0; i < x->nL; i++)
            if ((x->Lmin + i) % x->P == 0) {
                double xx = round(px + FL_PW * ((double)(x->Lmin + i) - x0) / (x1 - x0)) + 0.5;
                line(cr, xx, py, xx, py + FL_PH);
            }
        cairo_set_dash(cr, NULL, 0, 0);
        cairo_set_source_rgb(cr, 0, 0, 0);
        fl_axes(cr, px, py, FL_PW, FL_PH, x0, x1, x->y0, x->y1, "Δ = P(first) − P(second)");
        if (x->y0 < 0 && x->y1 > 0) { /* Δ = 0 */
            double yy = round(py + FL_PH * (1 - (0 - x->y0) / (x->y1 - x->y0))) + 0.5;
            cairo_set_source_rgb(cr, 0.45, 0.45, 0.45);
            cairo_set_line_width(cr, 1);
            line(cr, px, yy, px + FL_PW, yy);
        }
        double xs[4096];
        int n = (int)(x->nL < 4096 ? x->nL : 4096);
        for (int i = 0; i < n; i++) xs[i] = (double)(x->Lmin + i);
        cairo_set_source_rgb(cr, 0.55, 0.55, 0.55);
        cairo_set_line_width(cr, 1.2);
        polyline(cr, xs, x->d + f * x->nL, 1, n, px, py, FL_PW, FL_PH, x0, x1, x->y0, x->y1);
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
            double d = num(json_array_get(pts, (size_t)i), "delta");
            x.d[f * x.nL + i] = d;
            mn = fmin(mn, d);
            mx = fmax(mx, d);
        }
        char pt[32];
        ps_format_p(pt, sizeof pt, num(t, "p_value"));
        snprintf(x.name[f], sizeof x.name[f], "%s", json_string_value(json_object_get(fo, "name")) ?: "");
        snprintf(x.stats[f], sizeof x.stats[f], "η² %.2f across residues, permutation p %s%s", num(t, "eta2"), pt,
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
            w = fmax(w, measure(buf, 11, 0));
        }
        x.left = w + 40;
    }
    char name[400], c0[64] = "first", c1[64] = "second", pt[32];
    model_name(name, sizeof name, prov);
    json_t *cands = json_object_get(ex, "candidates");
    for (int k = 0; k < 2; k++) {
        const char *t = json_string_value(json_object_get(json_array_get(cands, (size_t)k), "text"));
        if (t) snprintf(k ? c1 : c0, sizeof c0, "\"%.56s\"", t);
    }
    json_t *pl = json_object_get(doc, "pooled");
    ps_format_p(pt, sizeof pt, num(pl, "p_value"));
    snprintf(x.title, sizeof x.title, "Filler experiment %s — %s", json_string_value(json_object_get(ex, "name")) ?: "", name);
    snprintf(x.headline, sizeof x.headline, "Δ = P(%s) − P(%s) against the filler length L, coloured by phase ρ = L mod %lld", c0, c1,
             (long long)x.P);
    char shown[64] = "";
    if (all_f > x.nf) snprintf(shown, sizeof shown, " (the first %d drawn)", x.nf);
    snprintf(x.subtitle, sizeof x.subtitle,
             "pooled over the %d families%s: η² %.2f, permutation p %s (%lld permutations); dotted lines: L ≡ 0 (mod %lld)", all_f,
             shown, num(pl, "eta2"), pt, (long long)json_integer_value(json_object_get(pl, "permutations")), (long long)x.P);
    chunks ch;
    make_chunks(&ch, prov, x.title);
    int rc = emit(out, "fillers", 40 + x.cols * fl_cell_w(&x), FL_TOP + x.rows * FL_CELL_H + 40, draw_fillers, &x, &ch, o, verbose, err);
    free(x.d);
    free(x.name);
    free(x.stats);
    return rc;
}

int ps_render(const char *const *paths, int n, const char *out, const ps_render_opts *o, int verbose, ps_error *err) {
    if (n < 1) return ps_fail(err, "render: no result file given");
    size_t l0 = strlen(paths[0]);
    if (l0 > 6 && !strcmp(paths[0] + l0 - 6, ".jsonl")) {
        if (n > 1) return ps_fail(err, "render: a training log (.jsonl) is drawn on its own");
        return render_training(paths[0], out, o, verbose, err);
    }
    json_t **docs = calloc((size_t)n, sizeof *docs);
    if (!docs) return ps_fail(err, "render: out of memory");
    int rc = 0;
    for (int i = 0; i < n && !rc; i++)
        if (!(docs[i] = load(paths[i], err))) rc = -1;
    if (!rc) rc = ps_render_docs(docs, paths, n, out, o, verbose, err);
    for (int i = 0; i < n; i++) json_decref(docs[i]);
    free(docs);
    return rc;
}

int ps_render_docs(json_t *const *docs, const char *const *paths, int n, const char *out, const ps_render_opts *o,
                   int verbose, ps_error *err) {
    if (n < 1) return ps_fail(err, "render: no result given");
    int rc = 0;
    const char *kind = NULL;
    for (int i = 0; i < n && !rc; i++) {
        const char *k = json_string_value(json_object_get(docs[i], "kind"));
        if (!k) return ps_fail(err, "%s: not a phasescope result file (no \"kind\")", paths[i]);
        if (!kind) kind = k;
        else if (strcmp(kind, k) && !(strstr("sweep gatecycle", kind) && !strcmp(k, "sweep")))
            rc = ps_fail(err, "%s: a %s result cannot share a figure with a %s result", paths[i], k, kind);
    }
    if (!rc) {
        if (!strcmp(kind, "sweep") || !strcmp(kind, "gatecycle")) rc = render_curves(docs, paths, n, out, o, verbose, err);
        else if (!strcmp(kind, "knockout")) rc = render_knockout(docs, paths, n, out, o, verbose, err);
        else if (!strcmp(kind, "theory")) {
            if (n > 1) rc = ps_fail(err, "render: theory results are drawn one at a time");
            else rc = render_theory(docs[0], paths[0], out, o, verbose, err);
        } else if (!strcmp(kind, "gates")) {
            if (n > 1) rc = ps_fail(err, "render: gates results are drawn one at a time");
            else {
                const char *gk = json_string_value(json_object_get(json_object_get(docs[0], "gates"), "gate"));
                rc = gk && !strcmp(gk, "per_channel") ? render_chgates(docs[0], paths[0], out, o, verbose, err)
                                                      : render_gates(docs[0], paths[0], out, o, verbose, err);
            }
        } else if (!strcmp(kind, "fillers")) {
            if (n > 1) rc = ps_fail(err, "render: filler experiments are drawn one at a time");
            else rc = render_fillers(docs[0], paths[0], out, o, verbose, err);
        } else
            rc = ps_fail(err, "%s: unknown result kind \"%s\"", paths[0], kind);
    }
    return rc;
}
