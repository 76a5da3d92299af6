/* test_viz.c — figures (SPEC §8): PNGs decode with libpng and carry the provenance text chunks; a
 * heatmap of a known matrix has the expected colours at cell centres; colour maps are what they claim
 * (viridis end points, white centre of the blue–orange diverging map, Okabe-Ito lines); rendering the
 * same result twice gives the same bytes; the vector outputs are valid PDF and SVG. Pixel probes: a
 * rendered knockout heatmap has each cell's colour-map colour at the cell's centre (each panel on its
 * own scale, panels equally tall), a rendered phase curve has its colour where its data points map
 * (a point at accuracy 1.0 included, inside the frame). Inputs with dimensions beyond a figure (the
 * crafted gates file that once overflowed an int) fail with an error naming the file and field. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <png.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "viz/draw.h"
#include "viz/fig_common.h"
#include "viz/figures.h"
#include "viz/tradeoff.h"
#include "core/fileio.h"
#include "core/runtime.h"
#include "testutil.h"

static char TMP[512];

typedef struct {
    int w, h;
    unsigned char *rgb;
    int n_text;
    char keys[8][80], vals[8][512];
} png_img;

static int read_png(const char *path, png_img *img) {
    memset(img, 0, sizeof *img);
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
    png_infop info = png_create_info_struct(png);
    if (setjmp(png_jmpbuf(png))) {
        png_destroy_read_struct(&png, &info, NULL);
        fclose(f);
        return -1;
    }
    png_init_io(png, f);
    png_read_info(png, info);
    img->w = (int)png_get_image_width(png, info);
    img->h = (int)png_get_image_height(png, info);
    if (png_get_color_type(png, info) != PNG_COLOR_TYPE_RGB || png_get_bit_depth(png, info) != 8) longjmp(png_jmpbuf(png), 1);
    img->rgb = malloc((size_t)img->w * img->h * 3);
    for (int y = 0; y < img->h; y++) png_read_row(png, img->rgb + (size_t)y * img->w * 3, NULL);
    png_read_end(png, info);
    png_textp t;
    int n = 0;
    png_get_text(png, info, &t, &n);
    for (int i = 0; i < n && i < 8; i++) {
        snprintf(img->keys[i], 80, "%s", t[i].key);
        snprintf(img->vals[i], 512, "%s", t[i].text);
    }
    img->n_text = n;
    png_destroy_read_struct(&png, &info, NULL);
    fclose(f);
    return 0;
}

static const char *text_of(const png_img *img, const char *key) {
    for (int i = 0; i < img->n_text && i < 8; i++)
        if (!strcmp(img->keys[i], key)) return img->vals[i];
    return NULL;
}

static void test_colormaps(void) {
    ps_rgb a = ps_viridis(0), b = ps_viridis(1), m = ps_diverging(0.5), lo = ps_diverging(0), hi = ps_diverging(1);
    /* matplotlib viridis: #440154 at 0, #fde725 at 1 */
    CHECK(fabs(a.r * 255 - 0x44) < 3 && fabs(a.g * 255 - 0x01) < 3 && fabs(a.b * 255 - 0x54) < 3, "viridis(0)");
    CHECK(fabs(b.r * 255 - 0xfd) < 3 && fabs(b.g * 255 - 0xe7) < 3 && fabs(b.b * 255 - 0x25) < 5, "viridis(1)");
    CHECK(m.r > 0.95 && m.g > 0.95 && m.b > 0.95, "diverging centre is white");
    CHECK(lo.b > lo.r && hi.r > hi.b, "blue below zero, orange above");
    CHECK(hi.r > hi.g && hi.g > hi.b && lo.g > lo.r, "the positive end is orange (not red), the negative end blue");
    ps_rgb rv = ps_diverging_rev(0);
    CHECK(rv.r == hi.r && rv.g == hi.g && rv.b == hi.b, "reversed map");
    ps_rgb ok0 = ps_okabe_ito(0), ok1 = ps_okabe_ito(1);
    CHECK(lround(ok0.r * 255) == 0x00 && lround(ok0.g * 255) == 0x72 && lround(ok0.b * 255) == 0xb2, "Okabe-Ito blue");
    CHECK(lround(ok1.r * 255) == 0xe6 && lround(ok1.g * 255) == 0x9f && lround(ok1.b * 255) == 0x00, "Okabe-Ito orange");
    char buf[64];
    ps_format_p(buf, sizeof buf, NAN);
    CHECK(!strcmp(buf, "n/a"), "p = NaN prints \"%s\"", buf);
    ps_period_text(buf, sizeof buf, 0, NAN, 0);
    CHECK(strstr(buf, "no period") && strstr(buf, "< 1e-300") && !strstr(buf, "= 0"), "no period: \"%s\"", buf);
    ps_period_text(buf, sizeof buf, 1, 8, 0.5);
    CHECK(strstr(buf, "period 8") && strstr(buf, "= 0.5"), "period 8: \"%s\"", buf);
    /* viridis gets lighter monotonically (perceptual ordering) */
    double prev = -1;
    int mono = 1;
    for (int i = 0; i <= 20; i++) {
        ps_rgb c = ps_viridis(i / 20.0);
        double lum = 0.2126 * c.r + 0.7152 * c.g + 0.0722 * c.b;
        mono &= lum > prev;
        prev = lum;
    }
    CHECK(mono, "viridis luminance increases");
}

