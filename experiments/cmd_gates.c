/* cmd_gates.c — `phasescope gates`: effective offsets of every gate, and how they formed in training. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/dist.h"
#include "core/fileio.h"
#include "gates/gates.h"
#include "experiments/cmd_v4.h"
#include "experiments/instrument.h"
#include "interventions/units.h"

static int run(const ps_args *a, ps_error *err);

static const ps_flag_spec FLAGS[] = {
    {"--log", "RUN/train.jsonl", "a train.jsonl to summarise", 0},
    PS_INSTR_FLAGS,
    PS_V4_TASK_FLAG,
    {0},
};

const ps_command ps_cmd_gates = {
    .name = "gates",
    .summary = "gate concentration: effective offsets per layer, KV head and branch",
    .description =
        "Gate concentration (docs/results-schema.md, `gates.json`), pooled over every window of the evaluation\n"
        "prompts (shift 0): per layer, KV head and branch, mean_gate (a distribution over the W offsets), N_static = exp(H(mean_gate)),\n"
        "N_input = E[exp(H(alpha))], the peak offset, and a label: static (N_static <= 2 and N_input <= 2),\n"
        "input-dependent (N_input <= 2 < N_static) or diffuse (N_input > 2). With --log, also how these evolved\n"
        "over the gate records of a training log. Writes OUT/gates.json. DeepSeek-V4 checkpoints and the channel attention:\n"
        "per-channel gates, per channel and pooled (docs/results-schema.md, \"Per-channel gates\").\n",
    .flags = FLAGS,
    .run = run,
};

/* Summarise the gate records of a training log: per (layer, head, branch) first/last values, the first
 * step where N_static <= 2, and whether the peak stayed put over the last three records. */
static json_t *summarise_log(const char *path, ps_error *err) {
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
        if (json_is_string(json_object_get(o, "type")) && !strcmp(json_string_value(json_object_get(o, "type")), "gates"))
            json_array_append(recs, o);
        json_decref(o);
    }
    free(text);
    size_t nr = json_array_size(recs);
    if (nr == 0) {
        json_decref(recs);
        ps_fail(err, "%s: no gate records (a compressed model's training log has \"type\": \"gates\" lines)", path);
        return NULL;
    }
    json_t *out = json_array(), *first = json_array_get(recs, 0);
    json_t *layers = json_object_get(first, "layers");
    for (size_t li = 0; li < json_array_size(layers); li++) {
        json_t *heads = json_object_get(json_array_get(layers, li), "heads");
        for (size_t hi = 0; hi < json_array_size(heads); hi++)
            for (int b = 0; b < 2; b++) {
                const char *br = b ? "value" : "key";
                json_t *e = json_object(), *steps = json_array(), *ns = json_array(), *ni = json_array(), *pk = json_array();
                json_t *conc = json_null();
                for (size_t r = 0; r < nr; r++) {
                    json_t *rec = json_array_get(recs, r);
                    json_t *bo = json_object_get(
                        json_array_get(json_object_get(json_array_get(json_object_get(rec, "layers"), li), "heads"), hi), br);
                    double s = json_number_value(json_object_get(bo, "N_static"));
                    json_array_append_new(steps, json_integer(json_integer_value(json_object_get(rec, "step"))));
                    json_array_append_new(ns, json_real(s));
                    json_array_append_new(ni, json_real(json_number_value(json_object_get(bo, "N_input"))));
                    json_array_append_new(pk, json_integer(json_integer_value(json_object_get(bo, "peak"))));
                    if (json_is_null(conc) && s <= PS_GATE_CONCENTRATED)
                        conc = json_integer(json_integer_value(json_object_get(rec, "step")));
                }
                int stable = 1;
                json_int_t last_peak = json_integer_value(json_array_get(pk, nr - 1));
                for (size_t r = nr >= 3 ? nr - 3 : 0; r < nr; r++) stable &= json_integer_value(json_array_get(pk, r)) == last_peak;
                json_object_set_new(e, "layer", json_integer((json_int_t)li));
                json_object_set_new(e, "head", json_integer((json_int_t)hi));
                json_object_set_new(e, "branch", json_string(br));
                json_object_set_new(e, "steps", steps);
                json_object_set_new(e, "N_static", ns);
                json_object_set_new(e, "N_input", ni);
                json_object_set_new(e, "peak", pk);
                json_object_set_new(e, "concentrated_at_step", conc);
                json_object_set_new(e, "final_peak", json_integer(last_peak));
                json_object_set_new(e, "peak_stable_last_3", json_boolean(stable));
                json_array_append_new(out, e);
            }
    }
    json_decref(recs);
    return out;
}

