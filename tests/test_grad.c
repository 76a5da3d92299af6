/* test_grad.c — the backward pass: every parameter tensor of every config variant against central
 * finite differences of the independent double-precision reference forward (tests/ref_model.c), and
 * the shared conformance gradients (loss and every tensor, relative error < 1e-3). */
#include <stdlib.h>
#include <string.h>

#include "core/backward.h"
#include "check.h"
#include "core/forward.h"
#include "core/model.h"
#include "ref_model.h"
#include "core/rng.h"
#include "core/safetensors.h"
#include "testutil.h"
#include "core/tokens.h"

/* the model's loss and gradients against the reference by central finite differences (testutil.h) */
static void fd_check(const char *label, ps_config c, uint64_t seed) {
    CHECK_TALLY(tu_fd_model(label, c, seed, 17, NULL, ref_forward_user, NULL));
}

static void test_finite_differences(void) {
    struct { const char *name; int kind, W, S, LW, gate, payload, rope, qkn, tie; int64_t nh, nkv; } v[] = {
        {"full GQA", PS_ATTN_FULL, 0, 0, 0, 0, 0, 1, 1, 1, 4, 2},
        {"full untied no-rope no-qknorm", PS_ATTN_FULL, 0, 0, 0, 0, 0, 0, 0, 0, 4, 4},
        {"compressed W4/S4", PS_ATTN_COMPRESSED, 4, 4, 4, PS_GATE_LEARNED, PS_PAYLOAD_PER_OFFSET, 1, 1, 1, 4, 2},
        {"compressed W4/S2 overlap LW3", PS_ATTN_COMPRESSED, 4, 2, 3, PS_GATE_LEARNED, PS_PAYLOAD_PER_OFFSET, 1, 1, 1, 4, 2},
        {"compressed W5/S3 LW2 shared", PS_ATTN_COMPRESSED, 5, 3, 2, PS_GATE_LEARNED, PS_PAYLOAD_SHARED, 1, 1, 1, 4, 2},
        {"compressed uniform gate", PS_ATTN_COMPRESSED, 4, 2, 4, PS_GATE_UNIFORM, PS_PAYLOAD_PER_OFFSET, 1, 1, 1, 4, 2},
        {"compressed no-rope no-qknorm untied", PS_ATTN_COMPRESSED, 4, 4, 4, PS_GATE_LEARNED, PS_PAYLOAD_PER_OFFSET, 0, 0, 0, 2, 1},
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        ps_config c = tu_config((ps_attn_kind)v[i].kind);
        c.n_layers = 2;
        c.d_model = 8;
        c.head_dim = 4;
        c.d_ff = 12;
        c.vocab_size = 11;
        if (v[i].kind == PS_ATTN_COMPRESSED) {
            c.window = v[i].W; c.stride = v[i].S; c.local_window = v[i].LW;
            c.gate = (ps_gate_kind)v[i].gate; c.payload = (ps_payload_kind)v[i].payload;
        }
        c.rope = v[i].rope; c.qk_norm = v[i].qkn; c.tie_embeddings = v[i].tie;
        c.n_heads = v[i].nh; c.n_kv_heads = v[i].nkv;
        fd_check(v[i].name, c, 1000 + i * 11);
    }
}

static void test_conformance_grads(const char *name) {
    char dir[2048], path[4096];
    snprintf(dir, sizeof dir, "%s/%s", tu_conformance_dir(), name);
    ps_error err;
    ps_model m;
    ps_token_lists toks, tg;
    ps_st_file ref;
    REQUIRE_OK(ps_model_load(&m, dir, &err), &err);
    snprintf(path, sizeof path, "%s/tokens.json", dir);
    REQUIRE_OK(ps_tokens_load(path, 0, 0, &toks, &err), &err);
    snprintf(path, sizeof path, "%s/targets.json", dir);
    REQUIRE_OK(ps_tokens_load(path, 1, -1, &tg, &err), &err);
    snprintf(path, sizeof path, "%s/expected_grad.safetensors", dir);
    REQUIRE_OK(ps_st_open(path, &ref, &err), &err);
    int64_t total = 0;
    for (int s = 0; s < tg.n; s++)
        for (int64_t t = 0; t < tg.len[s]; t++) total += tg.seq[s][t] >= 0;
    float *grads = calloc((size_t)m.n_params, sizeof(float));
    double loss = 0;
    int64_t cnt = 0;
    for (int s = 0; s < toks.n; s++) {
        ps_acts a, g;
        CHECK_OK(ps_acts_create(&a, m.ctx, &m.cfg, 1, toks.len[s], true, &err), &err);
        CHECK_OK(ps_acts_create(&g, m.ctx, &m.cfg, 1, toks.len[s], false, &err), &err);
        CHECK_OK(ps_forward(&m, &a, toks.seq[s], NULL, &err), &err);
        CHECK_OK(ps_backward(&m, &a, &g, toks.seq[s], tg.seq[s], 1.0f / (float)total, grads, &loss, &cnt, &err), &err);
        ps_acts_free(&a);
        ps_acts_free(&g);
    }
    float lossf = (float)(loss / (double)cnt), want;
    ps_st_read_f32(&ref, ps_st_find(&ref, "loss"), &want, &err);
    CHECK(fabs(lossf - want) < 1e-5 * fabs(want), "%s: loss %g vs %g", name, lossf, want);
    for (int i = 0; i < m.n_tensors; i++) {
        const ps_param_info *p = &m.table[i];
        const ps_st_entry *e = ps_st_find(&ref, p->name);
        CHECK(e && ps_st_numel(e) == p->numel, "%s: reference gradient %s missing", name, p->name);
        if (!e) continue;
        float *w = malloc((size_t)p->numel * sizeof(float));
        ps_st_read_f32(&ref, e, w, &err);
        double r = rel_err_f(grads + p->offset, w, p->numel);
        CHECK(r < 1e-3, "%s: gradient of %s rel err %.3g", name, p->name, r);
        free(w);
    }
    free(grads);
    ps_st_close(&ref);
    ps_tokens_free(&toks);
    ps_tokens_free(&tg);
    ps_model_free(&m);
}

