/* test_chunks.c — content-defined chunk boundaries (attention.boundaries "content", docs/mitigations.md §4)
 * against numbers computed another way: the config keys (defaults, round trip, base configs unchanged,
 * every bad value), the chunker against a plain loop written from the doc's rule (its own hash and its own
 * threshold), the measured entries per token against the expected 1/S, the chunk ops on a table of equal
 * chunks against the base grid ops, the forward against a plain-loop double reference with explicit chunk
 * lists (ref_forward_chunks below), the backward against its central finite differences on every
 * parameter kind, hooks (shapes, absent chunks zero, a read-only pattern hook), the answer-row restart,
 * the knockout grid's batched path against its naive one, and the errors. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/backward.h"
#include "core/chunks.h"
#include "core/config.h"
#include "core/forward.h"
#include "core/hooks.h"
#include "core/model.h"
#include "core/ops.h"
#include "core/rng.h"
#include "interventions/knockout.h"
#include "tasks/tasks.h"
#include "testutil.h"

static ps_config chunk_cfg(int64_t W, int64_t S, int64_t m, int64_t nh, int64_t nkv) {
    ps_config c = tu_config(PS_ATTN_COMPRESSED);
    c.n_layers = 2;
    c.d_model = 8;
    c.head_dim = 4;
    c.d_ff = 12;
    c.vocab_size = 11;
    c.window = W;
    c.stride = S;
    c.local_window = W;
    c.n_heads = nh;
    c.n_kv_heads = nkv;
    c.boundaries = PS_BOUNDARIES_CONTENT;
    c.chunk_min = m;
    return c;
}

/* ---- the chunker, written again from docs/mitigations.md §4 ---- */

static uint32_t ref_hash(int32_t prev, int32_t cur) {
    uint32_t u = (uint32_t)cur * 2654435761u + (uint32_t)(prev + 1) * 2246822519u + 668265263u;
    u ^= u >> 16;
    u *= 2246822507u;
    u ^= u >> 13;
    u *= 3266489909u;
    u ^= u >> 16;
    return u;
}

/* θ: the q with m + Σ_{k=1}^{W-m} (1-q)^k = S, by 100 bisection steps on the closed form of the sum */
static uint64_t ref_threshold(int m, int W, int S) {
    double lo = 0, hi = 1;
    for (int it = 0; it < 100; it++) {
        double q = (lo + hi) / 2, r = 1 - q;
        double e = m + (q > 0 ? r * (1 - pow(r, W - m)) / q : (double)(W - m));
        if (e > S) lo = q;
        else hi = q;
    }
    return (uint64_t)floor((lo + hi) / 2 * 4294967296.0 + 0.5);
}

/* the chunks of tok[0..T) as (start, length) pairs; returns their count */
static int ref_chunks(const int32_t *tok, int T, int m, int W, int S, int *st, int *ln) {
    uint64_t th = ref_threshold(m, W, S);
    int n = 0, s = 0;
    for (int t = 0; t < T; t++) {
        int len = t - s + 1;
        int cut = len >= W || (len >= m && ref_hash(t ? tok[t - 1] : -1, tok[t]) < th);
        if (cut) st[n] = s, ln[n] = len, n++, s = t + 1;
    }
    return n;
}

/* ---- the plain-loop reference forward with explicit chunks ---- */

static void rms(double *o, const double *x, const float *w, int n, double eps) {
    double s = 0;
    for (int i = 0; i < n; i++) s += x[i] * x[i];
    double r = 1.0 / sqrt(s / n + eps);
    for (int i = 0; i < n; i++) o[i] = x[i] * r * (w ? w[i] : 1.0);
}

static void rope(double *x, int hd, double p, double theta) {
    for (int i = 0; i < hd / 2; i++) {
        double ang = p * pow(theta, -2.0 * i / hd), c = cos(ang), s = sin(ang);
        double a = x[i], b = x[i + hd / 2];
        x[i] = a * c - b * s;
        x[i + hd / 2] = b * c + a * s;
    }
}

static void mv(double *y, const float *Wm, const double *x, int rows, int cols) {
    for (int r = 0; r < rows; r++) {
        double s = 0;
        for (int c = 0; c < cols; c++) s += (double)Wm[(int64_t)r * cols + c] * x[c];
        y[r] = s;
    }
}

/* SPEC §2 with the windows replaced by the chunks (st[j], ln[j]), j < n: gate softmax over offsets
 * 0..ln-1, compressed key rotated by R(st), seen by query t when st + ln - 1 <= t. */
