/* test_kvcache.c — the KV cache (core/kvcache.h) against the whole-sequence ps_forward.
 *
 * Property: for random configs (seeded) of every attention kind the cache supports — full; compressed W/S
 * with S <= W (overlapping windows), learned or uniform gates, per-offset or shared payloads, RoPE and
 * qk-norm on or off, local windows shorter and longer than W; staggered grids, per-layer grids; content-defined chunks —
 * a batch of sequences of different lengths grown by appends of random sizes (1 token, or chunks whose
 * ends fall anywhere in a window; steps of a few rows so appends are split too) gives at every appended
 * position the logits of ps_forward on the whole sequence at that position, within TOL of max|ref| of
 * that row. TOL: the cache computes the same float32 formulas, but the sums run in another order (the
 * matrix products over fewer rows, the attention without the forward's blocking, the compressor as plain
 * loops) — measured differences are ~1e-6 of the logits' scale; 1e-4 is SPEC's bound for logits.
 *
 * Plain reference for the contents: after every append, each compressed entry (ck, cv of every layer and
 * KV head) the cache holds equals the forward's hook_ck / hook_cv entry of the same index, and the
 * number of entries is the number of windows (chunks) that have ended.
 *
 * Also: fork (shared pages, copy on write) and truncate; the bytes per token against `info`'s formula
 * (the slope of the measured bytes); hooks during appends (hook_ck firing at each window's close with
 * its index; a head-zeroing action on hook_v gives the forward's logits under the same action); cache
 * edits (zeroing entry j of head g from some step on = the forward with entry j zeroed, for the positions
 * after the edit); generation (greedy = argmax of the forward on the growing sequence); bad inputs; one run
 * past 128K tokens (about 10 s on one core). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/forward.h"
#include "core/generate.h"
#include "core/kvcache.h"
#include "core/rng.h"
#include "testutil.h"

#define TOL 1e-4

static double worst_logits = 0, worst_entries = 0;

typedef struct {
    ps_acts a;
    int32_t *tok;
    int64_t T;
} ref_seq;

static void ref_run(ref_seq *r, const ps_model *m, const ps_config *c, const int32_t *tok, int64_t T, const ps_hooks *hooks) {
    ps_error err;
    r->T = T;
    r->tok = malloc((size_t)T * sizeof *r->tok);
    memcpy(r->tok, tok, (size_t)T * sizeof *tok);
    CHECK_OK(ps_acts_create(&r->a, m->ctx, c, 1, T, true, &err), &err);
    CHECK_OK(ps_forward(m, &r->a, r->tok, hooks, &err), &err);
}

static void ref_free(ref_seq *r) {
    ps_acts_free(&r->a);
    free(r->tok);
}

/* The cache's entries of sequence s against the forward's at length T (entries ended by T - 1). */
static void check_entries(const char *label, const ps_kvcache *kv, int s, const ps_config *c, ref_seq *r, int64_t T) {
    if (c->kind == PS_ATTN_FULL) return;
    int chn = c->kind == PS_ATTN_CHANNEL; /* one K = V head, entries every `rate` tokens, no cv */
    ps_error err;
    int64_t nkv = chn ? 1 : c->n_kv_heads, hd = c->head_dim, nW = r->a.nW;
    float got[64];
    double worst = 0;
    int count_ok = 1;
    for (int l = 0; l < c->n_layers; l++) {
        ps_act_ptrs p = ps_acts_layer(&r->a, l);
        for (int v = 0; v < 2 - chn; v++) {
            /* per tensor (SPEC's measure): max |cache - forward| over the entries held / max |forward| of the tensor */
            const float *ref = v ? p.cv : p.ck;
            double num = 0, den = 0;
            for (int64_t i = 0; i < nW * nkv * hd; i++) den = fmax(den, fabs((double)ref[i]));
            for (int64_t g = 0; g < nkv; g++) {
                int64_t want = 0;
                for (int64_t j = 0; j < nW; j++) {
                    int64_t end = chn ? (j + 1) * c->rate - 1
                                      : r->a.cend ? r->a.cend[j] : j * c->stride + ps_config_grid_offset(c, l, g) + c->window - 1;
                    if (end <= T - 1) want++;
                }
                int64_t have = ps_kvcache_n_entries(kv, s, l, (int)g);
                if (have != want) count_ok = 0;
                for (int64_t j = 0; j < have && j < want; j++) {
                    if (ps_kvcache_entry(kv, s, l, (int)g, v, j, got, &err)) {
                        count_ok = 0;
                        continue;
                    }
                    for (int64_t e = 0; e < hd; e++) num = fmax(num, fabs((double)got[e] - ref[(j * nkv + g) * hd + e]));
                }
            }
            double e = den > 0 ? num / den : num;
            worst = e > worst ? e : worst;
        }
    }
    CHECK(count_ok, "%s T=%lld: the cache holds another number of entries than the windows ended", label, (long long)T);
    CHECK(worst < TOL, "%s T=%lld: cache entries differ from the forward's by %.3g", label, (long long)T, worst);
    worst_entries = worst > worst_entries ? worst : worst_entries;
}

/* A random config of one kind (0 full, 1 compressed grid, 2 staggered grid, 3 content chunks, 4 the channel
 * attention: one K = V head, CSA or HCA, rate 2..6). */
static ps_config random_config(ps_rng *g, int kind) {
    ps_config c = tu_config(kind == 4 ? PS_ATTN_CHANNEL : kind ? PS_ATTN_COMPRESSED : PS_ATTN_FULL);
    c.n_layers = 2;
    c.n_kv_heads = ps_rng_below(g, 2) ? 2 : 4;
    c.n_heads = c.n_kv_heads * (1 + ps_rng_below(g, 2));
    c.rope = ps_rng_below(g, 4) != 0;
    c.qk_norm = ps_rng_below(g, 4) != 0;
    if (!kind) return c;
    if (kind == 4) {
        c.n_kv_heads = 1;
        c.n_heads = 1 + ps_rng_below(g, 3);
        c.head_dim = 4 + 2 * ps_rng_below(g, 3);
        c.rate = 2 + ps_rng_below(g, 5);
        c.v4_mode = ps_rng_below(g, 2) ? PS_V4_MODE_CSA : PS_V4_MODE_HCA;
        c.local_window = 1 + ps_rng_below(g, 9);
        return c;
    }
    c.window = 2 + ps_rng_below(g, 8);
    c.stride = 1 + ps_rng_below(g, c.window);
    c.local_window = 1 + ps_rng_below(g, c.window + 3);
    c.gate = ps_rng_below(g, 4) ? PS_GATE_LEARNED : PS_GATE_UNIFORM;
    c.payload = ps_rng_below(g, 4) ? PS_PAYLOAD_PER_OFFSET : PS_PAYLOAD_SHARED;
    if (kind == 2) {
        c.n_grid_offsets = c.n_kv_heads;
        c.any_head_offset = false;
        for (int64_t h = 0; h < c.n_kv_heads; h++) {
            c.head_offsets[h] = ps_rng_below(g, c.stride);
            if (c.head_offsets[h]) c.any_head_offset = true;
        }
        if (!c.any_head_offset && c.stride > 1) c.head_offsets[1] = 1, c.any_head_offset = true;
    }
    if (kind == 3) {
        c.window = 4 + ps_rng_below(g, 6);
        c.stride = 2 + ps_rng_below(g, c.window - 2);
        c.chunk_min = 1 + ps_rng_below(g, c.stride - 1);
        c.local_window = 1 + ps_rng_below(g, c.window + 3);
        c.boundaries = PS_BOUNDARIES_CONTENT;
    }
    return c;
}

