/* minicpm_family.c — the MiniCPM4 family's table (core/runtime.h ps_family): open, forward with hooks, scoring
 * and answer rows through the forward, the hook point table, provenance and `phasescope info`'s account; its
 * knockout targets are minicpm_ko_targets.c's. No gates, gate cycling or backward yet (NULL entries: the
 * instruments say so by name). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/batch.h"
#include "core/family_entries.h"
#include "core/fileio.h"
#include "core/kvcache.h"
#include "core/minicpm/minicpm.h"
#include "core/runtime.h"

#define EVERY "every layer"
#define SPARSE "every layer, sparse path"
static const ps_point_info POINTS[] = {
    {"blocks.{L}.hook_resid_pre", "[B, T, d]", -1, EVERY, PS_MCH_RESID_PRE, "residual stream entering the layer"},
    {"blocks.{L}.attn.hook_q", "[B, T, H, D]", 2, EVERY, PS_MCH_Q, "queries after RoPE"},
    {"blocks.{L}.attn.hook_k", "[B, T, Hkv, D]", 2, EVERY, PS_MCH_K, "keys after RoPE"},
    {"blocks.{L}.attn.hook_v", "[B, T, Hkv, D]", 2, EVERY, PS_MCH_V, "values"},
    {"blocks.{L}.attn.hook_ck", "[B, N1, Hkv, D]", 2, SPARSE, PS_MCH_CK, "level-1 compressed keys (window means)"},
    {"blocks.{L}.attn.hook_ck2", "[B, N2, Hkv, D]", 2, SPARSE, PS_MCH_CK2, "level-2 compressed keys (the normaliser's)"},
    {"blocks.{L}.attn.hook_select_scores", "[B, T, Hkv, N1]", 2, SPARSE, PS_MCH_SELECT_SCORES, "stage-1 scores P (0 unseen)"},
    {"blocks.{L}.attn.hook_block_scores", "[B, T, Hkv, nb]", 2, SPARSE, PS_MCH_BLOCK_SCORES, "max-pooled block scores (+inf forced)"},
    {"blocks.{L}.attn.hook_blocks", "[B, T, Hkv, k + Lb]", 2, SPARSE, PS_MCH_BLOCKS, "selected blocks, ascending (-1 empty)"},
    {"blocks.{L}.attn.hook_z", "[B, T, H, D]", 2, EVERY, PS_MCH_Z, "per-head attention outputs"},
    {"blocks.{L}.hook_attn_out", "[B, T, d]", -1, EVERY, PS_MCH_ATTN_OUT, "o_proj output x scale_depth/sqrt(layers)"},
    {"blocks.{L}.hook_mlp_out", "[B, T, d]", -1, EVERY, PS_MCH_MLP_OUT, "MLP output x scale_depth/sqrt(layers)"},
    {"blocks.{L}.hook_resid_post", "[B, T, d]", -1, EVERY, PS_MCH_RESID_POST, "residual stream leaving the layer"},
};

static ps_minicpm_model *mc(const ps_runtime *rt) { return rt->model; }

static int mc_detect(const char *dir) {
    char p[4200];
    snprintf(p, sizeof p, "%s/config.json", dir);
    return ps_minicpm_config_detect_file(p);
}

static int mc_load_weights(ps_runtime *rt, int lazy, ps_error *err) {
    (void)lazy; /* every layer is loaded */
    rt->lazy = 0;
    return ps_minicpm_model_load_weights(mc(rt), err);
}

static int mc_open(ps_runtime *rt, void *model, const char *dir, const ps_runtime_opts *o, ps_error *err) {
    const char *backend = o && o->backend ? o->backend : "cpu";
    if (strcmp(backend, "cpu")) return ps_fail_usage(err, "--backend %s: MiniCPM4 checkpoints run on the cpu backend only", backend);
    ps_minicpm_model *m = model;
    if (ps_minicpm_model_open(m, dir, err)) return -1;
    rt->model = m;
    rt->family = &ps_family_minicpm;
    rt->ctx = m->ctx;
    rt->max_pos = m->cfg.max_position_embeddings;
    rt->n_layers = m->cfg.n_layers;
    rt->weight_bytes = 4.0 * (double)m->n_params;
    if (ps_runtime_hash_file(m->cpath, rt->config_hash, err)) return -1;
    return !o || o->weights ? mc_load_weights(rt, 0, err) : 0;
}

