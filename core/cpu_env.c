/* cpu_env.c — BLAS kernel selection and OpenMP wait policy at start-up (see cpu_env.h). */
#define _GNU_SOURCE
#include "core/cpu_env.h"

#include <sched.h>
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/rng.h"

/* Environment variables this module uses to talk to the re-executed copy of the program. */
#define ENV_STATE "PS_CPU_ENV_STATE"   /* "auto" once the start-up decisions are made */
#define ENV_ORIGIN "PS_CPU_ENV_ORIGIN" /* the kernel family the library reported before we chose */

/* Kernel families, best first; a candidate that fails the self-check is replaced by the next. */
static const char *const CANDIDATES[] = {"SkylakeX", "Haswell", "Sandybridge", "Prescott"};
#define N_CANDIDATES 4

/* 4 = AVX-512, 3 = AVX2 + FMA, 2 = AVX, 1 = SSE3 and below. */
static int core_level(const char *name) {
    static const char *const l4[] = {"SkylakeX", "Cooperlake", "SapphireRapids"};
    static const char *const l3[] = {"Haswell", "Zen", "Excavator"};
    static const char *const l2[] = {"Sandybridge", "Bulldozer", "Piledriver", "Steamroller"};
    for (size_t i = 0; i < sizeof l4 / sizeof *l4; i++)
        if (!strcmp(name, l4[i])) return 4;
    for (size_t i = 0; i < sizeof l3 / sizeof *l3; i++)
        if (!strcmp(name, l3[i])) return 3;
    for (size_t i = 0; i < sizeof l2 / sizeof *l2; i++)
        if (!strcmp(name, l2[i])) return 2;
    return 1;
}

static int cpu_level(void) {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
        return 4;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return 3;
    if (__builtin_cpu_supports("avx")) return 2;
    return 1;
}

const char *ps_cpu_best_core(void) { return CANDIDATES[4 - cpu_level()]; }

const char *ps_blas_corename(void) {
    const char *n = openblas_get_corename();
    return n ? n : "unknown";
}

/* out[M,N] = A[M,K] · op(B) in double, B stored [N,K] (trans) or [K,N] */
static void ref_gemm(double *out, const float *A, const float *B, int M, int N, int K, int transB) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0;
            for (int k = 0; k < K; k++) s += (double)A[i * K + k] * (transB ? B[j * K + k] : B[k * N + j]);
            out[i * N + j] = s;
        }
}

int ps_blas_selfcheck(double *worst_rel, ps_error *err) {
    /* odd shapes reach the edge kernels, 192³ the packed main path */
    static const int shapes[][3] = {{67, 131, 97}, {1, 33, 257}, {192, 192, 192}, {5, 300, 17}};
    double worst = 0;
    ps_rng rng;
    ps_rng_seed(&rng, 12345);
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        size_t na = (size_t)M * K, nb = (size_t)N * K, nc = (size_t)M * N;
        float *A = malloc(na * sizeof *A), *B = malloc(nb * sizeof *B), *C = malloc(nc * sizeof *C);
        double *R = malloc(nc * sizeof *R);
        if (!A || !B || !C || !R) {
            free(A), free(B), free(C), free(R);
            return ps_fail(err, "BLAS self-check: out of memory");
        }
        for (size_t i = 0; i < na; i++) A[i] = (float)ps_rng_normal(&rng);
        for (size_t i = 0; i < nb; i++) B[i] = (float)ps_rng_normal(&rng);
        for (int transB = 0; transB < 2; transB++) {
            for (size_t i = 0; i < nc; i++) C[i] = 0.5f;
            /* C = A·op(B) + 1·C (accumulate) */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, transB ? CblasTrans : CblasNoTrans, M, N, K, 1.0f, A, K, B,
                        transB ? K : N, 1.0f, C, N);
            ref_gemm(R, A, B, M, N, K, transB);
            double num = 0, den = 0;
            for (size_t i = 0; i < nc; i++) {
                double d = fabs((double)C[i] - (R[i] + 0.5));
                if (!(d <= num)) num = d; /* NaN counts as worst */
                if (fabs(R[i] + 0.5) > den) den = fabs(R[i] + 0.5);
            }
            double rel = den > 0 ? num / den : num;
            if (!(rel <= worst)) worst = rel;
        }
        free(A), free(B), free(C), free(R);
    }
    if (worst_rel) *worst_rel = worst;
    /* float rounding over K <= 257 terms of N(0,1) products is ~1e-6 relative; a wrong kernel is O(1) */
    if (!(worst < 1e-4))
        return ps_fail(err, "BLAS self-check failed for kernel %s: sgemm differs from a plain loop by %.3g (relative)",
                       ps_blas_corename(), worst);
    return 0;
}

