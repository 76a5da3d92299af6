#include "instrument.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_env.h"
#include "fileio.h"
#include "figures.h"
#include "results_check.h"

int ps_instr_setup(ps_instr *in, const ps_args *a, int need_task, ps_error *err) {
    in->command = a->cmd->name;
    in->backend = ps_args_backend(a);
    in->cmdline = ps_args_command_line(a);
    in->n_prompts = 256;
    in->batch = 32;
    in->seed = 0;
    const char *task_flag = ps_args_get(a, "--task");
    if (task_flag && strcmp(task_flag, "model") && strcmp(task_flag, "text-kv"))
        return ps_cli_usage(err, "--task %s: a task file applies to DeepSeek-V4 checkpoints (a phasescope model carries the task it was trained on)",
                            task_flag);
    if (ps_cli_model_dir(ps_args_get(a, "--model"), in->model_dir, sizeof in->model_dir, err) ||
        ps_model_load(&in->m, in->model_dir, err) || ps_model_to_backend(&in->m, in->backend, err))
        return -1;
    const ps_config *c = &in->m.cfg;
    in->P = c->kind == PS_ATTN_COMPRESSED ? c->stride : c->kind == PS_ATTN_V4 ? c->rate : 8;
    int64_t seed = 0;
    if (ps_args_int(a, "--period", 1, PS_RESULT_MAX_PERIOD, &in->P, err) ||
        ps_args_int(a, "--n", 1, PS_RESULT_MAX_PROMPTS, &in->n_prompts, err) ||
        ps_args_int(a, "--seed", 0, INT64_MAX, &seed, err) || ps_args_int(a, "--batch", 1, 1 << 16, &in->batch, err))
        return -1;
    in->seed = (uint64_t)seed;
    const char *out = ps_args_get(a, "--out"), *family = ps_args_get(a, "--family");
    if (out) snprintf(in->out_dir, sizeof in->out_dir, "%s", out);
    else snprintf(in->out_dir, sizeof in->out_dir, "out/%s", in->command);
    if (ps_fillers_load(PS_SOURCE_DIR "/data/fillers.json", &in->fams, &in->n_fams, err) ||
        ps_fillers_find(in->fams, in->n_fams, family, &in->fam, err))
        return in->fams && family ? ps_cli_mark_usage(err) : -1;
    if (!need_task) return 0;
    if (ps_model_task(&in->m, in->model_dir, &in->task, err)) return -1;
    if (ps_batch_alloc(&in->base, in->n_prompts, in->task.seq_len, in->task.n_queries, err)) return -1;
    if (ps_task_generate(&in->task, in->seed ^ 0xe7a1ULL, &in->base, err)) return -1;
    ps_progress_init(&in->bar, (int64_t)1 << 40); /* plain mode: only the final line */
    return 0;
}

void ps_instr_free(ps_instr *in) {
    free(in->cmdline);
    free(in->fams);
    ps_batch_free(&in->base);
    ps_model_free(&in->m);
}

json_t *ps_instr_provenance(const ps_instr *in, const char *mode) {
    json_t *o = json_object(), *ev = json_object();
    char hash[17];
    ps_config_hash(&in->m.cfg, hash);
    json_object_set_new(o, "command", json_string(in->cmdline ? in->cmdline : in->command));
    json_object_set_new(o, "model", json_string(in->model_dir));
    json_object_set_new(o, "config_hash", json_string(hash));
    json_object_set_new(o, "seed", json_integer((json_int_t)in->seed));
    json_object_set_new(o, "version", json_string(PS_VERSION));
    char compute[512];
    ps_cpu_env_describe(compute, sizeof compute);
    json_object_set_new(o, "backend", json_string(in->backend ? in->backend : PS_BACKEND_DEFAULT));
    json_object_set_new(o, "compute", json_string(compute));
    const char *ms = ps_model_get_meta(&in->m, "phasescope.step");
    if (ms) json_object_set_new(o, "model_step", json_integer(strtoll(ms, NULL, 10)));
    char *cj = ps_config_to_json(&in->m.cfg);
    json_object_set_new(o, "config", json_loads(cj, 0, NULL));
    free(cj);
    if (in->base.B) json_object_set_new(o, "task", ps_task_to_json(&in->task));
    json_object_set_new(ev, "n_prompts", json_integer(in->n_prompts));
    json_object_set_new(ev, "period", json_integer(in->P));
    json_object_set_new(ev, "family", json_string(in->fam ? in->fam->name : ""));
    if (mode) json_object_set_new(ev, "mode", json_string(mode));
    json_object_set_new(o, "eval", ev);
    return o;
}

int ps_instr_write(const ps_instr *in, const char *name, json_t *result, ps_error *err) {
    /* create out/COMMAND and its parent */
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", in->out_dir);
    for (char *s = dir + 1; *s; s++)
        if (*s == '/') {
            *s = '\0';
            if (ps_mkdir(dir, err)) return -1;
            *s = '/';
        }
    if (ps_mkdir(dir, err)) return -1;
    char path[4200];
    if (ps_path_join(path, sizeof path, dir, name, err)) return -1;
    /* what a command writes must pass the reader's validator (writers and validator kept in step) */
    if (ps_results_check(result, path, err)) return ps_fail_prefix(err, "internal error: the result does not validate: ");
    char *text = json_dumps(result, JSON_INDENT(1) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10));
    if (!text) return ps_fail(err, "%s: cannot serialise the result", path);
    int rc = ps_write_file_atomic(path, text, strlen(text), err);
    free(text);
    if (rc) return -1;
    printf("wrote %s\n", path);
    /* the figures are drawn from the file just written, exactly as `phasescope render` would */
    const char *paths[1] = {path};
    return ps_render(paths, 1, dir, NULL, 1, err);
}

void ps_instr_progress(int64_t done, int64_t total, void *user) {
    ps_instr *in = user;
    ps_progress_update(&in->bar, done, total, in->command);
}
