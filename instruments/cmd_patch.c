/* cmd_patch.c — `phasescope patch`: activation patching of every (layer, head) cell from a corrupt run into the
 * clean one, on the caller's prompts. */
#include "instruments/instrument.h"

static int run(const ps_args *a, ps_error *err);

static const ps_flag_spec FLAGS[] = {
    {"--corrupt", "FILE",
     "the corrupt tokens: JSON lines {\"tokens\": [...]} (a prompt-set file serves: its other keys\n"
     "are not read), one per clean prompt in order, of the clean prompts' length",
     0},
    {"--layers", "LIST", "layers, e.g. 0,2-3 (default: all)", 0},
    {"--heads", "LIST", "KV heads (default: all); DeepSeek-V4 --target heads: query heads", 0},
    {"--target", "raw|compressed|both",
     "what a cell patches, as knockout's --target: raw (hook_k, hook_v; the default for full\n"
     "attention), compressed (hook_ck, hook_cv; the default for compressed models), both;\n"
     "DeepSeek-V4 checkpoints: heads, compressed (default), raw, indexer or sink",
     0},
    PS_INSTR_FLAGS,
    PS_V4_TASK_FLAG,
    PS_PROMPTS_FLAG,
    {0},
};

const ps_command ps_cmd_patch = {
    .name = "patch",
    .summary = "activation patching of every (layer, head) from a corrupt run, per residue",
    .description =
        "Activation patching (docs/prompt-sets.md, \"Activation patching\"; `patch.json`, the knockout's result schema):\n"
        "the clean prompts (--prompts FILE) and a corrupt version of each (--corrupt FILE: the same number of\n"
        "prompts and tokens). For every chosen layer l and head g, that head's entries of the target are\n"
        "replaced by the corrupt run's at the same positions, in the clean run (TransformerLens's\n"
        "get_act_patch_*, corrupt into clean: swap the files to patch clean into corrupt). Reports per\n"
        "(layer, head, residue) the accuracy and mean answer NLL of the patched run and their change against\n"
        "the clean run, beside the clean and corrupt runs' own; with alt, the logit differences and the\n"
        "normalised metric (patched - corrupt) / (clean - corrupt) (1: no effect, 0: the corrupt run's).\n"
        "The cells run as the knockout's do (batched, restarted at the layer where the model allows;\n"
        "--shard I/N and MPI ranks split them). Writes OUT/patch.json and its heatmap.\n",
    .flags = FLAGS,
    .run = run,
};

/* The flags are read and checked against the model by the instrument module (ps_patch_command,
 * instr_knockout.c, with the knockout's target, layer and head checks), the one call the C API's
 * ps_api_instrument makes through this table too. */
static int run(const ps_args *a, ps_error *err) { return ps_patch_command(a, err); }
