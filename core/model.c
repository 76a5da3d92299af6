#define _POSIX_C_SOURCE 200809L
#include "core/model.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/fileio.h"
#include "core/rng.h"
#include "core/safetensors.h"

static const char *const LAYER_NAMES[PS_P_NKINDS] = {
    [PS_P_IN_NORM] = "input_layernorm.weight",
    [PS_P_WQ] = "self_attn.q_proj.weight",
    [PS_P_WK] = "self_attn.k_proj.weight",
    [PS_P_WV] = "self_attn.v_proj.weight",
    [PS_P_WO] = "self_attn.o_proj.weight",
    [PS_P_QNORM] = "self_attn.q_norm.weight",
    [PS_P_KNORM] = "self_attn.k_norm.weight",
    [PS_P_KEY_PAYLOAD] = "self_attn.compressor.key_payload",
    [PS_P_VALUE_PAYLOAD] = "self_attn.compressor.value_payload",
    [PS_P_KEY_GATE_W] = "self_attn.compressor.key_gate.weight",
    [PS_P_KEY_GATE_B] = "self_attn.compressor.key_gate.bias",
    [PS_P_VALUE_GATE_W] = "self_attn.compressor.value_gate.weight",
    [PS_P_VALUE_GATE_B] = "self_attn.compressor.value_gate.bias",
    [PS_P_POST_NORM] = "post_attention_layernorm.weight",
    [PS_P_MLP_GATE] = "mlp.gate_proj.weight",
    [PS_P_MLP_UP] = "mlp.up_proj.weight",
    [PS_P_MLP_DOWN] = "mlp.down_proj.weight",
    [PS_P_V4_C_WKV] = "self_attn.compressor.kv_proj.weight",
    [PS_P_V4_C_WGATE] = "self_attn.compressor.gate_proj.weight",
    [PS_P_V4_C_APE] = "self_attn.compressor.position_bias",
    [PS_P_V4_C_NORM] = "self_attn.compressor.kv_norm.weight",
    [PS_P_V4_SINKS] = "self_attn.sinks",
};

static void add(ps_model *m, ps_param_kind kind, int layer, int ndim, int64_t a, int64_t b, int64_t c) {
    ps_param_info *p = &m->table[m->n_tensors++];
    p->kind = kind;
    p->layer = layer;
    p->ndim = ndim;
    p->shape[0] = a;
    p->shape[1] = b;
    p->shape[2] = c;
    p->numel = 1;
    for (int i = 0; i < ndim; i++) p->numel *= p->shape[i];
    p->offset = m->n_params;
    m->n_params += p->numel;
    const char *ln = LAYER_NAMES[kind];
    if (m->cfg.kind == PS_ATTN_CHANNEL && kind == PS_P_WK) ln = "self_attn.kv_proj.weight"; /* K = V */
    if (m->cfg.kind == PS_ATTN_CHANNEL && kind == PS_P_KNORM) ln = "self_attn.kv_norm.weight";
    if (layer >= 0) snprintf(p->name, sizeof p->name, "model.layers.%d.%s", layer, ln);
    else if (kind == PS_P_EMBED) snprintf(p->name, sizeof p->name, "model.embed_tokens.weight");
    else if (kind == PS_P_FINAL_NORM) snprintf(p->name, sizeof p->name, "model.norm.weight");
    else snprintf(p->name, sizeof p->name, "lm_head.weight");
}

