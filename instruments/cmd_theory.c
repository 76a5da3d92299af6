/* cmd_theory.c — `phasescope theory`: trains the idealised bigram-induction model of SPEC §1
 * (docs/theory.md) by gradient descent from a small random init, records its gates at log-spaced steps
 * and writes OUT/theory.json and OUT/theory.png. This file reads the flags into the options and makes one
 * call, ps_theory_command (instruments/instr_theory.c: the records, the result and its figure); the model,
 * its exact loss and gradients live in gates/theory.c, the training loop, the summary of the gates and the
 * gradient check in gates/theory_train.c. */
#include "instruments/instrument.h"
#include "gates/theory_train.h"

static int run(const ps_args *a, ps_error *err);

static const ps_flag_spec FLAGS[] = {
    {"--heads", "H", "heads (default 7 = S - 1: one per phase a head can answer)", 0},
    {"--window", "S", "chunk length W = S (default 8)", 0},
    {"--chunks", "C", "chunks of context (default 8)", 0},
    {"--vocab", "N", "tokens (default 128, >= C·S)", 0},
    {"--steps", "K", "gradient steps (default 1e5)", 0},
    {"--lr", "X", "learning rate (default 1)", 0},
    {"--temperature", "L", "score scale lambda = logit scale mu (default 8): fixed, or the starting value", 0},
    {"--learn-temperature", NULL, "learn log lambda and log mu by gradient descent too (no ceiling)", 0},
    {"--boundary", NULL,
     "also ask the queries at phase S - 1, whose successor lies in the next chunk (no\n"
     "head can answer them with key r, value r + 1); default: phases 0 .. S - 2 only,\n"
     "the theorem's setting, every successor in its query's chunk",
     0},
    {"--batch", "B",
     "0 (default): the exact population gradient (gradient descent on the expected\n"
     "loss); B > 0: B query positions sampled per step (stochastic gradient)",
     0},
    {"--records", "R", "log-spaced records of the gates (default 80)", 0},
    {"--seed", "S", "seed of the init (and of the sampled positions), default 0", 0},
    {"--out", "DIR", "default out/theory", 0},
    {"--check-grad", NULL,
     "compare the exact gradient (gates and both log-temperatures) with central finite\n"
     "differences at random gate logits, and the phase sum with the sum over every\n"
     "position, then exit",
     0},
    {0},
};

const ps_command ps_cmd_theory = {
    .name = "theory",
    .summary = "the idealised bigram-induction model: gates converge to one offset",
    .description =
        "Trains the idealised bigram-induction model (docs/theory.md: one-hot embeddings, one compressed key and\n"
        "value per chunk and head, static gates) by gradient descent from gate logits N(0, 0.01²), and records\n"
        "each head's key and value gates, their effective offsets, the loss, the accuracy and the temperatures at\n"
        "log-spaced steps. Writes OUT/theory.json and OUT/theory.png.\n",
    .flags = FLAGS,
    .run = run,
};

static int run(const ps_args *a, ps_error *err) {
    ps_theory_opts o;
    ps_theory_opts_default(&o);
    int64_t seed = 0;
    if (ps_args_int(a, "--heads", 1, PS_THEORY_MAX_HEADS, &o.H, err) ||
        ps_args_int(a, "--window", PS_THEORY_MIN_WINDOW, PS_THEORY_MAX_WINDOW, &o.S, err) ||
        ps_args_int(a, "--chunks", 1, PS_THEORY_MAX_CHUNKS, &o.C, err) ||
        ps_args_int(a, "--vocab", PS_THEORY_MIN_VOCAB, PS_THEORY_MAX_VOCAB, &o.N, err) ||
        ps_args_int(a, "--steps", 1, PS_THEORY_MAX_STEPS, &o.steps, err) ||
        ps_args_int(a, "--batch", 0, PS_THEORY_MAX_BATCH, &o.batch, err) || ps_args_int(a, "--seed", 0, INT64_MAX, &seed, err) ||
        ps_args_int(a, "--records", PS_THEORY_MIN_RECORDS, PS_THEORY_MAX_RECORDS, &o.records, err) ||
        ps_args_positive(a, "--lr", 1e4, &o.lr, err) || ps_args_positive(a, "--temperature", 1e4, &o.temperature, err))
        return -1;
    o.seed = (uint64_t)seed;
    if (o.N < o.C * o.S)
        return ps_cli_usage(err, "--vocab %lld: must hold the %lld distinct context tokens (chunks x window)", (long long)o.N,
                            (long long)(o.C * o.S));
    o.learn_temperature = ps_args_has(a, "--learn-temperature");
    o.within_chunk = !ps_args_has(a, "--boundary");
    return ps_theory_command(a, &o, ps_args_has(a, "--check-grad"), err);
}
