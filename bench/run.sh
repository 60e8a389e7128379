#!/usr/bin/env bash
# Runs kiln's whole benchmark suite and writes bench/RESULTS.md and bench/results.png.
#
#   bench/run.sh [--rounds N] [--repetitions R] [--min-time SECONDS]
#
# Each round runs the C++ program (kiln and the C++ peers, repetitions interleaved at
# random) and then every Python peer; rounds alternate so that the machine's load
# drifts over all peers alike. report.py takes medians over every repetition of every
# round. Raw JSON lands in bench/results/. bench/setup.sh installs the peers.
set -euo pipefail

bench_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
command_line="bench/run.sh $*"
rounds=3
repetitions=3
min_time=0.3
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds="$2"; shift 2 ;;
    --repetitions) repetitions="$2"; shift 2 ;;
    --min-time) min_time="$2"; shift 2 ;;
    *) echo "usage: bench/run.sh [--rounds N] [--repetitions R] [--min-time SECONDS]" >&2; exit 2 ;;
  esac
done

build_dir="${KILN_BENCH_BUILD_DIR:-$bench_dir/../build-bench}"
results="$bench_dir/results"
venv="${KILN_BENCH_VENV:-$HOME/.cache/kiln-bench-venv}"
system_python=/usr/bin/python3  # Debian's python3-torch and python3-matplotlib live here

# Debian's OpenBLAS falls back to SSE3 kernels on this CPU unless told its family,
# and Debian's torch picks AVX2 kernels unless allowed AVX-512.
export OPENBLAS_CORETYPE="${OPENBLAS_CORETYPE:-SkylakeX}"
export ATEN_CPU_CAPABILITY="${ATEN_CPU_CAPABILITY:-avx512}"
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"

cmake -S "$bench_dir" -B "$build_dir" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build_dir" -j "$(nproc)"

rm -rf "$results"
mkdir -p "$results"
{
  echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "commit: $(git -C "$bench_dir" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "cpu: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores"
  echo "memory: $(free -g | awk '/^Mem:/ {print $2}') GiB"
  echo "os: $(. /etc/os-release && echo "$PRETTY_NAME"), kernel $(uname -r)"
  echo "compiler: $(c++ --version | head -1)"
  echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
} >"$results/machine.txt"

# A Python peer that is not installed is skipped, and report.py says so.
run_python_peer() {  # python library threads out [peers.py options...]
  local python="$1" library="$2" threads="$3" out="$4" pin=()
  shift 4
  [ -x "$python" ] || return 0
  "$python" -c "import importlib.util as u, sys; sys.exit(u.find_spec('$library') is None)" || return 0
  # TensorFlow's and XLA's pools size themselves from the CPUs the process may use;
  # torch's matmul runs in OpenBLAS, which torch.set_num_threads does not reach.
  [ "$threads" = 1 ] && pin=(taskset -c 0)
  OPENBLAS_NUM_THREADS="$threads" "${pin[@]}" "$python" "$bench_dir/peers.py" --library "$library" --threads "$threads" \
    --repetitions "$repetitions" --min-time "$min_time" --out "$out" "$@"
}

for round in $(seq 1 "$rounds"); do
  echo "== round $round of $rounds"
  "$build_dir/kiln_bench" --benchmark_repetitions="$repetitions" --benchmark_min_time="$min_time" \
    --benchmark_enable_random_interleaving=true \
    --benchmark_out="$results/cpp_r${round}.json" --benchmark_out_format=json
  for threads in 1 2; do
    run_python_peer "$system_python" torch "$threads" "$results/py_torch_t${threads}_r${round}.json"
    run_python_peer "$venv/bin/python" tensorflow "$threads" "$results/py_tensorflow_t${threads}_r${round}.json"
    run_python_peer "$venv/bin/python" jax "$threads" "$results/py_jax_t${threads}_r${round}.json"
  done
done

# Data parallelism (section 19): 2 ranks under mpirun, where MPI is installed.
if [ -x "$build_dir/kiln_bench_distributed" ] && command -v mpirun >/dev/null; then
  echo "== data parallel, 2 ranks"
  mkdir -p "$results/distributed"
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun -np 2 "$build_dir/kiln_bench_distributed" \
    --rounds "$((rounds * 2))" --out "$results/distributed/distributed.json"
fi

# Peak memory of a training step: each peer alone in a fresh process, so that the
# peak is its own (report.py reads these files for memory only).
echo "== training memory"
for threads in 1 2; do
  for peer in kiln libtorch; do
    "$build_dir/kiln_bench" --benchmark_filter="^train_step_mlp/$peer/threads:$threads/" --benchmark_min_time="$min_time" \
      --benchmark_out="$results/memory_${peer}_t${threads}.json" --benchmark_out_format=json >/dev/null
  done
  run_python_peer "$system_python" torch "$threads" "$results/memory_torch_t${threads}.json" --only train_step_mlp
  run_python_peer "$venv/bin/python" tensorflow "$threads" "$results/memory_tensorflow_t${threads}.json" --only train_step_mlp
  run_python_peer "$venv/bin/python" jax "$threads" "$results/memory_jax_t${threads}.json" --only train_step_mlp
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$results/machine.txt"

"$system_python" "$bench_dir/report.py" --results "$results" --command "$command_line" \
  --markdown "$bench_dir/RESULTS.md" --plot "$bench_dir/results.png"
