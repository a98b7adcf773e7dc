"""Observability: --metrics (JSON lines), --trace (Chrome trace), the live progress line.

    --metrics   one line per step with the documented keys; the loss and accuracy equal the printed
                progress lines; the comm bytes and calls add up to the end-of-run report's ledger
                totals; memory (ledger total, peak RSS) of every rank only on step 1, every
                --log-every steps and the last, equal to the report's; a resumed run appends
    --trace     parses as Chrome trace JSON; every rank has step, compute and comm spans, properly
                nested in their steps and in algorithm order; its collectives are the ledger's calls
    progress    a real run on a pty draws the live line, --progress lines does not; bad --metrics /
                --trace / --progress values are errors (where auto draws it, and how wide:
                tests/program/test_progress_display.py)
    restarts    every metrics line carries its wall-clock time and how many times the training
                was restarted from a checkpoint, across resumes and from a checkpoint without the count
"""
import fcntl
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import time
from contextlib import contextmanager
from types import SimpleNamespace

import pytest

from test_cli import ERROR_MARK, files_under, launch, loss_lines, train_ok
from zerompi.step import StepResult
from zerompi.train.outputs.progress import Progress
from zerompi.ledger import MEMORY_KINDS
from zerompi.checkpoint.files import MANIFEST
from zerompi.checkpoint.manifest import manifest_text

METRICS_KEYS = {"step", "time", "restarts", "loss", "accuracy", "lr", "grad_norm", "applied", "loss_scale", "step_seconds",
                "samples_per_second", "comm"}


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


# ----------------------------------------------------------------------------------------------
# --metrics
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("stage", [1, 3])
def test_metrics_lines_match_the_printed_loss_and_the_ledger(tmp_path, stage):
    steps, every, batch = 7, 3, 48
    run = train_ok(3, "--stage", stage, "--steps", steps, "--log-every", every, "--batch-size", batch,
                   "--hidden", "24,16", "--metrics", "m.jsonl", "--report", "json", cwd=tmp_path)
    lines = read_jsonl(tmp_path / "m.jsonl")
    assert [line["step"] for line in lines] == list(range(1, steps + 1))
    for line in lines:
        assert METRICS_KEYS <= set(line), line
        assert line["applied"] and line["step_seconds"] > 0 and line["loss"] > 0
        assert line["samples_per_second"] == pytest.approx(batch / line["step_seconds"])
        assert set(line["comm"]) == {"grads", "params", "metrics"}
        assert line["comm"]["metrics"]["calls"] == 1                  # the step's one all-reduce
    # memory: on step 1, every --log-every steps and the last step only
    assert [line["step"] for line in lines if "memory" in line] == [1, 3, 6, 7]

    # the printed progress lines average the steps since the last line: so must the metrics
    printed = [line for line in run.stderr.splitlines() if line.startswith("step ") and "loss" in line]
    assert len(printed) == len(loss_lines(run.stderr)) == 3
    for text, window in zip(printed, (lines[0:3], lines[3:6], lines[6:7])):
        loss = sum(line["loss"] for line in window) / len(window)
        accuracy = 100 * sum(line["accuracy"] for line in window) / len(window)
        assert f"loss {loss:.4g}" in text, (text, loss)
        assert f"acc {accuracy:.1f}%" in text, (text, accuracy)

    # communication: the per-step deltas add up to the report's ledger totals (rank 0)
    report = json.loads(run.stdout)
    rank0 = report["per_rank"][0]
    for key, column in (("bytes", "comm_bytes"), ("calls", "calls")):
        total = sum(line["comm"][p][key] for line in lines for p in ("grads", "params"))
        assert total == pytest.approx(rank0[column] * steps, rel=1e-12)
    elements = sum(line["comm"]["grads"]["elements"] + line["comm"]["params"]["elements"] for line in lines)
    assert elements / steps == pytest.approx(report["comm_formula_padded_elements_per_step"], rel=1e-12)

    # memory: every rank's ledger total is the report's sum of its kinds; RSS is the OS's, positive
    for line in lines:
        if "memory" in line:
            assert line["memory"]["ledger_bytes"] == [sum(row[k] for k in MEMORY_KINDS) for row in report["per_rank"]]
            assert all(0 < rss <= row["peak_rss"] for rss, row in zip(line["memory"]["peak_rss_bytes"],
                                                                       report["per_rank"]))


