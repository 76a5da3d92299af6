#include "core/config.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fileio.h"

void ps_config_defaults(ps_config *c) {
    memset(c, 0, sizeof *c);
    c->rope = true;
    c->rope_theta = 10000.0;
    c->qk_norm = true;
    c->rms_eps = 1e-6;
    c->tie_embeddings = true;
    c->kind = PS_ATTN_FULL;
    c->window = 8;
    c->stride = -1;       /* = W unless given */
    c->local_window = -1; /* = W unless given */
    c->gate = PS_GATE_LEARNED;
    c->payload = PS_PAYLOAD_PER_OFFSET;
    c->rate = 4;
    c->v4_mode = PS_V4_MODE_CSA;
    c->init_blocks = 1;
    c->local_blocks = 1;
}

/* ---- typed getters: each names the key (with its JSON path) and the file ---- */

static int get_int(json_t *v, const char *key, const char *src, int64_t *out, ps_error *err) {
    if (!json_is_integer(v))
        return ps_fail(err, "%s: key \"%s\" must be a JSON integer, got %s", src, key,
                       json_is_real(v) ? "a real number" : json_is_string(v) ? "a string" : "another type");
    *out = (int64_t)json_integer_value(v);
    return 0;
}

static int get_num(json_t *v, const char *key, const char *src, double *out, ps_error *err) {
    if (!json_is_number(v)) return ps_fail(err, "%s: key \"%s\" must be a number", src, key);
    *out = json_number_value(v);
    return 0;
}

static int get_bool(json_t *v, const char *key, const char *src, bool *out, ps_error *err) {
    if (!json_is_boolean(v)) return ps_fail(err, "%s: key \"%s\" must be true or false", src, key);
    *out = json_is_true(v);
    return 0;
}

static int get_enum(json_t *v, const char *key, const char *src, const char *a, const char *b, int *out,
                    ps_error *err) {
    if (!json_is_string(v)) return ps_fail(err, "%s: key \"%s\" must be a string (\"%s\" or \"%s\")", src, key, a, b);
    const char *s = json_string_value(v);
    if (!strcmp(s, a)) *out = 0;
    else if (!strcmp(s, b)) *out = 1;
    else return ps_fail(err, "%s: key \"%s\" is \"%s\", expected \"%s\" or \"%s\"", src, key, s, a, b);
    return 0;
}

/* attention.head_offsets: a JSON array of one integer per KV head, "staggered" (o_g = floor(g*S/n_kv)),
 * "staggered_layers" (o_{l,g} = (floor(g*S/n_kv) + l*k) mod S, ps_config_layer_stagger) or a 2-D array
 * [n_layers][n_kv_heads] (a per-layer grid). The strings are resolved in ps_config_parse once S, n_layers and
 * n_kv are known (marked here by n_grid_offsets = -1, n_offset_layers = -1); the values are range-checked and
 * the shapes matched to the model in ps_config_validate. */
static int get_head_offsets(json_t *v, const char *src, ps_config *c, ps_error *err) {
    if (json_is_string(v)) {
        const char *s = json_string_value(v);
        if (!strcmp(s, "staggered")) c->n_grid_offsets = -1;
        else if (!strcmp(s, "staggered_layers")) c->n_offset_layers = -1;
        else
            return ps_fail(err, "%s: key \"attention.head_offsets\" is \"%s\": expected \"staggered\", \"staggered_layers\", an array "
                           "of integers (one per KV head) or an array of such arrays (one per layer)", src, s);
        return 0;
    }
    if (!json_is_array(v))
        return ps_fail(err, "%s: key \"attention.head_offsets\" must be an array of integers (one per KV head), an array of such "
                       "arrays (one per layer), \"staggered\" or \"staggered_layers\"", src);
    size_t n = json_array_size(v);
    if (n > 0 && json_is_array(json_array_get(v, 0))) { /* [n_layers][n_kv_heads] */
        size_t w = json_array_size(json_array_get(v, 0));
        if (w == 0 || w > PS_MAX_GRID_HEADS || n * w > PS_MAX_GRID_OFFSETS)
            return ps_fail(err, "%s: key \"attention.head_offsets\" has %zu rows of %zu entries: rows must be non-empty, with at most "
                           "%d KV heads and %d offsets in all", src, n, w, PS_MAX_GRID_HEADS, PS_MAX_GRID_OFFSETS);
        for (size_t l = 0; l < n; l++) {
            json_t *row = json_array_get(v, l);
            if (!json_is_array(row))
                return ps_fail(err, "%s: key \"attention.head_offsets\": row %zu must be an array of integers (row 0 is one)", src, l);
            if (json_array_size(row) != w)
                return ps_fail(err, "%s: key \"attention.head_offsets\": row %zu has %zu entries, row 0 has %zu (one per KV head)", src, l,
                               json_array_size(row), w);
            for (size_t g = 0; g < w; g++) {
                json_t *e = json_array_get(row, g);
                if (!json_is_integer(e))
                    return ps_fail(err, "%s: key \"attention.head_offsets\": entry [%zu][%zu] must be a JSON integer", src, l, g);
                json_int_t o = json_integer_value(e);
                if (o < 0 || o >= 4096) /* S <= W <= 4096; the exact bound is checked in ps_config_validate */
                    return ps_fail(err, "%s: key \"attention.head_offsets\": entry [%zu][%zu] is %lld, must be in [0, attention.stride)",
                                   src, l, g, (long long)o);
                c->layer_offsets[l * w + g] = (int32_t)o;
            }
        }
        c->n_offset_layers = (int64_t)n;
        c->n_grid_offsets = (int64_t)w;
        c->any_head_offset = true; /* resolved by normalize_offsets */
        return 0;
    }
    if (n > PS_MAX_GRID_HEADS)
        return ps_fail(err, "%s: key \"attention.head_offsets\" has %zu entries, more than the supported %d KV heads", src, n,
                       PS_MAX_GRID_HEADS);
    c->n_grid_offsets = (int64_t)n;
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(v, i);
        if (!json_is_integer(e))
            return ps_fail(err, "%s: key \"attention.head_offsets\": entry %zu must be a JSON integer", src, i);
        c->head_offsets[i] = (int64_t)json_integer_value(e);
        if (c->head_offsets[i] != 0) c->any_head_offset = true;
    }
    return 0;
}

