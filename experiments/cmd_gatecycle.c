/* cmd_gatecycle.c — `phasescope gatecycle`: roll per-offset gate parameters, sweep before and after. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/dist.h"
#include "interventions/gatecycle.h"
#include "experiments/instrument.h"
#include "interventions/knockout.h"
#include "viz/results_check.h"
#include "interventions/stats.h"
#include "interventions/units.h"
#include "tasks/tasks.h"

static int run(const ps_args *a, ps_error *err);

static const ps_flag_spec FLAGS[] = {
    {"--layer", "L", "layer to cycle (required)", 1},
    {"--shift", "K", "offsets to roll by (required; any integer, taken mod W)", 1},
    {"--head", "G", "one KV head (default: all)", 0},
    {"--branch", "key|value|both", "key, value or both (default both); DeepSeek-V4 checkpoints: compressor, indexer\n"
                                   "or both (their position biases)", 0},
    {"--params", "gate|payload|all",
     "gate, payload or all (default: all the model has: gates and per-offset payloads move\n"
     "together; rolling the gates alone of a per-offset-payload model breaks every head)",
     0},
    {"--save", "DIR", "also write the cycled checkpoint to DIR", 0},
    {"--measure", "sweep|knockout",
     "sweep (default): the curves and their dips; knockout: also each cycled head's knockout\n"
     "profile before and after, and how far its residue moved (shift - K per head)",
     0},
    {"--min-hurt", "PP", "knockout measure: the smallest accuracy drop (pp) that makes a residue a head's own (default 10)", 0},
    PS_INSTR_FLAGS,
    PS_V4_TASK_FLAG,
    {0},
};

const ps_command ps_cmd_gatecycle = {
    .name = "gatecycle",
    .summary = "roll a layer's per-offset gate parameters; sweep before and after",
    .description =
        "Gate offset cycling (docs/results-schema.md, `gatecycle.json`): rolls layer L's per-offset parameters by\n"
        "K (u'_i = u_{(i-K) mod W}, c'_i likewise, and with --params payload|all the per-offset payload maps C'_i),\n"
        "so a head that read offset r reads offset r+K; runs the prefix-padding sweep before and after and reports\n"
        "both curves, the cycled heads, where each dip of the clean curve moved (residue before -> after), and the\n"
        "best-aligning shift s (maximising the correlation of A_after(rho) with A_before(rho - s mod P), leaving out\n"
        "residues near chance in both curves), also signed in (-P/2, P/2]. Warns when the cycled curve is near\n"
        "chance (the cycled heads stopped working). With --measure knockout, also knocks out each cycled head before\n"
        "and after cycling (mean replacement of its compressed entries) and reports, per head, where the residue\n"
        "its knockout hurts most moved (and the best circular cross-correlation shift of its profile), minus K,\n"
        "leaving out residues near chance before and after; `per_head` in gatecycle.json. Writes OUT/gatecycle.json.\n",
    .flags = FLAGS,
    .run = run,
};

static void heads_text(char *buf, size_t n, int64_t head, int64_t nkv) {
    if (head >= 0) snprintf(buf, n, "KV head %lld", (long long)head);
    else if (nkv == 1) snprintf(buf, n, "KV head 0 (all)");
    else snprintf(buf, n, "KV heads 0-%lld (all)", (long long)nkv - 1);
}

/* --measure knockout (interventions/gatecycle.h, ps_gatecycle_per_head): the per-head measure, and its
 * summary on stdout from the "per_head" object. */
