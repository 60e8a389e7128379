#pragma once
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
