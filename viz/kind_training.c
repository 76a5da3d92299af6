/* kind_training.c — the training log figure: training.png from a run's train.jsonl (loss and accuracy
 * curves, and gate concentration during training). A training log is not a result kind (it has no "kind"
 * and no validator): ps_render draws a .jsonl file with it. */
#define _POSIX_C_SOURCE 200809L
#include "viz/kinds.h"

#include <libgen.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fileio.h"
#include "viz/fig_common.h"

/* ---- the training figure ---- */

typedef struct {
    int n_train, n_eval, n_gates;
    double *ts, *loss, *es, *acc, *gs;
    int L, H, W, sel; /* sel: (layer, head) panels drawn: every head, up to MAX_TRAIN_PANELS */
    double *mg;       /* [n_gates][L][H][2][W] */
    double *ns, *ni;  /* [n_gates][L][H][2] */
    double fig_w;
    char title[1024], subtitle[1024], section[256];
    int perch; /* per-channel gate records (V4's compressor): branch 0 = the pooled mean gate, branch 1 = where the
                  channels peak (the fraction of channels per slot); N: pooled / channel-mean N_static, N_input */
} train_ctx;

#define TR_TOP 84.0
#define TR_PLOT_H 200.0
#define TR_GATES (TR_TOP + TR_PLOT_H + 104.0) /* first row of gate panels */
#define TR_PW 600.0                           /* a (layer, head) panel */
#define TR_PH 172.0
#define TR_HM_H 90.0
#define TR_HM_W 150.0

static int train_cols(int sel) { return sel >= 2 ? 2 : 1; }

static void axes(cairo_t *cr, double x, double y, double w, double h, double x0, double x1, double y0, double y1,
                 double fs, const char *xl, const char *yl) {
    double t[32];
    int n = ps_nice_ticks(y0, y1, h < 150 ? 4 : 5, t, 32);
    cairo_set_line_width(cr, 1);
    for (int i = 0; i < n; i++) {
        if (t[i] > y1 || t[i] < y0) continue;
        double yy = round(y + h * (1 - (t[i] - y0) / (y1 - y0))) + 0.5;
        cairo_set_source_rgb(cr, 0.88, 0.88, 0.88);
        ps_fig_line(cr, x, yy, x + w, yy);
        cairo_set_source_rgb(cr, 0, 0, 0);
        ps_fig_line(cr, x - 4, yy, x, yy);
        char buf[32];
        ps_fmt_num(buf, sizeof buf, t[i]);
        ps_text(cr, x - 6, yy, buf, fs, 1, 0.5, 0, 0);
    }
    n = ps_nice_ticks(x0, x1, w < 250 ? 4 : 6, t, 32);
    /* (y ticks below y0 are skipped above: ranges padded below 0 keep 0 as their lowest tick) */
    for (int i = 0; i < n; i++) {
        double xx = round(x + w * (t[i] - x0) / (x1 - x0)) + 0.5;
        ps_fig_line(cr, xx, y + h, xx, y + h + 4);
        char buf[32];
        ps_fmt_num(buf, sizeof buf, t[i]);
        ps_text(cr, xx, y + h + 6, buf, fs, 0.5, 0, 0, 0);
    }
    cairo_rectangle(cr, x + 0.5, y + 0.5, w, h);
    cairo_stroke(cr);
    if (xl) ps_text(cr, x + w / 2, y + h + 8 + fs * 1.5, xl, fs + 1, 0.5, 0, 0, 0);
    if (yl) ps_text(cr, x - 50, y + h / 2, yl, fs + 1, 0.5, 0.5, -M_PI / 2, 0);
}


/* key: filled circle; value: open square */
static void marker(cairo_t *cr, int kind, double x, double y) {
    if (kind == 0) {
        cairo_arc(cr, x, y, 3.2, 0, 2 * M_PI);
        cairo_fill(cr);
    } else {
        cairo_set_line_width(cr, 1.4);
        cairo_rectangle(cr, x - 4, y - 4, 8, 8);
        cairo_stroke(cr);
    }
}

