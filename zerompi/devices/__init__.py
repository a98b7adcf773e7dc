"""GPUs: CuPy arrays, and how collectives reach device memory. The device interface and the
CPU device are the core's (zerompi/device.py, zerompi/cpu.py).

    gpu.py         GPU(CPU): CuPy, the same math as cuBLAS GEMMs and fused kernels
    kernels.py     fused CuPy kernels (bias, GELU, AdamW)
    gemm.py        cuBLAS GemmEx: 16-bit operands on tensor cores
    mpi_cuda.py    whether the MPI library reads device memory (CUDA-aware)
    staging.py     the communicator's transport for device memory (stream sync, pinned host staging)
    nccl.py        a communicator whose training collectives run on NCCL

`communicator_on(device)` builds the Communicator of a run on that device: on a GPU its
collectives go through a DeviceTransport (staging.py), with MPI's CUDA-awareness asked of the
library (mpi_cuda.py) unless the caller says.
"""
import os

from ..comm import Communicator
from ..mpi import MPI
from .mpi_cuda import cuda_aware
from .staging import DeviceTransport


def communicator_on(device, mpi_comm=None, guards=None, mpi_reads_device_memory=None):
    """A Communicator whose training buffers live on `device` (None: the CPU), with zerompi/comm.py's
    other arguments; mpi_reads_device_memory: whether MPI is CUDA-aware, None to ask the library."""
    comm = Communicator(mpi_comm, device, guards)
    if device is not None and device.is_gpu:
        aware, how = (cuda_aware(MPI, os.environ) if mpi_reads_device_memory is None
                      else (mpi_reads_device_memory, "set by the caller"))
        comm.transport = DeviceTransport(comm.transport, device, comm.rank, comm.size, aware, how,
                                         comm.staging)
    return comm
