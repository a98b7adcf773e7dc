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
"""
from ..ledger import PARAMS

SCALES = "scales"          # the ledger's purpose for the scales that travel beside quantized values


def scales_ring_bytes(layout, quantizer):
    """The scales' ring bytes per rank of one quantized call on every layer: sum_u 4 (N-1) k_u
    (an all-gather's, and an all-to-all's: each moves (N-1)/N of N k_u scales)."""
    N = layout.num_ranks
    return sum(4 * (N - 1) * quantizer.blocks(layer.shard_size) for layer in layout.layers)


class QuantizedLayerGather:
    """Stage 3's gather (zerompi/collectives.py's LayerGather) through int8 blocks, in the
    collectives' work buffers (collectives.py)."""

    def __init__(self, collectives, buffers, shard_of):
        self.collectives, self.buffers, self.shard_of = collectives, buffers, shard_of

    def gather(self, layer, upcoming):
        """full (padded,) <- every rank's shard of the layer, through int8 blocks. `upcoming` is for
        a prefetching gather; this one gathers only what is asked."""
        c, quantizer = self.collectives, self.collectives.weights
        N, n, k = c.size, layer.shard_size, quantizer.blocks(layer.shard_size)
        levels, scales, shard = c.levels_out[:n], c.scales_out[:k], self.shard_of(layer)
        quantizer.quantize(shard, levels, scales, c.scratch)
        all_levels, all_scales = c.levels_in[:N * n], c.scales_in[:N * k]
        c.allgather(levels, all_levels, PARAMS).wait()
        c.allgather(scales, all_scales, SCALES).wait()
        full = self.buffers[0][:layer.padded]
        for r in range(N):
            quantizer.dequantize(all_levels[r * n:(r + 1) * n], all_scales[r * k:(r + 1) * k],
                                 full[r * n:(r + 1) * n], c.scratch)
        if c.error is not None:                      # --quant-error: the exact gather beside it (error.py)
            c.error.weights(shard, full)
        return full

    def drop(self):
        """Forget anything gathered ahead (nothing is, here)."""
