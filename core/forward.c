#include "forward.h"

#include "fileio.h"

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
                       bool pattern_hook) {
    int64_t BT = B * T, d = c->d_model, hd = c->head_dim, nh = c->n_heads, nkv = c->n_kv_heads, L = c->n_layers;
    int comp = c->kind == PS_ATTN_COMPRESSED;
    int64_t W = comp ? c->window : 0, LW = comp ? (c->local_window < T ? c->local_window : T) : 0;
    int64_t ncols = comp ? nW + LW : T;
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
    SPEC(v, BT * nkv * hd, true);
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
    SPEC(probs, B * nh * T * ncols, true);
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
    SPEC(logits, BT * c->vocab_size, false);
    SPEC(rope_cos, c->rope ? T * (hd / 2) : 0, false);
    SPEC(rope_sin, c->rope ? T * (hd / 2) : 0, false);
    SPEC(payload_scratch, comp && c->payload == PS_PAYLOAD_SHARED ? BT * nkv * hd : 0, false);
    SPEC(pattern_full, pattern_hook && comp ? B * nh * T * (nW + T) : 0, false);
#undef SPEC
    return k;
}

int64_t ps_acts_size(const ps_config *cfg, int64_t B, int64_t T, bool keep_all, bool pattern_hook) {
    act_spec s[40];
    ps_act_ptrs p;
    int n = build_specs(s, &p, cfg, B, T, ps_config_n_windows(cfg, T), pattern_hook);
    int64_t tot = 0;
    for (int i = 0; i < n; i++) tot += s[i].n * (s[i].per_layer && keep_all ? cfg->n_layers : 1);
    return tot;
}

int ps_acts_create(ps_acts *a, const ps_config *cfg, int64_t B, int64_t T, bool keep_all, ps_error *err) {
    memset(a, 0, sizeof *a);
    if (B < 1 || T < 1) return ps_fail(err, "batch of %lld sequences of %lld tokens: both must be >= 1", (long long)B, (long long)T);
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
    /* The pattern scratch is sized for the worst case so hooks can be added after creation. */
    act_spec s[40];
    int n = build_specs(s, &a->p, cfg, B, T, a->nW, true);
    double tot = 0;
    for (int i = 0; i < n; i++) tot += (double)s[i].n * (s[i].per_layer && keep_all ? (double)cfg->n_layers : 1.0);
    if (tot * 4 > 256e9)
        return ps_fail(err, "activations for B=%lld, T=%lld would need %.1f GB; refusing", (long long)B, (long long)T,
                       tot * 4 / 1e9);
    uint64_t avail = ps_mem_available();
    if (avail && tot * 4 > (double)avail)
        return ps_fail(err, "activations for B=%lld, T=%lld need %.2f GiB but only %.2f GiB of memory is available", (long long)B,
                       (long long)T, tot * 4 / 1073741824.0, (double)avail / 1073741824.0);
    a->n_floats = (int64_t)tot;
    a->buf = malloc((size_t)(a->n_floats ? a->n_floats : 1) * sizeof(float));
    if (!a->buf)
        return ps_fail(err, "out of memory: activations for B=%lld, T=%lld need %.1f MB", (long long)B, (long long)T,
                       tot * 4 / 1e6);
    int64_t off = 0;
    for (int i = 0; i < n; i++) {
        *s[i].ptr = s[i].n ? a->buf + off : NULL;
        int64_t slots = s[i].per_layer && keep_all ? cfg->n_layers : 1;
        a->layer_stride[(float **)s[i].ptr - (float **)&a->p] = s[i].per_layer && keep_all ? s[i].n : 0;
        off += s[i].n * slots;
    }
    if (cfg->rope) ps_rope_table(a->p.rope_cos, a->p.rope_sin, T, cfg->head_dim, cfg->rope_theta);
    return 0;
}

void ps_acts_free(ps_acts *a) {
    free(a->buf);
    memset(a, 0, sizeof *a);
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
            if (ps_hooks_fire(hooks, l, pt, (data), (nd), shp_, err)) return -1;            \
        }                                                                                    \
    } while (0)

