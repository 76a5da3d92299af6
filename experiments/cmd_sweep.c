/* cmd_sweep.c — `phasescope sweep`: accuracy per phase residue under prefix padding or move mode. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "experiments/instrument.h"
#include "dist/dist.h"
#include "viz/draw.h"
#include "viz/results_check.h"
#include "interventions/stats.h"
#include "interventions/textkv.h"
#include "tasks/textkv_task.h"
#include "text/textutil.h"
#include "text/tokenizer.h"
#include "interventions/units.h"

static int run(const ps_args *a, ps_error *err);

static const ps_flag_spec FLAGS[] = {
    {"--mode", "pad|move", "pad (default) or move", 0},
    {"--task", "model|text-kv|FILE.json",
     "model (default): the task stored in the checkpoint; text-kv: key-value pairs\n"
     "written as text with --tokenizer (docs/text-experiments.md). A model trained on\n"
     "text-kv runs the text-kv sweep with either, its stored layout as the defaults.\n"
     "DeepSeek-V4 checkpoints: FILE.json, the prompts' task and token ids\n"
     "(docs/results-schema.md, \"DeepSeek-V4\"; default DIR/phasescope_task.json)",
     0},
    {"--tokenizer", "FILE", "text-kv: the model's tokenizer.json (default: the one a text-kv model trained with)", 0},
    {"--pairs", "N", "text-kv: key-value pairs per prompt (default 8)", 0},
    {"--words", "FILE", "text-kv: key words, one per line (default data/text/kv_keys.txt)", 0},
    {"--values", "numbers|words", "text-kv: values are 4-digit numbers (default) or words from --words", 0},
    {"--value-digits", "D", "text-kv: digits of a number value (default 4; 1-9): 5 gives 90,000 distinct values", 0},
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
        "p < 0.01 and the gap is at least 5 pp; only then the curve's periods are given: the repeat period (the\n"
        "smallest divisor d of P whose folding, the curve averaged over residues congruent mod d, explains 75% of\n"
        "its variance) and the DFT's dominant period (the JSON's repeat_period.period and dominant_period.period\n"
        "are null otherwise). Writes OUT/sweep.json.\n"
        "--task text-kv: the prompts are text (docs/text-experiments.md): --pairs lines \"The value of KEY is\n"
        "VALUE.\", a question for one key, the value teacher-forced as the answer (every answer token must be\n"
        "the top-1); pad inserts p tokens of filler text (--family NAME of data/text/fillers.json, default prose)\n"
        "before the pairs, move puts them around the queried pair; rho = t_K mod P, t_K the key's first token\n"
        "in its pair line. Prompts longer than 4096 tokens run through the chunked prefill.\n",
    .flags = FLAGS,
    .run = run,
};

/* the verdict and the periods come from the JSON just written, so the printed line and the file always agree */
void ps_sweep_summary_line(json_t *curve) {
    json_t *cs = json_object_get(curve, "chi_square"), *dp = json_object_get(curve, "dominant_period");
    json_t *rp = json_object_get(curve, "repeat_period");
    double p = json_number_value(json_object_get(cs, "p_value"));
    double gap = json_number_value(json_object_get(curve, "gap_pp"));
    char ptext[32];
    ps_format_p(ptext, sizeof ptext, p);
    printf("mean accuracy %.3f, min %.3f, gap %.1f pp; chi-square p %s%s: %s", json_number_value(json_object_get(curve, "mean_accuracy")),
           json_number_value(json_object_get(curve, "min_accuracy")), gap, ptext[0] == '<' ? "" : "= ", ptext,
           json_string_value(json_object_get(curve, "verdict")));
    if (json_is_integer(json_object_get(rp, "period")))
        printf(", repeats every %lld (folding R^2 %.2f)", (long long)json_integer_value(json_object_get(rp, "period")),
               json_number_value(json_object_get(rp, "r2")));
    if (json_is_number(json_object_get(dp, "period")))
        printf(", dominant period %.4g", json_number_value(json_object_get(dp, "period")));
    printf("\n");
}

static int run_textkv(const ps_args *a, ps_sweep_mode mode, ps_error *err);

/* Does the model of --model carry a text-kv task? (1 yes, 0 no, -1 error) */
static int model_is_textkv(const ps_args *a, ps_error *err) {
    char dir[4096];
    ps_model m;
    memset(&m, 0, sizeof m);
    if (ps_cli_model_dir(ps_args_get(a, "--model"), dir, sizeof dir, err) || ps_model_load(&m, dir, err)) return -1;
    ps_textkv_task t;
    int r = ps_textkv_checkpoint_task(&m, dir, &t, err);
    if (r == 1) ps_textkv_task_free(&t);
    ps_model_free(&m);
    return r;
}

