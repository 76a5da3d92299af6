/* runtime.c — the family interface (runtime.h): the controlled model's and DeepSeek-V4's tables, and
 * opening a checkpoint through them. */
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

/* the families' descriptions of their configs (describe.c) */
extern const char *const ps_model_attention_kinds[], *const ps_v4_attention_kinds[];
int ps_model_describe_config(const json_t *cfg, ps_model_desc *d, ps_error *err);
/* the families' knockout targets as data (ko_targets.c) */
extern const char *const ps_model_ko_target_names[];
int ps_model_ko_default(const ps_runtime *rt);
int64_t ps_model_ko_heads(const ps_runtime *rt, int target);
const char *ps_model_ko_unit(const ps_runtime *rt, int target);
const char *ps_model_ko_missing(const ps_runtime *rt, int target, int layer, char *buf, size_t n);
int ps_model_ko_arrays(const ps_runtime *rt, int target, ps_ko_array arr[PS_KO_MAX_ARRAYS], int *restart);
int ps_model_ko_mean(const ps_runtime *rt, int target, const ps_ko_array *a, int layer, const int32_t *tokens, int64_t N,
                     int64_t T, const double *sum, int64_t n_sum, float *mean, int64_t n_mean, ps_error *err);
int ps_v4_ko_default(const ps_runtime *rt);
int64_t ps_v4_ko_heads(const ps_runtime *rt, int target);
const char *ps_v4_ko_unit(const ps_runtime *rt, int target);
const char *ps_v4_ko_missing(const ps_runtime *rt, int target, int layer, char *buf, size_t n);
int ps_v4_ko_arrays(const ps_runtime *rt, int target, ps_ko_array arr[PS_KO_MAX_ARRAYS], int *restart);
int ps_v4_ko_mean(const ps_runtime *rt, int target, const ps_ko_array *a, int layer, const int32_t *tokens, int64_t N,
                  int64_t T, const double *sum, int64_t n_sum, float *mean, int64_t n_mean, ps_error *err);
int ps_v4_describe_config(const json_t *cfg, ps_model_desc *d, ps_error *err);
/* the controlled model's gradients at hook points (attribution.c) */
int ps_model_backward(const ps_runtime *rt, void *state, void **scratch, const int32_t *tokens, const int32_t *targets,
                      const ps_hooks *grad_hooks, int stop_layer, double *loss, ps_error *err);
void ps_model_backward_free(const ps_runtime *rt, void *scratch);
const float *ps_model_state_point(const ps_runtime *rt, void *state, int layer, int point, int64_t dims[4]);
const char *ps_model_patch_missing(const ps_runtime *rt, char *buf, size_t n);
int ps_model_patch_attention(const ps_runtime *rt, void *state, void **scratch, int layer, int head, const int *points,
                             const float *const *means, int n, float *dz, ps_error *err);
/* the families' gate statistics as data (gate_records.c) */
int ps_model_gates(const ps_runtime *rt, ps_gate_info *g, char *why, size_t n);
int ps_model_gate_taps(const ps_runtime *rt, int64_t n, int64_t T, ps_gate_tap *taps);
int ps_v4_gates(const ps_runtime *rt, ps_gate_info *g, char *why, size_t n);
int ps_v4_gate_taps(const ps_runtime *rt, int64_t n, int64_t T, ps_gate_tap *taps);

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

static void human(char *buf, size_t n, double bytes) {
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (bytes >= 1024 && i < 4) {
        bytes /= 1024;
        i++;
    }
    snprintf(buf, n, i ? "%.2f %s" : "%.0f %s", bytes, u[i]);
}

