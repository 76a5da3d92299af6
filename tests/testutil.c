#define _POSIX_C_SOURCE 200809L
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
