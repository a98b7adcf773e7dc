"""Sharded checkpoints on disk: the folder layout and its names, and what may replace them.

    save_dir/
      .lock                        "<host> <pid>": the run using this folder (zerompi/train/loop/lock.py)
      latest                       "step_00000300": the newest complete checkpoint (written last)
      step_00000300/
        manifest.json              what the rest holds (manifest.py); written after every shard file
        rank00000.params.npy       rank 0's owned range of every layer, layers end to end (the shard
        rank00000.master.npy       layout of zerompi/layout.py); one file per kind of state:
        rank00000.m.npy            params (the stored dtype), master (mixed precision only), m, v
        rank00000.v.npy
        rank00001.params.npy  ...
      step_00000300.2/             the same step saved again after a resume from an earlier one
      .partial-step_00000400/      a save in progress, a killed one, or an old one being removed: never read

Everything a manifest or `latest` names stays inside the save directory: `latest` and `parent`
must be step folder names (step_XXXXXXXX, or step_XXXXXXXX.K), a step folder must be a real
folder (not a symbolic link), and each file path is exactly rank{r:05d}.{kind}.npy.

The manifest and its checks: zerompi/checkpoint/manifest.py. Reading the shard files (which rank's
file holds which element): zerompi/checkpoint/reader.py. Which checkpoint --resume continues from:
zerompi/checkpoint/find.py.
"""
import os
import re

import numpy as np

from ..util.atomic import atomic_file
from ..precision import BF16

MANIFEST = "manifest.json"
LATEST = "latest"
LOCK = ".lock"                 # "host pid" of the run using the save dir (zerompi/train/loop/lock.py)
PARTIAL = ".partial-"           # a save in progress, a killed one, or a checkpoint being removed
BLOCK_BYTES = 1 << 20
STEP_FOLDER = re.compile(r"step_(\d{8,})(?:\.([2-9]|[1-9]\d+))?", re.ASCII)


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


