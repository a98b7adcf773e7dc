"""Run pytest on one MPI rank: `mpirun -n N python tests/support/mpi_launch.py [pytest args]`.

Only rank 0's stdout is kept (N copies of the same report help nobody); every rank keeps stderr,
where tests/conftest.py writes a failing rank's report before it aborts the job. Ranks that
end with a non-zero pytest status abort the job too, so the launcher sees the failure.

Each rank limits its BLAS threads as the program does (zerompi.cpu.blas_threads: the cores over
the ranks on the node): N ranks each starting a pool of every core's threads, spinning while
they wait, made a 512-wide layer's product of two rows take 30 ms at N = 4 on 2 cores.
"""
import os
import sys

from mpi4py import MPI
import pytest
from threadpoolctl import threadpool_limits

from zerompi.cpu import blas_threads

rank = MPI.COMM_WORLD.Get_rank()
ranks_on_node = MPI.COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED).Get_size()
threadpool_limits(blas_threads(ranks_on_node, os.environ, len(os.sched_getaffinity(0))), user_api="blas")
if rank != 0:
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
status = pytest.main(sys.argv[1:])
sys.stdout.flush()
if status != 0:
    sys.stderr.write(f"[rank {rank}] pytest exited with status {status}\n")
    sys.stderr.flush()
    MPI.COMM_WORLD.Abort(int(status))
