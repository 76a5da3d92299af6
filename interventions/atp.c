/* atp.c — attribution patching as a grid spec (atp.h). */
#include "interventions/atp.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/ops.h"
#include "interventions/ko_spec.h"

const char *const ps_atp_fix_names[] = {"none", "qk", NULL};

int ps_atp_default_fix(const ps_runtime *rt) {
    (void)rt; /* measured on the shipped models (docs/results.md), fix qk found no strong cell fix none missed */
    return PS_ATP_FIX_NONE;
}

const char *ps_atp_fix_missing(const ps_runtime *rt, int fix, char *buf, size_t n) {
    const ps_family *f = rt->family;
    if (!f->grad.backward || !f->grad.backward_free || !f->grad.state_point) {
        snprintf(buf, n, "--method atp: %s checkpoints have no backward pass in phasescope, so there are no gradients to "
                         "attribute with (use --method exact)", f->name);
        return buf;
    }
    if (fix == PS_ATP_FIX_QK && !f->grad.patch_attention) {
        snprintf(buf, n, "--atp-fix qk: %s checkpoints have no recomputed attention in phasescope (the family has no "
                         "patch_attention); use --atp-fix none", f->name);
        return buf;
    }
    if (fix == PS_ATP_FIX_QK && f->grad.patch_missing) return f->grad.patch_missing(rt, buf, n);
    return NULL;
}

const char *ps_atp_target_missing(const ps_runtime *rt, int target, char *buf, size_t n) {
    const ps_family *f = rt->family;
    return f->grad.target_missing ? f->grad.target_missing(rt, target, buf, n) : NULL;
}

/* The estimate over any family with gradients at hook points (its core entries backward, state_point and, fix
 * qk, patch_attention), from the target's arrays (its ko_arrays: the points a cell sets) and the knockout's
 * means. */
typedef struct {
    ps_grid_spec ko; /* the knockout's spec: its sources are the means */
    int fix, target;
    const int *heads;
    int n_heads;
    ps_ko_array arr[PS_KO_MAX_ARRAYS];
    int n_arr;
    void *bwd;              /* the family's backward scratch */
    /* scratch of one batch shape (B, T) */
    int64_t B, T;
    double *dots, *hdots;   /* [n_layers, B, H] on the context, and its host copy */
    int64_t n_dots;
    float *dz;              /* fix qk: [n_layers, B, T, heads, hd] the cells' z' − z, head group g holding cell g's */
    int64_t n_dz, dz_layer;
    int32_t *targets;       /* [B, T] host */
    int64_t n_targets;
} atp_spec;

static int atp_sources(void *self, const ps_runtime *rt, const ps_grid_shift *sh, ps_hooks *ref, ps_error *err) {
    atp_spec *A = self;
    return A->ko.sources(A->ko.self, rt, sh, ref, err);
}

static int atp_sources_done(void *self, const ps_runtime *rt, const ps_grid_shift *sh, ps_error *err) {
    atp_spec *A = self;
    return A->ko.sources_done(A->ko.self, rt, sh, err);
}

static void atp_shift_end(void *self, const ps_runtime *rt) {
    atp_spec *A = self;
    if (A->ko.shift_end) A->ko.shift_end(A->ko.self, rt);
}

/* Free the batch-shape scratch. */
static void scratch_free(atp_spec *A, ps_ctx *ctx) {
    if (A->dots) ps_buf_free(ctx, A->dots, A->n_dots * (int64_t)sizeof(double));
    if (A->dz) ps_buf_free(ctx, A->dz, A->n_dz * (int64_t)sizeof(float));
    free(A->hdots);
    free(A->targets);
    A->dots = NULL, A->dz = NULL, A->hdots = NULL, A->targets = NULL;
    A->n_dots = A->n_dz = A->n_targets = A->dz_layer = A->B = A->T = 0;
}

/* The sizes of point `point` at layer for B sequences of T tokens (the family's point_shape): its rank, or 0. */
static int point_dims(const ps_runtime *rt, int point, int layer, int64_t B, int64_t T, int64_t dims[4], int *head_axis) {
    int i = ps_runtime_point_index(rt, point);
    if (i < 0) return 0;
    *head_axis = rt->family->points[i].head_axis;
    return rt->family->point_shape(rt, i, layer, B, T, dims);
}

