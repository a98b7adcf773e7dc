"""The manifest of a checkpoint (manifest.json): what it holds, its checksum, and its checks.

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

Integrity: the manifest is covered by `manifest_sha256`: the SHA-256 of its other fields,
serialized canonically (json.dumps(fields, sort_keys=True, separators=(",", ":"),
ensure_ascii=True), ASCII bytes). A version-2 manifest whose checksum is missing or does not match
is refused; a version-1 manifest (which had none) is read, with a note that its content is not
verified. Sizes the manifest declares are checked against its own lists and, before anything is
allocated, against the files on disk and the memory available (zerompi/util/inputs.py); every path it
names stays inside the checkpoint folder (zerompi/checkpoint/files.py).
"""
import hashlib
import json
import math
import os

from .files import MANIFEST, CheckpointError, dtype_named, shard_file_name, step_of
from ..util.inputs import FILE_KINDS, check_fits, open_regular

FORMAT, VERSION = "zerompi-checkpoint", 2
READABLE_VERSIONS = (1, 2)               # 1: no manifest checksum (read, with a note)
CHECKSUM = "manifest_sha256"
STATE_DTYPES = ("float64", "float32", "float16", "bfloat16")
KIND_SETS = ({"params", "m", "v"}, {"params", "master", "m", "v"})
JSON_BYTES_PER_TEXT_BYTE = 16            # parsed JSON (dicts, lists, ints) takes many times its text


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
