// kiln/weights.hpp: Keras 2.12's weights file (keras_model.h5, written by
// test/models/make_keras_fixtures.py) loaded into the same architecture built from
// kiln layers predicts Keras' outputs within 1e-5; kiln's own file has Keras' layout
// (the same groups, attributes and datasets as Keras' file); bad files and models
// that do not fit raise errors naming what is wrong; checkpoints resume training bit
// for bit.

#include <catch2/catch.hpp>

#include <hdf5.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <kiln/kiln.hpp>
#include <kiln/weights.hpp>

#include "../models/keras_fixtures.hpp"

namespace {

using kiln::tensor;
namespace layers = kiln::layers;

const std::string keras_file = std::string(KILN_TEST_SOURCE_DIR) + "/weights/keras_model.h5";

/// A file path in the build's temporary directory.
std::string temp_path(const std::string& name) { return (std::filesystem::temp_directory_path() / name).string(); }

tensor to_tensor(const keras_fixtures::array<float>& a) { return kiln::constant(a.values, kiln::shape(std::span(a.dims))); }

/// The Keras model of the fixture, from kiln layers named as Keras named them.
layers::sequential keras_architecture(const std::string& suffix = "") {
  return layers::sequential({layers::conv2d(4, 3, {.activation = kiln::relu, .name = "conv2d" + suffix}),
                             layers::batch_normalization({.name = "batch_normalization" + suffix}),
                             layers::max_pooling2d(2, {.name = "max_pooling2d" + suffix}),
                             layers::flatten("flatten" + suffix),
                             layers::dense(5, {.activation = kiln::gelu, .name = "dense" + suffix}),
                             layers::dense(3, {.name = "dense_1" + suffix})});
}

/// Every object of an HDF5 file: its path, its attributes' string values (or
/// "<empty>"), and a dataset's dims.
std::map<std::string, std::string> layout(const std::string& path) {
  std::map<std::string, std::string> out;
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  REQUIRE(f >= 0);
  struct walk {
    static herr_t visit(hid_t obj, const char* name, const H5O_info_t* info, void* data) {
      auto& out = *static_cast<std::map<std::string, std::string>*>(data);
      std::string text = info->type == H5O_TYPE_DATASET ? "dataset" : "group";
      if (info->type == H5O_TYPE_DATASET) {
        hid_t d = H5Dopen2(obj, name, H5P_DEFAULT), s = H5Dget_space(d);
        hsize_t dims[8];
        const int rank = H5Sget_simple_extent_dims(s, dims, nullptr);
        for (int k = 0; k < rank; ++k) text += " " + std::to_string(dims[k]);
        H5Sclose(s);
        H5Dclose(d);
      }
      out[name] = text;
      return 0;
    }
  };
  H5Ovisit(f, H5_INDEX_NAME, H5_ITER_INC, walk::visit, &out);
  H5Fclose(f);
  return out;
}

std::vector<std::string> string_attribute(const std::string& path, const std::string& object, const std::string& name) {
  const kiln::detail::hdf5::file f = kiln::detail::hdf5::file::open(path, "test");
  const kiln::detail::hdf5::handle g(H5Oopen(f.root(), object.c_str(), H5P_DEFAULT), H5Oclose);
  return f.strings(g.get(), object, name);
}

}  // namespace

TEST_CASE("a model of kiln layers loads Keras 2.12's weights and predicts Keras' outputs") {
  layers::sequential model = keras_architecture();
  const tensor x = to_tensor(keras_fixtures::model_input);
  (void)model(x);  // builds
  model.load_weights(keras_file);
  const std::vector<float> got = model(x).to_vector<float>();
  const std::vector<float>& keras = keras_fixtures::model_output.values;
  REQUIRE(got.size() == keras.size());
  for (std::size_t i = 0; i < got.size(); ++i) CHECK(std::abs(got[i] - keras[i]) <= 1e-5);
  // In a graph too.
  kiln::function serve([&](const tensor& v) { return model(v); });
  const std::vector<float> served = serve(x).to_vector<float>();
  for (std::size_t i = 0; i < got.size(); ++i) CHECK(std::abs(served[i] - keras[i]) <= 1e-5);
}

TEST_CASE("kiln writes Keras' layout: the groups, attributes and datasets of Keras' own file") {
  layers::sequential model = keras_architecture();
  const tensor x = to_tensor(keras_fixtures::model_input);
  (void)model(x);
  model.load_weights(keras_file);
  const std::string ours = temp_path("kiln_model.weights.h5");
  model.save_weights(ours);
  CHECK(layout(ours) == layout(keras_file));
  for (const char* attribute : {"layer_names", "backend", "keras_version"})
    CHECK(string_attribute(ours, "/", attribute) == string_attribute(keras_file, "/", attribute));
  for (const char* layer : {"conv2d", "batch_normalization", "flatten", "dense_1", "top_level_model_weights"})
    CHECK(string_attribute(ours, layer, "weight_names") == string_attribute(keras_file, layer, "weight_names"));
  // And a second model reads it back to the same predictions.
  layers::sequential other = keras_architecture("_copy");
  (void)other(x);
  other.load_weights(ours);
  CHECK(other(x).to_vector<float>() == model(x).to_vector<float>());
  std::filesystem::remove(ours);
}

