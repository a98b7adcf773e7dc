"""tests/slurm/local_slurm.sh, the local Slurm of tests/proofs/test_slurm.py, leaves the machine as it found it:

    the configuration files it replaces are back byte for byte after `stop`; the ones it created are gone
    a system Slurm's saved state is untouched; munge's folders get their owner and mode back
    `stop` ends the daemons it started, by their pids: a process named slurmd it did not start survives
    `stop` ends a job still running (its slurmstepd works in the script's folder)
    `start` refuses to run next to a slurmctld it did not start, and then touches nothing
    `start --cluster C` runs slurmctld on the emulated cluster's node 1 and one slurmd on each node, each
    in its node's network namespace with its hostname; `stop` ends them all; a cluster without nodes is refused

Run under the same conditions as tests/proofs/test_slurm.py (ZEROMPI_LOCAL_SLURM=1, root, Slurm installed),
before it (file order): the local Slurm must not be running when these start.
"""
import os
import shutil
import subprocess
import time

import pytest

from support.cluster import Cluster, emulated_cluster
from test_slurm import LOCAL_SLURM, skip_without_local_slurm

STATE = "/run/zerompi-local-slurm"          # local_slurm.sh: what it started and replaced
CONF = "/etc/slurm/slurm.conf"
GRES = "/etc/slurm/gres.conf"
PLANTED = b"# a site's own slurm.conf, planted by tests/program/test_local_slurm.py\nClusterName=elsewhere\n"


@pytest.fixture
def local_slurm_stopped():
    skip_without_local_slurm()
    assert not os.path.exists(STATE), f"the local Slurm is running ({STATE} exists): stop it first"
    saved = {path: open(path, "rb").read() for path in (CONF, GRES) if os.path.exists(path)}
    yield
    subprocess.run([LOCAL_SLURM, "stop"], timeout=60)
    for path in (CONF, GRES):                   # the machine's own files, whatever the test did
        if path in saved:
            with open(path, "wb") as f:
                f.write(saved[path])
        elif os.path.exists(path):
            os.remove(path)


def pids_started():
    return {name: int(open(os.path.join(STATE, f"{name}.pid")).read())
            for name in ("munged", "slurmctld", "slurmd.localhost")}


def alive(pid):
    return os.path.exists(f"/proc/{pid}")


def impostor(tmp_path, name):
    """A process whose name is `name` that local_slurm.sh did not start (a copy of sleep)."""
    program = tmp_path / name
    shutil.copy(shutil.which("sleep"), program)
    return subprocess.Popen([str(program), "300"])


@pytest.mark.timeout(180)
def test_stop_puts_back_the_files_start_replaced_and_removes_those_it_created(local_slurm_stopped):
    with open(CONF, "wb") as f:
        f.write(PLANTED)
    mode = os.stat(CONF).st_mode
    if os.path.exists(GRES):
        os.remove(GRES)
    subprocess.run([LOCAL_SLURM, "start"], check=True, timeout=120)
    assert open(CONF, "rb").read() != PLANTED and os.path.exists(GRES)     # its own, while it runs
    subprocess.run([LOCAL_SLURM, "stop"], check=True, timeout=60)
    assert open(CONF, "rb").read() == PLANTED and os.stat(CONF).st_mode == mode
    assert not os.path.exists(GRES) and not os.path.exists(STATE)


