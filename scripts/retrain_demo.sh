#!/usr/bin/env bash
# Retrains the shipped demo models from experiments/configs/demo/ into data/models/NAME/ (about 15 CPU
# minutes in all on 2 cores; `make retrain`). Each is exactly:
#   phasescope train --config experiments/configs/demo/NAME.json --out data/models/NAME
# The AdamW state is dropped afterwards (it is only needed to resume); train.jsonl and training.png stay.
set -euo pipefail
cd "$(dirname "$0")/.."
PS=build/phasescope
for name in full w8s8 w4s4 w8s8_uniform w8s8_norope; do
  rm -rf "data/models/$name"
  $PS train --config "experiments/configs/demo/$name.json" --out "data/models/$name"
  rm -f data/models/$name/optimizer-*.safetensors
done
# the V4-compressor model (attention kind channel; experiments/configs/v4/v4demo.json), trained on one thread: its
# numbers in docs/results.md are from a one-thread run (about 5 CPU minutes)
rm -rf data/models/v4demo
OMP_NUM_THREADS=1 $PS train --config experiments/configs/v4/v4demo.json --out data/models/v4demo
rm -f data/models/v4demo/optimizer-*.safetensors
# the select-attention demo (InfLLM-v2 block selection; experiments/configs/demo/select.json), one thread: its
# numbers in docs/results.md are from a one-thread run (about 15 CPU minutes alone, 6000 steps)
rm -rf data/models/select
OMP_NUM_THREADS=1 $PS train --config experiments/configs/demo/select.json --out data/models/select
rm -f data/models/select/optimizer-*.safetensors
# the default model is the deep W8/S8 (scripts/retrain_deep.sh)
