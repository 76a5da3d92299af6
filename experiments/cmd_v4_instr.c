/* cmd_v4_instr.c — `phasescope sweep | knockout | gates | gatecycle` on DeepSeek-V4 checkpoints
 * (interventions/v4_instr.h). The commands' run functions hand over to these when --model names a
 * directory whose config.json is a DeepSeek-V4 config (ps_v4_instr_wanted); the flags are the commands'
 * own (PS_INSTR_FLAGS, with --task), read here by name. Results are the controlled models' files
 * (docs/results-schema.md) with a DeepSeek-V4 provenance config, validated and rendered alike. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "experiments/cli.h"
#include "experiments/cmd_v4.h"
#include "core/cpu_env.h"
#include "viz/draw.h"
#include "core/fileio.h"
#include "interventions/gatecycle.h"
#include "gates/gates.h"
#include "experiments/instrument.h"
#include "viz/results_check.h"
#include "interventions/stats.h"
#include "core/v4/v4_config.h"
#include "interventions/v4_instr.h"
#include "core/v4/v4_model.h"
#include "tasks/tasks.h"

int ps_v4_instr_wanted(const ps_args *a) {
    char dir[4096], cpath[4200];
    ps_error e = {0};
    if (ps_cli_model_dir(ps_args_get(a, "--model"), dir, sizeof dir, &e)) return 0;
    snprintf(cpath, sizeof cpath, "%s/config.json", dir);
    return ps_v4_config_detect_file(cpath) == 1;
}

typedef struct {
    const char *command;
    char *cmdline;
    char model_dir[4096], out_dir[4096];
    ps_v4_model m;
    int loaded;
    ps_v4_task task;
    ps_batch base;
    ps_filler_family *fams;
    int n_fams;
    const ps_filler_family *fam;
    int64_t P, n_prompts, batch;
    uint64_t seed;
    char config_hash[17];
    ps_progress bar;
} v4_instr;

/* The default period: the smallest compression rate of the model's compressed layers (CSA's 4 in
 * V4-Flash / V4-Pro). */
static int64_t default_period(const ps_v4_config *c) {
    int64_t p = 0;
    for (int l = 0; l < c->n_layers; l++)
        if (c->attn_type[l] != PS_V4_SLIDING && (!p || c->compress_rate[l] < p)) p = c->compress_rate[l];
    return p ? p : 4;
}

static int setup(v4_instr *in, const ps_args *a, ps_error *err) {
    memset(in, 0, sizeof *in);
    in->command = a->cmd->name;
    in->cmdline = ps_args_command_line(a);
    in->n_prompts = 256;
    in->batch = 32;
    if (strcmp(ps_args_backend(a), "cpu"))
        return ps_cli_usage(err, "--backend %s: DeepSeek-V4 checkpoints run on the cpu backend", ps_args_backend(a));
    if (ps_cli_model_dir(ps_args_get(a, "--model"), in->model_dir, sizeof in->model_dir, err)) return -1;
    /* every layer in memory when the float32 weights take at most half of the memory available, else one
     * layer at a time (as forward --lazy: each forward reads the layers from the files again) */
    if (ps_v4_model_open(&in->m, in->model_dir, err)) return -1;
    in->loaded = 1;
    double need = 4.0 * (double)in->m.n_params, avail = (double)ps_mem_available();
    if (ps_v4_model_load_weights(&in->m, avail > 0 && need > 0.5 * avail, err)) return -1;
    if (in->m.lazy)
        fprintf(stderr, "phasescope %s: the weights (%.1f GB as float32) are loaded one layer at a time\n", in->command, need / 1e9);
    const ps_v4_config *c = &in->m.cfg;
    in->P = default_period(c);
    int64_t seed = 0;
    if (ps_args_int(a, "--period", 1, PS_RESULT_MAX_PERIOD, &in->P, err) ||
        ps_args_int(a, "--n", 1, PS_RESULT_MAX_PROMPTS, &in->n_prompts, err) || ps_args_int(a, "--seed", 0, INT64_MAX, &seed, err) ||
        ps_args_int(a, "--batch", 1, 1 << 16, &in->batch, err))
        return -1;
    in->seed = (uint64_t)seed;
    const char *out = ps_args_get(a, "--out"), *family = ps_args_get(a, "--family");
    snprintf(in->out_dir, sizeof in->out_dir, "%s", out ? out : "");
    if (!out) snprintf(in->out_dir, sizeof in->out_dir, "out/%s", in->command);
    if (ps_fillers_load(PS_SOURCE_DIR "/data/fillers.json", &in->fams, &in->n_fams, err) ||
        ps_fillers_find(in->fams, in->n_fams, family, &in->fam, err))
        return in->fams && family ? ps_cli_mark_usage(err) : -1;
    if (ps_v4_task_load(&in->task, ps_args_get(a, "--task"), in->model_dir, c->vocab_size, c->max_position_embeddings, err)) {
        if (ps_args_get(a, "--task")) ps_fail_prefix(err, "--task: ");
        return -1;
    }
    if (ps_batch_alloc(&in->base, in->n_prompts, in->task.task.seq_len, in->task.task.n_queries, err)) return -1;
    if (ps_task_generate(&in->task.task, in->seed ^ 0xe7a1ULL, &in->base, err)) return -1;
    /* provenance: FNV-1a 64 of config.json as stored */
    char *text;
    size_t len;
    uint64_t h = 1469598103934665603ULL;
    if (!ps_read_file(in->m.cpath, (size_t)16 << 20, &text, &len, err)) {
        for (size_t i = 0; i < len; i++) h = (h ^ (unsigned char)text[i]) * 1099511628211ULL;
        free(text);
    } else
        return -1;
    snprintf(in->config_hash, sizeof in->config_hash, "%016llx", (unsigned long long)h);
    ps_progress_init(&in->bar, (int64_t)1 << 40);
    return 0;
}

