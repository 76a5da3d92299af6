#include "optim.h"

#include <math.h>
#ifdef __AVX512F__
#include <immintrin.h>
#endif
#include <stdlib.h>

#include "ops.h"

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
    /* fixed blocks, the block sums added in block order: the same value for any thread count (the blocks
     * run in parallel; only their partial sums are shared) */
    enum { BLK = 4096 };
    int64_t nb = (n + BLK - 1) / BLK;
    double stack[256], *part = nb <= 256 ? stack : malloc((size_t)nb * sizeof(double));
    if (!part) { /* no scratch: the same sums, serially */
        double total = 0;
        for (int64_t b = 0; b < nb; b++) total += ps_dot_d(g + b * BLK, g + b * BLK, ((b + 1) * BLK < n ? (b + 1) * BLK : n) - b * BLK);
        return sqrt(total);
    }
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t b = 0; b < nb; b++) part[b] = ps_dot_d(g + b * BLK, g + b * BLK, ((b + 1) * BLK < n ? (b + 1) * BLK : n) - b * BLK);
    double total = 0;
    for (int64_t b = 0; b < nb; b++) total += part[b];
    if (part != stack) free(part);
    return sqrt(total);
}

/* AdamW over one tensor's elements [j0, j1): the plain-loop kernel (elementwise, so any split of the range
 * gives the same numbers). */
static void adamw_range_plain(float *w, float *mm, float *vv, const float *g, int64_t j0, int64_t j1, float b1,
                              float b2, float eps, float cs, float ib1, float ib2, float plr, float wd) {
    for (int64_t j = j0; j < j1; j++) {
        float gj = g[j] * cs;
        mm[j] = b1 * mm[j] + (1.0f - b1) * gj;
        vv[j] = b2 * vv[j] + (1.0f - b2) * gj * gj;
        float mh = mm[j] * ib1, vh = vv[j] * ib2;
        w[j] -= plr * (mh / (sqrtf(vh) + eps) + wd * w[j]);
    }
}

/* The same with AVX-512 where the build has it: gcc does not vectorise the plain loop (sqrtf may set errno,
 * and the build keeps -fmath-errno). Every lane does the plain loop's operations in its order, without
 * fused multiply-adds, and sqrt and division are correctly rounded, so the results are bit-identical. */
static void adamw_range(float *w, float *mm, float *vv, const float *g, int64_t j0, int64_t j1, float b1, float b2,
                        float eps, float cs, float ib1, float ib2, float plr, float wd) {
#ifdef __AVX512F__
    const __m512 vb1 = _mm512_set1_ps(b1), vb2 = _mm512_set1_ps(b2), v1b1 = _mm512_set1_ps(1.0f - b1),
                 v1b2 = _mm512_set1_ps(1.0f - b2), veps = _mm512_set1_ps(eps), vcs = _mm512_set1_ps(cs),
                 vib1 = _mm512_set1_ps(ib1), vib2 = _mm512_set1_ps(ib2), vlr = _mm512_set1_ps(plr),
                 vwd = _mm512_set1_ps(wd);
    for (; j0 + 16 <= j1; j0 += 16) {
        __m512 gj = _mm512_mul_ps(_mm512_loadu_ps(g + j0), vcs);
        __m512 m = _mm512_add_ps(_mm512_mul_ps(vb1, _mm512_loadu_ps(mm + j0)), _mm512_mul_ps(v1b1, gj));
        __m512 v = _mm512_add_ps(_mm512_mul_ps(vb2, _mm512_loadu_ps(vv + j0)), _mm512_mul_ps(_mm512_mul_ps(v1b2, gj), gj));
        _mm512_storeu_ps(mm + j0, m);
        _mm512_storeu_ps(vv + j0, v);
        __m512 mh = _mm512_mul_ps(m, vib1), vh = _mm512_mul_ps(v, vib2), wj = _mm512_loadu_ps(w + j0);
        __m512 upd = _mm512_add_ps(_mm512_div_ps(mh, _mm512_add_ps(_mm512_sqrt_ps(vh), veps)), _mm512_mul_ps(vwd, wj));
        _mm512_storeu_ps(w + j0, _mm512_sub_ps(wj, _mm512_mul_ps(vlr, upd)));
    }
#endif
    adamw_range_plain(w, mm, vv, g, j0, j1, b1, b2, eps, cs, ib1, ib2, plr, wd);
}

void ps_adamw_update(ps_model *m, const float *grads, float *m1, float *m2, int64_t t, double lr, double clip_scale,
                     const ps_optim_cfg *c) {
    double bc1 = 1.0 - pow(c->beta1, (double)t), bc2 = 1.0 - pow(c->beta2, (double)t);
    float b1 = (float)c->beta1, b2 = (float)c->beta2, eps = (float)c->eps, cs = (float)clip_scale;
    float ib1 = (float)(1.0 / bc1), ib2 = (float)(1.0 / bc2);
    /* One parallel region for every tensor: each tensor is cut into chunks of CH elements, and the
     * threads share out all chunks of all tensors (small tensors no longer run alone on one thread, and
     * there is one fork/join per step instead of one per tensor). */
    enum { CH = 16384 };
    int64_t n_chunks = 0;
    for (int i = 0; i < m->n_tensors; i++) n_chunks += (m->table[i].numel + CH - 1) / CH;
#pragma omp parallel if (m->n_params > 65536)
    {
        int i = 0;
        int64_t first = 0; /* chunk index of tensor i's first chunk */
#pragma omp for schedule(static)
        for (int64_t k = 0; k < n_chunks; k++) {
            while (i < m->n_tensors && k >= first + (m->table[i].numel + CH - 1) / CH) {
                first += (m->table[i].numel + CH - 1) / CH;
                i++;
            }
            const ps_param_info *p = &m->table[i];
            int gate = p->kind == PS_P_KEY_GATE_W || p->kind == PS_P_KEY_GATE_B || p->kind == PS_P_VALUE_GATE_W ||
                       p->kind == PS_P_VALUE_GATE_B;
            float plr = (float)(gate ? lr * c->gate_lr_mult : lr);
            float wd = (float)(gate ? c->gate_weight_decay : p->ndim >= 2 ? c->weight_decay : 0.0);
            int64_t j0 = (k - first) * CH, j1 = j0 + CH < p->numel ? j0 + CH : p->numel;
            adamw_range(m->params + p->offset, m1 + p->offset, m2 + p->offset, grads + p->offset, j0, j1, b1, b2, eps,
                        cs, ib1, ib2, plr, wd);
        }
    }
}
