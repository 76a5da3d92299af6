/* test_instruments.c — phase sweep, knockout grid, gate cycling (SPEC §5, §6): residue bookkeeping on
 * hand-built prompts in both modes, Wilson intervals and chi-square p-values against known values, period
 * detection and best-shift alignment on synthetic curves, the verdict (no period for a curve that is not
 * phase sensitive), the knockout grid against a full forward with overwrite hooks per cell and against a
 * mean replacement written here from scratch (hooks cache the entries, the test averages them), the batched
 * grid (several cells per forward, any budget) against one cell per forward for every cell and target, each
 * cell's worst residue, no change for a head whose activations do not vary, cleanup after an allocation
 * failure, gatecycle by W and by k then -k restoring the checkpoint bit-exactly, a cycled model's
 * parameters against a hand roll, the dip tracking of gate cycling, and the errors. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "interventions/gatecycle.h"
#include "interventions/knockout.h"
#include "viz/draw.h"
#include "interventions/stats.h"
#include "interventions/sweep.h"
#include "tasks/tasks.h"
#include "testutil.h"

/* the allocation-failure test asks for more memory than exists: under ASan that must return NULL, as
 * plain malloc does, rather than abort */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "allocator_may_return_null=1"; }

static ps_filler_family repeat_family(void) {
    ps_filler_family f = {.name = "repeat", .n_pattern = 1, .pattern = {0}};
    return f;
}

static void test_stats(void) {
    double lo, hi;
    ps_wilson(8, 10, 1.96, &lo, &hi);
    CHECK(fabs(lo - 0.4902) < 1e-4 && fabs(hi - 0.9433) < 1e-4, "Wilson 8/10: [%.4f, %.4f]", lo, hi);
    ps_wilson(0, 20, 1.96, &lo, &hi);
    CHECK(lo == 0 && fabs(hi - 0.1611) < 1e-4, "Wilson 0/20: [%.4f, %.4f]", lo, hi);
    CHECK(fabs(ps_gamma_q(0.5, 3.841459 / 2) - 0.05) < 1e-6, "chi2(1) tail at 3.841: %g", ps_gamma_q(0.5, 3.841459 / 2));
    CHECK(fabs(ps_gamma_q(2.5, 11.0705 / 2) - 0.05) < 1e-5, "chi2(5) tail at 11.07: %g", ps_gamma_q(2.5, 11.0705 / 2));
    CHECK(fabs(ps_gamma_q(11.5, 35.1725 / 2) - 0.05) < 1e-5, "chi2(23) tail at 35.17");
    int64_t k[2] = {10, 20}, n[2] = {30, 30}, df;
    double chi2, p;
    ps_chi_square(k, n, 2, &chi2, &df, &p);
    CHECK(fabs(chi2 - 20.0 / 3) < 1e-9 && df == 1 && fabs(p - 0.009823) < 1e-5, "chi2 %g df %lld p %g", chi2, (long long)df, p);
    int64_t k2[3] = {5, 5, 0}, n2[3] = {5, 5, 0};
    ps_chi_square(k2, n2, 3, &chi2, &df, &p);
    CHECK(chi2 == 0 && p == 1 && df == 1, "all correct: chi2 %g p %g df %lld", chi2, p, (long long)df);
    /* periods */
    double y[24];
    int64_t kk;
    double frac;
    for (int i = 0; i < 24; i++) y[i] = i % 8 == 3;
    CHECK(ps_dominant_period(y, 24, &kk, &frac) == 8 && kk == 3, "one-hot every 8 over 24: k %lld", (long long)kk);
    for (int i = 0; i < 24; i++) y[i] = cos(2 * M_PI * i / 6.0) + 0.3 * cos(2 * M_PI * i / 24.0);
    CHECK(ps_dominant_period(y, 24, &kk, &frac) == 6, "cosine of period 6");
    for (int i = 0; i < 8; i++) y[i] = i == 2 ? 0.9 : 0.1;
    CHECK(ps_dominant_period(y, 8, &kk, &frac) == 8, "one-hot over 8: period 8");
    for (int i = 0; i < 8; i++) y[i] = i == 7 ? 0.2 : 1.0;
    CHECK(ps_dominant_period(y, 8, &kk, &frac) == 8, "a lone dip repeats every P");
    for (int i = 0; i < 24; i++) y[i] = i % 8 == 5 ? 0.1 : 0.9;
    CHECK(ps_dominant_period(y, 24, &kk, &frac) == 8 && kk == 3, "a dip every 8 over 24");
    for (int i = 0; i < 8; i++) y[i] = i % 4 < 2 ? 1 : 0;
    CHECK(ps_dominant_period(y, 8, &kk, &frac) == 4, "square wave of period 4 over 8");
    for (int i = 0; i < 8; i++) y[i] = 0.5;
    CHECK(ps_dominant_period(y, 8, &kk, &frac) == 0 && kk == 0, "flat curve has no period");
    /* repeat period by folding */
    double r2;
    {
        double h[6] = {1, 0, 1, 0, 1, 1}; /* by hand: folded at 2 the means are 1 and 1/3; SS_res 6/9 of SS_tot 12/9 */
        CHECK(fabs(ps_fold_r2(h, 6, 2) - 0.5) < 1e-12 && fabs(ps_fold_r2(h, 6, 6) - 1) < 1e-12 && ps_fold_r2(h, 6, 4) == 0,
              "fold R2 %g %g", ps_fold_r2(h, 6, 2), ps_fold_r2(h, 6, 6));
    }
    CHECK(ps_fold_period(y, 8, &r2) == 0 && r2 == 0, "flat curve: no repeat period");
    for (int i = 0; i < 8; i++) y[i] = i % 4 < 2 ? 1 : 0;
    CHECK(ps_fold_period(y, 8, &r2) == 4 && fabs(r2 - 1) < 1e-12, "square wave of period 4 over 8 repeats every 4");
    for (int i = 0; i < 8; i++) y[i] = i == 7 ? 0.2 : 1.0;
    CHECK(ps_fold_period(y, 8, &r2) == 8, "a lone dip repeats every P");
    for (int i = 0; i < 24; i++) y[i] = cos(2 * M_PI * i / 6.0) + 0.3 * cos(2 * M_PI * i / 24.0);
    CHECK(ps_fold_period(y, 24, &r2) == 6, "cosine of period 6 (plus a weaker one of 24) repeats every 6");
    {
        /* a W12/S12 model measured on P = 24 (deep_w12s12 at step 6400, 96 prompts per shift): one dead residue per
         * stride (11, 23) and uneven others; the DFT picks the harmonic 6, folding finds 12 */
        double w[24] = {0.71, 0.99, 0.96, 0.82, 0.91, 0.83, 0.76, 0.98, 0.87, 0.98, 0.99, 0.16,
                        0.89, 1.00, 0.99, 0.96, 0.98, 0.83, 0.73, 0.98, 0.80, 0.96, 0.99, 0.12};
        CHECK(ps_dominant_period(w, 24, &kk, &frac) == 6, "the DFT takes the harmonic here (%lld)", (long long)kk);
        CHECK(ps_fold_period(w, 24, &r2) == 12 && r2 > 0.9, "W12/S12 repeats every 12 (R2 %g)", r2);
    }
    double before[8] = {0}, after[8] = {0}, corr;
    before[2] = 1;
    after[5] = 1;
    CHECK(ps_best_shift(before, after, 8, &corr) == 3 && fabs(corr - 1) < 1e-12, "best shift 3");
    memset(after, 0, sizeof after);
    after[0] = 1;
    CHECK(ps_best_shift(before, after, 8, &corr) == 6, "best shift 6 (signed -2)");
    /* the verdict, and p-values for people */
    const char *v;
    CHECK(ps_phase_verdict(0.001, 10, &v) == 1 && !strcmp(v, "phase sensitive"), "verdict sensitive");
    CHECK(ps_phase_verdict(0.001, 0.2, &v) == 0 && strstr(v, "small"), "verdict small gap");
    CHECK(ps_phase_verdict(0.51, 30, &v) == 0 && !strcmp(v, "no phase dependence detected"), "verdict p");
    char pb[32];
    ps_format_p(pb, sizeof pb, 0.0);
    CHECK(!strcmp(pb, "< 1e-300"), "p 0 prints as %s", pb);
    ps_format_p(pb, sizeof pb, 0.0123);
    CHECK(!strcmp(pb, "0.0123"), "p 0.0123 prints as %s", pb);
    /* masked best shift: residue 7 dead in both curves would pin the whole-curve statistic to 0 */
    double b2[8] = {1, 1, 0, 1, 1, 1, 1, 0}, a2[8] = {1, 1, 1, 1, 1, 0, 1, 0};
    int keep[8] = {1, 1, 1, 1, 1, 1, 1, 0};
    CHECK(ps_best_shift_masked(b2, a2, keep, 8, &corr) == 3 && fabs(corr - 1) < 1e-12, "masked best shift 3 (%g)", corr);
    CHECK(ps_best_shift_masked(b2, a2, NULL, 8, &corr) == ps_best_shift(b2, a2, 8, &frac), "no mask = whole curve");
}

