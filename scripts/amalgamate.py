#!/usr/bin/env python3
"""Generates single_include/kiln/kiln.hpp from include/kiln/kiln.hpp,
single_include/kiln/fixed.hpp (the compile-time tier alone) from include/kiln/fixed.hpp,
and the optional parts single_include/kiln/saved_function.hpp, onnx.hpp, summary.hpp and
distributed.hpp (which include the single kiln.hpp rather than a copy of it) from theirs.

Every `#include "kiln/..."` is replaced by the text of that header the first time it
is met, so each header appears once, after the headers it includes; later includes of
it are dropped. System includes stay as they are. The output depends only on the
headers, never on time or machine, so CI can regenerate it and compare.

Each header's text is wrapped in an include guard named after it, so that both
single headers can be included in one file: the second skips what the first gave.
An optional part includes the single kiln.hpp, and inlines only the headers that
kiln.hpp does not already hold at that point.
A header first met inside a conditional block (`#if KILN_HAS_THRUST ... #endif`) is
only there when the condition holds, so it is inlined again where a later include
needs it outside that block.

    python3 scripts/amalgamate.py            # rewrite the single header
    python3 scripts/amalgamate.py --check    # exit 1 if it is out of date
"""

import argparse
import pathlib
import re
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent
INCLUDE_DIR = REPO / "include"
# Each root, and the kiln headers it includes as they are rather than inlining them.
ROOT_HEADERS = {
    "kiln/kiln.hpp": (),
    "kiln/fixed.hpp": (),
    "kiln/saved_function.hpp": ("kiln/kiln.hpp",),
    "kiln/onnx.hpp": ("kiln/kiln.hpp",),
    "kiln/summary.hpp": ("kiln/kiln.hpp",),
    "kiln/weights.hpp": ("kiln/kiln.hpp",),
    "kiln/distributed.hpp": ("kiln/kiln.hpp",),
}
OUTPUT_DIR = REPO / "single_include"
COMMAND = "python3 scripts/amalgamate.py"

KILN_INCLUDE = re.compile(r'^\s*#\s*include\s*[<"](kiln/[^">]+)[">]')
PRAGMA_ONCE = re.compile(r"^\s*#\s*pragma\s+once\b")
OPENS_CONDITIONAL = re.compile(r"^\s*#\s*if(n?def)?\b")
NEXT_BRANCH = re.compile(r"^\s*#\s*(elif(n?def)?|else)\b")
CLOSES_CONDITIONAL = re.compile(r"^\s*#\s*endif\b")


class AmalgamationError(Exception):
    pass


class Amalgamator:
    """Inlines headers depth first. A *branch path* names where a line sits: the
    conditional branches (`#if`/`#elif`/`#else` blocks, numbered in output order)
    enclosing it; () is unconditional. Text emitted on path P is visible from path Q
    exactly when P is a prefix of Q."""

    def __init__(self, root, kept=()):
        self.root = root
        self.kept = kept
        self.lines = []
        self.emitted_on = {}  # header -> branch paths where its text was emitted
        self.provided = {}  # header -> branch paths where a kept header's include gives it
        self.branch_count = 0

    def new_branch(self):
        self.branch_count += 1
        return self.branch_count

    def visible(self, header, path):
        return any(path[:len(p)] == p for p in self.emitted_on.get(header, []) + self.provided.get(header, []))

    @staticmethod
    def unconditional_includes(header, seen):
        """The kiln headers `header` includes outside any conditional block, and theirs."""
        depth = 0
        for line in (INCLUDE_DIR / header).read_text(encoding="utf-8").splitlines():
            if OPENS_CONDITIONAL.match(line):
                depth += 1
            elif CLOSES_CONDITIONAL.match(line) and depth:
                depth -= 1
            match = KILN_INCLUDE.match(line)
            if match and depth == 0 and match.group(1) not in seen:
                seen.add(match.group(1))
                Amalgamator.unconditional_includes(match.group(1), seen)
        return seen

    def inline(self, header, path, included_from):
        source = INCLUDE_DIR / header
        if not source.is_file():
            raise AmalgamationError(f"{included_from}: cannot find {header} under include/")
        guard = "KILN_SINGLE_INCLUDE_" + re.sub(r"[^A-Za-z0-9]", "_", header).upper()
        self.lines += [f"#ifndef {guard}", f"#define {guard}"]
        self.emitted_on.setdefault(header, []).append(path)
        self.lines.append(f"// ----- begin {header} -----")
        branches = []
        for number, line in enumerate(source.read_text(encoding="utf-8").splitlines(), start=1):
            if PRAGMA_ONCE.match(line):
                continue
            if OPENS_CONDITIONAL.match(line):
                branches.append(self.new_branch())
            elif NEXT_BRANCH.match(line) and branches:
                branches[-1] = self.new_branch()
            elif CLOSES_CONDITIONAL.match(line) and branches:
                branches.pop()
            match = KILN_INCLUDE.match(line)
            if match and match.group(1) in self.kept:
                # What the kept single header holds is there from this line on: a later
                # include of one of its headers is not inlined again.
                for given in self.unconditional_includes(match.group(1), {match.group(1)}):
                    self.provided.setdefault(given, []).append(path + tuple(branches))
            if not match or match.group(1) in self.kept:
                self.lines.append(line)
                continue
            dependency_path = path + tuple(branches)
            if not self.visible(match.group(1), dependency_path):
                self.inline(match.group(1), dependency_path, f"{header}:{number}")
        self.lines.append(f"// ----- end {header} -----")
        self.lines.append(f"#endif  // {guard}")

    def text(self):
        header = [
            f"// kiln single header, generated from include/{self.root} by `{COMMAND}`.",
            "// Do not edit: change the headers under include/ and regenerate.",
            "#pragma once",
        ]
        return "\n".join(header + self.lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="do not write; exit 1 when the checked-in file differs")
    args = parser.parse_args()

    for root, kept in ROOT_HEADERS.items():
        amalgamator = Amalgamator(root, kept)
        try:
            amalgamator.inline(root, (), "command line")
        except AmalgamationError as error:
            sys.exit(f"amalgamate.py: {error}")
        text = amalgamator.text()
        output = OUTPUT_DIR / root

        if args.check:
            current = output.read_text(encoding="utf-8") if output.is_file() else None
            if current != text:
                sys.exit(f"{output.relative_to(REPO)} is out of date; run `{COMMAND}`")
            continue
        output.parent.mkdir(parents=True, exist_ok=True)
        # newline="\n" keeps the output byte-identical on every platform.
        with open(output, "w", encoding="utf-8", newline="\n") as out:
            out.write(text)
        print(f"wrote {output.relative_to(REPO)} ({len(amalgamator.emitted_on)} headers, "
              f"{text.count(chr(10))} lines)")

if __name__ == "__main__":
    main()
