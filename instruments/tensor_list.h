/* tensor_list.h — named float32 tensors collected (copied) for one safetensors file: what `forward` writes
 * for the controlled model and for DeepSeek-V4 checkpoints. */
#ifndef PS_TENSOR_LIST_H
#define PS_TENSOR_LIST_H

#include <stdint.h>

#include "core/error.h"
#include "core/safetensors.h"

typedef struct {
    int n, cap;
    ps_st_tensor *t; /* each with its own copy of the data and the name */
} ps_tensor_list;

/* Append a copy of src (ndim dims of shape) under name. */
int ps_tensor_list_push(ps_tensor_list *l, const char *name, int ndim, const int64_t *shape, const float *src,
                        ps_error *err);
void ps_tensor_list_free(ps_tensor_list *l);

#endif
