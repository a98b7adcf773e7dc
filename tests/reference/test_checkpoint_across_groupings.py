"""Checkpoints written under hybrid sharding or hpZ load under any N, stage and grouping, and flat
checkpoints load into them: the continued run matches the uninterrupted single-process AdamW run
(float64, 1e-12 relative). Hybrid sharding writes the shards of its first group (the manifest's
"ranks" is S); hpZ writes stage 3's shards over all N (its secondary copy is rebuilt by the
next forward).
"""
import os

import numpy as np
import pytest
from mpi4py import MPI

from helpers import LR, WEIGHT_DECAY, consolidated, make_batches, make_engine, run_steps
from reference import adamw_train, initial_weights
from test_checkpoint_resumes_on_any_n_and_stage import BATCH, SIZES, STEPS_AFTER, STEPS_BEFORE, sub_communicator
from zerompi.checkpoint import load_checkpoint, save_checkpoint
from zerompi.checkpoint.manifest import read_manifest
from zerompi.checkpoint.find import latest_checkpoint
from zerompi.hierarchy import FLAT, Grouping

HYBRID, HPZ = Grouping(shard_group=2), Grouping(hpz_node_size=2)
# (N, stage, grouping): the writers, and the runs that continue from each
RUNS = [(4, 1, HYBRID), (4, 2, HYBRID), (4, 3, HYBRID), (4, 3, HPZ), (2, 3, Grouping(shard_group=1)),
        (3, 0, FLAT), (1, 2, FLAT), (4, 3, FLAT)]


@pytest.mark.mpi(min_size=4)
@pytest.mark.parametrize("source", RUNS, ids=lambda r: f"n{r[0]}-stage{r[1]}-S{r[2].shard_group}-L{r[2].hpz_node_size}")
def test_resume_across_groupings_matches_the_uninterrupted_run(source, shared_folder):
    batches = make_batches(SIZES, STEPS_BEFORE + STEPS_AFTER, rows=BATCH)
    want, _, _ = adamw_train(initial_weights(SIZES, 0), batches, LR, WEIGHT_DECAY)
    n_src, stage_src, grouping_src = source
    save_dir = os.path.join(shared_folder, f"n{n_src}-stage{stage_src}-S{grouping_src.shard_group}"
                                           f"-L{grouping_src.hpz_node_size}")
    comm = sub_communicator(n_src)
    if comm is not None:
        if comm.rank == 0:
            os.makedirs(save_dir)
        comm.mpi.Barrier()
        engine = make_engine(stage_src, SIZES, np.float64, comm, BATCH, grouping=grouping_src)
        engine.init_params(0)
        run_steps(engine, batches[:STEPS_BEFORE])
        state = {"step": STEPS_BEFORE, "loss_scale": 1.0, "loss_scale_good_steps": 0, "seed": 0,
                 "shuffle": True, "batch_size": BATCH}
        assert save_checkpoint(engine, save_dir, state, keep_last=0)[0] is None
        if comm.rank == 0:
            manifest = read_manifest(latest_checkpoint(save_dir))
            assert manifest["ranks"] == (grouping_src.shard_group or n_src)
            assert len(os.listdir(latest_checkpoint(save_dir))) == 1 + manifest["ranks"] * len(manifest["kinds"])
    MPI.COMM_WORLD.Barrier()
    for n_dst, stage_dst, grouping_dst in RUNS:
        if (n_dst, stage_dst, grouping_dst) == source:
            continue
        comm = sub_communicator(n_dst)
        if comm is None:
            MPI.COMM_WORLD.Barrier()
            continue
        engine = make_engine(stage_dst, SIZES, np.float64, comm, BATCH, grouping=grouping_dst)
        state = load_checkpoint(engine, latest_checkpoint(save_dir))
        assert state["step"] == STEPS_BEFORE and engine.stage.adam.t == STEPS_BEFORE
        run_steps(engine, batches[STEPS_BEFORE:])
        for (w, b), (w_ref, b_ref) in zip(consolidated(engine), want):
            for tensor, tensor_ref in ((w, w_ref), (b, b_ref)):
                assert np.max(np.abs(tensor - tensor_ref)) <= 1e-12 * np.max(np.abs(tensor_ref))
        comm.mpi.Free()
        MPI.COMM_WORLD.Barrier()
