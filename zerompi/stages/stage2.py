"""Stage 2: also shard the gradients.

Backward produces one unit's gradients at a time. Stage 2 reduce-scatters each unit's gradients
as soon as backward has produced them, keeps only the owned, summed block, and reuses the same
one-unit buffer (`grad_bucket`) for the next unit. A full-size gradient buffer never exists.

    per rank (N = 4, rank 1):
               params       [################]  Psi
               grads        [    ####        ]  Psi / N   (grad_shard: owned range of each unit)
               Adam m, v    [    ####        ]  Psi / N each
               grad_bucket  [#####]              one unit, reused (ledgered as work memory)

    timeline:  forward
               -> backward, last unit first: unit u's grads into grad_bucket
                  -> reduce-scatter grad_bucket into grad_shard[u]   (then the bucket is free)
               -> Adam on the owned ranges
               -> per unit: all-gather params (in place)

Communication per rank: the same 2 Psi (N-1)/N as stages 0 and 1; only its timing moved into
backward (where a later version can overlap it with the backward of earlier units).
"""
from ..adam import AdamW
from .base import ZeroStage
from .stage1 import Stage1


class Stage2(Stage1):
    """Stage 1 with the gradients reduce-scattered unit by unit during backward."""

    stage = 2

    def __init__(self, layout, comm, memory, dtype, adam_config):
        ZeroStage.__init__(self, layout, comm, memory, dtype, adam_config)
        self.param_full = memory.alloc("params", "param_full", (layout.full_numel,), dtype)
        self.grad_shard = memory.alloc("grads", "grad_shard", (layout.shard_numel,), dtype)
        self.grad_bucket = memory.alloc("work", "grad_bucket", (layout.max_unit_padded,), dtype)
        self.adam = AdamW(layout.shard_numel, dtype, adam_config, memory)

    def before_backward(self, unit):
        weight, bias = self.before_forward(unit)
        bucket = self.grad_bucket[:unit.padded]
        bucket[unit.numel:] = 0                      # padding: zero, whatever a larger unit left
        dweight, dbias = unit.views(bucket)
        return weight, bias, dweight, dbias

    def after_backward(self, unit):
        self.comm.reduce_scatter_sum(self.grad_bucket[:unit.padded],
                                     self.grad_shard[self.layout.shard_slice(unit)], "grads")

    def step(self):
        layout, rank = self.layout, self.comm.rank
        self.adam.begin_step()
        for unit in layout.units:
            shard = layout.shard_slice(unit)
            self.adam.update(self.param_full[layout.owned_slice(unit, rank)], self.grad_shard[shard], shard)
        for unit in layout.units:
            self.comm.allgather_in_place(self.param_full[layout.full_slice(unit)], "params")
