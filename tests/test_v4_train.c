/* test_v4_train.c — the trainable V4 compressor (attention kind "channel", docs/training.md):
 *   - each backward op (slot layout, per-channel slot softmax, pooling, attention with sinks) against a
 *     plain double-precision loop written here from its definition, and the composed compressor and
 *     the attention against central finite differences of plain double forwards; the ops give the same
 *     bits with 1 and 2 threads;
 *   - the model: ps_forward against the independent reference (tests/ref_model.c) and every parameter
 *     tensor's gradient against finite differences of it (CSA and HCA, with and without rope / qk_norm,
 *     untied, a raw window shorter and longer than the rate);
 *   - the config (parse, round trip, errors), the parameter names, the hooks (gate_k is the per-channel
 *     gate [B, nW, S, hd], summing to 1 over the slots; v / cv / gate_v / pattern refused). */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "core/backward.h"
#include "check.h"
#include "core/config.h"
#include "core/cpu/cpu.h"
#include "core/forward.h"
#include "core/hooks.h"
#include "core/model.h"
#include "core/ops.h"
#include "ref_model.h"
#include "core/rng.h"
#include "testutil.h"

static ps_rng rng_;
static ps_ctx *ctx;

static float *randv(int64_t n, double sd) {
    float *x = malloc((size_t)(n ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++) x[i] = (float)(sd * ps_rng_normal(&rng_));
    return x;
}
static float *zerof(int64_t n) { return calloc((size_t)(n ? n : 1), sizeof(float)); }
static double *zerod(int64_t n) { return calloc((size_t)(n ? n : 1), sizeof(double)); }

static double rel_err(const float *a, const double *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (d > num) num = d;
        if (fabs(b[i]) > den) den = fabs(b[i]);
    }
    return den > 0 ? num / den : num;
}

#define OK(call) CHECK((call) == 0, "%s", ctx->err.msg)

/* slot s of window w: its token (-1 dead) and channel offset (plain restatement of SPEC-v4) */
static int64_t tok_of(int64_t w, int64_t s, int64_t m, int64_t d, int csa, int64_t *ch) {
    if (!csa) return *ch = 0, w * m + s;
    if (s < m) return *ch = 0, w == 0 ? -1 : (w - 1) * m + s;
    return *ch = d, w * m + s - m;
}

/* ---- the compressor: plain double forward pooled[b, w, i] from z, ape, kv ---- */
typedef struct {
    int64_t B, T, nW, m, d;
    int csa;
} cgeo;

static void comp_fwd_d(const cgeo *g, const double *z, const double *ape, const double *kv, double *pooled) {
    int64_t S = g->csa ? 2 * g->m : g->m, c = g->csa ? 2 : 1, d = g->d;
    for (int64_t b = 0; b < g->B; b++)
        for (int64_t w = 0; w < g->nW; w++)
            for (int64_t i = 0; i < d; i++) {
                double mx = -1e300, sum = 0, acc = 0;
                for (int64_t s = 0; s < S; s++) {
                    int64_t ch, t = tok_of(w, s, g->m, d, g->csa, &ch);
                    if (t < 0) continue;
                    double zz = z[(b * g->T + t) * c * d + ch + i] + ape[(s % g->m) * c * d + ch + i];
                    mx = zz > mx ? zz : mx;
                }
                for (int64_t s = 0; s < S; s++) {
                    int64_t ch, t = tok_of(w, s, g->m, d, g->csa, &ch);
                    if (t < 0) continue;
                    double e = exp(z[(b * g->T + t) * c * d + ch + i] + ape[(s % g->m) * c * d + ch + i] - mx);
                    sum += e;
                    acc += e * kv[(b * g->T + t) * c * d + ch + i];
                }
                pooled[(b * g->nW + w) * d + i] = acc / sum;
            }
}

static double dotd(const double *a, const float *r, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += a[i] * r[i];
    return s;
}

