"""Training data: the shipped digits, a synthetic classification set, a checked .npz loader.

Shapes (defined once, used in every comment below):
    S      training samples            F   features per sample
    (N is kept for the number of ranks, as everywhere else in zerompi.)
    T      held-out (test) samples     C   classes
    G      global batch (rows per step, summed over all ranks)

load_digits()          the handwritten digits shipped in the package (the default data set).
make_synthetic(seed)   a procedurally generated set: x ~ N(0, I), labels from a fixed random
                       "teacher" network, so an MLP can learn it well above chance. No download,
                       bitwise deterministic given its arguments.
load_npz(path, dtype)  the user's data from an .npz archive: a regular file, loaded without
                       pickle, sizes checked before allocating, values finite in the run's compute
                       dtype; every problem a one-line DataError naming the file.
load_data(cfg)         the data set --data names, checked against --classes and --batch-size.
Which rows make up each step's batch: zerompi/train/loop/batches.py.
"""
import os
from dataclasses import dataclass

import numpy as np

from ...util.inputs import check_fits
from ...util.npz_members import declared, open_npz, read
from ...util.words import counted


class DataError(ValueError):
    """Bad user data; str(e) is a one-line message naming the problem (and the file)."""


@dataclass
class Dataset:
    x_train: np.ndarray          # (S, F) float64
    y_train: np.ndarray          # (S,) int64
    x_test: np.ndarray | None    # (T, F) float64, or None when there is no held-out split
    y_test: np.ndarray | None    # (T,) int64, or None
    num_classes: int             # 1 + largest label in y_train / y_test
    name: str                    # e.g. "synthetic(seed=0)" or the file path
    input_scale: float = 1.0     # x = the file's values x input_scale (the digits: 1/16); checkpoints record it

    @property
    def num_features(self) -> int:
        return self.x_train.shape[1]


# ----------------------------------------------------------------------------------------------
# Synthetic data
# ----------------------------------------------------------------------------------------------

TEACHER_HIDDEN = 64          # width of the teacher's hidden layer
TEACHER_CALIBRATION = 4096   # samples used once to centre and scale the teacher's class scores


def make_synthetic(seed: int = 0, n_train: int = 8192, n_test: int = 2048, features: int = 32,
                   classes: int = 10) -> Dataset:
    """A classification set labelled by a fixed random teacher network.

    Everything comes from one np.random.default_rng(seed), drawn in this order:
        A  (F, 64)   teacher weights, N(0, 1/F)       so x @ A has layer variance
        B  (64, C)   teacher weights, N(0, 1/64)
        calibration inputs (4096, F), then x_train (S, F), then x_test (T, F), all N(0, I)
    The teacher's class scores are s = tanh(x @ A) @ B. Left as they are, a few classes would win
    most of the argmaxes, so each score column is centred and scaled by its mean and standard
    deviation over the calibration inputs (a fixed property of the teacher, the same for any S, T):
        y = argmax((s - mean) / std)
    which makes the classes roughly balanced. Train and test come from the same distribution.
    Raises DataError if some class does not appear in y_train (only possible for tiny n_train).
    """
    rng = np.random.default_rng(seed)
    teacher_in = rng.standard_normal((features, TEACHER_HIDDEN)) / np.sqrt(features)   # A (F, 64)
    teacher_out = rng.standard_normal((TEACHER_HIDDEN, classes)) / np.sqrt(TEACHER_HIDDEN)  # B

    def teacher_scores(x):                                   # x (rows, F) -> (rows, C)
        return np.tanh(x @ teacher_in) @ teacher_out

    calibration_scores = teacher_scores(rng.standard_normal((TEACHER_CALIBRATION, features)))
    score_mean = calibration_scores.mean(axis=0)             # (C,)
    score_std = calibration_scores.std(axis=0)               # (C,)

    def teacher_labels(x):                                   # x (rows, F) -> (rows,) int64
        return np.argmax((teacher_scores(x) - score_mean) / score_std, axis=1).astype(np.int64)

    x_train = rng.standard_normal((n_train, features))       # (S, F) float64
    x_test = rng.standard_normal((n_test, features))         # (T, F) float64
    y_train = teacher_labels(x_train)                        # (S,)
    y_test = teacher_labels(x_test)                          # (T,)

    counts = np.bincount(y_train, minlength=classes)         # (C,)
    if np.any(counts == 0):
        missing = np.flatnonzero(counts == 0).tolist()
        raise DataError(f"synthetic(seed={seed}): classes {missing} do not appear among the "
                        f"{n_train} training samples; use more samples or fewer classes")
    return Dataset(x_train, y_train, x_test, y_test, num_classes=classes,
                   name=f"synthetic(seed={seed})")


