/* test_interventions.c — the interventions built on the public hook mechanism (docs/hooks.md):
 *   - a user's mean replacement (run_with_cache on the clean prompts, means averaged here, a PS_ACT_SET
 *     action registered with ps_hooks_add_action on a full forward) gives exactly the knockout grid's
 *     per-residue numbers (naive path bit for bit, batched path to float rounding);
 *   - the knockout grid against a mean replacement written here from scratch in plain loops (a caching
 *     host callback on clean forwards, per-position means over the prompts of a shift, a host callback
 *     that overwrites the head, ps_score_queries), on the trained default model and a random one:
 *     accuracy deltas equal, NLL deltas within 1e-5;
 *   - activation patching: patching a whole residual stream from clean gives the clean metric, a patch
 *     after the last answer row gives the corrupted metric, one (layer, head, position) cell equals a
 *     hand-written patch through a host callback, batched cells equal one cell per forward, and the
 *     errors;
 *   - activation patching run by the grid engine against a plain loop written here (one full forward
 *     per cell, the clean activation written in by a host callback): the naive path bit for bit, the
 *     batched path (restarted from the layer, cells as replicas) to float rounding. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/forward.h"
#include "interventions/knockout.h"
#include "interventions/patching.h"
#include "interventions/sweep.h"
#include "tasks/tasks.h"
#include "testutil.h"

static ps_filler_family repeat_family(void) {
    ps_filler_family f = {.name = "repeat", .n_pattern = 1, .pattern = {0}};
    return f;
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

/* ---- 1. a user's mean-replace action = the instrument's numbers ---- */

