/* test_minicpm.c — MiniCPM4 checkpoints with InfLLM-v2 sparse attention (docs/minicpm.md): the conformance
 * vectors of tests/conformance/infllm/tiny (float64 from an independent implementation: logits, the compressed
 * keys, stage-1 and block scores per layer, the selections as sets, a 12-step greedy decode); variants written
 * here from the tiny checkpoint (f32 weights, a tied head, shards with an index, dense_len); every bad config
 * refused by key and file; the hook edits that change what is attended (hook_ck, hook_select_scores,
 * hook_blocks: the last against attention restricted to the set, computed here); and the family table
 * (ps_runtime_open picks it, point shapes, info, the KV cache's bytes against info's figure per token). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "check.h"
#include "core/fileio.h"
#include "core/kvcache.h"
#include "core/minicpm/minicpm.h"
#include "core/runtime.h"
#include "core/safetensors.h"
#include "core/select.h"
#include "testutil.h"

/* ---- the reference file ---- */

/* tensor `name` of the reference as doubles (F64 or I64), its element count in *n; NULL when absent */
static double *ref_get(const ps_st_file *f, const char *name, int64_t *n) {
    const ps_st_entry *e = ps_st_find(f, name);
    if (!e || (e->dtype != PS_DT_F64 && e->dtype != PS_DT_I64)) {
        CHECK(0, "reference tensor %s missing or not F64/I64", name);
        return NULL;
    }
    int64_t k = ps_st_numel(e);
    double *out = malloc((size_t)(k ? k : 1) * sizeof *out);
    const uint8_t *p = f->data + e->begin;
    for (int64_t i = 0; i < k; i++) {
        if (e->dtype == PS_DT_F64) memcpy(&out[i], p + 8 * i, 8);
        else {
            int64_t v;
            memcpy(&v, p + 8 * i, 8);
            out[i] = (double)v;
        }
    }
    if (n) *n = k;
    return out;
}

/* max |a − b| / max |b| over the finite entries; an infinity must be matched exactly (else +inf) */
static double rel(const float *a, const double *b, int64_t n) {
    double d = 0, m = 0;
    for (int64_t i = 0; i < n; i++) {
        if (isinf(b[i]) || isinf(a[i])) {
            if ((double)a[i] != b[i]) return INFINITY;
            continue;
        }
        d = fmax(d, fabs(a[i] - b[i]));
        m = fmax(m, fabs(b[i]));
    }
    return m > 0 ? d / m : d;
}

/* our [T, Hkv, X] (one sequence of a hook) against the reference's [Hkv, T, X] */
static double rel_ht(const float *a, const double *b, int64_t T, int64_t Hk, int64_t X) {
    double *t = malloc((size_t)(T * Hk * X) * sizeof *t);
    for (int64_t h = 0; h < Hk; h++)
        for (int64_t r = 0; r < T; r++) memcpy(t + (r * Hk + h) * X, b + (h * T + r) * X, (size_t)X * sizeof *t);
    double e = rel(a, t, T * Hk * X);
    free(t);
    return e;
}

/* rows whose selection differs as a set: ours [T, Hkv, K] floats, the reference's [Hkv, T, K] */
static int64_t set_mismatch(const float *a, const double *b, int64_t T, int64_t Hk, int64_t K) {
    int64_t bad = 0;
    for (int64_t h = 0; h < Hk; h++)
        for (int64_t r = 0; r < T; r++) {
            const float *x = a + (r * Hk + h) * K;
            const double *y = b + (h * T + r) * K;
            int ok = 1;
            for (int64_t i = 0; i < K && ok; i++) {
                int fx = x[i] < 0, fy = y[i] < 0;
                for (int64_t j = 0; j < K; j++) fx |= x[i] >= 0 && y[j] == x[i], fy |= y[i] >= 0 && (double)x[j] == y[i];
                ok = fx && fy;
            }
            bad += !ok;
        }
    return bad;
}

/* (head, row) pairs of the reference whose selection is decided by the lower-index tie rule: the blocks kept
 * (<= q_blk) differ when ties go to the higher index instead (block scores [Hkv, T, nb]; repeated argmax, the
 * first or the last of equal maxima) */
static int64_t tie_pairs(const double *bs, int64_t T, int64_t Hk, int64_t nb, int64_t K, int64_t block) {
    int64_t n = 0;
    char *take[2] = {calloc((size_t)nb, 1), calloc((size_t)nb, 1)};
    for (int64_t h = 0; h < Hk; h++)
        for (int64_t r = 0; r < T; r++) {
            const double *s = bs + (h * T + r) * nb;
            for (int w = 0; w < 2; w++) {
                memset(take[w], 0, (size_t)nb);
                for (int64_t k = 0; k < K && k < nb; k++) {
                    int64_t best = -1;
                    for (int64_t b = 0; b < nb; b++)
                        if (!take[w][b] && (best < 0 || s[b] > s[best] || (w && s[b] == s[best]))) best = b;
                    take[w][best] = 1;
                }
            }
            int differ = 0;
            for (int64_t b = 0; b <= r / block && b < nb; b++) differ |= take[0][b] != take[1][b];
            n += differ;
        }
    free(take[0]), free(take[1]);
    return n;
}

/* decode step s of layer l against the vectors: the new row's blocks [Hkv, K] as a set per KV head (0 when they
 * differ) and its block scores [Hkv, nb] (the relative error; +inf when a reference tensor is missing) */
static int step_check(const ps_st_file *ref, int64_t s, int l, const float *blocks, const float *bs, int64_t Hk, int64_t K,
                      int64_t nb, double *err_bs) {
    char rn[80];
    snprintf(rn, sizeof rn, "decode.step%lld.layer%d.topk_idx", (long long)s, l);
    double *ti = ref_get(ref, rn, NULL);
    snprintf(rn, sizeof rn, "decode.step%lld.layer%d.block_scores", (long long)s, l);
    double *tb = ref_get(ref, rn, NULL);
    int ok = ti && tb && set_mismatch(blocks, ti, 1, Hk, K) == 0;
    *err_bs = fmax(*err_bs, ti && tb ? rel_ht(bs, tb, 1, Hk, nb) : INFINITY);
    free(ti), free(tb);
    return ok;
}

static char TINY[2048];

static void tiny_path(char *buf, size_t n, const char *file) { snprintf(buf, n, "%s/%s", TINY, file); }

/* the hooks a conformance run caches */
static const char *const CACHED[] = {"attn.hook_ck", "attn.hook_ck2", "attn.hook_select_scores", "attn.hook_block_scores",
                                     "attn.hook_blocks"};

