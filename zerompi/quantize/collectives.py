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
"""
from ..collectives import Collectives
from ..ledger import GRADS
from .gather import QuantizedLayerGather
from .reduce import quantized_reduce_scatter


class QuantizedCollectives(Collectives):
    def __init__(self, comm, weights=None, grads=None):
        """weights, grads: the Quantizer of qwZ and of qgZ, or None (exact)."""
        super().__init__(comm)
        self.weights, self.grads = weights, grads

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

    def layer_gather(self, buffers, shard_of):
        if self.weights is None:
            return super().layer_gather(buffers, shard_of)
        return QuantizedLayerGather(self, buffers, shard_of)

    def reduce_scatter(self, full, shard, purpose, accumulate=False):
        if self.grads is None or purpose != GRADS:
            return super().reduce_scatter(full, shard, purpose, accumulate)
        return self._start(quantized_reduce_scatter, self, full, shard, accumulate)
