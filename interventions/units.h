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
 *   - gates: unit j = batch j of shift 0; per unit the gate distributions of every window, as the hooks
 *     fired them (ps_gates_units).
 *   - knockout (every family): units (shift, batch, layer) of the grid engine (grid.h, ps_grid_unit). */
#ifndef PS_UNITS_H
#define PS_UNITS_H

#include <stdint.h>

#include "gates/gates.h"
#include "interventions/grid.h"
#include "interventions/knockout.h"
#include "interventions/sweep.h"
#include "tasks/tasks.h"

int64_t ps_sweep_n_batches(int64_t N, int64_t batch);

/* Sweep units [u0, u1) of a sweep over P shifts on any family's runtime (grid.h): query q of prompt i of shift p goes to index
 * (p · N + i) · max_q + q of ok, lp and rho (rho: its residue, −1 when not scored). progress(units done
 * of this range, units in it) may be NULL. */
int ps_sweep_units(const ps_runtime *rt, const ps_batch *base, const ps_task *task, const ps_filler_family *fam,
                   ps_sweep_mode mode, int64_t P, uint64_t seed, int64_t batch, int64_t u0, int64_t u1, int32_t *ok,
                   double *lp, int32_t *rho, ps_progress_fn progress, void *user, ps_error *err);

/* Weights of the sweep units for the split (prompts × tokens): w[P · n_batches]. */
void ps_sweep_unit_weights(int64_t N, int64_t batch, int64_t P, int64_t T, ps_sweep_mode mode, int64_t *w);

/* Add n items (ok, lp, rho as above) in order: what ps_residue_stats_add does for the same queries. */
void ps_residue_stats_add_items(ps_residue_stats *r, const int32_t *ok, const double *lp, const int32_t *rho, int64_t n);

/* Gates: the windows' gate distributions of one batch, as the hooks fire them: per event (a layer's key
 * or value gates) three ints in `events` (layer, branch, windows) and windows · n_kv · W floats in alpha. */
#define PS_GATES_EVENT_INTS 3
/* Events and floats of one unit of n prompts of T tokens. */
void ps_gates_unit_size(const ps_config *c, int64_t n, int64_t T, int64_t *n_events, int64_t *n_floats);
/* Run units [u0, u1) (batches of the shift-0 prompts s); unit u's events and floats go to
 * events + ev_off[u] · PS_GATES_EVENT_INTS and alpha + al_off[u]. */
int ps_gates_units(const ps_model *m, const ps_shifted *s, int64_t batch, int64_t u0, int64_t u1, const int64_t *ev_off,
                   const int64_t *al_off, int32_t *events, float *alpha, ps_error *err);
/* Pool recorded events into acc in order (what the gate hooks did in one process). */
int ps_gate_acc_replay(ps_gate_acc *acc, const int32_t *events, int64_t n_events, const float *alpha, int64_t n_floats,
                       ps_error *err);


#endif
