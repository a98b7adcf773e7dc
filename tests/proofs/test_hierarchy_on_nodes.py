"""Hybrid sharding (--shard-group node) and hpZ (--hpz) across the emulated cluster's nodes:
equivalence with single-process AdamW (tests/reference/test_hierarchy_across_node_boundaries.py, run across the
nodes) at N = 4, 6, 8 on 2 and 4 nodes, plans equal to the ledgers across 2 nodes, and the ledger's intra- and inter-node bytes of a real
training run equal to the ring model's formula for every rank (zerompi.memory.ring_traffic).
"""
import json
import os
import re
import sys

import pytest

from support.cluster import run_across
from zerompi.hierarchy import Grouping
from zerompi.memory import ring_traffic

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAYOUTS = [(2, 2), (2, 3), (4, 2)]          # (nodes, ranks per node): N = 4, 6, 8


@pytest.mark.timeout(400)
@pytest.mark.parametrize("nodes,ppn", LAYOUTS, ids=[f"{n}x{p}" for n, p in LAYOUTS])
def test_hierarchical_variants_equal_single_process_adamw_across_nodes(emulated_cluster, nodes, ppn):
    command = [sys.executable, os.path.join(ROOT, "tests", "support", "mpi_launch.py"), "-q", "-x", "-p",
               "no:cacheprovider", "--with-mpi", os.path.join(ROOT, "tests", "reference", "test_hierarchy_across_node_boundaries.py")]
    result = run_across(emulated_cluster, ppn, command, num_nodes=nodes, timeout=360)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert " passed" in result.stdout and "failed" not in result.stdout


@pytest.mark.timeout(400)
def test_plans_equal_the_ledgers_across_nodes(emulated_cluster):
    """zerompi/plan/ on 2 nodes x 2 ranks: every stage's and variant's plan, inter-node bytes
    included, equals the ledgers of a real run (tests/reference/test_plan_equals_ledger.py)."""
    command = [sys.executable, os.path.join(ROOT, "tests", "support", "mpi_launch.py"), "-q", "-x", "-p",
               "no:cacheprovider", "--with-mpi", os.path.join(ROOT, "tests", "reference", "test_plan_equals_ledger.py")]
    result = run_across(emulated_cluster, 2, command, num_nodes=2, timeout=360)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert " passed" in result.stdout and "failed" not in result.stdout


@pytest.mark.timeout(200)
@pytest.mark.parametrize("flags,grouping", [(["--stage", "3", "--shard-group", "node"], "hybrid"),
                                            (["--stage", "2", "--shard-group", "node"], "hybrid"),
                                            (["--stage", "3", "--hpz"], "hpz")], ids=["hybrid-3", "hybrid-2", "hpz"])
def test_ledger_splits_every_rank_as_the_ring_model_says(emulated_cluster, flags, grouping):
    nodes, ppn = 2, 2
    command = [sys.executable, "-m", "zerompi.train", "--hidden", "24,16", "--steps", "3", "--log-every", "0",
               "--report", "json", *flags]
    result = run_across(emulated_cluster, ppn, command, num_nodes=nodes)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    n, psi_pad = nodes * ppn, report["psi_padded"]
    assert report["node_of_rank"] == [r // ppn for r in range(n)]
    variant = {"hybrid": Grouping(shard_group=ppn), "hpz": Grouping(hpz_node_size=ppn)}[grouping]
    expected = ring_traffic(variant.ring_collectives(report["stage"], psi_pad, n), report["node_of_rank"])
    for rank, row in enumerate(report["per_rank"]):
        assert row["inter_node_elements"] == pytest.approx(sum(expected[rank]["inter"].values()), rel=1e-12)
        assert row["intra_node_elements"] == pytest.approx(sum(expected[rank]["intra"].values()), rel=1e-12)
    inter = sum(row["inter_node_elements"] for row in report["per_rank"])
    if grouping == "hybrid":       # only the replicas' all-reduce of the shards crosses: 2 Psi (k-1)/k per node
        assert inter == pytest.approx(nodes * 2 * psi_pad * (nodes - 1) / nodes)
    else:                          # hpZ: 2 Psi (N-1)/N per node (flat stage 3's 3 Psi: tests/reference/test_node_ledgers.py)
        assert inter == pytest.approx(nodes * 2 * psi_pad * (n - 1) / n)
    memory = report["memory_formula_padded_bytes"]["total"]
    assert all(row["params"] + row["grads"] + row["optimizer"] == memory for row in report["per_rank"])


@pytest.mark.timeout(200)
def test_full_zeropp_in_two_hops_trains_the_digits_and_counts_each_hop_across_nodes(emulated_cluster):
    """qwZ + hpZ + qgZ (int4) on 2 nodes x 2 ranks: the gradients reduced in two hops (inside the node,
    then one node's sum between nodes, zerompi/quantize/reduce.py); the default digits reach 95% held
    out; every rank's intra- and inter-node words are the report's formula, and a rank sends one
    owner's block between nodes per step where one all-to-all would send two."""
    nodes, ppn = 2, 2
    command = [sys.executable, "-m", "zerompi.train", "--stage", "3", "--hpz", "--quantize-weights", "int8",
               "--quantize-grads", "int4", "--quant-block", "256", "--log-every", "0", "--report", "json"]
    result = run_across(emulated_cluster, ppn, command, num_nodes=nodes)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert report["two_hops_node_size"] == ppn and report["node_of_rank"] == [0, 0, 1, 1]
    for rank, row in enumerate(report["per_rank"]):
        intra, inter = report["comm_formula_padded_node_elements_per_step"][rank]
        assert row["inter_node_elements"] == pytest.approx(inter, rel=1e-12)
        assert row["intra_node_elements"] == pytest.approx(intra, rel=1e-12)
        # int4 pairs: one owner's shard of every layer, sum_u ceil(n_u / 2) bytes, crosses per step
        shards = [-(-(n_in + 1) * n_out // (nodes * ppn)) for n_in, n_out in ((64, 128), (128, 128), (128, 10))]
        assert row["grads_inter_node_bytes"] == sum(-(-n // 2) for n in shards)
    accuracy = float(re.search(r"held-out accuracy ([\d.]+)%", result.stderr).group(1))
    assert accuracy >= 95, result.stderr[-3000:]
