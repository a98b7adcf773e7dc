"""A diverged run stops: one error line naming where the first non-finite number was, the last
good weights saved where --save-weights is set, and every rank exits DIVERGED (zerompi/util/exit_codes.py).

A step whose loss or gradient is not finite is not applied (zerompi/step.py). Outside fp16 the run
stops at once; so it does in fp16 when the loss itself is not finite (the forward pass overflowed,
before the loss is scaled: no loss scale helps). In fp16 a gradient that overflows lowers the loss
scale instead (zerompi/train/loop/loss_scale.py), and the run stops when the scale falls below
--min-loss-scale, or when its last 10 steps (all, if fewer) were all skipped (Stalls, below).

Nothing learnt: a run whose last STALLED_AT_THE_END steps (all, if fewer) changed no weight,
every one skipped (fp16: the gradient overflowed at every loss scale tried) or every one of a
gradient that is exactly 0 (fp16: a loss scale so small that the gradients round to 0), ends
DIVERGED with one line: it is no success.

Non-finite parameters: an update can take them past the storage dtype's range (float16 ends at
65504; an --lr of 1e300 overflows any dtype). The next step's loss and gradient are then not
finite (in fp16: "skipped"), so a step not applied is the moment to look: first_non_finite_layer
checks the parameters (each rank what it owns, one small all-reduce per layer) only then, before
each checkpoint and after the last step, never on the hot path of a good step. Non-finite
parameters are divergence in every dtype, and no weights are saved: there are no good ones left.
"""
import math

import numpy as np

from ...checkpoint.weights import save_weights
from ...util.exit_codes import ExitCode


def not_finite_message(step, result, comm, loss_scaled=False):
    """Collective: what was not finite at this step, where first: the layer (the first one whose
    gradient is not finite, the same verdict on every rank) and the lowest rank whose own part of
    the loss is not finite; and what to try. loss_scaled: fp16, whose loss scale cannot help a loss
    that is not finite (the forward pass overflowed before the loss is scaled)."""
    if result.bad_layer >= 0:
        grad = f"the gradient is not finite, first in layer {result.bad_layer} (layers.{result.bad_layer}.*)"
    elif not math.isfinite(result.grad_norm):
        grad = f"the gradient norm overflows ({result.grad_norm:g})"
    else:
        grad = f"the gradient is finite (norm {result.grad_norm:.3g})"
    rank = comm.first_failing_rank(None if result.local_loss_finite else "loss")
    loss = (f"the loss is {result.loss:g}" if rank is None else
            f"the loss is not finite ({result.loss:g}), first on rank {rank}")
    if loss_scaled and rank is not None:     # fp16: not a gradient overflow, which a smaller scale would help
        advice = ("before any update, so the data or the initial weights are too large for the compute dtype: "
                  "check their scale" if step == 1 else "lower --lr or train in bf16")
        return f"step {step}: {loss}, before any loss scaling, which cannot help: {advice}"
    if step == 1:                    # no update yet: the learning rate played no part
        return (f"step 1: {grad}; {loss}: before any update, so the data or the initial weights are too "
                f"large for the compute dtype: check their scale")
    return f"step {step}: {grad}; {loss}: lower --lr or try --clip-norm"


STALLED_AT_THE_END = 10


class Stalls:
    """Steps in a row, up to the latest, that changed no weight: skipped, or of a zero gradient."""

    def __init__(self):
        self.skipped = self.zero = 0

    def add(self, result):
        self.skipped = 0 if result.applied else self.skipped + 1
        self.zero = self.zero + 1 if result.applied and result.grad_norm == 0 else 0

    def message(self, steps, steps_run, loss_scale):
        """One line if the last STALLED_AT_THE_END of the steps_run steps (all, if fewer) changed nothing."""
        last = min(STALLED_AT_THE_END, steps_run)
        if not last or max(self.skipped, self.zero) < last:
            return None
        were = "the last step was" if last == 1 else f"the last {last} steps were all"
        since = steps - max(self.skipped, self.zero)
        if self.skipped >= last:
            return (f"{were} skipped for a gradient overflow (the loss scale is {loss_scale:g} now): the weights "
                    f"have not changed since step {since}; lower --lr, or train in bf16")
        return (f"{were} of a gradient that is 0: the weights have not learnt since step {since} (in fp16, a "
                f"--loss-scale so small that the gradients round to 0; else a model whose outputs do not depend "
                f"on its weights)")


def first_non_finite_layer(engine):
    """Collective: the index of the first layer with a parameter that is not finite on any rank,
    or None. Each rank checks what it owns (together: every element); one all-reduce per layer."""
    stage, xp = engine.stage, engine.mlp.device.xp
    stage.finish_communication()
    for layer in engine.layout.layers:
        values = stage.owned(layer).param[:]     # a host array where the parameters are offloaded
        finite = bool((np if isinstance(values, np.ndarray) else xp).isfinite(values).all())
        if engine.comm.any_failed(None if finite else "not finite"):
            return layer.index
    return None


def stop_if_parameters_not_finite(engine, cfg, step, status=None):
    """Collective: stop the run (DIVERGED, nothing saved) if the parameters are not finite."""
    layer = first_non_finite_layer(engine)
    if layer is not None:
        note = " (float16 ends at 65504)" if engine.stage.precision.name == "float16" else ""
        stop(engine, cfg, f"step {step}: the parameters are not finite, first in layer {layer} (layers.{layer}.*), "
                          f"after an update{note}: lower --lr", status, weights_finite=False)


def stop(engine, cfg, message, status=None, weights_finite=True):
    """Collective, every rank with the same message: save the last good weights (the failed step
    changed nothing) where a save path is set, print the error once, exit with ExitCode.DIVERGED.
    weights_finite False: the weights are not finite, so none are saved. The live progress line
    (rank 0, status) is erased first, so that the error is not drawn over it."""
    if status is not None:
        status.close()
    if cfg.save_weights and not weights_finite:
        message += f"; --save-weights {cfg.save_weights} not saved: the weights are not finite"
    elif cfg.save_weights:
        saved = save_weights(engine, cfg.save_weights)
        message += "; " + (saved or f"the last good weights are in {cfg.save_weights}")
    engine.comm.check_all(message, exit_code=ExitCode.DIVERGED)
