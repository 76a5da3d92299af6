/* cmd_table.c — `phasescope table`: the summary table of several sweeps (like the paper's Table 1). */
#include <stdio.h>
#include <stdlib.h>

#include "instruments/command.h"
#include "core/fileio.h"
#include "viz/sweep_table.h"

static int run(const ps_args *a, ps_error *err);

static const ps_flag_spec FLAGS[] = {
    {"--out", "TABLE.md", "also write the table to this file (atomically)", 0},
    {"--figure", "PLOT.png",
     "also draw gap against mean accuracy, one point per file, marker area = KV bytes per token, colour =\n"
     "the model name without a trailing _rule and _sN seed suffix (at most 8), a ring for a _rule checkpoint (at the\n"
     "held-out-0.6 rule), a disc for the others (docs/results.md \"The weak phase across designs\")",
     0},
    {0},
};

const ps_command ps_cmd_table = {
    .name = "table",
    .summary = "summary table (markdown) of several sweep results",
    .description =
        "Prints a markdown table with one row per sweep result: model, attention, period, mean accuracy, worst\n"
        "residue, gap (pp), the detected period (dominant DFT frequency of the residue curve) and the chi-square\n"
        "p-value of accuracy against residue. --out also writes it to a file (atomically). Each file is checked\n"
        "against docs/results-schema.md first; a malformed one is refused, naming the field at fault.\n"
        "The attention column names staggered and per-layer grids (attention.head_offsets); the KV column is the KV-cache bytes\n"
        "per token of the compressed entries (float32; full attention: every token's K and V).\n",
    .positional = "SWEEP.json [MORE.json ...]",
    .max_positional = 256,
    .flags = FLAGS,
    .run = run,
};

static int run(const ps_args *a, ps_error *err) {
    size_t len = 0;
    char *table = ps_sweep_table(a->pos, a->n_pos, ps_args_get(a, "--figure"), &len, err);
    if (!table) {
        if (err->usage && a->n_pos == 0) ps_cli_usage(err, "no sweep result given (see --help)");
        return -1;
    }
    fputs(table, stdout);
    const char *file = ps_args_get(a, "--out");
    int rc = file && ps_write_file_atomic(file, table, len, err) ? -1 : 0;
    free(table);
    return rc;
}