static int run_model(const ps_args *a, ps_sweep_mode mode, ps_error *err);

static int run(const ps_args *a, ps_error *err) {
    int rc = 1;
    static const char *const MODES[] = {"pad", "move", NULL};
    int mi = 0;
    if (ps_args_choice(a, "--mode", MODES, &mi, err)) return 1;
    ps_sweep_mode mode = mi ? PS_SWEEP_MOVE : PS_SWEEP_PAD;
    if (ps_instr_is_v4(a)) return run_model(a, mode, err); /* a DeepSeek-V4 checkpoint: its --task file's prompts */
    static const char *const TASKS[] = {"model", "text-kv", NULL};
    int ti = 0;
    const char *task_flag = ps_args_get(a, "--task");
    if (task_flag && strcmp(task_flag, "model") && strcmp(task_flag, "text-kv") && strchr(task_flag, '.')) {
        ps_cli_usage(err, "--task %s: a task file applies to DeepSeek-V4 checkpoints (a phasescope model carries the task it was trained on)",
                     task_flag);
        return 1;
    }
    if (ps_args_choice(a, "--task", TASKS, &ti, err)) return 1;
    if (ti == 0) { /* --task model on a model trained on text-kv: the text-kv sweep with its layout */
        int r = model_is_textkv(a, err);
        if (ps_dist_agree(r < 0, err)) return 1;
        if (r) ti = 1;
    }
    if (ti == 1) { /* text prompts: whole on rank 0 */
        int r = ps_instr_whole_begin(a, "the text-kv sweep", err);
        return ps_instr_whole_end(r == 1 ? run_textkv(a, mode, err) : r, err) ? 1 : 0;
    }
    static const char *const TEXT_ONLY[] = {"--tokenizer", "--pairs", "--words", "--values", "--value-digits", NULL};
    for (int i = 0; TEXT_ONLY[i]; i++)
        if (ps_args_has(a, TEXT_ONLY[i])) {
            ps_cli_usage(err, "%s: only with --task text-kv", TEXT_ONLY[i]);
            return 1;
        }
    rc = run_model(a, mode, err);
    return rc;
}

/* The sweep of the model's own task: units (shift, batch) with per-query outcomes (interventions/units.h);
 * a split run (MPI ranks, --shard) gathers them and ps_sweep_finish adds them up in the one-process order. */
