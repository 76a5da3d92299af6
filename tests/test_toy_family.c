/* test_toy_family.c — the "add a model family" recipe (docs/design.md) proven on a third family defined
 * here: a bigram-table model (next-token logits = a row of a [V, V] table, one hook point per layer:
 * blocks.{L}.hook_row, the rows [B, T, V] that are the logits). It is opened through core's family table
 * (ps_runtime_open_family) — its evaluation is its family `score`, its one knockout target (mean replacement
 * of the rows) is data in its table (ko_targets, ko_arrays) — and run through the shipped code paths: the
 * sweep's work units (ps_sweep_units) and a knockout (ps_knockout_run: the one mean-replacement spec,
 * interventions/ko_spec.c, on the grid engine's naive path). Both are
 * checked against the same numbers computed by plain loops over the table. Then the same through the public
 * API: ps_api_open_in with the caller's family list, sweep and knockout as ps_api_instrument calls, and the
 * family served (ps_api_serve_start_in, port 0): one completion over loopback, its greedy tokens and
 * log-probabilities against the table's log-softmax. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "check.h"
#include "core/ops.h"
#include "core/runtime.h"
#include "instruments/command.h"
#include "instruments/commands.h"
#include "interventions/filler_families.h"
#include "interventions/knockout.h"
#include "interventions/units.h"
#include "phasescope.h"
#include "testutil.h"

#include "toy_family.h"

#ifdef PS_TEST_CURL /* the serve check's HTTP client: the tests' one (tests/serve_http.h, built when libcurl is found) */
#include "serve_http.h"
#endif

/* ---- the checks: plain loops over the table ---- */

static ps_task toy_task(void) {
    ps_task t = {.kind = PS_TASK_KV, .seq_len = 36, .n_keys = 6, .n_values = 6, .n_fillers = 3, .n_pairs = 3,
                 .key_len = 1, .value_len = 2, .gap_min = 0, .gap_max = 3, .query_gap = 4, .n_queries = 2};
    return t;
}

/* the outcomes of shift p's prompts from logits made here: rows of the table, or (mean = 1) the rows'
 * mean over the shift's prompts at each position (summed in double, as the knockout's sum action) */
static void expected(const ps_shifted *s, int mean, int *ok, double *lp) {
    int64_t N = s->b.B, T = s->b.T;
    float *lg = malloc((size_t)(N * T * TOY_V) * sizeof(float));
    for (int64_t t = 0; t < T; t++)
        for (int64_t v = 0; v < TOY_V; v++) {
            double acc = 0;
            for (int64_t i = 0; i < N; i++) acc += toy_weight(s->b.tokens[i * T + t], v);
            for (int64_t i = 0; i < N; i++)
                lg[(i * T + t) * TOY_V + v] = mean ? (float)(acc / (double)N) : toy_weight(s->b.tokens[i * T + t], v);
        }
    ps_score_queries(&s->b, lg, TOY_V, ok, lp);
    free(lg);
}

