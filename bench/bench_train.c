/* bench_train.c — training-step throughput: forward + backward + AdamW for a small and a medium config,
 * full attention vs compressed W8/S8, as tokens/s and achieved GFLOP/s next to the machine's own
 * cblas_sgemm rate measured in the same run, with a per-op time breakdown. Prints; asserts nothing. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backward.h"
#include "bench_common.h"
#include "forward.h"
#include "model.h"
#include "optim.h"
#include "rng.h"

typedef struct {
    double step_s, opt_s;
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
    if (ps_acts_create(&a, c, B, T, true, &err) || ps_acts_create(&ga, c, B, T, false, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
    ps_optim_cfg oc;
    ps_optim_defaults(&oc);
    double t0 = 0, el = 0;
    for (int it = 0;; it++) {
        if (it == 1) { /* the first step warms up; profile from the second on */
            t0 = now();
            a.prof = &r.prof;
        }
        double lsum = 0;
        int64_t n = 0;
        memset(g, 0, (size_t)m.n_params * 4);
        ps_forward(&m, &a, tok, NULL, &err);
        ps_backward(&m, &a, &ga, tok, tgt, 1.0f / (float)(B * (T - 1)), g, &lsum, &n, &err);
        double to = now();
        double gn = ps_grad_norm(g, m.n_params);
        ps_adamw_update(&m, g, m1, m2, it + 1, 1e-4, gn > 1 ? 1 / gn : 1, &oc);
        if (it >= 1) {
            r.opt_s += now() - to;
            r.steps = it;
            el = now() - t0;
            if (el >= min_s && it >= 2) break;
        }
    }
    r.step_s = el / r.steps;
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
    double min_s = argc > 1 ? atof(argv[1]) : 2.0;
    printf("phasescope bench_train (forward + backward + AdamW, float32, CPU; %s)\n\n", openblas_get_config());
    printf("FLOPs per training step = 3 × forward FLOPs (the backward of every product is two products of the\n"
           "same size); forward FLOPs as in bench_forward:\n"
           "  per token & layer: 2d(nh+2nkv)hd + 2·nh·hd·d + 6·d·dff;  attention: 4·nh·hd per (query, entry seen)\n"
           "  compressed, per window & layer: 2·(2·W·nkv·d + 2·W·d·nkv·hd);  logits: 2·d·V per token\n"
           "  (the optimizer's ~10 FLOPs per parameter are left out)\n\n");
    struct { const char *name; int64_t d, L, nh, nkv, dff, B, T; } cfgs[] = {
        {"small  d=256 L=4 h=4/4 V=512 B=4 T=256", 256, 4, 4, 4, 768, 4, 256},
        {"medium d=512 L=8 h=8/8 V=512 B=4 T=512", 512, 8, 8, 8, 1536, 4, 512},
    };
    const char *cat[PS_PROF_N] = {"matmul", "attention", "compressor", "norm+rope", "other"};
    for (int i = 0; i < 2; i++) {
        double sg = sgemm_rate(cfgs[i].B * cfgs[i].T, cfgs[i].d, cfgs[i].dff);
        printf("%s   (same-run sgemm on [%lld x %lld] x [%lld x %lld]: %.1f GFLOP/s)\n", cfgs[i].name,
               (long long)(cfgs[i].B * cfgs[i].T), (long long)cfgs[i].d, (long long)cfgs[i].d, (long long)cfgs[i].dff, sg);
        printf("  %-18s %10s %10s %9s %7s   breakdown fwd | bwd (ms): %s\n", "attention", "ms/step", "tokens/s", "GFLOP/s",
               "/sgemm", "matmul, attention, compressor, norm+rope, other; optimizer");
        for (int comp = 0; comp < 2; comp++) {
            ps_config c = make_config(cfgs[i].d, cfgs[i].L, cfgs[i].nh, cfgs[i].nkv, cfgs[i].dff, cfgs[i].T, comp);
            result r = time_train(&c, cfgs[i].B, cfgs[i].T, min_s);
            double gf = 3 * forward_flops(&c, cfgs[i].B, cfgs[i].T) / r.step_s / 1e9;
            printf("  %-18s %10.1f %10.0f %9.1f %6.0f%%   ", comp ? "compressed W8/S8" : "full", r.step_s * 1e3,
                   (double)(cfgs[i].B * cfgs[i].T) / r.step_s, gf, 100 * gf / sg);
            for (int d = 0; d < 2; d++) {
                for (int k = 0; k < PS_PROF_N; k++) printf("%s%.1f", k ? " " : "", r.prof.seconds[d][k] * 1e3);
                printf(d ? "; " : " | ");
            }
            printf("%.1f\n", r.opt_s * 1e3);
        }
        (void)cat;
        printf("\n");
    }
    return 0;
}
