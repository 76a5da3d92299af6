/* backward.h — gradients of the next-token cross-entropy (SPEC §5, §7 `grad`) for every parameter,
 * by reverse-mode through the activations a forward pass kept (ps_acts with keep_all). */
#ifndef PS_BACKWARD_H
#define PS_BACKWARD_H

#include <stdint.h>

#include "core/error.h"
#include "core/hooks.h"
#include "core/forward.h"
#include "core/model.h"

/* Cross-entropy of a->p.logits against targets [B, T] (-1 = no target), times `scale` (1 / number of
 * targets for a mean), back-propagated: grads (laid out like m->params) +=. `g` is gradient scratch:
 * ps_acts created for the same config, B and T with keep_all = false. Adds the unscaled loss sum to
 * *loss_sum and the number of target positions to *n_targets. */
int ps_backward(const ps_model *m, const ps_acts *a, ps_acts *g, const int32_t *tokens, const int32_t *targets,
                float scale, float *grads, double *loss_sum, int64_t *n_targets, ps_error *err);

/* What a backward computes besides the parameters' gradients (ps_backward_ex):
 *   grad_hooks  fired, as the backward reaches them, with the gradient of the loss with respect to a
 *               hook point's activation as the event's data (same name and shape as the forward's event;
 *               TransformerLens's backward hooks): blocks.{l}.attn.hook_z, hook_k, hook_v, hook_ck and
 *               hook_cv (per-channel compressor attention: hook_z, hook_k and hook_ck). A callback or an
 *               action may read the gradient or change it (the change flows on into the rest of the
 *               backward, as in TransformerLens). NULL: none.
 *   no_weight_grads  1: the linear layers' and the embedding's weight gradients are skipped (activation
 *               gradients only, for attribution; the small norm / gate / bias gradients still go into grads,
 *               which must exist).
 *   stop_layer  the backward ends after layer stop_layer (layers below it and the embedding get no
 *               gradient); 0: down to the embedding. */
typedef struct {
    const ps_hooks *grad_hooks;
    int no_weight_grads;
    int stop_layer;
} ps_backward_opts;

int ps_backward_ex(const ps_model *m, const ps_acts *a, ps_acts *g, const int32_t *tokens, const int32_t *targets,
                   float scale, float *grads, double *loss_sum, int64_t *n_targets, const ps_backward_opts *o,
                   ps_error *err);

#endif
