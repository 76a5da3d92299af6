/* test_forward.c — the forward pass against an independent double-precision plain-loop reference
 * (every config variant), hand-checkable invariants (causality, window visibility, mean pooling, GQA
 * mapping, RoPE relativity) and batching. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/forward.h"
#include "core/hooks.h"
#include "core/ops.h"
#include "ref_model.h"
#include "core/rng.h"
#include "testutil.h"

static int run(const ps_model *m, const int32_t *tok, int64_t B, int64_t T, const ps_hooks *h, float *logits) {
    ps_acts a;
    ps_error err;
    if (ps_acts_create(&a, m->ctx, &m->cfg, B, T, false, &err) || ps_forward(m, &a, tok, h, &err)) {
        fprintf(stderr, "forward failed: %s\n", err.msg);
        return -1;
    }
    memcpy(logits, a.p.logits, (size_t)(B * T * m->cfg.vocab_size) * sizeof(float));
    ps_acts_free(&a);
    return 0;
}

static void compare_reference(const char *label, ps_config c, int T, uint64_t seed) {
    ps_model m;
    tu_random_model(&m, &c, seed, 0.4f);
    int32_t tok[64];
    tu_random_tokens(tok, T, c.vocab_size, seed + 1);
    float *got = malloc((size_t)T * c.vocab_size * sizeof(float));
    double *ref = malloc((size_t)T * c.vocab_size * sizeof(double));
    float *reff = malloc((size_t)T * c.vocab_size * sizeof(float));
    CHECK(run(&m, tok, 1, T, NULL, got) == 0, "%s", label);
    ref_forward(&m, tok, T, ref);
    for (int64_t i = 0; i < T * c.vocab_size; i++) reff[i] = (float)ref[i];
    double e = rel_err_f(got, reff, T * c.vocab_size);
    CHECK(e < 1e-5, "%s: logits rel err %.3g vs the plain-loop reference", label, e);
    free(got);
    free(ref);
    free(reff);
    ps_model_free(&m);
}

static void test_reference_variants(void) {
    ps_config c;
    /* hand-sized: 1 layer, T <= 4 */
    c = tu_config(PS_ATTN_FULL);
    for (int T = 1; T <= 4; T++) compare_reference("full 1-layer tiny", c, T, 10 + T);
    c = tu_config(PS_ATTN_COMPRESSED);
    c.window = 2; c.stride = 2; c.local_window = 1;
    for (int T = 1; T <= 4; T++) compare_reference("compressed W2/S2/LW1 tiny", c, T, 20 + T);
    /* every variant on longer sequences, 2 layers */
    struct { const char *name; int W, S, LW, gate, payload, rope, qkn, tie, kind; int64_t nh, nkv; } v[] = {
        {"full GQA", 0, 0, 0, 0, 0, 1, 1, 1, PS_ATTN_FULL, 4, 2},
        {"full MHA untied no-rope", 0, 0, 0, 0, 0, 0, 1, 0, PS_ATTN_FULL, 4, 4},
        {"full MQA no-qknorm", 0, 0, 0, 0, 0, 1, 0, 1, PS_ATTN_FULL, 4, 1},
        {"W8/S8", 8, 8, 8, PS_GATE_LEARNED, PS_PAYLOAD_PER_OFFSET, 1, 1, 1, PS_ATTN_COMPRESSED, 4, 2},
        {"W4/S2 overlap", 4, 2, 4, PS_GATE_LEARNED, PS_PAYLOAD_PER_OFFSET, 1, 1, 1, PS_ATTN_COMPRESSED, 4, 2},
        {"W6/S3 LW2 (< S)", 6, 3, 2, PS_GATE_LEARNED, PS_PAYLOAD_PER_OFFSET, 1, 1, 1, PS_ATTN_COMPRESSED, 4, 2},
        {"W4/S1", 4, 1, 3, PS_GATE_LEARNED, PS_PAYLOAD_PER_OFFSET, 1, 1, 1, PS_ATTN_COMPRESSED, 4, 2},
        {"W5/S5 LW 40", 5, 5, 40, PS_GATE_LEARNED, PS_PAYLOAD_PER_OFFSET, 1, 1, 1, PS_ATTN_COMPRESSED, 4, 2},
        {"uniform gate", 4, 4, 4, PS_GATE_UNIFORM, PS_PAYLOAD_PER_OFFSET, 1, 1, 1, PS_ATTN_COMPRESSED, 4, 2},
        {"shared payload", 4, 4, 4, PS_GATE_LEARNED, PS_PAYLOAD_SHARED, 1, 1, 1, PS_ATTN_COMPRESSED, 4, 2},
        {"uniform+shared no-rope", 4, 2, 4, PS_GATE_UNIFORM, PS_PAYLOAD_SHARED, 0, 1, 1, PS_ATTN_COMPRESSED, 4, 2},
        {"no qk-norm untied MHA", 4, 4, 4, PS_GATE_LEARNED, PS_PAYLOAD_PER_OFFSET, 1, 0, 0, PS_ATTN_COMPRESSED, 2, 2},
        {"W1/S1", 1, 1, 1, PS_GATE_LEARNED, PS_PAYLOAD_PER_OFFSET, 1, 1, 1, PS_ATTN_COMPRESSED, 4, 2},
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        c = tu_config((ps_attn_kind)v[i].kind);
        c.n_layers = 2;
        if (v[i].kind == PS_ATTN_COMPRESSED) {
            c.window = v[i].W; c.stride = v[i].S; c.local_window = v[i].LW;
            c.gate = (ps_gate_kind)v[i].gate; c.payload = (ps_payload_kind)v[i].payload;
        }
        c.rope = v[i].rope; c.qk_norm = v[i].qkn; c.tie_embeddings = v[i].tie;
        c.n_heads = v[i].nh; c.n_kv_heads = v[i].nkv;
        for (int T = 1; T <= 37; T += 9) compare_reference(v[i].name, c, T, 100 + i * 7 + (uint64_t)T);
    }
}

