/* test_results_check.c — the result-JSON validator (viz/results_check.c): every result the real commands
 * write passes it (each kind, produced here by the build's own phasescope on the shipped demo models), and
 * near-valid mutations of them are refused with one line naming the file and the first field at fault.
 *   test_results_check BUILD_DIR */
#define _POSIX_C_SOURCE 200809L
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "viz/kinds.h"
#include "viz/results_check.h"
#include "interventions/stats.h"

static char PS[4096], TMP[256];

/* run a phasescope command quietly; 0 on success */
static int ps_run_q(const char *args, int quiet) {
    char cmd[16384];
    snprintf(cmd, sizeof cmd, "cd '%s' && OMP_NUM_THREADS=1 '%s' %s > /dev/null 2> '%s/stderr.txt'", PS_SOURCE_DIR, PS, args, TMP);
    int rc = system(cmd);
    if (rc && !quiet) {
        char p[512];
        snprintf(p, sizeof p, "%s/stderr.txt", TMP);
        FILE *f = fopen(p, "r");
        char line[2048] = "";
        if (f && fgets(line, sizeof line, f)) fprintf(stderr, "  %s: %s", args, line);
        if (f) fclose(f);
    }
    return rc;
}
static int ps_run(const char *args) { return ps_run_q(args, 0); }

static const char *out(const char *rel) {
    static char buf[8][1024];
    static int k;
    k = (k + 1) % 8;
    snprintf(buf[k], sizeof buf[k], "%s/%s", TMP, rel);
    return buf[k];
}

/* check a document held in memory as if it were the file r.json */
static int chk(json_t *doc, ps_error *err) { return ps_results_check(doc, "r.json", err); }

static json_t *load_ok(const char *path) {
    ps_error err = {0};
    json_t *d = NULL;
    CHECK(ps_results_load(path, NULL, &d, &err) == 0, "%s", err.msg);
    return d;
}

#define RES(doc, curve, i) json_array_get(json_object_get(json_object_get((doc), (curve)), "residues"), (i))

/* ---- every kind the commands write passes ---- */

static const char *const RESULTS[] = {
    "sweep/w8s8/sweep.json",  "sweep/full24/sweep.json", "sweep/move/sweep.json",  "sweep/w4s4_random/sweep.json",
    "knockout/full/knockout.json", "knockout/w8s8/knockout.json", "knockout/both/knockout.json",
    "gates/w8s8/gates.json",  "gates/nolog/gates.json",  "gatecycle/all/gatecycle.json", "gatecycle/key/gatecycle.json",
    "gatecycle/heads/gatecycle.json", "theory/theory.json", "knockout/atp/knockout.json", "atp_compare/atp_compare.json",
};

static void test_real_results(void) {
    char a[4096];
    const char *M = "data/models";
    const char *cmds[] = {
        "sweep --model %s/w8s8 --n 4 --out %s/sweep/w8s8",
        "sweep --model %s/full --n 4 --period 24 --out %s/sweep/full24",
        "sweep --model %s/w8s8 --n 4 --mode move --out %s/sweep/move",
        "sweep --model %s/w4s4 --n 4 --family random --seed 3 --out %s/sweep/w4s4_random",
        "knockout --model %s/full --n 4 --target raw --heads 0,1 --out %s/knockout/full",
        "knockout --model %s/w8s8 --n 4 --out %s/knockout/w8s8",
        "knockout --model %s/w8s8 --n 4 --target both --heads 0,3 --out %s/knockout/both",
        "gates --model %s/w8s8 --n 4 --log data/models/w8s8/train.jsonl --out %s/gates/w8s8",
        "gates --model %s/w4s4 --n 4 --out %s/gates/nolog",
        "gatecycle --model %s/w8s8 --layer 0 --shift 2 --params all --n 4 --out %s/gatecycle/all",
        "gatecycle --model %s/w8s8 --layer 0 --shift -3 --head 1 --branch key --params gate --n 4 --out %s/gatecycle/key",
        "gatecycle --model %s/w8s8 --layer 0 --shift 2 --measure knockout --n 8 --out %s/gatecycle/heads",
        "knockout --model %s/w8s8 --n 4 --method atp --verify 2 --out %s/knockout/atp",
    };
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        snprintf(a, sizeof a, cmds[i], M, TMP);
        CHECK(ps_run(a) == 0, "phasescope %s failed", a);
    }
    snprintf(a, sizeof a, "atp-compare %s %s --out %s/atp_compare", out("knockout/w8s8/knockout.json"), out("knockout/atp/knockout.json"), TMP);
    CHECK(ps_run(a) == 0, "phasescope %s failed", a);
    snprintf(a, sizeof a, "theory --steps 200 --heads 2 --window 4 --chunks 4 --vocab 32 --batch 32 --out %s/theory", TMP);
    CHECK(ps_run(a) == 0, "phasescope %s failed", a);
    for (size_t i = 0; i < sizeof RESULTS / sizeof RESULTS[0]; i++) {
        json_t *d = load_ok(out(RESULTS[i]));
        json_decref(d);
        /* and render accepts each (validator, then the figure) */
        snprintf(a, sizeof a, "render %s --out %s/render", out(RESULTS[i]), TMP);
        CHECK(ps_run(a) == 0, "phasescope %s failed", a);
    }
    /* several at once: the sweeps of one period share a figure, knockout grids sit side by side */
    snprintf(a, sizeof a, "render %s %s --out %s/render", out("sweep/w8s8/sweep.json"), out("sweep/move/sweep.json"), TMP);
    CHECK(ps_run(a) == 0, "phasescope %s failed", a);
    snprintf(a, sizeof a, "render %s %s %s --out %s/render", out("knockout/full/knockout.json"), out("knockout/w8s8/knockout.json"),
             out("knockout/both/knockout.json"), TMP);
    CHECK(ps_run(a) == 0, "phasescope %s failed", a);
    snprintf(a, sizeof a, "table %s %s %s %s", out("sweep/w8s8/sweep.json"), out("sweep/full24/sweep.json"), out("sweep/move/sweep.json"),
             out("sweep/w4s4_random/sweep.json"));
    CHECK(ps_run(a) == 0, "phasescope %s failed", a);
    /* the seeds shipped with the render fuzzer that are valid results */
    const char *seeds[] = {"sweep.json", "knockout.json", "gatecycle.json", "gates.json"};
    for (int i = 0; i < 4; i++) {
        snprintf(a, sizeof a, "%s/tests/fuzz/corpus/render/%s", PS_SOURCE_DIR, seeds[i]);
        json_decref(load_ok(a));
    }
}

