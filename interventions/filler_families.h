/* filler_families.h — the filler families of data/fillers.json: the tokens a shifted prompt's padding is
 * made of (a pattern of filler indices, or random). Loading and finding one by name. */
#ifndef PS_FILLER_FAMILIES_H
#define PS_FILLER_FAMILIES_H

#include <stdint.h>

#include "core/error.h"

/* A filler family (data/fillers.json): a pattern of filler indices (mod n_fillers), or random. */
typedef struct {
    char name[64];
    int random;
    int64_t n_pattern;
    int64_t pattern[64];
} ps_filler_family;

/* Load the families; *n gets their count (the first is the default). Caller frees *out. */
int ps_fillers_load(const char *path, ps_filler_family **out, int *n, ps_error *err);
/* Find a family by name (NULL name: the first); the error lists the names. */
int ps_fillers_find(const ps_filler_family *f, int n, const char *name, const ps_filler_family **out, ps_error *err);

#endif
