#include "experiments/instrument.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/cpu_env.h"
#include "dist/dist.h"
#include "core/fileio.h"
#include "viz/figures.h"
#include "viz/results_check.h"
#include "core/v4/v4_config.h"
#include "tasks/tasks.h"

/* --shard I/N: 0 <= I < N */
static int parse_shard(const char *v, int *i, int *n, ps_error *err) {
    char *end;
    long a = strtol(v, &end, 10), b;
    if (end == v || *end != '/') return ps_cli_usage(err, "--shard %s: expected I/N, e.g. 0/4", v);
    const char *q = end + 1;
    b = strtol(q, &end, 10);
    if (end == q || *end) return ps_cli_usage(err, "--shard %s: expected I/N, e.g. 0/4", v);
    if (b < 1 || b > 1000000 || a < 0 || a >= b)
        return ps_cli_usage(err, "--shard %s: need 0 <= I < N <= 1000000 (shards are numbered from 0)", v);
    *i = (int)a;
    *n = (int)b;
    return 0;
}

/* The command line without --shard I/N: every shard of a run records the line one process would have. */
static char *command_line_unsharded(const ps_args *a) {
    size_t n = 1;
    for (int i = 0; i < a->argc; i++) n += strlen(a->argv[i]) + 1;
    char *s = malloc(n);
    if (!s) return NULL;
    s[0] = '\0';
    for (int i = 0; i < a->argc; i++) {
        if (i > 0 && !strcmp(a->argv[i], "--shard") && i + 1 < a->argc) {
            i++;
            continue;
        }
        if (i > 0 && !strncmp(a->argv[i], "--shard=", 8)) continue;
        if (s[0]) strcat(s, " ");
        strcat(s, a->argv[i]);
    }
    return s;
}

int ps_instr_is_v4(const ps_args *a) {
    char dir[4096], cpath[4200];
    ps_error e = {0};
    if (ps_cli_model_dir(ps_args_get(a, "--model"), dir, sizeof dir, &e)) return 0;
    snprintf(cpath, sizeof cpath, "%s/config.json", dir);
    return ps_v4_config_detect_file(cpath) == 1;
}

/* The default period of a DeepSeek-V4 checkpoint: the smallest compression rate of its compressed layers
 * (CSA's 4 in V4-Flash / V4-Pro). */
static int64_t v4_default_period(const ps_v4_config *c) {
    int64_t p = 0;
    for (int l = 0; l < c->n_layers; l++)
        if (c->attn_type[l] != PS_V4_SLIDING && (!p || c->compress_rate[l] < p)) p = c->compress_rate[l];
    return p ? p : 4;
}

/* A DeepSeek-V4 checkpoint: every layer in memory when the float32 weights take at most half of the memory
 * available, else one layer at a time (as forward --lazy); the task from --task or the directory. */
static int setup_v4(ps_instr *in, ps_error *err) {
    in->is_v4 = 1;
    if (strcmp(in->backend, "cpu"))
        return ps_cli_usage(err, "--backend %s: DeepSeek-V4 checkpoints run on the cpu backend", in->backend);
    if (ps_v4_model_open(&in->v4, in->model_dir, err)) return -1;
    in->v4_loaded = 1;
    double need = 4.0 * (double)in->v4.n_params, avail = (double)ps_mem_available();
    if (ps_v4_model_load_weights(&in->v4, avail > 0 && need > 0.5 * avail, err)) return -1;
    if (in->v4.lazy)
        fprintf(stderr, "phasescope %s: the weights (%.1f GB as float32) are loaded one layer at a time\n", in->command, need / 1e9);
    in->P = v4_default_period(&in->v4.cfg);
    char *text;
    size_t len;
    uint64_t h = 1469598103934665603ULL; /* provenance: FNV-1a 64 of config.json as stored */
    if (ps_read_file(in->v4.cpath, (size_t)16 << 20, &text, &len, err)) return -1;
    for (size_t i = 0; i < len; i++) h = (h ^ (unsigned char)text[i]) * 1099511628211ULL;
    free(text);
    snprintf(in->v4_hash, sizeof in->v4_hash, "%016llx", (unsigned long long)h);
    return 0;
}

