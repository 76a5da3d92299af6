#!/usr/bin/env bash
# gpu_check.sh — the one device check of the CUDA backend (docs/cuda.md, "The device check").
#
# The GPU machine (one H200, 16 cores, no network, a CUDA/PyTorch image without Debian's -dev packages, and
# neither libcurl nor libmicrohttpd) takes at most 64 MiB of files per run (tracked files, untracked files git
# does not ignore, and the carried folders), runs one command for at most 10 minutes and is lent for 15
# minutes in all, its start included. So the run is one prepared command:
#
#   bash scripts/gpu_check.sh --pack      here, before the run: fetches the .debs of the build's libraries into
#                                         .gpu_debs/ (--fetch, once), takes the shipped models the run does not
#                                         read out of the tree (out of the index, the files moved to the
#                                         git-ignored .gpu_stash/), checks the size against 64 MiB and prints
#                                         the exact `run` call
#   run(command="bash scripts/gpu_check.sh", carry=[".gpu_debs"], timeout_s=590)
#                                         on the device: its own deadline is 560 s; a summary line after every
#                                         stage, on stdout and in $OUT/summary.txt
#   bash scripts/gpu_check.sh --undo      right after: the models back. NEVER COMMIT BETWEEN --pack AND --undo
#                                         (the commit would delete the models).
#   bash scripts/gpu_check.sh --rehearse  here: the device run up to where a GPU is needed, as on the bare
#                                         image (the carried libraries only: prefix forced, no libcurl, no
#                                         libmicrohttpd), into build-gpu/; test_cuda must then FAIL (no device)
#
# Other options: --fetch | --configure-only | --skip-peer | --skip-bench | --full (bench: 3 steps, knockout)
#
# Stages of the run (each ends with a line "[Ns] STAGE: ..."; the last line is "gpu_check: PASS|FAIL ..."):
#   toolchain   the GPU (nvidia-smi), nvcc, cmake, the host compiler, cuBLASLt
#   configure   the carried .debs unpacked with dpkg -x into .gpu_prefix/ (only when the machine lacks the
#               libraries; never into /), a Release build with PS_CUDA=ON for sm_90 against that prefix
#               (timeout 150 s)
#   build       test_cuda, test_backend_ops, test_kvcache, test_v4_kvcache, test_select, bench_gpu, phasescope with -j$(nproc)
#               (timeout 300 s)
#   test_cuda   the program itself, PS_REQUIRE_DEVICE=1 (no device: FAIL), under the deadline (not ctest:
#               its TIMEOUT property would beat any --timeout); the first FAIL lines go to the summary
#   blocking    after a CUDA error in test_cuda (one fault poisons every later op), a rerun with
#               CUDA_LAUNCH_BLOCKING=1 names the first op that faulted (when 200 s are left)
#   test_backend_ops  the op table on the cuda backend against the CPU, PS_REQUIRE_CUDA=1 (when 150 s are left)
#   test_kvcache      the KV cache on the cuda backend against the cpu (test_kvcache --backends: appends,
#               fork, edits, hooks; full, grid, staggered, content, channel), PS_REQUIRE_CUDA=1 (when 120 s are left)
#   test_v4_kvcache   the DeepSeek-V4 KV cache on the cuda backend against the cpu (test_v4_kvcache --backends:
#               appends, fork, edits, truncate, hooks; mix4 and hub3), PS_REQUIRE_CUDA=1 (when 120 s are left)
#   test_select the select attention kind on the cuda backend against the cpu (test_select --backends: a
#               forward with hooks, a hook_blocks edit, the backward), PS_REQUIRE_CUDA=1 (when 120 s are left)
#   generate    `phasescope generate --device cuda` against --device cpu: deep_w8s8 (3 prompts, a mean edit)
#               and mix4, tokens equal and log-probabilities within 1e-3 (when 90 s are left)
#   bench_gpu   GEMM rates per precision, one training step per precision x attention (1 step, no knockout
#               unless --full)
#   torch_peer  the same model and step in PyTorch (bench/torch_gpu_peer.py), when 100 s are left
# Logs and JSON go to $OUT (the device tool's folder), else build-gpu/out/: summary.txt, configure.log,
# build.log, test_cuda.log, test_cuda_blocking.log, test_backend_ops.log, test_kvcache.log, test_v4_kvcache.log, test_select.log,
# generate_cpu.log, generate_cuda.log, generate_compare.log, bench_gpu.log/.json,
# torch_peer.log/.json.
# The whole script is one block, read before it runs: editing the file during a run cannot change that run.
{
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DEBS=$ROOT/.gpu_debs
PREFIX=$ROOT/.gpu_prefix
STASH=$ROOT/.gpu_stash
BUILD=$ROOT/build-gpu
ARCH=x86_64-linux-gnu
LIMIT=67108864 # the device tool's 64 MiB per run
DEADLINE=560   # seconds, under the run's timeout_s 590 and the tool's 600
# the shipped models the run reads: data/models/default (-> deep_w8s8; test_cuda's sweep comparison)
KEEP_MODELS='^data/models/(deep_w8s8/|default$)'

# ---------------- here: fetch the .debs ----------------
fetch() {
  command -v apt-get >/dev/null || { echo "gpu_check --fetch: needs apt-get (a Debian machine)"; return 1; }
  mkdir -p "$DEBS"
  local roots="libjansson-dev libjansson4 libopenblas-openmp-dev libopenblas0-openmp libpng-dev libpng16-16 zlib1g-dev zlib1g
         libcairo2-dev libcairo2 libpcre2-dev libpcre2-8-0 libutf8proc-dev libutf8proc2 pkgconf pkgconf-bin libpkgconf3
         libgfortran5 libgomp1 libquadmath0"
  # the closure of what their pkg-config files need, less the base system the device has anyway. No libcurl
  # and no libmicrohttpd: probe and serve are optional and the device run needs neither.
  local pkgs
  pkgs=$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks --no-replaces \
           --no-enhances --no-pre-depends $roots 2>/dev/null | grep -v '^ ' | grep -v '^<' | sort -u |
         grep -Ev '^(libc6|libc6-dev|libc-dev-bin|libgcc-s1|gcc-[0-9]+-base|libstdc\+\+6|perl.*|libperl.*|python3.*|libpython3.*|dpkg|debconf.*|cdebconf|install-info|fonts-.*|fontconfig|libdebian-installer.*|libnewt.*|libslang.*|libtextwrap.*|libncursesw.*|libtinfo.*|libreadline.*|readline-common|libdb5.*|libgdbm.*|libsqlite3.*|libssl.*|libkrb.*|libk5crypto.*|libgssapi.*|libcom-err.*|libkeyutils.*|libcrypt1|libcrypt-dev|libnsl.*|libtirpc.*|linux-libc-dev|rpcsvc-proto|media-types|tzdata|netbase|sensible-utils|libglib2.0-bin|libglib2.0-data|libglib2.0-dev-bin|libelf1|libfontenc1|x11-common|xkb-data|libxml2|libicu.*|uuid-dev|libsystemd.*|libudev.*|libcap.*|libaudit.*|libpam.*|libzstd1|liblz4-1|libgpg-error0|libgcrypt20|libpcre2-posix3|libpcre2-16-0|libpcre2-32-0|libmpdec.*|libcairo-script-interpreter2|tar|xfonts-encodings|libsepol-dev|libsepol2|libselinux1-dev|libselinux1|libmount-dev|libmount1|libblkid-dev|libblkid1|libx11-data|libcairo-gobject2|libgomp1|mailcap|mime-support|sysvinit-utils|lsb-base|ttf-bitstream-vera|xfonts-utils|fontconfig-config)$')
  echo "gpu_check --fetch: $(echo $pkgs | wc -w) packages into $DEBS"
  (cd "$DEBS" && apt-get download $pkgs >/dev/null) || { echo "gpu_check --fetch: apt-get download failed"; return 1; }
  du -sh "$DEBS" | awk '{print "gpu_check --fetch: " $1 " in .gpu_debs/ (name it in the device run'"'"'s carry)"}'
}

