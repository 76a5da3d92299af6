/* cmd_gatecycle.c — `phasescope gatecycle`: roll per-offset gate parameters, sweep before and after. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gatecycle.h"
#include "cmd_v4.h"
#include "instrument.h"
#include "knockout.h"
#include "results_check.h"
#include "stats.h"

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

/* --measure knockout: knock out each cycled head of `layer` before and after cycling by k (the model is
 * cycled back by -k afterwards, exactly: a roll), and measure where each head's residue moved
 * (ps_head_shift_measure). Returns the "per_head" object, or NULL with err set. */
static json_t *measure_per_head(ps_instr *in, int layer, int head, int branches, int params, int64_t k, double min_hurt,
                                ps_error *err) {
    const ps_config *c = &in->m.cfg;
    int nh = head >= 0 ? 1 : (int)c->n_kv_heads, *heads = malloc((size_t)nh * sizeof(int));
    ps_knockout_result kb = {0}, ka = {0};
    json_t *out = NULL;
    int64_t P = in->P;
    double *hb = malloc((size_t)P * sizeof(double)), *ha = malloc((size_t)P * sizeof(double));
    unsigned char *dead = calloc((size_t)P, 1);
    if (!heads || !hb || !ha || !dead) {
        ps_fail(err, "out of memory for the per-head measure");
        goto done;
    }
    for (int i = 0; i < nh; i++) heads[i] = head >= 0 ? head : i;
    if (ps_knockout_grid_opts(&in->m, &in->base, &in->task, in->fam, P, in->seed, in->batch, &layer, 1, heads, nh, PS_KO_COMPRESSED,
                              NULL, &kb, ps_instr_progress, in, err))
        goto done;
    ps_progress_end(&in->bar);
    if (ps_gate_cycle(&in->m, layer, head, branches, params, k, err)) goto done;
    int bad = ps_knockout_grid_opts(&in->m, &in->base, &in->task, in->fam, P, in->seed, in->batch, &layer, 1, heads, nh,
                                    PS_KO_COMPRESSED, NULL, &ka, ps_instr_progress, in, err);
    ps_progress_end(&in->bar);
    if (ps_gate_cycle(&in->m, layer, head, branches, params, -k, err) || bad) goto done;
    double chance = ps_task_chance(&in->task);
    json_t *ex = json_array(), *hl = json_array();
    for (int64_t r = 0; r < P; r++) {
        double cb = ps_residue_accuracy(&kb.clean, r), ca = ps_residue_accuracy(&ka.clean, r);
        int db = !(cb > chance + PS_NEAR_CHANCE_PP / 100), da = !(ca > chance + PS_NEAR_CHANCE_PP / 100);
        dead[r] = (unsigned char)(db && da);
        if (dead[r]) json_array_append_new(ex, json_integer(r));
    }
    int n_meas = 0, n_lost = 0, n_none = 0, exact_w = 0, exact_x = 0;
    double abs_w = 0, abs_x = 0;
    printf("per-head knockout measure (layer %d, shift %lld; hurt = accuracy drop when the head is knocked out):\n", layer,
           (long long)k);
    for (int i = 0; i < nh; i++) {
        for (int64_t r = 0; r < P; r++) {
            double v = -100 * (ps_residue_accuracy(&kb.cells[i], r) - ps_residue_accuracy(&kb.clean, r));
            hb[r] = isfinite(v) ? v : 0;
            v = -100 * (ps_residue_accuracy(&ka.cells[i], r) - ps_residue_accuracy(&ka.clean, r));
            ha[r] = isfinite(v) ? v : 0;
        }
        ps_head_shift hs;
        ps_head_shift_measure(hb, ha, dead, P, k, min_hurt, &hs);
        /* print a tiny negative hurt as 0.0, not -0.0 */
        double shb = fabs(hs.hurt_before) < 0.05 ? 0 : hs.hurt_before, sha = fabs(hs.hurt_after) < 0.05 ? 0 : hs.hurt_after;
        json_t *e = json_object(), *pb = json_array(), *pa = json_array();
        for (int64_t r = 0; r < P; r++) {
            json_array_append_new(pb, json_real(hb[r]));
            json_array_append_new(pa, json_real(ha[r]));
        }
        static const char *const ST[] = {"measured", "no_profile", "lost"};
        json_object_set_new(e, "head", json_integer(heads[i]));
        json_object_set_new(e, "status", json_string(ST[hs.status]));
        json_object_set_new(e, "hurt_before_pp", pb);
        json_object_set_new(e, "hurt_after_pp", pa);
        json_object_set_new(e, "worst_before", hs.worst_before >= 0 ? json_integer(hs.worst_before) : json_null());
        json_object_set_new(e, "worst_after", hs.worst_after >= 0 ? json_integer(hs.worst_after) : json_null());
        int m = hs.status == PS_HEAD_MEASURED;
        json_object_set_new(e, "shift_worst", m ? json_integer(hs.shift_worst) : json_null());
        json_object_set_new(e, "error_worst", m ? json_integer(hs.error_worst) : json_null());
        json_object_set_new(e, "shift_xcorr", m ? json_integer(hs.shift_xcorr) : json_null());
        json_object_set_new(e, "error_xcorr", m ? json_integer(hs.error_xcorr) : json_null());
        json_array_append_new(hl, e);
        printf("  head %d: ", heads[i]);
        if (hs.status == PS_HEAD_NO_PROFILE)
            printf("owns no residue before (largest hurt %.1f pp at rho %lld)\n", shb, (long long)hs.worst_before);
        else if (hs.status == PS_HEAD_LOST)
            printf("rho %lld (%.1f pp) -> lost after cycling (largest hurt %.1f pp)\n", (long long)hs.worst_before, shb, sha);
        else
            printf("rho %lld (%.1f pp) -> rho %lld (%.1f pp): shift %+lld, shift - k %+lld; profile xcorr shift %+lld, - k %+lld\n",
                   (long long)hs.worst_before, hs.hurt_before, (long long)hs.worst_after, hs.hurt_after, (long long)hs.shift_worst,
                   (long long)hs.error_worst, (long long)hs.shift_xcorr, (long long)hs.error_xcorr);
        if (m) {
            n_meas++;
            abs_w += llabs(hs.error_worst);
            abs_x += llabs(hs.error_xcorr);
            exact_w += hs.error_worst == 0;
            exact_x += hs.error_xcorr == 0;
        }
        n_lost += hs.status == PS_HEAD_LOST;
        n_none += hs.status == PS_HEAD_NO_PROFILE;
    }
    json_t *sum = json_object();
    json_object_set_new(sum, "n_heads", json_integer(nh));
    json_object_set_new(sum, "n_measured", json_integer(n_meas));
    json_object_set_new(sum, "n_lost", json_integer(n_lost));
    json_object_set_new(sum, "n_no_profile", json_integer(n_none));
    json_object_set_new(sum, "mean_abs_error_worst", n_meas ? json_real(abs_w / n_meas) : json_null());
    json_object_set_new(sum, "fraction_exact_worst", n_meas ? json_real((double)exact_w / n_meas) : json_null());
    json_object_set_new(sum, "mean_abs_error_xcorr", n_meas ? json_real(abs_x / n_meas) : json_null());
    json_object_set_new(sum, "fraction_exact_xcorr", n_meas ? json_real((double)exact_x / n_meas) : json_null());
    if (n_meas)
        printf("  summary: %d of %d heads measured (%d lost, %d own no residue); mean |shift - k| %.3f (worst residue), %.3f "
               "(xcorr); exact %d/%d, %d/%d\n",
               n_meas, nh, n_lost, n_none, abs_w / n_meas, abs_x / n_meas, exact_w, n_meas, exact_x, n_meas);
    else
        printf("  summary: no head measured (%d lost, %d own no residue)\n", n_lost, n_none);
    out = json_object();
    json_object_set_new(out, "measure", json_string("knockout"));
    json_object_set_new(out, "target", json_string("compressed"));
    json_object_set_new(out, "min_hurt_pp", json_real(min_hurt));
    json_object_set_new(out, "excluded_residues", ex);
    json_object_set_new(out, "heads", hl);
    json_object_set_new(out, "summary", sum);
done:
    free(heads);
    free(hb);
    free(ha);
    free(dead);
    ps_knockout_result_free(&kb);
    ps_knockout_result_free(&ka);
    return out;
}

