#include "core/forward.h"

#include "core/chunks.h"
#include "core/windows.h"
#include "core/fileio.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- size table ---- */

typedef struct {
    float **ptr;
    int64_t n;      /* floats per slot */
    bool per_layer; /* one slot per layer when keep_all */
} act_spec;

static int build_specs(act_spec *s, ps_act_ptrs *p, const ps_config *c, int64_t B, int64_t T, int64_t nW,
                       int64_t max_rows) {
    int64_t BT = B * T, d = c->d_model, hd = c->head_dim, nh = c->n_heads, nkv = c->n_kv_heads, L = c->n_layers;
    int comp = c->kind == PS_ATTN_COMPRESSED;
    int64_t W = comp ? c->window : 0;
    int k = 0;
#define SPEC(field, count, pl) s[k++] = (act_spec){&p->field, (count), (pl)}
    SPEC(resid, (L + 1) * BT * d, false);
    SPEC(ln1, BT * d, true);
    SPEC(ln1_rstd, BT, true);
    SPEC(q_pre, BT * nh * hd, true);
    SPEC(q, BT * nh * hd, true);
    SPEC(q_rstd, BT * nh, true);
    SPEC(k_pre, BT * nkv * hd, true);
    SPEC(k, BT * nkv * hd, true);
    SPEC(k_rstd, BT * nkv, true);
    SPEC(v, c->kind == PS_ATTN_CHANNEL ? 0 : BT * nkv * hd, true); /* channel attention: K = V */
    SPEC(gz_k, B * nW * nkv * W, true);
    SPEC(ga_k, B * nW * nkv * W, true);
    SPEC(gz_v, B * nW * nkv * W, true);
    SPEC(ga_v, B * nW * nkv * W, true);
    SPEC(pk, B * nW * W * nkv * hd, true);
    SPEC(pv, B * nW * W * nkv * hd, true);
    SPEC(ck_pre, B * nW * nkv * hd, true);
    SPEC(ck, B * nW * nkv * hd, true);
    SPEC(ck_rstd, B * nW * nkv, true);
    SPEC(cv, B * nW * nkv * hd, true);
    SPEC(lse, B * nh * T, true);
    SPEC(z, BT * nh * hd, true);
    SPEC(attn_out, BT * d, true);
    SPEC(resid_mid, BT * d, true);
    SPEC(ln2, BT * d, true);
    SPEC(ln2_rstd, BT, true);
    SPEC(mlp_g, BT * c->d_ff, true);
    SPEC(mlp_u, BT * c->d_ff, true);
    SPEC(mlp_h, BT * c->d_ff, true);
    SPEC(mlp_out, BT * d, true);
    SPEC(lnf, BT * d, false);
    SPEC(lnf_rstd, BT, false);
    SPEC(logits, (max_rows ? max_rows : BT) * c->vocab_size, false);
    SPEC(lnf_rows, max_rows * d, false);
    SPEC(rope_cos, c->rope ? T * (hd / 2) : 0, false);
    SPEC(rope_sin, c->rope ? T * (hd / 2) : 0, false);
    SPEC(payload_scratch, comp && c->payload == PS_PAYLOAD_SHARED ? BT * nkv * hd : 0, false);
    int channel = c->kind == PS_ATTN_CHANNEL;
    int64_t cs = channel ? ps_config_v4_series(c) : 0, S4 = channel ? ps_config_v4_slots(c) : 0;
    SPEC(c_kv_raw, BT * cs * hd, true);
    SPEC(c_z, BT * cs * hd, true);
    SPEC(c_gate, B * nW * S4 * hd, true);
    SPEC(c_alpha, B * nW * S4 * hd, true);
    SPEC(z_pre, channel ? BT * nh * hd : 0, true);
    SPEC(sinkp, channel ? B * nh * T : 0, true);
    int sel = c->kind == PS_ATTN_SELECT;
    ps_select_cfg sc = ps_config_select(c);
    int64_t N1 = sel ? ps_select_n_windows(T, c->window, c->stride) : 0, N2 = sel ? ps_select_n_windows(T, 4 * c->window, 4 * c->stride) : 0;
    int64_t nb = sel ? ps_select_n_blocks(&sc, T) : 0, ns = sel ? ps_select_slots(&sc) : 0;
    SPEC(sel_k1, B * N1 * nkv * hd, false);
    SPEC(sel_k2, B * N2 * nkv * hd, false);
    SPEC(sel_P, BT * nkv * N1, false);
    SPEC(sel_bs, BT * nkv * nb, false);
    SPEC(sel_blocks, BT * nkv * ns, true);
#undef SPEC
    return k;
}

/* Floats of the pattern hook's scratch: the compact rows [B, nh, T, ncols] and, compressed, the wide
 * rows [B, nh, T, nW + T] the hook sees. Allocated on the first pattern hook only. */
static int64_t pattern_floats(const ps_config *c, int64_t B, int64_t T) {
    int comp = c->kind == PS_ATTN_COMPRESSED;
    int64_t nW = ps_config_n_windows(c, T), LW = comp ? (c->local_window < T ? c->local_window : T) : 0;
    int64_t rows = B * c->n_heads * T;
    return comp ? rows * (nW + LW) + rows * (nW + T) : rows * T;
}

int64_t ps_acts_size(const ps_config *cfg, int64_t B, int64_t T, bool keep_all, bool pattern_hook) {
    act_spec s[56];
    ps_act_ptrs p;
    int n = build_specs(s, &p, cfg, B, T, ps_config_n_windows(cfg, T), 0);
    int64_t tot = pattern_hook ? pattern_floats(cfg, B, T) : 0;
    for (int i = 0; i < n; i++) tot += s[i].n * (s[i].per_layer && keep_all ? cfg->n_layers : 1);
    return tot;
}

int ps_acts_create(ps_acts *a, ps_ctx *ctx, const ps_config *cfg, int64_t B, int64_t T, bool keep_all, ps_error *err) {
    return ps_acts_create_rows(a, ctx, cfg, B, T, keep_all, 0, err);
}

