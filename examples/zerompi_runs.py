"""What the examples share: run `mpirun -n N python -m zerompi.train ...` and read what it wrote.

    train(n, *flags, cwd=None)   -> the run's stdout (check=True: a failed run raises, with its stderr)
    report(n, *flags)            -> the JSON end-of-run report (--report json) as a dict
    read_jsonl(path)             -> the --metrics file as a list of dicts, one per step
"""
import json
import os
import shutil
import subprocess
import sys


def mpirun():
    """The mpirun beside this Python (a venv with the mpich wheel), else the one on PATH."""
    beside_python = os.path.join(os.path.dirname(sys.executable), "mpirun")
    return beside_python if os.path.exists(beside_python) else shutil.which("mpirun")


def train(num_ranks, *flags, cwd=None):
    command = [mpirun(), "-n", str(num_ranks), sys.executable, "-m", "zerompi.train", *map(str, flags)]
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed with status {result.returncode}:\n{result.stderr}")
    return result.stdout


def report(num_ranks, *flags, cwd=None):
    return json.loads(train(num_ranks, *flags, "--log-every", 0, "--report", "json", cwd=cwd))


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def finish_figure(fig, ax, out):
    """Legend, grid, tight layout, and the PNG at out (every figure of examples/ ends so)."""
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=80)
    print(f"wrote {out}")
