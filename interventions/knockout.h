/* knockout.h — mean-replacement KV-head knockout (SPEC §6). For layer l and KV head g, that head's
 * compressed entries (hook_ck and hook_cv), raw entries (hook_k and hook_v) or both are replaced by
 * their mean over the evaluation prompts of the same shift p, position by position. A grid runs every
 * chosen (layer, head) over the prefix-padding sweep and reports per residue the change in accuracy
 * and in mean target NLL against the clean run.
 *
 * Both paths are built from the public hook mechanism: a cell is a mean-replacement action
 * (PS_ACT_SET on blocks.{l}.attn.hook_k/hook_v/hook_ck/hook_cv, head g, from the mean [npos, nkv, hd]),
 * registered with ps_hooks_add_action as a user would, and fired by the forward.
 *
 * Cost: per shift, one pass over the prompts sums the replaced arrays on the model's context (in double,
 * ps_accumulate_seqs, then ps_sum_to_mean) and keeps every layer's activations of a batch (the last batch
 * is scored from it directly; earlier batches are rerun once, clean). Cells then restart from the clean
 * state at layer l's attention (copied with copy ops): the cells of one layer run in batches, k cells ×
 * m prompts as k·m sequences of one forward (replica c = sequences [c·m, (c+1)·m) gets its own head's
 * action), as many as a memory budget allows; the restart (ps_forward_from_attention_rows) fires the
 * actions on layer l's kept k/v/ck/cv, stops at the last answer row (causal) and its last layer computes
 * the answer rows only, which a row gather and scatter put into the clean pass's logits for scoring.
 * Layers below l and layer l's projections and compressor are never recomputed. The naive path runs a
 * full forward per cell with the same actions on the whole batch. See docs/design.md, "Knockout grid".
 *
 * The knockout is a spec over the grid engine (grid.h): its sources are sum actions on the reference
 * pass (the clean run) divided into means, its cells set actions from the means; every family describes
 * its targets as data of its core table (core/runtime.h: ko.targets, ko.arrays; the shipped ones in
 * core/ko_targets.c) and one spec builds the grids (ko_spec.h), so one call (ps_knockout_run) runs any family's knockout,
 * whole or as a work slice; the tests and benches call it too (the controlled model's target index is
 * ps_ko_target − 1). */
#ifndef PS_KNOCKOUT_H
#define PS_KNOCKOUT_H

#include <jansson.h>

#include "scaleout/partial.h"
#include "interventions/grid.h"
#include "interventions/ko_model.h"
#include "interventions/sweep.h"
#include "tasks/tasks.h"

typedef ps_grid_result ps_knockout_result;
typedef ps_grid_record_fn ps_ko_record_fn;

/* Default memory for the batched cells' activations: 1 GiB, at most a quarter of available memory. */
#define PS_KO_DEFAULT_BUDGET PS_GRID_DEFAULT_BUDGET
double ps_knockout_default_budget(void);

/* How the cells run (grid.h: ps_grid's fields of the same names). */
typedef struct {
    int naive;        /* 1: a full forward with the mean-replacement actions per cell (the reference) */
    int max_cells;    /* most cells batched into one forward; 0: as many as the budget holds (1: one at a time) */
    double mem_bytes; /* bytes for the batched cells' activations; 0: ps_knockout_default_budget() */
    /* Work slice: only the units [unit0, unit1) of the grid's work list run (unit1 = 0: all); see grid.h.
     * `out` then holds only the slice's statistics; record (when set) receives every scored set's
     * outcomes. */
    int64_t unit0, unit1;
    ps_ko_record_fn record;
    void *record_user;
    /* method: 0 the exact grid, 1 attribution patching (atp.h: one backward per batch, every cell
     * estimated; atp_fix a ps_atp_fix); cell_mask (grid.h; NULL: every cell): only these cells run */
    int atp, atp_fix;
    const unsigned char *cell_mask;
} ps_knockout_opts;

/* A knockout of any family: the prompts, the cells (layers × heads; a per-layer target has the one
 * cell 0), the family's target by index into ps_knockout_targets(rt). */
typedef struct {
    const ps_runtime *rt;
    const ps_batch *base;
    const ps_task *task;
    const ps_filler_family *fam;
    const ps_shifted *prompts; /* a caller's prompt set (promptset.h), or NULL: the sweep of base */
    int64_t P;
    uint64_t seed;
    int64_t batch;
    const int *layers;
    int n_layers;
    const int *heads; /* NULL for a per-layer target */
    int n_heads;
    int target;
    ps_knockout_opts opts;
    ps_progress_fn progress;
    void *progress_user;
    /* Activation patching instead of the mean replacement (patching.h, ps_patch_target_spec): the corrupt
     * tokens [N, T] of the prompt set's N prompts (prompts required; NULL: the knockout). Each cell's entries
     * of the target are patched from the corrupt run into the clean prompts, same positions; the corrupt
     * run's outcomes (scored against the clean prompts' queries) go to the result's `ref` (and to
     * opts.record as cell PS_GRID_REF). Not with atp. */
    const int32_t *corrupt;
} ps_knockout_spec;

int ps_knockout_run(const ps_knockout_spec *k, ps_knockout_result *out, ps_error *err);

/* The family's knockout targets (names, NULL-terminated), its default for this model, what a cell is
 * ("head" / "query head" / "layer"), how many heads a target's cells choose from (0: one cell per
 * layer), and whether layer l has what target t replaces (NULL, or an error message naming why not). */
