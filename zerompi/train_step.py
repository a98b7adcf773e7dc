"""One training step, written out plainly: the whole algorithm on one screen.

    for unit in units:            zero.before_forward  -> forward  -> zero.after_forward
    loss, d_logits = softmax cross-entropy (divided by the GLOBAL batch size)
    for unit in reversed(units):  zero.before_backward -> backward -> zero.after_backward
    zero.step()

Each rank runs this on its own rows of the global batch; the stage object (zerompi/stages/)
decides where parameters and gradients live and which collectives run inside the hooks. With one
rank every stage's collectives are copies, and the step is plain single-process Adam.
"""
import numpy as np

from .layers import softmax_cross_entropy


def forward(zero, mlp, x):
    """x (n, sizes[0]) -> logits (n, sizes[-1]), a view into mlp's buffers."""
    h = mlp.load_input(x)
    for unit in mlp.units:
        weight, bias = zero.before_forward(unit)
        h = mlp.forward_unit(unit, h, weight, bias)
        zero.after_forward(unit)
    return h


def train_step(zero, mlp, x, labels, global_batch):
    """One step on this rank's rows x (n, sizes[0]), labels (n,) of a global batch.
    Returns (this rank's part of the mean loss, this rank's correct predictions)."""
    logits = forward(zero, mlp, x)
    loss_part, correct = softmax_cross_entropy(logits, labels, global_batch, dlogits=logits)
    d_h = logits                                   # now d_logits, in place
    for unit in reversed(mlp.units):
        weight, bias, dweight, dbias = zero.before_backward(unit)
        d_h = mlp.backward_unit(unit, d_h, weight, dweight, dbias)
        zero.after_backward(unit)
    zero.step()
    return loss_part, correct


def count_correct(zero, mlp, x, labels, batch_rows, num_chunks):
    """Correct predictions on this rank's rows, forward only, in num_chunks chunks of at most
    batch_rows rows. num_chunks must be the same on every rank: in stage 3 each forward is
    collective, so a rank with fewer rows runs empty chunks."""
    correct = 0
    for c in range(num_chunks):
        rows = slice(c * batch_rows, (c + 1) * batch_rows)
        logits = forward(zero, mlp, x[rows])
        correct += int(np.count_nonzero(np.argmax(logits, axis=1) == labels[rows]))
    return correct
