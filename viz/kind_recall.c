/* kind_recall.c — result kind "recall": selection recall per phase residue (interventions/recall.h), the share of
 * queries whose needle's block each (layer, KV head) selects, beside the accuracy of the same forwards. Its
 * validation and its figure, recall_heatmap.png (several results side by side, one colour scale: recall is a share). */
#include "viz/kinds.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "interventions/stats.h"
#include "viz/check_common.h"
#include "viz/fig_common.h"

/* ---- validation ---- */

/* one residue of a cell: the counts, the recall (found / n) and its Wilson interval recomputed */
static int check_residue(ps_ck *c, json_t *e, int64_t r) {
    int64_t rho, n, found, forced, dense;
    if (ps_ck_want_type(c, e, json_is_object(e), "an object") || ps_ck_get_int(c, e, "rho", r, r, &rho) ||
        ps_ck_get_int(c, e, "n", 0, MAX_COUNT, &n) || ps_ck_get_int(c, e, "found", 0, n, &found) ||
        ps_ck_get_int(c, e, "forced", 0, found, &forced) || ps_ck_get_int(c, e, "dense", 0, found - forced, &dense))
        return -1;
    static const char *const K[] = {"recall", "ci_low", "ci_high"};
    double want[3] = {n ? (double)found / (double)n : 0, 0, 1};
    if (n) ps_wilson(found, n, 1.959963984540054, &want[1], &want[2]);
    for (int i = 0; i < 3; i++) {
        json_t *v = json_object_get(e, K[i]);
        size_t old = ps_ck_key(c, K[i]);
        if (!n) {
            if (!json_is_null(v)) return ps_ck_bad(c, "%s, but n is 0 (expected null)", ps_ck_type_name(v));
        } else {
            double x;
            if (ps_ck_num_value(c, v, 0, 1 + TOL, &x)) return -1;
            if (!ps_ck_close_to(x, want[i], 1)) return ps_ck_bad(c, "%.10g, but the counts give %.10g", x, want[i]);
        }
        ps_ck_pop(c, old);
    }
    return 0;
}

int ps_check_recall(ps_ck *c, json_t *doc) {
    ps_prov_info pi;
    ps_curve_info cl = {0};
    json_t *sel, *cells, *lays;
    int64_t P, off, nc, nl, kv, blk;
    int rc = -1;
    if (ps_ck_provenance(c, doc, 1, NULL, &pi) || ps_ck_get_int(c, doc, "period", 1, MAX_PERIOD, &P) ||
        ps_ck_get_int(c, doc, "needle_offset", -((int64_t)1 << 30), (int64_t)1 << 30, &off) || ps_ck_get_obj(c, doc, "selection", &sel))
        goto done;
    if (P != pi.period) {
        ps_ck_key(c, "period");
        ps_ck_bad(c, "%lld, but provenance.eval.period is %lld", (long long)P, (long long)pi.period);
        goto done;
    }
    size_t old = ps_ck_key(c, "selection");
    if (ps_ck_get_int(c, sel, "kernel", 1, MAX_INDEX, NULL) || ps_ck_get_int(c, sel, "stride", 1, MAX_INDEX, NULL) ||
        ps_ck_get_int(c, sel, "block", 1, MAX_INDEX, &blk) || ps_ck_get_int(c, sel, "topk", 0, MAX_INDEX, NULL) ||
        ps_ck_get_int(c, sel, "init_blocks", 0, MAX_INDEX, NULL) || ps_ck_get_int(c, sel, "local_blocks", 0, MAX_INDEX, NULL) ||
        ps_ck_get_int(c, sel, "n_kv_heads", 1, MAX_INDEX, &kv))
        goto done;
    ps_ck_pop(c, old);
    if (ps_ck_curve(c, doc, "curve", P, &cl) || ps_ck_get_arr(c, doc, "cells", 1, MAX_INDEX, &cells, &nc) ||
        ps_ck_get_arr(c, doc, "layers", 1, MAX_INDEX, &lays, &nl))
        goto done;
    if (nc != nl * kv) {
        ps_ck_key(c, "cells");
        ps_ck_bad(c, "%lld cells, but %lld layers x %lld KV heads", (long long)nc, (long long)nl, (long long)kv);
        goto done;
    }
    old = ps_ck_key(c, "cells");
    for (int64_t i = 0; i < nc; i++) {
        json_t *cell = json_array_get(cells, (size_t)i), *res;
        size_t o2 = ps_ck_idx(c, (size_t)i);
        int64_t layer, head, n;
        if (ps_ck_want_type(c, cell, json_is_object(cell), "an object") || ps_ck_get_int(c, cell, "layer", 0, MAX_INDEX, &layer) ||
            ps_ck_get_int(c, cell, "head", i % kv, i % kv, &head) || ps_ck_get_arr(c, cell, "residues", P, P, &res, &n))
            goto done;
        size_t o3 = ps_ck_key(c, "residues");
        for (int64_t r = 0; r < P; r++) {
            size_t o4 = ps_ck_idx(c, (size_t)r);
            if (check_residue(c, json_array_get(res, (size_t)r), r)) goto done;
            ps_ck_pop(c, o4);
        }
        ps_ck_pop(c, o3);
        static const char *const S[] = {"mean_recall", "min_recall", "max_recall"};
        for (int k = 0; k < 3; k++) {
            json_t *v = json_object_get(cell, S[k]);
            size_t o5 = ps_ck_key(c, S[k]);
            if (!json_is_null(v) && ps_ck_num_value(c, v, 0, 1 + TOL, NULL)) goto done;
            ps_ck_pop(c, o5);
        }
        ps_ck_pop(c, o2);
    }
    ps_ck_pop(c, old);
    rc = 0;
done:
    ps_ck_curve_free(&cl);
    return rc;
}