/* Gate cycling's comparison of the clean and cycled curves: where each dip went, new dips, exclusions. */
static void test_cycle_analysis(void) {
    ps_error err;
    ps_cycle_analysis an;
    /* the shipped W8/S8 rolled by 2: the dip at 7 moves to 1, and 7 dips too after */
    double b1[8] = {1, 1, 1, 1, 1, 1, 1, 0.25}, a1[8] = {0.99, 0.09, 0.99, 1, 0.99, 1, 1, 0};
    CHECK_OK(ps_cycle_analyse(b1, a1, 8, 1.0 / 32, &an, &err), &err);
    CHECK(an.n_moves == 1 && an.moves[0].before == 7 && an.moves[0].after == 1 && an.moves[0].still_dips && an.n_new == 0 &&
              an.n_excluded == 0 && !an.after_near_chance,
          "dip 7 -> 1");
    ps_cycle_analysis_free(&an);
    /* two dead dips before (2, 7), after: 5 and 7; 7 is dead in both and left out of the statistic */
    double b2[8] = {1, 1, 0, 1, 1, 1, 1, 0}, a2[8] = {1, 1, 1, 1, 1, 0, 1, 0};
    CHECK_OK(ps_cycle_analyse(b2, a2, 8, 0.01, &an, &err), &err);
    CHECK(an.n_moves == 2 && an.moves[0].before == 2 && an.moves[0].after == 5 && an.moves[1].before == 7 &&
              an.moves[1].after == -1 && an.moves[1].still_dips,
          "dips 2 -> 5, 7 stays");
    CHECK(an.n_excluded == 1 && an.excluded[0] == 7 && an.best_shift == 3 && an.best_shift_signed == 3 &&
              fabs(an.best_shift_correlation - 1) < 1e-12,
          "7 excluded, best shift 3 (%lld, %g)", (long long)an.best_shift, an.best_shift_correlation);
    ps_cycle_analysis_free(&an);
    /* a cycled curve at chance everywhere: flagged, no dips after */
    double a3[8] = {0.02, 0.01, 0.02, 0.01, 0.0, 0.01, 0.02, 0.01};
    CHECK_OK(ps_cycle_analyse(b1, a3, 8, 1.0 / 32, &an, &err), &err);
    CHECK(an.after_near_chance && !an.before_near_chance && an.n_moves == 1 && an.moves[0].after == -1 && an.n_new == 0,
          "near chance after cycling");
    ps_cycle_analysis_free(&an);
    ps_task t = {.kind = PS_TASK_KV, .n_values = 8, .value_len = 2};
    CHECK(fabs(ps_task_chance(&t) - 1.0 / 64) < 1e-15, "kv chance");
    t = (ps_task){.kind = PS_TASK_BIGRAM, .n_context = 32};
    CHECK(fabs(ps_task_chance(&t) - 1.0 / 32) < 1e-15, "bigram chance");
}

