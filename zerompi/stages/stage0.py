"""Stage 0: plain data parallelism, the baseline ZeRO improves on.

Every rank holds everything; an all-reduce per gradient bucket (consecutive layers, --bucket-mb)
sums the gradients, started as soon as backward has produced the bucket's last layer.

    per rank:  params  [################]  Psi
               grads   [################]  Psi
               Adam    [################]  Psi each for m, v (and the fp32 master in mixed precision)

    timeline:  forward (all layers) -> backward, last layer first, grads into grad_full
                                         -> each bucket done: all-reduce it (sum over ranks;
                                            with --overlap, while backward goes on)
               -> wait for the all-reduces -> Adam on everything, on every rank

A bucket is contiguous in grad_full, so one all-reduce covers it. With --grad-accum M the
micro-batches add up in grad_full and only the last one's backward starts the all-reduces.

The loss gradient is already divided by the global batch (zerompi/layers.py), so the summed
gradient is the global mean gradient. Every rank then performs the same Adam update on the same
numbers: N copies of identical work and identical memory. That redundancy is what stages 1-3 remove.
Communication per rank: all-reduce of Psi elements = 2 Psi (N-1)/N.
"""
from ..layout import bucket_numel
from ..ledger import GRADS
from .base import Backward, Owned, ZeroStage


class Stage0(ZeroStage):
    stage = 0
    takes_buckets = True

    @staticmethod
    def largest_reduction(layout, buckets):
        """One all-reduce per gradient bucket: the largest bucket."""
        return max(bucket_numel(bucket) for bucket in buckets)

    def __init__(self, layout, collectives, memory, precision, adam_config, buckets):
        super().__init__(layout, collectives, memory, precision)
        dtype = precision.storage
        self.param_full = memory.alloc("params", "param_full", (layout.full_numel,), dtype)
        self.grad_full = memory.alloc("grads", "grad_full", (layout.full_numel,), dtype)
        self.adam = adam_config.optimizer(layout.full_numel, precision, memory)   # state for everything
        self.buckets = buckets                     # gradient buckets (layout.gradient_buckets)
        self.bucket_ending_at = {bucket[-1].index: bucket for bucket in buckets}

    def owned(self, layer):
        """Stage 0 'owns' all of every layer."""
        full = self.layout.full_slice(layer)
        return Owned(self.param_full[full], self.grad_full[full], full, (0, layer.padded))

    def grad_partition(self):
        """Every rank holds (and 'owns', for Adam) all of the gradient, but the global norm's
        all-reduce must count each element once: here each rank offers its shard's range."""
        return [self.grad_full[self.layout.owned_slice(layer, self.rank)] for layer in self.layout.layers]

    def before_forward(self, layer):
        return layer.views(self.param_full[self.layout.full_slice(layer)])

    def after_forward(self, layer):
        """Nothing to release: every rank keeps all parameters."""

    def before_backward(self, layer):
        weight, bias = layer.views(self.param_full[self.layout.full_slice(layer)])
        dweight, dbias = layer.views(self.grad_full[self.layout.full_slice(layer)])
        return Backward(weight, bias, dweight, dbias, accumulate=not self.first_micro_batch)

    def after_backward(self, layer):
        """When backward has produced a bucket's last layer (in the last micro-batch):
        g = sum_r g_r over the bucket, one all-reduce (a bucket is contiguous in grad_full;
        bucket[-1] is the layer with the lowest offset)."""
        bucket = self.bucket_ending_at.get(layer.index)
        if self.last_micro_batch and bucket is not None:
            start = bucket[-1].full_offset
            self.collectives.allreduce(self.grad_full[start:start + bucket_numel(bucket)], GRADS)

    def reduce_grads(self):
        self.collectives.wait_all()

    def update(self, lr, grad_multiplier):
        self.adam_on_owned(lr, grad_multiplier)          # the same update on every rank

    def gather_params(self):
        """Nothing to gather: every rank has just computed all the new parameters."""
