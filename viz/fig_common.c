/* fig_common.c — the figure modules' shared pieces (viz/fig_common.h). */
#define _POSIX_C_SOURCE 200809L
#include "viz/fig_common.h"

#include <libgen.h>
#include <stdio.h>
#include <string.h>

#include "core/fileio.h"
#include "core/runtime.h"

double ps_fig_num(json_t *o, const char *k) { return json_number_value(json_object_get(o, k)); }


void ps_fig_make_chunks(ps_fig_chunks *c, json_t *prov, const char *title) {
    snprintf(c->command, sizeof c->command, "%s", json_string_value(json_object_get(prov, "command")) ?: "");
    snprintf(c->model, sizeof c->model, "%s", json_string_value(json_object_get(prov, "model")) ?: "");
    snprintf(c->title, sizeof c->title, "%s", title);
}

/* Draw into OUT/name.png (and .pdf/.svg when asked). */
int ps_fig_n_files(const ps_render_opts *o) { return o && o->vector && !o->mem ? 2 : 1; }

int ps_fig_file_open(ps_fig *f, const char *out_dir, const char *name, double w, double h, const ps_render_opts *o, int k,
                     ps_error *err) {
    int mem = o && o->mem;
    if (k == 0 && !mem && ps_mkdir(out_dir, err)) return -1;
    ps_fig_format fmt = k ? o->format : PS_FMT_PNG;
    char file[600], path[4800];
    snprintf(file, sizeof file, "%s.%s", name, fmt == PS_FMT_PNG ? "png" : fmt == PS_FMT_PDF ? "pdf" : "svg");
    if (ps_path_join(path, sizeof path, out_dir, file, err)) return -1;
    if (ps_fig_begin(f, w, h, fmt, path, err)) return -1;
    if (mem) f->mem = o->mem;
    return 0;
}

int ps_fig_file_close(ps_fig *f, const ps_fig_chunks *ch, int verbose, ps_error *err) {
    const char *keys[] = {"Title", "Software", "Command", "Model"};
    const char *vals[] = {ch->title, "phasescope " PS_VERSION, ch->command, ch->model};
    if (ps_fig_end(f, keys, vals, 4, err)) return -1;
    if (verbose && !f->mem) printf("wrote %s\n", f->path);
    return 0;
}

/* Text width before a figure exists (for sizing the canvas). */
double ps_fig_measure(const char *s, double size, int bold) {
    cairo_surface_t *sf = cairo_image_surface_create(CAIRO_FORMAT_ARGB32, 1, 1);
    cairo_t *cr = cairo_create(sf);
    double w = cairo_status(cr) == CAIRO_STATUS_SUCCESS ? ps_text_width(cr, s, size, bold) : 0.6 * size * (double)strlen(s);
    cairo_destroy(cr);
    cairo_surface_destroy(sf);
    return w;
}

/* The largest font size <= size (down to 8) at which s fits in maxw. */
double ps_fig_fit(cairo_t *cr, const char *s, double size, double maxw, int bold) {
    while (size > 8 && ps_text_width(cr, s, size, bold) > maxw) size -= 0.5;
    return size;
}

void ps_fig_ellipsize(cairo_t *cr, const char *s, double size, double maxw, int bold, char *out, size_t n) {
    snprintf(out, n, "%s", s);
    size_t l = strlen(out);
    while (l > 0 && ps_text_width(cr, out, size, bold) > maxw) {
        do l--; /* back to the start of a UTF-8 character */
        while (l > 0 && ((unsigned char)out[l] & 0xC0) == 0x80);
        if (l + 4 > n) continue;
        memcpy(out + l, "\u2026", 4); /* "…" (3 bytes) and the terminator */
    }
}

void ps_fig_model_name(char *buf, size_t n, json_t *prov) {
    char tmp[2048], lab[sizeof ((ps_model_desc *)0)->label];
    snprintf(tmp, sizeof tmp, "%s", json_string_value(json_object_get(prov, "model")) ?: "model");
    size_t l = strlen(tmp);
    while (l > 1 && tmp[l - 1] == '/') tmp[--l] = '\0';
    const char *b = basename(tmp);
    /* the label the result carries, or the one core's families give its config (core/runtime.h) */
    if (!ps_label_from_provenance(prov, lab, sizeof lab, NULL, 0) && lab[0]) snprintf(buf, n, "%s (%s)", b, lab);
    else snprintf(buf, n, "%s", b);
}

void ps_fig_line(cairo_t *cr, double x0, double y0, double x1, double y1) {
    cairo_move_to(cr, x0, y0);
    cairo_line_to(cr, x1, y1);
    cairo_stroke(cr);
}


/* A polyline in data coordinates, clipped a few pixels outside the plot area (so values on its edge
 * stay visible on top of the frame). xs, ys: n values with strides. */
void ps_fig_polyline(cairo_t *cr, const double *xs, const double *ys, ptrdiff_t ystride, int n, double x, double y, double w,
                     double h, double x0, double x1, double y0, double y1) {
    cairo_save(cr);
    cairo_rectangle(cr, x - 4, y - 4, w + 8, h + 8);
    cairo_clip(cr);
    for (int i = 0; i < n; i++) {
        double xx = x + w * (xs[i] - x0) / (x1 - x0), yy = y + h * (1 - (ys[i * ystride] - y0) / (y1 - y0));
        if (i == 0) cairo_move_to(cr, xx, yy);
        else cairo_line_to(cr, xx, yy);
    }
    cairo_stroke(cr);
    cairo_restore(cr);
}