/* Cores this process may run on that no other runnable task is using right now: the affinity mask's
 * size minus the kernel's instantaneous count of runnable tasks (/proc/loadavg, 4th field), less
 * ourselves; the minimum of a few samples, at least 1. */
static int free_cores(void) {
    cpu_set_t set;
    int n = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1) n = 1;
    int running = 1 << 30;
    for (int i = 0; i < 3; i++) {
        FILE *f = fopen("/proc/loadavg", "r");
        int r = 0, t = 0;
        double a, b, c;
        if (f && fscanf(f, "%lf %lf %lf %d/%d", &a, &b, &c, &r, &t) == 5 && r < running) running = r;
        if (f) fclose(f);
        if (i < 2) usleep(2000);
    }
    if (running == 1 << 30) return n;
    int others = running - 1, free_n = n - (others > 0 ? others : 0);
    return free_n < 1 ? 1 : free_n > n ? n : free_n;
}

/* Ranks an MPI launcher started on this machine (1 when not launched, or PS_MPI=0): Open MPI's mpirun,
 * MPICH's hydra, Slurm's srun with an MPI plugin. Read from the environment: the decision is made before
 * MPI starts (and before the re-execution). */
static int launcher_local_ranks(void) {
    const char *off = getenv("PS_MPI"), *s;
    if (off && !strcmp(off, "0")) return 1;
    if ((s = getenv("OMPI_COMM_WORLD_LOCAL_SIZE")) && atoi(s) > 0) return atoi(s);
    if ((s = getenv("MPI_LOCALNRANKS")) && atoi(s) > 0) return atoi(s);
    if ((s = getenv("PMI_LOCAL_SIZE")) && atoi(s) > 0) return atoi(s);
    if ((getenv("PMIX_RANK") || getenv("PMI_RANK")) && (s = getenv("SLURM_STEP_TASKS_PER_NODE")) && atoi(s) > 0)
        return atoi(s); /* "2(x3)": the first node's count */
    return 1;
}

static void reexec(char **argv) {
    fflush(NULL);
    execv("/proc/self/exe", argv);
    /* execv returned: carry on in this process as it is */
}

