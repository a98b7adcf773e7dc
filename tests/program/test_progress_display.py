"""Logs fit where they go (zerompi/train/outputs/destination.py, status_line.py, progress.py):

    auto        on real pseudo-terminals, with each launcher's environment variables: a plain
                terminal draws the live line; a Slurm batch job, and Open MPI's mpirun writing to a
                file (its ranks get terminals: a stand-in launcher named mpirun copies its rank's
                terminal to a file, as Open MPI's does), put no "\\r" or "\\x1b" byte in the file;
                the same launcher on a terminal, and `srun --pty`, draw it; so does MPICH's real
                mpirun on a terminal (its ranks write to pipes it copies), fitted to that terminal
    width       on a 60-column terminal no drawn live line is longer than 60 columns, and the
                log lines still appear whole above it
    80 columns  every line a run prints (but the end-of-run table) fits 80 columns: stages 0-3,
                fp16 with skipped steps at a million steps; the progress line's fields
"""
import os
import re
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from test_cli import _mpirun, train_ok
from test_observability import open_terminal, run_on_pty
from zerompi.step import StepResult
from zerompi.train.outputs.destination import launcher_writes_to_terminal, live_progress
from zerompi.train.outputs.progress import Progress, fit

FLAGS = ("--steps", 60, "--hidden", 16, "--log-every", 20, "--report", "none")
CONTROL = re.compile(r"\r(?!\n)|\x1b")          # a carriage return that is not part of a line end, or ESC
LIVE = re.compile(r"step \d+/\d+ \|.*\| loss [\d.e+-]+ \| ")

# what a stand-in Open MPI launcher does: the rank's stdout and stderr on a pseudo-terminal whose
# bytes it copies to its own stdout
LAUNCHER = """
import os, pty, subprocess, sys
leader, follower = pty.openpty()
import fcntl, struct, termios
fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
rank = subprocess.Popen(sys.argv[1:], stdout=follower, stderr=follower, stdin=subprocess.DEVNULL)
os.close(follower)
while True:
    try:
        chunk = os.read(leader, 65536)
    except OSError:
        break
    if not chunk:
        break
    os.write(1, chunk)
sys.exit(rank.wait())
"""


def environment(**variables):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMPI_", "PMI", "PMIX_"))}
    return dict(env, **variables)


def open_mpi_rank(tmp_path, stdout):
    """Run one rank under a stand-in launcher named mpirun, with Open MPI's variables; the
    launcher's stdout is `stdout` (a file or a terminal's follower end)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if not (bin_dir / "mpirun").exists():
        os.symlink(os.path.realpath(sys.executable), bin_dir / "mpirun")     # its command name: mpirun
    (tmp_path / "launcher.py").write_text(LAUNCHER)
    env = environment(OMPI_COMM_WORLD_SIZE="1", OMPI_COMM_WORLD_RANK="0", OMPI_COMM_WORLD_LOCAL_RANK="0",
                      PYTHONPATH=os.pathsep.join(sys.path))
    return subprocess.Popen([str(bin_dir / "mpirun"), str(tmp_path / "launcher.py"), sys.executable, "-m",
                             "zerompi.train", *map(str, FLAGS)], cwd=tmp_path, stdout=stdout,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)


def read_all(leader):
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    return b"".join(chunks).decode()


# ----------------------------------------------------------------------------------------------
# --progress auto: the real destination
# ----------------------------------------------------------------------------------------------

class Terminal:
    def isatty(self):
        return True

    def fileno(self):
        return 1


class File:
    def isatty(self):
        return False

    def fileno(self):
        return 1


@pytest.mark.parametrize("choice, stream, env, live", [
    ("live", File(), {}, True),                                          # asked for
    ("lines", Terminal(), {}, False),
    ("auto", Terminal(), {}, True),
    ("auto", File(), {}, False),                                         # a file, a pipe
    ("auto", Terminal(), {"SLURM_JOB_ID": "7"}, False),                  # a batch job (or salloc)
    ("auto", Terminal(), {"SLURM_JOB_ID": "7", "SLURM_PTY_PORT": "4000"}, True),   # srun --pty
    ("auto", Terminal(), {"OMPI_COMM_WORLD_SIZE": "1"}, False),         # Open MPI, no mpirun above us
    ("auto", File(), {"PMI_RANK": "0"}, False),                          # hydra's pipe, no mpirun above us
    ("auto", Terminal(), {"PMI_RANK": "0", "SLURM_JOB_ID": "7", "SLURM_PTY_PORT": "4000"}, True),  # srun --pty
])
def test_the_auto_rule(choice, stream, env, live):
    assert live_progress(choice, stream, env) is live


def test_no_launcher_among_the_ancestors_means_lines():
    assert launcher_writes_to_terminal(os.getpid(), 1) is False
    assert launcher_writes_to_terminal(10 ** 9, 1) is False              # no such process


def test_the_launcher_is_asked_about_the_stream_the_line_would_go_to(tmp_path):
    """--report json sends progress to stderr: what counts is where mpirun's stderr goes (here a
    file), not its stdout (here a terminal)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    os.symlink(os.path.realpath(sys.executable), bin_dir / "mpirun")
    ask = ("import os, sys; from zerompi.train.outputs.destination import launcher_writes_to_terminal as w; "
           "print(w(os.getpid(), 1), w(os.getpid(), 2), file=sys.__stdout__)")
    leader, follower = open_terminal(80)
    with open(tmp_path / "err.txt", "w") as err:
        launcher = subprocess.Popen([str(bin_dir / "mpirun"), "-c", f"import subprocess, sys; sys.exit("
                                     f"subprocess.call([sys.executable, '-c', {ask!r}]))"],
                                    stdout=follower, stderr=err, stdin=subprocess.DEVNULL,
                                    env=environment(PYTHONPATH=os.pathsep.join(sys.path)))
        os.close(follower)
        text = read_all(leader)
        assert launcher.wait(timeout=60) == 0, text
    assert text.split() == ["True", "False"], text


