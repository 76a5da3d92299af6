#!/usr/bin/env bash
# Retrains the deep demo models (issue 17, part 1) from experiments/configs/deep/ into
# data/models/deep_NAME/: a 12-layer, 8-KV-head full-attention baseline (deep_full) and a compressed
# W8/S8 model of the same shape (deep_w8s8), on a bigram-induction task with 16 queries per sequence.
# Each is exactly:
#   phasescope train --config experiments/configs/deep/NAME.json --out data/models/deep_NAME
# The learning rate is constant after warmup (min_lr_frac 1.0), so a run of N steps equals the first N
# steps of any longer run. "steps" is each model's budget: the baseline is stopped at 1600, in the middle
# of its induction transition (held-out accuracy 0.56, sweep mean 0.62; at 1700 it is already at 0.95),
# the compressed model at 8000, where its sweep mean matches the baseline's. Equal budgets are not
# possible with this recipe: at 1600 steps the compressed model is still on the loss plateau (~2%).
# Training is bit-reproducible at a fixed thread count; the shipped runs used one thread
# (OMP_NUM_THREADS=1, the default below): about 11 + 46 minutes on a busy 2-core machine
# (5-7k tokens/s each); the two runs are independent and may run in parallel.
# The AdamW state is dropped afterwards (it is only needed to resume); train.jsonl and training.png stay.
set -euo pipefail
cd "$(dirname "$0")/.."
PS=build/phasescope
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
for name in full w8s8; do
  rm -rf "data/models/deep_$name"
  $PS train --config "experiments/configs/deep/$name.json" --out "data/models/deep_$name"
  rm -f data/models/deep_$name/optimizer-*.safetensors
done
# Every stride (same recipe, the stride changed; W12/S12 also window 12 and local window 12). Each is stopped
# at the first evaluation (every 50 steps) where its held-out accuracy reaches 0.6 — the paper's baselines
# sit near 60% — inside its learning transition. The rule, not a step count, is the recipe: when the
# transition happens depends on rounding (a build that sums attention in another order moves it by
# hundreds of steps), so the run is continued 50 steps at a time (--resume, bit-identical to one
# uninterrupted run) until the rule holds. With the build that trained the shipped models: W8/S4 at step
# 2900 (0.677), W8/S6 at 6300 (0.615), W12/S12 at 5000 (0.651). Trained on, the models close their weak
# phases (docs/results.md "Every stride").
first_at() { # first_at NAME ACC: train experiments/configs/deep/NAME.json until held-out accuracy >= ACC
  local name=$1 want=$2 dir="data/models/deep_$1" step=0
  rm -rf "$dir"
  $PS train --config "experiments/configs/deep/$name.json" --out "$dir" --stop-after 50
  while :; do
    local last acc
    last=$(grep '"type":"eval"' "$dir/train.jsonl" | tail -1)
    step=$(sed 's/.*"step":\([0-9]*\).*/\1/' <<<"$last")
    acc=$(sed 's/.*"accuracy":\([0-9.eE+-]*\).*/\1/' <<<"$last")
    awk -v a="$acc" -v w="$want" 'BEGIN { exit !(a >= w) }' && break
    [ "$step" -ge 8000 ] && { echo "deep_$name: held-out accuracy $acc < $want after 8000 steps" >&2; return 1; }
    $PS train --config "experiments/configs/deep/$name.json" --out "$dir" --resume --stop-after $((step + 50)) > /dev/null
  done
  echo "deep_$name: stopped at step $step (held-out accuracy $acc)"
  rm -f "$dir"/optimizer-*.safetensors
  $PS render "$dir/train.jsonl" --out "$dir"
}
for name in w8s4 w8s6 w12s12; do first_at "$name" 0.6; done
# The uniform-gate and no-RoPE variants at the deep shape, by the same rule (with the shipping build: uniform
# at step 4450, held-out 0.626; no RoPE at step 3750, held-out 0.677).
first_at w8s8_uniform 0.6
first_at w8s8_norope 0.6
ln -sfn deep_w8s8 data/models/default