/* The pattern hook sees [B, nh, T, nW + T]; expand the compact compressed rows, fire, copy back the
 * entries the query sees. Full attention rows already have that layout: re-zero unseen entries. */
static int fire_pattern(const ps_hooks *hooks, int l, const ps_acts *a, float *probs, ps_error *err) {
    const ps_attn_geom *g = &a->geom;
    int64_t B = g->B, nh = g->nh, T = g->T;
    if (!g->compressed) {
        FIRE(PS_HOOK_PATTERN, probs, 4, B, nh, T, T);
        for (int64_t r = 0; r < B * nh * T; r++) {
            int64_t t = r % T;
            memset(probs + r * T + t + 1, 0, (size_t)(T - t - 1) * sizeof(float));
        }
        return 0;
    }
    int64_t nW = g->nW, LW = g->LW, wide = nW + T;
    float *full = a->p.pattern_full;
    for (int64_t r = 0; r < B * nh * T; r++) {
        int64_t t = r % T;
        const float *src = probs + r * g->ncols;
        float *dst = full + r * wide;
        memset(dst, 0, (size_t)wide * sizeof(float));
        memcpy(dst, src, (size_t)nW * sizeof(float));
        for (int64_t m = 0; m < LW; m++) {
            int64_t tp = t - LW + 1 + m;
            if (tp >= 0) dst[nW + tp] = src[nW + m];
        }
    }
    FIRE(PS_HOOK_PATTERN, full, 4, B, nh, T, wide);
    for (int64_t r = 0; r < B * nh * T; r++) {
        int64_t t = r % T, nc = ps_windows_seen(t, g->W, g->S, nW);
        float *dst = probs + r * g->ncols;
        const float *src = full + r * wide;
        memcpy(dst, src, (size_t)nc * sizeof(float));
        for (int64_t m = 0; m < LW; m++) {
            int64_t tp = t - LW + 1 + m;
            dst[nW + m] = tp >= 0 ? src[nW + tp] : 0.0f;
        }
    }
    return 0;
}

