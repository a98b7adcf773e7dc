"""A Gantt chart of a --trace file: what every rank computed and communicated, step by step.

    mpirun -n 4 python -m zerompi.train --stage 3 --steps 6 --hidden 512,512 --trace trace.json
    pip install ".[plot]"
    python examples/plot_timeline.py trace.json                     # -> runs/figures/timeline.png
    python examples/plot_timeline.py trace.json --steps 2 3 --out t.png

One row per rank: compute spans (forward, backward, loss, Adam per layer) in the upper lane,
collectives (all-gather, reduce-scatter, all-reduce) in the lower one, between the start of the
first and the end of the last chosen step (by default the last two: past the first step's warm-up).
For zooming, open the same file in https://ui.perfetto.dev.
"""
import argparse
import json
import os

from zerompi_runs import FIGURES, pyplot, save_figure

DEFAULT_OUT = os.path.join(FIGURES, "timeline.png")

COLORS = {"forward": "tab:blue", "backward": "tab:orange", "loss": "tab:purple", "adam": "tab:green",
          "allgather": "tab:red", "reduce_scatter": "tab:brown", "allreduce": "black"}


def load_spans(path):
    """{rank: [(kind, start ms, duration ms, name)]} and {step: (start ms, end ms) on rank 0}."""
    with open(path) as f:
        events = [e for e in json.load(f)["traceEvents"] if e["ph"] == "X"]
    spans, steps = {}, {}
    for e in events:
        if e["cat"] == "step":
            if e["pid"] == 0:
                steps[int(e["name"].split()[1])] = (e["ts"] / 1e3, (e["ts"] + e["dur"]) / 1e3)
            continue
        kind = e["args"]["op"] if e["cat"] == "comm" else e["name"].split()[0]
        spans.setdefault(e["pid"], []).append((kind, e["ts"] / 1e3, e["dur"] / 1e3, e["name"]))
    return spans, steps


def plot(spans, steps, first, last, out):
    plt = pyplot()
    from matplotlib.patches import Patch

    begin, end = steps[first][0], steps[last][1]
    ranks = sorted(spans)
    fig, ax = plt.subplots(figsize=(10, 2.0 + 0.8 * len(ranks)))
    for rank in ranks:
        for kind, start, duration, _ in spans[rank]:
            if start + duration < begin or start > end:
                continue
            lane = rank + (0.3 if kind in ("allgather", "reduce_scatter", "allreduce") else -0.1)
            ax.broken_barh([(start - begin, duration)], (lane - 0.15, 0.3), color=COLORS[kind], linewidth=0)
    for step in range(first, last + 1):
        ax.axvline(steps[step][0] - begin, color="gray", linewidth=0.5, linestyle="--")
        ax.text(steps[step][0] - begin, -0.55, f" step {step}", color="gray")
    ax.set_yticks(ranks, [f"rank {r}" for r in ranks])
    ax.set_ylim(len(ranks) - 0.4, -0.7)
    ax.set_xlim(0, end - begin)
    ax.set_xlabel("ms (rank 0's step start = 0)")
    ax.legend(handles=[Patch(color=c, label=k) for k, c in COLORS.items()], ncol=4,
              loc="upper center", bbox_to_anchor=(0.5, -0.18 if len(ranks) > 2 else -0.3), frameon=False)
    ax.set_title("compute (upper lane) and communication (lower lane) per rank")
    drawn = {f"rank {rank}": sorted({kind for kind, start, duration, _ in spans[rank]
                                     if begin <= start + duration and start <= end}) for rank in ranks}
    save_figure(fig, out, {"steps": [first, last], "kinds drawn": drawn})      # the times: the machine's


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace")
    parser.add_argument("--steps", type=int, nargs=2, metavar=("FIRST", "LAST"))
    parser.add_argument("--out", default=DEFAULT_OUT, help="the PNG to write (default: %(default)s)")
    args = parser.parse_args()
    spans, steps = load_spans(args.trace)
    first, last = args.steps or (max(min(steps), max(steps) - 1), max(steps))
    plot(spans, steps, first, last, args.out)


if __name__ == "__main__":
    main()
