/* test_hooks.c — hook points (SPEC §4): names and errors, firing order, shapes, write-back identity,
 * zeroing hooks that change exactly the positions they should, pattern overwrites, the cache; the
 * built-in actions (set, zero, patch, add on heads, whole positions, ranges of sequences and positions)
 * against host callbacks written here in plain loops, callbacks and actions mixed on one point in
 * registration order, and the actions' errors. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/cpu/cpu.h"
#include "core/forward.h"
#include "core/hooks.h"
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
            if (p >= PS_HOOK_CK2) continue; /* the select attention's points (tests/test_select.c) */
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
            if (p >= PS_HOOK_CK2) continue; /* the select attention's points (tests/test_select.c) */
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

/* ---- built-in actions ---- */

enum { AB = 3 }; /* sequences of the action tests */

static int run_b(const ps_model *m, const int32_t *tok, const ps_hooks *h, float *logits, ps_error *err) {
    ps_acts a;
    if (ps_acts_create(&a, m->ctx, &m->cfg, AB, T, false, err)) return -1;
    int rc = ps_forward(m, &a, tok, h, err);
    if (!rc) memcpy(logits, a.p.logits, sizeof(float) * AB * T * V);
    ps_acts_free(&a);
    return rc;
}

/* The documented semantics of an action, in plain loops on the host (the reference). */
static int ref_action(const ps_hook_event *ev, void *u, ps_error *e) {
    (void)e;
    const ps_hook_action *a = u;
    int64_t B = ev->shape[0], npos = ev->shape[1], inner = 1;
    for (int i = 2; i < ev->ndim; i++) inner *= ev->shape[i];
    int64_t unit = a->head >= 0 ? inner / ev->shape[2] : inner, off = a->head >= 0 ? a->head * unit : 0;
    int64_t s1 = a->seq1 ? a->seq1 : B, p1 = a->pos1 ? a->pos1 : npos;
    if (a->kind == PS_ACT_ROLL) { /* x'[pos0 + (i + shift) mod n] = x[pos0 + i] */
        int64_t n = p1 - a->pos0;
        float tmp[64 * 64];
        for (int64_t b = a->seq0; b < s1; b++) {
            for (int64_t i = 0; i < n; i++)
                memcpy(tmp + i * unit, ev->data + (b * npos + a->pos0 + i) * inner + off, (size_t)unit * sizeof(float));
            for (int64_t i = 0; i < n; i++) {
                int64_t j = ((i + a->shift) % n + n) % n;
                memcpy(ev->data + (b * npos + a->pos0 + j) * inner + off, tmp + i * unit, (size_t)unit * sizeof(float));
            }
        }
        return 0;
    }
    for (int64_t b = a->seq0; b < s1; b++)
        for (int64_t t = a->pos0; t < p1; t++)
            for (int64_t k = 0; k < unit; k++) {
                float *x = ev->data + (b * npos + t) * inner + off + k;
                const float *one = a->src ? a->src + (a->every_pos ? 0 : t * inner) + off + k : NULL;
                switch (a->kind) {
                case PS_ACT_SET: *x = *one; break;
                case PS_ACT_ZERO: *x = 0.0f; break;
                case PS_ACT_PATCH: *x = a->src[((a->src_seq0 + b - a->seq0) * a->src_npos + t) * inner + off + k]; break;
                case PS_ACT_ADD: *x += a->scale * *one; break;
                default: break; /* ROLL above; SUM changes nothing */
                }
            }
    return 0;
}

static void fill_random(float *x, int64_t n, uint32_t seed) {
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        x[i] = (float)((seed >> 8) & 0xffff) / 65536.0f * 2.0f - 1.0f;
    }
}

typedef struct {
    int64_t head, vals;
    float got[64];
    int n;
} probe;

/* record head `head` of position 0, sequence 0 of a [B, T, nkv, hd] activation */
static int probe_hook(const ps_hook_event *ev, void *u, ps_error *e) {
    (void)e;
    probe *p = u;
    int64_t hd = ev->shape[3];
    memcpy(p->got, ev->data + p->head * hd, (size_t)hd * sizeof(float));
    p->n = (int)hd;
    return 0;
}

