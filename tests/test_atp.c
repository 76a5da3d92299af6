/* test_atp.c — attribution patching (interventions/atp.h) against numbers computed another way:
 *   - the gradients the backward hands its grad hooks equal central finite differences of the NLL along
 *     a random direction added at the same hook point (hook_k, hook_v, hook_ck, hook_cv, hook_z);
 *   - every cell's estimate equals, prompt by prompt and residue by residue (its unit: a backward per
 *     residue), the directional derivative of the NLL of the prompt's queries of that residue
 *     along the cell's replacement, by central differences of hooked forwards written here (host
 *     callbacks, the means averaged here from cached clean runs): fix none along (mean − a) at the
 *     replaced arrays; fix qk along (z'_c − z) at hook_z, z'_c cached from a forward with the cell's
 *     mean replacement — for full, compressed (every target), staggered, per-channel and select attention
 *     (select: target raw, the block choice held by a small step; hook_k/hook_v gradients too);
 *   - one prompt (its mean is itself) estimates exactly 0 for every cell, both fixes;
 *   - a cell mask runs exactly the masked cells; the errors (fix qk on the per-channel compressor and select,
 *     select's compressed and both targets: a discrete choice). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/backward.h"
#include "core/forward.h"
#include "core/rng.h"
#include "interventions/atp.h"
#include "interventions/knockout.h"
#include "interventions/patching.h"
#include "interventions/sweep.h"
#include "tasks/tasks.h"
#include "testutil.h"

static ps_task small_task(void) {
    ps_task t = {.kind = PS_TASK_KV, .seq_len = 30, .n_keys = 6, .n_values = 6, .n_fillers = 3, .n_pairs = 3,
                 .key_len = 1, .value_len = 2, .gap_min = 0, .gap_max = 3, .query_gap = 4, .n_queries = 2};
    return t;
}

static ps_config cfg_of(ps_attn_kind kind, int staggered) {
    ps_config c = tu_config(kind);
    c.n_layers = 2;
    c.max_seq_len = 40;
    c.window = 4, c.stride = 4, c.local_window = 4;
    if (kind == PS_ATTN_CHANNEL) c.n_kv_heads = 1, c.rate = 4, c.v4_mode = PS_V4_MODE_CSA, c.local_window = 3;
    /* select: 4-token blocks, 3 of them chosen besides the local one (a 30-token row keeps 4 of 8: sparse) */
    if (kind == PS_ATTN_SELECT) c.stride = 2, c.block = 4, c.topk = 3, c.init_blocks = 1, c.local_blocks = 1, c.dense_len = 0;
    if (staggered == 1) {
        c.n_grid_offsets = c.n_kv_heads;
        c.head_offsets[0] = 0, c.head_offsets[1] = 2;
        c.any_head_offset = true;
    } else if (staggered == 2) { /* a per-layer grid: layer 0 [0, 2], layer 1 [3, 1] */
        int64_t o[4] = {0, 2, 3, 1};
        ps_error e;
        if (c.n_kv_heads != 2 || ps_config_set_grid_offsets(&c, o, 2, &e)) abort();
    }
    return c;
}

/* ---- a host hook: x[b, t, head, :] += eps · (src[(b), t, head, :] − x[b, t, head, :]) ---- */
typedef struct {
    int head;          /* -1: every head */
    const float *src;  /* [npos, nh, X] (per_seq 0) or [B, npos, nh, X] */
    int per_seq;
    float eps;
} interp;

static int interp_hook(const ps_hook_event *ev, void *user, ps_error *err) {
    (void)err;
    const interp *ip = user;
    int64_t B = ev->shape[0], npos = ev->shape[1], nh = ev->ndim == 4 ? ev->shape[2] : 1, X = ev->ndim == 4 ? ev->shape[3] : ev->shape[2];
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < npos; t++)
            for (int64_t h = 0; h < nh; h++) {
                if (ip->head >= 0 && h != ip->head) continue;
                float *x = ev->data + ((b * npos + t) * nh + h) * X;
                const float *s = ip->src + (((ip->per_seq ? b : 0) * npos + t) * nh + h) * X;
                for (int64_t i = 0; i < X; i++) x[i] += ip->eps * (s[i] - x[i]);
            }
    return 0;
}

