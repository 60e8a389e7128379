#!/usr/bin/env bash
# Compile time of a file that uses kiln, as a user compiles it: through the installed
# package (the compiled library: -DKILN_SEPARATE_COMPILATION, kiln.pc's flags),
# header-only, and beside the same programs on libtorch (Debian's libtorch-dev) and
# Eigen. Each file is compiled alone (g++ -c, -O2 -march=native, -std=c++20; libtorch
# -std=c++17), every program once per round, rounds alternated, and the 1-minute load
# average is recorded before each compile (the machine may be shared). Prints Markdown.
#
#   bench/compile_times.sh [--prefix DIR] [--old DIR] [--rounds N] [--examples] [--pch]
#
# --prefix DIR  kiln installed there (default: build it: cmake -S . -B build-compile-times
#               -DCMAKE_BUILD_TYPE=Release, cmake --build, cmake --install; the first
#               build of the package is then timed and reported)
# --old DIR     also compile the kiln programs against the headers in DIR/include
#               (e.g. `git archive <commit> include | tar -x -C DIR`), header-only
#               and with KILN_SEPARATE_COMPILATION, as "before"
# --rounds N    rounds (default 2)
# --examples    also compile every examples/*.cpp through the package (one round)
# --pch         also time kiln_precompile_headers' gain: kiln.hpp precompiled with the
#               package's flags, and the kiln programs compiled with it
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
prefix=""
old=""
rounds=2
examples=false
pch=false
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) prefix="$2"; shift 2 ;;
    --old) old="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --examples) examples=true; shift ;;
    --pch) pch=true; shift ;;
    *) echo "usage: bench/compile_times.sh [--prefix DIR] [--old DIR] [--rounds N] [--examples] [--pch]" >&2; exit 2 ;;
  esac
done

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
load() { cut -d' ' -f1 /proc/loadavg; }

echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'); commit: $(git -C "$repo" rev-parse --short HEAD)"
echo "compiler: $(g++ --version | head -1); cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores"
echo

if [ -z "$prefix" ]; then
  prefix="$repo/build-compile-times/prefix"
  echo "building the package: load $(load)"
  cmake -S "$repo" -B "$repo/build-compile-times" -DCMAKE_BUILD_TYPE=Release -DKILN_BUILD_TESTS=OFF \
    -DKILN_BUILD_EXAMPLES=OFF -DKILN_BUILD_BENCHMARKS=OFF >/dev/null
  /usr/bin/time -f "%e %U %S %M" -o "$work/time" cmake --build "$repo/build-compile-times" -j "$(nproc)" >/dev/null
  read -r wall user system kilobytes <"$work/time"
  cmake --install "$repo/build-compile-times" --prefix "$prefix" >/dev/null
  echo "first build of the package (-j $(nproc)): $wall s wall, $(awk "BEGIN { print $user + $system }") s CPU, peak $((kilobytes / 1024)) MB per compiler; load after $(load)"
  echo
fi

base=(g++ -O2 -march=native -c)
# The package's flags, as kiln.pc gives them (-DKILN_SEPARATE_COMPILATION and what the library compiled).
read -r -a kiln_package <<<"$(PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --cflags kiln)"
kiln_header_only=(-std=c++20 -I "$prefix/include")
torch=(-std=c++17 -I /usr/include/torch/csrc/api/include)
eigen=(-std=c++20 -I /usr/include/eigen3)

cat >"$work/include_only.cpp" <<'EOS'
#include <kiln/kiln.hpp>
int main() {}
EOS
cat >"$work/hello.cpp" <<'EOS'
#include <kiln/kiln.hpp>
#include <iostream>
int main() {
  kiln::function f([](const kiln::tensor& x, const kiln::tensor& y) { return kiln::tanh(x * y + 2.f); });
  std::cout << f(kiln::ones({2, 2}), kiln::ones({2, 2})) << "\n";
}
EOS
cat >"$work/torch_include_only.cpp" <<'EOS'
#include <torch/torch.h>
int main() {}
EOS

