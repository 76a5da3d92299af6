/* ko_spec.c — the one mean-replacement knockout spec over a family's targets as data (ko_spec.h). */
#include "interventions/ko_spec.h"
#include "interventions/ko_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/ops.h"

const char *ps_ko_target_name(ps_ko_target t) { return t == PS_KO_RAW ? "raw" : t == PS_KO_COMPRESSED ? "compressed" : "both"; }

/* one replaced array of one selected layer: its sums [n_sum] (double) and mean [n_mean] = [npos, ...] (float),
 * both on the model's context, and the hook names they are taken at and set on */
typedef struct {
    int64_t n_sum, n_mean, npos;
    double *sum;
    float *mean;
    char sum_name[96], set_name[96];
} ko_slot;

typedef struct {
    int target, per_head, n_arr;
    ps_ko_array arr[PS_KO_MAX_ARRAYS];
    const int *heads;
    int n_layers;
    ko_slot *slot; /* [n_layers · n_arr], layer index major */
} ko_spec;

static void slots_free(ko_spec *k, const ps_runtime *rt) {
    for (int i = 0; k->slot && i < k->n_layers * k->n_arr; i++) {
        ko_slot *x = &k->slot[i];
        if (x->mean) ps_buf_free(rt->ctx, x->mean, x->n_mean * (int64_t)sizeof(float));
        if (x->sum) ps_buf_free(rt->ctx, x->sum, x->n_sum * (int64_t)sizeof(double));
        x->mean = NULL;
        x->sum = NULL;
    }
}

static void ko_shift_end(void *self, const ps_runtime *rt) { slots_free(self, rt); }

/* the floats per sequence of `point` at `layer` for T tokens, and its second axis (the mean's positions) */
static int64_t point_size(const ps_runtime *rt, int point, int layer, int64_t T, int64_t *npos, char *name, size_t nn) {
    int i = ps_runtime_point_index(rt, point);
    int64_t d[4];
    int r = i < 0 ? 0 : rt->family->point_shape(rt, i, layer, 1, T, d);
    if (i >= 0) ps_runtime_point_name(rt, i, layer, name, nn);
    if (r < 2) return *npos = 0, 0;
    int64_t n = 1;
    for (int a = 1; a < r; a++) n *= d[a];
    *npos = d[1];
    return n;
}

/* the clean run's sums, added by sum actions as each layer fires */
static int ko_sources(void *self, const ps_runtime *rt, const ps_grid_shift *sh, ps_hooks *ref, ps_error *err) {
    ko_spec *k = self;
    if (!k->slot) {
        k->slot = calloc((size_t)sh->n_layers * (size_t)k->n_arr, sizeof *k->slot);
        if (!k->slot) return ps_fail(err, "out of memory");
        k->n_layers = sh->n_layers;
    }
    slots_free(k, rt);
    for (int li = 0; li < sh->n_layers; li++)
        for (int a = 0; a < k->n_arr; a++) {
            ko_slot *x = &k->slot[li * k->n_arr + a];
            int64_t np;
            x->n_sum = point_size(rt, k->arr[a].sum_point, sh->layers[li], sh->T, &np, x->sum_name, sizeof x->sum_name);
            x->n_mean = point_size(rt, k->arr[a].set_point, sh->layers[li], sh->T, &x->npos, x->set_name, sizeof x->set_name);
            if (x->n_sum < 1 || x->n_mean < 1) { /* nothing at this length (a compressed array of fewer tokens than a window) */
                x->npos = 0;
                continue;
            }
            x->sum = ps_buf_alloc(rt->ctx, x->n_sum * (int64_t)sizeof(double), "the knockout sums", err); /* zero-filled */
            x->mean = x->sum ? ps_buf_alloc(rt->ctx, x->n_mean * (int64_t)sizeof(float), "the knockout means", err) : NULL;
            if (!x->mean) return -1;
            ps_hook_action act = {.kind = PS_ACT_SUM, .head = -1, .acc = x->sum, .acc_n = x->n_sum};
            if (rt->family->hook_add_action(rt, ref, x->sum_name, &act, err)) return -1;
        }
    return 0;
}

/* sums into means: on the context (ps_sum_to_mean) where the set point is the sum point; the family's ko_mean
 * finishes a `fix` array on the host */
