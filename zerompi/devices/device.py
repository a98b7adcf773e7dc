"""Where the arrays live: NumPy on the CPU or CuPy on a GPU, one array module chosen at start.

    --device cpu    NumPy
    --device gpu    CuPy, one GPU per rank; an error when CuPy is missing or sees no GPU
    --device auto   the GPU when CuPy imports and sees one, else the CPU (the default)

Every buffer is allocated through `device.zeros` (by zerompi/ledger.py's MemoryLedger), and the
compute functions take their array module from their arguments (`array_module(x)`), so the same
code runs on both. Crossing between host and device is explicit and happens only at the edges:
the data set is copied to the device once, checkpoints and weights are copied back
(`to_numpy`), and MPI gets device buffers directly or through pinned host staging
(zerompi/comm.py, zerompi/devices/mpi_cuda.py).

Which GPU: the launcher's local rank modulo the GPUs this process sees, chosen BEFORE MPI
initializes (zerompi/comm.py initializes MPI when the first Communicator is built): a CUDA-aware
MPI may create its CUDA context, or register memory, on the device current at MPI_Init. With more
ranks than GPUs, ranks share them (local ranks 0..3 on one GPU all use GPU 0).

    local-rank variable          set by                        (read in this order)
    OMPI_COMM_WORLD_LOCAL_RANK   Open MPI's mpirun
    MPI_LOCALRANKID              MPICH's hydra mpiexec, Intel MPI
    PALS_LOCAL_RANKID            Cray PALS (aprun's successor)
    PMI_LOCAL_RANK               some PMI launchers
    SLURM_LOCALID                srun

Slurm: `--gpus-per-task` gives each task only its own GPU (CUDA_VISIBLE_DEVICES holds one
device), so every rank sees a "GPU 0" and CUDA IPC between the ranks of a node fails (MPI then
falls back to slow paths, or errors). Request `--gpus-per-node=G --gpu-bind=none` instead and
let the local rank choose (the scripts in slurm/ do).
"""
import numpy as np

from .gemm import gemm as cublas_gemm
from ..train.launch import first_number

DEVICE_CHOICES = ("auto", "cpu", "gpu")
LOCAL_RANK_VARIABLES = ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "PALS_LOCAL_RANKID",
                        "PMI_LOCAL_RANK", "SLURM_LOCALID")


def local_rank(environ):
    """This process's rank among the processes of its node, as the launcher numbered it (0 when unknown)."""
    return first_number(environ, LOCAL_RANK_VARIABLES)


def array_module(array):
    """numpy or cupy: the module whose functions compute on `array` where it lives."""
    return np if isinstance(array, np.ndarray) else _cupy()


def take(array, index, out, axis=None):
    """out = array.take(index, axis), with no temporary: NumPy's take buffers `out` (a temporary of
    its size) unless mode='clip', which only matters for indices out of range (the callers' never
    are); CuPy's take writes straight into out and has no mode."""
    if isinstance(array, np.ndarray):
        np.take(array, index, axis=axis, out=out, mode="clip")
    else:
        _cupy().take(array, index, axis=axis, out=out)


def to_numpy(array):
    """A host (NumPy) array with array's values: array itself on the CPU, a copy from a GPU."""
    return array if isinstance(array, np.ndarray) else array.get()


def _cupy():
    import cupy
    return cupy


class CPU:
    """NumPy arrays in host memory."""

    name = "cpu"
    xp = np
    is_gpu = False
    gemm = None     # NumPy's matmul, in the compute dtype (zerompi/model.py widens 16-bit weights)

    def zeros(self, shape, dtype):
        return np.zeros(shape, dtype=dtype)

    def holds(self, array):
        """Whether array is in this device's memory, apart from the host's (never, on the CPU)."""
        return False

    def from_numpy(self, host_array):
        """The array in this device's memory (on the CPU: itself)."""
        return host_array

    def synchronize(self):
        """Nothing runs asynchronously on the CPU."""

    def make_current(self):
        """Make this device the current one of the calling host thread (nothing to do on the CPU)."""

    def pinned_bytes(self, nbytes):
        """A host byte buffer for staging (page-locked on a GPU device; plain memory here)."""
        return np.zeros(nbytes, dtype=np.uint8)

    def copy_to_host(self, device_array, host_array):
        np.copyto(host_array, device_array)

    def copy_from_host(self, host_array, device_array):
        np.copyto(device_array, host_array)

    def upload(self, host_array, device_array):
        """Copy host to device without waiting for it: on a GPU the copy is queued on the current
        stream, so host_array must be pinned (`pinned_bytes`) and must not be written again until
        the host has waited for the device. On the CPU, a plain copy."""
        np.copyto(device_array, host_array)