/* Changing token p never changes logits before p. */
static void test_causality(ps_config c, const char *label) {
    ps_model m;
    tu_random_model(&m, &c, 5, 0.4f);
    enum { T = 30 };
    int32_t tok[T], tok2[T];
    float a[T * 23], b[T * 23];
    tu_random_tokens(tok, T, c.vocab_size, 6);
    run(&m, tok, 1, T, NULL, a);
    for (int p = 0; p < T; p += 7) {
        memcpy(tok2, tok, sizeof tok);
        tok2[p] = (tok[p] + 1) % (int32_t)c.vocab_size;
        run(&m, tok2, 1, T, NULL, b);
        int before_same = memcmp(a, b, (size_t)p * 23 * sizeof(float)) == 0;
        int at_changed = memcmp(a + p * 23, b + p * 23, 23 * sizeof(float)) != 0;
        CHECK(before_same && at_changed, "%s: token %d changed earlier logits (%d) or not its own (%d)", label, p,
              !before_same, !at_changed);
    }
    ps_model_free(&m);
}

/* 1-layer model: logits at t depend on token p only if p is t, inside the raw local window, or inside
 * a window that ended by t. */
static void test_window_visibility(int W, int S, int LW) {
    ps_config c = tu_config(PS_ATTN_COMPRESSED);
    c.window = W; c.stride = S; c.local_window = LW;
    ps_model m;
    tu_random_model(&m, &c, 7, 0.4f);
    enum { T = 26 };
    int32_t tok[T], tok2[T];
    float a[T * 23], b[T * 23];
    tu_random_tokens(tok, T, c.vocab_size, 8);
    run(&m, tok, 1, T, NULL, a);
    int bad = 0;
    for (int p = 0; p < T; p++) {
        memcpy(tok2, tok, sizeof tok);
        tok2[p] = (tok[p] + 3) % (int32_t)c.vocab_size;
        run(&m, tok2, 1, T, NULL, b);
        for (int t = p; t < T; t++) {
            int visible = t == p || p > t - LW;
            for (int j = 0; j * S + W - 1 <= t; j++)
                if (p >= j * S && p <= j * S + W - 1) visible = 1;
            int changed = memcmp(a + t * 23, b + t * 23, 23 * sizeof(float)) != 0;
            if (visible != changed) bad++;
        }
    }
    CHECK(bad == 0, "W%d/S%d/LW%d: %d (token, query) pairs disagree with the visibility rule", W, S, LW, bad);
    ps_model_free(&m);
}

