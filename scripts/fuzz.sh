#!/usr/bin/env bash
# fuzz.sh SECONDS JOBS TARGET... — run each fuzz target of build-fuzz/ for SECONDS, JOBS of them at a time
# (each target is one single-threaded libFuzzer process). New inputs go to a scratch corpus; a crash fails
# (keep its input under tests/fuzz/regressions/TARGET/ once fixed). Each target's log is build-fuzz/fuzz-T.log;
# its last lines are printed in the order the targets are named.
set -uo pipefail
secs=${1:?usage: fuzz.sh SECONDS JOBS TARGET...}; jobs=${2:?}; shift 2
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
mkdir -p build-fuzz/crashes
one() { # one TARGET: run it, exit status of libFuzzer
  local t=$1
  rm -rf "build-fuzz/corpus-$t" && mkdir -p "build-fuzz/corpus-$t"
  local extra=(); [ -d "tests/fuzz/regressions/$t" ] && extra=("tests/fuzz/regressions/$t")
  ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 \
  LSAN_OPTIONS=suppressions=$root/tests/lsan.supp:print_suppressions=0 \
    "./build-fuzz/tests/fuzz/fuzz_$t" -max_total_time="$secs" -max_len=65536 -timeout=20 -rss_limit_mb=4096 \
      -artifact_prefix="build-fuzz/crashes/$t-" -print_final_stats=1 \
      "build-fuzz/corpus-$t" "tests/fuzz/corpus/$t" "${extra[@]}" > "build-fuzz/fuzz-$t.log" 2>&1
  echo $? > "build-fuzz/fuzz-$t.rc"
}
running=0
for t in "$@"; do
  echo "fuzzing $t for $secs s"
  one "$t" &
  running=$((running + 1))
  if [ "$running" -ge "$jobs" ]; then wait -n; running=$((running - 1)); fi
done
wait
failed=0
for t in "$@"; do
  tail -n 5 "build-fuzz/fuzz-$t.log"
  rc=$(cat "build-fuzz/fuzz-$t.rc" 2>/dev/null || echo 1)
  if [ "$rc" -ne 0 ]; then echo "fuzz target $t failed (exit $rc); inputs in build-fuzz/crashes/"; failed=1; fi
done
exit $failed