TEST_CASE("weights that do not fit the model raise errors naming them") {
  const tensor x = to_tensor(keras_fixtures::model_input);
  SECTION("a wrongly shaped weight") {
    layers::sequential wide({layers::conv2d(4, 3, {.activation = kiln::relu}), layers::batch_normalization(),
                             layers::max_pooling2d(2), layers::flatten(), layers::dense(6, {.name = "wide"}), layers::dense(3)});
    (void)wide(x);
    CHECK_THROWS_WITH(wide.load_weights(keras_file), Catch::Contains("dense/dense/kernel:0") && Catch::Contains("(16, 5)") &&
                                                         Catch::Contains("wide/kernel") && Catch::Contains("(16, 6)"));
  }
  SECTION("a layer too few") {
    layers::sequential short_model({layers::conv2d(4, 3), layers::flatten(), layers::dense(3)});
    (void)short_model(x);
    CHECK_THROWS_AS(short_model.load_weights(keras_file), kiln::value_error);
    CHECK_THROWS_WITH(short_model.load_weights(keras_file), Catch::Contains("4 layers with weights"));
  }
  SECTION("a model not built") {
    layers::sequential unbuilt = keras_architecture("_unbuilt");
    CHECK_THROWS_WITH(unbuilt.load_weights(keras_file), Catch::Contains("not built"));
  }
  SECTION("nothing changes when a file does not fit") {
    layers::dense d(2);
    (void)d(kiln::ones({1, 16}));
    const std::vector<float> before = d.kernel().read_value().to_vector<float>();
    CHECK_THROWS(d.load_weights(keras_file));
    CHECK(d.kernel().read_value().to_vector<float>() == before);
  }
}

TEST_CASE("missing, truncated and corrupt files raise kiln errors naming them") {
  layers::dense d(2);
  (void)d(kiln::ones({1, 3}));
  CHECK_THROWS_WITH(d.load_weights(temp_path("no_such_file.h5")), Catch::Contains("no_such_file.h5"));
  const std::string path = temp_path("kiln_dense.weights.h5");
  d.save_weights(path);
  const auto size = std::filesystem::file_size(path);
  std::string bytes(size, '\0');
  {
    std::ifstream in(path, std::ios::binary);
    in.read(bytes.data(), std::streamsize(size));
  }
  const std::string truncated = temp_path("kiln_truncated.h5"), corrupt = temp_path("kiln_corrupt.h5");
  std::ofstream(truncated, std::ios::binary).write(bytes.data(), std::streamsize(size / 2));
  std::string flipped = bytes;
  for (std::size_t k = 0; k < 64; ++k) flipped[k] = char(~flipped[k]);  // the superblock
  std::ofstream(corrupt, std::ios::binary).write(flipped.data(), std::streamsize(size));
  for (const std::string& bad : {truncated, corrupt}) {
    INFO(bad);
    try {
      d.load_weights(bad);
      FAIL("no error");
    } catch (const kiln::error& e) {
      CHECK_THAT(e.what(), Catch::Contains(bad));
    }
  }
  for (const std::string& p : {path, truncated, corrupt}) std::filesystem::remove(p);
}

TEST_CASE("a checkpoint restores a model and its optimizer so that training goes on bit for bit") {
  const tensor x = kiln::reshape(kiln::range(-1.f, 1.f, 0.125f), {8, 2});
  const tensor y = kiln::reduce_sum(kiln::square(x), 1, true);
  auto make = [] {
    return layers::sequential({layers::dense(6, {.activation = kiln::tanh}), layers::batch_normalization(), layers::dense(1)});
  };
  auto train = [&](layers::sequential& model, kiln::optimizers::adam& opt, int steps) {
    kiln::function step([&](const tensor& a, const tensor& b) {
      kiln::gradient_tape tape;
      const tensor loss = kiln::losses::mean_squared_error(b, model(a, {.training = true}));
      const std::vector<kiln::variable> vars = model.trainable_variables();
      opt.apply_gradients(tape.gradient(loss, vars), vars);
      return loss;
    });
    for (int i = 0; i < steps; ++i) (void)step(x, y);
  };
  layers::sequential first = make();
  kiln::optimizers::adam opt_first({.learning_rate = 0.05});
  train(first, opt_first, 3);
  const std::string path = temp_path("kiln_run.ckpt.h5");
  kiln::checkpoint(first, opt_first).save(path);
  train(first, opt_first, 4);

  // Another model and optimizer, as a new process would make them.
  layers::sequential second = make();
  (void)second(x);
  kiln::optimizers::adam opt_second({.learning_rate = 0.05});
  kiln::checkpoint(second, opt_second).restore(path);
  CHECK(opt_second.iterations().read_value().item<std::int64_t>() == 3);
  train(second, opt_second, 4);
  const std::vector<kiln::variable> a = first.variables(), b = second.variables();
  REQUIRE(a.size() == b.size());
  for (std::size_t k = 0; k < a.size(); ++k) {
    INFO(a[k].name());
    CHECK(a[k].read_value().to_vector<float>() == b[k].read_value().to_vector<float>());
  }
  CHECK(opt_first.iterations().read_value().item<std::int64_t>() == opt_second.iterations().read_value().item<std::int64_t>());

  // Into another architecture: the variable that does not fit is named.
  layers::sequential other({layers::dense(7, {.name = "other"}), layers::dense(1)});
  (void)other(x);
  kiln::optimizers::adam opt_other;
  CHECK_THROWS_WITH(kiln::checkpoint(other, opt_other).restore(path),
                    Catch::Contains("other/kernel") && Catch::Contains("(2, 7)") && Catch::Contains("(2, 6)"));
  std::filesystem::remove(path);
}
