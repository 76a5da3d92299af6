#!/usr/bin/env bash
# check_family_strings.sh SRC_DIR — no file outside core/ (and tests/) tells model families or attention
# kinds apart by name (docs/design.md, "One door to every model"): core's family table decides
# (core/runtime.h: ps_family, ps_model_desc, ps_label_from_provenance), everything above asks it.
# A line is named (FILE:LINE: text) when it
#   1. compares a string (strcmp, strncmp, strcasecmp, strstr) with a family or attention-kind name:
#      "channel", "v4", "deepseek_v4", "phasescope", "qwen3", or "compressed" / "full" on a line that
#      speaks of a kind, an attention, a family or a model type ("compressed" alone is also a knockout
#      target's name);
#   2. compares a family's name (family->name, ops->name) with anything;
#   3. compares with a family's kind names (ps_v4_attn_type_name, the families' attention_kinds);
#   4. lists attention kinds as a table (two or more of "full", "compressed", "channel", "deepseek_v4").
# --self-test: the check run on a made-up tree must name each kind of line (and pass a clean one).
# Files listed in ALLOW (with the reason) are skipped; the list is meant to be empty.
set -uo pipefail
if [ "${1:-}" = "--self-test" ]; then
  t=$(mktemp -d); trap 'rm -rf "$t"' EXIT
  mkdir -p "$t/viz" "$t/core"
  printf 'int a(const char *k) { return !strcmp(k, "channel"); }\nint b(const char *kind) { return !strcmp(kind, "full"); }\n' > "$t/viz/bad.c"
  printf 'int c(const ps_runtime *rt) { return !strcmp(rt->family->name, "x"); }\nstatic const char *K[] = {"full", "compressed", 0};\n' >> "$t/viz/bad.c"
  printf 'int d(const char *s, int k) { return !strcmp(s, ps_v4_attn_type_name(k)); }\n' >> "$t/viz/bad.c"
  printf 'int e(const char *t) { return !strcmp(t, "compressed"); } /* a knockout target */\n' > "$t/viz/ok.c"
  printf 'int f(const char *k) { return !strcmp(k, "channel"); }\n' > "$t/core/ok.c"
  out=$(bash "$0" "$t"); rc=$?
  n=$(grep -c '^viz/bad.c:' <<<"$out")
  if [ $rc -ne 1 ] || [ "$n" -ne 5 ] || grep -q 'ok.c' <<<"$out"; then
    echo "check_family_strings --self-test: FAILED (rc $rc, $n of 5 lines named):"; echo "$out"; exit 1
  fi
  rm "$t/viz/bad.c"
  if ! bash "$0" "$t" >/dev/null; then echo "check_family_strings --self-test: FAILED (a clean tree fails)"; exit 1; fi
  echo "check_family_strings --self-test: every kind of line is named, a clean tree passes"; exit 0
fi
src=${1:?usage: check_family_strings.sh SRC_DIR | --self-test}
cd "$src"
# instruments/cmd_table.c: moved by the registry engineer in the same milestone; the lead wires it to
# ps_label_from_provenance at merge and removes this entry.
ALLOW=""
layers="text gates scaleout tasks interventions train viz serve instruments api cli"
cmp='(strcmp|strncmp|strcasecmp|strstr)[[:space:]]*\('
names='"(channel|v4|deepseek_v4|phasescope|qwen3)"'
ctx='(kind|attn|attention|family|model_type)'
bad=0
while IFS= read -r hit; do
  file=${hit%%:*}
  case " $ALLOW " in *" $file "*) continue ;; esac
  rest=${hit#*:}; line=${rest%%:*}; text=${rest#*:}
  why=""
  if grep -qE "$cmp" <<<"$text"; then
    if grep -qE "$names" <<<"$text"; then why="compares a family or attention-kind name"
    elif grep -qE '"(compressed|full)"' <<<"$text" && grep -qiE "$ctx" <<<"$text"; then why="compares an attention kind"
    elif grep -qE '(family|ops)->name' <<<"$text"; then why="compares a family's name"
    elif grep -qE 'attn_type_name|attention_kinds' <<<"$text"; then why="compares a layer's attention kind by name"
    fi
  fi
  if [ -z "$why" ]; then
    n=$(grep -oE '"(full|compressed|channel|deepseek_v4)"' <<<"$text" | sort -u | wc -l)
    [ "$n" -ge 2 ] && why="lists attention kinds"
  fi
  if [ -n "$why" ]; then echo "$file:$line: $why: $(sed 's/^[[:space:]]*//' <<<"$text")"; bad=1; fi
done < <(for l in $layers; do [ -d "$l" ] && grep -rnE '"(channel|v4|deepseek_v4|phasescope|qwen3|compressed|full)"|(family|ops)->name|attn_type_name|attention_kinds' --include='*.c' --include='*.h' --include='*.cu' "$l"; done)
if [ $bad -ne 0 ]; then echo "check_family_strings: FAILED (ask core: ps_family, ps_model_desc; docs/design.md)"; exit 1; fi
echo "check_family_strings: no file outside core/ compares a family or attention-kind name"
