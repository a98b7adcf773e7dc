"""The communicator: where the training collectives call MPI, and where they are timed and counted.

Every array collective is one of mpi4py's buffer (uppercase) methods on one contiguous buffer,
never the pickling lowercase ones. Each call is timed and recorded in the CommLedger.

    allreduce_sum(buf)               buf (n,) <- sum over ranks of buf               (stage 0)
    reduce_scatter_sum(full, shard)  shard (n/N,) <- (or +=) sum over ranks of full[r-th block]
    reduce_scatter_sum_in_place(full) -> full[:n/N] holds that sum; the rest is undefined (stage 1)
    allgather(shard, full)           full (n,) <- concatenation of every rank's shard (stage 3)
    allgather_in_place(full)         full[r-th block] is rank r's contribution        (stages 1-2)
    alltoall(send, recv)             recv[r-th block] <- rank r's send[this rank's block]
                                     (zerompi/quantize/'s qgZ; no stage calls it)

reduce-scatter, pictured for N = 3 ranks and a buffer of 3 blocks (a, b, c are blocks):

    rank 0: [a0 b0 c0]                        rank 0: [a0+a1+a2]
    rank 1: [a1 b1 c1]   --reduce-scatter-->  rank 1: [b0+b1+b2]
    rank 2: [a2 b2 c2]                        rank 2: [c0+c1+c2]

all-gather is its mirror image: each rank brings one block and every rank leaves with all three.
An all-reduce is a reduce-scatter followed by an all-gather; that is why ZeRO stages 1 and 2 move
the same volume as plain data parallelism.

This file reads top to bottom as the CPU float32 mainline: the five collectives, each one
mpi4py buffer call (MpiTransport), between `_begin` and `_end`, which time it and record it in
the CommLedger (zerompi/ledger.py). Around that, in their own files; the layers are handed in
(this file imports none of them):

    transport   how a buffer reaches the wire: MpiTransport (host memory, below); on a GPU a
                DeviceTransport (zerompi/devices/staging.py: stream synchronization, pinned host
                staging when MPI is not CUDA-aware); NCCL (zerompi/devices/nccl.py)
    guards      --check-collectives and --collective-timeout around every collective
                (zerompi/observe/guards.py); `Unguarded` (below) when none are given
    control     errors every rank agrees on, print0, bookkeeping gathers: not training traffic,
                not ledgered (zerompi/control.py, mixed into the Communicator)
    nodes       which node each rank runs on, learned when the Communicator is built, so that
                the ledger splits each call's bytes into intra- and inter-node (zerompi/nodes.py)
    listeners   whoever wants to see each collective (--trace) listens to the ledger

Mixed precision, a layer a reader of ZeRO can skip (the last section of the class): MPI has no
bfloat16, so 16-bit reductions are summed in float32 through a one-layer staging buffer and rounded
to 16 bits once (zerompi/precision.py says why); all-gathers move the 16-bit words as they are.
The ledger records the buffer that actually went to MPI, so its bytes show the widened reductions.

MPI is initialized when the first Communicator is built, not when this module is imported, so
that the program can choose the GPU first (zerompi/train/options/device_choice.py); the library
itself is loaded at the first use of MPI (zerompi/mpi.py), so that what needs no MPI (a plan) runs
without one.
"""
import copy
import time

import numpy as np

from .control import ControlMessages
from .cpu import CPU
from .ledger import ALLGATHER, ALLREDUCE, ALLTOALL, CONTROL, REDUCE_SCATTER, CommLedger
from .mpi import MPI, init_mpi
from .nodes import node_of_rank, sends_across_nodes, share_to_other_nodes
from .precision import is_16bit


class MpiTransport:
    """Host memory to MPI: the buffer calls every training collective ends in. (On a GPU a
    DeviceTransport wraps this one; see the module docstring.)"""

    def __init__(self, mpi):
        self.mpi = mpi

    def sum_all(self, buf):
        """buf (n,) <- the sum over ranks of buf."""
        self.mpi.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)

    def sum_scatter(self, send, recv):
        """recv (n/N,) <- the sum over ranks of this rank's block of send (n,); recv None: in
        place, the result lands in send[:n/N]."""
        if recv is None:
            self.mpi.Reduce_scatter_block(MPI.IN_PLACE, send, op=MPI.SUM)
        else:
            self.mpi.Reduce_scatter_block(send, recv, op=MPI.SUM)

    def gather_all(self, full, shard):
        """full (n,) <- every rank's block of n/N elements, in rank order; this rank's block comes
        from shard (n/N,), or is already in place in full when shard is None."""
        self.mpi.Allgather(MPI.IN_PLACE if shard is None else shard, full)

    def exchange(self, send, recv):
        """recv (n,) <- block r: rank r's block (n/N) for this rank of its send (n,)."""
        self.mpi.Alltoall(send, recv)

    def reserve_host_staging(self, memory, max_bytes):
        """Host memory needs no staging."""

    def duplicate(self, mpi):
        return MpiTransport(mpi)

    def split(self, sub):
        """This transport for `sub`, a Communicator on some of this one's ranks."""
        return MpiTransport(sub.mpi)

    def describe(self):
        return "MPI on host memory"