static int set_head_value(const ps_hook_event *ev, void *u, ps_error *e) {
    (void)e;
    probe *p = u;
    int64_t n = ev->shape[0] * ev->shape[1], nh = ev->shape[2], hd = ev->shape[3];
    for (int64_t r = 0; r < n; r++)
        for (int64_t k = 0; k < hd; k++) ev->data[(r * nh + p->head) * hd + k] = (float)p->vals;
    return 0;
}

/* A backend that is the CPU one but says its buffers are not host memory: callbacks then get host
 * copies (fetched and written back around the actions), as on a device. */
static ps_backend copies_backend;

static void test_actions(ps_attn_kind kind, int copies) {
    const char *label = kind == PS_ATTN_FULL ? (copies ? "full, host copies" : "full")
                                             : (copies ? "compressed, host copies" : "compressed");
    ps_config c = tu_config(kind);
    c.n_layers = 2;
    c.window = 4; c.stride = 4; c.local_window = 3;
    ps_model m;
    tu_random_model(&m, &c, 23, 0.4f);
    ps_ctx *dev = NULL;
    ps_error err;
    if (copies) {
        copies_backend = ps_backend_cpu;
        copies_backend.name = "cpu-with-host-copies";
        copies_backend.host_visible = 0;
        dev = calloc(1, sizeof *dev);
        dev->be = &copies_backend;
        REQUIRE_OK(ps_model_to(&m, dev, &err), &err);
    }
    int32_t tok[AB * T], tok2[AB * T];
    tu_random_tokens(tok, AB * T, V, 24);
    tu_random_tokens(tok2, AB * T, V, 25);
    static float clean[AB * T * V], got[AB * T * V], want[AB * T * V];
    CHECK_OK(run_b(&m, tok, NULL, clean, &err), &err);
    /* sources: random per-position vectors (big enough for any point), and another run's activations */
    static float vec[T * 64 * 4];
    fill_random(vec, T * 64 * 4, 7);
    ps_cache other;
    ps_cache_init(&other);
    ps_hooks hc;
    ps_hooks_init(&hc);
    const char *patched[] = {"blocks.1.attn.hook_q", "blocks.0.hook_attn_out", "blocks.1.attn.hook_pattern",
                             "blocks.0.attn.hook_gate_k", "blocks.1.attn.hook_cv"};
    for (int i = 0; i < (kind == PS_ATTN_COMPRESSED ? 5 : 3); i++) CHECK_OK(ps_cache_watch(&other, &hc, &c, patched[i], &err), &err);
    CHECK_OK(run_b(&m, tok2, &hc, got, &err), &err);
    ps_hooks_free(&hc);
    int64_t nW = ps_config_n_windows(&c, T);
    struct {
        const char *name;
        ps_hook_action a;
        int comp_only;
    } cases[] = {
        {"blocks.0.attn.hook_v", {.kind = PS_ACT_SET, .head = 1, .src = vec, .src_npos = T}, 0},
        {"blocks.1.hook_resid_pre", {.kind = PS_ACT_SET, .head = -1, .seq0 = 1, .seq1 = 3, .pos0 = 5, .pos1 = 9, .src = vec, .src_npos = 9}, 0},
        {"blocks.0.attn.hook_z", {.kind = PS_ACT_SET, .head = 2, .seq1 = 2, .src = vec, .every_pos = 1}, 0},
        {"blocks.0.attn.hook_z", {.kind = PS_ACT_SET, .head = 3, .seq0 = 2, .pos0 = 4, .src = vec, .every_pos = 1}, 0},
        {"blocks.1.attn.hook_k", {.kind = PS_ACT_ZERO, .head = 0}, 0},
        {"blocks.0.hook_mlp_out", {.kind = PS_ACT_ZERO, .head = -1, .pos0 = 3, .pos1 = 4}, 0},
        {"blocks.1.attn.hook_q", {.kind = PS_ACT_PATCH, .head = 3, .seq0 = 1, .seq1 = 3, .pos0 = 2, .pos1 = 20,
                                  .src_npos = T, .src_nseq = AB, .src_seq0 = 0}, 0},
        {"blocks.0.hook_attn_out", {.kind = PS_ACT_PATCH, .head = -1, .src_npos = T, .src_nseq = AB}, 0},
        {"blocks.1.attn.hook_pattern", {.kind = PS_ACT_PATCH, .head = -1, .seq1 = 1, .src_nseq = AB, .src_seq0 = 2}, 0},
        {"blocks.0.hook_resid_post", {.kind = PS_ACT_ADD, .head = -1, .src = vec, .every_pos = 1, .scale = 0.5f}, 0},
        {"blocks.1.attn.hook_z", {.kind = PS_ACT_ADD, .head = 1, .pos0 = 4, .pos1 = 10, .src = vec, .src_npos = T, .scale = -2.0f}, 0},
        {"blocks.0.attn.hook_k", {.kind = PS_ACT_ROLL, .head = 1, .pos0 = 2, .pos1 = 9, .shift = 3}, 0},
        {"blocks.1.hook_resid_mid", {.kind = PS_ACT_ROLL, .head = -1, .seq0 = 1, .shift = -2}, 0},
        {"blocks.1.attn.hook_ck", {.kind = PS_ACT_SET, .head = 1, .src = vec, .src_npos = nW}, 1},
        {"blocks.0.attn.hook_gate_k", {.kind = PS_ACT_ROLL, .head = 1, .seq1 = 2, .shift = 1}, 1},
        {"blocks.0.attn.hook_gate_k", {.kind = PS_ACT_PATCH, .head = 0, .seq0 = 2, .src_npos = nW, .src_nseq = AB, .src_seq0 = 1}, 1},
        {"blocks.1.attn.hook_cv", {.kind = PS_ACT_PATCH, .head = 1, .pos0 = 1, .pos1 = 3, .src_npos = nW, .src_nseq = AB}, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (cases[i].comp_only && kind != PS_ATTN_COMPRESSED) continue;
        ps_hook_action a = cases[i].a;
        ps_hooks h;
        ps_hooks_init(&h);
        if (a.kind == PS_ACT_PATCH) {
            const ps_cache_item *it = ps_cache_get(&other, cases[i].name);
            int64_t n = 1;
            for (int d = 0; it && d < it->ndim; d++) n *= it->shape[d];
            if (it && !a.src_npos) a.src_npos = it->shape[1];
            a.src = it ? ps_hooks_upload(&h, m.ctx, it->data, n, &err) : NULL;
            CHECK(a.src != NULL, "%s: no source for %s", label, cases[i].name);
            if (!a.src) continue;
        }
        CHECK_OK(ps_hooks_add_action(&h, &c, cases[i].name, &a, &err), &err);
        int l;
        ps_hook_point pt;
        ps_hook_parse(&c, cases[i].name, &l, &pt, &err);
        CHECK(ps_hooks_on(&h, l, pt), "%s: an action does not set the mask", label);
        CHECK_OK(run_b(&m, tok, &h, got, &err), &err);
        ps_hooks_free(&h);
        /* the reference: the same semantics in a host callback (reading the host copy of the source) */
        ps_hook_action r = a;
        if (a.kind == PS_ACT_PATCH) r.src = ps_cache_get(&other, cases[i].name)->data;
        ps_hooks_init(&h);
        CHECK_OK(ps_hooks_add(&h, &c, cases[i].name, ref_action, &r, &err), &err);
        CHECK_OK(run_b(&m, tok, &h, want, &err), &err);
        ps_hooks_free(&h);
        CHECK(memcmp(got, want, sizeof got) == 0, "%s: action %zu on %s differs from the plain-loop reference", label, i,
              cases[i].name);
        CHECK(memcmp(got, clean, sizeof got) != 0, "%s: action %zu on %s changed nothing (vacuous)", label, i, cases[i].name);
        /* sequences outside the action's range are untouched (every action but the pattern patch of
         * sequence 0 and those on all sequences leaves some sequence alone) */
        int64_t s1 = a.seq1 ? a.seq1 : AB;
        for (int64_t b = 0; b < AB; b++)
            if (b < a.seq0 || b >= s1)
                CHECK(memcmp(got + b * T * V, clean + b * T * V, sizeof(float) * T * V) == 0,
                      "%s: action %zu on %s changed sequence %lld outside its range", label, i, cases[i].name, (long long)b);
    }
    ps_cache_free(&other);

    /* the sum action: the clean run's sequences added in double in the backend, as a host loop over a
     * cached copy adds them (same order: the same bits); the activation itself is unchanged */
    {
        const char *sn = "blocks.1.attn.hook_v";
        int64_t per = T * c.n_kv_heads * c.head_dim;
        double *acc = ps_buf_alloc(m.ctx, per * (int64_t)sizeof(double), "sums", &err), *host = calloc((size_t)per, sizeof(double));
        double *want_sum = calloc((size_t)per, sizeof(double));
        ps_hooks hs;
        ps_hooks_init(&hs);
        ps_cache cc;
        ps_cache_init(&cc);
        ps_hook_action sum = {.kind = PS_ACT_SUM, .head = -1, .seq0 = 1, .acc = acc, .acc_n = per};
        CHECK_OK(ps_hooks_add_action(&hs, &c, sn, &sum, &err), &err);
        CHECK_OK(ps_cache_watch(&cc, &hs, &c, sn, &err), &err);
        CHECK_OK(run_b(&m, tok, &hs, got, &err), &err); /* twice: the sums add up */
        CHECK_OK(run_b(&m, tok, &hs, got, &err), &err);
        CHECK(memcmp(got, clean, sizeof got) == 0, "%s: a sum action changed the forward", label);
        const ps_cache_item *it = ps_cache_get(&cc, sn);
        for (int r = 0; r < 2 && it; r++)
            for (int64_t b = 1; b < AB; b++)
                for (int64_t i = 0; i < per; i++) want_sum[i] += it->data[b * per + i];
        CHECK_OK(ps_buf_to_host(m.ctx, host, acc, per * (int64_t)sizeof(double), &err), &err);
        CHECK(it && memcmp(host, want_sum, (size_t)per * sizeof(double)) == 0, "%s: the sum action differs from the host loop", label);
        ps_hook_action bad_sum = {.kind = PS_ACT_SUM, .head = -1, .acc = acc, .acc_n = per + 1};
        ps_hooks_free(&hs);
        ps_hooks_init(&hs);
        CHECK_OK(ps_hooks_add_action(&hs, &c, sn, &bad_sum, &err), &err);
        CHECK_ERR(run_b(&m, tok, &hs, got, &err), &err, "the accumulator holds");
        bad_sum.head = 0;
        CHECK_ERR(ps_hooks_add_action(&hs, &c, sn, &bad_sum, &err), &err, "adds whole sequences");
        ps_hooks_free(&hs);
        ps_cache_free(&cc);
        ps_buf_free(m.ctx, acc, per * (int64_t)sizeof(double));
        free(host);
        free(want_sum);
    }

    /* callbacks and actions on one point fire in registration order, each seeing the earlier writes */
    ps_hooks h;
    ps_hooks_init(&h);
    probe fill7 = {.head = 1, .vals = 7}, seen1 = {.head = 1}, seen0 = {.head = 0}, fill3 = {.head = 0, .vals = 3}, final0 = {.head = 0};
    static float ones[64];
    for (int i = 0; i < 64; i++) ones[i] = 1.0f;
    ps_hook_action set1 = {.kind = PS_ACT_SET, .head = 1, .src = vec, .src_npos = T};
    ps_hook_action zero0 = {.kind = PS_ACT_ZERO, .head = 0};
    ps_hook_action add0 = {.kind = PS_ACT_ADD, .head = 0, .src = ones, .every_pos = 1, .scale = 1.0f};
    const char *nm = "blocks.0.attn.hook_v";
    CHECK_OK(ps_hooks_add(&h, &c, nm, set_head_value, &fill7, &err), &err);
    CHECK_OK(ps_hooks_add_action(&h, &c, nm, &set1, &err), &err);
    CHECK_OK(ps_hooks_add(&h, &c, nm, probe_hook, &seen1, &err), &err);
    CHECK_OK(ps_hooks_add_action(&h, &c, nm, &zero0, &err), &err);
    CHECK_OK(ps_hooks_add(&h, &c, nm, probe_hook, &seen0, &err), &err);
    CHECK_OK(ps_hooks_add(&h, &c, nm, set_head_value, &fill3, &err), &err);
    CHECK_OK(ps_hooks_add_action(&h, &c, nm, &add0, &err), &err);
    CHECK_OK(ps_hooks_add(&h, &c, nm, probe_hook, &final0, &err), &err);
    CHECK_OK(run_b(&m, tok, &h, got, &err), &err);
    int64_t hd = c.head_dim;
    int ok = seen1.n == hd && seen0.n == hd && final0.n == hd;
    for (int k = 0; ok && k < hd; k++)
        ok = seen1.got[k] == vec[1 * hd + k] && seen0.got[k] == 0.0f && final0.got[k] == 4.0f;
    CHECK(ok, "%s: callbacks and actions did not fire in registration order", label);
    ps_hooks_free(&h);

    /* registration errors */
    ps_hooks_init(&h);
    ps_hook_action bad = {.kind = PS_ACT_ZERO, .head = c.n_kv_heads};
    CHECK_ERR(ps_hooks_add_action(&h, &c, "blocks.0.attn.hook_k", &bad, &err), &err, "blocks.0.attn.hook_k", "out of range", "2 heads");
    bad.head = c.n_heads - 1;
    CHECK_OK(ps_hooks_add_action(&h, &c, "blocks.0.attn.hook_q", &bad, &err), &err);
    bad.head = 0;
    CHECK_ERR(ps_hooks_add_action(&h, &c, "blocks.0.hook_resid_pre", &bad, &err), &err, "no head axis");
    CHECK_ERR(ps_hooks_add_action(&h, &c, "blocks.0.attn.hook_pattern", &bad, &err), &err, "no head axis");
    bad = (ps_hook_action){.kind = PS_ACT_ZERO, .head = -1, .pos1 = 3};
    CHECK_ERR(ps_hooks_add_action(&h, &c, "blocks.0.attn.hook_pattern", &bad, &err), &err, "whole tensor");
    bad = (ps_hook_action){.kind = PS_ACT_SET, .head = -1, .src_npos = T};
    CHECK_ERR(ps_hooks_add_action(&h, &c, "blocks.0.hook_resid_pre", &bad, &err), &err, "without a source");
    bad = (ps_hook_action){.kind = PS_ACT_ZERO, .head = -1, .seq0 = 2, .seq1 = 2};
    CHECK_ERR(ps_hooks_add_action(&h, &c, "blocks.0.hook_resid_pre", &bad, &err), &err, "empty or negative range");
    bad = (ps_hook_action){.kind = PS_ACT_PATCH, .head = -1, .src = vec, .src_npos = T};
    CHECK_ERR(ps_hooks_add_action(&h, &c, "blocks.0.hook_resid_pre", &bad, &err), &err, "src_nseq");
    bad = (ps_hook_action){.kind = PS_ACT_ADD, .head = -1, .src = vec};
    CHECK_ERR(ps_hooks_add_action(&h, &c, "blocks.0.hook_resid_pre", &bad, &err), &err, "src_npos");
    bad = (ps_hook_action){.kind = (ps_hook_action_kind)9};
    CHECK_ERR(ps_hooks_add_action(&h, &c, "blocks.0.hook_resid_pre", &bad, &err), &err, "unknown action kind");
    CHECK_ERR(ps_hooks_add_action(&h, &c, "blocks.2.hook_resid_pre", &bad, &err), &err, "layer 2 out of range");
    CHECK(h.n == 1, "%s: invalid actions were registered (%d entries)", label, h.n);
    ps_hooks_free(&h);
    /* errors when firing: ranges beyond the batch or the source */
    struct { ps_hook_action a; const char *msg; } fire[] = {
        {{.kind = PS_ACT_SET, .head = -1, .src = vec, .src_npos = 4}, "its source holds 4 positions"},
        {{.kind = PS_ACT_ZERO, .head = 1, .seq1 = 5}, "of an activation of 3 sequences"},
        {{.kind = PS_ACT_ZERO, .head = 1, .pos0 = 30}, "positions [30, 24)"},
        {{.kind = PS_ACT_PATCH, .head = -1, .src = vec, .src_npos = T, .src_nseq = 1}, "the source holds 1"},
    };
    for (size_t i = 0; i < sizeof fire / sizeof fire[0]; i++) {
        ps_hooks_init(&h);
        const char *where = fire[i].a.head >= 0 ? "blocks.1.attn.hook_z" : "blocks.1.hook_resid_mid";
        CHECK_OK(ps_hooks_add_action(&h, &c, where, &fire[i].a, &err), &err);
        CHECK_ERR(run_b(&m, tok, &h, got, &err), &err, where, fire[i].msg);
        ps_hooks_free(&h);
    }
    ps_model_free(&m);
    ps_ctx_free(dev);
}

/* The ops behind the actions and the knockout's means against plain loops. */
static void test_action_ops(void) {
    ps_ctx *ctx;
    ps_error err;
    REQUIRE_OK(ps_ctx_create(&ctx, "cpu", &err), &err);
    enum { N0 = 5, N1 = 7, W = 3, DS0 = 40, DS1 = 5, SS0 = 30, SS1 = 4, NX = N0 * DS0 };
    static float dst[NX], ref[NX], src[N0 * SS0];
    fill_random(src, N0 * SS0, 3);
    for (int mode = 0; mode < 4; mode++) { /* copy, zero, accumulate, broadcast accumulate */
        fill_random(dst, NX, 5);
        memcpy(ref, dst, sizeof dst);
        int acc = mode >= 2;
        const float *s0 = mode == 1 ? NULL : src;
        int64_t ss0 = mode == 3 ? 0 : SS0, ss1 = mode == 3 ? 0 : SS1;
        CHECK_OK(ps_copy_blocks(ctx, dst, DS0, DS1, s0, ss0, ss1, N0, N1, W, acc, 0.75f) ? ps_ctx_check(ctx, &err) : 0, &err);
        for (int i = 0; i < N0; i++)
            for (int j = 0; j < N1; j++)
                for (int e = 0; e < W; e++) {
                    float *y = ref + i * DS0 + j * DS1 + e;
                    float x = s0 ? s0[i * ss0 + j * ss1 + e] : 0.0f;
                    *y = acc ? *y + 0.75f * x : x;
                }
        CHECK(memcmp(dst, ref, sizeof dst) == 0, "copy_blocks mode %d differs from the plain loop", mode);
    }
    CHECK(ps_copy_blocks(ctx, dst, 1, 1, NULL, 0, 0, 1, 1, 1, 1, 1.0f) != 0 && ps_ctx_check(ctx, &err) != 0 &&
              strstr(err.msg, "copy_blocks"),
          "accumulating from no source is not an error");
    /* sums over sequences in double, in sequence order (big enough for the parallel loop) */
    enum { NS = 9, NE = 20000 };
    float *x = malloc(sizeof(float) * NS * NE);
    double *sum = calloc(NE, sizeof(double)), *want = calloc(NE, sizeof(double));
    float *mean = malloc(sizeof(float) * NE);
    fill_random(x, NS * NE, 9);
    for (int rep = 0; rep < 2; rep++) { /* two calls add up */
        CHECK_OK(ps_accumulate_seqs(ctx, sum, x, NS, NE) ? ps_ctx_check(ctx, &err) : 0, &err);
        for (int b = 0; b < NS; b++)
            for (int e = 0; e < NE; e++) want[e] += x[b * NE + e];
    }
    int same = 1;
    for (int e = 0; e < NE; e++) same &= sum[e] == want[e];
    CHECK(same, "accumulate_seqs differs from the in-order double sum");
    CHECK_OK(ps_sum_to_mean(ctx, mean, sum, 2.0 * NS, NE) ? ps_ctx_check(ctx, &err) : 0, &err);
    same = 1;
    for (int e = 0; e < NE; e++) same &= mean[e] == (float)(want[e] / (2.0 * NS));
    CHECK(same, "sum_to_mean differs from (float)(sum / count)");
    CHECK(ps_sum_to_mean(ctx, mean, sum, 0.0, NE) != 0 && ps_ctx_check(ctx, &err) != 0 && strstr(err.msg, "count"),
          "a mean over no sequences is not an error");
    free(x);
    free(sum);
    free(want);
    free(mean);
    ps_ctx_free(ctx);
}

/* The restarts at a layer's attention fire that layer's kept-input hooks (here an action on v), and the
 * answer-row restart refuses a hook on the last layer's later points. */
static void test_restart_hooks(ps_attn_kind kind) {
    ps_config c = tu_config(kind);
    c.n_layers = 2;
    ps_model m;
    tu_random_model(&m, &c, 27, 0.4f);
    int32_t tok[T];
    tu_random_tokens(tok, T, V, 28);
    ps_error err;
    ps_hooks h;
    ps_hooks_init(&h);
    ps_hook_action zero = {.kind = PS_ACT_ZERO, .head = 1};
    CHECK_OK(ps_hooks_add_action(&h, &c, "blocks.0.attn.hook_v", &zero, &err), &err);
    float want[T * V], clean[T * V];
    ps_acts a;
    CHECK_OK(ps_acts_create(&a, m.ctx, &c, 1, T, true, &err), &err);
    CHECK_OK(ps_forward(&m, &a, tok, NULL, &err), &err);
    memcpy(clean, a.p.logits, sizeof clean);
    CHECK_OK(ps_forward(&m, &a, tok, &h, &err), &err);
    memcpy(want, a.p.logits, sizeof want);
    CHECK(memcmp(want + 5 * V, clean + 5 * V, V * sizeof(float)) != 0 &&
              memcmp(want + (T - 1) * V, clean + (T - 1) * V, V * sizeof(float)) != 0,
          "zeroing a value head did not change the rows compared (vacuous)");
    for (int rows_only = 0; rows_only < 2; rows_only++) {
        CHECK_OK(ps_forward(&m, &a, tok, NULL, &err), &err); /* clean kept state */
        int64_t rows[2] = {5, T - 1};
        if (rows_only) CHECK_OK(ps_forward_from_attention_rows(&m, &a, 0, &h, rows, 2, &err), &err);
        else CHECK_OK(ps_forward_from_attention(&m, &a, 0, &h, &err), &err);
        double worst = 0;
        for (int i = 0; i < 2; i++)
            for (int e = 0; e < V; e++)
                worst = fmax(worst, fabs(a.p.logits[rows[i] * V + e] - want[rows[i] * V + e]) / (1 + fabs(want[rows[i] * V + e])));
        CHECK(worst < 1e-5, "%s restart at layer 0's attention did not apply the action on its kept v (%g)",
              rows_only ? "answer-row" : "full", worst);
    }
    ps_hooks_free(&h);
    ps_hooks_init(&h);
    CHECK_OK(ps_hooks_add_action(&h, &c, "blocks.1.attn.hook_z", &zero, &err), &err);
    int64_t row = T - 1;
    CHECK_ERR(ps_forward_from_attention_rows(&m, &a, 0, &h, &row, 1, &err), &err, "blocks.1.attn.hook_z", "cannot fire");
    ps_hooks_free(&h);
    ps_acts_free(&a);
    ps_model_free(&m);
}

int main(void) {
    test_restart_hooks(PS_ATTN_FULL);
    test_restart_hooks(PS_ATTN_COMPRESSED);
    test_action_ops();
    test_actions(PS_ATTN_FULL, 0);
    test_actions(PS_ATTN_COMPRESSED, 0);
    test_actions(PS_ATTN_FULL, 1);
    test_actions(PS_ATTN_COMPRESSED, 1);
    test_names();
    test_model(PS_ATTN_FULL);
    test_model(PS_ATTN_COMPRESSED);
    test_pattern_overwrite(PS_ATTN_FULL);
    test_pattern_overwrite(PS_ATTN_COMPRESSED);
    CHECK_DONE();
}
