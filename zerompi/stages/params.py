"""A stage's parameters from outside the training step: initial values, checkpoints, weight files.

Every stage answers `owned(layer)` (zerompi/stages/base.py): this rank's range (lo, hi) of the
layer, and where its parameters and Adam state are. Stages 0-2 also hold the full parameters
(`param_full`); stage 3 holds only the owned range, so a full layer needs an all-gather there.

    held_params        the layer's parameters this rank holds: all of them (stages 0-2) or the
                       owned range (stage 3), with (lo, hi)
    set_layer_params   write values (numel,), or a chunk of them, the same on every rank, where
                       the stage keeps them
                       (and the fp32 master copy of the owned range in mixed precision)
    full_layer_params  the layer's full parameters (padded,); collective in stage 3

Each first finishes the collectives in flight (with --overlap the step's last all-gathers may
still be running).
"""
from ..ledger import IO


def held_params(stage, layer):
    """(the layer's parameters this rank holds, (lo, hi): which elements of the layer they are)."""
    stage.finish_communication()
    if stage.param_full is not None:
        return stage.param_full[stage.layout.full_slice(layer)], (0, layer.padded)
    owned = stage.owned(layer)
    return owned.param, owned.range


def set_layer_params(stage, layer, values, start=0):
    """values (n,) float64, the layer's real elements start .. start + n - 1, the same on every
    rank -> the stage's parameters; in mixed precision also the fp32 master copy of the owned
    range, so that the 16-bit parameters are round(master), as after every Adam step."""
    stage.finish_communication()
    values = stage.memory.device.from_numpy(values.astype(stage.precision.compute))
    end = start + values.size
    if stage.param_full is not None:
        stage.param_full[layer.full_offset + start:layer.full_offset + end] = values
    owned = stage.owned(layer)
    lo, hi = owned.range                             # of the padded layer: may reach into padding
    first, last = max(lo, start), min(hi, end)       # what this rank owns of these values
    if first >= last:
        return
    mine = values[first - start:last - start]
    if stage.param_full is None:
        owned.param[first - lo:last - lo] = mine
    if stage.adam.master is not None:
        at = owned.state.start - lo                  # one slice: the state may live in a file (zerompi/offload/)
        stage.adam.master[at + first:at + last] = mine


def full_layer_params(stage, layer):
    """The layer's full flat parameters (padded,). Collective in stage 3 (call on every rank):
    all-gathered into the stage's first one-layer gather buffer, valid until the next gather."""
    stage.finish_communication()
    if stage.param_full is not None:
        return stage.param_full[stage.layout.full_slice(layer)]
    full = stage.param_gather.buffers[0][:layer.padded]
    stage.collectives.allgather(stage.param_shard_of(layer), full, IO).wait()
    return full
