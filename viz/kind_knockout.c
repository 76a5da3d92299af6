/* kind_knockout.c — result kind "knockout": the change in answer NLL and accuracy when each (layer, head)
 * cell is knocked out at each phase residue. Its validation and its figure, knockout_heatmap.png (several grids
 * side by side, each panel on its own colour scale). */
#include "viz/kinds.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/runtime.h"
#include "viz/check_common.h"
#include "viz/fig_common.h"

/* ---- validation ---- */

static int cmp_i64(const void *x, const void *y) {
    int64_t a = *(const int64_t *)x, b = *(const int64_t *)y;
    return a < b ? -1 : a > b;
}

/* A null where an estimate has no number (est), else a number in [lo, hi]. */
static int ck_num_or_null(ps_ck *c, json_t *o, const char *k, int est, double lo, double hi, double *out) {
    json_t *v;
    if (est) {
        size_t old = c->len;
        if (ps_ck_field(c, o, k, &v)) return -1;
        if (!json_is_null(v)) return ps_ck_bad(c, "must be null in an attribution estimate (it estimates NLL changes only)");
        ps_ck_pop(c, old);
        *out = NAN;
        return 0;
    }
    return ps_ck_get_num(c, o, k, lo, hi, out);
}

/* A cell's residues, means and worst residue (est: an attribution estimate, accuracies null). */
static int check_cell_stats(ps_ck *c, json_t *cell, int64_t P, const ps_curve_info *cl, int est) {
    json_t *res;
    if (ps_ck_get_arr(c, cell, "residues", P, P, &res, NULL)) return -1;
    size_t o4 = ps_ck_key(c, "residues");
    double sum_da = 0, sum_dn = 0, m;
    int64_t used = 0;
    for (int64_t r = 0; r < P; r++) {
        json_t *e = json_array_get(res, (size_t)r);
        size_t o5 = ps_ck_idx(c, (size_t)r);
        int64_t rho, n;
        double a = NAN, nll, da, dn;
        if (ps_ck_want_type(c, e, json_is_object(e), "an object") || ps_ck_get_int(c, e, "rho", INT64_MIN, INT64_MAX, &rho)) return -1;
        if (rho != r) {
            ps_ck_key(c, "rho");
            return ps_ck_bad(c, "%lld, expected %lld (the residues 0..P-1 = 0..%lld, each once, in order)", (long long)rho, (long long)r,
                             (long long)(P - 1));
        }
        if (ps_ck_get_int(c, e, "n", 0, MAX_COUNT, &n)) return -1;
        if (n != cl->n[r]) {
            ps_ck_key(c, "n");
            return ps_ck_bad(c, "%lld, but grid.clean has n = %lld at residue %lld (a knocked-out cell scores the same queries)", (long long)n,
                             (long long)cl->n[r], (long long)r);
        }
        if (est) {
            if (ck_num_or_null(c, e, "accuracy", 1, 0, 1, &a)) return -1;
        } else {
            if (ps_ck_get_frac(c, e, "accuracy", &a)) return -1;
            double k = n ? round(a * (double)n) : 0, want = n ? k / (double)n : 0;
            if (!ps_ck_close_to(a, want, 0)) {
                ps_ck_key(c, "accuracy");
                return ps_ck_bad(c, "%.10g is not a count of correct answers out of n = %lld", a, (long long)n);
            }
        }
        /* an estimate's NLL may fall below 0 (first order) */
        if (ps_ck_get_num(c, e, "mean_nll", est ? -INFINITY : -TOL, INFINITY, &nll) ||
            ck_num_or_null(c, e, "delta_accuracy_pp", est, -100 - TOL, 100 + TOL, &da) ||
            ps_ck_get_num(c, e, "delta_nll", -INFINITY, INFINITY, &dn))
            return -1;
        if (!est && !ps_ck_close_to(da, 100 * (a - cl->acc[r]), 100)) {
            ps_ck_key(c, "delta_accuracy_pp");
            return ps_ck_bad(c, "%.10g, but accuracy - clean accuracy = %.10g pp", da, 100 * (a - cl->acc[r]));
        }
        double cn = -cl->lp[r];
        if (!ps_ck_close_to(dn, nll - cn, fmax(fabs(nll), cn))) {
            ps_ck_key(c, "delta_nll");
            return ps_ck_bad(c, "%.10g, but mean_nll - clean mean NLL = %.10g", dn, nll - cn);
        }
        if (n) {
            sum_da += est ? 0 : da;
            sum_dn += dn;
            used++;
        }
        ps_ck_pop(c, o5);
    }
    ps_ck_pop(c, o4);
    double wda = used ? sum_da / (double)used : 0, wdn = used ? sum_dn / (double)used : 0;
    if (ck_num_or_null(c, cell, "mean_delta_accuracy_pp", est, -100 - TOL, 100 + TOL, &m)) return -1;
    if (!est && !ps_ck_close_to(m, wda, 100)) {
        ps_ck_key(c, "mean_delta_accuracy_pp");
        return ps_ck_bad(c, "%.10g, but the residues' mean is %.10g", m, wda);
    }
    if (ps_ck_get_num(c, cell, "mean_delta_nll", -INFINITY, INFINITY, &m)) return -1;
    if (!ps_ck_close_to(m, wdn, fabs(wdn))) {
        ps_ck_key(c, "mean_delta_nll");
        return ps_ck_bad(c, "%.10g, but the residues' mean is %.10g", m, wdn);
    }
    return 0;
}