int64_t ps_config_layer_stagger(int64_t S) {
    const double target = (2.0 - 1.6180339887498949) * (double)S; /* (2 - phi) S = S / phi^2 */
    int64_t best = 0;
    double bd = 0;
    for (int64_t k = 1; k < S; k++) {
        int64_t a = k, b = S;
        while (b) { /* gcd(k, S) */
            int64_t t = a % b;
            a = b, b = t;
        }
        double dist = (double)k > target ? (double)k - target : target - (double)k;
        if (a == 1 && (!best || dist < bd)) best = k, bd = dist;
    }
    return best;
}

/* One form for one grid, so that a round trip gives the same struct (and hash): a per-layer grid whose rows are
 * all equal becomes the per-head form, all-zero offsets (or any model but a compressed one) the base grid. */
static void normalize_offsets(ps_config *c) {
    int64_t nkv = c->n_kv_heads;
    if (c->n_offset_layers > 0) {
        bool same = true;
        for (int64_t l = 1; l < c->n_offset_layers && same; l++)
            for (int64_t g = 0; g < nkv; g++) same &= c->layer_offsets[l * nkv + g] == c->layer_offsets[g];
        if (same) {
            for (int64_t g = 0; g < nkv; g++) c->head_offsets[g] = c->layer_offsets[g];
            memset(c->layer_offsets, 0, sizeof c->layer_offsets);
            c->n_offset_layers = 0;
        }
    }
    c->any_head_offset = false;
    if (c->n_offset_layers > 0)
        for (int64_t i = 0; i < c->n_offset_layers * nkv; i++) c->any_head_offset |= c->layer_offsets[i] != 0;
    else
        for (int64_t g = 0; g < c->n_grid_offsets && g < PS_MAX_GRID_HEADS; g++) c->any_head_offset |= c->head_offsets[g] != 0;
    if (c->kind != PS_ATTN_COMPRESSED || !c->any_head_offset) {
        memset(c->head_offsets, 0, sizeof c->head_offsets);
        memset(c->layer_offsets, 0, sizeof c->layer_offsets);
        c->n_grid_offsets = 0;
        c->n_offset_layers = 0;
        c->any_head_offset = false;
    }
}

int ps_config_set_grid_offsets(ps_config *c, const int64_t *o, int64_t rows, ps_error *err) {
    int64_t nkv = c->n_kv_heads, S = c->stride;
    if (c->kind != PS_ATTN_COMPRESSED)
        return ps_fail(err, "key \"attention.head_offsets\" applies to kind \"compressed\" only");
    if (rows != 1 && rows != c->n_layers)
        return ps_fail(err, "key \"attention.head_offsets\": %lld rows of offsets, expected 1 or n_layers = %lld", (long long)rows,
                       (long long)c->n_layers);
    if (nkv < 1 || nkv > PS_MAX_GRID_HEADS || rows * nkv > PS_MAX_GRID_OFFSETS)
        return ps_fail(err, "key \"attention.head_offsets\": %lld rows of %lld KV heads exceed the supported %d heads, %d offsets",
                       (long long)rows, (long long)nkv, PS_MAX_GRID_HEADS, PS_MAX_GRID_OFFSETS);
    for (int64_t i = 0; i < rows * nkv; i++)
        if (o[i] < 0 || o[i] >= S)
            return ps_fail(err, "key \"attention.head_offsets\": entry [%lld][%lld] is %lld, must be in [0, attention.stride = %lld)",
                           (long long)(i / nkv), (long long)(i % nkv), (long long)o[i], (long long)S);
    memset(c->head_offsets, 0, sizeof c->head_offsets);
    memset(c->layer_offsets, 0, sizeof c->layer_offsets);
    c->n_grid_offsets = nkv;
    c->n_offset_layers = rows > 1 ? rows : 0;
    for (int64_t i = 0; i < rows * nkv; i++) {
        if (rows > 1) c->layer_offsets[i] = (int32_t)o[i];
        else c->head_offsets[i] = o[i];
    }
    normalize_offsets(c);
    return 0;
}

