/* cmd_init.c — `phasescope init`: write a freshly initialised checkpoint for a config (the starting
 * point of training, and a model to try the other commands on). Checks the flags into a request and makes
 * one call, ps_init_command (instruments/exec_init.c: the config or the copied checkpoint, the writing). */
#include "instruments/command.h"
#include "instruments/commands.h"

static int run(const ps_args *a, ps_error *err);

static const ps_flag_spec FLAGS[] = {
    {"--config", "FILE",
     "a model config (the keys of config.json, docs/training.md) or a training config\n"
     "(`phasescope train --config`), whose \"model\" part is used",
     0},
    {"--from", "DIR", "copy this checkpoint instead of initialising (docs/models.md)", 0},
    {"--out", "DIR", "checkpoint directory to write (created if missing)", 1},
    {"--seed", "N", "random seed (default 0)", 0},
    {"--format", "F",
     "config.json schema: phasescope (default) or hf (a Hugging Face Qwen3 config;\n"
     "a compressed model adds its \"attention\" object)",
     0},
    {"--dtype", "D", "weight storage: f32 (default), bf16 or f16 (rounded to nearest even)", 0},
    {"--shard-mb", "N", "write shards of at most N MiB plus model.safetensors.index.json (default: one file)", 0},
    {0},
};

const ps_command ps_cmd_init = {
    .name = "init",
    .summary = "write a freshly initialised checkpoint for a config",
    .synopsis = "phasescope init --config CFG.json --out DIR [--seed N] [--format phasescope|hf] [--dtype f32|bf16|f16] [--shard-mb N]\n"
                "phasescope init --from MODEL --out DIR [--format phasescope|hf] [--dtype f32|bf16|f16] [--shard-mb N]\n",
    .description =
        "Writes DIR/config.json and DIR/model.safetensors with freshly initialised weights: norms 1,\n"
        "compressor gates 0 (uniform), embeddings and projections N(0, 0.02), o_proj and down_proj\n"
        "N(0, 0.02/sqrt(2·n_layers)), payloads N(0, 0.02). With --from, the weights and config of an\n"
        "existing checkpoint instead (any layout it loads: sharded, BF16, Hugging Face config): a converter.\n"
        "A training config's task is stored with the model (metadata phasescope.task), so the instruments\n"
        "evaluate the fresh model on it.\n",
    .flags = FLAGS,
    .run = run,
};

static int run(const ps_args *a, ps_error *err) {
    ps_init_req r = {.config = ps_args_get(a, "--config"), .from = ps_args_get(a, "--from"), .out = ps_args_get(a, "--out")};
    int64_t shard_mb = 0;
    static const char *const FORMATS[] = {"phasescope", "hf", NULL}, *const DTYPES[] = {"f32", "bf16", "f16", NULL};
    static const ps_dtype DTYPE_OF[] = {PS_DT_F32, PS_DT_BF16, PS_DT_F16};
    int fi = 0, di = -1;
    if (!r.config == !r.from)
        return ps_cli_usage(err, r.config ? "--config and --from: give one of them, not both" : "--config or --from is required");
    if (r.from && ps_args_has(a, "--seed")) return ps_cli_usage(err, "--seed: only with --config (--from copies the weights)");
    if (ps_args_int(a, "--seed", 0, INT64_MAX, &r.seed, err) || ps_args_choice(a, "--format", FORMATS, &fi, err) ||
        ps_args_choice(a, "--dtype", DTYPES, &di, err) || ps_args_int(a, "--shard-mb", 1, 1 << 20, &shard_mb, err))
        return 1;
    if (fi == 1) r.save.layout = PS_LAYOUT_HF;
    if (di >= 0) {
        r.save.dtype_set = 1;
        r.save.dtype = DTYPE_OF[di];
    }
    r.save.max_shard_bytes = (uint64_t)shard_mb << 20;
    return ps_init_command(&r, err);
}