static void test_conformance(void) {
    ps_error err = {0};
    char path[2300];
    ps_minicpm_model m;
    REQUIRE_OK(ps_minicpm_model_load(&m, TINY, &err), &err);
    ps_st_file ref;
    tiny_path(path, sizeof path, "reference_outputs.safetensors");
    REQUIRE_OK(ps_st_open(path, &ref, &err), &err);
    const ps_minicpm_config *c = &m.cfg;
    int64_t n, Hk = c->n_kv_heads, K = ps_select_slots(&c->sel);
    double *tokd = ref_get(&ref, "tokens", &n);
    int64_t T = n;
    int32_t *tok = malloc((size_t)T * sizeof *tok);
    for (int64_t i = 0; i < T; i++) tok[i] = (int32_t)tokd[i];
    ps_hooks h;
    ps_cache cache;
    ps_hooks_init(&h);
    ps_cache_init(&cache);
    char nm[128];
    for (int l = 0; l < c->n_layers; l++)
        for (int i = 0; i < 5; i++) {
            snprintf(nm, sizeof nm, "blocks.%d.%s", l, CACHED[i]);
            CHECK_OK(ps_minicpm_cache_watch(&cache, &h, c, nm, &err), &err);
        }
    ps_minicpm_acts a;
    REQUIRE_OK(ps_minicpm_acts_create(&a, &m, 1, T, &err), &err);
    CHECK_OK(ps_minicpm_forward(&m, &a, tok, &h, -1, &err), &err);
    double *lg = ref_get(&ref, "logits", &n);
    double e = rel(a.logits, lg, n);
    printf("tiny T = %lld: logits max|a-b|/max|b| = %.3g\n", (long long)T, e);
    CHECK(e < 1e-4, "logits: %.3g", e);
    int64_t N1 = ps_select_n_windows(T, c->sel.kernel, c->sel.stride), nb = ps_select_n_blocks(&c->sel, T), ties = 0;
    for (int l = 0; l < c->n_layers; l++) {
        const char *what[4] = {"k1", "k2", "stage1_scores", "block_scores"};
        for (int i = 0; i < 4; i++) {
            char rn[64];
            snprintf(rn, sizeof rn, "layer%d.%s", l, what[i]);
            snprintf(nm, sizeof nm, "blocks.%d.%s", l, CACHED[i]);
            double *r = ref_get(&ref, rn, &n);
            const ps_cache_item *it = ps_cache_get(&cache, nm);
            if (!r || !it) {
                CHECK(0, "%s: not cached", nm);
                free(r);
                continue;
            }
            int64_t X = i == 2 ? N1 : nb;
            e = i < 2 ? rel(it->data, r, n) : rel_ht(it->data, r, T, Hk, X);
            printf("  layer %d %-13s %.3g\n", l, what[i], e);
            CHECK(e < 1e-4, "layer %d %s: %.3g", l, what[i], e);
            if (i == 3) {
                int64_t t = tie_pairs(r, T, Hk, nb, K, c->sel.block);
                printf("  layer %d: %lld (head, row) pairs decided by the lower-index tie rule\n", l, (long long)t);
                ties += t;
            }
            free(r);
        }
        char rn[64];
        snprintf(rn, sizeof rn, "layer%d.topk_idx", l);
        snprintf(nm, sizeof nm, "blocks.%d.attn.hook_blocks", l);
        double *r = ref_get(&ref, rn, &n);
        const ps_cache_item *it = ps_cache_get(&cache, nm);
        if (r && it) {
            int64_t bad = set_mismatch(it->data, r, T, Hk, K);
            printf("  layer %d topk_idx: %lld of %lld (head, row) sets differ\n", l, (long long)bad, (long long)(T * Hk));
            CHECK(bad == 0, "layer %d: %lld selections differ", l, (long long)bad);
        }
        free(r);
    }
    CHECK(ties == 37 + 41, "the vectors' tie-decided pairs: %lld (the spec: 37 and 41)", (long long)ties);
    ps_minicpm_acts_free(&a);
    ps_hooks_free(&h);
    ps_cache_free(&cache);
    /* the greedy decode: each step a whole forward over the grown sequence (no KV cache yet; equal in sparse mode) */
    double *dt = ref_get(&ref, "decode.tokens", &n), *dl = ref_get(&ref, "decode.logits", NULL);
    int64_t Tp = 250, steps = n - Tp, V = c->vocab_size;
    int32_t *seq = malloc((size_t)n * sizeof *seq);
    for (int64_t i = 0; i < Tp; i++) seq[i] = (int32_t)dt[i];
    double worst = 0;
    int same_tok = 1, same_sel = 1;
    double worst_bs = 0;
    for (int64_t s = 0; s <= steps; s++) {
        int64_t L = Tp + s;
        ps_hooks_init(&h);
        ps_cache_init(&cache);
        for (int l = 0; l < c->n_layers; l++)
            for (int i = 3; i < 5; i++) {
                snprintf(nm, sizeof nm, "blocks.%d.%s", l, CACHED[i]);
                CHECK_OK(ps_minicpm_cache_watch(&cache, &h, c, nm, &err), &err);
            }
        REQUIRE_OK(ps_minicpm_acts_create(&a, &m, 1, L, &err), &err);
        CHECK_OK(ps_minicpm_forward(&m, &a, seq, &h, -1, &err), &err);
        const float *last = a.logits + (L - 1) * V;
        worst = fmax(worst, rel(last, dl + s * V, V));
        int64_t arg = 0;
        for (int64_t v = 1; v < V; v++) arg = last[v] > last[arg] ? v : arg;
        if (s < steps) {
            same_tok &= arg == (int64_t)dt[L];
            seq[L] = (int32_t)dt[L];
        }
        int64_t nbL = ps_select_n_blocks(&c->sel, L);
        for (int l = 0; l < c->n_layers; l++) {
            snprintf(nm, sizeof nm, "blocks.%d.attn.hook_blocks", l);
            const ps_cache_item *ib = ps_cache_get(&cache, nm);
            snprintf(nm, sizeof nm, "blocks.%d.attn.hook_block_scores", l);
            const ps_cache_item *is = ps_cache_get(&cache, nm);
            same_sel &= ib && is &&
                        step_check(&ref, s, l, ib->data + (L - 1) * Hk * K, is->data + (L - 1) * Hk * nbL, Hk, K, nbL, &worst_bs);
        }
        ps_minicpm_acts_free(&a);
        ps_hooks_free(&h);
        ps_cache_free(&cache);
    }
    printf("decode (%lld steps, whole forwards): logits %.3g, block scores %.3g, tokens %s, selections %s\n", (long long)steps,
           worst, worst_bs, same_tok ? "same" : "DIFFER", same_sel ? "same" : "DIFFER");
    CHECK(worst < 1e-4 && worst_bs < 1e-4, "decode logits %.3g, block scores %.3g", worst, worst_bs);
    CHECK(same_tok, "the greedy decode's tokens");
    CHECK(same_sel, "the decode steps' selections as sets");
    /* the same decode through the KV cache: the prompt prefilled at once, then one token at a time */
    {
        ps_minicpm_cache kv;
        float *row = malloc((size_t)V * sizeof(float));
        double wl = 0, wb = 0;
        int tok_ok = 1, sel_ok = 1;
        REQUIRE_OK(ps_minicpm_cache_create(&kv, &m, n, &err), &err);
        for (int64_t i = 0; i < Tp; i++) seq[i] = (int32_t)dt[i];
        for (int64_t s = 0; s <= steps; s++) {
            int64_t L = Tp + s, nbL = ps_select_n_blocks(&c->sel, L);
            int rc = s == 0 ? ps_minicpm_prefill(&m, &kv, seq, Tp, row, &err) : ps_minicpm_decode(&m, &kv, seq[L - 1], row, &err);
            CHECK_OK(rc, &err);
            if (rc) break;
            wl = fmax(wl, rel(row, dl + s * V, V));
            int64_t arg = 0;
            for (int64_t v = 1; v < V; v++) arg = row[v] > row[arg] ? v : arg;
            if (s < steps) tok_ok &= arg == (int64_t)dt[L], seq[L] = (int32_t)dt[L];
            for (int l = 0; l < c->n_layers; l++)
                sel_ok &= step_check(&ref, s, l, kv.blocks + l * Hk * K, kv.bs + l * Hk * kv.nb_cap, Hk, K, nbL, &wb);
        }
        printf("decode (%lld steps, KV cache): logits %.3g, block scores %.3g, tokens %s, selections %s\n", (long long)steps, wl, wb,
               tok_ok ? "same" : "DIFFER", sel_ok ? "same" : "DIFFER");
        CHECK(wl < 1e-4 && wb < 1e-4 && tok_ok && sel_ok, "the KV-cache decode reproduces the vectors");
        ps_minicpm_cache_free(&kv);
        free(row);
    }
    free(seq), free(dt), free(dl), free(lg), free(tok), free(tokd);
    ps_st_close(&ref);
    ps_minicpm_model_free(&m);
}