/* A hand-built kv prompt: BOS f f K1 V1 f K2 V2 f f MARK K2 V2 (T = 13), the query asks K2 at 6. */
static void test_residues(void) {
    ps_task t = {.kind = PS_TASK_KV, .seq_len = 13, .n_keys = 4, .n_values = 4, .n_fillers = 2, .n_pairs = 2,
                 .key_len = 1, .value_len = 1, .gap_min = 0, .gap_max = 2, .query_gap = 0, .n_queries = 1};
    ps_batch b;
    ps_error err;
    ps_batch_alloc(&b, 1, 13, 1, &err);
    int32_t F = (int32_t)ps_task_fill0(&t), K1 = 2, K2 = 3, V1 = 6, V2 = 7;
    int32_t tok[13] = {0, F, F, K1, V1, F, K2, V2, F, F, PS_MARKER, K2, V2};
    memcpy(b.tokens, tok, sizeof tok);
    b.n_q[0] = 1;
    b.queries[0] = (ps_query){.key_pos = 6, .answer_pos = 11, .answer_len = 1, .answer_src = 12};
    ps_filler_family fam = repeat_family();
    ps_shifted s;
    /* pad: p = 3 fillers after BOS; t_K = 9; residue 9 mod 4 = 1 */
    CHECK_OK(ps_make_shifted(&b, &t, &fam, PS_SWEEP_PAD, 4, 3, 0, 64, &s, &err), &err);
    int32_t want_pad[16] = {0, F, F, F, F, F, K1, V1, F, K2, V2, F, F, PS_MARKER, K2, V2};
    CHECK(s.b.T == 16 && !memcmp(s.b.tokens, want_pad, sizeof want_pad), "pad tokens");
    CHECK(s.b.queries[0].key_pos == 9 && s.b.queries[0].answer_pos == 14 && s.residue[0] == 1, "pad: key %lld answer %lld rho %lld",
          (long long)s.b.queries[0].key_pos, (long long)s.b.queries[0].answer_pos, (long long)s.residue[0]);
    CHECK(s.b.targets[14] == V2, "pad target");
    ps_shifted_free(&s);
    /* move: P = 4, p = 1: one filler before the pair, two after; length 16 for every p; t_K = 7 */
    CHECK_OK(ps_make_shifted(&b, &t, &fam, PS_SWEEP_MOVE, 4, 1, 0, 64, &s, &err), &err);
    int32_t want_move[16] = {0, F, F, K1, V1, F, F, K2, V2, F, F, F, F, PS_MARKER, K2, V2};
    CHECK(s.b.T == 16 && !memcmp(s.b.tokens, want_move, sizeof want_move), "move tokens");
    CHECK(s.b.queries[0].key_pos == 7 && s.b.queries[0].answer_pos == 14 && s.b.queries[0].answer_src == 15 &&
              s.residue[0] == 3 && s.b.targets[14] == V2,
          "move: key %lld rho %lld", (long long)s.b.queries[0].key_pos, (long long)s.residue[0]);
    ps_shifted_free(&s);
    /* every residue is visited once per query over p = 0..P-1 */
    int seen[4] = {0};
    for (int p = 0; p < 4; p++) {
        ps_make_shifted(&b, &t, &fam, PS_SWEEP_PAD, 4, p, 0, 64, &s, &err);
        seen[s.residue[0]]++;
        ps_shifted_free(&s);
    }
    CHECK(seen[0] == 1 && seen[1] == 1 && seen[2] == 1 && seen[3] == 1, "residues visited once each");
    /* too long */
    CHECK_ERR(ps_make_shifted(&b, &t, &fam, PS_SWEEP_PAD, 8, 0, 0, 16, &s, &err), &err, "max_seq_len 16", "by 4");
    CHECK_ERR(ps_make_shifted(&b, &t, &fam, PS_SWEEP_MOVE, 8, 0, 0, 16, &s, &err), &err, "max_seq_len 16", "by 4");
    ps_batch_free(&b);
}

static ps_task small_task(void) {
    ps_task t = {.kind = PS_TASK_KV, .seq_len = 30, .n_keys = 6, .n_values = 6, .n_fillers = 3, .n_pairs = 3,
                 .key_len = 1, .value_len = 2, .gap_min = 0, .gap_max = 3, .query_gap = 4, .n_queries = 2};
    return t;
}

static void make_model(ps_model *m, ps_attn_kind kind, uint64_t seed) {
    ps_config c = tu_config(kind);
    c.n_layers = 3;
    c.max_seq_len = 40;
    c.window = 4; c.stride = 4; c.local_window = 4;
    tu_random_model(m, &c, seed, 0.5f);
}

static void test_knockout(ps_attn_kind kind, ps_ko_target target) {
    ps_model m;
    make_model(&m, kind, 41);
    ps_task t = small_task();
    ps_batch base;
    ps_error err;
    ps_batch_alloc(&base, 10, t.seq_len, t.n_queries, &err);
    CHECK(ps_task_generate(&t, 3, &base, NULL) == 0, "task generation");
    ps_filler_family fam = repeat_family();
    int layers[3] = {0, 1, 2}, heads[2] = {0, 1};
    ps_knockout_result fast, naive;
    CHECK_OK(tu_knockout_opts(&m, &base, &t, &fam, 4, 0, 4, layers, 3, heads, 2, target, NULL, &fast, NULL, NULL, &err), &err);
    ps_knockout_opts o_naive = {.naive = 1};
    CHECK_OK(tu_knockout_opts(&m, &base, &t, &fam, 4, 0, 4, layers, 3, heads, 2, target, &o_naive, &naive, NULL, NULL, &err), &err);
    double worst = 0;
    int same_k = 1, changed = 0;
    for (int c = 0; c < 6; c++)
        for (int r = 0; r < 4; r++) {
            same_k &= fast.cells[c].k[r] == naive.cells[c].k[r] && fast.cells[c].n[r] == naive.cells[c].n[r];
            worst = fmax(worst, fabs(fast.cells[c].lp[r] - naive.cells[c].lp[r]) / (1 + fabs(naive.cells[c].lp[r])));
            changed |= fabs(fast.cells[c].lp[r] - fast.clean.lp[r]) > 1e-3 * (1 + fabs(fast.clean.lp[r]));
        }
    CHECK(same_k && worst < 1e-5, "grid cells differ from full forwards with overwrite hooks (%g)", worst);
    CHECK(changed, "no knockout changed anything");
    json_t *j = ps_knockout_json(&fast, ps_ko_target_name(target), NULL, &err);
    CHECK(json_array_size(json_object_get(j, "cells")) == 6 &&
              json_integer_value(json_object_get(json_array_get(json_object_get(j, "cells"), 0), "layer")) == 0,
          "knockout json layout");
    /* each cell's worst residue is the largest accuracy drop among its residues */
    for (size_t ci = 0; ci < json_array_size(json_object_get(j, "cells")); ci++) {
        json_t *cell = json_array_get(json_object_get(j, "cells"), ci), *w = json_object_get(cell, "worst_residue");
        double lowest = INFINITY;
        for (size_t r = 0; r < 4; r++)
            lowest = fmin(lowest, json_real_value(json_object_get(json_array_get(json_object_get(cell, "residues"), r), "delta_accuracy_pp")));
        json_int_t wr = json_integer_value(json_object_get(w, "rho"));
        CHECK(fabs(json_real_value(json_object_get(w, "delta_accuracy_pp")) - lowest) < 1e-12 && wr >= 0 && wr < 4 &&
                  json_real_value(json_object_get(json_array_get(json_object_get(cell, "residues"), (size_t)wr), "delta_accuracy_pp")) == lowest,
              "worst residue of cell %zu", ci);
    }
    json_decref(j);
    ps_knockout_result_free(&fast);
    ps_knockout_result_free(&naive);
    /* identical prompts: every head's activations are the same across prompts, so the mean is each
     * prompt's own value and nothing changes */
    for (int i = 1; i < base.B; i++) {
        memcpy(base.tokens + i * base.T, base.tokens, (size_t)base.T * sizeof(int32_t));
        base.n_q[i] = base.n_q[0];
        memcpy(base.queries + i * base.max_q, base.queries, (size_t)base.max_q * sizeof(ps_query));
    }
    CHECK_OK(tu_knockout_opts(&m, &base, &t, &fam, 4, 0, 4, layers, 3, heads, 2, target, NULL, &fast, NULL, NULL, &err), &err);
    /* (cells score only the answer rows with row-wise kernels, so the log-probs agree to rounding) */
    int all_same = 1;
    double dmax = 0;
    for (int c = 0; c < 6; c++)
        for (int r = 0; r < 4; r++) {
            all_same &= fast.cells[c].k[r] == fast.clean.k[r];
            dmax = fmax(dmax, fabs(fast.cells[c].lp[r] - fast.clean.lp[r]) / (1 + fabs(fast.clean.lp[r])));
        }
    CHECK(all_same && dmax < 1e-6, "knocking out heads with constant activations changed the result (%g)", dmax);
    ps_knockout_result_free(&fast);
    if (kind == PS_ATTN_FULL)
        CHECK_ERR(tu_knockout_opts(&m, &base, &t, &fam, 4, 0, 4, layers, 3, heads, 2, PS_KO_COMPRESSED, NULL, &fast, NULL, NULL, &err),
                  &err, "--target compressed", "full-attention");
    ps_knockout_result_free(&fast);
    ps_batch_free(&base);
    ps_model_free(&m);
}

