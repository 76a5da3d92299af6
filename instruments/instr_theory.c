/* instr_theory.c — the theory instrument (instrument.h, ps_theory_command): trains the idealised
 * bigram-induction model with cmd_theory.c's options (gates/theory_train.h), records its gates at
 * log-spaced steps, prints the per-head summary, writes OUT/theory.json and draws OUT/theory.png; or, with
 * --check-grad, only the gradient check. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fileio.h"
#include "instruments/instrument.h"
#include "instruments/progress.h"
#include "gates/gates.h"
#include "gates/theory_train.h"
#include "viz/figures.h"

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

static int check_grad(const ps_out *po, const ps_theory_opts *o, ps_error *err) {
    ps_theory_gradcheck r;
    int rc = ps_theory_check_grad(o, &r, err);
    if (r.n_params) {
        ps_say(po, "gradient check: %lld parameters, max |exact - finite difference| / max |gradient| = %.2e (gate logits), "
               "%.2e (log lambda, log mu)\n",
               (long long)r.n_params, r.gates, r.temperatures);
        ps_say(po, "phase sum vs every position: loss %.2e, gradient %.2e (relative)\n", r.phase_loss, r.phase_grad);
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

int ps_theory_command(const ps_args *a, const ps_theory_opts *opts, int check_only, ps_error *err) {
    ps_theory_opts o = *opts;
    ps_out po = {.sink = a->sink}; /* a library call prints nothing */
    if (check_only) return check_grad(&po, &o, err);

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
    rec.bar.silent = a->sink != NULL;
    int bad = ps_theory_train(&t, &o, on_record, &rec, &loss, &acc, err);
    ps_progress_end(&rec.bar);
    if (bad) goto done;
    /* per head: final peaks and effective offsets; which phases are answered (key r, value r + 1) */
    ps_theory_summarise(&t, s);
    ps_say(&po, "%-5s %-9s %-9s %-10s %-10s %s\n", "head", "key peak", "val peak", "N_key", "N_value", "value = key + 1");
    for (int64_t h = 0; h < o.H; h++) {
        const ps_theory_head *e = &s->head[h];
        ps_say(&po, "%-5lld %-9lld %-9lld %-10.4f %-10.4f %s\n", (long long)h, (long long)e->key_peak, (long long)e->value_peak,
               e->N_key, e->N_value, e->aligned ? "yes" : "no");
    }
    res = result_json(a, &o, &rec, s);
    int64_t S = o.S;
    ps_say(&po, "%lld of %lld heads have their value peak one offset after their key peak; %lld of %lld one-hot (N_key, N_value "
           "<= %.2f)\n"
           "phases answered (key r, value r + 1): %lld of the %lld a head can answer (0 .. %lld); final loss %.4f, accuracy %.3f, "
           "lambda %.3f, mu %.3f\n",
           (long long)s->aligned, (long long)o.H, (long long)s->one_hot, (long long)o.H, PS_THEORY_ONE_HOT_N,
           (long long)s->n_covered, (long long)ps_theory_coverable(S), (long long)(ps_theory_coverable(S) - 1), loss, acc,
           exp(t.log_lam), exp(t.log_mu));
    const char *out = ps_args_get(a, "--out");
    if (!out) out = "out/theory";
    char path[4200];
    if (a->sink) { /* a library call: the text the file would hold */
        if (ps_result_keep(a->sink, "theory.json", res, JSON_REAL_PRECISION(8), err)) goto done;
        rc = 0;
        goto done;
    }
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
