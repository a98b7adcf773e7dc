"""The cost model (zerompi/train/commands/cost.py) against hand-computed cases, its calibration file, and
`python -m zerompi.plan` end to end. No timing is asserted: the numbers are arithmetic."""
import errno
import json
import os
import re
import subprocess
import sys

import pytest

from test_cli import launch
from zerompi.ledger import ALLGATHER, ALLREDUCE, GRADS, METRICS, PARAMS, REDUCE_SCATTER
from zerompi.overlap import OverlapConfig
from zerompi.plan import RunShape, plan_run
from zerompi.train.commands.calibrate import CalibrationError, read_calibration
from zerompi.offload import TILE, FileTier, HostTier
from zerompi.train.commands.cost import (CostError, FileRates, Link, Machine, adam_bytes, cluster_machine, gemm_flops,
                                         hideable_seconds, interpolate, owned_elements, step_cost)
from zerompi.plan.virtual import PlannedCall
from zerompi.precision import precision_for

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FP32 = precision_for("float32")


def test_gemm_flops_of_a_two_layer_mlp():
    # sizes 4 -> 8 -> 3, 2 rows: layer 0 forward + weight gradient (no input gradient), layer 1 all three
    assert gemm_flops((4, 8, 3), 2) == [128, 128, 96, 96, 96]


def test_compute_is_flops_over_the_rate_per_micro_batch():
    plan = plan_run(RunShape((4, 8, 3), 0, FP32, 2, 1, micro_batches=3))
    cost = step_cost(plan, cluster_machine(1e-9 * 544, 1.0))      # 544 FLOP/s: one micro-batch per second
    assert cost.compute_s == pytest.approx(3.0)


def test_gemm_rate_interpolates_in_log_flops_and_clamps():
    m = Machine(gemm=((1e6, 10.0), (1e8, 30.0)), bandwidth=1.0)
    assert m.gemm_rate(1e7) == pytest.approx(20.0)
    assert m.gemm_rate(1e3) == 10.0 and m.gemm_rate(1e12) == 30.0


def test_alpha_beta_of_one_reduce_scatter_at_four_ranks():
    link = Link(latency_s=1e-6, bandwidth=1e9)
    # 3 steps of 1 us, and 3/4 of 4 MB at 1 GB/s
    assert link.seconds(REDUCE_SCATTER, 4_000_000, 4) == pytest.approx(3e-6 + 3e-3)
    assert link.seconds(ALLGATHER, 4_000_000, 4) == pytest.approx(3e-6 + 3e-3)
    assert link.seconds(ALLREDUCE, 4_000_000, 4) == pytest.approx(2 * (3e-6 + 3e-3))
    assert link.seconds(ALLREDUCE, 4_000_000, 1) == 0.0


def test_inter_node_calls_use_the_inter_node_link():
    m = cluster_machine(1.0, 1.0, intra=(10.0, 0.0), inter=(1.0, 0.0))
    inside = PlannedCall(REDUCE_SCATTER, 2_000_000, 2, 1, False)
    across = PlannedCall(REDUCE_SCATTER, 2_000_000, 2, 2, True)
    assert m.call_seconds(inside) == pytest.approx(1e-4)          # 1 MB at 10 GB/s
    assert m.call_seconds(across) == pytest.approx(1e-3)          # 1 MB at 1 GB/s


def test_interpolation_between_two_measured_sizes():
    points = ((1000, 1.0), (3000, 2.0))
    assert interpolate(points, 2000) == pytest.approx(1.5)
    assert interpolate(points, 10) == 1.0                         # below: the smallest's time
    assert interpolate(points, 6000) == pytest.approx(4.0)        # above: in proportion to bytes
    m = Machine(gemm=((1.0, 1.0),), bandwidth=1.0,
                collectives={2: {op: points for op in (ALLREDUCE, REDUCE_SCATTER, ALLGATHER)}})
    assert m.call_seconds(PlannedCall(ALLGATHER, 2500, 2, 1, False)) == pytest.approx(1.75)


