"""Ranks that are not there: the devices and communicator a plan builds the run's engine on.

A plan (zerompi/plan/__init__.py) builds the very engine a run builds (zerompi/engine.py's
build_engine: layout, stage, Adam state, staging, activations), on one rank of N, without MPI and
without memory:

    VirtualDevice(device)    zeros(shape, dtype) returns an array of that shape and dtype whose
                             every element is one shared element (stride 0), writes to which do
                             nothing: its .nbytes is what the run would allocate, and nothing is
                             allocated. Everything else is the real device's (the CPU, or a GPU's
                             operand dtypes and work buffers)
    PlannedCommunicator      rank r of N ranks on the given nodes: the real Communicator's
                             collectives, staging and ledger, over a transport that moves nothing
                             and notes each call MPI would get (PlannedCall)

The engine's MemoryLedger then holds, buffer by buffer, what rank r of the run will allocate, and
driving the stage's hooks through one step (zerompi/plan/__init__.py) fills the CommLedger with the
step's collectives, as the run's ledger will count them.
"""
import copy
from typing import NamedTuple

import numpy as np

from ..comm import Communicator, ReductionStaging, Unguarded
from ..cpu import CPU
from ..ledger import ALLGATHER, ALLREDUCE, ALLTOALL, GRADS, REDUCE_SCATTER, CommLedger
from ..nodes import number_nodes, sends_across_nodes


class VirtualArray(np.ndarray):
    """An array whose every element is one shared element (stride 0), and on which writes and
    in-place arithmetic do nothing: a plan never reads a value, and copying 67 million elements
    onto one (16-bit reductions widen a layer into float32 staging) would cost a second."""

    def __setitem__(self, index, value):
        """Nothing to write."""

    def __array_ufunc__(self, ufunc, method, *inputs, out=None, **kwargs):
        if out is None:
            return NotImplemented             # a plan computes nothing new: TypeError
        return out[0] if len(out) == 1 else out


def virtual_array(shape, dtype):
    """An array of `shape` and `dtype` that allocates one element (VirtualArray)."""
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    one = np.zeros(1, dtype=dtype)
    return np.lib.stride_tricks.as_strided(one, shape=shape, strides=(0,) * len(shape)).view(VirtualArray)


class VirtualDevice:
    """The real device (zerompi/devices/), except that its buffers take no memory."""

    def __init__(self, device):
        self.device = device

    def zeros(self, shape, dtype):
        return virtual_array(shape, dtype)

    def pinned_bytes(self, nbytes):
        return virtual_array((nbytes,), np.uint8)

    def host_zeros(self, shape, dtype):
        return virtual_array(shape, dtype)

    def __getattr__(self, name):            # name, is_gpu, operand_dtype, linear_work, ...
        return getattr(self.device, name)


class PlannedCall(NamedTuple):
    """One collective as MPI would receive it."""
    op: str              # ALLREDUCE, REDUCE_SCATTER or ALLGATHER (zerompi/ledger.py)
    nbytes: int          # the full-size buffer: n elements for all ranks
    ranks: int           # ranks of the communicator that runs it
    nodes: int           # nodes those ranks are on
    across_nodes: bool   # this rank's ring successor is on another node
    communicator: int = 0   # which: 0 the world, then each one the engine made (split, duplicate)
    purpose: str = GRADS    # what the ledger counts it as: GRADS, PARAMS or METRICS


class PlannedTransport:
    """Moves nothing; notes each call in `calls` (shared by a world and its sub-communicators)."""

    def __init__(self, comm, calls):
        self.comm, self.calls = comm, calls

    def _note(self, op, buf):
        c = self.comm
        self.calls.append(PlannedCall(op, buf.nbytes, c.size, c.num_nodes, c.across_nodes, c.number, c.purpose))

    def sum_all(self, buf):
        self._note(ALLREDUCE, buf)

    def sum_scatter(self, send, recv):
        self._note(REDUCE_SCATTER, send)

    def gather_all(self, full, shard):
        self._note(ALLGATHER, full)

    def exchange(self, send, recv):
        self._note(ALLTOALL, recv)

    def reserve_host_staging(self, memory, max_bytes):
        """Host memory needs no staging (a plan of a GPU run leaves out its pinned host staging)."""

class PlannedCommunicator(Communicator):
    """Rank `rank` of `size` ranks, rank r on node node_of_rank[r] (all on one node by default):
    the Communicator's own code for collectives, staging and the ledger, and no MPI."""

    def __init__(self, size, rank=0, node_of_rank=None, device=None, calls=None, made=None):
        """calls, made: the world's, shared by the communicators made from it (made: the
        communicators made so far, the world first)."""
        self.mpi = None
        self.rank, self.size = rank, size
        self.node_of_rank = tuple(node_of_rank) if node_of_rank is not None else (0,) * size
        if len(self.node_of_rank) != size or not 0 <= rank < size:
            raise ValueError(f"rank {rank} of {size} ranks on nodes {self.node_of_rank}")
        self.across_nodes = sends_across_nodes(self.node_of_rank, rank)
        self.num_nodes = len(set(self.node_of_rank))      # once: a plan notes thousands of calls
        self.ledger = CommLedger()
        self.device = device if device is not None else VirtualDevice(CPU())
        self.staging = ReductionStaging()
        self.guards = Unguarded()
        self.calls = calls if calls is not None else []
        self.transport = PlannedTransport(self, self.calls)
        self.purpose = None                       # of the collective in progress (_begin)
        self.made = made if made is not None else []
        self.number = len(self.made)              # 0: the world
        self.made.append(self)

    def _begin(self, op, purpose, buffer):
        """Communicator._begin, noting the purpose for the PlannedCall the transport makes."""
        self.purpose = purpose
        return super()._begin(op, purpose, buffer)

    def split(self, color_of):
        """The ranks with this rank's color, as Communicator.split would group them."""
        members = [r for r in range(self.size) if color_of(r) == color_of(self.rank)]
        sub = PlannedCommunicator(len(members), members.index(self.rank),
                                  number_nodes([self.node_of_rank[r] for r in members]), self.device, self.calls,
                                  self.made)
        sub.ledger = self.ledger
        return sub

    def duplicate(self):
        """A communicator of its own (the communication thread's) on the same ranks, sharing this
        one's ledger and staging, as Communicator.duplicate."""
        twin = copy.copy(self)
        twin.number = len(self.made)
        self.made.append(twin)
        twin.transport = PlannedTransport(twin, self.calls)
        return twin

    @staticmethod
    def thread_level_error():
        """A plan's communication thread (--overlap) calls no MPI."""
        return None

