// A model's variables work where every kiln::variable does: a function that calls
// kiln layers saves with kiln::save and runs the same in the loaded program.

#include <catch2/catch.hpp>

#include <cstdio>
#include <filesystem>
#include <string>

#include <kiln/kiln.hpp>
#include <kiln/saved_function.hpp>

TEST_CASE("a function calling layers saves and loads with their weights") {
  namespace layers = kiln::layers;
  layers::sequential model({layers::dense(4, {.activation = kiln::gelu}), layers::layer_normalization(),
                            layers::dense(2, {.activation = kiln::softplus})});
  kiln::function f([&](const kiln::tensor& x) { return model(x); });
  const kiln::tensor x = kiln::reshape(kiln::range(0.f, 6.f), {2, 3});
  const kiln::tensor expected = f(x);
  const std::string path = (std::filesystem::temp_directory_path() / "kiln_layers.kiln").string();
  kiln::save(f, path, kiln::tensor_spec({kiln::none, 3}, kiln::float32));
  kiln::loaded_function loaded = kiln::load(path);
  CHECK(loaded(x).to_vector<float>() == expected.to_vector<float>());
  // The loaded function's variables are named with their layers' scopes.
  const std::string kernel = model.layers()[0].name() + "/kernel";
  CHECK_NOTHROW(loaded.variable(kernel));
  std::filesystem::remove(path);
}
