"""Print zerompi's import graph and check that it is a stack: no cycles, and no module below the
program importing the program.

    python tools/import_graph.py          the graph, one line per module, then the checks
    python tools/import_graph.py --check  only the checks (exit 1 on a problem)

Every import of a zerompi module counts, also one inside a function (a lazy import hides a cycle
from Python, not from a reader). Modules are grouped as README's reading order groups them:

    core      zerompi.{step, layout, stages.*, collectives, comm, adam, model, layers, engine,
              ledger, precision, memory}
    layers    zerompi.overlap.*, zerompi.devices.*, zerompi.observe.*, zerompi.checkpoint.*
    program   zerompi.train.* (the command line), and the package entry points

The rule checked besides acyclicity: nothing outside zerompi.train imports zerompi.train.
"""
import ast
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "zerompi"


def modules():
    """{dotted module name: path} of every module of the package."""
    found = {}
    for folder, _, files in os.walk(os.path.join(ROOT, PACKAGE)):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                dotted = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                found[dotted.removesuffix(".__init__")] = path
    return found


def imports_of(name, path, known):
    """The zerompi modules that module `name` imports, anywhere in its code."""
    is_package = path.endswith("__init__.py")
    here = name.split(".") if is_package else name.split(".")[:-1]
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = here[:len(here) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            # "from . import x" and "from .pkg import mod" may name modules
            targets = [module] + [f"{module}.{alias.name}" for alias in node.names]
        else:
            continue
        found.update(t for t in targets if t in known and t != name)
    return found


def graph():
    known = modules()
    return {name: sorted(imports_of(name, path, known)) for name, path in sorted(known.items())}


def cycles(edges):
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, []):
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
                found.append(sorted(component))

    for v in edges:
        if v not in index:
            visit(v)
    return found


def problems(edges):
    found = [f"import cycle: {' <-> '.join(c)}" for c in cycles(edges)]
    program = f"{PACKAGE}.train"
    for name, deps in edges.items():
        if not (name == program or name.startswith(program + ".")):
            found += [f"{name} imports the program ({dep})" for dep in deps
                      if dep == program or dep.startswith(program + ".")]
    return found


def main(argv):
    edges = graph()
    if "--check" not in argv:
        width = max(len(name) for name in edges)
        for name, deps in edges.items():
            short = [d.removeprefix(PACKAGE + ".") for d in deps]
            print(f"{name.removeprefix(PACKAGE + '.') or PACKAGE:<{width - len(PACKAGE) - 1}}  <- "
                  f"{', '.join(short) if short else '(nothing of zerompi)'}")
    found = problems(edges)
    for problem in found:
        print(f"import_graph: {problem}", file=sys.stderr)
    if not found:
        print(f"import_graph: {len(edges)} modules, no cycles, nothing below the program imports it")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
