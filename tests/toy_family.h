/* toy_family.h — a third model family defined in tests/ (toy_family.c): a bigram-table model (next-token
 * logits = row a of a [V, V] table for token a; one hook point, blocks.0.hook_row, the rows [B, T, V] that are
 * the logits). Its ps_family table has what every command reaches a model through (core/runtime.h): open,
 * forward with hooks, score, rows (serve), a KV cache (generate), the hook point table, provenance and description, and its one
 * knockout target as data ("row": the rows replaced by their mean). A directory whose config.json says
 * {"model_type": "toy_bigram"} is its checkpoint (no weights: the table is a formula, toy_weight). It is not in
 * core's ps_families: a caller opens it by passing a list that holds it (toy_family_list: the public API's
 * ps_api_open_in, ps_runtime_open_in, serve's ps_serve_opts.families) or the table itself
 * (ps_runtime_open_family). */
#ifndef PS_TOY_FAMILY_H
#define PS_TOY_FAMILY_H

#include <stdint.h>

#include "core/runtime.h"

enum { TOY_V = 24, TOY_MAX_POS = 64 };
/* the table's entry [a, b]: the logit of token b after token a */
float toy_weight(int64_t a, int64_t b);
extern const ps_family ps_toy_family;
/* its KV cache (the family table's kvcache): a sequence keeps its last token; generate and serve decode through it */
struct ps_kvcache_ops;
extern const struct ps_kvcache_ops toy_kv_ops;
/* log-softmax of the table's row a at b, in double (what the model gives token b after token a) */
double toy_logprob(int a, int b);
/* a prompt's last token a whose greedy continuation a -> g1 -> g2 is unambiguous for two tokens (a unique
 * maximum in both rows; the lowest such a): 0, or -1 when the table has none */
int toy_greedy_pair(int *a, int *g1, int *g2);
/* how many toy checkpoints were opened so far (tests only: a call that should run on an open model must not
 * open another) */
extern int toy_opens;
/* The family list a caller passes to open a toy checkpoint (NULL-terminated): the toy, then core's families
 * (the same list for the public API's ps_api_open_in, core's ps_runtime_open_in and serve's
 * ps_serve_opts.families). */
const ps_family *const *toy_family_list(void);

#endif