# bytes the run would carry: tracked files, untracked files git does not ignore, .gpu_debs/
carried_bytes() {
  local tree debs
  tree=$({ git ls-files -z; git ls-files -z -o --exclude-standard; } | xargs -0 stat -c %s 2>/dev/null | awk '{s+=$1} END {print s+0}')
  debs=$(du -sb "$DEBS" 2>/dev/null | cut -f1)
  echo "$tree ${debs:-0}"
}

# ---------------- here: pack and undo ----------------
pack() {
  [ -n "$(ls "$DEBS"/*.deb 2>/dev/null)" ] || fetch || return 1
  if [ -e "$STASH/PACKED" ]; then
    echo "gpu_check --pack: already packed (models in .gpu_stash/)"
  else
    git diff --cached --quiet -- data/models data/runs || { echo "gpu_check --pack: data/models or data/runs has staged changes; commit or unstage them first"; return 1; }
    mkdir -p "$STASH"
    local hide
    # the models the run does not read, and the parked unfinished trainings (data/runs: the run reads none)
    hide=$(git ls-files data/models | grep -Ev "$KEEP_MODELS"; git ls-files data/runs)
    [ -n "$hide" ] || { echo "gpu_check --pack: no model to hide"; return 1; }
    # out of the index (so not tracked) and out of the tree (so not an untracked file either): into the
    # git-ignored .gpu_stash/, as the list of moved files says
    printf '%s\n' $hide > "$STASH/PACKED"
    git rm -q --cached -- $hide || return 1
    local f
    for f in $hide; do mkdir -p "$STASH/$(dirname "$f")" && mv "$f" "$STASH/$f" || return 1; done
    find data/models data/runs -mindepth 1 -type d -empty -delete 2>/dev/null
    echo "gpu_check --pack: $(wc -l < "$STASH/PACKED") model files moved out of the index and the tree (into .gpu_stash/)"
  fi
  local sizes tree debs total
  sizes=$(carried_bytes); tree=${sizes% *}; debs=${sizes#* }; total=$((tree + debs))
  echo "gpu_check --pack: tree $tree B + .gpu_debs $debs B = $total B ($(awk -v t=$total 'BEGIN {printf "%.1f", t / 1048576}') MiB; limit $LIMIT B = 64 MiB)"
  if [ "$total" -ge "$LIMIT" ]; then
    echo "gpu_check --pack: OVER THE LIMIT: leave more out (git status --short shows untracked files), or --undo"; return 1
  fi
  echo 'gpu_check --pack: now run on the GPU machine:'
  echo '  run(command="bash scripts/gpu_check.sh", carry=[".gpu_debs"], timeout_s=590)'
  echo "gpu_check --pack: right after it: bash scripts/gpu_check.sh --undo   (DO NOT COMMIT BEFORE THAT)"
}

undo() {
  [ -e "$STASH/PACKED" ] || { echo "gpu_check --undo: not packed (no .gpu_stash/PACKED)"; return 0; }
  local f
  while IFS= read -r f; do
    [ -n "$f" ] || continue
    mkdir -p "$(dirname "$f")" && mv "$STASH/$f" "$f" || { echo "gpu_check --undo: cannot move back $f"; return 1; }
  done < "$STASH/PACKED"
  # back into the index as committed (a hidden file's index entry was removed; HEAD still has it)
  xargs -a "$STASH/PACKED" git reset -q -- || return 1
  rm -rf "$STASH"
  echo "gpu_check --undo: data/models back in the index and the tree; git status --short data/models:"
  git status --short data/models data/runs | head -5
  git status --short data/models data/runs | grep -q . || echo "  (clean)"
}

MODE=run QUICK=1 SKIP_PEER=0 SKIP_BENCH=0 CONFIGURE_ONLY=0 REHEARSE=0
for a in "$@"; do
  case "$a" in
    --fetch) fetch; exit $? ;;
    --pack) pack; exit $? ;;
    --undo) undo; exit $? ;;
    --quick) QUICK=1 ;; --full) QUICK=0 ;; --skip-peer) SKIP_PEER=1 ;; --skip-bench) SKIP_BENCH=1 ;;
    --configure-only) CONFIGURE_ONLY=1 ;;
    --rehearse) REHEARSE=1 ;;
    *) echo "usage: gpu_check.sh [--fetch | --pack | --undo | --rehearse | --configure-only | --full | --skip-peer | --skip-bench]"; exit 2 ;;
  esac