/* Layer l up to the compressed keys and values (ln1, q/k/v, norms, RoPE, compressor) with their hooks. */
static int layer_forward_pre(const ps_model *m, ps_acts *a, int l, const ps_hooks *hooks, ps_error *err) {
    ps_profile *prof = a->prof;
    const ps_config *c = &m->cfg;
    ps_layer_params w = ps_model_layer(m, m->params, l);
    ps_act_ptrs p = ps_acts_layer(a, l);
    int64_t B = a->B, T = a->T, BT = B * T, d = c->d_model, hd = c->head_dim, nh = c->n_heads, nkv = c->n_kv_heads;
    int64_t nW = a->nW, W = c->window, S = c->stride;
    float eps = (float)c->rms_eps;
    float *h = a->p.resid + (int64_t)l * BT * d;
    int comp = c->kind == PS_ATTN_COMPRESSED;

    FIRE(PS_HOOK_RESID_PRE, h, 3, B, T, d);
    PROF(0, PS_PROF_NORM_ROPE, ps_rmsnorm(p.ln1, p.ln1_rstd, h, w.in_norm, BT, d, eps));
    /* q, k, v: [B,T,nh|nkv,hd] */
    PROF(0, PS_PROF_MATMUL, ps_matmul(p.q_pre, p.ln1, w.wq, BT, d, nh * hd, 0));
    PROF(0, PS_PROF_MATMUL, ps_matmul(p.k_pre, p.ln1, w.wk, BT, d, nkv * hd, 0));
    PROF(0, PS_PROF_MATMUL, ps_matmul(p.v, p.ln1, w.wv, BT, d, nkv * hd, 0));
    if (c->qk_norm) {
        PROF(0, PS_PROF_NORM_ROPE, ps_rmsnorm(p.q, p.q_rstd, p.q_pre, w.qnorm, BT * nh, hd, eps));
        PROF(0, PS_PROF_NORM_ROPE, ps_rmsnorm(p.k, p.k_rstd, p.k_pre, w.knorm, BT * nkv, hd, eps));
    } else {
        memcpy(p.q, p.q_pre, (size_t)(BT * nh * hd) * sizeof(float));
        memcpy(p.k, p.k_pre, (size_t)(BT * nkv * hd) * sizeof(float));
    }
    if (c->rope) {
        PROF(0, PS_PROF_NORM_ROPE, ps_rope(p.q, a->p.rope_cos, a->p.rope_sin, B, T, nh, hd, 1));
        PROF(0, PS_PROF_NORM_ROPE, ps_rope(p.k, a->p.rope_cos, a->p.rope_sin, B, T, nkv, hd, 1));
    }
    FIRE(PS_HOOK_Q, p.q, 4, B, T, nh, hd);
    FIRE(PS_HOOK_K, p.k, 4, B, T, nkv, hd);
    FIRE(PS_HOOK_V, p.v, 4, B, T, nkv, hd);

    if (comp) {
        /* Compressor: gates and payloads read the layer input a = ln1 (SPEC §2). */
        int learned = c->gate == PS_GATE_LEARNED, shared = c->payload == PS_PAYLOAD_SHARED;
        PROF(0, PS_PROF_COMPRESSOR, ps_gate(p.gz_k, p.ga_k, p.ln1, learned ? w.key_gate_w : NULL, w.key_gate_b, B, T, d, nW, W, S, nkv));
        PROF(0, PS_PROF_COMPRESSOR, ps_gate(p.gz_v, p.ga_v, p.ln1, learned ? w.value_gate_w : NULL, w.value_gate_b, B, T, d, nW, W, S, nkv));
        FIRE(PS_HOOK_GATE_K, p.ga_k, 4, B, nW, nkv, W);
        FIRE(PS_HOOK_GATE_V, p.ga_v, 4, B, nW, nkv, W);
        PROF(0, PS_PROF_COMPRESSOR, ps_payload(p.pk, p.ln1, w.key_payload, shared, a->p.payload_scratch, B, T, d, nW, W, S, nkv * hd));
        PROF(0, PS_PROF_COMPRESSOR, ps_payload(p.pv, p.ln1, w.value_payload, shared, a->p.payload_scratch, B, T, d, nW, W, S, nkv * hd));
        PROF(0, PS_PROF_COMPRESSOR, ps_pool(p.ck_pre, p.ga_k, p.pk, B, nW, W, nkv, hd));
        PROF(0, PS_PROF_COMPRESSOR, ps_pool(p.cv, p.ga_v, p.pv, B, nW, W, nkv, hd));
        if (c->qk_norm) PROF(0, PS_PROF_NORM_ROPE, ps_rmsnorm(p.ck, p.ck_rstd, p.ck_pre, w.knorm, B * nW * nkv, hd, eps));
        else if (nW > 0) memcpy(p.ck, p.ck_pre, (size_t)(B * nW * nkv * hd) * sizeof(float));
        if (c->rope && nW > 0) PROF(0, PS_PROF_NORM_ROPE, ps_rope(p.ck, a->p.rope_cos, a->p.rope_sin, B, nW, nkv, hd, S));
        FIRE(PS_HOOK_CK, p.ck, 4, B, nW, nkv, hd);
        FIRE(PS_HOOK_CV, p.cv, 4, B, nW, nkv, hd);
    }
    return 0;
}

