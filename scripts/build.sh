#!/usr/bin/env bash
# Installs what is missing, then configures and builds kiln.
#   scripts/build.sh [cmake configure arguments...]
# Environment: KILN_BUILD_DIR (default: build), KILN_JOBS (default: all cores),
# KILN_TARGET (default: everything).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${KILN_BUILD_DIR:-$repo/build}"
jobs="${KILN_JOBS:-$(nproc)}"

"$repo/scripts/install-deps.sh"
cmake -S "$repo" -B "$build_dir" "$@"
cmake --build "$build_dir" -j "$jobs" ${KILN_TARGET:+--target "$KILN_TARGET"}
