/* test_hooks.c — hook points (SPEC §4): names and errors, firing order, shapes, write-back identity,
 * zeroing hooks that change exactly the positions they should, pattern overwrites, the cache. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "forward.h"
#include "hooks.h"
#include "testutil.h"

enum { T = 24, V = 23 };

static int run(const ps_model *m, const int32_t *tok, const ps_hooks *h, float *logits, ps_error *err) {
    ps_acts a;
    if (ps_acts_create(&a, m->ctx, &m->cfg, 1, T, false, err)) return -1;
    int rc = ps_forward(m, &a, tok, h, err);
    if (!rc) memcpy(logits, a.p.logits, sizeof(float) * T * V);
    ps_acts_free(&a);
    return rc;
}

typedef struct { char names[64][96]; int n; int shapes_ok; const ps_config *c; } order_log;

static int log_hook(const ps_hook_event *ev, void *u, ps_error *e) {
    (void)e;
    order_log *o = u;
    snprintf(o->names[o->n++], 96, "%s", ev->name);
    int64_t d = o->c->d_model, hd = o->c->head_dim, nh = o->c->n_heads, nkv = o->c->n_kv_heads, W = o->c->window;
    int64_t nW = ps_config_n_windows(o->c, T);
    int64_t want[PS_HOOK_NPOINTS][4] = {
        [PS_HOOK_RESID_PRE] = {1, T, d}, [PS_HOOK_Q] = {1, T, nh, hd}, [PS_HOOK_K] = {1, T, nkv, hd},
        [PS_HOOK_V] = {1, T, nkv, hd}, [PS_HOOK_GATE_K] = {1, nW, nkv, W}, [PS_HOOK_GATE_V] = {1, nW, nkv, W},
        [PS_HOOK_CK] = {1, nW, nkv, hd}, [PS_HOOK_CV] = {1, nW, nkv, hd}, [PS_HOOK_PATTERN] = {1, nh, T, nW + T},
        [PS_HOOK_Z] = {1, T, nh, hd}, [PS_HOOK_ATTN_OUT] = {1, T, d}, [PS_HOOK_RESID_MID] = {1, T, d},
        [PS_HOOK_MLP_OUT] = {1, T, d}, [PS_HOOK_RESID_POST] = {1, T, d}};
    int nd = ev->point == PS_HOOK_RESID_PRE || ev->point >= PS_HOOK_ATTN_OUT ? 3 : 4;
    if (ev->ndim != nd) o->shapes_ok = 0;
    for (int i = 0; i < nd; i++)
        if (ev->shape[i] != want[ev->point][i]) o->shapes_ok = 0;
    return 0;
}

static int identity_hook(const ps_hook_event *ev, void *u, ps_error *e) {
    (void)u; (void)e;
    int64_t n = 1;
    for (int i = 0; i < ev->ndim; i++) n *= ev->shape[i];
    float *copy = malloc((size_t)n * sizeof(float));
    memcpy(copy, ev->data, (size_t)n * sizeof(float));
    memcpy(ev->data, copy, (size_t)n * sizeof(float));
    free(copy);
    return 0;
}

/* zero position `pos` (second axis) of a [1, X, ...] activation */
static int zero_pos_hook(const ps_hook_event *ev, void *u, ps_error *e) {
    (void)e;
    int pos = *(int *)u;
    int64_t inner = 1;
    for (int i = 2; i < ev->ndim; i++) inner *= ev->shape[i];
    memset(ev->data + pos * inner, 0, (size_t)inner * sizeof(float));
    return 0;
}

static int failing_hook(const ps_hook_event *ev, void *u, ps_error *e) {
    (void)u;
    return ps_fail(e, "hook %s refused", ev->name);
}

/* rows of logits that differ between a and b, as a bitmask over positions */
static uint64_t changed_rows(const float *a, const float *b) {
    uint64_t m = 0;
    for (int t = 0; t < T; t++)
        if (memcmp(a + t * V, b + t * V, V * sizeof(float))) m |= 1ull << t;
    return m;
}

static uint64_t range_mask(int lo, int hi) { /* [lo, hi) */
    uint64_t m = 0;
    for (int t = lo; t < hi && t < T; t++) m |= 1ull << t;
    return m;
}