static int parse_attention(json_t *att, const char *src, ps_config *c, ps_error *err) {
    if (!json_is_object(att)) return ps_fail(err, "%s: key \"attention\" must be an object", src);
    const char *k;
    json_t *v;
    /* keys of one kind only: the compressed model's window/stride/gate/payload, the v4 kind's rate/mode */
    int seen_comp = 0, seen_v4 = 0, seen_lw = 0, seen_cmin = 0, seen_sel = 0, seen_geom = 0, seen_block = 0, seen_topk = 0;
    const char *comp_key = NULL, *v4_key = NULL, *sel_key = NULL, *geom_key = NULL;
    json_object_foreach(att, k, v) {
        int e = 0, tmp = 0;
        if (!strcmp(k, "kind")) {
            if (!json_is_string(v))
                return ps_fail(err, "%s: key \"attention.kind\" must be a string (\"full\", \"compressed\", \"channel\" or \"select\")", src);
            const char *s = json_string_value(v);
            if (!strcmp(s, "full")) c->kind = PS_ATTN_FULL;
            else if (!strcmp(s, "compressed")) c->kind = PS_ATTN_COMPRESSED;
            else if (!strcmp(s, "channel") || !strcmp(s, "v4")) c->kind = PS_ATTN_CHANNEL; /* "v4": the deprecated name (docs/training.md) */
            else if (!strcmp(s, "select")) c->kind = PS_ATTN_SELECT;
            else {
                char b[64];
                size_t w = 0;
                for (; s[w] && w < 40; w++) b[w] = (unsigned char)s[w] < 0x20 || (unsigned char)s[w] >= 0x7f ? '?' : s[w];
                b[w] = '\0';
                return ps_fail(err, "%s: key \"attention.kind\" is \"%s%s\", expected \"full\", \"compressed\", \"channel\" or \"select\"", src, b,
                               s[w] ? "..." : "");
            }
        } else if (!strcmp(k, "window")) e = get_int(v, "attention.window", src, &c->window, err), seen_geom = 1, geom_key = "window";
        else if (!strcmp(k, "stride")) e = get_int(v, "attention.stride", src, &c->stride, err), seen_geom = 1, geom_key = "stride";
        else if (!strcmp(k, "block")) e = get_int(v, "attention.block", src, &c->block, err), seen_sel = seen_block = 1, sel_key = "block";
        else if (!strcmp(k, "topk")) e = get_int(v, "attention.topk", src, &c->topk, err), seen_sel = seen_topk = 1, sel_key = "topk";
        else if (!strcmp(k, "init_blocks")) e = get_int(v, "attention.init_blocks", src, &c->init_blocks, err), seen_sel = 1, sel_key = "init_blocks";
        else if (!strcmp(k, "local_blocks")) e = get_int(v, "attention.local_blocks", src, &c->local_blocks, err), seen_sel = 1, sel_key = "local_blocks";
        else if (!strcmp(k, "dense_len")) e = get_int(v, "attention.dense_len", src, &c->dense_len, err), seen_sel = 1, sel_key = "dense_len";
        else if (!strcmp(k, "local_window")) e = get_int(v, "attention.local_window", src, &c->local_window, err), seen_lw = 1;
        else if (!strcmp(k, "gate")) {
            e = get_enum(v, "attention.gate", src, "learned", "uniform", &tmp, err);
            c->gate = (ps_gate_kind)tmp;
            seen_comp = 1, comp_key = "gate";
        } else if (!strcmp(k, "payload")) {
            e = get_enum(v, "attention.payload", src, "per_offset", "shared", &tmp, err);
            c->payload = (ps_payload_kind)tmp;
            seen_comp = 1, comp_key = "payload";
        } else if (!strcmp(k, "head_offsets")) {
            e = get_head_offsets(v, src, c, err);
            seen_comp = 1, comp_key = "head_offsets";
        } else if (!strcmp(k, "boundaries")) {
            e = get_enum(v, "attention.boundaries", src, "grid", "content", &tmp, err);
            c->boundaries = (ps_boundaries)tmp;
            seen_comp = 1, comp_key = "boundaries";
        } else if (!strcmp(k, "chunk_min")) {
            e = get_int(v, "attention.chunk_min", src, &c->chunk_min, err), seen_comp = 1, comp_key = "chunk_min";
            seen_cmin = 1;
        } else if (!strcmp(k, "rate")) e = get_int(v, "attention.rate", src, &c->rate, err), seen_v4 = 1, v4_key = "rate";
        else if (!strcmp(k, "mode")) {
            e = get_enum(v, "attention.mode", src, "csa", "hca", &tmp, err);
            c->v4_mode = (ps_v4_mode)tmp;
            seen_v4 = 1, v4_key = "mode";
        } else
            return ps_fail(err,
                           "%s: unknown key \"attention.%s\" (valid: kind, window, stride, local_window, gate, payload, head_offsets, "
                           "boundaries, chunk_min; "
                           "kind \"channel\": rate, mode, local_window; kind \"select\": window, stride, block, topk, init_blocks, "
                           "local_blocks, dense_len)",
                           src, k);
        if (e) return -1;
    }
    if (seen_geom && c->kind == PS_ATTN_CHANNEL) seen_comp = 1, comp_key = geom_key;
    if (c->kind == PS_ATTN_SELECT && (seen_comp || seen_lw || seen_v4))
        return ps_fail(err, "%s: key \"attention.%s\" does not apply to kind \"select\" (its keys: window, stride, block, topk, "
                       "init_blocks, local_blocks, dense_len)", src, seen_comp ? comp_key : seen_lw ? "local_window" : v4_key);
    if (c->kind != PS_ATTN_SELECT && seen_sel)
        return ps_fail(err, "%s: key \"attention.%s\" applies to kind \"select\" only", src, sel_key);
    if (c->kind == PS_ATTN_SELECT && (!seen_geom || !json_object_get(att, "window") || !seen_block || !seen_topk))
        return ps_fail(err, "%s: missing key \"attention.%s\" (kind \"select\" needs window, block and topk)", src,
                       !json_object_get(att, "window") ? "window" : !seen_block ? "block" : "topk");
    if (c->kind == PS_ATTN_CHANNEL && seen_comp)
        return ps_fail(err, "%s: key \"attention.%s\" does not apply to kind \"channel\" (its keys: rate, mode, local_window)", src, comp_key);
    if (c->kind != PS_ATTN_CHANNEL && seen_v4)
        return ps_fail(err, "%s: key \"attention.%s\" applies to kind \"channel\" only", src, v4_key);
    if (c->kind == PS_ATTN_CHANNEL && !seen_lw) c->local_window = c->rate; /* default: one window of raw tokens */
    if (seen_cmin && c->boundaries != PS_BOUNDARIES_CONTENT)
        return ps_fail(err, "%s: key \"attention.chunk_min\" applies to \"boundaries\": \"content\" only", src);
    if (seen_cmin && c->chunk_min < 1)
        return ps_fail(err, "%s: key \"attention.chunk_min\" must be >= 1, got %lld", src, (long long)c->chunk_min);
    if (c->n_offset_layers != 0 && c->kind != PS_ATTN_COMPRESSED) /* the per-layer forms are new: refused, not ignored */
        return ps_fail(err, "%s: key \"attention.head_offsets\" (per-layer offsets) applies to kind \"compressed\" only", src);
    return 0;
}

static const char *const REQUIRED[] = {"vocab_size", "d_model",  "n_layers", "n_heads",
                                       "n_kv_heads", "head_dim", "d_ff",     "max_seq_len"};

static int64_t *required_slot(ps_config *c, int i) {
    int64_t *slots[] = {&c->vocab_size, &c->d_model,  &c->n_layers, &c->n_heads,
                        &c->n_kv_heads, &c->head_dim, &c->d_ff,     &c->max_seq_len};
    return slots[i];
}

static int parse_native(json_t *root, const char *src, ps_config *c, ps_error *err) {
    bool seen[8] = {0};
    const char *k;
    json_t *v;
    json_object_foreach(root, k, v) {
        int e = 0, found = 0;
        for (int i = 0; i < 8; i++)
            if (!strcmp(k, REQUIRED[i])) {
                e = get_int(v, k, src, required_slot(c, i), err);
                seen[i] = true;
                found = 1;
            }
        if (found) {
            if (e) return -1;
            continue;
        }
        if (!strcmp(k, "rope")) e = get_bool(v, k, src, &c->rope, err);
        else if (!strcmp(k, "rope_theta")) e = get_num(v, k, src, &c->rope_theta, err);
        else if (!strcmp(k, "qk_norm")) e = get_bool(v, k, src, &c->qk_norm, err);
        else if (!strcmp(k, "rms_eps")) e = get_num(v, k, src, &c->rms_eps, err);
        else if (!strcmp(k, "tie_embeddings")) e = get_bool(v, k, src, &c->tie_embeddings, err);
        else if (!strcmp(k, "attention")) e = parse_attention(v, src, c, err);
        else
            return ps_fail(err,
                           "%s: unknown key \"%s\" (valid: vocab_size, d_model, n_layers, n_heads, n_kv_heads, "
                           "head_dim, d_ff, max_seq_len, rope, rope_theta, qk_norm, rms_eps, tie_embeddings, "
                           "attention)",
                           src, k);
        if (e) return -1;
    }
    for (int i = 0; i < 8; i++)
        if (!seen[i]) return ps_fail(err, "%s: missing required key \"%s\"", src, REQUIRED[i]);
    return 0;
}


