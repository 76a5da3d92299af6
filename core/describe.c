/* describe.c — a model's description for the readers of its results (runtime.h, ps_model_desc): the
 * controlled model's and DeepSeek-V4's describe_config (the only place their attention kinds are told
 * apart by name), the field checks they share (their messages as the results validator words them), and
 * the lookups through the family table (ps_model_desc_from_provenance, ps_runtime_label, the default
 * period). */
#include "core/runtime.h"
#include "core/kvcache.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* ---- config fields (a bad one: "KEY: what is wrong", KEY the path within the config) ---- */

const char *ps_config_type_name(const json_t *v) {
    if (!v) return "nothing (the field is missing)";
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a fractional number";
    case JSON_TRUE: return "true";
    case JSON_FALSE: return "false";
    default: return "null";
    }
}

static int int_value(const json_t *v, const char *key, int64_t lo, int64_t hi, int64_t *out, ps_error *err) {
    if (!v) return ps_fail(err, "%s: missing", key);
    if (json_is_real(v)) return ps_fail(err, "%s: %.10g is not an integer", key, json_real_value(v));
    if (!json_is_integer(v)) return ps_fail(err, "%s: expected an integer, got %s", key, ps_config_type_name(v));
    int64_t x = (int64_t)json_integer_value(v);
    if (x < lo || x > hi) {
        if (lo == 0 && x < 0) return ps_fail(err, "%s: %lld is negative", key, (long long)x);
        return ps_fail(err, "%s: %lld is out of range [%lld, %lld]", key, (long long)x, (long long)lo, (long long)hi);
    }
    if (out) *out = x;
    return 0;
}

static int get_int(const json_t *att, const char *k, int64_t lo, int64_t hi, int64_t *out, ps_error *err) {
    char key[96];
    snprintf(key, sizeof key, "attention.%s", k);
    return int_value(json_object_get(att, k), key, lo, hi, out, err);
}

static int get_str(const json_t *att, const char *k, int optional, const char **out, ps_error *err) {
    const json_t *v = json_object_get(att, k);
    if (!v && optional) return 0;
    if (!v) return ps_fail(err, "attention.%s: missing", k);
    if (!json_is_string(v)) return ps_fail(err, "attention.%s: expected a string, got %s", k, ps_config_type_name(v));
    if (out) *out = json_string_value(v);
    return 0;
}

static int get_enum(const json_t *att, const char *k, const char *const *opts, int *out, ps_error *err) {
    const char *s = NULL;
    if (get_str(att, k, 0, &s, err)) return -1;
    for (int i = 0; opts[i]; i++)
        if (!strcmp(s, opts[i])) {
            if (out) *out = i;
            return 0;
        }
    char list[256] = "";
    for (int i = 0; opts[i]; i++) {
        size_t l = strlen(list);
        snprintf(list + l, sizeof list - l, "%s%s", i ? ", " : "", opts[i]);
    }
    return ps_fail(err, "attention.%s: \"%.100s\" is not one of %s", k, s, list);
}

/* an array of lo to hi entries (lo = hi: exactly) */
static int get_arr(const json_t *att, const char *k, int64_t lo, int64_t hi, json_t **out, int64_t *n, ps_error *err) {
    json_t *v = json_object_get(att, k);
    if (!v) return ps_fail(err, "attention.%s: missing", k);
    if (!json_is_array(v)) return ps_fail(err, "attention.%s: expected an array, got %s", k, ps_config_type_name(v));
    int64_t m = (int64_t)json_array_size(v);
    if (m < lo || m > hi) {
        if (lo == hi) return ps_fail(err, "attention.%s: %lld entries, expected %lld", k, (long long)m, (long long)lo);
        return ps_fail(err, "attention.%s: %lld entries, expected %lld to %lld", k, (long long)m, (long long)lo, (long long)hi);
    }
    *out = v;
    if (n) *n = m;
    return 0;
}

#define MAX_WINDOW 4096               /* attention.window, rates (as the validator bounds them) */
#define MAX_INDEX ((int64_t)1 << 24)  /* layers, heads */

static void label(ps_model_desc *d, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(d->label, sizeof d->label, fmt, ap);
    va_end(ap);
}

/* ---- the controlled model: full, compressed, and the channel attention ("v4": its former name) ---- */

const char *const ps_model_attention_kinds[] = {"full", "compressed", "channel", "v4", "select", NULL};

