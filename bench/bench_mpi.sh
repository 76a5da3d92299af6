#!/usr/bin/env bash
# bench_mpi.sh — scale-out on this machine (docs/scale-out.md, "Cost model"): a knockout grid and a phase
# sweep of the shipped one-layer W8/S8 (data/models/w8s8) as one process with 1 thread, as 2 MPI ranks with 1 thread each, and as
# one process with 2 threads (wall and CPU seconds, the median of REPS runs; speed-up of 2 ranks over 1);
# then data-parallel training of that model's config (demo/w8s8) at 1 and 2 ranks: the step time
# and the share of the step the gradient all-reduce takes (and the time spent waiting for the slower rank).
# On a machine shared with other work the wall times carry that load: compare the CPU seconds and the
# ratios of one run. Usage: bench_mpi.sh BUILD_DIR SRC_DIR [REPS]
set -uo pipefail
B=$(cd "$1" && pwd); SRC=$(cd "$2" && pwd); REPS=${3:-3}
PS="$B/phasescope"
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
if ! command -v mpirun > /dev/null 2>&1; then echo "bench_mpi: skipped: mpirun not found (scripts/setup.sh installs openmpi-bin)"; exit 0; fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_hwloc_base_binding_policy=none
export OMP_WAIT_POLICY=PASSIVE

