"""Choosing the device and asking MPI about CUDA, on machines with and without CuPy.

The real library answers where it can: this machine's MPI (the MPICH wheel) is not CUDA-aware,
and every way of asking must say so. The GPU choice logic is checked against a stand-in `cupy`
module (the real one needs a GPU); the GPU itself is exercised by tests/gpu_check.py.
"""
import subprocess
import sys
import tracemalloc
import types

import numpy as np
import pytest

from zerompi.devices import mpi_cuda
from zerompi.train.options.device_choice import check_device, local_rank, select_device
from zerompi.cpu import CPU
from zerompi.device import to_numpy
from zerompi.devices.gpu import GPU
from zerompi.precision import precision_for


def fake_cupy(count, raise_on_count=None):
    """A stand-in cupy module: `count` GPUs; records which one was made current."""
    used = []

    class Device:
        def __init__(self, index):
            self.index = index

        def use(self):
            used.append(self.index)

    def get_count():
        if raise_on_count:
            raise raise_on_count
        return count

    runtime = types.SimpleNamespace(getDeviceCount=get_count,
                                    getDeviceProperties=lambda i: {"name": b"Stand-in GPU"})
    module = types.ModuleType("cupy")
    module.cuda = types.SimpleNamespace(runtime=runtime, Device=Device, get_current_stream=lambda: "the current stream")
    module.used = used
    return module


def test_local_rank_reads_the_innermost_launcher_first():
    assert local_rank({}) == 0
    assert local_rank({"SLURM_LOCALID": "3"}) == 3
    assert local_rank({"SLURM_LOCALID": "3", "MPI_LOCALRANKID": "1"}) == 1     # mpirun inside srun
    assert local_rank({"OMPI_COMM_WORLD_LOCAL_RANK": "2", "PMI_LOCAL_RANK": "5"}) == 2
    assert local_rank({"PALS_LOCAL_RANKID": "x", "PMI_LOCAL_RANK": "4"}) == 4   # not a number: skipped


def test_cpu_is_chosen_without_asking_cupy(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)                          # importing it would fail
    device, error = select_device("cpu", {})
    assert isinstance(device, CPU) and not device.is_gpu and error is None


def test_auto_without_cupy_is_the_cpu_and_gpu_is_an_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)
    device, error = select_device("auto", {})
    assert not device.is_gpu and error is None
    device, error = select_device("gpu", {})
    assert not device.is_gpu and "CuPy is not installed" in error and "pip install cupy-cuda12x" in error


@pytest.mark.parametrize("count,failure", [(0, None), (2, RuntimeError("cudaErrorNoDevice: no CUDA-capable device\nmore"))])
def test_cupy_without_a_usable_gpu(monkeypatch, count, failure):
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy(count, failure))
    device, error = select_device("auto", {})
    assert not device.is_gpu and error is None
    device, error = select_device("gpu", {})
    assert not device.is_gpu and error.startswith("--device gpu: ") and "\n" not in error


def test_gpu_is_the_local_rank_modulo_the_visible_gpus(monkeypatch):
    cupy = fake_cupy(2)
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    for local, expected in ((0, 0), (1, 1), (2, 0), (3, 1)):               # 4 ranks share 2 GPUs
        device, error = select_device("auto", {"MPI_LOCALRANKID": str(local)})
        assert error is None and isinstance(device, GPU) and device.index == expected
        assert cupy.used[-1] == expected and "gpu %d of 2" % expected in device.name


def test_upload_is_queued_on_the_current_stream(monkeypatch):
    """The batch indices go up once per step without a wait: set() with a stream is an async copy."""
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy(1))
    device, _ = select_device("gpu", {})
    calls = []

    class DeviceArray:
        def set(self, host, stream=None):
            calls.append((host, stream))

    host = np.arange(3)
    device.upload(host, DeviceArray())
    assert calls == [(host, "the current stream")]
    on_cpu = np.zeros(3, np.int64)
    CPU().upload(host, on_cpu)
    np.testing.assert_array_equal(on_cpu, host)


def test_take_writes_rows_into_out_without_a_temporary():
    """The batch gather of every step (zerompi/train/loop/batches.py): NumPy's default take would buffer out."""
    take = CPU().take
    data = np.random.default_rng(0).standard_normal((1000, 512))
    index = np.arange(999, -1, -4)
    out = np.empty((index.size, 512))
    take(data, index, out, axis=0)
    np.testing.assert_array_equal(out, data[index])
    tracemalloc.start()
    take(data, index, out, axis=0)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < out.nbytes / 100