/* ---- sweep: the cases and the consistency rules ---- */

static void test_sweep(void) {
    ps_error err = {0};
    json_t *base = load_ok(out("sweep/w8s8/sweep.json")), *d;
    if (!base) return;
    int64_t n0 = json_integer_value(json_object_get(RES(base, "curve", 0), "n"));
    char want[256];

    /* {"kind": "sweep"}: nothing measured */
    d = json_pack("{s:s}", "kind", "sweep");
    CHECK_ERR(chk(d, &err), &err, "r.json: provenance: missing");
    json_decref(d);
    d = json_deep_copy(base);
    json_object_del(d, "curve");
    CHECK_ERR(chk(d, &err), &err, "r.json: curve: missing");
    json_decref(d);
    /* curve "x", provenance a number */
    d = json_deep_copy(base);
    json_object_set_new(d, "curve", json_string("x"));
    CHECK_ERR(chk(d, &err), &err, "r.json: curve: expected an object, got a string");
    json_object_set_new(d, "provenance", json_integer(3));
    CHECK_ERR(chk(d, &err), &err, "r.json: provenance: expected an object, got an integer");
    json_decref(d);
    /* correct > n; accuracy 2.0; negative counts; period 10^9 */
    d = json_deep_copy(base);
    json_object_set_new(RES(d, "curve", 3), "correct", json_integer(n0 + 2));
    snprintf(want, sizeof want, "r.json: curve.residues[3].correct: %lld > n = %lld", (long long)n0 + 2, (long long)n0);
    CHECK_ERR(chk(d, &err), &err, want);
    json_decref(d);
    d = json_deep_copy(base);
    json_object_set_new(RES(d, "curve", 2), "accuracy", json_real(2.0));
    CHECK_ERR(chk(d, &err), &err, "r.json: curve.residues[2].accuracy: 2 is out of range [0, 1]");
    json_decref(d);
    d = json_deep_copy(base);
    json_object_set_new(RES(d, "curve", 0), "n", json_integer(-5));
    CHECK_ERR(chk(d, &err), &err, "r.json: curve.residues[0].n: -5 is negative");
    json_decref(d);
    d = json_deep_copy(base);
    json_object_set_new(json_object_get(d, "curve"), "period", json_integer(1000000000));
    CHECK_ERR(chk(d, &err), &err, "r.json: curve.period: 1000000000 is out of range [1, 4096]");
    json_object_set_new(json_object_get(json_object_get(d, "provenance"), "eval"), "period", json_integer(1000000000));
    CHECK_ERR(chk(d, &err), &err, "r.json: provenance.eval.period: 1000000000 is out of range [1, 4096]");
    json_decref(d);
    d = json_deep_copy(base);
    json_object_set_new(json_object_get(d, "curve"), "period", json_integer(7));
    CHECK_ERR(chk(d, &err), &err, "r.json: curve.period: 7, but provenance.eval.period is 8");
    json_decref(d);
    /* accuracy not correct/n */
    d = json_deep_copy(base);
    json_t *e = RES(d, "curve", 1);
    int64_t k1 = json_integer_value(json_object_get(e, "correct"));
    json_object_set_new(e, "correct", json_integer(k1 > 0 ? k1 - 1 : 1));
    CHECK_ERR(chk(d, &err), &err, "r.json: curve.residues[1].accuracy: ", "but correct/n = ");
    json_decref(d);
    /* residues 0..P-1 exactly once, in order */
    d = json_deep_copy(base);
    json_object_set_new(RES(d, "curve", 5), "rho", json_integer(4));
    CHECK_ERR(chk(d, &err), &err, "r.json: curve.residues[5].rho: 4, expected 5 (the residues 0..P-1 = 0..7, each once, in order)");
    json_decref(d);
    d = json_deep_copy(base);
    json_array_remove(json_object_get(json_object_get(d, "curve"), "residues"), 7);
    CHECK_ERR(chk(d, &err), &err, "r.json: curve.residues: 7 entries, expected 8");
    json_decref(d);
    /* summaries recomputed from the counts */
    const char *sums[] = {"mean_accuracy", "min_accuracy", "max_accuracy"};
    for (int i = 0; i < 3; i++) {
        d = json_deep_copy(base);
        json_t *c = json_object_get(d, "curve");
        json_object_set_new(c, sums[i], json_real(fmod(json_number_value(json_object_get(c, sums[i])) + 0.25, 1.0)));
        char w[128];
        snprintf(w, sizeof w, "r.json: curve.%s: ", sums[i]);
        CHECK_ERR(chk(d, &err), &err, w, "but");
        json_decref(d);
    }
    d = json_deep_copy(base);
    json_object_set_new(json_object_get(d, "curve"), "gap_pp", json_real(3.5));
    CHECK_ERR(chk(d, &err), &err, "r.json: curve.gap_pp: 3.5, but max - min accuracy is");
    json_object_set_new(json_object_get(d, "curve"), "n", json_integer(1));
    CHECK_ERR(chk(d, &err), &err, "r.json: curve.n: 1, but the residues' n add up to");
    json_decref(d);
    d = json_deep_copy(base);
    json_object_set_new(json_object_get(json_object_get(d, "curve"), "chi_square"), "p_value", json_real(0.5));
    CHECK_ERR(chk(d, &err), &err, "r.json: curve.chi_square.p_value: 0.5, but the counts give");
    json_decref(d);
    d = json_deep_copy(base);
    json_object_set_new(RES(d, "curve", 0), "wilson_lo", json_real(0));
    CHECK_ERR(chk(d, &err), &err, "r.json: curve.residues[0].wilson_lo: ", "is not the 95% Wilson interval");
    json_decref(d);
    d = json_deep_copy(base);
    json_object_set_new(json_object_get(json_object_get(d, "curve"), "dominant_period"), "period", json_real(3));
    CHECK_ERR(chk(d, &err), &err, "r.json: curve.dominant_period.period: 3, but P / frequency");
    json_decref(d);
    d = json_deep_copy(base);
    json_object_set_new(json_object_get(d, "curve"), "repeat_period", json_pack("{s:i}", "period", 3));
    CHECK_ERR(chk(d, &err), &err, "r.json: curve.repeat_period.period: 3, but folding the residues' accuracies gives");
    json_object_del(json_object_get(d, "curve"), "repeat_period"); /* files written before the field */
    CHECK_OK(chk(d, &err), &err);
    json_decref(d);
    /* wrong types: an integer written as a fraction, a string count */
    d = json_deep_copy(base);
    json_object_set_new(RES(d, "curve", 4), "n", json_real(2.5));
    CHECK_ERR(chk(d, &err), &err, "r.json: curve.residues[4].n: 2.5 is not an integer");
    json_object_set_new(RES(d, "curve", 4), "n", json_string("32"));
    CHECK_ERR(chk(d, &err), &err, "r.json: curve.residues[4].n: expected an integer, got a string");
    json_decref(d);
    /* nothing measured: every n = 0 */
    d = json_deep_copy(base);
    for (size_t r = 0; r < 8; r++) {
        json_t *x = RES(d, "curve", r);
        json_object_set_new(x, "n", json_integer(0));
        json_object_set_new(x, "correct", json_integer(0));
        json_object_set_new(x, "accuracy", json_real(0));
        json_object_set_new(x, "wilson_lo", json_real(0));
        json_object_set_new(x, "wilson_hi", json_real(1));
    }
    json_object_set_new(json_object_get(d, "curve"), "n", json_integer(0));
    CHECK_ERR(chk(d, &err), &err, "r.json: curve.n: 0: nothing was measured (every residue has n = 0)");
    json_decref(d);
    /* provenance and kind */
    d = json_deep_copy(base);
    json_object_set_new(json_object_get(json_object_get(json_object_get(d, "provenance"), "config"), "attention"), "kind",
                        json_string("sparse"));
    CHECK_ERR(chk(d, &err), &err, "r.json: provenance.config.attention.kind: \"sparse\" is not one of deepseek_v4, infllm_v2, full, compressed, channel, v4, select");
    /* a family no shipped table knows (one its user defined): described by the writer's label and kind,
     * which must name the config's kind */
    json_object_set_new(json_object_get(d, "provenance"), "kind", json_string("sparse"));
    CHECK_OK(chk(d, &err), &err);
    json_object_del(json_object_get(d, "provenance"), "label");
    CHECK_ERR(chk(d, &err), &err, "r.json: provenance.config.attention.kind: \"sparse\" is not one of");
    json_decref(d);
    d = json_deep_copy(base);
    json_object_set_new(json_object_get(json_object_get(d, "provenance"), "eval"), "mode", json_string("slide"));
    CHECK_ERR(chk(d, &err), &err, "r.json: provenance.eval.mode: \"slide\" is not one of pad, move");
    json_object_set_new(d, "kind", json_string("sweeps"));
    CHECK_ERR(chk(d, &err), &err, "r.json: kind: \"sweeps\" is not a result kind");
    json_object_set_new(d, "kind", json_integer(1));
    CHECK_ERR(chk(d, &err), &err, "r.json: kind: expected a string, got an integer");
    json_decref(d);
    d = json_array();
    CHECK_ERR(chk(d, &err), &err, "r.json: not a phasescope result file (no \"kind\")");
    json_decref(d);

    /* lenient on additions: unknown keys, a null period (the sweep reports a period only for a significant
     * curve), a null curve period (as many residues as listed), the verdict fields */
    d = json_deep_copy(base);
    json_object_set_new(d, "notes", json_string("added by a later version"));
    json_object_set_new(json_object_get(d, "curve"), "phase_sensitive", json_false());
    json_object_set_new(json_object_get(d, "curve"), "verdict", json_string("no phase dependence detected"));
    json_t *dp = json_object_get(json_object_get(d, "curve"), "dominant_period");
    json_object_set(dp, "candidate_period", json_object_get(dp, "period"));
    json_object_set_new(dp, "period", json_null());
    json_object_set_new(RES(d, "curve", 0), "extra", json_pack("[i,i]", 1, 2));
    CHECK_OK(chk(d, &err), &err);
    json_object_set_new(json_object_get(d, "curve"), "period", json_null());
    CHECK_OK(chk(d, &err), &err);
    json_object_set_new(json_object_get(d, "curve"), "dominant_period", json_null());
    CHECK_OK(chk(d, &err), &err);
    json_decref(d);

    /* table reads sweeps only */
    CHECK_ERR(ps_results_load(out("knockout/full/knockout.json"), "sweep", &d, &err), &err, "knockout.json: kind: \"knockout\", expected \"sweep\"");
    json_decref(base);
}

