/* minicpm_model.c — MiniCPM4 weights (checked against the config, converted to float32), the forward over a
 * batch with its hook points (minicpm.h), and the hook names. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fileio.h"
#include "core/minicpm/minicpm.h"
#include "core/ops.h"
#include <cblas.h>

/* ---- the tensors the config needs ---- */

enum { T_EMBED = 0, T_NORM, T_HEAD, T_GLOBAL };
enum { L_Q = 0, L_K, L_V, L_O, L_IN, L_POST, L_GATE, L_UP, L_DOWN, L_PER_LAYER };
static const char *const LAYER_NAMES[L_PER_LAYER] = {
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "input_layernorm",
    "post_attention_layernorm", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"};

static int64_t n_tensors(const ps_minicpm_model *m) { return T_GLOBAL + L_PER_LAYER * m->cfg.n_layers; }

/* Tensor i: its name, shape (nd, shape) and where its floats go (*dst; NULL before the layers are allocated).
 * Returns 0 for a tensor the config does not need (the tied head), else 1. */
static int tensor_at(ps_minicpm_model *m, int64_t i, char *name, size_t n, int *nd, int64_t shape[2], float ***dst) {
    const ps_minicpm_config *c = &m->cfg;
    int64_t d = c->hidden_size, qd = c->n_heads * c->head_dim, kd = c->n_kv_heads * c->head_dim, F = c->intermediate_size;
    *dst = NULL;
    if (i < T_GLOBAL) {
        static const char *const g[T_GLOBAL] = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"};
        snprintf(name, n, "%s", g[i]);
        *nd = i == T_NORM ? 1 : 2;
        shape[0] = i == T_NORM ? d : c->vocab_size, shape[1] = d;
        *dst = i == T_EMBED ? &m->embed : i == T_NORM ? &m->norm : &m->lm_head;
        return i != T_HEAD || !c->tie_word_embeddings;
    }
    int64_t l = (i - T_GLOBAL) / L_PER_LAYER, k = (i - T_GLOBAL) % L_PER_LAYER;
    ps_minicpm_layer *L = m->layers ? &m->layers[l] : NULL;
    snprintf(name, n, "model.layers.%lld.%s.weight", (long long)l, LAYER_NAMES[k]);
    *nd = k == L_IN || k == L_POST ? 1 : 2;
    switch (k) {
    case L_Q: shape[0] = qd, shape[1] = d; break;
    case L_K:
    case L_V: shape[0] = kd, shape[1] = d; break;
    case L_O: shape[0] = d, shape[1] = qd; break;
    case L_GATE:
    case L_UP: shape[0] = F, shape[1] = d; break;
    case L_DOWN: shape[0] = d, shape[1] = F; break;
    default: shape[0] = d; break;
    }
    if (L) {
        float **p[L_PER_LAYER] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_in, &L->w_post, &L->gate, &L->up, &L->down};
        *dst = p[k];
    }
    return 1;
}

static void shape_text(char *buf, size_t n, int nd, const int64_t *s) {
    if (nd == 1) snprintf(buf, n, "[%lld]", (long long)s[0]);
    else if (nd == 2) snprintf(buf, n, "[%lld, %lld]", (long long)s[0], (long long)s[1]);
    else snprintf(buf, n, "(rank %d)", nd);
}

/* Every tensor the config needs: checked (present, dtype, shape) when load is 0, else converted to float32 into
 * the model's arrays. */
static int each_tensor(ps_minicpm_model *m, int load, ps_error *err) {
    for (int64_t i = 0; i < n_tensors(m); i++) {
        char name[256], got[64], want[64];
        int nd;
        int64_t shape[2];
        float **dst;
        if (!tensor_at(m, i, name, sizeof name, &nd, shape, &dst)) continue;
        const ps_st_file *f;
        const ps_st_entry *e;
        int r = ps_st_set_find(&m->files, name, &f, &e, err);
        if (r < 0) return -1;
        if (!r)
            return ps_fail(err, "%s: tensor \"%s\" is missing (the config in %s needs it%s)", m->files.path, name, m->cpath,
                           i == T_HEAD ? ": tie_word_embeddings is false" : "");
        if (!load) {
            if (e->dtype != PS_DT_F32 && e->dtype != PS_DT_BF16 && e->dtype != PS_DT_F16)
                return ps_fail(err, "%s: tensor \"%s\" has dtype %s (F32, BF16 or F16)", f->path, name, ps_dtype_name(e->dtype));
            int same = e->ndim == nd;
            for (int d = 0; same && d < nd; d++) same = e->shape[d] == shape[d];
            if (!same) {
                shape_text(got, sizeof got, e->ndim, e->shape);
                shape_text(want, sizeof want, nd, shape);
                return ps_fail(err, "%s: tensor \"%s\" has shape %s but the config in %s needs %s", f->path, name, got, m->cpath, want);
            }
            if (m->stored_dtype < 0) m->stored_dtype = (int)e->dtype;
            m->n_params += shape[0] * (nd == 2 ? shape[1] : 1);
            continue;
        }
        int64_t numel = ps_st_numel(e);
        if (!(*dst = malloc((size_t)numel * sizeof(float))))
            return ps_fail(err, "out of memory for tensor \"%s\" (%lld floats)", name, (long long)numel);
        if (ps_st_read_f32(f, e, *dst, err)) return ps_fail_prefix(err, "%s: tensor \"%s\"", f->path, name);
        ps_st_release(f, e);
        for (int64_t j = 0; j < numel; j++)
            if (!isfinite((*dst)[j]))
                return ps_fail(err, "%s: tensor \"%s\" holds a non-finite value at flat index %lld", f->path, name, (long long)j);
    }
    return 0;
}