/* A short printable copy of an untrusted string for a one-line message. */
static const char *printable(const char *s, char *buf, size_t n) {
    size_t w = 0;
    for (; *s && w + 4 < n; s++) buf[w++] = ((unsigned char)*s < 0x20 || (unsigned char)*s >= 0x7f) ? '?' : *s;
    if (*s) {
        if (w > n - 4) w = n - 4;
        memcpy(buf + w, "...", 3);
        w += 3;
    }
    buf[w] = '\0';
    return buf;
}

/* rope_parameters (transformers 5) or rope_scaling (4.x): only the plain ("default") rotary form. */
static int parse_rope_object(json_t *v, const char *key, const char *src, double *theta, int *has_theta, ps_error *err) {
    char b[64];
    if (json_is_null(v) && !strcmp(key, "rope_scaling")) return 0;
    if (!json_is_object(v)) return ps_fail(err, "%s: key \"%s\" must be an object, got %s", src, key, ps_json_type_name(v));
    const char *k;
    json_t *x;
    json_object_foreach(v, k, x) {
        char full[96];
        snprintf(full, sizeof full, "%s.%s", key, printable(k, b, 40));
        if (!strcmp(k, "rope_type") || !strcmp(k, "type")) {
            if (!json_is_string(x)) return ps_fail(err, "%s: key \"%s\" must be a string", src, full);
            if (strcmp(json_string_value(x), "default"))
                return ps_fail(err, "%s: key \"%s\" is \"%s\": only \"default\" RoPE is supported (SPEC §2)", src, full,
                               printable(json_string_value(x), b, sizeof b));
        } else if (!strcmp(k, "rope_theta")) {
            if (get_num(x, full, src, theta, err)) return -1;
            *has_theta = 1;
        } else if (!strcmp(k, "partial_rotary_factor")) {
            double f = 1.0;
            if (get_num(x, full, src, &f, err)) return -1;
            if (f != 1.0) return ps_fail(err, "%s: key \"%s\" is %g: only full rotary embeddings (1.0) are supported", src, full, f);
        } else
            return ps_fail(err, "%s: key \"%s\" is not supported (valid: rope_type \"default\", rope_theta)", src, full);
    }
    return 0;
}

/* Hugging Face Qwen3: map the keys SPEC §2 lists; read the newer forms (rope_parameters, dtype,
 * layer_types, architectures); refuse what would change the math (sliding-window layers, RoPE
 * scaling, another activation); ignore the rest; full attention unless the phasescope "attention"
 * extension says otherwise. Missing keys take transformers' Qwen3Config defaults. */