static void test_gatecycle(void) {
    ps_model m;
    make_model(&m, PS_ATTN_COMPRESSED, 51);
    float *orig = malloc((size_t)m.n_params * sizeof(float));
    memcpy(orig, m.params, (size_t)m.n_params * sizeof(float));
    ps_error err;
    CHECK_OK(ps_gate_cycle(&m, 1, -1, 3, 3, 4, &err), &err); /* by W = 4 */
    CHECK(!memcmp(orig, m.params, (size_t)m.n_params * 4), "cycling by W changed the weights");
    CHECK_OK(ps_gate_cycle(&m, 1, 1, PS_CYCLE_KEY, 3, 3, &err), &err);
    CHECK(memcmp(orig, m.params, (size_t)m.n_params * 4) != 0, "cycling by 3 changed nothing");
    /* u'_i = u_{(i-k) mod W}: offset 0 now holds what offset 1 held (k = 3, W = 4) */
    ps_layer_params a = ps_model_layer(&m, m.params, 1), o = ps_model_layer(&m, orig, 1);
    int64_t d = m.cfg.d_model, nkv = m.cfg.n_kv_heads;
    CHECK(!memcmp(a.key_gate_w + (0 * nkv + 1) * d, o.key_gate_w + (1 * nkv + 1) * d, (size_t)d * 4) &&
              a.key_gate_b[0 * nkv + 1] == o.key_gate_b[1 * nkv + 1] &&
              !memcmp(a.key_gate_w + (0 * nkv + 0) * d, o.key_gate_w + (0 * nkv + 0) * d, (size_t)d * 4) &&
              !memcmp(a.value_gate_w, o.value_gate_w, (size_t)(4 * nkv * d) * 4),
          "roll direction, head and branch selection");
    CHECK_OK(ps_gate_cycle(&m, 1, 1, PS_CYCLE_KEY, 3, -3, &err), &err);
    CHECK(!memcmp(orig, m.params, (size_t)m.n_params * 4), "k then -k did not restore the weights bit-exactly");
    CHECK_ERR(ps_gate_cycle(&m, 9, -1, 3, 1, 2, &err), &err, "--layer 9", "3 layers");
    CHECK_ERR(ps_gate_cycle(&m, 0, 2, 3, 1, 2, &err), &err, "--head 2", "2 KV heads");
    ps_model_free(&m);
    ps_config c = tu_config(PS_ATTN_COMPRESSED);
    c.gate = PS_GATE_UNIFORM;
    tu_random_model(&m, &c, 1, 0.1f);
    CHECK_ERR(ps_gate_cycle(&m, 0, -1, 3, PS_CYCLE_GATE, 1, &err), &err, "uniform");
    CHECK_OK(ps_gate_cycle(&m, 0, -1, 3, PS_CYCLE_PAYLOAD, 1, &err), &err);
    ps_model_free(&m);
    c.gate = PS_GATE_LEARNED;
    c.payload = PS_PAYLOAD_SHARED;
    tu_random_model(&m, &c, 1, 0.1f);
    CHECK_ERR(ps_gate_cycle(&m, 0, -1, 3, PS_CYCLE_PAYLOAD, 1, &err), &err, "--params payload", "shared");
    ps_model_free(&m);
    c = tu_config(PS_ATTN_FULL);
    tu_random_model(&m, &c, 1, 0.1f);
    CHECK_ERR(ps_gate_cycle(&m, 0, -1, 3, PS_CYCLE_GATE, 1, &err), &err, "full attention");
    ps_model_free(&m);
    free(orig);
}

/* A model whose gates and payloads were cycled (layer 1, every head, both branches, k = 1): every
 * per-offset parameter equals a roll written here by hand, nothing else moved, and the sweep of the cycled
 * model runs with consistent statistics. */