static int check_grid(ps_ck *c, json_t *doc, int patch);
int ps_check_knockout(ps_ck *c, json_t *doc) { return check_grid(c, doc, 0); }
int ps_check_patch(ps_ck *c, json_t *doc) { return check_grid(c, doc, 1); }

/* a knockout grid, or (patch) activation patching's: method "patch" and the corrupt run's curve */
static int check_grid(ps_ck *c, json_t *doc, int patch) {
    static const char *const TGT[] = {"raw", "compressed", "both", "heads", "indexer", "sink", NULL};
    static const char *const METHOD[] = {"exact", "atp", NULL}, *const PATCH[] = {"patch", NULL};
    ps_prov_info pi;
    ps_curve_info cl = {0};
    json_t *g, *cells;
    int64_t P, nc, *pairs = NULL;
    int rc = -1, est = 0;
    if (ps_ck_provenance(c, doc, 1, NULL, &pi) || ps_ck_get_obj(c, doc, "grid", &g)) goto done;
    size_t old = ps_ck_key(c, "grid");
    if (ps_ck_get_int(c, g, "period", 1, MAX_PERIOD, &P)) goto done;
    if (P != pi.period) {
        ps_ck_key(c, "period");
        ps_ck_bad(c, "%lld, but provenance.eval.period is %lld", (long long)P, (long long)pi.period);
        goto done;
    }
    /* a shipped family's target is one of its names; a family its user defined (a config no shipped family
     * describes, its provenance's label and kind do) names its own targets */
    ps_model_desc md;
    ps_error de;
    int shipped = !ps_model_desc_from_config(json_object_get(json_object_get(doc, "provenance"), "config"), &md, &de);
    if ((shipped ? ps_ck_get_enum(c, g, "target", TGT, NULL) : ps_ck_get_str(c, g, "target", NULL)) || ps_ck_curve(c, g, "clean", P, &cl))
        goto done;
    if (patch) {
        ps_curve_info cr = {0};
        int bad = ps_ck_get_enum(c, g, "method", PATCH, NULL) || ps_ck_curve(c, g, "corrupt", P, &cr);
        ps_ck_curve_free(&cr);
        if (bad) goto done;
    } else if (json_object_get(g, "method")) { /* absent: an exact grid (results before the method was recorded) */
        const char *mth;
        if (ps_ck_get_enum(c, g, "method", METHOD, &mth)) goto done;
        est = !strcmp(mth, "atp");
    }
    if (est) {
        static const char *const FIX[] = {"none", "qk", NULL};
        json_t *at;
        if (ps_ck_get_obj(c, g, "atp", &at)) goto done;
        size_t oa = ps_ck_key(c, "atp");
        if (ps_ck_get_enum(c, at, "fix", FIX, NULL) || ps_ck_get_int(c, at, "verified", 0, MAX_INDEX, NULL)) goto done;
        ps_ck_pop(c, oa);
    }
    if (ps_ck_get_arr(c, g, "cells", 1, MAX_WINDOW * (int64_t)MAX_WINDOW, &cells, &nc)) goto done;
    pairs = malloc((size_t)nc * sizeof *pairs);
    if (!pairs) {
        ps_fail(c->err, "out of memory");
        goto done;
    }
    size_t o2 = ps_ck_key(c, "cells");
    int64_t n_exact = 0;
    for (int64_t i = 0; i < nc; i++) {
        json_t *cell = json_array_get(cells, (size_t)i);
        size_t o3 = ps_ck_idx(c, (size_t)i);
        int64_t layer, head;
        if (ps_ck_want_type(c, cell, json_is_object(cell), "an object") || ps_ck_get_int(c, cell, "layer", 0, MAX_INDEX - 1, &layer) ||
            ps_ck_get_int(c, cell, "head", 0, MAX_INDEX - 1, &head))
            goto done;
        pairs[i] = layer << 32 | head;
        if (check_cell_stats(c, cell, P, &cl, est)) goto done;
        if (est) { /* the verified cells carry their exact knockout */
            json_t *ex;
            size_t oe = c->len;
            if (ps_ck_field(c, cell, "exact", &ex)) goto done;
            if (!json_is_null(ex)) {
                if (ps_ck_want_type(c, ex, json_is_object(ex), "an object or null") || check_cell_stats(c, ex, P, &cl, 0)) goto done;
                n_exact++;
            }
            ps_ck_pop(c, oe);
        }
        ps_ck_pop(c, o3);
    }
    if (est) {
        int64_t nv = json_integer_value(json_object_get(json_object_get(g, "atp"), "verified"));
        if (nv != n_exact) {
            ps_ck_pop(c, o2);
            ps_ck_key(c, "atp");
            ps_ck_key(c, "verified");
            ps_ck_bad(c, "%lld, but %lld cells carry an exact knockout", (long long)nv, (long long)n_exact);
            goto done;
        }
    }
    ps_ck_pop(c, o2);
    int64_t *sorted = malloc((size_t)nc * sizeof *sorted);
    if (!sorted) {
        ps_fail(c->err, "out of memory");
        goto done;
    }
    memcpy(sorted, pairs, (size_t)nc * sizeof *sorted);
    qsort(sorted, (size_t)nc, sizeof *sorted, cmp_i64);
    for (int64_t i = 1; i < nc; i++)
        if (sorted[i] == sorted[i - 1]) {
            int64_t dup = sorted[i], first = -1;
            for (int64_t j = 0; j < nc; j++)
                if (pairs[j] == dup) {
                    if (first < 0) first = j;
                    else {
                        ps_ck_key(c, "cells");
                        ps_ck_idx(c, (size_t)j);
                        ps_ck_bad(c, "layer %lld head %lld again (first at cells[%lld]); each cell once", (long long)(dup >> 32),
                            (long long)(dup & 0xffffffff), (long long)first);
                        break;
                    }
                }
            free(sorted);
            goto done;
        }
    free(sorted);
    ps_ck_pop(c, old);
    rc = 0;
done:
    free(pairs);
    ps_ck_curve_free(&cl);
    return rc;
}