int ps_minicpm_model_open(ps_minicpm_model *m, const char *dir, ps_error *err) {
    memset(m, 0, sizeof *m);
    snprintf(m->dir, sizeof m->dir, "%s", dir);
    snprintf(m->cpath, sizeof m->cpath, "%s/config.json", dir);
    if (ps_minicpm_config_load(m->cpath, &m->cfg, err)) return -1;
    if (ps_ctx_create(&m->ctx, "cpu", err)) return -1;
    if (ps_st_set_open(&m->files, dir, err)) return -1;
    m->files_open = 1;
    m->stored_dtype = -1;
    return each_tensor(m, 0, err);
}

int ps_minicpm_model_load_weights(ps_minicpm_model *m, ps_error *err) {
    if (m->loaded) return 0;
    if (!(m->layers = calloc((size_t)m->cfg.n_layers, sizeof *m->layers))) return ps_fail(err, "out of memory");
    if (each_tensor(m, 1, err)) return -1;
    if (m->cfg.tie_word_embeddings) m->lm_head = m->embed;
    m->loaded = 1;
    return 0;
}

int ps_minicpm_model_load(ps_minicpm_model *m, const char *dir, ps_error *err) {
    return ps_minicpm_model_open(m, dir, err) || ps_minicpm_model_load_weights(m, err) ? -1 : 0;
}

void ps_minicpm_model_free(ps_minicpm_model *m) {
    if (m->layers) {
        for (int64_t l = 0; l < m->cfg.n_layers; l++) {
            ps_minicpm_layer *L = &m->layers[l];
            free(L->wq), free(L->wk), free(L->wv), free(L->wo), free(L->w_in), free(L->w_post), free(L->gate), free(L->up),
                free(L->down);
        }
        free(m->layers);
    }
    if (m->lm_head != m->embed) free(m->lm_head);
    free(m->embed), free(m->norm);
    if (m->files_open) ps_st_set_close(&m->files);
    if (m->ctx) ps_ctx_free(m->ctx);
    memset(m, 0, sizeof *m);
}

/* ---- activations ---- */

/* sizes of a forward of T tokens: windows of both levels, blocks, slots */
static void sizes(const ps_minicpm_config *c, int64_t T, int64_t *N1, int64_t *N2, int64_t *nb, int64_t *ns) {
    *N1 = ps_select_n_windows(T, c->sel.kernel, c->sel.stride);
    *N2 = ps_select_n_windows(T, 4 * c->sel.kernel, 4 * c->sel.stride);
    *nb = ps_select_n_blocks(&c->sel, T);
    *ns = ps_select_slots(&c->sel);
}

/* the floats of each activation buffer, in the order of ps_minicpm_acts' pointers */
#define N_BUFS 21
static void buf_sizes(const ps_minicpm_config *c, int64_t B, int64_t T, int64_t n[N_BUFS]) {
    int64_t N1, N2, nb, ns, BT = B * T, d = c->hidden_size, H = c->n_heads, Hk = c->n_kv_heads, D = c->head_dim;
    sizes(c, T, &N1, &N2, &nb, &ns);
    int64_t v[N_BUFS] = {BT * d, BT * d, BT * H * D, BT * Hk * D, BT * Hk * D, c->use_nope ? BT * H * D : 0,
                         c->use_nope ? BT * Hk * D : 0, B * N1 * Hk * D, B * N2 * Hk * D, BT * Hk * N1, BT * Hk * nb,
                         BT * Hk * ns, BT * H * D, BT * H, BT * d, BT * c->intermediate_size, BT * c->intermediate_size,
                         BT * d, BT * c->vocab_size, T * D / 2, T * D / 2};
    memcpy(n, v, sizeof v);
}

int64_t ps_minicpm_acts_bytes(const ps_minicpm_config *c, int64_t B, int64_t T) {
    int64_t n[N_BUFS], s = 0;
    buf_sizes(c, B, T, n);
    for (int i = 0; i < N_BUFS; i++) s += n[i];
    return 4 * s;
}

int ps_minicpm_acts_create(ps_minicpm_acts *a, const ps_minicpm_model *m, int64_t B, int64_t T, ps_error *err) {
    memset(a, 0, sizeof *a);
    if (B < 1 || T < 1) return ps_fail(err, "a forward needs B >= 1 and T >= 1 (got B = %lld, T = %lld)", (long long)B, (long long)T);
    a->B = B, a->T = T;
    int64_t n[N_BUFS];
    buf_sizes(&m->cfg, B, T, n);
    float **p[N_BUFS] = {&a->h, &a->x, &a->q, &a->k, &a->v, &a->qn, &a->kn, &a->k1, &a->k2, &a->P, &a->bs,
                         &a->blocks, &a->z, &a->lse, &a->ao, &a->g, &a->u, &a->mo, &a->logits, &a->cos_t, &a->sin_t};
    for (int i = 0; i < N_BUFS; i++)
        if (!(*p[i] = calloc((size_t)(n[i] ? n[i] : 1), sizeof(float)))) {
            ps_minicpm_acts_free(a);
            return ps_fail(err, "out of memory for the activations (B = %lld, T = %lld)", (long long)B, (long long)T);
        }
    ps_minicpm_rope_table(&m->cfg, 0, T, T, a->cos_t, a->sin_t);
    return 0;
}

