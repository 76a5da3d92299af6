#include "core/v4/v4_config.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/config.h"
#include "core/fileio.h"

/* ---- typed getters: each names the key (with its JSON path) and the file; null reads as absent ---- */

static json_t *get(json_t *obj, const char *key) {
    json_t *v = json_object_get(obj, key);
    return v && !json_is_null(v) ? v : NULL;
}

static int get_int(json_t *v, const char *key, const char *src, int64_t *out, ps_error *err) {
    if (json_is_real(v) && floor(json_real_value(v)) == json_real_value(v) && fabs(json_real_value(v)) < 9e15) {
        *out = (int64_t)json_real_value(v); /* 4.0 written by a Python float */
        return 0;
    }
    if (!json_is_integer(v))
        return ps_fail(err, "%s: key \"%s\" must be an integer, got %s", src, key, ps_json_type_name(v));
    *out = (int64_t)json_integer_value(v);
    return 0;
}

static int get_num(json_t *v, const char *key, const char *src, double *out, ps_error *err) {
    if (!json_is_number(v)) return ps_fail(err, "%s: key \"%s\" must be a number, got %s", src, key, ps_json_type_name(v));
    *out = json_number_value(v);
    if (!isfinite(*out)) return ps_fail(err, "%s: key \"%s\" must be finite", src, key);
    return 0;
}

static int opt_int(json_t *root, const char *key, const char *src, int64_t *out, ps_error *err) {
    json_t *v = get(root, key);
    return v ? get_int(v, key, src, out, err) : 0;
}

static int opt_num(json_t *root, const char *key, const char *src, double *out, ps_error *err) {
    json_t *v = get(root, key);
    return v ? get_num(v, key, src, out, err) : 0;
}

/* A short printable copy of an untrusted string for a one-line message. */
static const char *printable(const char *s, char *buf, size_t n) {
    size_t w = 0;
    for (; *s && w + 4 < n; s++) buf[w++] = ((unsigned char)*s < 0x20 || (unsigned char)*s >= 0x7f) ? '?' : *s;
    if (*s) {
        memcpy(buf + w, "...", 3);
        w += 3;
    }
    buf[w] = '\0';
    return buf;
}

static int is_v4_root(json_t *root) {
    if (!json_is_object(root)) return 0;
    json_t *v = json_object_get(root, "model_type");
    if (json_is_string(v) && !strcmp(json_string_value(v), "deepseek_v4")) return 1;
    v = json_object_get(root, "architectures");
    for (size_t i = 0; json_is_array(v) && i < json_array_size(v); i++) {
        json_t *a = json_array_get(v, i);
        if (json_is_string(a) && !strcmp(json_string_value(a), "DeepseekV4ForCausalLM")) return 1;
    }
    return json_object_get(root, "hc_mult") &&
           (json_object_get(root, "compress_ratios") || json_object_get(root, "compress_rates") ||
            json_object_get(root, "layer_types"));
}

int ps_v4_config_detect(const char *text, size_t len) {
    json_error_t je;
    json_t *root = json_loadb(text, len, 0, &je);
    int r = is_v4_root(root);
    json_decref(root);
    return r;
}

int ps_v4_config_detect_file(const char *path) {
    char *text;
    size_t len;
    ps_error err;
    if (ps_read_file(path, 16u << 20, &text, &len, &err)) return 0;
    int r = ps_v4_config_detect(text, len);
    free(text);
    return r;
}

const char *ps_v4_attn_type_name(ps_v4_attn_type t) {
    return t == PS_V4_CSA ? "compressed_sparse_attention" : t == PS_V4_HCA ? "heavily_compressed_attention" : "sliding_attention";
}

int64_t ps_v4_n_windows(const ps_v4_config *c, int l, int64_t T) {
    return c->attn_type[l] == PS_V4_SLIDING || c->compress_rate[l] < 1 ? 0 : T / c->compress_rate[l];
}

/* ---- rotary embeddings ---- */

static double get_mscale(double scale, double m) { return scale <= 1 ? 1.0 : 0.1 * m * log(scale) + 1.0; }

