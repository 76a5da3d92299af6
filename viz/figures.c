#define _POSIX_C_SOURCE 200809L
#include "figures.h"

#include <jansson.h>
#include <libgen.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fileio.h"

static const ps_rgb PALETTE[8] = {{0.122, 0.467, 0.706}, {0.839, 0.153, 0.157}, {0.173, 0.627, 0.173},
                                  {1.000, 0.498, 0.055}, {0.580, 0.404, 0.741}, {0.549, 0.337, 0.294},
                                  {0.890, 0.467, 0.761}, {0.498, 0.498, 0.498}};

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

/* ---- phase curves ---- */

typedef struct {
    char label[256], stats[256], stats2[256];
    int64_t P;
    double acc[4096], lo[4096], hi[4096], mean, min;
    int64_t argmin;
} curve;

typedef struct {
    int n;
    curve *c;
    char title[1024], subtitle[1024];
} curves_ctx;

static void fill_curve(curve *c, json_t *cj, const char *label) {
    snprintf(c->label, sizeof c->label, "%s", label);
    json_t *res = json_object_get(cj, "residues");
    c->P = (int64_t)json_array_size(res);
    if (c->P > 4096) c->P = 4096;
    c->min = 2;
    c->argmin = 0;
    for (int64_t r = 0; r < c->P; r++) {
        json_t *e = json_array_get(res, (size_t)r);
        c->acc[r] = num(e, "accuracy");
        c->lo[r] = num(e, "wilson_lo");
        c->hi[r] = num(e, "wilson_hi");
        if (json_integer_value(json_object_get(e, "n")) > 0 && c->acc[r] < c->min) {
            c->min = c->acc[r];
            c->argmin = r;
        }
    }
    c->mean = num(cj, "mean_accuracy");
    json_t *dp = json_object_get(cj, "dominant_period"), *cs = json_object_get(cj, "chi_square");
    snprintf(c->stats, sizeof c->stats, "mean %.3f, min %.3f, gap %.1f pp", c->mean, num(cj, "min_accuracy"), num(cj, "gap_pp"));
    double p = num(cs, "p_value");
    if (json_is_number(json_object_get(dp, "period")))
        snprintf(c->stats2, sizeof c->stats2, "period %.3g, chi-square p = %.2g", num(dp, "period"), p);
    else
        snprintf(c->stats2, sizeof c->stats2, "no period (flat), chi-square p = %.2g", p);
}

