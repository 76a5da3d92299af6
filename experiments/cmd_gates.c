/* cmd_gates.c — `phasescope gates`: effective offsets of every gate, and how they formed in training. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fileio.h"
#include "gates.h"
#include "cmd_v4.h"
#include "instrument.h"

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
        "over the gate records of a training log. Writes OUT/gates.json. DeepSeek-V4 checkpoints and the v4 attention:\n"
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

static int run(const ps_args *a, ps_error *err) {
    if (ps_v4_instr_wanted(a)) return ps_v4_cmd_gates(a, err); /* DeepSeek-V4 checkpoint: experiments/cmd_v4_instr.c */
    ps_instr in = {0};
    ps_gate_acc acc = {0};
    ps_hooks h;
    ps_hooks_init(&h);
    json_t *res = NULL;
    int rc = 1;
    if (ps_instr_setup(&in, a, 1, err)) goto done;
    if (in.m.cfg.kind == PS_ATTN_V4) { /* per-channel gates: experiments/cmd_v4_instr.c */
        rc = ps_v4_model_gates(&in, ps_args_get(a, "--log"), err) ? 1 : 0;
        goto done;
    }
    if (ps_gate_acc_init(&acc, &in.m.cfg, err) || ps_gate_acc_watch(&acc, &h, &in.m.cfg, err)) goto done;
    ps_shifted s;
    if (ps_make_shifted(&in.base, &in.task, in.fam, PS_SWEEP_PAD, 1, 0, in.seed, in.m.cfg.max_seq_len, &s, err)) goto done;
    int *ok = malloc((size_t)(s.b.B * s.b.max_q) * sizeof(int));
    double *lp = malloc((size_t)(s.b.B * s.b.max_q) * sizeof(double));
    int bad = ps_eval_shifted(&in.m, &s, in.batch, &h, ok, lp, err);
    free(ok);
    free(lp);
    ps_shifted_free(&s);
    if (bad) goto done;
    res = json_object();
    json_object_set_new(res, "kind", json_string("gates"));
    json_object_set_new(res, "provenance", ps_instr_provenance(&in, NULL));
    json_t *stats = ps_gate_acc_to_json(&acc, &in.m.cfg);
    json_object_set_new(res, "thresholds", json_pack("{s:f}", "concentrated", PS_GATE_CONCENTRATED));
    json_object_set_new(res, "gates", stats);
    const char *train_log = ps_args_get(a, "--log");
    if (train_log) {
        json_t *evo = summarise_log(train_log, err);
        if (!evo) {
            ps_fail_prefix(err, "--log: ");
            goto done;
        }
        size_t want = (size_t)2 * (size_t)in.m.cfg.n_layers * (size_t)in.m.cfg.n_kv_heads;
        if (json_array_size(evo) != want) {
            ps_fail(err, "--log %s: its gate records have %zu (layer, KV head, branch) entries, but the model has %lld layers x %lld "
                         "KV heads (%zu): the log is of another model",
                    train_log, json_array_size(evo), (long long)in.m.cfg.n_layers, (long long)in.m.cfg.n_kv_heads, want);
            json_decref(evo);
            goto done;
        }
        json_object_set_new(res, "training", evo);
    }
    if (ps_instr_write(&in, "gates.json", res, err)) goto done;
    printf("%-6s %-5s %-6s %9s %9s %5s  %s\n", "layer", "head", "branch", "N_static", "N_input", "peak", "label");
    for (int l = 0; l < in.m.cfg.n_layers; l++)
        for (int g = 0; g < in.m.cfg.n_kv_heads; g++)
            for (int b = 0; b < 2; b++) {
                ps_gate_stat st;
                ps_gate_acc_stat(&acc, l, g, (ps_branch)b, &st);
                printf("%-6d %-5d %-6s %9.3f %9.3f %5d  %s\n", l, g, b ? "value" : "key", st.N_static, st.N_input, st.peak,
                       ps_gate_label(&st));
            }
    rc = 0;
done:
    json_decref(res);
    ps_hooks_free(&h);
    if (acc.sum_alpha) ps_gate_acc_free(&acc);
    ps_instr_free(&in);
    return rc;
}