int ps_model_describe_config(const json_t *cfg, ps_model_desc *d, ps_error *err) {
    const json_t *att = json_object_get(cfg, "attention");
    const char *kind = json_string_value(json_object_get(att, "kind"));
    int k = -1;
    for (int i = 0; kind && ps_model_attention_kinds[i]; i++)
        if (!strcmp(kind, ps_model_attention_kinds[i])) k = i;
    if (k < 0) return 0;
    memset(d, 0, sizeof *d);
    d->kv_factor = 1;
    snprintf(d->kind, sizeof d->kind, "%s", kind);
    const char *norope = json_is_false(json_object_get(cfg, "rope")) ? ", no RoPE" : "";
    if (k == 0) {
        label(d, "full attention");
        return 1;
    }
    if (k == 1) {
        int64_t w, s;
        const char *gate = NULL, *bnd = NULL;
        if (get_int(att, "window", 1, MAX_WINDOW, &w, err) || get_int(att, "stride", 1, w, &s, err) ||
            get_str(att, "gate", 1, &gate, err))
            return -1;
        d->kv_factor = 1.0 / (double)s;
        bnd = json_string_value(json_object_get(att, "boundaries"));
        if (bnd && !strcmp(bnd, "content")) {
            label(d, "content chunks %lld-%lld, mean %lld", (long long)json_integer_value(json_object_get(att, "chunk_min")),
                  (long long)w, (long long)s);
            return 1;
        }
        /* staggered grids (attention.head_offsets, docs/mitigations.md): the offsets, when any is not 0 */
        const json_t *ho = json_object_get(att, "head_offsets");
        char stag[160] = "";
        int any = 0, run = 1; /* run: offsets 0, 1, 2, ... by KV head ("staggered 0–7") */
        if (json_array_size(ho) > 0 && json_is_array(json_array_get(ho, 0))) {
            /* a per-layer grid [n_layers][n_kv_heads]: "staggered_layers" when it is that formula */
            size_t nl = json_array_size(ho), nkv = json_array_size(json_array_get(ho, 0));
            int64_t k = ps_config_layer_stagger(s);
            int stl = 1;
            for (size_t l = 0; l < nl; l++)
                for (size_t g = 0; g < nkv; g++)
                    stl &= json_integer_value(json_array_get(json_array_get(ho, l), g)) ==
                           (json_int_t)(((int64_t)g * s / (int64_t)nkv + (int64_t)l * k) % s);
            if (stl) snprintf(stag, sizeof stag, ", staggered by layer (k %lld)", (long long)k);
            else snprintf(stag, sizeof stag, ", per-layer offsets");
            ho = NULL;
        }
        for (size_t i = 0; i < json_array_size(ho); i++) {
            any |= json_integer_value(json_array_get(ho, i)) != 0;
            run &= json_integer_value(json_array_get(ho, i)) == (json_int_t)i;
        }
        if (any && run)
            snprintf(stag, sizeof stag, ", staggered 0–%zu", json_array_size(ho) - 1);
        else if (any) {
            size_t o = (size_t)snprintf(stag, sizeof stag, ", offsets ");
            for (size_t i = 0; i < json_array_size(ho) && o + 24 < sizeof stag; i++)
                o += (size_t)snprintf(stag + o, sizeof stag - o, "%s%lld", i ? "," : "", (long long)json_integer_value(json_array_get(ho, i)));
        }
        label(d, "W%lld/S%lld%s%s%s", (long long)w, (long long)s, stag, gate && !strcmp(gate, "uniform") ? ", uniform gate" : "",
              norope);
        return 1;
    }
    if (k == 4) { /* block-sparse selection (core/select.h) */
        int64_t w, s, b, topk, lb;
        if (get_int(att, "window", 1, MAX_WINDOW, &w, err) || get_int(att, "stride", 1, w, &s, err) ||
            get_int(att, "block", 1, MAX_INDEX, &b, err) || get_int(att, "topk", 0, MAX_INDEX, &topk, err) ||
            get_int(att, "local_blocks", 0, MAX_INDEX, &lb, err))
            return -1;
        label(d, "select: blocks of %lld, top %lld + %lld local, windows W%lld/S%lld%s", (long long)b, (long long)topk, (long long)lb,
              (long long)w, (long long)s, norope);
        d->kv_factor = ps_select_kv_factor(s);
        return 1;
    }
    static const char *const MODES[] = {"csa", "hca", NULL};
    int64_t rate, lw;
    int mode = 0;
    if (get_int(att, "rate", 1, MAX_WINDOW, &rate, err) || get_enum(att, "mode", MODES, &mode, err) ||
        get_int(att, "local_window", 1, MAX_INDEX, &lw, err))
        return -1;
    label(d, "V4 compressor: %s, rate %lld, window %lld%s", mode ? "HCA" : "CSA", (long long)rate, (long long)lw, norope);
    d->kv_shared = d->slot_bias = 1;
    d->raw_what = "the raw K=V entries (hook_k)";
    d->comp_what = "the compressed K=V entries (hook_ck)";
    return 1;
}

/* ---- DeepSeek-V4 ---- */

const char *const ps_v4_attention_kinds[] = {"deepseek_v4", NULL};

