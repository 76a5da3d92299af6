/* instr_probe.c — the probe instrument (`phasescope probe`, cmd_probe.c's flags): the text-kv sweep or the
 * fillers experiment against a served model's /v1/completions (interventions/probe.h,
 * docs/served-models.md): the flags checked, the prompts built, the requests sent (or, --dry-run, counted),
 * the scoring it chose said on stdout with the reason, the result written. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/cpu_env.h"
#include "viz/draw.h"
#include "core/fileio.h"
#include "interventions/fillers.h"
#include "instruments/instrument.h"
#include "viz/results_check.h"
#include "interventions/textkv.h"
#include "text/tokenizer.h"
#ifdef PS_HAVE_PROBE /* the probe layer: built when libcurl is found (CMakeLists.txt) */
#include <curl/curl.h>

#include "probe/probe.h"

typedef struct {
    ps_progress bar;
    const ps_args *a; /* the caller's progress (ps_args.progress: the API's) */
} probe_ui;

static int on_progress(int64_t done, int64_t total, void *user) {
    probe_ui *ui = user;
    ps_progress_update(&ui->bar, done, total, "requests");
    return ui->a->progress ? ui->a->progress(done, total, ui->a->progress_user) : 0;
}

static json_t *provenance(const ps_args *a, const ps_probe *p, const char *cmdline, int64_t seed, int64_t P, int64_t n_prompts,
                          const char *family, const char *mode) {
    json_t *o = json_object(), *ev = json_object();
    json_object_set_new(o, "command", json_string(cmdline));
    json_object_set_new(o, "model", json_string(p->model));
    json_object_set_new(o, "endpoint", json_string(p->endpoint));
    json_object_set_new(o, "seed", json_integer(seed));
    json_object_set_new(o, "version", json_string(PS_VERSION));
    json_object_set_new(o, "backend", json_string("remote"));
    char compute[3000];
    snprintf(compute, sizeof compute, "served model %s at %s (OpenAI completions API)", p->model, p->endpoint);
    json_object_set_new(o, "compute", json_string(compute));
    const char *like = ps_args_get(a, "--like");
    if (like) json_object_set_new(o, "like", json_string(like));
    json_object_set_new(ev, "n_prompts", json_integer(n_prompts));
    json_object_set_new(ev, "period", json_integer(P));
    json_object_set_new(ev, "family", json_string(family));
    if (mode) json_object_set_new(ev, "mode", json_string(mode));
    json_object_set_new(o, "eval", ev);
    return o;
}

/* the API model (GET /v1/models unless --api-model), after the cheap local checks */
static int resolve(ps_probe *p, ps_error *err) {
    if (!p->dry_run && ps_probe_resolve_model(p, err)) return -1;
    if (!p->model[0]) snprintf(p->model, sizeof p->model, "(the first model the server lists)");
    return 0;
}

static void print_cost(const ps_out *po, const ps_probe *p, const ps_probe_cost *c) {
    ps_say(po, "plan: %lld requests to %s, %lld prompt tokens (longest %lld), at most %lld generated tokens; scoring %s%s\n",
           (long long)c->requests, p->endpoint, (long long)c->prompt_tokens, (long long)c->max_prompt_tokens,
           (long long)c->generated_tokens, ps_probe_scoring_name(c->scoring),
           c->scoring == PS_PROBE_AUTO ? " (one request per prompt when the server gives prompt log-probabilities; "
                                         "with --scoring greedy one per answer)"
                                       : "");
}

/* Which scoring the run used and why, on stdout (the provenance records it as probe.scoring). */
static void say_scoring(const ps_out *po, const ps_probe *p, const ps_probe_cost *c) {
    const char *name = ps_probe_scoring_name(c->scoring), *why;
    if (p->scoring != PS_PROBE_AUTO) why = "as --scoring asked";
    else if (c->resumed) why = "the scoring of the journal's run, which this run resumes";
    else if (c->scoring == PS_PROBE_PROMPT_LOGPROBS) why = "--scoring auto: the server returns prompt_logprobs";
    else if (c->scoring == PS_PROBE_ECHO) why = "--scoring auto: the server echoes the prompt with its log-probabilities (no prompt_logprobs)";
    else
        why = "--scoring auto: the server returned neither prompt_logprobs nor an echoed prompt with log-probabilities, so each "
              "answer is generated greedily (one request per answer; accuracy only: mean_logprob is null)";
    ps_say(po, "scoring: %s (%s)\n", name, why);
}

