/// \file
/// The benchmark program's entry point: Google Benchmark's own main, plus context
/// lines in the JSON output that say how the peers were configured, so a result file
/// shows whether OpenBLAS ran its AVX-512 kernels and torch its AVX-512 path.

#include <benchmark/benchmark.h>

#include <cstdlib>
#include <iostream>
#include <string>

#if KILN_BENCH_HAS_OPENBLAS
#include <cblas.h>
#endif

namespace {

std::string environment(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? "unset" : value;
}

void add_peer_context() {
  benchmark::AddCustomContext("OPENBLAS_CORETYPE", environment("OPENBLAS_CORETYPE"));
  benchmark::AddCustomContext("ATEN_CPU_CAPABILITY", environment("ATEN_CPU_CAPABILITY"));
#if KILN_BENCH_HAS_OPENBLAS
  const std::string core = openblas_get_corename();
  benchmark::AddCustomContext("openblas_core", core);
  // Debian's OpenBLAS does not recognise this CPU family and falls back to SSE3
  // kernels five times slower; a comparison against those would flatter kiln.
  if (environment("OPENBLAS_CORETYPE") == "unset")
    std::cerr << "warning: OPENBLAS_CORETYPE is unset; OpenBLAS runs its '" << core
              << "' kernels. Run through bench/run.sh or set OPENBLAS_CORETYPE=SkylakeX.\n";
#endif
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  add_peer_context();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
