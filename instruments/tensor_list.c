#include "instruments/tensor_list.h"

#include <stdlib.h>
#include <string.h>

int ps_tensor_list_push(ps_tensor_list *l, const char *name, int ndim, const int64_t *shape, const float *src,
                        ps_error *err) {
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 16;
        ps_st_tensor *t = realloc(l->t, (size_t)cap * sizeof *t);
        if (!t) return ps_fail(err, "out of memory");
        l->t = t;
        l->cap = cap;
    }
    int64_t n = 1;
    ps_st_tensor *t = &l->t[l->n];
    memset(t, 0, sizeof *t);
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) n *= (t->shape[i] = shape[i]);
    float *d = malloc((size_t)(n ? n : 1) * sizeof(float));
    char *nm = strdup(name);
    if (!d || !nm) {
        free(d);
        free(nm);
        return ps_fail(err, "out of memory for tensor \"%s\"", name);
    }
    if (n) memcpy(d, src, (size_t)n * sizeof(float));
    t->data = d;
    t->name = nm;
    l->n++;
    return 0;
}

void ps_tensor_list_free(ps_tensor_list *l) {
    for (int i = 0; i < l->n; i++) {
        free((void *)l->t[i].data);
        free((void *)l->t[i].name);
    }
    free(l->t);
    memset(l, 0, sizeof *l);
}
