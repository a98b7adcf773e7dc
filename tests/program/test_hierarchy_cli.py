"""--shard-group node and --hpz where the ranks are not in equal blocks per node: one line, from
one rank, exit 2, on every placement (zerompi/hierarchy/groups.py node_size), never a traceback
or a hang; first with fake node maps, then on the emulated cluster's nodes, placed unevenly.
"""
import os
import sys
from types import SimpleNamespace

import pytest

from support.cluster import run_launcher
from zerompi.util.exit_codes import ExitCode
from zerompi.hierarchy.groups import node_size
from zerompi.train.options.config import parse_args
from zerompi.train.options.grouping import grouping_error


def size_and_error(node_of_rank):
    return node_size(SimpleNamespace(node_of_rank=tuple(node_of_rank)))


@pytest.mark.parametrize("node_of_rank,size", [((0,), 1), ((0, 0, 0, 0), 4), ((0, 0, 1, 1), 2),
                                               ((0, 1, 2, 3), 1), ((0, 0, 0, 1, 1, 1), 3)])
def test_equal_blocks_give_the_ranks_per_node(node_of_rank, size):
    assert size_and_error(node_of_rank) == (size, None)


@pytest.mark.parametrize("node_of_rank,words", [
    ((0, 0, 0, 1), "3, 1 ranks"),           # 3 + 1: rank 3 alone would think its node is fine
    ((0, 1, 1, 1), "1, 3 ranks"),
    ((0, 0, 1, 2), "2, 1, 1 ranks"),
    ((0, 0, 1, 1, 2), "2, 2, 1 ranks"),       # blocks of 2, but 2 does not divide 5
    ((0, 1, 0, 1), "ranks 0, 2 share a node"),    # round-robin
    ((0, 0, 1, 1, 0, 0, 1, 1), "ranks 0, 1, 4, 5 share a node"),
])
def test_other_placements_are_one_line(node_of_rank, words):
    _, error = size_and_error(node_of_rank)
    assert words in error and "\n" not in error and "--distribution=block" in error


def test_the_error_is_the_same_on_every_rank():
    """Each rank reads the same node map: no rank passes while another fails (a hang)."""
    node_of_rank = (0, 0, 0, 1)
    errors = {node_size(SimpleNamespace(node_of_rank=node_of_rank, rank=r))[1] for r in range(4)}
    assert len(errors) == 1 and None not in errors


@pytest.mark.timeout(200)
@pytest.mark.parametrize("placement", [[3, 1], [1, 3]], ids=["3+1", "1+3"])
@pytest.mark.parametrize("flags", [["--stage", "3", "--hpz"], ["--stage", "2", "--shard-group", "node"]],
                         ids=["hpz", "node"])
def test_uneven_nodes_stop_with_one_line_on_the_emulated_cluster(emulated_cluster, placement, flags):
    command = [sys.executable, "-m", "zerompi.train", "--hidden", "8", "--steps", "2", *flags]
    result = run_launcher(emulated_cluster.mpiexec_placed(placement, command), timeout=150)
    assert result.returncode == ExitCode.BAD_INPUT, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("zerompi: error:")]
    assert len(lines) == 1, result.stderr[-3000:]
    assert f"{placement[0]}, {placement[1]} ranks" in lines[0]


DRIVER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support", "split_guards_driver.py")


def run_driver(kind, timeout=60):
    """tests/support/split_guards_driver.py on 4 ranks; its own process group, killed whole at the timeout."""
    return run_launcher(["mpirun", "-n", "4", sys.executable, DRIVER, kind], timeout=timeout)


@pytest.mark.timeout(90)
def test_a_mismatch_inside_one_group_ends_the_job_with_one_line_naming_the_jobs_ranks():
    result = run_driver("mismatch")
    assert result.returncode == ExitCode.COLLECTIVE_MISMATCH, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("zerompi: error:")]
    assert len(lines) == 1 and "rank 2: allreduce of 10 " in lines[0] and "rank 3: allreduce of 12 " in lines[0]
    assert "went past" not in result.stdout


@pytest.mark.timeout(90)
def test_a_collective_timeout_in_a_group_is_one_line_naming_the_jobs_rank():
    result = run_driver("stop")
    assert result.returncode == ExitCode.COLLECTIVE_TIMEOUT, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("zerompi: error:")]
    assert len(lines) == 1, result.stderr[-3000:]
    assert lines[0].startswith("zerompi: error: rank 0 waited")   # the lowest waiting rank of the job


@pytest.mark.parametrize("spec", ["²", "٤", "4²", "+4", " 4"])
def test_a_group_size_of_other_digits_is_one_line(spec):
    """str.isdigit() takes '²' and '٤': --shard-group takes ASCII digits only (int('²') raises)."""
    message = grouping_error(parse_args(["--shard-group", spec], 0, 8), 8)
    assert message == f"--shard-group must be world, node or a number of ranks, got {spec!r}"
