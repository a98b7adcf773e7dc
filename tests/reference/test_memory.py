"""Tests for zerompi.memory: the ZeRO memory and communication formulas and the CLI."""

import os
import re
import subprocess
import sys

import pytest

from zerompi.memory import (
    FP32,
    MIXED_PRECISION,
    BytesPerParam,
    comm_elements_per_step,
    flat_collectives,
    hpz_collectives,
    hpz_model_state_bytes,
    hybrid_collectives,
    hybrid_model_state_bytes,
    inter_node_per_node,
    model_state_bytes,
    ring_traffic_per_rank,
    wire_bytes,
)
from zerompi.train.commands.memory_table import main

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# The source article's table for a 7B model, mixed-precision Adam.
TABLE_7B = """\
Per-GPU memory (GB) for a 7B parameter model
  GPUs    Baseline    Stage 1    Stage 2    Stage 3
----------------------------------------------------
     1      112.0G     112.0G     112.0G     112.0G
     4      112.0G      49.0G      38.5G      28.0G
     8      112.0G      38.5G      26.2G      14.0G
    16      112.0G      33.2G      20.1G       7.0G
    32      112.0G      30.6G      17.1G       3.5G
    64      112.0G      29.3G      15.5G       1.8G
   128      112.0G      28.7G      14.8G       0.9G
"""


def test_bytes_per_param_presets():
    assert MIXED_PRECISION == BytesPerParam(param=2, grad=2, optimizer=12)
    assert FP32 == BytesPerParam(param=4, grad=4, optimizer=8)


def test_cli_prints_source_article_table_for_7b(capsys):
    assert main(["--params", "7e9"]) == 0
    out = capsys.readouterr().out
    assert TABLE_7B in out


