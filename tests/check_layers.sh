#!/usr/bin/env bash
# check_layers.sh SRC_DIR [BUILD_DIR CC] — the layering as a build fact (docs/design.md).
#  1. Every quoted include of a layer header in a layer's sources names its folder ("core/ops.h") and a
#     layer at or below the includer's; an offending include is printed as FILE:LINE: text.
#  2. With BUILD_DIR and CC: for every layer and every layer above it, a file compiled with only that
#     layer's include folders (build/include/LAYER + those of the layers it links) that includes the
#     upper layer's header must fail to compile, and one including its own header must compile.
set -uo pipefail
src=${1:?usage: check_layers.sh SRC_DIR [BUILD_DIR CC]}
build=${2:-}
cc=${3:-cc}
cd "$src"
# what each layer may include (itself and the layers it links, in CMakeLists.txt's order)
declare -A may=(
  [core]="core"
  [text]="text core" [gates]="gates core" [scaleout]="scaleout core"
  [tasks]="tasks text core"
  [interventions]="interventions tasks text gates scaleout core"
  [train]="train tasks text gates scaleout core"
  [viz]="viz interventions tasks text gates scaleout core"
  [probe]="probe interventions tasks text gates scaleout core"
  [serve]="serve viz interventions train tasks text gates scaleout core"
  [instruments]="instruments serve probe viz interventions train tasks text gates scaleout core"
  [api]="api instruments serve probe viz interventions train tasks text gates scaleout core"
  [cli]="cli api instruments serve probe viz interventions train tasks text gates scaleout core"
)
layers="core text gates scaleout tasks interventions train viz probe serve instruments api cli"
# the layer headers by file name (a bare include of one of them is an error)
declare -A headers=()
for layer in $layers; do
  [ -d "$layer" ] || continue
  while IFS= read -r h; do headers[$(basename "$h")]=1; done < <(find "$layer" -name '*.h' -o -name '*.cuh')
done
bad=0
for layer in $layers; do
  [ -d "$layer" ] || continue
  while IFS= read -r hit; do
    file=${hit%%:*}; rest=${hit#*:}; line=${rest%%:*}; text=${rest#*:}
    inc=$(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' <<<"$text")
    [ -n "$inc" ] || continue
    top=${inc%%/*}
    if [ "$top" = "$inc" ]; then
      # a bare name: allowed only for a file that is not a layer header (none today)
      if [ -n "${headers[$inc]+x}" ]; then
        echo "$file:$line: include without its folder: $text"; bad=1
      fi
      continue
    fi
    case " ${may[$layer]} " in
      *" $top "*) ;;
      *) if [ -n "${may[$top]+x}" ]; then echo "$file:$line: $layer/ includes a layer above it ($top/): $text"; bad=1; fi ;;
    esac
  done < <(grep -rnE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' --include='*.c' --include='*.h' --include='*.cu' --include='*.cuh' "$layer" 2>/dev/null)
done
n_static=$bad
if [ -n "$build" ]; then
  tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
  first_header() { git ls-files "$1/*.h" | grep -v '/cuda/' | head -1; }
  for low in $layers; do
    [ -d "$build/include/$low" ] || continue
    flags=""; for l in ${may[$low]}; do [ -d "$build/include/$l" ] && flags+=" -I$build/include/$l"; done
    own=$(first_header "$low")
    printf '#include "%s"\nint ps_layer_probe;\n' "$own" > "$tmp/own.c"
    if ! $cc -std=c11 -D_DEFAULT_SOURCE -fsyntax-only $flags $(pkg-config --cflags jansson cairo libpcre2-8 libutf8proc 2>/dev/null) -I/usr/include/x86_64-linux-gnu/openblas-openmp "$tmp/own.c" 2>"$tmp/err"; then
      echo "layer $low cannot include its own header $own:"; head -3 "$tmp/err"; bad=1
    fi
    for high in $layers; do
      case " ${may[$low]} " in *" $high "*) continue ;; esac
      [ -d "$high" ] || continue
      h=$(first_header "$high"); [ -n "$h" ] || continue
      printf '#include "%s"\nint ps_layer_probe;\n' "$h" > "$tmp/up.c"
      if $cc -std=c11 -D_DEFAULT_SOURCE -fsyntax-only $flags "$tmp/up.c" 2>/dev/null; then
        echo "layer $low compiles an include of $h (a layer above it): the build does not enforce the layers"; bad=1
      fi
    done
  done
fi
if [ $bad -ne 0 ]; then echo "check_layers: FAILED"; exit 1; fi
echo "check_layers: every include names its folder and a layer at or below its own; upward includes do not compile"
