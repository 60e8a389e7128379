#!/usr/bin/env bash
# Installs what is missing, builds kiln and runs its tests.
#   scripts/test.sh [cmake configure arguments...]     e.g. -DKILN_SANITIZE=ON
# Environment: as scripts/build.sh (KILN_BUILD_DIR, KILN_JOBS).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${KILN_BUILD_DIR:-$repo/build}"

KILN_TARGET= "$repo/scripts/build.sh" "$@"
cd "$build_dir"
ctest --output-on-failure -j "${KILN_JOBS:-$(nproc)}"
