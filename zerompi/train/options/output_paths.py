"""The paths of a run: an output never destroys an input or another output.

output_overwrites_input(cfg) checks the outputs (--save-weights, --metrics, --trace, --tensorboard,
--save-dir's checkpoints) against the inputs (--data, --init-weights, --config, --deepspeed-config),
against each other and against the checkpoint folders (by path, and by device and inode: a hard
link), and --offload-dir against both, before anything is written: one line for config_checks.py's
check_config, or None.
"""
import os

from ...checkpoint.files import hard_link_of, replaces_checkpoint_file
from ..loop.data import BUILTIN_DATA


OUTPUT_FLAGS = ("save_weights", "metrics", "trace", "tensorboard")
INPUT_FLAGS = ("data", "init_weights", "config", "deepspeed_config")


def output_overwrites_input(cfg):
    """One line if an output (--save-weights, --metrics, --trace, --tensorboard) is an input (--data,
    --init-weights, --config, --deepspeed-config) by any name: the same (st_dev, st_ino) where the
    output exists, so symlinks and hard links count; or if --save-dir is or holds an input (by
    real path); or if two outputs are one file; or if --tensorboard's folder is a checkpoint folder.
    None if no output touches an input or another output."""
    inputs = [(_flag_name(name), getattr(cfg, name)) for name in INPUT_FLAGS
              if getattr(cfg, name) and os.path.exists(getattr(cfg, name))
              and not (name == "data" and cfg.data in BUILTIN_DATA)]
    for name in OUTPUT_FLAGS:
        output = getattr(cfg, name)
        for flag, path in inputs:
            if output and _same_file(output, path):
                return (f"{_flag_name(name)} {output} is {flag} {path}: writing it would destroy the input; "
                        f"choose another path")
    outputs = [(_flag_name(name), getattr(cfg, name)) for name in OUTPUT_FLAGS if getattr(cfg, name)]
    for i, (flag, path) in enumerate(outputs):
        for other_flag, other in outputs[i + 1:]:
            if os.path.realpath(path) == os.path.realpath(other):    # symlinks followed, even to no file yet
                return f"{flag} {path} and {other_flag} {other} are one file: give each output its own path"
    resumed = cfg.resume if cfg.resume and cfg.resume != "latest" else None
    for flag, path in outputs:
        problem = ((cfg.save_dir and replaces_checkpoint_file(path, cfg.save_dir)) or
                   (resumed and replaces_checkpoint_file(path, os.path.dirname(os.path.abspath(resumed)), resumed)))
        if problem:
            return f"{flag} {problem}: write it elsewhere"
        linked = hard_link_of(path, cfg.save_dir, resumed)
        if linked:
            return (f"{flag} {path} is {linked} (a hard link): writing it would destroy the checkpoint file; "
                    f"choose another path")
    if cfg.tensorboard and any(folder and os.path.realpath(cfg.tensorboard) == os.path.realpath(folder)
                               for folder in (cfg.save_dir, resumed)):
        return f"--tensorboard {cfg.tensorboard} is a checkpoint folder: write the events elsewhere"
    if cfg.save_dir:
        folder = os.path.realpath(cfg.save_dir)
        for flag, path in inputs:
            if os.path.commonpath([folder, os.path.realpath(path)]) == folder:
                return (f"--save-dir {cfg.save_dir} holds {flag} {path}: checkpoints are written and rotated "
                        f"there; keep the inputs outside it")
    return offload_dir_problem(cfg.offload_dir, inputs, [cfg.save_dir, resumed]) if cfg.offload_dir else None


def offload_dir_problem(offload_dir, inputs, checkpoint_folders):
    """--offload-dir must be an existing folder, outside every checkpoint folder, holding no input
    (a dead run's scratch files are removed there, zerompi/train/loop/offload_folder.py)."""
    if not os.path.isdir(offload_dir):
        return f"--offload-dir {offload_dir} is not a folder: create it (a node-local disk is best)"
    folder = os.path.realpath(offload_dir)
    for checkpoints in filter(None, checkpoint_folders):
        if os.path.commonpath([folder, os.path.realpath(checkpoints)]) == os.path.realpath(checkpoints):
            return (f"--offload-dir {offload_dir} is inside the checkpoint folder {checkpoints}: offload files "
                    f"are scratch, never checkpoints; give them a folder of their own")
    for flag, path in inputs:
        if os.path.commonpath([folder, os.path.realpath(path)]) == folder:
            return f"--offload-dir {offload_dir} holds {flag} {path}: keep the inputs outside it"
    return None


def _same_file(a, b):
    try:
        return os.path.samefile(a, b)          # os.stat of both: (st_dev, st_ino) after symlinks
    except OSError:                            # a does not exist (yet): it is no existing input
        return False


def _flag_name(field_name):
    return "--" + field_name.replace("_", "-")
