#!/usr/bin/env python3
"""Lists the include cycles between the folders of include/kiln and fails on any.

A folder reaches another when one of its headers includes one of the other's; the
layering (core at the bottom, then ops, graph, runtime layers, the tiers, the optional
components) holds when no folder reaches back into a folder that reaches it. The
top-level headers (kiln.hpp, fixed.hpp, ...) gather folders and are left out.

    python3 scripts/include_cycles.py            # exit status 1 when a cycle exists
    python3 scripts/include_cycles.py --graph    # also print the folder graph
"""

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent / "include" / "kiln"
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]kiln/([a-z_]+)/([^">]+)[">]', re.M)


def folder_graph():
    """{folder: {folder it includes: [an example 'from -> to' header pair]}}"""
    graph = {}
    for header in sorted(ROOT.glob("*/**/*.hpp")):
        source = header.relative_to(ROOT).parts[0]
        graph.setdefault(source, {})
        for target, rest in INCLUDE.findall(header.read_text(encoding="utf-8")):
            if target != source:
                graph[source].setdefault(target, []).append(f"{header.relative_to(ROOT)} -> {target}/{rest}")
    return graph


def strongly_connected(graph):
    """Tarjan's algorithm: the components of more than one folder."""
    index, low, stack, on_stack, components = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return components


def main():
    graph = folder_graph()
    if "--graph" in sys.argv:
        for source in sorted(graph):
            print(f"{source}: {' '.join(sorted(graph[source])) or '-'}")
    components = strongly_connected(graph)
    for component in components:
        print("include cycle between the folders " + ", ".join(component) + ":")
        for source in component:
            for target in sorted(graph[source]):
                if target in component:
                    for edge in graph[source][target]:
                        print("  " + edge)
    if components:
        return 1
    print(f"no include cycles between the {len(graph)} folders of include/kiln")
    return 0


if __name__ == "__main__":
    sys.exit(main())