/* ---- figure: knockout heatmaps ---- */

#define KO_TOP 124.0 /* heatmaps start here: title, subtitle (2 lines), panel name and target above */
#define KO_BAR_GAP 16.0
#define KO_BAR_W 16.0
#define KO_BAR_ROOM 96.0 /* bar ticks and label */

static double ko_left(double ch) { return ch >= 10 ? 110 : 80; }
/* panels 24 px a row, at least 240 and at most 900 px tall, unless the rows need more (1 px each); grids of
 * up to 100 rows (12 layers × 8 KV heads) get 12 px a row, so each head keeps its label */
static double ko_panel_h(int maxrows) {
    return fmin(fmax(240, maxrows * 24.0), fmax(fmax(900, (double)maxrows), fmin(1200, maxrows * 12.0)));
}
/* cells 10 to 36 px wide, narrower (down to 1 px) when n panels of maxcols would pass ~12000 px */
static double ko_cell_w(int maxcols, int n) {
    double cw = fmax(10, fmin(36, 560.0 / maxcols / (n > 1 ? 1.4 : 1)));
    if (cw * maxcols * n > 12000) cw = fmax(1, 12000.0 / ((double)maxcols * n));
    return cw;
}

int ps_knockout_layout(int n, const int *rows, const int *cols, ps_rect *heat, double *fig_w, double *fig_h,
                       ps_error *err) {
    int maxrows = 1, maxcols = 1;
    if (n < 1 || n > MAX_KO_PANELS) return ps_fail(err, "knockout: %d grids side by side; a figure shows 1 to %d", n, MAX_KO_PANELS);
    for (int k = 0; k < n; k++) {
        if (rows[k] < 1 || rows[k] > MAX_KO_ROWS || cols[k] < 1 || cols[k] > MAX_KO_PERIOD)
            return ps_fail(err, "knockout: a %d x %d grid is beyond a figure (1 to %d rows, 1 to %d residues)", rows[k], cols[k],
                           MAX_KO_ROWS, MAX_KO_PERIOD);
        maxrows = rows[k] > maxrows ? rows[k] : maxrows;
        maxcols = cols[k] > maxcols ? cols[k] : maxcols;
    }
    double hp = ko_panel_h(maxrows), cw = ko_cell_w(maxcols, n), x = 20;
    for (int k = 0; k < n; k++) {
        double ch = hp / rows[k];
        x += ko_left(ch);
        heat[k] = (ps_rect){x, KO_TOP, cols[k] * cw, hp};
        x += cols[k] * cw + KO_BAR_GAP + KO_BAR_W + KO_BAR_ROOM + 24;
    }
    *fig_w = fmax(x, 900);
    *fig_h = KO_TOP + hp + 62;
    if (*fig_w > PS_FIG_MAX_SIDE || *fig_h > PS_FIG_MAX_SIDE)
        return ps_fail(err, "knockout: %d grids would need a %.0f x %.0f px figure (at most %.0f a side)", n, *fig_w, *fig_h,
                       PS_FIG_MAX_SIDE);
    return 0;
}

ps_rgb ps_knockout_color(double v, double vmax, int acc) {
    double t = vmax > 0 ? (v + vmax) / (2 * vmax) : 0.5;
    return acc ? ps_diverging_rev(t) : ps_diverging(t);
}

typedef struct {
    char name[512], target[256];
    int per_layer; /* the result's unit is "layer": one cell per layer, no head labels */
    int rows, cols;
    int *layer, *head;
    double *v, vmax;
} grid;

typedef struct {
    int n;
    grid *g;
    ps_rect *heat;
    int acc;
    double fig_w;
    char title[1024], subtitle[1024], subtitle2[1024];
    json_t *cmp;     /* an atp_compare result: its scatter is drawn in `scatter` */
    ps_rect scatter;
} ko_ctx;

static void draw_scatter(cairo_t *cr, const ko_ctx *x);

