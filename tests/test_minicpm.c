/* test_minicpm.c — MiniCPM4 checkpoints with InfLLM-v2 sparse attention (docs/minicpm.md): the conformance
 * vectors of tests/conformance/infllm/tiny (float64 from an independent implementation: logits, the compressed
 * keys, stage-1 and block scores per layer, the selections as sets, a 12-step greedy decode); variants written
 * here from the tiny checkpoint (f32 weights, a tied head, shards with an index, dense_len); every bad config
 * refused by key and file; the hook edits that change what is attended (hook_ck, hook_select_scores,
 * hook_blocks: the last against attention restricted to the set, computed here); and the family table
 * (ps_runtime_open picks it, point shapes, info). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "check.h"
#include "core/fileio.h"
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
            char rn[80];
            snprintf(rn, sizeof rn, "decode.step%lld.layer%d.topk_idx", (long long)s, l);
            double *ti = ref_get(&ref, rn, NULL);
            snprintf(rn, sizeof rn, "decode.step%lld.layer%d.block_scores", (long long)s, l);
            double *tb = ref_get(&ref, rn, NULL);
            snprintf(nm, sizeof nm, "blocks.%d.attn.hook_blocks", l);
            const ps_cache_item *ib = ps_cache_get(&cache, nm);
            snprintf(nm, sizeof nm, "blocks.%d.attn.hook_block_scores", l);
            const ps_cache_item *is = ps_cache_get(&cache, nm);
            if (ti && tb && ib && is) {
                same_sel &= set_mismatch(ib->data + (L - 1) * Hk * K, ti, 1, Hk, K) == 0;
                worst_bs = fmax(worst_bs, rel_ht(is->data + (L - 1) * Hk * nbL, tb, 1, Hk, nbL));
            } else
                same_sel = 0;
            free(ti), free(tb);
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
    free(seq), free(dt), free(dl), free(lg), free(tok), free(tokd);
    ps_st_close(&ref);
    ps_minicpm_model_free(&m);
}

int main(void) {
    snprintf(TINY, sizeof TINY, "%s/infllm/tiny", tu_conformance_dir());
    test_conformance();
    CHECK_DONE();
}
