#!/usr/bin/env bash
# test_mpi.sh — scale-out (docs/scale-out.md): the instruments split over MPI ranks (`mpirun -np 2` against
# `-np 1` and against one plain process: the same JSON, provenance.compute aside, and the same figures), the
# same split without MPI (--shard I/N and phasescope merge), data-parallel training (the loss curve of
# -np 2 against -np 1, --resume across rank counts), a rank killed during training (the others stop within
# seconds with a message naming the last checkpoint, which resumes) and a stuck rank (the stall limit).
# Without mpirun, or in a build without MPI, the MPI parts are skipped (said on a "skipped" line).
# Usage: test_mpi.sh BUILD_DIR SRC_DIR HAVE_MPI(ON|OFF) [PART]
#   PART: all (default); shards (the --shard/merge part: one process at a time, runs beside other tests);
#   mpi (everything under mpirun: ctest runs it alone, RUN_SERIAL, since oversubscribed ranks busy-wait)
set -u
B="$1"; SRC="$2"; HAVE_MPI="${3:-ON}"; PART="${4:-all}"; PS="$B/phasescope"
case "$PART" in all|shards|mpi) ;; *) echo "test_mpi.sh: PART must be all, shards or mpi, not $PART" >&2; exit 2;; esac
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
pass=0; fail=0
t_start=$SECONDS
SAN=0 # a sanitizer build (PS_SANITIZE): a few of the slowest runs are left to the plain build
grep -q '^PS_SANITIZE:BOOL=ON' "$B/CMakeCache.txt" 2>/dev/null && SAN=1
section() { echo "[$((SECONDS - t_start)) s] $*"; }
ok() { pass=$((pass+1)); }
bad() { fail=$((fail+1)); echo "FAIL $*" >&2; return 1; }
check() { if eval "$2"; then ok; else bad "$1"; fi; }
# same_json A B [IGNORE...]: equal but for provenance.compute (how it ran: threads, ranks, shards) and the
# provenance keys named (e.g. command, when the --out directories differ)
same_json() {
  python3 - "$@" compute <<'EOF'
import json, sys
def load(p):
    d = json.load(open(p))
    for k in sys.argv[3:]: d.get('provenance', {}).pop(k, None)
    return d
a, b = load(sys.argv[1]), load(sys.argv[2])
def walk(x, y, path):
    if isinstance(x, dict) and isinstance(y, dict):
        return any(walk(x.get(k), y.get(k), path + '.' + k) for k in sorted(set(x) | set(y)))
    if isinstance(x, list) and isinstance(y, list) and len(x) == len(y):
        return any(walk(u, v, '%s[%d]' % (path, i)) for i, (u, v) in enumerate(zip(x, y)))
    if type(x) != type(y) or x != y:
        print('differs at %s: %.200s / %.200s' % (path, x, y)); return True
    return False
sys.exit(1 if walk(a, b, '') else 0)
EOF
}
# the instruments pin one thread per process, as the bench does (the numbers do not depend on it)
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
D="$SRC/data/models/default"  # the deep W8/S8 (12 layers, 8 KV heads)
W="$SRC/data/models/w8s8"     # the one-layer W8/S8: knockout grids that take seconds
# the model of the sweep, gates and gatecycle runs: the deep one in the plain build; under the sanitizers the
# one-layer W8/S8 (the same code paths, a twelfth of the work: the 12-layer runs are the plain build's)
DM="$D"; [ "$SAN" = 1 ] && DM="$W"

# what both parts use: the text-kv model and sweep, the DeepSeek-V4 model and task
CONF="$SRC/tests/conformance"; TT="$SRC/tests/text/tiny_tokenizer.json"
"$PS" init --config "$SRC/tests/text/tiny_model.json" --out "$T/tm" --seed 2 > /dev/null 2>&1
TK=(sweep --task text-kv --model "$T/tm" --tokenizer "$TT" --n 10 --pairs 4 --batch 4)
cat > "$T/v4task.json" <<'EOF2'
{"task": {"kind": "kv-retrieval", "seq_len": 40, "n_keys": 16, "n_values": 16, "n_fillers": 4, "n_pairs": 4,
          "key_len": 1, "value_len": 1, "gap_min": 0, "gap_max": 3, "query_gap": 8, "n_queries": 2}}
EOF2
V4M="$CONF/v4/mix4"; V4A=(--model "$V4M" --task "$T/v4task.json" --n 7 --batch 3)