/* The per-sequence head count of the dots (fix none: the replaced arrays' head axis; fix qk: the patched
 * attention output's) and, fix qk, the floats of one layer's dz. */
static int dot_heads(const atp_spec *A, const ps_runtime *rt, const ps_grid_shift *sh, int64_t B, int64_t T, int64_t *H,
                     int64_t *dz_layer, ps_error *err) {
    int64_t dims[4];
    int ha = -1, rank;
    *H = 0, *dz_layer = 0;
    if (A->fix == PS_ATP_FIX_QK) {
        rank = point_dims(rt, rt->family->grad.patch_point, sh->layers[0], B, T, dims, &ha);
        if (rank < 1 || ha < 0 || ha >= rank)
            return ps_fail(err, "attribution: the %s family's patched point has no head axis", rt->family->name);
        *H = dims[ha];
        *dz_layer = 1;
        for (int d = 0; d < rank; d++) *dz_layer *= dims[d];
        return 0;
    }
    for (int a = 0; a < A->n_arr; a++)
        for (int li = 0; li < sh->n_layers; li++) {
            rank = point_dims(rt, A->arr[a].set_point, sh->layers[li], B, T, dims, &ha);
            if (rank < 1 || ha < 0 || ha >= rank) continue;
            if (*H && dims[ha] != *H)
                return ps_fail(err, "attribution: the target's arrays differ in their head counts (%lld, %lld)", (long long)*H,
                               (long long)dims[ha]);
            *H = dims[ha];
        }
    if (!*H) return ps_fail(err, "attribution: the target replaces no array with heads on the chosen layers");
    return 0;
}

/* Scratch for a batch of B sequences of T tokens and nl layers. */
static int scratch_for(atp_spec *A, const ps_runtime *rt, const ps_grid_shift *sh, int64_t B, int64_t T, int64_t *H, ps_error *err) {
    int64_t dzl = 0;
    if (dot_heads(A, rt, sh, B, T, H, &dzl, err)) return -1;
    if (A->dots && A->B == B && A->T == T) return 0;
    scratch_free(A, rt->ctx);
    int nl = sh->n_layers;
    A->B = B, A->T = T;
    A->n_dots = (int64_t)nl * B * *H;
    A->n_targets = B * T;
    A->dots = ps_buf_alloc(rt->ctx, A->n_dots * (int64_t)sizeof(double), "attribution: the cells' dot products", err);
    if (!A->dots) return -1;
    if (A->fix == PS_ATP_FIX_QK) {
        A->dz_layer = dzl;
        A->n_dz = (int64_t)nl * dzl;
        A->dz = ps_buf_alloc(rt->ctx, A->n_dz * (int64_t)sizeof(float), "attribution: the recomputed attention outputs", err);
        if (!A->dz) return -1;
    }
    A->hdots = malloc((size_t)A->n_dots * sizeof(double));
    A->targets = malloc((size_t)A->n_targets * sizeof(int32_t));
    if (!A->hdots || !A->targets) return ps_fail(err, "out of memory for the attribution of %lld sequences", (long long)B);
    return 0;
}

/* fix qk: for every selected layer and cell, the layer's attention recomputed by the family with the cell's
 * entries set to their means: dz[li] at the cell's head group = z' − z. */
static int patch_all(atp_spec *A, const ps_runtime *rt, const ps_grid_shift *sh, void *state, ps_error *err) {
    int pts[PS_KO_MAX_ARRAYS];
    const float *means[PS_KO_MAX_ARRAYS];
    for (int li = 0; li < sh->n_layers; li++) {
        for (int a = 0; a < A->n_arr; a++) {
            pts[a] = A->arr[a].set_point;
            means[a] = ps_ko_spec_mean(&A->ko, li, pts[a]);
        }
        for (int ci = 0; ci < A->n_heads; ci++)
            if (rt->family->grad.patch_attention(rt, state, &A->bwd, sh->layers[li], A->heads[ci], pts, means, A->n_arr,
                                            A->dz + (int64_t)li * A->dz_layer, err))
                return -1;
    }
    return 0;
}

/* The dot actions on the gradients: fix none, Σ ∂NLL/∂x · (mean − x) per (sequence, head) at each replaced
 * array; fix qk, Σ ∂NLL/∂z · dz per (sequence, query head) at the patched point. */
