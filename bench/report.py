#!/usr/bin/env python3
"""Turns the raw results of bench/run.sh into bench/RESULTS.md (ratio tables, targets
with pass/fail) and bench/results.png (through plot.py).

Every file in the results folder is Google Benchmark JSON (the C++ program's, or
peers.py's in the same layout). Benchmarks are named <case>/<peer>/threads:<n>; each
figure is the median over every repetition of every round.

    python3 bench/report.py --results bench/results --command "bench/run.sh" \\
        --markdown bench/RESULTS.md --plot bench/results.png
"""

import argparse
import glob
import json
import os
import statistics
from dataclasses import dataclass, field

import plot

GB = 1e9
LOOP_TRIPS = 4096  # while_scalar's iterations per call (bench_function.cpp, peers.py)


@dataclass
class result:
    """The median of one benchmark over all its samples."""

    case: str
    peer: str
    threads: int
    time_ns: float
    bytes_per_second: float = 0.0
    flops: float = 0.0
    samples: int = 0
    spread: float = 0.0  # interquartile range of the times, as a fraction of the median
    counters: dict = field(default_factory=dict)  # a benchmark's own counters (the medians)


@dataclass
class target:
    """One of the suite's goals, checked against the measured medians."""

    description: str
    measured: str
    passed: bool | None  # None: kiln has no such benchmark yet


@dataclass
class suite:
    results: dict = field(default_factory=dict)  # (case, peer, threads) -> result
    context: dict = field(default_factory=dict)  # library -> its context lines
    peak_memory: dict = field(default_factory=dict)  # (case, peer, threads) -> MiB, from run.sh's memory pass

    def get(self, case, peer, threads):
        return self.results.get((case, peer, threads))

    def peers(self, case, threads):
        """The results of a case at a thread count, kiln's first."""
        rows = [r for (c, _, t), r in self.results.items() if c == case and t == threads]
        return sorted(rows, key=lambda r: (not r.peer.startswith("kiln"), r.peer))

    def threads(self, case):
        return sorted({t for (c, _, t) in self.results if c == case})


# The benchmarks' own counters that the report reads (bench/bench_growth.cpp's).
COUNTERS = ("ops", "iterations", "one_trace_mb", "traces_mb")


def load(folder):
    """Reads every JSON file of the folder into medians per benchmark."""
    samples = {}
    loaded = suite()
    for path in sorted(glob.glob(os.path.join(folder, "*.json"))):
        with open(path) as f:
            data = json.load(f)
        if os.path.basename(path).startswith("memory_"):  # a peer run alone: its memory, not its time
            for entry in data["benchmarks"]:
                if "peak_rss_mb" in entry and not entry.get("error_occurred"):
                    case, peer, threads = entry["name"].removesuffix("/real_time").split("/")
                    loaded.peak_memory[(case, peer, int(threads.removeprefix("threads:")))] = entry["peak_rss_mb"]
            continue
        ctx = data.get("context", {})
        # The C++ program's configuration is its full runs' (cpp_r*.json); a file of a
        # few cases run later, maybe where some peers are missing, keeps its own.
        library = ctx.get("library", "kiln_bench (C++)")
        if library not in loaded.context or not os.path.basename(path).startswith("cpp_") or \
                os.path.basename(path).startswith("cpp_r"):
            loaded.context[library] = ctx
        for entry in data["benchmarks"]:
            if entry.get("run_type", "iteration") != "iteration" or entry.get("error_occurred"):
                continue
            name = entry["name"].removesuffix("/real_time")
            case, peer, threads = name.split("/")[:3]  # (a fixed count adds /iterations:N)
            scale = {"ns": 1, "us": 1e3, "ms": 1e6, "s": 1e9}[entry.get("time_unit", "ns")]
            key = (case, peer, int(threads.removeprefix("threads:")))
            counters = {k: entry[k] for k in COUNTERS if k in entry}
            if case.startswith("growth_"):  # on a shared machine, the CPU time is the figure
                counters["cpu_ns"] = entry["cpu_time"] * scale
            samples.setdefault(key, []).append(
                (entry["real_time"] * scale, entry.get("bytes_per_second", 0.0), entry.get("flops", 0.0), counters)
            )
    for key, values in samples.items():
        times = [v[0] for v in values]
        quartiles = statistics.quantiles(times, n=4) if len(times) > 1 else [times[0]] * 3
        loaded.results[key] = result(
            *key,
            time_ns=statistics.median(times),
            spread=(quartiles[2] - quartiles[0]) / statistics.median(times),
            bytes_per_second=statistics.median(v[1] for v in values),
            flops=statistics.median(v[2] for v in values),
            samples=len(values),
            counters={k: statistics.median(v[3][k] for v in values) for k in values[0][3]},
        )
    return loaded


def best_up_to(s, case, threads):
    """The fastest result of a reference case on at most `threads` threads: more threads
    can only add bandwidth, so a 2-thread figure below the 1-thread one is the busy
    machine's doing, not the memory's."""
    rows = [r for t in s.threads(case) if t <= threads for r in s.peers(case, t)]
    return max(rows, key=lambda r: r.bytes_per_second) if rows else None


def copy_bandwidth(s, threads):
    """The machine's copy bandwidth: the bar an elementwise op is held to."""
    return best_up_to(s, "copy_64MiB", threads)


def read_bandwidth(s, threads):
    """The machine's read bandwidth: the bar a reduction is held to."""
    return best_up_to(s, "read_64MiB", threads)


def best_blas(s, threads):
    blas = [r for r in s.peers("matmul_1024", threads) if r.peer in ("openblas", "eigen")]
    return max(blas, key=lambda r: r.flops) if blas else None


def format_spread(r):
    return f"±{50 * r.spread:.0f} %"


def format_time(ns):
    if ns >= 1e6:
        return f"{ns / 1e6:.2f} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.2f} µs"
    return f"{ns:.0f} ns"


