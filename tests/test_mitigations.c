/* test_mitigations.c — the weak-phase mitigations (docs/mitigations.md) against numbers computed another
 * way: the config key attention.head_offsets (parsing, "staggered", every bad value, round trip, base
 * configs unchanged), the forward on staggered and phase-shifted grids against the plain-loop double
 * reference (tests/ref_model.c, ref_forward_grid), the grid ops with no offsets against the base ops,
 * the backward against central finite differences of the reference, hooks and gate statistics on a grid
 * whose heads lack a window, and the gate regulariser op against a plain-loop value and its finite
 * differences; per-layer grids ("staggered_layers", [n_layers][n_kv_heads]): config forms and refusals, the
 * forward, gradients and restarts against the reference, a zero-offset layer against the base model's, gate
 * statistics per layer, the batched knockout, the chunked prefill. */
#include <stdlib.h>
#include <string.h>

#include "core/backward.h"
#include "check.h"
#include "core/config.h"
#include "core/forward.h"
#include "gates/gates.h"
#include "core/hooks.h"
#include "interventions/knockout.h"
#include "interventions/sweep.h"
#include "tasks/tasks.h"
#include "core/model.h"
#include "core/prefill.h"
#include "core/ops.h"
#include "ref_model.h"
#include "core/rng.h"
#include "testutil.h"

static ps_config small_cfg(int64_t W, int64_t S, int64_t nh, int64_t nkv) {
    ps_config c = tu_config(PS_ATTN_COMPRESSED);
    c.n_layers = 2;
    c.d_model = 8;
    c.head_dim = 4;
    c.d_ff = 12;
    c.vocab_size = 11;
    c.window = W;
    c.stride = S;
    c.local_window = W;
    c.n_heads = nh;
    c.n_kv_heads = nkv;
    return c;
}

/* one offset per KV head: n must be the config's n_kv_heads (the count keeps the compiler from
 * guessing at the array's length) */
#define set_offsets(c, o) set_offsets_n((c), (o), (int64_t)(sizeof(o) / sizeof((o)[0])))
static void set_offsets_n(ps_config *c, const int64_t *o, int64_t n) {
    CHECK(n == c->n_kv_heads, "set_offsets: %lld offsets for %lld KV heads", (long long)n, (long long)c->n_kv_heads);
    if (n > c->n_kv_heads) n = c->n_kv_heads;
    c->n_grid_offsets = c->n_kv_heads;
    c->any_head_offset = false;
    for (int64_t g = 0; g < n; g++) {
        c->head_offsets[g] = o[g];
        if (o[g]) c->any_head_offset = true;
    }
}

/* ---- config ---- */

static void test_config_key(void) {
    const char *base = "{\"vocab_size\": 16, \"d_model\": 8, \"n_layers\": 1, \"n_heads\": 4, \"n_kv_heads\": 4, "
                       "\"head_dim\": 4, \"d_ff\": 8, \"max_seq_len\": 32, \"attention\": {\"kind\": \"compressed\", "
                       "\"window\": 8, \"stride\": 8%s}}";
    char buf[1024];
    ps_config c;
    ps_error err;
    snprintf(buf, sizeof buf, base, ", \"head_offsets\": [0, 3, 5, 7]");
    CHECK_OK(ps_config_parse(buf, strlen(buf), "x.json", &c, &err), &err);
    CHECK(c.any_head_offset && c.head_offsets[1] == 3 && c.head_offsets[3] == 7 && ps_config_grid_offset(&c, 0, 2) == 5,
          "offsets parsed");
    char *js = ps_config_to_json(&c);
    ps_config c2;
    CHECK_OK(ps_config_parse(js, strlen(js), "round trip", &c2, &err), &err);
    CHECK(c2.any_head_offset && c2.head_offsets[2] == 5 && c2.n_grid_offsets == 4, "offsets round trip");
    char h1[17], h2[17];
    ps_config_hash(&c, h1);
    ps_config_hash(&c2, h2);
    CHECK(!strcmp(h1, h2), "hash of the round trip");
    free(js);
    snprintf(buf, sizeof buf, base, ", \"head_offsets\": \"staggered\"");
    CHECK_OK(ps_config_parse(buf, strlen(buf), "x.json", &c, &err), &err);
    CHECK(c.head_offsets[0] == 0 && c.head_offsets[1] == 2 && c.head_offsets[2] == 4 && c.head_offsets[3] == 6,
          "staggered: o_g = g*S/n_kv, got %lld %lld %lld %lld", (long long)c.head_offsets[0], (long long)c.head_offsets[1],
          (long long)c.head_offsets[2], (long long)c.head_offsets[3]);
    /* all-zero offsets and no key: the base model, whose canonical JSON (and hash) has no new key */
    snprintf(buf, sizeof buf, base, ", \"head_offsets\": [0, 0, 0, 0]");
    CHECK_OK(ps_config_parse(buf, strlen(buf), "x.json", &c, &err), &err);
    snprintf(buf, sizeof buf, base, "");
    CHECK_OK(ps_config_parse(buf, strlen(buf), "x.json", &c2, &err), &err);
    ps_config_hash(&c, h1);
    ps_config_hash(&c2, h2);
    js = ps_config_to_json(&c2);
    CHECK(!c.any_head_offset && !strcmp(h1, h2) && !strstr(js, "head_offsets"), "zero offsets are the base config");
    CHECK(memcmp(&c, &c2, sizeof c) == 0, "zero offsets parse to the same struct as no key");
    free(js);
    /* a full-attention model ignores the key (SPEC §2), in one normal form */
    const char *full = "{\"vocab_size\": 16, \"d_model\": 8, \"n_layers\": 1, \"n_heads\": 4, \"n_kv_heads\": 4, "
                       "\"head_dim\": 4, \"d_ff\": 8, \"max_seq_len\": 32, \"attention\": {\"kind\": \"full\", "
                       "\"head_offsets\": [3]}}";
    CHECK_OK(ps_config_parse(full, strlen(full), "full.json", &c, &err), &err);
    CHECK(!c.any_head_offset && c.n_grid_offsets == 0, "full attention: offsets ignored");
    /* every bad value names the key and the file */
    const char *bad[] = {", \"head_offsets\": [0, 1, 2]", ", \"head_offsets\": [0, 1, 2, 8]", ", \"head_offsets\": [0, -1, 2, 3]",
                         ", \"head_offsets\": [0, 1.5, 2, 3]", ", \"head_offsets\": \"diagonal\"", ", \"head_offsets\": 3"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(buf, sizeof buf, base, bad[i]);
        CHECK_ERR(ps_config_parse(buf, strlen(buf), "bad.json", &c, &err), &err, "bad.json", "head_offsets");
    }
}

