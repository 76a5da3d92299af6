/* cmd_sweep.c — `phasescope sweep`: accuracy per phase residue under prefix padding or move mode. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "instrument.h"
#include "dist.h"
#include "draw.h"
#include "stats.h"
#include "units.h"

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

/* The sweep's work: units (shift, batch) with per-query outcomes (interventions/units.h); a split run
 * (MPI ranks, --shard) gathers them and ps_sweep_finish adds them up in the one-process order. */
static int run(const ps_args *a, ps_error *err) {
    ps_instr in = {0};
    ps_partial part = {0};
    ps_instr_work wk = {0};
    int64_t *w = NULL;
    int rc = 1;
    static const char *const MODES[] = {"pad", "move", NULL};
    int mi = 0;
    int bad = ps_args_choice(a, "--mode", MODES, &mi, err);
    ps_sweep_mode mode = mi ? PS_SWEEP_MOVE : PS_SWEEP_PAD;
    if (!bad) bad = ps_instr_setup(&in, a, 1, err);
    if (ps_dist_agree(bad, err)) goto done;
    int64_t N = in.base.B, maxq = in.base.max_q, nb = ps_sweep_n_batches(N, in.batch), nu = in.P * nb;
    w = malloc((size_t)(nu ? nu : 1) * sizeof *w);
    json_t *meta = json_pack("{s:o, s:I}", "provenance", ps_instr_provenance(&in, mode == PS_SWEEP_PAD ? "pad" : "move"),
                             "period", (json_int_t)in.P);
    if (!w) {
        json_decref(meta);
        ps_fail(err, "out of memory for %lld work units", (long long)nu);
        goto done;
    }
    for (int64_t u = 0; u < nu; u++) w[u] = (N - u % nb * in.batch < in.batch ? N - u % nb * in.batch : in.batch) * maxq;
    if (ps_instr_partial_init(&in, &part, nu, meta, err) || ps_partial_add(&part, "ok", PS_PART_I32, w, err) < 0 ||
        ps_partial_add(&part, "logprob", PS_PART_F64, w, err) < 0 || ps_partial_add(&part, "rho", PS_PART_I32, w, err) < 0)
        goto done;
    ps_sweep_unit_weights(N, in.batch, in.P, in.base.T, mode, w);
    if (ps_instr_split(&in, w, NULL, nu, 0, &wk, err)) goto done;
    int r = ps_sweep_units(&in.m, &in.base, &in.task, in.fam, mode, in.P, in.seed, in.batch, wk.u0, wk.u1, part.arr[0].data,
                           part.arr[1].data, part.arr[2].data, ps_instr_progress, &in, err);
    ps_progress_end(&in.bar);
    int fin = ps_instr_collect(&in, &part, &wk, r, err);
    if (fin < 0 || (fin == 1 && ps_sweep_finish(&part, in.out_dir, err))) goto done;
    rc = 0;
done:
    free(w);
    ps_instr_work_free(&wk);
    ps_partial_free(&part);
    ps_instr_free(&in);
    return rc;
}

int ps_sweep_finish(const ps_partial *p, const char *out_dir, ps_error *err) {
    ps_residue_stats st = {0};
    json_t *res = NULL;
    int rc = -1;
    int64_t P = json_integer_value(json_object_get(p->meta, "period"));
    int iok = ps_partial_find(p, "ok"), ilp = ps_partial_find(p, "logprob"), irho = ps_partial_find(p, "rho");
    if (iok < 0 || ilp < 0 || irho < 0 || P < 1) return ps_fail(err, "a sweep's partial result lacks its outcomes or period");
    if (ps_residue_stats_init(&st, P, err)) return -1;
    ps_residue_stats_add_items(&st, p->arr[iok].data, p->arr[ilp].data, p->arr[irho].data, p->arr[iok].off[p->n_units]);
    res = json_object();
    json_object_set_new(res, "kind", json_string("sweep"));
    json_object_set(res, "provenance", json_object_get(p->meta, "provenance"));
    json_t *curve = ps_residue_stats_json(&st, err);
    if (!curve) goto done;
    json_object_set_new(res, "curve", curve);
    if (ps_result_write(out_dir, "sweep.json", res, err)) goto done;
    /* the verdict and the period come from the JSON just written, so the two always agree */
    json_t *cs = json_object_get(curve, "chi_square"), *dp = json_object_get(curve, "dominant_period");
    double pv = json_number_value(json_object_get(cs, "p_value"));
    double gap = json_number_value(json_object_get(curve, "gap_pp"));
    char ptext[32];
    ps_format_p(ptext, sizeof ptext, pv);
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
    return rc;
}
