#!/usr/bin/env python3
"""The peers of bench_models.cpp's `cnn_train_step`: the same Keras-style CNN
(conv2d 3x3x32 ReLU, max-pooling 2, flatten, dense 10; batch 32 of 28x28x1, the same
images and labels; sparse categorical cross-entropy from logits; Adam 1e-3) trained by
tf.function (Keras layers and optimizer) and by PyTorch eager (channels-last), on 1
and 2 threads. Prints one line per peer and thread count: the median time per step
over 7 repetitions of 50 steps. Run with a Python that has TensorFlow 2.12 and/or
torch (each peer found is timed):

    python3 bench/peers_models.py              # every peer, 1 and 2 threads
    python3 bench/peers_models.py tensorflow 2 # one peer, one thread count
"""
import math
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np  # noqa: E402

BATCH = 32
x = np.array([0.5 + 0.5 * math.sin(0.011 * i) for i in range(BATCH * 28 * 28)], np.float32).reshape(BATCH, 28, 28, 1)
y = np.array([r * 3 % 10 for r in range(BATCH)], np.int32)


def median_ms(step, steps=50, repetitions=7):
    for _ in range(5):
        step()
    times = []
    for _ in range(repetitions):
        start = time.perf_counter()
        for _ in range(steps):
            step()
        times.append((time.perf_counter() - start) / steps * 1e3)
    return statistics.median(times), (max(times) - min(times)) / 2 / statistics.median(times)


def tensorflow_peer(threads):
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    L = tf.keras.layers
    model = tf.keras.Sequential([L.Conv2D(32, 3, activation="relu", input_shape=(28, 28, 1)), L.MaxPooling2D(2),
                                 L.Flatten(), L.Dense(10)])
    opt = tf.keras.optimizers.Adam(1e-3)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    tx, ty = tf.constant(x), tf.constant(y)

    @tf.function
    def step(a, b):
        with tf.GradientTape() as tape:
            loss = loss_fn(b, model(a, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    return median_ms(lambda: step(tx, ty).numpy())


def torch_peer(threads):
    import torch
    torch.set_num_threads(threads)
    conv = torch.nn.Conv2d(1, 32, 3).to(memory_format=torch.channels_last)
    dense = torch.nn.Linear(13 * 13 * 32, 10)
    params = list(conv.parameters()) + list(dense.parameters())
    opt = torch.optim.Adam(params, lr=1e-3, eps=1e-7)
    tx = torch.from_numpy(x).permute(0, 3, 1, 2).contiguous(memory_format=torch.channels_last)
    ty = torch.from_numpy(y).long()

    def step():
        opt.zero_grad()
        h = torch.nn.functional.max_pool2d(torch.relu(conv(tx)), 2)
        logits = dense(h.permute(0, 2, 3, 1).reshape(BATCH, -1))  # NHWC order, as Keras flattens
        loss = torch.nn.functional.cross_entropy(logits, ty)
        loss.backward()
        opt.step()
        return loss.item()

    return median_ms(step)


PEERS = {"tensorflow": tensorflow_peer, "torch_py": torch_peer}

if len(sys.argv) == 3:
    # One peer on one thread count: TensorFlow fixes its thread pools once per process.
    name, threads = sys.argv[1], int(sys.argv[2])
    try:
        ms, spread = PEERS[name](threads)
    except ImportError as e:
        print(f"cnn_train_step/{name}/threads:{threads}: not available ({e})", file=sys.stderr)
        sys.exit(0)
    print(f"cnn_train_step/{name}/threads:{threads} {ms:.3f} ms +-{100 * spread:.0f}%", flush=True)
else:
    import subprocess
    for name in PEERS:
        for threads in (1, 2):
            subprocess.run([sys.executable, __file__, name, str(threads)], check=True)
