/* cmd_forward.c — `phasescope forward`: the export path (SPEC §7), for every family through its runtime
 * (core/runtime.h): each sequence of T.json runs on its own (batch of one); writes logits.{i} [T_i, vocab]
 * and {hook}.{i} (batch dimension dropped), the hook names checked against the family's point table
 * (docs/hooks.md; `phasescope info` lists them). DeepSeek-V4 checkpoints also take --layers 0..L (stop
 * early: no logits, hooks past L refused) and --lazy (one layer's weights in memory at a time). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "experiments/cli.h"
#include "experiments/tensor_list.h"
#include "core/hooks.h"
#include "core/runtime.h"
#include "core/safetensors.h"
#include "core/tokens.h"

static int run(const ps_args *args, ps_error *err);

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

/* Whether hook `name` (slot, point of the family's table) runs when only layers 0..n_run-1 do: a layer's
 * point on those layers, or a point of the model as a whole that the table lists before every layer's
 * (the table is in firing order: DeepSeek-V4's embed). */
static int runs_before(const ps_runtime *rt, int slot, int point, int n_run) {
    if (slot < rt->n_layers) return slot < n_run;
    const ps_family *f = rt->family;
    for (int i = 0; i < f->n_points; i++) {
        if (!ps_point_is_global(&f->points[i])) return 0; /* a layer's point comes first */
        if (f->points[i].point == point) return 1;
    }
    return 0;
}

static int run(const ps_args *args, ps_error *err) {
    const char *tokens = ps_args_get(args, "--tokens"), *hooks_flag = ps_args_get(args, "--hooks"),
               *out_path = ps_args_get(args, "--out"), *layers = ps_args_get(args, "--layers");
    int lazy = ps_args_has(args, "--lazy"), n_run = -1, rc = -1;
    ps_runtime rt;
    memset(&rt, 0, sizeof rt);
    ps_token_lists toks = {0};
    ps_hooks hooks;
    ps_cache cache;
    ps_tensor_list out = {0};
    ps_hooks_init(&hooks);
    ps_cache_init(&cache);
    char dir[4096], *names = NULL;
    /* the checkpoint through its family; weights after the flags, hooks and tokens are checked */
    ps_runtime_opts o = {.backend = ps_args_backend(args), .weights = 0, .lazy = lazy};
    if (ps_cli_model_dir(ps_args_get(args, "--model"), dir, sizeof dir, err) || ps_runtime_open(&rt, dir, &o, err)) goto done;
    const ps_family *f = rt.family;
    if (layers) {
        if (!f->early_stop) {
            ps_cli_usage(err, "--layers %s: %s checkpoints run every layer (--layers is for DeepSeek-V4 checkpoints)", layers, f->name);
            goto done;
        }
        if (parse_layers(layers, rt.n_layers, &n_run, err)) goto done;
    }
    if (lazy && !f->load_weights) {
        ps_cli_usage(err, "--lazy: %s checkpoints load every layer at once (--lazy is for DeepSeek-V4 checkpoints)", f->name);
        goto done;
    }
    if (hooks_flag) { /* names against the family's table (its parser lists the valid ones) */
        if (!(names = strdup(hooks_flag))) {
            ps_fail(err, "out of memory for the --hooks list");
            goto done;
        }
        for (char *save = NULL, *h = strtok_r(names, ",", &save); h; h = strtok_r(NULL, ",", &save)) {
            int slot, point;
            if (f->hook_parse(&rt, h, &slot, &point, err) || f->cache_watch(&rt, &cache, &hooks, h, err)) {
                ps_fail_prefix(err, "--hooks: ");
                ps_cli_mark_usage(err);
                goto done;
            }
            if (n_run >= 0 && !runs_before(&rt, slot, point, n_run)) {
                ps_cli_usage(err, "--hooks: hook \"%s\" is past --layers %s (layers 0..%d run)", h, layers, n_run - 1);
                goto done;
            }
        }
    }
    if (ps_tokens_load(tokens, 0, 0, &toks, err)) goto done;
    for (int i = 0; i < toks.n; i++)
        if (toks.len[i] > rt.max_pos) {
            ps_fail(err, "%s: sequence %d has %lld tokens, more than %s %lld by %lld", tokens, i, (long long)toks.len[i],
                    f->max_pos_name, (long long)rt.max_pos, (long long)(toks.len[i] - rt.max_pos));
            goto done;
        }
    if (f->load_weights && f->load_weights(&rt, lazy, err)) goto done;
    for (int i = 0; i < toks.n; i++) {
        void *a = f->acts_create(&rt, 1, toks.len[i], 0, err);
        if (!a) goto done;
        if (f->forward(&rt, a, toks.seq[i], &hooks, n_run, err)) {
            ps_fail_prefix(err, "%s: sequence %d: ", tokens, i);
            f->acts_free(a);
            goto done;
        }
        char name[160];
        int bad = 0;
        if (n_run < 0) {
            snprintf(name, sizeof name, "logits.%d", i);
            int64_t shp[2] = {toks.len[i], f->vocab(&rt)};
            const float *lg = f->logits(a, err);
            bad = !lg || ps_tensor_list_push(&out, name, 2, shp, lg, err);
        }
        f->acts_free(a);
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
    ps_runtime_free(&rt);
    return rc;
}
