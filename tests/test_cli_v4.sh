#!/usr/bin/env bash
# test_cli_v4.sh — `phasescope info` and `phasescope forward` on the DeepSeek-V4 conformance checkpoints:
# they run, write what they say (every sequence's logits and hooks; none of the logits with --layers),
# and --lazy gives the same bytes as loading every layer. (The numbers themselves: tests/test_v4.c.)
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
"$PS" forward --model="$CONF/v4/mix4" --tokens "$CONF/v4/mix4/tokens.json" --hooks layers.0.out,embed --layers 0..0 --out "$T/c.st" > "$T/out2" 2>&1; rc=$?
ok "--layers 0..0: hooks only" '[ $rc -eq 0 ] && grep -q "wrote 4 tensors for 2 sequences" "$T/out2" && ! grep -q "logits" "$T/c.st"'
"$PS" forward --model "$CONF/v4/hub3" --help > "$T/help" 2>&1
ok "forward --help on a V4 model describes --layers" 'grep -q -- "--layers 0..L" "$T/help"'
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
