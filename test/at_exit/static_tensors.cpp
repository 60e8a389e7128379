// Tensors held by a static object made before kiln's first allocation: the object is
// destroyed after kiln's own statics, and frees its tensors then. Run under Valgrind's
// memcheck (test/CMakeLists.txt), which fails the test on any read or write of freed
// memory at exit; a kiln whose allocator were destroyed before them wrote into its
// freed list of kept blocks.

#include <kiln/kiln.hpp>

#include <cstdint>
#include <iostream>
#include <vector>

namespace {

struct held_tensors {
  std::vector<kiln::tensor> tensors;
} early;  // its destructor is registered before any of kiln's statics exist

}  // namespace

int main() {
  kiln::config::set_num_threads(2);
  { const kiln::tensor dropped = kiln::ones({1 << 20}); }  // a large block kept for reuse
  for (int i = 0; i < 8; ++i) early.tensors.push_back(kiln::fill({std::int64_t(1) << (8 + 2 * i)}, float(i)));
  kiln::function twice_plus_one([](const kiln::tensor& x) { return x * 2.f + 1.f; });
  early.tensors.push_back(twice_plus_one(early.tensors.back()));
  const float last = early.tensors.back().to_vector<float>().back();
  std::cout << "held " << early.tensors.size() << " tensors; last element " << last << "\n";
  return last == 15.f ? 0 : 1;
}
