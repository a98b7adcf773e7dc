"""The package's size budget, stated in README.md and checked by tests/repository/test_size_budget.py.

    python tools/size_budget.py           the lines counted, beside the budget
    python tools/size_budget.py --check   exit 1 naming each number over its budget

README.md states the budget in one sentence (its only home), which this reads:

    Size budget (...): the core 2,650 lines, each stage file 95, the largest file 400, the package 12,100.

Counted in physical lines of the .py files of zerompi/: the core (the part tools/import_graph.py
calls core), each stage file (zerompi/stages/stage0.py .. zerompi/stages/stage3.py), the largest
file, and the whole package. A change may raise a number only in the commit that needs it, saying why.
"""
import os
import re
import sys

import import_graph

BUDGET_LINE = re.compile(r"Size\s+budget(?:\s+\([^)]*\))?:\s+the\s+core\s+([\d,]+)\s+lines,\s+each\s+stage\s+file\s+"
                         r"([\d,]+),\s+the\s+largest\s+file\s+([\d,]+),\s+the\s+package\s+([\d,]+)\.")
NAMES = ("core", "stage file", "largest file", "package")


def budget(readme_text):
    """{name: lines} from README's budget line."""
    match = BUDGET_LINE.search(readme_text)
    if match is None:
        raise ValueError("README.md states no size budget (a line 'Size budget: the core N lines, ...')")
    return {name: int(value.replace(",", "")) for name, value in zip(NAMES, match.groups())}


def measured(files):
    """{name: (lines, what)} from files {dotted module: path}."""
    lines = {name: sum(1 for _ in open(path)) for name, path in files.items()}
    stages = {n: c for n, c in lines.items() if re.fullmatch(rf"{import_graph.PACKAGE}\.stages\.stage\d", n)}
    largest = max(lines, key=lines.get)
    top_stage = max(stages, key=stages.get)
    return {"core": (sum(c for n, c in lines.items() if import_graph.part_of(n)[0] == "core"), "the core"),
            "stage file": (stages[top_stage], top_stage),
            "largest file": (lines[largest], largest),
            "package": (sum(lines.values()), f"{len(lines)} modules")}


def problems(limits, counts):
    return [f"{name}: {counts[name][0]:,} lines ({counts[name][1]}), over its budget of {limits[name]:,}"
            for name in NAMES if counts[name][0] > limits[name]]


def main(argv):
    with open(os.path.join(import_graph.ROOT, "README.md")) as f:
        limits = budget(f.read())
    counts = measured(import_graph.modules())
    if "--check" not in argv:
        for name in NAMES:
            print(f"{name:<13} {counts[name][0]:>7,} of {limits[name]:>7,}  {counts[name][1]}")
    found = problems(limits, counts)
    for problem in found:
        print(f"size_budget: {problem}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
