"""A checkpoint written with (N, stage) loads into any (N', stage'), and the continued run matches
the uninterrupted one: N and N' in 1..5 (sub-communicators of the launch), every pair of stages
(each at several N'), widths that no N divides. Each rank reads only its ranges (zerompi/checkpoint/load.py).

float64, so "matches" means 1e-12 relative, as in test_zero_equals_single_process_adamw.py.
"""
import os

import numpy as np
import pytest
from mpi4py import MPI

from helpers import LR, WEIGHT_DECAY, consolidated, make_batches, make_engine, run_steps
from reference import adamw_train, initial_weights
from zerompi.checkpoint import load_checkpoint, save_checkpoint
from zerompi.checkpoint.find import latest_checkpoint
from zerompi.comm import Communicator

SIZES = [12, 37, 53, 7]   # a layer of 481 elements: a padded shard at every N > 1
BATCH = 60                          # divisible by 1, 2, 3, 4, 5
STEPS_BEFORE, STEPS_AFTER = 3, 3
RANK_COUNTS = [1, 2, 3, 4, 5]


def sub_communicator(size):
    """The first `size` ranks of the launch as a Communicator, None on the others (collective)."""
    world = MPI.COMM_WORLD
    sub = world.Split(0 if world.rank < size else MPI.UNDEFINED, world.rank)
    return Communicator(sub) if sub != MPI.COMM_NULL else None


def destinations(n_src, stage_src):
    """Every stage' for every source, each at another N' (over the five sources of a stage, each
    stage' meets every N' in 1..5)."""
    return [((n_src + stage_dst) % 5 + 1, stage_dst) for stage_dst in range(4)]


@pytest.mark.mpi(min_size=5)
@pytest.mark.parametrize("stage_src", [0, 1, 2, 3])
def test_resharded_resume_matches_the_uninterrupted_run(stage_src, shared_folder):
    batches = make_batches(SIZES, STEPS_BEFORE + STEPS_AFTER, rows=BATCH)
    want, _, _ = adamw_train(initial_weights(SIZES, 0), batches, LR, WEIGHT_DECAY)
    for n_src in RANK_COUNTS:
        save_dir = os.path.join(shared_folder, f"stage{stage_src}-n{n_src}")
        comm = sub_communicator(n_src)
        if comm is not None:
            if comm.rank == 0:
                os.makedirs(save_dir)
            comm.mpi.Barrier()
            engine = make_engine(stage_src, SIZES, np.float64, comm, BATCH)
            engine.init_params(0)
            run_steps(engine, batches[:STEPS_BEFORE])
            state = {"step": STEPS_BEFORE, "loss_scale": 1.0, "loss_scale_good_steps": 0, "seed": 0,
                     "shuffle": True, "batch_size": BATCH}
            assert save_checkpoint(engine, save_dir, state, keep_last=0)[0] is None
            comm.mpi.Free()
        MPI.COMM_WORLD.Barrier()
        for n_dst, stage_dst in destinations(n_src, stage_src):
            comm = sub_communicator(n_dst)
            if comm is None:
                continue
            engine = make_engine(stage_dst, SIZES, np.float64, comm, BATCH)
            state = load_checkpoint(engine, latest_checkpoint(save_dir))
            assert state["step"] == STEPS_BEFORE and engine.stage.adam.t == STEPS_BEFORE
            run_steps(engine, batches[STEPS_BEFORE:])
            got = consolidated(engine)
            for (w, b), (w_ref, b_ref) in zip(got, want):
                for tensor, tensor_ref in ((w, w_ref), (b, b_ref)):
                    assert np.max(np.abs(tensor - tensor_ref)) <= 1e-12 * np.max(np.abs(tensor_ref)), \
                        f"saved at N={n_src} stage {stage_src}, resumed at N={n_dst} stage {stage_dst}"
            comm.mpi.Free()


@pytest.mark.mpi(min_size=2)
def test_stage_3_reads_only_its_own_ranges(shared_folder, monkeypatch):
    """A stage-3 rank loading a checkpoint touches only the elements it will hold: counted at the
    reader, the total over ranks equals the model's state once, not N times."""
    from zerompi.checkpoint import reader
    world = MPI.COMM_WORLD
    save_dir = os.path.join(shared_folder, "stage3-own-ranges")
    if world.rank == 0:
        os.makedirs(save_dir)
    world.Barrier()
    engine = make_engine(3, SIZES, np.float64, Communicator(), 24)
    engine.init_params(0)
    state = {"step": 0, "loss_scale": 1.0, "loss_scale_good_steps": 0, "seed": 0, "shuffle": True,
             "batch_size": 24}
    assert save_checkpoint(engine, save_dir, state, keep_last=0)[0] is None
    read = []
    original = reader.CheckpointReader.read_range

    def counting_read_range(self, layer_index, kind, lo, hi, dtype):
        read.append(min(hi, self.layers[layer_index]["numel"]) - min(lo, self.layers[layer_index]["numel"]))
        return original(self, layer_index, kind, lo, hi, dtype)

    monkeypatch.setattr(reader.CheckpointReader, "read_range", counting_read_range)
    load_checkpoint(make_engine(3, SIZES, np.float64, Communicator(), 24), latest_checkpoint(save_dir))
    total = np.array([sum(read)], dtype=np.int64)
    world.Allreduce(MPI.IN_PLACE, total)
    assert total[0] == 3 * engine.layout.num_params        # params, m, v: each element read once
