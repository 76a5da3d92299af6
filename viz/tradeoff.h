/* tradeoff.h — the mitigation trade-off figure (docs/results.md "Closing the weak phase"): one point per
 * model (and seed), x = mean accuracy over residues, y = gap (max − min over residues, pp), marker area
 * proportional to the KV-cache bytes per token, colour and legend by group (a mitigation: the seeds of
 * one config share a colour). Drawn from sweep results by `phasescope table --figure`. */
#ifndef PS_TRADEOFF_H
#define PS_TRADEOFF_H

#include "core/error.h"

typedef struct {
    const char *group;   /* legend entry (colour) */
    double mean, gap_pp; /* mean accuracy in [0, 1]; gap in percentage points */
    double kv_bytes;     /* KV-cache bytes per token (> 0): marker area */
} ps_tradeoff_point;

/* Write the PNG at path (atomically, with provenance text chunks Title, Software, Command). Up to 64
 * points and 8 groups; an error names what does not fit. */
int ps_fig_tradeoff(const char *path, const char *title, const char *command, const ps_tradeoff_point *pts, int n,
                    ps_error *err);

#endif
