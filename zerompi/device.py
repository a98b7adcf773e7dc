"""One device interface: where the arrays live and the few operations that differ between NumPy and CuPy.

A run chooses its device once, at start (zerompi/train/options/device_choice.py: `select_device`, before MPI
starts), and every part of it asks that object; nothing else asks where an array lives:

    CPU    zerompi/cpu.py    NumPy; its operations are the NumPy code of zerompi/layers.py
                                     and zerompi/adam.py, the mainline's arithmetic
    GPU    zerompi/devices/gpu.py    CuPy; the same math as cuBLAS GEMMs and fused kernels

Memory (zerompi/ledger.py allocates every buffer with `zeros`; zerompi/comm.py moves them):

    name, is_gpu, xp                  a label; whether it is a GPU; numpy or cupy
    zeros(shape, dtype)               a zeroed array in the device's memory
    holds(array)                      whether array is in device memory apart from the host's
    from_numpy(host_array)            the array in device memory (the CPU: itself)
    copy_to_host / copy_from_host     synchronous copies between device and host arrays
    upload(host, device_array)        a copy queued without waiting (from pinned host memory)
    pinned_bytes(nbytes)              a host byte buffer for staging (page-locked on a GPU)
    host_zeros(shape, dtype)          a zeroed host array (page-locked on a GPU; zerompi/offload/)
    synchronize(), make_current()     wait for queued work; make it the thread's current device
    take(array, index, out, axis)     out = array.take(index, axis), no temporary

Compute (zerompi/model.py, zerompi/adam.py, zerompi/step.py; shapes as in zerompi/model.py). Work
buffers are allocated by the device, ledgered as "work", and kept by their caller:

    operand_dtype(precision)                       the dtype the matrix multiplies read
    linear_work(alloc, max_layer, B, precision, M) the MLP's work buffers
    linear_forward(x, W, b, y, work)               y = x W^T + b
    linear_gelu_forward(x, W, b, pre, y, t, work)  pre = x W^T + b, y = GELU(pre), t = tanh(u)
    gelu_backward(dy, pre, t, dx)                  dx = dy GELU'(pre)
    linear_backward(dy, x, W, dW, db, dx, accumulate, work)
                                                   dW (+)= dy^T x, db (+)= sum_rows(dy), dx = dy W
    sum_of_squares(g, out, work)                   out (1,) float64 = sum g^2
    adamw_work(chunk, precision, alloc)            AdamW's work buffers (None on a GPU)
    adamw(param, grad, master, m, v, multiplier, decay, step_size, sqrt_bias2, config, work)
                                                   one AdamW step in place

`to_numpy` below serves code that holds an array but not its device (checkpoints, weight files,
the step's one read of its sums) and asks the array's type.
"""
import numpy as np


def to_numpy(array):
    """A host (NumPy) array with array's values: array itself on the CPU, a copy from a GPU."""
    return array if isinstance(array, np.ndarray) else array.get()