static void test_heatmap_pixels(void) {
    char path[1024];
    snprintf(path, sizeof path, "%s/heat.png", TMP);
    ps_fig f;
    ps_error err;
    CHECK_OK(ps_fig_begin(&f, 200, 100, PS_FMT_PNG, path, &err), &err);
    double v[6] = {-1, 0, 1, 0.5, -0.5, 0.25};
    ps_heatmap(f.cr, 20, 10, 150, 80, v, 2, 3, ps_diverging, -1, 1);
    const char *k[] = {"Command", "Model"}, *vals[] = {"phasescope test --x 1", "tests/model"};
    CHECK_OK(ps_fig_end(&f, k, vals, 2, &err), &err);
    png_img img;
    CHECK(read_png(path, &img) == 0 && img.w == 200 && img.h == 100, "PNG does not decode");
    int bad = 0;
    for (int r = 0; r < 2; r++)
        for (int c = 0; c < 3; c++) {
            int x = (int)(20 + (c + 0.5) * 50), y = (int)(10 + (r + 0.5) * 40);
            ps_rgb want = ps_diverging((v[r * 3 + c] + 1) / 2);
            unsigned char *px = img.rgb + ((size_t)y * img.w + x) * 3;
            if (abs(px[0] - (int)lround(want.r * 255)) > 1 || abs(px[1] - (int)lround(want.g * 255)) > 1 ||
                abs(px[2] - (int)lround(want.b * 255)) > 1)
                bad++;
        }
    CHECK(bad == 0, "%d heatmap cells have the wrong colour at their centre", bad);
    CHECK(text_of(&img, "Command") && !strcmp(text_of(&img, "Command"), "phasescope test --x 1") && text_of(&img, "Model"),
          "text chunks missing");
    free(img.rgb);
}

static void write_text(const char *path, const char *s) {
    ps_error err;
    ps_write_file_atomic(path, s, strlen(s), &err);
}

/* a small sweep result, as the sweep command writes it */
static const char *SWEEP =
    "{\"kind\": \"sweep\", \"provenance\": {\"command\": \"phasescope sweep --model m\", \"model\": \"runs/m\", "
    "\"config_hash\": \"0\", \"seed\": 0, \"version\": \"0\", \"config\": {\"attention\": {\"kind\": \"compressed\", "
    "\"window\": 4, \"stride\": 4, \"gate\": \"learned\"}}, \"eval\": {\"n_prompts\": 10, \"period\": 4, \"family\": \"repeat\", "
    "\"mode\": \"pad\"}}, \"curve\": {\"period\": 4, \"residues\": ["
    "{\"rho\": 0, \"n\": 10, \"correct\": 9, \"accuracy\": 0.9, \"wilson_lo\": 0.6, \"wilson_hi\": 0.98, \"mean_logprob\": -0.1},"
    "{\"rho\": 1, \"n\": 10, \"correct\": 1, \"accuracy\": 0.1, \"wilson_lo\": 0.02, \"wilson_hi\": 0.4, \"mean_logprob\": -3},"
    "{\"rho\": 2, \"n\": 10, \"correct\": 8, \"accuracy\": 0.8, \"wilson_lo\": 0.5, \"wilson_hi\": 0.95, \"mean_logprob\": -0.3},"
    "{\"rho\": 3, \"n\": 10, \"correct\": 7, \"accuracy\": 0.7, \"wilson_lo\": 0.4, \"wilson_hi\": 0.9, \"mean_logprob\": -0.5}],"
    "\"n\": 40, \"mean_accuracy\": 0.625, \"min_accuracy\": 0.1, \"max_accuracy\": 0.9, \"gap_pp\": 80, "
    "\"chi_square\": {\"statistic\": 15.5, \"df\": 3, \"p_value\": 0.0014}, "
    "\"dominant_period\": {\"period\": 4, \"frequency\": 1, \"power_fraction\": 0.6}}}";

