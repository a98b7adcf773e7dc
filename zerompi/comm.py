"""The communicator: the only place that calls MPI, and the only place that times it.

Every array collective is one of mpi4py's buffer (uppercase) methods on one contiguous buffer,
never the pickling lowercase ones. Each call is timed and recorded in the CommLedger.

    allreduce_sum(buf)               buf (n,) <- sum over ranks of buf               (stage 0)
    reduce_scatter_sum(full, shard)  shard (n/N,) <- (or +=) sum over ranks of full[r-th block]
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

16-bit buffers: sums are computed in float32 through a one-unit staging buffer and rounded to 16
bits once (zerompi/precision.py says why); all-gathers move the 16-bit words as they are. The
ledger records the buffer that actually went to MPI, so its bytes show the widened reductions.

`check_all` turns an error found on some ranks into the same clean exit on all of them.
"""
import copy
import sys
import time

from mpi4py import MPI
import numpy as np

from .ledger import CommLedger
from .precision import is_16bit


def _words(buf):
    """16-bit floats as uint16 words (MPI has no bfloat16 type; a gather only copies bits)."""
    return buf.view(np.uint16) if is_16bit(buf) else buf


class Communicator:
    def __init__(self, mpi_comm=None):
        self.mpi = mpi_comm if mpi_comm is not None else MPI.COMM_WORLD
        self.rank = self.mpi.Get_rank()
        self.size = self.mpi.Get_size()
        self.ledger = CommLedger()
        self.staging_full = self.staging_shard = None   # see reserve_staging

    def reserve_staging(self, memory, max_elements, reduce_dtype):
        """Staging for reductions that cannot run on the buffer itself: 16-bit buffers (widened
        to reduce_dtype, see zerompi/precision.py) and accumulating reduce-scatters. One unit's
        worth, ledgered as work memory."""
        self.staging_full = memory.alloc("work", "comm.staging_full", (max_elements,), reduce_dtype)
        self.staging_shard = memory.alloc("work", "comm.staging_shard", (max_elements // self.size,),
                                          reduce_dtype)

    def _record(self, op, purpose, wire_buffer, start):
        self.ledger.record(op, purpose, wire_buffer, self.size, time.perf_counter() - start)

    def allreduce_sum(self, buf, purpose):
        """buf <- sum over ranks of buf, in place; 16-bit buffers are summed in reduce_dtype."""
        wire = buf
        if is_16bit(buf):
            wire = self.staging_full[:buf.size]
            wire[...] = buf                                # widen
        start = time.perf_counter()
        self.mpi.Allreduce(MPI.IN_PLACE, wire, op=MPI.SUM)
        self._record("allreduce", purpose, wire, start)
        if wire is not buf:
            buf[...] = wire                                # round once

    def reduce_scatter_sum(self, full, shard, purpose, accumulate=False):
        """shard (n/N,) <- (or +=, with accumulate) the sum over ranks of this rank's block of full (n,)."""
        send = full
        if is_16bit(full):
            send = self.staging_full[:full.size]
            send[...] = full                               # widen
        recv = self.staging_shard[:shard.size] if (accumulate or send is not full) else shard
        start = time.perf_counter()
        self.mpi.Reduce_scatter_block(send, recv, op=MPI.SUM)
        self._record("reduce_scatter", purpose, send, start)
        if accumulate:
            shard += recv                                  # gradient accumulation: add this micro-batch
        elif recv is not shard:
            shard[...] = recv                              # round once

    def reduce_scatter_sum_in_place(self, full, purpose):
        """Returns full[:n/N], holding the sum over ranks of this rank's block of full (n,). The
        rest of full is garbage afterwards. (MPI_IN_PLACE: the reduced block lands at the front.)"""
        shard = full[:full.size // self.size]
        if is_16bit(full):
            self.reduce_scatter_sum(full, shard, purpose)  # via staging; shard is read first
            return shard
        start = time.perf_counter()
        self.mpi.Reduce_scatter_block(MPI.IN_PLACE, full, op=MPI.SUM)
        self._record("reduce_scatter", purpose, full, start)
        return shard

    def allgather(self, shard, full, purpose):
        """full (n,) <- every rank's shard (n/N,), in rank order; 16-bit values travel as 16-bit words."""
        start = time.perf_counter()
        self.mpi.Allgather(_words(shard), _words(full))
        self._record("allgather", purpose, full, start)

    def allgather_in_place(self, full, purpose):
        """MPI_IN_PLACE: this rank's block of `full` is already in place."""
        start = time.perf_counter()
        self.mpi.Allgather(MPI.IN_PLACE, _words(full))
        self._record("allgather", purpose, full, start)

    def gather_to_root(self, send, recv):
        """Rank 0 receives every rank's equal-sized `send` into recv (size, ...); not ledgered
        (the end-of-run report and checkpoint manifests: bookkeeping, not training traffic)."""
        self.mpi.Gather(send, recv, root=0)

    def duplicate(self):
        """A Communicator on a duplicate of this MPI communicator (MPI_Comm_dup) that shares this
        one's ledger and staging buffers: for the communication thread (zerompi/overlap.py), whose
        collectives must never interleave with this thread's on one communicator."""
        twin = copy.copy(self)
        twin.mpi = self.mpi.Dup()
        return twin

    @staticmethod
    def thread_level_error():
        """Why a communication thread cannot be used, or None (it needs MPI_THREAD_MULTIPLE)."""
        if MPI.Query_thread() >= MPI.THREAD_MULTIPLE:
            return None
        return (f"--overlap on needs MPI_THREAD_MULTIPLE, but MPI was initialized with thread level "
                f"{MPI.Query_thread()}: use --overlap off")

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

    def first_failing_rank(self, error):
        """Collective: the lowest rank whose error is not None, or None when no rank has one."""
        flag = np.array([self.rank if error is not None else self.size], dtype=np.int64)
        self.mpi.Allreduce(MPI.IN_PLACE, flag, op=MPI.MIN)
        return int(flag[0]) if flag[0] < self.size else None

    def any_failed(self, error):
        """Collective: True on every rank when any rank's error is not None."""
        return self.first_failing_rank(error) is not None

    def check_all(self, error, exit_code=2):
        """Collective: every rank passes its error message or None. If any rank has one, the
        lowest such rank prints it (one line, once) and every rank raises SystemExit(exit_code)."""
        first_failing = self.first_failing_rank(error)
        if first_failing is not None:
            if self.rank == first_failing:
                print(f"zerompi: error: {error}", file=sys.stderr, flush=True)
            raise SystemExit(exit_code)
