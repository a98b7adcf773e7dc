"""Checkpoints written under hybrid sharding or hpZ load under any N, stage and grouping, and flat
checkpoints load into them: the continued run matches the uninterrupted single-process AdamW run
(float64, 1e-12 relative). Hybrid sharding writes the shards of its first group (the manifest's
"ranks" is S); hpZ writes stage 3's shards over all N (its secondary copy is rebuilt by the
next forward). On in-process ranks, as tests/proofs/test_checkpoint_resumes_on_any_n_and_stage.py.
"""
import os

import pytest

from helpers import LR, WEIGHT_DECAY, make_batches
from reference import adamw_train, initial_weights
from test_checkpoint_resumes_on_any_n_and_stage import (BATCH, SIZES, STEPS_AFTER, STEPS_BEFORE, assert_matches,
                                                        resume_and_train, train_and_save)
from zerompi.checkpoint.manifest import read_manifest
from zerompi.checkpoint.find import latest_checkpoint
from zerompi.hierarchy import FLAT, Grouping

HYBRID, HPZ = Grouping(shard_group=2), Grouping(hpz_node_size=2)
# (N, stage, grouping): the writers, and the runs that continue from each
RUNS = [(4, 1, HYBRID), (4, 2, HYBRID), (4, 3, HYBRID), (4, 3, HPZ), (2, 3, Grouping(shard_group=1)),
        (3, 0, FLAT), (1, 2, FLAT), (4, 3, FLAT)]


@pytest.mark.parametrize("source", RUNS, ids=lambda r: f"n{r[0]}-stage{r[1]}-S{r[2].shard_group}-L{r[2].hpz_node_size}")
def test_resume_across_groupings_matches_the_uninterrupted_run(source, tmp_path):
    batches = make_batches(SIZES, STEPS_BEFORE + STEPS_AFTER, rows=BATCH)
    want, _, _ = adamw_train(initial_weights(SIZES, 0), batches, LR, WEIGHT_DECAY)
    n_src, stage_src, grouping_src = source
    save_dir = tmp_path / "checkpoints"
    train_and_save(save_dir, n_src, stage_src, batches, grouping_src)
    manifest = read_manifest(latest_checkpoint(save_dir))
    assert manifest["ranks"] == (grouping_src.shard_group or n_src)
    assert len(os.listdir(latest_checkpoint(save_dir))) == 1 + manifest["ranks"] * len(manifest["kinds"])
    for n_dst, stage_dst, grouping_dst in RUNS:
        if (n_dst, stage_dst, grouping_dst) != source:
            assert_matches(resume_and_train(save_dir, n_dst, stage_dst, batches, grouping_dst), want,
                           f"resumed at N={n_dst} stage {stage_dst} {grouping_dst}")