/* "X available now on cpu" / "X free of Y on cuda": the memory of the context the model runs on */
static void mem_now(char *buf, size_t n, ps_ctx *ctx) {
    int64_t fb = 0, tb = 0;
    ps_error e;
    char f[32], t[32];
    if (!ctx || ps_ctx_mem_info(ctx, &fb, &tb, &e)) {
        human(f, sizeof f, (double)ps_mem_available());
        snprintf(buf, n, "%s available now", f);
        return;
    }
    human(f, sizeof f, (double)fb);
    human(t, sizeof t, (double)tb);
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
        human(local, sizeof local, per_tok_full * (double)c->local_window);
        fprintf(out,
                "  compressed, content chunks of %lld..%lld tokens (mean S = %lld)\n"
                "                        %.1f bytes/token expected (%.3fx smaller: E[chunk length] = %.4f from the boundary\n"
                "                        threshold, hash values taken as uniform) + %s fixed local window\n",
                (long long)c->chunk_min, (long long)c->window, (long long)c->stride, per_tok, EL, EL, local);
    } else if (c->kind == PS_ATTN_COMPRESSED) {
        double per_tok = per_tok_full / (double)c->stride;
        char local[32];
        human(local, sizeof local, per_tok_full * (double)c->local_window);
        fprintf(out, "  compressed W%lld/S%lld      %.1f bytes/token (%.1fx smaller) + %s fixed local window\n",
               (long long)c->window, (long long)c->stride, per_tok, (double)c->stride, local);
    }
    if (c->kind == PS_ATTN_CHANNEL) { /* K = V: one entry per token (raw) or per m tokens (compressed) */
        double per_tok = (double)c->n_layers * (double)c->head_dim * 4.0 / (double)c->rate;
        char local[32];
        human(local, sizeof local, (double)c->n_layers * (double)c->head_dim * 4.0 * (double)c->local_window);
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
    human(pb, sizeof pb, pbytes);
    human(fw, sizeof fw, fwd);
    human(b, sizeof b, train);
    human(kg, sizeof kg, grid);
    mem_now(av, sizeof av, rt->ctx);
    fprintf(out, "\nmemory (batch %lld, T = max_seq_len = %lld; %s)\n  weights               %s\n"
           "  forward pass          %s\n"
           "  training step         %s (weights, gradients, AdamW moments, activations and their gradients)\n"
           "  knockout grid         %s (every layer's activations of one batch, and the means)\n",
           (long long)B, (long long)c->max_seq_len, av, pb, fw, b, kg);
    return 0;
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
    .ko_targets = ps_model_ko_target_names,
    .ko_heads_what = "KV heads",
    .ko_default = ps_model_ko_default,
    .ko_heads = ps_model_ko_heads,
    .ko_unit = ps_model_ko_unit,
    .ko_missing = ps_model_ko_missing,
    .ko_arrays = ps_model_ko_arrays,
    .ko_mean = ps_model_ko_mean,
    .cycle_check = ps_model_cycle_check,
    .cycle = ps_model_cycle,
    .cycle_meta = ps_model_cycle_meta,
    .gates = ps_model_gates,
    .gate_taps = ps_model_gate_taps,
    .backward = ps_model_backward,
    .backward_free = ps_model_backward_free,
    .state_point = ps_model_state_point,
    .patch_missing = ps_model_patch_missing,
    .patch_attention = ps_model_patch_attention,
    .patch_point = PS_HOOK_Z,
};

const ps_model *ps_runtime_controlled(const ps_runtime *rt) { return rt->family == &ps_family_model ? rt->model : NULL; }

void ps_runtime_wrap_model(ps_runtime *rt, const ps_model *m) {
    memset(rt, 0, sizeof *rt);
    model_fill(rt, m);
}

/* ---- DeepSeek-V4 ---- */