/* One rope object: a flat legacy rope_scaling / rope_parameters (`nested` 0: attention_factor defaults to
 * 1.0, as transformers forces for V4) or a nested rope_parameters.main / .compress (nested 1: it defaults
 * to YaRN's mscale). `theta_set` tells whether the object's rope_theta is used (nested only). */
static int parse_rope(json_t *o, const char *key, const char *src, int nested, int64_t max_pos, ps_v4_rope_cfg *r,
                      double *prf, int *has_prf, ps_error *err) {
    char full[160], b[64];
    if (!json_is_object(o)) return ps_fail(err, "%s: key \"%s\" must be an object, got %s", src, key, ps_json_type_name(o));
    double factor = 0, orig = 0, af = 0, mscale = 0, mscale_all = 0;
    int has_factor = 0, has_orig = 0, has_af = 0, yarn = 0, typed = 0;
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v) {
        snprintf(full, sizeof full, "%s.%s", key, printable(k, b, 48));
        if (json_is_null(v)) continue;
        int e = 0;
        if (!strcmp(k, "rope_type") || !strcmp(k, "type")) {
            if (!json_is_string(v)) return ps_fail(err, "%s: key \"%s\" must be a string, got %s", src, full, ps_json_type_name(v));
            const char *t = json_string_value(v);
            int y = !strcmp(t, "yarn");
            if (!y && strcmp(t, "default"))
                return ps_fail(err, "%s: key \"%s\" is \"%s\": DeepSeek-V4 rotary embeddings are \"default\" or \"yarn\"",
                               src, full, printable(t, b, sizeof b));
            if (typed && y != yarn)
                return ps_fail(err, "%s: keys \"%s.type\" and \"%s.rope_type\" disagree", src, key, key);
            yarn = y;
            typed = 1;
        } else if (!strcmp(k, "factor")) {
            e = get_num(v, full, src, &factor, err);
            has_factor = 1;
        } else if (!strcmp(k, "original_max_position_embeddings")) {
            e = get_num(v, full, src, &orig, err);
            has_orig = 1;
        } else if (!strcmp(k, "beta_fast")) e = get_num(v, full, src, &r->beta_fast, err);
        else if (!strcmp(k, "beta_slow")) e = get_num(v, full, src, &r->beta_slow, err);
        else if (!strcmp(k, "attention_factor")) {
            e = get_num(v, full, src, &af, err);
            has_af = 1;
        } else if (!strcmp(k, "mscale")) e = get_num(v, full, src, &mscale, err);
        else if (!strcmp(k, "mscale_all_dim")) e = get_num(v, full, src, &mscale_all, err);
        else if (!strcmp(k, "rope_theta")) {
            if (nested) e = get_num(v, full, src, &r->theta, err);
        } else if (!strcmp(k, "partial_rotary_factor")) {
            e = get_num(v, full, src, prf, err);
            *has_prf = 1;
        } else if (!strcmp(k, "truncate")) {
            if (!json_is_boolean(v)) return ps_fail(err, "%s: key \"%s\" must be true or false", src, full);
            if (json_is_false(v))
                return ps_fail(err, "%s: key \"%s\" is false: not supported (transformers always truncates the YaRN "
                               "correction range of DeepSeek-V4)", src, full);
        } else
            return ps_fail(err, "%s: unknown key \"%s\" (valid: rope_type, type, rope_theta, factor, "
                           "original_max_position_embeddings, beta_fast, beta_slow, attention_factor, mscale, "
                           "mscale_all_dim, truncate, partial_rotary_factor)", src, full);
        if (e) return -1;
    }
    r->yarn = yarn;
    r->truncate = 1;
    if (!yarn) {
        r->attention_factor = 1.0;
        return 0;
    }
    if (!has_orig) orig = (double)max_pos;
    if (!has_factor) {
        if (!has_orig) return ps_fail(err, "%s: key \"%s.factor\" is required for YaRN", src, key);
        factor = (double)max_pos / orig;
    }
    if (!(factor >= 1e-3 && factor <= 1e6)) return ps_fail(err, "%s: key \"%s.factor\" must be in [0.001, 1e6], got %g", src, key, factor);
    if (!(orig >= 1)) return ps_fail(err, "%s: key \"%s.original_max_position_embeddings\" must be >= 1, got %g", src, key, orig);
    if (!(r->beta_fast > 0) || !(r->beta_slow > 0))
        return ps_fail(err, "%s: keys \"%s.beta_fast\" / \"beta_slow\" must be > 0", src, key);
    r->factor = factor;
    r->original_max = orig;
    if (has_af) r->attention_factor = af;
    else if (!nested) r->attention_factor = 1.0; /* transformers' setdefault("attention_factor", 1.0) */
    else if (mscale != 0 && mscale_all != 0) r->attention_factor = get_mscale(factor, mscale) / get_mscale(factor, mscale_all);
    else r->attention_factor = get_mscale(factor, 1.0);
    if (!(r->attention_factor > 0 && r->attention_factor <= 1e3))
        return ps_fail(err, "%s: key \"%s.attention_factor\" must be in (0, 1000], got %g", src, key, r->attention_factor);
    return 0;
}

