#!/usr/bin/env python3
"""Fails when `#include <kiln/kiln.hpp>` through the package costs g++ more memory than
its budget.

A file compiled against the compiled library (kiln.pc's flags) parses declarations, not
the bodies of kiln's non-template functions (docs/design_notes.md, "Compile time and
separate compilation"). g++ collects its heap when it has doubled the memory that was
live at its previous collection: for kiln.hpp that threshold lies near 575 MB, and an
include past it pays one more collection, 0.4 s of a 2.8 s include, which was the whole
margin over Eigen's 20-op model. GCC's `-ftime-report` total is exact from run to run,
so it shows a header's cost where timing cannot: an inline body that instantiates the
standard library (a `std::span` built from a vector checks the range concepts) adds
megabytes. The budget is g++ 12's, the compiler of the machines kiln is measured on;
another g++ prints its figure and the check is skipped.

    python3 scripts/include_budget.py           # exit status 1 over the budget
"""

import pathlib
import re
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
BUDGET_MB = 570
# kiln.pc's Cflags (CMakeLists.txt, kiln_pc_definitions) with the source tree's headers,
# at the optimization level bench/compile_times.sh measures; x86-64-v4 brings in the
# AVX-512 intrinsics that -march=native does on those machines (100 MB of the include),
# whatever CPU runs the check.
FLAGS = ["-std=c++20", "-O2", "-march=x86-64-v4", f"-I{ROOT / 'include'}", "-DKILN_SEPARATE_COMPILATION",
         "-DKILN_LIBRARY_HAS_SAVED_FUNCTIONS"]


def main():
    major = subprocess.run(["g++", "-dumpversion"], capture_output=True, text=True, check=True).stdout.strip()
    with tempfile.TemporaryDirectory() as work:
        source = pathlib.Path(work) / "include_only.cpp"
        source.write_text("#include <kiln/kiln.hpp>\nint main() {}\n", encoding="utf-8")
        result = subprocess.run(["g++", *FLAGS, "-ftime-report", "-c", str(source), "-o", str(pathlib.Path(work) / "o.o")],
                                capture_output=True, text=True)
    if result.returncode != 0:
        print(result.stderr, file=sys.stderr)
        return 1
    total = re.search(r"^ TOTAL\s*:.*?(\d+)([kMG])\s*$", result.stderr, re.M)
    if not total:
        print("no TOTAL line in g++'s -ftime-report", file=sys.stderr)
        return 1
    megabytes = int(total.group(1)) * {"k": 1 / 1024, "M": 1, "G": 1024}[total.group(2)]
    print(f"#include <kiln/kiln.hpp> through the package: g++ {major} allocates {megabytes:.0f} MB "
          f"(budget {BUDGET_MB} MB for g++ 12)")
    if major.split(".")[0] != "12":
        print("skipped: the budget is g++ 12's")
        return 0
    if megabytes > BUDGET_MB:
        print(f"over the budget: some header now defines, or instantiates, what a file compiled against the "
              f"package should only declare (docs/design_notes.md, \"Compile time and separate compilation\")",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
