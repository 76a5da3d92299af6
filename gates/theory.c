/* theory.c — the idealised bigram-induction model (theory.h, docs/theory.md): exact loss and gradient.
 *
 * Gradient of one query (position p, phase r = p mod S, chunk c, successor at y = p + 1; flat context
 * index k = j·S + i for offset i of chunk j, which is also the token's position):
 *   z_k = mu·o_k, o_k = sum_h pi_hj beta_hi;  the N − C·S tokens outside the context have z = 0.
 *   L = −z_y + log(sum_k exp z_k + N − C·S);  dL/dz_k = q_k − [k = y], q = the softmax.
 *   dL/dmu = sum_k (dL/dz_k) o_k                       -> dL/dlog_mu = mu · dL/dmu
 *   dL/dbeta_hi = mu · sum_j pi_hj dL/dz_{jS+i}
 *   dL/dpi_hj = G_hj = mu · sum_i beta_hi dL/dz_{jS+i}
 *   dL/ds_hc = pi_hc (G_hc − sum_j pi_hj G_hj)         (s_hj = lambda·alpha_hr·[j = c], the only score that moves)
 *   dL/dalpha_hr = lambda · dL/ds_hc;  dL/dlambda = sum_h alpha_hr dL/ds_hc -> dL/dlog_lam = lambda · dL/dlambda
 *   through the gate softmaxes: dL/da_hi = alpha_hi (dL/dalpha_hi − sum_k alpha_hk dL/dalpha_hk), the same for b. */
#include "gates/theory.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"

static void softmax(const double *z, double *p, int64_t n) {
    double mx = z[0], s = 0;
    for (int64_t i = 1; i < n; i++) mx = fmax(mx, z[i]);
    for (int64_t i = 0; i < n; i++) s += (p[i] = exp(z[i] - mx));
    for (int64_t i = 0; i < n; i++) p[i] /= s;
}

int ps_theory_init(ps_theory *t, int64_t H, int64_t S, int64_t C, int64_t N, double temperature, double init_std, uint64_t seed,
                   ps_error *err) {
    memset(t, 0, sizeof *t);
    if (H < 1 || H > PS_THEORY_MAX_HEADS || S < PS_THEORY_MIN_WINDOW || S > PS_THEORY_MAX_WINDOW || C < 1 ||
        C > PS_THEORY_MAX_CHUNKS || N < C * S || N > PS_THEORY_MAX_VOCAB)
        return ps_fail(err, "theory: dimensions out of range (H %lld, S %lld, C %lld, N %lld)", (long long)H, (long long)S,
                       (long long)C, (long long)N);
    if (!(temperature > 0) || !isfinite(temperature)) return ps_fail(err, "theory: temperature must be positive");
    t->H = H;
    t->S = S;
    t->C = C;
    t->N = N;
    size_t hs = (size_t)(H * S);
    t->a = malloc(hs * sizeof(double));
    t->b = malloc(hs * sizeof(double));
    t->alpha = malloc(hs * sizeof(double));
    t->beta = malloc(hs * sizeof(double));
    t->work = malloc((size_t)(H * C + 2 * C * S + 2 * C + 8) * sizeof(double));
    if (!t->a || !t->b || !t->alpha || !t->beta || !t->work) {
        ps_theory_free(t);
        return ps_fail(err, "theory: out of memory");
    }
    ps_rng r;
    ps_rng_seed(&r, seed);
    for (size_t i = 0; i < hs; i++) {
        t->a[i] = init_std * ps_rng_normal(&r);
        t->b[i] = init_std * ps_rng_normal(&r);
    }
    t->log_lam = t->log_mu = log(temperature);
    ps_theory_gates(t);
    return 0;
}

void ps_theory_free(ps_theory *t) {
    free(t->a);
    free(t->b);
    free(t->alpha);
    free(t->beta);
    free(t->work);
    memset(t, 0, sizeof *t);
}

int ps_theory_grad_init(ps_theory_grad *g, const ps_theory *t, ps_error *err) {
    g->a = calloc((size_t)(t->H * t->S), sizeof(double));
    g->b = calloc((size_t)(t->H * t->S), sizeof(double));
    g->log_lam = g->log_mu = 0;
    if (!g->a || !g->b) {
        ps_theory_grad_free(g);
        return ps_fail(err, "theory: out of memory");
    }
    return 0;
}

