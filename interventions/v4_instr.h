/* v4_instr.h — the instruments on DeepSeek-V4 checkpoints (core/v4/, SPEC-v4.md), over the V4 runtime's
 * hooks: the phase sweep, per-channel gate statistics (gates/chgates.h); gate cycling is the family's core
 * entries (core/cycle.h). The prompts, their shifted copies and the per-residue statistics are
 * sweep.h's; the knockout result and its JSON are knockout.h's (docs/results-schema.md, "DeepSeek-V4"). The
 * knockout targets are the family's data (core/ko_targets.c), run by the one spec (ko_spec.h).
 *
 * Prompts: a V4 checkpoint carries no phasescope task, so the task comes from a task file (taskfile.h: --task
 * FILE.json, or DIR/phasescope_task.json), its tokens mapped through the file's "ids" (the family's task_file). */
#ifndef PS_V4_INSTR_H
#define PS_V4_INSTR_H

#include <jansson.h>
#include <stdint.h>

#include "gates/chgates.h"
#include "interventions/grid.h"
#include "interventions/knockout.h"
#include "interventions/sweep.h"
#include "interventions/taskfile.h"
#include "tasks/tasks.h"
#include "core/cycle.h"
#include "core/v4/v4_model.h"

/* The task file (taskfile.h): a DeepSeek-V4 checkpoint is a family whose prompts come from one. */
typedef ps_task_file ps_v4_task;
static inline int ps_v4_task_load(ps_v4_task *t, const char *task_path, const char *model_dir, int64_t vocab, int64_t max_pos,
                                  ps_error *err) {
    return ps_task_file_load(t, task_path, model_dir, "DeepSeek-V4", vocab, max_pos, err);
}
static inline void ps_v4_task_free(ps_v4_task *t) { ps_task_file_free(t); }

/* Prompts (in the task's layout) through the V4 forward in batches of `batch`, every token mapped to
 * the model's ids; hooks (a V4 hook set, or NULL) fire on every batch. correct / logprob per query. The
 * batches are the family's score (core/runtime.c), its one batching loop. The sweep and the gate
 * statistics run as work units (ps_sweep_units, ps_gate_units: units.h). */
int ps_v4_eval(ps_v4_model *m, const ps_v4_task *t, const ps_batch *b, int64_t batch, const ps_hooks *hooks, int *correct,
               double *logprob, ps_error *err);

/* The gate statistics: the family's gate data (core/gate_records.c) run by units.h's ps_gate_units. */

/* Gate cycling (ps_v4_gate_cycle, PS_V4_CYCLE_*): the family's core entries, core/cycle.h. */

/* Knockout targets (ps_v4_ko_target, ps_v4_ko_targets, ps_v4_ko_layer_ok): core/v4/v4_config.h, as data of the family
 * (core/ko_targets.c). */

/* The DeepSeek-V4 runtime (grid.h): what the grid engine and the instruments call on a V4 checkpoint
 * (its forward with hooks on the task's prompts mapped through t, its hook names, its knockout targets). */
void ps_v4_runtime(ps_runtime *rt, ps_v4_model *m, const ps_v4_task *t);
/* The knockout of a V4 checkpoint: ps_knockout_run (knockout.h) with this runtime, target a
 * ps_v4_ko_target (cells: query heads for `heads`, the one unit 0 for the per-layer targets; a full
 * forward per cell, callbacks and actions on the V4 hooks). */

#endif
