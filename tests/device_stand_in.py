"""A GPU stand-in for machines without one: NumPy arrays posing as device memory.

The arrays are an ndarray subclass (`DeviceArray`), so every computation runs on the CPU exactly as
on the CPU device, but the communicator's device transport (zerompi/devices/staging.py) sees memory
that the device `holds`: with `mpi_reads_device_memory=False` every collective on it goes through
the pinned-host staging path, with True it goes to MPI directly after a `synchronize`. The counters
say what happened. (mpi4py's own tests use the same trick: host memory behind a device-array
interface.)

`StandInGPU(tensor_cores=True)` also gives it a `gemm`, so that zerompi/model.py takes the GPU's
matrix-multiply path (16-bit operands, wider outputs, adding into gradients): each call goes
through zerompi/devices/gemm.py's `cublas_arguments`, exactly the arguments cuBLAS would get, and
`column_major_gemm` below does what cublasGemmEx does with them, on the flat host buffers.
"""
import numpy as np

from zerompi.devices.device import CPU
from zerompi.devices.gemm import ACCUMULATE, CUBLAS_COMPUTE_32F, CUBLAS_OP_N, cublas_arguments


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
    """zerompi.gemm.gemm, with column_major_gemm in place of the cuBLAS call."""
    assert a.dtype == b.dtype
    transa, transb, m, n, k, first, lda, second, ldb, ldc = cublas_arguments(a, b, c, trans_a, trans_b)
    compute = ACCUMULATE[a.dtype.name]
    column_major_gemm(transa, transb, m, n, k, first, lda, second, ldb, c, ldc, compute, accumulate)


class DeviceArray(np.ndarray):
    """Host memory that the stand-in device claims as its own."""


class StandInGPU(CPU):
    name = "stand-in gpu (host memory)"
    is_gpu = True

    def __init__(self, tensor_cores=False):
        self.synchronized = self.to_host = self.from_host = 0
        self.pinned = []
        self.gemm = stand_in_gemm if tensor_cores else None

    def zeros(self, shape, dtype):
        return np.zeros(shape, dtype=dtype).view(DeviceArray)

    def holds(self, array):
        return isinstance(array, DeviceArray)

    def from_numpy(self, host_array):
        return np.array(host_array).view(DeviceArray)

    def synchronize(self):
        self.synchronized += 1

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