class GPU(CPU):
    """CuPy arrays on one CUDA device. Kernels run on CuPy's default stream; `synchronize` waits
    for everything queued on this device (not "the current stream": the current device and stream
    are per host thread, and with --overlap on the communication thread is the one that asks),
    which comm.py does before handing device memory to MPI."""

    is_gpu = True
    gemm = staticmethod(cublas_gemm)   # cuBLAS GemmEx: 16-bit inputs on tensor cores (zerompi/devices/gemm.py)

    def __init__(self, cupy, index, count):
        self.xp = cupy
        self.index, self.count = index, count
        self.name = f"gpu {index} of {count} ({cupy.cuda.runtime.getDeviceProperties(index)['name'].decode()})"
        self.make_current()

    def zeros(self, shape, dtype):
        return self.xp.zeros(shape, dtype=dtype)

    def holds(self, array):
        return isinstance(array, self.xp.ndarray)

    def from_numpy(self, host_array):
        return self.xp.asarray(host_array)

    def synchronize(self):
        self.xp.cuda.Device(self.index).synchronize()

    def make_current(self):
        self.xp.cuda.Device(self.index).use()

    def pinned_bytes(self, nbytes):
        memory = self.xp.cuda.alloc_pinned_memory(max(nbytes, 1))
        return np.frombuffer(memory, dtype=np.uint8, count=nbytes)   # keeps `memory` alive

    def copy_to_host(self, device_array, host_array):
        device_array.get(out=host_array)         # synchronous: waits for the producing kernels

    def copy_from_host(self, host_array, device_array):
        device_array.set(host_array)

    def upload(self, host_array, device_array):
        device_array.set(host_array, stream=self.xp.cuda.get_current_stream())


def check_device(device, dtype_name, comm_backend, ranks_on_node):
    """What the chosen device cannot do for this run, as a one-line message, or None."""
    if comm_backend == "nccl" and not device.is_gpu:
        return "--comm nccl needs a GPU, and this run has none (see --device)"
    if comm_backend == "nccl" and not _nccl_available():
        return "--comm nccl: CuPy finds no NCCL library (pip install nvidia-nccl-cu12, or use --comm mpi)"
    if comm_backend == "nccl" and ranks_on_node > device.count:
        return (f"--comm nccl: {ranks_on_node} ranks on this node but {device.count} GPU(s): NCCL needs a "
                f"GPU per rank (use --comm mpi to share GPUs)")
    if device.is_gpu and dtype_name == "bf16":
        from ..precision import BF16
        try:
            device.zeros(2, BF16).astype(np.float32)     # a kernel on bfloat16, not only a memset
        except Exception:
            return "--dtype bf16: this CuPy has no bfloat16 arrays; on the GPU use fp16 or float32"
    return None


def _nccl_available():
    try:
        from cupy.cuda import nccl
    except ImportError:
        return False
    return nccl.available


def select_device(choice, environ):
    """(device, error message or None) for --device choice; call before MPI initializes.
    On an error the CPU device is returned, so that the run can report it and exit cleanly."""
    if choice == "cpu":
        return CPU(), None
    try:
        import cupy
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:                   # no CuPy, no driver, no device: all mean "no GPU here"
        reason = ("CuPy is not installed (pip install 'zerompi[gpu]')" if isinstance(e, ImportError)
                  else f"CuPy finds no usable GPU ({type(e).__name__}: {e})".splitlines()[0])
        return CPU(), (f"--device gpu: {reason}" if choice == "gpu" else None)
    if count == 0:
        return CPU(), ("--device gpu: CuPy sees no GPU (check CUDA_VISIBLE_DEVICES)" if choice == "gpu" else None)
    return GPU(cupy, local_rank(environ) % count, count), None