def test_metrics_file_is_truncated_by_a_fresh_run_and_appended_by_a_resumed_one(tmp_path):
    flags = ("--hidden", 8, "--batch-size", 16, "--log-every", 0, "--report", "none", "--metrics", "m.jsonl")
    train_ok(2, *flags, "--steps", 3, "--save-dir", "ckpt", cwd=tmp_path)
    train_ok(2, *flags, "--steps", 5, "--save-dir", "ckpt", "--resume", cwd=tmp_path)
    assert [line["step"] for line in read_jsonl(tmp_path / "m.jsonl")] == [1, 2, 3, 4, 5]
    train_ok(2, *flags, "--steps", 2, cwd=tmp_path)
    assert [line["step"] for line in read_jsonl(tmp_path / "m.jsonl")] == [1, 2]


# ----------------------------------------------------------------------------------------------
# --trace
# ----------------------------------------------------------------------------------------------

def nesting_problems(spans):
    """Spans [(name, start, end)] of one rank: every span must lie inside the enclosing one or
    after it (a stack); returns the violations."""
    problems, stack = [], []
    for name, start, end in sorted(spans, key=lambda s: (s[1], -s[2])):
        while stack and start >= stack[-1][2] - 0.2:               # 0.2 us: the file's rounding
            stack.pop()
        if stack and end > stack[-1][2] + 0.2:
            problems.append(f"{name} [{start}, {end}] overlaps {stack[-1]}")
        stack.append((name, start, end))
    return problems


@pytest.mark.parametrize("stage", [0, 3])
def test_trace_has_nested_compute_and_comm_spans_on_every_rank(tmp_path, stage):
    n, steps, layers = 3, 3, 3
    train_ok(n, "--stage", stage, "--steps", steps, "--hidden", "24,16", "--batch-size", 48, "--log-every", 0,
             "--report", "none", "--trace", "t.json", "--metrics", "m.jsonl", cwd=tmp_path)
    with open(tmp_path / "t.json") as f:
        events = json.load(f)["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {r: f"rank {r}" for r in range(n)}
    metrics = read_jsonl(tmp_path / "m.jsonl")
    for rank in range(n):
        mine = [e for e in events if e["ph"] == "X" and e["pid"] == rank]
        assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in mine)
        assert {e["cat"] for e in mine} == {"step", "compute", "comm"}
        step_spans = sorted((e for e in mine if e["cat"] == "step"), key=lambda e: e["ts"])
        assert [e["name"] for e in step_spans] == [f"step {s}" for s in range(1, steps + 1)]
        assert nesting_problems([(e["name"], e["ts"], e["ts"] + e["dur"]) for e in mine]) == []
        for step, span in enumerate(step_spans, start=1):
            inside = sorted((e for e in mine if e["cat"] != "step" and span["ts"] - 0.2 <= e["ts"]
                             and e["ts"] + e["dur"] <= span["ts"] + span["dur"] + 0.2), key=lambda e: e["ts"])
            compute = [e["name"] for e in inside if e["cat"] == "compute"]
            assert compute == ([f"forward {u}" for u in range(layers)] + ["loss"] +
                               [f"backward {u}" for u in reversed(range(layers))] + [f"adam {u}" for u in range(layers)])
            comm = [e for e in inside if e["cat"] == "comm"]
            assert all(e["args"]["bytes"] > 0 and e["name"] == f"{e['args']['op']} {e['args']['purpose']}"
                       for e in comm)
            if rank == 0:                      # the same collectives the ledger counted in that step
                counted = {p: c["calls"] for p, c in metrics[step - 1]["comm"].items()}
                traced = {p: sum(e["args"]["purpose"] == p for e in comm) for p in counted}
                assert traced == counted
            ops = {e["args"]["op"] for e in comm}
            assert ops == ({"allreduce"} if stage == 0 else {"allgather", "reduce_scatter", "allreduce"})


