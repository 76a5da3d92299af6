/* bench_decode.c — decoding through the KV cache (core/kvcache.h) against the whole-sequence path (one
 * ps_forward of the grown sequence per new token, logits at the last row only: what `serve` and `fillers`
 * did before the cache), at contexts of 1K, 8K and 32K tokens:
 *   time to first token: the prompt prefilled into the cache (one append; the last logits);
 *   decode: tokens/s of batch-1 greedy steps through the cache (16 steps), and of the whole-sequence path
 *     (2 forward passes of T + 1 tokens; their median);
 *   the cache's bytes per token (measured: the pages it holds / T) against `info`'s formula.
 * Models (random weights, bench_model): the shape of data/models/deep_w8s8 (12 layers, d 64, 8 heads of 8,
 * d_ff 128, vocab 96, W8/S8) with a long context, and the same shape with full attention. --qwen adds a
 * Qwen3-0.6B-shaped W8/S8 model (28 layers, d 1024, 16/8 heads of 128, d_ff 3072, vocab 151936) at 1K
 * (the whole-sequence path there: one forward). Wall and CPU seconds; the machine is shared, so CPU time
 * is the steadier number.
 *
 *   bench_decode [--quick] [--qwen | --qwen-only]     (--quick: 1K and 8K only)
 *
 * Output: a markdown table. */
#include <stdio.h>
#include <string.h>

#include "bench_common.h"
#include "core/cpu_env.h"
#include "core/forward.h"
#include "core/kvcache.h"

static void row(const char *name, const ps_model *m, int64_t T, int decode_steps, int whole_runs) {
    const ps_config *c = &m->cfg;
    ps_error err;
    int64_t V = c->vocab_size;
    int32_t *tok = malloc((size_t)(T + decode_steps + 1) * sizeof(int32_t));
    float *lg = malloc((size_t)V * sizeof(float));
    ps_rng r;
    ps_rng_seed(&r, 3);
    for (int64_t i = 0; i < T + decode_steps + 1; i++) tok[i] = (int32_t)ps_rng_below(&r, V);
    ps_kvcache kv;
    ps_kvcache_opts o = {.chunk = 256};
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
    w0 = now(), c0 = cpu_now();
    for (int k = 0; k < decode_steps; k++) {
        int64_t one = 1;
        if (ps_kvcache_append(&kv, 1, &s, &one, tok + T + k, NULL, lg, true, &err)) {
            fprintf(stderr, "%s\n", err.msg);
            exit(1);
        }
    }
    double dec = (now() - w0) / decode_steps, dec_cpu = (cpu_now() - c0) / decode_steps;
    ps_kvcache_free(&kv);
    /* the whole-sequence path: one forward of T + 1 tokens for the next token */
    double ws[4], wc[4];
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
    double whole = median(ws, whole_runs), whole_cpu = median(wc, whole_runs);
    printf("| %s | %lld | %.3f (%.3f) | %.1f (%.1f) | %.2f (%.2f) | %.0fx (%.0fx) | %.1f | %.1f |\n", name, (long long)T, ttft,
           ttft_cpu, 1.0 / dec, 1.0 / dec_cpu, 1.0 / whole, 1.0 / whole_cpu, whole / dec, whole_cpu / dec_cpu, bytes,
           ps_kvcache_bytes_per_token(c));
    fflush(stdout);
    free(tok);
    free(lg);
}

int main(int argc, char **argv) {
    char warn[512] = "";
    ps_cpu_env_prepare(argv, warn, sizeof warn);
    if (warn[0]) fprintf(stderr, "%s\n", warn);
    int quick = 0, qwen = 0, deep = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = 1;
        else if (!strcmp(argv[i], "--qwen")) qwen = 1;
        else if (!strcmp(argv[i], "--qwen-only")) qwen = 1, deep = 0;
        else {
            fprintf(stderr, "usage: bench_decode [--quick] [--qwen | --qwen-only]\n");
            return 2;
        }
    }
    printf("decode through the KV cache vs the whole-sequence path (batch 1; wall, CPU in parentheses)\n\n");
    printf("| model | context T | time to first token s | cache decode tok/s | whole-sequence tok/s | speedup | cache bytes/token "
           "(measured at T) | info bytes/token |\n|---|---|---|---|---|---|---|---|\n");
    int64_t Ts[3] = {1024, 8192, 32768};
    for (int comp = 1; deep && comp >= 0; comp--) {
        ps_config c = make_config(64, 12, 8, 8, 128, 32768 + 64, comp);
        c.vocab_size = 96;
        ps_model m;
        bench_model(&m, &c);
        char name[64];
        snprintf(name, sizeof name, "deep_w8s8 shape, %s", comp ? "W8/S8" : "full");
        for (int i = 0; i < (quick ? 2 : 3); i++) row(name, &m, Ts[i], 16, i == 2 ? 1 : 2);
        ps_model_free(&m);
    }
    if (qwen) {
        ps_config c = make_config(1024, 28, 16, 8, 3072, 8192, 1);
        c.vocab_size = 151936;
        c.head_dim = 128;
        c.rope_theta = 1e6;
        ps_model m;
        bench_model(&m, &c);
        row("Qwen3-0.6B shape, W8/S8", &m, 1024, 8, 1);
        ps_model_free(&m);
    }
    return 0;
}
