/* ko_partial.c — the knockout module's split runs (interventions/knockout.h, docs/scale-out.md): the partial
 * result's layout, the recorder the grid engine calls with every scored batch (ps_knockout_record, given
 * as the grid's `record`), and the aggregation of complete parts in the one-process order. knockout.c runs
 * the grid and writes the result. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "interventions/knockout.h"
#include "interventions/promptset.h"
#include "interventions/units.h"

/* ---- split runs: the partial result's layout, the recording, the aggregation ---- */

/* Outcomes into the partial result: a batch's clean run (with the residues) in its unit with li = 0, a
 * cell's in its (shift, batch, layer) unit, head after head. */
enum { KO_RHO, KO_CLEAN_OK, KO_CLEAN_LP, KO_CELL_OK, KO_CELL_LP, KO_REF_OK, KO_REF_LP };

void ps_knockout_record(void *user, int64_t unit, int cell, int64_t first, const ps_shifted *set, const int *ok,
                      const double *lp) {
    ps_knockout_recorder *r = user;
    int64_t maxq = set->b.max_q;
    if (cell == PS_GRID_REF) { /* activation patching's source run (the layout's corrupt arrays) */
        if (r->p->n_arr < 7) return;
        int32_t *cok = (int32_t *)ps_partial_at(r->p, KO_REF_OK, unit) + first * maxq;
        double *clp = (double *)ps_partial_at(r->p, KO_REF_LP, unit) + first * maxq;
        for (int64_t i = 0; i < set->b.B; i++)
            for (int64_t q = 0; q < maxq; q++) {
                int64_t k = i * maxq + q;
                int scored = q < set->b.n_q[i] && set->residue[k] >= 0;
                cok[k] = scored ? ok[k] : 0;
                clp[k] = scored ? lp[k] : 0.0;
            }
        return;
    }
    if (cell < 0) {
        int32_t *rho = ps_partial_at(r->p, KO_RHO, unit), *cok = ps_partial_at(r->p, KO_CLEAN_OK, unit);
        double *clp = ps_partial_at(r->p, KO_CLEAN_LP, unit);
        for (int64_t i = 0; i < set->b.B; i++)
            for (int64_t q = 0; q < maxq; q++) {
                int64_t k = i * maxq + q, o = first * maxq + k;
                int scored = q < set->b.n_q[i] && set->residue[k] >= 0;
                rho[o] = scored ? (int32_t)set->residue[k] : -1;
                cok[o] = scored ? ok[k] : 0;
                clp[o] = scored ? lp[k] : 0.0;
            }
        return;
    }
    int64_t n_unit = ps_partial_count(r->p, KO_CELL_OK, unit) / (r->nh * maxq), hi = cell % r->nh;
    int32_t *cok = (int32_t *)ps_partial_at(r->p, KO_CELL_OK, unit) + (hi * n_unit + first) * maxq;
    double *clp = (double *)ps_partial_at(r->p, KO_CELL_LP, unit) + (hi * n_unit + first) * maxq;
    for (int64_t i = 0; i < set->b.B; i++)
        for (int64_t q = 0; q < maxq; q++) {
            int64_t k = i * maxq + q;
            int scored = q < set->b.n_q[i] && set->residue[k] >= 0;
            cok[k] = scored ? ok[k] : 0;
            clp[k] = scored ? lp[k] : 0.0;
        }
}

/* the knockout's arrays and, with_ref, activation patching's source-run arrays after them */
static int layout(ps_partial *p, int64_t N, int64_t batch, int64_t P, int n_layers, int n_cells, int64_t maxq, int last_first,
                  int with_ref, ps_error *err) {
    int64_t nu = ps_grid_n_units(N, batch, P, n_layers), *w = malloc((size_t)(nu ? nu : 1) * sizeof *w);
    if (!w) return ps_fail(err, "out of memory for %lld work units", (long long)nu);
    int64_t p_, i0, n;
    int li, rc = 0;
    for (int64_t u = 0; u < nu; u++) {
        ps_grid_unit(N, batch, n_layers, last_first, u, &p_, &i0, &n, &li);
        w[u] = li == 0 ? n * maxq : 0;
    }
    if (ps_partial_add(p, "rho", PS_PART_I32, w, err) < 0 || ps_partial_add(p, "clean_ok", PS_PART_I32, w, err) < 0 ||
        ps_partial_add(p, "clean_logprob", PS_PART_F64, w, err) < 0)
        rc = -1;
    for (int64_t u = 0; u < nu && !rc; u++) {
        ps_grid_unit(N, batch, n_layers, last_first, u, &p_, &i0, &n, &li);
        w[u] = n_cells * n * maxq;
    }
    if (!rc && (ps_partial_add(p, "cell_ok", PS_PART_I32, w, err) < 0 || ps_partial_add(p, "cell_logprob", PS_PART_F64, w, err) < 0))
        rc = -1;
    for (int64_t u = 0; u < nu && !rc && with_ref; u++) {
        ps_grid_unit(N, batch, n_layers, last_first, u, &p_, &i0, &n, &li);
        w[u] = li == 0 ? n * maxq : 0;
    }
    if (!rc && with_ref &&
        (ps_partial_add(p, "corrupt_ok", PS_PART_I32, w, err) < 0 || ps_partial_add(p, "corrupt_logprob", PS_PART_F64, w, err) < 0))
        rc = -1;
    free(w);
    return rc;
}