static void test_toy(void) {
    enum { N = 10, P = 4, BATCH = 3 };
    ps_error err = {0};
    ps_runtime rt;
    ps_runtime_opts o = {.backend = "cpu", .weights = 1};
    REQUIRE_OK(ps_runtime_open_family(&rt, &ps_toy_family, "toy", &o, &err), &err);
    char lab[128];
    CHECK(!strcmp(ps_runtime_label(&rt, lab, sizeof lab), "bigram table, vocab 24"), "the toy's label: \"%s\"", lab);
    CHECK(ps_runtime_default_period(&rt) == 4, "the toy's default period");
    ps_task t = toy_task();
    ps_batch base;
    REQUIRE_OK(ps_batch_alloc(&base, N, t.seq_len, t.n_queries, &err), &err);
    CHECK(ps_task_generate(&t, 3, &base, NULL) == 0, "task generation");
    ps_filler_family fam = {.name = "repeat", .n_pattern = 1, .pattern = {0}};
    /* the expected clean and knocked-out statistics, shift by shift */
    ps_residue_stats want, want_ko;
    REQUIRE_OK(ps_residue_stats_init(&want, P, &err), &err);
    REQUIRE_OK(ps_residue_stats_init(&want_ko, P, &err), &err);
    int *ok = malloc((size_t)(N * t.n_queries) * sizeof(int));
    double *lp = malloc((size_t)(N * t.n_queries) * sizeof(double));
    for (int64_t p = 0; p < P; p++) {
        ps_shifted s;
        REQUIRE_OK(ps_make_shifted(&base, &t, &fam, PS_SWEEP_PAD, P, p, 0, rt.max_pos, &s, &err), &err);
        expected(&s, 0, ok, lp);
        ps_residue_stats_add(&want, &s, ok, lp);
        expected(&s, 1, ok, lp);
        ps_residue_stats_add(&want_ko, &s, ok, lp);
        ps_shifted_free(&s);
    }
    /* the sweep: its work units in two slices on the toy runtime */
    int64_t nu = P * ps_sweep_n_batches(N, BATCH), n = P * N * base.max_q;
    int32_t *uok = calloc((size_t)n, 4), *rho = calloc((size_t)n, 4);
    double *ulp = calloc((size_t)n, 8);
    CHECK_OK(ps_sweep_units(&rt, &base, &t, &fam, PS_SWEEP_PAD, P, 0, BATCH, 0, nu / 2, uok, ulp, rho, NULL, NULL, &err), &err);
    CHECK_OK(ps_sweep_units(&rt, &base, &t, &fam, PS_SWEEP_PAD, P, 0, BATCH, nu / 2, nu, uok, ulp, rho, NULL, NULL, &err), &err);
    ps_residue_stats got;
    REQUIRE_OK(ps_residue_stats_init(&got, P, &err), &err);
    ps_residue_stats_add_items(&got, uok, ulp, rho, n);
    int same = 1;
    for (int64_t r = 0; r < P; r++) {
        same &= got.n[r] == want.n[r] && got.k[r] == want.k[r] && fabs(got.lp[r] - want.lp[r]) <= 1e-9 * fabs(want.lp[r]);
    }
    CHECK(same && want.n[0] > 0, "toy sweep = the table's plain-loop outcomes per residue");
    /* the knockout of layer 0's rows (a per-layer target: one cell) through the grid engine */
    int layers[] = {0};
    ps_knockout_spec k = {.rt = &rt, .base = &base, .task = &t, .fam = &fam, .P = P, .batch = BATCH, .layers = layers,
                          .n_layers = 1, .target = 0};
    ps_knockout_result res;
    REQUIRE_OK(ps_knockout_run(&k, &res, &err), &err);
    int same_clean = 1, same_cell = 1, moved = 0;
    for (int64_t r = 0; r < P; r++) {
        same_clean &= res.clean.n[r] == want.n[r] && res.clean.k[r] == want.k[r] && fabs(res.clean.lp[r] - want.lp[r]) <= 1e-9 * fabs(want.lp[r]);
        same_cell &= res.cells[0].n[r] == want_ko.n[r] && res.cells[0].k[r] == want_ko.k[r] &&
                     fabs(res.cells[0].lp[r] - want_ko.lp[r]) <= 1e-6 * fabs(want_ko.lp[r]);
        moved |= fabs(want_ko.lp[r] - want.lp[r]) > 1e-3;
    }
    CHECK(same_clean, "toy knockout: the clean run = the plain loop");
    CHECK(same_cell, "toy knockout: the cell (rows replaced by their mean over the shift's prompts) = the plain loop");
    CHECK(moved, "the knockout changes the outcomes (the check can tell them apart)");
    /* a bad hook name is the family's error */
    ps_hooks h;
    ps_hooks_init(&h);
    ps_hook_action act = {.kind = PS_ACT_ZERO, .head = -1};
    CHECK_ERR(rt.family->hook_add_action(&rt, &h, "blocks.1.hook_row", &act, &err), &err, "not a hook of the toy bigram model");
    ps_hooks_free(&h);
    /* what its table lacks (no backward, no gate data) is refused by name, not run */
    ps_knockout_result none;
    k.opts.atp = 1;
    CHECK_ERR(ps_knockout_run(&k, &none, &err), &err, "--method atp", "no backward pass");
    ps_gate_info gi;
    CHECK_ERR(ps_gate_info_of(&rt, &gi, &err), &err, "no gate statistics", "gates entries");
    ps_knockout_result_free(&res);
    ps_residue_stats_free(&got);
    ps_residue_stats_free(&want);
    ps_residue_stats_free(&want_ko);
    free(uok), free(rho), free(ulp), free(ok), free(lp);
    ps_batch_free(&base);
    ps_runtime_free(&rt);
}

