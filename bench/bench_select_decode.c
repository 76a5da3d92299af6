/* bench_select_decode.c — one MiniCPM4 checkpoint (core/minicpm/) through its KV cache at one context: the
 * prefill of T random tokens (ps_minicpm_prefill), then decode steps (ps_minicpm_decode) on 1 thread and then
 * on 2 threads, and the memory the cache holds. bench/bench_select_decode.py writes the checkpoints (the same
 * weights with selection on and off) and runs this once per checkpoint and context.
 *
 *   bench_select_decode --model DIR --context T [--decode N] [--threads LIST] [--prefill-threads N]
 *     (--decode: timed steps per thread count, default 16, after one untimed step; --threads: the decode's
 *     thread counts, default 1,2; --prefill-threads: default 2)
 *
 * The machine is shared (other jobs hold the cores), so the figures are CPU seconds of the whole process
 * (CLOCK_PROCESS_CPUTIME_ID: all its threads), with the wall seconds beside them. Memory: the resident set
 * (/proc/self/statm) after the cache is created and after the prefill's activations are freed, against
 * ps_minicpm_cache_bytes at the cache's length.
 *
 * The resident pages of the cache's own arrays are counted with mincore too: the process's set also grows by the
 * pages of OpenBLAS's buffer that the prefill's large products touch (the warm-up's small ones touch fewer).
 *
 * Output: one JSON object on stdout (the driver collects them); progress on stderr. */
#include <malloc.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/cpu_env.h"
#include "core/minicpm/minicpm.h"
#include "core/rng.h"

static double wall_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int64_t rss_bytes(void) {
    long size = 0, res = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f) return -1;
    if (fscanf(f, "%ld %ld", &size, &res) != 2) res = -1;
    fclose(f);
    return res < 0 ? -1 : (int64_t)res * sysconf(_SC_PAGESIZE);
}

/* resident bytes of the pages under [p, p + n) (mincore) */
static int64_t resident(const void *p, int64_t n) {
    long pg = sysconf(_SC_PAGESIZE);
    uintptr_t a = (uintptr_t)p & ~(uintptr_t)(pg - 1), e = (uintptr_t)p + (uintptr_t)n;
    size_t npg = (e - a + (uintptr_t)pg - 1) / (uintptr_t)pg;
    unsigned char *v = malloc(npg ? npg : 1);
    int64_t r = 0;
    if (v && !mincore((void *)a, npg * (size_t)pg, v))
        for (size_t i = 0; i < npg; i++) r += v[i] & 1;
    else r = -1;
    free(v);
    return r < 0 ? -1 : r * pg;
}

/* the pages the cache's own arrays have resident (sizes as ps_minicpm_cache_create allocates them) */
static int64_t cache_resident(const ps_minicpm_config *c, const ps_minicpm_cache *kv) {
    int64_t Lr = c->n_layers, W = c->n_kv_heads * c->head_dim, K = c->sel.kernel, S = c->sel.stride;
    int64_t N1 = ps_select_n_windows(kv->cap, K, S), N2 = ps_select_n_windows(kv->cap, 4 * K, 4 * S);
    int64_t n[8] = {Lr * kv->cap * W, Lr * kv->cap * W, c->use_nope ? Lr * kv->cap * W : 0, Lr * N1 * W, Lr * N2 * W,
                    c->n_kv_heads * N1, Lr * c->n_kv_heads * kv->nb_cap, Lr * c->n_kv_heads * ps_select_slots(&c->sel)};
    const float *p[8] = {kv->k, kv->v, kv->kn, kv->k1, kv->k2, kv->P, kv->bs, kv->blocks};
    int64_t r = 0;
    for (int i = 0; i < 8; i++)
        if (n[i]) r += resident(p[i], 4 * n[i]);
    return r + ps_minicpm_acts_bytes(c, 1, 1); /* the one-row activations: small, counted as allocated */
}

static void die(const char *what, const ps_error *err) {
    fprintf(stderr, "bench_select_decode: %s: %s\n", what, err->msg);
    exit(1);
}

