#!/usr/bin/env python3
"""Writes keras_fixtures.hpp beside this script: Keras 2.12 layers' weights, inputs
and outputs, as C++ arrays the layer tests compare kiln's layers with; and
test/weights/keras_model.h5, the weights Keras saves for a small
Conv2D + BatchNormalization + Dense model, with the model's outputs on fixed inputs
(in keras_fixtures.hpp), so that the tests need no TensorFlow. Run with TensorFlow
2.12 (pip install tensorflow-cpu==2.12.1):

    python3 test/models/make_keras_fixtures.py
"""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

assert tf.__version__.startswith("2.12"), tf.__version__
rng = np.random.default_rng(2026)
tf.keras.utils.set_random_seed(2026)  # the unseeded initializers too: the same file at every run
cases = []


def uniform(*shape, lo=-1.0, hi=1.0):
    return rng.uniform(lo, hi, size=shape).astype(np.float32)


def case(name, layer, x, weights=None, training=False, after_training=False):
    """Calls `layer` on x once to build it, sets `weights` (or keeps Keras' seeded
    ones), and records the weights, the input and the output (and, with
    `after_training`, the weights after that call)."""
    layer(x)
    if weights is not None:
        layer.set_weights(weights)
    w = [v.numpy() for v in layer.weights]
    y = layer(x, training=training).numpy()
    entry = {"name": name, "input": x, "weights": w, "output": y}
    if after_training:
        entry["weights_after"] = [v.numpy() for v in layer.weights]
    cases.append(entry)


L = tf.keras.layers
case("dense_relu", L.Dense(4, activation="relu", kernel_initializer=tf.keras.initializers.GlorotUniform(1),
                                 bias_initializer=tf.keras.initializers.RandomUniform(-1, 1, 2)), uniform(3, 5))
case("dense_rank3_gelu", L.Dense(2, activation="gelu", bias_initializer="ones"), uniform(2, 3, 4))
case("conv2d_valid", L.Conv2D(3, 3, bias_initializer=tf.keras.initializers.RandomUniform(-1, 1, 3)), uniform(2, 5, 6, 2))
case("conv2d_same_strides2_tanh",
     L.Conv2D(2, (3, 2), strides=2, padding="same", activation="tanh",
              bias_initializer=tf.keras.initializers.RandomUniform(-1, 1, 4)), uniform(1, 7, 6, 3))
case("max_pooling2d", L.MaxPooling2D(2), uniform(2, 5, 4, 3))
case("average_pooling2d", L.AveragePooling2D(2), uniform(1, 4, 6, 2))
case("flatten", L.Flatten(), uniform(2, 3, 2, 2))
bn_weights = [uniform(3, lo=0.5, hi=1.5), uniform(3), uniform(3), uniform(3, lo=0.5, hi=2.0)]
case("batch_normalization_inference", L.BatchNormalization(), uniform(6, 3), bn_weights)
case("batch_normalization_training", L.BatchNormalization(), uniform(6, 3), bn_weights, training=True, after_training=True)
bn4 = [uniform(2, lo=0.5, hi=1.5), uniform(2), uniform(2), uniform(2, lo=0.5, hi=2.0)]
case("batch_normalization_4d_training", L.BatchNormalization(momentum=0.9), uniform(2, 3, 3, 2), bn4, training=True,
     after_training=True)
case("layer_normalization", L.LayerNormalization(), uniform(3, 4), [uniform(4, lo=0.5, hi=1.5), uniform(4)])
case("embedding", L.Embedding(7, 3), np.array([[1, 0, 6, 3], [2, 2, 5, 4]], np.int32))

