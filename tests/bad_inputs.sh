#!/usr/bin/env bash
# bad_inputs.sh — the bad-input table of docs/bad-inputs.md, checked: every row's command is run, its exit
# status must equal the documented one (2 for a usage error, 1 for a runtime error) and its one-line error
# the documented one (after the fixtures' paths are filled in).
#   bad_inputs.sh BUILD_DIR SRC_DIR CONFORMANCE_DIR          check the table
#   bad_inputs.sh BUILD_DIR SRC_DIR CONFORMANCE_DIR --print  print the rows as they run now
set -u
B=$(cd "$1" && pwd); SRC=$(cd "$2" && pwd); CONF=$(cd "$3" && pwd); MODE="${4:-check}"
PS="$B/phasescope"
T=$(mktemp -d /tmp/ps_bad.XXXXXX); trap 'rm -rf "$T"' EXIT
# ---- fixtures ----
echo '[[0, 1, 2, 3]]' > "$T/tok.json"
python_free_long=$(printf '[[0'; for i in $(seq 1 60); do printf ', 1'; done; printf ']]'); echo "$python_free_long" > "$T/long.json"
sed 's/"steps": 400/"steps": 10/' "$SRC/experiments/configs/tiny_kv_w4s4.json" > "$T/tiny.json"
"$PS" train --config "$T/tiny.json" --out "$T/run" > /dev/null 2>&1
sed 's/"kind": "compressed", "window": 4, "stride": 4, "local_window": 4/"kind": "full"/' "$T/tiny.json" > "$T/tinyfull.json"
"$PS" train --config "$T/tinyfull.json" --out "$T/fullrun" > /dev/null 2>&1
sed 's/"train":/"trian":/' "$T/tiny.json" > "$T/badtrain.json"
cp -r "$CONF/compressed_w8s8" "$T/trunc" && chmod -R u+w "$T/trunc" && head -c 100 "$CONF/compressed_w8s8/model.safetensors" > "$T/trunc/model.safetensors"
cp -r "$CONF/compressed_w8s8" "$T/short" && chmod -R u+w "$T/short" && printf 'abc' > "$T/short/model.safetensors"
cp -r "$CONF/compressed_w8s8" "$T/huge" && chmod -R u+w "$T/huge" && printf '\x00\x00\x00\x00\x00\x01\x00\x00{}' > "$T/huge/model.safetensors"
cp -r "$CONF/compressed_w8s8" "$T/lie" && chmod -R u+w "$T/lie"
hdr='{"model.embed_tokens.weight":{"dtype":"F32","shape":[50,24],"data_offsets":[0,4800000]}}'
{ printf "$(printf '\\x%02x' ${#hdr} 0 0 0 0 0 0 0)"; printf '%s' "$hdr"; head -c 4800 /dev/zero; } > "$T/lie/model.safetensors"
cp -r "$CONF/compressed_w8s8" "$T/shape" && chmod -R u+w "$T/shape" && sed -i 's/"d_ff": 40/"d_ff": 48/' "$T/shape/config.json"
cp -r "$CONF/compressed_w8s8" "$T/nan" && chmod -R u+w "$T/nan"
hl=$(od -An -t u8 -N8 "$T/nan/model.safetensors" | tr -d ' ')
printf '\x00\x00\xc0\x7f' | dd of="$T/nan/model.safetensors" bs=1 seek=$((8 + hl)) conv=notrunc 2>/dev/null
mkdir -p "$T/dirmodel" && mkdir "$T/dirmodel/model.safetensors" && cp "$CONF/compressed_w8s8/config.json" "$T/dirmodel/"
mkdir -p "$T/nost" && cp "$CONF/compressed_w8s8/config.json" "$T/nost/"
cp -r "$CONF/compressed_w8s8" "$T/badcfg" && chmod -R u+w "$T/badcfg" && sed -i 's/"n_heads": 4/"n_heads": 3/' "$T/badcfg/config.json"
# ---- sharded checkpoints (qwen3_published: two BF16 shards + model.safetensors.index.json) ----
ix() { cp -r "$CONF/qwen3_published" "$T/$1" && chmod -R u+w "$T/$1"; }
S2=model-00002-of-00002.safetensors
ix ix_noshard && rm "$T/ix_noshard/$S2"
ix ix_two && cp "$T/ix_two/model-00001-of-00002.safetensors" "$T/ix_two/$S2"
ix ix_absent && printf '\x02\x00\x00\x00\x00\x00\x00\x00{}' > "$T/ix_absent/$S2"   # a valid shard holding no tensor
ix ix_unlisted
hdr='{"extra":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}'
{ printf "$(printf '\\x%02x' ${#hdr} 0 0 0 0 0 0 0)"; printf '%s' "$hdr"; head -c 4 /dev/zero; } > "$T/ix_unlisted/$S2"
ix ix_dotdot && sed -i "s#\"$S2\"#\"../$S2\"#" "$T/ix_dotdot/model.safetensors.index.json"
ix ix_abs && sed -i "s#\"$S2\"#\"/etc/passwd\"#" "$T/ix_abs/model.safetensors.index.json"
ix ix_link && rm "$T/ix_link/$S2" && ln -s "$CONF/qwen3_published/$S2" "$T/ix_link/$S2"
ix ix_json && printf '{"weight_map": {' > "$T/ix_json/model.safetensors.index.json"
ix ix_wmarr && printf '{"weight_map": ["%s"]}' "$S2" > "$T/ix_wmarr/model.safetensors.index.json"
ix ix_nonstr && printf '{"weight_map": {"model.norm.weight": 2}}' > "$T/ix_nonstr/model.safetensors.index.json"
ix ix_sliding && sed -i '0,/"full_attention",/s//"sliding_attention",/' "$T/ix_sliding/config.json"
ix ix_yarn && sed -i 's/"rope_type": "default"/"rope_type": "yarn"/' "$T/ix_yarn/config.json"
# ---- DeepSeek-V4 checkpoints (SPEC-v4; conformance/v4/hub3) ----
v4() { cp -r "$CONF/v4/hub3" "$T/$1" && chmod -R u+w "$T/$1"; }
v4 v4shape && sed -i 's/"q_lora_rank": 24/"q_lora_rank": 20/' "$T/v4shape/config.json"
v4 v4layers && sed -i 's/"num_hidden_layers": 3/"num_hidden_layers": 4/' "$T/v4layers/config.json"
v4 v4rope && sed -i 's/"type": "yarn"/"type": "linear"/' "$T/v4rope/config.json"
# ---- the instruments on DeepSeek-V4 checkpoints and the channel attention ----
cp "$SRC/experiments/configs/v4/task_kv_small.json" "$T/v4task.json"
printf '{"task": {"kind": "kv-retrieval", "seq_len": 40, "n_keys": 4, "n_values": 2, "n_fillers": 1, "n_pairs": 2, "query_gap": 4, "n_queries": 1}, "ids": {"bos": 0, "marker": 1, "keys": [2, 3, 4, 5], "values": [6, 3], "fillers": [9]}}' > "$T/v4dup.json"
mkdir -p "$T/v4gqa" && sed 's/"n_kv_heads": 1/"n_kv_heads": 2/' "$SRC/data/models/v4demo/config.json" > "$T/v4gqa/config.json"
# ---- MiniCPM4 (InfLLM-v2) knockout: copies of the conformance checkpoint that run dense below 512 tokens / always ----
for d in 512 2048; do
  mkdir -p "$T/mcdense$d" && ln -s "$CONF/infllm/tiny/model.safetensors" "$T/mcdense$d/model.safetensors"
  sed "s/\"dense_len\": 0/\"dense_len\": $d/" "$CONF/infllm/tiny/config.json" > "$T/mcdense$d/config.json"