static void draw_knockout(cairo_t *cr, void *vctx) {
    ko_ctx *x = vctx;
    ps_text(cr, 20, 22, x->title, ps_fig_fit(cr, x->title, 17, x->fig_w - 40, 1), 0, 0.5, 0, 1);
    ps_text(cr, 20, 46, x->subtitle, ps_fig_fit(cr, x->subtitle, 12.5, x->fig_w - 40, 0), 0, 0.5, 0, 0);
    ps_text(cr, 20, 64, x->subtitle2, ps_fig_fit(cr, x->subtitle2, 12.5, x->fig_w - 40, 0), 0, 0.5, 0, 0);
    ps_rgb (*cmap)(double) = x->acc ? ps_diverging_rev : ps_diverging;
    for (int k = 0; k < x->n; k++) {
        grid *g = &x->g[k];
        ps_rect hr = x->heat[k];
        double px = hr.x, T = hr.y, w = hr.w, h = hr.h, ch = h / g->rows, cw = w / g->cols;
        double room = w + KO_BAR_GAP + KO_BAR_W + KO_BAR_ROOM; /* the panel's width right of its labels */
        double cx = px + (w + KO_BAR_GAP + KO_BAR_W) / 2;
        cairo_set_source_rgb(cr, 0, 0, 0);
        ps_text(cr, cx, T - 34, g->name, ps_fig_fit(cr, g->name, 13, room + 60, 1), 0.5, 0.5, 0, 1);
        ps_text(cr, cx, T - 16, g->target, ps_fig_fit(cr, g->target, 12, room + 60, 0), 0.5, 0.5, 0, 0);
        ps_heatmap(cr, px, T, w, h, g->v, g->rows, g->cols, cmap, -g->vmax, g->vmax);
        /* layer groups: separators and labels; head labels when they fit */
        cairo_set_source_rgb(cr, 0, 0, 0);
        int r0 = 0;
        for (int r = 1; r <= g->rows; r++)
            if (r == g->rows || g->layer[r] != g->layer[r0]) {
                double yc = T + (r0 + r) / 2.0 * ch;
                char buf[32];
                snprintf(buf, sizeof buf, "layer %d", g->layer[r0]);
                if ((r - r0) * ch >= 9 || r0 == 0 || g->rows <= 64)
                    ps_text(cr, px - (ch >= 10 ? 34 : 6), yc, buf, ch >= 10 ? 12 : 10, 1, 0.5, 0, 1);
                if (r < g->rows) {
                    cairo_set_line_width(cr, 2);
                    ps_fig_line(cr, px - 4, round(T + r * ch), px + w, round(T + r * ch));
                }
                r0 = r;
            }
        if (ch >= 10 && !g->per_layer)
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
        ps_text(cr, px + w / 2, T + h + 28, "phase residue ρ", 13, 0.5, 0, 0, 0);
        ps_colorbar(cr, px + w + KO_BAR_GAP, T, KO_BAR_W, h, cmap, -g->vmax, g->vmax,
                    x->acc ? "Δ accuracy (pp)" : "Δ mean target NLL (nats)");
    }
    if (x->cmp) draw_scatter(cr, x);
}

static const char *target_text(const char *t) {
    if (!t) return "knocked out: (target not recorded)";
    if (!strcmp(t, "raw")) return "knocked out: raw keys and values (hook_k, hook_v)";
    if (!strcmp(t, "compressed")) return "knocked out: compressed keys and values (hook_ck, hook_cv)";
    if (!strcmp(t, "both")) return "knocked out: raw and compressed keys and values";
    if (!strcmp(t, "heads")) return "knocked out: query heads (layers.L.attn.q, one head per cell)";
    if (!strcmp(t, "indexer")) return "knocked out: the indexer's selection, replaced by the mean-pattern top-k";
    if (!strcmp(t, "sink")) return "knocked out: every head's sink mass (layers.L.attn.sink)";
    return NULL;
}

static void free_grids(ko_ctx *x) {
    if (x->g)
        for (int k = 0; k < x->n; k++) {
            free(x->g[k].layer);
            free(x->g[k].head);
            free(x->g[k].v);
        }
    free(x->g);
    free(x->heat);
}

