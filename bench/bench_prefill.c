/* bench_prefill.c — long contexts through the chunked prefill (core/prefill.h): peak memory and time of
 * one prompt of T tokens (logits at 16 answer positions), full and compressed attention, each run in a
 * child process so that its peak resident set (ru_maxrss) is its own. Also the 0.6B shape (Qwen3-0.6B:
 * 28 layers, d 1024, 16/8 heads, hd 128, d_ff 3072, vocab 151936) at short T: seconds per 1K tokens and
 * peak memory against the weights.
 *
 *   bench_prefill [--quick]     (--quick: the small model at 8K and 32K only)
 *
 * Output: a markdown table. Configurations whose estimated state exceeds the memory available are
 * reported as "does not fit" with the estimate instead of being run. */
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_common.h"
#include "core/cpu_env.h"
#include "core/fileio.h"
#include "core/prefill.h"

typedef struct {
    double wall, cpu, rss_mb, state_mb;
    int ok;
} result;

/* Run one prefill in a child; the child writes its timings through a pipe. */
static result run_child(const ps_config *c, int64_t T, int64_t chunk) {
    result r = {0};
    r.state_mb = ps_prefill_bytes(c, T, chunk) / 1e6;
    int fd[2];
    if (pipe(fd)) return r;
    pid_t pid = fork();
    if (pid == 0) {
        close(fd[0]);
        ps_model m;
        ps_error err;
        double out[2] = {-1, -1};
        if (ps_model_create(&m, c, &err) == 0) {
            ps_model_init(&m, 1);
            ps_rng rng;
            ps_rng_seed(&rng, 2);
            int32_t *tok = malloc((size_t)T * sizeof(int32_t));
            for (int64_t i = 0; i < T; i++) tok[i] = (int32_t)ps_rng_below(&rng, c->vocab_size);
            int64_t pos[16];
            for (int i = 0; i < 16; i++) pos[i] = T - 1 - i * (T / 16);
            float *lg = malloc((size_t)(16 * c->vocab_size) * sizeof(float));
            ps_prefill p;
            if (ps_prefill_create(&p, &m, T, chunk, &err) == 0) {
                double t0 = now(), c0 = cpu_now();
                if (ps_prefill_logits(&p, tok, T, pos, 16, lg, &err) == 0) {
                    out[0] = now() - t0;
                    out[1] = cpu_now() - c0;
                } else
                    fprintf(stderr, "%s\n", err.msg);
                ps_prefill_free(&p);
            } else
                fprintf(stderr, "%s\n", err.msg);
            free(tok);
            free(lg);
            ps_model_free(&m);
        } else
            fprintf(stderr, "%s\n", err.msg);
        if (write(fd[1], out, sizeof out) != (ssize_t)sizeof out) _exit(1);
        _exit(0);
    }
    close(fd[1]);
    double in[2] = {-1, -1};
    ssize_t got = read(fd[0], in, sizeof in);
    close(fd[0]);
    int status;
    struct rusage ru;
    wait4(pid, &status, 0, &ru);
    if (got == (ssize_t)sizeof in && in[0] >= 0) {
        r.ok = 1;
        r.wall = in[0];
        r.cpu = in[1];
        r.rss_mb = (double)ru.ru_maxrss / 1024.0 * 1.048576;
    }
    return r;
}

static void row(const char *name, const ps_config *c, int64_t T, int64_t chunk) {
    double avail = (double)ps_mem_available();
    double est = ps_prefill_bytes(c, T, chunk);
    if (avail > 0 && est > 0.8 * avail) {
        printf("| %s | %lld | does not fit: state %.1f GB > 80%% of %.1f GB available | | | |\n", name, (long long)T, est / 1e9,
               avail / 1e9);
        fflush(stdout);
        return;
    }
    result r = run_child(c, T, chunk);
    if (!r.ok) {
        printf("| %s | %lld | failed | | | |\n", name, (long long)T);
        return;
    }
    printf("| %s | %lld | %.1f | %.1f | %.3f | %.0f | %.0f |\n", name, (long long)T, r.wall, r.cpu, r.wall / ((double)T / 1000.0),
           r.state_mb, r.rss_mb);
    fflush(stdout);
}

int main(int argc, char **argv) {
    char warn[512] = "";
    ps_cpu_env_prepare(argv, warn, sizeof warn);
    if (warn[0]) fprintf(stderr, "%s\n", warn);
    int quick = argc > 1 && !strcmp(argv[1], "--quick");
    printf("chunked prefill, one prompt, logits at 16 positions; chunk %d tokens\n\n", 2048);
    printf("| model | T | wall s | CPU s | wall s / 1K tok | state MB (estimate) | peak RSS MB |\n|---|---|---|---|---|---|---|\n");
    int64_t Ts[3] = {8192, 32768, 131072};
    for (int comp = 1; comp >= 0; comp--) {
        ps_config c = make_config(256, 2, 4, 2, 1024, 131072, comp);
        c.vocab_size = 96;
        char name[64];
        snprintf(name, sizeof name, "2 layers d256 %s", comp ? "W8/S8" : "full");
        for (int i = 0; i < (quick ? 2 : 3); i++) row(name, &c, Ts[i], 2048);
    }
    if (!quick) {
        /* the 0.6B shape: weights 2.4 GB in float32 */
        for (int comp = 1; comp >= 0; comp--) {
            ps_config c = make_config(1024, 28, 16, 8, 3072, 131072, comp);
            c.vocab_size = 151936;
            c.head_dim = 128;
            c.tie_embeddings = true;
            c.rope_theta = 1e6;
            char name[64];
            snprintf(name, sizeof name, "Qwen3-0.6B shape %s", comp ? "W8/S8" : "full");
            row(name, &c, 1024, 1024);
            row(name, &c, 4096, 2048);
        }
        printf("\nweights of the 0.6B shape: 596049920 parameters = %.0f MB in float32\n", 596049920.0 * 4 / 1e6);
    }
    return 0;
}
