/* kind_gates.c — result kind "gates": gate concentration per (layer, head) (N_static, N_input, the gate
 * over the offsets of a window), the per-channel gates of DeepSeek-V4's compressor, and the gates' evolution
 * over training (gates.json "training"). Their validation and their figures: gate_concentration.png, gate_training.png. */
#include "viz/kinds.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gates/gates.h" /* the gate labels, ps_effective_offsets: viz -> gates -> core, no cycle (docs/design.md, "Layers") */
#include "viz/check_common.h"
#include "viz/fig_common.h"

/* ---- validation ---- */

/* gates.json "training": one entry per (layer, head, branch) of the model (each exactly once), each with the
 * same increasing steps and per step N_static, N_input in [1, W] and a peak offset (what gate_training.png
 * and the concentration summary read). */
#define MAX_GATE_RECORDS 100000
static int check_gates_training(ps_ck *c, json_t *v, int64_t W, int64_t L, int64_t H) {
    static const char *const BR[] = {"key", "value", NULL};
    size_t old = ps_ck_key(c, "training");
    if (ps_ck_want_type(c, v, json_is_array(v), "an array")) return -1;
    int64_t ne = (int64_t)json_array_size(v), S = -1;
    if (ne != 2 * L * H) return ps_ck_bad(c, "%lld entries, expected %lld (every layer, KV head and branch once)", (long long)ne, (long long)(2 * L * H));
    unsigned char *seen = calloc((size_t)ne, 1);
    json_t *steps0 = NULL;
    int rc = -1;
    if (!seen) return ps_ck_bad(c, "out of memory");
    for (int64_t e = 0; e < ne; e++) {
        json_t *en = json_array_get(v, (size_t)e), *st, *ns, *ni, *pk, *cs;
        size_t o1 = ps_ck_idx(c, (size_t)e);
        int64_t l, h, n;
        const char *br;
        if (ps_ck_want_type(c, en, json_is_object(en), "an object") || ps_ck_get_int(c, en, "layer", 0, L - 1, &l) ||
            ps_ck_get_int(c, en, "head", 0, H - 1, &h) || ps_ck_get_enum(c, en, "branch", BR, &br))
            goto done;
        size_t slot = (size_t)((l * H + h) * 2 + !strcmp(br, "value"));
        if (seen[slot]) {
            ps_ck_bad(c, "layer %lld head %lld %s appears twice", (long long)l, (long long)h, br);
            goto done;
        }
        seen[slot] = 1;
        if (ps_ck_get_arr(c, en, "steps", S < 0 ? 1 : S, S < 0 ? MAX_GATE_RECORDS : S, &st, &n)) goto done;
        S = n;
        if (ps_ck_get_arr(c, en, "N_static", S, S, &ns, NULL) || ps_ck_get_arr(c, en, "N_input", S, S, &ni, NULL) ||
            ps_ck_get_arr(c, en, "peak", S, S, &pk, NULL))
            goto done;
        double tol = 1e-3 * (double)W;
        for (int64_t t = 0; t < S; t++) {
            int64_t sv, pv;
            size_t o2 = ps_ck_key(c, "steps");
            ps_ck_idx(c, (size_t)t);
            if (ps_ck_int_value(c, json_array_get(st, (size_t)t), 0, INT64_MAX, &sv)) goto done;
            if (t > 0 && sv <= json_integer_value(json_array_get(st, (size_t)t - 1))) {
                ps_ck_bad(c, "%lld does not increase on the step before", (long long)sv);
                goto done;
            }
            if (steps0 && sv != json_integer_value(json_array_get(steps0, (size_t)t))) {
                ps_ck_bad(c, "%lld, but entry 0 has step %lld here (every entry has the same steps)", (long long)sv,
                    (long long)json_integer_value(json_array_get(steps0, (size_t)t)));
                goto done;
            }
            ps_ck_pop(c, o2);
            ps_ck_key(c, "N_static");
            ps_ck_idx(c, (size_t)t);
            if (ps_ck_num_value(c, json_array_get(ns, (size_t)t), 1 - tol, (double)W + tol, NULL)) goto done;
            ps_ck_pop(c, o2);
            ps_ck_key(c, "N_input");
            ps_ck_idx(c, (size_t)t);
            if (ps_ck_num_value(c, json_array_get(ni, (size_t)t), 1 - tol, (double)W + tol, NULL)) goto done;
            ps_ck_pop(c, o2);
            ps_ck_key(c, "peak");
            ps_ck_idx(c, (size_t)t);
            if (ps_ck_int_value(c, json_array_get(pk, (size_t)t), 0, W - 1, &pv)) goto done;
            ps_ck_pop(c, o2);
        }
        if (!steps0) steps0 = st;
        cs = json_object_get(en, "concentrated_at_step");
        if (cs && !json_is_null(cs)) {
            size_t o2 = ps_ck_key(c, "concentrated_at_step");
            if (ps_ck_int_value(c, cs, 0, INT64_MAX, NULL)) goto done;
            ps_ck_pop(c, o2);
        }
        if (ps_ck_get_int(c, en, "final_peak", 0, W - 1, NULL)) goto done;
        ps_ck_pop(c, o1);
    }
    ps_ck_pop(c, old);
    rc = 0;
done:
    free(seen);
    return rc;
}

/* one gate distribution over S slots: weights in [0, 1] adding up to 1 */
static int check_dist(ps_ck *c, json_t *o, const char *k, int64_t S) {
    json_t *mg;
    if (ps_ck_get_arr(c, o, k, S, S, &mg, NULL)) return -1;
    size_t o1 = ps_ck_key(c, k);
    double sum = 0, x = 0;
    for (int64_t i = 0; i < S; i++) {
        size_t o2 = ps_ck_idx(c, (size_t)i);
        if (ps_ck_num_value(c, json_array_get(mg, (size_t)i), -TOL, 1 + TOL, &x)) return -1;
        sum += x;
        ps_ck_pop(c, o2);
    }
    if (fabs(sum - 1) > 1e-3) return ps_ck_bad(c, "the weights add up to %.10g, not 1", sum);
    ps_ck_pop(c, o1);
    return 0;
}

