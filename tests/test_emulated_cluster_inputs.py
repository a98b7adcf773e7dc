"""tools/emulated_cluster.py's `on` and `mpiexec` given a node that is not up or a number of ranks
below one: one line and a non-zero status, nothing run (nsenter's error, or mpiexec's SIGFPE)."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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
