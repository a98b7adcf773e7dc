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
the values to the stage, which keeps what it owns.
"""
import os
import zipfile
import zlib

import ml_dtypes
import numpy as np

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


def save_weights(engine, path):
    """Collective. Rank 0 writes the consolidated file; returns its error message or None
    (the caller passes it to comm.check_all, so that every rank exits together). Every rank
    takes part in every unit's gather even after rank 0 has failed, so that no rank hangs."""
    tmp_path = os.path.join(os.path.dirname(os.path.abspath(path)),
                            f".{os.path.basename(path)}.tmp-{os.getpid()}")
    archive, error = None, None
    try:
        if engine.comm.rank == 0:
            try:
                archive = zipfile.ZipFile(tmp_path, "w", compression=zipfile.ZIP_STORED, allowZip64=True)
            except OSError as e:
                error = f"cannot save weights to {path}: {e.strerror or e}"
        for unit in engine.layout.units:
            full = engine.zero.full_unit_params(unit)        # every rank: collective in stage 3
            if archive is None or error is not None:
                continue
            try:
                for name, tensor in zip(engine.layout.tensor_names(unit), unit.views(full)):
                    with archive.open(name + ".npy", "w", force_zip64=True) as member:
                        np.lib.format.write_array(member, portable(tensor), allow_pickle=False)
            except OSError as e:
                error = f"cannot save weights to {path}: {e.strerror or e}"
        if archive is not None:
            archive.close()
            if error is None:
                _fsync_and_rename(tmp_path, path)
    except OSError as e:
        error = f"cannot save weights to {path}: {e.strerror or e}"
    finally:
        if archive is not None and os.path.exists(tmp_path):   # never leave a half-written file
            os.unlink(tmp_path)
    return error


def portable(tensor):
    """The tensor as written: bfloat16, which .npy cannot describe portably, widened to float32
    (exactly); every other dtype as it is."""
    return np.ascontiguousarray(tensor, dtype=np.float32 if tensor.dtype == BF16 else tensor.dtype)


def _fsync_and_rename(tmp_path, path):
    with open(tmp_path, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp_path, path)
    folder = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def read_weights(path, layout):
    """Yield (unit, values (numel,) float64) for each unit, after checking names, shapes and values.
    Raises WeightsError naming the file and the problem."""
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
            for name, want in zip(layout.tensor_names(unit), ((unit.out_features, unit.in_features),
                                                              (unit.out_features,))):
                if name not in archive.files:
                    raise WeightsError(f"weights file {path} lacks {name} (model sizes {layout.sizes})")
                try:
                    tensor = archive[name]
                except (OSError, EOFError, ValueError, zipfile.BadZipFile, zlib.error) as e:
                    raise WeightsError(f"weights file {path}: {name} cannot be read: {e}") from None
                if not isinstance(tensor, np.ndarray):      # a member that is not .npy data
                    raise WeightsError(f"weights file {path}: {name} is not an .npy array")
                if tensor.shape != want:
                    raise WeightsError(f"weights file {path}: {name} has shape {tensor.shape}, the model"
                                       f" (sizes {layout.sizes}) needs {want}")
                if not np.issubdtype(tensor.dtype, np.floating):
                    raise WeightsError(f"weights file {path}: {name} has dtype {tensor.dtype}, not a float type")
                if not np.all(np.isfinite(tensor)):
                    raise WeightsError(f"weights file {path}: {name} contains NaN or inf")
                values.append(tensor.reshape(-1))
            yield unit, np.concatenate(values).astype(np.float64)