int ps_render_knockout(json_t *const *docs, const char *const *paths, int n, const char *out, const ps_render_opts *o,
                       int verbose, ps_error *err) {
    if (n > MAX_KO_PANELS) return ps_fail(err, "%s: %d knockout grids side by side; a figure shows at most %d", paths[0], n, MAX_KO_PANELS);
    ko_ctx x = {0};
    x.n = n;
    x.acc = o && o->measure && !strcmp(o->measure, "acc");
    x.g = calloc((size_t)n, sizeof *x.g);
    x.heat = calloc((size_t)n, sizeof *x.heat);
    int *rows = calloc((size_t)n, sizeof(int)), *cols = calloc((size_t)n, sizeof(int));
    int rc = 0, n_est = 0, n_patch = 0, mixed_units = 0;
    const char *unit0 = NULL;
    if (!x.g || !x.heat || !rows || !cols) rc = ps_fail(err, "%s: out of memory", paths[0]);
    for (int k = 0; k < n && !rc; k++) {
        json_t *grid_j = json_object_get(docs[k], "grid"), *cells = json_object_get(grid_j, "cells");
        grid *g = &x.g[k];
        ps_fig_model_name(g->name, sizeof g->name, json_object_get(docs[k], "provenance"));
        const char *tg = json_string_value(json_object_get(grid_j, "target")), *tt = target_text(tg);
        const char *unit = json_string_value(json_object_get(grid_j, "unit")); /* what a cell is (NULL: a KV head) */
        g->per_layer = unit && !strcmp(unit, "layer");
        if (k == 0) unit0 = unit;
        else if (!unit0 != !unit || (unit && strcmp(unit, unit0))) mixed_units = 1;
        ps_model_desc md;
        ps_error de;
        const char *what = NULL; /* the family's words for the raw and compressed entries (K = V, pooled keys only) */
        if (tg && !ps_model_desc_from_provenance(json_object_get(docs[k], "provenance"), &md, &de))
            what = !strcmp(tg, "raw") ? md.raw_what : !strcmp(tg, "compressed") ? md.comp_what : NULL;
        if (what) snprintf(g->target, sizeof g->target, "knocked out: %s", what);
        else if (tt) snprintf(g->target, sizeof g->target, "%s", tt);
        else snprintf(g->target, sizeof g->target, "knocked out: %s", tg);
        const char *mth = json_string_value(json_object_get(grid_j, "method"));
        if (mth && !strcmp(mth, "patch")) { /* activation patching: the same grid, the corrupt run's entries in place */
            n_patch++;
            const char *w = strchr(g->target, ':');
            char t[256];
            snprintf(t, sizeof t, "patched from the corrupt run%s", w ? w : "");
            snprintf(g->target, sizeof g->target, "%s", t);
        } else if (mth && !strcmp(mth, "atp")) { /* an attribution estimate: NLL changes only */
            if (x.acc) {
                rc = ps_fail(err, "%s: --measure acc: an attribution-patching estimate has no accuracy (its cells' NLL changes are drawn by default)", paths[k]);
                break;
            }
            n_est++;
            size_t ln = strlen(g->name);
            snprintf(g->name + ln, sizeof g->name - ln, " — AtP estimate (fix %s)",
                     json_string_value(json_object_get(json_object_get(grid_j, "atp"), "fix")) ? json_string_value(json_object_get(json_object_get(grid_j, "atp"), "fix")) : "?");
        } else if (mth) {
            size_t ln = strlen(g->name);
            snprintf(g->name + ln, sizeof g->name - ln, " — exact");
        }
        size_t nrows = json_array_size(cells);
        json_int_t period = json_integer_value(json_object_get(grid_j, "period"));
        if (nrows < 1 || nrows > MAX_KO_ROWS) {
            rc = ps_fail(err, "%s: grid.cells has %zu rows; a figure shows 1 to %d", paths[k], nrows, MAX_KO_ROWS);
            break;
        }
        if (period < 1 || period > MAX_KO_PERIOD) {
            rc = ps_fail(err, "%s: grid.period = %lld; a figure shows 1 to %d residues", paths[k], (long long)period, MAX_KO_PERIOD);
            break;
        }
        g->rows = rows[k] = (int)nrows;
        g->cols = cols[k] = (int)period;
        g->layer = calloc((size_t)g->rows, sizeof(int));
        g->head = calloc((size_t)g->rows, sizeof(int));
        g->v = calloc((size_t)g->rows * (size_t)g->cols, sizeof(double));
        if (!g->layer || !g->head || !g->v) {
            rc = ps_fail(err, "%s: out of memory", paths[k]);
            break;
        }
        for (int r = 0; r < g->rows; r++) {
            json_t *cell = json_array_get(cells, (size_t)r), *res = json_object_get(cell, "residues");
            g->layer[r] = (int)json_integer_value(json_object_get(cell, "layer"));
            g->head[r] = (int)json_integer_value(json_object_get(cell, "head"));
            for (int c = 0; c < g->cols; c++) {
                json_t *e = json_array_get(res, (size_t)c);
                double v = json_integer_value(json_object_get(e, "n")) > 0 ? ps_fig_num(e, x.acc ? "delta_accuracy_pp" : "delta_nll") : NAN;
                if (!isfinite(v)) v = NAN;
                g->v[(size_t)r * (size_t)g->cols + (size_t)c] = v;
                if (!isnan(v)) g->vmax = fmax(g->vmax, fabs(v));
            }
        }
        if (!(g->vmax > 0)) g->vmax = 1; /* all zero: a scale of ±1 shows them white */
    }
    double W = 0, H = 0;
    if (!rc) rc = ps_knockout_layout(n, rows, cols, x.heat, &W, &H, err);
    if (!rc) {
        x.fig_w = W;
        /* what a cell is: a KV head (the result names no unit), or the unit it names ("query head", "layer") */
        const char *kind = mixed_units ? "Knockout" : !unit0 ? "KV-head knockout" : !strcmp(unit0, "query head") ? "Query-head knockout" : "Knockout";
        char rows_what[96], cell_what[96];
        if (mixed_units) snprintf(rows_what, sizeof rows_what, "per cell"), snprintf(cell_what, sizeof cell_what, "each cell's entries");
        else if (!unit0) snprintf(rows_what, sizeof rows_what, "per layer × KV head"), snprintf(cell_what, sizeof cell_what, "each KV head's entries");
        else if (!strcmp(unit0, "layer")) snprintf(rows_what, sizeof rows_what, "per layer"), snprintf(cell_what, sizeof cell_what, "each layer's knocked-out values");
        else snprintf(rows_what, sizeof rows_what, "per layer × %s", unit0), snprintf(cell_what, sizeof cell_what, "each %s's values", unit0);
        snprintf(x.title, sizeof x.title, "%s (mean replacement): %s in %s %s and phase residue", kind,
                 n_est == n ? "estimated change (attribution patching)" : n_est ? "exact and estimated change" : "change",
                 x.acc ? "accuracy" : "mean target NLL", rows_what);
        /* over what the mean is taken: the task's prompts of one shift, or a caller's whole prompt set */
        int64_t n_set = 0;
        for (int k = 0; k < n && !n_set; k++)
            n_set = json_integer_value(json_object_get(
                json_object_get(json_object_get(json_object_get(docs[k], "provenance"), "eval"), "prompts"), "n"));
        char over[96];
        if (n_set) snprintf(over, sizeof over, "the %lld prompts of the prompt set", (long long)n_set);
        else snprintf(over, sizeof over, "the prompts of the same shift");
        snprintf(x.subtitle, sizeof x.subtitle,
                 "%s (named over each panel) replaced by their mean over %s; "
                 "%s",
                 cell_what, over,
                 x.acc ? "change = knocked out − clean accuracy, in percentage points"
                 : n_est ? "change = knocked out − clean NLL, in nats (AtP panels: to first order)"
                         : "change = knocked out − clean NLL, in nats");
        snprintf(x.subtitle2, sizeof x.subtitle2, "orange = knockout hurts (%s), blue = knockout helps, white = no change, grey = no prompts%s",
                 x.acc ? "accuracy falls" : "NLL rises", n > 1 ? "; each panel has its own colour scale" : "");
        if (n_patch == n) { /* activation patching's words: what replaces a cell is the corrupt run's activation */
            snprintf(x.title, sizeof x.title, "Activation patching (corrupt into clean): change in %s %s and phase residue",
                     x.acc ? "accuracy" : "mean target NLL", rows_what);
            snprintf(x.subtitle, sizeof x.subtitle,
                     "%s (named over each panel) replaced by the corrupt run's at the same positions, in the clean run; %s", cell_what,
                     x.acc ? "change = patched − clean accuracy, in percentage points" : "change = patched − clean NLL, in nats");
            snprintf(x.subtitle2, sizeof x.subtitle2,
                     "orange = the corrupt activation hurts (%s: the cell carries what the corruption changes), blue = it helps, "
                     "white = no change, grey = no prompts%s",
                     x.acc ? "accuracy falls" : "NLL rises", n > 1 ? "; each panel has its own colour scale" : "");
        }
        ps_fig_chunks ch;
        ps_fig_make_chunks(&ch, json_object_get(docs[0], "provenance"), x.title);
        ps_fig f;
        for (int k = 0; !rc && k < ps_fig_n_files(o); k++)
            if (!(rc = ps_fig_file_open(&f, out,
                                        n_patch == n ? (x.acc ? "patch_heatmap_acc" : "patch_heatmap")
                                                     : (x.acc ? "knockout_heatmap_acc" : "knockout_heatmap"),
                                        W, H, o, k, err))) {
                draw_knockout(f.cr, &x);
                rc = ps_fig_file_close(&f, &ch, verbose, err);
            }
    }
    free_grids(&x);
    free(rows);
    free(cols);
    return rc;
}

