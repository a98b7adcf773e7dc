"""Measured model-state memory per rank against N, for stages 0-3, beside the ZeRO formulas.

    pip install ".[plot]"
    python examples/plot_memory.py                               # N = 1 2 4 8 -> runs/figures/memory_per_rank.png
    python examples/plot_memory.py --ranks 1 2 --out mem.png     # a quicker one

The seed article's table as a figure, from real runs: for each stage and N, one
`mpirun -n N python -m zerompi.train --dtype bf16 --report json` run; the markers are the bytes its
ranks really allocated for parameters, gradients and optimizer state (the memory ledger, largest
rank), the lines the formulas of mixed-precision Adam (P = 2, G = 2, K = 12 bytes per parameter):

    stage 0: 16 Psi      1: 4 Psi + 12 Psi/N      2: 2 Psi + 14 Psi/N      3: 16 Psi/N
"""
import argparse
import os

from zerompi_runs import FIGURES, finish_figure, pyplot, report

DEFAULT_OUT = os.path.join(FIGURES, "memory_per_rank.png")

STAGE_COLORS = ("tab:gray", "tab:blue", "tab:orange", "tab:green")


def measure(ranks, hidden, steps):
    """{stage: [(N, measured model state bytes of the largest rank, formula bytes at Psi)]}, and Psi."""
    results, psi = {}, None
    for stage in range(4):
        for n in ranks:
            r = report(n, "--stage", stage, "--dtype", "bf16", "--hidden", hidden, "--steps", steps,
                       "--batch-size", 64)
            measured = max(row["params"] + row["grads"] + row["optimizer"] for row in r["per_rank"])
            results.setdefault(stage, []).append((n, measured, r["memory_formula_bytes"]["total"]))
            psi = r["psi"]
    return results, psi


def plot(results, psi, out):
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(10, 6))
    for stage, rows in results.items():
        ranks = [n for n, _, _ in rows]
        ax.plot(ranks, [f / 1e6 for _, _, f in rows], "--", color=STAGE_COLORS[stage], linewidth=1)
        ax.plot(ranks, [m / 1e6 for _, m, _ in rows], "o", color=STAGE_COLORS[stage], label=f"stage {stage}")
        for n, measured, _ in rows[stage > 0:]:               # at N = 1 every stage is stage 0
            ax.annotate(f"{measured / 1e6:.2f}", (n, measured / 1e6), textcoords="offset points", xytext=(5, 3),
                        color=STAGE_COLORS[stage])
    ax.set_xscale("log", base=2)
    ax.set_xticks(ranks, [str(n) for n in ranks])
    ax.set_xlim(ranks[0] / 1.2, ranks[-1] * 1.25)
    ax.set_xlabel("ranks N")
    ax.set_ylabel("model state per rank (MB)")
    ax.set_title(f"ZeRO memory per rank, bf16 + fp32 Adam, Psi = {psi:,}\n"
                 "markers: measured (allocated buffers), dashed: formula")
    data = {"psi": psi, **{f"stage {stage}": [{"ranks": n, "measured bytes": m, "formula bytes": f}
                                              for n, m, f in rows] for stage, rows in results.items()}}
    finish_figure(fig, ax, out, data)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--hidden", default="512,512")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--out", default=DEFAULT_OUT, help="the PNG to write (default: %(default)s)")
    args = parser.parse_args()
    results, psi = measure(args.ranks, args.hidden, args.steps)
    for stage, rows in results.items():
        print(f"stage {stage}: " + ", ".join(f"N={n} {m / 1e6:.3f} MB (formula {f / 1e6:.3f})" for n, m, f in rows))
    plot(results, psi, args.out)


if __name__ == "__main__":
    main()
