#!/usr/bin/env python3
"""Checks that Keras 2.12 loads a weights file kiln wrote: builds the architecture of
keras_model.h5 in Keras, loads FILE (kiln's copy of those weights, as the
keras_weights example or the weights test writes it) and compares its predictions on
the fixture's input with Keras' own file's. Needs TensorFlow 2.12, so it is run by
hand (CI checks kiln's layout against Keras' file instead):

    python3 test/weights/check_keras_loads.py FILE
"""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

L = tf.keras.layers


def model():
    return tf.keras.Sequential([
        L.Conv2D(4, 3, activation="relu", input_shape=(6, 6, 2)), L.BatchNormalization(), L.MaxPooling2D(2),
        L.Flatten(), L.Dense(5, activation="gelu"), L.Dense(3)])


here = os.path.dirname(os.path.abspath(__file__))
x = np.linspace(-1, 1, 2 * 6 * 6 * 2, dtype=np.float32).reshape(2, 6, 6, 2)
keras = model()
keras.load_weights(os.path.join(here, "keras_model.h5"))
ours = model()
ours.load_weights(sys.argv[1])
difference = float(np.max(np.abs(keras(x).numpy() - ours(x).numpy())))
print("largest difference:", difference)
sys.exit(0 if difference == 0.0 else 1)
