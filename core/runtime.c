/* runtime.c — the family interface (runtime.h): the controlled model's table, the registry of the shipped
 * families (DeepSeek-V4's table is core/v4/v4_family.c, MiniCPM4's core/minicpm/minicpm_family.c), and opening a
 * checkpoint through them. */
#include "core/runtime.h"
#include "core/chunks.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/cpu_env.h"
#include "core/cycle.h"
#include "core/fileio.h"
#include "core/forward.h"
#include "core/prefill.h"
#include "core/v4/v4_config.h"
#include "core/v4/v4_forward.h"
#include "core/v4/v4_hooks.h"
#include "core/kvcache.h"
#include "core/v4/v4_kvcache.h"
#include "core/v4/v4_model.h"

#include "core/family_entries.h"

/* ---- shared ---- */

int ps_point_is_global(const ps_point_info *p) { return strstr(p->pattern, "{L}") == NULL; }

int ps_runtime_point_index(const ps_runtime *rt, int point) {
    for (int i = 0; i < rt->family->n_points; i++)
        if (rt->family->points[i].point == point) return i;
    return -1;
}

void ps_runtime_point_name(const ps_runtime *rt, int i, int layer, char *buf, size_t n) {
    const char *pat = rt->family->points[i].pattern, *at = strstr(pat, "{L}");
    if (!at) snprintf(buf, n, "%s", pat);
    else snprintf(buf, n, "%.*s%d%s", (int)(at - pat), pat, layer, at + 3);
}

void ps_runtime_point_layers(const ps_runtime *rt, int i, char *buf, size_t n) {
    int64_t dims[4];
    if (ps_point_is_global(&rt->family->points[i])) {
        snprintf(buf, n, "%s", rt->family->point_shape(rt, i, -1, 1, 1, dims) ? "once" : "none");
        return;
    }
    size_t w = 0;
    buf[0] = '\0';
    int any = 0;
    for (int l = 0; l < rt->n_layers && w < n; l++) {
        if (!rt->family->point_shape(rt, i, l, 1, 1, dims)) continue;
        int e = l; /* a run l..e of layers that have it */
        while (e + 1 < rt->n_layers && rt->family->point_shape(rt, i, e + 1, 1, 1, dims)) e++;
        w += (size_t)snprintf(buf + w, n - w, "%s%d", any ? ", " : "", l);
        if (e > l && w < n) w += (size_t)snprintf(buf + w, n - w, e == l + 1 ? ", %d" : "-%d", e);
        any = 1;
        l = e;
    }
    if (!any) snprintf(buf, n, "none");
}

void ps_runtime_human_bytes(char *buf, size_t n, double bytes) {
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (bytes >= 1024 && i < 4) {
        bytes /= 1024;
        i++;
    }
    snprintf(buf, n, i ? "%.2f %s" : "%.0f %s", bytes, u[i]);
}

/* "X available now on cpu" / "X free of Y on cuda": the memory of the context the model runs on */
void ps_runtime_mem_now(char *buf, size_t n, ps_ctx *ctx) {
    int64_t fb = 0, tb = 0;
    ps_error e;
    char f[32], t[32];
    if (!ctx || ps_ctx_mem_info(ctx, &fb, &tb, &e)) {
        ps_runtime_human_bytes(f, sizeof f, (double)ps_mem_available());
        snprintf(buf, n, "%s available now", f);
        return;
    }
    ps_runtime_human_bytes(f, sizeof f, (double)fb);
    ps_runtime_human_bytes(t, sizeof t, (double)tb);
    if (ps_ctx_host_visible(ctx)) snprintf(buf, n, "%s available now on %s", f, ps_ctx_backend_name(ctx));
    else snprintf(buf, n, "%s free of %s on %s", f, t, ps_ctx_backend_name(ctx));
}

/* ---- the controlled model ---- */

