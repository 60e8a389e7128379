#pragma once
/// \file
/// Random numbers (`random::uniform` and its kin), stateful as TensorFlow's:
/// every draw, eager or in a graph, gives new numbers, and the sequence of draws is
/// reproducible from seeds. Eagerly a draw fills a tensor at once; while tracing it
/// records a special op that draws again at every run of the graph, instead of a
/// constant drawn once at trace time. `random::generator` is tf.random.Generator;
/// `random::stateless_uniform` is the pure function of a seed.

#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/graph/graph.hpp"
#include "kiln/ops/factories.hpp"
#include "kiln/trace/trace_context.hpp"

namespace kiln {
namespace detail {

/// splitmix64's finalizer: a bijection of 64-bit words in which every input bit
/// reaches every output bit (how seeds are spread into keys).
constexpr std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9u;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBu;
  return z ^ (z >> 31);
}

/// The next number of splitmix64, a 64-bit generator whose state is `state`, and
/// which the call advances: where kiln needs a stream of numbers, not a distribution
/// (shuffling a dataset's buffer, spreading seeds).
constexpr std::uint64_t splitmix64(std::uint64_t& state) { return mix64(state += 0x9E3779B97F4A7C15u); }

/// A seed for an unseeded random call: distinct per call and per process run. A run
/// is told apart by the clocks at the first call and by where the address space put
/// this function's counter (randomized per run), not by std::random_device: <random>
/// costs every file that includes kiln a tenth of a second to parse.
KILN_LIBRARY_INLINE std::uint64_t fresh_seed();

/// The distributions a draw takes numbers from.
enum class distribution {
  uniform,           ///< [minval, maxval)
  normal,            ///< mean minval, standard deviation maxval
  truncated_normal,  ///< as normal, drawn again beyond two standard deviations
};

/// Fills `out[0, n)` with normal numbers of mean `mean` and standard deviation
/// `stddev` from Philox keyed by `seed` (Box-Muller on two uniform numbers); with
/// `truncated`, a number beyond two standard deviations is drawn again, as
/// tf.random.truncated_normal does. Element i reads Philox blocks (i, attempt) of
/// stream `stream` only, so it depends on the seed, the stream and its index alone,
/// whatever the thread count; a key apart from uniform draws' keeps the two unrelated.
template <class T>
void normal_fill(T* out, std::int64_t n, std::uint64_t seed, std::uint64_t stream, double mean, double stddev,
                 bool truncated) {
  const std::uint64_t mixed = seed ^ 0x6A09E667F3BCC908u;
  const std::array<std::uint32_t, 2> key{std::uint32_t(mixed), std::uint32_t(mixed >> 32)};
  ranges_for<false>(n, uniform_fill_grain, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) {
      double z = 0;
      // Elements are fewer than 2^48, so the attempt in the counter's second word's
      // upper half never meets another element's index.
      for (std::uint32_t attempt = 0;; ++attempt) {
        const auto w = philox4x32_10({std::uint32_t(i), std::uint32_t(std::uint64_t(i) >> 32) + (attempt << 16),
                                      std::uint32_t(stream), std::uint32_t(stream >> 32)},
                                     key);
        // u1 in (0, 1], so its logarithm is finite; u2 in [0, 1); 53 bits each.
        const double u1 = double((std::uint64_t(w[0]) << 21 | w[1] >> 11) + 1) * 0x1p-53;
        const double u2 = double(std::uint64_t(w[2]) << 21 | w[3] >> 11) * 0x1p-53;
        z = std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
        if (!truncated || std::fabs(z) <= 2.0 || attempt == 0xFFFF) break;
      }
      out[i] = T(mean + stddev * z);
    }
  });
}

/// What one random draw makes: a checked shape, dtype, distribution and its
/// parameters (for a normal one, minval is the mean and maxval the standard deviation).
struct uniform_spec {
  shape dims;
  dtype type;
  double minval;
  std::optional<double> maxval;
  distribution kind = distribution::uniform;