/* A batch of nb sequences (lengths T[i]) grown by random appends; every appended position checked. */
static void property_run(const char *label, ps_config c, uint64_t seed, int nb, const int64_t *T, int64_t step_rows,
                         int one_token) {
    ps_rng g;
    ps_rng_seed(&g, seed);
    int64_t Tmax = 0;
    for (int i = 0; i < nb; i++) Tmax = T[i] > Tmax ? T[i] : Tmax;
    c.max_seq_len = Tmax;
    ps_model m;
    tu_random_model(&m, &c, seed + 1, 0.4f);
    ps_error err;
    int64_t V = c.vocab_size;
    CHECK(nb >= 1 && nb <= 8, "property_run: %d sequences (1..8)", nb);
    if (nb < 1 || nb > 8) return; /* (ids[8] below) */
    ref_seq *ref = calloc((size_t)nb, sizeof *ref);
    int32_t **tok = calloc((size_t)nb, sizeof *tok);
    for (int i = 0; i < nb; i++) {
        tok[i] = malloc((size_t)T[i] * sizeof(int32_t));
        tu_random_tokens(tok[i], T[i], V, seed * 7 + (uint64_t)i);
        ref_run(&ref[i], &m, &c, tok[i], T[i], NULL);
    }
    ps_kvcache kv;
    ps_kvcache_opts o = {.chunk = step_rows};
    REQUIRE_OK(ps_kvcache_create(&kv, &m, &o, &err), &err);
    int ids[8];
    for (int i = 0; i < nb; i++) ids[i] = ps_kvcache_add(&kv, &err);
    int64_t *done = calloc((size_t)nb, sizeof *done), *n = calloc((size_t)nb, sizeof *n);
    int32_t *buf = malloc((size_t)(Tmax * nb) * sizeof(int32_t));
    float *lg = malloc((size_t)(Tmax * nb * V) * sizeof(float));
    double worst = 0;
    int rounds = 0;
    for (;;) {
        int act[8], na = 0;
        int64_t off = 0;
        int64_t nn[8];
        for (int i = 0; i < nb; i++) {
            if (done[i] == T[i]) continue;
            int64_t k = one_token ? 1 : 1 + ps_rng_below(&g, 3 * c.window + 2);
            if (!one_token && ps_rng_below(&g, 5) == 0) k = 1 + ps_rng_below(&g, 200); /* a long append now and then */
            if (k > T[i] - done[i]) k = T[i] - done[i];
            memcpy(buf + off, tok[i] + done[i], (size_t)k * sizeof(int32_t));
            act[na] = ids[i];
            nn[na++] = k;
            n[i] = k;
            off += k;
        }
        if (!na) break;
        if (ps_kvcache_append(&kv, na, act, nn, buf, NULL, lg, false, &err)) {
            CHECK_OK(-1, &err);
            break;
        }
        rounds++;
        int64_t row = 0;
        for (int i = 0; i < nb; i++) {
            if (done[i] == T[i]) continue;
            for (int64_t t = done[i]; t < done[i] + n[i]; t++, row++) {
                double e = tu_row_rel(lg + row * V, ref[i].a.p.logits + t * V, V);
                worst = e > worst ? e : worst;
            }
            done[i] += n[i];
            CHECK(ps_kvcache_len(&kv, ids[i]) == done[i], "%s: length %lld after the append, expected %lld", label,
                  (long long)ps_kvcache_len(&kv, ids[i]), (long long)done[i]);
            if (rounds % 7 == 1 || done[i] == T[i]) check_entries(label, &kv, ids[i], &c, &ref[i], done[i]);
        }
    }
    CHECK(worst < TOL, "%s: appended logits differ from the whole-sequence forward by %.3g (relative)", label, worst);
    worst_logits = worst > worst_logits ? worst : worst_logits;
    ps_kvcache_free(&kv);
    for (int i = 0; i < nb; i++) {
        ref_free(&ref[i]);
        free(tok[i]);
    }
    free(ref), free(tok), free(done), free(n), free(buf), free(lg);
    ps_model_free(&m);
}

static void test_property(void) {
    const char *kinds[] = {"full", "compressed", "staggered", "content", "channel"};
    ps_rng g;
    ps_rng_seed(&g, 2026);
    for (int kind = 0; kind < 5; kind++) {
        double before = worst_logits;
        worst_logits = 0;
        for (int rep = 0; rep < 6; rep++) {
            ps_config c = random_config(&g, kind);
            char label[160];
            snprintf(label, sizeof label, "%s rep %d (W%lld S%lld LW%lld m%lld rate%lld mode%d nkv%lld nh%lld rope%d qkn%d gate%d payload%d)",
                     kinds[kind], rep, (long long)c.window, (long long)c.stride, (long long)c.local_window, (long long)c.chunk_min,
                     (long long)c.rate, (int)c.v4_mode,
                     (long long)c.n_kv_heads, (long long)c.n_heads, c.rope, c.qk_norm, (int)c.gate, (int)c.payload);
            int64_t T[3] = {1 + ps_rng_below(&g, 300), 1 + ps_rng_below(&g, 120), 1};
            int64_t rows = rep % 3 == 0 ? 5 : rep % 3 == 1 ? 64 : 256;
            property_run(label, c, 100 + (uint64_t)rep + 10 * (uint64_t)kind, 3, T, rows, rep == 1);
        }
        /* one longer sequence of each kind */
        ps_config c = random_config(&g, kind);
        int64_t T[1] = {kind == 0 ? 1500 : 3000};
        property_run(kinds[kind], c, 77 + (uint64_t)kind, 1, T, 128, 0);
        printf("  %-10s max relative logit error %.3g\n", kinds[kind], worst_logits);
        worst_logits = worst_logits > before ? worst_logits : before;
    }
    printf("  entries    max relative error %.3g\n", worst_entries);
}

/* Per-layer grids: appends of random lengths against the whole-sequence forward (logits and every cached entry,
 * whose count follows each layer's own grid). */
static void test_layer_offsets(void) {
    ps_rng g;
    ps_rng_seed(&g, 2027);
    double before = worst_logits;
    worst_logits = 0;
    for (int rep = 0; rep < 4; rep++) {
        ps_config c = random_config(&g, 1);
        int64_t o[2 * PS_MAX_GRID_HEADS];
        for (int64_t i = 0; i < 2 * c.n_kv_heads; i++) o[i] = ps_rng_below(&g, c.stride);
        if (c.stride > 1) o[c.n_kv_heads] = (o[0] + 1) % c.stride; /* the layers differ */
        ps_error err;
        REQUIRE_OK(ps_config_set_grid_offsets(&c, o, 2, &err), &err);
        char label[160];
        snprintf(label, sizeof label, "per-layer rep %d (W%lld S%lld LW%lld nkv%lld nh%lld)", rep, (long long)c.window,
                 (long long)c.stride, (long long)c.local_window, (long long)c.n_kv_heads, (long long)c.n_heads);
        int64_t T[2] = {1 + ps_rng_below(&g, 200), 1 + ps_rng_below(&g, 80)};
        property_run(label, c, 500 + (uint64_t)rep, 2, T, rep % 2 ? 5 : 64, rep == 3);
    }
    printf("  per-layer  max relative logit error %.3g\n", worst_logits);
    worst_logits = worst_logits > before ? worst_logits : before;
}

