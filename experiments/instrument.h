/* instrument.h — what sweep, knockout, gatecycle and gates share: the common flags (--model, --period,
 * --family, --n, --seed, --batch, --out, --backend), the model with its stored task, the evaluation set, the filler
 * family, provenance and atomic writing of result JSON. */
#ifndef PS_INSTRUMENT_H
#define PS_INSTRUMENT_H

#include <jansson.h>
#include <stdint.h>

#include "cli.h"
#include "model.h"
#include "progress.h"
#include "sweep.h"
#include "tasks.h"

/* The flags every instrument takes, for its table (after its own flags). */
#define PS_INSTR_FLAGS                                                                                         \
    {"--model", "DIR", "checkpoint trained by `phasescope train` (default: the shipped model)", 0},              \
        {"--period", "P", "phase period (default: the model's stride S; 8 for full attention)", 0},              \
        {"--family", "NAME", "filler family from data/fillers.json (default: the first, \"repeat\")", 0},       \
        {"--n", "N", "evaluation prompts generated from the model's task (default 256)", 0},                     \
        {"--seed", "S", "seed of the evaluation prompts and random fillers (default 0)", 0},                      \
        {"--batch", "B", "prompts per forward batch (default 32)", 0},                                           \
        {"--out", "DIR", "where the result JSON goes (default out/COMMAND)", 0},                                 \
        PS_BACKEND_FLAG

/* --task of knockout, gates and gatecycle (sweep has its own --task, which also takes model|text-kv). */
#define PS_V4_TASK_FLAG                                                                                          \
    {"--task", "FILE.json",                                                                                      \
     "DeepSeek-V4 checkpoints: the prompts' task and token ids (docs/results-schema.md,\n"                      \
     "\"DeepSeek-V4\"; default DIR/phasescope_task.json)",                                                      \
     0}

typedef struct {
    const char *command;
    const char *backend; /* --backend (the scaffold checked it) */
    char *cmdline;
    char model_dir[4096];
    char out_dir[4096];
    ps_model m;
    ps_task task;
    ps_batch base;
    ps_filler_family *fams;
    int n_fams;
    const ps_filler_family *fam;
    int64_t P, n_prompts, batch;
    uint64_t seed;
    ps_progress bar;
} ps_instr;

/* Reads the PS_INSTR_FLAGS of a (whose table must hold them) and loads the model. need_task: build the
 * evaluation set from the stored task. */
int ps_instr_setup(ps_instr *in, const ps_args *a, int need_task, ps_error *err);
void ps_instr_free(ps_instr *in);

/* {"command", "model", "config_hash", "seed", "version", "task", "eval": {...}} */
json_t *ps_instr_provenance(const ps_instr *in, const char *mode);

/* Write OUT_DIR/name atomically (pretty JSON). */
int ps_instr_write(const ps_instr *in, const char *name, json_t *result, ps_error *err);

/* progress callback for ps_progress_fn */
void ps_instr_progress(int64_t done, int64_t total, void *user);

#endif
