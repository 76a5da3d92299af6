/* bench_common.h — helpers shared by the bench programs: a clock, the machine's own sgemm rate, the
 * forward-pass FLOP count, and config construction. */
#ifndef PS_BENCH_COMMON_H
#define PS_BENCH_COMMON_H

#include <cblas.h>
#include <stdlib.h>
#include <time.h>

#include <stdio.h>

#include "core/config.h"
#include "interventions/knockout.h"
#include "core/model.h"
#include "core/rng.h"
#include "core/ops.h"

static inline double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Useful FLOPs of one forward pass of B sequences of T tokens (multiply-add = 2 FLOPs):
 *   per token and layer: 2d(nh + 2 nkv)hd (q, k, v) + 2 nh hd d (o) + 6 d dff (SwiGLU MLP)
 *   attention per query t: 4 nh hd · (number of entries it sees)        [scores + weighted sum]
 *     full: t + 1 entries; compressed: windows ended by t + min(local_window, t + 1)
 *   compressed, per window and layer: 2 branches × (2 W nkv d (gate logits) + 2 W d nkv hd (payloads))
 *   per token: 2 d V (logits) */
static inline double forward_flops(const ps_config *c, int64_t B, int64_t T) {
    double d = (double)c->d_model, hd = (double)c->head_dim, nh = (double)c->n_heads, nkv = (double)c->n_kv_heads;
    double per_tok_layer = 2 * d * (nh + 2 * nkv) * hd + 2 * nh * hd * d + 6 * d * (double)c->d_ff;
    double entries = 0;
    int64_t nW = ps_config_n_windows(c, T);
    for (int64_t t = 0; t < T; t++) {
        if (c->kind == PS_ATTN_FULL) entries += (double)(t + 1);
        else {
            int64_t lw = c->local_window < t + 1 ? c->local_window : t + 1;
            entries += (double)(ps_windows_seen(t, c->window, c->stride, nW) + lw);
        }
    }
    double attn = 4 * nh * hd * entries;
    double comp = c->kind == PS_ATTN_COMPRESSED
                      ? (double)nW * 2 * (2 * (double)c->window * nkv * d + 2 * (double)c->window * d * nkv * hd)
                      : 0;
    double per_layer = per_tok_layer * (double)T + attn + comp;
    return (double)B * ((double)c->n_layers * per_layer + (double)T * 2 * d * (double)c->vocab_size);
}

static inline ps_config make_config(int64_t d, int64_t L, int64_t nh, int64_t nkv, int64_t dff, int64_t max_T, int comp) {
    ps_config c;
    ps_config_defaults(&c);
    c.vocab_size = 512;
    c.d_model = d;
    c.n_layers = L;
    c.n_heads = nh;
    c.n_kv_heads = nkv;
    c.head_dim = d / nh;
    c.d_ff = dff;
    c.max_seq_len = max_T;
    c.kind = comp ? PS_ATTN_COMPRESSED : PS_ATTN_FULL;
    c.window = 8;
    c.stride = 8;
    c.local_window = 8;
    return c;
}

/* CPU seconds used by the whole process (all threads). On a shared machine the wall clock counts the
 * time other processes hold the cores; CPU time counts only our own work (and our threads' waits). */
static inline double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median of n values (sorts them). The machine is shared: medians of many short samples are far less
 * sensitive to other processes' bursts than a mean over one long interval. */
static inline double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* cblas_sgemm GFLOP/s on the shapes a forward pass multiplies: [B·T, K] × [K, N] (median over calls of
 * the wall clock); *cpu_rate (if not NULL): GFLOP per CPU-second over all calls, all threads together. */
static inline double sgemm_rate(int64_t M, int64_t K, int64_t N, double *cpu_rate) {
    float *A = malloc((size_t)(M * K) * 4), *Bm = malloc((size_t)(N * K) * 4), *C = malloc((size_t)(M * N) * 4);
    for (int64_t i = 0; i < M * K; i++) A[i] = (float)(i % 7) * 0.1f;
    for (int64_t i = 0; i < N * K; i++) Bm[i] = (float)(i % 5) * 0.1f;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)M, (int)N, (int)K, 1, A, (int)K, Bm, (int)K, 0, C, (int)N);
    enum { MAXN = 4096 };
    static double dt[MAXN];
    int n = 0;
    double t0 = now(), c0 = cpu_now();
    do {
        double t1 = now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)M, (int)N, (int)K, 1, A, (int)K, Bm, (int)K, 0, C, (int)N);
        dt[n++] = now() - t1;
    } while ((now() - t0 < 0.5 || n < 5) && n < MAXN);
    if (cpu_rate) *cpu_rate = 2.0 * (double)M * (double)K * (double)N * n / (cpu_now() - c0) / 1e9;
    free(A);
    free(Bm);
    free(C);
    return 2.0 * (double)M * (double)K * (double)N / median(dt, n) / 1e9;
}

/* A model for cfg with the standard init, and non-uniform gates so the compressor does real work. */
static inline void bench_model(ps_model *m, const ps_config *c) {
    ps_error err;
    if (ps_model_create(m, c, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
    ps_model_init(m, 1);
    ps_rng r;
    ps_rng_seed(&r, 2);
    for (int i = 0; i < m->n_tensors; i++)
        if (m->table[i].kind == PS_P_KEY_GATE_W || m->table[i].kind == PS_P_VALUE_GATE_W)
            for (int64_t j = 0; j < m->table[i].numel; j++) m->params[m->table[i].offset + j] = 0.05f * (float)ps_rng_normal(&r);
}


/* The controlled model's knockout grid with options (ps_knockout_run with the model's runtime). */
static inline int bench_knockout_opts(const ps_model *m, const ps_batch *base, const ps_task *task, const ps_filler_family *fam,
                                      int64_t P, uint64_t seed, int64_t batch, const int *layers, int n_layers, const int *heads,
                                      int n_heads, ps_ko_target target, const ps_knockout_opts *o, ps_knockout_result *out,
                                      ps_error *err) {
    ps_runtime rt;
    ps_runtime_model(&rt, m);
    ps_knockout_spec k = {.rt = &rt, .base = base, .task = task, .fam = fam, .P = P, .seed = seed, .batch = batch,
                          .layers = layers, .n_layers = n_layers, .heads = heads, .n_heads = n_heads,
                          .target = (int)target - 1, .opts = *o};
    return ps_knockout_run(&k, out, err);
}

#endif
