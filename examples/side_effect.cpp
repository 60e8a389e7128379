// The guides' "Changing Python global and free variables" (Better performance with
// tf.function "Limitations"): changing C++ state from the callable is a side effect that
// happens while tracing only, so three calls with one signature append to the list once.

#include <kiln/kiln.hpp>

#include <iostream>
#include <vector>

int main() {
  std::vector<int> external_list;

  // @tf.function
  // def side_effect(x):
  //   print('Python side effect')
  //   external_list.append(x)
  kiln::function side_effect(
      [&](int x) {
        std::cout << "C++ side effect\n";
        external_list.push_back(x);
      },
      {.name = "side_effect", .arg_names = {"x"}});

  side_effect(1);
  side_effect(1);
  side_effect(1);
  // The list append only happened once!
  if (external_list.size() != 1) return 1;
}
