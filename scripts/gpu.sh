#!/usr/bin/env bash
# The GPU check: the backend tests (every op on the Thrust backend against the
# reference backend, and the gpu device's own tests) and bench/bench_gpu.cu, compiled
# by nvcc for a real CUDA device. Building needs nvcc but no GPU; the binaries carry
# everything but the C++ runtime, so they can be built on one machine and run on
# another that has the GPU.
#   scripts/gpu.sh build [DIR]   compile into DIR (default build-gpu); about 4 CPU
#                                minutes per test file, KILN_JOBS at a time
#   scripts/gpu.sh run [DIR]     run the tests, the benchmark and bench/peers_gpu.py
#                                (PyTorch's CUDA peers, when python3 has torch); copy
#                                DIR's device.txt, bench_gpu.json and peers_gpu.jsonl
#                                to bench/results/gpu/ for bench/report.py
# Environment: KILN_CUDA_ARCH (default 90: H100, H200), KILN_GPU_HOST_ARCH (the host
# code's -march, default x86-64-v3 so that the binaries run on any recent x86 server),
# KILN_JOBS (default: all cores).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mode="${1:-}"
dir="${2:-$repo/build-gpu}"
nvcc="${NVCC:-/usr/local/cuda/bin/nvcc}"
tests=(thrust_test elementwise_backends_test reduction_backends_test shape_ops_backends_test linalg_backends_test)

build() {
  mkdir -p "$dir"
  local flags=(-std=c++20 -O2 -arch="sm_${KILN_CUDA_ARCH:-90}" --expt-relaxed-constexpr --extended-lambda
    -Xcompiler "-march=${KILN_GPU_HOST_ARCH:-x86-64-v3}" -diag-suppress 1675,128,20208 -I "$repo/include" -I "$repo/test")
  # One nvcc per source: each is a separate process, KILN_JOBS at a time.
  printf '%s\n' "${tests[@]}" | xargs -P "${KILN_JOBS:-$(nproc)}" -I{} \
    "$nvcc" "${flags[@]}" -x cu "$repo/test/backend/{}.cpp" -L /usr/lib -lCatch2WithMain -o "$dir/{}"
  "$nvcc" "${flags[@]}" "$repo/bench/bench_gpu.cu" -lbenchmark_main -lbenchmark -lpthread -o "$dir/bench_gpu"
  # Google Benchmark's shared library goes along, for a machine that does not have it.
  cp "$(ldd "$dir/bench_gpu" | awk '/libbenchmark/ { print $3 }')" "$dir/"
}

run() {
  local failed=0 t
  # What bench/report.py's GPU section names the machine by.
  echo "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1) (name, driver)," \
    "host $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores" | tee "$dir/device.txt" || true
  for t in "${tests[@]}"; do
    echo "=== $t"
    "$dir/$t" || failed=1
  done
  echo "=== bench_gpu"
  LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$dir/bench_gpu" --benchmark_min_time=0.5 \
    --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
    --benchmark_out="$dir/bench_gpu.json" --benchmark_out_format=json || failed=1
  if python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
    echo "=== peers_gpu.py"
    python3 "$repo/bench/peers_gpu.py" | tee "$dir/peers_gpu.jsonl" || failed=1
  fi
  return "$failed"
}

case "$mode" in
  build) build ;;
  run) run ;;
  *) sed -n '2,14p' "${BASH_SOURCE[0]}"; exit 2 ;;
esac
