#define _POSIX_C_SOURCE 200809L
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/backward.h"
#include "core/forward.h"
#include "core/rng.h"

ps_config tu_config(ps_attn_kind kind) {
    ps_config c;
    ps_config_defaults(&c);
    c.vocab_size = 23;
    c.d_model = 16;
    c.n_layers = 1;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.head_dim = 4;
    c.d_ff = 24;
    c.max_seq_len = 64;
    c.kind = kind;
    c.window = 4;
    c.stride = 4;
    c.local_window = 4;
    return c;
}

void tu_random_model(ps_model *m, const ps_config *cfg, uint64_t seed, float scale) {
    ps_error err;
    if (ps_model_create(m, cfg, &err)) {
        fprintf(stderr, "tu_random_model: %s\n", err.msg);
        abort();
    }
    ps_rng r;
    ps_rng_seed(&r, seed);
    for (int i = 0; i < m->n_tensors; i++) {
        const ps_param_info *p = &m->table[i];
        int norm = p->kind == PS_P_IN_NORM || p->kind == PS_P_POST_NORM || p->kind == PS_P_FINAL_NORM ||
                   p->kind == PS_P_QNORM || p->kind == PS_P_KNORM || p->kind == PS_P_V4_C_NORM;
        for (int64_t j = 0; j < p->numel; j++)
            m->params[p->offset + j] = norm ? 1.0f + 0.2f * (float)ps_rng_normal(&r) : scale * (float)ps_rng_normal(&r);
    }
}

void tu_random_tokens(int32_t *tok, int64_t n, int64_t vocab, uint64_t seed) {
    ps_rng r;
    ps_rng_seed(&r, seed);
    for (int64_t i = 0; i < n; i++) tok[i] = (int32_t)ps_rng_below(&r, vocab);
}

void tu_tempdir(char *out, size_t n, const char *tag) {
    const char *base = getenv("TMPDIR");
    snprintf(out, n, "%s/ps_%s_XXXXXX", base && *base ? base : "/tmp", tag);
    if (!mkdtemp(out)) {
        perror("mkdtemp");
        abort();
    }
}

int tu_generate_rows(ps_kvcache *kv, int32_t *const *pr, const int64_t *len, const ps_generate_edit *edits, int n_edits,
                     const ps_hooks *hooks, int32_t *out_tok, double *out_lp, ps_error *err) {
    ps_generate_opts o = {.max_tokens = 6, .temperature = 1.1, .top_p = 0.95, .seed = 8};
    ps_generate_result r = {0};
    if (ps_generate(kv, 3, pr, len, &o, edits, n_edits, hooks, &r, err)) return -1;
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < 6; k++) {
            out_tok[i * 6 + k] = k < r.n_gen[i] ? r.tok[i][k] : -1;
            out_lp[i * 6 + k] = k < r.n_gen[i] ? r.logprob[i][k] : 0;
        }
    ps_generate_result_free(&r);
    return 0;
}

const char *tu_conformance_dir(void) {
    const char *e = getenv("PS_CONFORMANCE_DIR");
    return e && *e ? e : PS_SOURCE_DIR "/tests/conformance";
}

int tu_knockout_opts(const ps_model *m, const ps_batch *base, const ps_task *task, const ps_filler_family *fam, int64_t P,
                     uint64_t seed, int64_t batch, const int *layers, int n_layers, const int *heads, int n_heads,
                     ps_ko_target target, const ps_knockout_opts *o, ps_knockout_result *out, ps_progress_fn progress,
                     void *user, ps_error *err) {
    ps_runtime rt;
    ps_runtime_model(&rt, m);
    ps_knockout_spec k = {.rt = &rt, .base = base, .task = task, .fam = fam, .P = P, .seed = seed, .batch = batch,
                          .layers = layers, .n_layers = n_layers, .heads = heads, .n_heads = n_heads,
                          .target = (int)target - 1, .progress = progress, .progress_user = user};
    if (o) k.opts = *o;
    return ps_knockout_run(&k, out, err);
}

/* ---- gradients against a plain-loop reference ---- */

double tu_ref_loss(const ps_model *m, const int32_t *tok, const int32_t *tgt, int T, tu_ref_forward_fn ref, const void *user) {
    int64_t V = m->cfg.vocab_size;
    double *lg = malloc((size_t)(T * V) * sizeof(double)), loss = 0;
    int n = 0;
    ref(m, tok, T, user, lg);
    for (int t = 0; t < T; t++) {
        if (tgt[t] < 0) continue;
        double mx = -1e300, s = 0;
        for (int64_t i = 0; i < V; i++) mx = lg[t * V + i] > mx ? lg[t * V + i] : mx;
        for (int64_t i = 0; i < V; i++) s += exp(lg[t * V + i] - mx);
        loss += log(s) + mx - lg[t * V + tgt[t]];
        n++;
    }
    free(lg);
    return n ? loss / n : 0.0;
}