# A small model saved with model.save_weights: its layers' names are Keras' defaults in
# a fresh session (conv2d, batch_normalization, ...), which the kiln test gives its own.
tf.keras.backend.clear_session()
tf.keras.utils.set_random_seed(7)
model = tf.keras.Sequential([
    L.Conv2D(4, 3, activation="relu", input_shape=(6, 6, 2), name="conv2d"),
    L.BatchNormalization(name="batch_normalization"),
    L.MaxPooling2D(2, name="max_pooling2d"),
    L.Flatten(name="flatten"),
    L.Dense(5, activation="gelu", name="dense"),
    L.Dense(3, name="dense_1"),
])
bn = model.get_layer("batch_normalization")
bn.set_weights([uniform(4, lo=0.5, hi=1.5), uniform(4), uniform(4), uniform(4, lo=0.5, hi=2.0)])
model_input = uniform(2, 6, 6, 2)
model_output = model(model_input, training=False).numpy()
weights_dir = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "weights")
os.makedirs(weights_dir, exist_ok=True)
# Keras 2.12 writes its HDF5 layout for a name ending in .h5 (not .weights.h5, its newer format).
model.save_weights(os.path.join(weights_dir, "keras_model.h5"), save_format="h5")

# Pooling with strides other than the pool size and "same" padding (drawn after the
# model, so that the cases above keep their values).
case("max_pooling2d_same_strides1", L.MaxPooling2D(3, strides=1, padding="same"), uniform(2, 5, 4, 3))
case("average_pooling2d_same_strides2x1", L.AveragePooling2D((2, 3), strides=(2, 1), padding="same"),
     uniform(1, 5, 6, 2))
case("max_pooling2d_valid_strides3", L.MaxPooling2D(2, strides=3), uniform(1, 8, 7, 2))


def float_literal(v):
    text = f"{float(v):.9g}"
    return text + ("f" if "." in text or "e" in text else ".f")


def cpp_array(a):
    a = np.asarray(a)
    dims = ", ".join(str(d) for d in a.shape)
    kind = "int" if a.dtype.kind in "iu" else "float"
    values = ", ".join(repr(int(v)) if kind == "int" else float_literal(v) for v in a.reshape(-1))
    return f"{{{{{dims}}}, {{{values}}}}}"


lines = [
    "// Generated by make_keras_fixtures.py with TensorFlow " + tf.__version__ + "; do not edit.",
    "#pragma once",
    "#include <cstdint>",
    "#include <string>",
    "#include <vector>",
    "",
    "namespace keras_fixtures {",
    "",
    "/// A tensor's dims and its values, row-major.",
    "template <class T>",
    "struct array {",
    "  std::vector<std::int64_t> dims;",
    "  std::vector<T> values;",
    "};",
    "",
    "/// A Keras layer's input, weights (in Keras' order), output, and weights after the call.",
    "struct layer_case {",
    "  std::string name;",
    "  array<float> input;",
    "  array<int> ids;",
    "  std::vector<array<float>> weights;",
    "  array<float> output;",
    "  std::vector<array<float>> weights_after;",
    "};",
    "",
    "inline const std::vector<layer_case>& layer_cases() {",
    "  static const std::vector<layer_case> cases = {",
]
for c in cases:
    x = c["input"]
    is_int = np.asarray(x).dtype.kind in "iu"
    inp = "{}" if is_int else cpp_array(x)
    ids = cpp_array(x) if is_int else "{}"
    ws = ", ".join(cpp_array(w) for w in c["weights"])
    after = ", ".join(cpp_array(w) for w in c.get("weights_after", []))
    lines.append(f'      {{"{c["name"]}", {inp}, {ids}, {{{ws}}}, {cpp_array(c["output"])}, {{{after}}}}},')
lines += ["  };", "  return cases;", "}", ""]
lines += [
    "/// The input and output of the model whose weights are test/weights/keras_model.h5.",
    f"inline const array<float> model_input = {cpp_array(model_input)};",
    f"inline const array<float> model_output = {cpp_array(model_output)};",
    "",
    "}  // namespace keras_fixtures",
    "",
]
out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "keras_fixtures.hpp")
with open(out, "w") as f:
    f.write("\n".join(lines))
print("wrote", out)
