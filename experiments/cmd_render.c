/* cmd_render.c — `phasescope render`: redraw the figures of result files from the JSON alone. */
#define _POSIX_C_SOURCE 200809L
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "figures.h"
#include "results_check.h"

static const char HELP[] =
    "usage: phasescope render RESULT.json [MORE.json ...] [--out DIR] [--format pdf|svg] [--measure nll|acc]\n"
    "\n"
    "Redraws the figures of result files from the JSON alone (the same pixels the command drew). Each result\n"
    "is checked against docs/results-schema.md first; a malformed one is refused, naming the field at fault:\n"
    "  sweep.json          phase curve (several sweeps: one line per model, shared axes)\n"
    "  gatecycle.json      phase curves before and after cycling\n"
    "  knockout.json       knockout heatmap (several: side by side on a shared colour scale, e.g. the\n"
    "                      full-attention baseline next to a compressed model)\n"
    "  gates.json          gate concentration per layer, KV head and offset\n"
    "  RUN/train.jsonl     loss and accuracy curves, and gate concentration during training\n"
    "\n"
    "  --out DIR       where the figures go (default: the first file's directory)\n"
    "  --format F      also write a vector version: pdf or svg\n"
    "  --measure M     knockout colour: nll (change in mean target NLL, default) or acc (change in accuracy, pp)\n";

int ps_cmd_render(int argc, char **argv) {
    if (ps_cli_wants_help(argc, argv)) {
        fputs(HELP, stdout);
        return 0;
    }
    ps_flag flags[] = {PS_FLAG("--out", true), PS_FLAG("--format", true), PS_FLAG("--measure", true)};
    const char *pos[64];
    json_t *docs[64];
    int npos, ndocs = 0;
    ps_error err = {0};
    ps_render_opts o = {.format = PS_FMT_PNG};
    int rc = 1;
    char dir[4096];
    if (ps_cli_parse(argc, argv, flags, 3, pos, 64, &npos, &err)) goto done;
    if (npos == 0) {
        ps_cli_usage(&err, "no result file given (see --help)");
        goto done;
    }
    if (flags[1].value) {
        if (!strcmp(flags[1].value, "pdf")) o.format = PS_FMT_PDF;
        else if (!strcmp(flags[1].value, "svg")) o.format = PS_FMT_SVG;
        else {
            ps_cli_usage(&err, "--format %s: expected pdf or svg (PNG is always written)", flags[1].value);
            goto done;
        }
        o.vector = 1;
    }
    if (flags[2].value) {
        if (strcmp(flags[2].value, "nll") && strcmp(flags[2].value, "acc")) {
            ps_cli_usage(&err, "--measure %s: expected nll or acc", flags[2].value);
            goto done;
        }
        o.measure = flags[2].value;
    }
    if (flags[0].value) snprintf(dir, sizeof dir, "%s", flags[0].value);
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
        if (ps_results_load(pos[i], NULL, &docs[ndocs], &err)) goto done;
        ndocs++;
    }
    /* the validated documents are what gets drawn (a training log, which has none, is read by the renderer) */
    if (ndocs == npos ? ps_render_docs(docs, pos, npos, dir, &o, 1, &err) : ps_render(pos, npos, dir, &o, 1, &err)) goto done;
    rc = 0;
done:
    if (rc) {
        fprintf(stderr, "phasescope render: %s\n", err.msg);
        rc = ps_cli_status(&err);
    }
    for (int i = 0; i < ndocs; i++) json_decref(docs[i]);
    return rc;
}
