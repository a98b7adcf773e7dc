"""An output path that is an input, by any name, is refused before anything is written
(zerompi/train/options/config_checks.py): --save-weights, --metrics, --trace and --save-dir against
--data, --init-weights, --config and --deepspeed-config."""
import os

import numpy as np
import pytest

from zerompi.train.options.config import parse_args
from zerompi.train.options.config_checks import check_config


@pytest.fixture
def inputs(tmp_path, monkeypatch):
    """A data file, a weights file, a TOML and a DeepSpeed config in tmp_path, the current folder."""
    monkeypatch.chdir(tmp_path)
    np.savez("data.npz", x=np.zeros((4, 2)), y=np.zeros(4, dtype=np.int64))
    np.savez("w.npz", a=np.zeros(1))
    (tmp_path / "run.toml").write_text("steps = 3\n")
    (tmp_path / "ds.json").write_text('{"steps_per_print": 5}')
    return tmp_path


def verdict(*argv):
    return check_config(parse_args(list(argv)), 1)


@pytest.mark.parametrize("output", ["--save-weights", "--metrics", "--trace"])
def test_an_output_that_is_the_data_file_is_refused(inputs, output):
    assert verdict("--data", "data.npz", output, "data.npz") == (
        f"{output} data.npz is --data data.npz: writing it would destroy the input; choose another path")


def test_every_input_is_protected(inputs):
    assert "is --init-weights w.npz" in verdict("--init-weights", "w.npz", "--save-weights", "w.npz")
    assert "is --config run.toml" in verdict("--config", "run.toml", "--metrics", "run.toml")
    assert "is --deepspeed-config ds.json" in verdict("--deepspeed-config", "ds.json", "--trace", "ds.json")
    assert "is --config ds.json" in verdict("--config", "ds.json", "--save-weights", "ds.json")


def test_the_same_file_by_another_name_is_refused(inputs):
    os.symlink("data.npz", "link.npz")
    os.link("data.npz", "hard.npz")
    os.mkdir("sub")
    for name in ("link.npz", "hard.npz", "sub/../data.npz", str(inputs / "data.npz")):
        assert "writing it would destroy the input" in verdict("--data", "data.npz", "--metrics", name), name
    assert "writing it would destroy" in verdict("--data", "link.npz", "--save-weights", "hard.npz")


def test_a_save_dir_that_is_or_holds_an_input_is_refused(inputs):
    os.mkdir("ck")
    np.savez("ck/data.npz", x=np.zeros((4, 2)), y=np.zeros(4, dtype=np.int64))
    assert verdict("--data", "ck/data.npz", "--save-dir", "ck") == (
        "--save-dir ck holds --data ck/data.npz: checkpoints are written and rotated there; keep the inputs "
        "outside it")
    assert "--save-dir . holds --init-weights w.npz" in verdict("--init-weights", "w.npz", "--save-dir", ".")
    assert "--save-dir data.npz holds --data data.npz" in verdict("--data", "data.npz", "--save-dir", "data.npz")


def test_two_outputs_on_one_path_are_refused(inputs):
    """--metrics and --trace on one file: the trace's rename would replace the metrics (or the
    weights) at the end of the run."""
    assert verdict("--metrics", "out.json", "--trace", "out.json") == (
        "--metrics out.json and --trace out.json are one file: give each output its own path")
    os.mkdir("sub")
    assert "are one file" in verdict("--save-weights", "w2.npz", "--trace", "sub/../w2.npz")
    os.symlink("w3.npz", "link.npz")                         # a link to a file that does not exist yet
    assert "are one file" in verdict("--save-weights", "link.npz", "--metrics", "w3.npz")


@pytest.mark.parametrize("output", ["ck/step_00000004/manifest.json", "ck/step_00000004/rank00000.params.npy",
                                    "ck/latest", "ck/.lock", "ck/.partial-step_00000006/x", "ck/step_00000009"])
@pytest.mark.parametrize("flag", ["--metrics", "--save-weights", "--trace"])
def test_an_output_onto_the_checkpoints_is_refused(inputs, flag, output):
    """--metrics ck/step_K/manifest.json with --resume destroyed the checkpoint just resumed from
    (exit 0); --save-weights ck/.lock overwrote the lock."""
    os.makedirs("ck/step_00000004")
    for name in ("manifest.json", "rank00000.params.npy"):
        (inputs / "ck" / "step_00000004" / name).write_text("{}")
    with_save_dir = verdict("--save-dir", "ck", "--resume", flag, output)
    assert with_save_dir and "would replace" in with_save_dir and "ck" in with_save_dir, with_save_dir
    if output.startswith("ck/step_00000004/"):
        from_folder = verdict("--resume", "ck/step_00000004", flag, output)
        assert from_folder and "would replace" in from_folder, from_folder
    assert verdict("--save-dir", "ck", flag, "ck/notes.npz") is None        # beside the checkpoints: fine