static void nline_style(cairo_t *cr, int b, int q) {
    static const double dash[2] = {6, 3.5};
    ps_set_rgb(cr, ps_okabe_ito(b ? 3 : 0));
    cairo_set_line_width(cr, b ? 1.6 : 3.4); /* key drawn wide under the value line: both stay visible where they meet */
    cairo_set_dash(cr, q ? dash : NULL, q ? 2 : 0, 0);
}

static void draw_training(cairo_t *cr, void *vctx) {
    train_ctx *x = vctx;
    ps_text(cr, 20, 22, x->title, ps_fig_fit(cr, x->title, 17, x->fig_w - 40, 1), 0, 0.5, 0, 1);
    ps_text(cr, 20, 46, x->subtitle, ps_fig_fit(cr, x->subtitle, 12.5, x->fig_w - 40, 0), 0, 0.5, 0, 0);
    double smax = 1;
    for (int i = 0; i < x->n_train; i++) smax = fmax(smax, x->ts[i]);
    for (int i = 0; i < x->n_eval; i++) smax = fmax(smax, x->es[i]);
    double lmax = 0;
    for (int i = 0; i < x->n_train; i++)
        if (isfinite(x->loss[i])) lmax = fmax(lmax, x->loss[i]);
    /* y ranges padded a little beyond the data (0 and 1 included), so no curve runs along the frame */
    double ltop = lmax > 0 ? lmax * 1.06 : 1, lbot = -0.03 * ltop, abot = -0.03, atop = 1.05;
    double y = TR_TOP, h = TR_PLOT_H, w = 520, ax = 80, bx = 80 + w + 110;
    axes(cr, ax, y, w, h, 0, smax, lbot, ltop, 12, "training step", "training loss (nats)");
    ps_set_rgb(cr, ps_okabe_ito(0));
    cairo_set_line_width(cr, 2);
    ps_fig_polyline(cr, x->ts, x->loss, 1, x->n_train, ax, y, w, h, 0, smax, lbot, ltop);
    cairo_set_source_rgb(cr, 0, 0, 0);
    axes(cr, bx, y, w, h, 0, smax, abot, atop, 12, "training step", "held-out accuracy");
    ps_set_rgb(cr, ps_okabe_ito(3));
    cairo_set_line_width(cr, 2);
    ps_fig_polyline(cr, x->es, x->acc, 1, x->n_eval, bx, y, w, h, 0, smax, abot, atop);
    for (int i = 0; i < x->n_eval; i++) {
        cairo_arc(cr, bx + w * x->es[i] / smax, y + h * (1 - (x->acc[i] - abot) / (atop - abot)), 3, 0, 2 * M_PI);
        cairo_fill(cr);
    }
    cairo_set_source_rgb(cr, 0, 0, 0);
    if (!x->n_gates) return;
    /* gate evolution: per (layer, head): key and value offset × step heatmaps, then N_static / N_input */
    int ncol = train_cols(x->sel), ng = x->n_gates;
    double gmax = x->gs[ng - 1] > x->gs[0] ? x->gs[ng - 1] : x->gs[0] + 1, nmax = x->W * 1.08;
    ps_text(cr, 20, TR_GATES - 50, x->section, 15, 0, 0.5, 0, 1);
    const char *expl = x->perch ? "per layer: the channels' mean gate pooled over channels, and the fraction of channels peaking at each "
                                  "slot, over slots (rows) and logged steps (columns); N_static of the pooled gate and of the "
                                  "channels (mean), N_input"
                                : "per head: mean gate over offsets (rows) and logged steps (columns), key and value branch; effective "
                                  "offsets N_static = exp(H(mean gate)) and N_input = E[exp(H(α))]";
    ps_text(cr, 20, TR_GATES - 30, expl, ps_fig_fit(cr, expl, 12, x->fig_w - 40, 0), 0, 0.5, 0, 0);
    double cwk = TR_HM_W / ng;
    double st_t[32];
    int nst = ng > 1 ? ps_nice_ticks(x->gs[0], x->gs[ng - 1], 3, st_t, 32) : 0;
    int mstep = ng > 10 ? (ng + 9) / 10 : 1;
    ptrdiff_t kst = (ptrdiff_t)x->L * x->H * 2 * x->W; /* one record to the next in mg */
    for (int s = 0; s < x->sel; s++) {
        int l = s / x->H, hd = s % x->H;
        double px = 40 + (s % ncol) * TR_PW, py = TR_GATES + (s / ncol) * TR_PH, hy = py + 30;
        char buf[64];
        if (x->perch) snprintf(buf, sizeof buf, "layer %d (per-channel gate)", l);
        else snprintf(buf, sizeof buf, "layer %d, head %d", l, hd);
        cairo_set_source_rgb(cr, 0, 0, 0);
        ps_text(cr, px, py + 4, buf, 13, 0, 0.5, 0, 1);
        for (int b = 0; b < 2; b++) {
            double hx = px + 44 + b * (TR_HM_W + 16);
            size_t base = (((size_t)l * (size_t)x->H + (size_t)hd) * 2 + (size_t)b) * (size_t)x->W;
            ps_heatmap_strided(cr, hx, hy, TR_HM_W, TR_HM_H, x->mg + base, x->W, ng, 1, kst, ps_viridis, 0, 1);
            cairo_set_source_rgb(cr, 0, 0, 0);
            ps_text(cr, hx + TR_HM_W / 2, py + 20, x->perch ? (b ? "channels' peaks" : "pooled gate") : b ? "value gate" : "key gate", 12,
                    0.5, 0.5, 0, 0);
            if (b == 0) {
                int st = ps_tick_step(TR_HM_H / x->W, 11);
                for (int i = 0; i < x->W; i += st) {
                    snprintf(buf, sizeof buf, "%d", i);
                    ps_text(cr, hx - 4, hy + (i + 0.5) * TR_HM_H / x->W, buf, 10, 1, 0.5, 0, 0);
                }
                ps_text(cr, hx - 30, hy + TR_HM_H / 2, x->perch ? "slot" : "offset", 11, 0.5, 0.5, -M_PI / 2, 0);
            }
            for (int i = 0; i < nst; i++) { /* step ticks at round steps, placed between the logged columns */
                double fi = 0;
                for (int k = 0; k + 1 < ng; k++)
                    if (st_t[i] >= x->gs[k] && st_t[i] <= x->gs[k + 1]) {
                        fi = k + (x->gs[k + 1] > x->gs[k] ? (st_t[i] - x->gs[k]) / (x->gs[k + 1] - x->gs[k]) : 0);
                        break;
                    } else if (st_t[i] > x->gs[k + 1])
                        fi = k + 1;
                double cx = hx + (fi + 0.5) * cwk;
                ps_fig_line(cr, round(cx) + 0.5, hy + TR_HM_H, round(cx) + 0.5, hy + TR_HM_H + 3);
                ps_fmt_num(buf, sizeof buf, st_t[i]);
                ps_text(cr, cx, hy + TR_HM_H + 5, buf, 10, 0.5, 0, 0, 0);
            }
            ps_text(cr, hx + TR_HM_W / 2, hy + TR_HM_H + 20, "training step", 11, 0.5, 0, 0, 0);
        }
        double nx = px + 44 + 2 * (TR_HM_W + 16) + 32, nw = TR_PW - (nx - px) - 30;
        ps_text(cr, nx + nw / 2, py + 20, "effective offsets", 12, 0.5, 0.5, 0, 0);
        axes(cr, nx, hy, nw, TR_HM_H, fmin(0, x->gs[0]), gmax, 0, nmax, 10, "training step", NULL);
        for (int b = 0; b < 2; b++)
            for (int q = 0; q < 2; q++) {
                size_t idx = (((size_t)l * (size_t)x->H + (size_t)hd) * 2 + (size_t)b);
                const double *ys = (q ? x->ni : x->ns) + idx;
                ptrdiff_t yst = (ptrdiff_t)x->L * x->H * 2;
                nline_style(cr, b, q);
                ps_fig_polyline(cr, x->gs, ys, yst, ng, nx, hy, nw, TR_HM_H, fmin(0, x->gs[0]), gmax, 0, nmax);
                cairo_set_dash(cr, NULL, 0, 0);
                for (int k = 0; k < ng; k += mstep)
                    marker(cr, b, nx + nw * (x->gs[k] - fmin(0, x->gs[0])) / (gmax - fmin(0, x->gs[0])),
                           hy + TR_HM_H * (1 - ys[k * yst] / nmax));
            }
        cairo_set_source_rgb(cr, 0, 0, 0);
    }
    /* legend and colour bar, right of the first row */
    double lx = 40 + ncol * TR_PW + 6, ly = TR_GATES + 10;
    const char *nm[4] = {"key N_static", "key N_input", "value N_static", "value N_input"};
    if (x->perch) nm[0] = "pooled N_static", nm[1] = "N_input", nm[2] = "channel-mean N_static", nm[3] = "N_input";
    for (int b = 0; b < 2; b++)
        for (int q = 0; q < 2; q++) {
            double yy = ly + (b * 2 + q) * 22;
            nline_style(cr, b, q);
            ps_fig_line(cr, lx, yy, lx + 34, yy);
            cairo_set_dash(cr, NULL, 0, 0);
            marker(cr, b, lx + 17, yy);
            cairo_set_source_rgb(cr, 0, 0, 0);
            ps_text(cr, lx + 42, yy, nm[b * 2 + q], 12, 0, 0.5, 0, 0);
        }
    ps_colorbar(cr, lx, ly + 110, 16, 180, ps_viridis, 0, 1, "mean gate weight");
}

