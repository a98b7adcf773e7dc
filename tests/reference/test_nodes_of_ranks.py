"""The node of every rank, as each Communicator learns it (zerompi/nodes.py), against an independent
source: MPI_Get_processor_name, which is the host's name (on the emulated cluster, the node's).

Run on one host (every rank on node 0) and, by tests/reference/test_node_ledgers.py, across the nodes of the
emulated cluster: the world's node map, a sub-communicator's own map (its ranks and nodes numbered
anew), and a ledger shared by both that splits each call's bytes by the communicator that made it.
"""
import numpy as np
import pytest
from mpi4py import MPI

from zerompi.comm import Communicator
from zerompi.ledger import GRADS

N_ELEMENTS = 24                    # divisible by every N tested


def numbered_by_lowest_rank(names):
    """Each rank's node from the host names in rank order: nodes numbered by their first rank."""
    first = {}
    for name in names:
        first.setdefault(name, len(first))
    return tuple(first[name] for name in names)


def host_names(mpi_comm):
    return mpi_comm.allgather(MPI.Get_processor_name())


def ring_volume(buffer, size):
    """The ledger's ring volume of one all-reduce (zerompi/ledger.py), in bytes."""
    return 2 * (size - 1) / size * buffer.nbytes


@pytest.mark.mpi
def test_each_rank_knows_the_node_of_every_rank():
    comm = Communicator()
    names = host_names(comm.mpi)
    assert comm.node_of_rank == numbered_by_lowest_rank(names)
    assert comm.ranks_on_this_node() == names.count(names[comm.rank])
    successor = (comm.rank + 1) % comm.size
    assert comm.across_nodes == (names[successor] != names[comm.rank])


@pytest.mark.mpi
def test_a_sub_communicator_numbers_its_own_ranks_and_nodes_and_shares_the_ledger():
    world = Communicator()
    sub = Communicator(world.mpi.Split(world.rank % 2, world.rank))    # even and odd world ranks
    sub.ledger = world.ledger
    names = host_names(sub.mpi)
    assert sub.node_of_rank == numbered_by_lowest_rank(names)
    assert sub.across_nodes == (names[(sub.rank + 1) % sub.size] != names[sub.rank])

    buf = np.ones(N_ELEMENTS)
    world.allreduce_sum(buf, GRADS)
    sub.allreduce_sum(buf, GRADS)
    in_world, in_sub = ring_volume(buf, world.size), ring_volume(buf, sub.size)
    inter_bytes, _ = world.ledger.inter_node({GRADS})
    assert world.ledger.totals({GRADS})[1] == in_world + in_sub
    assert inter_bytes == world.across_nodes * in_world + sub.across_nodes * in_sub
    sub.mpi.Free()
