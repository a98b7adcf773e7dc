"""Ledgers: what each rank actually allocated and actually communicated.

Every number the training report prints comes from here, and everything here is recorded at the
moment a buffer is allocated or a collective is called, from the buffer itself (its .nbytes),
never from a formula. The report then prints these counts beside the formulas of zerompi.memory.

MemoryLedger: every buffer that the engine allocates for training (zerompi/engine.py: the stage's
parameters, gradients and optimizer state, the communicator's staging, the MLP's activations and
work buffers) is allocated through `alloc`, by kind:
    params, grads, optimizer   the model state that ZeRO partitions (compared with the formulas)
    work                       one-layer buffers (stage 2-3 layer gradient buffer, stage 3's
                               parameter gather, float32 staging for 16-bit reductions and compute; stage 0's
                               staging holds a gradient bucket), Adam's chunk scratch, --overlap's
                               second buffers, pinned host staging on a GPU, the GPU GEMMs' row of
                               ones and 1 x 1 sum of squares: each allocated only where its code
                               path runs; the step's sums (zerompi/step.py)
    activations                the forward/backward activation buffers of the local batch, the
                               loss's per-row work buffers and its (loss, correct) totals
It does not count the dataset, the batch buffers the training program fills from it each step
(zerompi/train/loop/batches.py), the buffers of checkpoints, weight files and the end-of-run report, or
the memory of Python, NumPy and MPI themselves: the OS-measured peak resident set size (getrusage),
reported beside it, covers the whole process. No array is allocated or freed inside the training
loop, so the live total is also the peak (tests/proofs/test_allocations_within_stage_bounds.py
measures both with tracemalloc).

CommLedger: every collective records its operation, its purpose (GRADS, PARAMS, METRICS, IO below),
the bytes of the buffer handed to MPI, the per-rank ring volume, and its wall time; then it tells
its `listeners` (--trace draws each collective as a span from them, zerompi/observe/trace.py).
Ring volume per rank for a buffer of n elements over N ranks (the standard ring algorithms):
    reduce-scatter  n (N-1)/N        all-gather  n (N-1)/N        all-reduce  2 n (N-1)/N
It counts what the ring algorithm moves for these calls; MPI may pick another algorithm on the wire.
An all-to-all (zerompi/quantize/'s qgZ) is not a ring: each rank sends a block of n/N to each other
rank, n (N-1)/N, the blocks to ranks on other nodes inter-node (a share of it, not all or nothing).

Intra-node and inter-node bytes, by the same model: the ring runs over the calling communicator's
ranks in rank order, and each rank sends its whole ring volume for the call to its successor,
rank+1 mod N. So a call's ring volume is this rank's inter-node volume exactly when its successor
is on another node (the communicator knows each rank's node, zerompi/nodes.py), and its intra-node
volume otherwise. A flat ring over N ranks placed in blocks on k > 1 nodes crosses node boundaries
k times: summed over the ranks, k x (one rank's ring volume) is inter-node, one rank's worth sent
out of each node per collective (zerompi.memory.ring_traffic). This counts the ring model,
not the wire: MPI may pick another algorithm (MPICH's is node-aware for some calls), and then
other bytes cross. Each record takes the node split of the communicator that made the call, so
communicators on different groups of ranks can share one ledger.
"""
import resource
import threading
from collections import defaultdict

from .cpu import CPU

MEMORY_KINDS = ("params", "grads", "optimizer", "work", "activations")
# where a buffer lives: the device's memory, or (zerompi/offload/) a GPU run's host memory or a file
TIERS = DEVICE, HOST, FILE = "device", "host", "file"

# what a collective is for: the ledger counts training traffic by purpose
GRADS = "grads"                  # gradient reductions
PARAMS = "params"                # parameter all-gathers
METRICS = "metrics"              # the step's sums (loss, correct, gradient norms), held-out accuracy
IO = "io"                        # stage 3 gathering parameters outside the step (weights files)
# purposes of messages that are guarded (zerompi/observe/guards.py) but not ledgered (zerompi/control.py)
CONTROL = "control"              # errors and verdicts every rank must agree on
BOOKKEEPING = "bookkeeping"      # the end-of-run report, checkpoint manifests

