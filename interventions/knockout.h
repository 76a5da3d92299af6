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
 * full forward per cell with the same actions on the whole batch. See docs/design.md, "Knockout grid". */
#ifndef PS_KNOCKOUT_H
#define PS_KNOCKOUT_H

#include <jansson.h>

#include "interventions/sweep.h"
#include "tasks/tasks.h"

typedef enum { PS_KO_RAW = 1, PS_KO_COMPRESSED = 2, PS_KO_BOTH = 3 } ps_ko_target;

typedef struct {
    int64_t P;
    int n_layers, n_heads; /* selected */
    int *layers, *heads;
    ps_residue_stats clean;
    ps_residue_stats *cells; /* [n_layers · n_heads], layer-major */
    int cells_per_forward;   /* batched path: the most cells one forward ran (0 for the naive path) */
    int64_t prompts_per_forward; /* batched path: prompts per cell in one forward (the batch unless the budget is smaller) */
} ps_knockout_result;

/* Default memory for the batched cells' activations: 1 GiB, at most a quarter of available memory. */
#define PS_KO_DEFAULT_BUDGET (1024.0 * 1024.0 * 1024.0)
double ps_knockout_default_budget(void);

/* The outcomes of one scored set of prompts (for split runs, docs/scale-out.md): `unit` is the work unit
 * it belongs to, cell -1 the clean run, else li · n_heads + hi (li: index in the result's top-down layer
 * order); the set (its prompts, their queries and residues) is prompts [first, first + set->b.B) of the
 * unit's batch; ok, lp: [set->b.B · max_q], as ps_residue_stats_add reads them. */
typedef void (*ps_ko_record_fn)(void *user, int64_t unit, int cell, int64_t first, const ps_shifted *set, const int *ok,
                                const double *lp);

typedef struct {
    int naive;        /* 1: a full forward with the mean-replacement actions per cell (the reference) */
    int max_cells;    /* most cells batched into one forward; 0: as many as the budget holds (1: one at a time) */
    double mem_bytes; /* bytes for the batched cells' activations; 0: ps_knockout_default_budget() */
    /* Work slice: only the units [unit0, unit1) of the grid's work list run (unit1 = 0: all). Unit
     * (p, b, li) is one selected layer's cells on one batch of one shift, numbered in visiting order
     * (ps_knockout_unit): shifts ascending, batches from the last to the first, layers top-down. A shift
     * with a unit in the slice runs its whole mean pass, a batch its clean forward; the clean outcomes of a
     * batch belong to its unit with li = 0. `out` then holds only the slice's statistics; record (when
     * set) receives every scored set's outcomes. */
    int64_t unit0, unit1;
    ps_ko_record_fn record;
    void *record_user;
} ps_knockout_opts;

/* The work list of a grid over N prompts in batches of `batch`, P shifts and n_layers selected layers:
 * its unit count, and what unit u is: shift *p, batch starting at prompt *i0 with *n prompts, layer index
 * *li (into the top-down order). */
int64_t ps_knockout_n_units(int64_t N, int64_t batch, int64_t P, int n_layers);
void ps_knockout_unit(int64_t N, int64_t batch, int n_layers, int64_t u, int64_t *p, int64_t *i0, int64_t *n, int *li);

/* naive = 1 runs a full forward with the mean-replacement actions for every cell (the reference the
 * bench and tests compare with). */
int ps_knockout_grid(const ps_model *m, const ps_batch *base, const ps_task *task, const ps_filler_family *fam,
                     int64_t P, uint64_t seed, int64_t batch, const int *layers, int n_layers, const int *heads,
                     int n_heads, ps_ko_target target, int naive, ps_knockout_result *out, ps_progress_fn progress,
                     void *user, ps_error *err);
/* The same with options (opts may be NULL: the defaults, batched). */
int ps_knockout_grid_opts(const ps_model *m, const ps_batch *base, const ps_task *task, const ps_filler_family *fam,
                          int64_t P, uint64_t seed, int64_t batch, const int *layers, int n_layers, const int *heads,
                          int n_heads, ps_ko_target target, const ps_knockout_opts *opts, ps_knockout_result *out,
                          ps_progress_fn progress, void *user, ps_error *err);
void ps_knockout_result_free(ps_knockout_result *r);

/* {"period", "target", "clean": {...curve...}, "cells": [{"layer", "head", "residues": [{"rho",
 * "delta_accuracy_pp", "delta_nll", "accuracy", "mean_nll"}], "mean_delta_accuracy_pp",
 * "mean_delta_nll", "worst_residue": {"rho", "clean_accuracy", "accuracy", "delta_accuracy_pp",
 * "delta_nll"}}]}. NULL with err set when memory runs out. */
json_t *ps_knockout_json(const ps_knockout_result *r, ps_ko_target target, ps_error *err);

#endif
