/* units.c — the instruments' work units (see units.h). */
#include "interventions/units.h"
#include "gates/chgates.h"
#include "interventions/eval.h"
#include "tasks/tasks.h"

#include <stdio.h>
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

/* One evaluated batch's outcomes into the unit arrays (at the batch's first item): a query that is not
 * scored (past the prompt's queries, or no residue) records ok 0, log-prob 0, residue -1. */
static void record_outcomes(const ps_shifted *v, const int *okb, const double *lpb, int64_t maxq, int32_t *ok, double *lp,
                            int32_t *rho) {
    for (int64_t i = 0; i < v->b.B; i++)
        for (int64_t q = 0; q < maxq; q++) {
            int64_t k = i * maxq + q;
            int scored = q < v->b.n_q[i] && v->residue[k] >= 0;
            ok[k] = scored ? okb[k] : 0;
            lp[k] = scored ? lpb[k] : 0.0;
            rho[k] = scored ? (int32_t)v->residue[k] : -1;
        }
}

/* Batch [i0, i0 + n) of the prompts s (shift p, N prompts) as one forward (with bh's hooks, when given): outcomes at
 * (p · N + i0) · maxq. */
static int sweep_batch(const ps_runtime *rt, const ps_shifted *s, int64_t p, int64_t N, int64_t i0, int64_t n, const ps_batch_hooks *bh,
                       int *okb, double *lpb, int32_t *ok, double *lp, int32_t *rho, ps_error *err) {
    int64_t maxq = s->b.max_q;
    ps_shifted v = *s;
    v.b = ps_batch_view(&s->b, i0, n);
    v.residue = s->residue + i0 * maxq;
    int64_t at = (p * N + i0) * maxq;
    const ps_hooks *h = NULL;
    if (bh && bh->begin(bh->user, &v, at, &h, err)) return -1;
    if (ps_eval_mapped(rt, &v.b, v.b.B > 0 ? v.b.B : 1, h, okb, lpb, err)) return -1;
    if (bh && bh->end && bh->end(bh->user, err)) return -1;
    record_outcomes(&v, okb, lpb, maxq, ok + at, lp + at, rho + at);
    return 0;
}

/* Units [u0, u1) of `nb` batches per shift: shift u / nb from make (NULL: the one given set `given`). */
static int sweep_units(const ps_runtime *rt, const ps_batch *base, const ps_task *task, const ps_filler_family *fam, ps_sweep_mode mode,
                       int64_t P, uint64_t seed, const ps_shifted *given, int64_t batch, const ps_batch_hooks *bh, int64_t u0, int64_t u1,
                       int32_t *ok, double *lp, int32_t *rho, ps_progress_fn progress, void *user, ps_error *err) {
    const ps_batch *b0 = given ? &given->b : base;
    int64_t N = b0->B, maxq = b0->max_q, nb = ps_sweep_n_batches(N, batch), B = batch < N ? batch : N;
    if (u0 >= u1) return 0;
    int *okb = malloc((size_t)(B * maxq) * sizeof(int));
    double *lpb = malloc((size_t)(B * maxq) * sizeof(double));
    int rc = okb && lpb ? 0 : ps_fail(err, "out of memory for the outcomes of %lld prompts x %lld queries", (long long)B, (long long)maxq);
    ps_shifted s;
    int64_t have_p = -1;
    for (int64_t u = u0; u < u1 && !rc; u++) {
        int64_t p = u / nb, i0 = u % nb * B, n = N - i0 < B ? N - i0 : B;
        if (!given && p != have_p) {
            if (have_p >= 0) ps_shifted_free(&s);
            have_p = -1;
            if ((rc = ps_make_shifted(base, task, fam, mode, P, p, seed, rt->max_pos, &s, err))) break;
            have_p = p;
        }
        /* the batch one process runs: prompts [i0, i0 + n) of shift p, as one forward of n sequences */
        if ((rc = sweep_batch(rt, given ? given : &s, p, N, i0, n, bh, okb, lpb, ok, lp, rho, err))) break;
        if (progress && progress(u + 1 - u0, u1 - u0, user)) {
            rc = ps_fail(err, "cancelled after %lld of %lld batches", (long long)(u + 1 - u0), (long long)(u1 - u0));
            break;
        }
    }
    if (have_p >= 0) ps_shifted_free(&s);
    free(okb);
    free(lpb);
    return rc;
}