static void ref_forward_chunks(const ps_model *m, const int32_t *tok, int T, const int *st, const int *ln, int n,
                               double *logits) {
    const ps_config *c = &m->cfg;
    int d = (int)c->d_model, hd = (int)c->head_dim, nh = (int)c->n_heads, nkv = (int)c->n_kv_heads, F = (int)c->d_ff;
    int LW = (int)c->local_window, V = (int)c->vocab_size;
    double eps = c->rms_eps;
    double *h = calloc((size_t)T * d, 8), *a = calloc((size_t)T * d, 8);
    double *q = calloc((size_t)T * nh * hd, 8), *k = calloc((size_t)T * nkv * hd, 8), *v = calloc((size_t)T * nkv * hd, 8);
    double *ck = calloc((size_t)(n + 1) * nkv * hd, 8), *cv = calloc((size_t)(n + 1) * nkv * hd, 8);
    double *z = calloc((size_t)nh * hd, 8), *tmp = calloc((size_t)(d > F ? d : F) * 4 + nkv * hd * 2, 8);
    double *sc = calloc((size_t)(n + T + 1), 8);
    const float *E = ps_model_embed(m, m->params);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < d; i++) h[t * d + i] = E[(int64_t)tok[t] * d + i];
    for (int l = 0; l < c->n_layers; l++) {
        ps_layer_params w = ps_model_layer(m, m->params, l);
        for (int t = 0; t < T; t++) rms(a + t * d, h + t * d, w.in_norm, d, eps);
        for (int t = 0; t < T; t++) {
            mv(q + t * nh * hd, w.wq, a + t * d, nh * hd, d);
            mv(k + t * nkv * hd, w.wk, a + t * d, nkv * hd, d);
            mv(v + t * nkv * hd, w.wv, a + t * d, nkv * hd, d);
            for (int hh = 0; hh < nh; hh++) {
                if (c->qk_norm) rms(q + (t * nh + hh) * hd, q + (t * nh + hh) * hd, w.qnorm, hd, eps);
                if (c->rope) rope(q + (t * nh + hh) * hd, hd, t, c->rope_theta);
            }
            for (int g = 0; g < nkv; g++) {
                if (c->qk_norm) rms(k + (t * nkv + g) * hd, k + (t * nkv + g) * hd, w.knorm, hd, eps);
                if (c->rope) rope(k + (t * nkv + g) * hd, hd, t, c->rope_theta);
            }
        }
        for (int j = 0; j < n; j++)
            for (int br = 0; br < 2; br++) {
                const float *U = br ? w.value_gate_w : w.key_gate_w, *Cb = br ? w.value_gate_b : w.key_gate_b;
                const float *P = br ? w.value_payload : w.key_payload;
                double *out = br ? cv : ck;
                int p0 = st[j], L = ln[j];
                for (int g = 0; g < nkv; g++) {
                    double zl[64], al[64], mx = -1e300, sum = 0;
                    for (int i = 0; i < L; i++) {
                        zl[i] = 0;
                        if (c->gate == PS_GATE_LEARNED) {
                            zl[i] = Cb[i * nkv + g];
                            for (int e = 0; e < d; e++) zl[i] += (double)U[((int64_t)i * nkv + g) * d + e] * a[(p0 + i) * d + e];
                        }
                        if (zl[i] > mx) mx = zl[i];
                    }
                    for (int i = 0; i < L; i++) sum += (al[i] = exp(zl[i] - mx));
                    double *o = out + (j * nkv + g) * hd;
                    memset(o, 0, (size_t)hd * 8);
                    for (int i = 0; i < L; i++) {
                        const float *Ci = c->payload == PS_PAYLOAD_SHARED ? P : P + (int64_t)i * nkv * hd * d;
                        mv(tmp, Ci + (int64_t)g * hd * d, a + (p0 + i) * d, hd, d);
                        for (int e = 0; e < hd; e++) o[e] += al[i] / sum * tmp[e];
                    }
                    if (!br) {
                        if (c->qk_norm) rms(o, o, w.knorm, hd, eps);
                        if (c->rope) rope(o, hd, (double)p0, c->rope_theta);
                    }
                }
            }
        for (int t = 0; t < T; t++) {
            for (int hh = 0; hh < nh; hh++) {
                int g = hh / (nh / nkv), ns = 0;
                const double *qt = q + (t * nh + hh) * hd;
                double mx = -1e300;
                int jmax = 0;
                for (int j = 0; j < n; j++)
                    if (st[j] + ln[j] - 1 <= t) jmax = j + 1;
                int lo = t - LW + 1 > 0 ? t - LW + 1 : 0;
                for (int j = 0; j < jmax; j++) {
                    double s = 0;
                    for (int e = 0; e < hd; e++) s += qt[e] * ck[(j * nkv + g) * hd + e];
                    sc[ns++] = s / sqrt(hd);
                }
                for (int tp = lo; tp <= t; tp++) {
                    double s = 0;
                    for (int e = 0; e < hd; e++) s += qt[e] * k[(tp * nkv + g) * hd + e];
                    sc[ns++] = s / sqrt(hd);
                }
                double sum = 0;
                for (int i = 0; i < ns; i++) mx = sc[i] > mx ? sc[i] : mx;
                for (int i = 0; i < ns; i++) sum += (sc[i] = exp(sc[i] - mx));
                double *zn = z + hh * hd;
                memset(zn, 0, (size_t)hd * 8);
                int i = 0;
                for (int j = 0; j < jmax; j++, i++)
                    for (int e = 0; e < hd; e++) zn[e] += sc[i] / sum * cv[(j * nkv + g) * hd + e];
                for (int tp = lo; tp <= t; tp++, i++)
                    for (int e = 0; e < hd; e++) zn[e] += sc[i] / sum * v[(tp * nkv + g) * hd + e];
            }
            mv(tmp, w.wo, z, d, nh * hd);
            for (int i = 0; i < d; i++) h[t * d + i] += tmp[i];
        }
        for (int t = 0; t < T; t++) {
            double *mm = tmp, *gg = tmp + d, *uu = tmp + d + F;
            rms(mm, h + t * d, w.post_norm, d, eps);
            mv(gg, w.mlp_gate, mm, F, d);
            mv(uu, w.mlp_up, mm, F, d);
            for (int i = 0; i < F; i++) gg[i] = gg[i] / (1 + exp(-gg[i])) * uu[i];
            mv(mm, w.mlp_down, gg, d, F);
            for (int i = 0; i < d; i++) h[t * d + i] += mm[i];
        }
    }
    const float *H = ps_model_lm_head(m, m->params);
    for (int t = 0; t < T; t++) {
        rms(a + t * d, h + t * d, ps_model_final_norm(m, m->params), d, eps);
        mv(logits + (int64_t)t * V, H, a + t * d, V, d);
    }
    free(h); free(a); free(q); free(k); free(v); free(ck); free(cv); free(z); free(tmp); free(sc);
}

