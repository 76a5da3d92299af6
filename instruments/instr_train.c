/* instr_train.c — the train instrument (instrument.h, ps_train_command): a training run of cmd_train.c's
 * config (train/train.h, ps_train) with its progress line (and the caller's progress callback, ps_args.progress),
 * the data-parallel timing summary under MPI, and the training log's figure. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "core/fileio.h"
#include "scaleout/dist.h"
#include "instruments/instrument.h"
#include "instruments/progress.h"
#include "train/train.h"
#include "viz/figures.h"

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

int ps_train_command(const ps_args *a, const ps_train_cfg *cfg, const char *out, int resume, int64_t stop, ps_error *err) {
    int rc = 1;
    train_ui ui = {.a = a};
    ps_out po = {.dir = out, .sink = a->sink}; /* a library call prints nothing (the run's files are its result) */
    ui.bar.silent = a->sink != NULL;
    ps_progress_init(&ui.bar, cfg->log_every);
    int64_t calls0, bytes0;
    double ar0, wait0;
    ps_dist_allreduce_stats(&calls0, &bytes0, &ar0, &wait0);
    if (ps_train(cfg, out, resume, stop, on_step, &ui, err)) {
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
        ps_say(&po, "data parallel over %d ranks (global batch %lld): %.2f ms per step on rank 0, of which the gradient "
               "all-reduce (%.2f MB) %.2f ms (%.1f%%) and waiting for the slowest rank %.2f ms (%.1f%%)\n",
               ps_dist_size(), (long long)cfg->batch_size, 1e3 * step, calls ? (double)(bytes - bytes0) / (double)calls / 1e6 : 0,
               1e3 * per, step > 0 ? 100 * per / step : 0, 1e3 * wper, step > 0 ? 100 * wper / step : 0);
    }
    char logp[4200];
    if (ps_path_join(logp, sizeof logp, out, "train.jsonl", err)) goto done;
    const char *paths[1] = {logp};
    if (ps_render(paths, 1, out, NULL, !a->sink, err)) goto done;
    ps_say(&po, "run in %s\n", out);
    rc = 0;
done:
    return rc;
}
