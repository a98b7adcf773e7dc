"""README.md and docs/ stay true to the tree: every relative link resolves, every repository path
they name exists, and README stays a front door (at most 150 lines)."""
import os
import sys
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAGES = ["README.md", "benchmarks/README.md"] + sorted(
    os.path.join("docs", name) for name in os.listdir(os.path.join(ROOT, "docs")) if name.endswith(".md"))
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
# a path in backquotes that starts at a top-level folder of the repository
PATH = re.compile(r"`((?:zerompi|tests|tools|benchmarks|examples|slurm|docs)/[\w./-]*)`")
MODULE = re.compile(r"\bzerompi((?:\.\w+)+)")     # zerompi.train, zerompi.devices.mpi_cuda, ...


def module_exists(dotted):
    """Whether zerompi.<dotted> names a module, or a module and a name it defines or imports (as
    zerompi.step.train_step)."""
    parts = dotted.strip(".").split(".")
    for end in range(len(parts), -1, -1):
        base = os.path.join(ROOT, "zerompi", *parts[:end])
        if os.path.isfile(base + ".py") or os.path.isdir(base):
            if end == len(parts):
                return True
            source = base + ".py" if os.path.isfile(base + ".py") else os.path.join(base, "__init__.py")
            return end == len(parts) - 1 and defines(source, parts[-1])
    return False


def defines(source, name):
    """Whether the Python file (or every file of the folder) `source` holds the identifier `name`."""
    if os.path.isdir(source):
        sources = [os.path.join(top, f) for top, _, names in os.walk(source) for f in names if f.endswith(".py")]
    else:
        sources = [source] if os.path.isfile(source) else []
    return any(re.search(rf"\b{re.escape(name)}\b", open(path).read()) for path in sources)


# "zerompi/plan/__init__.py's RunShape", "zerompi/hierarchy/'s `hierarchy_for`": a name that looks
# like code (backquoted, or with an underscore or a capital) must be in that file or folder
POSSESSIVE = re.compile(r"(?<![\w/.-])((?:zerompi|tools|tests|benchmarks|examples)/[\w/.-]*?)'s "
                        r"(?:`(\w+)`|([A-Za-z]*[A-Z_][\w]*))")


def stale_symbols(text):
    """The 'PATH's NAME' and zerompi.<dotted names> of text that name nothing that exists."""
    found = []
    for path, quoted, bare in POSSESSIVE.findall(text):
        name = quoted or bare
        if not (os.path.exists(os.path.join(ROOT, path)) and defines(os.path.join(ROOT, path.rstrip("/")), name)):
            found.append(f"{path}'s {name}")
    return found + ["zerompi" + dotted for dotted in MODULE.findall(text) if not module_exists(dotted)]


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
    missing += stale_symbols(text)
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
            path = next((os.path.join(ROOT, folder, file) for folder in ("tests", "tests/proofs", "tests/reference", "tests/program", "tests/repository")
                         if os.path.isfile(os.path.join(ROOT, folder, file))), None)
            if path is None or (name and f"def {name}(" not in open(path).read()):
                missing.append(f"{file}::{name}")
    assert rows and missing == [] and untested == [], (missing, untested)


FLAGS_ONLY = re.compile(r"--[a-z-]+ \S+(?: --[a-z-]+ \S+)*")


def first_checks_rows():
    """(inputs, quotes) of each row of docs/faults-and-bad-input.md's first-checks table whose
    inputs are all plain flags with values (the others need files, ranks or a GPU: tests/proofs/test_cli.py)."""
    text = text_of("docs/faults-and-bad-input.md")
    table = text[text.index("## Bad input: the first checks"):].split("\n\n## ")[0]
    rows = []
    for line in table.splitlines()[2:]:
        if not line.startswith("| ") or line.startswith("|---") or line.startswith("| input |"):
            continue
        first, second = line.strip("| ").split(" | ")[:2]
        inputs = re.findall(r"`([^`]+)`", first)
        if inputs and all(FLAGS_ONLY.fullmatch(item) and "gpu" not in item and "nccl" not in item for item in inputs) \
                and first == ", ".join(f"`{item}`" for item in inputs):
            rows.append((inputs, [piece.strip() for quote in re.findall(r"`([^`]+)`", second)
                                  for piece in quote.split("...") if len(piece.strip()) >= 8]))
    return rows


def test_the_first_checks_quote_what_the_program_prints():
    """Each quote of a row whose inputs are flags is found in what those flags print, and each of
    them is refused (exit 2)."""
    import subprocess
    import sys
    rows = first_checks_rows()
    assert len(rows) >= 5, rows
    for inputs, quotes in rows:
        runs = [subprocess.run([sys.executable, "-m", "zerompi.train", *item.split()], capture_output=True,
                               text=True, timeout=120) for item in inputs]
        assert [run.returncode for run in runs] == [2] * len(inputs), (inputs, [run.stderr for run in runs])
        printed = "".join(run.stderr for run in runs)
        missing = [quote for quote in quotes if quote not in printed]
        assert missing == [], f"{inputs}: the table quotes {missing}, they print:\n{printed}"


NAMED_LINK = re.compile(r"\[`?([\w./-]+\.(?:md|py|sh|sbatch|toml|json))`?\]\(([^)#\s]+)(?:#[^)]*)?\)")


@pytest.mark.parametrize("page", PAGES)
def test_a_link_whose_text_names_a_file_goes_to_that_file(page):
    """A link such as [command-line.md](faults-and-bad-input.md) sends a reader elsewhere than it says."""
    wrong = [(text, target) for text, target in NAMED_LINK.findall(text_of(page))
             if "://" not in target and os.path.basename(text) != os.path.basename(target)]
    assert wrong == [], f"{page}: links whose text names another file: {wrong}"
    assert NAMED_LINK.findall("[a.md](b.md#x) [`tools/x.py`](../tools/x.py)") == [("a.md", "b.md"),
                                                                                 ("tools/x.py", "../tools/x.py")]