# ----------------------------------------------------------------------------------------------
# The handwritten digits shipped in the package
# ----------------------------------------------------------------------------------------------

DIGITS_PATH = os.path.join(os.path.dirname(os.path.dirname(__file__)), "datasets", "digits.npz")
DIGITS_MAX = 16                  # the largest pixel count: the loader divides by it


def load_digits() -> Dataset:
    """The UCI handwritten digits (Alpaydin & Kaynak 1998, CC BY 4.0), shipped in the package:
    8x8 images of 0..9, x (1497, 64) and a held-out x_test (300, 64), pixel counts 0..16 scaled to
    [0, 1]. tools/make_digits.py wrote the file from scikit-learn's copy; no download."""
    data = load_npz(DIGITS_PATH)
    data.input_scale = 1 / DIGITS_MAX
    data.x_train *= data.input_scale                      # exact: a power of two
    data.x_test *= data.input_scale
    data.name = "digits"
    return data


# ----------------------------------------------------------------------------------------------
# Loading an .npz file
# ----------------------------------------------------------------------------------------------

def load_npz(path: str, dtype=np.float64, ranks_on_node: int = 1) -> Dataset:
    """Load and check a dataset saved with np.savez(path, x=..., y=..., [x_test=..., y_test=...]).

    Keys:
        x        (S, F)  floating point; integer x (e.g. uint8 pixels) is accepted and converted
        y        (S,)    signed or unsigned integer labels >= 0 (float, bool and timedelta labels
                         are refused, even integral ones)
        x_test   (T, F)  optional, same F as x; x_test and y_test come together or not at all
        y_test   (T,)
    Other keys are ignored. x is returned as float64 and y as int64; num_classes is 1 + the
    largest label in y or y_test. dtype: the run's compute dtype (zerompi/precision.py); every x
    value must be finite in it (1e300 is finite in float64, inf in float32). ranks_on_node: the
    processes sharing this node's memory.

    The file must be a regular file (a FIFO or a device is refused before it is opened), is read
    without pickle, and each member's declared shape is checked against the file and against the
    memory available before it is read (zerompi/util/npz_members.py). Every problem (missing file, not
    an .npz, missing key, a header that lies, too large, wrong rank, dtype, length, a negative
    label, a value not finite in dtype, no samples) raises DataError with one line naming the file.
    """
    dtype = np.dtype(dtype)
    with open_npz(path, DataError) as archive:
        keys = sorted(archive.files)
        for key in ("x", "y"):
            if key not in keys:
                raise DataError(f"{path}: missing key {key!r} (the file has keys {keys})")
        has_test = ("x_test" in keys, "y_test" in keys)
        if has_test[0] != has_test[1]:
            present, absent = ("x_test", "y_test") if has_test[0] else ("y_test", "x_test")
            raise DataError(f"{path}: has {present!r} but not {absent!r}; give both or neither")
        x_train, y_train = _read_split(path, archive, "x", "y", dtype, ranks_on_node)
        x_test, y_test = None, None
        if has_test[0]:
            x_test, y_test = _read_split(path, archive, "x_test", "y_test", dtype, ranks_on_node)
            if x_test.shape[1] != x_train.shape[1]:
                raise DataError(f"{path}: 'x_test' has {x_test.shape[1]} features but 'x' has "
                                f"{x_train.shape[1]}")

    largest_label = int(y_train.max()) if y_test is None else int(max(y_train.max(), y_test.max()))
    return Dataset(x_train, y_train, x_test, y_test, num_classes=largest_label + 1, name=path)


