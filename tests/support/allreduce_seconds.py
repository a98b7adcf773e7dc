"""Time an Allreduce across the ranks of an MPI job (tests/program/test_emulated_cluster.py: the shaped
link of the emulated cluster).

    mpiexec ... python tests/support/allreduce_seconds.py MEGABYTES

One float32 buffer of MEGABYTES, reduced once to warm the connections, then three times; rank 0
prints the slowest rank's median time in seconds.
"""
import sys
import time

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
buf = np.ones(int(float(sys.argv[1]) * 2**20) // 4, dtype=np.float32)
comm.Allreduce(MPI.IN_PLACE, buf)
seconds = []
for _ in range(3):
    comm.Barrier()
    start = time.perf_counter()
    comm.Allreduce(MPI.IN_PLACE, buf)
    seconds.append(time.perf_counter() - start)
slowest = comm.reduce(float(np.median(seconds)), op=MPI.MAX)
if comm.rank == 0:
    print(f"{slowest:.4f}")