int ps_sweep_units(const ps_runtime *rt, const ps_batch *base, const ps_task *task, const ps_filler_family *fam,
                   ps_sweep_mode mode, int64_t P, uint64_t seed, int64_t batch, int64_t u0, int64_t u1, int32_t *ok,
                   double *lp, int32_t *rho, ps_progress_fn progress, void *user, ps_error *err) {
    return sweep_units(rt, base, task, fam, mode, P, seed, NULL, batch, NULL, u0, u1, ok, lp, rho, progress, user, err);
}

int ps_promptset_sweep_units(const ps_runtime *rt, const ps_shifted *set, int64_t batch, int64_t u0, int64_t u1, int32_t *ok,
                             double *lp, int32_t *rho, ps_progress_fn progress, void *user, ps_error *err) {
    return sweep_units(rt, NULL, NULL, NULL, PS_SWEEP_PAD, set->P, 0, set, batch, NULL, u0, u1, ok, lp, rho, progress, user, err);
}

int ps_sweep_units_hooked(const ps_runtime *rt, const ps_batch *base, const ps_task *task, const ps_filler_family *fam, ps_sweep_mode mode,
                          int64_t P, uint64_t seed, const ps_shifted *given, int64_t batch, const ps_batch_hooks *bh, int64_t u0, int64_t u1,
                          int32_t *ok, double *lp, int32_t *rho, ps_progress_fn progress, void *user, ps_error *err) {
    return sweep_units(rt, base, task, fam, mode, P, seed, given, batch, bh, u0, u1, ok, lp, rho, progress, user, err);
}

void ps_residue_stats_add_items(ps_residue_stats *r, const int32_t *ok, const double *lp, const int32_t *rho, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        if (rho[i] < 0 || rho[i] >= r->P) continue;
        r->n[rho[i]]++;
        r->k[rho[i]] += ok[i];
        r->lp[rho[i]] += lp[i];
    }
}

/* ---- gates (every family, from its gate data: core/runtime.h ps_gate_info, ps_gate_tap) ---- */

int ps_gate_info_of(const ps_runtime *rt, ps_gate_info *g, ps_error *err) {
    const ps_family *f = rt->family;
    char why[512];
    memset(g, 0, sizeof *g);
    if (!f->gates.info || !f->gates.taps)
        return ps_fail(err, "%s checkpoints have no gate statistics in phasescope (the family has no gates entries)", f->name);
    if (f->gates.info(rt, g, why, sizeof why)) return ps_fail(err, "%s", why);
    if (g->ints != PS_GATE_REC_WINDOWS && g->ints != PS_GATE_REC_SEQ_WINDOWS) {
        json_decref(g->layout);
        g->layout = NULL;
        return ps_fail(err, "%s: gate records of %d ints (expected %d or %d)", f->name, g->ints, PS_GATE_REC_WINDOWS,
                       PS_GATE_REC_SEQ_WINDOWS);
    }
    return 0;
}

/* the family's taps for n prompts of T tokens (taps: room for PS_GATE_MAX_TAPS_PER_LAYER per layer) */
static ps_gate_tap *taps_of(const ps_runtime *rt, int64_t n, int64_t T, int *n_taps, ps_error *err) {
    ps_gate_tap *t = calloc((size_t)(PS_GATE_MAX_TAPS_PER_LAYER * rt->n_layers + 1), sizeof *t);
    if (!t) {
        ps_fail(err, "out of memory for the gate taps of %lld layers", (long long)rt->n_layers);
        return NULL;
    }
    *n_taps = rt->family->gates.taps(rt, n, T, t);
    return t;
}

int ps_gate_unit_size(const ps_runtime *rt, int64_t n, int64_t T, int64_t *n_records, int64_t *n_floats, ps_error *err) {
    int nt = 0;
    ps_gate_tap *t = taps_of(rt, n, T, &nt, err);
    if (!t) return -1;
    *n_records = nt, *n_floats = 0;
    for (int i = 0; i < nt; i++) *n_floats += t[i].floats;
    free(t);
    return 0;
}

typedef struct {
    int32_t *rec;
    float *alpha;
    int ints;
    int64_t ev, at, ev_end, at_end; /* recorded so far / the unit's end */
} gate_recorder;

typedef struct {
    gate_recorder *r;
    int layer, branch;
} gate_tap_ctx;

