/* test_v4_kvcache.c — DeepSeek-V4's KV cache (core/v4/v4_kvcache.h) against the whole-sequence
 * ps_v4_forward, on each conformance V4 checkpoint (tests/conformance/v4: mix4 with sliding, CSA and HCA
 * layers at rates 4 and 8, hash and score routing; hub3 with CSA layers).
 *
 * Property (seeded): a batch of sequences of different lengths (1 to 300 tokens) grown by appends of random
 * sizes (1 token, or chunks whose ends fall anywhere in a compression window; the cache's pieces of 5 rows
 * split them again) gives at every appended position the logits of the forward on the whole sequence at
 * that position, within TOL of max|ref| of the row. The forward is causal (query t reads raw j <= t and
 * entries w < (t + 1) / m), so one forward of the final sequence is the reference for every step. TOL:
 * SPEC-v4's 1e-4; the cache computes the same float32 formulas, the matrix products over fewer rows.
 * Plain reference for the contents: after every append the cache holds T / m entries per CSA/HCA layer and
 * each equals the forward's compressor.kv entry (and the indexer's keys its indexer.compressor.kv); during
 * the appends compressor.kv fires once per closing window with its index (ps_kvcache_event), and
 * indexer.topk selects, row by row, exactly the forward's entries in the forward's order.
 *
 * The same on variants of their configs: sliding windows of 1, 3 and 40, index_topk 1, 2 and 64.
 *
 * Also: fork (no page copied until a write) and truncate (with history; too far back is an error); the
 * cache as hook points (zeroing an entry, mean-replacing an indexer key: the forward with that entry
 * overwritten) with a steering hook during the appends; bytes per token against
 * ps_v4_kvcache_bytes_per_token (`phasescope info`), both models; one 1536-token run (mix4); bad inputs.
 *
 * On other backends (first; `--backends` runs only this): the same appends, fork, edits, truncate and hooks on
 * cpu-staged give the cpu's bits (logits, entries, what the hooks saw), on cuda (when present) the cpu's within
 * a tolerance; PS_REQUIRE_CUDA=1 fails without a device. The CUDA kernels' bodies on the host against the cpu's ops. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "core/cuda/kvcache_v4_bodies.h"
#include "core/generate.h"
#include "core/kvcache.h"
#include "core/ops.h"
#include "core/rng.h"
#include "core/v4/v4_forward.h"
#include "core/v4/v4_hooks.h"
#include "core/v4/v4_kvcache.h"
#include "core/v4/v4_model.h"
#include "testutil.h"

#define TOL 1e-4
#define MAXL 8

static double worst_logits = 0, worst_entries = 0;

/* ---- the reference forward, keeping what its hooks show ---- */

typedef struct {
    float *data;
    int64_t n, width; /* rows kept */
} kept;

typedef struct {
    kept ent[MAXL], ik[MAXL], topk[MAXL]; /* compressor.kv, indexer.compressor.kv, indexer.topk */
    float *logits;                        /* [T, V] */
    int64_t T;
} ref_run;

static int keep_cb(const ps_hook_event *ev, void *user, ps_error *err) {
    (void)err;
    kept *k = user;
    int64_t n = 1;
    for (int i = 0; i < ev->ndim; i++) n *= ev->shape[i];
    k->width = ev->shape[ev->ndim - 1];
    k->n = k->width ? n / k->width : 0;
    free(k->data);
    k->data = malloc((size_t)(n ? n : 1) * sizeof(float));
    memcpy(k->data, ev->data, (size_t)n * sizeof(float));
    return 0;
}

/* Edits the reference applies through hooks (the cache's edits, and a steering vector). */
typedef struct {
    int64_t row, width;
    const float *vec; /* NULL: zero */
} overwrite;

static int overwrite_cb(const ps_hook_event *ev, void *user, ps_error *err) {
    (void)err;
    const overwrite *o = user;
    int64_t rows = ev->shape[1];
    if (o->row < rows) {
        float *r = ev->data + o->row * o->width;
        for (int64_t i = 0; i < o->width; i++) r[i] = o->vec ? o->vec[i] : 0.0f;
    }
    return 0;
}

static int steer_cb(const ps_hook_event *ev, void *user, ps_error *err) {
    (void)err;
    const float *vec = user;
    int64_t D = ev->shape[2];
    for (int64_t r = 0; r < ev->shape[1]; r++)
        for (int64_t i = 0; i < D; i++) ev->data[r * D + i] += vec[i];
    return 0;
}

static void ref_free(ref_run *r) {
    for (int l = 0; l < MAXL; l++) free(r->ent[l].data), free(r->ik[l].data), free(r->topk[l].data);
    free(r->logits);
    memset(r, 0, sizeof *r);
}

/* The forward of tok [T] with `extra` hooks (may be NULL) added to the keeping ones. */
static int ref_forward(ps_v4_model *m, const int32_t *tok, int64_t T, ref_run *r,
                       void (*extra)(ps_hooks *h, const ps_v4_config *c, void *u), void *u) {
    const ps_v4_config *c = &m->cfg;
    ps_error err;
    ps_hooks h;
    ps_hooks_init(&h);
    memset(r, 0, sizeof *r);
    r->T = T;
    char nm[96];
    int rc = 0;
    for (int l = 0; l < c->n_layers && l < MAXL; l++) {
        if (c->attn_type[l] == PS_V4_SLIDING) continue;
        snprintf(nm, sizeof nm, "layers.%d.attn.compressor.kv", l);
        rc |= ps_v4_hooks_add(&h, c, nm, keep_cb, &r->ent[l], &err);
        if (c->attn_type[l] != PS_V4_CSA) continue;
        snprintf(nm, sizeof nm, "layers.%d.attn.indexer.compressor.kv", l);
        rc |= ps_v4_hooks_add(&h, c, nm, keep_cb, &r->ik[l], &err);
        snprintf(nm, sizeof nm, "layers.%d.attn.indexer.topk", l);
        rc |= ps_v4_hooks_add(&h, c, nm, keep_cb, &r->topk[l], &err);
    }
    if (extra) extra(&h, c, u);
    ps_v4_acts a;
    rc = rc || ps_v4_acts_create(&a, m, 1, T, &err);
    if (!rc) {
        rc = ps_v4_forward(m, &a, tok, &h, -1, &err);
        if (!rc) {
            r->logits = malloc((size_t)(T * c->vocab_size) * sizeof(float));
            memcpy(r->logits, a.logits, (size_t)(T * c->vocab_size) * sizeof(float));
        }
        ps_v4_acts_free(&a);
    }
    if (rc) fprintf(stderr, "reference forward: %s\n", err.msg);
    ps_hooks_free(&h);
    return rc;
}

/* ---- the cache's side ---- */

/* What fires during the appends: compressor.kv (counted, compared with the reference entry of its index)
 * and indexer.topk (compared row by row with the reference's). */
typedef struct {
    ps_kvcache *kv;
    ref_run *refs;     /* by sequence id */
    int layer, what;   /* what: 0 compressor.kv, 1 indexer.topk */
    int64_t fired[8];  /* by sequence id */
    int64_t bad;
    double worst;
} watch;