/* ---- checkpoints written here from the tiny one ---- */

typedef struct {
    int n;
    char names[32][96];
    int64_t shape[32][2];
    int nd[32];
    float *data[32];
} weights;

static void weights_read(weights *w, ps_error *err) {
    char path[2300];
    ps_st_file f;
    memset(w, 0, sizeof *w);
    tiny_path(path, sizeof path, "model.safetensors");
    if (ps_st_open(path, &f, err)) {
        CHECK(0, "%s", err->msg);
        return;
    }
    for (int i = 0; i < f.n && w->n < 32; i++) {
        const ps_st_entry *e = &f.entries[i];
        snprintf(w->names[w->n], sizeof w->names[0], "%s", e->name);
        w->nd[w->n] = e->ndim;
        for (int d = 0; d < e->ndim; d++) w->shape[w->n][d] = e->shape[d];
        w->data[w->n] = malloc((size_t)ps_st_numel(e) * sizeof(float));
        CHECK_OK(ps_st_read_f32(&f, e, w->data[w->n], err), err);
        w->n++;
    }
    ps_st_close(&f);
}

static void weights_free(weights *w) {
    for (int i = 0; i < w->n; i++) free(w->data[i]);
}

static int find_w(const weights *w, const char *name) {
    for (int i = 0; i < w->n; i++)
        if (!strcmp(w->names[i], name)) return i;
    return -1;
}

/* the tiny config with edits: set[key] = JSON value text (a key "sparse_config.X" edits the sub-object; a NULL
 * value deletes the key) */
static void write_config(const char *dir, const char *const *keys, const char *const *vals, int n) {
    char path[2300];
    tiny_path(path, sizeof path, "config.json");
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    for (int i = 0; i < n; i++) {
        json_t *obj = root;
        const char *k = keys[i];
        if (!strncmp(k, "sparse_config.", 14)) obj = json_object_get(root, "sparse_config"), k += 14;
        if (!strncmp(k, "rope_scaling.", 13)) obj = json_object_get(root, "rope_scaling"), k += 13;
        if (!vals[i]) json_object_del(obj, k);
        else json_object_set_new(obj, k, json_loads(vals[i], JSON_DECODE_ANY, &je));
    }
    snprintf(path, sizeof path, "%s/config.json", dir);
    CHECK(json_dump_file(root, path, JSON_INDENT(1)) == 0, "write %s", path);
    json_decref(root);
}

/* write the weights (all but `skip`) as `dtype`, in one file or (shards > 1) shards with an index */
static void write_weights(const char *dir, const weights *w, const char *skip, ps_dtype dtype, int shards) {
    ps_error err;
    ps_st_tensor t[32];
    int n = 0;
    for (int i = 0; i < w->n; i++) {
        if (skip && !strcmp(w->names[i], skip)) continue;
        t[n] = (ps_st_tensor){.name = w->names[i], .ndim = w->nd[i], .data = w->data[i]};
        memcpy(t[n].shape, w->shape[i], sizeof w->shape[i]);
        n++;
    }
    char path[2300];
    if (shards <= 1) {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        CHECK_OK(ps_st_save_as(path, t, n, NULL, NULL, 0, dtype, &err), &err);
        return;
    }
    json_t *map = json_object();
    for (int s = 0; s < shards; s++) {
        char file[64];
        snprintf(file, sizeof file, "model-%05d-of-%05d.safetensors", s + 1, shards);
        int i0 = n * s / shards, i1 = n * (s + 1) / shards;
        snprintf(path, sizeof path, "%s/%s", dir, file);
        CHECK_OK(ps_st_save_as(path, t + i0, i1 - i0, NULL, NULL, 0, dtype, &err), &err);
        for (int i = i0; i < i1; i++) json_object_set_new(map, t[i].name, json_string(file));
    }
    json_t *ix = json_pack("{s:{s:i}, s:o}", "metadata", "total_size", 0, "weight_map", map);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    CHECK(json_dump_file(ix, path, 0) == 0, "write %s", path);
    json_decref(ix);
}

/* logits [T, V] of the checkpoint in dir over tok (NULL on an error, reported) */
static float *logits_of(const char *dir, const int32_t *tok, int64_t T, const ps_hooks *h) {
    ps_error err;
    ps_minicpm_model m;
    ps_minicpm_acts a;
    if (ps_minicpm_model_load(&m, dir, &err) || ps_minicpm_acts_create(&a, &m, 1, T, &err)) {
        CHECK(0, "%s: %s", dir, err.msg);
        ps_minicpm_model_free(&m);
        return NULL;
    }
    float *out = NULL;
    if (ps_minicpm_forward(&m, &a, tok, h, -1, &err)) CHECK(0, "%s: forward: %s", dir, err.msg);
    else {
        out = malloc((size_t)(T * m.cfg.vocab_size) * sizeof(float));
        memcpy(out, a.logits, (size_t)(T * m.cfg.vocab_size) * sizeof(float));
    }
    ps_minicpm_acts_free(&a);
    ps_minicpm_model_free(&m);
    return out;
}

static int same_floats(const float *a, const float *b, int64_t n) { return a && b && !memcmp(a, b, (size_t)n * sizeof(float)); }

static double max_diff(const float *a, const float *b, int64_t n) {
    double d = 0;
    for (int64_t i = 0; a && b && i < n; i++) d = fmax(d, fabs(a[i] - b[i]));
    return a && b ? d : INFINITY;
}

enum { TV = 200, VOC = 128 };

