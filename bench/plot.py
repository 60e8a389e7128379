"""The figure of bench/RESULTS.md: one panel per case, each peer's median in the figure
the case's target is stated in (a share of the case's reference, or a time), kiln
highlighted, the target drawn as a dashed line. Called by report.py."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

KILN_COLOR = "#d95f02"
PEER_COLOR = "#7570b3"


def _panel(ax, title, bars, goal, xlabel, log=False):
    """bars: (label, value, is_kiln) from top to bottom."""
    if not bars:
        ax.set_title(title + " (no data)")
        ax.axis("off")
        return
    labels = [b[0] for b in bars]
    values = [b[1] for b in bars]
    colors = [KILN_COLOR if b[2] else PEER_COLOR for b in bars]
    positions = range(len(bars))[::-1]
    ax.barh(list(positions), values, color=colors)
    ax.set_yticks(list(positions), labels, fontsize=8)
    if goal is not None:
        ax.axvline(goal, color="black", linestyle="--", linewidth=1)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel, fontsize=8)
    if log:
        ax.set_xscale("log")
        ax.set_xlim(left=min(values) / 3)
    for y, v in zip(positions, values):
        ax.text(v, y, f" {v:.0f}" if v >= 10 else f" {v:.2f}", va="center", fontsize=7)


def _shares(s, case, reference, rate, scale=100.0):
    bars = []
    for threads in s.threads(case):
        ref = reference(s, threads)
        if ref is None:
            continue
        for r in s.peers(case, threads):
            bars.append((f"{r.peer} ({threads}t)", scale * rate(r) / rate(ref), r.peer.startswith("kiln")))
    return bars


def _per_call(s, case, unit_ns=1.0):
    """A one-thread case's times per call, in units of `unit_ns`."""
    return [(f"{r.peer} (1t)", r.time_ns / unit_ns, r.peer.startswith("kiln")) for r in s.peers(case, 1)]


def plot_results(s, path, copy_bandwidth, read_bandwidth, best_blas, loop_trips):
    """Writes the PNG at `path` from report.py's suite `s` and reference functions."""
    fig, axes = plt.subplots(7, 2, figsize=(12, 29))
    axes = axes.flatten()
    bandwidth = lambda r: r.bytes_per_second  # noqa: E731
    _panel(axes[0], "a + b, 16M float32", _shares(s, "add_16M", copy_bandwidth, bandwidth), 85,
           "% of best copy bandwidth (≤ same threads); target 85 %")
    _panel(axes[1], "reduce_sum, 16M float32", _shares(s, "reduce_sum_16M", read_bandwidth, bandwidth), 85,
           "% of read bandwidth (≤ same threads); target 85 %")
    _panel(axes[2], "matmul 1024³ float32", _shares(s, "matmul_1024", best_blas, lambda r: r.flops), 90,
           "% of best of OpenBLAS/Eigen GFLOP/s (same threads); target 90 %")
    torch_conv = lambda s, t: s.get("conv2d_seed", "libtorch", t)  # noqa: E731
    _panel(axes[3], "conv2d 1×200×200×100, 3×3×100→100", _shares(s, "conv2d_seed", torch_conv,
           lambda r: 1.0 / r.time_ns, scale=1.0), 1.0, "speed relative to libtorch (oneDNN); target ≥ 1")
    _panel(axes[4], "eager a + b, 10 float32", _per_call(s, "add_10"), 500, "ns per op (log); target ≤ 500 ns",
           log=True)
    bw = [(f"{r.case} {r.peer} ({t}t)", r.bytes_per_second / 1e9, False)
          for case in ("copy_64MiB", "read_64MiB") for t in s.threads(case) for r in s.peers(case, t)]
    _panel(axes[5], "bandwidth references", bw, None, "GB/s")
    _panel(axes[6], "function call: x * x + 2 on a scalar", _per_call(s, "call_x2"), 1000,
           "ns per call (log); target ≤ 1000 ns", log=True)
    eager = s.get("ops50_10", "kiln_eager", 1)
    _panel(axes[7], "function of 50 ops, 10 float32", _per_call(s, "ops50_10", 1e3),
           eager.time_ns / 5e3 if eager else None, "µs per call (log); target: kiln ≤ kiln_eager / 5", log=True)
    hand = lambda s, t: s.get("chain_16M", "hand_xsimd", t)  # noqa: E731
    _panel(axes[8], "function: tanh(x * 0.5 + 1) * x - 0.25, 16M float32",
           _shares(s, "chain_16M", hand, lambda r: r.time_ns, scale=1.0), 1.2,
           "time relative to hand_xsimd (same threads, log); target ≤ 1.2", log=True)
    _panel(axes[9], "tracing a 20-op function", _per_call(s, "trace_20", 1e3), 200,
           "µs per trace (log); target ≤ 200 µs", log=True)
    torch_power = s.get("power_100", "torch_py", 1)
    _panel(axes[10], "power(x, 100): 100 matmuls, 10×10 int32", _per_call(s, "power_100", 1e3),
           torch_power.time_ns / 10e3 if torch_power else None, "µs per call (log); target: kiln ≤ torch_py / 10",
           log=True)
    _panel(axes[11], "while_loop, scalar body", _per_call(s, "while_scalar", loop_trips), 200,
           "ns per iteration (log); target ≤ 200 ns", log=True)
    steps = [(f"{r.peer} ({t}t)", r.time_ns / 1e6, r.peer.startswith("kiln"))
             for t in s.threads("train_step_mlp") for r in s.peers("train_step_mlp", t)]
    _panel(axes[12], "training step: MLP 784→256→256→10, batch 128, Adam", steps, None,
           "ms per step; targets: kiln ≤ torch_py / 1.5 and ≤ jax (same threads)")
    memory = [(f"{peer} ({t}t)", mib, peer.startswith("kiln"))
              for (case, peer, t), mib in sorted(s.peak_memory.items()) if case == "train_step_mlp"]
    _panel(axes[13], "training step: peak memory", memory, None, "MiB above the process before the model")
    fig.suptitle("kiln vs peers (medians; kiln in orange)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
