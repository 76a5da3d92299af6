#!/bin/bash
# bench_serve.sh [PHASESCOPE...] — serve's throughput (tokens/s in all, per-request latency, time to first
# token) at 1, 8 and 32 concurrent clients on data/models/deep_w8s8 (12 layers, d 64, 8 KV heads of 8, W8/S8,
# context 96: prompts of 16 ids, max_tokens drawn from [16, 64]), each client sending REQS requests in a
# closed loop (bench/bench_serve.py). For each binary given (default build/phasescope): non-streaming
# requests, and streamed ones when the binary streams. The server's CPU seconds (user + sys, from
# /proc/PID/stat) are printed beside the wall time: on a shared machine the wall clock moves with the load.
# Run from the repository root. Prints; asserts nothing. Environment: REQS (default 4), CLIENTS ("1 8 32").
set -u
BINS=("$@")
[ ${#BINS[@]} -gt 0 ] || BINS=(build/phasescope)
REQS=${REQS:-4}
CLIENTS=${CLIENTS:-"1 8 32"}
M=data/models/deep_w8s8
T=$(mktemp -d)
PY=/usr/bin/python3
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
SPID=
cleanup() { [ -n "$SPID" ] && kill "$SPID" 2>/dev/null && wait "$SPID" 2>/dev/null; rm -rf "$T"; }
trap cleanup EXIT
cpu_s() { awk '{printf "%.2f", ($14 + $15) / '"$(getconf CLK_TCK)"'}' /proc/$1/stat; }
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) cores; OMP_NUM_THREADS=$OMP_NUM_THREADS"
for bin in "${BINS[@]}"; do
  rm -f "$T/port"
  "$bin" serve --model $M --port 0 --port-file "$T/port" --max-connections 64 > "$T/log" 2>&1 &
  SPID=$!
  for _ in $(seq 200); do [ -s "$T/port" ] && break; sleep 0.05; done
  PORT=$(cat "$T/port")
  modes="plain"
  "$PY" bench/bench_serve.py --port "$PORT" --clients 1 --requests 1 --gen 4 --stream > /dev/null 2>&1 && modes="plain stream"
  for mode in $modes; do
    for c in $CLIENTS; do
      c0=$(cpu_s $SPID)
      flag=; [ $mode = stream ] && flag=--stream
      out=$("$PY" bench/bench_serve.py --port "$PORT" --clients "$c" --requests "$REQS" --prompt 16 --gen 64 $flag)
      c1=$(cpu_s $SPID)
      echo "$bin $mode $out server_cpu_s $(awk "BEGIN{printf \"%.2f\", $c1 - $c0}")"
    done
  done
  kill "$SPID"; wait "$SPID" 2>/dev/null; SPID=
done
