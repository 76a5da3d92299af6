/* cmd_info.c — `phasescope info`: the checkpoint's family describes it (the config, parameter counts by
 * group, KV-cache bytes per token, memory estimates: ps_family.describe), then its hook-point table (name
 * pattern, shape, head axis, the layers that have it) and the compute environment. The flags go into a
 * request and one call, ps_info_command (instruments/exec_info.c), prints it all. */
#include "instruments/command.h"
#include "instruments/commands.h"

static int run(const ps_args *a, ps_error *err);

static const ps_flag_spec FLAGS[] = {
    {"--model", "DIR", "checkpoint directory (default: the shipped model)", 0},
    {"--batch", "B", "batch size for the memory estimates", 0},
    PS_BACKEND_FLAG,
    {0},
};

const ps_command ps_cmd_info = {
    .name = "info",
    .summary = "config, parameters, KV-cache bytes per token, memory estimates",
    .description = "Prints the model's config, parameter counts by group, the KV-cache bytes per token of the\n"
                   "compressed cache versus a full-attention cache of the same shape, and the memory a forward pass\n"
                   "and a training step at max_seq_len would need (for a batch of B sequences, default 1), and the\n"
                   "model's hook points: name pattern, shape, head axis and the layers that have each (docs/hooks.md).\n",
    .flags = FLAGS,
    .run = run,
};

static int run(const ps_args *a, ps_error *err) {
    ps_info_req r = {.model = ps_args_get(a, "--model"), .batch = 1, .backend = ps_args_backend(a)};
    if (ps_args_int(a, "--batch", 1, 1 << 20, &r.batch, err)) return -1;
    return ps_info_command(&r, err);
}
