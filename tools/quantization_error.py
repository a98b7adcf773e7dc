"""The errors of ZeRO++'s block quantizer (zerompi/quantize/blocks.py) on synthetic data, seeded:
the tables of docs/quantization.md. `python tools/quantization_error.py` (a few seconds, one process).

    weights   int8, one scale per tensor against blocks: N(0, 1) values of which 0.1% (at
              random) are outliers 20x larger, 2^20 of them; the relative L2 error
              ||x^ - x|| / ||x|| of quantize-then-dequantize
    gradients int4, blocks of 2048: N ranks' contributions g_r = c + e_r (c, e_r ~ N(0, 1): a
              shared signal and each rank's own noise), 2^16 elements each, summed two ways:
              ring     each hop quantizes the partial sum it passes on (p = Q(p) + g_r, N - 1
                       times): the error of every hop is carried and added to
              all-to-all  each contribution is quantized once (the owner's own too, as qgZ does),
                       the owner sums them in float32
              against the exact float64 sum: relative L2 error
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from zerompi.quantize import Quantizer  # noqa: E402

WEIGHTS, OUTLIERS, OUTLIER_SCALE = 2 ** 20, 0.001, 20.0
BLOCKS = (None, 4096, 2048, 64)                # None: one scale for the whole tensor
GRADIENTS, GRADIENT_BLOCK = 2 ** 16, 2048
RANKS = (2, 8, 32, 64)


def round_trip(quantizer, x):
    """Quantize-then-dequantize x (n,) -> float64 (n,)."""
    levels = np.empty(quantizer.wire_numel(x.size), quantizer.wire_dtype)
    scales = np.empty(quantizer.blocks(x.size), np.float32)
    scratch, out = np.empty(quantizer.scratch_numel(x.size), np.float32), np.empty(x.size)
    quantizer.quantize(x, levels, scales, scratch)
    quantizer.dequantize(levels, scales, out, scratch)
    return out


def relative_error(approx, exact):
    return float(np.linalg.norm(approx - exact) / np.linalg.norm(exact))


def weights_with_outliers(seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(WEIGHTS).astype(np.float32)
    x[rng.choice(WEIGHTS, int(WEIGHTS * OUTLIERS), replace=False)] *= OUTLIER_SCALE
    return x


def weight_errors(x):
    """{block (None: per tensor): relative L2 error of int8}."""
    return {block: relative_error(round_trip(Quantizer(8, block or x.size), x), x) for block in BLOCKS}


def contributions(num_ranks, seed=0):
    rng = np.random.default_rng(seed)
    shared = rng.standard_normal(GRADIENTS)
    return [(shared + rng.standard_normal(GRADIENTS)).astype(np.float32) for _ in range(num_ranks)]


def reduction_errors(num_ranks, bits=4):
    """(ring, all-to-all) relative L2 errors of summing num_ranks contributions through int`bits`."""
    quantizer, g = Quantizer(bits, GRADIENT_BLOCK), contributions(num_ranks)
    exact = np.sum(np.array(g, np.float64), axis=0)
    partial = g[0].astype(np.float64)
    for contribution in g[1:]:                       # the ring: each hop re-quantizes what it passes on
        partial = round_trip(quantizer, partial.astype(np.float32)) + contribution
    once = np.sum([round_trip(quantizer, contribution) for contribution in g], axis=0, dtype=np.float32)
    return relative_error(partial, exact), relative_error(once.astype(np.float64), exact)


def main():
    print(f"int8 weights, {WEIGHTS:,} values N(0, 1), {OUTLIERS:.1%} of them {OUTLIER_SCALE:g}x: relative L2 error")
    for block, error in weight_errors(weights_with_outliers()).items():
        print(f"  {'one scale per tensor' if block is None else f'blocks of {block}':>20}  {error:6.2%}")
    print(f"int4 gradients, blocks of {GRADIENT_BLOCK}, N contributions c + e_r of {GRADIENTS:,} values: "
          "relative L2 error of the sum")
    print(f"  {'N':>4}  {'re-quantizing ring':>18}  {'all-to-all (once)':>17}")
    for num_ranks in RANKS:
        ring, once = reduction_errors(num_ranks)
        print(f"  {num_ranks:>4}  {ring:18.3f}  {once:17.3f}")


if __name__ == "__main__":
    main()