int ps_acts_create_rows(ps_acts *a, ps_ctx *ctx, const ps_config *cfg, int64_t B, int64_t T, bool keep_all,
                        int64_t max_rows, ps_error *err) {
    memset(a, 0, sizeof *a);
    a->ctx = ctx;
    a->cfg = cfg;
    if (B < 1 || T < 1) return ps_fail(err, "batch of %lld sequences of %lld tokens: both must be >= 1", (long long)B, (long long)T);
    if (max_rows < 0 || max_rows > B * T)
        return ps_fail(err, "logit rows: %lld asked for, a batch of %lld x %lld has %lld rows", (long long)max_rows, (long long)B,
                       (long long)T, (long long)(B * T));
    if (T > cfg->max_seq_len)
        return ps_fail(err, "sequence of %lld tokens exceeds max_seq_len %lld by %lld", (long long)T,
                       (long long)cfg->max_seq_len, (long long)(T - cfg->max_seq_len));
    a->B = B;
    a->T = T;
    a->nW = ps_config_n_windows(cfg, T);
    a->keep_all = keep_all;
    int comp = cfg->kind == PS_ATTN_COMPRESSED;
    a->geom = (ps_attn_geom){.B = B, .T = T, .nh = cfg->n_heads, .nkv = cfg->n_kv_heads, .hd = cfg->head_dim,
                             .compressed = comp, .W = cfg->window, .S = cfg->stride,
                             .LW = comp ? (cfg->local_window < T ? cfg->local_window : T) : 0, .nW = a->nW};
    a->geom.ncols = comp ? a->nW + a->geom.LW : T;
    if (cfg->kind == PS_ATTN_CHANNEL)
        a->geom4 = (ps_v4_attn_geom){.B = B, .T = T, .H = cfg->n_heads, .Dh = cfg->head_dim, .nW = a->nW, .K = 0,
                                     .W = cfg->local_window, .m = cfg->rate, .scale = (float)(1.0 / sqrt((double)cfg->head_dim))};
    act_spec s[56];
    int n = build_specs(s, &a->p, cfg, B, T, a->nW, max_rows);
    a->max_rows = max_rows;
    if (max_rows && !(a->rows = malloc((size_t)max_rows * sizeof *a->rows)))
        return ps_fail(err, "out of memory for %lld logit rows", (long long)max_rows);
    double tot = 0;
    for (int i = 0; i < n; i++) tot += (double)s[i].n * (s[i].per_layer && keep_all ? (double)cfg->n_layers : 1.0);
    if (tot * 4 > 256e9)
        return ps_fail(err, "activations for B=%lld, T=%lld would need %.1f GB; refusing", (long long)B, (long long)T,
                       tot * 4 / 1e9);
    uint64_t avail = ps_ctx_mem_free(ctx);
    if (avail && tot * 4 > (double)avail)
        return ps_fail(err, "activations for B=%lld, T=%lld need %.2f GiB but only %.2f GiB of memory is available (%s)",
                       (long long)B, (long long)T, tot * 4 / 1073741824.0, (double)avail / 1073741824.0, ps_ctx_backend_name(ctx));
    a->n_floats = (int64_t)tot;
    char what[96];
    snprintf(what, sizeof what, "activations for B=%lld, T=%lld", (long long)B, (long long)T);
    a->buf = ps_buf_alloc(ctx, a->n_floats * (int64_t)sizeof(float), what, err);
    if (!a->buf) return -1;
    int64_t off = 0;
    for (int i = 0; i < n; i++) {
        *s[i].ptr = s[i].n ? a->buf + off : NULL;
        int64_t slots = s[i].per_layer && keep_all ? cfg->n_layers : 1;
        a->layer_stride[(float **)s[i].ptr - (float **)&a->p] = s[i].per_layer && keep_all ? s[i].n : 0;
        off += s[i].n * slots;
    }
    if (comp) { /* the window table (ps_acts_windows) */
        int64_t n = B * a->nW * cfg->n_kv_heads > 0 ? B * a->nW * cfg->n_kv_heads : 1;
        a->win_start = calloc((size_t)n, sizeof *a->win_start), a->win_len = calloc((size_t)n, sizeof *a->win_len);
        if (!a->win_start || !a->win_len) {
            ps_acts_free(a);
            return ps_fail(err, "out of memory for the window tables of %lld sequences", (long long)B);
        }
    }
    if (comp && cfg->boundaries == PS_BOUNDARIES_CONTENT) { /* the chunk tables, filled by ps_acts_set_chunks */
        int64_t n = B * a->nW > 0 ? B * a->nW : 1;
        a->cs = calloc((size_t)n, sizeof *a->cs), a->cl = calloc((size_t)n, sizeof *a->cl);
        a->cend = malloc((size_t)n * sizeof *a->cend);
        if (!a->cs || !a->cl || !a->cend) {
            ps_acts_free(a);
            return ps_fail(err, "out of memory for the chunk tables of %lld sequences", (long long)B);
        }
        for (int64_t i = 0; i < n; i++) a->cend[i] = INT64_MAX; /* every chunk absent until set */
        a->geom.cend = a->cend;
    }
    if (comp && cfg->any_head_offset) {
        if (ps_acts_set_phase(a, NULL, err)) {
            ps_acts_free(a);
            return -1;
        }
    }
    if (cfg->rope && ps_rope_table(ctx, a->p.rope_cos, a->p.rope_sin, T, cfg->head_dim, cfg->rope_theta)) {
        ps_acts_free(a);
        return ps_ctx_check(ctx, err);
    }
    return 0;
}

void ps_acts_free(ps_acts *a) {
    if (a->ctx) {
        ps_buf_free(a->ctx, a->buf, a->n_floats * (int64_t)sizeof(float));
        ps_buf_free(a->ctx, a->pattern, a->pattern_n * (int64_t)sizeof(float));
        ps_buf_free(a->ctx, a->rows_buf, a->rows_n * (int64_t)sizeof(float));
    }
    free(a->logits_host);
    free(a->rows);
    free(a->woff);
    free(a->cs);
    free(a->cl);
    free(a->cend);
    free(a->win_start);
    free(a->win_len);
    memset(a, 0, sizeof *a);
}

int ps_acts_set_phase(ps_acts *a, const int64_t *shift, ps_error *err) {
    const ps_config *c = a->cfg;
    if (c->kind != PS_ATTN_COMPRESSED)
        return ps_fail(err, "phase shifts of the window grid need a compressed-attention model (attention.kind \"compressed\")");
    if (c->boundaries == PS_BOUNDARIES_CONTENT)
        return ps_fail(err, "phase shifts of the window grid do not apply to content chunk boundaries (attention.boundaries \"content\")");
    int64_t B = a->B, nkv = c->n_kv_heads, S = c->stride;
    for (int64_t b = 0; shift && b < B; b++)
        if (shift[b] < 0 || shift[b] >= S)
            return ps_fail(err, "phase shift %lld of sequence %lld is outside [0, attention.stride = %lld)", (long long)shift[b],
                           (long long)b, (long long)S);
    if (!shift && !c->any_head_offset) { /* the base grid */
        free(a->woff);
        a->woff = NULL;
        a->woff_layers = 0;
        a->geom.woff = NULL;
        return 0;
    }
    int64_t nL = ps_config_per_layer_offsets(c) ? c->n_layers : 1; /* a per-layer grid: one [B, nkv] table per layer */
    if (a->woff && a->woff_layers != nL) {
        free(a->woff);
        a->woff = NULL;
    }
    if (!a->woff && !(a->woff = malloc((size_t)(nL * B * nkv) * sizeof *a->woff)))
        return ps_fail(err, "out of memory for the window offsets of %lld sequences", (long long)B);
    a->woff_layers = nL;
    for (int64_t l = 0; l < nL; l++)
        for (int64_t b = 0; b < B; b++)
            for (int64_t g = 0; g < nkv; g++)
                a->woff[(l * B + b) * nkv + g] = (ps_config_grid_offset(c, l, g) + (shift ? shift[b] : 0)) % S;
    a->geom.woff = a->woff;
    return 0;
}