static json_t *measure_per_head(ps_instr *in, int layer, int head, int branches, int params, int64_t k, double min_hurt,
                                ps_error *err) {
    json_t *out = NULL;
    ps_gatecycle_per_head_spec g = {.rt = &in->rt, .m = &in->m, .base = &in->base, .task = &in->task, .fam = in->fam,
                                    .P = in->P, .seed = in->seed, .batch = in->batch, .layer = layer, .head = head,
                                    .branches = branches, .params = params, .k = k, .min_hurt = min_hurt,
                                    .progress = ps_instr_progress, .progress_user = in};
    int rc = ps_gatecycle_per_head(&g, &out, err);
    ps_progress_end(&in->bar);
    if (rc) return NULL;
    printf("per-head knockout measure (layer %d, shift %lld; hurt = accuracy drop when the head is knocked out):\n", layer,
           (long long)k);
    json_t *hl = json_object_get(out, "heads"), *e;
    size_t i;
    json_array_foreach(hl, i, e) {
        const char *st = json_string_value(json_object_get(e, "status"));
        json_int_t wb = json_integer_value(json_object_get(e, "worst_before")), wa = json_integer_value(json_object_get(e, "worst_after"));
        double hb = json_is_integer(json_object_get(e, "worst_before"))
                        ? json_number_value(json_array_get(json_object_get(e, "hurt_before_pp"), (size_t)wb)) : 0;
        double ha = json_is_integer(json_object_get(e, "worst_after"))
                        ? json_number_value(json_array_get(json_object_get(e, "hurt_after_pp"), (size_t)wa)) : 0;
        /* print a tiny negative hurt as 0.0, not -0.0 */
        double shb = fabs(hb) < 0.05 ? 0 : hb, sha = fabs(ha) < 0.05 ? 0 : ha;
        printf("  head %lld: ", (long long)json_integer_value(json_object_get(e, "head")));
        if (!strcmp(st, "no_profile")) printf("owns no residue before (largest hurt %.1f pp at rho %lld)\n", shb, (long long)wb);
        else if (!strcmp(st, "lost")) printf("rho %lld (%.1f pp) -> lost after cycling (largest hurt %.1f pp)\n", (long long)wb, shb, sha);
        else
            printf("rho %lld (%.1f pp) -> rho %lld (%.1f pp): shift %+lld, shift - k %+lld; profile xcorr shift %+lld, - k %+lld\n",
                   (long long)wb, hb, (long long)wa, ha, (long long)json_integer_value(json_object_get(e, "shift_worst")),
                   (long long)json_integer_value(json_object_get(e, "error_worst")),
                   (long long)json_integer_value(json_object_get(e, "shift_xcorr")),
                   (long long)json_integer_value(json_object_get(e, "error_xcorr")));
    }
    json_t *sum = json_object_get(out, "summary");
    int n_meas = (int)json_integer_value(json_object_get(sum, "n_measured")), nh = (int)json_integer_value(json_object_get(sum, "n_heads"));
    int n_lost = (int)json_integer_value(json_object_get(sum, "n_lost")), n_none = (int)json_integer_value(json_object_get(sum, "n_no_profile"));
    if (n_meas)
        printf("  summary: %d of %d heads measured (%d lost, %d own no residue); mean |shift - k| %.3f (worst residue), %.3f "
               "(xcorr); exact %d/%d, %d/%d\n",
               n_meas, nh, n_lost, n_none, json_number_value(json_object_get(sum, "mean_abs_error_worst")),
               json_number_value(json_object_get(sum, "mean_abs_error_xcorr")),
               (int)lround(json_number_value(json_object_get(sum, "fraction_exact_worst")) * n_meas), n_meas,
               (int)lround(json_number_value(json_object_get(sum, "fraction_exact_xcorr")) * n_meas), n_meas);
    else
        printf("  summary: no head measured (%d lost, %d own no residue)\n", n_lost, n_none);
    return out;
}

