"""What zerompi's start-up decides from the node each rank runs on, printed per rank
(tests/program/test_multi_node.py, on the emulated cluster).

    mpiexec ... python tests/support/node_report.py

Built as zerompi/train/loop/run.py builds it: the device chosen before MPI starts (the launcher's local
rank), the Communicator, its ranks_on_this_node(), and the BLAS threads from them. Rank 0 prints
one line per rank, in rank order:

    rank R node NAME node_ranks K local_rank L threads T
"""
import os

from zerompi.devices import communicator_on
from zerompi.train.options.device_choice import local_rank, select_device
from zerompi.cpu import blas_threads

device, _ = select_device("cpu", os.environ)
comm = communicator_on(device)
from mpi4py import MPI  # noqa: E402  (after the Communicator started MPI)

ranks_on_node = comm.ranks_on_this_node()
threads = blas_threads(ranks_on_node, os.environ, len(os.sched_getaffinity(0)))
line = (f"rank {comm.rank} node {MPI.Get_processor_name()} node_ranks {ranks_on_node} "
        f"local_rank {local_rank(os.environ)} threads {threads}")
lines = comm.gather_bytes_to_root(line.encode())
if comm.rank == 0:
    print("\n".join(received.decode() for received in lines))