# the ledgered operations, and how many times the ring moves the buffer for each (an all-to-all is
# not a ring: each rank sends one block of its buffer to each other rank, (N-1)/N of it too)
ALLREDUCE, REDUCE_SCATTER, ALLGATHER, ALLTOALL = "allreduce", "reduce_scatter", "allgather", "alltoall"
RING_FACTOR = {REDUCE_SCATTER: 1, ALLGATHER: 1, ALLREDUCE: 2, ALLTOALL: 1}


class MemoryLedger:
    def __init__(self, device=None):
        self.device = device if device is not None else CPU()   # where alloc puts buffers
        self.bytes_by_kind = dict.fromkeys(MEMORY_KINDS, 0)   # in the device's memory
        self.bytes_by_tier = dict.fromkeys(TIERS, 0)
        self.buffers = []          # (kind, name, shape, dtype, nbytes, tier) of every allocation

    def alloc(self, kind, name, shape, dtype):
        """A zeroed buffer of the given shape on the device, recorded under kind."""
        return self.record(kind, name, self.device.zeros(shape, dtype))

    def record(self, kind, name, buffer, tier=DEVICE):
        """Record a buffer allocated elsewhere (pinned host staging; a tier's state); returns it.
        bytes_by_kind counts the device's memory, bytes_by_tier every tier."""
        if kind not in self.bytes_by_kind:
            raise ValueError(f"unknown memory kind {kind!r}")
        if tier == DEVICE:
            self.bytes_by_kind[kind] += buffer.nbytes
        self.bytes_by_tier[tier] += buffer.nbytes
        self.buffers.append((kind, name, buffer.shape, buffer.dtype.name, buffer.nbytes, tier))
        return buffer

    @property
    def total_bytes(self):
        return sum(self.bytes_by_kind.values())

    @staticmethod
    def peak_rss_bytes():
        """Peak resident set size of this process, as measured by the OS (Linux: KiB)."""
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class CommLedger:
    """Written by the main thread and, with --overlap, by the communication thread: a lock
    keeps each record whole and each reading consistent. Listeners run in the recording thread,
    outside the lock."""

    def __init__(self):
        # (op, purpose) -> [calls, ring bytes, ring elements, seconds, inter-node ring bytes,
        #                   inter-node ring elements]; intra-node = ring - inter-node
        self.entries = defaultdict(lambda: [0, 0.0, 0.0, 0.0, 0.0, 0.0])
        self.lock = threading.Lock()
        self.listeners = []      # listener(op, purpose, nbytes, start, end), called for every record

    def record(self, op, purpose, buffer, num_ranks, start, end, across_nodes):
        """Record one collective on `buffer` (the full-size side: n elements for all ranks) that
        ran from start to end (time.perf_counter() seconds); across_nodes: whether this rank's
        ring successor in the calling communicator is on another node (for an all-to-all, the
        share of its blocks that go to another node, zerompi/nodes.py)."""
        ring = RING_FACTOR[op] * (num_ranks - 1) / num_ranks
        with self.lock:
            entry = self.entries[(op, purpose)]
            entry[0] += 1
            entry[1] += ring * buffer.nbytes
            entry[2] += ring * buffer.size
            entry[3] += end - start
            if across_nodes:
                entry[4] += ring * buffer.nbytes * across_nodes
                entry[5] += ring * buffer.size * across_nodes
        for listener in self.listeners:
            listener(op, purpose, buffer.nbytes, start, end)

    def purposes(self):
        with self.lock:
            return {p for _, p in self.entries}

    def totals(self, purposes):
        """(calls, ring bytes, ring elements, seconds) summed over the given purposes."""
        return self._sums(purposes, range(4))

    def inter_node(self, purposes):
        """(inter-node ring bytes, inter-node ring elements) summed over the given purposes; the
        rest of totals' ring volume is intra-node."""
        return self._sums(purposes, (4, 5))

    def _sums(self, purposes, columns):
        with self.lock:
            rows = [list(e) for (op, p), e in self.entries.items() if p in purposes]
        return tuple(sum(e[i] for e in rows) for i in columns)
