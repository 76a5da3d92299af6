/* knockout.h — mean-replacement KV-head knockout (SPEC §6). For layer l and KV head g, that head's
 * compressed entries (hook_ck and hook_cv), raw entries (hook_k and hook_v) or both are replaced by
 * their mean over the evaluation prompts of the same shift p, position by position. A grid runs every
 * chosen (layer, head) over the prefix-padding sweep and reports per residue the change in accuracy
 * and in mean target NLL against the clean run.
 *
 * Cost: per prompt batch and shift, one clean pass keeps every layer's activations; cells then run from
 * the attention of layer l on (layers visited top-down, so the kept activations below stay clean) —
 * layers below l and layer l's projections and compressor are never recomputed. */
#ifndef PS_KNOCKOUT_H
#define PS_KNOCKOUT_H

#include <jansson.h>

#include "sweep.h"

typedef enum { PS_KO_RAW = 1, PS_KO_COMPRESSED = 2, PS_KO_BOTH = 3 } ps_ko_target;

typedef struct {
    int64_t P;
    int n_layers, n_heads; /* selected */
    int *layers, *heads;
    ps_residue_stats clean;
    ps_residue_stats *cells; /* [n_layers · n_heads], layer-major */
} ps_knockout_result;

/* naive = 1 runs a full forward with overwrite hooks for every cell (the reference the bench and
 * tests compare with). */
int ps_knockout_grid(const ps_model *m, const ps_batch *base, const ps_task *task, const ps_filler_family *fam,
                     int64_t P, uint64_t seed, int64_t batch, const int *layers, int n_layers, const int *heads,
                     int n_heads, ps_ko_target target, int naive, ps_knockout_result *out, ps_progress_fn progress,
                     void *user, ps_error *err);
void ps_knockout_result_free(ps_knockout_result *r);

/* {"period", "target", "clean": {...curve...}, "cells": [{"layer", "head", "residues": [{"rho",
 * "delta_accuracy_pp", "delta_nll", "accuracy", "mean_nll"}], "mean_delta_accuracy_pp",
 * "mean_delta_nll", "worst_residue": {"rho", "clean_accuracy", "accuracy", "delta_accuracy_pp",
 * "delta_nll"}}]}. NULL with err set when memory runs out. */
json_t *ps_knockout_json(const ps_knockout_result *r, ps_ko_target target, ps_error *err);

#endif