static const char *const PROBE_MODES[] = {"pad", "move", NULL};

/* One probe run: its flags, the client, where it writes and says things. */
typedef struct {
    const ps_args *a;
    int mi, ti, vi;                 /* --mode, --task, --values (-1: not given) */
    int64_t pairs, N, seed, P, mt;  /* --pairs (-1: not given), --n, --seed, --period (0: not given), --max-tokens */
    ps_probe p;
    ps_out po;
    char *cmdline;
    probe_ui ui;
    int journal;                    /* the journal (resume) is kept in --out */
    char jpath[4200];
} probe_run;

/* The flags: each one's range, the ones one task takes and the other refuses, and the client from them
 * (--endpoint, --timeout, --concurrency, --retries, --backoff, --api-key-env, --api-model). */
static int probe_flags(probe_run *r, ps_error *err) {
    static const char *const TASKS[] = {"text-kv", "fillers", NULL}, *const VALUES[] = {"numbers", "words", NULL},
                             *const SCORING[] = {"auto", "prompt-logprobs", "echo", "greedy", NULL};
    const ps_args *a = r->a;
    int si = 0;
    int64_t conc = 8, retries = 5, timeout = 600;
    double backoff = 1.0;
    if (ps_args_choice(a, "--mode", PROBE_MODES, &r->mi, err) || ps_args_choice(a, "--task", TASKS, &r->ti, err) ||
        ps_args_choice(a, "--values", VALUES, &r->vi, err) || ps_args_choice(a, "--scoring", SCORING, &si, err) ||
        ps_args_int(a, "--pairs", 1, 100000, &r->pairs, err) || ps_args_int(a, "--n", 1, PS_RESULT_MAX_PROMPTS, &r->N, err) ||
        ps_args_int(a, "--seed", 0, INT64_MAX, &r->seed, err) || ps_args_int(a, "--period", 1, PS_RESULT_MAX_PERIOD, &r->P, err) ||
        ps_args_int(a, "--concurrency", 1, 4096, &conc, err) || ps_args_int(a, "--retries", 0, 1000, &retries, err) ||
        ps_args_int(a, "--max-tokens", 0, 1, &r->mt, err) || ps_args_int(a, "--timeout", 1, 86400, &timeout, err) ||
        ps_args_positive(a, "--backoff", 3600, &backoff, err))
        return -1;
    if (r->ti == 1) {
        static const char *const KV_ONLY[] = {"--mode", "--pairs", "--words", "--values", "--value-digits", "--family", "--n", "--seed", "--like", NULL};
        for (int i = 0; KV_ONLY[i]; i++)
            if (ps_args_has(a, KV_ONLY[i])) return ps_cli_usage(err, "%s: only with --task text-kv", KV_ONLY[i]);
        if (!ps_args_has(a, "--experiment")) return ps_cli_usage(err, "--task fillers needs --experiment FILE");
        if (!ps_args_has(a, "--tokenizer")) return ps_cli_usage(err, "--task fillers needs --tokenizer (the served model's tokenizer.json)");
    } else if (ps_args_has(a, "--experiment"))
        return ps_cli_usage(err, "--experiment: only with --task fillers");
    ps_probe *p = &r->p;
    ps_probe_clean_url(ps_args_get(a, "--endpoint"), p->endpoint, sizeof p->endpoint);
    p->http.base = ps_args_get(a, "--endpoint");
    p->http.timeout_s = (double)timeout;
    p->http.concurrency = (int)conc;
    p->http.retries = (int)retries;
    p->http.backoff_s = backoff;
    p->http.backoff_max_s = 60;
    p->scoring = (ps_probe_scoring)si;
    p->max_tokens = (int)r->mt;
    p->dry_run = ps_args_has(a, "--dry-run");
    const char *key_env = ps_args_get(a, "--api-key-env");
    if (key_env) {
        p->http.api_key = getenv(key_env);
        if (!p->http.api_key || !p->http.api_key[0]) return ps_cli_usage(err, "--api-key-env %s: the variable is not set (or empty)", key_env);
    }
    if (ps_args_get(a, "--api-model")) snprintf(p->model, sizeof p->model, "%s", ps_args_get(a, "--api-model"));
    char url[4096];
    if (ps_http_url(&p->http, "/v1/completions", url, sizeof url, err)) return ps_cli_mark_usage(err);
    return 0;
}

