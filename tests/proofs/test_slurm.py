"""The batch scripts in slurm/ on a real Slurm: Debian's slurmctld, slurmd and munge on localhost,
brought up by tests/slurm/local_slurm.sh (root needed; .ci/run installs the packages).

    every CPU script        sbatch --wait trains and exits 0, logs and weights in its per-job folder
    preemption + requeue    a job signalled mid-run checkpoints, requeues itself, resumes, and its
                            final weights equal an uninterrupted run's, bit for bit
    plain scancel           checkpoints and ends: no requeue
    a rank SIGKILLed        the step ends at once (srun --kill-on-bad-exit), no hang
    mpirun in an allocation works (hydra starts its proxies with srun)
    wrong srun --mpi        N lone single-rank jobs are caught: one error line, exit 2

The local Slurm replaces /etc/slurm/slurm.conf (until it stops) and runs slurmctld, slurmd and
munged, so the tests start it only when ZEROMPI_LOCAL_SLURM=1 (.ci/run sets it); otherwise they are
skipped. What local_slurm.sh itself promises is in tests/program/test_local_slurm.py.
"""
import datetime
import glob
import os
import re
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from run_all import mpirun

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SLURM_DIR = os.path.join(ROOT, "slurm")
CPU_SCRIPTS = ["cpu_single_node.sbatch", "cpu_multi_node.sbatch"]
GPU_SCRIPTS = ["gpu_openmpi_ucx.sbatch", "gpu_cray_mpich.sbatch", "gpu_mpich_pmi2.sbatch"]
ONE_NODE = ["--nodes=1", "--ntasks-per-node=2", "--cpus-per-task=1"]   # the GPU scripts ask for 2 nodes
SMALL = ["--hidden", "16", "--log-every", "0", "--report", "none", "--batch-size", "128"]


LOCAL_SLURM = os.path.join(ROOT, "tests", "slurm", "local_slurm.sh")


def skip_without_local_slurm():
    """Skip (fail in CI) where the tests may not or cannot start a local Slurm."""
    problem = None
    if os.environ.get("ZEROMPI_LOCAL_SLURM") != "1":
        problem = ("set ZEROMPI_LOCAL_SLURM=1 (as root) to let the tests start a single-node Slurm here (it "
                   "replaces /etc/slurm/slurm.conf until it stops, and runs slurmctld, slurmd and munged)")
    elif os.geteuid() != 0:
        problem = "needs root to start slurmctld, slurmd and munged"
    elif not shutil.which("slurmctld"):
        problem = "Slurm is not installed (apt-get install slurmd slurmctld slurm-client munge)"
    if problem:
        if os.environ.get("CI"):
            pytest.fail(f"Slurm tests cannot run in CI: {problem}")
        pytest.skip(problem)


@pytest.fixture(scope="module")
def slurm():
    """A running single-node Slurm; skipped (outside CI) where it cannot be started."""
    skip_without_local_slurm()
    subprocess.run([LOCAL_SLURM, "start"], check=True, timeout=120)
    yield
    subprocess.run(["scancel", "--user", "root"], timeout=60)
    subprocess.run([LOCAL_SLURM, "stop"], timeout=60)