int ps_instr_setup(ps_instr *in, const ps_args *a, int need_task, ps_error *err) {
    in->command = a->cmd->name;
    in->backend = ps_args_backend(a);
    in->cmdline = command_line_unsharded(a);
    in->shard = 0;
    in->n_shards = 1;
    const char *sh = ps_args_get(a, "--shard");
    if (sh && parse_shard(sh, &in->shard, &in->n_shards, err)) return -1;
    in->n_prompts = 256;
    in->batch = 32;
    in->seed = 0;
    const char *task_flag = ps_args_get(a, "--task");
    int v4 = ps_instr_is_v4(a);
    if (!v4 && task_flag && strcmp(task_flag, "model") && strcmp(task_flag, "text-kv"))
        return ps_cli_usage(err, "--task %s: a task file applies to DeepSeek-V4 checkpoints (a phasescope model carries the task it was trained on)",
                            task_flag);
    if (ps_cli_model_dir(ps_args_get(a, "--model"), in->model_dir, sizeof in->model_dir, err)) return -1;
    if (v4) {
        if (setup_v4(in, err)) return -1;
    } else {
        if (ps_model_load(&in->m, in->model_dir, err) || ps_model_to_backend(&in->m, in->backend, err)) return -1;
        const ps_config *c = &in->m.cfg;
        in->P = c->kind == PS_ATTN_COMPRESSED ? c->stride : c->kind == PS_ATTN_CHANNEL ? c->rate : 8;
        ps_runtime_model(&in->rt, &in->m);
    }
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
    if (v4) {
        const ps_v4_config *c = &in->v4.cfg;
        if (ps_v4_task_load(&in->v4_task, task_flag, in->model_dir, c->vocab_size, c->max_position_embeddings, err)) {
            if (task_flag) ps_fail_prefix(err, "--task: ");
            return -1;
        }
        in->task = in->v4_task.task;
        ps_v4_runtime(&in->rt, &in->v4, &in->v4_task);
    } else if (!need_task)
        return 0;
    else if (ps_model_task(&in->m, in->model_dir, &in->task, err))
        return -1;
    if (ps_batch_alloc(&in->base, in->n_prompts, in->task.seq_len, in->task.n_queries, err)) return -1;
    if (ps_task_generate(&in->task, in->seed ^ 0xe7a1ULL, &in->base, err)) return -1;
    ps_progress_init(&in->bar, (int64_t)1 << 40); /* plain mode: only the final line */
    return 0;
}

void ps_instr_free(ps_instr *in) {
    free(in->cmdline);
    free(in->fams);
    ps_batch_free(&in->base);
    if (in->is_v4) {
        ps_v4_task_free(&in->v4_task);
        if (in->v4_loaded) ps_v4_model_free(&in->v4);
    } else
        ps_model_free(&in->m);
}