static int ko_sources_done(void *self, const ps_runtime *rt, const ps_grid_shift *sh, ps_error *err) {
    ko_spec *k = self;
    for (int li = 0; li < sh->n_layers; li++)
        for (int a = 0; a < k->n_arr; a++) {
            ko_slot *x = &k->slot[li * k->n_arr + a];
            const ps_ko_array *ar = &k->arr[a];
            if (!x->mean) continue;
            int same = ar->set_point == ar->sum_point;
            if (same && ps_sum_to_mean(rt->ctx, x->mean, x->sum, (double)sh->N, x->n_sum)) return ps_ctx_check(rt->ctx, err);
            if (!ar->fix) continue;
            double *hs = malloc((size_t)x->n_sum * sizeof(double));
            float *hm = malloc((size_t)x->n_mean * sizeof(float));
            int rc = hs && hm ? 0 : ps_fail(err, "out of memory for the knockout's means of %s", x->set_name);
            if (!rc) rc = ps_buf_to_host(rt->ctx, hs, x->sum, x->n_sum * (int64_t)sizeof(double), err);
            if (!rc && same) rc = ps_buf_to_host(rt->ctx, hm, x->mean, x->n_mean * (int64_t)sizeof(float), err);
            if (!rc)
                rc = rt->family->ko.mean(rt, k->target, ar, sh->layers[li], sh->s->b.tokens, sh->N, sh->T, hs, x->n_sum, hm, x->n_mean,
                                         err);
            if (!rc) rc = ps_buf_from_host(rt->ctx, x->mean, hm, x->n_mean * (int64_t)sizeof(float), err);
            free(hs);
            free(hm);
            if (rc) return -1;
        }
    return 0;
}

/* The mean-replacement action of cell ci (head heads[ci], or the whole array) on sequences [seq0, seq1) for
 * every replaced array of layer index li: the same public action a user registers (PS_ACT_SET from the mean). */
static int ko_cell(void *self, const ps_runtime *rt, const ps_grid_shift *sh, int li, int ci, int64_t seq0, int64_t seq1,
                   int64_t prompt0, ps_hooks *h, ps_error *err) {
    (void)sh, (void)prompt0; /* one mean for every prompt */
    ko_spec *k = self;
    for (int a = 0; a < k->n_arr; a++) {
        const ko_slot *x = &k->slot[li * k->n_arr + a];
        if (!x->mean) continue;
        ps_hook_action act = {.kind = PS_ACT_SET, .head = k->per_head ? k->heads[ci] : -1, .seq0 = seq0, .seq1 = seq1,
                              .src = x->mean, .src_npos = x->npos};
        if (rt->family->hook_add_action(rt, h, x->set_name, &act, err)) return -1;
    }
    return 0;
}

int ps_ko_spec(const ps_runtime *rt, int target, const int *heads, int n_heads, ps_grid_spec *spec, ps_error *err) {
    (void)n_heads;
    const ps_family *f = rt->family;
    if (!f->ko.targets || !f->ko.arrays) return ps_fail(err, "knockout: the %s family has no knockout targets", f->name);
    ko_spec *k = calloc(1, sizeof *k);
    if (!k) return ps_fail(err, "out of memory");
    int restart = PS_KO_RESTART_NONE;
    k->target = target;
    k->heads = heads;
    k->per_head = f->ko.heads(rt, target) > 0;
    k->n_arr = f->ko.arrays(rt, target, k->arr, &restart);
    if (k->n_arr < 1 || k->n_arr > PS_KO_MAX_ARRAYS) {
        int n = k->n_arr;
        free(k);
        return ps_fail(err, "knockout: target %s of the %s family replaces %d arrays", f->ko.targets[target], f->name, n);
    }
    *spec = (ps_grid_spec){.self = k, .restart = restart == PS_KO_RESTART_ATTENTION ? PS_GRID_RESTART_ATTENTION : PS_GRID_RESTART_NONE,
                           .sources = ko_sources, .sources_done = ko_sources_done, .cell = ko_cell, .shift_end = ko_shift_end};
    return 0;
}

const float *ps_ko_spec_mean(const ps_grid_spec *spec, int li, int point) {
    const ko_spec *k = spec->self;
    if (!k->slot || li < 0 || li >= k->n_layers) return NULL;
    for (int a = 0; a < k->n_arr; a++)
        if (k->arr[a].set_point == point && k->slot[li * k->n_arr + a].npos > 0) return k->slot[li * k->n_arr + a].mean;
    return NULL;
}

void ps_ko_spec_free(ps_grid_spec *spec) {
    ko_spec *k = spec->self;
    if (k) free(k->slot);
    free(k);
    spec->self = NULL;
}