  /// The function that draws this way, as errors name it.
  KILN_LIBRARY_INLINE std::string_view what() const;

  /// The contract's errors for a dtype, shape or bounds a draw cannot take. (A
  /// template, as `draw` is, so that the bounds' checks compile only in programs that draw.)
  template <class = void>
  void check() const {
    if (kind != distribution::uniform) {
      if (!is_floating(type))
        throw type_error(std::string(what()) + ": dtype must be float32 or float64, got " + std::string(name(type)));
      require_fully_defined(what(), dims);
      const double stddev = maxval.value_or(1);
      if (!std::isfinite(minval) || !std::isfinite(stddev) || stddev < 0)
        throw invalid_argument_error(std::string(what()) + ": the mean must be finite and the standard deviation finite "
                                     "and not negative, got mean " + describe_value(minval) + " and stddev " +
                                     describe_value(stddev));
      return;
    }
    if (!is_floating(type) && !is_integer(type))
      throw type_error("random::uniform: dtype must be int32, int64, float32 or float64, got " + std::string(name(type)));
    if (is_integer(type) && !maxval)
      throw invalid_argument_error("random::uniform: an integer dtype (" + std::string(name(type)) +
                                   ") needs an explicit maxval");
    require_fully_defined("random::uniform", dims);
    visit_dtype(type, [&]<class T>() { (void)bounds<T>(); });
  }

  /// A fresh tensor of numbers drawn from stream `stream` of Philox keyed by `key`.
  /// (This and every function that draws is a template, as op functions are, so that
  /// the fill kernels compile only in programs that draw.)
  template <class = void>
  tensor draw(std::uint64_t key, std::uint64_t stream) const {
    tensor out(type, dims);
    visit_dtype(type, [&]<class T>() {
      if constexpr (std::is_floating_point_v<T>) {
        if (kind != distribution::uniform) {
          normal_fill(out.view().as<T>(), out.size(), key, stream, minval, maxval.value_or(1),
                      kind == distribution::truncated_normal);
          return;
        }
      }
      if constexpr ((std::is_integral_v<T> && !std::is_same_v<T, bool>) || std::is_floating_point_v<T>) {
        auto [lo, hi] = bounds<T>();
        uniform_fill(out.view().as<T>(), out.size(), key, stream, lo, hi);
      }
    });
    return out;
  }

 private:
  template <class T>
  std::pair<T, T> bounds() const {
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
      T lo = integer_bound<T>(minval, "minval", type), hi = integer_bound<T>(*maxval, "maxval", type);
      if (!(lo < hi))
        throw invalid_argument_error("random::uniform: maxval " + std::to_string(hi) + " must be greater than minval " +
                                     std::to_string(lo));
      return {lo, hi};
    } else if constexpr (std::is_floating_point_v<T>) {
      T lo = T(minval), hi = T(maxval.value_or(1));
      if (!std::isfinite(lo) || !std::isfinite(hi) || !(lo < hi))
        throw invalid_argument_error("random::uniform: the bounds must be finite with minval < maxval, got minval " +
                                     describe_value(lo) + " and maxval " + describe_value(hi));
      return {lo, hi};
    } else {
      return {};
    }
  }
};

/// The graph op names of draws, as TensorFlow's: {by an op's own key, from a generator}.
KILN_LIBRARY_INLINE std::pair<std::string_view, std::string_view> random_op_names(distribution d);

/// The process's random state: the global seed (random::set_seed), the counter that
/// gives ops without a seed of their own one under a global seed, and how many draws
/// each seeded eager op has made (its next stream).
struct random_state {
  std::mutex mutex;
  std::optional<std::uint64_t> global_seed;
  std::uint64_t next_op_seed = 0;
  std::map<std::uint64_t, std::uint64_t> eager_draws;

  KILN_LIBRARY_INLINE static random_state& get();