static int watch_cb(const ps_hook_event *ev, void *user, ps_error *err) {
    (void)err;
    watch *w = user;
    const ps_kv_event *e = ps_kvcache_event(w->kv);
    ref_run *r = &w->refs[e->seq];
    if (w->what == 0) {
        const kept *k = &r->ent[w->layer];
        if (e->entry != w->fired[e->seq] || e->entry >= k->n || ev->shape[1] != 1) {
            w->bad++;
            return 0;
        }
        double d = tu_row_rel(ev->data, k->data + e->entry * k->width, k->width);
        if (d > w->worst) w->worst = d;
        w->fired[e->seq]++;
        return 0;
    }
    const kept *k = &r->topk[w->layer];
    int64_t n = ev->shape[1], K = ev->shape[2];
    for (int64_t i = 0; i < n; i++) {
        int64_t t = e->t0 + i;
        const float *want = k->data + t * k->width, *got = ev->data + i * K;
        for (int64_t j = 0; j < k->width; j++) {
            float g = j < K ? got[j] : -1.0f;
            if (g != want[j]) w->bad++;
        }
    }
    w->fired[e->seq] += n;
    return 0;
}

/* Every entry and indexer key sequence s holds against the reference. */
static void check_entries(const char *label, ps_kvcache *kv, int s, const ps_v4_config *c, const ref_run *r) {
    ps_error err;
    float got[256];
    int64_t T = ps_kvcache_len(kv, s);
    for (int l = 0; l < c->n_layers; l++) {
        if (c->attn_type[l] == PS_V4_SLIDING) continue;
        int64_t n = ps_kvcache_n_entries(kv, s, l, 0), want = T / c->compress_rate[l];
        CHECK(n == want, "%s: layer %d holds %lld entries at T = %lld, expected %lld", label, l, (long long)n, (long long)T, (long long)want);
        for (int v = 0; v < (c->attn_type[l] == PS_V4_CSA ? 2 : 1); v++) {
            const kept *k = v ? &r->ik[l] : &r->ent[l];
            for (int64_t j = 0; j < n && j < k->n; j++) {
                if (ps_kvcache_entry(kv, s, l, 0, v, j, got, &err)) {
                    CHECK(0, "%s: %s", label, err.msg);
                    return;
                }
                double d = tu_row_rel(got, k->data + j * k->width, k->width);
                if (d > worst_entries) worst_entries = d;
                CHECK(d < TOL, "%s: layer %d %s entry %lld differs from the forward's by %.3g", label, l, v ? "indexer key" : "entry",
                      (long long)j, d);
            }
        }
    }
}

/* name: a conformance model, or a directory (a path with a '/') */
static int load(ps_v4_model *m, const char *name) {
    char dir[1024];
    ps_error err;
    if (strchr(name, '/')) snprintf(dir, sizeof dir, "%s", name);
    else snprintf(dir, sizeof dir, "%s/v4/%s", tu_conformance_dir(), name);
    if (ps_v4_model_load(m, dir, 0, &err)) {
        CHECK(0, "load %s: %s", name, err.msg);
        return -1;
    }
    return 0;
}

/* ---- the property ---- */

static void property(const char *name, uint64_t seed) {
    ps_v4_model m;
    if (load(&m, name)) return;
    const ps_v4_config *c = &m.cfg;
    int64_t V = c->vocab_size;
    ps_rng rng;
    ps_rng_seed(&rng, seed);
    enum { NS = 3 };
    int64_t Tf[NS] = {1 + (int64_t)(ps_rng_u64(&rng) % 40), 100 + (int64_t)(ps_rng_u64(&rng) % 100), 300};
    int32_t *tok[NS];
    ref_run ref[NS];
    for (int i = 0; i < NS; i++) {
        tok[i] = malloc((size_t)Tf[i] * sizeof(int32_t));
        tu_random_tokens(tok[i], Tf[i], V, seed * 31 + (uint64_t)i);
        if (ref_forward(&m, tok[i], Tf[i], &ref[i], NULL, NULL)) {
            CHECK(0, "%s: reference forward", name);
            return;
        }
    }
    ps_kvcache kv;
    ps_error err;
    ps_kvcache_opts o = {.chunk = 5};
    if (ps_v4_kvcache_create(&kv, &m, &o, &err)) {
        CHECK(0, "%s: create: %s", name, err.msg);
        return;
    }
    /* watches on every compressed layer's compressor.kv and every CSA layer's indexer.topk */
    ps_hooks h;
    ps_hooks_init(&h);
    watch w[2 * MAXL];
    int nw = 0;
    for (int l = 0; l < c->n_layers; l++)
        for (int what = 0; what < 2; what++) {
            if (c->attn_type[l] == PS_V4_SLIDING || (what == 1 && c->attn_type[l] != PS_V4_CSA)) continue;
            char nm[96];
            snprintf(nm, sizeof nm, what ? "layers.%d.attn.indexer.topk" : "layers.%d.attn.compressor.kv", l);
            w[nw] = (watch){.kv = &kv, .refs = ref, .layer = l, .what = what};
            CHECK_OK(ps_v4_hooks_add(&h, c, nm, watch_cb, &w[nw], &err), &err);
            nw++;
        }
    int ids[NS];
    for (int i = 0; i < NS; i++) ids[i] = ps_kvcache_add(&kv, &err);
    CHECK(ids[0] == 0 && ids[1] == 1 && ids[2] == 2, "%s: sequence ids 0, 1, 2", name);
    float *lg = malloc((size_t)(NS * 64 * V) * sizeof(float));
    int32_t *cat = malloc((size_t)(NS * 64) * sizeof(int32_t));
    double worst = 0;
    int steps = 0, ones = 0, mid = 0;
    for (;;) {
        int64_t n[NS], tot = 0, any = 0;
        for (int i = 0; i < NS; i++) {
            int64_t T = ps_kvcache_len(&kv, i), left = Tf[i] - T;
            uint64_t r = ps_rng_u64(&rng) % 4;
            n[i] = r == 0 ? 1 : r == 1 ? 0 : 2 + (int64_t)(ps_rng_u64(&rng) % 37);
            if (n[i] > left) n[i] = left;
            any |= left > 0;
        }
        if (!any) break;
        for (int i = 0; i < NS; i++) {
            memcpy(cat + tot, tok[i] + ps_kvcache_len(&kv, i), (size_t)n[i] * sizeof(int32_t));
            tot += n[i];
            ones += n[i] == 1;
            mid += n[i] > 1 && (ps_kvcache_len(&kv, i) + n[i]) % 4 != 0;
        }
        if (ps_kvcache_append(&kv, NS, ids, n, cat, &h, lg, false, &err)) {
            CHECK(0, "%s: append: %s", name, err.msg);
            break;
        }
        steps++;
        int64_t off = 0;
        for (int i = 0; i < NS; i++) {
            int64_t T = ps_kvcache_len(&kv, i);
            for (int64_t r = 0; r < n[i]; r++) {
                int64_t t = T - n[i] + r;
                double d = tu_row_rel(lg + (off + r) * V, ref[i].logits + t * V, V);
                if (d > worst) worst = d;
                CHECK(d < TOL, "%s: sequence %d position %lld: logits differ from the forward's by %.3g", name, i, (long long)t, d);
            }
            off += n[i];
            if (n[i]) check_entries(name, &kv, i, c, &ref[i]);
        }
    }
    if (worst > worst_logits) worst_logits = worst;
    for (int i = 0; i < nw; i++) {
        CHECK(w[i].bad == 0, "%s: layer %d %s: %lld firings disagree with the forward", name, w[i].layer,
              w[i].what ? "indexer.topk" : "compressor.kv", (long long)w[i].bad);
        for (int s = 0; s < NS; s++) {
            int64_t want = w[i].what ? Tf[s] : Tf[s] / c->compress_rate[w[i].layer];
            CHECK(w[i].fired[s] == want, "%s: layer %d %s fired %lld rows/entries for sequence %d, expected %lld", name, w[i].layer,
                  w[i].what ? "indexer.topk" : "compressor.kv", (long long)w[i].fired[s], s, (long long)want);
        }
        CHECK(w[i].worst < TOL, "%s: compressor.kv fired during appends differs by %.3g", name, w[i].worst);
    }
    printf("%s: %d appends (%d of 1 token, %d chunks ending inside a window), worst logits rel. error %.3g\n", name, steps, ones,
           mid, worst);
    ps_hooks_free(&h);
    ps_kvcache_free(&kv);
    free(lg);
    free(cat);
    for (int i = 0; i < NS; i++) free(tok[i]), ref_free(&ref[i]);
    ps_v4_model_free(&m);
}

