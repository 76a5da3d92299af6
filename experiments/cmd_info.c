/* cmd_info.c — `phasescope info`: the config, parameter counts by group, KV-cache bytes per token
 * (compressed versus its full-attention equivalent) and memory estimates. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "experiments/cli.h"
#include "experiments/cmd_v4.h"
#include "core/v4/v4_config.h"
#include "core/chunks.h"
#include "core/cpu_env.h"
#include "core/forward.h"
#include "core/fileio.h"
#include "core/model.h"
#include "interventions/sweep.h"
#include "tasks/tasks.h"

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
                   "and a training step at max_seq_len would need (for a batch of B sequences, default 1).\n",
    .flags = FLAGS,
    .run = run,
};

static void human(char *buf, size_t n, double bytes) {
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (bytes >= 1024 && i < 4) {
        bytes /= 1024;
        i++;
    }
    snprintf(buf, n, i ? "%.2f %s" : "%.0f %s", bytes, u[i]);
}

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
        printf("                        measured on %lld sequences of the model's task (T = %lld, seed 0): %.5f entries/token\n"
               "                        (%.1f bytes/token; the tokens after a sequence's last boundary are in no chunk yet);\n"
               "                        mean chunk length %.3f (%.5f entries per token inside chunks)\n",
               (long long)N, (long long)T, ept, ept * per_tok_full, len, len > 0 ? 1.0 / len : 0.0);
    }
    free(cs);
    free(cl);
    ps_batch_free(&b);
}

static int run(const ps_args *a, ps_error *err) {
    {
        /* a DeepSeek-V4 checkpoint: cmd_v4.c (SPEC-v4) */
        char vdir[4096], cpath[4200];
        ps_error verr = {0};
        int64_t vb = 1;
        if (ps_cli_model_dir(ps_args_get(a, "--model"), vdir, sizeof vdir, &verr) == 0) {
            snprintf(cpath, sizeof cpath, "%s/config.json", vdir);
            if (ps_v4_config_detect_file(cpath) == 1) {
                if (ps_args_int(a, "--batch", 1, 1 << 20, &vb, err)) return -1;
                return ps_v4_cmd_info(vdir, vb, err);
            }
        }
    }
    ps_model m = {0};
    char dir[4096];
    int64_t B = 1;
    if (ps_args_int(a, "--batch", 1, 1 << 20, &B, err) || ps_cli_model_dir(ps_args_get(a, "--model"), dir, sizeof dir, err) ||
        ps_model_load(&m, dir, err)) {
        ps_model_free(&m);
        return -1;
    }
    const ps_config *c = &m.cfg;
    char hash[17];
    ps_config_hash(c, hash);
    char *cj = ps_config_to_json(c);
    printf("model       %s\nconfig hash %s\n%s\n\n", dir, hash, cj);
    free(cj);

    const char *groups[] = {"embedding", "attention q/k/v/o", "qk-norm", "compressor payloads", "compressor gates",
                            "layer norms", "mlp", "lm_head (untied)"};
    int64_t cnt[8] = {0};
    for (int i = 0; i < m.n_tensors; i++) {
        const ps_param_info *p = &m.table[i];
        int g;
        switch (p->kind) {
        case PS_P_EMBED: g = 0; break;
        case PS_P_WQ: case PS_P_WK: case PS_P_WV: case PS_P_WO: g = 1; break;
        case PS_P_QNORM: case PS_P_KNORM: g = 2; break;
        case PS_P_KEY_PAYLOAD: case PS_P_VALUE_PAYLOAD: case PS_P_V4_C_WKV: g = 3; break;
        case PS_P_KEY_GATE_W: case PS_P_KEY_GATE_B: case PS_P_VALUE_GATE_W: case PS_P_VALUE_GATE_B:
        case PS_P_V4_C_WGATE: case PS_P_V4_C_APE: g = 4; break;
        case PS_P_IN_NORM: case PS_P_POST_NORM: case PS_P_FINAL_NORM: case PS_P_V4_C_NORM: g = 5; break;
        case PS_P_V4_SINKS: g = 1; break;
        case PS_P_MLP_GATE: case PS_P_MLP_UP: case PS_P_MLP_DOWN: g = 6; break;
        default: g = 7; break;
        }
        cnt[g] += p->numel;
    }
    printf("parameters  %lld total\n", (long long)m.n_params);
    for (int g = 0; g < 8; g++)
        if (cnt[g]) printf("  %-22s %12lld  (%.1f%%)\n", groups[g], (long long)cnt[g], 100.0 * (double)cnt[g] / (double)m.n_params);

    /* KV cache (float32): a full cache stores k and v for every token; the compressed one stores one
     * compressed k and v per window (a new window every S tokens) plus a ring of local_window raw
     * entries, constant in the sequence length. */
    double per_tok_full = (double)c->n_layers * 2.0 * (double)(c->n_kv_heads * c->head_dim) * 4.0;
    printf("\nKV cache (float32)\n  full attention        %.1f bytes/token\n", per_tok_full);
    if (c->kind == PS_ATTN_COMPRESSED && c->boundaries == PS_BOUNDARIES_CONTENT) {
        /* content chunks: one entry per chunk, the expected chunk length E[L] from the boundary threshold
         * (core/chunks.h; about S by construction) */
        double EL = ps_chunk_expected_len(c), per_tok = per_tok_full / EL;
        char local[32];
        human(local, sizeof local, per_tok_full * (double)c->local_window);
        printf("  compressed, content chunks of %lld..%lld tokens (mean S = %lld)\n"
               "                        %.1f bytes/token expected (%.3fx smaller: E[chunk length] = %.4f from the boundary\n"
               "                        threshold, hash values taken as uniform) + %s fixed local window\n",
               (long long)c->chunk_min, (long long)c->window, (long long)c->stride, per_tok, EL, EL, local);
        measure_chunks(&m, dir, per_tok_full);
    } else if (c->kind == PS_ATTN_COMPRESSED) {
        double per_tok = per_tok_full / (double)c->stride;
        char local[32];
        human(local, sizeof local, per_tok_full * (double)c->local_window);
        printf("  compressed W%lld/S%lld      %.1f bytes/token (%.1fx smaller) + %s fixed local window\n",
               (long long)c->window, (long long)c->stride, per_tok, (double)c->stride, local);
    }
    if (c->kind == PS_ATTN_CHANNEL) { /* K = V: one entry per token (raw) or per m tokens (compressed) */
        double per_tok = (double)c->n_layers * (double)c->head_dim * 4.0 / (double)c->rate;
        char local[32];
        human(local, sizeof local, (double)c->n_layers * (double)c->head_dim * 4.0 * (double)c->local_window);
        printf("  v4 %s, rate %lld      %.1f bytes/token (%.1fx smaller: K = V and one entry per %lld tokens) + %s sliding window\n",
               c->v4_mode == PS_V4_MODE_HCA ? "HCA" : "CSA", (long long)c->rate, per_tok, per_tok_full / per_tok, (long long)c->rate,
               local);
    }
    double pbytes = (double)m.n_params * 4.0;
    double fwd = (double)ps_acts_size(c, B, c->max_seq_len, false, false) * 4.0 + pbytes;
    /* training: params + grads + 2 Adam moments, and every layer's activations (plus their gradients, bounded by the
     * same size again) */
    double train = pbytes * 4.0 + 2.0 * (double)ps_acts_size(c, B, c->max_seq_len, true, false) * 4.0;
    /* knockout grid: one batch's activations of every layer kept, plus the per-shift means of one target */
    double grid = pbytes + (double)ps_acts_size(c, B, c->max_seq_len, true, false) * 4.0 +
                  (double)c->n_layers * (double)c->max_seq_len * (double)(c->n_kv_heads * c->head_dim) * 2.0 * 8.0;
    char fw[32], b[32], pb[32], kg[32], av[32];
    human(pb, sizeof pb, pbytes);
    human(fw, sizeof fw, fwd);
    human(b, sizeof b, train);
    human(kg, sizeof kg, grid);
    human(av, sizeof av, (double)ps_mem_available());
    printf("\nmemory (batch %lld, T = max_seq_len = %lld; %s available now)\n  weights               %s\n"
           "  forward pass          %s\n"
           "  training step         %s (weights, gradients, AdamW moments, activations and their gradients)\n"
           "  knockout grid         %s (every layer's activations of one batch, and the means)\n",
           (long long)B, (long long)c->max_seq_len, av, pb, fw, b, kg);
    char compute[512];
    ps_cpu_env_describe(compute, sizeof compute);
    ps_error ce;
    double rel = 0;
    int ok = ps_blas_selfcheck(&rel, &ce) == 0;
    printf("\ncompute     cpu: %s\n  sgemm check against a plain loop: %s (worst relative error %.2g)\n", compute,
           ok ? "passed" : "FAILED", rel);
    ps_model_free(&m);
    return 0;
}