const int64_t *ps_acts_woff(const ps_acts *a, int64_t l) {
    if (!a->woff) return NULL;
    return a->woff_layers > 1 && l >= 0 && l < a->woff_layers ? a->woff + l * a->B * a->cfg->n_kv_heads : a->woff;
}

ps_attn_geom ps_acts_geom(const ps_acts *a, int64_t l) {
    ps_attn_geom g = a->geom;
    if (g.compressed) g.woff = ps_acts_woff(a, l);
    return g;
}

ps_windows ps_acts_windows(const ps_acts *a, int64_t l) {
    const ps_config *c = a->cfg;
    if (c->boundaries == PS_BOUNDARIES_CONTENT)
        return ps_windows_chunks(a->win_start, a->win_len, a->cs, a->cl, a->B, a->T, a->nW, c->window, c->n_kv_heads);
    return ps_windows_grid(a->win_start, a->win_len, a->B, a->T, a->nW, c->window, c->stride, c->n_kv_heads, ps_acts_woff(a, l));
}

int ps_acts_set_chunks(ps_acts *a, const int32_t *tokens, ps_error *err) {
    const ps_config *c = a->cfg;
    if (c->kind != PS_ATTN_COMPRESSED || c->boundaries != PS_BOUNDARIES_CONTENT) return 0;
    int64_t B = a->B, T = a->T, nC = a->nW;
    for (int64_t b = 0; b < B; b++) {
        int64_t n = ps_content_chunks(c, tokens + b * T, T, nC, a->cs + b * nC, a->cl + b * nC);
        for (int64_t j = 0; j < nC; j++)
            a->cend[b * nC + j] = j < n ? a->cs[b * nC + j] + a->cl[b * nC + j] - 1 : INT64_MAX;
    }
    a->chunks_set = true;
    (void)err;
    return 0;
}

int ps_acts_copy_chunks(ps_acts *dst, int64_t dst_b0, const ps_acts *src, int64_t src_b0, int64_t n, ps_error *err) {
    const ps_config *c = dst->cfg;
    if (c->kind != PS_ATTN_COMPRESSED || c->boundaries != PS_BOUNDARIES_CONTENT) return 0;
    if (!src->chunks_set) return ps_fail(err, "copying chunk tables from activations that have not run ps_forward");
    if (src_b0 < 0 || dst_b0 < 0 || n < 0 || src_b0 + n > src->B || dst_b0 + n > dst->B)
        return ps_fail(err, "copying the chunk tables of %lld sequences from %lld (of %lld) to %lld (of %lld)", (long long)n,
                       (long long)src_b0, (long long)src->B, (long long)dst_b0, (long long)dst->B);
    int64_t nS = src->nW, nD = dst->nW, T2 = dst->T;
    for (int64_t b = 0; b < n; b++)
        for (int64_t j = 0; j < nD; j++) {
            int64_t si = (src_b0 + b) * nS + j, di = (dst_b0 + b) * nD + j;
            int keep = j < nS && src->cl[si] > 0 && src->cs[si] + src->cl[si] <= T2; /* the chunk ends inside dst's T */
            dst->cs[di] = keep ? src->cs[si] : 0;
            dst->cl[di] = keep ? src->cl[si] : 0;
            dst->cend[di] = keep ? src->cend[si] : INT64_MAX;
        }
    dst->chunks_set = true;
    return 0;
}

/* A buffer of the acts' own that grows on demand (pattern scratch, answer-row scratch). */
static float *acts_scratch(ps_acts *a, float **buf, int64_t *have, int64_t want, const char *what, ps_error *err) {
    if (want <= *have) return *buf;
    ps_buf_free(a->ctx, *buf, *have * (int64_t)sizeof(float));
    *buf = NULL;
    *have = 0;
    *buf = ps_buf_alloc(a->ctx, want * (int64_t)sizeof(float), what, err);
    if (*buf) *have = want;
    return *buf;
}

int ps_acts_set_rows(ps_acts *a, const int64_t *rows, int64_t n, ps_error *err) {
    if (!a->max_rows) return ps_fail(err, "these activations compute the logits of every row (made without logit rows)");
    if (n < 0 || n > a->max_rows)
        return ps_fail(err, "%lld logit rows asked for; the activations hold at most %lld", (long long)n, (long long)a->max_rows);
    for (int64_t i = 0; i < n; i++) {
        if (rows[i] < 0 || rows[i] >= a->B * a->T)
            return ps_fail(err, "logit row %lld is outside the batch's %lld rows", (long long)rows[i], (long long)(a->B * a->T));
        a->rows[i] = rows[i];
    }
    a->n_rows = n;
    return 0;
}

int ps_acts_set_answer_rows(ps_acts *a, const ps_batch *view, ps_error *err) {
    int64_t n = 0;
    for (int64_t s = 0; s < view->B; s++) n += ps_answer_rows(view, s, NULL);
    if (n > a->max_rows)
        return ps_fail(err, "%lld answer rows in the batch; the activations hold at most %lld logit rows", (long long)n,
                       (long long)a->max_rows);
    n = 0;
    for (int64_t s = 0; s < view->B; s++) {
        int64_t k = ps_answer_rows(view, s, a->rows + n);
        for (int64_t i = n; i < n + k; i++) a->rows[i] += s * view->T;
        n += k;
    }
    a->n_rows = n;
    return 0;
}

const float *ps_acts_logits_host(ps_acts *a, ps_error *err) {
    if (ps_ctx_host_visible(a->ctx)) return a->p.logits;
    int64_t n = (a->max_rows ? a->n_rows : a->B * a->T) * a->cfg->vocab_size;
    if (!a->logits_host && !(a->logits_host = malloc((size_t)n * sizeof(float)))) {
        ps_fail(err, "out of memory for a host copy of %lld logits", (long long)n);
        return NULL;
    }
    return ps_buf_to_host(a->ctx, a->logits_host, a->p.logits, n * (int64_t)sizeof(float), err) ? NULL : a->logits_host;
}

ps_act_ptrs ps_acts_layer(const ps_acts *a, int l) {
    ps_act_ptrs p = a->p;
    float **f = (float **)&p;
    for (int i = 0; i < (int)(sizeof p / sizeof(float *)); i++)
        if (f[i] && a->layer_stride[i]) f[i] += a->layer_stride[i] * l;
    return p;
}

/* ---- forward ---- */

/* Process CPU time (all threads): on a shared machine the wall clock would charge each op with the time
 * other processes held the cores; CPU time charges it with our own work (waits of our idle threads
 * included). */