def test_trace_with_overlap_has_the_communication_threads_collectives(tmp_path):
    """--overlap: grads and params collectives run on the thread: trace thread 1, all of them."""
    steps = 3
    train_ok(2, "--stage", 1, "--steps", steps, "--hidden", "24,16", "--batch-size", 48, "--log-every", 0,
             "--report", "json", "--trace", "t.json", "--overlap", "--bucket-mb", 0, cwd=tmp_path)
    with open(tmp_path / "t.json") as f:
        events = json.load(f)["traceEvents"]
    thread_names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert thread_names[(0, 1)].startswith("communication thread")
    for rank in range(2):
        on_thread = [e for e in events if e["ph"] == "X" and e["pid"] == rank and e["tid"] == 1]
        assert on_thread and {e["cat"] for e in on_thread} == {"comm"}
        assert {e["args"]["purpose"] for e in on_thread} == {"grads", "params"}
        # stage 1, per-layer buckets, 3 layers: 3 reduce-scatters and 3 all-gathers per step
        assert sum(e["args"]["op"] == "reduce_scatter" for e in on_thread) == 3 * steps
        assert sum(e["args"]["op"] == "allgather" for e in on_thread) == 3 * steps


# ----------------------------------------------------------------------------------------------
# progress display
# ----------------------------------------------------------------------------------------------

