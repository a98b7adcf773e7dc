"""Consolidated weight files: one pickle-free .npz for the whole model, whatever the stage and N.

Format (documented in README): a standard uncompressed .npz, i.e. a zip archive of .npy files,
one per tensor, with no pickled objects (always read with allow_pickle=False):

    layers.{i}.weight   (sizes[i+1], sizes[i])   the torch.nn.Linear layout: y = x W^T + b
    layers.{i}.bias     (sizes[i+1],)
    for i = 0 .. len(sizes) - 2, in the training dtype (float64, float32, float16), except that
    bfloat16, which .npy cannot describe portably, is widened to float32 (exactly).

Saving streams one unit at a time: every rank takes part in `full_unit_params` (a collective
all-gather in stage 3), and rank 0 writes that unit's two arrays into the archive before the next
unit is gathered, so no rank ever holds more than one unit's gathered parameters. The archive is
written under a temporary name in the target folder, fsync'ed, and renamed over the target: a
reader sees the old file or the complete new one, never a half-written one.

Loading reads one unit at a time on every rank (np.load of an .npz is lazy per array) and hands
the values to the stage, which keeps what it owns. A .safetensors file with the same tensor names
(what `python -m zerompi.checkpoint export` writes) loads the same way.
"""
import os
import zipfile
import zlib

import ml_dtypes
import numpy as np

from .safetensors_io import SafetensorsError, read_header, read_tensor

BF16 = np.dtype(ml_dtypes.bfloat16)


class WeightsError(ValueError):
    """A weights file that cannot be used; str(e) is one line naming the file and the problem."""


def check_writable(path):
    """One-line error message if `path` cannot be written as a weights file, else None."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        return f"cannot save weights to {path}: folder {folder} does not exist"
    if not os.access(folder, os.W_OK):
        return f"cannot save weights to {path}: folder {folder} is not writable"
    if os.path.isdir(path):
        return f"cannot save weights to {path}: it is a folder"
    return None


class AtomicNpzWriter:
    """A consolidated .npz written one tensor at a time under a temporary name; `commit` fsyncs it
    and renames it over the target; `discard` (or an exception inside `with`) removes it."""

    def __init__(self, path):
        self.path = path
        self.tmp_path = os.path.join(os.path.dirname(os.path.abspath(path)),
                                     f".{os.path.basename(path)}.tmp-{os.getpid()}")
        self.archive = zipfile.ZipFile(self.tmp_path, "w", compression=zipfile.ZIP_STORED, allowZip64=True)

    def add(self, name, tensor):
        with self.archive.open(name + ".npy", "w", force_zip64=True) as member:
            np.lib.format.write_array(member, portable(tensor), allow_pickle=False)

    def commit(self):
        self.archive.close()
        with open(self.tmp_path, "rb") as f:
            os.fsync(f.fileno())
        os.replace(self.tmp_path, self.path)
        folder = os.open(os.path.dirname(os.path.abspath(self.path)), os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)

    def discard(self):
        self.archive.close()
        if os.path.exists(self.tmp_path):
            os.unlink(self.tmp_path)

    def __enter__(self):
        return self

    def __exit__(self, kind, value, traceback):
        if kind is not None or os.path.exists(self.tmp_path):
            self.discard()


def save_weights(engine, path):
    """Collective. Rank 0 writes the consolidated file; returns its error message or None
    (the caller passes it to comm.check_all, so that every rank exits together). Every rank
    takes part in every unit's gather even after rank 0 has failed, so that no rank hangs."""
    writer, error = None, None
    try:
        if engine.comm.rank == 0:
            try:
                writer = AtomicNpzWriter(path)
            except OSError as e:
                error = f"cannot save weights to {path}: {e.strerror or e}"
        for unit in engine.layout.units:
            full = engine.zero.full_unit_params(unit)        # every rank: collective in stage 3
            if writer is None or error is not None:
                continue
            try:
                for name, tensor in zip(engine.layout.tensor_names(unit), unit.views(full)):
                    writer.add(name, tensor)
            except OSError as e:
                error = f"cannot save weights to {path}: {e.strerror or e}"
        if writer is not None and error is None:
            writer.commit()
    except OSError as e:
        error = f"cannot save weights to {path}: {e.strerror or e}"
    finally:
        if writer is not None and os.path.exists(writer.tmp_path):   # never leave a half-written file
            writer.discard()
    return error