void ps_v4_rope_inv_freq(const ps_v4_rope_cfg *r, int64_t dim, double *inv) {
    int64_t half = dim / 2;
    for (int64_t i = 0; i < half; i++) inv[i] = 1.0 / pow(r->theta, (double)(2 * i) / (double)dim);
    if (!r->yarn) return;
    /* transformers' _compute_yarn_parameters (truncate = True), in double */
    double base = r->theta, lo, hi;
    lo = (double)dim * log(r->original_max / (r->beta_fast * 2 * M_PI)) / (2 * log(base));
    hi = (double)dim * log(r->original_max / (r->beta_slow * 2 * M_PI)) / (2 * log(base));
    if (r->truncate) {
        lo = floor(lo);
        hi = ceil(hi);
    }
    if (lo < 0) lo = 0;
    if (hi > (double)(dim - 1)) hi = (double)(dim - 1);
    if (lo == hi) hi += 0.001;
    for (int64_t i = 0; i < half; i++) {
        double ramp = ((double)i - lo) / (hi - lo);
        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
        double extra = 1.0 - ramp; /* inv_freq_extrapolation_factor */
        inv[i] = inv[i] / r->factor * (1 - extra) + inv[i] * extra;
    }
}

/* ---- layer schedules ---- */

static int parse_attn_name(const char *s, ps_v4_attn_type *t) {
    if (!strcmp(s, "sliding_attention")) *t = PS_V4_SLIDING;
    else if (!strcmp(s, "compressed_sparse_attention")) *t = PS_V4_CSA;
    else if (!strcmp(s, "heavily_compressed_attention")) *t = PS_V4_HCA;
    else return -1;
    return 0;
}