def speed_vs_kiln(s, r):
    """How many times faster kiln is than this peer (time ratio), as text."""
    kiln = s.get(r.case, "kiln", r.threads)
    return f"{r.time_ns / kiln.time_ns:.2f}×" if kiln else "–"


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def bandwidth_section(s):
    rows = []
    for case, unit in (("copy_64MiB", "read + written"), ("read_64MiB", "read")):
        for threads in s.threads(case):
            for r in s.peers(case, threads):
                rows.append([case, r.peer, threads, format_time(r.time_ns), format_spread(r), f"{r.bytes_per_second / GB:.1f}",
                             unit])
    return "## 1. Bandwidth references (same run)\n\n" + table(
        ["case", "method", "threads", "median time", "spread", "GB/s", "bytes counted"], rows
    )


def memory_bound_section(s, title, case, reference, reference_name):
    rows = []
    for threads in s.threads(case):
        ref = reference(s, threads)
        for r in s.peers(case, threads):
            share = f"{100 * r.bytes_per_second / ref.bytes_per_second:.0f} %" if ref else "–"
            rows.append([r.peer, threads, format_time(r.time_ns), format_spread(r), f"{r.bytes_per_second / GB:.1f}",
                         share, speed_vs_kiln(s, r)])
    return f"## {title}\n\n" + table(
        ["peer", "threads", "median time", "spread", "GB/s", f"% of {reference_name}", "peer time / kiln time"], rows
    )


def matmul_section(s):
    rows = []
    for threads in s.threads("matmul_1024"):
        best = best_blas(s, threads)
        for r in s.peers("matmul_1024", threads):
            share = f"{100 * r.flops / best.flops:.0f} %" if best else "–"
            rows.append([r.peer, threads, format_time(r.time_ns), format_spread(r), f"{r.flops / GB:.1f}", share,
                         speed_vs_kiln(s, r)])
    return "## 4. matmul 1024×1024×1024 float32\n\n" + table(
        ["peer", "threads", "median time", "spread", "GFLOP/s", "% of best of OpenBLAS/Eigen",
         "peer time / kiln time"], rows
    )


def conv_section(s):
    rows = []
    for threads in s.threads("conv2d_seed"):
        for r in s.peers("conv2d_seed", threads):
            rows.append([r.peer, threads, format_time(r.time_ns), format_spread(r), f"{r.flops / GB:.1f}",
                         speed_vs_kiln(s, r)])
    return (
        "## 5. conv2d of the guides: 1×200×200×100 NHWC, 3×3×100→100 HWIO, VALID\n\n"
        + table(["peer", "threads", "median time", "spread", "GFLOP/s", "peer time / kiln time"], rows)
    )


def per_call_section(s, title, case, time_label, calls_per_time=1):
    """A case timed per call on one thread: each peer's median against kiln's. A time
    that covers `calls_per_time` calls (loop iterations) is shown divided by it."""
    rows = [[r.peer, r.threads, format_time(r.time_ns / calls_per_time), format_spread(r), speed_vs_kiln(s, r)]
            for r in s.peers(case, 1)]
    return f"## {title}\n\n" + table(["peer", "threads", time_label, "spread", "peer time / kiln time"], rows)


def summary_section(s):
    """Section 18: a TensorBoard summary inside a kiln::function (bench/bench_summary.cpp)."""
    base = s.get("summary_scalar", "kiln", 1)
    rows = [[r.peer, format_time(r.time_ns), format_spread(r),
             format_time(r.time_ns - base.time_ns) if base and r.peer != "kiln" else "–"]
            for r in s.peers("summary_scalar", 1)]
    return ("## 18. A scalar summary inside a kiln::function: x * x + 2 on a scalar float32\n\n"
            "`kiln`: the function without a summary (section 7's); `kiln_summary_no_writer`: with "
            "`kiln::summary::scalar` of its result and no default writer; `kiln_summary_writer`: the same under a "
            "default writer, which encodes, frames and queues an event at every call and writes the queue to its "
            "file every 11 events (TensorFlow's `max_queue` of 10). Measured in a run of its own (the last one the "
            "command above lists), whose machine may differ from the one above.\n\n"
            + table(["peer", "median time per call", "spread", "added per call"], rows))