int ps_v4_describe_config(const json_t *cfg, ps_model_desc *d, ps_error *err) {
    const json_t *att = json_object_get(cfg, "attention");
    const char *kind = json_string_value(json_object_get(att, "kind"));
    if (!kind || strcmp(kind, ps_v4_attention_kinds[0])) return 0;
    memset(d, 0, sizeof *d);
    d->kv_factor = 1;
    snprintf(d->kind, sizeof d->kind, "%s", kind);
    json_t *lt, *cr;
    int64_t nl;
    if (get_arr(att, "layer_types", 1, MAX_INDEX, &lt, &nl, err) || get_arr(att, "compress_rates", nl, nl, &cr, NULL, err)) return -1;
    char rates[200] = "";
    size_t o = 0;
    for (int64_t i = 0; i < nl; i++) {
        char key[64];
        snprintf(key, sizeof key, "attention.compress_rates[%lld]", (long long)i);
        int64_t r = 0;
        if (int_value(json_array_get(cr, (size_t)i), key, 0, MAX_INDEX, &r, err)) return -1;
        if (o + 16 < sizeof rates) o += (size_t)snprintf(rates + o, sizeof rates - o, "%s%lld", i ? "," : "", (long long)r);
    }
    label(d, "DeepSeek-V4, compress rates %s", rates);
    d->kv_shared = d->slot_bias = d->indexer = 1;
    d->raw_what = "the raw K=V window (layers.L.attn.kv)";
    d->comp_what = "the compressed entries (layers.L.attn.compressor.kv)";
    return 1;
}

/* ---- through the family table ---- */

int64_t ps_runtime_default_period(const ps_runtime *rt) { return rt->family->default_period(rt); }

/* 1: a shipped family described config; 0: none knows its attention kind (err says so); -1: a bad field */
static int desc_config(const json_t *config, ps_model_desc *d, ps_error *err) {
    memset(d, 0, sizeof *d);
    if (!json_is_object(config)) return ps_fail(err, "expected an object, got %s", ps_config_type_name(config));
    const json_t *att = json_object_get(config, "attention");
    if (!json_is_object(att)) return ps_fail(err, "attention: %s", att ? "expected an object" : "missing");
    const char *kind = NULL;
    if (get_str(att, "kind", 0, &kind, err)) return -1;
    for (int i = 0; ps_families[i]; i++) {
        int r = ps_families[i]->describe_config ? ps_families[i]->describe_config(config, d, err) : 0;
        if (r) return r > 0 ? 1 : -1;
    }
    char list[256] = "";
    for (int i = 0; ps_families[i]; i++)
        for (int k = 0; ps_families[i]->kinds && ps_families[i]->kinds[k]; k++) {
            size_t l = strlen(list);
            snprintf(list + l, sizeof list - l, "%s%s", l ? ", " : "", ps_families[i]->kinds[k]);
        }
    ps_fail(err, "attention.kind: \"%.100s\" is not one of %s", kind, list);
    return 0;
}

int ps_model_desc_from_config(const json_t *config, ps_model_desc *d, ps_error *err) {
    return desc_config(config, d, err) == 1 ? 0 : -1;
}

int ps_model_desc_from_provenance(const json_t *prov, ps_model_desc *d, ps_error *err) {
    const char *l = json_string_value(json_object_get(prov, "label")), *k = json_string_value(json_object_get(prov, "kind"));
    const json_t *config = json_object_get(prov, "config");
    int r = desc_config(config, d, err);
    /* a family this build does not ship (one a caller defines: ps_runtime_open_in) is described by what its
     * writer stored: its label, and its kind, which names the config's attention kind */
    const char *ck = json_string_value(json_object_get(json_object_get(config, "attention"), "kind"));
    if (r < 0 || (r == 0 && !(l && k && ck && !strcmp(k, ck)))) return -1;
    if (r == 0) memset(d, 0, sizeof *d);
    if (l) snprintf(d->label, sizeof d->label, "%s", l);
    if (k) snprintf(d->kind, sizeof d->kind, "%s", k);
    return 0;
}

int ps_label_from_provenance(const json_t *prov, char *lab, size_t ln, char *kind, size_t kn) {
    ps_model_desc d;
    ps_error e;
    if (ps_model_desc_from_provenance(prov, &d, &e)) {
        /* a provenance without a config phasescope knows may still carry what its writer said */
        const char *l = json_string_value(json_object_get(prov, "label")), *k = json_string_value(json_object_get(prov, "kind"));
        if (!l || !k) return -1;
        snprintf(d.label, sizeof d.label, "%s", l);
        snprintf(d.kind, sizeof d.kind, "%s", k);
    }
    if (lab && ln) snprintf(lab, ln, "%s", d.label);
    if (kind && kn) snprintf(kind, kn, "%s", d.kind);
    return 0;
}

int ps_runtime_desc(const ps_runtime *rt, ps_model_desc *d, ps_error *err) {
    memset(d, 0, sizeof *d);
    json_t *cfg = rt->family->config_json(rt);
    if (!cfg) return ps_fail(err, "out of memory for the model's config");
    int r = rt->family->describe_config ? rt->family->describe_config(cfg, d, err) : 0;
    json_decref(cfg);
    if (r == 0) return ps_fail(err, "the %s family does not describe its own config", rt->family->name);
    return r > 0 ? 0 : -1;
}

const char *ps_runtime_label(const ps_runtime *rt, char *buf, size_t n) {
    ps_model_desc d;
    ps_error e;
    if (n) buf[0] = '\0';
    if (!ps_runtime_desc(rt, &d, &e) && n) snprintf(buf, n, "%s", d.label);
    return buf;
}