static int grad_hooks(atp_spec *A, const ps_runtime *rt, const ps_grid_shift *sh, void *state, int64_t B, int64_t T, int64_t H,
                      ps_hooks *gh, ps_error *err) {
    const ps_family *f = rt->family;
    for (int li = 0; li < sh->n_layers; li++) {
        int l = sh->layers[li];
        char name[96];
        ps_hook_action act = {.kind = PS_ACT_DOT, .head = -1, .acc = A->dots + (int64_t)li * B * H, .acc_n = B * H};
        if (A->fix == PS_ATP_FIX_QK) {
            ps_runtime_point_name(rt, ps_runtime_point_index(rt, f->grad.patch_point), l, name, sizeof name);
            act.src = A->dz + (int64_t)li * A->dz_layer;
            act.src_nseq = B;
            act.src_npos = T;
            if (f->hook_add_action(rt, gh, name, &act, err)) return -1;
            continue;
        }
        for (int a = 0; a < A->n_arr; a++) {
            int pt = A->arr[a].set_point;
            const float *mean = ps_ko_spec_mean(&A->ko, li, pt);
            int64_t dims[4];
            const float *clean = mean ? f->grad.state_point(rt, state, l, pt, dims) : NULL;
            if (!mean) continue;
            if (!clean) return ps_fail(err, "attribution (layer %d): the %s family's kept activations lack point %d", l, f->name, pt);
            ps_runtime_point_name(rt, ps_runtime_point_index(rt, pt), l, name, sizeof name);
            act.src = mean;
            act.src_nseq = 0;
            act.src_npos = dims[1];
            act.ref = clean;
            if (f->hook_add_action(rt, gh, name, &act, err)) return -1;
        }
    }
    return 0;
}

/* The estimate of one batch (grid.h, spec->estimate): one backward per residue. */
static int atp_estimate(void *self, const ps_runtime *rt, const ps_grid_shift *sh, const ps_shifted *sv, void *state,
                        const double *clean_lp, double *cell_lp, ps_error *err) {
    atp_spec *A = self;
    const ps_batch *b = &sv->b;
    int nl = sh->n_layers, nc = A->n_heads, qk = A->fix == PS_ATP_FIX_QK;
    int64_t B = b->B, T = b->T, maxq = b->max_q, nq = B * maxq, H = 0;
    if (scratch_for(A, rt, sh, B, T, &H, err)) return -1;
    int64_t grp = qk ? H / rt->family->ko.heads(rt, A->target) : 1;
    for (int64_t i = 0; i < (int64_t)nl * nc; i++) memcpy(cell_lp + i * nq, clean_lp, (size_t)nq * sizeof(double));
    int stop = sh->layers[0];
    for (int li = 1; li < nl; li++)
        if (sh->layers[li] < stop) stop = sh->layers[li];
    if (qk && patch_all(A, rt, sh, state, err)) return -1;
    ps_hooks gh; /* the same dot actions for every residue's backward (they add into A->dots) */
    ps_hooks_init(&gh);
    int rc = grad_hooks(A, rt, sh, state, B, T, H, &gh, err);
    /* One backward per residue present: the loss is the NLL of every scored query of that residue (its
     * answer tokens). The statistics add estimates by residue, so a sequence's estimate for residue rho
     * goes to its first query of that residue (its others keep the clean log-prob). */
    for (int64_t rho = 0; rho < sh->s->P && !rc; rho++) {
        int any = 0;
        double want = 0;
        for (int64_t i = 0; i < B * T; i++) A->targets[i] = -1;
        for (int64_t s = 0; s < B; s++)
            for (int64_t q = 0; q < b->n_q[s]; q++) {
                if (sv->residue[s * maxq + q] != rho) continue;
                const ps_query *qq = &b->queries[s * maxq + q];
                for (int64_t k = 0; k < qq->answer_len; k++)
                    A->targets[s * T + qq->answer_pos + k] = ps_query_answer(qq, b->tokens + s * T, k);
                want -= clean_lp[s * maxq + q];
                any = 1;
            }
        if (!any) continue;
        memset(A->hdots, 0, (size_t)A->n_dots * sizeof(double));
        if (ps_buf_from_host(rt->ctx, A->dots, A->hdots, A->n_dots * (int64_t)sizeof(double), err)) {
            rc = -1;
            break;
        }
        double loss = 0;
        if (rt->family->grad.backward(rt, state, &A->bwd, b->tokens, A->targets, &gh, stop, &loss, err)) {
            rc = ps_fail_prefix(err, "attribution backward (residue %lld): ", (long long)rho);
            break;
        }
        /* the backward's loss is the clean run's NLL of these answers: the targets are the scored tokens */
        if (fabs(loss - want) > 1e-3 * (1.0 + fabs(want))) {
            rc = ps_fail(err, "attribution: the backward's loss %.9g differs from the clean NLL %.9g of residue %lld", loss, want,
                         (long long)rho);
            break;
        }
        if (ps_buf_to_host(rt->ctx, A->hdots, A->dots, A->n_dots * (int64_t)sizeof(double), err)) {
            rc = -1;
            break;
        }
        for (int64_t s = 0; s < B; s++) {
            int64_t q = 0;
            while (q < b->n_q[s] && sv->residue[s * maxq + q] != rho) q++;
            if (q == b->n_q[s]) continue;
            for (int li = 0; li < nl; li++)
                for (int ci = 0; ci < nc; ci++) {
                    const double *d = A->hdots + ((int64_t)li * B + s) * H;
                    double est = 0;
                    if (qk)
                        for (int64_t h = A->heads[ci] * grp; h < (A->heads[ci] + 1) * grp; h++) est += d[h];
                    else
                        est = d[A->heads[ci]];
                    cell_lp[((int64_t)li * nc + ci) * nq + s * maxq + q] = clean_lp[s * maxq + q] - est;
                }
        }
    }
    ps_hooks_free(&gh);
    return rc;
}

