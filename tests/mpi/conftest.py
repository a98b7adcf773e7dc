"""Multi-rank tests: run under `mpirun -n N python tests/support/mpi_launch.py --with-mpi tests/mpi`.

A failing assert on one rank would leave the others waiting in their next collective forever.
So when a test fails on any rank, that rank prints its report and calls MPI_Abort, which ends
every rank of the job at once with a non-zero exit code: a failure, never a hang.
"""
import shutil
import sys
import tempfile

import pytest
from mpi4py import MPI


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed and MPI.COMM_WORLD.Get_size() > 1:
        rank = MPI.COMM_WORLD.Get_rank()
        sys.stderr.write(f"\n[rank {rank}] FAILED {item.nodeid} ({report.when})\n{report.longreprtext}\n"
                         f"[rank {rank}] calling MPI_Abort so that no other rank hangs\n")
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(1)


@pytest.fixture(scope="module")
def shared_folder():
    """A folder every rank sees (rank 0 makes it; removed after the module)."""
    world = MPI.COMM_WORLD
    folder = world.bcast(tempfile.mkdtemp(prefix="zerompi-reshard-") if world.rank == 0 else None)
    yield folder
    world.Barrier()
    if world.rank == 0:
        shutil.rmtree(folder)
