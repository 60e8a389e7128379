#pragma once
/// \file
/// Typed traces: how kiln::function runs a callable called with `fixed` arguments.
///
/// The callable runs once per signature *type* (and per value of its C++ arguments)
/// with `symbol`s, symbolic values whose types carry the element type and dims. Ops
/// on them build expression types (kiln/typed/expr.hpp), so what the callable returns
/// is its typed graph. Whatever needs a value in the middle (a symbol assigned an
/// expression, `y = y * 2.f`) ends a fused expression: the trace records a step,
/// one fused loop compiled from the expression's type, that writes a slot of the
/// trace's frame. A call runs the steps in order, then the returned expression,
/// straight into the result: a callable that is one expression is one inlined loop.
///
/// Each signature type has a slot in its function's trace table, found by an index
/// fixed when the program starts, so a later call costs one atomic load, not a lookup.

#include <algorithm>
#include <array>
#include <atomic>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <ostream>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/core/results.hpp"
#include "kiln/core/spec.hpp"
#include "kiln/typed/ops.hpp"

namespace kiln {
namespace detail {
template <class>
struct basic_function_state;
using function_state = basic_function_state<void>;
}  // namespace detail
namespace typed {

template <class>
class basic_graph_writer;
using graph_writer = basic_graph_writer<void>;

/// A recorded step: `run(data, frame)` writes one slot of the frame; `describe(data,
/// sink)` adds the step to a graph. It owns its data through a plain deleter, not a
/// shared_ptr, whose control block would be compiled once per step type.
struct step {
  void (*run)(const void* data, frame f);
  std::unique_ptr<const void, void (*)(const void*)> data;
  void (*describe)(const void* data, description_sink& sink);
};

/// The step that runs `data` with `Step::run`.
template <class Step>
step step_of(std::unique_ptr<Step> data) {
  using S = std::remove_const_t<Step>;
  return {&S::run, {data.release(), [](const void* p) { delete static_cast<const S*>(p); }}, &S::describe};
}

/// The nodes of slots `slots` in `sink`, read as values of the `fixed` types `V...`.
template <class... V>
std::array<int, sizeof...(V)> slot_values(description_sink& sink, const std::array<int, sizeof...(V)>& slots) {
  std::size_t k = 0;
  return {sink.value(slots[k++], V::dims_type::values)...};  // braces: in order
}

/// A slot that reads a value in place (a fixed_variable's), to be given a copy of it
/// before something overwrites it: while slot `bound` points at `storage`, the value
/// is copied to slot `copy` and `bound` pointed there.
struct redirect {
  int bound, copy;
  const void* storage;
  std::size_t bytes;
};

/// Keeps the values that the slots of `redirects` read in place, before a step
/// overwrites them. A frame is built writable (trace::run): a read in place is a step
/// that points its slot at the value, so the frame's pointers change as steps run.
KILN_LIBRARY_INLINE void keep_values_read_in_place(const std::vector<redirect>& redirects, frame f);

/// What a trace being recorded collects: the slots of its frame (its arguments
/// first) and its steps, in program order.
struct recorder {
  std::vector<std::size_t> slot_bytes;
  std::vector<step> steps;
  std::vector<std::string> argument_names;  ///< as the function's signature names them
  /// Where steps go: the trace's own list, or a branch's or loop body's while it is
  /// traced.
  std::vector<step>* target = &steps;
  /// The reads in place recorded so far (of the variable whose state is at `owner`),
  /// which a later write must not change under the steps that use them.
  struct read_in_place {
    const void* owner;
    int slot;
    const void* storage;
    std::size_t bytes;
    bool top_level;  ///< in the trace's own steps, which run once per call
  };
  std::vector<read_in_place> reads_in_place;

