#include "instruments/instrument.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/cpu_env.h"
#include "scaleout/dist.h"
#include "core/fileio.h"
#include "viz/figures.h"
#include "viz/results_check.h"
#include "core/runtime.h"
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

/* ---- the prompts' task: the family's data says where it comes from (core/runtime.h: task_file) ----
 * The runtime owns the model (ps_runtime_open); the instruments add the task: the one a checkpoint stores
 * (the family's meta "phasescope.task"), or, for a family whose checkpoints carry none, a task file (--task
 * FILE or DIR/phasescope_task.json) whose ids map the task's tokens to the model's (rt.token_map), recorded in
 * provenance as "task_source". Everything else the instruments need of the model is its family's core table. */

static int has_flag(const ps_command *cmd, const char *name) {
    for (const ps_flag_spec *f = cmd->flags; f && f->name; f++)
        if (!strcmp(f->name, name)) return 1;
    return 0;
}

/* The caller's prompt set (ps_args.prompts, or the file --prompts names), checked against the opened model and
 * the period (--period, else the largest residue + 1), as in->prompts; 0 when there is none. */
static int setup_prompts(ps_instr *in, const ps_args *a, ps_error *err) {
    const char *file = has_flag(a->cmd, "--prompts") ? ps_args_get(a, "--prompts") : NULL;
    if (!a->prompts && !file) return 0;
    if (a->prompts) in->pset = *a->prompts;
    else if (ps_promptset_read(file, &in->pset, err)) return ps_fail_prefix(err, "--prompts: "), ps_cli_mark_usage(err);
    else in->own_pset = 1;
    int64_t P = ps_args_get(a, "--period") ? in->P : 0;
    if (ps_promptset_check(&in->pset, in->rt.family->vocab(&in->rt), in->rt.max_pos, &P, err)) return ps_cli_mark_usage(err);
    in->P = P;
    in->n_prompts = in->pset.N;
    if (ps_promptset_shifted(&in->pset, P, &in->pshift, err)) return -1;
    in->prompts = &in->pshift;
    return 0;
}