#define V4_EVERY "every layer"
#define V4_COMP "CSA/HCA layers"
#define V4_CSA "CSA layers"
static const ps_point_info V4_POINTS[] = {
    {"embed", "[B, T, D]", -1, "once", PS_V4H_EMBED, "embedding rows"},
    {"layers.{L}.attn_hc.pre", "[B, T, N]", -1, V4_EVERY, PS_V4H_ATTN_HC_PRE, "mHC weights of the attention site"},
    {"layers.{L}.attn_hc.post", "[B, T, N]", -1, V4_EVERY, PS_V4H_ATTN_HC_POST, "mHC weights of the attention site"},
    {"layers.{L}.attn_hc.comb", "[B, T, N, N]", 2, V4_EVERY, PS_V4H_ATTN_HC_COMB, "mixing matrix after Sinkhorn"},
    {"layers.{L}.attn_in", "[B, T, D]", -1, V4_EVERY, PS_V4H_ATTN_IN, "block input after attn_norm"},
    {"layers.{L}.attn.q_lora", "[B, T, Q]", -1, V4_EVERY, PS_V4H_Q_LORA, "after q_norm"},
    {"layers.{L}.attn.q", "[B, T, H, Dh]", 2, V4_EVERY, PS_V4H_Q, "queries after the per-head norm and rope"},
    {"layers.{L}.attn.kv", "[B, T, Dh]", -1, V4_EVERY, PS_V4H_KV, "raw K = V entries after kv_norm and rope"},
    {"layers.{L}.attn.compressor.gate", "[B, nW, S, Dh]", 2, V4_COMP, PS_V4H_C_GATE, "slot logits z + ape"},
    {"layers.{L}.attn.compressor.alpha", "[B, nW, S, Dh]", 2, V4_COMP, PS_V4H_C_ALPHA, "per-channel softmax over the slots"},
    {"layers.{L}.attn.compressor.pooled", "[B, nW, Dh]", -1, V4_COMP, PS_V4H_C_POOLED, "pooled entry before the norm"},
    {"layers.{L}.attn.compressor.kv", "[B, nW, Dh]", -1, V4_COMP, PS_V4H_C_KV, "compressed entries"},
    {"layers.{L}.attn.indexer.compressor.gate", "[B, nW, 2m, Di]", 2, V4_CSA, PS_V4H_I_C_GATE, "the indexer's compressor"},
    {"layers.{L}.attn.indexer.compressor.alpha", "[B, nW, 2m, Di]", 2, V4_CSA, PS_V4H_I_C_ALPHA, "the indexer's compressor"},
    {"layers.{L}.attn.indexer.compressor.pooled", "[B, nW, Di]", -1, V4_CSA, PS_V4H_I_C_POOLED, "the indexer's keys, pooled"},
    {"layers.{L}.attn.indexer.compressor.kv", "[B, nW, Di]", -1, V4_CSA, PS_V4H_I_C_KV, "the indexer's keys"},
    {"layers.{L}.attn.indexer.q", "[B, T, Hi, Di]", 2, V4_CSA, PS_V4H_I_Q, "indexer queries"},
    {"layers.{L}.attn.indexer.weights", "[B, T, Hi]", 2, V4_CSA, PS_V4H_I_WEIGHTS, "indexer head weights"},
    {"layers.{L}.attn.indexer.scores", "[B, T, nW]", -1, V4_CSA, PS_V4H_I_SCORES, "index scores, unmasked"},
    {"layers.{L}.attn.indexer.topk", "[B, T, K]", -1, V4_CSA, PS_V4H_I_TOPK, "selected entries (integers as floats)"},
    {"layers.{L}.attn.indexer.gap", "[B, T]", -1, V4_CSA, PS_V4H_I_GAP, "K-th minus (K+1)-th visible score"},
    {"layers.{L}.attn.bias", "[B, T, T + nW]", -1, V4_EVERY, PS_V4H_BIAS, "additive mask, raw columns first"},
    {"layers.{L}.attn.logits", "[B, H, T, T + nW]", 1, V4_EVERY, PS_V4H_LOGITS, "scaled logits + bias"},
    {"layers.{L}.attn.pattern", "[B, H, T, T + nW]", 1, V4_EVERY, PS_V4H_PATTERN, "probabilities without the sink column"},
    {"layers.{L}.attn.sink", "[B, H, T]", 1, V4_EVERY, PS_V4H_SINK, "probability mass on the sink"},
    {"layers.{L}.attn.out_heads", "[B, T, H, Dh]", 2, V4_EVERY, PS_V4H_OUT_HEADS, "per-head outputs after the inverse rope"},
    {"layers.{L}.attn.out", "[B, T, D]", -1, V4_EVERY, PS_V4H_ATTN_OUT, "after wo_a and wo_b"},
    {"layers.{L}.mid", "[B, T, N, D]", 2, V4_EVERY, PS_V4H_MID, "streams after the attention site"},
    {"layers.{L}.ffn_hc.pre", "[B, T, N]", -1, V4_EVERY, PS_V4H_FFN_HC_PRE, "mHC weights of the FFN site"},
    {"layers.{L}.ffn_hc.post", "[B, T, N]", -1, V4_EVERY, PS_V4H_FFN_HC_POST, "mHC weights of the FFN site"},
    {"layers.{L}.ffn_hc.comb", "[B, T, N, N]", 2, V4_EVERY, PS_V4H_FFN_HC_COMB, "the FFN site's mixing matrix"},
    {"layers.{L}.ffn_in", "[B, T, D]", -1, V4_EVERY, PS_V4H_FFN_IN, "FFN input after ffn_norm"},
    {"layers.{L}.ffn.router_logits", "[B, T, E]", -1, V4_EVERY, PS_V4H_ROUTER_LOGITS, "x . gate^T"},
    {"layers.{L}.ffn.experts", "[B, T, k]", -1, V4_EVERY, PS_V4H_EXPERTS, "routed experts (integers as floats)"},
    {"layers.{L}.ffn.weights", "[B, T, k]", -1, V4_EVERY, PS_V4H_WEIGHTS, "the routed experts' weights"},
    {"layers.{L}.ffn.route_gap", "[B, T]", -1, V4_EVERY, PS_V4H_ROUTE_GAP, "k-th minus (k+1)-th score"},
    {"layers.{L}.ffn.routed", "[B, T, D]", -1, V4_EVERY, PS_V4H_ROUTED, "routed experts' sum"},
    {"layers.{L}.ffn.shared", "[B, T, D]", -1, V4_EVERY, PS_V4H_SHARED, "shared expert"},
    {"layers.{L}.ffn.out", "[B, T, D]", -1, V4_EVERY, PS_V4H_FFN_OUT, "routed + shared"},
    {"layers.{L}.out", "[B, T, N, D]", 2, V4_EVERY, PS_V4H_OUT, "streams leaving the layer"},
    {"hc_head.pre", "[B, T, N]", -1, "once", PS_V4H_HC_HEAD_PRE, "the head's collapse weights"},
    {"final_hidden", "[B, T, D]", -1, "once", PS_V4H_FINAL_HIDDEN, "after the final norm"},
    {"logits", "[B, T, V]", -1, "once", PS_V4H_LOGITS_OUT, "the logits"},
};

static ps_v4_model *v4_of(const ps_runtime *rt) { return rt->model; }

static int v4_detect(const char *dir) {
    char cpath[4200];
    snprintf(cpath, sizeof cpath, "%s/config.json", dir);
    return ps_v4_config_detect_file(cpath) == 1;
}

static int v4_load_weights(ps_runtime *rt, int lazy, ps_error *err);

int ps_runtime_hash_file(const char *path, char out[17], ps_error *err) {
    char *text;
    size_t len;
    uint64_t h = 1469598103934665603ULL;
    if (ps_read_file(path, (size_t)16 << 20, &text, &len, err)) return -1;
    for (size_t i = 0; i < len; i++) h = (h ^ (unsigned char)text[i]) * 1099511628211ULL;
    free(text);
    snprintf(out, 17, "%016llx", (unsigned long long)h);
    return 0;
}