/* hook_pattern never gives weight to an unseen entry. */
static int pattern_check(const ps_hook_event *ev, void *user, ps_error *err) {
    (void)err;
    int *p = user; /* W, S, LW, bad */
    int64_t nh = ev->shape[1], T = ev->shape[2], cols = ev->shape[3], nW = cols - T;
    for (int64_t n = 0; n < nh; n++)
        for (int64_t t = 0; t < T; t++) {
            const float *row = ev->data + (n * T + t) * cols;
            double s = 0;
            for (int64_t col = 0; col < cols; col++) {
                int vis = col < nW ? col * p[1] + p[0] - 1 <= t : (col - nW <= t && col - nW > t - p[2]);
                if (!vis && row[col] != 0.0f) p[3]++;
                s += row[col];
            }
            if (fabs(s - 1.0) > 1e-5) p[3]++;
        }
    return 0;
}

static void test_pattern_visibility(int W, int S, int LW) {
    ps_config c = tu_config(PS_ATTN_COMPRESSED);
    c.window = W; c.stride = S; c.local_window = LW; c.n_layers = 2;
    ps_model m;
    tu_random_model(&m, &c, 9, 0.4f);
    int32_t tok[40];
    float lg[40 * 23];
    tu_random_tokens(tok, 40, c.vocab_size, 10);
    ps_hooks h;
    ps_hooks_init(&h);
    int st[4] = {W, S, LW, 0};
    ps_error err;
    CHECK_OK(ps_hooks_add(&h, &c, "blocks.1.attn.hook_pattern", pattern_check, st, &err), &err);
    run(&m, tok, 1, 40, &h, lg);
    CHECK(st[3] == 0, "W%d/S%d/LW%d: %d pattern rows/entries break visibility or do not sum to 1", W, S, LW, st[3]);
    ps_hooks_free(&h);
    ps_model_free(&m);
}

/* Uniform gate + shared payload: cv = mean over the window of C a_t. */
typedef struct { float *resid, *cv; } pool_cap;
static int cap_resid(const ps_hook_event *ev, void *u, ps_error *e) {
    (void)e;
    pool_cap *c = u;
    memcpy(c->resid, ev->data, (size_t)(ev->shape[0] * ev->shape[1] * ev->shape[2]) * sizeof(float));
    return 0;
}
static int cap_cv(const ps_hook_event *ev, void *u, ps_error *e) {
    (void)e;
    pool_cap *c = u;
    memcpy(c->cv, ev->data, (size_t)(ev->shape[0] * ev->shape[1] * ev->shape[2] * ev->shape[3]) * sizeof(float));
    return 0;
}

