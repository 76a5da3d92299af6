/* cmd_knockout.c — `phasescope knockout`: the mean-replacement KV-head knockout grid. */
#include "instruments/instrument.h"

static int run(const ps_args *a, ps_error *err);

static const ps_flag_spec FLAGS[] = {
    {"--layers", "LIST", "layers, e.g. 0,2-3 (default: all)", 0},
    {"--heads", "LIST", "KV heads (default: all); DeepSeek-V4 --target heads: query heads", 0},
    {"--target", "raw|compressed|both",
     "compressed (default for compressed models): hook_ck and hook_cv; raw (default for\n"
     "full attention): hook_k and hook_v; both. DeepSeek-V4 checkpoints: heads, compressed\n"
     "(default), raw, indexer or sink (docs/results-schema.md). MiniCPM4 checkpoints: raw or\n"
     "compressed (hook_ck, the pooled keys that choose the blocks; default where the prompts\n"
     "take the sparse path; docs/minicpm.md)",
     0},
    {"--method", "exact|atp",
     "exact (default): a forward per cell; atp: attribution patching, every cell estimated from one\n"
     "backward per batch (docs/attribution.md; the controlled model)",
     0},
    {"--atp-fix", "none|qk",
     "atp: none (default: gradient x difference at the replaced entries) or qk (the patched head's\n"
     "attention recomputed exactly, the rest linear; full and compressed attention)",
     0},
    {"--verify", "K", "atp: then the exact knockout of the K cells with the largest estimated effect", 0},
    PS_INSTR_FLAGS,
    PS_V4_TASK_FLAG,
    PS_PROMPTS_FLAG,
    {0},
};

const ps_command ps_cmd_knockout = {
    .name = "knockout",
    .summary = "mean-replacement KV-head knockout grid, per residue",
    .description =
        "Mean-replacement KV-head knockout (docs/results-schema.md, `knockout.json`): for every chosen layer l and KV head g, that head's entries\n"
        "are replaced by their mean over the evaluation prompts of the same shift, position by position, and the\n"
        "prefix-padding sweep is run. Reports per (layer, head, residue) the change in accuracy (pp) and in mean\n"
        "target NLL against the clean run, and each head's worst residue (the largest accuracy drop). Writes\n"
        "OUT/knockout.json. --method atp estimates every cell's NLL change from gradients instead (no\n"
        "accuracy), --verify K then runs the K cells that matter most exactly.\n"
        "--prompts FILE: the grid on your own prompts (docs/prompt-sets.md): each entry of the target replaced by\n"
        "its mean over the N prompts, position by position; with alt, logit differences beside the NLL.\n",
    .flags = FLAGS,
    .run = run,
};

/* The flags are read and checked against the model by the instrument module (ps_knockout_command,
 * instr_knockout.c: the set-up, the target, the layer and head lists sized to the model, the method), the one
 * call the C API's ps_api_instrument makes through this table too. */
static int run(const ps_args *a, ps_error *err) { return ps_knockout_command(a, err); }
