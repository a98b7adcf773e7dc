"""QuantizedCollectives: the Collectives (zerompi/collectives.py) whose stage-3 parameter gather
(qwZ, gather.py) and stage 2-3 gradient reduce-scatter (qgZ, reduce.py) go through the block
quantizer (blocks.py); every other call, and the exact gathers of weights files and checkpoints,
stay as they are. The stages call the same methods as ever: their files do not change.

Work buffers, reserved once for the largest layer (n its shard, k = ceil(n / B) its blocks) and
shared by both, which never run at once (no --overlap here):

    levels_out, levels_in   (N n,) int8    what this rank sends, what it receives (int4's packed
                                           pairs in the first N ceil(n / 2) bytes, as uint8)
    scales_out, scales_in   (N k,) float32
    scratch                 the quantizer's (blocks.py)
    total, part             (n,) compute dtype: qgZ's sum of the dequantized contributions
    node_sum                (N/L n,) compute dtype: with two hops, the node's sums (reduce.py)
    error_*                 with --quant-error, the exact calls' buffers (error.py)

qgZ's two hops (node_size L, 1 < L < N) run on two more communicators, split once here
(zerompi/hierarchy/'s node_groups): the L ranks of this rank's node (rank // L) and the N / L
ranks of its local index on every node (rank % L), both recording into the world's ledger.
"""
from ..collectives import Collectives
from ..hierarchy import node_groups
from ..ledger import GRADS
from .error import QuantizationError
from .gather import QuantizedLayerGather
from .reduce import quantized_reduce_scatter


class QuantizedCollectives(Collectives):
    def __init__(self, comm, weights=None, grads=None, node_size=None, error=False):
        """weights, grads: the Quantizer of qwZ and of qgZ, or None (exact); node_size: L ranks per
        node in blocks, for qgZ's two hops (None: one all-to-all over every rank); error: measure
        each step's error beside the exact calls (--quant-error, error.py). Collective."""
        super().__init__(comm)
        self.weights, self.grads = weights, grads
        self.error = QuantizationError(comm) if error else None
        self.node_comm = self.cross_comm = None
        if grads is not None and node_size and 1 < node_size < comm.size:
            self.node_comm, self.cross_comm = node_groups(comm, node_size)      # zerompi/hierarchy/'s

    @property
    def node_size(self):
        """L when qgZ reduces in two hops over nodes of L ranks (reduce.py), else None."""
        return self.node_comm.size if self.node_comm is not None else None

    def reserve(self, memory, layout, precision):
        N, n = self.size, layout.max_layer_padded // layout.num_ranks
        quantizer = self.weights or self.grads
        k = quantizer.blocks(n)

        def work(name, shape, dtype):
            return memory.alloc("work", f"quantize.{name}", shape, dtype)
        self.levels_out, self.levels_in = work("levels_out", (N * n,), "int8"), work("levels_in", (N * n,), "int8")
        self.scales_out, self.scales_in = work("scales_out", (N * k,), "float32"), work("scales_in", (N * k,), "float32")
        self.scratch = work("scratch", (quantizer.scratch_numel(n),), "float32")
        if self.grads is not None:
            self.grads_out, self.grads_in = (b.view(self.grads.wire_dtype) for b in (self.levels_out, self.levels_in))
            self.total, self.part = work("total", (n,), precision.compute), work("part", (n,), precision.compute)
        if self.node_comm is not None:
            self.node_sum = work("node_sum", (self.cross_comm.size * n,), precision.compute)
        if self.error is not None:
            self.error.reserve(memory, layout, precision, self.weights is not None)

    def layer_gather(self, buffers, shard_of):
        if self.weights is None:
            return super().layer_gather(buffers, shard_of)
        return QuantizedLayerGather(self, buffers, shard_of)

    def reduce_scatter(self, full, shard, purpose, accumulate=False):
        if self.grads is None or purpose != GRADS:
            return super().reduce_scatter(full, shard, purpose, accumulate)
        return self._start(quantized_reduce_scatter, self, full, shard, accumulate)
