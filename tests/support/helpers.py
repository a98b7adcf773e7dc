"""Shared by the multi-rank tests: a few ZeRO steps on a fixed global batch sequence, and the world a
test runs in: MPI's (under mpirun), or this thread's rank of in-process ranks (tests/conftest.py's
--in-process-ranks N runs the tests marked in_process so, on zerompi/inprocess/)."""
import os
import threading

import numpy as np

from zerompi.adam import AdamConfig
from zerompi.comm import Communicator
from zerompi.stages.params import full_layer_params
from zerompi.engine import build_engine
from zerompi.hierarchy import FLAT, hierarchy_for
from zerompi.offload import OffloadedStage3
from zerompi.overlap import OverlapConfig
from zerompi.precision import precision_for
from zerompi.quantize import quantized_collectives
from zerompi.step import train_step
from reference import adamw_train, initial_weights

IN_PROCESS_RANKS = "ZEROMPI_TEST_IN_PROCESS_RANKS"     # set by tests/conftest.py for --in-process-ranks
_RANK = threading.local()                              # .comm: this thread's in-process rank


def world():
    """A communicator of every rank, as a new Communicator() is over MPI's world (its own ledger):
    over this thread's in-process ranks, or MPI's."""
    rank = getattr(_RANK, "comm", None)
    if rank is None:
        return Communicator()
    from zerompi.inprocess import InProcessCommunicator
    return InProcessCommunicator(rank.hub, rank.rank, rank.node_of_rank)


def world_size():
    """N: the in-process ranks' count (--in-process-ranks, known when modules are collected), or MPI's."""
    if os.environ.get(IN_PROCESS_RANKS):
        return int(os.environ[IN_PROCESS_RANKS])
    from zerompi.mpi import MPI, init_mpi
    init_mpi()
    return MPI.COMM_WORLD.Get_size()


def on_ranks(fn, kwargs, num_ranks):
    """fn(**kwargs) on num_ranks in-process ranks, each thread's world() its rank; a rank's failure
    (an assert, a pytest.skip) raised as itself."""
    from zerompi.inprocess import RankFailed, run_ranks

    def rank_main(comm):
        _RANK.comm = comm
        return fn(**kwargs)
    try:
        run_ranks(rank_main, num_ranks, timeout=120)
    except RankFailed as failed:
        raise failed.error


GLOBAL_BATCH = 24          # divisible by every N tested: 1, 2, 3, 4, 8
STEPS = 3                  # steps of the equivalence runs
LR, WEIGHT_DECAY = 1e-2, 0.1


def make_batches(sizes, steps, seed=1, rows=GLOBAL_BATCH):
    """[(x (rows, sizes[0]) float64, labels (rows,)), ...], the same on every rank."""
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((rows, sizes[0])), rng.integers(0, sizes[-1], rows)) for _ in range(steps)]


def make_engine(stage, sizes, dtype, comm=None, global_batch=GLOBAL_BATCH, micro_batches=1,
                overlap=OverlapConfig(), grouping=FLAT, adam=None, quantizer=None, grads_quantizer=None,
                grads_node_size=None, quant_error=False, keep_last_layer=False):
    """An engine for this rank's share of the global batch, not yet initialized; adam: an
    AdamConfig with the suite's weight decay (zerompi/offload/'s to offload its state);
    quantizer, grads_quantizer: qwZ's and qgZ's (zerompi/quantize/), or None; grads_node_size: qgZ's
    two hops over nodes of that many ranks; quant_error: their errors measured (--quant-error);
    keep_last_layer: stage 3's --keep-last-layer."""
    comm = comm if comm is not None else world()
    rows = global_batch // (comm.size * micro_batches)
    adam = adam if adam is not None else AdamConfig(weight_decay=WEIGHT_DECAY)
    stage_class = OffloadedStage3 if getattr(adam, "param_tier", None) else None     # --offload-params
    start = (overlap.start if quantizer is None and grads_quantizer is None
             else quantized_collectives(quantizer, grads_quantizer, grads_node_size, quant_error))
    return build_engine(sizes, stage, precision_for(np.dtype(dtype).name), adam, rows, comm, micro_batches,
                        overlap.bucket_mb, start, hierarchy_for(comm, grouping), stage_class, keep_last_layer)


