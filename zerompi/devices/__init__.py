"""Where the arrays live and the few operations that differ between NumPy and CuPy.

    device.py      the one device interface (what every device does), and array helpers
    cpu.py         CPU: NumPy, running the NumPy code of zerompi/layers.py and zerompi/adam.py
    gpu.py         GPU(CPU): CuPy, the same math as cuBLAS GEMMs and fused kernels
    choice.py      --device: choosing the device (the GPU before MPI starts), and what it cannot do
    kernels.py     fused CuPy kernels (bias, GELU, AdamW)
    gemm.py        cuBLAS GemmEx: 16-bit operands on tensor cores
    mpi_cuda.py    whether the MPI library reads device memory (CUDA-aware)
    staging.py     the communicator's transport for device memory (stream sync, pinned host staging)
    nccl.py        a communicator whose training collectives run on NCCL
"""