static int v4_open(ps_runtime *rt, void *model, const char *dir, const ps_runtime_opts *o, ps_error *err) {
    ps_v4_model *m = model;
    const char *backend = o && o->backend ? o->backend : "cpu";
    if (o && o->lazy == 1 && strcmp(backend, "cpu")) {
        ps_fail(err, "--lazy: layers loaded one at a time run on the cpu backend (--backend %s needs every layer in memory)",
                backend);
        err->usage = 1;
        return -1;
    }
    if (strlen(backend) >= sizeof m->backend) {
        ps_fail(err, "--backend %s: no such backend", backend);
        err->usage = 1;
        return -1;
    }
    if (ps_v4_model_open(m, dir, err)) return -1;
    snprintf(m->backend, sizeof m->backend, "%s", backend); /* the weights are read on the host, then moved (v4_load_weights) */
    rt->model = m;
    rt->family = &ps_family_v4;
    rt->max_pos = m->cfg.max_position_embeddings;
    rt->n_layers = m->cfg.n_layers;
    rt->weight_bytes = 4.0 * (double)m->n_params;
    if (ps_runtime_hash_file(m->cpath, rt->config_hash, err)) return -1;
    rt->ctx = m->ctx;
    /* lazy -1: every layer in memory when the float32 weights take at most half of the memory available */
    return !o || o->weights ? v4_load_weights(rt, o ? o->lazy : -1, err) : 0;
}

static void v4_free(void *model) { ps_v4_model_free(model); }

static int64_t v4_acts_bytes(const ps_runtime *rt, int64_t B, int64_t T, int keep_all) {
    (void)keep_all; /* one set of buffers shared by the layers */
    return ps_v4_acts_bytes(&v4_of(rt)->cfg, B, T, 0);
}

static void *v4_acts_create(const ps_runtime *rt, int64_t B, int64_t T, int keep_all, ps_error *err) {
    if (keep_all) {
        ps_fail(err, "DeepSeek-V4: no kept activations (the forward shares one set of buffers between layers)");
        return NULL;
    }
    ps_v4_acts *a = calloc(1, sizeof *a);
    if (!a) {
        ps_fail(err, "out of memory");
        return NULL;
    }
    if (ps_v4_acts_create(a, v4_of(rt), B, T, err)) {
        free(a);
        return NULL;
    }
    return a;
}

static void v4_acts_free(void *acts) {
    if (!acts) return;
    ps_v4_acts_free(acts);
    free(acts);
}

static int v4_forward(const ps_runtime *rt, void *acts, const int32_t *tokens, const ps_hooks *h, int n_run, ps_error *err) {
    return ps_v4_forward(v4_of(rt), acts, tokens, h, n_run, err);
}

static const float *v4_logits(void *acts, ps_error *err) { return ps_v4_logits_host(acts, err); }

static int v4_score(const ps_runtime *rt, const ps_batch *b, int64_t batch, const ps_hooks *h, int *ok, double *lp,
                    ps_error *err) {
    ps_v4_model *m = v4_of(rt);
    int64_t N = b->B, T = b->T, V = m->cfg.vocab_size, full = batch < N ? batch : N;
    if (batch < 1) return ps_fail(err, "batch %lld must be >= 1", (long long)batch);
    if (N == 0) return 0;
    ps_v4_acts a, part;
    int have_part = 0, rc;
    int64_t last0 = (N - 1) / full * full;
    if (ps_v4_acts_create(&a, m, full, T, err)) return -1;
    rc = 0;
    if (N - last0 != full) {
        rc = ps_v4_acts_create(&part, m, N - last0, T, err);
        have_part = !rc;
    }
    for (int64_t i0 = 0; i0 < N && !rc; i0 += full) {
        ps_v4_acts *use = i0 == last0 && have_part ? &part : &a;
        ps_batch view = ps_batch_view(b, i0, use->B);
        rc = ps_v4_forward(m, use, view.tokens, h, -1, err);
        const float *lg = rc ? NULL : ps_v4_logits_host(use, err);
        if (!rc && !lg) rc = -1;
        if (!rc) ps_score_queries(&view, lg, V, ok + i0 * b->max_q, lp + i0 * b->max_q);
    }
    if (have_part) ps_v4_acts_free(&part);
    ps_v4_acts_free(&a);
    return rc;
}

/* one sequence at a time through the V4 forward, each cut to its last asked-for row (no memory budget:
 * a V4 sequence's activations are the unit) */