/* ---- knockout, gatecycle, gates, theory ---- */

static void test_other_kinds(void) {
    ps_error err = {0};
    json_t *ko = load_ok(out("knockout/w8s8/knockout.json")), *gc = load_ok(out("gatecycle/all/gatecycle.json")),
           *ga = load_ok(out("gates/w8s8/gates.json")), *th = load_ok(out("theory/theory.json")), *d;
    if (!ko || !gc || !ga || !th) goto done;
    json_t *cells;
#define CELL(doc, i) json_array_get(json_object_get(json_object_get((doc), "grid"), "cells"), (i))
#define CELLRES(doc, i, r) json_array_get(json_object_get(CELL(doc, i), "residues"), (r))
    d = json_deep_copy(ko);
    json_object_set_new(CELLRES(d, 2, 5), "n", json_integer(1));
    CHECK_ERR(chk(d, &err), &err, "r.json: grid.cells[2].residues[5].n: 1, but grid.clean has n = ");
    json_decref(d);
    d = json_deep_copy(ko);
    json_object_set_new(CELLRES(d, 1, 0), "delta_accuracy_pp", json_real(-50));
    CHECK_ERR(chk(d, &err), &err, "r.json: grid.cells[1].residues[0].delta_accuracy_pp: -50, but accuracy - clean accuracy = ");
    json_decref(d);
    d = json_deep_copy(ko);
    json_object_set_new(CELLRES(d, 1, 0), "delta_nll", json_real(7));
    CHECK_ERR(chk(d, &err), &err, "r.json: grid.cells[1].residues[0].delta_nll: 7, but mean_nll - clean mean NLL = ");
    json_decref(d);
    /* an attribution estimate: accuracies null, the verified count matching the cells' exact blocks */
    json_t *at = load_ok(out("knockout/atp/knockout.json")), *ac = load_ok(out("atp_compare/atp_compare.json"));
    if (at && ac) {
        d = json_deep_copy(at);
        json_object_set_new(CELLRES(d, 0, 1), "accuracy", json_real(0.5));
        CHECK_ERR(chk(d, &err), &err, "r.json: grid.cells[0].residues[1].accuracy: must be null in an attribution estimate");
        json_decref(d);
        d = json_deep_copy(at);
        json_object_set_new(json_object_get(json_object_get(d, "grid"), "atp"), "verified", json_integer(5));
        CHECK_ERR(chk(d, &err), &err, "r.json: grid.atp.verified: 5, but 2 cells carry an exact knockout");
        json_decref(d);
        d = json_deep_copy(at);
        json_object_set_new(json_object_get(json_object_get(d, "grid"), "atp"), "fix", json_string("grad"));
        CHECK_ERR(chk(d, &err), &err, "r.json: grid.atp.fix:");
        json_decref(d);
        d = json_deep_copy(at);
        json_object_set_new(json_object_get(d, "grid"), "method", json_string("fast"));
        CHECK_ERR(chk(d, &err), &err, "r.json: grid.method:");
        json_decref(d);
        d = json_deep_copy(at);
        json_object_set_new(CELLRES(d, 0, 0), "n", json_integer(0));
        CHECK_ERR(chk(d, &err), &err, "r.json: grid.cells[0].residues[0].n: 0, but grid.clean has n = ");
        json_decref(d);
        /* a verified cell's exact block is checked as an exact cell (accuracies required) */
        d = json_deep_copy(at);
        json_t *cs = json_object_get(json_object_get(d, "grid"), "cells");
        for (size_t i = 0; i < json_array_size(cs); i++) {
            json_t *ex = json_object_get(json_array_get(cs, i), "exact");
            if (!json_is_object(ex)) continue;
            json_object_set_new(json_array_get(json_object_get(ex, "residues"), 0), "accuracy", json_null());
            char want[128];
            snprintf(want, sizeof want, "r.json: grid.cells[%zu].exact.residues[0].accuracy: expected", i);
            CHECK_ERR(chk(d, &err), &err, want);
            break;
        }
        json_decref(d);
        d = json_deep_copy(ac);
        json_object_set_new(d, "pearson", json_real(1.5));
        CHECK_ERR(chk(d, &err), &err, "r.json: pearson: 1.5 is out of range");
        json_decref(d);
        d = json_deep_copy(ac);
        json_object_set_new(d, "top_k", json_integer(999));
        if (json_array_size(json_object_get(d, "strong"))) CHECK_ERR(chk(d, &err), &err, "r.json: top_k: 999, but twice the");
        json_decref(d);
        d = json_deep_copy(ac);
        json_array_append_new(json_object_get(json_object_get(d, "grid"), "exact"), json_array());
        CHECK_ERR(chk(d, &err), &err, "r.json: grid.exact:");
        json_decref(d);
    }
    json_decref(at);
    json_decref(ac);
    d = json_deep_copy(ko);
    json_object_set_new(CELL(d, 0), "mean_delta_nll", json_real(12.5));
    CHECK_ERR(chk(d, &err), &err, "r.json: grid.cells[0].mean_delta_nll: 12.5, but the residues' mean is");
    json_decref(d);
    d = json_deep_copy(ko);
    cells = json_object_get(json_object_get(d, "grid"), "cells");
    json_array_append(cells, json_array_get(cells, 1));
    CHECK_ERR(chk(d, &err), &err, "r.json: grid.cells[", "]: layer 0 head 1 again (first at cells[1]); each cell once");
    json_decref(d);
    d = json_deep_copy(ko);
    json_object_set_new(json_object_get(d, "grid"), "target", json_string("rwa"));
    CHECK_ERR(chk(d, &err), &err, "r.json: grid.target: \"rwa\" is not one of raw, compressed, both");
    json_object_set_new(json_object_get(d, "grid"), "cells", json_array());
    json_object_set_new(json_object_get(d, "grid"), "target", json_string("raw"));
    CHECK_ERR(chk(d, &err), &err, "r.json: grid.cells: 0 entries, expected 1 to");
    json_decref(d);
    d = json_deep_copy(ko); /* additions are ignored */
    json_object_set_new(CELL(d, 0), "worst_residue", json_pack("{s:i,s:f}", "rho", 3, "delta_accuracy_pp", -12.5));
    CHECK_OK(chk(d, &err), &err);
    json_decref(d);

    /* gatecycle */
    d = json_deep_copy(gc);
    json_object_set_new(d, "best_shift_signed", json_integer(5));
    CHECK_ERR(chk(d, &err), &err, "r.json: best_shift_signed: 5, but best_shift");
    json_object_set_new(d, "best_shift", json_integer(8));
    CHECK_ERR(chk(d, &err), &err, "r.json: best_shift: 8 is out of range [0, 7]");
    json_decref(d);
    d = json_deep_copy(gc);
    json_object_set_new(json_object_get(d, "cycle"), "branch", json_string("query"));
    CHECK_ERR(chk(d, &err), &err, "r.json: cycle.branch: \"query\" is not one of key, value, both");
    json_object_set_new(json_object_get(d, "cycle"), "head", json_string("some"));
    CHECK_ERR(chk(d, &err), &err, "r.json: cycle.head: \"some\": expected \"all\" or a head number");
    json_decref(d);
    d = json_deep_copy(gc);
    json_object_set_new(RES(d, "after", 6), "correct", json_integer(-1));
    CHECK_ERR(chk(d, &err), &err, "r.json: after.residues[6].correct: -1 is negative");
    json_decref(d);
    d = json_deep_copy(gc); /* additions (cycled heads, per-dip moves) are ignored */
    json_object_set_new(d, "cycled_heads", json_pack("[i,i]", 0, 1));
    json_object_set_new(d, "dip_moves", json_pack("[{s:i,s:i}]", "before", 3, "after", 5));
    CHECK_OK(chk(d, &err), &err);
    json_decref(d);

    /* gatecycle --measure knockout: per_head shifts consistent with the worst residues and K, summary from the heads */
    {
        json_t *gh = load_ok(out("gatecycle/heads/gatecycle.json"));
        json_t *hl = json_object_get(json_object_get(gh, "per_head"), "heads");
        size_t mi = 0;
        while (mi < json_array_size(hl) &&
               strcmp(json_string_value(json_object_get(json_array_get(hl, mi), "status")) ?: "", "measured"))
            mi++;
        CHECK(mi < json_array_size(hl), "no head of the 1-layer W8/S8 measured by the per-head cycle");
        if (mi < json_array_size(hl)) {
            char want[160];
            d = json_deep_copy(gh);
            json_t *e = json_array_get(json_object_get(json_object_get(d, "per_head"), "heads"), mi);
            json_object_set_new(e, "error_worst", json_integer(json_integer_value(json_object_get(e, "error_worst")) + 1));
            snprintf(want, sizeof want, "r.json: per_head.heads[%zu].error_worst: ", mi);
            CHECK_ERR(chk(d, &err), &err, want, "but shift_worst - cycle.shift");
            json_decref(d);
            d = json_deep_copy(gh);
            e = json_array_get(json_object_get(json_object_get(d, "per_head"), "heads"), mi);
            json_object_set_new(e, "status", json_string("lost"));
            snprintf(want, sizeof want, "r.json: per_head.heads[%zu].shift_worst: expected null (the head's status is lost)", mi);
            CHECK_ERR(chk(d, &err), &err, want);
            json_decref(d);
            d = json_deep_copy(gh);
            json_t *sm = json_object_get(json_object_get(d, "per_head"), "summary");
            json_object_set_new(sm, "n_measured", json_integer(json_integer_value(json_object_get(sm, "n_measured")) + 1));
            CHECK_ERR(chk(d, &err), &err, "r.json: per_head.summary.n_measured: ", "but the heads say");
            json_decref(d);
        }
        json_decref(gh);
    }

    /* gates */
    d = json_deep_copy(ga);
    json_t *key0 = json_object_get(json_array_get(json_object_get(json_array_get(json_object_get(json_object_get(d, "gates"), "layers"), 0), "heads"), 0), "key");
    json_array_set_new(json_object_get(key0, "mean_gate"), 0, json_real(0.9));
    CHECK_ERR(chk(d, &err), &err, "r.json: gates.layers[0].heads[0].key.mean_gate: the weights add up to");
    json_array_set_new(json_object_get(key0, "mean_gate"), 0, json_real(-0.5));
    CHECK_ERR(chk(d, &err), &err, "r.json: gates.layers[0].heads[0].key.mean_gate[0]: -0.5 is out of range");
    json_decref(d);
    d = json_deep_copy(ga);
    json_array_remove(json_object_get(json_array_get(json_object_get(json_object_get(d, "gates"), "layers"), 0), "heads"), 0);
    CHECK_ERR(chk(d, &err), &err, "r.json: gates.layers[0].heads[0].head: 1, expected 0 (KV heads 0..H-1 in order)");
    json_decref(d);
    d = json_deep_copy(ga);
    json_object_set_new(json_object_get(d, "gates"), "window", json_integer(5000));
    CHECK_ERR(chk(d, &err), &err, "r.json: gates.window: 5000 is out of range [1, 4096]");
    json_decref(d);
    /* gates.training: what gate_training.png reads */
    d = json_deep_copy(ga);
    json_t *tr0 = json_array_get(json_object_get(d, "training"), 0);
    json_array_set_new(json_object_get(tr0, "N_static"), 0, json_real(9.5));
    CHECK_ERR(chk(d, &err), &err, "r.json: training[0].N_static[0]: 9.5 is out of range");
    json_decref(d);
    d = json_deep_copy(ga);
    json_array_remove(json_object_get(d, "training"), 1);
    CHECK_ERR(chk(d, &err), &err, "r.json: training: 31 entries, expected 32");
    json_decref(d);
    d = json_deep_copy(ga);
    json_object_set_new(json_array_get(json_object_get(d, "training"), 1), "branch", json_string("key"));
    CHECK_ERR(chk(d, &err), &err, "r.json: training[1]: layer 0 head 0 key appears twice");
    json_decref(d);
    d = json_deep_copy(ga);
    json_array_append_new(json_object_get(json_array_get(json_object_get(d, "training"), 2), "steps"), json_integer(99999));
    CHECK_ERR(chk(d, &err), &err, "r.json: training[2].steps: ");
    json_decref(d);

    /* theory */
    d = json_deep_copy(th);
    json_object_set_new(d, "heads_with_value_peak_after_key_peak", json_integer(2));
    json_object_set_new(json_array_get(json_object_get(d, "heads"), 0), "value_peak",
                        json_integer((json_integer_value(json_object_get(json_array_get(json_object_get(d, "heads"), 0), "key_peak")) + 2) % 4));
    json_object_set_new(json_array_get(json_object_get(d, "heads"), 1), "value_peak",
                        json_integer((json_integer_value(json_object_get(json_array_get(json_object_get(d, "heads"), 1), "key_peak")) + 2) % 4));
    CHECK_ERR(chk(d, &err), &err, "r.json: heads_with_value_peak_after_key_peak: 2, but 0 heads have value_peak = key_peak + 1");
    json_decref(d);
    d = json_deep_copy(th);
    json_array_append_new(json_object_get(d, "loss"), json_real(1));
    CHECK_ERR(chk(d, &err), &err, "r.json: loss: ", "entries, expected");
    json_decref(d);
done:
    json_decref(ko);
    json_decref(gc);
    json_decref(ga);
    json_decref(th);
}