/* --out (made with its parents, unless --dry-run or no journal is kept) and the journal's path in it */
static int probe_out_dir(probe_run *r, const char *out, ps_error *err) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", out);
    for (char *s = dir + 1; *s && !r->p.dry_run && r->journal; s++)
        if (*s == '/') {
            *s = '\0';
            if (ps_mkdir(dir, err)) return -1;
            *s = '/';
        }
    if (!r->p.dry_run && r->journal && ps_mkdir(dir, err)) return -1;
    return ps_path_join(r->jpath, sizeof r->jpath, dir, "probe-journal.jsonl", err);
}

/* --like DIR (text-kv): the checkpoint (*like), the period its family gives when --period is not given, and
 * its stored prompt layout (*trained, *have_trained) when --tokenizer is not given. */
static int probe_like(probe_run *r, const char *like_dir, ps_textkv_layout *lay, ps_model *like, int *have_like,
                      ps_textkv_task *trained, int *have_trained, ps_error *err) {
    if (ps_model_load(like, like_dir, err)) return -1;
    *have_like = 1;
    if (!r->P) { /* the model's default period, as its family computes it for every instrument */
        ps_runtime lrt;
        ps_runtime_wrap_model(&lrt, like);
        r->P = ps_runtime_default_period(&lrt);
    }
    if (!lay->tokenizer) {
        *have_trained = ps_textkv_checkpoint_task(like, like_dir, trained, err);
        if (*have_trained < 0) return -1;
        if (!*have_trained)
            return ps_cli_usage(err, "--like %s: the checkpoint was not trained on text-kv (no stored prompt layout); give --tokenizer", like_dir);
        lay->trained = trained;
    }
    return 0;
}

/* The text-kv sweep's result (sweep.json) from its residue statistics st. */
static int probe_textkv_result(probe_run *r, ps_textkv_set *set, ps_residue_stats *st, int64_t tmin, int64_t tmax,
                               const ps_probe_cost *cost, ps_error *err) {
    json_t *res = json_object();
    json_object_set_new(res, "kind", json_string("sweep"));
    json_t *prov = provenance(r->a, &r->p, r->cmdline, r->seed, r->P, r->N, set->fam->name, PROBE_MODES[r->mi]);
    json_object_set_new(json_object_get(prov, "eval"), "task", json_string("text-kv"));
    json_object_set_new(prov, "task", ps_textkv_set_task_json(set, tmin, tmax));
    json_object_set_new(prov, "probe", ps_probe_json(&r->p, cost));
    json_object_set_new(res, "provenance", prov);
    json_t *curve = ps_residue_stats_json(st, err);
    int rc = -1;
    if (curve) {
        if (cost->scoring == PS_PROBE_GREEDY) { /* a wrong greedy answer has no known log-probability */
            size_t i;
            json_t *e;
            json_array_foreach(json_object_get(curve, "residues"), i, e) json_object_set_new(e, "mean_logprob", json_null());
        }
        json_object_set_new(res, "curve", curve);
        if (!ps_result_write(&r->po, "sweep.json", res, err)) {
            ps_sweep_summary_line(&r->po, curve);
            rc = 0;
        }
    }
    json_decref(res);
    return rc;
}

/* --task text-kv: the prompts of the layout (--tokenizer, or --like's), the sweep's requests (or, --dry-run,
 * their count), the result. */
