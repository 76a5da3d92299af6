/* cmd_gates.c — `phasescope gates`: effective offsets of every gate, and how they formed in training. */
#include "instruments/instrument.h"

static int run(const ps_args *a, ps_error *err);

static const ps_flag_spec FLAGS[] = {
    {"--log", "RUN/train.jsonl", "a train.jsonl to summarise", 0},
    PS_INSTR_FLAGS,
    PS_V4_TASK_FLAG,
    {0},
};

const ps_command ps_cmd_gates = {
    .name = "gates",
    .summary = "gate concentration: effective offsets per layer, KV head and branch",
    .description =
        "Gate concentration (docs/results-schema.md, `gates.json`), pooled over every window of the evaluation\n"
        "prompts (shift 0): per layer, KV head and branch, mean_gate (a distribution over the W offsets), N_static = exp(H(mean_gate)),\n"
        "N_input = E[exp(H(alpha))], the peak offset, and a label: static (N_static <= 2 and N_input <= 2),\n"
        "input-dependent (N_input <= 2 < N_static) or diffuse (N_input > 2). With --log, also how these evolved\n"
        "over the gate records of a training log. Writes OUT/gates.json. DeepSeek-V4 checkpoints and the channel attention:\n"
        "per-channel gates, per channel and pooled (docs/results-schema.md, \"Per-channel gates\").\n",
    .flags = FLAGS,
    .run = run,
};

/* The flags; the run is ps_gates_command (instr_gates.c). */
static int run(const ps_args *a, ps_error *err) {
    ps_gates_request rq = {.log = ps_args_get(a, "--log")};
    return ps_gates_command(a, &rq, err) ? 1 : 0;
}
