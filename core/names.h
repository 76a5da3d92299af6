/* names.h — a name looked up in a list, with the error that lists the names the caller could have given:
 * a flag's value among fixed choices (the CLI's ps_args_choice, the families' gate-cycle checks) and an item
 * of a list of structs by its name (the filler families of interventions/filler_families.h and the text
 * filler families of text/textutil.h). Owns nothing else; no state. */
#ifndef PS_NAMES_H
#define PS_NAMES_H

#include "core/error.h"

/* A flag's value v among choices (NULL-terminated): *idx its index, else a usage error "FLAG V: expected
 * A, B or C". */
int ps_choice(const char *flag, const char *v, const char *const *choices, int *idx, ps_error *err);

/* The name of item i of `items` (what ps_family_by_name searches). */
typedef const char *(*ps_name_of_fn)(const void *items, int i);

/* A filler family by name among n (NULL name: the first): *idx its index, else an error (not a usage
 * error) "--family NAME: unknown WHAT (families: A, B)", the names as they fit 511 characters. */
int ps_family_by_name(const void *items, int n, ps_name_of_fn name_of, const char *name, const char *what, int *idx,
                      ps_error *err);

#endif