if [ "$PART" != mpi ]; then
# ---- --shard I/N and phasescope merge: no MPI needed ----
section "--shard and merge"
"$PS" knockout --model "$W" --n 64 --batch 16 --out "$T/ko1" > "$T/ko1.txt" 2>&1
for i in 0 1 2; do "$PS" knockout --model "$W" --n 64 --batch 16 --shard $i/3 --out "$T/kop" > /dev/null 2>&1; done
"$PS" merge "$T"/kop/knockout.part-*-of-3.safetensors --out "$T/kom" > "$T/kom.txt" 2>&1
check "knockout: 3 shards merged = one process" 'same_json "$T/ko1/knockout.json" "$T/kom/knockout.json" command'
check "knockout: merged summary = one process" 'cmp -s <(tail -n +2 "$T/ko1.txt" | sed "s#$T/ko1#X#") <(sed "s#$T/kom#X#" "$T/kom.txt")'
check "merged provenance says so" 'grep -q "merged from 3 shards" "$T/kom/knockout.json"'
"$PS" merge "$T/kop" --out "$T/komd" > /dev/null 2>&1
check "merge DIR: the shards' --out directory = its part files" 'same_json "$T/kom/knockout.json" "$T/komd/knockout.json" command'
# attribution patching splits and merges like the exact grid (every shard runs the backwards of its batches)
"$PS" knockout --model "$W" --n 32 --batch 8 --method atp --out "$T/atp1" > "$T/atp1.txt" 2>&1
for i in 0 1 2; do "$PS" knockout --model "$W" --n 32 --batch 8 --method atp --shard $i/3 --out "$T/atpp" > /dev/null 2>&1; done
"$PS" merge "$T/atpp" --out "$T/atpm" > "$T/atpm.txt" 2>&1
check "knockout --method atp: 3 shards merged = one process" 'same_json "$T/atp1/knockout.json" "$T/atpm/knockout.json" command'
check "knockout --method atp: the merged result is an estimate" 'grep -q "\"method\": \"atp\"" "$T/atpm/knockout.json"'
mkdir -p "$T/empty"
out=$("$PS" merge "$T/empty" --out "$T/x" 2>&1); rc=$?
check "merge: a directory without part files is named" '[ $rc -eq 1 ] && grep -q "empty: a directory with no part files" <<<"$out"'
"$PS" sweep --model "$DM" --n 24 --batch 8 --mode move --out "$T/sw1" > /dev/null 2>&1
for i in 1 0; do "$PS" sweep --model "$DM" --n 24 --batch 8 --mode move --shard=$i/2 --out "$T/swp" > /dev/null 2>&1; done
"$PS" merge "$T/swp/sweep.part-0-of-2.safetensors" "$T/swp/sweep.part-1-of-2.safetensors" --out "$T/swm" > /dev/null 2>&1
check "sweep (move): 2 shards merged = one process" 'same_json "$T/sw1/sweep.json" "$T/swm/sweep.json" command'
"$PS" gatecycle --model "$DM" --layer 0 --shift 3 --n 16 --batch 8 --out "$T/gc1" > /dev/null 2>&1
for i in 0 1 2; do "$PS" gatecycle --model "$DM" --layer 0 --shift 3 --n 16 --batch 8 --shard $i/3 --out "$T/gcp" > /dev/null 2>&1; done
"$PS" merge "$T"/gcp/gatecycle.part-*-of-3.safetensors --out "$T/gcm" > /dev/null 2>&1
check "gatecycle: 3 shards merged = one process" 'same_json "$T/gc1/gatecycle.json" "$T/gcm/gatecycle.json" command'
# --measure knockout: the knockout grids before and after the cycle are work units too (shards that begin
# inside a shift of a grid, one that holds the cycle)
GK=(gatecycle --model "$W" --layer 0 --shift 2 --n 20 --batch 8 --measure knockout)
"$PS" "${GK[@]}" --out "$T/gk1" > "$T/gk1.txt" 2>&1
for i in 0 1 2; do "$PS" "${GK[@]}" --shard $i/3 --out "$T/gkp" > /dev/null 2>&1; done
"$PS" merge "$T"/gkp/gatecycle.part-*-of-3.safetensors --out "$T/gkm" > "$T/gkm.txt" 2>&1
check "gatecycle --measure knockout: 3 shards merged = one process" 'grep -q "per_head" "$T/gk1/gatecycle.json" && same_json "$T/gk1/gatecycle.json" "$T/gkm/gatecycle.json" command'
check "gatecycle --measure knockout: merged summary = one process" 'cmp -s <(tr "\r" "\n" < "$T/gk1.txt" | grep -v " gatecycle$" | sed "s#$T/gk1#X#") <(sed "s#$T/gkm#X#" "$T/gkm.txt") && grep -q "^per-head knockout measure" "$T/gkm.txt"'
"$PS" gates --model "$DM" --n 48 --batch 16 --out "$T/ga1" > /dev/null 2>&1
for i in 0 1; do "$PS" gates --model "$DM" --n 48 --batch 16 --shard $i/2 --out "$T/gap" > /dev/null 2>&1; done
"$PS" merge "$T"/gap/gates.part-*-of-2.safetensors --out "$T/gam" > /dev/null 2>&1
check "gates: 2 shards merged = one process" 'same_json "$T/ga1/gates.json" "$T/gam/gates.json" command'
for i in 0 1; do "$PS" gates --model "$DM" --n 48 --batch 16 --shard $i/2 --out "$T/gad$i" > /dev/null 2>&1; done
"$PS" merge "$T/gad0" "$T/gad1" --out "$T/gadm" > /dev/null 2>&1
check "merge a b: two --out directories (one shard each)" 'same_json "$T/ga1/gates.json" "$T/gadm/gates.json" command'
out=$("$PS" merge "$T/kop/knockout.part-0-of-3.safetensors" "$T/kop/knockout.part-2-of-3.safetensors" --out "$T/x" 2>&1); rc=$?
check "merge: a missing shard is named" '[ $rc -eq 1 ] && grep -q "missing: 1" <<<"$out"'
out=$("$PS" merge "$T/kop/knockout.part-0-of-3.safetensors" "$T/swp/sweep.part-1-of-2.safetensors" --out "$T/x" 2>&1); rc=$?
check "merge: parts of different runs are refused" '[ $rc -eq 1 ] && grep -q "parts of different runs" <<<"$out"'
"$PS" knockout --model "$W" --n 64 --batch 16 --seed 1 --shard 1/3 --out "$T/kos" > /dev/null 2>&1
out=$("$PS" merge "$T/kop/knockout.part-0-of-3.safetensors" "$T/kos/knockout.part-1-of-3.safetensors" "$T/kop/knockout.part-2-of-3.safetensors" --out "$T/x" 2>&1); rc=$?
check "merge: a shard of another seed is refused" '[ $rc -eq 1 ] && grep -q "provenance or parameters differ" <<<"$out"'
out=$("$PS" sweep --shard 2/2 2>&1); rc=$?
check "--shard out of range is a usage error" '[ $rc -eq 2 ] && grep -q "need 0 <= I < N" <<<"$out"'
# sweep --task text-kv: units of the batches one process runs (shift after shift), merged = one process
"$PS" "${TK[@]}" --out "$T/tk1" > "$T/tk1.txt" 2>&1
for i in 2 0 1; do "$PS" "${TK[@]}" --shard $i/3 --out "$T/tkp" > /dev/null 2>&1; done
"$PS" merge "$T"/tkp/sweep.part-*-of-3.safetensors --out "$T/tkm" > "$T/tkm.txt" 2>&1
check "sweep --task text-kv: 3 shards merged = one process" '[ -s "$T/tk1/sweep.json" ] && same_json "$T/tk1/sweep.json" "$T/tkm/sweep.json" command && grep -q "\"text-kv\"" "$T/tkm/sweep.json"'
check "sweep --task text-kv: merged summary = one process" 'cmp -s <(grep "^mean accuracy" "$T/tk1.txt") <(grep "^mean accuracy" "$T/tkm.txt")'
"$PS" "${TK[@]}" --mode move --out "$T/tkv1" > /dev/null 2>&1
for i in 1 0; do "$PS" "${TK[@]}" --mode move --shard $i/2 --out "$T/tkvp" > /dev/null 2>&1; done
"$PS" merge "$T/tkvp" --out "$T/tkvm" > /dev/null 2>&1
check "sweep --task text-kv --mode move: 2 shards merged = one process" '[ -s "$T/tkv1/sweep.json" ] && same_json "$T/tkv1/sweep.json" "$T/tkvm/sweep.json" command'
# the channel attention's per-channel gates: units of batches like the compressed model's
"$PS" gates --model "$SRC/data/models/v4demo" --n 20 --batch 8 --out "$T/gch1" > /dev/null 2>&1
for i in 0 1 2; do "$PS" gates --model "$SRC/data/models/v4demo" --n 20 --batch 8 --shard $i/3 --out "$T/gchp" > /dev/null 2>&1; done
"$PS" merge "$T/gchp" --out "$T/gchm" > /dev/null 2>&1
check "gates (channel attention): 3 shards merged = one process" '[ -s "$T/gch1/gates.json" ] && same_json "$T/gch1/gates.json" "$T/gchm/gates.json" command && grep -q "per_channel" "$T/gchm/gates.json"'
# DeepSeek-V4 checkpoints split like the controlled models: every instrument, shards merged = one process
v4_shards() { # v4_shards NAME FILE ARGS...: the whole run, 2 shards, merged
  local name="$1" file="$2"; shift 2
  "$PS" "$@" --out "$T/${name}1" > /dev/null 2>&1
  for i in 1 0; do "$PS" "$@" --shard $i/2 --out "$T/${name}p" > /dev/null 2>&1; done
  "$PS" merge "$T/${name}p/${file%.json}.part-0-of-2.safetensors" "$T/${name}p/${file%.json}.part-1-of-2.safetensors" --out "$T/${name}m" > /dev/null 2>&1
  [ -s "$T/${name}1/$file" ] && same_json "$T/${name}1/$file" "$T/${name}m/$file" command
}
check "DeepSeek-V4 knockout --target heads: 2 shards merged = one process" 'v4_shards v4kh knockout.json knockout "${V4A[@]}" --period 2 --target heads --layers 1,3 --heads 0,2'
check "DeepSeek-V4 knockout --target indexer: 2 shards merged = one process" 'v4_shards v4ki knockout.json knockout "${V4A[@]}" --period 2 --target indexer'
check "DeepSeek-V4 sweep: 2 shards merged = one process" 'v4_shards v4sw sweep.json sweep "${V4A[@]}"'
check "DeepSeek-V4 gates: 2 shards merged = one process" 'v4_shards v4ga gates.json gates "${V4A[@]}"'
check "DeepSeek-V4 gatecycle: 2 shards merged = one process" 'v4_shards v4gc gatecycle.json gatecycle "${V4A[@]}" --layer 2 --shift 3'

