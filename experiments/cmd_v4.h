/* cmd_v4.h — `phasescope info` and `phasescope forward` for DeepSeek-V4 checkpoints (SPEC-v4.md). The
 * commands hand over to these when --model names a directory whose config.json is a DeepSeek-V4 config
 * (ps_v4_config_detect); everything else about them is unchanged. */
#ifndef PS_CMD_V4_H
#define PS_CMD_V4_H

#include <stdbool.h>

/* Does argv (a subcommand's) carry --model DIR with a DeepSeek-V4 DIR/config.json? */
bool ps_cli_v4_requested(int argc, char **argv);

int ps_cmd_v4_info(int argc, char **argv);
int ps_cmd_v4_forward(int argc, char **argv);

#endif
