"""Offload changes where the optimizer state lives, not what it computes: with the state in host
memory or in a file (zerompi/offload/), every stage, N (uneven sizes), dtype, accumulation,
clipping and fp16 overflow case ends with the same weights, Adam state and step results as the run
without offload, bit for bit; and the file tier reads and writes each tile once per applied step.

Tiles of 300 elements (TILE_ELEMENTS) are smaller than a layer, so they straddle layers, chunks
and shards; a tile of the whole state is the other end.
"""
import ml_dtypes
import numpy as np
import pytest
from mpi4py import MPI

from device_stand_in import StandInGPU
from helpers import WEIGHT_DECAY, consolidated, make_batches, make_engine, train_zero
from zerompi.adam import AdamConfig
from zerompi.comm import Communicator
from zerompi.devices import communicator_on
from zerompi.offload import FileTier, HostTier, OffloadedAdamConfig, OffloadedAdamW

SIZES = [12, 37, 53, 19, 7]      # 4 layers of 481, 2014, 1026 and 140 elements: padding at every N > 1
GLOBAL_BATCH = 48
TILE_ELEMENTS = 300
DTYPES = {"float32": np.float32, "float64": np.float64, "bf16": ml_dtypes.bfloat16, "fp16": np.float16}


def tiers(folder):
    return {"host": HostTier(), "file": FileTier(str(folder), MPI.COMM_WORLD.Get_rank())}


def train(stage, dtype, adam, micro_batches=1, loss_scale=1.0):
    comm = Communicator()
    batches = make_batches(SIZES, 4, rows=GLOBAL_BATCH)
    engine, results = train_zero(stage, SIZES, dtype, batches, comm, micro_batches=micro_batches,
                                 loss_scale=loss_scale, max_grad_norm=0.5, adam=adam)
    adam_state = engine.stage.adam
    engine.moved_by_steps = adam_state.moved() if isinstance(adam_state, OffloadedAdamW) else None
    state = [np.array(a[0:a.size]) for a in (adam_state.m, adam_state.v, adam_state.master) if a is not None]
    return engine, [(r.loss, r.grad_norm, r.correct, r.applied) for r in results], consolidated(engine), state


def offloaded(tier, tile=TILE_ELEMENTS, param_tier=None):
    return OffloadedAdamConfig(weight_decay=WEIGHT_DECAY, tier=tier, tile=tile, param_tier=param_tier)


def assert_same(run, expected):
    _, results, layers, state = run
    _, results_expected, layers_expected, state_expected = expected
    assert results == results_expected
    for (w, b), (w_expected, b_expected) in zip(layers, layers_expected):
        assert np.array_equal(w, w_expected) and np.array_equal(b, b_expected)
    assert len(state) == len(state_expected)
    for a, a_expected in zip(state, state_expected):
        assert np.array_equal(a, a_expected)


@pytest.mark.mpi
@pytest.mark.parametrize("micro_batches", [1, 2])
@pytest.mark.parametrize("dtype", DTYPES, ids=list(DTYPES))
@pytest.mark.parametrize("tier", ["host", "file"])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_offload_saves_the_same_weights(stage, tier, dtype, micro_batches, tmp_path):
    loss_scale = 2.0 ** 20 if dtype == "fp16" else 1.0     # fp16: steps overflow and are skipped
    expected = train(stage, DTYPES[dtype], AdamConfig(weight_decay=WEIGHT_DECAY), micro_batches, loss_scale)
    run = train(stage, DTYPES[dtype], offloaded(tiers(tmp_path)[tier]), micro_batches, loss_scale)
    assert_same(run, expected)
    if dtype == "fp16":
        assert not all(applied for *_, applied in expected[1])    # the overflow case did happen
    engine = run[0]
    moved = engine.stage.adam.moved()
    if tier == "file":
        applied = sum(applied for *_, applied in run[1])
        columns = 3 if engine.stage.precision.mixed else 2
        state_bytes = columns * engine.stage.adam.m.size * np.dtype(engine.stage.precision.compute).itemsize
        assert moved.file_read == moved.file_written == applied * state_bytes
    else:
        assert moved.file_read == moved.file_written == 0
    assert moved.to_host == moved.to_device == 0                  # a CPU run: nothing crosses to a device
    engine.stage.adam.close()