/* ---- the same family through the public API: ps_api_open_in with the caller's family list, then the
 * instruments as one call each on that handle (ps_api_instrument), checked against the plain loops ---- */

/* the array `name` of result r at index i (NaN when absent) */
static double res_at(const ps_api_result *r, const char *name, int64_t i) {
    int k = ps_api_result_find(r, name);
    return k < 0 ? NAN : ps_api_result_data(r, k)[i];
}

/* a curve of the result (prefix "curve" or "grid.clean": per residue n, correct, mean_logprob; or a cell of
 * "grid.cells": cell c) equals the plain loops' statistics want */
static int same_curve(const ps_api_result *r, const char *prefix, int64_t c, int64_t P, const ps_residue_stats *want) {
    char n[128], k[128], lp[128];
    snprintf(n, sizeof n, "%s.residues.n", prefix);
    snprintf(k, sizeof k, "%s.residues.correct", prefix);
    snprintf(lp, sizeof lp, "%s.residues.mean_logprob", prefix);
    int same = 1;
    for (int64_t rho = 0; rho < P; rho++) {
        double wl = want->n[rho] ? want->lp[rho] / (double)want->n[rho] : 0.0, gl = res_at(r, lp, c * P + rho);
        same &= res_at(r, n, c * P + rho) == (double)want->n[rho] && res_at(r, k, c * P + rho) == (double)want->k[rho] &&
                fabs(gl - wl) <= 1e-8 * fabs(wl) + 1e-12;
        if (!same) {
            fprintf(stderr, "  %s residue %lld: n %g/%lld correct %g/%lld mean_logprob %.12g/%.12g\n", prefix, (long long)rho,
                    res_at(r, n, c * P + rho), (long long)want->n[rho], res_at(r, k, c * P + rho), (long long)want->k[rho], gl, wl);
            break;
        }
    }
    return same;
}

/* ---- the same family served through the API: ps_api_serve_start_in with the caller's family list (port 0),
 * one completion over loopback, its greedy tokens and log-probabilities against the table ---- */

/* the API's serve options and `phasescope serve`'s flags are one set: every table entry is a flag of the
 * command, and every flag of the command is an entry, but the checkpoint, the device and the port file (the
 * call's path and device; the CLI's own) */