def growth_section(s):
    """Section 20: costs that grow with the work (bench/bench_growth.cpp)."""
    lines = ["## 20. Costs that grow with the work, no faster\n",
             "Tracing, optimizing and planning a chain of n elementwise ops (each with a scalar captured anew) "
             "and its first call, per op; with a gradient tape in the function, whose backward pass joins the "
             "graph (`growth_trace_grad_*`); and a chain alternating a product with a transpose on a (4, 4) "
             "tensor, whose n / 2 fused clusters of one op each are planned one by one "
             "(`growth_trace_clusters_*`); the function's destruction after each (its graphs and plans freed) "
             "is not timed. Targets: at most 2 µs per op at 10⁵ ops, the gradient within 3× "
             "of that. The machine these ran on is shared with other builds: the CPU time (user and system) of "
             "the benchmark's thread is the figure, the wall time is shown beside it. bench/history.md has the "
             "figures of earlier code and what each change gave.\n"]
    rows = []
    per_op = {}
    for label in ("1e3", "1e4", "1e5"):
        for case in (f"growth_trace_{label}", f"growth_trace_grad_{label}", f"growth_trace_clusters_{label}"):
            r = s.get(case, "kiln", 1)
            if r and r.counters.get("ops"):
                per_op[case] = r.counters["cpu_ns"] / r.counters["ops"]
                rows.append([case, f"{r.counters['ops']:.0f}", format_time(r.time_ns), format_time(r.counters["cpu_ns"]),
                             format_time(per_op[case])])
    lines.append(table(["case", "ops", "wall time", "CPU time", "CPU time per op"], rows))
    if "growth_trace_1e5" in per_op and "growth_trace_grad_1e5" in per_op:
        plain, grad = per_op["growth_trace_1e5"], per_op["growth_trace_grad_1e5"]
        lines.append(f"\nAt 10⁵ ops: {format_time(plain)} per op ({'met' if plain <= 2000 else '**not met**'}: "
                     f"target 2 µs); the gradient {grad / plain:.1f}× that "
                     f"({'met' if grad <= 3 * plain else '**not met**'}: target 3×).\n")
    lines.append("\nA call of a function that differentiates a loop of n iterations of `s * 0.99999 + 0.001` (a "
                 "tape inside it), each row timed over the benchmark's minimum time. Target: 10⁶ iterations within "
                 "10× of 10⁵.\n")
    rows = []
    for label in ("1e4", "1e5", "1e6"):
        r = s.get(f"growth_while_grad_{label}", "kiln", 1)
        if r and r.counters.get("iterations"):
            rows.append([r.case, f"{r.counters['iterations']:.0f}", format_time(r.time_ns), format_time(r.counters["cpu_ns"]),
                         format_time(r.counters["cpu_ns"] / r.counters["iterations"])])
    lines.append(table(["case", "iterations", "wall time per call", "CPU time per call", "CPU time per iteration"],
                       rows))
    loop5, loop6 = s.get("growth_while_grad_1e5", "kiln", 1), s.get("growth_while_grad_1e6", "kiln", 1)
    if loop5 and loop6 and loop5.counters.get("cpu_ns"):
        ratio = loop6.counters["cpu_ns"] / loop5.counters["cpu_ns"]
        lines.append(f"\n10⁶ iterations took {ratio:.2f}× the time of 10⁵ "
                     f"({'met' if ratio <= 10 else '**not met**'}: target at most 10×).\n")
    mod, body = s.get("growth_mod_loop", "kiln", 1), s.get("while_scalar", "kiln", 1)
    if mod and mod.counters.get("iterations"):
        per = mod.counters["cpu_ns"] / mod.counters["iterations"]
        text = (f"\nA scalar `while_loop` whose body is `i + 1`, `s + cast(i % 7, int64)`: "
                f"{format_time(per)} of CPU time per iteration")
        if body:
            base = body.time_ns / LOOP_TRIPS
            text += f", {per / base:.2f}× section 12's body ({format_time(base)} per iteration; target at most 2×)"
        lines.append(text + ".\n")
    memory = s.get("growth_traces_memory", "kiln", 1)
    if memory and "traces_mb" in memory.counters:
        one, all_ = memory.counters["one_trace_mb"], memory.counters["traces_mb"]
        lines.append(f"\nMemory a function holds after 100 traces of shapes of a million floats: {all_:.1f} MiB, "
                     f"against {one:.1f} MiB after one ({all_ / one:.2f}×; target at most 2×).\n")
    return "\n".join(lines)


def training_section(s):
    """Section 15: a training step per peer at 1 and 2 threads, with peak memory."""
    rows = []
    for threads in s.threads("train_step_mlp"):
        for r in s.peers("train_step_mlp", threads):
            memory = s.peak_memory.get((r.case, r.peer, r.threads))
            rows.append([r.peer, r.threads, format_time(r.time_ns), format_spread(r), speed_vs_kiln(s, r),
                         f"{memory:.0f}" if memory is not None else "–"])
    return ("## 15. One training step: MLP 784→256→256→10 (ReLU), batch 128, float32, softmax cross-entropy, Adam\n\n"
            "Forward, backward and update per call (`bench/bench_training.cpp`, `peers.py`). Every peer's first two "
            "losses are checked against a float64 NumPy/C++ reference of the same step before timing. *Peak memory* is "
            "the rise of the process's peak resident memory from just before the peer builds its model to the end "
            "of its steps, in a process that runs only that peer (JAX's and TensorFlow's include their compilers' "
            "work).\n\n" + table(["peer", "threads", "time per step", "spread", "peer time / kiln time",
                                   "peak memory (MiB)"], rows) +
            "\nAllocation in steady state, since commit 606142c: none. A step of this model makes no call of "
            "`operator new` and no system allocation once warm, on 1 and 2 threads (counted over 100 steps with a "
            "replaced `operator new` and an interposed `posix_memalign`; before: 102 calls of `operator new` per "
            "step). The test \"a training step in steady state allocates nothing\" (`test/exec/executor_test.cpp`) "
            "keeps it so.\n" + saved_step_text(s))


def saved_step_text(s):
    """The same step saved and loaded, beside the function it came from, and what loading costs."""
    load, read = s.get("load_mlp_step", "kiln", 1), s.get("load_mlp_step", "read_file", 1)
    rows = [[r.peer, r.threads, format_time(r.time_ns), format_spread(r), speed_vs_kiln(s, r)]
            for threads in s.threads("train_step_saved") for r in s.peers("train_step_saved", threads)]
    if not load or not read or not rows:
        return ""
    return ("\nThe same step saved by `kiln::save` (traced, not run) and loaded by `kiln::load` "
            "(kiln/saved_function.hpp), `kiln_loaded`, beside the function it came from, in one run:\n\n" +
            table(["peer", "threads", "time per step", "spread", "peer time / kiln time"], rows) +
            "\nLoading it (reading the file, 3.3 MB of weights and Adam's slots, checking and rebuilding the graph, optimizing and planning "
            f"it) takes {format_time(load.time_ns)}; reading the file's bytes alone takes {format_time(read.time_ns)}.\n")



def chain_section(s):
    rows = []
    for threads in s.threads("chain_16M"):
        hand = s.get("chain_16M", "hand_xsimd", threads)
        for r in s.peers("chain_16M", threads):
            vs_hand = f"{r.time_ns / hand.time_ns:.2f}×" if hand else "–"
            rows.append([r.peer, threads, format_time(r.time_ns), format_spread(r), f"{r.bytes_per_second / GB:.1f}",
                         speed_vs_kiln(s, r), vs_hand])
    return (
        "## 9. kiln::function: tanh(x * 0.5 + 1) * x - 0.25 on 16M float32 (1 read + 1 write counted)\n\n"
        + table(["peer", "threads", "median time", "spread", "GB/s", "peer time / kiln time",
                 "peer time / hand_xsimd time"], rows)
    )


