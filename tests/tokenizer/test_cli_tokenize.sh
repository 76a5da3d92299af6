#!/usr/bin/env bash
# `phasescope tokenize`: encode and decode through files, --add-special, --skip-special, exit statuses
# (0 done, 1 a bad file, 2 a bad command line) and one-line errors. Usage: test_cli_tokenize.sh BUILD_DIR
set -u
bin="$1/phasescope"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0
ok() { if eval "$2"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: $1" >&2; fi; }
cat > "$tmp/tok.json" <<'JSON'
{"model": {"type": "BPE", "vocab": {"<s>": 0, "h": 1, "i": 2, "hi": 3, "Ġ": 4, "Ġhi": 5, "!": 6},
           "merges": ["h i", ["Ġ", "hi"]]},
 "added_tokens": [{"id": 0, "content": "<s>", "special": true, "normalized": false}],
 "normalizer": {"type": "NFC"},
 "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
 "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
   {"Sequence": {"id": "A", "type_id": 0}}], "special_tokens": {"<s>": {"id": "<s>", "ids": [0], "tokens": ["<s>"]}}},
 "decoder": {"type": "ByteLevel"}}
JSON
printf '["hi hi!", "<s>hi", ""]' > "$tmp/in.json"
"$bin" tokenize --tokenizer "$tmp/tok.json" --in "$tmp/in.json" --out "$tmp/ids.json" > "$tmp/log"
ok "encode exits 0" "[ $? -eq 0 ]"
ok "encoded ids" "[ \"\$(tr -d ' \n' < $tmp/ids.json)\" = '[[3,5,6],[0,3],[]]' ]"
ok "summary line" "grep -q 'encoded 3 strings, 5 tokens' $tmp/log"
"$bin" tokenize --tokenizer "$tmp/tok.json" --in "$tmp/in.json" --out "$tmp/ids2.json" --add-special > /dev/null
ok "--add-special adds the template's BOS" "[ \"\$(tr -d ' \n' < $tmp/ids2.json)\" = '[[0,3,5,6],[0,0,3],[0]]' ]"
"$bin" tokenize --tokenizer "$tmp/tok.json" --decode --in "$tmp/ids.json" --out "$tmp/back.json" > /dev/null
ok "decode round trip" "[ \"\$(tr -d '\n' < $tmp/back.json)\" = '[\"hi hi!\",\"<s>hi\",\"\"]' ]"
"$bin" tokenize --tokenizer "$tmp/tok.json" --decode --skip-special --in "$tmp/ids2.json" --out "$tmp/back2.json" > /dev/null
ok "--skip-special" "[ \"\$(tr -d '\n' < $tmp/back2.json)\" = '[\"hi hi!\",\"hi\",\"\"]' ]"
"$bin" tokenize --help | grep -q 'usage: phasescope tokenize'
ok "--help" "[ $? -eq 0 ]"
expect() { # status, message substring, args...
  local want=$1 msg=$2; shift 2
  "$bin" tokenize "$@" > /dev/null 2> "$tmp/err"; local rc=$?
  ok "exit $want for $* (got $rc: $(cat "$tmp/err"))" "[ $rc -eq $want ] && grep -q -- \"$msg\" $tmp/err && [ \$(wc -l < $tmp/err) -eq 1 ]"
}
expect 2 "--out is required" --tokenizer "$tmp/tok.json" --in "$tmp/in.json"
expect 2 "unknown flag --bogus" --tokenizer "$tmp/tok.json" --in "$tmp/in.json" --out "$tmp/x" --bogus
expect 2 "--add-special applies to encoding" --tokenizer "$tmp/tok.json" --decode --add-special --in "$tmp/ids.json" --out "$tmp/x"
expect 2 "--skip-special applies to --decode only" --tokenizer "$tmp/tok.json" --skip-special --in "$tmp/in.json" --out "$tmp/x"
expect 1 "nope.json: cannot open" --tokenizer "$tmp/nope.json" --in "$tmp/in.json" --out "$tmp/x"
expect 1 "item 0 is not a string" --tokenizer "$tmp/tok.json" --in "$tmp/ids.json" --out "$tmp/x"
expect 1 "item 0 is not a list of ids" --tokenizer "$tmp/tok.json" --decode --in "$tmp/in.json" --out "$tmp/x"
printf '[[1, 99]]' > "$tmp/bad_ids.json"
expect 1 "id 99 at position 1 is not in the vocabulary" --tokenizer "$tmp/tok.json" --decode --in "$tmp/bad_ids.json" --out "$tmp/x"
printf '{"model": {"vocab": {"a": 0}, "merges": ["a b"]}}' > "$tmp/bad_tok.json"
expect 1 "bad_tok.json: model.merges\[0\]" --tokenizer "$tmp/bad_tok.json" --in "$tmp/in.json" --out "$tmp/x"
ok "no output file after a failure" "[ ! -e $tmp/x ]"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