/* NLL of every query of the batch under hooks: nll [B · max_q]. */
static void nll_of(const ps_model *m, const ps_batch *b, const ps_hooks *h, double *nll) {
    ps_error err;
    ps_acts a;
    int *ok = malloc((size_t)(b->B * b->max_q) * sizeof(int));
    if (ps_acts_create(&a, m->ctx, &m->cfg, b->B, b->T, false, &err) || ps_forward(m, &a, b->tokens, h, &err)) {
        CHECK(0, "forward: %s", err.msg);
        free(ok);
        return;
    }
    ps_score_queries(b, a.p.logits, m->cfg.vocab_size, ok, nll);
    for (int64_t i = 0; i < b->B * b->max_q; i++) nll[i] = -nll[i];
    ps_acts_free(&a);
    free(ok);
}

/* ---- 1. gradients at hook points against finite differences ---- */

typedef struct {
    float *g;
    int64_t n;
} grab;

static int grab_hook(const ps_hook_event *ev, void *user, ps_error *err) {
    (void)err;
    grab *gb = user;
    int64_t n = 1;
    for (int i = 0; i < ev->ndim; i++) n *= ev->shape[i];
    gb->g = malloc((size_t)n * sizeof(float));
    memcpy(gb->g, ev->data, (size_t)n * sizeof(float));
    gb->n = n;
    return 0;
}

static void test_grad_hooks(ps_attn_kind kind, const char *what) {
    ps_config c = cfg_of(kind, 0);
    ps_model m;
    tu_random_model(&m, &c, 71, 0.5f);
    ps_error err;
    enum { B = 2, T = 21 };
    int32_t tok[B * T], tg[B * T];
    tu_random_tokens(tok, B * T, c.vocab_size, 72);
    for (int64_t i = 0; i < B * T; i++) tg[i] = i % 3 == 0 ? tok[(i + 1) % (B * T)] : -1;
    const ps_hook_point pts[5] = {PS_HOOK_K, PS_HOOK_V, PS_HOOK_CK, PS_HOOK_CV, PS_HOOK_Z};
    for (int l = 0; l < 2; l++)
        for (int pi = 0; pi < 5; pi++) {
            ps_hook_point pt = pts[pi];
            if (kind == PS_ATTN_FULL && (pt == PS_HOOK_CK || pt == PS_HOOK_CV)) continue;
            if (kind == PS_ATTN_CHANNEL && (pt == PS_HOOK_V || pt == PS_HOOK_CV)) continue;
            if (kind == PS_ATTN_SELECT && (pt == PS_HOOK_CK || pt == PS_HOOK_CV)) continue; /* the choice: no gradient */
            char name[96];
            ps_hook_name(name, sizeof name, l, pt);
            /* the gradient the backward hands the hook */
            ps_acts a, g;
            REQUIRE_OK(ps_acts_create(&a, m.ctx, &c, B, T, true, &err), &err);
            REQUIRE_OK(ps_acts_create(&g, m.ctx, &c, B, T, false, &err), &err);
            CHECK_OK(ps_forward(&m, &a, tok, NULL, &err), &err);
            float *grads = calloc((size_t)m.n_params, sizeof(float));
            grab gb = {0};
            ps_hooks gh;
            ps_hooks_init(&gh);
            CHECK_OK(ps_hooks_add(&gh, &c, name, grab_hook, &gb, &err), &err);
            double loss = 0;
            int64_t nt = 0;
            ps_backward_opts o = {.grad_hooks = &gh, .no_weight_grads = 1, .stop_layer = l};
            CHECK_OK(ps_backward_ex(&m, &a, &g, tok, tg, 1.0f, grads, &loss, &nt, &o, &err), &err);
            ps_hooks_free(&gh);
            CHECK(gb.g != NULL, "%s %s: the grad hook fired", what, name);
            if (!gb.g) continue;
            /* the loss along a random direction d added at the point: (L(+e) − L(−e)) / 2e vs Σ g·d */
            float *d = malloc((size_t)gb.n * sizeof(float));
            ps_rng r;
            ps_rng_seed(&r, 73 + (uint64_t)(l * 5 + pi));
            double gd = 0;
            for (int64_t i = 0; i < gb.n; i++) {
                d[i] = (float)ps_rng_normal(&r);
                gd += (double)gb.g[i] * d[i];
            }
            double Lpm[2];
            for (int s = 0; s < 2; s++) {
                const float e = s ? -2e-3f : 2e-3f;
                /* x + e·d: an add action per sequence (its own direction) */
                ps_hooks h;
                ps_hooks_init(&h);
                for (int64_t b = 0; b < B; b++) {
                    ps_hook_action add = {.kind = PS_ACT_ADD, .head = -1, .seq0 = b, .seq1 = b + 1, .scale = e,
                                          .src = ps_hooks_upload(&h, m.ctx, d + b * (gb.n / B), gb.n / B, &err),
                                          .src_npos = pt == PS_HOOK_CK || pt == PS_HOOK_CV ? a.nW : T};
                    CHECK_OK(ps_hooks_add_action(&h, &c, name, &add, &err), &err);
                }
                ps_acts f;
                REQUIRE_OK(ps_acts_create(&f, m.ctx, &c, B, T, true, &err), &err);
                CHECK_OK(ps_forward(&m, &f, tok, &h, &err), &err);
                double ls = 0;
                int64_t n2 = 0;
                CHECK_OK(ps_backward(&m, &f, &g, tok, tg, 1.0f, grads, &ls, &n2, &err), &err);
                Lpm[s] = ls;
                ps_hooks_free(&h);
                ps_acts_free(&f);
            }
            double fd = (Lpm[0] - Lpm[1]) / 4e-3;
            CHECK(fabs(fd - gd) <= 2e-2 * fabs(gd) + 2e-3, "%s %s: gradient . d = %.6g, finite differences %.6g", what, name, gd, fd);
            free(d), free(gb.g), free(grads);
            ps_acts_free(&a);
            ps_acts_free(&g);
        }
    ps_model_free(&m);
}

