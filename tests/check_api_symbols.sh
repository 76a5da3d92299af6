#!/usr/bin/env bash
# check_api_symbols.sh SRC_DIR BUILD_DIR — what libphasescope.so exports and what the registry names:
#  1. nm -D --defined-only lists only ps_api_* names, and exactly the functions include/phasescope.h
#     declares (PS_API ... ps_api_NAME(): none missing, none extra);
#  2. the build's per-command links are the registry's commands (`phasescope --commands`);
#  3. every result kind instruments/registry.c names is a kind of viz/kinds.c.
set -uo pipefail
src=${1:?usage: check_api_symbols.sh SRC_DIR BUILD_DIR}; build=${2:?}
lib=$build/libphasescope.so
bad=0
[ -f "$lib" ] || { echo "no $lib"; exit 1; }
exported=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[TtDdBbRrVvWwi]$/ {print $3}' | sort -u)
others=$(grep -v '^ps_api_' <<<"$exported" || true)
if [ -n "$others" ]; then echo "libphasescope.so exports names outside the API:"; echo "$others" | head -20; bad=1; fi
declared=$(tr '\n' ' ' < "$src/include/phasescope.h" | grep -oE 'PS_API [^;{]*\bps_api_[a-z0-9_]+\(' | grep -oE 'ps_api_[a-z0-9_]+\($' | tr -d '(' | sort -u)
missing=$(comm -23 <(echo "$declared") <(echo "$exported"))
extra=$(comm -13 <(echo "$declared") <(echo "$exported"))
if [ -n "$missing" ]; then echo "declared in phasescope.h but not exported: $missing"; bad=1; fi
if [ -n "$extra" ]; then echo "exported but not declared in phasescope.h: $extra"; bad=1; fi
n=$(echo "$declared" | wc -l)
[ "$n" -ge 40 ] || { echo "only $n API functions found in phasescope.h (the parse is broken)"; bad=1; }
# 2. the links
cmds=$(OMP_NUM_THREADS=1 "$build/phasescope" --commands | sort)
[ "$(echo "$cmds" | wc -l)" -ge 10 ] || { echo "phasescope --commands lists too few commands"; bad=1; }
for c in $cmds; do
  [ "$(readlink "$build/$c")" = phasescope ] || { echo "no link $build/$c -> phasescope"; bad=1; }
done
links=$(find "$build" -maxdepth 1 -type l -lname phasescope -printf '%f\n' | sort)
if [ "$links" != "$cmds" ]; then echo "links in $build that are not commands: $(comm -13 <(echo "$cmds") <(echo "$links"))"; bad=1; fi
# 3. the kinds
kinds=$(grep -oE '^\s*\{&ps_cmd_[a-z_]+,\s*[A-Za-z_]+,\s*"[a-z_]+"' "$src/instruments/registry.c" | grep -oE '"[a-z_]+"$' | tr -d '"')
[ -n "$kinds" ] || { echo "no kinds parsed from instruments/registry.c"; bad=1; }
for k in $kinds; do
  grep -qE "^\s*\{\"$k\"," "$src/viz/kinds.c" || { echo "registry kind $k is not a kind of viz/kinds.c"; bad=1; }
done
if [ $bad -ne 0 ]; then echo "check_api_symbols: FAILED"; exit 1; fi
echo "check_api_symbols: $n API functions exported, nothing else; $(echo "$cmds" | wc -w) command links; kinds: $(echo $kinds)"
