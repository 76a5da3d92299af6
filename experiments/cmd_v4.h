/* cmd_v4.h — the per-channel gates of `phasescope gates` on a phasescope model with the channel attention
 * (experiments/cmd_v4_instr.c). `info` and `forward` on DeepSeek-V4 checkpoints go through the family
 * interface (core/runtime.h) like every other checkpoint. */
#ifndef PS_CMD_V4_H
#define PS_CMD_V4_H

#include <stdbool.h>
#include <stdint.h>

#include "experiments/cli.h"
#include "core/error.h"
#include "experiments/instrument.h"

/* `phasescope gates` on a phasescope model with the channel attention (per-channel gates, gates/chgates.h):
 * in is the set-up instrument; log (may be NULL) a train.jsonl whose per-channel gate records are
 * summarised. */
int ps_v4_model_gates(ps_instr *in, const char *log, ps_error *err);

#endif