static void mc_free(void *model) { ps_minicpm_model_free(model); }

static int64_t mc_acts_bytes(const ps_runtime *rt, int64_t B, int64_t T, int keep_all) {
    (void)keep_all;
    return ps_minicpm_acts_bytes(&mc(rt)->cfg, B, T);
}

static void *mc_acts_create(const ps_runtime *rt, int64_t B, int64_t T, int keep_all, ps_error *err) {
    if (keep_all) {
        ps_fail(err, "MiniCPM4: no kept activations (the forward shares one set of buffers between layers)");
        return NULL;
    }
    ps_minicpm_acts *a = malloc(sizeof *a);
    if (!a) {
        ps_fail(err, "out of memory");
        return NULL;
    }
    if (ps_minicpm_acts_create(a, mc(rt), B, T, err)) {
        free(a);
        return NULL;
    }
    return a;
}

static void mc_acts_free(void *acts) {
    if (!acts) return;
    ps_minicpm_acts_free(acts);
    free(acts);
}

static int mc_forward(const ps_runtime *rt, void *acts, const int32_t *tokens, const ps_hooks *h, int n_run, ps_error *err) {
    return ps_minicpm_forward(mc(rt), acts, tokens, h, n_run, err);
}

static const float *mc_logits(void *acts, ps_error *err) {
    (void)err;
    return ((ps_minicpm_acts *)acts)->logits;
}

/* the answer rows' scores: forwards of `batch` sequences (the last batch smaller) */
static int mc_score(const ps_runtime *rt, const ps_batch *b, int64_t batch, const ps_hooks *h, int *ok, double *lp,
                    ps_error *err) {
    if (batch < 1) return ps_fail(err, "batch %lld must be >= 1", (long long)batch);
    int rc = 0;
    for (int64_t i0 = 0; i0 < b->B && !rc; i0 += batch) {
        ps_batch view = ps_batch_view(b, i0, b->B - i0 < batch ? b->B - i0 : batch);
        ps_minicpm_acts a;
        if (ps_minicpm_acts_create(&a, mc(rt), view.B, b->T, err)) return -1;
        rc = ps_minicpm_forward(mc(rt), &a, view.tokens, h, -1, err);
        if (!rc) ps_score_queries(&view, a.logits, mc(rt)->cfg.vocab_size, ok + i0 * b->max_q, lp + i0 * b->max_q);
        ps_minicpm_acts_free(&a);
    }
    return rc;
}

/* the answer rows of each sequence: one forward per sequence, cut after its last answer row */
static int mc_rows(const ps_runtime *rt, const ps_batch *b, int64_t batch, double mem_bytes, ps_rows_fn fn, void *user,
                   ps_error *err) {
    (void)batch, (void)mem_bytes;
    int64_t V = mc(rt)->cfg.vocab_size;
    int64_t *pos = malloc((size_t)(b->T + 1) * sizeof *pos);
    float *rows = malloc((size_t)((b->T + 1) * V) * sizeof(float));
    int rc = pos && rows ? 0 : ps_fail(err, "out of memory for the answer rows");
    for (int64_t s = 0; s < b->B && !rc; s++) {
        int64_t n = ps_answer_rows(b, s, pos), T = 0;
        for (int64_t r = 0; r < n; r++) T = pos[r] + 1 > T ? pos[r] + 1 : T;
        if (!n) continue;
        ps_minicpm_acts a;
        if ((rc = ps_minicpm_acts_create(&a, mc(rt), 1, T, err))) break;
        rc = ps_minicpm_forward(mc(rt), &a, b->tokens + s * b->T, NULL, -1, err);
        for (int64_t r = 0; r < n && !rc; r++) memcpy(rows + r * V, a.logits + pos[r] * V, (size_t)V * sizeof(float));
        ps_minicpm_acts_free(&a);
        if (!rc) rc = fn(b, s, rows, n, user, err);
    }
    free(pos);
    free(rows);
    return rc;
}