int ps_model_create(ps_model *m, const ps_config *cfg, ps_error *err) {
    memset(m, 0, sizeof *m);
    if (ps_config_validate(cfg, "config", err)) return -1;
    m->cfg = *cfg;
    const ps_config *c = cfg;
    int64_t d = c->d_model, hd = c->head_dim, nh = c->n_heads, nkv = c->n_kv_heads, W = c->window;
    m->table = calloc((size_t)(c->n_layers * 22 + 3), sizeof *m->table);
    if (!m->table) return ps_fail(err, "out of memory for the parameter table");
    add(m, PS_P_EMBED, -1, 2, c->vocab_size, d, 0);
    for (int l = 0; l < c->n_layers; l++) {
        add(m, PS_P_IN_NORM, l, 1, d, 0, 0);
        add(m, PS_P_WQ, l, 2, nh * hd, d, 0);
        add(m, PS_P_WK, l, 2, nkv * hd, d, 0);
        if (c->kind != PS_ATTN_CHANNEL) add(m, PS_P_WV, l, 2, nkv * hd, d, 0); /* v4: K = V */
        add(m, PS_P_WO, l, 2, d, nh * hd, 0);
        if (c->qk_norm) {
            add(m, PS_P_QNORM, l, 1, hd, 0, 0);
            add(m, PS_P_KNORM, l, 1, hd, 0, 0);
        }
        if (c->kind == PS_ATTN_COMPRESSED) {
            if (c->payload == PS_PAYLOAD_PER_OFFSET) {
                add(m, PS_P_KEY_PAYLOAD, l, 3, W, nkv * hd, d);
                add(m, PS_P_VALUE_PAYLOAD, l, 3, W, nkv * hd, d);
            } else {
                add(m, PS_P_KEY_PAYLOAD, l, 2, nkv * hd, d, 0);
                add(m, PS_P_VALUE_PAYLOAD, l, 2, nkv * hd, d, 0);
            }
            if (c->gate == PS_GATE_LEARNED) {
                add(m, PS_P_KEY_GATE_W, l, 3, W, nkv, d);
                add(m, PS_P_KEY_GATE_B, l, 2, W, nkv, 0);
                add(m, PS_P_VALUE_GATE_W, l, 3, W, nkv, d);
                add(m, PS_P_VALUE_GATE_B, l, 2, W, nkv, 0);
            }
        }
        if (c->kind == PS_ATTN_CHANNEL) {
            int64_t cs = ps_config_v4_series(c);
            add(m, PS_P_V4_C_WKV, l, 2, cs * hd, d, 0);
            add(m, PS_P_V4_C_WGATE, l, 2, cs * hd, d, 0);
            add(m, PS_P_V4_C_APE, l, 2, c->rate, cs * hd, 0);
            add(m, PS_P_V4_C_NORM, l, 1, hd, 0, 0);
            add(m, PS_P_V4_SINKS, l, 1, nh, 0, 0);
        }
        add(m, PS_P_POST_NORM, l, 1, d, 0, 0);
        add(m, PS_P_MLP_GATE, l, 2, c->d_ff, d, 0);
        add(m, PS_P_MLP_UP, l, 2, c->d_ff, d, 0);
        add(m, PS_P_MLP_DOWN, l, 2, d, c->d_ff, 0);
    }
    add(m, PS_P_FINAL_NORM, -1, 1, d, 0, 0);
    if (!c->tie_embeddings) add(m, PS_P_LM_HEAD, -1, 2, c->vocab_size, d, 0);
    uint64_t avail = ps_mem_available();
    if (avail && (double)m->n_params * 4.0 > (double)avail) {
        int64_t n = m->n_params;
        ps_model_free(m);
        return ps_fail(err, "the model's %lld parameters need %.2f GiB but only %.2f GiB of memory is available", (long long)n,
                       (double)n * 4.0 / 1073741824.0, (double)avail / 1073741824.0);
    }
    if (ps_ctx_create(&m->ctx, "cpu", err)) {
        ps_model_free(m);
        return -1;
    }
    m->owns_ctx = 1;
    char what[64];
    snprintf(what, sizeof what, "%lld parameters", (long long)m->n_params);
    m->params = ps_buf_alloc(m->ctx, m->n_params * (int64_t)sizeof(float), what, err);
    if (!m->params) {
        ps_model_free(m);
        return -1;
    }
    return 0;
}

