#include "interventions/sweep.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/fileio.h"
#include "core/prefill.h"
#include "core/rng.h"
#include "interventions/stats.h"
#include "tasks/tasks.h"

int ps_fillers_load(const char *path, ps_filler_family **out, int *n, ps_error *err) {
    *out = NULL;
    *n = 0;
    char *text;
    size_t len;
    if (ps_read_file(path, 1 << 20, &text, &len, err)) return -1;
    json_error_t je;
    json_t *root = json_loadb(text, len, 0, &je);
    free(text);
    if (!root) return ps_fail(err, "%s: not valid JSON (line %d: %s)", path, je.line, je.text);
    json_t *fams = json_object_get(root, "families");
    int rc = -1;
    if (!json_is_array(fams) || json_array_size(fams) == 0 || json_array_size(fams) > 1000) {
        ps_fail(err, "%s: key \"families\" must be a non-empty list", path);
        goto done;
    }
    *out = calloc(json_array_size(fams), sizeof **out);
    if (!*out) {
        ps_fail(err, "%s: out of memory for %zu filler families", path, json_array_size(fams));
        goto done;
    }
    for (size_t i = 0; i < json_array_size(fams); i++) {
        json_t *f = json_array_get(fams, i), *nm = json_object_get(f, "name"), *kind = json_object_get(f, "kind");
        ps_filler_family *ff = &(*out)[i];
        if (!json_is_string(nm) || strlen(json_string_value(nm)) >= sizeof ff->name || !json_is_string(kind)) {
            ps_fail(err, "%s: family %zu needs a string \"name\" (< 64 chars) and \"kind\"", path, i);
            goto done;
        }
        snprintf(ff->name, sizeof ff->name, "%s", json_string_value(nm));
        if (!strcmp(json_string_value(kind), "random")) ff->random = 1;
        else if (!strcmp(json_string_value(kind), "pattern")) {
            json_t *pat = json_object_get(f, "pattern");
            if (!json_is_array(pat) || json_array_size(pat) == 0 || json_array_size(pat) > 64) {
                ps_fail(err, "%s: family \"%s\": \"pattern\" must be a list of 1..64 filler indices", path, ff->name);
                goto done;
            }
            ff->n_pattern = (int64_t)json_array_size(pat);
            for (int64_t k = 0; k < ff->n_pattern; k++) {
                json_t *x = json_array_get(pat, (size_t)k);
                if (!json_is_integer(x) || json_integer_value(x) < 0) {
                    ps_fail(err, "%s: family \"%s\": pattern entries must be non-negative integers", path, ff->name);
                    goto done;
                }
                ff->pattern[k] = (int64_t)json_integer_value(x);
            }
        } else {
            ps_fail(err, "%s: family \"%s\": kind must be \"pattern\" or \"random\"", path, ff->name);
            goto done;
        }
        (*n)++;
    }
    rc = 0;
done:
    json_decref(root);
    if (rc) {
        free(*out);
        *out = NULL;
        *n = 0;
    }
    return rc;
}

int ps_fillers_find(const ps_filler_family *f, int n, const char *name, const ps_filler_family **out, ps_error *err) {
    if (!name) {
        *out = &f[0];
        return 0;
    }
    char list[512] = "";
    for (int i = 0; i < n; i++) {
        if (!strcmp(f[i].name, name)) {
            *out = &f[i];
            return 0;
        }
        size_t l = strlen(list);
        snprintf(list + l, sizeof list - l, "%s%s", i ? ", " : "", f[i].name);
    }
    return ps_fail(err, "--family %s: unknown filler family (families: %s)", name, list);
}

int ps_model_task(const ps_model *m, const char *dir, ps_task *t, ps_error *err) {
    const char *js = ps_model_get_meta(m, "phasescope.task");
    if (!js)
        return ps_fail(err, "%s: the checkpoint has no task layout (phasescope.task in its metadata); models trained "
                            "with phasescope train carry one",
                       dir);
    json_error_t je;
    json_t *o = json_loads(js, 0, &je);
    if (!o) return ps_fail(err, "%s: phasescope.task metadata is not valid JSON", dir);
    char src[4200];
    snprintf(src, sizeof src, "%s/model.safetensors (phasescope.task)", dir);
    int rc = ps_task_from_json(o, src, t, err);
    json_decref(o);
    if (!rc) rc = ps_task_validate(t, m->cfg.vocab_size, INT64_MAX / 4, src, err);
    return rc;
}

static void filler(const ps_filler_family *f, const ps_task *t, ps_rng *r, int32_t *dst, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        int64_t idx = f->random ? ps_rng_below(r, t->n_fillers) : f->pattern[i % f->n_pattern] % t->n_fillers;
        dst[i] = (int32_t)(ps_task_fill0(t) + idx);
    }
}