static void test_variants(void) {
    ps_error err;
    weights w;
    weights_read(&w, &err);
    int32_t tok[TV];
    tu_random_tokens(tok, TV, VOC, 11);
    float *base = logits_of(TINY, tok, TV, NULL);
    char dir[512];
    /* float32 weights (bf16 values widened exactly): the same logits bit for bit */
    tu_tempdir(dir, sizeof dir, "minicpm_f32");
    write_config(dir, NULL, NULL, 0);
    write_weights(dir, &w, NULL, PS_DT_F32, 1);
    float *f32 = logits_of(dir, tok, TV, NULL);
    CHECK(same_floats(base, f32, TV * VOC), "f32 weights = the bf16 checkpoint's logits");
    /* f16 storage rounds: close, not equal */
    tu_tempdir(dir, sizeof dir, "minicpm_f16");
    write_config(dir, NULL, NULL, 0);
    write_weights(dir, &w, NULL, PS_DT_F16, 1);
    float *f16 = logits_of(dir, tok, TV, NULL);
    CHECK(max_diff(base, f16, TV * VOC) < 0.05, "f16 weights: within rounding (%.3g)", max_diff(base, f16, TV * VOC));
    /* sharded with an index: the same logits */
    tu_tempdir(dir, sizeof dir, "minicpm_shards");
    write_config(dir, NULL, NULL, 0);
    write_weights(dir, &w, NULL, PS_DT_BF16, 3);
    float *sh = logits_of(dir, tok, TV, NULL);
    CHECK(same_floats(base, sh, TV * VOC), "three shards with an index = one file");
    /* tied: no lm_head.weight, the embedding is the head; = the untied checkpoint whose head is the embedding */
    int ie = find_w(&w, "model.embed_tokens.weight"), ih = find_w(&w, "lm_head.weight");
    float *keep = w.data[ih];
    w.data[ih] = w.data[ie];
    tu_tempdir(dir, sizeof dir, "minicpm_untied_copy");
    write_config(dir, NULL, NULL, 0);
    write_weights(dir, &w, NULL, PS_DT_BF16, 1);
    float *untied = logits_of(dir, tok, TV, NULL);
    w.data[ih] = keep;
    tu_tempdir(dir, sizeof dir, "minicpm_tied");
    const char *tk[] = {"tie_word_embeddings"}, *tv[] = {"true"};
    write_config(dir, tk, tv, 1);
    write_weights(dir, &w, "lm_head.weight", PS_DT_BF16, 1);
    float *tied = logits_of(dir, tok, TV, NULL);
    CHECK(same_floats(untied, tied, TV * VOC) && !same_floats(base, tied, TV * VOC),
          "tied head = an untied one holding the embedding (and differs from the tiny's own head)");
    /* untied without lm_head.weight: refused by tensor and file */
    tu_tempdir(dir, sizeof dir, "minicpm_nohead");
    write_config(dir, NULL, NULL, 0);
    write_weights(dir, &w, "lm_head.weight", PS_DT_BF16, 1);
    ps_minicpm_model m;
    CHECK_ERR(ps_minicpm_model_load(&m, dir, &err), &err, "lm_head.weight", "model.safetensors", "tie_word_embeddings");
    ps_minicpm_model_free(&m);
    /* dense_len: below it ordinary causal attention (at 96 tokens the 6 slots hold every block: the same logits as
     * the sparse path), at 200 tokens the sparse path leaves blocks out (different logits) */
    tu_tempdir(dir, sizeof dir, "minicpm_dense");
    const char *dk[] = {"sparse_config.dense_len"}, *dv[] = {"1000"};
    write_config(dir, dk, dv, 1);
    write_weights(dir, &w, NULL, PS_DT_BF16, 1);
    float *dense = logits_of(dir, tok, TV, NULL), *dense96 = logits_of(dir, tok, 96, NULL), *sparse96 = logits_of(TINY, tok, 96, NULL);
    CHECK(max_diff(dense96, sparse96, 96 * VOC) < 1e-5, "96 tokens: dense = sparse with every block selected (%.3g)",
          max_diff(dense96, sparse96, 96 * VOC));
    CHECK(max_diff(dense, base, TV * VOC) > 1e-3, "200 tokens: dense differs from sparse (%.3g)", max_diff(dense, base, TV * VOC));
    /* a decode that crosses dense_len (prompt of 96, dense below 99): equal to whole forwards while dense, then it
     * keeps the keys of its dense calls and differs from a whole sparse forward (by design) */
    {
        tu_tempdir(dir, sizeof dir, "minicpm_cross");
        const char *ck[] = {"sparse_config.dense_len"}, *cv[] = {"99"};
        write_config(dir, ck, cv, 1);
        write_weights(dir, &w, NULL, PS_DT_BF16, 1);
        ps_minicpm_model mc;
        ps_minicpm_cache kv;
        if (ps_minicpm_model_load(&mc, dir, &err) || ps_minicpm_cache_create(&kv, &mc, 128, &err)) CHECK(0, "cross: %s", err.msg);
        else {
            float row[VOC];
            double dense_diff = 0, sparse_diff = 0;
            CHECK_OK(ps_minicpm_prefill(&mc, &kv, tok, 96, row, &err), &err);
            for (int64_t L = 97; L <= 104; L++) {
                CHECK_OK(ps_minicpm_decode(&mc, &kv, tok[L - 1], row, &err), &err);
                float *whole = logits_of(dir, tok, L, NULL);
                double dd = max_diff(row, whole ? whole + (L - 1) * VOC : NULL, VOC);
                if (L < 99) dense_diff = fmax(dense_diff, dd);
                else sparse_diff = fmax(sparse_diff, dd);
                free(whole);
            }
            CHECK(dense_diff < 1e-4 && sparse_diff > 1e-4,
                  "crossing dense_len: dense steps = whole forwards (%.3g); sparse steps keep the dense keys (differ by %.3g)", dense_diff,
                  sparse_diff);
            ps_minicpm_cache_free(&kv);
        }
        ps_minicpm_model_free(&mc);
    }
    /* use_nope: the compressed keys are window means of the un-roped keys (hook_k rotated back here) */
    {
        tu_tempdir(dir, sizeof dir, "minicpm_nope");
        const char *nk[] = {"sparse_config.use_nope"}, *nv[] = {"true"};
        write_config(dir, nk, nv, 1);
        write_weights(dir, &w, NULL, PS_DT_BF16, 1);
        ps_minicpm_model mn;
        ps_minicpm_acts an;
        if (ps_minicpm_model_load(&mn, dir, &err) || ps_minicpm_acts_create(&an, &mn, 1, TV, &err)) CHECK(0, "use_nope: %s", err.msg);
        else {
            ps_hooks h;
            ps_cache cache;
            ps_hooks_init(&h);
            ps_cache_init(&cache);
            CHECK_OK(ps_minicpm_cache_watch(&cache, &h, &mn.cfg, "blocks.1.attn.hook_k", &err), &err);
            CHECK_OK(ps_minicpm_cache_watch(&cache, &h, &mn.cfg, "blocks.1.attn.hook_ck", &err), &err);
            CHECK_OK(ps_minicpm_forward(&mn, &an, tok, &h, -1, &err), &err);
            const ps_cache_item *ik = ps_cache_get(&cache, "blocks.1.attn.hook_k"), *ic = ps_cache_get(&cache, "blocks.1.attn.hook_ck");
            int64_t Hk = mn.cfg.n_kv_heads, D = mn.cfg.head_dim, half = D / 2, K = mn.cfg.sel.kernel, S = mn.cfg.sel.stride;
            float *cs = malloc((size_t)(TV * half) * sizeof(float)), *sn = malloc((size_t)(TV * half) * sizeof(float));
            ps_minicpm_rope_table(&mn.cfg, 0, TV, TV, cs, sn);
            double worst = 0, mx = 0;
            for (int64_t j = 0; ik && ic && j < ic->shape[1]; j++)
                for (int64_t h2 = 0; h2 < Hk; h2++)
                    for (int64_t e = 0; e < D; e++) {
                        double mean = 0;
                        for (int64_t t = j * S; t < j * S + K; t++) {
                            const float *x = ik->data + (t * Hk + h2) * D;
                            int64_t i = e % half;
                            double c = cs[t * half + i], sv = sn[t * half + i], m2 = c * c + sv * sv; /* the longrope scale squared */
                            mean += (e < half ? x[i] * c + x[i + half] * sv : x[i + half] * c - x[i] * sv) / m2 / (double)K;
                        }
                        worst = fmax(worst, fabs(mean - ic->data[(j * Hk + h2) * D + e]));
                        mx = fmax(mx, fabs(mean));
                    }
            CHECK(ik && ic && worst / mx < 1e-5, "use_nope: hook_ck = window means of the un-roped keys (%.3g)", worst / mx);
            CHECK(max_diff(an.logits, base, TV * VOC) > 1e-4, "use_nope changes the logits");
            free(cs), free(sn);
            ps_hooks_free(&h);
            ps_cache_free(&cache);
            ps_minicpm_acts_free(&an);
        }
        ps_minicpm_model_free(&mn);
    }
    free(base), free(f32), free(f16), free(sh), free(untied), free(tied), free(dense), free(dense96), free(sparse96);
    weights_free(&w);
}

