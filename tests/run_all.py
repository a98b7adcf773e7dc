"""The whole test suite: `python tests/run_all.py` (what README and .ci/run call).

    1. single-process tests:              python -m pytest tests          (MPI and Slurm tests skip)
    2. the Slurm tests:                   python -m pytest tests/program/test_local_slurm.py tests/proofs/test_slurm.py
                                          tests/proofs/test_slurm_multi_node.py, one after the other (one /etc/slurm)
                                          (they skip without ZEROMPI_LOCAL_SLURM=1, root and Slurm)
    3. multi-rank tests (marked mpi), for N in 1 2 3 4 8:
                                          mpirun -n N python tests/support/mpi_launch.py --with-mpi -m mpi tests
                                          (from N = 3 on without those marked in_process, which run on
                                          MPI at N = 1 and 2 only, and in 4. for every N)
    4. the numerical multi-rank tests (marked mpi and in_process), for N in 1 2 3 4 8, on N ranks that
       are threads of one pytest process (tests/conftest.py, zerompi/inprocess/):
                                          python -m pytest -p no:mpi -m "mpi and in_process" --in-process-ranks N tests

First the package is compiled to bytecode (`compileall`): the suite starts a few thousand Python
processes, and where PYTHONDONTWRITEBYTECODE is set each of them would
otherwise compile every zerompi module anew, a quarter of a rank's start-up.

Each run has a wall-clock limit; a run that exceeds it is killed with its whole process group and
counts as failed. The summary sums the pytest counts of all runs ("all: P passed, F failed, S skipped,
D deferred") and lists the reasons for the skipped tests, each with how many it skipped (pytest's -rs
lines). Deferred: a multi-rank test skipped in a run without the ranks it needs (the single-process
run, a run at a smaller N) that a later run has; not a skip, as the test does run.
"""
import collections
import compileall
import os
import re
import shutil
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RANK_COUNTS = (1, 2, 3, 4, 8)
LIMIT_SECONDS = 600
SINGLE_LIMIT_SECONDS = 2400        # about 1300 tests, many of them MPI jobs: 6 min on 2 cores, 10 beside 4 busy processes (docs/testing.md)
SLURM_LIMIT_SECONDS = 1200         # three files of real Slurm jobs: 3 min alone, 5 beside 4 busy processes
SLURM_TESTS = ["tests/program/test_local_slurm.py", "tests/proofs/test_slurm.py",      # in this order: see test_local_slurm.py
               "tests/proofs/test_slurm_multi_node.py"]


def mpirun():
    beside_python = os.path.join(os.path.dirname(sys.executable), "mpirun")
    return beside_python if os.path.exists(beside_python) else shutil.which("mpirun") or "mpirun"


SKIP_LINE = re.compile(r"^SKIPPED \[(\d+)\] [^:]+(?::\d+)?: (.*)$")   # pytest -rs: SKIPPED [count] file:line: reason


def tally(lines):
    """(passed, failed, skipped, Counter of skip reasons) from one pytest run's output lines."""
    summary = [line for line in lines if re.search(r"\d+ (passed|failed|skipped)", line)]
    last = summary[-1] if summary else ""
    passed = sum(int(n) for n in re.findall(r"(\d+) passed", last))
    failed = sum(int(n) for n in re.findall(r"(\d+) (?:failed|error)", last))
    skipped = sum(int(n) for n in re.findall(r"(\d+) skipped", last))
    reasons = collections.Counter()
    for line in lines:
        match = SKIP_LINE.match(line.rstrip("\n"))
        if match:
            reasons[match.group(2)] += int(match.group(1))
    return passed, failed, skipped, reasons