/* A DeepSeek-V4 checkpoint's gates: units = batches of the shift-0 prompts, each keeping its compressors'
 * gate distributions as they fired (interventions/v4_instr.h); ps_gates_finish pools them in order. */
static int run_v4(ps_instr *in, ps_error *err) {
    ps_partial part = {0};
    ps_instr_work wk = {0};
    ps_shifted s = {0};
    int64_t *w = NULL, *wf = NULL, *ev_off = NULL;
    int rc = 1, have_s = 0, any = 0;
    const ps_v4_config *c = &in->v4.cfg;
    for (int l = 0; l < c->n_layers; l++) any |= c->attn_type[l] != PS_V4_SLIDING;
    int bad = any ? 0 : ps_fail(err, "%s: no CSA or HCA layer (every layer is sliding-window attention): there are no gates", in->model_dir);
    if (!bad) {
        bad = ps_make_shifted(&in->base, &in->task, in->fam, PS_SWEEP_PAD, 1, 0, in->seed, in->rt.max_pos, &s, err);
        have_s = !bad;
    }
    if (ps_dist_agree(bad, err)) goto done;
    int64_t N = s.b.B, nu = ps_sweep_n_batches(N, in->batch), B = in->batch < N ? in->batch : N;
    json_t *meta = json_pack("{s:o}", "provenance", ps_instr_provenance(in, NULL));
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
        ps_v4_gates_unit_size(c, n, s.b.T, &ne, &nf);
        w[u] = ne * PS_V4_GATES_EVENT_INTS;
        wf[u] = nf;
    }
    if (ps_instr_partial_init(in, &part, nu, meta, err) || ps_partial_add(&part, "v4_events", PS_PART_I32, w, err) < 0 ||
        ps_partial_add(&part, "alpha", PS_PART_F32, wf, err) < 0)
        goto done;
    for (int64_t u = 0; u < nu; u++) w[u] = N - u * B < B ? N - u * B : B;
    if (ps_instr_split(in, w, NULL, nu, 0, &wk, err)) goto done;
    for (int64_t u = 0; u <= nu; u++) ev_off[u] = part.arr[0].off[u] / PS_V4_GATES_EVENT_INTS;
    int r = ps_v4_gates_units(&in->v4, &in->v4_task, &s, in->batch, wk.u0, wk.u1, ev_off, part.arr[1].off, part.arr[0].data,
                              part.arr[1].data, err);
    int fin = ps_instr_collect(in, &part, &wk, r, err);
    if (fin < 0 || (fin == 1 && ps_gates_finish(&part, in->out_dir, err))) goto done;
    rc = 0;
done:
    free(w);
    free(wf);
    free(ev_off);
    if (have_s) ps_shifted_free(&s);
    ps_instr_work_free(&wk);
    ps_partial_free(&part);
    return rc;
}

