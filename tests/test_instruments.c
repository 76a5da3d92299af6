/* test_instruments.c — phase sweep, knockout grid, gate cycling (SPEC §5, §6): residue bookkeeping on
 * hand-built prompts in both modes, Wilson intervals and chi-square p-values against known values, period
 * detection and best-shift alignment on synthetic curves, the knockout grid against a full forward with
 * overwrite hooks per cell, no change for a head whose activations do not vary, gatecycle by W and by k
 * then -k restoring the checkpoint bit-exactly, and the errors. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "gatecycle.h"
#include "knockout.h"
#include "stats.h"
#include "sweep.h"
#include "testutil.h"

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
    double before[8] = {0}, after[8] = {0}, corr;
    before[2] = 1;
    after[5] = 1;
    CHECK(ps_best_shift(before, after, 8, &corr) == 3 && fabs(corr - 1) < 1e-12, "best shift 3");
    memset(after, 0, sizeof after);
    after[0] = 1;
    CHECK(ps_best_shift(before, after, 8, &corr) == 6, "best shift 6 (signed -2)");
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
    ps_task_generate(&t, 3, &base);
    ps_filler_family fam = repeat_family();
    int layers[3] = {0, 1, 2}, heads[2] = {0, 1};
    ps_knockout_result fast, naive;
    CHECK_OK(ps_knockout_grid(&m, &base, &t, &fam, 4, 0, 4, layers, 3, heads, 2, target, 0, &fast, NULL, NULL, &err), &err);
    CHECK_OK(ps_knockout_grid(&m, &base, &t, &fam, 4, 0, 4, layers, 3, heads, 2, target, 1, &naive, NULL, NULL, &err), &err);
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
    json_t *j = ps_knockout_json(&fast, target);
    CHECK(json_array_size(json_object_get(j, "cells")) == 6 &&
              json_integer_value(json_object_get(json_array_get(json_object_get(j, "cells"), 0), "layer")) == 0,
          "knockout json layout");
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
    CHECK_OK(ps_knockout_grid(&m, &base, &t, &fam, 4, 0, 4, layers, 3, heads, 2, target, 0, &fast, NULL, NULL, &err), &err);
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
        CHECK_ERR(ps_knockout_grid(&m, &base, &t, &fam, 4, 0, 4, layers, 3, heads, 2, PS_KO_COMPRESSED, 0, &fast, NULL, NULL, &err),
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

/* The sweep of a model whose gate was cycled runs and its statistics are consistent. */
static void test_sweep_run(void) {
    ps_model m;
    make_model(&m, PS_ATTN_COMPRESSED, 61);
    ps_task t = small_task();
    ps_batch base;
    ps_error err;
    ps_batch_alloc(&base, 12, t.seq_len, t.n_queries, &err);
    ps_task_generate(&t, 5, &base);
    ps_filler_family fam = repeat_family();
    ps_residue_stats st;
    CHECK_OK(ps_sweep_run(&m, &base, &t, &fam, PS_SWEEP_PAD, 4, 0, 5, &st, NULL, NULL, &err), &err);
    int64_t tot = 0;
    for (int r = 0; r < 4; r++) tot += st.n[r];
    CHECK(tot == 12 * 2 * 4 && st.n[0] == 24, "pad: every query at every residue once (%lld)", (long long)tot);
    json_t *j = ps_residue_stats_json(&st);
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

int main(void) {
    test_stats();
    test_residues();
    test_knockout(PS_ATTN_COMPRESSED, PS_KO_COMPRESSED);
    test_knockout(PS_ATTN_COMPRESSED, PS_KO_BOTH);
    test_knockout(PS_ATTN_FULL, PS_KO_RAW);
    test_gatecycle();
    test_sweep_run();
    CHECK_DONE();
}
