/* test_conformance.c — the shared conformance vectors (tests/conformance, copied from the project's shared folder; computed in float64 by an
 * independent implementation of SPEC.md): logits and layer-1 hooks of forward, and a mean-replacement
 * knockout of KV head 1 in layer 1 built from hooks. Per-tensor relative error must be < 1e-4. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/fileio.h"
#include "core/forward.h"
#include "core/hooks.h"
#include "core/model.h"
#include "core/safetensors.h"
#include "testutil.h"
#include "core/tokens.h"

static void compare(const ps_st_file *ref, const char *name, const float *got, int ndim, const int64_t *shape,
                    const char *model) {
    const ps_st_entry *e = ps_st_find(ref, name);
    CHECK(e != NULL, "%s: reference has no %s", model, name);
    if (!e) return;
    int same = e->ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = e->shape[i] == shape[i];
    CHECK(same, "%s: %s shape differs", model, name);
    if (!same) return;
    int64_t n = ps_st_numel(e);
    float *want = malloc((size_t)(n ? n : 1) * sizeof(float));
    ps_error err;
    ps_st_read_f32(ref, e, want, &err);
    double r = rel_err_f(got, want, n);
    CHECK(r < 1e-4, "%s: %s rel err %.3g", model, name, r);
    free(want);
}

/* ---- knockout: replace KV head g of layer l's (compressed or raw) keys and values by their mean ---- */
typedef struct {
    int64_t head, hd, nkv;
    int n_seq, collecting, seq;
    int64_t max_pos;
    double *sum[2];   /* [max_pos, hd] per branch */
    int64_t *count;   /* [max_pos] */
} knockout;

static int ko_hook(const ps_hook_event *ev, void *user, ps_error *err) {
    (void)err;
    knockout *k = user;
    int br = (ev->point == PS_HOOK_CV || ev->point == PS_HOOK_V);
    int64_t npos = ev->shape[1];
    for (int64_t p = 0; p < npos; p++) {
        float *x = ev->data + (p * k->nkv + k->head) * k->hd;
        if (k->collecting) {
            for (int64_t i = 0; i < k->hd; i++) k->sum[br][p * k->hd + i] += x[i];
            if (!br) k->count[p]++;
        } else
            for (int64_t i = 0; i < k->hd; i++) x[i] = (float)(k->sum[br][p * k->hd + i] / (double)k->count[p]);
    }
    return 0;
}

static void run_model(const char *name) {
    char dir[2048], path[4096];
    snprintf(dir, sizeof dir, "%s/%s", tu_conformance_dir(), name);
    ps_error err;
    ps_model m;
    REQUIRE_OK(ps_model_load(&m, dir, &err), &err);
    snprintf(path, sizeof path, "%s/tokens.json", dir);
    ps_token_lists toks;
    REQUIRE_OK(ps_tokens_load(path, 0, 0, &toks, &err), &err);
    ps_st_file ref, ref_ko;
    snprintf(path, sizeof path, "%s/expected_forward.safetensors", dir);
    REQUIRE_OK(ps_st_open(path, &ref, &err), &err);
    snprintf(path, sizeof path, "%s/expected_knockout_l1_h1.safetensors", dir);
    REQUIRE_OK(ps_st_open(path, &ref_ko, &err), &err);
    int comp = m.cfg.kind == PS_ATTN_COMPRESSED;
    const char *hooks_all[] = {"blocks.1.attn.hook_q", "blocks.1.attn.hook_k", "blocks.1.attn.hook_z",
                               "blocks.1.attn.hook_pattern", "blocks.1.hook_resid_post", "blocks.1.attn.hook_gate_k",
                               "blocks.1.attn.hook_gate_v", "blocks.1.attn.hook_ck", "blocks.1.attn.hook_cv"};
    int n_hooks = comp ? 9 : 5;
    ps_hooks h;
    ps_cache cache;
    ps_hooks_init(&h);
    ps_cache_init(&cache);
    for (int i = 0; i < n_hooks; i++) CHECK_OK(ps_cache_watch(&cache, &h, &m.cfg, hooks_all[i], &err), &err);

    knockout ko = {.head = 1, .hd = m.cfg.head_dim, .nkv = m.cfg.n_kv_heads, .n_seq = toks.n, .collecting = 1,
                   .max_pos = m.cfg.max_seq_len};
    ko.sum[0] = calloc((size_t)(ko.max_pos * ko.hd), sizeof(double));
    ko.sum[1] = calloc((size_t)(ko.max_pos * ko.hd), sizeof(double));
    ko.count = calloc((size_t)ko.max_pos, sizeof(int64_t));
    ps_hooks kh;
    ps_hooks_init(&kh);
    CHECK_OK(ps_hooks_add(&kh, &m.cfg, comp ? "blocks.1.attn.hook_ck" : "blocks.1.attn.hook_k", ko_hook, &ko, &err), &err);
    CHECK_OK(ps_hooks_add(&kh, &m.cfg, comp ? "blocks.1.attn.hook_cv" : "blocks.1.attn.hook_v", ko_hook, &ko, &err), &err);

    for (int pass = 0; pass < 2; pass++)
        for (int s = 0; s < toks.n; s++) {
            ps_acts a;
            CHECK_OK(ps_acts_create(&a, m.ctx, &m.cfg, 1, toks.len[s], false, &err), &err);
            if (pass == 0) {
                CHECK_OK(ps_forward(&m, &a, toks.seq[s], &h, &err), &err);
                char nm[128];
                snprintf(nm, sizeof nm, "logits.%d", s);
                int64_t shp[2] = {toks.len[s], m.cfg.vocab_size};
                compare(&ref, nm, a.p.logits, 2, shp, name);
                for (int i = 0; i < cache.n; i++) {
                    snprintf(nm, sizeof nm, "%s.%d", cache.items[i]->name, s);
                    compare(&ref, nm, cache.items[i]->data, cache.items[i]->ndim - 1, cache.items[i]->shape + 1, name);
                }
                ko.collecting = 1;
                CHECK_OK(ps_forward(&m, &a, toks.seq[s], &kh, &err), &err); /* collect the means */
            } else {
                ko.collecting = 0;
                CHECK_OK(ps_forward(&m, &a, toks.seq[s], &kh, &err), &err);
                char nm[64];
                snprintf(nm, sizeof nm, "logits.%d", s);
                int64_t shp[2] = {toks.len[s], m.cfg.vocab_size};
                compare(&ref_ko, nm, a.p.logits, 2, shp, name);
            }
            ps_acts_free(&a);
        }
    free(ko.sum[0]);
    free(ko.sum[1]);
    free(ko.count);
    ps_hooks_free(&kh);
    ps_cache_free(&cache);
    ps_hooks_free(&h);
    ps_st_close(&ref);
    ps_st_close(&ref_ko);
    ps_tokens_free(&toks);
    ps_model_free(&m);
}

