#define _POSIX_C_SOURCE 200809L
#include "viz/draw.h"

#include <cairo-pdf.h>
#include <cairo-svg.h>
#include <errno.h>
#include <math.h>
#include <png.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/fileio.h"

int ps_fig_begin(ps_fig *f, double w, double h, ps_fig_format fmt, const char *path, ps_error *err) {
    memset(f, 0, sizeof *f);
    if (!(w >= 1 && w <= PS_FIG_MAX_SIDE && h >= 1 && h <= PS_FIG_MAX_SIDE))
        return ps_fail(err, "%s: a %.0f x %.0f px figure is larger than a figure can be (at most %.0f px a side)", path, w,
                       h, PS_FIG_MAX_SIDE);
    f->w = w;
    f->h = h;
    f->format = fmt;
    if (strlen(path) >= sizeof f->path) return ps_fail(err, "%s: path too long", path);
    strcpy(f->path, path);
    snprintf(f->tmp, sizeof f->tmp, "%s.tmp%d", path, (int)getpid());
    if (fmt == PS_FMT_PNG) f->surface = cairo_image_surface_create(CAIRO_FORMAT_ARGB32, (int)ceil(w), (int)ceil(h));
    else if (fmt == PS_FMT_PDF) f->surface = cairo_pdf_surface_create(f->tmp, w, h);
    else f->surface = cairo_svg_surface_create(f->tmp, w, h);
    if (cairo_surface_status(f->surface) != CAIRO_STATUS_SUCCESS) {
        cairo_surface_destroy(f->surface);
        f->surface = NULL;
        return ps_fail(err, "%s: cannot create the figure surface", path);
    }
    f->cr = cairo_create(f->surface);
    if (cairo_status(f->cr) != CAIRO_STATUS_SUCCESS) {
        ps_fig_abort(f);
        return ps_fail(err, "%s: cannot create the drawing context", path);
    }
    cairo_set_source_rgb(f->cr, 1, 1, 1);
    cairo_paint(f->cr);
    cairo_set_source_rgb(f->cr, 0, 0, 0);
    return 0;
}

void ps_fig_abort(ps_fig *f) {
    if (f->cr) cairo_destroy(f->cr);
    if (f->surface) cairo_surface_destroy(f->surface);
    if (f->format != PS_FMT_PNG) unlink(f->tmp);
    f->cr = NULL;
    f->surface = NULL;
}

void ps_png_set_free(ps_png_set *s) {
    for (int i = 0; i < s->n; i++) free(s->files[i].data);
    free(s->files);
    memset(s, 0, sizeof *s);
}

const ps_png_file *ps_png_set_find(const ps_png_set *s, const char *name) {
    for (int i = 0; s && name && i < s->n; i++)
        if (!strcmp(s->files[i].name, name)) return &s->files[i];
    return NULL;
}

/* libpng's writer into a growing buffer (ps_fig.mem) */
typedef struct {
    unsigned char *data;
    size_t len, cap;
    int oom;
} png_buf;

static void png_buf_write(png_structp png, png_bytep data, png_size_t n) {
    png_buf *b = png_get_io_ptr(png);
    if (b->oom) return;
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? 2 * b->cap : 65536;
        while (cap < b->len + n) cap *= 2;
        unsigned char *d = realloc(b->data, cap);
        if (!d) {
            b->oom = 1;
            return;
        }
        b->data = d, b->cap = cap;
    }
    memcpy(b->data + b->len, data, n);
    b->len += n;
}

static void png_buf_flush(png_structp png) { (void)png; }

/* the PNG into f->mem under the path's base name (replacing one of that name) */
static int keep_png(ps_fig *f, png_buf *b, ps_error *err) {
    if (b->oom) return ps_fail(err, "%s: out of memory for the PNG", f->path);
    const char *base = strrchr(f->path, '/');
    base = base ? base + 1 : f->path;
    ps_png_set *s = f->mem;
    int at = s->n;
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->files[i].name, base)) at = i;
    if (at == s->n && s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 4;
        ps_png_file *nf = realloc(s->files, (size_t)cap * sizeof *nf);
        if (!nf) return ps_fail(err, "%s: out of memory", f->path);
        s->files = nf, s->cap = cap;
    }
    if (at == s->n) s->n++;
    else free(s->files[at].data);
    if (strlen(base) >= sizeof s->files[at].name) return ps_fail(err, "%s: the figure's name is too long", f->path);
    memcpy(s->files[at].name, base, strlen(base) + 1);
    s->files[at].data = b->data;
    s->files[at].len = b->len;
    b->data = NULL;
    return 0;
}