static void test_model(ps_attn_kind kind) {
    const char *label = kind == PS_ATTN_FULL ? "full" : "compressed";
    ps_config c = tu_config(kind);
    c.n_layers = 2;
    c.window = 4; c.stride = 4; c.local_window = 3;
    ps_model m;
    tu_random_model(&m, &c, 21, 0.4f);
    int32_t tok[T];
    tu_random_tokens(tok, T, V, 22);
    float clean[T * V], out[T * V];
    ps_error err;
    CHECK_OK(run(&m, tok, NULL, clean, &err), &err);

    /* every hook point, in forward order, with its documented shape */
    ps_hooks h;
    ps_hooks_init(&h);
    order_log log = {.shapes_ok = 1, .c = &c};
    for (int l = 1; l >= 0; l--) /* registration order must not matter */
        for (int p = PS_HOOK_NPOINTS - 1; p >= 0; p--) {
            if (kind == PS_ATTN_FULL && p >= PS_HOOK_GATE_K && p <= PS_HOOK_CV) continue;
            char nm[96];
            ps_hook_name(nm, sizeof nm, l, (ps_hook_point)p);
            CHECK_OK(ps_hooks_add(&h, &c, nm, log_hook, &log, &err), &err);
        }
    CHECK_OK(run(&m, tok, &h, out, &err), &err);
    const char *order_full[] = {"hook_resid_pre", "attn.hook_q", "attn.hook_k", "attn.hook_v", "attn.hook_pattern",
                                "attn.hook_z", "hook_attn_out", "hook_resid_mid", "hook_mlp_out", "hook_resid_post"};
    const char *order_comp[] = {"hook_resid_pre", "attn.hook_q", "attn.hook_k", "attn.hook_v", "attn.hook_gate_k",
                                "attn.hook_gate_v", "attn.hook_ck", "attn.hook_cv", "attn.hook_pattern", "attn.hook_z",
                                "hook_attn_out", "hook_resid_mid", "hook_mlp_out", "hook_resid_post"};
    const char **order = kind == PS_ATTN_FULL ? order_full : order_comp;
    int per = kind == PS_ATTN_FULL ? 10 : 14, ok = log.n == 2 * per;
    for (int i = 0; ok && i < log.n; i++) {
        char want[96];
        snprintf(want, sizeof want, "blocks.%d.%s", i / per, order[i % per]);
        ok = !strcmp(want, log.names[i]);
    }
    CHECK(ok, "%s: hooks fired out of order (%d fired)", label, log.n);
    CHECK(log.shapes_ok, "%s: a hook saw the wrong shape", label);
    CHECK(memcmp(clean, out, sizeof clean) == 0, "%s: read-only hooks changed the logits", label);
    ps_hooks_free(&h);

    /* writing back what was read changes nothing, on every point */
    ps_hooks_init(&h);
    for (int l = 0; l < 2; l++)
        for (int p = 0; p < PS_HOOK_NPOINTS; p++) {
            if (kind == PS_ATTN_FULL && p >= PS_HOOK_GATE_K && p <= PS_HOOK_CV) continue;
            char nm[96];
            ps_hook_name(nm, sizeof nm, l, (ps_hook_point)p);
            CHECK_OK(ps_hooks_add(&h, &c, nm, identity_hook, NULL, &err), &err);
        }
    CHECK_OK(run(&m, tok, &h, out, &err), &err);
    CHECK(memcmp(clean, out, sizeof clean) == 0, "%s: write-back hooks changed the logits", label);
    ps_hooks_free(&h);

    /* zeroing hooks change exactly the positions they should */
    struct { const char *name; int pos; uint64_t expect; } z[] = {
        {"blocks.1.hook_resid_post", 7, range_mask(7, 8)},
        {"blocks.1.hook_mlp_out", 11, range_mask(11, 12)},
        {"blocks.1.attn.hook_z", 5, range_mask(5, 6)},
        {"blocks.1.attn.hook_q", 9, range_mask(9, 10)},
        /* last layer raw values: full attention reaches every later query; compressed only the local window */
        {"blocks.1.attn.hook_v", 6, kind == PS_ATTN_FULL ? range_mask(6, T) : range_mask(6, 6 + 3)},
        {"blocks.1.attn.hook_k", 13, kind == PS_ATTN_FULL ? range_mask(13, T) : range_mask(13, 13 + 3)},
    };
    for (size_t i = 0; i < sizeof z / sizeof z[0]; i++) {
        ps_hooks_init(&h);
        CHECK_OK(ps_hooks_add(&h, &c, z[i].name, zero_pos_hook, &z[i].pos, &err), &err);
        CHECK_OK(run(&m, tok, &h, out, &err), &err);
        uint64_t got = changed_rows(clean, out);
        CHECK(got == z[i].expect, "%s: zeroing %s at %d changed rows %llx, expected %llx", label, z[i].name, z[i].pos,
              (unsigned long long)got, (unsigned long long)z[i].expect);
        ps_hooks_free(&h);
    }
    if (kind == PS_ATTN_COMPRESSED) {
        /* zeroing compressed window 2 (positions 8..11, ends at 11) of the last layer changes queries >= 11 */
        int win = 2;
        ps_hooks_init(&h);
        CHECK_OK(ps_hooks_add(&h, &c, "blocks.1.attn.hook_cv", zero_pos_hook, &win, &err), &err);
        CHECK_OK(run(&m, tok, &h, out, &err), &err);
        CHECK(changed_rows(clean, out) == range_mask(11, T), "zeroing compressed value 2 changed %llx",
              (unsigned long long)changed_rows(clean, out));
        ps_hooks_free(&h);
        ps_hooks_init(&h);
        CHECK_OK(ps_hooks_add(&h, &c, "blocks.1.attn.hook_gate_k", zero_pos_hook, &win, &err), &err);
        CHECK_OK(run(&m, tok, &h, out, &err), &err);
        CHECK(changed_rows(clean, out) == range_mask(11, T), "zeroing gate of window 2 changed %llx",
              (unsigned long long)changed_rows(clean, out));
        ps_hooks_free(&h);
    }
    /* a hook error aborts the pass with the hook's message */
    ps_hooks_init(&h);
    CHECK_OK(ps_hooks_add(&h, &c, "blocks.0.hook_mlp_out", failing_hook, NULL, &err), &err);
    CHECK_ERR(run(&m, tok, &h, out, &err), &err, "blocks.0.hook_mlp_out refused");
    ps_hooks_free(&h);

    /* cache: values after earlier overwrites; two points of one run */
    ps_cache cache;
    ps_cache_init(&cache);
    ps_hooks_init(&h);
    int pos = 3;
    CHECK_OK(ps_hooks_add(&h, &c, "blocks.0.hook_resid_post", zero_pos_hook, &pos, &err), &err);
    CHECK_OK(ps_cache_watch(&cache, &h, &c, "blocks.0.hook_resid_post", &err), &err);
    CHECK_OK(ps_cache_watch(&cache, &h, &c, "blocks.1.hook_resid_pre", &err), &err);
    CHECK_OK(run(&m, tok, &h, out, &err), &err);
    const ps_cache_item *a = ps_cache_get(&cache, "blocks.0.hook_resid_post"), *b = ps_cache_get(&cache, "blocks.1.hook_resid_pre");
    CHECK(a && b && a->ndim == 3 && a->shape[1] == T && memcmp(a->data, b->data, sizeof(float) * T * 16) == 0,
          "cache: resid_post of layer 0 != resid_pre of layer 1");
    int zero = 1;
    for (int i = 0; a && i < 16; i++) zero &= a->data[3 * 16 + i] == 0.0f;
    CHECK(zero, "cache holds the value before the overwrite");
    /* an item pointer survives the cache growing: watch every point of every layer after taking it
     * (the cache grew by realloc and left earlier pointers dangling; ASan caught the read below) */
    int grown = 0;
    for (int l = 0; l < c.n_layers; l++)
        for (int pt = 0; pt < PS_HOOK_NPOINTS; pt++) {
            if (c.kind != PS_ATTN_COMPRESSED &&
                (pt == PS_HOOK_GATE_K || pt == PS_HOOK_GATE_V || pt == PS_HOOK_CK || pt == PS_HOOK_CV))
                continue;
            char nm[96];
            ps_hook_name(nm, sizeof nm, l, (ps_hook_point)pt);
            grown += ps_cache_watch(&cache, &h, &c, nm, &err) == 0;
        }
    CHECK(cache.n > 8 && grown > 8, "cache did not grow past its first capacity (%d items)", cache.n);
    CHECK(ps_cache_get(&cache, "blocks.0.hook_resid_post") == a, "item pointer moved when the cache grew");
    CHECK_OK(run(&m, tok, &h, out, &err), &err);
    CHECK(a->ndim == 3 && a->shape[1] == T && a->data[3 * 16] == 0.0f, "item read after growth is wrong");
    ps_cache_free(&cache);
    ps_hooks_free(&h);
    ps_model_free(&m);
}