void ps_minicpm_acts_free(ps_minicpm_acts *a) {
    float *p[N_BUFS] = {a->h, a->x, a->q, a->k, a->v, a->qn, a->kn, a->k1, a->k2, a->P, a->bs,
                        a->blocks, a->z, a->lse, a->ao, a->g, a->u, a->mo, a->logits, a->cos_t, a->sin_t};
    for (int i = 0; i < N_BUFS; i++) free(p[i]);
    memset(a, 0, sizeof *a);
}

/* ---- hook points ---- */

static const char *const SUFFIX[PS_MCH_NPOINTS] = {
    "hook_resid_pre", "attn.hook_q", "attn.hook_k", "attn.hook_v", "attn.hook_ck", "attn.hook_ck2", "attn.hook_select_scores",
    "attn.hook_block_scores", "attn.hook_blocks", "attn.hook_z", "hook_attn_out", "hook_mlp_out", "hook_resid_post"};

void ps_minicpm_hook_name(char *buf, size_t n, int slot, int point) {
    snprintf(buf, n, "blocks.%d.%s", slot, point >= 0 && point < PS_MCH_NPOINTS ? SUFFIX[point] : "?");
}

const ps_hook_family ps_minicpm_hook_family = {"minicpm", ps_minicpm_hook_name};

int ps_minicpm_point_shape(const ps_minicpm_config *c, int p, int64_t B, int64_t T, int64_t d[4]) {
    int64_t N1, N2, nb, ns;
    sizes(c, T, &N1, &N2, &nb, &ns);
    d[0] = B, d[1] = T;
    switch (p) {
    case PS_MCH_Q:
    case PS_MCH_Z: d[2] = c->n_heads, d[3] = c->head_dim; return 4;
    case PS_MCH_K:
    case PS_MCH_V: d[2] = c->n_kv_heads, d[3] = c->head_dim; return 4;
    case PS_MCH_CK:
    case PS_MCH_CK2:
        d[1] = p == PS_MCH_CK ? N1 : N2, d[2] = c->n_kv_heads, d[3] = c->head_dim;
        return 4;
    case PS_MCH_SELECT_SCORES: d[2] = c->n_kv_heads, d[3] = N1; return 4;
    case PS_MCH_BLOCK_SCORES: d[2] = c->n_kv_heads, d[3] = nb; return 4;
    case PS_MCH_BLOCKS: d[2] = c->n_kv_heads, d[3] = ns; return 4;
    default: d[2] = c->hidden_size; return 3;
    }
}

static int invalid(const ps_minicpm_config *c, const char *name, const char *why, ps_error *err) {
    char nm[120];
    return ps_fail(err,
                   "hook \"%s\": %s; valid hooks (l = 0..%lld): blocks.{l}. + hook_resid_pre, attn.{hook_q,hook_k,hook_v,"
                   "hook_ck,hook_ck2,hook_select_scores,hook_block_scores,hook_blocks,hook_z}, hook_attn_out, hook_mlp_out, "
                   "hook_resid_post",
                   ps_st_printable(name, nm, sizeof nm), why, (long long)c->n_layers - 1);
}

int ps_minicpm_hook_parse(const ps_minicpm_config *c, const char *name, int *slot, int *point, ps_error *err) {
    if (strncmp(name, "blocks.", 7) || name[7] < '0' || name[7] > '9') return invalid(c, name, "unknown hook name", err);
    char *end;
    long l = strtol(name + 7, &end, 10);
    if (*end != '.') return invalid(c, name, "unknown hook name", err);
    for (int p = 0; p < PS_MCH_NPOINTS; p++)
        if (!strcmp(end + 1, SUFFIX[p])) {
            if (l < 0 || l >= c->n_layers) {
                char why[96];
                snprintf(why, sizeof why, "layer %ld out of range (the model has %lld layers)", l, (long long)c->n_layers);
                return invalid(c, name, why, err);
            }
            *slot = (int)l, *point = p;
            return 0;
        }
    return invalid(c, name, "unknown hook name", err);
}

/* the heads an action may pick on axis 2 */
static int64_t point_heads(const ps_minicpm_config *c, int p) {
    switch (p) {
    case PS_MCH_Q:
    case PS_MCH_Z: return c->n_heads;
    case PS_MCH_RESID_PRE:
    case PS_MCH_ATTN_OUT:
    case PS_MCH_MLP_OUT:
    case PS_MCH_RESID_POST: return 0;
    default: return c->n_kv_heads;
    }
}

int ps_minicpm_hooks_add(ps_hooks *h, const ps_minicpm_config *c, const char *name, ps_hook_fn fn, void *user, ps_error *err) {
    int slot, p;
    if (ps_minicpm_hook_parse(c, name, &slot, &p, err)) return -1;
    if (!fn) return ps_fail(err, "hook \"%s\": no function (an action is registered with ps_minicpm_hooks_add_action)", name);
    return ps_hooks_add_at(h, &ps_minicpm_hook_family, c->n_layers, slot, p, name, fn, user, NULL, 0, err);
}

int ps_minicpm_hooks_add_action(ps_hooks *h, const ps_minicpm_config *c, const char *name, const ps_hook_action *act,
                                ps_error *err) {
    int slot, p;
    if (ps_minicpm_hook_parse(c, name, &slot, &p, err)) return -1;
    if (!act) return ps_fail(err, "hook \"%s\": no action", name);
    return ps_hooks_add_at(h, &ps_minicpm_hook_family, c->n_layers, slot, p, name, NULL, NULL, act, point_heads(c, p), err);
}