def run_steps(engine, batches, micro_batches=1, loss_scale=1.0, max_grad_norm=0.0):
    """Train on this rank's rows of each global batch, cut into micro_batches as zerompi.train
    does; returns [StepResult, ...]."""
    comm, compute = engine.comm, engine.stage.precision.compute
    results = []
    for x, labels in batches:
        rows = x.shape[0] // (comm.size * micro_batches)
        x = x.astype(compute).reshape(micro_batches, comm.size, rows, -1)[:, comm.rank]
        labels = labels.reshape(micro_batches, comm.size, rows)[:, comm.rank]
        results.append(train_step(engine, list(zip(x, labels)), micro_batches * comm.size * rows,
                                  LR, loss_scale, max_grad_norm))
        error = getattr(engine.stage.collectives, "error", None)      # --quant-error (zerompi/quantize/)
        if error is not None:
            error.step_errors()                                        # each step, as the program's metrics do
    return results


def train_zero(stage, sizes, dtype, batches, comm=None, seed=0, micro_batches=1, loss_scale=1.0,
               max_grad_norm=0.0, overlap=OverlapConfig(), grouping=FLAT, adam=None, quantizer=None,
               grads_quantizer=None, grads_node_size=None, quant_error=False, keep_last_layer=False):
    """A fresh engine initialized from seed and trained on batches; returns (engine, results)."""
    engine = make_engine(stage, sizes, dtype, comm, batches[0][0].shape[0], micro_batches, overlap, grouping,
                         adam, quantizer, grads_quantizer, grads_node_size, quant_error, keep_last_layer)
    engine.init_params(seed)
    return engine, run_steps(engine, batches, micro_batches, loss_scale, max_grad_norm)


def consolidated(engine):
    """[(weight, bias), ...] full copies in float64 (collective in stage 3)."""
    layers = []
    for layer in engine.layout.layers:
        weight, bias = layer.views(full_layer_params(engine.stage, layer))
        layers.append((weight.astype(np.float64), bias.astype(np.float64)))
    return layers


def reference(sizes, dtype, batches, **kwargs):
    storage = dtype if np.dtype(dtype).itemsize == 2 else None
    initial = initial_weights(sizes, 0, np.float64 if storage else dtype)
    layers, _, norms = adamw_train(initial, batches, LR, WEIGHT_DECAY, storage=storage, **kwargs)
    return [(w.astype(np.float64), b.astype(np.float64)) for w, b in layers], norms


def assert_mixed_run_matches_reference(stage, sizes, dtype, batches, micro_batches=1, comm=None):
    """A bf16/fp16 run (fp16: loss scale 1024, a power of two: exact to unscale) applies every step
    and ends within the mixed tolerance of the reference; returns its engine."""
    loss_scale = 1024.0 if dtype == np.float16 else 1.0
    engine, results = train_zero(stage, sizes, dtype, batches, comm, micro_batches=micro_batches,
                                 loss_scale=loss_scale)
    assert all(r.applied for r in results)
    want, _ = reference(sizes, dtype, batches)
    assert_within_mixed_tolerance(consolidated(engine), want)
    return engine


def assert_within_mixed_tolerance(got, want):
    """The bf16/fp16 criterion of the module docstring: mean |difference| <= lr / 20, and no
    element off by more than 2 lr per step."""
    diffs = np.concatenate([np.abs(g - w).ravel() for got_layer, want_layer in zip(got, want)
                            for g, w in zip(got_layer, want_layer)])
    assert diffs.mean() <= LR / 20
    assert diffs.max() <= 2 * LR * STEPS


def micro_batches_for(num_ranks):
    """3 micro-batches where the global batch of 24 allows it (N = 1, 2, 4, 8), else 2 (N = 3)."""
    return 3 if GLOBAL_BATCH % (3 * num_ranks) == 0 else 2