/* ---- 2. the estimate against directional derivatives, query by query ---- */

enum { N = 6, P = 2, BATCH = 4, MAXQ = 2 };

typedef struct {
    int64_t batch;
    int n_layers;
    int nc;
    double clean[P][N * MAXQ];
    double *cell; /* [P][n_layers][nc][N · MAXQ]: recorded log-probs, layer index top-down */
    unsigned char *seen;
} rec_t;

static void rec_fn(void *user, int64_t unit, int cell, int64_t first, const ps_shifted *set, const int *ok, const double *lp) {
    (void)ok;
    rec_t *r = user;
    int64_t p, i0, n;
    int li;
    ps_grid_unit(N, r->batch, r->n_layers, 1, unit, &p, &i0, &n, &li);
    for (int64_t i = 0; i < set->b.B; i++)
        for (int64_t q = 0; q < MAXQ; q++) {
            int64_t k = (i0 + first + i) * MAXQ + q;
            if (cell < 0) r->clean[p][k] = lp[i * MAXQ + q];
            else {
                int64_t o = ((p * r->n_layers + cell / r->nc) * r->nc + cell % r->nc) * N * MAXQ + k;
                r->cell[o] = lp[i * MAXQ + q];
                r->seen[o] = 1;
            }
        }
}

static int est_run(const ps_model *m, const ps_batch *base, const ps_task *t, const ps_filler_family *fam, int n_prompts,
                   ps_ko_target target, int fix, const unsigned char *mask, rec_t *r, ps_error *err) {
    int layers[2] = {0, 1}, heads[2] = {0, 1};
    int nc = (int)m->cfg.n_kv_heads;
    memset(r, 0, sizeof *r);
    r->batch = BATCH, r->n_layers = 2, r->nc = nc;
    r->cell = calloc((size_t)(P * 2 * nc * N * MAXQ), sizeof(double));
    r->seen = calloc((size_t)(P * 2 * nc * N * MAXQ), 1);
    ps_runtime rt;
    ps_runtime_model(&rt, m);
    ps_batch b = ps_batch_view(base, 0, n_prompts);
    ps_knockout_result res;
    ps_knockout_spec k = {.rt = &rt, .base = &b, .task = t, .fam = fam, .P = P, .seed = 3, .batch = BATCH, .layers = layers,
                          .n_layers = 2, .heads = heads, .n_heads = nc, .target = (int)target - 1,
                          .opts = {.atp = 1, .atp_fix = fix, .cell_mask = mask, .record = rec_fn, .record_user = r}};
    int rc = ps_knockout_run(&k, &res, err);
    if (!rc) ps_knockout_result_free(&res);
    return rc;
}