/* A DeepSeek-V4 run's finish: the accumulator from provenance.config's schedule, the records replayed. */
static int finish_v4(const ps_partial *p, const char *out_dir, ps_error *err) {
    json_t *prov = json_object_get(p->meta, "provenance"), *cfg = json_object_get(prov, "config"), *att = json_object_get(cfg, "attention");
    json_t *lt = json_object_get(att, "layer_types"), *cr = json_object_get(att, "compress_rates");
    int L = (int)json_integer_value(json_object_get(cfg, "n_layers"));
    if (L < 1 || L > PS_V4_MAX_LAYERS || (int)json_array_size(lt) != L || (int)json_array_size(cr) != L || p->n_arr != 2)
        return ps_fail(err, "a DeepSeek-V4 gate-statistics partial result lacks its attention schedule or records");
    ps_v4_attn_type types[PS_V4_MAX_LAYERS];
    int64_t rates[PS_V4_MAX_LAYERS];
    for (int l = 0; l < L; l++) {
        const char *nm = json_string_value(json_array_get(lt, (size_t)l));
        int k = 0;
        while (k < 3 && (!nm || strcmp(nm, ps_v4_attn_type_name((ps_v4_attn_type)k)))) k++;
        if (k == 3) return ps_fail(err, "a DeepSeek-V4 gate-statistics partial result: layer %d has an unknown type", l);
        types[l] = (ps_v4_attn_type)k;
        rates[l] = json_integer_value(json_array_get(cr, (size_t)l));
    }
    ps_chgate_acc acc = {0};
    json_t *res = NULL;
    int rc = -1;
    if (ps_v4_gates_acc_init(&acc, L, types, rates, json_integer_value(json_object_get(cfg, "head_dim")),
                             json_integer_value(json_object_get(cfg, "index_head_dim")), err))
        return -1;
    if (ps_v4_gates_replay(&acc, p->arr[0].data, p->arr[0].off[p->n_units] / PS_V4_GATES_EVENT_INTS, p->arr[1].data,
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
    json_object_set_new(g, "model", json_string("deepseek_v4"));
    json_object_set_new(res, "gates", g);
    if (ps_result_write(out_dir, "gates.json", res, err)) goto done;
    ps_chgate_print(&acc);
    rc = 0;
done:
    json_decref(res);
    ps_chgate_acc_free(&acc);
    return rc;
}

/* The gate statistics' work: the batches of the shift-0 prompts, each unit keeping the gate distributions
 * its hooks saw (interventions/units.h); a split run gathers them and ps_gates_finish pools them in the
 * one-process order. */
static int run(const ps_args *a, ps_error *err) {
    if (ps_instr_is_v4(a) && ps_args_get(a, "--log"))
        return ps_cli_usage(err, "--log: a DeepSeek-V4 checkpoint has no phasescope training log"), 1;
    ps_instr in = {0};
    ps_partial part = {0};
    ps_instr_work wk = {0};
    ps_shifted s = {0};
    int have_s = 0;
    int64_t *w = NULL;
    json_t *evo = NULL;
    int rc = 1;
    int bad = ps_instr_setup(&in, a, 1, err);
    if (ps_dist_agree(bad, err)) goto done;
    if (in.is_v4) { /* a DeepSeek-V4 checkpoint: its compressors' per-channel gates, split the same way */
        rc = run_v4(&in, err);
        goto done;
    }
    if (in.m.cfg.kind == PS_ATTN_CHANNEL) { /* per-channel gates (experiments/cmd_v4_instr.c): whole on rank 0 */
        int r = ps_instr_whole_begin(a, "the per-channel gate statistics of the channel attention", err);
        rc = ps_instr_whole_end(r == 1 ? ps_v4_model_gates(&in, ps_args_get(a, "--log"), err) : r, err) ? 1 : 0;
        goto done;
    }
    if (in.m.cfg.kind != PS_ATTN_COMPRESSED)
        bad = ps_fail(err, "gate statistics need a compressed-attention model (this one has full attention)");
    if (!bad) {
        bad = ps_make_shifted(&in.base, &in.task, in.fam, PS_SWEEP_PAD, 1, 0, in.seed, in.m.cfg.max_seq_len, &s, err);
        have_s = !bad;
    }
    const char *train_log = ps_args_get(a, "--log");
    if (!bad && train_log && !(evo = summarise_log(train_log, err))) bad = ps_fail_prefix(err, "--log: ");
    size_t want = (size_t)2 * (size_t)in.m.cfg.n_layers * (size_t)in.m.cfg.n_kv_heads;
    if (!bad && evo && json_array_size(evo) != want)
        bad = ps_fail(err, "--log %s: its gate records have %zu (layer, KV head, branch) entries, but the model has %lld layers x %lld "
                           "KV heads (%zu): the log is of another model",
                      train_log, json_array_size(evo), (long long)in.m.cfg.n_layers, (long long)in.m.cfg.n_kv_heads, want);
    if (ps_dist_agree(bad, err)) goto done;
    int64_t N = s.b.B, nu = ps_sweep_n_batches(N, in.batch), B = in.batch < N ? in.batch : N;
    json_t *meta = json_pack("{s:o, s:o}", "provenance", ps_instr_provenance(&in, NULL), "training", evo ? evo : json_null());
    evo = NULL;
    w = malloc((size_t)(nu ? nu : 1) * sizeof *w);
    int64_t *wf = malloc((size_t)(nu ? nu : 1) * sizeof *wf);
    if (!w || !wf) {
        free(wf);
        json_decref(meta);
        ps_fail(err, "out of memory for %lld work units", (long long)nu);
        goto done;
    }
    for (int64_t u = 0; u < nu; u++) {
        int64_t n = N - u * B < B ? N - u * B : B, ne, nf;
        ps_gates_unit_size(&in.m.cfg, n, s.b.T, &ne, &nf);
        w[u] = ne * PS_GATES_EVENT_INTS;
        wf[u] = nf;
    }
    int e = ps_instr_partial_init(&in, &part, nu, meta, err) || ps_partial_add(&part, "events", PS_PART_I32, w, err) < 0 ||
            ps_partial_add(&part, "alpha", PS_PART_F32, wf, err) < 0;
    free(wf);
    if (e) goto done;
    for (int64_t u = 0; u < nu; u++) w[u] = N - u * B < B ? N - u * B : B;
    if (ps_instr_split(&in, w, NULL, nu, 0, &wk, err)) goto done;
    /* event offsets in events (each event is PS_GATES_EVENT_INTS ints) */
    int64_t *ev_off = malloc((size_t)(nu + 1) * sizeof *ev_off);
    if (!ev_off) {
        ps_fail(err, "out of memory");
        goto done;
    }
    for (int64_t u = 0; u <= nu; u++) ev_off[u] = part.arr[0].off[u] / PS_GATES_EVENT_INTS;
    int r = ps_gates_units(&in.m, &s, in.batch, wk.u0, wk.u1, ev_off, part.arr[1].off, part.arr[0].data, part.arr[1].data, err);
    free(ev_off);
    int fin = ps_instr_collect(&in, &part, &wk, r, err);
    if (fin < 0 || (fin == 1 && ps_gates_finish(&part, in.out_dir, err))) goto done;
    rc = 0;
done:
    json_decref(evo);
    free(w);
    if (have_s) ps_shifted_free(&s);
    ps_instr_work_free(&wk);
    ps_partial_free(&part);
    ps_instr_free(&in);
    return rc;
}

int ps_gates_finish(const ps_partial *p, const char *out_dir, ps_error *err) {
    if (ps_partial_find(p, "v4_events") >= 0) return finish_v4(p, out_dir, err);
    ps_gate_acc acc = {0};
    ps_config cfg;
    json_t *res = NULL, *prov = json_object_get(p->meta, "provenance");
    int rc = -1;
    char *cj = json_dumps(json_object_get(prov, "config"), JSON_COMPACT);
    if (!cj || p->n_arr != 2) {
        free(cj);
        return ps_fail(err, "a gate-statistics partial result lacks its model config or records");
    }
    int bad = ps_config_parse(cj, strlen(cj), "the partial result's provenance.config", &cfg, err);
    free(cj);
    if (bad || ps_gate_acc_init(&acc, &cfg, err)) return -1;
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
    if (ps_result_write(out_dir, "gates.json", res, err)) goto done;
    printf("%-6s %-5s %-6s %9s %9s %5s  %s\n", "layer", "head", "branch", "N_static", "N_input", "peak", "label");
    for (int l = 0; l < cfg.n_layers; l++)
        for (int g = 0; g < cfg.n_kv_heads; g++)
            for (int b = 0; b < 2; b++) {
                ps_gate_stat st;
                ps_gate_acc_stat(&acc, l, g, (ps_branch)b, &st);
                printf("%-6d %-5d %-6s %9.3f %9.3f %5d  %s\n", l, g, b ? "value" : "key", st.N_static, st.N_input, st.peak,
                       ps_gate_label(&st));
            }
    rc = 0;
done:
    json_decref(res);
    ps_gate_acc_free(&acc);
    return rc;
}