static void test_user_action(ps_ko_target target) {
    const char *tname = target == PS_KO_RAW ? "raw" : "compressed";
    ps_model m;
    make_model(&m, PS_ATTN_COMPRESSED, 91);
    ps_task t = small_task();
    ps_batch base;
    ps_error err;
    const int64_t N = 10, P = 4, batch = 4;
    const int L = 1, G = 1;
    ps_batch_alloc(&base, N, t.seq_len, t.n_queries, &err);
    CHECK(ps_task_generate(&t, 13, &base, NULL) == 0, "task generation");
    ps_filler_family fam = repeat_family();
    int layers[1] = {L}, heads[1] = {G};
    ps_knockout_result naive, fast;
    ps_knockout_opts on = {.naive = 1};
    REQUIRE_OK(tu_knockout_opts(&m, &base, &t, &fam, P, 0, batch, layers, 1, heads, 1, target, &on, &naive, NULL, NULL, &err), &err);
    REQUIRE_OK(tu_knockout_opts(&m, &base, &t, &fam, P, 0, batch, layers, 1, heads, 1, target, NULL, &fast, NULL, NULL, &err), &err);
    ps_residue_stats mine, clean;
    ps_residue_stats_init(&mine, P, &err);
    ps_residue_stats_init(&clean, P, &err);
    const int64_t nkv = m.cfg.n_kv_heads, hd = m.cfg.head_dim;
    const char *pts[2] = {target == PS_KO_RAW ? "attn.hook_k" : "attn.hook_ck", target == PS_KO_RAW ? "attn.hook_v" : "attn.hook_cv"};
    for (int64_t p = 0; p < P; p++) {
        ps_shifted s;
        REQUIRE_OK(ps_make_shifted(&base, &t, &fam, PS_SWEEP_PAD, P, p, 0, m.cfg.max_seq_len, &s, &err), &err);
        int64_t T = s.b.T, npos = target == PS_KO_RAW ? T : ps_config_n_windows(&m.cfg, T), per = npos * nkv * hd;
        char names[2][96];
        const char *np[2] = {names[0], names[1]};
        for (int w = 0; w < 2; w++) snprintf(names[w], 96, "blocks.%d.%s", L, pts[w]);
        /* the clean prompts in batches, cached; the mean over all prompts of the shift, in double */
        double *sum = calloc((size_t)(2 * per), sizeof(double));
        float *mean = malloc((size_t)(2 * per) * sizeof(float));
        for (int64_t i0 = 0; i0 < N; i0 += batch) {
            int64_t n = N - i0 < batch ? N - i0 : batch;
            ps_cache cache;
            ps_cache_init(&cache);
            CHECK_OK(ps_run_with_cache(&m, s.b.tokens + i0 * T, n, T, np, 2, &cache, &err), &err);
            for (int w = 0; w < 2; w++) {
                const ps_cache_item *it = ps_cache_get(&cache, names[w]);
                CHECK(it && it->shape[0] == n && it->shape[1] == npos, "%s: cached %s has the wrong shape", tname, names[w]);
                for (int64_t b = 0; it && b < n; b++)
                    for (int64_t e = 0; e < per; e++) sum[w * per + e] += it->data[b * per + e];
            }
            ps_cache_free(&cache);
        }
        for (int64_t e = 0; e < 2 * per; e++) mean[e] = (float)(sum[e] / (double)N);
        /* the user's hooks: a mean-replace action on head G of each array */
        ps_hooks h;
        ps_hooks_init(&h);
        for (int w = 0; w < 2; w++) {
            ps_hook_action act = {.kind = PS_ACT_SET, .head = G, .src = ps_hooks_upload(&h, m.ctx, mean + w * per, per, &err), .src_npos = npos};
            CHECK_OK(ps_hooks_add_action(&h, &m.cfg, names[w], &act, &err), &err);
        }
        /* full forwards in the instrument's batches, scored as it scores (it adds the last batch first) */
        int64_t last0 = (N - 1) / batch * batch;
        int *ok = malloc((size_t)(N * s.b.max_q) * sizeof(int));
        double *lp = malloc((size_t)(N * s.b.max_q) * sizeof(double));
        for (int64_t i0 = last0; i0 >= 0; i0 -= batch) {
            int64_t n = N - i0 < batch ? N - i0 : batch;
            ps_batch view = ps_batch_view(&s.b, i0, n);
            ps_shifted sv = s;
            sv.b = view;
            sv.residue = s.residue + i0 * s.b.max_q;
            ps_acts a;
            CHECK_OK(ps_acts_create(&a, m.ctx, &m.cfg, n, T, false, &err), &err);
            CHECK_OK(ps_forward(&m, &a, view.tokens, NULL, &err), &err);
            ps_score_queries(&view, a.p.logits, m.cfg.vocab_size, ok, lp);
            ps_residue_stats_add(&clean, &sv, ok, lp);
            CHECK_OK(ps_forward(&m, &a, view.tokens, &h, &err), &err);
            ps_score_queries(&view, a.p.logits, m.cfg.vocab_size, ok, lp);
            ps_residue_stats_add(&mine, &sv, ok, lp);
            ps_acts_free(&a);
        }
        free(ok);
        free(lp);
        ps_hooks_free(&h);
        free(sum);
        free(mean);
        ps_shifted_free(&s);
    }
    int exact = 1, same_k = 1, changed = 0;
    double worst = 0;
    for (int r = 0; r < P; r++) {
        exact &= mine.n[r] == naive.cells[0].n[r] && mine.k[r] == naive.cells[0].k[r] && mine.lp[r] == naive.cells[0].lp[r] &&
                 clean.k[r] == naive.clean.k[r] && clean.lp[r] == naive.clean.lp[r];
        same_k &= mine.k[r] == fast.cells[0].k[r] && mine.n[r] == fast.cells[0].n[r];
        worst = fmax(worst, fabs(mine.lp[r] - fast.cells[0].lp[r]) / fabs(mine.lp[r]));
        changed |= fabs(mine.lp[r] - clean.lp[r]) > 1e-3 * fabs(clean.lp[r]);
    }
    CHECK(exact, "%s: a user's mean-replace action does not give the naive grid's numbers exactly", tname);
    CHECK(same_k && worst < 1e-5, "%s: a user's mean-replace action differs from the batched grid (rel %g)", tname, worst);
    CHECK(changed, "%s: the knockout changed nothing (the comparison would be vacuous)", tname);
    ps_residue_stats_free(&mine);
    ps_residue_stats_free(&clean);
    ps_knockout_result_free(&naive);
    ps_knockout_result_free(&fast);
    ps_batch_free(&base);
    ps_model_free(&m);
}

/* ---- 2. the grid against a mean replacement from scratch ---- */

typedef struct {
    ps_hook_point pts[2];
    float *buf[2];   /* [N, npos, nkv, hd]: the clean entries */
    double *mean[2]; /* [npos, nkv, hd] */
    int64_t npos, nkv, hd, head;
    int write;
} scratch_ko;

static int scratch_hook(const ps_hook_event *ev, void *user, ps_error *err) {
    (void)err;
    scratch_ko *c = user;
    int w = ev->point == c->pts[0] ? 0 : 1;
    int64_t B = ev->shape[0];
    if (!c->write) {
        memcpy(c->buf[w], ev->data, (size_t)(B * c->npos * c->nkv * c->hd) * sizeof(float));
        return 0;
    }
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < c->npos; t++)
            for (int64_t e = 0; e < c->hd; e++)
                ev->data[((b * c->npos + t) * c->nkv + c->head) * c->hd + e] = (float)c->mean[w][(t * c->nkv + c->head) * c->hd + e];
    return 0;
}

