"""Where the arrays live and the few operations that differ between NumPy and CuPy.

    device.py      CPU (NumPy) and GPU (CuPy) devices, choosing the GPU before MPI starts
    kernels.py     fused CuPy kernels (bias, GELU, AdamW)
    gemm.py        cuBLAS GemmEx: 16-bit operands on tensor cores
    mpi_cuda.py    whether the MPI library reads device memory (CUDA-aware)
    staging.py     the communicator's transport for device memory (stream sync, pinned host staging)
    nccl.py        a communicator whose training collectives run on NCCL
"""
