"""Stage 1: shard the optimizer state (Adam's m and v).

Rank r keeps m and v only for its owned range of each unit, so it can update only those
parameters. It therefore needs only the reduced gradient of that range (reduce-scatter, not
all-reduce), and afterwards every rank's updated range must be sent to every other (all-gather).

    per rank (N = 4, rank 1):
               params  [################]  Psi        (full: forward and backward need it)
               grads   [################]  Psi        (full: backward writes all of it)
               Adam m  [    ####        ]  Psi / N    (owned range of each unit)
               Adam v  [    ####        ]  Psi / N

    timeline:  forward -> backward (all grads into grad_full)
               -> per unit: reduce-scatter grad_full (in place: the owned, summed block lands at
                  the front of the unit's grad buffer, which backward will overwrite next step)
               -> Adam on the owned ranges
               -> per unit: all-gather params (in place: the owned range is already in position)

reduce-scatter + all-gather move 2 Psi (N-1)/N per rank, the same as stage 0's all-reduce (which is
itself a reduce-scatter followed by an all-gather). One of the source articles describes stage 1
as all-reduce + all-gather (3 Psi); the ZeRO paper's reduce-scatter version needs only 2 Psi.

What separates stage 1 from stage 2 is not the collective: here the full-size gradient buffer
outlives backward (it is reduced only after all of backward); in stage 2 it does not exist.
"""
from ..adam import AdamW
from .base import ZeroStage
from .stage0 import Stage0


class Stage1(Stage0):
    """Stage 0 with Adam's state for the owned ranges only: a new constructor and step."""

    stage = 1

    def __init__(self, layout, comm, memory, dtype, adam_config):
        ZeroStage.__init__(self, layout, comm, memory, dtype, adam_config)
        self.param_full = memory.alloc("params", "param_full", (layout.full_numel,), dtype)
        self.grad_full = memory.alloc("grads", "grad_full", (layout.full_numel,), dtype)
        self.adam = AdamW(layout.shard_numel, dtype, adam_config, memory)  # m, v: owned ranges only

    def step(self):
        layout, rank = self.layout, self.comm.rank
        grad_shards = [self.comm.reduce_scatter_sum_in_place(self.grad_full[layout.full_slice(u)], "grads")
                       for u in layout.units]                     # g[owned] = sum_r g_r[owned]
        self.adam.begin_step()
        for unit, grad_shard in zip(layout.units, grad_shards):
            self.adam.update(self.param_full[layout.owned_slice(unit, rank)], grad_shard,
                             layout.shard_slice(unit))
        for unit in layout.units:                                  # p = concat_r p[owned by r]
            self.comm.allgather_in_place(self.param_full[layout.full_slice(unit)], "params")