@pytest.mark.timeout(180)
def test_a_system_slurms_state_and_munges_folders_are_left_as_they_were(local_slurm_stopped, tmp_path):
    """Slurm's state, spool and logs go to the script's own folder (slurmctld -c wipes its
    StateSaveLocation); the owner and mode of munge's folders, which it must chown, are put back."""
    spool = "/var/spool/slurmctld"
    made_spool = not os.path.exists(spool)
    os.makedirs(spool, exist_ok=True)
    planted = os.path.join(spool, "zerompi-test-planted-state")
    with open(planted, "w") as f:
        f.write("a system Slurm's saved state")
    munge_lib = "/var/lib/munge"
    made_lib = not os.path.exists(munge_lib)
    os.makedirs(munge_lib, exist_ok=True)
    before = os.stat(munge_lib)
    os.chown(munge_lib, 0, 0)
    os.chmod(munge_lib, 0o751)
    try:
        subprocess.run([LOCAL_SLURM, "start"], check=True, timeout=120)
        subprocess.run([LOCAL_SLURM, "stop"], check=True, timeout=60)
        assert open(planted).read() == "a system Slurm's saved state"
        after = os.stat(munge_lib)
        assert (after.st_uid, after.st_gid, after.st_mode & 0o7777) == (0, 0, 0o751)
    finally:
        os.remove(planted)
        if made_spool:
            os.rmdir(spool)
        os.chown(munge_lib, before.st_uid, before.st_gid)
        os.chmod(munge_lib, before.st_mode & 0o7777)
        if made_lib:
            shutil.rmtree(munge_lib, ignore_errors=True)


@pytest.mark.timeout(180)
def test_stop_ends_a_job_still_running_instead_of_leaving_it_behind(local_slurm_stopped, tmp_path):
    """A test that times out leaves its job running; stop must end the job's steps (slurmstepd
    and the ranks under it), which would otherwise spin on the CPU for the rest of the suite."""
    subprocess.run([LOCAL_SLURM, "start"], check=True, timeout=120)
    seconds = 600 + os.getpid() % 1000                       # a sleep that only this test runs
    marker = f"^sleep {seconds}$"
    subprocess.run(["sbatch", "--wrap", f"sleep {seconds}"], cwd=tmp_path, check=True, timeout=60,
                   capture_output=True)
    deadline = time.time() + 60
    while not subprocess.run(["pgrep", "-f", marker], capture_output=True).stdout and time.time() < deadline:
        time.sleep(0.2)
    assert subprocess.run(["pgrep", "-f", marker], capture_output=True).stdout, "the job never started"
    subprocess.run([LOCAL_SLURM, "stop"], check=True, timeout=60)
    time.sleep(0.5)
    assert not subprocess.run(["pgrep", "-f", marker], capture_output=True).stdout


@pytest.mark.timeout(240)
def test_each_start_numbers_jobs_afresh(local_slurm_stopped, tmp_path):
    """slurmctld -c begins at job 1 again, and MPICH names its shared memory after the job step:
    a segment that a killed rank of an earlier "job 1" left in /dev/shm hung the next one in
    MPI_Init. Two starts must not hand out the same job ids."""
    ids = []
    for _ in range(2):
        subprocess.run([LOCAL_SLURM, "start"], check=True, timeout=120)
        job = subprocess.run(["sbatch", "--parsable", "--wrap", "true"], cwd=tmp_path, check=True, timeout=60,
                             capture_output=True, text=True).stdout.strip().split(";")[0]
        ids.append(int(job))
        subprocess.run([LOCAL_SLURM, "stop"], check=True, timeout=60)
        time.sleep(1.1)                          # a new second: the numbering follows the clock
    assert ids[0] != ids[1], ids


@pytest.mark.timeout(180)
def test_stop_ends_the_daemons_it_started_and_spares_a_slurmd_it_did_not(local_slurm_stopped, tmp_path):
    subprocess.run([LOCAL_SLURM, "start"], check=True, timeout=120)
    started = pids_started()
    assert all(alive(pid) for pid in started.values()), started
    other = impostor(tmp_path, "slurmd")
    try:
        subprocess.run([LOCAL_SLURM, "stop"], check=True, timeout=60)
        deadline = time.time() + 10
        while any(alive(pid) for pid in started.values()) and time.time() < deadline:
            time.sleep(0.1)
        assert not any(alive(pid) for pid in started.values()), started
        assert other.poll() is None, "stop ended a slurmd it had not started"
    finally:
        other.kill()
        other.wait()