  /// The Philox key of an op with seed `op_seed` under the global seed, TensorFlow's
  /// rules: an op seed alone keys the op; a global seed gives each op without one a
  /// seed of its own in creation order, so a program draws the same numbers at every
  /// run; with neither the key is fresh.
  KILN_LIBRARY_INLINE std::uint64_t key_for(std::optional<std::uint64_t> op_seed);
  /// The stream of the next eager draw with key `key`.
  KILN_LIBRARY_INLINE std::uint64_t next_eager_stream(std::uint64_t key);
};

/// The state of a random::generator, shared by its copies and the graphs that draw
/// from it: a key and the next stream.
struct generator_state {
  std::atomic<std::uint64_t> key;
  std::atomic<std::uint64_t> next_stream{0};
  explicit generator_state(std::uint64_t k) : key(k) {}
  KILN_LIBRARY_INLINE std::pair<std::uint64_t, std::uint64_t> take();
};

/// A random draw in a graph (`RandomUniform`): each run takes the next stream of its
/// own key, or of its generator's state. Never folded or merged, as a special op.
class random_uniform_op final : public special_op {
 public:
  template <class = void>
  random_uniform_op(uniform_spec spec, std::uint64_t key)
      : special_op(std::type_identity<random_uniform_op>()), spec_(std::move(spec)), key_(key) {}
  template <class = void>
  random_uniform_op(uniform_spec spec, std::shared_ptr<generator_state> generator)
      : special_op(std::type_identity<random_uniform_op>()), spec_(std::move(spec)), generator_(std::move(generator)) {}

  KILN_LIBRARY_INLINE std::string_view name() const;
  // A generator's draw advances state that later draws see, so it runs even when
  // its numbers are not needed, in program order; an op's own counter does not.
  bool has_effects() const { return generator_ != nullptr; }
  template <class = void>
  tensor run(std::span<const tensor* const>) const {
    auto [key, stream] = generator_ ? generator_->take() : std::pair{key_, next_stream_.fetch_add(1)};
    return spec_.draw(key, stream);
  }
  KILN_LIBRARY_INLINE std::vector<std::pair<dtype, shape>> results() const;
  /// What it draws, and from which key (its own, when it has no generator).
  const uniform_spec& spec() const { return spec_; }
  std::uint64_t key() const { return key_; }
  const std::shared_ptr<generator_state>& generator() const { return generator_; }

  KILN_LIBRARY_INLINE static std::array<std::string_view, 6> op_names();
  /// Saved as what it draws and from which key. A draw keyed by its own seed starts its
  /// sequence over in the loaded function, as a fresh trace would; a generator's draws
  /// go on from its state when saved.
  template <class Out>
  void save(Out& out) const {
    out.set_dtype("dtype", spec_.type);
    out.set_shape("shape", spec_.dims);
    out.set("minval", spec_.minval);
    if (spec_.maxval)
      out.set("maxval", *spec_.maxval);
    else
      out.set_null("maxval");
    if (generator_)
      out.set_generator("generator", generator_);
    else
      out.set("key", key_);
  }
  template <class In>
  static std::shared_ptr<const special_op> load(In& in) {
    distribution drawn = distribution::uniform;
    bool stateful = false;
    for (distribution d : {distribution::uniform, distribution::normal, distribution::truncated_normal})
      if (const auto names = random_op_names(d); in.op() == names.first || in.op() == names.second)
        drawn = d, stateful = in.op() == names.second;
    uniform_spec u{in.shape("shape"), in.dtype("dtype"), in.number("minval"), std::nullopt, drawn};
    if (!in.is_null("maxval")) u.maxval = in.number("maxval");
    try {
      u.check();
    } catch (const error& e) {
      in.fail(e.what());
    }
    in.expect_results({{u.type, u.dims}});
    if (in.input_count() != 0) in.fail(in.op() + " takes no inputs");
    if (!stateful) return std::make_shared<random_uniform_op>(std::move(u), in.unsigned_integer("key"));
    return std::make_shared<random_uniform_op>(std::move(u), in.generator("generator"));
  }
  static constexpr std::string_view onnx_refusal = "draws random numbers, which ONNX's RandomUniform cannot repeat";