/* ---- files ---- */

static void test_files(void) {
    ps_error err = {0};
    json_t *d;
    char p[512];
    snprintf(p, sizeof p, "%s/bad.json", TMP);
    FILE *f = fopen(p, "w");
    fputs("{\"kind\": \"sweep\", ", f);
    fclose(f);
    CHECK_ERR(ps_results_load(p, NULL, &d, &err), &err, "bad.json: not valid JSON (line 1: ");
    CHECK_ERR(ps_results_load(out("nope.json"), NULL, &d, &err), &err, "nope.json: cannot open");
    char a[2048];
    /* render and table print one line naming the file and the field */
    f = fopen(p, "w");
    fputs("{\"kind\": \"sweep\"}", f);
    fclose(f);
    snprintf(a, sizeof a, "render %s --out %s/render", p, TMP);
    CHECK(ps_run_q(a, 1) != 0, "render of {\"kind\": \"sweep\"} succeeded");
    snprintf(a, sizeof a, "table %s", p);
    CHECK(ps_run_q(a, 1) != 0, "table of {\"kind\": \"sweep\"} succeeded");
    snprintf(a, sizeof a, "%s/stderr.txt", TMP);
    f = fopen(a, "r");
    char line[1024] = "";
    CHECK(f && fgets(line, sizeof line, f), "table printed no error line");
    char want[1024];
    snprintf(want, sizeof want, "phasescope table: %s: provenance: missing\n", p);
    CHECK(!strcmp(line, want), "got \"%s\"", line);
    if (f) fclose(f);
}