/* The flags, the model and the cycle's preconditions (every rank checks them alike). */
static int validate(const ps_args *a, ps_instr *inp, int64_t *layer_, int64_t *shift_, int64_t *head_, int *bi_, int *pi_,
                    int *branches_, int *params_, const char *const *BRANCHES, const char *const *PARAMS, int *measure_,
                    double *min_hurt_, ps_error *err) {
    int64_t layer = 0, shift = 0, head = -1;
    int bi = 2, pi = -1;
    if (ps_args_int(a, "--layer", -PS_RESULT_MAX_SHIFT, PS_RESULT_MAX_SHIFT, &layer, err) ||
        ps_args_int(a, "--shift", -PS_RESULT_MAX_SHIFT, PS_RESULT_MAX_SHIFT, &shift, err) ||
        ps_args_int(a, "--head", 0, PS_RESULT_MAX_SHIFT, &head, err) || ps_args_choice(a, "--branch", BRANCHES, &bi, err) ||
        ps_args_choice(a, "--params", PARAMS, &pi, err))
        return -1;
    static const char *const MEASURES[] = {"sweep", "knockout", NULL};
    if (ps_args_choice(a, "--measure", MEASURES, measure_, err) || ps_args_positive(a, "--min-hurt", 100, min_hurt_, err))
        return -1;
    *layer_ = layer, *shift_ = shift, *head_ = head, *bi_ = bi, *pi_ = pi;
    int branches = bi == 0 ? PS_CYCLE_KEY : bi == 1 ? PS_CYCLE_VALUE : PS_CYCLE_KEY | PS_CYCLE_VALUE;
    int params = pi < 0 ? 0 : pi == 0 ? PS_CYCLE_GATE : pi == 1 ? PS_CYCLE_PAYLOAD : PS_CYCLE_GATE | PS_CYCLE_PAYLOAD;
    if (ps_instr_setup(inp, a, 1, err)) return -1;
    const ps_config *c = &inp->m.cfg;
    /* a layer or head the model does not have is a usage error; without --model, say which model that is */
    char note[4600];
    ps_cli_default_model_note(ps_args_get(a, "--model"), note, sizeof note);
    if (c->kind != PS_ATTN_FULL && (layer < 0 || layer >= c->n_layers)) {
        if (note[0]) {
            char valid[64];
            if (c->n_layers == 1) snprintf(valid, sizeof valid, "--layer 0");
            else snprintf(valid, sizeof valid, "--layer 0..%lld", (long long)c->n_layers - 1);
            ps_cli_usage(err, "--layer %lld: out of range: no --model given, so this is %s, which has %lld layer%s: valid %s (or pass --model DIR)",
                         (long long)layer, note, (long long)c->n_layers, c->n_layers == 1 ? "" : "s", valid);
        }
        else
            ps_cli_usage(err, "--layer %lld: out of range (the model has %lld layers, 0..%lld)", (long long)layer,
                         (long long)c->n_layers, (long long)c->n_layers - 1);
        return -1;
    }
    if (c->kind != PS_ATTN_FULL && head >= c->n_kv_heads) {
        if (note[0])
            ps_cli_usage(err, "--head %lld: out of range: no --model given, so this is %s, which has %lld KV heads: valid --head 0..%lld (or pass --model DIR)",
                         (long long)head, note, (long long)c->n_kv_heads, (long long)c->n_kv_heads - 1);
        else
            ps_cli_usage(err, "--head %lld: out of range (the model has %lld KV heads, 0..%lld)", (long long)head,
                         (long long)c->n_kv_heads, (long long)c->n_kv_heads - 1);
        return -1;
    }
    /* default: every per-offset parameter the model has (gates and payloads move together) */
    if (!params && c->kind == PS_ATTN_COMPRESSED) {
        if (c->gate != PS_GATE_UNIFORM) params |= PS_CYCLE_GATE;
        if (c->payload != PS_PAYLOAD_SHARED) params |= PS_CYCLE_PAYLOAD;
        if (!params) {
            ps_fail(err, "--model %s: the model's gate is uniform and its payload shared: it has no per-offset parameters to cycle",
                    inp->model_dir);
            return -1;
        }
    }
    if (!params) params = PS_CYCLE_GATE;
    /* validate the cycle first (bad model fails before any sweep): cycling by 0 checks every precondition
     * and changes nothing */
    if (ps_gate_cycle(&inp->m, (int)layer, (int)head, branches, params, 0, err)) {
        if (strncmp(err->msg, "--", 2)) ps_fail_prefix(err, "--model %s: ", inp->model_dir);
        else ps_cli_mark_usage(err);
        return -1;
    }
    if (*measure_ == 1 && c->kind != PS_ATTN_COMPRESSED)
        return ps_cli_usage(err, "--measure knockout: the model has no compressed cache to cycle");
    *branches_ = branches;
    *params_ = params;
    return 0;
}

/* A DeepSeek-V4 checkpoint: its flags (--branch compressor|indexer|both; no --head, --save, --params
 * but gate) and the cycle's preconditions (interventions/v4_instr.h, ps_v4_gate_cycle). */
