"""`python -m zerompi.train --in-process-ranks N` (zerompi/train/loop/in_process.py): the training program
on N threads of one process, no mpirun. At N = 1 and 2 its weights are `mpirun -n N`'s bit for bit at
every stage; with --in-process-nodes its ranks sit on emulated nodes (hpZ, the node split of the
report); its checkpoints resume under mpirun and the other way round; where no mpi4py can be
imported it trains; what does not make sense here is refused with one line, exit 2."""
import re
import subprocess
import sys

import numpy as np
import pytest

from test_cli import ERROR_MARK, launch, load_weights, run_command, train_ok
from zerompi.util.exit_codes import ExitCode

FLAGS = ("--hidden", "48,48", "--batch-size", "24", "--report", "none", "--log-every", 0)


def in_process(n, *flags, cwd, env=None):
    """`python -m zerompi.train --in-process-ranks n *flags` in cwd; returns a Run."""
    return run_command([sys.executable, "-m", "zerompi.train", "--in-process-ranks", str(n), *map(str, flags)],
                       cwd=cwd, env=env)


def in_process_ok(n, *flags, cwd):
    run = in_process(n, *flags, cwd=cwd)
    assert run.returncode == 0 and ERROR_MARK not in run.output and "Traceback" not in run.output, run.describe()
    return run


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_two_in_process_ranks_save_mpiruns_weights_bit_for_bit(tmp_path, stage):
    for n in (1, 2) if stage == 3 else (2,):
        flags = (*FLAGS, "--stage", stage, "--steps", 8, "--grad-accum", 2)
        train_ok(n, *flags, "--save-weights", tmp_path / f"mpi{n}.npz", cwd=tmp_path)
        in_process_ok(n, *flags, "--save-weights", tmp_path / f"threads{n}.npz", cwd=tmp_path)
        mpi, threads = load_weights(tmp_path / f"mpi{n}.npz"), load_weights(tmp_path / f"threads{n}.npz")
        assert mpi.keys() == threads.keys() and all(np.array_equal(mpi[k], threads[k]) for k in mpi)


def test_in_process_nodes_train_the_digits_with_hpz_and_the_report_splits_them(tmp_path):
    run = in_process_ok(4, "--in-process-nodes", 2, "--hpz", "--report", "table", cwd=tmp_path)
    assert "held-out accuracy" in run.output
    accuracy = float(run.output.split("held-out accuracy ")[1].split("%")[0])
    assert accuracy >= 95, run.output
    assert "per rank per training step, 2 nodes" in run.output, run.output


def test_checkpoints_resume_across_threads_and_mpirun(tmp_path):
    flags = (*FLAGS, "--stage", 2)
    train_ok(2, *flags, "--steps", 6, "--save-weights", tmp_path / "straight.npz", cwd=tmp_path)
    in_process_ok(2, *flags, "--steps", 3, "--save-dir", tmp_path / "threads", cwd=tmp_path)
    train_ok(2, *flags, "--steps", 6, "--save-dir", tmp_path / "threads", "--resume", "latest",
             "--save-weights", tmp_path / "resumed.npz", cwd=tmp_path)
    train_ok(2, *flags, "--steps", 3, "--save-dir", tmp_path / "mpi", cwd=tmp_path)
    in_process_ok(2, *flags, "--steps", 6, "--save-dir", tmp_path / "mpi", "--resume", "latest",
                  "--save-weights", tmp_path / "back.npz", cwd=tmp_path)
    straight = load_weights(tmp_path / "straight.npz")
    for name in ("resumed", "back"):
        got = load_weights(tmp_path / f"{name}.npz")
        assert all(np.array_equal(got[k], straight[k]) for k in straight), name


def test_check_collectives_checks_the_in_process_ranks_and_lets_a_run_that_agrees_train(tmp_path):
    run = in_process_ok(3, *FLAGS, "--steps", 4, "--check-collectives", "--stage", 3, "--overlap", cwd=tmp_path)
    assert "held-out accuracy" in run.output


SLOWED = ("import sys, time\n"
          "from zerompi.train.loop import run\n"
          "def rank_main(comm, *args, _original=run.rank_main, **kwargs):\n"
          "    if comm.rank == int(sys.argv[1]):\n"
          "        {what}\n"
          "    return _original(comm, *args, **kwargs)\n"
          "run.rank_main = rank_main\n"
          "raise SystemExit(run.main(sys.argv[2:]))\n")


