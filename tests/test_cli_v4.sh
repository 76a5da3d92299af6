#!/usr/bin/env bash
# test_cli_v4.sh — `phasescope info` and `phasescope forward` on the DeepSeek-V4 conformance checkpoints:
# they run, write what they say (every sequence's logits and hooks; none of the logits with --layers),
# and --lazy gives the same bytes as loading every layer. (The numbers themselves: tests/test_v4.c.)
# The instruments (sweep, knockout, gates, gatecycle) run on a V4 checkpoint with a --task file, write
# results that render and validate, and refuse what does not apply. (Their numbers: tests/test_v4_instr.c.)
#   test_cli_v4.sh BUILD_DIR CONFORMANCE_DIR
set -u
PS="$(cd "$1" && pwd)/phasescope"; CONF=$(cd "$2" && pwd)
T=$(mktemp -d /tmp/ps_cli_v4.XXXXXX); trap 'rm -rf "$T"' EXIT
pass=0; fail=0
ok() { if eval "$2"; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL $1" >&2; fi; }
"$PS" info --model "$CONF/v4/mix4" > "$T/info" 2>&1; rc=$?
ok "info runs" '[ $rc -eq 0 ]'
ok "info names the model" 'grep -q "DeepSeek-V4 (DeepSeek.s tensor names, one file; config keys: HF and hub (HF win))" "$T/info"'
ok "info counts parameters" 'grep -q "^parameters  284861 total" "$T/info"'
ok "info estimates a forward" 'grep -q "forward T = 4096" "$T/info"'
"$PS" info --model "$CONF/v4/hub3" --batch 2 > "$T/info3" 2>&1; rc=$?
ok "info on hub keys" '[ $rc -eq 0 ] && grep -q "config keys: hub" "$T/info3"'
H=layers.1.attn.pattern,layers.1.attn.indexer.topk,layers.0.ffn.experts,final_hidden,embed
"$PS" forward --model "$CONF/v4/hub3" --tokens "$CONF/v4/hub3/tokens.json" --hooks "$H" --out "$T/a.st" > "$T/out" 2>&1; rc=$?
ok "forward runs" '[ $rc -eq 0 ] && grep -q "wrote 12 tensors for 2 sequences" "$T/out"'
"$PS" forward --model "$CONF/v4/hub3" --tokens "$CONF/v4/hub3/tokens.json" --hooks "$H" --lazy --out "$T/b.st" > /dev/null 2>&1
ok "--lazy writes the same bytes" 'cmp -s "$T/a.st" "$T/b.st"'
# the family's point "logits" is the logits every forward writes: asked for, it adds no second tensor
"$PS" forward --model "$CONF/v4/hub3" --tokens "$CONF/v4/hub3/tokens.json" --hooks logits,embed --out "$T/e.st" > "$T/oute" 2>&1; rc=$?
"$PS" forward --model "$CONF/v4/hub3" --tokens "$CONF/v4/hub3/tokens.json" --hooks embed --out "$T/f.st" > /dev/null 2>&1
ok "--hooks logits: the logits once, the same file as without it" '[ $rc -eq 0 ] && grep -q "wrote 4 tensors for 2 sequences" "$T/oute" && cmp -s "$T/e.st" "$T/f.st"'
"$PS" forward --model="$CONF/v4/mix4" --tokens "$CONF/v4/mix4/tokens.json" --hooks layers.0.out,embed --layers 0..0 --out "$T/c.st" > "$T/out2" 2>&1; rc=$?
ok "--layers 0..0: hooks only" '[ $rc -eq 0 ] && grep -q "wrote 4 tensors for 2 sequences" "$T/out2" && ! grep -q "logits" "$T/c.st"'
# a device (in a CUDA build): --lazy stays on the cpu (usage error); without a GPU the move fails in one line
if "$PS" forward --help 2>&1 | grep -q "this build has: cpu, cuda"; then
  "$PS" forward --model "$CONF/v4/hub3" --tokens "$CONF/v4/hub3/tokens.json" --lazy --device cuda --out "$T/d.st" > "$T/dl" 2>&1; rc=$?
  ok "--lazy --device cuda: usage error" '[ $rc -eq 2 ] && grep -q -- "--lazy: layers loaded one at a time run on the cpu backend (--backend cuda needs every layer in memory)" "$T/dl"'
  "$PS" forward --model "$CONF/v4/hub3" --tokens "$CONF/v4/hub3/tokens.json" --device cuda --out "$T/d.st" > "$T/dd" 2>&1; rc=$?
  ok "--device cuda: runs, or fails in one line without a device" '{ [ $rc -eq 0 ] && grep -q "wrote 2 tensors for 2 sequences" "$T/dd"; } || { [ $rc -eq 1 ] && [ $(wc -l < "$T/dd") -eq 1 ] && grep -q "cuda backend: no CUDA device" "$T/dd"; }'
fi
"$PS" forward --model "$CONF/v4/hub3" --help > "$T/help" 2>&1
ok "forward --help on a V4 model describes --layers" 'grep -q -- "--layers 0..L" "$T/help"'
# ---- the instruments ----
cat > "$T/task.json" <<'EOF2'
{"task": {"kind": "kv-retrieval", "seq_len": 40, "n_keys": 16, "n_values": 16, "n_fillers": 4, "n_pairs": 4,
          "key_len": 1, "value_len": 1, "gap_min": 0, "gap_max": 3, "query_gap": 8, "n_queries": 2}}
EOF2
M="$CONF/v4/mix4"
"$PS" sweep --model "$M" --task "$T/task.json" --n 8 --out "$T/sweep" > "$T/s.out" 2>&1; rc=$?
ok "sweep on V4 runs" '[ $rc -eq 0 ] && grep -q "mean accuracy" "$T/s.out" && [ -s "$T/sweep/phase_curve.png" ]'
ok "sweep: period = the smallest rate (4)" 'grep -q "\"period\": 4" "$T/sweep/sweep.json" && grep -q "\"kind\": \"deepseek_v4\"" "$T/sweep/sweep.json"'
"$PS" sweep --model "$M" --task "$T/task.json" --n 4 --period 8 --mode move --out "$T/sweep8" > /dev/null 2>&1; rc=$?
ok "sweep --period 8 --mode move" '[ $rc -eq 0 ] && grep -q "\"period\": 8" "$T/sweep8/sweep.json"'
"$PS" gates --model "$M" --task "$T/task.json" --n 4 --out "$T/gates" > "$T/g.out" 2>&1; rc=$?
ok "gates on V4: per channel, both compressors" '[ $rc -eq 0 ] && grep -q "^1 *indexer *csa *8" "$T/g.out" && grep -q "^2 *compressor *hca *8" "$T/g.out" && [ -s "$T/gates/gate_concentration.png" ]'
"$PS" gatecycle --model "$M" --task "$T/task.json" --n 4 --layer 2 --shift 3 --out "$T/gc" > "$T/gc.out" 2>&1; rc=$?
ok "gatecycle on V4" '[ $rc -eq 0 ] && grep -q "cycled layer 2 (heavily_compressed_attention, rate 8)" "$T/gc.out" && [ -s "$T/gc/gatecycle_curve.png" ]'
for tg in heads compressed raw indexer sink; do
  "$PS" knockout --model "$M" --task "$T/task.json" --n 4 --period 2 --target $tg --out "$T/ko_$tg" > "$T/ko.out" 2>&1; rc=$?
  ok "knockout --target $tg on V4" '[ $rc -eq 0 ] && [ -s "$T/ko_$tg/knockout_heatmap.png" ] && grep -q "\"target\": \"$tg\"" "$T/ko_$tg/knockout.json"'
done
"$PS" render "$T/ko_heads/knockout.json" --out "$T/re" > /dev/null 2>&1; rc=$?
ok "render redraws a V4 result" '[ $rc -eq 0 ] && [ -s "$T/re/knockout_heatmap.png" ]'
err() { "$PS" "$@" > "$T/e.out" 2>&1; echo $?; }
ok "no --task: says how to give one" '[ "$(err sweep --model "$M" --out "$T/x")" = 1 ] && grep -q "carries no phasescope task" "$T/e.out"'
ok "--task on a phasescope model is a usage error" '[ "$(err sweep --task "$T/task.json" --out "$T/x")" = 2 ] && grep -q "applies to DeepSeek-V4" "$T/e.out"'
ok "knockout --target both: not a V4 target" '[ "$(err knockout --model "$M" --task "$T/task.json" --target both --out "$T/x")" = 2 ] && grep -q "heads, compressed, raw, indexer or sink" "$T/e.out"'
ok "knockout --method atp: V4 checkpoints have no backward pass" '[ "$(err knockout --model "$M" --task "$T/task.json" --method atp --n 2 --period 2 --out "$T/x")" = 1 ] && grep -q "deepseek_v4 checkpoints have no backward pass" "$T/e.out" && [ ! -e "$T/x/knockout.json" ]'
ok "knockout --target indexer --layers 2: HCA has none" '[ "$(err knockout --model "$M" --task "$T/task.json" --target indexer --layers 2 --out "$T/x")" = 2 ] && grep -q "layer 2 is heavily_compressed_attention" "$T/e.out"'
ok "gatecycle on a sliding layer" '[ "$(err gatecycle --model "$M" --task "$T/task.json" --layer 0 --shift 1 --out "$T/x")" = 2 ] && grep -q "sliding" "$T/e.out"'
ok "gatecycle --params payload on V4" '[ "$(err gatecycle --model "$M" --task "$T/task.json" --layer 1 --shift 1 --params payload --out "$T/x")" = 2 ]'
ok "gatecycle --branch kv on V4: the family's choices" '[ "$(err gatecycle --model "$M" --task "$T/task.json" --layer 1 --shift 1 --branch kv --out "$T/x")" = 2 ] && grep -q "DeepSeek-V4: --branch kv: expected compressor, indexer or both" "$T/e.out"'
ok "gates --log on V4" '[ "$(err gates --model "$M" --task "$T/task.json" --log /dev/null --out "$T/x")" = 2 ]'
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