static const ps_point_info MODEL_POINTS[] = {
    {"blocks.{L}.hook_resid_pre", "[B, T, d]", -1, "every layer", PS_HOOK_RESID_PRE, "residual stream entering the layer"},
    {"blocks.{L}.attn.hook_q", "[B, T, n_heads, hd]", 2, "every layer", PS_HOOK_Q, "queries after q-norm and RoPE"},
    {"blocks.{L}.attn.hook_k", "[B, T, n_kv, hd]", 2, "every layer", PS_HOOK_K, "raw keys after k-norm and RoPE"},
    {"blocks.{L}.attn.hook_v", "[B, T, n_kv, hd]", 2, "every layer (not the channel attention)", PS_HOOK_V, "raw values"},
    {"blocks.{L}.attn.hook_gate_k", "[B, nW, n_kv, W] (channel: [B, nW, slots, hd])", 2, "compressed and channel models",
     PS_HOOK_GATE_K, "key-branch gate alpha (channel: the per-channel gate)"},
    {"blocks.{L}.attn.hook_gate_v", "[B, nW, n_kv, W]", 2, "compressed models", PS_HOOK_GATE_V, "value-branch gate alpha"},
    {"blocks.{L}.attn.hook_ck", "[B, nW, n_kv, hd]", 2, "compressed, channel and select models", PS_HOOK_CK,
     "compressed keys as attended (select: level-1 keys, [B, N1, n_kv, hd])"},
    {"blocks.{L}.attn.hook_cv", "[B, nW, n_kv, hd]", 2, "compressed models", PS_HOOK_CV, "compressed values"},
    {"blocks.{L}.attn.hook_pattern", "[B, n_heads, T, nW + T] (full: [B, n_heads, T, T])", 1,
     "every layer (not the channel attention)", PS_HOOK_PATTERN, "attention probabilities"},
    {"blocks.{L}.attn.hook_z", "[B, T, n_heads, hd]", 2, "every layer", PS_HOOK_Z, "per-head outputs before W_o"},
    {"blocks.{L}.hook_attn_out", "[B, T, d]", -1, "every layer", PS_HOOK_ATTN_OUT, "attention output (after W_o)"},
    {"blocks.{L}.hook_resid_mid", "[B, T, d]", -1, "every layer", PS_HOOK_RESID_MID, "residual after attention"},
    {"blocks.{L}.hook_mlp_out", "[B, T, d]", -1, "every layer", PS_HOOK_MLP_OUT, "MLP output"},
    {"blocks.{L}.hook_resid_post", "[B, T, d]", -1, "every layer", PS_HOOK_RESID_POST, "residual leaving the layer"},
    {"blocks.{L}.attn.hook_ck2", "[B, N2, n_kv, hd]", 2, "select models", PS_HOOK_CK2, "level-2 compressed keys (stage 1's normaliser)"},
    {"blocks.{L}.attn.hook_select_scores", "[B, T, n_kv, N1]", 2, "select models", PS_HOOK_SELECT_SCORES, "stage-1 scores (0 unseen)"},
    {"blocks.{L}.attn.hook_block_scores", "[B, T, n_kv, nb]", 2, "select models", PS_HOOK_BLOCK_SCORES, "block scores (+inf forced)"},
    {"blocks.{L}.attn.hook_blocks", "[B, T, n_kv, topk + local]", 2, "select models", PS_HOOK_BLOCKS, "blocks attended (-1 empty)"},
};

static const ps_model *model_of(const ps_runtime *rt) { return rt->model; }

static int model_detect(const char *dir) {
    char cpath[4200];
    snprintf(cpath, sizeof cpath, "%s/config.json", dir);
    return ps_v4_config_detect_file(cpath) != 1; /* every other config.json is the controlled model's to judge */
}

static void model_fill(ps_runtime *rt, const ps_model *m) {
    rt->ctx = m->ctx;
    rt->max_pos = m->cfg.max_seq_len;
    rt->n_layers = m->cfg.n_layers;
    rt->model = (void *)m;
    rt->family = &ps_family_model;
    rt->weight_bytes = 4.0 * (double)m->n_params;
    ps_config_hash(&m->cfg, rt->config_hash);
}

static int model_open(ps_runtime *rt, void *model, const char *dir, const ps_runtime_opts *o, ps_error *err) {
    ps_model *m = model;
    if (ps_model_load(m, dir, err) || ps_model_to_backend(m, o && o->backend ? o->backend : "cpu", err)) return -1;
    model_fill(rt, m);
    return 0;
}

static void model_free(void *model) { ps_model_free(model); }

