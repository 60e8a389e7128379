#!/usr/bin/env bash
# Installs the peers that bench/ compares kiln against, on Debian bookworm.
# Idempotent: packages already present are left alone, and a peer that cannot be
# installed is reported and skipped (the benchmarks build with whatever exists).
#
#   bench/setup.sh            # apt peers + a virtualenv with TensorFlow / JAX
#   KILN_BENCH_VENV=/path bench/setup.sh
set -uo pipefail

venv="${KILN_BENCH_VENV:-$HOME/.cache/kiln-bench-venv}"
apt_packages=(libbenchmark-dev libeigen3-dev libopenblas-dev libtorch-dev python3-torch
              python3-numpy python3-matplotlib python3-venv libxsimd-dev xtl-dev)

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

missing=()
for p in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: apt-get install ${missing[*]}"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
else
  echo "setup: apt peers already installed"
fi

# TensorFlow and JAX come from PyPI. They live in their own virtualenv (not the
# system Python) so their NumPy does not replace the one Debian's torch is built on.
if [ ! -x "$venv/bin/python" ]; then
  /usr/bin/python3 -m venv "$venv" || { echo "setup: cannot create $venv"; exit 0; }
fi
for peer in tensorflow-cpu "jax[cpu]"; do
  module="${peer%%[-\[]*}"
  if "$venv/bin/python" -c "import importlib.util as u, sys; sys.exit(u.find_spec('$module') is None)"; then
    echo "setup: $peer already installed in $venv"
  elif "$venv/bin/pip" install -q "$peer"; then
    echo "setup: installed $peer in $venv"
  else
    echo "setup: $peer is not installable here; its peer is skipped"
  fi
done
