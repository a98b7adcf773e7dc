"""Launch sanity (N lone single-rank jobs are caught) and BLAS threads per rank."""
import os
import subprocess
import sys

from zerompi.cpu import blas_threads
from zerompi.mpi import launcher_rank
from zerompi.train.options.launch import launch_mismatch


def test_matching_launch_is_fine():
    assert launch_mismatch(4, {"SLURM_STEP_NUM_TASKS": "4", "PMI_SIZE": "4"}) is None
    assert launch_mismatch(1, {}) is None                      # plain `python -m zerompi.train`


def test_n_lone_ranks_are_caught_for_every_launcher():
    for name in ("SLURM_STEP_NUM_TASKS", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE"):
        message = launch_mismatch(1, {name: "8"})
        assert message is not None and f"{name}=8" in message and "MPI sees 1 rank" in message
        assert "--mpi=pmi2" in message and "--mpi=pmix" in message


def test_launcher_rank():
    assert launcher_rank({"SLURM_PROCID": "3"}) == 3
    assert launcher_rank({"OMPI_COMM_WORLD_RANK": "2"}) == 2
    assert launcher_rank({}) == 0


def test_blas_threads():
    assert blas_threads(4, {}, cores=16) == 4
    assert blas_threads(8, {}, cores=2) == 1                    # oversubscribed: at least one
    assert blas_threads(8, {"OMP_NUM_THREADS": "3"}, cores=2) == 3   # the user's (or Slurm's) choice


def test_a_lone_process_that_was_told_it_has_siblings_stops_with_one_line(tmp_path):
    """What a wrong `srun --mpi` looks like from inside one process: the launcher says 3, MPI says 1."""
    env = dict(os.environ, SLURM_STEP_NUM_TASKS="3", SLURM_PROCID="0")
    result = subprocess.run([sys.executable, "-m", "zerompi.train", "--steps", "2"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.count("zerompi: error:") == 1 and "SLURM_STEP_NUM_TASKS=3" in result.stderr
    env["SLURM_PROCID"] = "1"                                   # the other lone processes stay silent
    result = subprocess.run([sys.executable, "-m", "zerompi.train", "--steps", "2"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "zerompi: error:" not in result.stderr


def test_omp_num_threads_must_be_a_positive_integer():
    from zerompi.train.options.launch import threads_variable_error
    assert threads_variable_error({}) is None
    assert threads_variable_error({"OMP_NUM_THREADS": "2"}) is None
    assert threads_variable_error({"OMP_NUM_THREADS": "4,2"}) is None          # OpenMP's nested form
    assert blas_threads(2, {"OMP_NUM_THREADS": "4,2"}, cores=16) == 4
    for bad in ("", "0", "-1", "two", "2.5"):
        assert f"OMP_NUM_THREADS={bad!r}" in threads_variable_error({"OMP_NUM_THREADS": bad})


def test_variables_with_non_ascii_digits_are_not_numbers():
    """str.isdigit() takes '²' and '٤', which int() refuses: such a value is not a count, never a
    traceback (a launcher variable is ignored, OMP_NUM_THREADS is one line)."""
    from zerompi.train.options.device_choice import local_rank
    from zerompi.train.options.launch import threads_variable_error
    for value in ("²", "٤", "4²"):
        assert launch_mismatch(4, {"PMI_SIZE": value}) is None
        assert launcher_rank({"PMI_RANK": value}) == 0 and local_rank({"MPI_LOCALRANKID": value}) == 0
        assert "is not a positive integer" in threads_variable_error({"OMP_NUM_THREADS": value})
        assert blas_threads(2, {"OMP_NUM_THREADS": value}, 8) == 4
