"""Real faults on one rank of a real `mpirun` job: the job ends, once, clearly, in bounded time.

tests/support/fault_driver.py runs the real zerompi.train and, at one step, on chosen ranks only: raises an
exception, SIGKILLs or SIGSTOPs its own process, puts an inf in its input rows, or a NaN in one
layer's gradient. Each test asserts the exit status, that the report is one line printed once,
that it names what it should (rank, collective, step, layer), and that no process is left behind.
"""
import os
import threading
import time

import numpy as np
import pytest

from test_cli import ERROR_MARK, launch, load_weights, train_ok

DRIVER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support", "fault_driver.py")
TINY = ["--steps", 20, "--hidden", 8, "--batch-size", 12, "--log-every", 0, "--report", "none"]
SIGNAL_FAST = 30                 # seconds: a signal or a timed-out collective ends a run well within this


def with_fault(n, fault, ranks, step, *flags, cwd, timeout=None):
    return launch(n, fault, ranks, step, *TINY, *flags, cwd=cwd, program=(DRIVER,),
                  **({} if timeout is None else {"timeout": timeout}))


def error_lines(run):
    return [line for line in run.output.splitlines() if ERROR_MARK in line]


def processes_in(folder):
    """Processes whose working folder is `folder` (a test's ranks run in its own tmp_path)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.readlink(f"/proc/{pid}/cwd") == str(folder):
                found.append(pid)
        except OSError:
            pass
    return found


@pytest.mark.parametrize("ranks", ["1", "all"])
def test_an_exception_ends_the_job_with_one_report_naming_the_rank(ranks, tmp_path):
    run = with_fault(3, "raise", ranks, 3, cwd=tmp_path)
    assert run.returncode == 1, run.describe()
    failing = "1" if ranks == "1" else "0"          # every rank failed: the lowest one reports
    assert error_lines(run) == [f"zerompi: error: rank {failing} failed: RuntimeError: injected fault at step 3"], \
        run.describe()
    assert run.output.count("Traceback") == 1, run.describe()


def test_memory_that_runs_out_after_the_preflight_is_one_line_naming_the_rank(tmp_path):
    """The preflight found the plan fits (zerompi/plan/preflight.py), then an allocation fails
    (another process took the memory): one line, exit OUT_OF_MEMORY (7), no traceback."""
    run = with_fault(2, "memory", "1", 2, "--save-weights", "out.npz", cwd=tmp_path)
    assert run.returncode == 7, run.describe()
    lines = error_lines(run)
    assert len(lines) == 1 and lines[0].startswith("zerompi: error: rank 1 ran out of memory (Unable to allocate"), \
        run.describe()
    assert "--dry-run" in lines[0] and "Traceback" not in run.output, run.describe()
    assert not os.path.exists(tmp_path / "out.npz")


def test_a_rank_killed_mid_step_ends_the_job(tmp_path):
    """mpirun (MPICH's hydra) ends the whole job when one rank dies, with the watchdog off
    (measured: about 1 s); under srun that takes --kill-on-bad-exit=1, or the watchdog."""
    run = with_fault(3, "kill", "1", 3, "--collective-timeout", 0, cwd=tmp_path)
    assert run.returncode != 0, run.describe()
    assert "Killed" in run.output or "signal 9" in run.output, run.describe()
    assert not os.path.exists(tmp_path / "out.npz")
    assert processes_in(tmp_path) == []


@pytest.mark.parametrize("stage", [0, 3])
def test_a_stopped_rank_is_caught_by_the_collective_timeout(stage, tmp_path):
    """SIGSTOP: the rank is alive but never answers; without the watchdog the job would wait forever."""
    run = with_fault(3, "stop", "1", 3, "--stage", stage, "--collective-timeout", 2, cwd=tmp_path)
    assert run.returncode == 6, run.describe()
    lines = error_lines(run)
    assert len(lines) == 1, run.describe()
    collective = "allreduce (grads" if stage == 0 else "allgather (params"
    assert "zerompi: error: rank 0 waited" in lines[0] and collective in lines[0], run.describe()
    assert "--collective-timeout 2" in lines[0], run.describe()
    time.sleep(0.5)                                 # the launcher's clean-up of the stopped rank
    assert processes_in(tmp_path) == []


def test_a_rank_stopped_before_the_trace_is_gathered_is_caught_by_the_collective_timeout(tmp_path):
    """The trace's gather every 32 steps follows the step: rank 0 used to wait there unwatched."""
    from zerompi.observe.trace import FLUSH_EVERY_STEPS
    run = with_fault(2, "stop-after", "1", FLUSH_EVERY_STEPS - 1, "--steps", 40, "--trace", "t.json",
                     "--collective-timeout", 2, cwd=tmp_path, timeout=SIGNAL_FAST)
    timed_out_once(run, "gather (bookkeeping", tmp_path)


def timed_out_once(run, collective, folder):
    """The watchdog ended the job (exit 6) with one line: rank 0 waited in that collective; nothing
    of the job runs in folder any more."""
    assert run.returncode == 6, run.describe()
    lines = error_lines(run)
    assert len(lines) == 1 and "rank 0 waited" in lines[0] and collective in lines[0], run.describe()
    time.sleep(0.5)                                 # the launcher's clean-up of the stopped rank
    assert processes_in(folder) == []


def test_inf_in_one_ranks_rows_names_the_step_the_layer_and_the_rank(tmp_path):
    run = with_fault(3, "inf-input", "2", 3, "--save-weights", "w.npz", cwd=tmp_path)
    assert run.returncode == 3, run.describe()
    lines = error_lines(run)
    assert len(lines) == 1, run.describe()
    assert lines[0].startswith("zerompi: error: step 4: the gradient is not finite, first in layer 0"), run.describe()
    assert "the loss is not finite (nan), first on rank 2" in lines[0], run.describe()
    weights = load_weights(tmp_path / "w.npz")      # the last good weights: finite
    assert all(np.all(np.isfinite(w)) for w in weights.values())


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_nan_in_one_layers_gradient_on_one_rank_names_that_layer(stage, tmp_path):
    run = with_fault(3, "nan-grad:1", "1", 5, "--stage", stage, "--hidden", "8,6", cwd=tmp_path)
    assert run.returncode == 3, run.describe()
    lines = error_lines(run)
    assert len(lines) == 1, run.describe()
    assert "step 6: the gradient is not finite, first in layer 1 (layers.1.*)" in lines[0], run.describe()
    assert "the loss is " in lines[0] and "first on rank" not in lines[0], run.describe()   # the loss was fine


def test_check_collectives_passes_a_full_run_and_changes_no_bit(tmp_path):
    """The check on runs that use every kind of collective (stages 1 and 3, checkpoints, consolidated
    weights, the end-of-run report) finds no false disagreement, and the weights are bitwise those of a run without it."""
    common = ["--hidden", "7,5", "--batch-size", 12, "--steps", 4, "--log-every", 0, "--report", "none",
              "--save-every", 2]          # the default data: 300 held-out rows, a short final pass
    for stage in (1, 3):                            # stage 3: every kind of collective but all-reduce of grads
        for check in (False, True):
            folder = tmp_path / f"stage{stage}-{check}"
            folder.mkdir()
            train_ok(3, "--stage", stage, *common, "--save-dir", "ckpt", "--save-weights", "w.npz",
                     *(["--check-collectives"] if check else []), cwd=folder)
        plain, checked = (load_weights(tmp_path / f"stage{stage}-{c}" / "w.npz") for c in (False, True))
        assert all(np.array_equal(plain[name], checked[name]) for name in plain), stage


# ----------------------------------------------------------------------------------------------
# Signals: start-up, Ctrl-C, a second Ctrl-C, SIGUSR1 without --save-dir
# ----------------------------------------------------------------------------------------------



@pytest.mark.parametrize("name", ["TERM", "INT", "USR1"])
def test_a_signal_during_start_up_ends_the_run_at_once(name, tmp_path):
    """Every rank blocked in start-up (here: reading its data) when mpirun forwards the signal: with
    --save-dir set, the run used to defer it to a step that never came, and hung."""
    run = launch(2, f"startup-signal:{name}:mpirun", "0", 0, *TINY, "--save-dir", "ck", cwd=tmp_path,
                 program=(DRIVER,), timeout=SIGNAL_FAST)
    assert run.returncode == 130, run.describe()
    lines = error_lines(run)
    assert len(lines) == 1 and f"SIG{name} during start-up" in lines[0], run.describe()
    assert "Traceback" not in run.output, run.describe()
    assert not os.path.exists(tmp_path / "ck")


def test_a_rank_stuck_reading_its_config_is_caught_by_the_collective_timeout(tmp_path):
    """The first collectives, before the run's config was read, were not watched: the other ranks
    waited there for good, whatever --collective-timeout said."""
    run = with_fault(2, "parse-stall", "1", 0, "--collective-timeout", 2, cwd=tmp_path, timeout=SIGNAL_FAST)
    timed_out_once(run, "allreduce_min (control", tmp_path)


def test_a_rank_stopped_before_the_node_map_is_caught_by_the_collective_timeout(tmp_path):
    """MPI's first collective after it starts (zerompi/nodes.py: which node each rank is on)."""
    run = with_fault(2, "nodemap-stop", "1", 0, "--collective-timeout", 2, cwd=tmp_path, timeout=SIGNAL_FAST)
    timed_out_once(run, "split_type (control", tmp_path)


@pytest.mark.parametrize("name, to", [("TERM", "self"), ("TERM", "mpirun"), ("INT", "mpirun")])
def test_a_signal_while_a_stopped_peer_keeps_the_start_up_waiting_ends_the_run_at_once(name, to, tmp_path):
    """Rank 1 stopped; rank 0 waits in the first collective (the watchdog at its default 600 s), and is
    signalled: the signal used to wait in the collective for as long as rank 1 was away."""
    run = with_fault(2, f"parse-stop:{name}:{to}", "1", 0, "--save-dir", "ck", cwd=tmp_path, timeout=SIGNAL_FAST)
    assert run.returncode == 130, run.describe()
    lines = error_lines(run)
    assert lines == [f"zerompi: error: rank 0: SIG{name} during start-up: ending the run"], run.describe()
    assert "Traceback" not in run.output, run.describe()
    time.sleep(0.5)
    assert processes_in(tmp_path) == []


def test_ctrl_c_finishes_the_step_writes_a_checkpoint_and_exits_4(tmp_path):
    """Ctrl-C in a terminal: mpirun (hydra) forwards one SIGINT to every rank; like SIGTERM."""
    run = with_fault(2, "signal:INT:mpirun", "0", 3, "--save-dir", "ck", cwd=tmp_path)
    assert run.returncode == 4, run.describe()
    assert "Traceback" not in run.output and error_lines(run) == [], run.describe()
    done = [line for line in run.output.splitlines() if "signalled: checkpoint written to ck" in line]
    assert len(done) == 1, run.describe()
    step = int(done[0].split(":")[0].split()[1])
    assert 4 <= step < 20 and os.path.isdir(tmp_path / "ck" / f"step_{step:08d}"), run.describe()


EXIT_SIGNALS = """
import os, signal, sys
from zerompi.train.loop.run import main
try:
    main(sys.argv[1:])
except SystemExit as e:
    print("exit", e.code)
for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
    os.kill(os.getpid(), sig)          # what a launcher forwarding a late signal does
print("survived", flush=True)
"""


@pytest.mark.parametrize("flags", [[], ["--steps", 0]], ids=["done", "bad-input"])
def test_once_the_run_has_ended_a_stop_signal_cannot_change_its_exit_status(flags, tmp_path):
    """A second SIGTERM just after a preemption's checkpoint ended the job with status 15, not 4:
    Python puts its signal handlers back to the default before MPI_Finalize, so a signal then
    killed the rank. Every way out of main now leaves the stop signals ignored."""
    run = launch(1, *TINY, *flags, cwd=tmp_path, program=("-c", EXIT_SIGNALS))
    assert run.returncode == 0 and "survived" in run.stdout, run.describe()
    assert ("exit 2" in run.stdout) == bool(flags), run.describe()


def test_a_second_ctrl_c_ends_the_run_at_once(tmp_path):
    run = with_fault(2, "signal:INT,INT:self", "1", 3, "--save-dir", "ck", "--save-weights", "w.npz", cwd=tmp_path)
    assert run.returncode == 130, run.describe()
    assert error_lines(run) == ["zerompi: error: rank 1: a second SIGINT: ending the run at once, "
                                "without a checkpoint"], run.describe()
    assert "Traceback" not in run.output, run.describe()
    assert not os.path.exists(tmp_path / "w.npz")
    # no checkpoint; rank 0's lock stays when the abort came from another rank, and is stale at once
    assert os.listdir(tmp_path / "ck") in ([], [".lock"]), os.listdir(tmp_path / "ck")
    again = train_ok(2, *TINY, "--save-dir", "ck", "--resume", cwd=tmp_path)
    assert "no checkpoint in ck yet: starting from step 0" in again.output, again.describe()


@pytest.mark.parametrize("name", ["INT", "TERM"])
def test_ctrl_c_or_sigterm_without_save_dir_ends_the_run_with_one_line(name, tmp_path):
    run = with_fault(2, f"signal:{name}:mpirun", "0", 3, "--save-weights", "w.npz", cwd=tmp_path)
    assert run.returncode == 130, run.describe()
    lines = error_lines(run)
    assert len(lines) == 1 and f"SIG{name} and no --save-dir: ending the run" in lines[0], run.describe()
    assert "Traceback" not in run.output, run.describe()
    assert not os.path.exists(tmp_path / "w.npz")


def test_sigusr1_without_save_dir_is_reported_and_training_goes_on(tmp_path):
    run = with_fault(2, "signal:USR1:self", "1", 3, "--save-weights", "w.npz", cwd=tmp_path)
    assert run.returncode == 0, run.describe()
    said = [line for line in run.output.splitlines() if "SIGUSR1" in line]
    assert said == ["zerompi: warning: rank 1: SIGUSR1 but no --save-dir: no checkpoint to write; "
                    "training goes on"], run.describe()
    assert os.path.exists(tmp_path / "w.npz")


# ----------------------------------------------------------------------------------------------
# The watchdog: an announced abort always ends the job non-zero
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("overlap", [[], ["--stage", 1, "--overlap"]], ids=["plain", "overlap"])
def test_a_watchdog_that_announced_an_abort_never_lets_the_job_exit_0(overlap, tmp_path):
    """--collective-timeout 1e-300: the watchdog fires at the first collective, prints, pauses;
    the tiny run used to finish in the pause and exit 0 (5 of 5 runs). With --overlap both
    watchdogs of rank 0 (one per communicator) used to print."""
    for _ in range(3):
        run = launch(2, *TINY, "--steps", 4, "--collective-timeout", 1e-300, "--save-weights", "w.npz",
                     *overlap, cwd=tmp_path)
        assert run.returncode == 6, run.describe()
        assert len(error_lines(run)) == 1, run.describe()


# ----------------------------------------------------------------------------------------------
# Non-finite parameters: divergence, in every dtype; no RuntimeWarning from every rank
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype, steps, lr", [("fp16", 10, 1e5), ("float32", 1, 1e300), ("bf16", 3, 1e300)])
def test_an_update_that_makes_the_parameters_non_finite_is_divergence(dtype, steps, lr, tmp_path):
    """fp16: a non-finite parameter makes every later gradient overflow, and the steps were skipped
    for overflow, so the run ended with exit 0 and non-finite weights; the last step's update
    (any dtype) was checked by no later step."""
    run = launch(2, "--dtype", dtype, "--lr", lr, "--weight-decay", 0, "--lr-schedule", "constant", "--warmup-steps",
                 0, "--steps", steps, "--hidden", "8,8", "--batch-size", 16, "--log-every", 1, "--report", "none",
                 "--save-weights", "w.npz", "--trace", "t.json", cwd=tmp_path)   # lr x wd >= 1 is refused at the start
    assert run.returncode == 3, run.describe()
    lines = error_lines(run)
    assert len(lines) == 1, run.describe()
    assert "the parameters are not finite, first in layer 0 (layers.0.*)" in lines[0], run.describe()
    assert "lower --lr" in lines[0] and "not saved" in lines[0], run.describe()
    assert "Warning" not in run.output and "held-out" not in run.output, run.describe()
    assert os.listdir(tmp_path) == []               # no weights, no trace, no temporary file


@pytest.mark.parametrize("dtype", ["float32", "fp16"])
def test_data_that_overflows_the_first_forward_is_not_blamed_on_the_learning_rate(dtype, tmp_path):
    """x = 3e38 is finite in float32, but the first forward overflows: before any update, so the
    advice "lower --lr" was false. In fp16 a loss that is not finite is no gradient overflow
    either, which a smaller loss scale would cure: it was "skipped" as one."""
    x = np.random.default_rng(0).standard_normal((64, 4))
    x[0, 1] = 3e38
    if dtype == "fp16":                 # its forward runs in float32: rows that overflow even there
        x[0], x[1] = 3e38, -3e38
    np.savez(tmp_path / "big.npz", x=x, y=np.arange(64) % 3)
    run = launch(2, "--data", "big.npz", "--no-shuffle", "--steps", 3, "--hidden", 8, "--batch-size", 16,
                 "--dtype", dtype, "--log-every", 0, "--report", "none", cwd=tmp_path)
    assert run.returncode == 3, run.describe()
    lines = error_lines(run)
    assert len(lines) == 1 and lines[0].startswith("zerompi: error: step 1: "), run.describe()
    assert "lower --lr" not in lines[0] and "before any update" in lines[0], run.describe()
    assert "the data or the initial weights" in lines[0], run.describe()
    assert ("before any loss scaling" in lines[0]) == (dtype == "fp16"), run.describe()


def test_finite_weights_whose_held_out_predictions_overflow_give_no_accuracy(tmp_path):
    """float64, one step of lr 1e300: the weights stay finite (about 1e300) but the held-out forward
    overflows; an accuracy counted from NaN predictions was printed with exit 0."""
    run = launch(2, "--dtype", "float64", "--lr", 1e300, "--weight-decay", 0, "--lr-schedule", "constant",
                 "--warmup-steps", 0, "--steps", 1, "--hidden", "8,8", "--batch-size", 16, "--log-every", 1,
                 "--report", "none", "--save-weights", "w.npz", cwd=tmp_path)
    assert run.returncode == 3, run.describe()
    lines = error_lines(run)
    assert len(lines) == 1 and "held-out predictions are not finite" in lines[0], run.describe()
    assert "Warning" not in run.output and "held-out accuracy" not in run.output, run.describe()
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("flags, keyword", [
    (["--loss-scale", 1e-300, "--min-loss-scale", 1e-310], "--loss-scale 1e-300 rounds to 0 in float16"),
    (["--loss-scale", 2, "--min-loss-scale", 4], "--min-loss-scale 4 is above --loss-scale 2"),
])
def test_an_fp16_loss_scale_floor_that_cannot_work_is_bad_input(flags, keyword, tmp_path):
    run = launch(2, *TINY, "--dtype", "fp16", *flags, "--save-weights", "w.npz", cwd=tmp_path)
    assert run.returncode == 2, run.describe()
    assert len(error_lines(run)) == 1 and keyword in error_lines(run)[0], run.describe()
    assert os.listdir(tmp_path) == []


def busy_in_c(seconds):
    """Keep this thread in one C call (which releases the GIL) for at least `seconds`: Python's
    signal handlers wait for it to return, as they wait for an MPI collective."""
    import hashlib
    start = time.perf_counter()
    hashlib.pbkdf2_hmac("sha256", b"x", b"y", 20_000)
    rounds = int(20_000 * seconds / max(time.perf_counter() - start, 1e-6)) + 1
    start = time.perf_counter()
    hashlib.pbkdf2_hmac("sha256", b"x", b"y", rounds)
    assert time.perf_counter() - start >= 0.5 * seconds


@pytest.fixture
def signals_here():
    """Make a zerompi Signals of this process (rank 0), recording what its watcher ends in `ended`;
    the previous handlers and wakeup fd are put back afterwards."""
    import signal
    from zerompi.train.loop.signals import Signals
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)}
    ended = []
    try:
        yield lambda: Signals(0, end_now=ended.append), ended
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        signal.set_wakeup_fd(-1)