@pytest.mark.timeout(60)
def test_start_refuses_next_to_a_slurmctld_it_did_not_start_and_touches_nothing(local_slurm_stopped, tmp_path):
    with open(CONF, "wb") as f:
        f.write(PLANTED)
    other = impostor(tmp_path, "slurmctld")
    try:
        result = subprocess.run([LOCAL_SLURM, "start"], capture_output=True, text=True, timeout=60)
        assert result.returncode == 1 and f"slurmctld this script did not start is running (pid {other.pid})" \
            in result.stderr, result.stderr
        assert other.poll() is None and open(CONF, "rb").read() == PLANTED and not os.path.exists(STATE)
    finally:
        other.kill()
        other.wait()


def namespace(path):
    """The identity of a namespace (a /proc/PID/ns/* file or a /run/netns/* entry)."""
    return os.stat(path).st_ino


@pytest.mark.timeout(180)
def test_across_an_emulated_cluster_each_daemon_runs_on_its_node_and_stop_ends_them_all(local_slurm_stopped,
                                                                                        tmp_path):
    """slurmctld on node 1 and a slurmd on each node, each in the node's network namespace with its
    hostname; stop ends them all, and a job step still running on both nodes."""
    with open(CONF, "wb") as f:
        f.write(PLANTED)
    with emulated_cluster(number=2, nodes=2) as cluster:
        subprocess.run([LOCAL_SLURM, "start", "--cluster", "2"], check=True, timeout=120)
        sleep = f"{shutil.which('sleep')} {600 + os.getpid() % 1000}"     # a sleep that only this test runs
        subprocess.run(cluster.on_node(1, ["sbatch", "--nodes=2", "--ntasks-per-node=1", "--wrap", f"srun {sleep}"]),
                       cwd=tmp_path, check=True, timeout=60, capture_output=True)
        deadline = time.time() + 60
        while len(subprocess.run(["pgrep", "-f", f"^{sleep}$"], capture_output=True).stdout.split()) < 2:
            assert time.time() < deadline, "the job's step never started on both nodes"
            time.sleep(0.2)
        on_node = {int(open(os.path.join(STATE, "slurmctld.pid")).read()): 1}
        for i in (1, 2):
            on_node[int(open(os.path.join(STATE, f"slurmd.{cluster.node_name(i)}.pid")).read())] = i
        for pid, i in on_node.items():
            assert namespace(f"/proc/{pid}/ns/net") == namespace(f"/run/netns/{cluster.node_name(i)}"), (pid, i)
            hostname = subprocess.run(["nsenter", f"--uts=/proc/{pid}/ns/uts", "hostname"], capture_output=True,
                                      text=True, check=True, timeout=10).stdout.strip()
            assert hostname == cluster.node_name(i), (pid, hostname)
        subprocess.run([LOCAL_SLURM, "stop"], check=True, timeout=60)
        deadline = time.time() + 10
        while any(alive(pid) for pid in on_node) and time.time() < deadline:
            time.sleep(0.1)
        assert not any(alive(pid) for pid in on_node), on_node
        assert not subprocess.run(["pgrep", "-f", f"^{sleep}$"], capture_output=True).stdout
    assert open(CONF, "rb").read() == PLANTED and not os.path.exists(STATE)


@pytest.mark.timeout(60)
def test_start_on_an_emulated_cluster_without_nodes_is_refused_and_touches_nothing(local_slurm_stopped):
    assert not Cluster(9).nodes(), "emulated cluster 9 is up: this test needs it absent"
    with open(CONF, "wb") as f:
        f.write(PLANTED)
    result = subprocess.run([LOCAL_SLURM, "start", "--cluster", "9"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "emulated cluster 9 has no nodes" in result.stderr, result.stderr
    assert open(CONF, "rb").read() == PLANTED and not os.path.exists(STATE)
