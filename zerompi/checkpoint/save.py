"""Saving a sharded checkpoint: every rank writes only what it owns; nothing is visible until complete.

    rank 0        create .partial-step_K/ (the run holds save_dir's lock:
                  zerompi/train/loop/lock.py)                                      -- all agree --
    every rank    write rank{r}.{kind}.npy for each kind of state it owns (the CRC-32 of
                  each block computed as it is written), fsync                      -- all agree --
    gather        the CRCs and data offsets to rank 0 (one buffer Gather)
    rank 0        write manifest.json (fsync), fsync the folder, rename
                  .partial-step_K -> step_K (step_K.2 if a step_K exists already), fsync
                  save_dir, then write `latest` (tmp + fsync + rename); finally delete the
                  checkpoints of its lineage beyond keep_last                       -- all agree --

A kill at any moment leaves `latest` pointing at the previous complete checkpoint: a partial folder
is never read, and `latest` moves only after the rename. If writing `latest` fails, the checkpoint
is still complete, and --resume finds it (zerompi/checkpoint/find.py). Each "all
agree" is one small all-reduce (Communicator.any_failed): if any rank failed (a full disk, a
missing folder), every rank returns at the same point, so none is left waiting in a collective.

What rank r writes for each layer is its owned range under the current N (Layer.owned_range),
whatever the stage: in stage 0, where every rank holds everything, rank r still writes only its
range, so the files have the same shape for every stage. With hybrid sharding (zerompi/hierarchy/)
the layers are sharded over the S ranks of a group, and the first group writes: a checkpoint of S
shards, as flat ZeRO on S ranks would write it (the manifest's "ranks" is S).

Rotation deletes only step folders that zerompi wrote and can verify, found by following the
manifests' `parent` from the checkpoint just written: a step folder name inside save_dir, a real
folder (not a symbolic link), a version-2 manifest whose checksum matches, holding nothing but
that manifest and the shard files it lists. The first folder that is not all of these ends the
lineage. A folder is removed file by file, manifest first, then the empty folder: never a
recursive delete.
"""
import os
import zlib

import numpy as np

from ..util.atomic import fsync_folder
from ..device import to_numpy
from ..stages.params import held_params
from .files import (BLOCK_BYTES, LATEST, MANIFEST, PARTIAL, CheckpointError, on_disk, remove_partial, shard_file_name,
                    step_folder_name, step_folder_problem, write_text_atomically)
from .manifest import FORMAT, VERSION, manifest_text, read_manifest


def state_kinds(stage):
    """The kinds of state a checkpoint of this stage holds, with their dtypes."""
    kinds = {"params": stage.precision.storage}
    if stage.adam.master is not None:
        kinds["master"] = stage.precision.compute
    kinds["m"] = kinds["v"] = stage.precision.compute
    return kinds


def owned_segment(stage, kind, layer, rank):
    """Rank's owned range of the layer (shard_size elements) for one kind of state: a view."""
    a, b = layer.owned_range(rank)
    if kind == "params":
        held, (lo, _) = held_params(stage, layer)
        return held[a - lo:b - lo]
    owned = stage.owned(layer)
    state, (lo, _) = owned.state, owned.range
    array = {"master": stage.adam.master, "m": stage.adam.m, "v": stage.adam.v}[kind]
    return array[state.start + a - lo:state.start + b - lo]   # one slice (zerompi/offload/'s state in a file)


def write_shard_file(path, dtype, segments):
    """One .npy of the concatenated segments, fsync'ed; returns (data_offset, data_bytes, block
    CRCs), the CRCs computed from the same bytes as they are written (no second pass)."""
    disk_dtype = on_disk(np.empty(0, dtype)).dtype
    numel = sum(s.size for s in segments)
    crcs, crc, filled = [], 0, 0          # finished blocks; the current block's CRC and bytes
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": np.lib.format.dtype_to_descr(disk_dtype),
                                                 "fortran_order": False, "shape": (numel,)})
        data_offset = f.tell()
        for segment in segments:
            data = memoryview(on_disk(np.ascontiguousarray(to_numpy(segment)))).cast("B")   # from a GPU: a copy
            f.write(data)
            while len(data):
                take = min(len(data), BLOCK_BYTES - filled)
                crc, filled, data = zlib.crc32(data[:take], crc), filled + take, data[take:]
                if filled == BLOCK_BYTES:
                    crcs.append(crc)
                    crc, filled = 0, 0
        if filled:
            crcs.append(crc)
        f.flush()
        os.fsync(f.fileno())
    return data_offset, numel * disk_dtype.itemsize, crcs