static int mc_point_shape(const ps_runtime *rt, int i, int layer, int64_t B, int64_t T, int64_t d[4]) {
    if (layer < 0 || layer >= mc(rt)->cfg.n_layers) return 0;
    return ps_minicpm_point_shape(&mc(rt)->cfg, POINTS[i].point, B, T, d);
}

static int mc_hook_add(const ps_runtime *rt, ps_hooks *h, const char *name, ps_hook_fn fn, void *user, ps_error *err) {
    return ps_minicpm_hooks_add(h, &mc(rt)->cfg, name, fn, user, err);
}

static int mc_hook_add_action(const ps_runtime *rt, ps_hooks *h, const char *name, const ps_hook_action *act, ps_error *err) {
    return ps_minicpm_hooks_add_action(h, &mc(rt)->cfg, name, act, err);
}

static int mc_cache_watch(const ps_runtime *rt, ps_cache *c, ps_hooks *h, const char *name, ps_error *err) {
    return ps_minicpm_cache_watch(c, h, &mc(rt)->cfg, name, err);
}

static int mc_hook_parse(const ps_runtime *rt, const char *name, int *slot, int *point, ps_error *err) {
    return ps_minicpm_hook_parse(&mc(rt)->cfg, name, slot, point, err);
}

static const char *const KINDS[] = {"infllm_v2", NULL};

static json_t *mc_config_json(const ps_runtime *rt) {
    const ps_minicpm_config *c = &mc(rt)->cfg;
    json_t *o = json_object(), *att = json_object();
    json_object_set_new(att, "kind", json_string(KINDS[0]));
    json_object_set_new(att, "kernel_size", json_integer(c->sel.kernel));
    json_object_set_new(att, "kernel_stride", json_integer(c->sel.stride));
    json_object_set_new(att, "block_size", json_integer(c->sel.block));
    json_object_set_new(att, "init_blocks", json_integer(c->sel.init_blocks));
    json_object_set_new(att, "window_size", json_integer(c->window_size));
    json_object_set_new(att, "topk", json_integer(c->sel.topk));
    json_object_set_new(att, "dense_len", json_integer(c->dense_len));
    json_object_set_new(att, "use_nope", json_boolean(c->use_nope));
    json_object_set_new(o, "model_type", json_string("minicpm"));
    json_object_set_new(o, "vocab_size", json_integer(c->vocab_size));
    json_object_set_new(o, "hidden_size", json_integer(c->hidden_size));
    json_object_set_new(o, "n_layers", json_integer(c->n_layers));
    json_object_set_new(o, "n_heads", json_integer(c->n_heads));
    json_object_set_new(o, "n_kv_heads", json_integer(c->n_kv_heads));
    json_object_set_new(o, "head_dim", json_integer(c->head_dim));
    json_object_set_new(o, "attention", att);
    return o;
}

static void mc_config_hash(const ps_runtime *rt, char out[17]) {
    ps_error e;
    if (rt->config_hash[0]) memcpy(out, rt->config_hash, 17);
    else if (ps_runtime_hash_file(mc(rt)->cpath, out, &e)) out[0] = '\0';
}

