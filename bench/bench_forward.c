/* bench_forward.c — forward-pass throughput (tokens/s, achieved GFLOP/s) for full attention and
 * compressed W8/S8 on a small and a medium config, next to the machine's own cblas_sgemm rate measured
 * in the same run, and how time grows with T (512 → 4096). Prints figures; asserts nothing. */
#define _POSIX_C_SOURCE 200809L
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/forward.h"
#include "core/model.h"
#include "core/rng.h"
#include "bench_common.h"
#include "core/cpu_env.h"

/* Seconds per forward: the median over repetitions (wall clock) and the mean CPU seconds (all threads). */
static double time_forward(const ps_config *c, int64_t B, int64_t T, double min_s, double *cpu_s) {
    ps_model m;
    ps_error err;
    bench_model(&m, c);
    ps_rng r;
    ps_rng_seed(&r, 3);
    int32_t *tok = malloc((size_t)(B * T) * sizeof(int32_t));
    for (int64_t i = 0; i < B * T; i++) tok[i] = (int32_t)ps_rng_below(&r, c->vocab_size);
    ps_acts a;
    if (ps_acts_create(&a, m.ctx, c, B, T, false, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
    ps_forward(&m, &a, tok, NULL, &err); /* warm-up */
    enum { MAXN = 2000 };
    static double dt[MAXN];
    int n = 0;
    double t0 = now(), c0 = cpu_now();
    do {
        double t1 = now();
        ps_forward(&m, &a, tok, NULL, &err);
        dt[n++] = now() - t1;
    } while ((now() - t0 < min_s || n < 3) && n < MAXN);
    if (cpu_s) *cpu_s = (cpu_now() - c0) / n;
    ps_acts_free(&a);
    free(tok);
    ps_model_free(&m);
    return median(dt, n);
}

int main(int argc, char **argv) {
    char warning[256], blas[320];
    ps_cpu_env_prepare(argv, warning, sizeof warning); /* first: may re-exec with the right BLAS kernels */
    if (warning[0]) fprintf(stderr, "%s\n", warning);
    double min_s = argc > 1 ? atof(argv[1]) : 1.0;
    ps_cpu_env_describe(blas, sizeof blas);
    printf("phasescope bench_forward (forward pass, float32, CPU)\nBLAS: %s\n\n", blas);
    printf("FLOPs counted per forward (multiply-add = 2):\n"
           "  per token & layer: 2d(nh+2nkv)hd + 2·nh·hd·d + 6·d·dff;  attention: 4·nh·hd per (query, entry seen)\n"
           "  compressed, per window & layer: 2·(2·W·nkv·d + 2·W·d·nkv·hd);  logits: 2·d·V per token\n\n");
    struct { const char *name; int64_t d, L, nh, nkv, dff, B, T; } cfgs[] = {
        {"small  d=128 L=4 h=4/4 T=256 B=8", 128, 4, 4, 4, 384, 8, 256},
        {"train-small d=256 L=4 h=4/4 T=256 B=4", 256, 4, 4, 4, 768, 4, 256},
        {"medium d=512 L=8 h=8/4 T=1024 B=2", 512, 8, 8, 4, 1536, 2, 1024},
    };
    printf("(ms/forward: median wall clock; cpu-ms: CPU seconds of all threads per forward; the ratios are to the\n"
           " same-run sgemm on the config's [B·T x d] x [d x d_ff], measured next to each row, by wall clock and by\n"
           " CPU time — on a shared machine the CPU-time ratio is the stable one)\n");
    printf("%-38s %-16s %11s %10s %8s %8s %7s %8s %7s\n", "config", "attention", "ms/forward", "tokens/s", "GFLOP/s",
           "sgemm", "ratio", "cpu-ms", "ratio");
    for (int i = 0; i < 3; i++) {
        for (int comp = 0; comp < 2; comp++) {
            ps_config c = make_config(cfgs[i].d, cfgs[i].L, cfgs[i].nh, cfgs[i].nkv, cfgs[i].dff, cfgs[i].T, comp);
            int64_t M = cfgs[i].B * cfgs[i].T;
            double sc0, sc1, sg0 = sgemm_rate(M, cfgs[i].d, cfgs[i].dff, &sc0), cpu;
            double s = time_forward(&c, cfgs[i].B, cfgs[i].T, min_s, &cpu);
            double sg = 0.5 * (sg0 + sgemm_rate(M, cfgs[i].d, cfgs[i].dff, &sc1)), sc = 0.5 * (sc0 + sc1);
            double fl = forward_flops(&c, cfgs[i].B, cfgs[i].T), gf = fl / s / 1e9;
            printf("%-38s %-16s %11.2f %10.0f %8.1f %8.1f %6.0f%% %8.2f %6.0f%%\n", cfgs[i].name,
                   comp ? "compressed W8/S8" : "full", s * 1e3, (double)M / s, gf, sg, 100 * gf / sg, cpu * 1e3,
                   100 * fl / cpu / 1e9 / sc);
            fflush(stdout);
        }
    }
    printf("\nscaling with T (d=256, L=4, h=4/4, B=1): time relative to T=512\n");
    printf("%-8s %14s %8s %14s %8s\n", "T", "full ms", "x", "compressed ms", "x");
    double base[2] = {0, 0};
    for (int64_t T = 512; T <= 4096; T *= 2) {
        double ms[2];
        for (int comp = 0; comp < 2; comp++) {
            ps_config c = make_config(256, 4, 4, 4, 768, 4096, comp);
            ms[comp] = time_forward(&c, 1, T, min_s / 2, NULL) * 1e3;
            if (T == 512) base[comp] = ms[comp];
        }
        printf("%-8lld %14.2f %8.2f %14.2f %8.2f\n", (long long)T, ms[0], ms[0] / base[0], ms[1], ms[1] / base[1]);
    }
    printf("(linear in T would be 8x at T=4096; quadratic 64x)\n");
    return 0;
}