done

# ---------------- the run (on the device; --rehearse here) ----------------
O=${OUT:-$BUILD/out}
mkdir -p "$O" "$BUILD"
S=$O/summary.txt
: > "$S"
T0=$(date +%s)
JOBS=$(nproc)
BUILD_TIMEOUT=300
if [ $REHEARSE = 1 ]; then
  export GPU_CHECK_FORCE_PREFIX=1 # the carried libraries only, as on the bare image
  JOBS=${GPU_CHECK_JOBS:-2}       # a shared 2-core machine: the deadlines are the device's, not this one's
  DEADLINE=3000 BUILD_TIMEOUT=2400
fi
el() { echo $(($(date +%s) - T0)); }
say() { echo "[$(el)s] $*" | tee -a "$S"; }
# seconds left before the deadline, at most $1
left() { local l=$((DEADLINE - $(el))); [ $l -lt 1 ] && l=1; [ $l -lt "$1" ] && echo $l || echo "$1"; }
STATUS=PASS
finish() { # finish PASS|FAIL TEXT: the last line, then exit
  [ "$1" = FAIL ] && STATUS=FAIL
  say "gpu_check: $STATUS in $(el) s: $2"
  [ $STATUS = PASS ]
  exit $?
}

# 0. toolchain
export PATH=/usr/local/cuda/bin:$PATH
if command -v nvidia-smi >/dev/null; then
  say "toolchain: gpu $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -n 1)"