/* gates.gate "per_channel" (DeepSeek-V4's compressor; gates/chgates.h) */
static int check_chgates(ps_ck *c, json_t *g) {
    static const char *const ATT[] = {"csa", "hca", NULL}, *const BR[] = {"compressor", "indexer", NULL};
    const char *const *LABEL = ps_gate_labels;
    json_t *layers;
    int64_t L, prev = -1;
    if (ps_ck_get_arr(c, g, "layers", 1, MAX_INDEX, &layers, &L)) return -1;
    size_t o1 = ps_ck_key(c, "layers");
    for (int64_t l = 0; l < L; l++) {
        json_t *lo = json_array_get(layers, (size_t)l), *brs;
        size_t o2 = ps_ck_idx(c, (size_t)l);
        int64_t li, S, nb;
        if (ps_ck_want_type(c, lo, json_is_object(lo), "an object") || ps_ck_get_int(c, lo, "layer", 0, MAX_INDEX, &li)) return -1;
        if (li <= prev) {
            ps_ck_key(c, "layer");
            return ps_ck_bad(c, "%lld, expected more than %lld (layers in increasing order, each once)", (long long)li, (long long)prev);
        }
        prev = li;
        if (ps_ck_get_enum(c, lo, "attention", ATT, NULL) || ps_ck_get_int(c, lo, "rate", 1, MAX_WINDOW, NULL) ||
            ps_ck_get_int(c, lo, "slots", 1, 2 * MAX_WINDOW, &S) || ps_ck_get_arr(c, lo, "branches", 1, 2, &brs, &nb))
            return -1;
        size_t o3 = ps_ck_key(c, "branches");
        for (int64_t b = 0; b < nb; b++) {
            json_t *bo = json_array_get(brs, (size_t)b), *po, *per, *arr;
            size_t o4 = ps_ck_idx(c, (size_t)b);
            int64_t d;
            double tol = 1e-3 * (double)S;
            if (ps_ck_want_type(c, bo, json_is_object(bo), "an object") || ps_ck_get_enum(c, bo, "branch", BR, NULL) ||
                ps_ck_get_int(c, bo, "channels", 1, MAX_INDEX, &d) || ps_ck_get_int(c, bo, "n_windows", 0, MAX_COUNT, NULL) ||
                ps_ck_get_obj(c, bo, "pooled", &po))
                return -1;
            size_t o5 = ps_ck_key(c, "pooled");
            if (check_dist(c, po, "mean_gate", S) || ps_ck_get_num(c, po, "N_static", 1 - tol, (double)S + tol, NULL) ||
                ps_ck_get_num(c, po, "N_input", 1 - tol, (double)S + tol, NULL) || ps_ck_get_int(c, po, "peak", 0, S - 1, NULL) ||
                ps_ck_get_enum(c, po, "label", LABEL, NULL))
                return -1;
            ps_ck_pop(c, o5);
            if (ps_ck_get_obj(c, bo, "per_channel", &per)) return -1;
            size_t o6 = ps_ck_key(c, "per_channel");
            if (ps_ck_get_arr(c, per, "mean_gate", d, d, &arr, NULL)) return -1;
            size_t o7 = ps_ck_key(c, "mean_gate");
            for (int64_t i = 0; i < d; i++) {
                json_t *wrap = json_object();
                json_object_set(wrap, "x", json_array_get(arr, (size_t)i));
                size_t o8 = ps_ck_idx(c, (size_t)i);
                int r = check_dist(c, wrap, "x", S);
                json_decref(wrap);
                if (r) return -1;
                ps_ck_pop(c, o8);
            }
            ps_ck_pop(c, o7);
            const char *nk[2] = {"N_static", "N_input"};
            for (int k = 0; k < 2; k++) {
                if (ps_ck_get_arr(c, per, nk[k], d, d, &arr, NULL)) return -1;
                size_t o9 = ps_ck_key(c, nk[k]);
                for (int64_t i = 0; i < d; i++) {
                    size_t o10 = ps_ck_idx(c, (size_t)i);
                    if (ps_ck_num_value(c, json_array_get(arr, (size_t)i), 1 - tol, (double)S + tol, NULL)) return -1;
                    ps_ck_pop(c, o10);
                }
                ps_ck_pop(c, o9);
            }
            if (ps_ck_get_arr(c, per, "peak", d, d, &arr, NULL)) return -1;
            size_t o11 = ps_ck_key(c, "peak");
            for (int64_t i = 0; i < d; i++) {
                size_t o12 = ps_ck_idx(c, (size_t)i);
                if (ps_ck_int_value(c, json_array_get(arr, (size_t)i), 0, S - 1, NULL)) return -1;
                ps_ck_pop(c, o12);
            }
            ps_ck_pop(c, o11);
            ps_ck_pop(c, o6);
            ps_ck_pop(c, o4);
        }
        ps_ck_pop(c, o3);
        ps_ck_pop(c, o2);
    }
    ps_ck_pop(c, o1);
    return 0;
}

