/* test_toy_family.c — the "add a model family" recipe (docs/design.md) proven on a third family defined
 * here: a bigram-table model (next-token logits = a row of a [V, V] table, one hook point per layer:
 * blocks.{L}.hook_row, the rows [B, T, V] that are the logits). It is opened through core's family table
 * (ps_runtime_open_family) — its evaluation is its family `score`, its one knockout target (mean replacement
 * of the rows) is data in its table (ko_targets, ko_arrays) — and run through the shipped code paths: the
 * sweep's work units (ps_sweep_units) and a knockout (ps_knockout_run: the one mean-replacement spec,
 * interventions/ko_spec.c, on the grid engine's naive path). Both are
 * checked against the same numbers computed by plain loops over the table. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/ops.h"
#include "core/runtime.h"
#include "interventions/knockout.h"
#include "interventions/units.h"

#include "toy_family.h"

/* ---- the checks: plain loops over the table ---- */

static ps_task toy_task(void) {
    ps_task t = {.kind = PS_TASK_KV, .seq_len = 30, .n_keys = 6, .n_values = 6, .n_fillers = 3, .n_pairs = 3,
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

int main(void) {
    test_toy();
    CHECK_DONE();
}
