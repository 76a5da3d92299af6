/* instr_gates.c — the gates instrument (instrument.h, ps_gates_command): the gate statistics of any
 * family (its gate data: core's gates and gate_taps entries, read by interventions/units.h) as work units split over shards and MPI
 * ranks (interventions/units.h), a training log's summary, and the finish (ps_gates_finish: rank 0, or
 * `phasescope merge`), which pools the recorded gate distributions in the one-process order. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "scaleout/dist.h"
#include "instruments/instrument.h"
#include "gates/chgates.h"
#include "gates/gates.h"
#include "interventions/units.h"

/* The gate statistics' work: the batches of the shift-0 prompts, each unit keeping the gate distributions
 * its hooks saw (the family's records, core/runtime.h ps_gate_info); a split run gathers them and ps_gates_finish pools them in
 * the one-process order. */
int ps_gates_command(const ps_args *a, const ps_gates_request *rq, ps_error *err) {
    ps_instr in = {0};
    ps_partial part = {0};
    ps_instr_work wk = {0};
    ps_shifted s = {0};
    int have_s = 0, rc = -1;
    ps_gate_info g = {0};
    int64_t *w = NULL, *wf = NULL, *ev_off = NULL;
    json_t *evo = NULL;
    int bad = ps_instr_setup(&in, a, 1, err);
    const ps_runtime *rt = &in.rt;
    if (!bad && ps_gate_info_of(rt, &g, err)) bad = rt->family->gates.info ? -1 : ps_fail_prefix(err, "%s: ", in.model_dir);
    if (!bad) {
        bad = ps_make_shifted(&in.base, &in.task, in.fam, PS_SWEEP_PAD, 1, 0, in.seed, rt->max_pos, &s, err);
        have_s = !bad;
    }
    if (!bad && rq->log && !(evo = ps_gate_log(rt, &g, rq->log, err))) bad = ps_fail_prefix(err, "--log: ");
    if (ps_dist_agree(bad, err)) goto done;
    const char *records = g.records;
    int ints = g.ints;
    int64_t N = s.b.B, nu = ps_sweep_n_batches(N, in.batch), B = in.batch < N ? in.batch : N;
    json_t *meta = json_pack("{s:o, s:o}", "provenance", ps_instr_provenance(&in, NULL), "training", evo ? evo : json_null());
    evo = NULL;
    /* per-channel gates: the accumulator's layout goes with the records (the finish reads no config) */
    if (g.layout) {
        json_object_set_new(meta, "gate_layout", g.layout);
        g.layout = NULL;
    }
    w = malloc((size_t)(nu ? nu : 1) * sizeof *w);
    wf = malloc((size_t)(nu ? nu : 1) * sizeof *wf);
    ev_off = malloc((size_t)(nu + 1) * sizeof *ev_off);
    if (!w || !wf || !ev_off) {
        json_decref(meta);
        ps_fail(err, "out of memory for %lld work units", (long long)nu);
        goto done;
    }
    for (int64_t u = 0; u < nu; u++) {
        int64_t n = N - u * B < B ? N - u * B : B, ne, nf;
        if (ps_gate_unit_size(rt, n, s.b.T, &ne, &nf, err)) {
            json_decref(meta);
            goto done;
        }
        w[u] = ne * ints;
        wf[u] = nf;
    }
    if (ps_instr_partial_init(&in, &part, nu, meta, err) || ps_partial_add(&part, records, PS_PART_I32, w, err) < 0 ||
        ps_partial_add(&part, "alpha", PS_PART_F32, wf, err) < 0)
        goto done;
    for (int64_t u = 0; u < nu; u++) w[u] = N - u * B < B ? N - u * B : B;
    if (ps_instr_split(&in, w, NULL, nu, 0, &wk, err)) goto done;
    for (int64_t u = 0; u <= nu; u++) ev_off[u] = part.arr[0].off[u] / ints; /* records, not ints */
    /* unit by unit (each is independent: the same records as one call over the range), so that the
     * caller's progress callback (the API's) sees each batch and can stop the run there */
    int r = 0;
    for (int64_t u = wk.u0; u < wk.u1 && !r; u++) {
        r = ps_gate_units(rt, &s, in.batch, u, u + 1, ev_off, part.arr[1].off, part.arr[0].data, part.arr[1].data, err);
        if (!r && in.progress && in.progress(u + 1 - wk.u0, wk.u1 - wk.u0, in.progress_user))
            r = ps_fail(err, "cancelled after %lld of %lld batches", (long long)(u + 1 - wk.u0), (long long)(wk.u1 - wk.u0));
    }
    int fin = ps_instr_collect(&in, &part, &wk, r, err);
    if (fin < 0 || (fin == 1 && ps_gates_finish(&part, &in.out, err))) goto done;
    rc = 0;
done:
    json_decref(evo);
    json_decref(g.layout);
    free(w);
    free(wf);
    free(ev_off);
    if (have_s) ps_shifted_free(&s);
    ps_instr_work_free(&wk);
    ps_partial_free(&part);
    ps_instr_free(&in);
    return rc;
}

