"""Hybrid sharding (--shard-group S) and hpZ (--hpz) compute what single-process AdamW computes,
for every group size that divides N (run with N = 1, 2, 3, 4, 8: on in-process ranks, and under mpirun at N = 1, 2), uneven sizes
included, with gradient accumulation and clipping by the global norm; the same tolerances as
test_zero_equals_single_process_adamw.py. On one machine the "nodes" of hpZ are groups of L
consecutive ranks (zerompi.hierarchy.Grouping takes L as given); tests/program/test_multi_node.py runs
them on emulated nodes.
"""
import numpy as np
import pytest

from helpers import (STEPS, assert_within_mixed_tolerance, consolidated, make_batches, micro_batches_for,
                     reference, train_zero, world_size)
from test_zero_equals_single_process_adamw import BF16, SIZES, assert_close_f64, size_id
from zerompi.hierarchy import Grouping

N = world_size()                            # read when the module is collected
DIVISORS = [g for g in range(1, N + 1) if N % g == 0]
# every hybrid grouping (S < N: S = N is flat ZeRO) and every hpZ node size, at this N
GROUPINGS = ([(stage, Grouping(shard_group=g)) for g in DIVISORS[:-1] for stage in (1, 2, 3)] +
             [(3, Grouping(hpz_node_size=g)) for g in DIVISORS])


def case_id(value):
    if not isinstance(value, Grouping):
        return f"stage{value}"
    return f"S{value.shard_group}" if value.shard_group else f"hpz-L{value.hpz_node_size}"


@pytest.mark.in_process
@pytest.mark.mpi
@pytest.mark.parametrize("sizes", SIZES, ids=size_id)
@pytest.mark.parametrize("stage,grouping", GROUPINGS, ids=case_id)
def test_float64_equals_single_process_adamw(stage, grouping, sizes):
    batches = make_batches(sizes, STEPS)
    engine, results = train_zero(stage, sizes, np.float64, batches, grouping=grouping)
    want, norms = reference(sizes, np.float64, batches)
    assert_close_f64(consolidated(engine), want)
    for result, norm in zip(results, norms):
        assert result.grad_norm == pytest.approx(norm, rel=1e-12)     # each shard counted once


@pytest.mark.in_process
@pytest.mark.mpi
@pytest.mark.parametrize("stage,grouping", GROUPINGS, ids=case_id)
def test_accumulation_and_clipping_equal_single_process_adamw(stage, grouping):
    sizes = SIZES[0]
    batches = make_batches(sizes, STEPS)
    _, norms = reference(sizes, np.float64, batches)
    clip_norm = 0.3 * min(norms)                               # every step is clipped
    engine, _ = train_zero(stage, sizes, np.float64, batches, micro_batches=micro_batches_for(N),
                           max_grad_norm=clip_norm, grouping=grouping)
    want, _ = reference(sizes, np.float64, batches, clip_norm=clip_norm)
    assert_close_f64(consolidated(engine), want)


@pytest.mark.in_process
@pytest.mark.mpi
@pytest.mark.parametrize("stage,grouping", GROUPINGS, ids=case_id)
def test_bf16_within_mixed_tolerance(stage, grouping):
    sizes = SIZES[0]
    batches = make_batches(sizes, STEPS)
    engine, results = train_zero(stage, sizes, BF16, batches, grouping=grouping)
    assert all(r.applied for r in results)
    assert_within_mixed_tolerance(consolidated(engine), reference(sizes, BF16, batches)[0])


@pytest.mark.in_process
@pytest.mark.mpi
@pytest.mark.parametrize("stage,grouping", GROUPINGS, ids=case_id)
def test_model_state_divided_by_the_group(stage, grouping):
    """Per rank, the stage's model state over S ranks (hybrid), or stage 3's plus one parameter
    copy over L ranks (hpZ), from the ledger of what was allocated."""
    sizes = SIZES[2]
    engine, _ = train_zero(stage, sizes, np.float64, make_batches(sizes, 1), grouping=grouping)
    layout, kinds = engine.layout, engine.memory.bytes_by_kind
    shards = grouping.shard_group or N
    assert layout.num_ranks == shards
    full, shard = layout.full_numel * 8, layout.shard_numel * 8
    assert kinds["optimizer"] == 2 * shard
    assert kinds["grads"] == (full if stage == 1 else shard)
    secondary = full // grouping.hpz_node_size if grouping.hpz_node_size else 0
    assert kinds["params"] == (shard if stage == 3 else full) + secondary


@pytest.mark.mpi
@pytest.mark.parametrize("stage,grouping", [(s, g) for s, g in GROUPINGS if g.shard_group or g.hpz_node_size < N]
                         or GROUPINGS[-1:], ids=case_id)
def test_the_gpu_path_within_mixed_tolerance(stage, grouping):
    """On the GPU device's arithmetic and collectives (tests/support/device_stand_in.py: the GEMMs as
    cuBLAS runs them, the fused AdamW, every collective staged through pinned host memory), with
    gradient accumulation: bf16 within the mixed tolerance of single-process AdamW."""
    from device_stand_in import StandInTensorCores
    from zerompi.devices import communicator_on
    sizes = SIZES[0]
    batches = make_batches(sizes, STEPS)
    comm = communicator_on(StandInTensorCores(), mpi_reads_device_memory=False)
    engine, results = train_zero(stage, sizes, BF16, batches, comm, micro_batches=micro_batches_for(N),
                                 grouping=grouping)
    assert all(r.applied for r in results)
    assert_within_mixed_tolerance(consolidated(engine), reference(sizes, BF16, batches)[0])


@pytest.mark.in_process
@pytest.mark.mpi
@pytest.mark.parametrize("stage,grouping", GROUPINGS, ids=case_id)
def test_ledger_equals_the_ring_formula_with_micro_batches(stage, grouping):
    """What each rank's collectives moved per step (the CommLedger) is the grouping's ring formula
    (zerompi.memory.ring_traffic), with gradient accumulation: the replicas sum once per step."""
    from zerompi.ledger import GRADS, PARAMS
    from zerompi.memory import ring_traffic
    sizes, m = SIZES[0], micro_batches_for(N)
    engine, _ = train_zero(stage, sizes, np.float64, make_batches(sizes, STEPS), micro_batches=m, grouping=grouping)
    comm = engine.comm
    moved = {purpose: engine.comm.ledger.totals({purpose})[2] / STEPS for purpose in (GRADS, PARAMS)}
    formula = ring_traffic(grouping.ring_collectives(stage, engine.layout.full_numel, N, m), comm.node_of_rank)
    want = {purpose: sum(formula[comm.rank][link][purpose] for link in ("intra", "inter")) for purpose in moved}
    assert moved == pytest.approx(want, rel=1e-12)
