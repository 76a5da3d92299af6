#!/usr/bin/env bash
# test_cli.sh — the commands as a user types them: --help, one-line errors naming the bad flag or file,
# the per-subcommand names, and forward's output layout. Usage: test_cli.sh BUILD_DIR CONFORMANCE_DIR
set -u
B="$1"; CONF="$2"; PS="$B/phasescope"
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
pass=0; fail=0
expect() { # expect NAME WANT_RC SUBSTRING -- CMD...
  local name="$1" want="$2" sub="$3"; shift 4
  local out rc
  out=$("$@" 2>&1); rc=$?
  if [ "$rc" -eq "$want" ] && grep -qF -- "$sub" <<<"$out" && { [ "$want" -eq 0 ] || [ "$(wc -l <<<"$out")" -eq 1 ]; }; then
    pass=$((pass+1))
  else
    fail=$((fail+1)); echo "FAIL $name: rc=$rc (want $want), output: $out" >&2
  fi
}
M="$CONF/compressed_w8s8"
echo '[[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]]' > "$T/tok.json"
echo '[[0, 1, 2], [0, 99]]' > "$T/badtok.json"
echo '[[0, 1, 2' > "$T/broken.json"
python_free_len=$(printf '[[0'; for i in $(seq 1 60); do printf ', 1'; done; printf ']]')
echo "$python_free_len" > "$T/long.json"

