"""The preflight at its boundary, through the limits a user sets: a real `mpirun -n 2` run under
`ulimit -v` (RLIMIT_AS) and in a memory cgroup is refused just below what its plan needs and
trains just above it (zerompi/plan/preflight.py).

Each case first runs under a limit too small for any stage, to read from the refusal what the
process maps already when the preflight runs (limit - available) and what the plan needs; then
at that sum minus and plus MARGIN. "Just above" training to the end also checks that the plan's
allowance for what the libraries allocate later (MPI's scratch, RUNTIME_RESERVE) is enough.
"""
import os
import re
import resource
import subprocess
import uuid

import pytest

from test_cli import ERROR_MARK, launch

MB = 1 << 20
MARGIN = 16 * MB                 # "just": about one layer of the model below, far under the plan
MODEL = ["--hidden", "2048,2048", "--steps", 2, "--batch-size", 16, "--report", "none", "--log-every", 0]
REFUSAL = re.compile(r"needs ([\d.]+) MB per rank, ([\d.]+) MB available \(([^)]*)")
CGROUP_V1 = "/sys/fs/cgroup/memory"
# address-space limits for the first run, smallest first: Python, NumPy and MPI map about 350 MB
# here before the preflight; each is below that plus the model's need (about 150 MB)
PROBES = [limit * MB for limit in (380, 420, 460)]


def address_limit(nbytes):
    return lambda: resource.setrlimit(resource.RLIMIT_AS, (nbytes, nbytes))


def refusal(run):
    """(needs, available, which limit) in bytes from the preflight's one line."""
    lines = [line for line in run.output.splitlines() if ERROR_MARK in line]
    assert run.returncode == 2 and len(lines) == 1, run.describe()
    found = REFUSAL.search(lines[0])
    assert found, run.describe()
    return float(found[1]) * 1e6, float(found[2]) * 1e6, found[3]


@pytest.mark.parametrize("stage", [0, 3])
def test_ulimit_v_just_below_the_plan_is_refused_and_just_above_trains(stage, tmp_path):
    flags = [*MODEL, "--stage", stage]
    for probe in PROBES:                              # the first that lets the ranks reach the preflight
        run = launch(2, *flags, cwd=tmp_path, preexec_fn=address_limit(probe))
        if run.returncode == 2:
            break
    needs, available, limit = refusal(run)
    assert "ulimit -v" in limit
    # what a rank maps when the preflight runs depends a little on the limit itself (libraries map
    # less where they cannot map more): read it again from a refusal near the boundary, up to 3 times
    mapped = probe - available
    for _ in range(3):
        above = launch(2, *flags, cwd=tmp_path, preexec_fn=address_limit(int(mapped + needs + MARGIN)))
        if above.returncode != 2:
            break
        mapped = int(mapped + needs + MARGIN) - refusal(above)[1]
    assert above.returncode == 0 and ERROR_MARK not in above.output, above.describe()
    below = launch(2, *flags, cwd=tmp_path, preexec_fn=address_limit(int(mapped + needs - MARGIN)))
    assert refusal(below)[0] == needs


def in_cgroup(folder):
    """Move the child into the cgroup before it runs mpirun (mpirun and its ranks stay in it)."""
    def enter():
        with open(os.path.join(folder, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    return enter


@pytest.fixture
def memory_cgroup():
    """A fresh cgroup v1 memory folder (root and a v1 memory controller needed), removed after."""
    if os.geteuid() != 0 or not os.access(CGROUP_V1, os.W_OK):
        pytest.skip("needs root and a writable cgroup v1 memory controller")
    folder = os.path.join(CGROUP_V1, f"zerompi-test-{uuid.uuid4().hex[:8]}")
    os.mkdir(folder)
    yield folder
    subprocess.run(["sh", "-c", f"rmdir {folder} 2>/dev/null || sleep 1; rmdir {folder} 2>/dev/null"])


def set_limit(folder, nbytes):
    with open(os.path.join(folder, "memory.limit_in_bytes"), "w") as f:
        f.write(str(int(nbytes)))


def test_a_cgroup_limit_just_below_the_plan_is_refused_and_just_above_trains(memory_cgroup, tmp_path):
    """The cgroup's limit (shared by the node's 2 ranks), not the node's memory, decides."""
    flags = [*MODEL, "--stage", 0]
    set_limit(memory_cgroup, 350 * MB)
    needs, available, limit = refusal(launch(2, *flags, cwd=tmp_path, preexec_fn=in_cgroup(memory_cgroup)))
    assert "memory.limit_in_bytes" in limit and "shared by 2 ranks" in limit
    used = 350 * MB - 2 * available                   # what the job uses when the preflight runs
    set_limit(memory_cgroup, used + 2 * needs - 2 * MARGIN)
    assert refusal(launch(2, *flags, cwd=tmp_path, preexec_fn=in_cgroup(memory_cgroup)))[0] == needs
    set_limit(memory_cgroup, used + 2 * needs + 2 * MARGIN)
    above = launch(2, *flags, cwd=tmp_path, preexec_fn=in_cgroup(memory_cgroup))
    assert above.returncode == 0 and ERROR_MARK not in above.output, above.describe()
