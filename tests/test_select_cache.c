/* test_select_cache.c — the controlled model's select attention (attention.kind "select", core/select.h) in the
 * KV cache (core/kvcache.c: raw keys and values, level-1 and level-2 pooled keys extended as windows complete,
 * a decode row over its selected blocks only) and in the chunked prefill (core/prefill.c), against the whole
 * ps_forward over the same tokens.
 *
 * Property (random small select configs, seeded): a prompt prefilled in one append, then one token at a time
 * to lengths chosen to include T mod S = S − 1, T just below / at / above a block boundary and (with
 * dense_len) the crossing of dense_len: at every decode step the last row's logits equal the last row of a
 * whole forward over the same tokens (within TOL of max|ref|), and the blocks the cache chose for it (its
 * hook_blocks, every layer) equal the whole forward's last-row blocks; the number of pooled keys is the number
 * of complete windows. One append of many rows (steps of 5 and 32 rows, and plain_attention) = the whole
 * forward at every row; the chunked prefill in chunks of 1, 3, 7 and T the same (sparse, dense, window = stride),
 * and on cpu-staged (the selection ops on buffers the host may not read between ops) the cpu's logits bit for bit.
 * Fork + truncate: a fork truncated into the middle of a window and grown another way equals the forward
 * of its own tokens, the source is untouched, and a truncation followed by the same tokens again gives the
 * same logits. dense_len: a decode that crosses it equals the whole forward while the rows before it select
 * every block anyway (dense_len <= slots·block); with a larger dense_len the dense steps equal whole forwards,
 * the sparse ones keep the dense rows' keys (docs/kvcache.md) yet layer 0 still chooses the whole forward's
 * blocks. The bytes per token (the slope of the measured bytes) against ps_kvcache_bytes_per_token, pooled
 * keys included. Bad inputs: no cache points on a select model.
 *
 * Decode runs use windows K > S (a whole forward's row t then does not depend on the tokens after it); with K = S
 * a row at a block's last position may choose differently in a longer forward (docs/kvcache.md), so there only
 * one append and the chunked prefill are compared. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/forward.h"
#include "core/kvcache.h"
#include "core/prefill.h"
#include "core/select.h"
#include "testutil.h"

#define TOL 1e-4

static double worst_decode = 0, worst_prefill = 0, worst_append = 0;

static ps_config sel_config(int64_t K, int64_t S, int64_t Bk, int64_t topk, int64_t I, int64_t Lb, int64_t dense_len) {
    ps_config c = tu_config(PS_ATTN_FULL);
    c.kind = PS_ATTN_SELECT;
    c.n_layers = 2;
    c.max_seq_len = 4096;
    c.window = K, c.stride = S, c.block = Bk, c.topk = topk, c.init_blocks = I, c.local_blocks = Lb, c.dense_len = dense_len;
    return c;
}

/* The whole forward over tok[0, T): logits [T, V] and each layer's last-row blocks [n_layers, nkv, ns]. */
static float *whole(const ps_model *m, const int32_t *tok, int64_t T, float *blocks_last) {
    const ps_config *c = &m->cfg;
    ps_error err;
    ps_acts a;
    ps_select_cfg sc = ps_config_select(c);
    int64_t V = c->vocab_size, ns = ps_select_slots(&sc), nkv = c->n_kv_heads;
    if (ps_acts_create(&a, m->ctx, c, 1, T, true, &err) || ps_forward(m, &a, tok, NULL, &err)) {
        CHECK(0, "whole forward of %lld tokens: %s", (long long)T, err.msg);
        return NULL;
    }
    float *lg = malloc((size_t)(T * V) * sizeof *lg);
    memcpy(lg, a.p.logits, (size_t)(T * V) * sizeof *lg);
    for (int l = 0; blocks_last && l < c->n_layers; l++) {
        ps_act_ptrs p = ps_acts_layer(&a, l);
        if (ps_select_sparse(c, T)) memcpy(blocks_last + l * nkv * ns, p.sel_blocks + (T - 1) * nkv * ns, (size_t)(nkv * ns) * sizeof(float));
        else
            for (int64_t i = 0; i < nkv * ns; i++) blocks_last[l * nkv * ns + i] = -2; /* dense: none */
    }
    ps_acts_free(&a);
    return lg;
}

/* hook_blocks during an append: the last row's blocks of every layer ([n_layers, nkv, ns]) */
typedef struct {
    float *blocks;
    int64_t width; /* nkv * ns */
    int fired;
} blocks_tap;

