#include "interventions/stats.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ps_wilson(int64_t k, int64_t n, double z, double *lo, double *hi) {
    if (n <= 0) {
        *lo = 0;
        *hi = 1;
        return;
    }
    double p = (double)k / (double)n, nn = (double)n, z2 = z * z;
    double den = 1 + z2 / nn, centre = (p + z2 / (2 * nn)) / den;
    double half = z * sqrt(p * (1 - p) / nn + z2 / (4 * nn * nn)) / den;
    *lo = fmax(0.0, centre - half);
    *hi = fmin(1.0, centre + half);
}

/* series for P(a, x), continued fraction for Q(a, x) (Numerical Recipes 6.2, Lentz's method) */
double ps_gamma_q(double a, double x) {
    if (x <= 0) return 1.0;
    double gln = lgamma(a);
    if (x < a + 1) {
        double ap = a, sum = 1.0 / a, del = sum;
        for (int n = 0; n < 1000; n++) {
            ap += 1;
            del *= x / ap;
            sum += del;
            if (fabs(del) < fabs(sum) * 1e-15) break;
        }
        return fmax(0.0, 1.0 - sum * exp(-x + a * log(x) - gln));
    }
    double b = x + 1 - a, c = 1.0 / 1e-300, d = 1.0 / b, h = d;
    for (int i = 1; i < 1000; i++) {
        double an = -i * (i - a);
        b += 2;
        d = an * d + b;
        if (fabs(d) < 1e-300) d = 1e-300;
        c = b + an / c;
        if (fabs(c) < 1e-300) c = 1e-300;
        d = 1.0 / d;
        double del = d * c;
        h *= del;
        if (fabs(del - 1) < 1e-15) break;
    }
    return exp(-x + a * log(x) - gln) * h;
}

void ps_chi_square(const int64_t *k, const int64_t *n, int64_t R, double *chi2, int64_t *df, double *p) {
    int64_t K = 0, N = 0, used = 0;
    for (int64_t r = 0; r < R; r++) {
        K += k[r];
        N += n[r];
        used += n[r] > 0;
    }
    *chi2 = 0;
    *df = used > 1 ? used - 1 : 0;
    if (N == 0 || K == 0 || K == N || used < 2) {
        *p = 1.0;
        return;
    }
    double pk = (double)K / (double)N;
    for (int64_t r = 0; r < R; r++) {
        if (!n[r]) continue;
        double e1 = (double)n[r] * pk, e0 = (double)n[r] * (1 - pk);
        double o1 = (double)k[r], o0 = (double)(n[r] - k[r]);
        *chi2 += (o1 - e1) * (o1 - e1) / e1 + (o0 - e0) * (o0 - e0) / e0;
    }
    *p = ps_gamma_q((double)*df / 2.0, *chi2 / 2.0);
}

double ps_dominant_period(const double *y, int64_t P, int64_t *k_out, double *power_frac) {
    double mean = 0, total = 0, best = 0, pw[2049];
    int64_t K = P / 2 < 2048 ? P / 2 : 2048;
    for (int64_t i = 0; i < P; i++) mean += y[i] / (double)P;
    for (int64_t k = 1; k <= K; k++) {
        double re = 0, im = 0;
        for (int64_t i = 0; i < P; i++) {
            double ang = 2 * M_PI * (double)k * (double)i / (double)P;
            re += (y[i] - mean) * cos(ang);
            im -= (y[i] - mean) * sin(ang);
        }
        pw[k] = re * re + im * im;
        if (2 * k != P) pw[k] *= 2; /* the mirrored frequency P - k carries the same power */
        total += pw[k];
        if (pw[k] > best) best = pw[k];
    }
    *k_out = 0;
    *power_frac = 0;
    if (total <= 1e-24) return 0;
    /* the lowest frequency within 10% of the strongest: a lone dip (equal power everywhere) repeats every P,
     * a pattern that repeats every P/k has no power below k */
    for (int64_t k = 1; k <= K; k++)
        if (pw[k] >= 0.9 * best) {
            *k_out = k;
            *power_frac = pw[k] / total;
            return (double)P / (double)k;
        }
    return 0;
}

double ps_fold_r2(const double *y, int64_t P, int64_t d) {
    if (P < 1 || d < 1 || P % d) return 0;
    double mean = 0, tot = 0, res = 0;
    for (int64_t i = 0; i < P; i++) mean += y[i] / (double)P;
    for (int64_t i = 0; i < P; i++) tot += (y[i] - mean) * (y[i] - mean);
    if (tot <= 1e-24) return 0;
    int64_t m = P / d; /* members of each class */
    for (int64_t j = 0; j < d; j++) {
        double f = 0;
        for (int64_t i = j; i < P; i += d) f += y[i] / (double)m;
        for (int64_t i = j; i < P; i += d) res += (y[i] - f) * (y[i] - f);
    }
    return 1.0 - res / tot;
}

