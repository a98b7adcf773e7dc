"""qwZ: stage 3's parameter all-gather in int8 blocks (ZeRO++, arXiv 2306.10209).

Each rank quantizes its shard of the layer (blocks.py: n = padded / N elements, k = ceil(n / B)
blocks), all-gathers the int8 levels and the float32 scales, and dequantizes every rank's piece
into the layer buffer the forward (or backward) computes with:

    rank r       shard_r (n, storage dtype) --quantize--> levels_r (n, int8)   scales_r (k, float32)
    all-gather   levels (N n, int8) <- every rank's levels_r      purpose PARAMS   N n (N-1)/N bytes
    all-gather   scales (N k)       <- every rank's scales_r      purpose SCALES   4 N k (N-1)/N bytes
    every rank   full[r n:(r+1) n] = levels_r * scales_r of its block            (padded, storage dtype)

The levels are one byte per parameter where the exact gather sends P (2 in mixed precision, 4 in
float32), plus 4 bytes per block for the scales. Only the wire is quantized: the parameter shard,
the fp32 master and Adam never see the rounding. Forward and backward see the same weights: the
backward's gather quantizes the same unchanged shard again, to the same values (the quantizer is
deterministic); with hpZ (zerompi/hierarchy/hpz.py) the node's secondary copy is written from the
forward's dequantized layer, and the backward gathers it exactly inside the node.

`WeightQuantizingCollectives` is the Collectives (zerompi/collectives.py) whose `layer_gather` is
this one; every other call, and the exact gathers of weights files and checkpoints (IO), stay as
they are. The stage files do not change.
"""
import numpy as np

from ..collectives import Collectives
from ..ledger import PARAMS

SCALES = "scales"          # the ledger's purpose for the scales that travel beside quantized values


def scales_ring_bytes(layout, quantizer):
    """The scales' ring bytes per rank of one quantized gather of every layer: sum_u 4 (N-1) k_u."""
    N = layout.num_ranks
    return sum(4 * (N - 1) * quantizer.blocks(layer.shard_size) for layer in layout.layers)


class WeightQuantizingCollectives(Collectives):
    def __init__(self, comm, quantizer):
        super().__init__(comm)
        self.quantizer = quantizer

    def layer_gather(self, buffers, shard_of, memory):
        return QuantizedLayerGather(self, buffers, shard_of, memory, self.quantizer)


class QuantizedLayerGather:
    """Stage 3's gather (zerompi/collectives.py's LayerGather) through int8 blocks."""

    def __init__(self, collectives, buffers, shard_of, memory, quantizer):
        self.collectives, self.buffers, self.shard_of, self.quantizer = collectives, buffers, shard_of, quantizer
        N = collectives.size
        n = buffers[0].size // N                       # the largest layer's shard
        k = quantizer.blocks(n)
        self.levels = memory.alloc("work", "qwz.levels", (n,), np.int8)              # this rank's
        self.scales = memory.alloc("work", "qwz.scales", (k,), np.float32)
        self.all_levels = memory.alloc("work", "qwz.all_levels", (N * n,), np.int8)  # everyone's
        self.all_scales = memory.alloc("work", "qwz.all_scales", (N * k,), np.float32)
        self.scratch = memory.alloc("work", "qwz.scratch", (quantizer.scratch_numel(n),), np.float32)

    def gather(self, layer, upcoming):
        """full (padded,) <- every rank's shard of the layer, through int8 blocks. `upcoming` is for
        a prefetching gather; this one gathers only what is asked."""
        N, n, k = self.collectives.size, layer.shard_size, self.quantizer.blocks(layer.shard_size)
        levels, scales = self.levels[:n], self.scales[:k]
        self.quantizer.quantize(self.shard_of(layer), levels, scales, self.scratch)
        all_levels, all_scales = self.all_levels[:N * n], self.all_scales[:N * k]
        self.collectives.allgather(levels, all_levels, PARAMS).wait()
        self.collectives.allgather(scales, all_scales, SCALES).wait()
        full = self.buffers[0][:layer.padded]
        for r in range(N):
            self.quantizer.dequantize(all_levels[r * n:(r + 1) * n], all_scales[r * k:(r + 1) * k],
                                      full[r * n:(r + 1) * n], self.scratch)
        return full

    def drop(self):
        """Forget anything gathered ahead (nothing is, here)."""