static int v4_rows(const ps_runtime *rt, const ps_batch *b, int64_t batch, double mem_bytes, ps_rows_fn fn, void *user,
                   ps_error *err) {
    (void)batch;
    (void)mem_bytes;
    ps_v4_model *m = v4_of(rt);
    int64_t V = m->cfg.vocab_size, most = 0;
    for (int64_t s = 0; s < b->B; s++) {
        int64_t n = ps_answer_rows(b, s, NULL);
        most = n > most ? n : most;
    }
    int64_t *pos = malloc((size_t)(most ? most : 1) * sizeof *pos);
    float *rows = malloc((size_t)((most ? most : 1) * V) * sizeof(float));
    int rc = pos && rows ? 0 : ps_fail(err, "out of memory for the logits of %lld rows", (long long)most);
    for (int64_t s = 0; s < b->B && !rc; s++) {
        int64_t n = ps_answer_rows(b, s, pos), T = 0;
        for (int64_t k = 0; k < n; k++) T = pos[k] + 1 > T ? pos[k] + 1 : T;
        if (!n) continue;
        ps_v4_acts a;
        if ((rc = ps_v4_acts_create(&a, m, 1, T, err))) break;
        rc = ps_v4_forward(m, &a, b->tokens + s * b->T, NULL, -1, err);
        const float *lg = rc ? NULL : ps_v4_logits_host(&a, err);
        if (!rc && !lg) rc = -1;
        for (int64_t k = 0; k < n && !rc; k++) memcpy(rows + k * V, lg + pos[k] * V, (size_t)V * sizeof(float));
        ps_v4_acts_free(&a);
        if (!rc) rc = fn(b, s, rows, n, user, err);
    }
    free(pos);
    free(rows);
    return rc;
}

static const char *v4_meta(const ps_runtime *rt, const char *key) {
    (void)rt, (void)key;
    return NULL; /* a DeepSeek-V4 checkpoint stores no phasescope metadata */
}

static int v4_point_shape(const ps_runtime *rt, int i, int layer, int64_t B, int64_t T, int64_t d[4]) {
    const ps_v4_config *c = &v4_of(rt)->cfg;
    int p = V4_POINTS[i].point;
    int64_t N = c->hc_mult, D = c->hidden_size, H = c->n_heads, Dh = c->head_dim, Q = c->q_lora_rank, Hi = c->index_n_heads,
            Di = c->index_head_dim, E = c->n_routed_experts, k = c->experts_per_tok, V = c->vocab_size;
    d[0] = B;
    d[1] = T;
    if (p >= PS_V4H_N_LAYER_POINTS) {
        switch (p) {
        case PS_V4H_EMBED:
        case PS_V4H_FINAL_HIDDEN: d[2] = D; return 3;
        case PS_V4H_HC_HEAD_PRE: d[2] = N; return 3;
        default: d[2] = V; return 3;
        }
    }
    if (layer < 0 || layer >= c->n_layers) return 0;
    ps_v4_attn_type at = c->attn_type[layer];
    int64_t m = c->compress_rate[layer], nW = ps_v4_n_windows(c, layer, T), K = c->index_topk < nW ? c->index_topk : nW;
    int comp = at != PS_V4_SLIDING, csa = at == PS_V4_CSA;
    switch (p) {
    case PS_V4H_ATTN_HC_PRE:
    case PS_V4H_ATTN_HC_POST:
    case PS_V4H_FFN_HC_PRE:
    case PS_V4H_FFN_HC_POST: d[2] = N; return 3;
    case PS_V4H_ATTN_HC_COMB:
    case PS_V4H_FFN_HC_COMB: d[2] = N, d[3] = N; return 4;
    case PS_V4H_Q_LORA: d[2] = Q; return 3;
    case PS_V4H_Q:
    case PS_V4H_OUT_HEADS: d[2] = H, d[3] = Dh; return 4;
    case PS_V4H_KV: d[2] = Dh; return 3;
    case PS_V4H_C_GATE:
    case PS_V4H_C_ALPHA:
        if (!comp) return 0;
        d[1] = nW, d[2] = (csa ? 2 : 1) * m, d[3] = Dh;
        return 4;
    case PS_V4H_C_POOLED:
    case PS_V4H_C_KV:
        if (!comp) return 0;
        d[1] = nW, d[2] = Dh;
        return 3;
    case PS_V4H_I_C_GATE:
    case PS_V4H_I_C_ALPHA:
        if (!csa) return 0;
        d[1] = nW, d[2] = 2 * m, d[3] = Di;
        return 4;
    case PS_V4H_I_C_POOLED:
    case PS_V4H_I_C_KV:
        if (!csa) return 0;
        d[1] = nW, d[2] = Di;
        return 3;
    case PS_V4H_I_Q:
        if (!csa) return 0;
        d[2] = Hi, d[3] = Di;
        return 4;
    case PS_V4H_I_WEIGHTS:
        if (!csa) return 0;
        d[2] = Hi;
        return 3;
    case PS_V4H_I_SCORES:
        if (!csa) return 0;
        d[2] = nW;
        return 3;
    case PS_V4H_I_TOPK:
        if (!csa) return 0;
        d[2] = K;
        return 3;
    case PS_V4H_I_GAP: return csa ? 2 : 0;
    case PS_V4H_BIAS: d[2] = T + nW; return 3;
    case PS_V4H_LOGITS:
    case PS_V4H_PATTERN: d[1] = H, d[2] = T, d[3] = T + nW; return 4;
    case PS_V4H_SINK: d[1] = H, d[2] = T; return 3;
    case PS_V4H_MID:
    case PS_V4H_OUT: d[2] = N, d[3] = D; return 4;
    case PS_V4H_ROUTER_LOGITS: d[2] = E; return 3;
    case PS_V4H_EXPERTS:
    case PS_V4H_WEIGHTS: d[2] = k; return 3;
    case PS_V4H_ROUTE_GAP: return 2;
    default: d[2] = D; return 3; /* attn_in, attn.out, ffn_in, routed, shared, ffn.out */
    }
}