else
  say "toolchain: gpu: no nvidia-smi"
fi
command -v nvcc >/dev/null || finish FAIL "no nvcc on PATH (/usr/local/cuda/bin)"
command -v cmake >/dev/null || finish FAIL "no cmake"
command -v g++ >/dev/null || command -v c++ >/dev/null || finish FAIL "no C++ host compiler for nvcc"
say "toolchain: nvcc $(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'); $(cmake --version | head -n 1); gcc $(gcc -dumpversion 2>/dev/null); $(nproc) cores; dpkg: $(command -v dpkg || echo NONE); pkg-config: $(command -v pkg-config || echo none); python3: $(command -v python3 || echo none)"
say "toolchain: cuBLASLt $(ls /usr/local/cuda/lib64/libcublasLt.so.* 2>/dev/null | head -n 1 | sed 's/.*\.so\.//') ($(ls /usr/local/cuda/include/cublasLt.h >/dev/null 2>&1 && echo header found || echo NO header))"

# 1. the carried libraries, unpacked into the prefix (only when the machine lacks them), and configure
need_prefix=${GPU_CHECK_FORCE_PREFIX:-0} # 1: use the carried libraries even where the machine has its own
for pc in jansson cairo libpcre2-8 libutf8proc libpng; do
  pkg-config --exists "$pc" 2>/dev/null || need_prefix=1
