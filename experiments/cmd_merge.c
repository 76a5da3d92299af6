/* cmd_merge.c — `phasescope merge PARTS... --out DIR`: the result of a run split with --shard I/N. */
#include <stdio.h>
#include <string.h>

#include "experiments/instrument.h"
#include "dist/partial.h"

static int run(const ps_args *a, ps_error *err);

static const ps_flag_spec FLAGS[] = {
    {"--out", "DIR", "where the result goes (required)", 1},
    {0},
};

const ps_command ps_cmd_merge = {
    .name = "merge",
    .summary = "combine the partial results of a run split with --shard I/N",
    .description =
        "Combines the part files (or the --out directories holding them) that `phasescope sweep|knockout|gatecycle|gates ... --shard I/N` wrote (one per shard,\n"
        "COMMAND.part-I-of-N.safetensors, each from any machine) into the result one process writes: the same JSON\n"
        "numbers (the per-item outcomes are added up in the one-process order) and figures, in OUT/. Refuses parts of\n"
        "different runs (model, flags, prompts), a missing or repeated shard, and parts that split the work\n"
        "differently. docs/scale-out.md.\n",
    .positional = "PART|DIR [PART|DIR ...]",
    .max_positional = 1 << 20,
    .flags = FLAGS,
    .run = run,
};

static int run(const ps_args *a, ps_error *err) {
    if (a->n_pos < 1) return ps_cli_usage(err, "no part files given (PART [PART ...]: the OUT/COMMAND.part-I-of-N.safetensors files)");
    ps_partial p;
    char **parts;
    int n_parts;
    if (ps_partial_expand_paths(a->pos, a->n_pos, &parts, &n_parts, err)) return -1;
    int mrc = ps_partial_merge_files((const char *const *)parts, n_parts, &p, err);
    ps_free_paths(parts, n_parts);
    if (mrc) return -1;
    const char *out = ps_args_get(a, "--out");
    int rc;
    if (!strcmp(p.command, "sweep")) rc = ps_sweep_finish(&p, out, err);
    else if (!strcmp(p.command, "knockout")) rc = ps_knockout_finish(&p, out, err);
    else if (!strcmp(p.command, "gatecycle")) rc = ps_gatecycle_finish(&p, out, err);
    else if (!strcmp(p.command, "gates")) rc = ps_gates_finish(&p, out, err);
    else rc = ps_fail(err, "%s: parts of a \"%s\" run; merge combines sweep, knockout, gatecycle and gates", a->pos[0], p.command);
    ps_partial_free(&p);
    return rc;
}
