/* ref_model.h — an independent plain-loop, double-precision forward pass of SPEC §2, written from the
 * spec's formulas and not sharing any kernel with core/. Used to check ps_forward. */
#ifndef PS_REF_MODEL_H
#define PS_REF_MODEL_H

#include <stdint.h>

#include "core/model.h"

/* logits: [T, vocab] */
void ref_forward(const ps_model *m, const int32_t *tok, int T, double *logits);

/* The same on a window grid moved by `shift` (phase augmentation) on top of the config's per-head
 * offsets (staggered grids): docs/mitigations.md. shift 0 is ref_forward. */
void ref_forward_grid(const ps_model *m, const int32_t *tok, int T, int shift, double *logits);

/* ref_forward_grid in the form tu_fd_model takes (testutil.h): shift points to an int, or NULL for 0. */
void ref_forward_user(const ps_model *m, const int32_t *tok, int T, const void *shift, double *logits);

/* The select attention (attention.kind "select") with its choice of blocks fixed: the first call on a ref_select_fix
 * computes the choice in double from its own q and k and keeps it (keep: [L, T, nkv, nb]); later calls attend the
 * same blocks, so finite differences see attention over fixed keys (the backward has no gradient through the
 * choice). A NULL fix computes the choice each call. In the form tu_fd_model takes. */
typedef struct {
    char *keep;
    int filled;
    double margin; /* the first call's smallest relative gap between a kept block's score and a dropped one's (ties aside) */
} ref_select_fix;
void ref_forward_select(const ps_model *m, const int32_t *tok, int T, const void *fix, double *logits);

#endif