TYPED_CASES = [
    ("fixed_x2", "x * x + 2 on fixed<float> (a call)"),
    ("fixed_ops50", "50 elementwise ops on fixed<float, 10>, ten of them tanh"),
    ("fixed_arith50", "50 arithmetic ops (multiply, add, subtract, maximum) on fixed<float, 10>"),
    ("fixed_dense", "tanh(x · w + b), 8×64 · 64×32 float32"),
    ("fixed_mlp3", "3-layer MLP 64→32→32→10 (ReLU), batch 8, float32: typed layers against raw typed ops"),
    ("fixed_power", "power(x, 100): 100 matmuls of fixed<int32_t, 10, 10>"),
    ("fixed_chain_1M", "tanh(x * 0.5 + 1) * x - 0.25 on fixed<float, 2^20>"),
]


def typed_section(s):
    """The compile-time tier (kiln_fixed) against its peers, case by case."""
    rows = []
    for case, description in TYPED_CASES:
        typed = s.get(case, "kiln_fixed", 1)
        for r in s.peers(case, 1):
            ratio = f"{r.time_ns / typed.time_ns:.2f}" if typed else "–"
            rows.append([description, r.peer, format_time(r.time_ns), format_spread(r), ratio])
    return (
        "## 16. The compile-time tier: kiln::function on kiln::fixed arguments\n\n"
        "`kiln_fixed` is the typed trace; `kiln_fixed_rebound` the same 50 ops written as a C++ loop that rebinds "
        "its variable (a step per assignment); `kiln` is the runtime tier's kiln::function on kiln::tensor "
        "arguments; `hand_plain` plain loops (std::tanh, std::max); `hand_xsimd` the xsimd loop of section 9 for "
        "the chain, and for the rounds the same ops written by hand on one SIMD batch with kiln's tanh and "
        "maximum (`bench/results/cpp_floors.json`, a later run, in which kiln_fixed took 131 ns with ten tanh "
        "and 23.8 ns without, `kiln` 574 and 461 ns); "
        "`eigen` Eigen 3.4's fixed-size matrices. kiln::maximum propagates NaN, as TensorFlow's does, where std::max "
        "does not: in the arithmetic rounds it costs a blend after each round's max instruction. The rounds with "
        "tanh are one chain of ten dependent tanh on a single SIMD batch, so their time is tanh's latency, which "
        "the runtime tier's graph pays too: the typed trace runs them faster than the hand-written SIMD rounds, "
        "and the target of 10× the runtime graph's speed would need less than half its time (57 ns in that "
        "run). The rows above are from before typed rebinding loops ran as evaluation chains; in a later run "
        "(2026-11-29, `bench/results/cpp_typed_models.json` keeps its fixed_mlp3 rows, a busy 2-core Intel Xeon) "
        "`kiln_fixed_rebound` took 62.4 ns against kiln_fixed's 49.6 ns for the arithmetic rounds (1.26×; "
        "`kiln` 737 ns) and 221 ns against 216 ns with tanh (1.02×). `fixed_mlp3`: `kiln_fixed_model` is the "
        "MLP of typed layers (`kiln::layers::fixed_sequential` of three `fixed_dense`), `kiln_fixed` the same "
        "model written with raw typed ops on fixed_variables of the same values.\n\n"
        + table(["case", "peer", "median time", "spread", "peer time / kiln_fixed time"], rows)
    )


def kiln_calls_blas():
    """Whether kiln's headers call a BLAS (then the C++ program must time its kernel apart)."""
    include = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "include", "kiln")
    for path in glob.glob(os.path.join(include, "**", "*.hpp"), recursive=True):
        with open(path) as f:
            if "cblas_" in f.read():
                return True
    return False