static int parse_hf(json_t *root, const char *src, ps_config *c, ps_error *err) {
    static const char *const map[][2] = {
        {"vocab_size", "vocab_size"},       {"hidden_size", "d_model"},          {"num_hidden_layers", "n_layers"},
        {"num_attention_heads", "n_heads"}, {"num_key_value_heads", "n_kv_heads"}, {"head_dim", "head_dim"},
        {"intermediate_size", "d_ff"},      {"max_position_embeddings", "max_seq_len"},
    };
    char b[64];
    for (int i = 0; i < 8; i++) {
        json_t *v = json_object_get(root, map[i][0]);
        int64_t *slot = NULL;
        for (int j = 0; j < 8; j++)
            if (!strcmp(map[i][1], REQUIRED[j])) slot = required_slot(c, j);
        if (!v || (json_is_null(v) && !strcmp(map[i][0], "num_key_value_heads"))) {
            if (!strcmp(map[i][0], "num_key_value_heads") || !strcmp(map[i][0], "head_dim")) continue;
            return ps_fail(err, "%s: missing required key \"%s\" (Hugging Face qwen3 config)", src, map[i][0]);
        }
        if (get_int(v, map[i][0], src, slot, err)) return -1;
    }
    json_t *v = json_object_get(root, "num_key_value_heads");
    if (!v || json_is_null(v)) c->n_kv_heads = c->n_heads;
    if (!json_object_get(root, "head_dim")) c->head_dim = 128; /* transformers' Qwen3Config default */
    c->tie_embeddings = false;                                 /* likewise */
    double theta = 10000.0, theta2 = 0;
    int has1 = 0, has2 = 0;
    if ((v = json_object_get(root, "rope_theta"))) {
        if (get_num(v, "rope_theta", src, &theta, err)) return -1;
        has1 = 1;
    }
    if ((v = json_object_get(root, "rope_parameters")) && !json_is_null(v) &&
        parse_rope_object(v, "rope_parameters", src, &theta2, &has2, err))
        return -1;
    if ((v = json_object_get(root, "rope_scaling")) && parse_rope_object(v, "rope_scaling", src, &theta2, &has2, err))
        return -1;
    if (has1 && has2 && theta != theta2)
        return ps_fail(err, "%s: key \"rope_parameters.rope_theta\" (%g) disagrees with \"rope_theta\" (%g)", src, theta2, theta);
    c->rope_theta = has2 ? theta2 : theta;
    if ((v = json_object_get(root, "rms_norm_eps")) && get_num(v, "rms_norm_eps", src, &c->rms_eps, err)) return -1;
    if ((v = json_object_get(root, "tie_word_embeddings")) &&
        get_bool(v, "tie_word_embeddings", src, &c->tie_embeddings, err))
        return -1;
    /* dtype (transformers >= 4.56) and torch_dtype: the weights' storage type, informative only */
    const char *dt[2] = {NULL, NULL};
    static const char *const dtk[2] = {"dtype", "torch_dtype"};
    for (int i = 0; i < 2; i++)
        if ((v = json_object_get(root, dtk[i])) && !json_is_null(v)) {
            if (!json_is_string(v)) return ps_fail(err, "%s: key \"%s\" must be a string, got %s", src, dtk[i], ps_json_type_name(v));
            dt[i] = json_string_value(v);
            if (strcmp(dt[i], "float32") && strcmp(dt[i], "bfloat16") && strcmp(dt[i], "float16") && strcmp(dt[i], "auto"))
                return ps_fail(err, "%s: key \"%s\" is \"%s\" (expected \"float32\", \"bfloat16\" or \"float16\")", src,
                               dtk[i], printable(dt[i], b, sizeof b));
        }
    if (dt[0] && dt[1] && strcmp(dt[0], dt[1]))
        return ps_fail(err, "%s: key \"dtype\" (\"%s\") disagrees with \"torch_dtype\" (\"%s\")", src, dt[0], dt[1]);
    if ((v = json_object_get(root, "architectures")) && !json_is_null(v)) {
        if (!json_is_array(v)) return ps_fail(err, "%s: key \"architectures\" must be an array of strings, got %s", src, ps_json_type_name(v));
        int ok = 0;
        for (size_t i = 0; i < json_array_size(v); i++) {
            json_t *a = json_array_get(v, i);
            if (!json_is_string(a)) return ps_fail(err, "%s: key \"architectures[%zu]\" must be a string", src, i);
            if (!strcmp(json_string_value(a), "Qwen3ForCausalLM")) ok = 1;
        }
        if (!ok) return ps_fail(err, "%s: key \"architectures\" does not list \"Qwen3ForCausalLM\" (the only architecture accepted)", src);
    }
    if ((v = json_object_get(root, "hidden_act")) && !json_is_null(v) &&
        (!json_is_string(v) || strcmp(json_string_value(v), "silu")))
        return ps_fail(err, "%s: key \"hidden_act\" must be \"silu\" (the SwiGLU MLP of SPEC §2)", src);
    if ((v = json_object_get(root, "attention_bias")) && !json_is_null(v) && !json_is_false(v))
        return ps_fail(err, "%s: key \"attention_bias\" must be false (Qwen3 attention has no biases in SPEC §2)", src);
    json_t *lt = json_object_get(root, "layer_types");
    if (lt && !json_is_null(lt)) {
        if (!json_is_array(lt)) return ps_fail(err, "%s: key \"layer_types\" must be an array of strings, got %s", src, ps_json_type_name(lt));
        if ((int64_t)json_array_size(lt) != c->n_layers)
            return ps_fail(err, "%s: key \"layer_types\" has %zu entries but num_hidden_layers is %lld", src,
                           json_array_size(lt), (long long)c->n_layers);
        for (size_t i = 0; i < json_array_size(lt); i++) {
            json_t *a = json_array_get(lt, i);
            if (!json_is_string(a)) return ps_fail(err, "%s: key \"layer_types[%zu]\" must be a string, got %s", src, i, ps_json_type_name(a));
            if (strcmp(json_string_value(a), "full_attention"))
                return ps_fail(err, "%s: key \"layer_types[%zu]\" is \"%s\": only \"full_attention\" layers are supported", src, i,
                               printable(json_string_value(a), b, sizeof b));
        }
    } else if ((v = json_object_get(root, "use_sliding_window")) && json_is_true(v)) {
        /* transformers: without layer_types, layers from max_window_layers on use the sliding window */
        json_t *sw = json_object_get(root, "sliding_window"), *mw = json_object_get(root, "max_window_layers");
        int64_t mwl = 28;
        if (mw && get_int(mw, "max_window_layers", src, &mwl, err)) return -1;
        if (!json_is_null(sw) && mwl < c->n_layers)
            return ps_fail(err, "%s: key \"use_sliding_window\" is true: layers %lld.. would use sliding-window attention, "
                           "which is not supported", src, (long long)(mwl < 0 ? 0 : mwl));
    }
    c->kind = PS_ATTN_FULL;
    if ((v = json_object_get(root, "attention")) && parse_attention(v, src, c, err)) return -1; /* phasescope extension */
    return 0;
}

