"""Real faults on one rank of a real `mpirun` job: the job ends, once, clearly, in bounded time.

tests/support/fault_driver.py runs the real zerompi.train and, at one step, on chosen ranks only: raises an
exception, SIGKILLs or SIGSTOPs its own process, puts an inf in its input rows, or a NaN in one
layer's gradient. Each test asserts the exit status, that the report is one line printed once,
that it names what it should (rank, collective, step, layer), and that no process is left behind.
"""
import os
import time

import numpy as np
import pytest

from test_cli import ERROR_MARK, launch, load_weights, train_ok

DRIVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "support", "fault_driver.py")
TINY = ["--steps", 20, "--hidden", 8, "--batch-size", 12, "--log-every", 0, "--report", "none"]


def with_fault(n, fault, ranks, step, *flags, cwd):
    return launch(n, fault, ranks, step, *TINY, *flags, cwd=cwd, program=(DRIVER,))


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
              "--data", "synthetic", "--save-every", 2]
    for stage in (1, 3):                            # stage 3: every kind of collective but all-reduce of grads
        for check in (False, True):
            folder = tmp_path / f"stage{stage}-{check}"
            folder.mkdir()
            train_ok(3, "--stage", stage, *common, "--save-dir", "ckpt", "--save-weights", "w.npz",
                     *(["--check-collectives"] if check else []), cwd=folder)
        plain, checked = (load_weights(tmp_path / f"stage{stage}-{c}" / "w.npz") for c in (False, True))
        assert all(np.array_equal(plain[name], checked[name]) for name in plain), stage
