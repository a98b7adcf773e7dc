"""A diverged run stops: one error line naming where the first non-finite number was, the last
good weights saved where --save-weights is set, and every rank exits DIVERGED (zerompi/exit_codes.py).

Outside fp16 a step whose loss or gradient is not finite is not applied (zerompi/step.py), and the
run stops at once; in fp16 such a step lowers the loss scale instead (zerompi/train/loss_scale.py),
and the run stops when the scale falls below --min-loss-scale.
"""
import math

from ..checkpoint.weights import save_weights
from ..exit_codes import ExitCode


def not_finite_message(step, result, comm):
    """Collective: what was not finite at this step, where first: the layer (the first one whose
    gradient is not finite, the same verdict on every rank) and the lowest rank whose own part of
    the loss is not finite."""
    if result.bad_layer >= 0:
        grad = f"the gradient is not finite, first in layer {result.bad_layer} (layers.{result.bad_layer}.*)"
    elif not math.isfinite(result.grad_norm):
        grad = f"the gradient norm overflows ({result.grad_norm:g})"
    else:
        grad = f"the gradient is finite (norm {result.grad_norm:.3g})"
    rank = comm.first_failing_rank(None if result.local_loss_finite else "loss")
    loss = (f"the loss is {result.loss:g}" if rank is None else
            f"the loss is not finite ({result.loss:g}), first on rank {rank}")
    return f"step {step}: {grad}; {loss}: lower --lr or try --clip-norm"


def stop(engine, cfg, message, status=None):
    """Collective, every rank with the same message: save the last good weights (the failed step
    changed nothing) where a save path is set, print the error once, exit with ExitCode.DIVERGED.
    The live progress line (rank 0, status) is erased first, so that the error is not drawn over it."""
    if status is not None:
        status.close()
    if cfg.save_weights:
        saved = save_weights(engine, cfg.save_weights)
        message += "; " + (saved or f"the last good weights are in {cfg.save_weights}")
    engine.comm.check_all(message, exit_code=ExitCode.DIVERGED)