static int64_t mc_step(const ps_runtime *rt) { return (void)rt, -1; }
static int64_t mc_period(const ps_runtime *rt) { return mc(rt)->cfg.sel.block; } /* the selection's unit */
static int64_t mc_vocab(const ps_runtime *rt) { return mc(rt)->cfg.vocab_size; }
static const char *mc_meta(const ps_runtime *rt, const char *key) { return (void)rt, (void)key, NULL; }
/* block selection: every layer, on the sparse path (T >= dense_len) */
static int mc_sel_layer(const ps_runtime *rt, int layer, int64_t T, ps_select_geom *g, char *why, size_t n) {
    const ps_minicpm_config *c = &mc(rt)->cfg;
    (void)layer;
    if (!ps_minicpm_sparse(c, T)) {
        snprintf(why, n, "a forward of %lld tokens is dense (sparse_config.dense_len %lld): every block is attended", (long long)T,
                 (long long)c->dense_len);
        return 0;
    }
    *g = (ps_select_geom){.cfg = c->sel, .n_kv = c->n_kv_heads, .blocks_point = PS_MCH_BLOCKS};
    return 1;
}

static int mc_describe(const ps_runtime *rt, int64_t B, FILE *out, ps_error *err) {
    (void)err;
    const ps_minicpm_model *m = mc(rt);
    const ps_minicpm_config *c = &m->cfg;
    fprintf(out, "kind        MiniCPM4 with InfLLM-v2 sparse attention (%s, %s weights)\n", m->files.sharded ? "sharded" : "one file",
            m->stored_dtype >= 0 ? ps_dtype_name((ps_dtype)m->stored_dtype) : "no");
    fprintf(out, "config      vocab %lld, hidden %lld, %lld layers, %lld heads / %lld KV heads x %lld, MLP %lld, max positions %lld,\n"
                 "            scale_emb %g, scale_depth %g, dim_model_base %g, rms eps %g, %s head\n",
            (long long)c->vocab_size, (long long)c->hidden_size, (long long)c->n_layers, (long long)c->n_heads,
            (long long)c->n_kv_heads, (long long)c->head_dim, (long long)c->intermediate_size,
            (long long)c->max_position_embeddings, c->scale_emb, c->scale_depth, c->dim_model_base, c->rms_norm_eps,
            c->tie_word_embeddings ? "tied" : "untied");
    fprintf(out, "rope        theta %g", c->rope_theta);
    if (c->longrope) fprintf(out, ", longrope (original %lld positions)", (long long)c->original_max);
    fprintf(out, "\nsparse      windows %lld every %lld (level 2: %lld every %lld), blocks of %lld, top %lld + %lld local + %lld initial,\n"
                 "            dense below %lld tokens%s\n",
            (long long)c->sel.kernel, (long long)c->sel.stride, (long long)(4 * c->sel.kernel), (long long)(4 * c->sel.stride),
            (long long)c->sel.block, (long long)c->sel.topk, (long long)c->sel.local_blocks, (long long)c->sel.init_blocks,
            (long long)c->dense_len, c->use_nope ? ", stage 1 on un-roped q and k" : "");
    fprintf(out, "\nparameters  %lld (float32 after conversion: %.2f MiB)\n", (long long)m->n_params, 4.0 * (double)m->n_params / 1048576.0);
    int64_t Ts[] = {256, 4096, 16384, 32768};
    fprintf(out, "\nmemory (batch %lld)\n", (long long)B);
    for (int i = 0; i < 4 && Ts[i] <= c->max_position_embeddings; i++)
        fprintf(out, "  forward T = %-6lld activations %.2f MiB\n", (long long)Ts[i],
                (double)ps_minicpm_acts_bytes(c, B, Ts[i]) / 1048576.0);
    /* the KV cache of one sequence (ps_minicpm_cache_bytes): raw keys and values, the compressed keys, a few rows */
    double raw = 4.0 * (double)(c->n_layers * (c->use_nope ? 3 : 2) * c->n_kv_heads * c->head_dim),
           comp = 4.0 * (double)(c->n_layers * c->n_kv_heads * c->head_dim) * (1.0 / (double)c->sel.stride + 0.25 / (double)c->sel.stride);
    fprintf(out, "\nKV cache (float32, one sequence)\n  %.1f bytes/token: keys and values %.1f%s, compressed keys %.1f (level 1 every %lld "
                 "tokens, level 2 every %lld)\n",
            raw + comp, raw, c->use_nope ? " (with the un-roped keys)" : "", comp, (long long)c->sel.stride, (long long)(4 * c->sel.stride));
    for (int i = 1; i < 4 && Ts[i] <= c->max_position_embeddings; i++)
        fprintf(out, "  T = %-6lld %lld bytes (%.2f MiB)\n", (long long)Ts[i], (long long)ps_minicpm_cache_bytes(c, Ts[i]),
                (double)ps_minicpm_cache_bytes(c, Ts[i]) / 1048576.0);
    return 0;
}