/* one check into the tally: a FAIL line (label: what) when it does not hold */
#define TALLY(tl, cond, ...)                                 \
    do {                                                     \
        (tl).checks++;                                       \
        if (!(cond)) {                                       \
            (tl).failed++;                                   \
            fprintf(stderr, "FAIL %s: ", label);             \
            fprintf(stderr, __VA_ARGS__);                    \
            fprintf(stderr, "\n");                           \
        }                                                    \
    } while (0)

tu_tally tu_fd_model(const char *label, ps_config c, uint64_t seed, int T, const int64_t *shift, tu_ref_forward_fn ref,
                     const void *user) {
    tu_tally tl = {0, 0};
    ps_model m;
    tu_random_model(&m, &c, seed, 0.5f);
    int64_t V = c.vocab_size;
    int32_t *tok = malloc((size_t)T * sizeof *tok), *tgt = malloc((size_t)T * sizeof *tgt);
    tu_random_tokens(tok, T, V, seed + 1);
    tu_random_tokens(tgt, T, V, seed + 2);
    for (int t = 0; t < T; t += 3) tgt[t] = -1;
    int64_t nt = 0;
    for (int t = 0; t < T; t++) nt += tgt[t] >= 0;
    ps_acts a, g;
    ps_error err;
    float *grads = calloc((size_t)m.n_params, sizeof(float));
    double *lg = malloc((size_t)(T * V) * sizeof(double));
    int ok_a = ps_acts_create(&a, m.ctx, &c, 1, T, true, &err) == 0;
    TALLY(tl, ok_a, "activations: %s", err.msg);
    int ok_g = ok_a && ps_acts_create(&g, m.ctx, &c, 1, T, false, &err) == 0;
    if (ok_a) TALLY(tl, ok_g, "gradient activations: %s", err.msg);
    int ok = ok_g;
    if (ok && shift) {
        ok = ps_acts_set_phase(&a, shift, &err) == 0;
        TALLY(tl, ok, "phase shift: %s", err.msg);
    }
    if (ok) {
        ok = ps_forward(&m, &a, tok, NULL, &err) == 0;
        TALLY(tl, ok, "forward: %s", err.msg);
    }
    if (ok) { /* the logits against the reference: max |a - b| / max |b| */
        ref(&m, tok, T, user, lg);
        double num = 0, den = 0;
        for (int64_t i = 0; i < T * V; i++) {
            num = fmax(num, fabs((double)a.p.logits[i] - lg[i]));
            den = fmax(den, fabs(lg[i]));
        }
        TALLY(tl, num <= 1e-5 * den, "logits vs reference: rel err %.3g", den > 0 ? num / den : num);
        double loss = 0;
        int64_t cnt = 0;
        ok = ps_backward(&m, &a, &g, tok, tgt, 1.0f / (float)nt, grads, &loss, &cnt, &err) == 0;
        TALLY(tl, ok, "backward: %s", err.msg);
        if (ok) {
            double rl = tu_ref_loss(&m, tok, tgt, T, ref, user);
            TALLY(tl, cnt == nt && fabs(loss / (double)cnt - rl) < 1e-5 * fabs(rl), "loss %g over %lld targets vs reference %g over %lld",
                  cnt ? loss / (double)cnt : 0.0, (long long)cnt, rl, (long long)nt);
        }
    }
    if (ok) {
        ps_rng r;
        ps_rng_seed(&r, seed + 3);
        for (int i = 0; i < m.n_tensors; i++) {
            const ps_param_info *p = &m.table[i];
            double num = 0, den = 1e-4;
            for (int k = 0; k < 6; k++) {
                int64_t j = p->offset + ps_rng_below(&r, p->numel);
                float keep = m.params[j];
                m.params[j] = keep + 1e-3f;
                float up = m.params[j];
                double lp = tu_ref_loss(&m, tok, tgt, T, ref, user);
                m.params[j] = keep - 1e-3f;
                float dn = m.params[j];
                double lm = tu_ref_loss(&m, tok, tgt, T, ref, user);
                m.params[j] = keep;
                double fd = (lp - lm) / ((double)up - (double)dn);
                num = fmax(num, fabs(fd - grads[j]));
                den = fmax(den, fmax(fabs(fd), fabs(grads[j])));
            }
            TALLY(tl, num / den < 1e-3, "%s gradient rel err %.3g (scale %.3g)", p->name, num / den, den);
        }
    }
    if (ok_g) ps_acts_free(&g);
    if (ok_a) ps_acts_free(&a);
    free(lg);
    free(grads);
    free(tok);
    free(tgt);
    ps_model_free(&m);
    return tl;
}

double tu_row_rel(const float *a, const float *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - b[i]);
        num = e > num ? e : num;
        den = fabs((double)b[i]) > den ? fabs((double)b[i]) : den;
    }
    return den > 0 ? num / den : num;
}

double tu_rows_rel(const float *a, const float *b, int64_t rows, int64_t n) {
    double w = 0;
    for (int64_t r = 0; r < rows; r++) w = fmax(w, tu_row_rel(a + r * n, b + r * n, n));
    return w;
}
