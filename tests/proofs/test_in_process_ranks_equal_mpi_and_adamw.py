"""N ranks as threads of one process (zerompi/inprocess/) compute what single-process AdamW computes,
and what mpirun computes: every stage at N = 1, 2, 3, 4, 8 in float64 against the reference
(accumulation and clipping, uneven shards), hybrid sharding, hpZ and qgZ's two hops over
in-process nodes, --overlap's communication thread; bit for bit the same from one run to the next,
and (under mpirun with N = 1 and 2) bit for bit the MPI run's in float32. Their ledgers are the
plan's, which tests/reference/test_plan_equals_ledger.py holds to MPI's. A rank that raises, or does
not arrive, stops every rank with its diagnosis instead of a hang; and nothing imports mpi4py."""
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from helpers import consolidated, make_batches, micro_batches_for, reference, train_zero
from test_zero_equals_single_process_adamw import SIZES, assert_close_f64, size_id
from zerompi.hierarchy import Grouping
from zerompi.inprocess import RankFailed, run_ranks
from zerompi.overlap import OverlapConfig
from zerompi.quantize import Quantizer
from zerompi.util.exit_codes import ExitCode

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def trained(stage, sizes, dtype, batches, **options):
    return lambda comm: consolidated(train_zero(stage, sizes, dtype, batches, comm=comm, **options)[0])


@pytest.mark.parametrize("sizes", SIZES[:2], ids=size_id)
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_every_stage_equals_adamw_at_every_n(n, stage, sizes):
    m = micro_batches_for(n)
    batches = make_batches(sizes, 3)
    want, _ = reference(sizes, np.float64, batches, clip_norm=0.5)
    for got in run_ranks(trained(stage, sizes, np.float64, batches, micro_batches=m, max_grad_norm=0.5), n):
        assert_close_f64(got, want)


@pytest.mark.parametrize("options", [{"grouping": Grouping(shard_group=2)}, {"grouping": Grouping(hpz_node_size=2)},
                                     {"overlap": OverlapConfig(enabled=True, bucket_mb=0.001)}],
                         ids=["hybrid", "hpz", "overlap"])
def test_hybrid_sharding_hpz_and_overlap_equal_adamw(options):
    sizes, batches = SIZES[0], make_batches(SIZES[0], 3)
    want, _ = reference(sizes, np.float64, batches)
    for got in run_ranks(trained(3, sizes, np.float64, batches, **options), 4, nodes=2):
        assert_close_f64(got, want)


def test_qgz_runs_its_two_hops_over_in_process_nodes():
    from reference import reduced_through_blocks
    from functools import partial
    sizes, batches, quantizer = SIZES[0], make_batches(SIZES[0], 3), Quantizer(4, 16)
    reduced = partial(reduced_through_blocks, num_ranks=4, micro_batches=1, bits=4, block=16, node_size=2)
    want, _ = reference(sizes, np.float64, batches, reduced=reduced)
    for got in run_ranks(trained(2, sizes, np.float64, batches, grads_quantizer=quantizer, grads_node_size=2), 4,
                         nodes=2):
        assert_close_f64(got, want)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_two_runs_are_bitwise_the_same_and_every_rank_holds_the_same_weights(stage):
    sizes, batches = SIZES[0], make_batches(SIZES[0], 3)
    first, second = (run_ranks(trained(stage, sizes, np.float32, batches, micro_batches=2), 4) for _ in range(2))
    for got in first[1:] + second:
        assert all(np.array_equal(a, b) for layer, other in zip(got, first[0]) for a, b in zip(layer, other))


def test_sums_are_taken_in_rank_order_on_every_rank():
    """1e16 + 1 rounds to 1e16 in float64: in rank order ((1e16 + 1) - 1e16) + 1 = 1; in any other
    order another number (0, or 2)."""
    values = [1e16, 1.0, -1e16, 1.0]

    def sums(comm):
        everywhere = np.full(4, values[comm.rank])
        comm.allreduce_sum(everywhere, "grads")
        shard = np.zeros(1)
        comm.reduce_scatter_sum(np.full(4, values[comm.rank]), shard, "grads")
        return everywhere, shard

    for everywhere, shard in run_ranks(sums, 4):
        assert everywhere.tolist() == [1.0] * 4 and shard.tolist() == [1.0]