int ps_minicpm_cache_watch(ps_cache *cache, ps_hooks *h, const ps_minicpm_config *c, const char *name, ps_error *err) {
    int slot, p;
    if (ps_minicpm_hook_parse(c, name, &slot, &p, err)) return -1;
    return ps_cache_watch_at(cache, h, &ps_minicpm_hook_family, c->n_layers, slot, p, err);
}

/* ---- forward ---- */

static int fire(const ps_minicpm_model *m, const ps_hooks *h, int l, int p, float *data, int64_t B, int64_t T, ps_error *err) {
    if (!ps_hooks_on_point(h, &ps_minicpm_hook_family, l, p)) return 0;
    int64_t d[4];
    int nd = ps_minicpm_point_shape(&m->cfg, p, B, T, d);
    return ps_hooks_fire_point(m->ctx, h, l, p, data, nd, d, err); /* before the first complete window: 0 entries */
}

/* out[M, N] = inp[M, K] · w[N, K]^T: ps_matmul, except one row (a decode step), which is cblas_sgemv — OpenBLAS
 * 0.3.21's sgemm packs the whole weight matrix even for one row (docs/kvcache.md "Decode"; the model's context is
 * always the cpu backend, so its buffers are host memory) */
static int mc_matmul(ps_ctx *cx, float *out, const float *inp, const float *w, int64_t M, int64_t K, int64_t N) {
    if (M == 1 && K > 0 && N > 0 && !cx->failed) {
        cblas_sgemv(CblasRowMajor, CblasNoTrans, (blasint)N, (blasint)K, 1.0f, w, (blasint)K, inp, 1, 0.0f, out, 1);
        return 0;
    }
    return ps_matmul(cx, out, inp, w, M, K, N, 0);
}

static void scale(float *x, double s, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = (float)(x[i] * s);
}

/* one attention layer over the batch: a->q, a->k, a->v (roped; a->qn, a->kn un-roped under use_nope) → a->z */
static int attention(const ps_minicpm_model *m, ps_minicpm_acts *a, const ps_hooks *h, int l, ps_error *err) {
    const ps_minicpm_config *c = &m->cfg;
    int64_t B = a->B, T = a->T, H = c->n_heads, Hk = c->n_kv_heads, D = c->head_dim, N1, N2, nb, ns;
    sizes(c, T, &N1, &N2, &nb, &ns);
    if (!ps_minicpm_sparse(c, T)) {
        for (int64_t b = 0; b < B; b++)
            ps_select_attn_forward(a->z + b * T * H * D, NULL, a->q + b * T * H * D, a->k + b * T * Hk * D, a->v + b * T * Hk * D,
                                   NULL, ns, T, 0, T, c->sel.block, H, Hk, D);
        return 0;
    }
    const float *qs = c->use_nope ? a->qn : a->q, *ks = c->use_nope ? a->kn : a->k;
    int64_t K = c->sel.kernel, S = c->sel.stride;
    for (int64_t b = 0; b < B; b++) {
        ps_select_compress_forward(a->k1 + b * N1 * Hk * D, ks + b * T * Hk * D, T, Hk, D, K, S);
        ps_select_compress_forward(a->k2 + b * N2 * Hk * D, ks + b * T * Hk * D, T, Hk, D, 4 * K, 4 * S);
    }
    if (fire(m, h, l, PS_MCH_CK, a->k1, B, T, err) || fire(m, h, l, PS_MCH_CK2, a->k2, B, T, err)) return -1;
    for (int64_t b = 0; b < B; b++)
        ps_select_scores_forward(a->P + b * T * Hk * N1, qs + b * T * H * D, T, 0, a->k1 + b * N1 * Hk * D, N1,
                                 a->k2 + b * N2 * Hk * D, N2, H, Hk, D, K, S);
    if (fire(m, h, l, PS_MCH_SELECT_SCORES, a->P, B, T, err)) return -1;
    for (int64_t b = 0; b < B; b++) ps_select_block_scores_forward(a->bs + b * T * Hk * nb, a->P + b * T * Hk * N1, T, 0, N1, nb, Hk, &c->sel);
    if (fire(m, h, l, PS_MCH_BLOCK_SCORES, a->bs, B, T, err)) return -1;
    for (int64_t b = 0; b < B; b++) ps_select_topk_forward(a->blocks + b * T * Hk * ns, a->bs + b * T * Hk * nb, T, 0, nb, Hk, &c->sel);
    if (ps_hooks_on_point(h, &ps_minicpm_hook_family, l, PS_MCH_BLOCKS)) {
        char what[96];
        ps_minicpm_hook_name(what, sizeof what, l, PS_MCH_BLOCKS);
        if (fire(m, h, l, PS_MCH_BLOCKS, a->blocks, B, T, err) || ps_select_blocks_check(a->blocks, B * T, Hk, ns, nb, what, err))
            return -1;
    }
    for (int64_t b = 0; b < B; b++)
        ps_select_attn_forward(a->z + b * T * H * D, NULL, a->q + b * T * H * D, a->k + b * T * Hk * D, a->v + b * T * Hk * D,
                               a->blocks + b * T * Hk * ns, ns, T, 0, T, c->sel.block, H, Hk, D);
    return 0;
}

/* The first half of layer l over rows of a (B sequences of T rows at positions from the tables a->cos_t / a->sin_t):
 * x = RMSNorm(h)·w_in, q, k, v, their un-roped copies under use_nope, RoPE; the hooks q, k, v. */
