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

All functions are checked against finite differences in float64 (tests/proofs/test_layers_match_finite_differences.py).

These are NumPy functions: the CPU device (zerompi/cpu.py) calls them as they are. A GPU
(zerompi/devices/gpu.py) computes the same math its own way: the linear layer's products as cuBLAS
GEMMs that read 16-bit operands and can add into their output (zerompi/devices/gemm.py), the bias
add and each GELU as one fused kernel (zerompi/devices/kernels.py) instead of the chain of in-place
passes written out below. The loss is written once for both: it computes with the array module of
the device its scratch buffers live on (`LossScratch`).
"""
import math

import numpy as np

GELU_C = math.sqrt(2.0 / math.pi)
GELU_A = 0.044715


def linear_forward(x, weight, bias, y):
    """y (B, O) = x (B, I) @ weight (O, I)^T + bias (O,)."""
    np.matmul(x, weight.T, out=y)
    y += bias                            # on every row


def linear_backward(dy, x, weight, dweight, dbias, dx):
    """Given dy (B, O) and the forward input x (B, I): write dweight (O, I), dbias (O,), and
    dx (B, I) unless dx is None (the first layer needs no input gradient)."""
    np.matmul(dy.T, x, out=dweight)      # dW = dy^T x
    np.sum(dy, axis=0, out=dbias)        # db = sum over rows of dy
    if dx is not None:
        np.matmul(dy, weight, out=dx)    # dx = dy W


def gelu_forward(x, y, tanh_u):
    """y (B, O) = GELU(x); keeps tanh_u (B, O) = tanh(u) for the backward."""
    np.multiply(x, x, out=tanh_u)
    tanh_u *= GELU_A
    tanh_u += 1.0
    tanh_u *= x
    tanh_u *= GELU_C                     # u = sqrt(2/pi) (x + a x^3)
    np.tanh(tanh_u, out=tanh_u)          # t = tanh(u)
    np.add(tanh_u, 1.0, out=y)
    y *= x
    y *= 0.5                             # y = x/2 (1 + t)


def gelu_backward(dy, x, tanh_u, dx):
    """dx (B, O) = dy * GELU'(x), from the forward's x and tanh_u. Uses tanh_u as scratch (it is
    consumed: a layer's backward is its last use). dx must not alias dy or x."""
    # GELU'(x) = (1 + t)/2 + x/2 (1 - t^2) c (1 + 3a x^2)
    #          = (1 + t)/2 * (1 + q (1 - t))        with q = c x (1 + 3a x^2), 1 - t^2 = (1 + t)(1 - t)
    #          = (1 - s/2) * (1 + q s)              with s = 1 - t
    np.multiply(x, x, out=dx)
    dx *= 3.0 * GELU_A
    dx += 1.0
    dx *= x
    dx *= GELU_C                         # q = c x (1 + 3a x^2)
    s = tanh_u
    np.subtract(1.0, tanh_u, out=s)      # s = 1 - t
    dx *= s
    dx += 1.0                            # 1 + q s
    s *= -0.5
    s += 1.0                             # 1 - s/2 = (1 + t)/2
    dx *= s
    dx *= dy                             # dx = dy * GELU'(x)


def take(array, index, out, axis=None):
    """out = array.take(index, axis), with no temporary: NumPy's take buffers `out` (a temporary of
    its size) unless mode='clip', which only matters for indices out of range (the callers' never are)."""
    np.take(array, index, axis=axis, out=out, mode="clip")


class LossScratch:
    """softmax_cross_entropy's work buffers for up to B rows of C classes, allocated once, so that
    the loss allocates nothing per micro-batch (on NumPy and CuPy alike). alloc(kind, name, shape,
    dtype) is the memory ledger's; device (zerompi/devices/) is where alloc puts them, whose array
    module (`xp`) and `take` the loss computes with (None: NumPy's)."""

    def __init__(self, rows, classes, dtype, alloc, device=None):
        self.xp, self.take = (np, take) if device is None else (device.xp, device.take)
        self.row_max = alloc("activations", "loss.row_max", (rows,), dtype)      # max z, then sum exp(z - max z)
        self.picked = alloc("activations", "loss.picked", (rows,), dtype)        # z_label - max z, then p_label
        self.row_loss = alloc("activations", "loss.row_loss", (rows,), dtype)    # -log softmax(z)[label]
        self.predicted = alloc("activations", "loss.predicted", (rows,), np.int64)   # argmax z
        self.hits = alloc("activations", "loss.hits", (rows,), np.bool_)         # predicted == label
        self.label_index = alloc("activations", "loss.label_index", (rows,), np.int64)   # row C + label
        self.row_start = alloc("activations", "loss.row_start", (rows,), np.int64)       # row C
        self.row_start[...] = self.xp.arange(rows) * classes
        self.totals = alloc("activations", "loss.totals", (2,), np.float64)      # (loss part, correct)


def softmax_cross_entropy(logits, labels, global_batch, dlogits, loss_scale=1.0, scratch=None):
    """Loss summed over the local rows and divided by the global batch size.

    logits (B, C), labels (B,) int -> returns totals (2,) float64 = (loss_part, correct); writes
    dlogits (B, C, C-contiguous) = loss_scale (softmax(logits) - onehot(labels)) / global_batch.
    dlogits may alias logits. Labels must lie in [0, C) (the data loader checks them once).
    loss_part summed over ranks is the mean loss of the global batch; correct counts argmax hits.
    totals lives where the arrays do (on a GPU: reading it would wait), in scratch (a LossScratch;
    None: fresh NumPy buffers for this one call).
    """
    n, classes = logits.shape
    if not dlogits.flags.c_contiguous:          # `flat` below must be a view of it, not a copy
        raise ValueError("softmax_cross_entropy: dlogits must be C-contiguous")
    if scratch is None:                         # a call on its own (tests, tests/proofs/reference.py)
        if labels.size and not 0 <= int(labels.min()) <= int(labels.max()) < classes:
            raise IndexError(f"softmax_cross_entropy: labels must lie in [0, {classes})")
        scratch = LossScratch(n, classes, logits.dtype, lambda kind, name, shape, dtype: np.zeros(shape, dtype))
    xp, take = scratch.xp, scratch.take         # numpy (cupy on a GPU) and its take without temporaries
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
