"""--keep-last-layer (zerompi/stages/stage3.py): stage 3 keeps the last layer gathered from the end
of forward to the start of backward. Its weights are bit for bit those without it: flat, with hpZ,
hybrid sharding, qwZ's quantized gathers, --overlap's prefetch, the parameter shard in a file;
one and two micro-batches, float32 and bf16, at every N. Its ledger has, per micro-batch, one
all-gather of the last layer fewer, the layer's padded elements x (N-1)/N fewer per rank and
nothing else changed; the plan equals it (zerompi/plan/)."""
import pytest

from helpers import consolidated, make_batches, train_zero, world
from zerompi.hierarchy import FLAT, Grouping
from zerompi.ledger import ALLGATHER, PARAMS
from zerompi.offload import FileTier, OffloadedAdamConfig
from zerompi.overlap import OverlapConfig
from zerompi.plan import RunShape, plan_run
from zerompi.precision import precision_for
from zerompi.quantize import Quantizer

SIZES = [12, 37, 53, 7]            # the last layer: 54 x 7 = 378 elements, padded at N > 1
ROWS = 24
VARIANTS = ["flat", "hpz", "hybrid", "qwz", "overlap", "offload-params"]


def options(variant, tmp_path, n):
    """(train_zero's keyword arguments for the variant, the ranks its parameter gathers span)."""
    if variant == "offload-params":
        tmp_path.mkdir(exist_ok=True)
        tier = FileTier(str(tmp_path), world().rank)
        return {"adam": OffloadedAdamConfig(tier=tier, param_tier=tier, weight_decay=0.1)}, n
    group = n // 2 if n % 2 == 0 else 1                 # hybrid sharding's group; hpZ's node: all N
    return {"flat": ({}, n), "hpz": ({"grouping": Grouping(hpz_node_size=n)}, n),
            "hybrid": ({"grouping": Grouping(shard_group=group)}, group),
            "qwz": ({"quantizer": Quantizer(8, 16)}, n), "overlap": ({"overlap": OverlapConfig(True, 4.0, 2)}, n)}[variant]


def calls_and_elements(ledger):
    """(calls, elements) of the parameters' all-gathers the ledger counted."""
    entry = ledger.entries[(ALLGATHER, PARAMS)]
    return entry[0], entry[2]


@pytest.mark.in_process
@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dtype, micro_batches", [("float32", 1), ("bfloat16", 2)])
@pytest.mark.parametrize("variant", VARIANTS)
def test_keeping_the_last_layer_trains_the_same_weights_with_one_gather_fewer(variant, dtype, micro_batches, tmp_path):
    steps = 3
    batches = make_batches(SIZES, steps, rows=ROWS * micro_batches)
    runs = []
    for keep in (False, True):
        comm = world()
        flags, span = options(variant, tmp_path / str(keep), comm.size)
        before = calls_and_elements(comm.ledger) if (ALLGATHER, PARAMS) in comm.ledger.entries else (0, 0)
        engine, results = train_zero(3, SIZES, dtype, batches, comm, micro_batches=micro_batches, keep_last_layer=keep,
                                     **flags)
        assert all(r.applied for r in results)
        engine.stage.finish_communication()
        after = calls_and_elements(comm.ledger)
        runs.append((consolidated(engine), (after[0] - before[0], after[1] - before[1]), engine))
    (plain, (calls, elements), engine), (kept, (kept_calls, kept_elements), _) = runs
    assert all(a.tobytes() == b.tobytes() for want, got in zip(plain, kept) for a, b in zip(want, got))
    last, gathers = engine.layout.layers[-1], steps * micro_batches
    assert calls - kept_calls == gathers
    assert elements - kept_elements == pytest.approx(gathers * last.padded * (span - 1) / span)


@pytest.mark.in_process
@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("grouping", [FLAT, Grouping(hpz_node_size=1)], ids=["flat", "hpz"])
def test_the_plan_keeps_it_too(grouping):
    comm = world()
    batches = make_batches(SIZES, 2, rows=ROWS * 2)
    start = dict(comm.ledger.entries)
    train_zero(3, SIZES, "bfloat16", batches, comm, micro_batches=2, grouping=grouping, keep_last_layer=True)
    shape = RunShape(tuple(SIZES), 3, precision_for("bfloat16"), ROWS // comm.size, comm.size, 2, grouping,
                     keep_last_layer=True)
    plan = plan_run(shape, comm.rank)
    got = {key: e[0] - start.get(key, (0, 0, 0))[0] for key, e in comm.ledger.entries.items()}
    assert {key: 2 * e[0] for key, e in plan.ledger.entries.items()} == {k: v for k, v in got.items() if v}
