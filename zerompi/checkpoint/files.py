"""Sharded checkpoints on disk: the folder layout, the manifest, and reading any element range.

    save_dir/
      latest                       "step_00000300": the newest complete checkpoint (written last)
      step_00000300/
        manifest.json              what the rest holds (below); written after every shard file
        rank00000.params.npy       rank 0's owned range of every layer, layers end to end (the shard
        rank00000.master.npy       layout of zerompi/layout.py); one file per kind of state:
        rank00000.m.npy            params (the stored dtype), master (mixed precision only), m, v
        rank00000.v.npy
        rank00001.params.npy  ...
      step_00000300.2/             the same step saved again after a resume from an earlier one
      .partial-step_00000400/      a save in progress, or one that was killed: never read

Every shard file is a standard .npy holding a 1-D array of the writer's shard_numel elements
(bfloat16 as its uint16 words, which .npy can describe; the manifest names the real dtype).
Element g of layer u (0 <= g < padded) was owned by rank k = g // shard_size and sits at position
shard_offset(u) + g % shard_size of rank k's file: so any range of any layer can be read from the
files of the ranks that owned it, with no other rank's data. Elements at and beyond the layer's
numel are padding (zeros): a reader with another N pads to its own multiple instead.

Integrity: each file's data is cut into blocks of `block_bytes`, and the manifest keeps a CRC-32
of each. A reader verifies every block it touches (at most one block more than it needs at
each end of a range); `python -m zerompi.checkpoint inspect` verifies them all.

manifest.json:
    format "zerompi-checkpoint", version 1
    step, adam_steps, loss_scale, loss_scale_good_steps      where training stands
    seed, shuffle, batch_size                                 how the data order continues
    run: {steps, lr, lr_schedule, ...}                        the writer's other settings
    stage, ranks, dtype, sizes                                who wrote it (any stage/N can read it)
    layers: [{names, shapes, numel, padded, shard_size, shard_offset}]   the writer's layout
    kinds: {kind: dtype}                                      params, [master,] m, v
    block_bytes, files: [{rank, kind, path, data_offset, data_bytes, crc32: [...]}]
"""
import json
import os
import zlib

import numpy as np

from .atomic import atomic_file
from ..precision import BF16

FORMAT, VERSION = "zerompi-checkpoint", 1
MANIFEST = "manifest.json"
LATEST = "latest"
BLOCK_BYTES = 1 << 20
STATE_DTYPES = ("float64", "float32", "float16", "bfloat16")


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; str(e) is one line naming the file and the problem."""


def step_folder_name(step):
    return f"step_{step:08d}"


def shard_file_name(rank, kind):
    return f"rank{rank:05d}.{kind}.npy"


def on_disk(array):
    """What a shard file stores for an array: bfloat16 as uint16 words, the rest as they are."""
    return array.view(np.uint16) if array.dtype == BF16 else array


def dtype_named(name):
    return BF16 if name == "bfloat16" else np.dtype(name)


def write_text_atomically(path, text):
    with atomic_file(path, "w") as f:
        f.write(text)


def latest_checkpoint(save_dir):
    """The folder `save_dir/latest` points to, or None when there is none yet."""
    pointer = os.path.join(save_dir, LATEST)
    if not os.path.exists(pointer):
        return None
    with open(pointer) as f:
        name = f.read().strip()
    if not _is_plain_name(name):
        raise CheckpointError(f"{pointer}: points to {name!r}, which is not a folder inside {save_dir}")
    return os.path.join(save_dir, name)


def _is_plain_name(name):
    return bool(name) and name not in (".", "..") and os.path.basename(name) == name and "\\" not in name


class CheckpointReader:
    """Reads element ranges of any layer and kind, from the files of the ranks that owned them."""

    def __init__(self, folder):
        self.folder = folder
        self.manifest = read_manifest(folder)
        m = self.manifest
        self.layers = m["units"]
        self.kinds = {kind: dtype_named(name) for kind, name in m["kinds"].items()}
        self.files = {(f["rank"], f["kind"]): f for f in m["files"]}
        self.arrays = {}          # (rank, kind) -> memory map of the file's data
        self.verified = set()     # (rank, kind, block) already checked against its CRC

    def _array(self, rank, kind):
        key = (rank, kind)
        if key not in self.arrays:
            entry = self.files[key]
            path = os.path.join(self.folder, entry["path"])
            if not os.path.isfile(path):
                raise CheckpointError(f"{path}: missing (rank {rank}'s {kind} shard)")
            size = os.path.getsize(path)
            expected = entry["data_offset"] + entry["data_bytes"]
            if size != expected:
                raise CheckpointError(f"{path}: {size} bytes, the manifest says {expected}: truncated or replaced")
            disk_dtype = on_disk(np.empty(0, self.kinds[kind])).dtype
            self.arrays[key] = np.memmap(path, dtype=disk_dtype, mode="r", offset=entry["data_offset"],
                                         shape=(entry["data_bytes"] // disk_dtype.itemsize,))
        return self.arrays[key]

    def _verify(self, rank, kind, lo, hi):
        """Check the CRC of every block that elements [lo, hi) of the file touch."""
        data = self._array(rank, kind)
        entry = self.files[(rank, kind)]
        block, itemsize = self.manifest["block_bytes"], data.dtype.itemsize
        raw = data.view(np.uint8)
        for b in range(lo * itemsize // block, (hi * itemsize - 1) // block + 1):
            if (rank, kind, b) in self.verified:
                continue
            if zlib.crc32(raw[b * block:(b + 1) * block]) != entry["crc32"][b]:
                raise CheckpointError(f"{os.path.join(self.folder, entry['path'])}: checksum mismatch in "
                                      f"block {b} (bytes {b * block}..{(b + 1) * block}): the file is corrupted")
            self.verified.add((rank, kind, b))

    def read_range(self, layer_index, kind, lo, hi, dtype):
        """Elements [lo, hi) of the layer's flat buffer (weight then bias), as dtype; positions at
        or beyond the layer's numel (padding) are zero."""
        layer = self.layers[layer_index]
        out = np.zeros(hi - lo, dtype=dtype)
        shard, end = layer["shard_size"], min(hi, layer["numel"])
        g = lo
        while g < end:                                   # one run per writer rank the range crosses
            rank = g // shard
            run_end = min(end, (rank + 1) * shard)
            start = layer["shard_offset"] + g - rank * shard
            stop = start + run_end - g
            self._verify(rank, kind, start, stop)
            values = self._array(rank, kind)[start:stop]
            if self.kinds[kind] == BF16:
                values = values.view(BF16)
            out[g - lo:run_end - lo] = values
            g = run_end
        return out


