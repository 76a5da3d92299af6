#define _POSIX_C_SOURCE 200809L
#include "core/v4/v4_model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fileio.h"

/* ---- names ---- */

/* Native (hub) and transformers names: globals whole, layer tensors after "layers.L." /
 * "model.layers.L.". Experts: the native name is per expert ("ffn.experts.%d.w1.weight"), the HF one
 * stacked (gate_up_proj holds w1 then w3 along its rows). */
static const char *const NATIVE[PS_V4_T_NKINDS] = {
    [PS_V4_T_EMBED] = "embed.weight", [PS_V4_T_HEAD] = "head.weight", [PS_V4_T_NORM] = "norm.weight",
    [PS_V4_T_HC_HEAD_FN] = "hc_head_fn", [PS_V4_T_HC_HEAD_BASE] = "hc_head_base", [PS_V4_T_HC_HEAD_SCALE] = "hc_head_scale",
    [PS_V4_T_ATTN_NORM] = "attn_norm.weight", [PS_V4_T_FFN_NORM] = "ffn_norm.weight",
    [PS_V4_T_HC_ATTN_FN] = "hc_attn_fn", [PS_V4_T_HC_ATTN_BASE] = "hc_attn_base", [PS_V4_T_HC_ATTN_SCALE] = "hc_attn_scale",
    [PS_V4_T_HC_FFN_FN] = "hc_ffn_fn", [PS_V4_T_HC_FFN_BASE] = "hc_ffn_base", [PS_V4_T_HC_FFN_SCALE] = "hc_ffn_scale",
    [PS_V4_T_SINK] = "attn.attn_sink", [PS_V4_T_WQ_A] = "attn.wq_a.weight", [PS_V4_T_Q_NORM] = "attn.q_norm.weight",
    [PS_V4_T_WQ_B] = "attn.wq_b.weight", [PS_V4_T_WKV] = "attn.wkv.weight", [PS_V4_T_KV_NORM] = "attn.kv_norm.weight",
    [PS_V4_T_WO_A] = "attn.wo_a.weight", [PS_V4_T_WO_B] = "attn.wo_b.weight",
    [PS_V4_T_C_WKV] = "attn.compressor.wkv.weight", [PS_V4_T_C_WGATE] = "attn.compressor.wgate.weight",
    [PS_V4_T_C_APE] = "attn.compressor.ape", [PS_V4_T_C_NORM] = "attn.compressor.norm.weight",
    [PS_V4_T_I_WQ_B] = "attn.indexer.wq_b.weight", [PS_V4_T_I_WP] = "attn.indexer.weights_proj.weight",
    [PS_V4_T_I_WKV] = "attn.indexer.compressor.wkv.weight", [PS_V4_T_I_WGATE] = "attn.indexer.compressor.wgate.weight",
    [PS_V4_T_I_APE] = "attn.indexer.compressor.ape", [PS_V4_T_I_NORM] = "attn.indexer.compressor.norm.weight",
    [PS_V4_T_GATE_W] = "ffn.gate.weight", [PS_V4_T_GATE_BIAS] = "ffn.gate.bias", [PS_V4_T_TID2EID] = "ffn.gate.tid2eid",
    [PS_V4_T_W1] = "ffn.experts.%d.w1.weight", [PS_V4_T_W3] = "ffn.experts.%d.w3.weight", [PS_V4_T_W2] = "ffn.experts.%d.w2.weight",
    [PS_V4_T_SW1] = "ffn.shared_experts.w1.weight", [PS_V4_T_SW3] = "ffn.shared_experts.w3.weight",
    [PS_V4_T_SW2] = "ffn.shared_experts.w2.weight",
};

static const char *const HF[PS_V4_T_NKINDS] = {
    [PS_V4_T_EMBED] = "model.embed_tokens.weight", [PS_V4_T_HEAD] = "lm_head.weight", [PS_V4_T_NORM] = "model.norm.weight",
    [PS_V4_T_HC_HEAD_FN] = "model.hc_head.hc_fn", [PS_V4_T_HC_HEAD_BASE] = "model.hc_head.hc_base",
    [PS_V4_T_HC_HEAD_SCALE] = "model.hc_head.hc_scale",
    [PS_V4_T_ATTN_NORM] = "input_layernorm.weight", [PS_V4_T_FFN_NORM] = "post_attention_layernorm.weight",
    [PS_V4_T_HC_ATTN_FN] = "attn_hc.fn", [PS_V4_T_HC_ATTN_BASE] = "attn_hc.base", [PS_V4_T_HC_ATTN_SCALE] = "attn_hc.scale",
    [PS_V4_T_HC_FFN_FN] = "ffn_hc.fn", [PS_V4_T_HC_FFN_BASE] = "ffn_hc.base", [PS_V4_T_HC_FFN_SCALE] = "ffn_hc.scale",
    [PS_V4_T_SINK] = "self_attn.sinks", [PS_V4_T_WQ_A] = "self_attn.q_a_proj.weight", [PS_V4_T_Q_NORM] = "self_attn.q_a_norm.weight",
    [PS_V4_T_WQ_B] = "self_attn.q_b_proj.weight", [PS_V4_T_WKV] = "self_attn.kv_proj.weight",
    [PS_V4_T_KV_NORM] = "self_attn.kv_norm.weight", [PS_V4_T_WO_A] = "self_attn.o_a_proj.weight",
    [PS_V4_T_WO_B] = "self_attn.o_b_proj.weight",
    [PS_V4_T_C_WKV] = "self_attn.compressor.kv_proj.weight", [PS_V4_T_C_WGATE] = "self_attn.compressor.gate_proj.weight",
    [PS_V4_T_C_APE] = "self_attn.compressor.position_bias", [PS_V4_T_C_NORM] = "self_attn.compressor.kv_norm.weight",
    [PS_V4_T_I_WQ_B] = "self_attn.compressor.indexer.q_b_proj.weight",
    [PS_V4_T_I_WP] = "self_attn.compressor.indexer.scorer.weights_proj.weight",
    [PS_V4_T_I_WKV] = "self_attn.compressor.indexer.kv_proj.weight",
    [PS_V4_T_I_WGATE] = "self_attn.compressor.indexer.gate_proj.weight",
    [PS_V4_T_I_APE] = "self_attn.compressor.indexer.position_bias",
    [PS_V4_T_I_NORM] = "self_attn.compressor.indexer.kv_norm.weight",
    [PS_V4_T_GATE_W] = "mlp.gate.weight", [PS_V4_T_GATE_BIAS] = "mlp.gate.e_score_correction_bias",
    [PS_V4_T_TID2EID] = "mlp.gate.tid2eid",
    [PS_V4_T_W1] = "mlp.experts.gate_up_proj", [PS_V4_T_W3] = "mlp.experts.gate_up_proj", [PS_V4_T_W2] = "mlp.experts.down_proj",
    [PS_V4_T_SW1] = "mlp.shared_experts.gate_proj.weight", [PS_V4_T_SW3] = "mlp.shared_experts.up_proj.weight",
    [PS_V4_T_SW2] = "mlp.shared_experts.down_proj.weight",
};

