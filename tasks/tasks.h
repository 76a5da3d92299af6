/* tasks.h — synthetic tasks (the layer tasks/, above core/ and text/) (SPEC §5) that generate token ids directly, deterministic from a seed:
 *
 *   kv-retrieval:      BOS, gap, K1 V1, gap, K2 V2, ..., gap, then queries "MARK K_i V_i" (value tokens
 *                      scored teacher-forced). Keys, values, fillers and the marker come from disjoint
 *                      id ranges; keys are distinct within a sequence.
 *   bigram-induction:  BOS, gap, a context of n_context distinct tokens, gap, then query tokens, each a
 *                      context token whose target is its successor in the context.
 *
 * Vocabulary layout: 0 = BOS, 1 = query marker, then n_keys key ids, n_values value ids, n_fillers filler
 * ids. The task (layout and knobs) serialises to JSON and travels in the checkpoint's __metadata__
 * ("phasescope.task"), so later commands evaluate with the layout the model was trained on. */
#ifndef PS_TASKS_H
#define PS_TASKS_H

#include <jansson.h>
#include <stdint.h>

#include "core/batch.h"
#include "core/error.h"

/* PS_TASK_TEXT: text key-value prompts of a real tokenizer (text/textkv_task.h); core knows only its
 * seq_len, n_queries and loss, and neither generates nor parses it. */
typedef enum { PS_TASK_KV = 0, PS_TASK_BIGRAM = 1, PS_TASK_TEXT = 2 } ps_task_kind;

typedef struct {
    ps_task_kind kind;
    int64_t seq_len;            /* T of every generated sequence */
    int64_t n_keys, n_values, n_fillers; /* id ranges (bigram: keys are the context alphabet, no values) */
    int64_t n_pairs, key_len, value_len; /* kv-retrieval */
    int64_t n_context;          /* bigram-induction: distinct context tokens */
    int64_t gap_min, gap_max;   /* filler tokens before the first pair / context and between pairs */
    int64_t query_gap;          /* at least this many fillers between the last pair / context and the queries */
    int64_t n_queries;          /* queries per sequence (distinct pairs / distinct targets) */
    int loss_all;               /* next-token loss on every position, not only answers */
} ps_task;

/* Token id ranges derived from the layout. */
#define PS_BOS 0
#define PS_MARKER 1
static inline int64_t ps_task_key0(const ps_task *t) { (void)t; return 2; }
static inline int64_t ps_task_val0(const ps_task *t) { return 2 + t->n_keys; }
static inline int64_t ps_task_fill0(const ps_task *t) { return 2 + t->n_keys + t->n_values; }
static inline int64_t ps_task_vocab_needed(const ps_task *t) { return 2 + t->n_keys + t->n_values + t->n_fillers; }

/* Parse / validate / serialise. `source` names the file (and JSON path) in errors. */
int ps_task_from_json(json_t *obj, const char *source, ps_task *t, ps_error *err);
int ps_task_validate(const ps_task *t, int64_t vocab_size, int64_t max_seq_len, const char *source, ps_error *err);
json_t *ps_task_to_json(const ps_task *t);

/* Fill b (allocated for B sequences of t->seq_len tokens) deterministically from seed. Returns 0, or -1
 * with err set when its scratch cannot be allocated (b is then unspecified). */
int ps_task_generate(const ps_task *t, uint64_t seed, ps_batch *b, ps_error *err);

#endif
