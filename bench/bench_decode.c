/* bench_decode.c — decoding through the KV cache (core/kvcache.h) against the whole-sequence path (one
 * ps_forward of the grown sequence per new token, logits at the last row only: what `serve` and `fillers`
 * did before the cache), at contexts of 1K, 8K and 32K tokens:
 *   time to first token: the prompt prefilled into the cache (one append; the last logits);
 *   decode: tokens/s of batch-1 greedy steps through the cache (16 steps), and of the whole-sequence path
 *     (2 forward passes of T + 1 tokens; their median);
 *   the memory-bandwidth bound of batch-1 decode: the bytes of parameters one decode step reads (every
 *     layer matrix and norm, the logits head; the compressor's gates and payloads once per window, so 1/S
 *     of them per token; the embedding's one row) over the read bandwidth measured in the same run, just
 *     before the decode (a sum over a 512 MiB array on the decode's threads; the best of 3 passes) — and
 *     the decode's tokens/s as a fraction of it;
 *   the cache's bytes per token (measured: the pages it holds / T) against `info`'s formula.
 * Models (random weights, bench_model): the shape of data/models/deep_w8s8 (12 layers, d 64, 8 heads of 8,
 * d_ff 128, vocab 96, W8/S8) with a long context, and the same shape with full attention. --qwen adds a
 * Qwen3-0.6B-shaped W8/S8 model (28 layers, d 1024, 16/8 heads of 128, d_ff 3072, vocab 151936, tied
 * embeddings) at the contexts of --qwen-contexts (default 1024; its whole-sequence path: one forward).
 * Wall and CPU seconds; the machine is shared, so CPU time is the steadier number.
 *
 *   bench_decode [--quick] [--contexts T,...] [--no-full | --full-only] [--qwen | --qwen-only] [--qwen-contexts T,...]
 *                [--no-whole] [--chunk ROWS]
 *     (--quick: 1K and 8K only; --contexts: the deep shapes' contexts; --no-full / --full-only: without /
 *     only the full-attention deep shape; --no-whole: skip the whole-sequence path; --chunk: the cache's rows
 *     per step, default 256)
 *
 * Output: a markdown table, and one '#decode' line per row (bench/torch_decode_peer.py --phasescope reads
 * them and prints the ratios). */
#include <omp.h>
#include <stdio.h>
#include <string.h>

#include "bench_common.h"
#include "core/cpu_env.h"
#include "core/forward.h"
#include "core/kvcache.h"

#define BW_FLOATS ((int64_t)128 << 20) /* 512 MiB: far past any cache */

/* Read bandwidth in bytes/s: the best of 3 sums over a (touched) array of BW_FLOATS floats on
 * omp_get_max_threads() threads, per wall second (returned) and per CPU second (*cpu_bw: the steadier
 * number on a shared machine, to set beside the decode's tokens per CPU second). sink keeps the sums
 * alive. */
static double read_bw(const float *a, double *sink, double *cpu_bw) {
    double best = 0;
    *cpu_bw = 0;
    for (int rep = 0; rep < 3; rep++) {
        double w0 = now(), c0 = cpu_now(), s = 0;
#pragma omp parallel for reduction(+ : s) schedule(static)
        for (int64_t blk = 0; blk < BW_FLOATS / 4096; blk++) {
            float acc[16] = {0};
            const float *p = a + blk * 4096;
            for (int64_t i = 0; i < 4096; i += 16)
                for (int k = 0; k < 16; k++) acc[k] += p[i + k];
            for (int k = 0; k < 16; k++) s += acc[k];
        }
        double dt = now() - w0, bw = (double)BW_FLOATS * sizeof(float) / dt,
               cb = (double)BW_FLOATS * sizeof(float) / (cpu_now() - c0);
        *sink += s;
        best = bw > best ? bw : best;
        *cpu_bw = cb > *cpu_bw ? cb : *cpu_bw;
    }
    return best;
}

/* Bytes of parameters one batch-1 decode step reads (see the header). */
static double weight_bytes_per_token(const ps_model *m) {
    const ps_config *c = &m->cfg;
    double b = 0;
    for (int i = 0; i < m->n_tensors; i++) {
        double n = (double)m->table[i].numel;
        switch (m->table[i].kind) {
        case PS_P_EMBED: b += (double)c->d_model; break; /* one row (a tied head is counted below) */
        case PS_P_KEY_PAYLOAD: case PS_P_VALUE_PAYLOAD: case PS_P_KEY_GATE_W: case PS_P_VALUE_GATE_W: case PS_P_KEY_GATE_B:
        case PS_P_VALUE_GATE_B: b += n / (double)c->stride; break;
        default: b += n;
        }
    }
    if (c->tie_embeddings) b += (double)c->vocab_size * (double)c->d_model;
    return 4.0 * b;
}