def run(name, command, limit_seconds=LIMIT_SECONDS):
    """Run command, echoing its output; returns (passed, failed, skipped, skip reasons, ok)."""
    print(f"\n=== {name}: {' '.join(command)}", flush=True)
    start = time.time()
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, start_new_session=True)
    output = []
    try:
        deadline_killer = _Deadline(process, limit_seconds)
        for line in process.stdout:
            print(line, end="", flush=True)
            output.append(line)
        process.wait()
        timed_out = deadline_killer.fired
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    text = "".join(output)
    passed, failed, skipped, reasons = tally(output)
    ok = process.returncode == 0 and not timed_out and passed > 0 and failed == 0
    if timed_out:
        print(f"=== {name}: killed after {limit_seconds} s", flush=True)
    if not ok and failed == 0:
        failed = 1                       # killed, or a crash or abort without a pytest summary: still a failure
    print(f"=== {name}: {'ok' if ok else 'FAILED'} in {time.time() - start:.1f} s", flush=True)
    return passed, failed, skipped, reasons, ok and "no tests ran" not in text


class _Deadline:
    """Kill the process group after `seconds` (a thread, so reading output never blocks it)."""

    def __init__(self, process, seconds):
        import threading
        self.fired = False

        def kill():
            if process.poll() is None:
                self.fired = True
                os.killpg(process.pid, signal.SIGKILL)
        self.timer = threading.Timer(seconds, kill)
        self.timer.daemon = True
        self.timer.start()


DEFERRED = re.compile(r"need --with-mpi option to run|Test requires (\d+) MPI processes, only \d+ MPI processes "
                      r"specified, skipping test"          # pytest-mpi's words
                      r"|needs (\d+) in-process ranks, this run has \d+")   # tests/conftest.py's


def deferred(reason):
    """Whether a skip reason is a multi-rank test's that one of the runs with RANK_COUNTS runs."""
    match = DEFERRED.fullmatch(reason)
    need = match and (match.group(1) or match.group(2))
    return bool(match) and (need is None or int(need) <= max(RANK_COUNTS))


def summary(totals):
    """The closing lines: the sums over all runs, then each skip reason with its count, the
    deferred ones (run in another run) after the real skips."""
    passed, failed, skipped = (sum(t[i] for t in totals) for i in range(3))
    reasons = sum((t[3] for t in totals), collections.Counter())
    later = sum(count for reason, count in reasons.items() if deferred(reason))
    lines = [f"all: {passed} passed, {failed} failed, {skipped - later} skipped, {later} deferred (a multi-rank "
             f"test skipped in a run without the ranks it needs, and run in another)"]
    lines += [f"  skipped {count:>4}: {reason}" for reason, count in reasons.most_common() if not deferred(reason)]
    lines += [f"  deferred {count:>3}: {reason}" for reason, count in reasons.most_common() if deferred(reason)]
    return "\n".join(lines)


def main():
    compileall.compile_dir(os.path.join(ROOT, "zerompi"), quiet=1)
    pytest = [sys.executable, "-m", "pytest", "-q", "-rs", "--durations=15"]      # the slowest, to keep the suite fast
    runs = [("single-process", pytest + [f"--ignore={path}" for path in SLURM_TESTS] + ["tests"], SINGLE_LIMIT_SECONDS),
            ("slurm", pytest + SLURM_TESTS, SLURM_LIMIT_SECONDS)]
    for n in RANK_COUNTS:
        runs.append((f"mpi n={n}", [mpirun(), "-n", str(n), sys.executable, "tests/support/mpi_launch.py",
                                    "-q", "-rs", "-x", "--durations=15", "--with-mpi",
                                    "-m", "mpi" if n <= 2 else "mpi and not in_process",
                                    "-p", "no:cacheprovider", *[f"--ignore={path}" for path in SLURM_TESTS], "tests"],
                     LIMIT_SECONDS))
    for n in RANK_COUNTS:
        runs.append((f"in-process n={n}", pytest + ["-x", "-p", "no:mpi", "-p", "no:cacheprovider", "-m",
                                                    "mpi and in_process", "--in-process-ranks", str(n),
                                                    *[f"--ignore={path}" for path in SLURM_TESTS], "tests"],
                     LIMIT_SECONDS))
    totals = [run(name, command, limit) for name, command, limit in runs]
    print("\n" + summary(totals), flush=True)
    return 0 if all(t[4] for t in totals) else 1


if __name__ == "__main__":
    sys.exit(main())
