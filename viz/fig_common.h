/* fig_common.h — internal to viz/: what every figure module (viz/kind_*.c) shares: the limits of what a
 * figure can show, writing a figure with its provenance text chunks (PNG, and PDF/SVG when asked), text
 * fitting, the model name and its attention set-up as titles say it, lines and clipped polylines. Not a
 * public header: the layers above draw through viz/figures.h. */
#ifndef PS_FIG_COMMON_H
#define PS_FIG_COMMON_H

#include <cairo.h>
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "viz/figures.h"

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


/* The PNG text chunks of a figure: its title, and the command and model of the result's provenance. */
typedef struct {
    char command[2048], model[2048], title[1024];
} ps_fig_chunks;

/* o[k] as a number (0 when missing or not a number) */
double ps_fig_num(json_t *o, const char *k);
void ps_fig_make_chunks(ps_fig_chunks *c, json_t *prov, const char *title);
/* A figure's files: OUT/name.png, then the same drawing as .pdf / .svg when o asks for a vector copy
 * (ps_fig_n_files: 1 or 2). The kind draws each file itself between open and close (no callback):
 *     for (int k = 0; !rc && k < ps_fig_n_files(o); k++)
 *         if (!(rc = ps_fig_file_open(&f, out, "name", w, h, o, k, err))) {
 *             draw_name(f.cr, &x);
 *             rc = ps_fig_file_close(&f, &ch, verbose, err);
 *         }
 * open makes OUT (k = 0) and begins the w × h file k on f->cr; close writes it with the chunks (the PNG's
 * text chunks, the vector file's metadata) and prints its path when verbose. */
int ps_fig_n_files(const ps_render_opts *o);
int ps_fig_file_open(ps_fig *f, const char *out_dir, const char *name, double w, double h, const ps_render_opts *o, int k,
                     ps_error *err);
int ps_fig_file_close(ps_fig *f, const ps_fig_chunks *ch, int verbose, ps_error *err);
/* Text width before a figure exists (for sizing the canvas). */
double ps_fig_measure(const char *s, double size, int bold);
/* The largest font size <= size (down to 8) at which s fits in maxw. */
double ps_fig_fit(cairo_t *cr, const char *s, double size, double maxw, int bold);
/* s into out (n bytes) cut at a UTF-8 character boundary and ended with "…" where even at `size` it is wider than
 * maxw (unchanged when it fits): a label that stays inside the figure. */
void ps_fig_ellipsize(cairo_t *cr, const char *s, double size, double maxw, int bold, char *out, size_t n);
/* The model as titles name it: the folder's name and its attention, "w8s8 (W8/S8)", from a provenance block. */
void ps_fig_model_name(char *buf, size_t n, json_t *prov);
void ps_fig_line(cairo_t *cr, double x0, double y0, double x1, double y1);
/* A polyline in data coordinates, clipped a few pixels outside the plot area (so values on its edge
 * stay visible on top of the frame). xs, ys: n values with strides. */
void ps_fig_polyline(cairo_t *cr, const double *xs, const double *ys, ptrdiff_t ystride, int n, double x, double y, double w,
                     double h, double x0, double x1, double y0, double y1);

#endif
