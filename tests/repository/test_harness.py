"""The multi-rank test harness itself: a test that fails on one rank while the other ranks wait
in a collective must end the whole job with a failure, quickly, instead of hanging; and each rank
of an MPI test run holds the BLAS threads the program would give it (the cores over the ranks on
its node), not a pool of every core's threads each."""
import os
import subprocess
import sys
import textwrap
import time

import pytest
from mpi4py import MPI
from threadpoolctl import threadpool_info

from run_all import mpirun
from zerompi.cpu import blas_threads

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))     # tests/

FAILS_ON_RANK_1 = textwrap.dedent("""
    import pytest
    from mpi4py import MPI

    @pytest.mark.mpi(min_size=2)
    def test_rank_1_fails_while_the_others_wait():
        comm = MPI.COMM_WORLD
        assert comm.rank != 1, "deliberate failure on rank 1"
        comm.Barrier()                 # rank 1 never arrives: without the abort hook, a hang
""")


def test_a_failure_on_one_rank_aborts_the_job(tmp_path):
    (tmp_path / "conftest.py").write_text(open(os.path.join(HERE, "conftest.py")).read())
    (tmp_path / "test_fails.py").write_text(FAILS_ON_RANK_1)
    start = time.time()
    result = subprocess.run([mpirun(), "-n", "2", sys.executable, os.path.join(HERE, "support", "mpi_launch.py"),
                             "-q", "--with-mpi", "-p", "no:cacheprovider",
                             str(tmp_path / "test_fails.py")],
                            cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert time.time() - start < 60
    assert "deliberate failure on rank 1" in result.stderr
    assert "calling MPI_Abort" in result.stderr


@pytest.mark.mpi
def test_each_rank_of_an_mpi_run_limits_its_blas_threads():
    ranks_on_node = MPI.COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED).Get_size()
    expected = blas_threads(ranks_on_node, os.environ, len(os.sched_getaffinity(0)))
    assert {pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"} == {expected}
