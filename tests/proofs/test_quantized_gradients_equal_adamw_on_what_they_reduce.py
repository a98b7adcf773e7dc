"""qgZ (--quantize-grads int8 and int4, zerompi/quantize/reduce.py) computes what single-process AdamW computes
when its gradient is what qgZ reduces: each rank's contribution to each micro-batch through the block
quantizer once, the owner's float sum (tests/proofs/reference.py's reduced_through_blocks, written
from the formula). Run with N = 1, 2, 3, 4, 8 (on in-process ranks; under mpirun at N = 1, 2): stages 2 and 3, uneven shards and short
last blocks, gradient accumulation and clipping, with qwZ and hpZ beside it. Tolerances as
test_quantized_weights_equal_adamw_on_what_they_gather.py's (whose cases this file reuses). The
ledger counts the all-to-alls' levels and scales exactly."""
from functools import partial

import numpy as np
import pytest

from helpers import STEPS, consolidated, make_batches, micro_batches_for, reference, train_zero
from reference import reduced_through_blocks, through_blocks
from test_quantized_weights_equal_adamw_on_what_they_gather import BLOCK, N, QUANTIZER, check_dtype
from test_zero_equals_single_process_adamw import BF16, SIZES, assert_close_f64, size_id
from zerompi.hierarchy import FLAT, Grouping
from zerompi.ledger import ALLTOALL, GRADS
from zerompi.quantize import SCALES, Quantizer

INT4 = Quantizer(4, BLOCK)                   # packed two to a byte
QGZ = {8: QUANTIZER, 4: INT4}


def qgz_reference(sizes, dtype, batches, micro_batches=1, weights=False, bits=8, node_size=None, **kwargs):
    reduced = partial(reduced_through_blocks, num_ranks=N, micro_batches=micro_batches, bits=bits, block=BLOCK,
                      node_size=node_size)
    seen = partial(through_blocks, num_ranks=N, bits=8, block=BLOCK) if weights else None
    return reference(sizes, dtype, batches, reduced=reduced, seen=seen, **kwargs)


@pytest.mark.in_process
@pytest.mark.mpi
@pytest.mark.parametrize("bits", [8, 4], ids=["int8", "int4"])
@pytest.mark.parametrize("sizes", SIZES, ids=size_id)
@pytest.mark.parametrize("stage", [2, 3])
def test_float64_equals_adamw_on_the_reduced_blocks(stage, sizes, bits):
    batches = make_batches(sizes, STEPS)
    engine, results = train_zero(stage, sizes, np.float64, batches, grads_quantizer=QGZ[bits])
    want, norms = qgz_reference(sizes, np.float64, batches, bits=bits)
    assert_close_f64(consolidated(engine), want)
    assert np.allclose([r.grad_norm for r in results], norms, rtol=1e-12)
    exact, _ = reference(sizes, np.float64, batches)
    assert max(np.max(np.abs(w - e)) for layer, exact_layer in zip(want, exact)
               for w, e in zip(layer, exact_layer)) > 1e-6          # the quantization did change the training


def node_sizes():
    """Every L with 1 < L < N that divides N: the nodes qgZ's two hops can run over."""
    return [size for size in range(2, N) if N % size == 0]


