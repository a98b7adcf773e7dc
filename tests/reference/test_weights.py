"""zerompi.checkpoint.weights: consolidated .npz files, on a single-process engine (N = 1, every stage)."""
import io
import os
import stat
import zipfile

import numpy as np
import pytest

from zerompi.adam import AdamConfig
from zerompi.comm import Communicator
from zerompi.stages.params import full_layer_params, set_layer_params
from zerompi.engine import build_engine
from zerompi.precision import precision_for
from zerompi.layout import Layout
from zerompi.checkpoint.weights import WeightsError, check_writable, read_weights, save_weights

SIZES = [5, 37, 53, 7]


def make_engine(stage, dtype, seed=0, sizes=SIZES):
    """An engine whose parameters are random values (not the init), returned with those values."""
    engine = build_engine(sizes, stage, precision_for(np.dtype(dtype).name), AdamConfig(), 4, Communicator())
    rng = np.random.default_rng(seed)
    values = []
    for layer in engine.layout.layers:
        v = rng.standard_normal(layer.numel).astype(dtype)
        set_layer_params(engine.stage, layer, v)
        values.append(v)
    return engine, values


def good_tensors(sizes=SIZES, dtype=np.float64, seed=0):
    rng = np.random.default_rng(seed)
    tensors = {}
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        tensors[f"layers.{i}.weight"] = rng.standard_normal((n_out, n_in)).astype(dtype)
        tensors[f"layers.{i}.bias"] = rng.standard_normal(n_out).astype(dtype)
    return tensors


def read_all(path, sizes=SIZES):
    return list(read_weights(str(path), Layout(sizes, 1)))


def read_error(path, sizes=SIZES):
    with pytest.raises(WeightsError) as info:
        read_all(path, sizes)
    message = str(info.value)
    assert str(path) in message and "\n" not in message
    return message


# ---------------------------------------------------------------- saving


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_round_trip_is_bitwise(tmp_path, stage, dtype):
    engine, values = make_engine(stage, dtype, seed=stage)
    path = tmp_path / "w.npz"
    assert save_weights(engine, str(path)) is None
    assert sorted(os.listdir(tmp_path)) == ["w.npz"]                 # no temporary file left

    loaded = read_all(path)
    assert [layer.index for layer, _ in loaded] == [0, 1, 2]
    for (layer, got), want in zip(loaded, values):
        assert got.dtype == np.float64 and got.shape == (layer.numel,)
        np.testing.assert_array_equal(got, want.astype(np.float64))
        assert np.array_equal(got.astype(dtype).view(np.uint8), want.view(np.uint8))   # bitwise

    # and back into a fresh engine of another stage: the same parameters, bit for bit
    other, _ = make_engine(3 - stage, dtype, seed=99)
    for layer, got in loaded:
        set_layer_params(other.stage, layer, got.astype(dtype))
    for layer, want in zip(other.layout.layers, values):
        full = full_layer_params(other.stage, layer)
        assert full.dtype == np.dtype(dtype)
        assert np.array_equal(full[:layer.numel].view(np.uint8), want.view(np.uint8))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_file_is_a_plain_npz(tmp_path, dtype):
    engine, values = make_engine(3, dtype, seed=5)
    path = tmp_path / "w.npz"
    assert save_weights(engine, str(path)) is None
    with np.load(path, allow_pickle=False) as archive:
        assert sorted(archive.files) == sorted(f"layers.{i}.{k}" for i in range(3) for k in ("weight", "bias"))
        for i, (n_in, n_out) in enumerate(zip(SIZES[:-1], SIZES[1:])):
            w, b = archive[f"layers.{i}.weight"], archive[f"layers.{i}.bias"]
            assert w.shape == (n_out, n_in) and b.shape == (n_out,)      # torch.nn.Linear layout
            assert w.dtype == np.dtype(dtype) and b.dtype == np.dtype(dtype)
            np.testing.assert_array_equal(w.reshape(-1), values[i][:n_out * n_in])
            np.testing.assert_array_equal(b, values[i][n_out * n_in:])
    with zipfile.ZipFile(path) as z:                                    # uncompressed, as documented
        assert all(info.compress_type == zipfile.ZIP_STORED for info in z.infolist())
        assert all(name.endswith(".npy") for name in z.namelist())


def test_save_replaces_an_existing_file(tmp_path):
    path = tmp_path / "w.npz"
    first, _ = make_engine(1, np.float64, seed=1)
    second, values = make_engine(2, np.float64, seed=2)
    assert save_weights(first, str(path)) is None
    assert save_weights(second, str(path)) is None
    for (_, got), want in zip(read_all(path), values):
        np.testing.assert_array_equal(got, want)
    assert sorted(os.listdir(tmp_path)) == ["w.npz"]