int ps_instr_setup(ps_instr *in, const ps_args *a, int need_task, ps_error *err) {
    in->command = a->cmd->name;
    in->backend = ps_args_backend(a);
    in->progress = a->progress;
    in->progress_user = a->progress_user;
    in->cmdline = command_line_unsharded(a);
    in->shard = 0;
    in->n_shards = 1;
    const char *sh = ps_args_get(a, "--shard");
    if (sh && parse_shard(sh, &in->shard, &in->n_shards, err)) return -1;
    in->n_prompts = 256;
    in->batch = 32;
    in->seed = 0;
    const char *task_flag = ps_args_get(a, "--task");
    ps_error dir_err = {0};
    int bad_dir = ps_cli_model_dir(ps_args_get(a, "--model"), in->model_dir, sizeof in->model_dir, &dir_err);
    const ps_family *fam = a->rt ? a->rt->family : ps_runtime_detect_in(a->families, bad_dir ? "" : in->model_dir);
    int task_file = fam->task_file;
    /* the cheap refusal first: a task file for a family that carries its task */
    if (!task_file && task_flag && strcmp(task_flag, "model") && strcmp(task_flag, "text-kv"))
        return ps_cli_usage(err, "--task %s: a task file applies to DeepSeek-V4 checkpoints (a phasescope model carries the task it was trained on)",
                            task_flag);
    if (task_file && task_flag && (!strcmp(task_flag, "model") || !strcmp(task_flag, "text-kv")))
        return ps_cli_usage(err, "--task %s: a %s checkpoint takes its prompts from a task file (--task FILE.json); %s needs a "
                                 "phasescope model",
                            task_flag, fam->name, !strcmp(task_flag, "text-kv") ? "the text-kv sweep" : "a stored task");
    if (bad_dir) {
        *err = dir_err;
        return -1;
    }
    if (ps_instr_open(in, a, err)) return -1;
    if (in->rt.lazy && !in->borrowed)
        fprintf(stderr, "phasescope %s: the weights (%.1f GB as float32) are loaded one layer at a time\n", in->command,
                in->rt.weight_bytes / 1e9);
    in->P = ps_runtime_default_period(&in->rt);
    int64_t seed = 0;
    if (ps_args_int(a, "--period", 1, PS_RESULT_MAX_PERIOD, &in->P, err) ||
        ps_args_int(a, "--n", 1, PS_RESULT_MAX_PROMPTS, &in->n_prompts, err) ||
        ps_args_int(a, "--seed", 0, INT64_MAX, &seed, err) || ps_args_int(a, "--batch", 1, 1 << 16, &in->batch, err))
        return -1;
    in->seed = (uint64_t)seed;
    const char *out = ps_args_get(a, "--out"), *family = ps_args_get(a, "--family");
    if (out) snprintf(in->out_dir, sizeof in->out_dir, "%s", out);
    else snprintf(in->out_dir, sizeof in->out_dir, "out/%s", in->command);
    in->out = (ps_out){.dir = in->out_dir, .sink = a->sink};
    in->bar.silent = a->sink != NULL;
    if (ps_fillers_load(PS_SOURCE_DIR "/data/fillers.json", &in->fams, &in->n_fams, err) ||
        ps_fillers_find(in->fams, in->n_fams, family, &in->fam, err))
        return in->fams && family ? ps_cli_mark_usage(err) : -1;
    if (setup_prompts(in, a, err)) return -1;
    if (in->prompts) { /* the caller's prompts, in the model's own token ids: no task, no shifts */
        if (task_flag) return ps_cli_usage(err, "--task %s and --prompts: give one source of prompts", task_flag);
        if (family) return ps_cli_usage(err, "--family %s: a prompt set has no fillers (its prompts are as given)", family);
        ps_progress_init(&in->bar, (int64_t)1 << 40);
        return 0;
    }
    if (task_file) { /* the prompts always come from the task file */
        need_task = 1;
        if (ps_task_file_load(&in->task_file, task_flag, in->model_dir, in->rt.family->title ? in->rt.family->title : in->rt.family->name,
                              in->rt.family->vocab(&in->rt), in->rt.max_pos, err)) {
            if (task_flag) ps_fail_prefix(err, "--task: ");
            return -1;
        }
        in->has_task_file = 1;
        in->task = in->task_file.task;
        in->rt.token_map = in->task_file.ids;
        in->rt.n_token_map = in->task_file.n_ids;
    } else if (need_task && ps_runtime_task(&in->rt, in->model_dir, &in->task, err))
        return -1;
    if (!need_task) return 0;
    if (ps_batch_alloc(&in->base, in->n_prompts, in->task.seq_len, in->task.n_queries, err)) return -1;
    if (ps_task_generate(&in->task, in->seed ^ 0xe7a1ULL, &in->base, err)) return -1;
    ps_progress_init(&in->bar, (int64_t)1 << 40); /* plain mode: only the final line */
    return 0;
}

int ps_instr_open(ps_instr *in, const ps_args *a, ps_error *err) {
    if (a->rt) { /* the caller's: the instrument's own fields (token_map) go into the copy */
        in->rt = *a->rt;
        in->rt.token_map = NULL;
        in->rt.n_token_map = 0;
        in->rt.owns_model = 0;
        in->borrowed = 1;
        return 0;
    }
    ps_runtime_opts ro = {.backend = in->backend, .weights = 1, .lazy = -1};
    return ps_runtime_open_in(&in->rt, a->families, in->model_dir, &ro, err);
}

void ps_instr_free(ps_instr *in) {
    ps_shifted_free(&in->pshift);
    if (in->own_pset) ps_promptset_free(&in->pset);
    free(in->cmdline);
    free(in->fams);
    ps_batch_free(&in->base);
    if (in->rt.family) {
        if (in->has_task_file) ps_task_file_free(&in->task_file);
        if (in->borrowed) memset(&in->rt, 0, sizeof in->rt);
        else ps_runtime_free(&in->rt);
    } else /* a command that loaded `m` itself (fillers, sweep --task text-kv) */
        ps_model_free(&in->m);
}

