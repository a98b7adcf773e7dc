"""Sharded checkpoints on disk: the folder layout, the manifest, finding and reading checkpoints.

    save_dir/
      .lock                        "<host> <pid>": the run using this folder (zerompi/checkpoint/lock.py)
      latest                       "step_00000300": the newest complete checkpoint (written last)
      step_00000300/
        manifest.json              what the rest holds (below); written after every shard file
        rank00000.params.npy       rank 0's owned range of every layer, layers end to end (the shard
        rank00000.master.npy       layout of zerompi/layout.py); one file per kind of state:
        rank00000.m.npy            params (the stored dtype), master (mixed precision only), m, v
        rank00000.v.npy
        rank00001.params.npy  ...
      step_00000300.2/             the same step saved again after a resume from an earlier one
      .partial-step_00000400/      a save in progress, a killed one, or an old one being removed: never read

Every shard file is a standard .npy holding a 1-D array of the writer's shard_numel elements
(bfloat16 as its uint16 words, which .npy can describe; the manifest names the real dtype).
Element g of layer u (0 <= g < padded) was owned by rank k = g // shard_size and sits at position
shard_offset(u) + g % shard_size of rank k's file: so any range of any layer can be read from the
files of the ranks that owned it, with no other rank's data. Elements at and beyond the layer's
numel are padding (zeros): a reader with another N pads to its own multiple instead.

Integrity: each file's data is cut into blocks of `block_bytes`, and the manifest keeps a CRC-32
of each. A reader verifies every block it touches (at most one block more than it needs at
each end of a range); `python -m zerompi.checkpoint inspect` verifies them all. The manifest
itself is covered by `manifest_sha256`: the SHA-256 of its other fields, serialized canonically
(json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=True), ASCII bytes). A
version-2 manifest whose checksum is missing or does not match is refused; a version-1 manifest
(which had none) is read, with a note that its content is not verified.

manifest.json:
    format "zerompi-checkpoint", version 2
    step, adam_steps, loss_scale, loss_scale_good_steps      where training stands
    seed, shuffle, batch_size                                 how the data order continues
    parent                                                    the step folder (in the same save_dir)
                                                              this run continued from, or null
    restarts                                                  times the training was restarted from
                                                              a checkpoint (older manifests: absent, 0)
    run: {steps, lr, lr_schedule, ...}                        the writer's other settings
    stage, ranks, dtype, sizes                                who wrote it (any stage/N can read it)
    units: [{names, shapes, numel, padded, shard_size, shard_offset}]   the writer's layout
    kinds: {kind: dtype}                                      params, [master,] m, v
    block_bytes, files: [{rank, kind, path, data_offset, data_bytes, crc32: [...]}]
    manifest_sha256                                           the checksum of all the above

Everything a manifest or `latest` names stays inside the save directory: `latest` and `parent`
must be step folder names (step_XXXXXXXX, or step_XXXXXXXX.K), a step folder must be a real
folder (not a symbolic link), and each file path is exactly rank{r:05d}.{kind}.npy. Sizes the
manifest declares are checked against its own lists and, before anything is allocated, against
the files on disk and the memory available (zerompi/inputs.py).

Which checkpoint --resume continues from: zerompi/checkpoint/find.py.
"""
import hashlib
import json
import math
import os
import re
import zlib

import numpy as np

from .atomic import atomic_file
from ..inputs import FILE_KINDS, check_fits, open_regular
from ..precision import BF16

FORMAT, VERSION = "zerompi-checkpoint", 2
READABLE_VERSIONS = (1, 2)               # 1: no manifest checksum (read, with a note)
CHECKSUM = "manifest_sha256"
MANIFEST = "manifest.json"
LATEST = "latest"
LOCK = ".lock"                 # "host pid" of the run using the save dir (zerompi/checkpoint/lock.py)
PARTIAL = ".partial-"           # a save in progress, a killed one, or a checkpoint being removed
BLOCK_BYTES = 1 << 20
STATE_DTYPES = ("float64", "float32", "float16", "bfloat16")
KIND_SETS = ({"params", "m", "v"}, {"params", "master", "m", "v"})
STEP_FOLDER = re.compile(r"step_(\d{8,})(?:\.([2-9]|[1-9]\d+))?", re.ASCII)
JSON_BYTES_PER_TEXT_BYTE = 16            # parsed JSON (dicts, lists, ints) takes many times its text


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; str(e) is one line naming the file and the problem."""


def step_folder_name(step):
    return f"step_{step:08d}"


def step_of(name):
    """(step, copy) of a step folder's name (step_00000300.2 -> (300, 2)), or None if it is not one."""
    match = STEP_FOLDER.fullmatch(name) if isinstance(name, str) else None
    return (int(match.group(1)), int(match.group(2) or 1)) if match else None