/* qwen3_published: a Qwen3 checkpoint as Hugging Face publishes it (newer config keys, two BF16 shards
 * and an index, no lm_head). Its logits match; the same weights written as one F32 file (phasescope's
 * layout, and the Hugging Face layout) load and give the same logits, bit for bit. */
static void forward_all(const ps_model *m, const ps_token_lists *toks, float **out) {
    ps_error err;
    for (int s = 0; s < toks->n; s++) {
        ps_acts a;
        out[s] = NULL;
        if (ps_acts_create(&a, m->ctx, &m->cfg, 1, toks->len[s], false, &err)) {
            CHECK(0, "acts: %s", err.msg);
            continue;
        }
        CHECK_OK(ps_forward(m, &a, toks->seq[s], NULL, &err), &err);
        size_t n = (size_t)(toks->len[s] * m->cfg.vocab_size);
        out[s] = malloc(n * sizeof(float));
        memcpy(out[s], a.p.logits, n * sizeof(float));
        ps_acts_free(&a);
    }
}

static void run_published(void) {
    char dir[2048], path[4096];
    snprintf(dir, sizeof dir, "%s/qwen3_published", tu_conformance_dir());
    ps_error err;
    ps_model m;
    REQUIRE_OK(ps_model_load(&m, dir, &err), &err);
    CHECK(m.n_shards == 2 && m.cfg.tie_embeddings && m.cfg.rope_theta == 1e6 && m.cfg.kind == PS_ATTN_FULL,
          "qwen3_published: %d shards, rope_theta %g", m.n_shards, m.cfg.rope_theta);
    snprintf(path, sizeof path, "%s/tokens.json", dir);
    ps_token_lists toks;
    REQUIRE_OK(ps_tokens_load(path, 0, 0, &toks, &err), &err);
    ps_st_file ref;
    snprintf(path, sizeof path, "%s/expected_forward.safetensors", dir);
    REQUIRE_OK(ps_st_open(path, &ref, &err), &err);
    float *base[8] = {0}, *again[8] = {0};
    forward_all(&m, &toks, base);
    for (int s = 0; s < toks.n && s < 8; s++) {
        char nm[64];
        snprintf(nm, sizeof nm, "logits.%d", s);
        int64_t shp[2] = {toks.len[s], m.cfg.vocab_size};
        if (base[s]) compare(&ref, nm, base[s], 2, shp, "qwen3_published");
    }
    char tmp[512];
    tu_tempdir(tmp, sizeof tmp, "conf_pub");
    for (int layout = 0; layout < 2; layout++) {
        char out[1024];
        snprintf(out, sizeof out, "%s/%s", tmp, layout ? "hf_f32" : "ps_f32");
        ps_save_opts o = {.layout = layout ? PS_LAYOUT_HF : PS_LAYOUT_PHASESCOPE};
        CHECK_OK(ps_model_save_as(&m, out, &o, &err), &err);
        ps_model m2;
        if (ps_model_load(&m2, out, &err)) {
            CHECK(0, "reload %s: %s", out, err.msg);
            continue;
        }
        CHECK(m2.n_shards == 1 && m2.n_params == m.n_params && !memcmp(m.params, m2.params, (size_t)m.n_params * 4),
              "%s: single F32 file does not hold the same weights", out);
        forward_all(&m2, &toks, again);
        for (int s = 0; s < toks.n && s < 8; s++) {
            size_t n = (size_t)(toks.len[s] * m.cfg.vocab_size);
            CHECK(base[s] && again[s] && !memcmp(base[s], again[s], n * sizeof(float)), "%s: logits.%d differ", out, s);
            free(again[s]);
        }
        ps_model_free(&m2);
    }
    for (int s = 0; s < 8; s++) free(base[s]);
    ps_st_close(&ref);
    ps_tokens_free(&toks);
    ps_model_free(&m);
}

int main(void) {
    char probe[4096];
    snprintf(probe, sizeof probe, "%s/README.md", tu_conformance_dir());
    FILE *f = fopen(probe, "r");
    if (!f) {
        fprintf(stderr, "conformance vectors not found at %s (set PS_CONFORMANCE_DIR)\n", tu_conformance_dir());
        return 1;
    }
    fclose(f);
    run_model("full_gqa");
    run_model("compressed_w8s8");
    run_model("compressed_w6s3_overlap");
    run_published();
    CHECK_DONE();
}