static int v4_hook_add(const ps_runtime *rt, ps_hooks *h, const char *name, ps_hook_fn fn, void *user, ps_error *err) {
    return ps_v4_hooks_add(h, &v4_of(rt)->cfg, name, fn, user, err);
}

static int v4_hook_add_action(const ps_runtime *rt, ps_hooks *h, const char *name, const ps_hook_action *act, ps_error *err) {
    return ps_v4_hooks_add_action(h, &v4_of(rt)->cfg, name, act, err);
}

static int v4_cache_watch(const ps_runtime *rt, ps_cache *c, ps_hooks *h, const char *name, ps_error *err) {
    return ps_v4_cache_watch(c, h, &v4_of(rt)->cfg, name, err);
}

static int v4_hook_parse(const ps_runtime *rt, const char *name, int *slot, int *point, ps_error *err) {
    ps_v4_hook_point pt;
    if (ps_v4_hook_parse(&v4_of(rt)->cfg, name, slot, &pt, err)) return -1;
    *point = (int)pt;
    return 0;
}

/* provenance.config of a V4 checkpoint: the attention schedule the figures and the validator read */
static json_t *v4_config_json(const ps_runtime *rt) {
    const ps_v4_config *c = &v4_of(rt)->cfg;
    json_t *o = json_object(), *att = json_object(), *lt = json_array(), *cr = json_array();
    for (int l = 0; l < c->n_layers; l++) {
        json_array_append_new(lt, json_string(ps_v4_attn_type_name(c->attn_type[l])));
        json_array_append_new(cr, json_integer(c->compress_rate[l]));
    }
    json_object_set_new(att, "kind", json_string("deepseek_v4"));
    json_object_set_new(att, "layer_types", lt);
    json_object_set_new(att, "compress_rates", cr);
    json_object_set_new(att, "sliding_window", json_integer(c->sliding_window));
    json_object_set_new(att, "index_topk", json_integer(c->index_topk));
    json_object_set_new(o, "model_type", json_string("deepseek_v4"));
    json_object_set_new(o, "vocab_size", json_integer(c->vocab_size));
    json_object_set_new(o, "hidden_size", json_integer(c->hidden_size));
    json_object_set_new(o, "n_layers", json_integer(c->n_layers));
    json_object_set_new(o, "n_heads", json_integer(c->n_heads));
    json_object_set_new(o, "head_dim", json_integer(c->head_dim));
    json_object_set_new(o, "index_head_dim", json_integer(c->index_head_dim));
    json_object_set_new(o, "attention", att);
    return o;
}

static void v4_config_hash(const ps_runtime *rt, char out[17]) {
    ps_error e;
    if (rt->config_hash[0]) memcpy(out, rt->config_hash, 17);
    else if (ps_runtime_hash_file(v4_of(rt)->cpath, out, &e)) out[0] = '\0'; /* a runtime made without the open */
}

static int64_t v4_step(const ps_runtime *rt) {
    (void)rt;
    return -1;
}

/* the smallest compression rate of the compressed layers (CSA's 4 in V4-Flash / V4-Pro) */
static int64_t v4_period(const ps_runtime *rt) {
    const ps_v4_config *c = &v4_of(rt)->cfg;
    int64_t p = 0;
    for (int l = 0; l < c->n_layers; l++)
        if (c->attn_type[l] != PS_V4_SLIDING && (!p || c->compress_rate[l] < p)) p = c->compress_rate[l];
    return p ? p : 4;
}

static int64_t v4_vocab(const ps_runtime *rt) { return v4_of(rt)->cfg.vocab_size; }