def test_auto_on_a_terminal_draws_the_live_line(tmp_path):
    text = run_on_pty(*FLAGS, cwd=tmp_path, env=environment())
    assert LIVE.search(text), text


def test_auto_in_a_slurm_batch_job_writes_plain_lines(tmp_path):
    text = run_on_pty(*FLAGS, cwd=tmp_path, env=environment(SLURM_JOB_ID="7", SLURM_JOB_NAME="train"))
    assert not CONTROL.search(text) and "step 60/60  loss" in text, repr(text)
    text = run_on_pty(*FLAGS, cwd=tmp_path, env=environment(SLURM_JOB_ID="7", SLURM_PTY_PORT="4000"))
    assert LIVE.search(text), text                                       # srun --pty: a terminal


def test_auto_under_open_mpi_writing_to_a_file_puts_no_control_codes_in_it(tmp_path):
    with open(tmp_path / "out.txt", "w") as out:
        launcher = open_mpi_rank(tmp_path, out)
        assert launcher.wait(timeout=120) == 0
    data = (tmp_path / "out.txt").read_bytes()
    assert b"step 60/60  loss" in data and b"held-out accuracy" in data, data
    assert b"\r" not in data.replace(b"\r\n", b"") and b"\x1b" not in data, data


def test_auto_under_open_mpi_on_a_terminal_draws_the_live_line(tmp_path):
    leader, follower = open_terminal(80)
    launcher = open_mpi_rank(tmp_path, follower)
    os.close(follower)
    text = read_all(leader)
    assert launcher.wait(timeout=120) == 0
    assert LIVE.search(text), text


def mpich_run(tmp_path, stdout, *flags):
    """`mpirun -n 2 python -m zerompi.train` (the mpirun beside this Python), its output on stdout."""
    return subprocess.Popen([_mpirun(), "-n", "2", sys.executable, "-m", "zerompi.train", *map(str, flags)],
                            cwd=tmp_path, stdout=stdout, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env=environment())


def test_auto_under_mpich_on_a_terminal_draws_the_live_line_fitted_to_it(tmp_path):
    """MPICH's mpirun hands each rank a pipe and copies it to its own output: on a terminal the
    live line is drawn through it, as wide as mpirun's terminal at most."""
    if "MPICH" not in subprocess.run([sys.executable, "-m", "mpi4py", "--mpi-lib-version"], capture_output=True,
                                     text=True).stdout:
        pytest.skip("the MPI library is not MPICH")
    leader, follower = open_terminal(60)
    launcher = mpich_run(tmp_path, follower, *FLAGS, "--steps", 400)
    os.close(follower)
    text = read_all(leader)
    assert launcher.wait(timeout=120) == 0, text
    drawn = drawn_lines(text)
    assert drawn and max(len(line) for line in drawn) <= 60, text
    with open(tmp_path / "out.txt", "w") as out:                    # the same launcher into a file: lines
        assert mpich_run(tmp_path, out, *FLAGS).wait(timeout=120) == 0
    data = (tmp_path / "out.txt").read_bytes()
    assert b"step 60/60  loss" in data and b"\r" not in data and b"\x1b" not in data, data


@pytest.mark.parametrize("how", ["a shell redirects the rank", "mpirun prefixes each line"])
def test_under_mpich_on_a_terminal_a_rank_not_copied_as_it_comes_writes_lines(how, tmp_path):
    """mpirun on a terminal, but the rank's output goes to a file through a shell, or mpirun adds
    '[0] ' to each line (the width would not count it): plain lines, no control codes."""
    if "MPICH" not in subprocess.run([sys.executable, "-m", "mpi4py", "--mpi-lib-version"], capture_output=True,
                                     text=True).stdout:
        pytest.skip("the MPI library is not MPICH")
    train = [sys.executable, "-m", "zerompi.train", *map(str, FLAGS), "--steps", "400"]     # long enough to draw
    command = ([_mpirun(), "-n", "2", "sh", "-c", 'exec "$@" > rank$PMI_RANK.log', "sh", *train]
               if how.startswith("a shell") else [_mpirun(), "-l", "-n", "2", *train])
    leader, follower = open_terminal(60)
    launcher = subprocess.Popen(command, cwd=tmp_path, stdout=follower, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=environment())
    os.close(follower)
    text = read_all(leader)
    assert launcher.wait(timeout=120) == 0, text
    data = (tmp_path / "rank0.log").read_bytes().decode() if how.startswith("a shell") else text
    assert "step 400/400  loss" in data and not CONTROL.search(data.replace("\r\n", "\n")), repr(data)