double ps_prof_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#define FIRE(pt, data, nd, ...)                                                              \
    do {                                                                                     \
        if (ps_hooks_on(hooks, l, pt)) {                                                     \
            int64_t shp_[4] = {__VA_ARGS__};                                                 \
            if (ps_hooks_fire(ctx, hooks, l, pt, (data), (nd), shp_, err)) return -1;       \
        }                                                                                    \
    } while (0)

/* Run a sequence of ops (chained with ||) and turn a failure into err. */
#define OPS(cat, expr)                                                                       \
    do {                                                                                     \
        int rc_;                                                                             \
        PROF(0, cat, rc_ = (expr));                                                          \
        if (rc_) return ps_ctx_check(ctx, err);                                              \
    } while (0)

/* Attention of layer l into p.z (and p.lse). With a pattern hook the probabilities are materialised
 * (the only time they are): the hook sees [B, nh, T, nW + T] (compressed: windows first, then raw
 * positions; full: [B, nh, T, T]), and z is computed from what it leaves. */
static int attention(ps_acts *a, int l, const ps_act_ptrs *pp, const ps_hooks *hooks, ps_error *err) {
    ps_ctx *ctx = a->ctx;
    ps_profile *prof = a->prof;
    const ps_attn_geom gl = ps_acts_geom(a, l), *g = &gl; /* layer l's window grid */
    ps_act_ptrs p = *pp;
    OPS(PS_PROF_ATTENTION, ps_attn_forward(ctx, p.z, p.lse, p.q, p.k, p.v, p.ck, p.cv, g));
    if (!ps_hooks_on(hooks, l, PS_HOOK_PATTERN)) return 0;
    int64_t B = g->B, nh = g->nh, T = g->T, rows = B * nh * T;
    int64_t compact = rows * g->ncols, wide = g->compressed ? rows * (g->nW + T) : 0;
    float *buf = acts_scratch(a, &a->pattern, &a->pattern_n, compact + wide, "attention pattern scratch", err);
    if (!buf) return -1;
    float *probs = buf, *full = g->compressed ? buf + compact : buf;
    OPS(PS_PROF_ATTENTION, ps_attn_probs(ctx, probs, p.q, p.k, p.ck, g) || ps_pattern_expand(ctx, full, probs, g));
    FIRE(PS_HOOK_PATTERN, full, 4, B, nh, T, g->compressed ? g->nW + T : T);
    OPS(PS_PROF_ATTENTION, ps_pattern_compact(ctx, probs, full, g) || ps_attn_out(ctx, p.z, probs, p.v, p.cv, g));
    return 0;
}

/* Blocks a hook wrote, checked as ps_select_blocks_check does (on a backend whose buffers the host cannot read,
 * over a host copy). */
static int select_blocks_check_buf(ps_ctx *ctx, const float *blocks, int64_t n, int64_t Hkv, int64_t slots, int64_t nb,
                               const char *what, ps_error *err) {
    if (ps_ctx_host_visible(ctx)) return ps_select_blocks_check(blocks, n, Hkv, slots, nb, what, err);
    int64_t cnt = n * Hkv * slots;
    float *h = malloc((size_t)(cnt > 0 ? cnt : 1) * sizeof(float));
    if (!h) return ps_fail(err, "%s: out of memory for a host copy of %lld block ids", what, (long long)cnt);
    int rc = ps_buf_to_host(ctx, h, blocks, cnt * (int64_t)sizeof(float), err) ||
             ps_select_blocks_check(h, n, Hkv, slots, nb, what, err);
    free(h);
    return rc ? -1 : 0;
}

/* Attention of a select layer (core/select.h through the selection ops of core/ops.h) into p.z and p.lse
 * ([B, T, nh] here): below dense_len ordinary causal attention; else the compressed keys of both levels
 * (hook_ck, hook_ck2), the stage-1 scores (hook_select_scores), block scores (hook_block_scores) and the blocks
 * (hook_blocks, checked after its hooks), each computed from what the hooks before it left, then attention over
 * the selected blocks. */
static int select_attention(ps_acts *a, int l, const ps_act_ptrs *pp, const ps_hooks *hooks, ps_error *err) {
    ps_ctx *ctx = a->ctx;
    ps_profile *prof = a->prof;
    const ps_config *c = a->cfg;
    ps_act_ptrs p = *pp;
    ps_select_cfg sc = ps_config_select(c);
    int64_t B = a->B, T = a->T, nh = c->n_heads, nkv = c->n_kv_heads, hd = c->head_dim, K = c->window, S = c->stride;
    int64_t N1 = ps_select_n_windows(T, K, S), N2 = ps_select_n_windows(T, 4 * K, 4 * S), nb = ps_select_n_blocks(&sc, T),
            ns = ps_select_slots(&sc);
    ps_sel_geom g = {.B = B, .n = T, .pos0 = 0, .L = T, .H = nh, .Hkv = nkv, .D = hd, .N1 = N1, .N2 = N2, .nb = nb, .sel = sc};
    if (!ps_select_sparse(c, T)) {
        OPS(PS_PROF_ATTENTION, ps_select_attn(ctx, p.z, p.lse, p.q, p.k, p.v, NULL, &g));
        return 0;
    }
    OPS(PS_PROF_ATTENTION, ps_select_compress(ctx, p.sel_k1, p.k, B, T, nkv, hd, K, S) ||
                               ps_select_compress(ctx, p.sel_k2, p.k, B, T, nkv, hd, 4 * K, 4 * S));
    FIRE(PS_HOOK_CK, p.sel_k1, 4, B, N1, nkv, hd);
    FIRE(PS_HOOK_CK2, p.sel_k2, 4, B, N2, nkv, hd);
    OPS(PS_PROF_ATTENTION, ps_select_scores(ctx, p.sel_P, p.q, p.sel_k1, p.sel_k2, &g));
    FIRE(PS_HOOK_SELECT_SCORES, p.sel_P, 4, B, T, nkv, N1);
    OPS(PS_PROF_ATTENTION, ps_select_block_scores(ctx, p.sel_bs, p.sel_P, &g));
    FIRE(PS_HOOK_BLOCK_SCORES, p.sel_bs, 4, B, T, nkv, nb);
    OPS(PS_PROF_ATTENTION, ps_select_topk(ctx, p.sel_blocks, p.sel_bs, &g));
    if (ps_hooks_on(hooks, l, PS_HOOK_BLOCKS)) {
        char what[96];
        ps_hook_name(what, sizeof what, l, PS_HOOK_BLOCKS);
        FIRE(PS_HOOK_BLOCKS, p.sel_blocks, 4, B, T, nkv, ns);
        if (select_blocks_check_buf(ctx, p.sel_blocks, B * T, nkv, ns, nb, what, err)) return -1;
    }
    OPS(PS_PROF_ATTENTION, ps_select_attn(ctx, p.z, p.lse, p.q, p.k, p.v, p.sel_blocks, &g));
    return 0;
}

/* ---- the channel attention (DeepSeek-V4's compressor in this model, through the V4 extension ops;
 * docs/training.md) ---- */