/* provenance.config of a V4 checkpoint: the attention schedule the figures and the validator read */
static json_t *v4_config_json(const ps_v4_config *c) {
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

json_t *ps_instr_provenance(const ps_instr *in, const char *mode) {
    json_t *o = json_object(), *ev = json_object();
    char hash[17] = "";
    if (!in->is_v4) ps_config_hash(&in->m.cfg, hash);
    json_object_set_new(o, "command", json_string(in->cmdline ? in->cmdline : in->command));
    json_object_set_new(o, "model", json_string(in->model_dir));
    json_object_set_new(o, "config_hash", json_string(hash));
    json_object_set_new(o, "seed", json_integer((json_int_t)in->seed));
    json_object_set_new(o, "version", json_string(PS_VERSION));
    char compute[512];
    ps_cpu_env_describe(compute, sizeof compute);
    json_object_set_new(o, "backend", json_string(in->backend ? in->backend : PS_BACKEND_DEFAULT));
    if (ps_dist_size() > 1) { /* the numbers do not depend on the ranks; the provenance says how they ran */
        size_t l = strlen(compute);
        snprintf(compute + l, sizeof compute - l, "; %d MPI ranks", ps_dist_size());
    }
    json_object_set_new(o, "compute", json_string(compute));
    if (in->is_v4) {
        json_object_set_new(o, "config_hash", json_string(in->v4_hash));
        json_object_set_new(o, "config", v4_config_json(&in->v4.cfg));
        json_object_set_new(o, "task", ps_task_to_json(&in->task));
        json_object_set_new(o, "task_source", ps_v4_task_source_json(&in->v4_task));
    } else {
        const char *ms = ps_model_get_meta(&in->m, "phasescope.step");
        if (ms) json_object_set_new(o, "model_step", json_integer(strtoll(ms, NULL, 10)));
        char *cj = ps_config_to_json(&in->m.cfg);
        json_object_set_new(o, "config", json_loads(cj, 0, NULL));
        free(cj);
        if (in->base.B) json_object_set_new(o, "task", ps_task_to_json(&in->task));
    }
    json_object_set_new(ev, "n_prompts", json_integer(in->n_prompts));
    json_object_set_new(ev, "period", json_integer(in->P));
    json_object_set_new(ev, "family", json_string(in->fam ? in->fam->name : ""));
    if (mode) json_object_set_new(ev, "mode", json_string(mode));
    json_object_set_new(o, "eval", ev);
    return o;
}

/* mkdir -p */
static int make_dirs(const char *out_dir, char *dir, size_t n, ps_error *err) {
    snprintf(dir, n, "%s", out_dir);
    for (char *s = dir + 1; *s; s++)
        if (*s == '/') {
            *s = '\0';
            if (ps_mkdir(dir, err)) return -1;
            *s = '/';
        }
    return ps_mkdir(dir, err);
}

int ps_instr_write(const ps_instr *in, const char *name, json_t *result, ps_error *err) {
    return ps_result_write(in->out_dir, name, result, err);
}

int ps_result_write(const char *out_dir, const char *name, json_t *result, ps_error *err) {
    /* create out/COMMAND and its parent */
    char dir[4096];
    if (make_dirs(out_dir, dir, sizeof dir, err)) return -1;
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
    if (ps_dist_rank() == 0) ps_progress_update(&in->bar, done, total, in->command);
}

/* ---- splitting the work ---- */

int ps_instr_split(const ps_instr *in, const int64_t *w, const unsigned char *snap, int64_t n_units, int64_t penalty,
                   ps_instr_work *wk, ps_error *err) {
    int R = ps_dist_size();
    memset(wk, 0, sizeof *wk);
    wk->r0 = malloc((size_t)R * sizeof(int64_t));
    wk->r1 = malloc((size_t)R * sizeof(int64_t));
    if (!wk->r0 || !wk->r1) return ps_fail(err, "out of memory for the work split of %d ranks", R);
    int64_t s0, s1;
    ps_dist_split(w, snap, n_units, penalty, in->shard, in->n_shards, &s0, &s1);
    for (int r = 0; r < R; r++) {
        int64_t a, b;
        ps_dist_split(w + s0, snap ? snap + s0 : NULL, s1 - s0, penalty, r, R, &a, &b);
        wk->r0[r] = s0 + a;
        wk->r1[r] = s0 + b;
    }
    wk->u0 = wk->r0[ps_dist_rank()];
    wk->u1 = wk->r1[ps_dist_rank()];
    return 0;
}

void ps_instr_work_free(ps_instr_work *wk) {
    free(wk->r0);
    free(wk->r1);
    memset(wk, 0, sizeof *wk);
}

int ps_instr_partial_init(const ps_instr *in, ps_partial *p, int64_t n_units, json_t *meta, ps_error *err) {
    if (ps_partial_init(p, in->command, n_units, meta, err)) return -1;
    p->shard = in->shard;
    p->n_shards = in->n_shards;
    return 0;
}

int ps_instr_collect(const ps_instr *in, ps_partial *p, const ps_instr_work *wk, int rc_run, ps_error *err) {
    if (ps_dist_agree(rc_run, err) || ps_partial_gather(p, wk->r0, wk->r1, err)) return -1;
    if (ps_dist_rank() != 0) return 0;
    if (in->n_shards == 1) return 1;
    /* rank 0 of a shard: the part file */
    char dir[4096], name[128], path[4300];
    if (make_dirs(in->out_dir, dir, sizeof dir, err)) return -1;
    ps_partial_file_name(name, sizeof name, in->command, in->shard, in->n_shards);
    if (ps_path_join(path, sizeof path, dir, name, err) || ps_partial_write(p, path, err)) return -1;
    printf("wrote %s (shard %d of %d: work units %lld-%lld of %lld; combine the %d parts with phasescope merge)\n", path,
           in->shard, in->n_shards, (long long)p->u0, (long long)p->u1 - 1, (long long)p->n_units, in->n_shards);
    return 0;
}

/* ---- paths that run whole ---- */

int ps_instr_whole_begin(const ps_args *a, const char *what, ps_error *err) {
    if (ps_args_has(a, "--shard"))
        return ps_cli_usage(err, "--shard %s: %s is not split into work units; run it without --shard (under mpirun rank 0 runs it whole)",
                            ps_args_get(a, "--shard"), what);
    if (ps_dist_rank() != 0) return 0;
    if (ps_dist_size() > 1)
        fprintf(stderr, "phasescope %s: %s is not split into work units: rank 0 runs it whole, the other %d ranks wait\n",
                a->cmd->name, what, ps_dist_size() - 1);
    return 1;
}

int ps_instr_whole_end(int rc, ps_error *err) { return ps_dist_agree(rc, err); }
