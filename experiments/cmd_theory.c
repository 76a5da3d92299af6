/* cmd_theory.c — `phasescope theory`: trains the idealised bigram-induction model of SPEC §1
 * (docs/theory.md) by gradient descent from a small random init, records its gates at log-spaced steps
 * and writes OUT/theory.json and OUT/theory.png. This file reads the flags, calls the library and writes
 * the result; the model, its exact loss and gradients live in gates/theory.c, the training loop, the
 * summary of the gates and the gradient check in gates/theory_train.c. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "experiments/cli.h"
#include "viz/figures.h"
#include "core/fileio.h"
#include "gates/gates.h"
#include "experiments/progress.h"
#include "gates/theory_train.h"

static int run(const ps_args *a, ps_error *err);

static const ps_flag_spec FLAGS[] = {
    {"--heads", "H", "heads (default 7 = S - 1: one per phase a head can answer)", 0},
    {"--window", "S", "chunk length W = S (default 8)", 0},
    {"--chunks", "C", "chunks of context (default 8)", 0},
    {"--vocab", "N", "tokens (default 128, >= C·S)", 0},
    {"--steps", "K", "gradient steps (default 1e5)", 0},
    {"--lr", "X", "learning rate (default 1)", 0},
    {"--temperature", "L", "score scale lambda = logit scale mu (default 8): fixed, or the starting value", 0},
    {"--learn-temperature", NULL, "learn log lambda and log mu by gradient descent too (no ceiling)", 0},
    {"--boundary", NULL,
     "also ask the queries at phase S - 1, whose successor lies in the next chunk (no\n"
     "head can answer them with key r, value r + 1); default: phases 0 .. S - 2 only,\n"
     "the theorem's setting, every successor in its query's chunk",
     0},
    {"--batch", "B",
     "0 (default): the exact population gradient (gradient descent on the expected\n"
     "loss); B > 0: B query positions sampled per step (stochastic gradient)",
     0},
    {"--records", "R", "log-spaced records of the gates (default 80)", 0},
    {"--seed", "S", "seed of the init (and of the sampled positions), default 0", 0},
    {"--out", "DIR", "default out/theory", 0},
    {"--check-grad", NULL,
     "compare the exact gradient (gates and both log-temperatures) with central finite\n"
     "differences at random gate logits, and the phase sum with the sum over every\n"
     "position, then exit",
     0},
    {0},
};

const ps_command ps_cmd_theory = {
    .name = "theory",
    .summary = "the idealised bigram-induction model: gates converge to one offset",
    .description =
        "Trains the idealised bigram-induction model (docs/theory.md: one-hot embeddings, one compressed key and\n"
        "value per chunk and head, static gates) by gradient descent from gate logits N(0, 0.01²), and records\n"
        "each head's key and value gates, their effective offsets, the loss, the accuracy and the temperatures at\n"
        "log-spaced steps. Writes OUT/theory.json and OUT/theory.png.\n",
    .flags = FLAGS,
    .run = run,
};

/* The records as they are taken: the JSON arrays of theory.json, and the progress line. */
typedef struct {
    json_t *steps, *loss, *acc, *lam, *mu;
    json_t **kg, **vg, **nk, **nv; /* per head */
    int64_t H;
    ps_progress bar;
} records;

static void on_record(const ps_theory *t, int64_t step, int64_t steps, double loss, double acc, void *user) {
    records *r = user;
    int64_t S = t->S;
    json_array_append_new(r->steps, json_integer(step));
    json_array_append_new(r->loss, json_real(loss));
    json_array_append_new(r->acc, json_real(acc));
    json_array_append_new(r->lam, json_real(exp(t->log_lam)));
    json_array_append_new(r->mu, json_real(exp(t->log_mu)));
    for (int64_t h = 0; h < r->H; h++) {
        json_t *k = json_array(), *v = json_array();
        for (int64_t i = 0; i < S; i++) {
            json_array_append_new(k, json_real(t->alpha[h * S + i]));
            json_array_append_new(v, json_real(t->beta[h * S + i]));
        }
        json_array_append_new(r->kg[h], k);
        json_array_append_new(r->vg[h], v);
        json_array_append_new(r->nk[h], json_real(ps_effective_offsets(t->alpha + h * S, S)));
        json_array_append_new(r->nv[h], json_real(ps_effective_offsets(t->beta + h * S, S)));
    }
    char note[64];
    snprintf(note, sizeof note, "loss %.4f", loss);
    ps_progress_update(&r->bar, step, steps, note);
}

static void records_free(records *r) {
    for (int64_t h = 0; h < r->H; h++) {
        json_decref(r->kg[h]);
        json_decref(r->vg[h]);
        json_decref(r->nk[h]);
        json_decref(r->nv[h]);
    }
    free(r->kg);
    free(r->vg);
    free(r->nk);
    free(r->nv);
    json_decref(r->steps);
    json_decref(r->loss);
    json_decref(r->acc);
    json_decref(r->lam);
    json_decref(r->mu);
}