/* fork shares the prefix; both branches equal their own whole-sequence forward; truncate goes back. */
static void test_fork_truncate(void) {
    /* kind 0 full, 1 compressed W8/S4, 2 content chunks, 3 the channel attention (CSA, rate 4), 4 a per-layer grid
     * (W8/S4: layer 0's offsets g mod 4, layer 1's moved by 1) */
    for (int kind = 0; kind < 5; kind++) {
        ps_config c = tu_config(kind == 3 ? PS_ATTN_CHANNEL : kind ? PS_ATTN_COMPRESSED : PS_ATTN_FULL);
        c.n_layers = 2, c.window = 8, c.stride = 4, c.local_window = 6, c.max_seq_len = 400;
        if (kind == 2) c.boundaries = PS_BOUNDARIES_CONTENT, c.chunk_min = 2;
        if (kind == 3) c.n_kv_heads = 1, c.rate = 4, c.v4_mode = PS_V4_MODE_CSA;
        ps_error err;
        if (kind == 4) {
            int64_t o[2 * PS_MAX_GRID_HEADS];
            for (int64_t l = 0; l < 2; l++)
                for (int64_t g = 0; g < c.n_kv_heads; g++) o[l * c.n_kv_heads + g] = (g + l) % 4;
            REQUIRE_OK(ps_config_set_grid_offsets(&c, o, 2, &err), &err);
        }
        ps_model m;
        tu_random_model(&m, &c, 5, 0.4f);
        int64_t V = c.vocab_size, P = 150, A = 90;
        int32_t tok[2][400];
        tu_random_tokens(tok[0], 400, V, 9);
        memcpy(tok[1], tok[0], sizeof tok[0]);
        tu_random_tokens(tok[1] + P, 400 - P, V, 10); /* same prefix, another continuation */
        ref_seq r0, r1;
        ref_run(&r0, &m, &c, tok[0], P + A, NULL);
        ref_run(&r1, &m, &c, tok[1], P + A, NULL);
        ps_kvcache kv;
        ps_kvcache_opts o = {.chunk = 32, .history = 40};
        REQUIRE_OK(ps_kvcache_create(&kv, &m, &o, &err), &err);
        int a = ps_kvcache_add(&kv, &err);
        int64_t nP = P;
        CHECK_OK(ps_kvcache_append(&kv, 1, &a, &nP, tok[0], NULL, NULL, false, &err), &err);
        int64_t shared_bytes = kv.page_bytes_live;
        int b = ps_kvcache_fork(&kv, a, &err);
        CHECK(b >= 0 && kv.page_bytes_live == shared_bytes, "fork copies no page (%lld -> %lld bytes)", (long long)shared_bytes,
              (long long)kv.page_bytes_live);
        float *lg = malloc((size_t)(2 * A * V) * sizeof(float));
        int ids[2] = {a, b};
        int64_t nn[2] = {A, A};
        int32_t cat[2 * 90];
        memcpy(cat, tok[0] + P, (size_t)A * sizeof(int32_t));
        memcpy(cat + A, tok[1] + P, (size_t)A * sizeof(int32_t));
        CHECK_OK(ps_kvcache_append(&kv, 2, ids, nn, cat, NULL, lg, false, &err), &err);
        double worst = 0;
        for (int64_t t = 0; t < A; t++) {
            double e0 = tu_row_rel(lg + t * V, r0.a.p.logits + (P + t) * V, V), e1 = tu_row_rel(lg + (A + t) * V, r1.a.p.logits + (P + t) * V, V);
            worst = fmax(worst, fmax(e0, e1));
        }
        CHECK(worst < TOL, "kind %d: forked branches differ from their forwards by %.3g", kind, worst);
        CHECK(kv.n_page_copies > 0 && kv.n_page_copies <= 4 * c.n_layers * (2 + 2 * c.n_kv_heads + 1),
              "kind %d: copy on write copied %lld pages (the shared last pages only)", kind, (long long)kv.n_page_copies);
        check_entries("fork a", &kv, a, &c, &r0, P + A);
        check_entries("fork b", &kv, b, &c, &r1, P + A);
        /* truncate b back by 30 and continue it with a's tokens: then it is sequence 0 again */
        CHECK_OK(ps_kvcache_truncate(&kv, b, P + A - 30, &err), &err);
        check_entries("truncated b", &kv, b, &c, &r1, P + A - 30);
        /* full attention: back to the shared prefix and on with a's tokens (b becomes a); compressed: 90
         * tokens back is past the 40 of history (refused with a clear error), 40 back is possible */
        const int32_t *cont = tok[0];
        ref_seq *want = &r0;
        if (kind == 0) CHECK_OK(ps_kvcache_truncate(&kv, b, P, &err), &err); /* full attention keeps every position */
        else {
            ps_error e2;
            int rc = ps_kvcache_truncate(&kv, b, P, &e2);
            CHECK(rc != 0 && strstr(e2.msg, "history"), "truncating past the history is refused (%s)", rc ? e2.msg : "accepted");
            CHECK_OK(ps_kvcache_truncate(&kv, b, P + A - 40, &err), &err);
            cont = tok[1], want = &r1;
        }
        int64_t back = ps_kvcache_len(&kv, b), more = P + A - back;
        CHECK_OK(ps_kvcache_append(&kv, 1, &b, &more, cont + back, NULL, lg, false, &err), &err);
        worst = 0;
        for (int64_t t = 0; t < more; t++) worst = fmax(worst, tu_row_rel(lg + t * V, want->a.p.logits + (back + t) * V, V));
        CHECK(worst < TOL, "kind %d: after truncate to %lld and re-append the logits differ by %.3g", kind, (long long)back, worst);
        check_entries("re-appended b", &kv, b, &c, want, P + A);
        ps_kvcache_drop(&kv, a);
        ps_kvcache_drop(&kv, b);
        CHECK(kv.page_bytes_live == 0, "kind %d: dropping every sequence frees every page (%lld bytes left)", kind,
              (long long)kv.page_bytes_live);
        free(lg);
        ps_kvcache_free(&kv);
        ref_free(&r0);
        ref_free(&r1);
        ps_model_free(&m);
    }
}

/* Bytes per token: the growth of the measured bytes between two lengths against `info`'s formula. */
static void test_bytes(void) {
    /* kind 0 full, 1 compressed W8/S8, 2 W8/S4, 3 the channel attention (HCA, rate 8) */
    for (int kind = 0; kind < 4; kind++) {
        ps_config c = tu_config(kind == 3 ? PS_ATTN_CHANNEL : kind ? PS_ATTN_COMPRESSED : PS_ATTN_FULL);
        c.n_layers = 2, c.window = 8, c.stride = kind == 2 ? 4 : 8, c.local_window = 8, c.max_seq_len = 8192;
        if (kind == 3) c.n_kv_heads = 1, c.rate = 8, c.v4_mode = PS_V4_MODE_HCA;
        ps_model m;
        tu_random_model(&m, &c, 3, 0.4f);
        ps_error err;
        ps_kvcache kv;
        REQUIRE_OK(ps_kvcache_create(&kv, &m, NULL, &err), &err);
        int s = ps_kvcache_add(&kv, &err);
        int32_t *tok = malloc(8192 * sizeof(int32_t));
        tu_random_tokens(tok, 8192, c.vocab_size, 4);
        int64_t n1 = 4096, n2 = 4096;
        CHECK_OK(ps_kvcache_append(&kv, 1, &s, &n1, tok, NULL, NULL, false, &err), &err);
        int64_t b1 = ps_kvcache_bytes(&kv);
        CHECK_OK(ps_kvcache_append(&kv, 1, &s, &n2, tok + n1, NULL, NULL, false, &err), &err);
        int64_t b2 = ps_kvcache_bytes(&kv);
        double per = (double)(b2 - b1) / (double)n2, want = ps_kvcache_bytes_per_token(&c);
        CHECK(fabs(per - want) / want < 0.05, "kind %d: the cache grows by %.2f bytes per token, info states %.2f", kind, per, want);
        double stated = want * 8192 + ps_kvcache_fixed_bytes(&c);
        CHECK(fabs((double)b2 - stated) / stated < 0.05, "kind %d: the cache holds %lld bytes at T = 8192, info states %.0f", kind,
              (long long)b2, stated);
        printf("  bytes/token kind %d: measured %.3f, info %.3f (total at T=8192: %lld bytes; fixed part stated %.0f)\n", kind, per,
               want, (long long)b2, ps_kvcache_fixed_bytes(&c));
        free(tok);
        ps_kvcache_free(&kv);
        ps_model_free(&m);
    }
}

/* hooks during appends */
typedef struct {
    const ps_kvcache *kv;
    const ps_config *c;
    ref_seq *ref;
    int fired, bad;
} ck_watch;

static int on_ck(const ps_hook_event *ev, void *user, ps_error *err) {
    (void)err;
    ck_watch *w = user;
    const ps_kv_event *e = ps_kvcache_event(w->kv);
    int64_t nkv = w->c->n_kv_heads, hd = w->c->head_dim;
    w->fired++;
    if (ev->ndim != 4 || ev->shape[0] != 1 || ev->shape[1] != 1 || ev->shape[2] != nkv || ev->shape[3] != hd || e->entry < 0) {
        w->bad++;
        return 0;
    }
    ps_act_ptrs p = ps_acts_layer(&w->ref->a, ev->layer);
    if (tu_row_rel(ev->data, p.ck + e->entry * nkv * hd, nkv * hd) > TOL) w->bad++;
    return 0;
}

