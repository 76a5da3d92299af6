/* sweep.h — the phase sweep (docs/results-schema.md): the shifted prompts of an evaluation set over shifts
 * 0..P-1 scored into per-residue statistics. Its pieces are modules of their own: filler families
 * (filler_families.h), the stored task and shifted prompts (shifted.h), scoring and batching (eval.h),
 * per-residue statistics (stats.h); this header includes them for the sweep's users. */
#ifndef PS_SWEEP_H
#define PS_SWEEP_H

#include <jansson.h>
#include <stdint.h>

#include "core/error.h"
#include "core/forward.h"
#include "core/hooks.h"
#include "core/model.h"
#include "interventions/eval.h"
#include "interventions/filler_families.h"
#include "interventions/shifted.h"
#include "interventions/stats.h"
#include "tasks/tasks.h"

/* A whole sweep over shifts 0..P-1 of the controlled model, the naive way (the reference the instruments'
 * work units, ps_sweep_units in units.h, are tested against): fills stats. progress(done, total, user) may be NULL.
 *
 * A progress callback (every engine's): called after each unit of work (a batch, a shift, a candidate)
 * with the units done of total; it returns 0 to go on, non-zero to stop the run there: the engine then
 * fails with "cancelled after DONE of TOTAL UNITS" (the caller's cancellation: the public API's
 * ps_api_set_progress, Python's Ctrl-C). */
typedef int (*ps_progress_fn)(int64_t done, int64_t total, void *user);
int ps_sweep_run(const ps_model *m, const ps_batch *base, const ps_task *task, const ps_filler_family *fam,
                 ps_sweep_mode mode, int64_t P, uint64_t seed, int64_t batch, ps_residue_stats *stats,
                 ps_progress_fn progress, void *user, ps_error *err);

#endif
