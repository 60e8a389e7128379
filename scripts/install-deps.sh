#!/usr/bin/env bash
# Installs the Debian packages kiln needs to build, test and benchmark, if any are
# missing (Debian bookworm; as root, or through sudo). Extra package names given as
# arguments are installed too. python3 writes the check that the headers' examples
# compile (scripts/doc_snippets.py) and, in CI, the single header; python3-venv holds
# the onnxruntime that checks ONNX export; nlohmann-json3-dev serves saved functions,
# libprotobuf-dev and libonnx-dev the ONNX exporter, libhdf5-dev weights files and
# checkpoints, libopenmpi-dev and openmpi-bin (mpirun) data-parallel training (all
# optional parts of kiln).
# When everything is present it only runs `dpkg-query`, so repeated calls are fast.
set -euo pipefail

packages=(g++ cmake make python3 python3-venv valgrind libboost1.81-dev libxsimd-dev xtl-dev catch2 libbenchmark-dev libthrust-dev
  nlohmann-json3-dev libprotobuf-dev libonnx-dev libhdf5-dev libopenmpi-dev openmpi-bin "$@")

if ! command -v dpkg-query >/dev/null; then
  echo "install-deps.sh: not a Debian system; install these yourself: ${packages[*]}" >&2
  exit 0
fi

missing=()
for package in "${packages[@]}"; do
  if [[ "$(dpkg-query -W -f='${Status}' "$package" 2>/dev/null)" != "install ok installed" ]]; then
    missing+=("$package")
  fi
done
if ((${#missing[@]} == 0)); then
  exit 0
fi

as_root=()
if ((EUID != 0)); then
  if ! command -v sudo >/dev/null; then
    echo "install-deps.sh: run as root (or install sudo) to install: ${missing[*]}" >&2
    exit 1
  fi
  as_root=(sudo)
fi

echo "install-deps.sh: installing ${missing[*]}"
apt_install=("${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}")
# Package lists may be absent (fresh image) or stale: refresh them only if installing fails.
if ! "${apt_install[@]}"; then
  "${as_root[@]}" apt-get update
  "${apt_install[@]}"
fi