/* The rest of layer l from the attention scores on: reads q, k, v, ck, cv of layer l's slot. */
static int layer_forward_post(const ps_model *m, ps_acts *a, int l, const ps_hooks *hooks, ps_error *err) {
    ps_profile *prof = a->prof;
    const ps_config *c = &m->cfg;
    ps_layer_params w = ps_model_layer(m, m->params, l);
    ps_act_ptrs p = ps_acts_layer(a, l);
    int64_t B = a->B, T = a->T, BT = B * T, d = c->d_model, hd = c->head_dim, nh = c->n_heads, dff = c->d_ff;
    float eps = (float)c->rms_eps;
    float *h = a->p.resid + (int64_t)l * BT * d, *h_next = h + BT * d;
    PROF(0, PS_PROF_ATTENTION, ps_attn_probs(p.probs, p.q, p.k, p.ck, &a->geom));
    if (ps_hooks_on(hooks, l, PS_HOOK_PATTERN) && fire_pattern(hooks, l, a, p.probs, err)) return -1;
    PROF(0, PS_PROF_ATTENTION, ps_attn_out(p.z, p.probs, p.v, p.cv, &a->geom));
    FIRE(PS_HOOK_Z, p.z, 4, B, T, nh, hd);
    PROF(0, PS_PROF_MATMUL, ps_matmul(p.attn_out, p.z, w.wo, BT, nh * hd, d, 0));
    FIRE(PS_HOOK_ATTN_OUT, p.attn_out, 3, B, T, d);
    PROF(0, PS_PROF_OTHER, ps_add(p.resid_mid, h, p.attn_out, BT * d));
    FIRE(PS_HOOK_RESID_MID, p.resid_mid, 3, B, T, d);

    PROF(0, PS_PROF_NORM_ROPE, ps_rmsnorm(p.ln2, p.ln2_rstd, p.resid_mid, w.post_norm, BT, d, eps));
    PROF(0, PS_PROF_MATMUL, ps_matmul(p.mlp_g, p.ln2, w.mlp_gate, BT, d, dff, 0));
    PROF(0, PS_PROF_MATMUL, ps_matmul(p.mlp_u, p.ln2, w.mlp_up, BT, d, dff, 0));
    PROF(0, PS_PROF_OTHER, ps_swiglu(p.mlp_h, p.mlp_g, p.mlp_u, BT * dff));
    PROF(0, PS_PROF_MATMUL, ps_matmul(p.mlp_out, p.mlp_h, w.mlp_down, BT, dff, d, 0));
    FIRE(PS_HOOK_MLP_OUT, p.mlp_out, 3, B, T, d);
    PROF(0, PS_PROF_OTHER, ps_add(h_next, p.resid_mid, p.mlp_out, BT * d));
    FIRE(PS_HOOK_RESID_POST, h_next, 3, B, T, d);
    return 0;
}

static int layer_forward(const ps_model *m, ps_acts *a, int l, const ps_hooks *hooks, ps_error *err) {
    return layer_forward_pre(m, a, l, hooks, err) || layer_forward_post(m, a, l, hooks, err) ? -1 : 0;
}

static int forward_rest(const ps_model *m, ps_acts *a, int from, const ps_hooks *hooks, ps_error *err);

int ps_forward_from_attention(const ps_model *m, ps_acts *a, int l, const ps_hooks *hooks, ps_error *err) {
    if (!a->keep_all) return ps_fail(err, "forward from the attention of layer %d needs the activations of every layer", l);
    if (l < 0 || l >= m->cfg.n_layers)
        return ps_fail(err, "forward from layer %d: the model has %lld layers", l, (long long)m->cfg.n_layers);
    if (layer_forward_post(m, a, l, hooks, err)) return -1;
    return forward_rest(m, a, l + 1, hooks, err);
}