static void ref_forward_content(const ps_model *m, const int32_t *tok, int T, double *logits) {
    const ps_config *c = &m->cfg;
    int st[512], ln[512];
    int n = ref_chunks(tok, T, (int)c->chunk_min, (int)c->window, (int)c->stride, st, ln);
    ref_forward_chunks(m, tok, T, st, ln, n, logits);
}

/* ---- config ---- */

static void test_config(void) {
    const char *base = "{\"vocab_size\": 16, \"d_model\": 8, \"n_layers\": 1, \"n_heads\": 4, \"n_kv_heads\": 4, "
                       "\"head_dim\": 4, \"d_ff\": 8, \"max_seq_len\": 32, \"attention\": {\"kind\": \"compressed\", "
                       "\"window\": %d, \"stride\": 8%s}}";
    char buf[1024];
    ps_config c, c2;
    ps_error err;
    snprintf(buf, sizeof buf, base, 16, ", \"boundaries\": \"content\"");
    CHECK_OK(ps_config_parse(buf, strlen(buf), "x.json", &c, &err), &err);
    CHECK(c.boundaries == PS_BOUNDARIES_CONTENT && c.chunk_min == 4, "content, chunk_min defaults to S/2 (%lld)",
          (long long)c.chunk_min);
    CHECK(ps_config_n_windows(&c, 30) == 7 && ps_config_n_windows(&c, 3) == 0, "chunk axis floor(T / chunk_min)");
    char *js = ps_config_to_json(&c);
    CHECK_OK(ps_config_parse(js, strlen(js), "round trip", &c2, &err), &err);
    CHECK(memcmp(&c, &c2, sizeof c) == 0 && strstr(js, "\"chunk_min\": 4"), "round trip: %s", js);
    free(js);
    snprintf(buf, sizeof buf, base, 16, ", \"boundaries\": \"content\", \"chunk_min\": 2");
    CHECK_OK(ps_config_parse(buf, strlen(buf), "x.json", &c, &err), &err);
    CHECK(c.chunk_min == 2, "chunk_min given");
    /* "grid" and no key: the base model, whose canonical JSON (and hash) has no new key */
    snprintf(buf, sizeof buf, base, 8, ", \"boundaries\": \"grid\"");
    CHECK_OK(ps_config_parse(buf, strlen(buf), "x.json", &c, &err), &err);
    snprintf(buf, sizeof buf, base, 8, "");
    CHECK_OK(ps_config_parse(buf, strlen(buf), "x.json", &c2, &err), &err);
    js = ps_config_to_json(&c2);
    char h1[17], h2[17];
    ps_config_hash(&c, h1);
    ps_config_hash(&c2, h2);
    CHECK(memcmp(&c, &c2, sizeof c) == 0 && !strcmp(h1, h2) && !strstr(js, "boundaries") && !strstr(js, "chunk_min"),
          "grid boundaries are the base config");
    free(js);
    /* full attention ignores the key (SPEC §2) */
    const char *full = "{\"vocab_size\": 16, \"d_model\": 8, \"n_layers\": 1, \"n_heads\": 4, \"n_kv_heads\": 4, "
                       "\"head_dim\": 4, \"d_ff\": 8, \"max_seq_len\": 32, \"attention\": {\"kind\": \"full\", "
                       "\"boundaries\": \"content\"}}";
    CHECK_OK(ps_config_parse(full, strlen(full), "full.json", &c, &err), &err);
    CHECK(c.boundaries == PS_BOUNDARIES_GRID && c.chunk_min == 0, "full attention: boundaries ignored");
    struct {
        int W;
        const char *extra, *word;
    } bad[] = {{8, ", \"boundaries\": \"content\"", "attention.boundaries"},             /* S = W: the mean cannot be S */
               {16, ", \"boundaries\": \"content\", \"chunk_min\": 8", "chunk_min"}, /* chunk_min = S */
               {16, ", \"boundaries\": \"content\", \"chunk_min\": 0", "chunk_min"},
               {16, ", \"boundaries\": \"content\", \"chunk_min\": 2.5", "chunk_min"},
               {16, ", \"chunk_min\": 2", "chunk_min"},                               /* without content boundaries */
               {16, ", \"boundaries\": \"hash\"", "attention.boundaries"},
               {16, ", \"boundaries\": 1", "attention.boundaries"},
               {16, ", \"boundaries\": \"content\", \"head_offsets\": [0, 1, 2, 3]", "head_offsets"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(buf, sizeof buf, base, bad[i].W, bad[i].extra);
        CHECK_ERR(ps_config_parse(buf, strlen(buf), "bad.json", &c, &err), &err, "bad.json", bad[i].word);
    }
}

/* ---- the chunker ---- */

static void test_chunker(void) {
    ps_config c = chunk_cfg(16, 8, 4, 4, 2);
    CHECK(ps_chunk_threshold(&c) == ref_threshold(4, 16, 8), "threshold %llu vs plain loop %llu",
          (unsigned long long)ps_chunk_threshold(&c), (unsigned long long)ref_threshold(4, 16, 8));
    CHECK(fabs(ps_chunk_expected_len(&c) - 8.0) < 1e-6, "E[L] = S: %.9f", ps_chunk_expected_len(&c));
    for (int32_t a = -1; a < 40; a++)
        for (int32_t b = 0; b < 40; b++) CHECK(ps_chunk_hash(a, b) == ref_hash(a, b), "hash (%d, %d)", a, b);
    /* a long random sequence: the table against the plain loop, lengths in [m, W], entries per token ~ 1/S */
    enum { T = 200000 };
    int32_t *tok = malloc(T * sizeof *tok);
    tu_random_tokens(tok, T, 512, 77);
    int64_t nC = T / 4;
    int64_t *cs = malloc((size_t)nC * 8), *cl = malloc((size_t)nC * 8);
    int *st = malloc((size_t)nC * sizeof(int)), *ln = malloc((size_t)nC * sizeof(int));
    int64_t n = ps_content_chunks(&c, tok, T, nC, cs, cl);
    int nr = ref_chunks(tok, T, 4, 16, 8, st, ln);
    int same = n == nr, contiguous = 1, inrange = 1;
    for (int64_t j = 0; j < n && same; j++) {
        same &= cs[j] == st[j] && cl[j] == ln[j];
        contiguous &= cs[j] == (j ? cs[j - 1] + cl[j - 1] : 0);
        inrange &= cl[j] >= 4 && cl[j] <= 16;
    }
    CHECK(same && contiguous && inrange, "chunk table vs plain loop (%lld vs %d chunks)", (long long)n, nr);
    double per_tok = (double)n / T;
    CHECK(fabs(per_tok * 8 - 1) < 0.02, "measured entries per token %.5f, expected 1/S = %.5f", per_tok, 1.0 / 8);
    CHECK(cl[n] == 0 && cs[n] == 0, "absent chunks are (0, 0)");
    /* a constant run: every position has the same hash, so the chunks are all m or all W long */
    for (int t = 0; t < 100; t++) tok[t] = 5;
    n = ps_content_chunks(&c, tok, 100, nC, cs, cl);
    int allm = 1, allW = 1;
    for (int64_t j = 1; j < n; j++) allm &= cl[j] == 4, allW &= cl[j] == 16;
    CHECK(allm || allW, "a constant run gives equal chunks after the first");
    free(tok); free(cs); free(cl); free(st); free(ln);
}

/* ---- the chunk ops against the base ops on a table of equal chunks (W = S grid) ---- */

static void test_ops_match_grid(void) {
    ps_ctx *ctx;
    ps_error err;
    REQUIRE_OK(ps_ctx_create(&ctx, "cpu", &err), &err);
    enum { B = 2, T = 22, d = 6, W = 5, nkv = 2, hd = 4, nkvhd = nkv * hd, nW = T / W, nC = 7 };
    ps_rng r;
    ps_rng_seed(&r, 5);
    static float in[B * T * d], u[W * nkv * d], bias[W * nkv], C[W * nkvhd * d], Cs[nkvhd * d], scratch[B * T * nkvhd];
    for (size_t i = 0; i < sizeof in / sizeof *in; i++) in[i] = (float)ps_rng_normal(&r);
    for (size_t i = 0; i < sizeof u / sizeof *u; i++) u[i] = (float)ps_rng_normal(&r);
    for (size_t i = 0; i < sizeof bias / sizeof *bias; i++) bias[i] = (float)ps_rng_normal(&r);
    for (size_t i = 0; i < sizeof C / sizeof *C; i++) C[i] = (float)ps_rng_normal(&r);
    for (size_t i = 0; i < sizeof Cs / sizeof *Cs; i++) Cs[i] = (float)ps_rng_normal(&r);
    /* chunks (jW, W) for j < nW, then absent ones (the chunk axis longer than the grid's) */
    int64_t cs[B * nC], cl[B * nC];
    for (int b = 0; b < B; b++)
        for (int j = 0; j < nC; j++) cs[b * nC + j] = j < nW ? j * W : 0, cl[b * nC + j] = j < nW ? W : 0;
    static float z1[B * nW * nkv * W], a1[B * nW * nkv * W], z2[B * nC * nkv * W], a2[B * nC * nkv * W];
    static float p1[B * nW * W * nkvhd], p2[B * nC * W * nkvhd];
    int64_t gtab[2 * B * nW], ctab[2 * B * nC];
#define CHUNK_TABLE() ps_windows_chunks(ctab, ctab + B * nC, cs, cl, B, T, nC, W, nkv)
    ps_windows gw = ps_windows_grid(gtab, gtab + B * nW, B, T, nW, W, W, nkv, NULL), cw = CHUNK_TABLE();
    CHECK(ps_gate(ctx, z1, a1, in, u, bias, d, &gw) == 0, "gate");
    CHECK(ps_gate(ctx, z2, a2, in, u, bias, d, &cw) == 0, "gate over chunks");
    double worst = 0, absent = 0;
    for (int b = 0; b < B; b++)
        for (int j = 0; j < nC; j++)
            for (int k = 0; k < nkv * W; k++) {
                float v2 = a2[(b * nC + j) * nkv * W + k];
                if (j < nW) worst = fmax(worst, fabs(a1[(b * nW + j) * nkv * W + k] - v2));
                else absent += fabs(v2) + fabs(z2[(b * nC + j) * nkv * W + k]);
            }
    CHECK(worst < 1e-6 && absent == 0, "gate_chunks = gate on equal chunks (%g), absent 0 (%g)", worst, absent);
    for (int sh = 0; sh < 2; sh++) {
        const float *Cx = sh ? Cs : C;
        CHECK(ps_payload(ctx, p1, in, Cx, sh, scratch, d, hd, &gw) == 0, "payload");
        CHECK(ps_payload(ctx, p2, in, Cx, sh, scratch, d, hd, &cw) == 0, "payload over chunks");
        worst = 0, absent = 0;
        for (int b = 0; b < B; b++)
            for (int j = 0; j < nC; j++)
                for (int k = 0; k < W * nkvhd; k++) {
                    float v2 = p2[(b * nC + j) * W * nkvhd + k];
                    if (j < nW) worst = fmax(worst, fabs(p1[(b * nW + j) * W * nkvhd + k] - v2));
                    else absent += fabs(v2);
                }
        CHECK(worst < 1e-5 && absent == 0, "payload_chunks = payload (shared %d): %g, absent %g", sh, worst, absent);
    }
    /* a short chunk: the gate softmax runs over its L offsets, the rest 0 */
    cl[1] = 3;
    cw = CHUNK_TABLE();
    CHECK(ps_gate(ctx, z2, a2, in, u, bias, d, &cw) == 0, "gate over chunks, short");
    double s = 0, tail = 0;
    for (int i = 0; i < W; i++) *(i < 3 ? &s : &tail) += a2[(1 * nkv + 1) * W + i];
    CHECK(fabs(s - 1) < 1e-6 && tail == 0, "short chunk: alpha sums to 1 over its 3 offsets (%g), 0 beyond (%g)", s, tail);
    /* rope_chunks = rope with pos_step W on the equal chunks; inverse undoes it */
    int64_t nc1 = B * nW * nkv * hd;
    static float cos_t[T * hd / 2], sin_t[T * hd / 2], x1[B * nW * nkv * hd], x2[B * nC * nkv * hd], x0[B * nC * nkv * hd];
    cl[1] = W;
    cw = CHUNK_TABLE();
    CHECK(ps_rope_table(ctx, cos_t, sin_t, T, hd, 10000.0) == 0, "rope table");
    for (int64_t i = 0; i < B * nC * nkv * hd; i++) x0[i] = x2[i] = (float)ps_rng_normal(&r);
    for (int b = 0; b < B; b++) memcpy(x1 + b * nW * nkv * hd, x0 + b * nC * nkv * hd, (size_t)nW * nkv * hd * 4);
    ps_rope(ctx, x1, cos_t, sin_t, B, nW, nkv, hd, W);
    ps_rope_windows(ctx, x2, cos_t, sin_t, hd, &cw, 0);
    worst = 0;
    for (int64_t i = 0; i < nc1; i++) {
        int64_t b = i / (nW * nkv * hd), rest = i % (nW * nkv * hd);
        worst = fmax(worst, fabs(x1[i] - x2[b * nC * nkv * hd + rest]));
    }
    CHECK(worst < 1e-6, "rope_windows over chunks = rope on equal chunks: %g", worst);
    ps_rope_windows(ctx, x2, cos_t, sin_t, hd, &cw, 1);
    worst = 0;
    for (int64_t i = 0; i < B * nC * nkv * hd; i++) worst = fmax(worst, fabs(x2[i] - x0[i]));
    CHECK(worst < 1e-5, "rope_windows inverse undoes the forward: %g", worst);
    /* a chunk past T or longer than W fails, naming the op */
    cl[2] = W + 1;
    cw = CHUNK_TABLE();
#undef CHUNK_TABLE
    CHECK(ps_gate(ctx, z2, a2, in, u, bias, d, &cw) != 0, "a chunk longer than W rejected");
    CHECK(strstr(ctx->err.msg, "gate:") != NULL, "message names the op: %s", ctx->err.msg);
    ps_ctx_free(ctx);
}

/* ---- forward against the reference ---- */

static void compare(const char *label, ps_config c, int T, int B, uint64_t seed) {
    ps_model m;
    tu_random_model(&m, &c, seed, 0.5f);
    int64_t V = c.vocab_size;
    int32_t *tok = malloc((size_t)(B * T) * sizeof *tok);
    tu_random_tokens(tok, B * T, V, seed + 1);
    ps_acts a;
    ps_error err;
    REQUIRE_OK(ps_acts_create(&a, m.ctx, &c, B, T, false, &err), &err);
    CHECK_OK(ps_forward(&m, &a, tok, NULL, &err), &err);
    double *ref = malloc((size_t)(T * V) * sizeof(double));
    float *reff = malloc((size_t)(T * V) * sizeof(float));
    int counts_differ = 0;
    for (int b = 0; b < B; b++) {
        ref_forward_content(&m, tok + b * T, T, ref);
        for (int64_t i = 0; i < T * V; i++) reff[i] = (float)ref[i];
        double e = rel_err_f(a.p.logits + (int64_t)b * T * V, reff, T * V);
        CHECK(e < 1e-5, "%s: sequence %d: logits rel err %.3g vs the plain-loop reference", label, b, e);
        if (b) counts_differ |= ps_geom_seen(&a.geom, b, 0, T - 1) != ps_geom_seen(&a.geom, 0, 0, T - 1);
    }
    if (B > 1) CHECK(counts_differ, "%s: the batch's sequences have the same chunk count (the padding is untested)", label);
    free(ref);
    free(reff);
    free(tok);
    ps_acts_free(&a);
    ps_model_free(&m);
}

static void test_forward_reference(void) {
    ps_config c = chunk_cfg(6, 4, 2, 4, 2);
    compare("content W6/S4/m2", c, 23, 3, 11);
    c.local_window = 3;
    compare("content LW 3 (< longest chunk)", c, 21, 3, 12);
    c = chunk_cfg(6, 4, 2, 4, 4);
    c.payload = PS_PAYLOAD_SHARED;
    compare("content MHA shared payload", c, 19, 3, 13);
    c = chunk_cfg(5, 3, 1, 4, 2);
    c.rope = false;
    c.qk_norm = false;
    c.gate = PS_GATE_UNIFORM;
    compare("content uniform gate, no rope/qk-norm, m1", c, 17, 3, 24);
    c = chunk_cfg(16, 8, 4, 4, 2);
    c.max_seq_len = 64;
    compare("content W16/S8/m4 (the demo's)", c, 60, 3, 15);
}

/* ---- gradients: central finite differences of the reference ---- */

static void ref_content_user(const ps_model *m, const int32_t *tok, int T, const void *user, double *logits) {
    (void)user;
    ref_forward_content(m, tok, T, logits);
}

static void fd_check(const char *label, ps_config c, uint64_t seed) {
    CHECK_TALLY(tu_fd_model(label, c, seed, 19, NULL, ref_content_user, NULL));
}

static void test_gradients(void) {
    ps_config c = chunk_cfg(6, 4, 2, 4, 2);
    fd_check("content W6/S4/m2", c, 100);
    c.payload = PS_PAYLOAD_SHARED;
    fd_check("content shared payload", c, 110);
    c = chunk_cfg(5, 3, 1, 2, 1);
    c.rope = false;
    c.qk_norm = false;
    c.tie_embeddings = false;
    c.local_window = 2;
    fd_check("content no rope/qk-norm, untied, LW 2", c, 120);
}

/* ---- hooks, the answer-row restart, errors ---- */

typedef struct {
    int64_t shape[4];
    double absent;
    float *pattern_copy;
    int64_t pattern_n;
} seen;

static int on_gate(const ps_hook_event *ev, void *user, ps_error *err) {
    (void)err;
    seen *s = user;
    memcpy(s->shape, ev->shape, sizeof s->shape);
    return 0;
}

static int on_ck(const ps_hook_event *ev, void *user, ps_error *err) {
    (void)err;
    seen *s = user;
    /* sequence 0's chunks past its count: every entry 0 */
    int64_t nC = ev->shape[1], inner = ev->shape[2] * ev->shape[3];
    s->absent = 0;
    for (int64_t j = nC - 1; j >= 0; j--) {
        double a = 0;
        for (int64_t e = 0; e < inner; e++) a += fabs(ev->data[j * inner + e]);
        if (a > 0) break;
        s->absent += 1;
    }
    return 0;
}

static int on_pattern(const ps_hook_event *ev, void *user, ps_error *err) {
    (void)err;
    seen *s = user;
    s->pattern_n = ev->shape[0] * ev->shape[1] * ev->shape[2] * ev->shape[3];
    s->pattern_copy = malloc((size_t)s->pattern_n * sizeof(float));
    memcpy(s->pattern_copy, ev->data, (size_t)s->pattern_n * sizeof(float));
    memcpy(s->shape, ev->shape, sizeof s->shape);
    return 0;
}

static void test_hooks_rows_errors(void) {
    ps_config c = chunk_cfg(6, 4, 2, 4, 2);
    ps_model m;
    tu_random_model(&m, &c, 200, 0.5f);
    enum { B = 2, T = 23 };
    int32_t tok[B * T];
    tu_random_tokens(tok, B * T, c.vocab_size, 201);
    ps_error err;
    ps_acts a, a2;
    REQUIRE_OK(ps_acts_create(&a, m.ctx, &c, B, T, true, &err), &err);
    REQUIRE_OK(ps_acts_create(&a2, m.ctx, &c, B, T, true, &err), &err);
    /* a pass from a residual without tokens cannot know the chunks */
    CHECK_ERR(ps_forward_from(&m, &a, 0, NULL, &err), &err, "content", "ps_forward");
    CHECK_ERR(ps_acts_set_phase(&a, (int64_t[]){0, 0}, &err), &err, "content");
    CHECK_OK(ps_forward(&m, &a2, tok, NULL, &err), &err);
    seen sg = {0}, sc = {0}, sp = {0};
    ps_hooks h;
    ps_hooks_init(&h);
    CHECK_OK(ps_hooks_add(&h, &c, "blocks.1.attn.hook_gate_k", on_gate, &sg, &err), &err);
    CHECK_OK(ps_hooks_add(&h, &c, "blocks.0.attn.hook_ck", on_ck, &sc, &err), &err);
    CHECK_OK(ps_hooks_add(&h, &c, "blocks.0.attn.hook_pattern", on_pattern, &sp, &err), &err);
    CHECK_OK(ps_forward(&m, &a, tok, &h, &err), &err);
    int64_t nC = T / 2;
    CHECK(sg.shape[0] == B && sg.shape[1] == nC && sg.shape[2] == 2 && sg.shape[3] == 6, "gate hook [B, T/m, nkv, W]: %lld %lld %lld %lld",
          (long long)sg.shape[0], (long long)sg.shape[1], (long long)sg.shape[2], (long long)sg.shape[3]);
    int64_t n0 = ps_geom_seen(&a.geom, 0, 0, T - 1);
    CHECK(sc.absent == nC - n0 && n0 < nC, "absent chunks of sequence 0 are zero (%g of %lld, it has %lld)", sc.absent, (long long)nC,
          (long long)n0);
    /* a read-only pattern hook changes nothing; a row puts no weight on chunks that have not ended */
    double e = rel_err_f(a.p.logits, a2.p.logits, B * T * c.vocab_size);
    CHECK(e == 0, "read-only pattern hook changed the logits: %g", e);
    int64_t wide = nC + T, bad = 0;
    double rowsum_err = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t hh = 0; hh < c.n_heads; hh++)
            for (int64_t t = 0; t < T; t++) {
                const float *row = sp.pattern_copy + ((b * c.n_heads + hh) * T + t) * wide;
                int64_t ns = ps_geom_seen(&a.geom, b, hh / 2, t);
                double s = 0;
                for (int64_t j = 0; j < wide; j++) s += row[j];
                rowsum_err = fmax(rowsum_err, fabs(s - 1));
                for (int64_t j = ns; j < nC; j++) bad += row[j] != 0;
            }
    CHECK(bad == 0 && rowsum_err < 1e-5, "pattern: %lld weights on unended chunks, row sums off by %g", (long long)bad, rowsum_err);
    /* the answer-row restart gives the full pass's logits at its rows */
    int64_t rows[3] = {5, T + 11, 2 * T - 1};
    CHECK_OK(ps_forward_from_attention_rows(&m, &a2, 0, NULL, rows, 3, &err), &err);
    double worst = 0;
    for (int i = 0; i < 3; i++)
        for (int64_t v = 0; v < c.vocab_size; v++)
            worst = fmax(worst, fabs(a2.p.logits[rows[i] * c.vocab_size + v] - a.p.logits[rows[i] * c.vocab_size + v]));
    CHECK(worst < 1e-5, "answer-row restart vs the full pass: %g", worst);
    free(sp.pattern_copy);
    ps_hooks_free(&h);
    ps_acts_free(&a);
    ps_acts_free(&a2);
    ps_model_free(&m);
}