/* ---- DeepSeek-V4 checkpoints and the channel attention: provenance configs, per-channel gates ---- */

static void test_v4_results(void) {
    char a[4096], task[512];
    snprintf(task, sizeof task, "%s/task.json", TMP);
    FILE *f = fopen(task, "w");
    fprintf(f, "{\"task\": {\"kind\": \"kv-retrieval\", \"seq_len\": 40, \"n_keys\": 16, \"n_values\": 16, \"n_fillers\": 4,"
               " \"n_pairs\": 4, \"key_len\": 1, \"value_len\": 1, \"gap_min\": 0, \"gap_max\": 3, \"query_gap\": 8, \"n_queries\": 2}}");
    fclose(f);
    const char *cmds[] = {
        "gates --model tests/conformance/v4/mix4 --task %s --n 2 --out %s/v4/gates",
        "knockout --model tests/conformance/v4/mix4 --task %s --n 2 --period 2 --target indexer --out %s/v4/ko",
        "gatecycle --model tests/conformance/v4/mix4 --task %s --n 2 --layer 1 --shift 1 --out %s/v4/gc",
    };
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        snprintf(a, sizeof a, cmds[i], task, TMP);
        CHECK(ps_run(a) == 0, "phasescope %s failed", a);
    }
    ps_error err = {0};
    json_t *g = load_ok(out("v4/gates/gates.json")), *ko = load_ok(out("v4/ko/knockout.json")), *gc = load_ok(out("v4/gc/gatecycle.json")), *d;
    if (!g || !ko || !gc) return;
    json_decref(ko);
    json_decref(gc);