/* Layer l of a channel-attention model up to its compressed entries: q, the raw K=V entries (k), the compressor (gate
 * logits with the position bias in slot layout, per-channel softmax, pooling, norm, rope at w·m) with
 * the hooks q, k, gate_k (the per-channel gate [B, nW, S, hd]) and ck. */
static int channel_layer_pre(const ps_model *m, ps_acts *a, int l, const ps_hooks *hooks, ps_error *err) {
    ps_ctx *ctx = a->ctx;
    ps_profile *prof = a->prof;
    const ps_config *c = &m->cfg;
    ps_layer_params w = ps_model_layer(m, m->params, l);
    ps_act_ptrs p = ps_acts_layer(a, l);
    int64_t B = a->B, T = a->T, BT = B * T, d = c->d_model, hd = c->head_dim, nh = c->n_heads, nW = a->nW, mr = c->rate;
    int64_t cs = ps_config_v4_series(c), S = ps_config_v4_slots(c);
    int csa = c->v4_mode == PS_V4_MODE_CSA;
    float eps = (float)c->rms_eps;
    float *h = a->p.resid + (int64_t)l * BT * d;
    FIRE(PS_HOOK_RESID_PRE, h, 3, B, T, d);
    OPS(PS_PROF_NORM_ROPE, ps_rmsnorm(ctx, p.ln1, p.ln1_rstd, h, w.in_norm, BT, d, eps));
    OPS(PS_PROF_MATMUL, ps_matmul(ctx, p.q_pre, p.ln1, w.wq, BT, d, nh * hd, 0) || ps_matmul(ctx, p.k_pre, p.ln1, w.wk, BT, d, hd, 0));
    if (c->qk_norm)
        OPS(PS_PROF_NORM_ROPE, ps_rmsnorm(ctx, p.q, p.q_rstd, p.q_pre, w.qnorm, BT * nh, hd, eps) ||
                                   ps_rmsnorm(ctx, p.k, p.k_rstd, p.k_pre, w.knorm, BT, hd, eps));
    else
        OPS(PS_PROF_OTHER, ps_copy(ctx, p.q, p.q_pre, BT * nh * hd) || ps_copy(ctx, p.k, p.k_pre, BT * hd));
    if (c->rope)
        OPS(PS_PROF_NORM_ROPE, ps_rope(ctx, p.q, a->p.rope_cos, a->p.rope_sin, B, T, nh, hd, 1) ||
                                   ps_rope(ctx, p.k, a->p.rope_cos, a->p.rope_sin, B, T, 1, hd, 1));
    FIRE(PS_HOOK_Q, p.q, 4, B, T, nh, hd);
    FIRE(PS_HOOK_K, p.k, 4, B, T, 1, hd);
    OPS(PS_PROF_MATMUL, ps_matmul(ctx, p.c_kv_raw, p.ln1, w.c_wkv, BT, d, cs * hd, 0) ||
                            ps_matmul(ctx, p.c_z, p.ln1, w.c_wgate, BT, d, cs * hd, 0));
    if (nW > 0) {
        OPS(PS_PROF_COMPRESSOR, ps_v4_comp_slots(ctx, p.c_gate, p.c_z, w.c_ape, B, T, nW, mr, hd, csa) ||
                                    ps_v4_slot_softmax(ctx, p.c_alpha, p.c_gate, B * nW, S, hd));
        FIRE(PS_HOOK_GATE_K, p.c_alpha, 4, B, nW, S, hd);
        OPS(PS_PROF_COMPRESSOR, ps_v4_comp_pool(ctx, p.ck_pre, p.c_alpha, p.c_kv_raw, B, T, nW, mr, hd, csa));
        OPS(PS_PROF_NORM_ROPE, ps_rmsnorm(ctx, p.ck, p.ck_rstd, p.ck_pre, w.c_norm, B * nW, hd, eps));
        if (c->rope) OPS(PS_PROF_NORM_ROPE, ps_rope(ctx, p.ck, a->p.rope_cos, a->p.rope_sin, B, nW, 1, hd, mr));
        FIRE(PS_HOOK_CK, p.ck, 4, B, nW, 1, hd);
    }
    return 0;
}

/* The attention of a channel-attention layer: the raw K=V entries of the sliding window and every complete compressed
 * entry, a softmax with the head's sink; the output is rotated back by its own position (V4's inverse
 * rope: the values carry their keys' rotation). z_pre keeps the output before that rotation. */
static int channel_attention(const ps_model *m, ps_acts *a, int l, const ps_act_ptrs *pp, ps_error *err) {
    ps_ctx *ctx = a->ctx;
    ps_profile *prof = a->prof;
    const ps_config *c = &m->cfg;
    ps_act_ptrs p = *pp;
    ps_layer_params w = ps_model_layer(m, m->params, l);
    int64_t B = a->B, T = a->T, nh = c->n_heads, hd = c->head_dim;
    OPS(PS_PROF_ATTENTION, ps_v4_attn(ctx, p.z_pre, p.sinkp, p.q, p.k, a->nW > 0 ? p.ck : NULL, NULL, w.sinks, &a->geom4) ||
                               ps_copy(ctx, p.z, p.z_pre, B * T * nh * hd));
    if (c->rope) OPS(PS_PROF_NORM_ROPE, ps_rope_backward(ctx, p.z, a->p.rope_cos, a->p.rope_sin, B, T, nh, hd, 1));
    return 0;
}