static void test_sweep_run(void) {
    ps_model m;
    make_model(&m, PS_ATTN_COMPRESSED, 61);
    ps_error err;
    float *orig = malloc((size_t)m.n_params * sizeof(float));
    memcpy(orig, m.params, (size_t)m.n_params * sizeof(float));
    const int64_t k = 1, W = m.cfg.window, nkv = m.cfg.n_kv_heads, d = m.cfg.d_model, hd = m.cfg.head_dim;
    CHECK_OK(ps_gate_cycle(&m, 1, -1, PS_CYCLE_KEY | PS_CYCLE_VALUE, PS_CYCLE_GATE | PS_CYCLE_PAYLOAD, k, &err), &err);
    ps_layer_params a = ps_model_layer(&m, m.params, 1), o = ps_model_layer(&m, orig, 1);
    /* per-offset arrays: offset i is a block of `per` floats (all heads), head g's part at g * len */
    struct {
        const float *now, *was;
        int64_t per, len;
        const char *name;
    } arr[6] = {{a.key_gate_w, o.key_gate_w, nkv * d, d, "key gate w"},       {a.key_gate_b, o.key_gate_b, nkv, 1, "key gate b"},
                {a.value_gate_w, o.value_gate_w, nkv * d, d, "value gate w"}, {a.value_gate_b, o.value_gate_b, nkv, 1, "value gate b"},
                {a.key_payload, o.key_payload, nkv * hd * d, hd * d, "key payload"},
                {a.value_payload, o.value_payload, nkv * hd * d, hd * d, "value payload"}};
    int64_t moved = 0;
    for (int ai = 0; ai < 6; ai++) {
        int same = 1;
        for (int64_t i = 0; i < W; i++)
            for (int64_t g = 0; g < nkv; g++)
                for (int64_t e = 0; e < arr[ai].len; e++) {
                    int64_t src = ((i - k) % W + W) % W; /* u'_i = u_{(i-k) mod W} */
                    same &= arr[ai].now[i * arr[ai].per + g * arr[ai].len + e] == arr[ai].was[src * arr[ai].per + g * arr[ai].len + e];
                    moved += arr[ai].now[i * arr[ai].per + g * arr[ai].len + e] != arr[ai].was[i * arr[ai].per + g * arr[ai].len + e];
                }
        CHECK(same, "%s of layer 1 is not the hand roll by %lld", arr[ai].name, (long long)k);
    }
    CHECK(moved > 0, "cycling changed nothing");
    /* everything else is untouched: count the floats that differ; they are exactly the rolled ones */
    int64_t diff = 0;
    for (int64_t i = 0; i < m.n_params; i++) diff += m.params[i] != orig[i];
    CHECK(diff == moved, "parameters outside layer 1's per-offset arrays changed (%lld vs %lld)", (long long)diff, (long long)moved);
    free(orig);
    ps_task t = small_task();
    ps_batch base;
    ps_batch_alloc(&base, 12, t.seq_len, t.n_queries, &err);
    CHECK(ps_task_generate(&t, 5, &base, NULL) == 0, "task generation");
    ps_filler_family fam = repeat_family();
    ps_residue_stats st;
    CHECK_OK(ps_sweep_run(&m, &base, &t, &fam, PS_SWEEP_PAD, 4, 0, 5, &st, NULL, NULL, &err), &err);
    int64_t tot = 0;
    for (int r = 0; r < 4; r++) tot += st.n[r];
    CHECK(tot == 12 * 2 * 4 && st.n[0] == 24, "pad: every query at every residue once (%lld)", (long long)tot);
    json_t *j = ps_residue_stats_json(&st, &err);
    CHECK(json_array_size(json_object_get(j, "residues")) == 4 && json_object_get(j, "chi_square"), "curve json");
    json_decref(j);
    ps_residue_stats_free(&st);
    CHECK_OK(ps_sweep_run(&m, &base, &t, &fam, PS_SWEEP_MOVE, 4, 0, 5, &st, NULL, NULL, &err), &err);
    tot = 0;
    for (int r = 0; r < 4; r++) tot += st.n[r];
    CHECK(tot == 12 * 4, "move: the first query only (%lld)", (long long)tot);
    ps_residue_stats_free(&st);
    CHECK_ERR(ps_sweep_run(&m, &base, &t, &fam, PS_SWEEP_PAD, 12, 0, 5, &st, NULL, NULL, &err), &err, "max_seq_len 40", "by 1");
    ps_residue_stats_free(&st);
    ps_batch_free(&base);
    ps_model_free(&m);
}

/* A curve's JSON carries the sweep command's verdict; the period is null unless the curve is phase
 * sensitive (p < 0.01 and gap >= 5 pp). */
static void test_curve_verdict(void) {
    ps_residue_stats r;
    ps_error err;
    CHECK_OK(ps_residue_stats_init(&r, 8, &err), &err);
    for (int i = 0; i < 8; i++) { /* a 0.2 pp wobble over 100000 queries per residue: significant, tiny */
        r.n[i] = 100000;
        r.k[i] = i == 3 ? 99800 : 99999;
    }
    json_t *j = ps_residue_stats_json(&r, &err), *dp = json_object_get(j, "dominant_period");
    double p = json_real_value(json_object_get(json_object_get(j, "chi_square"), "p_value"));
    CHECK(p < 0.01 && json_is_false(json_object_get(j, "phase_sensitive")) && json_is_null(json_object_get(dp, "period")) &&
              json_real_value(json_object_get(dp, "candidate_period")) == 8,
          "a significant 0.2 pp gap gets no period (p %g)", p);
    json_decref(j);
    for (int i = 0; i < 8; i++) r.k[i] = i == 3 ? 10000 : 99000;
    j = ps_residue_stats_json(&r, &err);
    dp = json_object_get(j, "dominant_period");
    CHECK(json_is_true(json_object_get(j, "phase_sensitive")) && json_real_value(json_object_get(dp, "period")) == 8 &&
              !strcmp(json_string_value(json_object_get(j, "verdict")), "phase sensitive"),
          "a deep dip: period 8");
    json_decref(j);
    for (int i = 0; i < 8; i++) r.k[i] = i % 2 ? 50000 : 50300; /* not significant */
    j = ps_residue_stats_json(&r, &err);
    CHECK(json_is_null(json_object_get(json_object_get(j, "dominant_period"), "period")) &&
              !strcmp(json_string_value(json_object_get(j, "verdict")), "no phase dependence detected"),
          "not significant: no period");
    json_decref(j);
    ps_residue_stats_free(&r);
}

/* One knockout cell computed here from scratch: hooks cache layer l's entries (compressed ck/cv or raw
 * k/v) of every prompt of a shift, the test averages head g over the prompts position by position in
 * plain loops, a second hook writes that mean in, and the outcomes per residue must equal the grid's. */
typedef struct {
    float *buf[2];   /* [N, npos, nkv, hd] per array */
    int64_t npos, nkv, hd, head;
    double *mean[2]; /* [npos, hd] */
    int write;
    ps_hook_point pts[2];
} indep_ko;

