/* instrument.h — what sweep, knockout, gatecycle and gates share: the common flags (--model, --period,
 * --family, --n, --seed, --batch, --out, --backend), the model with its stored task, the evaluation set, the filler
 * family, provenance and atomic writing of result JSON. */
#ifndef PS_INSTRUMENT_H
#define PS_INSTRUMENT_H

#include <jansson.h>
#include <stdint.h>

#include "instruments/command.h"
#include "interventions/grid.h"
#include "interventions/promptset.h"
#include "core/model.h"
#include "interventions/taskfile.h"
#include "interventions/v4_instr.h"
#include "scaleout/partial.h"
#include "instruments/progress.h"
#include "instruments/result_out.h"
#include "gates/theory_train.h"
#include "train/train.h"
#include "interventions/sweep.h"
#include "tasks/tasks.h"

/* The flags every instrument takes, for its table (after its own flags). --shard I/N and MPI ranks split
 * the work (docs/scale-out.md). */
#define PS_INSTR_FLAGS                                                                                         \
    {"--model", "DIR", "checkpoint trained by `phasescope train` (default: the shipped model)", 0},              \
        {"--period", "P", "phase period (default: the model's stride S; 8 for full attention)", 0},              \
        {"--family", "NAME", "filler family from data/fillers.json (default: the first, \"repeat\")", 0},       \
        {"--n", "N", "evaluation prompts generated from the model's task (default 256)", 0},                     \
        {"--seed", "S", "seed of the evaluation prompts and random fillers (default 0)", 0},                      \
        {"--batch", "B", "prompts per forward batch (default 32)", 0},                                           \
        {"--out", "DIR", "where the result JSON goes (default out/COMMAND)", 0},                                \
        {"--shard", "I/N",                                                                                     \
         "run only shard I of N (0 <= I < N) of the work and write a partial result,\n"                         \
         "OUT/COMMAND.part-I-of-N.safetensors; `phasescope merge` combines the N parts into the\n"             \
         "result one process writes (docs/scale-out.md)",                                                      \
         0},                                                                                                   \
        PS_BACKEND_FLAG

/* --prompts of knockout and sweep: the caller's prompts (interventions/promptset.h) */
#define PS_PROMPTS_FLAG                                                                                          \
    {"--prompts", "FILE",                                                                                        \
     "run on your own prompts instead of the task's: JSON lines {\"tokens\": [...], \"query\": t,\n"         \
     "\"answer\": id, \"residue\": r[, \"alt\": id]} of one length; --period P (default: the largest\n"    \
     "residue + 1); docs/prompt-sets.md",                                                                        \
     0}

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
    int shard, n_shards; /* --shard I/N (0/1 without it) */
    /* the checkpoint, opened through its family (core/runtime.h: ps_runtime_open): the runtime every
     * instrument calls; it owns the model (`m` above is only a model a command loads itself). A DeepSeek-V4
     * checkpoint's task file `task_file` gives `task`. */
    ps_runtime rt;
    ps_task_file task_file; /* the prompts' task file (a family whose checkpoints carry no task: core's task_file) */
    int has_task_file;
    ps_cli_progress_fn progress; /* the caller's (ps_args.progress), or NULL */
    void *progress_user;
    int borrowed; /* rt is a copy of the caller's open checkpoint (ps_args.rt): ps_instr_free leaves its model alone */
    /* a caller's prompt set (--prompts FILE, or the API's ps_args.prompts): the prompts the instrument runs on
     * instead of the task's shifts (prompts: pshift, one shift of P residues), or NULL */
    ps_promptset pset;
    int own_pset; /* pset was read from --prompts (freed by ps_instr_free); else a copy of the caller's */
    ps_shifted pshift;
    const ps_shifted *prompts;
    ps_out out; /* out_dir, and the caller's sink (ps_args.sink) for a library call */
} ps_instr;

/* Reads the PS_INSTR_FLAGS of a (whose table must hold them) and opens the checkpoint with
 * ps_runtime_open, which picks the family; in->rt is its runtime (the family's core table is all the
 * instruments reach the model through) and, for a family whose checkpoints carry no task (its
 * task_file), the task file (--task FILE or DIR/phasescope_task.json: interventions/taskfile.h) and its
 * token mapping (rt.token_map). need_task: build the evaluation set from the stored task (always, for a family
 * whose prompts come from a task file). */
int ps_instr_setup(ps_instr *in, const ps_args *a, int need_task, ps_error *err);
/* The checkpoint of in->model_dir into in->rt: the caller's already open one (a->rt, the API's model handle:
 * copied, in->borrowed set, not reopened), else opened through its family among a->families (NULL: core's
 * ps_families) on in->backend. */