@pytest.mark.mpi
@pytest.mark.parametrize("micro_batches", [1, 2])
@pytest.mark.parametrize("dtype", DTYPES, ids=list(DTYPES))
@pytest.mark.parametrize("tiers_", [("file", "file"), ("host", "file"), ("file", "host")], ids="-".join)
def test_offloaded_parameters_save_the_same_weights(tiers_, dtype, micro_batches, tmp_path):
    """Stage 3 with its parameter shard in a tier too (zerompi/offload/params.py): the same weights,
    state and results bit for bit; a file of parameters is read at every access of a step that
    updates (2 per micro-batch and 1 by the update) and written once by the update."""
    optimizer_tier, param_tier = (tiers(tmp_path)[name] for name in tiers_)
    loss_scale = 2.0 ** 20 if dtype == "fp16" else 1.0
    expected = train(3, DTYPES[dtype], AdamConfig(weight_decay=WEIGHT_DECAY), micro_batches, loss_scale)
    run = train(3, DTYPES[dtype], offloaded(optimizer_tier, param_tier=param_tier), micro_batches, loss_scale)
    assert_same(run, expected)
    engine, results = run[0], run[1]
    stage = engine.stage
    assert stage.memory.bytes_by_kind["params"] == 0 or tiers_[1] == "host"   # a CPU's host is its memory
    moved, formula = engine.moved_by_steps, stage.adam.formula_per_step(micro_batches)
    applied = sum(r[3] for r in results)
    skipped = len(results) - applied                      # a skipped step gathers, and updates nothing
    itemsize = np.dtype(stage.precision.storage).itemsize if tiers_[1] == "file" else 0
    shard, first_layer = engine.layout.shard_numel * itemsize, engine.layout.layers[0].padded // N(engine) * itemsize
    assert moved.file_read == applied * formula.file_read + skipped * (2 * micro_batches * shard + first_layer)
    assert moved.file_written == applied * formula.file_written
    stage.adam.close()                                    # and its parameter shard


def N(engine):
    return engine.layout.num_ranks


@pytest.mark.parametrize("tile", [1, 64, 10 ** 6])
def test_any_tile_size_gives_the_same_weights(tile, tmp_path):
    expected = train(3, np.float32, AdamConfig(weight_decay=WEIGHT_DECAY))
    assert_same(train(3, np.float32, offloaded(FileTier(str(tmp_path), 0), tile)), expected)


def test_file_tier_holds_nothing_of_the_state_in_memory(tmp_path):
    """The ledger: master, m, v in the file tier; in memory only three tile buffers and the scratch."""
    engine = train(1, ml_dtypes.bfloat16, offloaded(FileTier(str(tmp_path), 0)))[0]
    memory = engine.memory
    numel = engine.layout.shard_numel
    assert memory.bytes_by_kind["optimizer"] == 0
    assert memory.bytes_by_tier["file"] == 3 * numel * 4
    tiles = [nbytes for kind, name, _, _, nbytes, tier in memory.buffers if name.startswith("offload.tile_buffer")]
    assert tiles == [3 * TILE_ELEMENTS * 4] * 3
    assert list(tmp_path.iterdir()) == []                        # unlinked while open: nothing to clean up