static void check_serve_options(void) {
    int n = 0, same = 1;
    for (const ps_serve_option *p = ps_serve_options; p->key; p++, n++) {
        int found = 0;
        for (const ps_flag_spec *f = ps_cmd_serve.flags; f->name; f++) found |= !strcmp(f->name, p->flag);
        char key[64];
        snprintf(key, sizeof key, "%s", p->flag + 2);
        for (char *c = key; *c; c++)
            if (*c == '-') *c = '_';
        same &= found && !strcmp(key, p->key) && ps_serve_option_find(p->key) == p && ps_serve_option_find(p->flag + 2) == p;
        CHECK(found, "serve option %s is not a flag of phasescope serve", p->key);
    }
    for (const ps_flag_spec *f = ps_cmd_serve.flags; f->name; f++) {
        static const char *const own[] = {"--model", "--port-file", "--backend", "--device", "--precision"};
        int mine = 0;
        for (size_t i = 0; i < sizeof own / sizeof own[0]; i++) mine |= !strcmp(f->name, own[i]);
        int in_table = 0;
        for (const ps_serve_option *p = ps_serve_options; p->key; p++) in_table |= !strcmp(f->name, p->flag);
        CHECK(mine || in_table || n == 0, "flag %s of phasescope serve is not a serve option of the API", f->name);
    }
#ifdef PS_HAVE_SERVE
    CHECK(same && n == 11, "the serve options table: %d entries (host, port, tokenizer, name and 7 limits), keys = flags", n);
#else
    CHECK(n == 0, "without serve the options table is empty");
#endif
}

static void test_serve(const char *dir) {
    char err[1024];
    check_serve_options();
    ps_api_server *s = NULL;
    int rc = ps_api_serve_start_in(toy_family_list(), dir, "cpu", "{\"port\": 0, \"name\": \"toy\", \"max_batch\": 4}", &s, err,
                                   sizeof err);
#ifndef PS_HAVE_SERVE
    CHECK(rc == PS_API_EFAIL && !s && strstr(err, "libmicrohttpd"), "a build without serve says so: rc %d, \"%s\"", rc, err);
    return;
#endif
    if (rc) {
        CHECK(0, "serve the toy through ps_api_serve_start_in: %s", err);
        return;
    }
    CHECK(ps_api_serve_port(s) > 0 && !strcmp(ps_api_serve_name(s), "toy"), "the toy's server: port %d, name %s", ps_api_serve_port(s),
          ps_api_serve_name(s));
#ifdef PS_TEST_CURL
    /* a prompt whose greedy continuation is unambiguous for two tokens */
    int last = -1, g1 = -1, g2 = -1;
    CHECK(!toy_greedy_pair(&last, &g1, &g2), "a toy prompt with an unambiguous greedy continuation");
    char body[256];
    snprintf(body, sizeof body,
             "{\"model\": \"toy\", \"prompt\": [3, 5, %d], \"max_tokens\": 2, \"temperature\": 0, \"logprobs\": 1, "
             "\"return_tokens_as_token_ids\": true}",
             last);
    json_t *r = NULL;
    long st = tu_http(ps_api_serve_port(s), "POST", "/v1/completions", body, &r);
    json_t *lo = json_object_get(json_array_get(json_object_get(r, "choices"), 0), "logprobs");
    json_t *tk = json_object_get(lo, "tokens"), *tl = json_object_get(lo, "token_logprobs");
    const char *t1 = json_string_value(json_array_get(tk, 0)), *t2 = json_string_value(json_array_get(tk, 1));
    char w1[32], w2[32];
    snprintf(w1, sizeof w1, "token_id:%d", g1);
    snprintf(w2, sizeof w2, "token_id:%d", g2);
    CHECK(st == 200 && json_array_size(tk) == 2 && t1 && t2 && !strcmp(t1, w1) && !strcmp(t2, w2),
          "the toy served through the API: greedy tokens %s %s, want %s %s (status %ld)", t1 ? t1 : "?", t2 ? t2 : "?", w1, w2, st);
    double l1 = json_number_value(json_array_get(tl, 0)), l2 = json_number_value(json_array_get(tl, 1));
    CHECK(fabs(l1 - toy_logprob(last, g1)) < 1e-5 && fabs(l2 - toy_logprob(g1, g2)) < 1e-5,
          "the toy served through the API: token log-probs %.7f %.7f, the table's log-softmax %.7f %.7f", l1, l2, toy_logprob(last, g1),
          toy_logprob(g1, g2));
    json_decref(r);
#endif
    ps_api_serve_stop(s);
    /* a refused option names the key and starts nothing */
    rc = ps_api_serve_start_in(toy_family_list(), dir, "cpu", "{\"max_batch\": 0}", &s, err, sizeof err);
    CHECK(rc == PS_API_EINPUT && !s && strstr(err, "\"max_batch\""), "max_batch 0: rc %d, \"%s\"", rc, err);
}

