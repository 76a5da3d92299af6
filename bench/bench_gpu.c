/* bench_gpu.c — the GPU bench of the CUDA backend (docs/cuda.md), for the device check
 * (scripts/gpu_check.sh), in one run:
 *   1. the cuBLAS(Lt) GEMM rate at the shapes of the model's linear layers (forward and both backward
 *      products, T tokens), per precision, and the rate of the whole step's GEMM mix;
 *   2. per precision and attention (full; compressed W8/S8) the training step of a Qwen3-0.6B-shaped
 *      model (28 layers, d 1024, 16/8 heads, head_dim 128, d_ff 3072, vocab 151936, T 4096, batch 1):
 *      forward, backward, gradient norm and AdamW on the device; step time, tokens/s, achieved TFLOP/s
 *      (3 × the forward FLOPs of bench_common.h) and its share of the same-run GEMM rate;
 *   3. the knockout grid of the compressed model (every layer × KV head, 8 residues) on a few prompts,
 *      timed and extrapolated to 64 prompts.
 * Every section prints one line per result; a failure prints "bench_gpu: FAILED <what>: <why>" and the
 * bench goes on with the next section (exit status 1 at the end). --json FILE writes the numbers for
 * scripts/gpu_check.sh and bench/torch_gpu_peer.py.
 *
 * usage: bench_gpu [--device cuda|cpu] [--tiny] [--precisions fp32,tf32,bf16] [--steps N] [--ko-prompts N]
 *                  [--ko-precision P] [--no-knockout] [--json FILE]
 * --device cpu --tiny runs the same code on a small model on the CPU (how the bench was checked on a
 * machine without a GPU). */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/backward.h"
#include "bench_common.h"
#include "core/cuda/cuda_ops.h"
#include "core/forward.h"
#include "interventions/knockout.h"
#include "core/model.h"
#include "train/optim.h"
#include "interventions/sweep.h"
#include "tasks/tasks.h"

static int failures = 0;
static FILE *json;

#define FAILED(what, ...)                                                                                              \
    do {                                                                                                               \
        failures++;                                                                                                    \
        fprintf(stdout, "bench_gpu: FAILED %s: ", what);                                                               \
        fprintf(stdout, __VA_ARGS__);                                                                                  \
        fprintf(stdout, "\n");                                                                                         \
        fflush(stdout);                                                                                                \
    } while (0)

typedef struct {
    const char *device;
    int is_cuda, tiny, steps, ko_prompts, ko_prec, knockout;
    int precs[3], n_precs;
} opts;

static int sync_ctx(ps_ctx *c) { return ps_ctx_host_visible(c) ? 0 : ps_cuda_sync(c); }

/* ---------------- model ---------------- */

static ps_config qwen3_shape(const opts *o, int compressed) {
    ps_config c;
    ps_config_defaults(&c);
    if (o->tiny) {
        c.vocab_size = 512, c.d_model = 64, c.n_layers = 2, c.n_heads = 4, c.n_kv_heads = 2, c.head_dim = 16, c.d_ff = 128;
        c.max_seq_len = 256;
    } else {
        c.vocab_size = 151936, c.d_model = 1024, c.n_layers = 28, c.n_heads = 16, c.n_kv_heads = 8, c.head_dim = 128;
        c.d_ff = 3072, c.max_seq_len = 4096;
    }
    c.rope = true, c.rope_theta = 1000000.0, c.qk_norm = true, c.rms_eps = 1e-6, c.tie_embeddings = true;
    c.kind = compressed ? PS_ATTN_COMPRESSED : PS_ATTN_FULL;
    c.window = 8, c.stride = 8, c.local_window = 8;
    c.gate = PS_GATE_LEARNED, c.payload = PS_PAYLOAD_PER_OFFSET;
    return c;
}