static void test_bad_configs(void) {
    ps_error err;
    weights w;
    weights_read(&w, &err);
    struct {
        const char *key, *val, *want1, *want2;
    } cases[] = {
        {"scale_emb", NULL, "\"scale_emb\"", "missing"},
        {"hidden_size", NULL, "\"hidden_size\"", "missing"},
        {"sparse_config.topk", NULL, "\"sparse_config.topk\"", "missing"},
        {"sparse_config", NULL, "\"sparse_config\"", "missing"},
        {"sparse_config.block_size", "18", "\"sparse_config.block_size\"", "multiple"},
        {"sparse_config.kernel_size", "2", "\"sparse_config.kernel_size\"", "less than"},
        {"sparse_config.topk", "-1", "\"sparse_config.topk\"", "outside"},
        {"sparse_config.window_size", "40", "\"sparse_config.window_size\"", "multiple"},
        {"sparse_config.use_nope", "1", "\"sparse_config.use_nope\"", "true or false"},
        {"rope_scaling.rope_type", "\"yarn\"", "\"rope_scaling.rope_type\"", "longrope"},
        {"rope_scaling.long_factor", "[1, 2]", "\"rope_scaling.long_factor\"", "head_dim / 2"},
        {"num_key_value_heads", "3", "\"num_key_value_heads\"", "divide"},
        {"rms_norm_eps", "\"small\"", "\"rms_norm_eps\"", "a number"},
        {"hidden_act", "\"gelu\"", "\"hidden_act\"", "silu"},
        {"num_key_value_heads", "4", "k_proj.weight", "[64, 64]"}, /* a tensor of the wrong shape */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char dir[512];
        tu_tempdir(dir, sizeof dir, "minicpm_bad");
        write_config(dir, &cases[i].key, &cases[i].val, 1);
        write_weights(dir, &w, NULL, PS_DT_BF16, 1);
        ps_minicpm_model m;
        const char *file = i + 1 == sizeof cases / sizeof cases[0] ? "model.safetensors" : "config.json";
        CHECK_ERR(ps_minicpm_model_load(&m, dir, &err), &err, cases[i].want1, cases[i].want2, file);
        ps_minicpm_model_free(&m);
    }
    weights_free(&w);
}

/* ---- hook edits that change what is attended ---- */

typedef struct {
    int kind; /* 0: scale hook_ck by 3; 1: zero stage-1 scores of KV head 0; 2: set blocks to {0, q_blk} */
    int64_t block, fired;
} edit;

static int do_edit(const ps_hook_event *ev, void *user, ps_error *err) {
    (void)err;
    edit *e = user;
    int64_t n = ev->shape[0] * ev->shape[1] * ev->shape[2] * ev->shape[3];
    e->fired++;
    if (e->kind == 0)
        for (int64_t i = 0; i < n; i++) ev->data[i] *= 3.0f;
    else if (e->kind == 1)
        for (int64_t i = 0; i < n; i++) ev->data[i] = (i / ev->shape[3]) % ev->shape[2] == 0 ? 0.0f : ev->data[i];
    else {
        int64_t T = ev->shape[1], Hk = ev->shape[2], K = ev->shape[3];
        for (int64_t t = 0; t < T; t++)
            for (int64_t h = 0; h < Hk; h++) {
                float *r = ev->data + (t * Hk + h) * K;
                for (int64_t k = 0; k < K; k++) r[k] = -1;
                r[0] = 0;
                r[1] = t / e->block ? (float)(t / e->block) : -1.0f;
            }
    }
    return 0;
}

static void test_edits(void) {
    ps_error err;
    ps_minicpm_model m;
    REQUIRE_OK(ps_minicpm_model_load(&m, TINY, &err), &err);
    const ps_minicpm_config *c = &m.cfg;
    int64_t T = 160, V = c->vocab_size, H = c->n_heads, Hk = c->n_kv_heads, D = c->head_dim, Bk = c->sel.block;
    int32_t tok[160];
    tu_random_tokens(tok, T, V, 5);
    ps_minicpm_acts a;
    REQUIRE_OK(ps_minicpm_acts_create(&a, &m, 1, T, &err), &err);
    REQUIRE_OK(ps_minicpm_forward(&m, &a, tok, NULL, -1, &err), &err);
    float *clean = malloc((size_t)(T * V) * sizeof(float));
    memcpy(clean, a.logits, (size_t)(T * V) * sizeof(float));
    const char *names[3] = {"blocks.1.attn.hook_ck", "blocks.1.attn.hook_select_scores", "blocks.1.attn.hook_blocks"};
    for (int k = 0; k < 3; k++) {
        ps_hooks h;
        ps_cache cache;
        ps_hooks_init(&h);
        ps_cache_init(&cache);
        edit e = {.kind = k, .block = Bk};
        const char *watch[5] = {"blocks.1.attn.hook_q", "blocks.1.attn.hook_k", "blocks.1.attn.hook_v", "blocks.1.attn.hook_blocks",
                                "blocks.1.attn.hook_z"};
        CHECK_OK(ps_minicpm_cache_watch(&cache, &h, c, watch[3], &err), &err); /* before the edit: the clean selection */
        CHECK_OK(ps_minicpm_hooks_add(&h, c, names[k], do_edit, &e, &err), &err);
        for (int i = 0; i < 5; i++)
            if (i != 3) CHECK_OK(ps_minicpm_cache_watch(&cache, &h, c, watch[i], &err), &err);
        CHECK_OK(ps_minicpm_forward(&m, &a, tok, &h, -1, &err), &err);
        CHECK(e.fired == 1 && max_diff(a.logits, clean, T * V) > 1e-4, "editing %s changes the logits (%.3g)", names[k],
              max_diff(a.logits, clean, T * V));
        if (k == 2) {
            /* attention restricted to blocks {0, q_blk}, computed here by plain loops over the cached q, k, v */
            const float *q = ps_cache_get(&cache, watch[0])->data, *kk = ps_cache_get(&cache, watch[1])->data,
                        *vv = ps_cache_get(&cache, watch[2])->data, *z = ps_cache_get(&cache, watch[4])->data;
            double worst = 0, zmax = 0;
            for (int64_t t = 0; t < T; t++)
                for (int64_t g = 0; g < H; g++) {
                    int64_t kh = g / (H / Hk);
                    double w[160], mx = -1e300, sum = 0;
                    for (int64_t j = 0; j <= t; j++) {
                        w[j] = -1e300;
                        if (j / Bk != 0 && j / Bk != t / Bk) continue;
                        double s = 0;
                        for (int64_t d = 0; d < D; d++) s += (double)q[(t * H + g) * D + d] * kk[(j * Hk + kh) * D + d];
                        w[j] = s / sqrt((double)D);
                        mx = fmax(mx, w[j]);
                    }
                    for (int64_t j = 0; j <= t; j++) sum += w[j] > -1e299 ? exp(w[j] - mx) : 0;
                    for (int64_t d = 0; d < D; d++) {
                        double o = 0;
                        for (int64_t j = 0; j <= t; j++)
                            if (w[j] > -1e299) o += exp(w[j] - mx) / sum * vv[(j * Hk + kh) * D + d];
                        worst = fmax(worst, fabs(o - z[(t * H + g) * D + d]));
                        zmax = fmax(zmax, fabs(o));
                    }
                }
            CHECK(worst / zmax < 1e-5, "hook_blocks set to {0, q_blk}: hook_z = attention over those blocks (%.3g)", worst / zmax);
        } else {
            /* the edit moved the selection that follows it */
            ps_hooks h2;
            ps_cache c2;
            ps_hooks_init(&h2);
            ps_cache_init(&c2);
            CHECK_OK(ps_minicpm_cache_watch(&c2, &h2, c, watch[3], &err), &err);
            CHECK_OK(ps_minicpm_forward(&m, &a, tok, &h2, -1, &err), &err);
            const ps_cache_item *cl = ps_cache_get(&c2, watch[3]), *ed = ps_cache_get(&cache, watch[3]);
            CHECK(cl && ed && memcmp(cl->data, ed->data, (size_t)(T * Hk * ps_select_slots(&c->sel)) * sizeof(float)),
                  "editing %s changes the selected blocks", names[k]);
            ps_hooks_free(&h2);
            ps_cache_free(&c2);
        }
        ps_hooks_free(&h);
        ps_cache_free(&cache);
    }
    /* an overwritten hook_blocks is checked */
    {
        ps_hooks h;
        ps_hooks_init(&h);
        ps_hook_action act = {.kind = PS_ACT_ZERO, .head = 1};
        CHECK_OK(ps_minicpm_hooks_add_action(&h, c, "blocks.0.attn.hook_blocks", &act, &err), &err);
        CHECK_OK(ps_minicpm_forward(&m, &a, tok, &h, -1, &err), &err); /* zeros: block 0 only, valid */
        ps_hooks_free(&h);
        ps_hooks_init(&h);
        ps_hook_action bad = {.kind = PS_ACT_ADD, .head = -1, .every_pos = 1, .scale = 0.5f};
        float half[2 * 6] = {0};
        bad.src = half;
        for (int i = 0; i < 12; i++) half[i] = 1;
        CHECK_OK(ps_minicpm_hooks_add_action(&h, c, "blocks.0.attn.hook_blocks", &bad, &err), &err);
        CHECK_ERR(ps_minicpm_forward(&m, &a, tok, &h, -1, &err), &err, "blocks.0.attn.hook_blocks", "0.5");
        ps_hooks_free(&h);
        CHECK_ERR(ps_minicpm_hooks_add(&h, c, "blocks.2.attn.hook_ck", do_edit, NULL, &err), &err, "out of range", "hook_blocks");
        CHECK_ERR(ps_minicpm_hooks_add(&h, c, "blocks.0.attn.hook_pattern", do_edit, NULL, &err), &err, "unknown hook name");
    }
    ps_minicpm_acts_free(&a);
    free(clean);
    ps_minicpm_model_free(&m);
}

