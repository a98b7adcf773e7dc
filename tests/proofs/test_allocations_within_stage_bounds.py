"""What a rank really allocates over whole training steps, measured, not taken from the ledger.

The ledger (zerompi/ledger.py) counts the buffers allocated through it; a buffer allocated beside
it (a full-size gradient copy in stage 2, a full parameter copy in stage 3) would pass every ledger
test. tracemalloc sees it: NumPy reports every array buffer it allocates and frees to tracemalloc
(in its own domain, `np.lib.tracemalloc_domain`), so the traced memory counts all of a rank's
arrays, the ledger's and any others, plus Python's objects.

For every stage, CPU float32 and bf16 and the stand-in GPU device (tests/support/device_stand_in.py,
whose "device memory" is host memory: its staging path runs, and tracemalloc counts it), on a model
whose parameters dwarf its activations (Ψ = 539,146: one float32 copy is 2.2 MB; the activations of
two rows per rank, 60 kB), training from a baseline taken before the engine is built:

1. at its peak over whole steps after warm-up, a rank holds at most what its stage may hold: the
   model state of its stage's formula at Ψ_pad (zerompi.memory: (P+G+K)Ψ ... (P+G+K)Ψ/N), plus its
   work buffers (each at most one layer, Adam's chunk, or in stage 0 a gradient bucket) and
   activations, plus SLACK = half of one float32 copy of Ψ (2Ψ bytes) for Python objects, NumPy's
   casting buffer and the batch being copied in (30-70 kB measured). One more full-size float32
   copy of the gradients or the parameters (4Ψ bytes), kept or made during a step, exceeds it at
   every N; so does stage 3 keeping all parameters or stage 2 a full gradient.
2. nothing is allocated in the hot loop: the NumPy arrays alive after each step are exactly the
   ledger's buffers (so steady-state steps leave nothing behind), and no step's traced memory rises
   more than TRANSIENT bytes above where the step started (64 kB, a sixteenth of a 512 x 512 layer:
   a layer-sized temporary exceeds it; NumPy's casting buffer and Python's objects stay below it).
3. with the optimizer state in a file (zerompi/offload/), the peak is the in-memory run's less the
   formula's optimizer state, plus the three tile buffers: nothing of m, v or the master stays in
   memory, and the I/O thread allocates nothing in the loop either.
"""
import tracemalloc

import numpy as np
import pytest

from device_stand_in import StandInGPU
from helpers import make_batches, make_engine, run_steps
from zerompi.adam import CHUNK
from zerompi.comm import Communicator
from zerompi.devices import communicator_on
from zerompi.layout import bucket_numel
from zerompi.memory import BytesPerParam, model_state_bytes
from zerompi.offload import FileTier, OffloadedAdamConfig
from zerompi.overlap import OverlapConfig
from zerompi.precision import precision_for

SIZES = [16, 512, 512, 512, 10]
ROWS = 2                           # per rank: a global batch of 2N rows
WARMUP, MEASURED = 1, 2
TRANSIENT = 64 * 1024              # bytes a step may allocate and free: a sixteenth of a layer
NUMPY = tracemalloc.DomainFilter(inclusive=True, domain=np.lib.tracemalloc_domain)
CASES = [("cpu", "float32"), ("cpu", "bf16"), ("stand-in gpu", "float32")]


def numpy_bytes():
    """Bytes of the NumPy array buffers alive now (tracemalloc's NumPy domain)."""
    snapshot = tracemalloc.take_snapshot().filter_traces([NUMPY])
    return sum(trace.size for trace in snapshot.traces)


def measure(stage, device, dtype, micro_batches=1, adam=None, quantizers=(None, None)):
    """Train WARMUP + MEASURED steps under tracemalloc; returns (engine, peak bytes over the
    measured steps above the baseline, NumPy bytes alive after each measured step, the bytes each
    measured step allocated and freed)."""
    precision = precision_for(dtype)
    comm = (Communicator() if device == "cpu"
            else communicator_on(StandInGPU(), mpi_reads_device_memory=False))
    rows = ROWS * comm.size * micro_batches
    batches = make_batches(SIZES, WARMUP + MEASURED, rows=rows)
    alive, transient = [0] * MEASURED, [0] * MEASURED
    tracemalloc.start()
    try:
        baseline = tracemalloc.get_traced_memory()[0]
        engine = make_engine(stage, SIZES, precision.storage, comm, global_batch=rows, micro_batches=micro_batches,
                             adam=adam, quantizer=quantizers[0], grads_quantizer=quantizers[1])
        engine.init_params(0)
        run_steps(engine, batches[:WARMUP], micro_batches)
        peak = 0
        for k in range(MEASURED):
            before = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            run_steps(engine, batches[WARMUP + k:WARMUP + k + 1], micro_batches)
            step_peak = tracemalloc.get_traced_memory()[1]
            transient[k] = step_peak - before
            peak = max(peak, step_peak - baseline)
            alive[k] = numpy_bytes()
    finally:
        tracemalloc.stop()
    return engine, peak, alive, transient


