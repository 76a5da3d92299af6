/* cmd_sweep.c — `phasescope sweep`: accuracy per phase residue under prefix padding or move mode. */
#include <string.h>

#include "instruments/instrument.h"

static int run(const ps_args *a, ps_error *err);

static const ps_flag_spec FLAGS[] = {
    {"--mode", "pad|move", "pad (default) or move", 0},
    {"--task", "model|text-kv|FILE.json",
     "model (default): the task stored in the checkpoint; text-kv: key-value pairs\n"
     "written as text with --tokenizer (docs/text-experiments.md). A model trained on\n"
     "text-kv runs the text-kv sweep with either, its stored layout as the defaults.\n"
     "DeepSeek-V4 checkpoints: FILE.json, the prompts' task and token ids\n"
     "(docs/results-schema.md, \"DeepSeek-V4\"; default DIR/phasescope_task.json)",
     0},
    {"--tokenizer", "FILE", "text-kv: the model's tokenizer.json (default: the one a text-kv model trained with)", 0},
    {"--pairs", "N", "text-kv: key-value pairs per prompt (default 8)", 0},
    {"--words", "FILE", "text-kv: key words, one per line (default data/text/kv_keys.txt)", 0},
    {"--values", "numbers|words", "text-kv: values are 4-digit numbers (default) or words from --words", 0},
    {"--value-digits", "D", "text-kv: digits of a number value (default 4; 1-9): 5 gives 90,000 distinct values", 0},
    PS_INSTR_FLAGS,
    PS_PROMPTS_FLAG,
    {"--save-prompts", "FILE",
     "also write the sweep's prompts as a prompt set (JSON lines, one per scored query, in the\n"
     "model's token ids, padded after the query to one length): a template for --prompts",
     0},
    {0},
};

const ps_command ps_cmd_sweep = {
    .name = "sweep",
    .summary = "phase sweep: accuracy per residue (prefix padding or move mode)",
    .description =
        "Phase sweep (docs/results-schema.md). pad: for each shift p = 0..P-1, p filler tokens go right after BOS; move: the\n"
        "queried pair moves (p fillers before it, P-1-p after it), the prompt length stays fixed. Each query's\n"
        "phase coordinate is rho = t_K mod P (t_K: position of the queried key's first token). Reports per rho:\n"
        "n, accuracy (top-1 over the vocabulary), 95% Wilson interval, mean target log-prob; overall mean, min\n"
        "and gap (pp); a chi-square test of accuracy against residue and the verdict: phase sensitive when\n"
        "p < 0.01 and the gap is at least 5 pp; only then the curve's periods are given: the repeat period (the\n"
        "smallest divisor d of P whose folding, the curve averaged over residues congruent mod d, explains 75% of\n"
        "its variance) and the DFT's dominant period (the JSON's repeat_period.period and dominant_period.period\n"
        "are null otherwise). Writes OUT/sweep.json.\n"
        "--task text-kv: the prompts are text (docs/text-experiments.md): --pairs lines \"The value of KEY is\n"
        "VALUE.\", a question for one key, the value teacher-forced as the answer (every answer token must be\n"
        "the top-1); pad inserts p tokens of filler text (--family NAME of data/text/fillers.json, default prose)\n"
        "before the pairs, move puts them around the queried pair; rho = t_K mod P, t_K the key's first token\n"
        "in its pair line. Prompts longer than 4096 tokens run through the chunked prefill.\n"
        "--prompts FILE: your own prompts (docs/prompt-sets.md), each scored at its query position against its\n"
        "answer and counted at its residue; with alt, the mean logit difference answer - alt per residue too.\n",
    .flags = FLAGS,
    .run = run,
};

/* The flags; the run is ps_sweep_command (instr_sweep.c). */
static int run(const ps_args *a, ps_error *err) {
    static const char *const MODES[] = {"pad", "move", NULL};
    static const char *const VALUES[] = {"numbers", "words", NULL};
    static const char *const TEXT_ONLY[] = {"--tokenizer", "--pairs", "--words", "--values", "--value-digits", NULL};
    static const char *const TASKS[] = {"model", "text-kv", NULL};
    int mi = 0, ti = 0;
    ps_sweep_request rq = {.task = ps_args_get(a, "--task"), .save_prompts = ps_args_get(a, "--save-prompts"), .tokenizer = ps_args_get(a, "--tokenizer"), .words = ps_args_get(a, "--words"),
                           .values = -1, .pairs = -1, .value_digits = -1};
    if (ps_args_choice(a, "--mode", MODES, &mi, err) || ps_args_choice(a, "--values", VALUES, &rq.values, err) ||
        ps_args_int(a, "--pairs", 1, 100000, &rq.pairs, err) || ps_args_int(a, "--value-digits", 1, 9, &rq.value_digits, err))
        return 1;
    /* a --task value that names no file is one of the two */
    if (rq.task && !strchr(rq.task, '.') && ps_args_choice(a, "--task", TASKS, &ti, err)) return 1;
    rq.mode = mi ? PS_SWEEP_MOVE : PS_SWEEP_PAD;
    rq.mode_given = ps_args_has(a, "--mode");
    for (int i = 0; TEXT_ONLY[i] && !rq.text_only_flag; i++)
        if (ps_args_has(a, TEXT_ONLY[i])) rq.text_only_flag = TEXT_ONLY[i];
    return ps_sweep_command(a, &rq, err) ? 1 : 0;
}