int ps_config_validate(const ps_config *c, const char *src, ps_error *err) {
    const int64_t *req[] = {&c->vocab_size, &c->d_model,  &c->n_layers, &c->n_heads,
                            &c->n_kv_heads, &c->head_dim, &c->d_ff,     &c->max_seq_len};
    for (int i = 0; i < 8; i++) {
        if (*req[i] < 1) return ps_fail(err, "%s: key \"%s\" must be >= 1, got %lld", src, REQUIRED[i], (long long)*req[i]);
        if (*req[i] > PS_MAX_DIM)
            return ps_fail(err, "%s: key \"%s\" is %lld, more than the supported maximum %lld", src, REQUIRED[i],
                           (long long)*req[i], (long long)PS_MAX_DIM);
    }
    if (c->n_heads % c->n_kv_heads)
        return ps_fail(err, "%s: key \"n_heads\" (%lld) must be a multiple of \"n_kv_heads\" (%lld)", src,
                       (long long)c->n_heads, (long long)c->n_kv_heads);
    if (c->rope && c->head_dim % 2)
        return ps_fail(err, "%s: key \"head_dim\" (%lld) must be even when rope is true", src, (long long)c->head_dim);
    if (!(c->rope_theta > 0) || !isfinite(c->rope_theta))
        return ps_fail(err, "%s: key \"rope_theta\" must be > 0, got %g", src, c->rope_theta);
    if (!(c->rms_eps > 0) || !isfinite(c->rms_eps))
        return ps_fail(err, "%s: key \"rms_eps\" must be > 0, got %g", src, c->rms_eps);
    /* Parameter and per-token sizes must stay sane: refuse absurd totals before anything allocates. */
    double params = (double)c->vocab_size * c->d_model * 2 +
                    (double)c->n_layers * ((double)c->d_model * c->head_dim * (2 * c->n_heads + 2 * c->n_kv_heads) +
                                           3.0 * c->d_model * c->d_ff);
    if (params > 1e11) return ps_fail(err, "%s: model would have about %.3g parameters; refusing (limit 1e11)", src, params);
    if (c->kind == PS_ATTN_CHANNEL) {
        if (c->rate < 1 || c->rate > 4096)
            return ps_fail(err, "%s: key \"attention.rate\" must be in [1, 4096], got %lld", src, (long long)c->rate);
        if (c->v4_mode != PS_V4_MODE_CSA && c->v4_mode != PS_V4_MODE_HCA)
            return ps_fail(err, "%s: key \"attention.mode\" must be \"csa\" or \"hca\"", src);
        if (c->local_window < 1 || c->local_window > PS_MAX_DIM)
            return ps_fail(err, "%s: key \"attention.local_window\" must be in [1, %lld], got %lld", src, (long long)PS_MAX_DIM,
                           (long long)c->local_window);
        if (c->n_kv_heads != 1)
            return ps_fail(err, "%s: key \"n_kv_heads\" is %lld: the channel attention has one K=V head (DeepSeek-V4), so it must be 1", src,
                           (long long)c->n_kv_heads);
    }
    if (c->kind == PS_ATTN_SELECT) {
        static const char *const names[6] = {"attention.window", "attention.stride", "attention.block", "attention.init_blocks",
                                             "attention.local_blocks", "attention.topk"};
        ps_select_cfg sc = ps_config_select(c);
        if (ps_select_cfg_check(&sc, src, names, err)) return -1;
        if (c->window > 4096 || c->block > PS_MAX_DIM || c->topk > PS_MAX_DIM || c->init_blocks > PS_MAX_DIM ||
            c->local_blocks > PS_MAX_DIM)
            return ps_fail(err, "%s: key \"attention.window\" (at most 4096) or a block count (at most %lld) is too large", src,
                           (long long)PS_MAX_DIM);
        if (c->topk < c->init_blocks + 1)
            return ps_fail(err, "%s: key \"attention.topk\" is %lld: it must be at least init_blocks + 1 = %lld (room for a block "
                           "beyond the initial ones)", src, (long long)c->topk, (long long)(c->init_blocks + 1));
    }
    if (c->kind != PS_ATTN_COMPRESSED && c->n_offset_layers > 0)
        return ps_fail(err, "%s: key \"attention.head_offsets\" (per-layer offsets) applies to kind \"compressed\" only", src);
    if (c->kind == PS_ATTN_COMPRESSED && c->n_offset_layers > 0) {
        if (c->n_offset_layers != c->n_layers)
            return ps_fail(err, "%s: key \"attention.head_offsets\" has %lld rows, n_layers is %lld (one row of offsets per layer)", src,
                           (long long)c->n_offset_layers, (long long)c->n_layers);
        if (c->n_grid_offsets != c->n_kv_heads)
            return ps_fail(err, "%s: key \"attention.head_offsets\" has rows of %lld entries, n_kv_heads is %lld (one offset per KV "
                           "head)", src, (long long)c->n_grid_offsets, (long long)c->n_kv_heads);
        if (c->n_layers * c->n_kv_heads > PS_MAX_GRID_OFFSETS)
            return ps_fail(err, "%s: key \"attention.head_offsets\": %lld layers of %lld KV heads exceed the supported %d offsets", src,
                           (long long)c->n_layers, (long long)c->n_kv_heads, PS_MAX_GRID_OFFSETS);
        for (int64_t i = 0; i < c->n_layers * c->n_kv_heads; i++)
            if (c->layer_offsets[i] < 0 || c->layer_offsets[i] >= (c->stride > 0 ? c->stride : 1))
                return ps_fail(err, "%s: key \"attention.head_offsets\": entry [%lld][%lld] is %lld, must be in [0, attention.stride = "
                               "%lld)", src, (long long)(i / c->n_kv_heads), (long long)(i % c->n_kv_heads),
                               (long long)c->layer_offsets[i], (long long)c->stride);
    } else if (c->kind == PS_ATTN_COMPRESSED && c->n_grid_offsets != 0) {
        if (c->n_grid_offsets != c->n_kv_heads)
            return ps_fail(err, "%s: key \"attention.head_offsets\" has %lld entries, n_kv_heads is %lld (one offset per KV head)", src,
                           (long long)c->n_grid_offsets, (long long)c->n_kv_heads);
        for (int64_t g = 0; g < c->n_grid_offsets; g++)
            if (c->head_offsets[g] < 0 || c->head_offsets[g] >= (c->stride > 0 ? c->stride : 1))
                return ps_fail(err, "%s: key \"attention.head_offsets\": entry %lld is %lld, must be in [0, attention.stride = %lld)", src,
                               (long long)g, (long long)c->head_offsets[g], (long long)c->stride);
    }
    if (c->kind == PS_ATTN_COMPRESSED && c->boundaries == PS_BOUNDARIES_CONTENT) {
        /* chunks of chunk_min .. W tokens with mean S (docs/mitigations.md §4): needs chunk_min < S < W */
        if (c->chunk_min < 1 || c->chunk_min >= c->stride || c->stride >= c->window)
            return ps_fail(err,
                           "%s: key \"attention.boundaries\" \"content\" needs 1 <= attention.chunk_min < attention.stride < "
                           "attention.window (the shortest chunk, the mean chunk length, the longest chunk); got chunk_min %lld, "
                           "stride %lld, window %lld",
                           src, (long long)c->chunk_min, (long long)c->stride, (long long)c->window);
        if (c->any_head_offset)
            return ps_fail(err, "%s: key \"attention.boundaries\" \"content\" cannot be combined with attention.head_offsets", src);
    } else if (c->kind == PS_ATTN_COMPRESSED && c->chunk_min != 0)
        return ps_fail(err, "%s: key \"attention.chunk_min\" applies to \"boundaries\": \"content\" only", src);
    if (c->kind == PS_ATTN_COMPRESSED) {
        if (c->window < 1) return ps_fail(err, "%s: key \"attention.window\" must be >= 1, got %lld", src, (long long)c->window);
        if (c->window > 4096)
            return ps_fail(err, "%s: key \"attention.window\" is %lld, more than the supported maximum 4096", src,
                           (long long)c->window);
        if (c->stride < 1) return ps_fail(err, "%s: key \"attention.stride\" must be >= 1, got %lld", src, (long long)c->stride);
        if (c->stride > c->window)
            return ps_fail(err, "%s: key \"attention.stride\" (%lld) must not exceed attention.window (%lld)", src,
                           (long long)c->stride, (long long)c->window);
        if (c->local_window < 1)
            return ps_fail(err, "%s: key \"attention.local_window\" must be >= 1, got %lld", src, (long long)c->local_window);
        if (c->local_window > PS_MAX_DIM)
            return ps_fail(err, "%s: key \"attention.local_window\" is %lld, more than the supported maximum %lld", src,
                           (long long)c->local_window, (long long)PS_MAX_DIM);
    }
    return 0;
}

