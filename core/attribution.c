/* attribution.c — the controlled model's gradients at hook points as its family entries (runtime.h: backward,
 * backward_free, state_point, patch_missing, patch_attention), which interventions/atp.c's one attribution-
 * patching estimate reads: one backward of the answers' NLL from a batch's kept activations (ps_backward_ex,
 * activation gradients only, gradient hooks fired), the clean activation of a point in those activations, and
 * AtP*'s QK fix: a layer's attention recomputed exactly with one KV head's entries set to their means. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/backward.h"
#include "core/family_entries.h"
#include "core/forward.h"
#include "core/ops.h"
#include "core/runtime.h"

/* the backward's scratch for one batch shape (B, T): its gradient activations (the QK fix's workspace too) and
 * the parameters' gradients the backward still writes (norms, gates; never read) */
typedef struct {
    ps_acts g;
    int have_g;
    float *grads;
    int64_t n_grads;
} model_bwd;

static const ps_model *model_of(const ps_runtime *rt) { return rt->model; }

void ps_model_backward_free(const ps_runtime *rt, void *scratch) {
    model_bwd *s = scratch;
    if (!s) return;
    if (s->have_g) ps_acts_free(&s->g);
    if (s->grads) ps_buf_free(rt->ctx, s->grads, s->n_grads * (int64_t)sizeof(float));
    free(s);
}

static model_bwd *scratch_for(const ps_runtime *rt, const ps_acts *a, void **scratch, ps_error *err) {
    const ps_model *m = model_of(rt);
    model_bwd *s = *scratch;
    if (s && s->g.B == a->B && s->g.T == a->T) return s;
    ps_model_backward_free(rt, s);
    *scratch = s = calloc(1, sizeof *s);
    if (!s) {
        ps_fail(err, "out of memory");
        return NULL;
    }
    if (ps_acts_create(&s->g, m->ctx, &m->cfg, a->B, a->T, false, err)) return NULL;
    s->have_g = 1;
    s->n_grads = m->n_params;
    s->grads = ps_buf_alloc(m->ctx, s->n_grads * (int64_t)sizeof(float), "attribution: the backward's parameter gradients", err);
    return s->grads ? s : NULL;
}

int ps_model_backward(const ps_runtime *rt, void *state, void **scratch, const int32_t *tokens, const int32_t *targets,
                      const ps_hooks *grad_hooks, int stop_layer, double *loss, ps_error *err) {
    const ps_acts *a = state;
    model_bwd *s = scratch_for(rt, a, scratch, err);
    if (!s) return -1;
    int64_t n_t = 0;
    *loss = 0;
    ps_backward_opts o = {.grad_hooks = grad_hooks, .no_weight_grads = 1, .stop_layer = stop_layer};
    return ps_backward_ex(model_of(rt), a, &s->g, tokens, targets, 1.0f, s->grads, loss, &n_t, &o, err);
}

/* the clean activation at point pt of a layer's slot of the acts, and its event shape */
static float *point_of(const ps_act_ptrs *P, int pt) {
    return pt == PS_HOOK_K ? P->k : pt == PS_HOOK_V ? P->v : pt == PS_HOOK_CK ? P->ck : pt == PS_HOOK_CV ? P->cv : pt == PS_HOOK_Z ? P->z : NULL;
}

const float *ps_model_state_point(const ps_runtime *rt, void *state, int layer, int point, int64_t dims[4]) {
    const ps_acts *a = state;
    if (layer < 0 || layer >= rt->n_layers || !ps_hook_shape(&model_of(rt)->cfg, (ps_hook_point)point, a->B, a->T, dims)) return NULL;
    if (point == PS_HOOK_CK || point == PS_HOOK_CV) dims[1] = a->nW; /* the entries this batch's pass made */
    ps_act_ptrs P = ps_acts_layer(a, layer);
    return point_of(&P, point);
}

/* The select attention's compressed target (hook_ck, the level-1 pooled keys) reaches the output only through the
 * top-k choice of blocks: a discrete choice with no gradient, so every cell's first-order estimate would be 0 — a
 * refusal rather than a grid of zeros that reads as "no head matters" (target both would silently drop that part). */
const char *ps_model_atp_target_missing(const ps_runtime *rt, int target, char *buf, size_t n) {
    if (model_of(rt)->cfg.kind != PS_ATTN_SELECT || !((target + 1) & 2)) return NULL;
    snprintf(buf, n, "--method atp --target %s: the select attention's compressed keys (hook_ck) only choose which blocks a "
                     "query attends (a discrete top-k with no gradient), so attribution patching would estimate 0 for every "
                     "cell; use --method exact for this target, or --target raw (hook_k, hook_v)",
             ps_model_ko_target_names[target]);
    return buf;
}

