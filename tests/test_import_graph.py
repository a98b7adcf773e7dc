"""zerompi's imports form a stack (tools/import_graph.py): no cycles, lazy imports included, and
nothing below the command-line program imports it."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))
import import_graph  # noqa: E402


def test_the_package_imports_form_a_stack():
    assert import_graph.problems(import_graph.graph()) == []


def test_the_check_finds_a_cycle_and_an_upward_import():
    edges = {"zerompi.a": ["zerompi.b"], "zerompi.b": ["zerompi.a"],
             "zerompi.layout": ["zerompi.train.run"], "zerompi.train.run": ["zerompi.layout"]}
    found = import_graph.problems(edges)
    assert "import cycle: zerompi.a <-> zerompi.b" in found
    assert "zerompi.layout imports the program (zerompi.train.run)" in found