/* ---- forward against the reference ---- */

/* B sequences of T tokens, sequence b on a grid shifted by shift[b] (NULL: none), against ref_forward_grid. */
static void compare_grid(const char *label, ps_config c, int T, int B, const int64_t *shift, uint64_t seed) {
    ps_model m;
    tu_random_model(&m, &c, seed, 0.5f);
    int64_t V = c.vocab_size;
    int32_t *tok = malloc((size_t)(B * T) * sizeof *tok);
    tu_random_tokens(tok, B * T, V, seed + 1);
    ps_acts a;
    ps_error err;
    REQUIRE_OK(ps_acts_create(&a, m.ctx, &c, B, T, false, &err), &err);
    if (shift) CHECK_OK(ps_acts_set_phase(&a, shift, &err), &err);
    CHECK_OK(ps_forward(&m, &a, tok, NULL, &err), &err);
    double *ref = malloc((size_t)(T * V) * sizeof(double));
    float *reff = malloc((size_t)(T * V) * sizeof(float));
    for (int b = 0; b < B; b++) {
        ref_forward_grid(&m, tok + b * T, T, shift ? (int)shift[b] : 0, ref);
        for (int64_t i = 0; i < T * V; i++) reff[i] = (float)ref[i];
        double e = rel_err_f(a.p.logits + (int64_t)b * T * V, reff, T * V);
        CHECK(e < 1e-5, "%s: sequence %d (shift %lld): logits rel err %.3g vs the plain-loop reference", label, b,
              shift ? (long long)shift[b] : 0LL, e);
    }
    free(ref);
    free(reff);
    free(tok);
    ps_acts_free(&a);
    ps_model_free(&m);
}

static void test_forward_reference(void) {
    int64_t o2[] = {0, 2}, o4[] = {1, 3, 0, 2}, sh[] = {0, 1, 3};
    ps_config c = small_cfg(4, 4, 4, 2);
    set_offsets(&c, o2);
    compare_grid("staggered W4/S4 [0,2]", c, 17, 1, NULL, 11);
    compare_grid("staggered W4/S4 [0,2] T=16 (last window absent for head 1)", c, 16, 1, NULL, 12);
    compare_grid("staggered + shifts", c, 18, 3, sh, 13);
    c = small_cfg(4, 4, 4, 4);
    set_offsets(&c, o4);
    c.payload = PS_PAYLOAD_SHARED;
    compare_grid("staggered MHA shared payload", c, 19, 2, NULL, 14);
    c = small_cfg(4, 2, 4, 2);
    int64_t oo[] = {1, 0};
    set_offsets(&c, oo);
    c.local_window = 3;
    compare_grid("overlap W4/S2 offsets LW3", c, 15, 1, NULL, 15);
    c = small_cfg(4, 4, 4, 2);
    c.rope = false;
    c.qk_norm = false;
    c.gate = PS_GATE_UNIFORM;
    compare_grid("phase shifts only, uniform gate, no rope/qk-norm", c, 17, 3, sh, 16);
    c = small_cfg(8, 8, 4, 2);
    compare_grid("base W8/S8 shift 0 = ref_forward", c, 24, 1, (int64_t[]){0}, 17);
    /* a shift outside [0, S) and a full-attention model are errors */
    ps_model m;
    tu_random_model(&m, &c, 18, 0.5f);
    ps_acts a;
    ps_error err;
    REQUIRE_OK(ps_acts_create(&a, m.ctx, &c, 1, 16, false, &err), &err);
    CHECK_ERR(ps_acts_set_phase(&a, (int64_t[]){8}, &err), &err, "phase shift 8", "stride");
    ps_acts_free(&a);
    ps_model_free(&m);
    ps_config f = tu_config(PS_ATTN_FULL);
    tu_random_model(&m, &f, 19, 0.5f);
    REQUIRE_OK(ps_acts_create(&a, m.ctx, &f, 1, 8, false, &err), &err);
    CHECK_ERR(ps_acts_set_phase(&a, (int64_t[]){0}, &err), &err, "compressed");
    ps_acts_free(&a);
    ps_model_free(&m);
}

