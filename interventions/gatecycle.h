/* gatecycle.h — gate offset cycling (SPEC §6) above core: the comparison of the curves before and after
 * (ps_cycle_analyse), chance accuracy, and the per-head measure's analysis (ps_gatecycle_per_head_json). The
 * cycle itself is the family's (its core entries cycle.check, cycle, cycle.meta over a ps_cycle_req:
 * core/cycle.h, which this header includes); the instrument's one run and finish for every family are
 * instruments/instr_gatecycle.c's. */
#ifndef PS_GATECYCLE_H
#define PS_GATECYCLE_H

#include <jansson.h>
#include <stdint.h>

#include "core/cycle.h"
#include "core/error.h"
#include "interventions/grid.h"
#include "core/model.h"
#include "tasks/tasks.h"

/* Chance accuracy of a task's scored answers: kv-retrieval (1/n_values)^value_len, bigram 1/n_context. */
double ps_task_chance(const ps_task *t);

/* A residue is near chance when its accuracy is at most chance + PS_NEAR_CHANCE_PP percentage points. */
#define PS_NEAR_CHANCE_PP 5.0

/* One dip of the curve before cycling and where it went. after = -1: no new dip took its place. */
typedef struct {
    int64_t before, after;
    double acc_before, acc_after; /* accuracy at `before` in the clean curve, at `after` in the cycled one */
    int still_dips;               /* `before` is still a dip after cycling */
} ps_dip_move;

/* Comparison of the clean curve (before) and the cycled one (after) over one period P.
 * Dips: when a curve's gap (max - min) is at least 5 pp, the residues at or below the midpoint
 * (max + min) / 2. Each dip of `before` is paired with a new dip of `after` (a dip after that was not one
 * before), deepest with deepest; unpaired new dips are listed. The shift statistic (best-aligning shift
 * and its correlation) leaves out the residues near chance in both curves ("excluded"). */
typedef struct {
    int64_t P;
    double chance;
    int before_near_chance, after_near_chance; /* the curve's mean accuracy is near chance */
    int64_t n_moves;
    ps_dip_move *moves;   /* [n_moves] */
    int64_t n_new;
    int64_t *new_dips;    /* [n_new] new dips of `after` that no dip of `before` moved to */
    int64_t n_excluded;
    int64_t *excluded;    /* [n_excluded] residues near chance in both curves */
    int64_t best_shift, best_shift_signed;
    double best_shift_correlation;
} ps_cycle_analysis;

int ps_cycle_analyse(const double *before, const double *after, int64_t P, double chance, ps_cycle_analysis *out,
                     ps_error *err);
void ps_cycle_analysis_free(ps_cycle_analysis *a);

/* Per-head measure of a cycle (issue 17, item 4). A head's knockout profile is, per residue, the accuracy
 * its knockout costs (hurt = −Δ accuracy, pp). Given a head's profile before and after cycling by k and the
 * residues dead (near chance in the clean curve) both before and after, which are left out:
 * status PS_HEAD_NO_PROFILE when the head's largest hurt before is below min_hurt (it owns no residue),
 * PS_HEAD_LOST when its largest hurt after is below min_hurt (the cycled head stopped working, e.g. its
 * value offset wrapped past the window end), else PS_HEAD_MEASURED with
 *   shift_worst = (worst residue after − worst residue before) mod P, signed in (−P/2, P/2]
 *   shift_xcorr = the s maximising Σ_rho hurt_after(rho) · hurt_before((rho − s) mod P) over live pairs
 *                 (hurts clipped at 0; ties to the smallest |s|, then the positive), signed
 * and error_* = the shift − k, signed mod P into (−P/2, P/2] (0: the head moved exactly k residues). */
enum { PS_HEAD_MEASURED = 0, PS_HEAD_NO_PROFILE = 1, PS_HEAD_LOST = 2 };
typedef struct {
    int status;
    int64_t worst_before, worst_after;
    double hurt_before, hurt_after; /* at the worst residues, pp */
    int64_t shift_worst, shift_xcorr, error_worst, error_xcorr;
} ps_head_shift;

/* Default smallest hurt (pp) that makes a residue a head's own. */
#define PS_HEAD_MIN_HURT_PP 10.0

int64_t ps_signed_mod(int64_t d, int64_t P);
void ps_head_shift_measure(const double *hurt_before, const double *hurt_after, const unsigned char *dead, int64_t P, int64_t k,
                           double min_hurt, ps_head_shift *out);

/* The per-head measure of a cycle (gatecycle --measure knockout): each cycled KV head of the layer knocked
 * out (the family's "compressed" knockout target: a grid over the grid engine, grid.h) before and after
 * cycling by k, and where each head's residue moved (ps_head_shift_measure). The grids run as work units
 * of the gatecycle instrument (instruments/instr_gatecycle.c: the knockout grid before the cycle, then
 * the one after it, each beside its sweep); given the two grids' results (same heads, P residues), this is
 * the "per_head" object of gatecycle.json ({"measure", "target", "min_hurt_pp", "excluded_residues",
 * "heads": [{"head", "status", "hurt_before_pp", "hurt_after_pp", "worst_before", "worst_after",
 * "shift_worst", "error_worst", "shift_xcorr", "error_xcorr"}], "summary"}); residues near chance in both
 * grids' clean curves are left out. NULL with err set when memory runs out. */
json_t *ps_gatecycle_per_head_json(const ps_grid_result *before, const ps_grid_result *after, int64_t k, double chance,
                                   double min_hurt, ps_error *err);

#endif
