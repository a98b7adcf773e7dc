"""A plan (zerompi/plan/) is what the run does: its memory and one step's collectives equal the
ledgers of a real run of the same configuration on this N, rank by rank.

For every stage, float32 and bf16, one and two micro-batches, overlap off and on, and (where N
allows) hybrid sharding over every group size dividing N and hpZ over every node size dividing
N, with the optimizer state in a file (zerompi/offload/), with qwZ's quantized gathers
(zerompi/quantize/), and with --fused-adam's kernel (zerompi/fused/): a real engine trains STEPS steps; its MemoryLedger (every buffer: kind, name, shape, dtype,
bytes) equals the plan's, and its CommLedger (calls, ring bytes and elements, inter-node bytes
and elements, per operation and purpose) equals STEPS times the plan's one step.
"""
import pytest

from helpers import make_batches, train_zero, world, world_size
from zerompi.adam import AdamConfig
from zerompi.fused import FusedAdamKernel
from zerompi.hierarchy import FLAT, Grouping
from zerompi.offload import FileTier, OffloadedAdamConfig
from zerompi.overlap import OverlapConfig
from zerompi.plan import RunShape, plan_run
from zerompi.precision import precision_for
from zerompi.quantize import Quantizer, two_hop_node_size

SIZES = [12, 37, 53, 7]   # a layer of 481 elements: a padded shard at every N > 1
STEPS = 2


def groupings(n):
    """Flat, then hybrid sharding for each group size S with 1 < S < N dividing N, then hpZ for
    each node size L dividing N (the node map of this one machine says nothing of L: hpZ is
    given it, as --hpz does on one node in the tests of zerompi.train)."""
    hybrid = [Grouping(shard_group=s) for s in range(2, n) if n % s == 0]
    hpz = [Grouping(hpz_node_size=node) for node in range(1, n + 1) if n % node == 0]
    return [FLAT, *hybrid, *hpz]


CASES = [(stage, dtype, m, overlap) for stage in range(4) for dtype in ("float32", "bfloat16")
         for m in (1, 2) for overlap in (False, True)]


def ledger_rows(ledger, times=1):
    return {key: [round(value * times, 6) for value in (e[0], e[1], e[2], e[4], e[5])]
            for key, e in ledger.entries.items()}


def check(stage, dtype, micro_batches, overlap, grouping, offload=None, offload_params=None, quantizer=None,
          grads_quantizer=None, quant_error=False, adam_kernel=None):
    comm = world()
    adam = (OffloadedAdamConfig(tier=offload, param_tier=offload_params, kernel=adam_kernel) if offload
            else AdamConfig(kernel=adam_kernel) if adam_kernel else None)
    batches = make_batches(SIZES, STEPS, rows=24 * micro_batches)
    config = OverlapConfig(enabled=overlap, bucket_mb=0.001)      # several buckets in stages 0-1
    engine, results = train_zero(stage, SIZES, dtype, batches, comm, micro_batches=micro_batches,
                                 overlap=config, grouping=grouping, adam=adam, quantizer=quantizer,
                                 grads_quantizer=grads_quantizer, grads_node_size=two_hop_node_size(comm.node_of_rank),
                                 quant_error=quant_error)
    assert all(r.applied for r in results)
    engine.stage.finish_communication()          # --overlap: the last step's all-gathers recorded
    shape = RunShape(tuple(SIZES), stage, precision_for(dtype), 24 // comm.size, comm.size, micro_batches,
                     grouping, config, comm.node_of_rank, offload=offload, offload_params=offload_params,
                     weights_quantizer=quantizer, grads_quantizer=grads_quantizer, quant_error=quant_error,
                     adam_kernel=adam_kernel)
    plan = plan_run(shape, comm.rank)
    assert plan.buffers == engine.memory.buffers
    assert plan.bytes_by_kind == engine.memory.bytes_by_kind
    assert ledger_rows(plan.ledger, STEPS) == ledger_rows(comm.ledger)
    if comm.across_nodes and grouping == FLAT:          # on several nodes (the emulated cluster): counted
        assert plan.ledger.inter_node({"grads", "params", "metrics"})[0] > 0


@pytest.mark.in_process
@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("stage, dtype, micro_batches, overlap", CASES)
def test_plan_equals_the_ledgers_of_a_run(stage, dtype, micro_batches, overlap):
    check(stage, dtype, micro_batches, overlap, FLAT)


@pytest.mark.in_process
@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("stage", [1, 2, 3])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_plan_equals_the_ledgers_of_a_hierarchical_run(stage, dtype):
    for grouping in groupings(world_size())[1:]:
        if grouping.hpz_node_size and stage != 3:
            continue
        check(stage, dtype, 2, False, grouping)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_plan_equals_the_ledgers_of_an_offloaded_run(stage, dtype, tmp_path):
    """The plan's file tier makes no file, and ledgers what the run's does (its tier included)."""
    check(stage, dtype, 1, False, FLAT, FileTier(str(tmp_path), world().rank))


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("micro_batches", [1, 2])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_plan_equals_the_ledgers_of_a_run_with_offloaded_parameters(dtype, micro_batches, tmp_path):
    """Stage 3 with the parameter shard in a file too: the plan ledgers its buffers and the shard's
    file tier, and its gathers read nothing."""
    tier = FileTier(str(tmp_path), world().rank)
    check(3, dtype, micro_batches, False, FLAT, tier, tier)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_plan_equals_the_ledgers_of_a_run_with_quantized_weights(dtype, tmp_path):
    """qwZ flat, with hpZ at every node size, and with the parameter shard in a file: its work
    buffers and its levels' and scales' gathers planned as the run makes them."""
    quantizer = Quantizer(8, 16)
    for grouping in [FLAT] + [g for g in groupings(world_size()) if g.hpz_node_size]:
        check(3, dtype, 2, False, grouping, quantizer=quantizer)
    tier = FileTier(str(tmp_path), world().rank)
    check(3, dtype, 1, False, FLAT, tier, tier, quantizer)


@pytest.mark.in_process
@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_plan_equals_the_ledgers_of_a_run_with_quantized_gradients(dtype):
    """qgZ at stages 2 and 3, and with qwZ flat and with hpZ at every node size (full ZeRO++): its
    all-to-alls planned as the run makes them (int4's packed bytes at stage 2; --quant-error's exact
    calls and buffers beside them)."""
    quantizer = Quantizer(8, 16)
    check(2, dtype, 2, False, FLAT, grads_quantizer=Quantizer(4, 16))
    check(3, dtype, 2, False, FLAT, quantizer=quantizer, grads_quantizer=Quantizer(4, 16), quant_error=True)
    for grouping in [FLAT] + [g for g in groupings(world_size()) if g.hpz_node_size]:
        check(3, dtype, 2, False, grouping, quantizer=quantizer, grads_quantizer=quantizer)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_plan_equals_the_ledgers_of_a_run_with_the_fused_adamw(stage, dtype, tmp_path):
    """--fused-adam's work buffers (none, or a 16-bit gradient's widened chunk) planned as the run
    holds them, in memory and with the optimizer state in a file."""
    check(stage, dtype, 2, False, FLAT, adam_kernel=FusedAdamKernel())
    check(stage, dtype, 1, False, FLAT, FileTier(str(tmp_path), world().rank), adam_kernel=FusedAdamKernel())