/* the model on the bench's device: std 0.02 weights, norms 1, gates 0.05 */
static int make_model(const opts *o, ps_model *m, const ps_config *c, ps_error *err) {
    if (ps_model_create(m, c, err)) return -1;
    if (!o->is_cuda) {
        ps_model_init(m, 1);
        return 0;
    }
    if (ps_model_to_backend(m, "cuda", err)) {
        ps_model_free(m);
        return -1;
    }
    ps_ctx *ctx = m->ctx;
    int rc = ps_cuda_fill_normal(ctx, m->params, m->n_params, 1, 0.02f);
    for (int i = 0; i < m->n_tensors && !rc; i++) {
        const ps_param_info *p = &m->table[i];
        if (p->kind == PS_P_IN_NORM || p->kind == PS_P_POST_NORM || p->kind == PS_P_QNORM || p->kind == PS_P_KNORM ||
            p->kind == PS_P_FINAL_NORM)
            rc = ps_fill(ctx, m->params + p->offset, 1.0f, p->numel);
        else if (p->kind == PS_P_KEY_GATE_W || p->kind == PS_P_VALUE_GATE_W)
            rc = ps_cuda_fill_normal(ctx, m->params + p->offset, p->numel, 2 + (uint64_t)i, 0.05f);
        else if (p->kind == PS_P_KEY_GATE_B || p->kind == PS_P_VALUE_GATE_B)
            rc = ps_fill(ctx, m->params + p->offset, 0.0f, p->numel);
    }
    if (rc || sync_ctx(ctx)) {
        ps_ctx_check(ctx, err);
        ps_model_free(m);
        return -1;
    }
    return 0;
}

/* ---------------- 1. GEMM rates ---------------- */

typedef struct {
    const char *name;
    int64_t K, N; /* out[M, N] = x[M, K] · w[N, K]^T */
    int per_layer;
} lin_shape;

/* seconds per call of `kind` (0 forward, 1 backward input + weight), repeated for >= 0.3 s */
static double time_gemm(ps_ctx *ctx, int kind, float *x, float *w, float *y, float *dx, float *dw, int64_t M, int64_t K,
                        int64_t N) {
    int n = 0;
    double t0 = 0;
    for (int it = 0;; it++) {
        if (it == 1) {
            if (sync_ctx(ctx)) return -1;
            t0 = now();
        }
        int rc = kind == 0 ? ps_matmul(ctx, y, x, w, M, K, N, 0) : ps_matmul_backward(ctx, dx, dw, y, x, w, M, K, N);
        if (rc) return -1;
        if (it >= 1) n++;
        if (it >= 1 && n % 4 == 0) {
            if (sync_ctx(ctx)) return -1;
            if (now() - t0 > 0.3) break;
        }
    }
    return (now() - t0) / n;
}