/* The last layer's post-attention part and the logits for chosen rows only (all else is left stale). */
static int last_layer_rows(const ps_model *m, ps_acts *a, const int64_t *rows, int64_t n, ps_error *err) {
    const ps_config *c = &m->cfg;
    int l = (int)c->n_layers - 1;
    ps_layer_params w = ps_model_layer(m, m->params, l);
    ps_act_ptrs p = ps_acts_layer(a, l);
    int64_t BT = a->B * a->T, d = c->d_model, qd = c->n_heads * c->head_dim, dff = c->d_ff, V = c->vocab_size;
    float eps = (float)c->rms_eps;
    const float *h = a->p.resid + (int64_t)l * BT * d;
    float *buf = malloc((size_t)(n * (qd + 4 * d + 3 * dff + V) + 2 * n) * sizeof(float));
    if (!buf) return ps_fail(err, "out of memory");
    float *z = buf, *ao = z + n * qd, *mid = ao + n * d, *ln = mid + n * d, *hh = ln + n * d, *g = hh + n * d,
          *u = g + n * dff, *mh = u + n * dff, *lg = mh + n * dff, *rs = lg + n * V;
    ps_attn_rows(z, rows, n, p.q, p.k, p.v, p.ck, p.cv, &a->geom);
    ps_matmul(ao, z, w.wo, n, qd, d, 0);
    for (int64_t i = 0; i < n; i++)
        for (int64_t e = 0; e < d; e++) mid[i * d + e] = h[rows[i] * d + e] + ao[i * d + e];
    ps_rmsnorm(ln, rs, mid, w.post_norm, n, d, eps);
    ps_matmul(g, ln, w.mlp_gate, n, d, dff, 0);
    ps_matmul(u, ln, w.mlp_up, n, d, dff, 0);
    ps_swiglu(mh, g, u, n * dff);
    ps_matmul(hh, mh, w.mlp_down, n, dff, d, 0);
    ps_add(hh, mid, hh, n * d);
    ps_rmsnorm(ln, rs, hh, ps_model_final_norm(m, m->params), n, d, eps);
    ps_matmul(lg, ln, ps_model_lm_head(m, m->params), n, d, V, 0);
    for (int64_t i = 0; i < n; i++) memcpy(a->p.logits + rows[i] * V, lg + i * V, (size_t)V * sizeof(float));
    free(buf);
    return 0;
}

int ps_forward_from_attention_rows(const ps_model *m, ps_acts *a, int l, const int64_t *rows, int64_t n, ps_error *err) {
    const ps_config *c = &m->cfg;
    int last = (int)c->n_layers - 1;
    if (!a->keep_all) return ps_fail(err, "forward from the attention of layer %d needs the activations of every layer", l);
    if (l < 0 || l > last) return ps_fail(err, "forward from layer %d: the model has %lld layers", l, (long long)c->n_layers);
    if (l < last) {
        if (layer_forward_post(m, a, l, NULL, err)) return -1;
        for (int k = l + 1; k < last; k++)
            if (layer_forward(m, a, k, NULL, err)) return -1;
        if (layer_forward_pre(m, a, last, NULL, err)) return -1;
    }
    return last_layer_rows(m, a, rows, n, err);
}

int ps_forward_from(const ps_model *m, ps_acts *a, int from, const ps_hooks *hooks, ps_error *err) {
    const ps_config *c = &m->cfg;
    if (from < 0 || from > c->n_layers)
        return ps_fail(err, "forward from layer %d: the model has %lld layers", from, (long long)c->n_layers);
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
    ps_profile *prof = a->prof;
    PROF(0, PS_PROF_NORM_ROPE,
         ps_rmsnorm(a->p.lnf, a->p.lnf_rstd, a->p.resid + c->n_layers * BT * d, ps_model_final_norm(m, m->params), BT, d,
                    (float)c->rms_eps));
    PROF(0, PS_PROF_MATMUL, ps_matmul(a->p.logits, a->p.lnf, ps_model_lm_head(m, m->params), BT, d, c->vocab_size, 0));
    return 0;
}

int ps_forward(const ps_model *m, ps_acts *a, const int32_t *tokens, const ps_hooks *hooks, ps_error *err) {
    const ps_config *c = &m->cfg;
    int64_t BT = a->B * a->T;
    for (int64_t i = 0; i < BT; i++)
        if (tokens[i] < 0 || tokens[i] >= c->vocab_size)
            return ps_fail(err, "token %d at sequence %lld, position %lld is outside the vocabulary [0, %lld)",
                           tokens[i], (long long)(i / a->T), (long long)(i % a->T), (long long)c->vocab_size);
    ps_profile *prof = a->prof;
    PROF(0, PS_PROF_OTHER, ps_embed(a->p.resid, tokens, ps_model_embed(m, m->params), BT, c->d_model));
    return ps_forward_from(m, a, 0, hooks, err);
}
