#!/usr/bin/env python3
"""The Python peers of kiln's benchmark suite: PyTorch, TensorFlow and JAX on the same
cases and shapes as the C++ program (bench/kiln_bench), timed with timeit.

One process runs one library at one thread count, because TensorFlow and JAX fix
their thread pools at start-up. The output is a JSON file in Google Benchmark's
layout (one entry per repetition, named <case>/<peer>/threads:<n>, times in ns,
bytes_per_second / flops counters), so report.py reads both the same way.

    python3 bench/peers.py --library torch --threads 2 --repetitions 5 --out torch_2.json
"""

import argparse
import functools
import json
import os
import platform
import sys
import timeit

LARGE_SIZE = 1 << 24
TINY_SIZE = 10
MATMUL_SIZE = 1024
CONV_INPUT = (1, 200, 200, 100)  # NHWC
CONV_FILTERS = (3, 3, 100, 100)  # HWIO
CONV_OUTPUT = (1, 198, 198, 100)
FLOAT_BYTES = 4

ADD_BYTES = 3 * LARGE_SIZE * FLOAT_BYTES  # two reads and one write
SUM_BYTES = LARGE_SIZE * FLOAT_BYTES
MATMUL_FLOPS = 2.0 * MATMUL_SIZE ** 3
CONV_FLOPS = 2.0 * CONV_OUTPUT[1] * CONV_OUTPUT[2] * CONV_OUTPUT[3] * 9 * CONV_INPUT[3]
CHAIN_BYTES = 2 * LARGE_SIZE * FLOAT_BYTES  # one read and one write
POWER_SIZE, POWER_EXPONENT = 10, 100
LOOP_TRIPS = 4096  # while_scalar's iterations per call


TRAIN_BATCH, TRAIN_WIDTHS, TRAIN_CLASSES = 128, (784, 256, 256, 10), 10
ADAM = {"learning_rate": 1e-3, "beta_1": 0.9, "beta_2": 0.999, "epsilon": 1e-7}


def training_data():
    """train_step_mlp's data and first weights, the formulas of bench_training.cpp:
    (x, labels, [w1, b1, w2, b2, w3, b3]) as float32 / int32 NumPy arrays."""
    import numpy

    x = 0.5 + 0.5 * numpy.sin(0.013 * numpy.arange(TRAIN_BATCH * TRAIN_WIDTHS[0]))
    labels = numpy.arange(TRAIN_BATCH) * 7 % TRAIN_CLASSES
    weights = []
    for layer, (n_in, n_out) in enumerate(zip(TRAIN_WIDTHS, TRAIN_WIDTHS[1:])):
        w = 0.05 * numpy.sin(0.37 * numpy.arange(n_in * n_out) + layer + 1)
        weights += [w.astype(numpy.float32).reshape(n_in, n_out), numpy.zeros(n_out, numpy.float32)]
    return x.astype(numpy.float32).reshape(TRAIN_BATCH, -1), labels.astype(numpy.int32), weights


def training_losses(epsilon_convention):
    """The losses of train_step_mlp's first two steps in float64 NumPy: forward, the
    backward pass by hand, Adam. Keras (and kiln) add epsilon to sqrt(v) before the
    bias corrections, PyTorch and Optax after them ("keras" or "pytorch")."""
    import numpy

    x, labels, weights = training_data()
    params = [w.astype(numpy.float64) for w in weights]
    m = [numpy.zeros_like(p) for p in params]
    v = [numpy.zeros_like(p) for p in params]
    b1, b2, lr, eps = ADAM["beta_1"], ADAM["beta_2"], ADAM["learning_rate"], ADAM["epsilon"]
    losses = []
    for step in (1, 2):
        inputs = [x.astype(numpy.float64)]
        for layer in range(3):
            z = inputs[-1] @ params[2 * layer] + params[2 * layer + 1]
            inputs.append(numpy.maximum(z, 0) if layer < 2 else z)
        logits = inputs.pop()
        shifted = logits - logits.max(axis=1, keepdims=True)
        probabilities = numpy.exp(shifted) / numpy.exp(shifted).sum(axis=1, keepdims=True)
        rows = numpy.arange(TRAIN_BATCH)
        losses.append(float(-numpy.log(probabilities[rows, labels]).mean()))
        dz = probabilities
        dz[rows, labels] -= 1
        dz /= TRAIN_BATCH
        grads = [None] * 6
        for layer in (2, 1, 0):
            a = inputs[layer]
            grads[2 * layer], grads[2 * layer + 1] = a.T @ dz, dz.sum(axis=0)
            dz = (dz @ params[2 * layer].T) * (a > 0)
        for i, g in enumerate(grads):
            m[i] = b1 * m[i] + (1 - b1) * g
            v[i] = b2 * v[i] + (1 - b2) * g * g
            c1, c2 = 1 - b1**step, 1 - b2**step
            if epsilon_convention == "keras":
                params[i] -= lr * numpy.sqrt(c2) / c1 * m[i] / (numpy.sqrt(v[i]) + eps)
            else:
                params[i] -= lr * (m[i] / c1) / (numpy.sqrt(v[i] / c2) + eps)
    return losses


