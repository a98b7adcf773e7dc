"""AdamW in one compiled loop on the CPU: --fused-adam (Numba: pip install -e '.[fast]').

zerompi/adam.py's adamw_chunked is the update a reader reads: 11-12 NumPy passes over each chunk
of 65,536 elements, each pass a read and a write through cache. Memory bandwidth bounds it from
below by 7 passes over the whole state, the compulsory traffic: read p, g, m, v; write p, m, v.
FusedAdamKernel runs the same arithmetic element by element in one loop (`adamw_loop`, plain
Python below) that Numba compiles, so each element is read once and written once, near that floor.

Bit for bit adamw_chunked's, in float32 and float64: each line of the loop is the same IEEE
operation, in the same order, in the same dtype as a NumPy pass of adamw_chunked:

    adamw_chunked (per chunk, s its scratch)      the loop (per element)
    g *= mult                                     g' = g * mult
    p *= decay                                    p' = p * decay
    m *= b1;  s = g * (1 - b1);  m += s           m' = m * b1 + g' * (1 - b1)
    v *= b2;  s = g * g;  s *= 1 - b2;  v += s    v' = v * b2 + (g' * g') * (1 - b2)
    s = sqrt(v) + eps';  s = m / s                p  = p' - (m' / (sqrt(v') + eps')) * step'
    s *= step';  p -= s

with every constant rounded to the arrays' dtype first, as NumPy rounds a Python float beside a
float32 array. (A multiplier or decay of 1, whose pass adamw_chunked skips, is exact.) The
gradient is read, not written: adamw_chunked scales a full-precision one in place, and nothing
reads it after the update either way. No fast
math: Numba reassociates nothing and fuses no multiply-add unless told to. Its error model is
NumPy's: a division by zero gives IEEE's inf instead of raising, and the loop has no branch per
element, so LLVM vectorizes it.

16-bit parameters: NumPy widens each chunk of the gradient into one chunk of scratch (the
compute dtype), the loop updates the fp32 master chunk, and NumPy rounds it into the parameters,
exactly adamw_chunked's first and last passes. Full precision needs no scratch at all.

The loop compiles on its first call for each dtype (about a second, once per process) and
releases the interpreter lock (`nogil`), so in-process ranks (zerompi/inprocess/) update at once.
"""
import threading

import numpy as np

from ..cpu import AdamWork


class FusedAdamKernel:
    """The AdamW update of AdamConfig(kernel=FusedAdamKernel()): adamw_work and adamw as a CPU
    device has them (zerompi/cpu.py). Numba is imported at the first update (a plan needs none)."""

    def adamw_work(self, chunk, precision, alloc):
        """One chunk (chunk elements, compute dtype) to widen a 16-bit gradient into; none in full precision."""
        return AdamWork(None, alloc("work", "adam.grad_scratch", (chunk,), precision.compute) if precision.mixed else None)

    def adamw(self, param, grad, master, m, v, grad_multiplier, decay, step_size, sqrt_bias2, c, work):
        """One AdamW step in place over param, grad, master, m, v (n,) (zerompi/adam.py's arguments)."""
        loop = compiled_loop()
        t = master.dtype.type
        constants = (t(grad_multiplier), t(decay), t(c.beta1), t(1.0 - c.beta1), t(c.beta2), t(1.0 - c.beta2),
                     t(c.eps * sqrt_bias2), t(step_size * sqrt_bias2))
        if work.grad_scratch is None:            # full precision: master is param
            loop(master, grad, m, v, *constants)
            return
        chunk = work.grad_scratch.size
        for lo in range(0, param.size, chunk):
            hi = min(lo + chunk, param.size)
            g = work.grad_scratch[:hi - lo]
            g[...] = grad[lo:hi]                 # widen the 16-bit gradient
            loop(master[lo:hi], g, m[lo:hi], v[lo:hi], *constants)
            param[lo:hi] = master[lo:hi]         # round the fp32 master into the 16-bit parameters


_COMPILING, _COMPILED = threading.Lock(), []


def compiled_loop():
    """adamw_loop compiled by Numba, once per process (each dtype at its first call; in-process
    ranks asking at once wait for the first). Only a run that updates with it imports Numba."""
    with _COMPILING:
        if not _COMPILED:
            import numba
            _COMPILED.append(numba.njit(nogil=True, error_model="numpy")(adamw_loop))
        return _COMPILED[0]


def adamw_loop(p, g, m, v, multiplier, decay, beta1, one_minus_beta1, beta2, one_minus_beta2, eps_scaled,
               step_scaled):
    """In place over p, g, m, v (n,) of one dtype, the constants in that dtype (see the table above)."""
    for i in range(p.size):
        gi = g[i] * multiplier
        pi = p[i] * decay
        mi = m[i] * beta1 + gi * one_minus_beta1
        vi = v[i] * beta2 + (gi * gi) * one_minus_beta2
        m[i] = mi
        v[i] = vi
        p[i] = pi - (mi / (np.sqrt(vi) + eps_scaled)) * step_scaled
