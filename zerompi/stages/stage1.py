"""Stage 1: shard the optimizer state (Adam's m and v, and the fp32 master copy).

Rank r keeps the optimizer state only for its owned range of each layer, so it can update only
those parameters. It therefore needs only the reduced gradient of that range (reduce-scatter, not
all-reduce), and afterwards every rank's updated range must be sent to every other (all-gather).

    per rank (N = 4, rank 1):
               params  [################]  Psi        (full: forward and backward need it)
               grads   [################]  Psi        (full: backward writes all of it)
               Adam    [    ####        ]  Psi / N    (owned range of each layer)

    timeline:  forward -> backward (all grads into grad_full; micro-batches add up in it)
                          -> each bucket done (last micro-batch): per layer, reduce-scatter
                             grad_full in place (the owned, summed block lands at the front of
                             the layer's grad buffer, which backward will overwrite next step)
               -> wait for them -> Adam on the owned ranges
               -> per layer: all-gather params (in place: the owned range is already in position);
                  the next forward waits for each layer's all-gather just before using it

With --overlap, the reduce-scatters run while backward continues on earlier layers, and the
all-gathers while the next forward runs on the layers already gathered. The shard layout is per
layer, so a bucket of several layers is still one reduce-scatter per layer; the bucket only decides
when they start.

reduce-scatter + all-gather move 2 Psi (N-1)/N per rank, the same as stage 0's all-reduce (which is
itself a reduce-scatter followed by an all-gather). One of the source articles describes stage 1
as all-reduce + all-gather (3 Psi); the ZeRO paper's reduce-scatter version needs only 2 Psi.

What separates stage 1 from stage 2 is not the collective: here the full-size gradient buffer
outlives backward (it is reduced only after all of backward); in stage 2 it does not exist.
"""
from ..collectives import DONE
from ..ledger import GRADS, PARAMS
from .base import Backward, Owned, ZeroStage


class Stage1(ZeroStage):
    stage = 1
    takes_buckets = True

    def __init__(self, layout, collectives, memory, precision, adam_config, buckets):
        super().__init__(layout, collectives, memory, precision)
        dtype = precision.storage
        self.param_full = memory.alloc("params", "param_full", (layout.full_numel,), dtype)
        self.grad_full = memory.alloc("grads", "grad_full", (layout.full_numel,), dtype)
        self.adam = adam_config.optimizer(layout.shard_numel, precision, memory)  # owned ranges only
        self.buckets = buckets                     # gradient buckets (layout.gradient_buckets)
        self.bucket_ending_at = {bucket[-1].index: bucket for bucket in buckets}
        self.param_requests = [DONE] * len(layout.layers)   # each layer's all-gather after the step

    def owned(self, layer):
        """This rank's range of the layer; its reduced gradient sits at the front of the layer's
        grad_full block (where the in-place reduce-scatter puts it)."""
        grad_shard = self.grad_full[self.layout.full_slice(layer)][:layer.shard_size]
        return Owned(self.param_full[self.layout.owned_slice(layer, self.rank)], grad_shard,
                     self.layout.shard_slice(layer), layer.owned_range(self.rank))

    def before_forward(self, layer):
        self.param_requests[layer.index].wait()          # its all-gather after the last step
        return layer.views(self.param_full[self.layout.full_slice(layer)])

    def after_forward(self, layer):
        """Nothing to release: every rank keeps all parameters."""

    def before_backward(self, layer):
        weight, bias = layer.views(self.param_full[self.layout.full_slice(layer)])
        dweight, dbias = layer.views(self.grad_full[self.layout.full_slice(layer)])
        return Backward(weight, bias, dweight, dbias, accumulate=not self.first_micro_batch)

    def after_backward(self, layer):
        """When backward has produced a bucket's last layer (in the last micro-batch): per layer
        of the bucket, g[owned] = sum_r g_r[owned], one reduce-scatter in place."""
        bucket = self.bucket_ending_at.get(layer.index)
        if self.last_micro_batch and bucket is not None:
            for each in bucket:
                grad = self.grad_full[self.layout.full_slice(each)]
                grad[each.numel:] = 0                    # padding: 0 (what the last in-place reduce left there is MPI's)
                self.collectives.reduce_scatter_in_place(grad, GRADS)

    def reduce_grads(self):
        self.collectives.wait_all()

    def update(self, lr, grad_multiplier):
        self.adam_on_owned(lr, grad_multiplier)          # each rank updates its owned ranges

    def gather_params(self):
        """p = concat_r p[owned by r], per layer, in place: the owned range is already in position.
        The next forward waits for each layer's all-gather just before using it."""
        for layer in self.layout.layers:
            self.param_requests[layer.index] = self.collectives.allgather_in_place(
                self.param_full[self.layout.full_slice(layer)], PARAMS)
