"""Sharded checkpoints on disk: reading ranges, rejecting bad checkpoints, export, a full disk.

Single-process tests of zerompi.checkpoint.files / load / export / __main__ on real checkpoints:
a module fixture runs the real CLI once per writer (`mpirun -n 2 python -m zerompi.train ...
--save-dir ck`, float32 and bf16; and float32 on 3 ranks, whose shard boundaries are not the
halves: an off-by-one at a boundary reads right from 2 ranks' files), and every test works on its
own copy of the folder (shutil.copytree).

    read_range        any element range, across the writers' rank boundaries, equals the
                      consolidated weights (`python -m zerompi.checkpoint consolidate`, the run's
                      --save-weights) and an independent reading of the .npy shard files;
                      padding positions read as 0 even when the file holds something else there
    bad checkpoints   each gives CheckpointError naming the file and the problem, from
                      load_checkpoint (an in-process engine on a 1-rank COMM_WORLD) and from
                      `python -m zerompi.checkpoint inspect` (exit 2, one line on stderr);
                      nothing in the checkpoint folder changes
    export            safetensors that the `safetensors` package reads (float32) and zerompi's own
                      reader reads (bfloat16), values equal to the checkpoint's, metadata with the
                      step; `--init-weights model.safetensors` starts a run from those weights
    full disk         a real ENOSPC (a 64 KiB tmpfs): exit 2, one line naming the folder and "No
                      space left", and the previous complete checkpoint untouched and still usable
"""
import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
import zlib
from typing import NamedTuple

import ml_dtypes
import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file

from test_cli import ERROR_MARK, launch, load_weights, train_ok
from zerompi.adam import AdamConfig
from zerompi.checkpoint import CheckpointError, latest_checkpoint, load_checkpoint
from zerompi.checkpoint.reader import CheckpointReader
from zerompi.stages.params import full_layer_params
from zerompi.comm import Communicator
from zerompi.engine import build_engine
from zerompi.precision import precision_for
from zerompi.checkpoint.safetensors_io import read_header, read_tensor

BF16 = np.dtype(ml_dtypes.bfloat16)
SIZES = [64, 9, 7, 10]                       # the digits (the default data): 64 features, 10 classes
COMMON = ["--hidden", "9,7", "--batch-size", 12, "--report", "none",
          "--log-every", 0]
STEP = "step_00000006"
TOOL_TIMEOUT = 60
class Writer(NamedTuple):
    dtype: str
    stage: int
    kinds: tuple                 # the kinds of state written
    ranks: int


# the checkpoints of the fixture, by name
WRITERS = {"float32": Writer("float32", 3, ("params", "m", "v"), 2),
           "bf16": Writer("bf16", 1, ("params", "master", "m", "v"), 2),
           "float32-3-ranks": Writer("float32", 3, ("params", "m", "v"), 3)}


# ----------------------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """writer's name -> a folder holding ck/ (checkpoints at steps 3 and 6) and w.npz."""
    root = tmp_path_factory.mktemp("checkpoints")
    out = {}
    for name, writer in WRITERS.items():
        folder = root / name
        folder.mkdir()
        train_ok(writer.ranks, "--stage", writer.stage, "--dtype", writer.dtype, "--steps", 6, "--save-every", 3,
                 *COMMON, "--save-dir", "ck", "--save-weights", "w.npz", cwd=folder)
        assert sorted(os.listdir(folder / "ck")) == ["latest", "step_00000003", STEP]
        out[name] = folder
    return out


def copy_of(checkpoints, dtype, tmp_path):
    """A private copy of the fixture's save dir; returns its path (tmp_path/ck)."""
    target = tmp_path / "ck"
    shutil.copytree(checkpoints[dtype] / "ck", target)
    return target


def checkpoint_tool(*args, cwd):
    """`python -m zerompi.checkpoint *args` -> CompletedProcess (never hangs)."""
    return subprocess.run([sys.executable, "-m", "zerompi.checkpoint", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=TOOL_TIMEOUT, stdin=subprocess.DEVNULL)


def describe(result):
    return f"exit {result.returncode}\n--- stdout ---\n{result.stdout}\n--- stderr ---\n{result.stderr}"


def snapshot(folder):
    """{relative path: file bytes, or None for a folder} of everything under folder."""
    out = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs:
            out[os.path.relpath(os.path.join(root, name), folder)] = None
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, folder)] = f.read()
    return out


def manifest_of(folder):
    with open(os.path.join(folder, "manifest.json")) as f:
        return json.load(f)


CHECKSUM = "manifest_sha256"


def seal(manifest):
    """Give the manifest the checksum of its content, computed as docs/checkpoints.md describes
    (independently of zerompi.checkpoint): what someone who edits a manifest on purpose can do."""
    body = {key: value for key, value in manifest.items() if key != CHECKSUM}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    manifest[CHECKSUM] = hashlib.sha256(canonical.encode("ascii")).hexdigest()


