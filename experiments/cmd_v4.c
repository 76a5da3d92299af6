/* cmd_v4.c — `phasescope info` and `phasescope forward` on DeepSeek-V4 checkpoints (SPEC-v4.md): info
 * reads the config and every tensor header (no weights) and estimates the memory of a forward; forward
 * runs each sequence on its own and writes logits.{i} and {hook}.{i} (batch axis dropped), with the V4
 * hook names of docs/hooks.md. */
#define _POSIX_C_SOURCE 200809L
#include "experiments/cmd_v4.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "experiments/cli.h"
#include "experiments/tensor_list.h"
#include "core/fileio.h"
#include "core/hooks.h"
#include "core/safetensors.h"
#include "core/tokens.h"
#include "core/v4/v4_config.h"
#include "core/v4/v4_forward.h"
#include "core/v4/v4_hooks.h"
#include "core/v4/v4_model.h"

static void human(char *buf, size_t n, double bytes) {
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (bytes >= 1024 && i < 4) {
        bytes /= 1024;
        i++;
    }
    snprintf(buf, n, i ? "%.2f %s" : "%.0f %s", bytes, u[i]);
}

/* usage: phasescope info --model DIR [--batch B]
 *
 * For a DeepSeek-V4 checkpoint: the config (either form), the layer schedule, parameter counts by
 * group (float32 after dequantisation), what the checkpoint stores (BF16/F32, FP8, FP4, scales), and
 * the memory of a forward pass of B sequences at a few lengths, with every layer loaded or one at a
 * time (forward --lazy). Reads tensor headers only, no weights. */