static void draw_curves(cairo_t *cr, void *vctx) {
    curves_ctx *x = vctx;
    double W = 960, L = 80, R = 300, T = 70, B = 70, pw = W - L - R, ph = 560 - T - B;
    int64_t P = x->c[0].P;
    ps_text(cr, L, 24, x->title, 17, 0, 0.5, 0, 1);
    ps_text(cr, L, 46, x->subtitle, 12, 0, 0.5, 0, 0);
    /* axes and grid */
    cairo_set_line_width(cr, 1);
    for (int i = 0; i <= 5; i++) {
        double yv = i / 5.0, y = round(T + ph * (1 - yv)) + 0.5;
        cairo_set_source_rgb(cr, 0.88, 0.88, 0.88);
        line(cr, L, y, L + pw, y);
        cairo_set_source_rgb(cr, 0, 0, 0);
        char buf[16];
        snprintf(buf, sizeof buf, "%.1f", yv);
        ps_text(cr, L - 8, y, buf, 12, 1, 0.5, 0, 0);
    }
    double dx = pw / (double)P; /* residue r sits at the centre of its slot */
    int step = ps_tick_step(dx, ps_text_width(cr, "000", 12, 0) + 6);
    for (int64_t r = 0; r < P; r += step) {
        double xx = L + dx * ((double)r + 0.5);
        cairo_set_source_rgb(cr, 0, 0, 0);
        line(cr, round(xx) + 0.5, T + ph, round(xx) + 0.5, T + ph + 5);
        char buf[32];
        snprintf(buf, sizeof buf, "%lld", (long long)r);
        ps_text(cr, xx, T + ph + 9, buf, 12, 0.5, 0, 0, 0);
    }
    cairo_set_source_rgb(cr, 0, 0, 0);
    cairo_rectangle(cr, L + 0.5, T + 0.5, pw, ph);
    cairo_stroke(cr);
    char xl[128];
    snprintf(xl, sizeof xl, "phase residue rho = t_K mod %lld", (long long)P);
    ps_text(cr, L + pw / 2, T + ph + 34, xl, 13, 0.5, 0, 0, 0);
    ps_text(cr, L - 52, T + ph / 2, "accuracy (top-1), 95% Wilson interval", 13, 0.5, 0.5, -M_PI / 2, 0);
    /* curves */
    for (int i = 0; i < x->n; i++) {
        curve *c = &x->c[i];
        ps_rgb col = PALETTE[i % 8];
        double off = x->n > 1 ? (i - (x->n - 1) / 2.0) * fmin(4, dx / (x->n + 2)) : 0;
        cairo_set_source_rgb(cr, col.r, col.g, col.b);
        cairo_set_line_width(cr, 1.2);
        for (int64_t r = 0; r < c->P; r++) { /* error bars */
            double xx = (L + dx * ((double)r + 0.5)) + off;
            line(cr, xx, T + ph * (1 - c->lo[r]), xx, T + ph * (1 - c->hi[r]));
            line(cr, xx - 3, T + ph * (1 - c->lo[r]), xx + 3, T + ph * (1 - c->lo[r]));
            line(cr, xx - 3, T + ph * (1 - c->hi[r]), xx + 3, T + ph * (1 - c->hi[r]));
        }
        cairo_set_line_width(cr, 2);
        for (int64_t r = 0; r < c->P; r++) {
            double xx = (L + dx * ((double)r + 0.5)) + off, yy = T + ph * (1 - c->acc[r]);
            if (r == 0) cairo_move_to(cr, xx, yy);
            else cairo_line_to(cr, xx, yy);
        }
        cairo_stroke(cr);
        for (int64_t r = 0; r < c->P; r++) {
            double xx = (L + dx * ((double)r + 0.5)) + off, yy = T + ph * (1 - c->acc[r]);
            cairo_arc(cr, xx, yy, 3.2, 0, 2 * M_PI);
            cairo_fill(cr);
        }
        /* mean: dashed line; min: open ring */
        double dash[2] = {6, 4};
        cairo_set_dash(cr, dash, 2, 0);
        cairo_set_line_width(cr, 1.3);
        line(cr, L, T + ph * (1 - c->mean), L + pw, T + ph * (1 - c->mean));
        cairo_set_dash(cr, NULL, 0, 0);
        double mx = (L + dx * ((double)c->argmin + 0.5)) + off, my = T + ph * (1 - c->acc[c->argmin]);
        cairo_set_line_width(cr, 2);
        cairo_arc(cr, mx, my, 8, 0, 2 * M_PI);
        cairo_stroke(cr);
        /* legend */
        double ly = T + 8 + i * 70;
        cairo_set_line_width(cr, 2);
        line(cr, L + pw + 20, ly + 6, L + pw + 44, ly + 6);
        cairo_arc(cr, L + pw + 32, ly + 6, 3.2, 0, 2 * M_PI);
        cairo_fill(cr);
        cairo_set_source_rgb(cr, 0, 0, 0);
        ps_text(cr, L + pw + 52, ly + 6, c->label, 12, 0, 0.5, 0, 1);
        ps_text(cr, L + pw + 52, ly + 24, c->stats, 11, 0, 0.5, 0, 0);
        ps_text(cr, L + pw + 52, ly + 40, c->stats2, 11, 0, 0.5, 0, 0);
    }
    double ky = T + 8 + x->n * 70 + 10;
    cairo_set_source_rgb(cr, 0.2, 0.2, 0.2);
    double dash[2] = {6, 4};
    cairo_set_dash(cr, dash, 2, 0);
    cairo_set_line_width(cr, 1.3);
    line(cr, L + pw + 20, ky, L + pw + 44, ky);
    cairo_set_dash(cr, NULL, 0, 0);
    ps_text(cr, L + pw + 52, ky, "mean accuracy", 11, 0, 0.5, 0, 0);
    cairo_arc(cr, L + pw + 32, ky + 20, 7, 0, 2 * M_PI);
    cairo_stroke(cr);
    ps_text(cr, L + pw + 52, ky + 20, "worst residue (min)", 11, 0, 0.5, 0, 0);
}

/* ---- knockout heatmaps ---- */

typedef struct {
    char name[512];
    int rows, cols;
    int *layer, *head;
    double *v;
} grid;

typedef struct {
    int n;
    grid *g;
    double vmax;
    int acc;
    char title[1024], subtitle[1024];
    double cw, ch, panel_w, left;
} ko_ctx;

static void draw_knockout(cairo_t *cr, void *vctx) {
    ko_ctx *x = vctx;
    double T = 96;
    ps_text(cr, 20, 24, x->title, 17, 0, 0.5, 0, 1);
    ps_text(cr, 20, 46, x->subtitle, 12, 0, 0.5, 0, 0);
    double px = x->left;
    for (int k = 0; k < x->n; k++) {
        grid *g = &x->g[k];
        double w = g->cols * x->cw, h = g->rows * x->ch;
        ps_text(cr, px + w / 2, T - 22, g->name, 13, 0.5, 0.5, 0, 1);
        ps_heatmap(cr, px, T, w, h, g->v, g->rows, g->cols, ps_diverging, -x->vmax, x->vmax);
        /* layer groups: separators and labels; head labels when they fit */
        cairo_set_source_rgb(cr, 0, 0, 0);
        int r0 = 0;
        for (int r = 1; r <= g->rows; r++)
            if (r == g->rows || g->layer[r] != g->layer[r0]) {
                double yc = T + (r0 + r) / 2.0 * x->ch;
                char buf[32];
                snprintf(buf, sizeof buf, "layer %d", g->layer[r0]);
                if ((r - r0) * x->ch >= 9 || r0 == 0 || g->rows <= 64)
                    ps_text(cr, px - (x->ch >= 10 ? 34 : 6), yc, buf, x->ch >= 10 ? 12 : 10, 1, 0.5, 0, 1);
                if (r < g->rows) {
                    cairo_set_line_width(cr, 2);
                    line(cr, px - 4, round(T + r * x->ch), px + w, round(T + r * x->ch));
                }
                r0 = r;
            }
        if (x->ch >= 10)
            for (int r = 0; r < g->rows; r++) {
                char buf[16];
                snprintf(buf, sizeof buf, "h%d", g->head[r]);
                ps_text(cr, px - 4, T + (r + 0.5) * x->ch, buf, fmin(11, x->ch - 1), 1, 0.5, 0, 0);
            }
        int step = ps_tick_step(x->cw, ps_text_width(cr, "00", 11, 0) + 4);
        for (int c = 0; c < g->cols; c += step) {
            char buf[16];
            snprintf(buf, sizeof buf, "%d", c);
            ps_text(cr, px + (c + 0.5) * x->cw, T + h + 6, buf, 11, 0.5, 0, 0, 0);
        }
        ps_text(cr, px + w / 2, T + h + 26, "phase residue rho", 12, 0.5, 0, 0, 0);
        px += x->panel_w;
    }
    double maxh = 0;
    for (int k = 0; k < x->n; k++) maxh = fmax(maxh, x->g[k].rows * x->ch);
    ps_colorbar(cr, px - x->panel_w + x->g[x->n - 1].cols * x->cw + 30, T, 18, fmin(fmax(maxh, 260), 420), ps_diverging, -x->vmax, x->vmax,
                x->acc ? "change in accuracy (pp)" : "change in mean target NLL (nats)");
}

