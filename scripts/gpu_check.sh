#!/usr/bin/env bash
# gpu_check.sh — the one device check of the CUDA backend (docs/cuda.md, "The device check").
#
# Two steps, the first here, the second on a bare GPU machine (no network, no Debian packages there):
#
#   bash scripts/gpu_check.sh --fetch
#       on a developer machine (Debian, network to its package registry): downloads the .deb files of the
#       build's libraries (jansson, OpenBLAS, libpng, cairo, pcre2, utf8proc, pkgconf and what their
#       pkg-config files need) into .gpu_debs/ (git-ignored; about 30 MB).
#   bash scripts/gpu_check.sh
#       on the device (the `device` tool's run, with carry [".gpu_debs"]): unpacks them with dpkg -x into
#       .gpu_prefix/ inside the repository (never into /), configures a Release build with CUDA required
#       (sm_90) against that prefix, builds, runs `ctest -L cuda`, the GPU bench (bench_gpu) and the
#       PyTorch peer (bench/torch_gpu_peer.py), and prints one summary line:
#         gpu_check: PASS|FAIL build <s>s, ctest cuda <passed>/<total>, gemm <TF> TFLOP/s (tf32), train ...
#       Budget: under 6 minutes (build ~1-2 min on 16 cores, tests ~1 min, benches ~2-3 min). Logs and the
#       JSON results go to $OUT (the device tool's folder) when set, else build-gpu/.
#
# Options: --fetch | --skip-peer | --skip-bench | --quick (bench: 1 step, no knockout)
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DEBS=$ROOT/.gpu_debs
PREFIX=$ROOT/.gpu_prefix
BUILD=$ROOT/build-gpu
LOG=${OUT:-$BUILD}
ARCH=x86_64-linux-gnu

# ---------------- step 1 (developer machine): fetch the .debs ----------------
if [ "${1:-}" = "--fetch" ]; then
  command -v apt-get >/dev/null || { echo "gpu_check --fetch: needs apt-get (a Debian machine)"; exit 1; }
  mkdir -p "$DEBS"
  roots="libjansson-dev libjansson4 libopenblas-openmp-dev libopenblas0-openmp libpng-dev libpng16-16 zlib1g-dev zlib1g
         libcairo2-dev libcairo2 libpcre2-dev libpcre2-8-0 libutf8proc-dev libutf8proc2 pkgconf pkgconf-bin libpkgconf3
         libgfortran5 libgomp1 libquadmath0"
  # the closure of what their pkg-config files need, less the base system the device has anyway
  pkgs=$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks --no-replaces \
           --no-enhances --no-pre-depends $roots 2>/dev/null | grep -v '^ ' | grep -v '^<' | sort -u |
         grep -Ev '^(libc6|libc6-dev|libc-dev-bin|libgcc-s1|gcc-[0-9]+-base|libstdc\+\+6|perl.*|libperl.*|python3.*|libpython3.*|dpkg|debconf.*|cdebconf|install-info|fonts-.*|fontconfig|libdebian-installer.*|libnewt.*|libslang.*|libtextwrap.*|libncursesw.*|libtinfo.*|libreadline.*|readline-common|libdb5.*|libgdbm.*|libsqlite3.*|libssl.*|libkrb.*|libk5crypto.*|libgssapi.*|libcom-err.*|libkeyutils.*|libcrypt1|libcrypt-dev|libnsl.*|libtirpc.*|linux-libc-dev|rpcsvc-proto|media-types|tzdata|netbase|sensible-utils|libglib2.0-bin|libglib2.0-data|libglib2.0-dev-bin|libelf1|libfontenc1|x11-common|xkb-data|libxml2|libicu.*|uuid-dev|libsystemd.*|libudev.*|libcap.*|libaudit.*|libpam.*|libzstd1|liblz4-1|libgpg-error0|libgcrypt20|libpcre2-posix3|libpcre2-16-0|libpcre2-32-0|libmpdec.*|libcairo-script-interpreter2|tar|xfonts-encodings|libsepol-dev|libsepol2|libselinux1-dev|libselinux1|libmount-dev|libmount1|libblkid-dev|libblkid1|libx11-data|libcairo-gobject2|libgomp1|mailcap|mime-support|sysvinit-utils|lsb-base|ttf-bitstream-vera|xfonts-utils|fontconfig-config)$')
  echo "gpu_check --fetch: $(echo $pkgs | wc -w) packages into $DEBS"
  (cd "$DEBS" && apt-get download $pkgs >/dev/null) || { echo "gpu_check --fetch: apt-get download failed"; exit 1; }
  du -sh "$DEBS" | awk '{print "gpu_check --fetch: " $1 " in .gpu_debs/ (name it in the device run'"'"'s carry)"}'
  exit 0
