/* minicpm_config.c — MiniCPM4 config.json: the keys docs/minicpm.md lists, each refusal naming the key (with its
 * JSON path) and the file; the longrope rotary tables. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fileio.h"
#include "core/minicpm/minicpm.h"

static int root_is_minicpm(json_t *root) {
    if (!json_is_object(root)) return 0;
    json_t *a = json_object_get(root, "architectures");
    for (size_t i = 0; json_is_array(a) && i < json_array_size(a); i++) {
        const char *s = json_string_value(json_array_get(a, i));
        if (s && !strcmp(s, "MiniCPMForCausalLM")) return 1;
    }
    const char *mt = json_string_value(json_object_get(root, "model_type"));
    return mt && !strcmp(mt, "minicpm");
}

int ps_minicpm_config_detect(const char *text, size_t len) {
    json_error_t je;
    json_t *root = json_loadb(text, len, 0, &je);
    int r = root_is_minicpm(root);
    json_decref(root);
    return r;
}

int ps_minicpm_config_detect_file(const char *path) {
    char *text;
    size_t len;
    ps_error err;
    if (ps_read_file(path, 16u << 20, &text, &len, &err)) return 0;
    int r = ps_minicpm_config_detect(text, len);
    free(text);
    return r;
}

/* A number at obj[key] (path: its name in messages, e.g. "sparse_config.topk"): required or not (absent and
 * null keep *out), whole when `whole`, within [lo, hi]. */
static int number(json_t *obj, const char *key, const char *path, const char *src, int required, int whole, double lo,
                  double hi, double *out, ps_error *err) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) return required ? ps_fail(err, "%s: missing required key \"%s\"", src, path) : 0;
    if (!json_is_number(v))
        return ps_fail(err, "%s: key \"%s\" must be %s, got %s", src, path, whole ? "an integer" : "a number", ps_json_type_name(v));
    double x = json_number_value(v);
    if (!isfinite(x) || (whole && x != floor(x)))
        return ps_fail(err, "%s: key \"%s\" is %g (must be %s)", src, path, x, whole ? "a whole number" : "finite");
    if (x < lo || x > hi) return ps_fail(err, "%s: key \"%s\" is %g, outside [%g, %g]", src, path, x, lo, hi);
    *out = x;
    return 0;
}

static int integer(json_t *obj, const char *key, const char *path, const char *src, int required, double lo, double hi,
                   int64_t *out, ps_error *err) {
    double x = (double)*out;
    if (number(obj, key, path, src, required, 1, lo, hi, &x, err)) return -1;
    *out = (int64_t)x;
    return 0;
}

static int boolean(json_t *obj, const char *key, const char *path, const char *src, int *out, ps_error *err) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v)) return ps_fail(err, "%s: key \"%s\" must be true or false, got %s", src, path, ps_json_type_name(v));
    *out = json_is_true(v);
    return 0;
}

static int factors(json_t *rs, const char *key, const char *src, int64_t half, double *out, ps_error *err) {
    json_t *a = json_object_get(rs, key);
    if (!a) return ps_fail(err, "%s: missing required key \"rope_scaling.%s\" (longrope)", src, key);
    if (!json_is_array(a) || (int64_t)json_array_size(a) != half)
        return ps_fail(err, "%s: key \"rope_scaling.%s\" must be an array of head_dim / 2 = %lld numbers", src, key, (long long)half);
    for (int64_t i = 0; i < half; i++) {
        json_t *x = json_array_get(a, (size_t)i);
        if (!json_is_number(x) || !(json_number_value(x) > 0) || !isfinite(json_number_value(x)))
            return ps_fail(err, "%s: key \"rope_scaling.%s[%lld]\" must be a positive number", src, key, (long long)i);
        out[i] = json_number_value(x);
    }
    return 0;
}