int ps_atp_spec(const ps_runtime *rt, int target, const int *heads, int n_heads, int fix, ps_grid_spec *spec, ps_error *err) {
    char why[256];
    if (ps_atp_fix_missing(rt, fix, why, sizeof why) || ps_atp_target_missing(rt, target, why, sizeof why))
        return ps_fail(err, "%s", why);
    const ps_family *f = rt->family;
    if (!f->ko.arrays || !f->ko.heads || !f->ko.heads(rt, target))
        return ps_fail(err, "--method atp: the %s family's target has no per-head cells to attribute", f->name);
    atp_spec *A = calloc(1, sizeof *A);
    if (!A) return ps_fail(err, "out of memory");
    int restart = 0;
    A->n_arr = f->ko.arrays(rt, target, A->arr, &restart);
    if (A->n_arr < 1 || A->n_arr > PS_KO_MAX_ARRAYS || ps_ko_spec(rt, target, heads, n_heads, &A->ko, err)) {
        if (A->n_arr < 1 || A->n_arr > PS_KO_MAX_ARRAYS) ps_fail(err, "--method atp: the %s family's target replaces no array", f->name);
        free(A);
        return -1;
    }
    A->fix = fix;
    A->target = target;
    A->heads = heads;
    A->n_heads = n_heads;
    *spec = (ps_grid_spec){.self = A, .sources = atp_sources, .sources_done = atp_sources_done, .shift_end = atp_shift_end,
                           .estimate = atp_estimate};
    return 0;
}

void ps_atp_spec_free(const ps_runtime *rt, ps_grid_spec *spec) {
    atp_spec *A = spec->self;
    if (!A) return;
    scratch_free(A, rt->ctx);
    if (A->bwd) rt->family->grad.backward_free(rt, A->bwd);
    ps_ko_spec_free(&A->ko);
    free(A);
    spec->self = NULL;
}

/* ---- the estimate against the exact grid ---- */

/* Pearson correlation of n pairs (NAN when either side is constant). */
static double pearson(const double *x, const double *y, int64_t n) {
    double mx = 0, my = 0, sxx = 0, syy = 0, sxy = 0;
    for (int64_t i = 0; i < n; i++) mx += x[i], my += y[i];
    if (n < 2) return NAN;
    mx /= (double)n, my /= (double)n;
    for (int64_t i = 0; i < n; i++) {
        sxx += (x[i] - mx) * (x[i] - mx);
        syy += (y[i] - my) * (y[i] - my);
        sxy += (x[i] - mx) * (y[i] - my);
    }
    return sxx > 0 && syy > 0 ? sxy / sqrt(sxx * syy) : NAN;
}

