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
zerompi/device.py). On a GPU the two GELU functions and the bias add run as one fused kernel each
(zerompi/gpu_kernels.py) instead of the chain of in-place passes written out below, and the linear
layer's products are the device's GEMM (`gemm`, zerompi/gemm.py) when one is given: it reads
16-bit operands on tensor cores, writes a wider output, and can add into its output.
"""
import math

import numpy as np

from . import gpu_kernels
from .device import array_module

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


def softmax_cross_entropy(logits, labels, global_batch, dlogits, loss_scale=1.0):
    """Loss summed over the local rows and divided by the global batch size.

    logits (B, C), labels (B,) int -> returns (loss_part, correct); writes
    dlogits (B, C) = loss_scale (softmax(logits) - onehot(labels)) / global_batch. dlogits may alias logits.
    loss_part summed over ranks is the mean loss of the global batch; correct counts argmax hits.
    Both are scalars where the arrays live (0-d CuPy arrays on a GPU: reading them would wait).
    """
    xp = array_module(logits)
    rows = xp.arange(labels.shape[0])
    correct = xp.count_nonzero(xp.argmax(logits, axis=1) == labels)
    xp.subtract(logits, logits.max(axis=1, keepdims=True), out=dlogits)   # z - max z (stable)
    picked = dlogits[rows, labels].copy()                                # z_label - max z
    xp.exp(dlogits, out=dlogits)
    sum_exp = dlogits.sum(axis=1)
    loss_part = xp.sum(xp.log(sum_exp) - picked).astype(xp.float64) / global_batch   # -log softmax(z)[label]
    dlogits /= sum_exp[:, None]                                          # softmax(z)
    dlogits[rows, labels] -= 1.0                                         # - onehot
    dlogits *= loss_scale / global_batch
    return loss_part, correct