static size_t file_bytes(const char *path, char **data) {
    size_t n = 0;
    ps_error err;
    if (ps_read_file(path, 1 << 26, data, &n, &err)) *data = NULL;
    return n;
}

static void test_render(void) {
    char json[1024], d1[1024], d2[1024], p1[1100], p2[1100];
    snprintf(json, sizeof json, "%s/sweep.json", TMP);
    snprintf(d1, sizeof d1, "%s/r1", TMP);
    snprintf(d2, sizeof d2, "%s/r2", TMP);
    write_text(json, SWEEP);
    ps_error err;
    const char *paths[2] = {json, json};
    CHECK_OK(ps_render(paths, 1, d1, NULL, 0, &err), &err);
    CHECK_OK(ps_render(paths, 1, d2, NULL, 0, &err), &err);
    snprintf(p1, sizeof p1, "%s/phase_curve.png", d1);
    snprintf(p2, sizeof p2, "%s/phase_curve.png", d2);
    char *a, *b;
    size_t na = file_bytes(p1, &a), nb = file_bytes(p2, &b);
    CHECK(a && b && na == nb && na > 1000 && !memcmp(a, b, na), "rendering the same JSON twice differs");
    free(a);
    free(b);
    png_img img;
    CHECK(read_png(p1, &img) == 0 && text_of(&img, "Command") && !strcmp(text_of(&img, "Command"), "phasescope sweep --model m") &&
              text_of(&img, "Model") && !strcmp(text_of(&img, "Model"), "runs/m") && text_of(&img, "Software"),
          "phase curve PNG lacks its provenance");
    free(img.rgb);
    /* two files: one figure with two curves */
    CHECK_OK(ps_render(paths, 2, d1, NULL, 0, &err), &err);
    /* vector versions */
    ps_render_opts o = {.format = PS_FMT_PDF, .vector = 1};
    CHECK_OK(ps_render(paths, 1, d1, &o, 0, &err), &err);
    o.format = PS_FMT_SVG;
    CHECK_OK(ps_render(paths, 1, d1, &o, 0, &err), &err);
    snprintf(p1, sizeof p1, "%s/phase_curve.pdf", d1);
    snprintf(p2, sizeof p2, "%s/phase_curve.svg", d1);
    na = file_bytes(p1, &a);
    nb = file_bytes(p2, &b);
    CHECK(a && na > 100 && !memcmp(a, "%PDF-", 5), "PDF header");
    CHECK(b && nb > 100 && (strstr(b, "<svg") != NULL) && !memcmp(b, "<?xml", 5), "SVG header");
    free(a);
    free(b);
    /* errors */
    char bad[1024];
    snprintf(bad, sizeof bad, "%s/bad.json", TMP);
    write_text(bad, "{\"curve\": 1}");
    const char *bp[1] = {bad};
    CHECK_ERR(ps_render(bp, 1, d1, NULL, 0, &err), &err, "bad.json", "not a phasescope result");
    write_text(bad, "{\"kind\": \"sweep\", ");
    CHECK_ERR(ps_render(bp, 1, d1, NULL, 0, &err), &err, "bad.json", "not valid JSON");
    write_text(bad, "{\"kind\": \"banana\"}");
    CHECK_ERR(ps_render(bp, 1, d1, NULL, 0, &err), &err, "unknown result kind \"banana\"");
    /* which kinds share a figure, and which are drawn one at a time (the registry, viz/kinds.c): refused
     * before anything is drawn */
    static const struct {
        const char *first, *second, *want;
    } SHARE[] = {
        {"gatecycle", "sweep", "render: gate-cycling results are drawn one at a time"},
        {"gatecycle", "gatecycle", "render: gate-cycling results are drawn one at a time"},
        {"sweep", "gatecycle", "b.json: a gatecycle result cannot share a figure with a sweep result"},
        {"knockout", "sweep", "b.json: a sweep result cannot share a figure with a knockout result"},
        {"theory", "theory", "render: theory results are drawn one at a time"},
        {"gates", "gates", "render: gates results are drawn one at a time"},
        {"fillers", "fillers", "render: filler experiments are drawn one at a time"},
        {"banana", "banana", "a.json: unknown result kind \"banana\""},
        {"banana", "sweep", "b.json: a sweep result cannot share a figure with a banana result"},
    };
    const char *ab[2] = {"a.json", "b.json"};
    for (size_t i = 0; i < sizeof SHARE / sizeof SHARE[0]; i++) {
        json_t *docs[2] = {json_pack("{s:s}", "kind", SHARE[i].first), json_pack("{s:s}", "kind", SHARE[i].second)};
        CHECK_ERR(ps_render_docs(docs, ab, 2, d1, NULL, 0, &err), &err, SHARE[i].want);
        json_decref(docs[0]);
        json_decref(docs[1]);
    }
}


