#!/usr/bin/env bash
# Builds a libFuzzer target with clang, ASan and UBSan, and runs it on a copy of its
# committed corpus. The targets (KILN_FUZZ_TARGET):
#   programs (default)  fuzz/fuzz_programs.cpp, corpus fuzz/corpus: random programs run
#                       eagerly and as kiln::function must agree (test/fuzz/program.hpp);
#   load                fuzz/fuzz_load.cpp, corpus fuzz/corpus_load: hostile files given
#                       to kiln::load raise kiln errors (test/io/load_target.hpp).
# A failing input is saved as crash-* in the current directory; add it to the corpus,
# and to the seeds of test/fuzz or test/io once fixed.
#   scripts/fuzz.sh [libFuzzer arguments...]   e.g. -runs=1000000 or -max_total_time=60
# Environment: KILN_FUZZ_TARGET, KILN_FUZZ_CXX (default clang++, else clang++-14),
# KILN_FUZZ_JIT=1 to run jit_compile too, KILN_FUZZ_MARCH (default native; x86-64-v3
# fuzzes the AVX2 paths of the kernels), KILN_BUILD_DIR (default build-fuzz).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${KILN_BUILD_DIR:-$repo/build-fuzz}"
cxx="${KILN_FUZZ_CXX:-$(command -v clang++ || command -v clang++-14)}"
march="${KILN_FUZZ_MARCH:-native}"
target="${KILN_FUZZ_TARGET:-programs}"
case "$target" in
  programs) source="$repo/fuzz/fuzz_programs.cpp" corpus="$repo/fuzz/corpus" headers="$repo/test/fuzz" ;;
  load) source="$repo/fuzz/fuzz_load.cpp" corpus="$repo/fuzz/corpus_load" headers="$repo/test/io" ;;
  *) echo "fuzz.sh: unknown KILN_FUZZ_TARGET $target (programs or load)" >&2; exit 2 ;;
esac
fuzzer="$build_dir/fuzz_$target-$march"
mkdir -p "$build_dir/corpus_$target"
if [[ ! -x "$fuzzer" || "$source" -nt "$fuzzer" ]] ||
   find "$repo/include" "$headers" -newer "$fuzzer" -name '*.hpp' | grep -q .; then
  "$cxx" -std=c++20 -O1 -g1 -march="$march" -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
    -I "$repo/include" "$source" -o "$fuzzer"
fi
cp -n "$corpus"/* "$build_dir/corpus_$target/" 2>/dev/null || true
# Huge allocations are part of what is fuzzed: they must fail as kiln errors, not abort.
ASAN_OPTIONS="allocator_may_return_null=1 ${ASAN_OPTIONS:-}" "$fuzzer" "$build_dir/corpus_$target" "$@"
