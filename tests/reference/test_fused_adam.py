"""--fused-adam's loop (zerompi/fused/) computes bit for bit what zerompi/adam.py's adamw_chunked
computes: every dtype (float32, float64, and bf16 / fp16 with their fp32 master), sizes below,
at and across the 65,536-element chunk, a state slice that does not start at 0, weight decay on
and off, gradient multipliers 1 and not 1 (unscaling, clipping), gradients over twelve orders of
magnitude with exact zeros. It holds only the work buffer it uses (a 16-bit gradient's widened
chunk) and allocates no array per update. On N ranks (mpirun, and in-process ranks whose loops
run at once, the interpreter lock released), every stage trains the same weights with it as
without, bit for bit, in float32 and bf16 with accumulation and clipping."""
import tracemalloc

import numpy as np
import pytest

from helpers import WEIGHT_DECAY, consolidated, make_batches, train_zero
from zerompi.adam import CHUNK, AdamConfig, AdamW
from zerompi.fused import FusedAdamKernel, adamw_loop, compiled_loop
from zerompi.ledger import MemoryLedger
from zerompi.precision import precision_for

DTYPES = ["float32", "float64", "bf16", "fp16"]
SIZES = [1, 5, CHUNK, CHUNK + 3, 3 * CHUNK - 1]
OFFSET = 7                                   # the updated elements are state[OFFSET:OFFSET + n]
NUMPY = tracemalloc.DomainFilter(inclusive=True, domain=np.lib.tracemalloc_domain)


def gradient(rng, n, dtype):
    g = rng.standard_normal(n) * 10.0 ** rng.integers(-8, 4, n)
    g[5::11] = 0.0
    return g.astype(dtype)


def train(kernel, dtype, n, weight_decay, multipliers=(1.0, 0.37, 1.0)):
    """(param, master, m, v) after len(multipliers) updates of the same start and gradients."""
    precision = precision_for(dtype)
    adam = AdamW(n + OFFSET, precision, AdamConfig(weight_decay=weight_decay, kernel=kernel), MemoryLedger())
    rng = np.random.default_rng(n)
    param = rng.standard_normal(n).astype(precision.storage)
    if adam.master is not None:
        adam.master[OFFSET:] = param
    for t, multiplier in enumerate(multipliers):
        adam.begin_step()
        adam.update(param, gradient(rng, n, precision.storage), slice(OFFSET, OFFSET + n), 1e-3 * (t + 1), multiplier)
    return param, adam.master, adam.m, adam.v


@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_the_fused_loop_equals_the_numpy_update_bit_for_bit(dtype, n, weight_decay):
    start = np.random.default_rng(n).standard_normal(n).astype(precision_for(dtype).storage)
    numpy_result, fused_result = train(None, dtype, n, weight_decay), train(FusedAdamKernel(), dtype, n, weight_decay)
    assert not np.array_equal(numpy_result[0], start)                 # it did update
    for name, a, b in zip(("param", "master", "m", "v"), numpy_result, fused_result):
        assert (a is None) == (b is None), name
        assert a is None or (a.dtype == b.dtype and a.tobytes() == b.tobytes()), name


def test_the_compiled_loop_is_the_python_loop():
    """What Numba compiles is adamw_loop as written: the plain Python function gives the same bits."""
    rng = np.random.default_rng(3)
    for dtype in (np.float32, np.float64):
        arrays = [rng.standard_normal(257).astype(dtype) for _ in range(4)]
        arrays[3] = np.abs(arrays[3])                                    # v >= 0
        constants = [dtype(c) for c in (0.5, 0.999, 0.9, 0.1, 0.999, 0.001, 1e-8, 1e-3)]
        plain, compiled = [a.copy() for a in arrays], [a.copy() for a in arrays]
        adamw_loop(*plain, *constants)
        compiled_loop()(*compiled, *constants)
        assert not np.array_equal(plain[0], arrays[0])
        assert all(a.tobytes() == b.tobytes() for a, b in zip(plain, compiled))


@pytest.mark.parametrize("dtype", DTYPES)
def test_it_holds_only_the_widened_gradient_chunk_of_16_bit_runs(dtype):
    precision = precision_for(dtype)
    numpy_ledger, fused_ledger = MemoryLedger(), MemoryLedger()
    AdamW(3 * CHUNK, precision, AdamConfig(), numpy_ledger)
    AdamW(3 * CHUNK, precision, AdamConfig(kernel=FusedAdamKernel()), fused_ledger)
    work = [(name, shape, dtype) for kind, name, shape, dtype, _, _ in fused_ledger.buffers if kind == "work"]
    assert work == ([("adam.grad_scratch", (CHUNK,), precision.compute)] if precision.mixed else [])
    state = [b for b in numpy_ledger.buffers if b[0] == "optimizer"]
    assert state == [b for b in fused_ledger.buffers if b[0] == "optimizer"]


@pytest.mark.parametrize("dtype", ["float32", "bf16"])
def test_an_update_allocates_no_array(dtype):
    precision = precision_for(dtype)
    n = 2 * CHUNK + 5
    adam = AdamW(n, precision, AdamConfig(weight_decay=0.01, kernel=FusedAdamKernel()), MemoryLedger())
    param, grad = np.ones(n, precision.storage), np.full(n, 1e-3, precision.storage)
    adam.begin_step()
    adam.update(param, grad, slice(0, n), 1e-3, 0.5)                  # compiles
    tracemalloc.start()
    try:
        before = sum(t.size for t in tracemalloc.take_snapshot().filter_traces([NUMPY]).traces)
        tracemalloc.reset_peak()
        adam.begin_step()
        adam.update(param, grad, slice(0, n), 1e-3, 0.5)
        after = sum(t.size for t in tracemalloc.take_snapshot().filter_traces([NUMPY]).traces)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert after == before
    assert peak < 16 * 1024, f"an update allocated {peak} B in passing"


@pytest.mark.in_process
@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_every_stage_trains_the_same_weights_with_it(stage, dtype):
    sizes, micro_batches = [12, 37, 53, 7], 2
    batches = make_batches(sizes, 4, rows=24 * micro_batches)
    trained = []
    for kernel in (None, FusedAdamKernel()):
        engine, results = train_zero(stage, sizes, dtype, batches, micro_batches=micro_batches, max_grad_norm=0.05,
                                     adam=AdamConfig(weight_decay=WEIGHT_DECAY, kernel=kernel))
        assert all(r.applied for r in results) and any(r.grad_norm > 0.05 for r in results)   # clipped
        trained.append(consolidated(engine))
    assert all(a.tobytes() == b.tobytes() for want, got in zip(*trained) for a, b in zip(want, got))
