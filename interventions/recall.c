/* recall.c — selection recall per phase (recall.h): the codes of each scored query read at the selecting layers'
 * hook_blocks during the sweep's forwards, and their statistics. */
#include "interventions/recall.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "interventions/stats.h"

void ps_recall_spec_free(ps_recall_spec *s) {
    free(s->layers);
    memset(s, 0, sizeof *s);
}

static int same_geom(const ps_select_geom *a, const ps_select_geom *b) {
    return a->n_kv == b->n_kv && a->cfg.block == b->cfg.block && a->cfg.init_blocks == b->cfg.init_blocks &&
           a->cfg.local_blocks == b->cfg.local_blocks && a->cfg.topk == b->cfg.topk && a->cfg.kernel == b->cfg.kernel &&
           a->cfg.stride == b->cfg.stride;
}

int ps_recall_spec_init(ps_recall_spec *s, const ps_runtime *rt, const int *layers, int n_layers, int64_t T, int64_t offset,
                        ps_error *err) {
    memset(s, 0, sizeof *s);
    const ps_family *f = rt->family;
    const char *title = f->title ? f->title : f->name;
    if (!f->sel.layer) return ps_fail(err, "%s checkpoints select no blocks: selection recall needs a model with block selection", title);
    int n = layers ? n_layers : (int)rt->n_layers;
    if (n < 1) return ps_fail(err, "selection recall: no layers given");
    s->layers = malloc((size_t)n * sizeof *s->layers);
    if (!s->layers) return ps_fail(err, "out of memory for %d layers", n);
    s->n_layers = n;
    s->offset = offset;
    for (int i = 0; i < n; i++) {
        int l = layers ? layers[i] : i;
        if (l < 0 || l >= rt->n_layers) {
            ps_recall_spec_free(s);
            return ps_fail(err, "--layers: layer %d is outside the model's %lld layers", l, (long long)rt->n_layers);
        }
        s->layers[i] = l;
        char why[512] = "";
        ps_select_geom g;
        memset(&g, 0, sizeof g);
        if (!f->sel.layer(rt, l, T, &g, why, sizeof why)) {
            ps_recall_spec_free(s);
            return ps_fail(err, "selection recall: layer %d of this %s model selects no blocks at %lld tokens: %s", l, title, (long long)T,
                           why);
        }
        if (i == 0) s->geom = g;
        else if (!same_geom(&g, &s->geom)) {
            ps_recall_spec_free(s);
            return ps_fail(err, "selection recall: layer %d's block geometry differs from layer %d's (one geometry per result)", l,
                           s->layers[0]);
        }
    }
    s->n_kv = s->geom.n_kv;
    return 0;
}

int ps_recall_code(const float *blocks, int64_t slots, int64_t nb, int64_t t, const ps_select_cfg *c) {
    int found = 0;
    for (int64_t j = 0; j < slots; j++) found |= blocks[j] == (float)nb;
    if (!found) return PS_RECALL_MISSED;
    int64_t qb = t / c->block;
    return nb < c->init_blocks || (nb >= qb - c->local_blocks && nb <= qb) ? PS_RECALL_FORCED : PS_RECALL_CHOSEN;
}

/* ---- the codes, read during the sweep's forwards ---- */

typedef struct {
    const ps_runtime *rt;
    const ps_recall_spec *sp;
    int32_t *codes;         /* the unit arrays' codes (query k at k · n_cells) */
    const ps_shifted *v;    /* the batch being run */
    int64_t at;             /* its first query's index */
    int64_t *seq_off;       /* [n_layers]: sequences of the batch the layer's events have covered */
    unsigned char *selects; /* [n_layers]: the layer selects at this batch's length */
    ps_hooks h;
    int live;
} rec_state;

static int64_t n_cells(const ps_recall_spec *sp) { return (int64_t)sp->n_layers * sp->n_kv; }

