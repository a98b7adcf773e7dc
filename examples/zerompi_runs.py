"""What the examples share: run `mpirun -n N python -m zerompi.train ...` and read what it wrote.

    train(n, *flags, cwd=None)   -> the run's stdout (check=True: a failed run raises, with its stderr)
    report(n, *flags)            -> the JSON end-of-run report (--report json) as a dict
    read_jsonl(path)             -> the --metrics file as a list of dicts, one per step
    figure_args(doc, out)        -> --ranks, --steps and --out of an example that draws runs
    pyplot()                     -> matplotlib.pyplot, drawing to files, text sized to be read
    save_figure(fig, out, data)  -> the PNG at out (its folder created), FIGURE_DPI dots per inch,
                                    and beside it OUT.json: the command, the date, the data drawn
    same_data(a, b)              -> the figures' data files agree (each number within the
                                    tolerance its file gives; tests/repository/test_doc_commands.py)

Figures go by default to runs/figures/ under the current folder (git ignores /runs/ at the top of
a checkout), never over the tracked docs/figures/: those are redrawn on purpose with
`--out docs/figures/NAME.png` (docs/observability.md). A figure 10 inches wide at FIGURE_DPI is
1500 pixels, its smallest text FONT_POINTS.

Each figure carries the command and the date that drew it, at its foot and in its data file
(`{"command", "date", "tolerance", "data"}`): a figure is checked through the data it plots, with
`tolerance` the relative difference a number may have on another machine (0: exactly equal).
"""
import datetime
import json
import math
import os
import shlex
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


def figure_args(doc, default_out, ranks=4, steps=150):
    """--ranks, --steps and --out of an example that draws runs (its docstring's first line: --help's)."""
    import argparse
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=ranks)
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--out", default=default_out, help="the PNG to write (default: %(default)s)")
    return parser.parse_args()


def pyplot():
    """matplotlib.pyplot on the Agg backend (files, no display), every text FONT_POINTS or larger."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    plt.rcParams.update({"font.size": FONT_POINTS})            # ticks, labels and legends follow it
    return plt


def save_figure(fig, out, data, tolerance=0.0):
    """Tight layout, the command and the date at the foot, and the PNG at out, its folder created
    if need be; the data drawn in OUT.json beside it (out without .png, then .json)."""
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    command = shlex.join(["python", os.path.relpath(sys.argv[0]), *sys.argv[1:]])
    date = datetime.date.today().isoformat()
    fig.text(0.995, 0.005, f"{command}, {date}", ha="right", va="bottom", fontsize=FONT_POINTS - 3, color="gray")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(out, dpi=FIGURE_DPI, metadata={"Description": f"{command}, {date}"})
    with open(os.path.splitext(out)[0] + ".json", "w") as f:
        json.dump({"command": command, "date": date, "tolerance": tolerance, "data": data}, f, indent=1)
        f.write("\n")
    print(f"wrote {out}")


def same_data(a, b, tolerance=None):
    """Whether two figures' data files (as loaded) hold the same data: the same structure, every
    number within a's relative tolerance."""
    if tolerance is None:
        return a["tolerance"] == b["tolerance"] and same_data(a["data"], b["data"], a["tolerance"])
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same_data(a[k], b[k], tolerance) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(same_data(x, y, tolerance) for x, y in zip(a, b))
    if isinstance(a, float) or isinstance(b, float):
        return math.isclose(a, b, rel_tol=tolerance, abs_tol=0.0 if tolerance == 0 else 1e-12)
    return a == b


def finish_figure(fig, ax, out, data, tolerance=0.0):
    """Legend, grid, and save_figure (the loss and memory figures end so)."""
    ax.legend()
    ax.grid(alpha=0.3)
    save_figure(fig, out, data, tolerance)
