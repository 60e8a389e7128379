#pragma once
/// \file
/// `kiln::module`, TensorFlow's `tf.Module`: a named tree of variables and
/// submodules that reports `variables()`, `trainable_variables()` and `submodules()`
/// over the whole tree, in the order its members are declared.
///
/// A user type finds its members by reflection: it declares them with
/// `KILN_MODULE(type, (T, name)...)`, Boost.Hana's `BOOST_HANA_DEFINE_STRUCT` plus the
/// override through which kiln::module walks them, so the list of members is their
/// declaration and cannot drift from it (docs/design_notes.md, "Modules", says why
/// this and not registration at construction). Members that are kiln::variables,
/// modules (layers included) or std::vectors of either are part of the tree; others
/// (numbers, strings) are not.
/// \code
/// struct regression : kiln::module {
///   KILN_MODULE(regression, (kiln::variable, w), (kiln::variable, b));
///   regression() : w(kiln::constant({{1.f}}), "w"), b(kiln::constant({0.f}), "b") {}
/// };
/// regression m;
/// m.trainable_variables().size() == 2;
/// \endcode

#include <boost/hana/accessors.hpp>
#include <boost/hana/define_struct.hpp>
#include <boost/hana/for_each.hpp>
#include <boost/hana/pair.hpp>
#include <boost/hana/string.hpp>

#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_set>
#include <utility>
#include <vector>

#include "kiln/trace/effects.hpp"

namespace kiln {

class module;

namespace detail {

/// What a module reports of its members to the walks of kiln::module: each variable
/// (and whether training updates it) and each submodule, in order.
class member_visitor {
 public:
  virtual void variable(const kiln::variable& v, bool trainable) = 0;
  virtual void submodule(const module& m) = 0;

 protected:
  ~member_visitor() = default;
};

/// Reports member `m` of a reflected module to `v`, when it is part of the tree.
template <class T>
void visit_member(const T& m, member_visitor& v);

template <class>
inline constexpr bool weights_need_header = false;
/// How module::save_weights and load_weights reach the HDF5 code of the optional
/// header kiln/weights.hpp, which specializes this; without it, using them is a
/// compile error that says what to include.
template <class T = void>
struct weights_file {
  static_assert(weights_need_header<T>,
                "kiln: save_weights and load_weights need #include <kiln/weights.hpp> (CMake target kiln::weights, HDF5)");
  static void save(const module&, const std::string&) {}
  static void load(const module&, const std::string&) {}
};

}  // namespace detail

/// A named tree of variables and submodules (`tf.Module`). Derive from it and declare
/// the members with KILN_MODULE; kiln's layers are modules too.
class module {
 public:
  /// A module named `name` (KILN_MODULE names it after its type when not given one).
  explicit module(std::string name = {}) : name_(std::move(name)) {}
  module(const module&) = default;
  module(module&&) = default;
  module& operator=(const module&) = default;
  module& operator=(module&&) = default;
  virtual ~module() = default;

  /// The module's name (a layer's is unique in the program: `dense`, `dense_1`, ...).
  KILN_LIBRARY_INLINE const std::string& name() const;

  /// Every variable of the tree, depth first in declaration order, each once.
  KILN_LIBRARY_INLINE std::vector<variable> variables() const;
  /// The variables training updates (all but statistics such as batch
  /// normalization's moving mean and variance).
  KILN_LIBRARY_INLINE std::vector<variable> trainable_variables() const;
  /// The variables training does not update.
  KILN_LIBRARY_INLINE std::vector<variable> non_trainable_variables() const;
  /// Every module below this one, depth first in declaration order.
  KILN_LIBRARY_INLINE std::vector<const module*> submodules() const;

  /// Writes the tree's weights to `path` in Keras 2.12's HDF5 layout (`model.save_weights`);
  /// needs kiln/weights.hpp.
  template <class T = void>
  void save_weights(const std::string& path) const {
    detail::weights_file<T>::save(*this, path);
  }
  /// Sets the tree's weights from a file in Keras' HDF5 layout (`model.load_weights`);
  /// needs kiln/weights.hpp.
  template <class T = void>
  void load_weights(const std::string& path) const {
    detail::weights_file<T>::load(*this, path);
  }

  /// Reports the module's own variables and direct submodules to `v`, in order
  /// (KILN_MODULE writes it for a user type; layers report their weights).
  KILN_LIBRARY_INLINE virtual void visit_members(detail::member_visitor& v) const;

