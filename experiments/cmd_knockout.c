/* cmd_knockout.c — `phasescope knockout`: the mean-replacement KV-head knockout grid. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/dist.h"
#include "experiments/instrument.h"
#include "interventions/atp.h"
#include "interventions/knockout.h"

static int run(const ps_args *a, ps_error *err);



static const ps_flag_spec FLAGS[] = {
    {"--layers", "LIST", "layers, e.g. 0,2-3 (default: all)", 0},
    {"--heads", "LIST", "KV heads (default: all); DeepSeek-V4 --target heads: query heads", 0},
    {"--target", "raw|compressed|both",
     "compressed (default for compressed models): hook_ck and hook_cv; raw (default for\n"
     "full attention): hook_k and hook_v; both. DeepSeek-V4 checkpoints: heads, compressed\n"
     "(default), raw, indexer or sink (docs/results-schema.md)",
     0},
    {"--method", "exact|atp",
     "exact (default): a forward per cell; atp: attribution patching, every cell estimated from one\n"
     "backward per batch (docs/attribution.md; the controlled model)",
     0},
    {"--atp-fix", "none|qk",
     "atp: none (default: gradient x difference at the replaced entries) or qk (the patched head's\n"
     "attention recomputed exactly, the rest linear; full and compressed attention)",
     0},
    {"--verify", "K", "atp: then the exact knockout of the K cells with the largest estimated effect", 0},
    PS_INSTR_FLAGS,
    PS_V4_TASK_FLAG,
    {0},
};

const ps_command ps_cmd_knockout = {
    .name = "knockout",
    .summary = "mean-replacement KV-head knockout grid, per residue",
    .description =
        "Mean-replacement KV-head knockout (docs/results-schema.md, `knockout.json`): for every chosen layer l and KV head g, that head's entries\n"
        "are replaced by their mean over the evaluation prompts of the same shift, position by position, and the\n"
        "prefix-padding sweep is run. Reports per (layer, head, residue) the change in accuracy (pp) and in mean\n"
        "target NLL against the clean run, and each head's worst residue (the largest accuracy drop). Writes\n"
        "OUT/knockout.json. --method atp estimates every cell's NLL change from gradients instead (no\n"
        "accuracy), --verify K then runs the K cells that matter most exactly.\n",
    .flags = FLAGS,
    .run = run,
};

/* A list flag sized to the model; the error adds how many the model has ("(the model has 2 layers)"). */
static int model_list(const ps_args *a, const char *flag, int64_t count, const char *what, int *out, int *n, ps_error *err) {
    const char *v = ps_args_get(a, flag);
    if (!v) {
        for (*n = 0; *n < count; (*n)++) out[*n] = *n;
        return 0;
    }
    if (!ps_cli_int_list(flag, v, 0, count - 1, out, (int)count, n, err)) return 0;
    char m[PS_ERROR_MAX];
    snprintf(m, sizeof m, "%s", err->msg);
    return ps_cli_usage(err, "%.900s (the model has %lld %s)", m, (long long)count, what);
}

/* The flags, checked against the model; the run is ps_knockout_command (instr_knockout.c). */
static int run(const ps_args *a, ps_error *err) {
    ps_instr in = {0};
    int rc = 1, *layers = NULL, *heads = NULL, nl = 0, nh = 0, target = 0;
    int bad = ps_instr_setup(&in, a, 1, err);
    const ps_runtime *rt = &in.rt;
    int64_t L = 0, nh_max = 0;
    char why[256];
    if (!bad) {
        L = rt->n_layers;
        target = ps_knockout_default_target(rt);
        const char *tv = ps_args_get(a, "--target");
        if (tv && ps_args_choice(a, "--target", ps_knockout_targets(rt), &target, err)) bad = -1;
    }
    if (!bad) {
        nh_max = ps_knockout_target_heads(rt, target);
        /* a config may have up to 2^24 layers or heads: the lists are sized to the model */
        layers = malloc((size_t)L * sizeof(int));
        heads = malloc((size_t)(nh_max > 0 ? nh_max : 1) * sizeof(int));
        if (!layers || !heads)
            bad = ps_fail(err, "out of memory for the lists of %lld layers and %lld heads", (long long)L, (long long)nh_max);
    }
    const char *tname = bad ? "" : ps_knockout_targets(rt)[target];
    if (!bad && ps_knockout_layer_missing(rt, target, -1, why, sizeof why)) bad = ps_fail(err, "%s", why); /* the model has none */
    if (!bad && ps_args_get(a, "--layers")) {
        bad = model_list(a, "--layers", L, "layers", layers, &nl, err);
        for (int i = 0; i < nl && !bad; i++) {
            const char *m = ps_knockout_layer_missing(rt, target, layers[i], why, sizeof why);
            if (m) bad = ps_cli_usage(err, "--layers: %s", m);
        }
    } else if (!bad) { /* every layer that has what the target replaces */
        const char *first = NULL;
        for (int l = 0; l < L; l++) {
            const char *m = ps_knockout_layer_missing(rt, target, l, why, sizeof why);
            if (!m) layers[nl++] = l;
            else if (!first) first = m;
        }
        if (!nl) bad = ps_cli_usage(err, "%s", first ? why : "no layer has what the target replaces");
    }
    if (!bad && nh_max > 0)
        bad = model_list(a, "--heads", nh_max, ps_knockout_heads_what(rt), heads, &nh, err);
    else if (!bad) {
        if (ps_args_get(a, "--heads"))
            bad = ps_cli_usage(err, "--heads: --target %s replaces whole layers (--heads goes with --target heads)", tname);
        heads[0] = 0, nh = 1;
    }
    int atp = 0, fix = 0;
    int64_t verify = 0;
    if (!bad) {
        static const char *const METHODS[] = {"exact", "atp", NULL};
        if (ps_args_get(a, "--method") && ps_args_choice(a, "--method", METHODS, &atp, err)) bad = -1;
    }
    if (!bad) {
        fix = ps_atp_default_fix(rt);
        if (ps_args_get(a, "--atp-fix") && ps_args_choice(a, "--atp-fix", ps_atp_fix_names, &fix, err)) bad = -1;
        else if (!atp && ps_args_get(a, "--atp-fix")) bad = ps_cli_usage(err, "--atp-fix goes with --method atp");
        else if (atp && ps_atp_fix_missing(rt, fix, why, sizeof why))
            bad = ps_args_get(a, "--atp-fix") ? ps_cli_usage(err, "%s", why) : ps_fail(err, "%s", why);
    }
    if (!bad && ps_args_get(a, "--verify")) {
        if (!atp) bad = ps_cli_usage(err, "--verify goes with --method atp (an exact grid is exact already)");
        else if (in.n_shards > 1)
            bad = ps_cli_usage(err, "--verify needs the whole estimate to choose its cells: run it without --shard (MPI ranks split both passes)");
        else if (ps_args_int(a, "--verify", 0, (int64_t)nl * (nh > 0 ? nh : 1), &verify, err)) bad = -1;
    }
    if (ps_dist_agree(bad, err)) goto done;
    ps_knockout_request rq = {.layers = layers, .n_layers = nl, .heads = heads, .n_heads = nh, .target = target,
                              .target_name = tname, .atp = atp, .atp_fix = fix, .verify = verify};
    if (ps_knockout_command(&in, &rq, err)) goto done;
    rc = 0;
done:
    free(layers);
    free(heads);
    ps_instr_free(&in);
    return rc;
}
