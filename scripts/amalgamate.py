#!/usr/bin/env python3
"""Generates single_include/kiln/kiln.hpp from include/kiln/kiln.hpp.

Every `#include "kiln/..."` is replaced by the text of that header, the first
time it is met (so each header appears once, after the headers it includes);
later includes of the same header are dropped. System includes stay as they
are. The output depends only on the headers, never on time or machine, so CI
can regenerate it and compare.

    python3 scripts/amalgamate.py            # rewrite the single header
    python3 scripts/amalgamate.py --check    # exit 1 if it is out of date
"""

import argparse
import pathlib
import re
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent
INCLUDE_DIR = REPO / "include"
ROOT_HEADER = "kiln/kiln.hpp"
OUTPUT = REPO / "single_include" / "kiln" / "kiln.hpp"
COMMAND = "python3 scripts/amalgamate.py"

KILN_INCLUDE = re.compile(r'^\s*#\s*include\s*[<"](kiln/[^">]+)[">]')
PRAGMA_ONCE = re.compile(r"^\s*#\s*pragma\s+once\b")
OPENS_CONDITIONAL = re.compile(r"^\s*#\s*if(n?def)?\b")
CLOSES_CONDITIONAL = re.compile(r"^\s*#\s*endif\b")


class AmalgamationError(Exception):
    pass


class Amalgamator:
    def __init__(self):
        self.lines = []
        self.emitted = set()
        # Headers first inlined inside an #if: their text is only there, so an
        # unconditional include of them later would silently lose it.
        self.conditional_first_use = {}

    def inline(self, header, outer_depth, included_from):
        path = INCLUDE_DIR / header
        if not path.is_file():
            raise AmalgamationError(f"{included_from}: cannot find {header} under include/")
        self.emitted.add(header)
        if outer_depth > 0:
            self.conditional_first_use[header] = included_from
        self.lines.append(f"// ----- begin {header} -----")
        depth = 0
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            where = f"{header}:{number}"
            if PRAGMA_ONCE.match(line):
                continue
            if OPENS_CONDITIONAL.match(line):
                depth += 1
            elif CLOSES_CONDITIONAL.match(line):
                depth -= 1
            match = KILN_INCLUDE.match(line)
            if not match:
                self.lines.append(line)
                continue
            dependency = match.group(1)
            if dependency in self.conditional_first_use and outer_depth + depth == 0:
                raise AmalgamationError(
                    f"{where}: {dependency} is included unconditionally here but was first "
                    f"included under #if at {self.conditional_first_use[dependency]}; "
                    f"include it unconditionally before that point")
            if dependency not in self.emitted:
                self.inline(dependency, outer_depth + depth, where)
        self.lines.append(f"// ----- end {header} -----")

    def text(self):
        header = [
            f"// kiln single header, generated from include/{ROOT_HEADER} by `{COMMAND}`.",
            "// Do not edit: change the headers under include/ and regenerate.",
            "#pragma once",
        ]
        return "\n".join(header + self.lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="do not write; exit 1 when the checked-in file differs")
    args = parser.parse_args()

    amalgamator = Amalgamator()
    try:
        amalgamator.inline(ROOT_HEADER, 0, "command line")
    except AmalgamationError as error:
        sys.exit(f"amalgamate.py: {error}")
    text = amalgamator.text()

    if args.check:
        current = OUTPUT.read_text(encoding="utf-8") if OUTPUT.is_file() else None
        if current != text:
            sys.exit(f"{OUTPUT.relative_to(REPO)} is out of date; run `{COMMAND}`")
        return
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    # newline="\n" keeps the output byte-identical on every platform.
    with open(OUTPUT, "w", encoding="utf-8", newline="\n") as out:
        out.write(text)
    print(f"wrote {OUTPUT.relative_to(REPO)} ({len(amalgamator.emitted)} headers, "
          f"{text.count(chr(10))} lines)")


if __name__ == "__main__":
    main()