static int qkv(const ps_minicpm_model *m, ps_minicpm_acts *a, int l, int64_t B, int64_t T, const ps_hooks *h, ps_error *err) {
    const ps_minicpm_config *c = &m->cfg;
    const ps_minicpm_layer *L = &m->layers[l];
    ps_ctx *cx = m->ctx;
    int64_t BT = B * T, d = c->hidden_size, H = c->n_heads, Hk = c->n_kv_heads, D = c->head_dim;
    if (fire(m, h, l, PS_MCH_RESID_PRE, a->h, B, T, err)) return -1;
    if (ps_rmsnorm(cx, a->x, NULL, a->h, L->w_in, BT, d, (float)c->rms_norm_eps) || mc_matmul(cx, a->q, a->x, L->wq, BT, d, H * D) ||
        mc_matmul(cx, a->k, a->x, L->wk, BT, d, Hk * D) || mc_matmul(cx, a->v, a->x, L->wv, BT, d, Hk * D))
        return ps_ctx_check(cx, err);
    if (c->use_nope) {
        memcpy(a->qn, a->q, (size_t)(BT * H * D) * sizeof(float));
        memcpy(a->kn, a->k, (size_t)(BT * Hk * D) * sizeof(float));
    }
    if (ps_rope(cx, a->q, a->cos_t, a->sin_t, B, T, H, D, 1) || ps_rope(cx, a->k, a->cos_t, a->sin_t, B, T, Hk, D, 1))
        return ps_ctx_check(cx, err);
    return fire(m, h, l, PS_MCH_Q, a->q, B, T, err) || fire(m, h, l, PS_MCH_K, a->k, B, T, err) ||
                   fire(m, h, l, PS_MCH_V, a->v, B, T, err)
               ? -1
               : 0;
}

/* The second half of layer l from a->z: o_proj and the MLP, each scaled into the residual a->h; their hooks. */
static int post(const ps_minicpm_model *m, ps_minicpm_acts *a, int l, int64_t B, int64_t T, const ps_hooks *h, ps_error *err) {
    const ps_minicpm_config *c = &m->cfg;
    const ps_minicpm_layer *L = &m->layers[l];
    ps_ctx *cx = m->ctx;
    int64_t BT = B * T, d = c->hidden_size, H = c->n_heads, D = c->head_dim, F = c->intermediate_size;
    double res = c->scale_depth / sqrt((double)c->n_layers);
    if (fire(m, h, l, PS_MCH_Z, a->z, B, T, err)) return -1;
    if (mc_matmul(cx, a->ao, a->z, L->wo, BT, H * D, d)) return ps_ctx_check(cx, err);
    scale(a->ao, res, BT * d);
    if (fire(m, h, l, PS_MCH_ATTN_OUT, a->ao, B, T, err) || ps_add(cx, a->h, a->h, a->ao, BT * d)) return -1;
    if (ps_rmsnorm(cx, a->x, NULL, a->h, L->w_post, BT, d, (float)c->rms_norm_eps) || mc_matmul(cx, a->g, a->x, L->gate, BT, d, F) ||
        mc_matmul(cx, a->u, a->x, L->up, BT, d, F) || ps_swiglu(cx, a->g, a->g, a->u, BT * F) ||
        mc_matmul(cx, a->mo, a->g, L->down, BT, F, d))
        return ps_ctx_check(cx, err);
    scale(a->mo, res, BT * d);
    return fire(m, h, l, PS_MCH_MLP_OUT, a->mo, B, T, err) || ps_add(cx, a->h, a->h, a->mo, BT * d) ||
                   fire(m, h, l, PS_MCH_RESID_POST, a->h, B, T, err)
               ? -1
               : 0;
}

/* embed [n tokens] into a->h; final norm and head of a->h into a->logits */
static int embed(const ps_minicpm_model *m, ps_minicpm_acts *a, const int32_t *tokens, int64_t n, ps_error *err) {
    const ps_minicpm_config *c = &m->cfg;
    for (int64_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= c->vocab_size)
            return ps_fail(err, "token %d at row %lld is outside the vocabulary [0, %lld)", tokens[i], (long long)i,
                           (long long)c->vocab_size);
    if (ps_embed(m->ctx, a->h, tokens, m->embed, n, c->hidden_size)) return ps_ctx_check(m->ctx, err);
    scale(a->h, c->scale_emb, n * c->hidden_size);
    return 0;
}

static int head(const ps_minicpm_model *m, ps_minicpm_acts *a, int64_t n, ps_error *err) {
    const ps_minicpm_config *c = &m->cfg;
    int64_t d = c->hidden_size;
    if (ps_rmsnorm(m->ctx, a->x, NULL, a->h, m->norm, n, d, (float)c->rms_norm_eps)) return ps_ctx_check(m->ctx, err);
    scale(a->x, c->dim_model_base / (double)d, n * d);
    if (mc_matmul(m->ctx, a->logits, a->x, m->lm_head, n, d, c->vocab_size)) return ps_ctx_check(m->ctx, err);
    return ps_ctx_check(m->ctx, err);
}

