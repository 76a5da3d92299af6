#include "ref_model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static void rms(double *o, const double *x, const float *w, int n, double eps) {
    double s = 0;
    for (int i = 0; i < n; i++) s += x[i] * x[i];
    double r = 1.0 / sqrt(s / n + eps);
    for (int i = 0; i < n; i++) o[i] = x[i] * r * (w ? w[i] : 1.0);
}

static void rope(double *x, int hd, double p, double theta) {
    for (int i = 0; i < hd / 2; i++) {
        double ang = p * pow(theta, -2.0 * i / hd), c = cos(ang), s = sin(ang);
        double a = x[i], b = x[i + hd / 2];
        x[i] = a * c - b * s;
        x[i + hd / 2] = b * c + a * s;
    }
}

/* y[rows] = W[rows, cols] x[cols] */
static void mv(double *y, const float *W, const double *x, int rows, int cols) {
    for (int r = 0; r < rows; r++) {
        double s = 0;
        for (int c = 0; c < cols; c++) s += (double)W[(int64_t)r * cols + c] * x[c];
        y[r] = s;
    }
}

/* The attention kind channel (DeepSeek-V4's compressor, docs/training.md) of one layer, from the normed input
 * a [T, d]: h += o_proj(attention). Written from the formulas: raw K=V entries of the sliding window and
 * the complete compressed entries (per-channel softmax over the slots of z + ape, CSA's two series), a
 * softmax with the head's sink, and the output rotated back by its position. */
static void ref_v4_attention(const ps_model *m, const ps_layer_params *w, const double *a, int T, double *h) {
    const ps_config *c = &m->cfg;
    int d = (int)c->d_model, hd = (int)c->head_dim, nh = (int)c->n_heads, mr = (int)c->rate, LW = (int)c->local_window;
    int csa = c->v4_mode == PS_V4_MODE_CSA, cs = csa ? 2 : 1, S = csa ? 2 * mr : mr, nW = T / mr;
    double eps = c->rms_eps;
    double *q = calloc((size_t)T * nh * hd, 8), *k = calloc((size_t)T * hd, 8), *ckv = calloc((size_t)T * cs * hd, 8);
    double *cz = calloc((size_t)T * cs * hd, 8), *ent = calloc((size_t)(nW + 1) * hd, 8), *z = calloc((size_t)nh * hd, 8);
    double *o = calloc((size_t)d, 8), *sc = calloc((size_t)(T + nW + 2), 8);
    for (int t = 0; t < T; t++) {
        mv(q + t * nh * hd, w->wq, a + t * d, nh * hd, d);
        mv(k + t * hd, w->wk, a + t * d, hd, d);
        mv(ckv + t * cs * hd, w->c_wkv, a + t * d, cs * hd, d);
        mv(cz + t * cs * hd, w->c_wgate, a + t * d, cs * hd, d);
        for (int n = 0; n < nh; n++) {
            if (c->qk_norm) rms(q + (t * nh + n) * hd, q + (t * nh + n) * hd, w->qnorm, hd, eps);
            if (c->rope) rope(q + (t * nh + n) * hd, hd, t, c->rope_theta);
        }
        if (c->qk_norm) rms(k + t * hd, k + t * hd, w->knorm, hd, eps);
        if (c->rope) rope(k + t * hd, hd, t, c->rope_theta);
    }
    for (int wi = 0; wi < nW; wi++) {
        double *e = ent + wi * hd;
        for (int i = 0; i < hd; i++) {
            double zl[8192], vl[8192], mx = -1e300, sum = 0;
            int live[8192];
            for (int s2 = 0; s2 < S; s2++) {
                int tok, ch, sl = s2 % mr;
                if (!csa) tok = wi * mr + s2, ch = 0;
                else if (s2 < mr) tok = wi == 0 ? -1 : (wi - 1) * mr + s2, ch = 0;
                else tok = wi * mr + s2 - mr, ch = hd;
                live[s2] = tok >= 0;
                if (!live[s2]) continue;
                zl[s2] = cz[tok * cs * hd + ch + i] + w->c_ape[sl * cs * hd + ch + i];
                vl[s2] = ckv[tok * cs * hd + ch + i];
                if (zl[s2] > mx) mx = zl[s2];
            }
            for (int s2 = 0; s2 < S; s2++)
                if (live[s2]) sum += exp(zl[s2] - mx);
            e[i] = 0;
            for (int s2 = 0; s2 < S; s2++)
                if (live[s2]) e[i] += exp(zl[s2] - mx) / sum * vl[s2];
        }
        rms(e, e, w->c_norm, hd, eps);
        if (c->rope) rope(e, hd, (double)wi * mr, c->rope_theta);
    }
    for (int t = 0; t < T; t++) {
        int lo = t - LW + 1 > 0 ? t - LW + 1 : 0, nv = (t + 1) / mr < nW ? (t + 1) / mr : nW;
        for (int n = 0; n < nh; n++) {
            const double *qt = q + (t * nh + n) * hd;
            int ns = 0;
            double mx = w->sinks[n], sum = 0;
            for (int j = lo; j <= t; j++) {
                double s2 = 0;
                for (int e = 0; e < hd; e++) s2 += qt[e] * k[j * hd + e];
                sc[ns++] = s2 / sqrt(hd);
            }
            for (int wi = 0; wi < nv; wi++) {
                double s2 = 0;
                for (int e = 0; e < hd; e++) s2 += qt[e] * ent[wi * hd + e];
                sc[ns++] = s2 / sqrt(hd);
            }
            for (int i = 0; i < ns; i++) mx = sc[i] > mx ? sc[i] : mx;
            sum = exp(w->sinks[n] - mx);
            for (int i = 0; i < ns; i++) sum += (sc[i] = exp(sc[i] - mx));
            double *zn = z + n * hd;
            memset(zn, 0, (size_t)hd * 8);
            int i = 0;
            for (int j = lo; j <= t; j++, i++)
                for (int e = 0; e < hd; e++) zn[e] += sc[i] / sum * k[j * hd + e];
            for (int wi = 0; wi < nv; wi++, i++)
                for (int e = 0; e < hd; e++) zn[e] += sc[i] / sum * ent[wi * hd + e];
            if (c->rope) rope(zn, hd, -(double)t, c->rope_theta);
        }
        mv(o, w->wo, z, d, nh * hd);
        for (int i = 0; i < d; i++) h[t * d + i] += o[i];
    }
    free(q); free(k); free(ckv); free(cz); free(ent); free(z); free(o); free(sc);
}

