"""One training step, written out plainly: the whole algorithm on one screen.

    for each micro-batch (M of them, --grad-accum M):
        for layer in layers:            stage.before_forward  -> forward  -> stage.after_forward
        loss, d_logits = softmax cross-entropy (divided by the GLOBAL batch, times the loss scale)
        for layer in reversed(layers):  stage.before_backward -> backward -> stage.after_backward
    stage.reduce_grads()                                  wait for the reductions backward started
    one all-reduce of (each layer's sum of squares of its owned gradient, loss, correct):
        grad_norm = sqrt(sum over layers and ranks) / loss scale   every element counted once, on its owner
    if grad_norm or loss is not finite: skip the step     every rank sees the same sums: all agree,
        and the first layer whose sum is not finite names the layer (StepResult.bad_layer)
    clip = min(1, max_norm / grad_norm)
    stage.update(lr, clip / loss_scale); stage.gather_params()

Each rank runs this on its own rows of each micro-batch; the stage (zerompi/stages/) decides where
parameters and gradients live and which collectives run inside the hooks. With one rank every
stage's collectives are copies, and the step is plain single-process AdamW.
"""
import math
from dataclasses import dataclass

import numpy as np

from .device import to_numpy
from .ledger import METRICS


@dataclass
class StepResult:
    loss: float          # mean loss over the global batch (all micro-batches, all ranks)
    correct: int         # correct predictions over the global batch
    grad_norm: float     # global L2 norm of the unscaled gradient, before clipping
    applied: bool        # False: the gradient or the loss was not finite, nothing was updated
    bad_layer: int = -1  # not applied: the first layer whose gradient is not finite (-1: none is)
    local_loss_finite: bool = True   # this rank's part of the loss (for naming the rank, zerompi/train/loop/run.py)


def forward(engine, x):
    """x (n, sizes[0]) -> logits (n, sizes[-1]), a view into the MLP's buffers."""
    stage, mlp = engine.stage, engine.mlp
    h = mlp.load_input(x)
    for layer in mlp.layers:
        weight, bias = stage.before_forward(layer)
        h = mlp.forward_layer(layer, h, weight, bias)
        stage.after_forward(layer)
    return h


def forward_backward(engine, x, labels, global_batch, loss_scale):
    """One micro-batch on this rank's rows x (n, sizes[0]), labels (n,): gradients into the stage's
    buffers. Returns (2,) float64 (this rank's part of the mean loss, its correct predictions),
    in the MLP's loss scratch (overwritten by the next micro-batch)."""
    stage, mlp = engine.stage, engine.mlp
    logits = forward(engine, x)
    totals = mlp.loss(logits, labels, global_batch, loss_scale)   # d_logits written over the logits
    d_h = logits
    for layer in reversed(mlp.layers):
        b = stage.before_backward(layer)
        d_h = mlp.backward_layer(layer, d_h, b.weight, b.bias, b.dweight, b.dbias, b.accumulate)
        stage.after_backward(layer)
    return totals


def train_step(engine, micro_batches, global_batch, lr, loss_scale=1.0, max_grad_norm=0.0):
    """One optimizer step over micro_batches [(x, labels), ...] (this rank's rows of each)."""
    stage, mlp = engine.stage, engine.mlp
    step_totals = mlp.step_totals       # (2,) this rank's (loss part, correct), where the arrays live:
    step_totals[...] = 0                # on a GPU nothing waits for them
    with np.errstate(over="ignore", invalid="ignore"):   # an inf/NaN is detected below, not warned about
        micro_batches = list(micro_batches)
        for k, (x, labels) in enumerate(micro_batches):
            stage.start_micro_batch(first=k == 0, last=k == len(micro_batches) - 1)
            step_totals += forward_backward(engine, x, labels, global_batch, loss_scale)
        stage.reduce_grads()
        # (layers + 2,): each layer's owned sum of squares, then this rank's loss and correct count
        sums = engine.step_sums                          # preallocated, float64, where the arrays live
        for u, grad in enumerate(stage.grad_partition()):
            mlp.device.sum_of_squares(grad, sums[u:u + 1], mlp.work)   # sum of grad^2, in sums[u]
        sums[-2:] = step_totals
    engine.comm.allreduce_sum(sums, METRICS)
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
    stage.update(lr, grad_multiplier=clip / loss_scale)
    stage.gather_params()
    result.applied = True
    return result


def count_correct(engine, x, labels, batch_rows, num_chunks):
    """(correct predictions, rows whose logits are not finite) on this rank's rows, forward only,
    in num_chunks chunks of at most batch_rows rows. num_chunks must be the same on every rank: in
    stage 3 each forward is collective, so a rank with fewer rows runs empty chunks."""
    correct = not_finite = 0
    xp = engine.mlp.device.xp
    for c in range(num_chunks):
        rows = slice(c * batch_rows, (c + 1) * batch_rows)
        logits = forward(engine, x[rows])                              # (rows, C)
        correct += int(xp.count_nonzero(xp.argmax(logits, axis=1) == labels[rows]))
        not_finite += int(xp.count_nonzero(~xp.isfinite(logits).all(axis=1)))
    return correct, not_finite