def targets(s):
    """The suite's goals, each measured on this run."""
    checks = []

    def share_target(description, case, peer, threads, reference, goal, rate):
        kiln, ref = s.get(case, peer, threads), reference(s, threads)
        if kiln is None or ref is None:
            checks.append(target(description, "not measured", None))
            return
        share = rate(kiln) / rate(ref)
        checks.append(target(description, f"{100 * share:.0f} % (of {ref.peer}, {ref.threads} thread(s))",
                             share >= goal))

    def time_target(description, case, limit_ns, calls_per_time=1, subject="kiln"):
        kiln = s.get(case, subject, 1)
        per_call = kiln.time_ns / calls_per_time if kiln else None
        checks.append(target(description, format_time(per_call) if kiln else "not measured",
                             per_call <= limit_ns if kiln else None))

    def time_ratio_target(description, case, peer, threads, at_most, subject="kiln"):
        """`subject`'s time over `peer`'s must be at most `at_most` (below 1: faster)."""
        kiln, other = s.get(case, subject, threads), s.get(case, peer, threads)
        if kiln is None or other is None:
            checks.append(target(description, "not measured", None))
            return
        ratio = kiln.time_ns / other.time_ns
        measured = f"{1 / ratio:.2f}× faster than {peer}" if at_most < 1 else f"{ratio:.2f}× {peer}'s time"
        checks.append(target(description, measured, ratio <= at_most))

    for threads in (1, 2):
        share_target(f"add 16M, {threads} thread(s): kiln ≥ 85 % of copy bandwidth", "add_16M", "kiln", threads,
                     copy_bandwidth, 0.85, lambda r: r.bytes_per_second)
    for threads in (1, 2):
        share_target(f"reduce_sum 16M, {threads} thread(s): kiln ≥ 85 % of read bandwidth", "reduce_sum_16M", "kiln",
                     threads, read_bandwidth, 0.85, lambda r: r.bytes_per_second)
    for threads in (1, 2):
        share_target(f"matmul 1024, {threads} thread(s): kiln ≥ 90 % of best of OpenBLAS/Eigen", "matmul_1024", "kiln",
                     threads, best_blas, 0.90, lambda r: r.flops)
    # Where kiln calls no BLAS, its matmul is its own xsimd kernel: the same row.
    kernel_peer = "kiln_xsimd" if kiln_calls_blas() else "kiln"
    for threads in (1, 2):
        share_target(f"matmul 1024, {threads} thread(s): kiln's xsimd kernel alone ≥ 75 % of best of OpenBLAS/Eigen",
                     "matmul_1024", kernel_peer, threads, best_blas, 0.75, lambda r: r.flops)
    time_ratio_target("conv2d seed, 2 threads: kiln at least as fast as libtorch (oneDNN, channels-last)",
                      "conv2d_seed", "libtorch", 2, 1.0)
    time_target("eager a + b on 10 float32: kiln ≤ 500 ns per op", "add_10", 500)
    time_target("kiln::function call of x * x + 2 on a scalar: kiln ≤ 1 µs per call", "call_x2", 1e3)
    # kiln_jit: the same kiln::function with jit_compile (fused clusters as native loops).
    for subject in ("kiln", "kiln_jit"):
        time_ratio_target(f"kiln::function of 50 ops on 10 float32: {subject} ≥ 5× faster than eager", "ops50_10",
                          "kiln_eager", 1, 1 / 5, subject)
    for threads in (1, 2):
        for subject in ("kiln", "kiln_jit"):
            time_ratio_target(f"kiln::function chain on 16M, {threads} thread(s): {subject} ≥ 3× faster than eager",
                              "chain_16M", "kiln_eager", threads, 1 / 3, subject)
            time_ratio_target(f"kiln::function chain on 16M, {threads} thread(s): {subject} time ≤ 1.2 × hand_xsimd "
                              "time", "chain_16M", "hand_xsimd", threads, 1.2, subject)
    time_target("tracing a 20-op function (trace + optimize + plan): kiln ≤ 200 µs", "trace_20", 200e3)
    time_ratio_target("power(x, 100), 100 matmuls of 10×10 int32: kiln ≥ 10× faster than PyTorch eager",
                      "power_100", "torch_py", 1, 1 / 10)
    time_target("while_loop with a scalar body: kiln ≤ 200 ns per iteration", "while_scalar", 200, LOOP_TRIPS)
    time_ratio_target("a loop over 100 batches fed by a dataset in one function: kiln time ≤ 1.1 × a C++ loop "
                      "calling a function per batch", "dataset_loop", "kiln_per_batch", 1, 1.1)
    for threads in (1, 2):
        time_ratio_target(f"training step (MLP, Adam), {threads} thread(s): kiln ≥ 1.5× faster than PyTorch eager",
                          "train_step_mlp", "torch_py", threads, 1 / 1.5)
        time_ratio_target(f"training step (MLP, Adam), {threads} thread(s): kiln no slower than jax.jit",
                          "train_step_mlp", "jax", threads, 1.0)
        time_ratio_target(f"training step (MLP, Adam), {threads} thread(s): loaded from a saved file, as fast as "
                          "the function it came from (≤ 1.05 ×)", "train_step_saved", "kiln", threads, 1.05,
                          "kiln_loaded")
    load, read = s.get("load_mlp_step", "kiln", 1), s.get("load_mlp_step", "read_file", 1)
    checks.append(target("loading the saved training step: at most 5 ms plus reading its file",
                         f"{format_time(load.time_ns)} (reading the file: {format_time(read.time_ns)})"
                         if load and read else "not measured",
                         load.time_ns - read.time_ns <= 5e6 if load and read else None))
    def added_target(description, case, subject, limit_ns):
        base, with_it = s.get(case, "kiln", 1), s.get(case, subject, 1)
        added = with_it.time_ns - base.time_ns if base and with_it else None
        checks.append(target(description, format_time(added) if added is not None else "not measured",
                             added <= limit_ns if added is not None else None))

    added_target("a scalar summary inside a function, with a default writer: ≤ 1 µs added per call", "summary_scalar",
                 "kiln_summary_writer", 1e3)
    added_target("a scalar summary inside a function, without a default writer: ≤ 50 ns added per call (one "
                 "special step)", "summary_scalar", "kiln_summary_no_writer", 50)
    d = distributed_results()
    checks.append(target("all-reduce of 269,322 float32 on 2 ranks: kiln::all_reduce within 1.05× of a bare "
                         "MPI_Allreduce", f"{d['kiln_all_reduce_us'] / d['mpi_allreduce_us']:.2f}× MPI_Allreduce's time"
                         if d else "not measured",
                         d['kiln_all_reduce_us'] <= 1.05 * d['mpi_allreduce_us'] if d else None))
    ratio = d["all_ranks_samples_per_s"] / d["one_rank_samples_per_s"] if d else None
    checks.append(target("training step (MLP, Adam), 2 ranks × 1 thread under data_parallel: ≥ 1.7× the samples per "
                         "second of 1 rank × 1 thread", f"{ratio:.3f}×" if d else "not measured",
                         ratio >= 1.7 if d else None))
    time_target("compile-time tier: a call of x * x + 2 on fixed<float> ≤ 10 ns", "fixed_x2", 10, 1, "kiln_fixed")
    for case, mix in (("fixed_ops50", "with ten tanh"), ("fixed_arith50", "arithmetic")):
        time_ratio_target(f"compile-time tier: 50 ops ({mix}) on fixed<float, 10> ≤ 1.5 × a hand-written loop", case,
                          "hand_plain", 1, 1.5, "kiln_fixed")
        time_ratio_target(f"compile-time tier: 50 ops ({mix}) on fixed<float, 10> ≥ 10× faster than the runtime "
                          "tier's graph", case, "kiln", 1, 1 / 10, "kiln_fixed")
    time_ratio_target("compile-time tier: tanh(x · w + b), 8×64 · 64×32: no slower than Eigen fixed-size",
                      "fixed_dense", "eigen", 1, 1.0, "kiln_fixed")
    time_ratio_target("compile-time tier: power(x, 100) on fixed<int32_t, 10, 10> ≤ 1.2 × a hand-written triple loop",
                      "fixed_power", "hand_plain", 1, 1.2, "kiln_fixed")
    time_ratio_target("compile-time tier: power(x, 100) on fixed<int32_t, 10, 10>: no slower than Eigen fixed-size",
                      "fixed_power", "eigen", 1, 1.0, "kiln_fixed")
    time_ratio_target("compile-time tier: the chain on fixed<float, 2^20> ≤ 1.1 × a hand-written xsimd loop",
                      "fixed_chain_1M", "hand_xsimd", 1, 1.1, "kiln_fixed")
    return checks


