#!/usr/bin/env bash
# Installs the Debian packages phasescope needs (or, when not root, prints the exact apt-get line).
set -euo pipefail
PKGS=(gcc make cmake pkg-config libopenblas-openmp-dev libjansson-dev libpng-dev libcairo2-dev fonts-dejavu-core clang libclang-rt-14-dev libomp-dev)
missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then missing+=("$p"); fi
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "phasescope needs these Debian packages; install them with:" >&2
  echo "  sudo apt-get update && sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
echo "installing: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "${missing[@]}" >/dev/null