static int probe_textkv(probe_run *r, ps_error *err) {
    const ps_args *a = r->a;
    ps_probe *p = &r->p;
    ps_model like = {0};
    int have_like = 0, have_trained = 0, have_set = 0, rc = -1;
    ps_textkv_task trained;
    memset(&trained, 0, sizeof trained);
    ps_textkv_set set;
    memset(&set, 0, sizeof set);
    ps_residue_stats st = {0};
    json_t *plan = NULL;
    ps_probe_cost cost;
    ps_textkv_layout lay = {ps_args_get(a, "--tokenizer"), ps_args_get(a, "--words"), ps_args_get(a, "--family"), r->pairs, r->vi, NULL, 0};
    if (ps_args_int(a, "--value-digits", 1, 9, &lay.value_digits, err)) goto done;
    const char *like_dir = ps_args_get(a, "--like");
    if (like_dir && probe_like(r, like_dir, &lay, &like, &have_like, &trained, &have_trained, err)) goto done;
    if (!r->P) r->P = 8;
    if (!lay.tokenizer && !lay.trained) {
        ps_cli_usage(err, "--tokenizer is required (the served model's tokenizer.json), or --like DIR");
        goto done;
    }
    if (ps_textkv_set_open(&set, &lay, r->P, err)) goto done;
    have_set = 1;
    if (resolve(p, err)) goto done;
    p->tok = set.tok;
    plan = json_pack("{s:s, s:s, s:s, s:s, s:I, s:I, s:I, s:o, s:i}", "endpoint", p->endpoint, "api_model", p->model, "task", "text-kv",
                     "mode", PROBE_MODES[r->mi], "period", (json_int_t)r->P, "n", (json_int_t)r->N, "seed", (json_int_t)r->seed, "layout",
                     ps_textkv_set_task_json(&set, 0, 0), "max_tokens", (int)r->mt);
    ps_progress_init(&r->ui.bar, r->N * r->P / 20 > 0 ? r->N * r->P / 20 : 1);
    int64_t tmin, tmax;
    if (ps_probe_textkv(p, &set, r->mi ? PS_SWEEP_MOVE : PS_SWEEP_PAD, r->N, (uint64_t)r->seed, r->journal ? r->jpath : NULL, plan, &st,
                        &tmin, &tmax, &cost, err)) {
        ps_progress_end(&r->ui.bar);
        goto done;
    }
    ps_progress_end(&r->ui.bar);
    if (p->dry_run) {
        ps_say(&r->po, "text-kv %s sweep, period %lld, %lld prompts per shift, %lld pairs and %lld queries per prompt, prompts of %lld-%lld tokens\n",
               PROBE_MODES[r->mi], (long long)r->P, (long long)r->N, (long long)set.kv.n_pairs, (long long)set.kv.n_queries, (long long)tmin,
               (long long)tmax);
        print_cost(&r->po, p, &cost);
        if (cost.scoring != PS_PROBE_GREEDY)
            ps_say(&r->po, "with --scoring greedy: %lld requests, %lld prompt tokens at most\n", (long long)(cost.requests * set.kv.n_queries),
                   (long long)(cost.prompt_tokens * set.kv.n_queries));
        rc = 0;
        goto done;
    }
    if (cost.resumed) ps_say(&r->po, "resumed: %lld of %lld requests were in %s\n", (long long)cost.resumed, (long long)cost.requests, r->jpath);
    say_scoring(&r->po, p, &cost);
    rc = probe_textkv_result(r, &set, &st, tmin, tmax, &cost, err);
done:
    json_decref(plan);
    ps_residue_stats_free(&st);
    if (have_set) ps_textkv_set_free(&set);
    if (have_trained > 0) ps_textkv_task_free(&trained);
    if (have_like) ps_model_free(&like);
    return rc;
}

/* The fillers experiment's result (fillers.json) from its body, and its pooled line. */
static int probe_fillers_result(probe_run *r, const ps_fillexp *ex, const ps_tokenizer *tok, const char *tok_path,
                                const char *exp_path, int64_t npts, json_t *body, const ps_probe_cost *cost, ps_error *err) {
    json_t *res = json_object();
    json_object_set_new(res, "kind", json_string("fillers"));
    char fams[1024] = "";
    for (int i = 0; i < ex->n_fams; i++) {
        size_t l = strlen(fams);
        snprintf(fams + l, sizeof fams - l, "%s%s", i ? ", " : "", ex->fams[i].name);
    }
    json_t *prov = provenance(r->a, &r->p, r->cmdline, (int64_t)ex->seed, r->P, npts, fams, NULL), *ev = json_object_get(prov, "eval");
    json_object_set_new(ev, "experiment", json_string(exp_path));
    json_object_set_new(ev, "candidates", json_integer(ex->n_cands));
    json_object_set_new(prov, "tokenizer", json_pack("{s:s, s:i}", "file", tok_path, "ids", (int)ps_tokenizer_vocab_size(tok)));
    json_object_set_new(prov, "probe", ps_probe_json(&r->p, cost));
    json_object_set_new(res, "provenance", prov);
    json_object_update(res, body);
    int rc = ps_result_write(&r->po, "fillers.json", res, err);
    if (!rc) {
        json_t *pl = json_object_get(res, "pooled");
        char pt[32];
        ps_format_p(pt, sizeof pt, json_number_value(json_object_get(pl, "p_value")));
        ps_say(&r->po, "pooled eta2 %.3f, permutation p %s (period %lld)\n", json_number_value(json_object_get(pl, "eta2")), pt, (long long)r->P);
    }
    json_decref(res);
    return rc ? -1 : 0;
}

