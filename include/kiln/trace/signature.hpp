#pragma once
/// \file
/// Signatures of kiln::function calls. A call's arguments are flattened to leaves,
/// following the contract: a tensor contributes its dtype and shape, a C++ number,
/// string or enum its value, a tuple, pair, std::array, std::vector or aggregate its
/// leaves, a kiln::variable its identity, a dataset its element spec (and its handle
/// as a tensor), and any other object its address. The leaves give the cache key,
/// the tensors the function runs on, and (when tracing) the placeholders the
/// callable gets.

#include <boost/pfr.hpp>

#include <algorithm>
#include <array>
#include <concepts>
#include <cstdint>
#include <cstring>
#include <functional>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/core/spec.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/core/this_thread.hpp"

namespace kiln::detail {

template <class T>
struct is_tuple_like : std::false_type {};
template <class... Ts>
struct is_tuple_like<std::tuple<Ts...>> : std::true_type {};
template <class A, class B>
struct is_tuple_like<std::pair<A, B>> : std::true_type {};
template <class T, std::size_t N>
struct is_tuple_like<std::array<T, N>> : std::true_type {};
/// Sequences a signature shows as a list (`[<1>, <2>]`), as TensorFlow a Python list.
template <class T>
struct is_std_array : std::false_type {};
template <class T, std::size_t N>
struct is_std_array<std::array<T, N>> : std::true_type {};
template <class T>
struct is_vector : std::false_type {};
template <class T, class A>  // std::vector<bool> holds proxies, not values: it is an object like any other
struct is_vector<std::vector<T, A>> : std::bool_constant<!std::is_same_v<T, bool>> {};

template <class T>
struct is_char_array : std::false_type {};
template <std::size_t N>
struct is_char_array<char[N]> : std::true_type {};

/// A C++ string: keyed by its text, whatever holds it (a literal `"relu"` is a `char[5]`).
template <class T>
inline constexpr bool is_string_like = std::is_same_v<T, std::string> || std::is_same_v<T, std::string_view> ||
                                       std::is_same_v<T, const char*> || std::is_same_v<T, char*> ||
                                       is_char_array<T>::value;

/// The text of a C++ string; a char array holds it up to its first NUL.
template <class T>
std::string_view string_text(const T& s) {
  if constexpr (is_char_array<T>::value) return std::string_view(s, std::find(s, s + std::extent_v<T>, '\0') - s);
  else return std::string_view(s);
}

/// A C++ value that is part of a signature by its value.
template <class T>
inline constexpr bool is_value_leaf = std::is_arithmetic_v<T> || std::is_enum_v<T> || is_string_like<T>;

/// A plain struct kiln flattens field by field.
template <class T>
inline constexpr bool is_flattened_aggregate = std::is_aggregate_v<T> && !std::is_array_v<T> && std::is_class_v<T> &&
                                               std::is_copy_constructible_v<T> && !std::is_same_v<T, tensor_spec>;

/// A structure kiln flattens element by element: tuple, pair, std::array, std::vector
/// or aggregate.
template <class T>
inline constexpr bool is_sequence = is_tuple_like<T>::value || is_vector<T>::value || is_flattened_aggregate<T>;

/// Calls `f(element)` for each element of sequence `x` (each field of an aggregate), in order.
/// \code
/// const std::pair pair{1, 2.f};
/// kiln::detail::for_each_element(pair, [](const auto& e) { std::cout << e; });  // 12
/// \endcode
template <class T, class F>
void for_each_element(T& x, F&& f) {
  using U = std::remove_const_t<T>;
  if constexpr (is_tuple_like<U>::value) std::apply([&](auto&... e) { (f(e), ...); }, x);
  else if constexpr (is_vector<U>::value) for (auto& e : x) f(e);
  else boost::pfr::for_each_field(x, f);
}

/// How many elements sequence `x` has.
template <class T>
std::size_t sequence_size(const T& x) {
  if constexpr (is_tuple_like<T>::value) return std::tuple_size_v<T>;
  else if constexpr (is_vector<T>::value) return x.size();
  else return boost::pfr::tuple_size_v<T>;
}

/// Which kind of leaf a key word sequence starts with.
enum class leaf : std::uint64_t { tensor = 1, value, sequence, address, handle };

/// An object a function receives through a handle tensor (a kiln::data::dataset),
/// as TensorFlow passes a dataset as a variant tensor: keyed by the spec it describes
/// (`append_spec_key`), so objects of one spec share a trace, and given to the graph
/// as `handle()`, so that every call runs on the object it was called with.
/// \code static_assert(kiln::detail::handle_argument<kiln::data::dataset>); \endcode
template <class T>
concept handle_argument = requires(const T& x, std::vector<std::uint64_t>& key, const tensor& h) {
  { x.handle() } -> std::same_as<const tensor&>;
  x.append_spec_key(key);
  { x.with_handle(h) } -> std::same_as<T>;
};

template <class T>
std::uint64_t type_code() {
  static const char tag = 0;
  return std::uint64_t(reinterpret_cast<std::uintptr_t>(&tag));
}

/// A C++ value as a signature shows it (`2`, `"a"`, `true`) and the name of its kind
/// (`int`, `string`, ...), as TensorFlow's messages say "int value 2".
template <class T>
std::pair<std::string, std::string> describe_leaf(const T& v) {
  std::ostringstream os;
  if constexpr (is_string_like<T>) {
    os << '"' << string_text(v) << '"';
    return {"string", os.str()};
  } else if constexpr (std::is_same_v<T, bool>) {
    return {"bool", v ? "true" : "false"};
  } else if constexpr (std::is_enum_v<T>) {
    os << +static_cast<std::underlying_type_t<T>>(v);
    return {"enum", os.str()};
  } else if constexpr (std::is_floating_point_v<T>) {
    os << v;
    return {std::is_same_v<T, float> ? "float" : "double", os.str()};
  } else {
    os << +v;
    return {std::is_same_v<T, char> ? "char" : "int", os.str()};
  }
}

inline void add_shape(std::vector<std::uint64_t>& key, dtype t, const shape& s) {
  key.push_back(std::uint64_t(t));
  key.push_back(std::uint64_t(std::int64_t(s.rank())));
  for (std::int64_t d : s.dims()) key.push_back(std::uint64_t(d));
}

/// The flattened arguments of one call.
struct call_signature {
  struct value_leaf {
    int arg = 0;
    std::vector<std::uint64_t> key;
    std::string kind;  ///< `int`, `string`, ...
    std::string text;  ///< `2`, `"a"`, ...
  };
  /// The cache key. Its first `structure_size` words are the call's structure: all but
  /// the tensors' dtypes and shapes (nesting, C++ values, addresses, and a marker where
  /// each tensor sits); `seal` appends each tensor's spec. input_signature and
  /// reduce_retracing change the specs of a call, never its structure.
  std::vector<std::uint64_t> key;
  std::size_t structure_size = 0;
  bool sealed = false;
  /// One entry per tensor leaf: the tensor (null for a tensor_spec), its spec and argument.
  std::vector<const tensor*> tensors;
  std::vector<tensor_spec> specs;
  std::vector<int> tensor_arg;
  std::vector<value_leaf> values;

