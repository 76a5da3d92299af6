/* cmd_info.c — `phasescope info`: the checkpoint's family describes it (the config, parameter counts by
 * group, KV-cache bytes per token, memory estimates: ps_family.describe), then its hook-point table (name
 * pattern, shape, head axis, the layers that have it) and the compute environment. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "experiments/cli.h"
#include "core/cpu_env.h"
#include "core/runtime.h"

static int run(const ps_args *a, ps_error *err);

static const ps_flag_spec FLAGS[] = {
    {"--model", "DIR", "checkpoint directory (default: the shipped model)", 0},
    {"--batch", "B", "batch size for the memory estimates", 0},
    PS_BACKEND_FLAG,
    {0},
};

const ps_command ps_cmd_info = {
    .name = "info",
    .summary = "config, parameters, KV-cache bytes per token, memory estimates",
    .description = "Prints the model's config, parameter counts by group, the KV-cache bytes per token of the\n"
                   "compressed cache versus a full-attention cache of the same shape, and the memory a forward pass\n"
                   "and a training step at max_seq_len would need (for a batch of B sequences, default 1), and the\n"
                   "model's hook points: name pattern, shape, head axis and the layers that have each (docs/hooks.md).\n",
    .flags = FLAGS,
    .run = run,
};

static int run(const ps_args *a, ps_error *err) {
    char dir[4096];
    int64_t B = 1;
    if (ps_args_int(a, "--batch", 1, 1 << 20, &B, err) || ps_cli_model_dir(ps_args_get(a, "--model"), dir, sizeof dir, err))
        return -1;
    /* the family that recognises the checkpoint describes it; the weights only where the family's account
     * needs them (a DeepSeek-V4 checkpoint: tensor headers only) */
    ps_runtime rt;
    ps_runtime_opts o = {.backend = ps_args_backend(a), .weights = 0, .lazy = -1};
    if (ps_runtime_open(&rt, dir, &o, err)) {
        ps_runtime_free(&rt);
        return -1;
    }
    const ps_family *f = rt.family;
    printf("model       %s\n", dir);
    int rc = f->describe(&rt, B, stdout, err);
    if (!rc) {
        /* the hook points, from the family's table */
        printf("\nhook points (%s; B sequences of T tokens; head: the axis that counts heads, slots or streams)\n", f->name);
        size_t w = 0, ws = 0;
        for (int i = 0; i < f->n_points; i++) {
            if (strlen(f->points[i].pattern) > w) w = strlen(f->points[i].pattern);
            if (strlen(f->points[i].shape) > ws) ws = strlen(f->points[i].shape);
        }
        for (int i = 0; i < f->n_points; i++) {
            const ps_point_info *p = &f->points[i];
            char layers[256], head[16];
            ps_runtime_point_layers(&rt, i, layers, sizeof layers);
            if (p->head_axis >= 0) snprintf(head, sizeof head, "%d", p->head_axis);
            else snprintf(head, sizeof head, "-");
            printf("  %-*s  %-*s  head %s  layers %s\n", (int)w, p->pattern, (int)ws, p->shape, head, layers);
        }
        char compute[512];
        ps_cpu_env_describe(compute, sizeof compute);
        ps_error ce;
        double rel = 0;
        int ok = ps_blas_selfcheck(&rel, &ce) == 0;
        printf("\ncompute     cpu: %s\n  sgemm check against a plain loop: %s (worst relative error %.2g)\n", compute,
               ok ? "passed" : "FAILED", rel);
    }
    ps_runtime_free(&rt);
    return rc;
}