void ref_forward(const ps_model *m, const int32_t *tok, int T, double *logits) { ref_forward_grid(m, tok, T, 0, logits); }

void ref_forward_user(const ps_model *m, const int32_t *tok, int T, const void *shift, double *logits) {
    ref_forward_grid(m, tok, T, shift ? *(const int *)shift : 0, logits);
}

/* The select attention's choice for one layer (attention.kind "select", docs/models.md), written from the
 * definitions in double over the layer's q [T, nh, hd] and k [T, nkv, hd]: keep[(t * nkv + g) * nb + b] = 1 when
 * query t with KV head g attends block b. Compressed keys are window means (kernel W, stride S; level 2: 4W, 4S);
 * stage 1 sums exp(q·k1/√hd − log Σ exp(q·k2/√hd)) over the group's heads; block b scores the largest over level-1
 * keys m·b − 1 .. m·b + m − 1 (m = block / S); the initial and local blocks are forced; the top topk + local_blocks
 * are kept (the first of equal scores), then those after the query's block dropped. */
static void ref_select(const ps_config *c, const double *q, const double *k, int T, char *keep, double *margin) {
    int nh = (int)c->n_heads, nkv = (int)c->n_kv_heads, hd = (int)c->head_dim, W = (int)c->window, S = (int)c->stride;
    int Bk = (int)c->block, mm = Bk / S, nb = (T + Bk - 1) / Bk, ns = (int)(c->topk + c->local_blocks);
    double *sc = malloc((size_t)nb * 8), *P = malloc((size_t)(T / S + 2) * 8), *ka = malloc((size_t)hd * 8);
    memset(keep, 0, (size_t)T * nkv * nb);
    for (int t = 0; t < T; t++)
        for (int g = 0; g < nkv; g++) {
            int n1 = 0;
            for (int j = 0; j * S + W <= T; j++) {
                P[j] = 0;
                n1 = j + 1;
            }
            for (int n = g * (nh / nkv); n < (g + 1) * (nh / nkv); n++) {
                const double *qn = q + (t * nh + n) * hd;
                double z2 = 0;
                int any = 0;
                for (int i = 0; 4 * S * i + 4 * W <= t + 1; i++) { /* visible level-2 keys */
                    double s = 0;
                    for (int e = 0; e < hd; e++) {
                        double mean = 0;
                        for (int r = 0; r < 4 * W; r++) mean += k[((4 * S * i + r) * nkv + g) * hd + e];
                        s += qn[e] * mean / (4 * W);
                    }
                    z2 += exp(s / sqrt(hd)), any = 1;
                }
                for (int j = 0; any && j < n1 && j * S + W <= t + 1; j++) {
                    for (int e = 0; e < hd; e++) {
                        ka[e] = 0;
                        for (int r = 0; r < W; r++) ka[e] += k[((j * S + r) * nkv + g) * hd + e] / W;
                    }
                    double s = 0;
                    for (int e = 0; e < hd; e++) s += qn[e] * ka[e];
                    P[j] += exp(s / sqrt(hd)) / z2;
                }
            }
            int qb = t / Bk;
            for (int b = 0; b < nb; b++) {
                sc[b] = 0;
                for (int j = mm * b - 1; j <= mm * b + mm - 1; j++)
                    if (j >= 0 && j < n1 && P[j] > sc[b]) sc[b] = P[j];
                if (b < c->init_blocks || (b <= qb && b >= qb - c->local_blocks)) sc[b] = INFINITY;
            }
            char *kp = keep + (t * nkv + g) * nb;
            double last = INFINITY;
            for (int r = 0; r < ns && r < nb; r++) {
                int best = -1;
                for (int b = 0; b < nb; b++)
                    if (!kp[b] && (best < 0 || sc[b] > sc[best])) best = b;
                kp[best] = 1;
                last = sc[best];
            }
            /* the gap between the last block kept and the best left out (exact ties excepted: both sides agree on them) */
            for (int b = 0; margin && b < nb && ns < nb; b++)
                if (!kp[b] && sc[b] != last && isfinite(last) && (last - sc[b]) / fmax(fabs(last), 1e-300) < *margin)
                    *margin = (last - sc[b]) / fmax(fabs(last), 1e-300);
            for (int b = qb + 1; b < nb; b++) kp[b] = 0;
        }
    free(sc), free(P), free(ka);
}