/* The grid ops with woff NULL give the base ops' numbers; with all-zero offsets too. */
static void test_grid_ops_match_base(void) {
    ps_ctx *ctx;
    ps_error err;
    REQUIRE_OK(ps_ctx_create(&ctx, "cpu", &err), &err);
    enum { B = 2, T = 21, d = 6, W = 4, S = 3, nkv = 2, hd = 4, nkvhd = nkv * hd };
    int64_t nW = (T - W) / S + 1;
    ps_rng r;
    ps_rng_seed(&r, 5);
    static float in[B * T * d], u[W * nkv * d], bias[W * nkv], C[W * nkvhd * d], Cs[nkvhd * d], scratch[B * T * nkvhd];
    for (size_t i = 0; i < sizeof in / sizeof *in; i++) in[i] = (float)ps_rng_normal(&r);
    for (size_t i = 0; i < sizeof u / sizeof *u; i++) u[i] = (float)ps_rng_normal(&r);
    for (size_t i = 0; i < sizeof bias / sizeof *bias; i++) bias[i] = (float)ps_rng_normal(&r);
    for (size_t i = 0; i < sizeof C / sizeof *C; i++) C[i] = (float)ps_rng_normal(&r);
    for (size_t i = 0; i < sizeof Cs / sizeof *Cs; i++) Cs[i] = (float)ps_rng_normal(&r);
    int64_t zeros[B * nkv] = {0};
    int64_t ng = B * nW * nkv * W, np = B * nW * W * nkvhd;
    float *z1 = malloc(ng * 4), *a1 = malloc(ng * 4), *z2 = malloc(ng * 4), *a2 = malloc(ng * 4);
    float *p1 = malloc(np * 4), *p2 = malloc(np * 4);
    /* the base grid (heads share the table) and the same grid as a per-head table of zero offsets */
    int64_t gtab[2 * B * 6], ztab[2 * B * 6 * nkv], otab[2 * B * 6 * nkv];
    ps_windows gw = ps_windows_grid(gtab, gtab + B * nW, B, T, nW, W, S, nkv, NULL);
    ps_windows zw = ps_windows_grid(ztab, ztab + B * nW * nkv, B, T, nW, W, S, nkv, zeros);
    CHECK(ps_gate(ctx, z1, a1, in, u, bias, d, &gw) == 0, "gate");
    CHECK(ps_gate(ctx, z2, a2, in, u, bias, d, &zw) == 0, "gate, per-head table");
    CHECK(rel_err_f(a1, a2, ng) < 1e-6 && rel_err_f(z1, z2, ng) < 1e-6, "per-head table of offsets 0 = base grid (gate)");
    for (int sh = 0; sh < 2; sh++) {
        const float *Cx = sh ? Cs : C;
        CHECK(ps_payload(ctx, p1, in, Cx, sh, scratch, d, hd, &gw) == 0, "payload");
        CHECK(ps_payload(ctx, p2, in, Cx, sh, scratch, d, hd, &zw) == 0, "payload, per-head table");
        CHECK(rel_err_f(p1, p2, np) < 1e-6, "per-head table of offsets 0 = base grid (payload, shared %d): %.3g", sh,
              rel_err_f(p1, p2, np));
    }
    /* rope_windows on the base grid = rope with pos_step S; inverse undoes an offset grid's */
    int64_t nc = B * nW * nkv * hd;
    float *cos_t = malloc(T * (hd / 2) * 4), *sin_t = malloc(T * (hd / 2) * 4), *x1 = malloc(nc * 4), *x2 = malloc(nc * 4),
          *x0 = malloc(nc * 4);
    CHECK(ps_rope_table(ctx, cos_t, sin_t, T, hd, 10000.0) == 0, "rope table");
    for (int64_t i = 0; i < nc; i++) x0[i] = x1[i] = x2[i] = (float)ps_rng_normal(&r);
    ps_rope(ctx, x1, cos_t, sin_t, B, nW, nkv, hd, S);
    ps_rope_windows(ctx, x2, cos_t, sin_t, hd, &zw, 0);
    CHECK(rel_err_f(x1, x2, nc) < 1e-7, "rope_windows(offsets 0) = rope");
    int64_t off[B * nkv] = {1, 2, 0, 1};
    ps_windows ow = ps_windows_grid(otab, otab + B * nW * nkv, B, T, nW, W, S, nkv, off);
    ps_rope_windows(ctx, x2, cos_t, sin_t, hd, &ow, 0);
    ps_rope_windows(ctx, x2, cos_t, sin_t, hd, &ow, 1);
    ps_rope_windows(ctx, x2, cos_t, sin_t, hd, &zw, 1);
    CHECK(rel_err_f(x2, x0, nc) < 1e-5, "rope_windows inverse undoes the forward");
    /* a window outside [0, T) fails, naming the op */
    otab[B * nW * nkv + 1] = W, otab[1] = T - 2; /* window 0 of head 1 starts 2 before T */
    CHECK(ps_gate(ctx, z2, a2, in, u, bias, d, &ow) != 0, "a window past T rejected");
    CHECK(strstr(ctx->err.msg, "gate:") != NULL && strstr(ctx->err.msg, "KV head 1") != NULL, "message names the op and head: %s",
          ctx->err.msg);
    free(z1); free(a1); free(z2); free(a2); free(p1); free(p2); free(cos_t); free(sin_t); free(x0); free(x1); free(x2);
    ps_ctx_free(ctx);
}

/* ---- gradients: central finite differences of the reference ---- */

static void fd_grid(const char *label, ps_config c, int shift, uint64_t seed) {
    int64_t sh = shift;
    CHECK_TALLY(tu_fd_model(label, c, seed, 17, &sh, ref_forward_user, &shift));
}