static int tap_blocks(const ps_hook_event *ev, void *user, ps_error *err) {
    (void)err;
    blocks_tap *b = user;
    int64_t n = ev->shape[1];
    memcpy(b->blocks + ev->layer * b->width, ev->data + (n - 1) * b->width, (size_t)b->width * sizeof(float));
    b->fired |= 1 << ev->layer;
    return 0;
}

/* A prompt of P tokens in one append, then decode to T_end one token at a time, each step against the whole forward. */
static void decode_run(const char *label, const ps_config *c, uint64_t seed, int64_t P, int64_t T_end, int check_blocks_all_layers,
                       double *dense_worst, double *sparse_worst, int *layer0_blocks_ok) {
    ps_error err;
    ps_model m;
    tu_random_model(&m, c, seed, 0.5f);
    ps_select_cfg sc = ps_config_select(c);
    int64_t V = c->vocab_size, nkv = c->n_kv_heads, ns = ps_select_slots(&sc), nl = c->n_layers, w = nkv * ns;
    int32_t *tok = malloc((size_t)T_end * sizeof *tok);
    tu_random_tokens(tok, T_end, V, seed + 7);
    ps_kvcache kv;
    ps_kvcache_opts o = {.chunk = 8};
    REQUIRE_OK(ps_kvcache_create(&kv, &m, &o, &err), &err);
    ps_hooks h;
    ps_hooks_init(&h);
    float *got = malloc((size_t)(nl * w) * sizeof *got), *want = malloc((size_t)(nl * w) * sizeof *want);
    blocks_tap tap = {.blocks = got, .width = w};
    char name[64];
    for (int l = 0; l < nl; l++) {
        snprintf(name, sizeof name, "blocks.%d.attn.hook_blocks", l);
        CHECK_OK(ps_hooks_add(&h, c, name, tap_blocks, &tap, &err), &err);
    }
    int s = ps_kvcache_add(&kv, &err);
    float *row = malloc((size_t)V * sizeof *row);
    int64_t blocks_bad = 0, steps = 0;
    for (int64_t L = P; L <= T_end; L++) {
        int64_t n = L == P ? P : 1;
        tap.fired = 0;
        if (ps_kvcache_append(&kv, 1, &s, &n, tok + L - n, &h, row, true, &err)) {
            CHECK(0, "%s: append to %lld: %s", label, (long long)L, err.msg);
            break;
        }
        float *ref = whole(&m, tok, L, want);
        if (!ref) break;
        double e = tu_row_rel(row, ref + (L - 1) * V, V);
        int sparse_now = ps_select_sparse(c, L);
        if (dense_worst && !sparse_now) *dense_worst = fmax(*dense_worst, e);
        else if (sparse_worst && sparse_now) *sparse_worst = fmax(*sparse_worst, e);
        else {
            worst_decode = fmax(worst_decode, e);
            CHECK(e < TOL, "%s: decode row at length %lld: rel err %.3g", label, (long long)L, e);
        }
        if (sparse_now) {
            CHECK(tap.fired == (1 << nl) - 1, "%s: hook_blocks fired on every layer at length %lld (%d)", label, (long long)L, tap.fired);
            int64_t upto = check_blocks_all_layers ? nl * w : w; /* layer 0 only after a dense prefix */
            for (int64_t i = 0; i < upto; i++) blocks_bad += got[i] != want[i];
            if (layer0_blocks_ok)
                for (int64_t i = 0; i < w; i++) *layer0_blocks_ok &= got[i] == want[i];
            steps++;
        } else
            CHECK(tap.fired == 0, "%s: hook_blocks does not fire on the dense path (length %lld)", label, (long long)L);
        /* the pooled keys: one per complete window of each level */
        for (int l = 0; l < nl; l++)
            if (kv.seqs[s].layers[l].k1->rows != ps_select_n_windows(L, c->window, c->stride) ||
                kv.seqs[s].layers[l].k2->rows != ps_select_n_windows(L, 4 * c->window, 4 * c->stride))
                blocks_bad += 1000;
        free(ref);
    }
    CHECK(blocks_bad == 0, "%s: the cache's blocks (hook_blocks) and pooled-key counts = the whole forward's (%lld mismatches over %lld steps)",
          label, (long long)blocks_bad, (long long)steps);
    free(row), free(got), free(want), free(tok);
    ps_hooks_free(&h);
    ps_kvcache_free(&kv);
    ps_model_free(&m);
}

