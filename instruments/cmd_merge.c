/* cmd_merge.c — `phasescope merge PARTS... --out DIR`: the result of a run split with --shard I/N. */
#include <stdio.h>
#include <string.h>

#include "instruments/instrument.h"
#include "scaleout/partial.h"
#include "instruments/registry.h"

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
    /* the instruments whose work splits into units, each with the finish that adds its parts up (the registry) */
    const ps_registry_entry *e = ps_registry_find(p.command);
    int rc;
    ps_out o = {.dir = out};
    if (e && e->finish) rc = e->finish(&p, &o, err);
    else {
        char names[256] = "";
        size_t o = 0;
        for (int i = 0; i < ps_registry_n && o < sizeof names; i++)
            if (ps_registry[i].finish) {
                int w = snprintf(names + o, sizeof names - o, "%s%s", o ? ", " : "", ps_registry[i].cmd->name);
                if (w > 0) o += (size_t)w;
            }
        rc = ps_fail(err, "%s: parts of a \"%s\" run; merge combines %s", a->pos[0], p.command, names);
    }
    ps_partial_free(&p);
    return rc;
}
