"""Stage 2: also shard the gradients.

Backward produces one layer's gradients at a time. Stage 2 reduce-scatters each layer's gradients
as soon as backward has produced them, keeps only the owned, summed block, and reuses the same
one-layer buffer (`grad_bucket`) for the next layer. A full-size gradient buffer never exists; with
several micro-batches per step, each one's reduced block is added into the gradient shard.
With overlap on there are two one-layer buffers, used in turn: backward writes layer u-1's gradients
into one while the communication thread reduce-scatters layer u's from the other (backward waits
only if that reduce-scatter is still running when it needs the buffer again).

    per rank (N = 4, rank 1):
               params       [################]  Psi
               grads        [    ####        ]  Psi / N   (grad_shard: owned range of each layer)
               Adam         [    ####        ]  Psi / N
               grad_bucket  [#####]              one layer, reused (ledgered as work memory;
                                                 two of them with overlap on)

    timeline:  forward
               -> backward, last layer first: layer u's grads into grad_bucket
                  -> reduce-scatter grad_bucket into grad_shard[u]   (then the bucket is free)
               -> Adam on the owned ranges
               -> per layer: all-gather params (in place)

Communication per rank: the same 2 Psi (N-1)/N as stages 0 and 1 (times the micro-batches for the
gradients: the price of not keeping a full gradient between them); only its timing moved into
backward, where it overlaps with the backward of earlier layers.
"""
from ..adam import AdamW
from ..overlap import OverlapConfig
from .base import ZeroStage
from .stage1 import Stage1


class Stage2(Stage1):
    """Stage 1 with the gradients reduce-scattered layer by layer during backward."""

    stage = 2

    def __init__(self, layout, comm, memory, precision, adam_config, micro_batches=1,
                 overlap=OverlapConfig()):
        ZeroStage.__init__(self, layout, comm, memory, precision, adam_config, micro_batches, overlap)
        dtype = precision.storage
        self.param_full = memory.alloc("params", "param_full", (layout.full_numel,), dtype)
        self.grad_shard = memory.alloc("grads", "grad_shard", (layout.shard_numel,), dtype)
        self.alloc_grad_buckets()
        self.adam = AdamW(layout.shard_numel, precision, adam_config, memory)

    def alloc_grad_buckets(self):
        """One one-layer gradient buffer, two with overlap on (see the module docstring)."""
        count = 2 if self.overlap.enabled else 1
        self.grad_buckets = self.alloc_layer_buffers("grad_bucket", count)
        self.bucket_tickets = [None] * count   # the reduce-scatter that last read each buffer
        self.bucket_in_use = 0                 # the buffer that the current layer's backward writes

    def owned(self, layer):
        rank, shard = self.comm.rank, self.layout.shard_slice(layer)
        return (self.param_full[self.layout.owned_slice(layer, rank)], self.grad_shard[shard], shard,
                layer.owned_range(rank))

    def before_backward(self, layer):
        weight, bias = self.params_for_backward(layer)
        self.bucket_in_use = (self.bucket_in_use + 1) % len(self.grad_buckets)
        self.queue.wait(self.bucket_tickets[self.bucket_in_use])   # its last reduce-scatter is done
        bucket = self.grad_buckets[self.bucket_in_use][:layer.padded]
        bucket[layer.numel:] = 0                      # padding: zero, whatever a larger layer left
        dweight, dbias = layer.views(bucket)
        return weight, bias, dweight, dbias, False  # the bucket is always written afresh

    def after_backward(self, layer):
        self.bucket_tickets[self.bucket_in_use] = self.queue.submit(
            "reduce_scatter_sum", self.grad_buckets[self.bucket_in_use][:layer.padded],
            self.grad_shard[self.layout.shard_slice(layer)], "grads", accumulate=not self.first_micro_batch)
