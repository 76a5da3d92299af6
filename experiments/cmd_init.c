/* cmd_init.c — `phasescope init`: write a freshly initialised checkpoint for a config (the starting
 * point of training, and a model to try the other commands on). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "fileio.h"
#include "model.h"
#include "train.h"

static const char HELP[] =
    "usage: phasescope init --config CFG.json --out DIR [--seed N] [--format phasescope|hf] [--dtype f32|bf16|f16] [--shard-mb N]\n"
    "       phasescope init --from MODEL --out DIR [--format phasescope|hf] [--dtype f32|bf16|f16] [--shard-mb N]\n"
    "\n"
    "Writes DIR/config.json and DIR/model.safetensors with freshly initialised weights: norms 1,\n"
    "compressor gates 0 (uniform), embeddings and projections N(0, 0.02), o_proj and down_proj\n"
    "N(0, 0.02/sqrt(2·n_layers)), payloads N(0, 0.02). With --from, the weights and config of an\n"
    "existing checkpoint instead (any layout it loads: sharded, BF16, Hugging Face config): a converter.\n"
    "\n"
    "  --config FILE  a model config (the keys of config.json, docs/training.md) or a training config\n"
    "                 (`phasescope train --config`), whose \"model\" part is used\n"
    "  --from DIR     copy this checkpoint instead of initialising (docs/models.md)\n"
    "  --out DIR      checkpoint directory to write (created if missing)\n"
    "  --seed N       random seed (default 0)\n"
    "  --format F     config.json schema: phasescope (default) or hf (a Hugging Face Qwen3 config;\n"
    "                 a compressed model adds its \"attention\" object)\n"
    "  --dtype D      weight storage: f32 (default), bf16 or f16 (rounded to nearest even)\n"
    "  --shard-mb N   write shards of at most N MiB plus model.safetensors.index.json (default: one file)\n";

/* A model config, or a training config ({"model", "task", "train"}) whose "model" part is used: a file whose
 * top level is an object with a "model" key is read as a training config (and checked as one). */
static int load_config(const char *path, ps_config *cfg, ps_error *err) {
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
        if (!rc) *cfg = tc.model;
        ps_train_cfg_free(&tc);
    } else
        rc = ps_config_parse(text, len, path, cfg, err);
    free(text);
    return rc;
}

int ps_cmd_init(int argc, char **argv) {
    if (ps_cli_wants_help(argc, argv)) {
        fputs(HELP, stdout);
        return 0;
    }
    ps_flag flags[] = {PS_FLAG("--config", true), PS_FLAG("--out", true),   PS_FLAG("--seed", true),
                       PS_FLAG("--from", true),   PS_FLAG("--format", true), PS_FLAG("--dtype", true),
                       PS_FLAG("--shard-mb", true)};
    enum { NF = 7 };
    int npos;
    const char *pos[1];
    ps_error err = {0};
    ps_config cfg;
    ps_model m = {0};
    int64_t seed = 0;
    int rc = 1;
    ps_save_opts so = {0};
    int64_t shard_mb = 0;
    if (ps_cli_parse(argc, argv, flags, NF, pos, 0, &npos, &err)) goto done;
    if (ps_cli_require(flags, NF, &err, "--out", NULL)) goto done;
    if (!flags[0].value == !flags[3].value) {
        ps_cli_usage(&err, flags[0].value ? "--config and --from: give one of them, not both"
                                          : "--config or --from is required");
        goto done;
    }
    if (flags[3].value && flags[2].value) {
        ps_cli_usage(&err, "--seed: only with --config (--from copies the weights)");
        goto done;
    }
    if (flags[2].value && ps_cli_int("--seed", flags[2].value, 0, INT64_MAX, &seed, &err)) goto done;
    if (flags[4].value) {
        if (!strcmp(flags[4].value, "hf")) so.layout = PS_LAYOUT_HF;
        else if (strcmp(flags[4].value, "phasescope")) {
            ps_cli_usage(&err, "--format %s: expected phasescope or hf", flags[4].value);
            goto done;
        }
    }
    if (flags[5].value) {
        so.dtype_set = 1;
        if (!strcmp(flags[5].value, "f32")) so.dtype = PS_DT_F32;
        else if (!strcmp(flags[5].value, "bf16")) so.dtype = PS_DT_BF16;
        else if (!strcmp(flags[5].value, "f16")) so.dtype = PS_DT_F16;
        else {
            ps_cli_usage(&err, "--dtype %s: expected f32, bf16 or f16", flags[5].value);
            goto done;
        }
    }
    if (flags[6].value) {
        if (ps_cli_int("--shard-mb", flags[6].value, 1, 1 << 20, &shard_mb, &err)) goto done;
        so.max_shard_bytes = (uint64_t)shard_mb << 20;
    }
    if (flags[3].value) {
        char dir[4096];
        if (ps_cli_model_dir(flags[3].value, dir, sizeof dir, &err) || ps_model_load(&m, dir, &err)) goto done;
        if (ps_model_save_as(&m, flags[1].value, &so, &err)) goto done;
        printf("wrote %s (%lld parameters from %s)\n", flags[1].value, (long long)m.n_params, flags[3].value);
    } else {
        if (load_config(flags[0].value, &cfg, &err) || ps_model_create(&m, &cfg, &err)) goto done;
        ps_model_init(&m, (uint64_t)seed);
        char s[32];
        snprintf(s, sizeof s, "%lld", (long long)seed);
        if (ps_model_set_meta(&m, "init_seed", s, &err) || ps_model_save_as(&m, flags[1].value, &so, &err)) goto done;
        printf("wrote %s (%lld parameters, seed %lld)\n", flags[1].value, (long long)m.n_params, (long long)seed);
    }
    rc = 0;
done:
    if (rc) {
        fprintf(stderr, "phasescope init: %s\n", err.msg);
        rc = ps_cli_status(&err);
    }
    ps_model_free(&m);
    return rc;
}
