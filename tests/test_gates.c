/* test_gates.c — effective offsets (SPEC §6): hand-computed cases, uniform gates have exactly W
 * effective offsets, one-hot gates 1, and the shared conformance statistics (expected_gates.json). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/forward.h"
#include "gates/chgates.h"
#include "gates/gates.h"
#include "core/fileio.h"
#include "core/model.h"
#include "testutil.h"
#include "core/tokens.h"

static void test_hand(void) {
    double u[4] = {0.25, 0.25, 0.25, 0.25}, one[4] = {0, 0, 1, 0}, half[4] = {0.5, 0.5, 0, 0};
    CHECK(fabs(ps_effective_offsets(u, 4) - 4) < 1e-12 && fabs(ps_effective_offsets(one, 4) - 1) < 1e-12 &&
              fabs(ps_effective_offsets(half, 4) - 2) < 1e-12,
          "effective offsets of uniform/one-hot/two-way");
    /* two windows, one-hot at different offsets: N_input = 1, N_static = 2, peak ties to the lowest */
    ps_config c = tu_config(PS_ATTN_COMPRESSED);
    c.window = 4;
    c.n_kv_heads = 1;
    c.n_heads = 1;
    ps_gate_acc acc;
    ps_error err;
    CHECK_OK(ps_gate_acc_init(&acc, &c, &err), &err);
    float alpha[8] = {0, 1, 0, 0, 0, 0, 0, 1};
    ps_gate_acc_add(&acc, 0, PS_BRANCH_KEY, alpha, 2);
    ps_gate_stat st;
    ps_gate_acc_stat(&acc, 0, 0, PS_BRANCH_KEY, &st);
    CHECK(fabs(st.N_input - 1) < 1e-12 && fabs(st.N_static - 2) < 1e-12 && st.peak == 1 && st.n_windows == 2,
          "N_input %g N_static %g peak %d", st.N_input, st.N_static, st.peak);
    ps_gate_acc_free(&acc);
    c.kind = PS_ATTN_FULL;
    CHECK_ERR(ps_gate_acc_init(&acc, &c, &err), &err, "full attention");
}

static void test_uniform_model(void) {
    ps_config c = tu_config(PS_ATTN_COMPRESSED);
    c.gate = PS_GATE_UNIFORM;
    c.window = 8; c.stride = 4;
    c.n_layers = 2;
    ps_model m;
    tu_random_model(&m, &c, 3, 0.3f);
    ps_gate_acc acc;
    ps_hooks h;
    ps_hooks_init(&h);
    ps_error err;
    CHECK_OK(ps_gate_acc_init(&acc, &c, &err), &err);
    CHECK_OK(ps_gate_acc_watch(&acc, &h, &c, &err), &err);
    int32_t tok[2 * 40];
    tu_random_tokens(tok, 80, c.vocab_size, 4);
    ps_acts a;
    CHECK_OK(ps_acts_create(&a, m.ctx, &c, 2, 40, false, &err), &err);
    CHECK_OK(ps_forward(&m, &a, tok, &h, &err), &err);
    double worst = 0;
    for (int l = 0; l < 2; l++)
        for (int g = 0; g < 2; g++)
            for (int b = 0; b < 2; b++) {
                ps_gate_stat st;
                ps_gate_acc_stat(&acc, l, g, (ps_branch)b, &st);
                worst = fmax(worst, fmax(fabs(st.N_static - 8), fabs(st.N_input - 8)));
                CHECK(st.n_windows == 2 * 9 && st.peak == 0, "windows %lld peak %d", (long long)st.n_windows, st.peak);
            }
    CHECK(worst < 1e-9, "uniform gate: effective offsets differ from W = 8 by %g", worst);
    ps_acts_free(&a);
    ps_hooks_free(&h);
    ps_gate_acc_free(&acc);
    ps_model_free(&m);
}