static int record_gate(const ps_hook_event *ev, void *user, ps_error *err) {
    const gate_tap_ctx *t = user;
    gate_recorder *r = t->r;
    int64_t n = 1;
    for (int i = 0; i < ev->ndim; i++) n *= ev->shape[i];
    if (r->ev >= r->ev_end || r->at + n > r->at_end)
        return ps_fail(err, "hook \"%s\": more gate records than the unit holds", ev->name);
    int32_t *e = r->rec + r->ev * r->ints;
    e[0] = t->layer, e[1] = t->branch;
    if (r->ints == PS_GATE_REC_WINDOWS) e[2] = (int32_t)(ev->shape[0] * ev->shape[1]);
    else e[2] = (int32_t)ev->shape[0], e[3] = (int32_t)ev->shape[1];
    memcpy(r->alpha + r->at, ev->data, (size_t)n * sizeof(float));
    r->ev++;
    r->at += n;
    return 0;
}

int ps_gate_units(const ps_runtime *rt, const ps_shifted *s, int64_t batch, int64_t u0, int64_t u1, const int64_t *rec_off,
                  const int64_t *al_off, int32_t *records, float *alpha, ps_error *err) {
    int64_t N = s->b.B, maxq = s->b.max_q, B = batch < N ? batch : N;
    if (u0 >= u1) return 0;
    ps_gate_info g;
    if (ps_gate_info_of(rt, &g, err)) return -1;
    json_decref(g.layout);
    int nt = 0, rc = 0;
    ps_gate_tap *taps = taps_of(rt, B, s->b.T, &nt, err);
    if (!taps) return -1;
    gate_recorder rec = {.rec = records, .alpha = alpha, .ints = g.ints};
    gate_tap_ctx *tc = calloc((size_t)(nt > 0 ? nt : 1), sizeof *tc);
    int *okb = malloc((size_t)(B * maxq > 0 ? B * maxq : 1) * sizeof(int));
    double *lpb = malloc((size_t)(B * maxq > 0 ? B * maxq : 1) * sizeof(double));
    ps_hooks h;
    ps_hooks_init(&h);
    if (!tc || !okb || !lpb) rc = ps_fail(err, "out of memory for the outcomes of %lld prompts", (long long)B);
    /* a hook per tap, at the family's point (by its name) */
    for (int i = 0; i < nt && !rc; i++) {
        int pi = ps_runtime_point_index(rt, taps[i].point);
        if (pi < 0) {
            rc = ps_fail(err, "%s: gate tap %d names point %d, which the family's point table lacks", rt->family->name, i, taps[i].point);
            break;
        }
        char name[96];
        ps_runtime_point_name(rt, pi, taps[i].layer, name, sizeof name);
        tc[i] = (gate_tap_ctx){&rec, taps[i].layer, taps[i].branch};
        rc = rt->family->hook_add(rt, &h, name, record_gate, &tc[i], err);
    }
    for (int64_t u = u0; u < u1 && !rc; u++) {
        int64_t i0 = u * B, n = N - i0 < B ? N - i0 : B;
        rec.ev = rec_off[u], rec.ev_end = rec_off[u + 1], rec.at = al_off[u], rec.at_end = al_off[u + 1];
        /* the batch one process runs (the family's score in batches of `batch`): prompts [i0, i0 + n) */
        ps_batch view = ps_batch_view(&s->b, i0, n);
        rc = ps_eval_mapped(rt, &view, n, &h, okb, lpb, err);
        if (!rc && (rec.ev != rec.ev_end || rec.at != rec.at_end))
            rc = ps_fail(err, "internal error: batch %lld fired %lld gate records of %lld floats, expected %lld of %lld", (long long)u,
                         (long long)(rec.ev - rec_off[u]), (long long)(rec.at - al_off[u]), (long long)(rec_off[u + 1] - rec_off[u]),
                         (long long)(al_off[u + 1] - al_off[u]));
    }
    ps_hooks_free(&h);
    free(taps);
    free(tc);
    free(okb);
    free(lpb);
    return rc;
}