done
# ---- result files for render and table (the result validator, viz/results_check.c) ----
"$PS" sweep --model "$T/run" --n 4 --out "$T/res" > /dev/null 2>&1
S="$T/res/sweep.json"
echo '{"kind": "sweep"}' > "$T/r_kind_only.json"
sed 's/^ "curve": {/ "old_curve": {/' "$S" > "$T/r_nocurve.json"
sed 's/^ "kind": "sweep",/ "kind": "sweep", "curve": "x",/; s/^ "curve": {/ "old_curve": {/' "$S" > "$T/r_curvestr.json"
sed 's/^ "provenance": {/ "provenance": 7, "old_provenance": {/' "$S" > "$T/r_provnum.json"
sed '0,/"correct": [0-9]*/s//"correct": 99999/' "$S" > "$T/r_correct.json"
sed '0,/"accuracy": [0-9.e+-]*/s//"accuracy": 2.0/' "$S" > "$T/r_acc2.json"
sed '0,/"n": [0-9]*/s//"n": -5/' "$S" > "$T/r_negn.json"
sed 's/^  "period": \([0-9]*\),/  "period": 1000000000,/' "$S" > "$T/r_period.json"
awk -v P=1200 'BEGIN {   # a well-formed knockout result (P = 1200, one cell), for a reader of sweeps only
  z = 1.96; den = 1 + z * z; lo = (1 + z * z / 2) / den - z * sqrt(z * z / 4) / den
  printf "{\"kind\": \"knockout\", \"provenance\": {\"command\": \"knockout\", \"model\": \"m\", \"seed\": 0, \"version\": \"0.1.0\", "
  printf "\"config\": {\"attention\": {\"kind\": \"full\"}}, \"eval\": {\"n_prompts\": 1, \"period\": %d, \"family\": \"repeat\"}},\n", P
  printf "\"grid\": {\"period\": %d, \"target\": \"raw\", \"clean\": {\"period\": %d, \"residues\": [", P, P
  for (r = 0; r < P; r++) printf "%s{\"rho\": %d, \"n\": 1, \"correct\": 1, \"accuracy\": 1.0, \"wilson_lo\": %.17g, \"wilson_hi\": 1.0, \"mean_logprob\": 0.0}", (r ? ", " : ""), r, lo
  printf "], \"n\": %d, \"mean_accuracy\": 1.0, \"min_accuracy\": 1.0, \"max_accuracy\": 1.0, \"gap_pp\": 0.0, ", P
  printf "\"chi_square\": {\"statistic\": 0.0, \"df\": %d, \"p_value\": 1.0}, \"dominant_period\": null},\n", P - 1
  printf "\"cells\": [{\"layer\": 0, \"head\": 0, \"mean_delta_accuracy_pp\": 0.0, \"mean_delta_nll\": 0.0, \"residues\": ["
  for (r = 0; r < P; r++) printf "%s{\"rho\": %d, \"n\": 1, \"accuracy\": 1.0, \"mean_nll\": 0.0, \"delta_accuracy_pp\": 0.0, \"delta_nll\": 0.0}", (r ? ", " : ""), r
  printf "]}]}}\n" }' > "$T/r_bigko.json"