/* A variant of a conformance model in a fresh directory: its weights (a link), its config with another
 * sliding window and index_topk (neither changes a tensor's shape). */
static void variant(char *dir, size_t n, const char *name, int64_t W, int64_t topk) {
    char src[1024], tmp[1100];
    tu_tempdir(dir, n, "v4kv");
    snprintf(src, sizeof src, "%s/v4/%s/config.json", tu_conformance_dir(), name);
    FILE *f = fopen(src, "rb");
    char *txt = calloc(1, 1 << 16);
    size_t len = f ? fread(txt, 1, (1 << 16) - 1, f) : 0;
    if (f) fclose(f);
    char *out = calloc(1, (size_t)len + 256), *o = out;
    for (const char *p = txt; *p;) {
        int64_t v = -1;
        const char *key = !strncmp(p, "\"sliding_window\":", 17) ? "sliding_window" : !strncmp(p, "\"index_topk\":", 13) ? "index_topk" : NULL;
        if (key) {
            v = strcmp(key, "sliding_window") ? topk : W;
            o += sprintf(o, "\"%s\": %lld", key, (long long)v);
            p = strchr(p, ':') + 1;
            while (*p == ' ' || (*p >= '0' && *p <= '9')) p++;
        } else
            *o++ = *p++;
    }
    snprintf(tmp, sizeof tmp, "%s/config.json", dir);
    f = fopen(tmp, "wb");
    if (f) fwrite(out, 1, strlen(out), f), fclose(f);
    snprintf(src, sizeof src, "%s/v4/%s/model.safetensors", tu_conformance_dir(), name);
    snprintf(tmp, sizeof tmp, "%s/model.safetensors", dir);
    CHECK(symlink(src, tmp) == 0, "link %s", tmp);
    free(txt);
    free(out);
}

/* ---- fork, truncate ---- */

static void compare_rows(const char *label, const float *lg, const ref_run *r, int64_t t0, int64_t n, int64_t V) {
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = tu_row_rel(lg + i * V, r->logits + (t0 + i) * V, V);
        worst = d > worst ? d : worst;
    }
    if (worst > worst_logits) worst_logits = worst;
    CHECK(worst < TOL, "%s: logits differ from the forward's by %.3g", label, worst);
}

static void fork_truncate(const char *name) {
    ps_v4_model m;
    if (load(&m, name)) return;
    const ps_v4_config *c = &m.cfg;
    int64_t V = c->vocab_size, P = 37, n1 = 20, n2 = 25;
    ps_error err;
    int32_t a[128], b[128];
    tu_random_tokens(a, P + n1, V, 501);
    memcpy(b, a, (size_t)P * sizeof(int32_t));
    tu_random_tokens(b + P, n2, V, 502);
    ref_run ra, rb;
    if (ref_forward(&m, a, P + n1, &ra, NULL, NULL) || ref_forward(&m, b, P + n2, &rb, NULL, NULL)) return;
    ps_kvcache kv;
    ps_kvcache_opts o = {.chunk = 16, .history = 64};
    if (ps_v4_kvcache_create(&kv, &m, &o, &err)) {
        CHECK(0, "%s", err.msg);
        return;
    }
    float *lg = malloc((size_t)(128 * V) * sizeof(float));
    int s0 = ps_kvcache_add(&kv, &err);
    int64_t np = P;
    CHECK_OK(ps_kvcache_append(&kv, 1, &s0, &np, a, NULL, lg, false, &err), &err);
    int64_t before = kv.page_bytes_live;
    int s1 = ps_kvcache_fork(&kv, s0, &err);
    CHECK(s1 >= 0 && kv.page_bytes_live == before, "%s: fork copies no page (%lld -> %lld bytes)", name, (long long)before,
          (long long)kv.page_bytes_live);
    int ids[2] = {s0, s1};
    int64_t nn[2] = {n1, n2};
    int32_t cat[64];
    memcpy(cat, a + P, (size_t)n1 * sizeof(int32_t));
    memcpy(cat + n1, b + P, (size_t)n2 * sizeof(int32_t));
    CHECK_OK(ps_kvcache_append(&kv, 2, ids, nn, cat, NULL, lg, false, &err), &err);
    compare_rows("fork: the source's continuation", lg, &ra, P, n1, V);
    compare_rows("fork: the fork's continuation", lg + n1 * V, &rb, P, n2, V);
    CHECK(kv.n_page_copies > 0, "%s: the writes after a fork copy shared pages", name);
    check_entries("fork", &kv, s1, c, &rb);
    /* truncate the fork back to 40 (inside a window): its entries are b's */
    CHECK_OK(ps_kvcache_truncate(&kv, s1, 40, &err), &err);
    check_entries("truncate", &kv, s1, c, &rb);
    /* then back to P - 3 (inside the shared prefix) and regrown as sequence a: a's logits */
    CHECK_OK(ps_kvcache_truncate(&kv, s1, P - 3, &err), &err);
    int64_t nr = P + n1 - (P - 3);
    memcpy(cat, a + P - 3, (size_t)nr * sizeof(int32_t));
    CHECK_OK(ps_kvcache_append(&kv, 1, &s1, &nr, cat, NULL, lg, false, &err), &err);
    compare_rows("truncate and regrow", lg, &ra, P - 3, nr, V);
    check_entries("truncate and regrow", &kv, s1, c, &ra);
    ps_kvcache_drop(&kv, s1);
    ps_kvcache_drop(&kv, s0);
    CHECK(kv.page_bytes_live == 0, "%s: dropping every sequence frees every page (%lld bytes left)", name, (long long)kv.page_bytes_live);
    ps_kvcache_free(&kv);
    /* without history: the sliding rows are gone */
    o.history = 0;
    CHECK_OK(ps_v4_kvcache_create(&kv, &m, &o, &err), &err);
    s0 = ps_kvcache_add(&kv, &err);
    int64_t n100 = 100;
    int32_t t100[100];
    tu_random_tokens(t100, 100, V, 9);
    CHECK_OK(ps_kvcache_append(&kv, 1, &s0, &n100, t100, NULL, NULL, false, &err), &err);
    CHECK_ERR(ps_kvcache_truncate(&kv, s0, 20, &err), &err, "no longer holds", "history");
    CHECK_ERR(ps_kvcache_truncate(&kv, s0, 101, &err), &err, "must be in [0, 100]");
    free(lg);
    ps_kvcache_free(&kv);
    ref_free(&ra);
    ref_free(&rb);
    ps_v4_model_free(&m);
}

