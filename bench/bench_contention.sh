#!/usr/bin/env bash
# bench_contention.sh — the same phase sweep and a short training run on a quiet machine and with a busy
# competing process on every core, with phasescope's defaults (passive waiting, threads = cores free at
# start) and with what every run got before them (libgomp's spinning waits, a thread per core). Prints
# wall times and the loaded/quiet ratio; a fair share of the cores is about 2×.
# Usage: bench_contention.sh BUILD_DIR SRC_DIR [N_PROMPTS]
set -euo pipefail
B=$(cd "$1" && pwd); SRC=$(cd "$2" && pwd); N=${3:-256}
PS="$B/phasescope"; MODEL="$SRC/data/models/default"
T=$(mktemp -d); trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$T"' EXIT
cores=$(nproc)

# a 50-step training run of the tiny example config
sed 's/"steps": [0-9]*/"steps": 50/; s/"eval_every": [0-9]*/"eval_every": 1000/' \
  "$SRC/experiments/configs/tiny_kv_w4s4.json" > "$T/train.json"
run() { # WHAT POLICY -> seconds
  local t0 t1
  t0=$(date +%s.%N)
  local envs=(env -u OMP_WAIT_POLICY -u OMP_NUM_THREADS -u GOMP_SPINCOUNT)
  [ "$2" = before ] && envs+=(OMP_WAIT_POLICY=ACTIVE OMP_NUM_THREADS="$cores")
  if [ "$1" = sweep ]; then "${envs[@]}" "$PS" sweep --model "$MODEL" --n "$N" --out "$T/s" > /dev/null 2>&1 || exit 1
  else rm -rf "$T/run"; "${envs[@]}" "$PS" train --config "$T/train.json" --out "$T/run" > /dev/null 2>&1 || exit 1; fi
  t1=$(date +%s.%N)
  awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }'
}
busy_start() { for _ in $(seq "$cores"); do (while :; do :; done) & done; }
busy_stop() { kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; }

printf "sweep: %s, %d prompts per shift; train: tiny_kv_w4s4, 50 steps\n" "$MODEL" "$N"
printf "%d cores, %d busy competitors when loaded\n" "$cores" "$cores"
printf "%-6s %-8s %10s %10s %8s\n" what setting quiet_s loaded_s ratio
for what in sweep train; do
  for pol in default before; do
    run "$what" "$pol" > /dev/null # warm the page cache
    q=$(run "$what" "$pol")
    busy_start
    l=$(run "$what" "$pol")
    busy_stop
    printf "%-6s %-8s %10.2f %10.2f %7.1fx\n" "$what" "$pol" "$q" "$l" "$(awk -v a="$l" -v b="$q" 'BEGIN { print a / b }')"
  done
done
