#!/usr/bin/env bash
# The main job. Until the trained demo models ship (a later milestone): trains a tiny compressed model
# for a few seconds (train.jsonl with gate statistics and training.png), runs the four instruments on
# it (JSON and figures), makes a freshly initialised W8/S8 checkpoint, describes it with `info`, and runs
# `forward` with hooks on it.
set -euo pipefail
cd "$(dirname "$0")/.."
PS=build/phasescope
OUT=out/demo
mkdir -p "$OUT"
rm -rf "$OUT/tiny-run"
$PS train --config experiments/configs/tiny_kv_w4s4.json --out "$OUT/tiny-run"
grep '"type":"eval"' "$OUT/tiny-run/train.jsonl"
# the instruments on it (figures next to each JSON)
$PS sweep --model "$OUT/tiny-run" --n 64 --out "$OUT/sweep"
$PS gates --model "$OUT/tiny-run" --n 64 --log "$OUT/tiny-run/train.jsonl" --out "$OUT/gates"
$PS knockout --model "$OUT/tiny-run" --n 64 --out "$OUT/knockout"
$PS gatecycle --model "$OUT/tiny-run" --layer 0 --shift 1 --n 64 --out "$OUT/gatecycle"
$PS init --config experiments/configs/demo_w8s8.json --out "$OUT/model-w8s8" --seed 1
$PS info --model "$OUT/model-w8s8"
# two prompts: 40 and 100 tokens
printf '[[0%s], [0%s]]\n' "$(for i in $(seq 1 39); do printf ', %d' $(( (i * 37) % 511 + 1 )); done)" \
  "$(for i in $(seq 1 99); do printf ', %d' $(( (i * 53) % 511 + 1 )); done)" > "$OUT/tokens.json"
$PS forward --model "$OUT/model-w8s8" --tokens "$OUT/tokens.json" \
  --hooks blocks.0.attn.hook_gate_k,blocks.3.attn.hook_pattern,blocks.3.hook_resid_post --out "$OUT/forward.safetensors"
echo "demo outputs in $OUT/"