static int px_close(const png_img *img, double x, double y, ps_rgb want, int tol) {
    int xi = (int)floor(x), yi = (int)floor(y);
    if (xi < 0 || yi < 0 || xi >= img->w || yi >= img->h) return 0;
    const unsigned char *px = img->rgb + ((size_t)yi * img->w + xi) * 3;
    return abs(px[0] - (int)lround(want.r * 255)) <= tol && abs(px[1] - (int)lround(want.g * 255)) <= tol &&
           abs(px[2] - (int)lround(want.b * 255)) <= tol;
}

/* Is the colour anywhere within r pixels of (x, y)? */
static int px_near(const png_img *img, double x, double y, ps_rgb want, int r, int tol) {
    for (int dy = -r; dy <= r; dy++)
        for (int dx = -r; dx <= r; dx++)
            if (px_close(img, x + dx, y + dy, want, tol)) return 1;
    return 0;
}

/* A knockout result of one layer: rows heads, period P, delta_nll[r][c] = v[r * P + c]. */
static void knockout_json(char *out, size_t n, const char *model, int rows, int P, const double *v) {
    size_t o = (size_t)snprintf(out, n,
                                "{\"kind\": \"knockout\", \"provenance\": {\"command\": \"phasescope knockout\", \"model\": \"%s\", "
                                "\"config\": {\"attention\": {\"kind\": \"compressed\", \"window\": 4, \"stride\": 4}}}, "
                                "\"grid\": {\"period\": %d, \"target\": \"compressed\", \"cells\": [",
                                model, P);
    for (int r = 0; r < rows; r++) {
        o += (size_t)snprintf(out + o, n - o, "%s{\"layer\": 0, \"head\": %d, \"residues\": [", r ? "," : "", r);
        for (int c = 0; c < P; c++)
            o += (size_t)snprintf(out + o, n - o, "%s{\"rho\": %d, \"n\": 10, \"delta_nll\": %.17g, \"delta_accuracy_pp\": %.17g}",
                                  c ? "," : "", c, v[r * P + c], -10 * v[r * P + c]);
        o += (size_t)snprintf(out + o, n - o, "]}");
    }
    snprintf(out + o, n - o, "]}}");
}