static void test_decode_property(void) {
    struct {
        int64_t K, S, Bk, topk, I, Lb;
    } geo[] = {{4, 2, 4, 2, 1, 1}, {6, 2, 8, 1, 0, 1}, {8, 4, 8, 3, 1, 1}, {3, 1, 4, 2, 1, 0}};
    for (int g = 0; g < 4; g++) {
        ps_config c = sel_config(geo[g].K, geo[g].S, geo[g].Bk, geo[g].topk, geo[g].I, geo[g].Lb, 0);
        int64_t Bk = geo[g].Bk, S = geo[g].S;
        /* prompts ending at T mod S = S - 1, just below / at / above a block boundary; decode well past
         * (topk + Lb + 2) blocks so that rows leave blocks out */
        int64_t prompts[] = {3 * S - 1, 4 * Bk - 1, 4 * Bk, 4 * Bk + 1};
        for (int pi = 0; pi < 4; pi++) {
            char label[96];
            snprintf(label, sizeof label, "K%lld S%lld B%lld prompt %lld", (long long)geo[g].K, (long long)S, (long long)Bk,
                     (long long)prompts[pi]);
            int64_t T_end = (geo[g].topk + geo[g].Lb + 3) * Bk + 3 + pi;
            decode_run(label, &c, 100 + (uint64_t)(g * 10 + pi), prompts[pi], T_end, 1, NULL, NULL, NULL);
        }
    }
}

/* One append of many rows (steps of 5 rows) = the whole forward at every row; the chunked prefill the same. */
static void test_append_and_prefill(void) {
    ps_error err;
    for (int dl = 0; dl < 3; dl++) {
        /* 0: sparse; 1: dense (T < dense_len); 2: window = stride (one append still chooses among the blocks of its
         * final length, as the forward does) */
        ps_config c = dl == 2 ? sel_config(4, 4, 8, 2, 1, 1, 0) : sel_config(4, 2, 4, 2, 1, 1, dl ? 1000 : 0);
        const char *what = dl == 2 ? "K = S" : dl ? "dense" : "sparse";
        ps_model m;
        tu_random_model(&m, &c, 31 + (uint64_t)dl, 0.5f);
        int64_t T = 57, V = c.vocab_size;
        int32_t tok[57];
        tu_random_tokens(tok, T, V, 32);
        float *ref = whole(&m, tok, T, NULL), *lg = malloc((size_t)(T * V) * sizeof *lg);
        if (!ref) return;
        double e;
        /* steps of 5 rows (each row over its gathered selected keys), steps of 32 (a frame of every key), and
         * plain_attention (every row alone) */
        for (int v = 0; v < 3; v++) {
            ps_kvcache kv;
            ps_kvcache_opts o = {.chunk = v == 1 ? 32 : 5, .plain_attention = v == 2};
            CHECK_OK(ps_kvcache_create(&kv, &m, &o, &err), &err);
            int s = ps_kvcache_add(&kv, &err);
            CHECK_OK(ps_kvcache_append(&kv, 1, &s, &T, tok, NULL, lg, false, &err), &err);
            e = tu_rows_rel(lg, ref, T, V);
            worst_append = fmax(worst_append, e);
            CHECK(e < TOL, "%s: one append of %lld rows (variant %d) = the whole forward (%.3g)", what, (long long)T, v, e);
            ps_kvcache_free(&kv);
        }
        int64_t pos[57];
        for (int64_t t = 0; t < T; t++) pos[t] = t;
        int64_t chunks[] = {1, 3, 7, T};
        for (int k = 0; k < 4; k++) {
            ps_prefill p;
            if (ps_prefill_create(&p, &m, T, chunks[k], &err)) {
                CHECK(0, "prefill create: %s", err.msg);
                continue;
            }
            CHECK_OK(ps_prefill_logits(&p, tok, T, pos, T, lg, &err), &err);
            e = tu_rows_rel(lg, ref, T, V);
            worst_prefill = fmax(worst_prefill, e);
            CHECK(e < TOL, "%s: prefill in chunks of %lld = the whole forward (%.3g)", what, (long long)chunks[k], e);
            /* a shorter prompt on the same state (dense_len decided by its own length) */
            float *ref2 = whole(&m, tok, 30, NULL);
            CHECK_OK(ps_prefill_logits(&p, tok, 30, pos, 30, lg, &err), &err);
            if (ref2) CHECK(tu_rows_rel(lg, ref2, 30, V) < TOL, "prefill of 30 tokens on a state for %lld", (long long)T);
            free(ref2);
            ps_prefill_free(&p);
        }
        /* the chunked prefill on cpu-staged (the selection through the ops of core/ops.h, on buffers the host may
         * not read between ops): the cpu's logits bit for bit */
        ps_model ms;
        ps_prefill p1, p2;
        float *lc = malloc((size_t)(T * V) * sizeof *lc);
        tu_random_model(&ms, &c, 31 + (uint64_t)dl, 0.5f);
        if (ps_model_to_backend(&ms, "cpu-staged", &err) || ps_prefill_create(&p1, &m, T, 7, &err)) {
            CHECK(0, "%s: prefill on cpu-staged: %s", what, err.msg);
        } else {
            if (ps_prefill_create(&p2, &ms, T, 7, &err)) CHECK(0, "%s: prefill on cpu-staged: %s", what, err.msg);
            else {
                CHECK_OK(ps_prefill_logits(&p1, tok, T, pos, T, lc, &err) || ps_prefill_logits(&p2, tok, T, pos, T, lg, &err), &err);
                CHECK(!memcmp(lc, lg, (size_t)(T * V) * sizeof *lg), "%s: prefill on cpu-staged = on the cpu, bit for bit", what);
                ps_prefill_free(&p2);
            }
            ps_prefill_free(&p1);
        }
        ps_model_free(&ms);
        free(lc);
        free(lg), free(ref);
        ps_model_free(&m);
    }
}