/* an overwritten pattern drives z: putting all weight on the query's own raw entry makes z = v_t */
static int self_attend(const ps_hook_event *ev, void *u, ps_error *e) {
    (void)u; (void)e;
    int64_t nh = ev->shape[1], TT = ev->shape[2], cols = ev->shape[3];
    for (int64_t n = 0; n < nh; n++)
        for (int64_t t = 0; t < TT; t++) {
            float *row = ev->data + (n * TT + t) * cols;
            memset(row, 0, (size_t)cols * sizeof(float));
            row[cols - TT + t] = 1.0f;
            if (t + 1 < TT) row[cols - TT + t + 1] = 5.0f; /* unseen: must be ignored */
        }
    return 0;
}

static void test_pattern_overwrite(ps_attn_kind kind) {
    ps_config c = tu_config(kind);
    ps_model m;
    tu_random_model(&m, &c, 31, 0.4f);
    int32_t tok[T];
    tu_random_tokens(tok, T, V, 32);
    ps_hooks h;
    ps_cache cache;
    ps_hooks_init(&h);
    ps_cache_init(&cache);
    ps_error err;
    CHECK_OK(ps_hooks_add(&h, &c, "blocks.0.attn.hook_pattern", self_attend, NULL, &err), &err);
    CHECK_OK(ps_cache_watch(&cache, &h, &c, "blocks.0.attn.hook_v", &err), &err);
    CHECK_OK(ps_cache_watch(&cache, &h, &c, "blocks.0.attn.hook_z", &err), &err);
    float out[T * V];
    CHECK_OK(run(&m, tok, &h, out, &err), &err);
    const ps_cache_item *v = ps_cache_get(&cache, "blocks.0.attn.hook_v"), *z = ps_cache_get(&cache, "blocks.0.attn.hook_z");
    double worst = 0;
    int64_t hd = c.head_dim;
    for (int t = 0; t < T; t++)
        for (int n = 0; n < 4; n++)
            for (int e = 0; e < hd; e++)
                worst = fmax(worst, fabs(z->data[(t * 4 + n) * hd + e] - v->data[(t * 2 + n / 2) * hd + e]));
    CHECK(worst < 1e-6, "%s: pattern overwrite not applied (or unseen entries used): %g", kind ? "compressed" : "full", worst);
    ps_cache_free(&cache);
    ps_hooks_free(&h);
    ps_model_free(&m);
}

