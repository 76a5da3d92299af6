/* units.h — the instruments' work split into units, in the one-process order (docs/scale-out.md).
 *
 * A split run (MPI ranks, or --shard I/N) runs a contiguous range of units per process and keeps every
 * per-item outcome (a query's correct flag, target log-probability and residue; a window's gate
 * distribution); once every unit's outcomes are together they are added up in the order one process adds
 * them (ps_residue_stats_add_items, ps_gate_acc_replay), so the statistics are the same bits whatever the
 * split. A unit always runs the very forward batch one process runs (same prompts, same batch), so the
 * outcomes themselves do not depend on the split either.
 *
 *   - sweep (and each of gatecycle's two sweeps): unit (p, j) = p · n_batches + j: shift p, prompts
 *     [j · batch, min(N, (j + 1) · batch)). Outcome arrays [P, N, max_q] (unit after unit).
 *   - sweep --task text-kv: shift p's prompts in the batches one process runs them in (ps_textkv_units:
 *     as many per forward as the memory budget holds at the shift's padded length); outcome arrays as
 *     the sweep's.
 *   - gates (every family with gate data: its core entries gates, gates.taps): unit j = batch j of shift 0;
 *     per unit the gate distributions of every window, as the hooks fired them (ps_gate_units).
 *   - knockout (every family): units (shift, batch, layer) of the grid engine (grid.h, ps_grid_unit). */
#ifndef PS_UNITS_H
#define PS_UNITS_H

#include <stdint.h>

#include "gates/gates.h"
#include "interventions/grid.h"
#include "interventions/knockout.h"
#include "interventions/sweep.h"
#include "interventions/textkv.h"
#include "tasks/tasks.h"

int64_t ps_sweep_n_batches(int64_t N, int64_t batch);

/* Sweep units [u0, u1) of a sweep over P shifts on any family's runtime (grid.h): query q of prompt i of shift p goes to index
 * (p · N + i) · max_q + q of ok, lp and rho (rho: its residue, −1 when not scored). progress(units done
 * of this range, units in it) may be NULL. */
int ps_sweep_units(const ps_runtime *rt, const ps_batch *base, const ps_task *task, const ps_filler_family *fam,
                   ps_sweep_mode mode, int64_t P, uint64_t seed, int64_t batch, int64_t u0, int64_t u1, int32_t *ok,
                   double *lp, int32_t *rho, ps_progress_fn progress, void *user, ps_error *err);

/* The same over a caller's prompt set (promptset.h: one shift, set->P residues): units are its batches, query q
 * of prompt i at index i · max_q + q. */
int ps_promptset_sweep_units(const ps_runtime *rt, const ps_shifted *set, int64_t batch, int64_t u0, int64_t u1, int32_t *ok,
                             double *lp, int32_t *rho, ps_progress_fn progress, void *user, ps_error *err);

/* The sweep's units with hooks chosen per forward batch (what an instrument that reads activations during the sweep's
 * own forwards needs: the selection recall, recall.h): before batch v's forward (its outcomes at index `at` of
 * ok / lp / rho) begin gives the hooks to run it with (*h NULL: none); after it, end (may be NULL). */
typedef struct {
    int (*begin)(void *user, const ps_shifted *v, int64_t at, const ps_hooks **h, ps_error *err);
    int (*end)(void *user, ps_error *err);
    void *user;
} ps_batch_hooks;
/* ps_sweep_units (given NULL) or ps_promptset_sweep_units (given the set; base, task, fam, mode, seed unused) with bh. */
int ps_sweep_units_hooked(const ps_runtime *rt, const ps_batch *base, const ps_task *task, const ps_filler_family *fam, ps_sweep_mode mode,
                          int64_t P, uint64_t seed, const ps_shifted *given, int64_t batch, const ps_batch_hooks *bh, int64_t u0, int64_t u1,
                          int32_t *ok, double *lp, int32_t *rho, ps_progress_fn progress, void *user, ps_error *err);

/* Weights of the sweep units for the split (prompts × tokens): w[P · n_batches]. */
void ps_sweep_unit_weights(int64_t N, int64_t batch, int64_t P, int64_t T, ps_sweep_mode mode, int64_t *w);

/* Add n items (ok, lp, rho as above) in order: what ps_residue_stats_add does for the same queries. */
void ps_residue_stats_add_items(ps_residue_stats *r, const int32_t *ok, const double *lp, const int32_t *rho, int64_t n);

/* Gates, for every family from its gate data (core/runtime.h: its `gates` and `gates.taps` entries, ps_gate_info,
 * ps_gate_tap): the gate distributions of one batch as the family's hooks fire them. Per record (one tap as it
 * fired) g->ints ints in `records` (PS_GATE_REC_WINDOWS: layer, branch, windows; PS_GATE_REC_SEQ_WINDOWS:
 * layer, branch, sequences, windows) and the event's floats in alpha. */