def test_sigusr1_after_training_is_a_warning_and_the_finish_goes_on(capfd, signals_here):
    """Slurm's warning before a time limit, landing while the weights were written, ended a
    finished run with status 130 and no weights."""
    import signal
    from zerompi.train.loop.signals import Interrupted
    make, ended = signals_here
    signals = make()
    signals.leave_loop()
    os.kill(os.getpid(), signal.SIGUSR1)                 # handled here: a warning, no exception
    assert "SIGUSR1 after training: the run is finishing; it goes on" in capfd.readouterr().err
    with pytest.raises(Interrupted, match="SIGTERM after training"):
        os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(1.5)
    assert ended == []                                   # the watcher left it to this thread


def test_the_watcher_decides_only_what_ends_the_run_and_only_what_the_main_thread_left(capfd, signals_here):
    """A signal the main thread handled is not decided again by the watcher (three SIGUSR1 gave
    four warnings; a single Ctrl-C could read as a second one and cost the checkpoint); one it has
    not handled (here: its handler does nothing, as while it waits in MPI) ends the run from the
    watcher when it ends the run in its phase."""
    import signal
    from zerompi.train.loop.signals import ACT_WITHIN_SECONDS, Interrupted
    make, ended = signals_here
    signals = make()
    signals.enter_loop(save_dir=False)
    threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGUSR1)).start()
    busy_in_c(3 * ACT_WITHIN_SECONDS)                    # the handler cannot run meanwhile
    for _ in range(2):
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(0.1)
    time.sleep(ACT_WITHIN_SECONDS + 0.5)
    assert capfd.readouterr().err.count("SIGUSR1 but no --save-dir") == 3 and ended == []
    signals.enter_loop(save_dir=True)
    os.kill(os.getpid(), signal.SIGINT)                  # the step's end will checkpoint
    time.sleep(ACT_WITHIN_SECONDS + 0.5)
    assert signals.requested and ended == []
    with pytest.raises(Interrupted, match="a second SIGINT"):
        os.kill(os.getpid(), signal.SIGINT)
    signals = make()                                     # start-up again: a main thread that cannot act
    signal.signal(signal.SIGTERM, lambda *_: None)
    os.kill(os.getpid(), signal.SIGTERM)
    deadline = time.monotonic() + 10 * ACT_WITHIN_SECONDS
    while not ended and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ended == ["SIGTERM during start-up: ending the run"]