done
[ -e /usr/include/$ARCH/openblas-openmp/cblas.h ] || [ -e /usr/include/cblas.h ] || need_prefix=1
CMAKE_EXTRA=()
if [ "$need_prefix" = 1 ]; then
  command -v dpkg >/dev/null || finish FAIL "configure: no dpkg to unpack the carried .debs"
  ls "$DEBS"/*.deb >/dev/null 2>&1 || finish FAIL "configure: the machine lacks the build's libraries and no .gpu_debs/ came along (bash scripts/gpu_check.sh --pack here, then carry .gpu_debs)"
  if [ ! -e "$PREFIX/.unpacked" ]; then
    rm -rf "$PREFIX"; mkdir -p "$PREFIX"
    for f in "$DEBS"/*.deb; do dpkg -x "$f" "$PREFIX" || finish FAIL "configure: dpkg -x $f"; done
    touch "$PREFIX/.unpacked"
  fi
  L=$PREFIX/usr/lib/$ARCH
  # Debian's -dev packages link lib*.so through absolute symlinks (/lib/...): point them into the prefix
  find "$PREFIX" -type l | while read -r l; do
    t=$(readlink "$l"); case "$t" in /*) [ -e "$PREFIX$t" ] && ln -sfn "$PREFIX$t" "$l" ;; esac
  done
  if ! command -v pkg-config >/dev/null || [ "${GPU_CHECK_FORCE_PREFIX:-0}" = 1 ]; then
    mkdir -p "$PREFIX/bin"
    printf '#!/bin/sh\nexec env LD_LIBRARY_PATH=%s "%s" "$@"\n' "$L" "$PREFIX/usr/bin/pkgconf" > "$PREFIX/bin/pkg-config"
    chmod +x "$PREFIX/bin/pkg-config"
    export PATH=$PREFIX/bin:$PATH
  fi
  # only the prefix's .pc files: libcurl and libmicrohttpd are not there, as on the device
  export PKG_CONFIG_LIBDIR=$L/pkgconfig:$PREFIX/usr/share/pkgconfig:$PREFIX/usr/lib/pkgconfig
  export PKG_CONFIG_SYSROOT_DIR=$PREFIX
  # no LD_LIBRARY_PATH (it would hand the device's own tools, python3 and cmake, these older libraries): the
  # programs find the prefix through DT_RPATH, which (unlike RUNPATH) also serves the libraries' own needs
  CMAKE_EXTRA=(-DCMAKE_PREFIX_PATH="$PREFIX/usr" -DOPENBLAS_LIB="$L/openblas-openmp/libopenblas.so"
               -DCMAKE_C_FLAGS="-I$PREFIX/usr/include/$ARCH/openblas-openmp -I$PREFIX/usr/include -I$PREFIX/usr/include/$ARCH"
               -DCMAKE_EXE_LINKER_FLAGS="-L$L -Wl,--disable-new-dtags -Wl,-rpath-link,$L -Wl,-rpath,$L:$L/openblas-openmp:$PREFIX/lib/$ARCH")
fi
# the rehearsal also hides this machine's libcurl / libmicrohttpd from CMake's other searches
[ $REHEARSE = 1 ] && CMAKE_EXTRA+=(-DPS_NO_CURL=ON -DPS_NO_MHD=ON)
TC=$(date +%s)
timeout "$(left 150)" cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DPS_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="90-real;90-virtual" \
  "${CMAKE_EXTRA[@]}" > "$O/configure.log" 2>&1
rc=$?
if [ $rc != 0 ]; then
  tail -n 15 "$O/configure.log" | tee -a "$S"
  finish FAIL "configure rc $rc$([ $rc = 124 ] && echo ' (timed out)') (configure.log)"
fi
say "configure: ok in $(($(date +%s) - TC)) s (prefix: $([ "$need_prefix" = 1 ] && echo carried .debs || echo the machine\'s)); $(grep -E 'CUDA backend:|probe:|serve:' "$O/configure.log" | sed 's/^-- //; s/^CMake Warning.*//' | grep -v '^$' | cut -c1-160 | tr '\n' ';')"
[ $CONFIGURE_ONLY = 1 ] && finish PASS "configured (--configure-only)"

# 2. build
TB=$(date +%s)
timeout "$(left $BUILD_TIMEOUT)" cmake --build "$BUILD" -j "$JOBS" --target test_cuda test_backend_ops test_kvcache test_v4_kvcache test_select bench_gpu phasescope > "$O/build.log" 2>&1
rc=$?
BUILD_S=$(($(date +%s) - TB))
if [ $rc != 0 ]; then
  grep -m 15 -E "error|Error" "$O/build.log" | tee -a "$S"
  finish FAIL "build rc $rc$([ $rc = 124 ] && echo ' (timed out)') after $BUILD_S s (build.log)"
fi
say "build: ok in $BUILD_S s ($(grep -c 'warning' "$O/build.log") warning lines)"
if grep -q "serve: NOT built" "$O/configure.log"; then # (with serve built, this would start a server)
  say "build: \`phasescope serve\` says: $("$BUILD/phasescope" serve 2>&1 | head -n 1 | cut -c1-150)"