/* Layer l up to the compressed keys and values (ln1, q/k/v, norms, RoPE, compressor) with their hooks. */
static int layer_forward_pre(const ps_model *m, ps_acts *a, int l, const ps_hooks *hooks, ps_error *err) {
    ps_ctx *ctx = a->ctx;
    ps_profile *prof = a->prof;
    const ps_config *c = &m->cfg;
    ps_layer_params w = ps_model_layer(m, m->params, l);
    ps_act_ptrs p = ps_acts_layer(a, l);
    int64_t B = a->B, T = a->T, BT = B * T, d = c->d_model, hd = c->head_dim, nh = c->n_heads, nkv = c->n_kv_heads;
    int64_t nW = a->nW, W = c->window;
    float eps = (float)c->rms_eps;
    float *h = a->p.resid + (int64_t)l * BT * d;
    int comp = c->kind == PS_ATTN_COMPRESSED;
    if (c->kind == PS_ATTN_CHANNEL) return channel_layer_pre(m, a, l, hooks, err);

    FIRE(PS_HOOK_RESID_PRE, h, 3, B, T, d);
    OPS(PS_PROF_NORM_ROPE, ps_rmsnorm(ctx, p.ln1, p.ln1_rstd, h, w.in_norm, BT, d, eps));
    /* q, k, v: [B,T,nh|nkv,hd] */
    OPS(PS_PROF_MATMUL, ps_matmul(ctx, p.q_pre, p.ln1, w.wq, BT, d, nh * hd, 0) ||
                            ps_matmul(ctx, p.k_pre, p.ln1, w.wk, BT, d, nkv * hd, 0) ||
                            ps_matmul(ctx, p.v, p.ln1, w.wv, BT, d, nkv * hd, 0));
    if (c->qk_norm)
        OPS(PS_PROF_NORM_ROPE, ps_rmsnorm(ctx, p.q, p.q_rstd, p.q_pre, w.qnorm, BT * nh, hd, eps) ||
                                   ps_rmsnorm(ctx, p.k, p.k_rstd, p.k_pre, w.knorm, BT * nkv, hd, eps));
    else
        OPS(PS_PROF_OTHER, ps_copy(ctx, p.q, p.q_pre, BT * nh * hd) || ps_copy(ctx, p.k, p.k_pre, BT * nkv * hd));
    if (c->rope)
        OPS(PS_PROF_NORM_ROPE, ps_rope(ctx, p.q, a->p.rope_cos, a->p.rope_sin, B, T, nh, hd, 1) ||
                                   ps_rope(ctx, p.k, a->p.rope_cos, a->p.rope_sin, B, T, nkv, hd, 1));
    FIRE(PS_HOOK_Q, p.q, 4, B, T, nh, hd);
    FIRE(PS_HOOK_K, p.k, 4, B, T, nkv, hd);
    FIRE(PS_HOOK_V, p.v, 4, B, T, nkv, hd);

    if (comp) {
        /* Compressor: gates and payloads read the layer input a = ln1 (SPEC §2). */
        int learned = c->gate == PS_GATE_LEARNED, shared = c->payload == PS_PAYLOAD_SHARED;
        if (c->boundaries == PS_BOUNDARIES_CONTENT && !a->chunks_set)
            return ps_fail(err, "content chunk boundaries (attention.boundaries \"content\") need the batch's tokens: run ps_forward on these activations first");
        const ps_windows wt = ps_acts_windows(a, l), *win = &wt; /* the base grid, layer l's offset grid or content chunks */
        OPS(PS_PROF_COMPRESSOR,
            ps_gate(ctx, p.gz_k, p.ga_k, p.ln1, learned ? w.key_gate_w : NULL, w.key_gate_b, d, win) ||
                ps_gate(ctx, p.gz_v, p.ga_v, p.ln1, learned ? w.value_gate_w : NULL, w.value_gate_b, d, win));
        FIRE(PS_HOOK_GATE_K, p.ga_k, 4, B, nW, nkv, W);
        FIRE(PS_HOOK_GATE_V, p.ga_v, 4, B, nW, nkv, W);
        OPS(PS_PROF_COMPRESSOR,
            ps_payload(ctx, p.pk, p.ln1, w.key_payload, shared, a->p.payload_scratch, d, hd, win) ||
                ps_payload(ctx, p.pv, p.ln1, w.value_payload, shared, a->p.payload_scratch, d, hd, win));
        OPS(PS_PROF_COMPRESSOR,
                ps_pool(ctx, p.ck_pre, p.ga_k, p.pk, B, nW, W, nkv, hd) || ps_pool(ctx, p.cv, p.ga_v, p.pv, B, nW, W, nkv, hd));
        if (c->qk_norm)
            OPS(PS_PROF_NORM_ROPE, ps_rmsnorm(ctx, p.ck, p.ck_rstd, p.ck_pre, w.knorm, B * nW * nkv, hd, eps));
        else
            OPS(PS_PROF_OTHER, ps_copy(ctx, p.ck, p.ck_pre, B * nW * nkv * hd));
        if (c->rope && nW > 0) OPS(PS_PROF_NORM_ROPE, ps_rope_windows(ctx, p.ck, a->p.rope_cos, a->p.rope_sin, hd, win, 0));
        FIRE(PS_HOOK_CK, p.ck, 4, B, nW, nkv, hd);
        FIRE(PS_HOOK_CV, p.cv, 4, B, nW, nkv, hd);
    }
    return 0;
}

/* The rest of layer l from the attention scores on: reads q, k, v, ck, cv of layer l's slot. */
static int layer_forward_post(const ps_model *m, ps_acts *a, int l, const ps_hooks *hooks, ps_error *err) {
    ps_ctx *ctx = a->ctx;
    ps_profile *prof = a->prof;
    const ps_config *c = &m->cfg;
    ps_layer_params w = ps_model_layer(m, m->params, l);
    ps_act_ptrs p = ps_acts_layer(a, l);
    int64_t B = a->B, T = a->T, BT = B * T, d = c->d_model, hd = c->head_dim, nh = c->n_heads, dff = c->d_ff;
    float eps = (float)c->rms_eps;
    float *h = a->p.resid + (int64_t)l * BT * d, *h_next = h + BT * d;
    if (c->kind == PS_ATTN_CHANNEL  ? channel_attention(m, a, l, &p, err)
        : c->kind == PS_ATTN_SELECT ? select_attention(a, l, &p, hooks, err)
                                    : attention(a, l, &p, hooks, err))
        return -1;
    FIRE(PS_HOOK_Z, p.z, 4, B, T, nh, hd);
    OPS(PS_PROF_MATMUL, ps_matmul(ctx, p.attn_out, p.z, w.wo, BT, nh * hd, d, 0));
    FIRE(PS_HOOK_ATTN_OUT, p.attn_out, 3, B, T, d);
    OPS(PS_PROF_OTHER, ps_add(ctx, p.resid_mid, h, p.attn_out, BT * d));
    FIRE(PS_HOOK_RESID_MID, p.resid_mid, 3, B, T, d);

    OPS(PS_PROF_NORM_ROPE, ps_rmsnorm(ctx, p.ln2, p.ln2_rstd, p.resid_mid, w.post_norm, BT, d, eps));
    OPS(PS_PROF_MATMUL, ps_matmul(ctx, p.mlp_g, p.ln2, w.mlp_gate, BT, d, dff, 0) ||
                            ps_matmul(ctx, p.mlp_u, p.ln2, w.mlp_up, BT, d, dff, 0));
    OPS(PS_PROF_OTHER, ps_swiglu(ctx, p.mlp_h, p.mlp_g, p.mlp_u, BT * dff));
    OPS(PS_PROF_MATMUL, ps_matmul(ctx, p.mlp_out, p.mlp_h, w.mlp_down, BT, dff, d, 0));
    FIRE(PS_HOOK_MLP_OUT, p.mlp_out, 3, B, T, d);
    OPS(PS_PROF_OTHER, ps_add(ctx, h_next, p.resid_mid, p.mlp_out, BT * d));
    FIRE(PS_HOOK_RESID_POST, h_next, 3, B, T, d);
    return 0;
}

static int layer_forward(const ps_model *m, ps_acts *a, int l, const ps_hooks *hooks, ps_error *err) {
    return layer_forward_pre(m, a, l, hooks, err) || layer_forward_post(m, a, l, hooks, err) ? -1 : 0;
}