/* ---- the figure ---- */

typedef struct {
    char name[512], sub[256];
    int rows, cols;
    int *layer, *head;
    double *v, *acc; /* [rows, cols] recall, [cols] accuracy */
} panel;

typedef struct {
    int n;
    panel *p;
    ps_rect *heat;
    double fig_w;
    char title[512], subtitle[1024], subtitle2[512];
} rc_ctx;

#define RC_TOP 124.0
#define RC_ACC_GAP 50.0 /* below the heatmap: the residue ticks and label, then the accuracy strip */
#define RC_ACC_H 18.0

static void draw_recall(cairo_t *cr, void *vctx) {
    rc_ctx *x = vctx;
    ps_text(cr, 20, 22, x->title, ps_fig_fit(cr, x->title, 17, x->fig_w - 40, 1), 0, 0.5, 0, 1);
    ps_text(cr, 20, 46, x->subtitle, ps_fig_fit(cr, x->subtitle, 12.5, x->fig_w - 40, 0), 0, 0.5, 0, 0);
    ps_text(cr, 20, 64, x->subtitle2, ps_fig_fit(cr, x->subtitle2, 12.5, x->fig_w - 40, 0), 0, 0.5, 0, 0);
    for (int k = 0; k < x->n; k++) {
        panel *g = &x->p[k];
        ps_rect hr = x->heat[k];
        double px = hr.x, T = hr.y, w = hr.w, h = hr.h, ch = h / g->rows, cw = w / g->cols;
        double cx = px + w / 2;
        cairo_set_source_rgb(cr, 0, 0, 0);
        ps_text(cr, cx, T - 34, g->name, ps_fig_fit(cr, g->name, 13, w + 200, 1), 0.5, 0.5, 0, 1);
        ps_text(cr, cx, T - 16, g->sub, ps_fig_fit(cr, g->sub, 12, w + 200, 0), 0.5, 0.5, 0, 0);
        ps_heatmap(cr, px, T, w, h, g->v, g->rows, g->cols, ps_viridis, 0, 1);
        cairo_set_source_rgb(cr, 0, 0, 0);
        int r0 = 0;
        for (int r = 1; r <= g->rows; r++)
            if (r == g->rows || g->layer[r] != g->layer[r0]) {
                char buf[32];
                snprintf(buf, sizeof buf, "layer %d", g->layer[r0]);
                if ((r - r0) * ch >= 9 || r0 == 0 || g->rows <= 64)
                    ps_text(cr, px - (ch >= 10 ? 34 : 6), T + (r0 + r) / 2.0 * ch, buf, ch >= 10 ? 12 : 10, 1, 0.5, 0, 1);
                if (r < g->rows) {
                    cairo_set_source_rgb(cr, 1, 1, 1);
                    cairo_set_line_width(cr, 2);
                    ps_fig_line(cr, px, round(T + r * ch), px + w, round(T + r * ch));
                    cairo_set_source_rgb(cr, 0, 0, 0);
                }
                r0 = r;
            }
        if (ch >= 10)
            for (int r = 0; r < g->rows; r++) {
                char buf[16];
                snprintf(buf, sizeof buf, "h%d", g->head[r]);
                ps_text(cr, px - 4, T + (r + 0.5) * ch, buf, fmin(12, ch - 1), 1, 0.5, 0, 0);
            }
        int step = ps_tick_step(cw, ps_text_width(cr, "000", 12, 0) + 4);
        for (int c = 0; c < g->cols; c += step) {
            char buf[16];
            snprintf(buf, sizeof buf, "%d", c);
            ps_text(cr, px + (c + 0.5) * cw, T + h + 6, buf, 12, 0.5, 0, 0, 0);
        }
        ps_text(cr, px + w / 2, T + h + 28, "phase residue ρ = t_K mod P", 13, 0.5, 0, 0, 0);
        double ya = T + h + RC_ACC_GAP;
        ps_heatmap(cr, px, ya, w, RC_ACC_H, g->acc, 1, g->cols, ps_viridis, 0, 1);
        cairo_set_source_rgb(cr, 0, 0, 0);
        ps_text(cr, px - 6, ya + RC_ACC_H / 2, "accuracy", 12, 1, 0.5, 0, 1);
        if (cw >= 26) /* the accuracies as numbers where the cells are wide enough */
            for (int c = 0; c < g->cols; c++) {
                if (isnan(g->acc[c])) continue;
                char buf[16];
                snprintf(buf, sizeof buf, "%.2f", g->acc[c]);
                double lum = g->acc[c]; /* viridis is dark below the middle */
                cairo_set_source_rgb(cr, lum < 0.55, lum < 0.55, lum < 0.55);
                ps_text(cr, px + (c + 0.5) * cw, ya + RC_ACC_H / 2, buf[0] == '0' ? buf + 1 : buf, 10, 0.5, 0.5, 0, 0);
            }
        cairo_set_source_rgb(cr, 0, 0, 0);
        ps_colorbar(cr, px + w + 16, T, 16, h, ps_viridis, 0, 1, "recall: needle's block selected");
    }
}

