#include "knockout.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void ps_knockout_result_free(ps_knockout_result *r) {
    ps_residue_stats_free(&r->clean);
    if (r->cells)
        for (int64_t i = 0; i < (int64_t)r->n_layers * r->n_heads; i++) ps_residue_stats_free(&r->cells[i]);
    free(r->cells);
    free(r->layers);
    free(r->heads);
    memset(r, 0, sizeof *r);
}

/* Means of one shift: per selected layer, [npos, nkv, hd] for each replaced array. */
typedef struct {
    int n_arr;            /* 2 (k/v or ck/cv) or 4 */
    ps_hook_point pt[4];  /* which arrays */
    int64_t npos[4];
    double *sum[4];       /* [n_layers][npos][nkv][hd] */
} means;

static float *act_array(const ps_act_ptrs *p, ps_hook_point pt) {
    switch (pt) {
    case PS_HOOK_K: return p->k;
    case PS_HOOK_V: return p->v;
    case PS_HOOK_CK: return p->ck;
    default: return p->cv;
    }
}

typedef struct {
    const means *mn;
    int li, head;
    int64_t nkv, hd, count;
} ko_hook_ctx;

/* overwrite head g of the event's [B, npos, nkv, hd] array with the means */
static void write_means(float *x, int64_t B, int64_t npos, int64_t nkv, int64_t hd, int64_t g, const double *sum,
                        int64_t count) {
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < npos; t++) {
            float *dst = x + ((b * npos + t) * nkv + g) * hd;
            const double *src = sum + (t * nkv + g) * hd;
            for (int64_t e = 0; e < hd; e++) dst[e] = (float)(src[e] / (double)count);
        }
}

static int ko_hook(const ps_hook_event *ev, void *user, ps_error *err) {
    (void)err;
    ko_hook_ctx *c = user;
    for (int k = 0; k < c->mn->n_arr; k++)
        if (c->mn->pt[k] == ev->point) {
            int64_t npos = c->mn->npos[k];
            write_means(ev->data, ev->shape[0], npos, c->nkv, c->hd, c->head,
                        c->mn->sum[k] + (int64_t)c->li * npos * c->nkv * c->hd, c->count);
        }
    return 0;
}