void ps_shifted_free(ps_shifted *s) {
    ps_batch_free(&s->b);
    free(s->residue);
    memset(s, 0, sizeof *s);
}

int ps_make_shifted(const ps_batch *base, const ps_task *task, const ps_filler_family *fam, ps_sweep_mode mode,
                    int64_t P, int64_t p, uint64_t seed, int64_t max_seq_len, ps_shifted *out, ps_error *err) {
    memset(out, 0, sizeof *out);
    int64_t T = base->T, N = base->B, add = mode == PS_SWEEP_PAD ? p : P - 1, Tp = T + add;
    if (mode == PS_SWEEP_PAD && T + P - 1 > max_seq_len)
        return ps_fail(err, "prompts of %lld tokens padded by up to %lld fillers need %lld positions, more than max_seq_len "
                            "%lld by %lld",
                       (long long)T, (long long)(P - 1), (long long)(T + P - 1), (long long)max_seq_len,
                       (long long)(T + P - 1 - max_seq_len));
    if (mode == PS_SWEEP_MOVE && Tp > max_seq_len)
        return ps_fail(err, "move mode adds %lld fillers to prompts of %lld tokens: %lld positions, more than max_seq_len "
                            "%lld by %lld",
                       (long long)(P - 1), (long long)T, (long long)Tp, (long long)max_seq_len, (long long)(Tp - max_seq_len));
    if (ps_batch_alloc(&out->b, N, Tp, base->max_q, err)) return -1;
    out->residue = malloc((size_t)(N * base->max_q) * sizeof(int64_t));
    if (!out->residue) {
        ps_shifted_free(out);
        return ps_fail(err, "out of memory for the residues of %lld shifted prompts", (long long)N);
    }
    out->p = p;
    out->P = P;
    int64_t pair_len = task->kind == PS_TASK_KV ? task->key_len + task->value_len : 2;
    for (int64_t i = 0; i < N; i++) {
        ps_rng r;
        ps_rng_seed(&r, seed * 0x9e3779b97f4a7c15ULL ^ ((uint64_t)i << 20) ^ (uint64_t)p);
        const int32_t *src = base->tokens + i * T;
        int32_t *dst = out->b.tokens + i * Tp;
        out->b.n_q[i] = base->n_q[i];
        for (int64_t t = 0; t < Tp; t++) out->b.targets[i * Tp + t] = -1;
        if (mode == PS_SWEEP_PAD) {
            dst[0] = src[0];
            filler(fam, task, &r, dst + 1, p);
            memcpy(dst + 1 + p, src + 1, (size_t)(T - 1) * sizeof(int32_t));
            for (int64_t q = 0; q < base->n_q[i]; q++) {
                ps_query qq = base->queries[i * base->max_q + q];
                qq.key_pos += p;
                qq.answer_pos += p;
                qq.answer_src += p;
                out->b.queries[i * base->max_q + q] = qq;
                out->residue[i * base->max_q + q] = qq.key_pos % P;
            }
        } else {
            /* move the first query's pair: [kp, kp + pair_len) gets p fillers before it, P-1-p after it */
            ps_query q0 = base->queries[i * base->max_q];
            int64_t kp = q0.key_pos, w = 0;
            memcpy(dst, src, (size_t)kp * sizeof(int32_t));
            w = kp;
            filler(fam, task, &r, dst + w, p);
            w += p;
            memcpy(dst + w, src + kp, (size_t)pair_len * sizeof(int32_t));
            w += pair_len;
            filler(fam, task, &r, dst + w, P - 1 - p);
            w += P - 1 - p;
            memcpy(dst + w, src + kp + pair_len, (size_t)(T - kp - pair_len) * sizeof(int32_t));
            for (int64_t q = 0; q < base->n_q[i]; q++) {
                ps_query qq = base->queries[i * base->max_q + q];
                /* a position before the pair stays, inside the pair moves by p, after it by P-1 */
#define MOVED(x) ((x) < kp ? (x) : (x) < kp + pair_len ? (x) + p : (x) + P - 1)
                qq.key_pos = MOVED(qq.key_pos);
                qq.answer_src = MOVED(qq.answer_src);
                qq.answer_pos += P - 1; /* queries follow the context */
#undef MOVED
                out->b.queries[i * base->max_q + q] = qq;
                out->residue[i * base->max_q + q] = q == 0 ? qq.key_pos % P : -1;
            }
        }
        /* answer targets (for the loss-free scorer they only document the answers) */
        for (int64_t q = 0; q < out->b.n_q[i]; q++) {
            const ps_query *qq = &out->b.queries[i * base->max_q + q];
            for (int64_t k = 0; k < qq->answer_len; k++) out->b.targets[i * Tp + qq->answer_pos + k] = dst[qq->answer_src + k];
        }
    }
    return 0;
}

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
            if (rho < 0) continue;
            r->n[rho]++;
            r->k[rho] += correct[i * s->b.max_q + q];
            r->lp[rho] += logprob[i * s->b.max_q + q];
        }
}

