"""Hybrid sharding and hpZ at the edges of the hot loop: nothing allocated per step, in float32
and in bf16 with two micro-batches (the replica all-reduce of a 16-bit shard goes through float32
staging, an accumulating reduce-scatter through the group's partial sum); the same measurement
as test_allocations_within_stage_bounds.py (tracemalloc's NumPy domain), with the groupings of
zerompi/hierarchy/ at any N: S = 1 and S = N/2 (when N is even), hpZ with L = 1 and L = N. A
step may allocate and free TRANSIENT bytes, or what the flat stage's step does (+ OBJECTS)
where that is more (NumPy's casting buffers when backward adds a bf16 micro-batch's gradient:
about 68 kB); no array it allocates stays alive.
"""
import tracemalloc

import pytest
from mpi4py import MPI

from helpers import make_batches, make_engine, run_steps
from test_allocations_within_stage_bounds import NUMPY, SIZES, TRANSIENT
from zerompi.hierarchy import Grouping
from zerompi.precision import precision_for
from zerompi.mpi import init_mpi

init_mpi()                                  # N is read when the module is collected
N = MPI.COMM_WORLD.Get_size()
ROWS = 2                           # per rank and micro-batch
OBJECTS = 8 * 1024                 # Python objects (views, frames) beyond the flat step's: far below a layer
GROUPINGS = ([(stage, Grouping(shard_group=s)) for s in sorted({1, N // 2} - {0}) if s < N
              for stage in (1, 2, 3)] + [(3, Grouping(hpz_node_size=size)) for size in sorted({1, N})])


def case_id(value):
    if not isinstance(value, Grouping):
        return f"stage{value}"
    return f"S{value.shard_group}" if value.shard_group else f"hpz-L{value.hpz_node_size}"


def numpy_bytes():
    snapshot = tracemalloc.take_snapshot().filter_traces([NUMPY])
    return sum(trace.size for trace in snapshot.traces)


def measure(stage, grouping, dtype, micro_batches):
    """(NumPy bytes a step allocated that are still alive after it, the most a step allocated
    and freed) over two steps after a warm-up."""
    precision = precision_for(dtype)
    global_batch = ROWS * N * micro_batches
    batches = make_batches(SIZES, 3, rows=global_batch)
    engine = make_engine(stage, SIZES, precision.storage, global_batch=global_batch,
                         micro_batches=micro_batches, grouping=grouping)
    engine.init_params(0)
    run_steps(engine, batches[:1], micro_batches)                  # warm-up
    tracemalloc.start()
    try:
        alive, transient = 0, 0
        for k in (1, 2):
            before = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            run_steps(engine, batches[k:k + 1], micro_batches)
            transient = max(transient, tracemalloc.get_traced_memory()[1] - before)
            alive = max(alive, numpy_bytes())
    finally:
        tracemalloc.stop()
    return alive, transient


@pytest.mark.mpi
@pytest.mark.parametrize("dtype,micro_batches", [("float32", 1), ("bf16", 2)])
@pytest.mark.parametrize("stage,grouping", GROUPINGS, ids=case_id)
def test_hierarchical_steps_allocate_nothing(stage, grouping, dtype, micro_batches):
    alive, transient = measure(stage, grouping, dtype, micro_batches)
    assert alive == 0, f"NumPy arrays a step allocated and left alive: {alive} B"
    if transient > TRANSIENT:                 # allowed where the flat stage's step does as much
        _, flat_transient = measure(stage, Grouping(), dtype, micro_batches)
        assert transient <= flat_transient + OBJECTS, (
            f"a step allocated {transient} B and freed it; the flat stage's step {flat_transient} B")
