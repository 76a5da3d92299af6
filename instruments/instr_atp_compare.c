/* instr_atp_compare.c — the atp-compare instrument (instrument.h, ps_atp_compare_command): an
 * attribution-patching estimate measured against the exact knockout grid of the same run
 * (interventions/atp.h, ps_atp_compare), written as OUT/atp_compare.json with its figure, and its summary
 * on stdout. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "instruments/instrument.h"
#include "interventions/atp.h"

static json_t *load(const char *path, ps_error *err) {
    json_error_t je;
    json_t *d = json_load_file(path, 0, &je);
    if (!d) ps_fail(err, "%s: line %d: %s", path, je.line, je.text);
    return d;
}

int ps_atp_compare_command(const char *exact, const char *estimate, const char *times, const char *out, const ps_args *a,
                           ps_error *err) {
    json_t *ex = load(exact, err), *es = ex ? load(estimate, err) : NULL, *te = NULL, *ta = NULL, *res = NULL;
    int rc = -1;
    if (es && times) {
        char buf[8192];
        snprintf(buf, sizeof buf, "%s", times);
        char *comma = strchr(buf, ',');
        if (!comma) {
            ps_cli_usage(err, "--times: two files, EXACT.json,ATP.json");
            goto done;
        }
        *comma = '\0';
        if (!(te = load(buf, err)) || !(ta = load(comma + 1, err))) goto done;
    }
    if (!es) goto done;
    char *cmd = ps_args_command_line(a);
    res = ps_atp_compare(ex, es, te, ta, cmd, err);
    free(cmd);
    ps_out po = {.dir = out, .sink = a->sink};
    if (!res || ps_result_write(&po, "atp_compare.json", res, err)) goto done;
    ps_say(&po, "%s, fix %s: %lld cell x residue pairs, Pearson %.3f, Spearman %.3f (cells' worst residue: %.3f, %.3f)\n",
           json_string_value(json_object_get(res, "target")), json_string_value(json_object_get(res, "fix")),
           (long long)json_integer_value(json_object_get(res, "n_pairs")), json_number_value(json_object_get(res, "pearson")),
           json_number_value(json_object_get(res, "spearman")), json_number_value(json_object_get(res, "cell_pearson")),
           json_number_value(json_object_get(res, "cell_spearman")));
    ps_say(&po, "strong cells (exact worst residue <= -30 pp): %zu; recall in the estimate's top %lld: %.2f (worst rank %lld)\n",
           json_array_size(json_object_get(res, "strong")), (long long)json_integer_value(json_object_get(res, "top_k")),
           json_number_value(json_object_get(res, "recall")), (long long)json_integer_value(json_object_get(res, "max_strong_rank")));
    json_t *t = json_object_get(res, "times");
    if (json_object_get(t, "wall_ratio"))
        ps_say(&po, "exact %.1f s wall, %.1f s CPU; estimate %.1f s wall, %.1f s CPU: %.1fx faster (wall), %.1fx (CPU)\n",
               json_number_value(json_object_get(te, "wall_s")),
               json_number_value(json_object_get(te, "user_s")) + json_number_value(json_object_get(te, "sys_s")),
               json_number_value(json_object_get(ta, "wall_s")),
               json_number_value(json_object_get(ta, "user_s")) + json_number_value(json_object_get(ta, "sys_s")),
               json_number_value(json_object_get(t, "wall_ratio")), json_number_value(json_object_get(t, "cpu_ratio")));
    json_t *fn = json_object_get(res, "false_negatives");
    for (size_t i = 0; i < json_array_size(fn); i++) {
        json_t *c = json_array_get(fn, i);
        ps_say(&po, "  missed: layer %lld head %lld: exact %+.1f pp (dNLL %+.3f), estimated dNLL %+.3f, rank %lld\n",
               (long long)json_integer_value(json_object_get(c, "layer")), (long long)json_integer_value(json_object_get(c, "head")),
               json_number_value(json_object_get(c, "exact_worst_delta_accuracy_pp")),
               json_number_value(json_object_get(c, "exact_worst_delta_nll")),
               json_number_value(json_object_get(c, "estimated_worst_delta_nll")),
               (long long)json_integer_value(json_object_get(c, "estimate_rank")));
    }
    rc = 0;
done:
    json_decref(ex), json_decref(es), json_decref(te), json_decref(ta), json_decref(res);
    return rc;
}