/* the step's GEMM mix at precision p: prints per shape, returns the mix's TFLOP/s (0 on failure) */
static double gemm_section(const opts *o, ps_ctx *ctx, const ps_config *c, int64_t M) {
    int64_t d = c->d_model, q = c->n_heads * c->head_dim, kv = c->n_kv_heads * c->head_dim;
    lin_shape sh[] = {{"q", d, q, 1},        {"k, v", d, kv, 2},   {"o", q, d, 1}, {"mlp gate, up", d, c->d_ff, 2},
                      {"mlp down", c->d_ff, d, 1}, {"lm head", d, c->vocab_size, 0}};
    int ns = (int)(sizeof sh / sizeof sh[0]);
    int64_t maxK = 0, maxN = 0;
    for (int i = 0; i < ns; i++) {
        if (sh[i].K > maxK) maxK = sh[i].K;
        if (sh[i].N > maxN) maxN = sh[i].N;
    }
    ps_error err;
    int64_t nx = M * maxK, nw = maxN * maxK, ny = M * maxN;
    float *x = ps_buf_alloc(ctx, nx * 4, "bench x", &err), *w = x ? ps_buf_alloc(ctx, nw * 4, "bench w", &err) : NULL;
    float *y = w ? ps_buf_alloc(ctx, ny * 4, "bench y", &err) : NULL, *dx = y ? ps_buf_alloc(ctx, nx * 4, "bench dx", &err) : NULL;
    float *dw = dx ? ps_buf_alloc(ctx, nw * 4, "bench dw", &err) : NULL;
    double total_flops = 0, total_s = 0;
    if (!dw) {
        FAILED("gemm", "%s", err.msg);
        goto done;
    }
    if (o->is_cuda) {
        if (ps_cuda_fill_normal(ctx, x, nx, 11, 1.0f) || ps_cuda_fill_normal(ctx, w, nw, 12, 0.02f) ||
            ps_cuda_fill_normal(ctx, y, ny, 13, 1.0f)) {
            ps_ctx_check(ctx, &err);
            FAILED("gemm", "%s", err.msg);
            goto done;
        }
    } else {
        for (int64_t i = 0; i < nx; i++) x[i] = (float)((i * 7919) % 101) * 0.01f - 0.5f;
        for (int64_t i = 0; i < nw; i++) w[i] = (float)((i * 104729) % 97) * 0.0004f - 0.02f;
    }
    for (int i = 0; i < ns; i++) {
        double f = 2.0 * (double)M * (double)sh[i].K * (double)sh[i].N;
        double tf = time_gemm(ctx, 0, x, w, y, dx, dw, M, sh[i].K, sh[i].N);
        double tb = tf > 0 ? time_gemm(ctx, 1, x, w, y, dx, dw, M, sh[i].K, sh[i].N) : -1;
        if (tf <= 0 || tb <= 0) {
            ps_ctx_check(ctx, &err);
            FAILED("gemm", "%s %lld x %lld x %lld: %s", sh[i].name, (long long)M, (long long)sh[i].K, (long long)sh[i].N, err.msg);
            total_s = 0;
            goto done;
        }
        int64_t count = sh[i].per_layer ? sh[i].per_layer * c->n_layers : 1;
        total_flops += 3 * f * (double)count;
        total_s += (tf + tb) * (double)count;
        printf("  gemm %-5s %-13s [%lld x %lld] x [%lld x %lld]^T  forward %7.1f TFLOP/s  backward %7.1f TFLOP/s\n",
               ps_precision_name(ctx->precision), sh[i].name, (long long)M, (long long)sh[i].K, (long long)sh[i].N,
               (long long)sh[i].K, f / tf / 1e12, 2 * f / tb / 1e12);
    }
done:
    ps_buf_free(ctx, x, nx * 4), ps_buf_free(ctx, w, nw * 4), ps_buf_free(ctx, y, ny * 4);
    ps_buf_free(ctx, dx, nx * 4), ps_buf_free(ctx, dw, nw * 4);
    if (total_s <= 0) return 0;
    double rate = total_flops / total_s / 1e12;
    printf("  gemm %-5s the step's GEMM mix: %.1f TFLOP/s\n", ps_precision_name(ctx->precision), rate);
    fflush(stdout);
    return rate;
}

/* ---------------- 2. training steps ---------------- */

typedef struct {
    double step_s, tok_s, tflops, frac_gemm, loss;
} step_result;

