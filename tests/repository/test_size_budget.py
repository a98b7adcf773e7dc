"""The package stays within the size budget README.md states (tools/size_budget.py), and a planted
violation of each number fails the check."""
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import import_graph  # noqa: E402
import size_budget  # noqa: E402


def readme_budget():
    with open(os.path.join(ROOT, "README.md")) as f:
        return size_budget.budget(f.read())


def test_the_package_is_within_the_budget_readme_states():
    assert size_budget.problems(readme_budget(), size_budget.measured(import_graph.modules())) == []


@pytest.mark.parametrize("name, planted", [("core", "zerompi/step.py"), ("stage file", "zerompi/stages/stage2.py"),
                                           ("largest file", "zerompi/plan/virtual.py"),
                                           ("package", "zerompi/train/loop/run.py")])
def test_a_planted_file_over_the_budget_fails_the_check(tmp_path, name, planted):
    limits = readme_budget()
    files = import_graph.modules()
    dotted = planted[:-3].replace("/", ".")
    grown = tmp_path / "grown.py"
    grown.write_text(open(files[dotted]).read() + "\n" * (limits[name] + 1))
    files[dotted] = str(grown)
    found = size_budget.problems(limits, size_budget.measured(files))
    assert any(problem.startswith(f"{name}: ") for problem in found), found


def test_a_readme_without_the_budget_line_is_an_error():
    with pytest.raises(ValueError, match="states no size budget"):
        size_budget.budget("# zerompi\n")
