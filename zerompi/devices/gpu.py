"""The GPU device: CuPy arrays on one CUDA device, the same math as the CPU's in fewer passes.

The operations of zerompi/cpu.py (listed in zerompi/device.py), each with the same
math as the NumPy reference it replaces (zerompi/layers.py, zerompi/adam.py), built from two things
(shapes as in zerompi/model.py):

    gemm      cuBLAS GemmEx (zerompi/devices/gemm.py): c (M, N) (+)= op(a) op(b), reading 16-bit
              operands on tensor cores, accumulating in float32, writing float32 or rounding once
              into 16 bits, and adding into c (beta = 1) when asked
    kernels   fused CuPy ElementwiseKernels (zerompi/devices/kernels.py): the bias add, bias + GELU
              forward, GELU backward and AdamW's update, one pass over memory each

    linear_forward       pre = x W^T (GEMM), then += b (kernel)
    linear_gelu_forward  pre = x W^T (GEMM), then pre += b, y = GELU(pre) (one kernel)
    gelu_backward        d_pre = dy GELU'(pre) (one kernel)
    linear_backward      dW (+)= d_pre^T x, db (+)= 1^T d_pre, d_x = d_pre W (three GEMMs)
    sum_of_squares       g g^T (a 1 x 1 GEMM: 16-bit g read as it is, accumulated in float32)
    adamw                the whole update in one kernel, no scratch

In mixed precision the matrix multiplies read the 16-bit weights as they are and the activations
x_i, d_pre_i in 16 bits (`operand_dtype`): rounded once by the kernel that writes them (GELU
forward, GELU backward); pre_i, tanh and d_x_i stay float32, since the GEMMs write float32. The
gradients are accumulated in float32 inside the GEMM and rounded once into the 16-bit views;
micro-batches 2..M add to them inside the GEMM. So no weight is widened and no gradient passes
through a work buffer: the only work buffers are a row of ones (db = 1^T d_pre) and the 1 x 1 sum.

Kernels run on CuPy's default stream; `synchronize` waits for everything queued on this device (not
"the current stream": the current device and stream are per host thread, and with --overlap the
communication thread is the one that asks), which comm.py does before handing device memory to MPI.

`gemm` and `kernels` are class attributes, so that tests without a GPU (tests/support/device_stand_in.py)
run every method here with NumPy stand-ins for cuBLAS and the kernels.
"""
from dataclasses import dataclass

import numpy as np

from . import kernels as fused_kernels
from ..cpu import CPU
from .gemm import gemm as cublas_gemm


@dataclass
class GemmWork:
    """The MLP's work buffers on a GPU."""
    ones: object          # (B,) 1s in the operand dtype: db = 1^T d_pre as a GEMM
    square_sum: object    # (1, 1) compute dtype: a gradient's g g^T


class GPU(CPU):
    """CuPy arrays on one CUDA device."""

    is_gpu = True
    gemm = staticmethod(cublas_gemm)   # cuBLAS GemmEx: 16-bit inputs on tensor cores
    kernels = fused_kernels            # the fused elementwise kernels

    def __init__(self, cupy, index, count):
        self.xp = cupy
        self.index, self.count = index, count
        self.name = f"gpu {index} of {count} ({cupy.cuda.runtime.getDeviceProperties(index)['name'].decode()})"
        self.make_current()

    # ---------------------------------------------------------------- memory

    def zeros(self, shape, dtype):
        return self.xp.zeros(shape, dtype=dtype)

    def memory_available(self, ranks_on_node=1):
        """(free bytes of this GPU shared by the ranks that use it, that it is): the node's ranks
        take the GPUs in turn (zerompi/train/options/device_choice.py)."""
        free = self.xp.cuda.runtime.memGetInfo()[0]
        sharing = -(-ranks_on_node // self.count)
        return free // sharing, f"the free memory of {self.name}" + (f" shared by {sharing} ranks" if sharing > 1 else "")

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

    def host_zeros(self, shape, dtype):
        array = self.pinned_bytes(int(np.prod(shape)) * np.dtype(dtype).itemsize).view(dtype).reshape(shape)
        array[...] = 0
        return array

    def copy_to_host(self, device_array, host_array):
        device_array.get(out=host_array)         # synchronous: waits for the producing kernels

    def copy_from_host(self, host_array, device_array):
        device_array.set(host_array)

    def upload(self, host_array, device_array):
        device_array.set(host_array, stream=self.xp.cuda.get_current_stream())

    def take(self, array, index, out, axis=None):
        """out = array.take(index, axis): CuPy's take writes straight into out."""
        self.xp.take(array, index, axis=axis, out=out)

    # ---------------------------------------------------------------- the MLP's layers

    def operand_dtype(self, precision):
        """The dtype the matrix multiplies read their activations in: the storage dtype (16-bit
        operands for the tensor cores in mixed precision)."""
        return precision.storage

    def linear_work(self, alloc, max_layer, batch_rows, precision, micro_batches):
        ones = alloc("work", "mlp.ones", (batch_rows,), self.operand_dtype(precision))
        ones[...] = 1
        return GemmWork(ones, alloc("work", "mlp.square_sum", (1, 1), precision.compute))

    def linear_forward(self, x, weight, bias, y, work):
        """y (B, O) = x (B, I) @ weight (O, I)^T + bias (O,); x and weight may be 16-bit, y wider."""
        self.gemm(x, weight, y, trans_b=True)
        self.kernels.add_bias(y, bias)

    def linear_gelu_forward(self, x, weight, bias, pre, y, tanh_u, work):
        """pre (B, O) = x @ weight^T, then pre += bias and y (B, O) = GELU(pre), keeping tanh_u, in one
        kernel; y may be 16-bit (the next GEMM's operand), rounded once as it is written."""
        self.gemm(x, weight, pre, trans_b=True)
        self.kernels.gelu_forward(pre, y, tanh_u, bias)

    def gelu_backward(self, dy, x, tanh_u, dx):
        """dx (B, O) = dy * GELU'(x), one kernel; dx may be 16-bit, rounded once."""
        self.kernels.gelu_backward(dy, x, tanh_u, dx)

    def linear_backward(self, dy, x, weight, dweight, dbias, dx, accumulate, work):
        """The GEMMs add into dweight and dbias with accumulate (micro-batches after the first) and
        round once into their dtype. dy, x, weight and work.ones share one dtype (16-bit in mixed
        precision); dx (B, I) may be wider."""
        self.gemm(dy, x, dweight, trans_a=True, accumulate=accumulate)                       # dW (+)= dy^T x
        self.gemm(work.ones[None, :dy.shape[0]], dy, dbias[None, :], accumulate=accumulate)  # db (+)= 1^T dy
        if dx is not None:
            self.gemm(dy, weight, dx)                                                        # dx = dy W

    def sum_of_squares(self, a, out, work):
        """out (1,) float64 = a a^T as a 1 x 1 GEMM into work.square_sum, reading 16-bit a as it is
        and accumulating in float32 (float64 for float64)."""
        self.gemm(a[None, :], a[None, :], work.square_sum, trans_b=True)
        out[...] = work.square_sum[0]

    # ---------------------------------------------------------------- AdamW

    def adamw_work(self, chunk, precision, alloc):
        return None                                       # the fused kernel needs no scratch

    def adamw(self, param, grad, master, m, v, grad_multiplier, decay, step_size, sqrt_bias2, config, work):
        """The same math as adamw_chunked (zerompi/adam.py) in one fused kernel over whole arrays."""
        self.kernels.adamw(grad, master, m, v, param, grad_multiplier, decay, config.beta1, config.beta2,
                           step_size, sqrt_bias2, config.eps)