/* the forward; kv (B = 1, empty) keeps each layer's keys, values and compressed keys: a prefill */
static int forward(const ps_minicpm_model *m, ps_minicpm_acts *a, const int32_t *tokens, const ps_hooks *h, int n_run,
                   ps_minicpm_cache *kv, ps_error *err) {
    const ps_minicpm_config *c = &m->cfg;
    if (!m->loaded) return ps_fail(err, "%s: the weights are not loaded", m->dir);
    int64_t B = a->B, T = a->T, Hk = c->n_kv_heads, D = c->head_dim;
    int n = n_run < 0 || n_run > c->n_layers ? (int)c->n_layers : n_run;
    if (embed(m, a, tokens, B * T, err)) return -1;
    for (int l = 0; l < n; l++) {
        if (qkv(m, a, l, B, T, h, err) || attention(m, a, h, l, err)) return -1;
        if (kv) { /* the prefill's keys and values, and the compressed keys from them */
            memcpy(kv->k + l * kv->cap * Hk * D, a->k, (size_t)(T * Hk * D) * sizeof(float));
            memcpy(kv->v + l * kv->cap * Hk * D, a->v, (size_t)(T * Hk * D) * sizeof(float));
            if (c->use_nope) memcpy(kv->kn + l * kv->cap * Hk * D, a->kn, (size_t)(T * Hk * D) * sizeof(float));
            if (ps_minicpm_sparse(c, T)) { /* the pooled keys as the layer used them (after their hooks) */
                int64_t nb = ps_select_n_blocks(&c->sel, T), ns = ps_select_slots(&c->sel), K = c->sel.kernel, S = c->sel.stride;
                int64_t N1 = ps_select_n_windows(T, K, S), N2 = ps_select_n_windows(T, 4 * K, 4 * S);
                memcpy(kv->k1 + l * ps_select_n_windows(kv->cap, K, S) * Hk * D, a->k1, (size_t)(N1 * Hk * D) * sizeof(float));
                memcpy(kv->k2 + l * ps_select_n_windows(kv->cap, 4 * K, 4 * S) * Hk * D, a->k2, (size_t)(N2 * Hk * D) * sizeof(float));
                memcpy(kv->blocks + l * Hk * ns, a->blocks + (T - 1) * Hk * ns, (size_t)(Hk * ns) * sizeof(float));
                memcpy(kv->bs + l * Hk * kv->nb_cap, a->bs + (T - 1) * Hk * nb, (size_t)(Hk * nb) * sizeof(float));
            }
        }
        if (post(m, a, l, B, T, h, err)) return -1;
    }
    return n == c->n_layers ? head(m, a, B * T, err) : ps_ctx_check(m->ctx, err);
}

int ps_minicpm_forward(const ps_minicpm_model *m, ps_minicpm_acts *a, const int32_t *tokens, const ps_hooks *h, int n_run,
                       ps_error *err) {
    return forward(m, a, tokens, h, n_run, NULL, err);
}

/* ---- the KV cache: a prefill, then one token at a time ---- */

int ps_minicpm_cache_create(ps_minicpm_cache *kv, const ps_minicpm_model *m, int64_t cap, ps_error *err) {
    const ps_minicpm_config *c = &m->cfg;
    memset(kv, 0, sizeof *kv);
    if (cap < 1) return ps_fail(err, "a KV cache of %lld positions: must be >= 1", (long long)cap);
    int64_t Lr = c->n_layers, Hk = c->n_kv_heads, D = c->head_dim, K = c->sel.kernel, S = c->sel.stride;
    kv->cap = cap;
    kv->nb_cap = ps_select_n_blocks(&c->sel, cap);
    int64_t N1 = ps_select_n_windows(cap, K, S), N2 = ps_select_n_windows(cap, 4 * K, 4 * S), ns = ps_select_slots(&c->sel);
    int64_t n[8] = {Lr * cap * Hk * D, Lr * cap * Hk * D, c->use_nope ? Lr * cap * Hk * D : 0, Lr * N1 * Hk * D,
                    Lr * N2 * Hk * D, Hk * (N1 ? N1 : 1), Lr * Hk * kv->nb_cap, Lr * Hk * ns};
    float **p[8] = {&kv->k, &kv->v, &kv->kn, &kv->k1, &kv->k2, &kv->P, &kv->bs, &kv->blocks};
    for (int i = 0; i < 8; i++)
        if (!(*p[i] = calloc((size_t)(n[i] ? n[i] : 1), sizeof(float)))) {
            ps_minicpm_cache_free(kv);
            return ps_fail(err, "out of memory for a KV cache of %lld positions", (long long)cap);
        }
    if (ps_minicpm_acts_create(&kv->row, m, 1, 1, err)) {
        ps_minicpm_cache_free(kv);
        return -1;
    }
    return 0;
}

void ps_minicpm_cache_free(ps_minicpm_cache *kv) {
    free(kv->k), free(kv->v), free(kv->kn), free(kv->k1), free(kv->k2), free(kv->P), free(kv->bs), free(kv->blocks);
    if (kv->row.h) ps_minicpm_acts_free(&kv->row);
    memset(kv, 0, sizeof *kv);
}

int64_t ps_minicpm_cache_bytes(const ps_minicpm_config *c, int64_t L) {
    int64_t Lr = c->n_layers, Hk = c->n_kv_heads, W = Hk * c->head_dim, K = c->sel.kernel, S = c->sel.stride;
    int64_t N1 = ps_select_n_windows(L, K, S), N2 = ps_select_n_windows(L, 4 * K, 4 * S), nb = ps_select_n_blocks(&c->sel, L);
    int64_t floats = Lr * (c->use_nope ? 3 : 2) * L * W + Lr * (N1 + N2) * W + Hk * N1 + Lr * Hk * (nb + ps_select_slots(&c->sel));
    return 4 * floats + ps_minicpm_acts_bytes(c, 1, 1);
}