/* ---- the cache as hook points, and a hook acting during the appends ---- */

typedef struct {
    int n;                 /* entries overwritten: (layer, value, j) */
    int layer[3], value[3];
    int64_t j[3];
    const float *key, *steer;
    overwrite o[3];
} edit_setup;

static void edit_hooks(ps_hooks *h, const ps_v4_config *c, void *u) {
    edit_setup *e = u;
    ps_error err;
    char nm[96];
    for (int i = 0; i < e->n; i++) {
        e->o[i] = (overwrite){.row = e->j[i], .width = e->value[i] ? c->index_head_dim : c->head_dim, .vec = e->value[i] ? e->key : NULL};
        snprintf(nm, sizeof nm, e->value[i] ? "layers.%d.attn.indexer.compressor.kv" : "layers.%d.attn.compressor.kv", e->layer[i]);
        CHECK_OK(ps_v4_hooks_add(h, c, nm, overwrite_cb, &e->o[i], &err), &err);
    }
    CHECK_OK(ps_v4_hooks_add(h, c, "layers.0.ffn_in", steer_cb, (void *)e->steer, &err), &err);
}

/* A hook that fails at its n-th firing (an error inside an append). */
static int fail_cb(const ps_hook_event *ev, void *user, ps_error *err) {
    (void)ev;
    int *left = user;
    return --*left == 0 ? ps_fail(err, "stopped by the test") : 0;
}

static void steer_only(ps_hooks *h, const ps_v4_config *c, void *u) {
    ps_error err;
    CHECK_OK(ps_v4_hooks_add(h, c, "layers.0.ffn_in", steer_cb, u, &err), &err);
}

static void edits(void) {
    ps_v4_model m;
    if (load(&m, "mix4")) return; /* layers 1, 3 CSA (rate 4), 2 HCA (rate 8) */
    const ps_v4_config *c = &m.cfg;
    int64_t V = c->vocab_size, T0 = 41, T1 = 70;
    ps_error err;
    int32_t tok[70];
    tu_random_tokens(tok, T1, V, 77);
    float key[64], steer[64];
    ps_rng rng;
    ps_rng_seed(&rng, 5);
    for (int i = 0; i < 64; i++) key[i] = (float)(ps_rng_u64(&rng) % 1000) / 500.0f - 1.0f, steer[i] = 0.05f * (float)(i % 7) - 0.1f;
    /* the edits of the decode below are on the last layer (3, CSA, rate 4): the positions before them, which
     * the cache ran unedited, feed no later layer */
    edit_setup e = {.n = 2, .layer = {3, 3, 2}, .value = {0, 1, 0}, .j = {3, 2, 3}, .key = key, .steer = steer}, e3 = e;
    e3.n = 3;
    ref_run r, r3;
    if (ref_forward(&m, tok, T1, &r, edit_hooks, &e) || ref_forward(&m, tok, T1, &r3, edit_hooks, &e3)) return;
    ps_kvcache kv;
    CHECK_OK(ps_v4_kvcache_create(&kv, &m, NULL, &err), &err);
    ps_hooks h;
    ps_hooks_init(&h);
    steer_only(&h, c, steer);
    int s = ps_kvcache_add(&kv, &err);
    float *lg = malloc((size_t)(T1 * V) * sizeof(float));
    CHECK_OK(ps_kvcache_append(&kv, 1, &s, &T0, tok, &h, lg, false, &err), &err);
    /* layer 3 holds entries 0..9: zero entry 3, set indexer key 2 to `key` (mean replacement with a mean given) */
    float got[64], zero[64] = {0};
    CHECK_OK(ps_kvcache_edit(&kv, -1, 3, 0, 0, 3, PS_KV_EDIT_ZERO, NULL, &err), &err);
    CHECK_OK(ps_kvcache_edit(&kv, -1, 3, 0, 1, 2, PS_KV_EDIT_SET, key, &err), &err);
    CHECK_OK(ps_kvcache_entry(&kv, s, 3, 0, 0, 3, got, &err), &err);
    CHECK(!memcmp(got, zero, (size_t)c->head_dim * sizeof(float)), "the zeroed entry reads back as zeros");
    CHECK_OK(ps_kvcache_entry(&kv, s, 3, 0, 1, 2, got, &err), &err);
    CHECK(!memcmp(got, key, (size_t)c->index_head_dim * sizeof(float)), "the replaced indexer key reads back");
    /* then one token at a time: the forward with both overwritten from the start */
    for (int64_t t = T0; t < T1; t++) {
        int64_t one = 1;
        CHECK_OK(ps_kvcache_append(&kv, 1, &s, &one, tok + t, &h, lg + t * V, false, &err), &err);
    }
    compare_rows("edits: decode after zeroing an entry and replacing an indexer key", lg + T0 * V, &r, T0, T1 - T0, V);
    /* an edit of an entry that does not exist yet applies when its window closes: a sequence added after a
     * third edit (layer 2, HCA, entry 3) is the forward with all three */
    CHECK_OK(ps_kvcache_edit(&kv, -1, 2, 0, 0, 3, PS_KV_EDIT_ZERO, NULL, &err), &err);
    int s2 = ps_kvcache_add(&kv, &err);
    CHECK_OK(ps_kvcache_append(&kv, 1, &s2, &T1, tok, &h, lg, false, &err), &err);
    compare_rows("edits: a sequence added after the edits", lg, &r3, 0, T1, V);
    int64_t d3 = 0;
    for (int64_t i = 0; i < T1 * V; i++) d3 += r3.logits[i] != r.logits[i];
    CHECK(d3 > 0, "the HCA edit changes the forward's logits (else the check above cannot fail)");
    /* a hook failing in the third piece of an append: the append fails, the sequence keeps its first two
     * pieces (what was appended before the failing one) and goes on from there as the forward */
    ps_kvcache k2;
    ps_kvcache_opts o8 = {.chunk = 8};
    CHECK_OK(ps_v4_kvcache_create(&k2, &m, &o8, &err), &err);
    ps_hooks hf;
    ps_hooks_init(&hf);
    int left = 3;
    steer_only(&hf, c, steer);
    CHECK_OK(ps_v4_hooks_add(&hf, c, "layers.2.attn.q", fail_cb, &left, &err), &err);
    int s3 = ps_kvcache_add(&k2, &err);
    int64_t n30 = 30;
    CHECK_ERR(ps_kvcache_append(&k2, 1, &s3, &n30, tok, &hf, lg, false, &err), &err, "stopped by the test", "layer 2");
    CHECK(ps_kvcache_len(&k2, s3) == 16, "after the failure the sequence holds its first two pieces (%lld tokens)",
          (long long)ps_kvcache_len(&k2, s3));
    int64_t rest = T1 - 16;
    CHECK_OK(ps_kvcache_append(&k2, 1, &s3, &rest, tok + 16, &h, lg, false, &err), &err);
    ref_run rs;
    if (!ref_forward(&m, tok, T1, &rs, edit_hooks, &(edit_setup){.n = 0, .steer = steer})) {
        compare_rows("after a failed append", lg, &rs, 16, rest, V);
        check_entries("after a failed append", &k2, s3, c, &rs);
        ref_free(&rs);
    }
    ps_hooks_free(&hf);
    ps_kvcache_free(&k2);
    /* errors */
    int l0, v0;
    CHECK_ERR(ps_kvcache_edit(&kv, -1, 0, 0, 0, 1, PS_KV_EDIT_ZERO, NULL, &err), &err, "sliding-window layer");
    CHECK_ERR(ps_kvcache_edit(&kv, -1, 2, 0, 1, 1, PS_KV_EDIT_ZERO, NULL, &err), &err, "not a CSA layer");
    CHECK_ERR(ps_kvcache_entry(&kv, s, 1, 0, 0, 99, got, &err), &err, "not 99");
    int n_ed = kv.n_edits;
    CHECK_ERR(ps_kvcache_edit(&kv, -1, 3, 0, 1, -2, PS_KV_EDIT_ZERO, NULL, &err), &err, "layers.3.attn.cache_ik: entry -2 must be >= 0");
    CHECK_ERR(ps_kvcache_edit(&kv, -1, 3, 0, 0, 1, PS_KV_EDIT_SET, NULL, &err), &err, "SET needs a vector of");
    CHECK_ERR(ps_kvcache_edit(&kv, 99, 3, 0, 0, 1, PS_KV_EDIT_ZERO, NULL, &err), &err, "no sequence 99");
    CHECK(kv.n_edits == n_ed, "refused edits are not recorded (%d, was %d)", kv.n_edits, n_ed);
    CHECK_OK(ps_v4_kvcache_point_parse(c, "layers.3.attn.cache_ik", &l0, &v0, &err), &err);
    CHECK(l0 == 3 && v0 == 1, "cache_ik parses to layer 3, value 1");
    CHECK_ERR(ps_v4_kvcache_point_parse(c, "layers.2.attn.cache_ik", &l0, &v0, &err), &err, "no indexer");
    CHECK_ERR(ps_v4_kvcache_point_parse(c, "blocks.1.attn.cache_ck", &l0, &v0, &err), &err, "cache_kv");
    /* bad inputs */
    ps_hooks hp;
    ps_hooks_init(&hp);
    CHECK_OK(ps_v4_hooks_add(&hp, c, "layers.1.attn.pattern", steer_cb, NULL, &err), &err);
    int64_t one = 1;
    int32_t bad = (int32_t)V;
    CHECK_ERR(ps_kvcache_append(&kv, 1, &s, &one, tok, &hp, NULL, false, &err), &err, "layers.1.attn.pattern", "not available");
    CHECK_ERR(ps_kvcache_append(&kv, 1, &s, &one, &bad, NULL, NULL, false, &err), &err, "outside the vocabulary");
    int twice[2] = {s, s};
    int64_t nn[2] = {1, 1};
    CHECK_ERR(ps_kvcache_append(&kv, 2, twice, nn, tok, NULL, NULL, false, &err), &err, "given twice");
    ps_hooks_free(&hp);
    ps_hooks_free(&h);
    free(lg);
    ps_kvcache_free(&kv);
    ref_free(&r);
    ref_free(&r3);
    ps_v4_model_free(&m);
}