def prose_of(path):
    """The docstrings (module, classes, functions) and comments of a Python file."""
    import ast
    import io
    import tokenize
    with open(path) as f:
        text = f.read()
    found = [ast.get_docstring(node, clean=False) or "" for node in ast.walk(ast.parse(text))
             if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
    found += [token.string for token in tokenize.generate_tokens(io.StringIO(text).readline)
              if token.type == tokenize.COMMENT]
    return "\n".join(found)


SOURCE_PATH = re.compile(r"(?<![\w/.-])((?:zerompi|tests|tools|benchmarks|examples|slurm|docs)/[\w./-]*\w)")
BARE_MODULE = re.compile(r"(?<![\w/.-])([a-z_]\w*\.py)\b")


def stale_names(path, prose, existing_names):
    """The repository paths (and, outside tests/, the bare file names) that prose names but that
    do not exist; placeholders (NAME, *) aside."""
    stale = [name for name in (match.rstrip(".") for match in SOURCE_PATH.findall(prose))
             if "*" not in name and not re.search(r"[A-Z]{3,}", name) and not os.path.exists(os.path.join(ROOT, name))]
    if not path.startswith("tests" + os.sep):
        stale += [name for name in BARE_MODULE.findall(prose) if not near(path, name)]
    return stale


def near(path, name):
    """Whether a file `name` is where a bare mention in `path` can mean: in its folder, an
    ancestor, or a folder right below one of those (lock.py said in zerompi/checkpoint/ for
    zerompi/train/loop/lock.py is not)."""
    folder = os.path.dirname(os.path.join(ROOT, path))
    while True:
        if os.path.exists(os.path.join(folder, name)) or any(
                os.path.exists(os.path.join(folder, sub, name)) for sub in os.listdir(folder)
                if os.path.isdir(os.path.join(folder, sub)) and not sub.startswith(".")):
            return True
        if os.path.samefile(folder, ROOT):
            return False
        folder = os.path.dirname(folder)


def test_docstrings_and_comments_name_files_that_exist():
    """A moved or renamed file leaves the docstrings that name it stale (plan/__init__.py named a
    dry_run.py and a test path that had moved): every path they name exists."""
    files = [os.path.relpath(os.path.join(top, name), ROOT) for folder in ("zerompi", "tools", "examples",
                                                                           "benchmarks", "tests")
             for top, _, names in os.walk(os.path.join(ROOT, folder)) for name in names if name.endswith(".py")]
    existing = set()
    for top, folders, names in os.walk(ROOT):
        folders[:] = [f for f in folders if not f.startswith(".") and f not in ("build", "runs", "__pycache__")]
        existing.update(names)
    stale = {path: names for path in files if (names := stale_names(path, prose_of(os.path.join(ROOT, path)),
                                                                     existing) + stale_symbols(prose_of(os.path.join(ROOT, path))))}
    assert stale == {}, f"docstrings and comments name what does not exist: {stale}"
    assert stale_names("zerompi/x.py", "see planning.py and zerompi/no_such.py, docs/figures/NAME.png",
                       existing) == ["zerompi/no_such.py", "planning.py"]
    assert stale_names("zerompi/checkpoint/x.py", "lock.py, save.py, run.py", existing) == ["lock.py", "run.py"]


def test_the_check_finds_a_moved_file_a_renamed_symbol_and_a_module_that_is_not_there():
    text = ("zerompi/train/data.py's BatchSchedule, zerompi/comm.py's `NoSuchName`, zerompi/comm.py's "
            "MpiTransport, zerompi/hierarchy/'s hierarchy_for, zerompi.step.no_such_step, zerompi.no_such, "
            "zerompi.step.train_step, zerompi/model.py's operands")
    assert stale_symbols(text) == ["zerompi/train/data.py's BatchSchedule", "zerompi/comm.py's NoSuchName",
                                   "zerompi.step.no_such_step", "zerompi.no_such"]


def test_the_proofs_folder_is_what_readme_cites():
    """tests/proofs/ holds exactly the test files README's "What is proven" cites."""
    readme = text_of("README.md")
    section = readme[readme.index("## What is proven"):readme.index("## Documentation")]
    cited = set(re.findall(r"`(tests/[\w/]+\.py)`", section))
    proofs = {f"tests/proofs/{name}" for name in os.listdir(os.path.join(ROOT, "tests", "proofs"))
              if name.startswith("test_") and name.endswith(".py")}
    assert cited == proofs, (sorted(cited - proofs), sorted(proofs - cited))


def test_readme_reading_order_names_every_module_of_the_reference():
    """Every module of the reference part (tools/import_graph.py's core and layers) is named in
    README's reading order: a file by its name (beside its folder's), a package by its folder."""
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import import_graph
    readme = text_of("README.md")
    section = readme[readme.index("## Reading order"):readme.index("## What is proven")]
    unnamed = []
    for name, path in import_graph.modules().items():
        if import_graph.part_of(name)[0] not in ("core", "layer") or name.endswith("__main__"):
            continue
        folder = os.path.relpath(os.path.dirname(path), ROOT) + "/"
        if path.endswith("__init__.py"):
            named = folder == "zerompi/" or f"`{folder}" in section
        else:
            named = f"`{folder}" in section or folder == "zerompi/"
            named = named and re.search(rf"(?<![\w]){re.escape(os.path.basename(path))}`", section) is not None
        if not named:
            unnamed.append(os.path.relpath(path, ROOT))
    assert unnamed == [], f"README's reading order does not name {unnamed}"
