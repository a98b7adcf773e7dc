"""The emulated cluster for tests: tools/emulated_cluster.py's nodes, up for a test session and
always taken down again (also when a test fails or is interrupted).

    with emulated_cluster(number=1, nodes=4) as cluster:          (or the `emulated_cluster` fixture)
        result = run_across(cluster, ppn=2, command=[...], num_nodes=2, timeout=120)
        processes_on(cluster)          what still runs on its nodes (nothing, once a job ended)
        crash(cluster, 2)              node 2 fails: every process on it killed at once

A session's cluster has the number session_number() ($ZEROMPI_TEST_CLUSTER, 1 by default); a
test that builds and breaks clusters of its own uses spare_number(), 10 higher, so that it never
meets the session's cluster. Tests on it time out with pytest-timeout's signal method (the test
process only waits for subprocesses), so that a timed-out test still takes its cluster down; the
thread method would end the process on the spot.

Tests on it skip where it cannot exist (not root, no `ip`/`nsenter`/`unshare`); under CI
(the CI variable set) they fail instead, so that a machine that lost them is noticed.
"""
import os
import shutil
import subprocess
import sys
from contextlib import contextmanager

import pytest

TOOLS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "tools")
sys.path.insert(0, TOOLS)
from emulated_cluster import Cluster  # noqa: E402


SESSION_NUMBERS = range(90)           # + 10 for spare_number(): within tools/emulated_cluster.py's 0-99


def session_number():
    """The number of this test session's emulated cluster ($ZEROMPI_TEST_CLUSTER, 0-89)."""
    text = os.environ.get("ZEROMPI_TEST_CLUSTER", "1")
    if not (text.isascii() and text.isdigit() and int(text) in SESSION_NUMBERS):
        pytest.fail(f"ZEROMPI_TEST_CLUSTER={text!r}: a number from 0 to 89 (a spare cluster takes it + 10, "
                    f"and the tool's numbers end at 99)", pytrace=False)
    return int(text)


def spare_number():
    """The number for clusters that a test builds, and breaks, itself."""
    return session_number() + 10


def missing():
    """Why an emulated cluster cannot be built here, or None."""
    if os.geteuid() != 0:
        return "the emulated cluster needs root (network namespaces)"
    for tool in ("ip", "tc", "nsenter", "unshare", "mpiexec"):
        if shutil.which(tool) is None:
            return f"the emulated cluster needs {tool}"
    return None


def require_cluster():
    """Skip the test where no emulated cluster can be built (fail it under CI)."""
    problem = missing()
    if problem:
        if os.environ.get("CI"):
            pytest.fail(problem)
        pytest.skip(problem)


@contextmanager
def emulated_cluster(number, nodes):
    """Cluster `number` with `nodes` nodes, up for the with-block, down afterwards."""
    require_cluster()
    cluster = Cluster(number)
    cluster.down()                         # what an earlier, killed session may have left
    try:
        cluster.up(nodes)
        yield cluster
    finally:
        cluster.down()


def run_across(cluster, ppn, command, num_nodes=None, timeout=180, env=None):
    """Run command (a list) with MPICH's mpiexec, ppn ranks on each of the first num_nodes nodes;
    returns the CompletedProcess (text). The launcher runs in its own process group, which is
    killed whole at the timeout."""
    return run_launcher(cluster.mpiexec_command(ppn, command, num_nodes), timeout, env)


def run_launcher(full, timeout=180, env=None):
    """Run a launcher's full command line (a list, e.g. cluster.on_node(1, [mpirun, ...])) with
    run_across's timeout: its process group killed whole at the timeout."""
    process = subprocess.Popen(full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=env, start_new_session=True)
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, 9)
        out, err = process.communicate()
        raise AssertionError(f"timed out after {timeout} s: {' '.join(full)}\n{out}\n{err}")
    return subprocess.CompletedProcess(full, process.returncode, out, err)


def processes_on(cluster):
    """The pids of the processes running on any node of the cluster (in one of its namespaces)."""
    namespaces = {os.stat(f"/run/netns/{cluster.node_name(i)}").st_ino for i in cluster.nodes()}
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.stat(f"/proc/{pid}/ns/net").st_ino in namespaces:
                found.append(int(pid))
        except OSError:                    # ended meanwhile
            pass
    return found


def crash(cluster, node):
    """Node `node` fails at once: every process on it (its slurmd, the jobs' steps and ranks) is
    SIGKILLed, and the shared memory they mapped is removed, as it would vanish with a real node's
    memory (on one machine the emulated nodes share /dev/shm, where a requeued job's ranks would
    meet the dead ones' segments: MPICH names them after the job step). Returns the pids killed."""
    namespace = os.stat(f"/run/netns/{cluster.node_name(node)}").st_ino
    killed, segments = [], set()
    for _ in range(5):                     # again, for what a dying parent started meanwhile
        found = [pid for pid in processes_on(cluster) if _namespace(pid) == namespace]
        if not found:
            break
        for pid in found:
            try:
                with open(f"/proc/{pid}/maps") as f:
                    segments.update(line.split()[-1] for line in f if " /dev/shm/" in line)
                os.kill(pid, 9)
                killed.append(pid)
            except OSError:                # ended meanwhile
                pass
    for path in segments:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    return killed


def _namespace(pid):
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None