static int64_t g_chunk = 256; /* --chunk: rows per step of the prefill (ps_kvcache_opts.chunk) */

static void row(const char *name, const ps_model *m, int64_t T, int decode_steps, int whole_runs, const float *bw_arr) {
    const ps_config *c = &m->cfg;
    ps_error err;
    int64_t V = c->vocab_size;
    int32_t *tok = malloc((size_t)(T + decode_steps + 1) * sizeof(int32_t));
    float *lg = malloc((size_t)V * sizeof(float));
    ps_rng r;
    ps_rng_seed(&r, 3);
    for (int64_t i = 0; i < T + decode_steps + 1; i++) tok[i] = (int32_t)ps_rng_below(&r, V);
    ps_kvcache kv;
    ps_kvcache_opts o = {.chunk = g_chunk};
    if (ps_kvcache_create(&kv, m, &o, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
    int s = ps_kvcache_add(&kv, &err);
    double w0 = now(), c0 = cpu_now();
    int64_t n = T;
    if (ps_kvcache_append(&kv, 1, &s, &n, tok, NULL, lg, true, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
    double ttft = now() - w0, ttft_cpu = cpu_now() - c0;
    double bytes = (double)ps_kvcache_bytes(&kv) / (double)T;
    double sink = 0, bw_cpu, bw = read_bw(bw_arr, &sink, &bw_cpu);
    /* one untimed step first (the decode path's first touch of its buffers) */
    int64_t one = 1;
    if (ps_kvcache_append(&kv, 1, &s, &one, tok + T, NULL, lg, true, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
    w0 = now(), c0 = cpu_now();
    for (int k = 1; k <= decode_steps; k++) {
        if (ps_kvcache_append(&kv, 1, &s, &one, tok + T + k, NULL, lg, true, &err)) {
            fprintf(stderr, "%s\n", err.msg);
            exit(1);
        }
    }
    double dec = (now() - w0) / decode_steps, dec_cpu = (cpu_now() - c0) / decode_steps;
    ps_kvcache_free(&kv);
    /* the whole-sequence path: one forward of T + 1 tokens for the next token */
    double ws[4] = {0}, wc[4] = {0};
    for (int k = 0; k < whole_runs; k++) {
        ps_acts a;
        if (ps_acts_create_rows(&a, m->ctx, c, 1, T + 1, false, 1, &err)) {
            fprintf(stderr, "%s\n", err.msg);
            exit(1);
        }
        int64_t last = T;
        ps_acts_set_rows(&a, &last, 1, &err);
        w0 = now(), c0 = cpu_now();
        if (ps_forward(m, &a, tok, NULL, &err)) {
            fprintf(stderr, "%s\n", err.msg);
            exit(1);
        }
        ws[k] = now() - w0, wc[k] = cpu_now() - c0;
        ps_acts_free(&a);
    }
    double whole = whole_runs ? median(ws, whole_runs) : 0, whole_cpu = whole_runs ? median(wc, whole_runs) : 0;
    double wb = weight_bytes_per_token(m), bound = bw / wb, bound_cpu = bw_cpu / wb;
    char wh[96] = "-", sp[64] = "-";
    if (whole_runs) {
        snprintf(wh, sizeof wh, "%.3f (%.3f) | %.2f (%.2f)", whole, whole_cpu, 1.0 / whole, 1.0 / whole_cpu);
        snprintf(sp, sizeof sp, "%.0fx (%.0fx)", whole / dec, whole_cpu / dec_cpu);
    } else
        snprintf(wh, sizeof wh, "- | -");
    printf("| %s | %lld | %.3f (%.3f) | %.1f (%.1f) | %s | %s | %.1f | %.1f | %.1f | %.1f (%.1f) | %.2f (%.2f) | %.0f%% (%.0f%%) |\n", name,
           (long long)T, ttft, ttft_cpu, 1.0 / dec, 1.0 / dec_cpu, wh, sp, bytes, ps_kvcache_bytes_per_token(c), wb / 1e6, bw / 1e9,
           bw_cpu / 1e9, bound, bound_cpu, 100.0 * (1.0 / dec) / bound, 100.0 * (1.0 / dec_cpu) / bound_cpu);
    printf("#decode model=%s T=%lld ttft=%.6f ttft_cpu=%.6f step=%.6f step_cpu=%.6f whole=%.6f whole_cpu=%.6f bw=%.4g bw_cpu=%.4g wbytes=%.6g "
           "threads=%d sink=%.3g\n",
           c->vocab_size > 1000 ? "qwen" : c->kind == PS_ATTN_FULL ? "deep_full" : "deep_w8s8", (long long)T, ttft, ttft_cpu, dec,
           dec_cpu, whole, whole_cpu, bw, bw_cpu, wb, omp_get_max_threads(), sink);
    fflush(stdout);
    free(tok);
    free(lg);
}

/* "T,T,..." into out[8]: the count, or -1 with a message. */
static int parse_list(const char *arg, int64_t *out) {
    int n = 0;
    for (const char *p = arg; *p && n < 8;) {
        char *e;
        out[n] = strtoll(p, &e, 10);
        if (e == p || out[n] < 1) {
            fprintf(stderr, "expected T,T,... (positive integers), got \"%s\"\n", arg);
            return -1;
        }
        n++;
        p = *e == ',' ? e + 1 : e;
    }
    return n;
}

int main(int argc, char **argv) {
    char warn[512] = "";
    ps_cpu_env_prepare(argv, warn, sizeof warn);
    if (warn[0]) fprintf(stderr, "%s\n", warn);
    int quick = 0, qwen = 0, deep = 1, whole = 1, full = 1, comp_on = 1;
    int64_t qT[8] = {1024}, Ts[8] = {1024, 8192, 32768};
    int nq = 1, nd = 3;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = 1;
        else if (!strcmp(argv[i], "--qwen")) qwen = 1;
        else if (!strcmp(argv[i], "--qwen-only")) qwen = 1, deep = 0;
        else if (!strcmp(argv[i], "--no-whole")) whole = 0;
        else if (!strcmp(argv[i], "--no-full")) full = 0;
        else if (!strcmp(argv[i], "--full-only")) comp_on = 0;
        else if (!strcmp(argv[i], "--chunk") && i + 1 < argc && atoll(argv[i + 1]) > 0) g_chunk = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--qwen-contexts") && i + 1 < argc) {
            if ((nq = parse_list(argv[++i], qT)) < 0) return 2;
        } else if (!strcmp(argv[i], "--contexts") && i + 1 < argc) {
            if ((nd = parse_list(argv[++i], Ts)) < 0) return 2;
        } else {
            fprintf(stderr, "usage: bench_decode [--quick] [--contexts T,...] [--no-full | --full-only] [--qwen | --qwen-only] [--qwen-contexts T,...] [--no-whole] [--chunk ROWS]\n");
            return 2;
        }
    }
    char blas[256];
    ps_cpu_env_describe(blas, sizeof blas);
    float *bw_arr = malloc((size_t)BW_FLOATS * sizeof(float));
    if (!bw_arr) {
        fprintf(stderr, "out of memory for the bandwidth array\n");
        return 1;
    }
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < BW_FLOATS; i++) bw_arr[i] = (float)(i & 7);
    printf("decode through the KV cache vs the whole-sequence path (batch 1; wall, CPU in parentheses)\nBLAS: %s\n\n", blas);
    printf("| model | context T | time to first token s | cache decode tok/s | whole-sequence forward s | whole-sequence tok/s | "
           "speedup | cache bytes/token (measured at T) | info bytes/token | weight MB read/token | read GB/s wall (CPU) | bound tok/s wall (CPU) | "
           "decode / bound |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    if (quick) nd = 2;
    int64_t dmax = 0;
    for (int i = 0; i < nd; i++) dmax = Ts[i] > dmax ? Ts[i] : dmax;
    for (int comp = comp_on; deep && comp >= !full; comp--) {
        ps_config c = make_config(64, 12, 8, 8, 128, dmax + 64, comp);
        c.vocab_size = 96;
        ps_model m;
        bench_model(&m, &c);
        char name[64];
        snprintf(name, sizeof name, "deep_w8s8 shape, %s", comp ? "W8/S8" : "full");
        for (int i = 0; i < nd; i++) row(name, &m, Ts[i], 16, whole ? (Ts[i] > 16384 ? 1 : 2) : 0, bw_arr);
        ps_model_free(&m);
    }
    if (qwen) {
        int64_t Tmax = 0;
        for (int i = 0; i < nq; i++) Tmax = qT[i] > Tmax ? qT[i] : Tmax;
        ps_config c = make_config(1024, 28, 16, 8, 3072, Tmax + 64, 1);
        c.vocab_size = 151936;
        c.head_dim = 128;
        c.rope_theta = 1e6;
        ps_model m;
        bench_model(&m, &c);
        for (int i = 0; i < nq; i++) row("Qwen3-0.6B shape, W8/S8", &m, qT[i], 8, whole ? 1 : 0, bw_arr);
        ps_model_free(&m);
    }
    free(bw_arr);
    return 0;
}
