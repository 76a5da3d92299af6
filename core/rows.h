/* rows.h — the logits at the answer rows of a batch of prompts (ps_answer_rows order, core/batch.h),
 * handed over one sequence at a time: what the families' `rows` entry gives (core/runtime.h; serve, the
 * text-kv sweep and fillers score with it). The controlled model's: forward batches sized to a memory
 * budget, or the chunked prefill for a prompt too long or too large for one. */
#ifndef PS_ROWS_H
#define PS_ROWS_H

#include <stdint.h>

#include "core/batch.h"
#include "core/config.h"
#include "core/error.h"
#include "core/model.h"

/* Prompts longer than this run one at a time through the chunked prefill (core/prefill.h) in chunks of
 * PS_PREFILL_CHUNK tokens, with logits at the answer rows only (no [T, vocab] array); shorter ones in
 * batches through ps_forward (where hooks fire). */
#define PS_LONG_CONTEXT 4096
#define PS_PREFILL_CHUNK 2048

/* Text prompts: real vocabularies make [B, T, vocab] logits large (151,936 × 4 bytes per position for Qwen3), so text
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

#endif