/* the composed compressor backward (slot layout -> softmax -> pool) against finite differences of the
 * double forward, and each op against its plain loop */
static void test_compressor(int csa, int64_t B, int64_t T, int64_t m, int64_t d) {
    cgeo g = {B, T, T / m, m, d, csa};
    int64_t nW = g.nW, S = csa ? 2 * m : m, c = csa ? 2 : 1, nz = B * T * c * d, na = m * c * d, np = B * nW * d;
    float *z = randv(nz, 1.0), *ape = randv(na, 0.7), *kv = randv(nz, 1.0), *R = randv(np, 1.0);
    float *gate = zerof(B * nW * S * d), *alpha = zerof(B * nW * S * d), *pooled = zerof(np);
    OK(ps_v4_comp_slots(ctx, gate, z, ape, B, T, nW, m, d, csa));
    OK(ps_v4_slot_softmax(ctx, alpha, gate, B * nW, S, d));
    OK(ps_v4_comp_pool(ctx, pooled, alpha, kv, B, T, nW, m, d, csa));
    /* backward of loss = Σ R·pooled */
    float *dalpha = zerof(B * nW * S * d), *dkv = randv(nz, 9.0), *dgate = zerof(B * nW * S * d), *dz = randv(nz, 9.0);
    float *dape = zerof(na);
    for (int64_t i = 0; i < na; i++) dape[i] = 0.25f; /* += */
    OK(ps_v4_comp_pool_backward(ctx, dalpha, dkv, R, alpha, kv, B, T, nW, m, d, csa));
    OK(ps_v4_slot_softmax_backward(ctx, dgate, dalpha, alpha, B * nW, S, d));
    OK(ps_v4_comp_slots_backward(ctx, dz, dape, dgate, B, T, nW, m, d, csa));
    /* plain loops of each op */
    double *w_dalpha = zerod(B * nW * S * d), *w_dkv = zerod(nz), *w_dgate = zerod(B * nW * S * d), *w_dz = zerod(nz),
           *w_dape = zerod(na);
    for (int64_t i = 0; i < na; i++) w_dape[i] = 0.25;
    for (int64_t b = 0; b < B; b++)
        for (int64_t w = 0; w < nW; w++)
            for (int64_t i = 0; i < d; i++) {
                double dot = 0;
                int64_t gw = (b * nW + w) * S;
                for (int64_t s = 0; s < S; s++) {
                    int64_t ch, t = tok_of(w, s, m, d, csa, &ch);
                    if (t < 0) continue;
                    w_dalpha[(gw + s) * d + i] = (double)R[(b * nW + w) * d + i] * kv[(b * T + t) * c * d + ch + i];
                    w_dkv[(b * T + t) * c * d + ch + i] += (double)alpha[(gw + s) * d + i] * R[(b * nW + w) * d + i];
                    dot += (double)alpha[(gw + s) * d + i] * dalpha[(gw + s) * d + i];
                }
                for (int64_t s = 0; s < S; s++) {
                    int64_t ch, t = tok_of(w, s, m, d, csa, &ch);
                    if (t < 0) continue;
                    double gg = alpha[(gw + s) * d + i] * (dalpha[(gw + s) * d + i] - dot);
                    w_dgate[(gw + s) * d + i] = gg;
                    w_dz[(b * T + t) * c * d + ch + i] += dgate[(gw + s) * d + i];
                    w_dape[(s % m) * c * d + ch + i] += dgate[(gw + s) * d + i];
                }
            }
    const char *nm = csa ? "CSA" : "HCA";
    CHECK(rel_err(dalpha, w_dalpha, B * nW * S * d) < 1e-6, "%s comp_pool_backward dalpha %.3g", nm, rel_err(dalpha, w_dalpha, B * nW * S * d));
    CHECK(rel_err(dkv, w_dkv, nz) < 1e-6, "%s comp_pool_backward dkv %.3g", nm, rel_err(dkv, w_dkv, nz));
    CHECK(rel_err(dgate, w_dgate, B * nW * S * d) < 1e-5, "%s slot_softmax_backward %.3g", nm, rel_err(dgate, w_dgate, B * nW * S * d));
    CHECK(rel_err(dz, w_dz, nz) < 1e-6, "%s comp_slots_backward dz %.3g", nm, rel_err(dz, w_dz, nz));
    CHECK(rel_err(dape, w_dape, na) < 1e-5, "%s comp_slots_backward dape %.3g", nm, rel_err(dape, w_dape, na));
    /* finite differences of the double forward */
    double *zd = zerod(nz), *ad = zerod(na), *kd = zerod(nz), *pd = zerod(np);
    for (int64_t i = 0; i < nz; i++) zd[i] = z[i], kd[i] = kv[i];
    for (int64_t i = 0; i < na; i++) ad[i] = ape[i];
    double worst = 0, h = 1e-5;
    struct { double *x; const float *grad; int64_t n; double off; } vars[] = {{zd, dz, nz, 0}, {ad, dape, na, 0.25}, {kd, dkv, nz, 0}};
    for (int v = 0; v < 3; v++)
        for (int k = 0; k < 12; k++) {
            int64_t j = ps_rng_below(&rng_, vars[v].n);
            double keep = vars[v].x[j];
            vars[v].x[j] = keep + h;
            comp_fwd_d(&g, zd, ad, kd, pd);
            double up = dotd(pd, R, np);
            vars[v].x[j] = keep - h;
            comp_fwd_d(&g, zd, ad, kd, pd);
            double dn = dotd(pd, R, np);
            vars[v].x[j] = keep;
            double fd = (up - dn) / (2 * h), an = vars[v].grad[j] - vars[v].off;
            worst = fmax(worst, fabs(fd - an) / fmax(1.0, fabs(fd)));
        }
    CHECK(worst < 1e-4, "%s compressor gradient vs finite differences: %.3g", nm, worst);
    /* thread-count independence */
    float *dz2 = zerof(nz), *dape2 = zerof(na), *dk2 = zerof(nz), *da2 = zerof(B * nW * S * d);
    for (int64_t i = 0; i < na; i++) dape2[i] = 0.25f;
    omp_set_num_threads(1);
    OK(ps_v4_comp_pool_backward(ctx, da2, dk2, R, alpha, kv, B, T, nW, m, d, csa));
    OK(ps_v4_comp_slots_backward(ctx, dz2, dape2, dgate, B, T, nW, m, d, csa));
    omp_set_num_threads(2);
    CHECK(!memcmp(dz, dz2, (size_t)nz * 4) && !memcmp(dape, dape2, (size_t)na * 4) && !memcmp(dkv, dk2, (size_t)nz * 4) &&
              !memcmp(dalpha, da2, (size_t)(B * nW * S * d) * 4),
          "%s compressor backward: 1 and 2 threads differ", nm);
    free(z), free(ape), free(kv), free(R), free(gate), free(alpha), free(pooled), free(dalpha), free(dkv), free(dgate), free(dz), free(dape);
    free(w_dalpha), free(w_dkv), free(w_dgate), free(w_dz), free(w_dape), free(zd), free(ad), free(kd), free(pd);
    free(dz2), free(dape2), free(dk2), free(da2);
}