fi

# 3. test_cuda, the program itself: no device is a FAIL here
TT=$(date +%s)
(cd "$BUILD" && PS_REQUIRE_DEVICE=1 OMP_NUM_THREADS=8 OMP_WAIT_POLICY=PASSIVE timeout "$(left 240)" ./tests/test_cuda "$BUILD") > "$O/test_cuda.log" 2>&1
CT_RC=$?
CT_LINE="rc $CT_RC$([ $CT_RC = 124 ] && echo ' (timed out)') in $(($(date +%s) - TT)) s, $(grep -c '^FAIL' "$O/test_cuda.log") FAIL lines: $(tail -n 1 "$O/test_cuda.log")"
say "test_cuda: $CT_LINE"
grep -m 1 '^device:' "$O/test_cuda.log" | sed 's/^/  /' | tee -a "$S"
grep -m 8 '^FAIL' "$O/test_cuda.log" | cut -c1-300 | sed 's/^/  /' | tee -a "$S"
[ $CT_RC = 0 ] || STATUS=FAIL
if grep -q "FAIL: no CUDA device" "$O/test_cuda.log"; then
  [ $REHEARSE = 1 ] && finish FAIL "rehearsal: configure and build ok ($BUILD_S s); test_cuda saw no device and said FAIL, as it must here (carry: bash scripts/gpu_check.sh --pack)"
  finish FAIL "test_cuda saw no CUDA device"
fi

# 3b. one CUDA fault poisons every later op: a blocking rerun names the first one
if [ $CT_RC != 0 ] && grep -qE "cudaError[A-Za-z]+|CUBLAS_STATUS|cuBLAS" "$O/test_cuda.log" && [ "$(left 999)" -gt 200 ]; then
  (cd "$BUILD" && PS_REQUIRE_DEVICE=1 CUDA_LAUNCH_BLOCKING=1 OMP_NUM_THREADS=8 OMP_WAIT_POLICY=PASSIVE timeout "$(left 100)" \
     ./tests/test_cuda "$BUILD") > "$O/test_cuda_blocking.log" 2>&1
  say "blocking rerun (CUDA_LAUNCH_BLOCKING=1): rc $?; first FAIL lines:"
  grep -m 3 '^FAIL' "$O/test_cuda_blocking.log" | cut -c1-300 | sed 's/^/  /' | tee -a "$S"
fi

# 3c. the op table: every op of the enum on the cuda backend against the CPU at its shapes (a missing case or
# an op the device lacks fails; PS_REQUIRE_CUDA=1: "cuda not tested" is a failure here)
if [ "$(left 999)" -gt 150 ]; then
  TO=$(date +%s)
  (cd "$BUILD" && PS_REQUIRE_CUDA=1 OMP_NUM_THREADS=8 OMP_WAIT_POLICY=PASSIVE timeout "$(left 90)" ./tests/test_backend_ops) \
    > "$O/test_backend_ops.log" 2>&1
  OT_RC=$?
  say "test_backend_ops (cuda): rc $OT_RC$([ $OT_RC = 124 ] && echo ' (timed out)') in $(($(date +%s) - TO)) s: $(tail -n 1 "$O/test_backend_ops.log" | cut -c1-200)"
  grep -m 6 '^FAIL' "$O/test_backend_ops.log" | cut -c1-300 | sed 's/^/  /' | tee -a "$S"
  [ $OT_RC = 0 ] || STATUS=FAIL
else
  say "test_backend_ops: skipped ($(left 999) s left)"
fi

