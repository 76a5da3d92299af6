/* cmd_train.c — `phasescope train --config CFG.json --out RUN/ [--resume]`. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "experiments/cli.h"
#include "dist/dist.h"
#include "core/fileio.h"
#include "viz/figures.h"
#include "experiments/progress.h"
#include "train/train.h"

static int run(const ps_args *a, ps_error *err);

static const ps_flag_spec FLAGS[] = {
    {"--config", "CFG.json", "training config", 1},
    {"--out", "DIR", "run directory (must not hold a run unless --resume)", 1},
    {"--resume", NULL,
     "continue the run in DIR from its last checkpoint (same config); the losses equal\n"
     "those of an uninterrupted run",
     0},
    {"--stop-after", "N", "stop (with a checkpoint) after N total steps, as an interruption would", 0},
    {"--init-from", "DIR",
     "start from this checkpoint's weights (same tensor shapes; e.g. a base model fine-tuned with\n"
     "staggered grids) instead of a random init: fresh optimizer, step 0; ignored with --resume",
     0},
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
        "gate statistics (mean_gate, N_static, N_input, peak per layer, KV head and branch).\n"
        "Under mpirun with N ranks the global batch (train.batch_size) is split over the ranks, the gradients are\n"
        "summed with MPI (every rank takes the same step), rank 0 writes the run; --resume works with any N\n"
        "(docs/scale-out.md).\n"
        "--device cuda trains on the GPU: the model is built (or loaded) on the host and moved there with its\n"
        "gradients, activations and AdamW moments; checkpoints copy weights and moments back (docs/cuda.md).\n",
    .flags = FLAGS,
    .run = run,
};

typedef struct {
    ps_progress bar;
    double t_prev, steps_s; /* time of the last step's callback; seconds of the steps after the first */
    int64_t n_steps;
    const ps_args *a; /* the caller's progress (ps_args.progress: the API's), steps done of the run's */
} train_ui;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int on_step(const ps_train_progress *p, void *user) {
    train_ui *ui = user;
    double t = now_s();
    if (ui->t_prev > 0) {
        ui->steps_s += t - ui->t_prev;
        ui->n_steps++;
    }
    ui->t_prev = t;
    char note[160];
    int w = snprintf(note, sizeof note, "loss %.4f  lr %.2e  |g| %.3f", p->loss, p->lr, p->grad_norm);
    if (p->eval_accuracy >= 0) snprintf(note + w, sizeof note - (size_t)w, "  eval acc %.3f", p->eval_accuracy);
    ps_progress_update(&ui->bar, p->step, p->total, note);
    return ui->a->progress ? ui->a->progress(p->step, p->total, ui->a->progress_user) : 0;
}

static int run(const ps_args *a, ps_error *err) {
    const char *out = ps_args_get(a, "--out");
    ps_train_cfg cfg = {0};
    int64_t stop = -1;
    int rc = 1;
    if (ps_args_int(a, "--stop-after", 0, INT64_MAX, &stop, err)) goto done;
    if (ps_train_cfg_load(ps_args_get(a, "--config"), &cfg, err)) goto done;
    cfg.init_from = ps_args_get(a, "--init-from");
    cfg.backend = ps_args_backend(a); /* --backend / --device and --precision (checked by the scaffold) */
    if (ps_args_get(a, "--precision")) ps_precision_parse(ps_args_get(a, "--precision"), &cfg.precision);
    train_ui ui = {.a = a};
    ps_progress_init(&ui.bar, cfg.log_every);
    int64_t calls0, bytes0;
    double ar0, wait0;
    ps_dist_allreduce_stats(&calls0, &bytes0, &ar0, &wait0);
    if (ps_train(&cfg, out, ps_args_has(a, "--resume"), stop, on_step, &ui, err)) {
        if (ps_dist_rank() == 0) ps_progress_end(&ui.bar);
        goto done;
    }
    if (ps_dist_rank() != 0) { /* rank 0 writes the run */
        rc = 0;
        goto done;
    }
    ps_progress_end(&ui.bar);
    if (ps_dist_size() > 1) {
        int64_t calls, bytes;
        double ar, wait;
        ps_dist_allreduce_stats(&calls, &bytes, &ar, &wait);
        calls -= calls0, ar -= ar0, wait -= wait0;
        double per = calls ? ar / (double)calls : 0, wper = calls ? wait / (double)calls : 0;
        double step = ui.n_steps ? ui.steps_s / (double)ui.n_steps : 0;
        printf("data parallel over %d ranks (global batch %lld): %.2f ms per step on rank 0, of which the gradient "
               "all-reduce (%.2f MB) %.2f ms (%.1f%%) and waiting for the slowest rank %.2f ms (%.1f%%)\n",
               ps_dist_size(), (long long)cfg.batch_size, 1e3 * step, calls ? (double)(bytes - bytes0) / (double)calls / 1e6 : 0,
               1e3 * per, step > 0 ? 100 * per / step : 0, 1e3 * wper, step > 0 ? 100 * wper / step : 0);
    }
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
