"""Tests of zerompi.train.loop.data and .batches: the synthetic set, the .npz loader and its errors, the batch schedule."""
import io
import os
import warnings
import zipfile

import numpy as np
import pytest

import zerompi.util.inputs
from zerompi.train.loop.batches import BatchSchedule
from zerompi.train.loop.data import DataError, Dataset, load_npz, make_synthetic


# ----------------------------------------------------------------------------------------------
# make_synthetic
# ----------------------------------------------------------------------------------------------

def test_synthetic_is_bitwise_deterministic_and_seed_dependent():
    first, again, other = make_synthetic(seed=0), make_synthetic(seed=0), make_synthetic(seed=1)
    for field in ("x_train", "y_train", "x_test", "y_test"):
        assert np.array_equal(getattr(first, field), getattr(again, field))
    assert not np.array_equal(first.x_train, other.x_train)
    assert not np.array_equal(first.y_train, other.y_train)
    assert first.name == "synthetic(seed=0)"


def test_synthetic_shapes_dtypes_and_labels():
    data = make_synthetic(seed=3, n_train=1000, n_test=300, features=7, classes=5)
    assert data.x_train.shape == (1000, 7) and data.x_train.dtype == np.float64
    assert data.y_train.shape == (1000,) and data.y_train.dtype == np.int64
    assert data.x_test.shape == (300, 7) and data.x_test.dtype == np.float64
    assert data.y_test.shape == (300,) and data.y_test.dtype == np.int64
    assert data.num_features == 7 and data.num_classes == 5
    for labels in (data.y_train, data.y_test):
        assert labels.min() >= 0 and labels.max() < 5


def test_synthetic_defaults_have_every_class_roughly_balanced():
    data = make_synthetic()
    assert data.num_classes == 10
    counts = np.bincount(data.y_train, minlength=10)
    assert counts.min() > 0.25 * len(data.y_train) / 10     # no class is starved
    assert set(np.unique(data.y_test)) == set(range(10))


def test_synthetic_teacher_does_not_depend_on_the_split_sizes():
    # x_train comes first from the rng, so a different n_test leaves the training split unchanged
    small_test, large_test = make_synthetic(n_test=10), make_synthetic(n_test=500)
    assert np.array_equal(small_test.x_train, large_test.x_train)
    assert np.array_equal(small_test.y_train, large_test.y_train)


def test_synthetic_is_learnable_well_above_chance():
    data = make_synthetic()
    class_means = np.stack([data.x_train[data.y_train == k].mean(axis=0)
                            for k in range(data.num_classes)])             # (C, F)
    distances = ((data.x_test[:, None, :] - class_means[None]) ** 2).sum(axis=2)   # (T, C)
    accuracy = (distances.argmin(axis=1) == data.y_test).mean()
    assert accuracy > 0.5                                    # chance is 0.1


def test_synthetic_raises_when_a_class_is_missing():
    with pytest.raises(DataError, match="do not appear"):
        make_synthetic(n_train=3, classes=10)


# ----------------------------------------------------------------------------------------------
# load_npz: round trips
# ----------------------------------------------------------------------------------------------

def test_load_npz_round_trip_without_test_split(tmp_path):
    path = str(tmp_path / "train.npz")
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    y = np.array([0, 2, 1, 2], dtype=np.int32)
    np.savez(path, x=x, y=y)
    data = load_npz(path)
    assert isinstance(data, Dataset)
    assert data.x_train.dtype == np.float64 and data.y_train.dtype == np.int64
    assert np.array_equal(data.x_train, x) and np.array_equal(data.y_train, y)
    assert data.x_test is None and data.y_test is None
    assert data.num_classes == 3 and data.num_features == 3 and data.name == path


def test_load_npz_round_trip_with_test_split(tmp_path):
    path = str(tmp_path / "both.npz")
    x, y = np.random.default_rng(0).standard_normal((5, 2)), np.array([0, 1, 1, 0, 1])
    x_test, y_test = np.ones((2, 2)), np.array([4, 0], dtype=np.uint8)
    np.savez_compressed(path, x=x, y=y, x_test=x_test, y_test=y_test)
    data = load_npz(path)
    assert np.array_equal(data.x_train, x) and np.array_equal(data.y_train, y)
    assert np.array_equal(data.x_test, x_test) and np.array_equal(data.y_test, y_test)
    assert data.y_test.dtype == np.int64
    assert data.num_classes == 5                              # the largest label is in y_test