static int parse_root(json_t *root, const char *src, ps_minicpm_config *c, ps_error *err) {
    const double BIG = 1e12;
    memset(c, 0, sizeof *c);
    if (!json_is_object(root)) return ps_fail(err, "%s: not a JSON object", src);
    struct {
        const char *key;
        int64_t *dst;
    } req[] = {{"vocab_size", &c->vocab_size},
               {"hidden_size", &c->hidden_size},
               {"intermediate_size", &c->intermediate_size},
               {"num_hidden_layers", &c->n_layers},
               {"num_attention_heads", &c->n_heads},
               {"max_position_embeddings", &c->max_position_embeddings}};
    for (size_t i = 0; i < sizeof req / sizeof req[0]; i++)
        if (integer(root, req[i].key, req[i].key, src, 1, 1, BIG, req[i].dst, err)) return -1;
    if (c->n_layers > 100000 || c->n_heads > 100000) return ps_fail(err, "%s: key \"num_hidden_layers\" / \"num_attention_heads\" too large", src);
    c->n_kv_heads = c->n_heads;
    if (integer(root, "num_key_value_heads", "num_key_value_heads", src, 0, 1, BIG, &c->n_kv_heads, err)) return -1;
    if (c->n_heads % c->n_kv_heads)
        return ps_fail(err, "%s: key \"num_key_value_heads\" is %lld, which does not divide num_attention_heads %lld", src,
                       (long long)c->n_kv_heads, (long long)c->n_heads);
    c->head_dim = c->hidden_size / c->n_heads;
    if (integer(root, "head_dim", "head_dim", src, 0, 2, 2 * PS_MINICPM_MAX_HALF, &c->head_dim, err)) return -1;
    if (c->head_dim % 2 || c->head_dim < 2 || c->head_dim > 2 * PS_MINICPM_MAX_HALF)
        return ps_fail(err, "%s: key \"head_dim\" (or hidden_size / num_attention_heads) is %lld (an even number in [2, %d])", src,
                       (long long)c->head_dim, 2 * PS_MINICPM_MAX_HALF);
    c->rms_norm_eps = 1e-6, c->rope_theta = 10000.0;
    if (number(root, "rms_norm_eps", "rms_norm_eps", src, 0, 0, 0, 1, &c->rms_norm_eps, err) ||
        number(root, "rope_theta", "rope_theta", src, 0, 0, 1e-9, 1e30, &c->rope_theta, err) ||
        number(root, "scale_emb", "scale_emb", src, 1, 0, -1e30, 1e30, &c->scale_emb, err) ||
        number(root, "scale_depth", "scale_depth", src, 1, 0, -1e30, 1e30, &c->scale_depth, err) ||
        number(root, "dim_model_base", "dim_model_base", src, 1, 0, 1e-30, 1e30, &c->dim_model_base, err))
        return -1;
    c->tie_word_embeddings = 1; /* transformers' default */
    if (boolean(root, "tie_word_embeddings", "tie_word_embeddings", src, &c->tie_word_embeddings, err)) return -1;
    json_t *act = json_object_get(root, "hidden_act");
    if (act && !json_is_null(act) && (!json_is_string(act) || strcmp(json_string_value(act), "silu")))
        return ps_fail(err, "%s: key \"hidden_act\" must be \"silu\" (the only activation MiniCPM uses)", src);
    /* rope_scaling: none or longrope */
    json_t *rs = json_object_get(root, "rope_scaling");
    if (rs && !json_is_null(rs)) {
        if (!json_is_object(rs)) return ps_fail(err, "%s: key \"rope_scaling\" must be an object, got %s", src, ps_json_type_name(rs));
        json_t *ty = json_object_get(rs, "rope_type");
        if (!ty) ty = json_object_get(rs, "type");
        if (!json_is_string(ty) || strcmp(json_string_value(ty), "longrope"))
            return ps_fail(err, "%s: key \"rope_scaling.rope_type\" must be \"longrope\" (the only scaling MiniCPM4 uses)", src);
        c->longrope = 1;
        int64_t half = c->head_dim / 2;
        if (factors(rs, "short_factor", src, half, c->short_factor, err) || factors(rs, "long_factor", src, half, c->long_factor, err) ||
            integer(rs, "original_max_position_embeddings", "rope_scaling.original_max_position_embeddings", src, 1, 2, BIG,
                    &c->original_max, err))
            return -1;
        if (!(1.0 + log((double)c->max_position_embeddings / (double)c->original_max) / log((double)c->original_max) > 0))
            return ps_fail(err, "%s: key \"rope_scaling.original_max_position_embeddings\" is %lld: the longrope scale "
                           "sqrt(1 + ln(max_position_embeddings / original) / ln(original)) is not real", src, (long long)c->original_max);
    }
    /* sparse_config */
    json_t *sc = json_object_get(root, "sparse_config");
    if (!sc || json_is_null(sc)) return ps_fail(err, "%s: missing required key \"sparse_config\" (InfLLM-v2 sparse attention)", src);
    if (!json_is_object(sc)) return ps_fail(err, "%s: key \"sparse_config\" must be an object, got %s", src, ps_json_type_name(sc));
    struct {
        const char *key, *path;
        int64_t *dst;
        double lo;
    } sk[] = {{"kernel_size", "sparse_config.kernel_size", &c->sel.kernel, 1},
              {"kernel_stride", "sparse_config.kernel_stride", &c->sel.stride, 1},
              {"block_size", "sparse_config.block_size", &c->sel.block, 1},
              {"init_blocks", "sparse_config.init_blocks", &c->sel.init_blocks, 0},
              {"window_size", "sparse_config.window_size", &c->window_size, 0},
              {"topk", "sparse_config.topk", &c->sel.topk, 0},
              {"dense_len", "sparse_config.dense_len", &c->dense_len, -BIG}};
    for (size_t i = 0; i < sizeof sk / sizeof sk[0]; i++)
        if (integer(sc, sk[i].key, sk[i].path, src, 1, sk[i].lo, BIG, sk[i].dst, err)) return -1;
    if (boolean(sc, "use_nope", "sparse_config.use_nope", src, &c->use_nope, err)) return -1;
    static const char *const names[6] = {"sparse_config.kernel_size", "sparse_config.kernel_stride", "sparse_config.block_size",
                                         "sparse_config.init_blocks", "sparse_config.window_size", "sparse_config.topk"};
    c->sel.local_blocks = c->window_size / c->sel.block;
    if (ps_select_cfg_check(&c->sel, src, names, err)) return -1;
    if (c->window_size % c->sel.block)
        return ps_fail(err, "%s: key \"sparse_config.window_size\" is %lld, not a multiple of block_size %lld", src,
                       (long long)c->window_size, (long long)c->sel.block);
    return 0;
}

