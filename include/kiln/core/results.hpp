#pragma once
/// \file
/// What traced code gives back, in both tiers alike: the structure of a function's
/// result (`detail::output_of`, each tier saying what its leaves become) and what a
/// loop body returns to stop early (`break_result`, made by kiln::break_if).

#include <array>
#include <cstddef>
#include <tuple>
#include <utility>
#include <vector>

namespace kiln {

class tensor;

/// What a loop body returns to stop early (kiln::break_if): the condition `stop`, a
/// bool scalar kiln::tensor or typed operand, and the values to go on with.
template <class Tuple, class Stop = tensor>
struct break_result {
  Stop stop;
  Tuple next;
};

namespace detail {

/// The type a function gives back for what its traced code returned, `R`: each leaf
/// `L` as `Leaf<L>::type` (kiln::tensor for the runtime tier, kiln::fixed for the
/// typed tier's expressions), tuples, pairs, arrays and vectors keeping their structure.
template <template <class> class Leaf, class R>
struct output_of {
  using type = typename Leaf<R>::type;
};
template <template <class> class Leaf, class... Ts>
struct output_of<Leaf, std::tuple<Ts...>> {
  using type = std::tuple<typename output_of<Leaf, Ts>::type...>;
};
template <template <class> class Leaf, class A, class B>
struct output_of<Leaf, std::pair<A, B>> {
  using type = std::pair<typename output_of<Leaf, A>::type, typename output_of<Leaf, B>::type>;
};
template <template <class> class Leaf, class T, std::size_t N>
struct output_of<Leaf, std::array<T, N>> {
  using type = std::array<typename output_of<Leaf, T>::type, N>;
};
template <template <class> class Leaf, class T, class A>
struct output_of<Leaf, std::vector<T, A>> {
  using type = std::vector<typename output_of<Leaf, T>::type>;
};

}  // namespace detail
}  // namespace kiln
