/* exec_forward.c — the body of `phasescope forward` (instruments/commands.h): the export path (SPEC §7), a
 * client of the public C API (include/phasescope.h: ps_api_open_ex, ps_api_run_with_cache), so the CLI and
 * every binding run the same code: each sequence of T.json runs on its own (batch of one); writes logits.{i}
 * [T_i, vocab] and {hook}.{i} (batch dimension dropped), the hook names checked against the family's point
 * table (docs/hooks.md; `phasescope info` lists them). DeepSeek-V4 checkpoints also take a layer count (stop
 * early: no logits, hooks past L refused) and lazy loading (one layer's weights in memory at a time). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "phasescope.h"
#include "core/safetensors.h"
#include "core/tokens.h"
#include "instruments/command.h"
#include "instruments/commands.h"
#include "instruments/tensor_list.h"

/* "0..L" (or "L"): the number of layers to run (its range is the API's check). */
static int parse_layers(const char *v, int64_t *n_run, ps_error *err) {
    const char *p = v;
    char *end;
    if (!strncmp(p, "0..", 3)) p += 3;
    else if (strstr(v, "..")) return ps_cli_usage(err, "--layers %s: must start at 0 (layers run from the embedding up)", v);
    long hi = strtol(p, &end, 10);
    if (end == p || *end || hi < 0) return ps_cli_usage(err, "--layers %s: expected 0..L", v);
    *n_run = (int64_t)hi + 1;
    return 0;
}

int ps_forward_command(const ps_forward_req *r, ps_error *err) {
    const char *tokens = r->tokens, *hooks_flag = r->hooks, *out_path = r->out, *layers = r->layers;
    int lazy = r->lazy, rc = -1, n_names = 0;
    int64_t n_run = 0;
    ps_api_model *m = NULL;
    ps_token_lists toks = {0};
    ps_tensor_list out = {0};
    char dir[4096], *names = NULL, opts[128];
    const char **hook = NULL;
    if (ps_cli_model_dir(r->model, dir, sizeof dir, err)) goto done;
    if (layers && parse_layers(layers, &n_run, err)) goto done;
    /* the checkpoint through the API: --lazy and --layers are its options (refused by a family without them) */
    if (n_run) snprintf(opts, sizeof opts, "{\"lazy\": %s, \"layers\": %lld}", lazy ? "true" : "false", (long long)n_run);
    else snprintf(opts, sizeof opts, "{\"lazy\": %s}", lazy ? "true" : "false");
    int orc = ps_api_open_ex(dir, r->backend, opts, &m, err->msg, sizeof err->msg);
    if (orc) {
        if (orc == PS_API_EINPUT && !strncmp(err->msg, "options: ", 9)) { /* the message names the flag */
            char m2[PS_ERROR_MAX];
            snprintf(m2, sizeof m2, "%s", err->msg + 9);
            const char *rest = strchr(m2, ':') ? strchr(m2, ':') + 2 : m2, *has = strstr(m2, "the model has ");
            long long L;
            if (!strncmp(m2, "\"lazy\"", 6)) ps_cli_usage(err, "--lazy: %.900s", rest);
            else if (has && sscanf(has, "the model has %lld", &L) == 1) /* out of range */
                ps_cli_usage(err, "--layers %s: %lld is out of range [0, %lld] (the model has %lld layers)", layers,
                             (long long)n_run - 1, L - 1, L);
            else ps_cli_usage(err, "--layers %s: %.900s", layers, rest);
        } else /* what the caller asked for and the family refuses (e.g. --lazy on a device): exit 2 */
            err->usage = orc == PS_API_EINPUT;
        goto done;
    }
    if (hooks_flag) { /* names against the family's table (the message lists the valid ones) */
        if (!(names = strdup(hooks_flag)) || !(hook = calloc(strlen(hooks_flag) / 2 + 2, sizeof *hook))) {
            ps_fail(err, "out of memory for the --hooks list");
            goto done;
        }
        for (char *save = NULL, *h = strtok_r(names, ",", &save); h; h = strtok_r(NULL, ",", &save)) {
            int64_t dims[4];
            char msg[PS_ERROR_MAX - 16];
            if (!ps_api_hook_shape(m, h, 1, 1, dims, msg, sizeof msg)) {
                if (n_run && strstr(msg, "is past the layers"))
                    ps_cli_usage(err, "--hooks: hook \"%s\" is past --layers %s (layers 0..%lld run)", h, layers, (long long)n_run - 1);
                else
                    ps_cli_usage(err, "--hooks: %s", msg);
                goto done;
            }
            hook[n_names++] = h;
        }
    }
    if (ps_tokens_load(tokens, 0, 0, &toks, err)) goto done;
    const int64_t n_ctx = ps_api_context_length(m);
    for (int i = 0; i < toks.n; i++)
        if (toks.len[i] > n_ctx) {
            ps_fail(err, "%s: sequence %d has %lld tokens, more than %s %lld by %lld", tokens, i, (long long)toks.len[i],
                    ps_api_context_length_name(m), (long long)n_ctx, (long long)(toks.len[i] - n_ctx));
            goto done;
        }
    for (int i = 0; i < toks.n; i++) {
        ps_api_output *o = NULL;
        static const char *const none[1] = {NULL};
        if (ps_api_run_with_cache(m, toks.seq[i], 1, toks.len[i], n_names ? hook : none, n_names, NULL, NULL, NULL, 0, NULL, &o,
                                  err->msg, sizeof err->msg)) {
            err->usage = 0;
            ps_fail_prefix(err, "%s: sequence %d: ", tokens, i);
            goto done;
        }
        char name[160];
        int64_t ls[3];
        const float *lg = ps_api_output_logits(o, ls);
        int bad = 0;
        if (lg) {
            snprintf(name, sizeof name, "logits.%d", i);
            bad = ps_tensor_list_push(&out, name, 2, ls + 1, lg, err);
        }
        for (int k = 0; k < ps_api_output_count(o) && !bad; k++) {
            int nd;
            const int64_t *s = ps_api_output_shape(o, k, &nd);
            /* a family whose table has a point named "logits" (DeepSeek-V4's): that point is the logits
             * already written as logits.{i}, the same values; one tensor of that name */
            if (lg && !strcmp(ps_api_output_name(o, k), "logits")) continue;
            snprintf(name, sizeof name, "%s.%d", ps_api_output_name(o, k), i);
            bad = ps_tensor_list_push(&out, name, nd - 1, s + 1, ps_api_output_data(o, k), err);
        }
        ps_api_output_free(o);
        if (bad) goto done;
    }
    if (ps_st_save(out_path, out.t, out.n, NULL, NULL, 0, err)) goto done;
    printf("wrote %d tensors for %d sequences to %s\n", out.n, toks.n, out_path);
    rc = 0;
done:
    free(hook);
    free(names);
    ps_tensor_list_free(&out);
    ps_tokens_free(&toks);
    ps_api_close(m);
    return rc;
}
