"""Consolidated weight files: one pickle-free .npz for the whole model, whatever the stage and N.

Format (docs/checkpoints.md): a standard uncompressed .npz, i.e. a zip archive of .npy files,
one per tensor, with no pickled objects (always read with allow_pickle=False):

    layers.{i}.weight   (sizes[i+1], sizes[i])   the torch.nn.Linear layout: y = x W^T + b
    layers.{i}.bias     (sizes[i+1],)
    for i = 0 .. len(sizes) - 2, in the training dtype (float64, float32, float16), except that
    bfloat16, which .npy cannot describe portably, is widened to float32 (exactly).

Saving streams one layer at a time: every rank takes part in `full_layer_params` (a collective
all-gather in stage 3), and rank 0 writes that layer's two arrays into the archive before the next
layer is gathered, so no rank ever holds more than one layer's gathered parameters. The archive is
written atomically (zerompi/util/atomic.py): a reader sees the old file or the complete new one.

Loading reads one layer at a time on every rank (np.load of an .npz is lazy per array) and hands
the values to the stage, which keeps what it owns. A .safetensors file with the same tensor names
(what `python -m zerompi.checkpoint export` writes) loads the same way.
"""
import os
import zipfile

import numpy as np

from ..util.atomic import atomic_file
from ..device import to_numpy
from ..util.inputs import open_regular
from ..util.npz_members import declared, open_npz, read
from ..precision import BF16

from ..stages.params import full_layer_params
from .safetensors_io import SafetensorsError, read_header, read_tensor


class WeightsError(ValueError):
    """A weights file that cannot be used; str(e) is one line naming the file and the problem."""


def check_writable(path, what="weights"):
    """One-line error message if `path` cannot be written as a file of `what`, else None."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        return f"cannot save {what} to {path}: folder {folder} does not exist"
    if not os.access(folder, os.W_OK):
        return f"cannot save {what} to {path}: folder {folder} is not writable"
    if os.path.isdir(path):
        return f"cannot save {what} to {path}: it is a folder"
    if os.path.lexists(path) and not os.path.isfile(path):           # a FIFO, a device, a dangling link
        return f"cannot save {what} to {path}: it exists and is not a regular file"
    return None


def write_npz(path, named_tensors):
    """Stream (name, tensor) pairs into a consolidated .npz, atomically (zerompi/util/atomic.py)."""
    with atomic_file(path) as f, zipfile.ZipFile(f, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
        for name, tensor in named_tensors:
            with archive.open(name + ".npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, portable(tensor), allow_pickle=False)


def consolidated_tensors(engine):
    """(name, tensor) of every tensor, one layer at a time. Collective in stage 3 (each layer is
    all-gathered): every rank must run it to the end."""
    for layer in engine.layout.layers:
        full = full_layer_params(engine.stage, layer)
        yield from zip(engine.layout.tensor_names(layer), layer.views(to_numpy(full)))   # from a GPU: a copy


def save_weights(engine, path):
    """Collective. Rank 0 writes the consolidated file; returns its error message or None
    (the caller passes it to comm.check_all, so that every rank exits together)."""
    tensors = consolidated_tensors(engine)
    if engine.comm.rank != 0:
        for _ in tensors:                 # take part in every layer's gather
            pass
        return None
    try:
        write_npz(path, tensors)
    except OSError as e:
        for _ in tensors:                 # the other ranks are still gathering: keep up with them
            pass
        return f"cannot save weights to {path}: {e.strerror or e}"
    return None


def portable(tensor):
    """The tensor as written: bfloat16, which .npy cannot describe portably, widened to float32
    (exactly); every other dtype as it is."""
    return np.ascontiguousarray(tensor, dtype=np.float32 if tensor.dtype == BF16 else tensor.dtype)


def read_weights(path, layout):
    """Yield (layer, values (numel,) float64) for each layer, after checking names, shapes and values,
    from a consolidated .npz or a .safetensors file. Only a regular file is read; an .npz member's
    shape is checked (against the file and the model, zerompi/util/npz_members.py) before it is read.
    Raises WeightsError naming the file and the problem."""
    if path.endswith(".safetensors"):
        open_regular(path, _weights_error).close()           # a FIFO or a device: refused, not opened
        try:
            header, _, data_start = read_header(path)
        except SafetensorsError as e:
            raise WeightsError(f"weights file {e}") from None
        yield from _layers(path, layout, header, lambda name, want: read_tensor(path, header, data_start, name))
        return

    with open_npz(path, _weights_error) as archive:
        def read_member(name, want):
            what = f"weights file {path}: {name}"
            shape, _ = declared(archive, name, WeightsError, what)
            if shape != want:                                # before numpy allocates the declared shape
                raise WeightsError(_shape_mismatch(path, layout, name, shape, want))
            return read(archive, name, WeightsError, what)

        yield from _layers(path, layout, archive.files, read_member)


def _weights_error(message):
    """WeightsError for a message naming the file (open_regular's, open_npz's)."""
    return WeightsError(f"weights file {message}")


def _layers(path, layout, names_in_file, read):
    """(layer, values) for each layer, reading each tensor with read(name, shape the model needs)
    after checking that the file's names are the model's (safetensors exports may add optimizer.*
    tensors)."""
    model_names = [name for layer in layout.layers for name in layout.tensor_names(layer)]
    extra = sorted(set(names_in_file) - set(model_names) - {n for n in names_in_file if n.startswith("optimizer.")})
    if extra:
        raise WeightsError(f"weights file {path} has tensors this model does not: {', '.join(extra[:4])}"
                           f" (model: {len(layout.layers)} layers, sizes {layout.sizes})")
    for layer in layout.layers:
        values = np.empty(layer.numel, dtype=np.float64)   # the layer, one tensor at a time (docs/planning.md)
        start = 0
        for name in layout.tensor_names(layer):
            if name not in names_in_file:
                raise WeightsError(f"weights file {path} lacks {name} (model sizes {layout.sizes})")
            want = (layer.out_features, layer.in_features) if name.endswith(".weight") else (layer.out_features,)
            tensor = _checked(path, layout, name, want, read(name, want))
            part = values[start:start + tensor.size]
            part[...] = tensor
            del tensor
            if not np.all(np.isfinite(part)):
                raise WeightsError(f"weights file {path}: {name} contains NaN or inf")
            start += part.size
        yield layer, values


def _shape_mismatch(path, layout, name, shape, want):
    return f"weights file {path}: {name} has shape {shape}, the model (sizes {layout.sizes}) needs {want}"


def _checked(path, layout, name, want, tensor):
    """The tensor flattened, after checking its shape and dtype (its values: once in float64)."""
    if tensor.shape != want:
        raise WeightsError(_shape_mismatch(path, layout, name, tensor.shape, want))
    if not (np.issubdtype(tensor.dtype, np.floating) or tensor.dtype == BF16):
        raise WeightsError(f"weights file {path}: {name} has dtype {tensor.dtype}, not a float type")
    return tensor.reshape(-1)