def replaces_checkpoint_file(path, save_dir, folder=None):
    """One line if writing `path` would replace what checkpoints keep: in save_dir, `latest`,
    `.lock`, a step folder (also where a step folder that is a link points) or a partial save; or
    anything inside the checkpoint folder `folder`, whatever its name. Compared by real path
    (symlinks and `..` followed). Else None."""
    target = os.path.realpath(path)

    def inside(top):
        return os.path.commonpath([target, top]) == top
    if folder is not None and inside(os.path.realpath(folder)):
        return f"{path} would replace a file of the checkpoint {folder}"
    real_save_dir = os.path.realpath(save_dir)
    if inside(real_save_dir) and target != real_save_dir:
        first = os.path.relpath(target, real_save_dir).split(os.sep)[0]
        if first in (LATEST, LOCK) or first.startswith(PARTIAL) or step_of(first):
            return f"{path} would replace {os.path.join(save_dir, first)}, which the checkpoints there need"
    for name in _names(save_dir):                 # a step folder moved elsewhere and linked back
        linked = os.path.join(save_dir, name)
        if step_of(name) and os.path.islink(linked) and inside(os.path.realpath(linked)):
            return f"{path} would replace {linked}, which the checkpoints there need"
    return None


def hard_link_of(path, save_dir, folder=None):
    """The checkpoint file that `path`, an existing file with other names (hard links), is another
    name of: in save_dir's `latest`, `.lock`, step folders and partial saves, or in the checkpoint
    folder `folder`; compared by (st_dev, st_ino). Else None (also for a path that does not exist)."""
    try:
        status = os.stat(path)
    except OSError:
        return None
    if status.st_nlink < 2:                       # no other name: no other file's
        return None
    roots = [os.path.join(save_dir, name) for name in _names(save_dir)
             if name in (LATEST, LOCK) or name.startswith(PARTIAL) or step_of(name)] if save_dir else []
    for root in roots + ([folder] if folder else []):
        for found in [root] + [os.path.join(top, name) for top, _, names in os.walk(root) for name in names]:
            try:
                other = os.stat(found)
            except OSError:
                continue
            if (other.st_dev, other.st_ino) == (status.st_dev, status.st_ino) and not os.path.isdir(found):
                return found
    return None


def _names(folder):
    try:
        return sorted(os.listdir(folder))
    except OSError:
        return []


def shard_file_name(rank, kind):
    return f"rank{rank:05d}.{kind}.npy"


SAVE_FILE = re.compile(r"rank\d{5,}\.[a-z]+\.npy|manifest\.json|\.manifest\.json\.tmp-.+")   # what a save writes


def remove_partial(folder):
    """Remove what a save (or a rotation half way) wrote in the partial folder `folder`, then the
    folder if nothing else is left; returns the sorted names of what is left (not zerompi's)."""
    left = []
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if SAVE_FILE.fullmatch(name) and not os.path.isdir(path):
            os.unlink(path)
        else:
            left.append(name)
    if not left:
        os.rmdir(folder)
    return left


def on_disk(array):
    """What a shard file stores for an array: bfloat16 as uint16 words, the rest as they are."""
    return array.view(np.uint16) if array.dtype == BF16 else array


def dtype_named(name):
    return BF16 if name == "bfloat16" else np.dtype(name)


def write_text_atomically(path, text):
    with atomic_file(path, "w") as f:
        f.write(text)


def manifest_checksum(manifest):
    """SHA-256 (hex) of the canonical serialization of every field but the checksum itself."""
    body = {key: value for key, value in manifest.items() if key != CHECKSUM}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode("ascii")).hexdigest()


def manifest_text(manifest):
    """What manifest.json holds: the fields, then their checksum."""
    return json.dumps({**manifest, CHECKSUM: manifest_checksum(manifest)}, indent=1)