static void test_gradients(void) {
    ps_config c = small_cfg(4, 4, 4, 2);
    int64_t o2[] = {0, 3}, o1[] = {1, 0};
    set_offsets(&c, o2);
    fd_grid("staggered W4/S4 [0,3]", c, 0, 100);
    fd_grid("staggered W4/S4 [0,3] + shift 2", c, 2, 110);
    c.payload = PS_PAYLOAD_SHARED;
    fd_grid("staggered shared payload + shift 1", c, 1, 120);
    c = small_cfg(4, 2, 4, 2);
    set_offsets(&c, o1);
    c.local_window = 3;
    fd_grid("overlap W4/S2 offsets [1,0]", c, 1, 130);
    c = small_cfg(4, 4, 2, 1);
    c.rope = false;
    c.qk_norm = false;
    c.tie_embeddings = false;
    fd_grid("phase shift 3, no rope/qk-norm, untied", c, 3, 140);
}

/* ---- hooks and gate statistics on a grid whose heads lack a window ---- */

static void test_hooks_and_gates(void) {
    ps_config c = small_cfg(4, 4, 4, 2);
    int64_t o2[] = {0, 2};
    set_offsets(&c, o2);
    ps_model m;
    tu_random_model(&m, &c, 200, 0.5f);
    enum { T = 16 };
    int32_t tok[T];
    tu_random_tokens(tok, T, c.vocab_size, 201);
    ps_gate_acc acc;
    ps_hooks h;
    ps_error err;
    ps_hooks_init(&h);
    REQUIRE_OK(ps_gate_acc_init(&acc, &c, &err), &err);
    REQUIRE_OK(ps_gate_acc_watch(&acc, &h, &c, &err), &err);
    ps_acts a;
    REQUIRE_OK(ps_acts_create(&a, m.ctx, &c, 1, T, true, &err), &err);
    CHECK_OK(ps_forward(&m, &a, tok, &h, &err), &err);
    /* T = 16, W = S = 4: head 0 has windows 0..3, head 1 (offset 2) windows 0..2 only */
    ps_gate_stat st0, st1;
    ps_gate_acc_stat(&acc, 0, 0, PS_BRANCH_KEY, &st0);
    ps_gate_acc_stat(&acc, 0, 1, PS_BRANCH_KEY, &st1);
    CHECK(st0.n_windows == 4 && st1.n_windows == 3, "windows pooled per head: %lld, %lld", (long long)st0.n_windows,
          (long long)st1.n_windows);
    double s = 0;
    for (int i = 0; i < 4; i++) s += st1.mean_gate[i];
    CHECK(fabs(s - 1) < 1e-6, "mean gate of the offset head sums to 1 (%g)", s);
    ps_act_ptrs p = ps_acts_layer(&a, 0);
    int64_t nW = a.nW, hd = c.head_dim, nkv = 2;
    double ab = 0, pr = 0;
    for (int64_t e = 0; e < hd; e++) {
        ab += fabs(p.ck[((nW - 1) * nkv + 1) * hd + e]) + fabs(p.cv[((nW - 1) * nkv + 1) * hd + e]);
        pr += fabs(p.ck[((nW - 1) * nkv + 0) * hd + e]);
    }
    CHECK(nW == 4 && ab == 0 && pr > 0, "the absent window's entries are 0 (%g), the present one's not (%g)", ab, pr);
    ps_acts_free(&a);
    ps_hooks_free(&h);
    ps_gate_acc_free(&acc);
    ps_model_free(&m);
}

/* ---- the knockout grid on staggered grids: the batched path (restarted passes, replicas of the kept
 * compressed entries) against the naive full forward with mean-replacement actions ---- */

static void test_knockout_staggered(int per_layer) {
    ps_config c = tu_config(PS_ATTN_COMPRESSED);
    c.n_layers = 2;
    c.max_seq_len = 40;
    c.window = 4; c.stride = 4; c.local_window = 4;
    int64_t o[32] = {0};
    ps_error err;
    if (per_layer) { /* layer 1's grid is layer 0's moved by 3 */
        for (int64_t l = 0; l < 2; l++)
            for (int64_t g = 0; g < c.n_kv_heads; g++) o[l * c.n_kv_heads + g] = (g * 4 / c.n_kv_heads + 3 * l) % 4;
        REQUIRE_OK(ps_config_set_grid_offsets(&c, o, 2, &err), &err);
        CHECK(ps_config_per_layer_offsets(&c), "the test grid is per layer");
    } else {
        for (int64_t g = 0; g < c.n_kv_heads; g++) o[g] = (g * 4 / c.n_kv_heads);
        set_offsets_n(&c, o, c.n_kv_heads);
    }
    CHECK(c.any_head_offset, "the test grid is offset");
    ps_model m;
    tu_random_model(&m, &c, 300, 0.5f);
    ps_task t = {.kind = PS_TASK_KV, .seq_len = 30, .n_keys = 6, .n_values = 6, .n_fillers = 3, .n_pairs = 3,
                 .key_len = 1, .value_len = 2, .gap_min = 0, .gap_max = 3, .query_gap = 4, .n_queries = 2};
    ps_batch base;
    const int64_t N = 10, P = 4, batch = 4;
    REQUIRE_OK(ps_batch_alloc(&base, N, t.seq_len, t.n_queries, &err), &err);
    CHECK(ps_task_generate(&t, 13, &base, NULL) == 0, "task generation");
    ps_filler_family fam = {.name = "repeat", .n_pattern = 1, .pattern = {0}};
    int layers[2] = {0, 1}, heads[2] = {0, 1};
    ps_knockout_result naive, fast;
    ps_knockout_opts on = {.naive = 1};
    REQUIRE_OK(tu_knockout_opts(&m, &base, &t, &fam, P, 0, batch, layers, 2, heads, 2, PS_KO_COMPRESSED, &on, &naive, NULL,
                                     NULL, &err), &err);
    REQUIRE_OK(tu_knockout_opts(&m, &base, &t, &fam, P, 0, batch, layers, 2, heads, 2, PS_KO_COMPRESSED, NULL, &fast, NULL, NULL, &err),
               &err);
    int same = 1, changed = 0;
    double worst = 0;
    for (int cell = 0; cell < 4; cell++)
        for (int r = 0; r < P; r++) {
            same &= naive.cells[cell].k[r] == fast.cells[cell].k[r] && naive.cells[cell].n[r] == fast.cells[cell].n[r];
            worst = fmax(worst, fabs(naive.cells[cell].lp[r] - fast.cells[cell].lp[r]) / fmax(1e-9, fabs(naive.cells[cell].lp[r])));
            changed |= fabs(naive.cells[cell].lp[r] - naive.clean.lp[r]) > 1e-3 * fabs(naive.clean.lp[r]);
        }
    CHECK(same && worst < 1e-5, "%s knockout: batched grid differs from the naive one (rel %g)", per_layer ? "per-layer" : "staggered",
          worst);
    CHECK(changed, "%s knockout changed nothing (the comparison would be vacuous)", per_layer ? "per-layer" : "staggered");
    ps_knockout_result_free(&naive);
    ps_knockout_result_free(&fast);
    ps_batch_free(&base);
    ps_model_free(&m);
}

