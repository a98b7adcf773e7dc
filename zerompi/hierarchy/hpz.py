"""hpZ (ZeRO++'s hierarchical partitioning): stage 3 whose backward all-gathers stay in the node.

Stage 3 all-gathers each layer's parameters twice per step, before its forward and before its
backward, over all N ranks: across the nodes both times. hpZ keeps a second copy of the
parameters, sharded over the L ranks of the node only (the secondary partition), written from
the forward's all-gather, which brings every element anyway; backward gathers from it inside
the node.

    N = 4 ranks on 2 nodes (L = 2), one layer of 8 elements:

    primary   (stage 3, param_shard)      rank 0 [a b]  rank 1 [c d] | rank 2 [e f]  rank 3 [g h]
    forward   all-gather over all N       every rank: [a b c d e f g h]          (crosses nodes)
              keep this rank's node slice rank 0 [a b c d]  rank 1 [e f g h] | rank 2 [a b c d] ...
    secondary (param_secondary, 1/L)                   node 0                  node 1
    backward  all-gather over the node    every rank: [a b c d e f g h]          (inside the node)
    gradients reduce-scatter over all N into the primary shards, as stage 3; Adam on them

The secondary copy is rewritten by every forward, so it always holds the parameters the step's
backward needs (the step's update comes after backward). Memory: P Psi / L more per rank.
Inter-node traffic per step: the forward all-gather and the reduce-scatter, 2 Psi (N-1)/N
instead of stage 3's 3 Psi (N-1)/N (ring model).

The secondary slices use the layout unchanged: a layer's padded size is a multiple of N, so it
splits into L equal slices too (L divides N).
"""
from ..stages import Stage3


class HpzStage3(Stage3):
    def __init__(self, layout, collectives, memory, precision, adam_config, node_collectives, keep_last_layer=False):
        super().__init__(layout, collectives, memory, precision, adam_config, keep_last_layer)
        self.node_rank, self.node_size = node_collectives.rank, node_collectives.size
        self.param_secondary = memory.alloc("params", "param_secondary", (layout.full_numel // self.node_size,),
                                            precision.storage)
        self.node_gather = node_collectives.layer_gather(self.param_gather.buffers, self.secondary_of)

    def secondary_of(self, layer):
        """This rank's slice of the layer in the secondary partition (padded / L,)."""
        size = layer.padded // self.node_size
        start = layer.full_offset // self.node_size
        return self.param_secondary[start:start + size]

    def before_forward(self, layer):
        """All-gather the layer over all N ranks; keep this rank's slice of it for backward."""
        full = self.param_gather.gather(layer, self.layout.layers[layer.index + 1:])
        size = layer.padded // self.node_size
        self.secondary_of(layer)[...] = full[self.node_rank * size:(self.node_rank + 1) * size]
        self.keep(layer, full)
        return layer.views(full)

    def gather_again(self, layer):
        """Backward's all-gather of the layer from the secondary partition, inside the node."""
        return self.node_gather.gather(layer, self.layout.layers[layer.index - 1::-1] if layer.index else [])