def load_warning(machine):
    """A warning when other work kept the machine's cores busy during the run."""
    loads = [float(line.split()[2]) for line in machine.splitlines() if line.startswith("load ")]
    cores = os.cpu_count() or 1
    if not loads or max(loads) <= cores / 2:
        return ""
    return (f"\n**The machine was busy during this run** (1-minute load average up to {max(loads):.1f} on {cores} "
            "cores, from other work): absolute figures are lower and 2-thread figures noisier than on an idle "
            "machine. Ratios between peers measured in the same round stay meaningful.\n")


def markdown(s, checks, command, machine, png_name):
    verdict = {True: "**pass**", False: "**FAIL**", None: "not measured"}
    counts = sorted({r.samples for r in s.results.values()})
    samples = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]} to {counts[-1]}"
    parts = [
        "# kiln benchmark results\n",
        "Generated by `bench/report.py` from the raw JSON in `bench/results/`; do not edit by hand.\n",
        f"Command: `{command}` (from the repository root, after `bench/setup.sh`).\n",
        f"Every figure is the median over all repetitions of all rounds ({samples} samples per "
        "benchmark); C++ repetitions run in random interleaved order, and "
        "rounds alternate the C++ program with the Python peers. Times are wall-clock; *spread* is "
        "half the interquartile range of a benchmark's times, relative to its median. "
        "GB = 10⁹ bytes.\n",
        "## Machine\n\n```\n" + machine.strip() + "\n```\n" + load_warning(machine),
        "## Targets\n\n" + table(["target", "measured", "result"],
                                  [[c.description, c.measured, verdict[c.passed]] for c in checks]),
        f"![results]({png_name})\n",
        bandwidth_section(s),
        memory_bound_section(s, "2. Elementwise a + b, 16M float32 (2 reads + 1 write counted)", "add_16M",
                             copy_bandwidth, "best copy"),
        memory_bound_section(s, "3. reduce_sum, 16M float32", "reduce_sum_16M", read_bandwidth, "read bandwidth"),
        matmul_section(s),
        conv_section(s),
        per_call_section(s, "6. Eager per-op overhead: a + b on 10 float32", "add_10", "median time per op"),
        per_call_section(s, "7. kiln::function call overhead: x * x + 2 on a scalar float32", "call_x2",
                         "median time per call"),
        per_call_section(s, "8. kiln::function of 50 elementwise ops on 10 float32", "ops50_10",
                         "median time per call"),
        chain_section(s),
        per_call_section(s, "10. Tracing a 20-op elementwise function (trace + optimize + plan, no run)", "trace_20",
                         "median time per trace"),
        per_call_section(s, "11. The guides' power(x, 100): 100 matmuls of a 10×10 int32 matrix", "power_100",
                         "median time per call"),
        per_call_section(s, f"12. A while_loop with a scalar body ({LOOP_TRIPS} iterations per call)", "while_scalar",
                         "median time per iteration", LOOP_TRIPS),
        per_call_section(s, "13. A training loop over 100 batches of 256×64 float32 (dataset, C++ loop, for_range)",
                         "dataset_loop", "median time per call"),
        compile_section(),
        package_compile_section(),
        training_section(s),
        typed_section(s),
        gpu_section(),
        summary_section(s),
        models_section(),
        growth_section(s),
        distributed_section(),
        peers_section(s),
    ]
    return "\n".join(parts)


GPU_CASES = [
    ("gpu_add_16M", "a + b, 16M float32 (2 reads + 1 write)", "hand_cuda"),
    ("gpu_chain_16M", "tanh(x * 0.5 + 1) * x - 0.25, 16M float32 (1 read + 1 write)", "hand_cuda"),
    ("gpu_matmul_1024", "matmul 1024×1024×1024 float32", "hand_cuda"),
]