/* ---- per-layer grids (attention.head_offsets "staggered_layers" or [n_layers][n_kv_heads]) ---- */

static void test_config_layers(void) {
    /* k of "staggered_layers": coprime with S, nearest 0.382 S */
    CHECK(ps_config_layer_stagger(8) == 3 && ps_config_layer_stagger(4) == 1 && ps_config_layer_stagger(1) == 0 &&
              ps_config_layer_stagger(2) == 1 && ps_config_layer_stagger(16) == 7 && ps_config_layer_stagger(6) == 1 &&
              ps_config_layer_stagger(3) == 1,
          "layer stagger k: S 8 -> %lld, 4 -> %lld, 16 -> %lld", (long long)ps_config_layer_stagger(8),
          (long long)ps_config_layer_stagger(4), (long long)ps_config_layer_stagger(16));
    const char *base = "{\"vocab_size\": 16, \"d_model\": 8, \"n_layers\": 3, \"n_heads\": 4, \"n_kv_heads\": %d, "
                       "\"head_dim\": 4, \"d_ff\": 8, \"max_seq_len\": 32, \"attention\": {\"kind\": \"%s\", "
                       "\"window\": 8, \"stride\": 8%s}}";
    char buf[1024];
    ps_config c, c2;
    ps_error err;
    char h1[17], h2[17];
    /* "staggered_layers", n_kv 4, S 8: o_{l,g} = (2g + 3l) mod 8 */
    snprintf(buf, sizeof buf, base, 4, "compressed", ", \"head_offsets\": \"staggered_layers\"");
    CHECK_OK(ps_config_parse(buf, strlen(buf), "x.json", &c, &err), &err);
    int ok = ps_config_per_layer_offsets(&c) && c.any_head_offset;
    for (int l = 0; l < 3; l++)
        for (int g = 0; g < 4; g++) ok &= ps_config_grid_offset(&c, l, g) == (2 * g + 3 * l) % 8;
    CHECK(ok, "staggered_layers: o_{l,g} = (g*S/n_kv + 3l) mod 8 (layer 1 head 0: %lld, layer 2 head 3: %lld)",
          (long long)ps_config_grid_offset(&c, 1, 0), (long long)ps_config_grid_offset(&c, 2, 3));
    /* the checkpoint form: the resolved 2-D list, which reads back to the same struct and hash */
    char *js = ps_config_to_json(&c);
    CHECK(strstr(js, "[") && strstr(js, "head_offsets"), "per-layer offsets written");
    CHECK_OK(ps_config_parse(js, strlen(js), "round trip", &c2, &err), &err);
    ps_config_hash(&c, h1);
    ps_config_hash(&c2, h2);
    CHECK(memcmp(&c, &c2, sizeof c) == 0 && !strcmp(h1, h2), "per-layer offsets round trip (struct and hash)");
    free(js);
    /* an explicit 2-D list */
    snprintf(buf, sizeof buf, base, 2, "compressed", ", \"head_offsets\": [[0, 0], [1, 7], [0, 5]]");
    CHECK_OK(ps_config_parse(buf, strlen(buf), "x.json", &c, &err), &err);
    CHECK(ps_config_per_layer_offsets(&c) && ps_config_grid_offset(&c, 0, 1) == 0 && ps_config_grid_offset(&c, 1, 1) == 7 &&
              ps_config_grid_offset(&c, 2, 1) == 5 && ps_config_grid_offset(&c, 1, 0) == 1,
          "2-D offsets parsed");
    /* equal rows are the per-head form; all-zero rows the base config (one struct, one hash) */
    snprintf(buf, sizeof buf, base, 2, "compressed", ", \"head_offsets\": [[0, 4], [0, 4], [0, 4]]");
    CHECK_OK(ps_config_parse(buf, strlen(buf), "x.json", &c, &err), &err);
    snprintf(buf, sizeof buf, base, 2, "compressed", ", \"head_offsets\": [0, 4]");
    CHECK_OK(ps_config_parse(buf, strlen(buf), "x.json", &c2, &err), &err);
    CHECK(!ps_config_per_layer_offsets(&c) && memcmp(&c, &c2, sizeof c) == 0, "equal rows = the per-head form");
    snprintf(buf, sizeof buf, base, 2, "compressed", ", \"head_offsets\": [[0, 0], [0, 0], [0, 0]]");
    CHECK_OK(ps_config_parse(buf, strlen(buf), "x.json", &c, &err), &err);
    snprintf(buf, sizeof buf, base, 2, "compressed", "");
    CHECK_OK(ps_config_parse(buf, strlen(buf), "x.json", &c2, &err), &err);
    CHECK(!c.any_head_offset && memcmp(&c, &c2, sizeof c) == 0, "all-zero rows = the base config");
    /* one layer: "staggered_layers" is "staggered" */
    const char *one = "{\"vocab_size\": 16, \"d_model\": 8, \"n_layers\": 1, \"n_heads\": 4, \"n_kv_heads\": 4, \"head_dim\": 4, "
                      "\"d_ff\": 8, \"max_seq_len\": 32, \"attention\": {\"kind\": \"compressed\", \"window\": 8, \"stride\": 8, "
                      "\"head_offsets\": \"%s\"}}";
    snprintf(buf, sizeof buf, one, "staggered_layers");
    CHECK_OK(ps_config_parse(buf, strlen(buf), "x.json", &c, &err), &err);
    snprintf(buf, sizeof buf, one, "staggered");
    CHECK_OK(ps_config_parse(buf, strlen(buf), "x.json", &c2, &err), &err);
    CHECK(memcmp(&c, &c2, sizeof c) == 0, "one layer: staggered_layers = staggered");
    /* every bad value names the key and the file */
    const char *bad[] = {", \"head_offsets\": [[0, 1], [2, 3]]",         /* 2 rows, 3 layers */
                         ", \"head_offsets\": [[0, 1, 2], [0, 1, 2], [0, 1, 2]]", /* rows of 3, 2 KV heads */
                         ", \"head_offsets\": [[0, 1], [2], [0, 1]]",     /* a ragged row */
                         ", \"head_offsets\": [[0, 1], [2, 8], [0, 1]]",  /* >= S */
                         ", \"head_offsets\": [[0, 1], [2, -1], [0, 1]]", /* negative */
                         ", \"head_offsets\": [[0, 1], [2, 1.5], [0, 1]]",
                         ", \"head_offsets\": [[0, 1], 3, [0, 1]]",
                         ", \"head_offsets\": [[], [], []]",
                         ", \"head_offsets\": \"staggered_layer\""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(buf, sizeof buf, base, 2, "compressed", bad[i]);
        CHECK_ERR(ps_config_parse(buf, strlen(buf), "bad.json", &c, &err), &err, "bad.json", "head_offsets");
    }
    /* the per-layer forms on another kind are refused (not ignored as the per-head list is on full attention) */
    snprintf(buf, sizeof buf, base, 2, "full", ", \"head_offsets\": \"staggered_layers\"");
    CHECK_ERR(ps_config_parse(buf, strlen(buf), "full.json", &c, &err), &err, "full.json", "head_offsets", "compressed");
    snprintf(buf, sizeof buf, base, 2, "full", ", \"head_offsets\": [[0, 1], [2, 3], [0, 1]]");
    CHECK_ERR(ps_config_parse(buf, strlen(buf), "full.json", &c, &err), &err, "full.json", "head_offsets", "compressed");
    const char *v4 = "{\"vocab_size\": 16, \"d_model\": 8, \"n_layers\": 3, \"n_heads\": 4, \"n_kv_heads\": 1, \"head_dim\": 4, "
                     "\"d_ff\": 8, \"max_seq_len\": 32, \"attention\": {\"kind\": \"channel\", \"rate\": 4, "
                     "\"head_offsets\": \"staggered_layers\"}}";
    CHECK_ERR(ps_config_parse(v4, strlen(v4), "v4.json", &c, &err), &err, "v4.json", "head_offsets");
    /* ps_config_set_grid_offsets: the same checks */
    c = small_cfg(4, 4, 4, 2);
    int64_t o3[6] = {0, 1, 2, 3, 0, 1}, o4[4] = {0, 1, 2, 4};
    CHECK_ERR(ps_config_set_grid_offsets(&c, o3, 3, &err), &err, "head_offsets", "rows");
    CHECK_ERR(ps_config_set_grid_offsets(&c, o4, 2, &err), &err, "head_offsets", "entry [1][1]");
    CHECK_OK(ps_config_set_grid_offsets(&c, o3, 2, &err), &err);
    CHECK_OK(ps_config_validate(&c, "set", &err), &err);
    CHECK(ps_config_per_layer_offsets(&c) && ps_config_grid_offset(&c, 1, 1) == 3, "set_grid_offsets");
    c.n_offset_layers = 3; /* a struct whose rows do not match its layers */
    CHECK_ERR(ps_config_validate(&c, "v.json", &err), &err, "v.json", "head_offsets", "n_layers");
}