static int indep_hook(const ps_hook_event *ev, void *user, ps_error *err) {
    (void)err;
    indep_ko *c = user;
    int w = ev->point == c->pts[0] ? 0 : 1;
    int64_t B = ev->shape[0];
    if (!c->write) {
        memcpy(c->buf[w], ev->data, (size_t)(B * c->npos * c->nkv * c->hd) * sizeof(float));
        return 0;
    }
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < c->npos; t++)
            for (int64_t e = 0; e < c->hd; e++)
                ev->data[((b * c->npos + t) * c->nkv + c->head) * c->hd + e] = (float)c->mean[w][t * c->hd + e];
    return 0;
}

static void test_knockout_independent(ps_ko_target target) {
    ps_model m;
    make_model(&m, PS_ATTN_COMPRESSED, 71);
    ps_task t = small_task();
    ps_batch base;
    ps_error err;
    const int64_t N = 7, P = 4;
    const int L = 1, G = 1;
    ps_batch_alloc(&base, N, t.seq_len, t.n_queries, &err);
    CHECK(ps_task_generate(&t, 9, &base, NULL) == 0, "task generation");
    ps_filler_family fam = repeat_family();
    ps_knockout_result grid;
    /* two heads: the batched grid runs both cells in one forward, head G as the second replica */
    int layers[1] = {L}, heads[2] = {0, G};
    CHECK_OK(tu_knockout_opts(&m, &base, &t, &fam, P, 0, 3, layers, 1, heads, 2, target, NULL, &grid, NULL, NULL, &err), &err);
    CHECK(grid.cells_per_forward == 2, "the grid ran %d cells per forward, expected 2", grid.cells_per_forward);
    int64_t kk[4] = {0}, nn[4] = {0};
    double lp[4] = {0};
    const int64_t nkv = m.cfg.n_kv_heads, hd = m.cfg.head_dim, V = m.cfg.vocab_size;
    for (int64_t p = 0; p < P; p++) {
        ps_shifted s;
        CHECK_OK(ps_make_shifted(&base, &t, &fam, PS_SWEEP_PAD, P, p, 0, m.cfg.max_seq_len, &s, &err), &err);
        int64_t T = s.b.T;
        indep_ko c = {.npos = target == PS_KO_COMPRESSED ? ps_config_n_windows(&m.cfg, T) : T, .nkv = nkv, .hd = hd, .head = G};
        c.pts[0] = target == PS_KO_COMPRESSED ? PS_HOOK_CK : PS_HOOK_K;
        c.pts[1] = target == PS_KO_COMPRESSED ? PS_HOOK_CV : PS_HOOK_V;
        ps_hooks h;
        ps_hooks_init(&h);
        for (int w = 0; w < 2; w++) {
            c.buf[w] = malloc((size_t)(N * c.npos * nkv * hd) * sizeof(float));
            c.mean[w] = calloc((size_t)(c.npos * hd), sizeof(double));
            char name[96];
            ps_hook_name(name, sizeof name, L, c.pts[w]);
            CHECK_OK(ps_hooks_add(&h, &m.cfg, name, indep_hook, &c, &err), &err);
        }
        ps_acts a;
        CHECK_OK(ps_acts_create(&a, m.ctx, &m.cfg, N, T, false, &err), &err);
        /* clean pass: cache the entries */
        CHECK_OK(ps_forward(&m, &a, s.b.tokens, &h, &err), &err);
        /* the mean of head G over the N prompts, position by position */
        for (int w = 0; w < 2; w++)
            for (int64_t tt = 0; tt < c.npos; tt++)
                for (int64_t e = 0; e < hd; e++) {
                    double sum = 0;
                    for (int64_t b = 0; b < N; b++) sum += c.buf[w][((b * c.npos + tt) * nkv + G) * hd + e];
                    c.mean[w][tt * hd + e] = sum / (double)N;
                }
        /* knocked-out pass */
        c.write = 1;
        CHECK_OK(ps_forward(&m, &a, s.b.tokens, &h, &err), &err);
        int *ok = malloc((size_t)(N * s.b.max_q) * sizeof(int));
        double *lq = malloc((size_t)(N * s.b.max_q) * sizeof(double));
        ps_score_queries(&s.b, a.p.logits, V, ok, lq);
        for (int64_t b = 0; b < N; b++)
            for (int64_t q = 0; q < s.b.n_q[b]; q++) {
                int64_t rho = s.residue[b * s.b.max_q + q];
                nn[rho]++;
                kk[rho] += ok[b * s.b.max_q + q];
                lp[rho] += lq[b * s.b.max_q + q];
            }
        free(ok);
        free(lq);
        ps_acts_free(&a);
        ps_hooks_free(&h);
        for (int w = 0; w < 2; w++) {
            free(c.buf[w]);
            free(c.mean[w]);
        }
        ps_shifted_free(&s);
    }
    double worst = 0;
    int same = 1, changed = 0;
    for (int r = 0; r < P; r++) {
        same &= nn[r] == grid.cells[1].n[r] && kk[r] == grid.cells[1].k[r];
        worst = fmax(worst, fabs(lp[r] - grid.cells[1].lp[r]) / fabs(lp[r]));
        changed |= fabs(lp[r] - grid.clean.lp[r]) > 1e-3 * fabs(grid.clean.lp[r]);
    }
    CHECK(same && worst < 1e-4, "%s knockout of layer %d head %d differs from the hand-made mean replacement (rel %g)",
          target == PS_KO_COMPRESSED ? "compressed" : "raw", L, G, worst);
    CHECK(changed, "the hand-made knockout changed nothing (the comparison would be vacuous)");
    ps_knockout_result_free(&grid);
    ps_batch_free(&base);
    ps_model_free(&m);
}

/* The batched grid (several cells of one layer as replicas in one forward, the restarted pass truncated
 * after the last answer row) against the same grid one cell per forward and against the naive grid (a full
 * forward with overwrite hooks per cell): every cell, every residue. Runs the budget's choice (all heads
 * of a layer in one forward), groups of 2 of 3 heads (two replica batch sizes), a budget too small for
 * one cell of the whole batch (one prompt per forward), over batches of 4, 4 and 2 prompts. */