/* the windows of both levels that complete within the cache's L tokens, appended to layer l's compressed keys; on
 * the sparse path (fire) each fires its hook (hook_ck / hook_ck2, [1, 1, Hkv, D], *ev_entry its index while it fires)
 * and is kept as the hook leaves it */
static int extend_windows(const ps_minicpm_model *m, ps_minicpm_cache *kv, int l, int64_t L, int fire_hooks, const ps_hooks *h,
                          int64_t *ev_entry, ps_error *err) {
    const ps_minicpm_config *c = &m->cfg;
    int64_t Hk = c->n_kv_heads, D = c->head_dim, W = Hk * D, K = c->sel.kernel, S = c->sel.stride;
    const float *keys = (c->use_nope ? kv->kn : kv->k) + l * kv->cap * W;
    int64_t N1c = ps_select_n_windows(kv->cap, K, S), N2c = ps_select_n_windows(kv->cap, 4 * K, 4 * S);
    for (int lv = 0; lv < 2; lv++) {
        int64_t Kl = lv ? 4 * K : K, Sl = lv ? 4 * S : S, j0 = lv ? kv->n2 : kv->n1, N = ps_select_n_windows(L, Kl, Sl);
        float *dst = (lv ? kv->k2 + l * N2c * W : kv->k1 + l * N1c * W);
        int pt = lv ? PS_MCH_CK2 : PS_MCH_CK;
        for (int64_t j = j0; j < N; j++) {
            ps_select_compress_forward(dst + j * W, keys + j * Sl * W, Kl, Hk, D, Kl, Sl);
            if (!fire_hooks || !ps_hooks_on_point(h, &ps_minicpm_hook_family, l, pt)) continue;
            int64_t d[4] = {1, 1, Hk, D};
            if (ev_entry) *ev_entry = j;
            int rc = ps_hooks_fire_point(m->ctx, h, l, pt, dst + j * W, 4, d, err);
            if (ev_entry) *ev_entry = -1;
            if (rc) return -1;
        }
    }
    return 0;
}

/* fire point p of layer l on a decode step's row: [1, 1, Hkv, n] */
static int fire_row(const ps_minicpm_model *m, const ps_hooks *h, int l, int p, float *data, int64_t n, ps_error *err) {
    if (!ps_hooks_on_point(h, &ps_minicpm_hook_family, l, p)) return 0;
    int64_t d[4] = {1, 1, m->cfg.n_kv_heads, n};
    return ps_hooks_fire_point(m->ctx, h, l, p, data, 4, d, err);
}

int ps_minicpm_prefill_ex(const ps_minicpm_model *m, ps_minicpm_cache *kv, const int32_t *tokens, int64_t T, const ps_hooks *h,
                          float *logits, int all_rows, ps_error *err) {
    const ps_minicpm_config *c = &m->cfg;
    if (kv->L) return ps_fail(err, "prefill: the KV cache already holds %lld tokens", (long long)kv->L);
    if (T < 1 || T > kv->cap) return ps_fail(err, "prefill of %lld tokens into a KV cache of %lld", (long long)T, (long long)kv->cap);
    ps_minicpm_acts a;
    if (ps_minicpm_acts_create(&a, m, 1, T, err)) return -1;
    int rc = forward(m, &a, tokens, h, -1, kv, err);
    /* the sparse path kept the forward's pooled keys (forward); the dense one pools them here, without hooks */
    for (int l = 0; !rc && !ps_minicpm_sparse(c, T) && l < c->n_layers; l++) rc = extend_windows(m, kv, l, T, 0, NULL, NULL, err);
    if (!rc) {
        kv->n1 = ps_select_n_windows(T, c->sel.kernel, c->sel.stride);
        kv->n2 = ps_select_n_windows(T, 4 * c->sel.kernel, 4 * c->sel.stride);
        kv->L = T;
        if (logits)
            memcpy(logits, a.logits + (all_rows ? 0 : T - 1) * c->vocab_size,
                   (size_t)((all_rows ? T : 1) * c->vocab_size) * sizeof(float));
    }
    ps_minicpm_acts_free(&a);
    return rc;
}

int ps_minicpm_prefill(const ps_minicpm_model *m, ps_minicpm_cache *kv, const int32_t *tokens, int64_t T, float *logits,
                       ps_error *err) {
    return ps_minicpm_prefill_ex(m, kv, tokens, T, NULL, logits, 0, err);
}