int ps_knockout_grid(const ps_model *m, const ps_batch *base, const ps_task *task, const ps_filler_family *fam,
                     int64_t P, uint64_t seed, int64_t batch, const int *layers, int n_layers, const int *heads,
                     int n_heads, ps_ko_target target, int naive, ps_knockout_result *out, ps_progress_fn progress,
                     void *user, ps_error *err) {
    memset(out, 0, sizeof *out);
    const ps_config *c = &m->cfg;
    if ((target & PS_KO_COMPRESSED) && c->kind != PS_ATTN_COMPRESSED)
        return ps_fail(err, "--target %s: a full-attention model has no compressed entries (use --target raw)",
                       target == PS_KO_BOTH ? "both" : "compressed");
    out->P = P;
    out->n_layers = n_layers;
    out->n_heads = n_heads;
    if (n_layers < 1 || n_heads < 1) return ps_fail(err, "knockout grid: no layers or no heads selected");
    out->layers = malloc((size_t)n_layers * sizeof(int));
    out->heads = malloc((size_t)n_heads * sizeof(int));
    out->cells = calloc((size_t)n_layers * (size_t)n_heads, sizeof *out->cells);
    if (!out->layers || !out->heads || !out->cells)
        return ps_fail(err, "out of memory for a knockout grid of %d layers x %d heads", n_layers, n_heads);
    /* visit layers top-down */
    memcpy(out->layers, layers, (size_t)n_layers * sizeof(int));
    memcpy(out->heads, heads, (size_t)n_heads * sizeof(int));
    for (int i = 0; i < n_layers; i++)
        for (int j = i + 1; j < n_layers; j++)
            if (out->layers[j] > out->layers[i]) {
                int t = out->layers[i];
                out->layers[i] = out->layers[j];
                out->layers[j] = t;
            }
    int rc = ps_residue_stats_init(&out->clean, P, err);
    for (int64_t i = 0; i < (int64_t)n_layers * n_heads && !rc; i++) rc = ps_residue_stats_init(&out->cells[i], P, err);
    if (rc) return -1;
    int64_t N = base->B, nkv = c->n_kv_heads, hd = c->head_dim, maxq = base->max_q;
    int *ok = malloc((size_t)(N * maxq) * sizeof(int));
    double *lp = malloc((size_t)(N * maxq) * sizeof(double));
    if (!ok || !lp)
        rc = ps_fail(err, "out of memory for the outcomes of %lld prompts x %lld queries", (long long)N, (long long)maxq);
    int64_t total = P * (1 + (int64_t)n_layers * n_heads);
    for (int64_t p = 0; p < P && !rc; p++) {
        ps_shifted s;
        if ((rc = ps_make_shifted(base, task, fam, PS_SWEEP_PAD, P, p, seed, c->max_seq_len, &s, err))) break;
        int64_t T = s.b.T, nW = ps_config_n_windows(c, T);
        means mn;
        memset(&mn, 0, sizeof mn);
        if (target & PS_KO_COMPRESSED) {
            mn.pt[mn.n_arr] = PS_HOOK_CK, mn.npos[mn.n_arr++] = nW;
            mn.pt[mn.n_arr] = PS_HOOK_CV, mn.npos[mn.n_arr++] = nW;
        }
        if (target & PS_KO_RAW) {
            mn.pt[mn.n_arr] = PS_HOOK_K, mn.npos[mn.n_arr++] = T;
            mn.pt[mn.n_arr] = PS_HOOK_V, mn.npos[mn.n_arr++] = T;
        }
        for (int k = 0; k < mn.n_arr && !rc; k++) {
            mn.sum[k] = calloc((size_t)n_layers * (size_t)(mn.npos[k] ? mn.npos[k] : 1) * (size_t)(nkv * hd), sizeof(double));
            if (!mn.sum[k])
                rc = ps_fail(err, "out of memory for the means of %d layers x %lld positions x %lld KV heads", n_layers,
                             (long long)mn.npos[k], (long long)nkv);
        }
        /* everything below is created only when what precedes it succeeded; cleanup frees only what was
         * created (a zeroed ps_acts / NULL pointer is never freed as if it were live) */
        ps_acts a = {0};
        int have_a = 0;
        int64_t B = batch < N ? batch : N;
        int64_t ans = task->kind == PS_TASK_KV ? task->value_len : 1;
        int64_t *rows = NULL;
        if (!rc) {
            /* sizes in double first: a corrupt task (absurd value_len) must fail here, not wrap around */
            if ((double)B * (double)maxq * (double)ans * 8.0 > 9e18) rows = NULL;
            else rows = malloc((size_t)(B * maxq * ans) * sizeof(int64_t));
            if (!rows)
                rc = ps_fail(err, "out of memory for the answer rows of %lld prompts x %lld queries x %lld answer tokens",
                             (long long)B, (long long)maxq, (long long)ans);
        }
        if (!rc) {
            rc = ps_acts_create(&a, c, B, T, true, err);
            have_a = !rc;
        }
        /* pass 1: the means over all prompts of this shift */
        for (int64_t i0 = 0; i0 < N && !rc; i0 += B) {
            int64_t n = N - i0 < B ? N - i0 : B;
            ps_acts part = {0}, *use = &a;
            if (n != B && (rc = ps_acts_create(&part, c, n, T, true, err))) break;
            if (n != B) use = &part;
            rc = ps_forward(m, use, s.b.tokens + i0 * T, NULL, err);
            for (int li = 0; li < n_layers && !rc; li++) {
                ps_act_ptrs lp_ = ps_acts_layer(use, out->layers[li]);
                for (int k = 0; k < mn.n_arr; k++) {
                    const float *x = act_array(&lp_, mn.pt[k]);
                    double *sum = mn.sum[k] + (int64_t)li * mn.npos[k] * nkv * hd;
                    int64_t per = mn.npos[k] * nkv * hd;
                    for (int64_t b = 0; b < n; b++)
                        for (int64_t e = 0; e < per; e++) sum[e] += x[b * per + e];
                }
            }
            if (use != &a) ps_acts_free(&part);
        }
        /* pass 2: clean and knocked-out runs per batch */
        for (int64_t i0 = 0; i0 < N && !rc; i0 += B) {
            int64_t n = N - i0 < B ? N - i0 : B;
            ps_acts part = {0}, *use = &a;
            if (n != B && (rc = ps_acts_create(&part, c, n, T, true, err))) break;
            if (n != B) use = &part;
            ps_batch view = s.b;
            view.B = n;
            view.tokens = s.b.tokens + i0 * T;
            view.n_q = s.b.n_q + i0;
            view.queries = s.b.queries + i0 * maxq;
            ps_shifted sv = s;
            sv.b = view;
            sv.residue = s.residue + i0 * maxq;
            /* the rows whose logits are scored: every answer token of every query of the batch */
            int64_t n_rows = 0;
            for (int64_t b = 0; b < n; b++)
                for (int64_t q = 0; q < view.n_q[b]; q++)
                    for (int64_t t = 0; t < view.queries[b * maxq + q].answer_len; t++)
                        rows[n_rows++] = b * T + view.queries[b * maxq + q].answer_pos + t;
            /* one batch: pass 1 already left this batch's clean activations in place */
            if (N > B) rc = ps_forward(m, use, view.tokens, NULL, err);
            if (!rc) {
                ps_score_queries(&view, use->p.logits, c->vocab_size, ok, lp);
                ps_residue_stats_add(&out->clean, &sv, ok, lp);
            }
            for (int li = 0; li < n_layers && !rc; li++) {
                int l = out->layers[li];
                for (int hi = 0; hi < n_heads && !rc; hi++) {
                    int g = heads[hi];
                    if (naive) {
                        ps_hooks h;
                        ps_hooks_init(&h);
                        ko_hook_ctx ctx = {.mn = &mn, .li = li, .head = g, .nkv = nkv, .hd = hd, .count = N};
                        for (int k = 0; k < mn.n_arr && !rc; k++) {
                            char name[96];
                            ps_hook_name(name, sizeof name, l, mn.pt[k]);
                            rc = ps_hooks_add(&h, c, name, ko_hook, &ctx, err);
                        }
                        if (!rc) rc = ps_forward(m, use, view.tokens, &h, err);
                        ps_hooks_free(&h);
                    } else {
                        /* replace head g in layer l's kept arrays, run from its attention, restore */
                        ps_act_ptrs lp_ = ps_acts_layer(use, l);
                        float *saved[4] = {0};
                        for (int k = 0; k < mn.n_arr; k++) {
                            float *x = act_array(&lp_, mn.pt[k]);
                            int64_t cnt = n * mn.npos[k] * nkv * hd;
                            saved[k] = malloc((size_t)(cnt ? cnt : 1) * sizeof(float));
                            if (!saved[k]) {
                                rc = ps_fail(err, "out of memory for a copy of layer %d's kept activations", l);
                                continue;
                            }
                            memcpy(saved[k], x, (size_t)cnt * sizeof(float));
                            write_means(x, n, mn.npos[k], nkv, hd, g, mn.sum[k] + (int64_t)li * mn.npos[k] * nkv * hd, N);
                        }
                        if (!rc) rc = ps_forward_from_attention_rows(m, use, l, rows, n_rows, err);
                        for (int k = 0; k < mn.n_arr; k++) {
                            if (!saved[k]) continue;
                            memcpy(act_array(&lp_, mn.pt[k]), saved[k],
                                   (size_t)(n * mn.npos[k] * nkv * hd) * sizeof(float));
                            free(saved[k]);
                        }
                    }
                    if (!rc) {
                        ps_score_queries(&view, use->p.logits, c->vocab_size, ok, lp);
                        ps_residue_stats_add(&out->cells[li * n_heads + hi], &sv, ok, lp);
                    }
                }
            }
            if (use != &a) ps_acts_free(&part);
        }
        if (have_a) ps_acts_free(&a);
        free(rows);
        for (int k = 0; k < mn.n_arr; k++) free(mn.sum[k]);
        ps_shifted_free(&s);
        if (progress) progress((p + 1) * (1 + (int64_t)n_layers * n_heads), total, user);
    }
    free(ok);
    free(lp);
    return rc;
}