def save_checkpoint(engine, save_dir, training_state, keep_last):
    """Collective. Write step training_state["step"]'s checkpoint; returns (this rank's error or
    None, the published folder's name on rank 0 or None). Every rank returns at the same point;
    pass the error to comm.check_all. training_state["parent"] names the checkpoint (in save_dir)
    this run continued from, for rotation."""
    comm, stage, layout = engine.comm, engine.stage, engine.layout
    name = step_folder_name(training_state["step"])
    partial = os.path.join(save_dir, PARTIAL + name)
    error = None
    if comm.rank == 0:
        try:
            os.makedirs(partial)
        except OSError as e:
            error = f"cannot create checkpoint folder {partial}: {e.strerror or e}"
    if comm.any_failed(error):
        return error, None

    kinds = state_kinds(stage)
    max_blocks = max(-(-layout.shard_numel * dtype.itemsize // BLOCK_BYTES) for dtype in kinds.values())
    crcs = np.full((len(kinds), max_blocks), -1, dtype=np.int64)       # this rank's files, padded with -1
    offsets = np.zeros(len(kinds), dtype=np.int64)
    writes = comm.rank < layout.num_ranks       # hybrid sharding: the first shard group (the rest are replicas)
    try:
        for i, (kind, dtype) in enumerate(kinds.items() if writes else ()):
            segments = [owned_segment(stage, kind, layer, comm.rank) for layer in layout.layers]
            path = os.path.join(partial, shard_file_name(comm.rank, kind))
            offsets[i], _, file_crcs = write_shard_file(path, dtype, segments)
            crcs[i, :len(file_crcs)] = file_crcs
    except OSError as e:
        error = f"cannot write checkpoint shard in {partial}: {e.strerror or e}"
    if comm.any_failed(error):                  # every rank has stopped writing: rank 0 removes what they wrote
        if comm.rank == 0:
            _discard(partial)
        return error, None

    all_crcs = np.zeros((comm.size,) + crcs.shape, dtype=np.int64) if comm.rank == 0 else None
    all_offsets = np.zeros((comm.size, len(kinds)), dtype=np.int64) if comm.rank == 0 else None
    comm.gather_to_root(crcs, all_crcs)
    comm.gather_to_root(offsets, all_offsets)
    published = None
    if comm.rank == 0:
        manifest = build_manifest(engine, training_state, kinds, all_crcs, all_offsets)
        error, published = complete(save_dir, partial, name, manifest, keep_last)
        if error and published is None:          # not put in place: a full disk keeps none of it
            _discard(partial)
    comm.any_failed(error)
    return error, published


def _discard(partial):
    """Remove an incomplete save's files and its folder (where the disk lets us)."""
    try:
        remove_partial(partial)
    except OSError:                              # what is left, the next run removes under the lock
        pass


def complete(save_dir, partial, name, manifest, keep_last):
    """Rank 0: the manifest, the rename into place, `latest`, rotation; returns (error or None,
    the published folder's name or None). Each error says how far the save got."""
    try:
        write_text_atomically(os.path.join(partial, MANIFEST), manifest)
        fsync_folder(partial)
        published = publish(save_dir, partial, name)
    except OSError as e:
        return f"cannot complete checkpoint {os.path.join(save_dir, name)}: {e.strerror or e}", None
    folder, latest = os.path.join(save_dir, published), os.path.join(save_dir, LATEST)
    try:
        if os.path.islink(latest) or (os.path.lexists(latest) and not os.path.isfile(latest)
                                      and not os.path.isdir(latest)):
            os.unlink(latest)        # a link or a FIFO where zerompi keeps `latest`: replaced (under the lock)
        if not os.path.isdir(latest):    # a folder there is not zerompi's: left alone (said at the start)
            write_text_atomically(latest, published + "\n")
    except OSError as e:
        return (f"checkpoint {folder} is complete, but {latest} could not be rewritten to name it "
                f"({e.strerror or e}); --resume finds it all the same"), published
    try:
        rotate(save_dir, keep_last, published)
    except OSError as e:
        return (f"checkpoint {folder} is complete, but removing an older one failed: "
                f"{e.filename}: {e.strerror or e}"), published
    return None, published


def build_manifest(engine, training_state, kinds, all_crcs, all_offsets):
    layout, stage = engine.layout, engine.stage
    files = []
    for rank in range(layout.num_ranks):
        for i, (kind, dtype) in enumerate(kinds.items()):
            data_bytes = layout.shard_numel * dtype.itemsize
            blocks = -(-data_bytes // BLOCK_BYTES)
            files.append({"rank": rank, "kind": kind, "path": shard_file_name(rank, kind),
                          "data_offset": int(all_offsets[rank, i]), "data_bytes": data_bytes,
                          "crc32": [int(c) for c in all_crcs[rank, i, :blocks]]})
    manifest = {
        "format": FORMAT, "version": VERSION,
        **training_state, "adam_steps": stage.adam.t,
        "stage": stage.stage, "ranks": layout.num_ranks, "dtype": stage.precision.name,
        "sizes": layout.sizes,
        "units": [{"names": list(layout.tensor_names(u)),
                   "shapes": [[u.out_features, u.in_features], [u.out_features]],
                   "numel": u.numel, "padded": u.padded, "shard_size": u.shard_size,
                   "shard_offset": u.shard_offset} for u in layout.layers],
        "kinds": {kind: dtype.name for kind, dtype in kinds.items()},
        "block_bytes": BLOCK_BYTES, "files": files,
    }
    return manifest_text(manifest)


def publish(save_dir, partial, name):
    """Rename the complete folder into place; returns its name. A step saved again (after
    resuming from an earlier step) gets a new name (step_K.2, ...), so no complete checkpoint is
    ever replaced in place: `latest` always names a complete folder."""
    final, copy = name, 1
    while os.path.lexists(os.path.join(save_dir, final)):
        copy += 1
        final = f"{name}.{copy}"
    os.rename(partial, os.path.join(save_dir, final))
    fsync_folder(save_dir)
    return final


def rotate(save_dir, keep_last, newest):
    """Keep `newest` and the keep_last - 1 checkpoints before it in its lineage (0: keep all).
    The lineage follows each manifest's "parent" (the checkpoint a run continued from), so the
    checkpoints of a run that this one resumed before the end of are never counted or deleted;
    it goes only through folders that zerompi wrote and can verify (the module docstring)."""
    if keep_last <= 0:
        return
    lineage, name = [], newest
    while name is not None and name not in (older for older, _ in lineage):
        manifest = verified_own_folder(save_dir, name)
        if manifest is None:
            break
        lineage.append((name, manifest))
        name = manifest.get("parent")
    for old, manifest in lineage[keep_last:]:
        remove_checkpoint(save_dir, old, manifest)


def verified_own_folder(save_dir, name):
    """The manifest of save_dir/name if it is a step folder that zerompi wrote and can verify
    (the module docstring), else None."""
    if step_folder_problem(save_dir, name) is not None:
        return None
    folder = os.path.join(save_dir, name)
    try:
        manifest = read_manifest(folder)
    except CheckpointError:
        return None
    expected = {MANIFEST} | {entry["path"] for entry in manifest["files"]}
    if manifest["version"] != VERSION or set(os.listdir(folder)) != expected:
        return None
    return manifest


def remove_checkpoint(save_dir, name, manifest):
    """Rename save_dir/name to .partial-name first (one atomic step: from then on it is an
    unfinished save, never read, and removed by the next run under the lock should this one be
    killed half-way), then remove the files the manifest lists, the manifest, the folder."""
    folder = os.path.join(save_dir, PARTIAL + name)
    os.rename(os.path.join(save_dir, name), folder)
    for entry in manifest["files"]:
        os.unlink(os.path.join(folder, entry["path"]))
    os.unlink(os.path.join(folder, MANIFEST))
    os.rmdir(folder)