#define GL(doc, i) json_array_get(json_object_get(json_object_get((doc), "gates"), "layers"), (i))
#define BR0(doc, i) json_array_get(json_object_get(GL(doc, i), "branches"), 0)
    d = json_deep_copy(g);
    json_array_set_new(json_object_get(json_object_get(BR0(d, 0), "pooled"), "mean_gate"), 0, json_real(0.9));
    CHECK_ERR(chk(d, &err), &err, "r.json: gates.layers[0].branches[0].pooled.mean_gate: the weights add up to");
    json_decref(d);
    d = json_deep_copy(g);
    json_array_set_new(json_object_get(json_object_get(BR0(d, 1), "per_channel"), "N_input"), 3, json_real(9.5));
    CHECK_ERR(chk(d, &err), &err, "r.json: gates.layers[1].branches[0].per_channel.N_input[3]: 9.5");
    json_decref(d);
    d = json_deep_copy(g);
    json_object_set_new(GL(d, 1), "layer", json_integer(1));
    CHECK_ERR(chk(d, &err), &err, "r.json: gates.layers[1].layer: 1, expected more than 1");
    json_decref(d);
    d = json_deep_copy(g);
    json_array_set_new(json_object_get(json_object_get(BR0(d, 2), "per_channel"), "peak"), 0, json_integer(8));
    CHECK_ERR(chk(d, &err), &err, "r.json: gates.layers[2].branches[0].per_channel.peak[0]: 8 is out of range [0, 7]");
    json_decref(d);
    d = json_deep_copy(g);
    json_array_remove(json_object_get(json_object_get(json_object_get(json_object_get(d, "provenance"), "config"), "attention"), "compress_rates"), 0);
    CHECK_ERR(chk(d, &err), &err, "r.json: provenance.config.attention.compress_rates: 3 entries, expected 4");
    json_decref(d);
    d = json_deep_copy(g);
    json_t *att = json_object_get(json_object_get(json_object_get(d, "provenance"), "config"), "attention");
    json_object_set_new(att, "kind", json_string("v4"));
    CHECK_ERR(chk(d, &err), &err, "r.json: provenance.config.attention.rate: missing");
    json_decref(d);
    json_decref(g);