  /// Ends the structure (the first time, after flattening) or drops the specs an
  /// earlier seal appended, then appends the current specs.
  KILN_LIBRARY_INLINE void seal();
  std::span<const std::uint64_t> structure() const { return {key.data(), structure_size}; }

  /// Empties it for another call, keeping the vectors' capacity.
  void clear() {
    key.clear();
    structure_size = 0;
    sealed = false;
    tensors.clear();
    specs.clear();
    tensor_arg.clear();
    values.clear();
  }
};

/// What a call of a kiln::function needs besides its arguments: the signature that
/// keys it and room for its outputs.
struct call_frame {
  call_signature signature;
  std::vector<tensor> outputs;
};

/// A call_frame taken from this thread's pool and given back at the end of the call,
/// empty, so that its vectors keep their capacity and a call in steady state allocates
/// nothing to key itself or collect its outputs. A call made during another (from a
/// host callback, or while tracing) takes a frame of its own.
class pooled_call_frame {
 public:
  KILN_LIBRARY_INLINE pooled_call_frame();
  KILN_LIBRARY_INLINE ~pooled_call_frame();
  pooled_call_frame(const pooled_call_frame&) = delete;
  pooled_call_frame& operator=(const pooled_call_frame&) = delete;
  call_frame* operator->() const { return frame_; }

