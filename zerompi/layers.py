"""The MLP's layers as small functions of explicit arrays, with manual backprop.

Shapes (defined once, used in every comment below):
    B      rows of the local (per-rank) micro-batch
    I, O   input and output width of a linear layer
    C      number of classes (width of the last layer)

Every forward writes into a caller-provided output buffer and every backward writes into
caller-provided gradient buffers, so the training loop allocates nothing per step. What a
backward needs (the layer's input, the GELU pre-activation) is kept by the caller in those
same preallocated buffers.

    linear:   y = x W^T + b                 dW = dy^T x,  db = sum_rows(dy),  dx = dy W
    GELU:     y = x/2 (1 + tanh(u)),        u  = sqrt(2/pi) (x + 0.044715 x^3)
              dy/dx = (1 + t)/2 + x/2 (1 - t^2) sqrt(2/pi) (1 + 3*0.044715 x^2),  t = tanh(u)
              (the tanh form; PyTorch's GELU(approximate="tanh"))
    softmax cross-entropy, mean over the GLOBAL batch of B_global rows, loss scale S:
              loss = -1/B_global sum_rows log softmax(z)[label]
              dz   = S (softmax(z) - onehot(label)) / B_global
              (S = 1 except in fp16 training, where it keeps small gradients above fp16's
              smallest number; Adam divides it back out)

The loss gradient is divided by the global batch size, not the local one, so that summing the
ranks' gradients (what reduce-scatter and all-reduce do) gives exactly the gradient of the global
mean loss: no separate averaging pass is needed.

All functions are checked against finite differences in float64 (tests/test_layers.py).

Every function computes with the array module of its arguments (NumPy, or CuPy on a GPU: see
zerompi/devices/device.py). On a GPU the two GELU functions and the bias add run as one fused kernel each
(zerompi/devices/kernels.py) instead of the chain of in-place passes written out below, and the linear
layer's products are the device's GEMM (`gemm`, zerompi/devices/gemm.py) when one is given: it reads
16-bit operands on tensor cores, writes a wider output, and can add into its output.
"""
import math

import numpy as np

from .devices import kernels as gpu_kernels
from .devices.device import array_module, take

GELU_C = math.sqrt(2.0 / math.pi)
GELU_A = 0.044715


def linear_forward(x, weight, bias, y, gemm=None):
    """y (B, O) = x (B, I) @ weight (O, I)^T + bias (O,), or without bias when it is None (the
    GELU that follows adds it). With the device's gemm, x and weight may be 16-bit and y wider."""
    if gemm is None:
        array_module(x).matmul(x, weight.T, out=y)
    else:
        gemm(x, weight, y, trans_b=True)
    if bias is not None:
        add_bias(y, bias)


def add_bias(y, bias):
    """y (B, O) += bias (O,) on every row."""
    if array_module(y) is np:
        y += bias
    else:
        gpu_kernels.add_bias(y, bias)


def linear_backward(dy, x, weight, dweight, dbias, dx):
    """Given dy (B, O) and the forward input x (B, I): write dweight (O, I), dbias (O,), and
    dx (B, I) unless dx is None (the first layer needs no input gradient)."""
    xp = array_module(dy)
    xp.matmul(dy.T, x, out=dweight)      # dW = dy^T x
    xp.sum(dy, axis=0, out=dbias)        # db = sum over rows of dy
    if dx is not None:
        xp.matmul(dy, weight, out=dx)    # dx = dy W


def linear_backward_gemm(gemm, dy, x, weight, ones, dweight, dbias, dx, accumulate):
    """linear_backward through the device's gemm, which adds into dweight and dbias with
    accumulate (micro-batches after the first) and rounds once into their dtype. dy, x, weight and
    ones (B,) of 1s share one dtype (16-bit in mixed precision); dx (B, I) may be wider."""
    gemm(dy, x, dweight, trans_a=True, accumulate=accumulate)                    # dW (+)= dy^T x
    gemm(ones[None, :dy.shape[0]], dy, dbias[None, :], accumulate=accumulate)    # db (+)= 1^T dy
    if dx is not None:
        gemm(dy, weight, dx)                                                     # dx = dy W


def gelu_forward(x, y, tanh_u, bias=None):
    """y (B, O) = GELU(x); keeps tanh_u (B, O) = tanh(u) for the backward. With a bias (O,), first
    x += bias in place (x is then the pre-activation the backward reads): a linear layer that
    leaves its bias to this function saves a pass over x on a GPU, where both are one kernel.
    y may be narrower than x (16 bits in mixed precision on a GPU): rounded once, as it is written."""
    xp = array_module(x)
    if xp is not np:
        return gpu_kernels.gelu_forward(x, y, tanh_u, bias)
    if bias is not None:
        add_bias(x, bias)
    if y.dtype != x.dtype:               # 16-bit y in NumPy: only the tests' stand-in GPU
        wide = np.empty_like(x)
        gelu_forward(x, wide, tanh_u)
        y[...] = wide                    # rounded once, as the GPU kernel writes it
        return
    xp.multiply(x, x, out=tanh_u)
    tanh_u *= GELU_A
    tanh_u += 1.0
    tanh_u *= x
    tanh_u *= GELU_C                     # u = sqrt(2/pi) (x + a x^3)
    xp.tanh(tanh_u, out=tanh_u)          # t = tanh(u)
    xp.add(tanh_u, 1.0, out=y)
    y *= x
    y *= 0.5                             # y = x/2 (1 + t)


