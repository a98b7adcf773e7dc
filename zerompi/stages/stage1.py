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

With overlap on, the reduce-scatters run while backward continues on earlier layers, and the
all-gathers while the next forward runs on the layers already gathered. The shard layout is per
layer, so a bucket of several layers is still one reduce-scatter per layer; the bucket only decides
when they start.

reduce-scatter + all-gather move 2 Psi (N-1)/N per rank, the same as stage 0's all-reduce (which is
itself a reduce-scatter followed by an all-gather). One of the source articles describes stage 1
as all-reduce + all-gather (3 Psi); the ZeRO paper's reduce-scatter version needs only 2 Psi.

What separates stage 1 from stage 2 is not the collective: here the full-size gradient buffer
outlives backward (it is reduced only after all of backward); in stage 2 it does not exist.
"""
from ..adam import AdamW
from ..overlap import OverlapConfig
from .base import ZeroStage
from .stage0 import Stage0


class Stage1(Stage0):
    """Stage 0 with the optimizer state for the owned ranges only."""

    stage = 1

    def __init__(self, layout, comm, memory, precision, adam_config, micro_batches=1,
                 overlap=OverlapConfig()):
        ZeroStage.__init__(self, layout, comm, memory, precision, adam_config, micro_batches, overlap)
        dtype = precision.storage
        self.param_full = memory.alloc("params", "param_full", (layout.full_numel,), dtype)
        self.grad_full = memory.alloc("grads", "grad_full", (layout.full_numel,), dtype)
        self.adam = AdamW(layout.shard_numel, precision, adam_config, memory)  # owned ranges only

    def owned(self, layer):
        """This rank's range of the layer: its params, reduced grads, Adam state, (lo, hi)."""
        rank = self.comm.rank
        grad_shard = self.grad_full[self.layout.full_slice(layer)][:layer.shard_size]  # after reduce_grads
        return (self.param_full[self.layout.owned_slice(layer, rank)], grad_shard,
                self.layout.shard_slice(layer), layer.owned_range(rank))

    # The owned ranges partition the model again (stage 0's every-rank-owns-all did not): the
    # base class's grad_partition, the owned gradients, serves the global norm again.
    grad_partition = ZeroStage.grad_partition

    largest_reduction = ZeroStage.largest_reduction  # one layer per call again

    def reduce_bucket(self, bucket):
        for layer in bucket:                              # g[owned] = sum_r g_r[owned]
            grad = self.grad_full[self.layout.full_slice(layer)]
            grad[layer.numel:] = 0                        # padding: the last in-place reduce left garbage there
            self.queue.submit("reduce_scatter_sum_in_place", grad, "grads")

    def gather_params(self):
        for layer in self.layout.layers:                   # p = concat_r p[owned by r]
            self.param_tickets[layer.index] = self.queue.submit(
                "allgather_in_place", self.param_full[self.layout.full_slice(layer)], "params")
