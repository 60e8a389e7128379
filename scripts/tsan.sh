#!/usr/bin/env bash
# Installs what is missing, then builds and runs under ThreadSanitizer the tests that
# share state between threads: test/threads (many threads on one function, one
# variable, the allocator and the pool), test/core (the allocator, the thread pool),
# test/exec (the executor's parallel kernels) and test/trace (tracing, function
# caches and variables, with the executor's threads). Any race report fails the run.
#   scripts/tsan.sh
# Environment: KILN_BUILD_DIR (default: build-tsan), KILN_JOBS (default: all cores).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${KILN_BUILD_DIR:-$repo/build-tsan}"
jobs="${KILN_JOBS:-$(nproc)}"
folders=(threads core exec trace)

"$repo/scripts/install-deps.sh"
# Only those folders are configured, and built as one target: CMake's Makefiles build
# targets named on the command line one after another, each folder's one unit alone.
cmake -S "$repo" -B "$build_dir" -DCMAKE_BUILD_TYPE=Release -DKILN_SANITIZE_THREADS=ON -DKILN_BUILD_EXAMPLES=OFF \
  -DKILN_BUILD_BENCHMARKS=OFF -DKILN_PRECOMPILE_HEADERS=OFF "-DKILN_TEST_FOLDERS=$(IFS=';'; echo "${folders[*]}")"
cmake --build "$build_dir" -j "$jobs"
cd "$build_dir"
# halt_on_error: the first race fails its test at once, with its report.
TSAN_OPTIONS="halt_on_error=1 ${TSAN_OPTIONS:-}" ctest --output-on-failure -j "$jobs" \
  -R "^($(IFS='|'; echo "${folders[*]}"))/"