def test_the_gpu_is_chosen_before_mpi_starts():
    """zerompi.train imports mpi4py.MPI without initializing it; the Communicator starts MPI."""
    code = ("import zerompi.train.loop.run\nfrom mpi4py import MPI\nassert not MPI.Is_initialized()\n"
            "from zerompi.comm import Communicator\nCommunicator()\nassert MPI.Is_initialized()\nprint('ok')")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "ok", result.stderr


def test_device_checks(monkeypatch):
    fp32 = precision_for("float32")
    assert check_device(CPU(), fp32, False, 1) is None
    assert "needs a GPU" in check_device(CPU(), fp32, True, 1)
    gpu = types.SimpleNamespace(is_gpu=True, count=1)
    monkeypatch.setattr("zerompi.train.options.device_choice.nccl_available", lambda: True)
    assert check_device(gpu, fp32, True, 1) is None
    assert "NCCL needs a GPU per rank" in check_device(gpu, fp32, True, 2)


def test_a_dtype_alias_is_one_name_from_the_parse_on():
    """--dtype bfloat16 is bf16 everywhere below the command line: the GPU's bfloat16 check ran for
    the name bf16 only, and the header printed the alias."""
    from zerompi.train.options.config import parse_args

    class NoBfloat16:
        is_gpu, count = True, 1

        def zeros(self, n, dtype):
            raise TypeError("no bfloat16 here")
    for alias, name in (("bfloat16", "bf16"), ("float16", "fp16"), ("fp32", "float32"), ("fp64", "float64")):
        assert parse_args(["--dtype", alias]).dtype == name
    assert "this CuPy has no bfloat16 arrays" in check_device(NoBfloat16(), parse_args(["--dtype", "bfloat16"]).precision,
                                                              False, 1)


def test_to_numpy_on_the_cpu_is_the_array_itself():
    a = np.arange(3.0)
    assert to_numpy(a) is a


# ---- CUDA-awareness

class FakeInfo:
    def __init__(self, value):
        self.value = value

    def Get(self, key):
        assert key == "mpi_memory_alloc_kinds"
        return self.value

    def Free(self):
        pass


def fake_mpi(kinds):
    world = types.SimpleNamespace(Get_info=lambda: FakeInfo(kinds))
    return types.SimpleNamespace(COMM_WORLD=world)


def test_the_override_decides(monkeypatch):
    assert mpi_cuda.cuda_aware(fake_mpi("mpi,system"), {"ZEROMPI_CUDA_AWARE": "1"}) == (True, "ZEROMPI_CUDA_AWARE=1")
    assert mpi_cuda.cuda_aware(fake_mpi("cuda:device"), {"ZEROMPI_CUDA_AWARE": "0"})[0] is False


def test_a_cuda_memory_kind_means_cuda_aware():
    aware, how = mpi_cuda.cuda_aware(fake_mpi("mpi,system,cuda:device,cuda:host"), {})
    assert aware and "cuda:device" in how
    assert mpi_cuda.cuda_aware(fake_mpi("mpi,system,cuda"), {})[0]


def test_host_or_managed_cuda_memory_alone_is_not_device_memory(monkeypatch):
    monkeypatch.setattr(mpi_cuda, "query_mpix", lambda path: None)
    monkeypatch.setattr(mpi_cuda, "open_mpi_built_with_cuda", lambda: None)
    assert mpi_cuda.cuda_aware(fake_mpi("mpi,system,cuda:host,cuda:managed"), {})[0] is False


def test_without_a_cuda_kind_the_library_is_asked(monkeypatch):
    monkeypatch.setattr(mpi_cuda, "mpi_library_path", lambda: "/some/libmpi.so.40")
    monkeypatch.setattr(mpi_cuda, "query_mpix", lambda path: True)
    assert mpi_cuda.cuda_aware(fake_mpi("mpi,system"), {}) == (True, "MPIX_Query_cuda_support()=1")
    monkeypatch.setattr(mpi_cuda, "query_mpix", lambda path: None)
    monkeypatch.setattr(mpi_cuda, "open_mpi_built_with_cuda", lambda: None)
    assert mpi_cuda.cuda_aware(fake_mpi("mpi,system"), {}) == (False, "mpi_memory_alloc_kinds=mpi,system")
    assert mpi_cuda.cuda_aware(fake_mpi(None), {})[0] is False


