/* instr_sweep.c — the sweep instrument (instrument.h, ps_sweep_command): the phase sweep of the
 * checkpoint's task on any family, or of text-kv prompts, as work units split over shards and MPI ranks
 * (interventions/units.h), and its finish (ps_sweep_finish: rank 0, or `phasescope merge`). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "scaleout/dist.h"
#include "instruments/instrument.h"
#include "interventions/textkv.h"
#include "interventions/units.h"
#include "tasks/textkv_task.h"
#include "text/textutil.h"
#include "text/tokenizer.h"
#include "viz/draw.h"

/* the verdict and the periods come from the JSON just written, so the printed line and the file always agree */
void ps_sweep_summary_line(const ps_out *out, json_t *curve) {
    json_t *cs = json_object_get(curve, "chi_square"), *dp = json_object_get(curve, "dominant_period");
    json_t *rp = json_object_get(curve, "repeat_period");
    double p = json_number_value(json_object_get(cs, "p_value"));
    double gap = json_number_value(json_object_get(curve, "gap_pp"));
    char ptext[32];
    ps_format_p(ptext, sizeof ptext, p);
    ps_say(out, "mean accuracy %.3f, min %.3f, gap %.1f pp; chi-square p %s%s: %s", json_number_value(json_object_get(curve, "mean_accuracy")),
           json_number_value(json_object_get(curve, "min_accuracy")), gap, ptext[0] == '<' ? "" : "= ", ptext,
           json_string_value(json_object_get(curve, "verdict")));
    if (json_is_integer(json_object_get(rp, "period")))
        ps_say(out, ", repeats every %lld (folding R^2 %.2f)", (long long)json_integer_value(json_object_get(rp, "period")),
               json_number_value(json_object_get(rp, "r2")));
    if (json_is_number(json_object_get(dp, "period")))
        ps_say(out, ", dominant period %.4g", json_number_value(json_object_get(dp, "period")));
    ps_say(out, "\n");
}

/* The partial result of a sweep: per unit its queries' outcomes (ok, logprob, rho), w[u] queries; meta
 * {"provenance", "period"} (taken). */
static int sweep_partial(ps_instr *in, ps_partial *part, int64_t nu, const int64_t *w, json_t *meta, ps_error *err) {
    if (ps_instr_partial_init(in, part, nu, meta, err) || ps_partial_add(part, "ok", PS_PART_I32, w, err) < 0 ||
        ps_partial_add(part, "logprob", PS_PART_F64, w, err) < 0 || ps_partial_add(part, "rho", PS_PART_I32, w, err) < 0)
        return -1;
    return 0;
}

/* The P shifts' prompts as a prompt set in FILE (rank 0; --save-prompts). */
static int save_prompts(ps_instr *in, ps_sweep_mode mode, const char *file, ps_error *err) {
    if (ps_dist_rank() != 0) return 0;
    ps_shifted *sh = calloc((size_t)in->P, sizeof *sh);
    const ps_shifted **ptr = calloc((size_t)in->P, sizeof *ptr);
    int rc = sh && ptr ? 0 : ps_fail(err, "out of memory for %lld shifts", (long long)in->P);
    int64_t made = 0;
    for (; made < in->P && !rc; made++) {
        rc = ps_make_shifted(&in->base, &in->task, in->fam, mode, in->P, made, in->seed, in->rt.max_pos, &sh[made], err);
        ptr[made] = &sh[made];
    }
    ps_promptset set = {0};
    if (!rc) rc = ps_promptset_from_shifts(ptr, (int)in->P, in->rt.token_map, in->rt.n_token_map, (int32_t)ps_task_fill0(&in->task), &set, err);
    if (!rc && (rc = ps_promptset_save(&set, file, err))) ps_fail_prefix(err, "--save-prompts: ");
    if (!rc) ps_say(&in->out, "wrote %s (%lld prompts of %lld tokens, period %lld)\n", file, (long long)set.N, (long long)set.T, (long long)in->P);
    ps_promptset_free(&set);
    for (int64_t p = 0; p < made; p++) ps_shifted_free(&sh[p]);
    free(sh);
    free(ptr);
    return rc;
}