static int records_init(records *r, int64_t H, ps_error *err) {
    *r = (records){.H = 0};
    r->kg = calloc((size_t)H, sizeof(json_t *));
    r->vg = calloc((size_t)H, sizeof(json_t *));
    r->nk = calloc((size_t)H, sizeof(json_t *));
    r->nv = calloc((size_t)H, sizeof(json_t *));
    if (!r->kg || !r->vg || !r->nk || !r->nv) return ps_fail(err, "out of memory");
    r->H = H;
    r->steps = json_array();
    r->loss = json_array();
    r->acc = json_array();
    r->lam = json_array();
    r->mu = json_array();
    for (int64_t h = 0; h < H; h++) {
        r->kg[h] = json_array();
        r->vg[h] = json_array();
        r->nk[h] = json_array();
        r->nv[h] = json_array();
    }
    ps_progress_init(&r->bar, (int64_t)1 << 40);
    return 0;
}

static int check_grad(const ps_theory_opts *o, ps_error *err) {
    ps_theory_gradcheck r;
    int rc = ps_theory_check_grad(o, &r, err);
    if (r.n_params) {
        printf("gradient check: %lld parameters, max |exact - finite difference| / max |gradient| = %.2e (gate logits), "
               "%.2e (log lambda, log mu)\n",
               (long long)r.n_params, r.gates, r.temperatures);
        printf("phase sum vs every position: loss %.2e, gradient %.2e (relative)\n", r.phase_loss, r.phase_grad);
    }
    return rc;
}

/* theory.json: the parameters, the records, the final heads and which phases they answer. Takes the
 * records' arrays. */
static json_t *result_json(const ps_args *a, const ps_theory_opts *o, records *rec, const ps_theory_summary *s) {
    json_t *res = json_object(), *prov = json_object(), *heads_j = json_array();
    for (int64_t h = 0; h < o->H; h++) {
        const ps_theory_head *e = &s->head[h];
        json_t *ho = json_object();
        json_object_set_new(ho, "head", json_integer(h));
        json_object_set_new(ho, "key_gate", rec->kg[h]);
        json_object_set_new(ho, "value_gate", rec->vg[h]);
        json_object_set_new(ho, "N_key_over_time", rec->nk[h]);
        json_object_set_new(ho, "N_value_over_time", rec->nv[h]);
        rec->kg[h] = rec->vg[h] = rec->nk[h] = rec->nv[h] = NULL;
        json_object_set_new(ho, "key_peak", json_integer(e->key_peak));
        json_object_set_new(ho, "value_peak", json_integer(e->value_peak));
        json_object_set_new(ho, "value_peak_is_key_peak_plus_1", json_boolean(e->aligned));
        json_object_set_new(ho, "N_key", json_real(e->N_key));
        json_object_set_new(ho, "N_value", json_real(e->N_value));
        json_array_append_new(heads_j, ho);
    }
    json_t *cov_j = json_array(), *shared_j = json_array();
    for (int64_t i = 0; i < ps_theory_coverable(o->S); i++)
        if (s->cover[i]) {
            json_array_append_new(cov_j, json_integer(i));
            if (s->cover[i] > 1) json_array_append_new(shared_j, json_integer(i));
        }
    char *cmd = ps_args_command_line(a);
    json_object_set_new(prov, "command", json_string(cmd));
    free(cmd);
    json_object_set_new(prov, "model", json_string("idealised bigram induction (docs/theory.md)"));
    json_object_set_new(prov, "seed", json_integer((json_int_t)o->seed));
    json_object_set_new(prov, "version", json_string(PS_VERSION));
    json_object_set_new(res, "kind", json_string("theory"));
    json_object_set_new(res, "provenance", prov);
    json_object_set_new(res, "params",
                        json_pack("{s:I,s:I,s:I,s:I,s:I,s:f,s:f,s:b,s:b,s:I,s:I,s:f}", "heads", (json_int_t)o->H, "window",
                                  (json_int_t)o->S, "chunks", (json_int_t)o->C, "vocab", (json_int_t)o->N, "steps",
                                  (json_int_t)o->steps, "lr", o->lr, "temperature", o->temperature, "learn_temperature",
                                  o->learn_temperature, "within_chunk", o->within_chunk, "batch", (json_int_t)o->batch,
                                  "records", (json_int_t)o->records, "init_std", o->init_std));
    json_object_set_new(res, "steps", rec->steps);
    json_object_set_new(res, "loss", rec->loss);
    json_object_set_new(res, "accuracy", rec->acc);
    json_object_set_new(res, "score_scale", rec->lam);
    json_object_set_new(res, "logit_scale", rec->mu);
    rec->steps = rec->loss = rec->acc = rec->lam = rec->mu = NULL;
    json_object_set_new(res, "heads", heads_j);
    json_object_set_new(res, "heads_with_value_peak_after_key_peak", json_integer(s->aligned));
    json_object_set_new(res, "heads_one_hot", json_integer(s->one_hot));
    json_object_set_new(res, "max_final_N", json_real(s->max_N));
    json_object_set_new(res, "coverable_phases", json_integer(ps_theory_coverable(o->S)));
    json_object_set_new(res, "covered_phases", cov_j);
    json_object_set_new(res, "phases_covered_twice_or_more", shared_j);
    return res;
}

