"""Checkpoints in the training loop: where a run starts, when it saves, and preemption.

    lock:    with --save-dir, rank 0 creates the folder and takes its lock before anything is
             read or written there (zerompi/train/loop/lock.py; released when the process ends),
             then removes the .partial-step_* folders a killed run left
    start:   --resume [FOLDER] loads a checkpoint (any N, any stage), else --init-weights, else
             the seeded initialization; the run continues at the checkpoint's step, with its
             loss scale and Adam step count, and the same data order (same seed, batch, shuffle:
             required); other settings that shape the rest of the run (steps and the learning-
             rate schedule, accumulation, clipping, data) may change, and the log says so;
             plain --resume takes the checkpoint find_checkpoint names (zerompi/checkpoint/find.py:
             `latest`, or the newest verified one when `latest` is missing or stale, said in one line)
    save:    every --save-every steps, at the end, and when preempted (a signal during the
             training loop: zerompi/train/loop/signals.py), into --save-dir
"""
import atexit
import os

import ml_dtypes
import numpy as np

from ...device import to_numpy
from ...checkpoint.weights import WeightsError, read_weights
from ...checkpoint.files import LATEST, CheckpointError
from ...checkpoint.find import find_checkpoint
from ...checkpoint.load import load_checkpoint
from .lock import remove_stale_partials, take_lock
from ...stages.params import held_params, set_layer_params
from ...checkpoint.save import save_checkpoint


def start_from(engine, cfg, scaler):
    """Collective. Lock --save-dir, set the starting weights; returns (first step, notes for the
    log or None, lineage: {"parent": the resumed checkpoint's folder name when it lies in --save-dir,
    "restarts": how many times this training was restarted from a checkpoint, this run included},
    the folder of the checkpoint resumed or None).
    A fresh run (also --init-weights, or --resume with no checkpoint yet) has 0 restarts; a resumed
    one the checkpoint's count + 1, a checkpoint written before the count was kept counting as 0."""
    comm = engine.comm
    notes = []
    if cfg.save_dir:
        error, note = claim_save_dir(cfg) if comm.rank == 0 else (None, None)
        comm.check_all(error)
        notes.append(note)
    folder, error, state = None, None, None
    try:
        if cfg.resume == "latest":
            folder, note = find_checkpoint(cfg.save_dir)
            notes.append(note)
        elif cfg.resume:
            folder = cfg.resume
        if folder is not None:
            state = load_checkpoint(engine, folder)
            error = _data_order_mismatch(state, cfg, folder)
        elif cfg.init_weights:
            for layer, values in read_weights(cfg.init_weights, engine.layout):
                set_layer_params(engine.stage, layer, values)
        else:
            engine.init_params(cfg.seed)
    except (CheckpointError, WeightsError) as e:
        error = str(e)
    except (KeyError, TypeError, ValueError) as e:       # a manifest that passed the checks but still does not fit
        error = f"{folder or cfg.init_weights}: unusable ({type(e).__name__}: {e})"
    if error is None:
        error = _unrepresentable(engine, cfg.init_weights or folder)
    comm.check_all(error)
    if cfg.resume == "latest" and folder is None:
        notes.append(f"no checkpoint in {cfg.save_dir} yet: starting from step 0")
    in_save_dir = (folder is not None and cfg.save_dir and
                   os.path.dirname(os.path.abspath(folder)) == os.path.abspath(cfg.save_dir))
    lineage = {"parent": os.path.basename(os.path.abspath(folder)) if in_save_dir else None,
               "restarts": 0 if state is None else state["restarts"] + 1}
    if state is None:
        return 0, _lines(notes), lineage, None
    if scaler.enabled and state["dtype"] == "float16":      # another dtype's scale (1.0) means nothing here
        scaler.scale = state["loss_scale"]
        scaler.good_steps = min(state["loss_scale_good_steps"], scaler.growth_interval - 1)
    changed = [f"{flag} {state['run'][key]} -> {value}" for key, flag, value in _run_settings(cfg)
               if key in state["run"] and state["run"][key] != value]
    resumed = f"resumed from {folder} at step {state['step']}"
    if changed:
        resumed += (f"; note: {', '.join(changed)} since the checkpoint: the run continues from there, but "
                    f"not as the uninterrupted run would have")
    return state["step"], _lines(notes + [state["note"], resumed]), lineage, folder


def _remove_if_empty(folders):
    """At exit: remove the folders check_save_dir made (innermost first) that hold nothing."""
    for folder in folders:
        try:
            os.rmdir(folder)
        except OSError:                        # holds checkpoints (or anything): kept, and its parents
            return


def _lines(notes):
    """The notes that are not None, one per line (None if there are none)."""
    return "\n".join(note for note in notes if note) or None