int ps_instr_open(ps_instr *in, const ps_args *a, ps_error *err);
void ps_instr_free(ps_instr *in);

/* The sweep's one-line summary on stdout (mean, min, gap, chi-square, verdict, periods), read from the curve
 * object of sweep.json (instr_sweep.c: every sweep, the merged one too). */
void ps_sweep_summary_line(const ps_out *out, json_t *curve);

/* {"command", "model", "config_hash", "seed", "version", "backend", "compute", ["model_step"], "config",
 * ["task", "task_source"], "eval": {...}}: the config, its hash and the step from the family's runtime (a
 * command that loaded `m` itself without ps_instr_setup: that model's). */
json_t *ps_instr_provenance(const ps_instr *in, const char *mode);

/* ps_result_write (result_out.h) to the instrument's out (OUT_DIR/name, or the caller's sink). */
int ps_instr_write(const ps_instr *in, const char *name, json_t *result, ps_error *err);

/* ---- splitting the work (docs/scale-out.md) ----
 * An instrument's work is a list of units in the one-process order (interventions/units.h). This process
 * runs a contiguous range of them: the shard's range of the whole list (--shard I/N; the whole list
 * without it), then this MPI rank's range of the shard's (ps_dist_split with the units' weights, snapped to
 * group starts when that costs less than `penalty`). */
typedef struct {
    int64_t u0, u1;   /* this process's units */
    int64_t *r0, *r1; /* every rank's range ([ps_dist_size()]) */
} ps_instr_work;
int ps_instr_split(const ps_instr *in, const int64_t *w, const unsigned char *snap, int64_t n_units, int64_t penalty,
                   ps_instr_work *wk, ps_error *err);
void ps_instr_work_free(ps_instr_work *wk);
/* After the units ran (rc_run: this process's status): the ranks agree on errors, the partial results
 * are gathered onto rank 0, and with --shard rank 0 writes OUT/COMMAND.part-I-of-N.safetensors. Returns 1
 * when this process finishes the result (rank 0 of a run without --shard), 0 when it has nothing more to
 * do, -1 on an error (every rank's). */
int ps_instr_collect(const ps_instr *in, ps_partial *p, const ps_instr_work *wk, int rc_run, ps_error *err);
/* An empty partial result of this run (its command and shard); takes the reference to meta. */
int ps_instr_partial_init(const ps_instr *in, ps_partial *p, int64_t n_units, json_t *meta, ps_error *err);


/* The knockout instrument (instr_knockout.c): sets up the instrument from a's flags (cmd_knockout.c's
 * table), checks --target, --layers, --heads, --method, --atp-fix and --verify against the model into a
 * ps_knockout_request, and runs the grid over those layers (any order) and heads of the family's target (by
 * index; target_name its name), exact or estimated (atp, atp_fix as interventions/atp.h), then, verify > 0,
 * the exact knockout of the estimate's top `verify` cells; split over shards and ranks, rank 0 (or the
 * shard's part file) writing the result. */
typedef struct {
    const int *layers, *heads;
    int n_layers, n_heads, target, atp, atp_fix;
    int64_t verify;
    const char *target_name;
    const ps_token_set *corrupt; /* the patch instrument's corrupt tokens (NULL: the knockout) */
} ps_knockout_request;
int ps_knockout_command(const ps_args *a, ps_error *err);
/* The patch instrument (cmd_patch.c's flags, run by instr_knockout.c as the knockout's grid with the activation-
 * patching spec, interventions/patching.h): the clean prompt set (--prompts, required) and the corrupt tokens
 * (--corrupt FILE, or the API's inline ps_args.corrupt) of the same N and T, the target, layers and heads as the
 * knockout's; every cell's entries patched from the corrupt run into the clean one; OUT/patch.json (kind
 * "patch": the knockout's grid with method "patch", grid.corrupt, and with alt each residue's patch_metric). */
int ps_patch_command(const ps_args *a, ps_error *err);

/* The selection-recall instrument (instr_recall.c, interventions/recall.h): the set-up, cmd_recall.c's flags checked
 * against the model (its selecting layers, the mode, the needle offset; a prompt set needs its needle column), the
 * sweep's units with the selected blocks read, split over shards and ranks, and the finish (recall.json, its
 * figure, the summary). */
int ps_recall_command(const ps_args *a, ps_error *err);

/* The sweep instrument (instr_sweep.c): the prefix-padding or move-mode sweep of the checkpoint's task
 * (any family: units (shift, batch), interventions/units.h), or of text-kv prompts (--task text-kv, or a
 * model trained on text-kv; units of the batches one process runs, ps_textkv_units); split over shards
 * and ranks, rank 0 (or the shard's part file) writing the result. The module sets up the instrument
 * (ps_instr_setup) from the flags of a. */