def test_cli_via_subprocess():
    result = subprocess.run(
        [sys.executable, "-m", "zerompi.memory", "--params", "7e9"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert TABLE_7B in result.stdout


def test_zero_paper_figure_1():
    # Ψ = 7.5B, N = 64, K = 12: 120 GB, 31.4 GB, 16.6 GB, 1.9 GB.
    expected_gb = {0: 120.0, 1: 31.4, 2: 16.6, 3: 1.9}
    for stage, gb in expected_gb.items():
        total = model_state_bytes(stage, 7.5e9, 64, MIXED_PRECISION)["total"]
        assert round(total / 1e9, 1) == gb, stage


def test_fp32_hand_computed():
    # Ψ = 1000, N = 4, P = 4, G = 4, K = 8.
    expected = {
        0: {"params": 4000, "grads": 4000, "optimizer": 8000, "total": 16000},
        1: {"params": 4000, "grads": 4000, "optimizer": 2000, "total": 10000},
        2: {"params": 4000, "grads": 1000, "optimizer": 2000, "total": 7000},
        3: {"params": 1000, "grads": 1000, "optimizer": 2000, "total": 4000},
    }
    for stage, want in expected.items():
        assert model_state_bytes(stage, 1000, 4, FP32) == pytest.approx(want), stage


def test_one_rank_partitions_nothing():
    baseline = model_state_bytes(0, 1e6, 1, MIXED_PRECISION)
    assert baseline["total"] == 16e6
    for stage in (1, 2, 3):
        assert model_state_bytes(stage, 1e6, 1, MIXED_PRECISION) == baseline


def test_custom_bytes_per_param():
    b = BytesPerParam(param=1, grad=3, optimizer=5)
    assert model_state_bytes(2, 100, 10, b) == pytest.approx(
        {"params": 100, "grads": 30, "optimizer": 50, "total": 180})


@pytest.mark.parametrize("num_ranks", [2, 4, 8, 64])
def test_comm_volume(num_ranks):
    psi = 1e9
    for stage in (0, 1, 2):
        assert comm_elements_per_step(stage, psi, num_ranks) == pytest.approx(
            2 * psi * (num_ranks - 1) / num_ranks)
    assert comm_elements_per_step(3, psi, num_ranks) == pytest.approx(
        3 * psi * (num_ranks - 1) / num_ranks)


def test_comm_volume_examples():
    assert comm_elements_per_step(0, 1000, 4) == 1500
    assert comm_elements_per_step(3, 1000, 4) == 2250


def test_comm_volume_single_rank_is_zero():
    for stage in (0, 1, 2, 3):
        assert comm_elements_per_step(stage, 7e9, 1) == 0


@pytest.mark.parametrize("stage", [-1, 4, 1.5, "1"])
def test_bad_stage(stage):
    with pytest.raises(ValueError, match="stage"):
        model_state_bytes(stage, 1e9, 8, MIXED_PRECISION)
    with pytest.raises(ValueError, match="stage"):
        comm_elements_per_step(stage, 1e9, 8)


@pytest.mark.parametrize("num_ranks", [0, -4])
def test_bad_ranks(num_ranks):
    with pytest.raises(ValueError, match="num_ranks"):
        model_state_bytes(1, 1e9, num_ranks, MIXED_PRECISION)
    with pytest.raises(ValueError, match="num_ranks"):
        comm_elements_per_step(1, 1e9, num_ranks)


@pytest.mark.parametrize("num_params", [0, -1, float("nan")])
def test_bad_params(num_params):
    with pytest.raises(ValueError, match="num_params"):
        model_state_bytes(1, num_params, 8, MIXED_PRECISION)
    with pytest.raises(ValueError, match="num_params"):
        comm_elements_per_step(1, num_params, 8)


def test_cli_fp32_and_bytes_override(capsys):
    assert main(["--params", "1e9", "--precision", "fp32", "--ranks", "2"]) == 0
    fp32_out = capsys.readouterr().out
    assert "     2       16.0G      12.0G      10.0G       8.0G" in fp32_out

    assert main(["--params", "1e9", "--bytes", "4", "4", "8", "--ranks", "2"]) == 0
    bytes_out = capsys.readouterr().out
    assert "     2       16.0G      12.0G      10.0G       8.0G" in bytes_out


def test_cli_comm_table(capsys):
    # Ψ = 7e9, N = 4, 2-byte elements: stages 0-2 move 10.5e9 elements (21 GB),
    # stage 3 moves 15.75e9 elements (31.5 GB).
    assert main(["--params", "7e9", "--ranks", "4"]) == 0
    out = capsys.readouterr().out
    row = [line for line in out.splitlines() if line.startswith("     4")][-1]
    assert "10.50e9 / 21.0G" in row and "15.75e9 / 31.5G" in row


def test_cli_writes_a_small_model_in_the_unit_that_fits_it(capsys):
    """A model of 26,122 parameters is printed in kB (in GB every cell would read 0.0G)."""
    assert main(["--params", "26122", "--ranks", "1", "8"]) == 0
    out = capsys.readouterr().out
    assert "Per-GPU memory (kB)" in out and "     8      418.0k     143.7k      98.0k      52.2k" in out
    assert "(elements / kB" in out and "45.71e3 / 91.4k" in out and "0.0G" not in out      # 2 Psi (N-1)/N at N = 8
    assert main(["--params", "26122", "--ranks-per-node", "4", "--nodes", "2"]) == 0
    out = capsys.readouterr().out
    assert "Per-GPU memory (kB)" in out and "  418.0k  143.7k" in out and "0.0G" not in out


@pytest.mark.parametrize("argv", [
    ["--params", "-1"],
    ["--params", "0"],
    ["--params", "abc"],
    ["--params", "7e9", "--ranks", "0"],
    ["--params", "7e9", "--ranks", "4", "-2"],
    ["--params", "7e9", "--precision", "fp16"],
    ["--params", "7e9", "--precision", "fp32", "--bytes", "2", "2", "12"],
    ["--params", "7e9", "--ranks", "100000000000000000000"],             # an OverflowError traceback
    ["--params", "7e9", "--ranks", "2000000"],
    ["--params", "7e9", "--ranks-per-node", "8", "--nodes", "10000000"],  # ran out of memory, then killed
    ["--params", "1e30", "--ranks", "8"],                                 # printed digits without end
    ["--params", "7e9", "--bytes", "1e308", "1", "1"],                    # printed infG
    [],
])
def test_cli_bad_input_exits_2(argv, capsys):
    with pytest.raises(SystemExit) as excinfo:
        main(argv)
    assert excinfo.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("zerompi: error: ") and err.count("\n") == 1, err



# ---------------------------------------------------------------- across nodes: hybrid sharding and hpZ


def traffic(collectives, num_ranks, ranks_per_node):
    """[(intra grads, intra params, inter grads, inter params)] by rank."""
    return [(t["intra"]["grads"], t["intra"]["params"], t["inter"]["grads"], t["inter"]["params"])
            for t in ring_traffic_per_rank(collectives, num_ranks, ranks_per_node)]


def per_node(collectives, num_ranks, ranks_per_node):
    """Inter-node elements (grads + params) each node sends per step."""
    nodes = inter_node_per_node(ring_traffic_per_rank(collectives, num_ranks, ranks_per_node), ranks_per_node)
    return [node["grads"] + node["params"] for node in nodes]


def test_hybrid_memory_hand_computed():
    # Ψ = 1000, N = 8, groups of S = 4, P = 4, G = 4, K = 8: the stage's bytes at N = 4.
    assert hybrid_model_state_bytes(1, 1000, 8, 4, FP32) == {
        "params": 4000, "grads": 4000, "optimizer": 2000, "total": 10000}
    assert hybrid_model_state_bytes(2, 1000, 8, 4, FP32)["total"] == 4000 + 12000 / 4
    assert hybrid_model_state_bytes(3, 1000, 8, 4, FP32)["total"] == 16000 / 4


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_hybrid_memory_limits(stage):
    # one group of all N is flat ZeRO; groups of one rank keep everything, as stage 0
    flat = model_state_bytes(stage, 1e6, 8, MIXED_PRECISION)
    assert hybrid_model_state_bytes(stage, 1e6, 8, 8, MIXED_PRECISION) == flat
    assert hybrid_model_state_bytes(stage, 1e6, 8, 1, MIXED_PRECISION)["total"] == 16e6


def test_hpz_memory_hand_computed():
    # Ψ = 1000, N = 8, L = 4 ranks per node, P = 4, G = 4, K = 8:
    # params 4000/8 primary + 4000/4 secondary, grads 4000/8, optimizer 8000/8.
    assert hpz_model_state_bytes(1000, 8, 4, FP32) == {
        "params": 1500, "grads": 500, "optimizer": 1000, "total": 3000}
    # the seed's 7B model, mixed precision, 8 nodes of 8: 16 * 7e9 / 64 + 2 * 7e9 / 8 = 1.75 + 1.75 GB
    assert hpz_model_state_bytes(7e9, 64, 8, MIXED_PRECISION)["total"] == pytest.approx(3.5e9)


def test_flat_ring_crosses_at_the_last_rank_of_each_node():
    # Ψ = 1000, N = 4 on 2 nodes of 2: ranks 1 and 3 send to ranks 2 and 0, on the other node.
    # Stage 0 all-reduce: 2 * 1000 * 3/4 = 1500 per rank.
    assert traffic(flat_collectives(0, 1000, 4), 4, 2) == [
        (1500, 0, 0, 0), (0, 0, 1500, 0), (1500, 0, 0, 0), (0, 0, 1500, 0)]
    # Stage 3: two all-gathers of the parameters (1500) and a reduce-scatter of the gradients (750).
    assert traffic(flat_collectives(3, 1000, 4), 4, 2) == [
        (750, 1500, 0, 0), (0, 0, 750, 1500), (750, 1500, 0, 0), (0, 0, 750, 1500)]
    assert per_node(flat_collectives(3, 1000, 4), 4, 2) == [2250, 2250]


def test_flat_ring_on_one_node_or_one_rank_per_node():
    assert traffic(flat_collectives(1, 1000, 4), 4, 4) == [(750, 750, 0, 0)] * 4
    assert traffic(flat_collectives(1, 1000, 4), 4, 1) == [(0, 0, 750, 750)] * 4
    assert per_node(flat_collectives(1, 1000, 4), 4, 1) == [1500] * 4


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("num_ranks, ranks_per_node", [(1, 1), (4, 2), (6, 3), (8, 2), (16, 8)])
def test_flat_ring_totals_and_nodes(stage, num_ranks, ranks_per_node):
    psi, nodes = 1e6, num_ranks // ranks_per_node
    collectives = flat_collectives(stage, psi, num_ranks)
    for t in traffic(collectives, num_ranks, ranks_per_node):
        assert sum(t) == pytest.approx(comm_elements_per_step(stage, psi, num_ranks))
    one_rank = comm_elements_per_step(stage, psi, num_ranks)
    assert per_node(collectives, num_ranks, ranks_per_node) == pytest.approx(
        [one_rank if nodes > 1 else 0] * nodes)


def test_hybrid_one_group_per_node_hand_computed():
    # Ψ = 1200, N = 6 on 2 nodes of 3, S = 3. Stage 3 inside the node: 3 * 1200 * 2/3 = 2400
    # (params 1600, grads 800); the 400-element shard all-reduced over the 2 replicas:
    # 2 * 400 * 1/2 = 400, across, from every rank. Per node: 3 * 400 = 1200 = 2Ψ(k-1)/k.
    assert traffic(hybrid_collectives(3, 1200, 6, 3), 6, 3) == [(800, 1600, 400, 0)] * 6
    assert per_node(hybrid_collectives(3, 1200, 6, 3), 6, 3) == [1200, 1200]
    # Stages 1 and 2: reduce-scatter 800 + all-gather 800 inside, the same 400 across.
    for stage in (1, 2):
        assert traffic(hybrid_collectives(stage, 1200, 6, 3), 6, 3) == [(800, 800, 400, 0)] * 6


def test_hybrid_groups_inside_a_node_hand_computed():
    # Ψ = 1000, N = 8 on 2 nodes of 4, S = 2: groups {0,1} {2,3} {4,5} {6,7}, inside the nodes.
    # Replica rings (0,2,4,6) and (1,3,5,7): 2 -> 4 and 6 -> 0 cross, so do 3 -> 5 and 7 -> 1:
    # the last group of each node sends the all-reduce of its 500-element shard across,
    # 2 * 500 * 3/4 = 750. Inside the group: reduce-scatter 500 + all-gather 500.
    inside, last_group = (500 + 750, 500, 0, 0), (500, 500, 750, 0)
    assert traffic(hybrid_collectives(2, 1000, 8, 2), 8, 4) == [inside, inside, last_group, last_group] * 2
    assert per_node(hybrid_collectives(2, 1000, 8, 2), 8, 4) == [1500, 1500]     # 2Ψ(R-1)/R, R = 4


def test_hybrid_groups_across_nodes_hand_computed():
    # Ψ = 1000, N = 8 on 4 nodes of 2, S = 4: the group ring 0 -> 1 -> 2 -> 3 -> 0 crosses at
    # ranks 1 and 3 (stage 3: 3 * 1000 * 3/4 = 2250, params 1500 + grads 750); replica rings
    # (0,4) (1,5) (2,6) (3,7) all cross: 2 * 250 * 1/2 = 250 per rank.
    inside, last_of_node = (750, 1500, 250, 0), (0, 0, 750 + 250, 1500)
    assert traffic(hybrid_collectives(3, 1000, 8, 4), 8, 2) == [inside, last_of_node] * 4
    assert per_node(hybrid_collectives(3, 1000, 8, 4), 8, 2) == [2750] * 4


def test_hybrid_groups_straddling_nodes_load_one_node_more():
    # Ψ = 600, N = 6 on 3 nodes of 2, S = 3, stage 1: groups {0,1,2} {3,4,5}; the group rings
    # cross at 1 -> 2, 2 -> 0, 3 -> 4, 5 -> 3 (reduce-scatter 400 + all-gather 400 each); the
    # replica rings (0,3) (1,4) (2,5) all cross (2 * 200 * 1/2 = 200 per rank).
    assert [t[2] + t[3] for t in traffic(hybrid_collectives(1, 600, 6, 3), 6, 2)] == [
        200, 1000, 1000, 1000, 200, 1000]
    assert per_node(hybrid_collectives(1, 600, 6, 3), 6, 2) == [1200, 2000, 1200]


@pytest.mark.parametrize("stage", [1, 2, 3])
@pytest.mark.parametrize("num_ranks, ranks_per_node, group", [
    (8, 4, 4), (8, 2, 2), (16, 8, 8), (8, 4, 2), (8, 2, 4), (12, 4, 6), (6, 3, 1), (6, 3, 6)])
def test_hybrid_totals_and_nodes(stage, num_ranks, ranks_per_node, group):
    psi, replicas, nodes = 1e6, num_ranks // group, num_ranks // ranks_per_node
    in_group = {1: 2, 2: 2, 3: 3}[stage] * psi * (group - 1) / group
    across_groups = 2 * (psi / group) * (replicas - 1) / replicas
    collectives = hybrid_collectives(stage, psi, num_ranks, group)
    for t in traffic(collectives, num_ranks, ranks_per_node):
        assert sum(t) == pytest.approx(in_group + across_groups)
    if group == ranks_per_node:       # only the replica rings cross: 2Ψ(k-1)/k per node
        assert per_node(collectives, num_ranks, ranks_per_node) == pytest.approx(
            [2 * psi * (nodes - 1) / nodes] * nodes)


@pytest.mark.parametrize("stage", [1, 2, 3])
@pytest.mark.parametrize("ranks_per_node, group, nodes", [(8, 2, 2), (8, 4, 4), (4, 1, 3), (6, 3, 2)])
def test_hybrid_groups_inside_nodes_closed_form(stage, ranks_per_node, group, nodes):
    # S divides L: the ranks of each node's last group send 2(Ψ/S)(R-1)/R across, per node 2Ψ(R-1)/R
    psi, n = 1e6, ranks_per_node * nodes
    replicas, c = n // group, {1: 2, 2: 2, 3: 3}[stage]
    across = 2 * (psi / group) * (replicas - 1) / replicas
    for rank, t in enumerate(traffic(hybrid_collectives(stage, psi, n, group), n, ranks_per_node)):
        in_last_group = rank % ranks_per_node >= ranks_per_node - group
        assert t[2] + t[3] == pytest.approx(across if in_last_group else 0)
        assert t[0] + t[1] == pytest.approx(c * psi * (group - 1) / group + (0 if in_last_group else across))
    assert per_node(hybrid_collectives(stage, psi, n, group), n, ranks_per_node) == pytest.approx(
        [2 * psi * (replicas - 1) / replicas] * nodes)


@pytest.mark.parametrize("stage", [1, 2, 3])
@pytest.mark.parametrize("ranks_per_node, nodes_per_group, nodes", [(2, 2, 4), (4, 2, 2), (1, 3, 6), (3, 2, 4)])
def test_hybrid_groups_over_several_nodes_closed_form(stage, ranks_per_node, nodes_per_group, nodes):
    # S = mL: the group ring crosses at each node's last rank, every rank sends its shard's all-reduce across
    psi, n, group = 1e6, ranks_per_node * nodes, ranks_per_node * nodes_per_group
    replicas, c = n // group, {1: 2, 2: 2, 3: 3}[stage]
    in_group, across_groups = c * psi * (group - 1) / group, 2 * (psi / group) * (replicas - 1) / replicas
    for rank, t in enumerate(traffic(hybrid_collectives(stage, psi, n, group), n, ranks_per_node)):
        last_of_node = rank % ranks_per_node == ranks_per_node - 1
        assert t[2] + t[3] == pytest.approx(across_groups + (in_group if last_of_node else 0))
        assert t[0] + t[1] == pytest.approx(0 if last_of_node else in_group)
    assert per_node(hybrid_collectives(stage, psi, n, group), n, ranks_per_node) == pytest.approx(
        [in_group + ranks_per_node * across_groups] * nodes)


def test_hpz_hand_computed():
    # Ψ = 1000, N = 8 on 2 nodes of 4. Forward all-gather and reduce-scatter over all 8: 875 each,
    # across from ranks 3 and 7; backward all-gather over the node's 4 ranks: 750, inside.
    others, last_of_node = (875, 875 + 750, 0, 0), (0, 750, 875, 875)
    assert traffic(hpz_collectives(1000, 8, 4), 8, 4) == ([others] * 3 + [last_of_node]) * 2
    # per node: 2Ψ(N-1)/N = 1750 against flat stage 3's 3Ψ(N-1)/N = 2625
    assert per_node(hpz_collectives(1000, 8, 4), 8, 4) == [1750, 1750]
    assert per_node(flat_collectives(3, 1000, 8), 8, 4) == [2625, 2625]


@pytest.mark.parametrize("num_ranks, ranks_per_node", [(4, 2), (8, 4), (16, 8), (128, 8), (6, 1)])
def test_hpz_saves_one_third_across_nodes(num_ranks, ranks_per_node):
    psi = 7e9
    hpz = per_node(hpz_collectives(psi, num_ranks, ranks_per_node), num_ranks, ranks_per_node)
    flat = per_node(flat_collectives(3, psi, num_ranks), num_ranks, ranks_per_node)
    assert hpz == pytest.approx([2 * psi * (num_ranks - 1) / num_ranks] * len(hpz))
    assert [h / f for h, f in zip(hpz, flat)] == pytest.approx([2 / 3] * len(hpz))
    # per rank: 2Ψ(N-1)/N across from each node's last rank (inside from the others), and the
    # backward all-gather inside the node, Ψ(L-1)/L, from every rank
    over_all, in_node = 2 * psi * (num_ranks - 1) / num_ranks, psi * (ranks_per_node - 1) / ranks_per_node
    for rank, t in enumerate(traffic(hpz_collectives(psi, num_ranks, ranks_per_node), num_ranks, ranks_per_node)):
        last_of_node = rank % ranks_per_node == ranks_per_node - 1
        assert t[2] + t[3] == pytest.approx(over_all if last_of_node else 0)
        assert t[0] + t[1] == pytest.approx(in_node + (0 if last_of_node else over_all))


def test_wire_bytes_counts_gradients_at_g_and_parameters_at_p():
    assert wire_bytes({"grads": 10, "params": 3}, BytesPerParam(param=2, grad=4, optimizer=12)) == 46


@pytest.mark.parametrize("call, match", [
    (lambda: hybrid_model_state_bytes(0, 1e9, 8, 4, MIXED_PRECISION), "stage 0"),
    (lambda: hybrid_collectives(0, 1e9, 8, 4), "stage 0"),
    (lambda: hybrid_model_state_bytes(1, 1e9, 8, 3, MIXED_PRECISION), "shard_group"),
    (lambda: hybrid_collectives(2, 1e9, 8, 0), "shard_group"),
    (lambda: hybrid_collectives(2, 1e9, 8, 2.0), "shard_group"),
    (lambda: hpz_model_state_bytes(1e9, 8, 3, MIXED_PRECISION), "ranks_per_node"),
    (lambda: hpz_collectives(1e9, 8, 16), "ranks_per_node"),
    (lambda: hpz_collectives(0, 8, 4), "num_params"),
    (lambda: ring_traffic_per_rank(flat_collectives(1, 1e9, 6), 6, 4), "ranks_per_node"),
])
def test_bad_values_across_nodes(call, match):
    with pytest.raises(ValueError, match=match):
        call()


NODE_TITLES = """\
              flat: ZeRO over all N GPUs     hybrid: groups of 8        hpZ
nodes  GPUs Stage 0 Stage 1 Stage 2 Stage 3 Stage 1 Stage 2 Stage 3 Stage 3
---------------------------------------------------------------------------
"""


def test_cli_table_across_nodes_for_7b(capsys):
    assert main(["--params", "7e9", "--ranks-per-node", "8"]) == 0
    memory, traffic_table = capsys.readouterr().out.split("Inter-node traffic")
    assert "Per-GPU memory (GB) for a 7B parameter model, 8 GPUs per node\n" + NODE_TITLES in memory
    assert NODE_TITLES in traffic_table
    assert [line.split()[:2] for line in memory.splitlines()[-6:-1]] == [
        ["1", "8"], ["2", "16"], ["4", "32"], ["8", "64"], ["16", "128"]]
    # 8 nodes, N = 64, Ψ = 7e9, 2 + 2 + 12 bytes: flat 112, 4*7 + 12*7/64 = 29.3, 2*7 + 14*7/64 = 15.5,
    # 16*7/64 = 1.75 -> 1.8; hybrid at S = 8: 4*7 + 12*7/8 = 38.5, 2*7 + 14*7/8 = 26.25 -> 26.2,
    # 16*7/8 = 14; hpZ: 1.75 + 2*7/8 = 3.5 (GB)
    assert "    8    64  112.0G   29.3G   15.5G    1.8G   38.5G   26.2G   14.0G    3.5G\n" in memory
    # Inter-node GB per node, 2 bytes per element. 2 nodes, N = 16: flat stages 0-2 2*7e9*15/16 = 13.125e9
    # elements = 26.25 GB -> 26.2, stage 3 39.375 -> 39.4; hybrid 2*7e9*1/2 = 7e9 elements = 14 GB;
    # hpZ as stages 0-2.
    assert "    2    16   26.2G   26.2G   26.2G   39.4G   14.0G   14.0G   14.0G   26.2G\n" in traffic_table
    # 16 nodes, N = 128: 2*7e9*127/128*2 B = 27.78 GB, stage 3 41.67; hybrid 2*7e9*15/16*2 B = 26.25
    assert "   16   128   27.8G   27.8G   27.8G   41.7G   26.2G   26.2G   26.2G   27.8G\n" in traffic_table
    assert "    1     8" + "    0.0G" * 8 + "\n" in traffic_table


def test_cli_across_nodes_options(capsys):
    # 2 ranks per node, groups of 4 (two nodes), fp32: P = G = 4 bytes per element
    assert main(["--params", "1e9", "--precision", "fp32", "--ranks-per-node", "2",
                 "--nodes", "2", "4", "--shard-group", "4"]) == 0
    out = capsys.readouterr().out
    assert "hybrid: groups of 4" in out and "2 GPUs per node" in out
    memory, traffic_table = out.split("Inter-node traffic")
    rows = [line for line in memory.splitlines() if line.startswith("    2     4")]
    # N = 4, S = 4: hybrid is flat ZeRO; hpZ: 16e9/4 + 4e9/2 = 6 GB
    assert rows == ["    2     4   16.0G   10.0G    7.0G    4.0G   10.0G    7.0G    4.0G    6.0G"]
    # 4 nodes, N = 8, S = 4, hybrid stage 3: a node's last rank sends the group ring's 3*1e9*3/4
    # elements across, and both its ranks all-reduce their 2.5e8-element shard across the 2 replicas
    # (2 * 2.5e8 * 1/2 each): 2.25e9 + 2 * 2.5e8 = 2.75e9 elements = 11 GB
    row = [line for line in traffic_table.splitlines() if line.startswith("    4     8")][0]
    assert row.split()[8] == "11.0G"


def test_cli_across_nodes_via_subprocess():
    result = subprocess.run(
        [sys.executable, "-m", "zerompi.memory", "--params", "7e9", "--ranks-per-node", "8",
         "--nodes", "1", "2"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert NODE_TITLES in result.stdout and "   16   128" not in result.stdout


@pytest.mark.parametrize("argv, message", [
    (["--nodes", "2"], "--nodes needs --ranks-per-node"),
    (["--shard-group", "8"], "--shard-group needs --ranks-per-node"),
    (["--ranks", "8", "--ranks-per-node", "8"], "--ranks and --ranks-per-node"),
    (["--ranks-per-node", "8", "--shard-group", "48"], "--shard-group 48 divides none of the default rows' N"),
    (["--ranks-per-node", "8", "--nodes", "1", "--shard-group", "16"], "--shard-group 16 does not divide N = 8"),
    (["--ranks-per-node", "8", "--nodes", "3", "--shard-group", "16"], "does not divide N = 24"),
    (["--ranks-per-node", "0"], "--ranks-per-node"),
    (["--ranks-per-node", "8", "--nodes", "0"], "--nodes"),
    (["--ranks-per-node", "8", "--shard-group", "x"], "--shard-group"),
])
def test_cli_bad_values_across_nodes(argv, message, capsys):
    with pytest.raises(SystemExit) as excinfo:
        main(["--params", "7e9"] + argv)
    assert excinfo.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("zerompi: error: ") and message in err and err.count("\n") == 1, err


def test_a_group_of_two_nodes_prints_the_default_rows_it_divides(capsys):
    """`--shard-group 16` on 8 ranks per node: the default rows whose N 16 divides (the first has 8 ranks)."""
    assert main(["--params", "7e9", "--ranks-per-node", "8", "--shard-group", "16"]) == 0
    rows = [line.split()[:2] for line in capsys.readouterr().out.splitlines() if re.match(r"\s+\d+\s+\d+\s", line)]
    assert rows[:4] == [["2", "16"], ["4", "32"], ["8", "64"], ["16", "128"]], rows