def test_save_to_missing_folder_fails_cleanly(tmp_path):
    engine, _ = make_engine(3, np.float32)
    path = tmp_path / "no" / "such" / "w.npz"
    error = save_weights(engine, str(path))
    assert isinstance(error, str) and str(path) in error and "\n" not in error
    assert os.listdir(tmp_path) == []                                  # nothing written anywhere
    message = check_writable(str(path))
    assert message is not None and "does not exist" in message
    assert check_writable(str(tmp_path / "w.npz")) is None


def test_save_onto_a_folder_fails_cleanly(tmp_path):
    engine, _ = make_engine(0, np.float64)
    target = tmp_path / "w.npz"
    target.mkdir()
    error = save_weights(engine, str(target))
    assert isinstance(error, str) and str(target) in error
    assert os.listdir(tmp_path) == ["w.npz"] and target.is_dir() and os.listdir(target) == []
    assert "folder" in check_writable(str(target))


def test_save_onto_a_fifo_or_device_is_refused_and_never_renamed_over(tmp_path):
    """An existing output that is not a regular file (a FIFO here; /dev/null as root) is refused
    before training and is never replaced by the rename that completes an atomic write."""
    engine, _ = make_engine(0, np.float64)
    target = tmp_path / "w.npz"
    os.mkfifo(target)
    assert "not a regular file" in check_writable(str(target))
    error = save_weights(engine, str(target))
    assert isinstance(error, str) and "not a regular file" in error and str(target) in error
    assert stat.S_ISFIFO(os.lstat(target).st_mode) and os.listdir(tmp_path) == ["w.npz"]