json_t *ps_instr_provenance(const ps_instr *in, const char *mode) {
    json_t *o = json_object(), *ev = json_object();
    /* the runtime of the opened checkpoint, or of the model a command loaded itself */
    ps_runtime own;
    const ps_runtime *rt = &in->rt;
    if (!rt->family) {
        ps_runtime_wrap_model(&own, &in->m);
        rt = &own;
    }
    char hash[17] = "";
    rt->family->config_hash(rt, hash);
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
    int64_t step = rt->family->step(rt);
    if (step >= 0) json_object_set_new(o, "model_step", json_integer(step));
    json_object_set_new(o, "config", rt->family->config_json(rt));
    ps_model_desc md; /* the display label and attention kind, as core's family words them */
    ps_error de;
    if (!ps_runtime_desc(rt, &md, &de)) {
        json_object_set_new(o, "label", json_string(md.label));
        json_object_set_new(o, "kind", json_string(md.kind));
    }
    if (in->base.B) json_object_set_new(o, "task", ps_task_to_json(&in->task));
    if (in->has_task_file) json_object_set_new(o, "task_source", ps_task_file_source_json(&in->task_file));
    json_object_set_new(ev, "n_prompts", json_integer(in->n_prompts));
    json_object_set_new(ev, "period", json_integer(in->P));
    if (in->prompts) json_object_set_new(ev, "prompts", ps_promptset_json(&in->pset));
    else {
        json_object_set_new(ev, "family", json_string(in->fam ? in->fam->name : ""));
        if (mode) json_object_set_new(ev, "mode", json_string(mode));
    }
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
    return ps_result_write(&in->out, name, result, err);
}

void ps_say(const ps_out *o, const char *fmt, ...) {
    if (o && o->sink) return;
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
}

char *ps_result_text(json_t *result) { return json_dumps(result, JSON_INDENT(1) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10)); }

int ps_result_keep(ps_result_sink *s, const char *name, json_t *result, size_t precision_flag, ps_error *err) {
    char *text = json_dumps(result, JSON_INDENT(1) | JSON_PRESERVE_ORDER | precision_flag);
    if (!text) return ps_fail(err, "%s: cannot serialise the result", name);
    if (!s->docs) s->docs = json_object();
    int bad = !s->docs || json_object_set_new(s->docs, name, json_string(text));
    free(text);
    return bad ? ps_fail(err, "%s: out of memory", name) : 0;
}

void ps_result_sink_free(ps_result_sink *s) {
    json_decref(s->docs);
    s->docs = NULL;
}

int ps_result_write(const ps_out *out, const char *name, json_t *result, ps_error *err) {
    char path[4200];
    if (out->sink) { /* a library call: validated, kept in memory */
        snprintf(path, sizeof path, "%s", name);
        if (ps_results_check(result, path, err)) return ps_fail_prefix(err, "internal error: the result does not validate: ");
        return ps_result_keep(out->sink, name, result, JSON_REAL_PRECISION(10), err);
    }
    /* create out/COMMAND and its parent */
    char dir[4096];
    if (make_dirs(out->dir, dir, sizeof dir, err)) return -1;
    if (ps_path_join(path, sizeof path, dir, name, err)) return -1;
    /* what a command writes must pass the reader's validator (writers and validator kept in step) */
    if (ps_results_check(result, path, err)) return ps_fail_prefix(err, "internal error: the result does not validate: ");
    char *text = ps_result_text(result);
    if (!text) return ps_fail(err, "%s: cannot serialise the result", path);
    int rc = ps_write_file_atomic(path, text, strlen(text), err);
    free(text);
    if (rc) return -1;
    printf("wrote %s\n", path);
    /* the figures are drawn from the file just written, exactly as `phasescope render` would */
    const char *paths[1] = {path};
    return ps_render(paths, 1, dir, NULL, 1, err);
}

int ps_instr_progress(int64_t done, int64_t total, void *user) {
    ps_instr *in = user;
    if (ps_dist_rank() == 0 && !in->out.sink) ps_progress_update(&in->bar, done, total, in->command);
    return in->progress ? in->progress(done, total, in->progress_user) : 0;
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
    ps_say(&in->out, "wrote %s (shard %d of %d: work units %lld-%lld of %lld; combine the %d parts with phasescope merge)\n", path,
           in->shard, in->n_shards, (long long)p->u0, (long long)p->u1 - 1, (long long)p->n_units, in->n_shards);
    return 0;
}