/* Sort the indices o[0..n) by key x (stable merge sort; tmp: n scratch). */
static void sort_by(int64_t *o, int64_t *tmp, int64_t n, const double *x) {
    if (n < 2) return;
    int64_t h = n / 2;
    sort_by(o, tmp, h, x);
    sort_by(o + h, tmp, n - h, x);
    int64_t i = 0, j = h, k = 0;
    while (i < h || j < n) tmp[k++] = j >= n || (i < h && x[o[i]] <= x[o[j]]) ? o[i++] : o[j++];
    memcpy(o, tmp, (size_t)n * sizeof *o);
}

/* Ranks 1..n, ties averaged. */
static int ranks(const double *x, int64_t n, double *r) {
    int64_t *o = malloc((size_t)(n ? n : 1) * sizeof *o), *tmp = malloc((size_t)(n ? n : 1) * sizeof *tmp);
    if (!o || !tmp) {
        free(o);
        free(tmp);
        return -1;
    }
    for (int64_t i = 0; i < n; i++) o[i] = i;
    sort_by(o, tmp, n, x);
    free(tmp);
    for (int64_t i = 0; i < n;) {
        int64_t j = i;
        while (j + 1 < n && x[o[j + 1]] == x[o[i]]) j++;
        for (int64_t k = i; k <= j; k++) r[o[k]] = 0.5 * (double)(i + j) + 1.0;
        i = j + 1;
    }
    free(o);
    return 0;
}

static double spearman(const double *x, const double *y, int64_t n) {
    double *rx = malloc((size_t)(n ? n : 1) * sizeof *rx), *ry = malloc((size_t)(n ? n : 1) * sizeof *ry), v = NAN;
    if (rx && ry && !ranks(x, n, rx) && !ranks(y, n, ry)) v = pearson(rx, ry, n);
    free(rx);
    free(ry);
    return v;
}

static json_t *num_or_null(double v) { return isfinite(v) ? json_real(v) : json_null(); }

