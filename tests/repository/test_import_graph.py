"""zerompi's two parts keep their one-way rules (tools/import_graph.py): the core imports only the
core (and util), a layer only the core, its own files and the public names of the layers it builds
on, nothing below the program imports it, a __main__ outside zerompi/train/ is a door, and no cycle
among modules or folders, lazy imports included. Each rule fails on a planted violation."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "tools"))
import import_graph  # noqa: E402


def test_the_package_keeps_the_rules():
    assert import_graph.problems(import_graph.graph()) == []


def test_every_module_has_a_part_and_the_parts_are_where_the_readme_says():
    parts = {name: import_graph.part_of(name)[0] for name in import_graph.graph()}
    assert parts["zerompi.step"] == parts["zerompi.stages.stage3"] == parts["zerompi.memory"] == "core"
    assert parts["zerompi.overlap.thread"] == parts["zerompi.plan.virtual"] == "layer"
    assert parts["zerompi.train.loop.run"] == parts["zerompi.plan.__main__"] == "program"
    assert parts["zerompi.util.inputs"] == "util"


@pytest.mark.parametrize("name, dep, why", [
    ("zerompi.comm", "zerompi.observe.guards", "the core imports only the core and util"),
    ("zerompi.engine", "zerompi.overlap", "the core imports only the core and util"),
    ("zerompi.util.words", "zerompi.layout", "util imports only util"),
    ("zerompi.overlap.thread", "zerompi.observe.collective_check",
     "a layer imports another layer's public names (zerompi.observe), not its files"),
    ("zerompi.hierarchy.hpz", "zerompi.overlap", "hierarchy/ does not build on overlap/ (BUILDS_ON)"),
    ("zerompi.checkpoint.save", "zerompi.train.loop.checkpoints", "nothing below the program imports the program"),
    ("zerompi.layout", "zerompi.train", "nothing below the program imports the program"),
    ("zerompi.plan.__main__", "zerompi.plan.virtual", "a __main__ outside zerompi/train/ is a door into the program"),
])
def test_a_planted_import_that_breaks_a_rule_is_named(name, dep, why):
    edges = import_graph.graph()
    edges[name] = sorted(set(edges.get(name, [])) | {dep})
    assert f"{name} imports {dep}: {why}" in import_graph.problems(edges)


def test_a_folder_no_rule_lists_is_a_problem_not_core():
    edges = import_graph.graph()
    edges["zerompi.newlayer.x"] = []
    edges["zerompi.engine"] = edges["zerompi.engine"] + ["zerompi.newlayer.x"]
    found = import_graph.problems(edges)
    assert "zerompi.newlayer.x is in no part: list zerompi/newlayer/ in CORE_FOLDERS or BUILDS_ON" in found


def test_allowed_imports_are_not_problems():
    for name, dep in [("zerompi.plan", "zerompi.overlap"), ("zerompi.overlap.thread", "zerompi.observe"),
                      ("zerompi.devices.nccl", "zerompi.comm"), ("zerompi.train.loop.run", "zerompi.observe.trace"),
                      ("zerompi.memory.__main__", "zerompi.train.commands.memory_table")]:
        assert import_graph.rule_broken(name, dep) is None, (name, dep)


def test_the_check_finds_a_module_cycle_and_a_folder_cycle():
    edges = {"zerompi.a": ["zerompi.b"], "zerompi.b": ["zerompi.a"],
             "zerompi.devices.x": ["zerompi.comm"], "zerompi.comm": ["zerompi.devices.y"],
             "zerompi.devices.y": []}
    found = import_graph.problems(edges)
    assert "import cycle: zerompi.a <-> zerompi.b" in found
    assert "folder cycle: zerompi.comm <-> zerompi.devices" in found