static int is_expert(ps_v4_tensor_kind k) { return k == PS_V4_T_W1 || k == PS_V4_T_W3 || k == PS_V4_T_W2; }

void ps_v4_tensor_name(char *buf, size_t n, ps_v4_names names, ps_v4_tensor_kind k, int layer, int expert) {
    const char *s = (names == PS_V4_NAMES_HF ? HF : NATIVE)[k];
    if (k < PS_V4_FIRST_LAYER_KIND) {
        snprintf(buf, n, "%s", s);
        return;
    }
    int w = snprintf(buf, n, "%slayers.%d.", names == PS_V4_NAMES_HF ? "model." : "", layer);
    if (w < 0 || (size_t)w >= n) return;
    if (names == PS_V4_NAMES_NATIVE && is_expert(k)) snprintf(buf + w, n - (size_t)w, s, expert);
    else snprintf(buf + w, n - (size_t)w, "%s", s);
}

/* ---- shapes ---- */

/* Does layer l have tensor kind k? (tolerated: 1 required, 2 optional and ignored, 0 absent) */
static int has_kind(const ps_v4_config *c, int l, ps_v4_tensor_kind k) {
    if (l < 0) {
        if (k == PS_V4_T_HEAD) return c->tie_embeddings ? 2 : 1;
        return 1;
    }
    ps_v4_attn_type at = c->attn_type[l];
    switch (k) {
    case PS_V4_T_C_WKV: case PS_V4_T_C_WGATE: case PS_V4_T_C_APE: case PS_V4_T_C_NORM:
        return at != PS_V4_SLIDING;
    case PS_V4_T_I_WQ_B: case PS_V4_T_I_WP: case PS_V4_T_I_WKV: case PS_V4_T_I_WGATE: case PS_V4_T_I_APE: case PS_V4_T_I_NORM:
        return at == PS_V4_CSA;
    case PS_V4_T_GATE_BIAS: return c->mlp_type[l] == PS_V4_MOE ? 1 : 2;
    case PS_V4_T_TID2EID: return c->mlp_type[l] == PS_V4_HASH_MOE;
    case PS_V4_T_SW1: case PS_V4_T_SW3: case PS_V4_T_SW2: return c->n_shared_experts > 0;
    default: return 1;
    }
}

/* Destination shape of kind k in layer l (experts stacked). */
static int kind_shape(const ps_v4_config *c, int l, ps_v4_tensor_kind k, int64_t *s) {
    int64_t D = c->hidden_size, N = c->hc_mult, H = c->n_heads, Dh = c->head_dim, Q = c->q_lora_rank, G = c->o_groups,
            OR = c->o_lora_rank, E = c->n_routed_experts, I = c->moe_inter, Hi = c->index_n_heads, Di = c->index_head_dim,
            V = c->vocab_size, Is = c->n_shared_experts * c->moe_inter, mix = (2 + N) * N;
    int64_t m = l >= 0 ? c->compress_rate[l] : 0, cc = l >= 0 && c->attn_type[l] == PS_V4_CSA ? 2 : 1;
    s[0] = s[1] = s[2] = 0;
#define S1(a) (s[0] = (a), 1)
#define S2(a, b) (s[0] = (a), s[1] = (b), 2)
#define S3(a, b, d) (s[0] = (a), s[1] = (b), s[2] = (d), 3)
    switch (k) {
    case PS_V4_T_EMBED: case PS_V4_T_HEAD: return S2(V, D);
    case PS_V4_T_NORM: case PS_V4_T_ATTN_NORM: case PS_V4_T_FFN_NORM: return S1(D);
    case PS_V4_T_HC_HEAD_FN: return S2(N, N * D);
    case PS_V4_T_HC_HEAD_BASE: return S1(N);
    case PS_V4_T_HC_HEAD_SCALE: return S1(1);
    case PS_V4_T_HC_ATTN_FN: case PS_V4_T_HC_FFN_FN: return S2(mix, N * D);
    case PS_V4_T_HC_ATTN_BASE: case PS_V4_T_HC_FFN_BASE: return S1(mix);
    case PS_V4_T_HC_ATTN_SCALE: case PS_V4_T_HC_FFN_SCALE: return S1(3);
    case PS_V4_T_SINK: return S1(H);
    case PS_V4_T_WQ_A: return S2(Q, D);
    case PS_V4_T_Q_NORM: return S1(Q);
    case PS_V4_T_WQ_B: return S2(H * Dh, Q);
    case PS_V4_T_WKV: return S2(Dh, D);
    case PS_V4_T_KV_NORM: case PS_V4_T_C_NORM: return S1(Dh);
    case PS_V4_T_WO_A: return S2(G * OR, H * Dh / G);
    case PS_V4_T_WO_B: return S2(D, G * OR);
    case PS_V4_T_C_WKV: case PS_V4_T_C_WGATE: return S2(cc * Dh, D);
    case PS_V4_T_C_APE: return S2(m, cc * Dh);
    case PS_V4_T_I_WQ_B: return S2(Hi * Di, Q);
    case PS_V4_T_I_WP: return S2(Hi, D);
    case PS_V4_T_I_WKV: case PS_V4_T_I_WGATE: return S2(2 * Di, D);
    case PS_V4_T_I_APE: return S2(m, 2 * Di);
    case PS_V4_T_I_NORM: return S1(Di);
    case PS_V4_T_GATE_W: return S2(E, D);
    case PS_V4_T_GATE_BIAS: return S1(E);
    case PS_V4_T_TID2EID: return S2(V, c->experts_per_tok);
    case PS_V4_T_W1: case PS_V4_T_W3: return S3(E, I, D);
    case PS_V4_T_W2: return S3(E, D, I);
    case PS_V4_T_SW1: case PS_V4_T_SW3: return S2(Is, D);
    case PS_V4_T_SW2: return S2(D, Is);
    default: return 0;
    }
#undef S1
#undef S2
#undef S3
}