static int forward_rest(const ps_model *m, ps_acts *a, int from, const ps_hooks *hooks, ps_error *err);

/* The model and the activations must live on one context. */
static int same_ctx(const ps_model *m, const ps_acts *a, ps_error *err) {
    if (m->ctx != a->ctx)
        return ps_fail(err, "the activations were made on another context (%s) than the model's (%s)",
                       a->ctx ? ps_ctx_backend_name(a->ctx) : "none", ps_ctx_backend_name(m->ctx));
    return 0;
}

/* The hooks on layer l's kept attention inputs (q, k, v and, compressed, ck, cv), in forward order: what a
 * restart at layer l's attention fires before it (the gates and resid_pre are not recomputed). */
static int fire_attention_inputs(const ps_model *m, ps_acts *a, int l, const ps_hooks *hooks, ps_error *err) {
    const ps_config *c = &m->cfg;
    ps_ctx *ctx = a->ctx;
    ps_act_ptrs p = ps_acts_layer(a, l);
    int64_t B = a->B, T = a->T, nW = a->nW, hd = c->head_dim, nh = c->n_heads, nkv = c->n_kv_heads;
    if (hooks && hooks->mask && hooks->family != &ps_model_hook_family)
        return ps_fail(err, "the hooks were registered for a %s model, not this phasescope model", hooks->family->name);
    if (hooks && hooks->mask && hooks->n_layers != c->n_layers)
        return ps_fail(err, "hooks were registered for a model with %lld layers, this one has %lld",
                       (long long)hooks->n_layers, (long long)c->n_layers);
    FIRE(PS_HOOK_Q, p.q, 4, B, T, nh, hd);
    FIRE(PS_HOOK_K, p.k, 4, B, T, nkv, hd);
    if (c->kind == PS_ATTN_CHANNEL) { /* K = V: no v, cv */
        if (nW > 0) FIRE(PS_HOOK_CK, p.ck, 4, B, nW, nkv, hd);
        return 0;
    }
    FIRE(PS_HOOK_V, p.v, 4, B, T, nkv, hd);
    if (c->kind == PS_ATTN_COMPRESSED) {
        FIRE(PS_HOOK_CK, p.ck, 4, B, nW, nkv, hd);
        FIRE(PS_HOOK_CV, p.cv, 4, B, nW, nkv, hd);
    }
    return 0;
}

int ps_forward_from_attention(const ps_model *m, ps_acts *a, int l, const ps_hooks *hooks, ps_error *err) {
    if (same_ctx(m, a, err)) return -1;
    if (!a->keep_all) return ps_fail(err, "forward from the attention of layer %d needs the activations of every layer", l);
    if (l < 0 || l >= m->cfg.n_layers)
        return ps_fail(err, "forward from layer %d: the model has %lld layers", l, (long long)m->cfg.n_layers);
    if (fire_attention_inputs(m, a, l, hooks, err)) return -1;
    if (layer_forward_post(m, a, l, hooks, err)) return -1;
    return forward_rest(m, a, l + 1, hooks, err);
}

/* The last layer's post-attention part and the logits for chosen rows only (all else is left stale). */
static int last_layer_rows(const ps_model *m, ps_acts *a, const int64_t *rows, int64_t n, ps_error *err) {
    ps_ctx *ctx = a->ctx;
    ps_profile *prof = NULL;
    const ps_config *c = &m->cfg;
    int l = (int)c->n_layers - 1;
    ps_layer_params w = ps_model_layer(m, m->params, l);
    ps_act_ptrs p = ps_acts_layer(a, l);
    int64_t BT = a->B * a->T, d = c->d_model, qd = c->n_heads * c->head_dim, dff = c->d_ff, V = c->vocab_size;
    float eps = (float)c->rms_eps;
    const float *h = a->p.resid + (int64_t)l * BT * d;
    const ps_attn_geom gl = ps_acts_geom(a, l); /* the last layer's window grid */
    float *buf = acts_scratch(a, &a->rows_buf, &a->rows_n, n * (qd + 4 * d + 3 * dff + V) + 2 * n, "answer-row scratch", err);
    if (!buf) return -1;
    float *z = buf, *ao = z + n * qd, *mid = ao + n * d, *ln = mid + n * d, *hh = ln + n * d, *g = hh + n * d,
          *u = g + n * dff, *mh = u + n * dff, *lg = mh + n * dff, *rs = lg + n * V;
    OPS(PS_PROF_OTHER,
        ps_attn_rows(ctx, z, rows, n, p.q, p.k, p.v, p.ck, p.cv, &gl) || ps_matmul(ctx, ao, z, w.wo, n, qd, d, 0) ||
            ps_gather_rows(ctx, mid, h, ao, rows, n, d) || ps_rmsnorm(ctx, ln, rs, mid, w.post_norm, n, d, eps) ||
            ps_matmul(ctx, g, ln, w.mlp_gate, n, d, dff, 0) || ps_matmul(ctx, u, ln, w.mlp_up, n, d, dff, 0) ||
            ps_swiglu(ctx, mh, g, u, n * dff) || ps_matmul(ctx, hh, mh, w.mlp_down, n, dff, d, 0) ||
            ps_add(ctx, hh, mid, hh, n * d) ||
            ps_rmsnorm(ctx, ln, rs, hh, ps_model_final_norm(m, m->params), n, d, eps) ||
            ps_matmul(ctx, lg, ln, ps_model_lm_head(m, m->params), n, d, V, 0) ||
            ps_scatter_rows(ctx, a->p.logits, lg, rows, n, V));
    return 0;
}

int ps_forward_from_attention_rows(const ps_model *m, ps_acts *a, int l, const ps_hooks *hooks, const int64_t *rows,
                                   int64_t n, ps_error *err) {
    const ps_config *c = &m->cfg;
    int last = (int)c->n_layers - 1;
    if (same_ctx(m, a, err)) return -1;
    if (!a->keep_all) return ps_fail(err, "forward from the attention of layer %d needs the activations of every layer", l);
    if (l < 0 || l > last) return ps_fail(err, "forward from layer %d: the model has %lld layers", l, (long long)c->n_layers);
    if (c->kind == PS_ATTN_CHANNEL || c->kind == PS_ATTN_SELECT)
        return ps_fail(err, "the answer-row restart is not available for the %s attention (use ps_forward_from_attention)",
                       c->kind == PS_ATTN_CHANNEL ? "channel" : "select");
    for (int64_t i = 0; i < n; i++)
        if (rows[i] < 0 || rows[i] >= a->B * a->T)
            return ps_fail(err, "answer row %lld is outside the batch's %lld rows", (long long)rows[i], (long long)(a->B * a->T));
    for (int pt = PS_HOOK_PATTERN; pt < PS_HOOK_NPOINTS; pt++)
        if (ps_hooks_on(hooks, last, (ps_hook_point)pt)) {
            char name[96];
            ps_hook_name(name, sizeof name, last, (ps_hook_point)pt);
            return ps_fail(err, "hook \"%s\": the answer-row restart computes the last layer's attention and MLP for chosen rows only; a hook there cannot fire (use ps_forward_from_attention)", name);
        }
    if (fire_attention_inputs(m, a, l, hooks, err)) return -1;
    if (l < last) {
        if (layer_forward_post(m, a, l, hooks, err)) return -1;
        for (int k = l + 1; k < last; k++)
            if (layer_forward(m, a, k, hooks, err)) return -1;
        if (layer_forward_pre(m, a, last, hooks, err)) return -1;
    }
    return last_layer_rows(m, a, rows, n, err);
}