FP16_FORWARD_OVERFLOWS = ["--dtype", "fp16", "--lr", 3e4, "--weight-decay", 0, "--lr-schedule", "constant", "--warmup-steps", 0,
                          "--steps", 12, "--hidden", "8,8", "--batch-size", 16, "--log-every", 0, "--report", "none"]


def test_an_fp16_forward_pass_beyond_float16_skipping_every_step_is_not_a_success(tmp_path):
    """The weights after one step of --lr 3e4 fit float16, but the activations do not: every later
    step was "a gradient overflow: step skipped" until the run ended, exit 0 at 6% accuracy. (With
    the default weight decay, lr x wd = 300 is refused at the start: zerompi/train/options/config_checks.py.)"""
    run = launch(2, *FP16_FORWARD_OVERFLOWS, "--save-weights", "w.npz", cwd=tmp_path)
    assert run.returncode == 3, run.describe()
    lines = error_lines(run)
    assert len(lines) == 1 and "the last 10 steps were all skipped for a gradient overflow" in lines[0], \
        run.describe()
    assert "have not changed since step 1" in lines[0], run.describe()
    assert "held-out accuracy" not in run.output and os.path.exists(tmp_path / "w.npz")   # the last good weights


def test_a_run_whose_last_steps_were_all_skipped_is_not_a_success(tmp_path):
    """A loss scale of 2^60 overflows every gradient for 44 steps while the loss stays finite: a run
    that applied none of its last 10 steps (here: none of its 12) ended with exit 0."""
    run = launch(2, "--dtype", "fp16", "--loss-scale", 2.0 ** 60, "--steps", 12, "--hidden", 8, "--batch-size", 16,
                 "--log-every", 0, "--report", "none", "--save-weights", "w.npz", cwd=tmp_path)
    assert run.returncode == 3, run.describe()
    lines = error_lines(run)
    assert len(lines) == 1 and "the last 10 steps were all skipped for a gradient overflow" in lines[0], run.describe()
    assert "held-out accuracy" not in run.output, run.describe()
    few = launch(2, "--dtype", "fp16", "--loss-scale", 2.0 ** 60, "--steps", 4, "--hidden", 8, "--batch-size", 16,
                 "--log-every", 0, "--report", "none", cwd=tmp_path)
    assert few.returncode == 3 and "the last 4 steps were all skipped" in few.output, few.describe()
    healthy = launch(2, "--dtype", "fp16", "--steps", 12, "--hidden", 8, "--batch-size", 16, "--log-every", 0,
                     "--report", "none", cwd=tmp_path)
    assert healthy.returncode == 0, healthy.describe()       # some steps skipped early is normal: exit 0