def function_cases(m):
    """The functions of bench_function.cpp by case name, written once over a tensor
    library `m` (torch, tensorflow, jax.numpy or numpy, which name these ops alike).
    They are made anew on every call, so that a tracer that caches per function object
    starts afresh."""

    def call_x2(x):
        return x * x + 2

    def rounds_of_five_ops(x, y, rounds: int):
        # Each round has its own constants: no common subexpression, no identity.
        for i in range(rounds):
            x = m.maximum(m.tanh(x * (0.9 - 0.02 * i) + y) - (0.1 + 0.01 * i), y)
        return x

    # Literal round counts: TorchScript does not read Python globals.
    def ops50(x, y):
        return rounds_of_five_ops(x, y, 10)

    def ops20(x, y):
        return rounds_of_five_ops(x, y, 4)

    def chain(x):
        return m.tanh(x * 0.5 + 1) * x - 0.25

    def power(x):
        # The guides' power(x, 100): an unrolled loop of int32 matmuls.
        result = m.eye(POWER_SIZE, dtype=m.int32)
        for _ in range(100):
            result = m.matmul(x, result)
        return result

    return {"call_x2": call_x2, "ops50_10": ops50, "chain_16M": chain, "trace_20": ops20, "power_100": power}


def power_input(m):
    """power_100's 10x10 input, the pattern of bench_function.cpp: (i * 7 + 3) % 3 - 1."""
    import numpy

    values = (numpy.arange(POWER_SIZE * POWER_SIZE) * 7 + 3) % 3 - 1
    return m.asarray(values.reshape(POWER_SIZE, POWER_SIZE).astype(numpy.int32))


def loop_expected():
    """while_scalar's total: 0.5 * (0 + 1 + ... + LOOP_TRIPS - 1), exact in float32."""
    return 0.5 * LOOP_TRIPS * (LOOP_TRIPS - 1) / 2


def function_calls(peer, functions, inputs, wait=lambda result: result):
    """The calls of call_x2, ops50_10 and chain_16M as (case, peer, fn, work): `functions`
    and `inputs` map each case to its callable (compiled or eager) and its arguments;
    `wait` returns a result once it is computed. work["expected"] computes the result
    with NumPy, which main() checks the peer against before timing it."""
    import numpy

    for case, args in inputs.items():
        f = functions[case]
        work = {"bytes": CHAIN_BYTES} if case == "chain_16M" else {}
        work["expected"] = lambda case=case, args=args: function_cases(numpy)[case](*map(numpy.asarray, args))
        yield case, peer, lambda f=f, args=args: wait(f(*args)), work


# train_step_mlp: each library's usual way to train, returned as a callable that runs
# one step and returns its loss. Each runs first in its library's cases, so that a
# process that runs it alone (--only) measures its memory before other cases allocate.


def status_mib(key):
    """A line of /proc/self/status in MiB (VmRSS: resident now, VmHWM: the peak)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


def training_case(peer, setup, epsilon_convention):
    """The case tuple of a training step, with the memory resident before its setup."""
    before = status_mib("VmRSS")
    work = {"expected_losses": lambda: training_losses(epsilon_convention), "resident_before": before}
    return "train_step_mlp", peer, setup(), work


def torch_training():
    """PyTorch eager with torch.optim.Adam (torch.compile needs PyTorch 2)."""
    import torch

    x, labels, weights = training_data()
    x, labels = torch.from_numpy(x), torch.from_numpy(labels).long()
    params = [torch.from_numpy(w).requires_grad_() for w in weights]
    optimizer = torch.optim.Adam(params, lr=ADAM["learning_rate"], betas=(ADAM["beta_1"], ADAM["beta_2"]),
                                 eps=ADAM["epsilon"])

    def train_step():
        optimizer.zero_grad(set_to_none=True)
        h = x
        for layer in range(3):
            h = torch.addmm(params[2 * layer + 1], h, params[2 * layer])
            if layer < 2:
                h = torch.relu(h)
        loss = torch.nn.functional.cross_entropy(h, labels)
        loss.backward()
        optimizer.step()
        return loss.item()

    return train_step


def tensorflow_training():
    """tf.function over a GradientTape and Keras' Adam, traced in the first call."""
    import tensorflow as tf

    x, labels, weights = training_data()
    x, labels = tf.constant(x), tf.constant(labels)
    params = [tf.Variable(w) for w in weights]
    optimizer = tf.keras.optimizers.Adam(**ADAM)

    @tf.function
    def train_step(x, labels):
        with tf.GradientTape() as tape:
            h = x
            for layer in range(3):
                h = tf.matmul(h, params[2 * layer]) + params[2 * layer + 1]
                if layer < 2:
                    h = tf.nn.relu(h)
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=h))
        optimizer.apply_gradients(zip(tape.gradient(loss, params), params))
        return loss

    return lambda: float(train_step(x, labels))