static int v4_describe(const ps_runtime *rt, int64_t B, FILE *out, ps_error *err) {
    (void)err;
    const ps_v4_model *m = v4_of(rt);
    const ps_v4_config *c = &m->cfg;
    fprintf(out, "kind        DeepSeek-V4 (%s tensor names, %s; config keys: %s)\n",
           m->names == PS_V4_NAMES_HF ? "transformers'" : "DeepSeek's", m->files.sharded ? "sharded" : "one file",
           c->config_form == 3 ? "HF and hub (HF win)" : c->config_form == 1 ? "HF" : c->config_form == 2 ? "hub" : "defaults");
    fprintf(out, "config      vocab %lld, hidden %lld, %lld layers, %lld heads x %lld (rope %lld), q_lora %lld, o_groups %lld x %lld,\n"
           "            sliding window %lld, hc_mult %lld (sinkhorn %lld, eps %g), experts %lld (top %lld, width %lld, shared %lld),\n"
           "            indexer %lld heads x %lld (top %lld), swiglu_limit %g, routed scale %g, %s, max positions %lld\n",
           (long long)c->vocab_size, (long long)c->hidden_size, (long long)c->n_layers, (long long)c->n_heads,
           (long long)c->head_dim, (long long)c->rope_dim, (long long)c->q_lora_rank, (long long)c->o_groups,
           (long long)c->o_lora_rank, (long long)c->sliding_window, (long long)c->hc_mult, (long long)c->hc_sinkhorn_iters,
           c->hc_eps, (long long)c->n_routed_experts, (long long)c->experts_per_tok, (long long)c->moe_inter,
           (long long)c->n_shared_experts, (long long)c->index_n_heads, (long long)c->index_head_dim,
           (long long)c->index_topk, c->swiglu_limit, c->routed_scaling_factor,
           c->scoring == PS_V4_SCORE_SIGMOID ? "sigmoid" : "sqrtsoftplus", (long long)c->max_position_embeddings);
    const ps_v4_rope_cfg *rp[2] = {&c->rope_main, &c->rope_compress};
    for (int i = 0; i < 2; i++) {
        fprintf(out, "rope %-8s theta %g", i ? "compress" : "main", rp[i]->theta);
        if (rp[i]->yarn)
            fprintf(out, ", YaRN factor %g, original %g, beta %g/%g, attention factor %g", rp[i]->factor, rp[i]->original_max,
                   rp[i]->beta_fast, rp[i]->beta_slow, rp[i]->attention_factor);
        fprintf(out, "\n");
    }
    fprintf(out, "layers     ");
    for (int l = 0; l < c->n_layers; l++)
        fprintf(out, "%s %d:%s%s%s", l && l % 8 == 0 ? "\n           " : "", l,
               c->attn_type[l] == PS_V4_SLIDING ? "S" : c->attn_type[l] == PS_V4_CSA ? "C" : "H",
               c->attn_type[l] == PS_V4_SLIDING ? "" : "", c->mlp_type[l] == PS_V4_HASH_MOE ? "h" : "");
    fprintf(out, "\n            (S sliding, C CSA, H HCA; h hash routing; rates:");
    for (int l = 0; l < c->n_layers; l++)
        if (c->attn_type[l] != PS_V4_SLIDING) fprintf(out, " %d:%lld", l, (long long)c->compress_rate[l]);
    fprintf(out, ")\n");
    /* parameters by group */
    const char *groups[] = {"embedding + head", "attention", "compressor + indexer", "mHC", "router", "routed experts",
                            "shared experts", "norms"};
    int64_t cnt[8] = {0};
    for (int t = 0; t < m->n_tensors; t++) {
        const ps_v4_tensor *x = &m->table[t];
        int g;
        switch (x->kind) {
        case PS_V4_T_EMBED: case PS_V4_T_HEAD: g = 0; break;
        case PS_V4_T_SINK: case PS_V4_T_WQ_A: case PS_V4_T_WQ_B: case PS_V4_T_WKV: case PS_V4_T_WO_A: case PS_V4_T_WO_B: g = 1; break;
        case PS_V4_T_C_WKV: case PS_V4_T_C_WGATE: case PS_V4_T_C_APE: case PS_V4_T_I_WQ_B: case PS_V4_T_I_WP:
        case PS_V4_T_I_WKV: case PS_V4_T_I_WGATE: case PS_V4_T_I_APE: g = 2; break;
        case PS_V4_T_HC_HEAD_FN: case PS_V4_T_HC_HEAD_BASE: case PS_V4_T_HC_HEAD_SCALE: case PS_V4_T_HC_ATTN_FN:
        case PS_V4_T_HC_ATTN_BASE: case PS_V4_T_HC_ATTN_SCALE: case PS_V4_T_HC_FFN_FN: case PS_V4_T_HC_FFN_BASE:
        case PS_V4_T_HC_FFN_SCALE: g = 3; break;
        case PS_V4_T_GATE_W: case PS_V4_T_GATE_BIAS: g = 4; break;
        case PS_V4_T_W1: case PS_V4_T_W2: case PS_V4_T_W3: g = 5; break;
        case PS_V4_T_SW1: case PS_V4_T_SW2: case PS_V4_T_SW3: g = 6; break;
        case PS_V4_T_TID2EID: continue;
        default: g = 7; break;
        }
        cnt[g] += x->numel;
    }
    fprintf(out, "\nparameters  %lld total (float32 after dequantisation)\n", (long long)m->n_params);
    for (int g = 0; g < 8; g++)
        if (cnt[g]) fprintf(out, "  %-22s %14lld  (%.1f%%)\n", groups[g], (long long)cnt[g], 100.0 * (double)cnt[g] / (double)m->n_params);
    const char *cls[] = {"F32 / BF16 / F16", "FP8 e4m3", "FP4 e2m1", "integer", "block scales", "other"};
    fprintf(out, "\nstorage (what the checkpoint holds)\n");
    char hb[32];
    for (int i = 0; i < 6; i++)
        if (m->storage.n_tensors[i]) {
            human(hb, sizeof hb, (double)m->storage.bytes[i]);
            fprintf(out, "  %-22s %8lld tensors  %s\n", cls[i], (long long)m->storage.n_tensors[i], hb);
        }
    /* the KV cache at inference (core/v4/v4_kvcache.h): per CSA/HCA layer one entry of Dh per m tokens, plus
     * the indexer's key of Di on CSA layers; fixed: the sliding window's raw rows and the open windows */
    double kv_tok = ps_v4_kvcache_bytes_per_token(c), kv_full = (double)c->n_layers * (double)c->head_dim * 4.0;
    char kf[32];
    human(kf, sizeof kf, ps_v4_kvcache_fixed_bytes(c));
    fprintf(out,
            "\nKV cache (float32; generate, serve)\n"
            "  %.1f bytes/token (compressed entries and indexer keys) + %s fixed (sliding window, open windows)\n"
            "  one raw K=V row per token in every layer would be %.1f bytes/token (%.1fx more)\n",
            kv_tok, kf, kv_full, kv_tok > 0 ? kv_full / kv_tok : 0.0);
    /* memory */
    int64_t big = 0;
    for (int l = 0; l < c->n_layers; l++)
        if (m->layer_floats[l] > big) big = m->layer_floats[l];
    double all = (double)m->n_params * 4, lazy = ((double)m->global_floats + (double)big) * 4;
    char a1[32], a2[32], av[96];
    human(a1, sizeof a1, all);
    human(a2, sizeof a2, lazy);
    mem_now(av, sizeof av, rt->ctx);
    fprintf(out, "\nmemory (batch %lld; %s)\n  weights (float32)      %s every layer loaded, %s one layer at a time (--lazy)\n",
           (long long)B, av, a1, a2);
    int64_t Ts[] = {256, 4096, 32768, 131072};
    for (int i = 0; i < 4; i++) {
        int64_t T = Ts[i];
        if (T > c->max_position_embeddings) break;
        char b1[32], b2[32], b3[32], b4[32];
        double act = (double)ps_v4_acts_bytes(c, B, T, 0), pat = (double)ps_v4_acts_bytes(c, B, T, 1) - act;
        human(b1, sizeof b1, act);
        human(b2, sizeof b2, act + all);
        human(b3, sizeof b3, act + lazy);
        human(b4, sizeof b4, pat);
        fprintf(out, "  forward T = %-7lld   activations %s; total %s (%s with --lazy); a bias/logits/pattern hook adds %s\n",
               (long long)T, b1, b2, b3, b4);
    }
    return 0;
}