/* ---- through the family table ---- */

static void test_runtime(void) {
    ps_error err;
    ps_runtime rt;
    ps_runtime_opts o = {.backend = "cpu", .weights = 0, .lazy = -1};
    REQUIRE_OK(ps_runtime_open(&rt, TINY, &o, &err), &err);
    CHECK(rt.family == &ps_family_minicpm && rt.n_layers == 2 && rt.max_pos == 1024, "ps_runtime_open picks the MiniCPM4 family");
    CHECK(ps_runtime_detect(TINY) == &ps_family_minicpm, "the detector");
    int64_t d[4];
    int got = 0;
    for (int i = 0; i < rt.family->n_points; i++) {
        int r = rt.family->point_shape(&rt, i, 1, 2, 256, d);
        if (rt.family->points[i].point == PS_MCH_BLOCKS) got |= r == 4 && d[0] == 2 && d[1] == 256 && d[2] == 2 && d[3] == 6;
        if (rt.family->points[i].point == PS_MCH_SELECT_SCORES) got |= (r == 4 && d[3] == 63) << 1;
        if (rt.family->points[i].point == PS_MCH_CK2) got |= (r == 4 && d[1] == 15) << 2;
    }
    CHECK(got == 7, "point shapes: hook_blocks [2, 256, 2, 6], select_scores [.., 63], ck2 [2, 15, ..]");
    FILE *f = tmpfile();
    CHECK_OK(rt.family->describe(&rt, 1, f, &err), &err);
    char buf[4096] = "";
    rewind(f);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    CHECK(strstr(buf, "InfLLM-v2") && strstr(buf, "top 4 + 2 local"), "info's account: %s", buf);
    char lab[128];
    CHECK(!strcmp(ps_runtime_label(&rt, lab, sizeof lab), "MiniCPM4 InfLLM-v2, blocks of 16, top 4 + 2 local"), "label %s", lab);
    /* the weights after a headers-only open, then a forward through the table */
    CHECK_OK(rt.family->load_weights(&rt, -1, &err), &err);
    int32_t tok[40];
    tu_random_tokens(tok, 40, 128, 3);
    void *a = rt.family->acts_create(&rt, 1, 40, 0, &err);
    CHECK(a != NULL, "acts: %s", err.msg);
    if (a) {
        CHECK_OK(rt.family->forward(&rt, a, tok, NULL, -1, &err), &err);
        float *direct = logits_of(TINY, tok, 40, NULL);
        CHECK(same_floats(rt.family->logits(a, &err), direct, 40 * 128), "forward through the family table");
        free(direct);
        rt.family->acts_free(a);
    }
    /* the cache's bytes: info's figure per token, and what ps_kvcache_bytes reports for a sequence at its length
     * (tiny: 2 layers x 2 KV heads x 16: keys and values 512 bytes/token, the compressed keys 2·32·4·(1/4 + 1/16) = 80) */
    const ps_minicpm_config *mcfg = &((const ps_minicpm_model *)rt.model)->cfg;
    CHECK(strstr(buf, "592.0 bytes/token: keys and values 512.0, compressed keys 80.0"), "info's cache account: %s", buf);
    double per = (double)(ps_minicpm_cache_bytes(mcfg, 1024) - ps_minicpm_cache_bytes(mcfg, 0)) / 1024.0;
    CHECK(fabs(per - 592.0) < 0.01 * 592.0, "the cache grows by %.2f bytes/token (info: 592)", per);
    ps_kvcache kv;
    if (!ps_kvcache_create_rt(&kv, &rt, NULL, &err)) {
        int s = ps_kvcache_add(&kv, &err);
        int64_t nt = 40, one = 1;
        float lg[128];
        CHECK_OK(s < 0 || ps_kvcache_append(&kv, 1, &s, &nt, tok, NULL, lg, true, &err) ||
                     ps_kvcache_append(&kv, 1, &s, &one, tok, NULL, lg, true, &err),
                 &err);
        CHECK(ps_kvcache_bytes(&kv) == ps_minicpm_cache_bytes(mcfg, 41), "ps_kvcache_bytes %lld = the cache at 41 tokens %lld",
              (long long)ps_kvcache_bytes(&kv), (long long)ps_minicpm_cache_bytes(mcfg, 41));
        ps_kvcache_free(&kv);
    } else
        CHECK(0, "kvcache: %s", err.msg);
    ps_runtime_free(&rt);
    o.backend = "cuda";
    CHECK_ERR(ps_runtime_open(&rt, TINY, &o, &err), &err, "--backend cuda", "cpu");
    ps_runtime_free(&rt);
}

