/* tasks.h — synthetic tasks (SPEC §5) that generate token ids directly, deterministic from a seed:
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

/* One query of a generated sequence. */
typedef struct {
    int64_t key_pos;    /* kv: position of the queried key's first token in the context (t_K);
                           bigram: position of the earlier occurrence of the query token */
    int64_t answer_pos; /* position whose next-token prediction is the first answer token */
    int64_t answer_len; /* answer tokens (value_len, or 1) */
    int64_t answer_src; /* where the answer tokens stand in the sequence: kv: answer_pos + 1 (the teacher-
                           forced value); bigram: key_pos + 1 (the successor in the context) */
} ps_query;

typedef struct {
    int64_t B, T;
    int32_t *tokens;   /* [B, T] */
    int32_t *targets;  /* [B, T], -1 where no loss */
    int64_t max_q;     /* queries per sequence */
    int64_t *n_q;      /* [B] */
    ps_query *queries; /* [B, max_q] */
} ps_batch;

/* Parse / validate / serialise. `source` names the file (and JSON path) in errors. */
int ps_task_from_json(json_t *obj, const char *source, ps_task *t, ps_error *err);
int ps_task_validate(const ps_task *t, int64_t vocab_size, int64_t max_seq_len, const char *source, ps_error *err);
json_t *ps_task_to_json(const ps_task *t);

int ps_batch_alloc(ps_batch *b, int64_t B, int64_t T, int64_t max_q, ps_error *err);
/* b restricted to sequences [i0, i0 + n) (pointers into b: nothing is copied). */
ps_batch ps_batch_view(const ps_batch *b, int64_t i0, int64_t n);
void ps_batch_free(ps_batch *b);

/* Fill b (allocated for B sequences of t->seq_len tokens) deterministically from seed. Returns 0, or -1
 * with err set when its scratch cannot be allocated (b is then unspecified). */
int ps_task_generate(const ps_task *t, uint64_t seed, ps_batch *b, ps_error *err);

/* Score queries against logits [B, T, V] (teacher-forced): the answer of a query is
 * tokens[answer_src .. + answer_len); correct[q] = every answer token is the top-1 over the full vocabulary; logprob[q] = sum of the answer tokens' log-probabilities. Arrays are
 * [B, max_q]. */
void ps_score_queries(const ps_batch *b, const float *logits, int64_t V, int *correct, double *logprob);

/* The answer rows of sequence s (query by query, answer token by answer token): their positions into
 * pos (may be NULL); returns their count. */
int64_t ps_answer_rows(const ps_batch *b, int64_t s, int64_t *pos);
/* The same scores as ps_score_queries for sequence s, from the logits of its answer rows only, in the
 * order ps_answer_rows lists them: rows [n, V]; correct and logprob are that sequence's [max_q]. */
void ps_score_query_rows(const ps_batch *b, int64_t s, const float *rows, int64_t V, int *correct, double *logprob);

#endif