def test_load_npz_converts_integer_x(tmp_path):
    path = str(tmp_path / "pixels.npz")
    np.savez(path, x=np.array([[0, 255], [7, 8]], dtype=np.uint8), y=np.array([0, 1]))
    data = load_npz(path)
    assert data.x_train.dtype == np.float64 and data.x_train[0, 1] == 255.0


# ----------------------------------------------------------------------------------------------
# load_npz: every bad input is one DataError line naming the file and the problem
# ----------------------------------------------------------------------------------------------

def load_error(path, *dtype):
    """The message of the DataError that load_npz(path, *dtype) raises, checked to be one line."""
    with pytest.raises(DataError) as caught:
        load_npz(str(path), *dtype)
    message = str(caught.value)
    assert str(path) in message and "\n" not in message
    return message


def save(tmp_path, **arrays):
    path = tmp_path / "data.npz"
    np.savez(path, **arrays)
    return path


GOOD_X = np.zeros((4, 3))
GOOD_Y = np.array([0, 1, 2, 1])


def test_missing_file(tmp_path):
    assert "no such file" in load_error(tmp_path / "absent.npz")


def test_directory_is_not_a_file(tmp_path):
    assert "not a regular file" in load_error(tmp_path)


def test_text_file_is_not_npz(tmp_path):
    path = tmp_path / "notes.npz"
    path.write_text("x,y\n1,2\n")
    assert "not a valid .npz" in load_error(path)


def test_empty_file_is_not_npz(tmp_path):
    path = tmp_path / "empty.npz"
    path.write_bytes(b"")
    assert "not a valid .npz" in load_error(path)