static int64_t model_acts_bytes(const ps_runtime *rt, int64_t B, int64_t T, int keep_all) {
    return 4 * ps_acts_size(&model_of(rt)->cfg, B, T, keep_all, false);
}

static void *model_acts_create(const ps_runtime *rt, int64_t B, int64_t T, int keep_all, ps_error *err) {
    ps_acts *a = calloc(1, sizeof *a);
    if (!a) {
        ps_fail(err, "out of memory");
        return NULL;
    }
    if (ps_acts_create(a, rt->ctx, &model_of(rt)->cfg, B, T, keep_all, err)) {
        free(a);
        return NULL;
    }
    return a;
}

static void model_acts_free(void *acts) {
    if (!acts) return;
    ps_acts_free(acts);
    free(acts);
}

static int model_forward(const ps_runtime *rt, void *acts, const int32_t *tokens, const ps_hooks *h, int n_run, ps_error *err) {
    if (n_run >= 0) return ps_fail(err, "a phasescope model runs every layer (no early stop)");
    return ps_forward(model_of(rt), acts, tokens, h, err);
}

static const float *model_logits(void *acts, ps_error *err) { return ps_acts_logits_host(acts, err); }

static int model_restart(const ps_runtime *rt, void *acts, int layer, const ps_hooks *h, ps_error *err) {
    return ps_forward_from(model_of(rt), acts, layer, h, err);
}

typedef struct {
    int *ok;
    double *lp;
} score_out;

static int model_score_batch(const ps_batch *view, int64_t i0, ps_acts *a, void *user, ps_error *err) {
    score_out *o = user;
    return ps_acts_score(a, view, o->ok + i0 * view->max_q, o->lp + i0 * view->max_q, err);
}

/* Long prompts: one at a time through the chunked prefill, logits at the answer rows only. */
static int model_score_long(const ps_model *m, const ps_batch *b, int *correct, double *logprob, ps_error *err) {
    int64_t V = m->cfg.vocab_size, most = 0;
    for (int64_t s = 0; s < b->B; s++) {
        int64_t n = ps_answer_rows(b, s, NULL);
        most = n > most ? n : most;
    }
    ps_prefill p;
    if (ps_prefill_create(&p, m, b->T, PS_PREFILL_CHUNK, err)) return -1;
    int64_t *pos = malloc((size_t)(most ? most : 1) * sizeof *pos);
    float *rows = malloc((size_t)((most ? most : 1) * V) * sizeof(float));
    int rc = pos && rows ? 0 : ps_fail(err, "out of memory for the logits of %lld answer rows", (long long)most);
    for (int64_t s = 0; s < b->B && !rc; s++) {
        int64_t n = ps_answer_rows(b, s, pos);
        rc = ps_prefill_logits(&p, b->tokens + s * b->T, b->T, pos, n, rows, err);
        if (!rc) ps_score_query_rows(b, s, rows, V, correct + s * b->max_q, logprob + s * b->max_q);
    }
    free(pos);
    free(rows);
    ps_prefill_free(&p);
    return rc;
}

/* forward batches (ps_forward_batches); prompts longer than PS_LONG_CONTEXT through the chunked prefill */
static int model_score(const ps_runtime *rt, const ps_batch *b, int64_t batch, const ps_hooks *h, int *ok, double *lp,
                       ps_error *err) {
    if (b->T > PS_LONG_CONTEXT) {
        if (h) return ps_fail(err, "hooks on prompts of %lld tokens: long prompts run in chunks (prefill), which fires no hooks (at most %d tokens)",
                              (long long)b->T, PS_LONG_CONTEXT);
        return model_score_long(model_of(rt), b, ok, lp, err);
    }
    score_out o = {ok, lp};
    return ps_forward_batches(model_of(rt), b, batch, false, h, model_score_batch, &o, err);
}

static int model_point_shape(const ps_runtime *rt, int i, int layer, int64_t B, int64_t T, int64_t dims[4]) {
    const ps_config *c = &model_of(rt)->cfg;
    if (layer < 0 || layer >= c->n_layers) return 0;
    char name[96];
    int l;
    ps_hook_point pt;
    ps_error e;
    ps_hook_name(name, sizeof name, layer, (ps_hook_point)MODEL_POINTS[i].point);
    if (ps_hook_parse(c, name, &l, &pt, &e)) return 0; /* this model has no such point */
    return ps_hook_shape(c, pt, B, T, dims);
}

