"""Stage 3: also shard the parameters.

Each rank keeps only its owned range of every layer: parameters, gradients and Adam state, all in
the shard layout (Psi_pad / N elements each), so the whole model state is divided by N. A layer's
full parameters exist only while that layer computes: they are all-gathered into a one-layer buffer
(`param_gather`) before its forward, and again before its backward, and that buffer is reused by
the next layer right after.

    per rank (N = 4, rank 1):
               params        [####]   Psi / N    (param_shard)
               grads         [####]   Psi / N    (grad_shard)
               Adam          [####]   Psi / N
               param_gather  [#####]  one layer, reused (work memory; 1 + prefetch with overlap)
               grad_bucket   [#####]  one layer, reused (work memory; two with overlap)

    timeline:  forward, per layer u:  all-gather param_shard[u] -> param_gather; forward u
               backward, last layer first:  all-gather again; backward u into grad_bucket;
                                           reduce-scatter grad_bucket -> grad_shard[u]
               step: Adam on param_shard with grad_shard
               (no all-gather after the step: the next forward gathers what it needs)

Prefetch (overlap on, --prefetch P): when a layer's parameters are taken, the all-gathers of the
next P layers of the same pass (forward: u+1, u+2, ...; backward: u-1, u-2, ...) are started
on the communication thread, each into its own one-layer buffer, so they arrive while layer u
computes. A prefetch is never carried across passes or steps (the parameters change in the step,
and an unused all-gather would be wasted traffic); one that does not match the layer asked for
is waited for and dropped.

Communication per rank: two all-gathers and one reduce-scatter of Psi = 3 Psi (N-1)/N, 1.5x the
other stages: the price of not keeping the parameters.
"""
from collections import deque

from ..adam import AdamW
from ..overlap import OverlapConfig
from .base import ZeroStage
from .stage2 import Stage2


class Stage3(Stage2):
    """Stage 2 with the parameters sharded too: gathered per layer in before_forward and again in
    params_for_backward (which Stage2.before_backward calls); after_backward is Stage 2's."""

    stage = 3

    def __init__(self, layout, comm, memory, precision, adam_config, micro_batches=1,
                 overlap=OverlapConfig()):
        # no param_full: the parent's constructor is not called
        ZeroStage.__init__(self, layout, comm, memory, precision, adam_config, micro_batches, overlap)
        dtype = precision.storage
        self.param_shard = memory.alloc("params", "param_shard", (layout.shard_numel,), dtype)
        self.grad_shard = memory.alloc("grads", "grad_shard", (layout.shard_numel,), dtype)
        self.prefetch = min(overlap.prefetch, len(layout.layers) - 1) if overlap.enabled else 0
        self.param_gathers = self.alloc_layer_buffers("param_gather", 1 + self.prefetch)
        self.gathers_ahead = deque()     # (layer index, buffer index, ticket), in the order of use
        self.gather_in_use = None        # the buffer the current layer computes with
        self.alloc_grad_buckets()
        self.adam = AdamW(layout.shard_numel, precision, adam_config, memory)

    def owned(self, layer):
        rank, shard = self.comm.rank, self.layout.shard_slice(layer)
        return self.param_shard[shard], self.grad_shard[shard], shard, layer.owned_range(rank)

    def held_params(self, layer):
        self.finish_communication()
        return self.param_shard[self.layout.shard_slice(layer)], layer.owned_range(self.comm.rank)

    def store_layer_params(self, layer, values):
        self.finish_communication()
        lo, hi = layer.owned_range(self.comm.rank)
        owned_values = values[lo:hi]                 # shorter than the shard where it reaches padding
        self.param_shard[self.layout.shard_slice(layer)][:owned_values.size] = owned_values

    def full_layer_params(self, layer, purpose="io"):
        self.finish_communication()
        full = self.param_gathers[0][:layer.padded]
        self.comm.allgather(self.param_shard[self.layout.shard_slice(layer)], full, purpose)
        return full

    def finish_communication(self):
        super().finish_communication()
        self.gathers_ahead.clear()       # prefetched parameters may be stale after this

    def before_forward(self, layer):
        return layer.views(self.gathered(layer, self.layout.layers[layer.index + 1:]))

    def params_for_backward(self, layer):
        return layer.views(self.gathered(layer, self.layout.layers[layer.index - 1::-1] if layer.index else []))

    def gathered(self, layer, upcoming):
        """The layer's full parameters (padded,), all-gathered now or by an earlier prefetch; first
        starts the all-gathers of the next `prefetch` layers of `upcoming` (the rest of the pass)."""
        self.gather_in_use = None        # the previous layer's compute is done with its buffer
        expected = [u.index for u in [layer, *upcoming[:len(self.gathers_ahead) - 1]]]
        if self.gathers_ahead and [index for index, _, _ in self.gathers_ahead] != expected:
            self.finish_communication()  # not what was prefetched: drop it
        if not self.gathers_ahead:
            self.start_gather(layer)
        _, self.gather_in_use, ticket = self.gathers_ahead.popleft()
        for next_layer in upcoming[len(self.gathers_ahead):self.prefetch]:
            self.start_gather(next_layer)
        self.queue.wait(ticket)
        return self.param_gathers[self.gather_in_use][:layer.padded]

    def start_gather(self, layer):
        """All-gather the layer's parameters into a buffer that nothing computes with or waits on."""
        busy = {self.gather_in_use} | {index for _, index, _ in self.gathers_ahead}
        index = next(i for i in range(len(self.param_gathers)) if i not in busy)
        ticket = self.queue.submit("allgather", self.param_shard[self.layout.shard_slice(layer)],
                                   self.param_gathers[index][:layer.padded], "params")
        self.gathers_ahead.append((layer.index, index, ticket))

    def gather_params(self):
        """Nothing: the next forward gathers each layer when it needs it."""