@pytest.mark.in_process
@pytest.mark.mpi
@pytest.mark.parametrize("bits", [8, 4], ids=["int8", "int4"])
@pytest.mark.parametrize("stage", [2, 3])
def test_two_hops_across_nodes_equal_adamw_on_what_each_hop_reduces(stage, bits):
    """Nodes of L ranks (in blocks, as the launchers place them; here on one machine): each rank's
    contribution quantized once inside the node, each node's float sum quantized once between the
    nodes, as the reference's hops do; and a different answer from one hop's (the reference of one
    hop is farther from the run than float64's tolerance)."""
    sizes, m = SIZES[1], micro_batches_for(N)
    batches = make_batches(sizes, STEPS)
    if not node_sizes():
        pytest.skip(f"no node size between 1 and N = {N} divides it")
    for node_size in node_sizes():
        engine, results = train_zero(stage, sizes, np.float64, batches, micro_batches=m, max_grad_norm=0.5,
                                     grads_quantizer=QGZ[bits], grads_node_size=node_size)
        want, norms = qgz_reference(sizes, np.float64, batches, m, bits=bits, node_size=node_size, clip_norm=0.5)
        assert_close_f64(consolidated(engine), want)
        assert np.allclose([r.grad_norm for r in results], norms, rtol=1e-12)
        one_hop, _ = qgz_reference(sizes, np.float64, batches, m, bits=bits, clip_norm=0.5)
        assert max(np.max(np.abs(w - o)) for layer, other in zip(want, one_hop) for w, o in zip(layer, other)) > 1e-9
        hops = engine.stage.collectives
        assert (hops.node_comm.size, hops.cross_comm.size) == (node_size, N // node_size)


@pytest.mark.in_process
@pytest.mark.mpi
@pytest.mark.parametrize("stage, grouping, weights", [(2, FLAT, False), (3, FLAT, True), (3, Grouping(hpz_node_size=1), True)],
                         ids=["stage2", "stage3-qwz", "stage3-hpz-qwz"])
def test_accumulation_clipping_and_full_zeropp_reduce_what_the_reference_reduces(stage, grouping, weights):
    sizes, m = SIZES[0], micro_batches_for(N)
    batches = make_batches(sizes, STEPS)
    engine, results = train_zero(stage, sizes, np.float64, batches, micro_batches=m, max_grad_norm=0.5,
                                 grouping=grouping, quantizer=QUANTIZER if weights else None,
                                 grads_quantizer=QUANTIZER)
    want, norms = qgz_reference(sizes, np.float64, batches, m, weights, clip_norm=0.5)
    assert_close_f64(consolidated(engine), want)
    assert np.allclose([r.grad_norm for r in results], norms, rtol=1e-12)


@pytest.mark.in_process
@pytest.mark.mpi
@pytest.mark.parametrize("dtype, bits", [(np.float32, 8), (BF16, 8), (np.float16, 8), (np.float32, 4), (BF16, 4)],
                         ids=["float32", "bf16", "fp16", "float32-int4", "bf16-int4"])
def test_each_dtype_quantizes_its_own_gradients(dtype, bits):
    check_dtype(dtype, 2, partial(qgz_reference, bits=bits), grads_quantizer=QGZ[bits])


@pytest.mark.in_process
@pytest.mark.mpi
@pytest.mark.parametrize("bits", [8, 4], ids=["int8", "int4"])
@pytest.mark.parametrize("stage", [2, 3])
def test_the_ledger_counts_the_all_to_alls_levels_and_scales(stage, bits):
    """Per step of M micro-batches, per layer u and micro-batch: an all-to-all of the layer's levels,
    (N-1) w_u bytes and words (w_u = n_u with int8, a reduce-scatter's elements; ceil(n_u / 2) with
    int4's packed pairs), and one of its scales, 4 (N-1) k_u."""
    sizes, m = SIZES[0], micro_batches_for(N)
    engine, _ = train_zero(stage, sizes, np.float64, make_batches(sizes, 1), micro_batches=m,
                           grads_quantizer=QGZ[bits])
    entries, layers = engine.comm.ledger.entries, engine.layout.layers
    levels = m * sum((N - 1) * (u.shard_size if bits == 8 else -(-u.shard_size // 2)) for u in layers)
    scales = m * sum(4 * (N - 1) * QUANTIZER.blocks(u.shard_size) for u in layers)
    assert entries[(ALLTOALL, GRADS)][:3] == [m * len(layers), levels, levels]
    assert entries[(ALLTOALL, SCALES)][:3] == [m * len(layers), scales, scales / 4]
    assert not [key for key in entries if key[1] == GRADS and key[0] != ALLTOALL]     # no exact reduction


@pytest.mark.mpi
@pytest.mark.parametrize("cuda_aware, bits", [(False, 8), (True, 8), (True, 4)], ids=["staged", "cuda-aware", "int4"])
def test_the_gpu_stand_in_reduces_the_same_blocks_as_the_cpu(cuda_aware, bits):
    """The all-to-alls through the device transport (zerompi/devices/staging.py): staged through
    pinned host memory (send and receive side by side in it), or handed to MPI after a synchronize;
    bitwise the CPU's, with qwZ beside them."""
    from device_stand_in import StandInGPU
    from zerompi.devices import communicator_on
    sizes, batches = SIZES[0], make_batches(SIZES[0], 2)
    cpu, _ = train_zero(3, sizes, np.float32, batches, quantizer=QUANTIZER, grads_quantizer=QGZ[bits])
    device = StandInGPU()
    comm = communicator_on(device, mpi_reads_device_memory=cuda_aware)
    gpu, _ = train_zero(3, sizes, np.float32, batches, comm=comm, quantizer=QUANTIZER, grads_quantizer=QGZ[bits])
    for (w, b), (w_cpu, b_cpu) in zip(consolidated(gpu), consolidated(cpu)):
        assert np.array_equal(w, w_cpu) and np.array_equal(b, b_cpu)
    alltoalls = gpu.comm.ledger.entries[(ALLTOALL, GRADS)][0] + gpu.comm.ledger.entries[(ALLTOALL, SCALES)][0]
    assert alltoalls == 2 * 2 * len(gpu.layout.layers)                # 2 steps, levels and scales
    assert (device.synchronized if cuda_aware else min(device.to_host, device.from_host)) > alltoalls


@pytest.mark.parametrize("node_of_rank, node_size", [((0, 0, 1, 1), 2), ((0, 0, 0, 1, 1, 1), 3), ((0, 1, 2, 3), None),
                                                     ((0, 1, 0, 1), None), ((0, 0, 0, 1), None)])
def test_the_all_to_alls_inter_node_share_is_the_formulas_on_every_rank(node_of_rank, node_size):
    """A plan on ranks placed on several nodes (no MPI): on nodes of L > 1 ranks in blocks, two hops
    (M (N/L) (L-1) blocks of Psi_pad / N inside the node, M (N/L - 1) between nodes); on nodes of one
    rank, or not in blocks, one all-to-all (M blocks to each other rank, inter-node to the ranks on
    other nodes); the ledger splits them so, and so does the report's formula
    (zerompi/quantize/'s alltoall_elements)."""
    from zerompi.plan import RunShape, plan_run
    from zerompi.precision import precision_for
    from zerompi.quantize import alltoall_elements
    sizes, n = SIZES[0], len(node_of_rank)
    for rank in range(n):
        plan = plan_run(RunShape(tuple(sizes), 2, precision_for("float32"), 4, n, 2, node_of_rank=node_of_rank,
                                 grads_quantizer=QUANTIZER), rank)
        psi_pad = sum(u.padded for u in plan_layers(sizes, n))
        intra, inter = alltoall_elements(psi_pad / n, 2, list(node_of_rank), node_size)[rank]
        assert any(name == "quantize.node_sum" for _, name, *_ in plan.buffers) == bool(node_size)   # the hops' sums
        calls, ring_bytes, elements, _ = plan.ledger.totals({GRADS})
        inter_bytes, inter_elements = plan.ledger.inter_node({GRADS})
        assert elements == pytest.approx(intra + inter) and inter_elements == pytest.approx(inter)
        assert inter > 0 and inter_bytes == pytest.approx(inter)            # one byte per element


def plan_layers(sizes, n):
    from zerompi.layout import Layout
    return Layout(sizes, n).layers