  KILN_LIBRARY_INLINE int add_slot(std::size_t bytes);
  KILN_LIBRARY_INLINE void push(step s);
  /// Records that slot `slot` reads the `bytes` at `storage` in place (the value of
  /// the variable whose state is at `owner`).
  KILN_LIBRARY_INLINE void add_read_in_place(const void* owner, int slot, const void* storage, std::size_t bytes);
  /// The redirects a step that overwrites the value of the variable at `owner` (of
  /// any variable, when null) runs first, with a slot each for the copies. A read of
  /// the trace's own steps that a write of its own steps protects needs no later
  /// protection: it does not run again in the call.
  KILN_LIBRARY_INLINE std::vector<redirect> protect_reads_in_place(const void* owner);
  /// The recorder of the trace in progress on this thread, if any.
  KILN_LIBRARY_INLINE static recorder*& current();
};

/// A step that evaluates expressions of type `E` into slots, one after the other: an
/// evaluation chain. A rebinding loop (`for (...) y = y * 0.5f + x;`) assigns
/// expressions of one type in a row; their steps join the chain of the one before, so
/// that a call runs them as one loop, each value going from one assignment to the next
/// in a register (evaluate_chain), rather than one step and one pass over memory per
/// assignment.
template <class E>
struct evaluation {
  std::vector<chain_link<E>> links;
  static void run(const void* data, frame f) {
    const auto& self = *static_cast<const evaluation*>(data);
    if (self.links.size() == 1)
      evaluate(self.links[0].expression, f, static_cast<typename E::value_type*>(f[self.links[0].out]));
    else
      evaluate_chain<E>(self.links, f);
  }
  static void describe(const void* data, description_sink& sink) {
    for (const chain_link<E>& l : static_cast<const evaluation*>(data)->links) sink.bind(l.out, l.expression.describe(sink));
  }
  /// Whether `e`, written to `out`, may join the chain: `out` is no slot the chain
  /// writes or reads, and `e` reads none the chain writes through a broadcast (which
  /// reads other positions than the one being computed).
  bool takes(const E& e, int out) const {
    bool fits = true;
    for (const chain_link<E>& l : links) {
      if (l.out == out) return false;
      l.expression.visit_slots([&](int slot, bool) { fits = fits && slot != out; }, false);
      e.visit_slots([&](int slot, bool broadcast) { fits = fits && !(broadcast && slot == l.out); }, false);
    }
    return fits;
  }
};

/// The recorder of the trace in progress, or the error for a symbolic value used
/// outside its trace.
KILN_LIBRARY_INLINE recorder& current_recorder();

/// Records a step writing `e` to slot `slot`: a link added to the evaluation chain of
/// the step before when that one evaluates expressions of the same type and takes it.
template <class E>
void record_into(const E& e, int slot) {
  recorder& r = current_recorder();
  if (!r.target->empty() && r.target->back().run == &evaluation<E>::run) {
    // The chain was made here, not const: it may grow while its trace is recorded.
    auto& chain = *const_cast<evaluation<E>*>(static_cast<const evaluation<E>*>(r.target->back().data.get()));
    if (chain.takes(e, slot)) {
      chain.links.push_back({e, slot});  // the one copy of `e`
      return;
    }
  }
  auto chain = std::make_unique<evaluation<E>>();
  chain->links.push_back({e, slot});
  r.push(step_of(std::move(chain)));
}

/// The bytes of a value of typed operand type `X` (a slot's size).
template <class X>
inline constexpr std::size_t bytes_of = sizeof(typename X::value_type) * std::size_t(X::dims_type::size);

/// Records a step writing `e` to a new slot, and returns the slot.
template <class E>
int record(const E& e) {
  const int slot = current_recorder().add_slot(bytes_of<E>);
  record_into(e, slot);
  return slot;
}

/// A symbolic value of the compile-time tier: what a callable traced with a
/// `fixed<T, Dims...>` argument receives, and what an expression becomes when it is
/// assigned (`decltype(x) y = x * 2.f;`, `y = y * y;`): a slot of the trace's frame.
/// \code kiln::function f([](auto x) { auto y = x; for (int i = 0; i < 3; ++i) y = y * x; return y; }); \endcode
template <class T, class D>
class symbol : public typed_expression {
 public:
  using value_type = T;
  using dims_type = D;
  static constexpr bool simd = simd_type<T>;

  /// The value in slot `slot` of the frame (an argument).
  explicit symbol(int slot) : slot_(slot) {}
  /// The value of expression `e`, computed at this point of the trace.
  template <lazy E>
    requires(!std::is_same_v<std::remove_cvref_t<E>, symbol>)
  symbol(const E& e) : slot_(record(checked(expression_of<T, false>(e)))) {}
  /// A constant.
  symbol(const fixed_t<T, D>& value) : symbol(constant_leaf<T, D>{{}, std::make_shared<const fixed_t<T, D>>(value)}) {}