def test_optimizer_is_owned_elements_times_adam_bytes_over_bandwidth():
    assert adam_bytes(FP32) == 28                                 # read p g m v, write p m v
    assert adam_bytes(precision_for("bf16")) == 2 + 24 + 2        # g; master m v read and written; p
    for stage in (0, 1, 3):                                       # 4 -> 100 -> 8: (5*100 + 101*8) = 1308
        plan = plan_run(RunShape((4, 100, 8), stage, FP32, 2, 2))
        assert abs(owned_elements(plan) - 1308 // (1 if stage == 0 else 2)) < 8   # padded to N
        cost = step_cost(plan, cluster_machine(1.0, 1e-9, intra=(1.0, 0.0)))    # 1 byte per second
        assert cost.optimizer_s == 28 * owned_elements(plan)
    calibrated = Machine(gemm=((1.0, 1.0),), bandwidth=1.0, intra=Link(0.0, 1.0), adam_s={"float32": 2.0})
    plan = plan_run(RunShape((4, 100, 8), 1, FP32, 2, 2))
    assert step_cost(plan, calibrated).optimizer_s == 2.0 * owned_elements(plan)


def test_overlap_hides_all_but_the_last_reduction_up_to_the_compute():
    calls = ([PlannedCall(REDUCE_SCATTER, 1, 2, 1, False, purpose=GRADS)] * 3 +
             [PlannedCall(ALLREDUCE, 1, 2, 1, False, purpose=METRICS), PlannedCall(ALLGATHER, 1, 2, 1, False, purpose=PARAMS)])
    seconds = [1.0, 2.0, 3.0, 5.0, 7.0]
    assert hideable_seconds(calls, seconds, 2) == 3.0             # the first two reductions
    stage3 = [PlannedCall(ALLGATHER, 1, 2, 1, False, purpose=PARAMS)] * 2 + calls
    assert hideable_seconds(stage3, [11.0, 13.0] + seconds, 3) == 3.0 + 13.0 + 7.0   # gathers but the first
    sizes = (64, 256, 256, 256, 10)
    off = step_cost(plan_run(RunShape(sizes, 2, FP32, 16, 2)), cluster_machine(1.0, 10.0, intra=(0.01, 0.0)))
    on_shape = RunShape(sizes, 2, FP32, 16, 2, overlap=OverlapConfig(enabled=True))
    on = step_cost(plan_run(on_shape), cluster_machine(1.0, 10.0, intra=(0.01, 0.0)))
    assert off.hidden_s == 0.0
    assert 0 < on.hidden_s <= on.compute_s * 3 / 4
    assert on.step_s == pytest.approx(off.step_s - on.hidden_s + (on.comm_s - off.comm_s))
    shy = step_cost(plan_run(on_shape), cluster_machine(1.0, 10.0, intra=(0.01, 0.0), overlap_efficiency=0.0))
    assert shy.hidden_s == 0.0


def test_the_file_tiers_io_is_priced_at_the_folders_rates_and_hidden_by_the_spare_core():
    """Stage 3, 2 micro-batches, optimizer state (S) and parameter shard (P) in files: by hand,
    update (S + P) / read + (S + P) / write, but its first tile read and last written, behind AdamW;
    passes 2 M P / read, but layer 0's at the start, behind the compute; all of it exposed without
    a spare core; the page cache's rates where the node's files fit."""
    sizes = (64, 600, 600, 10)
    shape = RunShape(sizes, 3, FP32, 16, 2, 2, offload=FileTier(None, 0), offload_params=FileTier(None, 0))
    plan = plan_run(shape)
    owned = owned_elements(plan)
    S, P = 2 * 4 * owned, 4 * owned                         # m and v; the float32 shard
    assert plan.tier_bytes("file") == S + P and owned < TILE         # one tile: all of S comes first
    rates = FileRates(read=1e6, write=5e5, cached_read=4e6, cached_write=2e6)
    machine = Machine(gemm=((1.0, 1e9),), bandwidth=1e9, intra=Link(0.0, 1e9), overlap_efficiency=0.0, files=rates)

    def by_hand(read, write, e, adam, passes_behind):
        update, passes = (S + P) / read + (S + P) / write, 2 * 2 * P / read
        return update - e * min(P / read + P / write, adam) + passes - e * min(passes - P / 3 / read, passes_behind)
    disk = step_cost(plan, machine)
    assert disk.offload_s == pytest.approx(by_hand(1e6, 5e5, 0, 0, 0))
    in_memory = step_cost(plan_run(RunShape(sizes, 3, FP32, 16, 2, 2)), machine)
    assert disk.step_s == pytest.approx(in_memory.step_s + disk.offload_s)   # the same step, plus the files
    cached = step_cost(plan, machine, page_cache_bytes=2 * (S + P))         # both ranks' files fit
    assert cached.offload_s == pytest.approx(by_hand(4e6, 2e6, 0, 0, 0))
    assert step_cost(plan, machine, page_cache_bytes=2 * (S + P) - 1).offload_s == disk.offload_s
    spare = Machine(gemm=((1.0, 1e9),), bandwidth=1e9, intra=Link(0.0, 1e9), overlap_efficiency=1.0, files=rates)
    hidden = step_cost(plan, spare)
    assert hidden.offload_s == pytest.approx(by_hand(1e6, 5e5, 1, hidden.optimizer_s,
                                                     hidden.compute_s + hidden.elementwise_s))
    assert 0 < hidden.offload_s < disk.offload_s


def test_an_offloaded_plan_needs_the_folders_rates_and_the_host_tier_on_a_cpu_costs_none():
    plan = plan_run(RunShape((64, 100, 10), 3, FP32, 16, 2, offload=FileTier(None, 0)))
    with pytest.raises(CostError, match="calibrate --offload-dir"):
        step_cost(plan, cluster_machine(1.0, 1.0, intra=(1.0, 0.0)))
    host = plan_run(RunShape((64, 100, 10), 3, FP32, 16, 2, offload=HostTier()))
    memory = plan_run(RunShape((64, 100, 10), 3, FP32, 16, 2))
    machine = cluster_machine(1.0, 1.0, intra=(1.0, 0.0))
    assert step_cost(host, machine) == step_cost(memory, machine)       # AdamW over the same memory


def plan_cli(*flags, timeout=60):
    return subprocess.run([sys.executable, "-m", "zerompi.plan", *map(str, flags)], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=timeout)


CLUSTER = ("--gemm-gflops", 0.1, "--mem-bandwidth-gbs", 1, "--intra-bandwidth-gbs", 1, "--intra-latency-us", 0)
ROWS = ("--micro-batch-size", 16)


def test_cli_help():
    result = plan_cli("--help")
    assert result.returncode == 0
    assert "--calibration" in result.stdout and "calibrate" in result.stdout


def test_cli_cluster_numbers_end_to_end():
    # 64 -> 100 -> 10, 16 rows, N = 1: GEMMs 2*16*64*100 x 2 + 2*16*100*10 x 3 = 505,600 FLOPs at 0.1 GFLOP/s
    # = 5.056 ms; elementwise 16 x 110 outputs x 192 B at 1 GB/s = 0.338 ms; AdamW (65*100 + 101*10) x 28 B
    # = 0.210 ms; no collectives on one rank: 5.604 ms
    result = plan_cli(*CLUSTER, "--hidden", 100, "--micro-batch-size", 16, "--memory-per-rank-gb", 1)
    assert result.returncode == 0, result.stderr
    rows = {line.split("|")[0].split()[1]: line for line in result.stdout.splitlines() if line.startswith("stage ")}
    assert set(rows) == {"0", "1", "2", "3"}
    assert rows["0"].split("|")[-1].strip() == "5.6"
    assert "fastest that fits: stage" in result.stdout


def test_cli_params_picks_a_width_and_nodes_add_hybrid_rows():
    result = plan_cli(*CLUSTER, "--inter-bandwidth-gbs", 0.1, "--inter-latency-us", 10, "--ranks-per-node", 2,
                      "--ranks", 4, "--params", 1e5, "--layers", 2, "--memory-per-rank-gb", 1e-4, *ROWS)
    assert result.returncode == 0, result.stderr
    header = result.stdout.splitlines()[0]
    width = int(header.split("-")[1])
    psi = int(header.split("(")[1].split(" ")[0].replace(",", ""))
    assert header.startswith(f"MLP 64-{width}-{width}-10 ") and abs(psi - 1e5) < 2 * width
    assert "stage 3 hybrid S=2" in result.stdout and "stage 3 hpZ L=2" in result.stdout
    assert "no stage fits in 100.0 kB per rank" in result.stdout


@pytest.mark.parametrize("flags", [
    (),                                                                    # no machine
    ("--hidden", 8),                                                       # still no machine
    (*CLUSTER,),                                                           # no model
    (*CLUSTER, "--hidden", 8, "--params", 1e6),
    (*CLUSTER, "--hidden", "8,x"),
    (*CLUSTER, "--hidden", 8, "--ranks", 3, "--batch-size", 10),
    (*CLUSTER, "--hidden", 8),                                             # no batch
    (*CLUSTER, "--hidden", 8, "--ranks", 2, "--batch-size", 32, "--micro-batch-size", 8),
    (*CLUSTER, "--hidden", 8, "--ranks", 4, "--ranks-per-node", 2),       # no inter-node link
    (*CLUSTER, "--hidden", 8, "--gemm-gflops", -1),
])
def test_cli_bad_flags_are_one_line(flags):
    result = plan_cli(*flags)
    assert result.returncode == 2
    assert result.stderr.startswith("zerompi: error: ") and result.stderr.count("\n") == 1, result.stderr


def good_calibration():
    table = {op: [[1024, 1e-5], [1 << 20, 1e-3]] for op in (ALLREDUCE, REDUCE_SCATTER, ALLGATHER)}
    return {"format": "zerompi.plan calibration", "version": 1, "ranks": 2, "machine": {},
            "gemm": [[1e6, 1e10], [1e9, 3e10]], "bandwidth": 1e10, "elementwise_s": 1e-9,
            "adam_s": {"float32": 5e-9}, "layer_overhead_s": 1e-4, "step_overhead_s": 0,
            "collectives": {"1": table, "2": table}, "overlap_efficiency": 0}


def broken(change):
    data = good_calibration()
    change(data)
    return json.dumps(data)


@pytest.mark.parametrize("text", [
    json.dumps(good_calibration())[:100],                                  # truncated
    "[]",
    broken(lambda d: d.update(format="something else")),
    broken(lambda d: d.update(bandwidth=-1)),
    broken(lambda d: d.update(gemm=[[1e9, 1e10], [1e6, 1e10]])),           # sizes fall
    broken(lambda d: d["collectives"]["2"].pop(ALLGATHER)),
    broken(lambda d: d["collectives"].update(two={})),
    broken(lambda d: d.update(elementwise_s="fast")),
    broken(lambda d: d.update(overlap_efficiency=2)),
    broken(lambda d: d.pop("adam_s")),
    broken(lambda d: d.update(files={"read": 1e9, "write": 1e9, "cached_read": 1e9})),   # one rate missing
    broken(lambda d: d.update(files={"read": 1e9, "write": 0, "cached_read": 1e9, "cached_write": 1e9})),
])
def test_bad_calibration_file_is_one_line(tmp_path, text):
    path = tmp_path / "machine.json"
    path.write_text(text)
    with pytest.raises(CalibrationError):
        read_calibration(str(path))
    result = plan_cli("--calibration", path, "--hidden", 8, "--ranks", 2, *ROWS)
    assert result.returncode == 2
    assert result.stderr.startswith("zerompi: error: ") and result.stderr.count("\n") == 1, result.stderr


def test_good_calibration_predicts_and_names_unmeasured_rank_counts(tmp_path):
    path = tmp_path / "machine.json"
    path.write_text(json.dumps(good_calibration()))
    assert read_calibration(str(path)).collectives[2][ALLREDUCE] == ((1024.0, 1e-5), (1048576.0, 1e-3))
    assert plan_cli("--calibration", path, "--hidden", 8, "--ranks", 2, *ROWS).returncode == 0
    result = plan_cli("--calibration", path, "--hidden", 8, "--ranks", 4, *ROWS)
    assert result.returncode == 2 and "calibrate under `mpirun -n 4`" in result.stderr


def test_calibrate_writes_a_valid_file_at_two_ranks(tmp_path):
    out, folder = tmp_path / "machine.json", tmp_path / "offload"
    folder.mkdir()
    run = launch(2, "calibrate", "--out", out, "--offload-dir", folder, "--others-limit", 1, cwd=REPO_ROOT,
                 program=("-m", "zerompi.plan"), timeout=180)      # 1: a busy machine does not void it
    assert run.returncode == 0, run.describe()
    machine = read_calibration(str(out))
    assert set(machine.collectives) == {1, 2}
    data = json.loads(out.read_text())
    assert data["seconds"] > 0 and 0 <= data["others_share"] <= 1
    assert f"other processes: {100 * data['others_share']:.1f}% of the machine's CPU" in run.stdout, run.describe()
    assert machine.files.read > 0 and machine.files.cached_write > 0
    assert not [p for p in os.listdir(tmp_path) if p not in ("machine.json", "offload")]     # no temporary left
    assert os.listdir(folder) == []                                         # the scratch files gone
    result = plan_cli("--calibration", out, "--hidden", "2048,2048", "--ranks", 2, *ROWS)
    assert result.returncode == 0, result.stderr
    rows = [line for line in result.stdout.splitlines() if line.startswith("stage 3 opt")]
    assert [row.split("|")[0].split()[:4] for row in rows] == [["stage", "3", "opt", "file"],
                                                               ["stage", "3", "opt+par", "file"]], result.stdout
    assert all(float(row.split("|")[1].split()[-1]) > 0 for row in rows), result.stdout       # the offload column


def test_calibrate_refuses_an_offload_folder_that_is_not_one_before_measuring(tmp_path):
    run = launch(2, "calibrate", "--out", tmp_path / "m.json", "--offload-dir", tmp_path / "none",
                 cwd=tmp_path, program=("-m", "zerompi.plan"), timeout=60)
    assert run.returncode == 2, run.describe()
    assert run.stderr.strip() == f"zerompi: error: --offload-dir {tmp_path / 'none'} is not a folder", run.describe()
    assert os.listdir(tmp_path) == []


def test_the_accuracy_benchmark_prints_predicted_beside_measured(tmp_path):
    """benchmarks/plan_accuracy.py on a small MLP, one round: one row per stage and file tier with
    the prediction's parts summing to it, and each ratio its predicted over its measured (no timing
    asserted); the offload folder left empty."""
    (tmp_path / "offload").mkdir()
    run = launch(2, "--widths", 256, "--stages", "0,2,3", "--repeats", 1, "--steps", 1, "--warmup", 1,
                 "--offload-dir", tmp_path / "offload", cwd=tmp_path,
                 program=(os.path.join(REPO_ROOT, "benchmarks", "plan_accuracy.py"),), timeout=240)
    assert run.returncode == 0, run.describe()
    rows = [line.split("|") for line in run.stdout.splitlines() if line.startswith("  256 ")]
    assert [" ".join(row[0].split()[1:]) for row in rows] == ["0", "2", "3", "3 opt", "3 o+p"], run.stdout
    assert os.listdir(tmp_path / "offload") == []
    for name, row in zip(("0", "2", "3", "3 opt", "3 o+p"), rows):
        parts, (predicted, measured) = [float(v) for v in row[1].split()], map(float, row[2].split())
        ratio, lowest, highest = map(float, row[3].split())
        assert (parts[-1] > 0) == ("opt" in name or "o+p" in name), run.stdout     # the files' I/O
        assert predicted == pytest.approx(sum(parts), abs=0.3) and predicted > 0     # each part to 0.1 ms
        assert ratio == pytest.approx(predicted / measured, rel=0.1) and lowest == ratio == highest   # one round


def test_planned_calls_carry_the_purpose_the_ledger_counts():
    """hideable_seconds reads the purpose: the step's metric sums are never hidden."""
    plan = plan_run(RunShape((4, 100, 8), 0, precision_for("bf16"), 2, 2, micro_batches=2))
    assert [c.purpose for c in plan.calls] == [GRADS] * (len(plan.calls) - 1) + [METRICS]
    for purpose in (GRADS, METRICS):
        ledger_bytes = plan.ledger.totals({purpose})[1]
        ring = sum(c.nbytes * (2 if c.op == ALLREDUCE else 1) / 2 for c in plan.calls if c.purpose == purpose)
        assert ring == ledger_bytes                                  # N = 2: (N-1)/N = 1/2
    stage3 = plan_run(RunShape((4, 100, 8), 3, FP32, 2, 2))
    assert {c.purpose for c in stage3.calls if c.op == ALLGATHER} == {PARAMS}


# ----------------------------------------------------------------------------------------------
# The calibration file at the edges: outputs that are not files, inputs without bounds
# ----------------------------------------------------------------------------------------------

def special_files(folder):
    """A FIFO, a character device (a /dev/null of our own: root) and a socket, made in folder."""
    import socket as sockets
    import stat
    made = {"fifo": folder / "fifo"}
    os.mkfifo(made["fifo"])
    if os.geteuid() == 0:
        made["device"] = folder / "null"
        os.mknod(made["device"], 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    made["socket"] = folder / "sock"
    server = sockets.socket(sockets.AF_UNIX)
    server.bind(str(made["socket"]))
    server.close()
    return made


def test_calibrate_refuses_an_output_that_is_not_a_regular_file_before_measuring(tmp_path):
    """`calibrate --out X` renamed its file over a FIFO, a device node or a socket X (as root,
    `--out /dev/null` would have replaced the system's /dev/null)."""
    for kind, path in special_files(tmp_path).items():
        before = os.lstat(path)
        run = launch(2, "calibrate", "--out", path, cwd=tmp_path, program=("-m", "zerompi.plan"), timeout=60)
        assert run.returncode == 2, run.describe()
        assert run.stderr.strip() == f"zerompi: error: cannot save the calibration to {path}: it exists and is not " \
                                     f"a regular file", run.describe()
        after = os.lstat(path)
        assert (after.st_ino, after.st_mode) == (before.st_ino, before.st_mode), kind
    assert not [name for name in os.listdir(tmp_path) if ".tmp" in name]


def test_calibrate_on_a_full_disk_is_one_line_and_leaves_no_temporary_file(tmp_path):
    from test_observability import small_tmpfs
    with small_tmpfs(tmp_path / "full", size="4k") as full:
        (full / "filler").write_bytes(b"\0" * 4096)
        run = launch(2, "calibrate", "--out", full / "machine.json", "--others-limit", 1, cwd=tmp_path,
                     program=("-m", "zerompi.plan"), timeout=180)
        assert run.returncode == 2, run.describe()
        assert run.stderr.strip().startswith(f"zerompi: error: cannot write {full / 'machine.json'}: No space left"), \
            run.describe()
        assert os.listdir(full) == ["filler"]


def test_a_calibration_while_another_process_is_busy_is_void_one_line_exit_9_and_writes_no_file(tmp_path):
    """A calibration measured while other processes held the cores is low, and the cost model's
    predictions from it wrong: above --others-limit it is void (here 0: a busy process beside)."""
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        run = launch(2, "calibrate", "--out", tmp_path / "machine.json", "--others-limit", 0, cwd=tmp_path,
                     program=("-m", "zerompi.plan"), timeout=180)
    finally:
        busy.kill()
        busy.wait()
    assert run.returncode == 9, run.describe()
    assert re.fullmatch(r"zerompi: error: the calibration is void: other processes took \d+% of the machine's CPU "
                        r"\(more than 0%\); no file written", run.stderr.strip()), run.describe()
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("kind", ["fifo", "zero", "deep", "huge"])
def test_a_calibration_that_is_no_bounded_file_is_one_line(kind, tmp_path):
    """--calibration read a FIFO forever, /dev/zero until memory ran out, and gave a RecursionError
    traceback for deep JSON."""
    path = tmp_path / "machine.json"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "zero":
        path = "/dev/zero"
    elif kind == "deep":
        path.write_text("[" * 100_000 + "]" * 100_000)
    else:
        with open(path, "wb") as f:
            f.truncate(1 << 30)                    # 1 GB, sparse
    result = plan_cli("--calibration", path, "--hidden", 8, "--ranks", 2, *ROWS, timeout=30)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0], result.stderr
    want = {"fifo": "is a FIFO", "zero": "is a character device", "deep": "nested too deeply",
            "huge": "larger than"}[kind]
    assert want in lines[0], result.stderr


MACHINE = ("--gemm-gflops", 100, "--mem-bandwidth-gbs", 10, "--intra-bandwidth-gbs", 10, "--intra-latency-us", 1)


@pytest.mark.parametrize("flags, says", [
    (("--params", 1e20), "more than any machine can address"),                 # an OverflowError traceback
    (("--hidden", 10 ** 20), "more than any machine can address"),
    (("--params", 1e9, "--layers", 100000), "more layers than the 4096 zerompi plans"),   # no answer in 100 s
    (("--hidden", 8, "--gemm-gflops", 1e-320), "at least 2.23e-308"),           # "inf ms per step"
])
def test_a_model_or_machine_beyond_what_plans_is_one_line(flags, says):
    result = plan_cli(*MACHINE, "--ranks", 2, *ROWS, *flags, timeout=60)      # a flag given again: the last wins
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert len(result.stderr.splitlines()) == 1 and says in result.stderr, result.stderr


def test_a_calibration_whose_numbers_overflow_the_step_time_is_one_line(tmp_path):
    path = tmp_path / "machine.json"
    path.write_text(broken(lambda d: d.__setitem__("layer_overhead_s", 1e308)))
    result = plan_cli("--calibration", path, "--hidden", "8,8", "--ranks", 2, *ROWS)
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
    assert "predicted step time overflows" in result.stderr, result.stderr


def test_quantized_gathers_cost_their_int8_bytes_and_the_quantizers_passes():
    """qwZ at N = 4: each of the 2 x 3 gathers sends a layer's padded elements as int8 (a quarter of
    float32's) plus 4 bytes per block, and quantizes the shard (48 bytes per element) and
    dequantizes the layer (24), over memory bandwidth."""
    from zerompi.quantize import Quantizer
    sizes, quantizer = (64, 600, 600, 10), Quantizer(8, 128)
    exact = plan_run(RunShape(sizes, 3, FP32, 16, 4))
    plan = plan_run(RunShape(sizes, 3, FP32, 16, 4, weights_quantizer=quantizer))
    machine = cluster_machine(1.0, 1e-9, intra=(1e-9, 0.0))           # 1 byte per second, memory and link
    padded = [exact_call.nbytes // 4 for exact_call in exact.calls if exact_call.purpose == PARAMS]
    by_hand = sum(p / 4 * 48 + p * 24 for p in padded)
    assert step_cost(plan, machine).elementwise_s == pytest.approx(step_cost(exact, machine).elementwise_s + by_hand)
    scales = sum(4 * quantizer.blocks(p // 4) * 4 for p in padded)      # 4 ranks' blocks, 4 bytes each
    assert step_cost(exact, machine).comm_s - step_cost(plan, machine).comm_s == pytest.approx(
        0.75 * (sum(padded) * 4 - sum(padded) - scales))                # (N-1)/N of the bytes saved


@pytest.mark.parametrize("bits", [8, 4])
def test_quantized_reductions_cost_their_all_to_alls_and_the_quantizers_passes(bits):
    """qgZ at N = 4, stage 2: each of the 3 layers' reductions becomes an all-to-all of the layer's
    int8 levels (int4: packed, half the bytes; priced as an all-gather of that buffer) and one of its
    scales, quantizing the layer (48 bytes per element) and dequantizing and adding its N
    contributions (24)."""
    from zerompi.quantize import Quantizer
    sizes, quantizer = (64, 600, 600, 10), Quantizer(bits, 128)
    exact = plan_run(RunShape(sizes, 2, FP32, 16, 4))
    plan = plan_run(RunShape(sizes, 2, FP32, 16, 4, grads_quantizer=quantizer))
    machine = cluster_machine(1.0, 1e-9, intra=(1e-9, 0.0))
    padded = [c.nbytes // 4 for c in exact.calls if c.op == REDUCE_SCATTER]
    levels = sum(4 * -(-(p // 4) // (8 // bits)) for p in padded)       # 4 owners' shards, packed
    assert step_cost(plan, machine).elementwise_s == pytest.approx(     # int4: an odd shard's pair priced whole
        step_cost(exact, machine).elementwise_s + levels * (8 // bits) * (48 + 24))
    scales = sum(4 * quantizer.blocks(p // 4) * 4 for p in padded)
    assert step_cost(exact, machine).comm_s - step_cost(plan, machine).comm_s == pytest.approx(
        0.75 * (sum(padded) * 4 - levels - scales))


@pytest.mark.mpi(min_size=2)
def test_a_write_failing_on_one_rank_ends_the_file_calibration_on_every_rank(tmp_path_factory, monkeypatch):
    """A disk error on one rank mid-measurement (its writes fail): every rank raises the one line, none
    waits at a barrier for it, and the scratch files are gone."""
    from mpi4py import MPI
    from zerompi.train.commands.calibrate import measure_files
    world = MPI.COMM_WORLD
    folder = world.bcast(str(tmp_path_factory.mktemp("offload")) if world.rank == 0 else None)
    if world.rank == 1:
        def full(fd, data, offset):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        monkeypatch.setattr(os, "pwrite", full)
    with pytest.raises(CalibrationError, match=f"^cannot measure the offload folder {folder}: No space left"):
        measure_files(world, folder)
    world.Barrier()
    assert os.listdir(folder) == []
