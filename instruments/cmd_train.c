/* cmd_train.c — `phasescope train --config CFG.json --out RUN/ [--resume]`: the flags and the config read,
 * then one call, ps_train_command (instruments/instr_train.c). */
#include "instruments/instrument.h"
#include "train/train.h"

static int run(const ps_args *a, ps_error *err);

static const ps_flag_spec FLAGS[] = {
    {"--config", "CFG.json", "training config", 1},
    {"--out", "DIR", "run directory (must not hold a run unless --resume)", 1},
    {"--resume", NULL,
     "continue the run in DIR from its last checkpoint (same config); the losses equal\n"
     "those of an uninterrupted run",
     0},
    {"--stop-after", "N", "stop (with a checkpoint) after N total steps, as an interruption would", 0},
    {"--init-from", "DIR",
     "start from this checkpoint's weights (same tensor shapes; e.g. a base model fine-tuned with\n"
     "staggered grids) instead of a random init: fresh optimizer, step 0; ignored with --resume",
     0},
    PS_BACKEND_FLAG,
    {0},
};

const ps_command ps_cmd_train = {
    .name = "train",
    .summary = "train a model (resumable); logs JSONL with gate statistics",
    .description =
        "Trains a model from one JSON config {\"model\": {...}, \"task\": {...}, \"train\": {...}} (see\n"
        "docs/training.md). Writes RUN/config.json and RUN/model.safetensors (periodically and at the end,\n"
        "atomically), RUN/optimizer-STEP.safetensors (AdamW state) and RUN/train.jsonl: train records (step,\n"
        "loss, lr, grad_norm, tokens_per_s), held-out eval records (accuracy, loss) and, for compressed models,\n"
        "gate statistics (mean_gate, N_static, N_input, peak per layer, KV head and branch).\n"
        "Under mpirun with N ranks the global batch (train.batch_size) is split over the ranks, the gradients are\n"
        "summed with MPI (every rank takes the same step), rank 0 writes the run; --resume works with any N\n"
        "(docs/scale-out.md).\n"
        "--device cuda trains on the GPU: the model is built (or loaded) on the host and moved there with its\n"
        "gradients, activations and AdamW moments; checkpoints copy weights and moments back (docs/cuda.md).\n",
    .flags = FLAGS,
    .run = run,
};

static int run(const ps_args *a, ps_error *err) {
    const char *out = ps_args_get(a, "--out");
    ps_train_cfg cfg = {0};
    int64_t stop = -1;
    int rc = 1;
    if (ps_args_int(a, "--stop-after", 0, INT64_MAX, &stop, err)) goto done;
    if (ps_train_cfg_load(ps_args_get(a, "--config"), &cfg, err)) goto done;
    cfg.init_from = ps_args_get(a, "--init-from");
    cfg.backend = ps_args_backend(a); /* --backend / --device and --precision (checked by the scaffold) */
    if (ps_args_get(a, "--precision")) ps_precision_parse(ps_args_get(a, "--precision"), &cfg.precision);
    rc = ps_train_command(a, &cfg, out, ps_args_has(a, "--resume"), stop, err) ? 1 : 0;
done:
    ps_train_cfg_free(&cfg);
    return rc;
}