static void test_hooks(void) {
    ps_config c = tu_config(PS_ATTN_COMPRESSED);
    c.n_layers = 2, c.window = 6, c.stride = 3, c.local_window = 5, c.max_seq_len = 200;
    ps_model m;
    tu_random_model(&m, &c, 21, 0.4f);
    ps_error err;
    int64_t V = c.vocab_size, T = 200;
    int32_t tok[200];
    tu_random_tokens(tok, T, V, 22);
    /* an action: zero KV head 1's raw values everywhere, in both runs */
    ps_hooks hz;
    ps_hooks_init(&hz);
    ps_hook_action zero = {.kind = PS_ACT_ZERO, .head = 1};
    CHECK_OK(ps_hooks_add_action(&hz, &c, "blocks.1.attn.hook_v", &zero, &err), &err);
    /* and at the points of the layer's residual path (fired per appended piece): head 2 of z, layer 0's
     * attention output, a steering vector added to layer 1's residual stream, layer 1's MLP output */
    ps_hook_action zero2 = {.kind = PS_ACT_ZERO, .head = 2}, zero_all = {.kind = PS_ACT_ZERO, .head = -1};
    CHECK_OK(ps_hooks_add_action(&hz, &c, "blocks.0.attn.hook_z", &zero2, &err), &err);
    CHECK_OK(ps_hooks_add_action(&hz, &c, "blocks.0.hook_attn_out", &zero_all, &err), &err);
    CHECK_OK(ps_hooks_add_action(&hz, &c, "blocks.1.hook_mlp_out", &zero_all, &err), &err);
    float *steer = malloc((size_t)c.d_model * sizeof(float));
    for (int64_t i = 0; i < c.d_model; i++) steer[i] = (float)((i % 5) - 2) * 0.25f;
    const float *steer_src = ps_hooks_upload(&hz, m.ctx, steer, c.d_model, &err);
    ps_hook_action add = {.kind = PS_ACT_ADD, .head = -1, .src = steer_src, .every_pos = 1, .scale = 0.5f};
    CHECK_OK(ps_hooks_add_action(&hz, &c, "blocks.1.hook_resid_pre", &add, &err), &err);
    free(steer);
    ref_seq r, rz;
    ref_run(&r, &m, &c, tok, T, NULL);
    ref_run(&rz, &m, &c, tok, T, &hz);
    ps_kvcache kv;
    ps_kvcache_opts o = {.chunk = 16};
    REQUIRE_OK(ps_kvcache_create(&kv, &m, &o, &err), &err);
    ck_watch w = {.kv = &kv, .c = &c, .ref = &r};
    ps_hooks h;
    ps_hooks_init(&h);
    CHECK_OK(ps_hooks_add(&h, &c, "blocks.0.attn.hook_ck", on_ck, &w, &err), &err);
    int s = ps_kvcache_add(&kv, &err), s2 = ps_kvcache_add(&kv, &err);
    float *lg = malloc((size_t)(T * V) * sizeof(float));
    int64_t done = 0;
    while (done < T) {
        int64_t k = done < 50 ? 50 : 1;
        CHECK_OK(ps_kvcache_append(&kv, 1, &s, &k, tok + done, &h, NULL, false, &err), &err);
        CHECK_OK(ps_kvcache_append(&kv, 1, &s2, &k, tok + done, &hz, lg + done * V, false, &err), &err);
        done += k;
    }
    int64_t windows = (T - c.window) / c.stride + 1;
    CHECK(w.fired == windows && w.bad == 0, "hook_ck fired %d times (windows %lld), %d firings differ from the forward's entry", w.fired,
          (long long)windows, w.bad);
    double worst = 0;
    for (int64_t t = 0; t < T; t++) worst = fmax(worst, tu_row_rel(lg + t * V, rz.a.p.logits + t * V, V));
    CHECK(worst < TOL, "actions at hook_v, hook_z, hook_attn_out, hook_resid_pre, hook_mlp_out: cache and forward differ by %.3g", worst);
    double moved = 0; /* the actions change the logits (else the comparison above proves nothing) */
    for (int64_t t = 0; t < T; t++) moved = fmax(moved, tu_row_rel(rz.a.p.logits + t * V, r.a.p.logits + t * V, V));
    CHECK(moved > 1e-2, "the actions left the logits unchanged (%.3g)", moved);
    /* the pattern hook is refused */
    ps_hooks hp;
    ps_hooks_init(&hp);
    CHECK_OK(ps_hooks_add(&hp, &c, "blocks.0.attn.hook_pattern", on_ck, &w, &err), &err);
    int64_t one = 1;
    CHECK_ERR(ps_kvcache_append(&kv, 1, &s, &one, tok, &hp, NULL, false, &err), &err, "hook_pattern");
    ps_hooks_free(&hp);
    ps_hooks_free(&h);
    ps_hooks_free(&hz);
    ps_kvcache_free(&kv);
    ref_free(&r);
    ref_free(&rz);
    free(lg);
    ps_model_free(&m);
}

/* Editing the cache between steps: zero entry j of head g of layer l (and set another to a vector) from
 * position P on = the forward with those entries overwritten, at the positions after P. */
static void test_edits(void) {
    ps_config c = tu_config(PS_ATTN_COMPRESSED);
    c.n_layers = 2, c.window = 4, c.stride = 4, c.local_window = 4, c.max_seq_len = 160;
    ps_model m;
    tu_random_model(&m, &c, 31, 0.4f);
    ps_error err;
    int64_t V = c.vocab_size, T = 160, P = 60, hd = c.head_dim;
    int32_t tok[160];
    tu_random_tokens(tok, T, V, 32);
    float vec[4] = {0.5f, -0.25f, 1.0f, 0.125f};
    ps_hooks h;
    ps_hooks_init(&h);
    ps_hook_action zero = {.kind = PS_ACT_ZERO, .head = 1, .pos0 = 3, .pos1 = 4};
    CHECK_OK(ps_hooks_add_action(&h, &c, "blocks.1.attn.hook_cv", &zero, &err), &err);
    const float *src = ps_hooks_upload(&h, m.ctx, vec, hd, &err);
    ps_hook_action set = {.kind = PS_ACT_SET, .head = 0, .pos0 = 20, .pos1 = 21, .src = src, .every_pos = 1};
    CHECK_OK(ps_hooks_add_action(&h, &c, "blocks.0.attn.hook_ck", &set, &err), &err);
    ref_seq r;
    ref_run(&r, &m, &c, tok, T, &h);
    ps_kvcache kv;
    REQUIRE_OK(ps_kvcache_create(&kv, &m, NULL, &err), &err);
    int s = ps_kvcache_add(&kv, &err);
    CHECK_OK(ps_kvcache_append(&kv, 1, &s, &P, tok, NULL, NULL, false, &err), &err);
    int layer, value;
    CHECK_OK(ps_kvcache_point_parse(&c, "blocks.1.attn.cache_cv", &layer, &value, &err), &err);
    CHECK(layer == 1 && value == 1, "cache point parsed");
    CHECK_ERR(ps_kvcache_point_parse(&c, "blocks.7.attn.cache_ck", &layer, &value, &err), &err, "layer 7");
    CHECK_OK(ps_kvcache_edit(&kv, -1, 1, 1, 1, 3, PS_KV_EDIT_ZERO, NULL, &err), &err);   /* exists already */
    CHECK_OK(ps_kvcache_edit(&kv, -1, 0, 0, 0, 20, PS_KV_EDIT_SET, vec, &err), &err);    /* made later */
    float got[4];
    CHECK_OK(ps_kvcache_entry(&kv, s, 1, 1, 1, 3, got, &err), &err);
    CHECK(got[0] == 0 && got[3] == 0, "the edit zeroed the existing entry");
    CHECK_ERR(ps_kvcache_entry(&kv, s, 0, 0, 0, 20, got, &err), &err, "not 20");
    float *lg = malloc((size_t)(T * V) * sizeof(float));
    for (int64_t t = P; t < T; t++) {
        int64_t one = 1;
        CHECK_OK(ps_kvcache_append(&kv, 1, &s, &one, tok + t, NULL, lg + t * V, false, &err), &err);
    }
    double worst = 0;
    for (int64_t t = P; t < T; t++) worst = fmax(worst, tu_row_rel(lg + t * V, r.a.p.logits + t * V, V));
    CHECK(worst < TOL, "cache edits between steps: logits differ from the forward with the same entries overwritten by %.3g", worst);
    {
        ref_seq clean;
        ref_run(&clean, &m, &c, tok, T, NULL);
        double moved = 0;
        for (int64_t t = P; t < T; t++) moved = fmax(moved, tu_row_rel(lg + t * V, clean.a.p.logits + t * V, V));
        CHECK(moved > 100 * TOL, "the edits change the logits (by %.3g): the check above can fail", moved);
        ref_free(&clean);
    }
    CHECK_OK(ps_kvcache_entry(&kv, s, 0, 0, 0, 20, got, &err), &err);
    CHECK(memcmp(got, vec, sizeof vec) == 0, "the entry made after the edit holds the vector set");
    CHECK_ERR(ps_kvcache_edit(&kv, -1, 0, 5, 0, 1, PS_KV_EDIT_ZERO, NULL, &err), &err, "KV head 5");
    ps_hooks_free(&h);
    ps_kvcache_free(&kv);
    ref_free(&r);
    free(lg);
    ps_model_free(&m);

    /* the channel attention: its entries are cache_ck only (K = V); zeroing entry 4 of layer 1 = the
     * forward with hook_ck's entry 4 zeroed */
    c = tu_config(PS_ATTN_CHANNEL);
    c.n_layers = 2, c.n_kv_heads = 1, c.rate = 4, c.v4_mode = PS_V4_MODE_CSA, c.local_window = 5, c.max_seq_len = T;
    tu_random_model(&m, &c, 33, 0.4f);
    ps_hooks_init(&h);
    ps_hook_action z4 = {.kind = PS_ACT_ZERO, .head = 0, .pos0 = 4, .pos1 = 5};
    CHECK_OK(ps_hooks_add_action(&h, &c, "blocks.1.attn.hook_ck", &z4, &err), &err);
    ref_run(&r, &m, &c, tok, T, &h);
    REQUIRE_OK(ps_kvcache_create(&kv, &m, NULL, &err), &err);
    s = ps_kvcache_add(&kv, &err);
    CHECK_OK(ps_kvcache_append(&kv, 1, &s, &P, tok, NULL, NULL, false, &err), &err);
    CHECK_ERR(ps_kvcache_point_parse(&c, "blocks.1.attn.cache_cv", &layer, &value, &err), &err, "K = V");
    CHECK_OK(ps_kvcache_edit(&kv, -1, 1, 0, 0, 4, PS_KV_EDIT_ZERO, NULL, &err), &err);
    lg = malloc((size_t)(T * V) * sizeof(float));
    int64_t rest = T - P;
    CHECK_OK(ps_kvcache_append(&kv, 1, &s, &rest, tok + P, NULL, lg + P * V, false, &err), &err);
    worst = 0;
    for (int64_t t = P; t < T; t++) worst = fmax(worst, tu_row_rel(lg + t * V, r.a.p.logits + t * V, V));
    CHECK(worst < TOL, "channel attention: zeroing cache_ck entry 4 differs from the forward with it zeroed by %.3g", worst);
    ref_seq clean;
    ref_run(&clean, &m, &c, tok, T, NULL);
    double moved = 0;
    for (int64_t t = P; t < T; t++) moved = fmax(moved, tu_row_rel(lg + t * V, clean.a.p.logits + t * V, V));
    CHECK(moved > 100 * TOL, "the channel edit changes the logits (by %.3g): the check above can fail", moved);
    ref_free(&clean);
    ps_hooks_free(&h);
    ps_kvcache_free(&kv);
    ref_free(&r);
    free(lg);
    ps_model_free(&m);
}

