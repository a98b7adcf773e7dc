"""Device memory through MPI, without a GPU: the stand-in device (tests/support/device_stand_in.py) makes
the communicator take its GPU code paths (zerompi/devices/staging.py) with real MPI collectives on
host memory.

- staging (MPI not CUDA-aware): every stage, 16-bit included, with and without gradient
  accumulation, must give bitwise the weights of the plain CPU run; every collective on device
  memory copies to and from the pinned buffer, which is ledgered; nothing device-held reaches MPI.
- direct (CUDA-aware): the same weights, no staging buffer, and the stream is synchronized before
  every collective on device memory.
- with --overlap, the communication thread stages through its own pinned buffer: the same weights.
"""
import numpy as np
import pytest

from device_stand_in import StandInGPU
from helpers import consolidated, make_batches, train_zero
from zerompi.devices import communicator_on
from zerompi.layout import bucket_numel
from zerompi.overlap import OverlapConfig

SIZES = [12, 37, 53, 7]   # a layer of 481 elements: a padded shard at every N > 1
CASES = [(stage, dtype, k) for stage in (0, 1, 2, 3) for dtype, k in (("float32", 1), ("float32", 2), ("bfloat16", 2))]


def train(stage, dtype, k, device=None, cuda_aware=None, overlap=OverlapConfig()):
    batches = make_batches(SIZES, 2, rows=48)          # 48 rows: M = 2 micro-batches on N = 1, 2, 3, 4, 8
    comm = communicator_on(device, mpi_reads_device_memory=cuda_aware)
    engine, results = train_zero(stage, SIZES, np.dtype(dtype) if dtype != "bfloat16" else _bf16(), batches,
                                 comm=comm, micro_batches=k, overlap=overlap)
    return engine, results, consolidated(engine)


def _bf16():
    import ml_dtypes
    return np.dtype(ml_dtypes.bfloat16)


def assert_same(a, b):
    for (w, b_), (w2, b2) in zip(a, b):
        np.testing.assert_array_equal(w, w2)
        np.testing.assert_array_equal(b_, b2)


def device_collectives(engine):
    """Collectives on training buffers (grads, params, metrics), as recorded by the ledger."""
    return sum(calls for (op, purpose), (calls, *_) in engine.comm.ledger.entries.items()
               if purpose in ("grads", "params", "metrics"))


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("stage,dtype,k", CASES)
def test_staged_collectives_match_the_cpu_bitwise(stage, dtype, k):
    _, cpu_results, cpu_weights = train(stage, dtype, k)
    device = StandInGPU()
    engine, results, weights = train(stage, dtype, k, device, cuda_aware=False)
    assert_same(weights, cpu_weights)
    assert [r.loss for r in results] == [r.loss for r in cpu_results]
    assert engine.comm.transport.stages_through_host and engine.comm.transport.host_staging is not None
    buckets = engine.stage.buckets if stage == 0 else [[layer] for layer in engine.layout.layers]
    largest = max(bucket_numel(b) for b in buckets) * engine.stage.precision.compute.itemsize
    assert device.pinned == [max(largest, engine.step_sums.nbytes)]      # stage 0: a bucket, else a layer
    assert ("work", "comm.host_staging (pinned host)") in [(k_, n) for k_, n, *_ in engine.memory.buffers]
    calls = device_collectives(engine)
    assert device.to_host >= calls and device.from_host >= calls   # each went through the host
    assert device.synchronized == 0                                # copies wait; nothing else must


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_cuda_aware_collectives_take_device_memory_after_a_synchronize(stage):
    _, _, cpu_weights = train(stage, "float32", 1)
    device = StandInGPU()
    engine, _, weights = train(stage, "float32", 1, device, cuda_aware=True)
    assert_same(weights, cpu_weights)
    assert engine.comm.transport.host_staging is None and device.pinned == []
    assert device.to_host == device.from_host == 0
    # the consolidation in `train` gathers too (stage 3): count those as well
    io_calls = sum(calls for (op, purpose), (calls, *_) in engine.comm.ledger.entries.items() if purpose == "io")
    assert device.synchronized == device_collectives(engine) + io_calls


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_staging_from_the_communication_thread(stage):
    """--overlap: the thread's communicator stages through its own pinned buffer."""
    _, _, cpu_weights = train(stage, "float32", 1)
    device = StandInGPU()
    engine, _, weights = train(stage, "float32", 1, device, cuda_aware=False,
                               overlap=OverlapConfig(enabled=True, bucket_mb=0))
    assert_same(weights, cpu_weights)
    assert len(device.pinned) == 2 and device.pinned[0] == device.pinned[1]
    names = [name for _, name, *_ in engine.memory.buffers]
    assert "comm.host_staging (pinned host, thread)" in names
