"""The communicators of the hierarchical variants, and how the ranks are grouped into them.

N ranks in groups of S consecutive ranks (S divides N), R = N / S of them:

    world rank       0  1  2  3 | 4  5  6  7        N = 8, S = 4: two nodes of four ranks
    shard group      0  0  0  0 | 1  1  1  1        color rank // S: the ranks that share shards
    rank in group    0  1  2  3 | 0  1  2  3        = which shard the rank owns
    replica group    0  1  2  3 | 0  1  2  3        color rank % S: the ranks that own the same shard

Launchers place ranks on nodes in blocks (rank r on node r // L with L ranks per node: mpiexec
-ppn L, srun's default block distribution), so a shard group of S = L ranks is a node, and a
replica group holds one rank of each node. `node_size` checks that placement and returns L.

Each subset is a Communicator of its own (Communicator.split) that records into the world's
ledger, so the report counts every byte, inside the node and between nodes.
"""
from ..collectives import Collectives
from .hpz import HpzStage3
from .hybrid import HYBRID_STAGES, HybridCollectives


def node_size(comm):
    """(L, error): the ranks on each node, and a one-line error unless every node holds L
    consecutive ranks (block placement). Read from the node map every rank holds alike
    (Communicator.node_of_rank), so every rank returns the same: no messages."""
    node_of_rank = comm.node_of_rank
    size = node_of_rank.count(node_of_rank[0])
    sizes = [node_of_rank.count(node) for node in range(len(set(node_of_rank)))]
    need = ("hierarchical ZeRO needs the same number of ranks on every node, placed in blocks "
            "(mpiexec -ppn L, srun's default --distribution=block)")
    if len(set(sizes)) > 1:
        return size, f"the nodes hold {_listed(sizes)} ranks: {need}"
    for node in range(len(sizes)):
        ranks = [r for r, n in enumerate(node_of_rank) if n == node]
        if ranks != list(range(node * size, (node + 1) * size)):
            return size, f"ranks {_listed(ranks)} share a node: {need}"
    return size, None


def _listed(numbers, most=8):
    """'3, 1' or '0, 2, 4, 6, 8, 10, 12, 14, ...' (at most `most` of them)."""
    return ", ".join(map(str, numbers[:most])) + (", ..." if len(numbers) > most else "")


def shard_group_error(group_size, num_ranks):
    """One line unless the shard group size S divides N (None when it does)."""
    if group_size < 1 or num_ranks % group_size:
        return (f"--shard-group {group_size} does not divide the {num_ranks} ranks: use a divisor of {num_ranks} "
                f"(or `node`, or `world`)")
    return None


def node_groups(comm, group_size):
    """(the S consecutive ranks of this rank's group, rank // S; the R = N / S ranks of its place in
    every group, rank % S): with S the ranks per node, the node and one rank of each node (also
    zerompi/quantize/'s two hops). Collective."""
    return comm.split(lambda rank: rank // group_size), comm.split(lambda rank: rank % group_size)


class HybridSharding:
    """ZeRO inside groups of S consecutive ranks, data parallel across the R = N / S groups."""

    def __init__(self, comm, group_size):
        # S ranks: the stage's shards span it; R ranks: one of each group
        self.shard_comm, self.replica_comm = node_groups(comm, group_size)
        self.communicators = (self.shard_comm, self.replica_comm)

    @staticmethod
    def stage_class(stage_number):
        return HYBRID_STAGES[stage_number]

    def build_stage(self, stage_number, layout, memory, precision, adam_config, start_collectives, **options):
        """start_collectives is not used: the groups' collectives are HybridCollectives."""
        if precision.mixed:               # 16-bit all-reduces across replicas are summed in float32
            self.replica_comm.reserve_staging(memory, layout.max_layer_padded // layout.num_ranks,
                                              precision.compute)
        collectives = HybridCollectives(self.shard_comm, self.replica_comm)
        return self.stage_class(stage_number)(layout, collectives, memory, precision, adam_config, **options)


class Hpz:
    """Stage 3 over all N ranks, plus a secondary partition of the parameters over the L ranks of
    each node (consecutive ranks, as `node_size` checks)."""

    def __init__(self, comm, ranks_per_node):
        self.shard_comm = comm
        self.node_comm = comm.split(lambda rank: rank // ranks_per_node)
        self.communicators = (self.node_comm,)

    @staticmethod
    def stage_class(stage_number):
        return HpzStage3

    def build_stage(self, stage_number, layout, memory, precision, adam_config, start_collectives, **options):
        """start_collectives: the world's (zerompi/quantize/'s with --quantize-weights); the node's
        gathers are exact."""
        return HpzStage3(layout, start_collectives(self.shard_comm), memory, precision, adam_config,
                         Collectives(self.node_comm), **options)
