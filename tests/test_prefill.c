/* test_prefill.c — chunked prefill (core/prefill.h) against one unchunked ps_forward pass: the logits at
 * asked-for positions agree for full and compressed attention (non-overlapping and overlapping windows,
 * shared payloads, uniform gates, no RoPE, qk-norm off), for chunk sizes that split windows and local
 * windows anywhere (1, 3, 7, 64, the whole sequence), staggered and per-layer window grids; positions asked in any
 * order; bad inputs; and the
 * memory estimate grows linearly in T for compressed attention. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/forward.h"
#include "core/prefill.h"
#include "tasks/tasks.h"
#include "testutil.h"

static double max_rel(const float *a, const float *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - b[i]);
        num = e > num ? e : num;
        den = fabs((double)b[i]) > den ? fabs((double)b[i]) : den;
    }
    return den > 0 ? num / den : num;
}

static void compare(const char *name, ps_config c, int64_t T) {
    c.max_seq_len = T;
    ps_model m;
    tu_random_model(&m, &c, 11, 0.4f);
    int32_t *tok = malloc((size_t)T * sizeof(int32_t));
    tu_random_tokens(tok, T, c.vocab_size, 12);
    ps_acts a;
    ps_error err;
    CHECK_OK(ps_acts_create(&a, m.ctx, &c, 1, T, false, &err), &err);
    CHECK_OK(ps_forward(&m, &a, tok, NULL, &err), &err);
    int64_t V = c.vocab_size;
    /* positions: the ends, window boundaries, and a few odd ones, not sorted */
    int64_t pos[] = {T - 1, 0, 1, 7, 8, 9, 15, 16, 17, 31, 63, T / 2, T - 2, 5};
    int64_t np = 0, want[sizeof pos / sizeof pos[0]];
    for (size_t i = 0; i < sizeof pos / sizeof pos[0]; i++)
        if (pos[i] < T) want[np++] = pos[i];
    float *got = malloc((size_t)(np * V) * sizeof(float));
    int64_t chunks[] = {1, 3, 7, 64, T};
    for (size_t ci = 0; ci < sizeof chunks / sizeof chunks[0]; ci++) {
        if (chunks[ci] == 1 && T > 200) continue; /* one token at a time: only on the short sequences */
        ps_prefill p;
        CHECK_OK(ps_prefill_create(&p, &m, T, chunks[ci], &err), &err);
        CHECK_OK(ps_prefill_logits(&p, tok, T, want, np, got, &err), &err);
        double worst = 0;
        for (int64_t i = 0; i < np; i++) {
            double e = max_rel(got + i * V, a.p.logits + want[i] * V, V);
            worst = e > worst ? e : worst;
        }
        CHECK(worst < 1e-4, "%s T=%lld chunk %lld: logits differ from the unchunked pass by %.3g (relative)", name,
              (long long)T, (long long)chunks[ci], worst);
        /* a second run on the same state starts over (nothing carried from the first) */
        if (ci == 2) {
            CHECK_OK(ps_prefill_logits(&p, tok, T, want, np, got, &err), &err);
            double again = 0;
            for (int64_t i = 0; i < np; i++) {
                double e = max_rel(got + i * V, a.p.logits + want[i] * V, V);
                again = e > again ? e : again;
            }
            CHECK(again < 1e-4, "%s: a second prefill on the same state differs (%.3g)", name, again);
        }
        ps_prefill_free(&p);
    }
    free(got);
    free(tok);
    ps_acts_free(&a);
    ps_model_free(&m);
}

static void test_equivalence(void) {
    ps_config c = tu_config(PS_ATTN_FULL);
    c.n_layers = 2;
    compare("full", c, 150);
    c = tu_config(PS_ATTN_COMPRESSED);
    c.n_layers = 2;
    c.window = 8, c.stride = 8, c.local_window = 8;
    compare("compressed W8/S8", c, 150);
    compare("compressed W8/S8 long", c, 1000);
    c.window = 6, c.stride = 3, c.local_window = 5;
    compare("compressed W6/S3 LW5", c, 149);
    c.payload = PS_PAYLOAD_SHARED;
    c.gate = PS_GATE_UNIFORM;
    compare("compressed shared payload, uniform gate", c, 97);
    c = tu_config(PS_ATTN_COMPRESSED);
    c.window = 4, c.stride = 4, c.local_window = 12;
    c.rope = false, c.qk_norm = false;
    compare("compressed W4/S4 LW12 no RoPE, no qk-norm", c, 130);
    c.window = 16, c.stride = 16, c.local_window = 4;
    compare("compressed W16 (fewer positions than a window at first)", c, 40);
    /* offset grids: each KV head's windows close on its own grid (staggered: the same in every layer; per layer) */
    ps_error err;
    c = tu_config(PS_ATTN_COMPRESSED);
    c.n_layers = 3, c.n_kv_heads = 4, c.n_heads = 8;
    c.window = 8, c.stride = 8, c.local_window = 8;
    int64_t st[4] = {0, 2, 5, 7}, pl[12] = {0, 2, 4, 6, 3, 5, 7, 1, 6, 0, 1, 1};
    REQUIRE_OK(ps_config_set_grid_offsets(&c, st, 1, &err), &err);
    compare("staggered W8/S8 [0,2,5,7]", c, 150);
    REQUIRE_OK(ps_config_set_grid_offsets(&c, pl, 3, &err), &err);
    compare("per-layer W8/S8", c, 150);
    c.window = 6, c.stride = 3, c.local_window = 5;
    int64_t po[12] = {0, 1, 2, 0, 2, 2, 1, 0, 1, 0, 0, 2};
    REQUIRE_OK(ps_config_set_grid_offsets(&c, po, 3, &err), &err);
    c.payload = PS_PAYLOAD_SHARED;
    compare("per-layer W6/S3 LW5 shared payload", c, 97);
    c.payload = PS_PAYLOAD_PER_OFFSET;
    c.rope = false, c.qk_norm = false, c.gate = PS_GATE_UNIFORM;
    compare("per-layer W6/S3 no RoPE, no qk-norm, uniform gate", c, 61);
}

