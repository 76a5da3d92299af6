/* shifted.h — the sweep's prompts: the evaluation task a checkpoint stores, and the shifted copies of an
 * evaluation set (prefix padding, or move mode) with each query's residue (its phase coordinate). */
#ifndef PS_SHIFTED_H
#define PS_SHIFTED_H

#include <stdint.h>

#include "core/batch.h"
#include "core/error.h"
#include "core/model.h"
#include "core/runtime.h"
#include "interventions/filler_families.h"
#include "tasks/tasks.h"

typedef enum { PS_SWEEP_PAD = 0, PS_SWEEP_MOVE = 1 } ps_sweep_mode;

/* The task stored in a checkpoint's metadata ("phasescope.task", the family's meta), of any family / of a
 * controlled model. */
int ps_runtime_task(const ps_runtime *rt, const char *model_dir, ps_task *t, ps_error *err);
int ps_model_task(const ps_model *m, const char *model_dir, ps_task *t, ps_error *err);

/* Prompts of one shift p: every prompt has the same length, queries carry shifted positions, and
 * residue[i·max_q + q] is the query's phase coordinate (t_K mod P), or -1 for a query not scored. */
typedef struct {
    ps_batch b;
    int64_t p, P;
    int64_t *residue;
} ps_shifted;

/* Build the prompts of shift p from base (pad: p fillers after BOS; move: the first query's pair moves,
 * with p fillers before it and P-1-p after it). Errors when a prompt would exceed max_seq_len. */
int ps_make_shifted(const ps_batch *base, const ps_task *task, const ps_filler_family *fam, ps_sweep_mode mode,
                    int64_t P, int64_t p, uint64_t seed, int64_t max_seq_len, ps_shifted *out, ps_error *err);
void ps_shifted_free(ps_shifted *s);

#endif