def read_manifest(folder):
    """The manifest of a checkpoint folder, checked for shape and safe paths."""
    path = os.path.join(folder, MANIFEST)
    if not os.path.isdir(folder):
        raise CheckpointError(f"{folder}: no such checkpoint folder")
    try:
        with open(path) as f:
            m = json.load(f)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing: {folder} is not a complete checkpoint") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: not a readable manifest ({e})") from None
    try:
        if m["format"] != FORMAT or m["version"] != VERSION:
            raise CheckpointError(f"{path}: format {m['format']!r} version {m['version']!r}, expected "
                                  f"{FORMAT!r} version {VERSION}")
        for key in ("ranks", "step", "adam_steps", "loss_scale_good_steps", "block_bytes"):
            if not isinstance(m[key], int) or isinstance(m[key], bool) or m[key] < 0:
                raise CheckpointError(f"{path}: {key} must be a non-negative integer, not {m[key]!r}")
        if m["ranks"] < 1 or m["block_bytes"] < 1:
            raise CheckpointError(f"{path}: ranks and block_bytes must be positive")
        if not (isinstance(m["loss_scale"], (int, float)) and 0 < m["loss_scale"] < float("inf")):
            raise CheckpointError(f"{path}: loss_scale must be a positive finite number, not {m['loss_scale']!r}")
        sizes = m["sizes"]
        if len(m["units"]) != len(sizes) - 1 or any(
                layer["shapes"] != [[out, inp], [out]] for layer, inp, out in zip(m["units"], sizes, sizes[1:])):
            raise CheckpointError(f"{path}: the layers' shapes do not follow sizes {sizes}")
        ranks = m["ranks"]
        kinds = m["kinds"]
        shard_offset = 0
        for layer in m["units"]:
            numel = sum(int(np.prod(shape)) for shape in layer["shapes"])
            if (layer["numel"] != numel or layer["padded"] != layer["shard_size"] * ranks
                    or not 0 < layer["numel"] <= layer["padded"] or layer["shard_offset"] != shard_offset):
                raise CheckpointError(f"{path}: inconsistent layout for {layer.get('names')}: numel, "
                                      f"padded, shard_size and shard_offset do not fit its shapes and {ranks} ranks")
            shard_offset += layer["shard_size"]
        if set(kinds) not in ({"params", "m", "v"}, {"params", "master", "m", "v"}) or \
                any(name not in STATE_DTYPES for name in kinds.values()):
            raise CheckpointError(f"{path}: kinds {kinds} are not params, [master,] m, v in "
                                  f"{', '.join(STATE_DTYPES)}")
        shard_numel = sum(layer["shard_size"] for layer in m["units"])
        expected = {(r, k) for r in range(ranks) for k in kinds}
        listed = {(f["rank"], f["kind"]) for f in m["files"]}
        if listed != expected:
            raise CheckpointError(f"{path}: lists files for {sorted(listed)[:4]}..., expected one per rank "
                                  f"and kind ({ranks} ranks x {sorted(kinds)})")
        for f in m["files"]:
            if not _is_plain_name(f["path"]):
                raise CheckpointError(f"{path}: file path {f['path']!r} leaves the checkpoint folder")
            if f["data_bytes"] != shard_numel * dtype_named(kinds[f["kind"]]).itemsize or f["data_offset"] < 0:
                raise CheckpointError(f"{path}: {f['path']} has data_bytes {f['data_bytes']} / data_offset "
                                      f"{f['data_offset']}, which do not fit {shard_numel} {kinds[f['kind']]} elements")
            blocks = -(-f["data_bytes"] // m["block_bytes"])
            if len(f["crc32"]) != blocks:
                raise CheckpointError(f"{path}: {f['path']} has {len(f['crc32'])} checksums for {blocks} blocks")
    except CheckpointError:
        raise
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"{path}: malformed manifest ({type(e).__name__}: {e})") from None
    return m
