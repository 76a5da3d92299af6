/* stats.h — the statistics of a phase curve, all of them: the per-residue accumulators (evaluations,
 * correct, log-probs per residue) and a curve's summary JSON; Wilson score intervals, the chi-square test
 * of independence of accuracy and residue (with its p-value), the dominant period of a residue curve
 * from its discrete Fourier transform and by folding, the best-aligning shift, the verdict. */
#ifndef PS_STATS_H
#define PS_STATS_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "interventions/shifted.h"

/* Per-residue accumulators. */
typedef struct {
    int64_t P;
    int64_t *n, *k;  /* [P] evaluations, correct */
    double *lp;      /* [P] summed target log-probabilities */
} ps_residue_stats;

int ps_residue_stats_init(ps_residue_stats *r, int64_t P, ps_error *err);
void ps_residue_stats_free(ps_residue_stats *r);
/* Add the outcomes of one shifted set (correct / logprob per query, [N · max_q]). */
void ps_residue_stats_add(ps_residue_stats *r, const ps_shifted *s, const int *correct, const double *logprob);

/* The summary of a curve: per residue n, accuracy, Wilson 95% interval, mean log-prob; overall mean,
 * min, max, gap (pp), chi-square test, the verdict (phase_sensitive: p < 0.01 and gap >= 5 pp) and the
 * dominant period (null unless phase sensitive). NULL with err set when memory runs out. */
json_t *ps_residue_stats_json(const ps_residue_stats *r, ps_error *err);
double ps_residue_accuracy(const ps_residue_stats *r, int64_t rho);


/* 95% (z = 1.96) or any-z Wilson score interval for k successes in n trials. n = 0 gives [0, 1]. */
void ps_wilson(int64_t k, int64_t n, double z, double *lo, double *hi);

/* Regularised upper incomplete gamma Q(a, x) = Γ(a, x) / Γ(a). */
double ps_gamma_q(double a, double x);

/* Chi-square test on a 2 × R table (correct / wrong per residue). Residues with n = 0 are left out;
 * df = (non-empty residues − 1). With all or none correct the statistic is 0 and p = 1. */
void ps_chi_square(const int64_t *k, const int64_t *n, int64_t R, double *chi2, int64_t *df, double *p);

/* Dominant period of a curve y[0..P) read as one period of a periodic signal: from the DFT power of the
 * mean-centred curve over k in 1..P/2, the lowest k whose power is within 10% of the strongest gives
 * period P / k (so a single dip, whose power is spread evenly, repeats every P). Returns 0 (period
 * undefined) for a flat curve. *power_frac: that frequency's share of the total power. */
double ps_dominant_period(const double *y, int64_t P, int64_t *k_out, double *power_frac);

/* Share of a curve's variance that folding it at d explains: the curve y[0..P) replaced by its means over
 * the residues congruent mod d (d divides P), R²_d = 1 − SS(y − folded) / SS(y − mean). 1 for d = P;
 * 0 for a flat curve. */
double ps_fold_r2(const double *y, int64_t P, int64_t d);

/* Repeat period by folding: the smallest divisor d of P with R²_d >= PS_FOLD_R2_MIN — the shortest
 * length after which the curve repeats, to within what it explains. Unlike the DFT's pick it does not
 * take a harmonic for the period when a dip is sharp (one dead residue per stride has its power spread
 * over every multiple of the fundamental). Returns 0 for a flat curve; *r2 = R²_d of the answer. */
#define PS_FOLD_R2_MIN 0.75
int64_t ps_fold_period(const double *y, int64_t P, double *r2);

/* Best-aligning shift s in [0, P): maximises the correlation of the mean-centred curves after(rho) and
 * before((rho - s) mod P). Ties go to the smallest s. *corr: that correlation (0 if a curve is flat). */
int64_t ps_best_shift(const double *before, const double *after, int64_t P, double *corr);

/* Best-aligning shift over the residues with keep[r] != 0 only: for each s the correlation is taken over the
 * pairs (after(rho), before(rho - s)) with both residues kept (means over those pairs). keep = NULL keeps
 * every residue (then it equals ps_best_shift). */
int64_t ps_best_shift_masked(const double *before, const double *after, const int *keep, int64_t P, double *corr);

/* The verdict on a curve that the sweep command prints and every curve JSON carries: phase sensitive when
 * the chi-square p < 0.01 and the gap is at least 5 pp. Returns 1 for phase sensitive; *text (may be NULL)
 * gets the sentence ("phase sensitive", "no phase dependence detected", or "a statistically detectable
 * but small phase dependence (gap < 5 pp)"). */
#define PS_PHASE_P_MAX 0.01
#define PS_PHASE_GAP_MIN_PP 5.0
int ps_phase_verdict(double p_value, double gap_pp, const char **text);


#endif