/* ---- gate concentration ---- */

typedef struct {
    int L, H, W;
    double *mg;          /* [L][H][2][W] */
    double *ns, *ni;     /* [L][H][2] */
    int *peak;           /* [L][H][2] */
    char title[1024], subtitle[1024];
    double cw, ch;
} gates_ctx;

static void draw_gates(cairo_t *cr, void *vctx) {
    gates_ctx *x = vctx;
    ps_text(cr, 20, 24, x->title, 17, 0, 0.5, 0, 1);
    ps_text(cr, 20, 46, x->subtitle, 12, 0, 0.5, 0, 0);
    double T = 100, left = 90, bw = x->W * x->cw, textw = 190, rowh = x->H * x->ch + 56;
    for (int b = 0; b < 2; b++)
        ps_text(cr, left + b * (bw + textw) + bw / 2, T - 34, b ? "value gate" : "key gate", 13, 0.5, 0.5, 0, 1);
    for (int l = 0; l < x->L; l++) {
        double y = T + l * rowh;
        char buf[64];
        snprintf(buf, sizeof buf, "layer %d", l);
        ps_text(cr, 14, y + x->H * x->ch / 2, buf, 13, 0, 0.5, 0, 1);
        for (int b = 0; b < 2; b++) {
            double px = left + b * (bw + textw);
            double *v = malloc((size_t)(x->H * x->W) * sizeof(double));
            for (int h = 0; h < x->H; h++)
                for (int i = 0; i < x->W; i++) v[h * x->W + i] = x->mg[(((size_t)l * x->H + h) * 2 + b) * x->W + i];
            ps_heatmap(cr, px, y, bw, x->H * x->ch, v, x->H, x->W, ps_viridis, 0, 1);
            free(v);
            cairo_set_source_rgb(cr, 0, 0, 0);
            for (int h = 0; h < x->H; h++) {
                size_t k = ((size_t)l * x->H + h) * 2 + b;
                snprintf(buf, sizeof buf, "h%d", h);
                if (x->ch >= 9) ps_text(cr, px - 4, y + (h + 0.5) * x->ch, buf, fmin(11, x->ch - 1), 1, 0.5, 0, 0);
                snprintf(buf, sizeof buf, "N_s %.2f  N_i %.2f  r=%d", x->ns[k], x->ni[k], x->peak[k]);
                if (x->ch >= 9) ps_text(cr, px + bw + 6, y + (h + 0.5) * x->ch, buf, fmin(10.5, x->ch - 1), 0, 0.5, 0, 0);
            }
            int step = ps_tick_step(x->cw, ps_text_width(cr, "00", 10, 0) + 3);
            for (int i = 0; i < x->W; i += step) {
                snprintf(buf, sizeof buf, "%d", i);
                ps_text(cr, px + (i + 0.5) * x->cw, y + x->H * x->ch + 4, buf, 10, 0.5, 0, 0, 0);
            }
            ps_text(cr, px + bw / 2, y + x->H * x->ch + 20, "offset i in the window", 11, 0.5, 0, 0, 0);
        }
    }
    ps_colorbar(cr, left + 2 * (bw + textw) + 10, T, 18, fmin(300, fmax(120, x->L * rowh - 56)), ps_viridis, 0, 1,
                "mean gate weight E[alpha_i]");
}

/* ---- training ---- */

typedef struct {
    int n_train, n_eval, n_gates;
    double *ts, *loss, *es, *acc, *gs;
    int L, H, W, sel;      /* sel: (layer, head) panels drawn */
    double *mg;            /* [n_gates][L][H][2][W] */
    double *ns, *ni;       /* [n_gates][L][H][2] */
    char title[1024], subtitle[1024];
} train_ctx;

