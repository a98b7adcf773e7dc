"""The CPU device: NumPy arrays in host memory, and the mainline's arithmetic.

A device is where the training buffers live and how the few operations that differ between NumPy
and CuPy run (zerompi/device.py lists them). Here every operation is the plain NumPy code of
zerompi/layers.py (the layers' math, one equation per comment) and zerompi/adam.py (AdamW's chunked
update); this class adds only what precision needs on a CPU (shapes as in zerompi/model.py):

    NumPy has no fast 16-bit matmul, so in mixed precision (zerompi/precision.py) the matrix
    multiplies run in the compute dtype (float32):
      weight, bias    widened into `param_work` (float32, one layer) on every use
      dW, db          computed into `grad_work` (float32, one layer), then rounded into the 16-bit
                      gradient views, or (micro-batches 2..M) added to them and rounded again
    numpy's matmul cannot add into its output, so gradient accumulation in full precision
    (--grad-accum > 1) also computes into `grad_work` and adds; the first micro-batch of a
    full-precision run writes its gradients straight into place.
    A 16-bit gradient's sum of squares widens it into `grad_work` first.

Work buffers belong to their caller (the MLP's `work`, AdamW's `work`), allocated here once
through the memory ledger as "work", so one device serves any number of models.
"""
from dataclasses import dataclass

import numpy as np

from . import layers
from .adam import adamw_chunked
from .util.inputs import memory_limit
from .precision import is_16bit