def test_truncated_zip_is_not_npz(tmp_path):
    path = save(tmp_path, x=GOOD_X, y=GOOD_Y)
    contents = path.read_bytes()
    path.write_bytes(contents[: len(contents) // 2])
    assert "not a valid .npz" in load_error(path)


def test_corrupt_member_is_reported(tmp_path):
    path = save(tmp_path, x=np.arange(1000.0).reshape(100, 10), y=np.zeros(100, dtype=np.int64))
    contents = bytearray(path.read_bytes())
    contents[400:420] = b"\xff" * 20                        # inside x's data: the CRC fails
    path.write_bytes(bytes(contents))
    assert "corrupt" in load_error(path)


def test_single_npy_file_is_not_npz(tmp_path):
    path = tmp_path / "x.npy"
    np.save(path, GOOD_X)
    assert ".npy" in load_error(path)


def test_missing_key_lists_the_keys_present(tmp_path):
    message = load_error(save(tmp_path, x=GOOD_X, labels=GOOD_Y))
    assert "'y'" in message and "labels" in message


def test_test_split_needs_both_keys(tmp_path):
    message = load_error(save(tmp_path, x=GOOD_X, y=GOOD_Y, x_test=GOOD_X))
    assert "'y_test'" in message


def test_x_must_be_2d(tmp_path):
    message = load_error(save(tmp_path, x=np.zeros(4), y=GOOD_Y))
    assert "'x'" in message and "2-D" in message


def test_y_must_be_1d(tmp_path):
    message = load_error(save(tmp_path, x=GOOD_X, y=GOOD_Y.reshape(4, 1)))
    assert "'y'" in message and "1-D" in message


def test_length_mismatch(tmp_path):
    message = load_error(save(tmp_path, x=GOOD_X, y=GOOD_Y[:3]))
    assert "4 samples" in message and "3 labels" in message


def test_x_must_be_numeric(tmp_path):
    message = load_error(save(tmp_path, x=np.full((4, 3), "a"), y=GOOD_Y))
    assert "'x'" in message and "floating point" in message


def test_y_must_be_integer(tmp_path):
    message = load_error(save(tmp_path, x=GOOD_X, y=GOOD_Y.astype(np.float64)))
    assert "'y'" in message and "integer" in message and "float64" in message


def test_negative_labels(tmp_path):
    message = load_error(save(tmp_path, x=GOOD_X, y=np.array([0, -1, 2, -3])))
    assert "negative" in message and "2 negative" in message and "index 1" in message


def test_nan_and_inf_in_x(tmp_path):
    x = GOOD_X.copy()
    x[2, 1], x[3, 0] = np.nan, np.inf
    message = load_error(save(tmp_path, x=x, y=GOOD_Y))
    assert "NaN" in message and "2 values that are not finite" in message and "row 2, column 1: nan" in message


def test_nan_in_x_test(tmp_path):
    x_test = GOOD_X.copy()
    x_test[0, 0] = np.nan
    message = load_error(save(tmp_path, x=GOOD_X, y=GOOD_Y, x_test=x_test, y_test=GOOD_Y))
    assert "'x_test'" in message and "NaN" in message


def test_test_split_feature_count_must_match(tmp_path):
    message = load_error(save(tmp_path, x=GOOD_X, y=GOOD_Y, x_test=np.zeros((4, 5)), y_test=GOOD_Y))
    assert "5 features" in message and "3" in message


def test_zero_samples(tmp_path):
    message = load_error(save(tmp_path, x=np.zeros((0, 3)), y=np.zeros(0, dtype=np.int64)))
    assert "zero samples" in message


def test_object_arrays_are_refused(tmp_path):
    objects = np.array([[1.0, "a", None]] * 4, dtype=object)
    message = load_error(save(tmp_path, x=objects, y=GOOD_Y))
    assert "'x'" in message and "pickle" in message


# ----------------------------------------------------------------------------------------------
# load_npz: values that overflow the run's compute dtype, dtypes that are not numbers
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("key", ["x", "x_test"])
def test_values_that_overflow_float32_are_refused_in_a_float32_run(tmp_path, key):
    arrays = dict(x=GOOD_X.copy(), y=GOOD_Y, x_test=GOOD_X.copy(), y_test=GOOD_Y)
    arrays[key][2, 1] = 1e300                                  # finite in float64, inf in float32
    arrays[key][3, 0] = -4e38
    path = save(tmp_path, **arrays)
    message = load_error(path, np.float32)
    assert f"{key!r} has 2 values that are not finite in float32" in message
    assert "the first at row 2, column 1" in message
    assert load_npz(str(path), np.float64).x_train.shape == (4, 3)     # fine in a float64 run


def test_long_double_beyond_float64_is_one_error_not_a_warning(tmp_path):
    """A long double x of 1e400 printed a RuntimeWarning on every rank before the error line."""
    x = GOOD_X.astype(np.longdouble)
    x[1, 2] = np.longdouble("1e400")
    path = save(tmp_path, x=x, y=GOOD_Y)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        message = load_error(path, np.float32)
    assert "'x' has 1 values that are not finite" in message and "row 1, column 2" in message


def test_the_largest_float32_is_accepted(tmp_path):
    x = GOOD_X.copy()
    x[0, 0] = np.finfo(np.float32).max
    assert load_npz(str(save(tmp_path, x=x, y=GOOD_Y)), np.float32).x_train[0, 0] == x[0, 0]


@pytest.mark.parametrize("labels", [np.array([0, 1, 2, 1], dtype="m8[s]"), np.array([True, False, True, True])],
                         ids=["timedelta64", "bool"])
def test_labels_must_be_signed_or_unsigned_integers(tmp_path, labels):
    message = load_error(save(tmp_path, x=GOOD_X, y=labels))
    assert "'y'" in message and "integer labels" in message and str(labels.dtype) in message


@pytest.mark.parametrize("x", [np.zeros((4, 3), dtype="M8[D]"), np.zeros((4, 3), dtype=np.complex128),
                               np.zeros((4, 3), dtype=bool)], ids=["datetime64", "complex", "bool"])
def test_x_must_be_real_numbers(tmp_path, x):
    message = load_error(save(tmp_path, x=x, y=GOOD_Y))
    assert "'x'" in message and "floating point" in message and str(x.dtype) in message


# ----------------------------------------------------------------------------------------------
# load_npz: sizes a file declares are checked before anything is allocated
# ----------------------------------------------------------------------------------------------

def npy_bytes(dtype, shape, data=b""):
    """An .npy file's bytes: a version 1.0 header declaring (dtype, shape), then `data`."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)),
                                                  "fortran_order": False, "shape": shape})
    return header.getvalue() + data


def write_zip(path, members, compression=zipfile.ZIP_STORED):
    with zipfile.ZipFile(path, "w", compression=compression) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return path


def y_member(rows=4):
    return npy_bytes(np.int64, (rows,), np.zeros(rows, dtype=np.int64).tobytes())


def test_a_header_declaring_more_than_the_member_holds_is_refused_before_allocating(tmp_path):
    path = write_zip(tmp_path / "data.npz", {"x.npy": npy_bytes(np.float64, (10 ** 11, 4), bytes(32)),
                                             "y.npy": y_member()})
    message = load_error(path)          # numpy alone would try to allocate 3.2 TB first
    assert "'x'" in message and "(100000000000, 4) float64" in message and "32 bytes of data" in message


def test_a_header_declaring_less_than_the_member_holds_is_refused(tmp_path):
    x = np.arange(12.0).reshape(4, 3)
    path = write_zip(tmp_path / "data.npz", {"x.npy": npy_bytes(np.float64, (2, 3), x.tobytes()),
                                             "y.npy": y_member()})
    message = load_error(path)          # numpy alone would read the first 2 rows and ignore the rest
    assert "'x'" in message and "(2, 3) float64" in message and "96 bytes of data" in message


def test_a_member_that_is_not_npy_data_is_refused_without_reading_it(tmp_path):
    path = write_zip(tmp_path / "data.npz", {"x.npy": b"\0" * 1000, "y.npy": y_member()})
    assert "'x' is not an .npy array" in load_error(path)


def test_a_zip_entry_declaring_more_than_the_file_holds_is_refused(tmp_path):
    x = np.zeros((4, 3))
    path = write_zip(tmp_path / "data.npz", {"x.npy": npy_bytes(np.float64, (4, 3), x.tobytes()),
                                             "y.npy": y_member()})
    contents = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo("x.npy")
    central = contents.index(b"PK\x01\x02")                  # x.npy's central directory entry
    declared = info.file_size + 10 ** 9                        # its stored data: 1 GB more than is there
    for offset in (20, 24):                                    # compressed and uncompressed size
        contents[central + offset:central + offset + 4] = declared.to_bytes(4, "little")
    path.write_bytes(bytes(contents))
    message = load_error(path)
    assert "'x'" in message and "bytes" in message and "holds" in message


def test_a_zip_bomb_is_refused_before_it_expands(tmp_path, monkeypatch):
    rows = 100_000
    path = write_zip(tmp_path / "bomb.npz", {"x.npy": npy_bytes(np.float64, (rows, 10), bytes(rows * 80)),
                                             "y.npy": y_member(rows)}, zipfile.ZIP_DEFLATED)
    assert os.path.getsize(path) < 100_000                     # 8.8 MB of zeros in a few kB
    monkeypatch.setattr(zerompi.util.inputs, "available_bytes", lambda ranks_on_node=1: 4_000_000)
    message = load_error(path)
    assert "'x' of shape (100000, 10) float64" in message and "more than the 4.0 MB" in message


def test_memory_is_shared_by_the_ranks_on_the_node(tmp_path, monkeypatch):
    path = save(tmp_path, x=np.zeros((1000, 10)), y=np.zeros(1000, dtype=np.int64))
    monkeypatch.setattr(zerompi.util.inputs, "available_bytes", lambda ranks_on_node=1: 400_000 // ranks_on_node)
    assert load_npz(str(path), np.float64, ranks_on_node=1).x_train.shape == (1000, 10)
    with pytest.raises(DataError, match="more than the"):
        load_npz(str(path), np.float64, ranks_on_node=8)


# ----------------------------------------------------------------------------------------------
# load_npz: only regular files are read
# ----------------------------------------------------------------------------------------------

def test_a_fifo_is_refused_without_blocking(tmp_path, no_hang):
    fifo = tmp_path / "data.npz"
    os.mkfifo(fifo)
    assert "is a FIFO" in load_error(fifo)
    link = tmp_path / "link.npz"
    link.symlink_to(fifo)
    assert "is a FIFO" in load_error(link)


def test_a_device_is_refused():
    with pytest.raises(DataError, match="/dev/zero: is a character device"):
        load_npz("/dev/zero")


# ----------------------------------------------------------------------------------------------
# BatchSchedule
# ----------------------------------------------------------------------------------------------

def test_unshuffled_batches_are_in_order_and_drop_the_remainder():
    schedule = BatchSchedule(num_samples=10, global_batch=3, seed=0, shuffle=False)
    assert schedule.steps_per_epoch == 3                    # row 9 is dropped every epoch
    batches = [schedule.global_indices(step).tolist() for step in range(4)]
    assert batches == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [0, 1, 2]]
    assert schedule.global_indices(0).dtype == np.int64


def test_shuffled_epoch_visits_every_index_once():
    schedule = BatchSchedule(num_samples=12, global_batch=4, seed=5, shuffle=True)
    epoch = np.concatenate([schedule.global_indices(step) for step in range(3)])
    assert sorted(epoch.tolist()) == list(range(12))
    assert epoch.tolist() != list(range(12))
    expected = np.random.default_rng([5, 0]).permutation(12)
    assert np.array_equal(epoch, expected)


def test_shuffled_epochs_differ_and_dropped_rows_change():
    schedule = BatchSchedule(num_samples=100, global_batch=30, seed=1, shuffle=True)
    first = np.concatenate([schedule.global_indices(step) for step in range(3)])
    second = np.concatenate([schedule.global_indices(step) for step in range(3, 6)])
    assert len(set(first.tolist())) == 90 and len(set(second.tolist())) == 90
    assert not np.array_equal(first, second)
    assert set(first.tolist()) != set(second.tolist())     # a different 10 rows dropped


def test_schedule_is_deterministic_in_any_step_order():
    forward = BatchSchedule(num_samples=50, global_batch=8, seed=2, shuffle=True)
    backward = BatchSchedule(num_samples=50, global_batch=8, seed=2, shuffle=True)
    steps = range(20)
    expected = [forward.global_indices(step).copy() for step in steps]
    for step in reversed(steps):
        assert np.array_equal(backward.global_indices(step), expected[step])
    other_seed = BatchSchedule(num_samples=50, global_batch=8, seed=3, shuffle=True)
    assert not np.array_equal(other_seed.global_indices(0), expected[0])


def test_batch_is_read_only():
    schedule = BatchSchedule(num_samples=10, global_batch=5, seed=0, shuffle=True)
    with pytest.raises(ValueError):
        schedule.global_indices(0)[0] = 3


@pytest.mark.parametrize("global_batch, problem", [(512, "larger than the 300 training samples"),
                                                   (0, "must be positive"),
                                                   (-4, "must be positive")])
def test_schedule_rejects_bad_batch_sizes(global_batch, problem):
    with pytest.raises(DataError, match=problem):
        BatchSchedule(num_samples=300, global_batch=global_batch, seed=0, shuffle=True)


def test_schedule_rejects_negative_step_and_seed():
    with pytest.raises(DataError, match="step"):
        BatchSchedule(num_samples=10, global_batch=2, seed=0, shuffle=False).global_indices(-1)
    with pytest.raises(DataError, match="seed"):
        BatchSchedule(num_samples=10, global_batch=2, seed=-1, shuffle=True)


def test_a_default_batch_larger_than_the_data_says_where_it_came_from():
    """With no batch option the global batch is 16 rows x N: at N = 94 it exceeds the 1497 digits,
    and the line names the split, not a --batch-size the user never gave."""
    from zerompi.train.options.config import parse_args
    from zerompi.train.loop.data import load_data
    data, error = load_data(parse_args([], num_ranks=94), 1)
    assert data is None and error == ("the global batch 1504 (16 rows x 1 micro-batch x 94 ranks) is larger than "
                                      "the 1497 training samples of digits: pass a smaller --batch-size, "
                                      "--micro-batch-size or --grad-accum")