int ps_knockout_partial_layout(ps_partial *p, int64_t N, int64_t batch, int64_t P, int n_layers, int n_cells, int64_t maxq,
                               int last_first, ps_error *err) {
    return layout(p, N, batch, P, n_layers, n_cells, maxq, last_first, 0, err);
}

int ps_patch_partial_layout(ps_partial *p, int64_t N, int64_t batch, int64_t P, int n_layers, int n_cells, int64_t maxq,
                            int last_first, ps_error *err) {
    return layout(p, N, batch, P, n_layers, n_cells, maxq, last_first, 1, err);
}

int ps_knockout_from_partial(const ps_partial *p, ps_knockout_result *r, ps_error *err) {
    memset(r, 0, sizeof *r);
    json_t *jl = json_object_get(p->meta, "layers"), *jh = json_object_get(p->meta, "heads");
    int nl = (int)json_array_size(jl), nh = (int)json_array_size(jh), rc = -1;
    int64_t P = json_integer_value(json_object_get(p->meta, "period")), maxq = json_integer_value(json_object_get(p->meta, "max_q"));
    const char *tg = json_string_value(json_object_get(p->meta, "target"));
    if (nl < 1 || nh < 1 || P < 1 || maxq < 1 || !tg || (p->n_arr != 5 && p->n_arr != 7) || p->n_units % nl)
        return ps_fail(err, "a knockout grid's partial result lacks its layers, heads, period or outcomes");
    int *layers = malloc((size_t)nl * sizeof(int)), *heads = malloc((size_t)nh * sizeof(int));
    if (!layers || !heads) {
        ps_fail(err, "out of memory");
        goto done;
    }
    for (int i = 0; i < nl; i++) layers[i] = (int)json_integer_value(json_array_get(jl, (size_t)i));
    for (int i = 0; i < nh; i++) heads[i] = (int)json_integer_value(json_array_get(jh, (size_t)i));
    if (ps_grid_result_init(r, P, layers, nl, heads, nh, err)) goto done;
    /* the one-process order: shifts, batches in the grid's order, the clean run, then each layer's cells */
    const int32_t *rho = NULL;
    int64_t n_items = 0;
    for (int64_t u = 0; u < p->n_units; u++) {
        int li = (int)(u % nl);
        if (li == 0) {
            rho = ps_partial_at(p, KO_RHO, u);
            n_items = ps_partial_count(p, KO_RHO, u);
            ps_residue_stats_add_items(&r->clean, ps_partial_at(p, KO_CLEAN_OK, u), ps_partial_at(p, KO_CLEAN_LP, u), rho, n_items);
            if (p->n_arr == 7)
                ps_residue_stats_add_items(&r->ref, ps_partial_at(p, KO_REF_OK, u), ps_partial_at(p, KO_REF_LP, u), rho, n_items);
        }
        if (ps_partial_count(p, KO_CELL_OK, u) != nh * n_items) {
            ps_fail(err, "a knockout grid's partial result: unit %lld has %lld cell outcomes, expected %lld", (long long)u,
                    (long long)ps_partial_count(p, KO_CELL_OK, u), (long long)(nh * n_items));
            goto done;
        }
        for (int hi = 0; hi < nh; hi++)
            ps_residue_stats_add_items(&r->cells[li * nh + hi], (const int32_t *)ps_partial_at(p, KO_CELL_OK, u) + hi * n_items,
                                       (const double *)ps_partial_at(p, KO_CELL_LP, u) + hi * n_items, rho, n_items);
    }
    rc = 0;
done:
    free(layers);
    free(heads);
    if (rc) ps_grid_result_free(r);
    return rc;
}