 private:
  uniform_spec spec_;
  std::uint64_t key_ = 0;
  mutable std::atomic<std::uint64_t> next_stream_{0};
  std::shared_ptr<generator_state> generator_;
};

/// Records `op` in the trace in progress and returns its symbolic result.
KILN_LIBRARY_INLINE tensor record_random(std::shared_ptr<const random_uniform_op> op, trace_context& trace);

/// Stateful draws, as random::uniform makes them (`random_draws`, the one
/// specialization): a template on nothing, so that a file compiles them only where it
/// draws, and a compiled kiln compiles them with one explicit instantiation
/// (kiln/separate_compilation.hpp).
template <class Unused>
struct basic_random_draws {
  /// A stateful draw of `spec`.
  static tensor stateful_draw(uniform_spec spec, std::optional<std::uint64_t> seed);
};
using random_draws = basic_random_draws<void>;

#if KILN_DEFINE_LIBRARY
template <class Unused>
tensor basic_random_draws<Unused>::stateful_draw(uniform_spec spec, std::optional<std::uint64_t> seed) {
  spec.check();
  random_state& state = random_state::get();
  const std::uint64_t key = state.key_for(seed);
  if (trace_context* trace = trace_context::current())
    return record_random(std::make_shared<const random_uniform_op>(std::move(spec), key), *trace);
  return spec.draw(key, seed ? state.next_eager_stream(key) : 0);
}
#endif

}  // namespace detail

