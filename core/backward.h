/* backward.h — gradients of the next-token cross-entropy (SPEC §5, §7 `grad`) for every parameter,
 * by reverse-mode through the activations a forward pass kept (ps_acts with keep_all). */
#ifndef PS_BACKWARD_H
#define PS_BACKWARD_H

#include <stdint.h>

#include "core/error.h"
#include "core/forward.h"
#include "core/model.h"

/* Cross-entropy of a->p.logits against targets [B, T] (-1 = no target), times `scale` (1 / number of
 * targets for a mean), back-propagated: grads (laid out like m->params) +=. `g` is gradient scratch:
 * ps_acts created for the same config, B and T with keep_all = false. Adds the unscaled loss sum to
 * *loss_sum and the number of target positions to *n_targets. */
int ps_backward(const ps_model *m, const ps_acts *a, ps_acts *g, const int32_t *tokens, const int32_t *targets,
                float scale, float *grads, double *loss_sum, int64_t *n_targets, ps_error *err);

#endif