/* Forward (against the reference, which takes each layer's offsets), gradients, the answer-row restart and a
 * layer whose offsets are all 0 against the base model's layer. */
static void test_forward_layers(void) {
    ps_error err;
    int64_t o[4] = {0, 2, 3, 1}, sh[] = {0, 1, 3};
    ps_config c = small_cfg(4, 4, 4, 2);
    REQUIRE_OK(ps_config_set_grid_offsets(&c, o, 2, &err), &err);
    compare_grid("per-layer [[0,2],[3,1]]", c, 17, 1, NULL, 411);
    compare_grid("per-layer [[0,2],[3,1]] + shifts", c, 18, 3, sh, 412);
    ps_config c2 = small_cfg(4, 2, 4, 2);
    int64_t o2[4] = {1, 0, 0, 1};
    c2.local_window = 3;
    c2.payload = PS_PAYLOAD_SHARED;
    REQUIRE_OK(ps_config_set_grid_offsets(&c2, o2, 2, &err), &err);
    compare_grid("per-layer overlap W4/S2 shared payload LW3", c2, 15, 2, NULL, 413);
    fd_grid("per-layer [[0,2],[3,1]]", c, 0, 414);
    fd_grid("per-layer [[0,2],[3,1]] + shift 2", c, 2, 415);

    /* the answer-row restart (the last layer's grid) and the restart from each layer's attention */
    enum { T = 18 };
    int32_t tok[2 * T];
    tu_random_tokens(tok, 2 * T, c.vocab_size, 416);
    ps_model m;
    tu_random_model(&m, &c, 417, 0.5f);
    int64_t V = c.vocab_size;
    ps_acts a;
    REQUIRE_OK(ps_acts_create(&a, m.ctx, &c, 2, T, true, &err), &err);
    CHECK_OK(ps_forward(&m, &a, tok, NULL, &err), &err);
    float *full = malloc((size_t)(2 * T * V) * sizeof(float));
    memcpy(full, a.p.logits, (size_t)(2 * T * V) * sizeof(float));
    for (int l = 0; l < 2; l++) {
        CHECK_OK(ps_forward_from_attention(&m, &a, l, NULL, &err), &err);
        CHECK(rel_err_f(a.p.logits, full, 2 * T * V) < 1e-6, "per-layer grid: forward_from_attention(%d) differs", l);
        int64_t rows[3] = {5, T - 1, 2 * T - 1};
        memset(a.p.logits, 0, (size_t)(2 * T * V) * sizeof(float));
        CHECK_OK(ps_forward_from_attention_rows(&m, &a, l, NULL, rows, 3, &err), &err);
        double e = 0;
        for (int i = 0; i < 3; i++) e = fmax(e, rel_err_f(a.p.logits + rows[i] * V, full + rows[i] * V, V));
        CHECK(e < 1e-5, "per-layer grid: forward_from_attention_rows(%d): rows differ by %.3g", l, e);
    }
    ps_acts_free(&a);
    ps_model_free(&m);

    /* layer 0 all 0, layer 1 offset: layer 0 is the base model's layer 0 (same weights), layer 1 is not */
    int64_t oz[4] = {0, 0, 1, 3};
    ps_config cz = small_cfg(4, 4, 4, 2), cb = cz;
    REQUIRE_OK(ps_config_set_grid_offsets(&cz, oz, 2, &err), &err);
    ps_model mz, mb;
    tu_random_model(&mz, &cz, 418, 0.5f);
    tu_random_model(&mb, &cb, 418, 0.5f);
    ps_acts az, ab;
    REQUIRE_OK(ps_acts_create(&az, mz.ctx, &cz, 2, T, true, &err), &err);
    REQUIRE_OK(ps_acts_create(&ab, mb.ctx, &cb, 2, T, true, &err), &err);
    CHECK_OK(ps_forward(&mz, &az, tok, NULL, &err), &err);
    CHECK_OK(ps_forward(&mb, &ab, tok, NULL, &err), &err);
    int64_t BTd = 2 * T * cz.d_model;
    double e1 = rel_err_f(az.p.resid + BTd, ab.p.resid + BTd, BTd), e2 = rel_err_f(az.p.resid + 2 * BTd, ab.p.resid + 2 * BTd, BTd);
    CHECK(ps_acts_woff(&az, 0) && ps_acts_woff(&az, 0)[1] == 0 && ps_acts_woff(&az, 1)[1] == 3 && ps_acts_woff(&ab, 0) == NULL,
          "per-layer woff tables");
    CHECK(e1 < 1e-6, "a layer of all-zero offsets differs from the base model's layer by %.3g", e1);
    CHECK(e2 > 1e-3, "the offset layer equals the base layer (%.3g): the comparison would be vacuous", e2);
    ps_acts_free(&az);
    ps_acts_free(&ab);
    ps_model_free(&mz);
    ps_model_free(&mb);
    free(full);
}