int ps_model_to_backend(ps_model *m, const char *backend, ps_error *err) {
    if (!backend || !strcmp(backend, ps_ctx_backend_name(m->ctx))) return 0;
    ps_ctx *ctx;
    if (ps_ctx_create(&ctx, backend, err)) return -1;
    if (ps_model_to(m, ctx, err)) {
        ps_ctx_free(ctx);
        return -1;
    }
    m->owns_ctx = 1;
    return 0;
}

int ps_model_to(ps_model *m, ps_ctx *ctx, ps_error *err) {
    if (ctx == m->ctx) return 0;
    int64_t bytes = m->n_params * (int64_t)sizeof(float);
    float *dst = ps_buf_alloc(ctx, bytes, "parameters", err);
    if (!dst) return -1;
    /* host -> any: one upload; device -> host: one download; device -> device: through a host copy */
    int rc;
    if (ps_ctx_host_visible(m->ctx)) rc = ps_buf_from_host(ctx, dst, m->params, bytes, err);
    else if (ps_ctx_host_visible(ctx)) rc = ps_buf_to_host(m->ctx, dst, m->params, bytes, err);
    else {
        void *tmp = malloc((size_t)bytes);
        rc = tmp ? ps_buf_to_host(m->ctx, tmp, m->params, bytes, err) || ps_buf_from_host(ctx, dst, tmp, bytes, err)
                 : ps_fail(err, "out of memory for a host copy of %lld parameters (%s to %s)", (long long)m->n_params,
                           ps_ctx_backend_name(m->ctx), ps_ctx_backend_name(ctx));
        free(tmp);
    }
    if (rc) {
        ps_buf_free(ctx, dst, bytes);
        return -1;
    }
    ps_buf_free(m->ctx, m->params, bytes);
    if (m->owns_ctx) ps_ctx_free(m->ctx);
    m->ctx = ctx;
    m->owns_ctx = 0;
    m->params = dst;
    return 0;
}

void ps_model_free(ps_model *m) {
    if (!m) return;
    free(m->table);
    if (m->ctx) ps_buf_free(m->ctx, m->params, m->n_params * (int64_t)sizeof(float));
    if (m->owns_ctx) ps_ctx_free(m->ctx);
    for (int i = 0; i < m->n_meta; i++) {
        free(m->meta_keys[i]);
        free(m->meta_vals[i]);
    }
    free(m->meta_keys);
    free(m->meta_vals);
    memset(m, 0, sizeof *m);
}

ps_layer_params ps_model_layer(const ps_model *m, float *base, int l) {
    ps_layer_params p;
    memset(&p, 0, sizeof p);
    float **slot[PS_P_NKINDS] = {
        [PS_P_IN_NORM] = &p.in_norm,           [PS_P_WQ] = &p.wq,
        [PS_P_WK] = &p.wk,                     [PS_P_WV] = &p.wv,
        [PS_P_WO] = &p.wo,                     [PS_P_QNORM] = &p.qnorm,
        [PS_P_KNORM] = &p.knorm,               [PS_P_KEY_PAYLOAD] = &p.key_payload,
        [PS_P_VALUE_PAYLOAD] = &p.value_payload, [PS_P_KEY_GATE_W] = &p.key_gate_w,
        [PS_P_KEY_GATE_B] = &p.key_gate_b,     [PS_P_VALUE_GATE_W] = &p.value_gate_w,
        [PS_P_VALUE_GATE_B] = &p.value_gate_b, [PS_P_POST_NORM] = &p.post_norm,
        [PS_P_MLP_GATE] = &p.mlp_gate,         [PS_P_MLP_UP] = &p.mlp_up,
        [PS_P_MLP_DOWN] = &p.mlp_down,         [PS_P_V4_C_WKV] = &p.c_wkv,
        [PS_P_V4_C_WGATE] = &p.c_wgate,        [PS_P_V4_C_APE] = &p.c_ape,
        [PS_P_V4_C_NORM] = &p.c_norm,          [PS_P_V4_SINKS] = &p.sinks,
    };
    for (int i = 0; i < m->n_tensors; i++)
        if (m->table[i].layer == l && slot[m->table[i].kind]) *slot[m->table[i].kind] = base + m->table[i].offset;
    return p;
}