static int64_t prod(const int64_t *s, int nd) { /* s[0..nd) */
    int64_t n = 1;
    for (int i = 0; i < nd; i++) n *= s[i];
    return n;
}

int64_t ps_v4_layer_params(const ps_v4_config *c, int l) {
    int64_t n = 0, s[3];
    for (int k = PS_V4_FIRST_LAYER_KIND; k < PS_V4_T_NKINDS; k++)
        if (has_kind(c, l, k) == 1 && k != PS_V4_T_TID2EID) {
            int nd = kind_shape(c, l, k, s);
            n += nd == 3 ? s[0] * s[1] * s[2] : nd == 2 ? s[0] * s[1] : s[0];
        }
    return n;
}

int64_t ps_v4_global_params(const ps_v4_config *c) {
    int64_t n = 0, s[3];
    for (int k = 0; k < PS_V4_FIRST_LAYER_KIND; k++)
        if (has_kind(c, -1, k) == 1) {
            int nd = kind_shape(c, -1, k, s);
            n += nd == 3 ? s[0] * s[1] * s[2] : nd == 2 ? s[0] * s[1] : s[0];
        }
    return n;
}

/* ---- element decoders ---- */

float ps_v4_fp8_e4m3_to_f32(uint8_t b) {
    int sign = b >> 7, exp = (b >> 3) & 15, man = b & 7;
    float v;
    if (exp == 15 && man == 7) return NAN;
    if (exp == 0) v = ldexpf((float)man, -9); /* subnormal: man/8 * 2^-6 */
    else v = ldexpf(1.0f + (float)man / 8.0f, exp - 7);
    return sign ? -v : v;
}

