"""The communicator: the only place that calls MPI, and the only place that times it.

Every array collective is one of mpi4py's buffer (uppercase) methods on one contiguous buffer,
never the pickling lowercase ones. Each call is timed and recorded in the CommLedger.

    allreduce_sum(buf)               buf (n,) <- sum over ranks of buf               (stage 0)
    reduce_scatter_sum(full, shard)  shard (n/N,) <- sum over ranks of full[r-th block]
    reduce_scatter_sum_in_place(full) -> full[:n/N] holds that sum; the rest is garbage (stage 1)
    allgather(shard, full)           full (n,) <- concatenation of every rank's shard (stage 3)
    allgather_in_place(full)         full[r-th block] is rank r's contribution        (stages 1-2)

reduce-scatter, pictured for N = 3 ranks and a buffer of 3 blocks (a, b, c are blocks):

    rank 0: [a0 b0 c0]                        rank 0: [a0+a1+a2]
    rank 1: [a1 b1 c1]   --reduce-scatter-->  rank 1: [b0+b1+b2]
    rank 2: [a2 b2 c2]                        rank 2: [c0+c1+c2]

all-gather is its mirror image: each rank brings one block and every rank leaves with all three.
An all-reduce is a reduce-scatter followed by an all-gather; that is why ZeRO stages 1 and 2 move
the same volume as plain data parallelism.

`check_all` turns an error found on some ranks into the same clean exit on all of them.
"""
import sys
import time

from mpi4py import MPI
import numpy as np

from .ledger import CommLedger


class Communicator:
    def __init__(self, mpi_comm=None):
        self.mpi = mpi_comm if mpi_comm is not None else MPI.COMM_WORLD
        self.rank = self.mpi.Get_rank()
        self.size = self.mpi.Get_size()
        self.ledger = CommLedger()

    def _record(self, op, purpose, buffer, start):
        self.ledger.record(op, purpose, buffer, self.size, time.perf_counter() - start)

    def allreduce_sum(self, buf, purpose):
        start = time.perf_counter()
        self.mpi.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
        self._record("allreduce", purpose, buf, start)

    def reduce_scatter_sum(self, full, shard, purpose):
        start = time.perf_counter()
        self.mpi.Reduce_scatter_block(full, shard, op=MPI.SUM)
        self._record("reduce_scatter", purpose, full, start)

    def reduce_scatter_sum_in_place(self, full, purpose):
        """MPI_IN_PLACE: the input is `full`; this rank's reduced block lands at its front."""
        start = time.perf_counter()
        self.mpi.Reduce_scatter_block(MPI.IN_PLACE, full, op=MPI.SUM)
        self._record("reduce_scatter", purpose, full, start)
        return full[:full.size // self.size]

    def allgather(self, shard, full, purpose):
        start = time.perf_counter()
        self.mpi.Allgather(shard, full)
        self._record("allgather", purpose, full, start)

    def allgather_in_place(self, full, purpose):
        """MPI_IN_PLACE: this rank's block of `full` is already in place."""
        start = time.perf_counter()
        self.mpi.Allgather(MPI.IN_PLACE, full)
        self._record("allgather", purpose, full, start)

    def gather_to_root(self, send, recv):
        """Rank 0 receives every rank's equal-sized `send` into recv (size, ...); not ledgered
        (used only for the end-of-run report)."""
        self.mpi.Gather(send, recv, root=0)

    def ranks_on_this_node(self):
        """How many ranks share this node (and its cores)."""
        node = self.mpi.Split_type(MPI.COMM_TYPE_SHARED)
        count = node.Get_size()
        node.Free()
        return count

    def print0(self, *args, file=None, **kwargs):
        """Print on rank 0 only (the one print helper)."""
        if self.rank == 0:
            print(*args, file=file if file is not None else sys.stdout, flush=True, **kwargs)

    def check_all(self, error):
        """Collective: every rank passes its error message or None. If any rank has one, the
        lowest such rank prints it (one line, once) and every rank raises SystemExit(2)."""
        flag = np.array([self.rank if error is not None else self.size], dtype=np.int64)
        self.mpi.Allreduce(MPI.IN_PLACE, flag, op=MPI.MIN)
        first_failing = int(flag[0])
        if first_failing < self.size:
            if self.rank == first_failing:
                print(f"zerompi: error: {error}", file=sys.stderr, flush=True)
            raise SystemExit(2)
