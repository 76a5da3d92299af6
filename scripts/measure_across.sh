#!/usr/bin/env bash
# The measurements of docs/results.md "The weak phase across designs" (issue 46), from the shipped models.
# Usage: scripts/measure_across.sh [OUT [MODEL ...]]
#   OUT    where the results go (default out/across)
#   MODEL  names under data/models/ (default: every deep model of the table that is shipped)
# For each model: phase sweeps in pad mode at P = 8 (--n 256), 16 (--n 128) and 24 (--n 96), and in move mode at
# P = 8 (--n 256) and 24 (--n 96), into OUT/MODEL/p{8,16,24}[_move]/sweep.json (a sweep already there is kept,
# so an interrupted run continues; delete OUT to redo). Then OUT/table.md (scripts/across_table.py: one row per
# model, the gaps at every period, KV bytes per token, train steps, the target's verdict) and the gap-against-
# mean trade-off figures at P = 8 and P = 24 (OUT/tradeoff_p8.png, OUT/tradeoff_p24.png; `phasescope table`).
# Each sweep is about 10 s on one core at P = 8 for these 12-layer models; the whole table about 15 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
PS=${PS:-build/phasescope}
OUT=${1:-out/across}
shift || true
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
models=("$@")
if [ ${#models[@]} -eq 0 ]; then
  for m in deep_full deep_w8s8 deep_w8s4 deep_phasefix deep_phasefix_s2_rule deep_phasefix_s2 \
           deep_select_s1_rule deep_select_s1 deep_select_s2_rule deep_select_s2 \
           deep_layerstag_s1_rule deep_layerstag_s1 deep_layerstag_s2_rule deep_layerstag_s2 \
           deep_overlap_s1_rule deep_overlap_s1 deep_overlap_s2_rule deep_overlap_s2; do
    [ -f "data/models/$m/model.safetensors" ] && models+=("$m")
  done
fi
for m in "${models[@]}"; do
  [ -f "data/models/$m/model.safetensors" ] || { echo "measure_across: no model data/models/$m" >&2; exit 2; }
  for run in "8 pad 256" "16 pad 128" "24 pad 96" "8 move 256" "24 move 96"; do
    set -- $run
    dir=$OUT/$m/p$1; [ "$2" = move ] && dir=${dir}_move
    [ -f "$dir/sweep.json" ] && continue
    $PS sweep --model "data/models/$m" --period "$1" --mode "$2" --n "$3" --out "$dir" > /dev/null
    echo "$dir: $(python3 -c 'import json,sys; c=json.load(open(sys.argv[1]))["curve"]; print("mean %.3f gap %.1f pp" % (c["mean_accuracy"], c["gap_pp"]))' "$dir/sweep.json")"
  done
  $PS info --model "data/models/$m" > "$OUT/$m/info.txt"
done
python3 scripts/across_table.py "$OUT" "${models[@]}" > "$OUT/table.md"
for p in 8 24; do
  $PS table $(for m in "${models[@]}"; do echo "$OUT/$m/p$p/sweep.json"; done) --figure "$OUT/tradeoff_p$p.png" \
    > "$OUT/table_p$p.md"
done
cat "$OUT/table.md"