/* The N evaluation prompts of the small task. */
static int prompts(ps_task *t, ps_batch *base, ps_error *err) {
    if (ps_batch_alloc(base, N, t->seq_len, t->n_queries, err)) return -1;
    return ps_task_generate(t, 17, base, err);
}

static void rec_free(rec_t *r) {
    free(r->cell);
    free(r->seen);
}

static void test_estimate(ps_attn_kind kind, int staggered, ps_ko_target target, int fix, const char *what) {
    ps_config c = cfg_of(kind, staggered);
    ps_model m;
    tu_random_model(&m, &c, 81, 0.5f);
    ps_error err;
    ps_task t = small_task();
    ps_batch base;
    ps_filler_family fam = {.name = "repeat", .n_pattern = 1, .pattern = {0}};
    REQUIRE_OK(prompts(&t, &base, &err), &err);
    rec_t r;
    if (est_run(&m, &base, &t, &fam, N, target, fix, NULL, &r, &err)) {
        CHECK(0, "%s: the estimate runs: %s", what, err.msg);
        ps_batch_free(&base);
        ps_model_free(&m);
        rec_free(&r);
        return;
    }
    int nc = r.nc, K = kind == PS_ATTN_CHANNEL;
    /* the step of the central differences: select's pooled keys follow hook_k, and a step of 1e-2 along (mean − k)
     * already flips a near-tie of this random model's block choice (a jump, not a derivative); 1e-3 keeps every
     * choice (measured: agreement to 1e-3 of the largest derivative, 12.7) */
    const float step = kind == PS_ATTN_SELECT ? 1e-3f : 1e-2f;
    double worst = 0, scale = 0;
    for (int64_t p = 0; p < P; p++) {
        ps_shifted s;
        REQUIRE_OK(ps_make_shifted(&base, &t, &fam, PS_SWEEP_PAD, P, p, 3, m.cfg.max_seq_len, &s, &err), &err);
        int64_t T = s.b.T, nW = ps_config_n_windows(&c, T), nkv = c.n_kv_heads, hd = c.head_dim;
        for (int li = 0; li < 2; li++) {
            int l = 1 - li; /* the grid's layers top-down */
            /* the replaced arrays and their means over the N prompts, from a cached clean run */
            ps_hook_point pts[4];
            int na = 0;
            if (target & PS_KO_RAW) pts[na++] = PS_HOOK_K;
            if ((target & PS_KO_RAW) && !K) pts[na++] = PS_HOOK_V;
            if (target & PS_KO_COMPRESSED) pts[na++] = PS_HOOK_CK;
            if ((target & PS_KO_COMPRESSED) && !K) pts[na++] = PS_HOOK_CV;
            char names[5][96];
            const char *np[5];
            for (int i = 0; i < na; i++) ps_hook_name(names[i], 96, l, pts[i]), np[i] = names[i];
            ps_hook_name(names[na], 96, l, PS_HOOK_Z), np[na] = names[na];
            ps_cache cache;
            ps_cache_init(&cache);
            CHECK_OK(ps_run_with_cache(&m, s.b.tokens, N, T, np, na + 1, &cache, &err), &err);
            float *mean[4];
            for (int i = 0; i < na; i++) {
                const ps_cache_item *it = ps_cache_get(&cache, names[i]);
                int64_t per = (pts[i] == PS_HOOK_K || pts[i] == PS_HOOK_V ? T : nW) * nkv * hd;
                double *sum = calloc((size_t)per, sizeof(double));
                mean[i] = malloc((size_t)per * sizeof(float));
                for (int64_t b = 0; b < N; b++)
                    for (int64_t e = 0; e < per; e++) sum[e] += it->data[b * per + e];
                for (int64_t e = 0; e < per; e++) mean[i][e] = (float)(sum[e] / N);
                free(sum);
            }
            for (int ci = 0; ci < nc; ci++) {
                /* fix qk: z'_c from a forward with the cell's mean replacement */
                float *zc = NULL;
                if (fix == PS_ATP_FIX_QK) {
                    ps_hooks h;
                    ps_hooks_init(&h);
                    for (int i = 0; i < na; i++) {
                        int64_t npos = pts[i] == PS_HOOK_K || pts[i] == PS_HOOK_V ? T : nW;
                        ps_hook_action act = {.kind = PS_ACT_SET, .head = ci,
                                              .src = ps_hooks_upload(&h, m.ctx, mean[i], npos * nkv * hd, &err), .src_npos = npos};
                        CHECK_OK(ps_hooks_add_action(&h, &c, names[i], &act, &err), &err);
                    }
                    ps_cache zc_cache;
                    ps_cache_init(&zc_cache);
                    CHECK_OK(ps_cache_watch(&zc_cache, &h, &c, names[na], &err), &err);
                    double tmp[N * MAXQ];
                    nll_of(&m, &s.b, &h, tmp);
                    const ps_cache_item *it = ps_cache_get(&zc_cache, names[na]);
                    int64_t nz = N * T * c.n_heads * hd;
                    zc = malloc((size_t)nz * sizeof(float));
                    memcpy(zc, it->data, (size_t)nz * sizeof(float));
                    ps_cache_free(&zc_cache);
                    ps_hooks_free(&h);
                }
                double f[2][N * MAXQ];
                for (int sgn = 0; sgn < 2; sgn++) {
                    const float e = sgn ? -step : step;
                    interp ip[4];
                    ps_hooks h;
                    ps_hooks_init(&h);
                    if (fix == PS_ATP_FIX_QK) {
                        ip[0] = (interp){.head = -1, .src = zc, .per_seq = 1, .eps = e};
                        CHECK_OK(ps_hooks_add(&h, &c, names[na], interp_hook, &ip[0], &err), &err);
                    } else
                        for (int i = 0; i < na; i++) {
                            ip[i] = (interp){.head = ci, .src = mean[i], .per_seq = 0, .eps = e};
                            CHECK_OK(ps_hooks_add(&h, &c, names[i], interp_hook, &ip[i], &err), &err);
                        }
                    nll_of(&m, &s.b, &h, f[sgn]);
                    ps_hooks_free(&h);
                }
                /* per prompt and residue (the estimate's unit: one backward per residue) */
                for (int64_t b = 0; b < N; b++)
                    for (int64_t rho = 0; rho < P; rho++) {
                        double fd = 0, est = 0;
                        for (int64_t q = 0; q < s.b.n_q[b]; q++) {
                            int64_t k = b * MAXQ + q, o = ((p * 2 + li) * nc + ci) * N * MAXQ + k;
                            CHECK(r.seen[o], "%s: the cell (layer %d, head %d) was recorded", what, l, ci);
                            if (s.residue[k] != rho) continue;
                            fd += (f[0][k] - f[1][k]) / (2.0 * step);
                            est += r.clean[p][k] - r.cell[o];
                        }
                        worst = fmax(worst, fabs(fd - est));
                        scale = fmax(scale, fabs(fd));
                    }
                free(zc);
            }
            for (int i = 0; i < na; i++) free(mean[i]);
            ps_cache_free(&cache);
        }
        ps_shifted_free(&s);
    }
    CHECK(scale > 1e-3, "%s: the cells change the NLL (largest derivative %.3g)", what, scale);
    CHECK(worst <= 1e-2 * scale + 1e-4, "%s: estimate vs directional derivative: worst difference %.3g (largest %.3g)", what, worst,
          scale);
    printf("  %s: %d x %d cells x %d prompts x %d residues, largest |d NLL| %.4f, worst difference %.2g\n", what, 2, nc, N, P, scale, worst);
    rec_free(&r);
    /* one prompt: the mean is the prompt itself, every estimate exactly 0 */
    if (!est_run(&m, &base, &t, &fam, 1, target, fix, NULL, &r, &err)) {
        int zero = 1;
        for (int64_t p = 0; p < P; p++)
            for (int64_t cc = 0; cc < 2 * nc; cc++)
                for (int64_t q = 0; q < base.n_q[0]; q++)
                    if (r.cell[(p * 2 * nc + cc) * N * MAXQ + q] != r.clean[p][q]) zero = 0;
        CHECK(zero, "%s: one prompt estimates exactly 0", what);
    } else
        CHECK(0, "%s (one prompt): %s", what, err.msg);
    rec_free(&r);
    ps_batch_free(&base);
    ps_model_free(&m);
}

