"""The preflight's arithmetic and its one line (zerompi/plan/preflight.py), and --dry-run's text
and errors (zerompi/train/commands/dry_run.py), single-process: a device whose available memory the test
sets stands for the limits (tests/reference/test_preflight_limits.py goes through the real ones)."""
import gc
import os
import subprocess
import sys
import threading
import tracemalloc
from dataclasses import replace

import numpy as np
import pytest

from zerompi.cpu import CPU
from zerompi.hierarchy import FLAT, Grouping
from zerompi.layout import Layout
from zerompi.model import INIT_CHUNK
from zerompi.offload import FileTier
from zerompi.overlap import OverlapConfig
from zerompi.plan import RunShape, plan_memory, plan_run
from zerompi.plan.preflight import (NUMBA_BYTES, RUNTIME_RESERVE, fewest_ranks, need_bytes, preflight_error,
                                    runtime_bytes, start_transient_bytes, thread_bytes)
from zerompi.precision import precision_for

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WIDE = RunShape((64, 8192, 8192, 8192, 8192, 10), 0, precision_for("float32"), 16, 4)   # the docs' demo


class Limited(CPU):
    """The CPU, with `available` bytes per rank."""

    def __init__(self, available):
        self.available = available

    def memory_available(self, ranks_on_node=1):
        return self.available, "set by the test"


def test_the_fused_adamw_needs_numba_beside_and_one_adam_scratch_chunk_less():
    """--fused-adam: Numba and LLVM once compiled (NUMBA_BYTES), and no adam.scratch chunk."""
    from zerompi.fused import FusedAdamKernel
    for stage in range(4):
        plain, fused = plan_run(replace(WIDE, stage=stage)), plan_run(replace(WIDE, stage=stage, adam_kernel=FusedAdamKernel()))
        assert runtime_bytes(fused) == runtime_bytes(plain) + NUMBA_BYTES
        assert plain.total_bytes - fused.total_bytes == 65536 * 4        # float32: the chunk it does not hold
        assert need_bytes(fused.shape) == need_bytes(plain.shape) + NUMBA_BYTES - 65536 * 4