# name|flags variable|source
rows=(
  "include only, kiln package|kiln_package|$work/include_only.cpp"
  "include only, kiln header-only|kiln_header_only|$work/include_only.cpp"
  "include only, libtorch|torch|$work/torch_include_only.cpp"
  "Eigen's 20-op model|eigen|$repo/bench/compile/eigen_model.cpp"
  "hello (kiln::function, 3 ops), kiln package|kiln_package|$work/hello.cpp"
  "hello (kiln::function, 3 ops), kiln header-only|kiln_header_only|$work/hello.cpp"
  "regression trainer, kiln package|kiln_package|$repo/examples/regression_trainer.cpp"
  "regression trainer, kiln header-only|kiln_header_only|$repo/examples/regression_trainer.cpp"
  "regression trainer, libtorch|torch|$repo/bench/compile/regression_trainer_torch.cpp"
  "loader of a saved function, kiln package|kiln_package|$repo/test/package/loader.cpp"
)
if [ -n "$old" ]; then
  old_header_only=(-std=c++20 -I "$old/include")
  # The old headers with the package's flags (its defines; the old headers first on the path).
  old_separate=(-std=c++20 -I "$old/include" "${kiln_package[@]}")
  rows+=(
    "include only, before: header-only|old_header_only|$work/include_only.cpp"
    "hello, before: header-only|old_header_only|$work/hello.cpp"
    "hello, before: package flags|old_separate|$work/hello.cpp"
    "regression trainer, before: header-only|old_header_only|$repo/examples/regression_trainer.cpp"
    "regression trainer, before: package flags|old_separate|$repo/examples/regression_trainer.cpp"
  )
fi
if $pch; then
  # As kiln_precompile_headers (CMake's target_precompile_headers) does: a header that
  # includes <kiln/kiln.hpp>, precompiled, and included first in every file (-include).
  mkdir -p "$work/pch"
  echo '#include <kiln/kiln.hpp>' >"$work/pch/kiln_pch.hpp"
  echo "precompiling kiln.hpp with the package's flags: load $(load)"
  /usr/bin/time -f "%e" -o "$work/time" g++ -O2 -march=native "${kiln_package[@]}" -x c++-header "$work/pch/kiln_pch.hpp" \
    -o "$work/pch/kiln_pch.hpp.gch"
  echo "precompiled in $(cat "$work/time") s"
  echo
  kiln_package_pch=(-I "$work/pch" -include kiln_pch.hpp "${kiln_package[@]}" -Winvalid-pch)
  rows+=(
    "include only, kiln package + precompiled kiln.hpp|kiln_package_pch|$work/include_only.cpp"
    "hello, kiln package + precompiled kiln.hpp|kiln_package_pch|$work/hello.cpp"
    "regression trainer, kiln package + precompiled kiln.hpp|kiln_package_pch|$repo/examples/regression_trainer.cpp"
  )
fi

declare -A times
for ((round = 1; round <= rounds; ++round)); do
  for row in "${rows[@]}"; do
    IFS='|' read -r name flags_name source <<<"$row"
    declare -n flags="$flags_name"
    before="$(load)"
    /usr/bin/time -f "%e %U %S %M" -o "$work/time" "${base[@]}" "${flags[@]}" "$source" -o "$work/out.o"
    read -r wall user system kilobytes <"$work/time"
    times[$name]+="$wall s, CPU $(awk "BEGIN { print $user + $system }") s (load $before); "
    if ((round == 1)); then times[$name:mb]=$((kilobytes / 1024)); fi
    unset -n flags
  done
done

echo "| file | each round: wall, CPU (user + system), 1-min load average before | peak MB |"
echo "|---|---|---|"
for row in "${rows[@]}"; do
  IFS='|' read -r name _ _ <<<"$row"
  echo "| $name | ${times[$name]%; } | ${times[$name:mb]} |"
done

if $examples; then
  echo
  echo "Every example through the package, one round:"
  echo
  echo "| example | wall (s) | CPU (s) | load before | peak MB |"
  echo "|---|---|---|---|---|"
  for source in "$repo"/examples/*.cpp; do
    extra=()
    case "$(basename "$source")" in
      export_onnx.cpp) extra=(-I /usr/include/onnx) ;;
      keras_weights.cpp) extra=(-I /usr/include/hdf5/serial -DKILN_EXAMPLE_WEIGHTS_DIR=\"\") ;;
    esac
    before="$(load)"
    if ! /usr/bin/time -f "%e %U %S %M" -o "$work/time" "${base[@]}" "${kiln_package[@]}" "${extra[@]}" "$source" \
         -o "$work/out.o" 2>"$work/errors"; then
      echo "| $(basename "$source" .cpp) | did not compile: $(grep -m1 error "$work/errors" | cut -c1-120) | | | |"
      continue
    fi
    read -r wall user system kilobytes <"$work/time"
    echo "| $(basename "$source" .cpp) | $wall | $(awk "BEGIN { print $user + $system }") | $before | $((kilobytes / 1024)) |"
  done
fi
