#!/usr/bin/env python3
"""Reads what kiln::summary writes with TensorBoard's own event reader and checks it.

    run_tensorboard.py TEST_EXECUTABLE LOGDIR VENV_DIR

TEST_EXECUTABLE is kiln_test_summary; its case "the TensorBoard check's log directory",
run with $KILN_SUMMARY_LOGDIR set to LOGDIR, writes there the summaries described
beside that case (test/summary/summary_test.cpp). This script loads the directory
with tensorboard's plugin event accumulator (the reader TensorBoard's server runs,
with its data-compatibility conversions) and checks that each dashboard finds its
tags, and every value and step against the formulas stated here; images are decoded
with zlib, the graph is parsed as a GraphDef.

tensorboard and numpy come from PyPI: when this Python lacks them, they are installed
into a virtual environment at VENV_DIR (made once), and the script runs again from
there.
"""

import os
import pathlib
import struct
import subprocess
import sys
import zlib

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from python_packages import ensure_packages  # noqa: E402

PACKAGES = ["tensorboard", "numpy"]
STEPS = range(5)


def png_pixels(png: bytes):
    """(width, height, color type, samples) of an 8-bit, unfiltered PNG."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    at, idat, header = 8, b"", None
    while at < len(png):
        (length,) = struct.unpack(">I", png[at:at + 4])
        kind, data = png[at + 4:at + 8], png[at + 8:at + 8 + length]
        (crc,) = struct.unpack(">I", png[at + 8 + length:at + 12 + length])
        assert crc == zlib.crc32(kind + data), "bad CRC in %r" % kind
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", data)
        elif kind == b"IDAT":
            idat += data
        at += 12 + length
    width, height, depth, color = header[:4]
    assert depth == 8
    raw = zlib.decompress(idat)
    channels = {0: 1, 4: 2, 2: 3, 6: 4}[color]
    row = width * channels
    samples = []
    for y in range(height):
        assert raw[y * (row + 1)] == 0, "a filtered row"
        samples += raw[y * (row + 1) + 1:(y + 1) * (row + 1)]
    return width, height, color, samples


def main() -> int:
    executable, logdir, venv = sys.argv[1], pathlib.Path(sys.argv[2]), pathlib.Path(sys.argv[3])
    ensure_packages(venv, PACKAGES)
    import numpy as np
    from tensorboard.backend.event_processing import plugin_event_accumulator as pea
    from tensorboard.compat.proto import graph_pb2
    from tensorboard.util import tensor_util

    subprocess.run([executable, "the TensorBoard check's log directory"], check=True,
                   env={**os.environ, "KILN_SUMMARY_LOGDIR": str(logdir)}, stdout=subprocess.DEVNULL)

    acc = pea.EventAccumulator(str(logdir), size_guidance={pea.TENSORS: 0, pea.GRAPH: 1})
    acc.Reload()
    failures = []

    def check(condition, what):
        if not condition:
            failures.append(what)

    def series(plugin, tag):
        check(tag in acc.PluginTagToContent(plugin), "%s is not among the %s plugin's tags" % (tag, plugin))
        events = acc.Tensors(tag)
        check([e.step for e in events] == list(STEPS), "%s: steps %s" % (tag, [e.step for e in events]))
        return [tensor_util.make_ndarray(e.tensor_proto) for e in events]

    for step, value in zip(STEPS, series("scalars", "loss")):
        check(value.dtype == np.float32 and value.shape == () and value == np.float32(step * 0.5 + 1),
              "loss at step %d: %r" % (step, value))
    for step, value in zip(STEPS, series("scalars", "count")):
        check(value == np.float32(step), "count at step %d: %r" % (step, value))

    # range(10) * (step + 1) in 5 buckets of width 9 * (step + 1) / 5: two values each
    # (the last bucket also takes the greatest value).
    for step, table in zip(STEPS, series("histograms", "values")):
        scale = step + 1
        edges = [0.0] + [i * (9.0 * scale / 5) for i in range(1, 5)] + [9.0 * scale]
        expected = np.array([[edges[i], edges[i + 1], 2.0] for i in range(5)])
        check(table.shape == (5, 3) and np.allclose(table, expected, rtol=1e-12, atol=0),
              "values at step %d:\n%s" % (step, table))

    for step, text in zip(STEPS, series("text", "phase")):
        check(text.item() == b"training", "phase at step %d: %r" % (step, text))
    for step, text in zip(STEPS, series("text", "note")):
        check(text.item() == b"step %d" % step, "note at step %d: %r" % (step, text))

    # 3 rows, 4 columns, RGB: sample (r, c, ch) = (r * 4 + c) / 11 * (ch + 1) / 3 in float32,
    # times 255.5, clamped to [0, 255] and truncated (tf.image.convert_image_dtype).
    index = (np.arange(12, dtype=np.float32).reshape(3, 4, 1) / np.float32(11))
    scale = np.array([1, 2, 3], dtype=np.float32) / np.float32(3)
    expected_pixels = np.clip(index * scale * np.float32(255.5), 0, 255).astype(np.uint8).reshape(-1).tolist()
    for step, strings in zip(STEPS, series("images", "gradient")):
        check(strings.shape == (3,) and strings[0] == b"4" and strings[1] == b"3",
              "gradient at step %d: width, height %r" % (step, strings[:2]))
        width, height, color, samples = png_pixels(strings[2])
        check((width, height, color) == (4, 3, 2), "gradient at step %d: PNG header %r" % (step, (width, height, color)))
        check(list(samples) == expected_pixels, "gradient at step %d: pixels %s" % (step, list(samples)))

    # The graph: x, reduce_sum, the constant 0, greater, cond, while and Identity (its
    # branches' and body's nodes are in the library: the cond's two branches and the
    # loop's condition and body).
    graph = graph_pb2.GraphDef.FromString(acc.SerializedGraph()) if hasattr(acc, "SerializedGraph") else acc.Graph()
    check(len(graph.node) == 7, "the graph has %d nodes: %s" % (len(graph.node), [n.name for n in graph.node]))
    ops = {n.op for n in graph.node}
    check({"Placeholder", "cond", "while", "Identity"} <= ops, "the graph's ops: %s" % sorted(ops))
    functions = {f.signature.name for f in graph.library.function}
    named = {n.attr[k].func.name for n in graph.node for k in ("then_branch", "else_branch", "cond", "body") if k in n.attr}
    check(len(functions) == 4 and named == functions, "library %s, named by nodes %s" % (functions, named))
    check(all("_output_shapes" in n.attr for n in graph.node), "a node without _output_shapes")

    for f in failures:
        print("FAILED:", f)
    print("%d checks failed" % len(failures) if failures else "TensorBoard read every value, step and the graph")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