def jax_training():
    """jax.jit of value_and_grad and Adam as Optax's (written out: Optax is not
    installed here), with the state donated so XLA may update it in place."""
    import jax
    import jax.numpy as jnp

    def loss_of(params, x, labels):
        h = x
        for layer in range(3):
            h = h @ params[2 * layer] + params[2 * layer + 1]
            if layer < 2:
                h = jax.nn.relu(h)
        return -jnp.take_along_axis(jax.nn.log_softmax(h), labels[:, None], axis=1).mean()

    @functools.partial(jax.jit, donate_argnums=0)
    def train_step(state, x, labels):
        params, m, v, step = state
        loss, grads = jax.value_and_grad(loss_of)(params, x, labels)
        step = step + 1
        b1, b2, lr, eps = ADAM["beta_1"], ADAM["beta_2"], ADAM["learning_rate"], ADAM["epsilon"]
        m = [b1 * mi + (1 - b1) * g for mi, g in zip(m, grads)]
        v = [b2 * vi + (1 - b2) * g * g for vi, g in zip(v, grads)]
        params = [p - lr * (mi / (1 - b1**step)) / (jnp.sqrt(vi / (1 - b2**step)) + eps)
                  for p, mi, vi in zip(params, m, v)]
        return (params, m, v, step), loss

    x, labels, weights = training_data()
    x, labels = jnp.asarray(x), jnp.asarray(labels)
    params = [jnp.asarray(w) for w in weights]
    state = [(params, [jnp.zeros_like(p) for p in params], [jnp.zeros_like(p) for p in params], jnp.float32(0))]

    def run_train_step():
        state[0], loss = train_step(state[0], x, labels)
        return float(loss)

    return run_train_step


def torch_cases(threads):
    """Eager PyTorch ops (peer torch_py; conv2d runs channels-last, which oneDNN prefers),
    and the function cases also through TorchScript: torch.jit.script compiled before
    timing, and torch.jit.trace timed itself for trace_20."""
    import torch

    torch.set_num_threads(threads)
    yield training_case("torch_py", torch_training, "pytorch")

    a, b = torch.rand(LARGE_SIZE), torch.rand(LARGE_SIZE)
    ma, mb = torch.rand(MATMUL_SIZE, MATMUL_SIZE), torch.rand(MATMUL_SIZE, MATMUL_SIZE)
    # An NHWC buffer seen as NCHW is the channels-last layout.
    x = torch.rand(CONV_INPUT).permute(0, 3, 1, 2)
    w = torch.rand(CONV_FILTERS).permute(3, 2, 0, 1).contiguous(memory_format=torch.channels_last)
    ta, tb = torch.rand(TINY_SIZE), torch.rand(TINY_SIZE)
    conv = torch.nn.functional.conv2d
    yield "add_16M", "torch_py", lambda: torch.add(a, b), {"bytes": ADD_BYTES}
    yield "reduce_sum_16M", "torch_py", lambda: torch.sum(a).item(), {"bytes": SUM_BYTES}
    yield "matmul_1024", "torch_py", lambda: torch.matmul(ma, mb), {"flops": MATMUL_FLOPS}
    yield "conv2d_seed", "torch_py", lambda: conv(x, w), {"flops": CONV_FLOPS}
    yield "add_10", "torch_py", lambda: torch.add(ta, tb), {}

    inputs = {"call_x2": (torch.tensor(3.0),), "ops50_10": (ta, tb), "chain_16M": (a,)}
    eager = function_cases(torch)
    yield from function_calls("torch_py", eager, {**inputs, "power_100": (power_input(torch),)})

    def scalar_loop(n):
        i, total = torch.tensor(0), torch.tensor(0.0)
        while i < n:
            total = total + i.float() * 0.5
            i = i + 1
        return total

    n = torch.tensor(LOOP_TRIPS)
    yield "while_scalar", "torch_py", lambda: scalar_loop(n), {"expected": loop_expected}
    yield from function_calls("torchscript", {case: torch.jit.script(eager[case]) for case in inputs}, inputs)
    # check_trace=False: the check runs the traced function again, which kiln's trace does not.
    trace = lambda: torch.jit.trace(function_cases(torch)["trace_20"], (ta, tb), check_trace=False)  # noqa: E731
    yield "trace_20", "torchscript_trace", trace, {}