int ps_minicpm_config_parse(const char *text, size_t len, const char *src, ps_minicpm_config *c, ps_error *err) {
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!root) return ps_fail(err, "%s: invalid JSON at line %d: %s", src, je.line, je.text);
    int rc = parse_root(root, src, c, err);
    json_decref(root);
    return rc;
}

int ps_minicpm_config_load(const char *path, ps_minicpm_config *c, ps_error *err) {
    char *text;
    size_t len;
    if (ps_read_file(path, 16u << 20, &text, &len, err)) return -1;
    int rc = ps_minicpm_config_parse(text, len, path, c, err);
    free(text);
    return rc;
}

// cos_t, sin_t: [n, head_dim / 2]
void ps_minicpm_rope_table(const ps_minicpm_config *c, int64_t p0, int64_t n, int64_t L, float *cos_t, float *sin_t) {
    int64_t half = c->head_dim / 2, table = c->max_position_embeddings > L ? c->max_position_embeddings : L;
    const double *f = NULL;
    double scale = 1.0;
    if (c->longrope) {
        f = table > c->original_max ? c->long_factor : c->short_factor;
        double r = (double)c->max_position_embeddings / (double)c->original_max;
        scale = sqrt(1.0 + log(r) / log((double)c->original_max)); /* checked positive by the parse */
    }
    for (int64_t t = 0; t < n; t++)
        for (int64_t i = 0; i < half; i++) {
            double a = (double)(p0 + t) / (f ? f[i] : 1.0) * pow(c->rope_theta, -2.0 * (double)i / (double)c->head_dim);
            cos_t[t * half + i] = (float)(cos(a) * scale);
            sin_t[t * half + i] = (float)(sin(a) * scale);
        }
}