int ps_forward_from(const ps_model *m, ps_acts *a, int from, const ps_hooks *hooks, ps_error *err) {
    const ps_config *c = &m->cfg;
    if (same_ctx(m, a, err)) return -1;
    if (from < 0 || from > c->n_layers)
        return ps_fail(err, "forward from layer %d: the model has %lld layers", from, (long long)c->n_layers);
    if (hooks && hooks->mask && hooks->family != &ps_model_hook_family)
        return ps_fail(err, "the hooks were registered for a %s model, not this phasescope model", hooks->family->name);
    if (hooks && hooks->mask && hooks->n_layers != c->n_layers)
        return ps_fail(err, "hooks were registered for a model with %lld layers, this one has %lld",
                       (long long)hooks->n_layers, (long long)c->n_layers);
    return forward_rest(m, a, from, hooks, err);
}

static int forward_rest(const ps_model *m, ps_acts *a, int from, const ps_hooks *hooks, ps_error *err) {
    const ps_config *c = &m->cfg;
    for (int l = from; l < c->n_layers; l++)
        if (layer_forward(m, a, l, hooks, err)) return -1;
    int64_t BT = a->B * a->T, d = c->d_model;
    ps_ctx *ctx = a->ctx;
    ps_profile *prof = a->prof;
    OPS(PS_PROF_NORM_ROPE, ps_rmsnorm(ctx, a->p.lnf, a->p.lnf_rstd, a->p.resid + c->n_layers * BT * d,
                                      ps_model_final_norm(m, m->params), BT, d, (float)c->rms_eps));
    if (a->max_rows) /* logits of the chosen rows only: [n_rows, V] */
        OPS(PS_PROF_MATMUL, ps_gather_rows(ctx, a->p.lnf_rows, a->p.lnf, NULL, a->rows, a->n_rows, d) ||
                                ps_matmul(ctx, a->p.logits, a->p.lnf_rows, ps_model_lm_head(m, m->params), a->n_rows, d,
                                          c->vocab_size, 0));
    else
        OPS(PS_PROF_MATMUL, ps_matmul(ctx, a->p.logits, a->p.lnf, ps_model_lm_head(m, m->params), BT, d, c->vocab_size, 0));
    return 0;
}

int ps_forward(const ps_model *m, ps_acts *a, const int32_t *tokens, const ps_hooks *hooks, ps_error *err) {
    const ps_config *c = &m->cfg;
    if (same_ctx(m, a, err)) return -1;
    int64_t BT = a->B * a->T;
    for (int64_t i = 0; i < BT; i++)
        if (tokens[i] < 0 || tokens[i] >= c->vocab_size)
            return ps_fail(err, "token %d at sequence %lld, position %lld is outside the vocabulary [0, %lld)",
                           tokens[i], (long long)(i / a->T), (long long)(i % a->T), (long long)c->vocab_size);
    if (ps_acts_set_chunks(a, tokens, err)) return -1;
    ps_ctx *ctx = a->ctx;
    ps_profile *prof = a->prof;
    OPS(PS_PROF_OTHER, ps_embed(ctx, a->p.resid, tokens, ps_model_embed(m, m->params), BT, c->d_model));
    return ps_forward_from(m, a, 0, hooks, err);
}

int ps_acts_score(ps_acts *a, const ps_batch *view, int *correct, double *logprob, ps_error *err) {
    if (view->B != a->B || view->T != a->T)
        return ps_fail(err, "scoring a batch of %lldx%lld tokens with activations of %lldx%lld", (long long)view->B,
                       (long long)view->T, (long long)a->B, (long long)a->T);
    const float *logits = ps_acts_logits_host(a, err);
    if (!logits) return -1;
    int64_t V = a->cfg->vocab_size;
    if (!a->max_rows) {
        ps_score_queries(view, logits, V, correct, logprob);
        return 0;
    }
    /* rows mode: the rows must be the view's answer rows in ps_acts_set_answer_rows order */
    int64_t r = 0;
    for (int64_t s = 0; s < view->B; s++) {
        int64_t k = ps_answer_rows(view, s, NULL);
        if (r + k > a->n_rows) return ps_fail(err, "scoring: the logit rows are not this batch's answer rows");
        ps_score_query_rows(view, s, logits + r * V, V, correct + s * view->max_q, logprob + s * view->max_q);
        r += k;
    }
    return 0;
}

int ps_forward_batches(const ps_model *m, const ps_batch *b, int64_t batch, bool keep_all, const ps_hooks *hooks,
                       ps_batch_fn fn, void *user, ps_error *err) {
    if (batch < 1) return ps_fail(err, "batch %lld must be >= 1", (long long)batch);
    int64_t N = b->B, T = b->T, full = batch < N ? batch : N, last0 = N ? (N - 1) / full * full : 0;
    if (N == 0) return 0;
    /* a large vocabulary: logits at the answer rows only (the most any batch of the set has) */
    int64_t rows = 0;
    if (m->cfg.vocab_size >= PS_ROWS_VOCAB)
        for (int64_t i0 = 0; i0 < N; i0 += full) {
            int64_t r = 0;
            for (int64_t s = i0; s < N && s < i0 + full; s++) r += ps_answer_rows(b, s, NULL);
            rows = r > rows ? r : rows;
        }
    ps_acts a, part;
    int have_part = 0;
    if (ps_acts_create_rows(&a, m->ctx, &m->cfg, full, T, keep_all, rows < full * T ? rows : full * T, err)) return -1;
    int rc = 0;
    if (N - last0 != full) {
        int64_t pr = rows < (N - last0) * T ? rows : (N - last0) * T;
        rc = ps_acts_create_rows(&part, m->ctx, &m->cfg, N - last0, T, keep_all, pr, err);
        have_part = !rc;
    }
    for (int64_t i0 = 0; i0 < N && !rc; i0 += full) {
        ps_acts *use = i0 == last0 && have_part ? &part : &a;
        ps_batch view = ps_batch_view(b, i0, use->B);
        if (use->max_rows) rc = ps_acts_set_answer_rows(use, &view, err);
        if (!rc) rc = ps_forward(m, use, view.tokens, hooks, err);
        if (!rc && fn) rc = fn(&view, i0, use, user, err);
    }
    if (have_part) ps_acts_free(&part);
    ps_acts_free(&a);
    return rc;
}