static void test_bad_inputs(void) {
    ps_config c = tu_config(PS_ATTN_COMPRESSED);
    c.max_seq_len = 20;
    ps_model m;
    tu_random_model(&m, &c, 41, 0.4f);
    ps_error err;
    ps_kvcache kv;
    REQUIRE_OK(ps_kvcache_create(&kv, &m, NULL, &err), &err);
    int s = ps_kvcache_add(&kv, &err);
    int32_t tok[30] = {0};
    int64_t n = 21;
    CHECK_ERR(ps_kvcache_append(&kv, 1, &s, &n, tok, NULL, NULL, false, &err), &err, "max_seq_len");
    tok[2] = 99;
    n = 5;
    CHECK_ERR(ps_kvcache_append(&kv, 1, &s, &n, tok, NULL, NULL, false, &err), &err, "vocabulary");
    int bad = 7;
    CHECK_ERR(ps_kvcache_append(&kv, 1, &bad, &n, tok, NULL, NULL, false, &err), &err, "no sequence 7");
    int two[2] = {s, s};
    int64_t nn[2] = {1, 1};
    tok[2] = 0;
    CHECK_ERR(ps_kvcache_append(&kv, 2, two, nn, tok, NULL, NULL, false, &err), &err, "twice");
    CHECK_ERR(ps_kvcache_truncate(&kv, s, 3, &err), &err, "[0, 0]");
    /* a refused edit names the point and is not recorded */
    CHECK_ERR(ps_kvcache_edit(&kv, -1, 0, 0, 0, -1, PS_KV_EDIT_ZERO, NULL, &err), &err, "blocks.0.attn.cache_ck: entry -1 must be >= 0");
    CHECK_ERR(ps_kvcache_edit(&kv, -1, 0, 0, 1, 2, PS_KV_EDIT_SET, NULL, &err), &err, "SET needs a vector of");
    CHECK_ERR(ps_kvcache_edit(&kv, 9, 0, 0, 1, 2, PS_KV_EDIT_ZERO, NULL, &err), &err, "no sequence 9");
    CHECK(kv.n_edits == 0, "refused edits are not recorded (%d recorded)", kv.n_edits);
    ps_kvcache_free(&kv);
    ps_model_free(&m);
}

/* ps_generate: greedy tokens equal the argmax of the whole-sequence forward on the growing sequence (the
 * old path), log-probabilities equal its log-softmax; a prompt reaching max_seq_len stops there; sampling
 * is seeded (same seed, same tokens) and top_p -> 0 is greedy; mean edits need a prompt holding the entry. */
/* The naive sampler ps_generate_pick replaces: every token sorted by logit (ties: the lower id first), the
 * prefix reaching top_p (top_p 1: every token in token order), one uniform draw. */
typedef struct {
    float v;
    int32_t i;
} ref_cand;
static int ref_desc(const void *a, const void *b) {
    const ref_cand *x = a, *y = b;
    if (x->v != y->v) return x->v < y->v ? 1 : -1;
    return x->i < y->i ? -1 : x->i > y->i;
}
static int32_t ref_pick(const float *x, int64_t V, double T, double top_p, ps_rng *r) {
    float mx = x[0];
    for (int64_t i = 1; i < V; i++) mx = x[i] > mx ? x[i] : mx;
    double z = 0;
    for (int64_t i = 0; i < V; i++) z += exp(((double)x[i] - mx) / T);
    ref_cand *c = malloc((size_t)V * sizeof *c);
    for (int64_t i = 0; i < V; i++) c[i].v = x[i], c[i].i = (int32_t)i;
    if (top_p < 1) qsort(c, (size_t)V, sizeof *c, ref_desc);
    int64_t k = 0;
    double acc = 0;
    if (top_p < 1)
        while (k < V && acc < top_p) acc += exp(((double)c[k++].v - mx) / T) / z;
    else
        k = V, acc = 1;
    double u = ps_rng_uniform(r) * (top_p < 1 ? acc : z), run = 0;
    int32_t y = c[k - 1].i;
    for (int64_t i = 0; i < k; i++) {
        run += top_p < 1 ? exp(((double)c[i].v - mx) / T) / z : exp(((double)c[i].v - mx) / T);
        if (run > u) {
            y = c[i].i;
            break;
        }
    }
    free(c);
    return y;
}

/* ps_generate_pick against ref_pick, draw for draw: peaked and flat rows (a nucleus of a few tokens and one
 * of thousands: the widening up to every token), tied logits, several temperatures and top_p; and its
 * log-probability against the log softmax. */
static void test_pick(void) {
    int64_t V = 5000;
    float *x = malloc((size_t)V * sizeof *x);
    ps_rng g;
    ps_rng_seed(&g, 77);
    int same = 0, total = 0;
    double worst_lp = 0;
    for (int shape = 0; shape < 3; shape++) {
        for (int64_t i = 0; i < V; i++) /* peaked, flat, and ties (logits on a grid of 0.5) */
            x[i] = shape == 0 ? (float)(8 * ps_rng_uniform(&g) * ps_rng_uniform(&g) * ps_rng_uniform(&g))
                   : shape == 1 ? (float)(0.01 * ps_rng_uniform(&g))
                                : 0.5f * (float)ps_rng_below(&g, 6);
        const double temps[] = {0.3, 1.0, 2.5}, tops[] = {1e-9, 0.5, 0.9, 0.999, 1.0};
        for (int a = 0; a < 3; a++)
            for (int b = 0; b < 5; b++) {
                ps_rng r1, r2;
                ps_rng_seed(&r1, 1000 + (uint64_t)(a * 5 + b)), ps_rng_seed(&r2, 1000 + (uint64_t)(a * 5 + b));
                for (int d = 0; d < 20; d++) {
                    double lp;
                    int32_t y = ps_generate_pick(x, V, temps[a], tops[b], &r1, &lp), w = ref_pick(x, V, temps[a], tops[b], &r2);
                    same += y == w, total++;
                    double mx = x[0], z = 0;
                    for (int64_t i = 1; i < V; i++) mx = x[i] > mx ? x[i] : mx;
                    for (int64_t i = 0; i < V; i++) z += exp(x[i] - mx);
                    worst_lp = fmax(worst_lp, fabs(lp - (x[y] - mx - log(z))));
                }
            }
    }
    CHECK(same == total, "ps_generate_pick drew the naive sampler's token %d times of %d", same, total);
    CHECK(worst_lp < 1e-12, "its log-probability differs from the log softmax by %.3g", worst_lp);
    free(x);
}

