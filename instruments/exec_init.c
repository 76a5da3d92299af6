/* exec_init.c — the body of `phasescope init` (instruments/commands.h): writes a freshly initialised
 * checkpoint for a config (the starting point of training, and a model to try the other commands on), or
 * a copy of an existing checkpoint in another layout (a converter). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fileio.h"
#include "core/model.h"
#include "instruments/command.h"
#include "instruments/commands.h"
#include "train/train.h"

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

int ps_init_command(const ps_init_req *r, ps_error *err) {
    const char *config = r->config, *from = r->from, *out = r->out;
    ps_config cfg;
    ps_model m = {0};
    int64_t seed = r->seed;
    int rc = 1;
    ps_save_opts so = r->save;
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
