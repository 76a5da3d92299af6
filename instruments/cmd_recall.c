/* cmd_recall.c — `phasescope recall`: selection recall per phase residue (interventions/recall.h). */
#include "instruments/instrument.h"

static int run(const ps_args *a, ps_error *err);

static const ps_flag_spec FLAGS[] = {
    {"--layers", "LIST", "layers, e.g. 0,2-3 (default: every layer that selects blocks)", 0},
    {"--mode", "pad|move", "the task's sweep: pad (default) or move", 0},
    {"--needle-offset", "K",
     "the needle is the query's key position t_K + K (default 0: the key's first token; a prompt\n"
     "set's \"needle\" + K)",
     0},
    PS_INSTR_FLAGS,
    PS_V4_TASK_FLAG,
    PS_PROMPTS_FLAG,
    {0},
};

const ps_command ps_cmd_recall = {
    .name = "recall",
    .summary = "selection recall per residue: is the needle's block among the blocks each KV head attends",
    .description =
        "Selection recall (docs/recall.md, `recall.json`) on a model that selects blocks (the select attention kind,\n"
        "MiniCPM4 checkpoints): the sweep's prompts are run and, at every scored query's row, each layer's KV head's\n"
        "selected blocks (hook_blocks) are read: the needle's block (the block of the key position t_K + K) found\n"
        "by score, forced (an initial block, the query's own block or a local one), or missed. Reports per (layer,\n"
        "KV head, residue) the recall with its Wilson interval, per layer the share found by any head, and the\n"
        "accuracy per residue of the same forwards (the sweep's statistics). Writes OUT/recall.json and recall.png.\n"
        "--prompts FILE: your own prompts, each with a \"needle\" position (docs/prompt-sets.md).\n",
    .flags = FLAGS,
    .run = run,
};

/* The flags are read and checked against the model by the instrument module (ps_recall_command, instr_recall.c). */
static int run(const ps_args *a, ps_error *err) { return ps_recall_command(a, err); }