int ps_minicpm_decode_ex(const ps_minicpm_model *m, ps_minicpm_cache *kv, int32_t token, const ps_hooks *h, int64_t *ev_entry,
                         float *logits, ps_error *err) {
    const ps_minicpm_config *c = &m->cfg;
    if (kv->L >= kv->cap) return ps_fail(err, "decode: the KV cache of %lld positions is full", (long long)kv->cap);
    ps_minicpm_acts *a = &kv->row;
    int64_t p = kv->L, L = p + 1, Hk = c->n_kv_heads, H = c->n_heads, D = c->head_dim, W = Hk * D, K = c->sel.kernel,
            S = c->sel.stride;
    int64_t N1 = ps_select_n_windows(L, K, S), N2 = ps_select_n_windows(L, 4 * K, 4 * S), nb = ps_select_n_blocks(&c->sel, L),
            ns = ps_select_slots(&c->sel), N1c = ps_select_n_windows(kv->cap, K, S), N2c = ps_select_n_windows(kv->cap, 4 * K, 4 * S);
    int sparse = ps_minicpm_sparse(c, L);
    ps_minicpm_rope_table(c, p, 1, L, a->cos_t, a->sin_t);
    if (embed(m, a, &token, 1, err)) return -1;
    for (int l = 0; l < c->n_layers; l++) {
        if (qkv(m, a, l, 1, 1, h, err)) return -1; /* the hooks q, k, v: the cache keeps what they leave */
        float *kl = kv->k + l * kv->cap * W, *vl = kv->v + l * kv->cap * W;
        memcpy(kl + p * W, a->k, (size_t)W * sizeof(float));
        memcpy(vl + p * W, a->v, (size_t)W * sizeof(float));
        if (c->use_nope) memcpy(kv->kn + l * kv->cap * W + p * W, a->kn, (size_t)W * sizeof(float));
        if (extend_windows(m, kv, l, L, sparse, h, ev_entry, err)) return -1;
        float *blk = NULL;
        if (sparse) { /* stage 1, block scores and the choice for the new row (q_blk = p / block), their hooks */
            float *k1 = kv->k1 + l * N1c * W, *k2 = kv->k2 + l * N2c * W, *bs = kv->bs + l * Hk * kv->nb_cap;
            blk = kv->blocks + l * Hk * ns;
            ps_select_scores_forward(kv->P, c->use_nope ? a->qn : a->q, 1, p, k1, N1, k2, N2, H, Hk, D, K, S);
            if (fire_row(m, h, l, PS_MCH_SELECT_SCORES, kv->P, N1, err)) return -1;
            ps_select_block_scores_forward(bs, kv->P, 1, p, N1, nb, Hk, &c->sel);
            if (fire_row(m, h, l, PS_MCH_BLOCK_SCORES, bs, nb, err)) return -1;
            ps_select_topk_forward(blk, bs, 1, p, nb, Hk, &c->sel);
            if (ps_hooks_on_point(h, &ps_minicpm_hook_family, l, PS_MCH_BLOCKS)) {
                char what[96];
                ps_minicpm_hook_name(what, sizeof what, l, PS_MCH_BLOCKS);
                if (fire_row(m, h, l, PS_MCH_BLOCKS, blk, ns, err) || ps_select_blocks_check(blk, 1, Hk, ns, nb, what, err)) return -1;
            }
        }
        ps_select_attn_forward(a->z, NULL, a->q, kl, vl, blk, ns, 1, p, L, c->sel.block, H, Hk, D);
        if (post(m, a, l, 1, 1, h, err)) return -1;
    }
    if (head(m, a, 1, err)) return -1;
    kv->n1 = N1, kv->n2 = N2, kv->L = L;
    if (logits) memcpy(logits, a->logits, (size_t)c->vocab_size * sizeof(float));
    return 0;
}

int ps_minicpm_decode(const ps_minicpm_model *m, ps_minicpm_cache *kv, int32_t token, float *logits, ps_error *err) {
    return ps_minicpm_decode_ex(m, kv, token, NULL, NULL, logits, err);
}

/* ---- fork and truncate ---- */

int ps_minicpm_cache_copy(ps_minicpm_cache *dst, const ps_minicpm_cache *src, const ps_minicpm_model *m, ps_error *err) {
    const ps_minicpm_config *c = &m->cfg;
    if (ps_minicpm_cache_create(dst, m, src->cap, err)) return -1;
    int64_t W = c->n_kv_heads * c->head_dim, K = c->sel.kernel, S = c->sel.stride, ns = ps_select_slots(&c->sel);
    int64_t N1c = ps_select_n_windows(src->cap, K, S), N2c = ps_select_n_windows(src->cap, 4 * K, 4 * S);
    for (int64_t l = 0; l < c->n_layers; l++) { /* what the source has written: L positions, n1 / n2 windows */
        size_t row = (size_t)W * sizeof(float);
        memcpy(dst->k + l * src->cap * W, src->k + l * src->cap * W, (size_t)src->L * row);
        memcpy(dst->v + l * src->cap * W, src->v + l * src->cap * W, (size_t)src->L * row);
        if (c->use_nope) memcpy(dst->kn + l * src->cap * W, src->kn + l * src->cap * W, (size_t)src->L * row);
        memcpy(dst->k1 + l * N1c * W, src->k1 + l * N1c * W, (size_t)src->n1 * row);
        memcpy(dst->k2 + l * N2c * W, src->k2 + l * N2c * W, (size_t)src->n2 * row);
    }
    memcpy(dst->bs, src->bs, (size_t)(c->n_layers * c->n_kv_heads * src->nb_cap) * sizeof(float));
    memcpy(dst->blocks, src->blocks, (size_t)(c->n_layers * c->n_kv_heads * ns) * sizeof(float));
    dst->L = src->L, dst->n1 = src->n1, dst->n2 = src->n2;
    return 0;
}

int ps_minicpm_cache_truncate(const ps_minicpm_config *c, ps_minicpm_cache *kv, int64_t T, ps_error *err) {
    if (T < 0 || T > kv->L)
        return ps_fail(err, "truncate to %lld tokens: the sequence holds %lld", (long long)T, (long long)kv->L);
    kv->L = T;
    kv->n1 = ps_select_n_windows(T, c->sel.kernel, c->sel.stride);
    kv->n2 = ps_select_n_windows(T, 4 * c->sel.kernel, 4 * c->sel.stride);
    return 0;
}
