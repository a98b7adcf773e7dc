"""Run pytest on one MPI rank: `mpirun -n N python tests/support/mpi_launch.py [pytest args]`.

Only rank 0's stdout is kept (N copies of the same report help nobody); every rank keeps stderr,
where tests/conftest.py writes a failing rank's report before it aborts the job. Ranks that
end with a non-zero pytest status abort the job too, so the launcher sees the failure.
"""
import os
import sys

from mpi4py import MPI
import pytest

rank = MPI.COMM_WORLD.Get_rank()
if rank != 0:
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
status = pytest.main(sys.argv[1:])
sys.stdout.flush()
if status != 0:
    sys.stderr.write(f"[rank {rank}] pytest exited with status {status}\n")
    sys.stderr.flush()
    MPI.COMM_WORLD.Abort(int(status))