def portable(tensor):
    """The tensor as written: bfloat16, which .npy cannot describe portably, widened to float32
    (exactly); every other dtype as it is."""
    return np.ascontiguousarray(tensor, dtype=np.float32 if tensor.dtype == BF16 else tensor.dtype)


def read_weights(path, layout):
    """Yield (unit, values (numel,) float64) for each unit, after checking names, shapes and values,
    from a consolidated .npz or a .safetensors file. Raises WeightsError naming the file and the problem."""
    if path.endswith(".safetensors"):
        yield from _read_safetensors_weights(path, layout)
        return
    try:
        archive = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise WeightsError(f"weights file {path} does not exist") from None
    except (OSError, EOFError, ValueError, zipfile.BadZipFile) as e:
        raise WeightsError(f"weights file {path} is not a readable .npz: {e or 'empty file'}") from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise WeightsError(f"weights file {path} is a single .npy array, not an .npz of named tensors")
    with archive:
        expected = [name for unit in layout.units for name in layout.tensor_names(unit)]
        unexpected = sorted(set(archive.files) - set(expected))
        if unexpected:
            raise WeightsError(f"weights file {path} has tensors this model does not: {', '.join(unexpected[:4])}"
                               f" (model: {len(layout.units)} layers, sizes {layout.sizes})")
        for unit in layout.units:
            values = []
            for name in layout.tensor_names(unit):
                if name not in archive.files:
                    raise WeightsError(f"weights file {path} lacks {name} (model sizes {layout.sizes})")
                try:
                    tensor = archive[name]
                except (OSError, EOFError, ValueError, zipfile.BadZipFile, zlib.error) as e:
                    raise WeightsError(f"weights file {path}: {name} cannot be read: {e}") from None
                if not isinstance(tensor, np.ndarray):      # a member that is not .npy data
                    raise WeightsError(f"weights file {path}: {name} is not an .npy array")
                values.append(_checked(path, layout, unit, name, tensor))
            yield unit, np.concatenate(values).astype(np.float64)


def _checked(path, layout, unit, name, tensor):
    """The tensor flattened, after checking its shape, dtype and values."""
    want = (unit.out_features, unit.in_features) if name.endswith(".weight") else (unit.out_features,)
    if tensor.shape != want:
        raise WeightsError(f"weights file {path}: {name} has shape {tensor.shape}, the model"
                           f" (sizes {layout.sizes}) needs {want}")
    if not (np.issubdtype(tensor.dtype, np.floating) or tensor.dtype == BF16):
        raise WeightsError(f"weights file {path}: {name} has dtype {tensor.dtype}, not a float type")
    if not np.all(np.isfinite(tensor.astype(np.float64))):
        raise WeightsError(f"weights file {path}: {name} contains NaN or inf")
    return tensor.reshape(-1)


def _read_safetensors_weights(path, layout):
    if not os.path.exists(path):
        raise WeightsError(f"weights file {path} does not exist")
    try:
        header, _, data_start = read_header(path)
    except SafetensorsError as e:
        raise WeightsError(f"weights file {e}") from None
    model_names = [name for unit in layout.units for name in layout.tensor_names(unit)]
    extra = sorted(set(header) - set(model_names) - {n for n in header if n.startswith("optimizer.")})
    if extra:
        raise WeightsError(f"weights file {path} has tensors this model does not: {', '.join(extra[:4])}"
                           f" (model: {len(layout.units)} layers, sizes {layout.sizes})")
    for unit in layout.units:
        values = []
        for name in layout.tensor_names(unit):
            if name not in header:
                raise WeightsError(f"weights file {path} lacks {name} (model sizes {layout.sizes})")
            values.append(_checked(path, layout, unit, name, read_tensor(path, header, data_start, name)))
        yield unit, np.concatenate(values).astype(np.float64)
