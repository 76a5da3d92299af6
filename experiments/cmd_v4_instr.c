/* cmd_v4_instr.c — `phasescope gates` on a phasescope model with the channel attention (per-channel gates,
 * gates/chgates.h) and the summary of its training log's per-channel gate records. (The instruments on
 * DeepSeek-V4 checkpoints run on the common path: experiments/instrument.c opens the checkpoint and
 * its runtime, interventions/v4_instr.h.) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "experiments/cli.h"
#include "experiments/cmd_v4.h"
#include "core/fileio.h"
#include "gates/gates.h"
#include "experiments/instrument.h"
#include "viz/results_check.h"

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
