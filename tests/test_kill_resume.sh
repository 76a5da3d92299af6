#!/usr/bin/env bash
# test_kill_resume.sh — crash safety: `phasescope train` is killed with SIGKILL at random moments, several
# times, and resumed; after every kill the checkpoint loads, and the resumed run ends with the same log
# records and byte-identical weights as an uninterrupted run. Usage: test_kill_resume.sh BUILD_DIR SRC_DIR
set -u
B="$1"; SRC="$2"; PS="$B/phasescope"
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
RANDOM=12345
sed 's/"steps": 400/"steps": 150/; s/"checkpoint_every": 200/"checkpoint_every": 7/; s/"log_every": 50/"log_every": 10/' \
  "$SRC/experiments/configs/tiny_kv_w4s4.json" > "$T/cfg.json"
pass=0; fail=0
check() { if eval "$2"; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL $1" >&2; fi; }

"$PS" train --config "$T/cfg.json" --out "$T/a" > /dev/null 2>&1
check "uninterrupted run" '[ -s "$T/a/model.safetensors" ]'
kills=0
for i in 1 2 3 4 5 6; do
  if [ -f "$T/b/model.safetensors" ]; then flag=--resume; else flag=; fi
  "$PS" train --config "$T/cfg.json" --out "$T/b" $flag > /dev/null 2>&1 &
  pid=$!
  sleep "0.$(( RANDOM % 9 + 1 ))"
  if kill -9 "$pid" 2>/dev/null; then kills=$((kills+1)); fi
  wait "$pid" 2>/dev/null
  if [ -f "$T/b/model.safetensors" ]; then
    check "checkpoint loads after kill $i" '"$PS" info --model "$T/b" > /dev/null 2>&1'
  fi
done
check "killed at least three times" '[ $kills -ge 3 ]'
if [ -f "$T/b/model.safetensors" ]; then flag=--resume; else flag=; fi
"$PS" train --config "$T/cfg.json" --out "$T/b" $flag > /dev/null 2>&1
check "resumed run finishes" '[ $? -eq 0 ]'
strip() { grep -v '"tokens_per_s"' "$1" > /dev/null; sed 's/,"tokens_per_s":[-0-9.e+]*//' "$1"; }
check "same log records as the uninterrupted run" 'cmp -s <(strip "$T/a/train.jsonl") <(strip "$T/b/train.jsonl")'
check "byte-identical final weights" 'cmp -s "$T/a/model.safetensors" "$T/b/model.safetensors"'
check "no temporary files left" '[ -z "$(ls "$T/b" | grep -F .tmp)" ]'
echo "killed $kills times"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