static int model_hook_add(const ps_runtime *rt, ps_hooks *h, const char *name, ps_hook_fn fn, void *user, ps_error *err) {
    return ps_hooks_add(h, &model_of(rt)->cfg, name, fn, user, err);
}

static int model_hook_add_action(const ps_runtime *rt, ps_hooks *h, const char *name, const ps_hook_action *act,
                                 ps_error *err) {
    return ps_hooks_add_action(h, &model_of(rt)->cfg, name, act, err);
}

static int model_cache_watch(const ps_runtime *rt, ps_cache *c, ps_hooks *h, const char *name, ps_error *err) {
    return ps_cache_watch(c, h, &model_of(rt)->cfg, name, err);
}

static int model_hook_parse(const ps_runtime *rt, const char *name, int *slot, int *point, ps_error *err) {
    ps_hook_point pt;
    if (ps_hook_parse(&model_of(rt)->cfg, name, slot, &pt, err)) return -1;
    *point = (int)pt;
    return 0;
}

static json_t *model_config_json(const ps_runtime *rt) {
    char *cj = ps_config_to_json(&model_of(rt)->cfg);
    json_t *o = cj ? json_loads(cj, 0, NULL) : NULL;
    free(cj);
    return o;
}

static void model_config_hash(const ps_runtime *rt, char out[17]) { ps_config_hash(&model_of(rt)->cfg, out); }

static int64_t model_step(const ps_runtime *rt) {
    const char *ms = ps_model_get_meta(model_of(rt), "phasescope.step");
    return ms ? strtoll(ms, NULL, 10) : -1;
}

static int64_t model_period(const ps_runtime *rt) {
    const ps_config *c = &model_of(rt)->cfg;
    return c->kind == PS_ATTN_COMPRESSED ? c->stride : c->kind == PS_ATTN_CHANNEL ? c->rate : 8;
}

static int64_t model_vocab(const ps_runtime *rt) { return model_of(rt)->cfg.vocab_size; }

static const char *model_meta(const ps_runtime *rt, const char *key) { return ps_model_get_meta(model_of(rt), key); }

static int model_save(const ps_runtime *rt, const char *dir, const char *key, const char *value, ps_error *err) {
    ps_model *m = rt->model;
    return ps_model_set_meta(m, key, value, err) || ps_model_save(m, dir, err) ? -1 : 0;
}

static int model_rows(const ps_runtime *rt, const ps_batch *b, int64_t batch, double mem_bytes, ps_rows_fn fn, void *user,
                      ps_error *err) {
    return ps_eval_rows(model_of(rt), b, batch, mem_bytes, fn, user, err);
}