static void axes(cairo_t *cr, double x, double y, double w, double h, double x0, double x1, double y0, double y1,
                 const char *xl, const char *yl) {
    double t[32];
    int n = ps_nice_ticks(y0, y1, 5, t, 32);
    cairo_set_line_width(cr, 1);
    for (int i = 0; i < n; i++) {
        double yy = round(y + h * (1 - (t[i] - y0) / (y1 - y0))) + 0.5;
        cairo_set_source_rgb(cr, 0.88, 0.88, 0.88);
        line(cr, x, yy, x + w, yy);
        cairo_set_source_rgb(cr, 0, 0, 0);
        char buf[32];
        ps_fmt_num(buf, sizeof buf, t[i]);
        ps_text(cr, x - 6, yy, buf, 11, 1, 0.5, 0, 0);
    }
    n = ps_nice_ticks(x0, x1, 6, t, 32);
    for (int i = 0; i < n; i++) {
        double xx = round(x + w * (t[i] - x0) / (x1 - x0)) + 0.5;
        line(cr, xx, y + h, xx, y + h + 4);
        char buf[32];
        ps_fmt_num(buf, sizeof buf, t[i]);
        ps_text(cr, xx, y + h + 7, buf, 11, 0.5, 0, 0, 0);
    }
    cairo_rectangle(cr, x + 0.5, y + 0.5, w, h);
    cairo_stroke(cr);
    ps_text(cr, x + w / 2, y + h + 26, xl, 12, 0.5, 0, 0, 0);
    ps_text(cr, x - 50, y + h / 2, yl, 12, 0.5, 0.5, -M_PI / 2, 0);
}

static void polyline(cairo_t *cr, const double *xs, const double *ys, int n, double x, double y, double w, double h,
                     double x0, double x1, double y0, double y1) {
    for (int i = 0; i < n; i++) {
        double xx = x + w * (xs[i] - x0) / (x1 - x0), yy = y + h * (1 - (ys[i] - y0) / (y1 - y0));
        if (i == 0) cairo_move_to(cr, xx, yy);
        else cairo_line_to(cr, xx, yy);
    }
    cairo_stroke(cr);
}

static void draw_training(cairo_t *cr, void *vctx) {
    train_ctx *x = vctx;
    ps_text(cr, 20, 24, x->title, 17, 0, 0.5, 0, 1);
    ps_text(cr, 20, 46, x->subtitle, 12, 0, 0.5, 0, 0);
    double smax = 1;
    for (int i = 0; i < x->n_train; i++) smax = fmax(smax, x->ts[i]);
    for (int i = 0; i < x->n_eval; i++) smax = fmax(smax, x->es[i]);
    double lmax = 0;
    for (int i = 0; i < x->n_train; i++) lmax = fmax(lmax, x->loss[i]);
    double y = 80, h = 230, w = 400;
    axes(cr, 80, y, w, h, 0, smax, 0, lmax > 0 ? lmax * 1.05 : 1, "training step", "training loss (nats)");
    cairo_set_source_rgb(cr, PALETTE[0].r, PALETTE[0].g, PALETTE[0].b);
    cairo_set_line_width(cr, 1.8);
    polyline(cr, x->ts, x->loss, x->n_train, 80, y, w, h, 0, smax, 0, lmax > 0 ? lmax * 1.05 : 1);
    cairo_set_source_rgb(cr, 0, 0, 0);
    axes(cr, 80 + w + 110, y, w, h, 0, smax, 0, 1, "training step", "held-out accuracy");
    cairo_set_source_rgb(cr, PALETTE[1].r, PALETTE[1].g, PALETTE[1].b);
    polyline(cr, x->es, x->acc, x->n_eval, 80 + w + 110, y, w, h, 0, smax, 0, 1);
    for (int i = 0; i < x->n_eval; i++) {
        cairo_arc(cr, 80 + w + 110 + w * x->es[i] / smax, y + h * (1 - x->acc[i]), 3, 0, 2 * M_PI);
        cairo_fill(cr);
    }
    cairo_set_source_rgb(cr, 0, 0, 0);
    if (!x->n_gates) return;
    /* gate evolution: per (layer, head): key and value offset × step heatmaps, then N_static / N_input */
    double top = y + h + 90, ph = 120, hw = 270;
    ps_text(cr, 20, top - 30, "Gate concentration during training (held-out windows)", 15, 0, 0.5, 0, 1);
    for (int s = 0; s < x->sel; s++) {
        int l = s / x->H, hd = s % x->H;
        double yy = top + s * (ph + 70);
        char buf[64];
        snprintf(buf, sizeof buf, "layer %d, head %d", l, hd);
        ps_text(cr, 20, yy - 12, buf, 13, 0, 0.5, 0, 1);
        for (int b = 0; b < 2; b++) {
            double px = 80 + b * (hw + 70);
            double *v = malloc((size_t)(x->W * x->n_gates) * sizeof(double));
            for (int i = 0; i < x->W; i++)
                for (int k = 0; k < x->n_gates; k++)
                    v[i * x->n_gates + k] = x->mg[((((size_t)k * x->L + l) * x->H + hd) * 2 + b) * x->W + i];
            ps_heatmap(cr, px, yy, hw, ph, v, x->W, x->n_gates, ps_viridis, 0, 1);
            free(v);
            int st = ps_tick_step(ph / x->W, 12);
            for (int i = 0; i < x->W; i += st) {
                snprintf(buf, sizeof buf, "%d", i);
                ps_text(cr, px - 4, yy + (i + 0.5) * ph / x->W, buf, 10, 1, 0.5, 0, 0);
            }
            ps_text(cr, px - 26, yy + ph / 2, "offset", 11, 0.5, 0.5, -M_PI / 2, 0);
            snprintf(buf, sizeof buf, "%s gate: mean_gate, step 0 .. %.0f", b ? "value" : "key", x->gs[x->n_gates - 1]);
            ps_text(cr, px + hw / 2, yy + ph + 6, buf, 11, 0.5, 0, 0, 0);
        }
        double px = 80 + 2 * (hw + 70), nmax = x->W;
        axes(cr, px, yy, hw, ph, 0, x->gs[x->n_gates - 1] > 0 ? x->gs[x->n_gates - 1] : 1, 0, nmax * 1.05, "training step",
             "effective offsets");
        for (int b = 0; b < 2; b++)
            for (int q = 0; q < 2; q++) {
                double *ys = malloc((size_t)x->n_gates * sizeof(double));
                for (int k = 0; k < x->n_gates; k++) {
                    size_t idx = (((size_t)k * x->L + l) * x->H + hd) * 2 + b;
                    ys[k] = q ? x->ni[idx] : x->ns[idx];
                }
                ps_rgb c = PALETTE[b * 2 + q];
                cairo_set_source_rgb(cr, c.r, c.g, c.b);
                cairo_set_line_width(cr, 1.8);
                if (q) {
                    double dash[2] = {5, 3};
                    cairo_set_dash(cr, dash, 2, 0);
                }
                polyline(cr, x->gs, ys, x->n_gates, px, yy, hw, ph, 0, x->gs[x->n_gates - 1] > 0 ? x->gs[x->n_gates - 1] : 1, 0,
                         nmax * 1.05);
                cairo_set_dash(cr, NULL, 0, 0);
                free(ys);
                if (s == 0) {
                    const char *nm[4] = {"key N_static", "key N_input", "value N_static", "value N_input"};
                    double lx = px + hw + 14, ly = yy + 10 + (b * 2 + q) * 18;
                    if (q) {
                        double dash[2] = {5, 3};
                        cairo_set_dash(cr, dash, 2, 0);
                    }
                    line(cr, lx, ly, lx + 22, ly);
                    cairo_set_dash(cr, NULL, 0, 0);
                    cairo_set_source_rgb(cr, 0, 0, 0);
                    ps_text(cr, lx + 28, ly, nm[b * 2 + q], 11, 0, 0.5, 0, 0);
                }
                cairo_set_source_rgb(cr, 0, 0, 0);
            }
    }
    ps_colorbar(cr, 80 + 2 * (hw + 70) + hw + 140, top + 100, 16, 160, ps_viridis, 0, 1, "mean gate weight");
}

