"""Hierarchical ZeRO: the variants that multi-node training uses, beside the four stages.

On a cluster, the links inside a node (shared memory, NVLink) are much faster than the network
between nodes. Both variants here keep some of ZeRO's traffic inside the node, at some memory cost:

    hybrid sharding   --shard-group S      ZeRO stage 1-3 inside each group of S consecutive
    (FSDP2's HSDP,                         ranks (a node, with S = ranks per node), plain data
     DeepSpeed's MiCS)                     parallelism across the N/S groups: memory / S, not / N
                                           (zerompi/hierarchy/hybrid.py)
    hpZ (ZeRO++)      --hpz                stage 3 with a second copy of the parameters sharded
                                           inside the node: backward's all-gathers never leave it
                                           (zerompi/hierarchy/hpz.py)

Both reuse the stages (zerompi/stages/), the layout and the collectives unchanged: they only build
communicators over subsets of the ranks (groups.py, Communicator.split) and hand the stage a
`collectives` or a second gather over them. The stage files do not know they exist.
"""
from dataclasses import dataclass

from ..memory import (flat_collectives, hpz_collectives, hpz_model_state_bytes, hybrid_collectives,
                      hybrid_model_state_bytes, model_state_bytes)
from .groups import HybridSharding, Hpz, node_groups
from ..util.words import counted

__all__ = ["FLAT", "Grouping", "HybridSharding", "Hpz", "hierarchy_for", "node_groups"]


@dataclass(frozen=True)
class Grouping:
    shard_group: int = 0     # S: ranks that share the shards (0: all N, flat ZeRO)
    hpz_node_size: int = 0   # L: ranks per node for hpZ's secondary partition (0: no hpZ)

    def hybrid(self, num_ranks):
        return 0 < self.shard_group < num_ranks

    def describe(self, stage, num_ranks):
        """'ZeRO stage 3 on 8 ranks', '... in groups of 4 (2 replicas)', '... with hpZ (4 per node)'."""
        text = f"ZeRO stage {stage} on {counted(num_ranks, 'rank')}"
        if self.hybrid(num_ranks):
            return f"{text} in groups of {self.shard_group} ({num_ranks // self.shard_group} replicas)"
        return f"{text} with hpZ ({self.hpz_node_size} per node)" if self.hpz_node_size else text

    def model_state_bytes(self, stage, num_params, num_ranks, bytes_per_param):
        """zerompi.memory's model state per rank for this grouping."""
        if self.hybrid(num_ranks):
            return hybrid_model_state_bytes(stage, num_params, num_ranks, self.shard_group, bytes_per_param)
        if self.hpz_node_size:
            return hpz_model_state_bytes(num_params, num_ranks, self.hpz_node_size, bytes_per_param)
        return model_state_bytes(stage, num_params, num_ranks, bytes_per_param)

    def ring_collectives(self, stage, num_params, num_ranks, micro_batches=1, kept=0):
        """zerompi.memory's ring collectives of one step for this grouping (kept: the elements
        stage 3's backward does not gather again, --keep-last-layer's last layer)."""
        if self.hybrid(num_ranks):
            return hybrid_collectives(stage, num_params, num_ranks, self.shard_group, micro_batches, kept)
        if self.hpz_node_size:
            return hpz_collectives(num_params, num_ranks, self.hpz_node_size, micro_batches, kept)
        return flat_collectives(stage, num_params, num_ranks, micro_batches, kept)


FLAT = Grouping()


def hierarchy_for(comm, grouping):
    """The hierarchical variant for grouping (collective: it splits comm), or None when flat."""
    if grouping.hybrid(comm.size):
        return HybridSharding(comm, grouping.shard_group)
    if grouping.hpz_node_size:
        return Hpz(comm, grouping.hpz_node_size)
    return None
