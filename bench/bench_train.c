/* bench_train.c — training-step throughput: forward + backward + AdamW for a small, a medium and a deep
 * config (12 layers of d 64, the shape of experiments/configs/deep), full attention vs compressed W8/S8,
 * as tokens/s and achieved GFLOP/s next to the machine's own cblas_sgemm rate measured in the same run,
 * with a per-op time breakdown. Prints; asserts nothing. `bench_train SECONDS deep`: that config alone. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/backward.h"
#include "bench_common.h"
#include "core/cpu_env.h"
#include "core/forward.h"
#include "core/model.h"
#include "train/optim.h"
#include "core/rng.h"

typedef struct {
    double step_s, opt_s, cpu_s; /* median wall seconds per step, optimizer, CPU seconds per step (mean) */
    ps_profile prof;
    int steps;
} result;

static result time_train(const ps_config *c, int64_t B, int64_t T, double min_s) {
    result r;
    memset(&r, 0, sizeof r);
    ps_model m;
    ps_error err;
    bench_model(&m, c);
    ps_rng rng;
    ps_rng_seed(&rng, 2);
    int32_t *tok = malloc((size_t)(B * T) * sizeof(int32_t)), *tgt = malloc((size_t)(B * T) * sizeof(int32_t));
    for (int64_t i = 0; i < B * T; i++) tok[i] = (int32_t)ps_rng_below(&rng, c->vocab_size);
    for (int64_t i = 0; i < B * T; i++) tgt[i] = (i + 1) % T ? tok[i + 1] : -1; /* loss on every position */
    float *g = calloc((size_t)m.n_params, 4), *m1 = calloc((size_t)m.n_params, 4), *m2 = calloc((size_t)m.n_params, 4);
    ps_acts a, ga;
    if (ps_acts_create(&a, m.ctx, c, B, T, true, &err) || ps_acts_create(&ga, m.ctx, c, B, T, false, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
    ps_optim_cfg oc;
    ps_optim_defaults(&oc);
    enum { MAXSTEPS = 1000 };
    double dt[MAXSTEPS], t_start = 0, c_start = 0;
    for (int it = 0;; it++) {
        if (it == 1) { /* the first step warms up; profile from the second on */
            t_start = now();
            c_start = cpu_now();
            a.prof = &r.prof;
        }
        double t0 = now(), lsum = 0;
        int64_t n = 0;
        memset(g, 0, (size_t)m.n_params * 4);
        ps_forward(&m, &a, tok, NULL, &err);
        ps_backward(&m, &a, &ga, tok, tgt, 1.0f / (float)(B * (T - 1)), g, &lsum, &n, &err);
        double to = cpu_now();
        double gn = 0;
        if (ps_grad_norm(m.ctx, g, m.n_params, &gn, &err) ||
            ps_adamw_update(&m, g, m1, m2, it + 1, 1e-4, gn > 1 ? 1 / gn : 1, &oc, &err)) {
            fprintf(stderr, "%s\n", err.msg);
            exit(1);
        }
        if (it >= 1) {
            r.opt_s += cpu_now() - to;
            dt[it - 1] = now() - t0;
            r.steps = it;
            if ((now() - t_start >= min_s && it >= 5) || it >= MAXSTEPS) break;
        }
    }
    r.cpu_s = (cpu_now() - c_start) / r.steps;
    r.step_s = median(dt, r.steps); /* median step: robust to other processes on a shared machine */
    r.opt_s /= r.steps;
    for (int d = 0; d < 2; d++)
        for (int k = 0; k < PS_PROF_N; k++) r.prof.seconds[d][k] /= r.steps;
    ps_acts_free(&a);
    ps_acts_free(&ga);
    free(tok); free(tgt); free(g); free(m1); free(m2);
    ps_model_free(&m);
    return r;
}

int main(int argc, char **argv) {
    char warning[256], blas[320];
    ps_cpu_env_prepare(argv, warning, sizeof warning); /* first: may re-exec with the right BLAS kernels */
    if (warning[0]) fprintf(stderr, "%s\n", warning);
    double min_s = argc > 1 ? atof(argv[1]) : 2.0;
    const char *only = argc > 2 ? argv[2] : NULL; /* "small", "medium" or "deep": that config alone */
    ps_cpu_env_describe(blas, sizeof blas);
    printf("phasescope bench_train (forward + backward + AdamW, float32, CPU)\nBLAS: %s\n\n", blas);
    printf("FLOPs per training step = 3 × forward FLOPs (the backward of every product is two products of the\n"
           "same size); forward FLOPs as in bench_forward:\n"
           "  per token & layer: 2d(nh+2nkv)hd + 2·nh·hd·d + 6·d·dff;  attention: 4·nh·hd per (query, entry seen)\n"
           "  compressed, per window & layer: 2·(2·W·nkv·d + 2·W·d·nkv·hd);  logits: 2·d·V per token\n"
           "  (the optimizer's ~10 FLOPs per parameter are left out)\n\n");
    struct { const char *name; int64_t d, L, nh, nkv, dff, B, T; } cfgs[] = {
        {"small  d=256 L=4 h=4/4 V=512 B=4 T=256", 256, 4, 4, 4, 768, 4, 256},
        {"medium d=512 L=8 h=8/8 V=512 B=4 T=512", 512, 8, 8, 8, 1536, 4, 512},
        /* the shape of experiments/configs/deep (d_model 64, 12 layers, 8 heads of 8, batch 32 of 72) */
        {"deep   d=64 L=12 h=8/8 V=512 B=32 T=72", 64, 12, 8, 8, 128, 32, 72},
    };
    for (int i = 0; i < (int)(sizeof cfgs / sizeof cfgs[0]); i++) {
        if (only && strncmp(cfgs[i].name, only, strlen(only))) continue;
        printf("%s   (same-run sgemm: [B·T x d] x [d x d_ff] = [%lld x %lld] x [%lld x %lld], measured next to each row)\n",
               cfgs[i].name, (long long)(cfgs[i].B * cfgs[i].T), (long long)cfgs[i].d, (long long)cfgs[i].d,
               (long long)cfgs[i].dff);
        printf("  %-18s %9s %9s %8s %8s %7s %9s %7s   breakdown fwd | bwd (CPU ms, all threads): matmul attention compressor "
               "norm+rope other | …; optimizer\n", "attention", "ms/step", "tokens/s", "GFLOP/s", "sgemm", "/sgemm",
               "cpu-ms", "/sgemm");
        for (int comp = 0; comp < 2; comp++) {
            ps_config c = make_config(cfgs[i].d, cfgs[i].L, cfgs[i].nh, cfgs[i].nkv, cfgs[i].dff, cfgs[i].T, comp);
            int64_t M = cfgs[i].B * cfgs[i].T;
            double sc0, sc1, sg0 = sgemm_rate(M, cfgs[i].d, cfgs[i].dff, &sc0);
            result r = time_train(&c, cfgs[i].B, cfgs[i].T, min_s);
            double sg1 = sgemm_rate(M, cfgs[i].d, cfgs[i].dff, &sc1), sg = 0.5 * (sg0 + sg1), sc = 0.5 * (sc0 + sc1);
            double fl = 3 * forward_flops(&c, cfgs[i].B, cfgs[i].T), gf = fl / r.step_s / 1e9, gfc = fl / r.cpu_s / 1e9;
            printf("  %-18s %9.1f %9.0f %8.1f %8.1f %6.0f%% %9.1f %6.0f%%   ", comp ? "compressed W8/S8" : "full",
                   r.step_s * 1e3, (double)M / r.step_s, gf, sg, 100 * gf / sg, r.cpu_s * 1e3, 100 * gfc / sc);
            for (int d = 0; d < 2; d++) {
                for (int k = 0; k < PS_PROF_N; k++) printf("%s%.1f", k ? " " : "", r.prof.seconds[d][k] * 1e3);
                printf(d ? "; " : " | ");
            }
            printf("%.1f\n", r.opt_s * 1e3);
            /* one machine-readable line per row (make bench joins these with bench/torch_peer.py's) */
            printf("#result %.*s %s ms_step=%.3f gflops=%.2f sgemm=%.2f cpu_ms_step=%.3f cpu_ratio=%.3f steps=%d\n",
                   (int)strcspn(cfgs[i].name, " "), cfgs[i].name, comp ? "compressed" : "full", r.step_s * 1e3, gf, sg,
                   r.cpu_s * 1e3, gfc / sc, r.steps);
            fflush(stdout);
        }
        printf("\n");
    }
    return 0;
}
