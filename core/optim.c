#include "optim.h"

#include <math.h>

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

double ps_grad_norm(const float *g, int64_t n) {
    /* fixed blocks summed in a fixed order: the same value for any thread count */
    enum { BLK = 4096 };
    int64_t nb = (n + BLK - 1) / BLK;
    double total = 0;
    for (int64_t b = 0; b < nb; b++) {
        double s = 0;
        int64_t end = (b + 1) * BLK < n ? (b + 1) * BLK : n;
        for (int64_t i = b * BLK; i < end; i++) s += (double)g[i] * g[i];
        total += s;
    }
    return sqrt(total);
}

void ps_adamw_update(ps_model *m, const float *grads, float *m1, float *m2, int64_t t, double lr, double clip_scale,
                     const ps_optim_cfg *c) {
    double bc1 = 1.0 - pow(c->beta1, (double)t), bc2 = 1.0 - pow(c->beta2, (double)t);
    for (int i = 0; i < m->n_tensors; i++) {
        const ps_param_info *p = &m->table[i];
        int gate = p->kind == PS_P_KEY_GATE_W || p->kind == PS_P_KEY_GATE_B || p->kind == PS_P_VALUE_GATE_W ||
                   p->kind == PS_P_VALUE_GATE_B;
        float plr = (float)(gate ? lr * c->gate_lr_mult : lr);
        float wd = (float)(gate ? c->gate_weight_decay : p->ndim >= 2 ? c->weight_decay : 0.0);
        float b1 = (float)c->beta1, b2 = (float)c->beta2, eps = (float)c->eps, cs = (float)clip_scale;
        float ib1 = (float)(1.0 / bc1), ib2 = (float)(1.0 / bc2);
        float *w = m->params + p->offset, *mm = m1 + p->offset, *vv = m2 + p->offset;
        const float *g = grads + p->offset;
#pragma omp parallel for schedule(static) if (p->numel > 65536)
        for (int64_t j = 0; j < p->numel; j++) {
            float gj = g[j] * cs;
            mm[j] = b1 * mm[j] + (1.0f - b1) * gj;
            vv[j] = b2 * vv[j] + (1.0f - b2) * gj * gj;
            float mh = mm[j] * ib1, vh = vv[j] * ib2;
            w[j] -= plr * (mh / (sqrtf(vh) + eps) + wd * w[j]);
        }
    }
}
