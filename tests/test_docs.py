"""README.md and docs/ stay true to the tree: every relative link resolves, every repository path
they name exists, and README stays a front door (at most 150 lines)."""
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = ["README.md", "benchmarks/README.md"] + sorted(
    os.path.join("docs", name) for name in os.listdir(os.path.join(ROOT, "docs")) if name.endswith(".md"))
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
# a path in backquotes that starts at a top-level folder of the repository
PATH = re.compile(r"`((?:zerompi|tests|tools|benchmarks|examples|slurm|docs)/[\w./-]*)`")
MODULE = re.compile(r"\bzerompi((?:\.\w+)+)")     # zerompi.train, zerompi.devices.mpi_cuda, ...


def module_exists(dotted):
    """Whether zerompi.<dotted> names a module (a trailing attribute, as in zerompi.step.train_step,
    is allowed), or at least starts with one of zerompi's top-level modules and packages."""
    parts = dotted.strip(".").split(".")
    for end in range(len(parts), 0, -1):
        base = os.path.join(ROOT, "zerompi", *parts[:end])
        if os.path.isfile(base + ".py") or os.path.isdir(base):
            return end >= len(parts) - 1
    return False


def text_of(page):
    with open(os.path.join(ROOT, page)) as f:
        return f.read()


@pytest.mark.parametrize("page", PAGES)
def test_links_and_named_paths_exist(page):
    text, folder = text_of(page), os.path.dirname(os.path.join(ROOT, page))
    missing = [link for link in LINK.findall(text)
               if "://" not in link and not os.path.exists(os.path.join(folder, link))]
    missing += [path for path in PATH.findall(text)
                if "*" not in path and not os.path.exists(os.path.join(ROOT, path.rstrip("/.")))]
    missing += ["zerompi" + dotted for dotted in MODULE.findall(text) if not module_exists(dotted)]
    assert missing == [], f"{page} names what does not exist: {missing}"


def test_readme_is_a_front_door():
    assert len(text_of("README.md").splitlines()) <= 150


def test_the_check_finds_a_missing_path():
    assert module_exists(".step.train_step") and module_exists(".devices.mpi_cuda")
    assert not module_exists(".train_step.train_step") and not module_exists(".mpi_cuda")
    assert PATH.findall("see `zerompi/no_such_module.py` and `zerompi/step.py`") == [
        "zerompi/no_such_module.py", "zerompi/step.py"]
    assert not os.path.exists(os.path.join(ROOT, "zerompi/no_such_module.py"))


def named_tests(cell):
    """(file, test function or None) for each test a table cell names in backquotes: `file.py`,
    `file.py::test_x[id]`, then `test_y` or `...[id]` in the file named last."""
    named, current = [], None
    for token in re.findall(r"`([^`]+)`", cell):
        token = token.split("[")[0]
        if token.endswith(".py") or ".py::" in token:
            current, _, name = token.partition("::")
            named.append((current, name if name.startswith("test_") else None))
        elif token.startswith("test_") and current is not None:
            named.append((current, token))
    return named


def test_every_fault_names_a_test_that_exists():
    """Each row of the tables of docs/faults-and-bad-input.md whose last column names tests names
    files and test functions that exist (a row can neither go stale nor name no test)."""
    lines = text_of("docs/faults-and-bad-input.md").splitlines() + [""]
    rows = [line for line, below in zip(lines, lines[1:])       # a table's rows, not its header
            if line.startswith("| ") and line.count(" | ") >= 3 and not below.startswith("|---")]
    missing, untested = [], []
    for row in rows:
        cell = row.rstrip(" |").rsplit(" | ", 1)[1]
        named = named_tests(cell)
        if not named and cell.strip() != "same":
            untested.append(row[:60])
        for file, name in named:
            path = next((os.path.join(ROOT, folder, file) for folder in ("tests", "tests/mpi")
                         if os.path.isfile(os.path.join(ROOT, folder, file))), None)
            if path is None or (name and f"def {name}(" not in open(path).read()):
                missing.append(f"{file}::{name}")
    assert rows and missing == [] and untested == [], (missing, untested)