# 3d / 3e. a KV cache's backend comparison on the device (the cpu-staged run bit for bit, the cuda run within
# the test's tolerance): NAME is tests/NAME --backends, run when 120 s are left
backend_stage() {
  local name=$1 t0 rc
  if [ "$(left 999)" -gt 120 ]; then
    t0=$(date +%s)
    (cd "$BUILD" && PS_REQUIRE_CUDA=1 OMP_NUM_THREADS=8 OMP_WAIT_POLICY=PASSIVE timeout "$(left 60)" "./tests/$name" --backends) \
      > "$O/$name.log" 2>&1
    rc=$?
    say "$name --backends (cuda): rc $rc$([ $rc = 124 ] && echo ' (timed out)') in $(($(date +%s) - t0)) s: $(tail -n 1 "$O/$name.log" | cut -c1-200)"
    grep -E '^  cuda ' "$O/$name.log" | cut -c1-200 | tee -a "$S"
    grep -m 6 '^FAIL' "$O/$name.log" | cut -c1-300 | sed 's/^/  /' | tee -a "$S"
    [ $rc = 0 ] || STATUS=FAIL
  else
    say "$name: skipped ($(left 999) s left)"
  fi
}
# 3d. the controlled model's cache: the same appends, forks, edits and hooks as on the cpu
backend_stage test_kvcache
# 3e. the DeepSeek-V4 cache: the conformance checkpoints mix4 and hub3
backend_stage test_v4_kvcache
# 3e'. the select attention kind (select.cu): a forward with hooks and the backward against the cpu
backend_stage test_select
# 3f. `phasescope generate --device cuda` against the cpu (deep_w8s8: 3 prompts, 16 greedy tokens, a mean
# edit; mix4: 8 tokens): the tokens equal, the log-probabilities within 1e-3 (a flip between two near-equal
# logits is reported with its margin, not failed). GEN_DEVICE: the device compared (cuda).
gen_stage() {
  local t0 rc=0 dev=${GEN_DEVICE:-cuda}
  if [ "$(left 999)" -le 90 ]; then say "generate: skipped ($(left 999) s left)"; return; fi
  t0=$(date +%s)
  python3 -c 'import json; print(json.dumps([[(7 * i + 3 * j + 1) % 96 for i in range(n)] for j, n in enumerate((21, 34, 9))]))' \
    > "$O/gen_prompts.json"
  python3 -c 'import json; print(json.dumps([[(5 * i + 2) % 64 for i in range(13)]]))' > "$O/gen_prompts_v4.json"
  for d in cpu "$dev"; do
    timeout "$(left 40)" "$BUILD/phasescope" generate --model "$ROOT/data/models/default" --tokens "$O/gen_prompts.json" \
      --max-tokens 16 --edit blocks.3.attn.cache_ck:2:1:mean --device "$d" --out "$O/generate_$d" > "$O/generate_$d.log" 2>&1 || rc=1
    timeout "$(left 40)" "$BUILD/phasescope" generate --model "$ROOT/tests/conformance/v4/mix4" --tokens "$O/gen_prompts_v4.json" \
      --max-tokens 8 --device "$d" --out "$O/generate_v4_$d" >> "$O/generate_$d.log" 2>&1 || rc=1
  done
  if [ $rc = 0 ]; then
    python3 - "$O" "$dev" > "$O/generate_compare.log" 2>&1 <<'PYEOF' || rc=1
import json, sys
o, dev = sys.argv[1], sys.argv[2]
bad = 0
for tag in ("", "_v4"):
    a = json.load(open(f"{o}/generate{tag}_cpu/generate.json"))["sequences"]
    b = json.load(open(f"{o}/generate{tag}_{dev}/generate.json"))["sequences"]
    for i, (x, y) in enumerate(zip(a, b)):
        n = next((k for k, (p, q) in enumerate(zip(x["tokens"], y["tokens"])) if p != q), len(x["tokens"]))
        w = max([abs(p - q) for p, q in zip(x["logprobs"][:n + 1], y["logprobs"][:n + 1])] or [0])
        ok = w < 1e-3 and len(x["tokens"]) == len(y["tokens"])
        flip = "" if n == len(x["tokens"]) else f"; tokens differ from step {n} (cpu {x['tokens'][n]} lp {x['logprobs'][n]:.5f}, {dev} {y['tokens'][n]} lp {y['logprobs'][n]:.5f})"
        print(f"generate {'mix4' if tag else 'deep_w8s8'} sequence {i}: {len(y['tokens'])} tokens, log-probabilities within {w:.2e}{flip}{'' if ok else ' FAIL'}")
        bad += not ok
sys.exit(1 if bad else 0)
PYEOF
  fi
  say "generate --device $dev vs cpu: rc $rc in $(($(date +%s) - t0)) s"
  cat "$O/generate_compare.log" 2>/dev/null | cut -c1-240 | sed 's/^/  /' | tee -a "$S"
  [ $rc = 0 ] || { tail -n 3 "$O/generate_$dev.log" | cut -c1-240 | sed 's/^/  /' | tee -a "$S"; STATUS=FAIL; }
}
gen_stage