#define PS_GATES_EVENT_INTS PS_GATE_REC_WINDOWS /* per-head gates (the compressed attention) */
#define PS_CHGATES_RECORD_INTS PS_GATE_REC_SEQ_WINDOWS /* per-channel gates (the channel attention, DeepSeek-V4) */
/* The family's gate data (g: its records, layout and log) or why it has none: 0, or -1 with err ("... have no gate
 * statistics" for a family without the entries, the family's reason for a model without gates). */
int ps_gate_info_of(const ps_runtime *rt, ps_gate_info *g, ps_error *err);
/* Records and floats of one unit of n prompts of T tokens (the family's taps). */
int ps_gate_unit_size(const ps_runtime *rt, int64_t n, int64_t T, int64_t *n_records, int64_t *n_floats, ps_error *err);
/* Run units [u0, u1) (batches of the shift-0 prompts s, through the family's score with rt->token_map, as the
 * sweep's) on any family with gate data; unit u's records and floats go to records + rec_off[u] · ints and
 * alpha + al_off[u]. */
int ps_gate_units(const ps_runtime *rt, const ps_shifted *s, int64_t batch, int64_t u0, int64_t u1, const int64_t *rec_off,
                  const int64_t *al_off, int32_t *records, float *alpha, ps_error *err);
/* The summary of a training log's gate records (the family's log kind, g->log): NULL with err set for a bad log,
 * one of another model, or a family without phasescope training logs (a usage error). */
json_t *ps_gate_log(const ps_runtime *rt, const ps_gate_info *g, const char *path, ps_error *err);
/* Pool recorded per-head events (PS_GATES_EVENT_INTS) into acc in order (what the gate hooks did in one process). */
int ps_gate_acc_replay(ps_gate_acc *acc, const int32_t *events, int64_t n_events, const float *alpha, int64_t n_floats,
                       ps_error *err);
/* Pool per-channel records (PS_CHGATES_RECORD_INTS) into acc in order. */
int ps_chgate_replay(ps_chgate_acc *acc, const int32_t *records, int64_t n_records, const float *alpha, int64_t n_floats,
                     ps_error *err);

/* A per-channel accumulator's layout as plain data, for a finish that has no model (the family's, ps_gate_info):
 * {"model", "branches": [names], "n_layers", "gates": [[layer, branch, S, d, skip_first, rate, attention], ...]}
 * (the gates that exist); and an empty accumulator from it (its branch names point into `layout`, which
 * must outlive it), *model its "model". -1 with err naming the bad field. */
json_t *ps_chgate_layout_json(const ps_chgate_acc *acc, const char *model);
int ps_chgate_layout_acc(const json_t *layout, ps_chgate_acc *acc, const char **model, ps_error *err);

/* ---- sweep --task text-kv ----
 * Shift p's prompts are padded to their longest, T[p] tokens; one process runs them in batches of
 * ps_eval_batch_fit(c, T[p], batch, 0) (ps_eval_shifted_fit), or, when that is 0, one at a time through
 * the chunked prefill. Unit = one such batch (prefill: `batch` prompts), shift after shift, so a unit is
 * the very forward one process runs and the outcomes do not depend on the split. */
typedef struct {
    int64_t P, N, n_units;
    int64_t *first; /* [P + 1]: shift p's units are [first[p], first[p + 1]) */
    int64_t *size;  /* [P]: prompts per unit of shift p */
    int64_t *T;     /* [P]: shift p's padded length */
} ps_textkv_units;
/* The unit list of N prompts per shift from the shifts' padded lengths T[P] (copied). */
int ps_textkv_units_init(ps_textkv_units *u, const ps_config *c, const int64_t *T, int64_t P, int64_t N, int64_t batch,
                         ps_error *err);
void ps_textkv_units_free(ps_textkv_units *u);
/* Unit k: shift *p, prompts [*i0, *i0 + *n). */
void ps_textkv_unit(const ps_textkv_units *u, int64_t k, int64_t *p, int64_t *i0, int64_t *n);
/* Split weights (prompts × tokens): w[n_units]. */
void ps_textkv_unit_weights(const ps_textkv_units *u, int64_t *w);
/* Run units [k0, k1) of the text-kv sweep of `set` (interventions/textkv.h) on m: outcomes of query q of
 * prompt i of shift p at (p · N + i) · n_queries + q of ok, lp and rho (as ps_sweep_units).
 * progress(units done of this range, units in it) may be NULL. */
int ps_textkv_sweep_units(const ps_model *m, const ps_textkv_set *set, ps_sweep_mode mode, uint64_t seed, const ps_textkv_units *u,
                          int64_t k0, int64_t k1, int32_t *ok, double *lp, int32_t *rho, ps_progress_fn progress, void *user,
                          ps_error *err);

#endif