fi

QUICK=0 SKIP_PEER=0 SKIP_BENCH=0 CONFIGURE_ONLY=0
for a in "$@"; do
  case "$a" in
    --quick) QUICK=1 ;; --skip-peer) SKIP_PEER=1 ;; --skip-bench) SKIP_BENCH=1 ;;
    --configure-only) CONFIGURE_ONLY=1 ;; # (checking the prefix on a machine without a GPU)
    *) echo "usage: gpu_check.sh [--fetch | --quick | --skip-peer | --skip-bench | --configure-only]"; exit 2 ;;
  esac
done
mkdir -p "$LOG" "$BUILD"
T0=$(date +%s)
fail() { echo "gpu_check: FAIL $* ($(($(date +%s) - T0)) s)"; exit 1; }
ok_line=""

# ---------------- step 2 (device): environment ----------------
export PATH=/usr/local/cuda/bin:$PATH
command -v nvcc >/dev/null || fail "no nvcc on PATH (/usr/local/cuda/bin)"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$LOG/gpu.txt" 2>&1
echo "gpu_check: $(head -n 1 "$LOG/gpu.txt" 2>/dev/null || echo 'nvidia-smi missing'); nvcc $(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')"
command -v cmake >/dev/null || fail "no cmake"
command -v g++ >/dev/null || command -v c++ >/dev/null || fail "no C++ host compiler for nvcc"

# the carried libraries, unpacked into the prefix (only when the device lacks them)
need_prefix=${GPU_CHECK_FORCE_PREFIX:-0} # 1: use the carried libraries even where the machine has its own
for pc in jansson cairo libpcre2-8 libutf8proc libpng; do
  pkg-config --exists "$pc" 2>/dev/null || need_prefix=1
