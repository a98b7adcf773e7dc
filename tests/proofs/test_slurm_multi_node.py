"""slurm/cpu_multi_node.sbatch on a real Slurm across two emulated nodes: Debian's slurmctld and
one slurmd per node of emulated cluster number 2 (tools/emulated_cluster.py), brought up by
`tests/slurm/local_slurm.sh start --cluster 2`. Jobs are submitted on node 1, where the controller
runs (the tests add no address outside the nodes).

    the script's own request   2 nodes x 8 ranks x 2 CPUs schedules (sbatch --test-only)
    end to end                 2 ranks on each node (MPI's processor names), local ranks 0 and 1 on
                               each, zerompi counts 2 ranks per node, and runs --cpus-per-task BLAS threads
    a rank killed on node 2    the job ends at once, FAILED, with the step's last checkpoint
    preemption and requeue     a signalled job checkpoints on both nodes, requeues, resumes across them,
                               and ends with the weights of an uninterrupted run on the same nodes, bit for bit
    rank 0's node fails        a one-node job on node 2, which crashes (every process killed): Slurm
                               requeues it onto node 1, where it takes over the lock its first run left
                               (same job, a later restart), resumes, and ends with an uninterrupted
                               run's weights, bit for bit

Same conditions as tests/proofs/test_slurm.py (ZEROMPI_LOCAL_SLURM=1, root, Slurm installed) and the
emulated cluster's (ip, nsenter, unshare); run after the single-node Slurm tests, never beside
them (one /etc/slurm). The one requeue skips Slurm's requeue delay (scontrol update StartTime=now).
"""
import glob
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest

from support.cluster import crash, emulated_cluster, run_across
from test_slurm import LOCAL_SLURM, ROOT, SLURM_DIR, SMALL, skip_without_local_slurm

CLUSTER = 2                                   # the emulated cluster's number: its nodes are zmpi2-node1, -node2
NODES = "zmpi2-node[1-2]"
TWO_BY_TWO = ["--nodes=2", "--ntasks-per-node=2"]
SCRIPT = os.path.join(SLURM_DIR, "cpu_multi_node.sbatch")
SUPPORT = os.path.join(ROOT, "tests", "support")


@pytest.fixture(scope="module")
def cluster():
    """A Slurm across the two nodes of emulated cluster 2, both taken down afterwards."""
    skip_without_local_slurm()
    with emulated_cluster(number=CLUSTER, nodes=2) as nodes:
        subprocess.run([LOCAL_SLURM, "start", "--cluster", str(CLUSTER)], check=True, timeout=120)
        try:
            yield nodes
        finally:
            subprocess.run([LOCAL_SLURM, "stop"], timeout=60)


def on_node_1(cluster, command, **kwargs):
    """A Slurm command run on node 1 (the controller is reached there only)."""
    return subprocess.run(cluster.on_node(1, command), capture_output=True, text=True, timeout=60, **kwargs)


