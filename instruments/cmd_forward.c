/* cmd_forward.c — `phasescope forward`: the export path (SPEC §7), a client of the public C API
 * (include/phasescope.h: ps_api_open_ex, ps_api_run_with_cache), so the CLI and every binding run the same
 * code: each sequence of T.json runs on its own (batch of one); writes logits.{i} [T_i, vocab] and
 * {hook}.{i} (batch dimension dropped), the hook names checked against the family's point table
 * (docs/hooks.md; `phasescope info` lists them). DeepSeek-V4 checkpoints also take --layers 0..L (stop
 * early: no logits, hooks past L refused) and --lazy (one layer's weights in memory at a time). The flags go
 * into a request and one call, ps_forward_command (instruments/exec_forward.c), does the rest. */
#include "instruments/command.h"
#include "instruments/commands.h"

static int run(const ps_args *args, ps_error *err);

static const ps_flag_spec FLAGS[] = {
    {"--model", "DIR", "checkpoint directory (config.json + model.safetensors); default: shipped model", 0},
    {"--tokens", "T.json", "token sequences", 1},
    {"--hooks", "NAMES", "hook points to export (see docs/hooks.md)", 0},
    {"--out", "OUT.safetensors", "output safetensors file (written atomically)", 1},
    {"--layers", "0..L", "DeepSeek-V4 only: run layers 0..L and stop (probes that stop early)", 0},
    {"--lazy", NULL, "DeepSeek-V4 only: load each layer's weights when it runs (models larger than memory)", 0},
    PS_BACKEND_FLAG,
    {0},
};

const ps_command ps_cmd_forward = {
    .name = "forward",
    .summary = "run token sequences; write logits and chosen hooks to safetensors",
    .description = "Runs every sequence of T.json (a JSON list of token-id lists) on its own and writes\n"
                   "logits.{i} [T_i, vocab] and, for each hook in NAMES (comma-separated, e.g.\n"
                   "blocks.1.attn.hook_q,blocks.0.hook_resid_post), {hook}.{i} with the batch dimension dropped.\n",
    .flags = FLAGS,
    .run = run,
};

/* --layers is parsed by the module, after --model is resolved (the order of the errors). */
static int run(const ps_args *args, ps_error *err) {
    ps_forward_req r = {.model = ps_args_get(args, "--model"),
                        .tokens = ps_args_get(args, "--tokens"),
                        .hooks = ps_args_get(args, "--hooks"),
                        .out = ps_args_get(args, "--out"),
                        .layers = ps_args_get(args, "--layers"),
                        .lazy = ps_args_has(args, "--lazy"),
                        .backend = ps_args_backend(args)};
    return ps_forward_command(&r, err);
}
