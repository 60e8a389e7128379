// Faults that end a job, each run under mpirun by test/CMakeLists.txt, which checks the
// job's output, its exit status and how long it took (run_case.cmake). Rank 0 waits in
// an all_reduce that rank 1 never joins:
//   throws  rank 1 throws a kiln::value_error out of main: kiln's terminate handler
//           prints it and aborts the job at once, long before the collective's timeout;
//   dies    rank 1 is killed (SIGKILL): mpirun ends the job;
//   leaves  rank 1 returns from main without the collective: rank 0's all_reduce raises
//           kiln::unavailable_error when its timeout (3 s) passes, and since rank 0 does
//           not catch it, the job ends with that message.
// The ranks first run one collective together, so that each fault meets a running job.

#include <kiln/distributed.hpp>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <string_view>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: mpirun -np N %s throws|dies|leaves\n", argv[0]);
    return 2;
  }
  const std::string_view fault = argv[1];
  const auto& world = kiln::distribute::communicator::world();
  kiln::distribute::set_timeout(std::chrono::seconds(fault == "leaves" ? 3 : 120));
  const float ranks = kiln::all_reduce(kiln::constant(1.f)).item<float>();
  std::printf("rank %d: %g ranks joined\n", world.rank(), double(ranks));
  std::fflush(stdout);
  if (world.rank() == 1) {
    if (fault == "throws") throw kiln::value_error("rank 1 gives up");
    if (fault == "dies") std::raise(SIGKILL);
    return 0;  // leaves
  }
  kiln::all_reduce(kiln::constant(2.f));  // rank 1 never comes
  std::printf("rank %d: the all_reduce returned, which it must not\n", world.rank());
  return 0;
}
