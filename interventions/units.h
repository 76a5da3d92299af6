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
 *   - gates (every family: grid.h's gates entries): unit j = batch j of shift 0; per unit the gate
 *     distributions of every window, as the hooks fired them (ps_gates_units; the channel attention's
 *     per-channel gates as ps_chgates_units records them).
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

/* The controlled model's per-channel gates (the channel attention, gates/chgates.h): per record (a layer's
 * blocks.L.attn.hook_gate_k as it fired) PS_CHGATES_RECORD_INTS ints (layer, branch 0, sequences,
 * windows) and its alpha [B, nW, S, hd]; the layout of v4_instr.h's records, so ps_v4_gates_replay pools
 * them into ps_chgate_init_model's accumulator. */
#define PS_CHGATES_RECORD_INTS 4
void ps_chgates_unit_size(const ps_config *c, int64_t n, int64_t T, int64_t *n_records, int64_t *n_floats);
int ps_chgates_units(const ps_model *m, const ps_shifted *s, int64_t batch, int64_t u0, int64_t u1, const int64_t *ev_off,
                     const int64_t *al_off, int32_t *records, float *alpha, ps_error *err);

/* The controlled model's gates entries of its runtime (grid.h): the compressed attention's per-head
 * gates (ps_gates_units, "events") or the channel attention's per-channel gates (ps_chgates_units,
 * "ch_events"); full attention has none. Its training log: ps_gates_log_summary (checked against the
 * model's layers and KV heads) or ps_chgate_log_summary. */
const char *ps_model_gates_missing(const ps_runtime *rt, char *buf, size_t n);
const char *ps_model_gates_records(const ps_runtime *rt, int *ints_per_record);
void ps_model_gates_unit_size(const ps_runtime *rt, int64_t n, int64_t T, int64_t *n_records, int64_t *n_floats);
int ps_model_gates_units(const ps_runtime *rt, const ps_shifted *s, int64_t batch, int64_t u0, int64_t u1, const int64_t *ev_off,
                         const int64_t *al_off, int32_t *events, float *alpha, ps_error *err);
json_t *ps_model_gates_log(const ps_runtime *rt, const char *path, ps_error *err);
/* The channel attention's accumulator (ps_chgate_init_model) and its result's "gates.model" ("v4"): 1;
 * 0 for the compressed attention's per-head gates. */
int ps_model_gates_chacc(const ps_runtime *rt, ps_chgate_acc *acc, const char **model, ps_error *err);

/* A per-channel accumulator's layout as plain data, for a finish that has no model (gates_chacc, grid.h):
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
