"""Loading a checkpoint into any N and any stage: each rank reads only the ranges it will hold.

For each layer, a rank holds some range of the parameters and some range of the optimizer state
(`held_params` and `owned`, zerompi/stages/params.py): stage 0 everything, stages 1-2 all parameters but
only the owned range of the state, stage 3 only the owned range of both. CheckpointReader fetches
exactly those elements from the files of the writer ranks that owned them (checking the CRC of
every block it touches), so resharding needs no offline step and no rank ever holds more than
it keeps, stage 3 included.

Which copy of the parameters: the stored parameters when they are in this run's storage dtype
(the same dtype resumed: bit for bit), else the most precise copy the checkpoint has (the fp32
master in mixed precision, else the parameters), converted. A mixed-precision run takes its fp32
master from the checkpoint's master, or from its parameters when it has none. m and v are read as
saved and converted to this run's state dtype. Adam's step count and the training position come
from the manifest.
"""

from ..stages.params import held_params
from .files import CheckpointError
from .reader import CheckpointReader

TRAINING_STATE = ("step", "loss_scale", "loss_scale_good_steps", "seed", "shuffle", "batch_size", "dtype")


def load_checkpoint(engine, folder):
    """Fill the engine's parameters and Adam state from the checkpoint in folder; returns the
    training state (step, loss scale, data order; "note": a line when the manifest is of
    version 1, whose content cannot be verified, else None). Raises CheckpointError. Not collective."""
    reader = CheckpointReader(folder)
    manifest = reader.manifest
    layout, stage = engine.layout, engine.stage
    if manifest["sizes"] != layout.sizes:
        raise CheckpointError(f"{folder}: a checkpoint of an MLP with sizes {manifest['sizes']}, but this "
                              f"run builds {layout.sizes}")
    best = "master" if "master" in reader.kinds else "params"
    param_source = "params" if reader.kinds["params"] == stage.precision.storage else best
    optimizer_arrays = [("m", stage.adam.m), ("v", stage.adam.v)]
    if stage.adam.master is not None:
        optimizer_arrays.append((best, stage.adam.master))
    to_device = engine.memory.device.from_numpy      # read on the host, copied to a GPU
    for layer in layout.layers:
        held, (lo, hi) = held_params(stage, layer)
        held[...] = to_device(reader.read_range(layer.index, param_source, lo, hi, reader.kinds[param_source]))
        owned = stage.owned(layer)
        state, (lo, hi) = owned.state, owned.range
        for kind, array in optimizer_arrays:
            array[state] = to_device(reader.read_range(layer.index, kind, lo, hi, reader.kinds[kind]))
    stage.adam.t = int(manifest["adam_steps"])
    state = {key: manifest[key] for key in TRAINING_STATE}
    state["run"] = manifest.get("run", {})        # the settings of the run that wrote it
    state["restarts"] = manifest.get("restarts", 0)   # absent in older manifests: counted from there
    state["note"] = reader.note
    return state
