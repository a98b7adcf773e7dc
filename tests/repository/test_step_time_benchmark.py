"""benchmarks/step_time.py runs small (2 ranks, stages 0 and 3, two rounds), its limits sampled
once per round and the best taken with the spread beside it, the other processes' share read
from the kernel's counters, and its numbers called void exactly when a row ran below its floor
or others took more than 10% (benchmarks/floors.py); floors.py's share sees a busy process."""
import json
import os
import subprocess
import sys
import time

import numpy
import pytest

from run_all import mpirun

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
from floors import best, void_reasons  # noqa: E402
from zerompi.util.other_processes import OTHERS_LIMIT, OtherProcesses, busy_cpu_seconds, busy_reason, kernel_id  # noqa: E402


class OneRank:
    """OtherProcesses' communicator when the job is this one process."""
    def Barrier(self):
        pass

    def allgather(self, value):
        return [value]


@pytest.mark.timeout(300)
def test_the_benchmark_samples_its_limits_each_round_and_says_when_it_is_void(tmp_path):
    path = tmp_path / "step.json"
    result = subprocess.run([mpirun(), "-n", "2", sys.executable, os.path.join(ROOT, "benchmarks", "step_time.py"),
                             "--sizes", "64,128,128,10", "--batch-per-rank", "8", "--repeats", "2", "--steps", "2",
                             "--warmup", "1", "--stages", "0,3", "--overlap", "off", "--peers", "none",
                             "--adam", "fused", "--json", str(path)], capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(path.read_text())
    limits = out["limits"]
    assert limits["samples"] == 2 and set(limits["bandwidth_gbs"]) == {str(r["owned_elements"]) for r in out["stages"].values()}
    assert all(spread >= 0 for spread in limits["spread"].values())
    assert 0 <= out["others_share"] <= 1
    below = [row for row, r in out["stages"].items() if r["step_s"] < r["floor"]["total_s"]
             or min(r["adam_alone_s"], r["adam_fused_s"]) < r["floor"]["optimizer_s"]]
    assert bool(out["void"]) == bool(below or out["others_share"] > OTHERS_LIMIT)
    assert ("VOID" in result.stdout) == bool(out["void"])
    assert "stage rows' AdamW: fused" in result.stdout and "other processes:" in result.stdout
    parts = [r["parts_s"] for r in out["stages"].values()]     # where a step goes, measured per row
    assert all(set(p) == {"gemms", "elementwise", "norm"} and min(p.values()) > 0 for p in parts)
    assert parts[0]["norm"] != parts[1]["norm"] and parts[0]["gemms"] == parts[1]["gemms"]  # stage 3 owns 1/N
    assert "where a step goes" in result.stdout
    step_rate = limits["gemm_gflops"]["step"]        # the floor's compute: the step's own GEMMs, their best sample
    assert step_rate >= limits["gemm_step_median_gflops"] > 0
    for r in out["stages"].values():
        assert r["floor"]["compute_s"] == pytest.approx(out["flops_per_rank_step"] / (step_rate * 1e9))
        assert r["parts_s"]["gemms"] == pytest.approx(out["flops_per_rank_step"] / (limits["gemm_step_median_gflops"] * 1e9))
    versions = out["versions"]                       # benchmarks/machine.py: what ran, beside the figures
    assert versions["numpy"] == numpy.__version__ and versions["MPI"] and set(versions) >= {"torch", "deepspeed"}
    assert f"numpy {numpy.__version__}" in result.stdout and f"CPU: {out['cpu']}" in result.stdout


def test_a_busy_process_beside_is_counted_and_more_than_a_tenth_is_void():
    others = OtherProcesses(OneRank())
    others.start()
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(1.5)
    finally:
        busy.kill()
        busy.wait()
    share = others.share()
    _, cpus = busy_cpu_seconds()
    assert share > 0.5 / cpus, share                 # one busy CPU of the machine's, less its start-up
    assert void_reasons({"stage 1 off": 1.2}, 0.5) == ["other processes took 50% of the machine's CPU (more than 10%)"]
    assert void_reasons({"stage 1 off": 1.2}, OTHERS_LIMIT) == []


def test_idle_and_iowait_are_not_busy():
    stat = "cpu  100 20 30 1000 500 4 6 8 0 0\ncpu0 50 10 15 500 250 2 3 4 0 0\ncpu1 50 10 15 500 250 2 3 4 0 0\n"
    busy, cpus = busy_cpu_seconds(stat)
    assert cpus == 2 and busy == pytest.approx((100 + 20 + 30 + 4 + 6 + 8) / os.sysconf("SC_CLK_TCK"))


def test_best_and_void_reasons():
    assert best([3.0, 2.0, 4.0], higher_is_better=True) == (4.0, 1.0)
    assert best([3.0, 2.0, 4.0], higher_is_better=False) == (2.0, 1.0)
    assert void_reasons({"stage 0 off": 1.05, "AdamW of stage 0 off": 1.8}, 0.02) == []
    assert void_reasons({"stage 3 off": 0.36}, 0.0) == ["stage 3 off ran at 0.36x its floor (below 1: the floor was not one)"]


class Gathered(OneRank):
    """A communicator whose allgather returns these ranks' (kernel, (busy s, CPUs), own s, wall s)."""
    def __init__(self, ranks):
        self.ranks = ranks

    def allgather(self, value):
        return self.ranks


def test_each_kernel_counts_its_own_ranks_and_the_busiest_kernel_is_the_share():
    """Two ranks on kernel a (2 CPUs, 4 s busy, 3 s of it theirs, over 2 s): (4 - 3) / (2 x 2) =
    0.25; one on kernel b: (2.5 - 2) / (2 x 2) = 0.125. An unknown counter makes the share unknown."""
    ranks = [("a", (4.0, 2), 1.5, 2.0), ("b", (2.5, 2), 2.0, 2.0), ("a", (3.9, 2), 1.5, 1.9)]
    for comm, share in ((Gathered(ranks), 0.25), (Gathered(ranks[1:2]), 0.125), (Gathered([("a", None, 1, 1)]), None)):
        others = OtherProcesses(comm)
        others.start()
        assert others.share() == share
    assert busy_reason(None) is None and busy_reason(0.25, 0.3) is None
    assert busy_reason(0.25) == "other processes took 25% of the machine's CPU (more than 10%)"
    assert kernel_id() == kernel_id() != ""