def test_failed_save_keeps_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "w.npz"
    old_engine, old_values = make_engine(3, np.float32, seed=1)
    assert save_weights(old_engine, str(path)) is None
    old_bytes = path.read_bytes()

    real_write_array = np.lib.format.write_array
    calls = []

    def failing_write_array(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real_write_array(*args, **kwargs)

    monkeypatch.setattr(np.lib.format, "write_array", failing_write_array)
    new_engine, _ = make_engine(3, np.float32, seed=2)
    error = save_weights(new_engine, str(path))
    monkeypatch.undo()

    assert len(calls) == 2                               # it stopped writing after the failure
    assert isinstance(error, str) and str(path) in error and "No space left on device" in error
    assert path.read_bytes() == old_bytes                # the old file, untouched
    for (_, got), want in zip(read_all(path), old_values):
        np.testing.assert_array_equal(got, want.astype(np.float64))
    assert sorted(os.listdir(tmp_path)) == ["w.npz"]     # no temporary file left


def test_unexpected_exception_during_save_leaves_no_temporary_file(tmp_path, monkeypatch):
    def exploding_write_array(*args, **kwargs):
        raise MemoryError("simulated")

    monkeypatch.setattr(np.lib.format, "write_array", exploding_write_array)
    engine, _ = make_engine(2, np.float64, seed=1)
    with pytest.raises(MemoryError):
        save_weights(engine, str(tmp_path / "w.npz"))
    assert os.listdir(tmp_path) == []


# ---------------------------------------------------------------- reading bad files


def test_read_good_file_written_by_numpy(tmp_path):
    tensors = good_tensors(dtype=np.float32)
    path = tmp_path / "w.npz"
    np.savez(path, **tensors)
    loaded = read_all(path)
    for layer, values in loaded:
        w, b = tensors[f"layers.{layer.index}.weight"], tensors[f"layers.{layer.index}.bias"]
        np.testing.assert_array_equal(values, np.concatenate([w.reshape(-1), b]).astype(np.float64))
    # a compressed .npz is fine too
    np.savez_compressed(tmp_path / "c.npz", **tensors)
    assert len(read_all(tmp_path / "c.npz")) == 3


def test_missing_file(tmp_path):
    assert "no such file" in read_error(tmp_path / "absent.npz")


def test_text_file(tmp_path):
    path = tmp_path / "w.npz"
    path.write_text("layers.0.weight = 1, 2, 3\n")
    read_error(path)


def test_npy_instead_of_npz(tmp_path):
    path = tmp_path / "w.npy"
    np.save(path, np.zeros((37, 5)))
    assert ".npy" in read_error(path)


def error_for_changed(tmp_path, change):
    """The read error of a good weights file after change(tensors) edited its tensors."""
    tensors = good_tensors()
    change(tensors)
    path = tmp_path / "w.npz"
    np.savez(path, **tensors)
    return read_error(path)


def test_missing_tensor(tmp_path):
    assert "layers.1.bias" in error_for_changed(tmp_path, lambda t: t.pop("layers.1.bias"))


def test_wrong_shape(tmp_path):
    def transpose(t):
        t["layers.2.weight"] = t["layers.2.weight"].T.copy()      # (53, 7) instead of (7, 53)
    message = error_for_changed(tmp_path, transpose)
    assert "layers.2.weight" in message and "(53, 7)" in message and "(7, 53)" in message


def test_wrong_model_depth(tmp_path):
    path = tmp_path / "w.npz"
    np.savez(path, **good_tensors([5, 37, 7]))
    read_error(path)                                     # layers.1.weight has the wrong shape


def test_extra_tensor(tmp_path):
    message = error_for_changed(tmp_path, lambda t: t.update({"layers.3.weight": np.zeros((2, 7))}))
    assert "layers.3.weight" in message


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_values(tmp_path, bad):
    message = error_for_changed(tmp_path, lambda t: t["layers.1.bias"].__setitem__(3, bad))
    assert "layers.1.bias" in message and "NaN" in message


def test_integer_dtype(tmp_path):
    message = error_for_changed(tmp_path, lambda t: t.update({"layers.0.weight": np.ones((37, 5), dtype=np.int64)}))
    assert "layers.0.weight" in message and "int64" in message


def test_object_array_is_not_unpickled(tmp_path):
    tensors = good_tensors()
    obj = np.empty(7, dtype=object)
    obj[:] = [float(i) for i in range(7)]
    tensors["layers.2.bias"] = obj                       # the right shape, but pickled
    path = tmp_path / "w.npz"
    np.savez(path, allow_pickle=True, **tensors)
    assert "layers.2.bias" in read_error(path)


# ---------------------------------------------------------------- damaged files


def test_empty_file(tmp_path):
    path = tmp_path / "w.npz"
    path.write_bytes(b"")
    assert "not a valid .npz" in read_error(path)


def corrupt_member(path, name):
    """Flip one byte inside the stored data of member `name` (its CRC-32 no longer matches)."""
    with zipfile.ZipFile(path) as z:
        info = z.getinfo(name)
    data = bytearray(path.read_bytes())
    data[info.header_offset + 30 + len(name) + len(info.extra) + 200] ^= 0xFF
    path.write_bytes(bytes(data))


def test_corrupted_member(tmp_path):
    path = tmp_path / "w.npz"
    np.savez(path, **good_tensors())
    corrupt_member(path, "layers.0.weight.npy")
    assert "layers.0.weight" in read_error(path)


def test_member_that_is_not_npy_data(tmp_path):
    path = tmp_path / "w.npz"
    with zipfile.ZipFile(path, "w") as z:
        for key, value in good_tensors().items():
            with z.open(key + ".npy", "w") as member:
                if key == "layers.0.weight":
                    member.write(b"not an array at all " * 10)
                else:
                    np.lib.format.write_array(member, value, allow_pickle=False)
    assert "layers.0.weight" in read_error(path)


# ---------------------------------------------------------------- sizes and file kinds checked before reading


def npz_with_header(path, name, shape, data):
    """good_tensors() as an .npz, except that member `name` has a header declaring `shape` (float64)
    followed by the bytes `data`."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f8", "fortran_order": False, "shape": shape})
    with zipfile.ZipFile(path, "w") as archive:
        for key, value in good_tensors().items():
            if key == name:
                archive.writestr(key + ".npy", header.getvalue() + data)
            else:
                with archive.open(key + ".npy", "w") as member:
                    np.lib.format.write_array(member, value, allow_pickle=False)
    return path


def test_a_header_declaring_a_huge_shape_is_refused_before_allocating(tmp_path):
    path = npz_with_header(tmp_path / "w.npz", "layers.0.weight", (10 ** 11, 4), bytes(32))
    message = read_error(path)              # numpy alone would try to allocate 3.2 TB first
    assert "layers.0.weight" in message and "(100000000000, 4)" in message


def test_a_header_declaring_less_than_the_member_holds_is_refused(tmp_path):
    weight = np.ones((37, 5))
    path = npz_with_header(tmp_path / "w.npz", "layers.0.weight", (37, 4), weight.tobytes())
    message = read_error(path)
    assert "layers.0.weight" in message and "(37, 4)" in message


@pytest.mark.parametrize("name", ["w.npz", "w.safetensors"])
def test_a_fifo_is_refused_without_blocking(tmp_path, no_hang, name):
    os.mkfifo(tmp_path / name)
    assert "is a FIFO" in read_error(tmp_path / name)
    (tmp_path / ("link-" + name)).symlink_to(tmp_path / name)
    assert "is a FIFO" in read_error(tmp_path / ("link-" + name))


def test_a_device_is_refused():
    with pytest.raises(WeightsError, match="/dev/zero: is a character device"):
        read_all("/dev/zero")
