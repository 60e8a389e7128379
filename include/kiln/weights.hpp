#pragma once
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

#include "kiln/io/hdf5.hpp"
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
