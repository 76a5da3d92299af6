/* sweep_table.h — the summary table of several sweep results (like the paper's Table 1; `phasescope
 * table`): one markdown row per result file (model, attention, period, mean accuracy, worst residue, gap,
 * the periods found, the chi-square p-value), each file checked against docs/results-schema.md first; and,
 * with a figure path, gap against mean accuracy drawn there (viz/tradeoff.h). */
#ifndef PS_SWEEP_TABLE_H
#define PS_SWEEP_TABLE_H

#include <stddef.h>

#include "core/error.h"

/* The table of paths[0..n) as markdown text (malloc'd, *len its length), the figure written to `figure`
 * when not NULL (at most 64 results); NULL with err set (a usage error for no paths or too many for the
 * figure; a malformed file names the field at fault). */
char *ps_sweep_table(const char *const *paths, int n, const char *figure, size_t *len, ps_error *err);

#endif