def distributed_results():
    """bench/results/distributed/distributed.json (bench/bench_distributed.cpp under mpirun), if any."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "distributed", "distributed.json")
    return json.load(open(path)) if os.path.exists(path) else None


def distributed_section():
    """Section 21: data parallelism over MPI (bench/bench_distributed.cpp)."""
    title = "## 21. Data parallelism over MPI: the all-reduce of the MLP's gradients, and training on 2 ranks\n\n"
    d = distributed_results()
    if not d:
        return title + ("Not measured: build `kiln_bench_distributed` (MPI installed) and run it under "
                        "`mpirun -np 2`, as `bench/run.sh` does.\n")
    ranks = d["ranks"]
    reduce_rows = [
        ["mpi_allreduce", f"{d['mpi_allreduce_us']:.1f} µs", "1.00×"],
        ["kiln", f"{d['kiln_all_reduce_us']:.1f} µs", f"{d['kiln_all_reduce_us'] / d['mpi_allreduce_us']:.2f}×"],
        ["kiln_function", f"{d['kiln_function_us']:.1f} µs", f"{d['kiln_function_us'] / d['mpi_allreduce_us']:.2f}×"],
    ]
    one, many = d["one_rank_samples_per_s"], d["all_ranks_samples_per_s"]
    train_rows = [
        ["1 rank × 1 thread (the others wait)", f"{d['one_rank_step_ms']:.3f} ms", f"{one:,.0f}", "1.00×"],
        [f"{ranks} ranks × 1 thread, data_parallel", f"{d['all_ranks_step_ms']:.3f} ms", f"{many:,.0f}",
         f"{many / one:.2f}×"],
        [f"{ranks} ranks × 1 thread, each alone (no collective)", f"{d['all_ranks_apart_step_ms']:.3f} ms", "–", "–"],
    ]
    return (title +
            f"`bench/bench_distributed.cpp` under `mpirun -np {ranks}` on {d.get('cpu', 'an unrecorded machine')}, "
            f"{d['rounds']} rounds (load average over 1, 5 and 15 minutes {d['load_before']} before, "
            f"{d['load_after']} after, from other builds on the machine). The all-reduce (sum) of {d['allreduce_elements']:,} "
            "float32 (the MLP's gradients): `mpi_allreduce` is a bare `MPI_Allreduce` from one buffer into another; "
            "`kiln` is `kiln::all_reduce` of a tensor (the ranks' agreement, the sum in rank order, a new result "
            "tensor); `kiln_function` the same collective as a node of a `kiln::function`. Calls alternate after a "
            f"barrier; a call's time is the slowest rank's; medians of {d['allreduce_calls']} calls each.\n\n" +
            table(["peer", "median time per all-reduce", "time / mpi_allreduce"], reduce_rows) +
            f"\nOne training step of the MLP of section 15 (batch {d['batch_per_rank']} per rank, Adam, one kiln "
            "thread per rank): rank 0 alone while the other ranks wait at a barrier, against every rank under "
            "`kiln::distribute::data_parallel`, each on its own samples with the gradients averaged, round by "
            f"round; medians of {d['steps']} steps. The last row, every rank training alone at once, is what sharing "
            "the machine costs without the all-reduce.\n\n" +
            table(["configuration", "time per step", "samples per second", "samples per second / 1 rank's"],
                  train_rows))


def gpu_section():
    """Section 17 from bench/results/gpu/ (scripts/gpu.sh run's bench_gpu.json and
    peers_gpu.jsonl, with the GPU's name in device.txt), if any."""
    folder = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "gpu")
    title = "## 17. On the GPU: the Thrust backend under CUDA\n\n"
    kiln_file = os.path.join(folder, "bench_gpu.json")
    if not os.path.exists(kiln_file):
        return title + "Not measured: run `scripts/gpu.sh build` and `scripts/gpu.sh run` on a GPU machine.\n"
    times = {}
    for b in json.load(open(kiln_file))["benchmarks"]:
        if b.get("aggregate_name") != "median":
            continue
        name = b["run_name"].split("/")[0]  # gpu_add_16M_kiln/real_time
        for case, _, _ in GPU_CASES:
            if name.startswith(case + "_"):
                times[(case, name[len(case) + 1:])] = b["real_time"]  # microseconds, the benchmarks' unit
    peers_file = os.path.join(folder, "peers_gpu.jsonl")
    if os.path.exists(peers_file):
        for line in open(peers_file):
            row = json.loads(line)
            case, peer = row["name"].split("/")
            times[(case, peer)] = row["us"]
    device = open(os.path.join(folder, "device.txt")).read().strip() if os.path.exists(
        os.path.join(folder, "device.txt")) else "unknown GPU"
    parts = [title + f"`scripts/gpu.sh run` on {device}: medians of 3 repetitions of at least 0.5 s for the C++ "
             "rows (each iteration ends with `cudaDeviceSynchronize`), medians of 1 s of calls for PyTorch's "
             "(`torch.cuda.synchronize` after each). `hand_cuda` is a kernel written in `bench/bench_gpu.cu`: one "
             "pass over the data (the chain fused), and for matmul the textbook 16×16 shared-memory tiling. "
             "`kiln` is a `kiln::function` (its graph runs op by op on the GPU), `kiln_eager` the same callable "
             "op by op; `torch` is PyTorch eager, `torch_compile` `torch.compile` of the same function, "
             "`torch_cublas` PyTorch's matmul (cuBLAS, TF32 off).\n"]
    for case, what, base in GPU_CASES:
        rows = [(peer, t) for (c, peer), t in sorted(times.items(), key=lambda kv: kv[1]) if c == case]
        if not rows:
            continue
        ref = times.get((case, base))
        parts.append(f"**{case}**: {what}\n\n" + table(
            ["peer", "median time", f"time / {base}"],
            [[peer, f"{t:.1f} µs", f"{t / ref:.2f}×" if ref else "—"] for peer, t in rows]))
    return "\n".join(parts)


# What the programs of bench/compile_cost.sh cost before kiln compiled only the ops a
# file calls (issue "Header-only use that compiles fast"; Thrust on, CPP system).
COMPILE_BEFORE = [
    ("include_only", "8.4", "695"),
    ("one_eager_op", "11.9", "804"),
    ("three_op_function", "77.7", "1660"),
]


def compile_section():
    """Section 14 from bench/compile_cost.md (bench/compile_cost.sh's table), if any."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "compile_cost.md")
    if not os.path.exists(path):
        return "## 14. Compile time, header-only\n\nNot measured: run `bench/compile_cost.sh` (see its header).\n"
    before = table(["program", "wall (s)", "peak memory (MB)"], [list(r) for r in COMPILE_BEFORE])
    return ("## 14. Compile time, header-only\n\n"
            "Wall time and peak memory of `g++ -std=c++20 -O2 -march=native -c` on one source file that includes "
            "`single_include/kiln/kiln.hpp`; not part of the runs above. Before (the same programs when every file "
            "compiled every kernel, Thrust on):\n\n" + before + "\nNow (`bench/compile_cost.md`):\n\n" +
            open(path).read().strip() + "\n")


def package_compile_section():
    """Section 14b from bench/compile_times.md (bench/compile_times.sh: the package beside libtorch and Eigen), if any."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "compile_times.md")
    if not os.path.exists(path):
        return "## 14b. Compile time through the package\n\nNot measured: run `bench/compile_times.sh` (see its header).\n"
    return ("## 14b. Compile time through the package, beside libtorch and Eigen\n\n"
            "From `bench/compile_times.md` (`bench/compile_times.sh`):\n\n" + open(path).read().strip() + "\n")


