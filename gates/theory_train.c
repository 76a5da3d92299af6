/* theory_train.c — gradient descent on the idealised bigram-induction model, the summary of its gates
 * and the check of its exact gradient (theory_train.h). */
#include "gates/theory_train.h"

#include <math.h>
#include <stdlib.h>

#include "gates/gates.h"
#include "core/rng.h"

void ps_theory_opts_default(ps_theory_opts *o) {
    *o = (ps_theory_opts){.H = 7,
                          .S = 8,
                          .C = 8,
                          .N = 128,
                          .steps = 100000,
                          .lr = 1.0,
                          .temperature = 8.0,
                          .learn_temperature = 0,
                          .within_chunk = 1,
                          .batch = 0,
                          .records = 80,
                          .seed = 0,
                          .init_std = PS_THEORY_INIT_STD};
}

int64_t ps_theory_record_steps(int64_t K, int64_t R, int64_t *out) {
    int64_t n = 0;
    out[n++] = 0;
    for (int64_t k = 0; k <= R; k++) {
        int64_t s = (int64_t)llround(exp((double)k / (double)R * log((double)K)));
        if (s > K) s = K;
        if (s > out[n - 1]) out[n++] = s;
    }
    if (out[n - 1] != K) out[n++] = K;
    return n;
}

int ps_theory_train(ps_theory *t, const ps_theory_opts *o, ps_theory_record_fn rec, void *user, double *loss_out,
                    double *accuracy_out, ps_error *err) {
    ps_theory_grad g = {0};
    int64_t *steps = NULL;
    int rc = -1;
    if (ps_theory_init(t, o->H, o->S, o->C, o->N, o->temperature, o->init_std, o->seed, err) || ps_theory_grad_init(&g, t, err))
        goto out;
    t->within_chunk = o->within_chunk;
    steps = malloc((size_t)(o->records + 3) * sizeof(int64_t));
    if (!steps) {
        ps_fail(err, "out of memory");
        goto out;
    }
    int64_t H = t->H, S = t->S, C = t->C, K = o->steps, B = o->batch;
    int64_t nrec = ps_theory_record_steps(K, o->records, steps), next = 0;
    ps_rng r;
    ps_rng_seed(&r, o->seed ^ 0x9e3779b97f4a7c15ull); /* sampled positions (batch B > 0) */
    double loss = 0, acc = 0, lr = o->lr;
    for (int64_t step = 0; step <= K; step++) {
        ps_theory_grad_zero(&g, t);
        if (B == 0) loss = ps_theory_population(t, &g, &acc);
        else {
            loss = acc = 0;
            for (int64_t q = 0; q < B; q++) {
                int ok;
                int64_t p;
                do p = ps_rng_below(&r, C * S - 1);
                while (!ps_theory_asked(t, p));
                loss += ps_theory_query(t, p, 1.0 / (double)B, &g, &ok) / (double)B;
                acc += ok / (double)B;
            }
        }
        if (!isfinite(loss)) {
            ps_fail(err, "the loss is not finite at step %lld (learning rate %g too large?)", (long long)step, lr);
            goto out;
        }
        if (next < nrec && step == steps[next]) {
            next++;
            if (rec) rec(t, step, K, loss, acc, user);
        }
        if (step == K) break;
        for (int64_t i = 0; i < H * S; i++) {
            t->a[i] -= lr * g.a[i];
            t->b[i] -= lr * g.b[i];
        }
        if (o->learn_temperature) {
            t->log_lam -= lr * g.log_lam;
            t->log_mu -= lr * g.log_mu;
        }
        ps_theory_gates(t);
    }
    if (loss_out) *loss_out = loss;
    if (accuracy_out) *accuracy_out = acc;
    rc = 0;
out:
    free(steps);
    ps_theory_grad_free(&g);
    return rc;
}

void ps_theory_summarise(const ps_theory *t, ps_theory_summary *s) {
    int64_t S = t->S;
    *s = (ps_theory_summary){0};
    for (int64_t h = 0; h < t->H; h++) {
        ps_theory_head *e = &s->head[h];
        e->key_peak = ps_gate_peak(t->alpha + h * S, S);
        e->value_peak = ps_gate_peak(t->beta + h * S, S);
        e->N_key = ps_effective_offsets(t->alpha + h * S, S);
        e->N_value = ps_effective_offsets(t->beta + h * S, S);
        e->aligned = e->value_peak == e->key_peak + 1;
        s->aligned += e->aligned;
        if (e->aligned) s->cover[e->key_peak]++;
        s->one_hot += e->N_key <= PS_THEORY_ONE_HOT_N && e->N_value <= PS_THEORY_ONE_HOT_N;
        s->max_N = fmax(s->max_N, fmax(e->N_key, e->N_value));
    }
    for (int64_t r = 0; r < ps_theory_coverable(S); r++) s->n_covered += s->cover[r] > 0;
}

