/* train.h — the training run behind `phasescope train`: one JSON config (model, task, optimisation),
 * seeded batches derived from (seed, step), AdamW, periodic atomic checkpoints with the optimizer state
 * in a separate file, a JSONL log (train / eval / gate-statistics records), exact resume, and a stop on
 * a non-finite loss that keeps the last good checkpoint.
 *
 * RUN/ layout: config.json, model.safetensors (metadata: phasescope.step, phasescope.task,
 * phasescope.train, phasescope.optimizer), optimizer-STEP.safetensors (AdamW moments m.NAME, v.NAME),
 * train.jsonl. */
#ifndef PS_TRAIN_H
#define PS_TRAIN_H

#include <stdint.h>

#include "core/config.h"
#include "core/error.h"
#include "train/optim.h"
#include "tasks/tasks.h"

typedef struct {
    ps_config model;
    ps_task task;
    struct ps_textkv_task_s *text; /* the "text-kv" task (text/textkv_task.h), NULL for the id-level tasks */
    ps_optim_cfg opt;
    int64_t batch_size, steps;
    uint64_t seed;
    double init_std; /* base standard deviation of the initial weights (docs/training.md) */
    int logits_answers; /* "logits": "answers": logits and loss at the answer rows only (large vocabularies) */
    double gate_reg;    /* weight of the gate regulariser (docs/mitigations.md), 0: off */
    int64_t phase_augment; /* 1: a random window grid phase per training sequence (docs/mitigations.md) */
    int64_t log_every, eval_every, eval_size, gates_every, checkpoint_every;
    char *canonical; /* the whole config as canonical JSON (stored in the checkpoint) */
    const char *init_from; /* not owned, not part of the config: start from this checkpoint's weights (same
                              tensor names and shapes) instead of a random init; fresh AdamW state, step 0
                              (`train --init-from`, docs/training.md). Ignored on --resume. */
    const char *backend; /* not owned, not part of the config: the backend the run computes on (`train --device`;
                            NULL or "cpu": the CPU). The model is created, initialised and loaded on the host,
                            then moved there; gradients, activations and AdamW moments live on it, and the
                            checkpoints copy parameters and moments back to the host (docs/cuda.md). */
    int precision;       /* PS_PREC_* (core/ctx.h) of a device backend's matrix products (`--precision`); the CPU
                            computes in fp32 whatever it says. 0 (fp32) after ps_train_cfg_parse. */
} ps_train_cfg;

int ps_train_cfg_parse(const char *text, size_t len, const char *source, ps_train_cfg *c, ps_error *err);
int ps_train_cfg_load(const char *path, ps_train_cfg *c, ps_error *err);
void ps_train_cfg_free(ps_train_cfg *c);

typedef struct {
    int64_t step, total;
    double loss, lr, grad_norm, tokens_per_s;
    double eval_accuracy; /* < 0 when this step did not evaluate */
} ps_train_progress;

/* Called on rank 0 after each step; returns 0 to go on, non-zero to stop: a run of one process then saves
 * a checkpoint at that step (unless the schedule just did) and fails with "cancelled after step N of
 * TOTAL" (--resume continues it); under MPI the ranks go on (they take every step together). */
typedef int (*ps_train_progress_fn)(const ps_train_progress *p, void *user);

/* Train into out_dir. resume: continue from out_dir's checkpoint (its config must equal c). stop_after >= 0
 * ends the run (with a checkpoint) after that many total steps, as an interruption would (tests). */
int ps_train(const ps_train_cfg *c, const char *out_dir, int resume, int64_t stop_after, ps_train_progress_fn fn,
             void *user, ps_error *err);

#endif