static void test_knockout_pixels(void) {
    /* panel A: 2 heads x 4 residues, |max| 3; panel B: 4 heads x 4 residues, |max| 0.5 (its own scale) */
    double a[8] = {3, 0, -1.5, 0.75, 0, 1, 2, -3};
    double b[16] = {0.5, 0, 0, 0, 0, -0.25, 0, 0, 0, 0, 0.1, 0, 0, 0, 0, -0.5};
    static char ja[8192], jb[16384];
    knockout_json(ja, sizeof ja, "runs/a", 2, 4, a);
    knockout_json(jb, sizeof jb, "runs/b", 4, 4, b);
    char pa[1024], pb[1024], dir[1024], png[1100];
    snprintf(pa, sizeof pa, "%s/ko_a.json", TMP);
    snprintf(pb, sizeof pb, "%s/ko_b.json", TMP);
    snprintf(dir, sizeof dir, "%s/ko", TMP);
    write_text(pa, ja);
    write_text(pb, jb);
    const char *paths[2] = {pa, pb};
    ps_error err;
    REQUIRE_OK(ps_render(paths, 2, dir, NULL, 0, &err), &err);
    int rows[2] = {2, 4}, cols[2] = {4, 4};
    ps_rect heat[2];
    double W, H;
    REQUIRE_OK(ps_knockout_layout(2, rows, cols, heat, &W, &H, &err), &err);
    CHECK(heat[0].h == heat[1].h && heat[0].y == heat[1].y, "panels of 2 and 4 rows are not equally tall");
    snprintf(png, sizeof png, "%s/knockout_heatmap.png", dir);
    png_img img;
    if (read_png(png, &img)) {
        CHECK(0, "knockout heatmap does not decode");
        return;
    }
    CHECK(img.w == (int)ceil(W) && img.h == (int)ceil(H), "figure is %dx%d, layout says %.0fx%.0f", img.w, img.h, W, H);
    int bad = 0;
    for (int k = 0; k < 2; k++) {
        const double *v = k ? b : a;
        double vmax = k ? 0.5 : 3;
        for (int r = 0; r < rows[k]; r++)
            for (int c = 0; c < 4; c++) {
                double x = heat[k].x + (c + 0.5) * heat[k].w / 4, y = heat[k].y + (r + 0.5) * heat[k].h / rows[k];
                if (!px_close(&img, x, y, ps_knockout_color(v[r * 4 + c], vmax, 0), 1)) {
                    bad++;
                    fprintf(stderr, "  panel %d cell (%d, %d) = %g: wrong colour at (%.0f, %.0f)\n", k, r, c, v[r * 4 + c], x, y);
                }
            }
    }
    CHECK(bad == 0, "%d knockout cells differ from the colour map", bad);
    /* each panel on its own scale: both panels' largest harm is the darkest orange */
    ps_rgb top = ps_diverging(1);
    CHECK(px_close(&img, heat[0].x + 0.5 * heat[0].w / 4, heat[0].y + 0.5 * heat[0].h / 2, top, 1) &&
              px_close(&img, heat[1].x + 0.5 * heat[1].w / 4, heat[1].y + 0.5 * heat[1].h / 4, top, 1),
          "the largest NLL rise of each panel is not full orange");
    free(img.rgb);
    /* accuracy: a fall (harm) is orange too */
    ps_render_opts o = {.measure = "acc"};
    REQUIRE_OK(ps_render(paths, 1, dir, &o, 0, &err), &err);
    snprintf(png, sizeof png, "%s/knockout_heatmap_acc.png", dir);
    REQUIRE_OK(ps_knockout_layout(1, rows, cols, heat, &W, &H, &err), &err);
    if (read_png(png, &img) == 0) {
        /* cell (0, 0): NLL +3, accuracy -30 pp: harm; cell (1, 3): accuracy +30 pp: help */
        double x0 = heat[0].x + 0.5 * heat[0].w / 4, y0 = heat[0].y + 0.5 * heat[0].h / 2;
        double x1 = heat[0].x + 3.5 * heat[0].w / 4, y1 = heat[0].y + 1.5 * heat[0].h / 2;
        CHECK(px_close(&img, x0, y0, ps_knockout_color(-30, 30, 1), 1) && px_close(&img, x0, y0, ps_diverging(1), 1),
              "an accuracy fall is not drawn orange");
        CHECK(px_close(&img, x1, y1, ps_diverging(0), 1), "an accuracy rise is not drawn blue");
        free(img.rgb);
    } else
        CHECK(0, "accuracy heatmap does not decode");
}

static void test_curve_pixels(void) {
    /* the SWEEP result, plus residue 0 at accuracy 1.0: it must show inside the frame */
    char json[1024], dir[1024], png[1100];
    snprintf(json, sizeof json, "%s/sweep1.json", TMP);
    snprintf(dir, sizeof dir, "%s/curve", TMP);
    static char text[8192];
    snprintf(text, sizeof text, "%s", SWEEP);
    char *p = strstr(text, "\"correct\": 9, \"accuracy\": 0.9, \"wilson_lo\": 0.6, \"wilson_hi\": 0.98");
    if (!p) {
        CHECK(0, "test input changed");
        return;
    }
    const char *rep = "\"correct\": 9, \"accuracy\": 1.0, \"wilson_lo\": 0.7, \"wilson_hi\": 1.00";
    memcpy(p, rep, strlen(rep)); /* same length as the text it replaces */
    write_text(json, text);
    const char *paths[1] = {json};
    ps_error err;
    REQUIRE_OK(ps_render(paths, 1, dir, NULL, 0, &err), &err);
    snprintf(png, sizeof png, "%s/phase_curve.png", dir);
    png_img img;
    if (read_png(png, &img)) {
        CHECK(0, "phase curve does not decode");
        return;
    }
    double acc[4] = {1.0, 0.1, 0.8, 0.7};
    ps_rgb col = ps_okabe_ito(0);
    ps_rect a = ps_curve_area();
    int miss = 0;
    for (int r = 0; r < 4; r++) {
        double x = ps_curve_x(4, r), y = ps_curve_y(acc[r]);
        if (!(x > a.x && x < a.x + a.w && y > a.y + 3 && y < a.y + a.h - 3)) miss++;
        if (!px_close(&img, x, y, col, 2)) {
            miss++;
            fprintf(stderr, "  residue %d (accuracy %.1f): no curve colour at (%.1f, %.1f)\n", r, acc[r], x, y);
        }
    }
    CHECK(miss == 0, "%d data points are not where the plot-area mapping puts them", miss);
    /* and not everywhere: halfway between residues 1 and 2 at accuracy 0.95 is background */
    CHECK(!px_near(&img, (ps_curve_x(4, 1) + ps_curve_x(4, 2)) / 2, ps_curve_y(0.95), col, 1, 40),
          "curve colour where no curve runs");
    free(img.rgb);
}