@pytest.mark.mpi
@pytest.mark.parametrize("dtype", ["float32", "bf16"])
@pytest.mark.parametrize("tier", ["host", "file"])
@pytest.mark.parametrize("stage", [1, 3])
def test_gpu_host_tier_runs_the_cpu_update(stage, tier, dtype, tmp_path):
    """On a GPU (the stand-in: device memory that the code must copy to and from), the offloaded
    update runs on the host in pinned buffers: it equals the CPU run fed the same gradients bit for
    bit, and counts each piece it moves: the gradient (and, without a master, the parameters)
    host-ward, the new parameters device-ward, once per applied step."""
    batches = make_batches(SIZES, 3, rows=GLOBAL_BATCH)
    expected, _ = train_zero(stage, SIZES, DTYPES[dtype], batches, Communicator(), max_grad_norm=0.5)
    comm = communicator_on(StandInGPU(), mpi_reads_device_memory=False)
    engine, results = train_zero(stage, SIZES, DTYPES[dtype], batches, comm, max_grad_norm=0.5,
                                 adam=offloaded(tiers(tmp_path)[tier]))
    for (w, b), (w_expected, b_expected) in zip(consolidated(engine), consolidated(expected)):
        assert np.array_equal(w, w_expected) and np.array_equal(b, b_expected)
    precision, numel = engine.stage.precision, engine.stage.adam.m.size
    piece = numel * np.dtype(precision.storage).itemsize          # one pass over the owned elements
    moved = engine.stage.adam.moved()
    assert all(r.applied for r in results)
    assert moved.to_device == len(results) * piece
    assert moved.to_host == len(results) * piece * (1 if precision.mixed else 2)
    host = {name: tier_ for _, name, _, _, _, tier_ in engine.memory.buffers}
    assert host["offload.host_grad"] == host["adam.scratch"] == "host"
    engine.stage.adam.close()


@pytest.mark.mpi
@pytest.mark.parametrize("dtype", ["float32", "bf16"])
@pytest.mark.parametrize("param_tier", ["host", "file"])
def test_gpu_offloaded_parameters_are_copied_device_ward_for_each_gather(param_tier, dtype, tmp_path):
    """On the GPU stand-in, stage 3's parameter shard on the host (or in a file): the same weights
    as the CPU run, the gradient host-ward once per step and each layer's shard device-ward before
    each of its two all-gathers, nothing of the parameters in device memory."""
    batches = make_batches(SIZES, 3, rows=GLOBAL_BATCH)
    expected, _ = train_zero(3, SIZES, DTYPES[dtype], batches, Communicator(), max_grad_norm=0.5)
    comm = communicator_on(StandInGPU(), mpi_reads_device_memory=False)
    adam = offloaded(HostTier(), param_tier=tiers(tmp_path)[param_tier])
    engine, results = train_zero(3, SIZES, DTYPES[dtype], batches, comm, max_grad_norm=0.5, adam=adam)
    moved = engine.stage.adam.moved()            # before consolidated(), which gathers once more
    for (w, b), (w_expected, b_expected) in zip(consolidated(engine), consolidated(expected)):
        assert np.array_equal(w, w_expected) and np.array_equal(b, b_expected)
    piece = engine.stage.adam.m.size * np.dtype(engine.stage.precision.storage).itemsize
    assert moved.to_host == len(results) * piece and moved.to_device == len(results) * 2 * piece
    assert engine.memory.bytes_by_kind["params"] == 0
    engine.stage.adam.close()                             # and its parameter shard


class OnDevice:
    """What CuPy hands over: an array NumPy may not read without .get() (zerompi.device.to_numpy)."""

    def __init__(self, values):
        self.values = values

    def get(self):
        return self.values

    def __array__(self, *args, **kwargs):
        raise TypeError("Implicit conversion to a NumPy array is not allowed")


@pytest.mark.parametrize("tier", ["host", "file"])
def test_an_offloaded_column_takes_device_values_and_gives_host_arrays(tier, tmp_path):
    """Checkpoint loads and initial values write a GPU's arrays into the state (zerompi/stages/params.py,
    zerompi/checkpoint/load.py): a column of either tier takes them through the host."""
    engine = make_engine(1, SIZES, ml_dtypes.bfloat16, adam=offloaded(tiers(tmp_path)[tier]))
    master = engine.stage.adam.master
    master[5:8] = OnDevice(np.array([1.0, 2.0, 3.0], np.float32))
    assert isinstance(master[5:8], np.ndarray) and master[5:8].tolist() == [1.0, 2.0, 3.0]
    engine.stage.adam.close()