  symbol(const symbol&) = default;
  symbol& operator=(const symbol&) = default;
  /// Rebinds to the value of `e`: `y = y * 2.f;`.
  template <class E>
    requires(lazy<E> || fixed_value<E>)
  symbol& operator=(const E& e) {
    return *this = symbol(e);
  }

  slot_leaf<T, D> expression() const { return {{}, slot_}; }
  int slot() const { return slot_; }

  /// As TensorFlow prints a tensor while tracing: `Tensor("a:0", shape=(3,),
  /// dtype=int32)`, named after its argument (or its slot, for a step's result).
  friend std::ostream& operator<<(std::ostream& os, const symbol& x) {
    const recorder* r = recorder::current();
    const std::string name = r && std::size_t(x.slot_) < r->argument_names.size() ? r->argument_names[std::size_t(x.slot_)]
                                                                                   : "value_" + std::to_string(x.slot_);
    return os << "Tensor(\"" << name << ":0\", shape=" << D::shape() << ", dtype=" << dtype_of<T> << ")";
  }

 private:
  template <class E>
  static const E& checked(const E& e) {
    static_assert(std::is_same_v<typename E::value_type, T> && std::is_same_v<typename E::dims_type, D>,
                  "kiln: a symbolic value keeps its element type and dims; assign it an expression of the same type "
                  "(kiln::cast or kiln::reshape change them)");
    return e;
  }

