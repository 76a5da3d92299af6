/* tradeoff.h — the mitigation trade-off figure (docs/results.md "Closing the weak phase"): one point per
 * model (and seed), x = mean accuracy over residues, y = gap (max − min over residues, pp), marker area
 * proportional to the KV-cache bytes per token, colour and legend by group (a mitigation: the seeds of
 * one config share a colour; a checkpoint at the held-out-0.6 rule is a ring, the end of training a disc).
 * Drawn from sweep results by `phasescope table --figure`. */
#ifndef PS_TRADEOFF_H
#define PS_TRADEOFF_H

#include <stddef.h>

#include "core/error.h"

typedef struct {
    const char *group;   /* legend entry (colour) */
    double mean, gap_pp; /* mean accuracy in [0, 1]; gap in percentage points */
    double kv_bytes;     /* KV-cache bytes per token (> 0): marker area */
    int hollow;          /* drawn as a ring, not a disc: a checkpoint taken at the held-out-0.6 rule */
} ps_tradeoff_point;

/* Write the PNG at path (atomically, with provenance text chunks Title, Software, Command). Up to 64
 * points and 8 groups; an error names what does not fit. */
int ps_fig_tradeoff(const char *path, const char *title, const char *command, const ps_tradeoff_point *pts, int n,
                    ps_error *err);

/* A point's legend group from its model's directory name, into g (n bytes): the name without a trailing
 * "_rule" and then without a trailing seed suffix "_sN", so deep_select_s1_rule, deep_select_s1 and
 * deep_select_s2 share one colour. Returns 1 when the name ended in "_rule" (a checkpoint at the held-out-0.6
 * rule: drawn hollow), else 0. */
int ps_tradeoff_group(char *g, size_t n, const char *name);

/* Where ps_fig_tradeoff draws point i of pts[0..n) (pixels: x right, y down) and its marker's radius. */
void ps_tradeoff_xy(const ps_tradeoff_point *pts, int n, int i, double *x, double *y);
double ps_tradeoff_radius(const ps_tradeoff_point *pts, int n, int i);

#endif