/* results: a config this family wrote (attention.kind "infllm_v2") */
static int mc_describe_config(const json_t *cfg, ps_model_desc *d, ps_error *err) {
    const json_t *att = json_object_get(cfg, "attention");
    const char *kind = json_string_value(json_object_get(att, "kind"));
    if (!kind || strcmp(kind, KINDS[0])) return 0;
    memset(d, 0, sizeof *d);
    const char *keys[3] = {"block_size", "topk", "window_size"};
    json_int_t v[3];
    for (int i = 0; i < 3; i++) {
        json_t *x = json_object_get(att, keys[i]);
        if (!json_is_integer(x) || json_integer_value(x) < 0) {
            ps_fail(err, "attention.%s: %s", keys[i], x ? "expected a non-negative integer" : "missing");
            return -1;
        }
        v[i] = json_integer_value(x);
    }
    snprintf(d->kind, sizeof d->kind, "%s", kind);
    snprintf(d->label, sizeof d->label, "MiniCPM4 InfLLM-v2, blocks of %lld, top %lld + %lld local", (long long)v[0],
             (long long)v[1], (long long)(v[0] ? v[2] / v[0] : 0));
    d->kv_factor = 1;
    d->raw_what = "raw keys and values (hook_k, hook_v)";
    d->comp_what = "the level-1 pooled keys that choose the blocks (hook_ck)";
    return 1;
}

/* ---- the family's KV cache (core/kvcache.h ps_kvcache_ops): one ps_minicpm_cache per sequence — its first
 * append is a prefill of its tokens at once, every later token a decode step (docs/minicpm.md, "Decode" and "The KV
 * cache"). Every new row's logits or the last one's; the family's hooks fire during an append (a prefill as a whole
 * forward over the prompt, a decode step per row; ps_kvcache_event says which sequence, position and window);
 * fork copies a sequence, truncate cuts it back; the cache point blocks.{l}.attn.cache_ck reads the level-1 pooled
 * keys (no edits: hook_ck during an append edits them as they are made). ---- */

typedef struct {
    const ps_minicpm_model *m;
    ps_minicpm_cache *c; /* [kv->n_seq], created on add */
    float *row;          /* [vocab]: one step's logits (allocated once, not per token) */
} mc_cache;

static const ps_kvcache_ops MC_KV;