static void scratch_vs_grid(const char *label, ps_model *m, const ps_task *t, const ps_batch *base, const ps_filler_family *fam,
                            int64_t P, int layer, const int *heads, int n_heads, ps_ko_target target, int64_t batch) {
    ps_error err;
    ps_knockout_result grid;
    REQUIRE_OK(tu_knockout_opts(m, base, t, fam, P, 0, batch, &layer, 1, heads, n_heads, target, NULL, &grid, NULL, NULL, &err), &err);
    json_t *j = ps_knockout_json(&grid, ps_ko_target_name(target), NULL, &err);
    const int64_t N = base->B, nkv = m->cfg.n_kv_heads, hd = m->cfg.head_dim, V = m->cfg.vocab_size;
    int64_t *nn = calloc((size_t)P, sizeof(int64_t)), *kc = calloc((size_t)P, sizeof(int64_t));
    int64_t *kk = calloc((size_t)(n_heads * P), sizeof(int64_t));
    double *lc = calloc((size_t)P, sizeof(double)), *lk = calloc((size_t)(n_heads * P), sizeof(double));
    for (int64_t p = 0; p < P; p++) {
        ps_shifted s;
        REQUIRE_OK(ps_make_shifted(base, t, fam, PS_SWEEP_PAD, P, p, 0, m->cfg.max_seq_len, &s, &err), &err);
        int64_t T = s.b.T, maxq = s.b.max_q;
        scratch_ko c = {.npos = target == PS_KO_COMPRESSED ? ps_config_n_windows(&m->cfg, T) : T, .nkv = nkv, .hd = hd};
        c.pts[0] = target == PS_KO_COMPRESSED ? PS_HOOK_CK : PS_HOOK_K;
        c.pts[1] = target == PS_KO_COMPRESSED ? PS_HOOK_CV : PS_HOOK_V;
        int64_t per = c.npos * nkv * hd;
        ps_hooks h;
        ps_hooks_init(&h);
        for (int w = 0; w < 2; w++) {
            c.buf[w] = malloc((size_t)(N * per) * sizeof(float));
            c.mean[w] = calloc((size_t)per, sizeof(double));
            char name[96];
            ps_hook_name(name, sizeof name, layer, c.pts[w]);
            CHECK_OK(ps_hooks_add(&h, &m->cfg, name, scratch_hook, &c, &err), &err);
        }
        ps_acts a;
        REQUIRE_OK(ps_acts_create(&a, m->ctx, &m->cfg, N, T, false, &err), &err);
        int *ok = malloc((size_t)(N * maxq) * sizeof(int));
        double *lq = malloc((size_t)(N * maxq) * sizeof(double));
        /* clean pass: cache the entries, score */
        CHECK_OK(ps_forward(m, &a, s.b.tokens, &h, &err), &err);
        ps_score_queries(&s.b, a.p.logits, V, ok, lq);
        for (int64_t b = 0; b < N; b++)
            for (int64_t q = 0; q < s.b.n_q[b]; q++) {
                int64_t rho = s.residue[b * maxq + q];
                nn[rho]++;
                kc[rho] += ok[b * maxq + q];
                lc[rho] += lq[b * maxq + q];
            }
        /* per-position means over the prompts of this shift */
        for (int w = 0; w < 2; w++)
            for (int64_t e = 0; e < per; e++) {
                double sum = 0;
                for (int64_t b = 0; b < N; b++) sum += c.buf[w][b * per + e];
                c.mean[w][e] = sum / (double)N;
            }
        /* each head knocked out by the overwriting callback */
        c.write = 1;
        for (int hi = 0; hi < n_heads; hi++) {
            c.head = heads[hi];
            CHECK_OK(ps_forward(m, &a, s.b.tokens, &h, &err), &err);
            ps_score_queries(&s.b, a.p.logits, V, ok, lq);
            for (int64_t b = 0; b < N; b++)
                for (int64_t q = 0; q < s.b.n_q[b]; q++) {
                    int64_t rho = s.residue[b * maxq + q];
                    kk[hi * P + rho] += ok[b * maxq + q];
                    lk[hi * P + rho] += lq[b * maxq + q];
                }
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
    /* the grid's JSON lists the cells in ascending layer order, heads as given */
    json_t *cells = json_object_get(j, "cells");
    CHECK(json_array_size(cells) == (size_t)n_heads, "%s: %zu cells", label, json_array_size(cells));
    int acc_equal = 1, changed_acc = 0, changed_nll = 0;
    double worst_nll = 0;
    for (int hi = 0; hi < n_heads && json_array_size(cells) == (size_t)n_heads; hi++) {
        json_t *res = json_object_get(json_array_get(cells, (size_t)hi), "residues");
        for (int64_t r = 0; r < P; r++) {
            json_t *e = json_array_get(res, (size_t)r);
            double ac = nn[r] ? (double)kc[r] / (double)nn[r] : 0, ak = nn[r] ? (double)kk[hi * P + r] / (double)nn[r] : 0;
            double nc = nn[r] ? -lc[r] / (double)nn[r] : 0, nk = nn[r] ? -lk[hi * P + r] / (double)nn[r] : 0;
            double da = 100.0 * (ak - ac), dn = nk - nc;
            acc_equal &= json_integer_value(json_object_get(e, "n")) == nn[r] && json_real_value(json_object_get(e, "delta_accuracy_pp")) == da;
            worst_nll = fmax(worst_nll, fabs(json_real_value(json_object_get(e, "delta_nll")) - dn));
            changed_acc |= da != 0;
            changed_nll |= fabs(dn) > 1e-3;
        }
    }
    CHECK(acc_equal, "%s: the grid's accuracy deltas differ from the mean replacement written from scratch", label);
    CHECK(worst_nll < 1e-5, "%s: the grid's NLL deltas differ from the mean replacement written from scratch by %g", label, worst_nll);
    CHECK(changed_nll, "%s: no knockout changed the NLL (the comparison would be vacuous)", label);
    printf("%s: accuracy changed by some knockout: %s; NLL deltas agree to %.2g\n", label, changed_acc ? "yes" : "no", worst_nll);
    json_decref(j);
    free(nn);
    free(kc);
    free(kk);
    free(lc);
    free(lk);
    ps_knockout_result_free(&grid);
}

static void test_scratch_default_model(void) {
    ps_model m;
    ps_error err;
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/data/models/w8s8", PS_SOURCE_DIR);
    REQUIRE_OK(ps_model_load(&m, dir, &err), &err);
    ps_task t;
    REQUIRE_OK(ps_model_task(&m, dir, &t, &err), &err);
    ps_batch base;
    ps_batch_alloc(&base, 12, t.seq_len, t.n_queries, &err);
    CHECK(ps_task_generate(&t, 11, &base, NULL) == 0, "task generation");
    ps_filler_family fam = repeat_family();
    int heads[2] = {2, 13};
    scratch_vs_grid("default model, compressed", &m, &t, &base, &fam, 4, 0, heads, 2, PS_KO_COMPRESSED, 8);
    scratch_vs_grid("default model, raw", &m, &t, &base, &fam, 4, 0, heads, 2, PS_KO_RAW, 8);
    ps_batch_free(&base);
    ps_model_free(&m);
}

static void test_scratch_random_model(void) {
    ps_model m;
    make_model(&m, PS_ATTN_FULL, 93);
    ps_task t = small_task();
    ps_batch base;
    ps_error err;
    ps_batch_alloc(&base, 9, t.seq_len, t.n_queries, &err);
    CHECK(ps_task_generate(&t, 17, &base, NULL) == 0, "task generation");
    ps_filler_family fam = repeat_family();
    int heads[2] = {1, 0};
    scratch_vs_grid("random full-attention model, raw", &m, &t, &base, &fam, 4, 1, heads, 2, PS_KO_RAW, 4);
    ps_batch_free(&base);
    ps_model_free(&m);
}

/* ---- 3. activation patching ---- */

/* clean: kv prompts; corrupted: the same prompts with every queried pair's value (in the context and in
 * the query) replaced by another value id. */
static void make_pair(const ps_task *t, int64_t N, uint64_t seed, ps_batch *clean, ps_batch *corr) {
    ps_error err;
    ps_batch_alloc(clean, N, t->seq_len, t->n_queries, &err);
    ps_batch_alloc(corr, N, t->seq_len, t->n_queries, &err);
    CHECK(ps_task_generate(t, seed, clean, NULL) == 0, "task generation");
    CHECK(ps_task_generate(t, seed, corr, NULL) == 0, "task generation");
    int64_t v0 = ps_task_val0(t), T = t->seq_len;
    for (int64_t b = 0; b < N; b++)
        for (int64_t qi = 0; qi < clean->n_q[b]; qi++) {
            const ps_query *q = &clean->queries[b * clean->max_q + qi];
            for (int64_t k = 0; k < q->answer_len; k++) {
                int32_t y = clean->tokens[b * T + q->answer_src + k], z = (int32_t)(v0 + (y - v0 + 1 + b % 3) % t->n_values);
                corr->tokens[b * T + q->key_pos + t->key_len + k] = z;
                corr->tokens[b * T + q->answer_src + k] = z;
            }
        }
}

/* the metrics, written again here */
static double my_metric(ps_patch_metric metric, const ps_batch *clean, const ps_batch *corr, const float *lg, int64_t V) {
    double acc = 0;
    int64_t n = 0, T = clean->T;
    for (int64_t b = 0; b < clean->B; b++)
        for (int64_t qi = 0; qi < clean->n_q[b]; qi++) {
            const ps_query *q = &clean->queries[b * clean->max_q + qi];
            n++;
            if (metric == PS_PATCH_LOGIT_DIFF) {
                const float *x = lg + (b * T + q->answer_pos) * V;
                acc += (double)x[clean->tokens[b * T + q->answer_src]] - (double)x[corr->tokens[b * T + q->answer_src]];
            } else
                for (int64_t k = 0; k < q->answer_len; k++) {
                    const float *x = lg + (b * T + q->answer_pos + k) * V;
                    double mx = x[0], s = 0;
                    for (int64_t i = 1; i < V; i++) mx = fmax(mx, x[i]);
                    for (int64_t i = 0; i < V; i++) s += exp((double)x[i] - mx);
                    acc -= (double)x[clean->tokens[b * T + q->answer_src + k]] - mx - log(s);
                }
        }
    return acc / (double)n;
}

typedef struct {
    const float *clean; /* [N, T, nh, hd] */
    int64_t head, pos;
} hand_patch;

static int hand_patch_hook(const ps_hook_event *ev, void *u, ps_error *e) {
    (void)e;
    hand_patch *p = u;
    int64_t B = ev->shape[0], T = ev->shape[1], nh = ev->shape[2], hd = ev->shape[3];
    for (int64_t b = 0; b < B; b++)
        for (int64_t k = 0; k < hd; k++) {
            int64_t i = ((b * T + p->pos) * nh + p->head) * hd + k;
            ev->data[i] = p->clean[i];
        }
    return 0;
}

static int64_t progress_done, progress_total;
static int progress_fn(int64_t done, int64_t total, void *user) {
    (void)user;
    progress_done = done;
    progress_total = total;
    return 0;
}

static int close_to(double a, double b) { return fabs(a - b) <= 1e-5 * (1 + fabs(b)); }

static void test_patching(ps_attn_kind kind) {
    const char *label = kind == PS_ATTN_FULL ? "full" : "compressed";
    ps_model m;
    make_model(&m, kind, 95);
    ps_task t = small_task();
    ps_batch clean, corr;
    const int64_t N = 5, V = m.cfg.vocab_size, T = t.seq_len;
    make_pair(&t, N, 19, &clean, &corr);
    ps_error err;
    /* the clean and corrupted metrics, by hand */
    double want_clean[2], want_corr[2];
    ps_acts a;
    REQUIRE_OK(ps_acts_create(&a, m.ctx, &m.cfg, N, T, false, &err), &err);
    CHECK_OK(ps_forward(&m, &a, clean.tokens, NULL, &err), &err);
    for (int k = 0; k < 2; k++) want_clean[k] = my_metric((ps_patch_metric)k, &clean, &corr, a.p.logits, V);
    CHECK_OK(ps_forward(&m, &a, corr.tokens, NULL, &err), &err);
    for (int k = 0; k < 2; k++) want_corr[k] = my_metric((ps_patch_metric)k, &clean, &corr, a.p.logits, V);
    CHECK(fabs(want_clean[0] - want_corr[0]) > 0.1, "%s: the corruption does not change the logit difference (%g vs %g)", label,
          want_clean[0], want_corr[0]);

    /* patching a whole residual stream from clean gives the clean metric, at every layer, for both
     * metrics; the clean and corrupted fields are the unpatched runs */
    for (int k = 0; k < 2; k++) {
        ps_patch_opts o = {.point = "hook_resid_pre", .metric = (ps_patch_metric)k};
        ps_patch_result r;
        progress_done = progress_total = 0;
        CHECK_OK(ps_activation_patching(&m, &clean, &corr, &o, &r, progress_fn, NULL, &err), &err);
        CHECK(r.n_layers == 3 && r.n_heads == 1 && r.heads[0] == -1 && r.n_pos == 1, "%s: resid_pre grid %dx%dx%lld", label,
              r.n_layers, r.n_heads, (long long)r.n_pos);
        CHECK(close_to(r.clean, want_clean[k]) && close_to(r.corrupted, want_corr[k]), "%s metric %d: clean %g (want %g), corrupted %g (want %g)",
              label, k, r.clean, want_clean[k], r.corrupted, want_corr[k]);
        int all = 1;
        for (int l = 0; l < r.n_layers; l++) all &= close_to(r.cells[l], want_clean[k]);
        CHECK(all, "%s metric %d: patching the whole residual stream does not give the clean metric", label, k);
        CHECK(progress_done == 3 && progress_total == 3, "%s: progress %lld/%lld", label, (long long)progress_done, (long long)progress_total);
        ps_patch_result_free(&r);
    }

    /* per position on the residual stream of layer 1: a position after the last answer row changes
     * nothing (causal), so its cell is the corrupted metric; patching an answer row changes it */
    int64_t last = 0, first_ans = T;
    for (int64_t b = 0; b < N; b++)
        for (int64_t qi = 0; qi < clean.n_q[b]; qi++) {
            const ps_query *q = &clean.queries[b * clean.max_q + qi];
            if (q->answer_pos + q->answer_len - 1 > last) last = q->answer_pos + q->answer_len - 1;
            if (q->answer_pos < first_ans) first_ans = q->answer_pos;
        }
    {
        int layer = 1;
        ps_patch_opts o = {.point = "hook_resid_pre", .layers = &layer, .n_layers = 1, .per_position = 1};
        ps_patch_result r;
        CHECK_OK(ps_activation_patching(&m, &clean, &corr, &o, &r, NULL, NULL, &err), &err);
        CHECK(r.n_pos == T && r.cells_per_forward > 1, "%s: %lld positions, %d cells per forward", label, (long long)r.n_pos, r.cells_per_forward);
        int after = last + 1 < T;
        for (int64_t p = last + 1; p < T; p++) after &= close_to(r.cells[p], want_corr[0]);
        CHECK(after, "%s: patching positions after the last answer row changed the metric", label);
        int moved = 0;
        for (int64_t p = 0; p <= last; p++) moved |= !close_to(r.cells[p], want_corr[0]);
        CHECK(moved, "%s: no position's patch changed the metric (vacuous)", label);
        ps_patch_result_free(&r);
    }

    /* one (layer, head, position) cell of attn.hook_z against a hand-written patch through a host
     * callback, and the batched loop against one cell per forward */
    {
        int layers[2] = {2, 1}, heads[2] = {3, 1};
        ps_patch_opts o = {.point = "attn.hook_z", .layers = layers, .n_layers = 2, .heads = heads, .n_heads = 2, .per_position = 1};
        ps_patch_opts o1 = o;
        o1.max_cells = 1;
        ps_patch_result r, r1;
        CHECK_OK(ps_activation_patching(&m, &clean, &corr, &o, &r, NULL, NULL, &err), &err);
        CHECK_OK(ps_activation_patching(&m, &clean, &corr, &o1, &r1, NULL, NULL, &err), &err);
        CHECK(r.cells_per_forward == 2 * T && r1.cells_per_forward == 1, "%s: %d and %d cells per forward", label, r.cells_per_forward,
              r1.cells_per_forward);
        int same = 1;
        for (int64_t i = 0; i < 2 * 2 * T; i++) same &= close_to(r.cells[i], r1.cells[i]);
        CHECK(same, "%s: batched patching cells differ from one cell per forward", label);
        /* the hand-written patch of layer 1, head 1, at the first answer row */
        ps_cache cache;
        ps_cache_init(&cache);
        const char *nm[1] = {"blocks.1.attn.hook_z"};
        CHECK_OK(ps_run_with_cache(&m, clean.tokens, N, T, nm, 1, &cache, &err), &err);
        hand_patch hp = {.clean = ps_cache_get(&cache, nm[0])->data, .head = 1, .pos = first_ans};
        ps_hooks h;
        ps_hooks_init(&h);
        CHECK_OK(ps_hooks_add(&h, &m.cfg, nm[0], hand_patch_hook, &hp, &err), &err);
        CHECK_OK(ps_forward(&m, &a, corr.tokens, &h, &err), &err);
        double hand = my_metric(PS_PATCH_LOGIT_DIFF, &clean, &corr, a.p.logits, V);
        double cell = r.cells[(1 * 2 + 1) * T + first_ans]; /* layers[1] = 1, heads[1] = 1 */
        CHECK(close_to(cell, hand), "%s: cell (layer 1, head 1, position %lld) = %g, the hand-written patch gives %g", label,
              (long long)first_ans, cell, hand);
        CHECK(!close_to(hand, want_corr[0]), "%s: the hand-written patch changed nothing (vacuous)", label);
        ps_hooks_free(&h);
        ps_cache_free(&cache);
        ps_patch_result_free(&r);
        ps_patch_result_free(&r1);
    }
    if (kind == PS_ATTN_COMPRESSED) { /* windows as positions: a compressed value head per window */
        ps_patch_opts o = {.point = "attn.hook_cv", .per_position = 1, .max_cells = 3};
        ps_patch_result r;
        CHECK_OK(ps_activation_patching(&m, &clean, &corr, &o, &r, NULL, NULL, &err), &err);
        CHECK(r.n_pos == ps_config_n_windows(&m.cfg, T) && r.n_heads == m.cfg.n_kv_heads && r.cells_per_forward == 3,
              "compressed: cv grid %d heads x %lld windows, %d cells per forward", r.n_heads, (long long)r.n_pos, r.cells_per_forward);
        ps_patch_result_free(&r);
    }
    /* errors */
    ps_patch_result r;
    ps_patch_opts bad = {.point = "attn.hook_pattern"};
    CHECK_ERR(ps_activation_patching(&m, &clean, &corr, &bad, &r, NULL, NULL, &err), &err, "hook_pattern");
    ps_patch_result_free(&r);
    bad.point = "attn.hook_zz";
    CHECK_ERR(ps_activation_patching(&m, &clean, &corr, &bad, &r, NULL, NULL, &err), &err, "unknown hook name");
    ps_patch_result_free(&r);
    int l9 = 9, h7 = 7;
    bad = (ps_patch_opts){.point = "attn.hook_z", .layers = &l9, .n_layers = 1};
    CHECK_ERR(ps_activation_patching(&m, &clean, &corr, &bad, &r, NULL, NULL, &err), &err, "layer 9");
    ps_patch_result_free(&r);
    bad = (ps_patch_opts){.point = "attn.hook_z", .heads = &h7, .n_heads = 1};
    CHECK_ERR(ps_activation_patching(&m, &clean, &corr, &bad, &r, NULL, NULL, &err), &err, "head 7", "4 heads");
    ps_patch_result_free(&r);
    ps_batch shorter = corr;
    shorter.B = N - 1;
    bad = (ps_patch_opts){.point = "attn.hook_z"};
    CHECK_ERR(ps_activation_patching(&m, &clean, &shorter, &bad, &r, NULL, NULL, &err), &err, "must match");
    ps_patch_result_free(&r);
    ps_acts_free(&a);
    ps_batch_free(&clean);
    ps_batch_free(&corr);
    ps_model_free(&m);
}

/* The engine-run patching against a plain loop written here: per cell one full forward of the
 * corrupted prompts whose activation at the point is overwritten from the clean run's cache by a host
 * callback (head `head` or every head, position `pos` or every position). The naive path equals it bit
 * for bit (same forward, same metric sum); the batched path (restarted from the layer, cells as
 * replicas) to float rounding; and the loop's metric is the one written again here. */
typedef struct {
    const float *clean; /* the point's clean activation [N, npos, <inner>] */
    int head;           /* -1: every head */
    int64_t pos;        /* -1: every position */
} loop_patch;

static int loop_patch_hook(const ps_hook_event *ev, void *u, ps_error *e) {
    (void)e;
    loop_patch *p = u;
    int64_t B = ev->shape[0], npos = ev->shape[1], nh = ev->ndim == 4 ? ev->shape[2] : 1, x = ev->ndim == 4 ? ev->shape[3] : ev->shape[2];
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < npos; t++)
            for (int64_t h = 0; h < nh; h++) {
                if ((p->pos >= 0 && t != p->pos) || (p->head >= 0 && h != p->head)) continue;
                int64_t i = ((b * npos + t) * nh + h) * x;
                memcpy(ev->data + i, p->clean + i, (size_t)x * sizeof(float));
            }
    return 0;
}

static void patching_vs_loop(const ps_model *m, const ps_batch *clean, const ps_batch *corr, ps_patch_opts o, const char *what) {
    ps_error err;
    int64_t N = clean->B, T = clean->T, V = m->cfg.vocab_size;
    ps_patch_result fast, naive;
    ps_patch_opts on = o;
    on.naive = 1;
    REQUIRE_OK(ps_activation_patching(m, clean, corr, &o, &fast, NULL, NULL, &err), &err);
    REQUIRE_OK(ps_activation_patching(m, clean, corr, &on, &naive, NULL, NULL, &err), &err);
    CHECK(fast.cells_per_forward > 1 && naive.cells_per_forward == 1, "%s: %d cells per forward batched, %d naive", what,
          fast.cells_per_forward, naive.cells_per_forward);
    ps_acts a;
    REQUIRE_OK(ps_acts_create(&a, m->ctx, &m->cfg, N, T, false, &err), &err);
    int bit = 1, close = 1, mine = 1, moved = 0;
    double worst = 0;
    for (int li = 0; li < fast.n_layers; li++) {
        char name[96];
        snprintf(name, sizeof name, "blocks.%d.%s", fast.layers[li], o.point);
        ps_cache cache;
        ps_cache_init(&cache);
        const char *nm[1] = {name};
        CHECK_OK(ps_run_with_cache(m, clean->tokens, N, T, nm, 1, &cache, &err), &err);
        for (int hi = 0; hi < fast.n_heads; hi++)
            for (int64_t t = 0; t < fast.n_pos; t++) {
                loop_patch lp = {.clean = ps_cache_get(&cache, name)->data, .head = fast.heads[hi], .pos = o.per_position ? t : -1};
                ps_hooks h;
                ps_hooks_init(&h);
                CHECK_OK(ps_hooks_add(&h, &m->cfg, name, loop_patch_hook, &lp, &err), &err);
                CHECK_OK(ps_forward(m, &a, corr->tokens, &h, &err), &err);
                ps_hooks_free(&h);
                double want = ps_patch_metric_value(o.metric, clean, corr, a.p.logits, V);
                int64_t ci = ((int64_t)li * fast.n_heads + hi) * fast.n_pos + t;
                bit &= naive.cells[ci] == want;
                close &= close_to(fast.cells[ci], want);
                mine &= close_to(my_metric(o.metric, clean, corr, a.p.logits, V), want);
                moved |= !close_to(want, fast.corrupted);
                worst = fmax(worst, fabs(fast.cells[ci] - want));
            }
        ps_cache_free(&cache);
    }
    CHECK(bit, "%s: the naive path differs from the plain loop (bit for bit)", what);
    CHECK(close, "%s: the batched path differs from the plain loop (worst %.3g)", what, worst);
    CHECK(mine, "%s: the library's metric differs from the one written here", what);
    CHECK(moved, "%s: no cell's patch changed the metric (vacuous)", what);
    CHECK(fast.clean == naive.clean && fast.corrupted == naive.corrupted, "%s: the clean and corrupted metrics depend on the path", what);
    ps_acts_free(&a);
    ps_patch_result_free(&fast);
    ps_patch_result_free(&naive);
}

static void test_patching_loop(ps_attn_kind kind) {
    const char *label = kind == PS_ATTN_FULL ? "full" : "compressed";
    ps_model m;
    make_model(&m, kind, 97);
    ps_task t = small_task();
    ps_batch clean, corr;
    make_pair(&t, 4, 23, &clean, &corr);
    char what[96];
    int layers[2] = {0, 2}, heads[1] = {1};
    snprintf(what, sizeof what, "%s, attn.hook_v per position, logit diff", label);
    patching_vs_loop(&m, &clean, &corr,
                     (ps_patch_opts){.point = "attn.hook_v", .layers = layers, .n_layers = 2, .heads = heads, .n_heads = 1, .per_position = 1},
                     what);
    snprintf(what, sizeof what, "%s, hook_mlp_out per position, answer NLL", label);
    patching_vs_loop(&m, &clean, &corr, (ps_patch_opts){.point = "hook_mlp_out", .per_position = 1, .metric = PS_PATCH_ANSWER_NLL},
                     what);
    snprintf(what, sizeof what, "%s, attn.hook_q per head, a small budget", label);
    patching_vs_loop(&m, &clean, &corr, (ps_patch_opts){.point = "attn.hook_q", .max_cells = 3}, what);
    if (kind == PS_ATTN_COMPRESSED) {
        snprintf(what, sizeof what, "%s, attn.hook_ck per window", label);
        patching_vs_loop(&m, &clean, &corr, (ps_patch_opts){.point = "attn.hook_ck", .per_position = 1}, what);
    }
    ps_batch_free(&clean);
    ps_batch_free(&corr);
    ps_model_free(&m);
}

int main(void) {
    test_user_action(PS_KO_COMPRESSED);
    test_user_action(PS_KO_RAW);
    test_scratch_default_model();
    test_scratch_random_model();
    test_patching(PS_ATTN_FULL);
    test_patching(PS_ATTN_COMPRESSED);
    test_patching_loop(PS_ATTN_FULL);
    test_patching_loop(PS_ATTN_COMPRESSED);
    CHECK_DONE();
}
