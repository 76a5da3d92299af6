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
    "usage: phasescope init --config CFG.json --out DIR [--seed N]\n"
    "\n"
    "Writes DIR/config.json and DIR/model.safetensors with freshly initialised weights: norms 1,\n"
    "compressor gates 0 (uniform), embeddings and projections N(0, 0.02), o_proj and down_proj\n"
    "N(0, 0.02/sqrt(2·n_layers)), payloads N(0, 0.02).\n"
    "\n"
    "  --config FILE  a model config (the keys of config.json, docs/training.md) or a training config\n"
    "                 (`phasescope train --config`), whose \"model\" part is used\n"
    "  --out DIR      checkpoint directory to write (created if missing)\n"
    "  --seed N       random seed (default 0)\n";

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
    ps_flag flags[] = {PS_FLAG("--config", true), PS_FLAG("--out", true), PS_FLAG("--seed", true)};
    int npos;
    const char *pos[1];
    ps_error err = {0};
    ps_config cfg;
    ps_model m = {0};
    int64_t seed = 0;
    int rc = 1;
    if (ps_cli_parse(argc, argv, flags, 3, pos, 0, &npos, &err)) goto done;
    if (ps_cli_require(flags, 3, &err, "--config", "--out", NULL)) goto done;
    if (flags[2].value && ps_cli_int("--seed", flags[2].value, 0, INT64_MAX, &seed, &err)) goto done;
    if (load_config(flags[0].value, &cfg, &err) || ps_model_create(&m, &cfg, &err)) goto done;
    ps_model_init(&m, (uint64_t)seed);
    char s[32];
    snprintf(s, sizeof s, "%lld", (long long)seed);
    if (ps_model_set_meta(&m, "init_seed", s, &err) || ps_model_save(&m, flags[1].value, &err)) goto done;
    printf("wrote %s (%lld parameters, seed %lld)\n", flags[1].value, (long long)m.n_params, (long long)seed);
    rc = 0;
done:
    if (rc) {
        fprintf(stderr, "phasescope init: %s\n", err.msg);
        rc = ps_cli_status(&err);
    }
    ps_model_free(&m);
    return rc;
}
