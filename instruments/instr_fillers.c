/* instr_fillers.c — the fillers instrument (`phasescope fillers`, cmd_fillers.c's flags): the text
 * experiment (interventions/fillers.h) on a checkpoint opened through its family (core/runtime.h), the
 * period from the experiment, else the family's default; writes OUT/fillers.json and its figure and says
 * the per-family and pooled statistics on stdout. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "viz/draw.h"
#include "interventions/fillers.h"
#include "instruments/instrument.h"
#include "viz/results_check.h"
#include "text/tokenizer.h"

#include "core/runtime.h"

static int progress(int64_t done, int64_t total, void *user) {
    ps_instr *in = user;
    ps_progress_update(&in->bar, done, total, "candidates");
    return in->progress ? in->progress(done, total, in->progress_user) : 0;
}

int ps_fillers_command(const ps_args *a, ps_error *err) {
    ps_instr in = {0};
    ps_fillexp e = {0};
    ps_fillexp_result r = {0};
    ps_tokenizer *tok = NULL;
    json_t *res = NULL, *body = NULL;
    int rc = 1;
    const char *tok_path = ps_args_get(a, "--tokenizer"), *exp_path = ps_args_get(a, "--experiment");
    int64_t P = 0;
    in.batch = 8;
    if (ps_args_int(a, "--period", 1, PS_RESULT_MAX_PERIOD, &P, err) || ps_args_int(a, "--batch", 1, 1 << 16, &in.batch, err))
        goto done;
    in.command = a->cmd->name;
    in.backend = ps_args_backend(a);
    in.cmdline = ps_args_command_line(a);
    const char *out = ps_args_get(a, "--out");
    snprintf(in.out_dir, sizeof in.out_dir, "%s", out ? out : "out/fillers");
    in.out = (ps_out){.dir = in.out_dir, .sink = a->sink};
    /* the cheap checks first: the experiment, the tokenizer and the prompts, then the model */
    if (ps_fillexp_load(exp_path, &e, err) || ps_tokenizer_load(tok_path, &tok, err) || ps_fillexp_prepare(&e, tok, err)) goto done;
    /* the checkpoint through its family (core/runtime.h); the experiment scores the family's answer rows */
    if (ps_cli_model_dir(ps_args_get(a, "--model"), in.model_dir, sizeof in.model_dir, err) || ps_instr_open(&in, a, err))
        goto done;
    if (ps_text_check_vocab(tok, tok_path, in.rt.family->vocab(&in.rt), in.model_dir, err)) goto done;
    if (!P) P = e.period ? e.period : ps_runtime_default_period(&in.rt);
    in.P = P;
    in.seed = e.seed;
    in.n_prompts = (int64_t)e.n_fams * (e.L_max - e.L_min + 1);
    ps_progress_init(&in.bar, (int64_t)1 << 40);
    int f = ps_fillexp_run(&in.rt, &e, P, in.batch, 0, &r, progress, &in, err);
    ps_progress_end(&in.bar);
    if (f) goto done;
    if (!(body = ps_fillexp_json(&e, tok, &r, err))) goto done;
    res = json_object();
    json_object_set_new(res, "kind", json_string("fillers"));
    json_t *prov = ps_instr_provenance(&in, NULL), *ev = json_object_get(prov, "eval"), *tk = json_object();
    char fams[1024] = "";
    for (int i = 0; i < e.n_fams; i++) {
        size_t l = strlen(fams);
        snprintf(fams + l, sizeof fams - l, "%s%s", i ? ", " : "", e.fams[i].name);
    }
    json_object_set_new(ev, "family", json_string(fams));
    json_object_set_new(ev, "experiment", json_string(exp_path));
    json_object_set_new(ev, "candidates", json_integer(e.n_cands));
    json_object_set_new(tk, "file", json_string(tok_path));
    json_object_set_new(tk, "ids", json_integer(ps_tokenizer_vocab_size(tok)));
    json_object_set_new(prov, "tokenizer", tk);
    json_object_set_new(res, "provenance", prov);
    json_object_update(res, body);
    if (ps_instr_write(&in, "fillers.json", res, err)) goto done;
    /* the summary, from the JSON just written */
    json_t *fj = json_object_get(res, "families"), *fo;
    size_t i;
    char pt[32];
    json_array_foreach(fj, i, fo) {
        json_t *t = json_object_get(fo, "test"), *pts = json_object_get(fo, "points");
        double md = 0;
        for (size_t k = 0; k < json_array_size(pts); k++) md += json_number_value(json_object_get(json_array_get(pts, k), "delta"));
        ps_format_p(pt, sizeof pt, json_number_value(json_object_get(t, "p_value")));
        ps_say(&in.out, "%-16s mean delta %+.4g, eta2 %.3f, permutation p %s\n", json_string_value(json_object_get(fo, "name")),
               md / (double)(json_array_size(pts) ? json_array_size(pts) : 1), json_number_value(json_object_get(t, "eta2")), pt);
    }
    json_t *pl = json_object_get(res, "pooled");
    ps_format_p(pt, sizeof pt, json_number_value(json_object_get(pl, "p_value")));
    ps_say(&in.out, "pooled           eta2 %.3f, permutation p %s (period %lld, %lld permutations)\n",
           json_number_value(json_object_get(pl, "eta2")), pt, (long long)P, (long long)e.permutations);
    rc = 0;
done:
    json_decref(res);
    json_decref(body);
    ps_fillexp_result_free(&r);
    ps_fillexp_free(&e);
    ps_tokenizer_free(tok);
    ps_instr_free(&in);
    return rc ? -1 : 0;
}
