"""Sharded, pickle-free, atomic checkpoints that load onto any N and any stage.

    files.py       the on-disk layout, the manifest (and its checksum), reading any element
                   range (with CRCs)
    find.py        which checkpoint --resume continues from (`latest`, or the newest verified)
    save.py        the collective save: every rank writes its owned ranges; atomic publication
    load.py        loading into any (N, stage): each rank reads only what it will hold
    export.py      streaming export to safetensors and to the consolidated .npz
    __main__.py    `python -m zerompi.checkpoint`: a door into zerompi/train/commands/checkpoint.py
"""
from .files import CheckpointError
from .find import find_checkpoint, latest_checkpoint
from .load import load_checkpoint
from .save import save_checkpoint

__all__ = ["CheckpointError", "find_checkpoint", "latest_checkpoint", "load_checkpoint", "save_checkpoint"]