json_t *ps_atp_compare(json_t *exact, json_t *estimate, json_t *t_exact, json_t *t_estimate, const char *command,
                       ps_error *err) {
    json_t *ge = json_object_get(exact, "grid"), *ga = json_object_get(estimate, "grid");
    const char *me = json_string_value(json_object_get(ge, "method")), *ma = json_string_value(json_object_get(ga, "method"));
    if (!ge || !ga) return ps_fail(err, "both files must be knockout results (a \"grid\")"), NULL;
    if (!ma || strcmp(ma, "atp")) return ps_fail(err, "the second file must be an attribution estimate (grid.method \"atp\")"), NULL;
    if (me && strcmp(me, "exact")) return ps_fail(err, "the first file is an estimate (grid.method \"%s\"); it must be the exact grid", me), NULL;
    json_t *ce = json_object_get(ge, "cells"), *ca = json_object_get(ga, "cells");
    int64_t P = json_integer_value(json_object_get(ge, "period")), nc = (int64_t)json_array_size(ce);
    const char *te = json_string_value(json_object_get(ge, "target")), *ta = json_string_value(json_object_get(ga, "target"));
    if (P != json_integer_value(json_object_get(ga, "period")) || !te || !ta || strcmp(te, ta) || nc < 1 ||
        nc != (int64_t)json_array_size(ca))
        return ps_fail(err, "the grids differ (period %lld vs %lld, target %s vs %s, %lld vs %zu cells)", (long long)P,
                       (long long)json_integer_value(json_object_get(ga, "period")), te ? te : "?", ta ? ta : "?", (long long)nc,
                       json_array_size(ca)),
               NULL;
    const char *he = json_string_value(json_object_get(json_object_get(exact, "provenance"), "config_hash")),
               *ha = json_string_value(json_object_get(json_object_get(estimate, "provenance"), "config_hash"));
    if (he && ha && strcmp(he, ha)) return ps_fail(err, "the files come from different models (config_hash %s vs %s)", he, ha), NULL;
    double *x = malloc((size_t)(nc * P) * sizeof(double)), *y = malloc((size_t)(nc * P) * sizeof(double));
    double *cx = malloc((size_t)nc * sizeof(double)), *cy = malloc((size_t)nc * sizeof(double)), *cacc = malloc((size_t)nc * sizeof(double));
    int64_t *rank = malloc((size_t)nc * sizeof(int64_t)), np = 0;
    json_t *out = NULL, *gx = json_array(), *gy = json_array(), *gacc = json_array(), *gl = json_array(), *gh = json_array();
    if (!x || !y || !cx || !cy || !cacc || !rank || !gx || !gy || !gacc || !gl || !gh) {
        ps_fail(err, "out of memory for a comparison of %lld cells", (long long)nc);
        goto done;
    }
    for (int64_t i = 0; i < nc; i++) {
        json_t *e = json_array_get(ce, (size_t)i), *a = json_array_get(ca, (size_t)i);
        if (json_integer_value(json_object_get(e, "layer")) != json_integer_value(json_object_get(a, "layer")) ||
            json_integer_value(json_object_get(e, "head")) != json_integer_value(json_object_get(a, "head"))) {
            ps_fail(err, "cells[%lld] is layer %lld head %lld in the exact grid but layer %lld head %lld in the estimate",
                    (long long)i, (long long)json_integer_value(json_object_get(e, "layer")), (long long)json_integer_value(json_object_get(e, "head")),
                    (long long)json_integer_value(json_object_get(a, "layer")), (long long)json_integer_value(json_object_get(a, "head")));
            goto done;
        }
        json_array_append_new(gl, json_integer(json_integer_value(json_object_get(e, "layer"))));
        json_array_append_new(gh, json_integer(json_integer_value(json_object_get(e, "head"))));
        json_t *re = json_object_get(e, "residues"), *ra = json_object_get(a, "residues"), *rowx = json_array(), *rowy = json_array();
        cx[i] = cy[i] = -INFINITY;
        for (int64_t r = 0; r < P; r++) {
            json_t *ee = json_array_get(re, (size_t)r), *aa = json_array_get(ra, (size_t)r);
            int used = json_integer_value(json_object_get(ee, "n")) > 0;
            double dx = json_number_value(json_object_get(ee, "delta_nll")), dy = json_number_value(json_object_get(aa, "delta_nll"));
            json_array_append_new(rowx, used ? json_real(dx) : json_null());
            json_array_append_new(rowy, used ? json_real(dy) : json_null());
            if (!used) continue;
            x[np] = dx, y[np] = dy, np++;
            if (dx > cx[i]) cx[i] = dx;
            if (dy > cy[i]) cy[i] = dy;
        }
        json_array_append_new(gx, rowx);
        json_array_append_new(gy, rowy);
        cacc[i] = json_number_value(json_object_get(json_object_get(e, "worst_residue"), "delta_accuracy_pp"));
        json_array_append_new(gacc, json_real(cacc[i]));
        if (!isfinite(cx[i])) cx[i] = 0;
        if (!isfinite(cy[i])) cy[i] = 0;
    }
    /* the estimate's rank of every cell: 1 + the cells with a larger estimated worst-residue Δ NLL (ties by order) */
    for (int64_t i = 0; i < nc; i++) {
        rank[i] = 1;
        for (int64_t j = 0; j < nc; j++)
            if (cy[j] > cy[i] || (cy[j] == cy[i] && j < i)) rank[i]++;
    }
    int64_t n_strong = 0, hit = 0, max_rank = 0;
    for (int64_t i = 0; i < nc; i++) n_strong += cacc[i] <= -30.0;
    int64_t top_k = n_strong ? 2 * n_strong : 1;
    json_t *strong = json_array(), *fneg = json_array(), *misses = json_array();
    /* strong cells and false negatives, worst exact drop first */
    int64_t *ord = malloc((size_t)nc * sizeof *ord);
    if (!ord) {
        ps_fail(err, "out of memory");
        goto done;
    }
    for (int64_t i = 0; i < nc; i++) ord[i] = i;
    for (int64_t i = 1; i < nc; i++)
        for (int64_t j = i; j > 0 && cacc[ord[j]] < cacc[ord[j - 1]]; j--) {
            int64_t t = ord[j];
            ord[j] = ord[j - 1], ord[j - 1] = t;
        }
    for (int64_t k = 0; k < nc; k++) {
        int64_t i = ord[k];
        if (cacc[i] > -30.0) continue;
        json_t *c = json_pack("{s:I, s:I, s:f, s:f, s:f, s:I}", "layer", json_integer_value(json_array_get(gl, (size_t)i)), "head",
                              json_integer_value(json_array_get(gh, (size_t)i)), "exact_worst_delta_accuracy_pp", cacc[i],
                              "exact_worst_delta_nll", cx[i], "estimated_worst_delta_nll", cy[i], "estimate_rank", (json_int_t)rank[i]);
        json_array_append(strong, c);
        if (rank[i] <= top_k) hit++;
        else json_array_append(fneg, c);
        json_decref(c);
        if (rank[i] > max_rank) max_rank = rank[i];
    }
    /* the largest misses of the worst-residue Δ NLL */
    for (int m = 0; m < 5 && m < nc; m++) {
        int64_t best = -1;
        for (int64_t i = 0; i < nc; i++) {
            int taken = 0;
            for (size_t q = 0; q < json_array_size(misses); q++)
                if (json_integer_value(json_object_get(json_array_get(misses, q), "index")) == i) taken = 1;
            if (!taken && (best < 0 || fabs(cy[i] - cx[i]) > fabs(cy[best] - cx[best]))) best = i;
        }
        json_array_append_new(misses, json_pack("{s:I, s:I, s:I, s:f, s:f, s:f}", "index", (json_int_t)best, "layer",
                                                json_integer_value(json_array_get(gl, (size_t)best)), "head",
                                                json_integer_value(json_array_get(gh, (size_t)best)), "exact_worst_delta_nll", cx[best],
                                                "estimated_worst_delta_nll", cy[best], "exact_worst_delta_accuracy_pp", cacc[best]));
    }
    free(ord);
    json_t *prov = json_deep_copy(json_object_get(estimate, "provenance"));
    if (prov && command) json_object_set_new(prov, "command", json_string(command));
    json_t *times = json_object();
    if (t_exact && t_estimate) {
        double we = json_number_value(json_object_get(t_exact, "wall_s")), wa = json_number_value(json_object_get(t_estimate, "wall_s"));
        double ue = json_number_value(json_object_get(t_exact, "user_s")) + json_number_value(json_object_get(t_exact, "sys_s"));
        double ua = json_number_value(json_object_get(t_estimate, "user_s")) + json_number_value(json_object_get(t_estimate, "sys_s"));
        json_object_set(times, "exact", t_exact);
        json_object_set(times, "estimate", t_estimate);
        json_object_set_new(times, "wall_ratio", num_or_null(wa > 0 ? we / wa : NAN));
        json_object_set_new(times, "cpu_ratio", num_or_null(ua > 0 ? ue / ua : NAN));
    }
    out = json_object();
    json_object_set_new(out, "kind", json_string("atp_compare"));
    json_object_set_new(out, "provenance", prov ? prov : json_object());
    json_object_set_new(out, "target", json_string(te));
    json_object_set_new(out, "fix", json_string(json_string_value(json_object_get(json_object_get(ga, "atp"), "fix"))
                                                    ? json_string_value(json_object_get(json_object_get(ga, "atp"), "fix")) : "none"));
    json_object_set_new(out, "n_pairs", json_integer(np));
    json_object_set_new(out, "pearson", num_or_null(pearson(x, y, np)));
    json_object_set_new(out, "spearman", num_or_null(spearman(x, y, np)));
    json_object_set_new(out, "cell_pearson", num_or_null(pearson(cx, cy, nc)));
    json_object_set_new(out, "cell_spearman", num_or_null(spearman(cx, cy, nc)));
    json_object_set_new(out, "strong_pp", json_real(-30.0));
    json_object_set_new(out, "strong", strong);
    json_object_set_new(out, "top_k", json_integer(top_k));
    json_object_set_new(out, "recall", json_real(n_strong ? (double)hit / (double)n_strong : 1.0));
    json_object_set_new(out, "max_strong_rank", json_integer(max_rank));
    json_object_set_new(out, "false_negatives", fneg);
    json_object_set_new(out, "misses", misses);
    json_object_set_new(out, "times", times);
    json_object_set_new(out, "grid", json_pack("{s:I, s:O, s:O, s:O, s:O, s:O}", "period", (json_int_t)P, "layers", gl, "heads", gh,
                                               "exact", gx, "estimate", gy, "exact_acc", gacc));
done:
    json_decref(gx), json_decref(gy), json_decref(gacc), json_decref(gl), json_decref(gh);
    free(x), free(y), free(cx), free(cy), free(cacc), free(rank);
    return out;
}