def blas_threads(ranks_on_node, environ, cores):
    """BLAS threads for one rank: OMP_NUM_THREADS when set to a positive integer (its first entry),
    else the cores this process may run on divided by the ranks on its node, at least 1
    (zerompi/train/options/launch.py checks the variable)."""
    explicit = environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    if explicit.isascii() and explicit.isdigit() and int(explicit) > 0:
        return int(explicit)
    return max(1, cores // ranks_on_node)


@dataclass
class LinearWork:
    """The MLP's one-layer work buffers on the CPU (max_layer elements each, compute dtype)."""
    param_work: object = None    # a 16-bit layer's weight and bias widened; None in full precision
    grad_work: object = None     # a layer's gradient before it is rounded or added; None without either


@dataclass
class AdamWork:
    """AdamW's chunk scratch on the CPU (one chunk each, compute dtype)."""
    scratch: object
    grad_scratch: object = None  # a 16-bit gradient widened; None in full precision


class CPU:
    """NumPy arrays in host memory."""

    name = "cpu"
    xp = np
    is_gpu = False

    # ---------------------------------------------------------------- memory

    def zeros(self, shape, dtype):
        return np.zeros(shape, dtype=dtype)

    def memory_available(self, ranks_on_node=1):
        """(bytes this rank may still allocate, which limit that is): zerompi/util/inputs.py."""
        return memory_limit(ranks_on_node)

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

    def host_zeros(self, shape, dtype):
        """A zeroed array in host memory (page-locked on a GPU device; here the device's own)."""
        return np.zeros(shape, dtype=dtype)

    def copy_to_host(self, device_array, host_array):
        np.copyto(host_array, device_array)

    def copy_from_host(self, host_array, device_array):
        np.copyto(device_array, host_array)

    def upload(self, host_array, device_array):
        """Copy host to device without waiting for it: on a GPU the copy is queued on the current
        stream, so host_array must be pinned (`pinned_bytes`) and must not be written again until
        the host has waited for the device. On the CPU, a plain copy."""
        np.copyto(device_array, host_array)

    take = staticmethod(layers.take)     # out = array.take(index, axis), with no temporary

    # ---------------------------------------------------------------- the MLP's layers

    def operand_dtype(self, precision):
        """The dtype the matrix multiplies read their activations in (x_i, d_pre_i): the compute dtype."""
        return precision.compute

    def linear_work(self, alloc, max_layer, batch_rows, precision, micro_batches):
        """The work buffers of linear_forward, linear_backward and sum_of_squares for layers of up
        to max_layer elements, allocated with alloc(kind, name, shape, dtype) (the ledger's)."""
        dtype = precision.compute
        return LinearWork(
            param_work=alloc("work", "mlp.param_work", (max_layer,), dtype) if precision.mixed else None,
            grad_work=(alloc("work", "mlp.grad_work", (max_layer,), dtype)
                       if precision.mixed or micro_batches > 1 else None))

    def widened(self, work, weight, bias=None):
        """(weight (O, I), bias (O,)) as NumPy's matmul reads them: as stored, or (16-bit) copied
        into work.param_work in the compute dtype (weight row-major, then bias, as in the layout)."""
        if work.param_work is None:                    # stored in the compute dtype
            return weight, bias
        wide_weight = work.param_work[:weight.size].reshape(weight.shape)
        wide_weight[...] = weight
        if bias is None:
            return wide_weight, None
        wide_bias = work.param_work[weight.size:weight.size + bias.size]
        wide_bias[...] = bias
        return wide_weight, wide_bias

    def linear_forward(self, x, weight, bias, y, work):
        """y (B, O) = x (B, I) @ weight (O, I)^T + bias (O,)."""
        weight, bias = self.widened(work, weight, bias)
        layers.linear_forward(x, weight, bias, y)

    def linear_gelu_forward(self, x, weight, bias, pre, y, tanh_u, work):
        """pre (B, O) = x @ weight^T + bias, then y (B, O) = GELU(pre), keeping tanh_u (B, O)."""
        self.linear_forward(x, weight, bias, pre, work)
        layers.gelu_forward(pre, y, tanh_u)

    def gelu_backward(self, dy, x, tanh_u, dx):
        """dx (B, O) = dy * GELU'(x); consumes tanh_u."""
        layers.gelu_backward(dy, x, tanh_u, dx)

    def linear_backward(self, dy, x, weight, dweight, dbias, dx, accumulate, work):
        """dweight (O, I), dbias (O,) = (or, with accumulate, += ) the gradients from dy (B, O) and
        x (B, I), stored in their dtype; dx (B, I) = dy W unless dx is None (the first layer)."""
        weight, _ = self.widened(work, weight)
        if work.param_work is None and not accumulate:   # full precision, first micro-batch
            layers.linear_backward(dy, x, weight, dweight, dbias, dx)   # straight into place
            return
        work_dweight = work.grad_work[:dweight.size].reshape(dweight.shape)
        work_dbias = work.grad_work[dweight.size:dweight.size + dbias.size]
        layers.linear_backward(dy, x, weight, work_dweight, work_dbias, dx)
        if accumulate and work.param_work is not None:   # next micro-batch, 16-bit: add in float32
            # and round once. Not `dweight += work_dweight`: a ufunc between two dtypes allocates
            # NumPy's casting buffers; copies between dtypes do not. The widened weight is used up,
            # so param_work holds the widened gradient so far.
            size = dweight.size + dbias.size
            so_far = work.param_work[:size]
            so_far[:dweight.size] = dweight.reshape(-1)
            so_far[dweight.size:] = dbias
            work.grad_work[:size] += so_far
            dweight[...] = work_dweight
            dbias[...] = work_dbias
        elif accumulate:                             # next micro-batch, full precision: add
            dweight += work_dweight
            dbias += work_dbias
        else:
            dweight[...] = work_dweight              # round into 16-bit storage
            dbias[...] = work_dbias

    def sum_of_squares(self, a, out, work):
        """out (1,) float64 = sum of a^2 over the 1-D array a: a dot in a's dtype, a 16-bit a
        first widened into work.grad_work."""
        if is_16bit(a):
            widened = work.grad_work[:a.size]
            widened[...] = a
            a = widened
        out[...] = np.dot(a, a)

    # ---------------------------------------------------------------- AdamW

    def adamw_work(self, chunk, precision, alloc):
        """adamw_chunked's scratch: one chunk (chunk elements), and a second for 16-bit gradients."""
        dtype = precision.compute
        return AdamWork(alloc("work", "adam.scratch", (chunk,), dtype),
                        alloc("work", "adam.grad_scratch", (chunk,), dtype) if precision.mixed else None)

    def adamw(self, param, grad, master, m, v, grad_multiplier, decay, step_size, sqrt_bias2, config, work):
        """One AdamW step in place over param, grad, master, m, v (n,) (zerompi/adam.py)."""
        adamw_chunked(param, grad, master, m, v, grad_multiplier, decay, step_size, sqrt_bias2, config,
                      work.scratch, work.grad_scratch)