def _read_split(path, archive, x_key, y_key, dtype, ranks_on_node):
    """Read and check one (x, y) pair; returns x (rows, F) float64 and y (rows,) int64."""
    x_shape, x_dtype = declared(archive, x_key, DataError, f"{path}: {x_key!r}")
    y_shape, y_dtype = declared(archive, y_key, DataError, f"{path}: {y_key!r}")
    if len(x_shape) != 2:
        raise DataError(f"{path}: {x_key!r} must be 2-D (samples, features), got shape {x_shape}")
    if len(y_shape) != 1:
        raise DataError(f"{path}: {y_key!r} must be 1-D (a label per sample), got shape {y_shape}")
    if x_shape[0] != y_shape[0]:
        raise DataError(f"{path}: {x_key!r} has {x_shape[0]} samples but {y_key!r} has "
                        f"{y_shape[0]} labels")
    if x_shape[0] == 0:
        raise DataError(f"{path}: {x_key!r} has zero samples")
    if x_shape[1] == 0:
        raise DataError(f"{path}: {x_key!r} has zero features")
    if x_dtype.kind not in "fiu":
        raise DataError(f"{path}: {x_key!r} must be floating point (or integer), got dtype {x_dtype}")
    if y_dtype.kind not in "iu":
        raise DataError(f"{path}: {y_key!r} must hold integer labels, got dtype {y_dtype}")
    # what reading allocates: the file's arrays, x's float64 copy and the copy in dtype that
    # _check_finite makes, y's int64 copy
    rows, features = x_shape
    check_fits(rows * features * (x_dtype.itemsize + 8 + dtype.itemsize) + rows * (y_dtype.itemsize + 8),
               f"{path}: {x_key!r} of shape {x_shape} {x_dtype} and {y_key!r}, with their float64, "
               f"{dtype} and int64 copies,", DataError, ranks_on_node)

    with np.errstate(over="ignore"):                          # a long double beyond float64: inf, refused below
        x = np.ascontiguousarray(read(archive, x_key, DataError, f"{path}: {x_key!r}"), dtype=np.float64)
    _check_finite(path, x_key, x, dtype)
    y = read(archive, y_key, DataError, f"{path}: {y_key!r}")
    negative = y < 0                                         # (rows,) bool
    if negative.any():
        first = int(np.argmax(negative))
        raise DataError(f"{path}: {y_key!r} has {int(negative.sum())} negative labels, the first "
                        f"is {int(y[first])} at index {first}")
    if y.max() > np.iinfo(np.int64).max:                     # only possible for uint64
        raise DataError(f"{path}: {y_key!r} has labels too large for int64")
    y = np.ascontiguousarray(y, dtype=np.int64)              # (rows,)
    return x, y


def _check_finite(path, key, x, dtype):
    """DataError if some value of x (rows, F) is NaN or inf, or becomes inf when the run casts it
    to its compute dtype."""
    with np.errstate(over="ignore", invalid="ignore"):       # the overflow is what is looked for
        not_finite = ~np.isfinite(x.astype(dtype, copy=False))   # (rows, F) bool
    if not_finite.any():
        row, col = np.argwhere(not_finite)[0]
        raise DataError(f"{path}: {key!r} has {int(not_finite.sum())} values that are not finite in {dtype} "
                        f"(NaN, inf, or beyond {np.finfo(dtype).max:.4g} in magnitude), the first at row "
                        f"{row}, column {col}: {x[row, col]:g}")


MAX_INFERRED_CLASSES = 100_000       # a larger label is far more likely a broken file than intended
BUILTIN_DATA = ("digits", "synthetic")   # --data names that are not files


def load_data(cfg, ranks_on_node=1):
    """(dataset or None, error message or None): the data set --data names, checked against
    --classes, --batch-size and --dtype; ranks_on_node: the processes sharing this node's memory."""
    try:
        if cfg.data == "digits":
            data = load_digits()
        elif cfg.data == "synthetic":
            data = make_synthetic(cfg.seed)
        else:
            data = load_npz(cfg.data, cfg.precision.compute, ranks_on_node)
    except DataError as e:
        return None, str(e)
    if not cfg.classes and data.num_classes > MAX_INFERRED_CLASSES:
        return None, (f"{data.name} has labels up to {data.num_classes - 1}: more than "
                      f"{MAX_INFERRED_CLASSES} classes; if that is intended, pass --classes")
    classes = cfg.classes or data.num_classes
    if data.num_classes > classes:
        return None, (f"labels out of range: {data.name} has labels up to {data.num_classes - 1} but "
                      f"--classes {classes} allows 0..{classes - 1}")
    if cfg.batch_size > data.x_train.shape[0]:
        return None, (f"the global batch {describe_batch(cfg)} is larger than the {data.x_train.shape[0]} "
                      f"training samples of {data.name}: pass a smaller --batch-size, --micro-batch-size or --grad-accum")
    return data, None


def describe_batch(cfg):
    """The global batch and how it splits, for messages: "48 (16 rows x 1 micro-batch x 3 ranks)"."""
    N = cfg.batch_size // (cfg.micro_batch_size * cfg.grad_accum)
    return (f"{cfg.batch_size} ({counted(cfg.micro_batch_size, 'row')} x {counted(cfg.grad_accum, 'micro-batch')} "
            f"x {counted(N, 'rank')})")