static int mc_kv_create(ps_kvcache *kv, const ps_runtime *rt, const ps_kvcache_opts *o, ps_error *err) {
    (void)o;
    mc_cache *c = calloc(1, sizeof *c);
    const ps_minicpm_model *m = rt->model;
    if (c && !(c->row = malloc((size_t)m->cfg.vocab_size * sizeof *c->row))) free(c), c = NULL;
    if (!c) return ps_fail(err, "out of memory for a MiniCPM4 KV cache");
    c->m = m;
    kv->impl = c, kv->ops = &MC_KV, kv->ctx = rt->ctx;
    return 0;
}
static void mc_kv_drop(ps_kvcache *kv, int seq) {
    mc_cache *c = kv->impl;
    if (seq < 0 || seq >= kv->n_seq || !kv->seqs[seq].live) return;
    ps_minicpm_cache_free(&c->c[seq]);
    kv->seqs[seq].live = false;
}
static void mc_kv_free(ps_kvcache *kv) {
    mc_cache *c = kv->impl;
    for (int s = 0; c && s < kv->n_seq; s++) mc_kv_drop(kv, s);
    if (c) free(c->c), free(c->row);
    free(c);
    free(kv->seqs);
    memset(kv, 0, sizeof *kv);
}
/* a free slot for a new sequence (its cache zeroed, not created): its id, or -1 */
static int mc_kv_slot(ps_kvcache *kv, ps_error *err) {
    mc_cache *c = kv->impl;
    int s = 0;
    while (s < kv->n_seq && kv->seqs[s].live) s++;
    if (s == kv->n_seq) {
        ps_kv_seq *q = realloc(kv->seqs, (size_t)(s + 1) * sizeof *q);
        if (q) kv->seqs = q;
        ps_minicpm_cache *nc = q ? realloc(c->c, (size_t)(s + 1) * sizeof *nc) : NULL;
        if (nc) c->c = nc;
        if (!q || !nc) return ps_fail(err, "out of memory for a MiniCPM4 cache sequence");
        kv->n_seq++;
    }
    memset(&kv->seqs[s], 0, sizeof kv->seqs[s]);
    memset(&c->c[s], 0, sizeof c->c[s]);
    return s;
}
static int mc_kv_add(ps_kvcache *kv, ps_error *err) {
    mc_cache *c = kv->impl;
    int s = mc_kv_slot(kv, err);
    if (s < 0 || ps_minicpm_cache_create(&c->c[s], c->m, c->m->cfg.max_position_embeddings, err)) return -1;
    kv->seqs[s].live = true;
    return s;
}
/* a copy of everything the source has written (its keys, values and pooled keys up to its length) */
static int mc_kv_fork(ps_kvcache *kv, int src, ps_error *err) {
    mc_cache *c = kv->impl;
    if (!ps_kvcache_seq(kv, src, err)) return -1;
    int s = mc_kv_slot(kv, err);
    if (s < 0 || ps_minicpm_cache_copy(&c->c[s], &c->c[src], c->m, err)) return -1;
    kv->seqs[s].live = true;
    kv->seqs[s].T = kv->seqs[src].T;
    return s;
}
/* any T <= the length: the cache holds every position */
static int mc_kv_truncate(ps_kvcache *kv, int seq, int64_t T, ps_error *err) {
    mc_cache *c = kv->impl;
    ps_kv_seq *q = ps_kvcache_seq(kv, seq, err);
    if (!q) return -1;
    if (T < 0 || T > q->T)
        return ps_fail(err, "truncate sequence %d to %lld tokens: it holds %lld", seq, (long long)T, (long long)q->T);
    if (ps_minicpm_cache_truncate(&c->m->cfg, &c->c[seq], T, err)) return -1;
    q->T = T;
    return 0;
}
static int mc_kv_append(ps_kvcache *kv, int n_seq, const int *seqs, const int64_t *n, const int32_t *tokens, const ps_hooks *hooks,
                        float *logits, bool last_only, ps_error *err) {
    mc_cache *c = kv->impl;
    const ps_minicpm_config *f = &c->m->cfg;
    int64_t V = f->vocab_size, off = 0;
    if (hooks && hooks->mask && (hooks->family != &ps_minicpm_hook_family || hooks->n_layers != f->n_layers))
        return ps_fail(err, "the hooks were registered for another model (use this MiniCPM4 checkpoint's hook names)");
    if (!hooks || !hooks->mask) hooks = NULL;
    if (ps_kvcache_check_request(kv, n_seq, seqs, n, tokens, err)) return -1;
    int rc = 0;
    for (int i = 0; i < n_seq && !rc; off += n[i], i++) {
        ps_kv_seq *q = &kv->seqs[seqs[i]];
        ps_minicpm_cache *mc = &c->c[seqs[i]];
        if (n[i] == 0) continue;
        int64_t t = 0;
        float *dst = logits ? logits + (last_only ? (int64_t)i : off) * V : NULL;
        kv->ev = (ps_kv_event){.seq = seqs[i], .t0 = q->T, .entry = -1};
        if (q->T == 0) { /* the prompt at once: every row's logits, or the last one's */
            rc = ps_minicpm_prefill_ex(c->m, mc, tokens + off, n[i], hooks, last_only ? c->row : dst, !last_only, err);
            t = n[i];
        }
        for (; t < n[i] && !rc; t++) {
            kv->ev = (ps_kv_event){.seq = seqs[i], .t0 = q->T + t, .entry = -1};
            rc = ps_minicpm_decode_ex(c->m, mc, tokens[off + t], hooks, &kv->ev.entry, last_only || !dst ? c->row : dst + t * V, err);
        }
        if (rc) break;
        q->T += n[i];
        if (dst && last_only) memcpy(dst, c->row, (size_t)V * sizeof *dst);
    }
    return rc;
}
/* the cache point blocks.{l}.attn.cache_ck (value 0): entry j of KV head g, the level-1 pooled key of window j (the
 * keys that choose the blocks; the level-2 keys only normalise stage 1 and are not a point) */