/* ---- attention with a sink: plain double forward ---- */
static void attn_fwd_d(const ps_v4_attn_geom *g, const double *q, const double *kv, const double *ckv, const double *sink,
                       double *out) {
    int64_t B = g->B, T = g->T, H = g->H, Dh = g->Dh;
    double sc[4096];
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++)
            for (int64_t h = 0; h < H; h++) {
                const double *qh = q + ((b * T + t) * H + h) * Dh;
                const double *key[4096];
                int64_t n = 0, nv = g->m > 0 ? (t + 1) / g->m : 0;
                if (nv > g->nW) nv = g->nW;
                for (int64_t j = t - g->W + 1 < 0 ? 0 : t - g->W + 1; j <= t; j++) key[n++] = kv + (b * T + j) * Dh;
                for (int64_t w = 0; w < nv; w++) key[n++] = ckv + (b * g->nW + w) * Dh;
                double mx = sink[h], sum = 0;
                for (int64_t i = 0; i < n; i++) {
                    double s = 0;
                    for (int64_t e = 0; e < Dh; e++) s += qh[e] * key[i][e];
                    sc[i] = s * g->scale;
                    mx = sc[i] > mx ? sc[i] : mx;
                }
                sum = exp(sink[h] - mx);
                for (int64_t i = 0; i < n; i++) sum += (sc[i] = exp(sc[i] - mx));
                double *o = out + ((b * T + t) * H + h) * Dh;
                for (int64_t e = 0; e < Dh; e++) o[e] = 0;
                for (int64_t i = 0; i < n; i++)
                    for (int64_t e = 0; e < Dh; e++) o[e] += sc[i] / sum * key[i][e];
            }
}

