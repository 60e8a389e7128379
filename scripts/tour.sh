#!/usr/bin/env bash
# Installs what is missing, builds examples/tour.cpp and runs it.
# Environment: as scripts/build.sh (KILN_BUILD_DIR, KILN_JOBS).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${KILN_BUILD_DIR:-$repo/build}"

KILN_TARGET=example_tour "$repo/scripts/build.sh" "$@"
"$build_dir/examples/tour"
