"""Hybrid sharding (PyTorch FSDP2's HSDP, DeepSpeed's MiCS): ZeRO inside groups of S ranks, plain
data parallelism across the R = N / S groups.

    N = 8, S = 4 (two nodes of four ranks)                  per rank: the stage's state / S

        node 0   ranks 0 1 2 3   shard group 0     each rank owns a quarter of every layer
        node 1   ranks 4 5 6 7   shard group 1     the same quarters again: a replica
                       |         replica groups {0,4} {1,5} {2,6} {3,7}: the same quarter

    gradients    reduce-scatter inside the group:     g_group[owned] = sum over the group's S ranks
                 all-reduce that shard across the      g[owned] = sum over the R replicas
                 replica group:                                 = sum over all N ranks
    parameters   all-gathered inside the group only (stages 1-2 after the step, stage 3 before
                 each layer's forward and backward): every replica updates its shard alike

Per step and rank, in elements (ring model, zerompi/ledger.py), Psi = the layout's Psi_pad:
    inside the group      reduce-scatter Psi (S-1)/S, all-gathers Psi (S-1)/S (stage 3: twice)
    across the replicas   all-reduce of the owned shard: 2 (Psi/S) (R-1)/R
With S = the ranks of a node, only the replica all-reduce leaves the node: 2 Psi (R-1)/R per node
and step, spread over S rings, against 3 Psi (N-1)/N for flat stage 3, whose one ring crosses
every node boundary.

The stages of zerompi/stages/ run unchanged: their `collectives` here has the group's rank and
size (so the layout is Layout(sizes, S)), and its reduce-scatters add the all-reduce across the
replicas (once per step, after the last micro-batch). One thing differs: the global gradient norm
sums each rank's owned squares over all ranks, and each shard now lives on R ranks, so only the
first replica counts it (Replicated).
"""
from ..collectives import DONE, Collectives
from ..stages import Stage1, Stage2, Stage3


class HybridCollectives(Collectives):
    """The group's collectives, whose gradient reductions also sum across the replicas, once per
    step: after the step's last micro-batch (sums are linear: the replicas' sum of each rank's
    accumulated group sums is the sum over all N ranks and all micro-batches)."""

    def __init__(self, group, replicas):
        super().__init__(group)                  # rank, size: the group's
        self.replicas = replicas                 # the Communicator of the ranks owning the same shard
        self.first_replica = replicas.rank == 0
        self.last_micro_batch = True             # set by the stage (Replicated.start_micro_batch)

    def reduce_scatter(self, full, shard, purpose, accumulate=False):
        """shard (n/S,) <- (or +=) the group's sum of this rank's block of full (n,); after the
        last micro-batch, summed over the replicas too."""
        super().reduce_scatter(full, shard, purpose, accumulate)    # sum over the group
        if self.last_micro_batch:
            self._start(self.replicas.allreduce_sum, shard, purpose)    # sum over the replicas
        return DONE

    def reduce_scatter_in_place(self, full, purpose):
        """full[:n/S] <- the sum over all N ranks of this rank's block of full (n,) (stage 1
        reduces once per step, in the last micro-batch)."""
        super().reduce_scatter_in_place(full, purpose)
        return self._start(self.replicas.allreduce_sum, full[:full.size // self.size], purpose)


class Replicated:
    """A stage inside a shard group: it tells its collectives which micro-batch is the step's
    last (the replicas sum the shards then), and counts the owned gradients for the global norm
    from the first replica only (the others hold the same shards: counting them too would
    multiply the squared norm by R). The others hand in one zero per layer (not an empty array:
    a GPU's sum of squares is a GEMM, which takes no empty operand)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.not_counted = self.memory.alloc("work", "hybrid.not_counted", (1,), self.precision.storage)

    def start_micro_batch(self, first, last=True):
        super().start_micro_batch(first, last)
        self.collectives.last_micro_batch = last

    def grad_partition(self):
        if self.collectives.first_replica:
            return super().grad_partition()
        return [self.not_counted] * len(self.layout.layers)


class HybridStage1(Replicated, Stage1):
    """Stage 1 inside a shard group."""


class HybridStage2(Replicated, Stage2):
    """Stage 2 inside a shard group."""


class HybridStage3(Replicated, Stage3):
    """Stage 3 inside a shard group."""


HYBRID_STAGES = {1: HybridStage1, 2: HybridStage2, 3: HybridStage3}
