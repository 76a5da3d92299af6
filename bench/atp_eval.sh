#!/usr/bin/env bash
# atp_eval.sh — attribution patching measured against the exact knockout grid (docs/results.md,
# "Attribution patching"): per shipped model the exact grid and the estimate (fix qk where the model has
# it, and fix none), each timed (wall, user + system CPU, peak memory) in the same run, then
# `phasescope atp-compare` (correlations, recall of the strong cells, worst false negatives, figure).
#   bench/atp_eval.sh [OUT] [MODEL...]      (default OUT out/atp_eval; models: the shipped ones with a knockout)
# Environment: THREADS (default 1: both methods on one core, so the ratio is not the machine's load),
# STAGE=exact|atp|compare|all (default all; exact grids already in OUT are kept).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-out/atp_eval}
shift || true
MODELS=("$@")
[ ${#MODELS[@]} -gt 0 ] || MODELS=(w8s8 deep_w8s8 deep_full deep_w8s6 deep_w12s12 v4demo)
PS=${PS:-build/phasescope}
THREADS=${THREADS:-1}
STAGE=${STAGE:-all}
mkdir -p "$OUT"
timed() { # timed NAME DIR ARGS...: run phasescope with /usr/bin/time, the times into DIR/time.json
    local name=$1 dir=$2
    shift 2
    mkdir -p "$dir"
    OMP_NUM_THREADS=$THREADS OPENBLAS_NUM_THREADS=$THREADS /usr/bin/time -f '{"wall_s": %e, "user_s": %U, "sys_s": %S, "max_rss_kb": %M}' \
        -o "$dir/time.json" "$PS" "$@" --out "$dir" > "$dir/stdout.txt" 2> "$dir/stderr.txt" || {
        echo "$name failed:"; tail -5 "$dir/stderr.txt"; return 1; }
    echo "$name: $(cat "$dir/time.json")"
}
for m in "${MODELS[@]}"; do
    d=$OUT/$m
    if [[ $STAGE == all || $STAGE == exact ]] && [ ! -s "$d/exact/knockout.json" ]; then
        timed "$m exact" "$d/exact" knockout --model "data/models/$m"
    fi
    if [[ $STAGE == all || $STAGE == atp ]]; then
        fixes=(qk none)
        [ "$m" = v4demo ] && fixes=(none)
        for f in "${fixes[@]}"; do timed "$m atp ($f)" "$d/atp_$f" knockout --model "data/models/$m" --method atp --atp-fix "$f"; done
    fi
    if [[ $STAGE == all || $STAGE == compare ]]; then
        for f in qk none; do
            [ -s "$d/atp_$f/knockout.json" ] || continue
            "$PS" atp-compare "$d/exact/knockout.json" "$d/atp_$f/knockout.json" --out "$d/compare_$f" \
                --times "$d/exact/time.json,$d/atp_$f/time.json" > "$d/compare_$f.txt"
            head -3 "$d/compare_$f.txt"
        done
    fi
done
# the summary table (docs/results.md, "Attribution patching")
if [[ $STAGE == all || $STAGE == compare ]]; then
    python3 - "$OUT" "${MODELS[@]}" > "$OUT/summary.md" <<'PY'
import json, os, sys
out, models = sys.argv[1], sys.argv[2:]
print("| model | fix | cells | strong | recall (top 2k) | worst strong rank | Pearson | Spearman | cell Spearman | exact wall / CPU s | AtP wall / CPU s | speed-up wall / CPU |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for m in models:
    for f in ("qk", "none"):
        p = os.path.join(out, m, "compare_" + f, "atp_compare.json")
        if not os.path.exists(p): continue
        d = json.load(open(p)); t = d.get("times", {})
        te, ta = t.get("exact", {}), t.get("estimate", {})
        cpu = lambda x: x.get("user_s", 0) + x.get("sys_s", 0)
        r = lambda v: "n/a" if v is None else "%.3f" % v
        print("| %s | %s | %d | %d | %.2f | %d | %s | %s | %s | %.0f / %.0f | %.0f / %.0f | %.1f× / %.1f× |" % (
            m, f, len(d["grid"]["layers"]), len(d["strong"]), d["recall"], d["max_strong_rank"], r(d["pearson"]), r(d["spearman"]),
            r(d["cell_spearman"]), te.get("wall_s", 0), cpu(te), ta.get("wall_s", 0), cpu(ta), t.get("wall_ratio") or 0, t.get("cpu_ratio") or 0))
PY
    cat "$OUT/summary.md"
fi