static float *global_ptr(const ps_model *m, float *base, ps_param_kind k) {
    for (int i = 0; i < m->n_tensors; i++)
        if (m->table[i].kind == k) return base + m->table[i].offset;
    return NULL;
}

float *ps_model_embed(const ps_model *m, float *base) { return global_ptr(m, base, PS_P_EMBED); }
float *ps_model_final_norm(const ps_model *m, float *base) { return global_ptr(m, base, PS_P_FINAL_NORM); }
float *ps_model_lm_head(const ps_model *m, float *base) {
    return m->cfg.tie_embeddings ? global_ptr(m, base, PS_P_EMBED) : global_ptr(m, base, PS_P_LM_HEAD);
}

const ps_param_info *ps_model_find(const ps_model *m, const char *name) {
    for (int i = 0; i < m->n_tensors; i++)
        if (!strcmp(m->table[i].name, name)) return &m->table[i];
    return NULL;
}

void ps_model_init(ps_model *m, uint64_t seed) { ps_model_init_std(m, seed, 0.02); }

void ps_model_init_std(ps_model *m, uint64_t seed, double base_std) {
    ps_rng r;
    ps_rng_seed(&r, seed);
    double out_std = base_std / sqrt(2.0 * (double)m->cfg.n_layers);
    for (int i = 0; i < m->n_tensors; i++) {
        const ps_param_info *p = &m->table[i];
        float *w = m->params + p->offset;
        double std = base_std;
        switch (p->kind) {
        case PS_P_IN_NORM: case PS_P_POST_NORM: case PS_P_FINAL_NORM: case PS_P_QNORM: case PS_P_KNORM: case PS_P_V4_C_NORM:
            for (int64_t j = 0; j < p->numel; j++) w[j] = 1.0f;
            continue;
        case PS_P_KEY_GATE_W: case PS_P_KEY_GATE_B: case PS_P_VALUE_GATE_W: case PS_P_VALUE_GATE_B:
        case PS_P_V4_C_WGATE: case PS_P_V4_C_APE: case PS_P_V4_SINKS:
            memset(w, 0, (size_t)p->numel * sizeof(float)); /* SPEC §2: gates start uniform */
            continue;
        case PS_P_WO: case PS_P_MLP_DOWN:
            std = out_std;
            break;
        default:
            break;
        }
        for (int64_t j = 0; j < p->numel; j++) w[j] = (float)(std * ps_rng_normal(&r));
    }
}

int ps_model_set_meta(ps_model *m, const char *key, const char *val, ps_error *err) {
    for (int i = 0; i < m->n_meta; i++)
        if (!strcmp(m->meta_keys[i], key)) {
            char *v = strdup(val);
            if (!v) return ps_fail(err, "out of memory");
            free(m->meta_vals[i]);
            m->meta_vals[i] = v;
            return 0;
        }
    char **k = realloc(m->meta_keys, (size_t)(m->n_meta + 1) * sizeof *k);
    if (!k) return ps_fail(err, "out of memory");
    m->meta_keys = k;
    char **v = realloc(m->meta_vals, (size_t)(m->n_meta + 1) * sizeof *v);
    if (!v) return ps_fail(err, "out of memory");
    m->meta_vals = v;
    m->meta_keys[m->n_meta] = strdup(key);
    m->meta_vals[m->n_meta] = strdup(val);
    if (!m->meta_keys[m->n_meta] || !m->meta_vals[m->n_meta]) return ps_fail(err, "out of memory");
    m->n_meta++;
    return 0;
}