def test_need_is_the_plan_plus_the_init_chunk_plus_mpi_scratch_and_the_reserve():
    plan = plan_run(WIDE)
    largest_call = max(call.nbytes for call in plan.calls)
    assert largest_call == (8193 * 8192 + 81_932) * 4    # stage 0: the bucket of the last two layers
    assert start_transient_bytes(WIDE) == INIT_CHUNK * (8 + 4)
    assert start_transient_bytes(replace(WIDE, reads_layers=True)) == 8193 * 8192 * (8 + 8 + 1)   # --init-weights
    assert need_bytes(WIDE) == plan.total_bytes + INIT_CHUNK * 12 + largest_call + RUNTIME_RESERVE
    # hybrid sharding with watchdogs: MPI's scratch on each of its 3 communicators, 2 more threads
    hybrid = replace(WIDE, stage=2, num_ranks=4, grouping=Grouping(shard_group=2), watchdog=True)
    split = plan_run(hybrid)
    assert {call.communicator for call in split.calls} == {0, 1, 2} and split.threads == 2
    scratch = {c: max(call.nbytes for call in split.calls if call.communicator == c) for c in range(3)}
    assert scratch == {0: (5 + 2) * 8, 1: 8193 * 8192 * 4, 2: 8193 * 8192 * 4 // 2}   # sums; a layer; its shard
    assert need_bytes(hybrid) == (split.total_bytes + INIT_CHUNK * 12 + sum(scratch.values()) +
                                  2 * thread_bytes() + RUNTIME_RESERVE)
    # the model state of the plan is the seed formula exactly (no padding: 8193 * 8192 divides by 4)
    state = sum(plan.bytes_by_kind[k] for k in ("params", "grads", "optimizer"))
    assert state == 16 * WIDE.num_params + 16 * 2          # the 10-wide output layer pads 82 -> 84 (x 16 B)


def test_at_the_boundary_the_plan_fits_and_one_byte_less_does_not():
    need = need_bytes(WIDE)
    assert preflight_error(WIDE, 0, Limited(need), 4) is None
    assert preflight_error(WIDE, 0, Limited(need - 1), 4) is not None


def test_a_refusal_names_the_stages_that_fit_on_these_ranks_with_their_needs():
    needs = [need_bytes(replace(WIDE, stage=s)) for s in range(4)]
    assert needs[0] > needs[1] > needs[2] > needs[3]
    offloaded = need_bytes(replace(WIDE, stage=3, offload=FileTier(None, 0)))   # the state in a file
    assert offloaded < needs[3] - 8 * WIDE.num_params // 4 + thread_bytes() + 10 ** 7   # K Psi / N less, plus
    # the I/O thread and the tiles
    message = preflight_error(WIDE, 0, Limited(needs[1] - 1), 4)
    assert message == (f"stage 0 on 4 ranks needs {needs[0] / 1e9:.1f} GB per rank, {(needs[1] - 1) / 1e9:.1f} GB "
                       f"available (set by the test): stage 2 ({needs[2] / 1e9:.1f} GB), stage 3 "
                       f"({needs[3] / 1e9:.1f} GB) or stage 3 with --offload-optimizer file "
                       f"({offloaded / 1e9:.1f} GB) fit on 4 ranks")
    assert "\n" not in message
    one = preflight_error(WIDE, 0, Limited(offloaded), 4)
    assert one.endswith(f"stage 3 with --offload-optimizer file ({offloaded / 1e9:.1f} GB) fits on 4 ranks")


def test_when_no_stage_fits_it_names_the_fewest_ranks_on_which_stage_3_does():
    shape = replace(WIDE, stage=3)
    available = need_bytes(replace(shape, num_ranks=16)) + 1000
    ranks, nbytes = fewest_ranks(shape, available)
    assert ranks == 16 and nbytes <= available
    assert need_bytes(replace(shape, num_ranks=15)) > available      # 15 would not do
    message = preflight_error(shape, 0, Limited(available), 4)
    assert message.endswith(f"no stage fits on 4 ranks; stage 3 fits on 16 ranks ({nbytes / 1e9:.1f} GB each, "
                            f"as many rows per rank)")
    tiny = preflight_error(shape, 0, Limited(10 ** 6), 4)           # the scratch alone exceeds it
    assert tiny.endswith("no stage fits on up to 1048576 ranks (see --dry-run)")


def test_the_hierarchical_variants_are_planned_and_offered_at_their_stages():
    hybrid = replace(WIDE, stage=1, num_ranks=8, grouping=Grouping(shard_group=2))
    needs = {s: need_bytes(replace(hybrid, stage=s)) for s in (1, 2, 3)}
    assert plan_memory(hybrid).bytes_by_kind["optimizer"] == 8 * Layout(WIDE.sizes, 2).full_numel // 2   # K Psi_pad / S
    message = preflight_error(hybrid, 0, Limited(needs[2]), 8)
    assert message.startswith("stage 1 in groups of 2 on 8 ranks needs")
    assert f"stage 2 in groups of 2 ({needs[2] / 1e9:.1f} GB)" in message
    hpz = replace(WIDE, stage=3, num_ranks=8, grouping=Grouping(hpz_node_size=4))
    flat3 = replace(hpz, grouping=FLAT)
    secondary = plan_memory(hpz).bytes_by_kind["params"] - plan_memory(flat3).bytes_by_kind["params"]
    assert secondary == 4 * Layout(WIDE.sizes, 8).full_numel // 4     # the node's slice, P Psi_pad / L
    message = preflight_error(hpz, 0, Limited(need_bytes(flat3)), 8)
    offloaded = need_bytes(replace(flat3, offload=FileTier(None, 0)))
    assert message.startswith("stage 3 with hpZ on 8 ranks needs") and message.endswith(
        f"stage 3 ({need_bytes(flat3) / 1e9:.1f} GB) or stage 3 with --offload-optimizer file "
        f"({offloaded / 1e9:.1f} GB) fit on 8 ranks")


def dry_run(*flags, env=None):
    return subprocess.run([sys.executable, "-m", "zerompi.train", "--dry-run", *map(str, flags)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, env=env)


def test_dry_run_prints_the_plan_of_every_stage_without_mpi():
    run = dry_run("--ranks", 4, "--hidden", "8192,8192,8192,8192", "--batch-size", 64, "--stage", 0)
    assert run.returncode == 0 and run.stderr == "", run.stderr
    lines = run.stdout.splitlines()
    assert lines[0] == "zerompi dry run: MLP 64-8192-8192-8192-8192-10 (201,965,578 parameters), float32"
    assert "4 ranks on 1 node, 16 rows per rank x 1 micro-batch" in lines[1]
    assert lines[3].split() == ["rank", "0,", "memory", "st", "0*", "st", "1", "st", "2", "st", "3"]
    plans = [plan_run(replace(WIDE, stage=s)) for s in range(4)]
    optimizer = next(line for line in lines if line.startswith("  optimizer")).split()[1:]
    assert optimizer == ["1.6", "GB", "403.9", "MB", "403.9", "MB", "403.9", "MB"]
    assert [p.bytes_by_kind["optimizer"] for p in plans] == [8 * 201_965_580] + [2 * 201_965_580] * 3
    gathers = next(line for line in lines if line.startswith("  all-gathers")).split()[1:]
    assert gathers == ["0", "5", "5", "10"]
    assert "    1 x all-reduce of 56 B over 4 ranks" in lines         # the step's sums: 5 + 2 float64
    crossing = dry_run("--ranks", 8, "--ranks-per-node", 4, "--hidden", "8192,8192,8192,8192", "--batch-size", 64,
                       "--stage", 3, "--hpz").stdout.splitlines()
    inter = next(line for line in crossing if line.startswith("  inter-node, rank 3")).split()[3:]
    assert inter == ["1.4", "GB"] * 3 + ["2.1", "GB", "1.4", "GB"]     # flat 2 Psi or 3 Psi (N-1)/N; hpZ 2 Psi


def test_dry_run_takes_n_from_the_launcher_and_nodes_from_the_flag():
    env = dict(os.environ, PMI_SIZE="8", PMI_RANK="0")
    run = dry_run("--ranks-per-node", 4, "--stage", 3, "--hpz", env=env)
    assert run.returncode == 0, run.stderr
    assert "8 ranks on 2 nodes" in run.stdout and "st 3 hpZ*" in run.stdout
    quiet = dry_run("--stage", 1, env=dict(env, PMI_RANK="3"))
    assert quiet.returncode == 0 and quiet.stdout == ""                # only the launcher's rank 0 prints


@pytest.mark.parametrize("flags, message", [
    ((), "--dry-run needs --ranks N (or a launcher that starts N processes)"),
    (("--ranks", 0), "--ranks must be in 1..1048576, got 0"),
    (("--ranks", 10 ** 12), "--ranks must be in 1..1048576, got 1000000000000"),
    (("--ranks", 4, "--ranks-per-node", 5), "--ranks-per-node must be in 1..4, got 5"),
    (("--ranks", 4, "--stage", 0, "--shard-group", 2), "--shard-group shards ZeRO's state: it needs --stage 1, 2 or 3"),
    (("--ranks", 3, "--hidden", "0"), "argument --hidden: widths must be positive integers, got '0'"),
    (("--ranks", 2, "--hidden", 10 ** 21), "the MLP 64-1000000000000000000000-10 has 7.5e+22 parameters: more "
                                           "than any machine can address (2^63 bytes hold 5.8e+17 of them at "
                                           "16 bytes each); choose smaller --hidden or --classes"),
    (("--ranks", 2, "--hidden", ",".join(["8"] * 5000)), "the MLP 64-...-10 (5001 layers) has more layers than the "
                                                         "4096 zerompi plans: choose fewer layers"),   # minutes
])
def test_dry_run_errors_are_one_line_exit_2(flags, message):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_", "PMIX_", "SLURM_"))}
    run = dry_run(*flags, env=env)
    assert run.returncode == 2 and run.stdout == "", run.stdout
    assert run.stderr.strip().splitlines() == [f"zerompi: error: {message}"], run.stderr


def test_ranks_without_dry_run_is_refused():
    run = subprocess.run([sys.executable, "-m", "zerompi.train", "--ranks", "4"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 2
    assert run.stderr.strip() == ("zerompi: error: --ranks and --ranks-per-node plan a run with --dry-run; a run "
                                  "has the launcher's ranks")


def test_the_search_for_the_fewest_ranks_allocates_next_to_nothing():
    """The preflight runs where memory is short: planning up to MOST_RANKS ranks must not itself
    run out (a rank's guards listed every job rank: 40 MB at 2^20 ranks; 100-140 MB in all, and a run under
    `ulimit -v` died of MemoryError, exit 7, instead of being refused)."""
    shape = replace(WIDE, sizes=(64, 4096, 4096, 10), stage=3, num_ranks=2, reads_layers=True)
    gc.collect()
    tracemalloc.start()
    try:
        message = preflight_error(shape, 0, Limited(100 * 10 ** 6), 2)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert message.endswith("no stage fits on up to 1048576 ranks (see --dry-run)")
    assert peak < 32 << 20, f"{peak / 2 ** 20:.0f} MiB"     # 2^20 ranks on one node: an 8 MiB node map


def test_a_deep_model_that_fits_nowhere_is_refused_without_searching_for_minutes():
    """The plan of 2,000 layers at 2^20 ranks took 55 s (each of its 6,000 collectives counted the
    nodes of 2^20 ranks anew), and the search for the fewest ranks plans some twenty of them: no
    answer in 300 s. (A bound that tells an answer from a search without end, not a speed.)"""
    import time
    shape = replace(WIDE, sizes=(64,) + (8,) * 2000 + (10,), stage=3, num_ranks=2)
    start = time.monotonic()
    message = preflight_error(shape, 0, Limited(10 ** 6), 2)
    assert message.endswith("no stage fits on up to 1048576 ranks (see --dry-run)"), message
    assert time.monotonic() - start < 120


@pytest.mark.parametrize("file_dtype", ["float32", "float64"])
@pytest.mark.parametrize("run_dtype", ["float32", "bfloat16"])
def test_starting_from_a_weights_file_stays_within_the_plans_start_allowance(file_dtype, run_dtype, tmp_path):
    """--init-weights reads a whole layer at a time: what that allocates beside the engine's
    buffers (the file's tensors, the float64 layer, its compute-dtype copy) is at most
    start_transient_bytes, whatever float dtype the file holds (--save-weights of a float64 run
    writes float64)."""
    from zerompi.adam import AdamConfig
    from zerompi.stages.params import set_layer_params
    from zerompi.checkpoint.weights import read_weights
    from zerompi.comm import Communicator
    from zerompi.engine import build_engine
    shape = RunShape((32, 1024, 1024, 10), 0, precision_for(run_dtype), 8, 1, reads_layers=True)
    engine = build_engine(list(shape.sizes), 0, shape.precision, AdamConfig(), 8, Communicator())
    path = str(tmp_path / "w.npz")
    rng = np.random.default_rng(0)
    np.savez(path, **{name: rng.standard_normal(shape_, dtype=np.float64).astype(file_dtype)
                      for layer in engine.layout.layers
                      for name, shape_ in zip(engine.layout.tensor_names(layer),
                                              [(layer.out_features, layer.in_features), (layer.out_features,)])})
    gc.collect()
    tracemalloc.start()
    try:
        for layer, values in read_weights(path, engine.layout):
            set_layer_params(engine.stage, layer, values)
            del values
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak <= start_transient_bytes(shape), (peak, start_transient_bytes(shape))


@pytest.mark.parametrize("command", [
    ["zerompi.train", "--dry-run", "--ranks", "4"],
    ["zerompi.memory", "--params", "7e9"],
    ["zerompi.plan", "--ranks", "2", "--hidden", "64", "--batch-size", "8", "--gemm-gflops", "50",
     "--mem-bandwidth-gbs", "10", "--intra-bandwidth-gbs", "5", "--intra-latency-us", "1"],
], ids=["dry-run", "memory", "plan"])
def test_printing_into_a_closed_pipe_exits_0_without_a_traceback(command):
    """`... | head -2`: the reader leaves early; the planning commands must not raise."""
    read_end, write_end = os.pipe()
    os.close(read_end)                                   # a reader that has gone already
    try:
        run = subprocess.run([sys.executable, "-m", *command], cwd=ROOT, stdout=write_end, stderr=subprocess.PIPE,
                             text=True, timeout=120)
    finally:
        os.close(write_end)
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr


def test_a_plan_of_an_overlapped_run_leaves_no_thread_running():
    """The plan builds --overlap's communication thread as the run does, and ends it: a
    preflight that plans several stages must not leave threads (and their address space) behind."""
    before = threading.active_count()
    for stage in range(4):
        shape = replace(WIDE, stage=stage, overlap=OverlapConfig(enabled=True))
        assert plan_run(shape).threads == 1 and plan_memory(shape).threads == 1
    assert threading.active_count() == before
