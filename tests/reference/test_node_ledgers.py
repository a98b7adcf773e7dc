"""Node-aware ledgers: each collective's ring volume split into intra- and inter-node bytes.

    split logic   with fake node maps (ranks in blocks, uneven blocks, round-robin, one node): the
                  nodes numbered by their lowest rank, which ranks send across (their ring
                  successor rank+1 mod N is on another node), the flat-ring formula of
                  zerompi.memory, and a ledger shared by communicators on different ranks
    one host      mpirun with N = 2, 3, 4: every rank on node 0, no inter-node bytes, intra = total
    emulated      2 nodes x 2 ranks (stages 0-3), 4 nodes x 1 rank and 2 nodes x 3 ranks (stages 0
    cluster       and 3: the all-reduce, and the reduce-scatter and all-gathers that stages 1 and 2
                  make too): `--report json`'s intra/inter split equals
                  the flat-ring formula exactly for every rank, and `--metrics` carries each rank's
                  inter-node bytes;
                  the node map of every Communicator against the host names
                  (tests/reference/test_nodes_of_ranks.py run across the nodes)

The expected split is written out here from the placement (ranks in blocks of `ppn`: the last rank
of each node sends across when there are several nodes), not taken from zerompi's functions.
"""
import json
import os
import sys

import numpy as np
import pytest

from test_cli import train_ok
from zerompi.control import ControlMessages
from zerompi.ledger import ALLGATHER, ALLREDUCE, GRADS, PARAMS, CommLedger
from zerompi.memory import RingCollective, ring_traffic
from zerompi.nodes import number_nodes, sends_across_nodes

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEPS = 3