static int on_blocks(const ps_hook_event *ev, void *user, ps_error *err) {
    rec_state *st = user;
    const ps_recall_spec *sp = st->sp;
    int li = -1;
    for (int i = 0; i < sp->n_layers; i++)
        if (sp->layers[i] == ev->layer) li = i;
    if (li < 0) return 0;
    const ps_batch *b = &st->v->b;
    int64_t B = ev->shape[0], T = ev->shape[1], H = ev->shape[2], S = ev->shape[3], maxq = b->max_q, nc = n_cells(sp);
    if (ev->ndim != 4 || T != b->T || H != sp->n_kv || S != ps_select_slots(&sp->geom.cfg) || st->seq_off[li] + B > b->B)
        return ps_fail(err, "%s: an event of [%lld, %lld, %lld, %lld] where the recall expects [<= %lld, %lld, %lld, %lld]", ev->name,
                       (long long)B, (long long)T, (long long)H, (long long)S, (long long)(b->B - st->seq_off[li]), (long long)b->T,
                       (long long)sp->n_kv, (long long)ps_select_slots(&sp->geom.cfg));
    for (int64_t e = 0; e < B; e++) {
        int64_t i = st->seq_off[li] + e;
        for (int64_t q = 0; q < b->n_q[i]; q++) {
            if (st->v->residue[i * maxq + q] < 0) continue;
            const ps_query *qq = &b->queries[i * maxq + q];
            int64_t t = qq->answer_pos, nb = (qq->key_pos + sp->offset) / sp->geom.cfg.block;
            int32_t *c = st->codes + (st->at + i * maxq + q) * nc + (int64_t)li * sp->n_kv;
            for (int64_t g = 0; g < H; g++)
                c[g] = ps_recall_code(ev->data + ((e * T + t) * H + g) * S, S, nb, t, &sp->geom.cfg);
        }
    }
    st->seq_off[li] += B;
    return 0;
}

static int rec_begin(void *user, const ps_shifted *v, int64_t at, const ps_hooks **h, ps_error *err) {
    rec_state *st = user;
    const ps_recall_spec *sp = st->sp;
    const ps_batch *b = &v->b;
    int64_t maxq = b->max_q, nc = n_cells(sp);
    st->v = v, st->at = at;
    for (int64_t i = 0; i < b->B; i++)
        for (int64_t q = 0; q < maxq; q++) {
            int32_t *c = st->codes + (at + i * maxq + q) * nc;
            for (int64_t j = 0; j < nc; j++) c[j] = -1;
            if (q >= b->n_q[i] || v->residue[i * maxq + q] < 0) continue;
            const ps_query *qq = &b->queries[i * maxq + q];
            int64_t needle = qq->key_pos + sp->offset;
            if (needle < 0 || needle > qq->answer_pos)
                return ps_fail(err, "selection recall: prompt %lld query %lld: the needle at %lld (key position %lld + offset %lld) is %s its row %lld",
                               (long long)i, (long long)q, (long long)needle, (long long)qq->key_pos, (long long)sp->offset,
                               needle < 0 ? "before the prompt, not before" : "after", (long long)qq->answer_pos);
        }
    ps_hooks_init(&st->h);
    st->live = 1;
    const ps_family *f = st->rt->family;
    const ps_point_info *pt = NULL;
    for (int k = 0; k < f->n_points; k++)
        if (f->points[k].point == sp->geom.blocks_point) pt = &f->points[k];
    if (!pt) return ps_fail(err, "%s: no hook point numbered %d (its selected blocks)", f->name, sp->geom.blocks_point);
    for (int li = 0; li < sp->n_layers; li++) {
        char why[512] = "";
        ps_select_geom g;
        memset(&g, 0, sizeof g);
        st->seq_off[li] = 0;
        st->selects[li] = (unsigned char)f->sel.layer(st->rt, sp->layers[li], b->T, &g, why, sizeof why);
        if (st->selects[li] && !same_geom(&g, &sp->geom))
            return ps_fail(err, "selection recall: layer %d's block geometry at %lld tokens differs from the one at the first prompts'",
                           sp->layers[li], (long long)b->T);
        if (!st->selects[li]) { /* every key attended at this length */
            for (int64_t i = 0; i < b->B; i++)
                for (int64_t q = 0; q < b->n_q[i]; q++)
                    if (v->residue[i * maxq + q] >= 0)
                        for (int64_t g2 = 0; g2 < sp->n_kv; g2++) st->codes[(at + i * maxq + q) * nc + li * sp->n_kv + g2] = PS_RECALL_DENSE;
            continue;
        }
        char name[256], num[16];
        const char *L = strstr(pt->pattern, "{L}");
        snprintf(num, sizeof num, "%d", sp->layers[li]);
        if (!L) return ps_fail(err, "%s: hook point %s has no layer", f->name, pt->pattern);
        snprintf(name, sizeof name, "%.*s%s%s", (int)(L - pt->pattern), pt->pattern, num, L + 3);
        if (f->hook_add(st->rt, &st->h, name, on_blocks, st, err)) return -1;
    }
    *h = &st->h;
    return 0;
}

