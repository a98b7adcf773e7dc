"""What every stage shares: the hooks the training step calls, and the mechanics they are built from.

The training step (zerompi/step.py) calls, per micro-batch and per layer:

    stage.start_micro_batch(first, last)
    weight, bias = stage.before_forward(layer)       ...forward...     stage.after_forward(layer)
    b = stage.before_backward(layer)                 ...backward into b.dweight, b.dbias...
                                                                        stage.after_backward(layer)

and then, once per optimizer step:

    stage.reduce_grads()          wait for the gradient reductions that backward started
    stage.grad_partition()        the reduced gradient, each element on exactly one rank (global norm)
    stage.update(lr, multiplier)  AdamW on what this rank owns
    stage.gather_params()         bring every rank's updated parameters to all ranks (stages 1-2)

Each stage (stage0.py .. stage3.py) derives from ZeroStage directly and writes out, in its own
file, its buffers, `owned`, and the hooks where the stages differ: before_forward, after_forward,
before_backward, after_backward, reduce_grads, update, gather_params. Read them in order; each
differs from the one before in one thing it partitions. What they share is here, called by name:
start_micro_batch, grad_partition (the owned gradients; stage 0, which owns everything, writes
its own), Adam over the owned ranges, one-layer work buffers and the layer gradient buffers.

The heart of each stage is `owned(layer)`: which part of a layer this rank updates, and where its
gradient and Adam state are. Collectives go through `self.collectives` (zerompi/collectives.py):
each returns a request, and a stage waits for it before it reads or reuses the call's buffers
(with overlap off every request is already complete).
"""
from typing import NamedTuple

from ..collectives import DONE


class Owned(NamedTuple):
    """What this rank updates of one layer."""
    param: object        # its parameters (hi - lo,), a view into the stage's parameter buffer
    grad: object         # their reduced gradient (hi - lo,)
    state: slice         # where their Adam state is in adam.m, adam.v (and adam.master)
    range: tuple         # (lo, hi): which elements of the layer's padded buffer they are


class Backward(NamedTuple):
    """What a layer's backward reads and writes (zerompi/model.py)."""
    weight: object       # (O, I)
    bias: object         # (O,)
    dweight: object      # (O, I) written, or added to when accumulate
    dbias: object        # (O,)
    accumulate: bool     # add to dweight, dbias (later micro-batches of stages 0-1)


class ZeroStage:
    stage = None
    param_full = None    # stages 0-2: the full parameters (Psi_pad,); stage 3 holds only its shard
    # what the engine (zerompi/engine.py) sizes for each stage, declared by the stage:
    takes_buckets = False         # stages 0-1: `buckets` decide when backward's reductions start
    reduce_scatter_adds = False   # stages 2-3: later micro-batches' reduce-scatters add into the shard

    @staticmethod
    def largest_reduction(layout, buckets):
        """Elements the largest reduction of one call holds: one layer (stage 0: a bucket)."""
        return layout.max_layer_padded

    def __init__(self, layout, collectives, memory, precision):
        self.layout = layout              # where every layer lives in the flat buffers
        self.collectives = collectives    # started collectives return requests
        self.memory = memory              # the memory ledger every buffer is allocated from
        self.precision = precision        # storage dtype of params and grads, compute dtype
        self.rank = collectives.rank
        self.first_micro_batch = self.last_micro_batch = True
        collectives.reserve(memory, layout, precision)     # nothing, but for zerompi/quantize/'s

    def start_micro_batch(self, first, last=True):
        """first: the step's first micro-batch overwrites gradients, later ones add to them;
        last: stages 0-1 reduce the gradients during the last micro-batch's backward."""
        self.first_micro_batch, self.last_micro_batch = first, last

    def grad_partition(self):
        """The reduced gradient, each element on exactly one rank: what this rank owns."""
        return [self.owned(layer).grad for layer in self.layout.layers]

    def adam_on_owned(self, lr, grad_multiplier):
        """AdamW on every owned range: param -= f(grad, m, v), in place (zerompi/adam.py)."""
        self.finish_communication()
        self.adam.begin_step()
        for layer in self.layout.layers:
            owned = self.owned(layer)
            self.adam.update(owned.param, owned.grad, owned.state, lr, grad_multiplier)

    def finish_communication(self):
        """Wait for every collective started (before the parameters are read or written from
        outside the training step, and before Adam)."""
        self.collectives.wait_all()

    def layer_buffers(self, name, count):
        """count one-layer work buffers (max padded layer,) in the storage dtype, ledgered as
        name, name.2, name.3, ..."""
        return [self.memory.alloc("work", name + ("" if i == 0 else f".{i + 1}"),
                                  (self.layout.max_layer_padded,), self.precision.storage)
                for i in range(count)]


class LayerGradBuffers:
    """Stages 2-3: the one-layer gradient buffers that backward writes, used in turn. Each
    remembers the reduce-scatter that last read it, and is handed out again only when that is
    done (one buffer with overlap off; two with overlap on, so that backward writes one while
    the other is reduced)."""

    def __init__(self, buffers):
        self.buffers = buffers
        self.requests = [DONE] * len(buffers)   # the collective that last read each buffer
        self.current = 0                        # the buffer that the current layer's backward writes

    def take(self, layer):
        """The next buffer, (padded,) with its padding zero (whatever a larger layer left)."""
        self.current = (self.current + 1) % len(self.buffers)
        self.requests[self.current].wait()
        grad = self.buffers[self.current][:layer.padded]
        grad[layer.numel:] = 0
        return grad

    def written(self, layer):
        """The buffer the layer's backward has just written (padded,)."""
        return self.buffers[self.current][:layer.padded]

    def hand_off(self, request):
        """The collective that now reads the current buffer: wait for it before reusing it."""
        self.requests[self.current] = request