/* ---- result kind "atp_compare": an attribution estimate against the exact grid ---- */

static int ck_corr(ps_ck *c, json_t *o, const char *k) {
    json_t *v;
    size_t old = c->len;
    if (ps_ck_field(c, o, k, &v)) return -1;
    if (!json_is_null(v) && ps_ck_num_value(c, v, -1 - 1e-9, 1 + 1e-9, NULL)) return -1;
    ps_ck_pop(c, old);
    return 0;
}

int ps_check_atp_compare(ps_ck *c, json_t *doc) {
    static const char *const FIX[] = {"none", "qk", NULL};
    ps_prov_info pi;
    json_t *g, *gl, *ex, *es, *st, *fn, *tmp;
    int64_t nc, P, ns, nf, topk;
    double recall;
    if (ps_ck_provenance(c, doc, 1, NULL, &pi) || ps_ck_get_str(c, doc, "target", NULL) || ps_ck_get_enum(c, doc, "fix", FIX, NULL) ||
        ps_ck_get_int(c, doc, "n_pairs", 0, INT64_MAX, NULL) || ck_corr(c, doc, "pearson") || ck_corr(c, doc, "spearman") ||
        ck_corr(c, doc, "cell_pearson") || ck_corr(c, doc, "cell_spearman") || ps_ck_get_num(c, doc, "recall", 0, 1, &recall) ||
        ps_ck_get_int(c, doc, "top_k", 1, INT64_MAX, &topk) || ps_ck_get_arr(c, doc, "strong", 0, INT64_MAX, &st, &ns) ||
        ps_ck_get_arr(c, doc, "false_negatives", 0, ns, &fn, &nf) || ps_ck_get_obj(c, doc, "grid", &g))
        return -1;
    if (ns && !ps_ck_close_to(recall, (double)(ns - nf) / (double)ns, 1)) {
        ps_ck_key(c, "recall");
        return ps_ck_bad(c, "%.10g, but %lld of the %lld strong cells are false negatives", recall, (long long)nf, (long long)ns);
    }
    if (ns && topk != 2 * ns) {
        ps_ck_key(c, "top_k");
        return ps_ck_bad(c, "%lld, but twice the %lld strong cells is %lld", (long long)topk, (long long)ns, (long long)(2 * ns));
    }
    size_t old = ps_ck_key(c, "grid");
    if (ps_ck_get_int(c, g, "period", 1, MAX_KO_PERIOD, &P) || ps_ck_get_arr(c, g, "layers", 1, MAX_KO_ROWS, &gl, &nc) ||
        ps_ck_get_arr(c, g, "heads", nc, nc, &tmp, NULL) || ps_ck_get_arr(c, g, "exact", nc, nc, &ex, NULL) ||
        ps_ck_get_arr(c, g, "estimate", nc, nc, &es, NULL) || ps_ck_get_arr(c, g, "exact_acc", nc, nc, &tmp, NULL))
        return -1;
    for (int w = 0; w < 2; w++) {
        json_t *m = w ? es : ex;
        size_t o2 = ps_ck_key(c, w ? "estimate" : "exact");
        for (int64_t i = 0; i < nc; i++) {
            json_t *row = json_array_get(m, (size_t)i);
            size_t o3 = ps_ck_idx(c, (size_t)i);
            if (ps_ck_want_type(c, row, json_is_array(row) && (int64_t)json_array_size(row) == P, "an array of one value per residue"))
                return -1;
            for (int64_t r = 0; r < P; r++) {
                json_t *v = json_array_get(row, (size_t)r);
                size_t o4 = ps_ck_idx(c, (size_t)r);
                if (!json_is_null(v) && ps_ck_num_value(c, v, -INFINITY, INFINITY, NULL)) return -1;
                ps_ck_pop(c, o4);
            }
            ps_ck_pop(c, o3);
        }
        ps_ck_pop(c, o2);
    }
    ps_ck_pop(c, old);
    return 0;
}

