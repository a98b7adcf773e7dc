"""One training step, written out plainly: the whole algorithm on one screen.

    for each micro-batch (K of them, --grad-accum):
        for layer in layers:            zero.before_forward  -> forward  -> zero.after_forward
        loss, d_logits = softmax cross-entropy (divided by the GLOBAL batch, times the loss scale)
        for layer in reversed(layers):  zero.before_backward -> backward -> zero.after_backward
    zero.reduce_grads()                                   wait for the reductions backward started
    one all-reduce of (each layer's sum of squares of its owned gradient, loss, correct):
        grad_norm = sqrt(sum over layers and ranks) / loss scale   every element counted once, on its owner
    if grad_norm or loss is not finite: skip the step     every rank sees the same sums: all agree,
        and the first layer whose sum is not finite names the layer (StepResult.bad_layer)
    clip = min(1, max_norm / grad_norm)
    zero.update(lr, clip / loss_scale); zero.gather_params()

Each rank runs this on its own rows of each micro-batch; the stage object (zerompi/stages/)
decides where parameters and gradients live and which collectives run inside the hooks. With one
rank every stage's collectives are copies, and the step is plain single-process AdamW.
"""
import math
from dataclasses import dataclass

import numpy as np

from .devices.device import to_numpy
from .layers import softmax_cross_entropy


@dataclass
class StepResult:
    loss: float          # mean loss over the global batch (all micro-batches, all ranks)
    correct: int         # correct predictions over the global batch
    grad_norm: float     # global L2 norm of the unscaled gradient, before clipping
    applied: bool        # False: the gradient or the loss was not finite, nothing was updated
    bad_layer: int = -1  # not applied: the first layer whose gradient is not finite (-1: none is)
    local_loss_finite: bool = True   # this rank's part of the loss (for naming the rank, train.py)


def forward(zero, mlp, x):
    """x (n, sizes[0]) -> logits (n, sizes[-1]), a view into mlp's buffers."""
    h = mlp.load_input(x)
    tracer = zero.comm.tracer                      # None unless --trace (zerompi/observe/trace.py)
    for layer in mlp.layers:
        weight, bias = zero.before_forward(layer)
        start = tracer and tracer.now()
        h = mlp.forward_layer(layer, h, weight, bias)
        if tracer:
            tracer.span(f"forward {layer.index}", "compute", start, layer=layer.index)
        zero.after_forward(layer)
    return h


def forward_backward(zero, mlp, x, labels, global_batch, loss_scale):
    """One micro-batch on this rank's rows x (n, sizes[0]), labels (n,): gradients into the stage's
    buffers. Returns (2,) float64 (this rank's part of the mean loss, its correct predictions),
    in the MLP's loss scratch (overwritten by the next micro-batch)."""
    tracer = zero.comm.tracer
    logits = forward(zero, mlp, x)
    start = tracer and tracer.now()
    totals = softmax_cross_entropy(logits, labels, global_batch, logits, loss_scale, mlp.loss_scratch)
    if tracer:
        tracer.span("loss", "compute", start)
    d_h = logits                                   # now d_logits, in place
    for layer in reversed(mlp.layers):
        weight, bias, dweight, dbias, accumulate = zero.before_backward(layer)
        start = tracer and tracer.now()
        d_h = mlp.backward_layer(layer, d_h, weight, bias, dweight, dbias, accumulate)
        if tracer:
            tracer.span(f"backward {layer.index}", "compute", start, layer=layer.index)
        zero.after_backward(layer)
    return totals


def train_step(zero, mlp, micro_batches, global_batch, lr, loss_scale=1.0, max_grad_norm=0.0):
    """One optimizer step over micro_batches [(x, labels), ...] (this rank's rows of each)."""
    step_totals = mlp.step_totals       # (2,) this rank's (loss part, correct), where the arrays live:
    step_totals[...] = 0                # on a GPU nothing waits for them
    with np.errstate(over="ignore", invalid="ignore"):   # an inf/NaN is detected below, not warned about
        micro_batches = list(micro_batches)
        for k, (x, labels) in enumerate(micro_batches):
            zero.start_micro_batch(first=k == 0, last=k == len(micro_batches) - 1)
            step_totals += forward_backward(zero, mlp, x, labels, global_batch, loss_scale)
        zero.reduce_grads()
        # (layers + 2,): each layer's owned sum of squares, then this rank's loss and correct count
        sums = zero.step_sums                            # preallocated, float64, where the arrays live
        for u, grad in enumerate(zero.grad_partition()):
            mlp.device.sum_of_squares(grad, sums[u:u + 1], mlp.work)   # sum of grad^2, in sums[u]
        sums[-2:] = step_totals
    zero.comm.allreduce_sum(sums, "metrics")
    host_sums = to_numpy(sums)                           # the step's one read from a GPU
    layer_squares = host_sums[:-2]
    grad_norm = math.sqrt(layer_squares.sum()) / loss_scale
    result = StepResult(float(host_sums[-2]), int(host_sums[-1]), grad_norm, applied=False)
    if not (math.isfinite(grad_norm) and math.isfinite(result.loss)):
        bad = np.flatnonzero(~np.isfinite(layer_squares))
        result.bad_layer = int(bad[0]) if bad.size else -1
        result.local_loss_finite = math.isfinite(float(to_numpy(step_totals)[0]))
        return result                              # skipped on every rank alike
    clip = min(1.0, max_grad_norm / (grad_norm + 1e-6)) if max_grad_norm > 0 else 1.0
    zero.update(lr, grad_multiplier=clip / loss_scale)
    zero.gather_params()
    result.applied = True
    return result


def count_correct(zero, mlp, x, labels, batch_rows, num_chunks):
    """Correct predictions on this rank's rows, forward only, in num_chunks chunks of at most
    batch_rows rows. num_chunks must be the same on every rank: in stage 3 each forward is
    collective, so a rank with fewer rows runs empty chunks."""
    correct = 0
    for c in range(num_chunks):
        rows = slice(c * batch_rows, (c + 1) * batch_rows)
        logits = forward(zero, mlp, x[rows])
        xp = mlp.device.xp
        correct += int(xp.count_nonzero(xp.argmax(logits, axis=1) == labels[rows]))
    return correct