def unverified_note(folder, manifest):
    """One line when the manifest is of version 1 (no checksum), else None."""
    if manifest["version"] >= 2:
        return None
    return f"{os.path.join(folder, MANIFEST)}: a manifest of version 1 (no checksum): its content is not verified"


# ----------------------------------------------------------------------------------------------
# Finding a checkpoint in a save directory
# ----------------------------------------------------------------------------------------------

def step_folder_problem(save_dir, name, links=False):
    """Why save_dir/name is not a step folder zerompi could have written (a phrase), or None.
    links: a symbolic link to a folder counts (to read from: a checkpoint moved to another disk and
    linked back); rotation leaves it False, so that it never deletes through a link."""
    if step_of(name) is None:
        return f"which is not a checkpoint folder (step_XXXXXXXX[.K]) of {save_dir}"
    path = os.path.join(save_dir, name)
    if os.path.islink(path) and not links:
        return "a symbolic link, not a checkpoint folder zerompi wrote"
    if not os.path.isdir(path):
        return "which is not a folder" if os.path.lexists(path) else "which does not exist"
    return None


# ----------------------------------------------------------------------------------------------
# Reading shard files
# ----------------------------------------------------------------------------------------------

class CheckpointReader:
    """Reads element ranges of any layer and kind, from the files of the ranks that owned them."""

    def __init__(self, folder):
        self.folder = folder
        self.manifest = read_manifest(folder)
        m = self.manifest
        self.note = unverified_note(folder, m)
        self.layers = m["units"]
        self.kinds = {kind: dtype_named(name) for kind, name in m["kinds"].items()}
        self.files = {(f["rank"], f["kind"]): f for f in m["files"]}
        self.arrays = {}          # (rank, kind) -> memory map of the file's data
        self.verified = set()     # (rank, kind, block) already checked against its CRC

    def _array(self, rank, kind):
        """The file's data, mapped; first checks that the file is a regular file of the size the
        manifest gives it."""
        key = (rank, kind)
        if key not in self.arrays:
            entry = self.files[key]
            path = os.path.join(self.folder, entry["path"])
            disk_dtype = on_disk(np.empty(0, self.kinds[kind])).dtype
            if not os.path.lexists(path):
                raise CheckpointError(f"{path}: missing (rank {rank}'s {kind} shard)")
            with open_regular(path, CheckpointError) as f:
                size = os.fstat(f.fileno()).st_size
                expected = entry["data_offset"] + entry["data_bytes"]
                if size != expected:
                    raise CheckpointError(f"{path}: {size} bytes, the manifest says {expected}: truncated or replaced")
                try:
                    self.arrays[key] = np.memmap(f, dtype=disk_dtype, mode="r", offset=entry["data_offset"],
                                                 shape=(entry["data_bytes"] // disk_dtype.itemsize,))
                except (OSError, ValueError) as e:
                    raise CheckpointError(f"{path}: cannot be mapped ({e})") from None
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
        or beyond the layer's numel (padding) are zero. The files the range lies in are checked,
        and the result's size against the memory available, before it is allocated."""
        layer = self.layers[layer_index]
        shard, end = layer["shard_size"], min(hi, layer["numel"])
        for rank in range(lo // shard, (end - 1) // shard + 1 if end > lo else 0):
            self._array(rank, kind)
        check_fits((hi - lo) * np.dtype(dtype).itemsize,
                   f"{self.folder}: layer {layer_index}'s {kind}, elements {lo}..{hi},", CheckpointError)
        out = np.zeros(hi - lo, dtype=dtype)
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


# ----------------------------------------------------------------------------------------------
# The manifest
# ----------------------------------------------------------------------------------------------

def read_manifest(folder):
    """The manifest of a checkpoint folder: its checksum verified (version 2), its fields checked
    for types, consistency, sizes and paths that stay in the folder. Raises CheckpointError."""
    path = os.path.join(folder, MANIFEST)
    _check_is_folder(folder)
    m = _load_json(path)
    try:
        _check_version_and_checksum(path, m)
        _check_numbers(path, m)
        _check_training_state(path, m)
        _check_layout(path, m)
        _check_files(path, m)
        named = step_of(os.path.basename(os.path.normpath(folder)))
        if named is not None and named[0] != m["step"]:
            raise CheckpointError(f"{path}: step {m['step']}, but the folder is step {named[0]}: it was moved "
                                  f"or edited")
    except CheckpointError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise CheckpointError(f"{path}: malformed manifest ({type(e).__name__}: {e})") from None
    return m


def _check_is_folder(folder):
    if os.path.isdir(folder):
        return
    if not os.path.exists(folder):
        raise CheckpointError(f"{folder}: no such checkpoint folder")
    mode = os.stat(folder).st_mode
    kind = next((name for test, name in FILE_KINDS if test(mode)), "a file")
    raise CheckpointError(f"{folder}: is {kind}, not a checkpoint folder")


def _load_json(path):
    if not os.path.lexists(path):
        raise CheckpointError(f"{path}: missing: {os.path.dirname(path)} is not a complete checkpoint")
    try:
        with open_regular(path, CheckpointError) as f:
            size = os.fstat(f.fileno()).st_size
            check_fits(size * JSON_BYTES_PER_TEXT_BYTE, f"{path} ({size} bytes)", CheckpointError)
            m = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise CheckpointError(f"{path}: not a readable manifest ({type(e).__name__}: {e})") from None
    if not isinstance(m, dict):
        raise CheckpointError(f"{path}: not a readable manifest (a JSON {type(m).__name__}, not an object)")
    return m


def _check_version_and_checksum(path, m):
    if m["format"] != FORMAT or type(m["version"]) is not int or m["version"] not in READABLE_VERSIONS:
        raise CheckpointError(f"{path}: format {m['format']!r} version {m['version']!r}, expected "
                              f"{FORMAT!r} version {VERSION} (or 1)")
    if m["version"] == 1:
        return
    if CHECKSUM not in m:
        raise CheckpointError(f"{path}: a version-{m['version']} manifest without its {CHECKSUM}: its content "
                              f"cannot be verified")
    if m[CHECKSUM] != manifest_checksum(m):
        raise CheckpointError(f"{path}: {CHECKSUM} does not match the manifest's content: it was edited or "
                              f"is corrupted")


MAX_COUNT = 2 ** 53 - 1          # counts a manifest may hold: exact in every JSON reader and in a float


def _is_count(value, least=0):
    return isinstance(value, int) and not isinstance(value, bool) and least <= value <= MAX_COUNT


def _check_numbers(path, m):
    for key in ("ranks", "step", "adam_steps", "loss_scale_good_steps", "block_bytes", "restarts"):
        if not _is_count(m.get(key, 0)):                  # restarts: absent in older manifests
            raise CheckpointError(f"{path}: {key} must be an integer from 0 to 2^53 - 1, not {repr(m[key])[:40]}")
    if m["ranks"] < 1 or m["block_bytes"] < 1:
        raise CheckpointError(f"{path}: ranks and block_bytes must be positive")
    if not (isinstance(m["loss_scale"], (int, float)) and 0 < m["loss_scale"] < float("inf")):
        raise CheckpointError(f"{path}: loss_scale must be a positive finite number, not {m['loss_scale']!r}")
    parent = m.get("parent")
    if parent is not None and step_of(parent) is None:
        raise CheckpointError(f"{path}: parent {parent!r} is not a checkpoint folder name (step_XXXXXXXX[.K])")


def _check_training_state(path, m):
    """What the manifest tells the run that resumes (and `inspect` prints): of the types zerompi
    writes, so that a forged one is one line, never a traceback or text that reaches a terminal."""
    if not (_is_count(m["stage"]) and m["stage"] <= 3):
        raise CheckpointError(f"{path}: stage must be 0, 1, 2 or 3, not {repr(m['stage'])[:40]}")
    if m["dtype"] not in STATE_DTYPES:
        raise CheckpointError(f"{path}: dtype must be one of {', '.join(STATE_DTYPES)}, not {repr(m['dtype'])[:40]}")
    if not _is_count(m["seed"]) or type(m["shuffle"]) is not bool or not _is_count(m["batch_size"], 1):
        raise CheckpointError(f"{path}: seed, shuffle and batch_size must be an integer >= 0, true or false and "
                              f"an integer >= 1, not {repr(m['seed'])[:20]}, {repr(m['shuffle'])[:20]} and "
                              f"{repr(m['batch_size'])[:20]}")
    run = m.get("run", {})                                # the settings of the run that wrote it
    if not (isinstance(run, dict) and all(isinstance(value, (int, float, str)) for value in run.values())):
        raise CheckpointError(f"{path}: run must be an object of flags' values, not {repr(run)[:40]}")


def _check_layout(path, m):
    sizes, ranks, kinds = m["sizes"], m["ranks"], m["kinds"]
    if not (isinstance(sizes, list) and len(sizes) >= 2 and all(_is_count(n, 1) for n in sizes)):
        raise CheckpointError(f"{path}: sizes must be a list of at least two positive integers, not {sizes!r}")
    if len(m["units"]) != len(sizes) - 1 or any(
            layer["shapes"] != [[out, inp], [out]] for layer, inp, out in zip(m["units"], sizes, sizes[1:])):
        raise CheckpointError(f"{path}: the layers' shapes do not follow sizes {sizes}")
    for index, layer in enumerate(m["units"]):            # the names of the consolidated weights, as written
        if layer.get("names") != [f"layers.{index}.weight", f"layers.{index}.bias"]:
            raise CheckpointError(f"{path}: layer {index}'s names must be layers.{index}.weight and "
                                  f"layers.{index}.bias, not {repr(layer.get('names'))[:40]}")
    shard_offset = 0
    for layer in m["units"]:
        numel = sum(math.prod(shape) for shape in layer["shapes"])
        numbers = [layer[key] for key in ("numel", "padded", "shard_size", "shard_offset")]
        if (not all(_is_count(n) for n in numbers) or layer["numel"] != numel
                or layer["padded"] != layer["shard_size"] * ranks or not 0 < numel <= layer["padded"]
                or layer["shard_offset"] != shard_offset):
            raise CheckpointError(f"{path}: inconsistent layout for {layer.get('names')}: numel, "
                                  f"padded, shard_size and shard_offset do not fit its shapes and {ranks} ranks")
        shard_offset += layer["shard_size"]
    if set(kinds) not in KIND_SETS or any(name not in STATE_DTYPES for name in kinds.values()):
        raise CheckpointError(f"{path}: kinds {kinds} are not params, [master,] m, v in "
                              f"{', '.join(STATE_DTYPES)}")


def _check_files(path, m):
    """One file per rank and kind, counted before anything is built from `ranks`."""
    ranks, kinds, files = m["ranks"], m["kinds"], m["files"]
    if not isinstance(files, list) or len(files) != ranks * len(kinds):
        raise CheckpointError(f"{path}: lists {len(files)} files, expected one per rank and kind "
                              f"({ranks} ranks x {len(kinds)} kinds)")
    listed = {(f["rank"], f["kind"]) for f in files}
    if listed != {(r, k) for r in range(ranks) for k in kinds}:
        raise CheckpointError(f"{path}: lists files for {sorted(listed, key=str)[:4]}..., expected one per rank "
                              f"and kind ({ranks} ranks x {sorted(kinds)})")
    shard_numel = sum(layer["shard_size"] for layer in m["units"])
    for f in files:
        expected = shard_file_name(f["rank"], f["kind"])
        if f["path"] != expected:
            where = "leaves the checkpoint folder" if not _is_plain_name(f["path"]) else f"is not {expected}"
            raise CheckpointError(f"{path}: file path {f['path']!r} {where}")
        if f["data_bytes"] != shard_numel * dtype_named(kinds[f["kind"]]).itemsize or not _is_count(f["data_offset"]):
            raise CheckpointError(f"{path}: {f['path']} has data_bytes {f['data_bytes']} / data_offset "
                                  f"{f['data_offset']}, which do not fit {shard_numel} {kinds[f['kind']]} elements")
        blocks = -(-f["data_bytes"] // m["block_bytes"])
        if not isinstance(f["crc32"], list) or len(f["crc32"]) != blocks:
            raise CheckpointError(f"{path}: {f['path']} has {len(f['crc32'])} checksums for {blocks} blocks")


def _is_plain_name(name):
    return isinstance(name, str) and name not in ("", ".", "..") and os.path.basename(name) == name \
        and "\\" not in name