int64_t ps_fold_period(const double *y, int64_t P, double *r2) {
    *r2 = 0;
    for (int64_t d = 1; d <= P; d++) {
        if (P % d) continue;
        double q = ps_fold_r2(y, P, d);
        if (d == P && q == 0) return 0; /* flat */
        if (q >= PS_FOLD_R2_MIN) {
            *r2 = q;
            return d;
        }
    }
    return 0;
}

int64_t ps_best_shift(const double *before, const double *after, int64_t P, double *corr) {
    double mb = 0, ma = 0, sb = 0, sa = 0;
    for (int64_t i = 0; i < P; i++) {
        mb += before[i] / (double)P;
        ma += after[i] / (double)P;
    }
    for (int64_t i = 0; i < P; i++) {
        sb += (before[i] - mb) * (before[i] - mb);
        sa += (after[i] - ma) * (after[i] - ma);
    }
    int64_t best = 0;
    double bc = -INFINITY;
    for (int64_t s = 0; s < P; s++) {
        double c = 0;
        for (int64_t r = 0; r < P; r++) c += (after[r] - ma) * (before[((r - s) % P + P) % P] - mb);
        c = sa > 0 && sb > 0 ? c / sqrt(sa * sb) : 0;
        if (c > bc + 1e-12) {
            bc = c;
            best = s;
        }
    }
    *corr = bc;
    return best;
}

int64_t ps_best_shift_masked(const double *before, const double *after, const int *keep, int64_t P, double *corr) {
    if (!keep) return ps_best_shift(before, after, P, corr);
    int64_t best = 0;
    double bc = -INFINITY;
    for (int64_t s = 0; s < P; s++) {
        double ma = 0, mb = 0, n = 0;
        for (int64_t r = 0; r < P; r++) {
            int64_t q = ((r - s) % P + P) % P;
            if (!keep[r] || !keep[q]) continue;
            ma += after[r];
            mb += before[q];
            n++;
        }
        double c = 0;
        if (n > 1) {
            ma /= n;
            mb /= n;
            double sab = 0, saa = 0, sbb = 0;
            for (int64_t r = 0; r < P; r++) {
                int64_t q = ((r - s) % P + P) % P;
                if (!keep[r] || !keep[q]) continue;
                sab += (after[r] - ma) * (before[q] - mb);
                saa += (after[r] - ma) * (after[r] - ma);
                sbb += (before[q] - mb) * (before[q] - mb);
            }
            c = saa > 0 && sbb > 0 ? sab / sqrt(saa * sbb) : 0;
        }
        if (c > bc + 1e-12) {
            bc = c;
            best = s;
        }
    }
    *corr = bc;
    return best;
}

int ps_phase_verdict(double p_value, double gap_pp, const char **text) {
    int sens = p_value < PS_PHASE_P_MAX && gap_pp >= PS_PHASE_GAP_MIN_PP;
    if (text)
        *text = p_value >= PS_PHASE_P_MAX ? "no phase dependence detected"
                : sens                    ? "phase sensitive"
                                          : "a statistically detectable but small phase dependence (gap < 5 pp)";
    return sens;
}

/* ---- per-residue accumulators ---- */

int ps_residue_stats_init(ps_residue_stats *r, int64_t P, ps_error *err) {
    r->P = P;
    r->n = calloc((size_t)P, sizeof(int64_t));
    r->k = calloc((size_t)P, sizeof(int64_t));
    r->lp = calloc((size_t)P, sizeof(double));
    if (!r->n || !r->k || !r->lp) {
        ps_residue_stats_free(r);
        return ps_fail(err, "out of memory for the statistics of %lld residues", (long long)P);
    }
    return 0;
}

void ps_residue_stats_free(ps_residue_stats *r) {
    free(r->n);
    free(r->k);
    free(r->lp);
    memset(r, 0, sizeof *r);
}

void ps_residue_stats_add(ps_residue_stats *r, const ps_shifted *s, const int *correct, const double *logprob) {
    for (int64_t i = 0; i < s->b.B; i++)
        for (int64_t q = 0; q < s->b.n_q[i]; q++) {
            int64_t rho = s->residue[i * s->b.max_q + q];
            if (rho < 0 || rho >= r->P) continue; /* a prompt set's alt queries are labelled past P */
            r->n[rho]++;
            r->k[rho] += correct[i * s->b.max_q + q];
            r->lp[rho] += logprob[i * s->b.max_q + q];
        }
}