static void test_attention(int64_t B, int64_t T, int64_t H, int64_t Dh, int64_t W, int64_t m) {
    int64_t nW = m > 0 ? T / m : 0, nq = B * T * H * Dh, nk = B * T * Dh, nc = B * nW * Dh;
    ps_v4_attn_geom g = {.B = B, .T = T, .H = H, .Dh = Dh, .nW = nW, .K = 0, .W = W, .m = m, .scale = (float)(1 / sqrt((double)Dh))};
    float *q = randv(nq, 1.0), *kv = randv(nk, 1.0), *ckv = randv(nc, 1.0), *sink = randv(H, 1.0), *R = randv(nq, 1.0);
    float *out = zerof(nq), *dq = randv(nq, 5.0), *dkv = zerof(nk), *dckv = zerof(nc), *dsink = zerof(H);
    OK(ps_v4_attn(ctx, out, NULL, q, kv, nW ? ckv : NULL, NULL, sink, &g));
    for (int64_t i = 0; i < nk; i++) dkv[i] = 0.5f; /* += */
    OK(ps_v4_attn_backward(ctx, dq, dkv, nW ? dckv : NULL, dsink, R, out, q, kv, nW ? ckv : NULL, sink, &g));
    double *qd = zerod(nq), *kd = zerod(nk), *cd = zerod(nc), *sd = zerod(H), *od = zerod(nq);
    for (int64_t i = 0; i < nq; i++) qd[i] = q[i];
    for (int64_t i = 0; i < nk; i++) kd[i] = kv[i];
    for (int64_t i = 0; i < nc; i++) cd[i] = ckv[i];
    for (int64_t i = 0; i < H; i++) sd[i] = sink[i];
    attn_fwd_d(&g, qd, kd, cd, sd, od);
    CHECK(rel_err(out, od, nq) < 1e-5, "attention forward vs plain loop %.3g", rel_err(out, od, nq));
    double worst = 0, h = 1e-5;
    struct { double *x; const float *grad; int64_t n; double off; } vars[] = {{qd, dq, nq, 0}, {kd, dkv, nk, 0.5}, {cd, dckv, nc, 0}, {sd, dsink, H, 0}};
    for (int v = 0; v < 4; v++) {
        if (!vars[v].n) continue;
        for (int k = 0; k < 10; k++) {
            int64_t j = ps_rng_below(&rng_, vars[v].n);
            double keep = vars[v].x[j];
            vars[v].x[j] = keep + h;
            attn_fwd_d(&g, qd, kd, cd, sd, od);
            double up = dotd(od, R, nq);
            vars[v].x[j] = keep - h;
            attn_fwd_d(&g, qd, kd, cd, sd, od);
            double dn = dotd(od, R, nq);
            vars[v].x[j] = keep;
            double fd = (up - dn) / (2 * h), an = vars[v].grad[j] - vars[v].off;
            double e = fabs(fd - an) / fmax(1.0, fabs(fd));
            if (e > worst) worst = e;
        }
    }
    CHECK(worst < 2e-4, "attention backward (T %lld, W %lld, m %lld) vs finite differences: %.3g", (long long)T, (long long)W,
          (long long)m, worst);
    /* the same bits with one thread */
    float *dq2 = zerof(nq), *dkv2 = zerof(nk), *dckv2 = zerof(nc), *dsink2 = zerof(H);
    for (int64_t i = 0; i < nk; i++) dkv2[i] = 0.5f;
    omp_set_num_threads(1);
    OK(ps_v4_attn_backward(ctx, dq2, dkv2, nW ? dckv2 : NULL, dsink2, R, out, q, kv, nW ? ckv : NULL, sink, &g));
    omp_set_num_threads(2);
    CHECK(!memcmp(dq, dq2, (size_t)nq * 4) && !memcmp(dkv, dkv2, (size_t)nk * 4) && !memcmp(dckv, dckv2, (size_t)(nc ? nc : 1) * 4) &&
              !memcmp(dsink, dsink2, (size_t)H * 4),
          "attention backward: 1 and 2 threads differ");
    /* the indexer's selection has no backward */
    ps_v4_attn_geom gk = g;
    gk.K = 2;
    CHECK(ps_v4_attn_backward(ctx, dq2, dkv2, dckv2, dsink2, R, out, q, kv, ckv, sink, &gk) != 0 && strstr(ctx->err.msg, "no backward"),
          "K > 0 refused: %s", ctx->err.msg);
    ps_error e2;
    ps_ctx_check(ctx, &e2);
    free(q), free(kv), free(ckv), free(sink), free(R), free(out), free(dq), free(dkv), free(dckv), free(dsink);
    free(qd), free(kd), free(cd), free(sd), free(od), free(dq2), free(dkv2), free(dckv2), free(dsink2);
}