const char *const *ps_knockout_targets(const ps_runtime *rt);
int ps_knockout_default_target(const ps_runtime *rt);
int64_t ps_knockout_target_heads(const ps_runtime *rt, int target);
const char *ps_knockout_layer_missing(const ps_runtime *rt, int target, int layer, char *buf, size_t n);
/* The same for prompts of T tokens (a family whose entries depend on the length: MiniCPM4's dense path, a
 * prompt shorter than a window): the default target at T, and whether layer has what the target replaces at T
 * (the family's default_at / missing_at; without them, the length-free answers above). The lengths a request
 * runs: T0 .. T1 (a prompt set: its T; a task sweep: the task's seq_len .. + P - 1); the first that lacks it is
 * named (NULL: every one has it). */
int ps_knockout_default_target_at(const ps_runtime *rt, int64_t T);
const char *ps_knockout_layer_missing_at(const ps_runtime *rt, int target, int layer, int64_t T, char *buf, size_t n);
const char *ps_knockout_layer_missing_in(const ps_runtime *rt, int target, int layer, int64_t T0, int64_t T1, char *buf, size_t n);
/* what a cell of target t is in the result (NULL: not recorded) and what --heads counts */
const char *ps_knockout_unit(const ps_runtime *rt, int target);
const char *ps_knockout_heads_what(const ps_runtime *rt);

void ps_knockout_result_free(ps_knockout_result *r);

/* mask [n_layers · n_heads] (r's order): 1 for the K cells with the largest worst-residue increase of
 * mean target NLL (ties: the earlier cell), 0 elsewhere — what `--verify K` checks of an estimate. */
void ps_knockout_top_cells(const ps_knockout_result *r, int64_t K, unsigned char *mask);

/* The work list (grid.h): units (shift, batch, layer). */
int64_t ps_knockout_n_units(int64_t N, int64_t batch, int64_t P, int n_layers);

/* A split run's partial result (dist/partial.h, docs/scale-out.md): per unit the clean outcomes of its
 * batch (its li = 0 unit: rho, clean_ok, clean_logprob) and its cells' (cell_ok, cell_logprob, head
 * after head); ps_knockout_record (opts.record, user a recorder) fills them as the grid scores, and
 * ps_knockout_from_partial adds complete parts up in the one-process order (the meta holds "layers"
 * top-down, "heads", "period", "max_q", "target"). */
typedef struct {
    ps_partial *p;
    int nh;
} ps_knockout_recorder;
int ps_knockout_partial_layout(ps_partial *p, int64_t N, int64_t batch, int64_t P, int n_layers, int n_cells, int64_t maxq,
                               int last_first, ps_error *err);
/* The same with activation patching's corrupt-run arrays ("corrupt_ok", "corrupt_logprob" on each batch's li =
 * 0 unit), which ps_knockout_record fills (cell PS_GRID_REF) and ps_knockout_from_partial adds into the
 * result's `ref`; ps_knockout_logit_diff then adds grid.corrupt's logit differences and each cell residue's
 * "patch_metric" (patched − corrupt) / (clean − corrupt), null where clean and corrupt do not differ. */
int ps_patch_partial_layout(ps_partial *p, int64_t N, int64_t batch, int64_t P, int n_layers, int n_cells, int64_t maxq,
                            int last_first, ps_error *err);
void ps_knockout_record(void *user, int64_t unit, int cell, int64_t first, const ps_shifted *set, const int *ok,
                        const double *lp);
int ps_knockout_from_partial(const ps_partial *p, ps_knockout_result *out, ps_error *err);
/* A prompt set with alt answers (interventions/promptset.h): the logit difference answer − alt per residue into
 * the result's grid JSON (clean.residues[r].mean_logit_diff; each cell's mean_logit_diff and delta_logit_diff
 * against the clean run's), from the complete partial p. 1 when added, 0 when p holds no alt query, -1 on an error. */
int ps_knockout_logit_diff(const ps_partial *p, json_t *grid, ps_error *err);

/* {"period", "target", ["unit",] "clean": {...curve...}, "cells": [{"layer", "head", "residues": [{"rho",
 * "delta_accuracy_pp", "delta_nll", "accuracy", "mean_nll"}], "mean_delta_accuracy_pp",
 * "mean_delta_nll", "worst_residue": {"rho", "clean_accuracy", "accuracy", "delta_accuracy_pp",
 * "delta_nll"}}]}; target: the target's name, unit (NULL: none) what a cell is. NULL with err set when
 * memory runs out. */
json_t *ps_knockout_json(const ps_knockout_result *r, const char *target, const char *unit, ps_error *err);
/* The same with the method: "method" "exact" (atp NULL) or "atp" (an estimate: "atp": {"fix", "verified",
 * "rank"}; per cell the estimated statistics, accuracies null, and "exact": null or the cell's exact
 * knockout — residues, means and worst residue — when verified[cell] (cells as r's, layer index major)
 * with its statistics in exact->cells). */
typedef struct {
    const char *fix;
    const unsigned char *verified;   /* [n_layers · n_heads] of r's order, or NULL */
    const ps_knockout_result *exact; /* the verification grid (same layers and heads), or NULL */
} ps_knockout_atp_json;
json_t *ps_knockout_json_ex(const ps_knockout_result *r, const char *target, const char *unit, const ps_knockout_atp_json *atp,
                            ps_error *err);

#endif