namespace random {

/// Sets the global seed, as tf.random.set_seed: from then on the sequence of numbers
/// that random::uniform draws, eagerly and in functions traced afterwards, is the same
/// at every run of the program. Setting it again starts the sequences over.
/// \code kiln::random::set_seed(1234); \endcode
KILN_LIBRARY_INLINE void set_seed(std::uint64_t seed);

/// Numbers drawn uniformly from [minval, maxval) (maxval defaults to 1 for floats
/// and must be given for integers). Stateful, as tf.random.uniform: every call draws
/// new numbers, and inside a kiln::function every run of the graph does. With a
/// `seed` (and random::set_seed) the sequence of draws is the same at every run of the
/// program, whatever the thread count. Bounds must be finite with minval < maxval, and
/// whole numbers within range for integer dtypes (as doubles, so int64 bounds beyond
/// 2^53 are not exact); else kiln::invalid_argument_error.
/// \code kiln::random::uniform({10, 10}, -1, 2, kiln::int32);
/// kiln::random::uniform({5}, 0, 1, kiln::float32, 42);  // the same first 5 numbers at every run \endcode
template <class Unused = void>
tensor uniform(const shape& s, double minval = 0, std::optional<double> maxval = std::nullopt, dtype t = float32,
               std::optional<std::uint64_t> seed = std::nullopt) {
  return detail::basic_random_draws<Unused>::stateful_draw({s, t, minval, maxval}, seed);
}

/// Numbers drawn from a normal distribution, as tf.random.normal: stateful, seeded and
/// drawn again at every run of a graph as random::uniform; float dtypes only.
/// \code kiln::random::normal({2, 3}, 0.0, 0.05, kiln::float32, 1);  // mean 0, stddev 0.05 \endcode
template <class Unused = void>
tensor normal(const shape& s, double mean = 0, double stddev = 1, dtype t = float32,
              std::optional<std::uint64_t> seed = std::nullopt) {
  return detail::basic_random_draws<Unused>::stateful_draw({s, t, mean, stddev, detail::distribution::normal}, seed);
}

/// Numbers drawn from a normal distribution, those beyond two standard deviations
/// from the mean drawn again, as tf.random.truncated_normal.
/// \code kiln::random::truncated_normal({4}, 0.0, 1.0, kiln::float64, 7); \endcode
template <class Unused = void>
tensor truncated_normal(const shape& s, double mean = 0, double stddev = 1, dtype t = float32,
                        std::optional<std::uint64_t> seed = std::nullopt) {
  return detail::basic_random_draws<Unused>::stateful_draw({s, t, mean, stddev, detail::distribution::truncated_normal}, seed);
}

/// Normal numbers as a pure function of `seed`, shape and dtype, as
/// tf.random.stateless_normal.
/// \code kiln::random::stateless_normal({3}, 7);  // the same every call \endcode
template <class = void>
tensor stateless_normal(const shape& s, std::uint64_t seed, double mean = 0, double stddev = 1, dtype t = float32) {
  detail::uniform_spec spec{s, t, mean, stddev, detail::distribution::normal};
  spec.check();
  return spec.draw(seed, 0);
}

/// Truncated normal numbers as a pure function of `seed`, shape and dtype, as
/// tf.random.stateless_truncated_normal.
/// \code kiln::random::stateless_truncated_normal({3}, 7); \endcode
template <class = void>
tensor stateless_truncated_normal(const shape& s, std::uint64_t seed, double mean = 0, double stddev = 1,
                                  dtype t = float32) {
  detail::uniform_spec spec{s, t, mean, stddev, detail::distribution::truncated_normal};
  spec.check();
  return spec.draw(seed, 0);
}

/// Numbers drawn uniformly from [minval, maxval) as a pure function of `seed`, shape
/// and dtype, as tf.random.stateless_uniform: the same arguments give the same numbers.
/// \code kiln::random::stateless_uniform({3}, 7);  // three floats, the same every call \endcode
template <class = void>
tensor stateless_uniform(const shape& s, std::uint64_t seed, double minval = 0, std::optional<double> maxval = std::nullopt,
                         dtype t = float32) {
  detail::uniform_spec spec{s, t, minval, maxval};
  spec.check();
  return spec.draw(seed, 0);
}

/// A random number generator with its own state, as tf.random.Generator: each draw
/// advances the state, so draws differ, and copies share it. Inside a kiln::function a
/// draw happens at every run, in program order, from the state at that moment.
/// \code
/// auto g = kiln::random::generator::from_seed(1);
/// kiln::tensor a = g.uniform({2, 3});
/// kiln::tensor b = g.uniform({2, 3});  // new numbers
/// g.reset_from_seed(1);                // a's numbers come again
/// \endcode
class generator {
 public:
  /// A generator whose draws depend on `seed` only.
  KILN_LIBRARY_INLINE static generator from_seed(std::uint64_t seed);
  /// A generator seeded from the operating system.
  KILN_LIBRARY_INLINE static generator from_non_deterministic_state();

  /// Starts the sequence of `seed` over, for this generator and its copies.
  KILN_LIBRARY_INLINE void reset_from_seed(std::uint64_t seed);

  /// Numbers drawn uniformly from [minval, maxval), as random::uniform.
  template <class = void>
  tensor uniform(const shape& s, double minval = 0, std::optional<double> maxval = std::nullopt, dtype t = float32) {
    return draw({s, t, minval, maxval});
  }
  /// Normal numbers, as random::normal.
  template <class = void>
  tensor normal(const shape& s, double mean = 0, double stddev = 1, dtype t = float32) {
    return draw({s, t, mean, stddev, detail::distribution::normal});
  }
  /// Truncated normal numbers, as random::truncated_normal.
  template <class = void>
  tensor truncated_normal(const shape& s, double mean = 0, double stddev = 1, dtype t = float32) {
    return draw({s, t, mean, stddev, detail::distribution::truncated_normal});
  }

 private:
  explicit generator(std::uint64_t seed) : state_(std::make_shared<detail::generator_state>(seed)) {}
  template <class = void>
  tensor draw(detail::uniform_spec spec) {
    spec.check();
    if (detail::trace_context* trace = detail::trace_context::current())
      return detail::record_random(std::make_shared<const detail::random_uniform_op>(std::move(spec), state_), *trace);
    auto [key, stream] = state_->take();
    return spec.draw(key, stream);
  }
  std::shared_ptr<detail::generator_state> state_;
};

}  // namespace random
}  // namespace kiln