int ps_check_gates(ps_ck *c, json_t *doc) {
    static const char *const GATE[] = {"learned", "uniform", NULL};
    const char *const *LABEL = ps_gate_labels;
    ps_prov_info pi;
    json_t *g, *layers, *v;
    int64_t W, L, H = -1;
    if (ps_ck_provenance(c, doc, 1, NULL, &pi)) return -1;
    if ((v = json_object_get(doc, "thresholds")) && !json_is_object(v)) {
        ps_ck_key(c, "thresholds");
        return ps_ck_bad(c, "expected an object, got %s", ps_ck_type_name(v));
    }
    if (ps_ck_get_obj(c, doc, "gates", &g)) return -1;
    size_t old = ps_ck_key(c, "gates");
    if ((v = json_object_get(g, "gate")) && json_is_string(v) && !strcmp(json_string_value(v), "per_channel")) {
        if (check_chgates(c, g)) return -1;
        ps_ck_pop(c, old);
        if ((v = json_object_get(doc, "training")) && !json_is_array(v)) {
            ps_ck_key(c, "training");
            return ps_ck_bad(c, "expected an array, got %s", ps_ck_type_name(v));
        }
        return 0;
    }
    if (ps_ck_get_int(c, g, "window", 1, MAX_WINDOW, &W) || ps_ck_get_int(c, g, "stride", 1, W, NULL) || ps_ck_get_enum(c, g, "gate", GATE, NULL) ||
        ps_ck_get_arr(c, g, "layers", 1, MAX_INDEX, &layers, &L))
        return -1;
    size_t o2 = ps_ck_key(c, "layers");
    for (int64_t l = 0; l < L; l++) {
        json_t *lo = json_array_get(layers, (size_t)l), *heads;
        size_t o3 = ps_ck_idx(c, (size_t)l);
        int64_t li, nh;
        if (ps_ck_want_type(c, lo, json_is_object(lo), "an object") || ps_ck_get_int(c, lo, "layer", 0, MAX_INDEX, &li)) return -1;
        if (li != l) {
            ps_ck_key(c, "layer");
            return ps_ck_bad(c, "%lld, expected %lld (layers 0..L-1 in order)", (long long)li, (long long)l);
        }
        if (ps_ck_get_arr(c, lo, "heads", H < 0 ? 1 : H, H < 0 ? MAX_INDEX : H, &heads, &nh)) return -1;
        H = nh;
        size_t o4 = ps_ck_key(c, "heads");
        for (int64_t h = 0; h < H; h++) {
            json_t *ho = json_array_get(heads, (size_t)h);
            size_t o5 = ps_ck_idx(c, (size_t)h);
            int64_t hi;
            if (ps_ck_want_type(c, ho, json_is_object(ho), "an object") || ps_ck_get_int(c, ho, "head", 0, MAX_INDEX, &hi)) return -1;
            if (hi != h) {
                ps_ck_key(c, "head");
                return ps_ck_bad(c, "%lld, expected %lld (KV heads 0..H-1 in order)", (long long)hi, (long long)h);
            }
            for (int b = 0; b < 2; b++) {
                json_t *bo, *mg;
                const char *bn = b ? "value" : "key";
                if (ps_ck_get_obj(c, ho, bn, &bo)) return -1;
                size_t o6 = ps_ck_key(c, bn);
                if (ps_ck_get_arr(c, bo, "mean_gate", W, W, &mg, NULL)) return -1;
                size_t o7 = ps_ck_key(c, "mean_gate");
                double sum = 0, x;
                for (int64_t i = 0; i < W; i++) {
                    size_t o8 = ps_ck_idx(c, (size_t)i);
                    if (ps_ck_num_value(c, json_array_get(mg, (size_t)i), -TOL, 1 + TOL, &x)) return -1;
                    sum += x;
                    ps_ck_pop(c, o8);
                }
                if (fabs(sum - 1) > 1e-3) return ps_ck_bad(c, "the weights add up to %.10g, not 1", sum);
                ps_ck_pop(c, o7);
                double tol = 1e-3 * (double)W;
                if (ps_ck_get_num(c, bo, "N_static", 1 - tol, (double)W + tol, NULL) || ps_ck_get_num(c, bo, "N_input", 1 - tol, (double)W + tol, NULL) ||
                    ps_ck_get_int(c, bo, "peak", 0, W - 1, NULL) || ps_ck_get_int(c, bo, "n_windows", 0, MAX_COUNT, NULL) ||
                    ps_ck_get_enum(c, bo, "label", LABEL, NULL))
                    return -1;
                ps_ck_pop(c, o6);
            }
            ps_ck_pop(c, o5);
        }
        ps_ck_pop(c, o4);
        ps_ck_pop(c, o3);
    }
    ps_ck_pop(c, o2);
    ps_ck_pop(c, old);
    if ((v = json_object_get(doc, "training"))) return check_gates_training(c, v, W, L, H);
    return 0;
}

/* ---- figure: gate concentration ---- */

typedef struct {
    int L, H, W;
    double *mg;      /* [L][H][2][W] */
    double *ns, *ni; /* [L][H][2] */
    int *peak;       /* [L][H][2] */
    char title[1024], subtitle[1024];
    double cw, ch, left, textw, gap, top, rowh, fig_w;
} gates_ctx;

#define GATES_STATS_FMT "N_s %.2f   N_i %.2f   r = %d"

static double gates_stats_font(double ch) { return fmin(13, ch - 1); }

static void draw_gates(cairo_t *cr, void *vctx) {
    gates_ctx *x = vctx;
    ps_text(cr, 20, 24, x->title, ps_fig_fit(cr, x->title, 18, x->fig_w - 40, 1), 0, 0.5, 0, 1);
    ps_text(cr, 20, 50, x->subtitle, ps_fig_fit(cr, x->subtitle, 13, x->fig_w - 40, 0), 0, 0.5, 0, 0);
    double T = x->top, left = x->left, bw = x->W * x->cw, hh = x->H * x->ch, block = bw + 10 + x->textw + x->gap;
    for (int b = 0; b < 2; b++)
        ps_text(cr, left + b * block + bw / 2, T - 18, b ? "value gate" : "key gate", 15, 0.5, 0.5, 0, 1);
    double fs = gates_stats_font(x->ch);
    for (int l = 0; l < x->L; l++) {
        double y = T + l * x->rowh;
        char buf[96];
        snprintf(buf, sizeof buf, "layer %d", l);
        cairo_set_source_rgb(cr, 0, 0, 0);
        ps_text(cr, 16, y + hh / 2, buf, 14, 0, 0.5, 0, 1);
        for (int b = 0; b < 2; b++) {
            double px = left + b * block;
            ps_heatmap_strided(cr, px, y, bw, hh, x->mg + ((size_t)l * (size_t)x->H * 2 + (size_t)b) * (size_t)x->W, x->H, x->W,
                               (ptrdiff_t)2 * x->W, 1, ps_viridis, 0, 1);
            cairo_set_source_rgb(cr, 0, 0, 0);
            for (int h = 0; h < x->H; h++) {
                size_t k = ((size_t)l * (size_t)x->H + (size_t)h) * 2 + (size_t)b;
                if (x->ch < 9) break;
                snprintf(buf, sizeof buf, "h%d", h);
                ps_text(cr, px - 5, y + (h + 0.5) * x->ch, buf, fs, 1, 0.5, 0, 0);
                snprintf(buf, sizeof buf, GATES_STATS_FMT, x->ns[k], x->ni[k], x->peak[k]);
                ps_text(cr, px + bw + 10, y + (h + 0.5) * x->ch, buf, fs, 0, 0.5, 0, 0);
            }
            int step = ps_tick_step(x->cw, ps_text_width(cr, "000", 12, 0) + 3);
            for (int i = 0; i < x->W; i += step) {
                snprintf(buf, sizeof buf, "%d", i);
                ps_text(cr, px + (i + 0.5) * x->cw, y + hh + 5, buf, 12, 0.5, 0, 0, 0);
            }
            ps_text(cr, px + bw / 2, y + hh + 24, "offset i in the window", 13, 0.5, 0, 0, 0);
        }
    }
    ps_colorbar(cr, left + 2 * block - x->gap + 24, T, 18, fmin(hh, 600), ps_viridis, 0, 1, "mean gate weight E[α_i]");
}