void ps_theory_grad_free(ps_theory_grad *g) {
    free(g->a);
    free(g->b);
    g->a = g->b = NULL;
}

void ps_theory_grad_zero(ps_theory_grad *g, const ps_theory *t) {
    memset(g->a, 0, (size_t)(t->H * t->S) * sizeof(double));
    memset(g->b, 0, (size_t)(t->H * t->S) * sizeof(double));
    g->log_lam = g->log_mu = 0;
}

void ps_theory_gates(ps_theory *t) {
    for (int64_t h = 0; h < t->H; h++) {
        softmax(t->a + h * t->S, t->alpha + h * t->S, t->S);
        softmax(t->b + h * t->S, t->beta + h * t->S, t->S);
    }
}

double ps_theory_query(ps_theory *t, int64_t p, double weight, ps_theory_grad *g, int *correct) {
    int64_t H = t->H, S = t->S, C = t->C, K = C * S, c = p / S, r = p % S, y = p + 1;
    double lam = exp(t->log_lam), mu = exp(t->log_mu), outside = (double)(t->N - K);
    double *pi = t->work, *o = pi + H * C, *q = o + K, *G = q + K, *s = G + C;
    memset(o, 0, (size_t)K * sizeof(double));
    for (int64_t h = 0; h < H; h++) {
        double *ph = pi + h * C;
        for (int64_t j = 0; j < C; j++) s[j] = j == c ? lam * t->alpha[h * S + r] : 0.0;
        softmax(s, ph, C);
        const double *bh = t->beta + h * S;
        for (int64_t j = 0; j < C; j++)
            for (int64_t i = 0; i < S; i++) o[j * S + i] += ph[j] * bh[i];
    }
    double mx = outside > 0 ? 0.0 : mu * o[0], Z = 0;
    for (int64_t k = 0; k < K; k++) mx = fmax(mx, mu * o[k]);
    for (int64_t k = 0; k < K; k++) Z += (q[k] = exp(mu * o[k] - mx));
    Z += outside * exp(-mx);
    double loss = log(Z) - (mu * o[y] - mx);
    int ok = outside == 0 || o[y] > 0;
    for (int64_t k = 0; k < K && ok; k++)
        if (k != y && !(o[y] > o[k])) ok = 0;
    *correct = ok;
    if (!g) return loss;
    double dmu = 0;
    for (int64_t k = 0; k < K; k++) {
        q[k] = q[k] / Z - (k == y); /* dL/dz_k */
        dmu += q[k] * o[k];
    }
    g->log_mu += weight * mu * dmu;
    for (int64_t h = 0; h < H; h++) {
        const double *ph = pi + h * C, *bh = t->beta + h * S, *ah = t->alpha + h * S;
        double dbe[PS_THEORY_MAX_WINDOW] = {0}, dot = 0;
        for (int64_t j = 0; j < C; j++) {
            double Gj = 0;
            for (int64_t i = 0; i < S; i++) {
                double gz = mu * q[j * S + i];
                Gj += bh[i] * gz;
                dbe[i] += ph[j] * gz;
            }
            G[j] = Gj;
            dot += ph[j] * Gj;
        }
        double ds = ph[c] * (G[c] - dot), dal = lam * ds; /* dL/ds_hc, dL/dalpha_hr */
        g->log_lam += weight * lam * ah[r] * ds;
        double sb = 0;
        for (int64_t i = 0; i < S; i++) sb += bh[i] * dbe[i];
        for (int64_t i = 0; i < S; i++) {
            g->a[h * S + i] += weight * ah[i] * ((i == r) - ah[r]) * dal;
            g->b[h * S + i] += weight * bh[i] * (dbe[i] - sb);
        }
    }
    return loss;
}

double ps_theory_population(ps_theory *t, ps_theory_grad *g, double *accuracy) {
    int64_t S = t->S, C = t->C;
    double n = (double)ps_theory_positions(t), loss = 0, acc = 0;
    for (int64_t r = 0; r < (t->within_chunk ? S - 1 : S); r++) {
        /* positions with phase r among 0 .. C·S − 2: C of them, C − 1 for r = S − 1; chunk 0 stands for all */
        double w = (double)(r < S - 1 ? C : C - 1) / n;
        if (w == 0) continue;
        int ok;
        loss += w * ps_theory_query(t, r, w, g, &ok);
        acc += w * ok;
    }
    if (accuracy) *accuracy = acc;
    return loss;
}
