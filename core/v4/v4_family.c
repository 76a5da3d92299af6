/* v4_family.c — the DeepSeek-V4 family's table (core/runtime.h ps_family_v4): its hook points, open, activations
 * and forward, scoring and rows, hooks, provenance, description, and the instruments' entries (knockout targets:
 * core/ko_targets.c; gates: core/gate_records.c; gate cycling: core/v4/v4_cycle). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/cpu_env.h"
#include "core/cycle.h"
#include "core/family_entries.h"
#include "core/fileio.h"
#include "core/kvcache.h"
#include "core/runtime.h"
#include "core/v4/v4_config.h"
#include "core/v4/v4_forward.h"
#include "core/v4/v4_hooks.h"
#include "core/v4/v4_kvcache.h"
#include "core/v4/v4_model.h"

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
            ps_runtime_human_bytes(hb, sizeof hb, (double)m->storage.bytes[i]);
            fprintf(out, "  %-22s %8lld tensors  %s\n", cls[i], (long long)m->storage.n_tensors[i], hb);
        }
    /* the KV cache at inference (core/v4/v4_kvcache.h): per CSA/HCA layer one entry of Dh per m tokens, plus
     * the indexer's key of Di on CSA layers; fixed: the sliding window's raw rows and the open windows */
    double kv_tok = ps_v4_kvcache_bytes_per_token(c), kv_full = (double)c->n_layers * (double)c->head_dim * 4.0;
    char kf[32];
    ps_runtime_human_bytes(kf, sizeof kf, ps_v4_kvcache_fixed_bytes(c));
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
    ps_runtime_human_bytes(a1, sizeof a1, all);
    ps_runtime_human_bytes(a2, sizeof a2, lazy);
    ps_runtime_mem_now(av, sizeof av, rt->ctx);
    fprintf(out, "\nmemory (batch %lld; %s)\n  weights (float32)      %s every layer loaded, %s one layer at a time (--lazy)\n",
           (long long)B, av, a1, a2);
    int64_t Ts[] = {256, 4096, 32768, 131072};
    for (int i = 0; i < 4; i++) {
        int64_t T = Ts[i];
        if (T > c->max_position_embeddings) break;
        char b1[32], b2[32], b3[32], b4[32];
        double act = (double)ps_v4_acts_bytes(c, B, T, 0), pat = (double)ps_v4_acts_bytes(c, B, T, 1) - act;
        ps_runtime_human_bytes(b1, sizeof b1, act);
        ps_runtime_human_bytes(b2, sizeof b2, act + all);
        ps_runtime_human_bytes(b3, sizeof b3, act + lazy);
        ps_runtime_human_bytes(b4, sizeof b4, pat);
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
    .ko.targets = ps_v4_ko_targets,
    .ko.heads_what = "query heads",
    .ko.default_target = ps_v4_ko_default,
    .ko.heads = ps_v4_ko_heads,
    .ko.unit = ps_v4_ko_unit,
    .ko.missing = ps_v4_ko_missing,
    .ko.arrays = ps_v4_ko_arrays,
    .ko.mean = ps_v4_ko_mean,
    .cycle.check = ps_v4_cycle_check,
    .cycle.roll = ps_v4_cycle,
    .cycle.meta = ps_v4_cycle_meta,
    .gates.info = ps_v4_gates,
    .gates.taps = ps_v4_gate_taps,
};