/* ---- bytes per token, and a longer run ---- */

static void bytes_and_long(const char *name, int64_t Tlong) {
    ps_v4_model m;
    if (load(&m, name)) return;
    const ps_v4_config *c = &m.cfg;
    int64_t V = c->vocab_size, T1 = 512, T2 = 1536;
    ps_error err;
    int32_t *tok = malloc((size_t)T2 * sizeof(int32_t));
    tu_random_tokens(tok, T2, V, 4242);
    ps_kvcache kv;
    ps_kvcache_opts o = {.chunk = 256};
    CHECK_OK(ps_v4_kvcache_create(&kv, &m, &o, &err), &err);
    int s = ps_kvcache_add(&kv, &err);
    int64_t n1 = T1, n2 = T2 - T1;
    CHECK_OK(ps_kvcache_append(&kv, 1, &s, &n1, tok, NULL, NULL, false, &err), &err);
    int64_t b1 = ps_kvcache_bytes(&kv);
    CHECK_OK(ps_kvcache_append(&kv, 1, &s, &n2, tok + T1, NULL, NULL, false, &err), &err);
    int64_t b2 = ps_kvcache_bytes(&kv);
    double slope = (double)(b2 - b1) / (double)(T2 - T1), want = ps_v4_kvcache_bytes_per_token(c);
    double fixed = (double)b2 - want * (double)T2, wfixed = ps_v4_kvcache_fixed_bytes(c);
    printf("%s: cache bytes per token %.2f measured (T %lld -> %lld), %.2f stated; at T = %lld: %lld bytes, fixed part %.0f "
           "(stated %.0f before page rounding)\n",
           name, slope, (long long)T1, (long long)T2, want, (long long)T2, (long long)b2, fixed, wfixed);
    CHECK(fabs(slope - want) <= 0.05 * want, "%s: %.2f bytes per token measured, %.2f stated", name, slope, want);
    double stated = want * (double)T2 + wfixed;
    CHECK(fabs((double)b2 - stated) <= 0.05 * stated, "%s: %lld bytes held at T = %lld, %.0f stated (per token x T + fixed)", name,
          (long long)b2, (long long)T2, stated);
    ps_kvcache_free(&kv);
    /* one longer run: a prefill of Tlong - 8 tokens in pieces of 256, then 8 decode steps */
    ref_run r;
    if (Tlong > 0 && !ref_forward(&m, tok, Tlong, &r, NULL, NULL)) {
        CHECK_OK(ps_v4_kvcache_create(&kv, &m, &o, &err), &err);
        s = ps_kvcache_add(&kv, &err);
        float *lg = malloc((size_t)(Tlong * V) * sizeof(float));
        int64_t np = Tlong - 8;
        CHECK_OK(ps_kvcache_append(&kv, 1, &s, &np, tok, NULL, lg, false, &err), &err);
        for (int64_t t = np; t < Tlong; t++) {
            int64_t one = 1;
            CHECK_OK(ps_kvcache_append(&kv, 1, &s, &one, tok + t, NULL, lg + t * V, false, &err), &err);
        }
        compare_rows("a long run", lg, &r, 0, Tlong, V);
        check_entries("a long run", &kv, s, c, &r);
        free(lg);
        ps_kvcache_free(&kv);
        ref_free(&r);
    }
    free(tok);
    ps_v4_model_free(&m);
}

/* ---- the cache on another backend against the cpu ---- */

/* A callback on a compressor's gate: sums what it sees (weighted by the index) and halves slot 0's gates (an
 * edit in place: on a device context the hooks module copies the point to the host and back). */
static int on_gate(const ps_hook_event *ev, void *user, ps_error *err) {
    (void)err;
    double *sum = user;
    int64_t n = ev->shape[0] * ev->shape[1] * ev->shape[2] * ev->shape[3], d = ev->shape[3];
    for (int64_t i = 0; i < n; i++)
        if (isfinite(ev->data[i])) *sum += ev->data[i] * (double)(i + 1); /* (a slot without a token: -inf) */
    for (int64_t i = 0; i < d; i++) ev->data[i] *= 0.5f;
    return 0;
}

