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
               param_gather  [#####]  one layer, reused (work memory; 1 + P with --overlap)
               layer_grad    [#####]  one layer, reused (work memory; two with --overlap)

    timeline:  forward, per layer u:  all-gather param_shard[u] -> param_gather; forward u
               backward, last layer first:  all-gather again; backward u into layer_grad;
                                           reduce-scatter layer_grad -> grad_shard[u]
               step: Adam on param_shard with grad_shard
               (no all-gather after the step: the next forward gathers what it needs)

`param_gather.gather(layer, upcoming)` (zerompi/collectives.py) all-gathers the layer's
parameters into a one-layer buffer and waits for them. `upcoming` is the rest of the pass, in the
order it runs: with --overlap --prefetch P, the overlap layer's gather (zerompi/overlap/prefetch.py)
starts the next P layers' all-gathers early, each into one of the 1 + P buffers, so that they
arrive while layer u computes. This file does not change for it.

Communication per rank: two all-gathers and one reduce-scatter of Psi = 3 Psi (N-1)/N, 1.5x the
other stages: the price of not keeping the parameters. The last layer's two gathers come back to
back, into the buffer that still holds it: --keep-last-layer (keep_last_layer) takes it from there,
as FSDP2 keeps its root module: (3 Psi - psi_last)(N-1)/N, psi_last the last layer's elements.
"""
from ..ledger import GRADS
from .base import Backward, LayerGradBuffers, Owned, ZeroStage


class Stage3(ZeroStage):
    stage = 3
    reduce_scatter_adds = True

    def __init__(self, layout, collectives, memory, precision, adam_config, keep_last_layer=False):
        super().__init__(layout, collectives, memory, precision)
        self.keep_last_layer, self.kept = keep_last_layer, None     # kept: the last layer, gathered
        dtype = precision.storage
        self.param_shard = self.hold_params(memory, layout.shard_numel, dtype)
        self.grad_shard = memory.alloc("grads", "grad_shard", (layout.shard_numel,), dtype)
        self.adam = adam_config.optimizer(layout.shard_numel, precision, memory)
        ahead = min(collectives.prefetch, len(layout.layers) - 1)   # 0 without --overlap --prefetch
        self.param_gather = collectives.layer_gather(self.layer_buffers("param_gather", 1 + ahead),
                                                     self.param_shard_of)
        self.layer_grads = LayerGradBuffers(self.layer_buffers("layer_grad", collectives.buffers_in_flight))

    def hold_params(self, memory, numel, dtype):      # the shard (numel,): zerompi/offload/ keeps it elsewhere
        return memory.alloc("params", "param_shard", (numel,), dtype)

    def owned(self, layer):
        shard = self.layout.shard_slice(layer)
        return Owned(self.param_shard[shard], self.grad_shard[shard], shard, layer.owned_range(self.rank))

    def param_shard_of(self, layer):
        """This rank's shard of the layer's parameters (shard_size,)."""
        return self.param_shard[self.layout.shard_slice(layer)]

    def before_forward(self, layer):
        """All-gather the layer's parameters into the one-layer buffer."""
        full = self.param_gather.gather(layer, self.layout.layers[layer.index + 1:])
        self.keep(layer, full)
        return layer.views(full)

    def keep(self, layer, full):
        """--keep-last-layer: the last layer's gathered parameters (full) stay for its backward."""
        self.kept = full if self.keep_last_layer and layer.index + 1 == len(self.layout.layers) else None

    def after_forward(self, layer):
        """Nothing to free: the next layer's all-gather reuses the buffer."""

    def before_backward(self, layer):
        """All-gather the layer's parameters again (or take the kept last layer), and hand out a
        one-layer gradient buffer."""
        full, self.kept = (self.kept if self.kept is not None else self.gather_again(layer)), None
        weight, bias = layer.views(full)
        dweight, dbias = layer.views(self.layer_grads.take(layer))
        return Backward(weight, bias, dweight, dbias, accumulate=False)   # always written afresh

    def gather_again(self, layer):
        """Backward's all-gather of the layer, the pass going on to the layers before it."""
        return self.param_gather.gather(layer, self.layout.layers[layer.index - 1::-1] if layer.index else [])

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
        self.adam_on_owned(lr, grad_multiplier)          # on param_shard with grad_shard

    def gather_params(self):
        """Nothing: the next forward gathers each layer when it needs it."""

    def finish_communication(self):
        super().finish_communication()
        self.param_gather.drop()         # prefetched parameters may be stale after this
