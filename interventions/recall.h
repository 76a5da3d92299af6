/* recall.h — selection recall per phase (docs/recall.md): on a model that selects blocks (core/select.h; a family
 * with a `sel` entry, core/runtime.h ps_family_select), for every scored query of the sweep's prompts (the shifted
 * prompts of the checkpoint's task, or a caller's prompt set with a needle column), whether each selecting layer's
 * KV head chose the block holding the needle at the query's row — the row whose next-token prediction is scored.
 *
 * The needle of a query is its key_pos (the task's t_K, the position whose residue labels the query; a prompt set's
 * "needle") plus an offset; its block is needle / block. The record per (query, layer, KV head) is one code:
 * MISSED (the block is not among the row's blocks), CHOSEN (selected by score), FORCED (among the forced blocks:
 * an initial block, or the query's own block or one of the local_blocks before it — selected whatever the scores),
 * DENSE (the layer attends every key at that prompt length: fewer than dense_len tokens). The recall of a cell at
 * residue ρ is the share of its queries whose code is not MISSED.
 *
 * The forwards are the sweep's own (interventions/units.h, ps_sweep_units_hooked): the same batches, so the
 * accuracy per residue comes with the recall from one pass, and a split run (--shard, MPI) keeps per-query codes
 * that the finish adds up in the one-process order. */
#ifndef PS_RECALL_H
#define PS_RECALL_H

#include <jansson.h>
#include <stdint.h>

#include "core/error.h"
#include "core/runtime.h"
#include "interventions/shifted.h"
#include "interventions/units.h"

enum { PS_RECALL_MISSED = 0, PS_RECALL_CHOSEN = 1, PS_RECALL_FORCED = 2, PS_RECALL_DENSE = 3 };

/* What is recorded: layers[n_layers] (each must select blocks at some prompt length: ps_recall_spec_init checks
 * the family), n_kv KV heads each, the needle at key_pos + offset. Codes per scored query: n_layers · n_kv,
 * layer-major. */
typedef struct {
    int n_layers;
    int *layers;
    int64_t n_kv;
    int64_t offset;
    ps_select_geom geom; /* the first layer's geometry at the spec's prompt length (what the result reports) */
} ps_recall_spec;

/* The spec for `layers` (NULL: every layer of the model) of rt at prompts of T tokens: an error naming the family or
 * the layer when one selects no blocks there (the family's reason), or when the layers' geometries differ. */
int ps_recall_spec_init(ps_recall_spec *s, const ps_runtime *rt, const int *layers, int n_layers, int64_t T, int64_t offset,
                        ps_error *err);
void ps_recall_spec_free(ps_recall_spec *s);

/* The code of one row's blocks (slots of them, -1 empty) for the needle's block nb at row t (core/select.h's forced
 * blocks: nb < init_blocks, or t / block − local_blocks <= nb <= t / block). */
int ps_recall_code(const float *blocks, int64_t slots, int64_t nb, int64_t t, const ps_select_cfg *c);

/* Sweep units [u0, u1) (ps_sweep_units_hooked's arguments) with the codes: query k of the unit arrays (the sweep's
 * index) gets codes[k · n_layers · n_kv ...]; an unscored query's codes are -1. An error names the query whose needle
 * lies after its row or outside the prompt. */
int ps_recall_units(const ps_runtime *rt, const ps_recall_spec *sp, const ps_batch *base, const ps_task *task,
                    const ps_filler_family *fam, ps_sweep_mode mode, int64_t P, uint64_t seed, const ps_shifted *given,
                    int64_t batch, int64_t u0, int64_t u1, int32_t *ok, double *lp, int32_t *rho, int32_t *codes,
                    ps_progress_fn progress, void *user, ps_error *err);

/* The result's statistics from n_items queries' codes (n_cells = n_layers · n_kv per query) and residues rho (those
 * in [0, P) count): {"cells": [{"layer", "head", "mean_recall", "min_recall", "max_recall", "gap_pp", "worst_rho",
 * "residues": [{"rho", "n", "found", "forced", "dense", "recall", "ci_low", "ci_high"}]}], "layers": [{"layer",
 * "residues": [{"rho", "n", "any_head", "mean_heads"}]}], "any_cell": [{"rho", "n", "any_cell"}]} (any_cell: the share
 * of queries whose needle's block some recorded cell, of any layer, attends); NULL with err on a bad code. recall [n_cells, P] (may be
 * NULL) gets the recall of each cell and residue (NaN where n is 0). */
json_t *ps_recall_stats_json(const int32_t *codes, const int32_t *rho, int64_t n_items, const int *layers, int n_layers, int64_t n_kv,
                             int64_t P, double *recall, ps_error *err);

#endif