/* ---- loading ---- */

static double ps_effective_offsets_f(const double *p, int n) {
    double h = 0;
    for (int i = 0; i < n; i++)
        if (p[i] > 0) h -= p[i] * log(p[i]);
    return exp(h);
}

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

static int render_curves(json_t **docs, const char *const *paths, int n, const char *out, const ps_render_opts *o,
                         int verbose, ps_error *err) {
    const char *kind = json_string_value(json_object_get(docs[0], "kind"));
    int gc = !strcmp(kind, "gatecycle");
    curves_ctx x = {0};
    x.c = calloc((size_t)(gc ? 2 * n : n), sizeof *x.c);
    if (!x.c) return ps_fail(err, "out of memory");
    int64_t P = -1;
    for (int i = 0; i < n; i++) {
        json_t *prov = json_object_get(docs[i], "provenance");
        char name[400];
        model_name(name, sizeof name, prov);
        if (gc) {
            json_t *cy = json_object_get(docs[i], "cycle");
            char lb[600];
            fill_curve(&x.c[x.n++], json_object_get(docs[i], "before"), "before cycling");
            const char *br = json_string_value(json_object_get(cy, "branch")), *pa = json_string_value(json_object_get(cy, "params"));
            snprintf(lb, sizeof lb, "after: layer %lld %s%s rolled by %+lld", (long long)json_integer_value(json_object_get(cy, "layer")),
                     br && !strcmp(br, "both") ? "" : br ? br : "", pa && !strcmp(pa, "gate") ? (br && strcmp(br, "both") ? " gate" : "gates")
                                                   : pa && !strcmp(pa, "payload") ? (br && strcmp(br, "both") ? " payload" : "payloads")
                                                                                 : (br && strcmp(br, "both") ? " gate+payload" : "gates+payloads"),
                     (long long)json_integer_value(json_object_get(cy, "shift")));
            fill_curve(&x.c[x.n++], json_object_get(docs[i], "after"), lb);
            snprintf(x.title, sizeof x.title, "Gate cycling — %s", name);
            snprintf(x.subtitle, sizeof x.subtitle, "accuracy curve shifts by %+lld residues (best-aligning shift, correlation %.2f); %s",
                     (long long)json_integer_value(json_object_get(docs[i], "best_shift_signed")),
                     num(docs[i], "best_shift_correlation"), paths[i]);
        } else {
            fill_curve(&x.c[x.n++], json_object_get(docs[i], "curve"), name);
            json_t *ev = json_object_get(prov, "eval");
            if (n == 1) snprintf(x.title, sizeof x.title, "Phase sweep — %s", name);
            else snprintf(x.title, sizeof x.title, "Phase sweep — %d models", n);
            snprintf(x.subtitle, sizeof x.subtitle, "%s mode, %s filler, %lld prompts per shift; accuracy per phase residue",
                     json_string_value(json_object_get(ev, "mode")) ?: "pad", json_string_value(json_object_get(ev, "family")) ?: "",
                     (long long)json_integer_value(json_object_get(ev, "n_prompts")));
        }
        if (P >= 0 && x.c[x.n - 1].P != P) {
            free(x.c);
            return ps_fail(err, "%s: period %lld differs from the first file's %lld; curves share one axis", paths[i],
                           (long long)x.c[x.n - 1].P, (long long)P);
        }
        P = x.c[x.n - 1].P;
    }
    chunks ch;
    make_chunks(&ch, json_object_get(docs[0], "provenance"), x.title);
    int rc = emit(out, gc ? "gatecycle_curve" : "phase_curve", 960, fmax(560, 70 + x.n * 70 + 120), draw_curves, &x, &ch, o,
                  verbose, err);
    free(x.c);
    return rc;
}