static void test_generate(void) {
    ps_config c = tu_config(PS_ATTN_COMPRESSED);
    c.n_layers = 2, c.window = 4, c.stride = 2, c.local_window = 3, c.max_seq_len = 40;
    ps_model m;
    tu_random_model(&m, &c, 61, 0.8f);
    ps_error err;
    int64_t V = c.vocab_size;
    int32_t p0[9], p1[36];
    tu_random_tokens(p0, 9, V, 62);
    tu_random_tokens(p1, 36, V, 63);
    int32_t *pr[2] = {p0, p1};
    int64_t len[2] = {9, 36};
    ps_generate_opts o = {.max_tokens = 12, .temperature = 0, .top_p = 1, .seed = 1};
    ps_kvcache kv;
    REQUIRE_OK(ps_kvcache_create(&kv, &m, NULL, &err), &err);
    ps_generate_result r;
    REQUIRE_OK(ps_generate(&kv, 2, pr, len, &o, NULL, 0, NULL, &r, &err), &err);
    CHECK(r.n_gen[0] == 12 && r.n_gen[1] == 5, "generated %lld and %lld tokens (12, and 5 up to max_seq_len 40)", (long long)r.n_gen[0],
          (long long)r.n_gen[1]);
    int same = 1;
    double worst_lp = 0;
    for (int i = 0; i < 2; i++) {
        int32_t seq[64];
        memcpy(seq, pr[i], (size_t)len[i] * sizeof(int32_t));
        for (int64_t k = 0; k < r.n_gen[i]; k++) {
            int64_t T = len[i] + k;
            ps_acts a;
            CHECK_OK(ps_acts_create(&a, m.ctx, &c, 1, T, false, &err), &err);
            CHECK_OK(ps_forward(&m, &a, seq, NULL, &err), &err);
            const float *x = a.p.logits + (T - 1) * V;
            int64_t arg = 0;
            double mx = x[0], sum = 0;
            for (int64_t v = 1; v < V; v++)
                if (x[v] > x[arg]) arg = v, mx = x[v];
            for (int64_t v = 0; v < V; v++) sum += exp((double)x[v] - mx);
            if (arg != r.tok[i][k]) same = 0;
            worst_lp = fmax(worst_lp, fabs(((double)x[arg] - mx - log(sum)) - r.logprob[i][k]));
            seq[T] = (int32_t)arg;
            ps_acts_free(&a);
        }
    }
    CHECK(same, "greedy generation through the cache = argmax of the whole-sequence forward at every step");
    CHECK(worst_lp < 1e-4, "log-probabilities differ from the forward's log-softmax by %.3g", worst_lp);
    ps_generate_result_free(&r);
    ps_kvcache_free(&kv);
    /* sampling: seeded; a tiny nucleus is greedy */
    ps_generate_result s1, s2, g1;
    ps_generate_opts os = {.max_tokens = 12, .temperature = 1.5, .top_p = 0.9, .seed = 7};
    ps_kvcache k1, k2, k3;
    REQUIRE_OK(ps_kvcache_create(&k1, &m, NULL, &err), &err);
    REQUIRE_OK(ps_kvcache_create(&k2, &m, NULL, &err), &err);
    REQUIRE_OK(ps_kvcache_create(&k3, &m, NULL, &err), &err);
    CHECK_OK(ps_generate(&k1, 1, pr, len, &os, NULL, 0, NULL, &s1, &err), &err);
    CHECK_OK(ps_generate(&k2, 1, pr, len, &os, NULL, 0, NULL, &s2, &err), &err);
    os.top_p = 1e-9;
    CHECK_OK(ps_generate(&k3, 1, pr, len, &os, NULL, 0, NULL, &g1, &err), &err);
    CHECK(s1.n_gen[0] == 12 && !memcmp(s1.tok[0], s2.tok[0], 12 * sizeof(int32_t)), "the same seed samples the same tokens");
    ps_kvcache_free(&k3);
    REQUIRE_OK(ps_kvcache_create(&k3, &m, NULL, &err), &err);
    ps_generate_result gg;
    CHECK_OK(ps_generate(&k3, 1, pr, len, &o, NULL, 0, NULL, &gg, &err), &err);
    CHECK(!memcmp(g1.tok[0], gg.tok[0], 12 * sizeof(int32_t)), "top_p -> 0 samples the greedy tokens");
    ps_generate_edit e;
    CHECK_OK(ps_generate_edit_parse(&c, "blocks.1.attn.cache_cv:1:30:mean", &e, &err), &err);
    CHECK(e.layer == 1 && e.value == 1 && e.head == 1 && e.entry == 30 && e.mean, "edit parsed");
    CHECK_ERR(ps_generate_edit_parse(&c, "blocks.1.attn.cache_cv:1:3:half", &e, &err), &err, "expected zero or mean");
    CHECK_ERR(ps_generate_edit_parse(&c, "blocks.0.attn.hook_ck:0:3:zero", &e, &err), &err, "not a cache point");
    ps_kvcache_free(&k3);
    REQUIRE_OK(ps_kvcache_create(&k3, &m, NULL, &err), &err);
    CHECK_OK(ps_generate_edit_parse(&c, "blocks.1.attn.cache_cv:1:30:mean", &e, &err), &err);
    ps_generate_result ge;
    CHECK_ERR(ps_generate(&k3, 1, pr, len, &o, &e, 1, NULL, &ge, &err), &err, "no prompt holds entry 30");
    ps_generate_result_free(&s1), ps_generate_result_free(&s2), ps_generate_result_free(&g1), ps_generate_result_free(&gg);
    ps_kvcache_free(&k1), ps_kvcache_free(&k2), ps_kvcache_free(&k3);
    ps_model_free(&m);
}

/* The blocked attention of a long append (attend_blocked) against the per-row reference
 * (opts.plain_attention) and the whole-sequence forward: a prefill in pieces of 256 rows (the last one
 * short), then appends of 20 rows (blocked) and 1 row (per row). Full attention, overlapping windows with a
 * short local window, a local window longer than W, a local window of 1, staggered grids and content
 * chunks; the blocked path must have run (its piece counter) and never for the reference. */
static void test_blocked(void) {
    /* extra: 1 staggered grids (KV head 1 on offset 2), 2 content chunks */
    struct { ps_attn_kind kind; int64_t W, S, LW; int rope, qkn, extra; } cases[] = {
        {PS_ATTN_FULL, 0, 0, 0, 1, 1, 0}, {PS_ATTN_COMPRESSED, 8, 4, 6, 1, 1, 0}, {PS_ATTN_COMPRESSED, 8, 8, 40, 0, 1, 0},
        {PS_ATTN_COMPRESSED, 5, 3, 1, 1, 0, 0}, {PS_ATTN_COMPRESSED, 6, 3, 4, 1, 1, 1}, {PS_ATTN_COMPRESSED, 6, 3, 5, 1, 1, 2}};
    double worst_ref = 0, worst_fwd = 0;
    for (int ci = 0; ci < 6; ci++) {
        ps_config c = tu_config(cases[ci].kind);
        c.n_layers = 2, c.n_kv_heads = 2, c.n_heads = 4, c.rope = cases[ci].rope, c.qk_norm = cases[ci].qkn;
        if (cases[ci].kind == PS_ATTN_COMPRESSED) c.window = cases[ci].W, c.stride = cases[ci].S, c.local_window = cases[ci].LW;
        if (cases[ci].extra == 1) c.n_grid_offsets = 2, c.head_offsets[0] = 0, c.head_offsets[1] = 2, c.any_head_offset = true;
        if (cases[ci].extra == 2) c.boundaries = PS_BOUNDARIES_CONTENT, c.chunk_min = 2;
        int64_t P = 600, T = P + 20 + 3, V = c.vocab_size;
        c.max_seq_len = T;
        ps_model m;
        tu_random_model(&m, &c, 300 + (uint64_t)ci, 0.4f);
        ps_error err;
        int32_t *tok = malloc((size_t)T * sizeof(int32_t));
        tu_random_tokens(tok, T, V, 400 + (uint64_t)ci);
        ref_seq r;
        ref_run(&r, &m, &c, tok, T, NULL);
        float *lg[2];
        int64_t blocked[2];
        for (int plain = 0; plain < 2; plain++) {
            ps_kvcache kv;
            ps_kvcache_opts o = {.chunk = 256, .plain_attention = plain};
            REQUIRE_OK(ps_kvcache_create(&kv, &m, &o, &err), &err);
            int s = ps_kvcache_add(&kv, &err);
            lg[plain] = malloc((size_t)(T * V) * sizeof(float));
            int64_t done = 0, steps[5] = {P, 20, 1, 1, 1};
            for (int k = 0; k < 5; k++) {
                CHECK_OK(ps_kvcache_append(&kv, 1, &s, &steps[k], tok + done, NULL, lg[plain] + done * V, false, &err), &err);
                done += steps[k];
            }
            blocked[plain] = kv.n_blocked;
            ps_kvcache_free(&kv);
        }
        CHECK(blocked[0] == 2 * 4 && blocked[1] == 0, "case %d: %lld pieces attended blocked (expected 8: 2 layers x 3 prefill pieces + "
              "the 20-row append), %lld with plain_attention (expected 0)", ci, (long long)blocked[0], (long long)blocked[1]);
        for (int64_t t = 0; t < T; t++) {
            worst_ref = fmax(worst_ref, tu_row_rel(lg[0] + t * V, lg[1] + t * V, V));
            worst_fwd = fmax(worst_fwd, tu_row_rel(lg[0] + t * V, r.a.p.logits + t * V, V));
        }
        free(lg[0]), free(lg[1]), free(tok);
        ref_free(&r);
        ps_model_free(&m);
    }
    CHECK(worst_ref < 3e-5 && worst_fwd < TOL, "blocked attention: logits differ from the per-row reference by %.3g, from the forward by %.3g",
          worst_ref, worst_fwd);
    printf("  blocked attention: max relative logit error %.3g against the per-row reference, %.3g against the forward\n", worst_ref,
           worst_fwd);
}

