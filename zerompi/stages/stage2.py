"""Stage 2: also shard the gradients.

Backward produces one layer's gradients at a time. Stage 2 reduce-scatters each layer's gradients
as soon as backward has produced them, keeps only the owned, summed block, and reuses the same
one-layer buffer (`layer_grads`) for the next layer. A full-size gradient buffer never exists; with
several micro-batches per step, each one's reduced block is added into the gradient shard.
With --overlap there are two one-layer buffers, used in turn: backward writes layer u-1's gradients
into one while the communication thread reduce-scatters layer u's from the other (backward waits
only if that reduce-scatter is still running when it needs the buffer again).

    per rank (N = 4, rank 1):
               params       [################]  Psi
               grads        [    ####        ]  Psi / N   (grad_shard: owned range of each layer)
               Adam         [    ####        ]  Psi / N
               layer_grad   [#####]              one layer, reused (ledgered as work memory;
                                                 two of them with --overlap)

    timeline:  forward
               -> backward, last layer first: layer u's grads into layer_grad
                  -> reduce-scatter layer_grad into grad_shard[u]   (then the buffer is free)
               -> Adam on the owned ranges
               -> per layer: all-gather params (in place)

Communication per rank: the same 2 Psi (N-1)/N as stages 0 and 1 (times the micro-batches for the
gradients: the price of not keeping a full gradient between them); only its timing moved into
backward, where it overlaps with the backward of earlier layers.
"""
from ..collectives import DONE
from ..ledger import GRADS, PARAMS
from .base import Backward, LayerGradBuffers, Owned, ZeroStage


class Stage2(ZeroStage):
    stage = 2
    reduce_scatter_adds = True

    def __init__(self, layout, collectives, memory, precision, adam_config):
        super().__init__(layout, collectives, memory, precision)
        dtype = precision.storage
        self.param_full = memory.alloc("params", "param_full", (layout.full_numel,), dtype)
        self.grad_shard = memory.alloc("grads", "grad_shard", (layout.shard_numel,), dtype)
        self.adam = adam_config.optimizer(layout.shard_numel, precision, memory)
        self.layer_grads = LayerGradBuffers(self.layer_buffers("layer_grad", collectives.buffers_in_flight))
        self.param_requests = [DONE] * len(layout.layers)   # each layer's all-gather after the step

    def owned(self, layer):
        shard = self.layout.shard_slice(layer)
        return Owned(self.param_full[self.layout.owned_slice(layer, self.rank)], self.grad_shard[shard],
                     shard, layer.owned_range(self.rank))

    def before_forward(self, layer):
        self.param_requests[layer.index].wait()          # its all-gather after the last step
        return layer.views(self.param_full[self.layout.full_slice(layer)])

    def after_forward(self, layer):
        """Nothing to release: every rank keeps all parameters."""

    def before_backward(self, layer):
        weight, bias = layer.views(self.param_full[self.layout.full_slice(layer)])
        dweight, dbias = layer.views(self.layer_grads.take(layer))   # a one-layer buffer
        return Backward(weight, bias, dweight, dbias, accumulate=False)   # always written afresh

    def after_backward(self, layer):
        """grad_shard[layer] = (or +=, after the first micro-batch) sum_r g_r[owned]: one
        reduce-scatter of the layer's gradient buffer, which is free again once it is done."""
        request = self.collectives.reduce_scatter(
            self.layer_grads.written(layer), self.grad_shard[self.layout.shard_slice(layer)], GRADS,
            accumulate=not self.first_micro_batch)
        self.layer_grads.hand_off(request)

    def reduce_grads(self):
        self.collectives.wait_all()

    def update(self, lr, grad_multiplier):
        self.adam_on_owned(lr, grad_multiplier)

    def gather_params(self):
        """p = concat_r p[owned by r], per layer, in place, as in stage 1."""
        for layer in self.layout.layers:
            self.param_requests[layer.index] = self.collectives.allgather_in_place(
                self.param_full[self.layout.full_slice(layer)], PARAMS)