static int write_png(ps_fig *f, const char *const *keys, const char *const *vals, int n_text, ps_error *err) {
    cairo_surface_flush(f->surface);
    int W = cairo_image_surface_get_width(f->surface), H = cairo_image_surface_get_height(f->surface);
    int stride = cairo_image_surface_get_stride(f->surface);
    const unsigned char *data = cairo_image_surface_get_data(f->surface);
    ps_atomic_file af = {0};
    png_buf *const mb = f->mem ? calloc(1, sizeof *mb) : NULL; /* on the heap: it changes between setjmp and longjmp */
    if (f->mem && !mb) return ps_fail(err, "%s: out of memory", f->path);
    if (!f->mem && ps_atomic_open(&af, f->path, err)) return -1;
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    unsigned char *row = malloc((size_t)W * 3);
    png_text *volatile txt = NULL;
    if (!png || !info || !row) {
        png_destroy_write_struct(&png, &info);
        free(row);
        if (mb) free(mb->data), free(mb);
        else ps_atomic_abort(&af);
        return ps_fail(err, "%s: out of memory", f->path);
    }
    if (setjmp(png_jmpbuf(png))) {
        png_destroy_write_struct(&png, &info);
        free(txt);
        free(row);
        if (mb) free(mb->data), free(mb);
        else ps_atomic_abort(&af);
        return ps_fail(err, "%s: PNG write failed", f->path);
    }
    if (mb) png_set_write_fn(png, mb, png_buf_write, png_buf_flush);
    else png_init_io(png, af.f);
    png_set_IHDR(png, info, (png_uint_32)W, (png_uint_32)H, 8, PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
                 PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    txt = calloc((size_t)(n_text ? n_text : 1), sizeof *txt);
    if (!txt) png_error(png, "out of memory");
    for (int i = 0; i < n_text; i++) {
        txt[i].compression = PNG_TEXT_COMPRESSION_NONE;
        txt[i].key = (char *)keys[i];
        txt[i].text = (char *)vals[i];
    }
    png_set_text(png, info, txt, n_text);
    png_write_info(png, info);
    for (int y = 0; y < H; y++) {
        const uint32_t *src = (const uint32_t *)(data + (size_t)y * (size_t)stride);
        for (int x = 0; x < W; x++) { /* opaque (white background): premultiplied = straight */
            row[3 * x] = (unsigned char)((src[x] >> 16) & 0xff);
            row[3 * x + 1] = (unsigned char)((src[x] >> 8) & 0xff);
            row[3 * x + 2] = (unsigned char)(src[x] & 0xff);
        }
        png_write_row(png, row);
    }
    png_write_end(png, info);
    png_destroy_write_struct(&png, &info);
    free(txt);
    free(row);
    if (mb) {
        int rc = keep_png(f, mb, err);
        free(mb->data);
        free(mb);
        return rc;
    }
    return ps_atomic_commit(&af, err);
}

int ps_fig_end(ps_fig *f, const char *const *keys, const char *const *vals, int n_text, ps_error *err) {
    int rc = 0;
    if (f->format == PS_FMT_PNG) rc = write_png(f, keys, vals, n_text, err);
    cairo_destroy(f->cr);
    f->cr = NULL;
    cairo_surface_finish(f->surface);
    if (f->format != PS_FMT_PNG && !rc) {
        if (cairo_surface_status(f->surface) != CAIRO_STATUS_SUCCESS) rc = ps_fail(err, "%s: cairo could not write the file", f->path);
        else if (rename(f->tmp, f->path) != 0) rc = ps_fail(err, "%s: cannot rename into place: %s", f->path, strerror(errno));
    }
    cairo_surface_destroy(f->surface);
    f->surface = NULL;
    if (rc && f->format != PS_FMT_PNG) unlink(f->tmp);
    return rc;
}

/* viridis: a 6th-order polynomial fit of matplotlib's map (max error well under one 8-bit level) */
ps_rgb ps_viridis(double t) {
    t = t < 0 ? 0 : t > 1 ? 1 : t;
    static const double c[7][3] = {{0.2777273272234177, 0.005407344544966578, 0.3340998053353061},
                                   {0.1050930431085774, 1.404613529898575, 1.384590162594685},
                                   {-0.3308618287255563, 0.214847559468213, 0.09509516302823659},
                                   {-4.634230498983486, -5.799100973351585, -19.33244095627987},
                                   {6.228269936347081, 14.17993336680509, 56.69055260068105},
                                   {4.776384997670288, -13.74514537774601, -65.35303263337234},
                                   {-5.435455855934631, 4.645852612178535, 26.3124352495832}};
    double o[3];
    for (int k = 0; k < 3; k++) {
        double v = c[6][k];
        for (int i = 5; i >= 0; i--) v = v * t + c[i][k];
        o[k] = v < 0 ? 0 : v > 1 ? 1 : v;
    }
    return (ps_rgb){o[0], o[1], o[2]};
}

/* Blue–white–orange, 11 anchors, linear in between: ColorBrewer RdBu's blue half below the centre and
 * PuOr's orange half above it (blue against orange stays distinct under every common colour-vision
 * deficiency, unlike red against green). */
ps_rgb ps_diverging(double t) {
    static const double a[11][3] = {{0x05, 0x30, 0x61}, {0x21, 0x66, 0xac}, {0x43, 0x93, 0xc3}, {0x92, 0xc5, 0xde},
                                    {0xd1, 0xe5, 0xf0}, {0xf7, 0xf7, 0xf7}, {0xfe, 0xe0, 0xb6}, {0xfd, 0xb8, 0x63},
                                    {0xe0, 0x82, 0x14}, {0xb3, 0x58, 0x06}, {0x7f, 0x3b, 0x08}};
    if (isnan(t)) t = 0.5;
    t = t < 0 ? 0 : t > 1 ? 1 : t;
    double x = t * 10;
    int i = (int)x;
    if (i >= 10) i = 9;
    double f = x - i;
    ps_rgb c = {(a[i][0] * (1 - f) + a[i + 1][0] * f) / 255, (a[i][1] * (1 - f) + a[i + 1][1] * f) / 255,
                (a[i][2] * (1 - f) + a[i + 1][2] * f) / 255};
    return c;
}

ps_rgb ps_diverging_rev(double t) { return ps_diverging(1 - t); }

/* Okabe & Ito (2008), "Color Universal Design" (black moved last) */
ps_rgb ps_okabe_ito(int i) {
    static const ps_rgb c[8] = {{0x00 / 255., 0x72 / 255., 0xb2 / 255.}, {0xe6 / 255., 0x9f / 255., 0x00 / 255.},
                                {0x00 / 255., 0x9e / 255., 0x73 / 255.}, {0xd5 / 255., 0x5e / 255., 0x00 / 255.},
                                {0xcc / 255., 0x79 / 255., 0xa7 / 255.}, {0x56 / 255., 0xb4 / 255., 0xe9 / 255.},
                                {0xf0 / 255., 0xe4 / 255., 0x42 / 255.}, {0, 0, 0}};
    return c[((i % 8) + 8) % 8];
}

void ps_set_rgb(cairo_t *cr, ps_rgb c) { cairo_set_source_rgb(cr, c.r, c.g, c.b); }

static void font(cairo_t *cr, double size, int bold) {
    cairo_select_font_face(cr, "DejaVu Sans", CAIRO_FONT_SLANT_NORMAL, bold ? CAIRO_FONT_WEIGHT_BOLD : CAIRO_FONT_WEIGHT_NORMAL);
    cairo_set_font_size(cr, size);
}

double ps_text_width(cairo_t *cr, const char *s, double size, int bold) {
    cairo_text_extents_t e;
    font(cr, size, bold);
    cairo_text_extents(cr, s, &e);
    return e.x_advance;
}

void ps_text(cairo_t *cr, double x, double y, const char *s, double size, double ax, double ay, double angle, int bold) {
    cairo_text_extents_t e;
    cairo_font_extents_t fe;
    font(cr, size, bold);
    cairo_text_extents(cr, s, &e);
    cairo_font_extents(cr, &fe);
    cairo_save(cr);
    cairo_translate(cr, x, y);
    cairo_rotate(cr, angle);
    double h = fe.ascent * 0.78; /* cap height, roughly */
    cairo_move_to(cr, -ax * e.x_advance, -ay * h + h);
    cairo_show_text(cr, s);
    cairo_restore(cr);
    cairo_new_path(cr); /* no current point left behind for the next shape */
}

int ps_tick_step(double cell, double label_w) {
    int k = 1;
    while (k * cell < label_w && k < 1 << 20) k++;
    return k;
}

void ps_heatmap(cairo_t *cr, double x, double y, double w, double h, const double *v, int rows, int cols,
                ps_rgb (*cmap)(double), double vmin, double vmax) {
    ps_heatmap_strided(cr, x, y, w, h, v, rows, cols, cols, 1, cmap, vmin, vmax);
}

void ps_heatmap_strided(cairo_t *cr, double x, double y, double w, double h, const double *v, int rows, int cols,
                        ptrdiff_t rstride, ptrdiff_t cstride, ps_rgb (*cmap)(double), double vmin, double vmax) {
    if (rows < 1 || cols < 1) return;
    double cw = w / cols, ch = h / rows;
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) {
            double val = v[(ptrdiff_t)r * rstride + (ptrdiff_t)c * cstride];
            if (isnan(val)) cairo_set_source_rgb(cr, 0.8, 0.8, 0.8);
            else {
                double t = vmax > vmin ? (val - vmin) / (vmax - vmin) : 0.5;
                ps_rgb col = cmap(t);
                cairo_set_source_rgb(cr, col.r, col.g, col.b);
            }
            /* snap to whole pixels so neighbouring cells leave no seams */
            double x0 = round(x + c * cw), x1 = round(x + (c + 1) * cw), y0 = round(y + r * ch), y1 = round(y + (r + 1) * ch);
            cairo_rectangle(cr, x0, y0, x1 - x0, y1 - y0);
            cairo_fill(cr);
        }
    cairo_set_source_rgb(cr, 0.3, 0.3, 0.3);
    cairo_set_line_width(cr, 1);
    cairo_rectangle(cr, round(x) + 0.5, round(y) + 0.5, round(x + w) - round(x) - 1, round(y + h) - round(y) - 1);
    cairo_stroke(cr);
    cairo_set_source_rgb(cr, 0, 0, 0);
}