/* One sequence past 128K tokens (W = S = 64, so the whole-sequence reference takes seconds on one core;
 * PS_KV_LONG=0 skips it): the prefill's last logits and one decode step's against ps_forward, and every
 * entry. */
static void test_long(void) {
    const char *e = getenv("PS_KV_LONG");
    if (e && !strcmp(e, "0")) return;
    ps_config c = tu_config(PS_ATTN_COMPRESSED);
    int64_t T = 131072 + 100;
    c.n_layers = 1, c.window = 64, c.stride = 64, c.local_window = 64, c.max_seq_len = T;
    ps_model m;
    tu_random_model(&m, &c, 51, 0.4f);
    ps_error err;
    int32_t *tok = malloc((size_t)T * sizeof(int32_t));
    tu_random_tokens(tok, T, c.vocab_size, 52);
    ref_seq r;
    ref_run(&r, &m, &c, tok, T, NULL);
    ps_kvcache kv;
    REQUIRE_OK(ps_kvcache_create(&kv, &m, NULL, &err), &err);
    int s = ps_kvcache_add(&kv, &err);
    int64_t V = c.vocab_size, n = T - 1, one = 1;
    float *lg = malloc((size_t)V * sizeof(float));
    CHECK_OK(ps_kvcache_append(&kv, 1, &s, &n, tok, NULL, lg, true, &err), &err);
    double e1 = tu_row_rel(lg, r.a.p.logits + (T - 2) * V, V);
    CHECK_OK(ps_kvcache_append(&kv, 1, &s, &one, tok + T - 1, NULL, lg, true, &err), &err);
    double e2 = tu_row_rel(lg, r.a.p.logits + (T - 1) * V, V);
    CHECK(e1 < TOL && e2 < TOL, "T = %lld: prefill's last logits differ by %.3g, the decode step's by %.3g", (long long)T, e1, e2);
    printf("  T=%lld: last logits of the prefill %.3g, of one decode step %.3g; cache %lld bytes\n", (long long)T, e1, e2,
           (long long)ps_kvcache_bytes(&kv));
    check_entries("long", &kv, s, &c, &r, T);
    free(lg);
    free(tok);
    ps_kvcache_free(&kv);
    ref_free(&r);
    ps_model_free(&m);
}

/* A callback on hook_gate_k that sums what it sees and scales the gates of KV head 0 by 0.5 (an edit in
 * place: on a device context the hooks module copies the point to the host and back). */
static int on_gate(const ps_hook_event *ev, void *user, ps_error *err) {
    (void)err;
    double *sum = user;
    int64_t n = ev->shape[0] * ev->shape[1] * ev->shape[2] * ev->shape[3], W = ev->shape[3];
    for (int64_t i = 0; i < n; i++) *sum += ev->data[i] * (double)(i + 1);
    for (int64_t i = 0; i < W; i++) ev->data[i] *= 0.5f;
    return 0;
}

/* One run of the staged comparison on model m: a batch of two sequences grown by seeded appends (single
 * tokens and chunks of up to 90 rows: per-row and blocked attention, batched payloads), a fork half way, an
 * edit of every sequence's entry 1 and of one sequence's entry 3, hooks (an action on hook_v — the channel attention: hook_z —, a callback
 * editing hook_gate_k); the logits of every appended position into lg, every entry held at the end into ent
 * (both host), the callback's sum into *gsum. Returns the floats written to lg. */
static int64_t staged_run(const ps_model *m, const ps_config *c, const int32_t *tok, int64_t T, float *lg, float *ent, int64_t *n_ent,
                          double *gsum) {
    ps_error err;
    ps_kvcache kv;
    ps_kvcache_opts o = {.chunk = 64};
    int64_t V = c->vocab_size, out = 0, ne = 0, hd = c->head_dim;
    if (ps_kvcache_create(&kv, m, &o, &err)) {
        CHECK_OK(-1, &err);
        return 0;
    }
    ps_hooks h;
    ps_hooks_init(&h);
    int comp = c->kind == PS_ATTN_COMPRESSED, chn = c->kind == PS_ATTN_CHANNEL;
    ps_hook_action zero = {.kind = PS_ACT_ZERO, .head = 1}; /* (the channel attention: K = V, head 0 of hook_z) */
    if (chn) zero.head = 0;
    CHECK_OK(ps_hooks_add_action(&h, c, chn ? "blocks.1.attn.hook_z" : "blocks.1.attn.hook_v", &zero, &err), &err);
    if (comp || chn) CHECK_OK(ps_hooks_add(&h, c, "blocks.0.attn.hook_gate_k", on_gate, gsum, &err), &err);
    int ids[2] = {ps_kvcache_add(&kv, &err), -1};
    ps_rng g;
    ps_rng_seed(&g, 99);
    int64_t done[2] = {0, 0};
    float vec[64];
    for (int64_t e = 0; e < hd; e++) vec[e] = 0.1f * (float)(e + 1);
    while (done[0] < T) {
        if (ids[1] < 0 && done[0] >= T / 2) { /* fork; then edits */
            ids[1] = ps_kvcache_fork(&kv, ids[0], &err);
            done[1] = done[0];
            if (comp || chn) { /* (the channel attention: one head, cache_ck only) */
                CHECK_OK(ps_kvcache_edit(&kv, -1, 0, 0, 0, 1, PS_KV_EDIT_ZERO, NULL, &err), &err);
                CHECK_OK(ps_kvcache_edit(&kv, ids[1], 1, chn ? 0 : 1, chn ? 0 : 1, 3, PS_KV_EDIT_SET, vec, &err), &err);
            }
        }
        int nseq = ids[1] < 0 ? 1 : 2;
        int64_t n[2];
        int32_t buf[200];
        int64_t off = 0;
        for (int i = 0; i < nseq; i++) {
            int64_t k = ps_rng_below(&g, 3) ? 1 : 1 + ps_rng_below(&g, 90);
            if (k > T - done[i]) k = T - done[i];
            n[i] = k;
            for (int64_t t = 0; t < k; t++) buf[off + t] = tok[(done[i] + t + (int64_t)i * 7) % T];
            off += k;
        }
        if (nseq == 2 && n[1] == 0) nseq = 1;
        CHECK_OK(ps_kvcache_append(&kv, nseq, ids, n, buf, &h, lg + out, false, &err), &err);
        out += off * V;
        for (int i = 0; i < nseq; i++) done[i] += n[i];
    }
    for (int i = 0; i < 2 && (comp || chn); i++)
        for (int l = 0; l < c->n_layers; l++)
            for (int gk = 0; gk < ps_kvcache_entry_heads(&kv); gk++)
                for (int v = 0; v < 2 - chn; v++)
                    for (int64_t j = 0; j < ps_kvcache_n_entries(&kv, ids[i], l, gk); j++, ne += hd)
                        CHECK_OK(ps_kvcache_entry(&kv, ids[i], l, gk, v, j, ent + ne, &err), &err);
    *n_ent = ne;
    ps_hooks_free(&h);
    ps_kvcache_free(&kv);
    return out;
}

static int sum_rows(const ps_hook_event *ev, void *user, ps_error *err) {
    (void)err;
    double *s = user;
    int64_t n = 1;
    for (int d = 0; d < ev->ndim; d++) n *= ev->shape[d];
    for (int64_t i = 0; i < n; i++) *s += ev->data[i];
    return 0;
}