int main(int argc, char **argv) {
    char warn[512];
    ps_cpu_env_prepare(argv, warn, sizeof warn);
    if (warn[0]) fprintf(stderr, "%s\n", warn);
    const char *dir = NULL, *threads = "1,2";
    int64_t T = 0;
    int steps = 16, pre_threads = 2;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--model") && i + 1 < argc) dir = argv[++i];
        else if (!strcmp(argv[i], "--context") && i + 1 < argc) T = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--decode") && i + 1 < argc) steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = argv[++i];
        else if (!strcmp(argv[i], "--prefill-threads") && i + 1 < argc) pre_threads = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_select_decode --model DIR --context T [--decode N] [--threads LIST] [--prefill-threads N]\n");
            return 2;
        }
    }
    if (!dir || T < 1 || steps < 1 || pre_threads < 1) {
        fprintf(stderr, "bench_select_decode: --model DIR and --context T >= 1 are needed (--decode, --prefill-threads >= 1)\n");
        return 2;
    }
    int nthr[8], nt = 0;
    for (const char *p = threads; *p && nt < 8;) {
        nthr[nt++] = atoi(p);
        while (*p && *p != ',') p++;
        if (*p == ',') p++;
    }
    ps_error err;
    ps_minicpm_model m;
    if (ps_minicpm_model_load(&m, dir, &err)) die(dir, &err);
    const ps_minicpm_config *c = &m.cfg;
    int64_t cap = T + 1 + (int64_t)nt * steps;
    if (cap > c->max_position_embeddings) {
        fprintf(stderr, "bench_select_decode: context %lld + %lld steps exceeds max_position_embeddings %lld\n", (long long)T,
                (long long)(cap - T), (long long)c->max_position_embeddings);
        return 1;
    }
    int32_t *tok = malloc((size_t)cap * sizeof *tok);
    float *lg = malloc((size_t)c->vocab_size * sizeof *lg);
    ps_rng r;
    ps_rng_seed(&r, 7);
    for (int64_t i = 0; i < cap; i++) tok[i] = (int32_t)ps_rng_below(&r, (uint64_t)c->vocab_size);

    /* large buffers always from mmap and back to the system when freed (no dynamic threshold), so that the
     * resident set after the prefill holds the cache and not the freed activations; then a small warm-up on every
     * thread count (OpenMP's threads, OpenBLAS's buffers) before the baseline */
    mallopt(M_MMAP_THRESHOLD, 1 << 20);
    ps_minicpm_cache kv;
    {
        int64_t Tw = 512 < T ? 512 : T;
        if (ps_minicpm_cache_create(&kv, &m, Tw + 1, &err)) die("cache", &err);
        omp_set_num_threads(pre_threads);
        if (ps_minicpm_prefill(&m, &kv, tok, Tw - 1, lg, &err)) die("warm-up", &err);
        for (int k = 0; k < nt && kv.L < Tw + 1; k++) {
            omp_set_num_threads(nthr[k]);
            if (ps_minicpm_decode(&m, &kv, tok[kv.L], lg, &err)) die("warm-up", &err);
        }
        ps_minicpm_cache_free(&kv);
        malloc_trim(0);
    }
    int64_t rss0 = rss_bytes();
    if (ps_minicpm_cache_create(&kv, &m, cap, &err)) die("cache", &err);
    omp_set_num_threads(pre_threads);
    fprintf(stderr, "bench_select_decode: %s: prefill of %lld tokens (%s path) ...\n", dir, (long long)T,
            ps_minicpm_sparse(c, T) ? "sparse" : "dense");
    double w0 = wall_now(), c0 = cpu_now();
    if (ps_minicpm_prefill(&m, &kv, tok, T, lg, &err)) die("prefill", &err);
    double pre_wall = wall_now() - w0, pre_cpu = cpu_now() - c0;
    fprintf(stderr, "bench_select_decode:   prefill done: %.2f s CPU (%.2f wall)\n", pre_cpu, pre_wall);
    if (ps_minicpm_decode(&m, &kv, tok[kv.L], lg, &err)) die("decode", &err); /* untimed: first touch */
    printf("{\"model\": \"%s\", \"context\": %lld, \"sparse\": %s, \"prefill_threads\": %d, \"prefill_cpu_s\": %.4f, "
           "\"prefill_wall_s\": %.4f, \"decode\": [",
           dir, (long long)T, ps_minicpm_sparse(c, T) ? "true" : "false", pre_threads, pre_cpu, pre_wall);
    for (int k = 0; k < nt; k++) {
        omp_set_num_threads(nthr[k]);
        if (ps_minicpm_decode(&m, &kv, tok[kv.L], lg, &err)) die("decode", &err); /* the new thread count's start */
        int64_t L0 = kv.L;
        w0 = wall_now(), c0 = cpu_now();
        for (int s = 0; s < steps - 1; s++)
            if (ps_minicpm_decode(&m, &kv, tok[kv.L], lg, &err)) die("decode", &err);
        double dw = (wall_now() - w0) / (steps - 1 > 0 ? steps - 1 : 1), dc = (cpu_now() - c0) / (steps - 1 > 0 ? steps - 1 : 1);
        printf("%s{\"threads\": %d, \"steps\": %d, \"from\": %lld, \"cpu_s_per_token\": %.6f, \"wall_s_per_token\": %.6f}",
               k ? ", " : "", nthr[k], steps - 1, (long long)L0, dc, dw);
        fprintf(stderr, "bench_select_decode:   %d thread(s): %.2f ms CPU per token (%.2f ms wall)\n", nthr[k], 1e3 * dc, 1e3 * dw);
    }
    malloc_trim(0);
    int64_t rss1 = rss_bytes(), mres = cache_resident(c, &kv);
    printf("], \"length\": %lld, \"cache_formula_bytes\": %lld, \"rss_delta_bytes\": %lld, \"cache_resident_bytes\": %lld}\n",
           (long long)kv.L, (long long)ps_minicpm_cache_bytes(c, kv.L), (long long)(rss1 - rss0), (long long)mres);
    fprintf(stderr, "bench_select_decode:   cache %.2f MiB resident (its pages; process RSS grew %.2f MiB), formula %.2f MiB\n",
            (double)mres / 1048576.0, (double)(rss1 - rss0) / 1048576.0, (double)ps_minicpm_cache_bytes(c, kv.L) / 1048576.0);
    ps_minicpm_cache_free(&kv);
    ps_minicpm_model_free(&m);
    free(tok);
    free(lg);
    return 0;
}
