"""The emulated cluster itself (tools/emulated_cluster.py, tools/node_shell, tests/support/cluster.py):
`up` refuses a cluster that is up; `down` removes every namespace, veth and bridge, also after an
`up` that failed half-way; the `emulated_cluster` fixture takes its cluster down when a test fails,
times out or is interrupted; `shape --rate` limits what crosses between nodes and leaves what stays
inside a node alone; `--delay` where the kernel has no netem is one line and leaves no node shaped.

Clusters that a test breaks on purpose have the spare number (tests/support/cluster.py), never the
session's.
"""
import os
import signal
import subprocess
import sys
import time

import pytest

from cluster import Cluster, require_cluster, run_across, session_number, spare_number

pytestmark = pytest.mark.timeout(240, method="signal")     # a timed-out test still takes its cluster down
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = [sys.executable, os.path.join(ROOT, "tools", "emulated_cluster.py")]
SECONDS = [sys.executable, os.path.join(ROOT, "tests", "support", "allreduce_seconds.py")]


def tool(number, *args):
    return subprocess.run(TOOL + ["--cluster", str(number), *args], capture_output=True, text=True, timeout=60)


def leftovers(number):
    """Whatever of cluster `number` exists: its namespaces, veths and bridge."""
    cluster = Cluster(number)
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    names = [cluster.node_name(i) for i in range(1, 9)] + [cluster.veth_name(i) for i in range(1, 9)]
    return ([name for name in names if name in namespaces]
            + [name for name in names + [cluster.bridge] if os.path.exists(f"/sys/class/net/{name}")])


def qdiscs(cluster):
    """The root qdisc of each node's eth0, by kind (noqueue: unshaped)."""
    return [subprocess.run(["tc", "-n", cluster.node_name(i), "qdisc", "show", "dev", "eth0", "root"],
                           capture_output=True, text=True).stdout.split()[1] for i in cluster.nodes()]


@pytest.fixture
def spare():
    """The spare cluster's number, with nothing of it left before and after the test."""
    require_cluster()
    Cluster(spare_number()).down()
    yield spare_number()
    Cluster(spare_number()).down()


def test_up_and_down_create_and_remove_everything(spare):
    created = tool(spare, "up", "--nodes", "3", "--rate", "100mbit")
    assert created.returncode == 0, created.stderr
    assert sorted(leftovers(spare)) == sorted(
        [f"zmpi{spare}-node{i}" for i in (1, 2, 3)] + [f"zmveth{spare}-{i}" for i in (1, 2, 3)] + [f"zmbr{spare}"])
    listed = tool(spare, "list").stdout.splitlines()
    assert listed == [f"zmpi{spare}-node{i} 10.203.{spare}.1{i}" for i in (1, 2, 3)]
    assert tool(spare, "on", "2", "--", "hostname").stdout.strip() == f"zmpi{spare}-node2"
    assert tool(spare, "down").returncode == 0
    assert leftovers(spare) == []


def test_up_twice_refuses_and_leaves_the_cluster_as_it_was(emulated_cluster):
    again = tool(emulated_cluster.c, "up", "--nodes", "2")
    assert again.returncode != 0
    assert again.stderr.strip().splitlines() == [
        f"emulated_cluster: cluster {emulated_cluster.c} is already up (or left over): run `down` first"]
    assert emulated_cluster.nodes() == [1, 2, 3, 4]
    assert tool(emulated_cluster.c, "on", "4", "--", "hostname").stdout.strip() == emulated_cluster.node_name(4)


@pytest.mark.parametrize("breakage", ["a bad rate", "node 2's veth taken"])
def test_a_failed_up_leaves_nothing(spare, breakage):
    if breakage == "node 2's veth taken":           # `up` fails half-way, at the second node
        subprocess.run(["ip", "link", "add", Cluster(spare).veth_name(2), "type", "bridge"], check=True)
        args = ["up", "--nodes", "3"]
    else:                                            # `up` fails at the end, shaping every node
        args = ["up", "--nodes", "3", "--rate", "fast"]
    failed = tool(spare, *args)
    assert failed.returncode != 0
    assert len(failed.stderr.strip().splitlines()) == 1 and failed.stderr.startswith("emulated_cluster: ")
    assert "Traceback" not in failed.stderr
    assert leftovers(spare) == []