/* A callback on indexer.topk: sums the indices it sees and empties each row's last slot (-1: a selection the
 * cache then checks on the host, a copy on a device). */
static int on_topk(const ps_hook_event *ev, void *user, ps_error *err) {
    (void)err;
    double *sum = user;
    int64_t n = ev->shape[1], K = ev->shape[2];
    for (int64_t i = 0; i < n * K; i++) *sum += ev->data[i] * (double)(i % 7 + 1);
    if (K > 1)
        for (int64_t r = 0; r < n; r++) ev->data[r * K + K - 1] = -1.0f;
    return 0;
}

/* One run of the staged comparison on model m (on its backend): two sequences grown by seeded appends (single
 * tokens and chunks of up to 40 rows, pieces of 16), a fork half way, then edits (entry 1 of the first
 * compressed layer zeroed everywhere, indexer key 3 of the last CSA layer set in the fork), a truncate of the
 * fork by 3 tokens (history) and its regrowth; hooks: an action zeroing head 1 of the last layer's attn.q, a
 * callback halving gates of the first compressed layer's compressor, one emptying the last top-k slot of the
 * first CSA layer. The logits of every appended position into lg, every entry and indexer key held at the end
 * into ent, what the callbacks summed into sums[2]. Returns the floats written to lg. */
static int64_t staged_run(ps_v4_model *m, const int32_t *tok, int64_t T, float *lg, float *ent, int64_t *n_ent, double *sums) {
    const ps_v4_config *c = &m->cfg;
    ps_error err;
    ps_kvcache kv;
    ps_kvcache_opts o = {.chunk = 16, .history = 8};
    int64_t V = c->vocab_size, out = 0, ne = 0;
    if (ps_v4_kvcache_create(&kv, m, &o, &err)) {
        CHECK_OK(-1, &err);
        return 0;
    }
    int first_comp = -1, first_csa = -1, last_csa = -1;
    for (int l = 0; l < c->n_layers; l++) {
        if (c->attn_type[l] != PS_V4_SLIDING && first_comp < 0) first_comp = l;
        if (c->attn_type[l] == PS_V4_CSA) last_csa = l, first_csa = first_csa < 0 ? l : first_csa;
    }
    ps_hooks h;
    ps_hooks_init(&h);
    char nm[96];
    ps_hook_action zero = {.kind = PS_ACT_ZERO, .head = 1};
    snprintf(nm, sizeof nm, "layers.%lld.attn.q", (long long)c->n_layers - 1);
    CHECK_OK(ps_v4_hooks_add_action(&h, c, nm, &zero, &err), &err);
    snprintf(nm, sizeof nm, "layers.%d.attn.compressor.gate", first_comp);
    CHECK_OK(ps_v4_hooks_add(&h, c, nm, on_gate, &sums[0], &err), &err);
    snprintf(nm, sizeof nm, "layers.%d.attn.indexer.topk", first_csa);
    CHECK_OK(ps_v4_hooks_add(&h, c, nm, on_topk, &sums[1], &err), &err);
    int ids[2] = {ps_kvcache_add(&kv, &err), -1};
    ps_rng g;
    ps_rng_seed(&g, 99);
    int64_t done[2] = {0, 0};
    int cut = 0;
    float vec[64];
    for (int64_t e = 0; e < 64; e++) vec[e] = 0.1f * (float)(e + 1);
    while (done[0] < T) {
        if (ids[1] < 0 && done[0] >= T / 2) { /* fork; then edits */
            ids[1] = ps_kvcache_fork(&kv, ids[0], &err);
            done[1] = done[0];
            CHECK_OK(ps_kvcache_edit(&kv, -1, first_comp, 0, 0, 1, PS_KV_EDIT_ZERO, NULL, &err), &err);
            CHECK_OK(ps_kvcache_edit(&kv, ids[1], last_csa, 0, 1, 3, PS_KV_EDIT_SET, vec, &err), &err);
        } else if (ids[1] >= 0 && !cut && done[1] >= T / 2 + 20) { /* the fork back by 3 tokens */
            done[1] -= 3;
            CHECK_OK(ps_kvcache_truncate(&kv, ids[1], done[1], &err), &err);
            cut = 1;
        }
        int nseq = ids[1] < 0 ? 1 : 2;
        int64_t n[2], off = 0;
        int32_t buf[100];
        for (int i = 0; i < nseq; i++) {
            int64_t k = ps_rng_u64(&g) % 3 ? 1 : 1 + (int64_t)(ps_rng_u64(&g) % 40);
            if (k > T - done[i]) k = T - done[i];
            n[i] = k;
            for (int64_t t = 0; t < k; t++) buf[off + t] = tok[(done[i] + t + (int64_t)i * 7) % T];
            off += k;
        }
        if (nseq == 2 && n[1] == 0) nseq = 1;
        if (ps_kvcache_append(&kv, nseq, ids, n, buf, &h, lg + out, false, &err)) {
            CHECK_OK(-1, &err);
            break;
        }
        out += off * V;
        for (int i = 0; i < nseq; i++) done[i] += n[i];
    }
    for (int i = 0; i < 2; i++)
        for (int l = 0; l < c->n_layers; l++) {
            if (c->attn_type[l] == PS_V4_SLIDING) continue;
            for (int v = 0; v < (c->attn_type[l] == PS_V4_CSA ? 2 : 1); v++)
                for (int64_t j = 0; j < ps_kvcache_n_entries(&kv, ids[i], l, 0); j++, ne += ps_kvcache_entry_width(&kv, l, v))
                    CHECK_OK(ps_kvcache_entry(&kv, ids[i], l, 0, v, j, ent + ne, &err), &err);
        }
    *n_ent = ne;
    ps_hooks_free(&h);
    ps_kvcache_free(&kv);
    return out;
}

/* ps_generate (core/generate.c: the CLI's and the API's generate) on model m: 3 prompts of 37, 15 and 4 tokens,
 * 6 tokens each (tu_generate_rows: sampled with a seed); a mean edit of the first compressed layer's entry 0 and a zero edit of
 * the last CSA layer's indexer key 1 (so the prompts' last tokens run after the edits). Tokens and
 * log-probabilities written out. */
static int staged_generate(ps_v4_model *m, const int32_t *tok, int32_t *out_tok, double *out_lp) {
    const ps_v4_config *c = &m->cfg;
    ps_error err;
    ps_kvcache kv;
    if (ps_v4_kvcache_create(&kv, m, NULL, &err)) {
        CHECK_OK(-1, &err);
        return -1;
    }
    int first_comp = -1, last_csa = -1;
    for (int l = 0; l < c->n_layers; l++) {
        if (c->attn_type[l] != PS_V4_SLIDING && first_comp < 0) first_comp = l;
        if (c->attn_type[l] == PS_V4_CSA) last_csa = l;
    }
    int32_t *pr[3] = {(int32_t *)tok, (int32_t *)tok + 50, (int32_t *)tok + 100};
    int64_t len[3] = {37, 15, 4};
    ps_generate_edit ed[2] = {{.layer = first_comp, .head = 0, .value = 0, .entry = 0, .mean = 1},
                              {.layer = last_csa, .head = 0, .value = 1, .entry = 1}};
    int rc = tu_generate_rows(&kv, pr, len, ed, last_csa >= 0 ? 2 : 1, NULL, out_tok, out_lp, &err);
    CHECK_OK(rc, &err);
    ps_kvcache_free(&kv);
    return rc;
}