  int slot_;
};

template <class V>
struct is_symbol : std::false_type {};
template <class T, class D>
struct is_symbol<symbol<T, D>> : std::true_type {};

/// The symbol a traced `fixed` argument becomes.
template <class X>
using symbol_for = symbol<typename X::value_type, typename X::dims_type>;

// ---- signatures --------------------------------------------------------------------

/// C++ values a typed call keys by value: arithmetic values, enums and strings.
template <class X>
concept key_value = std::is_arithmetic_v<std::remove_cvref_t<X>> || std::is_enum_v<std::remove_cvref_t<X>> ||
                    std::is_same_v<std::remove_cvref_t<X>, std::string>;

template <class X>
struct is_spec : std::false_type {};
template <class T, std::int64_t... D>
struct is_spec<spec<T, D...>> : std::true_type {};

/// A `fixed` value, or its `spec` (for get_concrete_function).
template <class X>
concept typed_argument = fixed_value<X> || is_spec<std::remove_cvref_t<X>>::value;

/// Whether a call with `Args` runs in the compile-time tier: at least one `fixed`
/// argument, and otherwise only C++ values.
template <class... Args>
inline constexpr bool typed_call = (fixed_value<Args> || ...) && ((fixed_value<Args> || key_value<Args>) && ...);

/// Whether get_concrete_function with `Args` asks for a typed trace: `fixed` values or
/// specs, and otherwise only C++ values.
template <class... Args>
inline constexpr bool typed_request = (typed_argument<Args> || ...) && ((typed_argument<Args> || key_value<Args>) && ...);

/// The `fixed` type of a typed argument.
template <class X>
struct fixed_of {
  using type = std::remove_cvref_t<X>;
};
template <class T, std::int64_t... D>
struct fixed_of<spec<T, D...>> {
  using type = fixed<T, D...>;
};

/// What the callable receives for argument `X` while tracing.
template <class X>
struct traced {
  using type = std::remove_cvref_t<X>;
};
template <typed_argument X>
struct traced<X> {
  using type = symbol_for<typename fixed_of<std::remove_cvref_t<X>>::type>;
};
template <class X>
using traced_t = typename traced<X>::type;

/// The C++ values of a call, its key within the slot of its signature type.
template <class... Args>
using values_of = decltype(std::tuple_cat(std::declval<std::conditional_t<typed_argument<Args>, std::tuple<>, std::tuple<std::remove_cvref_t<Args>>>>()...));

template <class... Args>
values_of<Args...> values(const Args&... args) {
  return std::tuple_cat([](const auto& a) {
    if constexpr (typed_argument<decltype(a)>)
      return std::tuple<>();
    else
      return std::tuple<std::remove_cvref_t<decltype(a)>>(a);
  }(args)...);
}

// ---- signatures' text --------------------------------------------------------------

/// A value in a typed trace's signature: a typed argument's or result's dtype and
/// shape, or a C++ value (bound in the header: `power(a, b=3)`).
struct signature_leaf {
  bool typed = true;
  dtype type = int64;
  kiln::shape shape = {};
};

/// What a typed trace's signature type says, made at compile time, one per type: a
/// trace records where it is, and the text is written only where a program shows it.
struct signature_type {
  std::span<const signature_leaf> arguments;  ///< one per argument
  std::span<const signature_leaf> outputs;    ///< none for `void`
  /// Writes the outputs' structure (`(<1>, <2>)`), empty for one output or none.
  std::string (*output_structure)();
};

/// A typed trace's signature: its type, and the text of its C++ values (per argument;
/// empty when it has none).
struct recorded_signature {
  const signature_type* type = nullptr;
  std::vector<std::string> bound_text;
};

// An argument's leaf, or a result's.
template <class X>
constexpr signature_leaf argument_leaf() {
  using V = std::remove_cvref_t<X>;
  if constexpr (typed_argument<V>) {
    using F = typename fixed_of<V>::type;
    return {true, dtype_of<typename F::value_type>, F::dims_type::shape()};
  } else {
    return {false};
  }
}
template <class X>
constexpr signature_leaf result_leaf() {
  using V = std::remove_cvref_t<X>;
  if constexpr (lazy<V> || fixed_value<V>)
    return {true, dtype_of<typename V::value_type>, V::dims_type::shape()};
  else if constexpr (has_dtype<V>)
    return {true, dtype_of<V>};
  else
    return {true, int64};  // as the runtime tier returns a C++ value it cannot name
}

// Writes the leaves of a traced result `R` from `next`, unless it is null, in order
// (none for `void`, a tuple's in turn), and says how many there are.
template <class R>
constexpr std::size_t put_outputs(signature_leaf* next) {
  using V = std::remove_cvref_t<R>;
  if constexpr (std::is_void_v<V>) {
    return 0;
  } else if constexpr (!lazy<V> && !fixed_value<V> && requires { std::tuple_size<V>::value; }) {
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      std::size_t n = 0;
      ((n += put_outputs<std::tuple_element_t<I, V>>(next ? next + n : nullptr)), ...);
      return n;
    }(std::make_index_sequence<std::tuple_size_v<V>>());
  } else {
    if (next) *next = result_leaf<V>();
    return 1;
  }
}
// Writes the structure of the leaves put_outputs finds in `R` (a std::array as a list).
template <class R>
void describe_outputs(detail::structure_text& s) {
  using V = std::remove_cvref_t<R>;
  if constexpr (!lazy<V> && !fixed_value<V> && requires { std::tuple_size<V>::value; }) {
    constexpr std::size_t n = std::tuple_size_v<V>;
    constexpr bool list = requires { typename V::iterator; };  // std::array
    s.open(list);
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      ((I > 0 ? s.next() : void(), describe_outputs<std::tuple_element_t<I, V>>(s)), ...);
    }(std::make_index_sequence<n>());
    s.close(list, n);
  } else if constexpr (!std::is_void_v<V>) {
    s.leaf();
  }
}
template <class R>
std::string output_structure() {
  detail::structure_text s;
  describe_outputs<R>(s);
  return s.leaves == 1 && s.text == "<1>" ? std::string() : s.text;
}

template <class R>
inline constexpr auto output_leaves = [] {
  std::array<signature_leaf, put_outputs<R>(nullptr)> leaves{};
  put_outputs<R>(leaves.data());
  return leaves;
}();
template <class... Args>
inline constexpr std::array<signature_leaf, sizeof...(Args)> argument_leaves{argument_leaf<Args>()...};

/// The signature type of a typed trace of `Args` that returns `R`.
template <class R, class... Args>
inline constexpr signature_type signature_type_of{argument_leaves<Args...>, output_leaves<R>, &output_structure<R>};