static void free_gates(gates_ctx *x) {
    free(x->mg);
    free(x->ns);
    free(x->ni);
    free(x->peak);
}

static int render_gate_training(json_t *doc, const char *path, const char *out, const ps_render_opts *o, int verbose,
                                ps_error *err);
static int render_gates(json_t *doc, const char *path, const char *out, const ps_render_opts *o, int verbose, ps_error *err) {
    json_t *gj = json_object_get(doc, "gates"), *layers = json_object_get(gj, "layers");
    size_t L = json_array_size(layers), H = json_array_size(json_object_get(json_array_get(layers, 0), "heads"));
    json_int_t W = json_integer_value(json_object_get(gj, "window"));
    if (L < 1 || L > MAX_LAYERS)
        return ps_fail(err, "%s: gates.layers has %zu entries; a figure shows 1 to %d layers", path, L, MAX_LAYERS);
    if (H < 1 || H > MAX_HEADS)
        return ps_fail(err, "%s: gates.layers[0].heads has %zu entries; a figure shows 1 to %d heads", path, H, MAX_HEADS);
    if (W < 1 || W > MAX_WINDOW)
        return ps_fail(err, "%s: gates.window = %lld; a figure shows 1 to %d offsets", path, (long long)W, MAX_WINDOW);
    if ((int64_t)L * (int64_t)H > MAX_GATE_ROWS)
        return ps_fail(err, "%s: gates.layers × heads = %zu × %zu rows; a figure shows at most %d", path, L, H, MAX_GATE_ROWS);
    gates_ctx x = {0};
    x.L = (int)L;
    x.H = (int)H;
    x.W = (int)W;
    size_t nb = L * H * 2; /* <= 2048, so nb * W <= 2^23 */
    x.mg = calloc(nb * (size_t)x.W, sizeof(double));
    x.ns = calloc(nb, sizeof(double));
    x.ni = calloc(nb, sizeof(double));
    x.peak = calloc(nb, sizeof(int));
    if (!x.mg || !x.ns || !x.ni || !x.peak) {
        free_gates(&x);
        return ps_fail(err, "%s: out of memory", path);
    }
    int64_t nwin = 0;
    for (int l = 0; l < x.L; l++)
        for (int h = 0; h < x.H; h++)
            for (int b = 0; b < 2; b++) {
                json_t *bo = json_object_get(json_array_get(json_object_get(json_array_get(layers, (size_t)l), "heads"), (size_t)h),
                                             b ? "value" : "key");
                size_t k = ((size_t)l * (size_t)x.H + (size_t)h) * 2 + (size_t)b;
                for (int i = 0; i < x.W; i++) x.mg[k * (size_t)x.W + (size_t)i] = json_number_value(json_array_get(json_object_get(bo, "mean_gate"), (size_t)i));
                x.ns[k] = ps_fig_num(bo, "N_static");
                x.ni[k] = ps_fig_num(bo, "N_input");
                x.peak[k] = (int)json_integer_value(json_object_get(bo, "peak"));
                nwin = json_integer_value(json_object_get(bo, "n_windows"));
            }
    char name[400];
    ps_fig_model_name(name, sizeof name, json_object_get(doc, "provenance"));
    snprintf(x.title, sizeof x.title, "Gate concentration — %s", name);
    snprintf(x.subtitle, sizeof x.subtitle,
             "mean gate weight per KV head and offset, pooled over %lld windows; N_s = exp(H(mean gate)), N_i = E[exp(H(α))], "
             "r = peak offset",
             (long long)nwin);
    /* fill the canvas: cells as big as a ~440 px square allows, stats text and the colour bar right beside */
    x.cw = x.W <= 33 ? fmax(12, fmin(56, 400.0 / x.W)) : fmax(1, 400.0 / x.W); /* wide windows: cells down to 1 px */
    x.ch = fmax(6, fmin(30, 460.0 / x.H));
    x.left = 16 + ps_fig_measure("layer 000", 14, 1) + 12 + (x.ch >= 9 ? ps_fig_measure("h000", gates_stats_font(x.ch), 0) + 8 : 0);
    char wide[96];
    snprintf(wide, sizeof wide, GATES_STATS_FMT, 8.88, 8.88, x.W > 100 ? 888 : 88);
    x.textw = x.ch >= 9 ? ps_fig_measure(wide, gates_stats_font(x.ch), 0) : 0;
    x.top = 104;
    x.rowh = x.H * x.ch + 62;
    x.gap = 40 + (x.ch >= 9 ? ps_fig_measure("h000", gates_stats_font(x.ch), 0) : 0);
    double block = x.W * x.cw + 10 + x.textw + x.gap;
    double W_px = x.left + 2 * block - x.gap + 24 + 18 + 14 + ps_fig_measure("0.8", 12, 0) + 30;
    x.fig_w = fmax(W_px, ps_fig_measure(x.subtitle, 13, 0) + 40);
    double H_px = x.top + x.L * x.rowh + 6;
    ps_fig_chunks ch;
    ps_fig_make_chunks(&ch, json_object_get(doc, "provenance"), x.title);
    int rc;
    if (x.fig_w > PS_FIG_MAX_SIDE || H_px > PS_FIG_MAX_SIDE)
        rc = ps_fail(err, "%s: %zu layers x %zu heads x window %lld need a %.0f x %.0f px figure (at most %.0f a side)", path, L,
                     H, (long long)W, x.fig_w, H_px, PS_FIG_MAX_SIDE);
    else {
        rc = 0;
        ps_fig f;
        for (int k = 0; !rc && k < ps_fig_n_files(o); k++)
            if (!(rc = ps_fig_file_open(&f, out, "gate_concentration", x.fig_w, H_px, o, k, err))) {
                draw_gates(f.cr, &x);
                rc = ps_fig_file_close(&f, &ch, verbose, err);
            }
    }
    free_gates(&x);
    if (!rc && json_array_size(json_object_get(doc, "training"))) rc = render_gate_training(doc, path, out, o, verbose, err);
    return rc;
}

/* ---- gate concentration over training (gates.json "training") ---- */

