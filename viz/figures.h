/* figures.h — the figures of SPEC §8, drawn from result files alone (so `phasescope render` redraws the
 * same pixels a command drew): phase curves (sweep, gatecycle; several files = several lines), knockout
 * heatmaps (several files = side by side, each panel on its own colour scale), gate concentration, and
 * training curves and gate evolution from a train.jsonl. Inputs whose dimensions a figure cannot show
 * are refused with an error naming the file and the field. Each kind's figures are its module's
 * (viz/kind_*.c), found through the registry of result kinds (viz/kinds.h). */
#ifndef PS_FIGURES_H
#define PS_FIGURES_H

#include <jansson.h>
#include <stdint.h>

#include "viz/draw.h"
#include "core/error.h"

typedef struct {
    ps_fig_format format; /* PNG always; PDF or SVG in addition when set */
    int vector;
    const char *measure; /* knockout colour: "nll" (default) or "acc" */
    ps_png_set *mem;     /* draw the PNGs into memory (no file, no directory; vector formats not drawn): a library call */
} ps_render_opts;

/* Render the figures of result files (all of one kind: sweep/gatecycle curves, knockout grids, gates,
 * or one train.jsonl) into out_dir. Prints each file written when verbose. */
int ps_render(const char *const *paths, int n, const char *out_dir, const ps_render_opts *opts, int verbose,
              ps_error *err);

/* The same for result documents already loaded (e.g. validated by ps_results_load): paths[i] names
 * docs[i] in titles and errors. Not for training logs. */
int ps_render_docs(json_t *const *docs, const char *const *paths, int n, const char *out_dir,
                   const ps_render_opts *opts, int verbose, ps_error *err);

/* ---- layout, exposed so tests can probe pixels where the figures put them ---- */

typedef struct {
    double x, y, w, h;
} ps_rect;

/* Phase curves (phase_curve.png, gatecycle_curve.png): the plot area, and where residue r of P and an
 * accuracy land in it (a single curve; several curves are spread a few pixels sideways). */
ps_rect ps_curve_area(void);
double ps_curve_x(int64_t P, int64_t r);
double ps_curve_y(double accuracy);

/* Knockout heatmaps: the heatmap rectangle of each of n panels of rows[k] × cols[k] cells (all panels
 * equally tall) and the figure size; -1 with an error when a figure cannot show them. */
int ps_knockout_layout(int n, const int *rows, const int *cols, ps_rect *heat, double *fig_w, double *fig_h,
                       ps_error *err);
/* The colour of a knockout cell of value v on a panel whose scale is ±vmax: orange where the knockout
 * hurts (NLL up, or accuracy down when acc), blue where it helps, white at 0. */
ps_rgb ps_knockout_color(double v, double vmax, int acc);

/* A curve's period and chi-square p for its legend: "period 8, χ² p = 0.0012", "no period, χ² p < 1e-300"
 * (has_period = 0: the result has no period, or flags the curve non-significant). */
void ps_period_text(char *buf, size_t n, int has_period, double period, double p);

#endif