static int render_knockout(json_t **docs, const char *const *paths, int n, const char *out, const ps_render_opts *o,
                           int verbose, ps_error *err) {
    (void)paths;
    ko_ctx x = {0};
    x.n = n;
    x.acc = o && o->measure && !strcmp(o->measure, "acc");
    x.g = calloc((size_t)n, sizeof *x.g);
    int maxrows = 0, maxcols = 0;
    for (int k = 0; k < n; k++) {
        json_t *grid_j = json_object_get(docs[k], "grid"), *cells = json_object_get(grid_j, "cells");
        grid *g = &x.g[k];
        model_name(g->name, sizeof g->name, json_object_get(docs[k], "provenance"));
        g->rows = (int)json_array_size(cells);
        g->cols = (int)json_integer_value(json_object_get(grid_j, "period"));
        if (g->cols < 1 || g->cols > 4096 || g->rows > 100000) {
            int rows = g->rows, cols = g->cols;
            for (int j = 0; j < k; j++) {
                free(x.g[j].layer);
                free(x.g[j].head);
                free(x.g[j].v);
            }
            free(x.g);
            return ps_fail(err, "%s: knockout grid with %d cells of period %d is malformed", paths[k], rows, cols);
        }
        g->layer = calloc((size_t)g->rows + 1, sizeof(int));
        g->head = calloc((size_t)g->rows + 1, sizeof(int));
        g->v = calloc((size_t)(g->rows * g->cols) + 1, sizeof(double));
        for (int r = 0; r < g->rows; r++) {
            json_t *cell = json_array_get(cells, (size_t)r), *res = json_object_get(cell, "residues");
            g->layer[r] = (int)json_integer_value(json_object_get(cell, "layer"));
            g->head[r] = (int)json_integer_value(json_object_get(cell, "head"));
            for (int c = 0; c < g->cols; c++) {
                json_t *e = json_array_get(res, (size_t)c);
                double v = json_integer_value(json_object_get(e, "n")) > 0 ? num(e, x.acc ? "delta_accuracy_pp" : "delta_nll") : NAN;
                g->v[r * g->cols + c] = v;
                if (!isnan(v)) x.vmax = fmax(x.vmax, fabs(v));
            }
        }
        maxrows = g->rows > maxrows ? g->rows : maxrows;
        maxcols = g->cols > maxcols ? g->cols : maxcols;
    }
    if (x.vmax <= 0) x.vmax = 1e-6;
    x.ch = fmax(4, fmin(24, 640.0 / (maxrows ? maxrows : 1)));
    x.cw = fmax(14, fmin(36, 560.0 / (maxcols ? maxcols : 1) / (n > 1 ? 1.4 : 1)));
    x.left = x.ch >= 10 ? 110 : 80;
    x.panel_w = maxcols * x.cw + x.left;
    const char *tgt = json_string_value(json_object_get(json_object_get(docs[0], "grid"), "target"));
    snprintf(x.title, sizeof x.title, "KV-head knockout (mean replacement): change in %s",
             x.acc ? "accuracy (pp)" : "mean target NLL (nats)");
    snprintf(x.subtitle, sizeof x.subtitle, "rows: layer x KV head; columns: phase residue; %s entries replaced; red = knockout hurts%s",
             tgt ? tgt : "", n > 1 ? "; shared colour scale" : "");
    chunks ch;
    make_chunks(&ch, json_object_get(docs[0], "provenance"), x.title);
    double W = x.left + n * x.panel_w + 130, H = 96 + fmax(maxrows * x.ch + 50, 280);
    int rc = emit(out, x.acc ? "knockout_heatmap_acc" : "knockout_heatmap", fmax(W, 760), H, draw_knockout, &x, &ch,
                  o, verbose, err);
    for (int k = 0; k < n; k++) {
        free(x.g[k].layer);
        free(x.g[k].head);
        free(x.g[k].v);
    }
    free(x.g);
    return rc;
}