/* Gate statistics report each layer's own grid offset; the chunked prefill equals the forward. */
static void test_gates_prefill_layers(void) {
    ps_error err;
    ps_config c = small_cfg(4, 4, 4, 2);
    int64_t o[4] = {0, 2, 3, 1};
    REQUIRE_OK(ps_config_set_grid_offsets(&c, o, 2, &err), &err);
    ps_model m;
    tu_random_model(&m, &c, 420, 0.5f);
    enum { T = 16 };
    int32_t tok[T];
    tu_random_tokens(tok, T, c.vocab_size, 421);
    ps_gate_acc acc;
    ps_hooks h;
    ps_hooks_init(&h);
    REQUIRE_OK(ps_gate_acc_init(&acc, &c, &err), &err);
    REQUIRE_OK(ps_gate_acc_watch(&acc, &h, &c, &err), &err);
    ps_acts a;
    REQUIRE_OK(ps_acts_create(&a, m.ctx, &c, 1, T, true, &err), &err);
    CHECK_OK(ps_forward(&m, &a, tok, &h, &err), &err);
    /* T = 16, W = S = 4: a head with offset 0 has 4 windows, any other 3 */
    int ok = 1;
    for (int l = 0; l < 2; l++)
        for (int g = 0; g < 2; g++) {
            ps_gate_stat st;
            ps_gate_acc_stat(&acc, l, g, PS_BRANCH_VALUE, &st);
            ok &= st.n_windows == (o[l * 2 + g] ? 3 : 4);
        }
    CHECK(ok, "windows pooled per (layer, head) follow that layer's grid");
    json_t *js = ps_gate_acc_to_json(&acc, &c);
    json_t *ls = json_object_get(js, "layers");
    for (int l = 0; l < 2; l++)
        for (int g = 0; g < 2; g++) {
            json_t *ho = json_array_get(json_object_get(json_array_get(ls, (size_t)l), "heads"), (size_t)g);
            CHECK(json_integer_value(json_object_get(ho, "grid_offset")) == o[l * 2 + g], "gates.json: layer %d head %d grid_offset %lld",
                  l, g, (long long)json_integer_value(json_object_get(ho, "grid_offset")));
        }
    json_decref(js);
    /* the chunked prefill (chunks of 5: windows of both layers' grids close inside chunks and across them) */
    ps_prefill p;
    int64_t pos[T];
    float *got = malloc((size_t)(T * c.vocab_size) * sizeof(float));
    for (int64_t t = 0; t < T; t++) pos[t] = T - 1 - t;
    REQUIRE_OK(ps_prefill_create(&p, &m, T, 5, &err), &err);
    CHECK_OK(ps_prefill_logits(&p, tok, T, pos, T, got, &err), &err);
    double worst = 0;
    for (int64_t i = 0; i < T; i++)
        worst = fmax(worst, rel_err_f(got + i * c.vocab_size, a.p.logits + pos[i] * c.vocab_size, c.vocab_size));
    CHECK(worst < 1e-5, "per-layer grid: the chunked prefill differs from the forward by %.3g", worst);
    ps_prefill_free(&p);
    free(got);
    ps_acts_free(&a);
    ps_hooks_free(&h);
    ps_gate_acc_free(&acc);
    ps_model_free(&m);
}

