/* cmd_init.c — `phasescope init`: write a freshly initialised checkpoint for a config (the starting
 * point of training, and a model to try the other commands on). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "experiments/cli.h"
#include "core/fileio.h"
#include "core/model.h"
#include "train/train.h"

static int run(const ps_args *a, ps_error *err);

static const ps_flag_spec FLAGS[] = {
    {"--config", "FILE",
     "a model config (the keys of config.json, docs/training.md) or a training config\n"
     "(`phasescope train --config`), whose \"model\" part is used",
     0},
    {"--from", "DIR", "copy this checkpoint instead of initialising (docs/models.md)", 0},
    {"--out", "DIR", "checkpoint directory to write (created if missing)", 1},
    {"--seed", "N", "random seed (default 0)", 0},
    {"--format", "F",
     "config.json schema: phasescope (default) or hf (a Hugging Face Qwen3 config;\n"
     "a compressed model adds its \"attention\" object)",
     0},
    {"--dtype", "D", "weight storage: f32 (default), bf16 or f16 (rounded to nearest even)", 0},
    {"--shard-mb", "N", "write shards of at most N MiB plus model.safetensors.index.json (default: one file)", 0},
    {0},
};

const ps_command ps_cmd_init = {
    .name = "init",
    .summary = "write a freshly initialised checkpoint for a config",
    .synopsis = "phasescope init --config CFG.json --out DIR [--seed N] [--format phasescope|hf] [--dtype f32|bf16|f16] [--shard-mb N]\n"
                "phasescope init --from MODEL --out DIR [--format phasescope|hf] [--dtype f32|bf16|f16] [--shard-mb N]\n",
    .description =
        "Writes DIR/config.json and DIR/model.safetensors with freshly initialised weights: norms 1,\n"
        "compressor gates 0 (uniform), embeddings and projections N(0, 0.02), o_proj and down_proj\n"
        "N(0, 0.02/sqrt(2·n_layers)), payloads N(0, 0.02). With --from, the weights and config of an\n"
        "existing checkpoint instead (any layout it loads: sharded, BF16, Hugging Face config): a converter.\n"
        "A training config's task is stored with the model (metadata phasescope.task), so the instruments\n"
        "evaluate the fresh model on it.\n",
    .flags = FLAGS,
    .run = run,
};

/* A model config, or a training config ({"model", "task", "train"}) whose "model" part is used: a file whose
 * top level is an object with a "model" key is read as a training config (and checked as one). */
static int load_config(const char *path, ps_config *cfg, char **task_json, ps_error *err) {
    *task_json = NULL;
    char *text;
    size_t len;
    if (ps_read_file(path, 1 << 24, &text, &len, err)) return -1;
    json_t *root = json_loadb(text, len, 0, NULL);
    int is_train = json_is_object(root) && json_object_get(root, "model");
    json_decref(root);
    int rc;
    if (is_train) {
        ps_train_cfg tc;
        memset(&tc, 0, sizeof tc);
        rc = ps_train_cfg_parse(text, len, path, &tc, err);
        if (!rc) {
            *cfg = tc.model;
            /* the task travels with the model, as training stores it, so the instruments can evaluate a
             * freshly initialised model on it */
            json_t *tj = ps_task_to_json(&tc.task);
            *task_json = tj ? json_dumps(tj, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
            json_decref(tj);
            if (!*task_json) rc = ps_fail(err, "out of memory for the task of %s", path);
        }
        ps_train_cfg_free(&tc);
    } else
        rc = ps_config_parse(text, len, path, cfg, err);
    free(text);
    return rc;
}

static int run(const ps_args *a, ps_error *err) {
    const char *config = ps_args_get(a, "--config"), *from = ps_args_get(a, "--from"), *out = ps_args_get(a, "--out");
    ps_config cfg;
    ps_model m = {0};
    int64_t seed = 0;
    int rc = 1;
    ps_save_opts so = {0};
    int64_t shard_mb = 0;
    static const char *const FORMATS[] = {"phasescope", "hf", NULL}, *const DTYPES[] = {"f32", "bf16", "f16", NULL};
    static const ps_dtype DTYPE_OF[] = {PS_DT_F32, PS_DT_BF16, PS_DT_F16};
    int fi = 0, di = -1;
    if (!config == !from) {
        ps_cli_usage(err, config ? "--config and --from: give one of them, not both" : "--config or --from is required");
        goto done;
    }
    if (from && ps_args_has(a, "--seed")) {
        ps_cli_usage(err, "--seed: only with --config (--from copies the weights)");
        goto done;
    }
    if (ps_args_int(a, "--seed", 0, INT64_MAX, &seed, err) || ps_args_choice(a, "--format", FORMATS, &fi, err) ||
        ps_args_choice(a, "--dtype", DTYPES, &di, err) || ps_args_int(a, "--shard-mb", 1, 1 << 20, &shard_mb, err))
        goto done;
    if (fi == 1) so.layout = PS_LAYOUT_HF;
    if (di >= 0) {
        so.dtype_set = 1;
        so.dtype = DTYPE_OF[di];
    }
    so.max_shard_bytes = (uint64_t)shard_mb << 20;
    if (from) {
        char dir[4096];
        if (ps_cli_model_dir(from, dir, sizeof dir, err) || ps_model_load(&m, dir, err)) goto done;
        if (ps_model_save_as(&m, out, &so, err)) goto done;
        printf("wrote %s (%lld parameters from %s)\n", out, (long long)m.n_params, from);
    } else {
        char *task = NULL;
        if (load_config(config, &cfg, &task, err) || ps_model_create(&m, &cfg, err)) {
            free(task);
            goto done;
        }
        ps_model_init(&m, (uint64_t)seed);
        char s[32];
        snprintf(s, sizeof s, "%lld", (long long)seed);
        int bad = ps_model_set_meta(&m, "init_seed", s, err) || (task && ps_model_set_meta(&m, "phasescope.task", task, err));
        free(task);
        if (bad || ps_model_save_as(&m, out, &so, err)) goto done;
        printf("wrote %s (%lld parameters, seed %lld)\n", out, (long long)m.n_params, (long long)seed);
    }
    rc = 0;
done:
    ps_model_free(&m);
    return rc;
}
