/* bench_knockout.c — seconds per knockout grid on an 8-layer model, full attention and compressed:
 * the grid (clean activations kept per batch, cells of one layer batched into one forward as replicas,
 * restarted from the knocked-out layer's attention, truncated after the last answer row, last layer on
 * the answer rows only), the same grid one cell per forward, and a naive loop that runs a full forward
 * with the mean-replacement hook actions for every cell, on the same prompts. Prints; asserts nothing.
 *
 * The machine may be shared: besides the wall clock it prints the process CPU time (all threads), which
 * counts only this program's work, and the speed-ups by both.
 *
 * usage: bench_knockout [N_PROMPTS (64)] [BUDGET_MIB (the grid's default)] */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>

#include "bench_common.h"
#include "core/cpu_env.h"
#include "interventions/knockout.h"
#include "core/model.h"
#include "interventions/sweep.h"
#include "tasks/tasks.h"

/* CPU seconds of the whole process, all threads */
static double ko_cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
    char warning[256], blas[320];
    ps_cpu_env_prepare(argv, warning, sizeof warning); /* first: may re-exec with the right BLAS kernels */
    if (warning[0]) fprintf(stderr, "%s\n", warning);
    int n_prompts = argc > 1 ? atoi(argv[1]) : 64;
    double budget = argc > 2 ? atof(argv[2]) * 1048576.0 : ps_knockout_default_budget();
    if (n_prompts < 1 || budget <= 0) {
        fprintf(stderr, "usage: bench_knockout [N_PROMPTS >= 1] [BUDGET_MIB > 0]\n");
        return 2;
    }
    ps_cpu_env_describe(blas, sizeof blas);
    printf("phasescope bench_knockout (mean-replacement KV-head knockout grid)\nBLAS: %s\n\n", blas);
    struct { const char *name; int64_t d, L, nh, nkv, dff; int comp; } cfgs[] = {
        {"compressed W8/S8 d=128 L=8 h=4/4", 128, 8, 4, 4, 384, 1},
        {"full attention   d=128 L=8 h=4/4", 128, 8, 4, 4, 384, 0},
    };
    ps_task t = {.kind = PS_TASK_KV, .seq_len = 120, .n_keys = 64, .n_values = 64, .n_fillers = 16, .n_pairs = 8,
                 .key_len = 2, .value_len = 2, .gap_min = 0, .gap_max = 6, .query_gap = 16, .n_queries = 4};
    ps_filler_family fam = {.name = "repeat", .n_pattern = 1, .pattern = {0}};
    printf("%d prompts of %lld tokens, %d queries each, period 8 (8 shifts), batch 32, 8 layers x 4 heads = 32 cells,\n"
           "memory budget for the batched cells %.0f MiB\n\n",
           n_prompts, (long long)t.seq_len, (int)t.n_queries, budget / 1048576.0);
    printf("%-34s %-5s %8s %9s %8s %9s %9s %10s\n", "model", "clock", "grid s", "1-cell s", "naive s", "speed-up",
           "vs 1-cell", "cells/fwd");
    for (int i = 0; i < 2; i++) {
        ps_config c = make_config(cfgs[i].d, cfgs[i].L, cfgs[i].nh, cfgs[i].nkv, cfgs[i].dff, 160, cfgs[i].comp);
        ps_model m;
        ps_error err;
        bench_model(&m, &c);
        ps_batch base;
        ps_batch_alloc(&base, n_prompts, t.seq_len, t.n_queries, &err);
        if (ps_task_generate(&t, 1, &base, &err)) return 1;
        int layers[8] = {0, 1, 2, 3, 4, 5, 6, 7}, heads[4] = {0, 1, 2, 3};
        ps_ko_target target = cfgs[i].comp ? PS_KO_COMPRESSED : PS_KO_RAW;
        ps_knockout_opts opts[3] = {{.mem_bytes = budget}, {.mem_bytes = budget, .max_cells = 1}, {.naive = 1}};
        double secs[3], cpu[3];
        int cells = 0;
        int64_t prompts = 0;
        for (int k = 0; k < 3; k++) {
            ps_knockout_result r;
            double t0 = now(), c0 = ko_cpu_now();
            if (bench_knockout_opts(&m, &base, &t, &fam, 8, 0, 32, layers, 8, heads, 4, target, &opts[k], &r, &err)) {
                fprintf(stderr, "%s\n", err.msg);
                return 1;
            }
            secs[k] = now() - t0;
            cpu[k] = ko_cpu_now() - c0;
            if (k == 0) cells = r.cells_per_forward, prompts = r.prompts_per_forward;
            ps_knockout_result_free(&r);
        }
        printf("%-34s %-5s %8.2f %9.2f %8.2f %8.2fx %8.2fx %6d x %lld\n", cfgs[i].name, "wall", secs[0], secs[1], secs[2],
               secs[2] / secs[0], secs[1] / secs[0], cells, (long long)prompts);
        printf("%-34s %-5s %8.2f %9.2f %8.2f %8.2fx %8.2fx\n", "", "cpu", cpu[0], cpu[1], cpu[2], cpu[2] / cpu[0],
               cpu[1] / cpu[0]);
        fflush(stdout);
        ps_batch_free(&base);
        ps_model_free(&m);
    }
    printf("\n(every column includes the pass that computes the means and the clean run; speed-up = naive / grid,\n"
           "vs 1-cell = the same grid one cell per forward / grid; cpu = process CPU seconds, all threads;\n"
           "cells/fwd = cells x prompts per cell in one batched forward)\n");
    return 0;
}