static void free_train(train_ctx *x) {
    free(x->ts);
    free(x->loss);
    free(x->es);
    free(x->acc);
    free(x->gs);
    free(x->mg);
    free(x->ns);
    free(x->ni);
}

static void train_size(train_ctx *x, double *w, double *h) {
    int ncol = train_cols(x->sel);
    *w = fmax(1290, 40 + ncol * TR_PW + 190);
    *h = x->n_gates ? TR_GATES + ((x->sel + ncol - 1) / ncol) * TR_PH + 4 : TR_TOP + TR_PLOT_H + 60;
    if (x->n_gates && *h < TR_GATES + 10 + 110 + 180 + 40) *h = TR_GATES + 10 + 110 + 180 + 40; /* the legend and colour bar (one row of panels) */
    x->fig_w = *w;
}


/* A training log's model: RUN/config.json next to the log, when there is one. */
static void run_name(char *buf, size_t n, const char *log_path) {
    char dir[4096], cfgp[4200];
    snprintf(dir, sizeof dir, "%s", log_path);
    char *d = dirname(dir);
    snprintf(cfgp, sizeof cfgp, "%s/config.json", d);
    char *text = NULL;
    size_t len = 0;
    ps_error e;
    json_t *cfg = NULL;
    if (!ps_read_file(cfgp, (size_t)1 << 20, &text, &len, &e)) {
        cfg = json_loadb(text, len, 0, NULL);
        free(text);
    }
    char abs[4096];
    snprintf(abs, sizeof abs, "%s", d);
    if (!strcmp(abs, ".")) {
        char *cwd = realpath(".", NULL);
        if (cwd) {
            snprintf(abs, sizeof abs, "%s", cwd);
            free(cwd);
        }
    }
    json_t *prov = json_object();
    if (prov) {
        json_object_set_new(prov, "model", json_string(abs));
        if (cfg) json_object_set(prov, "config", cfg);
        ps_fig_model_name(buf, n, prov);
        json_t *c = json_object_get(prov, "config");
        long long L = (long long)json_integer_value(json_object_get(c, "n_layers")), H = (long long)json_integer_value(json_object_get(c, "n_kv_heads"));
        if (L > 0 && H > 0) {
            size_t l = strlen(buf);
            snprintf(buf + l, n - l, ", %lld layer%s × %lld KV heads", L, L == 1 ? "" : "s", H);
        }
        json_decref(prov);
    } else
        snprintf(buf, n, "training run");
    json_decref(cfg);
}