static int train_steps(const opts *o, ps_model *m, int64_t T, int steps, step_result *r, ps_error *err) {
    ps_ctx *ctx = m->ctx;
    const ps_config *c = &m->cfg;
    int64_t np = m->n_params, B = 1;
    ps_acts a, g;
    int have_a = 0, have_g = 0, rc = 0;
    float *grads = NULL, *m1 = NULL, *m2 = NULL;
    int32_t *tok = malloc((size_t)(B * T) * sizeof(int32_t)), *tgt = malloc((size_t)(B * T) * sizeof(int32_t));
    if (!tok || !tgt) {
        rc = ps_fail(err, "out of host memory");
        goto out;
    }
    for (int64_t i = 0; i < B * T; i++) tok[i] = (int32_t)((i * 2654435761u) % (uint64_t)c->vocab_size);
    for (int64_t i = 0; i < B * T; i++) tgt[i] = i + 1 < B * T ? tok[i + 1] : -1;
    rc = ps_acts_create(&a, ctx, c, B, T, true, err);
    have_a = !rc;
    if (!rc) have_g = !(rc = ps_acts_create(&g, ctx, c, B, T, false, err));
    if (!rc && !(grads = ps_buf_alloc(ctx, np * 4, "gradients", err))) rc = -1;
    if (!rc && !(m1 = ps_buf_alloc(ctx, np * 4, "AdamW first moments", err))) rc = -1;
    if (!rc && !(m2 = ps_buf_alloc(ctx, np * 4, "AdamW second moments", err))) rc = -1;
    ps_optim_cfg oc;
    ps_optim_defaults(&oc);
    double times[16];
    int n = 0;
    for (int s = 0; s < steps + 1 && !rc; s++) { /* step 0 warms up (cuBLASLt heuristics, workspace) */
        if ((rc = sync_ctx(ctx))) {
            ps_ctx_check(ctx, err);
            break;
        }
        double t0 = now(), loss = 0, norm = 0;
        int64_t cnt = 0;
        rc = ps_fill(ctx, grads, 0.0f, np) ? ps_ctx_check(ctx, err) : 0;
        if (!rc) rc = ps_forward(m, &a, tok, NULL, err);
        if (!rc) rc = ps_backward(m, &a, &g, tok, tgt, 1.0f / (float)(B * T - 1), grads, &loss, &cnt, err);
        if (!rc) rc = ps_grad_norm(ctx, grads, np, &norm, err);
        if (!rc) rc = ps_adamw_update(m, grads, m1, m2, s + 1, 1e-4, norm > 1.0 ? 1.0 / norm : 1.0, &oc, err);
        if (!rc && (rc = sync_ctx(ctx))) ps_ctx_check(ctx, err);
        if (!rc && s > 0 && n < 16) times[n++] = now() - t0;
        r->loss = cnt ? loss / (double)cnt : NAN;
    }
    if (!rc && n) {
        r->step_s = median(times, n);
        r->tok_s = (double)(B * T) / r->step_s;
        r->tflops = 3.0 * forward_flops(c, B, T) / r->step_s / 1e12;
    }
out:
    if (have_a) ps_acts_free(&a);
    if (have_g) ps_acts_free(&g);
    ps_buf_free(ctx, grads, np * 4), ps_buf_free(ctx, m1, np * 4), ps_buf_free(ctx, m2, np * 4);
    free(tok), free(tgt);
    (void)o;
    return rc;
}

/* ---------------- 3. knockout grid ---------------- */

static int knockout_section(const opts *o, ps_model *m, double *secs, double *secs64, ps_error *err) {
    const ps_config *c = &m->cfg;
    int64_t T = o->tiny ? 150 : 4089; /* shifted prompts (8 residues) stay within max_seq_len */
    ps_task t = {.kind = PS_TASK_KV, .seq_len = T, .n_keys = o->tiny ? 64 : 1024, .n_values = o->tiny ? 64 : 1024,
                 .n_fillers = o->tiny ? 16 : 1024, .n_pairs = o->tiny ? 8 : 64, .key_len = 2, .value_len = 2, .gap_min = 0,
                 .gap_max = o->tiny ? 6 : 48, .query_gap = 16, .n_queries = 8};
    if (ps_task_validate(&t, c->vocab_size, c->max_seq_len, "bench task", err)) return -1;
    ps_filler_family fam = {.name = "repeat", .n_pattern = 1, .pattern = {0}};
    ps_batch base;
    if (ps_batch_alloc(&base, o->ko_prompts, t.seq_len, t.n_queries, err)) return -1;
    if (ps_task_generate(&t, 1, &base, err)) return -1;
    int layers[64], heads[64];
    for (int i = 0; i < c->n_layers; i++) layers[i] = i;
    for (int i = 0; i < c->n_kv_heads; i++) heads[i] = i;
    ps_knockout_opts ko = {0};
    if (o->is_cuda) {
        int64_t fb = 0, tb = 0;
        if (ps_cuda_mem_info(m->ctx, &fb, &tb)) return ps_ctx_check(m->ctx, err);
        ko.mem_bytes = 0.5 * (double)fb;
    }
    ps_knockout_result r;
    double t0 = now();
    int rc = bench_knockout_opts(m, &base, &t, &fam, 8, 0, o->ko_prompts, layers, (int)c->n_layers, heads,
                                   (int)c->n_kv_heads, PS_KO_COMPRESSED, &ko, &r, err);
    *secs = now() - t0;
    if (!rc) {
        *secs64 = *secs * 64.0 / (double)o->ko_prompts;
        printf("  knockout %-5s %lld layers x %lld KV heads, 8 residues, %d prompt(s) of %lld tokens: %.1f s (%d cells x %lld "
               "prompts per forward); 64 prompts: about %.0f s\n",
               ps_precision_name(m->ctx->precision), (long long)c->n_layers, (long long)c->n_kv_heads, o->ko_prompts,
               (long long)T, *secs, r.cells_per_forward, (long long)r.prompts_per_forward, *secs64);
        ps_knockout_result_free(&r);
    }
    ps_batch_free(&base);
    return rc;
}