static int rec_end(void *user, ps_error *err) {
    rec_state *st = user;
    const ps_batch *b = &st->v->b;
    ps_hooks_free(&st->h);
    st->live = 0;
    for (int li = 0; li < st->sp->n_layers; li++)
        if (st->selects[li] && st->seq_off[li] != b->B)
            return ps_fail(err, "selection recall: layer %d's selected blocks fired for %lld of the batch's %lld prompts",
                           st->sp->layers[li], (long long)st->seq_off[li], (long long)b->B);
    return 0;
}

int ps_recall_units(const ps_runtime *rt, const ps_recall_spec *sp, const ps_batch *base, const ps_task *task,
                    const ps_filler_family *fam, ps_sweep_mode mode, int64_t P, uint64_t seed, const ps_shifted *given,
                    int64_t batch, int64_t u0, int64_t u1, int32_t *ok, double *lp, int32_t *rho, int32_t *codes,
                    ps_progress_fn progress, void *user, ps_error *err) {
    rec_state st;
    memset(&st, 0, sizeof st);
    st.rt = rt, st.sp = sp, st.codes = codes;
    st.seq_off = calloc((size_t)sp->n_layers, sizeof *st.seq_off);
    st.selects = calloc((size_t)sp->n_layers, 1);
    int rc = st.seq_off && st.selects ? 0 : ps_fail(err, "out of memory for %d layers", sp->n_layers);
    ps_batch_hooks bh = {rec_begin, rec_end, &st};
    if (!rc)
        rc = ps_sweep_units_hooked(rt, base, task, fam, mode, P, seed, given, batch, &bh, u0, u1, ok, lp, rho, progress, user, err);
    if (st.live) ps_hooks_free(&st.h);
    free(st.seq_off);
    free(st.selects);
    return rc;
}

/* ---- statistics ---- */

