"""The block quantizer of ZeRO++ (arXiv 2306.10209): symmetric, round to nearest, one float32
scale per block of B elements.

For one block x (at most B elements; values of any float dtype are first rounded to float32) and
b bits, Q = 2^(b-1) - 1 levels each side (127 for int8, 7 for int4):

    s    = max( max_i |x_i| / Q , FLT_MIN )      float32; FLT_MIN = 2^-126, the smallest normal
                                                 float32, keeps s > 0: an all-zero block is zeros
    q_i  = clip( rint(x_i / s), -Q, Q )          rint rounds half to even; q_i is an integer
    x^_i = q_i * s                               float32, then rounded to the receiver's dtype

    so |x_i - x^_i| <= s / 2: half a step of its own block (float32 rounding aside), for finite
    values inside float32's range: an inf or a NaN makes its whole block NaN (as the training's
    divergence check then reports; with int4 and an odd B, also its packed partner's value in the
    next block); a block costs 4 bytes, so below B = 4 / (P - 1) (P bytes an
    exact element) the blocks send more than the exact values would

On the wire int8 levels are one byte each; int4 levels are packed two to a byte, element 2i in the
low half and 2i+1 in the high half, each offset by 8 (an odd n's last byte pairs it with q = 0):

    byte_i = (q_2i + 8) + 16 (q_2i+1 + 8)        in [17, 255]: ceil(n / 2) bytes (uint8) for n levels

One scale per block, not per tensor, is what keeps an outlier from coarsening every other
element: a block's step is set by its own largest value only.

Blocks are laid inside one rank's shard of one layer (zerompi/layout.py), so that the owner of a
shard quantizes it alone and a receiver dequantizes it without its neighbours; no block straddles
a shard or a layer:

    layer u's padded buffer  | rank 0's shard (n = padded / N)  | rank 1's shard        | ...
    blocks of B              | b0      | b1      | b2      |b3| | b0      | b1      |b2| |
                                                           ^ a shard's last block is shorter
                                                             (n - (k-1) B elements, k = ceil(n / B))

`quantize` and `dequantize` work through a float32 scratch of k rows of min(B, n) (`scratch_numel`:
the short last block padded with zeros), one spare zero (int4's partner of an odd n's last level)
and k, that the caller allocates once: nothing is allocated per call.
"""
from dataclasses import dataclass

import numpy as np

FLT_MIN = np.float32(np.finfo(np.float32).tiny)     # 2^-126


@dataclass(frozen=True)
class Quantizer:
    bits: int = 8               # 8 (int8) or 4 (int4)
    block: int = 2048           # B: elements per scale (--quant-block)

    @property
    def largest_level(self):
        """Q: the largest level, 2^(bits-1) - 1 (127, 7)."""
        return 2 ** (self.bits - 1) - 1

    @property
    def wire_dtype(self):
        """The levels' dtype on the wire: int8, or uint8 for int4's packed pairs."""
        return "int8" if self.bits == 8 else "uint8"

    def wire_numel(self, n):
        """The words n levels take on the wire: n, or ceil(n / 2) packed int4 bytes."""
        return n if self.bits == 8 else -(-n // 2)

    def blocks(self, n):
        """k = ceil(n / B): the scales of n elements (one shard of one layer)."""
        return -(-n // self.block)

    def scratch_numel(self, n):
        """The float32 scratch quantize and dequantize need for n elements (or fewer): k rows of
        min(B, n), plus one, plus k."""
        return self.blocks(n) * (min(self.block, n) + 1) + 1

    def quantize(self, x, levels, scales, scratch):
        """x (n,) -> levels (wire_numel(n),) of wire_dtype (q_i; int4's packed pairs) and scales (k,)
        float32 (s of each block)."""
        n, q = x.size, self.largest_level
        tiles, flat, low = self._tiles(scratch, n)   # (k, min(B, n)), the tiles and a spare, (k,)
        flat[n:] = 0                                 # the short last block's rest: 0 changes no max
        flat[:n] = x                                 # rounded to float32
        tiles.max(axis=1, out=scales)
        tiles.min(axis=1, out=low)
        np.maximum(scales, np.negative(low, out=low), out=scales)     # max |x| of each block
        np.divide(scales, np.float32(q), out=scales)
        np.maximum(scales, FLT_MIN, out=scales)
        np.divide(tiles, scales[:, None], out=tiles)
        np.rint(tiles, out=tiles)
        np.clip(tiles, -q, q, out=tiles)
        if self.bits == 8:
            levels[...] = flat[:n]                   # integers in [-Q, Q]: exact in int8
            return
        low, high = flat[0:2 * levels.size:2], flat[1:2 * levels.size:2]
        np.multiply(high, 16, out=high)
        np.add(low, high, out=low)
        np.add(low, 8 + 16 * 8, out=low)             # (q_2i + 8) + 16 (q_2i+1 + 8)
        levels[...] = low

    def dequantize(self, levels, scales, out, scratch):
        """levels (wire_numel(n),), scales (k,) -> out (n,) = q_i * s of its block, rounded to
        out's dtype."""
        n = out.size
        tiles, flat, _ = self._tiles(scratch, n)
        if self.bits == 8:
            flat[:n] = levels
        else:
            low, high = flat[0:2 * levels.size:2], flat[1:2 * levels.size:2]
            low[...], high[...] = levels, levels
            np.floor_divide(high, 16, out=high)     # q_2i+1 + 8
            np.remainder(low, 16, out=low)          # q_2i + 8
            np.subtract(flat[:2 * levels.size], 8, out=flat[:2 * levels.size])
        np.multiply(tiles, scales[:, None], out=tiles)
        out[...] = flat[:n]

    def _tiles(self, scratch, n):
        """(k, min(B, n)) tiles; the same flat with one spare after it; k more."""
        k, width = self.blocks(n), min(self.block, n)
        return (scratch[:k * width].reshape(k, width), scratch[:k * width + 1],
                scratch[k * width + 1:k * (width + 1) + 1])
