"""qwZ (--quantize-weights int8, zerompi/quantize/gather.py) computes what single-process AdamW
computes when its forward and backward see the weights as qwZ gathers them: each layer's shards
through the block quantizer (tests/proofs/reference.py's through_blocks, written from the
formula), while AdamW updates the exact weights. Run with N = 1, 2, 3, 4, 8 (on in-process ranks; under mpirun at N = 1, 2): flat
stage 3 and hpZ at every node size, uneven shards and short last blocks, gradient accumulation and
clipping. float64 within 1e-12 (the summation-order difference of
test_zero_equals_single_process_adamw.py: the quantizer rounds each value to float32 first, so an
ulp of float64 does not move a level); float32 within 2e-6 but where an ulp of float32 moved a
level by one step (a weight's gradient changes, and Adam's update is at most lr in size: never
more than 2 lr a step, on at most 1% of the elements); bf16 and fp16 within the mixed tolerance. The ledger counts the levels and the scales exactly."""
from functools import partial

import numpy as np
import pytest

from helpers import (LR, STEPS, assert_within_mixed_tolerance, consolidated, make_batches, micro_batches_for,
                     reference, train_zero, world_size)
from reference import through_blocks
from test_zero_equals_single_process_adamw import BF16, SIZES, assert_close_f64, size_id
from zerompi.hierarchy import FLAT, Grouping
from zerompi.ledger import ALLGATHER, PARAMS
from zerompi.quantize import SCALES, Quantizer

N = world_size()                            # read when the module is collected
BLOCK = 16                                  # small: many blocks per shard, and short last ones
QUANTIZER = Quantizer(8, BLOCK)
GROUPINGS = [FLAT] + [Grouping(hpz_node_size=g) for g in range(1, N + 1) if N % g == 0]
grouping_id = lambda g: f"hpz-L{g.hpz_node_size}" if g.hpz_node_size else "flat"    # noqa: E731


def quantized_reference(sizes, dtype, batches, **kwargs):
    return reference(sizes, dtype, batches, seen=partial(through_blocks, num_ranks=N, bits=8, block=BLOCK),
                     **kwargs)


@pytest.mark.in_process
@pytest.mark.mpi
@pytest.mark.parametrize("sizes", SIZES, ids=size_id)
@pytest.mark.parametrize("grouping", GROUPINGS, ids=grouping_id)
def test_float64_equals_adamw_on_the_gathered_weights(grouping, sizes):
    batches = make_batches(sizes, STEPS)
    engine, results = train_zero(3, sizes, np.float64, batches, grouping=grouping, quantizer=QUANTIZER)
    want, norms = quantized_reference(sizes, np.float64, batches)
    assert_close_f64(consolidated(engine), want)
    exact, _ = reference(sizes, np.float64, batches)
    assert max(np.max(np.abs(w - e)) for layer, exact_layer in zip(want, exact)
               for w, e in zip(layer, exact_layer)) > 1e-6          # the quantization did change the training


@pytest.mark.in_process
@pytest.mark.mpi
@pytest.mark.parametrize("grouping", GROUPINGS[:2], ids=grouping_id)
def test_accumulation_and_clipping_see_the_same_gathered_weights(grouping):
    sizes, m = SIZES[0], micro_batches_for(N)
    batches = make_batches(sizes, STEPS)
    engine, results = train_zero(3, sizes, np.float64, batches, micro_batches=m, max_grad_norm=0.5,
                                 grouping=grouping, quantizer=QUANTIZER)
    want, norms = quantized_reference(sizes, np.float64, batches, clip_norm=0.5)
    assert_close_f64(consolidated(engine), want)
    assert np.allclose([r.grad_norm for r in results], norms, rtol=1e-12)


@pytest.mark.in_process
@pytest.mark.mpi
@pytest.mark.parametrize("dtype", [np.float32, BF16, np.float16], ids=["float32", "bf16", "fp16"])
def test_each_dtype_quantizes_its_own_values(dtype):
    check_dtype(dtype, 3, quantized_reference, quantizer=QUANTIZER)