typedef struct {
    ps_sweep_mode mode;
    int mode_given;            /* --mode was given (a prompt set has no modes) */
    const char *save_prompts;  /* --save-prompts FILE: the task sweep's prompts written as a prompt set */
    const char *task;          /* --task: NULL or "model" (the checkpoint's own), "text-kv", or a task file */
    /* text-kv (NULL / -1 / 0 when not given): --tokenizer, --words, --values (0 numbers, 1 words), --pairs,
     * --value-digits; text_only_flag: the first of them given (refused unless the sweep is text-kv) */
    const char *tokenizer, *words, *text_only_flag;
    int values;
    int64_t pairs, value_digits;
} ps_sweep_request;
int ps_sweep_command(const ps_args *a, const ps_sweep_request *rq, ps_error *err);

/* The gates instrument (instr_gates.c): the gate statistics of the checkpoint's gates (its family's gate
 * data, core/runtime.h ps_gate_info, run by interventions/units.h: a compressed model's per-head gates, the per-channel gates of the channel
 * attention and of DeepSeek-V4 checkpoints) pooled over the shift-0 prompts in units (batches), with
 * log (may be NULL) a training log whose gate records are summarised; split over shards and ranks. */
typedef struct {
    const char *log;
} ps_gates_request;
int ps_gates_command(const ps_args *a, const ps_gates_request *rq, ps_error *err);

/* The gatecycle instrument (instr_gatecycle.c): its flags as cmd_gatecycle.c parsed them (the family
 * checks --branch, --params and the rest against the model: its core entry cycle_check, core/cycle.h); sets up the model
 * from a's common flags, then runs its work units (the --measure knockout grid before the cycle and the
 * sweep before it, then the same after it) split over shards and ranks, rank 0 (or the shard's part file)
 * writing the result. */
typedef struct {
    int64_t layer, shift, head;         /* head -1: not given */
    const char *branch, *params, *save; /* as given, or NULL */
    int measure_knockout;               /* --measure knockout: the per-head measure */
    double min_hurt;                    /* --min-hurt (pp) */
} ps_gatecycle_request;
int ps_gatecycle_command(const ps_args *a, const ps_gatecycle_request *rq, ps_error *err);

/* The probe instrument (instr_probe.c): cmd_probe.c's flags of a, checked and run against the served
 * model; says on stdout which scoring it used and why. */
int ps_probe_command(const ps_args *a, ps_error *err);

/* The fillers instrument (instr_fillers.c): cmd_fillers.c's flags of a; the checkpoint opened with
 * ps_runtime_open, the period from --period, the experiment's, else the family's default_period. */
int ps_fillers_command(const ps_args *a, ps_error *err);

/* The theory instrument (instr_theory.c): trains the idealised bigram-induction model with the options
 * cmd_theory.c read (gates/theory_train.h), prints the per-head summary and writes OUT/theory.json (--out
 * of a, default out/theory) and its figure; check_only: the gradient check alone. */
int ps_theory_command(const ps_args *a, const ps_theory_opts *o, int check_only, ps_error *err);

/* The atp-compare instrument (instr_atp_compare.c): the exact knockout.json against the estimate's (and,
 * times "EXACT.json,ATP.json", their timings), OUT/atp_compare.json (out NULL: the default) and its figure,
 * the summary on stdout; a gives the command line for provenance. */
int ps_atp_compare_command(const char *exact, const char *estimate, const char *times, const char *out, const ps_args *a,
                           ps_error *err);

/* The train instrument (instr_train.c): a training run of cfg into out (resume: continue it; stop >= 0: stop
 * after that many steps, with a checkpoint), its progress (the caller's callback from a), the timing
 * summary under MPI and the log's figure (rank 0). */
int ps_train_command(const ps_args *a, const ps_train_cfg *cfg, const char *out, int resume, int64_t stop, ps_error *err);

/* How each instrument finishes its result from complete partial results (rank 0, or phasescope merge):
 * the statistics in the one-process order, the JSON, its figures and the summary on stdout. */
int ps_sweep_finish(const ps_partial *p, const ps_out *out, ps_error *err);
int ps_knockout_finish(const ps_partial *p, const ps_out *out, ps_error *err);
int ps_recall_finish(const ps_partial *p, const ps_out *out, ps_error *err);
int ps_gatecycle_finish(const ps_partial *p, const ps_out *out, ps_error *err);
int ps_gates_finish(const ps_partial *p, const ps_out *out, ps_error *err);

/* progress callback for ps_progress_fn: the progress line, then the caller's callback (in->progress, from
 * ps_args.progress), whose non-zero return stops the engine */
int ps_instr_progress(int64_t done, int64_t total, void *user);

#endif
