"""Which checkpoint --resume continues from, in a save directory (find_checkpoint).

    the one `latest` names                       normally
    the newest checkpoint continuing from it     when one does: its save completed, but the
                                                 rewrite of `latest` failed (a stale `latest`)
    the newest step folder whose manifest        when `latest` is missing or unusable (a FIFO,
    verifies (zerompi/checkpoint/manifest.py)    a folder, a name outside the save directory)

A step folder may be a symbolic link to a folder (a checkpoint moved to another disk and linked
back): it is read like the others, and its manifest must verify; rotation never removes it.

Each departure from `latest` is said in one line; a `latest` naming a damaged checkpoint stops
the run with one line instead: nothing is skipped silently.
"""
import os

from ..util.inputs import open_regular
from .files import LATEST, CheckpointError, step_folder_problem, step_of
from .manifest import read_manifest


def latest_checkpoint(save_dir):
    """The folder `save_dir/latest` names, or None when there is no `latest`. Raises
    CheckpointError (one line naming `latest`) when it cannot be read or names no step folder."""
    pointer = os.path.join(save_dir, LATEST)
    if not os.path.lexists(pointer):
        return None
    try:
        with open_regular(pointer, CheckpointError, "r") as f:
            name = f.read(256).strip()
    except UnicodeDecodeError:
        raise CheckpointError(f"{pointer}: not text: not a pointer to a checkpoint") from None
    problem = step_folder_problem(save_dir, name, links=True)
    if problem:
        shown = repr(name) if len(name) <= 60 else f"{name[:40]!r}... ({len(name)}+ characters)"
        raise CheckpointError(f"{pointer}: names {shown}, {problem}")
    return os.path.join(save_dir, name)


def verified_step_folders(save_dir):
    """{name: manifest} of save_dir's step folders whose manifests read (read_manifest refuses
    one whose step is not the one in its folder's name)."""
    try:
        names = os.listdir(save_dir)
    except OSError:
        return {}
    found = {}
    for name in names:
        if step_folder_problem(save_dir, name, links=True) is None:
            try:
                manifest = read_manifest(os.path.join(save_dir, name))
            except CheckpointError:
                continue
            found[name] = manifest
    return found


def newest_continuation(name, manifests):
    """The newest checkpoint that continues, save after save, from `name` (its parent, its
    parent's parent, ... is name); name itself when none does. manifests: {name: manifest}."""
    seen = {name}
    while True:
        children = [child for child, m in manifests.items() if m.get("parent") == name and child not in seen]
        if not children:
            return name
        name = max(children, key=step_of)
        seen.add(name)


def find_checkpoint(save_dir):
    """The checkpoint --resume continues from (see the module docstring): (folder or None when
    save_dir has none yet, a one-line note when `latest` was not followed as it is, or None)."""
    pointer = os.path.join(save_dir, LATEST)
    manifests = verified_step_folders(save_dir)
    try:
        named = latest_checkpoint(save_dir)
    except CheckpointError as e:
        problem = str(e)
    else:
        if named is not None:
            newest = os.path.join(save_dir, newest_continuation(os.path.basename(named), manifests))
            if newest == named:
                return named, None
            return newest, (f"{pointer} names {named}, but {newest} continues from it (its save was complete, "
                            f"`latest` was not rewritten): using {newest}")
        problem = f"{pointer}: missing"
    if not manifests:
        if any(step_of(name) for name in _names_in(save_dir)):
            raise CheckpointError(f"{problem}, and no step folder of {save_dir} has a manifest that checks out: "
                                  f"pass --resume FOLDER, or move them away to start from step 0")
        if os.path.lexists(pointer):
            raise CheckpointError(f"{problem}, and {save_dir} holds no step folder")
        return None, None
    newest = os.path.join(save_dir, max(manifests, key=step_of))
    return newest, f"{problem}: using {newest}, the newest checkpoint whose manifest checks out"


def _names_in(folder):
    try:
        return os.listdir(folder)
    except OSError:
        return []