 protected:
  /// The name of a module not given one: its type's, for KILN_MODULE types.
  KILN_LIBRARY_INLINE virtual const std::string& default_name() const;
  KILN_LIBRARY_INLINE void set_name(std::string name);

 private:
  /// 0: every variable, 1: the trainable ones, 2: the others.
  KILN_LIBRARY_INLINE std::vector<variable> collect(int which) const;

  std::string name_;
};

namespace detail {

template <class T>
void visit_member(const T& m, member_visitor& v) {
  if constexpr (std::is_same_v<T, kiln::variable>) {
    v.variable(m, true);
  } else if constexpr (std::is_base_of_v<module, T>) {
    v.submodule(m);
  } else if constexpr (requires { typename T::value_type; m.begin(); m.end(); }) {
    if constexpr (std::is_same_v<typename T::value_type, kiln::variable> ||
                  std::is_base_of_v<module, typename T::value_type>)
      for (const auto& e : m) visit_member(e, v);
  }
}

/// Reports the members of reflected type `T` (declared with KILN_MODULE) to `v`.
template <class T>
void visit_reflected(const T& self, member_visitor& v) {
  boost::hana::for_each(boost::hana::accessors<T>(),
                        [&](const auto& pair) { visit_member(boost::hana::second(pair)(self), v); });
}

}  // namespace detail
}  // namespace kiln

/// Declares the members of a type derived from kiln::module (`(type, name)` pairs, as
/// BOOST_HANA_DEFINE_STRUCT takes them) so that the module finds its variables and
/// submodules among them; the module's default name is the type's.
/// \code
/// struct two_layers : kiln::module {
///   KILN_MODULE(two_layers, (kiln::layers::dense, hidden), (kiln::layers::dense, out));
///   two_layers() : hidden(8), out(1) {}
/// };
/// \endcode
#define KILN_MODULE(type, ...)                                                                       \
  BOOST_HANA_DEFINE_STRUCT(type, __VA_ARGS__);                                                       \
  void visit_members(::kiln::detail::member_visitor& kiln_visitor) const override {                 \
    ::kiln::detail::visit_reflected(*this, kiln_visitor);                                           \
  }                                                                                                  \
                                                                                                     \
 protected:                                                                                          \
  const std::string& default_name() const override {                                               \
    static const std::string kiln_type_name = #type;                                                \
    return kiln_type_name;                                                                           \
  }                                                                                                  \
                                                                                                     \
 public:

#if KILN_DEFINE_LIBRARY
namespace kiln {

KILN_LIBRARY_INLINE const std::string& module::name() const { return name_.empty() ? default_name() : name_; }

KILN_LIBRARY_INLINE std::vector<variable> module::variables() const { return collect(0); }

KILN_LIBRARY_INLINE std::vector<variable> module::trainable_variables() const { return collect(1); }

KILN_LIBRARY_INLINE std::vector<variable> module::non_trainable_variables() const { return collect(2); }

KILN_LIBRARY_INLINE std::vector<const module*> module::submodules() const {
  struct walk final : detail::member_visitor {
    std::vector<const module*> found;
    void variable(const kiln::variable&, bool) override {}
    void submodule(const module& m) override {
      found.push_back(&m);
      m.visit_members(*this);
    }
  } w;
  visit_members(w);
  return w.found;
}

KILN_LIBRARY_INLINE void module::visit_members(detail::member_visitor& v) const { (void)v; }

KILN_LIBRARY_INLINE const std::string& module::default_name() const {
  static const std::string unnamed = "module";
  return unnamed;
}

KILN_LIBRARY_INLINE void module::set_name(std::string name) { name_ = std::move(name); }

KILN_LIBRARY_INLINE std::vector<variable> module::collect(int which) const {
  struct walk final : detail::member_visitor {
    int which;
    std::vector<kiln::variable> found;
    std::unordered_set<const void*> seen;
    explicit walk(int w) : which(w) {}
    void variable(const kiln::variable& v, bool trainable) override {
      if (!v) return;
      if (which == 1 && !trainable) return;
      if (which == 2 && trainable) return;
      if (seen.insert(v.identity()).second) found.push_back(v);
    }
    void submodule(const module& m) override { m.visit_members(*this); }
  } w(which);
  visit_members(w);
  return std::move(w.found);
}

}  // namespace kiln
#endif  // KILN_DEFINE_LIBRARY