void ps_format_p(char *buf, size_t n, double p) {
    if (isnan(p)) snprintf(buf, n, "n/a");
    else if (p < 1e-300) snprintf(buf, n, "< 1e-300");
    else snprintf(buf, n, "%.3g", p);
}

void ps_fmt_num(char *buf, size_t n, double v) {
    if (fabs(v) < 1e-12) v = 0;
    if (v != 0 && (fabs(v) >= 1e4 || fabs(v) < 1e-3)) snprintf(buf, n, "%.1e", v);
    else snprintf(buf, n, "%g", round(v * 1e6) / 1e6);
}

int ps_nice_ticks(double lo, double hi, int target, double *ticks, int max) {
    if (!(hi > lo)) {
        ticks[0] = lo;
        return 1;
    }
    double raw = (hi - lo) / (target > 1 ? target : 1), mag = pow(10, floor(log10(raw))), step = mag;
    double cand[4] = {1, 2, 2.5, 5};
    for (int i = 0; i < 4; i++)
        if (cand[i] * mag >= raw) {
            step = cand[i] * mag;
            break;
        }
    if (step < raw) step = 10 * mag;
    int n = 0;
    for (double t = ceil(lo / step - 1e-9) * step; t <= hi + step * 1e-9 && n < max; t += step) ticks[n++] = t;
    return n;
}

