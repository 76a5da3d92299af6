/* figures.h — the figures of SPEC §8, drawn from result files alone (so `phasescope render` redraws the
 * same pixels a command drew): phase curves (sweep, gatecycle; several files = several lines), knockout
 * heatmaps (several files = side by side on a shared scale), gate concentration, and training curves and
 * gate evolution from a train.jsonl. */
#ifndef PS_FIGURES_H
#define PS_FIGURES_H

#include "draw.h"
#include "error.h"

typedef struct {
    ps_fig_format format; /* PNG always; PDF or SVG in addition when set */
    int vector;
    const char *measure; /* knockout colour: "nll" (default) or "acc" */
} ps_render_opts;

/* Render the figures of result files (all of one kind: sweep/gatecycle curves, knockout grids, gates,
 * or one train.jsonl) into out_dir. Prints each file written when verbose. */
int ps_render(const char *const *paths, int n, const char *out_dir, const ps_render_opts *opts, int verbose,
              ps_error *err);

#endif