def test_the_fixture_takes_its_cluster_down_when_a_test_fails_or_times_out(spare):
    env = dict(os.environ, ZEROMPI_TEST_CLUSTER=str(spare))        # the inner session's cluster
    inner = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                            "tests/support/cluster_failing_tests.py", "-k", "fails or times_out"],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert f"failing on purpose, on cluster {spare}, which is up" in inner.stdout, inner.stdout + inner.stderr
    assert "Timeout" in inner.stdout and "2 failed" in inner.stdout, inner.stdout
    assert leftovers(spare) == []


def ctrl_c_heard():
    """SIGINT as a terminal's Ctrl-C finds it: a suite started in the background (a CI job, `cmd &`)
    hands its processes SIGINT ignored, and Python then never raises KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("moment", ["in the test", "while the cluster comes up"])
def test_the_fixture_takes_its_cluster_down_when_interrupted(spare, moment):
    env = dict(os.environ, ZEROMPI_TEST_CLUSTER=str(spare))
    inner = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider",
                              "tests/support/cluster_failing_tests.py", "-k", "interrupted"],
                             cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             preexec_fn=ctrl_c_heard)
    try:
        if moment == "in the test":
            while "waiting to be interrupted" not in inner.stdout.readline():
                assert inner.poll() is None
        else:
            deadline = time.monotonic() + 60
            while 2 not in Cluster(spare).nodes() and time.monotonic() < deadline:
                time.sleep(0.02)
        inner.send_signal(signal.SIGINT)                 # Ctrl-C
        out, _ = inner.communicate(timeout=60)
    finally:
        inner.kill()
    assert "KeyboardInterrupt" in out, out
    assert leftovers(spare) == []


def test_shaping_limits_the_link_between_nodes_only(emulated_cluster):
    megabytes, rate_mbit = 4, 50
    def seconds(ppn, num_nodes):
        done = run_across(emulated_cluster, ppn, SECONDS + [str(megabytes)], num_nodes, timeout=60)
        assert done.returncode == 0, done.stderr
        return float(done.stdout)
    between, inside = seconds(1, 2), seconds(2, 1)
    try:
        assert tool(emulated_cluster.c, "shape", "--rate", f"{rate_mbit}mbit").returncode == 0
        assert qdiscs(emulated_cluster) == ["tbf"] * 4
        between_shaped, inside_shaped = seconds(1, 2), seconds(2, 1)
    finally:
        tool(emulated_cluster.c, "shape")
    assert qdiscs(emulated_cluster) == ["noqueue"] * 4
    # each rank of a 2-rank Allreduce sends about the whole buffer (half reduce-scatter, half all-gather)
    on_the_wire = megabytes * 2**20 * 8 / (rate_mbit * 1e6)
    # slowed to the link's rate, never faster (a busy machine only slows it more); the other two
    # measured beside it, as ratios: unshaped, and inside a node, it is much faster
    assert between_shaped > 0.5 * on_the_wire and between_shaped > 2 * between, (between, between_shaped)
    assert inside_shaped < 0.25 * between_shaped, (inside, inside_shaped, between_shaped)


def test_a_delay_without_netem_is_one_line_and_leaves_no_node_shaped(emulated_cluster):
    try:
        assert tool(emulated_cluster.c, "shape", "--rate", "50mbit").returncode == 0
        delayed = tool(emulated_cluster.c, "shape", "--delay", "1ms", "--rate", "100mbit")
        if delayed.returncode == 0:                  # a kernel with netem: every node delayed
            assert qdiscs(emulated_cluster) == ["netem"] * 4
        else:
            assert len(delayed.stderr.strip().splitlines()) == 1, delayed.stderr
            assert "no netem" in delayed.stderr and "the link is left unshaped" in delayed.stderr
            assert qdiscs(emulated_cluster) == ["noqueue"] * 4
    finally:
        tool(emulated_cluster.c, "shape")


def test_the_session_cluster_is_the_one_asked_for(emulated_cluster):
    assert emulated_cluster.c == session_number() and spare_number() == session_number() + 10
