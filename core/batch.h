/* batch.h — a batch of token sequences with scored answer rows: the runtime's unit of input. Each
 * sequence has queries (an answer of answer_len tokens whose first next-token prediction is at answer_pos);
 * the model families score those rows (top-1 over the vocabulary, summed log-probabilities). Built by the
 * synthetic tasks (tasks/tasks.h), the text key-value prompts (text/textkv_prompt.h) and the sweeps. */
#ifndef PS_BATCH_H
#define PS_BATCH_H

#include <stdint.h>

#include "core/error.h"

/* One query of a generated sequence. */
typedef struct {
    int64_t key_pos;    /* kv: position of the queried key's first token in the context (t_K);
                           bigram: position of the earlier occurrence of the query token */
    int64_t answer_pos; /* position whose next-token prediction is the first answer token */
    int64_t answer_len; /* answer tokens (value_len, or 1) */
    int64_t answer_src; /* where the answer tokens stand in the sequence: kv: answer_pos + 1 (the teacher-
                           forced value); bigram: key_pos + 1 (the successor in the context); -1: the
                           answer is answer_id (one token, not in the sequence: a caller's prompt set) */
    int32_t answer_id;  /* the answer token when answer_src is -1 */
} ps_query;

/* Answer token k of query q of the sequence seq: seq[answer_src + k], or the given answer_id. */
static inline int32_t ps_query_answer(const ps_query *q, const int32_t *seq, int64_t k) {
    return q->answer_src < 0 ? q->answer_id : seq[q->answer_src + k];
}

typedef struct {
    int64_t B, T;
    int32_t *tokens;   /* [B, T] */
    int32_t *targets;  /* [B, T], -1 where no loss */
    int64_t max_q;     /* queries per sequence */
    int64_t *n_q;      /* [B] */
    ps_query *queries; /* [B, max_q] */
} ps_batch;

int ps_batch_alloc(ps_batch *b, int64_t B, int64_t T, int64_t max_q, ps_error *err);
/* b restricted to sequences [i0, i0 + n) (pointers into b: nothing is copied). */
ps_batch ps_batch_view(const ps_batch *b, int64_t i0, int64_t n);
void ps_batch_free(ps_batch *b);

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
