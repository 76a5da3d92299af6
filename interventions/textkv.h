/* textkv.h — the phase sweep's text key-value prompts (`phasescope sweep --task text-kv`, pad and move
 * modes; docs/text-experiments.md). The prompt builder itself (ps_textkv, ps_textkv_prompt, the training
 * batches) is text/textkv_prompt.h, shared with the "text-kv" training task (text/textkv_task.h). */
#ifndef PS_TEXTKV_H
#define PS_TEXTKV_H

#include <stdint.h>

#include "interventions/sweep.h"
#include "text/textkv_prompt.h"

/* The prompts of shift p of a phase sweep with period P: N prompts (prompt i from seed and i), pad mode
 * pre = p, move mode before = p, after = P − 1 − p (the length is the same for every p). Prompts are
 * padded at the end with pad_id to the longest (never read: attention is causal). residue: pad mode
 * every query's t_K mod P, move mode the first query's (the others −1). Errors when the longest prompt
 * exceeds max_seq_len. */
int ps_textkv_shifted(const ps_textkv *kv, ps_sweep_mode mode, int64_t P, int64_t p, uint64_t seed, int64_t N,
                      int64_t max_seq_len, ps_shifted *out, ps_error *err);

#endif