/* The sweep of the checkpoint's own task (units (shift, batch)), or of a caller's prompt set (in->prompts: one
 * shift, its batches), with per-query outcomes (interventions/units.h); a split run (MPI ranks, --shard) gathers
 * them and ps_sweep_finish adds them up in the one-process order. */
static int run_model(ps_instr *in, ps_sweep_mode mode, ps_error *err) {
    ps_partial part = {0};
    ps_instr_work wk = {0};
    int rc = 1;
    const ps_batch *pb = in->prompts ? &in->prompts->b : &in->base;
    int64_t N = pb->B, maxq = pb->max_q, nb = ps_sweep_n_batches(N, in->batch), n_shifts = in->prompts ? 1 : in->P, nu = n_shifts * nb;
    int64_t *w = malloc((size_t)(nu ? nu : 1) * sizeof *w);
    json_t *meta = json_pack("{s:o, s:I}", "provenance", ps_instr_provenance(in, in->prompts ? NULL : mode == PS_SWEEP_PAD ? "pad" : "move"),
                             "period", (json_int_t)in->P);
    if (!w) {
        json_decref(meta);
        ps_fail(err, "out of memory for %lld work units", (long long)nu);
        goto done;
    }
    for (int64_t u = 0; u < nu; u++) w[u] = (N - u % nb * in->batch < in->batch ? N - u % nb * in->batch : in->batch) * maxq;
    if (sweep_partial(in, &part, nu, w, meta, err)) goto done;
    ps_sweep_unit_weights(N, in->batch, n_shifts, pb->T, mode, w);
    if (ps_instr_split(in, w, NULL, nu, 0, &wk, err)) goto done;
    int32_t *ok = part.arr[0].data, *rho = part.arr[2].data;
    double *lp = part.arr[1].data;
    int r = in->prompts ? ps_promptset_sweep_units(&in->rt, in->prompts, in->batch, wk.u0, wk.u1, ok, lp, rho, ps_instr_progress, in, err)
                        : ps_sweep_units(&in->rt, &in->base, &in->task, in->fam, mode, in->P, in->seed, in->batch, wk.u0, wk.u1, ok, lp,
                                         rho, ps_instr_progress, in, err);
    ps_progress_end(&in->bar);
    int fin = ps_instr_collect(in, &part, &wk, r, err);
    if (fin < 0 || (fin == 1 && ps_sweep_finish(&part, &in->out, err))) goto done;
    rc = 0;
done:
    free(w);
    ps_instr_work_free(&wk);
    ps_partial_free(&part);
    return rc;
}

/* ---- text-kv prompts ---- */

/* The text-kv sweep (docs/text-experiments.md) on the set-up model: the layout from the flags and the
 * checkpoint (trained: the text-kv task it was trained on, or NULL); units of the batches one process
 * runs (ps_textkv_units), gathered and finished like the model's sweep. */
