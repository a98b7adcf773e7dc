"""Which node each rank of a communicator runs on, and whether its ring bytes leave the node.

A node is the set of ranks that share memory: MPI_Comm_split_type(COMM_TYPE_SHARED) splits a
communicator into one sub-communicator per node. The nodes of a communicator are numbered 0..k-1
in the order of their lowest rank:

    rank          0  1  2  3  4  5        (3 ranks on each of 2 hosts, in blocks)
    node_of_rank  0  0  0  1  1  1

Each rank finds the lowest rank of its own node without messages (its node's rank 0, in the
communicator's numbering: the split keeps the communicator's order), then one Allgather of one
number per rank tells every rank everyone's. A communicator built on a sub-communicator (a group
of the world's ranks) numbers its own ranks and nodes.

The ring model of the ledger (zerompi/ledger.py): in a flat ring over the communicator's ranks in
rank order, each rank sends its whole ring volume to its successor, rank+1 mod N. This rank's bytes
are inter-node exactly when its successor is on another node:

    rank   0 --> 1 --> 2 ==> 3 --> 4 --> 5 ==> (0)        ==> leaves the node: ranks 2 and 5
"""
import numpy as np

from .mpi import MPI


def node_of_rank(mpi_comm):
    """Collective: the node (0..k-1) of each rank of mpi_comm, as a tuple in rank order."""
    node = mpi_comm.Split_type(MPI.COMM_TYPE_SHARED)
    node_group, group = node.Get_group(), mpi_comm.Get_group()
    lowest = np.array(MPI.Group.Translate_ranks(node_group, [0], group), dtype=np.int64)
    node_group.Free()
    group.Free()
    node.Free()
    lowest_of_rank = np.zeros(mpi_comm.Get_size(), dtype=np.int64)
    mpi_comm.Allgather(lowest, lowest_of_rank)
    return number_nodes(lowest_of_rank.tolist())


def number_nodes(lowest_of_rank):
    """Each rank's node numbered 0..k-1 by the nodes' lowest ranks, from each rank's node's lowest
    rank: [0, 0, 2, 2, 4] -> (0, 0, 1, 1, 2)."""
    index = {lowest: i for i, lowest in enumerate(sorted(set(lowest_of_rank)))}
    return tuple(index[lowest] for lowest in lowest_of_rank)


def sends_across_nodes(node_of_rank, rank):
    """Whether `rank`'s successor in the flat ring (rank+1 mod N) is on another node."""
    return node_of_rank[rank] != node_of_rank[(rank + 1) % len(node_of_rank)]


def share_to_other_nodes(node_of_rank, rank):
    """The share of `rank`'s all-to-all blocks (one to each other rank) that go to another node."""
    others = len(node_of_rank) - 1
    return sum(node != node_of_rank[rank] for node in node_of_rank) / others if others else 0.0
