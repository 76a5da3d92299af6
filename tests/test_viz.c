/* test_viz.c — figures (SPEC §8): PNGs decode with libpng and carry the provenance text chunks; a
 * heatmap of a known matrix has the expected colours at cell centres; colour maps are what they claim
 * (viridis end points, white centre of the diverging map); rendering the same result twice gives the
 * same bytes; the vector outputs are valid PDF and SVG. */
#define _POSIX_C_SOURCE 200809L
#include <png.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "draw.h"
#include "figures.h"
#include "fileio.h"
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
    CHECK(lo.b > lo.r && hi.r > hi.b, "blue below zero, red above");
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
}

int main(void) {
    tu_tempdir(TMP, sizeof TMP, "viz");
    test_colormaps();
    test_heatmap_pixels();
    test_render();
    CHECK_DONE();
}