const char *ps_model_get_meta(const ps_model *m, const char *key) {
    for (int i = 0; i < m->n_meta; i++)
        if (!strcmp(m->meta_keys[i], key)) return m->meta_vals[i];
    return NULL;
}

static void shape_str(char *buf, size_t n, int ndim, const int64_t *shape) {
    size_t w = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < ndim && w < n; i++) w += (size_t)snprintf(buf + w, n - w, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (w < n) snprintf(buf + w, n - w, "]");
}

/* Check one stored tensor against the table entry, convert it into the parameter buffer, refuse
 * non-finite values, and drop its file pages again. */
static int load_tensor(ps_model *m, const ps_param_info *p, const ps_st_file *f, const ps_st_entry *e, ps_error *err) {
    int same = e->ndim == p->ndim;
    for (int d = 0; same && d < p->ndim; d++) same = e->shape[d] == p->shape[d];
    if (!same) {
        char got[128], want[128];
        shape_str(got, sizeof got, e->ndim, e->shape);
        shape_str(want, sizeof want, p->ndim, p->shape);
        return ps_fail(err, "%s: tensor \"%s\" has shape %s but the config needs %s", f->path, p->name, got, want);
    }
    float *w = m->params + p->offset;
    int rc = ps_st_read_f32(f, e, w, err);
    ps_st_release(f, e);
    if (rc) return -1;
    for (int64_t j = 0; j < p->numel; j++)
        if (!isfinite(w[j]))
            return ps_fail(err, "%s: tensor \"%s\" holds a non-finite value (%g at flat index %lld)", f->path, p->name,
                           (double)w[j], (long long)j);
    return 0;
}

static int take_meta(ps_model *m, const ps_st_file *f, ps_error *err) {
    for (int i = 0; i < f->n_meta; i++)
        if (strcmp(f->meta_keys[i], "format") && ps_model_set_meta(m, f->meta_keys[i], f->meta_vals[i], err)) return -1;
    return 0;
}

static int tolerated_extra(const ps_model *m, const char *name) {
    return m->cfg.tie_embeddings && !strcmp(name, "lm_head.weight"); /* SPEC §3: ignored */
}

/* The weights from a checkpoint's files (core/safetensors.h ps_st_set: model.safetensors, or the shards
 * of the index, opened lazily in the order the model's tensors need them; a shard holding no needed
 * tensor is never opened, and every tensor of an opened shard must be listed in weight_map under that
 * shard). One file: each tensor in table order (missing ones named), then nothing unexpected. Sharded:
 * the index is checked whole first (every listed tensor belongs to the model, every model tensor is
 * listed), then the tensors are read. */
static int load_from(ps_model *m, ps_st_set *set, const char *cpath, ps_error *err) {
    char b1[200], b2[200];
    if (set->sharded) {
        const ps_st_index *ix = &set->ix;
        for (int i = 0; i < ix->n; i++) {
            if (ps_model_find(m, ix->names[i]) || tolerated_extra(m, ix->names[i])) continue;
            return ps_fail(err, "%s: unexpected tensor \"%s\" in weight_map (shard \"%s\"; not part of the model described by %s)",
                           set->path, ps_st_printable(ix->names[i], b1, sizeof b1),
                           ps_st_printable(ix->shards[ix->shard[i]], b2, sizeof b2), cpath);
        }
        for (int i = 0; i < m->n_tensors; i++)
            if (ps_st_index_find(ix, m->table[i].name) < 0)
                return ps_fail(err, "%s: tensor \"%s\" is missing from weight_map (the config in %s needs it)", set->path,
                               m->table[i].name, cpath);
    }
    for (int i = 0; i < m->n_tensors; i++) {
        const ps_param_info *p = &m->table[i];
        const ps_st_file *f;
        const ps_st_entry *e;
        int opened = ps_st_set_n_open(set), r = ps_st_set_find(set, p->name, &f, &e, err);
        if (r < 0) return -1;
        if (r == 0) return ps_fail(err, "%s: tensor \"%s\" is missing (the config in %s needs it)", set->path, p->name, cpath);
        if (set->sharded && ps_st_set_n_open(set) > opened && take_meta(m, f, err)) return -1; /* a shard opened now */
        if (load_tensor(m, p, f, e, err)) return -1;
    }
    if (!set->sharded) {
        for (int i = 0; i < set->single.n; i++) {
            if (ps_model_find(m, set->single.entries[i].name) || tolerated_extra(m, set->single.entries[i].name)) continue;
            return ps_fail(err, "%s: unexpected tensor \"%s\" (not part of the model described by %s)", set->path,
                           ps_st_printable(set->single.entries[i].name, b1, sizeof b1), cpath);
        }
        if (take_meta(m, &set->single, err)) return -1;
    }
    m->n_shards = ps_st_set_n_open(set);
    return 0;
}