static int model_describe(const ps_runtime *rt, int64_t B, FILE *out, ps_error *err) {
    (void)err;
    const ps_model *m = model_of(rt);
    const ps_config *c = &m->cfg;
    char hash[17];
    ps_config_hash(c, hash);
    char *cj = ps_config_to_json(c);
    fprintf(out, "config hash %s\n%s\n\n", hash, cj);
    free(cj);
    if (ps_config_per_layer_offsets(c)) { /* the config's 2-D list, one line per layer */
        fprintf(out, "window grid offsets o_{l,g} (attention.head_offsets; a row per layer, a column per KV head)\n");
        for (int64_t l = 0; l < c->n_layers; l++) {
            fprintf(out, "  layer %-3lld", (long long)l);
            for (int64_t g = 0; g < c->n_kv_heads; g++) fprintf(out, " %lld", (long long)ps_config_grid_offset(c, l, g));
            fprintf(out, "\n");
        }
        fprintf(out, "\n");
    }

    const char *groups[] = {"embedding", "attention q/k/v/o", "qk-norm", "compressor payloads", "compressor gates",
                            "layer norms", "mlp", "lm_head (untied)"};
    int64_t cnt[8] = {0};
    for (int i = 0; i < m->n_tensors; i++) {
        const ps_param_info *p = &m->table[i];
        int g;
        switch (p->kind) {
        case PS_P_EMBED: g = 0; break;
        case PS_P_WQ: case PS_P_WK: case PS_P_WV: case PS_P_WO: g = 1; break;
        case PS_P_QNORM: case PS_P_KNORM: g = 2; break;
        case PS_P_KEY_PAYLOAD: case PS_P_VALUE_PAYLOAD: case PS_P_V4_C_WKV: g = 3; break;
        case PS_P_KEY_GATE_W: case PS_P_KEY_GATE_B: case PS_P_VALUE_GATE_W: case PS_P_VALUE_GATE_B:
        case PS_P_V4_C_WGATE: case PS_P_V4_C_APE: g = 4; break;
        case PS_P_IN_NORM: case PS_P_POST_NORM: case PS_P_FINAL_NORM: case PS_P_V4_C_NORM: g = 5; break;
        case PS_P_V4_SINKS: g = 1; break;
        case PS_P_MLP_GATE: case PS_P_MLP_UP: case PS_P_MLP_DOWN: g = 6; break;
        default: g = 7; break;
        }
        cnt[g] += p->numel;
    }
    fprintf(out, "parameters  %lld total\n", (long long)m->n_params);
    for (int g = 0; g < 8; g++)
        if (cnt[g]) fprintf(out, "  %-22s %12lld  (%.1f%%)\n", groups[g], (long long)cnt[g], 100.0 * (double)cnt[g] / (double)m->n_params);

    /* KV cache (float32): a full cache stores k and v for every token; the compressed one stores one
     * compressed k and v per window (a new window every S tokens) plus a ring of local_window raw
     * entries, constant in the sequence length. */
    double per_tok_full = (double)c->n_layers * 2.0 * (double)(c->n_kv_heads * c->head_dim) * 4.0;
    fprintf(out, "\nKV cache (float32)\n  full attention        %.1f bytes/token\n", per_tok_full);
    if (c->kind == PS_ATTN_COMPRESSED && c->boundaries == PS_BOUNDARIES_CONTENT) {
        /* content chunks: one entry per chunk, the expected chunk length E[L] from the boundary threshold
         * (core/chunks.h; about S by construction); `info` adds the value measured on the model's task */
        double EL = ps_chunk_expected_len(c), per_tok = per_tok_full / EL;
        char local[32];
        ps_runtime_human_bytes(local, sizeof local, per_tok_full * (double)c->local_window);
        fprintf(out,
                "  compressed, content chunks of %lld..%lld tokens (mean S = %lld)\n"
                "                        %.1f bytes/token expected (%.3fx smaller: E[chunk length] = %.4f from the boundary\n"
                "                        threshold, hash values taken as uniform) + %s fixed local window\n",
                (long long)c->chunk_min, (long long)c->window, (long long)c->stride, per_tok, EL, EL, local);
    } else if (c->kind == PS_ATTN_COMPRESSED) {
        double per_tok = per_tok_full / (double)c->stride;
        char local[32];
        ps_runtime_human_bytes(local, sizeof local, per_tok_full * (double)c->local_window);
        fprintf(out, "  compressed W%lld/S%lld      %.1f bytes/token (%.1fx smaller) + %s fixed local window\n",
               (long long)c->window, (long long)c->stride, per_tok, (double)c->stride, local);
    }
    if (c->kind == PS_ATTN_SELECT) { /* every raw k and v, and the pooled keys that choose the blocks */
        double per_tok = ps_kvcache_bytes_per_token(c);
        fprintf(out, "  select K%lld/S%lld, block %lld  %.1f bytes/token (raw k, v of every token and pooled keys every %lld and %lld tokens)\n",
                (long long)c->window, (long long)c->stride, (long long)c->block, per_tok, (long long)c->stride, (long long)(4 * c->stride));
    }
    if (c->kind == PS_ATTN_CHANNEL) { /* K = V: one entry per token (raw) or per m tokens (compressed) */
        double per_tok = (double)c->n_layers * (double)c->head_dim * 4.0 / (double)c->rate;
        char local[32];
        ps_runtime_human_bytes(local, sizeof local, (double)c->n_layers * (double)c->head_dim * 4.0 * (double)c->local_window);
        fprintf(out, "  v4 %s, rate %lld      %.1f bytes/token (%.1fx smaller: K = V and one entry per %lld tokens) + %s sliding window\n",
               c->v4_mode == PS_V4_MODE_HCA ? "HCA" : "CSA", (long long)c->rate, per_tok, per_tok_full / per_tok, (long long)c->rate,
               local);
    }
    double pbytes = (double)m->n_params * 4.0;
    double fwd = (double)ps_acts_size(c, B, c->max_seq_len, false, false) * 4.0 + pbytes;
    /* training: params + grads + 2 Adam moments, and every layer's activations (plus their gradients, bounded by the
     * same size again) */
    double train = pbytes * 4.0 + 2.0 * (double)ps_acts_size(c, B, c->max_seq_len, true, false) * 4.0;
    /* knockout grid: one batch's activations of every layer kept, plus the per-shift means of one target */
    double grid = pbytes + (double)ps_acts_size(c, B, c->max_seq_len, true, false) * 4.0 +
                  (double)c->n_layers * (double)c->max_seq_len * (double)(c->n_kv_heads * c->head_dim) * 2.0 * 8.0;
    char fw[32], b[32], pb[32], kg[32], av[96];
    ps_runtime_human_bytes(pb, sizeof pb, pbytes);
    ps_runtime_human_bytes(fw, sizeof fw, fwd);
    ps_runtime_human_bytes(b, sizeof b, train);
    ps_runtime_human_bytes(kg, sizeof kg, grid);
    ps_runtime_mem_now(av, sizeof av, rt->ctx);
    fprintf(out, "\nmemory (batch %lld, T = max_seq_len = %lld; %s)\n  weights               %s\n"
           "  forward pass          %s\n"
           "  training step         %s (weights, gradients, AdamW moments, activations and their gradients)\n"
           "  knockout grid         %s (every layer's activations of one batch, and the means)\n",
           (long long)B, (long long)c->max_seq_len, av, pb, fw, b, kg);
    return 0;
}