def blocks(nodes, ppn):
    return tuple(r // ppn for r in range(nodes * ppn))


def round_robin(nodes, ppn):
    return tuple(r % nodes for r in range(nodes * ppn))


# ----------------------------------------------------------------------------------------------
# The split logic, with fake node maps
# ----------------------------------------------------------------------------------------------

def test_nodes_are_numbered_by_their_lowest_rank():
    assert number_nodes([0, 0, 0, 3, 3, 3]) == (0, 0, 0, 1, 1, 1)
    assert number_nodes([0, 1, 0, 1]) == (0, 1, 0, 1)                  # round-robin
    assert number_nodes([0, 0, 2, 3, 3, 3]) == (0, 0, 1, 2, 2, 2)      # uneven
    assert number_nodes([0]) == (0,)


@pytest.mark.parametrize("node_of_rank, senders", [
    (blocks(2, 2), [1, 3]),
    (blocks(4, 1), [0, 1, 2, 3]),
    (blocks(2, 3), [2, 5]),
    (blocks(3, 4), [3, 7, 11]),
    ((0, 0, 1, 2, 2, 2), [1, 2, 5]),                   # uneven blocks: 2, 1 and 3 ranks
    (round_robin(2, 3), [0, 1, 2, 3, 4, 5]),
    (round_robin(3, 2), [0, 1, 2, 3, 4, 5]),
    (blocks(1, 4), []),
    ((0,), []),
], ids=["2x2", "4x1", "2x3", "3x4", "uneven", "round-robin-2x3", "round-robin-3x2", "one-node", "one-rank"])
def test_a_rank_sends_across_when_its_ring_successor_is_on_another_node(node_of_rank, senders):
    n, volume = len(node_of_rank), 1000.0
    assert [r for r in range(n) if sends_across_nodes(node_of_rank, r)] == senders
    ring = RingCollective("grads", 1, volume * n / max(n - 1, 1), (tuple(range(n)),))   # V per rank
    split = [(t["intra"]["grads"], t["inter"]["grads"]) for t in ring_traffic([ring], node_of_rank)]
    if n > 1:
        assert split == [pytest.approx((0.0, volume)) if r in senders else pytest.approx((volume, 0.0))
                         for r in range(n)]
    nodes = len(set(node_of_rank))
    if node_of_rank == tuple(sorted(node_of_rank)) and nodes > 1:      # blocks: k crossings, one per node
        assert sum(inter for _, inter in split) == nodes * volume


class LedgerUser:
    """A stand-in communicator: its ranks' nodes and the ledger it records into."""

    def __init__(self, ledger, node_of_rank, rank):
        self.ledger, self.size = ledger, len(node_of_rank)
        self.across_nodes = sends_across_nodes(node_of_rank, rank)

    def call(self, op, purpose, buffer):
        self.ledger.record(op, purpose, buffer, self.size, 0.0, 1.0, self.across_nodes)


def test_a_shared_ledger_splits_each_call_by_the_communicator_that_made_it():
    """Rank 3 of 2 nodes x 2 ranks sends across in the world; in its node group it does not, and
    in a group of ranks 1 and 3 (one per node) it does."""
    ledger = CommLedger()
    world = LedgerUser(ledger, blocks(2, 2), rank=3)
    node_group = LedgerUser(ledger, (1, 1), rank=1)
    replica_group = LedgerUser(ledger, (0, 1), rank=1)
    buf = np.zeros(16, dtype=np.float32)                                # 64 bytes
    world.call(ALLREDUCE, GRADS, buf)              # 2 x 3/4 x 64 = 96 bytes, inter-node
    node_group.call(ALLGATHER, PARAMS, buf)        # 1/2 x 64 = 32 bytes, intra-node
    replica_group.call(ALLREDUCE, GRADS, buf)      # 2 x 1/2 x 64 = 64 bytes, inter-node
    assert ledger.totals({GRADS})[1:3] == (160.0, 40.0)
    assert ledger.inter_node({GRADS}) == (160.0, 40.0)
    assert ledger.totals({PARAMS})[1] == 32.0 and ledger.inter_node({PARAMS}) == (0.0, 0.0)


def test_ranks_on_this_node_count_the_node_map():
    control = ControlMessages()
    control.node_of_rank = (0, 0, 1, 2, 2, 2)
    for rank, count in enumerate([2, 2, 1, 3, 3, 3]):
        control.rank = rank
        assert control.ranks_on_this_node() == count


# ----------------------------------------------------------------------------------------------
# Runs: the report and the metrics
# ----------------------------------------------------------------------------------------------

def flags(stage, metrics):
    return ["--stage", stage, "--steps", STEPS, "--hidden", "24,16", "--log-every", 0, "--report", "json",
            "--metrics", metrics]


def check_split(report, metrics_lines, nodes, ppn):
    """The report's and the metrics' intra/inter split against the placement: ranks in blocks of
    ppn, the last rank of each node sending across when there are several nodes."""
    n = nodes * ppn
    senders = [r for r in range(n) if nodes > 1 and (r + 1) % ppn == 0]
    volume = report["comm_formula_padded_elements_per_step"]
    assert report["nodes"] == nodes and report["node_of_rank"] == [r // ppn for r in range(n)]
    assert report["comm_formula_padded_node_elements_per_step"] == [
        [0.0, volume] if r in senders else [volume, 0.0] for r in range(n)]
    for r, row in enumerate(report["per_rank"]):
        inter = r in senders
        assert row["grads_elements"] + row["params_elements"] == volume
        assert (row["intra_node_elements"], row["inter_node_elements"]) == ((0.0, volume) if inter else (volume, 0.0))
        for purpose in ("grads", "params"):
            ring_bytes = 4 * row[f"{purpose}_elements"]                                    # float32
            assert (row[f"{purpose}_intra_node_bytes"], row[f"{purpose}_inter_node_bytes"]) == (
                (0.0, ring_bytes) if inter else (ring_bytes, 0.0))
    assert sum(row["inter_node_elements"] for row in report["per_rank"]) == len(senders) * volume
    gathered = [line for line in metrics_lines if "comm_per_rank" in line]
    assert [line["step"] for line in gathered] == [1, STEPS]
    for line in gathered:
        per_rank = line["comm_per_rank"]
        assert per_rank["inter_node_bytes"] == [per_rank["bytes"][r] if r in senders else 0.0 for r in range(n)]
        assert line["comm"]["grads"]["inter_node_bytes"] == (line["comm"]["grads"]["bytes"] if 0 in senders else 0.0)


def read_lines(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


@pytest.mark.parametrize("n, stage", [(2, 3), (3, 0), (4, 1), (4, 2)])
def test_on_one_host_every_byte_is_intra_node(n, stage, tmp_path):
    run = train_ok(n, *flags(stage, "m.jsonl"), cwd=tmp_path)
    check_split(json.loads(run.stdout), read_lines(tmp_path / "m.jsonl"), nodes=1, ppn=n)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("nodes, ppn, stages", [(2, 2, (0, 1, 2, 3)), (4, 1, (0, 3)), (2, 3, (0, 3))],
                         ids=["2x2", "4x1", "2x3"])
def test_across_emulated_nodes_the_split_equals_the_flat_ring_formula(emulated_cluster, nodes, ppn, stages, tmp_path):
    from support.cluster import run_across
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]))
    for stage in stages:
        metrics = tmp_path / f"stage{stage}.jsonl"
        run = run_across(emulated_cluster, ppn, [sys.executable, "-m", "zerompi.train", *map(str, flags(stage, metrics))],
                         num_nodes=nodes, timeout=120, env=env)
        assert run.returncode == 0, run.stderr
        check_split(json.loads(run.stdout), read_lines(metrics), nodes, ppn)
    run = run_across(emulated_cluster, ppn, [sys.executable, os.path.join(REPO, "tests", "support", "mpi_launch.py"),
                                             "-q", "-p", "no:cacheprovider", "--with-mpi",
                                             os.path.join(REPO, "tests", "reference", "test_nodes_of_ranks.py")],
                     num_nodes=nodes, timeout=120, env=env)
    assert run.returncode == 0 and "2 passed" in run.stdout, run.stdout + run.stderr