/// Typed trace signature `s` of the function whose state is `state`, written out
/// (defined with the typed tier's calls, kiln/typed/function_calls.hpp).
template <class = void>
detail::trace_signature written(const detail::function_state& state, const recorded_signature& s);

// ---- results -----------------------------------------------------------------------

/// A leaf of what a call returns for the traced result: a `fixed` value for an
/// expression; C++ values and `fixed` constants come back as they are. Tuples and pairs
/// keep their structure (detail::output_of).
template <class R>
struct output_leaf {
  using type = R;
};
template <lazy R>
struct output_leaf<R> {
  using type = fixed_t<typename R::value_type, typename R::dims_type>;
};
template <class R>
using output_t = typename detail::output_of<output_leaf, std::remove_cvref_t<R>>::type;

template <class R>
output_t<R> evaluate_output(const R& r, frame f) {
  if constexpr (lazy<R>) {
    if constexpr (requires { r.expression(); })
      return materialize(r.expression(), f);
    else
      return materialize(r, f);  // in place: an expression can be large
  } else if constexpr (requires { std::tuple_size<R>::value; } && !std::is_array_v<R>) {
    return std::apply([&](const auto&... e) { return output_t<R>(evaluate_output(e, f)...); }, r);
  } else {
    return r;
  }
}

/// Calls `fn` with `recorder` current; restores the previous one (a typed trace may
/// run inside another).
template <class Fn>
decltype(auto) with_recorder(recorder& r, Fn&& fn) {
  struct restore {
    recorder* previous;
    ~restore() { recorder::current() = previous; }
  } guard{std::exchange(recorder::current(), &r)};
  return fn();
}

/// One typed trace: its steps, the size of its frame, and the expression(s) it
/// returns (`R`; none for `void`).
template <class R>
struct trace {
  using stored = std::conditional_t<std::is_void_v<R>, std::tuple<>, R>;
  std::vector<step> steps;
  std::vector<std::size_t> offsets;  ///< each non-argument slot's place in the workspace
  int arguments = 0;
  std::size_t workspace_bytes = 0;
  std::optional<stored> result;
  recorded_signature signature;
  std::vector<std::string> argument_names;  ///< of its typed arguments, for graph()

  /// Runs the trace on the data of its arguments.
  template <std::size_t N>
  output_t<stored> run(const std::array<void*, N>& args) const {
    const std::size_t slots = std::size_t(arguments) + offsets.size();
    // One expression: no frame to build. Steps run even when they add no slot (a print
    // of an argument).
    if (steps.empty()) return evaluate_output(*result, args.data());
    constexpr std::size_t local_slots = 64, local_bytes = 4096;
    std::array<void*, local_slots> local_frame;
    std::unique_ptr<void*[]> heap_frame;
    void** f = local_frame.data();
    if (slots > local_slots) f = (heap_frame.reset(new void*[slots]), heap_frame.get());
    alignas(64) std::byte local[local_bytes];
    // From the C library, which keeps a freed block for the next call too, not the
    // caching allocator: a program that makes no large `fixed` value then does not
    // compile the cache.
    struct heap_workspace {
      std::size_t bytes;
      void* p = bytes ? ::operator new(bytes, std::align_val_t(buffer_alignment)) : nullptr;
      ~heap_workspace() {
        if (p) ::operator delete(p, std::align_val_t(buffer_alignment));
      }
    } heap{workspace_bytes > local_bytes ? workspace_bytes : 0};
    std::byte* workspace = heap.p ? static_cast<std::byte*>(heap.p) : local;
    std::copy(args.begin(), args.end(), f);
    for (std::size_t i = 0; i < offsets.size(); ++i) f[std::size_t(arguments) + i] = workspace + offsets[i];
    for (const step& s : steps) s.run(s.data.get(), f);
    return evaluate_output(*result, f);
  }
};

