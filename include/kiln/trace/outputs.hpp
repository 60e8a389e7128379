#pragma once
/// \file
/// What a kiln::function's callable returns, as the runtime tier handles it: the types
/// its results take (detail::output_t), its leaves walked in order, its structure as a
/// signature shows it, and the structure rebuilt from the leaves a trace gives back.
/// Part of kiln/trace/runtime_tier.hpp.

#include <cstddef>
#include <cstdint>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/core/results.hpp"
#include "kiln/core/spec.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/ops/tensor_array.hpp"
#include "kiln/trace/signature.hpp"

namespace kiln {
namespace detail {

/// A leaf of what a traced callable returned, as the function gives it back: a tensor,
/// or a C++ number that becomes one; a tensor_array stays one (its leaf is the tensor
/// of its elements). Tuples, pairs, arrays and vectors keep their structure (output_of).
template <class R>
struct runtime_output_leaf {
  using type = tensor;
};
template <>
struct runtime_output_leaf<tensor_array> {
  using type = tensor_array;
};
template <class R>
using output_t = typename output_of<runtime_output_leaf, std::remove_cvref_t<R>>::type;

template <class T>
tensor scalar_constant(const T& v) {
  static_assert(has_dtype<T> || std::is_same_v<T, int> || std::is_same_v<T, long long>,
                "a kiln::function may return tensors, C++ numbers of the element types, and tuples, pairs, arrays "
                "and vectors of those");
  using E = std::conditional_t<has_dtype<T>, T, std::conditional_t<sizeof(T) == 4, std::int32_t, std::int64_t>>;
  tensor t(dtype_of<E>, shape{});
  *t.view().template as<E>() = E(v);
  return t;
}

/// Calls `f(leaf)` for every leaf of a returned value, in order.
template <class R, class F>
void for_each_output(const R& r, F&& f) {
  using U = std::remove_cvref_t<R>;
  if constexpr (std::is_same_v<U, tensor>) {
    f(r);
  } else if constexpr (std::is_same_v<U, tensor_array>) {
    f(r.elements());
  } else if constexpr (is_tuple_like<U>::value || is_vector<U>::value) {
    for_each_element(r, [&](const auto& e) { for_each_output(e, f); });
  } else {
    f(scalar_constant(r));
  }
}

/// Writes the structure of a returned value's tensors to `s`, as for_each_output walks them.
template <class R>
void describe_outputs(const R& r, structure_text& s) {
  using U = std::remove_cvref_t<R>;
  if constexpr (is_tuple_like<U>::value || is_vector<U>::value) {
    constexpr bool list = is_vector<U>::value || is_std_array<U>::value;
    s.open(list);
    std::size_t count = 0;
    for_each_element(r, [&](const auto& e) {
      if (count++) s.next();
      describe_outputs(e, s);
    });
    s.close(list, count);
  } else {
    s.leaf();
  }
}
/// The structure of a returned value as a signature shows it; empty for one tensor.
template <class R>
std::string output_structure_text(const R& r) {
  if constexpr (is_tuple_like<std::remove_cvref_t<R>>::value || is_vector<std::remove_cvref_t<R>>::value) {
    structure_text s;
    describe_outputs(r, s);
    return s.text;
  } else {
    return {};
  }
}

/// The returned structure `traced` with its leaves taken, in order, from `next`.
template <class R>
output_t<R> rebuild_output(const R& traced, const tensor*& next) {
  using U = std::remove_cvref_t<R>;
  if constexpr (is_tuple_like<U>::value) {
    return std::apply([&](const auto&... e) { return output_t<R>{rebuild_output(e, next)...}; }, traced);
  } else if constexpr (is_vector<U>::value) {
    output_t<R> out;
    for (const auto& e : traced) out.push_back(rebuild_output(e, next));
    return out;
  } else if constexpr (std::is_same_v<U, tensor_array>) {
    return traced.with_elements(*next++);
  } else {
    return *next++;
  }
}

}  // namespace detail
}  // namespace kiln
