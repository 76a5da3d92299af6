/* cmd_grad.c — `phasescope grad` (SPEC §7): the mean next-token cross-entropy over every target position
 * of every sequence, and its gradient for every checkpoint tensor, to a safetensors file. The flags go into a
 * request and one call, ps_grad_command (instruments/exec_grad.c), does the work. */
#include "instruments/command.h"
#include "instruments/commands.h"

static int run(const ps_args *args, ps_error *err);

static const ps_flag_spec FLAGS[] = {
    {"--model", "DIR", "checkpoint directory (default: the shipped model)", 0},
    {"--tokens", "T.json", "token sequences", 1},
    {"--targets", "Y.json", "targets, same shape as the tokens", 1},
    {"--out", "GRADS.safetensors", "output safetensors file (written atomically)", 1},
    PS_BACKEND_FLAG,
    {0},
};

const ps_command ps_cmd_grad = {
    .name = "grad",
    .summary = "mean cross-entropy and its gradient for every tensor, to safetensors",
    .description = "Runs every sequence of T.json on its own; Y.json has the same shape, with the target token id\n"
                   "of each position or -1 / null where a position has no target. Writes `loss` (shape [1]: mean\n"
                   "cross-entropy over all target positions of all sequences) and the gradient of that loss for every\n"
                   "checkpoint tensor, under the tensor's own name.\n",
    .flags = FLAGS,
    .run = run,
};

static int run(const ps_args *args, ps_error *err) {
    ps_grad_req r = {.model = ps_args_get(args, "--model"),
                     .tokens = ps_args_get(args, "--tokens"),
                     .targets = ps_args_get(args, "--targets"),
                     .out = ps_args_get(args, "--out"),
                     .backend = ps_args_backend(args)};
    return ps_grad_command(&r, err);
}