/* ---------------- main ---------------- */

static int parse_precisions(const char *s, opts *o) {
    o->n_precs = 0;
    char buf[64];
    snprintf(buf, sizeof buf, "%s", s);
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        int p;
        if (ps_precision_parse(tok, &p) || o->n_precs >= 3) return -1;
        o->precs[o->n_precs++] = p;
    }
    return o->n_precs ? 0 : -1;
}

int main(int argc, char **argv) {
    opts o = {.device = "cuda", .steps = 3, .ko_prompts = 1, .ko_prec = PS_PREC_TF32, .knockout = 1,
              .precs = {PS_PREC_FP32, PS_PREC_TF32, PS_PREC_BF16}, .n_precs = 3};
    const char *json_path = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--device") && v) o.device = v, i++;
        else if (!strcmp(a, "--tiny")) o.tiny = 1;
        else if (!strcmp(a, "--no-knockout")) o.knockout = 0;
        else if (!strcmp(a, "--steps") && v) o.steps = atoi(v), i++;
        else if (!strcmp(a, "--ko-prompts") && v) o.ko_prompts = atoi(v), i++;
        else if (!strcmp(a, "--ko-precision") && v) {
            if (ps_precision_parse(v, &o.ko_prec)) o.steps = -1;
            i++;
        } else if (!strcmp(a, "--precisions") && v) {
            if (parse_precisions(v, &o)) o.steps = -1;
            i++;
        } else if (!strcmp(a, "--json") && v) json_path = v, i++;
        else o.steps = -1;
    }
    o.is_cuda = !strcmp(o.device, "cuda");
    if (o.steps < 1 || o.steps > 15 || o.ko_prompts < 1 || (!o.is_cuda && strcmp(o.device, "cpu"))) {
        fprintf(stderr, "usage: bench_gpu [--device cuda|cpu] [--tiny] [--precisions fp32,tf32,bf16] [--steps 1..15]\n"
                        "                 [--ko-prompts N] [--ko-precision P] [--no-knockout] [--json FILE]\n");
        return 2;
    }
    if (!o.is_cuda) o.n_precs = 1, o.precs[0] = PS_PREC_FP32, o.ko_prec = PS_PREC_FP32; /* the cpu: fp32 only */
    ps_error err;
    ps_ctx *ctx;
    if (ps_ctx_create(&ctx, o.device, &err)) {
        printf("bench_gpu: FAILED device: %s\n", err.msg);
        return 1;
    }
    char desc[600] = "cpu";
    if (o.is_cuda) ps_cuda_describe(ctx, desc, sizeof desc);
    printf("phasescope bench_gpu: device %s\n", desc);
    if (json_path && !(json = fopen(json_path, "w"))) {
        printf("bench_gpu: FAILED --json %s: cannot write\n", json_path);
        return 1;
    }
    if (json) fprintf(json, "{\"device\": \"%s\", \"tiny\": %d, \"gemm\": {", o.is_cuda ? "cuda" : "cpu", o.tiny);
    ps_config cf = qwen3_shape(&o, 0), cc = qwen3_shape(&o, 1);
    int64_t T = o.tiny ? 128 : 4096;
    printf("model: Qwen3-0.6B shape: %lld layers, d %lld, %lld/%lld heads, head_dim %lld, d_ff %lld, vocab %lld, T %lld, batch 1\n\n",
           (long long)cf.n_layers, (long long)cf.d_model, (long long)cf.n_heads, (long long)cf.n_kv_heads, (long long)cf.head_dim,
           (long long)cf.d_ff, (long long)cf.vocab_size, (long long)T);

    /* 1. GEMMs */
    double gemm_rate[3] = {0, 0, 0};
    printf("1. GEMM rate at the model's shapes (M = %lld tokens)\n", (long long)T);
    for (int i = 0; i < o.n_precs; i++) {
        ctx->precision = o.precs[i];
        gemm_rate[o.precs[i]] = gemm_section(&o, ctx, &cf, T);
        if (json) fprintf(json, "%s\"%s\": %.3f", i ? ", " : "", ps_precision_name(o.precs[i]), gemm_rate[o.precs[i]]);
    }
    ctx->precision = PS_PREC_FP32;
    if (json) fprintf(json, "}, \"train\": [");

    /* 2. training steps */
    printf("\n2. training step (forward, backward, gradient norm, AdamW), batch 1 x %lld tokens\n", (long long)T);
    printf("  %-5s %-18s %10s %10s %9s %9s %10s\n", "prec", "attention", "step ms", "tokens/s", "TFLOP/s", "of GEMM", "loss");
    int first_json = 1;
    ps_model ko_model;
    int have_ko_model = 0;
    for (int comp = 0; comp < 2; comp++) {
        const ps_config *c = comp ? &cc : &cf;
        const char *aname = comp ? "compressed W8/S8" : "full";
        ps_model m;
        if (make_model(&o, &m, c, &err)) {
            FAILED("model", "%s model: %s", aname, err.msg);
            continue;
        }
        for (int i = 0; i < o.n_precs; i++) {
            m.ctx->precision = o.precs[i];
            step_result r = {0};
            if (train_steps(&o, &m, T, o.steps, &r, &err)) {
                FAILED("train", "%s, %s: %s", ps_precision_name(o.precs[i]), aname, err.msg);
                continue;
            }
            double g = gemm_rate[o.precs[i]];
            printf("  %-5s %-18s %10.1f %10.0f %9.1f %8.0f%% %10.4f\n", ps_precision_name(o.precs[i]), aname, r.step_s * 1e3,
                   r.tok_s, r.tflops, g > 0 ? 100.0 * r.tflops / g : 0.0, r.loss);
            fflush(stdout);
            if (json)
                fprintf(json, "%s{\"precision\": \"%s\", \"attention\": \"%s\", \"step_s\": %.6f, \"tokens_per_s\": %.1f, "
                              "\"tflops\": %.3f, \"frac_gemm\": %.4f, \"loss\": %.6f}",
                        first_json ? "" : ", ", ps_precision_name(o.precs[i]), comp ? "w8s8" : "full", r.step_s, r.tok_s,
                        r.tflops, g > 0 ? r.tflops / g : 0.0, r.loss);
            first_json = 0;
        }
        if (comp && o.knockout) {
            ko_model = m;
            have_ko_model = 1;
        } else
            ps_model_free(&m);
    }
    if (json) fprintf(json, "]");

    /* 3. knockout grid */
    if (have_ko_model) {
        printf("\n3. knockout grid (mean replacement of compressed KV heads), compressed W8/S8 model\n");
        ko_model.ctx->precision = o.ko_prec;
        double s = 0, s64 = 0;
        if (knockout_section(&o, &ko_model, &s, &s64, &err)) FAILED("knockout", "%s", err.msg);
        else if (json)
            fprintf(json, ", \"knockout\": {\"precision\": \"%s\", \"prompts\": %d, \"seconds\": %.3f, \"seconds_64\": %.1f}",
                    ps_precision_name(o.ko_prec), o.ko_prompts, s, s64);
        ps_model_free(&ko_model);
    }
    if (json) {
        fprintf(json, ", \"failures\": %d}\n", failures);
        fclose(json);
    }
    ps_ctx_free(ctx);
    printf("\nbench_gpu: %s (%d failure%s)\n", failures ? "FAILED" : "done", failures, failures == 1 ? "" : "s");
    return failures ? 1 : 0;
}
