/* cmd_v4.h — `phasescope info` and `phasescope forward` for DeepSeek-V4 checkpoints (SPEC-v4.md). The
 * commands hand over to these when --model names a directory whose config.json is a DeepSeek-V4 config
 * (ps_v4_config_detect); everything else about them is unchanged. */
#ifndef PS_CMD_V4_H
#define PS_CMD_V4_H

#include <stdbool.h>
#include <stdint.h>

#include "experiments/cli.h"
#include "core/error.h"

/* The commands' work, independent of how the command line was parsed: dir is the checkpoint (resolved),
 * the rest the flags' values (NULL when absent). They print their output and return 0, or -1 with err
 * set (err->usage for a bad flag value). */
int ps_v4_cmd_info(const char *dir, int64_t B, ps_error *err);
int ps_v4_cmd_forward(const char *dir, const char *tokens, const char *hooks, const char *out, const char *layers, int lazy,
                      ps_error *err);

#endif