def test_other_paths_are_fine(inputs):
    os.mkdir("ck")
    assert verdict("--data", "data.npz", "--init-weights", "w.npz", "--config", "run.toml", "--save-weights",
                   "out.npz", "--metrics", "m.jsonl", "--trace", "t.json", "--save-dir", "ck") is None
    np.savez("digits.npz", a=np.zeros(1))                    # --data digits is the shipped set, not a file
    assert verdict("--data", "digits", "--save-weights", "digits.npz") is None
    assert verdict("--data", "missing.npz", "--save-weights", "missing.npz") is None   # the load reports it


@pytest.mark.parametrize("name", ["w.safetensors", "w.NPZ", "weights"])
def test_save_weights_must_be_named_as_the_npz_it_writes(tmp_path, monkeypatch, name):
    """--save-weights writes a consolidated .npz; --init-weights picks its reader by the suffix,
    so an .npz under another name could not be read back as what its name says."""
    monkeypatch.chdir(tmp_path)
    assert verdict("--save-weights", name) == (
        f"--save-weights {name} writes a consolidated .npz, so its name must end in .npz (for safetensors: "
        f"--save-dir, then python -m zerompi.checkpoint export CKPT OUT.safetensors)")
    assert verdict("--save-weights", "w.npz") is None


@pytest.mark.parametrize("checkpoint_file", ["ck/step_00000004/manifest.json", "ck/step_00000004/rank00000.params.npy",
                                             "ck/latest", "ck/.partial-step_00000006/x"])
@pytest.mark.parametrize("flag", ["--metrics", "--save-weights", "--trace"])
def test_an_output_hard_linked_to_a_checkpoint_file_is_refused(inputs, flag, checkpoint_file):
    """`ln ck/step_00000004/manifest.json m.jsonl` and --resume --metrics m.jsonl appended the
    metrics into the checkpoint being resumed (exit 0): outputs were compared with the checkpoints
    by path only."""
    os.makedirs("ck/step_00000004")
    os.makedirs("ck/.partial-step_00000006")
    for name in ("step_00000004/manifest.json", "step_00000004/rank00000.params.npy", "latest",
                 ".partial-step_00000006/x"):
        (inputs / "ck" / name).write_text("{}")
    os.link(checkpoint_file, "out.npz")
    line = verdict("--save-dir", "ck", "--resume", flag, "out.npz")
    assert line == (f"{flag} out.npz is {checkpoint_file} (a hard link): writing it would destroy the checkpoint "
                    f"file; choose another path"), line
    if checkpoint_file.startswith("ck/step_00000004/"):
        line = verdict("--resume", "ck/step_00000004", flag, "out.npz")
        assert line and f"is {checkpoint_file} (a hard link)" in line, line
    os.unlink("out.npz")
    os.link("w.npz", "out.npz")                                    # another name of a file that is no checkpoint's
    assert verdict("--save-dir", "ck", "--resume", flag, "out.npz") is None


@pytest.mark.parametrize("flag", ["--metrics", "--save-weights", "--trace"])
def test_an_output_into_a_step_folder_linked_from_elsewhere_is_refused(inputs, flag):
    """A step folder moved to another disk and linked back: --metrics elsewhere/ckpt4/manifest.json
    with plain --resume wrote into the checkpoint being resumed (exit 0)."""
    os.makedirs("elsewhere/ckpt4")
    (inputs / "elsewhere" / "ckpt4" / "manifest.json").write_text("{}")
    os.makedirs("ck")
    os.symlink("../elsewhere/ckpt4", "ck/step_00000004")
    line = verdict("--save-dir", "ck", "--resume", flag, "elsewhere/ckpt4/manifest.json")
    assert line == (f"{flag} elsewhere/ckpt4/manifest.json would replace ck/step_00000004, which the checkpoints "
                    f"there need: write it elsewhere"), line
    assert verdict("--save-dir", "ck", "--resume", flag, "elsewhere/notes.npz") is None
