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
               param_gather  [#####]  one unit, reused (work memory; 1 + prefetch with overlap)
               grad_bucket   [#####]  one unit, reused (work memory; two with overlap)

    timeline:  forward, per unit u:  all-gather param_shard[u] -> param_gather; forward u
               backward, last unit first:  all-gather again; backward u into grad_bucket;
                                           reduce-scatter grad_bucket -> grad_shard[u]
               step: Adam on param_shard with grad_shard
               (no all-gather after the step: the next forward gathers what it needs)

Prefetch (overlap on, --prefetch P): when a unit's parameters are taken, the all-gathers of the
next P units of the same pass (forward: u+1, u+2, ...; backward: u-1, u-2, ...) are started
on the communication thread, each into its own one-unit buffer, so they arrive while unit u
computes. A prefetch is never carried across passes or steps (the parameters change in the step,
and an unused all-gather would be wasted traffic); one that does not match the unit asked for
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
    """Stage 2 with the parameters sharded too: gathered per unit in before_forward and again in
    params_for_backward (which Stage2.before_backward calls); after_backward is Stage 2's."""

    stage = 3

    def __init__(self, layout, comm, memory, precision, adam_config, micro_batches=1,
                 overlap=OverlapConfig()):
        # no param_full: the parent's constructor is not called
        ZeroStage.__init__(self, layout, comm, memory, precision, adam_config, micro_batches, overlap)
        dtype = precision.storage
        self.param_shard = memory.alloc("params", "param_shard", (layout.shard_numel,), dtype)
        self.grad_shard = memory.alloc("grads", "grad_shard", (layout.shard_numel,), dtype)
        self.prefetch = min(overlap.prefetch, len(layout.units) - 1) if overlap.enabled else 0
        self.param_gathers = self.alloc_unit_buffers("param_gather", 1 + self.prefetch)
        self.gathers_ahead = deque()     # (unit index, buffer index, ticket), in the order of use
        self.gather_in_use = None        # the buffer the current unit computes with
        self.alloc_grad_buckets()
        self.adam = AdamW(layout.shard_numel, precision, adam_config, memory)

    def owned(self, unit):
        rank, shard = self.comm.rank, self.layout.shard_slice(unit)
        return self.param_shard[shard], self.grad_shard[shard], shard, unit.owned_range(rank)

    def held_params(self, unit):
        self.finish_communication()
        return self.param_shard[self.layout.shard_slice(unit)], unit.owned_range(self.comm.rank)

    def store_unit_params(self, unit, values):
        self.finish_communication()
        lo, hi = unit.owned_range(self.comm.rank)
        owned_values = values[lo:hi]                 # shorter than the shard where it reaches padding
        self.param_shard[self.layout.shard_slice(unit)][:owned_values.size] = owned_values

    def full_unit_params(self, unit, purpose="io"):
        self.finish_communication()
        full = self.param_gathers[0][:unit.padded]
        self.comm.allgather(self.param_shard[self.layout.shard_slice(unit)], full, purpose)
        return full

    def finish_communication(self):
        super().finish_communication()
        self.gathers_ahead.clear()       # prefetched parameters may be stale after this

    def before_forward(self, unit):
        return unit.views(self.gathered(unit, self.layout.units[unit.index + 1:]))

    def params_for_backward(self, unit):
        return unit.views(self.gathered(unit, self.layout.units[unit.index - 1::-1] if unit.index else []))

    def gathered(self, unit, upcoming):
        """The unit's full parameters (padded,), all-gathered now or by an earlier prefetch; first
        starts the all-gathers of the next `prefetch` units of `upcoming` (the rest of the pass)."""
        self.gather_in_use = None        # the previous unit's compute is done with its buffer
        expected = [u.index for u in [unit, *upcoming[:len(self.gathers_ahead) - 1]]]
        if self.gathers_ahead and [index for index, _, _ in self.gathers_ahead] != expected:
            self.finish_communication()  # not what was prefetched: drop it
        if not self.gathers_ahead:
            self.start_gather(unit)
        _, self.gather_in_use, ticket = self.gathers_ahead.popleft()
        for next_unit in upcoming[len(self.gathers_ahead):self.prefetch]:
            self.start_gather(next_unit)
        self.queue.wait(ticket)
        return self.param_gathers[self.gather_in_use][:unit.padded]

    def start_gather(self, unit):
        """All-gather the unit's parameters into a buffer that nothing computes with or waits on."""
        busy = {self.gather_in_use} | {index for _, index, _ in self.gathers_ahead}
        index = next(i for i in range(len(self.param_gathers)) if i not in busy)
        ticket = self.queue.submit("allgather", self.param_shard[self.layout.shard_slice(unit)],
                                   self.param_gathers[index][:unit.padded], "params")
        self.gathers_ahead.append((unit.index, index, ticket))

    def gather_params(self):
        """Nothing: the next forward gathers each unit when it needs it."""
