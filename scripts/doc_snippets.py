#!/usr/bin/env python3
"""Writes a C++ file that compiles every `\\code ... \\endcode` block of kiln's headers
and every ```cpp block of the Markdown documentation.

Usage: doc_snippets.py INCLUDE_DIR OUTPUT_CPP [MARKDOWN_FILE...]

Each block becomes the body of a function of its own, or, when it declares a template
or a type (or, in Markdown, starts with a function definition), the contents of a
namespace of its own; a comment names the file and line it
comes from. In Markdown, a block whose info string is exactly `cpp` is compiled; a whole
program (one with `int main(`) keeps its functions at namespace scope and its `main` is
renamed; its `#include` lines move to the top of the generated file. Code that must not
compile, or is not C++, takes another info string (```cpp-fail, ```sh, ```cmake,
```text). A Markdown file with the line `<!-- doc_snippets: not compiled -->` is skipped
(docs/compile_time_errors.md: its blocks are must-not-compile cases, which
test/compile_fail/ builds). The build compiles the result (test/CMakeLists.txt), so an
example in the documentation that stops compiling fails the build.
"""
import os
import pathlib
import re
import sys

# Blocks that declare templates (a local class cannot have member templates) compile
# at namespace scope; the others are statements, in a function.
def declares_templates(text: str) -> bool:
    return re.match(r"\s*(template\s*<|(struct|class)\s)", text) is not None and "template <" in text


def blocks(header: pathlib.Path):
    """(line, code lines) of each \\code block in the header's /// comments."""
    lines = header.read_text().split("\n")
    i = 0
    while i < len(lines):
        comment = re.match(r"\s*///(.*)$", lines[i])
        if comment and "\\code" in comment.group(1):
            start, rest = i + 1, comment.group(1).split("\\code", 1)[1]
            if "\\endcode" in rest:
                yield start, [rest.split("\\endcode")[0].strip()]
            else:
                code = [rest] if rest.strip() else []
                i += 1
                while i < len(lines):
                    text = re.match(r"\s*///\s?(.*)$", lines[i])
                    text = text.group(1) if text else ""
                    if "\\endcode" in text:
                        if text.split("\\endcode")[0].strip():
                            code.append(text.split("\\endcode")[0])
                        break
                    code.append(text)
                    i += 1
                yield start, code
        i += 1


SKIP_MARKER = "<!-- doc_snippets: not compiled -->"


def markdown_blocks(path: pathlib.Path):
    """(line, code lines) of each ```cpp block of a Markdown file (none when it is marked)."""
    lines = path.read_text(encoding="utf-8").split("\n")
    if any(line.strip() == SKIP_MARKER for line in lines):
        return
    i = 0
    while i < len(lines):
        fence = re.match(r"(\s*)(```+)\s*(\S*)\s*$", lines[i])
        if fence:
            indent, ticks, info = len(fence.group(1)), fence.group(2), fence.group(3)
            start, code = i + 1, []
            i += 1
            while i < len(lines) and lines[i].strip() != ticks:
                code.append(lines[i][indent:] if lines[i][:indent].strip() == "" else lines[i])
                i += 1
            if info == "cpp":
                yield start, code
        i += 1


def guard_for(text: str):
    """The condition under which a block that uses an optional component can compile."""
    if "kiln/distributed.hpp" in text or "kiln::distribute::" in text:
        return "#if __has_include(<mpi.h>)"
    if "kiln/onnx.hpp" in text or "kiln::onnx::" in text:
        return "#if __has_include(<onnx/onnx_pb.h>)"
    if "kiln/weights.hpp" in text or "save_weights" in text or "kiln::checkpoint" in text:
        return "#if __has_include(<hdf5.h>)"
    if "kiln/saved_function.hpp" in text or "kiln::save(" in text or "kiln::load(" in text:
        return "#if __has_include(<nlohmann/json.hpp>)"
    if "kiln::device::gpu" in text:
        return "#if KILN_HAS_THRUST"
    return None