static int run(const ps_args *a, ps_error *err) {
    if (ps_v4_instr_wanted(a)) return ps_v4_cmd_gatecycle(a, err); /* DeepSeek-V4 checkpoint: experiments/cmd_v4_instr.c */
    ps_instr in = {0};
    ps_residue_stats before = {0}, after = {0};
    ps_cycle_analysis an = {0};
    json_t *res = NULL, *per_head = NULL;
    double *ab = NULL, *aa = NULL;
    int rc = 1;
    int64_t layer = 0, shift = 0, head = -1;
    static const char *const BRANCHES[] = {"key", "value", "both", NULL}, *const PARAMS[] = {"gate", "payload", "all", NULL};
    int bi = 2, pi = -1;
    if (ps_args_int(a, "--layer", -PS_RESULT_MAX_SHIFT, PS_RESULT_MAX_SHIFT, &layer, err) ||
        ps_args_int(a, "--shift", -PS_RESULT_MAX_SHIFT, PS_RESULT_MAX_SHIFT, &shift, err) ||
        ps_args_int(a, "--head", 0, PS_RESULT_MAX_SHIFT, &head, err) || ps_args_choice(a, "--branch", BRANCHES, &bi, err) ||
        ps_args_choice(a, "--params", PARAMS, &pi, err))
        goto done;
    static const char *const MEASURES[] = {"sweep", "knockout", NULL};
    int mi = 0;
    double min_hurt = PS_HEAD_MIN_HURT_PP;
    if (ps_args_choice(a, "--measure", MEASURES, &mi, err) || ps_args_positive(a, "--min-hurt", 100, &min_hurt, err)) goto done;
    int branches = bi == 0 ? PS_CYCLE_KEY : bi == 1 ? PS_CYCLE_VALUE : PS_CYCLE_KEY | PS_CYCLE_VALUE;
    int params = pi < 0 ? 0 : pi == 0 ? PS_CYCLE_GATE : pi == 1 ? PS_CYCLE_PAYLOAD : PS_CYCLE_GATE | PS_CYCLE_PAYLOAD;
    if (ps_instr_setup(&in, a, 1, err)) goto done;
    const ps_config *c = &in.m.cfg;
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
        goto done;
    }
    if (c->kind != PS_ATTN_FULL && head >= c->n_kv_heads) {
        if (note[0])
            ps_cli_usage(err, "--head %lld: out of range: no --model given, so this is %s, which has %lld KV heads: valid --head 0..%lld (or pass --model DIR)",
                         (long long)head, note, (long long)c->n_kv_heads, (long long)c->n_kv_heads - 1);
        else
            ps_cli_usage(err, "--head %lld: out of range (the model has %lld KV heads, 0..%lld)", (long long)head,
                         (long long)c->n_kv_heads, (long long)c->n_kv_heads - 1);
        goto done;
    }
    /* default: every per-offset parameter the model has (gates and payloads move together) */
    if (!params && c->kind == PS_ATTN_COMPRESSED) {
        if (c->gate != PS_GATE_UNIFORM) params |= PS_CYCLE_GATE;
        if (c->payload != PS_PAYLOAD_SHARED) params |= PS_CYCLE_PAYLOAD;
        if (!params) {
            ps_fail(err, "--model %s: the model's gate is uniform and its payload shared: it has no per-offset parameters to cycle",
                    in.model_dir);
            goto done;
        }
    }
    if (!params) params = PS_CYCLE_GATE;
    /* validate the cycle first (bad model fails before any sweep): cycling by 0 checks every precondition
     * and changes nothing */
    if (ps_gate_cycle(&in.m, (int)layer, (int)head, branches, params, 0, err)) {
        if (strncmp(err->msg, "--", 2)) ps_fail_prefix(err, "--model %s: ", in.model_dir);
        else ps_cli_mark_usage(err);
        goto done;
    }
    if (mi == 1) {
        if (c->kind != PS_ATTN_COMPRESSED) {
            ps_cli_usage(err, "--measure knockout: the model has no compressed cache to cycle");
            goto done;
        }
        per_head = measure_per_head(&in, (int)layer, (int)head, branches, params, shift, min_hurt, err);
        if (!per_head) goto done;
    }
    if (ps_sweep_run(&in.m, &in.base, &in.task, in.fam, PS_SWEEP_PAD, in.P, in.seed, in.batch, &before, ps_instr_progress,
                     &in, err))
        goto done;
    ps_progress_end(&in.bar);
    if (ps_gate_cycle(&in.m, (int)layer, (int)head, branches, params, shift, err)) goto done;
    if (ps_sweep_run(&in.m, &in.base, &in.task, in.fam, PS_SWEEP_PAD, in.P, in.seed, in.batch, &after, ps_instr_progress,
                     &in, err))
        goto done;
    ps_progress_end(&in.bar);
    const char *save = ps_args_get(a, "--save");
    if (save) {
        char meta[96];
        snprintf(meta, sizeof meta, "layer %lld shift %lld", (long long)layer, (long long)shift);
        if (ps_model_set_meta(&in.m, "phasescope.gatecycle", meta, err) || ps_model_save(&in.m, save, err))
            goto done;
        printf("wrote the cycled checkpoint to %s\n", save);
    }
    ab = malloc((size_t)in.P * sizeof(double));
    aa = malloc((size_t)in.P * sizeof(double));
    if (!ab || !aa) {
        ps_fail(err, "out of memory for two curves of %lld residues", (long long)in.P);
        goto done;
    }
    for (int64_t r = 0; r < in.P; r++) {
        ab[r] = ps_residue_accuracy(&before, r);
        aa[r] = ps_residue_accuracy(&after, r);
    }
    if (ps_cycle_analyse(ab, aa, in.P, ps_task_chance(&in.task), &an, err)) goto done;
    json_t *jb = ps_residue_stats_json(&before, err), *ja = jb ? ps_residue_stats_json(&after, err) : NULL;
    if (!ja) {
        json_decref(jb);
        goto done;
    }
    const char *br = branches == 3 ? "both" : branches == 1 ? "key" : "value";
    const char *pa = params == 3 ? "all" : params == 1 ? "gate" : "payload";
    char hs[64];
    heads_text(hs, sizeof hs, head, c->n_kv_heads);
    char warning[600] = "";
    if (an.after_near_chance)
        snprintf(warning, sizeof warning,
                 "after cycling, accuracy is near chance (mean %.3f, chance %.3f): the cycled heads no longer work, "
                 "so the shift statistic means nothing%s",
                 json_number_value(json_object_get(ja, "mean_accuracy")), an.chance, /* the curve's own mean */
                 params == PS_CYCLE_GATE && c->kind == PS_ATTN_COMPRESSED && c->payload != PS_PAYLOAD_SHARED
                     ? " (the gates were rolled without their per-offset payloads; try --params all)"
                     : "");
    res = json_object();
    json_object_set_new(res, "kind", json_string("gatecycle"));
    json_object_set_new(res, "provenance", ps_instr_provenance(&in, "pad"));
    json_t *cyc = json_object(), *hl = json_array();
    json_object_set_new(cyc, "layer", json_integer(layer));
    json_object_set_new(cyc, "shift", json_integer(shift));
    json_object_set_new(cyc, "head", head < 0 ? json_string("all") : json_integer(head));
    for (int64_t g = head < 0 ? 0 : head; g < (head < 0 ? c->n_kv_heads : head + 1); g++) json_array_append_new(hl, json_integer(g));
    json_object_set_new(cyc, "heads", hl);
    json_object_set_new(cyc, "branch", json_string(br));
    json_object_set_new(cyc, "params", json_string(pa));
    json_object_set_new(res, "cycle", cyc);
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
        int64_t mb = mv->after >= 0 ? ((mv->after - mv->before) % in.P + in.P) % in.P : 0;
        if (mb > in.P / 2) mb -= in.P;
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
    if (per_head) {
        json_object_set_new(res, "per_head", per_head);
        per_head = NULL;
    }
    if (ps_instr_write(&in, "gatecycle.json", res, err)) goto done;
    if (warning[0]) fprintf(stderr, "phasescope gatecycle: warning: %s\n", warning);
    if (c->kind == PS_ATTN_V4) /* the v4 attention: its position bias is the per-slot parameter */
        printf("cycled layer %lld: the compressor's position bias (ape) rolled by %lld (mod the rate %lld)\n", (long long)layer,
               (long long)shift, (long long)c->rate);
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
    json_decref(per_head);
    free(ab);
    free(aa);
    ps_cycle_analysis_free(&an);
    json_decref(res);
    ps_residue_stats_free(&before);
    ps_residue_stats_free(&after);
    ps_instr_free(&in);
    return rc;
}
