"""ZeRO++ on the digits: loss curves and bytes per step of stage 3, exact and quantized.

    pip install ".[plot]"
    python examples/plot_zeropp.py                  # N = 4, 150 steps -> runs/figures/zeropp.png
    python examples/plot_zeropp.py --ranks 2 --steps 20 --out zeropp.png

Four runs of `mpirun -n N python -m zerompi.train --stage 3 --metrics ...` from the same seed:
exact, qwZ (--quantize-weights int8), qgZ (--quantize-grads int4) and all of ZeRO++ (qwZ, qgZ and
--hpz), blocks of 256. Left: each run's training loss per step (the quantized runs follow the
exact one; they are not the same run). Right: rank 0's ring bytes per step by purpose, as its
ledger counted them (docs/quantization.md has the formulas they equal).
"""
import os
import tempfile

from zerompi_runs import FIGURES, figure_args, pyplot, read_jsonl, save_figure, train

DEFAULT_OUT = os.path.join(FIGURES, "zeropp.png")
LOSS_TOLERANCE = 0.05        # relative: another BLAS kernel's float32 rounding can move a level
QWZ, QGZ = ("--quantize-weights", "int8"), ("--quantize-grads", "int4")
VARIANTS = {"exact stage 3": (), "qwZ (int8 weights)": QWZ, "qgZ (int4 gradients)": QGZ,
            "ZeRO++ (qwZ + qgZ + hpZ)": (*QWZ, *QGZ, "--hpz")}
PURPOSES = ("params", "grads", "scales")
STYLES = (("tab:gray", "-", 4), ("tab:blue", "--", 2), ("tab:orange", "-.", 2), ("tab:green", ":", 2))


def run_variants(num_ranks, steps, folder):
    """{variant: {"loss": [...], "bytes_per_step": {purpose: bytes}}} from each run's --metrics."""
    runs = {}
    for i, (name, flags) in enumerate(VARIANTS.items()):
        path = os.path.join(folder, f"run{i}.jsonl")
        train(num_ranks, "--stage", 3, *flags, "--quant-block", 256, "--steps", steps, "--metrics", path,
              "--log-every", 0, "--report", "none")
        records = read_jsonl(path)
        last = records[-1]["comm"]
        runs[name] = {"loss": [r["loss"] for r in records],
                      "bytes_per_step": {p: int(last[p]["bytes"]) if p in last else 0 for p in PURPOSES}}
    return runs


def plot(runs, num_ranks, out):
    plt = pyplot()
    fig, (loss_ax, bytes_ax) = plt.subplots(1, 2, figsize=(12, 5), gridspec_kw={"width_ratios": [3, 2]})
    for (name, run), (color, style, width) in zip(runs.items(), STYLES):
        loss_ax.plot(range(1, len(run["loss"]) + 1), run["loss"], style, color=color, linewidth=width, label=name)
    loss_ax.set(yscale="log", xlabel="step", ylabel="training loss (global batch)",
                title=f"stage 3 on the digits, N = {num_ranks}, float32")
    loss_ax.legend()
    loss_ax.grid(alpha=0.3)
    bottom = [0] * len(runs)
    for purpose, color in zip(PURPOSES, ("tab:purple", "tab:red", "tab:olive")):
        heights = [run["bytes_per_step"][purpose] / 1e3 for run in runs.values()]
        bytes_ax.bar(range(len(runs)), heights, bottom=bottom, color=color, label=purpose)
        bottom = [b + h for b, h in zip(bottom, heights)]
    bytes_ax.set_xticks(range(len(runs)), [name.split(" (")[0] for name in runs])
    bytes_ax.set(ylabel="rank 0's ring kB per step (ledger)", title="bytes per step")
    bytes_ax.legend()
    bytes_ax.grid(alpha=0.3, axis="y")
    save_figure(fig, out, runs, LOSS_TOLERANCE)


def main():
    args = figure_args(__doc__, DEFAULT_OUT)
    with tempfile.TemporaryDirectory() as folder:
        runs = run_variants(args.ranks, args.steps, folder)
    plot(runs, args.ranks, args.out)


if __name__ == "__main__":
    main()