static int parse_layers(json_t *root, const char *src, ps_v4_config *c, ps_error *err) {
    char b[64], key[96];
    int64_t L = c->n_layers, rate[3] = {0, 4, 128};
    json_t *v;
    if (opt_int(root, "compress_rate_csa", src, &rate[PS_V4_CSA], err) ||
        opt_int(root, "compress_rate_hca", src, &rate[PS_V4_HCA], err))
        return -1;
    if ((v = get(root, "compress_rates"))) {
        if (!json_is_object(v)) return ps_fail(err, "%s: key \"compress_rates\" must be an object, got %s", src, ps_json_type_name(v));
        const char *k;
        json_t *x;
        json_object_foreach(v, k, x) {
            ps_v4_attn_type t;
            snprintf(key, sizeof key, "compress_rates.%s", printable(k, b, 48));
            if (parse_attn_name(k, &t) || t == PS_V4_SLIDING)
                return ps_fail(err, "%s: unknown key \"%s\" (valid: compressed_sparse_attention, heavily_compressed_attention)", src, key);
            if (get_int(x, key, src, &rate[t], err)) return -1;
        }
    }
    json_t *lt = get(root, "layer_types"), *cr = get(root, "compress_ratios");
    if (lt) {
        c->config_form |= 1;
        if (!json_is_array(lt)) return ps_fail(err, "%s: key \"layer_types\" must be an array of strings, got %s", src, ps_json_type_name(lt));
        if ((int64_t)json_array_size(lt) != L)
            return ps_fail(err, "%s: key \"layer_types\" has %zu entries but num_hidden_layers is %lld", src,
                           json_array_size(lt), (long long)L);
        for (int64_t l = 0; l < L; l++) {
            json_t *a = json_array_get(lt, (size_t)l);
            if (!json_is_string(a))
                return ps_fail(err, "%s: key \"layer_types[%lld]\" must be a string, got %s", src, (long long)l, ps_json_type_name(a));
            if (parse_attn_name(json_string_value(a), &c->attn_type[l]))
                return ps_fail(err, "%s: key \"layer_types[%lld]\" is \"%s\" (expected sliding_attention, "
                               "compressed_sparse_attention or heavily_compressed_attention)", src, (long long)l,
                               printable(json_string_value(a), b, sizeof b));
            c->compress_rate[l] = rate[c->attn_type[l]];
        }
    } else if (cr) {
        /* the hub's per-layer ratios (possibly with the MTP layers' entries after the decoder's) */
        c->config_form |= 2;
        if (!json_is_array(cr)) return ps_fail(err, "%s: key \"compress_ratios\" must be an array of integers, got %s", src, ps_json_type_name(cr));
        if ((int64_t)json_array_size(cr) < L)
            return ps_fail(err, "%s: key \"compress_ratios\" has %zu entries but num_hidden_layers is %lld", src,
                           json_array_size(cr), (long long)L);
        for (int64_t l = 0; l < L; l++) {
            int64_t r;
            snprintf(key, sizeof key, "compress_ratios[%lld]", (long long)l);
            if (get_int(json_array_get(cr, (size_t)l), key, src, &r, err)) return -1;
            if (r < 0) return ps_fail(err, "%s: key \"%s\" is %lld: must be 0 (sliding), 4 (CSA) or another positive rate (HCA)", src, key, (long long)r);
            c->attn_type[l] = r == 0 ? PS_V4_SLIDING : r == 4 ? PS_V4_CSA : PS_V4_HCA;
            c->compress_rate[l] = r;
        }
    } else {
        /* transformers' default schedule: two HCA layers, then CSA / HCA alternating */
        for (int64_t l = 0; l < L; l++) {
            c->attn_type[l] = l < 2 ? PS_V4_HCA : ((l - 2) % 2 ? PS_V4_CSA : PS_V4_HCA);
            c->compress_rate[l] = rate[c->attn_type[l]];
        }
    }
    for (int64_t l = 0; l < L; l++) {
        if (c->attn_type[l] == PS_V4_SLIDING) c->compress_rate[l] = 0;
        else if (c->compress_rate[l] < 1 || c->compress_rate[l] > PS_MAX_DIM)
            return ps_fail(err, "%s: layer %lld (%s) has compression rate %lld: must be in [1, %lld]", src, (long long)l,
                           ps_v4_attn_type_name(c->attn_type[l]), (long long)c->compress_rate[l], (long long)PS_MAX_DIM);
    }
    json_t *mt = get(root, "mlp_layer_types");
    if (mt) {
        c->config_form |= 1;
        if (!json_is_array(mt)) return ps_fail(err, "%s: key \"mlp_layer_types\" must be an array of strings, got %s", src, ps_json_type_name(mt));
        if ((int64_t)json_array_size(mt) != L)
            return ps_fail(err, "%s: key \"mlp_layer_types\" has %zu entries but num_hidden_layers is %lld", src,
                           json_array_size(mt), (long long)L);
        for (int64_t l = 0; l < L; l++) {
            json_t *a = json_array_get(mt, (size_t)l);
            const char *s = json_is_string(a) ? json_string_value(a) : NULL;
            if (!s) return ps_fail(err, "%s: key \"mlp_layer_types[%lld]\" must be a string, got %s", src, (long long)l, ps_json_type_name(a));
            if (!strcmp(s, "hash_moe")) c->mlp_type[l] = PS_V4_HASH_MOE;
            else if (!strcmp(s, "moe")) c->mlp_type[l] = PS_V4_MOE;
            else return ps_fail(err, "%s: key \"mlp_layer_types[%lld]\" is \"%s\" (expected hash_moe or moe)", src, (long long)l, printable(s, b, sizeof b));
        }
    } else {
        int64_t nh = 3;
        if (get(root, "num_hash_layers")) c->config_form |= 2;
        if (opt_int(root, "num_hash_layers", src, &nh, err)) return -1;
        if (nh < 0) return ps_fail(err, "%s: key \"num_hash_layers\" must be >= 0, got %lld", src, (long long)nh);
        for (int64_t l = 0; l < L; l++) c->mlp_type[l] = l < nh ? PS_V4_HASH_MOE : PS_V4_MOE;
    }
    return 0;
}