/* Logits at chosen rows only (rows mode): the same logits at those rows, and the same loss and gradients
 * as the full pass when the targets sit on those rows; a target off the rows is an error. */
static void test_rows_mode(ps_attn_kind kind) {
    ps_config c = tu_config(kind);
    c.n_layers = 2;
    if (kind == PS_ATTN_COMPRESSED) c.window = 4, c.stride = 4, c.local_window = 4;
    enum { B = 2, T = 19 };
    ps_model m;
    tu_random_model(&m, &c, 4, 0.5f);
    int32_t tok[B * T], tgt[B * T];
    tu_random_tokens(tok, B * T, c.vocab_size, 5);
    int64_t rows[] = {3, 7, 8, 18, T + 0, T + 11, T + 18};
    int64_t n = sizeof rows / sizeof rows[0];
    for (int i = 0; i < B * T; i++) tgt[i] = -1;
    for (int64_t i = 0; i < n; i++) tgt[rows[i]] = (int32_t)((rows[i] * 5) % c.vocab_size);
    ps_acts a, g, ar, gr;
    ps_error err;
    CHECK_OK(ps_acts_create(&a, m.ctx, &c, B, T, true, &err), &err);
    CHECK_OK(ps_acts_create(&g, m.ctx, &c, B, T, false, &err), &err);
    CHECK_OK(ps_acts_create_rows(&ar, m.ctx, &c, B, T, true, 8, &err), &err);
    CHECK_OK(ps_acts_create_rows(&gr, m.ctx, &c, B, T, false, 8, &err), &err);
    CHECK_OK(ps_acts_set_rows(&ar, rows, n, &err), &err);
    CHECK_OK(ps_forward(&m, &a, tok, NULL, &err), &err);
    CHECK_OK(ps_forward(&m, &ar, tok, NULL, &err), &err);
    int64_t V = c.vocab_size;
    double worst = 0;
    for (int64_t i = 0; i < n; i++)
        for (int64_t v = 0; v < V; v++) worst = fmax(worst, fabs(ar.p.logits[i * V + v] - a.p.logits[rows[i] * V + v]));
    CHECK(worst < 1e-5, "rows mode: logits differ by %.3g", worst);
    float *g1 = calloc((size_t)m.n_params, sizeof(float)), *g2 = calloc((size_t)m.n_params, sizeof(float));
    double l1 = 0, l2 = 0;
    int64_t c1 = 0, c2 = 0;
    CHECK_OK(ps_backward(&m, &a, &g, tok, tgt, 0.25f, g1, &l1, &c1, &err), &err);
    CHECK_OK(ps_backward(&m, &ar, &gr, tok, tgt, 0.25f, g2, &l2, &c2, &err), &err);
    double num = 0, den = 0;
    for (int64_t j = 0; j < m.n_params; j++) {
        num = fmax(num, fabs((double)g1[j] - g2[j]));
        den = fmax(den, fabs((double)g1[j]));
    }
    CHECK(c1 == n && c2 == n && fabs(l1 - l2) < 1e-5 * fabs(l1), "rows mode: loss %.9g (%lld) vs %.9g (%lld)", l2,
          (long long)c2, l1, (long long)c1);
    CHECK(num / den < 1e-5, "rows mode: gradients differ (rel %.3g)", num / den);
    tgt[5] = 1; /* a target without a logit row */
    CHECK_ERR(ps_backward(&m, &ar, &gr, tok, tgt, 0.25f, g2, &l2, &c2, &err), &err, "position 5", "no logit row");
    int64_t bad = B * T;
    CHECK_ERR(ps_acts_set_rows(&ar, &bad, 1, &err), &err, "outside");
    CHECK_ERR(ps_acts_set_rows(&ar, rows, 9, &err), &err, "at most 8");
    free(g1), free(g2);
    ps_acts_free(&a), ps_acts_free(&g), ps_acts_free(&ar), ps_acts_free(&gr);
    ps_model_free(&m);
}

int main(void) {
    test_rows_mode(PS_ATTN_FULL);
    test_rows_mode(PS_ATTN_COMPRESSED);
    test_finite_differences();
    test_conformance_grads("full_gqa");
    test_conformance_grads("compressed_w8s8");
    test_conformance_grads("compressed_w6s3_overlap");
    CHECK_DONE();
}
