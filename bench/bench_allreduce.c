/* bench_allreduce.c — the gradient all-reduce alone (ps_dist_allreduce_buf: reduce-scatter + all-gather
 * over MPI), for gradient sizes of the small models and larger: the median and the fastest of REPS calls
 * after a barrier. On a machine shared with other work the median carries the waits for a descheduled
 * rank; the fastest is close to what the transfer costs on idle cores. Run under mpirun (one rank: nothing
 * to sum). Usage: mpirun -np N bench_allreduce [REPS] */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"
#include "core/cpu_env.h"
#include "scaleout/dist.h"

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    char warning[PS_ERROR_MAX + 64];
    ps_cpu_env_prepare(argv, warning, sizeof warning);
    ps_error err = {0};
    if (ps_dist_init(&argc, &argv, &err)) {
        fprintf(stderr, "bench_allreduce: %s\n", err.msg);
        return 1;
    }
    int reps = argc > 1 ? atoi(argv[1]) : 50, R = ps_dist_size(), me = ps_dist_rank();
    if (reps < 1) reps = 1;
    if (me == 0) printf("gradient all-reduce over %d ranks (reduce-scatter + all-gather, floats), %d calls per size:\n", R, reps);
    static const double MB[] = {0.44, 1.5, 16, 64};
    double *t = malloc((size_t)reps * sizeof *t);
    for (size_t s = 0; s < sizeof MB / sizeof MB[0]; s++) {
        int64_t n = (int64_t)(MB[s] * 1e6 / 4);
        float *g = malloc((size_t)n * sizeof(float));
        for (int64_t i = 0; i < n; i++) g[i] = (float)(i % 7) * 0.25f;
        for (int r = 0; r < reps; r++) {
            if (ps_dist_barrier(&err)) break;
            double t0 = now();
            if (ps_dist_allreduce_buf(NULL, g, n, &err)) break;
            t[r] = now() - t0;
        }
        if (err.msg[0]) {
            fprintf(stderr, "bench_allreduce: %s\n", err.msg);
            return ps_dist_exit(1, 0);
        }
        qsort(t, (size_t)reps, sizeof *t, cmp);
        if (me == 0)
            printf("  %6.2f MB: median %8.3f ms, fastest %8.3f ms (%.2f GB/s of gradient)\n", MB[s], 1e3 * t[reps / 2], 1e3 * t[0],
                   MB[s] / 1e3 / t[0]);
        free(g);
    }
    free(t);
    return ps_dist_exit(0, 0);
}