def edit_manifest(folder, edit, sealed=True):
    """Apply edit(manifest) to the folder's manifest; sealed: with a recomputed checksum, so that
    only the check under test can refuse it."""
    manifest = manifest_of(folder)
    edit(manifest)
    if sealed:
        seal(manifest)
    with open(os.path.join(folder, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)


def oracle_flat(folder, layer_index, kind):
    """Layer layer_index's padded flat buffer of one kind of state, read independently of
    zerompi.checkpoint: np.load of every rank's shard file (named by the documented pattern)
    and the writer's shard layout from the manifest."""
    m = manifest_of(folder)
    layer = m["units"][layer_index]
    parts = []
    for rank in range(m["ranks"]):
        data = np.load(os.path.join(folder, f"rank{rank:05d}.{kind}.npy"), allow_pickle=False)
        parts.append(data[layer["shard_offset"]:layer["shard_offset"] + layer["shard_size"]])
    flat = np.concatenate(parts)
    assert flat.size == layer["padded"]
    return flat.view(BF16) if m["kinds"][kind] == "bfloat16" else flat


def as_flat(weights, layer_index):
    return np.concatenate([weights[f"layers.{layer_index}.weight"].ravel(),
                           weights[f"layers.{layer_index}.bias"]])


def same_bits(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def fresh_engine(sizes=SIZES, stage=0, dtype="float32"):
    """An engine on this process's COMM_WORLD (one rank): it holds every element of the model."""
    return build_engine(sizes, stage, precision_for(dtype), AdamConfig(), 4, Communicator())


# ----------------------------------------------------------------------------------------------
# read_range
# ----------------------------------------------------------------------------------------------

def ranges_to_check(layer, rng, count=40):
    """Every kind of range: whole layer, around each writer-rank boundary, the padding, random."""
    shard, numel, padded = layer["shard_size"], layer["numel"], layer["padded"]
    out = [(0, padded), (0, numel), (0, 1), (padded - 1, padded), (numel - 1, padded)]
    for boundary in range(shard, padded, shard):
        out += [(boundary - 1, boundary + 1), (boundary - 5, min(padded, boundary + 7)), (boundary, padded)]
    for _ in range(count):
        lo = int(rng.integers(0, padded))
        out.append((lo, int(rng.integers(lo + 1, padded + 1))))
    return out


@pytest.mark.parametrize("name", list(WRITERS))
def test_read_range_reproduces_consolidated_weights_and_state_across_rank_boundaries(name, checkpoints,
                                                                                     tmp_path):
    save_dir = copy_of(checkpoints, name, tmp_path)
    folder = save_dir / STEP
    result = checkpoint_tool("consolidate", "ck", "consolidated.npz", cwd=tmp_path)
    assert result.returncode == 0, describe(result)
    consolidated = load_weights(tmp_path / "consolidated.npz")
    saved = load_weights(checkpoints[name] / "w.npz")        # the run's own --save-weights
    assert sorted(consolidated) == sorted(saved) == sorted(f"layers.{i}.{t}" for i in range(3)
                                                          for t in ("weight", "bias"))
    for tensor in saved:
        assert same_bits(consolidated[tensor], saved[tensor]), tensor
        assert consolidated[tensor].dtype == np.float32      # bf16 widened exactly

    reader = CheckpointReader(str(folder))
    stage, kinds = WRITERS[name].stage, WRITERS[name].kinds
    assert sorted(reader.kinds) == sorted(kinds)
    assert reader.manifest["ranks"] == WRITERS[name].ranks and reader.manifest["stage"] == stage
    assert any(u["padded"] > u["numel"] for u in reader.layers)       # the fixture has padding
    rng = np.random.default_rng(0)
    for index, layer in enumerate(reader.layers):
        numel, padded = layer["numel"], layer["padded"]
        want = {"params": np.zeros(padded, np.float64)}
        want["params"][:numel] = as_flat(saved, index)
        for kind in kinds:
            oracle = oracle_flat(folder, index, kind).astype(np.float64)
            oracle[numel:] = 0
            if kind == "params":
                assert np.array_equal(oracle, want["params"]), f"layer {index}: shard files vs w.npz"
            want[kind] = oracle
        for lo, hi in ranges_to_check(layer, rng):
            for kind in kinds:
                got = reader.read_range(index, kind, lo, hi, reader.kinds[kind])
                assert got.dtype == reader.kinds[kind] and got.shape == (hi - lo,)
                assert np.array_equal(got.astype(np.float64), want[kind][lo:hi]), (index, kind, lo, hi)
            wide = reader.read_range(index, "params", lo, hi, np.float64)       # converted on the way
            assert np.array_equal(wide, want["params"][lo:hi]), (index, lo, hi)
    if WRITERS[name].dtype == "bf16":      # the stored 16-bit parameters are the master, rounded
        for index, _ in enumerate(reader.layers):
            master = reader.read_range(index, "master", 0, reader.layers[index]["numel"], np.float32)
            params = reader.read_range(index, "params", 0, reader.layers[index]["numel"], BF16)
            assert same_bits(master.astype(BF16), params), index


def test_padding_reads_as_zero_whatever_the_file_holds_there(checkpoints, tmp_path):
    """Put 7.0 into layer 0's padding element on disk (and fix its CRC): read_range still gives 0."""
    folder = copy_of(checkpoints, "float32", tmp_path) / STEP
    m = manifest_of(folder)
    layer = m["units"][0]
    assert layer["padded"] == layer["numel"] + 1 and layer["numel"] > layer["shard_size"]  # 297 -> 298
    position = layer["shard_offset"] + layer["numel"] - layer["shard_size"]   # in rank 1's file
    path = folder / "rank00001.params.npy"
    data = np.load(path)
    assert data[position] == 0.0
    data[position] = 7.0
    np.save(path, data)
    entry = next(f for f in m["files"] if f["rank"] == 1 and f["kind"] == "params")
    with open(path, "rb") as f:
        f.seek(entry["data_offset"])
        raw = f.read()
    assert len(raw) == entry["data_bytes"]
    edit_manifest(folder, lambda man: next(f for f in man["files"] if f["rank"] == 1
                                           and f["kind"] == "params").__setitem__("crc32", [zlib.crc32(raw)]))
    reader = CheckpointReader(str(folder))
    got = reader.read_range(0, "params", layer["numel"] - 3, layer["padded"], np.float32)
    assert got[-1] == 0.0 and np.all(got[:3] != 0.0)
    assert reader.read_range(0, "params", layer["numel"], layer["padded"], np.float32).tolist() == [0.0]


def test_crc_is_checked_per_block_a_read_touches(checkpoints, tmp_path):
    """A manifest re-cut into 64-byte blocks (CRCs recomputed): a flipped byte in block 2 of rank
    0's params fails exactly the reads that touch block 2."""
    folder = copy_of(checkpoints, "float32", tmp_path) / STEP
    block = 64

    def recut(man):
        man["block_bytes"] = block
        for entry in man["files"]:
            with open(folder / entry["path"], "rb") as f:
                f.seek(entry["data_offset"])
                raw = f.read()
            entry["crc32"] = [zlib.crc32(raw[i:i + block]) for i in range(0, len(raw), block)]
    edit_manifest(folder, recut)
    offset = manifest_of(folder)["files"][0]["data_offset"]
    assert manifest_of(folder)["files"][0]["path"] == "rank00000.params.npy"
    with open(folder / "rank00000.params.npy", "r+b") as f:
        f.seek(offset + 2 * block + 5)                   # float32 element 33 (block 2: 32..47)
        byte = f.read(1)
        f.seek(offset + 2 * block + 5)
        f.write(bytes([byte[0] ^ 0x40]))
    reader = CheckpointReader(str(folder))
    assert reader.read_range(0, "params", 0, 32, np.float32).size == 32          # blocks 0, 1
    assert reader.read_range(0, "params", 48, 149, np.float32).size == 101       # blocks 3..
    with pytest.raises(CheckpointError, match=r"rank00000\.params\.npy: checksum mismatch in block 2"):
        reader.read_range(0, "params", 47, 49, np.float32)
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        CheckpointReader(str(folder)).read_range(0, "params", 33, 34, np.float32)


def test_load_into_one_rank_engine_gives_the_checkpointed_state(checkpoints, tmp_path):
    """The positive control of the bad-checkpoint cases: the untouched copy loads."""
    for name, writer in WRITERS.items():
        save_dir = copy_of(checkpoints, name, tmp_path / name)
        folder = latest_checkpoint(str(save_dir))
        assert folder == os.path.join(str(save_dir), STEP)
        engine = fresh_engine(dtype=writer.dtype)
        state = load_checkpoint(engine, folder)
        expected = {"step": 6, "loss_scale": 1.0, "loss_scale_good_steps": 0, "seed": 0, "shuffle": True,
                    "batch_size": 12}
        assert {key: state.get(key) for key in expected} == expected, state
        assert engine.stage.adam.t == 6
        saved = load_weights(checkpoints[name] / "w.npz")
        for layer in engine.layout.layers:
            full = full_layer_params(engine.stage, layer)
            assert np.array_equal(full.astype(np.float64), as_flat(saved, layer.index)), (name, layer.index)
            state_slice = engine.stage.owned(layer).state
            for kind, array in (("m", engine.stage.adam.m), ("v", engine.stage.adam.v)):
                want = oracle_flat(folder, layer.index, kind)[:layer.numel]
                assert same_bits(array[state_slice], want), (name, kind, layer.index)


# ----------------------------------------------------------------------------------------------
# Bad checkpoints: a CheckpointError naming the file and the problem; nothing changed
# ----------------------------------------------------------------------------------------------

def _truncate(save_dir):
    path = save_dir / STEP / "rank00001.m.npy"
    os.truncate(path, os.path.getsize(path) - 10)


def _flip_byte(save_dir):
    folder = save_dir / STEP
    offset = manifest_of(folder)["files"][0]["data_offset"]       # rank 0's params
    with open(folder / "rank00000.params.npy", "r+b") as f:
        f.seek(offset + 101)
        byte = f.read(1)
        f.seek(offset + 101)
        f.write(bytes([byte[0] ^ 0x01]))


def _invalid_json(save_dir):
    path = save_dir / STEP / "manifest.json"
    text = path.read_text()
    path.write_text(text[:len(text) // 2])


def _manifest_edit(edit):
    return lambda save_dir: edit_manifest(save_dir / STEP, edit)


def _path_parent(save_dir):
    # a real, valid copy of the file sits at ../x.npy: only the path check can refuse it
    shutil.copy(save_dir / STEP / "rank00000.params.npy", save_dir / "x.npy")
    edit_manifest(save_dir / STEP, lambda m: m["files"][0].__setitem__("path", "../x.npy"))


def _latest_outside(save_dir):
    # a complete checkpoint really is at ../elsewhere: only the pointer check can refuse it
    shutil.copytree(save_dir / STEP, save_dir.parent / "elsewhere")
    (save_dir / "latest").write_text("../elsewhere\n")


def _set(key, value, where=lambda m: m):
    return _manifest_edit(lambda m: where(m).__setitem__(key, value))


BAD_CHECKPOINTS = [
    # id, make it bad, the file the message must name, what it must say
    ("truncated-shard", _truncate, f"{STEP}/rank00001.m.npy", "truncated"),
    ("flipped-byte", _flip_byte, f"{STEP}/rank00000.params.npy", "checksum mismatch"),
    ("manifest-invalid-json", _invalid_json, f"{STEP}/manifest.json", "not a readable manifest"),
    ("layer-padded-changed", _manifest_edit(lambda m: m["units"][1].__setitem__("padded", 72)),
     f"{STEP}/manifest.json", "inconsistent layout"),
    ("file-path-parent", _path_parent, f"{STEP}/manifest.json", "'../x.npy' leaves the checkpoint folder"),
    ("file-path-absolute", _manifest_edit(lambda m: m["files"][3].__setitem__("path", "/etc/passwd")),
     f"{STEP}/manifest.json", "'/etc/passwd' leaves the checkpoint folder"),
    ("crc-list-too-long", _manifest_edit(lambda m: m["files"][2]["crc32"].append(12345)),
     f"{STEP}/manifest.json", "2 checksums for 1 blocks"),
    ("crc-list-empty", _manifest_edit(lambda m: m["files"][4].__setitem__("crc32", [])),
     f"{STEP}/manifest.json", "0 checksums for 1 blocks"),
    ("wrong-format", _set("format", "something-else"), f"{STEP}/manifest.json", "format 'something-else'"),
    ("wrong-version", _set("version", 3), f"{STEP}/manifest.json", "version 3"),
    ("missing-rank-file", lambda d: os.unlink(d / STEP / "rank00001.v.npy"), f"{STEP}/rank00001.v.npy",
     "missing"),
    ("missing-manifest", lambda d: os.unlink(d / STEP / "manifest.json"), f"{STEP}/manifest.json", "missing"),
    ("manifest-missing-key", _manifest_edit(lambda m: m.pop("units")), f"{STEP}/manifest.json",
     "malformed manifest"),
    ("parent-outside", _set("parent", "../victim"), f"{STEP}/manifest.json", "parent '../victim'"),
    ("parent-dot", _set("parent", "."), f"{STEP}/manifest.json", "parent '.'"),
    ("parent-absolute", lambda d: _set("parent", str(d.resolve() / "victim"))(d), f"{STEP}/manifest.json",
     "victim' is not a checkpoint folder name"),
    ("parent-through-a-step", _set("parent", "step_00000003/../../victim"), f"{STEP}/manifest.json",
     "parent 'step_00000003/../../victim'"),
    ("manifest-nested-deep", lambda d: (d / STEP / "manifest.json").write_text("[" * 100000 + "]" * 100000),
     f"{STEP}/manifest.json", "not a readable manifest"),
]

# Hand-edits that only a consistency check of the manifest's numbers catches:
MANIFEST_GAPS = [
    pytest.param("block-bytes-zero", _set("block_bytes", 0), f"{STEP}/manifest.json", "block"),
    pytest.param("layer-numel-changed", _manifest_edit(lambda m: m["units"][0].__setitem__("numel", 296)),
                 f"{STEP}/manifest.json", "numel"),
    pytest.param("layer-shard-offset-changed",
                 _manifest_edit(lambda m: m["units"][1].__setitem__("shard_offset", 150)),
                 f"{STEP}/manifest.json", "shard"),
    pytest.param("adam-steps-not-a-number", _set("adam_steps", "six"), f"{STEP}/manifest.json", "adam_steps"),
    pytest.param("restarts-beyond-any-count", _set("restarts", 10 ** 400), f"{STEP}/manifest.json", "restarts"),
    pytest.param("step-beyond-any-count", _set("step", 2 ** 64), f"{STEP}/manifest.json", "step"),
]


@pytest.mark.parametrize("make_bad, names_file, says",
                         [pytest.param(*case[1:], id=case[0]) for case in BAD_CHECKPOINTS] +
                         [pytest.param(*p.values[1:], id=p.values[0], marks=p.marks) for p in MANIFEST_GAPS])
def test_bad_checkpoint_is_refused_naming_the_file_and_changes_nothing(make_bad, names_file, says,
                                                                       checkpoints, tmp_path):
    save_dir = copy_of(checkpoints, "float32", tmp_path)
    make_bad(save_dir)
    before = snapshot(save_dir)

    # load: what `--resume` does on every rank (latest -> folder -> load into the engine)
    with pytest.raises(CheckpointError) as caught:
        load_checkpoint(fresh_engine(), latest_checkpoint(str(save_dir)))
    message = str(caught.value)
    assert "\n" not in message, message
    assert names_file in message and says in message, message

    # inspect: exit 2, one line on stderr, nothing on stdout
    result = checkpoint_tool("inspect", "ck", cwd=tmp_path)
    assert result.returncode == 2, describe(result)
    assert result.stdout == "", describe(result)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("zerompi.checkpoint: error: "), describe(result)
    assert names_file in lines[0] and says in lines[0], describe(result)

    assert snapshot(save_dir) == before, "refusing the checkpoint changed its folder"


def test_checkpoint_of_another_model_shape_is_refused(checkpoints, tmp_path):
    """Sizes differ: refused by load_checkpoint and by `--resume` on the CLI (every rank, exit 2,
    one line); inspect has no model to compare with, so it passes."""
    save_dir = copy_of(checkpoints, "float32", tmp_path)
    before = snapshot(save_dir)
    for sizes, stage in (([64, 8, 7, 10], 0), ([64, 9, 7], 3), ([64, 9, 7, 10, 10], 1)):
        with pytest.raises(CheckpointError) as caught:
            load_checkpoint(fresh_engine(sizes, stage), os.path.join(str(save_dir), STEP))
        message = str(caught.value)
        assert f"ck/{STEP}" in message and "sizes [64, 9, 7, 10]" in message and str(sizes) in message, message
    run = launch(2, "--stage", 2, "--steps", 8, *COMMON[2:], "--hidden", "8,7", "--resume", f"ck/{STEP}",
                 "--save-weights", "never.npz", cwd=tmp_path)
    assert run.returncode == 2, run.describe()
    assert run.output.count(ERROR_MARK) == 1 and "Traceback" not in run.output, run.describe()
    line = next(line for line in run.output.splitlines() if ERROR_MARK in line)
    assert f"ck/{STEP}" in line and "[64, 8, 7, 10]" in line, run.describe()
    assert not (tmp_path / "never.npz").exists()
    assert checkpoint_tool("inspect", "ck", cwd=tmp_path).returncode == 0
    assert snapshot(save_dir) == before


# ----------------------------------------------------------------------------------------------
# The manifest's checksum (format version 2); version 1 still loads
# ----------------------------------------------------------------------------------------------

UNSEALED_EDITS = [
    ("adam-steps", lambda m: m.__setitem__("adam_steps", 7)),
    ("step", lambda m: m.__setitem__("step", 7)),
    ("loss-scale", lambda m: m.__setitem__("loss_scale", 2.0)),
    ("checksum-removed", lambda m: m.pop(CHECKSUM, None)),
    ("checksum-of-something-else", lambda m: m.__setitem__(CHECKSUM, "0" * 64)),
    ("checksum-not-a-string", lambda m: m.__setitem__(CHECKSUM, 12345)),
]


@pytest.mark.parametrize("edit", [pytest.param(edit, id=name) for name, edit in UNSEALED_EDITS])
def test_a_hand_edited_version_2_manifest_is_refused_by_its_checksum(edit, checkpoints, tmp_path):
    save_dir = copy_of(checkpoints, "float32", tmp_path)
    assert manifest_of(save_dir / STEP)["version"] == 2
    edit_manifest(save_dir / STEP, edit, sealed=False)
    before = snapshot(save_dir)
    with pytest.raises(CheckpointError) as caught:
        load_checkpoint(fresh_engine(), str(save_dir / STEP))
    message = str(caught.value)
    assert "\n" not in message and f"{STEP}/manifest.json" in message and CHECKSUM in message, message
    result = checkpoint_tool("inspect", "ck", cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == "", describe(result)
    assert len(result.stderr.splitlines()) == 1 and CHECKSUM in result.stderr, describe(result)
    assert snapshot(save_dir) == before


def as_version_1(folder):
    """Rewrite a checkpoint's manifest as format version 1 wrote it: the same fields, no checksum."""
    edit_manifest(folder, lambda m: (m.pop(CHECKSUM, None), m.__setitem__("version", 1)), sealed=False)


def test_a_version_1_checkpoint_loads_and_says_its_manifest_is_not_verified(checkpoints, tmp_path):
    save_dir = copy_of(checkpoints, "float32", tmp_path)
    as_version_1(save_dir / STEP)
    state = load_checkpoint(fresh_engine(), str(save_dir / STEP))
    assert state["step"] == 6
    result = checkpoint_tool("inspect", "ck", cwd=tmp_path)
    assert result.returncode == 0 and "step 6 " in result.stdout, describe(result)
    lines = [line for line in result.stdout.splitlines() if "not verified" in line]
    assert len(lines) == 1 and "version 1" in lines[0] and f"{STEP}/manifest.json" in lines[0], describe(result)
    healthy = checkpoint_tool("inspect", "ck/step_00000003", cwd=tmp_path)
    assert healthy.returncode == 0 and "not verified" not in healthy.stdout, describe(healthy)


# ----------------------------------------------------------------------------------------------
# Sizes a manifest declares: checked against its own lists, the files and the memory first
# ----------------------------------------------------------------------------------------------

def memory_limit(limit_bytes):
    """For subprocess preexec_fn: an address-space limit, so that a runaway allocation fails at
    once instead of taking the machine's memory."""
    return lambda: resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))


def checkpoint_tool_limited(*args, cwd, limit=3 << 30):
    return subprocess.run([sys.executable, "-m", "zerompi.checkpoint", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=TOOL_TIMEOUT, stdin=subprocess.DEVNULL,
                          preexec_fn=memory_limit(limit))


def _claim_ranks(ranks):
    """A layout that is consistent for `ranks` writers (one element each), in a 2 kB manifest."""
    def edit(m):
        m["ranks"] = ranks
        for offset, layer in enumerate(m["units"]):
            layer["shard_size"], layer["padded"], layer["shard_offset"] = 1, ranks, offset
    return edit


def test_a_manifest_declaring_a_billion_ranks_is_refused_before_anything_is_built(checkpoints, tmp_path):
    save_dir = copy_of(checkpoints, "float32", tmp_path)
    edit_manifest(save_dir / STEP, _claim_ranks(10 ** 9))
    result = checkpoint_tool_limited("inspect", "ck", cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == "", describe(result)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and f"{STEP}/manifest.json" in lines[0] and "1000000000 ranks" in lines[0], \
        describe(result)


def _claim_sizes(sizes, block_bytes=1 << 42):
    """The layout an N-rank writer of an MLP of these sizes would have declared (consistent, with
    one CRC per file): what a crafted manifest can claim."""
    def edit(m):
        ranks, offset = m["ranks"], 0
        m["sizes"], m["block_bytes"], m["units"] = sizes, block_bytes, []
        for i, (n_in, n_out) in enumerate(zip(sizes, sizes[1:])):
            numel = n_out * n_in + n_out
            shard = -(-numel // ranks)
            m["units"].append({"names": [f"layers.{i}.weight", f"layers.{i}.bias"],
                               "shapes": [[n_out, n_in], [n_out]], "numel": numel, "padded": shard * ranks,
                               "shard_size": shard, "shard_offset": offset})
            offset += shard
        for entry in m["files"]:
            entry["data_bytes"] = offset * np.dtype(m["kinds"][entry["kind"]]).itemsize
            entry["crc32"] = [0] * -(-entry["data_bytes"] // block_bytes)
    return edit


def _sparse_shards(save_dir):
    """Grow every shard file to the size the manifest declares, as holes (no disk space)."""
    for entry in manifest_of(save_dir / STEP)["files"]:
        try:
            os.truncate(save_dir / STEP / entry["path"], entry["data_offset"] + entry["data_bytes"])
        except OSError as e:
            pytest.skip(f"this file system cannot hold a {entry['data_bytes']:,}-byte sparse file: {e}")


@pytest.mark.parametrize("sparse", [False, True], ids=["files-as-written", "sparse-files-of-that-size"])
def test_consolidate_of_huge_declared_sizes_is_refused_before_allocating(sparse, checkpoints, tmp_path):
    """sizes [10^6, 10^6, 10]: a first tensor of 10^12 float32 (4 TB)."""
    save_dir = copy_of(checkpoints, "float32", tmp_path)
    edit_manifest(save_dir / STEP, _claim_sizes([10 ** 6, 10 ** 6, 10]))
    if sparse:
        _sparse_shards(save_dir)
        result = checkpoint_tool("consolidate", "ck", "out.npz", cwd=tmp_path)
    else:
        result = checkpoint_tool_limited("consolidate", "ck", "out.npz", cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == "", describe(result)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and f"ck/{STEP}" in lines[0], describe(result)
    assert ("needs 4.0 TB" in lines[0]) if sparse else ("bytes, the manifest says" in lines[0]), describe(result)
    assert not (tmp_path / "out.npz").exists()


# ----------------------------------------------------------------------------------------------
# `latest`: confined, never blocking; resume falls back to the newest verified checkpoint
# ----------------------------------------------------------------------------------------------

def in_subprocess(code, cwd, timeout=20):
    """python -c code in cwd -> its stdout; a hang (a FIFO opened for reading) fails the test."""
    result = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True,
                            timeout=timeout, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, describe(result)
    return result.stdout.strip()


READ_LATEST = """
from zerompi.checkpoint import CheckpointError, latest_checkpoint
from zerompi.checkpoint.manifest import read_manifest
try:
    print("read", read_manifest(latest_checkpoint("ck"))["step"])
except CheckpointError as e:
    print(e)
"""


def _write_latest(text):
    return lambda save_dir: (save_dir / "latest").write_text(text)


def _latest_replaced(make):
    def replace(save_dir):
        os.unlink(save_dir / "latest")
        make(str(save_dir / "latest"))
    return replace


UNUSABLE_LATEST = [
    # id, make `latest` unusable, what the one line naming ck/latest says
    ("outside", _latest_outside, "'../elsewhere'"),
    ("absolute", lambda d: (d / "latest").write_text(str(d / STEP)), "not a checkpoint folder"),
    ("dot-dot", _write_latest(STEP + "/.."), f"'{STEP}/..'"),
    ("through-a-step", _write_latest(STEP + "/../step_00000003"), "not a checkpoint folder"),
    ("names-nothing", _write_latest("step_00000099\n"), "step_00000099"),
    ("empty", _write_latest(""), "''"),
    ("a-folder", _latest_replaced(os.mkdir), "is a folder"),
    ("a-fifo", _latest_replaced(os.mkfifo), "FIFO"),
]


@pytest.mark.parametrize("make_bad, says", [pytest.param(*case[1:], id=case[0]) for case in UNUSABLE_LATEST])
def test_an_unusable_latest_is_named_and_the_newest_verified_checkpoint_is_used(make_bad, says, checkpoints,
                                                                                tmp_path):
    save_dir = copy_of(checkpoints, "float32", tmp_path)
    make_bad(save_dir)
    line = in_subprocess(READ_LATEST, cwd=tmp_path)
    assert line.startswith("ck/latest") and says in line and "\n" not in line, line
    result = checkpoint_tool("inspect", "ck", cwd=tmp_path)
    assert result.returncode == 0 and f"ck/{STEP}: step 6 " in result.stdout, describe(result)
    notes = [line for line in result.stdout.splitlines() if "ck/latest" in line]
    assert len(notes) == 1 and says in notes[0] and f"using ck/{STEP}" in notes[0], describe(result)


RESUME = ["--stage", 3, "--dtype", "float32", *COMMON, "--save-dir", "ck", "--resume", "--save-weights", "w.npz"]


@pytest.mark.parametrize("kind", ["folder", "link-to-a-folder"])
def test_a_latest_that_is_a_folder_or_a_link_costs_one_line_and_the_run_ends_0(kind, checkpoints, tmp_path):
    """A folder (or a link to one) named `latest` ended every run with --save-dir in exit 2 after
    all the training, without --save-weights and without rotation."""
    save_dir = copy_of(checkpoints, "float32", tmp_path)
    os.unlink(save_dir / "latest")
    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs" / "keep.txt").write_text("not zerompi's")
    if kind == "folder":
        shutil.copytree(tmp_path / "theirs", save_dir / "latest")
    else:
        os.symlink(tmp_path / "theirs", save_dir / "latest")
    run = launch(2, *RESUME, "--steps", 8, cwd=tmp_path)
    assert run.returncode == 0 and ERROR_MARK not in run.output, run.describe()
    assert f"resumed from ck/{STEP} at step 6" in run.output, run.describe()
    assert (tmp_path / "w.npz").exists() and (save_dir / "step_00000008").is_dir()
    assert (tmp_path / "theirs" / "keep.txt").read_text() == "not zerompi's"
    if kind == "folder":                           # not zerompi's to replace: named, and left alone
        assert (save_dir / "latest" / "keep.txt").exists()
        assert "ck/latest is a folder" in run.output, run.describe()
    else:                                          # a link in zerompi's place: replaced by the pointer
        assert not os.path.islink(save_dir / "latest")
        assert (save_dir / "latest").read_text() == "step_00000008\n"


def test_a_symlinked_step_folder_that_latest_names_is_followed_and_never_rotated(checkpoints, tmp_path):
    """A checkpoint moved to another disk and linked back: `latest` naming it resumed silently from
    an older checkpoint (exit 0)."""
    save_dir = copy_of(checkpoints, "float32", tmp_path)
    os.rename(save_dir / STEP, tmp_path / "other-disk")
    os.symlink(tmp_path / "other-disk", save_dir / STEP)
    before = snapshot(tmp_path / "other-disk")
    run = launch(2, *RESUME, "--steps", 8, "--keep-last", 1, cwd=tmp_path)
    assert run.returncode == 0 and ERROR_MARK not in run.output, run.describe()
    assert f"resumed from ck/{STEP} at step 6" in run.output, run.describe()
    assert snapshot(tmp_path / "other-disk") == before and os.path.islink(save_dir / STEP)
    assert (save_dir / "latest").read_text() == "step_00000008\n"


def test_a_symlinked_step_folder_that_does_not_verify_stops_the_run_naming_it(checkpoints, tmp_path):
    save_dir = copy_of(checkpoints, "float32", tmp_path)
    shutil.copytree(save_dir / STEP, tmp_path / "elsewhere")
    os.symlink(tmp_path / "elsewhere", save_dir / "step_00000009")        # step 6's files, step 9's name
    (save_dir / "latest").write_text("step_00000009\n")
    run = launch(2, *RESUME, "--steps", 12, cwd=tmp_path)
    assert run.returncode == 2 and run.output.count(ERROR_MARK) == 1, run.describe()
    assert "step_00000009" in run.output and "step 6, but the folder is step 9" in run.output, run.describe()


def _set_unit(index, key, value):
    return lambda m: m["units"][index].__setitem__(key, value)


FORGED_FIELDS = [
    # a manifest field forged (its checksum recomputed): what the one line names
    ("run-a-string", lambda m: m.__setitem__("run", "steps lr"), "run must be an object"),
    ("run-a-list", lambda m: m.__setitem__("run", {"steps": [4]}), "run must be an object"),
    ("names-escapes", _set_unit(0, "names", ["\x1b[2J", "layers.0.bias"]), "names"),
    ("names-climb-out", _set_unit(0, "names", ["../../../evil", "layers.0.bias"]), "names"),
    ("names-twice", _set_unit(1, "names", ["layers.0.weight", "layers.0.bias"]), "names"),
    ("names-a-number", _set_unit(0, "names", 5), "names"),
    ("stage-escapes", lambda m: m.__setitem__("stage", "\x1b[31mX"), "stage"),
    ("dtype-escapes", lambda m: m.__setitem__("dtype", "\x1b[31mX"), "dtype"),
    ("seed-escapes", lambda m: m.__setitem__("seed", "\x1b[31mX"), "seed"),
    ("shuffle-a-string", lambda m: m.__setitem__("shuffle", "yes"), "shuffle"),
    ("batch-size-0", lambda m: m.__setitem__("batch_size", 0), "batch_size"),
]


@pytest.mark.parametrize("edit, says", [pytest.param(*case[1:], id=case[0]) for case in FORGED_FIELDS])
def test_every_field_of_a_forged_manifest_is_checked(edit, says, checkpoints, tmp_path):
    """The checksum is easy to recompute, so every field is checked: "run" as a string ended --resume
    in a traceback; names with escape codes were printed raw, "../../../evil" became a zip member
    that climbs out of the folder it is extracted in, twice the same name a UserWarning and an
    .npz that --init-weights refuses; stage, dtype and seed were printed raw."""
    save_dir = copy_of(checkpoints, "float32", tmp_path)
    edit_manifest(save_dir / STEP, edit)
    for command in (("inspect", f"ck/{STEP}"), ("consolidate", f"ck/{STEP}", "out.npz")):
        result = checkpoint_tool(*command, cwd=tmp_path)
        assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, describe(result)
        assert f"{STEP}/manifest.json" in result.stderr and says in result.stderr, describe(result)
        assert "\x1b" not in result.stderr + result.stdout and "Traceback" not in result.stderr, describe(result)
    run = launch(2, *RESUME, "--steps", 8, cwd=tmp_path)
    assert run.returncode == 2 and run.output.count(ERROR_MARK) == 1 and "Traceback" not in run.output, run.describe()
    assert not (tmp_path / "out.npz").exists()


def test_a_partial_folder_holding_what_zerompi_did_not_write_is_refused_at_start_and_kept(checkpoints, tmp_path):
    """A .partial-step_N folder was removed whole (shutil.rmtree), whatever it held."""
    save_dir = copy_of(checkpoints, "float32", tmp_path)
    mine = save_dir / ".partial-step_00000099" / "mine"
    mine.mkdir(parents=True)
    (mine / "thesis.tex").write_text("months of work")
    (save_dir / ".partial-step_00000099" / "rank00000.params.npy").write_text("a shard zerompi wrote")
    run = launch(2, *RESUME, "--steps", 8, cwd=tmp_path)
    assert run.returncode == 2 and run.output.count(ERROR_MARK) == 1, run.describe()
    assert "ck/.partial-step_00000099 holds what zerompi did not write (mine)" in run.output, run.describe()
    assert (mine / "thesis.tex").read_text() == "months of work" and not (tmp_path / "w.npz").exists()


def test_stray_partial_entries_are_removed_at_start_under_the_lock(checkpoints, tmp_path):
    """A stray .partial-step_N file or link made the save fail after all the training, and
    --save-weights was lost; what a link points to is never removed."""
    save_dir = copy_of(checkpoints, "float32", tmp_path)
    (save_dir / ".partial-step_00000008").write_text("stray")
    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs" / "keep.txt").write_text("not zerompi's")
    os.symlink(tmp_path / "theirs", save_dir / ".partial-step_00000010")
    run = launch(2, *RESUME, "--steps", 10, "--save-every", 2, cwd=tmp_path)
    assert run.returncode == 0 and ERROR_MARK not in run.output, run.describe()
    assert (save_dir / "latest").read_text() == "step_00000010\n" and (tmp_path / "w.npz").exists()
    assert (tmp_path / "theirs" / "keep.txt").read_text() == "not zerompi's"
    assert not [name for name in os.listdir(save_dir) if name.startswith(".partial-")]


def _newest_edited(save_dir):
    os.unlink(save_dir / "latest")
    edit_manifest(save_dir / STEP, lambda m: m.__setitem__("adam_steps", 1), sealed=False)


@pytest.mark.parametrize("make, used, says", [
    (lambda d: os.unlink(d / "latest"), STEP, "missing"),
    (_write_latest("step_00000003\n"), STEP, "continues from it"),
    (_newest_edited, "step_00000003", "missing"),
], ids=["latest-missing", "latest-stale", "latest-missing-newest-edited"])
def test_resume_finds_the_newest_verified_checkpoint_when_latest_is_missing_or_stale(make, used, says,
                                                                                    checkpoints, tmp_path):
    """A stale `latest`: the save of the step after the one it names was complete, only the
    rewrite of `latest` failed."""
    save_dir = copy_of(checkpoints, "float32", tmp_path)
    healthy = checkpoint_tool("inspect", "ck", cwd=tmp_path)
    assert healthy.returncode == 0 and "latest" not in healthy.stdout, describe(healthy)
    make(save_dir)
    result = checkpoint_tool("inspect", "ck", cwd=tmp_path)
    assert result.returncode == 0 and f"ck/{used}: step " in result.stdout, describe(result)
    notes = [line for line in result.stdout.splitlines() if "ck/latest" in line]
    assert len(notes) == 1 and says in notes[0] and f"using ck/{used}" in notes[0], describe(result)


def test_fifos_and_non_folders_are_refused_without_blocking(checkpoints, tmp_path):
    save_dir = copy_of(checkpoints, "float32", tmp_path)
    for name in ("manifest.json", "rank00001.m.npy"):
        os.unlink(save_dir / STEP / name)
        os.mkfifo(save_dir / STEP / name)
        result = checkpoint_tool("inspect", f"ck/{STEP}", cwd=tmp_path)
        assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, describe(result)
        assert f"{STEP}/{name}" in result.stderr and "FIFO" in result.stderr, describe(result)
        os.unlink(save_dir / STEP / name)
        shutil.copy(checkpoints["float32"] / "ck" / STEP / name, save_dir / STEP / name)
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(CheckpointError, match=r"pipe: is a FIFO \(named pipe\), not a checkpoint folder"):
        load_checkpoint(fresh_engine(), str(tmp_path / "pipe"))


# ----------------------------------------------------------------------------------------------
# Rotation deletes only step folders that zerompi wrote and can verify
# ----------------------------------------------------------------------------------------------

def _symlinked_step(save_dir):
    os.symlink(save_dir.parent / "victim", save_dir / "step_00000002")
    return "step_00000002"


def _step_with_a_stranger(save_dir):
    (save_dir / "step_00000003" / "notes.txt").write_text("mine")
    return "step_00000003"


def _step_edited(save_dir):
    edit_manifest(save_dir / "step_00000003", lambda m: m.__setitem__("adam_steps", 1), sealed=False)
    return "step_00000003"


ROTATION_PARENTS = [
    # id, the parent step_00000006's manifest names (or a function making it and returning it)
    ("outside", "../victim"),
    ("absolute", lambda d: str(d.parent / "victim")),
    ("the-save-dir", "."),
    ("through-a-step", "step_00000003/../../victim"),
    ("symlinked-step", _symlinked_step),
    ("step-holding-another-file", _step_with_a_stranger),
    ("step-with-an-edited-manifest", _step_edited),
]


@pytest.mark.parametrize("parent", [pytest.param(p, id=name) for name, p in ROTATION_PARENTS])
def test_rotation_deletes_nothing_but_verified_step_folders(parent, checkpoints, tmp_path):
    from zerompi.checkpoint.save import rotate
    save_dir = copy_of(checkpoints, "float32", tmp_path)
    (tmp_path / "victim").mkdir()
    (tmp_path / "victim" / "data.txt").write_text("precious")
    name = parent(save_dir) if callable(parent) else parent
    edit_manifest(save_dir / STEP, lambda m: m.__setitem__("parent", name))
    everything = snapshot(tmp_path)
    rotate(str(save_dir), 1, STEP)
    assert snapshot(tmp_path) == everything, "rotation deleted something"


def test_rotation_deletes_the_checkpoints_of_its_lineage_beyond_keep_last(checkpoints, tmp_path):
    """The positive control of the test above: a verified parent is deleted."""
    from zerompi.checkpoint.save import rotate
    save_dir = copy_of(checkpoints, "float32", tmp_path)
    rotate(str(save_dir), 1, STEP)
    assert sorted(os.listdir(save_dir)) == ["latest", STEP]


def test_a_manifest_whose_step_is_not_its_folders_is_refused(checkpoints, tmp_path):
    """step 3 in step_00000006, checksum recomputed: resumed "from ck/step_00000006 at step 3"."""
    save_dir = copy_of(checkpoints, "float32", tmp_path)
    edit_manifest(save_dir / STEP, lambda m: m.__setitem__("step", 3))
    with pytest.raises(CheckpointError, match=r"step_00000006/manifest.json: step 3, but the folder is step 6"):
        load_checkpoint(fresh_engine(), str(save_dir / STEP))
    renamed = tmp_path / "mine"                              # a folder the user renamed: its name says nothing
    os.rename(save_dir / STEP, renamed)
    assert load_checkpoint(fresh_engine(), str(renamed))["step"] == 3


def test_a_rotation_interrupted_half_way_leaves_a_partial_folder_the_next_run_removes(checkpoints, tmp_path,
                                                                                     monkeypatch):
    """A second Ctrl-C while rotation deleted a step folder file by file left a half-deleted step_K
    for good: no longer verified, so never removed. Now the folder is first renamed to a
    .partial-step_K, which the next run removes under the lock."""
    from zerompi.checkpoint import save
    from zerompi.train.loop.lock import remove_stale_partials
    save_dir = copy_of(checkpoints, "float32", tmp_path)
    real_unlink, calls = os.unlink, []

    def interrupted_unlink(path, *args, **kwargs):
        calls.append(path)
        if len(calls) == 2:
            raise KeyboardInterrupt
        real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(save.os, "unlink", interrupted_unlink)
    with pytest.raises(KeyboardInterrupt):
        save.rotate(str(save_dir), 1, STEP)
    monkeypatch.setattr(save.os, "unlink", real_unlink)
    left = sorted(os.listdir(save_dir))
    assert left == [".partial-step_00000003", "latest", STEP], left
    remove_stale_partials(str(save_dir))
    assert sorted(os.listdir(save_dir)) == ["latest", STEP]


# ----------------------------------------------------------------------------------------------
# Messages that fit: the output's name, the run's dtype
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("command, output", [("consolidate", "missing/out.npz"), ("export", "missing/out.safetensors"),
                                             ("consolidate", "a-folder")])
def test_checkpoint_command_errors_name_the_output_not_a_temporary_file(command, output, checkpoints, tmp_path):
    copy_of(checkpoints, "float32", tmp_path)
    (tmp_path / "a-folder").mkdir()
    (tmp_path / "a-folder" / "x").write_text("x")
    result = checkpoint_tool(command, "ck", output, cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == "", describe(result)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and f"error: {output}: " in lines[0] and ".tmp-" not in lines[0], describe(result)


@pytest.mark.parametrize("command, output", [
    ("export", f"ck/{STEP}/manifest.json"), ("consolidate", f"ck/{STEP}/rank00000.params.npy"),
    ("export", "ck/latest"), ("consolidate", "ck/.lock"), ("export", "ck/step_00000003/x.safetensors")])
def test_checkpoint_commands_never_write_onto_a_checkpoint(command, output, checkpoints, tmp_path):
    """`export ck ck/step_K/manifest.json` printed "wrote" and destroyed the newest checkpoint."""
    save_dir = copy_of(checkpoints, "float32", tmp_path)
    before = snapshot(save_dir)
    result = checkpoint_tool(command, "ck", output, cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == "", describe(result)
    assert len(result.stderr.splitlines()) == 1 and "would replace" in result.stderr, describe(result)
    assert snapshot(save_dir) == before


@pytest.mark.parametrize("dtype, says, never", [
    ("float32", "beyond the range of float32", "train in"),
    ("bf16", "beyond the range of bfloat16", "train in bf16"),
    ("fp16", "float16 ends at 65504): train in bf16 or float32", None),
])
def test_initial_weights_beyond_the_dtype_get_advice_that_fits_the_run(dtype, says, never):
    from zerompi.stages.params import set_layer_params
    from zerompi.train.loop.checkpoints import _unrepresentable
    engine = fresh_engine(dtype=dtype)
    assert _unrepresentable(engine, "w.npz") is None
    layer = engine.layout.layers[1]
    with np.errstate(over="ignore"):
        set_layer_params(engine.stage, layer, np.full(layer.numel, 1e300))
    message = _unrepresentable(engine, "w.npz")
    assert message.startswith("w.npz: layer 1 ") and says in message, message
    assert never is None or never not in message, message


# ----------------------------------------------------------------------------------------------
# safetensors headers
# ----------------------------------------------------------------------------------------------

def raw_safetensors(path, header, data_bytes, header_text=None):
    encoded = (header_text or json.dumps(header)).encode()
    with open(path, "wb") as f:
        f.write(len(encoded).to_bytes(8, "little") + encoded + bytes(data_bytes))


def f32(shape, begin, end):
    return {"dtype": "F32", "shape": shape, "data_offsets": [begin, end]}


BAD_SAFETENSORS = [
    # id, header, data bytes, header text (None: the header as JSON), what the one line says
    ("overlapping", {"w": f32([2], 0, 8), "b": f32([1], 4, 8)}, 8, None, "overlap"),
    ("gap", {"w": f32([2], 0, 8), "b": f32([1], 12, 16)}, 16, None, "gap"),
    ("not-from-0", {"w": f32([2], 4, 12)}, 12, None, "gap"),
    ("trailing-bytes", {"w": f32([2], 0, 8)}, 12, None, "4 bytes after"),
    ("same-range-twice", {"w": f32([2], 0, 8), "v": f32([2], 0, 8)}, 8, None, "overlap"),
    ("shape-does-not-fit", {"w": f32([3], 0, 8)}, 8, None, "do not fit its shape"),
    ("offsets-not-integers", {"w": f32([2], 0.0, 8)}, 8, None, "malformed"),
    ("nested-deep", None, 0, "[" * 100000 + "]" * 100000, "not a safetensors file"),
    ("huge-declared-shape", {"w": f32([10 ** 12, 10 ** 12], 0, 8)}, 8, None, "do not fit its shape"),
]


@pytest.mark.parametrize("header, data_bytes, text, says",
                         [pytest.param(*case[1:], id=case[0]) for case in BAD_SAFETENSORS])
def test_safetensors_whose_offsets_do_not_tile_the_data_are_refused(header, data_bytes, text, says, tmp_path):
    from zerompi.checkpoint.safetensors_io import SafetensorsError
    path = tmp_path / "bad.safetensors"
    raw_safetensors(path, header, data_bytes, text)
    with pytest.raises(SafetensorsError) as caught:
        read_header(str(path))
    message = str(caught.value)
    assert "\n" not in message and message.startswith(str(path)) and says in message, message


def test_safetensors_header_length_beyond_the_file_or_limit_is_refused(tmp_path):
    from zerompi.checkpoint.safetensors_io import SafetensorsError
    path = tmp_path / "long.safetensors"
    path.write_bytes((1 << 62).to_bytes(8, "little") + b"{}")
    with pytest.raises(SafetensorsError, match="header length"):
        read_header(str(path))
    good = tmp_path / "good.safetensors"
    raw_safetensors(good, {"b": f32([1], 8, 12), "w": f32([2], 0, 8)}, 12)     # listed out of order: fine
    header, _, _ = read_header(str(good))
    assert sorted(header) == ["b", "w"]


# ----------------------------------------------------------------------------------------------
# Export: safetensors (and --init-weights from it)
# ----------------------------------------------------------------------------------------------

def test_export_float32_with_optimizer_is_standard_safetensors(checkpoints, tmp_path):
    save_dir = copy_of(checkpoints, "float32", tmp_path)
    folder = save_dir / STEP
    before = snapshot(save_dir)
    result = checkpoint_tool("export", "ck", "model.safetensors", "--optimizer", cwd=tmp_path)
    assert result.returncode == 0, describe(result)
    assert "18 tensors" in result.stdout, describe(result)          # 6 each of params, m, v: no master
    tensors = load_file(str(tmp_path / "model.safetensors"))          # the safetensors package
    layer_names = [f"layers.{i}.{t}" for i in range(3) for t in ("weight", "bias")]
    assert sorted(tensors) == sorted(layer_names + [f"optimizer.{k}.{n}" for k in ("m", "v")
                                                    for n in layer_names])
    saved = load_weights(checkpoints["float32"] / "w.npz")
    for i, layer in enumerate(manifest_of(folder)["units"]):
        o, n_in = layer["shapes"][0]
        for prefix, kind in (("", "params"), ("optimizer.m.", "m"), ("optimizer.v.", "v")):
            weight, bias = tensors[f"{prefix}layers.{i}.weight"], tensors[f"{prefix}layers.{i}.bias"]
            assert weight.dtype == bias.dtype == np.float32
            assert weight.shape == (o, n_in) and bias.shape == (o,)
            flat = np.concatenate([weight.ravel(), bias])
            assert same_bits(flat, oracle_flat(folder, i, kind)[:layer["numel"]]), (prefix, i)
        assert same_bits(tensors[f"layers.{i}.weight"], saved[f"layers.{i}.weight"])
    with safe_open(str(tmp_path / "model.safetensors"), framework="np") as f:
        metadata = f.metadata()
    assert metadata["step"] == "6" and metadata["adam_steps"] == "6", metadata

    result = checkpoint_tool("export", f"ck/{STEP}", "plain.safetensors", cwd=tmp_path)   # a step folder
    assert result.returncode == 0, describe(result)
    assert sorted(load_file(str(tmp_path / "plain.safetensors"))) == sorted(layer_names)
    assert snapshot(save_dir) == before
    assert sorted(os.listdir(tmp_path)) == ["ck", "model.safetensors", "plain.safetensors"]   # no temporaries


def test_export_bf16_keeps_bfloat16_and_the_fp32_master(checkpoints, tmp_path):
    save_dir = copy_of(checkpoints, "bf16", tmp_path)
    folder = save_dir / STEP
    path = str(tmp_path / "model.safetensors")
    result = checkpoint_tool("export", "ck", "model.safetensors", "--optimizer", cwd=tmp_path)
    assert result.returncode == 0, describe(result)
    header, metadata, data_start = read_header(path)
    with safe_open(path, framework="np") as f:                 # the reference parser accepts it too
        assert sorted(f.keys()) == sorted(header)
        assert f.metadata() == metadata
    assert metadata["step"] == "6" and metadata["adam_steps"] == "6" and metadata["dtype"] == "bfloat16"
    saved = load_weights(checkpoints["bf16"] / "w.npz")                 # bf16 widened to float32
    for i, layer in enumerate(manifest_of(folder)["units"]):
        for prefix, kind, dtype in (("", "params", BF16), ("optimizer.master.", "master", np.float32),
                                    ("optimizer.m.", "m", np.float32), ("optimizer.v.", "v", np.float32)):
            weight = read_tensor(path, header, data_start, f"{prefix}layers.{i}.weight")
            bias = read_tensor(path, header, data_start, f"{prefix}layers.{i}.bias")
            assert weight.dtype == bias.dtype == dtype, (prefix, i, weight.dtype)
            assert header[f"{prefix}layers.{i}.weight"]["dtype"] == ("BF16" if dtype == BF16 else "F32")
            flat = np.concatenate([weight.ravel(), bias])
            assert same_bits(flat, oracle_flat(folder, i, kind)[:layer["numel"]]), (prefix, i)
        params = read_tensor(path, header, data_start, f"layers.{i}.weight")
        assert np.array_equal(params.astype(np.float32), saved[f"layers.{i}.weight"])


def test_init_weights_from_exported_safetensors_starts_from_those_weights(checkpoints, tmp_path):
    """float64 runs of one step at lr 1e-12 from the export, from the consolidated .npz of the same
    checkpoint: bitwise the same, and within 1e-9 of the checkpoint's weights."""
    for dtype in WRITERS:                         # the writer's name
        work = tmp_path / dtype
        copy_of(checkpoints, dtype, work)
        assert checkpoint_tool("export", "ck", "model.safetensors", "--optimizer", cwd=work).returncode == 0
        assert checkpoint_tool("consolidate", "ck", "model.npz", cwd=work).returncode == 0
        one_step = ["--dtype", "float64", "--stage", 1, "--steps", 1, "--lr", 1e-12, "--seed", 5, *COMMON]
        train_ok(2, *one_step, "--init-weights", "model.safetensors", "--save-weights", "a.npz", cwd=work)
        train_ok(2, *one_step, "--init-weights", "model.npz", "--save-weights", "b.npz", cwd=work)
        a, b = load_weights(work / "a.npz"), load_weights(work / "b.npz")
        checkpointed = load_weights(checkpoints[dtype] / "w.npz")
        assert sorted(a) == sorted(b) == sorted(checkpointed)
        for name in a:
            assert a[name].dtype == np.float64 and same_bits(a[name], b[name]), (dtype, name)
            np.testing.assert_allclose(a[name], checkpointed[name], rtol=0, atol=1e-9, err_msg=f"{dtype} {name}")


# ----------------------------------------------------------------------------------------------
# A real full disk
# ----------------------------------------------------------------------------------------------

@pytest.fixture
def small_tmpfs(tmp_path):
    """A 64 KiB tmpfs mounted at tmp_path/tmpfs (skips where mounting is not allowed)."""
    mount_point = tmp_path / "tmpfs"
    mount_point.mkdir()
    try:
        result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount_point)],
                                capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        pytest.skip(f"cannot mount a tmpfs to fill a disk for real: {e}")
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs to fill a disk for real (needs root or CAP_SYS_ADMIN): "
                    f"{result.stderr.strip()}")
    try:
        yield mount_point
    finally:
        if subprocess.run(["umount", str(mount_point)], capture_output=True, timeout=30).returncode != 0:
            subprocess.run(["umount", "-l", str(mount_point)], capture_output=True, timeout=30)


def test_full_disk_fails_cleanly_and_keeps_the_previous_checkpoint(small_tmpfs, tmp_path):
    # 32-64-10: each rank's shard file is 1,381 float32 (5,652 bytes, 2 pages of the tmpfs), so one
    # checkpoint (6 files, manifest, latest) takes 14 of the 16 pages: the second one cannot fit.
    # 32-256-10 cannot fit even on the empty disk.
    flags = ["--stage", 2, "--batch-size", 12, "--data", "synthetic", "--report", "none", "--log-every", 0]
    big = launch(2, *flags, "--hidden", 256, "--steps", 2, "--save-dir", "tmpfs/big", cwd=tmp_path, timeout=60)
    assert big.returncode == 2, big.describe()
    assert big.output.count(ERROR_MARK) == 1 and "Traceback" not in big.output, big.describe()
    line = next(line for line in big.output.splitlines() if ERROR_MARK in line)
    assert "tmpfs/big" in line and "No space left" in line, big.describe()
    assert not os.path.exists(small_tmpfs / "big"), big.describe()      # its partial shards, and the folder it made

    train_ok(2, *flags, "--hidden", 64, "--steps", 2, "--save-dir", "tmpfs/ck", cwd=tmp_path)
    save_dir = small_tmpfs / "ck"
    assert (save_dir / "latest").read_text().strip() == "step_00000002"
    before = snapshot(save_dir)

    run = launch(2, *flags, "--hidden", 64, "--steps", 4, "--save-dir", "tmpfs/ck", "--resume",
                 cwd=tmp_path, timeout=60)
    assert run.returncode == 2, run.describe()
    assert run.output.count(ERROR_MARK) == 1 and "Traceback" not in run.output, run.describe()
    line = next(line for line in run.output.splitlines() if ERROR_MARK in line)
    assert "tmpfs/ck" in line and "No space left" in line, run.describe()
    assert run.seconds < 30, run.describe()

    after = snapshot(save_dir)
    assert (save_dir / "latest").read_text().strip() == "step_00000002"
    assert not (save_dir / "step_00000004").exists()
    for name, content in before.items():                       # nothing complete was touched
        assert after.get(name, "gone") == content, name
    assert set(after) == set(before), sorted(set(after) - set(before))      # no partial shards left
    result = checkpoint_tool("inspect", "tmpfs/ck", cwd=tmp_path)
    assert result.returncode == 0 and "step 2 " in result.stdout, describe(result)
    engine = fresh_engine([32, 64, 10], stage=2)
    assert load_checkpoint(engine, latest_checkpoint(str(save_dir)))["step"] == 2


# ----------------------------------------------------------------------------------------------
# Packaging: `pip install .` (not editable) must ship zerompi.checkpoint
# ----------------------------------------------------------------------------------------------

def test_pyproject_ships_every_zerompi_subpackage():
    tomllib = pytest.importorskip("tomllib")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "pyproject.toml"), "rb") as f:
        packages = tomllib.load(f)["tool"]["setuptools"].get("packages")
    if packages is None or isinstance(packages, dict):     # automatic discovery or `find`: finds them all
        return
    subpackages = {"zerompi." + name for name in os.listdir(os.path.join(root, "zerompi"))
                   if os.path.isfile(os.path.join(root, "zerompi", name, "__init__.py"))}
    assert "zerompi.checkpoint" in subpackages
    assert subpackages <= set(packages), sorted(subpackages - set(packages))
