/* units.c — the instruments' work units (see units.h). */
#include "interventions/units.h"
#include "tasks/tasks.h"

#include <stdlib.h>
#include <string.h>

int64_t ps_sweep_n_batches(int64_t N, int64_t batch) {
    int64_t B = batch < N ? batch : N;
    return B < 1 ? 0 : (N + B - 1) / B;
}

void ps_sweep_unit_weights(int64_t N, int64_t batch, int64_t P, int64_t T, ps_sweep_mode mode, int64_t *w) {
    int64_t nb = ps_sweep_n_batches(N, batch), B = batch < N ? batch : N;
    for (int64_t p = 0; p < P; p++)
        for (int64_t j = 0; j < nb; j++) {
            int64_t n = N - j * B < B ? N - j * B : B;
            w[p * nb + j] = n * (T + (mode == PS_SWEEP_PAD ? p : P - 1));
        }
}

int ps_sweep_units(const ps_runtime *rt, const ps_batch *base, const ps_task *task, const ps_filler_family *fam,
                   ps_sweep_mode mode, int64_t P, uint64_t seed, int64_t batch, int64_t u0, int64_t u1, int32_t *ok,
                   double *lp, int32_t *rho, ps_progress_fn progress, void *user, ps_error *err) {
    int64_t N = base->B, maxq = base->max_q, nb = ps_sweep_n_batches(N, batch), B = batch < N ? batch : N;
    if (u0 >= u1) return 0;
    int *okb = malloc((size_t)(B * maxq) * sizeof(int));
    double *lpb = malloc((size_t)(B * maxq) * sizeof(double));
    int rc = okb && lpb ? 0 : ps_fail(err, "out of memory for the outcomes of %lld prompts x %lld queries", (long long)B, (long long)maxq);
    ps_shifted s;
    int64_t have_p = -1;
    for (int64_t u = u0; u < u1 && !rc; u++) {
        int64_t p = u / nb, i0 = u % nb * B, n = N - i0 < B ? N - i0 : B;
        if (p != have_p) {
            if (have_p >= 0) ps_shifted_free(&s);
            have_p = -1;
            if ((rc = ps_make_shifted(base, task, fam, mode, P, p, seed, rt->max_pos, &s, err))) break;
            have_p = p;
        }
        /* the batch one process runs: prompts [i0, i0 + n) of shift p, as one forward of n sequences */
        ps_shifted v = s;
        v.b = ps_batch_view(&s.b, i0, n);
        v.residue = s.residue + i0 * maxq;
        if ((rc = rt->ops->eval(rt, &v.b, NULL, okb, lpb, err))) break;
        int64_t at = (p * N + i0) * maxq;
        for (int64_t i = 0; i < n; i++)
            for (int64_t q = 0; q < maxq; q++) {
                int64_t k = i * maxq + q;
                int scored = q < v.b.n_q[i] && v.residue[k] >= 0;
                ok[at + k] = scored ? okb[k] : 0;
                lp[at + k] = scored ? lpb[k] : 0.0;
                rho[at + k] = scored ? (int32_t)v.residue[k] : -1;
            }
        if (progress) progress(u + 1 - u0, u1 - u0, user);
    }
    if (have_p >= 0) ps_shifted_free(&s);
    free(okb);
    free(lpb);
    return rc;
}

void ps_residue_stats_add_items(ps_residue_stats *r, const int32_t *ok, const double *lp, const int32_t *rho, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        if (rho[i] < 0 || rho[i] >= r->P) continue;
        r->n[rho[i]]++;
        r->k[rho[i]] += ok[i];
        r->lp[rho[i]] += lp[i];
    }
}

/* ---- gates ---- */

void ps_gates_unit_size(const ps_config *c, int64_t n, int64_t T, int64_t *n_events, int64_t *n_floats) {
    int64_t nW = ps_config_n_windows(c, T);
    *n_events = c->n_layers * 2;
    *n_floats = c->n_layers * 2 * n * nW * c->n_kv_heads * c->window;
}

typedef struct {
    int32_t *events;
    float *alpha;
    int64_t n_ev, n_fl, max_ev, max_fl; /* recorded so far / room in this unit */
    int64_t nkv, W;
    int overflow;
} recorder;