static int run_textkv(ps_instr *in, const ps_args *a, const ps_sweep_request *rq, const ps_textkv_task *trained, ps_error *err) {
    ps_textkv_set set;
    memset(&set, 0, sizeof set);
    ps_textkv_units units = {0};
    ps_partial part = {0};
    ps_instr_work wk = {0};
    int have_set = 0, rc = 1;
    int64_t *T = NULL, *w = NULL, tmin = 0, tmax = 0;
    ps_textkv_layout lay = {rq->tokenizer, rq->words, ps_args_get(a, "--family"), rq->pairs, rq->values, trained, rq->value_digits};
    const ps_model *m = ps_runtime_controlled(&in->rt);
    /* in->P: --period, or the model's one default period (ps_instr_setup: ps_runtime_default_period) */
    int bad = ps_textkv_set_open(&set, &lay, in->P, err);
    have_set = !bad;
    if (!bad) bad = ps_text_check_vocab(set.tok, set.tok_path, m->cfg.vocab_size, in->model_dir, err);
    if (!bad && !(T = malloc((size_t)in->P * sizeof *T))) bad = ps_fail(err, "out of memory for %lld shifts", (long long)in->P);
    if (!bad) bad = ps_textkv_sweep_lengths(&set, rq->mode, in->seed, in->n_prompts, m->cfg.max_seq_len, T, &tmin, &tmax, err);
    if (!bad) bad = ps_textkv_units_init(&units, &m->cfg, T, in->P, in->n_prompts, in->batch, err);
    if (ps_dist_agree(bad, err)) goto done;
    int64_t nu = units.n_units, maxq = set.kv.n_queries;
    json_t *prov = ps_instr_provenance(in, rq->mode == PS_SWEEP_PAD ? "pad" : "move"), *ev = json_object_get(prov, "eval");
    json_object_set_new(ev, "family", json_string(set.fam->name));
    json_object_set_new(ev, "task", json_string("text-kv"));
    json_object_set_new(prov, "task", ps_textkv_set_task_json(&set, tmin, tmax));
    json_t *meta = json_pack("{s:o, s:I}", "provenance", prov, "period", (json_int_t)in->P);
    if (!(w = malloc((size_t)(nu ? nu : 1) * sizeof *w))) {
        json_decref(meta);
        ps_fail(err, "out of memory for %lld work units", (long long)nu);
        goto done;
    }
    for (int64_t k = 0; k < nu; k++) {
        int64_t p, i0, n;
        ps_textkv_unit(&units, k, &p, &i0, &n);
        w[k] = n * maxq;
    }
    if (sweep_partial(in, &part, nu, w, meta, err)) goto done;
    ps_textkv_unit_weights(&units, w);
    if (ps_instr_split(in, w, NULL, nu, 0, &wk, err)) goto done;
    ps_progress_init(&in->bar, (int64_t)1 << 40);
    int r = ps_textkv_sweep_units(m, &set, rq->mode, in->seed, &units, wk.u0, wk.u1, part.arr[0].data, part.arr[1].data,
                                  part.arr[2].data, ps_instr_progress, in, err);
    ps_progress_end(&in->bar);
    int fin = ps_instr_collect(in, &part, &wk, r, err);
    if (fin < 0 || (fin == 1 && ps_sweep_finish(&part, &in->out, err))) goto done;
    rc = 0;
done:
    free(T);
    free(w);
    ps_textkv_units_free(&units);
    ps_instr_work_free(&wk);
    ps_partial_free(&part);
    if (have_set) ps_textkv_set_free(&set);
    return rc;
}

/* a's flags without --family: the text-kv sweep's --family names a text filler family
 * (data/text/fillers.json), which ps_instr_setup would look up among the token fillers */
static ps_args args_without_family(const ps_args *a) {
    ps_args b = *a;
    for (int i = 0; i < PS_MAX_FLAGS && a->cmd->flags[i].name; i++)
        if (!strcmp(a->cmd->flags[i].name, "--family")) {
            b.value[i] = NULL;
            b.present[i] = 0;
        }
    return b;
}

/* The rest of ps_instr_setup for the sweep of the checkpoint's task, after a set-up without --family and
 * without the task: the token filler family, and the evaluation prompts where the family has not built
 * them (a phasescope model's stored task; a DeepSeek-V4 checkpoint's come with its task file). */
static int model_task(ps_instr *in, const ps_args *a, ps_error *err) {
    const char *family = ps_args_get(a, "--family");
    if (ps_fillers_find(in->fams, in->n_fams, family, &in->fam, err)) return ps_cli_mark_usage(err);
    if (in->base.B) return 0;
    if (ps_runtime_task(&in->rt, in->model_dir, &in->task, err) || ps_batch_alloc(&in->base, in->n_prompts, in->task.seq_len, in->task.n_queries, err) ||
        ps_task_generate(&in->task, in->seed ^ 0xe7a1ULL, &in->base, err))
        return -1;
    ps_progress_init(&in->bar, (int64_t)1 << 40);
    return 0;
}