int ps_model_load(ps_model *m, const char *dir, ps_error *err) {
    memset(m, 0, sizeof *m);
    char cpath[4096];
    if (ps_path_join(cpath, sizeof cpath, dir, "config.json", err)) return -1;
    ps_config cfg;
    if (ps_config_load(cpath, &cfg, err)) return -1;
    if (ps_model_create(m, &cfg, err)) return ps_fail_prefix(err, "%s: ", cpath);
    ps_st_set set;
    int rc = ps_st_set_open(&set, dir, err) || load_from(m, &set, cpath, err) ? -1 : 0;
    ps_st_set_close(&set);
    if (rc) ps_model_free(m);
    return rc;
}

/* ---- saving ---- */

static int is_shard_name(const char *name, int *i, int *n) {
    int a, b, len = 0;
    if (strlen(name) != 32 || sscanf(name, "model-%5d-of-%5d.safetensors%n", &a, &b, &len) != 2 || len != 32) return 0;
    *i = a;
    *n = b;
    return 1;
}

/* After a save: remove the other layout's weight files, so that the directory holds one checkpoint
 * (model.safetensors wins over an index when both exist, so a stale one would be loaded instead). */
static void remove_stale(const char *dir, int n_shards) {
    DIR *d = opendir(dir);
    if (!d) return;
    char path[4096];
    for (struct dirent *e; (e = readdir(d));) {
        int i, n, stale = 0;
        if (is_shard_name(e->d_name, &i, &n)) stale = !(n_shards > 1 && n == n_shards && i >= 1 && i <= n);
        else if (!strcmp(e->d_name, "model.safetensors")) stale = n_shards > 1;
        else if (!strcmp(e->d_name, PS_ST_INDEX_NAME)) stale = n_shards <= 1;
        if (stale && (size_t)snprintf(path, sizeof path, "%s/%s", dir, e->d_name) < sizeof path) unlink(path);
    }
    closedir(d);
}

static const char *hf_dtype_name(ps_dtype d) {
    return d == PS_DT_BF16 ? "bfloat16" : d == PS_DT_F16 ? "float16" : "float32";
}

