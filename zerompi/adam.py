"""AdamW on flat buffers: the optimizer state that ZeRO shards.

For step t = 1, 2, ... and every element (Loshchilov & Hutter's decoupled weight decay, with the
bias correction of Kingma & Ba, exactly as torch.optim.AdamW computes it):

    g  = grad * grad_multiplier                  unscale (1 / loss scale) and clip, in one product
    p  = p * (1 - lr * wd)                       decoupled weight decay
    m  = beta1 * m + (1 - beta1) * g             first moment
    v  = beta2 * v + (1 - beta2) * g^2           second moment
    p  = p - (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)

p is the master copy: in mixed precision an fp32 `master` array that this class owns, whose new
values are then rounded into the 16-bit parameters; in full precision the parameters themselves.

Every element is independent of every other, which is the whole reason ZeRO can shard it: a rank
that holds master, m and v for its owned range only, and the reduced gradient for that range,
computes exactly the update that single-process Adam computes for those elements.

The update runs in place over chunks of CHUNK elements with preallocated scratch of that size,
so it allocates nothing per step and keeps each chunk in cache across its passes (a chunk's p, g,
m, v and scratch: 5 x 256 KiB in float32, inside a 2 MiB L2). A full-precision gradient is
unscaled or clipped in place (it is not needed afterwards); a 16-bit one is widened into a second
chunk-sized scratch. The last line is computed in the equivalent form

    p = p - (lr sqrt(1 - beta2^t) / (1 - beta1^t)) * m / (sqrt(v) + eps sqrt(1 - beta2^t))

(the denominator multiplied through by sqrt(1 - beta2^t)), one pass fewer per chunk; the decay
pass is skipped when weight decay is 0. What is left is 11-12 NumPy passes per chunk, through cache.
That is `adamw_chunked` below, which the CPU device runs (zerompi/cpu.py). `AdamW.update`
hands the arrays to its device (`device.adamw`): on a GPU the whole update is one fused kernel
(zerompi/devices/gpu.py, kernels.py: one read of g, p, m, v, one write of p, m, v, no scratch); on
a CPU, --fused-adam's AdamConfig.kernel (zerompi/fused/) is one loop, bit for bit adamw_chunked.
"""
import math
from dataclasses import dataclass

import numpy as np

CHUNK = 65536


@dataclass(frozen=True)
class AdamConfig:
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0
    kernel: object = None        # what runs the update: None, the device; zerompi/fused/'s compiled loop

    def optimizer(self, numel, precision, ledger):
        """The AdamW state for numel elements, in the ledger's device memory (zerompi/offload/
        builds the same optimizer with its state in host memory or a file)."""
        return AdamW(numel, precision, self, ledger)


class AdamW:
    """State for `numel` elements: a rank's owned shards, or everything in stage 0."""

    def __init__(self, numel, precision, config, ledger):
        self.config = config
        self.kernel = config.kernel or ledger.device     # what runs the update: the device the state is on
        dtype = precision.compute
        self.master = ledger.alloc("optimizer", "adam.master", (numel,), dtype) if precision.mixed else None
        self.m = ledger.alloc("optimizer", "adam.m", (numel,), dtype)
        self.v = ledger.alloc("optimizer", "adam.v", (numel,), dtype)
        # the device's work buffers for the update: on the CPU adamw_chunked's chunk scratch (and a
        # second chunk for widening 16-bit gradients), ledgered as work; a GPU's fused kernel needs none
        self.work = self.kernel.adamw_work(min(numel, CHUNK), precision, ledger.alloc)
        self.t = 0

    def begin_step(self):
        """Advance t once per optimizer step, before the `update` calls of that step."""
        self.t += 1

    def update(self, param, grad, state_slice, lr, grad_multiplier=1.0):
        """In place: param, grad (n,) are the elements whose state is [state_slice] of master, m, v."""
        decay, step_size, sqrt_bias2 = self.constants(lr)
        master = param if self.master is None else self.master[state_slice]
        m, v = self.m[state_slice], self.v[state_slice]
        self.kernel.adamw(param, grad, master, m, v, grad_multiplier, decay, step_size, sqrt_bias2, self.config, self.work)

    def constants(self, lr):
        """(decay = 1 - lr wd, step_size = lr / (1 - beta1^t), sqrt_bias2 = sqrt(1 - beta2^t)) of step t."""
        c = self.config
        return 1.0 - lr * c.weight_decay, lr / (1.0 - c.beta1 ** self.t), math.sqrt(1.0 - c.beta2 ** self.t)


def adamw_chunked(param, grad, master, m, v, grad_multiplier, decay, step_size, sqrt_bias2, c, scratch,
                  grad_scratch):
    """The update in NumPy, in place, CHUNK elements at a time: param, grad, master, m, v (n,), master
    being param itself in full precision; decay = 1 - lr wd, step_size = lr / (1 - beta1^t),
    sqrt_bias2 = sqrt(1 - beta2^t), c the AdamConfig. scratch (CHUNK,) in the compute dtype, and
    grad_scratch (CHUNK,) too for a 16-bit gradient (else None)."""
    eps_scaled, step_scaled = c.eps * sqrt_bias2, step_size * sqrt_bias2
    for lo in range(0, param.size, CHUNK):
        hi = min(lo + CHUNK, param.size)
        p, g, m_c, v_c = master[lo:hi], grad[lo:hi], m[lo:hi], v[lo:hi]
        s = scratch[:hi - lo]
        if grad_scratch is not None:            # 16-bit gradient: widen, then unscale / clip
            g = np.multiply(g, grad_multiplier, out=grad_scratch[:hi - lo], dtype=p.dtype)
        elif grad_multiplier != 1.0:
            g *= grad_multiplier                # in place: the gradient is not needed after this
        if decay != 1.0:
            p *= decay                      # p = p (1 - lr wd)
        m_c *= c.beta1
        np.multiply(g, 1.0 - c.beta1, out=s)
        m_c += s                            # m = b1 m + (1 - b1) g
        v_c *= c.beta2
        np.multiply(g, g, out=s)
        s *= 1.0 - c.beta2
        v_c += s                            # v = b2 v + (1 - b2) g^2
        np.sqrt(v_c, out=s)
        s += eps_scaled                     # denom = sqrt(v) + eps sqrt(1 - b2^t)
        np.divide(m_c, s, out=s)
        s *= step_scaled
        p -= s                              # p = p - lr sqrt(1 - b2^t) / (1 - b1^t) * m / denom
        if master is not param:
            param[lo:hi] = p                # round the fp32 master into the 16-bit parameters