/* ---- the family's KV cache through ps_kvcache_* (minicpm_family.c) on the conformance checkpoint: every new row's
 * logits, fork, truncate, hooks during an append, the cache point cache_ck ---- */

/* a hook that records each firing's shape, the event's position and entry, and (zero) zeroes the last row */
typedef struct {
    const ps_kvcache *kv;
    int n, zero;
    int64_t shape[4], t0, entry;
    float last[64];
    int64_t nlast;
} kv_tap;

static int kv_tap_fn(const ps_hook_event *ev, void *user, ps_error *err) {
    (void)err;
    kv_tap *t = user;
    int64_t row = 1, n = 1;
    for (int i = 0; i < ev->ndim; i++) n *= ev->shape[i];
    for (int i = 2; i < ev->ndim; i++) row *= ev->shape[i];
    t->n++;
    memcpy(t->shape, ev->shape, sizeof t->shape);
    if (t->kv) t->t0 = ps_kvcache_event(t->kv)->t0, t->entry = ps_kvcache_event(t->kv)->entry;
    t->nlast = row < 64 ? row : 64;
    if (n >= row) memcpy(t->last, ev->data + n - row, (size_t)t->nlast * sizeof(float));
    if (t->zero && n >= row) memset(ev->data + n - row, 0, (size_t)row * sizeof(float));
    return 0;
}