static void test_fork_truncate(void) {
    ps_error err;
    ps_config c = sel_config(4, 2, 4, 2, 1, 1, 0);
    ps_model m;
    tu_random_model(&m, &c, 41, 0.5f);
    int64_t V = c.vocab_size, T1 = 45, T0 = 29, more = 14; /* T0 = 29: inside a level-1 and a level-2 window */
    int32_t a[64], b[64];
    tu_random_tokens(a, 64, V, 42);
    memcpy(b, a, sizeof b);
    tu_random_tokens(b + T0, 64 - T0, V, 43);
    ps_kvcache kv;
    CHECK_OK(ps_kvcache_create(&kv, &m, NULL, &err), &err);
    int s = ps_kvcache_add(&kv, &err);
    CHECK_OK(ps_kvcache_append(&kv, 1, &s, &T1, a, NULL, NULL, false, &err), &err);
    int f = ps_kvcache_fork(&kv, s, &err);
    CHECK(f >= 0, "fork: %s", err.msg);
    CHECK_OK(ps_kvcache_truncate(&kv, f, T0, &err), &err);
    CHECK(kv.seqs[f].layers[1].k1->rows == ps_select_n_windows(T0, 4, 2) && kv.seqs[f].layers[1].k2->rows == ps_select_n_windows(T0, 16, 8),
          "truncate keeps the pooled keys of the windows complete in %lld tokens (%lld, %lld)", (long long)T0,
          (long long)kv.seqs[f].layers[1].k1->rows, (long long)kv.seqs[f].layers[1].k2->rows);
    float *lg = malloc((size_t)(more * V) * sizeof *lg);
    /* the fork grows another way, one token at a time */
    double wf = 0, ws = 0, wr = 0;
    float *rb = whole(&m, b, T0 + more, NULL), *ra = whole(&m, a, T1 + more, NULL);
    for (int64_t t = 0; t < more && rb && ra; t++) {
        int64_t one = 1;
        CHECK_OK(ps_kvcache_append(&kv, 1, &f, &one, b + T0 + t, NULL, lg, true, &err), &err);
        wf = fmax(wf, tu_row_rel(lg, rb + (T0 + t) * V, V));
        CHECK_OK(ps_kvcache_append(&kv, 1, &s, &one, a + T1 + t, NULL, lg, true, &err), &err);
        ws = fmax(ws, tu_row_rel(lg, ra + (T1 + t) * V, V));
    }
    CHECK(wf < TOL && ws < TOL, "fork truncated to %lld and grown = its forward (%.3g); the source untouched (%.3g)", (long long)T0, wf, ws);
    /* truncate the source back and append the same tokens: the same logits */
    int64_t back = T1 - 9, n = 9 + more;
    CHECK_OK(ps_kvcache_truncate(&kv, s, back, &err), &err);
    float *lg2 = malloc((size_t)(n * V) * sizeof *lg2);
    CHECK_OK(ps_kvcache_append(&kv, 1, &s, &n, a + back, NULL, lg2, false, &err), &err);
    for (int64_t t = 0; t < n && ra; t++) wr = fmax(wr, tu_row_rel(lg2 + t * V, ra + (back + t) * V, V));
    CHECK(wr < TOL, "truncate back 9 tokens and append them again (and %lld more) = the forward (%.3g)", (long long)more, wr);
    /* bad inputs: no cache points on a select model */
    int layer, value;
    CHECK_ERR(ps_kvcache_point_parse(&c, "blocks.0.attn.cache_ck", &layer, &value, &err), &err, "select", "no entries");
    float e[4];
    CHECK_ERR(ps_kvcache_entry(&kv, s, 0, 0, 0, 0, e, &err), &err, "select");
    CHECK_ERR(ps_kvcache_edit(&kv, -1, 0, 0, 0, 0, PS_KV_EDIT_ZERO, NULL, &err), &err, "select");
    free(lg), free(lg2), free(ra), free(rb);
    ps_kvcache_free(&kv);
    ps_model_free(&m);
}