/* A grid panel of the comparison: rows = cells, columns = residues, values = a matrix of the doc. */
static int cmp_grid(grid *g, json_t *gj, const char *key, const char *name, const char *target) {
    json_t *m = json_object_get(gj, key), *gl = json_object_get(gj, "layers"), *gh = json_object_get(gj, "heads");
    g->rows = (int)json_array_size(m);
    g->cols = (int)json_integer_value(json_object_get(gj, "period"));
    g->layer = calloc((size_t)g->rows, sizeof(int));
    g->head = calloc((size_t)g->rows, sizeof(int));
    g->v = calloc((size_t)g->rows * (size_t)g->cols, sizeof(double));
    if (!g->layer || !g->head || !g->v) return -1;
    snprintf(g->name, sizeof g->name, "%s", name);
    snprintf(g->target, sizeof g->target, "%s", target);
    for (int r = 0; r < g->rows; r++) {
        g->layer[r] = (int)json_integer_value(json_array_get(gl, (size_t)r));
        g->head[r] = (int)json_integer_value(json_array_get(gh, (size_t)r));
        for (int c = 0; c < g->cols; c++) {
            json_t *v = json_array_get(json_array_get(m, (size_t)r), (size_t)c);
            double d = json_is_number(v) ? json_number_value(v) : NAN;
            g->v[(size_t)r * (size_t)g->cols + (size_t)c] = d;
            if (!isnan(d)) g->vmax = fmax(g->vmax, fabs(d));
        }
    }
    if (!(g->vmax > 0)) g->vmax = 1;
    return 0;
}

/* The scatter of estimated against exact Δ NLL, one point per cell × residue; the strong cells' points
 * (worst residue ≤ −30 pp exactly) in vermillion. */
static void draw_scatter(cairo_t *cr, const ko_ctx *x) {
    json_t *gj = json_object_get(x->cmp, "grid"), *ex = json_object_get(gj, "exact"), *es = json_object_get(gj, "estimate"),
           *acc = json_object_get(gj, "exact_acc");
    ps_rect r = x->scatter;
    double lo = 0, hi = 0;
    size_t nc = json_array_size(ex);
    for (size_t i = 0; i < nc; i++)
        for (size_t c = 0; c < json_array_size(json_array_get(ex, i)); c++) {
            json_t *a = json_array_get(json_array_get(ex, i), c), *b = json_array_get(json_array_get(es, i), c);
            if (!json_is_number(a) || !json_is_number(b)) continue;
            lo = fmin(lo, fmin(json_number_value(a), json_number_value(b)));
            hi = fmax(hi, fmax(json_number_value(a), json_number_value(b)));
        }
    if (!(hi > lo)) hi = lo + 1;
    double pad = 0.05 * (hi - lo);
    lo -= pad, hi += pad;
#define SX(v) (r.x + ((v) - lo) / (hi - lo) * r.w)
#define SY(v) (r.y + r.h - ((v) - lo) / (hi - lo) * r.h)
    cairo_set_source_rgb(cr, 0, 0, 0);
    ps_text(cr, r.x + r.w / 2, r.y - 34, "estimate against exact, per cell × residue", 13, 0.5, 0.5, 0, 1);
    char line[256];
    snprintf(line, sizeof line, "Pearson %.3f, Spearman %.3f; recall %.2f of %zu strong cells in the top %lld",
             ps_fig_num(x->cmp, "pearson"), ps_fig_num(x->cmp, "spearman"), ps_fig_num(x->cmp, "recall"),
             json_array_size(json_object_get(x->cmp, "strong")), (long long)json_integer_value(json_object_get(x->cmp, "top_k")));
    ps_text(cr, r.x + r.w / 2, r.y - 16, line, ps_fig_fit(cr, line, 12, r.w + 80, 0), 0.5, 0.5, 0, 0);
    cairo_set_line_width(cr, 1);
    cairo_rectangle(cr, r.x, r.y, r.w, r.h);
    cairo_stroke(cr);
    double ticks[16];
    int nt = ps_nice_ticks(lo, hi, 6, ticks, 16);
    for (int i = 0; i < nt; i++) {
        char buf[32];
        ps_fmt_num(buf, sizeof buf, ticks[i]);
        cairo_set_source_rgb(cr, 0.9, 0.9, 0.9);
        ps_fig_line(cr, SX(ticks[i]), r.y, SX(ticks[i]), r.y + r.h);
        ps_fig_line(cr, r.x, SY(ticks[i]), r.x + r.w, SY(ticks[i]));
        cairo_set_source_rgb(cr, 0, 0, 0);
        ps_text(cr, SX(ticks[i]), r.y + r.h + 6, buf, 11, 0.5, 0, 0, 0);
        ps_text(cr, r.x - 6, SY(ticks[i]), buf, 11, 1, 0.5, 0, 0);
    }
    /* y = x */
    cairo_set_source_rgb(cr, 0.4, 0.4, 0.4);
    double dash[2] = {5, 4};
    cairo_set_dash(cr, dash, 2, 0);
    ps_fig_line(cr, SX(lo), SY(lo), SX(hi), SY(hi));
    cairo_set_dash(cr, NULL, 0, 0);
    for (int pass = 0; pass < 2; pass++) /* the strong cells on top */
        for (size_t i = 0; i < nc; i++) {
            int strong = json_number_value(json_array_get(acc, i)) <= -30.0;
            if (strong != pass) continue;
            ps_set_rgb(cr, ps_okabe_ito(strong ? 3 : 0));
            for (size_t c = 0; c < json_array_size(json_array_get(ex, i)); c++) {
                json_t *a = json_array_get(json_array_get(ex, i), c), *b = json_array_get(json_array_get(es, i), c);
                if (!json_is_number(a) || !json_is_number(b)) continue;
                cairo_arc(cr, SX(json_number_value(a)), SY(json_number_value(b)), strong ? 3.2 : 2.4, 0, 2 * M_PI);
                cairo_fill(cr);
            }
        }
    cairo_set_source_rgb(cr, 0, 0, 0);
    ps_text(cr, r.x + r.w / 2, r.y + r.h + 28, "exact Δ mean target NLL (nats)", 13, 0.5, 0, 0, 0);
    ps_text(cr, r.x - 44, r.y + r.h / 2, "estimated Δ mean target NLL (nats)", 13, 0.5, 1, -M_PI / 2, 0);
    ps_set_rgb(cr, ps_okabe_ito(3));
    cairo_arc(cr, r.x + 12, r.y + 14, 3.2, 0, 2 * M_PI);
    cairo_fill(cr);
    cairo_set_source_rgb(cr, 0, 0, 0);
    ps_text(cr, r.x + 20, r.y + 14, "strong cell (exact worst residue ≤ −30 pp)", 11, 0, 0.5, 0, 0);
    ps_set_rgb(cr, ps_okabe_ito(0));
    cairo_arc(cr, r.x + 12, r.y + 30, 2.4, 0, 2 * M_PI);
    cairo_fill(cr);
    cairo_set_source_rgb(cr, 0, 0, 0);
    ps_text(cr, r.x + 20, r.y + 30, "other cells; dashed: estimate = exact", 11, 0, 0.5, 0, 0);
#undef SX
#undef SY
}

