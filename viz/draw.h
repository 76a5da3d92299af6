/* draw.h — figure plumbing on cairo: a figure (PNG through libpng with provenance text chunks, or PDF /
 * SVG through cairo), colour-blind-safe colours (Okabe-Ito for lines, viridis for magnitudes, a blue–
 * white–orange diverging map for signed changes), text (UTF-8, DejaVu Sans, so ρ and α print as Greek
 * letters), heatmaps with thinned tick labels, colour bars, and line-plot axes. Coordinates are pixels
 * (points in the vector formats). */
#ifndef PS_DRAW_H
#define PS_DRAW_H

#include <cairo.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

typedef enum { PS_FMT_PNG = 0, PS_FMT_PDF, PS_FMT_SVG } ps_fig_format;

/* Figures drawn in memory (a library call's result: nothing written): each PNG file's name and bytes, in the
 * order drawn. */
typedef struct {
    char name[256];
    unsigned char *data;
    size_t len;
} ps_png_file;
typedef struct {
    ps_png_file *files;
    int n, cap;
} ps_png_set;
void ps_png_set_free(ps_png_set *s);
/* the file named `name` in s, or NULL */
const ps_png_file *ps_png_set_find(const ps_png_set *s, const char *name);

typedef struct {
    cairo_surface_t *surface;
    cairo_t *cr;
    double w, h;
    ps_fig_format format;
    char path[4096], tmp[4200];
    ps_png_set *mem; /* set by the caller after ps_fig_begin (PNG only): ps_fig_end adds the PNG there, under the
                      * path's base name, instead of writing the file */
} ps_fig;

/* The largest figure side drawn, in pixels: renderers refuse inputs that would need more. */
#define PS_FIG_MAX_SIDE 16000.0

/* Start a figure of w × h pixels (each in 1 .. PS_FIG_MAX_SIDE, else an error) at `path` (its extension should match the format). White background. */
int ps_fig_begin(ps_fig *f, double w, double h, ps_fig_format fmt, const char *path, ps_error *err);
/* Finish: PNG is written with libpng with tEXt chunks keys[i] = vals[i]; everything atomically. */
int ps_fig_end(ps_fig *f, const char *const *keys, const char *const *vals, int n_text, ps_error *err);
void ps_fig_abort(ps_fig *f);

typedef struct {
    double r, g, b;
} ps_rgb;

ps_rgb ps_viridis(double t);       /* t in [0, 1] */
ps_rgb ps_diverging(double t);     /* t in [0, 1], 0.5 = white; blue below, orange above */
ps_rgb ps_diverging_rev(double t); /* the same reversed: orange below, blue above */
ps_rgb ps_okabe_ito(int i);        /* line colour i (mod 8): blue, orange, bluish green, vermillion, ... */
void ps_set_rgb(cairo_t *cr, ps_rgb c);

/* Text with its anchor: ax, ay in {0 = left/top, 0.5 = centre, 1 = right/bottom}; angle in radians. */
void ps_text(cairo_t *cr, double x, double y, const char *s, double size, double ax, double ay, double angle, int bold);
double ps_text_width(cairo_t *cr, const char *s, double size, int bold);

/* Every k-th label so labels of `label_w` never overlap cells of `cell` pixels (k >= 1). */
int ps_tick_step(double cell, double label_w);

/* A heatmap of rows × cols values in the rectangle (x, y, w, h); colour(v) maps a value to a colour. NaN
 * cells are drawn grey. */
void ps_heatmap(cairo_t *cr, double x, double y, double w, double h, const double *v, int rows, int cols,
                ps_rgb (*cmap)(double), double vmin, double vmax);
/* The same, reading cell (r, c) at v[r * rstride + c * cstride] (no copy needed for a slice). */
void ps_heatmap_strided(cairo_t *cr, double x, double y, double w, double h, const double *v, int rows, int cols,
                        ptrdiff_t rstride, ptrdiff_t cstride, ps_rgb (*cmap)(double), double vmin, double vmax);

/* A vertical colour bar at (x, y, w, h) with ticks and a label (units); returns the width it used
 * (bar, ticks, tick labels and label). */
double ps_colorbar(cairo_t *cr, double x, double y, double w, double h, ps_rgb (*cmap)(double), double vmin, double vmax,
                   const char *label);

/* "Nice" tick values covering [lo, hi]: fills ticks (at most max), returns the count. */
int ps_nice_ticks(double lo, double hi, int target, double *ticks, int max);

/* A p-value for people: "< 1e-300" when it underflows (0), "n/a" for NaN, else 3 significant digits.
 * The one formatter of the CLI, tables and figures. */
void ps_format_p(char *buf, size_t n, double p);

/* Format a tick value compactly. */
void ps_fmt_num(char *buf, size_t n, double v);

#endif
