/* cmd_fillers.c — `phasescope fillers`: a text prompt with a filler of L tokens, candidate continuations
 * scored per filler family and L, Δ against the phase L mod P and its periodicity test
 * (docs/text-experiments.md). */
#include "instruments/instrument.h"

static int run(const ps_args *a, ps_error *err);

static const ps_flag_spec FLAGS[] = {
    {"--model", "DIR", "the checkpoint (its vocabulary must be the tokenizer's)", 1},
    {"--tokenizer", "FILE", "the model's tokenizer.json (docs/tokenizers.md)", 1},
    {"--experiment", "FILE", "the experiment (docs/text-experiments.md; examples in experiments/configs/text/)", 1},
    {"--period", "P", "phase period (default: the experiment's \"period\", else the model's stride S; 8 for\nfull attention)", 0},
    {"--batch", "B", "sequences per forward batch (default 8; fewer when their logits would exceed 1 GiB)", 0},
    {"--out", "DIR", "where fillers.json and fillers.png go (default out/fillers)", 0},
    PS_BACKEND_FLAG,
    {0},
};

const ps_command ps_cmd_fillers = {
    .name = "fillers",
    .summary = "text filler experiment: candidate probabilities against the filler length's phase",
    .description =
        "Runs a text experiment (docs/text-experiments.md): for each filler family and each length L of the\n"
        "experiment's range, the prompt is the template with the family's text cut to exactly L tokens of this\n"
        "tokenizer in its slot (optionally wrapped in a chat template); each candidate continuation is scored\n"
        "teacher-forced (its probability is the product of its tokens' probabilities). Reports per family and\n"
        "L: every candidate's probability, delta = P(first) - P(second), the phase L mod P and the top-1 token;\n"
        "per family and pooled, a permutation test of the between-residue variance of delta (eta squared,\n"
        "after removing a linear trend in L). Writes OUT/fillers.json and OUT/fillers.png (delta against L,\n"
        "residues marked, families side by side).\n",
    .flags = FLAGS,
    .run = run,
};

/* the flags, checked and run by the fillers module (instr_fillers.c) */
static int run(const ps_args *a, ps_error *err) { return ps_fillers_command(a, err); }
