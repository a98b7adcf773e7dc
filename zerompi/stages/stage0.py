"""Stage 0: plain data parallelism, the baseline ZeRO improves on.

Every rank holds everything; an all-reduce per bucket (consecutive layers, --bucket-mb) sums the
gradients, started as soon as backward has produced the bucket's last layer.

    per rank:  params  [################]  Psi
               grads   [################]  Psi
               Adam    [################]  Psi each for m, v (and the fp32 master in mixed precision)

    timeline:  forward (all layers) -> backward, last layer first, grads into grad_full
                                         -> each bucket done: all-reduce it (sum over ranks),
                                            on the communication thread while backward goes on
               -> wait for the all-reduces -> Adam on everything, on every rank

A bucket is contiguous in grad_full, so one all-reduce covers it. With --grad-accum K the
micro-batches add up in grad_full and only the last one's backward starts the all-reduces.

The loss gradient is already divided by the global batch (zerompi/layers.py), so the summed
gradient is the global mean gradient. Every rank then performs the same Adam update on the same
numbers: N copies of identical work and identical memory. That redundancy is what stages 1-3 remove.
Communication per rank: all-reduce of Psi elements = 2 Psi (N-1)/N.
"""
from ..adam import AdamW
from ..overlap import OverlapConfig
from .base import ZeroStage


class Stage0(ZeroStage):
    stage = 0

    def __init__(self, layout, comm, memory, precision, adam_config, micro_batches=1,
                 overlap=OverlapConfig()):
        super().__init__(layout, comm, memory, precision, adam_config, micro_batches, overlap)
        dtype = precision.storage
        self.param_full = memory.alloc("params", "param_full", (layout.full_numel,), dtype)
        self.grad_full = memory.alloc("grads", "grad_full", (layout.full_numel,), dtype)
        self.adam = AdamW(layout.full_numel, precision, adam_config, memory)   # state for everything

    def owned(self, layer):
        """Stage 0 'owns' all of every layer: (param, grad, Adam state slice, (lo, hi) in the layer)."""
        full = self.layout.full_slice(layer)
        return self.param_full[full], self.grad_full[full], full, (0, layer.padded)

    def grad_partition(self):
        """Every rank holds (and 'owns', for Adam) all of the gradient, but the global norm's
        all-reduce must count each element once: here each rank offers its shard's range."""
        return [self.grad_full[self.layout.owned_slice(layer, self.comm.rank)] for layer in self.layout.layers]

    def before_backward(self, layer):
        weight, bias = self.params_for_backward(layer)
        dweight, dbias = layer.views(self.grad_full[self.layout.full_slice(layer)])
        return weight, bias, dweight, dbias, not self.first_micro_batch   # accumulate after the first

    def after_backward(self, layer):
        if self.last_micro_batch and layer.index in self.bucket_ending_at:
            self.reduce_bucket(self.bucket_ending_at[layer.index])

    def largest_reduction(self):
        return max(self.bucket_elements(bucket) for bucket in self.buckets)

    def bucket_elements(self, bucket):
        return sum(layer.padded for layer in bucket)

    def reduce_bucket(self, bucket):
        """g = sum_r g_r over the bucket's layers, one all-reduce (backward order: bucket[-1] is
        the layer with the lowest offset)."""
        start = bucket[-1].full_offset
        grads = self.grad_full[start:start + self.bucket_elements(bucket)]
        self.queue.submit("allreduce_sum", grads, "grads")