/* --task fillers: the experiment's prompts (--experiment, --tokenizer), its requests (or, --dry-run, their
 * count), the result. */
static int probe_fillers(probe_run *r, ps_error *err) {
    const ps_args *a = r->a;
    ps_probe *p = &r->p;
    ps_fillexp ex = {0};
    ps_fillexp_result fr = {0};
    ps_tokenizer *tok = NULL;
    json_t *plan = NULL, *body = NULL;
    ps_probe_cost cost;
    int rc = -1;
    const char *tok_path = ps_args_get(a, "--tokenizer"), *exp_path = ps_args_get(a, "--experiment");
    if (ps_fillexp_load(exp_path, &ex, err) || ps_tokenizer_load(tok_path, &tok, err) || ps_fillexp_prepare(&ex, tok, err)) goto done;
    if (!r->P) r->P = ex.period ? ex.period : 8;
    if (resolve(p, err)) goto done;
    p->tok = tok;
    plan = json_pack("{s:s, s:s, s:s, s:s, s:I, s:I, s:i}", "endpoint", p->endpoint, "api_model", p->model, "task", "fillers", "experiment",
                     exp_path, "period", (json_int_t)r->P, "tokenizer_ids", (json_int_t)ps_tokenizer_vocab_size(tok), "max_tokens", (int)r->mt);
    int64_t npts = (int64_t)ex.n_fams * (ex.L_max - ex.L_min + 1);
    ps_progress_init(&r->ui.bar, npts * ex.n_cands / 20 > 0 ? npts * ex.n_cands / 20 : 1);
    int f = ps_probe_fillers(p, &ex, r->P, r->journal ? r->jpath : NULL, plan, &fr, &cost, err);
    ps_progress_end(&r->ui.bar);
    if (f) goto done;
    if (p->dry_run) {
        ps_say(&r->po, "fillers %s: %d families x %lld lengths x %d candidates, period %lld\n", ex.name, ex.n_fams, (long long)(ex.L_max - ex.L_min + 1),
               ex.n_cands, (long long)r->P);
        print_cost(&r->po, p, &cost);
        rc = 0;
        goto done;
    }
    if (cost.resumed) ps_say(&r->po, "resumed: %lld of %lld requests were in %s\n", (long long)cost.resumed, (long long)cost.requests, r->jpath);
    say_scoring(&r->po, p, &cost);
    if (!(body = ps_fillexp_json(&ex, tok, &fr, err))) goto done;
    rc = probe_fillers_result(r, &ex, tok, tok_path, exp_path, npts, body, &cost, err);
done:
    json_decref(plan);
    json_decref(body);
    ps_fillexp_result_free(&fr);
    ps_fillexp_free(&ex);
    ps_tokenizer_free(tok);
    return rc;
}

int ps_probe_command(const ps_args *a, ps_error *err) {
    probe_run r;
    memset(&r, 0, sizeof r);
    r.a = a, r.vi = -1, r.pairs = -1, r.N = 256, r.mt = 1;
    if (probe_flags(&r, err)) return -1;
    const char *out = ps_args_get(a, "--out") ? ps_args_get(a, "--out") : "out/probe";
    r.po = (ps_out){.dir = out, .sink = a->sink};
    r.cmdline = ps_args_command_line(a);
    r.ui.a = a;
    curl_global_init(CURL_GLOBAL_DEFAULT);
    /* the journal (resume) lives in --out; a library call without an "out" keeps none and writes nothing */
    r.journal = !a->sink || ps_args_get(a, "--out");
    int rc = -1;
    if (!probe_out_dir(&r, out, err)) {
        r.p.progress = on_progress;
        r.p.user = &r.ui;
        rc = r.ti == 0 ? probe_textkv(&r, err) : probe_fillers(&r, err);
    }
    free(r.cmdline);
    curl_global_cleanup();
    return rc;
}
#else
int ps_probe_command(const ps_args *a, ps_error *err) {
    (void)a;
    return ps_fail(err, "built without libcurl: `phasescope probe` needs it (Debian libcurl4-openssl-dev); "
                        "install it and configure again (cmake -S . -B build)");
}
#endif