static int validate_v4(const ps_args *a, ps_instr *in, int64_t *layer_, int64_t *shift_, int *branches_, int *measure_,
                       ps_error *err) {
    if (ps_args_get(a, "--head"))
        return ps_cli_usage(err, "--head: a DeepSeek-V4 compressor has one K=V head; its position bias is rolled for every channel");
    if (ps_args_get(a, "--save")) return ps_cli_usage(err, "--save: writing DeepSeek-V4 checkpoints is not supported");
    const char *pv = ps_args_get(a, "--params");
    if (pv && strcmp(pv, "gate"))
        return ps_cli_usage(err, "--params %s: a DeepSeek-V4 compressor's only per-slot parameter is its position bias (ape): "
                                 "use --params gate (the default)", pv);
    static const char *const BR[] = {"compressor", "indexer", "both", NULL}, *const MEASURES[] = {"sweep", "knockout", NULL};
    int bi = 2;
    if (ps_args_int(a, "--layer", 0, PS_RESULT_MAX_SHIFT, layer_, err) ||
        ps_args_int(a, "--shift", -PS_RESULT_MAX_SHIFT, PS_RESULT_MAX_SHIFT, shift_, err) ||
        ps_args_choice(a, "--measure", MEASURES, measure_, err))
        return -1;
    if (*measure_ == 1)
        return ps_cli_usage(err, "--measure knockout: the per-head measure cycles one KV head of a phasescope compressed model (a DeepSeek-V4 compressor has one K=V head)");
    if (ps_args_get(a, "--branch") && ps_args_choice(a, "--branch", BR, &bi, err)) return ps_fail_prefix(err, "DeepSeek-V4: ");
    *branches_ = bi == 0 ? PS_V4_CYCLE_COMPRESSOR : bi == 1 ? PS_V4_CYCLE_INDEXER : PS_V4_CYCLE_COMPRESSOR | PS_V4_CYCLE_INDEXER;
    if (ps_instr_setup(in, a, 1, err)) return -1;
    const ps_v4_config *c = &in->v4.cfg;
    if (*layer_ >= c->n_layers)
        return ps_cli_usage(err, "--layer %lld: out of range (the model has %lld layers, 0..%lld)", (long long)*layer_,
                            (long long)c->n_layers, (long long)c->n_layers - 1);
    if (ps_v4_gate_cycle(&in->v4, (int)*layer_, *branches_, 0, err)) /* preconditions first: cycling by 0 changes nothing */
        return ps_cli_mark_usage(err);
    return 0;
}

/* The cycle block of a DeepSeek-V4 run, and what its result says (docs/results-schema.md, "DeepSeek-V4"). */
static json_t *v4_meta(const ps_instr *in, int64_t layer, int64_t shift, int branches) {
    const ps_v4_config *c = &in->v4.cfg;
    int has_ix = c->attn_type[layer] == PS_V4_CSA && (branches & PS_V4_CYCLE_INDEXER);
    const char *br = (branches & PS_V4_CYCLE_COMPRESSOR) && has_ix ? "both" : has_ix ? "indexer" : "compressor";
    return json_pack("{s:o, s:I, s:{s:I, s:I, s:s, s:[i], s:s, s:s, s:s, s:I}, s:f, s:I, s:b, s:I, s:s, s:{s:s, s:I}}",
                     "provenance", ps_instr_provenance(in, "pad"), "period", (json_int_t)in->P, "cycle", "layer",
                     (json_int_t)layer, "shift", (json_int_t)shift, "head", "all", "heads", 0, "branch", br, "params", "gate",
                     "rolled", "position bias (ape) rows, by shift mod the layer's rate", "rate",
                     (json_int_t)c->compress_rate[layer], "chance", ps_task_chance(&in->task), "n_kv_heads", (json_int_t)1,
                     "gates_without_payloads", 0, "v4_rate", (json_int_t)0, "near_chance_warning",
                     "after cycling, accuracy is near chance: the shift statistic means nothing", "deepseek_v4", "layer_type",
                     ps_v4_attn_type_name(c->attn_type[layer]), "rate", (json_int_t)c->compress_rate[layer]);
}

