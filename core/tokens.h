/* tokens.h — lists of token-id sequences as JSON (`T.json`: [[0, 5, 7], [0, 3]]; `Y.json` the same
 * shape with -1 or null where a position has no target). */
#ifndef PS_TOKENS_H
#define PS_TOKENS_H

#include <stdint.h>

#include "core/error.h"

typedef struct {
    int n;          /* sequences */
    int64_t *len;   /* [n] */
    int32_t **seq;  /* [n][len[i]] */
} ps_token_lists;

/* Read a JSON list of integer lists. allow_null: null reads as -1 (targets). Values below
 * `min_value` (-1 for targets, 0 for tokens) are errors naming the file and position. */
int ps_tokens_load(const char *path, int allow_null, int32_t min_value, ps_token_lists *out, ps_error *err);
void ps_tokens_free(ps_token_lists *t);

#endif