#define GT_TOP 112.0
#define GT_ROWH 26.0 /* a layer's row */
#define GT_MAX_STEPS 4096

typedef struct {
    int L, S, W;
    double *v; /* [stat 0 mean, 1 min][branch][L][S] */
    int64_t *steps;
    double cw, left, pw, ph, fig_w;
    char title[1024], subtitle[1024], subtitle2[1024];
} gt_ctx;

/* one-hot (N = 1) bright, uniform (N = W) dark */
static ps_rgb viridis_rev(double t) { return ps_viridis(1 - t); }

static void draw_gate_training(cairo_t *cr, void *vctx) {
    gt_ctx *x = vctx;
    cairo_set_source_rgb(cr, 0, 0, 0);
    ps_text(cr, 20, 22, x->title, ps_fig_fit(cr, x->title, 17, x->fig_w - 40, 1), 0, 0.5, 0, 1);
    ps_text(cr, 20, 46, x->subtitle, ps_fig_fit(cr, x->subtitle, 12.5, x->fig_w - 40, 0), 0, 0.5, 0, 0);
    ps_text(cr, 20, 64, x->subtitle2, ps_fig_fit(cr, x->subtitle2, 12.5, x->fig_w - 40, 0), 0, 0.5, 0, 0);
    static const char *const STAT[] = {"mean over KV heads", "min over KV heads (most concentrated head)"};
    for (int s = 0; s < 2; s++)
        for (int b = 0; b < 2; b++) {
            double px = x->left + b * (x->pw + x->left), py = GT_TOP + s * (x->ph + 96);
            char buf[160];
            snprintf(buf, sizeof buf, "%s gate — N_static, %s", b ? "value" : "key", STAT[s]);
            cairo_set_source_rgb(cr, 0, 0, 0);
            ps_text(cr, px + x->pw / 2, py - 16, buf, ps_fig_fit(cr, buf, 13, x->pw + x->left - 20, 1), 0.5, 0.5, 0, 1);
            ps_heatmap(cr, px, py, x->pw, x->ph, x->v + ((size_t)(s * 2 + b) * (size_t)x->L) * (size_t)x->S, x->L, x->S,
                       viridis_rev, 0, log2(x->W > 1 ? x->W : 2));
            cairo_set_source_rgb(cr, 0, 0, 0);
            double rh = x->ph / x->L;
            int rstep = ps_tick_step(rh, 12);
            for (int l = 0; l < x->L; l += rstep) {
                snprintf(buf, sizeof buf, "layer %d", l);
                ps_text(cr, px - 6, py + (l + 0.5) * rh, buf, fmin(12, rh), 1, 0.5, 0, 0);
            }
            /* the values where the cells are big enough to read */
            if (x->cw >= 30 && rh >= 14)
                for (int l = 0; l < x->L; l++)
                    for (int t = 0; t < x->S; t++) {
                        double v = x->v[((size_t)(s * 2 + b) * (size_t)x->L + (size_t)l) * (size_t)x->S + (size_t)t];
                        double u = v / log2(x->W > 1 ? x->W : 2);
                        if (u > 0.55) cairo_set_source_rgb(cr, 1, 1, 1);
                        else cairo_set_source_rgb(cr, 0, 0, 0);
                        snprintf(buf, sizeof buf, "%.1f", exp2(v));
                        ps_text(cr, px + (t + 0.5) * x->cw, py + (l + 0.5) * rh, buf, fmin(10, rh - 3), 0.5, 0.5, 0, 0);
                    }
            cairo_set_source_rgb(cr, 0, 0, 0);
            char w0[32];
            snprintf(w0, sizeof w0, "%lld", (long long)x->steps[x->S - 1]);
            int step = ps_tick_step(x->cw, ps_text_width(cr, w0, 11, 0) + 6);
            for (int t = 0; t < x->S; t += step) {
                snprintf(buf, sizeof buf, "%lld", (long long)x->steps[t]);
                ps_text(cr, px + (t + 0.5) * x->cw, py + x->ph + 5, buf, 11, 0.5, 0, 0, 0);
            }
            ps_text(cr, px + x->pw / 2, py + x->ph + 24, "training step (logged gate records)", 12.5, 0.5, 0, 0, 0);
        }
    ps_colorbar(cr, x->left + 2 * x->pw + x->left + 10, GT_TOP, 16, x->ph * 2 + 96, viridis_rev, 0, log2(x->W > 1 ? x->W : 2),
                "log2 N_static");
}

/* OUT/gate_training.png from gates.json's "training" entries (validated: every (layer, head, branch) once,
 * the same steps in each). */