def check_dtype(dtype, stage, reference_of, **quantizers):
    """A run of this dtype (fp16 with a loss scale of 1024) within its tolerance of reference_of's; with
    qwZ, what its gather hands the layers is the formula's blocks of its exact weights, bit for bit,
    rounded to its dtype (a 16-bit tolerance alone would pass a run that did not quantize)."""
    sizes = SIZES[0]
    batches = make_batches(sizes, STEPS)
    engine, results = train_zero(stage, sizes, dtype, batches, loss_scale=1024.0 if dtype == np.float16 else 1.0,
                                 **quantizers)
    assert all(r.applied for r in results)
    want, _ = reference_of(sizes, dtype, batches)
    got = consolidated(engine)
    assert_within_quantized_tolerance(got, want, dtype)
    if "quantizer" in quantizers:
        for layer, exact in zip(engine.layout.layers, got):
            seen = through_blocks(list(exact), N, 8, BLOCK)
            for gathered, formula in zip(layer.views(engine.stage.param_gather.gather(layer, [])), seen):
                assert np.array_equal(gathered, formula.astype(dtype))


def assert_within_quantized_tolerance(got, want, dtype):
    """float32: within 2e-6 but where float32's ulps moved a level the float64 reference did not (that
    weight's updates: on at most 1% of the elements, never more than 2 lr a step); 16-bit: the mixed
    tolerance."""
    if dtype != np.float32:
        return assert_within_mixed_tolerance(got, want)
    diffs = np.concatenate([np.abs(g - w).ravel() for layer, want_layer in zip(got, want)
                            for g, w in zip(layer, want_layer)])
    assert np.mean(diffs > 2e-6) <= 0.01 and diffs.max() <= 2 * LR * STEPS


@pytest.mark.in_process
@pytest.mark.mpi
@pytest.mark.parametrize("grouping", GROUPINGS[:2], ids=grouping_id)
def test_the_ledger_counts_one_byte_per_level_and_four_per_scale(grouping):
    """Per step of M micro-batches, ring volume: levels (N-1) n_u bytes and scales 4 (N-1) k_u per
    quantized gather of layer u; 2 M of them flat, M with hpZ (backward gathers the node's copy)."""
    sizes, m = SIZES[0], micro_batches_for(N)
    batches = make_batches(sizes, 1)
    engine, _ = train_zero(3, sizes, np.float64, batches, micro_batches=m, grouping=grouping, quantizer=QUANTIZER)
    entries = engine.comm.ledger.entries
    quantized = m * (1 if grouping.hpz_node_size else 2)
    layers = engine.layout.layers
    levels = quantized * sum((N - 1) * u.shard_size for u in layers)
    scales = quantized * sum(4 * (N - 1) * QUANTIZER.blocks(u.shard_size) for u in layers)
    calls, ring_bytes, ring_elements = entries[(ALLGATHER, SCALES)][:3]
    assert (calls, ring_bytes, ring_elements) == (quantized * len(layers), scales, scales / 4)
    params = entries[(ALLGATHER, PARAMS)]
    if not grouping.hpz_node_size:
        assert params[:3] == [quantized * len(layers), levels, levels]     # int8: one byte per element
    else:                                                   # plus the node's exact float64 gathers
        L = grouping.hpz_node_size
        exact = m * sum(8 * (L - 1) * u.padded // L for u in layers)
        assert params[1] == pytest.approx(levels + exact)


@pytest.mark.mpi
@pytest.mark.parametrize("cuda_aware", [False, True], ids=["staged", "cuda-aware"])
def test_the_gpu_stand_in_gathers_the_same_blocks_as_the_cpu(cuda_aware):
    """The levels and scales travel through the device transport (zerompi/devices/staging.py):
    staged through pinned host memory, or handed to MPI after a synchronize; bitwise the CPU's."""
    from device_stand_in import StandInGPU
    from zerompi.devices import communicator_on
    sizes, batches = SIZES[0], make_batches(SIZES[0], 2)
    cpu, _ = train_zero(3, sizes, np.float32, batches, quantizer=QUANTIZER)
    device = StandInGPU()
    comm = communicator_on(device, mpi_reads_device_memory=cuda_aware)
    gpu, _ = train_zero(3, sizes, np.float32, batches, comm=comm, quantizer=QUANTIZER)
    for (w, b), (w_cpu, b_cpu) in zip(consolidated(gpu), consolidated(cpu)):
        assert np.array_equal(w, w_cpu) and np.array_equal(b, b_cpu)
    scales = gpu.comm.ledger.entries[(ALLGATHER, SCALES)][0]
    assert scales == 2 * 2 * len(gpu.layout.layers)                   # 2 steps, forward and backward
    if cuda_aware:
        assert device.synchronized > scales
    else:
        assert device.to_host > scales and device.from_host > scales  # through the host
