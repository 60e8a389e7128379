#!/usr/bin/env bash
# Builds fuzz/fuzz_programs.cpp with clang's libFuzzer, ASan and UBSan, and runs it on
# a copy of the committed corpus (fuzz/corpus): random programs run eagerly and as
# kiln::function must agree (test/fuzz/program.hpp). A failing input is saved as
# crash-* in the current directory; add it to fuzz/corpus and to the seeds of
# test/fuzz once fixed.
#   scripts/fuzz.sh [libFuzzer arguments...]   e.g. -runs=1000000 or -max_total_time=60
# Environment: KILN_FUZZ_CXX (default clang++, else clang++-14), KILN_FUZZ_JIT=1 to
# run jit_compile too, KILN_FUZZ_MARCH (default native; x86-64-v3 fuzzes the AVX2
# paths of the kernels), KILN_BUILD_DIR (default build-fuzz).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${KILN_BUILD_DIR:-$repo/build-fuzz}"
cxx="${KILN_FUZZ_CXX:-$(command -v clang++ || command -v clang++-14)}"
march="${KILN_FUZZ_MARCH:-native}"
fuzzer="$build_dir/fuzz_programs-$march"
mkdir -p "$build_dir/corpus"
if [[ ! -x "$fuzzer" || "$repo/fuzz/fuzz_programs.cpp" -nt "$fuzzer" ]] ||
   find "$repo/include" "$repo/test/fuzz" -newer "$fuzzer" -name '*.hpp' | grep -q .; then
  "$cxx" -std=c++20 -O1 -g1 -march="$march" -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
    -I "$repo/include" "$repo/fuzz/fuzz_programs.cpp" -o "$fuzzer"
fi
cp -n "$repo"/fuzz/corpus/* "$build_dir/corpus/" 2>/dev/null || true
# Huge allocations are part of what is fuzzed: they must fail as kiln errors, not abort.
ASAN_OPTIONS="allocator_may_return_null=1 ${ASAN_OPTIONS:-}" "$fuzzer" "$build_dir/corpus" "$@"
