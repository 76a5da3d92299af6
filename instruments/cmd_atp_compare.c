/* cmd_atp_compare.c — `phasescope atp-compare EXACT ATP --out DIR`: an attribution-patching estimate
 * measured against the exact knockout grid of the same run (interventions/atp.h, ps_atp_compare). */
#include "instruments/instrument.h"

static int run(const ps_args *a, ps_error *err);

static const ps_flag_spec FLAGS[] = {
    {"--out", "DIR", "where atp_compare.json and atp_compare.png go (required)", 1},
    {"--times", "EXACT.json,ATP.json",
     "the two runs' times ({\"wall_s\", \"user_s\", \"sys_s\", \"max_rss_kb\"}, as bench/atp_eval.sh\n"
     "writes them): the speed-up goes into the result",
     0},
    {0},
};

const ps_command ps_cmd_atp_compare = {
    .name = "atp-compare",
    .summary = "an attribution-patching estimate against the exact knockout grid",
    .description =
        "Compares `knockout --method atp` (ATP) with `knockout` (EXACT) of the same model, prompts and cells\n"
        "(docs/attribution.md): the correlation of estimated and exact change in mean target NLL over cells x\n"
        "residues (Pearson and Spearman), the recall of the exact grid's strong cells (worst residue <= -30 pp)\n"
        "among the top 2x as many estimated cells, the strong cells the estimate misses, and the speed-up when\n"
        "--times gives both runs' times. Writes OUT/atp_compare.json and the figure: exact beside estimate\n"
        "beside their scatter.\n",
    .positional = "EXACT.json ATP.json",
    .max_positional = 2,
    .flags = FLAGS,
    .run = run,
};

/* Two result files, then one call: ps_atp_compare_command (instr_atp_compare.c) reads them and --times,
 * compares, writes OUT/atp_compare.json and its figure and prints the summary. */
static int run(const ps_args *a, ps_error *err) {
    if (a->n_pos != 2) return ps_cli_usage(err, "atp-compare takes two files: the exact knockout.json, then the estimate's");
    return ps_atp_compare_command(a->pos[0], a->pos[1], ps_args_get(a, "--times"), ps_args_get(a, "--out"), a, err);
}