static int render_gates(json_t *doc, const char *out, const ps_render_opts *o, int verbose, ps_error *err) {
    json_t *gj = json_object_get(doc, "gates"), *layers = json_object_get(gj, "layers");
    gates_ctx x = {0};
    x.L = (int)json_array_size(layers);
    x.H = (int)json_array_size(json_object_get(json_array_get(layers, 0), "heads"));
    x.W = (int)json_integer_value(json_object_get(gj, "window"));
    if (x.L <= 0 || x.H <= 0 || x.W <= 0 || x.L > 4096 || x.H > 4096 || x.W > 4096)
        return ps_fail(err, "gates result is malformed (%d layers, %d heads, window %d)", x.L, x.H, x.W);
    x.mg = calloc((size_t)(x.L * x.H * 2 * x.W), sizeof(double));
    x.ns = calloc((size_t)(x.L * x.H * 2), sizeof(double));
    x.ni = calloc((size_t)(x.L * x.H * 2), sizeof(double));
    x.peak = calloc((size_t)(x.L * x.H * 2), sizeof(int));
    int64_t nwin = 0;
    for (int l = 0; l < x.L; l++)
        for (int h = 0; h < x.H; h++)
            for (int b = 0; b < 2; b++) {
                json_t *bo = json_object_get(json_array_get(json_object_get(json_array_get(layers, (size_t)l), "heads"), (size_t)h),
                                             b ? "value" : "key");
                size_t k = ((size_t)l * x.H + h) * 2 + b;
                for (int i = 0; i < x.W; i++) x.mg[k * x.W + i] = json_number_value(json_array_get(json_object_get(bo, "mean_gate"), (size_t)i));
                x.ns[k] = num(bo, "N_static");
                x.ni[k] = num(bo, "N_input");
                x.peak[k] = (int)json_integer_value(json_object_get(bo, "peak"));
                nwin = json_integer_value(json_object_get(bo, "n_windows"));
            }
    char name[400];
    model_name(name, sizeof name, json_object_get(doc, "provenance"));
    snprintf(x.title, sizeof x.title, "Gate concentration — %s", name);
    snprintf(x.subtitle, sizeof x.subtitle,
             "mean gate per KV head and offset, pooled over %lld windows; N_s = exp(H(mean gate)), N_i = E[exp(H(alpha))], "
             "r = peak offset",
             (long long)nwin);
    x.cw = fmax(12, fmin(40, 320.0 / x.W));
    x.ch = fmax(6, fmin(26, 200.0 / x.H));
    chunks ch;
    make_chunks(&ch, json_object_get(doc, "provenance"), x.title);
    double W = 90 + 2 * (x.W * x.cw + 190) + 110, H = 100 + x.L * (x.H * x.ch + 56) + 20;
    int rc = emit(out, "gate_concentration", fmax(W, 900), fmax(H, 420), draw_gates, &x, &ch, o, verbose, err);
    free(x.mg);
    free(x.ns);
    free(x.ni);
    free(x.peak);
    return rc;
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
    for (char *ln = strtok(text, "\n"); ln; ln = strtok(NULL, "\n")) {
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
        } else if (type && !strcmp(type, "gates")) {
            x.gs[x.n_gates] = step;
            gates[x.n_gates++] = json_incref(r);
        }
        json_decref(r);
    }
    free(text);
    if (!rc && x.n_train + x.n_eval == 0) rc = ps_fail(err, "%s: no train or eval records", path);
    if (!rc && x.n_gates) {
        json_t *layers = json_object_get(gates[0], "layers");
        x.L = (int)json_array_size(layers);
        x.H = (int)json_array_size(json_object_get(json_array_get(layers, 0), "heads"));
        x.W = (int)json_array_size(json_object_get(json_object_get(json_array_get(json_object_get(json_array_get(layers, 0), "heads"), 0), "key"), "mean_gate"));
        if (x.L > 4096 || x.H > 4096 || x.W > 4096) rc = ps_fail(err, "%s: gate records are malformed", path);
        x.sel = x.L * x.H < 6 ? x.L * x.H : 6;
        if (rc) x.n_gates = 0;
        x.mg = calloc((size_t)x.n_gates * x.L * x.H * 2 * (x.W ? x.W : 1) + 1, sizeof(double));
        x.ns = calloc((size_t)x.n_gates * x.L * x.H * 2 + 1, sizeof(double));
        x.ni = calloc((size_t)x.n_gates * x.L * x.H * 2 + 1, sizeof(double));
        for (int k = 0; k < x.n_gates; k++)
            for (int l = 0; l < x.L; l++)
                for (int h = 0; h < x.H; h++)
                    for (int b = 0; b < 2; b++) {
                        json_t *bo = json_object_get(json_array_get(json_object_get(json_array_get(json_object_get(gates[k], "layers"), (size_t)l), "heads"), (size_t)h),
                                                     b ? "value" : "key");
                        size_t idx = (((size_t)k * x.L + l) * x.H + h) * 2 + b;
                        for (int i = 0; i < x.W; i++) x.mg[idx * x.W + i] = json_number_value(json_array_get(json_object_get(bo, "mean_gate"), (size_t)i));
                        x.ns[idx] = num(bo, "N_static");
                        x.ni[idx] = num(bo, "N_input");
                    }
    }
    for (int k = 0; k < x.n_gates; k++) json_decref(gates[k]);
    free(gates);
    if (!rc) {
        snprintf(x.title, sizeof x.title, "Training run — %s", path);
        snprintf(x.subtitle, sizeof x.subtitle, "loss of each logged batch; held-out accuracy (top-1, every answer token)%s",
                 x.n_gates ? "; gate statistics on held-out windows" : "");
        chunks ch;
        snprintf(ch.command, sizeof ch.command, "phasescope train (log %s)", path);
        snprintf(ch.model, sizeof ch.model, "%s", path);
        snprintf(ch.title, sizeof ch.title, "%s", x.title);
        double H = 80 + 230 + 60 + (x.n_gates ? 90 + x.sel * 190 : 0);
        rc = emit(out, "training", x.n_gates ? 1320 : 1080, H, draw_training, &x, &ch, o, verbose, err);
    }
    free(x.ts); free(x.loss); free(x.es); free(x.acc); free(x.gs); free(x.mg); free(x.ns); free(x.ni);
    return rc;
}

