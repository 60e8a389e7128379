#!/usr/bin/env bash
# Measures what a source file that uses kiln header-only costs to compile: wall time
# and peak memory of one g++ run per program, as a new user compiles it (-std=c++20
# -O2 -march=native, -I single_include, Thrust's headers and CPP system on the path
# when Thrust is installed). Prints a Markdown table; CI does not run it.
#
#   bench/compile_cost.sh [--repeat N] [--examples] [--thrust] [--pch] [--separate] [--typed] [--opt LEVEL]
#
# --repeat N   compile each program N times and report the fastest (default 1)
# --examples   also compile every program in examples/
# --thrust     turn the Thrust backend on (-DKILN_HAS_THRUST=1), off by default in
#              host compiles
# --pch        compile kiln.hpp once as a precompiled header (its cost is the first
#              row) and the programs with it
# --separate   compile the programs with KILN_SEPARATE_COMPILATION, after the library
#              that compiles kiln's kernels and runtime once (its cost is the first
#              row: one file, KILN_LIBRARY_SOURCE and KILN_INSTANTIATE_KERNELS(KILN_ALL_OPS))
# --typed      also compile kiln/fixed.hpp alone, bench/compile/typed_model.cpp (a
#              20-op model on the compile-time tier, which includes kiln/fixed.hpp) and
#              bench/compile/eigen_model.cpp (the same model on Eigen's fixed-size
#              matrices, -I /usr/include/eigen3) beside it
# --opt LEVEL  compile at -OLEVEL instead of -O2: 0 or g, say, for a debug build
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
repeat=1
examples=false
thrust=false
pch=false
separate=false
typed=false
level=2
while [ $# -gt 0 ]; do
  case "$1" in
    --repeat) repeat="$2"; shift 2 ;;
    --examples) examples=true; shift ;;
    --thrust) thrust=true; shift ;;
    --pch) pch=true; shift ;;
    --separate) separate=true; shift ;;
    --typed) typed=true; shift ;;
    --opt) level="$2"; shift 2 ;;
    *) echo "usage: bench/compile_cost.sh [--repeat N] [--examples] [--thrust] [--pch] [--separate] [--typed] [--opt LEVEL]" >&2
       exit 2 ;;
  esac
done

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

flags=(-std=c++20 "-O$level" -march=native)
if $pch; then
  # GCC uses kiln.hpp.gch in place of kiln.hpp when the flags match.
  mkdir -p "$work/pch/kiln"
  cp "$repo/single_include/kiln/kiln.hpp" "$repo/single_include/kiln/fixed.hpp" "$work/pch/kiln/"
  flags+=(-I "$work/pch")
else
  flags+=(-I "$repo/single_include")
fi
if [ -e /usr/local/cuda/include/cccl/thrust/version.h ]; then
  flags+=(-I /usr/local/cuda/include/cccl -DTHRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_CPP)
elif [ -e /usr/include/thrust/version.h ]; then
  flags+=(-DTHRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_CPP)
elif $thrust; then
  echo "--thrust: no Thrust headers found" >&2
  exit 2
fi
if $thrust; then flags+=(-DKILN_HAS_THRUST=1); fi
if $separate; then flags+=(-DKILN_SEPARATE_COMPILATION); fi

cat >"$work/include_only.cpp" <<'EOF'
#include <kiln/kiln.hpp>
int main() {}
EOF
cat >"$work/one_eager_op.cpp" <<'EOF'
#include <kiln/kiln.hpp>
#include <iostream>
int main() { std::cout << kiln::ones({2, 2}) + kiln::ones({2, 2}) << "\n"; }
EOF
cat >"$work/three_op_function.cpp" <<'EOF'
#include <kiln/kiln.hpp>
#include <iostream>
int main() {
  kiln::function f([](const kiln::tensor& x, const kiln::tensor& y) { return kiln::tanh(x * y + 2.f); });
  std::cout << f(kiln::ones({2, 2}), kiln::ones({2, 2})) << "\n";
}
EOF

cat >"$work/include_fixed_only.cpp" <<'EOF'
#include <kiln/fixed.hpp>
int main() {}
EOF

programs=("$work/include_only.cpp" "$work/one_eager_op.cpp" "$work/three_op_function.cpp")
if $examples; then programs+=("$repo"/examples/*.cpp); fi
if $typed; then
  programs+=("$work/include_fixed_only.cpp" "$repo/bench/compile/typed_model.cpp" "$repo/bench/compile/eigen_model.cpp")
fi

echo "compiler: $(g++ --version | head -1); flags: ${flags[*]}"
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "| program | wall (s) | peak memory (MB) |"
echo "|---|---|---|"
if $pch; then
  # (GCC warns of the header's #pragma once when it is the file compiled.)
  /usr/bin/time -f "%e %M" -o "$work/time" g++ "${flags[@]}" -x c++-header "$work/pch/kiln/kiln.hpp" \
    -o "$work/pch/kiln/kiln.hpp.gch" 2>/dev/null
  read -r wall kilobytes <"$work/time"
  echo "| (precompiling kiln.hpp, once) | $wall | $((kilobytes / 1024)) |"
fi
if $separate; then
  printf '#define KILN_LIBRARY_SOURCE\n#include <kiln/kiln.hpp>\nKILN_INSTANTIATE_KERNELS(KILN_ALL_OPS)\n' >"$work/library.cpp"
  /usr/bin/time -f "%e %M" -o "$work/time" g++ "${flags[@]}" -c "$work/library.cpp" -o "$work/library.o"
  read -r wall kilobytes <"$work/time"
  echo "| (the library: kernels and runtime, once) | $wall | $((kilobytes / 1024)) |"
fi
for source in "${programs[@]}"; do
  best_wall=""
  best_memory=""
  for ((run = 0; run < repeat; ++run)); do
    extra=()
    if [ "$(basename "$source")" = eigen_model.cpp ]; then extra=(-I /usr/include/eigen3); fi
    /usr/bin/time -f "%e %M" -o "$work/time" g++ "${flags[@]}" "${extra[@]}" -c "$source" -o "$work/out.o"
    read -r wall kilobytes <"$work/time"
    if [ -z "$best_wall" ] || awk "BEGIN { exit !($wall < $best_wall) }"; then
      best_wall="$wall"
      best_memory=$((kilobytes / 1024))
    fi
  done
  echo "| $(basename "$source" .cpp) | $best_wall | $best_memory |"
done