static void teardown(v4_instr *in) {
    free(in->cmdline);
    free(in->fams);
    ps_batch_free(&in->base);
    ps_v4_task_free(&in->task);
    if (in->loaded) ps_v4_model_free(&in->m);
}

static void progress(int64_t done, int64_t total, void *user) {
    v4_instr *in = user;
    ps_progress_update(&in->bar, done, total, in->command);
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

static json_t *provenance(const v4_instr *in, const char *mode) {
    json_t *o = json_object(), *ev = json_object();
    json_object_set_new(o, "command", json_string(in->cmdline ? in->cmdline : in->command));
    json_object_set_new(o, "model", json_string(in->model_dir));
    json_object_set_new(o, "config_hash", json_string(in->config_hash));
    json_object_set_new(o, "seed", json_integer((json_int_t)in->seed));
    json_object_set_new(o, "version", json_string(PS_VERSION));
    char compute[512];
    ps_cpu_env_describe(compute, sizeof compute);
    json_object_set_new(o, "backend", json_string("cpu"));
    json_object_set_new(o, "compute", json_string(compute));
    json_object_set_new(o, "config", v4_config_json(&in->m.cfg));
    json_object_set_new(o, "task", ps_task_to_json(&in->task.task));
    json_object_set_new(o, "task_source", ps_v4_task_source_json(&in->task));
    json_object_set_new(ev, "n_prompts", json_integer(in->n_prompts));
    json_object_set_new(ev, "period", json_integer(in->P));
    json_object_set_new(ev, "family", json_string(in->fam ? in->fam->name : ""));
    if (mode) json_object_set_new(ev, "mode", json_string(mode));
    json_object_set_new(o, "eval", ev);
    return o;
}

/* validate, write atomically, render (ps_instr_write, which needs only the output directory) */
static int write_result(const v4_instr *in, const char *name, json_t *res, ps_error *err) {
    ps_instr w;
    memset(&w, 0, sizeof w);
    snprintf(w.out_dir, sizeof w.out_dir, "%s", in->out_dir);
    w.command = in->command;
    return ps_instr_write(&w, name, res, err);
}

/* ---- sweep ---- */

int ps_v4_cmd_sweep(const ps_args *a, ps_error *err) {
    v4_instr in;
    ps_residue_stats st = {0};
    json_t *res = NULL;
    int rc = 1;
    static const char *const MODES[] = {"pad", "move", NULL};
    int mi = 0;
    if (ps_args_choice(a, "--mode", MODES, &mi, err)) return 1;
    if (setup(&in, a, err)) goto done;
    ps_sweep_mode mode = mi ? PS_SWEEP_MOVE : PS_SWEEP_PAD;
    if (ps_v4_sweep_run(&in.m, &in.task, &in.base, in.fam, mode, in.P, in.seed, in.batch, &st, progress, &in, err)) {
        ps_progress_end(&in.bar);
        goto done;
    }
    ps_progress_end(&in.bar);
    res = json_object();
    json_object_set_new(res, "kind", json_string("sweep"));
    json_object_set_new(res, "provenance", provenance(&in, mi ? "move" : "pad"));
    json_t *curve = ps_residue_stats_json(&st, err);
    if (!curve) goto done;
    json_object_set_new(res, "curve", curve);
    if (write_result(&in, "sweep.json", res, err)) goto done;
    ps_sweep_summary_line(curve);
    rc = 0;
done:
    json_decref(res);
    ps_residue_stats_free(&st);
    teardown(&in);
    return rc;
}

/* ---- gates ---- */

int ps_v4_cmd_gates(const ps_args *a, ps_error *err) {
    if (ps_args_get(a, "--log"))
        return ps_cli_usage(err, "--log: a DeepSeek-V4 checkpoint has no phasescope training log"), 1;
    v4_instr in;
    ps_chgate_acc acc = {0};
    json_t *res = NULL;
    int rc = 1;
    if (setup(&in, a, err)) goto done;
    if (ps_v4_gates_run(&in.m, &in.task, &in.base, in.fam, in.seed, in.batch, &acc, err)) goto done;
    res = json_object();
    json_object_set_new(res, "kind", json_string("gates"));
    json_object_set_new(res, "provenance", provenance(&in, NULL));
    json_object_set_new(res, "thresholds", json_pack("{s:f}", "concentrated", PS_GATE_CONCENTRATED));
    json_t *g = ps_chgate_acc_to_json(&acc);
    if (!g) {
        ps_fail(err, "out of memory for the gate statistics");
        goto done;
    }
    json_object_set_new(g, "model", json_string("deepseek_v4"));
    json_object_set_new(res, "gates", g);
    if (write_result(&in, "gates.json", res, err)) goto done;
    ps_chgate_print(&acc);
    rc = 0;
done:
    json_decref(res);
    if (acc.g) ps_chgate_acc_free(&acc);
    teardown(&in);
    return rc;
}

/* ---- gate cycling ---- */

int ps_v4_cmd_gatecycle(const ps_args *a, ps_error *err) {
    if (ps_args_get(a, "--head"))
        return ps_cli_usage(err, "--head: a DeepSeek-V4 compressor has one K=V head; its position bias is rolled for every channel"), 1;
    if (ps_args_get(a, "--save")) return ps_cli_usage(err, "--save: writing DeepSeek-V4 checkpoints is not supported"), 1;
    const char *pv = ps_args_get(a, "--params");
    if (pv && strcmp(pv, "gate"))
        return ps_cli_usage(err, "--params %s: a DeepSeek-V4 compressor's only per-slot parameter is its position bias (ape): "
                                 "use --params gate (the default)", pv),
               1;
    int64_t layer = 0, shift = 0;
    static const char *const BR[] = {"compressor", "indexer", "both", NULL};
    int bi = 2;
    if (ps_args_int(a, "--layer", 0, PS_RESULT_MAX_SHIFT, &layer, err) ||
        ps_args_int(a, "--shift", -PS_RESULT_MAX_SHIFT, PS_RESULT_MAX_SHIFT, &shift, err))
        return 1;
    if (ps_args_get(a, "--branch") && ps_args_choice(a, "--branch", BR, &bi, err)) {
        ps_fail_prefix(err, "DeepSeek-V4: ");
        return 1;
    }
    int branches = bi == 0 ? PS_V4_CYCLE_COMPRESSOR : bi == 1 ? PS_V4_CYCLE_INDEXER : PS_V4_CYCLE_COMPRESSOR | PS_V4_CYCLE_INDEXER;
    v4_instr in;
    ps_residue_stats before = {0}, after = {0};
    ps_cycle_analysis an = {0};
    json_t *res = NULL;
    double *ab = NULL, *aa = NULL;
    int rc = 1;
    if (setup(&in, a, err)) goto done;
    const ps_v4_config *c = &in.m.cfg;
    if (layer >= c->n_layers) {
        ps_cli_usage(err, "--layer %lld: out of range (the model has %lld layers, 0..%lld)", (long long)layer, (long long)c->n_layers,
                     (long long)c->n_layers - 1);
        goto done;
    }
    if (ps_v4_gate_cycle(&in.m, (int)layer, branches, 0, err)) { /* preconditions first: cycling by 0 changes nothing */
        ps_cli_mark_usage(err);
        goto done;
    }
    if (ps_v4_sweep_run(&in.m, &in.task, &in.base, in.fam, PS_SWEEP_PAD, in.P, in.seed, in.batch, &before, progress, &in, err))
        goto done;
    ps_progress_end(&in.bar);
    if (ps_v4_gate_cycle(&in.m, (int)layer, branches, shift, err)) goto done;
    if (ps_v4_sweep_run(&in.m, &in.task, &in.base, in.fam, PS_SWEEP_PAD, in.P, in.seed, in.batch, &after, progress, &in, err))
        goto done;
    ps_progress_end(&in.bar);
    ab = malloc((size_t)in.P * sizeof(double));
    aa = malloc((size_t)in.P * sizeof(double));
    if (!ab || !aa) {
        ps_fail(err, "out of memory");
        goto done;
    }
    for (int64_t r = 0; r < in.P; r++) {
        ab[r] = ps_residue_accuracy(&before, r);
        aa[r] = ps_residue_accuracy(&after, r);
    }
    if (ps_cycle_analyse(ab, aa, in.P, ps_task_chance(&in.task.task), &an, err)) goto done;
    json_t *jb = ps_residue_stats_json(&before, err), *ja = jb ? ps_residue_stats_json(&after, err) : NULL;
    if (!ja) {
        json_decref(jb);
        goto done;
    }
    int has_ix = c->attn_type[layer] == PS_V4_CSA && (branches & PS_V4_CYCLE_INDEXER);
    const char *br = (branches & PS_V4_CYCLE_COMPRESSOR) && has_ix ? "both" : has_ix ? "indexer" : "compressor";
    res = json_object();
    json_object_set_new(res, "kind", json_string("gatecycle"));
    json_object_set_new(res, "provenance", provenance(&in, "pad"));
    json_t *cyc = json_object();
    json_object_set_new(cyc, "layer", json_integer(layer));
    json_object_set_new(cyc, "shift", json_integer(shift));
    json_object_set_new(cyc, "head", json_string("all"));
    json_object_set_new(cyc, "heads", json_pack("[i]", 0));
    json_object_set_new(cyc, "branch", json_string(br));
    json_object_set_new(cyc, "params", json_string("gate"));
    json_object_set_new(cyc, "rolled", json_string("position bias (ape) rows, by shift mod the layer's rate"));
    json_object_set_new(cyc, "rate", json_integer(c->compress_rate[layer]));
    json_object_set_new(res, "cycle", cyc);
    json_object_set_new(res, "before", jb);
    json_object_set_new(res, "after", ja);
    json_object_set_new(res, "chance", json_real(an.chance));
    json_object_set_new(res, "after_near_chance", json_boolean(an.after_near_chance));
    json_t *dips = json_array(), *nd = json_array(), *ex = json_array(), *warns = json_array();
    for (int64_t i = 0; i < an.n_moves; i++) {
        const ps_dip_move *mv = &an.moves[i];
        json_t *d = json_object();
        int64_t mb = mv->after >= 0 ? ((mv->after - mv->before) % in.P + in.P) % in.P : 0;
        if (mb > in.P / 2) mb -= in.P;
        json_object_set_new(d, "before", json_integer(mv->before));
        json_object_set_new(d, "after", mv->after >= 0 ? json_integer(mv->after) : json_null());
        json_object_set_new(d, "moved_by", mv->after >= 0 ? json_integer(mb) : json_null());
        json_object_set_new(d, "accuracy_before", json_real(mv->acc_before));
        json_object_set_new(d, "accuracy_after", json_real(mv->acc_after));
        json_object_set_new(d, "still_dips_after", json_boolean(mv->still_dips));
        json_array_append_new(dips, d);
    }
    for (int64_t i = 0; i < an.n_new; i++) json_array_append_new(nd, json_integer(an.new_dips[i]));
    for (int64_t i = 0; i < an.n_excluded; i++) json_array_append_new(ex, json_integer(an.excluded[i]));
    if (an.after_near_chance)
        json_array_append_new(warns, json_string("after cycling, accuracy is near chance: the shift statistic means nothing"));
    json_object_set_new(res, "dips", dips);
    json_object_set_new(res, "new_dips", nd);
    json_object_set_new(res, "excluded_residues", ex);
    json_object_set_new(res, "best_shift", json_integer(an.best_shift));
    json_object_set_new(res, "best_shift_signed", json_integer(an.best_shift_signed));
    json_object_set_new(res, "best_shift_correlation", json_real(an.best_shift_correlation));
    json_object_set_new(res, "warnings", warns);
    if (write_result(&in, "gatecycle.json", res, err)) goto done;
    printf("cycled layer %lld (%s, rate %lld): %s position bias rolled by %lld; mean accuracy %.3f -> %.3f\n", (long long)layer,
           ps_v4_attn_type_name(c->attn_type[layer]), (long long)c->compress_rate[layer], br, (long long)shift,
           json_number_value(json_object_get(jb, "mean_accuracy")), json_number_value(json_object_get(ja, "mean_accuracy")));
    printf("whole-curve best-aligning shift %lld (signed %+lld, correlation %.3f)\n", (long long)an.best_shift,
           (long long)an.best_shift_signed, an.best_shift_correlation);
    rc = 0;
done:
    free(ab);
    free(aa);
    ps_cycle_analysis_free(&an);
    json_decref(res);
    ps_residue_stats_free(&before);
    ps_residue_stats_free(&after);
    teardown(&in);
    return rc;
}

/* ---- knockout ---- */

static int list_flag(const ps_args *a, const char *flag, int64_t count, const char *what, int *out, int *n, ps_error *err) {
    const char *v = ps_args_get(a, flag);
    if (!v) return 1; /* absent: the caller's default */
    if (!ps_cli_int_list(flag, v, 0, count - 1, out, (int)count, n, err)) return 0;
    char m[PS_ERROR_MAX];
    snprintf(m, sizeof m, "%s", err->msg);
    ps_cli_usage(err, "%.900s (the model has %lld %s)", m, (long long)count, what);
    return -1;
}

int ps_v4_cmd_knockout(const ps_args *a, ps_error *err) {
    int ti = PS_V4KO_COMPRESSED;
    if (ps_args_get(a, "--target") && ps_args_choice(a, "--target", ps_v4_ko_targets, &ti, err)) {
        ps_fail_prefix(err, "DeepSeek-V4: ");
        return 1;
    }
    ps_v4_ko_target target = (ps_v4_ko_target)ti;
    v4_instr in;
    ps_knockout_result r = {0};
    json_t *res = NULL;
    int rc = 1, *layers = NULL, *heads = NULL, nl = 0, nh = 0;
    if (setup(&in, a, err)) goto done;
    const ps_v4_config *c = &in.m.cfg;
    layers = malloc((size_t)c->n_layers * sizeof(int));
    heads = malloc((size_t)c->n_heads * sizeof(int));
    if (!layers || !heads) {
        ps_fail(err, "out of memory");
        goto done;
    }
    int lr = list_flag(a, "--layers", c->n_layers, "layers", layers, &nl, err);
    if (lr < 0) goto done;
    if (lr > 0)
        for (int l = 0; l < c->n_layers; l++)
            if (ps_v4_ko_layer_ok(c, l, target)) layers[nl++] = l;
    if (!nl) {
        ps_cli_usage(err, "--target %s: no layer of this model has what it replaces", ps_v4_ko_targets[target]);
        goto done;
    }
    for (int i = 0; i < nl; i++)
        if (!ps_v4_ko_layer_ok(c, layers[i], target)) {
            ps_cli_usage(err, "--layers: layer %d is %s, which has no %s for --target %s", layers[i],
                         ps_v4_attn_type_name(c->attn_type[layers[i]]),
                         target == PS_V4KO_INDEXER ? "indexer" : "compressed entries", ps_v4_ko_targets[target]);
            goto done;
        }
    int hr = list_flag(a, "--heads", c->n_heads, "query heads", heads, &nh, err);
    if (hr < 0) goto done;
    if (hr > 0)
        for (nh = 0; nh < c->n_heads; nh++) heads[nh] = nh;
    else if (target != PS_V4KO_HEADS) {
        ps_cli_usage(err, "--heads: --target %s replaces whole layers (--heads goes with --target heads)", ps_v4_ko_targets[target]);
        goto done;
    }
    if (ps_v4_knockout_grid(&in.m, &in.task, &in.base, in.fam, in.P, in.seed, in.batch, layers, nl, heads, nh, target, &r, progress,
                            &in, err)) {
        ps_progress_end(&in.bar);
        goto done;
    }
    ps_progress_end(&in.bar);
    res = json_object();
    json_object_set_new(res, "kind", json_string("knockout"));
    json_object_set_new(res, "provenance", provenance(&in, "pad"));
    json_t *grid = ps_knockout_json(&r, PS_KO_COMPRESSED, err);
    if (!grid) goto done;
    json_object_set_new(grid, "target", json_string(ps_v4_ko_targets[target]));
    json_object_set_new(grid, "unit", json_string(target == PS_V4KO_HEADS ? "query head" : "layer"));
    json_object_set_new(res, "grid", grid);
    if (write_result(&in, "knockout.json", res, err)) goto done;
    json_t *cells = json_object_get(grid, "cells");
    printf("clean mean accuracy %.3f; knocked out (%s), per cell the residue it hurts most:\n",
           json_number_value(json_object_get(json_object_get(grid, "clean"), "mean_accuracy")), ps_v4_ko_targets[target]);
    for (size_t i = 0; i < json_array_size(cells) && i < 64; i++) {
        json_t *cell = json_array_get(cells, i), *w = json_object_get(cell, "worst_residue");
        printf("  layer %lld", (long long)json_integer_value(json_object_get(cell, "layer")));
        if (target == PS_V4KO_HEADS) printf(" head %lld", (long long)json_integer_value(json_object_get(cell, "head")));
        printf(": mean dacc %+.1f pp, dNLL %+.3f", json_number_value(json_object_get(cell, "mean_delta_accuracy_pp")),
               json_number_value(json_object_get(cell, "mean_delta_nll")));
        if (json_is_object(w))
            printf("; worst rho %lld (%+.1f pp)", (long long)json_integer_value(json_object_get(w, "rho")),
                   json_number_value(json_object_get(w, "delta_accuracy_pp")));
        printf("\n");
    }
    rc = 0;
done:
    free(layers);
    free(heads);
    json_decref(res);
    ps_knockout_result_free(&r);
    teardown(&in);
    return rc;
}

/* ---- gates of a phasescope model with the channel attention ---- */

/* The per-channel gate records of a train.jsonl ("gate": "per_channel"): per layer, the pooled
 * statistics over the logged steps, the step where the pooled N_input first reached the concentration
 * threshold, and the channel label counts of the last record. */
static json_t *summarise_chlog(const char *path, ps_error *err) {
    char *text;
    size_t len;
    if (ps_read_file(path, (size_t)1 << 32, &text, &len, err)) return NULL;
    json_t *recs = json_array();
    int line_no = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        line_no++;
        json_error_t je;
        json_t *o = json_loads(line, 0, &je);
        if (!o) {
            ps_fail(err, "%s: line %d is not valid JSON (%s)", path, line_no, je.text);
            json_decref(recs);
            free(text);
            return NULL;
        }
        const char *ty = json_string_value(json_object_get(o, "type")), *g = json_string_value(json_object_get(o, "gate"));
        if (ty && !strcmp(ty, "gates") && g && !strcmp(g, "per_channel")) json_array_append(recs, o);
        json_decref(o);
    }
    free(text);
    size_t nr = json_array_size(recs);
    if (!nr) {
        json_decref(recs);
        ps_fail(err, "%s: no per-channel gate records (a v4 model's training log has \"type\": \"gates\", \"gate\": \"per_channel\" lines)", path);
        return NULL;
    }
    json_t *out = json_array(), *layers0 = json_object_get(json_array_get(recs, 0), "layers");
    for (size_t li = 0; li < json_array_size(layers0); li++) {
        json_t *steps = json_array(), *ns = json_array(), *ni = json_array(), *pk = json_array(), *cms = json_array(), *conc = json_null();
        json_t *last = NULL;
        for (size_t r = 0; r < nr; r++) {
            json_t *rec = json_array_get(recs, r), *lo = json_array_get(json_object_get(rec, "layers"), li);
            json_t *bo = json_array_get(json_object_get(lo, "branches"), 0), *po = json_object_get(bo, "pooled");
            json_array_append_new(steps, json_integer(json_integer_value(json_object_get(rec, "step"))));
            json_array_append_new(ns, json_real(json_number_value(json_object_get(po, "N_static"))));
            json_array_append_new(ni, json_real(json_number_value(json_object_get(po, "N_input"))));
            json_array_append_new(pk, json_integer(json_integer_value(json_object_get(po, "peak"))));
            json_array_append_new(cms, json_real(json_number_value(json_object_get(json_object_get(bo, "channel_mean"), "N_static"))));
            if (json_is_null(conc) && json_number_value(json_object_get(po, "N_input")) <= PS_GATE_CONCENTRATED)
                conc = json_integer(json_integer_value(json_object_get(rec, "step")));
            last = bo;
        }
        json_t *e = json_object();
        json_object_set_new(e, "layer", json_integer(json_integer_value(json_object_get(json_array_get(layers0, li), "layer"))));
        json_object_set_new(e, "branch", json_string("compressor"));
        json_object_set_new(e, "steps", steps);
        json_object_set_new(e, "N_static", ns);
        json_object_set_new(e, "N_input", ni);
        json_object_set_new(e, "peak", pk);
        json_object_set_new(e, "channel_mean_N_static", cms);
        json_object_set_new(e, "input_concentrated_at_step", conc);
        json_object_set(e, "final_labels", json_object_get(last, "labels"));
        json_array_append_new(out, e);
    }
    json_decref(recs);
    return out;
}