# ---- the table ----
HAS=$("$PS" info --help | sed -n 's/.*this build has: \([a-z, ]*\)).*/\1/p' | head -n 1)
pass=0; fail=0
row() { # row "what" "command" "exit status" "expected"
  local what="$1" cmd="$2" want_rc="$3" want="$4" got rc
  (cd "$T" && eval "$cmd") > /dev/null 2> "$T/.row_err"; rc=$?
  got=$(head -n 1 "$T/.row_err")
  got=${got//$T/\$T}; got=${got//$CONF/\$CONF}; got=${got//$B/\$B}
  got=${got//"(it has: $HAS)"/"(it has: \$BACKENDS)"}   # the backends of this build ("cpu" or "cpu, cuda")
  if [ "$MODE" = "--print" ]; then printf '| %s | `%s` | %s | `%s` |\n' "$what" "$cmd" "$rc" "$got"; return; fi
  if [ "$got" = "$want" ] && [ "$rc" = "$want_rc" ]; then pass=$((pass+1)); else fail=$((fail+1)); printf 'FAIL %s\n  want: %s (exit %s)\n  got:  %s (exit %s)\n' "$what" "$want" "$want_rc" "$got" "$rc" >&2; fi
}
if [ "$MODE" = "--print" ]; then echo '| input | command | exit | error |'; echo '|---|---|---|---|'; fi
# rows are read from the documentation so that the table and the tests cannot drift apart
while IFS= read -r line; do
  case "$line" in '| '*' | `'*) ;; *) continue ;; esac
  what=$(printf '%s' "$line" | sed -E 's/^\| ([^|]*) \| `.*$/\1/')
  cmd=$(printf '%s' "$line" | sed -E 's/^\| [^|]* \| `([^`]*)` \| .*$/\1/')
  want_rc=$(printf '%s' "$line" | sed -E 's/^.*` \| ([0-9]+) \| `[^`]*` \|$/\1/')
  case "$want_rc" in ''|*[!0-9]*) want_rc=1 ;; esac   # a row without an exit column must exit 1
  want=$(printf '%s' "$line" | sed -E 's/^.*\| `([^`]*)` \|$/\1/')
  row "$what" "$cmd" "$want_rc" "$want"
done < "$SRC/docs/bad-inputs.md"
[ "$MODE" = "--print" ] && exit 0
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ] && [ "$pass" -ge 20 ]