static int run(const ps_args *a, ps_error *err) {
    ps_theory_opts o;
    ps_theory_opts_default(&o);
    int64_t seed = 0;
    if (ps_args_int(a, "--heads", 1, PS_THEORY_MAX_HEADS, &o.H, err) ||
        ps_args_int(a, "--window", PS_THEORY_MIN_WINDOW, PS_THEORY_MAX_WINDOW, &o.S, err) ||
        ps_args_int(a, "--chunks", 1, PS_THEORY_MAX_CHUNKS, &o.C, err) ||
        ps_args_int(a, "--vocab", PS_THEORY_MIN_VOCAB, PS_THEORY_MAX_VOCAB, &o.N, err) ||
        ps_args_int(a, "--steps", 1, PS_THEORY_MAX_STEPS, &o.steps, err) ||
        ps_args_int(a, "--batch", 0, PS_THEORY_MAX_BATCH, &o.batch, err) || ps_args_int(a, "--seed", 0, INT64_MAX, &seed, err) ||
        ps_args_int(a, "--records", PS_THEORY_MIN_RECORDS, PS_THEORY_MAX_RECORDS, &o.records, err) ||
        ps_args_positive(a, "--lr", 1e4, &o.lr, err) || ps_args_positive(a, "--temperature", 1e4, &o.temperature, err))
        return -1;
    o.seed = (uint64_t)seed;
    if (o.N < o.C * o.S)
        return ps_cli_usage(err, "--vocab %lld: must hold the %lld distinct context tokens (chunks x window)", (long long)o.N,
                            (long long)(o.C * o.S));
    o.learn_temperature = ps_args_has(a, "--learn-temperature");
    o.within_chunk = !ps_args_has(a, "--boundary");
    if (ps_args_has(a, "--check-grad")) return check_grad(&o, err);

    ps_theory t = {0};
    ps_theory_summary *s = malloc(sizeof *s);
    records rec;
    json_t *res = NULL;
    double loss = 0, acc = 0;
    int rc = -1;
    if (!s) {
        ps_fail(err, "out of memory");
        return -1;
    }
    if (records_init(&rec, o.H, err)) goto done;
    int bad = ps_theory_train(&t, &o, on_record, &rec, &loss, &acc, err);
    ps_progress_end(&rec.bar);
    if (bad) goto done;
    /* per head: final peaks and effective offsets; which phases are answered (key r, value r + 1) */
    ps_theory_summarise(&t, s);
    printf("%-5s %-9s %-9s %-10s %-10s %s\n", "head", "key peak", "val peak", "N_key", "N_value", "value = key + 1");
    for (int64_t h = 0; h < o.H; h++) {
        const ps_theory_head *e = &s->head[h];
        printf("%-5lld %-9lld %-9lld %-10.4f %-10.4f %s\n", (long long)h, (long long)e->key_peak, (long long)e->value_peak,
               e->N_key, e->N_value, e->aligned ? "yes" : "no");
    }
    res = result_json(a, &o, &rec, s);
    int64_t S = o.S;
    printf("%lld of %lld heads have their value peak one offset after their key peak; %lld of %lld one-hot (N_key, N_value "
           "<= %.2f)\n"
           "phases answered (key r, value r + 1): %lld of the %lld a head can answer (0 .. %lld); final loss %.4f, accuracy %.3f, "
           "lambda %.3f, mu %.3f\n",
           (long long)s->aligned, (long long)o.H, (long long)s->one_hot, (long long)o.H, PS_THEORY_ONE_HOT_N,
           (long long)s->n_covered, (long long)ps_theory_coverable(S), (long long)(ps_theory_coverable(S) - 1), loss, acc,
           exp(t.log_lam), exp(t.log_mu));
    const char *out = ps_args_get(a, "--out");
    if (!out) out = "out/theory";
    char path[4200];
    if (ps_mkdir("out", err) || ps_mkdir(out, err) || ps_path_join(path, sizeof path, out, "theory.json", err)) goto done;
    char *text = json_dumps(res, JSON_INDENT(1) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(8));
    bad = !text || ps_write_file_atomic(path, text, strlen(text), err);
    if (!text) ps_fail(err, "out of memory");
    free(text);
    if (bad) goto done;
    printf("wrote %s\n", path);
    const char *paths[1] = {path};
    if (ps_render(paths, 1, out, NULL, 1, err)) goto done;
    rc = 0;
done:
    records_free(&rec);
    json_decref(res);
    free(s);
    ps_theory_free(&t);
    return rc;
}
