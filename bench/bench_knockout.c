/* bench_knockout.c — seconds per knockout grid: the grid (clean activations kept per batch, cells run
 * from the knocked-out layer's attention, layers top-down) against a naive loop that runs a full forward
 * with overwrite hooks for every cell, on the same 8-layer model and prompts. Prints; asserts nothing. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>

#include "bench_common.h"
#include "knockout.h"
#include "model.h"
#include "sweep.h"

int main(int argc, char **argv) {
    int n_prompts = argc > 1 ? atoi(argv[1]) : 64;
    printf("phasescope bench_knockout (%s)\n\n", openblas_get_config());
    struct { const char *name; int64_t d, L, nh, nkv, dff; int comp; } cfgs[] = {
        {"compressed W8/S8 d=128 L=8 h=4/4", 128, 8, 4, 4, 384, 1},
        {"full attention   d=128 L=8 h=4/4", 128, 8, 4, 4, 384, 0},
    };
    ps_task t = {.kind = PS_TASK_KV, .seq_len = 120, .n_keys = 64, .n_values = 64, .n_fillers = 16, .n_pairs = 8,
                 .key_len = 2, .value_len = 2, .gap_min = 0, .gap_max = 6, .query_gap = 16, .n_queries = 4};
    ps_filler_family fam = {.name = "repeat", .n_pattern = 1, .pattern = {0}};
    printf("%d prompts of %lld tokens, %d queries each, period 8 (8 shifts), batch 32\n", n_prompts, (long long)t.seq_len,
           (int)t.n_queries);
    printf("%-36s %10s %10s %9s %12s\n", "model", "grid s", "naive s", "speed-up", "cells");
    for (int i = 0; i < 2; i++) {
        ps_config c = make_config(cfgs[i].d, cfgs[i].L, cfgs[i].nh, cfgs[i].nkv, cfgs[i].dff, 160, cfgs[i].comp);
        ps_model m;
        ps_error err;
        bench_model(&m, &c);
        ps_batch base;
        ps_batch_alloc(&base, n_prompts, t.seq_len, t.n_queries, &err);
        ps_task_generate(&t, 1, &base);
        int layers[8] = {0, 1, 2, 3, 4, 5, 6, 7}, heads[4] = {0, 1, 2, 3};
        ps_ko_target target = cfgs[i].comp ? PS_KO_COMPRESSED : PS_KO_RAW;
        double secs[2];
        for (int naive = 0; naive < 2; naive++) {
            ps_knockout_result r;
            double t0 = now();
            if (ps_knockout_grid(&m, &base, &t, &fam, 8, 0, 32, layers, 8, heads, 4, target, naive, &r, NULL, NULL, &err)) {
                fprintf(stderr, "%s\n", err.msg);
                return 1;
            }
            secs[naive] = now() - t0;
            ps_knockout_result_free(&r);
        }
        printf("%-36s %10.2f %10.2f %8.2fx %12d\n", cfgs[i].name, secs[0], secs[1], secs[1] / secs[0], 8 * 4);
        ps_batch_free(&base);
        ps_model_free(&m);
    }
    printf("\n(both include the pass that computes the means and the clean run; the grid skips the layers below each\n"
           "knocked-out layer and that layer's projections and compressor)\n");
    return 0;
}