# run SETTING ARGS...: "wall cpu crit" seconds of one run (cpu: user + sys of every process of the run; crit:
# the CPU seconds of the busiest rank, what the run's wall time would be on cores nobody else uses)
run() {
  local setting="$1"; shift
  local cmd
  rm -f "$T"/rank*
  case "$setting" in
    1r1t) cmd=(env OMP_NUM_THREADS=1 "$PS" "$@") ;;
    2r1t) cmd=(env OMP_NUM_THREADS=1 mpirun --oversubscribe -np 2 sh -c \
               'exec /usr/bin/time -f "%U %S" -o "$0/rank$OMPI_COMM_WORLD_RANK" "$@"' "$T" "$PS" "$@") ;;
    1r2t) cmd=(env OMP_NUM_THREADS=2 "$PS" "$@") ;;
  esac
  rm -rf "$T/out"
  /usr/bin/time -f "%e %U %S" -o "$T/time" "${cmd[@]}" --out "$T/out" > "$T/log" 2>&1 || { echo "bench_mpi: failed: ${cmd[*]}" >&2; cat "$T/log" >&2; exit 1; }
  local crit
  if ls "$T"/rank* > /dev/null 2>&1; then crit=$(cat "$T"/rank* | awk '{ c = $1 + $2; if (c > m) m = c } END { print m }')
  else crit=$(awk '{ print $2 + $3 }' "$T/time"); fi
  awk -v c="$crit" '{ printf "%.2f %.2f %.2f\n", $1, $2 + $3, c }' "$T/time"
}
median() { sort -n | awk '{ a[NR] = $0 } END { print a[int((NR + 1) / 2)] }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
# row NAME ARGS...: the three settings, REPS runs each, medians
row() {
  local name="$1"; shift
  local s w c k
  declare -A W C K
  for s in 1r1t 2r1t 1r2t; do
    local walls=() cpus=() crits=()
    for _ in $(seq "$REPS"); do read -r w c k < <(run "$s" "$@"); walls+=("$w"); cpus+=("$c"); crits+=("$k"); done
    W[$s]=$(printf '%s\n' "${walls[@]}" | median); C[$s]=$(printf '%s\n' "${cpus[@]}" | median)
    K[$s]=$(printf '%s\n' "${crits[@]}" | median)
  done
  printf "%-30s %6.2f %6.2f | %6.2f %6.2f %6.2f | %6.2f %6.2f | %5sx %5sx | %5sx\n" "$name" "${W[1r1t]}" "${C[1r1t]}" \
    "${W[2r1t]}" "${C[2r1t]}" "${K[2r1t]}" "${W[1r2t]}" "${C[1r2t]}" "$(ratio "${W[1r1t]}" "${W[2r1t]}")" \
    "$(ratio "${W[1r1t]}" "${W[1r2t]}")" "$(ratio "${C[1r1t]}" "${K[2r1t]}")"
}

echo "bench_mpi: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg) at the start; median of $REPS runs"
echo "(1r1t: one process, 1 thread; 2r1t: mpirun -np 2, 1 thread per rank; 1r2t: one process, 2 threads. Seconds:"
echo " wall, cpu = user + sys of all processes, crit = cpu of the busiest rank. Speed-ups: wall 1r1t / wall 2r1t,"
echo " wall 1r1t / wall 1r2t, and cpu 1r1t / crit 2r1t: the 2-rank speed-up on cores nobody else uses)"
printf "%-30s %13s | %20s | %13s | %13s | %6s\n" "" "1r1t wall cpu" "2r1t wall cpu crit" "1r2t wall cpu" "wall: 2r 2t" "quiet"
W="$SRC/data/models/w8s8" # the one-layer W8/S8 (the default model is the 12-layer deep_w8s8)
row "knockout, w8s8, 256 x 8" knockout --model "$W"
row "sweep, w8s8, 2048 x 8" sweep --model "$W" --n 2048

# ---- training ----
echo
cfg="$T/train.json"
sed 's/"steps": [0-9]*/"steps": 60/; s/"eval_every": [0-9]*/"eval_every": 100000/; s/"gates_every": [0-9]*/"gates_every": 100000/; s/"log_every": [0-9]*/"log_every": 10/; s/"checkpoint_every": [0-9]*/"checkpoint_every": 100000/' \
  "$SRC/experiments/configs/demo/w8s8.json" > "$cfg"
# step time from the log: global batch x tokens / tokens_per_s, median over the records after the first
step_ms() {
  python3 - "$1" "$cfg" <<'EOF'
import json, sys
cfg = json.load(open(sys.argv[2]))
bt = cfg['train']['batch_size'] * cfg['task']['seq_len']
r = [json.loads(l) for l in open(sys.argv[1])]
t = sorted(1e3 * bt / x['tokens_per_s'] for x in r if x['type'] == 'train' and x['step'] > 10)
print('%.2f' % t[len(t) // 2])
EOF
}
echo "training: demo/w8s8 (the one-layer W8/S8: d 64, 1 layer, 16 heads), global batch 64 x 64 tokens, 60 steps, 1 thread per rank"
cpu1=0
for n in 1 2; do
  rm -rf "$T/run" "$T"/rank*
  if [ $n -eq 1 ]; then OMP_NUM_THREADS=1 /usr/bin/time -f "%e %U %S" -o "$T/time" "$PS" train --config "$cfg" --out "$T/run" > "$T/log" 2>&1
  else OMP_NUM_THREADS=1 /usr/bin/time -f "%e %U %S" -o "$T/time" mpirun --oversubscribe -np 2 sh -c \
         'exec /usr/bin/time -f "%U %S" -o "$0/rank$OMPI_COMM_WORLD_RANK" "$@"' "$T" "$PS" train --config "$cfg" --out "$T/run" > "$T/log" 2>&1; fi
  cpu=$(awk '{ printf "%.2f", $2 + $3 }' "$T/time")
  if [ $n -eq 1 ]; then cpu1=$cpu; crit=$cpu; else crit=$(cat "$T"/rank* | awk '{ c = $1 + $2; if (c > m) m = c } END { printf "%.2f", m }'); fi
  printf "  %d rank%s: %s ms per step from the log; CPU %s s for the run, busiest rank %s s (quiet speed-up %sx)\n" $n \
    "$([ $n -gt 1 ] && echo s || echo "")" "$(step_ms "$T/run/train.jsonl")" "$cpu" "$crit" "$(ratio "$cpu1" "$crit")"
  [ $n -gt 1 ] && grep -o "data parallel.*" "$T/log" | sed 's/^/    /'
done
echo "the all-reduce alone (min: close to its cost on idle cores):"
OMP_NUM_THREADS=1 mpirun --oversubscribe -np 2 "$B/bench/bench_allreduce" 50 | sed 's/^/  /' 
echo "bench_mpi: load average $(cut -d' ' -f1-3 /proc/loadavg) at the end"