/* ---- the model ---- */

static ps_config v4_config(int csa, int64_t rate, int64_t lw) {
    ps_config c = tu_config(PS_ATTN_CHANNEL);
    c.n_layers = 2;
    c.d_model = 8;
    c.head_dim = 4;
    c.d_ff = 12;
    c.vocab_size = 11;
    c.n_heads = 3;
    c.n_kv_heads = 1;
    c.rate = rate;
    c.v4_mode = csa ? PS_V4_MODE_CSA : PS_V4_MODE_HCA;
    c.local_window = lw;
    return c;
}

/* logits, loss and gradients against the reference (central finite differences, testutil.h) */
static void fd_model(const char *label, ps_config c, uint64_t seed) {
    CHECK_TALLY(tu_fd_model(label, c, seed, 17, NULL, ref_forward_user, NULL));
}

static void test_model_grads(void) {
    fd_model("v4 CSA m4 LW3", v4_config(1, 4, 3), 100);
    fd_model("v4 HCA m4 LW6", v4_config(0, 4, 6), 200);
    fd_model("v4 CSA m3 LW1", v4_config(1, 3, 1), 300);
    ps_config c = v4_config(1, 2, 5);
    c.rope = false, c.qk_norm = false, c.tie_embeddings = false;
    fd_model("v4 CSA m2 no-rope no-qknorm untied", c, 400);
    c = v4_config(0, 8, 4);
    fd_model("v4 HCA m8 (2 windows in T = 17)", c, 500);
}

/* ---- config, names, hooks ---- */