@pytest.mark.mpi
@pytest.mark.parametrize("device, dtype", CASES, ids=[f"{d}-{t}".replace(" ", "-") for d, t in CASES])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_a_rank_allocates_only_what_its_stage_may_hold(stage, device, dtype):
    engine, peak, alive, transient = measure(stage, device, dtype)
    layout, memory, n = engine.layout, engine.memory, engine.comm.size
    psi = layout.full_numel
    one_float32_copy = 4 * psi
    p = precision_for(dtype).bytes_per_param()
    formula = model_state_bytes(stage, psi, n, BytesPerParam(p.param, p.grad, p.optimizer))
    state = formula["params"] + formula["grads"] + formula["optimizer"]
    # the model is one where a full copy dwarfs everything else a rank may hold
    assert memory.bytes_by_kind["activations"] < one_float32_copy / 2
    # work buffers: each at most one layer, Adam's chunk, or (stage 0's staging) a gradient bucket,
    # in the widest dtype (float64) or as pinned bytes
    buckets = layout.gradient_buckets(precision_for(dtype).storage.itemsize, OverlapConfig().bucket_mb)
    bucket = max(bucket_numel(b) for b in buckets) if stage == 0 else 0
    largest = max(layout.max_layer_padded, CHUNK, bucket) * 8
    assert all(nbytes <= largest for kind, _, _, _, nbytes, _ in memory.buffers if kind == "work")
    allowed = state + memory.bytes_by_kind["work"] + memory.bytes_by_kind["activations"]
    slack = one_float32_copy // 2
    assert peak <= allowed + slack, (
        f"stage {stage} allocated {peak:,} B at its peak; its formula's model state {state:,} B, work and "
        f"activations {allowed - state:,} B, slack {slack:,} B: {peak - allowed:,} B more than it may hold")
    assert alive == [memory.total_bytes] * MEASURED, (
        f"NumPy arrays alive after each step: {alive} B; the ledger's buffers: {memory.total_bytes} B")
    assert max(transient) <= TRANSIENT, f"steps allocated {transient} B and freed them"
    assert 2 * layout.max_layer_padded > 8 * TRANSIENT      # even a 16-bit layer-sized temporary would show


@pytest.mark.mpi
@pytest.mark.parametrize("dtype", ["float32", "bf16"])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_accumulating_micro_batches_allocates_nothing_per_step(stage, dtype):
    """With --grad-accum 2 (later micro-batches add their gradients to the first's), a step still
    allocates nothing that stays, and nothing layer-sized in passing."""
    engine, _, alive, transient = measure(stage, "cpu", dtype, micro_batches=2)
    assert alive == [engine.memory.total_bytes] * MEASURED
    assert max(transient) <= TRANSIENT, f"steps allocated {transient} B and freed them"


@pytest.mark.mpi
@pytest.mark.parametrize("device, dtype", CASES, ids=[f"{d}-{t}".replace(" ", "-") for d, t in CASES])
@pytest.mark.parametrize("micro_batches, grad_bits", [(1, 8), (2, 8), (2, 4)])
def test_quantized_blocks_allocate_nothing_per_step(device, dtype, micro_batches, grad_bits):
    """Stage 3 with qwZ and qgZ (int8 or int4; zerompi/quantize/): the quantizer works in the work
    buffers it reserved, so a step still allocates nothing that stays, and nothing layer-sized in passing."""
    from zerompi.quantize import Quantizer
    engine, _, alive, transient = measure(3, device, dtype, micro_batches,
                                          quantizers=(Quantizer(8, 128), Quantizer(grad_bits, 128)))
    assert [name for _, name, *_ in engine.memory.buffers if name.startswith("quantize.")]
    assert alive == [engine.memory.total_bytes] * MEASURED
    assert max(transient) <= TRANSIENT, f"steps allocated {transient} B and freed them"


@pytest.mark.mpi
@pytest.mark.parametrize("dtype", ["float32", "bf16"])
@pytest.mark.parametrize("stage", [0, 1, 3])
def test_an_offloaded_rank_holds_its_formula_less_the_optimizer_state_plus_the_tiles(stage, dtype, tmp_path):
    engine, peak_in_memory, _, _ = measure(stage, "cpu", dtype)
    adam = OffloadedAdamConfig(tier=FileTier(str(tmp_path), engine.comm.rank), tile=4096)
    offloaded, peak, alive, transient = measure(stage, "cpu", dtype, adam=adam)
    p = precision_for(dtype).bytes_per_param()
    optimizer = model_state_bytes(stage, engine.layout.full_numel, engine.comm.size,
                                  BytesPerParam(p.param, p.grad, p.optimizer))["optimizer"]
    memory = offloaded.memory
    tiles = sum(nbytes for _, name, _, _, nbytes, _ in memory.buffers if name.startswith("offload.tile_buffer"))
    assert memory.bytes_by_kind["optimizer"] == 0 and memory.bytes_by_tier["file"] == optimizer
    assert peak <= peak_in_memory - optimizer + tiles + TRANSIENT, (
        f"offloaded: {peak:,} B at the peak; in memory {peak_in_memory:,} B, less the optimizer state "
        f"{optimizer:,} B, plus the tiles {tiles:,} B")
    assert alive == [memory.total_bytes] * MEASURED
    assert max(transient) <= TRANSIENT, f"steps allocated {transient} B and freed them"
    offloaded.stage.adam.close()