int ps_v4_cmd_info(const char *dir, int64_t B, ps_error *err) {
    ps_v4_model m;
    if (ps_v4_model_open(&m, dir, err)) return -1;
    const ps_v4_config *c = &m.cfg;
    printf("model       %s\n", dir);
    printf("kind        DeepSeek-V4 (%s tensor names, %s; config keys: %s)\n",
           m.names == PS_V4_NAMES_HF ? "transformers'" : "DeepSeek's", m.files.sharded ? "sharded" : "one file",
           c->config_form == 3 ? "HF and hub (HF win)" : c->config_form == 1 ? "HF" : c->config_form == 2 ? "hub" : "defaults");
    printf("config      vocab %lld, hidden %lld, %lld layers, %lld heads x %lld (rope %lld), q_lora %lld, o_groups %lld x %lld,\n"
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
        printf("rope %-8s theta %g", i ? "compress" : "main", rp[i]->theta);
        if (rp[i]->yarn)
            printf(", YaRN factor %g, original %g, beta %g/%g, attention factor %g", rp[i]->factor, rp[i]->original_max,
                   rp[i]->beta_fast, rp[i]->beta_slow, rp[i]->attention_factor);
        printf("\n");
    }
    printf("layers     ");
    for (int l = 0; l < c->n_layers; l++)
        printf("%s %d:%s%s%s", l && l % 8 == 0 ? "\n           " : "", l,
               c->attn_type[l] == PS_V4_SLIDING ? "S" : c->attn_type[l] == PS_V4_CSA ? "C" : "H",
               c->attn_type[l] == PS_V4_SLIDING ? "" : "", c->mlp_type[l] == PS_V4_HASH_MOE ? "h" : "");
    printf("\n            (S sliding, C CSA, H HCA; h hash routing; rates:");
    for (int l = 0; l < c->n_layers; l++)
        if (c->attn_type[l] != PS_V4_SLIDING) printf(" %d:%lld", l, (long long)c->compress_rate[l]);
    printf(")\n");
    /* parameters by group */
    const char *groups[] = {"embedding + head", "attention", "compressor + indexer", "mHC", "router", "routed experts",
                            "shared experts", "norms"};
    int64_t cnt[8] = {0};
    for (int t = 0; t < m.n_tensors; t++) {
        const ps_v4_tensor *x = &m.table[t];
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
    printf("\nparameters  %lld total (float32 after dequantisation)\n", (long long)m.n_params);
    for (int g = 0; g < 8; g++)
        if (cnt[g]) printf("  %-22s %14lld  (%.1f%%)\n", groups[g], (long long)cnt[g], 100.0 * (double)cnt[g] / (double)m.n_params);
    const char *cls[] = {"F32 / BF16 / F16", "FP8 e4m3", "FP4 e2m1", "integer", "block scales", "other"};
    printf("\nstorage (what the checkpoint holds)\n");
    char hb[32];
    for (int i = 0; i < 6; i++)
        if (m.storage.n_tensors[i]) {
            human(hb, sizeof hb, (double)m.storage.bytes[i]);
            printf("  %-22s %8lld tensors  %s\n", cls[i], (long long)m.storage.n_tensors[i], hb);
        }
    /* memory */
    int64_t big = 0;
    for (int l = 0; l < c->n_layers; l++)
        if (m.layer_floats[l] > big) big = m.layer_floats[l];
    double all = (double)m.n_params * 4, lazy = ((double)m.global_floats + (double)big) * 4;
    char a1[32], a2[32], av[32];
    human(a1, sizeof a1, all);
    human(a2, sizeof a2, lazy);
    human(av, sizeof av, (double)ps_mem_available());
    printf("\nmemory (batch %lld; %s available now)\n  weights (float32)      %s every layer loaded, %s one layer at a time (--lazy)\n",
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
        printf("  forward T = %-7lld   activations %s; total %s (%s with --lazy); a bias/logits/pattern hook adds %s\n",
               (long long)T, b1, b2, b3, b4);
    }
    ps_v4_model_free(&m);
    return 0;
}

/* ---- forward ---- */

/* usage: phasescope forward --model DIR --tokens T.json [--hooks NAMES] [--layers 0..L] [--lazy] --out OUT.safetensors
 *
 * For a DeepSeek-V4 checkpoint: runs every sequence of T.json on its own and writes logits.{i} [T_i, vocab]
 * and, for each hook in NAMES (comma-separated V4 names, e.g. layers.1.attn.pattern,layers.0.ffn.experts,
 * final_hidden; see docs/hooks.md), {hook}.{i} with the batch dimension dropped. Integer hooks (indexer.topk,
 * ffn.experts) are written as float32 (-1 = empty).
 *
 *   --layers 0..L   run layers 0 to L only (no logits then; hooks past L are refused)
 *   --lazy          load each layer when it runs and drop it after (memory: one layer's weights) */

/* "0..L" (or "L"): the number of layers to run. */
static int parse_layers(const char *v, int64_t n_layers, int *n_run, ps_error *err) {
    const char *p = v;
    char *end;
    if (!strncmp(p, "0..", 3)) p += 3;
    else if (strstr(v, "..")) return ps_cli_usage(err, "--layers %s: must start at 0 (layers run from the embedding up)", v);
    long hi = strtol(p, &end, 10);
    if (end == p || *end) return ps_cli_usage(err, "--layers %s: expected 0..L", v);
    if (hi < 0 || hi >= n_layers)
        return ps_cli_usage(err, "--layers %s: %ld is out of range [0, %lld] (the model has %lld layers)", v, hi,
                            (long long)n_layers - 1, (long long)n_layers);
    *n_run = (int)hi + 1;
    return 0;
}

int ps_v4_cmd_forward(const char *dir, const char *tokens, const char *hook_names, const char *out_path,
                      const char *layers, int lazy, ps_error *err) {
    int n_run = -1, rc = -1;
    ps_v4_model m;
    memset(&m, 0, sizeof m);
    ps_token_lists toks = {0};
    ps_hooks hooks;
    ps_cache cache;
    ps_tensor_list out = {0};
    ps_hooks_init(&hooks);
    ps_cache_init(&cache);
    char *names = NULL;
    if (ps_v4_model_open(&m, dir, err)) goto done;
    if (layers && parse_layers(layers, m.cfg.n_layers, &n_run, err)) goto done;
    if (hook_names) {
        names = strdup(hook_names);
        for (char *save = NULL, *h = strtok_r(names, ",", &save); h; h = strtok_r(NULL, ",", &save)) {
            int slot;
            ps_v4_hook_point pt;
            if (ps_v4_hook_parse(&m.cfg, h, &slot, &pt, err) || ps_v4_cache_watch(&cache, &hooks, &m.cfg, h, err)) {
                ps_fail_prefix(err, "--hooks: ");
                ps_cli_mark_usage(err);
                goto done;
            }
            if (n_run >= 0 && ((slot < m.cfg.n_layers && slot >= n_run) || (slot == m.cfg.n_layers && pt != PS_V4H_EMBED))) {
                ps_cli_usage(err, "--hooks: hook \"%s\" is past --layers %s (layers 0..%d run)", h, layers, n_run - 1);
                goto done;
            }
        }
    }
    if (ps_tokens_load(tokens, 0, 0, &toks, err)) goto done;
    for (int i = 0; i < toks.n; i++)
        if (toks.len[i] > m.cfg.max_position_embeddings) {
            ps_fail(err, "%s: sequence %d has %lld tokens, more than max_position_embeddings %lld by %lld", tokens, i,
                    (long long)toks.len[i], (long long)m.cfg.max_position_embeddings,
                    (long long)(toks.len[i] - m.cfg.max_position_embeddings));
            goto done;
        }
    if (ps_v4_model_load_weights(&m, lazy, err)) goto done;
    for (int i = 0; i < toks.n; i++) {
        ps_v4_acts a;
        if (ps_v4_acts_create(&a, &m, 1, toks.len[i], err)) goto done;
        if (ps_v4_forward(&m, &a, toks.seq[i], &hooks, n_run, err)) {
            ps_fail_prefix(err, "%s: sequence %d: ", tokens, i);
            ps_v4_acts_free(&a);
            goto done;
        }
        char name[160];
        int bad = 0;
        if (n_run < 0) {
            snprintf(name, sizeof name, "logits.%d", i);
            int64_t shp[2] = {toks.len[i], m.cfg.vocab_size};
            const float *lg = ps_v4_logits_host(&a, err);
            bad = !lg || ps_tensor_list_push(&out, name, 2, shp, lg, err);
        }
        ps_v4_acts_free(&a);
        if (bad) goto done;
        for (int k = 0; k < cache.n; k++) {
            const ps_cache_item *it = cache.items[k];
            snprintf(name, sizeof name, "%s.%d", it->name, i);
            if (ps_tensor_list_push(&out, name, it->ndim - 1, it->shape + 1, it->data, err)) goto done;
        }
    }
    if (ps_st_save(out_path, out.t, out.n, NULL, NULL, 0, err)) goto done;
    printf("wrote %d tensors for %d sequences to %s\n", out.n, toks.n, out_path);
    rc = 0;
done:
    free(names);
    ps_tensor_list_free(&out);
    ps_cache_free(&cache);
    ps_hooks_free(&hooks);
    ps_tokens_free(&toks);
    ps_v4_model_free(&m);
    return rc;
}