#define SET(o, key, v) (bad |= json_object_set_new((o), (key), (v)) != 0)

json_t *ps_knockout_json(const ps_knockout_result *r, ps_ko_target target, ps_error *err) {
    int bad = 0;
    json_t *o = json_object(), *cells = json_array(), *clean = ps_residue_stats_json(&r->clean, err);
    if (!o || !cells || !clean) {
        json_decref(o);
        json_decref(cells);
        json_decref(clean);
        if (o && cells) return NULL; /* err already names what failed */
        ps_fail(err, "out of memory for the knockout summary");
        return NULL;
    }
    SET(o, "period", json_integer(r->P));
    SET(o, "target", json_string(target == PS_KO_RAW ? "raw" : target == PS_KO_COMPRESSED ? "compressed" : "both"));
    SET(o, "clean", clean);
    /* cells in ascending layer order */
    for (int want = -1;;) {
        int next = 1 << 30;
        for (int li = 0; li < r->n_layers; li++)
            if (r->layers[li] > want && r->layers[li] < next) next = r->layers[li];
        if (next == 1 << 30) break;
        want = next;
        int li = 0;
        while (r->layers[li] != want) li++;
        for (int hi = 0; hi < r->n_heads; hi++) {
            const ps_residue_stats *cs = &r->cells[(int64_t)li * r->n_heads + hi];
            json_t *cell = json_object(), *res = json_array();
            SET(cell, "layer", json_integer(want));
            SET(cell, "head", json_integer(r->heads[hi]));
            double sum_da = 0, sum_dn = 0, worst_da = INFINITY, worst_dn = 0, worst_ac = 0, worst_ak = 0;
            int64_t used = 0, worst = -1;
            for (int64_t rho = 0; rho < r->P; rho++) {
                json_t *e = json_object();
                double ac = ps_residue_accuracy(&r->clean, rho), ak = ps_residue_accuracy(cs, rho);
                double nc = r->clean.n[rho] ? -r->clean.lp[rho] / (double)r->clean.n[rho] : 0;
                double nk = cs->n[rho] ? -cs->lp[rho] / (double)cs->n[rho] : 0;
                SET(e, "rho", json_integer(rho));
                SET(e, "n", json_integer(cs->n[rho]));
                SET(e, "accuracy", json_real(ak));
                SET(e, "mean_nll", json_real(nk));
                SET(e, "delta_accuracy_pp", json_real(100.0 * (ak - ac)));
                SET(e, "delta_nll", json_real(nk - nc));
                bad |= json_array_append_new(res, e) != 0;
                if (cs->n[rho]) {
                    double da = 100.0 * (ak - ac), dn = nk - nc;
                    sum_da += da;
                    sum_dn += dn;
                    used++;
                    /* the residue the head hurts most: largest accuracy drop, ties by the larger NLL increase */
                    if (worst < 0 || da < worst_da - 1e-9 || (fabs(da - worst_da) <= 1e-9 && dn > worst_dn)) {
                        worst = rho;
                        worst_da = da;
                        worst_dn = dn;
                        worst_ac = ac;
                        worst_ak = ak;
                    }
                }
            }
            SET(cell, "residues", res);
            SET(cell, "mean_delta_accuracy_pp", json_real(used ? sum_da / (double)used : 0));
            SET(cell, "mean_delta_nll", json_real(used ? sum_dn / (double)used : 0));
            if (worst >= 0) {
                json_t *w = json_object();
                SET(w, "rho", json_integer(worst));
                SET(w, "clean_accuracy", json_real(worst_ac));
                SET(w, "accuracy", json_real(worst_ak));
                SET(w, "delta_accuracy_pp", json_real(worst_da));
                SET(w, "delta_nll", json_real(worst_dn));
                SET(cell, "worst_residue", w);
            } else
                SET(cell, "worst_residue", json_null());
            bad |= json_array_append_new(cells, cell) != 0;
        }
    }
    SET(o, "cells", cells);
    if (bad) {
        json_decref(o);
        ps_fail(err, "out of memory while building the knockout summary");
        return NULL;
    }
    return o;
}