def test_library_path_from_the_memory_map(tmp_path):
    maps = tmp_path / "maps"
    maps.write_text("7f00-7f01 r-xp 0 08:01 1 /usr/lib/libmpifort.so.12\n"
                    "7f02-7f03 r-xp 0 08:01 2 /opt/mpich/lib/libmpi.so.12.4\n"
                    "7f04-7f05 r-xp 0 08:01 3 /usr/lib/libc.so.6\n")
    assert mpi_cuda.mpi_library_path(str(maps)) == "/opt/mpich/lib/libmpi.so.12.4"
    maps.write_text("7f00-7f01 r-xp 0 08:01 1 /usr/lib/x86_64-linux-gnu/libmpich.so.12.1\n")   # Debian's MPICH
    assert mpi_cuda.mpi_library_path(str(maps)) == "/usr/lib/x86_64-linux-gnu/libmpich.so.12.1"
    maps.write_text("7f04-7f05 r-xp 0 08:01 3 /usr/lib/libc.so.6\n")
    assert mpi_cuda.mpi_library_path(str(maps)) is None
    assert mpi_cuda.query_mpix(None) is None
    assert mpi_cuda.query_mpix(str(maps)) is None                  # not a library


def test_this_machines_mpi_is_not_cuda_aware_by_every_question():
    """The real MPICH wheel: the info key lists no cuda kind, and its MPIX_Query_cuda_support()
    (found through /proc/self/maps and called through ctypes) returns 0."""
    code = ("from zerompi.comm import Communicator, MPI\nfrom zerompi.devices import mpi_cuda\nCommunicator()\n"
            "print(mpi_cuda.alloc_kinds(MPI)); print(mpi_cuda.mpi_library_path());"
            "print(mpi_cuda.query_mpix(mpi_cuda.mpi_library_path())); print(mpi_cuda.cuda_aware(MPI, {}))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    kinds, path, mpix, verdict = result.stdout.strip().splitlines()
    assert "cuda" not in kinds
    assert "libmpi" in path
    assert mpix == "False"
    assert verdict == "(False, 'MPIX_Query_cuda_support()=0')"


def test_the_device_and_the_watchdog_come_from_the_command_line_then_the_toml_config(tmp_path):
    """What is read before MPI starts (zerompi/train/options/before_mpi.py)."""
    from zerompi.train.options.before_mpi import choices_before_mpi
    def early(*argv):
        choices = choices_before_mpi(list(argv))
        return choices.device, choices.collective_timeout
    toml = tmp_path / "run.toml"
    toml.write_text('device = "cpu"\nstage = 2\ncollective-timeout = 7.5\n')
    assert early() == ("auto", 600.0)
    assert early("--device", "gpu", "--collective-timeout", "3") == ("gpu", 3.0)
    assert early("--config", str(toml)) == ("cpu", 7.5)
    assert early("--config", str(toml), "--device", "gpu") == ("gpu", 7.5)      # the command line wins
    assert early("--config", str(toml), "--collective-timeout", "0") == ("cpu", 0.0)
    assert early("--device") == ("auto", 600.0)                                 # reported later
    assert early("--collective-timeout", "-1") == ("auto", 600.0)               # reported later
    assert early("--collective-timeout", "nan") == ("auto", 600.0)
    assert early("--config", str(tmp_path / "missing.toml")) == ("auto", 600.0)    # reported later
    assert early("--device", "cpu", "--config", str(tmp_path / "missing.toml")) == ("cpu", 600.0)


def test_a_gpu_offers_its_free_memory_shared_by_the_ranks_that_use_it():
    """The preflight's `available` on a GPU (zerompi/plan/preflight.py): cudaMemGetInfo's free
    bytes, divided among the node's ranks that share each GPU (they take the GPUs in turn)."""
    cupy = fake_cupy(count=2)
    cupy.cuda.runtime.memGetInfo = lambda: (80 * 10 ** 9, 141 * 10 ** 9)
    gpu = GPU(cupy, 0, 2)
    assert gpu.memory_available(1) == (80 * 10 ** 9, "the free memory of gpu 0 of 2 (Stand-in GPU)")
    assert gpu.memory_available(2) == (80 * 10 ** 9, "the free memory of gpu 0 of 2 (Stand-in GPU)")
    assert gpu.memory_available(5) == (80 * 10 ** 9 // 3,
                                       "the free memory of gpu 0 of 2 (Stand-in GPU) shared by 3 ranks")
