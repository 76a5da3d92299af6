/* cmd_generate.c — `phasescope generate`: text generation through the KV cache on a checkpoint of any
 * family with a cache (the controlled model, DeepSeek-V4). Parses and checks the flags into a request and
 * makes one call, ps_generate_command (instruments/exec_generate.c: the model, the prompts, the hooks, the
 * generation and its outputs). */
#include <stdlib.h>

#include "instruments/command.h"
#include "instruments/commands.h"

static int run(const ps_args *args, ps_error *err);

static const ps_flag_spec FLAGS[] = {
    {"--model", "DIR", "checkpoint directory (config.json + model.safetensors); default: shipped model", 0},
    {"--prompt", "TEXT", "the prompt as text (needs --tokenizer)", 0},
    {"--tokenizer", "FILE", "the model's tokenizer.json (for --prompt and the generated text)", 0},
    {"--tokens", "T.json", "prompts as token ids: a JSON list of token-id lists, generated together", 0},
    {"--max-tokens", "N", "tokens to generate per prompt (default 32)", 0},
    {"--temperature", "T", "0 (default): greedy; > 0: sample from softmax(logits / T)", 0},
    {"--top-p", "P", "sample from the smallest set of tokens whose probability reaches P (default 1)", 0},
    {"--seed", "S", "seed of the sampler (default 0)", 0},
    {"--stop", "IDS", "token ids, comma-separated (at most 64): a sequence stops after generating one (e.g. the EOS id)", 0},
    {"--hooks", "NAMES", "hook points to record during generation, and cache points blocks.L.attn.cache_ck|cache_cv (the cache at the end)", 0},
    {"--edit", "SPECS", "cache edits, comma-separated: blocks.L.attn.cache_ck:HEAD:ENTRY:zero|mean (or cache_cv)", 0},
    {"--out", "DIR", "write generate.json (and hooks.safetensors) there", 0},
    PS_BACKEND_FLAG,
    {0},
};

const ps_command ps_cmd_generate = {
    .name = "generate",
    .summary = "generate text through the KV cache (greedy or sampled), with hooks and cache edits",
    .synopsis = "phasescope generate --model DIR (--prompt TEXT --tokenizer FILE | --tokens T.json) [--max-tokens N]\n"
                "                    [--temperature T --top-p P --seed S] [--stop IDS] [--hooks NAMES] [--edit SPECS] [--out DIR]\n"
                "                    [--device NAME [--precision P]]\n",
    .description =
        "Prefills each prompt into the KV cache (docs/kvcache.md) and decodes one token per step for every\n"
        "prompt at once, greedy by default. --edit changes compressed entries of the cache from the first\n"
        "generated token on: zero, or mean (the entry's mean over the prompts that hold it before their last\n"
        "token runs; the prompts' last tokens run after the edits, so the first pick sees them).\n"
        "--hooks records activations as they fire during the prefill and every decode step. Prints the\n"
        "generated text (token ids without a tokenizer); --out DIR writes generate.json with provenance and the\n"
        "per-token log-probabilities (softmax of the logits at temperature 1). DeepSeek-V4 checkpoints: the hook\n"
        "names are V4's (layers.L.attn.q, ...) and the cache points layers.L.attn.cache_kv (compressed entries)\n"
        "and layers.L.attn.cache_ik (the indexer's keys, CSA layers), head 0: --edit layers.1.attn.cache_kv:0:3:zero.\n"
        "--device cuda runs the model and its cache on the GPU (a build with CUDA; docs/cuda.md); the picks, the\n"
        "edits' means and the recorded hooks are read back to the host.\n",
    .flags = FLAGS,
    .run = run,
};

static int parse_double(const char *flag, const char *v, double lo, double hi, double *out, ps_error *err) {
    char *end;
    double x = v ? strtod(v, &end) : 0;
    if (!v) return 0;
    if (end == v || *end || !(x >= lo && x <= hi)) return ps_cli_usage(err, "%s %s: expected a number in [%g, %g]", flag, v, lo, hi);
    *out = x;
    return 0;
}

static int run(const ps_args *args, ps_error *err) {
    ps_generate_req r = {.model = ps_args_get(args, "--model"),
                         .prompt = ps_args_get(args, "--prompt"),
                         .tokenizer = ps_args_get(args, "--tokenizer"),
                         .tokens = ps_args_get(args, "--tokens"),
                         .hooks = ps_args_get(args, "--hooks"),
                         .edits = ps_args_get(args, "--edit"),
                         .out_dir = ps_args_get(args, "--out"),
                         .backend = ps_args_backend(args),
                         .max_tokens = 32,
                         .seed = 0,
                         .temperature = 0,
                         .top_p = 1};
    if (!!r.prompt == !!r.tokens) return ps_cli_usage(err, "give one of --prompt TEXT (with --tokenizer) or --tokens T.json");
    if (r.prompt && !r.tokenizer) return ps_cli_usage(err, "--prompt needs --tokenizer FILE");
    if (ps_args_int(args, "--max-tokens", 0, 1 << 30, &r.max_tokens, err) || ps_args_int(args, "--seed", 0, INT64_MAX, &r.seed, err) ||
        parse_double("--temperature", ps_args_get(args, "--temperature"), 0, 100, &r.temperature, err) ||
        parse_double("--top-p", ps_args_get(args, "--top-p"), 1e-9, 1, &r.top_p, err))
        return -1;
    const char *stop = ps_args_get(args, "--stop");
    if (stop && ps_cli_int_list("--stop", stop, 0, INT32_MAX, r.stop, 64, &r.n_stop, err)) return -1;
    return ps_generate_command(args, &r, err);
}