def submit(script_or_wrap, tmp_path, *options, args=(), wait=True):
    """sbatch from tmp_path with this Python first on PATH; returns (returncode, job id)."""
    env = dict(os.environ, ZEROMPI_SLURM_DIR=SLURM_DIR,
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    command = ["sbatch", "--parsable", *options]
    command += ["--wait"] if wait else []
    command += [os.path.join(SLURM_DIR, script_or_wrap), *args] if script_or_wrap.endswith(".sbatch") \
        else ["--wrap", script_or_wrap]
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    job = result.stdout.strip().split(";")[0].splitlines()[0] if result.stdout.strip() else None
    return result.returncode, job, result


def job_output(tmp_path, job):
    return "".join(open(p).read() for p in glob.glob(os.path.join(tmp_path, f"*{job}*.out")))


@pytest.mark.timeout(400)
@pytest.mark.parametrize("script", CPU_SCRIPTS)
def test_cpu_script_trains_and_exits_0(slurm, script, tmp_path):
    # one node here: the multi-node script is submitted with its node count overridden
    options = ["--nodes=1", "--ntasks-per-node=4", "--cpus-per-task=1"] if "multi" in script else []
    code, job, result = submit(script, tmp_path, *options, args=["--steps", "30", *SMALL])
    output = job_output(tmp_path, job)
    assert code == 0, result.stderr + output
    (run_dir,) = glob.glob(os.path.join(tmp_path, "runs", f"*-{job}"))
    log = open(os.path.join(run_dir, "train.log")).read()
    assert "ZeRO stage 3 on 4 ranks" in log and "held-out accuracy" in log
    assert os.path.exists(os.path.join(run_dir, "final.npz"))
    assert open(os.path.join(run_dir, "checkpoints", "latest")).read().strip() == "step_00000030"


@pytest.mark.timeout(400)
def test_signalled_job_checkpoints_requeues_resumes_and_matches_an_uninterrupted_run(slurm, tmp_path):
    flags = ["--steps", "3000", "--save-every", "1000", "--hidden", "16", "--log-every", "250", "--report", "none"]
    code, job, result = submit("cpu_single_node.sbatch", tmp_path, args=flags, wait=False)
    assert code == 0, result.stderr
    run_dir = os.path.join(tmp_path, "runs", f"zerompi-cpu-{job}")
    log = os.path.join(run_dir, "train.log")
    deadline = time.time() + 120
    while not (os.path.exists(log) and "step  250/3000" in open(log).read()):   # running and training
        assert time.time() < deadline, job_output(tmp_path, job)
        time.sleep(0.2)
    subprocess.run(["scancel", "--signal=USR1", "--batch", job], check=True, timeout=60)
    deadline = time.time() + 240
    delays = []
    while True:                               # requeued jobs wait ~2 min to start again: skip that
        state = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T %r %S"], capture_output=True,
                               text=True).stdout
        if "PENDING" in state and "BeginTime" in state:
            delays.append((datetime.datetime.fromisoformat(state.split()[2]) - datetime.datetime.now()).total_seconds())
            subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], timeout=60)
        if not state.strip():
            break
        assert time.time() < deadline, job_output(tmp_path, job)
        time.sleep(0.5)
    output = job_output(tmp_path, job)
    assert "SIGUSR1: asking the ranks to checkpoint" in output and "requeueing" in output, output
    assert "requeue delay (AuthInfo=cred_expire in slurm.conf, 120 s by default" in output, output
    assert delays and 100 <= delays[0] <= 122, delays  # the delay the docs state: cred_expire (120 s) + 1
    text = open(log).read()
    assert text.count("signalled: checkpoint written") == 1 and "resumed from" in text, text
    assert "restart 1" in output
    reference = tmp_path / "uninterrupted.npz"
    subprocess.run([mpirun(), "-n", "4", sys.executable, "-m", "zerompi.train", "--steps", "3000", "--hidden", "16",
                    "--log-every", "0", "--report", "none", "--save-weights", str(reference)],
                   check=True, capture_output=True, timeout=300, cwd=tmp_path)
    with np.load(reference) as want, np.load(os.path.join(run_dir, "final.npz")) as got:
        assert sorted(want.files) == sorted(got.files)
        for name in want.files:
            assert np.array_equal(want[name], got[name]), name


@pytest.mark.timeout(300)
def test_wrong_srun_mpi_plugin_is_caught_once(slurm, tmp_path):
    code, job, result = submit(f"srun --mpi=none {sys.executable} -m zerompi.train --steps 2", tmp_path,
                               "--ntasks=3", "--output=wrong-%j.out")
    output = job_output(tmp_path, job)
    assert code != 0
    assert output.count("zerompi: error:") == 1, output
    assert "SLURM_STEP_NUM_TASKS=3" in output and "MPI sees 1 rank" in output


@pytest.mark.parametrize("script", CPU_SCRIPTS + GPU_SCRIPTS + ["common.sh"])
def test_every_script_is_valid_bash(script):
    subprocess.run(["bash", "-n", os.path.join(SLURM_DIR, script)], check=True, timeout=30)