int ps_sweep_command(const ps_args *a, const ps_sweep_request *rq, ps_error *err) {
    ps_instr in = {0};
    ps_textkv_task trained;
    memset(&trained, 0, sizeof trained);
    int rc = -1, has_trained = 0, textkv = rq->task && !strcmp(rq->task, "text-kv");
    ps_args b = args_without_family(a);
    /* the checkpoint (its family from its config); its evaluation prompts once the task is known */
    int bad = ps_instr_setup(&in, &b, 0, err);
    /* a phasescope model trained on text-kv names its tokenizer and layout: its text-kv sweep is the
     * default, and its layout gives --task text-kv's defaults */
    if (!bad && in.rt.family->meta && (textkv || !rq->task || !strcmp(rq->task, "model")) && !(textkv && rq->tokenizer)) {
        has_trained = ps_textkv_runtime_task(&in.rt, in.model_dir, &trained, err);
        if (has_trained < 0) bad = -1;
        else if (has_trained) textkv = 1;
    }
    if (!bad && in.prompts) { /* the caller's prompts: none of the task's choices apply */
        if (rq->task) bad = ps_cli_usage(err, "--task %s and --prompts: give one source of prompts", rq->task);
        else if (rq->text_only_flag) bad = ps_cli_usage(err, "%s: only with --task text-kv, not with --prompts", rq->text_only_flag);
        else if (rq->mode_given) bad = ps_cli_usage(err, "--mode: a prompt set is run as given (no shifts)");
        else if (ps_args_get(a, "--family")) bad = ps_cli_usage(err, "--family: a prompt set has no fillers (its prompts are as given)");
        else if (rq->save_prompts) bad = ps_cli_usage(err, "--save-prompts: writes the prompts of the checkpoint's task sweep (not of --prompts)");
        if (ps_dist_agree(bad, err)) goto done;
        rc = run_model(&in, PS_SWEEP_PAD, err) ? -1 : 0;
        goto done;
    }
    if (!bad && textkv && !ps_runtime_controlled(&in.rt)) /* the text-kv units run the controlled model (run_textkv) */
        bad = ps_cli_usage(err, "--task text-kv: text prompts need a phasescope model (this is a %s checkpoint)",
                           in.rt.family->title ? in.rt.family->title : in.rt.family->name);
    if (!bad && !textkv && rq->text_only_flag) bad = ps_cli_usage(err, "%s: only with --task text-kv", rq->text_only_flag);
    if (!bad && !textkv) bad = model_task(&in, a, err);
    if (ps_dist_agree(bad, err)) goto done;
    if (rq->save_prompts && (textkv || in.prompts)) {
        rc = ps_cli_usage(err, "--save-prompts: writes the prompts of the checkpoint's task sweep (not of %s)", textkv ? "text-kv" : "--prompts");
        goto done;
    }
    if (!textkv && rq->save_prompts && save_prompts(&in, rq->mode, rq->save_prompts, err)) {
        rc = -1;
        goto done;
    }
    rc = textkv ? run_textkv(&in, a, rq, has_trained > 0 ? &trained : NULL, err) : run_model(&in, rq->mode, err);
    rc = rc ? -1 : 0;
done:
    if (has_trained > 0) ps_textkv_task_free(&trained);
    ps_instr_free(&in);
    return rc;
}

int ps_sweep_finish(const ps_partial *p, const ps_out *out, ps_error *err) {
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
    if (ps_promptset_residue_logit_diff(json_object_get(curve, "residues"), p->arr[ilp].data, p->arr[irho].data,
                                        p->arr[iok].off[p->n_units], P, NULL, NULL, err) < 0) {
        json_decref(curve);
        goto done;
    }
    json_object_set_new(res, "curve", curve);
    if (ps_result_write(out, "sweep.json", res, err)) goto done;
    ps_sweep_summary_line(out, curve);
    rc = 0;
done:
    json_decref(res);
    ps_residue_stats_free(&st);
    return rc;
}
