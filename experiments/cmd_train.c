/* cmd_train.c — `phasescope train --config CFG.json --out RUN/ [--resume]`. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "fileio.h"
#include "figures.h"
#include "progress.h"
#include "train.h"

static const char HELP[] =
    "usage: phasescope train --config CFG.json --out RUN/ [--resume] [--stop-after N]\n"
    "\n"
    "Trains a model from one JSON config {\"model\": {...}, \"task\": {...}, \"train\": {...}} (see\n"
    "docs/training.md). Writes RUN/config.json and RUN/model.safetensors (periodically and at the end,\n"
    "atomically), RUN/optimizer-STEP.safetensors (AdamW state) and RUN/train.jsonl: train records (step,\n"
    "loss, lr, grad_norm, tokens_per_s), held-out eval records (accuracy, loss) and, for compressed models,\n"
    "gate statistics (mean_gate, N_static, N_input, peak per layer, KV head and branch).\n"
    "\n"
    "  --config FILE     training config\n"
    "  --out DIR         run directory (must not hold a run unless --resume)\n"
    "  --resume          continue the run in DIR from its last checkpoint (same config); the losses equal\n"
    "                    those of an uninterrupted run\n"
    "  --stop-after N    stop (with a checkpoint) after N total steps, as an interruption would\n";

typedef struct {
    ps_progress bar;
} train_ui;

static void on_step(const ps_train_progress *p, void *user) {
    train_ui *ui = user;
    char note[160];
    int w = snprintf(note, sizeof note, "loss %.4f  lr %.2e  |g| %.3f", p->loss, p->lr, p->grad_norm);
    if (p->eval_accuracy >= 0) snprintf(note + w, sizeof note - (size_t)w, "  eval acc %.3f", p->eval_accuracy);
    ps_progress_update(&ui->bar, p->step, p->total, note);
}

int ps_cmd_train(int argc, char **argv) {
    if (ps_cli_wants_help(argc, argv)) {
        fputs(HELP, stdout);
        return 0;
    }
    ps_flag flags[] = {PS_FLAG("--config", true), PS_FLAG("--out", true), PS_FLAG("--resume", false),
                       PS_FLAG("--stop-after", true)};
    int npos;
    const char *pos[1];
    ps_error err = {0};
    ps_train_cfg cfg = {0};
    int64_t stop = -1;
    int rc = 1;
    if (ps_cli_parse(argc, argv, flags, 4, pos, 0, &npos, &err)) goto done;
    if (ps_cli_require(flags, 4, &err, "--config", "--out", NULL)) goto done;
    if (flags[3].value && ps_cli_int("--stop-after", flags[3].value, 0, INT64_MAX, &stop, &err)) goto done;
    if (ps_train_cfg_load(flags[0].value, &cfg, &err)) goto done;
    train_ui ui;
    ps_progress_init(&ui.bar, cfg.log_every);
    if (ps_train(&cfg, flags[1].value, flags[2].present, stop, on_step, &ui, &err)) {
        ps_progress_end(&ui.bar);
        goto done;
    }
    ps_progress_end(&ui.bar);
    char logp[4200];
    if (ps_path_join(logp, sizeof logp, flags[1].value, "train.jsonl", &err)) goto done;
    const char *paths[1] = {logp};
    if (ps_render(paths, 1, flags[1].value, NULL, 1, &err)) goto done;
    printf("run in %s\n", flags[1].value);
    rc = 0;
done:
    if (rc) {
        fprintf(stderr, "phasescope train: %s\n", err.msg);
        rc = ps_cli_status(&err);
    }
    ps_train_cfg_free(&cfg);
    return rc;
}