/* The crash of issue 10: a ~17 KB gates file whose layers × heads × 2 × window overflowed an int in the
 * renderer. Now every dimension beyond a figure is refused with the file and field named. */
static void test_huge_dimensions(void) {
    char path[1024], dir[1024];
    snprintf(path, sizeof path, "%s/huge_gates.json", TMP);
    snprintf(dir, sizeof dir, "%s/huge", TMP);
    size_t cap = 1 << 16, o = 0;
    char *s = malloc(cap);
    if (!s) return;
    o += (size_t)snprintf(s + o, cap - o, "{\"kind\": \"gates\", \"gates\": {\"window\": 4096, \"layers\": [{\"heads\": [");
    for (int h = 0; h < 4096; h++) o += (size_t)snprintf(s + o, cap - o, "%s{}", h ? "," : "");
    o += (size_t)snprintf(s + o, cap - o, "]}");
    for (int l = 1; l < 1000; l++) o += (size_t)snprintf(s + o, cap - o, ",{}");
    snprintf(s + o, cap - o, "]}}");
    CHECK(strlen(s) > 10000 && strlen(s) < 30000, "crafted file is %zu bytes", strlen(s));
    write_text(path, s);
    const char *paths[1] = {path};
    ps_error err;
    CHECK_ERR(ps_render(paths, 1, dir, NULL, 0, &err), &err, "huge_gates.json", "gates.layers", "figure");
    /* each dimension on its own */
    write_text(path, "{\"kind\": \"gates\", \"gates\": {\"window\": 2000000000, \"layers\": [{\"heads\": [{}]}]}}");
    CHECK_ERR(ps_render(paths, 1, dir, NULL, 0, &err), &err, "huge_gates.json", "gates.window");
    o = (size_t)snprintf(s, cap, "{\"kind\": \"gates\", \"gates\": {\"window\": 8, \"layers\": [{\"heads\": [");
    for (int h = 0; h < 200; h++) o += (size_t)snprintf(s + o, cap - o, "%s{}", h ? "," : "");
    o += (size_t)snprintf(s + o, cap - o, "]}");
    for (int l = 1; l < 100; l++) o += (size_t)snprintf(s + o, cap - o, ",{}");
    snprintf(s + o, cap - o, "]}}");
    write_text(path, s);
    CHECK_ERR(ps_render(paths, 1, dir, NULL, 0, &err), &err, "huge_gates.json", "layers × heads");
    free(s);
    write_text(path, "{\"kind\": \"knockout\", \"grid\": {\"period\": 2147483647, \"cells\": [{}]}}");
    CHECK_ERR(ps_render(paths, 1, dir, NULL, 0, &err), &err, "huge_gates.json", "grid.period");
    write_text(path, "{\"kind\": \"theory\", \"steps\": [1], \"heads\": [{\"key_gate\": [[1]]}]}");
    CHECK_OK(ps_render(paths, 1, dir, NULL, 0, &err), &err); /* a tiny theory result draws */
    ps_fig f;
    CHECK_ERR(ps_fig_begin(&f, 1e6, 100, PS_FMT_PNG, path, &err), &err, "larger than a figure");
}

