"""Every third-party package zerompi imports is declared in pyproject.toml, with the right marker.

Read statically (ast over every module, tomllib over pyproject.toml), so that it checks Python
versions no interpreter here runs (3.10 needs `tomli`). The rules:

    an import at module level (run when the module is imported: the training path)
        -> a core dependency (`[project] dependencies`); under an `if sys.version_info ...` guard,
           its `python_version` marker holds on exactly the supported versions that run the import
    an import inside a function (run only by the feature that calls it: GPU, NCCL, TensorBoard)
        -> a core dependency or in an extra other than `test` (the test extra is for the tests;
           nobody installs it to use a feature)
    examples/ (optional by nature: plotting)
        -> every import a core dependency or in an extra

Import names map to the distributions that provide them in DISTRIBUTIONS (one name, any of its
distributions will do: `cupy` is `cupy-cuda12x` or `cupy-cuda13x`); an import missing from that
table fails too, so that a new dependency is declared on purpose.
"""
import ast
import os
import re
import subprocess
import sys
import tomllib

from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# import name -> the distributions (any one) that provide it
DISTRIBUTIONS = {
    "numpy": {"numpy"},
    "mpi4py": {"mpi4py"},
    "threadpoolctl": {"threadpoolctl"},
    "ml_dtypes": {"ml-dtypes"},
    "tomli": {"tomli"},
    "tqdm": {"tqdm"},
    "tensorboardX": {"tensorboardx"},
    "cupy": {"cupy-cuda12x", "cupy-cuda13x"},
    "cupy_backends": {"cupy-cuda12x", "cupy-cuda13x"},
    "matplotlib": {"matplotlib"},
    "numba": {"numba"},
    "safetensors": {"safetensors"},
    "yaml": {"pyyaml"},
}
PYTHON_VERSIONS = [(3, minor) for minor in range(6, 20)]   # candidates; requires-python picks the supported ones
NOT_FOR_FEATURES = {"test"}                                 # extras that do not count for an import