/* block selection: every layer of a select model, at T >= dense_len */
static int model_sel_layer(const ps_runtime *rt, int layer, int64_t T, ps_select_geom *g, char *why, size_t n) {
    const ps_config *c = &model_of(rt)->cfg;
    (void)layer;
    if (c->kind != PS_ATTN_SELECT) {
        snprintf(why, n, "the model's attention (kind %s) selects no blocks: recall needs attention.kind \"select\"",
                 c->kind == PS_ATTN_FULL ? "full" : c->kind == PS_ATTN_COMPRESSED ? "compressed" : "channel");
        return 0;
    }
    if (!ps_select_sparse(c, T)) {
        snprintf(why, n, "a forward of %lld tokens is dense (attention.dense_len %lld): every block is attended", (long long)T,
                 (long long)c->dense_len);
        return 0;
    }
    *g = (ps_select_geom){.cfg = ps_config_select(c), .n_kv = c->n_kv_heads, .blocks_point = PS_HOOK_BLOCKS};
    return 1;
}

const ps_family ps_family_model = {
    .name = "phasescope",
    .kvcache = &ps_kvcache_model_ops,
    .model_size = sizeof(ps_model),
    .detect = model_detect,
    .open = model_open,
    .free_model = model_free,
    .acts_bytes = model_acts_bytes,
    .acts_create = model_acts_create,
    .acts_free = model_acts_free,
    .forward = model_forward,
    .logits = model_logits,
    .restart = model_restart,
    .score = model_score,
    .rows = model_rows,
    .points = MODEL_POINTS,
    .n_points = (int)(sizeof MODEL_POINTS / sizeof MODEL_POINTS[0]),
    .hook_family = &ps_model_hook_family,
    .point_shape = model_point_shape,
    .hook_add = model_hook_add,
    .hook_add_action = model_hook_add_action,
    .cache_watch = model_cache_watch,
    .hook_parse = model_hook_parse,
    .config_json = model_config_json,
    .config_hash = model_config_hash,
    .step = model_step,
    .default_period = model_period,
    .vocab = model_vocab,
    .meta = model_meta,
    .save = model_save,
    .max_pos_name = "max_seq_len",
    .load_weights = NULL,
    .describe = model_describe,
    .early_stop = 0,
    .describe_config = ps_model_describe_config,
    .kinds = ps_model_attention_kinds,
    .title = "phasescope",
    .task_file = 0,
    .ko.targets = ps_model_ko_target_names,
    .ko.heads_what = "KV heads",
    .ko.default_target = ps_model_ko_default,
    .ko.heads = ps_model_ko_heads,
    .ko.unit = ps_model_ko_unit,
    .ko.missing = ps_model_ko_missing,
    .ko.arrays = ps_model_ko_arrays,
    .ko.mean = ps_model_ko_mean,
    .cycle.check = ps_model_cycle_check,
    .cycle.roll = ps_model_cycle,
    .cycle.meta = ps_model_cycle_meta,
    .gates.info = ps_model_gates,
    .gates.taps = ps_model_gate_taps,
    .grad.backward = ps_model_backward,
    .grad.backward_free = ps_model_backward_free,
    .grad.state_point = ps_model_state_point,
    .grad.target_missing = ps_model_atp_target_missing,
    .grad.patch_missing = ps_model_patch_missing,
    .grad.patch_attention = ps_model_patch_attention,
    .grad.patch_point = PS_HOOK_Z,
    .sel.layer = model_sel_layer,
};

