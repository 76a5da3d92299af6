#include "train/optim.h"

#include <math.h>
#include <stdlib.h>

#include "core/ops.h"

void ps_optim_defaults(ps_optim_cfg *c) {
    c->lr = 3e-3;
    c->min_lr_frac = 0.1;
    c->warmup_steps = 0;
    c->total_steps = 1000;
    c->beta1 = 0.9;
    c->beta2 = 0.95;
    c->eps = 1e-8;
    c->weight_decay = 0.1;
    c->grad_clip = 1.0;
    c->gate_lr_mult = 1.0;
    c->gate_weight_decay = 0.0;
}

double ps_lr_at(const ps_optim_cfg *c, int64_t step) {
    if (c->warmup_steps > 0 && step < c->warmup_steps) return c->lr * (double)(step + 1) / (double)c->warmup_steps;
    int64_t span = c->total_steps - c->warmup_steps;
    if (span <= 0) return c->lr;
    double p = (double)(step - c->warmup_steps) / (double)span;
    if (p > 1) p = 1;
    double lo = c->lr * c->min_lr_frac;
    return lo + 0.5 * (c->lr - lo) * (1.0 + cos(M_PI * p));
}

int ps_grad_norm(ps_ctx *ctx, const float *g, int64_t n, double *norm, ps_error *err) {
    double ss = 0;
    if (ps_sumsq(ctx, &ss, g, n)) return ps_ctx_check(ctx, err);
    *norm = sqrt(ss);
    return 0;
}

int ps_adamw_update(ps_model *m, const float *grads, float *m1, float *m2, int64_t t, double lr, double clip_scale,
                    const ps_optim_cfg *c, ps_error *err) {
    double bc1 = 1.0 - pow(c->beta1, (double)t), bc2 = 1.0 - pow(c->beta2, (double)t);
    ps_adamw_hyper h = {.beta1 = (float)c->beta1, .beta2 = (float)c->beta2, .eps = (float)c->eps,
                        .clip_scale = (float)clip_scale, .inv_bc1 = (float)(1.0 / bc1), .inv_bc2 = (float)(1.0 / bc2)};
    /* one segment per tensor, with its group's learning rate and decay */
    ps_adamw_seg *segs = malloc((size_t)(m->n_tensors ? m->n_tensors : 1) * sizeof *segs);
    if (!segs) return ps_fail(err, "out of memory for %d optimizer segments", m->n_tensors);
    for (int i = 0; i < m->n_tensors; i++) {
        const ps_param_info *p = &m->table[i];
        int gate = p->kind == PS_P_KEY_GATE_W || p->kind == PS_P_KEY_GATE_B || p->kind == PS_P_VALUE_GATE_W ||
                   p->kind == PS_P_VALUE_GATE_B || p->kind == PS_P_V4_C_WGATE || p->kind == PS_P_V4_C_APE;
        segs[i] = (ps_adamw_seg){.offset = p->offset, .n = p->numel, .lr = (float)(gate ? lr * c->gate_lr_mult : lr),
                                 .weight_decay = (float)(gate ? c->gate_weight_decay : p->ndim >= 2 ? c->weight_decay : 0.0)};
    }
    int rc = ps_adamw(m->ctx, m->params, m1, m2, grads, segs, m->n_tensors, &h);
    free(segs);
    return rc ? ps_ctx_check(m->ctx, err) : 0;
}
