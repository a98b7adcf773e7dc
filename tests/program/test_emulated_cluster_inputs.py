"""tools/emulated_cluster.py given what it cannot do: `on` a node that is not up, `mpiexec` with fewer
than one rank per node (one line and a non-zero status, nothing run: they were nsenter's error and
mpiexec's SIGFPE), `up` with a delay this kernel cannot make (one line saying nothing was made)."""
import os
import subprocess
import sys

import pytest

from support.cluster import Cluster, require_cluster, spare_number

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = [sys.executable, os.path.join(ROOT, "tools", "emulated_cluster.py")]


def tool(cluster, *args):
    return subprocess.run(TOOL + ["--cluster", str(cluster.c), *args], capture_output=True, text=True, timeout=60)


def test_a_node_that_is_not_up_is_one_line(emulated_cluster):
    result = tool(emulated_cluster, "on", "7", "--", "hostname")
    assert result.returncode != 0 and result.stdout == ""
    assert result.stderr.strip() == (f"emulated_cluster: node 7 is not up in cluster {emulated_cluster.c} "
                                     f"(nodes: 1, 2, 3, 4)")


def test_fewer_than_one_rank_per_node_is_one_line(emulated_cluster):
    for ppn in ("0", "-1"):
        result = tool(emulated_cluster, "mpiexec", "--ppn", ppn, "--", "hostname")
        assert result.returncode != 0 and result.stdout == ""
        assert result.stderr.strip().splitlines()[-1].endswith(f"--ppn: a number of ranks >= 1, got {ppn}")


def test_up_with_a_delay_the_kernel_cannot_make_says_that_nothing_was_made():
    """Without netem, `up --delay` takes down what it made: its line says so (it said 'the link is
    left unshaped', of a cluster that no longer exists)."""
    require_cluster()
    cluster = Cluster(spare_number())
    cluster.down()
    try:
        result = tool(cluster, "up", "--nodes", "2", "--delay", "1ms")
        if result.returncode == 0:
            pytest.skip("this kernel has netem")
        assert cluster.nodes() == [] and not os.path.exists(f"/sys/class/net/{cluster.bridge}")
        assert result.stderr.strip().endswith(f"cluster {cluster.c} was not made"), result.stderr
        assert "left unshaped" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
    finally:
        cluster.down()


@pytest.mark.parametrize("value", ["95", "90", "-1", "x", "٣"])
def test_a_test_cluster_number_beyond_what_the_spare_leaves_is_refused(value, monkeypatch):
    """ZEROMPI_TEST_CLUSTER is 0-89: 95's spare cluster (105) would be beyond the tool's 0-99;
    refused by name."""
    from support.cluster import session_number, spare_number
    monkeypatch.setenv("ZEROMPI_TEST_CLUSTER", value)
    with pytest.raises(pytest.fail.Exception, match="ZEROMPI_TEST_CLUSTER"):
        session_number()
    monkeypatch.setenv("ZEROMPI_TEST_CLUSTER", "89")
    assert (session_number(), spare_number()) == (89, 99)
