#!/bin/bash
# compare_cpu.sh BASE_BIN NEW_BIN [REPS] — process CPU seconds (user + sys, one thread) of two phasescope
# binaries on the same commands, alternating, REPS times (default 2): the knockout grid of deep_w8s8 (--n 32),
# 100 training steps of its recipe, its sweep (--n 256). CPU time, not wall time, so a shared machine moves it
# less; read the spread between repetitions before a difference. Also checks that the two knockout JSONs agree
# (tests/compare_json.py, provenance aside, 1e-6). Run from the repository root. Prints; asserts nothing.
set -u
[ $# -ge 2 ] || { echo "usage: $0 BASE_BIN NEW_BIN [REPS]" >&2; exit 2; }
A=$1; B=$2; REPS=${3:-2}; T=$(mktemp -d)
export OMP_NUM_THREADS=1
for rep in $(seq "$REPS"); do
  for tag in base new; do
    bin=$A; [ $tag = new ] && bin=$B
    /usr/bin/time -f "$tag knockout_deep_w8s8_n32 %U %S" "$bin" knockout --model data/models/deep_w8s8 --n 32 --out "$T/ko_$tag" > /dev/null 2>> "$T/times"
    rm -rf "$T/tr_$tag"
    /usr/bin/time -f "$tag train_deep_w8s8_100steps %U %S" "$bin" train --config experiments/configs/deep/w8s8.json --out "$T/tr_$tag" --stop-after 100 > /dev/null 2>> "$T/times"
    /usr/bin/time -f "$tag sweep_deep_w8s8_n256 %U %S" "$bin" sweep --model data/models/deep_w8s8 --n 256 --out "$T/sw_$tag" > /dev/null 2>> "$T/times"
  done
done
awk '{printf "%-5s %-26s %8.2f CPU s\n", $1, $2, $3 + $4}' "$T/times"
python3 tests/compare_json.py "$T/ko_base/knockout.json" "$T/ko_new/knockout.json" --tol 1e-6 > /dev/null && echo "knockout JSON: agree" || echo "knockout JSON: DIFFER"
rm -rf "$T"
