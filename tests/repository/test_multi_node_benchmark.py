"""benchmarks/multi_node.py runs across 2 emulated nodes of 2 ranks (tiny model, one round): every
variant's ledger bytes per node equal the formula's, the ratios to flat stage 3 are the formula's
(2/3 for hpZ), the wire bytes are read from each node's own interface (not the machine's), and
each variant's floor is its wire bytes at the link's best probed rate, the run void exactly when a
variant beat its floor or other processes took more than 10%."""
import json
import os
import sys

import pytest

from support.cluster import run_across

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCHMARK = os.path.join(ROOT, "benchmarks", "multi_node.py")


@pytest.mark.timeout(120, method="signal")     # a timed-out test still takes the cluster down
def test_benchmark_runs_across_nodes_and_its_ledger_equals_the_formula(emulated_cluster, tmp_path):
    out = tmp_path / "multi_node.json"
    command = [sys.executable, BENCHMARK, "--sizes", "128,128,64,10", "--batch-per-rank", "8",
               "--repeats", "1", "--steps", "2", "--json", str(out)]
    result = run_across(emulated_cluster, 2, command, num_nodes=2, timeout=90)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert (report["nodes"], report["ranks_per_node"]) == (2, 2)
    variants = report["variants"]
    assert set(variants) == {"flat3", "hpz3", "qwz3", "qgz3", "qgz3hop", "zeropp3", "hybrid3", "hybrid2", "hybrid1", "flat2",
                             "flat1"}
    for key, v in variants.items():
        assert v["label"] in result.stdout
        assert len(v["ledger_inter_bytes_per_node"]) == 2
        assert v["ledger_inter_bytes_per_node"] == pytest.approx(v["formula_inter_bytes_per_node"], rel=1e-12), key
        # the first rank of each node read its namespace's eth0: the node's own traffic, of the
        # order of what the ring model says crosses (MPI's algorithms and TCP's headers differ)
        wire, ledger = v["wire_tx_bytes_per_node"], v["ledger_inter_bytes_per_node"]
        assert len(wire) == 2 and all(0.8 * b < w < 3 * b for w, b in zip(wire, ledger)), (key, wire, ledger)
    assert report["link_bytes_per_s"] > 0 and report["link_spread"] >= 0
    for v in variants.values():
        assert v["floor_s"] == pytest.approx(max(v["wire_tx_bytes_per_node"]) / report["link_bytes_per_s"])
        assert v["floor_ratio"] == pytest.approx(v["step_s"] / v["floor_s"])
    beaten = [v for v in variants.values() if v["floor_ratio"] < 1]
    assert bool(report["void"]) == bool(beaten or report["others_share"] > 0.1) == ("VOID" in result.stdout)
    assert variants["flat3"]["formula_inter_bytes_ratio"] == 1.0
    assert variants["hpz3"]["formula_inter_bytes_ratio"] == pytest.approx(2 / 3, rel=1e-12)
    n, k = 4, 2                       # hybrid, any stage: 2 Psi (k-1)/k against flat stage 3's 3 Psi (N-1)/N
    for key in ("hybrid1", "hybrid2", "hybrid3"):
        assert variants[key]["ledger_inter_bytes_ratio"] == pytest.approx(2 * (k - 1) / k / (3 * (n - 1) / n), rel=1e-3)
    # quantized, per node of 2 ranks on 2 nodes: a ring crosses once, 3/4 Psi per call, at 4 bytes an
    # element in float32 (flat stage 3: 3 calls); qwZ's two gathers send 1 byte an element (plus 4 per
    # block); qgZ's two hops send one block of Psi / 4 per rank to the other node (the node's sum), at
    # 1 byte, where one flat all-to-all sends each rank's 2 blocks of Psi / 4 to the other node
    flat = 3 * 0.75 * 4
    assert variants["qwz3"]["formula_inter_bytes_ratio"] == pytest.approx((2 * 0.75 + 0.75 * 4) / flat, rel=0.02)
    assert variants["qgz3"]["formula_inter_bytes_ratio"] == pytest.approx((2 * 0.75 * 4 + 0.5) / flat, rel=0.02)
    assert variants["qgz3hop"]["formula_inter_bytes_ratio"] == pytest.approx((2 * 0.75 * 4 + 2 * 0.5) / flat, rel=0.02)
    assert variants["zeropp3"]["formula_inter_bytes_ratio"] < variants["qwz3"]["formula_inter_bytes_ratio"]