static int run_model(const ps_args *a, ps_sweep_mode mode, ps_error *err) {
    ps_instr in = {0};
    ps_partial part = {0};
    ps_instr_work wk = {0};
    int64_t *w = NULL;
    int rc = 1;
    if (ps_dist_agree(ps_instr_setup(&in, a, 1, err), err)) goto done;
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
    int r = ps_sweep_units(&in.rt, &in.base, &in.task, in.fam, mode, in.P, in.seed, in.batch, wk.u0, wk.u1, part.arr[0].data,
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
    ps_sweep_summary_line(curve);
    rc = 0;
done:
    json_decref(res);
    ps_residue_stats_free(&st);
    return rc;
}

/* ---- --task text-kv ---- */

static void textkv_progress(int64_t done, int64_t total, void *user) {
    ps_instr *in = user;
    ps_progress_update(&in->bar, done, total, "shifts");
}

static int run_textkv(const ps_args *a, ps_sweep_mode mode, ps_error *err) {
    ps_instr in = {0};
    ps_residue_stats st = {0};
    ps_textkv_set set;
    memset(&set, 0, sizeof set);
    int have_set = 0;
    int64_t pairs = -1, seed = 0, tmin = INT64_MAX, tmax = 0;
    int *ok = NULL;
    double *lp = NULL;
    json_t *res = NULL;
    int rc = -1, vi = -1;
    static const char *const VALUES[] = {"numbers", "words", NULL};
    ps_textkv_layout lay = {ps_args_get(a, "--tokenizer"), ps_args_get(a, "--words"), ps_args_get(a, "--family"), -1, -1, NULL, 0};
    ps_textkv_task trained;
    memset(&trained, 0, sizeof trained);
    int has_trained = 0;
    in.n_prompts = 256;
    in.batch = 32;
    if (ps_args_choice(a, "--values", VALUES, &vi, err) || ps_args_int(a, "--pairs", 1, 100000, &pairs, err) ||
        ps_args_int(a, "--n", 1, PS_RESULT_MAX_PROMPTS, &in.n_prompts, err) || ps_args_int(a, "--seed", 0, INT64_MAX, &seed, err) ||
        ps_args_int(a, "--batch", 1, 1 << 16, &in.batch, err) || ps_args_int(a, "--period", 1, PS_RESULT_MAX_PERIOD, &in.P, err))
        goto done;
    lay.pairs = pairs;
    lay.values = vi;
    if (ps_args_int(a, "--value-digits", 1, 9, &lay.value_digits, err)) goto done;
    in.seed = (uint64_t)seed;
    in.command = a->cmd->name;
    in.backend = ps_args_backend(a);
    in.cmdline = ps_args_command_line(a);
    const char *out = ps_args_get(a, "--out");
    snprintf(in.out_dir, sizeof in.out_dir, "%s", out ? out : "out/sweep");
    if (ps_cli_model_dir(ps_args_get(a, "--model"), in.model_dir, sizeof in.model_dir, err) || ps_model_load(&in.m, in.model_dir, err))
        goto done;
    if (!lay.tokenizer) { /* a model trained on text-kv names its tokenizer and its layout */
        has_trained = ps_textkv_checkpoint_task(&in.m, in.model_dir, &trained, err);
        if (has_trained < 0) goto done;
        if (has_trained) lay.trained = &trained;
    }
    if (!in.P) in.P = in.m.cfg.kind == PS_ATTN_COMPRESSED ? in.m.cfg.stride : 8;
    if (ps_textkv_set_open(&set, &lay, in.P, err)) goto done;
    have_set = 1;
    if (ps_model_to_backend(&in.m, in.backend, err) || ps_text_check_vocab(set.tok, set.tok_path, in.m.cfg.vocab_size, in.model_dir, err))
        goto done;
    if (ps_residue_stats_init(&st, in.P, err)) goto done;
    ok = malloc((size_t)(in.n_prompts * set.kv.n_queries) * sizeof *ok);
    lp = malloc((size_t)(in.n_prompts * set.kv.n_queries) * sizeof *lp);
    if (!ok || !lp) {
        ps_fail(err, "out of memory for the outcomes of %lld prompts", (long long)in.n_prompts);
        goto done;
    }
    ps_progress_init(&in.bar, (int64_t)1 << 40);
    for (int64_t p = 0; p < in.P; p++) {
        ps_shifted s;
        if (ps_textkv_shifted(&set.kv, mode, in.P, p, in.seed, in.n_prompts, in.m.cfg.max_seq_len, &s, err)) break;
        for (int64_t i = 0; i < s.b.B; i++) {
            int64_t T0 = ps_textkv_set_prompt_len(&set, &s.b.queries[i * s.b.max_q]);
            tmin = T0 < tmin ? T0 : tmin;
            tmax = T0 > tmax ? T0 : tmax;
        }
        int e = ps_eval_shifted_fit(&in.m, &s, in.batch, 0, ok, lp, err);
        if (!e) ps_residue_stats_add(&st, &s, ok, lp);
        ps_shifted_free(&s);
        if (e) break;
        textkv_progress(p + 1, in.P, &in);
        if (p + 1 == in.P) rc = 0;
    }
    ps_progress_end(&in.bar);
    if (rc) goto done;
    rc = -1;
    res = json_object();
    json_object_set_new(res, "kind", json_string("sweep"));
    json_t *prov = ps_instr_provenance(&in, mode == PS_SWEEP_PAD ? "pad" : "move"), *ev = json_object_get(prov, "eval");
    json_object_set_new(ev, "family", json_string(set.fam->name));
    json_object_set_new(ev, "task", json_string("text-kv"));
    json_object_set_new(prov, "task", ps_textkv_set_task_json(&set, tmin, tmax));
    json_object_set_new(res, "provenance", prov);
    json_t *curve = ps_residue_stats_json(&st, err);
    if (!curve) goto done;
    json_object_set_new(res, "curve", curve);
    if (ps_instr_write(&in, "sweep.json", res, err)) goto done;
    ps_sweep_summary_line(curve);
    rc = 0;
done:
    json_decref(res);
    free(ok);
    free(lp);
    ps_residue_stats_free(&st);
    if (have_set) ps_textkv_set_free(&set);
    if (has_trained > 0) ps_textkv_task_free(&trained);
    ps_instr_free(&in);
    return rc;
}
