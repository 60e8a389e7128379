#pragma once
/// \file
/// What both tiers' control flow share: the concepts that tell loop variables, loop
/// options, loop indices and loop bodies apart. kiln::while_loop and kiln::for_range
/// have overloads in each tier; they constrain with these same concepts, so that the
/// typed overloads, which add constraints, are the more specialized ones.

#include <concepts>

namespace kiln {

class tensor;
struct loop_options;

namespace detail {

/// Loop variables given without kiln::loop_options first.
template <class... Vars>
concept plain_loop_variables = (!std::same_as<Vars, loop_options> && ...);

/// A loop's index or bound: a C++ integer, or an int32 scalar tensor.
template <class T>
concept loop_index = std::integral<T> || std::same_as<T, tensor>;

/// A loop body, told apart from a loop index.
template <class T>
concept loop_body = !loop_index<T>;

}  // namespace detail
}  // namespace kiln