int ps_model_save_as(const ps_model *m, const char *dir, const ps_save_opts *o, ps_error *err) {
    ps_save_opts def = {0};
    if (!o) o = &def;
    ps_dtype dt = o->dtype_set ? o->dtype : PS_DT_F32;
    if (dt != PS_DT_F32 && dt != PS_DT_BF16 && dt != PS_DT_F16)
        return ps_fail(err, "%s: cannot store weights as %s (F32, BF16 or F16)", dir, ps_dtype_name(dt));
    if (o->layout == PS_LAYOUT_HF) { /* fail before writing anything */
        char *js = ps_config_to_hf_json(&m->cfg, hf_dtype_name(dt), err);
        if (!js) return ps_fail_prefix(err, "%s: ", dir);
        free(js);
    }
    if (ps_mkdir(dir, err)) return -1;
    char cpath[4096], wpath[4096];
    if (ps_path_join(cpath, sizeof cpath, dir, "config.json", err) ||
        ps_path_join(wpath, sizeof wpath, dir, "model.safetensors", err))
        return -1;
    int64_t esz = ps_dtype_size(dt);
    /* Shards: tensors in table order, a new shard when the next tensor would pass max_shard_bytes. */
    int *shard_of = calloc((size_t)m->n_tensors, sizeof *shard_of);
    ps_st_tensor *t = calloc((size_t)m->n_tensors, sizeof *t);
    if (!t || !shard_of) {
        free(t);
        free(shard_of);
        return ps_fail(err, "%s: out of memory", wpath);
    }
    int n_shards = 1;
    uint64_t cur = 0, total = 0;
    for (int i = 0; i < m->n_tensors; i++) {
        uint64_t bytes = (uint64_t)m->table[i].numel * (uint64_t)esz;
        if (o->max_shard_bytes && cur > 0 && cur + bytes > o->max_shard_bytes) {
            n_shards++;
            cur = 0;
        }
        shard_of[i] = n_shards - 1;
        cur += bytes;
        total += bytes;
        t[i].name = m->table[i].name;
        t[i].ndim = m->table[i].ndim;
        for (int d = 0; d < 3; d++) t[i].shape[d] = m->table[i].shape[d];
        t[i].data = m->params + m->table[i].offset;
    }
    int rc = -1;
    if (n_shards > 99999) {
        ps_fail(err, "%s: %d shards is more than the 99999 the file names allow; raise the shard size", dir, n_shards);
        goto done;
    }
    /* config.json first: the weights (model.safetensors, or the shard index written after its shards) are the
     * commit point, so a process killed between the two files never leaves weights without their config
     * (train --resume and every loader take model.safetensors to mean a whole checkpoint) */
    if (o->layout == PS_LAYOUT_HF ? ps_config_save_hf(&m->cfg, hf_dtype_name(dt), cpath, err) : ps_config_save(&m->cfg, cpath, err))
        goto done;
    if (n_shards == 1) {
        if (ps_st_save_as(wpath, t, m->n_tensors, (const char *const *)m->meta_keys, (const char *const *)m->meta_vals,
                          m->n_meta, dt, err))
            goto done;
    } else {
        json_t *wm = json_object();
        for (int s = 0, first = 0; s < n_shards; s++) {
            int last = first;
            while (last < m->n_tensors && shard_of[last] == s) last++;
            char name[64], spath[4200];
            snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", s + 1, n_shards);
            if (ps_path_join(spath, sizeof spath, dir, name, err) ||
                ps_st_save_as(spath, t + first, last - first, (const char *const *)m->meta_keys,
                              (const char *const *)m->meta_vals, m->n_meta, dt, err)) {
                json_decref(wm);
                goto done;
            }
            for (int i = first; i < last; i++) json_object_set_new(wm, t[i].name, json_string(name));
            first = last;
        }
        json_t *root = json_object(), *md = json_object();
        json_object_set_new(md, "total_size", json_integer((json_int_t)total));
        json_object_set_new(root, "metadata", md);
        json_object_set_new(root, "weight_map", wm);
        char *js = json_dumps(root, JSON_INDENT(2) | JSON_SORT_KEYS);
        json_decref(root);
        char ipath[4096];
        if (!js) {
            ps_fail(err, "%s: cannot serialise the shard index", dir);
            goto done;
        }
        int bad = ps_path_join(ipath, sizeof ipath, dir, PS_ST_INDEX_NAME, err) || ps_write_text_atomic(ipath, js, err);
        free(js);
        if (bad) goto done;
    }
    remove_stale(dir, n_shards);
    rc = 0;
done:
    free(t);
    free(shard_of);
    return rc;
}

int ps_model_save(const ps_model *m, const char *dir, ps_error *err) { return ps_model_save_as(m, dir, NULL, err); }