/* ---- the gate regulariser op ---- */

static double reg_value(const float *alpha, int64_t B, int64_t nW, int64_t nkv, int64_t W, double weight) {
    double v = 0;
    for (int64_t g = 0; g < nkv; g++) {
        double m[16] = {0};
        int64_t n = 0;
        for (int64_t bj = 0; bj < B * nW; bj++) {
            const float *al = alpha + (bj * nkv + g) * W;
            double s = 0;
            for (int64_t i = 0; i < W; i++) s += al[i];
            if (s <= 0) continue;
            for (int64_t i = 0; i < W; i++) m[i] += al[i];
            n++;
        }
        double H = 0;
        for (int64_t i = 0; i < W; i++)
            if (m[i] > 0) H -= m[i] / n * log(m[i] / n);
        v += weight * (log((double)W) - H);
    }
    return v;
}

static void test_gate_regulariser(void) {
    ps_ctx *ctx;
    ps_error err;
    REQUIRE_OK(ps_ctx_create(&ctx, "cpu", &err), &err);
    enum { B = 2, nW = 3, nkv = 2, W = 4 };
    float alpha[B * nW * nkv * W], dal[B * nW * nkv * W];
    ps_rng r;
    ps_rng_seed(&r, 7);
    for (int64_t k = 0; k < B * nW * nkv; k++) {
        double s = 0, e[W];
        for (int i = 0; i < W; i++) s += (e[i] = exp(2 * ps_rng_normal(&r)));
        for (int i = 0; i < W; i++) alpha[k * W + i] = (float)(e[i] / s);
    }
    for (int i = 0; i < W; i++) alpha[(5 * nkv + 1) * W + i] = 0; /* an absent window (b 1, j 2, head 1) */
    memset(dal, 0, sizeof dal);
    double v = 0, w = 0.3;
    CHECK(ps_gate_entropy(ctx, &v, dal, alpha, B, nW, nkv, W, w) == 0, "gate_entropy");
    double ref = reg_value(alpha, B, nW, nkv, W, w);
    CHECK(fabs(v - ref) < 1e-9, "value %.10g vs plain loop %.10g", v, ref);
    CHECK(v > 0, "concentrated gates have a positive deficit");
    double worst = 0;
    for (int64_t k = 0; k < B * nW * nkv * W; k++) {
        if (k / W == 5 * nkv + 1) {
            CHECK(dal[k] == 0, "no gradient into an absent window");
            continue;
        }
        float keep = alpha[k];
        alpha[k] = keep + 1e-3f;
        double up = reg_value(alpha, B, nW, nkv, W, w);
        alpha[k] = keep - 1e-3f;
        double dn = reg_value(alpha, B, nW, nkv, W, w);
        alpha[k] = keep;
        double fd = (up - dn) / 2e-3;
        worst = fmax(worst, fabs(fd - dal[k]) / fmax(1e-3, fabs(fd)));
    }
    CHECK(worst < 1e-3, "gradient vs finite differences: rel err %.3g", worst);
    /* a uniform pooled gate has no deficit */
    for (int64_t k = 0; k < B * nW * nkv * W; k++) alpha[k] = 0.25f;
    v = 0;
    CHECK(ps_gate_entropy(ctx, &v, NULL, alpha, B, nW, nkv, W, w) == 0 && fabs(v) < 1e-9, "uniform: %g", v);
    ps_ctx_free(ctx);
}

int main(void) {
    test_config_key();
    test_forward_reference();
    test_grid_ops_match_base();
    test_gradients();
    test_hooks_and_gates();
    test_knockout_staggered(0);
    test_knockout_staggered(1);
    test_config_layers();
    test_forward_layers();
    test_gates_prefill_layers();
    test_gate_regulariser();
    CHECK_DONE();
}