double ps_residue_accuracy(const ps_residue_stats *r, int64_t rho) {
    return r->n[rho] ? (double)r->k[rho] / (double)r->n[rho] : 0.0;
}

typedef struct {
    int *correct;
    double *logprob;
} eval_out;

static int score_batch(const ps_batch *view, int64_t i0, ps_acts *a, void *user, ps_error *err) {
    eval_out *o = user;
    return ps_acts_score(a, view, o->correct + i0 * view->max_q, o->logprob + i0 * view->max_q, err);
}

/* Long prompts: one at a time through the chunked prefill, logits at the answer rows only. */
static int eval_long(const ps_model *m, const ps_batch *b, int *correct, double *logprob, ps_error *err) {
    int64_t V = m->cfg.vocab_size, most = 0;
    for (int64_t s = 0; s < b->B; s++) {
        int64_t n = ps_answer_rows(b, s, NULL);
        most = n > most ? n : most;
    }
    ps_prefill p;
    if (ps_prefill_create(&p, m, b->T, PS_PREFILL_CHUNK, err)) return -1;
    int64_t *pos = malloc((size_t)(most ? most : 1) * sizeof *pos);
    float *rows = malloc((size_t)((most ? most : 1) * V) * sizeof(float));
    int rc = pos && rows ? 0 : ps_fail(err, "out of memory for the logits of %lld answer rows", (long long)most);
    for (int64_t s = 0; s < b->B && !rc; s++) {
        int64_t n = ps_answer_rows(b, s, pos);
        rc = ps_prefill_logits(&p, b->tokens + s * b->T, b->T, pos, n, rows, err);
        if (!rc) ps_score_query_rows(b, s, rows, V, correct + s * b->max_q, logprob + s * b->max_q);
    }
    free(pos);
    free(rows);
    ps_prefill_free(&p);
    return rc;
}

int ps_eval_shifted(const ps_model *m, const ps_shifted *s, int64_t batch, const ps_hooks *hooks, int *correct,
                    double *logprob, ps_error *err) {
    if (s->b.T > PS_LONG_CONTEXT) {
        if (hooks) return ps_fail(err, "hooks on prompts of %lld tokens: long prompts run in chunks (prefill), which fires no hooks (at most %d tokens)",
                                  (long long)s->b.T, PS_LONG_CONTEXT);
        return eval_long(m, &s->b, correct, logprob, err);
    }
    eval_out o = {correct, logprob};
    return ps_forward_batches(m, &s->b, batch, false, hooks, score_batch, &o, err);
}

int ps_sweep_run(const ps_model *m, const ps_batch *base, const ps_task *task, const ps_filler_family *fam,
                 ps_sweep_mode mode, int64_t P, uint64_t seed, int64_t batch, ps_residue_stats *stats,
                 ps_progress_fn progress, void *user, ps_error *err) {
    if (ps_residue_stats_init(stats, P, err)) return -1;
    int *ok = malloc((size_t)(base->B * base->max_q) * sizeof(int));
    double *lp = malloc((size_t)(base->B * base->max_q) * sizeof(double));
    int rc = ok && lp ? 0
                      : ps_fail(err, "out of memory for the outcomes of %lld prompts x %lld queries",
                                (long long)base->B, (long long)base->max_q);
    for (int64_t p = 0; p < P && !rc; p++) {
        ps_shifted s;
        rc = ps_make_shifted(base, task, fam, mode, P, p, seed, m->cfg.max_seq_len, &s, err);
        if (rc) break;
        rc = ps_eval_shifted(m, &s, batch, NULL, ok, lp, err);
        if (!rc) ps_residue_stats_add(stats, &s, ok, lp);
        ps_shifted_free(&s);
        if (progress) progress(p + 1, P, user);
    }
    free(ok);
    free(lp);
    return rc;
}

/* every jansson call can fail on memory: `bad` collects the failures */
#define SET(o, key, v) (bad |= json_object_set_new((o), (key), (v)) != 0)