# ----------------------------------------------------------------------------------------------
# The live line fits the terminal
# ----------------------------------------------------------------------------------------------

def drawn_lines(text):
    """Each live-line drawing: the text between carriage returns that holds the bar."""
    return [piece for piece in re.split(r"\r\n|\r|\n", text) if LIVE.search(piece)]


def test_the_live_line_fits_a_60_column_terminal_and_log_lines_stay_whole(tmp_path):
    text = run_on_pty("--steps", 300, "--hidden", 16, "--log-every", 100, "--report", "none",
                      "--progress", "live", cwd=tmp_path, columns=60, env=environment())
    drawn = drawn_lines(text)
    assert drawn and max(len(line) for line in drawn) <= 60, drawn
    log = [line.split("\r")[-1] for line in text.split("\r\n")]             # what stays on the screen
    assert [line.split("  loss")[0] for line in log if line.startswith("step ") and "  loss" in line] == \
        ["step 100/300", "step 200/300", "step 300/300"], log
    assert any(line.startswith("held-out accuracy") for line in log), log


# ----------------------------------------------------------------------------------------------
# 80 columns
# ----------------------------------------------------------------------------------------------

def long_lines(output, but_the_table=True):
    lines = output.split("\n\nZeRO stage")[0].splitlines() if but_the_table else output.splitlines()
    return [line for line in lines if len(line) > 80]


@pytest.mark.parametrize("stage", [0, 3])      # the lines differ by stage only in its digit
def test_every_log_line_of_a_run_fits_80_columns_the_report_tables_aside(tmp_path, stage):
    run = train_ok(2, "--stage", stage, "--steps", 40, "--log-every", 10, cwd=tmp_path)
    assert "step 40/40  loss" in run.stdout and "Memory per rank" in run.stdout
    assert long_lines(run.output) == [], run.describe()


def test_fp16_with_skipped_steps_at_a_million_steps_fits_80_columns(tmp_path):
    """The widest step counter and fp16's scale and skipped counts: the run is interrupted after
    its first progress lines (a scale of 2**40 skips the first steps)."""
    process = subprocess.Popen([sys.executable, "-m", "zerompi.train", "--steps", "1000000", "--log-every", "10",
                                "--dtype", "fp16", "--loss-scale", str(2.0 ** 40), "--hidden", "16"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, text=True, env=environment())
    lines = []
    deadline = time.monotonic() + 60
    for line in process.stdout:
        lines.append(line.rstrip("\n"))
        if sum(" skipped" in x and x.startswith("step ") for x in lines) >= 1 and \
                sum(x.startswith("step ") and "  loss" in x and "skipped" not in x for x in lines) >= 2:
            break
        assert time.monotonic() < deadline, lines
    process.send_signal(signal.SIGINT)
    process.communicate(timeout=60)
    progress = [x for x in lines if x.startswith("step ") and "/1000000" in x]
    assert any(" skipped  " in x for x in progress) and any("scale " in x for x in progress), lines
    assert [x for x in lines if len(x) > 80] == [], lines


def test_the_progress_line_prints_significant_digits_and_leaves_out_what_does_not_fit():
    printed = []
    comm = SimpleNamespace(print0=lambda text, file=None: printed.append(text))
    fp16, float32 = SimpleNamespace(enabled=True, scale=65536.0), SimpleNamespace(enabled=False)
    for steps, loss, scaler, skipped in [(300, 2.0553, float32, 0), (300, 0.00004, float32, 0),
                                         (10 ** 5, 1.234e-5, float32, 0), (300, 0.0461, fp16, 2),
                                         (10 ** 6, 1.234e-5, fp16, 12)]:
        progress = Progress(SimpleNamespace(steps=steps, batch_size=128), comm, out=None)
        for k in range(25):
            progress.add(StepResult(loss=loss, correct=64, grad_norm=0.284, applied=k >= skipped))
        progress.print_line(steps, 3e-3, scaler)
    assert printed[0].startswith("step 300/300  loss 2.055  acc 50.0%  |g| 0.284  lr 3.0e-3  "), printed
    assert "loss 4e-05  " in printed[1] and "0.0000" not in printed[1], printed
    assert "  lr " not in printed[2] and "  |g| 0.284  " in printed[2], printed          # lr left out first
    assert "scale 65536  2 skipped  " in printed[3], printed
    assert printed[4].startswith("step 1000000/1000000  loss 1.234e-05  acc 50.0%  12 skipped  "), printed
    assert all(len(line) <= 80 for line in printed), [len(line) for line in printed]
    assert fit(["a" * 70, "lr 1", "|g| 2", "scale 3", "b"], width=74) == "a" * 70 + "  b"