/* Gate cycling: the title names k and the cycled heads (from cycle.heads when present). */
static void test_gatecycle_title(void) {
    char path[1024], dir[1024], png[1100];
    snprintf(path, sizeof path, "%s/gatecycle.json", TMP);
    snprintf(dir, sizeof dir, "%s/gc", TMP);
    const char *cur = strstr(SWEEP, "\"curve\": ") + 9;
    size_t cl = strlen(cur) - 1; /* the curve object, without the document's closing brace */
    static char text[16384];
    for (int with = 0; with < 2; with++) {
        snprintf(text, sizeof text,
                 "{\"kind\": \"gatecycle\", \"provenance\": {\"model\": \"runs/m\", \"config\": {\"n_kv_heads\": 6}}, "
                 "\"cycle\": {\"layer\": 1, \"shift\": -1, \"head\": \"all\", %s\"branch\": \"both\", \"params\": \"all\"}, "
                 "\"before\": %.*s, \"after\": %.*s, %s\"best_shift\": 0, \"best_shift_signed\": 0, \"best_shift_correlation\": 0.5}",
                 with ? "\"heads\": [5, 1, 2, 3], " : "", (int)cl, cur, (int)cl, cur,
                 with ? "\"dips\": [{\"before\": 1, \"after\": 0, \"moved_by\": -1, \"still_dips_after\": false}], \"new_dips\": [], " : "");
        write_text(path, text);
        const char *paths[1] = {path};
        ps_error err;
        REQUIRE_OK(ps_render(paths, 1, dir, NULL, 0, &err), &err);
        snprintf(png, sizeof png, "%s/gatecycle_curve.png", dir);
        png_img img;
        if (read_png(png, &img)) {
            CHECK(0, "gatecycle figure does not decode");
            return;
        }
        const char *t = text_of(&img, "Title");
        CHECK(t && strstr(t, "k = -1") && strstr(t, "layer 1") && strstr(t, with ? "heads 1–3, 5" : "all 6 KV heads") &&
                  !strstr(t, TMP),
              "gatecycle title \"%s\"", t ? t : "");
        free(img.rgb);
    }
}

/* the model's name in titles and legends: its attention named, staggered grids with their offsets */
static void test_model_names(void) {
    struct { const char *att; const char *want; } v[] = {
        {"{\"kind\": \"compressed\", \"window\": 8, \"stride\": 8}", "m (W8/S8)"},
        {"{\"kind\": \"compressed\", \"window\": 8, \"stride\": 8, \"head_offsets\": [0, 0]}", "m (W8/S8)"},
        {"{\"kind\": \"compressed\", \"window\": 8, \"stride\": 8, \"head_offsets\": [0, 1, 2, 3]}", "m (W8/S8, staggered 0–3)"},
        {"{\"kind\": \"compressed\", \"window\": 4, \"stride\": 4, \"head_offsets\": [0, 3], \"gate\": \"uniform\"}",
         "m (W4/S4, offsets 0,3, uniform gate)"},
        {"{\"kind\": \"full\"}", "m (full attention)"},
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        char js[512], name[400];
        snprintf(js, sizeof js, "{\"model\": \"data/models/m/\", \"config\": {\"attention\": %s}}", v[i].att);
        json_error_t je;
        json_t *prov = json_loads(js, 0, &je);
        CHECK(prov != NULL, "%s: %s", js, je.text);
        ps_fig_model_name(name, sizeof name, prov);
        CHECK(!strcmp(name, v[i].want), "model name \"%s\", want \"%s\"", name, v[i].want);
        json_decref(prov);
    }
}

/* The trade-off figure: a run's checkpoints share a colour (the legend group drops "_rule" and a seed suffix
 * "_sN"), the one at the rule is a ring (its centre stays near white, its rim has the colour), the end of
 * training a disc (its centre has the colour at 55 % over white); a ninth group is refused by name. */
