/* eval.h — scoring prompts on the controlled model: shifted prompts in forward batches with hooks (long
 * ones one at a time through the chunked prefill), and text prompts in batches sized to a memory budget,
 * their answer rows handed over sequence by sequence (ps_eval_rows, core/rows.h: what sweep --task text-kv,
 * fillers and, through the family table, serve score with). The one batching loop of the controlled model's instruments; DeepSeek-V4's is its
 * family's score (core/runtime.c). */
#ifndef PS_EVAL_H
#define PS_EVAL_H

#include <stdint.h>

#include "core/batch.h"
#include "core/config.h"
#include "core/error.h"
#include "core/hooks.h"
#include "core/model.h"
#include "core/rows.h"
#include "core/runtime.h"
#include "interventions/shifted.h"

/* Run the shifted prompts through the model in batches of `batch` (hooks may be NULL); per-query
 * outcomes go to correct / logprob ([N · max_q]). */
int ps_eval_shifted(const ps_model *m, const ps_shifted *s, int64_t batch, const ps_hooks *hooks, int *correct,
                    double *logprob, ps_error *err);

/* Any family: prompts b (the task's token ids) through the family's score in batches of `batch`, each token
 * (and answer) mapped through rt->token_map first when the instruments set one (a checkpoint whose prompts
 * come from a task file with "ids"); per-query outcomes into correct / logprob ([b->B · max_q]). What every
 * instrument evaluates with: the controlled model's score is ps_eval_shifted's loop (long prompts through the
 * prefill), DeepSeek-V4's its one batching loop. */
int ps_eval_mapped(const ps_runtime *rt, const ps_batch *b, int64_t batch, const ps_hooks *hooks, int *correct, double *logprob,
                   ps_error *err);

/* ps_eval_shifted without hooks, batched by ps_eval_batch_fit (the same outcomes, per query). */
int ps_eval_shifted_fit(const ps_model *m, const ps_shifted *s, int64_t batch, double mem_bytes, int *correct,
                        double *logprob, ps_error *err);

#endif