int ps_knockout_logit_diff(const ps_partial *p, json_t *grid, ps_error *err) {
    int nl = (int)json_array_size(json_object_get(p->meta, "layers")), nh = (int)json_array_size(json_object_get(p->meta, "heads"));
    int64_t P = json_integer_value(json_object_get(p->meta, "period"));
    if (nl < 1 || nh < 1 || P < 1 || p->n_units % nl) return ps_fail(err, "a knockout grid's partial result lacks its layers, heads or period");
    /* blocks of P: the clean run, every cell, the corrupt run (activation patching) */
    int64_t nb = 2 + (int64_t)nl * nh, rb = nb - 1;
    double *sum = calloc((size_t)(nb * P), sizeof *sum), *clean = malloc((size_t)P * sizeof *clean);
    double *corr = malloc((size_t)P * sizeof *corr), *cell = malloc((size_t)P * sizeof *cell);
    int64_t *n = calloc((size_t)(nb * P), sizeof *n);
    if (!sum || !n || !clean || !corr || !cell) {
        free(sum);
        free(n);
        free(clean);
        free(corr);
        free(cell);
        return ps_fail(err, "out of memory for the logit differences of %d x %d cells", nl, nh);
    }
    const int32_t *rho = NULL;
    int64_t n_items = 0, any = 0;
    for (int64_t u = 0; u < p->n_units; u++) { /* the one-process order, as ps_knockout_from_partial */
        int li = (int)(u % nl);
        if (li == 0) {
            rho = ps_partial_at(p, KO_RHO, u);
            n_items = ps_partial_count(p, KO_RHO, u);
            ps_promptset_logit_diff(ps_partial_at(p, KO_CLEAN_LP, u), rho, n_items, P, sum, n);
            if (p->n_arr == 7) ps_promptset_logit_diff(ps_partial_at(p, KO_REF_LP, u), rho, n_items, P, sum + rb * P, n + rb * P);
        }
        for (int hi = 0; hi < nh && rho; hi++)
            ps_promptset_logit_diff((const double *)ps_partial_at(p, KO_CELL_LP, u) + hi * n_items, rho, n_items, P,
                                    sum + (1 + li * nh + hi) * P, n + (1 + li * nh + hi) * P);
    }
    for (int64_t r = 0; r < P; r++) any += n[r];
    if (any) {
        ps_promptset_put_logit_diff(json_object_get(json_object_get(grid, "clean"), "residues"), sum, n, P, NULL, clean);
        json_t *cells = json_object_get(grid, "cells"), *cres = json_object_get(json_object_get(grid, "corrupt"), "residues");
        if (p->n_arr == 7) ps_promptset_put_logit_diff(cres, sum + rb * P, n + rb * P, P, clean, corr);
        json_t *jl = json_object_get(p->meta, "layers");
        for (int64_t c = 0; c < (int64_t)nl * nh; c++) {
            /* the JSON lists the cells by ascending layer, the partial result by the grid's (top-down) order */
            json_t *cj = json_array_get(cells, (size_t)c), *res = json_object_get(cj, "residues");
            json_int_t layer = json_integer_value(json_object_get(cj, "layer"));
            int64_t li = 0;
            while (li < nl - 1 && json_integer_value(json_array_get(jl, (size_t)li)) != layer) li++;
            int64_t b = 1 + li * nh + c % nh; /* the cell's block */
            ps_promptset_put_logit_diff(res, sum + b * P, n + b * P, P, clean, cell);
            for (int64_t r = 0; r < P && p->n_arr == 7; r++) {
                /* the normalised patching metric (patched - corrupt) / (clean - corrupt) of the logit difference:
                 * 1 where patching the cell leaves the clean run's logit difference, 0 where it gives the
                 * corrupt run's; null where the clean and corrupt runs do not differ */
                double den = clean[r] - corr[r];
                int ok = n[b * P + r] && n[r] && n[rb * P + r] && fabs(den) > 1e-9;
                json_object_set_new(json_array_get(res, (size_t)r), "patch_metric", ok ? json_real((cell[r] - corr[r]) / den) : json_null());
            }
        }
    }
    free(sum);
    free(n);
    free(clean);
    free(corr);
    free(cell);
    return any ? 1 : 0;
}
