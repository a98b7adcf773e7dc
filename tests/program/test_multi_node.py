"""zerompi across nodes, with MPICH's mpiexec, on the emulated cluster (tests/support/cluster.py):
training runs to the end on 2 nodes x 2 ranks and 4 nodes x 1 rank; every rank knows its node
(Split_type, the processor name), and the per-node start-up (ranks on the node, the launcher's
local rank, BLAS threads) is per node; a rank killed on the second node ends the whole job; a bad
input is one line and exit 2, as on one node.
"""
import os
import sys
import time

import pytest

from cluster import processes_on, run_across

pytestmark = pytest.mark.timeout(120, method="signal")     # a timed-out test still takes the cluster down
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN = [sys.executable, "-m", "zerompi.train", "--hidden", "32", "--steps", "4"]
# the BLAS threads follow from the node's cores, unless the caller's environment fixes them
ENV = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}


def left_running(cluster, within=10):
    """What still runs on the cluster's nodes after `within` seconds (a killed job's ranks take
    a moment to go once the launcher has returned)."""
    deadline = time.monotonic() + within
    while processes_on(cluster) and time.monotonic() < deadline:
        time.sleep(0.1)
    return processes_on(cluster)


def error_lines(result):
    return [line for line in result.stderr.splitlines() if line.startswith("zerompi: error")]


@pytest.mark.parametrize("nodes, ppn", [(2, 2), (4, 1)])
def test_training_across_nodes_runs_to_the_end(emulated_cluster, nodes, ppn):
    result = run_across(emulated_cluster, ppn, TRAIN + ["--stage", "3"], nodes, timeout=90)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"ZeRO stage 3 on {nodes * ppn} ranks" in result.stdout, result.stdout
    assert "step 4/4" in result.stdout and "held-out accuracy" in result.stdout, result.stdout
    assert left_running(emulated_cluster) == []


@pytest.mark.parametrize("nodes, ppn", [(2, 2), (4, 1)])
def test_each_rank_knows_its_node_and_sizes_its_threads_by_it(emulated_cluster, nodes, ppn):
    result = run_across(emulated_cluster, ppn, [sys.executable, "tests/support/node_report.py"], nodes,
                        timeout=60, env=ENV)
    assert result.returncode == 0, result.stderr
    cores = len(os.sched_getaffinity(0))               # every node shares this machine's cores
    expected = [f"rank {r} node {emulated_cluster.node_name(1 + r // ppn)} node_ranks {ppn} "
                f"local_rank {r % ppn} threads {max(1, cores // ppn)}" for r in range(nodes * ppn)]
    assert result.stdout.splitlines() == expected


def test_a_rank_killed_on_the_second_node_ends_the_whole_job(emulated_cluster):
    """Rank 2, the first of node 2, sends itself SIGKILL at step 3 (tests/support/fault_driver.py),
    without zerompi's watchdog: hydra's proxies end every rank on every node."""
    result = run_across(emulated_cluster, 2, [sys.executable, "tests/support/fault_driver.py", "kill", "2", "3",
                                              "--hidden", "32", "--steps", "1000", "--collective-timeout", "0"],
                        num_nodes=2, timeout=60)
    assert result.returncode != 0, result.stdout + result.stderr
    # hydra's notice names the node of the rank that died and its signal
    assert f"RUNNING AT {emulated_cluster.node_address(2)}" in result.stdout, result.stdout + result.stderr
    assert "EXIT CODE: 9" in result.stdout, result.stdout
    assert "step 1000/1000" not in result.stdout
    assert left_running(emulated_cluster) == []


def test_bad_input_across_nodes_is_one_line_and_exit_2(emulated_cluster):
    result = run_across(emulated_cluster, 2, TRAIN + ["--batch-size", "3"], num_nodes=2, timeout=60)
    assert result.returncode == 2, result.stdout + result.stderr
    assert error_lines(result) == [
        "zerompi: error: --batch-size 3 cannot be split over 4 ranks x 1 micro-batch: use --batch-size 4 (see --help)"]
    assert "Traceback" not in result.stderr and result.stdout == ""
