/* cmd_forward.c — `phasescope forward`: the export path (SPEC §7). Each sequence of T.json runs on its
 * own (batch of one); writes logits.{i} [T_i, vocab] and {hook}.{i} (batch dimension dropped). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "experiments/cli.h"
#include "experiments/tensor_list.h"
#include "experiments/cmd_v4.h"
#include "core/v4/v4_config.h"
#include "core/forward.h"
#include "core/hooks.h"
#include "core/model.h"
#include "core/safetensors.h"
#include "core/tokens.h"

static int run(const ps_args *args, ps_error *out_err);

static const ps_flag_spec FLAGS[] = {
    {"--model", "DIR", "checkpoint directory (config.json + model.safetensors); default: shipped model", 0},
    {"--tokens", "T.json", "token sequences", 1},
    {"--hooks", "NAMES", "hook points to export (see docs/hooks.md)", 0},
    {"--out", "OUT.safetensors", "output safetensors file (written atomically)", 1},
    {"--layers", "0..L", "DeepSeek-V4 only: run layers 0..L and stop (probes that stop early)", 0},
    {"--lazy", NULL, "DeepSeek-V4 only: load each layer's weights when it runs (models larger than memory)", 0},
    PS_BACKEND_FLAG,
    {0},
};

const ps_command ps_cmd_forward = {
    .name = "forward",
    .summary = "run token sequences; write logits and chosen hooks to safetensors",
    .description = "Runs every sequence of T.json (a JSON list of token-id lists) on its own and writes\n"
                   "logits.{i} [T_i, vocab] and, for each hook in NAMES (comma-separated, e.g.\n"
                   "blocks.1.attn.hook_q,blocks.0.hook_resid_post), {hook}.{i} with the batch dimension dropped.\n",
    .flags = FLAGS,
    .run = run,
};

/* err is this function's own (copied out on failure), so the calls below read as they always have */
static int run(const ps_args *args, ps_error *out_err) {
    const char *tokens = ps_args_get(args, "--tokens"), *hooks_flag = ps_args_get(args, "--hooks"),
               *out_path = ps_args_get(args, "--out");
    {
        /* a DeepSeek-V4 checkpoint: cmd_v4.c (SPEC-v4) */
        char vdir[4096], cpath[4200];
        ps_error verr = {0};
        if (ps_cli_model_dir(ps_args_get(args, "--model"), vdir, sizeof vdir, &verr) == 0) {
            snprintf(cpath, sizeof cpath, "%s/config.json", vdir);
            if (ps_v4_config_detect_file(cpath) == 1)
                return ps_v4_cmd_forward(vdir, tokens, hooks_flag, out_path, ps_args_get(args, "--layers"),
                                         ps_args_has(args, "--lazy"), out_err);
        }
    }
    ps_error err = {0};
    ps_model m = {0};
    ps_token_lists toks = {0};
    ps_hooks hooks;
    ps_cache cache;
    ps_tensor_list out = {0};
    ps_hooks_init(&hooks);
    ps_cache_init(&cache);
    int rc = 1;
    char dir[4096];
    char *names = NULL;
    if (ps_cli_model_dir(ps_args_get(args, "--model"), dir, sizeof dir, &err) || ps_model_load(&m, dir, &err) ||
        ps_model_to_backend(&m, ps_args_backend(args), &err))
        goto done;
    if (ps_tokens_load(tokens, 0, 0, &toks, &err)) goto done;
    if (hooks_flag) {
        names = strdup(hooks_flag);
        for (char *save = NULL, *h = strtok_r(names, ",", &save); h; h = strtok_r(NULL, ",", &save))
            if (ps_cache_watch(&cache, &hooks, &m.cfg, h, &err)) {
                ps_fail_prefix(&err, "--hooks: ");
                ps_cli_mark_usage(&err);
                goto done;
            }
    }
    for (int i = 0; i < toks.n; i++) {
        ps_acts a;
        if (toks.len[i] > m.cfg.max_seq_len) {
            ps_fail(&err, "%s: sequence %d has %lld tokens, more than max_seq_len %lld by %lld", tokens, i,
                    (long long)toks.len[i], (long long)m.cfg.max_seq_len, (long long)(toks.len[i] - m.cfg.max_seq_len));
            goto done;
        }
        if (ps_acts_create(&a, m.ctx, &m.cfg, 1, toks.len[i], false, &err)) goto done;
        if (ps_forward(&m, &a, toks.seq[i], &hooks, &err)) {
            ps_fail_prefix(&err, "%s: sequence %d: ", tokens, i);
            ps_acts_free(&a);
            goto done;
        }
        char name[160];
        snprintf(name, sizeof name, "logits.%d", i);
        int64_t shp[2] = {toks.len[i], m.cfg.vocab_size};
        int bad = ps_tensor_list_push(&out, name, 2, shp, a.p.logits, &err);
        ps_acts_free(&a);
        if (bad) goto done;
        for (int k = 0; k < cache.n; k++) {
            const ps_cache_item *it = cache.items[k];
            snprintf(name, sizeof name, "%s.%d", it->name, i);
            if (ps_tensor_list_push(&out, name, it->ndim - 1, it->shape + 1, it->data, &err)) goto done;
        }
    }
    if (ps_st_save(out_path, out.t, out.n, NULL, NULL, 0, &err)) goto done;
    printf("wrote %d tensors for %d sequences to %s\n", out.n, toks.n, out_path);
    rc = 0;
done:
    if (rc) *out_err = err;
    free(names);
    ps_tensor_list_free(&out);
    ps_cache_free(&cache);
    ps_hooks_free(&hooks);
    ps_tokens_free(&toks);
    ps_model_free(&m);
    return rc;
}
