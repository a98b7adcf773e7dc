"""A checkpoint written with (N, stage) loads into any (N', stage'), and the continued run matches
the uninterrupted one: N and N' in 1..5, every pair of stages (each at several N'), widths that no
N divides. Each rank reads only its ranges (zerompi/checkpoint/load.py).

The ranks are in-process ones (zerompi/inprocess/: run_ranks starts a world of any size inside
the test): resharding is the checkpoint code and the files, and needs no MPI; under mpirun the
program's checkpoints reshard onto other N and stages too (tests/proofs/test_checkpoint_cli.py).

float64, so "matches" means 1e-12 relative, as in test_zero_equals_single_process_adamw.py.
"""
import os

import numpy as np
import pytest

from helpers import LR, WEIGHT_DECAY, consolidated, make_batches, make_engine, run_steps
from reference import adamw_train, initial_weights
from zerompi.checkpoint import load_checkpoint, save_checkpoint
from zerompi.checkpoint.find import latest_checkpoint
from zerompi.hierarchy import FLAT
from zerompi.inprocess import run_ranks

SIZES = [12, 37, 53, 7]   # a layer of 481 elements: a padded shard at every N > 1
BATCH = 60                          # divisible by 1, 2, 3, 4, 5
STEPS_BEFORE, STEPS_AFTER = 3, 3
RANK_COUNTS = [1, 2, 3, 4, 5]
STATE = {"step": STEPS_BEFORE, "loss_scale": 1.0, "loss_scale_good_steps": 0, "seed": 0, "shuffle": True,
         "batch_size": BATCH}


def train_and_save(save_dir, n, stage, batches, grouping=FLAT):
    """n ranks train STEPS_BEFORE steps at `stage` and save a checkpoint into save_dir (made here)."""
    os.makedirs(save_dir)

    def rank(comm):
        engine = make_engine(stage, SIZES, np.float64, comm, BATCH, grouping=grouping)
        engine.init_params(0)
        run_steps(engine, batches[:STEPS_BEFORE])
        assert save_checkpoint(engine, save_dir, STATE, keep_last=0)[0] is None
    run_ranks(rank, n)


def resume_and_train(save_dir, n, stage, batches, grouping=FLAT):
    """n ranks load save_dir's latest checkpoint at `stage` and train the other steps: the
    consolidated layers (every rank gathers the same)."""
    def rank(comm):
        engine = make_engine(stage, SIZES, np.float64, comm, BATCH, grouping=grouping)
        state = load_checkpoint(engine, latest_checkpoint(save_dir))
        assert state["step"] == STEPS_BEFORE and engine.stage.adam.t == STEPS_BEFORE
        run_steps(engine, batches[STEPS_BEFORE:])
        return consolidated(engine)
    return run_ranks(rank, n)[0]


def assert_matches(got, want, what):
    for (w, b), (w_ref, b_ref) in zip(got, want):
        for tensor, tensor_ref in ((w, w_ref), (b, b_ref)):
            assert np.max(np.abs(tensor - tensor_ref)) <= 1e-12 * np.max(np.abs(tensor_ref)), what


def destinations(n_src, stage_src):
    """Every stage' for every source, each at another N' (over the five sources of a stage, each
    stage' meets every N' in 1..5)."""
    return [((n_src + stage_dst) % 5 + 1, stage_dst) for stage_dst in range(4)]


@pytest.mark.parametrize("stage_src", [0, 1, 2, 3])
def test_resharded_resume_matches_the_uninterrupted_run(stage_src, tmp_path):
    batches = make_batches(SIZES, STEPS_BEFORE + STEPS_AFTER, rows=BATCH)
    want, _, _ = adamw_train(initial_weights(SIZES, 0), batches, LR, WEIGHT_DECAY)
    for n_src in RANK_COUNTS:
        save_dir = tmp_path / f"stage{stage_src}-n{n_src}"
        train_and_save(save_dir, n_src, stage_src, batches)
        for n_dst, stage_dst in destinations(n_src, stage_src):
            assert_matches(resume_and_train(save_dir, n_dst, stage_dst, batches), want,
                           f"saved at N={n_src} stage {stage_src}, resumed at N={n_dst} stage {stage_dst}")


def test_stage_3_reads_only_its_own_ranges(tmp_path, monkeypatch):
    """A stage-3 rank loading a checkpoint touches only the elements it will hold: counted at the
    reader, the total over ranks equals the model's state once, not N times."""
    from zerompi.checkpoint import reader
    batches = make_batches(SIZES, STEPS_BEFORE + STEPS_AFTER, rows=BATCH)
    train_and_save(tmp_path / "stage3", 2, 3, batches)
    read = []
    original = reader.CheckpointReader.read_range

    def counting_read_range(self, layer_index, kind, lo, hi, dtype):
        read.append(min(hi, self.layers[layer_index]["numel"]) - min(lo, self.layers[layer_index]["numel"]))
        return original(self, layer_index, kind, lo, hi, dtype)

    monkeypatch.setattr(reader.CheckpointReader, "read_range", counting_read_range)
    run_ranks(lambda comm: load_checkpoint(make_engine(3, SIZES, np.float64, comm, BATCH),
                                           latest_checkpoint(tmp_path / "stage3")), 2)
    num_params = sum((n_in + 1) * n_out for n_in, n_out in zip(SIZES, SIZES[1:]))
    assert sum(read) == 3 * num_params        # params, m, v: each element read once over both ranks