static int64_t mc_kv_n_entries(const ps_kvcache *kv, int seq, int l, int g) {
    const mc_cache *c = kv->impl;
    (void)l, (void)g;
    return seq < 0 || seq >= kv->n_seq || !kv->seqs[seq].live ? 0 : c->c[seq].n1;
}
static int mc_kv_entry(const ps_kvcache *kv, int seq, int l, int g, int value, int64_t j, float *out, ps_error *err) {
    const mc_cache *c = kv->impl;
    const ps_minicpm_config *f = &c->m->cfg;
    if (seq < 0 || seq >= kv->n_seq || !kv->seqs[seq].live) return ps_fail(err, "sequence %d is not in the cache", seq);
    if (l < 0 || l >= f->n_layers || g < 0 || g >= f->n_kv_heads || value != 0)
        return ps_fail(err, "cache entry (layer %d, KV head %d, point %d): the model has %lld layers, %lld KV heads and the point "
                            "cache_ck (0)", l, g, value, (long long)f->n_layers, (long long)f->n_kv_heads);
    const ps_minicpm_cache *mc = &c->c[seq];
    int64_t W = f->n_kv_heads * f->head_dim, K = f->sel.kernel, S = f->sel.stride, Nc = ps_select_n_windows(mc->cap, K, S);
    if (j < 0 || j >= mc->n1)
        return ps_fail(err, "blocks.%d.attn.cache_ck entry %lld: sequence %d holds %lld (one per complete window of %lld tokens every %lld)",
                       l, (long long)j, seq, (long long)mc->n1, (long long)K, (long long)S);
    memcpy(out, mc->k1 + ((int64_t)l * Nc + j) * W + (int64_t)g * f->head_dim, (size_t)f->head_dim * sizeof(float));
    return 0;
}
static int mc_kv_edit(ps_kvcache *kv, int seq, int l, int g, int value, int64_t j, ps_kv_edit_kind kind, const float *vec, ps_error *err) {
    (void)kv, (void)seq, (void)g, (void)j, (void)kind, (void)vec;
    (void)value;
    return ps_fail_usage(err, "blocks.%d.attn.cache_ck: the MiniCPM4 cache's pooled keys are read-only (edit them as they are made: a hook "
                        "on attn.hook_ck during the append)", l);
}
static int64_t mc_kv_bytes(const ps_kvcache *kv) {
    const mc_cache *c = kv->impl;
    const ps_minicpm_config *f = &c->m->cfg;
    int64_t per = 0;
    for (int s = 0; s < kv->n_seq; s++) /* what each sequence has written: its arrays are only touched up to its length */
        if (kv->seqs[s].live) per += ps_minicpm_cache_bytes(f, c->c[s].L);
    return per;
}
static int mc_kv_point_parse(const ps_kvcache *kv, const char *name, int *layer, int *value, ps_error *err) {
    const mc_cache *c = kv->impl;
    int l = -1, used = 0;
    char pt[16] = "";
    if (sscanf(name, "blocks.%d.attn.%15[a-z_0-9]%n", &l, pt, &used) == 2 && !name[used] && l >= 0 && l < c->m->cfg.n_layers &&
        !strcmp(pt, "cache_ck")) {
        *layer = l, *value = 0;
        return 0;
    }
    return ps_fail(err, "%s: not a cache point of this MiniCPM4 model (blocks.{0..%lld}.attn.cache_ck, the level-1 pooled keys)", name,
                   (long long)c->m->cfg.n_layers - 1);
}
static void mc_kv_point_name(const ps_kvcache *kv, int layer, int value, char *buf, size_t n) {
    (void)kv, (void)value;
    snprintf(buf, n, "blocks.%d.attn.cache_ck", layer);
}
static int64_t mc_kv_vocab(const ps_kvcache *kv) { return ((const mc_cache *)kv->impl)->m->cfg.vocab_size; }
static int64_t mc_kv_max_len(const ps_kvcache *kv) { return ((const mc_cache *)kv->impl)->m->cfg.max_position_embeddings; }
static int64_t mc_kv_entry_heads(const ps_kvcache *kv) { return ((const mc_cache *)kv->impl)->m->cfg.n_kv_heads; }
static int64_t mc_kv_entry_width(const ps_kvcache *kv, int l, int value) {
    (void)l, (void)value;
    return ((const mc_cache *)kv->impl)->m->cfg.head_dim;
}