@pytest.mark.parametrize("what, n, status, words", [
    ("time.sleep(5)", 2, ExitCode.COLLECTIVE_TIMEOUT, "ranks 1 did not arrive"),
    ("raise OSError('the disk went away')", 8, ExitCode.FAILED, "rank 7 failed: OSError: the disk went away")],
    ids=["deadline", "a-rank-raises"])
def test_a_rank_late_past_the_deadline_or_raising_ends_the_run_with_one_line_at_once(tmp_path, what, n, status, words):
    """A collective that waits past --collective-timeout: exit 6 (as the MPI watchdog's), one line and no
    traceback; the last rank raising: its line, with no wait for its turn (ranks in one process stagger
    nothing)."""
    code = SLOWED.format(what=what)
    run = run_command([sys.executable, "-c", code, str(n - 1), "--in-process-ranks", str(n), *map(str, FLAGS),
                       "--steps", "3", "--collective-timeout", "1"], cwd=tmp_path)
    errors = [line for line in run.output.splitlines() if ERROR_MARK in line]
    assert run.returncode == status and len(errors) == 1 and words in errors[0], run.describe()
    assert ("Traceback" in run.output) == (status == ExitCode.FAILED) and run.seconds < 8, run.describe()


def test_it_trains_where_mpi4py_cannot_be_imported(tmp_path):
    code = ("import sys; sys.modules['mpi4py'] = None\n"            # importing it raises ImportError
            "from zerompi.train.loop.run import main\n"
            "raise SystemExit(main(sys.argv[1:]))\n")
    result = subprocess.run([sys.executable, "-c", code, "--in-process-ranks", "3", *map(str, FLAGS), "--steps", "5"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "held-out accuracy" in result.stdout, result.stdout + result.stderr


@pytest.mark.parametrize("flags, words", [
    (("--in-process-nodes", 3), "--in-process-nodes 3 does not divide the 4 ranks"),
    (("--device", "gpu"), "--in-process-ranks runs on the CPU"),
    (("--comm", "nccl"), "--in-process-ranks runs on the CPU, without --comm nccl")])
def test_what_does_not_make_sense_in_one_process_is_refused_with_one_line(tmp_path, flags, words):
    run = in_process(4, *FLAGS, "--steps", 1, *flags, cwd=tmp_path)
    errors = [line for line in run.output.splitlines() if ERROR_MARK in line]
    assert run.returncode == ExitCode.BAD_INPUT and len(errors) == 1 and words in errors[0], run.describe()


def test_under_a_launcher_of_several_processes_it_is_refused_once(tmp_path):
    run = launch(2, "--in-process-ranks", 4, *FLAGS, "--steps", 1, cwd=tmp_path)
    errors = [line for line in run.output.splitlines() if ERROR_MARK in line]
    assert run.returncode == ExitCode.BAD_INPUT and len(errors) == 1, run.describe()
    assert "start it without mpirun" in errors[0]
    alone = run_command([sys.executable, "-m", "zerompi.train", "--in-process-nodes", "2", *map(str, FLAGS)],
                        cwd=tmp_path)
    assert alone.returncode == ExitCode.BAD_INPUT and "pass both" in alone.output, alone.describe()



def test_the_dry_run_plans_the_in_process_ranks_and_their_nodes(tmp_path):
    planned = in_process(4, "--in-process-nodes", 2, "--hpz", "--dry-run", cwd=tmp_path)
    given = run_command([sys.executable, "-m", "zerompi.train", "--dry-run", "--ranks", "4", "--ranks-per-node", "2",
                         "--hpz"], cwd=tmp_path)
    assert planned.returncode == given.returncode == 0, planned.describe() + given.describe()
    def plan(output):            # the plan, without this machine's free memory (it changes between the two)
        return re.sub(r"\nhere, .*?\n\n", "\n\n", output, flags=re.S)
    assert plan(planned.output) == plan(given.output) and "4 ranks on 2 nodes" in planned.output
    for flags, words in ((("--in-process-nodes", 3), "does not divide"), (("--ranks", 2), "pass one pair")):
        refused = in_process(4, *flags, "--dry-run", cwd=tmp_path)
        errors = [line for line in refused.output.splitlines() if ERROR_MARK in line]
        assert refused.returncode == ExitCode.BAD_INPUT and len(errors) == 1 and words in errors[0], refused.describe()