/* The idealised model: loss and accuracy over steps, and each head's key/value gate over steps (drawn in
 * the training layout; its gates are static, so N_static = N_input). */
static int render_theory(json_t *doc, const char *out, const ps_render_opts *o, int verbose, ps_error *err) {
    json_t *st = json_object_get(doc, "steps"), *heads = json_object_get(doc, "heads");
    train_ctx x = {0};
    int n = (int)json_array_size(st);
    x.H = (int)json_array_size(heads);
    x.L = 1;
    x.W = (int)json_array_size(json_array_get(json_object_get(json_array_get(heads, 0), "key_gate"), 0));
    if (n < 1 || x.H < 1 || x.W < 1 || n > 100000 || x.H > 64 || x.W > 4096) return ps_fail(err, "theory result is malformed");
    x.n_train = x.n_eval = x.n_gates = n;
    x.sel = x.H < 6 ? x.H : 6;
    x.ts = calloc((size_t)n, sizeof(double));
    x.loss = calloc((size_t)n, sizeof(double));
    x.es = calloc((size_t)n, sizeof(double));
    x.acc = calloc((size_t)n, sizeof(double));
    x.gs = calloc((size_t)n, sizeof(double));
    x.mg = calloc((size_t)n * x.H * 2 * x.W, sizeof(double));
    x.ns = calloc((size_t)n * x.H * 2, sizeof(double));
    x.ni = calloc((size_t)n * x.H * 2, sizeof(double));
    for (int k = 0; k < n; k++) {
        x.ts[k] = x.es[k] = x.gs[k] = (double)json_integer_value(json_array_get(st, (size_t)k));
        x.loss[k] = json_number_value(json_array_get(json_object_get(doc, "loss"), (size_t)k));
        x.acc[k] = json_number_value(json_array_get(json_object_get(doc, "accuracy"), (size_t)k));
        for (int h = 0; h < x.H; h++)
            for (int b = 0; b < 2; b++) {
                json_t *g = json_array_get(json_object_get(json_array_get(heads, (size_t)h), b ? "value_gate" : "key_gate"), (size_t)k);
                size_t idx = ((size_t)k * x.H + h) * 2 + b;
                for (int i = 0; i < x.W; i++) x.mg[idx * x.W + i] = json_number_value(json_array_get(g, (size_t)i));
                x.ns[idx] = x.ni[idx] = ps_effective_offsets_f(x.mg + idx * x.W, x.W);
            }
    }
    json_t *pr = json_object_get(doc, "params");
    snprintf(x.title, sizeof x.title, "Idealised bigram induction: %lld heads, W = S = %lld, %lld chunks",
             (long long)json_integer_value(json_object_get(pr, "heads")), (long long)json_integer_value(json_object_get(pr, "window")),
             (long long)json_integer_value(json_object_get(pr, "chunks")));
    snprintf(x.subtitle, sizeof x.subtitle, "one-hot embeddings, static gates, gradient descent from a small random init; "
             "%lld of %d heads end with the value peak one offset after the key peak",
             (long long)json_integer_value(json_object_get(doc, "heads_with_value_peak_after_key_peak")), x.H);
    chunks ch;
    make_chunks(&ch, json_object_get(doc, "provenance"), x.title);
    double H = 80 + 230 + 60 + 90 + x.sel * 190;
    int rc = emit(out, "theory", 1320, H, draw_training, &x, &ch, o, verbose, err);
    free(x.ts); free(x.loss); free(x.es); free(x.acc); free(x.gs); free(x.mg); free(x.ns); free(x.ni);
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
    int rc = 0;
    const char *kind = NULL;
    for (int i = 0; i < n && !rc; i++) {
        docs[i] = load(paths[i], err);
        if (!docs[i]) {
            rc = -1;
            break;
        }
        const char *k = json_string_value(json_object_get(docs[i], "kind"));
        if (!kind) kind = k;
        else if (strcmp(kind, k) && !(strstr("sweep gatecycle", kind) && !strcmp(k, "sweep")))
            rc = ps_fail(err, "%s: a %s result cannot share a figure with a %s result", paths[i], k, kind);
    }
    if (!rc) {
        if (!strcmp(kind, "sweep") || !strcmp(kind, "gatecycle")) rc = render_curves(docs, paths, n, out, o, verbose, err);
        else if (!strcmp(kind, "knockout")) rc = render_knockout(docs, paths, n, out, o, verbose, err);
        else if (!strcmp(kind, "theory")) {
            if (n > 1) rc = ps_fail(err, "render: theory results are drawn one at a time");
            else rc = render_theory(docs[0], out, o, verbose, err);
        } else if (!strcmp(kind, "gates")) {
            if (n > 1) rc = ps_fail(err, "render: gates results are drawn one at a time");
            else rc = render_gates(docs[0], out, o, verbose, err);
        } else
            rc = ps_fail(err, "%s: unknown result kind \"%s\"", paths[0], kind);
    }
    for (int i = 0; i < n; i++) json_decref(docs[i]);
    free(docs);
    return rc;
}