def open_terminal(columns):
    """A pseudo-terminal (leader, follower) of `columns` x 24 characters (a fresh one has 0 x 0)."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    return leader, follower


def run_on_pty(*flags, cwd, expected_status=0, columns=80, env=None):
    """python -m zerompi.train (one rank, no mpirun) with stdout and stderr on a pseudo-terminal."""
    leader, follower = open_terminal(columns)
    process = subprocess.Popen([sys.executable, "-m", "zerompi.train", *map(str, flags)], cwd=cwd,
                               stdout=follower, stderr=follower, stdin=subprocess.DEVNULL, env=env)
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:                                          # EIO: the child closed the pty
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    assert process.wait(timeout=120) == expected_status
    return b"".join(chunks).decode()


def test_live_line_on_a_terminal_and_plain_lines_otherwise(tmp_path):
    flags = ("--steps", 40, "--hidden", 16, "--log-every", 20, "--report", "none")
    text = run_on_pty(*flags, cwd=tmp_path)
    assert re.search(r"\rstep \d+/40 \|.*\| loss [\d.]+ \| [\d.]+ steps/s \| 00:00<00:00", text), text
    assert re.search(r"\rstep 20/40  loss [^\r]*\r\n", text) and "held-out accuracy" in text   # log lines, whole
    plain = run_on_pty(*flags, "--progress", "lines", cwd=tmp_path)
    assert "\r\n" in plain and "\x1b[" not in plain.replace("\r\n", "") and "steps/s" not in plain
    assert "\r" not in plain.replace("\r\n", "") and "step 20/40  loss" in plain
    piped = train_ok(1, *flags, cwd=tmp_path)                    # auto, not a terminal: plain lines
    assert "\x1b[" not in piped.output and "\r" not in piped.output and "step 20/40  loss" in piped.stdout


def test_a_diverged_run_erases_the_live_line_before_its_error(tmp_path):
    text = run_on_pty("--steps", 40, "--hidden", 16, "--log-every", 0, "--report", "none", "--lr", "1e30", "--weight-decay", 0,
                      "--progress", "live", cwd=tmp_path, expected_status=3)
    before_error = text[:text.index("zerompi: error:")]
    assert "steps/s" in before_error and re.search(r"\r +\r$", before_error), before_error  # drawn, then erased


def test_progress_live_under_mpirun_draws_on_rank_0_only(tmp_path):
    run = train_ok(2, "--steps", 30, "--hidden", 16, "--log-every", 0, "--report", "none", "--progress", "live",
                   cwd=tmp_path)
    assert run.stdout.count("step 0/30 |") == 1 and "steps/s" in run.stdout     # drawn by rank 0 alone
    assert run.stdout.count("held-out accuracy") == 1


@pytest.mark.parametrize("flags, keyword", [
    (["--metrics", "nowhere/m.jsonl"], "cannot save metrics to nowhere/m.jsonl"),
    (["--trace", "nowhere/t.json"], "cannot save the trace to nowhere/t.json"),
    (["--trace", "."], "it is a folder"),
    (["--trace", "/proc/t.json"], "cannot write the trace to /proc/t.json: No such file or directory"),
    (["--trace", "/dev/null"], "cannot save the trace to /dev/null: it exists and is not a regular file"),
    (["--metrics", "fifo"], "cannot save metrics to fifo: it exists and is not a regular file"),  # never waits
    (["--metrics", "/dev/full"], "cannot save metrics to /dev/full: it exists and is not a regular file"),
    (["--progress", "fancy"], "argument --progress: invalid choice: 'fancy'"),
])
def test_bad_observability_flags(tmp_path, flags, keyword):
    os.mkfifo(tmp_path / "fifo")
    run = launch(2, *flags, "--steps", 2, cwd=tmp_path)
    assert run.returncode == 2, run.describe()
    assert run.stderr.count(ERROR_MARK) == 1 and keyword in run.stderr, run.describe()
    assert files_under(tmp_path) == ["fifo"]


# ----------------------------------------------------------------------------------------------
# Side files: a full disk costs one warning line, never the weights; the trace streams
# ----------------------------------------------------------------------------------------------

WARNING_MARK = "zerompi: warning:"
SIDE = ["--hidden", 8, "--batch-size", 16, "--log-every", 0, "--report", "none", "--save-weights", "w.npz"]


def warning_lines(run):
    return [line for line in run.output.splitlines() if WARNING_MARK in line]


@contextmanager
def small_tmpfs(folder, size="64k"):
    """A file system of `size` bytes mounted on folder (root only), unmounted at the end."""
    folder.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)


@pytest.mark.parametrize("side", ["--metrics", "--trace"])
def test_a_full_disk_under_a_side_file_costs_one_warning_not_the_weights(side, tmp_path):
    """The disk fills in the middle of the run (64 KiB: a few hundred metrics lines or trace events)."""
    with small_tmpfs(tmp_path / "full") as full:
        run = launch(2, *SIDE, "--steps", 300, side, full / "side.json", cwd=tmp_path)
        assert run.returncode == 0 and "Traceback" not in run.output and ERROR_MARK not in run.output, \
            run.describe()
        lines = warning_lines(run)
        assert len(lines) == 1 and "No space left on device" in lines[0], run.describe()
        assert "held-out accuracy" in run.output and os.path.exists(tmp_path / "w.npz"), run.describe()
        left = files_under(full)
        assert left == (["side.json"] if side == "--metrics" else []), left     # no temporary trace file


def test_the_trace_streams_to_disk_with_a_bounded_number_of_events_in_memory(tmp_path):
    """300 steps of ~20 events per rank: each rank holds only the events since the last flush."""
    driver = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support", "trace_driver.py")
    run = launch(2, *SIDE, "--steps", 300, "--trace", "t.json", cwd=tmp_path, program=(driver,))
    assert run.returncode == 0, run.describe()
    with open(tmp_path / "t.json") as f:
        events = json.load(f)["traceEvents"]
    for rank in range(2):
        mine = [e for e in events if e["ph"] == "X" and e["pid"] == rank]
        assert sum(e["cat"] == "step" for e in mine) == 300
        held = int(re.search(rf"rank {rank} held at most (\d+) trace events", run.stdout).group(1))
        assert held <= len(mine) / 4, (held, len(mine))
    assert files_under(tmp_path) == ["t.json", "w.npz"]           # no part file left


def test_a_log_window_in_which_every_step_was_skipped_says_so():
    printed = []
    comm = SimpleNamespace(print0=lambda text, file=None: printed.append(text))
    cfg = SimpleNamespace(steps=10, batch_size=16)
    progress = Progress(cfg, comm, out=None)
    for _ in range(2):
        progress.add(StepResult(loss=float("nan"), correct=0, grad_norm=float("inf"), applied=False))
    progress.print_line(4, 1e-3, SimpleNamespace(enabled=True, scale=8192.0))
    assert len(printed) == 1 and "loss" not in printed[0] and "acc" not in printed[0], printed
    assert printed[0].startswith("step  4/10  all 2 steps skipped  lr 1.0e-3  scale 8192  "), printed


def test_a_tiny_collective_timeout_does_not_make_the_watchdog_spin():
    """--collective-timeout 1e-300: the watchdog thread polled every 2.5e-301 s, a busy loop
    that took a core from the rank it watches."""
    from zerompi.observe.watchdog import CollectiveWatchdog
    watchdog = CollectiveWatchdog(1e-300, rank=0, abort=lambda code: None)
    assert watchdog.poll >= 0.01
    assert CollectiveWatchdog(600, rank=0, abort=lambda code: None).poll == 1.0


# ----------------------------------------------------------------------------------------------
# Wall-clock time and restarts in every metrics line
# ----------------------------------------------------------------------------------------------

def test_metrics_lines_carry_time_and_the_restart_count_across_resumes(tmp_path):
    flags = ("--hidden", 8, "--batch-size", 16, "--log-every", 0, "--report", "none", "--metrics", "m.jsonl",
             "--save-dir", "ckpt")
    before = time.time()
    train_ok(2, *flags, "--steps", 2, cwd=tmp_path)
    train_ok(2, *flags, "--steps", 4, "--resume", cwd=tmp_path)
    env = dict(os.environ, SLURM_RESTART_COUNT="7")              # Slurm's own count, recorded beside
    run = launch(2, *flags, "--steps", 6, "--resume", cwd=tmp_path, env=env)
    assert run.returncode == 0, run.describe()
    lines = read_jsonl(tmp_path / "m.jsonl")
    assert [(line["step"], line["restarts"]) for line in lines] == [(1, 0), (2, 0), (3, 1), (4, 1), (5, 2), (6, 2)]
    times = [line["time"] for line in lines]
    assert before < times[0] and times == sorted(times) and times[-1] <= time.time()
    assert [line.get("slurm_restarts") for line in lines] == [None] * 4 + [7, 7]
    with open(tmp_path / "ckpt" / "step_00000006" / MANIFEST) as f:
        assert json.load(f)["restarts"] == 2


def test_a_checkpoint_without_the_restart_count_is_counted_from_there(tmp_path):
    """A manifest written before the count was kept (no "restarts"): its run counts as 0 restarts."""
    flags = ("--hidden", 8, "--batch-size", 16, "--log-every", 0, "--report", "none", "--save-dir", "ckpt")
    train_ok(2, *flags, "--steps", 2, cwd=tmp_path)
    path = tmp_path / "ckpt" / "step_00000002" / MANIFEST
    with open(path) as f:
        manifest = json.load(f)
    manifest = {key: value for key, value in manifest.items() if key not in ("restarts", "manifest_sha256")}
    path.write_text(manifest_text(manifest))
    train_ok(2, *flags, "--steps", 3, "--resume", "--metrics", "m.jsonl", cwd=tmp_path)
    assert [line["restarts"] for line in read_jsonl(tmp_path / "m.jsonl")] == [1]


@pytest.mark.parametrize("value, read", [("3", 3), ("0", 0), ("", None), ("²", None), ("-1", None), ("3.0", None),
                                         ("1" * 400, None), (" 4", None)])
def test_slurm_restart_count_is_read_only_when_it_is_a_count(value, read):
    """SLURM_RESTART_COUNT is Slurm's to set; anything but ASCII digits (str.isdigit() also takes
    "²", which int() refuses) or a number too large for the metrics is left out, never a traceback."""
    from zerompi.train.outputs.metrics import slurm_restarts
    assert slurm_restarts({"SLURM_RESTART_COUNT": value} if value else {}) == read
