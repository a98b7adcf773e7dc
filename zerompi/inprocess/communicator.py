"""InProcessCommunicator: rank r of N ranks that are threads of one process, with no MPI.

It is the Communicator of zerompi/comm.py (the same collectives, staging for 16-bit reductions,
ledger and guards' hooks), whose transport and control messages meet the other ranks' threads at
a Hub (hub.py) instead of calling MPI:

    transport (InProcessTransport)      control messages (InProcessCommunicator)
    sum_all      allreduce              first_failing_rank   the lowest rank with an error
    sum_scatter  reduce-scatter         max_all              elementwise maximum
    gather_all   all-gather             gather_to_root       rank 0 gets every rank's array
    exchange     all-to-all             gather_bytes_to_root rank 0 gets every rank's bytes
                                        barrier, split, duplicate

Sums are taken in rank order; a reduction's result is computed into a new array, and written
once every rank has read (hub.py), and the control messages copy what they gather: allocations
per collective that MPI's transport does not make.

"Virtual" names a plan's buffers that hold nothing (zerompi/plan/virtual.py); these ranks are
real, in one process.
"""
import copy

import numpy as np

from ..comm import Communicator, ReductionStaging
from ..cpu import CPU
from ..ledger import BOOKKEEPING, CONTROL, CommLedger
from ..nodes import number_nodes, sends_across_nodes
from .guards import InProcessGuards


class InProcessTransport:
    """The training collectives between the threads of one Hub, on host memory."""

    def __init__(self, hub, rank):
        self.hub, self.rank = hub, rank

    def sum_all(self, buf):
        """buf (n,) <- the sum over ranks of buf, in rank order."""
        slots = self.hub.meet(self.rank, buf, "allreduce")
        total = _sum(slots)
        self.hub.release(self.rank)
        buf[...] = total

    def sum_scatter(self, send, recv):
        """recv (n/N,) <- the sum over ranks of this rank's block of send; recv None: into send[:n/N]."""
        n = send.size // self.hub.size
        slots = self.hub.meet(self.rank, send, "reduce_scatter")
        total = _sum([s[self.rank * n:(self.rank + 1) * n] for s in slots])
        self.hub.release(self.rank)
        (send[:n] if recv is None else recv)[...] = total

    def gather_all(self, full, shard):
        """full (n,) <- every rank's block in rank order (this rank's from shard, or in place)."""
        n = full.size // self.hub.size
        mine = full[self.rank * n:(self.rank + 1) * n] if shard is None else shard
        slots = self.hub.meet(self.rank, mine, "allgather")
        for r, block in enumerate(slots):            # only this rank's full is written; others read mine
            if r != self.rank or shard is not None:
                full[r * n:(r + 1) * n] = block
        self.hub.release(self.rank)

    def exchange(self, send, recv):
        """recv (n,) <- block r: rank r's block of its send for this rank."""
        n = recv.size // self.hub.size
        slots = self.hub.meet(self.rank, send, "alltoall")
        for r, other in enumerate(slots):
            recv[r * n:(r + 1) * n] = other[self.rank * n:(self.rank + 1) * n]
        self.hub.release(self.rank)

    def reserve_host_staging(self, memory, max_bytes):
        """Host memory needs no staging."""

    def describe(self):
        return f"{self.hub.size} ranks in one process (threads, no MPI)"


def _sum(arrays):
    """arrays[0] + arrays[1] + ... in that order, as a new array."""
    total = arrays[0].copy()
    for other in arrays[1:]:
        total += other
    return total


class InProcessCommunicator(Communicator):
    def __init__(self, hub, rank, node_of_rank=None, device=None):
        """Rank `rank` of the hub's ranks, rank r on node node_of_rank[r] (all on one by default)."""
        self.mpi = None
        self.hub, self.rank, self.size = hub, rank, hub.size
        self.node_of_rank = tuple(node_of_rank) if node_of_rank is not None else (0,) * hub.size
        self.across_nodes = sends_across_nodes(self.node_of_rank, rank)
        self.ledger = CommLedger()
        self.device = device if device is not None else CPU()
        self.staging = ReductionStaging()
        self.guards = InProcessGuards(hub, rank)      # --check-collectives (guards.py)
        self.transport = InProcessTransport(hub, rank)

    # ---- control messages (zerompi/control.py's, between threads; guarded alike)
    def first_failing_rank(self, error):
        flag = np.array([self.rank if error is not None else self.size], dtype=np.int64)
        self.guards.begin("allreduce_min", CONTROL, flag)
        slots = self.hub.meet(self.rank, flag, "first_failing_rank")
        lowest = min(int(s[0]) for s in slots)
        self.hub.release(self.rank)
        self.guards.end()
        return lowest if lowest < self.size else None

    def max_all(self, values):
        self.guards.begin("allreduce_max", CONTROL, values)
        slots = self.hub.meet(self.rank, values, "max_all")
        largest = np.maximum.reduce([np.asarray(s) for s in slots])
        self.hub.release(self.rank)
        self.guards.end()
        values[...] = largest

    def gather_to_root(self, send, recv):
        self.guards.begin("gather", BOOKKEEPING, send)
        slots = self.hub.meet(self.rank, send, "gather")
        if self.rank == 0:
            for r, s in enumerate(slots):
                recv[r] = s
        self.hub.release(self.rank)
        self.guards.end()

    def gather_bytes_to_root(self, data):
        self.guards.begin("gatherv", BOOKKEEPING, None)
        slots = self.hub.meet(self.rank, bytes(data), "gather_bytes")
        received = list(slots) if self.rank == 0 else None
        self.hub.release(self.rank)
        self.guards.end()
        return received

    def barrier(self):
        self.hub.meet(self.rank, None, "barrier")
        self.hub.release(self.rank)

    def ranks_on_this_node(self):
        """All of them: the threads share this machine's memory and cores, whatever nodes they emulate."""
        return self.size

    # ---- communicators on some of the ranks, or on the same ranks
    def split(self, color_of):
        """The ranks with this rank's color, in rank order (Communicator.split's grouping), on a
        hub of their own, recording into this one's ledger. Collective."""
        members = [r for r in range(self.size) if color_of(r) == color_of(self.rank)]
        sub = self._made(members, color_of(self.rank))
        sub.node_of_rank = number_nodes([self.node_of_rank[r] for r in members])
        sub.across_nodes = sends_across_nodes(sub.node_of_rank, sub.rank)
        return sub

    def duplicate(self):
        """The same ranks on a hub of their own (the communication thread's, --overlap), sharing
        this one's ledger and staging (Communicator.duplicate)."""
        twin = self._made(range(self.size), "duplicate")
        twin.staging = self.staging
        return twin

    def _made(self, members, color):
        hub = self.hub.child(color, list(members), self.rank)
        sub = copy.copy(self)
        sub.hub, sub.rank, sub.size = hub, list(members).index(self.rank), hub.size
        sub.transport = InProcessTransport(hub, sub.rank)
        sub.guards = self.guards.twin(hub, sub.rank, members)
        sub.staging = ReductionStaging()
        return sub

    @staticmethod
    def thread_level_error():
        """Threads are what these ranks are."""
        return None