static void test_knockout_batched(ps_attn_kind kind, ps_ko_target target) {
    ps_model m;
    ps_config c = tu_config(kind);
    c.n_layers = 3;
    c.n_kv_heads = 4;
    c.max_seq_len = 40;
    tu_random_model(&m, &c, 47, 0.5f);
    ps_task t = small_task();
    ps_batch base;
    ps_error err;
    ps_batch_alloc(&base, 10, t.seq_len, t.n_queries, &err);
    CHECK(ps_task_generate(&t, 5, &base, NULL) == 0, "task generation");
    ps_filler_family fam = repeat_family();
    int layers[3] = {1, 0, 2}, heads[3] = {2, 0, 3};
    const char *tname = target == PS_KO_RAW ? "raw" : target == PS_KO_COMPRESSED ? "compressed" : "both";
    ps_knockout_opts o_one = {.max_cells = 1}, o_naive = {.naive = 1};
    ps_knockout_result one, naive;
    CHECK_OK(tu_knockout_opts(&m, &base, &t, &fam, 4, 0, 4, layers, 3, heads, 3, target, &o_one, &one, NULL, NULL, &err), &err);
    CHECK_OK(tu_knockout_opts(&m, &base, &t, &fam, 4, 0, 4, layers, 3, heads, 3, target, &o_naive, &naive, NULL, NULL, &err), &err);
    CHECK(one.cells_per_forward == 1 && one.prompts_per_forward == 4, "%s: one cell per forward ran %d cells x %lld prompts",
          tname, one.cells_per_forward, (long long)one.prompts_per_forward);
    ps_knockout_opts runs[3] = {{0}, {.max_cells = 2}, {.mem_bytes = 1}};
    int want_cells[3] = {3, 2, 1};
    int64_t want_prompts[3] = {4, 4, 1};
    int changed = 0;
    for (int ri = 0; ri < 3; ri++) {
        ps_knockout_result b;
        CHECK_OK(tu_knockout_opts(&m, &base, &t, &fam, 4, 0, 4, layers, 3, heads, 3, target, &runs[ri], &b, NULL, NULL, &err), &err);
        CHECK(b.cells_per_forward == want_cells[ri] && b.prompts_per_forward == want_prompts[ri],
              "%s run %d: %d cells x %lld prompts per forward, expected %d x %lld", tname, ri, b.cells_per_forward,
              (long long)b.prompts_per_forward, want_cells[ri], (long long)want_prompts[ri]);
        int same = 1;
        double worst = 0;
        for (int ci = 0; ci < 9; ci++)
            for (int r = 0; r < 4; r++) {
                const ps_residue_stats *x = &b.cells[ci], *y = &one.cells[ci], *z = &naive.cells[ci];
                same &= x->k[r] == y->k[r] && x->n[r] == y->n[r] && x->k[r] == z->k[r] && x->n[r] == z->n[r];
                worst = fmax(worst, fabs(x->lp[r] - y->lp[r]) / fabs(y->lp[r]));
                worst = fmax(worst, fabs(x->lp[r] - z->lp[r]) / fabs(z->lp[r]));
                changed |= fabs(x->lp[r] - b.clean.lp[r]) > 1e-3 * fabs(b.clean.lp[r]);
            }
        for (int r = 0; r < 4; r++) same &= b.clean.k[r] == naive.clean.k[r] && b.clean.n[r] == naive.clean.n[r];
        CHECK(same && worst < 1e-5, "%s run %d: batched cells differ from one cell per forward or the naive grid (rel %g)",
              tname, ri, worst);
        ps_knockout_result_free(&b);
    }
    CHECK(changed, "%s: no knockout changed anything (the comparison would be vacuous)", tname);
    ps_knockout_result_free(&one);
    ps_knockout_result_free(&naive);
    ps_batch_free(&base);
    ps_model_free(&m);
}

/* Regression: an allocation that fails inside the grid (here the answer rows of an absurd task) returns an
 * error naming it, and the cleanup frees only what was created (it used to free a ps_acts never made). */
static void test_knockout_alloc_failure(void) {
    ps_model m;
    make_model(&m, PS_ATTN_COMPRESSED, 81);
    ps_task t = small_task();
    ps_batch base;
    ps_error err;
    ps_batch_alloc(&base, 4, t.seq_len, t.n_queries, &err);
    CHECK(ps_task_generate(&t, 3, &base, NULL) == 0, "task generation");
    t.value_len = (int64_t)1 << 58; /* the rows buffer would need 2^64 bytes */
    ps_filler_family fam = repeat_family();
    ps_knockout_result r;
    int layers[1] = {0}, heads[1] = {0};
    CHECK_ERR(tu_knockout_opts(&m, &base, &t, &fam, 4, 0, 4, layers, 1, heads, 1, PS_KO_COMPRESSED, NULL, &r, NULL, NULL, &err),
              &err, "out of memory", "answer rows");
    ps_knockout_result_free(&r);
    ps_batch_free(&base);
    ps_model_free(&m);
}

/* The per-head cycle measure: a synthetic knockout profile rolled by k gives shift - k = 0 by both the
 * worst residue and the cross-correlation; dead residues are left out; a head without a profile, or one
 * lost after cycling, is not measured. */
static void test_head_shift(void) {
    double before[8] = {1, 0, 2, 0, 0, 0, 95, 3}, after[8];
    for (int64_t k = -3; k <= 4; k++) {
        for (int r = 0; r < 8; r++) after[((r + k) % 8 + 8) % 8] = before[r];
        ps_head_shift hs;
        ps_head_shift_measure(before, after, NULL, 8, k, PS_HEAD_MIN_HURT_PP, &hs);
        CHECK(hs.status == PS_HEAD_MEASURED && hs.error_worst == 0 && hs.error_xcorr == 0 && hs.worst_before == 6 &&
                  hs.shift_worst == ps_signed_mod(k, 8),
              "rolled by %lld: status %d, errors %lld %lld", (long long)k, hs.status, (long long)hs.error_worst,
              (long long)hs.error_xcorr);
    }
    /* residue 1 is dead before and after: its (spurious) hurt of 99 after is left out, so 6 -> 0 (k = 2) */
    double after2[8] = {90, 99, 0, 0, 0, 0, 0, 0};
    unsigned char dead[8] = {0, 1, 0, 0, 0, 0, 0, 0};
    ps_head_shift hs;
    ps_head_shift_measure(before, after2, dead, 8, 2, PS_HEAD_MIN_HURT_PP, &hs);
    CHECK(hs.status == PS_HEAD_MEASURED && hs.worst_after == 0 && hs.shift_worst == 2 && hs.error_worst == 0 && hs.error_xcorr == 0,
          "dead residue excluded (worst after %lld, errors %lld %lld)", (long long)hs.worst_after, (long long)hs.error_worst,
          (long long)hs.error_xcorr);
    ps_head_shift_measure(before, after2, NULL, 8, 2, PS_HEAD_MIN_HURT_PP, &hs);
    CHECK(hs.worst_after == 1 && hs.error_worst == 1, "without the dead mask residue 1 wins");
    /* moved by 3 when k = 2: error +1; wrapped across P/2 it stays signed */
    double after3[8] = {0, 95, 0, 0, 0, 0, 0, 0};
    ps_head_shift_measure(before, after3, NULL, 8, 2, PS_HEAD_MIN_HURT_PP, &hs);
    CHECK(hs.shift_worst == 3 && hs.error_worst == 1 && hs.error_xcorr == 1, "off by one");
    double flat[8] = {5, 0, 0, 0, 0, 0, 0, 0}, zero[8] = {0};
    ps_head_shift_measure(flat, before, NULL, 8, 1, PS_HEAD_MIN_HURT_PP, &hs);
    CHECK(hs.status == PS_HEAD_NO_PROFILE, "no profile before");
    ps_head_shift_measure(before, zero, NULL, 8, 1, PS_HEAD_MIN_HURT_PP, &hs);
    CHECK(hs.status == PS_HEAD_LOST && hs.worst_before == 6, "lost after");
    CHECK(ps_signed_mod(4, 8) == 4 && ps_signed_mod(5, 8) == -3 && ps_signed_mod(-4, 8) == 4 && ps_signed_mod(-9, 8) == -1,
          "signed mod");
}