static void test_api(void) {
    enum { N = 10, P = 4 };
    ps_error err = {0};
    char dir[512], path[600];
    tu_tempdir(dir, sizeof dir, "toy_api");
    /* the checkpoint: its config, and its prompts' task (a family whose checkpoints carry none: task_file) */
    ps_task t = toy_task();
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    if (!f) {
        CHECK(0, "cannot write %s", path);
        return;
    }
    fputs("{\"model_type\": \"toy_bigram\"}\n", f);
    fclose(f);
    snprintf(path, sizeof path, "%s/phasescope_task.json", dir);
    json_t *tj = ps_task_to_json(&t);
    CHECK(json_dump_file(tj, path, 0) == 0, "write %s", path);
    json_decref(tj);
    /* the shipped list does not know the toy; the caller's list does */
    ps_api_model *m = NULL;
    CHECK(ps_api_open_in(NULL, dir, "cpu", NULL, &m, err.msg, sizeof err.msg) != 0 && !m, "the shipped families do not open the toy");
    int opens = toy_opens;
    REQUIRE_OK(ps_api_open_in(toy_family_list(), dir, "cpu", NULL, &m, err.msg, sizeof err.msg), &err);
    CHECK(!strcmp(ps_api_family(m), "toy_bigram") && ps_api_n_layers(m) == 1 && ps_api_vocab_size(m) == TOY_V,
          "the toy through the API: family %s, %lld layers, vocab %lld", ps_api_family(m), (long long)ps_api_n_layers(m),
          (long long)ps_api_vocab_size(m));
    CHECK(ps_api_shipped_families()[2] && ps_api_shipped_families()[3] == NULL, "three shipped families (DeepSeek-V4, MiniCPM4, the controlled model)");
    /* a run with the cache: the logits and the hook point are the table's rows */
    int32_t tok[6] = {3, 5, 7, 0, 23, 11};
    const char *names[] = {"blocks.0.hook_row"};
    ps_api_output *o = NULL;
    if (ps_api_run_with_cache(m, tok, 2, 3, names, 1, NULL, NULL, NULL, 0, NULL, &o, err.msg, sizeof err.msg)) CHECK(0, "run_with_cache: %s", err.msg);
    else {
        int64_t sh[3];
        const float *lg = ps_api_output_logits(o, sh), *row = ps_api_output_data(o, 0);
        int same = sh[0] == 2 && sh[1] == 3 && sh[2] == TOY_V && ps_api_output_count(o) == 1;
        for (int i = 0; same && i < 6; i++)
            for (int v = 0; v < TOY_V; v++) same &= lg[i * TOY_V + v] == toy_weight(tok[i], v) && row[i * TOY_V + v] == toy_weight(tok[i], v);
        CHECK(same, "the toy's logits and blocks.0.hook_row through ps_api_run_with_cache = the table");
        ps_api_output_free(o);
    }
    /* what the instruments compute, by plain loops: the prompts the instruments make (ps_instr_setup: seed 0,
     * the task generated with seed ^ 0xe7a1, the first filler family of data/fillers.json) */
    ps_filler_family *fams = NULL;
    const ps_filler_family *fam;
    int n_fams;
    REQUIRE_OK(ps_fillers_load(PS_SOURCE_DIR "/data/fillers.json", &fams, &n_fams, &err) || ps_fillers_find(fams, n_fams, NULL, &fam, &err), &err);
    ps_batch base;
    REQUIRE_OK(ps_batch_alloc(&base, N, t.seq_len, t.n_queries, &err), &err);
    REQUIRE_OK(ps_task_generate(&t, 0 ^ 0xe7a1ULL, &base, &err), &err);
    ps_residue_stats want, want_ko;
    REQUIRE_OK(ps_residue_stats_init(&want, P, &err) || ps_residue_stats_init(&want_ko, P, &err), &err);
    int *ok = malloc((size_t)(N * t.n_queries) * sizeof(int));
    double *lp = malloc((size_t)(N * t.n_queries) * sizeof(double));
    for (int64_t p = 0; p < P; p++) {
        ps_shifted s;
        REQUIRE_OK(ps_make_shifted(&base, &t, fam, PS_SWEEP_PAD, P, p, 0, TOY_MAX_POS, &s, &err), &err);
        expected(&s, 0, ok, lp);
        ps_residue_stats_add(&want, &s, ok, lp);
        expected(&s, 1, ok, lp);
        ps_residue_stats_add(&want_ko, &s, ok, lp);
        ps_shifted_free(&s);
    }
    /* sweep and knockout as one call each on the handle: no second open of the checkpoint */
    char out[700];
    snprintf(out, sizeof out, "%s/sweep", dir);
    char req[1024];
    snprintf(req, sizeof req, "{\"n\": %d, \"period\": %d, \"batch\": 3, \"out\": \"%s\"}", N, P, out);
    ps_api_result *r = NULL;
    if (ps_api_instrument(m, "sweep", req, &r, err.msg, sizeof err.msg)) CHECK(0, "sweep on the toy through the API: %s", err.msg);
    else {
        CHECK(same_curve(r, "curve", 0, P, &want), "the toy's sweep through ps_api_instrument = the plain loops, per residue");
        json_t *doc = json_loads(ps_api_result_json(r), 0, NULL), *prov = json_object_get(doc, "provenance");
        const char *lab = json_string_value(json_object_get(prov, "label")), *kind = json_string_value(json_object_get(prov, "kind"));
        CHECK(lab && kind && !strcmp(lab, "bigram table, vocab 24") && !strcmp(kind, "bigram"), "the sweep's provenance: label %s, kind %s",
              lab ? lab : "(none)", kind ? kind : "(none)");
        const char *figs = ps_api_result_figures_json(r, err.msg, sizeof err.msg);
        CHECK(figs && strstr(figs, ".png") != NULL, "the sweep's figure is drawn from the result (figures %s)", figs ? figs : err.msg);
        json_decref(doc);
        ps_api_result_free(r);
    }
    snprintf(out, sizeof out, "%s/knockout", dir);
    snprintf(req, sizeof req, "{\"n\": %d, \"period\": %d, \"batch\": 3, \"layers\": [0], \"out\": \"%s\"}", N, P, out);
    if (ps_api_instrument(m, "knockout", req, &r, err.msg, sizeof err.msg)) CHECK(0, "knockout on the toy through the API: %s", err.msg);
    else {
        CHECK(same_curve(r, "grid.clean", 0, P, &want), "the toy's knockout through ps_api_instrument: the clean curve = the plain loops");
        /* the one cell (layer 0's rows replaced by their mean over the shift's prompts): n, accuracy, mean NLL */
        int same = res_at(r, "grid.cells.layer", 0) == 0 && ps_api_result_find(r, "grid.cells.residues.n") >= 0;
        for (int64_t rho = 0; same && rho < P; rho++) {
            double n = (double)want_ko.n[rho], acc = n ? (double)want_ko.k[rho] / n : 0, nll = n ? -want_ko.lp[rho] / n : 0;
            double gn = res_at(r, "grid.cells.residues.n", rho), ga = res_at(r, "grid.cells.residues.accuracy", rho),
                   gl = res_at(r, "grid.cells.residues.mean_nll", rho);
            same &= gn == n && fabs(ga - acc) <= 1e-9 && fabs(gl - nll) <= 1e-6 * fabs(nll);
            if (!same) fprintf(stderr, "  cell residue %lld: n %g/%g accuracy %g/%g mean_nll %.10g/%.10g\n", (long long)rho, gn, n, ga, acc, gl, nll);
        }
        CHECK(same, "the toy's knockout through ps_api_instrument: the cell = the plain loops (rows replaced by their mean)");
        const char *figs = ps_api_result_figures_json(r, err.msg, sizeof err.msg);
        CHECK(figs && strstr(figs, ".png") != NULL, "the knockout's figure is drawn from the result (figures %s)", figs ? figs : err.msg);
        ps_api_result_free(r);
    }
    /* a refused request names the flag and leaves the handle as it was: the same rows after it */
    int rc = ps_api_instrument(m, "knockout", "{\"n\": 4, \"layers\": [3]}", &r, err.msg, sizeof err.msg);
    CHECK(rc == PS_API_EINPUT && strstr(err.msg, "--layers"), "a layer the toy lacks: rc %d, \"%s\"", rc, err.msg);
    if (!ps_api_run_with_hooks(m, tok, 1, 6, NULL, &o, err.msg, sizeof err.msg)) {
        int64_t sh[3];
        const float *lg = ps_api_output_logits(o, sh);
        int same = 1;
        for (int i = 0; i < 6; i++)
            for (int v = 0; v < TOY_V; v++) same &= lg[i * TOY_V + v] == toy_weight(tok[i], v);
        CHECK(same, "the handle after the instruments: the table's rows");
        ps_api_output_free(o);
    } else
        CHECK(0, "run after the instruments: %s", err.msg);
    CHECK(toy_opens == opens + 1, "the instruments ran on the open handle (%d opens of the toy, want 1)", toy_opens - opens);
    /* generation through the family's own KV cache (its table's kvcache): greedy tokens and log-probs are the
     * table's, two prompts of different lengths in one call */
    {
        int last = -1, g1 = -1, g2 = -1;
        CHECK(!toy_greedy_pair(&last, &g1, &g2), "a toy prompt with an unambiguous greedy continuation");
        int32_t prompts[5] = {3, 5, last, 9, last};
        int64_t lens[2] = {3, 2}, n_gen[2] = {0, 0};
        int32_t out[4];
        double lps[4];
        int rc = ps_api_generate(m, prompts, lens, 2, 2, NULL, NULL, out, lps, n_gen, err.msg, sizeof err.msg);
        CHECK(rc == 0 && n_gen[0] == 2 && n_gen[1] == 2 && out[0] == g1 && out[1] == g2 && out[2] == g1 && out[3] == g2,
              "the toy generates through its cache: rc %d (%s), tokens %d %d / %d %d, want %d %d", rc, rc ? err.msg : "", out[0], out[1],
              out[2], out[3], g1, g2);
        CHECK(rc == 0 && fabs(lps[0] - toy_logprob(last, g1)) < 1e-5 && fabs(lps[1] - toy_logprob(g1, g2)) < 1e-5 &&
                  fabs(lps[3] - toy_logprob(g1, g2)) < 1e-5,
              "the toy's generated log-probs = the table's log-softmax (%.7f %.7f, want %.7f %.7f)", lps[0], lps[1], toy_logprob(last, g1),
              toy_logprob(g1, g2));
        rc = ps_api_generate(m, prompts, lens, 1, 1, "{\"edits\": [\"blocks.0.attn.cache_ck:0:0:zero\"]}", NULL, out, lps, n_gen, err.msg,
                             sizeof err.msg);
        CHECK(rc != 0 && strstr(err.msg, "no cache points"), "an edit of the toy's cache (which has no entries) is refused: %s", err.msg);
    }
    test_serve(dir);
    free(ok), free(lp), free(fams);
    ps_batch_free(&base);
    ps_residue_stats_free(&want);
    ps_residue_stats_free(&want_ko);
    ps_api_close(m);
}

int main(void) {
#ifdef PS_TEST_CURL
    curl_global_init(CURL_GLOBAL_DEFAULT);
#endif
    test_toy();
    test_api();
    CHECK_DONE();
}