 private:
  struct pool {
    static constexpr int depth = 8;
    call_frame* frames[depth];
    int count = 0;
    ~pool() {
      for (int i = 0; i < count; ++i) delete frames[i];
    }
  };
  // Null for a call made while the thread's objects are destroyed: it takes a frame
  // of its own.
  static pool* this_thread_frames() { return this_thread_object<pool>(); }
  call_frame* frame_;
};

// Compiled once in a compiled kiln (KILN_LIBRARY_INLINE, kiln/config.hpp): every
// kiln::function call reaches them.
#if KILN_DEFINE_LIBRARY
KILN_LIBRARY_INLINE void call_signature::seal() {
  if (!sealed) structure_size = key.size();
  key.resize(structure_size);
  sealed = true;
  for (const tensor_spec& s : specs) add_shape(key, s.dtype, s.shape);
}

KILN_LIBRARY_INLINE pooled_call_frame::pooled_call_frame() {
  pool* p = this_thread_frames();
  frame_ = p && p->count > 0 ? p->frames[--p->count] : new call_frame;
}

KILN_LIBRARY_INLINE pooled_call_frame::~pooled_call_frame() {
  frame_->signature.clear();
  frame_->outputs.clear();
  pool* p = this_thread_frames();
  if (p && p->count < pool::depth)
    p->frames[p->count++] = frame_;
  else
    delete frame_;
}
#endif

/// How a signature shows a C++ argument with no tensor in it, as Python shows the
/// value: `2`, `"a"`, `[1, -1]` (sequences and aggregates as lists); empty when it
/// holds a tensor or an object keyed by address.
template <class T>
std::string bound_text_of(const T& x) {
  using U = std::remove_cvref_t<T>;
  if constexpr (is_value_leaf<U>) {
    return describe_leaf(x).second;
  } else if constexpr (is_sequence<U>) {
    std::string s = "[";
    bool ok = true;
    for_each_element(x, [&](const auto& e) {
      std::string t = bound_text_of(e);
      ok = ok && !t.empty();
      s += (s.size() > 1 ? ", " : "") + t;
    });
    return ok ? s + "]" : std::string();
  } else {
    return {};
  }
}

/// An object that the callable takes by non-const reference (`auto& model`): keyed by
/// address and passed through as itself, never flattened into a copy, so that what the
/// callable changes in it while tracing is changed in the caller's object.
template <class T>
struct object_reference {
  T& object;
};
template <class T>
struct is_object_reference : std::false_type {};
template <class T>
struct is_object_reference<object_reference<T>> : std::true_type {};

/// `a` as an object_reference when it is a non-const object (not a tensor, string or
/// number) that the caller passed as an lvalue; else `a` itself.
template <class A>
decltype(auto) reference_if_object(A&& a) {
  using U = std::remove_cvref_t<A>;
  if constexpr (std::is_lvalue_reference_v<A> && !std::is_const_v<std::remove_reference_t<A>> && std::is_class_v<U> &&
                !std::is_same_v<U, tensor> && !std::is_same_v<U, tensor_spec> && !is_string_like<U>)
    return object_reference<U>{a};
  else
    return std::forward<A>(a);
}

/// What the callable receives for `a` when it runs eagerly: the object behind an
/// object_reference, else `a` itself.
template <class A>
decltype(auto) referenced(A&& a) {
  if constexpr (is_object_reference<std::remove_cvref_t<A>>::value)
    return (a.object);
  else
    return std::forward<A>(a);
}

/// A tensor's and a tensor_spec's leaf of the key, the leaves of every call
/// (KILN_LIBRARY_INLINE: compiled once in a compiled kiln).
KILN_LIBRARY_INLINE void flatten_tensor(const tensor* x, tensor_spec spec, call_signature& sig, int arg);
#if KILN_DEFINE_LIBRARY
KILN_LIBRARY_INLINE void flatten_tensor(const tensor* x, tensor_spec spec, call_signature& sig, int arg) {
  sig.key.push_back(std::uint64_t(leaf::tensor));
  sig.tensors.push_back(x);
  sig.specs.push_back(std::move(spec));
  sig.tensor_arg.push_back(arg);
}
#endif

template <class T>
void flatten(const T& x, call_signature& sig, int arg) {
  using U = std::remove_cvref_t<T>;
  if constexpr (is_object_reference<U>::value) {
    sig.key.push_back(std::uint64_t(leaf::address));
    sig.key.push_back(std::uint64_t(reinterpret_cast<std::uintptr_t>(std::addressof(x.object))));
  } else if constexpr (std::is_same_v<U, tensor>) {
    flatten_tensor(&x, tensor_spec(x.shape(), x.dtype()), sig, arg);
  } else if constexpr (std::is_same_v<U, tensor_spec>) {
    flatten_tensor(nullptr, x, sig, arg);
  } else if constexpr (handle_argument<U>) {
    sig.key.push_back(std::uint64_t(leaf::handle));
    x.append_spec_key(sig.key);
    flatten(x.handle(), sig, arg);
  } else if constexpr (is_value_leaf<U>) {
    auto [kind, text] = describe_leaf(x);
    call_signature::value_leaf v{arg, {std::uint64_t(leaf::value)}, kind, text};
    if constexpr (is_string_like<U>) {
      std::string_view s = string_text(x);
      v.key.push_back(s.size());
      for (std::size_t i = 0; i < s.size(); i += 8) {
        std::uint64_t w = 0;
        std::memcpy(&w, s.data() + i, std::min<std::size_t>(8, s.size() - i));
        v.key.push_back(w);
      }
    } else {
      v.key.push_back(type_code<U>());
      std::uint64_t bits = 0;
      std::memcpy(&bits, &x, sizeof(U));
      v.key.push_back(bits);
    }
    sig.key.insert(sig.key.end(), v.key.begin(), v.key.end());
    sig.values.push_back(std::move(v));
  } else if constexpr (is_sequence<U>) {
    sig.key.push_back(std::uint64_t(leaf::sequence));
    sig.key.push_back(sequence_size(x));
    for_each_element(x, [&](const auto& e) { flatten(e, sig, arg); });
  } else if constexpr (std::is_pointer_v<U>) {
    sig.key.push_back(std::uint64_t(leaf::address));
    sig.key.push_back(std::uint64_t(reinterpret_cast<std::uintptr_t>(x)));
  } else if constexpr (requires { { x.identity() } -> std::same_as<const void*>; }) {
    // A handle (kiln::variable): every copy of it stands for the same object.
    sig.key.push_back(std::uint64_t(leaf::address));
    sig.key.push_back(std::uint64_t(reinterpret_cast<std::uintptr_t>(x.identity())));
  } else {
    sig.key.push_back(std::uint64_t(leaf::address));
    sig.key.push_back(std::uint64_t(reinterpret_cast<std::uintptr_t>(std::addressof(x))));
  }
}

/// How a trace's signature shows its arguments (trace_signature): per argument, the
/// text of its bound C++ value and the structure of its tensors; per tensor, its text
/// when it is not shown as a tensor. Written once per trace, never per call.
struct argument_texts {
  std::vector<std::string> bound, structure, inputs;
};

/// Writes argument `x`'s tensors to `s` in flatten()'s order (elements without a
/// tensor as their values), and each tensor's text to `inputs`: a handle argument's
/// `signature_text()` (`DatasetSpec(...)`), else empty.
template <class T>
void describe_tensors(const T& x, structure_text& s, std::vector<std::string>& inputs) {
  using U = std::remove_cvref_t<T>;
  if constexpr (std::is_same_v<U, tensor> || std::is_same_v<U, tensor_spec> || handle_argument<U>) {
    s.leaf();
    if constexpr (requires { { x.signature_text() } -> std::convertible_to<std::string>; }) inputs.push_back(x.signature_text());
    else inputs.emplace_back();
  } else if constexpr (is_sequence<U> && !is_object_reference<U>::value) {
    constexpr bool list = is_vector<U>::value || is_std_array<U>::value;
    s.open(list);
    std::size_t count = 0;
    for_each_element(x, [&](const auto& e) {
      if (count++) s.next();
      describe_tensors(e, s, inputs);
    });
    s.close(list, count);
  } else {
    s.text += bound_text_of(x);
  }
}

/// The texts of a trace's arguments.
template <class... Args>
argument_texts texts_of(const Args&... args) {
  argument_texts t;
  (
      [&](const auto& a) {
        t.bound.push_back(bound_text_of(a));
        structure_text s;
        describe_tensors(a, s, t.inputs);
        // One tensor (or none) is shown as itself; only a structure is written out.
        t.structure.push_back(s.leaves > 0 && s.text != "<1>" ? std::move(s.text) : std::string());
      }(args),
      ...);
  return t;
}

/// Replaces every tensor leaf of `x`, in flattening order, with the next of `next`.
template <class T>
void replace_tensors(T& x, const tensor*& next) {
  if constexpr (std::is_same_v<T, tensor>) {
    x = *next++;
  } else if constexpr (handle_argument<T>) {
    x = x.with_handle(*next++);
  } else if constexpr (is_sequence<T>) {
    for_each_element(x, [&](auto& e) { replace_tensors(e, next); });
  }
}

/// The argument the callable receives while tracing: `a` with its tensors replaced
/// by placeholders (a tensor_spec becomes a tensor); an object keyed by address (or
/// an object_reference) is passed through as itself.
template <class A>
decltype(auto) traced_argument(A&& a, const tensor*& next) {
  using U = std::remove_cvref_t<A>;
  if constexpr (is_object_reference<U>::value) {
    return (a.object);
  } else if constexpr (std::is_same_v<U, tensor> || std::is_same_v<U, tensor_spec>) {
    return tensor(*next++);
  } else if constexpr (handle_argument<U>) {
    return a.with_handle(*next++);
  } else if constexpr (is_char_array<U>::value) {
    return std::forward<A>(a);
  } else if constexpr (is_value_leaf<U> || std::is_pointer_v<U>) {
    return U(a);
  } else if constexpr (is_sequence<U>) {
    U copy(a);
    replace_tensors(copy, next);
    return copy;
  } else {
    return std::forward<A>(a);
  }
}

}  // namespace kiln::detail

namespace kiln::detail {
/// Whether `F` can be called with the arguments a trace of `Args` passes.
template <class F, class... Args>
concept takes_traced_arguments =
    std::is_invocable_v<F&, decltype(traced_argument(std::declval<Args>(), std::declval<const tensor*&>()))...>;

/// Whether `F` takes some of `Args` only as the caller's objects by reference: then
/// those are passed as object_references (keyed by address) instead of flattened copies.
template <class F, class... Args>
concept takes_objects_by_reference =
    !takes_traced_arguments<F, Args...> &&
    takes_traced_arguments<F, decltype(reference_if_object(std::declval<Args>()))...>;
}  // namespace kiln::detail
