/* cmd_gatecycle.c — `phasescope gatecycle`: roll per-offset gate parameters, sweep before and after. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gatecycle.h"
#include "instrument.h"
#include "stats.h"

static const char HELP[] =
    "usage: phasescope gatecycle --layer L --shift K [--head G] [--branch key|value|both]\n"
    "                            [--params gate|payload|all] [--save DIR] [--model DIR] [--period P]\n"
    "                            [--family NAME] [--n N] [--seed S] [--batch B] [--out DIR]\n"
    "\n"
    "Gate offset cycling (SPEC §6): rolls layer L's per-offset gate parameters by K (u'_i = u_{(i-K) mod W},\n"
    "c'_i likewise; with --params payload|all the per-offset payload maps too), so a gate that peaked at\n"
    "offset r peaks at r+K; runs the prefix-padding sweep before and after and reports both curves and the\n"
    "best-aligning shift s (maximising the correlation of A_after(rho) with A_before(rho - s mod P)), also\n"
    "signed in (-P/2, P/2]. Writes OUT/gatecycle.json.\n"
    "\n" PS_INSTR_HELP
    "  --layer L       layer to cycle (required)\n"
    "  --shift K       offsets to roll by (required; any integer, taken mod W)\n"
    "  --head G        one KV head (default: all)\n"
    "  --branch B      key, value or both (default both)\n"
    "  --params X      gate (default), payload or all\n"
    "  --save DIR      also write the cycled checkpoint to DIR\n";

int ps_cmd_gatecycle(int argc, char **argv) {
    if (ps_cli_wants_help(argc, argv)) {
        fputs(HELP, stdout);
        return 0;
    }
    ps_flag flags[] = {PS_INSTR_FLAGS,          PS_FLAG("--layer", true),  PS_FLAG("--shift", true),
                       PS_FLAG("--head", true), PS_FLAG("--branch", true), PS_FLAG("--params", true),
                       PS_FLAG("--save", true)};
    int npos;
    const char *pos[1];
    ps_error err = {{0}};
    ps_instr in = {0};
    ps_residue_stats before = {0}, after = {0};
    json_t *res = NULL;
    int rc = 1;
    int64_t layer = 0, shift = 0, head = -1;
    int branches = PS_CYCLE_KEY | PS_CYCLE_VALUE, params = PS_CYCLE_GATE;
    if (ps_cli_parse(argc, argv, flags, PS_INSTR_N_FLAGS + 6, pos, 0, &npos, &err)) goto done;
    if (ps_cli_require(flags, PS_INSTR_N_FLAGS + 6, &err, "--layer", "--shift", NULL)) goto done;
    if (ps_cli_int("--layer", flags[7].value, -1000000, 1000000, &layer, &err) ||
        ps_cli_int("--shift", flags[8].value, -1000000, 1000000, &shift, &err) ||
        (flags[9].value && ps_cli_int("--head", flags[9].value, 0, 1000000, &head, &err)))
        goto done;
    if (flags[10].value) {
        if (!strcmp(flags[10].value, "key")) branches = PS_CYCLE_KEY;
        else if (!strcmp(flags[10].value, "value")) branches = PS_CYCLE_VALUE;
        else if (strcmp(flags[10].value, "both")) {
            ps_fail(&err, "--branch %s: expected key, value or both", flags[10].value);
            goto done;
        }
    }
    if (flags[11].value) {
        if (!strcmp(flags[11].value, "payload")) params = PS_CYCLE_PAYLOAD;
        else if (!strcmp(flags[11].value, "all")) params = PS_CYCLE_GATE | PS_CYCLE_PAYLOAD;
        else if (strcmp(flags[11].value, "gate")) {
            ps_fail(&err, "--params %s: expected gate, payload or all", flags[11].value);
            goto done;
        }
    }
    if (ps_instr_setup(&in, "gatecycle", argc, argv, flags, 1, &err)) goto done;
    /* validate the cycle first (bad layer/head/model fail before any sweep) on a scratch copy of nothing:
     * cycling by 0 checks every precondition and changes nothing */
    if (ps_gate_cycle(&in.m, (int)layer, (int)head, branches, params, 0, &err)) {
        if (strncmp(err.msg, "--", 2)) ps_fail_prefix(&err, "--model %s: ", in.model_dir);
        goto done;
    }
    if (ps_sweep_run(&in.m, &in.base, &in.task, in.fam, PS_SWEEP_PAD, in.P, in.seed, in.batch, &before, ps_instr_progress,
                     &in, &err))
        goto done;
    ps_progress_end(&in.bar);
    if (ps_gate_cycle(&in.m, (int)layer, (int)head, branches, params, shift, &err)) goto done;
    if (ps_sweep_run(&in.m, &in.base, &in.task, in.fam, PS_SWEEP_PAD, in.P, in.seed, in.batch, &after, ps_instr_progress,
                     &in, &err))
        goto done;
    ps_progress_end(&in.bar);
    if (flags[12].value) {
        char note[96];
        snprintf(note, sizeof note, "layer %lld shift %lld", (long long)layer, (long long)shift);
        if (ps_model_set_meta(&in.m, "phasescope.gatecycle", note, &err) || ps_model_save(&in.m, flags[12].value, &err))
            goto done;
        printf("wrote the cycled checkpoint to %s\n", flags[12].value);
    }
    double *ab = malloc((size_t)in.P * sizeof(double)), *aa = malloc((size_t)in.P * sizeof(double)), corr;
    for (int64_t r = 0; r < in.P; r++) {
        ab[r] = ps_residue_accuracy(&before, r);
        aa[r] = ps_residue_accuracy(&after, r);
    }
    int64_t s = ps_best_shift(ab, aa, in.P, &corr), signed_s = s > in.P / 2 ? s - in.P : s;
    free(ab);
    free(aa);
    res = json_object();
    json_object_set_new(res, "kind", json_string("gatecycle"));
    json_object_set_new(res, "provenance", ps_instr_provenance(&in, "pad"));
    json_t *cyc = json_object();
    json_object_set_new(cyc, "layer", json_integer(layer));
    json_object_set_new(cyc, "shift", json_integer(shift));
    json_object_set_new(cyc, "head", head < 0 ? json_string("all") : json_integer(head));
    json_object_set_new(cyc, "branch", json_string(branches == 3 ? "both" : branches == 1 ? "key" : "value"));
    json_object_set_new(cyc, "params", json_string(params == 3 ? "all" : params == 1 ? "gate" : "payload"));
    json_object_set_new(res, "cycle", cyc);
    json_object_set_new(res, "before", ps_residue_stats_json(&before));
    json_object_set_new(res, "after", ps_residue_stats_json(&after));
    json_object_set_new(res, "best_shift", json_integer(s));
    json_object_set_new(res, "best_shift_signed", json_integer(signed_s));
    json_object_set_new(res, "best_shift_correlation", json_real(corr));
    if (ps_instr_write(&in, "gatecycle.json", res, &err)) goto done;
    printf("cycled layer %lld by %lld: accuracy curve shifts by %lld (signed %+lld, correlation %.3f)\n", (long long)layer,
           (long long)shift, (long long)s, (long long)signed_s, corr);
    rc = 0;
done:
    if (rc) fprintf(stderr, "phasescope gatecycle: %s\n", err.msg);
    json_decref(res);
    ps_residue_stats_free(&before);
    ps_residue_stats_free(&after);
    ps_instr_free(&in);
    return rc;
}
