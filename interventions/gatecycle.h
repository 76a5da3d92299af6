/* gatecycle.h — gate offset cycling (SPEC §6): roll a layer's per-offset gate parameters (optionally
 * one KV head, one branch, and/or the per-offset payload maps) by k, so that a gate that peaked at offset
 * r peaks at r + k: u'_i = u_{(i-k) mod W}, c'_i = c_{(i-k) mod W}, C'_i = C_{(i-k) mod W}. */
#ifndef PS_GATECYCLE_H
#define PS_GATECYCLE_H

#include <stdint.h>

#include "error.h"
#include "model.h"

enum { PS_CYCLE_KEY = 1, PS_CYCLE_VALUE = 2 };          /* branch mask */
enum { PS_CYCLE_GATE = 1, PS_CYCLE_PAYLOAD = 2 };       /* parameter mask */

/* head = -1: every KV head. Errors (naming the flag) for a layer or head out of range, a full-attention
 * model, gates on a uniform-gate model, a shared payload. */
int ps_gate_cycle(ps_model *m, int layer, int head, int branches, int params, int64_t k, ps_error *err);

#endif