float ps_v4_fp4_e2m1_to_f32(uint8_t nib) {
    static const float MAG[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    float v = MAG[nib & 7];
    return nib & 8 ? -v : v;
}

float ps_v4_e8m0_to_f32(uint8_t b) { return b == 0xff ? NAN : ldexpf(1.0f, (int)b - 127); }

/* ---- a stored tensor resolved for decoding ---- */

typedef enum { FMT_FLOAT, FMT_FP8, FMT_FP4, FMT_FP4_PACKED, FMT_INT } fmt_kind;

typedef struct {
    const ps_st_file *f, *sf; /* the tensor's file, its scale's file (quantised only) */
    const ps_st_entry *e, *se;
    char name[256], sname[300];
    fmt_kind fmt;
    int64_t M, R, C;          /* viewed as [M, R, C] */
    int64_t SR, SC, br, bc;   /* scale grid [M, SR, SC] of br x bc blocks */
} qtensor;

static void shape_str(char *buf, size_t n, int ndim, const int64_t *shape) {
    size_t w = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < ndim && w < n; i++) w += (size_t)snprintf(buf + w, n - w, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (w < n) snprintf(buf + w, n - w, "]");
}

static int is_int_dtype(ps_dtype d) {
    return d == PS_DT_I64 || d == PS_DT_I32 || d == PS_DT_I16 || d == PS_DT_I8 || d == PS_DT_U8 || d == PS_DT_U16 ||
           d == PS_DT_U32 || d == PS_DT_U64;
}

/* Find the scale tensor of weight `name` (1 found, 0 none, -1 error). */
static int find_scale(ps_st_set *set, const char *name, qtensor *q, ps_error *err) {
    char cand[4][300];
    int nc = 0;
    size_t n = strlen(name);
    if (n > 7 && !strcmp(name + n - 7, ".weight")) {
        snprintf(cand[nc++], sizeof cand[0], "%.*s.scale", (int)(n - 7), name);
        snprintf(cand[nc++], sizeof cand[0], "%s_scale_inv", name);
    } else {
        snprintf(cand[nc++], sizeof cand[0], "%s.scale", name);
        snprintf(cand[nc++], sizeof cand[0], "%s_scale_inv", name);
    }
    for (int i = 0; i < nc; i++) {
        int r = ps_st_set_find(set, cand[i], &q->sf, &q->se, err);
        if (r) {
            if (r > 0) snprintf(q->sname, sizeof q->sname, "%s", cand[i]);
            return r;
        }
    }
    return 0;
}

/* Resolve `name`, whose logical shape is want[nd] (the last two dims a matrix; 1-D: one row), as float,
 * quantised or integer (want_int) data; check dtype and shapes. */
static int resolve(ps_v4_model *m, const char *name, int nd, const int64_t *want, int want_int, qtensor *q, ps_error *err) {
    memset(q, 0, sizeof *q);
    snprintf(q->name, sizeof q->name, "%s", name);
    int r = ps_st_set_find(&m->files, name, &q->f, &q->e, err);
    if (r < 0) return -1;
    if (r == 0) return ps_fail(err, "%s: tensor \"%s\" is missing (the config in %s needs it)", m->files.path, name, m->cpath);
    const ps_st_entry *e = q->e;
    const char *path = q->f->path;
    char got[128], exp[128];
    q->C = nd ? want[nd - 1] : 1;
    q->R = nd >= 2 ? want[nd - 2] : 1;
    q->M = nd >= 3 ? prod(want, nd - 2) : 1;
    int same = e->ndim == nd;
    for (int i = 0; same && i < nd; i++) same = e->shape[i] == want[i];
    if (want_int) {
        if (!is_int_dtype(e->dtype))
            return ps_fail(err, "%s: tensor \"%s\" has dtype %s (an integer dtype is needed)", path, name, ps_dtype_name(e->dtype));
        q->fmt = FMT_INT;
    } else if (e->dtype == PS_DT_F32 || e->dtype == PS_DT_BF16 || e->dtype == PS_DT_F16) {
        q->fmt = FMT_FLOAT;
    } else if (e->dtype == PS_DT_F8_E4M3) {
        q->fmt = FMT_FP8;
    } else if (e->dtype == PS_DT_F4) {
        q->fmt = FMT_FP4;
    } else if ((e->dtype == PS_DT_I8 || e->dtype == PS_DT_U8) && nd >= 1 && e->ndim == nd && q->C % 2 == 0) {
        /* FP4 packed two per byte: the last dimension halved */
        int ok = 1;
        for (int i = 0; ok && i < nd - 1; i++) ok = e->shape[i] == want[i];
        if (!ok || e->shape[nd - 1] != q->C / 2) {
            int64_t w2[8];
            memcpy(w2, want, (size_t)nd * sizeof *w2);
            w2[nd - 1] /= 2;
            shape_str(got, sizeof got, e->ndim, e->shape);
            shape_str(exp, sizeof exp, nd, w2);
            return ps_fail(err, "%s: tensor \"%s\" (FP4 packed in %s) has shape %s but the config needs %s", path, name,
                           ps_dtype_name(e->dtype), got, exp);
        }
        q->fmt = FMT_FP4_PACKED;
        same = 1;
    } else
        return ps_fail(err, "%s: tensor \"%s\" has dtype %s, which is not supported (F32, BF16, F16, F8_E4M3 or F4 with "
                       "a scale, FP4 packed in I8/U8)", path, name, ps_dtype_name(e->dtype));
    if (!same) {
        shape_str(got, sizeof got, e->ndim, e->shape);
        shape_str(exp, sizeof exp, nd, want);
        return ps_fail(err, "%s: tensor \"%s\" has shape %s but the config needs %s", path, name, got, exp);
    }
    r = find_scale(&m->files, name, q, err);
    if (r < 0) return -1;
    if (q->fmt == FMT_FLOAT || q->fmt == FMT_INT) {
        if (r) return ps_fail(err, "%s: tensor \"%s\" is stored as %s but has a scale tensor \"%s\" (only FP8/FP4 weights are scaled)",
                              path, name, ps_dtype_name(e->dtype), q->sname);
        return 0;
    }
    if (!r)
        return ps_fail(err, "%s: tensor \"%s\" is %s but has no scale tensor (looked for \"%s\"-style .scale / _scale_inv names)",
                       path, name, q->fmt == FMT_FP8 ? "FP8" : "FP4", name);
    const ps_st_entry *se = q->se;
    const char *spath = q->sf->path;
    if (se->dtype != PS_DT_F8_E8M0 && se->dtype != PS_DT_U8 && se->dtype != PS_DT_I8 && se->dtype != PS_DT_F32 &&
        se->dtype != PS_DT_BF16 && se->dtype != PS_DT_F16)
        return ps_fail(err, "%s: scale tensor \"%s\" has dtype %s (F8_E8M0, U8 holding e8m0, or F32/BF16/F16)", spath, q->sname,
                       ps_dtype_name(se->dtype));
    int snd = se->ndim;
    int ok = snd == (nd < 2 ? 2 : nd);
    for (int i = 0; ok && i < nd - 2; i++) ok = se->shape[i] == want[i];
    if (ok) {
        q->SR = se->shape[snd - 2];
        q->SC = se->shape[snd - 1];
        ok = q->SR >= 1 && q->SC >= 1 && q->SR <= q->R && q->SC <= q->C;
    }
    if (ok) {
        /* the format's block (FP8: 128 x 128; FP4: 1 x 32) when the grid fits it, else the block the
         * grid implies (exact when the dimensions are multiples of it) */
        int64_t br = q->fmt == FMT_FP8 ? 128 : 1, bc = q->fmt == FMT_FP8 ? 128 : 32;
        q->br = (q->R + br - 1) / br == q->SR ? br : (q->R + q->SR - 1) / q->SR;
        q->bc = (q->C + bc - 1) / bc == q->SC ? bc : (q->C + q->SC - 1) / q->SC;
        ok = (q->R + q->br - 1) / q->br == q->SR && (q->C + q->bc - 1) / q->bc == q->SC;
    }
    if (!ok) {
        shape_str(got, sizeof got, se->ndim, se->shape);
        shape_str(exp, sizeof exp, nd, want);
        return ps_fail(err, "%s: scale tensor \"%s\" has shape %s, which is no block grid of its weight's shape %s", spath,
                       q->sname, got, exp);
    }
    return 0;
}

static float scale_at(const qtensor *q, int64_t idx) {
    const uint8_t *p = q->sf->data + q->se->begin;
    switch (q->se->dtype) {
    case PS_DT_F32: {
        float v;
        memcpy(&v, p + 4 * idx, 4);
        return v;
    }
    case PS_DT_BF16: return ps_bf16_to_f32((uint16_t)(p[2 * idx] | (p[2 * idx + 1] << 8)));
    case PS_DT_F16: return ps_f16_to_f32((uint16_t)(p[2 * idx] | (p[2 * idx + 1] << 8)));
    default: return ps_v4_e8m0_to_f32(p[idx]); /* F8_E8M0, U8, I8: e8m0 bits */
    }
}

/* Rows [r0, r0 + nr) of matrix `mat` into dst[nr, C]; non-finite results are errors. */
static int decode_rows(const qtensor *q, int64_t mat, int64_t r0, int64_t nr, float *dst, ps_error *err) {
    const uint8_t *p = q->f->data + q->e->begin;
    int64_t C = q->C, base = (mat * q->R + r0) * C;
    ps_dtype dt = q->e->dtype;
    int64_t bad = -1;
#pragma omp parallel for schedule(static) if (nr * C > 65536)
    for (int64_t r = 0; r < nr; r++) {
        float *o = dst + r * C;
        int64_t row = r0 + r, off = base + r * C;
        if (q->fmt == FMT_FLOAT) {
            if (dt == PS_DT_F32) memcpy(o, p + 4 * off, (size_t)C * 4);
            else
                for (int64_t c = 0; c < C; c++) {
                    uint16_t h = (uint16_t)(p[2 * (off + c)] | (p[2 * (off + c) + 1] << 8));
                    o[c] = dt == PS_DT_BF16 ? ps_bf16_to_f32(h) : ps_f16_to_f32(h);
                }
        } else {
            int64_t srow = (mat * q->SR + row / q->br) * q->SC;
            for (int64_t c = 0; c < C; c++) {
                int64_t i = off + c;
                float v = q->fmt == FMT_FP8 ? ps_v4_fp8_e4m3_to_f32(p[i]) : ps_v4_fp4_e2m1_to_f32((uint8_t)(p[i / 2] >> (4 * (i % 2))));
                o[c] = v * scale_at(q, srow + c / q->bc);
            }
        }
        for (int64_t c = 0; c < C; c++)
            if (!isfinite(o[c])) {
#pragma omp critical
                if (bad < 0 || off + c < bad) bad = off + c;
                break;
            }
    }
    if (bad >= 0) {
        float v = dst[(bad - base)];
        return ps_fail(err, "%s: tensor \"%s\" holds a non-finite value (%g at flat index %lld%s%s%s)", q->f->path, q->name,
                       (double)v, (long long)bad, q->fmt == FMT_FP8 || q->fmt == FMT_FP4 || q->fmt == FMT_FP4_PACKED ? ", scale \"" : "",
                       q->fmt == FMT_FLOAT ? "" : q->sname, q->fmt == FMT_FLOAT ? "" : "\"");
    }
    return 0;
}

/* Integer tensor into int32 with every value in [0, hi). */
static int decode_ints(const qtensor *q, int32_t *dst, int64_t n, int64_t hi, ps_error *err) {
    const uint8_t *p = q->f->data + q->e->begin;
    int sz = ps_dtype_size(q->e->dtype);
    int sgn = q->e->dtype == PS_DT_I8 || q->e->dtype == PS_DT_I16 || q->e->dtype == PS_DT_I32 || q->e->dtype == PS_DT_I64;
    for (int64_t i = 0; i < n; i++) {
        uint64_t u = 0;
        for (int b = sz - 1; b >= 0; b--) u = (u << 8) | p[i * sz + b];
        int64_t v = (int64_t)u;
        if (sgn && sz < 8 && (u >> (8 * sz - 1)) & 1) v = (int64_t)(u | (~(uint64_t)0 << (8 * sz)));
        if (!sgn && sz == 8 && u > (uint64_t)INT64_MAX) v = -1;
        if (v < 0 || v >= hi)
            return ps_fail(err, "%s: tensor \"%s\" holds %lld at flat index %lld, outside [0, %lld)", q->f->path, q->name,
                           (long long)v, (long long)i, (long long)hi);
        dst[i] = (int32_t)v;
    }
    return 0;
}

static void release(const qtensor *q) {
    ps_st_release(q->f, q->e);
    if (q->se) ps_st_release(q->sf, q->se);
}

/* ---- the pieces a destination tensor is read from ---- */

typedef struct {
    char name[256];
    int nd;
    int64_t shape[3];  /* logical shape of the stored tensor */
    int64_t mat, r0, nr; /* the rows taken */
    int64_t dst;       /* floats into the destination */
} piece;

/* Pieces of kind k: one per expert for the routed experts (a native tensor, or a slice of the stacked
 * HF one), else one. */
static int64_t n_pieces(const ps_v4_model *m, ps_v4_tensor_kind k) { return is_expert(k) ? m->cfg.n_routed_experts : 1; }

static void get_piece(const ps_v4_model *m, int l, ps_v4_tensor_kind k, int64_t i, piece *pc) {
    const ps_v4_config *c = &m->cfg;
    int64_t D = c->hidden_size, I = c->moe_inter, E = c->n_routed_experts;
    memset(pc, 0, sizeof *pc);
    ps_v4_tensor_name(pc->name, sizeof pc->name, m->names, k, l, (int)i);
    if (!is_expert(k)) {
        pc->nd = kind_shape(c, l, k, pc->shape);
        pc->nr = pc->nd >= 2 ? pc->shape[pc->nd - 2] : 1;
        return;
    }
    int64_t rows = k == PS_V4_T_W2 ? D : I, cols = k == PS_V4_T_W2 ? I : D;
    pc->dst = i * rows * cols;
    pc->nr = rows;
    if (m->names == PS_V4_NAMES_NATIVE) {
        pc->nd = 2;
        pc->shape[0] = rows;
        pc->shape[1] = cols;
    } else {
        pc->nd = 3;
        pc->shape[0] = E;
        pc->shape[1] = k == PS_V4_T_W2 ? D : 2 * I;
        pc->shape[2] = cols;
        pc->mat = i;
        pc->r0 = k == PS_V4_T_W3 ? I : 0;
    }
}

/* ---- classification of the names a checkpoint lists ---- */

/* -1: not ours; else kind, with *layer (-1 global) and *expert. */
static int classify(const ps_v4_model *m, const char *name, int *layer, int *expert) {
    const ps_v4_config *c = &m->cfg;
    const char *const *tab = m->names == PS_V4_NAMES_HF ? HF : NATIVE;
    *layer = -1;
    *expert = -1;
    for (int k = 0; k < PS_V4_FIRST_LAYER_KIND; k++)
        if (!strcmp(name, tab[k])) return k;
    const char *pre = m->names == PS_V4_NAMES_HF ? "model.layers." : "layers.";
    size_t pl = strlen(pre);
    if (strncmp(name, pre, pl) || name[pl] < '0' || name[pl] > '9') return -1;
    char *end;
    long l = strtol(name + pl, &end, 10);
    if (*end != '.' || l < 0 || l >= c->n_layers || (name[pl] == '0' && end != name + pl + 1)) return -1;
    const char *suf = end + 1;
    for (int k = PS_V4_FIRST_LAYER_KIND; k < PS_V4_T_NKINDS; k++) {
        if (is_expert(k) && m->names == PS_V4_NAMES_NATIVE) {
            const char *w = k == PS_V4_T_W1 ? "w1" : k == PS_V4_T_W3 ? "w3" : "w2";
            if (strncmp(suf, "ffn.experts.", 12) || suf[12] < '0' || suf[12] > '9') continue;
            char *e2;
            long e = strtol(suf + 12, &e2, 10);
            char tail[32];
            snprintf(tail, sizeof tail, ".%s.weight", w);
            if (strcmp(e2, tail) || e < 0 || e >= c->n_routed_experts || (suf[12] == '0' && e2 != suf + 13)) continue;
            *layer = (int)l;
            *expert = (int)e;
            return k;
        }
        if (!strcmp(suf, tab[k])) {
            *layer = (int)l;
            return k == PS_V4_T_W3 ? PS_V4_T_W1 : k; /* HF: gate_up_proj holds both */
        }
    }
    return -1;
}

static int is_mtp(const char *name) { return !strncmp(name, "mtp.", 4) || strstr(name, ".mtp.") != NULL; }

/* Is `name` a scale companion of a name that classifies? */
static int classify_scale(const ps_v4_model *m, const char *name, int *layer, int *expert) {
    char base[300];
    size_t n = strlen(name);
    if (n >= sizeof base) return -1;
    if (n > 6 && !strcmp(name + n - 6, ".scale")) {
        snprintf(base, sizeof base, "%.*s.weight", (int)(n - 6), name);
        int k = classify(m, base, layer, expert);
        if (k >= 0) return k;
        snprintf(base, sizeof base, "%.*s", (int)(n - 6), name);
        return classify(m, base, layer, expert);
    }
    if (n > 10 && !strcmp(name + n - 10, "_scale_inv")) {
        snprintf(base, sizeof base, "%.*s", (int)(n - 10), name);
        return classify(m, base, layer, expert);
    }
    return -1;
}

/* ---- open ---- */

static void storage_add(ps_v4_storage *s, const ps_st_entry *e, int is_scale) {
    int cls = is_scale ? 4
              : (e->dtype == PS_DT_F32 || e->dtype == PS_DT_BF16 || e->dtype == PS_DT_F16) ? 0
              : e->dtype == PS_DT_F8_E4M3 ? 1
              : e->dtype == PS_DT_F4 ? 2
              : (e->dtype == PS_DT_I8 || e->dtype == PS_DT_U8) ? 2
              : is_int_dtype(e->dtype) ? 3 : 5;
    s->n_tensors[cls]++;
    s->bytes[cls] += (int64_t)(e->end - e->begin);
}

static int build_table(ps_v4_model *m, ps_error *err) {
    const ps_v4_config *c = &m->cfg;
    int cap = PS_V4_T_NKINDS * (int)(c->n_layers + 1);
    m->table = calloc((size_t)cap, sizeof *m->table);
    m->layer_floats = calloc((size_t)c->n_layers, sizeof *m->layer_floats);
    m->layer_buf = calloc((size_t)c->n_layers, sizeof *m->layer_buf);
    m->tid2eid = calloc((size_t)c->n_layers, sizeof *m->tid2eid);
    m->layer_refs = calloc((size_t)c->n_layers, sizeof *m->layer_refs);
    if (!m->table || !m->layer_floats || !m->layer_buf || !m->tid2eid || !m->layer_refs)
        return ps_fail(err, "%s: out of memory for the tensor table", m->cpath);
    for (int l = -1; l < c->n_layers; l++)
        for (int k = l < 0 ? 0 : PS_V4_FIRST_LAYER_KIND; k < (l < 0 ? PS_V4_FIRST_LAYER_KIND : PS_V4_T_NKINDS); k++) {
            if (has_kind(c, l, k) != 1) continue;
            ps_v4_tensor *t = &m->table[m->n_tensors++];
            t->kind = k;
            t->layer = l;
            t->ndim = kind_shape(c, l, k, t->shape);
            t->numel = prod(t->shape, t->ndim);
            if (k == PS_V4_T_TID2EID) continue; /* host int32 array */
            int64_t *acc = l < 0 ? &m->global_floats : &m->layer_floats[l];
            t->offset = *acc;
            *acc += t->numel;
            m->n_params += t->numel;
        }
    return 0;
}

int ps_v4_model_open(ps_v4_model *m, const char *dir, ps_error *err) {
    memset(m, 0, sizeof *m);
    if ((size_t)snprintf(m->dir, sizeof m->dir, "%s", dir) >= sizeof m->dir ||
        ps_path_join(m->cpath, sizeof m->cpath, dir, "config.json", err))
        return ps_fail(err, "%s: path too long", dir);
    if (ps_v4_config_load(m->cpath, &m->cfg, err)) return -1;
    const ps_v4_config *c = &m->cfg;
    if (build_table(m, err) || ps_st_set_open(&m->files, dir, err)) {
        ps_v4_model_free(m);
        return -1;
    }
    int rc = -1;
    char b1[200];
    /* which scheme: the embedding's name decides */
    int have_nat = 0, have_hf = 0;
    for (int i = 0; i < ps_st_set_n_names(&m->files); i++) {
        const char *nm = ps_st_set_name(&m->files, i);
        have_nat |= !strcmp(nm, NATIVE[PS_V4_T_EMBED]);
        have_hf |= !strcmp(nm, HF[PS_V4_T_EMBED]);
    }
    if (have_nat == have_hf) {
        ps_fail(err, "%s: %s \"%s\" (DeepSeek's names) and \"%s\" (transformers' names)", m->files.path,
                have_nat ? "holds both" : "holds neither", NATIVE[PS_V4_T_EMBED], HF[PS_V4_T_EMBED]);
        goto done;
    }
    m->names = have_nat ? PS_V4_NAMES_NATIVE : PS_V4_NAMES_HF;
    /* every listed tensor belongs to the model (or is a scale of one, or an MTP tensor, ignored) */
    int64_t *count = calloc((size_t)(c->n_layers + 1) * PS_V4_T_NKINDS, sizeof *count);
    if (!count) {
        ps_fail(err, "%s: out of memory", m->files.path);
        goto done;
    }
    for (int i = 0; i < ps_st_set_n_names(&m->files); i++) {
        const char *nm = ps_st_set_name(&m->files, i);
        int layer, expert, k = classify(m, nm, &layer, &expert), scale = 0;
        if (k < 0 && is_mtp(nm)) continue;
        if (k < 0) {
            k = classify_scale(m, nm, &layer, &expert);
            scale = 1;
        }
        if (k < 0) {
            ps_fail(err, "%s: unexpected tensor \"%s\" (not part of the DeepSeek-V4 model described by %s, %s names)",
                    m->files.path, ps_st_printable(nm, b1, sizeof b1), m->cpath,
                    m->names == PS_V4_NAMES_HF ? "transformers'" : "DeepSeek's");
            free(count);
            goto done;
        }
        if (!has_kind(c, layer, k)) {
            ps_fail(err, "%s: unexpected tensor \"%s\" (layer %d is %s with %s routing in %s)", m->files.path,
                    ps_st_printable(nm, b1, sizeof b1), layer, ps_v4_attn_type_name(c->attn_type[layer]),
                    c->mlp_type[layer] == PS_V4_HASH_MOE ? "hash" : "top-k", m->cpath);
            free(count);
            goto done;
        }
        if (!scale) count[(size_t)(layer + 1) * PS_V4_T_NKINDS + (size_t)k]++;
    }
    /* every tensor the config needs is listed */
    for (int t = 0; t < m->n_tensors; t++) {
        const ps_v4_tensor *tt = &m->table[t];
        int64_t need = is_expert(tt->kind) ? (m->names == PS_V4_NAMES_NATIVE ? c->n_routed_experts : 1) : 1;
        ps_v4_tensor_kind ck = m->names == PS_V4_NAMES_HF && tt->kind == PS_V4_T_W3 ? PS_V4_T_W1 : tt->kind;
        if (count[(size_t)(tt->layer + 1) * PS_V4_T_NKINDS + (size_t)ck] >= need) continue;
        char nm[256];
        for (int64_t x = 0; x < need; x++) {
            ps_v4_tensor_name(nm, sizeof nm, m->names, tt->kind, tt->layer, (int)x);
            int listed = m->files.sharded ? ps_st_index_find(&m->files.ix, nm) >= 0 : ps_st_find(&m->files.single, nm) != NULL;
            if (!listed) break;
        }
        ps_fail(err, "%s: tensor \"%s\" is missing%s (the config in %s needs it)", m->files.path, nm,
                m->files.sharded ? " from weight_map" : "", m->cpath);
        free(count);
        goto done;
    }
    free(count);
    /* headers: shapes, dtypes, scales (shards opened here; no data read) */
    for (int t = 0; t < m->n_tensors; t++) {
        const ps_v4_tensor *tt = &m->table[t];
        int64_t np = n_pieces(m, tt->kind);
        for (int64_t i = 0; i < np; i++) {
            piece pc;
            qtensor q;
            get_piece(m, tt->layer, tt->kind, i, &pc);
            if (resolve(m, pc.name, pc.nd, pc.shape, tt->kind == PS_V4_T_TID2EID, &q, err)) goto done;
            if (m->names == PS_V4_NAMES_HF && tt->kind == PS_V4_T_W3) continue; /* counted with W1 */
            if (m->names == PS_V4_NAMES_HF && is_expert(tt->kind) && i > 0) continue;
            storage_add(&m->storage, q.e, 0);
            if (q.se) storage_add(&m->storage, q.se, 1);
        }
    }
    rc = 0;
done:
    if (rc) ps_v4_model_free(m);
    return rc;
}

/* ---- weights ---- */

static int load_kind(ps_v4_model *m, const ps_v4_tensor *t, float *base, ps_error *err) {
    int64_t np = n_pieces(m, t->kind);
    qtensor q;
    for (int64_t i = 0; i < np; i++) {
        piece pc;
        get_piece(m, t->layer, t->kind, i, &pc);
        if (resolve(m, pc.name, pc.nd, pc.shape, t->kind == PS_V4_T_TID2EID, &q, err)) return -1;
        if (t->kind == PS_V4_T_TID2EID) {
            int32_t *dst = malloc((size_t)t->numel * sizeof *dst);
            if (!dst) return ps_fail(err, "%s: out of memory for tensor \"%s\"", q.f->path, q.name);
            if (decode_ints(&q, dst, t->numel, m->cfg.n_routed_experts, err)) {
                free(dst);
                return -1;
            }
            free(m->tid2eid[t->layer]);
            m->tid2eid[t->layer] = dst;
        } else if (decode_rows(&q, pc.mat, pc.r0, pc.nr, base + t->offset + pc.dst, err))
            return -1;
        if (m->names == PS_V4_NAMES_NATIVE || i == np - 1) release(&q);
    }
    return 0;
}

static int load_layer(ps_v4_model *m, int l, ps_error *err) {
    char what[64];
    snprintf(what, sizeof what, "layer %d weights", l);
    float *buf = ps_buf_alloc(m->ctx, m->layer_floats[l] * (int64_t)sizeof(float), what, err);
    if (!buf) return -1;
    for (int t = 0; t < m->n_tensors; t++)
        if (m->table[t].layer == l && load_kind(m, &m->table[t], buf, err)) {
            ps_buf_free(m->ctx, buf, m->layer_floats[l] * (int64_t)sizeof(float));
            return -1;
        }
    m->layer_buf[l] = buf;
    return 0;
}

static void unload_layer(ps_v4_model *m, int l) {
    ps_buf_free(m->ctx, m->layer_buf[l], m->layer_floats[l] * (int64_t)sizeof(float));
    m->layer_buf[l] = NULL;
    free(m->tid2eid[l]);
    m->tid2eid[l] = NULL;
}

int ps_v4_model_load_weights(ps_v4_model *m, int lazy, ps_error *err) {
    m->lazy = lazy;
    if (!m->ctx) {
        if (ps_ctx_create(&m->ctx, "cpu", err)) return -1;
        m->owns_ctx = 1;
    }
    int64_t need = m->global_floats;
    if (!lazy)
        for (int l = 0; l < m->cfg.n_layers; l++) need += m->layer_floats[l];
    uint64_t avail = ps_mem_available();
    if (avail && (double)need * 4.0 > (double)avail)
        return ps_fail(err, "%s: the weights need %.2f GiB as float32 but only %.2f GiB of memory is available%s", m->dir,
                       (double)need * 4.0 / 1073741824.0, (double)avail / 1073741824.0,
                       lazy ? "" : " (layers loaded one at a time need less)");
    m->global = ps_buf_alloc(m->ctx, m->global_floats * (int64_t)sizeof(float), "global weights", err);
    if (!m->global) return -1;
    for (int t = 0; t < m->n_tensors; t++)
        if (m->table[t].layer < 0 && load_kind(m, &m->table[t], m->global, err)) return -1;
    if (!lazy)
        for (int l = 0; l < m->cfg.n_layers; l++)
            if (load_layer(m, l, err)) return -1;
    return 0;
}

int ps_v4_model_load(ps_v4_model *m, const char *dir, int lazy, ps_error *err) {
    if (ps_v4_model_open(m, dir, err)) return -1;
    if (ps_v4_model_load_weights(m, lazy, err)) {
        ps_v4_model_free(m);
        return -1;
    }
    return 0;
}

/* One buffer of n floats copied from the model's (host) context to ctx; NULL with err set. */
static float *copy_to(ps_ctx *ctx, const float *src, int64_t n, const char *what, ps_error *err) {
    float *dst = ps_buf_alloc(ctx, n * (int64_t)sizeof(float), what, err);
    if (dst && n > 0 && ps_buf_from_host(ctx, dst, src, n * (int64_t)sizeof(float), err)) {
        ps_buf_free(ctx, dst, n * (int64_t)sizeof(float));
        return NULL;
    }
    return dst;
}

int ps_v4_model_to_backend(ps_v4_model *m, const char *backend, ps_error *err) {
    if (!backend || !strcmp(backend, ps_ctx_backend_name(m->ctx))) return 0;
    if (m->lazy)
        return ps_fail(err, "%s: layers loaded one at a time (--lazy) stay on the cpu backend; %s needs every layer in memory",
                       m->dir, backend);
    if (!ps_ctx_host_visible(m->ctx))
        return ps_fail(err, "%s: moving a DeepSeek-V4 model between two device backends is not supported (%s to %s)", m->dir,
                       ps_ctx_backend_name(m->ctx), backend);
    ps_ctx *ctx;
    if (ps_ctx_create(&ctx, backend, err)) return -1;
    int L = (int)m->cfg.n_layers;
    float **lb = calloc((size_t)(L > 0 ? L : 1), sizeof *lb);
    float *g = lb ? copy_to(ctx, m->global, m->global_floats, "global weights", err) : NULL;
    if (!lb) ps_fail(err, "%s: out of memory", m->dir);
    int ok = g != NULL;
    for (int l = 0; ok && l < L; l++) {
        char what[64];
        snprintf(what, sizeof what, "layer %d weights", l);
        ok = (lb[l] = copy_to(ctx, m->layer_buf[l], m->layer_floats[l], what, err)) != NULL;
    }
    if (!ok) { /* the model stays on its context, usable */
        for (int l = 0; lb && l < L; l++)
            if (lb[l]) ps_buf_free(ctx, lb[l], m->layer_floats[l] * (int64_t)sizeof(float));
        if (g) ps_buf_free(ctx, g, m->global_floats * (int64_t)sizeof(float));
        free(lb);
        ps_ctx_free(ctx);
        return -1;
    }
    for (int l = 0; l < L; l++) {
        ps_buf_free(m->ctx, m->layer_buf[l], m->layer_floats[l] * (int64_t)sizeof(float));
        m->layer_buf[l] = lb[l];
    }
    ps_buf_free(m->ctx, m->global, m->global_floats * (int64_t)sizeof(float));
    m->global = g;
    free(lb);
    if (m->owns_ctx) ps_ctx_free(m->ctx);
    m->ctx = ctx;
    m->owns_ctx = 1;
    return 0;
}

void ps_v4_model_free(ps_v4_model *m) {
    if (!m) return;
    for (int l = 0; m->layer_buf && l < m->cfg.n_layers; l++)
        if (m->layer_buf[l] || (m->tid2eid && m->tid2eid[l])) unload_layer(m, l);
    if (m->ctx) ps_buf_free(m->ctx, m->global, m->global_floats * (int64_t)sizeof(float));
    if (m->owns_ctx) ps_ctx_free(m->ctx);
    ps_st_set_close(&m->files);
    free(m->table);
    free(m->layer_floats);
    free(m->layer_buf);
    free(m->tid2eid);
    free(m->layer_refs);
    memset(m, 0, sizeof *m);
}

float *ps_v4_global(const ps_v4_model *m, ps_v4_tensor_kind k) {
    if (k == PS_V4_T_HEAD && m->cfg.tie_embeddings) k = PS_V4_T_EMBED;
    for (int t = 0; t < m->n_tensors; t++)
        if (m->table[t].layer < 0 && m->table[t].kind == k) return m->global + m->table[t].offset;
    return NULL;
}

int ps_v4_layer_acquire(ps_v4_model *m, int l, ps_v4_layer *w, ps_error *err) {
    memset(w, 0, sizeof *w);
    if (l < 0 || l >= m->cfg.n_layers) return ps_fail(err, "layer %d: the model has %lld layers", l, (long long)m->cfg.n_layers);
    if (!m->global) return ps_fail(err, "%s: the weights are not loaded", m->dir);
    if (!m->layer_buf[l] && load_layer(m, l, err)) return -1;
    m->layer_refs[l]++;
    float *b = m->layer_buf[l];
    float **slot[PS_V4_T_NKINDS] = {
        [PS_V4_T_ATTN_NORM] = &w->attn_norm, [PS_V4_T_FFN_NORM] = &w->ffn_norm,
        [PS_V4_T_HC_ATTN_FN] = &w->hc_attn_fn, [PS_V4_T_HC_ATTN_BASE] = &w->hc_attn_base,
        [PS_V4_T_HC_ATTN_SCALE] = &w->hc_attn_scale, [PS_V4_T_HC_FFN_FN] = &w->hc_ffn_fn,
        [PS_V4_T_HC_FFN_BASE] = &w->hc_ffn_base, [PS_V4_T_HC_FFN_SCALE] = &w->hc_ffn_scale,
        [PS_V4_T_SINK] = &w->sink, [PS_V4_T_WQ_A] = &w->wq_a, [PS_V4_T_Q_NORM] = &w->q_norm, [PS_V4_T_WQ_B] = &w->wq_b,
        [PS_V4_T_WKV] = &w->wkv, [PS_V4_T_KV_NORM] = &w->kv_norm, [PS_V4_T_WO_A] = &w->wo_a, [PS_V4_T_WO_B] = &w->wo_b,
        [PS_V4_T_C_WKV] = &w->c_wkv, [PS_V4_T_C_WGATE] = &w->c_wgate, [PS_V4_T_C_APE] = &w->c_ape, [PS_V4_T_C_NORM] = &w->c_norm,
        [PS_V4_T_I_WQ_B] = &w->i_wq_b, [PS_V4_T_I_WP] = &w->i_wp, [PS_V4_T_I_WKV] = &w->i_wkv, [PS_V4_T_I_WGATE] = &w->i_wgate,
        [PS_V4_T_I_APE] = &w->i_ape, [PS_V4_T_I_NORM] = &w->i_norm, [PS_V4_T_GATE_W] = &w->gate_w,
        [PS_V4_T_GATE_BIAS] = &w->gate_bias, [PS_V4_T_W1] = &w->w1, [PS_V4_T_W3] = &w->w3, [PS_V4_T_W2] = &w->w2,
        [PS_V4_T_SW1] = &w->sw1, [PS_V4_T_SW3] = &w->sw3, [PS_V4_T_SW2] = &w->sw2,
    };
    for (int t = 0; t < m->n_tensors; t++)
        if (m->table[t].layer == l && slot[m->table[t].kind]) *slot[m->table[t].kind] = b + m->table[t].offset;
    w->tid2eid = m->tid2eid[l];
    return 0;
}

void ps_v4_layer_release(ps_v4_model *m, int l) {
    if (l < 0 || l >= m->cfg.n_layers || m->layer_refs[l] <= 0) return;
    if (--m->layer_refs[l] == 0 && m->lazy) unload_layer(m, l);
}