int ps_config_parse(const char *text, size_t len, const char *src, ps_config *c, ps_error *err) {
    ps_config_defaults(c);
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!root) return ps_fail(err, "%s: not valid JSON (line %d: %s)", src, je.line, je.text);
    int rc = -1;
    if (!json_is_object(root)) {
        ps_fail(err, "%s: config must be a JSON object", src);
        goto done;
    }
    json_t *mt = json_object_get(root, "model_type");
    if (mt) {
        if (!json_is_string(mt) || strcmp(json_string_value(mt), "qwen3") != 0) {
            ps_fail(err, "%s: key \"model_type\" must be \"qwen3\" (the only Hugging Face architecture accepted)", src);
            goto done;
        }
        if (parse_hf(root, src, c, err)) goto done;
    } else if (parse_native(root, src, c, err))
        goto done;
    if (c->stride == -1) c->stride = c->window;
    if (c->local_window == -1) c->local_window = c->window;
    if (c->boundaries == PS_BOUNDARIES_CONTENT && c->chunk_min == 0) c->chunk_min = c->stride / 2 > 1 ? c->stride / 2 : 1;
    if (c->kind != PS_ATTN_COMPRESSED) c->boundaries = PS_BOUNDARIES_GRID, c->chunk_min = 0; /* ignored (SPEC §2) */
    if (c->n_grid_offsets == -1) { /* "staggered": o_g = floor(g*S/n_kv) */
        if (c->n_kv_heads < 1 || c->n_kv_heads > PS_MAX_GRID_HEADS) {
            ps_fail(err, "%s: key \"attention.head_offsets\" \"staggered\" needs 1..%d KV heads, n_kv_heads is %lld", src,
                    PS_MAX_GRID_HEADS, (long long)c->n_kv_heads);
            goto done;
        }
        c->n_grid_offsets = c->n_kv_heads;
        c->any_head_offset = false;
        for (int64_t g = 0; g < c->n_kv_heads; g++) {
            c->head_offsets[g] = g * c->stride / c->n_kv_heads;
            if (c->head_offsets[g]) c->any_head_offset = true;
        }
    }
    if (c->n_offset_layers == -1) { /* "staggered_layers": o_{l,g} = (floor(g*S/n_kv) + l*k) mod S */
        if (c->n_kv_heads < 1 || c->n_kv_heads > PS_MAX_GRID_HEADS || c->n_layers < 1 ||
            c->n_layers * c->n_kv_heads > PS_MAX_GRID_OFFSETS || c->stride < 1) {
            ps_fail(err, "%s: key \"attention.head_offsets\" \"staggered_layers\" needs 1..%d KV heads, a stride >= 1 and at most %d "
                    "(layer, KV head) pairs; n_layers is %lld, n_kv_heads %lld, stride %lld", src, PS_MAX_GRID_HEADS,
                    PS_MAX_GRID_OFFSETS, (long long)c->n_layers, (long long)c->n_kv_heads, (long long)c->stride);
            goto done;
        }
        int64_t S = c->stride, k = ps_config_layer_stagger(S);
        c->n_offset_layers = c->n_layers;
        c->n_grid_offsets = c->n_kv_heads;
        for (int64_t l = 0; l < c->n_layers; l++)
            for (int64_t g = 0; g < c->n_kv_heads; g++)
                c->any_head_offset |= (c->layer_offsets[l * c->n_kv_heads + g] = (int32_t)((g * S / c->n_kv_heads + l * k) % S)) != 0;
    }
    rc = ps_config_validate(c, src, err);
    /* one form for one grid (a round trip gives the same struct): no offsets unless a compressed model has a
     * non-zero one (SPEC §2: attention keys are ignored for full attention); equal rows are one row */
    if (!rc) normalize_offsets(c);
done:
    json_decref(root);
    return rc;
}

int ps_config_load(const char *path, ps_config *out, ps_error *err) {
    char *text;
    size_t len;
    if (ps_read_file(path, (size_t)16 << 20, &text, &len, err)) return -1;
    int rc = ps_config_parse(text, len, path, out, err);
    free(text);
    return rc;
}

/* The fewest significant digits (15..17) that print v so that it reads back exactly. */
static int round_trip_digits(double v) {
    for (int p = 15; p < 17; p++) {
        char buf[64];
        snprintf(buf, sizeof buf, "%.*g", p, v);
        if (strtod(buf, NULL) == v) return p;
    }
    return 17;
}

/* The `attention` object of the native schema (also phasescope's extension of an HF config). */
static json_t *attention_json(const ps_config *c) {
    json_t *a = json_object();
    if (c->kind == PS_ATTN_CHANNEL) {
        json_object_set_new(a, "kind", json_string("channel"));
        json_object_set_new(a, "rate", json_integer(c->rate));
        json_object_set_new(a, "mode", json_string(c->v4_mode == PS_V4_MODE_HCA ? "hca" : "csa"));
        json_object_set_new(a, "local_window", json_integer(c->local_window));
        return a;
    }
    if (c->kind == PS_ATTN_SELECT) {
        json_object_set_new(a, "kind", json_string("select"));
        json_object_set_new(a, "window", json_integer(c->window));
        json_object_set_new(a, "stride", json_integer(c->stride));
        json_object_set_new(a, "block", json_integer(c->block));
        json_object_set_new(a, "topk", json_integer(c->topk));
        json_object_set_new(a, "init_blocks", json_integer(c->init_blocks));
        json_object_set_new(a, "local_blocks", json_integer(c->local_blocks));
        json_object_set_new(a, "dense_len", json_integer(c->dense_len));
        return a;
    }
    json_object_set_new(a, "kind", json_string(c->kind == PS_ATTN_COMPRESSED ? "compressed" : "full"));
    json_object_set_new(a, "window", json_integer(c->window));
    json_object_set_new(a, "stride", json_integer(c->stride));
    json_object_set_new(a, "local_window", json_integer(c->local_window));
    json_object_set_new(a, "gate", json_string(c->gate == PS_GATE_UNIFORM ? "uniform" : "learned"));
    json_object_set_new(a, "payload", json_string(c->payload == PS_PAYLOAD_SHARED ? "shared" : "per_offset"));
    if (ps_config_per_layer_offsets(c)) { /* [n_layers][n_kv_heads] */
        json_t *arr = json_array();
        for (int64_t l = 0; l < c->n_offset_layers; l++) {
            json_t *row = json_array();
            for (int64_t g = 0; g < c->n_kv_heads; g++) json_array_append_new(row, json_integer(ps_config_grid_offset(c, l, g)));
            json_array_append_new(arr, row);
        }
        json_object_set_new(a, "head_offsets", arr);
    } else if (c->any_head_offset) { /* only when non-zero: every base-model config (and its hash) stays as it was */
        json_t *arr = json_array();
        for (int64_t g = 0; g < c->n_kv_heads && g < PS_MAX_GRID_HEADS; g++) json_array_append_new(arr, json_integer(c->head_offsets[g]));
        json_object_set_new(a, "head_offsets", arr);
    }
    if (c->kind == PS_ATTN_COMPRESSED && c->boundaries == PS_BOUNDARIES_CONTENT) { /* only then: base hashes unchanged */
        json_object_set_new(a, "boundaries", json_string("content"));
        json_object_set_new(a, "chunk_min", json_integer(c->chunk_min));
    }
    return a;
}