static int outcome_arrays(const ps_batch *b, int **ok, double **lp, ps_error *err) {
    *ok = malloc((size_t)(b->B * b->max_q > 0 ? b->B * b->max_q : 1) * sizeof(int));
    *lp = malloc((size_t)(b->B * b->max_q > 0 ? b->B * b->max_q : 1) * sizeof(double));
    if (*ok && *lp) return 0;
    free(*ok), free(*lp);
    *ok = NULL, *lp = NULL;
    return ps_fail(err, "out of memory for the outcomes of %lld prompts", (long long)b->B);
}

int ps_v4_model_gates(ps_instr *in, const char *log, ps_error *err) {
    ps_chgate_acc acc = {0};
    ps_hooks h;
    ps_hooks_init(&h);
    json_t *res = NULL;
    int rc = -1;
    ps_shifted s = {0};
    int *ok = NULL;
    double *lp = NULL;
    if (ps_chgate_init_model(&acc, &in->m.cfg, err) || ps_chgate_watch_model(&acc, &h, &in->m.cfg, err)) goto done;
    if (ps_make_shifted(&in->base, &in->task, in->fam, PS_SWEEP_PAD, 1, 0, in->seed, in->m.cfg.max_seq_len, &s, err) ||
        outcome_arrays(&s.b, &ok, &lp, err) || ps_eval_shifted(&in->m, &s, in->batch, &h, ok, lp, err))
        goto done;
    res = json_object();
    json_object_set_new(res, "kind", json_string("gates"));
    json_object_set_new(res, "provenance", ps_instr_provenance(in, NULL));
    json_object_set_new(res, "thresholds", json_pack("{s:f}", "concentrated", PS_GATE_CONCENTRATED));
    json_t *g = ps_chgate_acc_to_json(&acc);
    if (!g) {
        ps_fail(err, "out of memory for the gate statistics");
        goto done;
    }
    json_object_set_new(g, "model", json_string("v4"));
    json_object_set_new(res, "gates", g);
    if (log) {
        json_t *evo = summarise_chlog(log, err);
        if (!evo) {
            ps_fail_prefix(err, "--log: ");
            goto done;
        }
        json_object_set_new(res, "training", evo);
    }
    if (ps_instr_write(in, "gates.json", res, err)) goto done;
    ps_chgate_print(&acc);
    rc = 0;
done:
    free(ok);
    free(lp);
    ps_shifted_free(&s);
    json_decref(res);
    ps_hooks_free(&h);
    if (acc.g) ps_chgate_acc_free(&acc);
    return rc;
}