def markdown_snippet(code, where: str, count: int):
    """The generated lines for one Markdown block: its includes first, then its code."""
    includes = [line for line in code if line.startswith("#include")]
    body = [line for line in code if not line.startswith("#include")]
    text = "\n".join(body).strip("\n")
    if re.search(r"\bint\s+main\s*\(", text):
        # A whole program: its main becomes an ordinary function of its namespace.
        text = re.sub(r"\bint\s+main\s*\(", "int main_(", text)
        return includes, ["#pragma GCC diagnostic push",
                          "#pragma GCC diagnostic ignored \"-Wreturn-type\"  // main's implicit return 0",
                          f"namespace doc_snippet_{count} {{  // {where}", text, "}",
                          "#pragma GCC diagnostic pop", ""]
    code_lines = [line for line in body if line.strip() and not line.lstrip().startswith("//")]
    head = " ".join(code_lines).split("{", 1)[0]  # a definition's declarator, over several lines
    defines_function = re.fullmatch(r"\s*[\w:<>, ]+[\s&*]+\w+\s*\([^;=\[\]]*\)\s*(const\s*)?", head)
    if declares_templates(text) or re.match(r"\s*(struct|class)\s", text) or defines_function:
        return includes, [f"namespace doc_snippet_{count} {{  // {where}", text, "}", ""]
    return includes, [f"namespace doc_snippet_{count} {{  // {where}", "[[maybe_unused]] void run() {",
                      text + "\n;", "}", "}", ""]


def main(include_dir: str, output: str, markdown=()) -> None:
    root = pathlib.Path(include_dir)
    out = [
        "// Generated by scripts/doc_snippets.py from the \\code blocks of kiln's headers and the",
        "// ```cpp blocks of its Markdown documentation.",
        "#include <kiln/kiln.hpp>",
        "#include <kiln/summary.hpp>",
        "#include <iostream>",
        "#include <vector>",
        "#if __has_include(<nlohmann/json.hpp>)",
        "#include <kiln/saved_function.hpp>",
        "#endif",
        "#if __has_include(<hdf5.h>)",
        "#include <kiln/weights.hpp>",
        "#endif",
        "#if __has_include(<onnx/onnx_pb.h>)",
        "#include <kiln/onnx.hpp>",
        "#endif",
        "#include <kiln/exec/collective_op.hpp>",
        "#include <kiln/train/replicas.hpp>",
        "#if __has_include(<mpi.h>)",
        "#include <kiln/distributed.hpp>",
        "#endif",
        "",
        "#pragma GCC diagnostic ignored \"-Wunused-variable\"",
        "#pragma GCC diagnostic ignored \"-Wunused-but-set-variable\"",
        "#pragma GCC diagnostic ignored \"-Wunused-value\"",
        "#pragma GCC diagnostic ignored \"-Wunused-result\"",
        "#pragma GCC diagnostic ignored \"-Wunused-function\"",
        "",
    ]
    count = 0
    for header in sorted(root.rglob("*.hpp")):
        for line, code in blocks(header):
            text = "\n".join(code).rstrip()
            where = f"{header.relative_to(root)}:{line}"
            # Thrust's headers are there only in builds that have Thrust, saved
            # functions only where nlohmann/json is installed, ONNX export only
            # where ONNX's schema is, the distributed component where MPI is.
            guard = None
            if str(header.relative_to(root)).startswith("kiln/backend/thrust/"):
                guard = "#if KILN_HAS_THRUST"
            elif header.name in ("weights.hpp", "hdf5.hpp"):
                guard = "#if __has_include(<hdf5.h>)"
            elif header.name == "saved_function.hpp" or ".save(" in text:
                guard = "#if __has_include(<nlohmann/json.hpp>)"
            elif header.name == "onnx.hpp":
                guard = "#if __has_include(<onnx/onnx_pb.h>)"
            elif header.name == "distributed.hpp" or str(header.relative_to(root)).startswith("kiln/distribute/"):
                guard = "#if __has_include(<mpi.h>)"
            if guard:
                out.append(guard)
            if declares_templates(text):
                out += [f"namespace snippet_{count} {{  // {where}", text, "}", ""]
            else:
                text += "\n;"  # ends an expression statement (a comment may close the last line)
                out += [f"namespace snippet_{count} {{  // {where}", "[[maybe_unused]] void run() {", text, "}", "}", ""]
            if guard:
                out.append("#endif")
            count += 1
    # The documentation's blocks: their includes go before every namespace (the optional
    # headers under the guard of their component), their code after the headers'.
    top, docs = [], []
    for path in markdown:
        path = pathlib.Path(path)
        for line, code in markdown_blocks(path):
            where = f"{os.path.relpath(path.resolve(), root.resolve().parent)}:{line}"
            includes, lines = markdown_snippet(code, where, count)
            guard = guard_for("\n".join(code))
            if guard:
                top += [guard] + includes + ["#endif"]
                docs += [guard] + lines + ["#endif"]
            else:
                top += includes
                docs += lines
            count += 1
    first_namespace = next(i for i, line in enumerate(out) if line.startswith("#pragma"))
    out[first_namespace:first_namespace] = top + [""]
    out += docs
    pathlib.Path(output).write_text("\n".join(out) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