/* ---- the whole config ---- */

static int parse_root(json_t *root, const char *src, ps_v4_config *c, ps_error *err) {
    char b[64];
    memset(c, 0, sizeof *c);
    if (!json_is_object(root)) return ps_fail(err, "%s: a config must be a JSON object, got %s", src, ps_json_type_name(root));
    static const char *const req[] = {"vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "head_dim"};
    int64_t *reqv[] = {&c->vocab_size, &c->hidden_size, &c->n_layers, &c->n_heads, &c->head_dim};
    for (int i = 0; i < 5; i++) {
        json_t *v = get(root, req[i]);
        if (!v) return ps_fail(err, "%s: missing required key \"%s\" (DeepSeek-V4 config)", src, req[i]);
        if (get_int(v, req[i], src, reqv[i], err)) return -1;
    }
    if (c->n_layers < 1 || c->n_layers > PS_V4_MAX_LAYERS)
        return ps_fail(err, "%s: key \"num_hidden_layers\" is %lld: must be in [1, %d]", src, (long long)c->n_layers, PS_V4_MAX_LAYERS);
    /* transformers' DeepseekV4Config defaults for the rest */
    c->q_lora_rank = 1024;
    c->o_groups = 8;
    c->o_lora_rank = 1024;
    c->sliding_window = 128;
    c->max_position_embeddings = 1048576;
    c->index_n_heads = 64;
    c->index_head_dim = 128;
    c->index_topk = 512;
    c->hc_mult = 4;
    c->hc_sinkhorn_iters = 20;
    c->hc_eps = 1e-6;
    c->rms_eps = 1e-6;
    c->n_routed_experts = 256;
    c->n_shared_experts = 1;
    c->experts_per_tok = 6;
    c->moe_inter = 2048;
    c->routed_scaling_factor = 1.5;
    c->swiglu_limit = 10.0;
    struct { const char *k; int64_t *p; } ints[] = {
        {"q_lora_rank", &c->q_lora_rank},         {"o_groups", &c->o_groups},
        {"o_lora_rank", &c->o_lora_rank},         {"sliding_window", &c->sliding_window},
        {"max_position_embeddings", &c->max_position_embeddings},
        {"index_n_heads", &c->index_n_heads},     {"index_head_dim", &c->index_head_dim},
        {"index_topk", &c->index_topk},           {"hc_mult", &c->hc_mult},
        {"hc_sinkhorn_iters", &c->hc_sinkhorn_iters}, {"n_routed_experts", &c->n_routed_experts},
        {"n_shared_experts", &c->n_shared_experts}, {"num_experts_per_tok", &c->experts_per_tok},
        {"moe_intermediate_size", &c->moe_inter},
    };
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        if (opt_int(root, ints[i].k, src, ints[i].p, err)) return -1;
    if (opt_num(root, "hc_eps", src, &c->hc_eps, err) || opt_num(root, "rms_norm_eps", src, &c->rms_eps, err) ||
        opt_num(root, "routed_scaling_factor", src, &c->routed_scaling_factor, err) ||
        opt_num(root, "swiglu_limit", src, &c->swiglu_limit, err))
        return -1;
    json_t *v;
    int64_t nkv = 1;
    if (opt_int(root, "num_key_value_heads", src, &nkv, err)) return -1;
    if (nkv != 1) return ps_fail(err, "%s: key \"num_key_value_heads\" is %lld: DeepSeek-V4 attention has one shared K=V head", src, (long long)nkv);
    if ((v = get(root, "hidden_act")) && (!json_is_string(v) || strcmp(json_string_value(v), "silu")))
        return ps_fail(err, "%s: key \"hidden_act\" must be \"silu\" (SPEC-v4 experts are SwiGLU)", src);
    static const char *const falsy[] = {"attention_bias", "mlp_bias"};
    for (int i = 0; i < 2; i++)
        if ((v = get(root, falsy[i])) && !json_is_false(v)) return ps_fail(err, "%s: key \"%s\" must be false", src, falsy[i]);
    if ((v = get(root, "tie_word_embeddings"))) {
        if (!json_is_boolean(v)) return ps_fail(err, "%s: key \"tie_word_embeddings\" must be true or false", src);
        c->tie_embeddings = json_is_true(v);
    }
    c->scoring = PS_V4_SCORE_SQRTSOFTPLUS;
    if ((v = get(root, "scoring_func"))) {
        const char *s = json_is_string(v) ? json_string_value(v) : NULL;
        if (s && !strcmp(s, "sqrtsoftplus")) c->scoring = PS_V4_SCORE_SQRTSOFTPLUS;
        else if (s && !strcmp(s, "sigmoid")) c->scoring = PS_V4_SCORE_SIGMOID;
        else return ps_fail(err, "%s: key \"scoring_func\" must be \"sqrtsoftplus\" or \"sigmoid\"%s%s%s", src, s ? ", got \"" : "",
                            s ? printable(s, b, sizeof b) : "", s ? "\"" : "");
    }
    if (parse_layers(root, src, c, err)) return -1;
    /* rotary dimension: partial_rotary_factor, else the hub's qk_rope_head_dim, else 64/512 of head_dim */
    double prf = 64.0 / 512.0, prf_nested = 0;
    int has_prf_nested = 0;
    int64_t rope_dim = 0;
    if (c->head_dim < 1 || c->head_dim > PS_MAX_DIM)
        return ps_fail(err, "%s: key \"head_dim\" must be in [1, %lld], got %lld", src, (long long)PS_MAX_DIM, (long long)c->head_dim);
    if ((v = get(root, "partial_rotary_factor"))) {
        if (get_num(v, "partial_rotary_factor", src, &prf, err)) return -1;
        if (!(prf > 0 && prf <= 1)) return ps_fail(err, "%s: key \"partial_rotary_factor\" must be in (0, 1], got %g", src, prf);
        rope_dim = (int64_t)((double)c->head_dim * prf);
    } else if ((v = get(root, "qk_rope_head_dim"))) {
        c->config_form |= 2;
        if (get_int(v, "qk_rope_head_dim", src, &rope_dim, err)) return -1;
    } else
        rope_dim = (int64_t)((double)c->head_dim * prf);
    c->rope_dim = rope_dim;
    /* rotary embeddings: nested rope_parameters {main, compress}, or the flat/legacy form
     * (rope_parameters or rope_scaling) that only the compress rope uses */
    c->rope_main = (ps_v4_rope_cfg){.theta = 10000.0, .beta_fast = 32, .beta_slow = 1, .attention_factor = 1.0};
    c->rope_compress = (ps_v4_rope_cfg){.theta = 160000.0, .beta_fast = 32, .beta_slow = 1, .attention_factor = 1.0};
    if (opt_num(root, "rope_theta", src, &c->rope_main.theta, err) ||
        opt_num(root, "compress_rope_theta", src, &c->rope_compress.theta, err))
        return -1;
    json_t *rp = get(root, "rope_parameters"), *rs = get(root, "rope_scaling");
    if (rp && !json_is_object(rp))
        return ps_fail(err, "%s: key \"rope_parameters\" must be an object, got %s", src, ps_json_type_name(rp));
    if (rs && !json_is_object(rs)) return ps_fail(err, "%s: key \"rope_scaling\" must be an object, got %s", src, ps_json_type_name(rs));
    json_t *rm = rp ? get(rp, "main") : NULL, *rc = rp ? get(rp, "compress") : NULL;
    if (rm && rc) {
        c->config_form |= 1;
        if (parse_rope(rm, "rope_parameters.main", src, 1, c->max_position_embeddings, &c->rope_main, &prf_nested,
                       &has_prf_nested, err))
            return -1;
        if (has_prf_nested && (!(prf_nested > 0 && prf_nested <= 1) || (int64_t)((double)c->head_dim * prf_nested) != c->rope_dim))
            return ps_fail(err, "%s: key \"rope_parameters.main.partial_rotary_factor\" (%g) does not give the %lld rotary channels "
                           "of the config", src, prf_nested, (long long)c->rope_dim);
        has_prf_nested = 0;
        if (parse_rope(rc, "rope_parameters.compress", src, 1, c->max_position_embeddings, &c->rope_compress,
                       &prf_nested, &has_prf_nested, err))
            return -1;
        if (has_prf_nested && (!(prf_nested > 0 && prf_nested <= 1) || (int64_t)((double)c->head_dim * prf_nested) != c->rope_dim))
            return ps_fail(err, "%s: key \"rope_parameters.compress.partial_rotary_factor\" (%g) does not give the %lld rotary "
                           "channels of the config", src, prf_nested, (long long)c->rope_dim);
    } else if (rm || rc) {
        return ps_fail(err, "%s: key \"rope_parameters\" has \"%s\" but not \"%s\" (the nested form needs both)", src,
                       rm ? "main" : "compress", rm ? "compress" : "main");
    } else {
        /* flat: rope_parameters (transformers 5) wins over rope_scaling (4.x), as transformers standardises */
        json_t *flat = rp ? rp : rs;
        if (flat) {
            /* a flat rope_parameters may carry the main theta */
            json_t *t = get(flat, "rope_theta");
            if (t && !get(root, "rope_theta") && get_num(t, rp ? "rope_parameters.rope_theta" : "rope_scaling.rope_theta", src, &c->rope_main.theta, err))
                return -1;
            double keep = c->rope_compress.theta;
            if (parse_rope(flat, rp ? "rope_parameters" : "rope_scaling", src, 0, c->max_position_embeddings,
                           &c->rope_compress, &prf_nested, &has_prf_nested, err))
                return -1;
            c->rope_compress.theta = keep;
            if (rs && !rp) c->config_form |= 2;
        }
    }
    return ps_v4_config_validate(c, src, err);
}

int ps_v4_config_validate(const ps_v4_config *c, const char *src, ps_error *err) {
    struct { const char *k; int64_t v; } dims[] = {
        {"vocab_size", c->vocab_size},         {"hidden_size", c->hidden_size},
        {"num_attention_heads", c->n_heads},   {"head_dim", c->head_dim},
        {"q_lora_rank", c->q_lora_rank},       {"o_groups", c->o_groups},
        {"o_lora_rank", c->o_lora_rank},       {"sliding_window", c->sliding_window},
        {"max_position_embeddings", c->max_position_embeddings},
        {"hc_mult", c->hc_mult},               {"hc_sinkhorn_iters", c->hc_sinkhorn_iters},
        {"n_routed_experts", c->n_routed_experts}, {"num_experts_per_tok", c->experts_per_tok},
        {"moe_intermediate_size", c->moe_inter}, {"qk_rope_head_dim", c->rope_dim},
    };
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) {
        if (dims[i].v < 1) return ps_fail(err, "%s: key \"%s\" must be >= 1, got %lld", src, dims[i].k, (long long)dims[i].v);
        if (dims[i].v > PS_MAX_DIM)
            return ps_fail(err, "%s: key \"%s\" is %lld, more than the supported maximum %lld", src, dims[i].k,
                           (long long)dims[i].v, (long long)PS_MAX_DIM);
    }
    if (c->n_shared_experts < 0 || c->n_shared_experts > 64)
        return ps_fail(err, "%s: key \"n_shared_experts\" must be in [0, 64], got %lld", src, (long long)c->n_shared_experts);
    if (c->hc_mult > 64) return ps_fail(err, "%s: key \"hc_mult\" is %lld, more than the supported maximum 64", src, (long long)c->hc_mult);
    if (c->hc_sinkhorn_iters > 10000)
        return ps_fail(err, "%s: key \"hc_sinkhorn_iters\" is %lld, more than the supported maximum 10000", src, (long long)c->hc_sinkhorn_iters);
    if (c->n_heads % c->o_groups)
        return ps_fail(err, "%s: key \"num_attention_heads\" (%lld) must be a multiple of \"o_groups\" (%lld)", src,
                       (long long)c->n_heads, (long long)c->o_groups);
    if (c->rope_dim % 2 || c->rope_dim > c->head_dim || c->rope_dim / 2 > PS_V4_MAX_HALF_ROPE)
        return ps_fail(err, "%s: key \"qk_rope_head_dim\" (%lld) must be even and at most head_dim (%lld)", src,
                       (long long)c->rope_dim, (long long)c->head_dim);
    if (c->experts_per_tok > c->n_routed_experts)
        return ps_fail(err, "%s: key \"num_experts_per_tok\" (%lld) exceeds \"n_routed_experts\" (%lld)", src,
                       (long long)c->experts_per_tok, (long long)c->n_routed_experts);
    int csa = 0;
    for (int64_t l = 0; l < c->n_layers; l++) csa |= c->attn_type[l] == PS_V4_CSA;
    if (csa) {
        struct { const char *k; int64_t v; } idx[] = {
            {"index_n_heads", c->index_n_heads}, {"index_head_dim", c->index_head_dim}, {"index_topk", c->index_topk}};
        for (int i = 0; i < 3; i++)
            if (idx[i].v < 1 || idx[i].v > PS_MAX_DIM)
                return ps_fail(err, "%s: key \"%s\" must be in [1, %lld], got %lld", src, idx[i].k, (long long)PS_MAX_DIM, (long long)idx[i].v);
        if (c->rope_dim > c->index_head_dim)
            return ps_fail(err, "%s: key \"qk_rope_head_dim\" (%lld) exceeds \"index_head_dim\" (%lld) (the indexer ropes its trailing channels)",
                           src, (long long)c->rope_dim, (long long)c->index_head_dim);
    }
    if (!(c->rms_eps > 0)) return ps_fail(err, "%s: key \"rms_norm_eps\" must be > 0, got %g", src, c->rms_eps);
    if (!(c->hc_eps >= 0)) return ps_fail(err, "%s: key \"hc_eps\" must be >= 0, got %g", src, c->hc_eps);
    if (!(c->rope_main.theta > 1) || !(c->rope_compress.theta > 1))
        return ps_fail(err, "%s: keys \"rope_theta\" / \"compress_rope_theta\" must be > 1", src);
    /* a sane total (dequantised to float32, in double so nothing overflows) before anything is sized in
     * int64: every tensor's element count stays below it */
    double D = (double)c->hidden_size, N = (double)c->hc_mult, H = (double)c->n_heads, Dh = (double)c->head_dim,
           Q = (double)c->q_lora_rank, GO = (double)c->o_groups * (double)c->o_lora_rank, Di = (double)c->index_head_dim,
           Hi = (double)c->index_n_heads, V = (double)c->vocab_size;
    double total = 2.0 * V * D + N * N * D + 2 * N;
    for (int64_t l = 0; l < c->n_layers; l++) {
        double m = (double)c->compress_rate[l], cc = c->attn_type[l] == PS_V4_CSA ? 2 : 1;
        total += 2 * (2 + N) * N * N * D + D * Q + Q * H * Dh + D * Dh + H * Dh * GO / (double)c->o_groups + GO * D +
                 3.0 * D * (double)c->moe_inter * (double)(c->n_routed_experts + c->n_shared_experts) +
                 D * (double)c->n_routed_experts + V * (double)c->experts_per_tok;
        if (c->attn_type[l] != PS_V4_SLIDING) total += 2 * cc * Dh * D + m * cc * Dh;
        if (c->attn_type[l] == PS_V4_CSA) total += Hi * Di * Q + Hi * D + 4 * Di * D + 2 * m * Di;
    }
    if (total > 1e13) return ps_fail(err, "%s: model would have about %.3g parameters; refusing (limit 1e13)", src, total);
    return 0;
}

int ps_v4_config_parse(const char *text, size_t len, const char *src, ps_v4_config *out, ps_error *err) {
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        char b[160];
        return ps_fail(err, "%s: not valid JSON (line %d: %s)", src, je.line, printable(je.text, b, sizeof b));
    }
    int rc = parse_root(root, src, out, err);
    json_decref(root);
    return rc;
}

int ps_v4_config_load(const char *path, ps_v4_config *out, ps_error *err) {
    char *text;
    size_t len;
    if (ps_read_file(path, 16u << 20, &text, &len, err)) return -1;
    int rc = ps_v4_config_parse(text, len, path, out, err);
    free(text);
    return rc;
}
