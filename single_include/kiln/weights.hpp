// kiln single header, generated from include/kiln/weights.hpp by `python3 scripts/amalgamate.py`.
// Do not edit: change the headers under include/ and regenerate.
#pragma once
#ifndef KILN_SINGLE_INCLUDE_KILN_WEIGHTS_HPP
#define KILN_SINGLE_INCLUDE_KILN_WEIGHTS_HPP
// ----- begin kiln/weights.hpp -----
/// \file
/// Weights files and checkpoints, an optional part of kiln (CMake target
/// `kiln::weights`, which brings HDF5: Debian's `libhdf5-dev`).
///
/// `save_weights` / `load_weights` (also members of every kiln::module) write and
/// read Keras 2.12's HDF5 layout (`model.save_weights("w.h5")`): the root's
/// `layer_names`, one group per layer with its `weight_names`, and one float dataset
/// per weight at `<layer>/<layer>/<weight>:0`. Layers are matched in order, as Keras
/// matches them: a model built from kiln layers loads the weights Keras saved for
/// the same architecture, and Keras loads kiln's file back.
///
/// `kiln::checkpoint` (TensorFlow's `tf.train.Checkpoint`) saves a module tree with
/// its optimizer's slot variables and `iterations`, so that training restored in a new
/// process continues bit for bit.
///
/// A missing, truncated or corrupt file raises kiln::invalid_argument_error naming
/// it; a file whose weights do not fit the model (another count of layers or weights,
/// another shape) raises kiln::value_error naming the weight and both shapes.

#include <string>
#include <typeinfo>
#include <unordered_set>
#include <utility>
#include <vector>

#ifndef KILN_SINGLE_INCLUDE_KILN_IO_HDF5_HPP
#define KILN_SINGLE_INCLUDE_KILN_IO_HDF5_HPP
// ----- begin kiln/io/hdf5.hpp -----
/// \file
/// A thin RAII layer over HDF5's C API, what kiln's weights files and checkpoints
/// (kiln/weights.hpp) need of it: files, groups, float datasets and string
/// attributes, every failure a kiln:: error naming the file and what failed, and
/// HDF5's own error printing turned off.

#include <hdf5.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "kiln/kiln.hpp"

namespace kiln::detail::hdf5 {

/// The HDF5 types of a dtype's elements: in memory, and as stored (little-endian).
inline std::pair<hid_t, hid_t> types_of(dtype t) {
  switch (t) {
    case float64: return {H5T_NATIVE_DOUBLE, H5T_IEEE_F64LE};
    case int32: return {H5T_NATIVE_INT32, H5T_STD_I32LE};
    case int64: return {H5T_NATIVE_INT64, H5T_STD_I64LE};
    default: return {H5T_NATIVE_FLOAT, H5T_IEEE_F32LE};
  }
}

/// An HDF5 identifier, closed by `close` when the handle goes.
class handle {
 public:
  handle() = default;
  handle(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  handle(handle&& o) noexcept : id_(std::exchange(o.id_, H5I_INVALID_HID)), close_(o.close_) {}
  handle& operator=(handle&& o) noexcept {
    std::swap(id_, o.id_);
    std::swap(close_, o.close_);
    return *this;
  }
  handle(const handle&) = delete;
  handle& operator=(const handle&) = delete;
  ~handle() {
    if (id_ >= 0 && close_) close_(id_);
  }
  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }

