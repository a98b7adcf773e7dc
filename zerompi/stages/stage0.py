"""Stage 0: plain data parallelism, the baseline ZeRO improves on.

Every rank holds everything; after backward an all-reduce per unit sums the gradients.

    per rank:  params  [################]  Psi
               grads   [################]  Psi
               Adam    [################]  Psi each for m, v (and the fp32 master in mixed precision)

    timeline:  forward (all units) -> backward (all units, grads into grad_full)
               -> all-reduce grad_full, unit by unit (sum over ranks)
               -> Adam on everything, on every rank

The loss gradient is already divided by the global batch (zerompi/layers.py), so the summed
gradient is the global mean gradient. Every rank then performs the same Adam update on the same
numbers: N copies of identical work and identical memory. That redundancy is what stages 1-3 remove.
Communication per rank: all-reduce of Psi elements = 2 Psi (N-1)/N.
"""
from ..adam import AdamW
from .base import ZeroStage


class Stage0(ZeroStage):
    stage = 0

    def __init__(self, layout, comm, memory, precision, adam_config, micro_batches=1):
        super().__init__(layout, comm, memory, precision, adam_config, micro_batches)
        dtype = precision.storage
        self.param_full = memory.alloc("params", "param_full", (layout.full_numel,), dtype)
        self.grad_full = memory.alloc("grads", "grad_full", (layout.full_numel,), dtype)
        self.adam = AdamW(layout.full_numel, precision, adam_config, memory)   # state for everything

    def owned(self, unit):
        """Stage 0 'owns' all of every unit: (param, grad, Adam state slice, (lo, hi) in the unit)."""
        full = self.layout.full_slice(unit)
        return self.param_full[full], self.grad_full[full], full, (0, unit.padded)

    def grad_partition(self):
        """Every rank holds (and 'owns', for Adam) all of the gradient, but the global norm's
        all-reduce must count each element once: here each rank offers its shard's range."""
        return [self.grad_full[self.layout.owned_slice(unit, self.comm.rank)] for unit in self.layout.units]

    def before_backward(self, unit):
        weight, bias = self.before_forward(unit)
        dweight, dbias = unit.views(self.grad_full[self.layout.full_slice(unit)])
        return weight, bias, dweight, dbias, not self.first_micro_batch   # accumulate after the first

    def reduce_grads(self):
        for unit in self.layout.units:                   # g = sum_r g_r
            self.comm.allreduce_sum(self.grad_full[self.layout.full_slice(unit)], "grads")