/* ---- a restart on copied activations: ps_acts_copy_chunks, also into a shorter sequence ---- */

static void test_copy_chunks(void) {
    ps_config c = chunk_cfg(6, 4, 2, 4, 2);
    ps_model m;
    tu_random_model(&m, &c, 400, 0.5f);
    enum { B = 2, T = 23, T2 = 17 };
    int32_t tok[B * T];
    tu_random_tokens(tok, B * T, c.vocab_size, 401);
    ps_error err;
    ps_acts a, r1, r2;
    int64_t d = c.d_model, V = c.vocab_size;
    REQUIRE_OK(ps_acts_create(&a, m.ctx, &c, B, T, false, &err), &err);
    REQUIRE_OK(ps_acts_create(&r1, m.ctx, &c, 2 * B, T, false, &err), &err);
    REQUIRE_OK(ps_acts_create(&r2, m.ctx, &c, B, T2, false, &err), &err);
    CHECK_OK(ps_forward(&m, &a, tok, NULL, &err), &err);
    /* replicas 0..1 and 2..3 of the batch from layer 1's input: the same logits */
    for (int r = 0; r < 2; r++) {
        memcpy(r1.p.resid + 1 * 2 * B * T * d + r * B * T * d, a.p.resid + 1 * B * T * d, (size_t)(B * T * d) * sizeof(float));
        CHECK_OK(ps_acts_copy_chunks(&r1, r * B, &a, 0, B, &err), &err);
    }
    CHECK_OK(ps_forward_from(&m, &r1, 1, NULL, &err), &err);
    double e = fmax(rel_err_f(r1.p.logits, a.p.logits, B * T * V), rel_err_f(r1.p.logits + B * T * V, a.p.logits, B * T * V));
    CHECK(e < 1e-6, "replicas from copied chunk tables: logits differ by %g", e);
    /* the first T2 tokens from layer 0's input: the chunks that end inside T2 kept, the logits of the prefix */
    for (int b = 0; b < B; b++)
        memcpy(r2.p.resid + b * T2 * d, a.p.resid + b * T * d, (size_t)(T2 * d) * sizeof(float));
    CHECK_OK(ps_acts_copy_chunks(&r2, 0, &a, 0, B, &err), &err);
    CHECK_OK(ps_forward_from(&m, &r2, 0, NULL, &err), &err);
    double worst = 0;
    for (int b = 0; b < B; b++) worst = fmax(worst, rel_err_f(r2.p.logits + b * T2 * V, a.p.logits + b * T * V, T2 * V));
    CHECK(worst < 1e-6, "a shorter restart: prefix logits differ by %g", worst);
    int kept_ok = 1;
    for (int b = 0; b < B; b++)
        for (int64_t j = 0; j < r2.nW; j++) {
            int64_t di = b * r2.nW + j, si = b * a.nW + j;
            int inside = a.cl[si] > 0 && a.cs[si] + a.cl[si] <= T2;
            kept_ok &= inside ? r2.cl[di] == a.cl[si] && r2.cend[di] == a.cend[si] : r2.cl[di] == 0 && r2.cend[di] == INT64_MAX;
        }
    CHECK(kept_ok, "the shorter table keeps exactly the chunks that end inside T2");
    CHECK_ERR(ps_acts_copy_chunks(&r2, 1, &a, 0, B, &err), &err, "chunk tables");
    ps_acts_free(&a);
    ps_acts_free(&r1);
    ps_acts_free(&r2);
    ps_model_free(&m);
}