static void test_names(void) {
    ps_config c = tu_config(PS_ATTN_FULL);
    c.n_layers = 4;
    ps_hooks h;
    ps_hooks_init(&h);
    ps_error err;
    int l;
    ps_hook_point p;
    CHECK_OK(ps_hook_parse(&c, "blocks.3.attn.hook_pattern", &l, &p, &err), &err);
    CHECK(l == 3 && p == PS_HOOK_PATTERN, "parse");
    CHECK_ERR(ps_hook_parse(&c, "blocks.0.attn.hook_qq", &l, &p, &err), &err, "unknown hook name", "blocks.{l}.attn.hook_q",
              "blocks.{l}.hook_resid_post", "l = 0..3");
    CHECK_ERR(ps_hook_parse(&c, "blocks.4.hook_resid_pre", &l, &p, &err), &err, "layer 4 out of range", "4 layers");
    CHECK_ERR(ps_hook_parse(&c, "blocks.0.attn.hook_ck", &l, &p, &err), &err, "compressed");
    CHECK_ERR(ps_hook_parse(&c, "hook_embed", &l, &p, &err), &err, "unknown hook name");
    CHECK_ERR(ps_hook_parse(&c, "blocks.x.hook_resid_pre", &l, &p, &err), &err, "unknown hook name");
    CHECK_ERR(ps_hook_parse(&c, "blocks.1", &l, &p, &err), &err, "unknown hook name");
    CHECK_ERR(ps_hooks_add(&h, &c, "blocks.-1.hook_resid_pre", identity_hook, NULL, &err), &err, "unknown hook name");
    CHECK(h.n == 0, "a bad name was registered");
    ps_hooks_free(&h);
}

int main(void) {
    test_names();
    test_model(PS_ATTN_FULL);
    test_model(PS_ATTN_COMPRESSED);
    test_pattern_overwrite(PS_ATTN_FULL);
    test_pattern_overwrite(PS_ATTN_COMPRESSED);
    CHECK_DONE();
}