int ps_theory_check_grad(const ps_theory_opts *o, ps_theory_gradcheck *res, ps_error *err) {
    int64_t H = o->H, S = o->S, C = o->C;
    ps_theory t;
    ps_theory_grad g = {0}, g2 = {0};
    *res = (ps_theory_gradcheck){0};
    if (ps_theory_init(&t, H, S, C, o->N, o->temperature, 1.0, o->seed, err)) return -1; /* random, not small, gate logits */
    t.within_chunk = o->within_chunk;
    int rc = -1;
    if (ps_theory_grad_init(&g, &t, err) || ps_theory_grad_init(&g2, &t, err)) goto out;
    ps_rng r;
    ps_rng_seed(&r, o->seed + 1);
    t.log_lam += 0.5 * ps_rng_normal(&r); /* lambda != mu, so a swapped gradient shows */
    t.log_mu += 0.5 * ps_rng_normal(&r);
    ps_theory_gates(&t);
    double acc, L0 = ps_theory_population(&t, &g, &acc);
    /* the phase sum against every position */
    double Lall = 0, n = (double)ps_theory_positions(&t);
    int ok;
    for (int64_t p = 0; p < C * S - 1; p++)
        if (ps_theory_asked(&t, p)) Lall += ps_theory_query(&t, p, 1.0 / n, &g2, &ok) / n;
    double dsum = fabs(Lall - L0) / fmax(fabs(L0), 1e-300), gsum = 0, gscale = 0;
    for (int64_t i = 0; i < H * S; i++) {
        gsum = fmax(gsum, fmax(fabs(g.a[i] - g2.a[i]), fabs(g.b[i] - g2.b[i])));
        gscale = fmax(gscale, fmax(fabs(g.a[i]), fabs(g.b[i])));
    }
    gsum = fmax(gsum, fmax(fabs(g.log_lam - g2.log_lam), fabs(g.log_mu - g2.log_mu))) / fmax(gscale, 1e-300);
    /* central differences on every parameter */
    int64_t np = 2 * H * S + 2;
    double worst = 0, scale = 0, wt = 0, st = 0, eps = 1e-5;
    for (int64_t k = 0; k < np; k++) {
        double *v = k < H * S ? t.a + k : k < 2 * H * S ? t.b + (k - H * S) : k == 2 * H * S ? &t.log_lam : &t.log_mu;
        double an = k < H * S ? g.a[k] : k < 2 * H * S ? g.b[k - H * S] : k == 2 * H * S ? g.log_lam : g.log_mu, x = *v, Lp, Lm;
        *v = x + eps;
        ps_theory_gates(&t);
        Lp = ps_theory_population(&t, NULL, &acc);
        *v = x - eps;
        ps_theory_gates(&t);
        Lm = ps_theory_population(&t, NULL, &acc);
        *v = x;
        double fd = (Lp - Lm) / (2 * eps);
        if (k < 2 * H * S) {
            worst = fmax(worst, fabs(fd - an));
            scale = fmax(scale, fabs(an));
        } else {
            wt = fmax(wt, fabs(fd - an));
            st = fmax(st, fabs(an));
        }
    }
    ps_theory_gates(&t);
    res->n_params = np;
    res->gates = worst / fmax(scale, 1e-12);
    res->temperatures = wt / fmax(st, 1e-12);
    res->phase_loss = dsum;
    res->phase_grad = gsum;
    if (res->gates > PS_THEORY_GRADCHECK_FD_TOL || res->temperatures > PS_THEORY_GRADCHECK_FD_TOL ||
        res->phase_loss > PS_THEORY_GRADCHECK_SUM_TOL || res->phase_grad > PS_THEORY_GRADCHECK_SUM_TOL) {
        ps_fail(err, "gradient check failed (%.2e, %.2e, %.2e, %.2e)", res->gates, res->temperatures, res->phase_loss,
                res->phase_grad);
        goto out;
    }
    rc = 0;
out:
    ps_theory_grad_free(&g);
    ps_theory_grad_free(&g2);
    ps_theory_free(&t);
    return rc;
}