@pytest.mark.parametrize("script", CPU_SCRIPTS)
def test_cpu_scripts_pass_sbatch_test_only(slurm, script, tmp_path):
    options = ["--nodes=1", "--ntasks-per-node=4", "--cpus-per-task=2"] if "multi" in script else []
    result = subprocess.run(["sbatch", "--test-only", *options, os.path.join(SLURM_DIR, script)],
                            cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "to start at" in result.stderr, result.stderr


@pytest.mark.parametrize("script", GPU_SCRIPTS)
def test_gpu_scripts_pass_sbatch_test_only(slurm, script, tmp_path):
    """The local Slurm declares 4 GPUs (tests/slurm/local_slurm.sh): --gpus-per-node=4 schedules."""
    result = subprocess.run(["sbatch", "--test-only", *ONE_NODE, os.path.join(SLURM_DIR, script)],
                            cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "to start at" in result.stderr, result.stderr


def test_gpu_scripts_ask_for_every_gpu_of_the_node_not_one_per_task():
    for script in GPU_SCRIPTS:
        text = open(os.path.join(SLURM_DIR, script)).read()
        assert "#SBATCH --gpus-per-node=" in text and "--gpu-bind=none" in text, script
        assert "#SBATCH --gpus-per-task" not in text and "--device gpu" in text, script


@pytest.mark.timeout(300)
def test_gpu_pmi2_script_runs_on_slurm(slurm, tmp_path):
    """The MPICH/pmi2 GPU script, whole, on the local Slurm (its GPUs are stand-ins, so the run
    itself is told --device cpu): srun --mpi=pmi2 --gpu-bind=none starts 2 ranks that train."""
    code, job, result = submit("gpu_mpich_pmi2.sbatch", tmp_path, *ONE_NODE, args=[*SMALL, "--steps", "20",
                                                                                   "--device", "cpu"])
    output = job_output(tmp_path, job)
    assert code == 0, result.stderr + output
    assert "ZeRO stage 3 on 2 ranks" in output and "held-out accuracy" in output
    assert os.path.exists(os.path.join(tmp_path, "runs", f"zerompi-gpu-mpich-{job}", "final.npz"))


def wait_until_gone(job, seconds):
    deadline = time.time() + seconds
    while subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True).stdout.strip():
        assert time.time() < deadline, f"job {job} still in the queue after {seconds} s"
        time.sleep(0.3)


def wait_for_line(path, text, seconds):
    deadline = time.time() + seconds
    while not (os.path.exists(path) and text in open(path).read()):
        assert time.time() < deadline, f"{text!r} never appeared in {path}"
        time.sleep(0.2)


@pytest.mark.timeout(300)
def test_plain_scancel_checkpoints_but_does_not_requeue(slurm, tmp_path):
    flags = ["--steps", "100000", "--hidden", "16", "--log-every", "250", "--report", "none"]
    code, job, result = submit("cpu_single_node.sbatch", tmp_path, args=flags, wait=False)
    assert code == 0, result.stderr
    run_dir = os.path.join(tmp_path, "runs", f"zerompi-cpu-{job}")
    wait_for_line(os.path.join(run_dir, "train.log"), f"step {250:>6}/100000", 120)
    subprocess.run(["scancel", job], check=True, timeout=60)
    wait_until_gone(job, 120)                       # gone for good: not PENDING again
    log = open(os.path.join(run_dir, "train.log")).read()
    assert "signalled: checkpoint written" in log, log   # the tee kept the ranks' last line
    assert "requeueing" not in job_output(tmp_path, job)
    assert open(os.path.join(run_dir, "checkpoints", "latest")).read().startswith("step_")


@pytest.mark.timeout(300)
def test_a_rank_killed_under_srun_ends_the_job_instead_of_hanging(slurm, tmp_path):
    driver = os.path.join(ROOT, "tests", "support", "kill_during_save.py")      # "$ZEROMPI_PYTHON" -m zerompi.train
    env_flag = f"--export=ALL,ZEROMPI_KILL_DURING_SAVE=1:20,ZEROMPI_PYTHON={driver}"
    started = time.time()
    code, job, result = submit("cpu_single_node.sbatch", tmp_path, env_flag,
                               args=["--steps", "40", "--save-every", "10", *SMALL])
    assert code != 0
    assert time.time() - started < 120, "the surviving ranks waited instead of ending"
    run_dir = os.path.join(tmp_path, "runs", f"zerompi-cpu-{job}")
    assert open(os.path.join(run_dir, "checkpoints", "latest")).read().strip() == "step_00000010"


@pytest.mark.timeout(300)
def test_mpirun_inside_an_allocation_is_not_mistaken_for_a_wrong_launch(slurm, tmp_path):
    mpirun_path = os.path.join(os.path.dirname(sys.executable), "mpirun")
    code, job, result = submit(f"{mpirun_path} -n 4 {sys.executable} -m zerompi.train --steps 5 --hidden 8 "
                               f"--report none --log-every 0", tmp_path, "--ntasks=4", "--output=inner-%j.out")
    output = job_output(tmp_path, job)
    assert code == 0, output
    assert "zerompi: error" not in output and "ZeRO stage 3 on 4 ranks" in output


def python_without_zerompi(tmp_path):
    """A python that imports nothing installed (no site-packages, no PYTHONPATH)."""
    fake = tmp_path / "bare-python"
    fake.write_text("#!/bin/sh\nexec python3 -I -S \"$@\"\n")
    fake.chmod(0o755)
    return str(fake)


@pytest.mark.timeout(120)
def test_a_job_whose_python_lacks_zerompi_ends_with_one_line_before_any_rank(slurm, tmp_path):
    code, job, result = submit("cpu_single_node.sbatch", tmp_path,
                               f"--export=ALL,ZEROMPI_PYTHON={python_without_zerompi(tmp_path)}", args=["--steps", "2"])
    output = job_output(tmp_path, job)
    assert code == 2, result.stderr + output
    (line,) = [line for line in output.splitlines() if "zerompi" in line]
    assert line.startswith("zerompi: error: ") and "cannot import zerompi (ModuleNotFoundError" in line, output
    assert "activate the venv that has zerompi before sbatch" in line and "ZEROMPI_PYTHON" in line
    assert not os.path.exists(tmp_path / "runs"), os.listdir(tmp_path / "runs")


@pytest.mark.timeout(120)
def test_a_job_failing_on_bad_input_leaves_no_run_folder(slurm, tmp_path):
    code, job, result = submit("cpu_single_node.sbatch", tmp_path, args=["--steps", "2", "--lr", "-1"])
    output = job_output(tmp_path, job)
    assert code == 2, result.stderr + output
    assert output.count("zerompi: error: --lr must be positive") == 1, output
    assert "the run wrote nothing; removed" in output
    assert not os.path.exists(tmp_path / "runs"), os.listdir(tmp_path / "runs")


@pytest.mark.timeout(120)
def test_a_run_folder_that_was_there_before_the_job_is_kept(slurm, tmp_path):
    """Only what the job itself created is removed: a run folder named by ZEROMPI_RUN_DIR stays."""
    run_dir = tmp_path / "mine"
    run_dir.mkdir()
    code, job, result = submit("cpu_single_node.sbatch", tmp_path, f"--export=ALL,ZEROMPI_RUN_DIR={run_dir}",
                               args=["--steps", "2", "--lr", "-1"])
    assert code == 2, result.stderr + job_output(tmp_path, job)
    assert os.listdir(run_dir) == ["train.log"]


def test_every_zerompi_variable_the_project_reads_is_in_the_docs_table():
    tracked = subprocess.run(["git", "ls-files", "zerompi", "slurm", "tests"], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout.split()
    used = set()
    for name in tracked:
        if os.path.isfile(os.path.join(ROOT, name)):
            used |= set(re.findall(r"\bZEROMPI_[A-Z0-9_]+", open(os.path.join(ROOT, name), errors="replace").read()))
    table = set(re.findall(r"^\| `(ZEROMPI_[A-Z0-9_]+)` \|", open(os.path.join(ROOT, "docs", "clusters-and-slurm.md"))
                           .read(), re.MULTILINE))
    assert {"ZEROMPI_PYTHON", "ZEROMPI_CUDA_AWARE", "ZEROMPI_SLURM_DIR"} <= used
    assert used == table, f"not documented: {sorted(used - table)}; documented but unused: {sorted(table - used)}"
