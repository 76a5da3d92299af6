/* ref_model.h — an independent plain-loop, double-precision forward pass of SPEC §2, written from the
 * spec's formulas and not sharing any kernel with core/. Used to check ps_forward. */
#ifndef PS_REF_MODEL_H
#define PS_REF_MODEL_H

#include <stdint.h>

#include "core/model.h"

/* logits: [T, vocab] */
void ref_forward(const ps_model *m, const int32_t *tok, int T, double *logits);

#endif