class ReductionStaging:
    """Float32 buffers for reductions that cannot run on the buffer itself (see
    Communicator.reserve_staging): `full` (n,) and `shard` (n/N,), one layer's worth; None until
    reserved. Shared by a communicator, its duplicate and its device transport."""

    def __init__(self):
        self.full = self.shard = None


class Unguarded:
    """The guards of a communicator built without them: nothing around any collective (the
    checks and the watchdog, zerompi/observe/guards.py, are a layer built on the same calls)."""

    check = None

    def begin(self, kind, purpose, buffer):
        pass

    def end(self):
        pass

    def duplicate(self, mpi):
        return self

    def split(self, mpi):
        return self


class Communicator(ControlMessages):
    def __init__(self, mpi_comm=None, device=None, guards=None):
        """mpi_comm: the mpi4py communicator (MPI_COMM_WORLD by default); device: where the
        training buffers live (zerompi/device.py; the CPU by default); guards: what runs around
        each collective, from the first one on (zerompi/observe/guards.py; none by default).
        Collectives reach MPI through an MpiTransport; for device memory zerompi/devices/ puts a
        DeviceTransport in its place (`devices.communicator_on`)."""
        init_mpi()
        self.mpi = mpi_comm if mpi_comm is not None else MPI.COMM_WORLD
        self.rank = self.mpi.Get_rank()
        self.size = self.mpi.Get_size()
        self.guards = guards if guards is not None else Unguarded()
        self.guards.begin("split_type", CONTROL, None)
        self.node_of_rank = node_of_rank(self.mpi)       # collective: the node of each rank
        self.guards.end()
        self.across_nodes = sends_across_nodes(self.node_of_rank, self.rank)   # for the ledger
        self.ledger = CommLedger()
        self.device = device if device is not None else CPU()
        self.staging = ReductionStaging()                 # see reserve_staging
        self.transport = MpiTransport(self.mpi)

    # ---- the collectives of ZeRO, on flat buffers
    def allreduce_sum(self, buf, purpose):
        """buf (n,) <- the sum over ranks of buf, in place."""
        if is_16bit(buf):
            return self._allreduce_widened(buf, purpose)
        start = self._begin(ALLREDUCE, purpose, buf)
        self.transport.sum_all(buf)
        self._end(ALLREDUCE, purpose, buf, start)

    def reduce_scatter_sum(self, full, shard, purpose, accumulate=False):
        """shard (n/N,) <- (or +=, with accumulate) the sum over ranks of this rank's block of full (n,)."""
        if is_16bit(full):
            return self._reduce_scatter_widened(full, shard, purpose, accumulate)
        recv = self.staging.shard[:shard.size] if accumulate else shard   # accumulate: reduce, then add
        start = self._begin(REDUCE_SCATTER, purpose, full)
        self.transport.sum_scatter(full, recv)
        self._end(REDUCE_SCATTER, purpose, full, start)
        if accumulate:
            shard += recv                                  # gradient accumulation: add this micro-batch

    def reduce_scatter_sum_in_place(self, full, purpose):
        """Returns full[:n/N], holding the sum over ranks of this rank's block of full (n,). What the
        rest of full holds afterwards is the MPI library's to say (the standard does not; MPICH
        leaves it as it was, another may use it as scratch): read none of it. (MPI_IN_PLACE: the
        reduced block lands at the front.)"""
        shard = full[:full.size // self.size]
        if is_16bit(full):
            self._reduce_scatter_widened(full, shard, purpose)   # full is read before shard is written
            return shard
        start = self._begin(REDUCE_SCATTER, purpose, full)
        self.transport.sum_scatter(full, None)
        self._end(REDUCE_SCATTER, purpose, full, start)
        return shard

    def allgather(self, shard, full, purpose):
        """full (n,) <- every rank's shard (n/N,), in rank order (16-bit values as 16-bit words, `_words`)."""
        start = self._begin(ALLGATHER, purpose, full)
        self.transport.gather_all(_words(full), _words(shard))
        self._end(ALLGATHER, purpose, full, start)

    def allgather_in_place(self, full, purpose):
        """MPI_IN_PLACE: this rank's block of `full` is already in place."""
        start = self._begin(ALLGATHER, purpose, full)
        self.transport.gather_all(_words(full), None)
        self._end(ALLGATHER, purpose, full, start)

    def alltoall(self, send, recv, purpose):
        """recv (n,) <- block r of it: rank r's block of send (n,) for this rank, in rank order."""
        start = self._begin(ALLTOALL, purpose, recv)
        self.transport.exchange(_words(send), _words(recv))
        self._end(ALLTOALL, purpose, recv, start, share_to_other_nodes(self.node_of_rank, self.rank))

    def _begin(self, op, purpose, buffer):
        """Before a collective: the guards (off by default); returns the start time."""
        self.guards.begin(op, purpose, buffer)
        return time.perf_counter()

    def _end(self, op, purpose, buffer, start, across_nodes=None):
        """After a collective: the guards, then the ledger records it (buffer: what MPI was handed;
        across_nodes: an all-to-all's share, or None: the ring's)."""
        self.guards.end()
        self.ledger.record(op, purpose, buffer, self.size, start, time.perf_counter(),
                           self.across_nodes if across_nodes is None else across_nodes)

    # ---- set-up: staging buffers, guards, the communication thread's twin
    def reserve_staging(self, memory, max_elements, reduce_dtype):
        """Staging for reductions that cannot run on the buffer itself: 16-bit buffers (widened
        to reduce_dtype, see zerompi/precision.py), accumulating reduce-scatters, and in-place
        reduce-scatters of device memory. The largest reduction's worth (a layer, or a stage-0
        gradient bucket), ledgered as work memory."""
        self.staging.full = memory.alloc("work", "comm.staging_full", (max_elements,), reduce_dtype)
        self.staging.shard = memory.alloc("work", "comm.staging_shard", (max_elements // self.size,),
                                          reduce_dtype)

    def reserve_host_staging(self, memory, max_bytes):
        """Pinned host memory for the largest collective on device memory (one layer in the
        widest dtype MPI sees), when MPI is not CUDA-aware (the transport decides); ledgered as
        work memory."""
        self.transport.reserve_host_staging(memory, max_bytes)

    @property
    def check(self):
        """--check-collectives' CollectiveCheck, or None (zerompi/overlap/thread.py hands it call sites)."""
        return self.guards.check

    def describe_transport(self):
        """One line for the start of a run: how collectives reach device memory, and why."""
        return self.transport.describe()

    def duplicate(self):
        """A Communicator on a duplicate of this MPI communicator (MPI_Comm_dup) that shares this
        one's ledger and staging buffers: for the communication thread (zerompi/overlap/thread.py), whose
        collectives must never interleave with this thread's on one communicator. The pinned host
        staging and the guards are its own: both threads may be in a collective at the same moment."""
        twin = copy.copy(self)
        self.guards.begin("dup", CONTROL, None)
        twin.mpi = self.mpi.Dup()
        self.guards.end()
        twin.transport = self.transport.duplicate(twin.mpi)
        twin.guards = self.guards.duplicate(twin.mpi)
        return twin

    def split(self, color_of):
        """A Communicator over the ranks r of this one with the same color_of(r) as this rank
        (MPI_Comm_split, in this one's rank order), recording into this one's ledger, its guards
        turned on alike (naming ranks as the job does, Guards.split): the shard groups and replica
        groups of zerompi/hierarchy/. color_of is a function of the rank, so that a plan
        (zerompi/plan/) can tell every rank's group without MPI. Collective."""
        self.guards.begin("split", CONTROL, None)         # the split, and the new one's node map
        split = self.mpi.Split(color_of(self.rank), self.rank)
        sub = Communicator(split, self.device)
        self.guards.end()
        sub.ledger = self.ledger
        sub.guards = self.guards.split(split)
        sub.transport = self.transport.split(sub)
        return sub

    @staticmethod
    def thread_level_error():
        """Why a communication thread cannot be used, or None (it needs MPI_THREAD_MULTIPLE)."""
        if MPI.Query_thread() >= MPI.THREAD_MULTIPLE:
            return None
        return (f"--overlap needs MPI_THREAD_MULTIPLE, but MPI was initialized with thread level "
                f"{MPI.Query_thread()}: leave --overlap off")

    # ---- mixed precision: 16-bit reductions in float32 (see the module docstring)
    def _allreduce_widened(self, buf, purpose):
        wide = self.staging.full[:buf.size]
        wide[...] = buf                                    # widen
        self.allreduce_sum(wide, purpose)
        buf[...] = wide                                    # round once

    def _reduce_scatter_widened(self, full, shard, purpose, accumulate=False):
        wide = self.staging.full[:full.size]
        wide[...] = full                                   # widen
        wide_shard = self.staging.shard[:shard.size]
        self.reduce_scatter_sum(wide, wide_shard, purpose)
        if accumulate:                                     # add in float32 (not `shard += wide_shard`:
            so_far = wide[:shard.size]                     # a ufunc between two dtypes allocates
            so_far[...] = shard                            # casting buffers); `wide` is used up
            wide_shard += so_far
        shard[...] = wide_shard                            # round once


def _words(buf):
    """16-bit floats as uint16 words (MPI has no bfloat16 type; a gather only copies bits)."""
    return buf.view(np.uint16) if is_16bit(buf) else buf
