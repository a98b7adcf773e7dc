"""Precision: what each buffer is stored in, what the arithmetic runs in, what MPI adds up in.

    --dtype    params, grads   compute (elementwise, Adam state                 P  G  K (bytes/param)
               (stored)        CPU matmuls)          (master copy, m, v)
    float64    float64         float64               m, v: float64              8  8  16
    float32    float32         float32               m, v: float32              4  4   8
    bf16       bfloat16        float32               master, m, v: float32      2  2  12
    fp16       float16         float32               master, m, v: float32      2  2  12

In full precision the parameters are their own master copy. In mixed precision (the memory model
of the ZeRO paper) Adam keeps an fp32 master copy of the parameters it updates and writes the
16-bit parameters back from it after every step.

NumPy has no fast 16-bit matrix multiply on CPUs (float16 matmul runs a slow generic loop and
bfloat16 comes from the ml_dtypes package with no BLAS at all), so on a CPU each layer widens its
16-bit weight to float32 in a one-layer work buffer and computes in float32; its gradient is
computed in float32 and rounded to 16 bits when it is stored. The stored state stays 16-bit; the
cost is one extra pass over each layer's weights in forward and in backward (see docs/mixed-precision.md for the
measured cost). On a GPU the matrix multiplies read the 16-bit weights and 16-bit activations
directly, on tensor cores, accumulating in float32 (zerompi/devices/gemm.py, zerompi/model.py); the
elementwise work (GELU, the loss, Adam) stays float32 there too.

Reduction (`reduce_dtype`): MPI has no bfloat16 type, and adding 16-bit numbers in 16 bits loses
a bit at every one of the N-1 additions. zerompi widens each 16-bit gradient buffer to float32 in
a one-layer staging buffer, reduces in float32, and rounds the sum to 16 bits once. Its error is
one 16-bit rounding plus float32's accumulation error (2^-24 relative per addition, far below a
16-bit ulp for any practical N), instead of a 16-bit rounding at each of the N-1 additions.
The price: twice the wire bytes of a 16-bit reduction; the element counts are the formula's.
All-gathers move parameters unchanged, as 16-bit words.
"""
from dataclasses import dataclass

import ml_dtypes
import numpy as np

from .memory import BytesPerParam

BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPE_NAMES = {"float64": "float64", "fp64": "float64", "float32": "float32", "fp32": "float32",
               "bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16"}


@dataclass(frozen=True)
class Precision:
    storage: np.dtype     # parameters and gradients
    compute: np.dtype     # elementwise math, Adam state, reductions; matmuls on a CPU (a GPU's read storage)

    @property
    def mixed(self):
        """True when Adam keeps an fp32 master copy of 16-bit parameters."""
        return self.storage != self.compute

    @property
    def name(self):
        return self.storage.name

    def bytes_per_param(self):
        """P, G, K of the memory formulas."""
        state_arrays = 3 if self.mixed else 2           # (master,) m, v
        return BytesPerParam(self.storage.itemsize, self.storage.itemsize,
                             state_arrays * self.compute.itemsize)


def precision_for(name):
    """The Precision for a --dtype name (see DTYPE_NAMES); KeyError if unknown."""
    canonical = DTYPE_NAMES[name]
    if canonical == "bfloat16":
        return Precision(BF16, np.dtype(np.float32))
    storage = np.dtype(canonical)
    compute = np.dtype(np.float32) if storage.itemsize == 2 else storage
    return Precision(storage, compute)


def is_16bit(array):
    return array.dtype.itemsize == 2