static void free_panels(rc_ctx *x) {
    for (int k = 0; k < x->n && x->p; k++) {
        free(x->p[k].layer);
        free(x->p[k].head);
        free(x->p[k].v);
        free(x->p[k].acc);
    }
    free(x->p);
    free(x->heat);
}

int ps_render_recall(json_t *const *docs, const char *const *paths, int n, const char *out, const ps_render_opts *o, int verbose,
                     ps_error *err) {
    if (n > MAX_KO_PANELS) return ps_fail(err, "%s: %d recall results side by side; a figure shows at most %d", paths[0], n, MAX_KO_PANELS);
    rc_ctx x = {0};
    x.n = n;
    x.p = calloc((size_t)n, sizeof *x.p);
    x.heat = calloc((size_t)n, sizeof *x.heat);
    int *rows = calloc((size_t)n, sizeof(int)), *cols = calloc((size_t)n, sizeof(int)), rc = 0;
    if (!x.p || !x.heat || !rows || !cols) rc = ps_fail(err, "%s: out of memory", paths[0]);
    for (int k = 0; k < n && !rc; k++) {
        panel *g = &x.p[k];
        json_t *cells = json_object_get(docs[k], "cells"), *sel = json_object_get(docs[k], "selection");
        json_t *cres = json_object_get(json_object_get(docs[k], "curve"), "residues");
        ps_fig_model_name(g->name, sizeof g->name, json_object_get(docs[k], "provenance"));
        /* a row's slots (topk + local_blocks) hold the forced blocks (initial ones, the query's own and the local ones
         * before it) and the rest chosen by score */
        long long blk = json_integer_value(json_object_get(sel, "block")), tk = json_integer_value(json_object_get(sel, "topk")),
                  lb = json_integer_value(json_object_get(sel, "local_blocks")), ib = json_integer_value(json_object_get(sel, "init_blocks"));
        long long by_score = tk + lb - ib - lb - 1 > 0 ? tk + lb - ib - lb - 1 : 0;
        snprintf(g->sub, sizeof g->sub, "blocks of %lld tokens; a row attends %lld: %lld initial, its own and %lld before it, %lld by score; needle at t_K%+lld",
                 blk, tk + lb, ib, lb, by_score, (long long)json_integer_value(json_object_get(docs[k], "needle_offset")));
        size_t nrows = json_array_size(cells);
        json_int_t period = json_integer_value(json_object_get(docs[k], "period"));
        if (nrows < 1 || nrows > MAX_KO_ROWS || period < 1 || period > MAX_KO_PERIOD) {
            rc = ps_fail(err, "%s: a %zu x %lld grid is beyond a figure (1 to %d rows, 1 to %d residues)", paths[k], nrows, (long long)period,
                         MAX_KO_ROWS, MAX_KO_PERIOD);
            break;
        }
        g->rows = rows[k] = (int)nrows;
        g->cols = cols[k] = (int)period;
        g->layer = calloc(nrows, sizeof(int));
        g->head = calloc(nrows, sizeof(int));
        g->v = calloc(nrows * (size_t)period, sizeof(double));
        g->acc = calloc((size_t)period, sizeof(double));
        if (!g->layer || !g->head || !g->v || !g->acc) {
            rc = ps_fail(err, "%s: out of memory", paths[k]);
            break;
        }
        for (int r = 0; r < g->rows; r++) {
            json_t *cell = json_array_get(cells, (size_t)r), *res = json_object_get(cell, "residues");
            g->layer[r] = (int)json_integer_value(json_object_get(cell, "layer"));
            g->head[r] = (int)json_integer_value(json_object_get(cell, "head"));
            for (int c = 0; c < g->cols; c++) {
                json_t *v = json_object_get(json_array_get(res, (size_t)c), "recall");
                g->v[(size_t)r * (size_t)g->cols + (size_t)c] = json_is_number(v) ? json_number_value(v) : NAN;
            }
        }
        for (int c = 0; c < g->cols; c++) {
            json_t *e = json_array_get(cres, (size_t)c);
            g->acc[c] = json_integer_value(json_object_get(e, "n")) > 0 ? ps_fig_num(e, "accuracy") : NAN;
        }
    }
    double W = 0, H = 0;
    if (!rc) rc = ps_knockout_layout(n, rows, cols, x.heat, &W, &H, err);
    if (!rc) {
        x.fig_w = W;
        snprintf(x.title, sizeof x.title, "Selection recall per layer × KV head and phase residue");
        snprintf(x.subtitle, sizeof x.subtitle,
                 "share of the scored queries whose needle's block is among the blocks the head attends at the query's row "
                 "(selected by score or forced)");
        snprintf(x.subtitle2, sizeof x.subtitle2, "yellow = always found, dark = never; grey = no prompts; the strip below: the "
                                                  "accuracy of the same forwards");
        ps_fig_chunks ch;
        ps_fig_make_chunks(&ch, json_object_get(docs[0], "provenance"), x.title);
        ps_fig f;
        for (int k = 0; !rc && k < ps_fig_n_files(o); k++)
            if (!(rc = ps_fig_file_open(&f, out, "recall_heatmap", W, H + RC_ACC_GAP, o, k, err))) {
                draw_recall(f.cr, &x);
                rc = ps_fig_file_close(&f, &ch, verbose, err);
            }
    }
    free_panels(&x);
    free(rows);
    free(cols);
    return rc;
}