static int v4_load_weights(ps_runtime *rt, int lazy, ps_error *err) {
    ps_v4_model *m = v4_of(rt);
    int device = m->backend[0] && strcmp(m->backend, "cpu");
    if (device && lazy > 0) {
        ps_fail(err, "--lazy: layers loaded one at a time run on the cpu backend (--backend %s needs every layer in memory)",
                m->backend);
        err->usage = 1;
        return -1;
    }
    if (lazy < 0) {
        double avail = (double)ps_mem_available();
        lazy = !device && avail > 0 && rt->weight_bytes > 0.5 * avail;
    }
    if (ps_v4_model_load_weights(m, lazy, err) || (device && ps_v4_model_to_backend(m, m->backend, err))) return -1;
    rt->lazy = m->lazy;
    rt->ctx = m->ctx;
    return 0;
}

const ps_family ps_family_v4 = {
    .name = "deepseek_v4",
    .kvcache = &ps_v4_kvcache_ops,
    .model_size = sizeof(ps_v4_model),
    .detect = v4_detect,
    .open = v4_open,
    .free_model = v4_free,
    .acts_bytes = v4_acts_bytes,
    .acts_create = v4_acts_create,
    .acts_free = v4_acts_free,
    .forward = v4_forward,
    .logits = v4_logits,
    .restart = NULL,
    .score = v4_score,
    .rows = v4_rows,
    .points = V4_POINTS,
    .n_points = (int)(sizeof V4_POINTS / sizeof V4_POINTS[0]),
    .hook_family = &ps_v4_hook_family,
    .point_shape = v4_point_shape,
    .hook_add = v4_hook_add,
    .hook_add_action = v4_hook_add_action,
    .cache_watch = v4_cache_watch,
    .hook_parse = v4_hook_parse,
    .config_json = v4_config_json,
    .config_hash = v4_config_hash,
    .step = v4_step,
    .default_period = v4_period,
    .vocab = v4_vocab,
    .meta = v4_meta,
    .save = NULL,
    .max_pos_name = "max_position_embeddings",
    .load_weights = v4_load_weights,
    .describe = v4_describe,
    .early_stop = 1,
    .describe_config = ps_v4_describe_config,
    .kinds = ps_v4_attention_kinds,
    .title = "DeepSeek-V4",
    .task_file = 1,
    .ko_targets = ps_v4_ko_targets,
    .ko_heads_what = "query heads",
    .ko_default = ps_v4_ko_default,
    .ko_heads = ps_v4_ko_heads,
    .ko_unit = ps_v4_ko_unit,
    .ko_missing = ps_v4_ko_missing,
    .ko_arrays = ps_v4_ko_arrays,
    .ko_mean = ps_v4_ko_mean,
    .cycle_check = ps_v4_cycle_check,
    .cycle = ps_v4_cycle,
    .cycle_meta = ps_v4_cycle_meta,
    .gates = ps_v4_gates,
    .gate_taps = ps_v4_gate_taps,
};

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