static void test_config_and_names(void) {
    ps_error err;
    ps_config c, c2;
    const char *txt = "{\"vocab_size\": 20, \"d_model\": 16, \"n_layers\": 1, \"n_heads\": 2, \"n_kv_heads\": 1, \"head_dim\": 8,"
                      " \"d_ff\": 32, \"max_seq_len\": 64, \"attention\": {\"kind\": \"v4\", \"rate\": 4, \"mode\": \"hca\"}}";
    CHECK_OK(ps_config_parse(txt, strlen(txt), "c.json", &c, &err), &err);
    CHECK(c.kind == PS_ATTN_CHANNEL && c.rate == 4 && c.v4_mode == PS_V4_MODE_HCA && c.local_window == 4, "parsed v4 config");
    CHECK(ps_config_n_windows(&c, 17) == 4 && ps_config_v4_slots(&c) == 4, "windows / slots");
    char *js = ps_config_to_json(&c);
    CHECK(js && strstr(js, "\"kind\": \"channel\"") && strstr(js, "\"rate\": 4") && strstr(js, "\"mode\": \"hca\"") && !strstr(js, "stride"),
          "canonical JSON: %s", js);
    CHECK_OK(ps_config_parse(js, strlen(js), "rt", &c2, &err), &err);
    CHECK(!memcmp(&c, &c2, sizeof c), "round trip changed the v4 config");
    free(js);
    struct { const char *att; const char *want; } bad[] = {
        {"{\"kind\": \"v4\", \"rate\": 4, \"window\": 8}", "does not apply to kind \"channel\""},
        {"{\"kind\": \"compressed\", \"rate\": 4}", "applies to kind \"channel\" only"},
        {"{\"kind\": \"v4\", \"rate\": 0}", "attention.rate"},
        {"{\"kind\": \"v4\", \"mode\": \"nsa\"}", "attention.mode"},
        {"{\"kind\": \"sparse\"}", "\"full\", \"compressed\", \"channel\" or \"select\""},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char t[512];
        snprintf(t, sizeof t, "{\"vocab_size\": 20, \"d_model\": 16, \"n_layers\": 1, \"n_heads\": 2, \"n_kv_heads\": 1, \"head_dim\": 8,"
                              " \"d_ff\": 32, \"max_seq_len\": 64, \"attention\": %s}", bad[i].att);
        CHECK_ERR(ps_config_parse(t, strlen(t), "b.json", &c2, &err), &err, "b.json", bad[i].want);
    }
    const char *gqa = "{\"vocab_size\": 20, \"d_model\": 16, \"n_layers\": 1, \"n_heads\": 2, \"n_kv_heads\": 2, \"head_dim\": 8,"
                      " \"d_ff\": 32, \"max_seq_len\": 64, \"attention\": {\"kind\": \"v4\"}}";
    CHECK_ERR(ps_config_parse(gqa, strlen(gqa), "g.json", &c2, &err), &err, "n_kv_heads", "one K=V head");
    /* parameter names (SPEC-v4's transformers names) and shapes */
    ps_config v = v4_config(1, 4, 4);
    ps_model m;
    CHECK_OK(ps_model_create(&m, &v, &err), &err);
    struct { const char *name; int64_t a, b; } want[] = {
        {"model.layers.0.self_attn.kv_proj.weight", 4, 8},
        {"model.layers.0.self_attn.kv_norm.weight", 4, 0},
        {"model.layers.1.self_attn.compressor.kv_proj.weight", 8, 8},
        {"model.layers.1.self_attn.compressor.gate_proj.weight", 8, 8},
        {"model.layers.1.self_attn.compressor.position_bias", 4, 8},
        {"model.layers.0.self_attn.compressor.kv_norm.weight", 4, 0},
        {"model.layers.0.self_attn.sinks", 3, 0},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const ps_param_info *p = ps_model_find(&m, want[i].name);
        CHECK(p && p->shape[0] == want[i].a && (want[i].b == 0 ? p->ndim == 1 : p->shape[1] == want[i].b), "tensor %s", want[i].name);
    }
    CHECK(!ps_model_find(&m, "model.layers.0.self_attn.v_proj.weight") && !ps_model_find(&m, "model.layers.0.self_attn.k_proj.weight"),
          "no v_proj / k_proj (K = V)");
    /* init: gates and sinks 0 (uniform start), the compressor norm 1 */
    ps_model_init(&m, 7);
    ps_layer_params w = ps_model_layer(&m, m.params, 0);
    CHECK(w.c_ape[0] == 0 && w.c_wgate[3] == 0 && w.sinks[1] == 0 && w.c_norm[2] == 1 && w.c_wkv[5] != 0, "init");
    ps_model_free(&m);
}

