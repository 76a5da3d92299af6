#!/usr/bin/env bash
# atp_scaling.sh — how the exact knockout grid and its attribution estimate grow with depth: freshly
# initialised models of deep_w8s8's recipe (experiments/configs/deep/w8s8.json) at L layers, every cell,
# --n N prompts, both timed on THREADS threads (docs/results.md, "Attribution patching").
#   bench/atp_scaling.sh [OUT] [N] [L...]     (defaults: out/atp_scaling, 32, 6 12 24)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-out/atp_scaling}; N=${2:-32}; shift 2 2>/dev/null || shift $# ; LS=("$@")
[ ${#LS[@]} -gt 0 ] || LS=(6 12 24)
PS=${PS:-build/phasescope}; THREADS=${THREADS:-1}
mkdir -p "$OUT"
echo "| layers | cells | exact CPU s | AtP (fix none) CPU s | speed-up |"
echo "|---|---|---|---|---|"
for L in "${LS[@]}"; do
    d=$OUT/L$L
    mkdir -p "$d"
    python3 - "$L" > "$d/config.json" <<'PY'
import json, sys
c = json.load(open("experiments/configs/deep/w8s8.json")); c["model"]["n_layers"] = int(sys.argv[1]); print(json.dumps(c))
PY
    "$PS" init --config "$d/config.json" --out "$d/model" --seed 1 > /dev/null
    t() { OMP_NUM_THREADS=$THREADS OPENBLAS_NUM_THREADS=$THREADS /usr/bin/time -f '%U %S' -o "$d/$1.time" "$PS" knockout --model "$d/model" --n "$N" "${@:2}" --out "$d/$1" > /dev/null 2>&1; awk '{print $1 + $2}' "$d/$1.time"; }
    e=$(t exact); a=$(t atp --method atp)
    echo "| $L | $((L * 8)) | $e | $a | $(python3 -c "print('%.1f×' % ($e / $a))") |"
done
