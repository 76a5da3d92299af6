#!/usr/bin/env bash
# test_generate.sh — `phasescope generate` as a user types it: greedy tokens through the KV cache equal the
# argmax of `phasescope forward` (the whole-sequence pass) on the prompt plus what was generated, the
# log-probabilities its log-softmax; --prompt with a tokenizer prints the text and writes it; --hooks writes
# every firing; --edit changes the continuation only through the cache entries it names; one-line errors
# with exit status 2 for usage errors; the same on a select-attention model (random weights, the demo's shape),
# DeepSeek-V4 and MiniCPM4 (and `phasescope serve` on MiniCPM4: its greedy completion = generate's). Usage: test_generate.sh BUILD_DIR SOURCE_DIR
set -u
B="$1"; SRC="$2"; PS="$B/phasescope"
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
pass=0; fail=0
ok() { if "$@"; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL: $*" >&2; fi; }
expect() { # expect NAME WANT_RC SUBSTRING -- CMD...
  local name="$1" want="$2" sub="$3"; shift 4
  local out rc
  out=$("$@" 2>&1); rc=$?
  if [ "$rc" -eq "$want" ] && grep -qF -- "$sub" <<<"$out"; then pass=$((pass+1)); else
    fail=$((fail+1)); echo "FAIL $name: rc=$rc (want $want), output: $out" >&2; fi
}
M="$SRC/data/models/w8s8"
echo '[[0, 5, 7, 9, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13], [0, 3, 4]]' > "$T/t.json"
expect greedy 0 "wrote" -- "$PS" generate --model "$M" --tokens "$T/t.json" --max-tokens 20 --out "$T/g" \
  --hooks blocks.0.attn.hook_ck,blocks.0.hook_resid_post
# the prompts plus the generated tokens through `forward`
python3 - "$T/g/generate.json" "$T/full.json" <<'PY'
import json, sys
g = json.load(open(sys.argv[1]))
json.dump([s["prompt"] + s["tokens"] for s in g["sequences"]], open(sys.argv[2], "w"))
PY
expect forward 0 "wrote" -- "$PS" forward --model "$M" --tokens "$T/full.json" --out "$T/f.safetensors"
ok python3 - "$T/g/generate.json" "$T/f.safetensors" "$T/g/hooks.safetensors" <<'PY'
import json, math, struct, sys
g = json.load(open(sys.argv[1]))
def st(p):
    b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n]); out = {}
    for k, v in h.items():
        if k == "__metadata__": continue
        a, e = v["data_offsets"]; out[k] = (v["shape"], struct.unpack("<%df" % ((e - a) // 4), b[8 + n + a:8 + n + e]))
    return out
f, h = st(sys.argv[2]), st(sys.argv[3])
assert g["provenance"]["config_hash"] and g["options"]["max_tokens"] == 20, "provenance and options"
for i, s in enumerate(g["sequences"]):
    (T, V), lg = f["logits.%d" % i]
    P = len(s["prompt"]); n = len(s["tokens"])
    assert n == 20 and T == P + n, (n, T)
    for k in range(n):
        row = lg[(P - 1 + k) * V:(P + k) * V]
        arg = max(range(V), key=lambda v: (row[v], -v))
        assert arg == s["tokens"][k], ("sequence", i, "step", k, arg, s["tokens"][k])
        mx = max(row); lp = row[arg] - mx - math.log(sum(math.exp(x - mx) for x in row))
        assert abs(lp - s["logprobs"][k]) < 1e-4, (lp, s["logprobs"][k])
    # every firing recorded: resid_post at every position but the last generated one (never appended)
    assert h["blocks.0.hook_resid_post.%d" % i][0] == [T - 1, 64], h["blocks.0.hook_resid_post.%d" % i][0]
    assert h["blocks.0.attn.hook_ck.%d" % i][0] == [(T - 1 - 8) // 8 + 1, 16, 16], h["blocks.0.attn.hook_ck.%d" % i][0]
PY
# an edit: zeroing an entry that exists after the prefill changes nothing before it is read, and the run
# is deterministic; sampling with a seed repeats
expect edit 0 "sequence 0:" -- "$PS" generate --model "$M" --tokens "$T/t.json" --max-tokens 8 --edit blocks.0.attn.cache_ck:3:0:zero,blocks.0.attn.cache_cv:3:0:mean,blocks.0.attn.cache_ck:2:1:zero
expect sample1 0 "sequence 0:" -- "$PS" generate --model "$M" --tokens "$T/t.json" --max-tokens 8 --temperature 1.2 --top-p 0.9 --seed 5 --out "$T/s1"
expect sample2 0 "sequence 0:" -- "$PS" generate --model "$M" --tokens "$T/t.json" --max-tokens 8 --temperature 1.2 --top-p 0.9 --seed 5 --out "$T/s2"
ok python3 -c "import json,sys; a,b=(json.load(open(p))['sequences'] for p in sys.argv[1:]); assert a==b" "$T/s1/generate.json" "$T/s2/generate.json"
# --device cpu is the default spelled out (the provenance names it); a device this build lacks is a usage error
expect sample-cpu 0 "sequence 0:" -- "$PS" generate --model "$M" --tokens "$T/t.json" --max-tokens 8 --temperature 1.2 --top-p 0.9 --seed 5 --device cpu --out "$T/s3"
ok python3 -c "import json,sys; a,b=(json.load(open(p)) for p in sys.argv[1:]); assert a['sequences']==b['sequences'] and b['provenance']['backend']=='cpu'" "$T/s1/generate.json" "$T/s3/generate.json"
expect bad-device 2 "--device tpu: this build has no such backend" -- "$PS" generate --model "$M" --tokens "$T/t.json" --device tpu
# --stop: each sequence stops after the first stop token it generates (the token kept); the others go on
STOP=$(python3 -c "import json,sys; s=json.load(open(sys.argv[1]))['sequences']; print(s[0]['tokens'][2])" "$T/g/generate.json")
expect stop 0 "wrote" -- "$PS" generate --model "$M" --tokens "$T/t.json" --max-tokens 20 --stop "$STOP" --out "$T/st"
ok python3 - "$T/g/generate.json" "$T/st/generate.json" "$STOP" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3]); stop = int(sys.argv[3])
assert b["options"]["stop"] == [stop], b["options"]
for x, y in zip(a["sequences"], b["sequences"]):
    n = x["tokens"].index(stop) + 1 if stop in x["tokens"] else len(x["tokens"])
    # (a stopped sequence leaves the others' appends: a smaller batch, other last bits)
    assert y["tokens"] == x["tokens"][:n] and max(abs(p - q) for p, q in zip(y["logprobs"], x["logprobs"])) < 1e-5, (n, x, y)
assert len(b["sequences"][0]["tokens"]) <= 3
PY
expect bad-stop 2 "--stop: token 4000 is outside the model's vocabulary" -- "$PS" generate --model "$M" --tokens "$T/t.json" --stop 4000
# the cache as a point of its own: read at the end, with the edited entry zero and the others not
expect cache-read 0 "wrote" -- "$PS" generate --model "$M" --tokens "$T/t.json" --max-tokens 10 --out "$T/c" \
  --hooks blocks.0.attn.cache_cv,blocks.0.attn.hook_cv --edit blocks.0.attn.cache_cv:1:0:zero
ok python3 - "$T/c/hooks.safetensors" <<'PY'
import json, struct, sys
b = open(sys.argv[1], "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n])
def t(k):
    a, e = h[k]["data_offsets"]; return h[k]["shape"], struct.unpack("<%df" % ((e - a) // 4), b[8 + n + a:8 + n + e])
shp, x = t("blocks.0.attn.cache_cv.0"); _, fired = t("blocks.0.attn.hook_cv.0")
assert shp == [3, 16, 16], shp  # 15 + 9 appended tokens: windows ending at 7, 15, 23
assert all(v == 0 for v in x[16:32]) and any(v != 0 for v in x[:16]), "entry 0 of head 1 zeroed, head 0 kept"
assert x[256:] == fired[256:] and x[:16] == fired[:16], "the other entries are what hook_cv saw when their windows closed"
PY
# text in, text out with a tokenizer
TT="$SRC/tests/text/tiny_tokenizer.json"
expect text-init 0 "wrote" -- "$PS" init --config "$SRC/tests/text/tiny_model.json" --out "$T/tm" --seed 2
expect text 0 "wrote" -- "$PS" generate --model "$T/tm" --tokenizer "$TT" --prompt "the cat sat on" --max-tokens 5 --out "$T/tg"
ok python3 -c "import json,sys; s=json.load(open(sys.argv[1]))['sequences'][0]; assert len(s['tokens'])==5 and isinstance(s['text'], str)" "$T/tg/generate.json"
# errors: one line, exit 2 for usage
expect no-input 2 "give one of --prompt" -- "$PS" generate --model "$M"
expect prompt-no-tok 2 "--prompt needs --tokenizer" -- "$PS" generate --model "$M" --prompt hi
expect bad-edit 2 "--edit: edit \"blocks.0.attn.cache_ck:99:0:zero\": KV head 99" -- "$PS" generate --model "$M" --tokens "$T/t.json" --edit blocks.0.attn.cache_ck:99:0:zero
expect bad-hook 2 "--hooks: " -- "$PS" generate --model "$M" --tokens "$T/t.json" --hooks blocks.0.nope
expect bad-cache 2 "--hooks: \"blocks.3.attn.cache_ck\": layer 3" -- "$PS" generate --model "$M" --tokens "$T/t.json" --hooks blocks.3.attn.cache_ck
expect bad-temp 2 "--temperature -1" -- "$PS" generate --model "$M" --tokens "$T/t.json" --temperature -1
expect mean-missing 1 "no prompt holds entry 50" -- "$PS" generate --model "$M" --tokens "$T/t.json" --edit blocks.0.attn.cache_cv:0:50:mean
# DeepSeek-V4 (tests/conformance/v4/mix4: sliding, CSA rate 4, HCA rate 8, CSA rate 4) through its own cache:
# greedy tokens = the argmax of `forward` on prompt + generated, the log-probabilities its log-softmax; the
# compressor's entries fire once per window; the cache points cache_kv / cache_ik read at the end; edits
V4="$SRC/tests/conformance/v4/mix4"
echo '[[242, 200, 78, 61, 27, 248, 247, 218, 52, 39, 130, 111, 7], [5, 9]]' > "$T/v4t.json"
expect v4-greedy 0 "wrote" -- "$PS" generate --model "$V4" --tokens "$T/v4t.json" --max-tokens 24 --out "$T/v4g" \
  --hooks layers.2.attn.compressor.kv,layers.3.attn.cache_kv,layers.3.attn.cache_ik,layers.1.attn.indexer.topk
python3 - "$T/v4g/generate.json" "$T/v4full.json" <<'PY'
import json, sys
g = json.load(open(sys.argv[1]))
json.dump([s["prompt"] + s["tokens"] for s in g["sequences"]], open(sys.argv[2], "w"))
PY
expect v4-forward 0 "wrote" -- "$PS" forward --model "$V4" --tokens "$T/v4full.json" --out "$T/v4f.safetensors"
ok python3 - "$T/v4g/generate.json" "$T/v4f.safetensors" "$T/v4g/hooks.safetensors" <<'PY'
import json, math, struct, sys
g = json.load(open(sys.argv[1]))
def st(p):
    b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n]); out = {}
    for k, v in h.items():
        if k == "__metadata__": continue
        a, e = v["data_offsets"]; out[k] = (v["shape"], struct.unpack("<%df" % ((e - a) // 4), b[8 + n + a:8 + n + e]))
    return out
f, h = st(sys.argv[2]), st(sys.argv[3])
for i, s in enumerate(g["sequences"]):
    (T, V), lg = f["logits.%d" % i]
    P = len(s["prompt"]); n = len(s["tokens"])
    assert n == 24 and T == P + n, (n, T)
    for k in range(n):
        row = lg[(P - 1 + k) * V:(P + k) * V]
        arg = max(range(V), key=lambda v: (row[v], -v))
        assert arg == s["tokens"][k], ("sequence", i, "step", k, arg, s["tokens"][k])
        mx = max(row); lp = row[arg] - mx - math.log(sum(math.exp(x - mx) for x in row))
        assert abs(lp - s["logprobs"][k]) < 1e-4, (lp, s["logprobs"][k])
    # positions 0..T-2 went through the cache (the last generated token is never appended)
    assert h["layers.2.attn.compressor.kv.%d" % i][0] == [(T - 1) // 8, 32], h["layers.2.attn.compressor.kv.%d" % i][0]
    assert h["layers.3.attn.cache_kv.%d" % i][0] == [(T - 1) // 4, 1, 32], h["layers.3.attn.cache_kv.%d" % i][0]
    assert h["layers.3.attn.cache_ik.%d" % i][0] == [(T - 1) // 4, 1, 16], h["layers.3.attn.cache_ik.%d" % i][0]
    # indexer.topk grows wider as entries appear: recorded at its widest, narrower rows padded with NaN; row p
    # (position p) picks among the (p + 1) // 4 entries it sees, -1 where it has fewer than its width
    (R, K), tk = h["layers.1.attn.indexer.topk.%d" % i]
    assert R == T - 1 and K == min(4, (T - 1) // 4), (R, K)
    for p in range(R):
        row = tk[p * K:(p + 1) * K]
        m = [x for x in row if x == x]
        assert all(x != x for x in row[len(m):]), ("NaN only at the end of a row", p, row)
        assert all(x == -1 or (x == int(x) and 0 <= x < (p + 1) // 4) for x in m), (p, row)
        assert len([x for x in m if x >= 0]) == min(len(m), (p + 1) // 4), (p, row)
PY
expect v4-again 0 "wrote" -- "$PS" generate --model "$V4" --tokens "$T/v4t.json" --max-tokens 24 --out "$T/v4g2" \
  --hooks layers.2.attn.compressor.kv,layers.3.attn.cache_kv,layers.3.attn.cache_ik,layers.1.attn.indexer.topk
ok cmp "$T/v4g/hooks.safetensors" "$T/v4g2/hooks.safetensors"
expect v4-edit 0 "wrote" -- "$PS" generate --model "$V4" --tokens "$T/v4t.json" --max-tokens 6 --out "$T/v4e" \
  --hooks layers.1.attn.cache_kv --edit layers.1.attn.cache_kv:0:1:zero,layers.3.attn.cache_ik:0:2:mean
ok python3 - "$T/v4e/hooks.safetensors" <<'PY'
import json, struct, sys
b = open(sys.argv[1], "rb").read(); n = struct.unpack("<Q", b[:8])[0]; hd = json.loads(b[8:8 + n])
v = hd["layers.1.attn.cache_kv.0"]; a, e = v["data_offsets"]; x = struct.unpack("<%df" % ((e - a) // 4), b[8 + n + a:8 + n + e])
assert v["shape"][1:] == [1, 32] and all(t == 0 for t in x[32:64]) and any(t != 0 for t in x[:32]), "entry 1 zeroed, entry 0 not"
PY
expect v4-bad-edit 2 "--edit: edit \"layers.2.attn.cache_ik:0:0:zero\": \"layers.2.attn.cache_ik\": layer 2 has no indexer" -- \
  "$PS" generate --model "$V4" --tokens "$T/v4t.json" --edit layers.2.attn.cache_ik:0:0:zero
expect v4-bad-head 2 "a DeepSeek-V4 layer has one K = V head" -- "$PS" generate --model "$V4" --tokens "$T/v4t.json" --edit layers.1.attn.cache_kv:1:0:zero
# MiniCPM4 (InfLLM-v2) through its family table's KV cache: the conformance checkpoint's 250-token prompt prefilled,
# then 12 greedy steps, equal token for token to the reference decode (tests/conformance/infllm/tiny)
MC="$SRC/tests/conformance/infllm/tiny"
python3 - "$MC/reference_outputs.safetensors" "$T/mct.json" "$T/mc_want.txt" <<'PY'
import array, json, sys
b = open(sys.argv[1], "rb").read(); n = int.from_bytes(b[:8], "little"); hd = json.loads(b[8:8 + n])
a, e = hd["decode.tokens"]["data_offsets"]; t = array.array("q"); t.frombytes(b[8 + n + a:8 + n + e]); t = list(t)
json.dump([t[:250]], open(sys.argv[2], "w")); open(sys.argv[3], "w").write(" ".join(map(str, t[250:262])))
PY
expect minicpm-generate 0 "sequence 0: $(cat "$T/mc_want.txt")" -- "$PS" generate --model "$MC" --tokens "$T/mct.json" --max-tokens 12 --out "$T/mcg"
expect minicpm-no-edit 2 "pooled keys are read-only" -- "$PS" generate --model "$MC" --tokens "$T/mct.json" --max-tokens 2 --edit blocks.0.attn.cache_ck:0:0:zero
# hooks during its appends (the prefill's rows at once, then one row per step) and the cache point cache_ck (the
# level-1 pooled keys: one per complete window of 8 tokens every 4, 61 in the 250 + 1 appended tokens)
expect minicpm-hooks 0 "wrote 2 tensors" -- "$PS" generate --model "$MC" --tokens "$T/mct.json" --max-tokens 2 --out "$T/mch" \
  --hooks blocks.1.attn.hook_blocks,blocks.0.attn.cache_ck
ok python3 - "$T/mch/hooks.safetensors" <<'PY'
import json, struct, sys
b = open(sys.argv[1], "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n])
assert h["blocks.1.attn.hook_blocks.0"]["shape"] == [251, 2, 6], h
assert h["blocks.0.attn.cache_ck.0"]["shape"] == [61, 2, 16], h
PY
# serve on MiniCPM4: a greedy /v1/completions of the same prompt answers generate's tokens and log-probabilities
if "$PS" serve --help > /dev/null 2>&1; then
  "$PS" serve --model "$MC" --port 0 --port-file "$T/mc.port" > "$T/mc_serve.log" 2>&1 &
  SP=$!
  for _ in $(seq 100); do [ -s "$T/mc.port" ] && break; sleep 0.1; done
  ok python3 - "$(cat "$T/mc.port" 2>/dev/null)" "$T/mct.json" "$T/mcg/generate.json" <<'PY'
import json, sys, urllib.request
port, prompt, g = sys.argv[1], json.load(open(sys.argv[2]))[0], json.load(open(sys.argv[3]))["sequences"][0]
body = {"prompt": prompt, "max_tokens": 12, "temperature": 0, "logprobs": 1, "return_tokens_as_token_ids": True}
rq = urllib.request.Request("http://127.0.0.1:%s/v1/completions" % port, json.dumps(body).encode(), {"Content-Type": "application/json"})
lp = json.load(urllib.request.urlopen(rq, timeout=60))["choices"][0]["logprobs"]
got = [int(t.split(":")[1]) for t in lp["tokens"]]
assert got == g["tokens"], (got, g["tokens"])
assert max(abs(a - b) for a, b in zip(lp["token_logprobs"], g["logprobs"])) < 1e-5, (lp["token_logprobs"], g["logprobs"])
PY
  kill "$SP"; wait "$SP" 2> /dev/null
fi
# the select attention (experiments/configs/demo/select.json's shape, random weights) through the KV cache: sampled
# tokens (temperature 1, so they vary) whose log-probabilities are the log-softmax of `forward` on prompt plus
# generated; the prompts cross block and window boundaries; hook_blocks fires for every appended row, hook_ck once per
# complete level-1 window; the cache has no cache points; and the same run greedy is the argmax of `forward`
expect sel-init 0 "wrote" -- "$PS" init --config "$SRC/experiments/configs/demo/select.json" --out "$T/sel" --seed 3
echo '[[0, 5, 7, 9, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18], [0, 3, 4]]' > "$T/selt.json"
for mode in sample greedy; do
  opt=""; [ "$mode" = sample ] && opt="--temperature 1 --seed 4"
  expect sel-$mode 0 "wrote" -- "$PS" generate --model "$T/sel" --tokens "$T/selt.json" --max-tokens 40 $opt --out "$T/sel_$mode" \
    --hooks blocks.1.attn.hook_blocks,blocks.0.attn.hook_ck
  python3 - "$T/sel_$mode/generate.json" "$T/sel_full_$mode.json" <<'PY'
import json, sys
g = json.load(open(sys.argv[1]))
json.dump([s["prompt"] + s["tokens"] for s in g["sequences"]], open(sys.argv[2], "w"))
PY
  expect sel-forward-$mode 0 "wrote" -- "$PS" forward --model "$T/sel" --tokens "$T/sel_full_$mode.json" --out "$T/sel_f_$mode.safetensors"
  ok python3 - "$T/sel_$mode/generate.json" "$T/sel_f_$mode.safetensors" "$T/sel_$mode/hooks.safetensors" "$mode" <<'PY'
import json, math, struct, sys
g = json.load(open(sys.argv[1])); mode = sys.argv[4]
def st(p):
    b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n]); out = {}
    for k, v in h.items():
        if k == "__metadata__": continue
        a, e = v["data_offsets"]; out[k] = (v["shape"], struct.unpack("<%df" % ((e - a) // 4), b[8 + n + a:8 + n + e]))
    return out
f, h = st(sys.argv[2]), st(sys.argv[3])
distinct = set()
for i, s in enumerate(g["sequences"]):
    (T, V), lg = f["logits.%d" % i]
    P = len(s["prompt"]); n = len(s["tokens"])
    assert n == 40 and T == P + n, (n, T)
    distinct |= set(s["tokens"])
    for k in range(n):
        row = lg[(P - 1 + k) * V:(P + k) * V]
        tk = s["tokens"][k]
        if mode == "greedy":
            assert max(range(V), key=lambda v: (row[v], -v)) == tk, ("sequence", i, "step", k)
        mx = max(row); lp = row[tk] - mx - math.log(sum(math.exp(x - mx) for x in row))
        assert abs(lp - s["logprobs"][k]) < 1e-4, ("sequence", i, "step", k, lp, s["logprobs"][k])
    # positions 0..T-2 went through the cache: one blocks row each ([rows, KV heads 4, slots topk 3 + local 1]),
    # one level-1 pooled key per complete window of 8 every 4
    assert h["blocks.1.attn.hook_blocks.%d" % i][0] == [T - 1, 4, 4], h["blocks.1.attn.hook_blocks.%d" % i][0]
    assert h["blocks.0.attn.hook_ck.%d" % i][0] == [(T - 1 - 8) // 4 + 1, 4, 16], h["blocks.0.attn.hook_ck.%d" % i][0]
assert mode == "greedy" or len(distinct) > 5, distinct
PY
done
expect sel-no-cache-points 2 "no entries to read or edit" -- "$PS" generate --model "$T/sel" --tokens "$T/selt.json" --max-tokens 2 --edit blocks.0.attn.cache_ck:0:0:zero
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