/* ---- 3. cell masks and errors ---- */

static void test_mask_and_errors(void) {
    ps_config c = cfg_of(PS_ATTN_COMPRESSED, 0);
    ps_model m;
    tu_random_model(&m, &c, 91, 0.5f);
    ps_error err;
    ps_task t = small_task();
    ps_batch base;
    ps_filler_family fam = {.name = "repeat", .n_pattern = 1, .pattern = {0}};
    REQUIRE_OK(prompts(&t, &base, &err), &err);
    rec_t r;
    /* caller's layer order {0, 1}: only layer 1 head 0 and layer 0 head 1 */
    unsigned char mask[4] = {0, 1, 1, 0};
    CHECK_OK(est_run(&m, &base, &t, &fam, N, PS_KO_COMPRESSED, PS_ATP_FIX_QK, mask, &r, &err), &err);
    /* top-down: li 0 = layer 1 (cells: head 0 on), li 1 = layer 0 (head 1 on) */
    int want[4] = {1, 0, 0, 1}, got[4] = {0};
    for (int64_t p = 0; p < P; p++)
        for (int cc = 0; cc < 4; cc++) got[cc] |= r.seen[(p * 4 + cc) * N * MAXQ];
    CHECK(!memcmp(want, got, sizeof want), "the mask runs cells %d%d%d%d (want 1001)", got[0], got[1], got[2], got[3]);
    rec_free(&r);
    ps_batch_free(&base);
    /* a dot action whose source holds fewer positions than the activation is refused when it fires */
    {
        enum { B1 = 1, T1 = 12 };
        int32_t tok[B1 * T1];
        tu_random_tokens(tok, B1 * T1, c.vocab_size, 93);
        float *src = ps_buf_alloc(m.ctx, 4 * c.n_kv_heads * c.head_dim * (int64_t)sizeof(float), "src", &err);
        double *acc = ps_buf_alloc(m.ctx, B1 * c.n_kv_heads * (int64_t)sizeof(double), "acc", &err);
        ps_hooks h;
        ps_hooks_init(&h);
        ps_hook_action act = {.kind = PS_ACT_DOT, .head = -1, .src = src, .src_npos = 4, .acc = acc, .acc_n = B1 * c.n_kv_heads};
        CHECK_OK(ps_hooks_add_action(&h, &c, "blocks.0.attn.hook_k", &act, &err), &err);
        ps_acts a;
        REQUIRE_OK(ps_acts_create(&a, m.ctx, &c, B1, T1, false, &err), &err);
        CHECK_ERR(ps_forward(&m, &a, tok, &h, &err), &err, "hook \"blocks.0.attn.hook_k\": dot action reaches position 11, but its source holds 4 positions");
        act.src_npos = T1;
        act.acc_n = 3;
        ps_hooks_free(&h);
        ps_hooks_init(&h);
        CHECK_OK(ps_hooks_add_action(&h, &c, "blocks.0.attn.hook_k", &act, &err), &err);
        CHECK_ERR(ps_forward(&m, &a, tok, &h, &err), &err, "dot action: the accumulator holds 3 values, the range 1 sequences x 2 heads");
        act.head = 0;
        CHECK_ERR(ps_hooks_add_action(&h, &c, "blocks.0.attn.hook_k", &act, &err), &err, "a dot action covers every head and position");
        ps_hooks_free(&h);
        ps_acts_free(&a);
        ps_buf_free(m.ctx, src, 4 * c.n_kv_heads * c.head_dim * (int64_t)sizeof(float));
        ps_buf_free(m.ctx, acc, B1 * c.n_kv_heads * (int64_t)sizeof(double));
    }
    ps_model_free(&m);
    /* fix qk is not offered for the per-channel compressor */
    ps_config cc = cfg_of(PS_ATTN_CHANNEL, 0);
    tu_random_model(&m, &cc, 92, 0.5f);
    ps_runtime rt;
    ps_runtime_model(&rt, &m);
    char why[256];
    CHECK(ps_atp_fix_missing(&rt, PS_ATP_FIX_QK, why, sizeof why) && strstr(why, "channel"), "fix qk on channel attention is refused");
    CHECK(ps_atp_default_fix(&rt) == PS_ATP_FIX_NONE, "channel attention defaults to fix none");
    ps_grid_spec spec;
    int heads[1] = {0};
    CHECK_ERR(ps_atp_spec(&rt, 1, heads, 1, PS_ATP_FIX_QK, &spec, &err), &err, "--atp-fix qk", "channel");
    CHECK(!ps_atp_target_missing(&rt, 1, why, sizeof why), "channel attention's compressed target is estimated");
    ps_model_free(&m);
    /* select: the compressed keys only choose blocks (no gradient): target compressed and both are refused, raw is
     * estimated; fix qk is not offered */
    ps_config cs = cfg_of(PS_ATTN_SELECT, 0);
    tu_random_model(&m, &cs, 94, 0.5f);
    ps_runtime_model(&rt, &m);
    CHECK(!ps_atp_target_missing(&rt, 0, why, sizeof why), "select: target raw is estimated");
    for (int t = 1; t <= 2; t++) {
        CHECK(ps_atp_target_missing(&rt, t, why, sizeof why) && strstr(why, "discrete"), "select: target %d refused (%s)", t, why);
        CHECK_ERR(ps_atp_spec(&rt, t, heads, 1, PS_ATP_FIX_NONE, &spec, &err), &err, t == 1 ? "--target compressed" : "--target both",
                  "discrete top-k");
    }
    CHECK(ps_atp_fix_missing(&rt, PS_ATP_FIX_QK, why, sizeof why) && strstr(why, "select"), "fix qk on select attention is refused");
    ps_model_free(&m);
}