/* dense_len: a decode crossing it. */
static void test_dense_len(void) {
    /* slots·block = 3·4 = 12 >= dense_len 10: the rows before it select every block on either path */
    ps_config c = sel_config(4, 2, 4, 2, 1, 1, 10);
    decode_run("dense_len 10 (<= slots·block)", &c, 51, 6, 40, 1, NULL, NULL, NULL);
    /* dense_len 30 > 12: dense steps (length < 30) = whole forwards; sparse steps keep the keys of the dense rows
     * (differ from a whole forward), but layer 0 (keys from the embeddings alone) picks the same blocks */
    c.dense_len = 30;
    double dw = 0, sw = 0;
    int l0 = 1;
    decode_run("dense_len 30", &c, 52, 20, 44, 0, &dw, &sw, &l0);
    CHECK(dw < TOL && sw > 1e-3 && l0,
          "crossing dense_len 30: dense steps = whole forwards (%.3g); sparse steps keep the dense rows (differ by %.3g); layer 0 blocks equal (%d)",
          dw, sw, l0);
}

/* Bytes per token: the slope of the measured bytes between two lengths (whole pages) against the formula. */
static void test_bytes(void) {
    ps_error err;
    ps_config c = sel_config(4, 2, 4, 2, 1, 1, 0);
    ps_model m;
    tu_random_model(&m, &c, 61, 0.5f);
    int64_t n1 = 1024, n2 = 2048;
    int32_t *tok = malloc((size_t)(n1 + n2) * sizeof *tok);
    tu_random_tokens(tok, n1 + n2, c.vocab_size, 62);
    ps_kvcache kv;
    CHECK_OK(ps_kvcache_create(&kv, &m, NULL, &err), &err);
    int s = ps_kvcache_add(&kv, &err);
    CHECK_OK(ps_kvcache_append(&kv, 1, &s, &n1, tok, NULL, NULL, false, &err), &err);
    int64_t b1 = ps_kvcache_bytes(&kv);
    CHECK_OK(ps_kvcache_append(&kv, 1, &s, &n2, tok + n1, NULL, NULL, false, &err), &err);
    int64_t b2 = ps_kvcache_bytes(&kv);
    double per = (double)(b2 - b1) / (double)n2, want = ps_kvcache_bytes_per_token(&c),
           raw = (double)c.n_layers * 2.0 * (double)(c.n_kv_heads * c.head_dim) * 4.0;
    CHECK(fabs(per - want) < 0.03 * want && want > raw * 1.2,
          "bytes per token measured %.1f, stated %.1f (raw k, v alone %.1f: the pooled keys count)", per, want, raw);
    CHECK(ps_kvcache_fixed_bytes(&c) == 0, "no fixed part");
    free(tok);
    ps_kvcache_free(&kv);
    ps_model_free(&m);
}

int main(void) {
    test_decode_property();
    test_append_and_prefill();
    test_fork_truncate();
    test_dense_len();
    test_bytes();
    printf("worst rel err: decode %.3g, one append %.3g, chunked prefill %.3g (TOL %.0e)\n", worst_decode, worst_append, worst_prefill, TOL);
    CHECK_DONE();
}
