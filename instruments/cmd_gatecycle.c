/* cmd_gatecycle.c — `phasescope gatecycle`: roll per-offset gate parameters, sweep before and after. The
 * flags; the run is ps_gatecycle_command (instr_gatecycle.c). */
#include "scaleout/dist.h"
#include "instruments/instrument.h"
#include "interventions/gatecycle.h"
#include "viz/results_check.h"

static int run(const ps_args *a, ps_error *err);

static const ps_flag_spec FLAGS[] = {
    {"--layer", "L", "layer to cycle (required)", 1},
    {"--shift", "K", "offsets to roll by (required; any integer, taken mod W)", 1},
    {"--head", "G", "one KV head (default: all)", 0},
    {"--branch", "key|value|both", "key, value or both (default both); DeepSeek-V4 checkpoints: compressor, indexer\n"
                                   "or both (their position biases)", 0},
    {"--params", "gate|payload|all",
     "gate, payload or all (default: all the model has: gates and per-offset payloads move\n"
     "together; rolling the gates alone of a per-offset-payload model breaks every head)",
     0},
    {"--save", "DIR", "also write the cycled checkpoint to DIR", 0},
    {"--measure", "sweep|knockout",
     "sweep (default): the curves and their dips; knockout: also each cycled head's knockout\n"
     "profile before and after, and how far its residue moved (shift - K per head)",
     0},
    {"--min-hurt", "PP", "knockout measure: the smallest accuracy drop (pp) that makes a residue a head's own (default 10)", 0},
    PS_INSTR_FLAGS,
    PS_V4_TASK_FLAG,
    {0},
};

const ps_command ps_cmd_gatecycle = {
    .name = "gatecycle",
    .summary = "roll a layer's per-offset gate parameters; sweep before and after",
    .description =
        "Gate offset cycling (docs/results-schema.md, `gatecycle.json`): rolls layer L's per-offset parameters by\n"
        "K (u'_i = u_{(i-K) mod W}, c'_i likewise, and with --params payload|all the per-offset payload maps C'_i),\n"
        "so a head that read offset r reads offset r+K; runs the prefix-padding sweep before and after and reports\n"
        "both curves, the cycled heads, where each dip of the clean curve moved (residue before -> after), and the\n"
        "best-aligning shift s (maximising the correlation of A_after(rho) with A_before(rho - s mod P), leaving out\n"
        "residues near chance in both curves), also signed in (-P/2, P/2]. Warns when the cycled curve is near\n"
        "chance (the cycled heads stopped working). With --measure knockout, also knocks out each cycled head before\n"
        "and after cycling (mean replacement of its compressed entries) and reports, per head, where the residue\n"
        "its knockout hurts most moved (and the best circular cross-correlation shift of its profile), minus K,\n"
        "leaving out residues near chance before and after; `per_head` in gatecycle.json. Writes OUT/gatecycle.json.\n",
    .flags = FLAGS,
    .run = run,
};

/* The flags every family takes, parsed; the family checks the rest against its model (instr_gatecycle.c). */
static int run(const ps_args *a, ps_error *err) {
    static const char *const MEASURES[] = {"sweep", "knockout", NULL};
    ps_gatecycle_request rq = {.head = -1, .branch = ps_args_get(a, "--branch"), .params = ps_args_get(a, "--params"),
                               .save = ps_args_get(a, "--save"), .min_hurt = PS_HEAD_MIN_HURT_PP};
    int bad = ps_args_int(a, "--layer", -PS_RESULT_MAX_SHIFT, PS_RESULT_MAX_SHIFT, &rq.layer, err) ||
              ps_args_int(a, "--shift", -PS_RESULT_MAX_SHIFT, PS_RESULT_MAX_SHIFT, &rq.shift, err) ||
              ps_args_int(a, "--head", 0, PS_RESULT_MAX_SHIFT, &rq.head, err) ||
              ps_args_choice(a, "--measure", MEASURES, &rq.measure_knockout, err) ||
              ps_args_positive(a, "--min-hurt", 100, &rq.min_hurt, err);
    if (ps_dist_agree(bad ? -1 : 0, err)) return 1;
    return ps_gatecycle_command(a, &rq, err) ? 1 : 0;
}