double ps_residue_accuracy(const ps_residue_stats *r, int64_t rho) {
    return r->n[rho] ? (double)r->k[rho] / (double)r->n[rho] : 0.0;
}

/* every jansson call can fail on memory: `bad` collects the failures */
#define SET(o, key, v) (bad |= json_object_set_new((o), (key), (v)) != 0)

json_t *ps_residue_stats_json(const ps_residue_stats *r, ps_error *err) {
    int64_t P = r->P, N = 0, K = 0;
    int bad = 0;
    double mn = INFINITY, mx = -INFINITY, *acc = calloc((size_t)(P > 0 ? P : 1), sizeof(double));
    json_t *o = json_object(), *res = json_array();
    if (!acc || !o || !res) {
        free(acc);
        json_decref(o);
        json_decref(res);
        ps_fail(err, "out of memory for the curve summary (%lld residues)", (long long)P);
        return NULL;
    }
    for (int64_t rho = 0; rho < P; rho++) {
        double lo, hi, a = ps_residue_accuracy(r, rho);
        acc[rho] = a;
        ps_wilson(r->k[rho], r->n[rho], 1.96, &lo, &hi);
        json_t *e = json_object();
        SET(e, "rho", json_integer(rho));
        SET(e, "n", json_integer(r->n[rho]));
        SET(e, "correct", json_integer(r->k[rho]));
        SET(e, "accuracy", json_real(a));
        SET(e, "wilson_lo", json_real(lo));
        SET(e, "wilson_hi", json_real(hi));
        SET(e, "mean_logprob", json_real(r->n[rho] ? r->lp[rho] / (double)r->n[rho] : 0.0));
        bad |= json_array_append_new(res, e) != 0;
        N += r->n[rho];
        K += r->k[rho];
        if (r->n[rho]) {
            mn = fmin(mn, a);
            mx = fmax(mx, a);
        }
    }
    double chi2, p, frac;
    int64_t df, k;
    ps_chi_square(r->k, r->n, P, &chi2, &df, &p);
    double period = ps_dominant_period(acc, P, &k, &frac);
    double gap = N ? 100.0 * (mx - mn) : 0.0;
    const char *verdict;
    int sens = ps_phase_verdict(p, gap, &verdict);
    SET(o, "period", json_integer(P));
    SET(o, "residues", res);
    SET(o, "n", json_integer(N));
    SET(o, "mean_accuracy", json_real(N ? (double)K / (double)N : 0.0));
    SET(o, "min_accuracy", json_real(N ? mn : 0.0));
    SET(o, "max_accuracy", json_real(N ? mx : 0.0));
    SET(o, "gap_pp", json_real(gap));
    json_t *cs = json_object();
    SET(cs, "statistic", json_real(chi2));
    SET(cs, "df", json_integer(df));
    SET(cs, "p_value", json_real(p));
    SET(o, "chi_square", cs);
    SET(o, "phase_sensitive", json_boolean(sens));
    SET(o, "verdict", json_string(verdict));
    /* a period is reported only for a curve the verdict calls phase sensitive; the DFT's pick is kept as
     * candidate_period either way */
    json_t *dp = json_object();
    SET(dp, "period", sens && period > 0 ? json_real(period) : json_null());
    SET(dp, "candidate_period", period > 0 ? json_real(period) : json_null());
    SET(dp, "frequency", json_integer(k));
    SET(dp, "power_fraction", json_real(frac));
    SET(o, "dominant_period", dp);
    /* the repeat period by folding: reported like the DFT's, only for a phase-sensitive curve */
    double r2;
    int64_t fp = ps_fold_period(acc, P, &r2);
    json_t *rp = json_object(), *by = json_object();
    SET(rp, "period", sens && fp > 0 ? json_integer(fp) : json_null());
    SET(rp, "r2", json_real(r2));
    SET(rp, "threshold", json_real(PS_FOLD_R2_MIN));
    for (int64_t d = 1; d <= P; d++)
        if (P % d == 0) {
            char name[32];
            snprintf(name, sizeof name, "%lld", (long long)d);
            SET(by, name, json_real(ps_fold_r2(acc, P, d)));
        }
    SET(rp, "r2_by_divisor", by);
    SET(o, "repeat_period", rp);
    free(acc);
    if (bad) {
        json_decref(o);
        ps_fail(err, "out of memory while building the curve summary");
        return NULL;
    }
    return o;
}