static void test_tradeoff_pixels(void) {
    static const struct { const char *name, *group; int rule; } names[] = {
        {"deep_select_s1_rule", "deep_select", 1}, {"deep_select_s12", "deep_select", 0}, {"deep_w8s8", "deep_w8s8", 0},
        {"rule", "rule", 0}, {"x_rule_s2", "x_rule", 0}, {"_s", "_s", 0}, {"a_s3_rule", "a", 1}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char g[64];
        int r = ps_tradeoff_group(g, sizeof g, names[i].name);
        CHECK(r == names[i].rule && !strcmp(g, names[i].group), "group of %s: %s (rule %d), want %s (%d)", names[i].name, g, r,
              names[i].group, names[i].rule);
    }
    ps_tradeoff_point pts[3] = {{.group = "a", .mean = 0.55, .gap_pp = 75, .kv_bytes = 768},
                                {.group = "a", .mean = 0.85, .gap_pp = 35, .kv_bytes = 6144, .hollow = 1},
                                {.group = "b", .mean = 0.65, .gap_pp = 55, .kv_bytes = 768}}; /* off the grid lines */
    char path[1024];
    snprintf(path, sizeof path, "%s/tradeoff.png", TMP);
    ps_error err;
    REQUIRE_OK(ps_fig_tradeoff(path, "t", "c", pts, 3, &err), &err);
    png_img img;
    if (read_png(path, &img)) {
        CHECK(0, "trade-off figure does not decode");
        return;
    }
    ps_rgb c0 = ps_okabe_ito(0), c1 = ps_okabe_ito(1);
    ps_rgb fill0 = {1 - 0.55 * (1 - c0.r), 1 - 0.55 * (1 - c0.g), 1 - 0.55 * (1 - c0.b)};
    ps_rgb fill1 = {1 - 0.55 * (1 - c1.r), 1 - 0.55 * (1 - c1.g), 1 - 0.55 * (1 - c1.b)};
    ps_rgb ring_in = {1 - 0.08 * (1 - c0.r), 1 - 0.08 * (1 - c0.g), 1 - 0.08 * (1 - c0.b)};
    double x, y;
    ps_tradeoff_xy(pts, 3, 0, &x, &y);
    CHECK(px_close(&img, x, y, fill0, 3), "the end-of-training disc of group a lacks its fill at (%.0f, %.0f)", x, y);
    ps_tradeoff_xy(pts, 3, 2, &x, &y);
    CHECK(px_close(&img, x, y, fill1, 3), "group b's disc is not in the second colour at (%.0f, %.0f)", x, y);
    ps_tradeoff_xy(pts, 3, 1, &x, &y);
    double r = ps_tradeoff_radius(pts, 3, 1);
    CHECK(fabs(r - 6.0 * sqrt(8.0)) < 1e-9, "marker radius %.3f for 8x the smallest bytes, want 6·√8", r);
    CHECK(px_close(&img, x + 1, y + 1, ring_in, 3), "the rule checkpoint's ring is filled at its centre (%.0f, %.0f)", x, y);
    ps_rgb rim0 = {0.75 * c0.r, 0.75 * c0.g, 0.75 * c0.b}; /* the rim: the group colour at 75 % */
    CHECK(px_near(&img, x + r, y, rim0, 1, 30), "the rule checkpoint's ring lacks group a's colour on its rim");
    free(img.rgb);
    ps_tradeoff_point many[9];
    static const char *const g9[9] = {"g1", "g2", "g3", "g4", "g5", "g6", "g7", "g8", "g9"};
    for (int i = 0; i < 9; i++) many[i] = (ps_tradeoff_point){.group = g9[i], .mean = 0.5, .gap_pp = 5, .kv_bytes = 768};
    CHECK_ERR(ps_fig_tradeoff(path, "t", "c", many, 9, &err), &err, "the 9th: g9");
}

/* The trade-off markers' bytes: a model's cache bytes per token over full attention's, from its description */
static void test_kv_factor(void) {
    struct { const char *att; double want; } v[] = {
        {"{\"kind\": \"full\"}", 1.0},
        {"{\"kind\": \"compressed\", \"window\": 16, \"stride\": 8}", 0.125},
        {"{\"kind\": \"select\", \"window\": 16, \"stride\": 8, \"block\": 16, \"topk\": 3, \"local_blocks\": 1}",
         6624.0 / 6144.0}, /* `phasescope info` of deep_select_s1: 6624 against full attention's 6144 B/token */
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        char js[512];
        snprintf(js, sizeof js, "{\"model\": \"data/models/m\", \"config\": {\"attention\": %s}}", v[i].att);
        json_error_t je;
        json_t *prov = json_loads(js, 0, &je);
        ps_model_desc d;
        ps_error err;
        CHECK(prov && !ps_model_desc_from_provenance(prov, &d, &err), "%s: not described", js);
        if (prov) CHECK(fabs(d.kv_factor - v[i].want) < 1e-12, "%s: kv_factor %.6f, want %.6f", v[i].att, d.kv_factor, v[i].want);
        json_decref(prov);
    }
}

int main(void) {
    tu_tempdir(TMP, sizeof TMP, "viz");
    test_kv_factor();
    test_model_names();
    test_colormaps();
    test_heatmap_pixels();
    test_render();
    test_knockout_pixels();
    test_curve_pixels();
    test_huge_dimensions();
    test_gatecycle_title();
    test_tradeoff_pixels();
    CHECK_DONE();
}