def models_section():
    """Section 18 from bench/models.md (bench_models.cpp and peers_models.py, measured apart), if any."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "models.md")
    if not os.path.exists(path):
        return ""
    return "## 19. Models: layers in functions, a CNN training step, fit's overhead\n\n" + open(path).read().strip() + "\n"


def peers_section(s):
    lines = ["## Peers and their configuration\n"]
    cpp = s.context.get("kiln_bench (C++)", {})
    lines.append(
        f"- C++ program `kiln_bench`, Release, `-march=native` (Debian's Google Benchmark library is a "
        f"{cpp.get('library_build_type', '?')} build; it only runs the timing loop): "
        f"OPENBLAS_CORETYPE={cpp.get('OPENBLAS_CORETYPE', '?')} (OpenBLAS core in use: "
        f"{cpp.get('openblas_core', '?')}), ATEN_CPU_CAPABILITY={cpp.get('ATEN_CPU_CAPABILITY', '?')}."
    )
    if not kiln_calls_blas():
        lines.append("- kiln's matmul is its own xsimd kernel (`include/kiln/backend/cpu/gemm.hpp`; kiln calls no "
                     "BLAS), so both matmul targets are checked on the `kiln` row.")
    lines.append(
        "- `hand_plain` / `hand_xsimd`: loops written here (`bench/bench_memory.cpp`, `bench/bench_function.cpp`), "
        "threads from OpenMP; `hand_plain` in chain_16M calls glibc's scalar `std::tanh`. `hand_xsimd_stream` and "
        "`copy_64MiB/xsimd_stream` store with non-temporal (streaming) stores."
    )
    lines.append(
        "- Sections 7–10 (`bench/bench_function.cpp`): `kiln` is a `kiln::function` traced before timing (in "
        "trace_20, a new `kiln::function` and `get_concrete_function` on `tensor_spec`s per iteration); `kiln_jit` is "
        "the same with `jit_compile` (fused clusters compiled to native loops, in the first call); `kiln_eager` "
        "calls the same C++ callable directly, op by op. Every peer's result is checked once before timing: in C++ "
        "against the scalar loop (chain_16M) or eager kiln, in Python against NumPy."
    )
    lines.append(
        "- `libtorch` and `torch_py` are eager and allocate their result, as kiln's eager ops do; "
        "`libtorch_out` writes into a kept buffer (`at::add_out`). `torchscript` is `torch.jit.script` of the same "
        "Python function, compiled and warmed up before timing (Debian's TorchScript has no CPU fuser); "
        "`torchscript_trace` is `torch.jit.trace` (without its re-running check) of a fresh function per call."
    )
    for library in ("torch", "tensorflow", "jax"):
        ctx = s.context.get(library)
        if ctx:
            lines.append(f"- Python {library} {ctx['library_version']} (Python {ctx['python']}).")
        else:
            lines.append(f"- Python {library}: not installed here, so not measured (see bench/setup.sh).")
    lines.append(
        "- Section 15 (`bench/bench_training.cpp`, `peers.py`): `kiln` is one `kiln::function` holding the forward "
        "pass, a `gradient_tape` and `kiln::optimizers::adam`; `libtorch` is PyTorch's C++ front-end (autograd, "
        "`torch::optim::Adam`, OpenBLAS at the same thread count); `torch_py` is PyTorch eager with `torch.optim.Adam` "
        "(Debian's PyTorch 1.13 has no `torch.compile`, so that peer is absent); `tensorflow` is a `tf.function` "
        "over a `GradientTape` and Keras' `Adam`; `jax` is `jax.jit` of `value_and_grad` and Adam written out as "
        "Optax's (Optax is not installed), with the state donated. Keras and kiln add Adam's epsilon before the bias "
        "corrections, PyTorch and Optax after them; each peer is checked against the reference of its own "
        "convention. At 2 threads, PyTorch's OpenMP threads spin while OpenBLAS's own threads run its matmuls, "
        "and they share 2 cores: `torch_py` measured separately with `OMP_WAIT_POLICY=PASSIVE` took 2.84 ms per "
        "step instead of 11.5 ms (kiln's 2-thread step is still 2.3× faster); the table keeps PyTorch's defaults. "
        "`floor_openblas` (1 thread; `bench/results/cpp_floors.json`, a later run) is not a step but a floor "
        "under any step here: the step's eight matrix products by OpenBLAS and Adam's update of the 269,322 "
        "parameters as one SIMD pass, nothing else. In its run it took 1.70 ms and kiln's step 2.19 ms; the "
        "1-thread target of 1.5× PyTorch eager's speed asks for at most 1.65 ms, below that floor."
    )
    lines.append(
        "- 1-thread Python runs are pinned to one CPU (`taskset -c 0`) besides each library's own thread "
        "setting. TensorFlow runs eagerly in sections 2–6 and through `tf.function` (traced before timing) in "
        "sections 7–9; in section 10 it makes a new `tf.function` and calls `get_concrete_function` per call. "
        "JAX runs through `jax.jit` everywhere."
    )
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", required=True, help="folder of JSON results (bench/results)")
    parser.add_argument("--command", required=True, help="the command that produced the results")
    parser.add_argument("--markdown", required=True)
    parser.add_argument("--plot", required=True)
    args = parser.parse_args()

    s = load(args.results)
    checks = targets(s)
    machine_file = os.path.join(args.results, "machine.txt")
    machine = open(machine_file).read() if os.path.exists(machine_file) else "unknown"
    plot.plot_results(s, args.plot, copy_bandwidth, read_bandwidth, best_blas, LOOP_TRIPS)
    with open(args.markdown, "w") as f:
        f.write(markdown(s, checks, args.command, machine, os.path.basename(args.plot)))
    for c in checks:
        print(f"{'pass' if c.passed else 'FAIL' if c.passed is False else '----'}  {c.description}: {c.measured}")


if __name__ == "__main__":
    main()