double ps_colorbar(cairo_t *cr, double x, double y, double w, double h, ps_rgb (*cmap)(double), double vmin, double vmax,
                   const char *label) {
    int steps = (int)h;
    for (int i = 0; i < steps; i++) {
        ps_rgb c = cmap(1.0 - (i + 0.5) / steps);
        cairo_set_source_rgb(cr, c.r, c.g, c.b);
        cairo_rectangle(cr, x, y + i, w, 1.01);
        cairo_fill(cr);
    }
    cairo_set_source_rgb(cr, 0.3, 0.3, 0.3);
    cairo_set_line_width(cr, 1);
    cairo_rectangle(cr, x + 0.5, y + 0.5, w - 1, h - 1);
    cairo_stroke(cr);
    double ticks[32];
    int n = vmax > vmin ? ps_nice_ticks(vmin, vmax, 5, ticks, 32) : 0;
    cairo_set_source_rgb(cr, 0, 0, 0);
    for (int i = 0; i < n; i++) {
        double ty = y + h * (1 - (ticks[i] - vmin) / (vmax - vmin));
        cairo_move_to(cr, x + w, round(ty) + 0.5);
        cairo_line_to(cr, x + w + 4, round(ty) + 0.5);
        cairo_stroke(cr);
        char buf[32];
        ps_fmt_num(buf, sizeof buf, ticks[i]);
        ps_text(cr, x + w + 7, ty, buf, 12, 0, 0.5, 0, 0);
    }
    double maxw = 0;
    for (int i = 0; i < n; i++) {
        char buf[32];
        ps_fmt_num(buf, sizeof buf, ticks[i]);
        maxw = fmax(maxw, ps_text_width(cr, buf, 12, 0));
    }
    ps_text(cr, x + w + 14 + maxw, y + h / 2, label, 13, 0.5, 0, -M_PI / 2, 0);
    return w + 14 + maxw + 16;
}