done
[ -e /usr/include/$ARCH/openblas-openmp/cblas.h ] || [ -e /usr/include/cblas.h ] || need_prefix=1
CMAKE_EXTRA=()
if [ $need_prefix = 1 ]; then
  ls "$DEBS"/*.deb >/dev/null 2>&1 || fail "the device lacks the build's libraries and no .gpu_debs/ came along (run 'bash scripts/gpu_check.sh --fetch' here first, then carry .gpu_debs)"
  if [ ! -e "$PREFIX/.unpacked" ]; then
    rm -rf "$PREFIX"; mkdir -p "$PREFIX"
    for f in "$DEBS"/*.deb; do dpkg -x "$f" "$PREFIX" || fail "dpkg -x $f"; done
    touch "$PREFIX/.unpacked"
  fi
  L=$PREFIX/usr/lib/$ARCH
  # Debian's -dev packages link lib*.so through absolute symlinks (/lib/...): point them into the prefix
  find "$PREFIX" -type l | while read -r l; do
    t=$(readlink "$l"); case "$t" in /*) [ -e "$PREFIX$t" ] && ln -sfn "$PREFIX$t" "$l" ;; esac
  done
  if ! command -v pkg-config >/dev/null; then
    mkdir -p "$PREFIX/bin"
    printf '#!/bin/sh\nexec env LD_LIBRARY_PATH=%s "%s" "$@"\n' "$L" "$PREFIX/usr/bin/pkgconf" > "$PREFIX/bin/pkg-config"
    chmod +x "$PREFIX/bin/pkg-config"
    export PATH=$PREFIX/bin:$PATH
  fi
  export PKG_CONFIG_LIBDIR=$L/pkgconfig:$PREFIX/usr/share/pkgconfig:$PREFIX/usr/lib/pkgconfig
  export PKG_CONFIG_SYSROOT_DIR=$PREFIX
  # no LD_LIBRARY_PATH (it would hand the device's own tools, python3 and cmake, these older libraries): the
  # programs find the prefix through DT_RPATH, which (unlike RUNPATH) also serves the libraries' own needs
  CMAKE_EXTRA=(-DCMAKE_PREFIX_PATH="$PREFIX/usr" -DOPENBLAS_LIB="$L/openblas-openmp/libopenblas.so"
               -DCMAKE_C_FLAGS="-I$PREFIX/usr/include/$ARCH/openblas-openmp -I$PREFIX/usr/include -I$PREFIX/usr/include/$ARCH"
               -DCMAKE_EXE_LINKER_FLAGS="-L$L -Wl,--disable-new-dtags -Wl,-rpath-link,$L -Wl,-rpath,$L:$L/openblas-openmp:$PREFIX/lib/$ARCH")
fi

# ---------------- build ----------------
TB=$(date +%s)
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DPS_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="90-real;90-virtual" \
  "${CMAKE_EXTRA[@]}" > "$LOG/configure.log" 2>&1 || { tail -n 25 "$LOG/configure.log"; fail "configure (log: configure.log)"; }
if [ $CONFIGURE_ONLY = 1 ]; then grep -E "CUDA backend|OpenBLAS|Found" "$LOG/configure.log"; echo "gpu_check: configured"; exit 0; fi
cmake --build "$BUILD" -j "$(nproc)" --target test_cuda bench_gpu phasescope > "$LOG/build.log" 2>&1 ||
  { grep -E "error|Error" "$LOG/build.log" | head -n 20; fail "build (log: build.log)"; }
BUILD_S=$(($(date +%s) - TB))
echo "gpu_check: built in ${BUILD_S} s"

# ---------------- tests ----------------
(cd "$BUILD" && ctest -L cuda -V --timeout 240) > "$LOG/ctest.log" 2>&1
CT_RC=$?
tail -n 40 "$LOG/ctest.log"
CT_LINE=$(grep -E "tests passed|tests failed" "$LOG/ctest.log" | tail -n 1)
grep -q "skipped: no CUDA device" "$LOG/ctest.log" && { CT_RC=1; CT_LINE="$CT_LINE (skipped: the tests saw no device)"; }

# ---------------- benches ----------------
BG_RC=0 PEER_RC=0
if [ $SKIP_BENCH = 0 ]; then
  BARGS=(--json "$LOG/bench_gpu.json")
  [ $QUICK = 1 ] && BARGS+=(--steps 1 --no-knockout)
  timeout 200 "$BUILD/bench/bench_gpu" "${BARGS[@]}" 2>&1 | tee "$LOG/bench_gpu.log"
  BG_RC=${PIPESTATUS[0]}
  if [ $SKIP_PEER = 0 ]; then
    PY=python3
    PYTHONUNBUFFERED=1 timeout 150 $PY bench/torch_gpu_peer.py --steps $([ $QUICK = 1 ] && echo 1 || echo 3) \
      --json "$LOG/torch_peer.json" 2>&1 | tee "$LOG/torch_peer.log"
    PEER_RC=${PIPESTATUS[0]}
  fi
fi

# ---------------- summary ----------------
SUMMARY=$(python3 - "$LOG/bench_gpu.json" "$LOG/torch_peer.json" <<'EOF' 2>/dev/null
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
TOTAL=$(($(date +%s) - T0))
STATUS=PASS
[ $CT_RC = 0 ] && [ $BG_RC = 0 ] || STATUS=FAIL
[ $PEER_RC = 0 ] || SUMMARY="$SUMMARY; torch peer failed (rc $PEER_RC)"
echo "gpu_check: $STATUS in ${TOTAL} s: build ${BUILD_S} s; ctest -L cuda: ${CT_LINE:-no result} (rc $CT_RC); bench rc $BG_RC; ${SUMMARY:-no bench numbers}"
[ $STATUS = PASS ]