def version_guard(test):
    """The predicate on (major, minor) of an `if sys.version_info <op> (3, N)` test, else None."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
        return None
    left = test.left.value if isinstance(test.left, ast.Subscript) else test.left
    if not (isinstance(left, ast.Attribute) and left.attr == "version_info"):
        return None
    bound = tuple(ast.literal_eval(test.comparators[0]))[:2]
    return {ast.GtE: lambda v: v >= bound, ast.Gt: lambda v: v > bound, ast.Lt: lambda v: v < bound,
            ast.LtE: lambda v: v <= bound}[type(test.ops[0])]


def imported_by_name(node):
    """The module a call like importlib.import_module("x") or __import__("x") imports, else None
    (a name computed at run time cannot be read; zerompi names its modules literally)."""
    if not (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)):
        return None
    function = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
    return node.args[0].value if function in ("import_module", "__import__") else None


def imports(source):
    """(line, top-level name, at module level?, predicate on the Python version that runs it)."""
    found = []

    def visit(node, module_level, runs):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, a.name.split(".")[0], module_level, runs) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            found.append((node.lineno, node.module.split(".")[0], module_level, runs))
        elif imported_by_name(node):                      # importlib.import_module("x"), __import__("x")
            found.append((node.lineno, imported_by_name(node).split(".")[0], module_level, runs))
            for child in ast.iter_child_nodes(node):
                visit(child, module_level, runs)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for child in ast.iter_child_nodes(node):
                visit(child, False, runs)
        elif isinstance(node, ast.If) and version_guard(node.test):
            guard = version_guard(node.test)
            for child in node.body:
                visit(child, module_level, lambda v, runs=runs: runs(v) and guard(v))
            for child in node.orelse:
                visit(child, module_level, lambda v, runs=runs: runs(v) and not guard(v))
        else:
            for child in ast.iter_child_nodes(node):
                visit(child, module_level, runs)

    visit(ast.parse(source), True, lambda v: True)
    return found


def declared(pyproject):
    """{distribution: [(extra or None for core, set of supported versions its marker holds on)]}"""
    supported = [v for v in PYTHON_VERSIONS
                 if f"{v[0]}.{v[1]}" in SpecifierSet(pyproject["project"].get("requires-python", ""))]
    project = pyproject["project"]
    groups = [(None, project.get("dependencies", []))] + sorted(project.get("optional-dependencies", {}).items())
    table = {}
    for extra, requirements in groups:
        for text in requirements:
            requirement = Requirement(text)
            marker = requirement.marker or Marker("python_version >= '0'")
            holds = {v for v in supported if marker.evaluate({"python_version": f"{v[0]}.{v[1]}", "extra": ""})}
            table.setdefault(canonicalize_name(requirement.name), []).append((extra, holds))
    return table, set(supported)


def problems(modules, pyproject, optional_modules=()):
    """Every import of `modules` ({path: source}) that pyproject does not declare as the rules say;
    `optional_modules` ({path: source}, examples/) may take any extra for any import."""
    table, supported = declared(pyproject)
    # examples/ import their own helper modules by name; zerompi's modules import each other
    # relatively or as zerompi.<name>, so a bare name there (`import config`) is a third-party package
    local = {os.path.splitext(os.path.basename(path))[0] for path in dict(optional_modules)}
    found = []
    for path, source, optional in [(p, s, False) for p, s in modules.items()] + \
                                  [(p, s, True) for p, s in dict(optional_modules).items()]:
        for line, name, module_level, runs in imports(source):
            if name in sys.stdlib_module_names or name == "zerompi" or name in local:   # local: examples/' helpers
                continue
            where = f"{path}:{line}: import {name}"
            if name not in DISTRIBUTIONS:
                found.append(f"{where}: unknown third-party package: declare it in pyproject.toml and add it "
                             f"to DISTRIBUTIONS in tests/repository/test_dependencies.py")
                continue
            needed = {v for v in supported if runs(v)}
            declarations = [d for dist in DISTRIBUTIONS[name] for d in table.get(dist, [])]
            core = [holds for extra, holds in declarations if extra is None]
            extras = [extra for extra, holds in declarations if extra not in (None, *NOT_FOR_FEATURES)]
            names = " or ".join(sorted(DISTRIBUTIONS[name]))
            if module_level and not optional:
                if not core:
                    found.append(f"{where} at module level: {names} must be a core dependency"
                                 + (f" (it is only in the extras {extras})" if extras else ""))
                elif needed != supported and needed not in core:
                    found.append(f"{where} runs on Python {pretty(needed)} only: declare {names} with the "
                                 f"python_version marker for exactly those")
                elif not any(needed <= holds for holds in core):
                    found.append(f"{where}: the python_version marker of {names} leaves out Python "
                                 f"{pretty(needed - set().union(*core))}")
            elif not core and not extras:
                found.append(f"{where} (optional): {names} is neither a core dependency nor in an extra")
    return found


def pretty(versions):
    return ", ".join(f"{v[0]}.{v[1]}" for v in sorted(versions))


def sources(folder):
    found = {}
    for directory, _, files in os.walk(os.path.join(ROOT, folder)):
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(directory, name)
                found[os.path.relpath(path, ROOT)] = open(path, encoding="utf-8").read()
    return found


def pyproject():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)


def test_every_import_of_zerompi_and_the_examples_is_declared_with_its_marker():
    modules = sources("zerompi")
    assert len(modules) > 50
    assert problems(modules, pyproject(), sources("examples")) == []


def test_tomli_is_declared_for_python_before_3_11_only():
    table, supported = declared(pyproject())
    assert table["tomli"] == [(None, {v for v in supported if v < (3, 11)})]
    assert (3, 10) in supported


def test_the_tensorboard_extra_brings_the_command_the_docs_tell_to_run():
    """docs/observability.md: `pip install -e '.[tensorboard]'`, then `tensorboard --logdir DIR`; the
    writer (tensorboardX) alone has no `tensorboard` command."""
    table, _ = declared(pyproject())
    assert ("tensorboard" in [extra for extra, _ in table["tensorboard"]]
            and "tensorboard" in [extra for extra, _ in table["tensorboardx"]]), table.get("tensorboard")


FAKE_PYPROJECT = {"project": {
    "requires-python": ">=3.10",
    "dependencies": ["numpy>=1.24", "tomli>=1.1", "ml_dtypes; python_version >= '3.12'"],
    "optional-dependencies": {"plot": ["matplotlib"], "test": ["cupy-cuda12x"]},
}}
FAKE_MODULE = '''\
import os
import sys
import numpy as np
import tqdm
import matplotlib.pyplot as plt
import ml_dtypes
import frobnicate

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib


def on_gpu():
    import cupy
    from matplotlib import pyplot
    import numpy


def by_name():
    import importlib
    importlib.import_module("frobnicate.sub")
    return __import__("fake")
'''


def test_the_check_reports_each_kind_of_undeclared_import_with_its_line():
    found = problems({"zerompi/fake.py": FAKE_MODULE}, FAKE_PYPROJECT)
    assert len(found) == 8, found
    expected = [
        "zerompi/fake.py:4: import tqdm at module level: tqdm must be a core dependency",
        "zerompi/fake.py:5: import matplotlib at module level: matplotlib must be a core dependency (it is only "
        "in the extras ['plot'])",
        "zerompi/fake.py:6: import ml_dtypes: the python_version marker of ml-dtypes leaves out Python 3.10, 3.11",
        "zerompi/fake.py:7: import frobnicate: unknown third-party package",
        "zerompi/fake.py:12: import tomli runs on Python 3.10 only: declare tomli with the python_version marker "
        "for exactly those",
        "zerompi/fake.py:16: import cupy (optional): cupy-cuda12x or cupy-cuda13x is neither a core dependency "
        "nor in an extra",        # the test extra does not count
        "zerompi/fake.py:23: import frobnicate: unknown third-party package",
        "zerompi/fake.py:24: import fake: unknown third-party package",   # its own file name is no excuse
    ]
    for line, want in zip(found, expected):
        assert line.startswith(want), (line, want)


def test_the_same_module_passes_once_declared():
    fixed = {"project": {
        "requires-python": ">=3.10",
        "dependencies": ["numpy>=1.24", "tomli>=1.1; python_version < '3.11'", "ml_dtypes", "tqdm",
                         "matplotlib"],
        "optional-dependencies": {"gpu": ["cupy-cuda12x"]},
    }}
    module = FAKE_MODULE.replace("import frobnicate\n", "").split("\n\n\ndef by_name")[0]
    assert problems({"zerompi/fake.py": module}, fixed) == []


def test_an_example_may_take_its_imports_from_an_extra():
    example = "import matplotlib.pyplot as plt\nimport numpy as np\n"
    assert problems({}, FAKE_PYPROJECT, {"examples/plot.py": example}) == []
    assert len(problems({}, FAKE_PYPROJECT, {"examples/plot.py": "import tqdm\n"})) == 1


def test_every_install_hint_works_from_a_checkout():
    """zerompi is installed from its checkout, not from PyPI: no hint says `pip install zerompi...`;
    and a hint that names a PyPI package (`pip install cupy-cuda12x`) names one pyproject declares."""
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    declared_names = set(declared(pyproject())[0])
    wrong = []
    for name in tracked.split():
        path = os.path.join(ROOT, name)
        if not name.endswith((".py", ".md", ".sh", ".sbatch", ".toml")) or not os.path.isfile(path):
            continue
        for number, line in enumerate(open(path, encoding="utf-8"), 1):
            for hint in re.findall(r"pip install ([^)`\"\n;&]*)", line):
                words = [w.strip("'\",") for w in hint.split() if not w.startswith("-")]
                if any(w == "zerompi" or w.startswith("zerompi[") for w in words):
                    wrong.append(f"{name}:{number}: {line.strip()}")
    assert wrong == []
    assert {"cupy-cuda12x", "cupy-cuda13x"} <= declared_names          # the hint in zerompi/train/options/device_choice.py