static const ps_kvcache_ops MC_KV = {
    .name = "minicpm", .create = mc_kv_create, .free = mc_kv_free, .add = mc_kv_add, .fork = mc_kv_fork, .drop = mc_kv_drop,
    .truncate = mc_kv_truncate, .append = mc_kv_append, .n_entries = mc_kv_n_entries, .entry = mc_kv_entry, .edit = mc_kv_edit,
    .bytes = mc_kv_bytes, .point_parse = mc_kv_point_parse, .point_name = mc_kv_point_name, .vocab = mc_kv_vocab,
    .max_len = mc_kv_max_len, .entry_heads = mc_kv_entry_heads, .entry_width = mc_kv_entry_width,
    .max_len_name = "max_position_embeddings",
    .edit_form = "(the MiniCPM4 cache's point blocks.L.attn.cache_ck is read-only)", .one_head = NULL};

const ps_family ps_family_minicpm = {
    .name = "minicpm",
    .kvcache = &MC_KV,
    .model_size = sizeof(ps_minicpm_model),
    .detect = mc_detect,
    .open = mc_open,
    .free_model = mc_free,
    .acts_bytes = mc_acts_bytes,
    .acts_create = mc_acts_create,
    .acts_free = mc_acts_free,
    .forward = mc_forward,
    .logits = mc_logits,
    .score = mc_score,
    .rows = mc_rows,
    .sel.layer = mc_sel_layer,
    .points = POINTS,
    .n_points = (int)(sizeof POINTS / sizeof POINTS[0]),
    .hook_family = &ps_minicpm_hook_family,
    .point_shape = mc_point_shape,
    .hook_add = mc_hook_add,
    .hook_add_action = mc_hook_add_action,
    .cache_watch = mc_cache_watch,
    .hook_parse = mc_hook_parse,
    .config_json = mc_config_json,
    .config_hash = mc_config_hash,
    .step = mc_step,
    .default_period = mc_period,
    .vocab = mc_vocab,
    .meta = mc_meta,
    .max_pos_name = "max_position_embeddings",
    .load_weights = mc_load_weights,
    .describe = mc_describe,
    .early_stop = 1,
    .describe_config = mc_describe_config,
    .kinds = KINDS,
    .title = "MiniCPM4",
    .task_file = 1,
    .ko.targets = ps_minicpm_ko_targets,
    .ko.heads_what = "KV heads",
    .ko.default_target = ps_minicpm_ko_default,
    .ko.heads = ps_minicpm_ko_heads,
    .ko.unit = ps_minicpm_ko_unit,
    .ko.missing = ps_minicpm_ko_missing,
    .ko.arrays = ps_minicpm_ko_arrays,
    .ko.default_at = ps_minicpm_ko_default_at,
    .ko.missing_at = ps_minicpm_ko_missing_at,
};
