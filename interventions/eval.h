/* eval.h — scoring prompts on the controlled model: shifted prompts in forward batches with hooks (long
 * ones one at a time through the chunked prefill), and text prompts in batches sized to a memory budget,
 * their answer rows handed over sequence by sequence (ps_eval_rows: what sweep --task text-kv, fillers and
 * serve score with). The one batching loop of the controlled model's instruments; DeepSeek-V4's is its
 * family's score (core/runtime.c). */
#ifndef PS_EVAL_H
#define PS_EVAL_H

#include <stdint.h>

#include "core/batch.h"
#include "core/config.h"
#include "core/error.h"
#include "core/hooks.h"
#include "core/model.h"
#include "interventions/shifted.h"

/* Prompts longer than this run one at a time through the chunked prefill (core/prefill.h) in chunks of
 * PS_PREFILL_CHUNK tokens, with logits at the answer rows only (no [T, vocab] array); shorter ones in
 * batches through ps_forward (where hooks fire). */
#define PS_LONG_CONTEXT 4096
#define PS_PREFILL_CHUNK 2048

/* Run the shifted prompts through the model in batches of `batch` (hooks may be NULL); per-query
 * outcomes go to correct / logprob ([N · max_q]). */
int ps_eval_shifted(const ps_model *m, const ps_shifted *s, int64_t batch, const ps_hooks *hooks, int *correct,
                    double *logprob, ps_error *err);

/* ---- text prompts (interventions/textkv.h, interventions/fillers.h) ----
 * Real vocabularies make [B, T, vocab] logits large (151,936 × 4 bytes per position for Qwen3), so text
 * prompts are run in batches sized to a memory budget, and a prompt whose activations alone exceed it
 * goes through the chunked prefill like a long one. */
#define PS_EVAL_MEM_DEFAULT ((double)(1 << 30))
/* Sequences of T tokens per forward batch (at most want) whose activations fit mem_bytes (0: the
 * default, 1 GiB); 0 when T > PS_LONG_CONTEXT or one sequence alone does not fit (use the prefill). */
int64_t ps_eval_batch_fit(const ps_config *c, int64_t T, int64_t want, double mem_bytes);
/* The logits at the answer rows of every sequence of b (ps_answer_rows order), handed to fn one sequence
 * at a time: rows [n, V]. Batches as ps_eval_batch_fit says, else the chunked prefill, which runs each
 * sequence only up to its last answer row. Stops at fn's first failure. */
typedef int (*ps_rows_fn)(const ps_batch *b, int64_t s, const float *rows, int64_t n, void *user, ps_error *err);
int ps_eval_rows(const ps_model *m, const ps_batch *b, int64_t batch, double mem_bytes, ps_rows_fn fn, void *user,
                 ps_error *err);
/* ps_eval_shifted without hooks, batched by ps_eval_batch_fit (the same outcomes, per query). */
int ps_eval_shifted_fit(const ps_model *m, const ps_shifted *s, int64_t batch, double mem_bytes, int *correct,
                        double *logprob, ps_error *err);

#endif