static void test_kvcache_ops(void) {
    enum { NT = 60, P0 = 37 };
    ps_error err;
    ps_runtime rt;
    REQUIRE_OK(ps_runtime_open(&rt, TINY, NULL, &err), &err);
    const ps_minicpm_model *m = rt.model;
    const ps_minicpm_config *c = &m->cfg;
    int64_t V = c->vocab_size, Hk = c->n_kv_heads, D = c->head_dim, ns = ps_select_slots(&c->sel);
    int32_t tok[NT], alt[NT];
    tu_random_tokens(tok, NT, (int)V, 41);
    tu_random_tokens(alt, NT, (int)V, 42);
    float *ref = logits_of(TINY, tok, NT, NULL); /* the whole forward over every token */
    float *lg = malloc((size_t)(NT * V) * sizeof(float)), *lg2 = malloc((size_t)(NT * V) * sizeof(float));
    double big = 0;
    for (int64_t i = 0; ref && i < NT * V; i++) big = fmax(big, fabs(ref[i]));
    const double tol = 1e-4 * big; /* float32: a prefill's products over many rows vs a decode step's one row */
    ps_kvcache kv;
    REQUIRE_OK(ps_kvcache_create_rt(&kv, &rt, NULL, &err), &err);
    /* 1. every new row's logits: the prompt (a prefill) and 10 more tokens in one append (decode steps) = the whole
     * forward's rows (a row of the sparse path does not depend on the tokens after it) */
    int a = ps_kvcache_add(&kv, &err);
    int64_t n0 = P0, n1 = 10, n5 = 5;
    CHECK_OK(ps_kvcache_append(&kv, 1, &a, &n0, tok, NULL, lg, false, &err) ||
                 ps_kvcache_append(&kv, 1, &a, &n1, tok + P0, NULL, lg + P0 * V, false, &err),
             &err);
    double wa = max_diff(lg, ref, (P0 + 10) * V);
    CHECK(wa < tol, "all rows: %d appended rows vs the whole forward: %.3g (tolerance %.3g)", P0 + 10, wa, tol);
    CHECK(ps_kvcache_len(&kv, a) == P0 + 10, "length %lld", (long long)ps_kvcache_len(&kv, a));
    /* the last-only form gives the same last row, bit for bit */
    int b0 = ps_kvcache_add(&kv, &err);
    CHECK_OK(ps_kvcache_append(&kv, 1, &b0, &n0, tok, NULL, lg2, true, &err), &err);
    CHECK(same_floats(lg2, lg + (P0 - 1) * V, V), "a prefill's last row: last_only = all rows' last");
    ps_kvcache_drop(&kv, b0);
    /* 2. the cache point cache_ck: entry j of head g = the whole forward's hook_ck (over the same 47 tokens) */
    {
        ps_hooks h;
        ps_cache cc;
        ps_hooks_init(&h);
        ps_cache_init(&cc);
        CHECK_OK(ps_minicpm_cache_watch(&cc, &h, c, "blocks.1.attn.hook_ck", &err), &err);
        float *r47 = logits_of(TINY, tok, P0 + 10, &h);
        const ps_cache_item *it = ps_cache_get(&cc, "blocks.1.attn.hook_ck");
        int64_t N1 = ps_select_n_windows(P0 + 10, c->sel.kernel, c->sel.stride);
        int l = -1, v = -1;
        CHECK_OK(ps_kvcache_point_parse_kv(&kv, "blocks.1.attn.cache_ck", &l, &v, &err), &err);
        CHECK(l == 1 && v == 0 && ps_kvcache_n_entries(&kv, a, 1, 0) == N1 && ps_kvcache_entry_heads(&kv) == Hk,
              "cache_ck: layer %d, %lld entries (want %lld)", l, (long long)ps_kvcache_n_entries(&kv, a, 1, 0), (long long)N1);
        double we = 0, me = 0;
        float e[64];
        for (int64_t j = 0; it && j < N1; j++)
            for (int g = 0; g < Hk; g++) {
                CHECK_OK(ps_kvcache_entry(&kv, a, 1, g, 0, j, e, &err), &err);
                for (int64_t i = 0; i < D; i++)
                    we = fmax(we, fabs(e[i] - it->data[(j * Hk + g) * D + i])), me = fmax(me, fabs(it->data[(j * Hk + g) * D + i]));
            }
        CHECK(it && we < 1e-4 * fmax(me, 1.0), "cache_ck entries vs the whole forward's hook_ck: %.3g", we);
        CHECK_ERR(ps_kvcache_entry(&kv, a, 1, 0, 0, N1, e, &err), &err, "cache_ck entry", "holds");
        CHECK_ERR(ps_kvcache_point_parse_kv(&kv, "blocks.1.attn.cache_cv", &l, &v, &err), &err, "cache_cv", "cache_ck");
        CHECK_ERR(ps_kvcache_edit(&kv, a, 1, 0, 0, 0, PS_KV_EDIT_ZERO, NULL, &err), &err, "read-only", "hook_ck");
        free(r47);
        ps_cache_free(&cc);
        ps_hooks_free(&h);
    }
    /* 3. fork: the copy and a sequence with the same history decode the same tokens bit for bit, while the source
     * takes other tokens (each keeps its own) */
    int f = ps_kvcache_fork(&kv, a, &err), twin = ps_kvcache_add(&kv, &err);
    int64_t n47 = P0 + 10;
    CHECK(f >= 0 && twin >= 0 && ps_kvcache_len(&kv, f) == P0 + 10, "fork: %s", err.msg);
    CHECK_OK(ps_kvcache_append(&kv, 1, &twin, &n0, tok, NULL, NULL, true, &err) ||
                 ps_kvcache_append(&kv, 1, &twin, &n1, tok + P0, NULL, NULL, true, &err) ||
                 ps_kvcache_append(&kv, 1, &a, &n5, alt, NULL, lg2, false, &err) ||
                 ps_kvcache_append(&kv, 1, &f, &n5, tok + n47, NULL, lg, false, &err),
             &err);
    CHECK(max_diff(lg, ref + n47 * V, 5 * V) < tol, "fork then decode = the whole forward's rows");
    CHECK_OK(ps_kvcache_append(&kv, 1, &twin, &n5, tok + n47, NULL, lg2, false, &err), &err);
    CHECK(same_floats(lg, lg2, 5 * V), "fork then decode = the same decode of the original's history, bit for bit");
    /* 4. truncate: the source (47 + 5 other tokens) cut to 41 (inside a window) and grown by 6 tokens of its history =
     * the same rows it computed before (bit for bit), and = a fresh prefill of the 41 tokens then the 6 decodes
     * (the tiny model is always sparse, dense_len 0: docs/minicpm.md) */
    int64_t n6 = 6, n41 = 41;
    CHECK_OK(ps_kvcache_truncate(&kv, a, 41, &err), &err);
    CHECK(ps_kvcache_len(&kv, a) == 41 && ps_kvcache_n_entries(&kv, a, 0, 0) == ps_select_n_windows(41, c->sel.kernel, c->sel.stride),
          "truncate: length %lld, %lld pooled keys", (long long)ps_kvcache_len(&kv, a), (long long)ps_kvcache_n_entries(&kv, a, 0, 0));
    CHECK_OK(ps_kvcache_append(&kv, 1, &a, &n6, tok + 41, NULL, lg, false, &err), &err);
    int fresh = ps_kvcache_add(&kv, &err);
    CHECK_OK(ps_kvcache_append(&kv, 1, &fresh, &n41, tok, NULL, NULL, true, &err) ||
                 ps_kvcache_append(&kv, 1, &fresh, &n6, tok + 41, NULL, lg2, false, &err),
             &err);
    double wt = max_diff(lg, lg2, 6 * V);
    CHECK(wt < tol, "truncate to 41 then decode = a prefill of 41 then decode: %.3g", wt);
    CHECK(max_diff(lg, ref + 41 * V, 6 * V) < tol, "truncate then decode = the whole forward's rows");
    CHECK_ERR(ps_kvcache_truncate(&kv, a, 48, &err), &err, "truncate", "holds 47");
    /* 5. hooks during an append: a decode step fires q, k, ck (as windows complete), blocks, resid_post on its row
     * with ps_kvcache_event's position; the blocks = the whole forward's last row; zeroing the new row's hook_k in
     * layer 0 = a whole forward that zeroes the last row of hook_k (what a hook leaves is what the cache keeps) */
    {
        kv_tap tk = {.kv = &kv}, tb = {.kv = &kv}, tc = {.kv = &kv}, tr = {.kv = &kv};
        ps_hooks h;
        ps_hooks_init(&h);
        CHECK_OK(rt.family->hook_add(&rt, &h, "blocks.0.attn.hook_k", kv_tap_fn, &tk, &err) ||
                     rt.family->hook_add(&rt, &h, "blocks.1.attn.hook_blocks", kv_tap_fn, &tb, &err) ||
                     rt.family->hook_add(&rt, &h, "blocks.1.attn.hook_ck", kv_tap_fn, &tc, &err) ||
                     rt.family->hook_add(&rt, &h, "blocks.1.hook_resid_post", kv_tap_fn, &tr, &err),
                 &err);
        int hs = ps_kvcache_fork(&kv, fresh, &err); /* 47 tokens; the next one (position 47) completes window 10 */
        int64_t one = 1;
        CHECK_OK(hs < 0 || ps_kvcache_append(&kv, 1, &hs, &one, tok + 47, &h, lg, true, &err), &err);
        CHECK(tk.n == 1 && tk.shape[0] == 1 && tk.shape[1] == 1 && tk.shape[2] == Hk && tk.shape[3] == D && tk.t0 == 47 &&
                  tk.entry == -1,
              "hook_k on the step's row: %d firings, [%lld, %lld, %lld, %lld] at %lld", tk.n, (long long)tk.shape[0],
              (long long)tk.shape[1], (long long)tk.shape[2], (long long)tk.shape[3], (long long)tk.t0);
        CHECK(tc.n == 1 && tc.shape[1] == 1 && tc.entry == 10 && tr.n == 1 && tr.shape[2] == c->hidden_size,
              "hook_ck per completed window (%d firings, entry %lld), resid_post per row", tc.n, (long long)tc.entry);
        CHECK(tb.n == 1 && tb.shape[3] == ns, "hook_blocks [1, 1, Hkv, %lld]: %d firings", (long long)ns, tb.n);
        kv_tap wb = {0};
        ps_hooks hw;
        ps_hooks_init(&hw);
        CHECK_OK(ps_minicpm_hooks_add(&hw, c, "blocks.1.attn.hook_blocks", kv_tap_fn, &wb, &err), &err);
        float *w48 = logits_of(TINY, tok, 48, &hw);
        CHECK(wb.n == 1 && wb.nlast == tb.nlast && !memcmp(wb.last, tb.last, (size_t)tb.nlast * sizeof(float)),
              "the step's blocks = the whole forward's last row");
        CHECK(max_diff(lg, w48 + 47 * V, V) < tol, "a hooked step that only reads = the whole forward's row");
        free(w48);
        ps_hooks_free(&hw);
        /* zeroing the new row's keys in layer 0 */
        kv_tap zk = {.kv = &kv, .zero = 1}, zw = {.zero = 1};
        ps_hooks hz;
        ps_hooks_init(&hz);
        CHECK_OK(rt.family->hook_add(&rt, &hz, "blocks.0.attn.hook_k", kv_tap_fn, &zk, &err), &err);
        int zs = ps_kvcache_fork(&kv, fresh, &err);
        CHECK_OK(zs < 0 || ps_kvcache_append(&kv, 1, &zs, &one, tok + 47, &hz, lg2, true, &err), &err);
        ps_hooks_free(&hz);
        ps_hooks_init(&hz);
        CHECK_OK(ps_minicpm_hooks_add(&hz, c, "blocks.0.attn.hook_k", kv_tap_fn, &zw, &err), &err);
        float *z48 = logits_of(TINY, tok, 48, &hz);
        double wz = max_diff(lg2, z48 + 47 * V, V), moved = max_diff(lg2, lg, V);
        CHECK(wz < tol && moved > 1e-3 && moved > 100 * wz, "a zeroed hook_k row: decode vs whole forward %.3g, moved by %.3g", wz, moved);
        free(z48);
        ps_hooks_free(&hz);
        ps_hooks_free(&h);
    }
    /* an append of hooks registered for another model is refused */
    {
        ps_config oc = tu_config(PS_ATTN_FULL);
        ps_hooks ho;
        ps_hooks_init(&ho);
        kv_tap t = {0};
        CHECK_OK(ps_hooks_add(&ho, &oc, "blocks.0.attn.hook_k", kv_tap_fn, &t, &err), &err);
        int64_t one = 1;
        CHECK_ERR(ps_kvcache_append(&kv, 1, &fresh, &one, tok, &ho, NULL, true, &err), &err, "another model");
        ps_hooks_free(&ho);
    }
    ps_kvcache_free(&kv);
    free(ref), free(lg), free(lg2);
    ps_runtime_free(&rt);
}

int main(void) {
    snprintf(TINY, sizeof TINY, "%s/infllm/tiny", tu_conformance_dir());
    test_conformance();
    test_variants();
    test_bad_configs();
    test_edits();
    test_runtime();
    test_kvcache_ops();
    CHECK_DONE();
}