/* Gate cycling's work: the two sweeps' units (before, then after; interventions/units.h). A process whose
 * range reaches into the second sweep cycles its copy of the model first; a split run gathers the
 * outcomes and ps_gatecycle_finish adds them up in the one-process order. --measure knockout (the per-head
 * knockout grids before and after) is not split into units: rank 0 runs the whole command (the other ranks
 * wait) and --shard is refused. DeepSeek-V4 checkpoints run whole on rank 0 too. */
static int run(const ps_args *a, ps_error *err) {
    ps_instr in = {0};
    ps_partial part = {0};
    ps_instr_work wk = {0};
    int64_t *w = NULL;
    int rc = 1;
    int64_t layer = 0, shift = 0, head = -1;
    static const char *const BRANCHES[] = {"key", "value", "both", NULL}, *const PARAMS[] = {"gate", "payload", "all", NULL};
    int bi = 2, pi = -1, branches = 0, params = 0, measure = 0;
    double min_hurt = PS_HEAD_MIN_HURT_PP;
    int v4 = ps_instr_is_v4(a);
    int bad = v4 ? validate_v4(a, &in, &layer, &shift, &branches, &measure, err)
                 : validate(a, &in, &layer, &shift, &head, &bi, &pi, &branches, &params, BRANCHES, PARAMS, &measure, &min_hurt, err);
    if (ps_dist_agree(bad, err)) goto done;
    /* --measure knockout: whole on rank 0 (whole = 1 there, -1 on an error, 0 on the waiting ranks) */
    int whole = measure == 1 ? ps_instr_whole_begin(a, "gatecycle --measure knockout", err) : 1;
    if (whole <= 0) {
        rc = ps_instr_whole_end(whole, err) ? 1 : 0;
        goto done;
    }
    int r = 0;
    json_t *per_head = NULL;
    if (measure == 1 && !(per_head = measure_per_head(&in, (int)layer, (int)head, branches, params, shift, min_hurt, err))) r = -1;
    int64_t N = in.base.B, maxq = in.base.max_q, nb = ps_sweep_n_batches(N, in.batch), half = in.P * nb, nu = 2 * half;
    json_t *meta;
    if (v4)
        meta = v4_meta(&in, layer, shift, branches);
    else {
    const ps_config *c = &in.m.cfg;
    json_t *hl = json_array();
    for (int64_t g = head < 0 ? 0 : head; g < (head < 0 ? c->n_kv_heads : head + 1); g++) json_array_append_new(hl, json_integer(g));
    const char *br = branches == 3 ? "both" : branches == 1 ? "key" : "value";
    const char *pa = params == 3 ? "all" : params == 1 ? "gate" : "payload";
    meta = json_pack("{s:o, s:I, s:{s:I, s:I, s:o, s:o, s:s, s:s}, s:f, s:I, s:b, s:I}", "provenance",
                             ps_instr_provenance(&in, "pad"), "period", (json_int_t)in.P, "cycle", "layer", (json_int_t)layer,
                             "shift", (json_int_t)shift, "head", head < 0 ? json_string("all") : json_integer(head), "heads", hl,
                             "branch", br, "params", pa, "chance", ps_task_chance(&in.task), "n_kv_heads",
                             (json_int_t)c->n_kv_heads, "gates_without_payloads",
                             params == PS_CYCLE_GATE && c->kind == PS_ATTN_COMPRESSED && c->payload != PS_PAYLOAD_SHARED,
                             "v4_rate", (json_int_t)(c->kind == PS_ATTN_CHANNEL ? c->rate : 0));
    }
    if (per_head) json_object_set_new(meta, "per_head", per_head); /* only a run that is not split has it */
    w = malloc((size_t)(nu ? nu : 1) * sizeof *w);
    if (!w && !r) r = ps_fail(err, "out of memory for %lld work units", (long long)nu);
    if (r) {
        json_decref(meta);
        goto finish;
    }
    for (int64_t u = 0; u < nu; u++) {
        int64_t j = u % nb;
        w[u] = (N - j * in.batch < in.batch ? N - j * in.batch : in.batch) * maxq;
    }
    if (ps_instr_partial_init(&in, &part, nu, meta, err) || ps_partial_add(&part, "ok", PS_PART_I32, w, err) < 0 ||
        ps_partial_add(&part, "logprob", PS_PART_F64, w, err) < 0 || ps_partial_add(&part, "rho", PS_PART_I32, w, err) < 0) {
        r = -1;
        goto finish;
    }
    ps_sweep_unit_weights(N, in.batch, in.P, in.base.T, PS_SWEEP_PAD, w);
    memcpy(w + half, w, (size_t)half * sizeof *w);
    if (measure == 1) { /* this process runs every unit */
        wk.u0 = 0;
        wk.u1 = nu;
    } else if (ps_instr_split(&in, w, NULL, nu, 0, &wk, err))
        goto done;
    const char *save = ps_args_get(a, "--save");
    int saver = save && ps_dist_rank() == 0 && in.shard == 0; /* one process writes the cycled checkpoint */
    int64_t stride = part.arr[0].off[half];                  /* elements of one sweep's outcomes */
    int32_t *ok = part.arr[0].data, *rho = part.arr[2].data;
    double *lp = part.arr[1].data;
    if (wk.u0 < half) {
        r = ps_sweep_units(&in.rt, &in.base, &in.task, in.fam, PS_SWEEP_PAD, in.P, in.seed, in.batch, wk.u0,
                           wk.u1 < half ? wk.u1 : half, ok, lp, rho, ps_instr_progress, &in, err);
        ps_progress_end(&in.bar);
    }
    if (!r && (wk.u1 > half || saver))
        r = v4 ? ps_v4_gate_cycle(&in.v4, (int)layer, branches, shift, err)
               : ps_gate_cycle(&in.m, (int)layer, (int)head, branches, params, shift, err);
    if (!r && wk.u1 > half) {
        r = ps_sweep_units(&in.rt, &in.base, &in.task, in.fam, PS_SWEEP_PAD, in.P, in.seed, in.batch,
                           (wk.u0 > half ? wk.u0 : half) - half, wk.u1 - half, ok + stride, lp + stride, rho + stride,
                           ps_instr_progress, &in, err);
        ps_progress_end(&in.bar);
    }
    if (!r && saver) {
        char note[96];
        snprintf(note, sizeof note, "layer %lld shift %lld", (long long)layer, (long long)shift);
        r = ps_model_set_meta(&in.m, "phasescope.gatecycle", note, err) || ps_model_save(&in.m, save, err) ? -1 : 0;
        if (!r) printf("wrote the cycled checkpoint to %s\n", save);
    }
finish:
    if (measure == 1) { /* rank 0 alone: finish here, then tell the waiting ranks */
        if (!r) r = ps_gatecycle_finish(&part, in.out_dir, err);
        rc = ps_instr_whole_end(r, err) ? 1 : 0;
        goto done;
    }
    int fin = ps_instr_collect(&in, &part, &wk, r, err);
    if (fin < 0 || (fin == 1 && ps_gatecycle_finish(&part, in.out_dir, err))) goto done;
    rc = 0;
done:
    free(w);
    ps_instr_work_free(&wk);
    ps_partial_free(&part);
    ps_instr_free(&in);
    return rc;
}