def submit(cluster, tmp_path, *options, args=(), **variables):
    """sbatch the multi-node script from tmp_path on node 1, this Python first on PATH; the job id."""
    env = dict(os.environ, ZEROMPI_SLURM_DIR=SLURM_DIR, **variables,
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    result = on_node_1(cluster, ["sbatch", "--parsable", *options, SCRIPT, *args], cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().split(";")[0]


def finished(cluster, job, seconds):
    """Wait until the job has left the queue; its final fields from scontrol (JobState, ExitCode, ...)."""
    deadline = time.time() + seconds
    while on_node_1(cluster, ["squeue", "-h", "-j", job]).stdout.strip():
        assert time.time() < deadline, f"job {job} still in the queue after {seconds} s"
        time.sleep(0.3)
    return dict(re.findall(r"(\w+)=(\S+)", on_node_1(cluster, ["scontrol", "-o", "show", "job", job]).stdout))


def job_output(tmp_path, job):
    return "".join(open(p).read() for p in glob.glob(os.path.join(tmp_path, f"*{job}*.out")))


def test_the_scripts_own_request_schedules_across_the_nodes(cluster, tmp_path):
    result = on_node_1(cluster, ["sbatch", "--test-only", SCRIPT], cwd=tmp_path)
    assert result.returncode == 0 and "to start at" in result.stderr and NODES in result.stderr, result.stderr


@pytest.mark.timeout(180)
def test_two_ranks_on_each_node_with_their_local_ranks_and_cpus_per_task_threads(cluster, tmp_path):
    job = submit(cluster, tmp_path, *TWO_BY_TWO, "--cpus-per-task=2", args=["--steps", "30", *SMALL],
                 ZEROMPI_PYTHON=os.path.join(SUPPORT, "rank_placement.py"))
    fields = finished(cluster, job, 120)
    output = job_output(tmp_path, job)
    assert (fields["JobState"], fields["ExitCode"]) == ("COMPLETED", "0:0"), output
    placed = sorted(re.findall(r"placement: rank (\d) of 4 on (\S+): local rank (\d), (\d) ranks on its node, "
                               r"(\S+) BLAS threads", output))
    assert placed == [("0", "zmpi2-node1", "0", "2", "2"), ("1", "zmpi2-node1", "1", "2", "2"),
                      ("2", "zmpi2-node2", "0", "2", "2"), ("3", "zmpi2-node2", "1", "2", "2")], output
    (run_dir,) = glob.glob(os.path.join(tmp_path, "runs", f"*-{job}"))
    assert "ZeRO stage 3 on 4 ranks" in open(os.path.join(run_dir, "train.log")).read()
    assert open(os.path.join(run_dir, "checkpoints", "latest")).read().strip() == "step_00000030"
    assert os.path.exists(os.path.join(run_dir, "final.npz"))


@pytest.mark.timeout(180)
def test_a_rank_killed_on_the_second_node_ends_the_job(cluster, tmp_path):
    started = time.time()
    job = submit(cluster, tmp_path, *TWO_BY_TWO, "--cpus-per-task=1",
                 args=["--steps", "40", "--save-every", "10", *SMALL],
                 ZEROMPI_PYTHON=os.path.join(SUPPORT, "kill_during_save.py"), ZEROMPI_KILL_DURING_SAVE="3:20")
    fields = finished(cluster, job, 120)
    output = job_output(tmp_path, job)
    assert time.time() - started < 90, "the surviving ranks waited instead of ending"
    assert fields["JobState"] == "FAILED" and fields["ExitCode"] != "0:0", (fields, output)
    assert "zmpi2-node2: task 3: Killed" in output, output            # rank 3 died, on the second node
    (run_dir,) = glob.glob(os.path.join(tmp_path, "runs", f"*-{job}"))
    assert open(os.path.join(run_dir, "checkpoints", "latest")).read().strip() == "step_00000010"


@pytest.mark.timeout(300)
def test_a_preempted_job_requeues_resumes_across_the_nodes_and_matches_an_uninterrupted_run(cluster, tmp_path):
    # long enough that the signal lands while it trains (300 steps took 0.2 s on a quiet machine, and
    # the signal came after the last: test_slurm.py's single-node twin trains 3000 too)
    training = ["--steps", "3000", "--hidden", "16", "--batch-size", "128", "--report", "none"]
    job = submit(cluster, tmp_path, *TWO_BY_TWO, "--cpus-per-task=1",
                 args=[*training, "--save-every", "1000", "--log-every", "250"])
    log = os.path.join(tmp_path, "runs", f"zerompi-cpu-multi-{job}", "train.log")
    deadline = time.time() + 120
    while not (os.path.exists(log) and "step  250/3000" in open(log).read()):   # running and training
        assert time.time() < deadline, job_output(tmp_path, job)
        time.sleep(0.2)
    on_node_1(cluster, ["scancel", "--signal=USR1", "--batch", job], check=True)
    output = requeued_to_the_end(cluster, tmp_path, job)
    assert "SIGUSR1: asking the ranks to checkpoint" in output and "requeueing" in output, output
    assert f"(restart 1) on {NODES}" in output, output
    text = open(log).read()
    assert text.count("signalled: checkpoint written") == 1 and "resumed from" in text, text
    assert_uninterrupted_weights(cluster, tmp_path, training, os.path.dirname(log), num_nodes=2)


def requeued_to_the_end(cluster, tmp_path, job):
    """Wait for a requeued job to run again and end (skipping Slurm's requeue delay, ~2 min); its
    output, once it COMPLETED after one restart."""
    deadline = time.time() + 240
    while True:
        state = on_node_1(cluster, ["squeue", "-h", "-j", job, "-o", "%T %r"]).stdout
        if "PENDING" in state and "BeginTime" in state:
            on_node_1(cluster, ["scontrol", "update", f"JobId={job}", "StartTime=now"])
        if not state.strip():
            break
        assert time.time() < deadline, job_output(tmp_path, job)
        time.sleep(0.5)
    fields = finished(cluster, job, 10)
    output = job_output(tmp_path, job)
    assert (fields["JobState"], fields["Restarts"]) == ("COMPLETED", "1"), output
    return output


def assert_uninterrupted_weights(cluster, tmp_path, training, run_dir, num_nodes):
    """The job's final.npz in run_dir is bit for bit what the same training gives uninterrupted, 2
    ranks on each of the first num_nodes nodes."""
    reference = tmp_path / "uninterrupted.npz"
    done = run_across(cluster, 2, [sys.executable, "-m", "zerompi.train", *training, "--log-every", "0",
                                   "--save-weights", str(reference)], num_nodes=num_nodes,
                      env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=180)
    assert done.returncode == 0, done.stderr
    with np.load(reference) as want, np.load(os.path.join(run_dir, "final.npz")) as got:
        assert sorted(want.files) == sorted(got.files)
        for name in want.files:
            assert np.array_equal(want[name], got[name]), name


def set_state(cluster, node, state):
    extra = ["Reason=zerompi-test"] if state in ("DRAIN", "DOWN") else []
    on_node_1(cluster, ["scontrol", "update", f"NodeName={cluster.node_name(node)}", f"State={state}", *extra],
              check=True)


def wait_for_idle(cluster, seconds=60):
    deadline = time.time() + seconds
    while on_node_1(cluster, ["sinfo", "-h", "-N", "-o", "%T"]).stdout.split() != ["idle", "idle"]:
        assert time.time() < deadline, on_node_1(cluster, ["sinfo", "-N"]).stdout
        time.sleep(0.3)


@pytest.mark.timeout(420)
def test_a_job_whose_node_failed_is_requeued_takes_over_its_lock_and_resumes_on_another_node(cluster, tmp_path):
    """A crash of rank 0's node left a lock naming that host, and the requeued job on another
    host was refused: an automatic requeue after a node failure never resumed."""
    training = ["--steps", "20000", "--hidden", "16", "--batch-size", "128", "--report", "none"]
    set_state(cluster, 1, "DRAIN")                 # the job's first run lands on node 2
    try:
        job = submit(cluster, tmp_path, "--nodes=1", "--ntasks-per-node=2", "--cpus-per-task=1",
                     args=[*training, "--save-every", "1000", "--log-every", "500"])
        log = os.path.join(tmp_path, "runs", f"zerompi-cpu-multi-{job}", "train.log")
        deadline = time.time() + 120
        while not (os.path.exists(log) and re.search(r"step +2500/", open(log).read())):   # two checkpoints
            assert time.time() < deadline, job_output(tmp_path, job)
            time.sleep(0.2)
        assert crash(cluster, 2), "nothing ran on node 2"
        lock = open(os.path.join(os.path.dirname(log), "checkpoints", ".lock")).read()
        assert lock.startswith(f"{cluster.node_name(2)} ") and f"slurm={job}:0" in lock, lock
        set_state(cluster, 2, "DOWN")              # what slurmctld does once node 2 stops answering
        set_state(cluster, 1, "RESUME")
        output = requeued_to_the_end(cluster, tmp_path, job)      # Slurm requeues it: node failure
        assert f"(restart 1) on {cluster.node_name(1)}" in output, output
        text = open(log).read()
        assert re.search(rf"took over the stale lock of {cluster.node_name(2)} pid \d+, Slurm job {job} restart 0: "
                         r"written by this Slurm job before its restart 1", text), text
        assert "resumed from" in text, text
    finally:                                       # node 2 back: its slurmd again, its state resumed
        subprocess.run(cluster.on_node(2, ["slurmd", "-N", cluster.node_name(2)]), timeout=60)
        for node in (1, 2):
            on_node_1(cluster, ["scontrol", "update", f"NodeName={cluster.node_name(node)}", "State=RESUME"])
        wait_for_idle(cluster)
    assert_uninterrupted_weights(cluster, tmp_path, training, os.path.dirname(log), num_nodes=1)
