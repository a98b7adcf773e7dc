"""zerompi's import graph and the rules it keeps: two parts, one way, no cycles.

    python tools/import_graph.py          the graph, one line per module, then the checks
    python tools/import_graph.py --check  only the checks (exit 1 on a problem)

Every import of a zerompi module counts, also one inside a function (a lazy import hides a cycle
from Python, not from a reader). Each module belongs to one part (`part_of`):

    util      zerompi/util/*: helpers with no ZeRO in them
    core      the modules directly in zerompi/, zerompi/stages/, zerompi/memory/: the ZeRO mainline
    layer     zerompi/{LAYERS}/: ZeRO ideas a first reading can skip, each a folder
    program   zerompi/train/ and every package's __main__: what an operator runs

A folder in none of them is a problem until CORE_FOLDERS or BUILDS_ON lists it.

The rules (`problems`), each broken one named with the import that breaks it:

    util imports only util; the core imports only the core and util;
    a layer imports the core, util, its own files, and of the layers BUILDS_ON lets it build
        on only the public names (the package itself, its __init__), never their files;
    nothing below the program imports the program; a __main__ outside zerompi/train/ is a door:
        it imports only the program;
    no cycle among the modules, nor among the folders (each top-level module counts as one, a
        door as the program's).
"""
import ast
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "zerompi"
CORE_FOLDERS = ("stages", "memory")
# each layer, and the layers whose public names it may import
BUILDS_ON = {
    "checkpoint": (),
    "devices": (),
    "fused": (),
    "hierarchy": (),
    "inprocess": ("observe",),        # --check-collectives' CollectiveCheck
    "observe": (),
    "offload": (),
    "overlap": ("observe",),          # the call sites --check-collectives names
    "plan": ("hierarchy", "offload", "overlap", "quantize"),  # the run's engine, on buffers that take no memory
    "quantize": ("hierarchy",),       # qgZ's two hops over the node groups
}
LAYERS = tuple(BUILDS_ON)


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


def part_of(name):
    """("util" | "core" | "layer" | "program" | "no part", the folder or top-level module it is
    in); a folder none of them lists is in no part (a problem, until the table says where)."""
    parts = name.split(".")
    top = parts[1] if len(parts) > 1 else ""
    if top == "train" or parts[-1] == "__main__":
        return "program", top
    if top == "util":
        return "util", top
    if top in LAYERS:
        return "layer", top
    if not top or top in CORE_FOLDERS or (len(parts) == 2 and not os.path.isdir(os.path.join(ROOT, PACKAGE, top))):
        return "core", top
    return "no part", top


def rule_broken(name, dep):
    """Why `name` may not import `dep`, or None."""
    (part, folder), (dep_part, dep_folder) = part_of(name), part_of(dep)
    if part == "program":
        if folder != "train" and dep_part != "program":
            return "a __main__ outside zerompi/train/ is a door into the program"
        return None
    if dep_part == "program":
        return "nothing below the program imports the program"
    if "no part" in (part, dep_part):
        return None                       # reported once, as a module in no part
    if part == "util":
        return None if dep_part == "util" else "util imports only util"
    if part == "core":
        return None if dep_part in ("core", "util") else "the core imports only the core and util"
    if dep_part in ("core", "util") or dep_folder == folder:
        return None
    if dep_folder not in BUILDS_ON[folder]:
        return f"{folder}/ does not build on {dep_folder}/ (BUILDS_ON)"
    if dep != f"{PACKAGE}.{dep_folder}":
        return f"a layer imports another layer's public names ({PACKAGE}.{dep_folder}), not its files"
    return None


def folder_edges(edges):
    """The graph between folders, each top-level module counting as one (a door counts as the
    program's)."""
    def folder(name):
        return f"{PACKAGE}.train" if part_of(name)[0] == "program" else ".".join(name.split(".")[:2])
    found = {}
    for name, deps in edges.items():
        found.setdefault(folder(name), set()).update(folder(d) for d in deps if folder(d) != folder(name))
    return {k: sorted(v) for k, v in found.items()}


def problems(edges):
    found = [f"{name} is in no part: list zerompi/{part_of(name)[1]}/ in CORE_FOLDERS or BUILDS_ON"
             for name in sorted(edges) if part_of(name)[0] == "no part"]
    found += [f"import cycle: {' <-> '.join(c)}" for c in cycles(edges)]
    found += [f"folder cycle: {' <-> '.join(c)}" for c in cycles(folder_edges(edges))]
    for name, deps in sorted(edges.items()):
        for dep in deps:
            why = rule_broken(name, dep)
            if why:
                found.append(f"{name} imports {dep}: {why}")
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
        print(f"import_graph: {len(edges)} modules, no cycles, every import keeps the rules")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