/* The cache on backend `name` against the cpu backend, the same appends, fork, edits, truncate and hooks
 * (staged_run), on mix4 (sliding, CSA and HCA layers) and hub3. On the test backend cpu-staged — the cpu's
 * ops and memory behind a context that says its buffers are not host-visible, so every page write, op over
 * the page tables, hook and read takes the device path — every appended position's logits, every entry and
 * indexer key held, and what the callbacks saw are the cpu's bits. On a device (cuda) they agree within
 * 1e-3 (logits per row; a top-k selection could flip where two scores lie within rounding). Returns 0 when
 * the backend cannot be opened here. */
static int test_backend_cache(const char *name) {
    const char *models[] = {"mix4", "hub3"};
    int exact = !strcmp(name, "cpu-staged");
    double tol = 1e-3;
    ps_error err;
    ps_ctx *probe;
    if (ps_ctx_create(&probe, name, &err)) {
        printf("  %s: not tested (%s)\n", name, err.msg);
        return 0;
    }
    ps_ctx_free(probe);
    for (int k = 0; k < 2; k++) {
        ps_v4_model m[2];
        if (load(&m[0], models[k])) return 1;
        if (load(&m[1], models[k])) {
            ps_v4_model_free(&m[0]);
            return 1;
        }
        if (ps_v4_model_to_backend(&m[1], name, &err)) {
            CHECK_OK(-1, &err);
            ps_v4_model_free(&m[0]), ps_v4_model_free(&m[1]);
            return 1;
        }
        const ps_v4_config *c = &m[0].cfg;
        int64_t T = 180, V = c->vocab_size, nl[2], ne[2], cap_ent = 2 * c->n_layers * 2 * T * 64 + 1;
        int32_t tok[180];
        tu_random_tokens(tok, T, V, 57 + (uint64_t)k);
        float *lg[2], *ent[2];
        double sums[2][2] = {{0, 0}, {0, 0}};
        for (int b = 0; b < 2; b++) {
            lg[b] = calloc((size_t)(2 * T * V), sizeof(float));
            ent[b] = calloc((size_t)cap_ent, sizeof(float));
            nl[b] = staged_run(&m[b], tok, T, lg[b], ent[b], &ne[b], sums[b]);
        }
        CHECK(nl[0] == nl[1] && nl[0] > T * V, "%s %s: %lld and %lld logits", name, models[k], (long long)nl[0], (long long)nl[1]);
        CHECK(ne[0] == ne[1] && ne[0] > 0, "%s %s: %lld and %lld entry floats", name, models[k], (long long)ne[0], (long long)ne[1]);
        double dl = nl[0] == nl[1] ? tu_rows_rel(lg[1], lg[0], nl[0] / V, V) : INFINITY;
        double de = ne[0] == ne[1] ? tu_row_rel(ent[1], ent[0], ne[0]) : INFINITY;
        double dg = fabs(sums[1][0] - sums[0][0]) / fmax(fabs(sums[0][0]), 1e-30);
        CHECK(sums[0][0] != 0 && sums[0][1] != 0, "%s %s: the callbacks fired (%g, %g)", name, models[k], sums[0][0], sums[0][1]);
        if (exact) {
            CHECK(nl[0] == nl[1] && memcmp(lg[0], lg[1], (size_t)nl[0] * sizeof(float)) == 0, "%s %s: logits differ from the cpu's (%.3g)",
                  name, models[k], dl);
            CHECK(ne[0] == ne[1] && memcmp(ent[0], ent[1], (size_t)ne[0] * sizeof(float)) == 0,
                  "%s %s: entries differ from the cpu's (%.3g)", name, models[k], de);
            CHECK(sums[0][0] == sums[1][0] && sums[0][1] == sums[1][1], "%s %s: the hooks saw other values (%.17g %.17g vs %.17g %.17g)",
                  name, models[k], sums[1][0], sums[1][1], sums[0][0], sums[0][1]);
        } else {
            CHECK(dl < tol && de < tol && dg < tol, "%s %s: logits %.3g, entries %.3g, the gate hook's sum %.3g from the cpu's (tolerance %.0e)",
                  name, models[k], dl, de, dg, tol);
        }
        printf("  %s %s against the cpu%s: %lld logit rows (%.3g), %lld entry floats (%.3g), gate hook %.3g, top-k hook %s\n", name,
               models[k], exact ? ", bit for bit" : "", (long long)(nl[0] / V), dl, (long long)ne[0], de, dg,
               sums[0][1] == sums[1][1] ? "the same" : "differs");
        /* generation (sampled, a mean and a zero edit) through the two models' caches */
        int32_t gt[2][18];
        double glp[2][18], wl = 0;
        int gr0 = staged_generate(&m[0], tok, gt[0], glp[0]), gr1 = staged_generate(&m[1], tok, gt[1], glp[1]);
        int same_tok = !memcmp(gt[0], gt[1], sizeof gt[0]);
        for (int i = 0; i < 18; i++) wl = fmax(wl, fabs(glp[0][i] - glp[1][i]));
        if (exact)
            CHECK(!gr0 && !gr1 && same_tok && !memcmp(glp[0], glp[1], sizeof glp[0]), "%s %s: generate differs from the cpu's (tokens %s, %.3g)",
                  name, models[k], same_tok ? "equal" : "differ", wl);
        else /* a sampled token may flip where the draw falls within rounding of a boundary: said, not failed */
            CHECK(!gr0 && !gr1 && (!same_tok || wl < tol), "%s %s: generate's log-probabilities %.3g from the cpu's", name, models[k], wl);
        printf("  %s %s generate against the cpu: tokens %s, log-probabilities %.3g\n", name, models[k],
               same_tok ? "equal" : "DIFFER (a sampled flip?)", wl);
        for (int b = 0; b < 2; b++) free(lg[b]), free(ent[b]), ps_v4_model_free(&m[b]);
    }
    return 1;
}

/* cpu-staged always; cuda when the build has it and a device is present — a failure when the run asks for
 * it (PS_REQUIRE_CUDA=1: scripts/gpu_check.sh) */
static void test_backends(void) {
    printf("the DeepSeek-V4 cache on other backends:\n");
    test_backend_cache("cpu-staged");
    int cuda = test_backend_cache("cuda");
    const char *req = getenv("PS_REQUIRE_CUDA");
    CHECK(cuda || !req || !*req || !strcmp(req, "0"), "PS_REQUIRE_CUDA is set and the DeepSeek-V4 KV cache could not be tested on cuda");
}

/* The CUDA kernels' bodies (core/cuda/kvcache_v4_bodies.h) checked without a GPU: run on the host over the
 * kernels' index spaces (one call per query row and head, per channel) with host page tables, against the cpu
 * backend's ops on the same pages — the same bits (the bodies follow the CPU's order of operations). A
 * sliding layer's piece, an HCA layer's (head dim 32, 20 rows), a CSA layer's with empty top-k slots and an
 * index past the entries held; the gates of an HCA window, a CSA window and CSA's first window. */