/* ---- the finish ---- */

/* The per-channel statistics' result: the accumulator from the partial's gate_layout (the family's,
 * written by the run: its ps_gate_info), the records replayed, "gates.model" as the family named it. */
static int finish_chgates(const ps_partial *p, const ps_out *out, ps_error *err) {
    json_t *prov = json_object_get(p->meta, "provenance"), *res = NULL;
    ps_chgate_acc acc = {0};
    const char *model = NULL;
    int rc = -1;
    if (ps_chgate_layout_acc(json_object_get(p->meta, "gate_layout"), &acc, &model, err)) return -1;
    if (ps_chgate_replay(&acc, p->arr[0].data, p->arr[0].off[p->n_units] / PS_CHGATES_RECORD_INTS, p->arr[1].data,
                           p->arr[1].off[p->n_units], err))
        goto done;
    res = json_object();
    json_object_set_new(res, "kind", json_string("gates"));
    json_object_set(res, "provenance", prov);
    json_object_set_new(res, "thresholds", json_pack("{s:f}", "concentrated", PS_GATE_CONCENTRATED));
    json_t *g = ps_chgate_acc_to_json(&acc);
    if (!g) {
        ps_fail(err, "out of memory for the gate statistics");
        goto done;
    }
    json_object_set_new(g, "model", json_string(model));
    json_object_set_new(res, "gates", g);
    json_t *evo = json_object_get(p->meta, "training");
    if (json_is_array(evo)) json_object_set(res, "training", evo);
    if (ps_result_write(out, "gates.json", res, err)) goto done;
    ps_chgate_print(&acc);
    rc = 0;
done:
    json_decref(res);
    ps_chgate_acc_free(&acc);
    return rc;
}

/* provenance.config of the partial result, parsed */
static int partial_config(const ps_partial *p, ps_config *cfg, ps_error *err) {
    char *cj = json_dumps(json_object_get(json_object_get(p->meta, "provenance"), "config"), JSON_COMPACT);
    if (!cj) return ps_fail(err, "a gate-statistics partial result lacks its model config");
    int bad = ps_config_parse(cj, strlen(cj), "the partial result's provenance.config", cfg, err);
    free(cj);
    return bad ? -1 : 0;
}

/* A compressed model's per-head gates. */
static int finish_heads(const ps_partial *p, const ps_out *out, ps_error *err) {
    ps_gate_acc acc = {0};
    ps_config cfg;
    json_t *res = NULL, *prov = json_object_get(p->meta, "provenance");
    int rc = -1;
    if (partial_config(p, &cfg, err) || ps_gate_acc_init(&acc, &cfg, err)) return -1;
    if (ps_gate_acc_replay(&acc, p->arr[0].data, p->arr[0].off[p->n_units] / PS_GATES_EVENT_INTS, p->arr[1].data,
                           p->arr[1].off[p->n_units], err))
        goto done;
    res = json_object();
    json_object_set_new(res, "kind", json_string("gates"));
    json_object_set(res, "provenance", prov);
    json_t *stats = ps_gate_acc_to_json(&acc, &cfg);
    json_object_set_new(res, "thresholds", json_pack("{s:f}", "concentrated", PS_GATE_CONCENTRATED));
    json_object_set_new(res, "gates", stats);
    json_t *evo = json_object_get(p->meta, "training");
    if (json_is_array(evo)) json_object_set(res, "training", evo);
    if (ps_result_write(out, "gates.json", res, err)) goto done;
    ps_say(out, "%-6s %-5s %-6s %9s %9s %5s  %s\n", "layer", "head", "branch", "N_static", "N_input", "peak", "label");
    for (int l = 0; l < cfg.n_layers; l++)
        for (int g = 0; g < cfg.n_kv_heads; g++)
            for (int b = 0; b < 2; b++) {
                ps_gate_stat st;
                ps_gate_acc_stat(&acc, l, g, (ps_branch)b, &st);
                ps_say(out, "%-6d %-5d %-6s %9.3f %9.3f %5d  %s\n", l, g, b ? "value" : "key", st.N_static, st.N_input, st.peak,
                       ps_gate_label(&st));
            }
    rc = 0;
done:
    json_decref(res);
    ps_gate_acc_free(&acc);
    return rc;
}

/* Per-channel records carry their accumulator's layout (gate_layout); per-head ones are the compressed
 * attention's "events" (the family's ps_gate_info). */
int ps_gates_finish(const ps_partial *p, const ps_out *out, ps_error *err) {
    if (p->n_arr != 2 || ps_partial_find(p, "alpha") != 1)
        return ps_fail(err, "a gate-statistics partial result lacks its records");
    if (json_object_get(p->meta, "gate_layout")) return finish_chgates(p, out, err);
    if (ps_partial_find(p, "events") == 0) return finish_heads(p, out, err);
    return ps_fail(err, "a gate-statistics partial result lacks its records");
}
