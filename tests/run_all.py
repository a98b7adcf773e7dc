"""The whole test suite: `python tests/run_all.py` (what README and .ci/run call).

    1. single-process tests:              python -m pytest tests          (MPI tests skip)
    2. multi-rank tests, for N in 1 2 3 4 8:
                                          mpirun -n N python tests/support/mpi_launch.py --with-mpi tests/mpi

Each run has a wall-clock limit; a run that exceeds it is killed with its whole process group and
counts as failed. The last line sums the pytest counts of all runs ("all: P passed, F failed").
"""
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


def mpirun():
    beside_python = os.path.join(os.path.dirname(sys.executable), "mpirun")
    return beside_python if os.path.exists(beside_python) else shutil.which("mpirun") or "mpirun"


def run(name, command):
    """Run command, echoing its output; returns (passed, failed, ok)."""
    print(f"\n=== {name}: {' '.join(command)}", flush=True)
    start = time.time()
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, start_new_session=True)
    output = []
    try:
        deadline_killer = _Deadline(process, LIMIT_SECONDS)
        for line in process.stdout:
            print(line, end="", flush=True)
            output.append(line)
        process.wait()
        timed_out = deadline_killer.fired
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    text = "".join(output)
    summary = [line for line in output if re.search(r"\d+ (passed|failed)", line)]
    last = summary[-1] if summary else ""
    passed = sum(int(n) for n in re.findall(r"(\d+) passed", last))
    failed = sum(int(n) for n in re.findall(r"(\d+) (?:failed|error)", last))
    ok = process.returncode == 0 and not timed_out and passed > 0 and failed == 0
    if timed_out:
        print(f"=== {name}: killed after {LIMIT_SECONDS} s", flush=True)
    elif not ok and failed == 0:
        failed = 1                       # a crash or abort without a pytest summary still fails
    print(f"=== {name}: {'ok' if ok else 'FAILED'} in {time.time() - start:.1f} s", flush=True)
    return passed, failed, ok and "no tests ran" not in text


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


def main():
    runs = [("single-process", [sys.executable, "-m", "pytest", "-q", "tests"])]
    for n in RANK_COUNTS:
        runs.append((f"mpi n={n}", [mpirun(), "-n", str(n), sys.executable, "tests/support/mpi_launch.py",
                                    "-q", "-x", "--with-mpi", "-p", "no:cacheprovider", "tests/mpi"]))
    totals = [run(name, command) for name, command in runs]
    passed = sum(t[0] for t in totals)
    failed = sum(t[1] for t in totals)
    all_ok = all(t[2] for t in totals)
    print(f"\nall: {passed} passed, {failed} failed", flush=True)
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