const ps_model *ps_runtime_controlled(const ps_runtime *rt) { return rt->family == &ps_family_model ? rt->model : NULL; }

void ps_runtime_wrap_model(ps_runtime *rt, const ps_model *m) {
    memset(rt, 0, sizeof *rt);
    model_fill(rt, m);
}

/* ---- opening ---- */

/* DeepSeek-V4 and MiniCPM4 first: their detectors are specific; the controlled model's loader judges every other directory */
const ps_family *const ps_families[] = {&ps_family_v4, &ps_family_minicpm, &ps_family_model, NULL};

const ps_family *ps_runtime_detect_in(const ps_family *const *families, const char *dir) {
    if (!families) families = ps_families;
    for (int i = 0; families[i]; i++)
        if (families[i]->detect && families[i]->detect(dir)) return families[i];
    return &ps_family_model;
}

const ps_family *ps_runtime_detect(const char *dir) { return ps_runtime_detect_in(ps_families, dir); }

static int open_with(ps_runtime *rt, const ps_family *f, const char *dir, const ps_runtime_opts *o,
                     void *(*storage)(const ps_family *f, void *user), void *user, ps_error *err) {
    memset(rt, 0, sizeof *rt);
    void *model = storage ? storage(f, user) : NULL;
    int allocated = !model;
    if (allocated && !(model = calloc(1, f->model_size))) return ps_fail(err, "out of memory");
    if (!allocated) memset(model, 0, f->model_size);
    rt->family = f;
    rt->model = model;
    rt->owns_model = 1; /* a failed open leaves what ps_runtime_free needs */
    rt->model_allocated = allocated;
    return f->open(rt, model, dir, o, err);
}

int ps_runtime_open_into(ps_runtime *rt, const char *dir, const ps_runtime_opts *o,
                         void *(*storage)(const ps_family *f, void *user), void *user, ps_error *err) {
    return open_with(rt, ps_runtime_detect(dir), dir, o, storage, user, err);
}

int ps_runtime_open_family(ps_runtime *rt, const ps_family *f, const char *dir, const ps_runtime_opts *o, ps_error *err) {
    return open_with(rt, f, dir, o, NULL, NULL, err);
}

int ps_runtime_open_in(ps_runtime *rt, const ps_family *const *families, const char *dir, const ps_runtime_opts *o,
                       ps_error *err) {
    return open_with(rt, ps_runtime_detect_in(families, dir), dir, o, NULL, NULL, err);
}

int ps_runtime_open(ps_runtime *rt, const char *dir, const ps_runtime_opts *o, ps_error *err) {
    return ps_runtime_open_into(rt, dir, o, NULL, NULL, err);
}

void ps_runtime_free(ps_runtime *rt) {
    if (rt->owns_model && rt->family && rt->model) {
        rt->family->free_model(rt->model);
        if (rt->model_allocated) free(rt->model);
    }
    memset(rt, 0, sizeof *rt);
}