def tensorflow_cases(threads):
    """Eager TensorFlow ops for the op cases (tf.function is not what kiln's eager ops are
    compared with), tf.function for the function cases: traced before timing, and
    traced anew (get_concrete_function) in every call of trace_20."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    yield training_case("tensorflow", tensorflow_training, "keras")

    rand = tf.random.uniform
    a, b = rand([LARGE_SIZE]), rand([LARGE_SIZE])
    ma, mb = rand([MATMUL_SIZE] * 2), rand([MATMUL_SIZE] * 2)
    x, w = rand(CONV_INPUT), rand(CONV_FILTERS)
    ta, tb = rand([TINY_SIZE]), rand([TINY_SIZE])
    # .numpy() on a scalar, or a host sync, waits for the op; TF's eager CPU ops
    # already run synchronously, so the big results are not copied out.
    yield "add_16M", "tensorflow", lambda: tf.add(a, b), {"bytes": ADD_BYTES}
    yield "reduce_sum_16M", "tensorflow", lambda: tf.reduce_sum(a).numpy(), {"bytes": SUM_BYTES}
    yield "matmul_1024", "tensorflow", lambda: tf.linalg.matmul(ma, mb), {"flops": MATMUL_FLOPS}
    yield "conv2d_seed", "tensorflow", lambda: tf.nn.conv2d(x, w, strides=1, padding="VALID"), {"flops": CONV_FLOPS}
    yield "add_10", "tensorflow", lambda: tf.add(ta, tb), {}

    inputs = {"call_x2": (tf.constant(3.0),), "ops50_10": (ta, tb), "chain_16M": (a,)}
    inputs["power_100"] = (tf.constant(power_input(numpy)),)
    compiled = {case: tf.function(f) for case, f in function_cases(tf).items() if case in inputs}
    yield from function_calls("tensorflow", compiled, inputs)

    @tf.function
    def scalar_loop(n):
        i, total = tf.constant(0), tf.constant(0.0)
        while i < n:  # AutoGraph makes this a tf.while_loop
            total += tf.cast(i, tf.float32) * 0.5
            i += 1
        return total

    n = tf.constant(LOOP_TRIPS)
    yield "while_scalar", "tensorflow", lambda: scalar_loop(n).numpy(), {"expected": loop_expected}
    spec = tf.TensorSpec([TINY_SIZE], tf.float32)
    trace = lambda: tf.function(function_cases(tf)["trace_20"]).get_concrete_function(spec, spec)  # noqa: E731
    yield "trace_20", "tensorflow", trace, {}


def jax_cases(threads):
    """jax.jit-compiled functions (JAX's usual mode), waited on with block_until_ready.
    XLA sizes its pool from the CPUs the process may use: run.sh pins 1-thread runs."""
    import jax
    import jax.numpy as jnp

    yield training_case("jax", jax_training, "pytorch")


    key = jax.random.PRNGKey(0)
    rand = lambda shape: jax.random.uniform(key, shape, dtype=jnp.float32)  # noqa: E731
    a, b = rand((LARGE_SIZE,)), rand((LARGE_SIZE,))
    ma, mb = rand((MATMUL_SIZE, MATMUL_SIZE)), rand((MATMUL_SIZE, MATMUL_SIZE))
    x, w = rand(CONV_INPUT), rand(CONV_FILTERS)
    ta, tb = rand((TINY_SIZE,)), rand((TINY_SIZE,))
    add = jax.jit(jnp.add)
    total = jax.jit(jnp.sum)
    matmul = jax.jit(jnp.matmul)
    conv = jax.jit(
        lambda x, w: jax.lax.conv_general_dilated(x, w, (1, 1), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC"))
    )
    yield "add_16M", "jax", lambda: add(a, b).block_until_ready(), {"bytes": ADD_BYTES}
    yield "reduce_sum_16M", "jax", lambda: float(total(a)), {"bytes": SUM_BYTES}
    yield "matmul_1024", "jax", lambda: matmul(ma, mb).block_until_ready(), {"flops": MATMUL_FLOPS}
    yield "conv2d_seed", "jax", lambda: conv(x, w).block_until_ready(), {"flops": CONV_FLOPS}
    yield "add_10", "jax", lambda: add(ta, tb).block_until_ready(), {}

    inputs = {"call_x2": (jnp.float32(3.0),), "ops50_10": (ta, tb), "chain_16M": (a,)}
    inputs["power_100"] = (power_input(jnp),)
    compiled = {case: jax.jit(f) for case, f in function_cases(jnp).items() if case in inputs}
    yield from function_calls("jax", compiled, inputs, wait=lambda result: result.block_until_ready())

    @jax.jit
    def scalar_loop(n):
        step = lambda state: (state[0] + 1, state[1] + state[0].astype(jnp.float32) * 0.5)  # noqa: E731
        return jax.lax.while_loop(lambda state: state[0] < n, step, (jnp.int32(0), jnp.float32(0)))[1]

    n = jnp.int32(LOOP_TRIPS)
    yield "while_scalar", "jax", lambda: scalar_loop(n).block_until_ready(), {"expected": loop_expected}



# Each library's generator yields (case, peer, fn, work) for every case it runs.
LIBRARIES = {
    "torch": torch_cases,
    "tensorflow": tensorflow_cases,
    "jax": jax_cases,
}
# The cases a thread count applies to, as in the C++ program.
CASES_BY_THREADS = {
    1: {"add_16M", "reduce_sum_16M", "matmul_1024", "add_10", "call_x2", "ops50_10", "chain_16M", "trace_20", "power_100",
        "while_scalar", "train_step_mlp"},
    2: {"add_16M", "reduce_sum_16M", "matmul_1024", "conv2d_seed", "chain_16M", "train_step_mlp"},
}


def same_values(result, expected, tolerance=1e-5):
    """Whether a peer's result equals NumPy's to within `tolerance`, relative and
    absolute: float32 rounding by default (vectorised tanh approximations differ from
    NumPy's in the last bits)."""
    import numpy

    return numpy.allclose(numpy.asarray(result), expected, rtol=tolerance, atol=tolerance)


def time_per_call(fn, repetitions, min_seconds):
    """Median-ready samples: each repetition times as many calls as fill min_seconds."""
    timer = timeit.Timer(fn)
    fn()  # warm up: first-call compilation, allocator and thread-pool start-up
    number = 1
    while timer.timeit(number) < min_seconds:
        number *= 2
    return [timer.timeit(number) / number for _ in range(repetitions)]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--library", choices=sorted(LIBRARIES), required=True)
    parser.add_argument("--threads", type=int, choices=sorted(CASES_BY_THREADS), required=True)
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--min-time", type=float, default=0.2, help="seconds per repetition")
    parser.add_argument("--out", required=True)
    parser.add_argument("--only", help="run this case alone (and then stop: its peak memory is its own)")
    args = parser.parse_args()

    cases = LIBRARIES[args.library]
    module = __import__(args.library)
    entries = []
    for case, peer, fn, work in cases(args.threads):
        if case not in CASES_BY_THREADS[args.threads] or (args.only and case != args.only):
            continue
        name = f"{case}/{peer}/threads:{args.threads}"
        if "expected" in work and not same_values(fn(), work["expected"]()):
            print(f"{name}: result differs from NumPy's; not timed", file=sys.stderr)
            continue
        # A training step's first two losses: the model, and its first update.
        if "expected_losses" in work and not same_values([fn(), fn()], work["expected_losses"](), 1e-4):
            print(f"{name}: losses differ from NumPy's; not timed", file=sys.stderr)
            continue
        for seconds in time_per_call(fn, args.repetitions, args.min_time):
            entry = {"name": name, "run_type": "iteration", "real_time": seconds * 1e9, "time_unit": "ns"}
            if "bytes" in work:
                entry["bytes_per_second"] = work["bytes"] / seconds
            if "flops" in work:
                entry["flops"] = work["flops"] / seconds
            if "resident_before" in work:
                entry["peak_rss_mb"] = status_mib("VmHWM") - work["resident_before"]
            entries.append(entry)
        print(f"{name}: {sorted(e['real_time'] for e in entries if e['name'] == name)[args.repetitions // 2]:.0f} ns",
              file=sys.stderr)
        if args.only:
            break  # the library's other cases would allocate their inputs

    context = {
        "library": args.library,
        "library_version": getattr(module, "__version__", "unknown"),
        "python": platform.python_version(),
        "threads": args.threads,
        "affinity": sorted(os.sched_getaffinity(0)),
    }
    with open(args.out, "w") as f:
        json.dump({"context": context, "benchmarks": entries}, f, indent=1)


if __name__ == "__main__":
    main()
