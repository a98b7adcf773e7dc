"""The ledgers count what really happened, and it matches the formulas up to padding.

Communication: the CommLedger is checked against an independent count taken by a proxy around
the mpi4py communicator (every buffer MPI actually received), and both against the formulas
2 Psi (N-1)/N (stages 0-2) and 3 Psi (N-1)/N (stage 3): exactly at Psi_pad, within padding at Psi.
Memory: params / grads / optimizer bytes equal the formulas exactly at Psi_pad and exceed the
formulas at Psi by at most the padding; and the buffers that a stage must not have, it has not.
"""
import numpy as np
import pytest
from mpi4py import MPI

from helpers import make_batches, train_zero
from zerompi.adam import CHUNK
from zerompi.comm import Communicator
from zerompi.memory import BytesPerParam, comm_elements_per_step, model_state_bytes
from zerompi.overlap import OverlapConfig

SIZES = [12, 37, 53, 7]   # a layer of 481 elements: a padded shard at every N > 1
STEPS = 2


class CountingComm:
    """Forwards the three array collectives to the real communicator and counts their elements."""

    def __init__(self, real):
        self.real = real
        self.calls = {"Allreduce": 0, "Reduce_scatter_block": 0, "Allgather": 0}
        self.elements = dict.fromkeys(self.calls, 0)

    def _count(self, name, full_buffer):
        self.calls[name] += 1
        self.elements[name] += np.asarray(full_buffer).size

    def Allreduce(self, send, recv, op):
        self._count("Allreduce", recv)
        return self.real.Allreduce(send, recv, op=op)

    def Reduce_scatter_block(self, send, recv, op):
        self._count("Reduce_scatter_block", recv if send is MPI.IN_PLACE else send)
        return self.real.Reduce_scatter_block(send, recv, op=op)

    def Allgather(self, send, recv):
        self._count("Allgather", recv)
        return self.real.Allgather(send, recv)

    def Dup(self):
        """The communication thread's duplicate (zerompi/overlap/thread.py) counts into the same tallies."""
        dup = CountingComm(self.real.Dup())
        dup.calls, dup.elements = self.calls, self.elements
        return dup

    def restart(self):
        """Count from zero (the Communicator's set-up, the node of each rank, is not training traffic)."""
        for tally in (self.calls, self.elements):
            tally.update(dict.fromkeys(tally, 0))

    def __getattr__(self, name):
        return getattr(self.real, name)


def run(stage, dtype=np.float64, overlap=OverlapConfig()):
    proxy = CountingComm(MPI.COMM_WORLD)
    comm = Communicator(proxy)
    proxy.restart()
    engine, _ = train_zero(stage, SIZES, dtype, make_batches(SIZES, STEPS), comm=comm, overlap=overlap)
    engine.stage.finish_communication()       # the last step's all-gathers may still be in flight
    return engine, proxy


@pytest.mark.mpi
@pytest.mark.parametrize("overlap", [OverlapConfig(enabled=True, prefetch=2), OverlapConfig(enabled=False, bucket_mb=0)],
                         ids=["on-prefetch-2", "off-bucket-per-layer"])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_comm_ledger_matches_mpi_calls_and_formula(stage, overlap):
    engine, proxy = run(stage, overlap=overlap)
    n, layout, ledger = engine.comm.size, engine.layout, engine.comm.ledger
    layers = len(layout.layers)
    ring = (n - 1) / n
    # 1. the ledger agrees with what MPI was handed
    # per step: the stage's collectives, plus one all-reduce of (each layer's norm^2, loss, correct)
    # (stage 0: one all-reduce per bucket of layers: one bucket by default, one per layer at 0 MB)
    buckets = layout.gradient_buckets(engine.stage.precision.storage.itemsize, overlap.bucket_mb)
    assert len(buckets) == (1 if overlap.bucket_mb > 0 else layers)
    expected_calls = {0: {"Allreduce": len(buckets) + 1},
                      1: {"Reduce_scatter_block": layers, "Allgather": layers, "Allreduce": 1},
                      2: {"Reduce_scatter_block": layers, "Allgather": layers, "Allreduce": 1},
                      3: {"Reduce_scatter_block": layers, "Allgather": 2 * layers, "Allreduce": 1}}[stage]
    for name in proxy.calls:
        assert proxy.calls[name] == STEPS * expected_calls.get(name, 0), name
    counted = (2 * proxy.elements["Allreduce"] + proxy.elements["Reduce_scatter_block"]
               + proxy.elements["Allgather"]) * ring
    calls, _, all_elements, _ = ledger.totals({"grads", "params", "metrics"})
    assert calls == sum(proxy.calls.values())
    assert all_elements == pytest.approx(counted, rel=1e-12, abs=1e-9)
    metric_calls, _, metric_elements, _ = ledger.totals({"metrics"})
    assert metric_calls == STEPS and metric_elements == pytest.approx(STEPS * 2 * (layers + 2) * ring)
    _, _, elements, _ = ledger.totals({"grads", "params"})
    # 2. per step, exactly the formula at Psi_pad, and within padding of the formula at Psi
    per_step = elements / STEPS
    assert per_step == pytest.approx(comm_elements_per_step(stage, layout.full_numel, n), rel=1e-12, abs=1e-9)
    at_psi = comm_elements_per_step(stage, layout.num_params, n)
    multiplier = 3 if stage == 3 else 2
    assert at_psi - 1e-9 <= per_step <= at_psi + multiplier * ring * (n - 1) * layers + 1e-9


@pytest.mark.mpi
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_memory_ledger_matches_formula(stage, dtype):
    engine, _ = run(stage, dtype)
    n, layout, memory = engine.comm.size, engine.layout, engine.memory
    item = np.dtype(dtype).itemsize
    bytes_per_param = BytesPerParam(item, item, 2 * item)
    padded = model_state_bytes(stage, layout.full_numel, n, bytes_per_param)
    at_psi = model_state_bytes(stage, layout.num_params, n, bytes_per_param)
    for kind in ("params", "grads", "optimizer"):
        assert memory.bytes_by_kind[kind] == padded[kind], kind
        padding_bound = (n - 1) * len(layout.layers) * 3 * item     # N-1 pad elements per layer
        assert at_psi[kind] <= memory.bytes_by_kind[kind] <= at_psi[kind] + padding_bound
    # the ledger's numbers are the buffers' own sizes
    assert sum(b[4] for b in memory.buffers) == memory.total_bytes


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_what_each_stage_does_not_keep(stage):
    """Stage >= 1: no full-size optimizer state; >= 2: no full-size gradient; 3: no full params."""
    engine, _ = run(stage)
    full = engine.layout.full_numel
    full_sized = {kind for kind, _, shape, *_ in engine.memory.buffers if np.prod(shape) >= full}
    assert ("optimizer" in full_sized) == (stage == 0)
    assert ("grads" in full_sized) == (stage <= 1)
    assert ("params" in full_sized) == (stage <= 2)
    work_sizes = [np.prod(shape) for kind, _, shape, *_ in engine.memory.buffers if kind == "work"]
    assert max(work_sizes) <= max(engine.layout.max_layer_padded, CHUNK)   # one layer, or Adam's chunk
