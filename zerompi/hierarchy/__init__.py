"""Hierarchical ZeRO: the variants that multi-node training uses, beside the four stages.

On a cluster, the links inside a node (shared memory, NVLink) are much faster than the network
between nodes. Both variants here keep some of ZeRO's traffic inside the node, at some memory cost:

    hybrid sharding   --shard-group G      ZeRO stage 1-3 inside each group of G consecutive
    (FSDP2's HSDP,                         ranks (a node, with G = ranks per node), plain data
     DeepSpeed's MiCS)                     parallelism across the N/G groups: memory / G, not / N
                                           (zerompi/hierarchy/hybrid.py)
    hpZ (ZeRO++)      --hpz                stage 3 with a second copy of the parameters sharded
                                           inside the node: backward's all-gathers never leave it
                                           (zerompi/hierarchy/hpz.py)

Both reuse the stages (zerompi/stages/), the layout and the collectives unchanged: they only build
communicators over subsets of the ranks (groups.py, Communicator.split) and hand the stage a
`collectives` or a second gather over them. The stage files do not know they exist.
"""
from dataclasses import dataclass

from .groups import HybridSharding, Hpz


@dataclass(frozen=True)
class Grouping:
    shard_group: int = 0     # G: ranks that share the shards (0: all N, flat ZeRO)
    hpz_node_size: int = 0   # L: ranks per node for hpZ's secondary partition (0: no hpZ)


FLAT = Grouping()


def hierarchy_for(comm, grouping):
    """The hierarchical variant for grouping (collective: it splits comm), or None when flat."""
    if grouping.shard_group and grouping.shard_group != comm.size:
        return HybridSharding(comm, grouping.shard_group)
    if grouping.hpz_node_size:
        return Hpz(comm, grouping.hpz_node_size)
    return None