static void test_conformance(const char *name) {
    char dir[2048], path[4096];
    snprintf(dir, sizeof dir, "%s/%s", tu_conformance_dir(), name);
    ps_error err;
    ps_model m;
    ps_token_lists toks;
    REQUIRE_OK(ps_model_load(&m, dir, &err), &err);
    snprintf(path, sizeof path, "%s/tokens.json", dir);
    REQUIRE_OK(ps_tokens_load(path, 0, 0, &toks, &err), &err);
    ps_gate_acc acc;
    ps_hooks h;
    ps_hooks_init(&h);
    CHECK_OK(ps_gate_acc_init(&acc, &m.cfg, &err), &err);
    CHECK_OK(ps_gate_acc_watch(&acc, &h, &m.cfg, &err), &err);
    for (int s = 0; s < toks.n; s++) {
        ps_acts a;
        CHECK_OK(ps_acts_create(&a, m.ctx, &m.cfg, 1, toks.len[s], false, &err), &err);
        CHECK_OK(ps_forward(&m, &a, toks.seq[s], &h, &err), &err);
        ps_acts_free(&a);
    }
    snprintf(path, sizeof path, "%s/expected_gates.json", dir);
    json_error_t je;
    json_t *ref = json_load_file(path, 0, &je);
    CHECK(ref != NULL, "cannot read %s", path);
    json_t *layers = json_object_get(ref, "layers");
    int compared = 0;
    for (size_t li = 0; li < json_array_size(layers); li++) {
        json_t *lo = json_array_get(layers, li);
        int l = (int)json_integer_value(json_object_get(lo, "layer"));
        json_t *heads = json_object_get(lo, "heads");
        for (size_t hi = 0; hi < json_array_size(heads); hi++) {
            json_t *ho = json_array_get(heads, hi);
            int g = (int)json_integer_value(json_object_get(ho, "head"));
            for (int b = 0; b < 2; b++) {
                json_t *bo = json_object_get(ho, b ? "value" : "key");
                ps_gate_stat st;
                ps_gate_acc_stat(&acc, l, g, (ps_branch)b, &st);
                double e = fabs(st.N_static - json_number_value(json_object_get(bo, "N_static"))) /
                           json_number_value(json_object_get(bo, "N_static"));
                e = fmax(e, fabs(st.N_input - json_number_value(json_object_get(bo, "N_input"))) /
                                json_number_value(json_object_get(bo, "N_input")));
                json_t *mg = json_object_get(bo, "mean_gate");
                double mx = 0, num = 0;
                for (size_t i = 0; i < json_array_size(mg); i++) {
                    double r = json_number_value(json_array_get(mg, i));
                    mx = fmax(mx, fabs(r));
                    num = fmax(num, fabs(r - st.mean_gate[i]));
                }
                e = fmax(e, num / mx);
                CHECK(e < 1e-4, "%s layer %d head %d %s: rel err %.3g", name, l, g, b ? "value" : "key", e);
                CHECK(st.peak == (int)json_integer_value(json_object_get(bo, "peak")) &&
                          st.n_windows == json_integer_value(json_object_get(bo, "n_windows")),
                      "%s layer %d head %d: peak %d n_windows %lld", name, l, g, st.peak, (long long)st.n_windows);
                compared++;
            }
        }
    }
    CHECK(compared == m.cfg.n_layers * m.cfg.n_kv_heads * 2, "%s: compared %d statistics", name, compared);
    json_t *mine = ps_gate_acc_to_json(&acc, &m.cfg);
    CHECK(mine && json_array_size(json_object_get(mine, "layers")) == (size_t)m.cfg.n_layers, "json layout");
    json_decref(mine);
    json_decref(ref);
    ps_hooks_free(&h);
    ps_gate_acc_free(&acc);
    ps_tokens_free(&toks);
    ps_model_free(&m);
}

/* a training log read line by line: blank lines skipped, a broken line named by number, no records named */
static void test_log_reader(void) {
    char dir[512], path[1024];
    tu_tempdir(dir, sizeof dir, "gates_log");
    snprintf(path, sizeof path, "%s/train.jsonl", dir);
    ps_error err;
    const char *good = "{\"type\": \"train\", \"step\": 1, \"loss\": 2.5}\n\n  \n{\"type\": \"eval\", \"step\": 1}";
    CHECK_OK(ps_write_file_atomic(path, good, strlen(good), &err), &err);
    json_t *recs = ps_read_jsonl(path, &err);
    CHECK(recs && json_array_size(recs) == 2 && json_integer_value(json_object_get(json_array_get(recs, 1), "step")) == 1,
          "two records (blank lines skipped, no final newline): %zu", recs ? json_array_size(recs) : (size_t)0);
    json_decref(recs);
    CHECK(ps_gates_log_summary(path, &err) == NULL && strstr(err.msg, "no gate records") && strstr(err.msg, path),
          "a log without gate records: %s", err.msg);
    CHECK(ps_chgate_log_summary(path, &err) == NULL && strstr(err.msg, "no per-channel gate records"), "%s", err.msg);
    const char *bad = "{\"type\": \"train\"}\n\n{\"type\": \"gates\"\n";
    CHECK_OK(ps_write_file_atomic(path, bad, strlen(bad), &err), &err);
    CHECK(ps_read_jsonl(path, &err) == NULL && strstr(err.msg, "line 3 is not valid JSON") && strstr(err.msg, path), "%s", err.msg);
    CHECK(ps_gates_log_summary(path, &err) == NULL && strstr(err.msg, "line 3 is not valid JSON"), "%s", err.msg);
    CHECK(ps_chgate_log_summary(path, &err) == NULL && strstr(err.msg, "line 3 is not valid JSON"), "%s", err.msg);
    snprintf(path, sizeof path, "%s/absent.jsonl", dir);
    CHECK(ps_read_jsonl(path, &err) == NULL && strstr(err.msg, "absent.jsonl"), "%s", err.msg);
}

int main(void) {
    test_log_reader();
    test_hand();
    test_uniform_model();
    test_conformance("compressed_w8s8");
    test_conformance("compressed_w6s3_overlap");
    CHECK_DONE();
}