int ps_render_training(const char *path, const char *out, const ps_render_opts *o, int verbose, ps_error *err) {
    json_t *all = ps_read_jsonl(path, err);
    if (!all) return -1;
    train_ctx x = {0};
    size_t lines = json_array_size(all) + 1;
    x.ts = calloc(lines, sizeof(double));
    x.loss = calloc(lines, sizeof(double));
    x.es = calloc(lines, sizeof(double));
    x.acc = calloc(lines, sizeof(double));
    x.gs = calloc(lines, sizeof(double));
    json_t **gates = calloc(lines, sizeof(json_t *));
    int rc = 0;
    if (!x.ts || !x.loss || !x.es || !x.acc || !x.gs || !gates) rc = ps_fail(err, "%s: out of memory", path);
    size_t ri;
    json_t *r;
    json_array_foreach(all, ri, r) {
        if (rc) break;
        const char *type = json_string_value(json_object_get(r, "type"));
        double step = (double)json_integer_value(json_object_get(r, "step"));
        if (type && !strcmp(type, "train")) {
            x.ts[x.n_train] = step;
            x.loss[x.n_train++] = ps_fig_num(r, "loss");
        } else if (type && !strcmp(type, "eval")) {
            x.es[x.n_eval] = step;
            x.acc[x.n_eval++] = ps_fig_num(r, "accuracy");
        } else if (type && !strcmp(type, "gates")) { /* per-head records, or per-channel ones ("gate": "per_channel") */
            int pc = json_object_get(r, "gate") != NULL;
            if (x.n_gates == 0) x.perch = pc;
            if (pc == x.perch) {
                x.gs[x.n_gates] = step;
                gates[x.n_gates++] = json_incref(r);
            }
        }
    }
    json_decref(all);
    if (!rc && x.n_train + x.n_eval == 0) rc = ps_fail(err, "%s: no train or eval records", path);
    if (!rc && x.n_gates) {
        json_t *layers = json_object_get(gates[0], "layers");
        json_t *h0 = json_array_get(json_object_get(json_array_get(layers, 0), "heads"), 0);
        size_t L = json_array_size(layers), H = json_array_size(json_object_get(json_array_get(layers, 0), "heads")),
               W = json_array_size(json_object_get(json_object_get(h0, "key"), "mean_gate"));
        if (x.perch) { /* one panel per layer: its first branch (the attention's compressor) */
            H = 1;
            W = (size_t)json_integer_value(json_object_get(json_array_get(layers, 0), "slots"));
        }
        if (L < 1 || L > MAX_LAYERS)
            rc = ps_fail(err, "%s: the first gates record's layers has %zu entries; a figure shows 1 to %d", path, L, MAX_LAYERS);
        else if (H < 1 || H > MAX_HEADS)
            rc = ps_fail(err, "%s: the first gates record's layers[0].heads has %zu entries; a figure shows 1 to %d", path, H, MAX_HEADS);
        else if (W < 1 || W > MAX_WINDOW)
            rc = ps_fail(err, "%s: the first gates record's mean_gate has %zu offsets; a figure shows 1 to %d", path, W, MAX_WINDOW);
        else if ((int64_t)x.n_gates * (int64_t)L * (int64_t)H * 2 * (int64_t)W > MAX_GATE_VALUES)
            rc = ps_fail(err, "%s: %d gates records × %zu layers × %zu heads × window %zu are more than a figure draws", path,
                         x.n_gates, L, H, W);
        if (!rc) {
            x.L = (int)L;
            x.H = (int)H;
            x.W = (int)W;
            x.sel = x.L * x.H < MAX_TRAIN_PANELS ? x.L * x.H : MAX_TRAIN_PANELS;
            size_t nb = (size_t)x.n_gates * L * H * 2; /* bounded above */
            x.mg = calloc(nb * W, sizeof(double));
            x.ns = calloc(nb, sizeof(double));
            x.ni = calloc(nb, sizeof(double));
            if (!x.mg || !x.ns || !x.ni) rc = ps_fail(err, "%s: out of memory", path);
        }
        for (int k = 0; k < x.n_gates && !rc && x.perch; k++)
            for (int l = 0; l < x.L; l++) {
                json_t *lo = json_array_get(json_object_get(gates[k], "layers"), (size_t)l);
                json_t *bo = json_array_get(json_object_get(lo, "branches"), 0), *po = json_object_get(bo, "pooled");
                json_t *pc = json_object_get(bo, "peak_counts");
                double d = (double)json_integer_value(json_object_get(bo, "channels"));
                if (json_integer_value(json_object_get(lo, "slots")) != x.W) {
                    rc = ps_fail(err, "%s: gates record %d, layer %d: %lld slots, the first record's layer 0 has %d", path, k, l,
                                 (long long)json_integer_value(json_object_get(lo, "slots")), x.W);
                    break;
                }
                for (int b = 0; b < 2; b++) {
                    size_t idx = ((size_t)k * (size_t)x.L + (size_t)l) * 2 + (size_t)b;
                    for (int i = 0; i < x.W; i++)
                        x.mg[idx * (size_t)x.W + (size_t)i] = b ? (d > 0 ? (double)json_integer_value(json_array_get(pc, (size_t)i)) / d : 0)
                                                                : json_number_value(json_array_get(json_object_get(po, "mean_gate"), (size_t)i));
                    x.ns[idx] = b ? ps_fig_num(json_object_get(bo, "channel_mean"), "N_static") : ps_fig_num(po, "N_static");
                    x.ni[idx] = ps_fig_num(po, "N_input");
                }
            }
        for (int k = 0; k < x.n_gates && !rc && !x.perch; k++)
            for (int l = 0; l < x.L; l++)
                for (int h = 0; h < x.H; h++)
                    for (int b = 0; b < 2; b++) {
                        json_t *bo = json_object_get(json_array_get(json_object_get(json_array_get(json_object_get(gates[k], "layers"), (size_t)l), "heads"), (size_t)h),
                                                     b ? "value" : "key");
                        size_t idx = (((size_t)k * (size_t)x.L + (size_t)l) * (size_t)x.H + (size_t)h) * 2 + (size_t)b;
                        for (int i = 0; i < x.W; i++) x.mg[idx * (size_t)x.W + (size_t)i] = json_number_value(json_array_get(json_object_get(bo, "mean_gate"), (size_t)i));
                        x.ns[idx] = ps_fig_num(bo, "N_static");
                        x.ni[idx] = ps_fig_num(bo, "N_input");
                    }
    }
    for (int k = 0; k < x.n_gates; k++) json_decref(gates[k]);
    free(gates);
    if (!rc) {
        char name[900];
        run_name(name, sizeof name, path);
        snprintf(x.title, sizeof x.title, "Training run — %s", name);
        snprintf(x.subtitle, sizeof x.subtitle, "loss of each logged batch; held-out accuracy (top-1, every answer token)%s",
                 x.n_gates ? "; gate statistics on held-out windows" : "");
        if (x.sel < x.L * x.H)
            snprintf(x.section, sizeof x.section, "Gate concentration during training: the first %d of %d (layer, KV head) pairs", x.sel,
                     x.L * x.H);
        else
            snprintf(x.section, sizeof x.section, "Gate concentration during training: every KV head (%d)", x.sel);
        if (x.perch) snprintf(x.section, sizeof x.section, "Per-channel gate concentration during training: %d layer%s", x.sel, x.sel == 1 ? "" : "s");
        ps_fig_chunks ch;
        snprintf(ch.command, sizeof ch.command, "phasescope train (log %s)", path);
        snprintf(ch.model, sizeof ch.model, "%s", path);
        snprintf(ch.title, sizeof ch.title, "%s", x.title);
        double W, H;
        train_size(&x, &W, &H);
        ps_fig f;
        for (int k = 0; !rc && k < ps_fig_n_files(o); k++)
            if (!(rc = ps_fig_file_open(&f, out, "training", W, H, o, k, err))) {
                draw_training(f.cr, &x);
                rc = ps_fig_file_close(&f, &ch, verbose, err);
            }
    }
    free_train(&x);
    return rc;
}