fi # PART != mpi
if [ "$PART" = shards ]; then section "done"; echo "$pass passed, $fail failed"; [ "$fail" -eq 0 ]; exit; fi

# ---- MPI ----
skip_mpi=""
if ! command -v mpirun > /dev/null 2>&1; then skip_mpi="mpirun not found (scripts/setup.sh installs openmpi-bin)"
elif [ "$HAVE_MPI" != "ON" ]; then skip_mpi="this build has no MPI (PS_MPI=OFF or Open MPI not found)"; fi
if [ -n "$skip_mpi" ]; then
  if command -v mpirun > /dev/null 2>&1; then # a build without MPI refuses to run as one of several ranks
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
    out=$(mpirun -np 2 --oversubscribe "$PS" sweep --n 8 --out "$T/nompi" 2>&1)
    check "no-MPI build under mpirun says so" 'grep -q "this build has no MPI" <<<"$out" && [ ! -e "$T/nompi/sweep.json" ]'
  fi
  echo "skipped: the MPI tests ($skip_mpi)"
  echo "$pass passed, $fail failed"
  [ "$fail" -eq 0 ]; exit
fi
# Open MPI as root (CI), in a container without a network: shared memory only, no ptrace-based copies
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_hwloc_base_binding_policy=none
# Under the sanitizer build, the ranks run with AddressSanitizer and UBSan but without the leak check: Open
# MPI's runtime keeps allocations of plugins it has unloaded by exit (unnamed frames, no suppression can
# name them); the same code runs leak-checked as one process above (--shard, merge) and below (--resume).
MPI="env ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0 mpirun --oversubscribe"
# np N NAME ARGS...: run the instrument with N ranks into $T/NAME (same --out path for the figures' metadata)
np() { local n="$1" name="$2"; shift 2; rm -rf "$T/run"; $MPI -np "$n" "$PS" "$@" --out "$T/run" > "$T/$name.txt" 2>&1; local rc=$?; mv "$T/run" "$T/$name"; return $rc; }
same_run() { # same_run A B FILE.json: the same JSON and figures
  same_json "$T/$1/$3" "$T/$2/$3" && for f in "$T/$1"/*.png; do cmp -s "$f" "$T/$2/$(basename "$f")" || { echo "$(basename "$f") differs"; return 1; }; done
}
section "instruments under mpirun"
np 1 sw_np1 sweep --model "$DM" --n 64 --batch 16 && np 2 sw_np2 sweep --model "$DM" --n 64 --batch 16
check "sweep: -np 2 = -np 1 (JSON, figure)" 'same_run sw_np1 sw_np2 sweep.json'
check "sweep: -np 2 provenance names the ranks" 'grep -q "2 MPI ranks" "$T/sw_np2/sweep.json"'
rm -rf "$T/run"; "$PS" sweep --model "$DM" --n 64 --batch 16 --out "$T/run" > /dev/null 2>&1; mv "$T/run" "$T/sw_plain"
check "sweep: -np 2 = a plain process" 'same_run sw_plain sw_np2 sweep.json'
# the one-layer W8/S8 (a quarter of the default prompts in 4 batches, to keep the test short)
section "knockout of w8s8"
np 1 ko_np1 knockout --model "$W" --n 64 --batch 16 && np 2 ko_np2 knockout --model "$W" --n 64 --batch 16
check "knockout (w8s8): -np 2 = -np 1" 'same_run ko_np1 ko_np2 knockout.json'
summary() { tr '\r' '\n' < "$1" | grep -E "^(clean mean|  layer|  \.\.\.)"; }
check "knockout (w8s8): the same summary" 'cmp -s <(summary "$T/ko_np1.txt") <(summary "$T/ko_np2.txt") && [ -n "$(summary "$T/ko_np1.txt")" ]'
if [ "$SAN" = 0 ]; then # (under the sanitizers: its shards are checked leak-checked at the top)
  np 1 atp_np1 knockout --model "$W" --n 64 --method atp --verify 3 && np 2 atp_np2 knockout --model "$W" --n 64 --method atp --verify 3
  check "knockout --method atp --verify 3 (w8s8): -np 2 = -np 1" 'same_run atp_np1 atp_np2 knockout.json'
fi
section "knockout of deep_w8s8"
# the 12-layer model's runs: the plain build only (under the sanitizers they are the slowest part of the test
# and exercise no MPI code the one-layer runs above and the --shard runs leak-checked at the top do not)
if [ "$SAN" = 0 ]; then
  np 1 kd_np1 knockout --model "$SRC/data/models/deep_w8s8" --layers 4,10-11 --heads 0,5 --n 12 --batch 4 --target both &&
    np 2 kd_np2 knockout --model "$SRC/data/models/deep_w8s8" --layers 4,10-11 --heads 0,5 --n 12 --batch 4 --target both
  check "knockout (12 layers, 3 chosen): -np 2 = -np 1" 'same_run kd_np1 kd_np2 knockout.json'
  np 1 gc_np1 gatecycle --layer 9 --shift 2 --n 16 --batch 8 --save "$T/cyc" && mv "$T/cyc" "$T/cyc1" &&
    np 2 gc_np2 gatecycle --layer 9 --shift 2 --n 16 --batch 8 --save "$T/cyc" && mv "$T/cyc" "$T/cyc2"
  check "gatecycle: -np 2 = -np 1" 'same_run gc_np1 gc_np2 gatecycle.json'
  check "gatecycle: one cycled checkpoint, the same" 'cmp -s "$T/cyc1/model.safetensors" "$T/cyc2/model.safetensors" && [ "$(grep -c "wrote the cycled" "$T/gc_np2.txt")" -eq 1 ]'
  np 1 gk_np1 gatecycle --layer 9 --shift 2 --n 16 --batch 8 --measure knockout && np 2 gk_np2 gatecycle --layer 9 --shift 2 --n 16 --batch 8 --measure knockout
  check "gatecycle --measure knockout: -np 2 = -np 1" 'same_run gk_np1 gk_np2 gatecycle.json && grep -q "per_head" "$T/gk_np2/gatecycle.json"'
  check "gatecycle --measure knockout: -np 2 splits it, rank 0 finishes" '[ "$(grep -c "^  head 0:" "$T/gk_np2.txt")" -eq 1 ]'
else
  echo "skipped under the sanitizers: the 12-layer knockout and gatecycle runs under mpirun (the plain build runs them)"
fi
np 1 ga_np1 gates --model "$DM" --n 48 --batch 16 && np 2 ga_np2 gates --model "$DM" --n 48 --batch 16
check "gates: -np 2 = -np 1" 'same_run ga_np1 ga_np2 gates.json'
if [ ! -s "$T/ko1/knockout.json" ]; then # (PART mpi: the one-process run and shards 0 and 2 of the --shard part)
  "$PS" knockout --model "$W" --n 64 --batch 16 --out "$T/ko1" > /dev/null 2>&1
  for i in 0 2; do "$PS" knockout --model "$W" --n 64 --batch 16 --shard $i/3 --out "$T/kop" > /dev/null 2>&1; done
fi
np 2 sh_np2 knockout --model "$W" --n 64 --batch 16 --shard 1/3
cp "$T/kop/knockout.part-0-of-3.safetensors" "$T/kop/knockout.part-2-of-3.safetensors" "$T/sh_np2/"
"$PS" merge "$T"/sh_np2/knockout.part-*-of-3.safetensors --out "$T/shm" > /dev/null 2>&1
check "a shard run by 2 ranks merges like one run by one process" 'same_json "$T/ko1/knockout.json" "$T/shm/knockout.json" command'
out=$($MPI -np 2 "$PS" sweep --n x 2>&1); rc=$?
check "a usage error under mpirun: said once, exit 2" '[ $rc -eq 2 ] && [ "$(grep -c "phasescope sweep: --n x" <<<"$out")" -eq 1 ]'
out=$($MPI -np 2 "$PS" info 2>&1); rc=$?
check "a one-process command under mpirun is refused" '[ $rc -eq 2 ] && grep -q "runs as one process" <<<"$out"'
# the text-kv sweep and the per-channel gates split over ranks like every other path
section "text-kv and per-channel gates under mpirun"
[ -s "$T/tk1/sweep.json" ] || "$PS" "${TK[@]}" --out "$T/tk1" > /dev/null 2>&1 # (PART mpi)
np 1 tk_np1 "${TK[@]}" && np 2 tk_np2 "${TK[@]}"
check "sweep --task text-kv: -np 2 = -np 1 (split over the ranks)" 'same_run tk_np1 tk_np2 sweep.json'
check "sweep --task text-kv: -np 2 = one process" 'same_json "$T/tk1/sweep.json" "$T/tk_np2/sweep.json" command'
np 1 gch_np1 gates --model "$SRC/data/models/v4demo" --n 20 --batch 8 && np 2 gch_np2 gates --model "$SRC/data/models/v4demo" --n 20 --batch 8
check "gates (channel attention): -np 2 = -np 1 (split over the ranks)" 'same_run gch_np1 gch_np2 gates.json'
section "DeepSeek-V4 under mpirun"
for inst in "sweep sweep.json" "knockout knockout.json --period 2 --target heads --layers 1,3" "gates gates.json" "gatecycle gatecycle.json --layer 1 --shift 1"; do
  set -- $inst; cmd=$1 file=$2; shift 2
  np 1 v4${cmd}_np1 $cmd "${V4A[@]}" "$@" && np 2 v4${cmd}_np2 $cmd "${V4A[@]}" "$@"
  check "DeepSeek-V4 $cmd: -np 2 = -np 1 = one process's shards (split over the ranks)" 'same_run v4${cmd}_np1 v4${cmd}_np2 $file'
done
out=$($MPI -np 2 "$PS" knockout --model "$CONF/v4/mix4" --task "$T/v4task.json" --target both --out "$T/x" 2>&1); rc=$?
check "a DeepSeek-V4 usage error under mpirun: said once, exit 2" '[ $rc -eq 2 ] && [ "$(grep -c "expected heads, compressed" <<<"$out")" -eq 1 ]'

# ---- data-parallel training ----
section "data-parallel training"
# NS steps with a checkpoint (and eval, gate records) every HALF; under the sanitizers 6 and 3 (the same
# paths: checkpoints, resume across rank counts, evals, gate records)
NS=20 HALF=10; [ "$SAN" = 1 ] && NS=6 HALF=3
sed "s/\"steps\": 400/\"steps\": $NS/; s/\"checkpoint_every\": 200/\"checkpoint_every\": $HALF/; s/\"log_every\": 50/\"log_every\": 2/; s/\"eval_every\": 100/\"eval_every\": $HALF/; s/\"gates_every\": 100/\"gates_every\": $HALF/" \
  "$SRC/experiments/configs/tiny_kv_w4s4.json" > "$T/cfg.json"
$MPI -np 1 "$PS" train --config "$T/cfg.json" --out "$T/t1" > /dev/null 2>&1
$MPI -np 2 "$PS" train --config "$T/cfg.json" --out "$T/t2" > "$T/t2.txt" 2>&1
check "train -np 2 finishes and reports the all-reduce" '[ -s "$T/t2/model.safetensors" ] && grep -q "gradient all-reduce" "$T/t2.txt"'
# the loss curve of -np 2 against -np 1: the same global batch, the sums in another order (docs/scale-out.md)
curve() {
  python3 - "$1" "$2" "$3" <<'EOF'
import json, sys
def recs(p): return [json.loads(l) for l in open(p)]
a, b, tol = recs(sys.argv[1]), recs(sys.argv[2]), float(sys.argv[3])
assert [r['type'] for r in a] == [r['type'] for r in b], 'different records'
worst = 0
for x, y in zip(a, b):
    if x['type'] in ('train', 'eval'):
        worst = max(worst, abs(x['loss'] - y['loss']) / abs(x['loss']))
print('largest relative loss difference %.2e' % worst)
sys.exit(0 if worst <= tol else 1)
EOF
}
check "train: -np 2 loss curve within 1e-5 of -np 1 ($NS steps)" 'curve "$T/t1/train.jsonl" "$T/t2/train.jsonl" 1e-5'
# --resume with another number of ranks: 2 ranks to step HALF, then 1 rank to the end (and the other way)
$MPI -np 2 "$PS" train --config "$T/cfg.json" --out "$T/r21" --stop-after $HALF > /dev/null 2>&1
"$PS" train --config "$T/cfg.json" --out "$T/r21" --resume > /dev/null 2>&1
check "train: 2 ranks, then --resume with 1: the same curve" 'curve "$T/t1/train.jsonl" "$T/r21/train.jsonl" 1e-5'
"$PS" train --config "$T/cfg.json" --out "$T/r12" --stop-after $HALF > /dev/null 2>&1
$MPI -np 2 "$PS" train --config "$T/cfg.json" --out "$T/r12" --resume > /dev/null 2>&1
check "train: 1 rank, then --resume with 2: the same curve" 'curve "$T/t1/train.jsonl" "$T/r12/train.jsonl" 1e-5'
out=$($MPI -np 2 "$PS" train --config "$T/cfg.json" --out "$T/t2" 2>&1); rc=$?
check "train: an error every rank shares is said once" '[ $rc -eq 1 ] && [ "$(grep -c "already holds a run" <<<"$out")" -eq 1 ]'
# main's other training paths: the text-kv task (a batch reallocated every step) and the channel attention
# (per-channel gate records, rank 0's)
cp "$TT" "$T/tok.json"
printf '{"model": {"vocab_size": 419, "d_model": 16, "n_layers": 1, "n_heads": 2, "n_kv_heads": 2, "head_dim": 8, "d_ff": 32, "max_seq_len": 300, "attention": {"kind": "compressed", "window": 4, "stride": 4, "local_window": 4}}, "task": {"kind": "text-kv", "tokenizer": "tok.json", "values": "words", "pairs": 3, "queries": 2, "seq_len": 200}, "train": {"steps": 6, "batch_size": 4, "log_every": 1, "logits": "answers", "eval_size": 4, "eval_every": 3}}' > "$T/tkcfg.json"
$MPI -np 1 "$PS" train --config "$T/tkcfg.json" --out "$T/tk1" > /dev/null 2>&1
$MPI -np 2 "$PS" train --config "$T/tkcfg.json" --out "$T/tk2" > /dev/null 2>&1
check "train text-kv: -np 2 loss curve within 1e-5 of -np 1" 'curve "$T/tk1/train.jsonl" "$T/tk2/train.jsonl" 1e-5'
python3 -c 'import json, sys; c = json.load(open(sys.argv[1])); c["train"].update(steps=6, batch_size=8, log_every=1, eval_every=3, checkpoint_every=3, gates_every=3, eval_size=32); json.dump(c, open(sys.argv[2], "w"))' \
  "$SRC/experiments/configs/v4/v4demo.json" "$T/v4cfg.json"
$MPI -np 1 "$PS" train --config "$T/v4cfg.json" --out "$T/v41" > /dev/null 2>&1
$MPI -np 2 "$PS" train --config "$T/v4cfg.json" --out "$T/v42" > /dev/null 2>&1
check "train channel attention: -np 2 loss curve and gate records like -np 1" 'curve "$T/v41/train.jsonl" "$T/v42/train.jsonl" 1e-5 && grep -q "per_channel" "$T/v42/train.jsonl"'

# ---- a rank that dies, a rank that hangs ----
section "a killed rank, a stuck rank"
sed "s/\"steps\": $NS/\"steps\": 100000/; s/\"checkpoint_every\": $HALF/\"checkpoint_every\": 3/; s/\"eval_every\": $HALF/\"eval_every\": 100000/; s/\"gates_every\": $HALF/\"gates_every\": 100000/" \
  "$T/cfg.json" > "$T/long.json"
rank_pid() { # rank_pid MPIRUN_PID RANK: the pid of that rank (a child of mpirun)
  local c
  for c in $(pgrep -P "$1"); do tr '\0' '\n' < "/proc/$c/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2" && { echo "$c"; return; }; done
}
wait_ckpt() { # wait until the run in $1 has a checkpoint after step 0 (at most 60 s)
  for _ in $(seq 600); do grep -q '"step":[1-9]' "$1/train.jsonl" 2>/dev/null && return 0; sleep 0.1; done; return 1
}
wait_end() { # wait_end PID SECONDS: wait for mpirun; kill it (and fail) if it outlives SECONDS
  local i
  for i in $(seq $(($2 * 10))); do kill -0 "$1" 2>/dev/null || { wait "$1"; return; }; sleep 0.1; done
  echo "mpirun $1 still running after $2 s: killing it" >&2
  for i in $(pgrep -P "$1"); do kill -9 "$i"; done; kill -9 "$1"; wait "$1"; return 99
}
$MPI -np 2 "$PS" train --config "$T/long.json" --out "$T/kill" > /dev/null 2> "$T/kill.err" &
mp=$!
if wait_ckpt "$T/kill"; then
  sleep 1; r1=$(rank_pid $mp 1)
  [ -n "$r1" ] || bad "killed rank: no rank 1 among mpirun's children"
  t0=$(date +%s.%N); kill -9 "$r1"; wait_end $mp 60; rc=$?; t1=$(date +%s.%N)
  secs=$(python3 -c "print('%.1f' % ($t1 - $t0))")
  echo "killed rank 1: mpirun ended in $secs s with status $rc"
  check "killed rank: the job ends within 10 s, with an error status" '[ $rc -ne 0 ] && [ $rc -ne 99 ] && python3 -c "import sys; sys.exit(not $secs < 10)"' || cat "$T/kill.err" >&2
  check "killed rank: rank 0 says why and where the last checkpoint is" 'grep -q "rank 0 of 2: stopped by the MPI launcher" "$T/kill.err" && grep -q "the last checkpoint (step [0-9]*) is in" "$T/kill.err"'
  step=$(grep -o 'the last checkpoint (step [0-9]*)' "$T/kill.err" | grep -o '[0-9]*' | head -1)
  "$PS" train --config "$T/long.json" --out "$T/kill" --resume --stop-after $((${step:-0} + 3)) > "$T/resume.txt" 2>&1
  check "killed rank: the last checkpoint resumes (step $step, one process)" '[ $? -eq 0 ] && [ -s "$T/kill/model.safetensors" ]'
else
  kill $mp 2>/dev/null; wait $mp; bad "killed rank: no checkpoint within 60 s"
fi
PS_DIST_TIMEOUT=5 $MPI -np 2 "$PS" train --config "$T/long.json" --out "$T/stall" > /dev/null 2> "$T/stall.err" &
mp=$!
if wait_ckpt "$T/stall"; then
  r1=$(rank_pid $mp 1)
  [ -n "$r1" ] || bad "stuck rank: no rank 1 among mpirun's children"
  t0=$(date +%s.%N); kill -STOP "$r1"; wait_end $mp 60; rc=$?; t1=$(date +%s.%N)
  secs=$(python3 -c "print('%.1f' % ($t1 - $t0))")
  echo "stopped rank 1 (SIGSTOP): mpirun ended in $secs s with status $rc (stall limit 5 s)"
  check "stuck rank: the stall limit ends the job" '[ $rc -ne 0 ] && [ $rc -ne 99 ] && grep -q "has waited" "$T/stall.err" && python3 -c "import sys; sys.exit(not $secs < 20)"' || cat "$T/stall.err" >&2
else
  kill $mp 2>/dev/null; wait $mp; bad "stuck rank: no checkpoint within 60 s"
fi
section "done"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