static void ref_forward_impl(const ps_model *m, const int32_t *tok, int T, int shift, ref_select_fix *fix, double *logits);

void ref_forward_grid(const ps_model *m, const int32_t *tok, int T, int shift, double *logits) {
    ref_forward_impl(m, tok, T, shift, NULL, logits);
}

void ref_forward_select(const ps_model *m, const int32_t *tok, int T, const void *fix, double *logits) {
    ref_forward_impl(m, tok, T, 0, (ref_select_fix *)fix, logits);
}

/* Window grids with offsets (docs/mitigations.md): window j of KV head g covers j*S + o_g + i with
 * o_g = (head_offsets[g] + shift) mod S; it exists when j*S + o_g + W <= T; query t sees it when
 * j*S + o_g + W - 1 <= t; its compressed key is rotated by R(j*S + o_g). */
static void ref_forward_impl(const ps_model *m, const int32_t *tok, int T, int shift, ref_select_fix *fix, double *logits) {
    const ps_config *c = &m->cfg;
    int d = (int)c->d_model, hd = (int)c->head_dim, nh = (int)c->n_heads, nkv = (int)c->n_kv_heads, F = (int)c->d_ff;
    int W = (int)c->window, S = (int)c->stride, LW = (int)c->local_window, V = (int)c->vocab_size;
    int comp = c->kind == PS_ATTN_COMPRESSED;
    int nW = comp && T >= W ? (T - W) / S + 1 : 0;
    int sel = c->kind == PS_ATTN_SELECT && (c->dense_len <= 0 || T >= c->dense_len), nb = sel ? (int)((T + c->block - 1) / c->block) : 0;
    char *keep_own = sel ? malloc((size_t)c->n_layers * T * nkv * nb) : NULL;
    char *keep = sel && fix ? fix->keep : keep_own;
    if (sel && fix && !fix->keep) {
        keep = fix->keep = calloc((size_t)c->n_layers * T * nkv * nb, 1);
        fix->margin = INFINITY;
    }
    double eps = c->rms_eps;
    double *h = calloc((size_t)T * d, 8), *a = calloc((size_t)T * d, 8);
    double *q = calloc((size_t)T * nh * hd, 8), *k = calloc((size_t)T * nkv * hd, 8), *v = calloc((size_t)T * nkv * hd, 8);
    double *ck = calloc((size_t)(nW + 1) * nkv * hd, 8), *cv = calloc((size_t)(nW + 1) * nkv * hd, 8);
    double *z = calloc((size_t)nh * hd, 8), *tmp = calloc((size_t)(d > F ? d : F) * 4 + nkv * hd * 2, 8);
    double *sc = calloc((size_t)(nW + T + 1), 8);
    const float *E = ps_model_embed(m, m->params);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < d; i++) h[t * d + i] = E[(int64_t)tok[t] * d + i];
    for (int l = 0; l < c->n_layers; l++) {
        ps_layer_params w = ps_model_layer(m, m->params, l);
        for (int t = 0; t < T; t++) rms(a + t * d, h + t * d, w.in_norm, d, eps);
        if (c->kind == PS_ATTN_CHANNEL) {
            ref_v4_attention(m, &w, a, T, h);
            goto mlp;
        }
        for (int t = 0; t < T; t++) {
            mv(q + t * nh * hd, w.wq, a + t * d, nh * hd, d);
            mv(k + t * nkv * hd, w.wk, a + t * d, nkv * hd, d);
            mv(v + t * nkv * hd, w.wv, a + t * d, nkv * hd, d);
            for (int n = 0; n < nh; n++) {
                if (c->qk_norm) rms(q + (t * nh + n) * hd, q + (t * nh + n) * hd, w.qnorm, hd, eps);
                if (c->rope) rope(q + (t * nh + n) * hd, hd, t, c->rope_theta);
            }
            for (int g = 0; g < nkv; g++) {
                if (c->qk_norm) rms(k + (t * nkv + g) * hd, k + (t * nkv + g) * hd, w.knorm, hd, eps);
                if (c->rope) rope(k + (t * nkv + g) * hd, hd, t, c->rope_theta);
            }
        }
        char *kl = sel ? keep + (size_t)l * T * nkv * nb : NULL;
        if (sel && !(fix && fix->filled)) ref_select(c, q, k, T, kl, fix ? &fix->margin : NULL); /* fixed: the first call's */
        memset(ck, 0, (size_t)(nW + 1) * nkv * hd * 8);
        memset(cv, 0, (size_t)(nW + 1) * nkv * hd * 8);
        for (int j = 0; j < nW; j++)
            for (int br = 0; br < 2; br++) {
                const float *U = br ? w.value_gate_w : w.key_gate_w, *Cb = br ? w.value_gate_b : w.key_gate_b;
                const float *P = br ? w.value_payload : w.key_payload;
                double *out = br ? cv : ck;
                for (int g = 0; g < nkv; g++) {
                    int og = (int)(ps_config_grid_offset(c, l, g) + shift) % S, p0 = j * S + og;
                    if (p0 + W > T) continue; /* this head's grid has no window j */
                    double zl[4096], al[4096], mx = -1e300, sum = 0;
                    for (int i = 0; i < W; i++) {
                        zl[i] = 0;
                        if (c->gate == PS_GATE_LEARNED) {
                            zl[i] = Cb[i * nkv + g];
                            for (int e = 0; e < d; e++) zl[i] += (double)U[((int64_t)i * nkv + g) * d + e] * a[(p0 + i) * d + e];
                        }
                        if (zl[i] > mx) mx = zl[i];
                    }
                    for (int i = 0; i < W; i++) sum += (al[i] = exp(zl[i] - mx));
                    double *o = out + (j * nkv + g) * hd;
                    memset(o, 0, (size_t)hd * 8);
                    for (int i = 0; i < W; i++) {
                        const float *Ci = c->payload == PS_PAYLOAD_SHARED ? P : P + (int64_t)i * nkv * hd * d;
                        mv(tmp, Ci + (int64_t)g * hd * d, a + (p0 + i) * d, hd, d);
                        for (int e = 0; e < hd; e++) o[e] += al[i] / sum * tmp[e];
                    }
                    if (!br) {
                        if (c->qk_norm) rms(o, o, w.knorm, hd, eps);
                        if (c->rope) rope(o, hd, (double)p0, c->rope_theta);
                    }
                }
            }
        for (int t = 0; t < T; t++) {
            for (int n = 0; n < nh; n++) {
                int g = n / (nh / nkv), ns = 0;
                const double *qt = q + (t * nh + n) * hd;
                double mx = -1e300;
                /* entries: compressed windows that ended, then raw keys of the local window (or all, full) */
                int jmax = 0, og = comp ? (int)(ps_config_grid_offset(c, l, g) + shift) % S : 0;
                for (int j = 0; j < nW; j++)
                    if (j * S + og + W - 1 <= t) jmax = j + 1;
                int lo = comp ? (t - LW + 1 > 0 ? t - LW + 1 : 0) : 0;
                for (int j = 0; j < jmax; j++) {
                    double s = 0;
                    for (int e = 0; e < hd; e++) s += qt[e] * ck[(j * nkv + g) * hd + e];
                    sc[ns++] = s / sqrt(hd);
                }
                for (int tp = lo; tp <= t; tp++) {
                    double s = 0;
                    for (int e = 0; e < hd; e++) s += qt[e] * k[(tp * nkv + g) * hd + e];
                    sc[ns++] = !sel || kl[(t * nkv + g) * nb + tp / c->block] ? s / sqrt(hd) : -INFINITY;
                }
                double sum = 0;
                for (int i = 0; i < ns; i++) mx = sc[i] > mx ? sc[i] : mx;
                for (int i = 0; i < ns; i++) sum += (sc[i] = exp(sc[i] - mx));
                double *zn = z + n * hd;
                memset(zn, 0, (size_t)hd * 8);
                int i = 0;
                for (int j = 0; j < jmax; j++, i++)
                    for (int e = 0; e < hd; e++) zn[e] += sc[i] / sum * cv[(j * nkv + g) * hd + e];
                for (int tp = lo; tp <= t; tp++, i++)
                    for (int e = 0; e < hd; e++) zn[e] += sc[i] / sum * v[(tp * nkv + g) * hd + e];
            }
            mv(tmp, w.wo, z, d, nh * hd);
            for (int i = 0; i < d; i++) h[t * d + i] += tmp[i];
        }
    mlp:
        for (int t = 0; t < T; t++) {
            double *mm = tmp, *gg = tmp + d, *uu = tmp + d + F;
            rms(mm, h + t * d, w.post_norm, d, eps);
            mv(gg, w.mlp_gate, mm, F, d);
            mv(uu, w.mlp_up, mm, F, d);
            for (int i = 0; i < F; i++) gg[i] = gg[i] / (1 + exp(-gg[i])) * uu[i];
            mv(mm, w.mlp_down, gg, d, F);
            for (int i = 0; i < d; i++) h[t * d + i] += mm[i];
        }
    }
    const float *H = ps_model_lm_head(m, m->params);
    for (int t = 0; t < T; t++) {
        rms(a + t * d, h + t * d, ps_model_final_norm(m, m->params), d, eps);
        mv(logits + (int64_t)t * V, H, a + t * d, V, d);
    }
    if (fix && sel) fix->filled = 1;
    free(keep_own);
    free(h); free(a); free(q); free(k); free(v); free(ck); free(cv); free(z); free(tmp); free(sc);
}