def test_an_aborted_job_leaves_none_of_its_shared_memory_segments(tmp_path):
    """Every exit through MPI_Abort (1, 6, 130) left a /dev/shm/mpich_shm_* segment of 1-2 MB,
    which piled up across requeues. (Assumes nothing else creates segments meanwhile: the suite's
    single-process tests run one at a time.)"""
    before = set(os.listdir("/dev/shm"))
    run = with_fault(2, "raise", "1", 2, cwd=tmp_path)
    assert run.returncode == 1, run.describe()
    left = [name for name in set(os.listdir("/dev/shm")) - before if name.startswith(("mpich_", "ucx_"))]
    assert left == [], left


def test_a_run_whose_gradients_round_to_zero_is_not_a_success(tmp_path):
    """fp16 with a loss scale of 1.2e-7: every gradient rounds to 0, the weights never learn, and
    the run ended with exit 0."""
    run = launch(2, "--dtype", "fp16", "--loss-scale", 1.2e-7, "--min-loss-scale", 1.2e-7, "--steps", 12, "--hidden", 8,
                 "--batch-size", 16, "--log-every", 0, "--report", "none", cwd=tmp_path)
    assert run.returncode == 3, run.describe()
    lines = error_lines(run)
    assert len(lines) == 1 and "the last 10 steps were all of a gradient that is 0" in lines[0], run.describe()