static int render_gate_training(json_t *doc, const char *path, const char *out, const ps_render_opts *o, int verbose,
                                ps_error *err) {
    json_t *tr = json_object_get(doc, "training"), *gj = json_object_get(doc, "gates");
    size_t ne = json_array_size(tr);
    json_int_t W = json_integer_value(json_object_get(gj, "window"));
    size_t L = json_array_size(json_object_get(gj, "layers"));
    size_t S = json_array_size(json_object_get(json_array_get(tr, 0), "steps"));
    if (!ne || !S) return 0;
    if (S > GT_MAX_STEPS) return ps_fail(err, "%s: training has %zu gate records; a figure shows at most %d", path, S, GT_MAX_STEPS);
    gt_ctx x = {0};
    x.L = (int)L;
    x.S = (int)S;
    x.W = (int)W;
    x.v = malloc(4 * L * S * sizeof(double));
    x.steps = malloc(S * sizeof(int64_t));
    int *cnt = calloc(2 * L, sizeof(int));
    if (!x.v || !x.steps || !cnt) {
        free(x.v);
        free(x.steps);
        free(cnt);
        return ps_fail(err, "%s: out of memory", path);
    }
    for (size_t i = 0; i < 2 * L * S; i++) {
        x.v[i] = 0;            /* mean */
        x.v[2 * L * S + i] = INFINITY; /* min */
    }
    for (size_t t = 0; t < S; t++) x.steps[t] = json_integer_value(json_array_get(json_object_get(json_array_get(tr, 0), "steps"), t));
    int H = 0;
    for (size_t e = 0; e < ne; e++) {
        json_t *en = json_array_get(tr, e), *ns = json_object_get(en, "N_static");
        int l = (int)json_integer_value(json_object_get(en, "layer")), h = (int)json_integer_value(json_object_get(en, "head"));
        int b = !strcmp(json_string_value(json_object_get(en, "branch")), "value");
        H = h + 1 > H ? h + 1 : H;
        cnt[b * L + (size_t)l]++;
        for (size_t t = 0; t < S; t++) {
            double v = json_number_value(json_array_get(ns, t));
            size_t k = ((size_t)b * L + (size_t)l) * S + t;
            x.v[k] += v;
            x.v[2 * L * S + k] = fmin(x.v[2 * L * S + k], v);
        }
    }
    for (size_t bl = 0; bl < 2 * L; bl++)
        for (size_t t = 0; t < S; t++) x.v[bl * S + t] = cnt[bl] ? x.v[bl * S + t] / cnt[bl] : NAN;
    free(cnt);
    /* colour on a log scale: log2 N_static, 0 = one-hot … log2 W = uniform (concentration below 2 offsets is
     * where the differences matter) */
    for (size_t i = 0; i < 4 * L * S; i++) x.v[i] = isfinite(x.v[i]) ? log2(fmax(x.v[i], 1)) : NAN;
    x.cw = fmax(4, fmin(40, 520.0 / (double)S));
    x.pw = x.cw * (double)S;
    x.ph = fmax(60, fmin(GT_ROWH * (double)L, 420));
    x.left = 80;
    char name[400];
    ps_fig_model_name(name, sizeof name, json_object_get(doc, "provenance"));
    snprintf(x.title, sizeof x.title, "Gate concentration over training — %s", name);
    snprintf(x.subtitle, sizeof x.subtitle,
             "N_static = exp(H(mean gate)) per layer at each logged gate record (%zu records, steps %lld–%lld), W = %lld; "
             "%d KV heads per layer",
             S, (long long)x.steps[0], (long long)x.steps[S - 1], (long long)W, H);
    snprintf(x.subtitle2, sizeof x.subtitle2,
             "colour: log2 N_static (0 = one-hot, 1 = two offsets, log2 W = uniform); top: averaged over the layer's KV heads; bottom: the minimum over them (a layer "
             "where one head goes one-hot shows there); bright = concentrated");
    x.fig_w = fmax(x.left + 2 * (x.pw + x.left) + 100, ps_fig_measure(x.subtitle, 12.5, 0) + 40);
    double H_px = GT_TOP + 2 * x.ph + 96 + 50;
    ps_fig_chunks ch;
    ps_fig_make_chunks(&ch, json_object_get(doc, "provenance"), x.title);
    int rc;
    if (x.fig_w > PS_FIG_MAX_SIDE || H_px > PS_FIG_MAX_SIDE)
        rc = ps_fail(err, "%s: gate training figure would be %.0f x %.0f px (at most %.0f a side)", path, x.fig_w, H_px,
                     PS_FIG_MAX_SIDE);
    else {
        rc = 0;
        ps_fig f;
        for (int k = 0; !rc && k < ps_fig_n_files(o); k++)
            if (!(rc = ps_fig_file_open(&f, out, "gate_training", x.fig_w, H_px, o, k, err))) {
                draw_gate_training(f.cr, &x);
                rc = ps_fig_file_close(&f, &ch, verbose, err);
            }
    }
    free(x.v);
    free(x.steps);
    return rc;
}

/* ---- per-channel gates (gates.gate "per_channel": DeepSeek-V4's compressor, gates/chgates.h) ---- */

typedef struct {
    int layer, S, d, rate;
    char attention[16], branch[16];
    double *mg;       /* [d][S] */
    double *ns, *ni;  /* [d] */
    double *pooled;   /* [S] */
    double p_ns, p_ni, cm_ns, cm_ni;
    int p_peak, nl[3];
    char p_label[32];
    long long n_windows;
} chg_panel;

typedef struct {
    int n, cols;
    chg_panel *p;
    int *row, *col;   /* grid position of each panel */
    double cw, ch, heat_w, heat_h, panel_w, panel_h, top, fig_w;
    char title[1024], subtitle[1024];
} chg_ctx;

#define CHG_NPLOT_W 190.0
#define CHG_BARS_H 56.0
#define CHG_HEAD_H 46.0