json_t *ps_gate_log(const ps_runtime *rt, const ps_gate_info *g, const char *path, ps_error *err) {
    if (g->log == PS_GATE_LOG_CHANNELS) return ps_chgate_log_summary(path, err);
    if (g->log != PS_GATE_LOG_HEADS) {
        ps_fail(err, "a %s checkpoint has no phasescope training log", rt->family->title ? rt->family->title : rt->family->name);
        if (err) err->usage = 1;
        return NULL;
    }
    json_t *evo = ps_gates_log_summary(path, err);
    size_t want = (size_t)2 * (size_t)g->log_layers * (size_t)g->log_heads;
    if (evo && json_array_size(evo) != want) {
        ps_fail(err, "%s: its gate records have %zu (layer, KV head, branch) entries, but the model has %lld layers x %lld KV heads (%zu): "
                     "the log is of another model",
                path, json_array_size(evo), (long long)g->log_layers, (long long)g->log_heads, want);
        json_decref(evo);
        return NULL;
    }
    return evo;
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

int ps_chgate_replay(ps_chgate_acc *acc, const int32_t *events, int64_t n_events, const float *alpha, int64_t n_floats,
                     ps_error *err) {
    int64_t at = 0;
    for (int64_t i = 0; i < n_events; i++) {
        const int32_t *e = events + i * PS_CHGATES_RECORD_INTS;
        if (e[0] < 0 || e[0] >= acc->n_layers || e[1] < 0 || e[1] >= acc->n_branches || e[2] < 0 || e[3] < 0)
            return ps_fail(err, "gate record %lld (layer %d, branch %d) does not fit the model", (long long)i, e[0], e[1]);
        const ps_chgate_slot *g = &acc->g[e[0] * acc->n_branches + e[1]];
        int64_t nf = (int64_t)e[2] * e[3] * g->S * g->d;
        if (g->S <= 0 || at + nf > n_floats)
            return ps_fail(err, "gate record %lld (layer %d, branch %d, %d x %d windows) does not fit the model or the data",
                           (long long)i, e[0], e[1], e[2], e[3]);
        ps_chgate_acc_add(acc, e[0], e[1], alpha + at, e[2], e[3]);
        at += nf;
    }
    if (at != n_floats) return ps_fail(err, "gate records: %lld floats left over", (long long)(n_floats - at));
    return 0;
}

json_t *ps_chgate_layout_json(const ps_chgate_acc *acc, const char *model) {
    json_t *br = json_array(), *gs = json_array();
    for (int b = 0; b < acc->n_branches; b++) json_array_append_new(br, json_string(acc->branch[b]));
    for (int l = 0; l < acc->n_layers; l++)
        for (int b = 0; b < acc->n_branches; b++) {
            const ps_chgate_slot *g = &acc->g[l * acc->n_branches + b];
            if (!g->S) continue;
            json_array_append_new(gs, json_pack("[i, i, I, I, i, I, s]", l, b, (json_int_t)g->S, (json_int_t)g->d, g->skip_first,
                                                (json_int_t)g->rate, g->attention));
        }
    return json_pack("{s:s, s:o, s:i, s:o}", "model", model, "branches", br, "n_layers", acc->n_layers, "gates", gs);
}

int ps_chgate_layout_acc(const json_t *layout, ps_chgate_acc *acc, const char **model, ps_error *err) {
    memset(acc, 0, sizeof *acc);
    const json_t *br = json_object_get(layout, "branches"), *gs = json_object_get(layout, "gates");
    const char *names[PS_CHGATE_MAX_BRANCHES] = {NULL};
    int nb = (int)json_array_size(br), L = (int)json_integer_value(json_object_get(layout, "n_layers"));
    *model = json_string_value(json_object_get(layout, "model"));
    if (!*model || nb < 1 || nb > PS_CHGATE_MAX_BRANCHES || L < 1 || !json_is_array(gs))
        return ps_fail(err, "a per-channel gate-statistics partial result: its gate_layout lacks model, branches, n_layers or gates");
    for (int b = 0; b < nb; b++)
        if (!(names[b] = json_string_value(json_array_get(br, (size_t)b))))
            return ps_fail(err, "a per-channel gate-statistics partial result: gate_layout.branches[%d] is not a name", b);
    if (ps_chgate_acc_init(acc, L, nb, names, err)) return -1;
    for (size_t i = 0; i < json_array_size(gs); i++) {
        json_int_t l, b, S, d, skip, rate;
        const char *att;
        if (json_unpack(json_array_get(gs, i), "[I, I, I, I, I, I, s]", &l, &b, &S, &d, &skip, &rate, &att) || l < 0 || l >= L ||
            b < 0 || b >= nb || S < 1 || d < 1) {
            ps_chgate_acc_free(acc);
            return ps_fail(err, "a per-channel gate-statistics partial result: gate_layout.gates[%zu] is not [layer, branch, S, d, "
                                "skip_first, rate, attention] of its layers", i);
        }
        if (ps_chgate_acc_set(acc, (int)l, (int)b, S, d, (int)skip, rate, att, err)) {
            ps_chgate_acc_free(acc);
            return -1;
        }
    }
    return 0;
}

/* ---- sweep --task text-kv ---- */

int ps_textkv_units_init(ps_textkv_units *u, const ps_config *c, const int64_t *T, int64_t P, int64_t N, int64_t batch,
                         ps_error *err) {
    memset(u, 0, sizeof *u);
    u->P = P, u->N = N;
    u->first = malloc((size_t)(P + 1) * sizeof *u->first);
    u->size = malloc((size_t)(P > 0 ? P : 1) * sizeof *u->size);
    u->T = malloc((size_t)(P > 0 ? P : 1) * sizeof *u->T);
    if (!u->first || !u->size || !u->T) {
        ps_textkv_units_free(u);
        return ps_fail(err, "out of memory for the work units of %lld shifts", (long long)P);
    }
    u->first[0] = 0;
    for (int64_t p = 0; p < P; p++) {
        int64_t fit = ps_eval_batch_fit(c, T[p], batch, 0), b = fit > 0 ? fit : batch;
        u->size[p] = b < N ? b : N;
        u->T[p] = T[p];
        u->first[p + 1] = u->first[p] + (N + u->size[p] - 1) / u->size[p];
    }
    u->n_units = u->first[P];
    return 0;
}

void ps_textkv_units_free(ps_textkv_units *u) {
    free(u->first);
    free(u->size);
    free(u->T);
    memset(u, 0, sizeof *u);
}

void ps_textkv_unit(const ps_textkv_units *u, int64_t k, int64_t *p, int64_t *i0, int64_t *n) {
    int64_t lo = 0, hi = u->P - 1; /* the shift whose units hold k */
    while (lo < hi) {
        int64_t mid = (lo + hi + 1) / 2;
        if (u->first[mid] <= k) lo = mid;
        else hi = mid - 1;
    }
    *p = lo;
    *i0 = (k - u->first[lo]) * u->size[lo];
    *n = u->N - *i0 < u->size[lo] ? u->N - *i0 : u->size[lo];
}

void ps_textkv_unit_weights(const ps_textkv_units *u, int64_t *w) {
    for (int64_t k = 0; k < u->n_units; k++) {
        int64_t p, i0, n;
        ps_textkv_unit(u, k, &p, &i0, &n);
        w[k] = n * u->T[p];
    }
}

int ps_textkv_sweep_units(const ps_model *m, const ps_textkv_set *set, ps_sweep_mode mode, uint64_t seed, const ps_textkv_units *u,
                          int64_t k0, int64_t k1, int32_t *ok, double *lp, int32_t *rho, ps_progress_fn progress, void *user,
                          ps_error *err) {
    int64_t N = u->N, maxq = set->kv.n_queries, most = 0;
    if (k0 >= k1) return 0;
    for (int64_t p = 0; p < u->P; p++) most = u->size[p] > most ? u->size[p] : most;
    int *okb = malloc((size_t)(most * maxq > 0 ? most * maxq : 1) * sizeof(int));
    double *lpb = malloc((size_t)(most * maxq > 0 ? most * maxq : 1) * sizeof(double));
    int rc = okb && lpb ? 0 : ps_fail(err, "out of memory for the outcomes of %lld prompts x %lld queries", (long long)most, (long long)maxq);
    ps_shifted s;
    int64_t have_p = -1;
    for (int64_t k = k0; k < k1 && !rc; k++) {
        int64_t p, i0, n;
        ps_textkv_unit(u, k, &p, &i0, &n);
        if (p != have_p) {
            if (have_p >= 0) ps_shifted_free(&s);
            have_p = -1;
            if ((rc = ps_textkv_shifted(&set->kv, mode, u->P, p, seed, N, m->cfg.max_seq_len, &s, err))) break;
            have_p = p;
            if (s.b.T != u->T[p]) {
                rc = ps_fail(err, "internal error: text-kv shift %lld has %lld tokens, planned %lld", (long long)p, (long long)s.b.T,
                             (long long)u->T[p]);
                break;
            }
        }
        /* the batch one process runs: prompts [i0, i0 + n) of shift p, padded to the shift's length */
        ps_shifted v = s;
        v.b = ps_batch_view(&s.b, i0, n);
        v.residue = s.residue + i0 * maxq;
        if ((rc = ps_eval_shifted_fit(m, &v, u->size[p], 0, okb, lpb, err))) break;
        int64_t at = (p * N + i0) * maxq;
        record_outcomes(&v, okb, lpb, maxq, ok + at, lp + at, rho + at);
        if (progress && progress(k + 1 - k0, k1 - k0, user)) {
            rc = ps_fail(err, "cancelled after %lld of %lld batches", (long long)(k + 1 - k0), (long long)(k1 - k0));
            break;
        }
    }
    if (have_p >= 0) ps_shifted_free(&s);
    free(okb);
    free(lpb);
    return rc;
}
