#!/usr/bin/env python3
"""PyTorch's CUDA peers of bench_gpu.cu, on the same inputs' sizes: eager and
torch.compile for the five-op chain, eager for the add, cuBLAS (TF32 off, so float32
as kiln's) for the matmul. Each row is the median wall time of finished work
(torch.cuda.synchronize after each call), in microseconds, written as JSON lines:
{"name": "<case>/<peer>", "us": t}."""

import argparse
import json
import statistics
import time

import torch


def timed(fn, seconds):
    fn()
    torch.cuda.synchronize()
    times = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or len(times) < 10:
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def chain(x):
    return torch.tanh(x * 0.5 + 1.0) * x - 0.25


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=1.0)
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    n, m = 1 << 24, 1024
    a = torch.rand(n, device="cuda") * 2 - 1
    b = torch.rand(n, device="cuda") * 2 - 1
    ma = torch.rand(m, m, device="cuda") * 2 - 1
    mb = torch.rand(m, m, device="cuda") * 2 - 1
    compiled = torch.compile(chain)
    rows = {
        "gpu_add_16M/torch": lambda: a + b,
        "gpu_chain_16M/torch": lambda: chain(a),
        "gpu_chain_16M/torch_compile": lambda: compiled(a),
        "gpu_matmul_1024/torch_cublas": lambda: ma @ mb,
    }
    for name, fn in rows.items():
        print(json.dumps({"name": name, "us": round(timed(fn, args.seconds), 2)}), flush=True)


if __name__ == "__main__":
    main()
