"""ZeRO++'s block quantizer (zerompi/quantize/blocks.py) against its formula, written out a block at a
time in tests/proofs/reference.py, and its properties: half a step of error per element, blocks
beating one scale per tensor on data with outliers, and each contribution quantized once (an
all-to-all) beating a ring that re-quantizes its partial sums, more so the more ranks
(tools/quantization_error.py's tables)."""
import os
import sys

import ml_dtypes
import numpy as np
import pytest

from reference import block_round_trip
from zerompi.quantize import FLT_MIN, Quantizer

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "tools"))
import quantization_error  # noqa: E402

DTYPES = {"float32": np.float32, "float64": np.float64, "fp16": np.float16, "bf16": ml_dtypes.bfloat16}


def quantized(quantizer, x):
    """(levels, scales, x^ in x's dtype) through the quantizer."""
    levels = np.full(quantizer.wire_numel(x.size), 99, quantizer.wire_dtype)
    scales = np.full(quantizer.blocks(x.size), np.nan, np.float32)
    scratch, out = np.full(quantizer.scratch_numel(x.size), np.nan, np.float32), np.empty_like(x)
    quantizer.quantize(x, levels, scales, scratch)
    quantizer.dequantize(levels, scales, out, scratch)
    return levels, scales, out


def values(n, dtype, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n) * np.exp(rng.uniform(-3, 3, n))        # blocks of very different scales
    x[:7] = 0                                                         # ...
    x[-3:] = [1e-30, -1e-30, 0][-n:]                                  # and tiny values in the last block
    return x.astype(dtype)


def unpacked(levels, n):
    """The n int4 levels of packed bytes, by the same formula read backwards."""
    q = np.empty(2 * levels.size, np.int64)
    q[0::2], q[1::2] = levels % 16, levels // 16
    return q[:n] - 8


def packed(levels):
    """int4's wire format as docs/quantization.md writes it: byte_i = (q_2i + 8) + 16 (q_2i+1 + 8),
    an odd count's last level paired with 0."""
    q = np.append(levels, [0] * (levels.size % 2)).astype(np.int64) + 8
    return (q[0::2] + 16 * q[1::2]).astype(np.uint8)


@pytest.mark.parametrize("dtype", DTYPES, ids=list(DTYPES))
@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("n, block", [(1000, 64), (1000, 1000), (1000, 4096), (130, 7), (7, 7), (1, 2048),
                                      (1000, 10 ** 12)])
def test_the_quantizer_is_its_formula_bit_for_bit(dtype, bits, n, block):
    x = values(n, DTYPES[dtype])
    levels, scales, out = quantized(Quantizer(bits, block), x)
    want, want_levels, want_scales = block_round_trip(x, bits, block)
    assert np.array_equal(scales, want_scales)
    assert np.abs(want_levels).max() <= 2 ** (bits - 1) - 1
    assert np.array_equal(levels, want_levels if bits == 8 else packed(want_levels))
    assert levels.dtype == (np.int8 if bits == 8 else np.uint8) and levels.size == -(-n // (8 // bits))
    assert np.array_equal(out, want.astype(x.dtype))                 # rounded to the receiver's dtype


@pytest.mark.parametrize("dtype", DTYPES, ids=list(DTYPES))
@pytest.mark.parametrize("bits", [8, 4])
def test_each_element_is_within_half_a_step_of_its_own_block(dtype, bits):
    quantizer, x = Quantizer(bits, 100), values(1000, DTYPES[dtype], seed=1)
    _, scales, _ = quantized(quantizer, x)
    x32 = x.astype(np.float32).astype(np.float64)                     # its own values, not its bits
    levels = unpacked(quantized(quantizer, x)[0], x.size) if bits == 4 else quantized(quantizer, x)[0]
    step = np.repeat(scales.astype(np.float64), quantizer.block)[:x.size]
    x_hat = (levels * step.astype(np.float32)).astype(np.float64)     # q s in float32
    assert np.all(np.abs(x32 - x_hat) <= step / 2 + np.abs(x_hat) * 2.0 ** -24)
    assert np.all(step >= FLT_MIN) and np.all(x_hat[:7] == 0)         # an all-zero start stays zero


def test_a_block_holds_only_its_own_shard_and_a_short_last_block():
    quantizer = Quantizer(8, 4)
    x = np.array([1, 2, 3, 4, 100, 0, 0, 0, 0, 5], np.float32)        # 10 elements: blocks 4, 4, 2
    levels, scales, out = quantized(quantizer, x)
    assert np.array_equal(scales, np.float32([4, 100, 5]) / np.float32(127))
    assert np.array_equal(out[5:9], np.zeros(4, np.float32)) and out[4] == np.float32(100)
    assert np.all(np.abs(out[:4] - x[:4]) <= scales[0] / 2)           # 100 coarsens its own block only


def test_blocks_beat_one_scale_per_tensor_on_weights_with_outliers():
    errors = quantization_error.weight_errors(quantization_error.weights_with_outliers())
    per_tensor, *blocks = errors.values()                             # then blocks of 4096, 2048, 64
    assert per_tensor > blocks[0] > blocks[1] > blocks[2]
    assert blocks[2] < per_tensor / 5


def test_quantizing_each_contribution_once_does_not_grow_with_n_where_a_requantizing_ring_does():
    errors = {n: quantization_error.reduction_errors(n) for n in (8, 32, 64)}
    ring, once = ([errors[n][i] for n in (8, 32, 64)] for i in (0, 1))
    assert ring[0] < ring[1] < ring[2]
    assert once[2] <= once[1] <= once[0] and all(o < r for o, r in zip(once, ring))


def test_a_block_larger_than_the_shard_needs_a_scratch_of_the_shard_only():
    assert Quantizer(8, 10 ** 12).scratch_numel(1000) == 1002
    assert Quantizer(8, 64).scratch_numel(1000) == 16 * 65 + 1
    quantizer, small = Quantizer(8, 64), values(100, np.float32)       # a smaller layer's shard in the same scratch
    levels, scales = np.empty(100, np.int8), np.empty(2, np.float32)
    scratch, out = np.full(quantizer.scratch_numel(1000), np.nan, np.float32), np.empty(100, np.float32)
    quantizer.quantize(small, levels, scales, scratch)
    quantizer.dequantize(levels, scales, out, scratch)
    assert np.array_equal(out, block_round_trip(small, 8, 64)[0])
