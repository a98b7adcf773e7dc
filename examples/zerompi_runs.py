"""What the examples share: run `mpirun -n N python -m zerompi.train ...` and read what it wrote.

    train(n, *flags, cwd=None)   -> the run's stdout (check=True: a failed run raises, with its stderr)
    report(n, *flags)            -> the JSON end-of-run report (--report json) as a dict
    read_jsonl(path)             -> the --metrics file as a list of dicts, one per step
    pyplot()                     -> matplotlib.pyplot, drawing to files, text sized to be read
    save_figure(fig, out)        -> the PNG at out (its folder created), FIGURE_DPI dots per inch

Figures go by default to runs/figures/ under the current folder (git ignores /runs/ at the top of
a checkout), never over the tracked docs/figures/: those are redrawn on purpose with
`--out docs/figures/NAME.png` (docs/observability.md). A figure 10 inches wide at FIGURE_DPI is
1500 pixels, its smallest text FONT_POINTS.
"""
import json
import os
import shutil
import subprocess
import sys

FIGURES = os.path.join("runs", "figures")      # the default folder of every example's figure
FIGURE_DPI = 150
FONT_POINTS = 11


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


def pyplot():
    """matplotlib.pyplot on the Agg backend (files, no display), every text FONT_POINTS or larger."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    plt.rcParams.update({"font.size": FONT_POINTS})            # ticks, labels and legends follow it
    return plt


def save_figure(fig, out):
    """Tight layout, and the PNG at out, its folder created if need be."""
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    fig.tight_layout()
    fig.savefig(out, dpi=FIGURE_DPI)
    print(f"wrote {out}")


def finish_figure(fig, ax, out):
    """Legend, grid, and save_figure (the loss and memory figures end so)."""
    ax.legend()
    ax.grid(alpha=0.3)
    save_figure(fig, out)