/// Traces `fn` for `args` (fixed values or specs, and C++ values); `names` names the
/// typed arguments, in order, for printing.
template <class R, class F, class... Args>
std::unique_ptr<trace<R>> trace_now(F& fn, std::vector<std::string> names, const Args&... args) {
  recorder rec;
  rec.argument_names = std::move(names);
  int slot = 0;
  auto arg = [&](const auto& a) -> traced_t<decltype(a)> {
    if constexpr (typed_argument<decltype(a)>) {
      rec.add_slot(0);  // arguments live in the caller's values
      return traced_t<decltype(a)>(slot++);
    } else {
      return a;
    }
  };
  // Braces: the arguments take their slots from left to right.
  std::tuple<traced_t<Args>...> traced_args{arg(args)...};
  auto t = std::make_unique<trace<R>>();
  if constexpr (std::is_void_v<R>) {
    with_recorder(rec, [&] { std::apply(fn, traced_args); });
    t->result.emplace();
  } else {
    t->result.emplace(with_recorder(rec, [&]() -> R { return std::apply(fn, traced_args); }));
  }
  t->arguments = slot;
  for (std::size_t i = std::size_t(slot); i < rec.slot_bytes.size(); ++i) {
    t->offsets.push_back(t->workspace_bytes);
    t->workspace_bytes += (rec.slot_bytes[i] + 63) / 64 * 64;
  }
  t->steps = std::move(rec.steps);
  t->argument_names = std::move(rec.argument_names);
  return t;
}

/// A typed trace as a concrete function: called with the `fixed` values its signature
/// takes (its C++ values are bound), printed as `ConcreteFunction` and its signature.
/// \code
/// kiln::function f([](const auto& x) { return x + x; });
/// auto c = f.get_concrete_function(kiln::spec<float, 3>{});
/// kiln::fixed<float, 3> y = c(kiln::fixed<float, 3>::ones());
/// \endcode
template <class R, class... Fixed>
class concrete_function {
 public:
  concrete_function(const trace<R>* t, std::shared_ptr<const detail::function_state> owner)
      : trace_(t), owner_(std::move(owner)) {}
  auto operator()(const Fixed&... args) const {
    return trace_->run(std::array<void*, sizeof...(Fixed)>{const_cast<void*>(static_cast<const void*>(args.data()))...});
  }
  friend std::ostream& operator<<(std::ostream& os, const concrete_function& c) {
    return os << "ConcreteFunction " << written(*c.owner_, c.trace_->signature).signature_text();
  }
  /// The signature in TensorFlow's format, without a newline at the end, as
  /// TensorFlow's `pretty_printed_signature()`.
  /// \code
  /// kiln::function f([](const auto& x) { return x + x; });
  /// std::cout << f.get_concrete_function(kiln::spec<float, 3>{}).pretty_printed_signature();
  /// \endcode
  std::string pretty_printed_signature() const {
    std::string text = written(*owner_, trace_->signature).signature_text();
    text.pop_back();
    return text;
  }
  /// The trace as a kiln::graph, as the runtime tier traces it from the same callable:
  /// placeholders, ops, `cond` and `while` nodes with their branches and bodies,
  /// effects, and an Identity per output. It needs the runtime tier (kiln/kiln.hpp).
  /// \code
  /// kiln::function f([](const auto& x) { return x + x; });
  /// const kiln::graph g = f.get_concrete_function(kiln::spec<float, 3>{}).graph();  // a value
  /// for (const auto& n : g.nodes()) std::cout << n.op() << "\n";  // Placeholder, add, Identity
  /// \endcode
  template <class Writer = graph_writer>
  auto graph() const {
    if constexpr (requires { sizeof(Writer); })
      return Writer::template graph_of<Fixed...>(*trace_);
    else
      static_assert(always_false<Writer>, "kiln: graph() of a typed trace needs the runtime tier; include <kiln/kiln.hpp>");
  }
  /// graph() in Graphviz's dot language.
  template <class Writer = graph_writer>
  std::string to_dot() const {
    return graph<Writer>().to_dot();
  }

 private:
  const trace<R>* trace_;
  std::shared_ptr<const detail::function_state> owner_;  // the function's traces and options
};

/// The typed::concrete_function of a request with `Args`: its `fixed` argument types.
template <class R, class... Args>
struct concrete_for {
  template <class... F>
  static concrete_function<R, F...> make(std::tuple<F...>*);
  using fixed_arguments = decltype(std::tuple_cat(
      std::declval<std::conditional_t<typed_argument<Args>, std::tuple<typename fixed_of<std::remove_cvref_t<Args>>::type>,
                                       std::tuple<>>>()...));
  using type = decltype(make(static_cast<fixed_arguments*>(nullptr)));
};

