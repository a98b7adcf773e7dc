"""Stage 0: plain data parallelism, the baseline ZeRO improves on.

Every rank holds everything; after backward one all-reduce sums the gradients.

    per rank:  params  [################]  Psi
               grads   [################]  Psi
               Adam m  [################]  Psi
               Adam v  [################]  Psi

    timeline:  forward (all units) -> backward (all units, grads into grad_full)
               -> all-reduce grad_full (sum over ranks) -> Adam on everything, on every rank

The loss gradient is already divided by the global batch (zerompi/layers.py), so the summed
gradient is the global mean gradient. Every rank then performs the same Adam update on the same
numbers: N copies of identical work and identical memory. That redundancy is what stages 1-3 remove.
Communication per rank: all-reduce of Psi elements = 2 Psi (N-1)/N.
"""
from ..adam import AdamW
from .base import ZeroStage


class Stage0(ZeroStage):
    stage = 0

    def __init__(self, layout, comm, memory, dtype, adam_config):
        super().__init__(layout, comm, memory, dtype, adam_config)
        self.param_full = memory.alloc("params", "param_full", (layout.full_numel,), dtype)
        self.grad_full = memory.alloc("grads", "grad_full", (layout.full_numel,), dtype)
        self.adam = AdamW(layout.full_numel, dtype, adam_config, memory)   # m, v for everything

    def before_backward(self, unit):
        weight, bias = self.before_forward(unit)
        dweight, dbias = unit.views(self.grad_full[self.layout.full_slice(unit)])
        return weight, bias, dweight, dbias

    def step(self):
        self.comm.allreduce_sum(self.grad_full, "grads")        # g = sum_r g_r
        self.adam.begin_step()
        self.adam.update(self.param_full, self.grad_full, slice(None))