static void test_mean_pooling(void) {
    ps_config c = tu_config(PS_ATTN_COMPRESSED);
    c.gate = PS_GATE_UNIFORM; c.payload = PS_PAYLOAD_SHARED; c.window = 5; c.stride = 3;
    ps_model m;
    tu_random_model(&m, &c, 11, 0.4f);
    enum { T = 20 };
    int32_t tok[T];
    tu_random_tokens(tok, T, c.vocab_size, 12);
    int64_t nW = ps_config_n_windows(&c, T), d = c.d_model, kvhd = c.n_kv_heads * c.head_dim;
    float resid[T * 16], cv[16 * 8], lg[T * 23];
    pool_cap cap = {resid, cv};
    ps_hooks h;
    ps_hooks_init(&h);
    ps_error err;
    CHECK_OK(ps_hooks_add(&h, &c, "blocks.0.hook_resid_pre", cap_resid, &cap, &err), &err);
    CHECK_OK(ps_hooks_add(&h, &c, "blocks.0.attn.hook_cv", cap_cv, &cap, &err), &err);
    run(&m, tok, 1, T, &h, lg);
    ps_layer_params w = ps_model_layer(&m, m.params, 0);
    double worst = 0;
    for (int64_t j = 0; j < nW; j++)
        for (int64_t r = 0; r < kvhd; r++) {
            double mean = 0;
            for (int64_t i = 0; i < c.window; i++) {
                const float *x = resid + (j * c.stride + i) * d;
                double ss = 0, dot = 0;
                for (int64_t e = 0; e < d; e++) ss += (double)x[e] * x[e];
                double rs = 1.0 / sqrt(ss / d + c.rms_eps);
                for (int64_t e = 0; e < d; e++) dot += (double)w.value_payload[r * d + e] * x[e] * rs * w.in_norm[e];
                mean += dot / (double)c.window;
            }
            double diff = fabs(mean - cv[j * kvhd + r]);
            if (diff > worst) worst = diff;
        }
    CHECK(nW == 6 && worst < 1e-5, "uniform gate + shared payload != mean pooling (nW %lld, err %g)", (long long)nW, worst);
    ps_hooks_free(&h);
    ps_model_free(&m);
}

/* GQA: with KV head 1's value projection zeroed, query heads 2 and 3 (group 1) output zero, heads 0
 * and 1 do not. */
static int cap_z(const ps_hook_event *ev, void *u, ps_error *e) {
    (void)e;
    memcpy(u, ev->data, (size_t)(ev->shape[1] * ev->shape[2] * ev->shape[3]) * sizeof(float));
    return 0;
}

static void test_gqa_mapping(ps_attn_kind kind) {
    ps_config c = tu_config(kind);
    ps_model m;
    tu_random_model(&m, &c, 13, 0.4f);
    ps_layer_params w = ps_model_layer(&m, m.params, 0);
    int64_t hd = c.head_dim, d = c.d_model;
    memset(w.wv + 1 * hd * d, 0, (size_t)(hd * d) * sizeof(float));
    if (w.value_payload)
        for (int64_t i = 0; i < c.window; i++) memset(w.value_payload + (i * 2 + 1) * hd * d, 0, (size_t)(hd * d) * sizeof(float));
    enum { T = 12 };
    int32_t tok[T];
    float z[T * 16], lg[T * 23];
    tu_random_tokens(tok, T, c.vocab_size, 14);
    ps_hooks h;
    ps_hooks_init(&h);
    ps_error err;
    CHECK_OK(ps_hooks_add(&h, &c, "blocks.0.attn.hook_z", cap_z, z, &err), &err);
    run(&m, tok, 1, T, &h, lg);
    double nz[4] = {0};
    for (int t = 0; t < T; t++)
        for (int n = 0; n < 4; n++)
            for (int e = 0; e < hd; e++) nz[n] += fabs(z[(t * 4 + n) * hd + e]);
    CHECK(nz[0] > 0 && nz[1] > 0 && nz[2] == 0 && nz[3] == 0, "%s: head outputs |z| = %g %g %g %g",
          kind == PS_ATTN_FULL ? "full" : "compressed", nz[0], nz[1], nz[2], nz[3]);
    ps_hooks_free(&h);
    ps_model_free(&m);
}

