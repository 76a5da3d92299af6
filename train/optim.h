/* optim.h — AdamW with per-group settings, linear warmup + cosine decay, and global gradient-norm
 * clipping. Groups: the compressor's gate parameters (weights and biases: own learning-rate multiplier
 * and weight decay), other tensors of 2+ dimensions (matrices: weight decay), and vectors (norm weights:
 * no decay). Deterministic: no reductions whose order depends on threads. */
#ifndef PS_OPTIM_H
#define PS_OPTIM_H

#include <stdint.h>

#include "core/model.h"

typedef struct {
    double lr;            /* peak learning rate */
    double min_lr_frac;   /* cosine decays to lr * min_lr_frac */
    int64_t warmup_steps; /* linear warmup from lr/warmup to lr */
    int64_t total_steps;
    double beta1, beta2, eps;
    double weight_decay;  /* matrices */
    double grad_clip;     /* max global L2 norm (0 = off) */
    double gate_lr_mult, gate_weight_decay;
} ps_optim_cfg;

void ps_optim_defaults(ps_optim_cfg *c);

/* Learning rate for the update at 0-based step `step`. */
double ps_lr_at(const ps_optim_cfg *c, int64_t step);

/* Global L2 norm of n floats of ctx (fixed-order double sum: the same for any thread count). */
int ps_grad_norm(ps_ctx *ctx, const float *g, int64_t n, double *norm, ps_error *err);

/* One AdamW update of m->params with grads (scaled by clip_scale first), on the model's context. m1, m2:
 * first and second moments, laid out like the params; t: 1-based update count (bias correction).
 * Groups: gate tensors (gate_lr_mult, gate_weight_decay), matrices (weight_decay), vectors (no decay). */
int ps_adamw_update(ps_model *m, const float *grads, float *m1, float *m2, int64_t t, double lr, double clip_scale,
                    const ps_optim_cfg *c, ps_error *err);

#endif