json_t *ps_recall_stats_json(const int32_t *codes, const int32_t *rho, int64_t n_items, const int *layers, int n_layers, int64_t n_kv,
                             int64_t P, double *recall, ps_error *err) {
    int64_t nc = (int64_t)n_layers * n_kv;
    /* per cell and residue: n, found, forced, dense; per layer and residue: any head found, sum of heads found */
    int64_t *cnt = calloc((size_t)(nc * P * 4 + (int64_t)n_layers * P * 2 + P + 1), sizeof *cnt);
    if (!cnt) {
        ps_fail(err, "out of memory for %lld cells x %lld residues", (long long)nc, (long long)P);
        return NULL;
    }
    int64_t *ly = cnt + nc * P * 4, *all = ly + (int64_t)n_layers * P * 2;
    for (int64_t k = 0; k < n_items; k++) {
        if (rho[k] < 0 || rho[k] >= P) continue;
        const int32_t *c = codes + k * nc;
        int64_t any_cell = 0;
        for (int li = 0; li < n_layers; li++) {
            int64_t any = 0, sum = 0;
            for (int64_t g = 0; g < n_kv; g++) {
                int32_t v = c[li * n_kv + g];
                if (v < PS_RECALL_MISSED || v > PS_RECALL_DENSE) {
                    free(cnt);
                    ps_fail(err, "selection recall: query %lld has code %d at layer %d head %lld (not recorded)", (long long)k, v, layers[li],
                            (long long)g);
                    return NULL;
                }
                int64_t *x = cnt + ((li * n_kv + g) * P + rho[k]) * 4;
                x[0]++;
                x[1] += v != PS_RECALL_MISSED;
                x[2] += v == PS_RECALL_FORCED;
                x[3] += v == PS_RECALL_DENSE;
                any |= v != PS_RECALL_MISSED;
                sum += v != PS_RECALL_MISSED;
            }
            ly[(li * P + rho[k]) * 2] += any;
            ly[(li * P + rho[k]) * 2 + 1] += sum;
            any_cell |= any;
        }
        all[rho[k]] += any_cell;
    }
    json_t *cells = json_array(), *lays = json_array();
    for (int li = 0; li < n_layers; li++) {
        for (int64_t g = 0; g < n_kv; g++) {
            int64_t cell = li * n_kv + g, worst = -1;
            double mean = 0, mn = INFINITY, mx = -INFINITY;
            int64_t have = 0;
            json_t *res = json_array();
            for (int64_t r = 0; r < P; r++) {
                const int64_t *x = cnt + (cell * P + r) * 4;
                double rec = x[0] ? (double)x[1] / (double)x[0] : NAN, lo = 0, hi = 1;
                if (x[0]) ps_wilson(x[1], x[0], 1.959963984540054, &lo, &hi);
                if (recall) recall[cell * P + r] = rec;
                json_t *o = json_pack("{s:I, s:I, s:I, s:I, s:I}", "rho", (json_int_t)r, "n", (json_int_t)x[0], "found", (json_int_t)x[1],
                                      "forced", (json_int_t)x[2], "dense", (json_int_t)x[3]);
                json_object_set_new(o, "recall", x[0] ? json_real(rec) : json_null());
                json_object_set_new(o, "ci_low", x[0] ? json_real(lo) : json_null());
                json_object_set_new(o, "ci_high", x[0] ? json_real(hi) : json_null());
                json_array_append_new(res, o);
                if (!x[0]) continue;
                have++;
                mean += rec;
                if (rec < mn) mn = rec, worst = r;
                if (rec > mx) mx = rec;
            }
            json_t *o = json_pack("{s:i, s:I}", "layer", layers[li], "head", (json_int_t)g);
            json_object_set_new(o, "mean_recall", have ? json_real(mean / (double)have) : json_null());
            json_object_set_new(o, "min_recall", have ? json_real(mn) : json_null());
            json_object_set_new(o, "max_recall", have ? json_real(mx) : json_null());
            json_object_set_new(o, "gap_pp", have ? json_real(100 * (mx - mn)) : json_null());
            json_object_set_new(o, "worst_rho", have ? json_integer(worst) : json_null());
            json_object_set_new(o, "residues", res);
            json_array_append_new(cells, o);
        }
        json_t *res = json_array();
        for (int64_t r = 0; r < P; r++) {
            int64_t n = cnt[((li * n_kv) * P + r) * 4];
            const int64_t *y = ly + (li * P + r) * 2;
            json_t *o = json_pack("{s:I, s:I}", "rho", (json_int_t)r, "n", (json_int_t)n);
            json_object_set_new(o, "any_head", n ? json_real((double)y[0] / (double)n) : json_null());
            json_object_set_new(o, "mean_heads", n ? json_real((double)y[1] / ((double)n * (double)n_kv)) : json_null());
            json_array_append_new(res, o);
        }
        json_array_append_new(lays, json_pack("{s:i, s:o}", "layer", layers[li], "residues", res));
    }
    json_t *ov = json_array();
    for (int64_t r = 0; r < P; r++) {
        int64_t n = cnt[r * 4]; /* cell 0's count: every cell counts every query */
        json_t *o = json_pack("{s:I, s:I}", "rho", (json_int_t)r, "n", (json_int_t)n);
        json_object_set_new(o, "any_cell", n ? json_real((double)all[r] / (double)n) : json_null());
        json_array_append_new(ov, o);
    }
    free(cnt);
    return json_pack("{s:o, s:o, s:o}", "cells", cells, "layers", lays, "any_cell", ov);
}
