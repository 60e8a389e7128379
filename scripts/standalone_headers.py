#!/usr/bin/env python3
"""Checks that every public header of include/kiln compiles on its own.

Each header is compiled alone (`g++ -std=gnu++20 -fsyntax-only -I include -x c++
<header>`), in parallel: a header that needs another to be included before it breaks
tools that read one header at a time (clangd) and users who include only what they use.
Headers of optional parts are checked where their dependency is found, else skipped
by name (OPTIONAL below), never silently.

    python3 scripts/standalone_headers.py           # exit status 1 when a header fails
    python3 scripts/standalone_headers.py -j 8      # jobs (default: the CPUs)
    python3 scripts/standalone_headers.py kiln/weights.hpp   # these headers only
    CXX=clang++ python3 scripts/standalone_headers.py
"""

import concurrent.futures
import os
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent
INCLUDE = REPO / "include"

# Headers that need an optional dependency: the system header whose presence decides
# whether they are checked (None: compiled only by nvcc, which this check does not use).
OPTIONAL = {
    "kiln/distribute/collectives.hpp": "mpi.h",
    "kiln/distribute/communicator.hpp": "mpi.h",
    "kiln/distribute/data_parallel.hpp": "mpi.h",
    "kiln/distribute/runtime.hpp": "mpi.h",
    "kiln/distributed.hpp": "mpi.h",
    "kiln/io/hdf5.hpp": "hdf5.h",
    "kiln/weights.hpp": "hdf5.h",
    # Thrust's algorithms on device vectors compile only for a CUDA device system.
    "kiln/backend/thrust/shape_ops.hpp": None,
}
# Where pkg-config finds a dependency's include directories (Debian keeps hdf5.h and
# mpi.h off the default path).
PKG_CONFIG = {"mpi.h": ["ompi-cxx", "ompi", "mpich"], "hdf5.h": ["hdf5-serial", "hdf5"]}


def compiler():
    return os.environ.get("CXX", "g++")


def flags_for(system_header):
    """The compiler flags that find `system_header`, or None where it is not installed."""
    if system_header is None:
        return None
    candidates = [[]]
    for package in PKG_CONFIG.get(system_header, []):
        try:
            found = subprocess.run(["pkg-config", "--cflags", package], capture_output=True, text=True)
        except FileNotFoundError:
            break
        if found.returncode == 0:
            candidates.append(found.stdout.split())
    for flags in candidates:
        result = subprocess.run([compiler(), "-std=gnu++20", "-fsyntax-only", *flags, "-x", "c++", "-"],
                                input=f"#include <{system_header}>\n", capture_output=True, text=True)
        if result.returncode == 0:
            return flags
    return None


def check(header, flags):
    """The first error line of compiling `header` alone, or None."""
    result = subprocess.run([compiler(), "-std=gnu++20", "-fsyntax-only", *flags, "-I", str(INCLUDE), "-x", "c++",
                             str(INCLUDE / header)],
                            capture_output=True, text=True, cwd=REPO)
    if result.returncode == 0:
        return None
    errors = [line for line in result.stderr.splitlines() if "error" in line]
    return errors[0] if errors else result.stderr.strip().splitlines()[-1]


def main():
    args = sys.argv[1:]
    jobs = os.cpu_count() or 2
    if "-j" in args:
        at = args.index("-j")
        jobs = int(args[at + 1])
        del args[at:at + 2]
    headers = sorted(str(p.relative_to(INCLUDE)) for p in (INCLUDE / "kiln").rglob("*.hpp"))
    if args:
        headers = [h for h in headers if h in args]
    found = {dep: flags_for(dep) for dep in set(OPTIONAL.values())}
    skipped = [h for h in headers if h in OPTIONAL and found[OPTIONAL[h]] is None]
    checked = [h for h in headers if h not in skipped]
    flags = [found[OPTIONAL[h]] if h in OPTIONAL else [] for h in checked]
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        results = dict(zip(checked, pool.map(check, checked, flags)))
    failures = {h: e for h, e in results.items() if e is not None}
    for header, error in sorted(failures.items()):
        print(f"FAIL {header}: {error}")
    for header in skipped:
        print(f"skipped {header}: needs {OPTIONAL[header] or 'nvcc'}")
    print(f"{len(checked) - len(failures)} of {len(checked)} headers compile on their own"
          f" ({len(skipped)} skipped)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