expect help 0 "usage: phasescope forward" -- "$PS" forward --help
expect help-top 0 "commands:" -- "$PS" --help
expect help-info 0 "usage: phasescope info" -- "$B/info" --help
expect unknown-cmd 2 'unknown command "frobnicate"' -- "$PS" frobnicate
expect unknown-flag 1 "unknown flag --layer" -- "$PS" forward --layer 3
expect missing-value 1 "flag --out needs a value" -- "$PS" forward --model "$M" --tokens "$T/tok.json" --out
expect missing-tokens 1 "--tokens is required" -- "$PS" forward --model "$M" --out "$T/o.st"
expect missing-model 1 "--model /nonexistent: no such directory" -- "$PS" forward --model /nonexistent --tokens "$T/tok.json" --out "$T/o.st"
expect model-is-file 1 "not a directory" -- "$PS" info --model "$T/tok.json"
expect bad-hook 1 'hook "blocks.7.hook_resid_pre": layer 7 out of range' -- "$PS" forward --model "$M" --tokens "$T/tok.json" --hooks blocks.7.hook_resid_pre --out "$T/o.st"
expect bad-hook-name 1 "valid hooks" -- "$PS" forward --model "$M" --tokens "$T/tok.json" --hooks blocks.0.hook_nope --out "$T/o.st"
expect bad-token 1 "token 99 at sequence 0, position 1" -- "$PS" forward --model "$M" --tokens "$T/badtok.json" --out "$T/o.st"
expect broken-json 1 "broken.json: not valid JSON" -- "$PS" forward --model "$M" --tokens "$T/broken.json" --out "$T/o.st"
expect too-long 1 "more than max_seq_len 48 by 13" -- "$PS" forward --model "$M" --tokens "$T/long.json" --out "$T/o.st"
expect bad-batch 1 "--batch 0: must be in" -- "$PS" info --model "$M" --batch 0
expect out-dir-missing 1 "/nonexistent/o.st" -- "$PS" forward --model "$M" --tokens "$T/tok.json" --out /nonexistent/o.st
expect forward-ok 0 "wrote 3 tensors for 1 sequences" -- "$B/forward" --model "$M" --tokens "$T/tok.json" --hooks blocks.1.attn.hook_ck,blocks.0.hook_resid_post --out "$T/o.st"
expect info-ok 0 "compressed W8/S8" -- "$PS" info --model "$M"
expect init-bad-config 1 "none.json: cannot open" -- "$PS" init --config "$T/none.json" --out "$T/m"
expect init-ok 0 "wrote" -- "$PS" init --config "$M/config.json" --out "$T/m" --seed 3
expect init-then-info 0 "parameters" -- "$PS" info --model "$T/m"
G="$CONF/compressed_w6s3_overlap"
echo '[[0, 1, 2, 3], [0, 5]]' > "$T/tok2.json"
echo '[[1, -1, null, 4], [7, 2]]' > "$T/tgt2.json"
echo '[[1, -1, null], [7, 2]]' > "$T/tgtshort.json"
echo '[[-1, -1, null, -1], [null, -1]]' > "$T/tgtnone.json"
expect grad-help 0 "usage: phasescope grad" -- "$B/grad" --help
expect grad-ok 0 "over 4 target positions" -- "$PS" grad --model "$G" --tokens "$T/tok2.json" --targets "$T/tgt2.json" --out "$T/g.st"
expect grad-conformance 0 "over" -- "$PS" grad --model "$G" --tokens "$G/tokens.json" --targets "$G/targets.json" --out "$T/gc.st"
expect grad-short 1 "sequence 0 has 3 targets for 4 tokens" -- "$PS" grad --model "$G" --tokens "$T/tok2.json" --targets "$T/tgtshort.json" --out "$T/g.st"
expect grad-none 1 "no target positions" -- "$PS" grad --model "$G" --tokens "$T/tok2.json" --targets "$T/tgtnone.json" --out "$T/g.st"
expect grad-missing 1 "--targets is required" -- "$PS" grad --model "$G" --tokens "$T/tok2.json" --out "$T/g.st"
TC="$(dirname "$0")/../experiments/configs/tiny_kv_w4s4.json"
sed 's/"steps": 400/"steps": 20/' "$TC" > "$T/tc.json"
echo '{"model": {}, "task": {}, "train": {}, "extra": 1}' > "$T/badtc.json"
expect train-help 0 "usage: phasescope train" -- "$B/train" --help
expect train-bad 1 'badtc.json: unknown key "extra"' -- "$PS" train --config "$T/badtc.json" --out "$T/run"
expect train-ok 0 "run in" -- "$PS" train --config "$T/tc.json" --out "$T/run"
expect train-exists 1 "already holds a run" -- "$PS" train --config "$T/tc.json" --out "$T/run"
expect train-resume-done 0 "run in" -- "$PS" train --config "$T/tc.json" --out "$T/run" --resume
expect train-resume-none 1 "holds no checkpoint" -- "$PS" train --config "$T/tc.json" --out "$T/run2" --resume
expect train-stop-bad 1 "--stop-after x: not an integer" -- "$PS" train --config "$T/tc.json" --out "$T/run3" --stop-after x
R="$T/run"   # the 20-step run trained above (W4/S4, seq_len 28, max_seq_len 32)
expect sweep-help 0 "usage: phasescope sweep" -- "$B/sweep" --help
expect sweep-ok 0 "chi-square p" -- "$PS" sweep --model "$R" --n 16 --out "$T/o"
expect sweep-json 0 '"gap_pp"' -- cat "$T/o/sweep.json"
expect sweep-provenance 0 '"config_hash"' -- cat "$T/o/sweep.json"
expect sweep-png 0 "" -- test -s "$T/o/phase_curve.png"
expect render-same 0 "wrote" -- "$PS" render "$T/o/sweep.json" --out "$T/re"
expect render-pixels 0 "" -- cmp "$T/o/phase_curve.png" "$T/re/phase_curve.png"
expect render-svg 0 "phase_curve.svg" -- "$B/render" "$T/o/sweep.json" --out "$T/re" --format svg
expect render-badfmt 1 "--format gif: expected pdf or svg" -- "$PS" render "$T/o/sweep.json" --format gif
expect render-none 1 "no result file given" -- "$PS" render
expect sweep-move 0 "mean accuracy" -- "$PS" sweep --model "$R" --n 8 --mode move --family random --out "$T/o"
expect sweep-badmode 1 "--mode slide: expected pad or move" -- "$PS" sweep --model "$R" --mode slide
expect sweep-period0 1 "--period 0: must be in [1, 4096]" -- "$PS" sweep --model "$R" --period 0
expect sweep-toolong 1 "more than max_seq_len 32 by 7" -- "$PS" sweep --model "$R" --period 12 --n 4 --out "$T/o"
expect sweep-family 1 "--family nope: unknown filler family (families: repeat, cycle, random)" -- "$PS" sweep --model "$R" --family nope
expect sweep-notask 1 "has no task layout" -- "$PS" sweep --model "$M" --n 4 --out "$T/o"
expect knockout-help 0 "usage: phasescope knockout" -- "$B/knockout" --help
expect knockout-ok 0 "largest mean NLL increases" -- "$PS" knockout --model "$R" --n 8 --layers 1 --heads 0-1 --out "$T/o"
expect knockout-png 0 "" -- test -s "$T/o/knockout_heatmap.png"
expect knockout-acc 0 "knockout_heatmap_acc.png" -- "$PS" render "$T/o/knockout.json" --measure acc --out "$T/re"
expect knockout-json 0 '"delta_nll"' -- cat "$T/o/knockout.json"
expect knockout-layer 1 "--layers 9: 9 is out of range [0, 1]" -- "$PS" knockout --model "$R" --layers 9
expect knockout-target 1 "--target kv: expected raw, compressed or both" -- "$PS" knockout --model "$R" --target kv
expect gatecycle-help 0 "usage: phasescope gatecycle" -- "$B/gatecycle" --help
expect gatecycle-ok 0 "accuracy curve shifts by" -- "$B/gatecycle" --model "$R" --layer 1 --shift 2 --n 8 --out "$T/o" --save "$T/cyc"
expect gatecycle-saved 0 "parameters" -- "$PS" info --model "$T/cyc"
expect gatecycle-layer 1 "--layer 9: out of range (the model has 2 layers, 0..1)" -- "$PS" gatecycle --model "$R" --layer 9 --shift 2
expect gatecycle-head 1 "--head 5: out of range (the model has 2 KV heads, 0..1)" -- "$PS" gatecycle --model "$R" --layer 0 --shift 2 --head 5
expect gatecycle-noshift 1 "--shift is required" -- "$PS" gatecycle --model "$R" --layer 0
expect gates-help 0 "usage: phasescope gates" -- "$B/gates" --help
expect gates-ok 0 "label" -- "$PS" gates --model "$R" --n 8 --log "$R/train.jsonl" --out "$T/o"
expect gates-png 0 "" -- test -s "$T/o/gate_concentration.png"
expect train-png 0 "" -- test -s "$R/training.png"
expect gates-json 0 '"concentrated_at_step"' -- cat "$T/o/gates.json"
expect gates-badlog 1 "--log: $T/tok.json: no gate records" -- "$PS" gates --model "$R" --n 8 --log "$T/tok.json" --out "$T/o"
expect theory-grad 0 "gradient check: 64 parameters" -- "$PS" theory --check-grad
expect theory-grad6 0 "gradient check: 36 parameters" -- "$PS" theory --check-grad --heads 3 --window 6 --chunks 3 --vocab 20
expect theory-run 0 "heads have their value peak" -- "$B/theory" --steps 30 --out "$T/th"
expect theory-png 0 "" -- test -s "$T/th/theory.png"
expect theory-vocab 1 "--vocab 10: must hold the 64 distinct context tokens" -- "$PS" theory --vocab 10
expect table-ok 0 "| mean accuracy |" -- "$PS" table "$T/o/sweep.json" --out "$T/table.md"
expect table-bad 1 "not a sweep result" -- "$PS" table "$T/o/gates.json"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
