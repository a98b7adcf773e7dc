"""A GPU stand-in for machines without one: NumPy arrays posing as device memory.

The arrays are an ndarray subclass (`DeviceArray`), so every computation runs on the CPU exactly as
on the CPU device, but the communicator's device transport (zerompi/devices/staging.py) sees memory
that the device `holds`: with `mpi_reads_device_memory=False` every collective on it goes through
the pinned-host staging path, with True it goes to MPI directly after a `synchronize`. The counters
say what happened. (mpi4py's own tests use the same trick: host memory behind a device-array
interface.)

`StandInGPU()` computes as the CPU device does (NumPy on those arrays): only the memory is a GPU's.
`StandInTensorCores()` also computes as the GPU device does: it is zerompi/devices/gpu.py's
GPU with the two CuPy pieces replaced, so that every GPU method runs (16-bit operands, wider
outputs, gradients added inside the GEMM, the fused AdamW):

- its `gemm` goes through zerompi/devices/gemm.py's `cublas_arguments`, exactly the arguments
  cuBLAS would get, and `column_major_gemm` below does what cublasGemmEx does with them, on the
  flat host buffers;
- its `kernels` (`StandInKernels`) are zerompi/devices/kernels.py's fused kernels written in NumPy:
  the same math per element in the compute dtype, each output rounded once as the kernel writes it.
"""
import numpy as np

from zerompi import layers
from zerompi.cpu import CPU
from zerompi.devices.gemm import ACCUMULATE, CUBLAS_COMPUTE_32F, CUBLAS_OP_N, cublas_arguments
from zerompi.devices.gpu import GPU


def column_major(array, rows, cols, ld):
    """The (rows, cols) column-major matrix with leading dimension ld that starts at array's
    first element, as cuBLAS reads it: element (i, j) is flat[i + j ld]. A writable view."""
    flat = array.reshape(-1)
    return np.lib.stride_tricks.as_strided(flat, shape=(rows, cols), strides=(flat.itemsize, ld * flat.itemsize))


def column_major_gemm(transa, transb, m, n, k, first, lda, second, ldb, c, ldc, compute, accumulate):
    """cublasGemmEx on host buffers: C (m, n) = op(A) (m, k) op(B) (k, n) [+ C], all column-major,
    the products summed in the compute type and rounded once into C's dtype."""
    wide = np.float32 if compute == CUBLAS_COMPUTE_32F else np.float64
    op_a = (column_major(first, m, k, lda) if transa == CUBLAS_OP_N else column_major(first, k, m, lda).T)
    op_b = (column_major(second, k, n, ldb) if transb == CUBLAS_OP_N else column_major(second, n, k, ldb).T)
    out = column_major(c, m, n, ldc)
    product = op_a.astype(wide) @ op_b.astype(wide)
    if accumulate:
        product += out.astype(wide)
    out[...] = product


def stand_in_gemm(a, b, c, trans_a=False, trans_b=False, accumulate=False):
    """zerompi.devices.gemm.gemm, with column_major_gemm in place of the cuBLAS call."""
    assert a.dtype == b.dtype
    transa, transb, m, n, k, first, lda, second, ldb, ldc = cublas_arguments(a, b, c, trans_a, trans_b)
    compute = ACCUMULATE[a.dtype.name]
    column_major_gemm(transa, transb, m, n, k, first, lda, second, ldb, c, ldc, compute, accumulate)


class StandInKernels:
    """zerompi/devices/kernels.py's kernels in NumPy (T: the compute dtype of x or master)."""

    @staticmethod
    def add_bias(y, bias):
        y += bias.astype(y.dtype)                       # y = y + (T)bias

    @staticmethod
    def gelu_forward(x, y, tanh_u, bias=None):
        if bias is not None:
            x += bias.astype(x.dtype)                   # x = x + (T)bias
        wide = np.empty_like(x)
        layers.gelu_forward(x, wide, tanh_u)
        y[...] = wide                                   # y = (Y)(...): rounded once

    @staticmethod
    def gelu_backward(dy, x, tanh_u, dx):
        wide = np.empty_like(x)
        layers.gelu_backward(dy, x, tanh_u, wide)
        dx[...] = wide                                  # dx = (D)(...): rounded once

    @staticmethod
    def adamw(grad, master, m, v, param, multiplier, decay, beta1, beta2, step_size, sqrt_bias2, eps):
        t = master.dtype.type
        multiplier, decay, beta1, beta2, step_size, sqrt_bias2, eps = (
            t(s) for s in (multiplier, decay, beta1, beta2, step_size, sqrt_bias2, eps))
        g = grad.astype(master.dtype) * multiplier
        master *= decay
        m[...] = beta1 * m + (t(1) - beta1) * g
        v[...] = beta2 * v + (t(1) - beta2) * g * g
        master -= step_size * (m / (np.sqrt(v) / sqrt_bias2 + eps))
        if param is not master:
            param[...] = master                         # param = (P)p


class DeviceArray(np.ndarray):
    """Host memory that the stand-in device claims as its own."""


class StandInGPU(CPU):
    """GPU memory on the host; computes as the CPU device (StandInTensorCores: as the GPU device)."""

    name = "stand-in gpu (host memory)"
    is_gpu = True
    index, count = 0, 1

    def __init__(self):
        self.synchronized = self.to_host = self.from_host = 0
        self.pinned = []

    def zeros(self, shape, dtype):
        return np.zeros(shape, dtype=dtype).view(DeviceArray)

    def holds(self, array):
        return isinstance(array, DeviceArray)

    def from_numpy(self, host_array):
        return np.array(host_array).view(DeviceArray)

    def synchronize(self):
        self.synchronized += 1

    def make_current(self):
        pass

    def pinned_bytes(self, nbytes):
        self.pinned.append(nbytes)
        return np.zeros(nbytes, dtype=np.uint8)

    def copy_to_host(self, device_array, host_array):
        assert self.holds(device_array) and not self.holds(host_array)
        self.to_host += 1
        np.copyto(host_array, device_array)

    def copy_from_host(self, host_array, device_array):
        assert self.holds(device_array) and not self.holds(host_array)
        self.from_host += 1
        np.copyto(device_array, host_array)

    def upload(self, host_array, device_array):
        np.copyto(device_array, host_array)

    take = staticmethod(layers.take)    # the CPU's (also for StandInTensorCores: GPU.take is CuPy's)


class StandInTensorCores(StandInGPU, GPU):
    """The stand-in's memory, and the GPU device's arithmetic with NumPy stand-ins for cuBLAS and
    the fused kernels (xp is NumPy: the class attribute of CPU, which GPU's __init__ would set)."""

    name = "stand-in gpu with tensor cores (host memory)"
    gemm = staticmethod(stand_in_gemm)
    kernels = StandInKernels