#if KILN_DEFINE_LIBRARY
namespace kiln::detail {

KILN_LIBRARY_INLINE std::uint64_t fresh_seed() {
  static std::atomic<std::uint64_t> next{std::uint64_t(std::chrono::steady_clock::now().time_since_epoch().count()) ^
                                         std::uint64_t(std::chrono::system_clock::now().time_since_epoch().count()) ^
                                         (std::uint64_t(reinterpret_cast<std::uintptr_t>(&next)) << 16)};
  std::uint64_t state = next.fetch_add(0x9E3779B97F4A7C15u, std::memory_order_relaxed);
  return splitmix64(state);
}

KILN_LIBRARY_INLINE std::string_view uniform_spec::what() const {
  return kind == distribution::uniform  ? "random::uniform"
         : kind == distribution::normal ? "random::normal"
                                        : "random::truncated_normal";
}

KILN_LIBRARY_INLINE std::pair<std::string_view, std::string_view> random_op_names(distribution d) {
  switch (d) {
    case distribution::normal:
      return {"RandomStandardNormal", "StatefulStandardNormal"};
    case distribution::truncated_normal:
      return {"TruncatedNormal", "StatefulTruncatedNormal"};
    default:
      return {"RandomUniform", "StatefulUniform"};
  }
}

KILN_LIBRARY_INLINE random_state& random_state::get() {
  static random_state s;
  return s;
}

KILN_LIBRARY_INLINE std::uint64_t random_state::key_for(std::optional<std::uint64_t> op_seed) {
  std::lock_guard lock(mutex);
  if (!global_seed) return op_seed ? *op_seed : fresh_seed();
  const std::uint64_t op = op_seed ? *op_seed : next_op_seed++;
  return mix64(*global_seed ^ mix64(op + 0x9E3779B97F4A7C15u));
}

KILN_LIBRARY_INLINE std::uint64_t random_state::next_eager_stream(std::uint64_t key) {
  std::lock_guard lock(mutex);
  return eager_draws[key]++;
}

KILN_LIBRARY_INLINE std::pair<std::uint64_t, std::uint64_t> generator_state::take() {
  return {key.load(), next_stream.fetch_add(1)};
}

KILN_LIBRARY_INLINE std::string_view random_uniform_op::name() const {
  const auto names = random_op_names(spec_.kind);
  return generator_ ? names.second : names.first;
}

KILN_LIBRARY_INLINE std::vector<std::pair<dtype, shape>> random_uniform_op::results() const {
  return {{spec_.type, spec_.dims}};
}

KILN_LIBRARY_INLINE std::array<std::string_view, 6> random_uniform_op::op_names() {
  const auto u = random_op_names(distribution::uniform), n = random_op_names(distribution::normal),
             t = random_op_names(distribution::truncated_normal);
  return {u.first, u.second, n.first, n.second, t.first, t.second};
}

KILN_LIBRARY_INLINE tensor record_random(std::shared_ptr<const random_uniform_op> op, trace_context& trace) {
  return trace.record_special(op, {}, op->results())[0];
}

}  // namespace kiln::detail

namespace kiln::random {

KILN_LIBRARY_INLINE void set_seed(std::uint64_t seed) {
  detail::random_state& s = detail::random_state::get();
  std::lock_guard lock(s.mutex);
  s.global_seed = seed;
  s.next_op_seed = 0;
  s.eager_draws.clear();
}

KILN_LIBRARY_INLINE generator generator::from_seed(std::uint64_t seed) { return generator(seed); }

KILN_LIBRARY_INLINE generator generator::from_non_deterministic_state() { return generator(detail::fresh_seed()); }

KILN_LIBRARY_INLINE void generator::reset_from_seed(std::uint64_t seed) {
  state_->key = seed;
  state_->next_stream = 0;
}

}  // namespace kiln::random
#endif  // KILN_DEFINE_LIBRARY