/* ---- the knockout grid: batched path against the naive one ---- */

static void test_knockout(void) {
    ps_config c = tu_config(PS_ATTN_COMPRESSED);
    c.n_layers = 2;
    c.max_seq_len = 40;
    c.window = 6; c.stride = 4; c.local_window = 4;
    c.boundaries = PS_BOUNDARIES_CONTENT;
    c.chunk_min = 2;
    ps_model m;
    tu_random_model(&m, &c, 300, 0.5f);
    ps_task t = {.kind = PS_TASK_KV, .seq_len = 30, .n_keys = 6, .n_values = 6, .n_fillers = 3, .n_pairs = 3,
                 .key_len = 1, .value_len = 2, .gap_min = 0, .gap_max = 3, .query_gap = 4, .n_queries = 2};
    ps_batch base;
    ps_error err;
    const int64_t N = 10, P = 4, batch = 4;
    REQUIRE_OK(ps_batch_alloc(&base, N, t.seq_len, t.n_queries, &err), &err);
    CHECK(ps_task_generate(&t, 13, &base, NULL) == 0, "task generation");
    ps_filler_family fam = {.name = "repeat", .n_pattern = 1, .pattern = {0}};
    int layers[2] = {0, 1}, heads[2] = {0, 1};
    ps_knockout_result naive, fast;
    ps_knockout_opts on = {.naive = 1};
    REQUIRE_OK(tu_knockout_opts(&m, &base, &t, &fam, P, 0, batch, layers, 2, heads, 2, PS_KO_COMPRESSED, &on, &naive, NULL,
                                NULL, &err), &err);
    ps_knockout_opts off = {.naive = 0};
    REQUIRE_OK(tu_knockout_opts(&m, &base, &t, &fam, P, 0, batch, layers, 2, heads, 2, PS_KO_COMPRESSED, &off, &fast, NULL,
                                NULL, &err), &err);
    int same = 1, changed = 0;
    double worst = 0;
    for (int cell = 0; cell < 4; cell++)
        for (int r = 0; r < P; r++) {
            same &= naive.cells[cell].k[r] == fast.cells[cell].k[r] && naive.cells[cell].n[r] == fast.cells[cell].n[r];
            worst = fmax(worst, fabs(naive.cells[cell].lp[r] - fast.cells[cell].lp[r]) / fmax(1e-9, fabs(naive.cells[cell].lp[r])));
            changed |= fabs(naive.cells[cell].lp[r] - naive.clean.lp[r]) > 1e-3 * fabs(naive.clean.lp[r]);
        }
    CHECK(same && worst < 1e-5, "content knockout: batched grid differs from the naive one (rel %g)", worst);
    CHECK(changed, "content knockout changed nothing (the comparison would be vacuous)");
    ps_knockout_result_free(&naive);
    ps_knockout_result_free(&fast);
    ps_batch_free(&base);
    ps_model_free(&m);
}

int main(void) {
    test_config();
    test_chunker();
    test_ops_match_grid();
    test_forward_reference();
    test_gradients();
    test_hooks_rows_errors();
    test_copy_chunks();
    test_knockout();
    CHECK_DONE();
}