int ps_gatecycle_finish(const ps_partial *p, const char *out_dir, ps_error *err) {
    ps_residue_stats before = {0}, after = {0};
    ps_cycle_analysis an = {0};
    json_t *res = NULL, *meta = p->meta, *cy = json_object_get(meta, "cycle");
    double *ab = NULL, *aa = NULL;
    int rc = -1;
    int64_t P = json_integer_value(json_object_get(meta, "period"));
    int64_t layer = json_integer_value(json_object_get(cy, "layer")), shift = json_integer_value(json_object_get(cy, "shift"));
    int64_t head = json_is_integer(json_object_get(cy, "head")) ? json_integer_value(json_object_get(cy, "head")) : -1;
    int64_t nkv = json_integer_value(json_object_get(meta, "n_kv_heads"));
    const char *br = json_string_value(json_object_get(cy, "branch")), *pa = json_string_value(json_object_get(cy, "params"));
    if (P < 1 || !br || !pa || p->n_arr != 3 || p->n_units % 2)
        return ps_fail(err, "a gate cycle's partial result lacks its cycle, period or outcomes");
    int branches = !strcmp(br, "both") ? 3 : !strcmp(br, "key") ? 1 : 2, params = !strcmp(pa, "all") ? 3 : !strcmp(pa, "gate") ? 1 : 2;
    int64_t half = p->arr[0].off[p->n_units / 2], all = p->arr[0].off[p->n_units];
    const int32_t *ok = p->arr[0].data, *rho = p->arr[2].data;
    const double *lp = p->arr[1].data;
    if (ps_residue_stats_init(&before, P, err) || ps_residue_stats_init(&after, P, err)) goto done;
    ps_residue_stats_add_items(&before, ok, lp, rho, half);
    ps_residue_stats_add_items(&after, ok + half, lp + half, rho + half, all - half);
    ab = malloc((size_t)P * sizeof(double));
    aa = malloc((size_t)P * sizeof(double));
    if (!ab || !aa) {
        ps_fail(err, "out of memory for two curves of %lld residues", (long long)P);
        goto done;
    }
    for (int64_t r = 0; r < P; r++) {
        ab[r] = ps_residue_accuracy(&before, r);
        aa[r] = ps_residue_accuracy(&after, r);
    }
    if (ps_cycle_analyse(ab, aa, P, json_number_value(json_object_get(meta, "chance")), &an, err)) goto done;
    json_t *jb = ps_residue_stats_json(&before, err), *ja = jb ? ps_residue_stats_json(&after, err) : NULL;
    if (!ja) {
        json_decref(jb);
        goto done;
    }
    char hs[64];
    heads_text(hs, sizeof hs, head, nkv);
    char warning[600] = "";
    const char *nc_warning = json_string_value(json_object_get(meta, "near_chance_warning"));
    json_t *dsv4 = json_object_get(meta, "deepseek_v4");
    if (an.after_near_chance && nc_warning)
        snprintf(warning, sizeof warning, "%s", nc_warning);
    else if (an.after_near_chance)
        snprintf(warning, sizeof warning,
                 "after cycling, accuracy is near chance (mean %.3f, chance %.3f): the cycled heads no longer work, "
                 "so the shift statistic means nothing%s",
                 json_number_value(json_object_get(ja, "mean_accuracy")), an.chance, /* the curve's own mean */
                 json_is_true(json_object_get(meta, "gates_without_payloads"))
                     ? " (the gates were rolled without their per-offset payloads; try --params all)"
                     : "");
    res = json_object();
    json_object_set_new(res, "kind", json_string("gatecycle"));
    json_object_set(res, "provenance", json_object_get(meta, "provenance"));
    json_object_set(res, "cycle", cy);
    json_object_set_new(res, "before", jb);
    json_object_set_new(res, "after", ja);
    json_object_set_new(res, "chance", json_real(an.chance));
    json_object_set_new(res, "after_near_chance", json_boolean(an.after_near_chance));
    json_t *dips = json_array(), *nd = json_array(), *ex = json_array(), *warns = json_array();
    for (int64_t i = 0; i < an.n_moves; i++) {
        const ps_dip_move *mv = &an.moves[i];
        json_t *d = json_object();
        json_object_set_new(d, "before", json_integer(mv->before));
        json_object_set_new(d, "after", mv->after >= 0 ? json_integer(mv->after) : json_null());
        int64_t mb = mv->after >= 0 ? ((mv->after - mv->before) % P + P) % P : 0;
        if (mb > P / 2) mb -= P;
        json_object_set_new(d, "moved_by", mv->after >= 0 ? json_integer(mb) : json_null());
        json_object_set_new(d, "accuracy_before", json_real(mv->acc_before));
        json_object_set_new(d, "accuracy_after", json_real(mv->acc_after));
        json_object_set_new(d, "still_dips_after", json_boolean(mv->still_dips));
        json_array_append_new(dips, d);
    }
    for (int64_t i = 0; i < an.n_new; i++) json_array_append_new(nd, json_integer(an.new_dips[i]));
    for (int64_t i = 0; i < an.n_excluded; i++) json_array_append_new(ex, json_integer(an.excluded[i]));
    if (warning[0]) json_array_append_new(warns, json_string(warning));
    json_object_set_new(res, "dips", dips);
    json_object_set_new(res, "new_dips", nd);
    json_object_set_new(res, "excluded_residues", ex);
    json_object_set_new(res, "best_shift", json_integer(an.best_shift));
    json_object_set_new(res, "best_shift_signed", json_integer(an.best_shift_signed));
    json_object_set_new(res, "best_shift_correlation", json_real(an.best_shift_correlation));
    json_object_set_new(res, "warnings", warns);
    json_t *per_head = json_object_get(meta, "per_head"); /* --measure knockout */
    if (per_head) json_object_set(res, "per_head", per_head);
    if (ps_result_write(out_dir, "gatecycle.json", res, err)) goto done;
    if (warning[0]) fprintf(stderr, "phasescope gatecycle: warning: %s\n", warning);
    int64_t v4_rate = json_integer_value(json_object_get(meta, "v4_rate"));
    if (dsv4) /* a DeepSeek-V4 checkpoint */
        printf("cycled layer %lld (%s, rate %lld): %s position bias rolled by %lld; mean accuracy %.3f -> %.3f\n", (long long)layer,
               json_string_value(json_object_get(dsv4, "layer_type")), (long long)json_integer_value(json_object_get(dsv4, "rate")),
               br, (long long)shift, json_number_value(json_object_get(jb, "mean_accuracy")),
               json_number_value(json_object_get(ja, "mean_accuracy")));
    else if (v4_rate > 0) /* the channel attention: its position bias is the per-slot parameter */
        printf("cycled layer %lld: the compressor's position bias (ape) rolled by %lld (mod the rate %lld)\n", (long long)layer,
               (long long)shift, (long long)v4_rate);
    else
        printf("cycled layer %lld, %s, %s %s by %lld\n", (long long)layer, hs, branches == 3 ? "key and value" : br,
               params == 3 ? "gates and payloads" : params == 1 ? "gates" : "payloads", (long long)shift);
    for (int64_t i = 0; i < an.n_moves; i++) {
        const ps_dip_move *mv = &an.moves[i];
        if (mv->after >= 0)
            printf("  dip at rho %lld (%.3f) -> rho %lld (%.3f)", (long long)mv->before, mv->acc_before, (long long)mv->after,
                   mv->acc_after);
        else if (an.after_near_chance)
            printf("  dip at rho %lld (%.3f) -> nowhere: every residue is near chance after cycling", (long long)mv->before,
                   mv->acc_before);
        else
            printf("  dip at rho %lld (%.3f) -> %s", (long long)mv->before, mv->acc_before,
                   mv->still_dips ? "stays (no new dip)" : "gone (no new dip)");
        if (mv->still_dips) printf("; rho %lld still dips after (%.3f)", (long long)mv->before, aa[mv->before]);
        else if (mv->after >= 0) printf("; rho %lld recovers (%.3f)", (long long)mv->before, aa[mv->before]);
        printf("\n");
    }
    if (!an.n_moves) printf("  no dip before cycling\n");
    for (int64_t i = 0; i < an.n_new; i++)
        printf("  new dip at rho %lld (%.3f)\n", (long long)an.new_dips[i], aa[an.new_dips[i]]);
    printf("whole-curve best-aligning shift %lld (signed %+lld, correlation %.3f)%s", (long long)an.best_shift,
           (long long)an.best_shift_signed, an.best_shift_correlation,
           an.after_near_chance ? " [meaningless: the cycled curve is near chance]" : "");
    if (an.n_excluded) {
        printf("; left out %lld residue%s near chance in both curves:", (long long)an.n_excluded, an.n_excluded == 1 ? "" : "s");
        for (int64_t i = 0; i < an.n_excluded; i++) printf(" %lld", (long long)an.excluded[i]);
    }
    printf("\n");
    rc = 0;
done:
    free(ab);
    free(aa);
    ps_cycle_analysis_free(&an);
    json_decref(res);
    ps_residue_stats_free(&before);
    ps_residue_stats_free(&after);
    return rc;
}