def claim_save_dir(cfg):
    """Rank 0: create --save-dir and take its lock for this process (zerompi/train/loop/lock.py),
    then remove what saves of killed runs left; returns (one-line error or None, note or None)."""
    error = check_save_dir(cfg)
    if error:
        return error, None
    try:
        note = take_lock(cfg.save_dir)
        remove_stale_partials(cfg.save_dir)
        latest = os.path.join(cfg.save_dir, LATEST)
        if os.path.isdir(latest) and not os.path.islink(latest):
            note = _lines([note, f"{latest} is a folder, where zerompi keeps the name of the newest checkpoint: it "
                                 f"is left alone, and checkpoints are saved without it (--resume takes the newest "
                                 f"one whose manifest checks out)"])
    except CheckpointError as e:
        return str(e), None
    except OSError as e:
        return f"cannot use --save-dir {cfg.save_dir}: {e.filename}: {e.strerror or e}", None
    return None, note


RUN_SETTINGS = (("steps", "--steps"), ("lr", "--lr"), ("lr_schedule", "--lr-schedule"),
                ("warmup_steps", "--warmup-steps"), ("min_lr", "--min-lr"), ("grad_accum", "--grad-accum"),
                ("clip_norm", "--clip-norm"), ("weight_decay", "--weight-decay"), ("data", "--data"))


def _run_settings(cfg):
    """(key, flag, value) of the settings that shape the rest of the run, recorded in checkpoints."""
    return [(key, flag, getattr(cfg, key)) for key, flag in RUN_SETTINGS]


def _unrepresentable(engine, source):
    """An error if the starting weights do not fit the storage dtype: float16 ends at 65504, and
    bfloat16 and float32 at about 3.4e38."""
    storage = engine.stage.precision.storage
    for layer in engine.layout.layers:
        held, _ = held_params(engine.stage, layer)
        if not np.all(np.isfinite(to_numpy(held))):
            return (f"{source or 'the initial weights'}: layer {layer.index} has values beyond the range of "
                    f"{storage.name} ({storage.name} ends at {float(ml_dtypes.finfo(storage).max):g})"
                    f"{': train in bf16 or float32' if storage == np.float16 else ''}")
    return None


def _data_order_mismatch(state, cfg, folder):
    for key, flag in (("seed", "--seed"), ("shuffle", "--shuffle"), ("batch_size", "--batch-size")):
        if state[key] != getattr(cfg, key):
            value = getattr(cfg, key)
            if key == "batch_size":              # the global batch: say where it comes from
                value = f"{value} (= {cfg.micro_batch_size} rows per rank x {cfg.grad_accum} x the ranks)"
            return (f"{folder} was written with {flag} {state[key]}, this run has {value}: "
                    f"the data order would not continue; pass the same {flag}")
    return None


def save_training_checkpoint(engine, cfg, step, scaler, lineage, input_scale):
    """Collective: checkpoint after `step` steps into --save-dir; exits on failure (status 2).
    lineage: {"parent": the previous checkpoint's folder name in --save-dir, or None, "restarts"}.
    input_scale: what the loader multiplied the data by (the digits: 1/16), recorded beside the
    settings so that an export says how to feed the model."""
    state = {"step": step, "loss_scale": scaler.scale, "loss_scale_good_steps": scaler.good_steps,
             "seed": cfg.seed, "shuffle": cfg.shuffle, "batch_size": cfg.batch_size,
             "parent": lineage["parent"], "restarts": lineage["restarts"],
             "run": {**{key: value for key, _, value in _run_settings(cfg)}, "input_scale": input_scale}}
    error, published = save_checkpoint(engine, cfg.save_dir, state, cfg.keep_last)
    engine.comm.check_all(error)
    lineage["parent"] = published           # rank 0 writes the manifests; the others keep None


def check_save_dir(cfg):
    """One-line error if --save-dir cannot hold checkpoints (rank 0 creates it), else None. The
    folders it creates are removed when the process ends, if the run left nothing in them (bad
    input found after the lock was taken: nothing written)."""
    made, folder = [], os.path.abspath(cfg.save_dir)
    while not os.path.lexists(folder):
        made.append(folder)
        folder = os.path.dirname(folder)
    try:
        os.makedirs(cfg.save_dir, exist_ok=True)
    except OSError as e:
        return f"cannot use --save-dir {cfg.save_dir}: {e.strerror or e}"
    if made:                                   # registered before the lock: removed after its release
        atexit.register(_remove_if_empty, made)
    if not os.access(cfg.save_dir, os.W_OK):
        return f"cannot use --save-dir {cfg.save_dir}: not writable"
    return None