/* Serialise a config object with the fewest digits that read rope_theta and rms_eps back exactly;
 * consumes o. */
static char *dump_config(json_t *o, const ps_config *c) {
    int digits = round_trip_digits(c->rope_theta), d2 = round_trip_digits(c->rms_eps);
    char *s = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(d2 > digits ? d2 : digits));
    json_decref(o);
    return s;
}

char *ps_config_to_json(const ps_config *c) {
    json_t *o = json_object();
    json_object_set_new(o, "vocab_size", json_integer(c->vocab_size));
    json_object_set_new(o, "d_model", json_integer(c->d_model));
    json_object_set_new(o, "n_layers", json_integer(c->n_layers));
    json_object_set_new(o, "n_heads", json_integer(c->n_heads));
    json_object_set_new(o, "n_kv_heads", json_integer(c->n_kv_heads));
    json_object_set_new(o, "head_dim", json_integer(c->head_dim));
    json_object_set_new(o, "d_ff", json_integer(c->d_ff));
    json_object_set_new(o, "max_seq_len", json_integer(c->max_seq_len));
    json_object_set_new(o, "rope", json_boolean(c->rope));
    json_object_set_new(o, "rope_theta", json_real(c->rope_theta));
    json_object_set_new(o, "qk_norm", json_boolean(c->qk_norm));
    json_object_set_new(o, "rms_eps", json_real(c->rms_eps));
    json_object_set_new(o, "tie_embeddings", json_boolean(c->tie_embeddings));
    json_object_set_new(o, "attention", attention_json(c));
    return dump_config(o, c);
}

int ps_config_save(const ps_config *c, const char *path, ps_error *err) {
    char *s = ps_config_to_json(c);
    if (!s) return ps_fail(err, "%s: cannot serialise config", path);
    int rc = ps_write_text_atomic(path, s, err);
    free(s);
    return rc;
}

char *ps_config_to_hf_json(const ps_config *c, const char *dtype, ps_error *err) {
    if (!c->rope || !c->qk_norm)
        return ps_fail(err, "the Hugging Face layout needs rope and qk_norm true (a Qwen3 config cannot switch them off); "
                            "save this model in phasescope's layout"), NULL;
    if (!dtype) dtype = "float32";
    json_t *o = json_object();
    json_t *arch = json_array();
    json_array_append_new(arch, json_string("Qwen3ForCausalLM"));
    json_object_set_new(o, "architectures", arch);
    json_object_set_new(o, "model_type", json_string("qwen3"));
    json_object_set_new(o, "vocab_size", json_integer(c->vocab_size));
    json_object_set_new(o, "hidden_size", json_integer(c->d_model));
    json_object_set_new(o, "intermediate_size", json_integer(c->d_ff));
    json_object_set_new(o, "num_hidden_layers", json_integer(c->n_layers));
    json_object_set_new(o, "num_attention_heads", json_integer(c->n_heads));
    json_object_set_new(o, "num_key_value_heads", json_integer(c->n_kv_heads));
    json_object_set_new(o, "head_dim", json_integer(c->head_dim));
    json_object_set_new(o, "max_position_embeddings", json_integer(c->max_seq_len));
    json_object_set_new(o, "rms_norm_eps", json_real(c->rms_eps));
    json_t *rp = json_object();
    json_object_set_new(rp, "rope_theta", json_real(c->rope_theta));
    json_object_set_new(rp, "rope_type", json_string("default"));
    json_object_set_new(o, "rope_parameters", rp);
    json_object_set_new(o, "rope_theta", json_real(c->rope_theta)); /* what transformers 4.x reads */
    json_t *lt = json_array();
    for (int64_t l = 0; l < c->n_layers; l++) json_array_append_new(lt, json_string("full_attention"));
    json_object_set_new(o, "layer_types", lt);
    json_object_set_new(o, "sliding_window", json_null());
    json_object_set_new(o, "use_sliding_window", json_false());
    json_object_set_new(o, "max_window_layers", json_integer(c->n_layers));
    json_object_set_new(o, "tie_word_embeddings", json_boolean(c->tie_embeddings));
    json_object_set_new(o, "dtype", json_string(dtype));
    json_object_set_new(o, "torch_dtype", json_string(dtype)); /* what transformers < 4.56 reads */
    json_object_set_new(o, "attention_bias", json_false());
    json_object_set_new(o, "attention_dropout", json_real(0.0));
    json_object_set_new(o, "hidden_act", json_string("silu"));
    json_object_set_new(o, "initializer_range", json_real(0.02));
    json_object_set_new(o, "use_cache", json_true());
    json_object_set_new(o, "bos_token_id", json_integer(0)); /* SPEC §5: every sequence starts with BOS = 0 */
    /* phasescope's extension: transformers ignores it (see docs/models.md) */
    if (c->kind != PS_ATTN_FULL) json_object_set_new(o, "attention", attention_json(c));
    char *s = dump_config(o, c);
    if (!s) ps_fail(err, "cannot serialise config");
    return s;
}

int ps_config_save_hf(const ps_config *c, const char *dtype, const char *path, ps_error *err) {
    char *s = ps_config_to_hf_json(c, dtype, err);
    if (!s) return ps_fail_prefix(err, "%s: ", path);
    int rc = ps_write_text_atomic(path, s, err);
    free(s);
    return rc;
}

void ps_config_hash(const ps_config *c, char out[17]) {
    char *s = ps_config_to_json(c);
    uint64_t h = 1469598103934665603ULL;
    for (const char *p = s; p && *p; p++) {
        h ^= (unsigned char)*p;
        h *= 1099511628211ULL;
    }
    free(s);
    snprintf(out, 17, "%016llx", (unsigned long long)h);
}

int64_t ps_config_n_windows(const ps_config *c, int64_t T) {
    if (c->kind == PS_ATTN_CHANNEL) return T / c->rate; /* complete windows of m tokens */
    if (c->kind != PS_ATTN_COMPRESSED) return 0;
    if (c->boundaries == PS_BOUNDARIES_CONTENT) return c->chunk_min > 0 ? T / c->chunk_min : 0;
    if (T < c->window) return 0;
    return (T - c->window) / c->stride + 1;
}