const char *ps_model_patch_missing(const ps_runtime *rt, char *buf, size_t n) {
    if (model_of(rt)->cfg.kind == PS_ATTN_SELECT) {
        snprintf(buf, n, "--atp-fix qk: the select attention (attention.kind select) is not recomputed per head; use --atp-fix none");
        return buf;
    }
    if (model_of(rt)->cfg.kind != PS_ATTN_CHANNEL) return NULL;
    snprintf(buf, n, "--atp-fix qk: the per-channel compressor attention (attention.kind channel) is not recomputed per head; use "
                     "--atp-fix none");
    return buf;
}

/* Layer l's attention recomputed with KV head gk's entries at the given points set to their means; dz at head
 * group gk = z'_g − z. Only the group runs: its query heads and its KV head gathered into contiguous buffers
 * (the scratch acts' arrays), attended as a model with one KV head (its own window offsets), the output
 * scattered back. */
int ps_model_patch_attention(const ps_runtime *rt, void *state, void **scratch, int layer, int gk_, const int *points,
                             const float *const *means, int n, float *dz, ps_error *err) {
    const ps_config *c = &model_of(rt)->cfg;
    ps_acts *a = state;
    model_bwd *S = scratch_for(rt, a, scratch, err);
    if (!S) return -1;
    ps_ctx *ctx = rt->ctx;
    int64_t B = a->B, T = a->T, nW = a->nW, nkv = c->n_kv_heads, nh = c->n_heads, hd = c->head_dim, grp = nh / nkv, gk = gk_;
    int64_t kd = nkv * hd, qd = nh * hd, gd = grp * hd;
    ps_act_ptrs G = S->g.p, P = ps_acts_layer(a, layer);
    const int64_t *woffl = ps_acts_woff(a, layer); /* the layer's grid */
    int64_t *woff1 = woffl ? malloc((size_t)B * sizeof(int64_t)) : NULL;
    if (woffl && !woff1) return ps_fail(err, "out of memory for %lld window offsets", (long long)B);
    ps_attn_geom g1 = ps_acts_geom(a, layer); /* one KV head and its group's query heads */
    g1.nh = grp, g1.nkv = 1, g1.woff = woff1;
    for (int64_t b = 0; woff1 && b < B; b++) woff1[b] = woffl[b * nkv + gk];
    /* gather: q of the group [B, T, grp, hd], the head's k, v [B, T, 1, hd] and ck, cv [B, nW, 1, hd] */
    int rc = ps_copy_blocks(ctx, G.q, gd, 0, P.q + gk * gd, qd, 0, B * T, 1, gd, 0, 0.0f) ||
             ps_copy_blocks(ctx, G.k, hd, 0, P.k + gk * hd, kd, 0, B * T, 1, hd, 0, 0.0f) ||
             ps_copy_blocks(ctx, G.v, hd, 0, P.v + gk * hd, kd, 0, B * T, 1, hd, 0, 0.0f);
    if (!rc && nW > 0)
        rc = ps_copy_blocks(ctx, G.ck, hd, 0, P.ck + gk * hd, kd, 0, B * nW, 1, hd, 0, 0.0f) ||
             ps_copy_blocks(ctx, G.cv, hd, 0, P.cv + gk * hd, kd, 0, B * nW, 1, hd, 0, 0.0f);
    for (int i = 0; i < n && !rc; i++) {
        float *dst = point_of(&G, points[i]);
        int raw = points[i] == PS_HOOK_K || points[i] == PS_HOOK_V;
        if (!dst || points[i] == PS_HOOK_Z) {
            free(woff1);
            return ps_fail(err, "attribution (layer %d): point %d is not an attention input", layer, points[i]);
        }
        if (means[i]) rc = ps_head_set(ctx, dst, means[i] + gk * hd, kd, B, raw ? T : nW, 1, hd, 0, 0, B);
    }
    if (!rc) rc = ps_attn_forward(ctx, G.z, G.lse, G.q, G.k, G.v, G.ck, G.cv, &g1);
    /* the cell's heads: z'_g − z */
    if (!rc)
        rc = ps_copy_blocks(ctx, dz + gk * gd, qd, 0, G.z, gd, 0, B * T, 1, gd, 0, 0.0f) ||
             ps_copy_blocks(ctx, dz + gk * gd, qd, 0, P.z + gk * gd, qd, 0, B * T, 1, gd, 1, -1.0f);
    if (rc) {
        ps_ctx_check(ctx, err);
        rc = ps_fail_prefix(err, "attribution (layer %d, KV head %lld, recomputing its attention): ", layer, (long long)gk);
    }
    free(woff1);
    return rc;
}