static void test_bad_inputs(void) {
    ps_config c = tu_config(PS_ATTN_COMPRESSED);
    ps_model m;
    tu_random_model(&m, &c, 1, 0.3f);
    ps_prefill p;
    ps_error err;
    CHECK_ERR(ps_prefill_create(&p, &m, 0, 8, &err), &err, "must be >= 1");
    CHECK_ERR(ps_prefill_create(&p, &m, c.max_seq_len + 1, 8, &err), &err, "max_seq_len");
    CHECK_OK(ps_prefill_create(&p, &m, 32, 8, &err), &err);
    int32_t tok[40] = {0};
    int64_t pos[1] = {40};
    float out[23];
    CHECK_ERR(ps_prefill_logits(&p, tok, 40, pos, 1, out, &err), &err, "40 tokens", "1..32");
    pos[0] = 31;
    tok[3] = 23;
    CHECK_ERR(ps_prefill_logits(&p, tok, 32, pos, 1, out, &err), &err, "token 23", "position 3");
    tok[3] = 0;
    pos[0] = 32;
    CHECK_ERR(ps_prefill_logits(&p, tok, 32, pos, 1, out, &err), &err, "position 32");
    ps_prefill_free(&p);
    ps_model_free(&m);
}

/* Compressed attention carries O(T / S) windows plus two short frames per layer: memory linear in T.
 * Full attention carries every key and value. */
static void test_memory_model(void) {
    ps_config c = tu_config(PS_ATTN_COMPRESSED);
    c.max_seq_len = 1 << 20;
    double a = ps_prefill_bytes(&c, 1 << 16, 1024), b = ps_prefill_bytes(&c, 1 << 17, 1024),
           e = ps_prefill_bytes(&c, 1 << 18, 1024);
    CHECK(b > a && fabs((e - b) - 2 * (b - a)) < 1e-6 * e, "compressed prefill memory is not linear in T: %g %g %g", a, b, e);
    ps_config f = tu_config(PS_ATTN_FULL);
    f.max_seq_len = 1 << 20;
    double fa = ps_prefill_bytes(&f, 1 << 16, 1024), fb = ps_prefill_bytes(&f, 1 << 17, 1024);
    /* full: keys and values of every position, every layer (2 · nkv · hd floats per position per layer),
     * plus the RoPE tables (hd floats per position) */
    double per_pos = (2.0 * (double)(f.n_kv_heads * f.head_dim * f.n_layers) + (double)f.head_dim) * 4;
    CHECK(fabs((fb - fa) - per_pos * (1 << 16)) < 1e-6 * fb, "full prefill memory per position %g, want %g",
          (fb - fa) / (1 << 16), per_pos);
}

/* Scoring from the answer rows alone (what long prompts use) equals scoring from the full logits. */
static void test_answer_rows(void) {
    ps_config c = tu_config(PS_ATTN_COMPRESSED);
    c.n_layers = 2, c.window = 4, c.stride = 4, c.local_window = 4;
    ps_model m;
    tu_random_model(&m, &c, 5, 0.5f);
    ps_task t = {.kind = PS_TASK_KV, .seq_len = 60, .n_keys = 8, .n_values = 8, .n_fillers = 5, .n_pairs = 3, .key_len = 1,
                 .value_len = 2, .gap_min = 0, .gap_max = 3, .query_gap = 2, .n_queries = 3};
    ps_batch b;
    ps_error err;
    CHECK_OK(ps_batch_alloc(&b, 4, t.seq_len, t.n_queries, &err), &err);
    CHECK(ps_task_generate(&t, 9, &b, NULL) == 0, "task generation");
    ps_acts a;
    CHECK_OK(ps_acts_create(&a, m.ctx, &c, b.B, b.T, false, &err), &err);
    CHECK_OK(ps_forward(&m, &a, b.tokens, NULL, &err), &err);
    int ok[12], ok2[12];
    double lp[12], lp2[12];
    ps_score_queries(&b, a.p.logits, c.vocab_size, ok, lp);
    ps_prefill p;
    CHECK_OK(ps_prefill_create(&p, &m, b.T, 16, &err), &err);
    int64_t pos[64];
    float rows[64 * 23];
    for (int64_t s = 0; s < b.B; s++) {
        int64_t n = ps_answer_rows(&b, s, pos);
        CHECK(n == 6, "sequence %lld has %lld answer rows, want 3 queries x 2", (long long)s, (long long)n);
        CHECK_OK(ps_prefill_logits(&p, b.tokens + s * b.T, b.T, pos, n, rows, &err), &err);
        ps_score_query_rows(&b, s, rows, c.vocab_size, ok2 + s * b.max_q, lp2 + s * b.max_q);
    }
    for (int i = 0; i < 12; i++)
        CHECK(ok[i] == ok2[i] && fabs(lp[i] - lp2[i]) < 1e-4 * (1 + fabs(lp[i])), "query %d: %d %.6f vs %d %.6f", i, ok[i],
              lp[i], ok2[i], lp2[i]);
    ps_prefill_free(&p);
    ps_acts_free(&a);
    ps_batch_free(&b);
    ps_model_free(&m);
}

int main(void) {
    test_equivalence();
    test_answer_rows();
    test_bad_inputs();
    test_memory_model();
    CHECK_DONE();
}
