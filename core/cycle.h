/* cycle.h — gate offset cycling (SPEC §6) as the families' own core entries (runtime.h: cycle.check, cycle,
 * cycle.meta), which interventions/' one gatecycle path (instruments/instr_gatecycle.c over
 * interventions/gatecycle.h) calls for every family. What a family cycles is its own: the controlled model rolls
 * a layer's per-offset gate parameters (optionally one KV head, one branch, and/or the per-offset payload
 * maps) by k, u'_i = u_{(i-k) mod W}, c'_i = c_{(i-k) mod W}, C'_i = C_{(i-k) mod W} (its channel attention:
 * the compressor's position bias rows, mod the rate); DeepSeek-V4 rolls a compressed layer's position bias
 * (ape) of its compressor and/or indexer. Every roll is the ps_roll_blocks op on the model's context (the
 * parameters never leave it); docs/hooks.md.
 *
 * A request (ps_cycle_req) is what gatecycle asked (its flags). The family's cycle.check checks it against
 * its model (its --branch and --params choices, its layer and head ranges, the cycle's preconditions,
 * whether it has the per-head measure; a usage error for a bad flag) and fills the masks; cycle rolls by k
 * (by 0 it checks and changes nothing); cycle.meta writes the family's keys of the instrument's meta: the
 * "cycle" block of gatecycle.json, "summary" (the line that says what was cycled), "summary_means" (whether
 * the line adds the two curves' mean accuracies) and the warning's hints "gates_without_payloads" and
 * optionally "near_chance_warning". */
#ifndef PS_CYCLE_H
#define PS_CYCLE_H

#include <jansson.h>
#include <stdint.h>

#include "core/error.h"
#include "core/model.h"
#include "core/runtime.h"
#include "core/v4/v4_model.h"

enum { PS_CYCLE_KEY = 1, PS_CYCLE_VALUE = 2 };          /* the controlled model's branch mask */
enum { PS_CYCLE_GATE = 1, PS_CYCLE_PAYLOAD = 2 };       /* the controlled model's parameter mask */
#define PS_V4_CYCLE_COMPRESSOR 1                        /* DeepSeek-V4's branch mask */
#define PS_V4_CYCLE_INDEXER 2

struct ps_cycle_req {
    int64_t layer, shift, head;  /* head -1: not given (every KV head) */
    const char *branch, *params; /* --branch, --params as given, or NULL (the family's defaults) */
    int save;                    /* --save was given */
    int per_head;                /* --measure knockout */
    const char *model_dir;       /* the checkpoint, for messages */
    const char *note;            /* without --model: what the default model is (messages; "" otherwise) */
    int branches, params_mask;   /* filled by cycle.check (the family's masks) */
};

/* The controlled model: head = -1 every KV head. Errors (naming the flag) for a layer or head out of range,
 * a full-attention model, gates on a uniform-gate model, a shared payload. */
int ps_gate_cycle(ps_model *m, int layer, int head, int branches, int params, int64_t k, ps_error *err);

/* DeepSeek-V4: roll layer's position bias (ape [m, c·d]: the only per-slot parameter of a V4 compressor; its
 * gate and kv projections are shared by the slots) by k rows, so the bias of token offset r in a window moves
 * to r + k (mod m), in both of CSA's series. branches: PS_V4_CYCLE_COMPRESSOR the attention's compressor,
 * PS_V4_CYCLE_INDEXER the indexer's (CSA layers), both (the indexer's only where the layer has one). The
 * weights must be loaded; on a lazily loaded model the cycled layer stays pinned in memory (until the model is
 * freed) so that the roll survives the forward's unloading. */
int ps_v4_gate_cycle(ps_v4_model *m, int layer, int branches, int64_t k, ps_error *err);

/* The families' entries (runtime.c's tables). The controlled model: branches key|value|both (PS_CYCLE_*),
 * params gate|payload|all (default: every per-offset parameter the model has), the per-head measure on
 * compressed models. DeepSeek-V4: branches compressor|indexer|both, params gate only, no --head, --save or
 * per-head measure. */
int ps_model_cycle_check(const ps_runtime *rt, ps_cycle_req *q, ps_error *err);
int ps_model_cycle(const ps_runtime *rt, const ps_cycle_req *q, int64_t k, ps_error *err);
int ps_model_cycle_meta(const ps_runtime *rt, const ps_cycle_req *q, json_t *meta, ps_error *err);
int ps_v4_cycle_check(const ps_runtime *rt, ps_cycle_req *q, ps_error *err);
int ps_v4_cycle(const ps_runtime *rt, const ps_cycle_req *q, int64_t k, ps_error *err);
int ps_v4_cycle_meta(const ps_runtime *rt, const ps_cycle_req *q, json_t *meta, ps_error *err);

#endif