#undef GL
#undef BR0
}

/* ---- the registry of result kinds (viz/kinds.h) ---- */

static void test_registry(void) {
    static const char *const NAMES[] = {"sweep", "knockout", "patch", "gatecycle", "gates", "theory", "fillers", "atp_compare"};
    char names[256];
    ps_kind_names(names, sizeof names);
    CHECK(!strcmp(names, "sweep, knockout, recall, patch, gatecycle, gates, theory, fillers, atp_compare"), "the registry's names: %s", names);
    ps_error err = {0};
    for (size_t i = 0; i < sizeof NAMES / sizeof NAMES[0]; i++) {
        const ps_kind *k = ps_kind_find(NAMES[i]);
        CHECK(k && !strcmp(k->name, NAMES[i]) && k->check && k->render, "%s: not in the registry", NAMES[i]);
        if (!k) continue;
        CHECK(!k->multi == (k->several != NULL), "%s: a kind drawn one at a time names its results in the refusal", NAMES[i]);
        CHECK(!ps_kind_shares(k, NAMES[i]) && !ps_kind_shares(k, "") && !ps_kind_shares(k, NULL), "%s shares with itself or nothing", NAMES[i]);
        /* a document of that kind reaches the kind's own check: each checks its provenance first */
        json_t *d = json_pack("{s:s}", "kind", NAMES[i]);
        CHECK_ERR(chk(d, &err), &err, "r.json: provenance: missing");
        json_decref(d);
    }
    CHECK(!ps_kind_find("swee") && !ps_kind_find("sweeps") && !ps_kind_find("Sweep") && !ps_kind_find("") && !ps_kind_find(NULL),
          "ps_kind_find matches only whole names");
    const ps_kind *gc = ps_kind_find("gatecycle"), *sw = ps_kind_find("sweep");
    CHECK(ps_kind_shares(gc, "sweep") && !ps_kind_shares(gc, "swee") && !ps_kind_shares(gc, "sweep gatecycle") &&
              !ps_kind_shares(sw, "gatecycle") && !ps_kind_shares(NULL, "sweep"),
          "sharing: a sweep may follow a gatecycle result's file, nothing else shares");
    char small[12];
    ps_kind_names(small, sizeof small);
    CHECK(!strcmp(small, "sweep, knoc"), "ps_kind_names truncates: %s", small);
    json_t *d = json_pack("{s:s}", "kind", "banana");
    CHECK_ERR(chk(d, &err), &err, "r.json: kind: \"banana\" is not a result kind (sweep, knockout, recall, patch, gatecycle, gates, theory, fillers, atp_compare)");
    json_decref(d);
    d = json_pack("{s:i}", "kind", 3);
    CHECK_ERR(chk(d, &err), &err, "r.json: kind: expected a string, got an integer");
    json_decref(d);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: test_results_check BUILD_DIR\n");
        return 2;
    }
    snprintf(PS, sizeof PS, "%s/phasescope", argv[1]);
    snprintf(TMP, sizeof TMP, "/tmp/ps_rc.XXXXXX");
    if (!mkdtemp(TMP)) {
        perror("mkdtemp");
        return 2;
    }
    test_real_results();
    test_sweep();
    test_other_kinds();
    test_files();
    test_v4_results();
    test_registry();
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", TMP);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", TMP);
    CHECK_DONE();
}