/* ps_generate (core/generate.c: the CLI's and the API's generate) on model m: 3 prompts of 41, 17 and 5
 * tokens, 6 tokens each (tu_generate_rows: sampled with a seed), a mean and a zero edit where the model has
 * compressed entries, a host callback on blocks.0.hook_resid_pre; tokens, log-probabilities and the
 * callback's sum written out */
static int staged_generate(const ps_model *m, const ps_config *c, const int32_t *tok, int32_t *out_tok, double *out_lp, double *hsum) {
    ps_error err;
    ps_kvcache kv;
    if (ps_kvcache_create(&kv, m, NULL, &err)) {
        CHECK_OK(-1, &err);
        return -1;
    }
    ps_hooks h;
    ps_hooks_init(&h);
    CHECK_OK(ps_hooks_add(&h, c, "blocks.0.hook_resid_pre", sum_rows, hsum, &err), &err);
    int32_t *pr[3] = {(int32_t *)tok, (int32_t *)tok + 50, (int32_t *)tok + 100};
    int64_t len[3] = {41, 17, 5};
    ps_generate_edit ed[2] = {{.layer = 0, .head = 0, .value = 0, .entry = 0, .mean = 1}, {.layer = 1, .head = 0, .value = 1, .entry = 1}};
    int n_ed = c->kind == PS_ATTN_COMPRESSED || c->kind == PS_ATTN_CHANNEL ? 2 : 0;
    if (c->kind == PS_ATTN_CHANNEL) ed[1].value = 0; /* (one head, cache_ck only) */
    int rc = tu_generate_rows(&kv, pr, len, ed, n_ed, &h, out_tok, out_lp, &err);
    CHECK_OK(rc, &err);
    ps_hooks_free(&h);
    ps_kvcache_free(&kv);
    return rc;
}

/* The cache on another backend against the cpu backend, the same appends, forks, edits and hooks
 * (staged_run): full attention, the base grid, a staggered grid, content chunks and the channel attention.
 * On the test backend
 * cpu-staged — the cpu's ops and memory behind a context that says its buffers are not host-visible, so
 * every page write, kv op over page tables, hook and read takes the device path — every appended
 * position's logits, every entry held and what a hook saw are the cpu's bits. On a device (cuda) they
 * agree within TOL (logits per row, entries per list). Returns 0 when the backend cannot be opened here. */
static int test_backend_cache(const char *name) {
    const char *kinds[] = {"full", "compressed", "staggered", "content", "channel"};
    int exact = !strcmp(name, "cpu-staged");
    ps_rng g;
    ps_rng_seed(&g, 4242);
    ps_error err;
    ps_ctx *sctx;
    if (ps_ctx_create(&sctx, name, &err)) {
        printf("  %s: not tested (%s)\n", name, err.msg);
        return 0;
    }
    for (int kind = 0; kind < 5; kind++) {
        ps_config c = random_config(&g, kind);
        int64_t T = 260, V = c.vocab_size;
        c.max_seq_len = T + 8;
        ps_model m[2];
        tu_random_model(&m[0], &c, 55 + (uint64_t)kind, 0.4f);
        tu_random_model(&m[1], &c, 55 + (uint64_t)kind, 0.4f);
        if (ps_model_to(&m[1], sctx, &err)) {
            CHECK_OK(-1, &err);
            ps_model_free(&m[0]), ps_model_free(&m[1]), ps_ctx_free(sctx);
            return 1;
        }
        int32_t *tok = malloc((size_t)T * sizeof *tok);
        tu_random_tokens(tok, T, V, 56 + (uint64_t)kind);
        int64_t cap_ent = 2 * c.n_layers * 2 * c.n_kv_heads * T * c.head_dim + 1, nl[2], ne[2];
        float *lg[2], *ent[2];
        double gsum[2] = {0, 0};
        for (int b = 0; b < 2; b++) {
            lg[b] = calloc((size_t)(2 * T * V), sizeof(float));
            ent[b] = calloc((size_t)cap_ent, sizeof(float));
            nl[b] = staged_run(&m[b], &c, tok, T, lg[b], ent[b], &ne[b], &gsum[b]);
        }
        CHECK(nl[0] == nl[1] && nl[0] > T * V, "%s %s: %lld and %lld logits", name, kinds[kind], (long long)nl[0], (long long)nl[1]);
        CHECK(ne[0] == ne[1], "%s %s: %lld and %lld entry floats", name, kinds[kind], (long long)ne[0], (long long)ne[1]);
        double dl = nl[0] == nl[1] ? tu_rows_rel(lg[1], lg[0], nl[0] / V, V) : INFINITY;
        double de = ne[0] == ne[1] ? tu_row_rel(ent[1], ent[0], ne[0]) : INFINITY;
        double dg = fabs(gsum[1] - gsum[0]) / fmax(fabs(gsum[0]), 1e-30);
        if (exact) {
            CHECK(nl[0] == nl[1] && memcmp(lg[0], lg[1], (size_t)nl[0] * sizeof(float)) == 0, "%s %s: logits differ from the cpu's (%.3g)",
                  name, kinds[kind], dl);
            CHECK(ne[0] == ne[1] && memcmp(ent[0], ent[1], (size_t)ne[0] * sizeof(float)) == 0, "%s %s: entries differ from the cpu's (%.3g)",
                  name, kinds[kind], de);
            CHECK(gsum[0] == gsum[1], "%s %s: the hook saw other gates (%.17g vs %.17g)", name, kinds[kind], gsum[1], gsum[0]);
        } else {
            CHECK(dl < TOL && de < TOL && dg < TOL, "%s %s: logits %.3g, entries %.3g, the hook's sum %.3g from the cpu's (tolerance %.0e)",
                  name, kinds[kind], dl, de, dg, TOL);
        }
        printf("  %s %-10s against the cpu%s: %lld logit rows (%.3g), %lld entry floats (%.3g), hook %.3g\n", name, kinds[kind],
               exact ? ", bit for bit" : "", (long long)(nl[0] / V), dl, (long long)ne[0], de, dg);
        /* generation (sampled, edits, a host callback) through the same two caches' code */
        int32_t gt[2][18];
        double glp[2][18], hs[2] = {0, 0}, wl = 0;
        int gr0 = staged_generate(&m[0], &c, tok, gt[0], glp[0], &hs[0]), gr1 = staged_generate(&m[1], &c, tok, gt[1], glp[1], &hs[1]);
        int same_tok = !memcmp(gt[0], gt[1], sizeof gt[0]);
        for (int k = 0; k < 18; k++) wl = fmax(wl, fabs(glp[0][k] - glp[1][k]));
        double dh = fabs(hs[1] - hs[0]) / fmax(fabs(hs[0]), 1e-30);
        if (exact)
            CHECK(!gr0 && !gr1 && same_tok && !memcmp(glp[0], glp[1], sizeof glp[0]) && hs[0] == hs[1],
                  "%s %s: generate differs from the cpu's (tokens %s, log-probabilities %.3g, hook %.3g)", name, kinds[kind],
                  same_tok ? "equal" : "differ", wl, dh);
        else /* a sampled token may flip where the cpu's draw falls within rounding of a boundary: say so */
            CHECK(!gr0 && !gr1 && (!same_tok || (wl < TOL && dh < TOL)), "%s %s: generate's log-probabilities %.3g, hook %.3g from the cpu's",
                  name, kinds[kind], wl, dh);
        printf("  %s %-10s generate against the cpu: tokens %s, log-probabilities %.3g, hook %.3g\n", name, kinds[kind],
               same_tok ? "equal" : "DIFFER (a sampled flip?)", wl, dh);
        for (int b = 0; b < 2; b++) free(lg[b]), free(ent[b]), ps_model_free(&m[b]);
        free(tok);
    }
    ps_ctx_free(sctx);
    return 1;
}

/* cpu-staged always; cuda when the build has it and a device is present — a failure when the run asks for
 * it (PS_REQUIRE_CUDA=1: scripts/gpu_check.sh) */
static void test_backends(void) {
    test_backend_cache("cpu-staged");
    int cuda = test_backend_cache("cuda");
    const char *req = getenv("PS_REQUIRE_CUDA");
    CHECK(cuda || !req || !*req || !strcmp(req, "0"), "PS_REQUIRE_CUDA is set and the KV cache could not be tested on cuda");
}

/* --backends: the backend comparison alone (the device check, scripts/gpu_check.sh) */
int main(int argc, char **argv) {
    test_backends();
    if (argc > 1 && !strcmp(argv[1], "--backends")) CHECK_DONE();
    test_blocked();
    test_property();
    test_layer_offsets();
    test_fork_truncate();
    test_bytes();
    test_hooks();
    test_edits();
    test_bad_inputs();
    test_pick();
    test_generate();
    test_long();
    CHECK_DONE();
}