static void draw_chgates(cairo_t *cr, void *vctx) {
    chg_ctx *x = vctx;
    ps_text(cr, 20, 24, x->title, ps_fig_fit(cr, x->title, 18, x->fig_w - 40, 1), 0, 0.5, 0, 1);
    ps_text(cr, 20, 50, x->subtitle, ps_fig_fit(cr, x->subtitle, 13, x->fig_w - 40, 0), 0, 0.5, 0, 0);
    char buf[400];
    for (int k = 0; k < x->n; k++) {
        const chg_panel *p = &x->p[k];
        double px = 20 + x->col[k] * x->panel_w + 56, py = x->top + x->row[k] * x->panel_h;
        double hw = p->S * x->cw, hh = p->d * x->ch;
        snprintf(buf, sizeof buf, "layer %d · %s (%s, rate %d, %d slots, %d channels)", p->layer, p->branch,
                 !strcmp(p->attention, "csa") ? "CSA" : "HCA", p->rate, p->S, p->d);
        cairo_set_source_rgb(cr, 0, 0, 0);
        ps_text(cr, px - 50, py, buf, 14, 0, 0, 0, 1);
        snprintf(buf, sizeof buf, "pooled: N_s %.2f, N_i %.2f, peak slot %d (%s); per channel: mean N_s %.2f, N_i %.2f; %d static, %d input-dep., %d diffuse",
                 p->p_ns, p->p_ni, p->p_peak, p->p_label, p->cm_ns, p->cm_ni, p->nl[0], p->nl[1], p->nl[2]);
        ps_text(cr, px - 50, py + 20, buf, ps_fig_fit(cr, buf, 12, x->panel_w - 30, 0), 0, 0, 0, 0);
        double y0 = py + CHG_HEAD_H;
        ps_heatmap_strided(cr, px, y0, hw, hh, p->mg, p->d, p->S, p->S, 1, ps_viridis, 0, 1);
        cairo_set_source_rgb(cr, 0, 0, 0);
        ps_text(cr, px - 30, y0 + hh / 2, "channel", 12, 0.5, 1, -M_PI / 2, 0);
        int cstep = ps_tick_step(x->ch, 12);
        for (int c = 0; c < p->d; c += cstep) {
            snprintf(buf, sizeof buf, "%d", c);
            if (x->ch >= 4 || c == 0) ps_text(cr, px - 2, y0 + (c + 0.5) * x->ch, buf, fmin(11, fmax(7, x->ch)), 1, 0.5, 0, 0);
        }
        /* the pooled mean gate under the heatmap, on the same slot axis */
        double by = y0 + hh + 8, mx = 0;
        for (int i = 0; i < p->S; i++) mx = fmax(mx, p->pooled[i]);
        if (!(mx > 0)) mx = 1;
        cairo_set_source_rgb(cr, 0.93, 0.93, 0.93);
        cairo_rectangle(cr, px, by, hw, CHG_BARS_H);
        cairo_fill(cr);
        ps_set_rgb(cr, ps_okabe_ito(0));
        for (int i = 0; i < p->S; i++) {
            double bh = CHG_BARS_H * p->pooled[i] / mx;
            cairo_rectangle(cr, px + i * x->cw + (x->cw > 3 ? 1 : 0), by + CHG_BARS_H - bh, fmax(0.5, x->cw - (x->cw > 3 ? 2 : 0)), bh);
            cairo_fill(cr);
        }
        cairo_set_source_rgb(cr, 0, 0, 0);
        snprintf(buf, sizeof buf, "pooled (max %.2f)", mx);
        ps_text(cr, px + hw + 4, by + CHG_BARS_H / 2, buf, 10, 0, 0.5, 0, 0);
        int sstep = ps_tick_step(x->cw, ps_text_width(cr, "000", 11, 0) + 3);
        for (int i = 0; i < p->S; i += sstep) {
            snprintf(buf, sizeof buf, "%d", i);
            ps_text(cr, px + (i + 0.5) * x->cw, by + CHG_BARS_H + 3, buf, 11, 0.5, 0, 0, 0);
        }
        ps_text(cr, px + hw / 2, by + CHG_BARS_H + 18,
                !strcmp(p->attention, "csa") ? "slot (0..m−1: the previous window's series; m..2m−1: this window's)"
                                             : "slot = token offset in the window",
                11, 0.5, 0, 0, 0);
        /* per-channel N_static (dot) and N_input (cross) on 1..S */
        double nx = px + hw + 24, nw = CHG_NPLOT_W - 30;
        cairo_set_source_rgb(cr, 0.5, 0.5, 0.5);
        cairo_set_line_width(cr, 1);
        cairo_rectangle(cr, nx + 0.5, y0 + 0.5, nw, hh);
        cairo_stroke(cr);
        double lo = 1, hi = p->S > 1 ? p->S : 2;
#define CHG_X(v) (nx + nw * ((v) - lo) / (hi - lo))
        double dash[2] = {3, 3};
        cairo_set_dash(cr, dash, 2, 0);
        ps_fig_line(cr, CHG_X(PS_GATE_CONCENTRATED_FIG), y0, CHG_X(PS_GATE_CONCENTRATED_FIG), y0 + hh);
        cairo_stroke(cr);
        cairo_set_dash(cr, NULL, 0, 0);
        double r = fmax(1.2, fmin(3, x->ch / 2.5));
        for (int c = 0; c < p->d; c++) {
            double yy = y0 + (c + 0.5) * x->ch;
            ps_set_rgb(cr, ps_okabe_ito(0));
            cairo_arc(cr, CHG_X(fmin(hi, fmax(lo, p->ns[c]))), yy, r, 0, 2 * M_PI);
            cairo_fill(cr);
            ps_set_rgb(cr, ps_okabe_ito(1));
            double cx = CHG_X(fmin(hi, fmax(lo, p->ni[c])));
            ps_fig_line(cr, cx - r, yy - r, cx + r, yy + r);
            ps_fig_line(cr, cx - r, yy + r, cx + r, yy - r);
            cairo_stroke(cr);
        }
#undef CHG_X
        cairo_set_source_rgb(cr, 0, 0, 0);
        snprintf(buf, sizeof buf, "%d", (int)lo);
        ps_text(cr, nx, y0 + hh + 3, buf, 11, 0.5, 0, 0, 0);
        snprintf(buf, sizeof buf, "%d", (int)hi);
        ps_text(cr, nx + nw, y0 + hh + 3, buf, 11, 0.5, 0, 0, 0);
        ps_text(cr, nx + nw / 2, y0 + hh + 18, "effective slots per channel", 11, 0.5, 0, 0, 0);
        ps_set_rgb(cr, ps_okabe_ito(0));
        ps_text(cr, nx + nw / 2 - 4, y0 - 4, "● N_static", 11, 1, 1, 0, 0);
        ps_set_rgb(cr, ps_okabe_ito(1));
        ps_text(cr, nx + nw / 2 + 4, y0 - 4, "× N_input", 11, 0, 1, 0, 0);
    }
    double cbx = 20 + x->cols * x->panel_w;
    ps_colorbar(cr, cbx, x->top + CHG_HEAD_H, 18, fmin(fmax(x->heat_h, 120), 600), ps_viridis, 0, 1, "mean gate weight E[α]");
}

static void free_chg(chg_ctx *x) {
    if (x->p)
        for (int k = 0; k < x->n; k++) {
            free(x->p[k].mg);
            free(x->p[k].ns);
            free(x->p[k].ni);
            free(x->p[k].pooled);
        }
    free(x->p);
    free(x->row);
    free(x->col);
}

