"""fp16 dynamic loss scaling (the scheme of Micikevicius et al. 2018 and torch's GradScaler).

float16 stops at 65504 and flushes magnitudes below ~6e-8 to zero; many gradients are far
smaller than 1. So the loss (and with it every gradient) is multiplied by a scale S before
backward, and Adam divides S back out (zerompi/adam.py's grad_multiplier).

    a step whose gradient has an inf or NaN on ANY rank:  skip it (no update, Adam's t unchanged),
                                                          S = S / 2
    `growth_interval` good steps in a row:                S = S * 2
    S below `min_scale`:                                  the run stops with an error

All ranks decide from the same all-reduced gradient norm (zerompi/step.py), so they agree
without any further communication. bf16 has float32's exponent range and needs none of this:
its scale stays 1, as in float32 and float64.

A scale must be a float16 number above 0 (at least its smallest, 2^-24 ~ 6e-8): one that rounds
to 0 there leaves nothing to unscale (1 / S overflows, and Adam writes NaN). loss_scale_error
refuses such a --loss-scale or --min-loss-scale, and a floor above the initial scale.
"""
import numpy as np


class LossScaler:
    def __init__(self, enabled, initial_scale=2.0 ** 16, growth_interval=200, min_scale=1.0):
        self.enabled = enabled
        self.scale = initial_scale if enabled else 1.0
        self.growth_interval = growth_interval
        self.min_scale = min_scale
        self.good_steps = 0

    def update(self, applied):
        """After each step: returns a line describing a change of scale, or None."""
        if not self.enabled:
            return None
        if not applied:
            self.good_steps = 0
            self.scale /= 2.0
            return f"gradient overflow: step skipped, loss scale lowered to {self.scale:g}"
        self.good_steps += 1
        if self.good_steps == self.growth_interval:
            self.good_steps = 0
            self.scale *= 2.0
            return f"{self.growth_interval} good steps: loss scale raised to {self.scale:g}"
        return None

    @property
    def collapsed(self):
        return self.enabled and self.scale < self.min_scale


def loss_scale_error(enabled, initial_scale, min_scale):
    """One line if fp16's dynamic loss scale cannot work from these flags, else None (and None
    when it is not enabled: outside fp16 the scale is 1)."""
    if not enabled:
        return None
    for flag, value in (("--loss-scale", initial_scale), ("--min-loss-scale", min_scale)):
        if np.float16(min(value, 1.0)) == 0:           # min: a large scale is no concern here
            return (f"{flag} {value:g} rounds to 0 in float16, whose smallest positive number is "
                    f"{float(np.finfo(np.float16).smallest_subnormal):.3g}: pass a larger one")
    if min_scale > initial_scale:
        return (f"--min-loss-scale {min_scale:g} is above --loss-scale {initial_scale:g}: the run would stop "
                f"at its first overflow")
    return None