def test_the_ledgers_are_the_plans():
    """Every call, byte and element a rank's ledger counts, as the plan (zerompi/plan/) of the same run."""
    from zerompi.plan import RunShape, plan_run
    from zerompi.precision import precision_for
    sizes, steps = SIZES[0], 2

    def ledger_of(comm):
        engine, _ = train_zero(3, sizes, np.float32, make_batches(sizes, steps), comm=comm, micro_batches=2)
        return {key: entry[:3] for key, entry in engine.comm.ledger.entries.items()}

    for rank, ledger in enumerate(run_ranks(ledger_of, 4)):
        plan = plan_run(RunShape(tuple(sizes), 3, precision_for("float32"), 24 // 8, 4, 2), rank).ledger
        assert ledger == {key: [steps * e[0], steps * e[1], steps * e[2]] for key, e in plan.entries.items()}


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_in_process_ranks_are_bitwise_the_mpi_run_at_one_and_two_ranks(stage):
    from mpi4py import MPI
    n = MPI.COMM_WORLD.Get_size()
    if n > 2:
        pytest.skip("bit for bit at N = 1 and 2 (beyond, MPI's reductions add in their own order)")
    sizes, batches = SIZES[0], make_batches(SIZES[0], 3)
    mpi = consolidated(train_zero(stage, sizes, np.float32, batches, micro_batches=2)[0])
    for got in run_ranks(trained(stage, sizes, np.float32, batches, micro_batches=2), n):
        assert all(np.array_equal(a, b) for layer, other in zip(got, mpi) for a, b in zip(layer, other))


@pytest.mark.timeout(60)
def test_a_rank_that_raises_stops_every_rank_and_is_named():
    def fn(comm):
        if comm.rank == 2:
            raise ValueError("bad batch")
        comm.barrier()

    start = time.monotonic()
    with pytest.raises(RankFailed, match=r"rank 2: ValueError: bad batch") as failed:
        run_ranks(fn, 4)
    assert failed.value.rank == 2 and time.monotonic() - start < 30      # the others did not wait it out


@pytest.mark.timeout(60)
def test_a_rank_that_does_not_arrive_is_named_at_the_deadline():
    """Rank 1 has one batch fewer: the others' last collective waits for it until the deadline."""
    def fn(comm):
        for _ in range(3 if comm.rank == 1 else 4):
            comm.barrier()

    with pytest.raises(RankFailed) as failed:
        run_ranks(fn, 3, timeout=1.0)
    message = str(failed.value)
    assert "collective #4 (barrier) of 3 ranks: ranks 0, 2 waited 1 s" in message, message
    assert "ranks 1 did not arrive (their last call: rank 1 #3 barrier)" in message, message


@pytest.mark.timeout(60)
def test_ranks_in_different_collectives_are_named_not_paired():
    def fn(comm):
        comm.barrier() if comm.rank == 0 else comm.first_failing_rank("bad")

    with pytest.raises(RankFailed, match=r"collective #1 of 2 ranks differs: rank 0 called barrier, rank 1 called "
                                         r"first_failing_rank"):
        run_ranks(fn, 2)


def test_lockstep_pauses_every_rank_at_each_collective_and_shows_every_ranks_input():
    """At stage 2's first reduce-scatter each rank brings its own rows' gradient of the last layer;
    while they wait (no rank's collective ends before the look does), the sum of what they bring is
    what every rank's shard will hold."""
    sizes, batches, seen, ended = SIZES[0], make_batches(SIZES[0], 1), [], []

    def pause(number, name, inputs):
        time.sleep(0.01)                                              # a reader looking
        seen.append((number, name, [x.copy() for x in inputs], time.perf_counter()))

    def fn(comm):
        comm.ledger.listeners.append(lambda op, purpose, nbytes, start, end: ended.append((comm.rank, time.perf_counter())))
        engine, _ = train_zero(2, sizes, np.float64, batches, comm=comm)
        return engine.layout, engine.stage.grad_shard.copy()            # this rank's reduced gradient shard
    results = run_ranks(fn, 4, pause=pause)
    assert [number for number, *_ in seen] == list(range(1, len(seen) + 1))
    first_look = seen[0][3]
    assert len(ended) >= 4 and all(when > first_look for _, when in ended)   # every collective ended after it
    number, name, inputs, _ = next(s for s in seen if s[1] == "reduce_scatter")
    layout = results[0][0]
    layer = next(u for u in layout.layers if u.padded == inputs[0].size)   # the layer reduced first: the last
    total, n = sum(inputs), layer.shard_size                           # each rank's rows' gradient, summed
    for rank, (_, grads) in enumerate(results):
        assert np.allclose(grads[layout.shard_slice(layer)], total[rank * n:(rank + 1) * n], rtol=1e-12, atol=1e-15)


@pytest.mark.timeout(60)
def test_check_collectives_names_both_call_sites_of_a_disagreement(capsys):
    def fn(comm):
        comm.guards.turn_on(check_collectives=True)
        comm.allreduce_sum(np.zeros(3 if comm.rank == 1 else 2), "grads")

    with pytest.raises(SystemExit) as stopped:
        run_ranks(fn, 3)
    assert stopped.value.code == ExitCode.COLLECTIVE_MISMATCH
    line = capsys.readouterr().err.strip()
    here = "tests/proofs/test_in_process_ranks_equal_mpi_and_adamw.py:"
    assert line.startswith("zerompi: error: the ranks disagree at collective #1: ranks 0,2: allreduce of 2 float64 "
                           f"(grads) at {here}") and "; rank 1: allreduce of 3 float64 (grads) at " + here in line, line


@pytest.mark.timeout(60)
def test_check_collectives_also_checks_control_messages(capsys):
    """A control message (zerompi/control.py's, guarded as under MPI) against a training collective."""
    def fn(comm):
        comm.guards.turn_on(check_collectives=True)
        comm.first_failing_rank(None) if comm.rank == 0 else comm.allreduce_sum(np.zeros(2), "grads")

    with pytest.raises(SystemExit) as stopped:
        run_ranks(fn, 2)
    line = capsys.readouterr().err.strip()
    assert stopped.value.code == ExitCode.COLLECTIVE_MISMATCH and "rank 0: allreduce_min of 1 int64 (control) at " \
        "tests/proofs/test_in_process_ranks_equal_mpi_and_adamw.py:" in line and "rank 1: allreduce of 2 float64" in line, line


@pytest.mark.timeout(60)
def test_the_first_rank_to_fail_is_named_with_overlap_and_splits_after_it_do_not_wait(monkeypatch):
    """Rank 2 raises after building its engine: the others' communication threads (--overlap) stop,
    and RankFailed names rank 2, not a rank whose thread the stop reached; a rank that splits after
    the failure is stopped at once; a rank stuck outside any collective is left behind."""
    import zerompi.inprocess
    from helpers import make_engine
    monkeypatch.setattr(zerompi.inprocess, "STRAGGLER_SECONDS", 1.0)
    sizes = SIZES[0]

    def fn(comm):
        if comm.rank == 3:
            time.sleep(30)                       # stuck, outside any collective
        engine = make_engine(3, sizes, np.float32, comm, overlap=OverlapConfig(enabled=True))
        if comm.rank == 2:
            raise ValueError("rank 2 gives up")
        time.sleep(0.2 * comm.rank)
        engine.init_params(0)
        comm.split(lambda r: r % 2).barrier()

    start = time.monotonic()
    with pytest.raises(RankFailed, match="rank 2: ValueError: rank 2 gives up") as failed:
        run_ranks(fn, 4, timeout=20)
    assert failed.value.rank == 2 and time.monotonic() - start < 10


def test_nothing_imports_mpi4py():
    code = ("import sys; sys.modules['mpi4py'] = None\n"            # an import of it raises ImportError
            "import numpy as np\n"
            "from zerompi.adam import AdamConfig\n"
            "from zerompi.engine import build_engine\n"
            "from zerompi.inprocess import run_ranks\n"
            "from zerompi.precision import precision_for\n"
            "from zerompi.step import train_step\n"
            "def fn(comm):\n"
            "    engine = build_engine([8, 16, 4], 3, precision_for('float32'), AdamConfig(), 4, comm)\n"
            "    engine.init_params(0)\n"
            "    x, y = np.ones((4, 8), np.float32), np.zeros(4, np.int64)\n"
            "    return train_step(engine, [(x, y)], 16, 1e-3).loss\n"
            "print(run_ranks(fn, 4))\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    losses = eval(result.stdout)
    assert len(losses) == 4 and len(set(losses)) == 1