static int render_chgates(json_t *doc, const char *path, const char *out, const ps_render_opts *o, int verbose, ps_error *err) {
    json_t *gj = json_object_get(doc, "gates"), *layers = json_object_get(gj, "layers");
    size_t L = json_array_size(layers);
    if (L < 1 || L > MAX_LAYERS)
        return ps_fail(err, "%s: gates.layers has %zu entries; a figure shows 1 to %d layers", path, L, MAX_LAYERS);
    chg_ctx x = {0};
    int cap = (int)L * 2, rc = 0;
    x.p = calloc((size_t)cap, sizeof *x.p);
    x.row = calloc((size_t)cap, sizeof(int));
    x.col = calloc((size_t)cap, sizeof(int));
    if (!x.p || !x.row || !x.col) {
        free_chg(&x);
        return ps_fail(err, "%s: out of memory", path);
    }
    int maxS = 1, maxd = 1;
    for (size_t l = 0; l < L && !rc; l++) {
        json_t *lo = json_array_get(layers, l), *brs = json_object_get(lo, "branches");
        for (size_t b = 0; b < json_array_size(brs) && b < 2 && !rc; b++) {
            json_t *bo = json_array_get(brs, b), *po = json_object_get(bo, "pooled"), *per = json_object_get(bo, "per_channel");
            chg_panel *p = &x.p[x.n];
            p->layer = (int)json_integer_value(json_object_get(lo, "layer"));
            p->S = (int)json_integer_value(json_object_get(lo, "slots"));
            p->d = (int)json_integer_value(json_object_get(bo, "channels"));
            p->rate = (int)json_integer_value(json_object_get(lo, "rate"));
            snprintf(p->attention, sizeof p->attention, "%s", json_string_value(json_object_get(lo, "attention")) ?: "");
            snprintf(p->branch, sizeof p->branch, "%s", json_string_value(json_object_get(bo, "branch")) ?: "");
            if (p->S < 1 || p->S > MAX_WINDOW || p->d < 1 || p->d > 8192) {
                rc = ps_fail(err, "%s: layer %d has %d slots x %d channels; a figure shows up to %d x 8192", path, p->layer, p->S, p->d, MAX_WINDOW);
                break;
            }
            p->mg = calloc((size_t)p->S * (size_t)p->d, sizeof(double));
            p->ns = calloc((size_t)p->d, sizeof(double));
            p->ni = calloc((size_t)p->d, sizeof(double));
            p->pooled = calloc((size_t)p->S, sizeof(double));
            x.row[x.n] = (int)l;
            x.col[x.n] = (int)b;
            x.n++;
            if (!p->mg || !p->ns || !p->ni || !p->pooled) {
                rc = ps_fail(err, "%s: out of memory", path);
                break;
            }
            json_t *mg = json_object_get(per, "mean_gate");
            for (int c = 0; c < p->d; c++) {
                for (int i = 0; i < p->S; i++)
                    p->mg[(size_t)c * p->S + i] = json_number_value(json_array_get(json_array_get(mg, (size_t)c), (size_t)i));
                p->ns[c] = json_number_value(json_array_get(json_object_get(per, "N_static"), (size_t)c));
                p->ni[c] = json_number_value(json_array_get(json_object_get(per, "N_input"), (size_t)c));
            }
            for (int i = 0; i < p->S; i++) p->pooled[i] = json_number_value(json_array_get(json_object_get(po, "mean_gate"), (size_t)i));
            p->p_ns = ps_fig_num(po, "N_static");
            p->p_ni = ps_fig_num(po, "N_input");
            p->p_peak = (int)json_integer_value(json_object_get(po, "peak"));
            snprintf(p->p_label, sizeof p->p_label, "%s", json_string_value(json_object_get(po, "label")) ?: "");
            json_t *cm = json_object_get(bo, "channel_mean"), *lab = json_object_get(bo, "labels");
            p->cm_ns = ps_fig_num(cm, "N_static");
            p->cm_ni = ps_fig_num(cm, "N_input");
            for (int k2 = 0; k2 < 3; k2++) p->nl[k2] = (int)json_integer_value(json_object_get(lab, ps_gate_labels[k2]));
            p->n_windows = json_integer_value(json_object_get(bo, "n_windows"));
            if (p->S > maxS) maxS = p->S;
            if (p->d > maxd) maxd = p->d;
            if ((int)b + 1 > x.cols) x.cols = (int)b + 1;
        }
    }
    if (!rc && x.n == 0) rc = ps_fail(err, "%s: no gates to draw", path);
    if (!rc) {
        x.cw = maxS <= 32 ? fmax(10, fmin(40, 320.0 / maxS)) : fmax(1, 320.0 / maxS);
        x.ch = fmax(1, fmin(14, 320.0 / maxd));
        x.heat_w = maxS * x.cw;
        x.heat_h = maxd * x.ch;
        x.panel_w = fmax(56 + x.heat_w + 24 + CHG_NPLOT_W + 110, 720);
        x.panel_h = CHG_HEAD_H + x.heat_h + 8 + CHG_BARS_H + 44;
        x.top = 84;
        char name[400];
        ps_fig_model_name(name, sizeof name, json_object_get(doc, "provenance"));
        snprintf(x.title, sizeof x.title, "Per-channel gate concentration — %s", name);
        snprintf(x.subtitle, sizeof x.subtitle,
                 "each channel's mean gate weight over the slots of its window (pooled over %lld windows); N_s = exp(H(mean gate)), "
                 "N_i = E[exp(H(α))]; dashed: N = 2 (concentrated)",
                 x.p[0].n_windows);
        x.fig_w = fmax(20 + x.cols * x.panel_w + 90, ps_fig_measure(x.subtitle, 13, 0) + 40);
        double H_px = x.top + (double)L * x.panel_h + 10;
        ps_fig_chunks ch;
        ps_fig_make_chunks(&ch, json_object_get(doc, "provenance"), x.title);
        if (x.fig_w > PS_FIG_MAX_SIDE || H_px > PS_FIG_MAX_SIDE)
            rc = ps_fail(err, "%s: %zu layers of per-channel gates need a %.0f x %.0f px figure (at most %.0f a side)", path, L, x.fig_w,
                         H_px, PS_FIG_MAX_SIDE);
        else {
            rc = 0;
            ps_fig f;
            for (int k = 0; !rc && k < ps_fig_n_files(o); k++)
                if (!(rc = ps_fig_file_open(&f, out, "gate_concentration", x.fig_w, H_px, o, k, err))) {
                    draw_chgates(f.cr, &x);
                    rc = ps_fig_file_close(&f, &ch, verbose, err);
                }
        }
    }
    free_chg(&x);
    return rc;
}

/* gates.json: gate_concentration.png of the per-channel gates (gates.gate "per_channel") or of the slot
 * gates, with gate_training.png when a slot-gates result has "training" entries */
int ps_render_gates(json_t *const *docs, const char *const *paths, int n, const char *out, const ps_render_opts *o, int verbose,
                    ps_error *err) {
    (void)n; /* one at a time (viz/kinds.c) */
    const char *gk = json_string_value(json_object_get(json_object_get(docs[0], "gates"), "gate"));
    return gk && !strcmp(gk, "per_channel") ? render_chgates(docs[0], paths[0], out, o, verbose, err)
                                            : render_gates(docs[0], paths[0], out, o, verbose, err);
}