typedef struct {
    int calls;
    double worst;
    int64_t shape[4];
} gate_seen;

static int gate_cb(const ps_hook_event *ev, void *user, ps_error *err) {
    (void)err;
    gate_seen *g = user;
    g->calls++;
    memcpy(g->shape, ev->shape, sizeof g->shape);
    int64_t nW = ev->shape[0] * ev->shape[1], S = ev->shape[2], d = ev->shape[3];
    for (int64_t w = 0; w < nW; w++)
        for (int64_t i = 0; i < d; i++) {
            double s = 0;
            for (int64_t k = 0; k < S; k++) s += ev->data[(w * S + k) * d + i];
            g->worst = fmax(g->worst, fabs(s - 1));
        }
    return 0;
}

static void test_hooks(void) {
    ps_config c = v4_config(1, 4, 4);
    ps_model m;
    tu_random_model(&m, &c, 9, 0.5f);
    ps_hooks h;
    ps_hooks_init(&h);
    ps_error err;
    gate_seen gs = {0};
    CHECK_OK(ps_hooks_add(&h, &c, "blocks.1.attn.hook_gate_k", gate_cb, &gs, &err), &err);
    CHECK_ERR(ps_hooks_add(&h, &c, "blocks.0.attn.hook_v", gate_cb, &gs, &err), &err, "K = V");
    CHECK_ERR(ps_hooks_add(&h, &c, "blocks.0.attn.hook_cv", gate_cb, &gs, &err), &err, "K = V");
    CHECK_ERR(ps_hooks_add(&h, &c, "blocks.0.attn.hook_gate_v", gate_cb, &gs, &err), &err, "hook_gate_k");
    CHECK_ERR(ps_hooks_add(&h, &c, "blocks.0.attn.hook_pattern", gate_cb, &gs, &err), &err, "not available");
    int64_t shp[4];
    CHECK(ps_hook_shape(&c, PS_HOOK_GATE_K, 2, 18, shp) == 4 && shp[1] == 4 && shp[2] == 8 && shp[3] == 4, "gate_k shape");
    enum { B = 2, T = 18 };
    int32_t tok[B * T];
    tu_random_tokens(tok, B * T, c.vocab_size, 3);
    ps_acts a;
    CHECK_OK(ps_acts_create(&a, m.ctx, &c, B, T, false, &err), &err);
    CHECK_OK(ps_forward(&m, &a, tok, &h, &err), &err);
    CHECK(gs.calls == 1 && gs.shape[0] == B && gs.shape[1] == T / 4 && gs.shape[2] == 8 && gs.shape[3] == 4 && gs.worst < 1e-5,
          "gate hook: %d calls, [%lld %lld %lld %lld], sum error %.3g", gs.calls, (long long)gs.shape[0], (long long)gs.shape[1],
          (long long)gs.shape[2], (long long)gs.shape[3], gs.worst);
    ps_acts_free(&a);
    ps_hooks_free(&h);
    ps_model_free(&m);
}

int main(void) {
    ps_error err;
    ps_rng_seed(&rng_, 42);
    omp_set_num_threads(2);
    if (ps_ctx_create(&ctx, "cpu", &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    test_compressor(1, 2, 19, 4, 5);
    test_compressor(0, 2, 19, 4, 5);
    test_compressor(1, 1, 7, 3, 3);
    test_attention(2, 13, 3, 4, 4, 4);
    test_attention(1, 17, 2, 4, 20, 3);
    test_attention(2, 9, 2, 4, 3, 0);
    test_model_grads();
    test_config_and_names();
    test_hooks();
    ps_ctx_free(ctx);
    CHECK_DONE();
}