// ---- the table of a function's traces ----------------------------------------------

/// A process-wide index per signature type, fixed when the program starts.
KILN_LIBRARY_INLINE std::size_t next_signature_index();
template <class Signature>
inline const std::size_t signature_index = next_signature_index();

/// The traces of one signature type, by the values of its C++ arguments.
template <class R, class Values>
struct signature_traces {
  std::mutex mutex;  // guards by_value
  std::atomic<const trace<R>*> only{nullptr};  // the trace of a signature without C++ values
  std::vector<std::pair<Values, std::unique_ptr<trace<R>>>> by_value;
  std::unique_ptr<trace<R>> only_owner;
};

/// A function's typed traces: one slot per signature type, found by its index.
class trace_table {
 public:
  /// The traces of signature type `Sig`, made on first use.
  template <class Sig, class Entry>
  Entry& entry() {
    const std::size_t i = signature_index<Sig>;
    if (i < direct) {
      if (void* e = direct_[i].load(std::memory_order_acquire)) return *static_cast<Entry*>(e);
    }
    std::lock_guard lock(mutex_);
    for (auto& [index, e] : entries_)
      if (index == i) return *static_cast<Entry*>(e.get());
    entries_.emplace_back(i, owned_entry(new Entry, [](void* e) { delete static_cast<Entry*>(e); }));
    void* e = entries_.back().second.get();
    if (i < direct) direct_[i].store(e, std::memory_order_release);
    return *static_cast<Entry*>(e);
  }

  /// One typed trace at a time (a trace of one function may call another).
  std::recursive_mutex tracing;

 private:
  static constexpr std::size_t direct = 32;
  std::array<std::atomic<void*>, direct> direct_{};
  mutable std::mutex mutex_;
  using owned_entry = std::unique_ptr<void, void (*)(void*)>;
  std::vector<std::pair<std::size_t, owned_entry>> entries_;
};

}  // namespace typed
}  // namespace kiln

#if KILN_DEFINE_LIBRARY
namespace kiln::typed {

KILN_LIBRARY_INLINE void keep_values_read_in_place(const std::vector<redirect>& redirects, frame f) {
  void** slots = const_cast<void**>(f);
  for (const redirect& r : redirects)
    if (slots[r.bound] == r.storage) {
      std::memcpy(slots[r.copy], r.storage, r.bytes);
      slots[r.bound] = slots[r.copy];
    }
}

KILN_LIBRARY_INLINE int recorder::add_slot(std::size_t bytes) {
  slot_bytes.push_back(bytes);
  return int(slot_bytes.size()) - 1;
}

KILN_LIBRARY_INLINE void recorder::push(step s) { target->push_back(std::move(s)); }

KILN_LIBRARY_INLINE void recorder::add_read_in_place(const void* owner, int slot, const void* storage,
                                                     std::size_t bytes) {
  reads_in_place.push_back({owner, slot, storage, bytes, target == &steps});
}

KILN_LIBRARY_INLINE std::vector<redirect> recorder::protect_reads_in_place(const void* owner) {
  std::vector<redirect> out;
  const bool top = target == &steps;
  std::erase_if(reads_in_place, [&](const read_in_place& r) {
    if (owner && r.owner != owner) return false;
    out.push_back({r.slot, add_slot(r.bytes), r.storage, r.bytes});
    return top && r.top_level;
  });
  return out;
}

KILN_LIBRARY_INLINE recorder*& recorder::current() {
  thread_local recorder* r = nullptr;
  return r;
}

KILN_LIBRARY_INLINE recorder& current_recorder() {
  recorder* r = recorder::current();
  if (!r)
    throw type_error(
        "kiln: a symbolic typed value was used outside the trace that made it; return it from the function instead");
  return *r;
}

KILN_LIBRARY_INLINE std::size_t next_signature_index() {
  static std::atomic<std::size_t> next{0};
  return next++;
}

}  // namespace kiln::typed
#endif  // KILN_DEFINE_LIBRARY
