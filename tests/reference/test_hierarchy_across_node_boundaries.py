"""Hybrid sharding and hpZ on real node boundaries: run across the emulated cluster's nodes by
tests/proofs/test_hierarchy_on_nodes.py (2 nodes x 2 and x 3 ranks, 4 nodes x 2), where the groups come
from where MPI says the ranks are (zerompi/hierarchy/groups.py), not from a number given.

float64, 1e-12 relative, as test_zero_equals_single_process_adamw.py; uneven widths.
"""
import numpy as np
import pytest
from mpi4py import MPI

from helpers import STEPS, consolidated, make_batches, reference, train_zero
from test_zero_equals_single_process_adamw import SIZES, assert_close_f64, size_id
from zerompi.comm import Communicator
from zerompi.hierarchy import Grouping
from zerompi.hierarchy.groups import node_size
from zerompi.mpi import init_mpi

pytestmark = pytest.mark.mpi
init_mpi()                                  # where the ranks are is asked when the module is collected
if MPI.COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED).Get_size() == MPI.COMM_WORLD.Get_size():
    pytest.skip("runs across nodes (tests/proofs/test_hierarchy_on_nodes.py starts it on the emulated cluster)",
                allow_module_level=True)


def ranks_per_node():
    comm = Communicator()
    size, error = node_size(comm)
    assert error is None
    return size, comm


def test_nodes_hold_the_ranks_in_blocks():
    size, comm = ranks_per_node()
    assert comm.node_of_rank == tuple(r // size for r in range(comm.size))


@pytest.mark.parametrize("sizes", SIZES[:2], ids=size_id)
@pytest.mark.parametrize("stage,hpz", [(1, False), (2, False), (3, False), (3, True)],
                         ids=["hybrid-1", "hybrid-2", "hybrid-3", "hpz"])
def test_node_groupings_equal_single_process_adamw(stage, hpz, sizes):
    size, comm = ranks_per_node()
    grouping = Grouping(hpz_node_size=size) if hpz else Grouping(shard_group=size)
    batches = make_batches(sizes, STEPS)
    engine, results = train_zero(stage, sizes, np.float64, batches, comm, grouping=grouping)
    want, norms = reference(sizes, np.float64, batches)
    assert_close_f64(consolidated(engine), want)
    assert [r.grad_norm for r in results] == pytest.approx(norms, rel=1e-12)