int ps_render_atp_compare(json_t *const *docs, const char *const *paths, int n, const char *out, const ps_render_opts *o,
                          int verbose, ps_error *err) {
    (void)n;
    json_t *doc = docs[0], *gj = json_object_get(doc, "grid");
    ko_ctx x = {0};
    grid g[2] = {0};
    ps_rect heat[2];
    int rows[2], cols[2], rc = 0;
    char name[512], est[600];
    ps_fig_model_name(name, sizeof name, json_object_get(doc, "provenance"));
    snprintf(est, sizeof est, "AtP estimate (fix %s)", json_string_value(json_object_get(doc, "fix")));
    if (cmp_grid(&g[0], gj, "exact", "exact knockout", name) || cmp_grid(&g[1], gj, "estimate", est, name)) rc = ps_fail(err, "%s: out of memory", paths[0]);
    x.n = 2, x.g = g, x.heat = heat, x.cmp = doc;
    rows[0] = rows[1] = g[0].rows, cols[0] = cols[1] = g[0].cols;
    double W = 0, H = 0;
    if (!rc) rc = ps_knockout_layout(2, rows, cols, heat, &W, &H, err);
    if (!rc) {
        double side = fmin(fmax(300, heat[0].h), 560), x0 = heat[1].x + heat[1].w + KO_BAR_GAP + KO_BAR_W + KO_BAR_ROOM + 90;
        x.scatter = (ps_rect){x0, KO_TOP, side, side};
        W = fmax(W, x0 + side + 30);
        H = fmax(H, KO_TOP + side + 70);
        x.fig_w = W;
        snprintf(x.title, sizeof x.title, "Attribution patching against the exact KV-head knockout: change in mean target NLL, per layer × KV head and residue");
        snprintf(x.subtitle, sizeof x.subtitle, "%s; target %s; the same prompts, shifts and means; each heatmap on its own colour scale",
                 name, json_string_value(json_object_get(doc, "target")));
        snprintf(x.subtitle2, sizeof x.subtitle2, "orange = knockout hurts (NLL rises), blue = it helps, white = no change, grey = no prompts");
        ps_fig_chunks ch;
        ps_fig_make_chunks(&ch, json_object_get(doc, "provenance"), x.title);
        ps_fig f;
        for (int k = 0; !rc && k < ps_fig_n_files(o); k++)
            if (!(rc = ps_fig_file_open(&f, out, "atp_compare", W, H, o, k, err))) {
                draw_knockout(f.cr, &x);
                rc = ps_fig_file_close(&f, &ch, verbose, err);
            }
    }
    for (int k = 0; k < 2; k++) free(g[k].layer), free(g[k].head), free(g[k].v);
    return rc;
}