/* the same residue statistics (counts exactly; log-probabilities to 1e-9 relative) */
static double stats_diff(const ps_residue_stats *a, const ps_residue_stats *b, int *same_k) {
    double w = 0;
    for (int64_t r = 0; r < a->P; r++) {
        *same_k &= a->n[r] == b->n[r] && a->k[r] == b->k[r];
        w = fmax(w, fabs(a->lp[r] - b->lp[r]) / (1 + fabs(a->lp[r])));
    }
    return w;
}

/* The instruments on a device's code path: the model moved to the test backend cpu-staged (the cpu's ops,
 * buffers that are not host pointers: every host read is a copy) gives the cpu's knockout grids (restart
 * and naive paths, every target) and sweeps (pad and move). */
static void test_device_paths(ps_attn_kind kind) {
    ps_model m, d;
    make_model(&m, kind, 77);
    make_model(&d, kind, 77);
    ps_error err;
    REQUIRE_OK(ps_model_to_backend(&d, "cpu-staged", &err), &err);
    CHECK(!ps_ctx_host_visible(d.ctx), "the moved model is not on a device-like context");
    ps_task t = small_task();
    ps_batch base;
    ps_batch_alloc(&base, 9, t.seq_len, t.n_queries, &err);
    CHECK(ps_task_generate(&t, 7, &base, NULL) == 0, "task generation");
    ps_filler_family fam = repeat_family();
    int layers[3] = {0, 1, 2}, heads[2] = {0, 1};
    ps_ko_target targets[3] = {PS_KO_COMPRESSED, PS_KO_RAW, PS_KO_BOTH};
    for (int ti = kind == PS_ATTN_FULL ? 1 : 0; ti < (kind == PS_ATTN_FULL ? 2 : 3); ti++)
        for (int naive = 0; naive < 2; naive++) {
            ps_knockout_opts o = {.naive = naive};
            ps_knockout_result a = {0}, b = {0};
            int ok = tu_knockout_opts(&m, &base, &t, &fam, 4, 0, 4, layers, 3, heads, 2, targets[ti], &o, &a, NULL, NULL, &err) == 0;
            CHECK(ok, "cpu knockout: %s", err.msg);
            ok = ok && tu_knockout_opts(&d, &base, &t, &fam, 4, 0, 4, layers, 3, heads, 2, targets[ti], &o, &b, NULL, NULL, &err) == 0;
            CHECK(ok, "cpu-staged knockout (%s, naive %d): %s", ps_ko_target_name(targets[ti]), naive, err.msg);
            if (ok) {
                int same_k = 1;
                double w = stats_diff(&a.clean, &b.clean, &same_k);
                for (int c = 0; c < 6; c++) w = fmax(w, stats_diff(&a.cells[c], &b.cells[c], &same_k));
                CHECK(same_k && w < 1e-9, "knockout %s naive %d: cpu-staged differs from cpu (%g)", ps_ko_target_name(targets[ti]),
                      naive, w);
            }
            ps_knockout_result_free(&a);
            ps_knockout_result_free(&b);
        }
    for (int mode = 0; mode < 2; mode++) {
        ps_residue_stats a = {0}, b = {0};
        ps_sweep_mode sm = mode ? PS_SWEEP_MOVE : PS_SWEEP_PAD;
        CHECK_OK(ps_sweep_run(&m, &base, &t, &fam, sm, 4, 0, 5, &a, NULL, NULL, &err), &err);
        CHECK_OK(ps_sweep_run(&d, &base, &t, &fam, sm, 4, 0, 5, &b, NULL, NULL, &err), &err);
        int same_k = 1;
        double w = a.n && b.n ? stats_diff(&a, &b, &same_k) : 1;
        CHECK(same_k && w < 1e-9, "sweep mode %d: cpu-staged differs from cpu (%g)", mode, w);
        ps_residue_stats_free(&a);
        ps_residue_stats_free(&b);
    }
    ps_batch_free(&base);
    ps_model_free(&m);
    ps_model_free(&d);
}

int main(void) {
    test_device_paths(PS_ATTN_COMPRESSED);
    test_device_paths(PS_ATTN_FULL);
    test_stats();
    test_residues();
    test_knockout(PS_ATTN_COMPRESSED, PS_KO_COMPRESSED);
    test_knockout(PS_ATTN_COMPRESSED, PS_KO_BOTH);
    test_knockout(PS_ATTN_FULL, PS_KO_RAW);
    test_knockout_independent(PS_KO_COMPRESSED);
    test_knockout_independent(PS_KO_RAW);
    test_knockout_batched(PS_ATTN_COMPRESSED, PS_KO_COMPRESSED);
    test_knockout_batched(PS_ATTN_COMPRESSED, PS_KO_RAW);
    test_knockout_batched(PS_ATTN_COMPRESSED, PS_KO_BOTH);
    test_knockout_batched(PS_ATTN_FULL, PS_KO_RAW);
    test_knockout_alloc_failure();
    test_gatecycle();
    test_sweep_run();
    test_curve_verdict();
    test_cycle_analysis();
    test_head_shift();
    CHECK_DONE();
}