static int record_gate(const ps_hook_event *ev, void *user, ps_error *err) {
    (void)err;
    recorder *r = user;
    int64_t windows = ev->shape[0] * ev->shape[1], nf = windows * r->nkv * r->W;
    if (r->n_ev >= r->max_ev || r->n_fl + nf > r->max_fl) {
        r->overflow = 1;
        return 0;
    }
    int32_t *e = r->events + r->n_ev * PS_GATES_EVENT_INTS;
    e[0] = ev->layer;
    e[1] = ev->point == PS_HOOK_GATE_K ? PS_BRANCH_KEY : PS_BRANCH_VALUE;
    e[2] = (int32_t)windows;
    memcpy(r->alpha + r->n_fl, ev->data, (size_t)nf * sizeof(float));
    r->n_ev++;
    r->n_fl += nf;
    return 0;
}

int ps_gates_units(const ps_model *m, const ps_shifted *s, int64_t batch, int64_t u0, int64_t u1, const int64_t *ev_off,
                   const int64_t *al_off, int32_t *events, float *alpha, ps_error *err) {
    const ps_config *c = &m->cfg;
    int64_t N = s->b.B, maxq = s->b.max_q, B = batch < N ? batch : N;
    if (u0 >= u1) return 0;
    recorder rec = {.nkv = c->n_kv_heads, .W = c->window};
    ps_hooks h;
    ps_hooks_init(&h);
    int rc = 0;
    for (int l = 0; l < c->n_layers && !rc; l++)
        for (int b = 0; b < 2 && !rc; b++) {
            char name[96];
            ps_hook_name(name, sizeof name, l, b ? PS_HOOK_GATE_V : PS_HOOK_GATE_K);
            rc = ps_hooks_add(&h, c, name, record_gate, &rec, err);
        }
    int *okb = malloc((size_t)(B * maxq) * sizeof(int));
    double *lpb = malloc((size_t)(B * maxq) * sizeof(double));
    if (!rc && (!okb || !lpb)) rc = ps_fail(err, "out of memory for the outcomes of %lld prompts", (long long)B);
    for (int64_t u = u0; u < u1 && !rc; u++) {
        int64_t i0 = u * B, n = N - i0 < B ? N - i0 : B;
        rec.events = events + ev_off[u] * PS_GATES_EVENT_INTS;
        rec.alpha = alpha + al_off[u];
        rec.n_ev = rec.n_fl = 0;
        rec.max_ev = ev_off[u + 1] - ev_off[u];
        rec.max_fl = al_off[u + 1] - al_off[u];
        ps_shifted v = *s;
        v.b = ps_batch_view(&s->b, i0, n);
        v.residue = s->residue + i0 * maxq;
        rc = ps_eval_shifted(m, &v, n, &h, okb, lpb, err);
        if (!rc && (rec.overflow || rec.n_ev != rec.max_ev || rec.n_fl != rec.max_fl))
            rc = ps_fail(err, "internal error: batch %lld fired %lld gate events of %lld floats, expected %lld of %lld",
                         (long long)u, (long long)rec.n_ev, (long long)rec.n_fl, (long long)rec.max_ev, (long long)rec.max_fl);
    }
    free(okb);
    free(lpb);
    ps_hooks_free(&h);
    return rc;
}

int ps_gate_acc_replay(ps_gate_acc *acc, const int32_t *events, int64_t n_events, const float *alpha, int64_t n_floats,
                       ps_error *err) {
    int64_t at = 0;
    for (int64_t i = 0; i < n_events; i++) {
        const int32_t *e = events + i * PS_GATES_EVENT_INTS;
        int64_t nf = (int64_t)e[2] * acc->nkv * acc->W;
        if (e[0] < 0 || e[0] >= acc->n_layers || e[1] < 0 || e[1] > 1 || e[2] < 0 || at + nf > n_floats)
            return ps_fail(err, "gate record %lld (layer %d, branch %d, %d windows) does not fit the model or the data",
                           (long long)i, e[0], e[1], e[2]);
        ps_gate_acc_add(acc, e[0], (ps_branch)e[1], alpha + at, e[2]);
        at += nf;
    }
    if (at != n_floats) return ps_fail(err, "gate records: %lld floats left over", (long long)(n_floats - at));
    return 0;
}
