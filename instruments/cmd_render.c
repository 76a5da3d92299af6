/* cmd_render.c — `phasescope render`: redraw the figures of result files from the JSON alone. */
#define _POSIX_C_SOURCE 200809L
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "instruments/command.h"
#include "viz/figures.h"
#include "viz/results_check.h"

static int run(const ps_args *a, ps_error *err);

static const ps_flag_spec FLAGS[] = {
    {"--out", "DIR", "where the figures go (default: the first file's directory)", 0},
    {"--format", "pdf|svg", "also write a vector version: pdf or svg", 0},
    {"--measure", "nll|acc", "knockout colour: nll (change in mean target NLL, default) or acc (change in accuracy, pp)", 0},
    {0},
};

const ps_command ps_cmd_render = {
    .name = "render",
    .summary = "redraw the figures of result files (PNG, and PDF/SVG)",
    .description =
        "Redraws the figures of result files from the JSON alone (the same pixels the command drew). Each result\n"
        "is checked against docs/results-schema.md first; a malformed one is refused, naming the field at fault:\n"
        "  sweep.json          phase curve (several sweeps: one line per model, shared axes)\n"
        "  gatecycle.json      phase curves before and after cycling\n"
        "  knockout.json       knockout heatmap (several: side by side on a shared colour scale, e.g. the\n"
        "                      full-attention baseline next to a compressed model)\n"
        "  gates.json          gate concentration per layer, KV head and offset\n"
        "  RUN/train.jsonl     loss and accuracy curves, and gate concentration during training\n",
    .positional = "RESULT.json [MORE.json ...]",
    .max_positional = 64,
    .flags = FLAGS,
    .run = run,
};

static int run(const ps_args *a, ps_error *err) {
    const char *const *pos = a->pos;
    const char *out = ps_args_get(a, "--out"), *fmt = ps_args_get(a, "--format"), *measure = ps_args_get(a, "--measure");
    json_t *docs[64];
    int npos = a->n_pos, ndocs = 0;
    ps_render_opts o = {.format = PS_FMT_PNG};
    int rc = 1;
    char dir[4096];
    if (npos == 0) {
        ps_cli_usage(err, "no result file given (see --help)");
        goto done;
    }
    if (fmt) {
        if (!strcmp(fmt, "pdf")) o.format = PS_FMT_PDF;
        else if (!strcmp(fmt, "svg")) o.format = PS_FMT_SVG;
        else {
            ps_cli_usage(err, "--format %s: expected pdf or svg (PNG is always written)", fmt);
            goto done;
        }
        o.vector = 1;
    }
    static const char *const MEASURES[] = {"nll", "acc", NULL};
    int mi;
    if (ps_args_choice(a, "--measure", MEASURES, &mi, err)) goto done;
    o.measure = measure;
    if (out) snprintf(dir, sizeof dir, "%s", out);
    else {
        char tmp[4096];
        snprintf(tmp, sizeof tmp, "%s", pos[0]);
        snprintf(dir, sizeof dir, "%s", dirname(tmp));
    }
    /* every result is validated before anything is drawn (a training log is read line by line by the
     * renderer itself; what one figure can show is checked by the figures as they are laid out) */
    for (int i = 0; i < npos; i++) {
        size_t l = strlen(pos[i]);
        if (l > 6 && !strcmp(pos[i] + l - 6, ".jsonl")) continue;
        if (ps_results_load(pos[i], NULL, &docs[ndocs], err)) goto done;
        ndocs++;
    }
    /* the validated documents are what gets drawn (a training log, which has none, is read by the renderer) */
    if (ndocs == npos ? ps_render_docs(docs, pos, npos, dir, &o, 1, err) : ps_render(pos, npos, dir, &o, 1, err)) goto done;
    rc = 0;
done:
    for (int i = 0; i < ndocs; i++) json_decref(docs[i]);
    return rc;
}