json_t *ps_residue_stats_json(const ps_residue_stats *r, ps_error *err) {
    int64_t P = r->P, N = 0, K = 0;
    int bad = 0;
    double mn = INFINITY, mx = -INFINITY, *acc = malloc((size_t)(P > 0 ? P : 1) * sizeof(double));
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

/* ---- text prompts: batches sized to a memory budget (sweep.h) ---- */

int64_t ps_eval_batch_fit(const ps_config *c, int64_t T, int64_t want, double mem_bytes) {
    if (T > PS_LONG_CONTEXT) return 0;
    double budget = mem_bytes > 0 ? mem_bytes : PS_EVAL_MEM_DEFAULT;
    double one = 4.0 * (double)ps_acts_size(c, 1, T, false, false);
    if (one > budget) return 0;
    int64_t fit = (int64_t)(budget / one);
    return fit < want ? (fit > 0 ? fit : 1) : want;
}

typedef struct {
    ps_rows_fn fn;
    void *user;
    float *rows;
    int64_t V;
    const ps_batch *whole;
} rows_ctx;

static int rows_batch(const ps_batch *view, int64_t i0, ps_acts *a, void *user, ps_error *err) {
    rows_ctx *x = user;
    const float *lg = ps_acts_logits_host(a, err);
    if (!lg) return -1;
    if (a->max_rows) { /* logits at the answer rows only (a large vocabulary): [n_rows, V], sequence by sequence */
        int64_t off = 0;
        for (int64_t s = 0; s < view->B; s++) {
            int64_t n = ps_answer_rows(view, s, NULL);
            if (x->fn(x->whole, i0 + s, lg + off * x->V, n, x->user, err)) return -1;
            off += n;
        }
        return 0;
    }
    for (int64_t s = 0; s < view->B; s++) {
        int64_t n = 0;
        for (int64_t qi = 0; qi < view->n_q[s]; qi++) {
            const ps_query *q = &view->queries[s * view->max_q + qi];
            memcpy(x->rows + n * x->V, lg + (s * view->T + q->answer_pos) * x->V, (size_t)(q->answer_len * x->V) * sizeof(float));
            n += q->answer_len;
        }
        if (x->fn(x->whole, i0 + s, x->rows, n, x->user, err)) return -1;
    }
    return 0;
}

int ps_eval_rows(const ps_model *m, const ps_batch *b, int64_t batch, double mem_bytes, ps_rows_fn fn, void *user,
                 ps_error *err) {
    int64_t V = m->cfg.vocab_size, most = 0;
    if (b->B == 0) return 0;
    for (int64_t s = 0; s < b->B; s++) {
        int64_t n = ps_answer_rows(b, s, NULL);
        most = n > most ? n : most;
    }
    rows_ctx x = {fn, user, malloc((size_t)((most ? most : 1) * V) * sizeof(float)), V, b};
    if (!x.rows) return ps_fail(err, "out of memory for the logits of %lld answer rows", (long long)most);
    int64_t fit = ps_eval_batch_fit(&m->cfg, b->T, batch, mem_bytes);
    int rc = 0;
    if (fit > 0)
        rc = ps_forward_batches(m, b, fit, false, NULL, rows_batch, &x, err);
    else {
        ps_prefill p = {0};
        int64_t *pos = malloc((size_t)(most ? most : 1) * sizeof *pos);
        rc = pos ? ps_prefill_create(&p, m, b->T, PS_PREFILL_CHUNK, err) : ps_fail(err, "out of memory");
        for (int64_t s = 0; s < b->B && !rc; s++) {
            int64_t n = ps_answer_rows(b, s, pos), last = 0;
            for (int64_t k = 0; k < n; k++) last = pos[k] > last ? pos[k] : last;
            rc = ps_prefill_logits(&p, b->tokens + s * b->T, last + 1, pos, n, x.rows, err);
            if (!rc) rc = fn(b, s, x.rows, n, user, err);
        }
        ps_prefill_free(&p);
        free(pos);
    }
    free(x.rows);
    return rc;
}

typedef struct {
    int *correct;
    double *logprob;
    int64_t V;
} fit_out;

static int score_rows(const ps_batch *b, int64_t s, const float *rows, int64_t n, void *user, ps_error *err) {
    (void)n;
    (void)err;
    fit_out *o = user;
    ps_score_query_rows(b, s, rows, o->V, o->correct + s * b->max_q, o->logprob + s * b->max_q);
    return 0;
}

int ps_eval_shifted_fit(const ps_model *m, const ps_shifted *s, int64_t batch, double mem_bytes, int *correct,
                        double *logprob, ps_error *err) {
    fit_out o = {correct, logprob, m->cfg.vocab_size};
    return ps_eval_rows(m, &s->b, batch, mem_bytes, score_rows, &o, err);
}