int main(void) {
    test_grad_hooks(PS_ATTN_COMPRESSED, "compressed");
    test_grad_hooks(PS_ATTN_FULL, "full");
    test_grad_hooks(PS_ATTN_CHANNEL, "channel");
    test_grad_hooks(PS_ATTN_SELECT, "select");
    test_estimate(PS_ATTN_COMPRESSED, 0, PS_KO_COMPRESSED, PS_ATP_FIX_NONE, "compressed, target compressed, fix none");
    test_estimate(PS_ATTN_COMPRESSED, 0, PS_KO_RAW, PS_ATP_FIX_NONE, "compressed, target raw, fix none");
    test_estimate(PS_ATTN_COMPRESSED, 0, PS_KO_BOTH, PS_ATP_FIX_NONE, "compressed, target both, fix none");
    test_estimate(PS_ATTN_COMPRESSED, 0, PS_KO_COMPRESSED, PS_ATP_FIX_QK, "compressed, target compressed, fix qk");
    test_estimate(PS_ATTN_COMPRESSED, 0, PS_KO_BOTH, PS_ATP_FIX_QK, "compressed, target both, fix qk");
    test_estimate(PS_ATTN_FULL, 0, PS_KO_RAW, PS_ATP_FIX_NONE, "full, target raw, fix none");
    test_estimate(PS_ATTN_FULL, 0, PS_KO_RAW, PS_ATP_FIX_QK, "full, target raw, fix qk");
    test_estimate(PS_ATTN_COMPRESSED, 1, PS_KO_COMPRESSED, PS_ATP_FIX_QK, "staggered, target compressed, fix qk");
    test_estimate(PS_ATTN_COMPRESSED, 2, PS_KO_COMPRESSED, PS_ATP_FIX_QK, "per-layer grid, target compressed, fix qk");
    test_estimate(PS_ATTN_CHANNEL, 0, PS_KO_COMPRESSED, PS_ATP_FIX_NONE, "channel, target compressed, fix none");
    test_estimate(PS_ATTN_CHANNEL, 0, PS_KO_RAW, PS_ATP_FIX_NONE, "channel, target raw, fix none");
    test_estimate(PS_ATTN_SELECT, 0, PS_KO_RAW, PS_ATP_FIX_NONE, "select, target raw, fix none");
    test_mask_and_errors();
    CHECK_DONE();
}
