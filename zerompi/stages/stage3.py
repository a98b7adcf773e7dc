"""Stage 3: also shard the parameters.

Each rank keeps only its owned range of every unit: parameters, gradients and Adam state, all in
the shard layout (Psi_pad / N elements each), so the whole model state is divided by N. A unit's
full parameters exist only while that unit computes: they are all-gathered into a one-unit buffer
(`param_gather`) before its forward, and again before its backward, and that buffer is reused by
the next unit right after.

    per rank (N = 4, rank 1):
               params        [####]   Psi / N    (param_shard)
               grads         [####]   Psi / N    (grad_shard)
               Adam          [####]   Psi / N
               param_gather  [#####]  one unit, reused (work memory)
               grad_bucket   [#####]  one unit, reused (work memory)

    timeline:  forward, per unit u:  all-gather param_shard[u] -> param_gather; forward u
               backward, last unit first:  all-gather again; backward u into grad_bucket;
                                           reduce-scatter grad_bucket -> grad_shard[u]
               step: Adam on param_shard with grad_shard
               (no all-gather after the step: the next forward gathers what it needs)

Communication per rank: two all-gathers and one reduce-scatter of Psi = 3 Psi (N-1)/N, 1.5x the
other stages: the price of not keeping the parameters.
"""
from ..adam import AdamW
from .base import ZeroStage
from .stage2 import Stage2


class Stage3(Stage2):
    """Stage 2 with the parameters sharded too: gathered per unit in before_forward, which
    Stage2.before_backward calls, so backward gathers them again; after_backward is Stage 2's."""

    stage = 3

    def __init__(self, layout, comm, memory, precision, adam_config, micro_batches=1):
        ZeroStage.__init__(self, layout, comm, memory, precision, adam_config, micro_batches)   # no param_full
        dtype = precision.storage
        self.param_shard = memory.alloc("params", "param_shard", (layout.shard_numel,), dtype)
        self.grad_shard = memory.alloc("grads", "grad_shard", (layout.shard_numel,), dtype)
        self.param_gather = memory.alloc("work", "param_gather", (layout.max_unit_padded,), dtype)
        self.grad_bucket = memory.alloc("work", "grad_bucket", (layout.max_unit_padded,), dtype)
        self.adam = AdamW(layout.shard_numel, precision, adam_config, memory)

    def owned(self, unit):
        rank, shard = self.comm.rank, self.layout.shard_slice(unit)
        return self.param_shard[shard], self.grad_shard[shard], shard, unit.owned_range(rank)

    def held_params(self, unit):
        return self.param_shard[self.layout.shard_slice(unit)], unit.owned_range(self.comm.rank)

    def store_unit_params(self, unit, values):
        lo, hi = unit.owned_range(self.comm.rank)
        owned_values = values[lo:hi]                 # shorter than the shard where it reaches padding
        self.param_shard[self.layout.shard_slice(unit)][:owned_values.size] = owned_values

    def full_unit_params(self, unit, purpose="io"):
        full = self.param_gather[:unit.padded]
        self.comm.allgather(self.param_shard[self.layout.shard_slice(unit)], full, purpose)
        return full

    def before_forward(self, unit):
        return unit.views(self.full_unit_params(unit, "params"))

    def gather_params(self):
        """Nothing: the next forward gathers each unit when it needs it."""