/* RoPE: <R(p) q, R(p') k> depends only on p - p'. */
static void test_rope_relative(void) {
    enum { hd = 8, NP = 300 };
    float *cs = malloc(NP * hd / 2 * sizeof(float)), *sn = malloc(NP * hd / 2 * sizeof(float));
    ps_ctx *ctx;
    ps_error err;
    CHECK_OK(ps_ctx_create(&ctx, "cpu", &err), &err);
    ps_rope_table(ctx, cs, sn, NP, hd, 10000.0);
    ps_rng r;
    ps_rng_seed(&r, 3);
    float q0[hd], k0[hd];
    for (int i = 0; i < hd; i++) {
        q0[i] = (float)ps_rng_normal(&r);
        k0[i] = (float)ps_rng_normal(&r);
    }
    double worst = 0;
    for (int p = 0; p < 5; p++)
        for (int shift = 1; shift < 280; shift += 37) {
            float qa[hd], ka[hd], qb[hd], kb[hd];
            float *x[4] = {qa, ka, qb, kb};
            int pos[4] = {p + 7, p, p + 7 + shift, p + shift};
            for (int v = 0; v < 4; v++) {
                float buf[NP * hd];
                memset(buf, 0, sizeof buf);
                memcpy(buf + pos[v] * hd, v % 2 ? k0 : q0, sizeof q0);
                ps_rope(ctx, buf, cs, sn, 1, NP, 1, hd, 1);
                memcpy(x[v], buf + pos[v] * hd, sizeof q0);
            }
            double sa = 0, sb = 0;
            for (int i = 0; i < hd; i++) {
                sa += qa[i] * ka[i];
                sb += qb[i] * kb[i];
            }
            if (fabs(sa - sb) > worst) worst = fabs(sa - sb);
        }
    CHECK(worst < 1e-4, "RoPE scores depend on absolute position: worst diff %g", worst);
    ps_ctx_free(ctx);
    free(cs);
    free(sn);
}

/* A batch of 3 sequences gives the same logits as three single runs. */
static void test_batch(ps_attn_kind kind) {
    ps_config c = tu_config(kind);
    c.n_layers = 2;
    ps_model m;
    tu_random_model(&m, &c, 15, 0.4f);
    enum { T = 19, B = 3 };
    int32_t tok[B * T];
    tu_random_tokens(tok, B * T, c.vocab_size, 16);
    float all[B * T * 23], one[T * 23];
    run(&m, tok, B, T, NULL, all);
    double worst = 0;
    for (int b = 0; b < B; b++) {
        run(&m, tok + b * T, 1, T, NULL, one);
        double e = rel_err_f(all + b * T * 23, one, T * 23);
        if (e > worst) worst = e;
    }
    CHECK(worst < 1e-6, "batched != single (%g)", worst);
    ps_model_free(&m);
}

/* Restarting at layer l from the kept residual stream gives the same logits as a full pass, with or
 * without an intervention hook on layer l (how a knockout grid reuses the layers below). */
static int scale_hook(const ps_hook_event *ev, void *u, ps_error *e) {
    (void)u; (void)e;
    int64_t n = ev->shape[0] * ev->shape[1] * ev->shape[2] * ev->shape[3];
    for (int64_t i = 0; i < n; i++) ev->data[i] *= 0.5f;
    return 0;
}

