/* cmd_probe.c — `phasescope probe`: the text-kv sweep and the fillers experiment against a served model's
 * /v1/completions (interventions/probe.h, docs/served-models.md). */
#include "instruments/instrument.h"

static int run(const ps_args *a, ps_error *err);

static const ps_flag_spec FLAGS[] = {
    {"--endpoint", "URL", "the server: http://HOST:PORT (with or without /v1), e.g. vLLM's or `phasescope serve`'s", 1},
    {"--api-model", "NAME", "the model's API name (default: the first model GET /v1/models lists)", 0},
    {"--api-key-env", "NAME", "read the API key from environment variable NAME (never printed nor written)", 0},
    {"--task", "text-kv|fillers", "text-kv (default): the needle sweep; fillers: --experiment FILE", 0},
    {"--tokenizer", "FILE", "the served model's tokenizer.json (default with --like: the checkpoint's)", 0},
    {"--like", "DIR", "a text-kv checkpoint whose stored prompt layout gives the defaults (as `sweep --model DIR`)", 0},
    {"--experiment", "FILE", "fillers: the experiment (docs/text-experiments.md)", 0},
    {"--mode", "pad|move", "text-kv: pad (default) or move", 0},
    {"--pairs", "N", "text-kv: key-value pairs per prompt (default 8)", 0},
    {"--words", "FILE", "text-kv: key words, one per line (default data/text/kv_keys.txt)", 0},
    {"--values", "numbers|words", "text-kv: values are 4-digit numbers (default) or words from --words", 0},
    {"--value-digits", "D", "text-kv: digits of a number value (default 4; 1-9): 5 gives 90,000 distinct values", 0},
    {"--family", "NAME", "text-kv: the filler text family of data/text/fillers.json (default prose)", 0},
    {"--period", "P", "phase period (default: --like's stride, the experiment's period, else 8)", 0},
    {"--n", "N", "text-kv: prompts per shift (default 256)", 0},
    {"--seed", "S", "text-kv: seed of the prompts (default 0)", 0},
    {"--out", "DIR", "where sweep.json / fillers.json and the journal go (default out/probe)", 0},
    {"--scoring", "auto|prompt-logprobs|echo|greedy", "how answers are scored (default auto: what the server gives)", 0},
    {"--max-tokens", "0|1", "max_tokens of a scored request (default 1; 0 where the server accepts it)", 0},
    {"--concurrency", "N", "requests in flight (default 8)", 0},
    {"--retries", "N", "retries of a request on 429, 5xx or a timeout (default 5)", 0},
    {"--backoff", "S", "first retry wait in seconds, doubling (default 1; at most 60, or the server's Retry-After)", 0},
    {"--timeout", "S", "request timeout in seconds (default 600)", 0},
    {"--dry-run", NULL, "print the plan and its cost in requests and tokens; send nothing", 0},
    {0},
};

const ps_command ps_cmd_probe = {
    .name = "probe",
    .summary = "phase sweeps of a served model (vLLM, SGLang, phasescope serve) over the OpenAI completions API",
    .description =
        "The text-kv needle sweep (pad and move modes) or the fillers experiment against a /v1/completions\n"
        "endpoint (docs/served-models.md). Prompts go as token-id lists, so every position and every phase is\n"
        "exact; the prompts, the statistics and the JSON are those of `sweep --task text-kv` and `fillers`.\n"
        "Answers are scored from prompt log-probabilities (vLLM's prompt_logprobs, or echo with logprobs) or, when\n"
        "the server gives neither, by greedy answers; provenance.probe.scoring says which. Results go to a journal\n"
        "as they arrive: the same command with the same --out resumes a killed run and ends with the same JSON.\n",
    .flags = FLAGS,
    .run = run,
};

/* the flags, checked and run by the probe module (instr_probe.c) */
static int run(const ps_args *a, ps_error *err) { return ps_probe_command(a, err); }
