/* cmd_sweep.c — `phasescope sweep`: accuracy per phase residue under prefix padding or move mode. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cmd_v4.h"
#include "instrument.h"
#include "draw.h"
#include "stats.h"

static int run(const ps_args *a, ps_error *err);

static const ps_flag_spec FLAGS[] = {
    {"--mode", "pad|move", "pad (default) or move", 0},
    PS_INSTR_FLAGS,
    {0},
};

const ps_command ps_cmd_sweep = {
    .name = "sweep",
    .summary = "phase sweep: accuracy per residue (prefix padding or move mode)",
    .description =
        "Phase sweep (docs/results-schema.md). pad: for each shift p = 0..P-1, p filler tokens go right after BOS; move: the\n"
        "queried pair moves (p fillers before it, P-1-p after it), the prompt length stays fixed. Each query's\n"
        "phase coordinate is rho = t_K mod P (t_K: position of the queried key's first token). Reports per rho:\n"
        "n, accuracy (top-1 over the vocabulary), 95% Wilson interval, mean target log-prob; overall mean, min\n"
        "and gap (pp); a chi-square test of accuracy against residue and the verdict: phase sensitive when\n"
        "p < 0.01 and the gap is at least 5 pp; only then the dominant period of the curve is given (the JSON's\n"
        "dominant_period.period is null otherwise). Writes OUT/sweep.json.\n",
    .flags = FLAGS,
    .run = run,
};

static int run(const ps_args *a, ps_error *err) {
    if (ps_v4_instr_wanted(a)) return ps_v4_cmd_sweep(a, err); /* DeepSeek-V4 checkpoint: experiments/cmd_v4_instr.c */
    ps_instr in = {0};
    ps_residue_stats st = {0};
    json_t *res = NULL;
    int rc = 1;
    static const char *const MODES[] = {"pad", "move", NULL};
    int mi = 0;
    if (ps_args_choice(a, "--mode", MODES, &mi, err)) goto done;
    ps_sweep_mode mode = mi ? PS_SWEEP_MOVE : PS_SWEEP_PAD;
    if (ps_instr_setup(&in, a, 1, err)) goto done;
    if (ps_sweep_run(&in.m, &in.base, &in.task, in.fam, mode, in.P, in.seed, in.batch, &st, ps_instr_progress, &in, err)) {
        ps_progress_end(&in.bar);
        goto done;
    }
    ps_progress_end(&in.bar);
    res = json_object();
    json_object_set_new(res, "kind", json_string("sweep"));
    json_object_set_new(res, "provenance", ps_instr_provenance(&in, mode == PS_SWEEP_PAD ? "pad" : "move"));
    json_t *curve = ps_residue_stats_json(&st, err);
    if (!curve) goto done;
    json_object_set_new(res, "curve", curve);
    if (ps_instr_write(&in, "sweep.json", res, err)) goto done;
    /* the verdict and the period come from the JSON just written, so the two always agree */
    json_t *cs = json_object_get(curve, "chi_square"), *dp = json_object_get(curve, "dominant_period");
    double p = json_number_value(json_object_get(cs, "p_value"));
    double gap = json_number_value(json_object_get(curve, "gap_pp"));
    char ptext[32];
    ps_format_p(ptext, sizeof ptext, p);
    printf("mean accuracy %.3f, min %.3f, gap %.1f pp; chi-square p %s%s: %s", json_number_value(json_object_get(curve, "mean_accuracy")),
           json_number_value(json_object_get(curve, "min_accuracy")), gap, ptext[0] == '<' ? "" : "= ", ptext,
           json_string_value(json_object_get(curve, "verdict")));
    if (json_is_number(json_object_get(dp, "period")))
        printf(", dominant period %.4g", json_number_value(json_object_get(dp, "period")));
    printf("\n");
    rc = 0;
done:
    json_decref(res);
    ps_residue_stats_free(&st);
    ps_instr_free(&in);
    return rc;
}
