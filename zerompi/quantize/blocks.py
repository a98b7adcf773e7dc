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
    divergence check then reports); a block costs 4 bytes, so below B = 4 / (P - 1) (P bytes an
    exact element) the blocks send more than the exact values would

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
the short last block padded with zeros) that the caller allocates once: nothing is allocated per
call.
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

    def blocks(self, n):
        """k = ceil(n / B): the scales of n elements (one shard of one layer)."""
        return -(-n // self.block)

    def scratch_numel(self, n):
        """The float32 scratch quantize and dequantize need for n elements (or fewer): k rows of
        min(B, n), plus k."""
        return self.blocks(n) * (min(self.block, n) + 1)

    def quantize(self, x, levels, scales, scratch):
        """x (n,) -> levels (n,) (an int8 array: q_i) and scales (k,) float32 (s of each block)."""
        n, q = x.size, self.largest_level
        tiles, low = self._tiles(scratch, n)         # (k, min(B, n)) and (k,)
        flat = tiles.reshape(-1)
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
        levels[...] = flat[:n]                       # integers in [-Q, Q]: exact in int8

    def dequantize(self, levels, scales, out, scratch):
        """levels (n,), scales (k,) -> out (n,) = q_i * s of its block, rounded to out's dtype."""
        n = levels.size
        tiles, _ = self._tiles(scratch, n)
        flat = tiles.reshape(-1)
        flat[:n] = levels
        np.multiply(tiles, scales[:, None], out=tiles)
        out[...] = flat[:n]

    def _tiles(self, scratch, n):
        k, width = self.blocks(n), min(self.block, n)
        return scratch[:k * width].reshape(k, width), scratch[k * width:k * (width + 1)]
