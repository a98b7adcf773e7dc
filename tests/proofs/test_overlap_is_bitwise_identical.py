"""Overlap on computes exactly what overlap off computes: bitwise, for every stage, dtype, bucket
size, prefetch depth and gradient accumulation (zerompi/overlap/).

The same collectives run on the same buffers either way, so any difference is a race: a buffer read
before its collective finished, or reused while one still reads it. To make such a race show up
every time rather than by chance, the communication thread's MPI calls go through a proxy that
sleeps before each collective: a missing wait then reads stale numbers, on every rank.

Each run: two training steps, a forward-only pass (as the held-out evaluation does; in stage 3 it
leaves no prefetch behind), one more step, then the consolidated weights (a collective read from
outside the step) and the Adam state.
"""
import time

import ml_dtypes
import numpy as np
import pytest
from mpi4py import MPI

from helpers import consolidated, make_batches, make_engine, run_steps
from zerompi.comm import Communicator
from zerompi.overlap import OverlapConfig
from zerompi.overlap.thread import ThreadedCollectives
from zerompi.step import count_correct

SIZES = [12, 37, 53, 19, 7]      # 4 layers of 481, 2014, 1026 and 140 elements: padding at every N > 1
DELAY_S = 0.002
GLOBAL_BATCH = 48                # divisible by N x micro-batches for N = 1, 2, 3, 4, 8 and 1 or 2


class SlowDuplicate:
    """An mpi4py communicator whose Dup (the communication thread's) sleeps before each collective."""

    def __init__(self, real, delay=0.0):
        self.real, self.delay = real, delay

    def Dup(self):
        return SlowDuplicate(self.real.Dup(), DELAY_S)

    def __getattr__(self, name):
        attribute = getattr(self.real, name)
        if name not in ("Allreduce", "Reduce_scatter_block", "Allgather") or not self.delay:
            return attribute

        def slow(*args, **kwargs):
            time.sleep(self.delay)
            return attribute(*args, **kwargs)
        return slow


def train(stage, dtype, micro_batches, overlap):
    comm = Communicator(SlowDuplicate(MPI.COMM_WORLD))
    batches = make_batches(SIZES, 3, rows=GLOBAL_BATCH)
    engine = make_engine(stage, SIZES, dtype, comm, GLOBAL_BATCH, micro_batches, overlap)
    engine.init_params(0)
    results = run_steps(engine, batches[:2], micro_batches, max_grad_norm=0.5)
    x, labels = batches[0]
    rows = GLOBAL_BATCH // comm.size                   # this rank's rows, evaluated in micro-batches
    mine = slice(comm.rank * rows, (comm.rank + 1) * rows)
    correct = count_correct(engine, x[mine].astype(engine.stage.precision.compute),
                            labels[mine], rows // micro_batches, micro_batches)
    results += run_steps(engine, batches[2:], micro_batches, max_grad_norm=0.5)
    state = [a.copy() for a in (engine.stage.adam.m, engine.stage.adam.v, engine.stage.adam.master)
             if a is not None]
    return engine, results, correct, consolidated(engine), state


@pytest.mark.mpi
@pytest.mark.parametrize("micro_batches", [1, 2])
@pytest.mark.parametrize("bucket_mb", [0.0, 25.0], ids=["bucket-per-layer", "bucket-25MB"])
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16], ids=["float32", "bf16"])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_overlap_on_is_bitwise_overlap_off(stage, dtype, bucket_mb, micro_batches):
    off = train(stage, dtype, micro_batches, OverlapConfig(enabled=False, bucket_mb=bucket_mb))
    on = train(stage, dtype, micro_batches, OverlapConfig(enabled=True, bucket_mb=bucket_mb, prefetch=2))
    _, results_off, correct_off, layers_off, state_off = off
    engine_on, results_on, correct_on, layers_on, state_on = on
    assert [(r.loss, r.grad_norm, r.correct, r.applied) for r in results_on] == \
        [(r.loss, r.grad_norm, r.correct, r.applied) for r in results_off]
    assert correct_on == correct_off
    for (w_on, b_on), (w_off, b_off) in zip(layers_on, layers_off):
        assert np.array_equal(w_on, w_off) and np.array_equal(b_on, b_off)
    for a_on, a_off in zip(state_on, state_off):
        assert np.array_equal(a_on, a_off)
    collectives = engine_on.stage.collectives
    assert isinstance(collectives, ThreadedCollectives) and collectives.finished == collectives.started


@pytest.mark.mpi
@pytest.mark.parametrize("stage", [2, 3])
def test_overlap_buffers_are_ledgered_as_work(stage):
    """Overlap's extra one-layer buffers (a second gradient buffer; stage 3: one gather buffer per
    prefetched layer) are in the memory ledger, and only when overlap is on."""
    def work_names(overlap):
        engine = make_engine(stage, SIZES, np.float32, overlap=overlap)
        return sorted(name for kind, name, *_ in engine.memory.buffers if kind == "work")
    off = work_names(OverlapConfig(enabled=False))
    on = work_names(OverlapConfig(enabled=True, prefetch=2))
    extra = ["layer_grad.2"] + (["param_gather.2", "param_gather.3"] if stage == 3 else [])
    assert sorted(set(on) - set(off)) == extra and set(off) <= set(on)