def gelu_backward(dy, x, tanh_u, dx):
    """dx (B, O) = dy * GELU'(x), from the forward's x and tanh_u. Uses tanh_u as scratch (it is
    consumed: a layer's backward is its last use). dx must not alias dy or x."""
    xp = array_module(x)
    if xp is not np:
        return gpu_kernels.gelu_backward(dy, x, tanh_u, dx)
    if dx.dtype != x.dtype:              # 16-bit dx in NumPy: only the tests' stand-in GPU
        wide = np.empty_like(x)
        gelu_backward(dy, x, tanh_u, wide)
        dx[...] = wide
        return
    # GELU'(x) = (1 + t)/2 + x/2 (1 - t^2) c (1 + 3a x^2)
    #          = (1 + t)/2 * (1 + q (1 - t))        with q = c x (1 + 3a x^2), 1 - t^2 = (1 + t)(1 - t)
    #          = (1 - s/2) * (1 + q s)              with s = 1 - t
    xp.multiply(x, x, out=dx)
    dx *= 3.0 * GELU_A
    dx += 1.0
    dx *= x
    dx *= GELU_C                         # q = c x (1 + 3a x^2)
    s = tanh_u
    xp.subtract(1.0, tanh_u, out=s)      # s = 1 - t
    dx *= s
    dx += 1.0                            # 1 + q s
    s *= -0.5
    s += 1.0                             # 1 - s/2 = (1 + t)/2
    dx *= s
    dx *= dy                             # dx = dy * GELU'(x)


class LossScratch:
    """softmax_cross_entropy's work buffers for up to B rows of C classes, allocated once, so that
    the loss allocates nothing per micro-batch (on NumPy and CuPy alike). alloc(kind, name, shape,
    dtype) is the memory ledger's."""

    def __init__(self, rows, classes, dtype, alloc):
        self.row_max = alloc("activations", "loss.row_max", (rows,), dtype)      # max z, then sum exp(z - max z)
        self.picked = alloc("activations", "loss.picked", (rows,), dtype)        # z_label - max z, then p_label
        self.row_loss = alloc("activations", "loss.row_loss", (rows,), dtype)    # -log softmax(z)[label]
        self.predicted = alloc("activations", "loss.predicted", (rows,), np.int64)   # argmax z
        self.hits = alloc("activations", "loss.hits", (rows,), np.bool_)         # predicted == label
        self.label_index = alloc("activations", "loss.label_index", (rows,), np.int64)   # row C + label
        self.row_start = alloc("activations", "loss.row_start", (rows,), np.int64)       # row C
        self.row_start[...] = array_module(self.row_start).arange(rows) * classes
        self.totals = alloc("activations", "loss.totals", (2,), np.float64)      # (loss part, correct)


def softmax_cross_entropy(logits, labels, global_batch, dlogits, loss_scale=1.0, scratch=None):
    """Loss summed over the local rows and divided by the global batch size.

    logits (B, C), labels (B,) int -> returns totals (2,) float64 = (loss_part, correct); writes
    dlogits (B, C, C-contiguous) = loss_scale (softmax(logits) - onehot(labels)) / global_batch.
    dlogits may alias logits. Labels must lie in [0, C) (the data loader checks them once).
    loss_part summed over ranks is the mean loss of the global batch; correct counts argmax hits.
    totals lives where the arrays do (on a GPU: reading it would wait), in scratch (a LossScratch;
    None: fresh buffers for this one call).
    """
    xp = array_module(logits)
    n, classes = logits.shape
    if not dlogits.flags.c_contiguous:          # `flat` below must be a view of it, not a copy
        raise ValueError("softmax_cross_entropy: dlogits must be C-contiguous")
    if scratch is None:                         # a call on its own (tests, tests/reference.py)
        if labels.size and not 0 <= int(labels.min()) <= int(labels.max()) < classes:
            raise IndexError(f"softmax_cross_entropy: labels must lie in [0, {classes})")
        scratch = LossScratch(n, classes, logits.dtype, lambda kind, name, shape, dtype: xp.zeros(shape, dtype))
    row_max, picked, row_loss = scratch.row_max[:n], scratch.picked[:n], scratch.row_loss[:n]
    label_index, totals = scratch.label_index[:n], scratch.totals
    xp.argmax(logits, axis=1, out=scratch.predicted[:n])
    xp.equal(scratch.predicted[:n], labels, out=scratch.hits[:n])
    xp.sum(scratch.hits[:n], axis=0, dtype=np.float64, keepdims=True, out=totals[1:])    # correct
    xp.max(logits, axis=1, out=row_max)
    xp.subtract(logits, row_max[:, None], out=dlogits)                  # z - max z (stable)
    xp.add(scratch.row_start[:n], labels, out=label_index)
    flat = dlogits.reshape(-1)          # (n C,) view: element (row, label) at label_index, and what
                                        # is written through it below is written into dlogits
    take(flat, label_index, picked)                                     # z_label - max z
    xp.exp(dlogits, out=dlogits)
    sum_exp = row_max                                                   # (max z is no longer needed)
    xp.sum(dlogits, axis=1, out=sum_exp)
    xp.log(sum_exp, out=row_loss)
    row_loss -= picked                                                  # -log softmax(z)[label]
    xp.sum(row_loss, axis=0, dtype=np.float64, keepdims=True, out=totals[:1])
    totals[:1] /= global_batch                                          # loss_part
    dlogits /= sum_exp[:, None]                                         # softmax(z)
    take(flat, label_index, picked)
    picked -= 1.0
    xp.put(flat, label_index, picked)                                   # - onehot
    dlogits *= loss_scale / global_batch
    return totals