# 4. bench: GEMM rates per precision, one training step per precision x attention
BG_RC=0 PEER_RC=0
if [ $SKIP_BENCH = 0 ]; then
  BARGS=(--json "$O/bench_gpu.json")
  [ $QUICK = 1 ] && BARGS+=(--steps 1 --no-knockout)
  if [ "$(left 999)" -gt 60 ]; then
    timeout "$(left 200)" "$BUILD/bench/bench_gpu" "${BARGS[@]}" > "$O/bench_gpu.log" 2>&1
    BG_RC=$?
    say "bench_gpu: rc $BG_RC$([ $BG_RC = 124 ] && echo ' (timed out)')"
    grep -E "gemm|mix|full |compressed|FAILED" "$O/bench_gpu.log" | head -n 12 | cut -c1-200 | sed 's/^/  /' | tee -a "$S"
  else
    say "bench_gpu: skipped ($(left 999) s left)"
  fi
  # 5. the PyTorch peer
  if [ $SKIP_PEER = 0 ] && [ "$(left 999)" -gt 100 ]; then
    PYTHONUNBUFFERED=1 timeout "$(left 150)" python3 bench/torch_gpu_peer.py --steps $([ $QUICK = 1 ] && echo 1 || echo 3) \
      --json "$O/torch_peer.json" > "$O/torch_peer.log" 2>&1
    PEER_RC=$?
    say "torch_peer: rc $PEER_RC$([ $PEER_RC = 124 ] && echo ' (timed out)')"
    tail -n 6 "$O/torch_peer.log" | cut -c1-200 | sed 's/^/  /' | tee -a "$S"
  elif [ $SKIP_PEER = 0 ]; then
    say "torch_peer: skipped ($(left 999) s left)"
  fi
fi

# ---------------- summary ----------------
SUMMARY=$(python3 - "$O/bench_gpu.json" "$O/torch_peer.json" <<'EOF' 2>/dev/null
import json, sys
def load(p):
    try: return json.load(open(p))
    except Exception: return None
b, t = load(sys.argv[1]), load(sys.argv[2])
parts = []
if b:
    g = b.get("gemm", {})
    parts.append("gemm " + "/".join("%s %.0f" % (k, v) for k, v in g.items()) + " TFLOP/s")
    peer = {(r["precision"], r["attention"]): r for r in (t or {}).get("train", [])}
    for r in b.get("train", []):
        p = peer.get((r["precision"], r["attention"]))
        s = "%s %s %.0f ms %.1f TF (%.0f%% of gemm)" % (r["precision"], r["attention"], r["step_s"] * 1e3, r["tflops"], 100 * r["frac_gemm"])
        if p: s += " vs torch %.0f ms (x%.2f)" % (p["step_s"] * 1e3, p["step_s"] / r["step_s"])
        parts.append(s)
    k = b.get("knockout")
    if k: parts.append("knockout %s %.0f s/%d prompt(s), ~%.0f s for 64" % (k["precision"], k["seconds"], k["prompts"], k["seconds_64"]))
print("; ".join(parts))
EOF
)
[ $BG_RC = 0 ] || STATUS=FAIL
[ $PEER_RC = 0 ] || SUMMARY="$SUMMARY; torch peer failed (rc $PEER_RC)"
finish $STATUS "build $BUILD_S s; test_cuda $CT_LINE; bench rc $BG_RC; ${SUMMARY:-no bench numbers}"
exit
}