static void test_forward_from(void) {
    ps_config c = tu_config(PS_ATTN_COMPRESSED);
    c.n_layers = 3;
    ps_model m;
    tu_random_model(&m, &c, 17, 0.4f);
    enum { T = 21 };
    int32_t tok[T];
    tu_random_tokens(tok, T, c.vocab_size, 18);
    ps_error err;
    ps_acts a;
    ps_hooks h;
    ps_hooks_init(&h);
    CHECK_OK(ps_hooks_add(&h, &c, "blocks.2.attn.hook_cv", scale_hook, NULL, &err), &err);
    float full[T * 23], hooked[T * 23];
    CHECK_OK(ps_acts_create(&a, m.ctx, &c, 1, T, false, &err), &err);
    CHECK_OK(ps_forward(&m, &a, tok, &h, &err), &err);
    memcpy(hooked, a.p.logits, sizeof hooked);
    CHECK_OK(ps_forward(&m, &a, tok, NULL, &err), &err);
    memcpy(full, a.p.logits, sizeof full);
    for (int l = 0; l <= 3; l++) {
        CHECK_OK(ps_forward_from(&m, &a, l, NULL, &err), &err);
        CHECK(memcmp(a.p.logits, full, sizeof full) == 0, "forward_from(%d) differs from the full pass", l);
    }
    CHECK_OK(ps_forward_from(&m, &a, 2, &h, &err), &err);
    CHECK(memcmp(a.p.logits, hooked, sizeof hooked) == 0, "forward_from(2) with a hook differs");
    CHECK(memcmp(hooked, full, sizeof full) != 0, "the hook had no effect");
    CHECK_ERR(ps_forward_from(&m, &a, 4, NULL, &err), &err, "layer 4", "3 layers");
    ps_acts_free(&a);
    /* from the attention of a layer, reusing its kept q/k/v/ck/cv (keep_all), and scoring chosen rows only */
    CHECK_OK(ps_acts_create(&a, m.ctx, &c, 1, T, true, &err), &err);
    CHECK_OK(ps_forward(&m, &a, tok, NULL, &err), &err);
    for (int l = 0; l < 3; l++) {
        CHECK_OK(ps_forward_from_attention(&m, &a, l, NULL, &err), &err);
        CHECK(memcmp(a.p.logits, full, sizeof full) == 0, "forward_from_attention(%d) differs from the full pass", l);
        int64_t rows[3] = {0, 7, T - 1};
        memset(a.p.logits, 0, sizeof full);
        CHECK_OK(ps_forward_from_attention_rows(&m, &a, l, NULL, rows, 3, &err), &err);
        CHECK(rel_err_f(a.p.logits + 7 * 23, full + 7 * 23, 23) < 1e-5 && rel_err_f(a.p.logits, full, 23) < 1e-5 &&
                  rel_err_f(a.p.logits + (T - 1) * 23, full + (T - 1) * 23, 23) < 1e-5,
              "forward_from_attention_rows(%d): chosen rows differ", l);
    }
    ps_acts_free(&a);
    CHECK_OK(ps_acts_create(&a, m.ctx, &c, 1, T, false, &err), &err);
    CHECK_ERR(ps_forward_from_attention(&m, &a, 1, NULL, &err), &err, "activations of every layer");
    ps_acts_free(&a);
    ps_hooks_free(&h);
    ps_model_free(&m);
}

static void test_bad_tokens(void) {
    ps_config c = tu_config(PS_ATTN_FULL);
    ps_model m;
    tu_random_model(&m, &c, 1, 0.1f);
    ps_acts a;
    ps_error err;
    int32_t tok[3] = {0, 23, 1};
    CHECK_OK(ps_acts_create(&a, m.ctx, &c, 1, 3, false, &err), &err);
    CHECK_ERR(ps_forward(&m, &a, tok, NULL, &err), &err, "token 23", "position 1", "vocabulary");
    ps_acts_free(&a);
    CHECK_ERR(ps_acts_create(&a, m.ctx, &c, 1, 70, false, &err), &err, "max_seq_len 64", "by 6");
    ps_model_free(&m);
}

int main(void) {
    test_reference_variants();
    test_causality(tu_config(PS_ATTN_FULL), "full");
    ps_config cc = tu_config(PS_ATTN_COMPRESSED);
    cc.n_layers = 2;
    test_causality(cc, "compressed");
    cc.window = 6; cc.stride = 2; cc.local_window = 3;
    test_causality(cc, "compressed overlap");
    test_window_visibility(4, 4, 4);
    test_window_visibility(4, 4, 2);
    test_window_visibility(6, 3, 4);
    test_window_visibility(5, 2, 1);
    test_pattern_visibility(4, 4, 4);
    test_pattern_visibility(6, 3, 2);
    test_mean_pooling();
    test_gqa_mapping(PS_ATTN_FULL);
    test_gqa_mapping(PS_ATTN_COMPRESSED);
    test_rope_relative();
    test_batch(PS_ATTN_FULL);
    test_batch(PS_ATTN_COMPRESSED);
    test_bad_tokens();
    test_forward_from();
    CHECK_DONE();
}