void ps_cpu_env_prepare(char **argv, char *warning, size_t n) {
    if (n) warning[0] = '\0';
    const char *off = getenv("PS_NO_REEXEC");
    if (off && *off && strcmp(off, "0")) return;
    const char *state = getenv(ENV_STATE);
    if (state && !strcmp(state, "auto")) {
        /* the re-executed process: check the kernels we chose (never the user's) */
        const char *chosen = getenv("PS_CPU_ENV_CHOSEN");
        if (!chosen || !*chosen) return;
        ps_error e;
        double rel;
        if (ps_blas_selfcheck(&rel, &e) == 0) return;
        int i = 0;
        while (i < N_CANDIDATES && strcmp(CANDIDATES[i], chosen)) i++;
        if (i + 1 < N_CANDIDATES) {
            setenv("OPENBLAS_CORETYPE", CANDIDATES[i + 1], 1);
            setenv("PS_CPU_ENV_CHOSEN", CANDIDATES[i + 1], 1);
            reexec(argv);
        }
        snprintf(warning, n, "phasescope: warning: %s; running with it anyway", e.msg);
        return;
    }
    int change = 0;
    const char *wp = getenv("OMP_WAIT_POLICY"), *spin = getenv("GOMP_SPINCOUNT");
    if ((!wp || !*wp) && (!spin || !*spin)) {
        setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
        change = 1;
    }
    const char *nt = getenv("OMP_NUM_THREADS");
    int local = launcher_local_ranks();
    if ((!nt || !*nt) && local > 1) {
        /* one of `local` MPI ranks on this machine: an equal share of the cores that tasks other than ours
         * leave free (the sibling ranks, starting now, count as ours); a rank bound to its own cores
         * (mpirun --bind-to core) shares only those */
        int ncpu = (int)sysconf(_SC_NPROCESSORS_ONLN), f = free_cores(), aff = ncpu;
        cpu_set_t set;
        if (sched_getaffinity(0, sizeof set, &set) == 0) aff = CPU_COUNT(&set);
        if (aff >= ncpu) {
            int avail = f + local - 1 < ncpu ? f + local - 1 : ncpu;
            f = avail / local;
        }
        if (f < 1) f = 1;
        char buf[16];
        snprintf(buf, sizeof buf, "%d", f);
        setenv("OMP_NUM_THREADS", buf, 1);
        setenv("PS_CPU_ENV_THREADS", "rank", 1);
        change = 1;
    } else if (!nt || !*nt) {
        int ncpu = (int)sysconf(_SC_NPROCESSORS_ONLN), f = free_cores();
        if (f < ncpu) {
            char buf[16];
            snprintf(buf, sizeof buf, "%d", f);
            setenv("OMP_NUM_THREADS", buf, 1);
            setenv("PS_CPU_ENV_THREADS", "auto", 1);
            change = 1;
        }
    }
    const char *user_core = getenv("OPENBLAS_CORETYPE");
    if (!user_core || !*user_core) {
        /* PS_CPU_ENV_TEST_REPORTED stands in for the library's answer, so tests can take this path */
        const char *pretend = getenv("PS_CPU_ENV_TEST_REPORTED");
        const char *have = pretend && *pretend ? pretend : ps_blas_corename();
        if (core_level(have) < cpu_level()) {
            const char *best = ps_cpu_best_core();
            setenv("OPENBLAS_CORETYPE", best, 1);
            setenv("PS_CPU_ENV_CHOSEN", best, 1);
            setenv(ENV_ORIGIN, have, 1);
            change = 1;
        }
    }
    if (!change) return;
    setenv(ENV_STATE, "auto", 1);
    reexec(argv);
}

void ps_cpu_env_describe(char *out, size_t n) {
    const char *chosen = getenv("PS_CPU_ENV_CHOSEN"), *origin = getenv(ENV_ORIGIN), *state = getenv(ENV_STATE);
    const char *user_core = getenv("OPENBLAS_CORETYPE"), *wp = getenv("OMP_WAIT_POLICY");
    char how[160];
    if (state && chosen && *chosen)
        snprintf(how, sizeof how, "auto: CPU supports %s kernels, library reported %s", ps_cpu_best_core(),
                 origin && *origin ? origin : "a lower family");
    else if (user_core && *user_core)
        snprintf(how, sizeof how, "OPENBLAS_CORETYPE=%s set by the user", user_core);
    else
        snprintf(how, sizeof how, "library's own detection");
    const char *cfg = openblas_get_config();
    char ver[64] = "OpenBLAS";
    if (cfg) sscanf(cfg, "%63s", ver); /* "OpenBLAS" */
    const char *vnum = cfg ? strchr(cfg, ' ') : NULL;
    char num[32] = "";
    if (vnum) sscanf(vnum + 1, "%31s", num);
    const char *tauto = getenv("PS_CPU_ENV_THREADS");
    snprintf(out, n, "%s %s %s (%s), %d thread%s%s, OMP_WAIT_POLICY=%s", ver, num, ps_blas_corename(), how,
             openblas_get_num_threads(), openblas_get_num_threads() == 1 ? "" : "s",
             tauto && !strcmp(tauto, "auto")   ? " (cores free at start)"
             : tauto && !strcmp(tauto, "rank") ? " (a share of the cores free at start per MPI rank on this machine)"
                                               : "",
             wp && *wp ? wp : "default");
}