 private:
  hid_t id_ = H5I_INVALID_HID;
  herr_t (*close_)(hid_t) = nullptr;
};

/// A weights file open for reading or writing; `what` prefixes its errors.
class file {
 public:
  /// Opens `path` to read; a file that is not HDF5 (or is truncated) raises
  /// kiln::invalid_argument_error naming it.
  static file open(const std::string& path, const std::string& what) {
    quiet();
    file f(path, what);
    if (H5Fis_hdf5(path.c_str()) <= 0) f.fail("is not an HDF5 file (missing, truncated or corrupt)");
    f.id_ = handle(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
    if (!f.id_.valid()) f.fail("cannot be opened as an HDF5 file (truncated or corrupt)");
    return f;
  }
  /// Creates (or replaces) `path`.
  static file create(const std::string& path, const std::string& what) {
    quiet();
    file f(path, what);
    f.id_ = handle(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
    if (!f.id_.valid()) f.fail("cannot be created");
    return f;
  }

  [[noreturn]] void fail(const std::string& why) const {
    throw invalid_argument_error(what_ + ": " + path_ + " " + why);
  }
  [[noreturn]] void mismatch(const std::string& why) const { throw value_error(what_ + ": " + path_ + ": " + why); }
  const std::string& path() const { return path_; }
  hid_t root() const { return id_.get(); }

  bool exists(const std::string& name) const {
    // Each link of the path must exist for the next to be asked about.
    std::size_t at = 0;
    while (true) {
      at = name.find('/', at + 1);
      const std::string prefix = name.substr(0, at);
      if (H5Lexists(root(), prefix.c_str(), H5P_DEFAULT) <= 0) return false;
      if (at == std::string::npos) return true;
    }
  }
  handle group(const std::string& name) const {
    handle g(H5Gopen2(root(), name.c_str(), H5P_DEFAULT), H5Gclose);
    if (!g.valid()) fail("has no group " + name);
    return g;
  }
  handle make_group(const std::string& name) const {
    handle g(H5Gcreate2(root(), name.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
    if (!g.valid()) fail("cannot hold a group " + name);
    return g;
  }

  /// The strings of attribute `name` of `object` (empty for an empty attribute of any
  /// type, as Keras writes a layer without weights); a missing attribute raises.
  std::vector<std::string> strings(hid_t object, const std::string& object_name, const std::string& name) const {
    if (H5Aexists_by_name(object, ".", name.c_str(), H5P_DEFAULT) <= 0) fail("has no attribute " + name + " on " + object_name);
    handle attr(H5Aopen_by_name(object, ".", name.c_str(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
    handle type(H5Aget_type(attr.get()), H5Tclose), space(H5Aget_space(attr.get()), H5Sclose);
    const hssize_t n = H5Sget_simple_extent_npoints(space.get());
    if (n < 0) fail("has an unreadable attribute " + name + " on " + object_name);
    if (n == 0) return {};
    if (H5Tget_class(type.get()) != H5T_STRING) fail("has attribute " + name + " on " + object_name + " that is not text");
    std::vector<std::string> out;
    if (H5Tis_variable_str(type.get()) > 0) {
      handle mem(H5Tcopy(H5T_C_S1), H5Tclose);
      H5Tset_size(mem.get(), H5T_VARIABLE);
      std::vector<char*> text(std::size_t(n), nullptr);
      if (H5Aread(attr.get(), mem.get(), text.data()) < 0) fail("has an unreadable attribute " + name);
      for (char* s : text) out.emplace_back(s ? s : "");
      H5Dvlen_reclaim(mem.get(), space.get(), H5P_DEFAULT, text.data());
    } else {
      const std::size_t size = H5Tget_size(type.get());
      handle mem(H5Tcopy(H5T_C_S1), H5Tclose);
      H5Tset_size(mem.get(), size);
      std::vector<char> text(std::size_t(n) * size + 1, '\0');
      if (H5Aread(attr.get(), mem.get(), text.data()) < 0) fail("has an unreadable attribute " + name);
      for (hssize_t k = 0; k < n; ++k) {
        const char* s = text.data() + std::size_t(k) * size;
        out.emplace_back(s, strnlen(s, size));
      }
    }
    return out;
  }
  /// Writes attribute `name` of `object`: variable-length strings, as h5py writes
  /// Keras' (an empty list as an empty float64 array, as Keras writes one).
  void write_strings(hid_t object, const std::string& name, const std::vector<std::string>& values, bool scalar = false) const {
    if (values.empty()) {
      const hsize_t zero = 0;
      handle space(H5Screate_simple(1, &zero, nullptr), H5Sclose);
      handle attr(H5Acreate_by_name(object, ".", name.c_str(), H5T_IEEE_F64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
      if (!attr.valid()) fail("cannot hold attribute " + name);
      return;
    }
    handle type(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(type.get(), H5T_VARIABLE);
    const hsize_t n = values.size();
    handle space(scalar ? H5Screate(H5S_SCALAR) : H5Screate_simple(1, &n, nullptr), H5Sclose);
    handle attr(H5Acreate_by_name(object, ".", name.c_str(), type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
    std::vector<const char*> text;
    for (const std::string& s : values) text.push_back(s.c_str());
    if (!attr.valid() || H5Awrite(attr.get(), type.get(), text.data()) < 0) fail("cannot hold attribute " + name);
  }

  /// Dataset `name` as a tensor of dtype `t` (float32, float64, int32 or int64,
  /// converted from the file's numbers of the same kind), checked to have `expected` dims (`label` names it in errors).
  tensor read(const std::string& name, dtype t, const shape& expected, const std::string& label) const {
    if (!exists(name)) mismatch("has no weight " + name + " for " + label);
    handle d(H5Dopen2(root(), name.c_str(), H5P_DEFAULT), H5Dclose);
    if (!d.valid()) fail("has an unreadable dataset " + name);
    handle space(H5Dget_space(d.get()), H5Sclose), type(H5Dget_type(d.get()), H5Tclose);
    const int rank = H5Sget_simple_extent_ndims(space.get());
    if (rank < 0 || rank > max_rank) fail("has a dataset " + name + " of unreadable rank");
    std::vector<hsize_t> dims(static_cast<std::size_t>(rank));
    H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
    shape got;
    for (hsize_t d0 : dims) got.push_back(std::int64_t(d0));
    if (got != expected)
      mismatch("weight " + name + " has shape " + got.str() + " but " + label + " has shape " + expected.str());
    if (H5Tget_class(type.get()) != (is_floating(t) ? H5T_FLOAT : H5T_INTEGER))
      mismatch("weight " + name + " does not hold " + (is_floating(t) ? "floating-point numbers" : "integers"));
    tensor out = kiln::zeros(expected, t);
    const hid_t mem = types_of(t).first;
    if (out.size() && H5Dread(d.get(), mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.raw_data()) < 0)
      fail("has a dataset " + name + " that cannot be read (truncated or corrupt)");
    return out;
  }
  /// Writes `value` (float32, float64, int32 or int64) as dataset `name`, making the groups on its path.
  void write(const std::string& name, const tensor& value) const {
    handle lcpl(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
    H5Pset_create_intermediate_group(lcpl.get(), 1);
    std::vector<hsize_t> dims;
    for (std::int64_t d0 : value.shape()) dims.push_back(hsize_t(d0));
    handle space(value.rank() == 0 ? H5Screate(H5S_SCALAR) : H5Screate_simple(value.rank(), dims.data(), nullptr), H5Sclose);
    const auto [mem, stored] = types_of(value.dtype());
    handle d(H5Dcreate2(root(), name.c_str(), stored, space.get(), lcpl.get(), H5P_DEFAULT, H5P_DEFAULT), H5Dclose);
    if (!d.valid()) fail("cannot hold dataset " + name);
    const tensor host = value.device() == device::cpu ? value : value.to(device::cpu);
    if (host.size() && H5Dwrite(d.get(), mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, host.raw_data()) < 0)
      fail("cannot hold dataset " + name);
  }

 private:
  file(std::string path, std::string what) : path_(std::move(path)), what_(std::move(what)) {}
  /// HDF5 prints its error stack to stderr by default; kiln raises instead.
  static void quiet() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

  std::string path_, what_;
  handle id_;
};

}  // namespace kiln::detail::hdf5
// ----- end kiln/io/hdf5.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_IO_HDF5_HPP
#include "kiln/kiln.hpp"

namespace kiln {
namespace detail {

/// A group of a weights file: a layer (or a module with variables of its own) and
/// those variables, in order.
struct weight_group {
  std::string name;
  std::vector<variable> weights;
};

/// The groups of `root`'s tree, depth first: each module that holds variables itself,
/// and each layer without submodules (a flatten or pooling layer: a group without
/// weights, as Keras writes one). An unbuilt layer has no weights yet: an error.
inline void collect_groups(const module& m, std::vector<weight_group>& out, std::unordered_set<const void*>& seen,
                           const std::string& what) {
  struct direct final : member_visitor {
    std::vector<kiln::variable> vars;
    std::vector<const module*> subs;
    void variable(const kiln::variable& v, bool) override { vars.push_back(v); }
    void submodule(const module& s) override { subs.push_back(&s); }
  } d;
  m.visit_members(d);
  const auto* l = dynamic_cast<const layers::layer*>(&m);
  if (l && !l->built() && d.subs.empty())
    throw value_error(what + ": layer " + m.name() + " is not built: call the model once before saving or loading weights");
  if (l && seen.count(l->identity())) return;  // a layer held twice is written once
  if (l) seen.insert(l->identity());
  std::vector<variable> own;
  for (const variable& v : d.vars)
    if (v && seen.insert(v.identity()).second) own.push_back(v);
  if (!own.empty() || (l && d.subs.empty())) out.push_back({m.name(), std::move(own)});
  for (const module* s : d.subs) collect_groups(*s, out, seen, what);
}
inline std::vector<weight_group> groups_of(const module& root, const std::string& what) {
  std::vector<weight_group> out;
  std::unordered_set<const void*> seen;
  collect_groups(root, out, seen, what);
  return out;
}

inline std::string joined(const std::vector<std::string>& names) {
  std::string s;
  for (const std::string& n : names) s += (s.empty() ? "" : ", ") + n;
  return s;
}

/// What module::save_weights and load_weights run (declared in kiln/models/module.hpp).
template <>
struct weights_file<void> {
  static void save(const module& m, const std::string& path) {
    const std::string what = "save_weights";
    const std::vector<weight_group> groups = groups_of(m, what);
    const hdf5::file f = hdf5::file::create(path, what);
    std::vector<std::string> layer_names;
    for (const weight_group& g : groups) layer_names.push_back(g.name);
    f.write_strings(f.root(), "backend", {"tensorflow"}, true);
    f.write_strings(f.root(), "keras_version", {"2.12.0"}, true);
    f.write_strings(f.root(), "layer_names", layer_names);
    for (const weight_group& g : groups) {
      const hdf5::handle group = f.make_group(g.name);
      std::vector<std::string> names;
      for (const variable& v : g.weights) {
        names.push_back(v.name() + ":0");
        f.write(g.name + "/" + names.back(), v.read_value());
      }
      f.write_strings(group.get(), "weight_names", names);
    }
    const hdf5::handle top = f.make_group("top_level_model_weights");
    f.write_strings(top.get(), "weight_names", {});
  }

  static void load(const module& m, const std::string& path) {
    const std::string what = "load_weights";
    const hdf5::file f = hdf5::file::open(path, what);
    std::vector<weight_group> groups;
    for (weight_group& g : groups_of(m, what))
      if (!g.weights.empty()) groups.push_back(std::move(g));
    // The file's layers that have weights, in order, with their weights' names.
    std::vector<std::pair<std::string, std::vector<std::string>>> stored;
    for (const std::string& layer : f.strings(f.root(), "the file", "layer_names")) {
      if (!f.exists(layer)) f.fail("has no group for layer " + layer);
      const hdf5::handle group = f.group(layer);
      std::vector<std::string> names = f.strings(group.get(), "layer " + layer, "weight_names");
      if (!names.empty()) stored.emplace_back(layer, std::move(names));
    }
    if (stored.size() != groups.size()) {
      std::vector<std::string> ours, theirs;
      for (const weight_group& g : groups) ours.push_back(g.name);
      for (const auto& s : stored) theirs.push_back(s.first);
      f.mismatch("the file has " + std::to_string(stored.size()) + " layers with weights (" + joined(theirs) +
                 ") but the model has " + std::to_string(groups.size()) + " (" + joined(ours) + ")");
    }
    // Every value is read and checked before any variable changes.
    std::vector<std::pair<variable, tensor>> values;
    for (std::size_t k = 0; k < groups.size(); ++k) {
      const auto& [layer, names] = stored[k];
      const weight_group& g = groups[k];
      if (names.size() != g.weights.size())
        f.mismatch("layer " + layer + " of the file has " + std::to_string(names.size()) + " weights but layer " + g.name +
                   " of the model has " + std::to_string(g.weights.size()));
      for (std::size_t w = 0; w < names.size(); ++w) {
        const variable& v = g.weights[w];
        values.emplace_back(v, f.read(layer + "/" + names[w], v.dtype(), v.shape(), "variable " + v.name()));
      }
    }
    for (const auto& [v, value] : values) v.assign(value);
  }
};

}  // namespace detail

/// Writes `model`'s weights to `path` in Keras 2.12's HDF5 layout (as `model.save_weights(path)`).
/// \code
/// kiln::layers::dense d(2);
/// (void)d(kiln::ones({1, 3}));
/// kiln::save_weights(d, "dense.weights.h5");
/// \endcode
inline void save_weights(const module& model, const std::string& path) { detail::weights_file<>::save(model, path); }

/// Sets `model`'s weights from `path`, a file in Keras' HDF5 layout, layer by layer in
/// order (as `model.load_weights(path)`); the model must be built.
/// \code
/// kiln::layers::dense d(2);
/// (void)d(kiln::ones({1, 3}));
/// kiln::save_weights(d, "dense.weights.h5");
/// kiln::load_weights(d, "dense.weights.h5");
/// \endcode
inline void load_weights(const module& model, const std::string& path) { detail::weights_file<>::load(model, path); }

/// TensorFlow's `tf.train.Checkpoint` of a module and its optimizer: every variable of
/// the module, the optimizer's `iterations` and slot variables, in one HDF5 file.
/// Restoring into a fresh optimizer first makes its slots (one update with zero
/// gradients), then sets every value from the file, so that training goes on as if
/// it had not stopped. The module must be built.
/// \code
/// kiln::layers::dense d(1);
/// (void)d(kiln::ones({1, 2}));
/// kiln::optimizers::adam opt;
/// kiln::checkpoint ckpt(d, opt);
/// ckpt.save("run.ckpt.h5");
/// ckpt.restore("run.ckpt.h5");
/// \endcode
class checkpoint {
 public:
  template <class Optimizer>
  checkpoint(const module& model, Optimizer& optimizer)
      : model_(&model),
        optimizer_variables_([&optimizer] {
          std::vector<variable> v{optimizer.iterations()};
          for (const variable& s : optimizer.slot_variables()) v.push_back(s);
          return v;
        }),
        make_slots_([&optimizer, &model] {
          init_scope outside_any_trace;
          const std::vector<variable> vars = model.trainable_variables();
          std::vector<tensor> zeros;
          for (const variable& v : vars) zeros.push_back(kiln::zeros(v.shape(), v.dtype()));
          if (!vars.empty()) optimizer.apply_gradients(zeros, vars);
        }) {}

  /// Writes the checkpoint to `path`.
  void save(const std::string& path) const {
    const detail::hdf5::file f = detail::hdf5::file::create(path, "checkpoint::save");
    write(f, "model", model_->variables());
    write(f, "optimizer", optimizer_variables_());
  }

  /// Sets the module's and the optimizer's variables from `path`; a variable the file
  /// does not have, or has in another shape, raises kiln::value_error naming it.
  void restore(const std::string& path) const {
    const detail::hdf5::file f = detail::hdf5::file::open(path, "checkpoint::restore");
    std::vector<std::pair<variable, tensor>> values;
    read(f, "model", model_->variables(), values);
    std::vector<variable> opt = optimizer_variables_();
    if (opt.size() == 1 && f.exists("optimizer/1")) {  // a fresh optimizer: make its slots first
      make_slots_();
      opt = optimizer_variables_();
    }
    read(f, "optimizer", opt, values);
    for (const auto& [v, value] : values) v.assign(value);
  }

 private:
  static void write(const detail::hdf5::file& f, const std::string& group, const std::vector<variable>& vars) {
    const detail::hdf5::handle g = f.make_group(group);
    std::vector<std::string> names;
    for (std::size_t k = 0; k < vars.size(); ++k) {
      names.push_back(vars[k].name());
      f.write(group + "/" + std::to_string(k), vars[k].read_value());
    }
    f.write_strings(g.get(), "names", names);
  }
  static void read(const detail::hdf5::file& f, const std::string& group, const std::vector<variable>& vars,
                   std::vector<std::pair<variable, tensor>>& values) {
    const detail::hdf5::handle g = f.group(group);
    const std::vector<std::string> names = f.strings(g.get(), group, "names");
    for (std::size_t k = 0; k < std::max(names.size(), vars.size()); ++k) {
      if (k >= names.size())
        f.mismatch("the " + group + " has variable " + vars[k].name() + " " + vars[k].shape().str() +
                   ", which the checkpoint does not have (it has " + std::to_string(names.size()) + " variables)");
      if (k >= vars.size())
        f.mismatch("the checkpoint's " + group + " has variable " + names[k] + ", which the " + group +
                   " does not have (it has " + std::to_string(vars.size()) + " variables)");
      values.emplace_back(vars[k], f.read(group + "/" + std::to_string(k), vars[k].dtype(), vars[k].shape(),
                                          "variable " + vars[k].name() + " (saved as " + names[k] + ")"));
    }
  }

  const module* model_;
  std::function<std::vector<variable>()> optimizer_variables_;
  std::function<void()> make_slots_;
};

}  // namespace kiln
// ----- end kiln/weights.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_WEIGHTS_HPP