static void test_cuda_bodies(void) {
    ps_ctx *c;
    ps_error err;
    if (ps_ctx_create(&c, "cpu", &err)) {
        CHECK(0, "%s", err.msg);
        return;
    }
    ps_rng g;
    ps_rng_seed(&g, 31);
    static const struct {
        int64_t H, Dh, W, m, K, t0, n, kbase;
    } S[3] = {{2, 8, 5, 0, 0, 70, 3, 64}, {3, 32, 9, 4, 0, 41, 20, 32}, {2, 16, 6, 4, 3, 50, 6, 40}};
    int64_t checked = 0;
    for (int s = 0; s < 3; s++) {
        int64_t H = S[s].H, Dh = S[s].Dh, n = S[s].n, t1 = S[s].t0 + n, K = S[s].K, pr = 8, pe = 5;
        ps_v4_kv_attn a = {.H = H, .Dh = Dh, .W = S[s].W, .m = S[s].m, .K = K, .t0 = S[s].t0, .n = n,
                           .scale = (float)(1.0 / sqrt((double)Dh))};
        int64_t nkp = (t1 - S[s].kbase + pr - 1) / pr, ne = a.m > 0 ? t1 / a.m : 0, nep = (ne + pe - 1) / pe;
        float *kt[16] = {0}, *et[8] = {0};
        for (int64_t i = 0; i < nkp; i++) {
            kt[i] = malloc((size_t)(pr * Dh) * sizeof(float));
            for (int64_t j = 0; j < pr * Dh; j++) kt[i][j] = (float)ps_rng_normal(&g);
        }
        for (int64_t i = 0; i < nep; i++) {
            et[i] = malloc((size_t)(pe * Dh) * sizeof(float));
            for (int64_t j = 0; j < pe * Dh; j++) et[i][j] = (float)ps_rng_normal(&g);
        }
        a.kv = (ps_kv_pages){.page = kt, .base = S[s].kbase, .rows = t1, .width = Dh, .page_rows = pr};
        a.nE = ne;
        if (ne) a.ent = (ps_kv_pages){.page = et, .base = 0, .rows = ne, .width = Dh, .page_rows = pe};
        float topk[32], sink[4], *q = malloc((size_t)(n * H * Dh) * sizeof(float));
        for (int64_t r = 0; r < n * K; r++) {
            int64_t row = r / K, i = r % K, vis = (S[s].t0 + row + 1) / a.m;
            topk[r] = i == 0 ? (float)(vis - 1 - row % 3) : i == 1 ? (row % 2 ? -1.0f : (float)(row % 5)) : (float)(row == 2 ? ne : 5 + row % 3);
        }
        for (int64_t h = 0; h < H; h++) sink[h] = (float)ps_rng_normal(&g);
        for (int64_t i = 0; i < n * H * Dh; i++) q[i] = (float)ps_rng_normal(&g);
        float *o1 = calloc((size_t)(n * H * Dh), sizeof(float)), *o2 = calloc((size_t)(n * H * Dh), sizeof(float));
        float *s1 = calloc((size_t)(n * H), sizeof(float)), *s2 = calloc((size_t)(n * H), sizeof(float));
        CHECK(ps_v4_kv_attend(c, o1, s1, q, K ? topk : NULL, sink, &a) == 0, "v4_kv_attend on the cpu: %s", c->err.msg);
        for (int64_t task = 0; task < n * H; task++) ps_v4kb_kv_attend(o2, s2, q, K ? topk : NULL, sink, &a, task);
        CHECK(!memcmp(o1, o2, (size_t)(n * H * Dh) * sizeof(float)) && !memcmp(s1, s2, (size_t)(n * H) * sizeof(float)),
              "the CUDA body of v4_kv_attend differs from the cpu's (shape %d: out %.3g, sinkp %.3g)", s, tu_row_rel(o2, o1, n * H * Dh),
              tu_row_rel(s2, s1, n * H));
        checked += n * H * (Dh + 1);
        /* the gates: HCA window 5, CSA window 5, CSA window 0 (rows from 8, or 0 for window 0, in pages of 8) */
        ps_kv_chan k = {.hd = 6, .rate = 4, .csa = s > 0, .wi = s == 2 ? 0 : 5};
        k.cw = (k.csa ? 2 : 1) * k.hd;
        int64_t base = s == 2 ? 0 : 8, np = (26 - base + 7) / 8, SL = (k.csa ? 2 : 1) * k.rate;
        float *lt[4], ape[64], g1[64], g2[64];
        for (int64_t i = 0; i < np; i++) {
            lt[i] = malloc((size_t)(8 * 2 * k.cw) * sizeof(float));
            for (int64_t j = 0; j < 8 * 2 * k.cw; j++) lt[i][j] = (float)ps_rng_normal(&g);
        }
        for (int64_t i = 0; i < k.rate * k.cw; i++) ape[i] = (float)ps_rng_normal(&g);
        k.ln = (ps_kv_pages){.page = lt, .base = base, .rows = 26, .width = 2 * k.cw, .page_rows = 8};
        CHECK(ps_v4_kv_slots(c, g1, ape, &k) == 0, "v4_kv_slots on the cpu: %s", c->err.msg);
        for (int64_t i = 0; i < k.hd; i++) ps_v4kb_kv_slots(g2, ape, &k, i);
        CHECK(!memcmp(g1, g2, (size_t)(SL * k.hd) * sizeof(float)), "the CUDA body of v4_kv_slots differs from the cpu's (shape %d)", s);
        checked += SL * k.hd;
        for (int64_t i = 0; i < np; i++) free(lt[i]);
        for (int64_t i = 0; i < nkp; i++) free(kt[i]);
        for (int64_t i = 0; i < nep; i++) free(et[i]);
        free(q), free(o1), free(o2), free(s1), free(s2);
    }
    printf("the CUDA bodies of v4_kv_attend and v4_kv_slots on the host: %lld outputs, the cpu's bits\n", (long long)checked);
    ps_ctx_free(c);
}

/* --backends: the backend comparison alone (the device check, scripts/gpu_check.sh) */
int main(int argc, char **argv) {
    test_backends();
    if (argc > 1 && !strcmp(argv[1], "--backends")) CHECK_DONE();
    test_cuda_bodies();
    property("mix4", 1);
    property("hub3", 2);
    property("mix4", 3);
    /* variants: a sliding window shorter than a compression window (1: the query's own row only) or longer
     * than most sequences; a top-k of 1 (one entry per query) or larger than the entries (every visible
     * one, in score order) */
    const struct { const char *model; int64_t W, K; } vs[] = {{"mix4", 3, 64}, {"hub3", 1, 1}, {"mix4", 40, 2}};
    for (int i = 0; i < 3; i++) {
        char dir[512], path[600];
        variant(dir, sizeof dir, vs[i].model, vs[i].W, vs[i].K);
        printf("variant of %s: sliding_window %lld, index_topk %lld\n", vs[i].model, (long long)vs[i].W, (long long)vs[i].K);
        property(dir, 20 + (uint64_t)i);
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        unlink(path);
        snprintf(path, sizeof path, "%s/config.json", dir);
        unlink(path);
        rmdir(dir);
    }
    fork_truncate("mix4");
    fork_truncate("hub3");
    edits();
    bytes_and_long("mix4", 1536);
    bytes_and_long("hub3", 0);
    printf("worst logits rel. error %.3g, worst entry rel. error %.3g (TOL %g)\n", worst_logits, worst_entries, TOL);
    CHECK_DONE();
}
