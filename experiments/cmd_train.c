/* cmd_train.c — `phasescope train --config CFG.json --out RUN/ [--resume]`. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "fileio.h"
#include "figures.h"
#include "progress.h"
#include "train.h"

static int run(const ps_args *a, ps_error *err);

static const ps_flag_spec FLAGS[] = {
    {"--config", "CFG.json", "training config", 1},
    {"--out", "DIR", "run directory (must not hold a run unless --resume)", 1},
    {"--resume", NULL,
     "continue the run in DIR from its last checkpoint (same config); the losses equal\n"
     "those of an uninterrupted run",
     0},
    {"--stop-after", "N", "stop (with a checkpoint) after N total steps, as an interruption would", 0},
    PS_BACKEND_FLAG,
    {0},
};

const ps_command ps_cmd_train = {
    .name = "train",
    .summary = "train a model (resumable); logs JSONL with gate statistics",
    .description =
        "Trains a model from one JSON config {\"model\": {...}, \"task\": {...}, \"train\": {...}} (see\n"
        "docs/training.md). Writes RUN/config.json and RUN/model.safetensors (periodically and at the end,\n"
        "atomically), RUN/optimizer-STEP.safetensors (AdamW state) and RUN/train.jsonl: train records (step,\n"
        "loss, lr, grad_norm, tokens_per_s), held-out eval records (accuracy, loss) and, for compressed models,\n"
        "gate statistics (mean_gate, N_static, N_input, peak per layer, KV head and branch).\n",
    .flags = FLAGS,
    .run = run,
};

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

static int run(const ps_args *a, ps_error *err) {
    const char *out = ps_args_get(a, "--out");
    ps_train_cfg cfg = {0};
    int64_t stop = -1;
    int rc = 1;
    if (ps_args_int(a, "--stop-after", 0, INT64_MAX, &stop, err)) goto done;
    if (ps_train_cfg_load(ps_args_get(a, "--config"), &cfg, err)) goto done;
    train_ui ui;
    ps_progress_init(&ui.bar, cfg.log_every);
    if (ps_train(&cfg, out, ps_args_has(a, "--resume"), stop, on_step, &ui, err)) {
        ps_progress_end(&ui.bar);
        goto done;
    }
    ps_progress_end(&ui.bar);
    char logp[4200];
    if (ps_path_join(logp, sizeof logp, out, "train.jsonl", err)) goto done;
    const char *paths[1] = {logp};
    if (ps_render(paths, 1, out, NULL, 1, err)) goto done;
    printf("run in %s\n", out);
    rc = 0;
done:
    ps_train_cfg_free(&cfg);
    return rc;
}
