/* exec_info.c — the body of `phasescope info` (instruments/commands.h): the checkpoint's family describes it
 * (the config, parameter counts by group, KV-cache bytes per token, memory estimates: ps_family.describe),
 * then its hook-point table (name pattern, shape, head axis, the layers that have it) and the compute
 * environment. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/chunks.h"
#include "core/cpu_env.h"
#include "core/model.h"
#include "core/runtime.h"
#include "instruments/command.h"
#include "instruments/commands.h"
#include "interventions/sweep.h"
#include "tasks/tasks.h"

/* Content chunk boundaries: the entries per token measured on 1024 sequences of the model's task (seed 0),
 * when the checkpoint stores one: chunks (those that end inside a sequence) / tokens. */
static void measure_chunks(const ps_model *m, const char *dir, double per_tok_full) {
    ps_task t;
    ps_batch b = {0};
    ps_error e = {0};
    const int64_t N = 1024;
    if (ps_model_task(m, dir, &t, &e) || t.kind == PS_TASK_TEXT || t.seq_len < 1 || ps_batch_alloc(&b, N, t.seq_len, t.n_queries > 0 ? t.n_queries : 1, &e) ||
        ps_task_generate(&t, 0, &b, &e)) {
        ps_batch_free(&b);
        return;
    }
    int64_t T = b.T, nC = ps_config_n_windows(&m->cfg, T), chunks = 0;
    int64_t *cs = malloc((size_t)(nC > 0 ? nC : 1) * sizeof *cs), *cl = malloc((size_t)(nC > 0 ? nC : 1) * sizeof *cl);
    if (cs && cl) {
        int64_t covered = 0;
        for (int64_t s = 0; s < N; s++) {
            int64_t n = ps_content_chunks(&m->cfg, b.tokens + s * T, T, nC, cs, cl);
            chunks += n;
            for (int64_t j = 0; j < n; j++) covered += cl[j];
        }
        double ept = (double)chunks / (double)(N * T), len = chunks ? (double)covered / (double)chunks : 0;
        printf("  measured on %lld sequences of the model's task (T = %lld, seed 0): %.5f entries/token\n"
               "  (%.1f bytes/token; the tokens after a sequence's last boundary are in no chunk yet);\n"
               "  mean chunk length %.3f (%.5f entries per token inside chunks)\n",
               (long long)N, (long long)T, ept, ept * per_tok_full, len, len > 0 ? 1.0 / len : 0.0);
    }
    free(cs);
    free(cl);
    ps_batch_free(&b);
}

int ps_info_command(const ps_info_req *r, ps_error *err) {
    char dir[4096];
    int64_t B = r->batch;
    if (ps_cli_model_dir(r->model, dir, sizeof dir, err)) return -1;
    /* the family that recognises the checkpoint describes it; the weights only where the family's account
     * needs them (a DeepSeek-V4 checkpoint: tensor headers only) */
    ps_runtime rt;
    ps_runtime_opts o = {.backend = r->backend, .weights = 0, .lazy = -1};
    if (ps_runtime_open(&rt, dir, &o, err)) {
        ps_runtime_free(&rt);
        return -1;
    }
    const ps_family *f = rt.family;
    printf("model       %s\n", dir);
    int rc = f->describe(&rt, B, stdout, err);
    /* content chunk boundaries (a controlled-model config; other families have none): the entries per token
     * depend on the tokens, so measure them on the task */
    const ps_model *cm = ps_runtime_controlled(&rt);
    if (!rc && cm && cm->cfg.kind == PS_ATTN_COMPRESSED && cm->cfg.boundaries == PS_BOUNDARIES_CONTENT) {
        const ps_config *c = &cm->cfg;
        printf("\nKV entries of the content chunks, measured\n");
        measure_chunks(cm, dir, (double)c->n_layers * 2.0 * (double)(c->n_kv_heads * c->head_dim) * 4.0);
    }
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
