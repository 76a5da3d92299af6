#!/usr/bin/env bash
# test_cli.sh — the commands as a user types them: --help, one-line errors naming the bad flag or file,
# exit status 2 for usage errors and 1 for runtime errors, the per-subcommand names, and what the commands
# write: the JSON of every instrument is parsed (python3) and its numbers checked against each other and
# against the other commands (a knockout's clean curve is the sweep's curve, gate cycling really rolls the
# saved checkpoint's parameters, ...). Usage: test_cli.sh BUILD_DIR CONFORMANCE_DIR
set -u
B="$1"; CONF="$2"; PS="$B/phasescope"
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
pass=0; fail=0
expect() { # expect NAME WANT_RC SUBSTRING -- CMD...
  local name="$1" want="$2" sub="$3"; shift 4
  local out rc
  out=$("$@" 2>&1); rc=$?
  printf '%s\n' "$out" > "$T/last.out"
  if [ "$rc" -eq "$want" ] && grep -qF -- "$sub" <<<"$out" && { [ "$want" -eq 0 ] || [ "$(wc -l <<<"$out")" -eq 1 ]; }; then
    pass=$((pass+1))
  else
    fail=$((fail+1)); echo "FAIL $name: rc=$rc (want $want), output: $out" >&2
  fi
}
# check NAME 'python code' ARGS...: the code runs with A = ARGS and helpers load(), png_size(), tensor()
check() {
  local name="$1" code="$2"; shift 2
  local out
  if out=$(python3 -c "
import json, math, struct, sys
A = sys.argv[1:]
def load(p):
    with open(p) as f: return json.load(f)
def png_size(p):
    with open(p, 'rb') as f: h = f.read(24)
    assert h[:8] == b'\\x89PNG\\r\\n\\x1a\\n' and h[12:16] == b'IHDR', p + ': not a PNG'
    return struct.unpack('>II', h[16:24])
def tensor(p, name):
    with open(p, 'rb') as f:
        n = struct.unpack('<Q', f.read(8))[0]; h = json.loads(f.read(n)); base = 8 + n
        e = h[name]; a, b = e['data_offsets']; f.seek(base + a); raw = f.read(b - a)
    assert e['dtype'] == 'F32', e['dtype']
    return e['shape'], list(struct.unpack('<%df' % ((b - a) // 4), raw))
$code
" "$@" 2>&1); then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL $name: $out" >&2; fi
}
M="$CONF/compressed_w8s8"
D="$(dirname "$0")/../data/models/default"
W="$(dirname "$0")/../data/models/w8s8"
echo '[[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]]' > "$T/tok.json"
echo '[[0, 1, 2], [0, 99]]' > "$T/badtok.json"
echo '[[0, 1, 2' > "$T/broken.json"
python_free_len=$(printf '[[0'; for i in $(seq 1 60); do printf ', 1'; done; printf ']]')
echo "$python_free_len" > "$T/long.json"

expect help 0 "usage: phasescope forward" -- "$PS" forward --help
expect help-top 0 "commands:" -- "$PS" --help
expect help-info 0 "usage: phasescope info" -- "$B/info" --help
for c in sweep knockout gatecycle gates init forward grad train info theory; do
  expect "help-$c" 0 "usage: phasescope $c" -- "$PS" $c --help
  expect "help-$c-no-spec" 1 "" -- grep -q "SPEC" "$T/last.out"   # help cites docs/*.md, not a spec users lack
done
expect help-docs 0 "docs/results-schema.md" -- "$PS" knockout --help
# --backend (alias --device): every command that runs a model lists and accepts it. The backends this
# build has come from the help text ("cpu", or "cpu, cuda" in a CUDA build); a backend it lacks is a
# usage error (a build without CUDA: cuda; with it: a made-up name).
for c in sweep knockout gatecycle gates train info forward grad; do
  expect "help-$c-backend" 0 "--backend NAME" -- "$PS" $c --help
  expect "help-$c-device" 0 "--device NAME" -- "$PS" $c --help
done
HAS=$("$PS" info --help | sed -n 's/.*this build has: \([a-z, ]*\)).*/\1/p' | head -n 1)
case "$HAS" in *cuda*) NO=nocuda ;; *) NO=cuda ;; esac
NB="this build has no such backend (it has: $HAS)"
for c in sweep knockout gates info; do expect "backend-$c" 2 "phasescope $c: --backend $NO: $NB" -- "$PS" $c --backend $NO; done
expect backend-forward 2 "phasescope forward: --backend $NO: $NB" -- "$PS" forward --tokens "$T/tok.json" --out "$T/o.st" --backend $NO
expect backend-grad 2 "phasescope grad: --backend gpu: $NB" -- "$PS" grad --tokens a --targets b --out c --backend=gpu
expect backend-gatecycle 2 "phasescope gatecycle: --backend $NO: $NB" -- "$PS" gatecycle --layer 0 --shift 1 --backend $NO
expect backend-train 2 "phasescope train: --backend $NO: $NB" -- "$PS" train --config a --out b --backend $NO
expect device-alias 2 "phasescope info: --device $NO: $NB" -- "$PS" info --device $NO
expect device-and-backend 2 "phasescope info: --device and --backend name the same thing: give one" -- "$PS" info --device cpu --backend cpu
expect precision-bad 2 "phasescope info: --precision fp8: expected fp32, tf32 or bf16" -- "$PS" info --precision fp8
expect precision-cpu 2 "phasescope info: --precision tf32: the cpu backend computes in fp32 only" -- "$PS" info --precision tf32
expect device-cpu 0 "compute     cpu" -- "$PS" info --device cpu --precision fp32
expect backend-cpu 0 "compute     cpu" -- "$PS" info --backend cpu
expect backend-theory 2 "phasescope theory: unknown flag --backend" -- "$PS" theory --backend cpu
# the scaffold's usage errors, the same for every command
expect flag-twice 2 "phasescope info: flag --batch given twice" -- "$PS" info --batch 1 --batch=2
expect switch-value 2 "phasescope train: flag --resume takes no value" -- "$PS" train --config a --out b --resume=yes
expect stray-arg 2 'phasescope sweep: unexpected argument "extra"' -- "$PS" sweep extra
expect help-anywhere 0 "usage: phasescope gatecycle --layer L --shift K" -- "$PS" gatecycle --bogus --help
# usage errors exit 2, runtime errors 1
expect unknown-cmd 2 'unknown command "frobnicate"' -- "$PS" frobnicate
expect unknown-flag 2 "unknown flag --layer" -- "$PS" forward --layer 3
expect missing-value 2 "flag --out needs a value" -- "$PS" forward --model "$M" --tokens "$T/tok.json" --out
expect missing-tokens 2 "--tokens is required" -- "$PS" forward --model "$M" --out "$T/o.st"
expect missing-model 1 "--model /nonexistent: no such directory" -- "$PS" forward --model /nonexistent --tokens "$T/tok.json" --out "$T/o.st"
expect model-is-file 1 "not a directory" -- "$PS" info --model "$T/tok.json"
expect not-a-model 1 "$T is not a model directory (no config.json)" -- "$PS" info --model "$T"
expect not-a-model-sweep 1 "$T is not a model directory (no config.json)" -- "$PS" sweep --model "$T"
expect bad-hook 2 'hook "blocks.7.hook_resid_pre": layer 7 out of range' -- "$PS" forward --model "$M" --tokens "$T/tok.json" --hooks blocks.7.hook_resid_pre --out "$T/o.st"
expect bad-hook-name 2 "valid hooks" -- "$PS" forward --model "$M" --tokens "$T/tok.json" --hooks blocks.0.hook_nope --out "$T/o.st"
expect bad-token 1 "token 99 at sequence 0, position 1" -- "$PS" forward --model "$M" --tokens "$T/badtok.json" --out "$T/o.st"
expect broken-json 1 "broken.json: not valid JSON" -- "$PS" forward --model "$M" --tokens "$T/broken.json" --out "$T/o.st"
expect too-long 1 "more than max_seq_len 48 by 13" -- "$PS" forward --model "$M" --tokens "$T/long.json" --out "$T/o.st"
expect bad-batch 2 "--batch 0: must be in" -- "$PS" info --model "$M" --batch 0
expect out-dir-missing 1 "/nonexistent/o.st" -- "$PS" forward --model "$M" --tokens "$T/tok.json" --out /nonexistent/o.st
expect forward-ok 0 "wrote 3 tensors for 1 sequences" -- "$B/forward" --model "$M" --tokens "$T/tok.json" --hooks blocks.1.attn.hook_ck,blocks.0.hook_resid_post --out "$T/o.st"
check forward-layout '
c = load(A[1])
sl, lg = tensor(A[0], "logits.0"); sr, _ = tensor(A[0], "blocks.0.hook_resid_post.0"); sk, ck = tensor(A[0], "blocks.1.attn.hook_ck.0")
assert sl == [10, c["vocab_size"]], sl
assert sr == [10, c["d_model"]], sr
assert len(sk) == 3 and sk[1:] == [c["n_kv_heads"], c["head_dim"]] and sk[0] >= 1, sk
assert all(math.isfinite(x) for x in lg + ck)
' "$T/o.st" "$M/config.json"
expect info-ok 0 "compressed W8/S8" -- "$PS" info --model "$M"
expect init-bad-config 1 "none.json: cannot open" -- "$PS" init --config "$T/none.json" --out "$T/m"
expect init-ok 0 "wrote" -- "$PS" init --config "$M/config.json" --out "$T/m" --seed 3
NP=$(grep -o '([0-9]* parameters' "$T/last.out" | tr -dc 0-9)
expect init-then-info 0 "parameters" -- "$PS" info --model "$T/m"
expect init-info-count 0 "parameters  $NP total" -- cat "$T/last.out"
# init from a training config stores its task, so an instrument evaluates the fresh model on it
cat > "$T/tcfg.json" <<'TCFG'
{"model": {"vocab_size": 32, "d_model": 16, "n_layers": 1, "n_heads": 2, "n_kv_heads": 1, "head_dim": 8, "d_ff": 24,
           "max_seq_len": 40, "attention": {"kind": "compressed", "window": 4, "stride": 4, "local_window": 4}},
 "task": {"kind": "kv-retrieval", "seq_len": 28, "n_keys": 8, "n_values": 8, "n_fillers": 4, "n_pairs": 3,
          "gap_min": 0, "gap_max": 2, "query_gap": 1, "n_queries": 3}}
TCFG
expect init-train-config 0 "parameters, seed 4" -- "$PS" init --config "$T/tcfg.json" --out "$T/mt" --seed 4
expect init-task-sweep 0 "mean accuracy" -- "$PS" sweep --model "$T/mt" --n 8 --out "$T/mts"
check init-config-same 'a, b = load(A[0]), load(A[1]); assert all(b[k] == v for k, v in a.items() if k != "attention") and all(b["attention"][k] == v for k, v in a["attention"].items()), (a, b)' "$M/config.json" "$T/m/config.json"
G="$CONF/compressed_w6s3_overlap"
echo '[[0, 1, 2, 3], [0, 5]]' > "$T/tok2.json"
echo '[[1, -1, null, 4], [7, 2]]' > "$T/tgt2.json"
echo '[[1, -1, null], [7, 2]]' > "$T/tgtshort.json"
echo '[[-1, -1, null, -1], [null, -1]]' > "$T/tgtnone.json"
expect grad-help 0 "usage: phasescope grad" -- "$B/grad" --help
expect grad-ok 0 "over 4 target positions" -- "$PS" grad --model "$G" --tokens "$T/tok2.json" --targets "$T/tgt2.json" --out "$T/g.st"
check grad-layout '
c = load(A[1]); s, loss = tensor(A[0], "loss"); se, ge = tensor(A[0], "model.embed_tokens.weight")
assert len(loss) == 1 and math.isfinite(loss[0]) and loss[0] > 0, loss
assert se == [c["vocab_size"], c["d_model"]], se
assert any(x != 0 for x in ge) and all(math.isfinite(x) for x in ge)
' "$T/g.st" "$G/config.json"
expect grad-conformance 0 "over" -- "$PS" grad --model "$G" --tokens "$G/tokens.json" --targets "$G/targets.json" --out "$T/gc.st"
expect grad-short 1 "sequence 0 has 3 targets for 4 tokens" -- "$PS" grad --model "$G" --tokens "$T/tok2.json" --targets "$T/tgtshort.json" --out "$T/g.st"
expect grad-none 1 "no target positions" -- "$PS" grad --model "$G" --tokens "$T/tok2.json" --targets "$T/tgtnone.json" --out "$T/g.st"
expect grad-missing 2 "--targets is required" -- "$PS" grad --model "$G" --tokens "$T/tok2.json" --out "$T/g.st"
TC="$(dirname "$0")/../experiments/configs/tiny_kv_w4s4.json"
sed 's/"steps": 400/"steps": 20/' "$TC" > "$T/tc.json"
echo '{"model": {}, "task": {}, "train": {}, "extra": 1}' > "$T/badtc.json"
expect train-help 0 "usage: phasescope train" -- "$B/train" --help
expect train-bad 1 'badtc.json: unknown key "extra"' -- "$PS" train --config "$T/badtc.json" --out "$T/run"
expect train-ok 0 "run in" -- "$PS" train --config "$T/tc.json" --out "$T/run"
expect train-exists 1 "already holds a run" -- "$PS" train --config "$T/tc.json" --out "$T/run"
expect train-resume-done 0 "run in" -- "$PS" train --config "$T/tc.json" --out "$T/run" --resume
expect train-resume-none 1 "holds no checkpoint" -- "$PS" train --config "$T/tc.json" --out "$T/run2" --resume
expect train-stop-bad 2 "--stop-after x: not an integer" -- "$PS" train --config "$T/tc.json" --out "$T/run3" --stop-after x
# train --device: "cpu-staged" is a test backend the CLI does not offer; cuda in a build without it is a usage
# error naming the backends it has; in a CUDA build it trains, or fails in one line without a device.
expect train-device-staged 2 "phasescope train: --device cpu-staged: $NB" -- "$PS" train --config "$T/tc.json" --out "$T/rst" --device cpu-staged
if [ "$NO" = cuda ]; then
  expect train-device-cuda 2 "phasescope train: --device cuda: $NB" -- "$PS" train --config "$T/tc.json" --out "$T/rcu" --device cuda
else
  out=$("$PS" train --config "$T/tc.json" --out "$T/rcu" --device cuda 2>&1); rc=$?
  if { [ $rc -eq 0 ] && grep -q "run in" <<<"$out"; } ||
     { [ $rc -eq 1 ] && [ "$(wc -l <<<"$out")" -eq 1 ] && grep -qF "phasescope train: --device cuda: cuda backend: no CUDA device" <<<"$out" &&
       [ ! -e "$T/rcu" ]; }; then # (the failed run leaves no empty run directory behind)
    pass=$((pass+1))
  else
    fail=$((fail+1)); echo "FAIL train-device-cuda: rc=$rc, output: $out" >&2
  fi
fi
# init takes a training config too (its "model" part)
expect init-train-config 0 "wrote" -- "$PS" init --config "$TC" --out "$T/mi"
check init-train-model 'a, b = load(A[0])["model"], load(A[1]); assert all(b[k] == v for k, v in a.items() if k != "attention"), (a, b); assert all(b["attention"][k] == v for k, v in a["attention"].items())' "$TC" "$T/mi/config.json"
R="$T/run"   # the 20-step run trained above (W4/S4, seq_len 28, max_seq_len 32, 3 queries per prompt)
expect sweep-help 0 "usage: phasescope sweep" -- "$B/sweep" --help
expect sweep-ok 0 "chi-square p" -- "$PS" sweep --model "$R" --n 16 --out "$T/o"
cp "$T/last.out" "$T/sweep.out"
"$PS" info --model "$R" > "$T/info.out" 2>&1
# the curve: 16 prompts x 3 queries visit each of the 4 residues once; numbers agree with each other, the
# verdict and period agree with what the command printed, provenance names the run and its config hash
CURVE_CHECK='
def curve_ok(c, P, n_per):
    res = c["residues"]
    assert c["period"] == P and [r["rho"] for r in res] == list(range(P)), c["period"]
    assert all(r["n"] == n_per for r in res), [r["n"] for r in res]
    assert c["n"] == P * n_per
    acc = [r["correct"] / r["n"] for r in res]
    assert all(abs(a - r["accuracy"]) < 1e-9 and r["wilson_lo"] <= a + 1e-12 and a <= r["wilson_hi"] + 1e-12 for a, r in zip(acc, res))
    assert abs(c["mean_accuracy"] - sum(r["correct"] for r in res) / c["n"]) < 1e-9
    assert abs(c["min_accuracy"] - min(acc)) < 1e-9 and abs(c["max_accuracy"] - max(acc)) < 1e-9
    assert abs(c["gap_pp"] - 100 * (max(acc) - min(acc))) < 1e-6
    p = c["chi_square"]["p_value"]; sens = p < 0.01 and c["gap_pp"] >= 5
    assert 0 <= p <= 1 and c["chi_square"]["df"] == P - 1 and c["phase_sensitive"] == sens
    dp = c["dominant_period"]
    assert (dp["period"] is None) if not sens else (dp["period"] == dp["candidate_period"] and dp["period"] > 0), dp
    return acc
def printed_ok(c, out):
    assert ("mean accuracy %.3f" % c["mean_accuracy"]) in out and c["verdict"] in out, out
    assert ("dominant period" in out) == (c["dominant_period"]["period"] is not None), out
    rp = c["repeat_period"]["period"]
    assert ("repeats every" in out) == (rp is not None) and (rp is None or ("repeats every %d (folding R^2 %.2f)" % (rp, c["repeat_period"]["r2"])) in out), out
'
check sweep-json "$CURVE_CHECK"'
d = load(A[0]); c = d["curve"]; out = open(A[1]).read(); info = open(A[2]).read(); pr = d["provenance"]
assert d["kind"] == "sweep"
curve_ok(c, 4, 16 * 3); printed_ok(c, out)
assert pr["eval"] == {"n_prompts": 16, "period": 4, "family": "repeat", "mode": "pad"}, pr["eval"]
assert pr["model"] == A[3] and pr["model_step"] == 20 and pr["task"]["n_queries"] == 3
assert ("config hash " + pr["config_hash"]) in info and len(pr["config_hash"]) == 16
' "$T/o/sweep.json" "$T/sweep.out" "$T/info.out" "$R"
check sweep-png 'w, h = png_size(A[0]); assert w >= 200 and h >= 100, (w, h)' "$T/o/phase_curve.png"
expect render-same 0 "wrote" -- "$PS" render "$T/o/sweep.json" --out "$T/re"
expect render-pixels 0 "" -- cmp "$T/o/phase_curve.png" "$T/re/phase_curve.png"
expect render-svg 0 "phase_curve.svg" -- "$B/render" "$T/o/sweep.json" --out "$T/re" --format svg
expect render-svg-xml 0 "<svg" -- head -c 400 "$T/re/phase_curve.svg"
expect render-badfmt 2 "--format gif: expected pdf or svg" -- "$PS" render "$T/o/sweep.json" --format gif
expect render-none 2 "no result file given" -- "$PS" render
expect sweep-move 0 "mean accuracy" -- "$PS" sweep --model "$R" --n 8 --mode move --family random --out "$T/om"
cp "$T/last.out" "$T/move.out"
check sweep-move-json "$CURVE_CHECK"'
d = load(A[0]); c = d["curve"]
curve_ok(c, 4, 8); printed_ok(c, open(A[1]).read())   # move mode scores the first query only
assert d["provenance"]["eval"]["mode"] == "move" and d["provenance"]["eval"]["family"] == "random"
' "$T/om/sweep.json" "$T/move.out"
# the shipped default model (the 12-layer W8/S8): a dip at rho 7, p underflows and prints as "< 1e-300"
expect sweep-default 0 "chi-square p < 1e-300: phase sensitive, repeats every 8 (folding R^2 1.00), dominant period 8" -- "$PS" sweep --n 64 --out "$T/od"
check sweep-default-json "$CURVE_CHECK"'
c = load(A[0])["curve"]; acc = curve_ok(c, 8, 64 * 16)  # the deep model asks 16 queries per prompt
assert c["chi_square"]["p_value"] < 1e-300 and c["dominant_period"]["period"] == 8 and acc.index(min(acc)) == 7, acc
assert c["repeat_period"]["period"] == 8 and c["repeat_period"]["threshold"] == 0.75, c["repeat_period"]
' "$T/od/sweep.json"
# the full-attention demo model: flat, so no period in the JSON and none printed
expect sweep-flat 0 "no phase dependence detected" -- "$PS" sweep --model "$D/../full" --n 16 --out "$T/of"
cp "$T/last.out" "$T/flat.out"
check sweep-flat-json "$CURVE_CHECK"'
c = load(A[0])["curve"]; curve_ok(c, 8, 16 * 8); printed_ok(c, open(A[1]).read())
assert c["dominant_period"]["period"] is None and not c["phase_sensitive"]
' "$T/of/sweep.json" "$T/flat.out"
expect sweep-badmode 2 "--mode slide: expected pad or move" -- "$PS" sweep --model "$R" --mode slide
expect sweep-period0 2 "--period 0: must be in [1, 4096]" -- "$PS" sweep --model "$R" --period 0
expect sweep-toolong 1 "more than max_seq_len 32 by 7" -- "$PS" sweep --model "$R" --period 12 --n 4 --out "$T/o"
expect sweep-family 2 "--family nope: unknown filler family (families: repeat, cycle, random)" -- "$PS" sweep --model "$R" --family nope
expect sweep-notask 1 "has no task layout" -- "$PS" sweep --model "$M" --n 4 --out "$T/o"
expect knockout-help 0 "usage: phasescope knockout" -- "$B/knockout" --help
expect sweep-8 0 "mean accuracy" -- "$PS" sweep --model "$R" --n 8 --out "$T/s8"
expect knockout-ok 0 "the residue it hurts most" -- "$PS" knockout --model "$R" --n 8 --layers 1 --heads 0-1 --out "$T/o"
cp "$T/last.out" "$T/ko.out"
check knockout-png 'w, h = png_size(A[0]); assert w >= 200 and h >= 100, (w, h)' "$T/o/knockout_heatmap.png"
expect knockout-acc 0 "knockout_heatmap_acc.png" -- "$PS" render "$T/o/knockout.json" --measure acc --out "$T/re"
# the grid: its clean curve is the sweep's (same prompts), every delta is knocked-out minus clean, the
# means are the means of the residue deltas, the worst residue is the largest drop, and the command lists it
check knockout-json '
d = load(A[0]); g = d["grid"]; s = load(A[1])["curve"]; out = open(A[2]).read()
assert d["kind"] == "knockout" and g["period"] == 4 and g["target"] == "compressed"
assert [r["correct"] for r in g["clean"]["residues"]] == [r["correct"] for r in s["residues"]]
assert [(c["layer"], c["head"]) for c in g["cells"]] == [(1, 0), (1, 1)]
for c in g["cells"]:
    rs = c["residues"]; assert len(rs) == 4
    for r, cl in zip(rs, g["clean"]["residues"]):
        assert r["n"] == cl["n"] and abs(r["delta_accuracy_pp"] - 100 * (r["accuracy"] - cl["accuracy"])) < 1e-6
        assert abs(r["delta_nll"] - (r["mean_nll"] + cl["mean_logprob"])) < 1e-6
    assert abs(c["mean_delta_accuracy_pp"] - sum(r["delta_accuracy_pp"] for r in rs) / 4) < 1e-6
    assert abs(c["mean_delta_nll"] - sum(r["delta_nll"] for r in rs) / 4) < 1e-6
    w = c["worst_residue"]; assert abs(w["delta_accuracy_pp"] - min(r["delta_accuracy_pp"] for r in rs)) < 1e-9
    assert abs(rs[w["rho"]]["delta_accuracy_pp"] - w["delta_accuracy_pp"]) < 1e-9
    assert ("layer 1 head %d: worst rho %d:" % (c["head"], w["rho"])) in out, out
' "$T/o/knockout.json" "$T/s8/sweep.json" "$T/ko.out"
expect knockout-layer 2 "--layers 9: 9 is out of range [0, 1]" -- "$PS" knockout --model "$R" --layers 9
expect knockout-target 2 "--target kv: expected raw, compressed or both" -- "$PS" knockout --model "$R" --target kv
# attribution patching: the same schema with the estimate (accuracies null), the verified cells' exact
# knockout equal to the exact grid's cells, and the comparison with its figure
expect atp-ok 0 "attribution patching: estimated NLL changes" -- "$PS" knockout --model "$R" --n 8 --layers 0-1 --method atp --verify 2 --out "$T/atp"
expect atp-qk 0 "attribution patching: estimated NLL changes" -- "$PS" knockout --model "$R" --n 8 --layers 1 --method atp --atp-fix qk --out "$T/atpq"
check atp-qk-json 'g = load(A[0])["grid"]; assert g["atp"]["fix"] == "qk" and g["atp"]["verified"] == 0' "$T/atpq/knockout.json"
expect atp-exact 0 "the residue it hurts most" -- "$PS" knockout --model "$R" --n 8 --layers 0-1 --out "$T/atpx"
check atp-json '
d = load(A[0]); g = d["grid"]; x = load(A[1])["grid"]
assert g["method"] == "atp" and g["atp"]["fix"] == "none" and g["atp"]["verified"] == 2 and x["method"] == "exact"
assert g["clean"] == x["clean"]
ver = [c for c in g["cells"] if c["exact"] is not None]
assert len(ver) == 2
for c in g["cells"]:
    assert c["mean_delta_accuracy_pp"] is None and all(r["accuracy"] is None and r["delta_accuracy_pp"] is None for r in c["residues"])
    e = [y for y in x["cells"] if (y["layer"], y["head"]) == (c["layer"], c["head"])][0]
    if c["exact"] is not None:   # the verified cells: the numbers of the exact grid
        assert c["exact"]["residues"] == e["residues"] and c["exact"]["worst_residue"] == e["worst_residue"], (c["exact"], e)
# the verified cells are the top two of the estimate by worst-residue estimated dNLL
top = sorted(g["cells"], key=lambda c: -c["worst_residue"]["delta_nll"])[:2]
assert sorted((c["layer"], c["head"]) for c in top) == sorted((c["layer"], c["head"]) for c in ver)
' "$T/atp/knockout.json" "$T/atpx/knockout.json"
check atp-png 'w, h = png_size(A[0]); assert w >= 200 and h >= 100, (w, h)' "$T/atp/knockout_heatmap.png"
expect atp-acc 1 "an attribution-patching estimate has no accuracy" -- "$PS" render "$T/atp/knockout.json" --measure acc --out "$T/re"
expect atp-compare 0 "recall in the estimate's top" -- "$PS" atp-compare "$T/atpx/knockout.json" "$T/atp/knockout.json" --out "$T/atpc"
check atp-compare-json '
d = load(A[0]); assert d["kind"] == "atp_compare" and d["n_pairs"] > 0 and -1 <= d["pearson"] <= 1, d
w, h = png_size(A[1]); assert w >= 900 and h >= 300, (w, h)
' "$T/atpc/atp_compare.json" "$T/atpc/atp_compare.png"
expect atp-compare-order 1 "the second file must be an attribution estimate" -- "$PS" atp-compare "$T/atp/knockout.json" "$T/atpx/knockout.json" --out "$T/x"
expect atp-verify-exact 2 "--verify goes with --method atp" -- "$PS" knockout --model "$R" --verify 3
expect atp-fix-exact 2 "--atp-fix goes with --method atp" -- "$PS" knockout --model "$R" --atp-fix none
expect atp-method 2 "--method fast: expected exact or atp" -- "$PS" knockout --model "$R" --method fast
expect atp-verify-shard 2 "--verify needs the whole estimate" -- "$PS" knockout --model "$R" --method atp --verify 2 --shard 0/2
expect atp-channel 2 "--atp-fix qk: the per-channel compressor attention" -- "$PS" knockout --model "$(dirname "$0")/../data/models/v4demo" --method atp --atp-fix qk --n 2
# select attention: --method atp estimates the raw target (its default there: the compressed keys only choose
# blocks, a discrete choice with no gradient), close to the exact grid on the late layers of a trained model
S="$(dirname "$0")/../data/models/deep_select_s2_rule"
expect atp-select 0 "attribution patching: estimated NLL changes" -- "$PS" knockout --model "$S" --n 8 --layers 10-11 --heads 0-3 --period 4 --method atp --out "$T/atps"
expect atp-select-exact 0 "the residue it hurts most" -- "$PS" knockout --model "$S" --n 8 --layers 10-11 --heads 0-3 --period 4 --target raw --out "$T/atpsx"
expect atp-select-compare 0 "recall in the estimate's top" -- "$PS" atp-compare "$T/atpsx/knockout.json" "$T/atps/knockout.json" --out "$T/atpsc"
check atp-select-agree '
d = load(A[0]); g = d["grid"]
assert load(A[1])["grid"]["target"] == "raw" and d["n_pairs"] == 32, d["n_pairs"]
assert d["pearson"] > 0.8 and d["cell_pearson"] > 0.8, (d["pearson"], d["cell_pearson"])
ex = [x for r in g["exact"] for x in r]; es = [x for r in g["estimate"] for x in r]
big = [(a, b) for a, b in zip(ex, es) if abs(a) > 1e-3]
assert len(big) >= 5 and sum((a > 0) == (b > 0) for a, b in big) >= 0.8 * len(big), big
' "$T/atpsc/atp_compare.json" "$T/atps/knockout.json"
expect atp-select-compressed 2 "only choose which blocks a query attends (a discrete top-k with no gradient)" -- "$PS" knockout --model "$S" --n 8 --method atp --target compressed --out "$T/x"
expect atp-select-qk 2 "--atp-fix qk: the select attention" -- "$PS" knockout --model "$S" --n 8 --method atp --atp-fix qk --out "$T/x"
# a model with more KV heads than the old 4096-entry lists (regression: stack overflow when --heads is absent)
cat > "$T/many.json" <<'JSON'
{"model": {"vocab_size": 32, "d_model": 4, "n_layers": 1, "n_heads": 4097, "n_kv_heads": 4097, "head_dim": 2,
           "d_ff": 4, "max_seq_len": 32, "attention": {"kind": "full"}},
 "task": {"kind": "kv-retrieval", "seq_len": 28, "n_keys": 8, "n_values": 8, "n_fillers": 4, "n_pairs": 3,
          "key_len": 1, "value_len": 1, "gap_min": 0, "gap_max": 2, "query_gap": 1, "n_queries": 3},
 "train": {"steps": 1, "batch_size": 1, "eval_size": 1, "eval_every": 1, "log_every": 1, "gates_every": 1, "checkpoint_every": 1}}
JSON
expect many-heads-train 0 "run in" -- "$PS" train --config "$T/many.json" --out "$T/many"
expect many-heads-knockout 1 "--target compressed: a full-attention model has no compressed entries" -- "$PS" knockout --model "$T/many" --target compressed --n 1
expect many-heads-list 1 "--target compressed" -- "$PS" knockout --model "$T/many" --heads 4000-4096 --target compressed --n 1
expect gatecycle-help 0 "usage: phasescope gatecycle" -- "$B/gatecycle" --help
expect gatecycle-ok 0 "cycled layer 1, KV heads 0-1 (all), key and value gates and payloads by 2" -- "$B/gatecycle" --model "$R" --layer 1 --shift 2 --n 8 --out "$T/o" --save "$T/cyc"
expect gatecycle-saved 0 "parameters" -- "$PS" info --model "$T/cyc"
# the saved checkpoint: layer 1's gates and payloads rolled by 2 along the offset axis, layer 0 untouched
check gatecycle-rolled '
W = 4
for name in ["key_gate.weight", "key_gate.bias", "value_gate.weight", "value_gate.bias", "key_payload", "value_payload"]:
    s, a = tensor(A[0], "model.layers.1.self_attn.compressor." + name); s2, b = tensor(A[1], "model.layers.1.self_attn.compressor." + name)
    assert s == s2 and s[0] == W, (name, s)
    blk = len(a) // W
    assert any(x != y for x, y in zip(a, b)), name + " did not change"
    for i in range(W):
        assert b[i * blk:(i + 1) * blk] == a[((i - 2) % W) * blk:((i - 2) % W + 1) * blk], (name, i)
    _, a0 = tensor(A[0], "model.layers.0.self_attn.compressor." + name); _, b0 = tensor(A[1], "model.layers.0.self_attn.compressor." + name)
    assert a0 == b0, name + " of layer 0 changed"
' "$R/model.safetensors" "$T/cyc/model.safetensors"
check gatecycle-json '
d = load(A[0]); s = load(A[1])["curve"]
assert d["cycle"] == {"layer": 1, "shift": 2, "head": "all", "heads": [0, 1], "branch": "both", "params": "all"}, d["cycle"]
assert [r["correct"] for r in d["before"]["residues"]] == [r["correct"] for r in s["residues"]]
assert 0 <= d["best_shift"] < 4 and d["best_shift_signed"] in (d["best_shift"], d["best_shift"] - 4)
chance = 1 / 8; assert abs(d["chance"] - chance) < 1e-12
dead = [r for r in range(4) if d["before"]["residues"][r]["accuracy"] <= chance + 0.05 and d["after"]["residues"][r]["accuracy"] <= chance + 0.05]
assert d["excluded_residues"] == dead, (d["excluded_residues"], dead)
assert d["after_near_chance"] == (d["after"]["mean_accuracy"] <= chance + 0.05) and (len(d["warnings"]) > 0) == d["after_near_chance"]
' "$T/o/gatecycle.json" "$T/s8/sweep.json"
# --measure knockout: each cycled head's knockout profile before and after, shift - K per head (per_head)
expect gatecycle-measure 0 "per-head knockout measure (layer 1, shift 1" -- "$PS" gatecycle --model "$R" --layer 1 --shift 1 --n 8 --measure knockout --out "$T/gm"
check gatecycle-measure-json '
d = load(A[0]); ph = d["per_head"]; P = 4
assert ph["measure"] == "knockout" and [h["head"] for h in ph["heads"]] == [0, 1], ph
for h in ph["heads"]:
    assert len(h["hurt_before_pp"]) == P and len(h["hurt_after_pp"]) == P
    if h["status"] == "measured":
        w = (h["worst_after"] - h["worst_before"]) % P; w = w - P if w > P // 2 else w
        e = (w - 1) % P; e = e - P if e > P // 2 else e
        assert h["shift_worst"] == w and h["error_worst"] == e, h
    else:
        assert h["shift_worst"] is None and h["error_xcorr"] is None, h
assert ph["summary"]["n_heads"] == 2 and ph["summary"]["n_measured"] + ph["summary"]["n_lost"] + ph["summary"]["n_no_profile"] == 2
' "$T/gm/gatecycle.json"
expect gatecycle-measure-bad 2 "--measure bogus" -- "$PS" gatecycle --model "$R" --layer 0 --shift 1 --measure bogus
expect gatecycle-branch-bad 2 "--branch kv: expected key, value or both" -- "$PS" gatecycle --model "$R" --layer 0 --shift 1 --branch kv
expect gatecycle-params-bad 2 "--params gates: expected gate, payload or all" -- "$PS" gatecycle --model "$R" --layer 0 --shift 1 --params gates
expect gatecycle-min-hurt-bad 2 "--min-hurt 0: expected a positive number" -- "$PS" gatecycle --model "$R" --layer 0 --shift 1 --min-hurt 0
expect gatecycle-layer 2 "--layer 9: out of range (the model has 2 layers, 0..1)" -- "$PS" gatecycle --model "$R" --layer 9 --shift 2
expect gatecycle-head 2 "--head 5: out of range (the model has 2 KV heads, 0..1)" -- "$PS" gatecycle --model "$R" --layer 0 --shift 2 --head 5
expect gatecycle-noshift 2 "--shift is required" -- "$PS" gatecycle --model "$R" --layer 0
expect gatecycle-default-layer 2 "the default model $(cd "$D/.." && pwd)/default (-> deep_w8s8), which has 12 layers: valid --layer 0..11" -- "$PS" gatecycle --layer 12 --shift 2
# the one-layer W8/S8 demo model: every head's gates and payloads by 2 move the dip at rho 7 to rho 1 (rho 7 stays dead)
expect gatecycle-default 0 "dip at rho 7 (" -- "$PS" gatecycle --model "$W" --layer 0 --shift 2 --n 32 --out "$T/gd"
expect gatecycle-default-moved 0 ") -> rho 1 (" -- cat "$T/last.out"
check gatecycle-default-json '
d = load(A[0]); c = d["cycle"]
assert c["params"] == "all" and c["heads"] == list(range(16)), c
m = d["dips"]; assert len(m) == 1 and m[0]["before"] == 7 and m[0]["after"] == 1 and m[0]["moved_by"] == 2 and m[0]["still_dips_after"], m
assert not d["after_near_chance"] and d["warnings"] == []
' "$T/gd/gatecycle.json"
# gates alone on a per-offset-payload model break every head: warned on stderr and in the JSON
"$PS" gatecycle --model "$W" --layer 0 --shift 2 --n 32 --params gate --out "$T/gg" > "$T/gg.out" 2> "$T/gg.err"
expect gatecycle-gate-warn 0 "warning: after cycling, accuracy is near chance" -- cat "$T/gg.err"
expect gatecycle-gate-hint 0 "try --params all" -- cat "$T/gg.err"
check gatecycle-gate-json '
d = load(A[0]); assert d["cycle"]["params"] == "gate" and d["after_near_chance"] and "near chance" in d["warnings"][0]
assert d["after"]["max_accuracy"] < 0.1 and d["dips"][0]["before"] == 7 and d["dips"][0]["after"] is None
' "$T/gg/gatecycle.json"
expect gates-help 0 "usage: phasescope gates" -- "$B/gates" --help
expect gates-ok 0 "label" -- "$PS" gates --model "$R" --n 8 --log "$R/train.jsonl" --out "$T/o"
check gates-png 'w, h = png_size(A[0]); assert w >= 200 and h >= 100, (w, h)' "$T/o/gate_concentration.png"
check train-png 'w, h = png_size(A[0]); assert w >= 200 and h >= 100, (w, h)' "$R/training.png"
check gates-json '
d = load(A[0]); g = d["gates"]
assert d["kind"] == "gates" and g["window"] == 4 and g["stride"] == 4 and len(g["layers"]) == 2
for l, L in enumerate(g["layers"]):
    assert L["layer"] == l and [h["head"] for h in L["heads"]] == [0, 1]
    for h in L["heads"]:
        for br in ("key", "value"):
            b = h[br]; mg = b["mean_gate"]
            assert len(mg) == 4 and abs(sum(mg) - 1) < 1e-4 and min(mg) >= 0, mg
            assert b["peak"] == mg.index(max(mg)) and 1 - 1e-6 <= b["N_static"] <= 4 + 1e-6 and b["n_windows"] > 0
            lab = "static" if b["N_static"] <= 2 and b["N_input"] <= 2 else "input-dependent" if b["N_input"] <= 2 else "diffuse"
            assert b["label"] == lab, (b["label"], lab)
tr = d["training"]; assert len(tr) == 8 and all(len(t["steps"]) == len(t["N_static"]) > 0 and t["steps"][-1] == 20 for t in tr)
' "$T/o/gates.json"
expect gates-badlog 1 "--log: $T/tok.json: no gate records" -- "$PS" gates --model "$R" --n 8 --log "$T/tok.json" --out "$T/o"
# a log of another model (the 1-layer 16-head W8/S8) is refused by name, before anything is written
expect gates-otherlog 1 "the log is of another model" -- "$PS" gates --model "$R" --n 8 --log "$W/train.jsonl" --out "$T/o2"
expect theory-grad 0 "gradient check: 114 parameters" -- "$PS" theory --check-grad
expect theory-grad6 0 "gradient check: 38 parameters" -- "$PS" theory --check-grad --heads 3 --window 6 --chunks 3 --vocab 20
expect theory-grad-boundary 0 "phase sum vs every position" -- "$PS" theory --check-grad --boundary --heads 2 --window 4 --chunks 3 --vocab 12
expect theory-run 0 "heads have their value peak" -- "$B/theory" --steps 30 --out "$T/th"
check theory-png 'w, h = png_size(A[0]); assert w >= 200 and h >= 100, (w, h)' "$T/th/theory.png"
# the theorem's setting, short: every phase 0 .. S-2 answered by a head with key r, value r + 1, gates near one-hot
expect theory-conv 0 "7 of 7 heads have their value peak one offset after their key peak; 7 of 7 one-hot" -- "$PS" theory --records 20 --out "$T/thc"
check theory-json '
d = load(A[0]); st = d["steps"]; H = d["params"]["heads"]
assert st[0] == 0 and st[-1] == 100000 and all(a < b for a, b in zip(st, st[1:])) and len(st) <= 23, st
assert d["params"]["within_chunk"] is True and d["params"]["learn_temperature"] is False and d["params"]["batch"] == 0
assert d["covered_phases"] == list(range(7)) and d["coverable_phases"] == 7 and d["heads_one_hot"] == H == 7
for h in d["heads"]:
    nk = h["N_key_over_time"]; assert len(nk) == len(st) and nk[0] > 7.9 and nk[-1] == h["N_key"] < 1.2, nk
    assert h["value_peak"] == h["key_peak"] + 1 and h["value_peak_is_key_peak_plus_1"] is True and h["N_value"] < 1.05
assert d["score_scale"][-1] == d["logit_scale"][-1] == 8.0
' "$T/thc/theory.json"
expect theory-learn 0 "lambda" -- "$PS" theory --steps 300 --learn-temperature --boundary --batch 16 --out "$T/thl"
check theory-learn-json 'd = load(A[0]); assert d["score_scale"][-1] != 8.0 and d["logit_scale"][-1] != 8.0 and d["params"]["within_chunk"] is False' "$T/thl/theory.json"
expect theory-render 0 "theory.png" -- "$PS" render "$T/thl/theory.json" --out "$T/thl2"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); d["covered_phases"]=d["covered_phases"][1:]; json.dump(d,open(sys.argv[2],"w"))' "$T/thc/theory.json" "$T/thbad.json"
expect theory-bad-coverage 1 "covered_phases: 6 entries, but 7 phases qualify" -- "$PS" render "$T/thbad.json" --out "$T/thl2"
expect theory-vocab 2 "--vocab 10: must hold the 64 distinct context tokens" -- "$PS" theory --vocab 10
expect table-ok 0 "| mean accuracy |" -- "$PS" table "$T/o/sweep.json" "$T/of/sweep.json" --out "$T/table.md"
check table-values '
t = open(A[0]).read(); rows = [l for l in t.splitlines() if l.startswith("| ") and "---" not in l][1:]
assert len(rows) == 2, t
for row, p in zip(rows, A[1:]):
    c = load(p)["curve"]
    assert ("| %.3f | %.3f | %.1f |" % (c["mean_accuracy"], c["min_accuracy"], c["gap_pp"])) in row, (row, c["mean_accuracy"])
' "$T/table.md" "$T/o/sweep.json" "$T/of/sweep.json"
expect table-bad 1 "gates.json" -- "$PS" table "$T/o/gates.json"
# text prompt experiments (docs/text-experiments.md) on the tiny tokenizer of tests/text/ (419 ids) and a
# random W4/S4 model with that vocabulary
TT="$(dirname "$0")/text/tiny_tokenizer.json"; XP="$(dirname "$0")/../experiments/configs/text/fp8_cast.json"
expect fillers-help 0 "usage: phasescope fillers --model DIR --tokenizer FILE --experiment FILE" -- "$B/fillers" --help
expect text-init 0 "wrote" -- "$PS" init --config "$(dirname "$0")/text/tiny_model.json" --out "$T/tm" --seed 2
expect fillers-ok 0 "pooled" -- "$PS" fillers --model "$T/tm" --tokenizer "$TT" --experiment "$XP" --out "$T/fl"
check fillers-json '
d = load(A[0]); e = d["experiment"]; P = d["period"]
assert d["kind"] == "fillers" and P == 4 and e["lengths"] == [24, 39] and [c["text"] for c in e["candidates"]] == ["8", "32"]
assert [f["name"] for f in d["families"]] == ["eq-rules", "hash-banners", "dash-rules", "prose"]
assert d["provenance"]["tokenizer"]["ids"] == 419 and d["provenance"]["eval"]["period"] == 4
for f in d["families"]:
    assert [p["L"] for p in f["points"]] == list(range(24, 40))
    for p in f["points"]:
        assert p["phase"] == p["L"] % P and p["prompt_tokens"] == e["prefix_tokens"] + p["L"] + e["suffix_tokens"]
        c = p["candidates"]; assert abs(p["delta"] - (c[0]["p"] - c[1]["p"])) < 1e-9
        assert all(abs(x["p"] - math.exp(x["logprob"])) < 1e-9 for x in c)
    for r in f["residues"]:
        pts = [p["delta"] for p in f["points"] if p["phase"] == r["rho"]]
        assert r["n"] == len(pts) == 4 and abs(r["mean_delta"] - sum(pts) / 4) < 1e-9
    assert 0 < f["test"]["p_value"] <= 1 and f["test"]["permutations"] == 9999 and f["test"]["n"] == 16
assert d["pooled"]["n"] == 64
assert png_size(A[1])[0] > 1000
' "$T/fl/fillers.json" "$T/fl/fillers.png"
expect fillers-render 0 "fillers.png" -- "$PS" render "$T/fl/fillers.json" --out "$T/flr"
expect fillers-render-same 0 "" -- cmp "$T/fl/fillers.png" "$T/flr/fillers.png"
expect fillers-period 0 "period 8" -- "$PS" fillers --model "$T/tm" --tokenizer "$TT" --experiment "$XP" --out "$T/fl8" --period 8
printf '{"template": "no slot here", "families": [{"name": "a", "sentences": ["x y z"]}], "lengths": [1, 2], "candidates": ["8", "9"]}' > "$T/noslot.json"
expect fillers-no-slot 1 "noslot.json: template: no filler slot \"{filler}\"" -- "$PS" fillers --model "$T/tm" --tokenizer "$TT" --experiment "$T/noslot.json"
printf '{"template": "x{filler}", "families": [{"name": "short", "sentences": ["a b c"]}], "lengths": [1, 50], "candidates": ["8", "9"]}' > "$T/short.json"
expect fillers-too-long 1 "family \"short\" (inline): its 1 sentences give" -- "$PS" fillers --model "$T/tm" --tokenizer "$TT" --experiment "$T/short.json"
expect fillers-vocab 1 "tiny_tokenizer.json: the tokenizer has 419 ids but the model $M has vocab_size" -- "$PS" fillers --model "$M" --tokenizer "$TT" --experiment "$XP"
expect fillers-no-tokenizer 2 "--tokenizer is required" -- "$PS" fillers --model "$T/tm" --experiment "$XP"
expect fillers-bad-tokenizer 1 "nope.json: cannot open" -- "$PS" fillers --model "$T/tm" --tokenizer "$T/nope.json" --experiment "$XP"
expect sweep-textkv 0 "mean accuracy" -- "$PS" sweep --task text-kv --model "$T/tm" --tokenizer "$TT" --n 16 --pairs 4 --out "$T/tk"
expect sweep-textkv-move 0 "mean accuracy" -- "$PS" sweep --task text-kv --mode move --model "$T/tm" --tokenizer "$TT" --n 16 --values words --family eq-rules --out "$T/tkm"
check sweep-textkv-json '
for path, mode, fam in ((A[0], "pad", "prose"), (A[1], "move", "eq-rules")):
    d = load(path); pv = d["provenance"]; c = d["curve"]
    assert d["kind"] == "sweep" and pv["eval"]["task"] == "text-kv" and pv["eval"]["mode"] == mode and pv["eval"]["family"] == fam
    assert pv["task"]["kind"] == "text-kv" and pv["task"]["tokenizer_ids"] == 419
    assert c["period"] == 4 and [r["n"] for r in c["residues"]] == [16] * 4, c["residues"]
assert load(A[0])["provenance"]["task"]["pairs"] == 4 and load(A[1])["provenance"]["task"]["values"] == "words"
' "$T/tk/sweep.json" "$T/tkm/sweep.json"
expect sweep-textkv-render 0 "phase_curve.png" -- "$PS" render "$T/tk/sweep.json" "$T/tkm/sweep.json" --out "$T/tkr"
expect sweep-textkv-no-tokenizer 2 "--task text-kv needs --tokenizer" -- "$PS" sweep --task text-kv --model "$T/tm"
expect sweep-tokenizer-no-task 2 "--tokenizer: only with --task text-kv" -- "$PS" sweep --model "$T/tm" --tokenizer "$TT"
expect sweep-textkv-family 2 "--family repeat: unknown text filler family (families: prose, eq-rules" -- "$PS" sweep --task text-kv --model "$T/tm" --tokenizer "$TT" --family repeat
expect sweep-textkv-vocab 1 "the model $M has vocab_size" -- "$PS" sweep --task text-kv --model "$M" --tokenizer "$TT"
expect sweep-textkv-pairs 1 "243 key words for 300 pairs" -- "$PS" sweep --task text-kv --model "$T/tm" --tokenizer "$TT" --pairs 300
expect sweep-textkv-task 2 "--task kv: expected model or text-kv" -- "$PS" sweep --task kv
# a model trained on the "text-kv" task (tokenizer path relative to the config): the sweep reuses its layout
cp "$TT" "$T/tok.json"
printf '{"model": {"vocab_size": 419, "d_model": 16, "n_layers": 1, "n_heads": 2, "n_kv_heads": 2, "head_dim": 8, "d_ff": 32, "max_seq_len": 300, "attention": {"kind": "compressed", "window": 4, "stride": 4, "local_window": 4}}, "task": {"kind": "text-kv", "tokenizer": "tok.json", "values": "words", "pairs": 3, "queries": 2, "seq_len": 200}, "train": {"steps": 3, "batch_size": 2, "logits": "answers", "eval_size": 4, "eval_every": 3}}' > "$T/tkcfg.json"
expect train-textkv 0 "run in" -- "$PS" train --config "$T/tkcfg.json" --out "$T/tkrun"
expect sweep-textkv-trained 0 "mean accuracy" -- "$PS" sweep --model "$T/tkrun" --n 8 --out "$T/tkt"
expect sweep-textkv-trained-flags 0 "mean accuracy" -- "$PS" sweep --task text-kv --model "$T/tkrun" --n 8 --pairs 2 --mode move --out "$T/tkt2"
check sweep-textkv-trained-json '
d = load(A[0]); pv = d["provenance"]
assert pv["eval"]["task"] == "text-kv" and pv["task"]["layout"] == "checkpoint" and pv["task"]["pairs"] == 3 and pv["task"]["queries"] == 2
assert pv["task"]["values"] == "words" and pv["task"]["tokenizer"].endswith("tok.json") and d["curve"]["period"] == 4
assert [r["n"] for r in d["curve"]["residues"]] == [16] * 4, d["curve"]["residues"]
assert load(A[1])["provenance"]["task"]["pairs"] == 2
' "$T/tkt/sweep.json" "$T/tkt2/sweep.json"
# BLAS kernels: a library that reports a kernel family below the CPU's gets the CPU's (checked against a
# plain loop); a user's OPENBLAS_CORETYPE wins; info and every result name the kernels in use
best=$(python3 -c "
flags = open('/proc/cpuinfo').read().split()
print('SkylakeX' if all(f in flags for f in ('avx512f', 'avx512bw', 'avx512vl', 'avx512dq')) else
      'Haswell' if 'avx2' in flags and 'fma' in flags else 'Sandybridge' if 'avx' in flags else 'Prescott')")
expect_ml() { # expect_ml NAME SUBSTRING -- CMD... (exit 0, multi-line output)
  local name="$1" sub="$2"; shift 3
  local out; out=$("$@" 2>&1)
  if [ $? -eq 0 ] && grep -qF -- "$sub" <<<"$out"; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL $name: $out" >&2; fi
}
expect_ml kernels-auto "OpenBLAS 0.3" -- env -u OPENBLAS_CORETYPE PS_CPU_ENV_TEST_REPORTED=Prescott "$PS" info
if [ "$best" != Prescott ]; then
  expect_ml kernels-auto-chosen "$best (auto: CPU supports $best kernels, library reported Prescott)" -- \
    env -u OPENBLAS_CORETYPE PS_CPU_ENV_TEST_REPORTED=Prescott "$PS" info
fi
expect_ml kernels-checked "sgemm check against a plain loop: passed" -- env -u OPENBLAS_CORETYPE PS_CPU_ENV_TEST_REPORTED=Prescott "$PS" info
expect_ml kernels-user "Prescott (OPENBLAS_CORETYPE=Prescott set by the user)" -- env OPENBLAS_CORETYPE=Prescott "$PS" info
expect_ml kernels-passive "OMP_WAIT_POLICY=PASSIVE" -- env -u OMP_WAIT_POLICY "$PS" info
check provenance-compute '
d = load(A[0])["provenance"]
assert d["backend"] == "cpu" and d["compute"].startswith("OpenBLAS"), d.get("compute")
' "$T/o/sweep.json"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
